"""Services and roles: the group keys --by cgroup, unit, container, title
and ppid, from a stream's process and cgroup records.

The units and containers of paths are kernel.identity's unit_of and
container_of (snapshots use them too). A Directory notes the process and cgroup records of a stream as they come
and answers, for a pid, the key of its group at that point of the stream:

- cgroup: its cgroup's v2 path (/system.slice/nginx.service);
- unit: the systemd unit of that path, the deepest component named *.service
  or *.scope (a *.slice when there is none): nginx.service,
  session-3.scope, user.slice;
- container: the container of that path, by the docker, containerd (CRI),
  podman and Kubernetes conventions: docker-<id>.scope, docker/<id>,
  cri-containerd-<id>.scope, crio-<id>.scope, libpod-<id>.scope give the
  container id (12 characters); under kubepods, pod<uid> adds the pod
  ("pod<uid>/<id>"); a path with none of them is "host";
- title: its process title (ps's COMMAND) as a role (identity.role_of: a
  PostgreSQL backend's client and activity dropped, a number word as N), or
  with --by 'title:REGEX' the first group of REGEX where it matches;
  "[comm]" for a kernel thread;
- ppid: its parent's pid.

By cgroup, unit and container, a state record that carries its task's own
cgroup (every one on the tp_btf path, switch-outs on the tracepoint path) is
in that cgroup's group, whatever its process record says; one without (null)
in its process's. So the time of a thread moved to another cgroup goes, one
interval at a time, to the group of the record that ends the interval: the
cgroup the task was in at that transition (see Aggregator).

A pid the stream has said nothing about (a recording without process
records, or from before them) is in the group "?"; one that was gone before
pstate could read it, "(gone)"; a cgroup id no cgroup record named, "?".
"""

from __future__ import annotations

import re

from pstate.kernel.identity import UNKNOWN, container_of, role_of, unit_of

BY_KEYS = ("cgroup", "unit", "container", "title", "ppid")
BY_CGROUP = ("cgroup", "unit", "container")  # the keys a state record's own cgroup decides
GONE = "(gone)"
TITLE_PATTERN = "title:"  # --by 'title:REGEX'


def parse_by(spec: str) -> tuple[str, re.Pattern | None]:
    """A --by value: (the key, the pattern of 'title:REGEX' or None).
    re.error for a pattern that does not compile."""
    if spec.startswith(TITLE_PATTERN):
        return "title", re.compile(spec[len(TITLE_PATTERN):])
    return spec, None


class Directory:
    """What a stream's process and cgroup records said, so far; role: the
    pattern of --by 'title:REGEX'."""

    def __init__(self, role: re.Pattern | None = None):
        self.procs: dict[int, dict] = {}  # pid -> its last process record
        self.paths: dict[int, str | None] = {}  # cgroup id -> path
        self.role = role

    def note(self, rec: dict) -> int | None:
        """A process or cgroup record; the pid whose key may have changed."""
        t = rec.get("type")
        if t == "cgroup" and type(rec.get("cgroup")) is int:
            self.paths[rec["cgroup"]] = rec.get("path") if type(rec.get("path")) is str else None
        elif t == "process" and type(rec.get("pid")) is int:
            self.procs[rec["pid"]] = rec
            return rec["pid"]
        return None

    def key(self, by: str, pid: int, cgroup=None):
        """The key of pid's group by `by`; cgroup: the cgroup id its record
        carries (by cgroup, unit and container it decides), or None."""
        if type(cgroup) is int and by in BY_CGROUP:
            return self.cgroup_key(by, cgroup)
        rec = self.procs.get(pid)
        if rec is None:
            return UNKNOWN
        if rec.get("gone"):
            return GONE
        if by == "title":
            title = rec.get("title")
            if type(title) is str and title:
                return role_of(title, self.role)
            return f"[{rec.get('comm') or UNKNOWN}]"
        if by == "ppid":
            ppid = rec.get("ppid")
            return ppid if type(ppid) is int else UNKNOWN
        cgid = rec.get("cgroup")
        return self.cgroup_key(by, cgid) if type(cgid) is int else self.path_key(by, None)

    def cgroup_key(self, by: str, cgid: int):
        """The key by cgroup, unit or container of a cgroup id."""
        return self.path_key(by, self.paths.get(cgid))

    @staticmethod
    def path_key(by: str, path):
        if by == "cgroup":
            return path if path is not None else UNKNOWN
        if by == "unit":
            return unit_of(path)
        return container_of(path)

"""Services and roles: the group keys --by cgroup, unit, container, title
and ppid, from a stream's process and cgroup records.

The keys themselves are kernel.identity.group_key (snapshots use it too).
A Directory notes the process and cgroup records of a stream as they come
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

from pstate.kernel import identity
from pstate.kernel.identity import UNKNOWN

BY_KEYS = identity.GROUP_KEYS
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
        cgid = rec.get("cgroup")
        return identity.group_key(by, title=rec.get("title"), comm=rec.get("comm"), ppid=rec.get("ppid"),
                                  cgroup_path=self.paths.get(cgid) if type(cgid) is int else None, role=self.role)

    def cgroup_key(self, by: str, cgid: int):
        """The key by cgroup, unit or container of a cgroup id."""
        return identity.group_key(by, cgroup_path=self.paths.get(cgid))


class GroupKeys:
    """The group of each pid (and, by cgroup, unit and container, of each
    cgroup id a record carries) as a stream's records have said so far,
    remembered until a process or cgroup record may change it; `of` turns a
    key into what the caller keeps (a group id, or the key itself). `pids`
    and `cgroups` are the remembered values, for loops that look them up
    inline."""

    def __init__(self, by: str, role: re.Pattern | None = None, of=None):
        self.by = by
        self.directory = Directory(role)
        self.by_cgroup = by in BY_CGROUP  # a record's own cgroup decides its group
        self.of = of if of is not None else (lambda key: key)
        self.pids: dict = {}  # pid -> group
        self.cgroups: dict = {}  # cgroup id -> group (by_cgroup)

    def note(self, rec: dict) -> None:
        """A process or cgroup record: the groups it may change are looked up anew."""
        pid = self.directory.note(rec)
        if pid is not None:
            self.pids.pop(pid, None)
        else:  # a cgroup's path: any pid's and cgroup's group may change
            self.pids.clear()
            self.cgroups.clear()

    def forget(self) -> None:
        """Look every group up anew (the directory was replaced)."""
        self.pids.clear()
        self.cgroups.clear()

    def group(self, pid: int, cgroup=None):
        """The group of a record of pid that carries cgroup (an id, or None)."""
        if cgroup is not None and self.by_cgroup and type(cgroup) is int:
            g = self.cgroups.get(cgroup)
            if g is None:
                g = self.cgroups[cgroup] = self.of(self.directory.cgroup_key(self.by, cgroup))
            return g
        g = self.pids.get(pid)
        if g is None:
            g = self.pids[pid] = self.of(self.directory.key(self.by, pid))
        return g

"""Services and roles: the group keys --by cgroup, unit, container, title
and ppid, from a stream's process and cgroup records.

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
- title: its process title (ps's COMMAND), "[comm]" for a kernel thread;
- ppid: its parent's pid.

A pid the stream has said nothing about (a recording without process
records, or from before them) is in the group "?"; one that was gone before
pstate could read it, "(gone)".
"""

from __future__ import annotations

import re

BY_KEYS = ("cgroup", "unit", "container", "title", "ppid")
UNKNOWN = "?"
GONE = "(gone)"
HOST = "host"

_CONTAINER = re.compile(r"^(?:docker|cri-containerd|crio|libpod|containerd)-([0-9a-f]{12,})\.scope$")
_BARE_ID = re.compile(r"^[0-9a-f]{64}$")
_POD = re.compile(r"^(?:kubepods-(?:besteffort-|burstable-)?)?pod([0-9a-f_-]{8,})(?:\.slice)?$")


def unit_of(path: str | None) -> str:
    """The systemd unit a cgroup path belongs to ("-" when none: the root)."""
    if path is None:
        return UNKNOWN
    parts = [p for p in path.split("/") if p]
    for p in reversed(parts):
        if p.endswith((".service", ".scope")):
            return p
    for p in reversed(parts):
        if p.endswith(".slice"):
            return p
    return "-"


def container_of(path: str | None) -> str:
    """The container (and pod) a cgroup path belongs to, or "host"."""
    if path is None:
        return UNKNOWN
    parts = [p for p in path.split("/") if p]
    pod = None
    cid = None
    for i, p in enumerate(parts):
        m = _POD.match(p)
        if m and any(x.startswith("kubepods") for x in parts[:i + 1]):
            pod = "pod" + m.group(1).replace("_", "-")
            continue
        m = _CONTAINER.match(p)
        if m:
            cid = m.group(1)[:12]
        elif _BARE_ID.match(p) and (i == 0 or parts[i - 1] in ("docker", "libpod") or pod):
            cid = p[:12]
    if cid is None and pod is None:
        return HOST
    if pod is None:
        return cid
    return f"{pod}/{cid}" if cid else pod


class Directory:
    """What a stream's process and cgroup records said, so far."""

    def __init__(self):
        self.procs: dict[int, dict] = {}  # pid -> its last process record
        self.paths: dict[int, str | None] = {}  # cgroup id -> path

    def note(self, rec: dict) -> int | None:
        """A process or cgroup record; the pid whose key may have changed."""
        t = rec.get("type")
        if t == "cgroup" and type(rec.get("cgroup")) is int:
            self.paths[rec["cgroup"]] = rec.get("path") if type(rec.get("path")) is str else None
        elif t == "process" and type(rec.get("pid")) is int:
            self.procs[rec["pid"]] = rec
            return rec["pid"]
        return None

    def key(self, by: str, pid: int):
        rec = self.procs.get(pid)
        if rec is None:
            return UNKNOWN
        if rec.get("gone"):
            return GONE
        if by == "title":
            title = rec.get("title")
            if type(title) is str and title:
                return title
            return f"[{rec.get('comm') or UNKNOWN}]"
        if by == "ppid":
            ppid = rec.get("ppid")
            return ppid if type(ppid) is int else UNKNOWN
        cgid = rec.get("cgroup")
        path = self.paths.get(cgid) if type(cgid) is int else None
        if by == "cgroup":
            return path if path is not None else UNKNOWN
        if by == "unit":
            return unit_of(path)
        return container_of(path)

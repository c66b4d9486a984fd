"""Who a task is: its process's title, executable, parent and cgroup, read
from /proc and the cgroup v2 mount, as `process` and `cgroup` records.

The cgroup id the kernel gives BPF (bpf_get_current_cgroup_id) is the
inode number of the cgroup's directory on the v2 mount, so an id and a path
translate both ways in user space: path -> id by stat(2), id -> path by
walking the mount (cached; walked again on a miss). The v2 mount is found
in /proc/self/mountinfo (it is /sys/fs/cgroup on a unified host, often
/sys/fs/cgroup/unified on a hybrid one).

Identities (the recorder's) writes the records: the first time a stream
meets a tgid, a `process` record, and before it, the first time it meets a
cgroup (a process's, or the one a state record names), a `cgroup` record; then it reads the process again once, RECHECK_NS
later (programs such as PostgreSQL, nginx or gunicorn set their title after
forking), and after a comm change of its main thread (an exec), and writes a
new record only when something changed. A process gone before it could be
read is written as gone, with nothing guessed.
"""

from __future__ import annotations

import os
import re
import time

from pstate.stream import names

RECHECK_NS = 200_000_000  # the second look at a new process
UNKNOWN = "?"
HOST = "host"
MAX_TITLE = 1024  # bytes of /proc/PID/cmdline kept


def v2_mount(mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """Where the cgroup v2 hierarchy is mounted, or None (a str as os
    functions take it: the bytes of a name that is not UTF-8 as surrogates)."""
    try:
        with open(mountinfo, "rb") as f:
            for line in f:
                left, _sep, right = line.partition(b" - ")
                if right.split(b" ", 1)[0] == b"cgroup2":
                    return os.fsdecode(_unescape(left.split(b" ")[4]))
    except OSError:
        pass
    return None


def _unescape(path: bytes) -> bytes:
    """mountinfo writes space, tab, newline and backslash as octal escapes."""
    return re.sub(rb"\\([0-7]{3})", lambda m: bytes((int(m.group(1), 8) & 0xff,)), path)


class CgroupPaths:
    """cgroup v2 ids and paths (relative to the mount, "/" for the root).
    Paths are the lossless text of pstate.stream.names (a name that is not
    UTF-8 has \\xNN escapes): what cgroup records write and --cgroup
    matches; they are made bytes again to be opened."""

    def __init__(self, mount: str | None = None):
        self.mount = mount if mount is not None else v2_mount()
        self._paths: dict[int, str] = {}

    def _dir(self, rel: bytes) -> bytes:
        return os.path.join(os.fsencode(self.mount), rel) if rel else os.fsencode(self.mount)

    def id_of(self, path: str) -> int | None:
        """The id of a cgroup path ("/a/b", lossless text; the lone
        surrogates of an os str are taken as its bytes too), None when
        there is no such cgroup."""
        if self.mount is None:
            return None
        rel = names.encode(path).strip(b"/")
        try:
            st = os.stat(self._dir(rel))
        except (OSError, ValueError):  # (ValueError: a NUL in it)
            return None
        self._paths[st.st_ino] = "/" + names.decode(rel, lossless=True) if rel else "/"
        return st.st_ino

    def path_of(self, cgid: int) -> str | None:
        """The path of a cgroup id, None when no cgroup has it (gone)."""
        path = self._paths.get(cgid)
        if path is None and self.mount is not None:
            self._walk()
            path = self._paths.get(cgid)
        return path

    def below(self, path: str) -> list[int]:
        """The ids of a cgroup and of every cgroup under it (--cgroup)."""
        if self.mount is None:
            return []
        mount = os.fsencode(self.mount)
        out = []
        for dirpath, _dirs, _files in os.walk(self._dir(names.encode(path).strip(b"/"))):
            rel = os.path.relpath(dirpath, mount)
            cgid = self.id_of(names.decode(b"/" if rel == b"." else b"/" + rel, lossless=True))
            if cgid is not None:
                out.append(cgid)
        return out

    def procs(self, cgid: int) -> list[int]:
        """The processes in a cgroup now (its cgroup.procs)."""
        path = self.path_of(cgid)
        if path is None or self.mount is None:
            return []
        try:
            with open(os.path.join(self._dir(names.encode(path).strip(b"/")), b"cgroup.procs"), "rb") as f:
                return [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return []

    def _walk(self) -> None:
        self.below("/")


def descendants(pid: int) -> list[int]:
    """The processes below pid now (/proc/PID/task/*/children, recursively)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            for k in kids:
                if k not in out:
                    out.append(k)
                    todo.append(k)
    return out


class RowIdentities:
    """snap: the title, cgroup and parent of each process of a snapshot, read from
    /proc at each snapshot; a process gone since keeps what was read last."""

    def __init__(self, cgroups: CgroupPaths | None = None):
        self.cgroups = cgroups if cgroups is not None else CgroupPaths()
        self.last: dict[int, dict] = {}
        self._kernel_paths: dict[int, str | None] = {}  # this snapshot's paths of kernel cgroup ids

    def of(self, pids) -> dict[int, dict]:
        now = {}
        for pid in set(pids):
            info = read_process(pid) if pid else None
            if info is None:
                now[pid] = self.last.get(pid, {"title": None, "cgroup": None, "cgroup_path": None, "ppid": None})
                continue
            path = info["cgroup_path"]
            cgid = self.cgroups.id_of(path) if path is not None else None
            now[pid] = {"title": info["title"], "cgroup": cgid, "cgroup_path": path if cgid is not None else None,
                        "ppid": info["ppid"]}
        self.last = now
        self._kernel_paths = {}
        return now

    def exact_cgroup(self, ident: dict, cgid: int | None, exited: bool) -> dict:
        """A row's identity with the cgroup id its kernel row holds: the
        task's own at exit (exact), its parent's at fork (the task may have
        moved since, as systemd moves its children): so it wins for a task
        that exited, and fills in a live one only where /proc told none."""
        if not cgid or not (exited or ident["cgroup"] is None) or ident["cgroup"] == cgid:
            return ident
        paths = self._kernel_paths
        if cgid not in paths:  # (once per snapshot: a removed cgroup costs one walk of the mount)
            paths[cgid] = self.cgroups.path_of(cgid)
        return {**ident, "cgroup": cgid, "cgroup_path": paths[cgid]}


# the "0::PATH" line of /proc/PID/cgroup; PATH as the kernel writes it, raw (a
# newline in it too: the line ends where the next hierarchy's, or the file, begins)
_V2_LINE = re.compile(rb"(?:^|\n)0::(/.*?)\n(?=\d+:[^\n]*:|\Z)", re.S)


def process_cgroup(pid: int) -> str | None:
    """The v2 path of a process's cgroup ("0::PATH" of /proc/PID/cgroup), as
    lossless text (pstate.stream.names)."""
    try:
        with open(f"/proc/{pid}/cgroup", "rb") as f:
            data = f.read()
    except OSError:
        return None
    m = _V2_LINE.search(data if data.endswith(b"\n") else data + b"\n")
    return names.decode(m.group(1), lossless=True) if m else None


def title_of(cmdline: bytes) -> str:
    """The process title: argv joined by spaces, as ps shows it (a title set
    by overwriting argv, PostgreSQL's way, ends in NULs or spaces)."""
    parts = [p for p in cmdline[:MAX_TITLE].split(b"\0")]
    while parts and not parts[-1]:
        parts.pop()
    return names.decode(b" ".join(parts)).rstrip()


def read_process(pid: int) -> dict | None:
    """comm, title, exe, ppid, cgroup path and namespace pid of a process,
    read from /proc; None when it is gone (a zombie, or exiting: its title
    went with its memory). A kernel thread (empty cmdline) has the title and
    exe None."""
    base = f"/proc/{pid}"
    try:
        with open(base + "/cmdline", "rb") as f:
            cmdline = f.read(MAX_TITLE)
        with open(base + "/status", "rb") as f:
            status = f.read()
    except OSError:
        return None
    ppid, nspid, tgid, comm, state = None, [], None, None, b""
    for line in status.splitlines():
        if line.startswith(b"State:"):
            state = line[6:].strip()[:1]
        elif line.startswith(b"Name:"):
            comm = names.decode(line[5:].strip())
        elif line.startswith(b"PPid:"):
            ppid = int(line.split()[1])
        elif line.startswith(b"NSpid:"):
            nspid = [int(x) for x in line.split()[1:]]
        elif line.startswith(b"Tgid:"):
            tgid = int(line.split()[1])
    if tgid is not None and tgid != pid:
        return None  # a thread's id, not a process's (or a reused pid)
    try:
        exe = names.decode(os.readlink(os.fsencode(base + "/exe")))
    except OSError:
        exe = None
    title = title_of(cmdline) or None
    if title is None and (state in (b"Z", b"X") or ppid not in (0, 2)):
        # no kernel thread (those are kthreadd's, pid 2, children): a process
        # past its exit, whose memory (and so its title) is gone already
        return None
    return {"comm": comm, "title": title, "exe": exe if title is not None else None, "ppid": ppid,
            "cgroup_path": process_cgroup(pid), "ns_pid": nspid[-1] if len(nspid) > 1 else None}


class Identities:
    """First-seen process and cgroup records for one stream (see the module
    docstring). seen(pid, tid, comm) is called for every new (pid, tid,
    comm) the encoder meets, cgroup_met(cgid) for every cgroup id a state
    record names; take(now) gives the records due, in order."""

    def __init__(self, cgroups: CgroupPaths | None = None, read=read_process, recheck_ns: int = RECHECK_NS):
        self.cgroups = cgroups if cgroups is not None else CgroupPaths()
        self.read = read
        self.recheck_ns = recheck_ns
        self.known: dict[int, dict] = {}  # pid -> its last process record
        self.comms: dict[int, str | None] = {}  # pid -> comm of its main thread (None: not seen yet)
        self.new: list[int] = []
        self.rechecks: list[tuple[int, int, str]] = []  # (due ns, pid, reason), in due order
        self.cgroups_written: set[int] = set()
        self.met: set[int] = set()  # cgroup ids the state records named
        self.new_cgroups: list[int] = []

    def seen(self, pid: int, tid: int, comm: str) -> None:
        if not pid:
            return
        known = self.comms.get(pid, False)
        if known is False:
            self.comms[pid] = comm if tid == pid else None
            self.new.append(pid)
        elif tid == pid and known != comm:
            self.comms[pid] = comm
            if known is not None:  # the main thread changed its name: an exec, mostly
                self.rechecks.insert(0, (0, pid, "exec"))

    def cgroup_met(self, cgid: int) -> None:
        if cgid not in self.met:
            self.met.add(cgid)
            self.new_cgroups.append(cgid)

    def forget(self) -> None:
        """A new file (SIGHUP): its readers have seen none of them."""
        self.known.clear()
        self.cgroups_written.clear()
        self.new = list(self.comms)
        self.new_cgroups = list(self.met)
        self.rechecks = []

    def take(self, now: int | None = None) -> list[dict]:
        now = time.monotonic_ns() if now is None else now
        out: list[dict] = []
        cgroups, self.new_cgroups = self.new_cgroups, []
        for cgid in cgroups:
            self.cgroup_seen(cgid, now, out)
        new, self.new = self.new, []
        for pid in new:
            self._look(pid, now, "first", out)
            self.rechecks.append((now + self.recheck_ns, pid, "recheck"))
        while self.rechecks and self.rechecks[0][0] <= now:
            _due, pid, why = self.rechecks.pop(0)
            if not self.known.get(pid, {}).get("gone"):
                self._look(pid, now, why, out)
        return out

    def cgroup_seen(self, cgid: int, now: int, out: list) -> None:
        """A `cgroup` record the first time the stream meets cgid (its path
        null and gone true when no cgroup has that id any more)."""
        if cgid in self.cgroups_written:
            return
        self.cgroups_written.add(cgid)
        path = self.cgroups.path_of(cgid)
        out.append({"type": "cgroup", "ts": now, "cgroup": cgid, "path": path, "gone": path is None})

    def _look(self, pid: int, now: int, why: str, out: list) -> None:
        info = self.read(pid)
        last = self.known.get(pid)
        if info is None:
            if last is None or not last.get("gone"):
                rec = {"type": "process", "ts": now, "pid": pid, "comm": self.comms.get(pid), "title": None,
                       "exe": None, "ppid": None, "cgroup": None, "gone": True, "why": why}
                self.known[pid] = rec
                out.append(rec)
            return
        cgid = None
        path = info.pop("cgroup_path")
        if path is not None:
            cgid = self.cgroups.id_of(path)
            if cgid is not None:
                self.cgroup_seen(cgid, now, out)
        ns_pid = info.pop("ns_pid")
        rec = {"type": "process", "ts": now, "pid": pid, **info, "cgroup": cgid, "gone": False, "why": why}
        if ns_pid is not None:
            rec["ns_pid"] = ns_pid
        if last is not None and all(last.get(k) == rec[k] for k in ("comm", "title", "exe", "ppid", "cgroup")):
            return
        self.known[pid] = rec
        out.append(rec)


# --- units and containers of cgroup paths ----------------------------------

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


# The role a process title names (--by title): the title without its volatile
# part. A PostgreSQL backend's title ends with its client (host(port) or
# [local]) and what it is doing (idle, idle in transaction, UPDATE waiting,
# ...): both dropped ("postgres: 15/main: app shop"); a number standing alone
# as a word (a worker's index, a pid, a count) reads N.
_CLIENT_AND_ACTIVITY = re.compile(r"\s+(?:\[local\]|[^\s()]+\(\d+\))(?:\s.*)?$", re.S)
_NUMBER_WORD = re.compile(r"(?<!\S)\d+(?!\S)")


def role_of(title: str, pattern: re.Pattern | None = None) -> str:
    """The role of a process with this title: with a pattern (--by
    'title:REGEX'), its first group where it matches (the whole match when
    it has none, or that group did not take part), else the default above."""
    if pattern is not None:
        m = pattern.search(title)
        if m is not None:
            role = m.group(1) if pattern.groups else None
            return role if role is not None else m.group(0)
    return _NUMBER_WORD.sub("N", _CLIENT_AND_ACTIVITY.sub("", title))


# --- the groups --by names by who a process is --------------------------------

# What --by can group by beyond tid, pid and comm: what a process is (the
# stream's process and cgroup records say it; a snapshot row carries it).
GROUP_KEYS = ("cgroup", "unit", "container", "title", "ppid")


def group_key(by: str, *, title=None, comm=None, ppid=None, cgroup_path=None, role: re.Pattern | None = None):
    """The group of a process by one of GROUP_KEYS, from what is known of it
    (None: not known): its cgroup's path, that path's unit or container, its
    title's role ("[comm]" for a kernel thread, which has none), its
    parent's pid; UNKNOWN when that is not known. role: the pattern of
    --by 'title:REGEX'. The one definition the stream readers (by a
    process's records) and the snapshot readers (by a row's fields) share."""
    if by == "title":
        if type(title) is str and title:
            return role_of(title, role)
        return f"[{comm or UNKNOWN}]"
    if by == "ppid":
        return ppid if type(ppid) is int else UNKNOWN
    path = cgroup_path if type(cgroup_path) is str else None
    if by == "cgroup":
        return path if path is not None else UNKNOWN
    if by == "unit":
        return unit_of(path)
    if by == "container":
        return container_of(path)
    raise ValueError(by)

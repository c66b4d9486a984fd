"""Event filters shared by record (map values of its BPF program, see
pstate.kernel.filtermaps) and every command that reads a stream (applied by
the one reader, pstate.stream.reader), so `record -p X`, `record | replay -p X`
and `record | stats -p X` keep the same events."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from pstate.stream import names, schema
from pstate.stream.meta import TASK_FILTERS, TRANSITION_FILTERS

LIFECYCLE = ("fork", "exec", "exit")


@dataclass
class Filter:
    pids: tuple[int, ...] = ()
    tids: tuple[int, ...] = ()
    comms: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()
    min_dur_ns: int = 0
    include_idle: bool = False
    cgroups: tuple[str, ...] = ()  # v2 paths: the cgroup and everything below it
    titles: tuple[str, ...] = ()  # shell patterns of process titles
    _pidset: frozenset = field(default=frozenset(), repr=False)

    def __post_init__(self):
        self._pidset = frozenset(self.pids)
        self._tidset = frozenset(self.tids)
        self._commset = frozenset(c[:15] for c in self.comms)
        self._stateset = frozenset(self.states)
        self._cpuset = frozenset(self.cpus)
        self.cgroups = tuple(cgroup_path(p) for p in self.cgroups)
        # --cgroup and --title in user space: what the stream's process and
        # cgroup records said (note()), and pid -> passes, as of now (a state
        # record's own cgroup, where it has one, in place of its process's:
        # (pid, cgroup id) -> passes)
        self._who = bool(self.cgroups or self.titles)
        self._paths: dict = {}  # cgroup id -> path
        self._procs: dict = {}  # pid -> (cgroup id, title)
        self._passes: dict = {}
        self._passes_in: dict = {}  # pid -> {cgroup id: passes}

    @property
    def active(self) -> bool:
        return bool(self.pids or self.tids or self.comms or self.states or self.cpus or self.min_dur_ns
                    or self.cgroups or self.titles)

    @property
    def needs_identities(self) -> bool:
        """Whether note() must see the stream's process and cgroup records."""
        return self._who

    def note(self, rec: dict) -> None:
        """A process or cgroup record (--cgroup and --title read them): a
        process passes from its process record on, by what that says."""
        t = rec.get("type")
        if t == "cgroup" and type(rec.get("cgroup")) is int:
            self._paths[rec["cgroup"]] = rec.get("path")
            self._passes.clear()
            self._passes_in.clear()
        elif t == "process" and type(rec.get("pid")) is int:
            self._procs[rec["pid"]] = (rec.get("cgroup"), rec.get("title"))
            self._passes.pop(rec["pid"], None)
            self._passes_in.pop(rec["pid"], None)

    def _who_passes(self, pid, cgroup=None) -> bool:
        """--cgroup and --title of a pid's record: the cgroup the record
        names (an int), else its process's; the title its process's."""
        if type(cgroup) is not int:
            ok = self._passes.get(pid)
            if ok is None:
                cgid, title = self._procs.get(pid, (None, None))
                ok = self._passes[pid] = self._who_ok(self._paths.get(cgid), title)
            return ok
        own = self._passes_in.get(pid)
        if own is None:
            own = self._passes_in[pid] = {}
        ok = own.get(cgroup)
        if ok is None:
            ok = own[cgroup] = self._who_ok(self._paths.get(cgroup), self._procs.get(pid, (None, None))[1])
        return ok

    def _who_ok(self, path, title) -> bool:
        """--cgroup and --title of a process with this cgroup path and title."""
        ok = True
        if self.cgroups:
            ok = type(path) is str and any(path == c or path.startswith(c.rstrip("/") + "/") for c in self.cgroups)
        if ok and self.titles:
            ok = type(title) is str and any(fnmatch.fnmatchcase(title, pat) for pat in self.titles)
        return ok

    def match_row(self, pid, tid, comm, title, cgroup_path) -> bool:
        """Whether a thread passes the task filters (--cpu aside) given who
        its process is, as a snapshot row says (not the stream's records)."""
        if not self.include_idle and tid == 0:
            return False
        if (self._pidset and pid not in self._pidset) or (self._tidset and tid not in self._tidset) or \
                (self._commset and comm not in self._commset):
            return False
        return not self._who or self._who_ok(cgroup_path, title)

    def native_spec(self) -> tuple:
        """The filter as the native digester's set_filter takes it: pids,
        tids, comms (as matched: 15 characters), states, cpus, min_dur_ns,
        include_idle, and who ((pid, the record's cgroup id or None) ->
        passes, for --cgroup and --title) or None."""
        return (tuple(self.pids), tuple(self.tids), tuple(sorted(self._commset)), tuple(self.states),
                tuple(self.cpus), self.min_dur_ns, self.include_idle, self._who_passes if self._who else None)

    def options(self) -> list[str]:
        """The options in force, as meta.filters_in_force names them."""
        fields = self.meta_fields()
        return [opt for f, opt in TRANSITION_FILTERS + TASK_FILTERS if fields.get(f)]

    def read_fields(self) -> dict:
        """The read_filter_* fields the one reader adds to the meta records
        of a stream it filters (stats then knows which transitions are gone)."""
        return {"read_" + k: v for k, v in self.meta_fields().items() if k.startswith("filter_")}

    def meta_fields(self) -> dict:
        """The filter_* fields of a meta record."""
        out = {}
        for key, val in (("filter_pid", list(self.pids)), ("filter_tid", list(self.tids)),
                         ("filter_comm", list(self.comms)), ("filter_state", list(self.states)),
                         ("filter_cpu", list(self.cpus)), ("filter_cgroup", list(self.cgroups)),
                         ("filter_title", list(self.titles))):
            if val:
                out[key] = val
        if self.min_dur_ns:
            out["filter_min_dur_ns"] = self.min_dur_ns
        out["include_idle"] = self.include_idle
        return out

    def match(self, rec: dict) -> bool:
        """Whether an event record passes, with the same rules as the BPF side:

        task filters (pid, tid, comm, cpu) apply to every event; --state and
        --min-dur apply to state transitions only (lifecycle events pass).
        """
        t = rec.get("type")
        if t not in schema.EVENT_TYPES:
            return True  # meta, loss, end, rate are not events
        if t == "state":
            return self.match_state(rec.get("pid"), rec.get("tid"), rec.get("comm"), rec.get("cpu"),
                                    rec.get("from"), rec.get("to"), rec.get("dur_ns"), rec.get("cgroup"))
        return self._task_passes(rec.get("pid"), rec.get("tid"), rec.get("comm"), rec.get("cpu"))

    def match_state(self, pid, tid, comm, cpu, frm, to, dur, cgroup=None) -> bool:
        """match() of a state record given by its fields (no dict to build)."""
        if not self._task_passes(pid, tid, comm, cpu, cgroup):
            return False
        if self._stateset and frm not in self._stateset and to not in self._stateset:
            return False
        return not self.min_dur_ns or (dur is not None and dur >= self.min_dur_ns)

    def _task_passes(self, pid, tid, comm, cpu, cgroup=None) -> bool:
        if not self.include_idle and tid == 0:
            return False
        if self._pidset and pid not in self._pidset:
            return False
        if self._tidset and tid not in self._tidset:
            return False
        if self._commset and comm not in self._commset:
            return False
        if self._cpuset and cpu not in self._cpuset:
            return False
        return not self._who or self._who_passes(pid, cgroup)


def cgroup_path(path: str) -> str:
    """A --cgroup value as the cgroup records write paths: /a/b, / for the
    root, in the lossless text of pstate.stream.names, so that the value
    matches whether it was given as the records write it (\\xNN for a byte
    that is not UTF-8) or with the bytes themselves (os.fsdecode's surrogates)."""
    return "/" + names.decode(names.encode(path), lossless=True).strip("/")

"""Event filters shared by record (compiled into the BPF program) and replay
(applied in Python), so `record -p X` and `record | replay -p X` agree."""

from __future__ import annotations

from dataclasses import dataclass, field

from pstate import schema

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
    _pidset: frozenset = field(default=frozenset(), repr=False)

    def __post_init__(self):
        self._pidset = frozenset(self.pids)
        self._tidset = frozenset(self.tids)
        self._commset = frozenset(c[:15] for c in self.comms)
        self._stateset = frozenset(self.states)
        self._cpuset = frozenset(self.cpus)

    @property
    def active(self) -> bool:
        return bool(self.pids or self.tids or self.comms or self.states or self.cpus or self.min_dur_ns)

    def meta_fields(self) -> dict:
        """The filter_* fields of a meta record."""
        out = {}
        for key, val in (("filter_pid", list(self.pids)), ("filter_tid", list(self.tids)),
                         ("filter_comm", list(self.comms)), ("filter_state", list(self.states)),
                         ("filter_cpu", list(self.cpus))):
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
        if not self.include_idle and rec.get("tid") == 0:
            return False
        if self._pidset and rec.get("pid") not in self._pidset:
            return False
        if self._tidset and rec.get("tid") not in self._tidset:
            return False
        if self._commset and rec.get("comm") not in self._commset:
            return False
        if self._cpuset and rec.get("cpu") not in self._cpuset:
            return False
        if t == "state":
            if self._stateset and rec.get("from") not in self._stateset and rec.get("to") not in self._stateset:
                return False
            if self.min_dur_ns:
                d = rec.get("dur_ns")
                if d is None or d < self.min_dur_ns:
                    return False
        return True

"""Why a thread waited: blocked time by kernel stack and by reason, the
wakers that ended blocked states, and the tasks that held the CPU while a
task waited on a run queue (its antagonists).

A Causes digests what the one reader hands out, in stream order, next to
the timeinstate.Aggregator that reads the same (digest()): plain state
records in bulk by the native Digester when it is built (_digest.Digester
set_why: it sums for the Aggregator as plain stats does, and, per task as
its rows gave it, what select() says each transition adds to the views;
add_native takes those sums), every other line as a record (a dict, the
careful path: a stack_id or reason with --stacks or --by reason, escaped
strings, ...), with the same results either way, which the tests hold
(tests/fuzz/test_why_native.py). Its size grows with the number of
groups, distinct stacks, wakers and antagonists, not of events (the
run-queue slices it keeps per CPU are bounded: SLICES_PER_CPU).

- Stacks: a state record leaving a blocked state (timeinstate.latency_kind
  says which; a wake-up, or a switch-in whose wake-up was not seen) adds its dur_ns to (state, stack) of its group, the stack
  being the frames of the stream's `stack` record its stack_id names
  (NO_STACK without one); the time a task is still blocked at the end of
  the window is added as AT_END, so that the stacks of a state sum to the
  blocked time stats reports for it. Stacks are keyed by their frames, so
  the same stack in two concatenated recordings is one.
- Reasons: the same intervals by the record's reason (NO_REASON without).
- Wakers: the same intervals by who ended them: a task (waker_tid), or irq/softirq (the record's
  waker), or UNKNOWN_WAKER (waker_tid 0 without waker, or no wake-up seen).
- Antagonists: every switch-out (running -> anything) leaves an on-CPU
  slice [ts - dur_ns, ts] on its CPU; a switch-in after a wake-up or a
  preemption waited [ts - dur_ns, ts] on the CPU it got, and the slices of
  other tasks on that CPU within that wait are the time they caused. The
  part no recorded slice covers (the CPU idle, a task the recording
  filtered out, or older than the slices kept; in a filtered recording,
  whose slices are those of the CPU a task waits on, also the part of a
  wait before the kernel moved the task to the CPU it got) is NOT_SEEN.

A waker's and an antagonist's pid, comm and group are those of the task's
last record in the input (a waker's pid as the recording said it where the
task itself was not seen), named once the input is read (finish()).

Group keys are those of the Aggregator, every one of timeinstate.BY_KEYS
(pid, tid, comm, all, and the services' cgroup, unit, container, title,
ppid: the key the stream's process and cgroup records give a record's pid
and cgroup at that point, services.Directory, as the Aggregator reads them),
or, by reason, the reason of the interval (run-queue waits have none:
NO_REASON). A waker and an antagonist carry the key of their own group too
(group), for the wake-up graph.
"""

from __future__ import annotations

import functools
from collections import deque
from dataclasses import dataclass, field

from pstate import native
from pstate.analysis import services
from pstate.analysis.ingest import feed_file
from pstate.analysis.latency import LogHist
from pstate.analysis.timeinstate import (ALL, RUNQ_PREEMPTED, RUNQ_WAKEUP, TAKE_BEFORE, Aggregator,
                                         latency_kind)
from pstate.stream import schema, vocab
from pstate.stream.reader import StreamReader, state_row
from pstate.stream.streamio import MAX_LINE, ReadStats

NO_STACK = "[no stack]"
AT_END = "[blocked at the end]"
NO_REASON = "-"
UNKNOWN_WAKER = "[unknown]"
NOT_SEEN = "[idle or unseen]"
WHY_BY_KEYS = ("reason",)  # groupings of their own, besides timeinstate.BY_KEYS
# The kinds of row Causes.select names (as _digest's set_why reads them):
# none, leaving a blocked state, leaving running (an on-CPU slice), a
# run-queue wait after a wake-up, after a preemption; and, in the native
# sums only, another task's slices within waits, and the rest of them.
NONE, BLOCKED, SLICE, WAIT_WAKEUP, WAIT_PREEMPTED, OVERLAP, UNSEEN = range(7)
SLICES_PER_CPU = 1 << 16  # on-CPU slices kept per CPU for --antagonists
NATIVE_CPUS = 1 << 16  # the CPUs whose slices the native reader keeps (others: the careful path's)


def aggregation_key(by: str) -> str:
    """The Aggregator's grouping for stats --by BY: BY itself, or for a
    grouping of the Causes' own (--by reason: the groups are reasons) the
    processes, whose sums give the report its window, input and accounting."""
    return "pid" if by in WHY_BY_KEYS else by


@dataclass
class Waker:
    """Who ended blocked intervals: kind "task", "irq", "softirq" or "unknown"."""

    kind: str
    tid: int = 0
    pid: int = 0
    comm: str = ""
    count: int = 0
    ended_ns: int = 0
    group: object = None  # the key of the waker's own group (a task's)
    pid_seq: int = field(default=0, repr=False, compare=False)  # (the native row number pid was set at)


@dataclass(slots=True)
class Antagonist:
    tid: int
    pid: int = 0
    comm: str = ""
    ns: int = 0
    waits: int = 0  # run-queue waits it held the CPU during
    group: object = None  # the key of its own group


@dataclass
class GroupCauses:
    key: object
    comm: str = ""
    stacks: dict = field(default_factory=dict)  # (state, frames) -> LogHist
    at_end: dict = field(default_factory=dict)  # state -> ns blocked at the end of the window
    reasons: dict = field(default_factory=dict)  # (state, reason) -> LogHist
    wakers: dict = field(default_factory=dict)  # waker key -> Waker
    runq_ns: int = 0  # run-queue time (after wake-up and preemption) with a known duration
    runq_waits: int = 0
    runq_kind_ns: dict = field(default_factory=dict)  # RUNQ_WAKEUP / RUNQ_PREEMPTED -> ns
    antagonists: dict = field(default_factory=dict)  # tid or NOT_SEEN -> Antagonist
    # (tid -> (pid, comm, group)): how antagonist_cut names a task, once the input is read
    namer: object = field(default=None, repr=False, compare=False)
    comm_seq: int = field(default=0, repr=False, compare=False)  # (the native row number comm was set at)
    # (rows -> (the first rows, rest_tasks, rest_ns)): where the native reader's antagonists are
    native: object = field(default=None, repr=False, compare=False)

    def blocked_ns(self, states=None) -> int:
        total = sum(h.total for (s, _f), h in self.stacks.items() if states is None or s in states)
        return total + sum(ns for s, ns in self.at_end.items() if states is None or s in states)

    def stack_rows(self, states=None) -> list:
        """[(state, frames, LogHist)] by total blocked time, longest first; the
        time blocked at the end of the window as a row of its own (no
        percentiles: its intervals did not end)."""
        rows = [(s, f, h) for (s, f), h in self.stacks.items() if states is None or s in states]
        for s, ns in self.at_end.items():
            if ns and (states is None or s in states):
                h = LogHist()
                h.total = ns
                rows.append((s, AT_END, h))
        rows.sort(key=lambda r: (-r[2].total, r[0], r[1]))
        return rows

    def reason_rows(self, states=None) -> list:
        rows = [(s, r, h) for (s, r), h in self.reasons.items() if states is None or s in states]
        rows.sort(key=lambda r: (-r[2].total, r[0], r[1]))
        return rows

    def waker_rows(self) -> list:
        return sorted(self.wakers.values(), key=lambda w: (-w.ended_ns, -w.count, w.kind, w.tid))

    def antagonist_cut(self, rows: int | None = None) -> tuple:
        """(shown, rest_tasks, rest_ns): the first `rows` antagonists (all:
        None) by time held, longest first, with the pid, comm and group of
        their last record; how many more there are, and their time."""
        if self.native is not None:
            shown, rest_n, rest_ns = self.native(rows)
        else:
            every = sorted(self.antagonists.values(), key=antagonist_order)
            shown, rest = every[:rows], every[rows:] if rows is not None else []
            rest_n, rest_ns = len(rest), sum(a.ns for a in rest)
        if self.namer is not None:
            for a in shown:
                if a.tid != NOT_SEEN:
                    a.pid, a.comm, a.group = self.namer(a.tid)
        return shown, rest_n, rest_ns


def antagonist_order(a: Antagonist) -> tuple:
    """Time held, longest first; the time no slice covers after a task's of
    the same length; then by the tid as text (_digest's ga_cmp, the same)."""
    return (-a.ns, a.tid == NOT_SEEN, str(a.tid))


@functools.lru_cache(maxsize=512)
def blocked_state(state: str) -> bool:
    """Whether time in a state is blocked time (S, D, T, ...), as stats counts it."""
    return vocab.is_blocked(state)


class Causes:
    """See the module docstring. add(rec) for every record in order (or,
    from the native reader, add_native), then finish(end_ts) once; groups
    holds a GroupCauses per group key."""

    def __init__(self, by: str = "pid", *, stacks: bool = False, wakers: bool = False, antagonists: bool = False,
                 filt=None):
        by, role = services.parse_by(by)
        self.by = by
        # stats -p, -c, --title, ...: the groups are of the tasks it keeps, but
        # every record is read (the wakers' names and processes, the slices of
        # the tasks that held a CPU): the filter applies after attributing
        self.filt = filt if filt is not None and filt.active else None
        self.last_ts = 0  # of the records the filter left out
        self.want_stacks = stacks
        self.want_wakers = wakers
        self.want_antagonists = antagonists
        self.groups: dict = {}
        self.frames: dict = {}  # (stream number, stack_id) -> frames
        self.stream = 0
        self.comms: dict = {}  # tid -> comm last seen
        self.pids: dict = {}  # tid -> pid last seen
        self.cgroups: dict = {}  # tid -> the cgroup id its last record carried (None: none)
        self.last: dict = {}  # tid -> (ts, state entered) of its last record the filter kept
        self.slices: dict = {}  # cpu -> deque of (start, end, tid)
        self.has_stacks = False  # the input had stack records
        self.stacked: set = set()  # the states whose intervals came with a stack_id
        self._selected: dict = {}  # (from, to) -> select(from, to)
        self.numbers: dict = {}  # group key -> its number (the native reader's name for it)
        self._native_cuts: dict = {}  # rows -> what _digest's why_antagonists said
        self.native = None  # the native Digester whose slices the careful path's records join
        # --by cgroup, unit, container, title, ppid: what the stream's process
        # and cgroup records said so far, and the keys they give, cached
        self.services = services.GroupKeys(by, role) if by in services.BY_KEYS else None

    def group(self, key) -> GroupCauses:
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = GroupCauses(key=key)
            self.numbers[key] = len(self.numbers)
        return g

    @property
    def careful_stacks(self) -> bool:
        """Whether a state record's stack_id and reason are read (--stacks,
        --by reason): such a record is not a plain row."""
        return self.want_stacks or self.by == "reason"

    def select(self, frm: str, to: str) -> int:
        """The kind of row a transition (with its dur_ns known) is to the
        views asked for: BLOCKED (leaving a blocked state: stacks, reasons,
        wakers), SLICE (leaving running) or WAIT_* (a run-queue wait:
        antagonists), or NONE."""
        if blocked_state(frm):
            return BLOCKED if self.want_stacks or self.want_wakers or self.by == "reason" else NONE
        if not self.want_antagonists:
            return NONE
        if frm == schema.RUNNING:
            return SLICE
        if to == schema.RUNNING:
            kind = latency_kind(frm, to)
            if kind == RUNQ_WAKEUP:
                return WAIT_WAKEUP
            if kind == RUNQ_PREEMPTED:
                return WAIT_PREEMPTED
        return NONE

    def add(self, rec: dict, own: bool = True) -> None:
        """A record from the reader (a state record whole: its fields beyond
        a row's are used); own: a state record the filter keeps."""
        t = rec["type"]
        if t == "state":
            self._state(rec, own)
        elif t == "stack":
            self.frames[(self.stream, rec["stack_id"])] = rec["frames"]
            self.has_stacks = True
        elif t == "meta":
            self.stream += 1  # stack ids are per stream
        elif t in ("fork", "exec", "exit", "waker"):
            if _id(rec.get("tid")):  # (the reader checks fork, exec and exit; a waker record is taken as it is)
                self._note(rec["tid"], 1, rec.get("comm"))
        elif self.services is not None and t in ("process", "cgroup"):
            self.services.note(rec)
        elif t == "slice":  # a task a filtered recording does not follow, on a CPU a followed one waited for
            tid, pid, ts, d, cpu = rec.get("tid"), rec.get("pid"), rec.get("ts"), rec.get("dur_ns"), rec.get("cpu")
            if not (_id(tid) and _id(pid)):
                return  # (not as record writes it)
            self._note(tid, 3, rec.get("comm"), pid)
            if self.want_antagonists and _id(ts) and _id(d) and _id(cpu) and d <= ts:
                self._slice(cpu, ts - d, ts, tid)

    def _state(self, rec: dict, own: bool) -> None:
        ts, pid, tid, comm, frm, to = rec["ts"], rec["pid"], rec["tid"], rec.get("comm"), rec["from"], rec["to"]
        d, cg = rec.get("dur_ns"), rec.get("cgroup")
        # (a cgroup that is not an id names no service: services.GroupKeys takes it as none)
        self._note(tid, 15 if own else 7, comm, pid, cg if _id(cg) else None, ts, to)
        if not own and ts > self.last_ts:
            self.last_ts = ts
        if d is None:
            return
        sid = rec.get("stack_id")
        if sid is not None and self.want_stacks and blocked_state(frm):
            self.stacked.add(frm)  # the states the recording took stacks of
        kind = self._selected.get((frm, to))
        if kind is None:
            kind = self._selected[(frm, to)] = self.select(frm, to)
        if not kind:
            return
        frames = NO_STACK
        if sid is not None and self.want_stacks:
            frames = self.frames.get((self.stream, sid), NO_STACK)
        self._row(kind, ts, pid, tid, comm, frm, to, d, rec["cpu"], cg, own, rec.get("waker"),
                  rec.get("waker_tid"), rec.get("waker_pid"), frames, rec.get("reason") or NO_REASON)

    def _note(self, tid: int, what: int, comm, pid=None, cg=None, ts=None, to=None) -> None:
        """What a record says of a task (what: 1 comm, 2 pid, 4 cgroup, 8
        where it is, of a record the filter keeps), for naming it at the end."""
        if self.native is not None:
            self.native.why_note(tid, what, comm, pid, cg, ts, to)
            return
        if what & 1:
            self.comms[tid] = comm
        if what & 2:
            self.pids[tid] = pid
        if what & 4:
            self.cgroups[tid] = cg
        if what & 8:
            self.last[tid] = (ts, to)

    def add_native(self, sums: list, last_ts, names: tuple) -> None:
        """What the native reader summed for the views since it last said
        (_digest.Digester.take_why): per task as its rows gave it and per
        what, and the latest ts of a record the filter left out: the same as
        _row of each row, in order (the careful path's rows since count as
        later where they set a name); the antagonists of the waits are
        added to their groups' in the native reader (why_fold)."""
        if last_ts is not None and last_ts > self.last_ts:
            self.last_ts = last_ts
        latest: dict = {}  # group key -> (seq, comm) of its last row
        waker_pids: dict = {}  # id(Waker) -> (seq, pid, Waker) of the last row that named its process
        numbers = []  # per entry of sums, its group's number
        for tid, pid, comm, cg, a, b, count, total, vmin, vmax, buckets, wpid, wpid_seq, seq in sums:
            key = self._key(pid, tid, comm, NO_REASON, cg)
            g = self.groups.get(key)
            if g is None:
                g = self.group(key)
            numbers.append(self.numbers[key])
            if seq > latest.get(key, (0,))[0]:
                latest[key] = (seq, comm)
            kind = a & 15
            if kind == BLOCKED:
                frm = names[(a >> 4) & 63]
                if self.want_stacks:
                    _hist(g.stacks, (frm, NO_STACK)).add_counts(buckets, count, total, vmin, vmax)
                    _hist(g.reasons, (frm, NO_REASON)).add_counts(buckets, count, total, vmin, vmax)
                if self.want_wakers:
                    w = self._waker_of(g, names[(a >> 10) - 1] if a >> 10 else None, b)
                    w.count += count
                    w.ended_ns += total
                    if wpid_seq > max(w.pid_seq, waker_pids.get(id(w), (0,))[0]):
                        waker_pids[id(w)] = (wpid_seq, wpid, w)
            else:
                rk = RUNQ_WAKEUP if kind == WAIT_WAKEUP else RUNQ_PREEMPTED
                g.runq_kind_ns[rk] = g.runq_kind_ns.get(rk, 0) + total
                g.runq_ns += total
                g.runq_waits += count
        self.native.why_fold(numbers)
        for key, (seq, comm) in latest.items():
            g = self.groups[key]
            if seq > g.comm_seq:
                g.comm, g.comm_seq = comm or "", seq
        for seq, wpid, w in waker_pids.values():
            if w.kind == "task":
                w.pid, w.pid_seq = wpid, seq

    def _row(self, kind, ts, pid, tid, comm, frm, to, d, cpu, cg, own, irq, wtid, wpid, frames=NO_STACK,
             reason=NO_REASON) -> None:
        """A transition of a kind select() names, its dur_ns known; own: the
        filter keeps it (a task it leaves out adds only its on-CPU slices,
        for others' antagonists)."""
        if kind == SLICE:
            self._slice(cpu, ts - d, ts, tid)
            return
        if not own:
            return
        key = self._key(pid, tid, comm, reason, cg)
        g = self.groups.get(key)
        if g is None:
            g = self.group(key)
        # (after the native rows read so far: they count as earlier)
        stamp = self.native.why_seq() if self.native is not None else 0
        g.comm, g.comm_seq = comm or "", stamp
        if kind == BLOCKED:  # a wake-up, or a switch-in whose wake-up was not seen
            if self.want_stacks:
                _hist(g.stacks, (frm, frames)).add(d)
                _hist(g.reasons, (frm, reason)).add(d)
            if self.want_wakers:
                w = self._waker_of(g, irq, wtid or 0)
                w.count += 1
                w.ended_ns += d
                if wpid and w.kind == "task":
                    w.pid, w.pid_seq = wpid, stamp  # (what the recording said of the waker's process)
        else:
            rk = RUNQ_WAKEUP if kind == WAIT_WAKEUP else RUNQ_PREEMPTED
            g.runq_kind_ns[rk] = g.runq_kind_ns.get(rk, 0) + d
            self._wait(g, cpu, ts - d, ts, tid)

    def _key(self, pid, tid, comm, reason=NO_REASON, cg=None):
        by = self.by
        if by == "pid":
            return pid
        if by == "tid":
            return tid
        if by == "comm":
            return comm
        if by == "reason":
            return reason
        if self.services is not None:
            return self.services.group(pid, cg)
        return ALL

    def key_of_tid(self, tid):
        """The group key of a task by its last record (None: by reason)."""
        if self.by == "reason":
            return None
        return self._key(self.pids.get(tid, 0), tid, self.comms.get(tid), NO_REASON, self.cgroups.get(tid))

    @staticmethod
    def _waker_of(g: GroupCauses, irq, wtid: int) -> Waker:
        if irq:
            wkey = (irq, 0)
        elif wtid:
            wkey = ("task", wtid)
        else:
            wkey = ("unknown", 0)
        w = g.wakers.get(wkey)
        if w is None:
            w = g.wakers[wkey] = Waker(kind=wkey[0], tid=wkey[1])
        return w

    def _slice(self, cpu: int, start: int, end: int, tid: int) -> None:
        if self.native is not None and 0 <= cpu < NATIVE_CPUS:
            self.native.why_slice(cpu, start, end, tid)
            return
        q = self.slices.get(cpu)
        if q is None:
            q = self.slices[cpu] = deque(maxlen=SLICES_PER_CPU)
        q.append((start, end, tid))

    def _overlaps(self, cpu: int, start: int, end: int, tid: int) -> list:
        """[(other tid, overlap)]: the other tasks' slices on cpu within
        [start, end], newest first."""
        out = []
        for s, e, other in reversed(self.slices.get(cpu, ())):
            if e <= start:
                break
            if other == tid:
                continue
            ov = min(e, end) - max(s, start)
            if ov > 0:
                out.append((other, ov))
        return out

    def _wait(self, g: GroupCauses, cpu: int, start: int, end: int, tid: int) -> None:
        g.runq_ns += end - start
        g.runq_waits += 1
        if end <= start:
            return
        if self.native is not None and 0 <= cpu < NATIVE_CPUS:
            self.native.why_wait(self.numbers[g.key], cpu, start, end, tid)
            return
        seen = 0
        for other, ov in self._overlaps(cpu, start, end, tid):
            a = g.antagonists.get(other)
            if a is None:
                a = g.antagonists[other] = Antagonist(tid=other)
            a.ns += ov
            a.waits += 1
            seen += ov
        rest = (end - start) - seen
        if rest > 0:
            a = g.antagonists.get(NOT_SEEN)
            if a is None:
                a = g.antagonists[NOT_SEEN] = Antagonist(tid=NOT_SEEN)
            a.ns += rest
            a.waits += 1

    def finish(self, end_ts: int | None) -> None:
        """At the end of the input: the time tasks are still blocked at the
        end of the window, under the group of their last record; the names,
        processes and groups of the wakers and antagonists, as their last
        records gave them (a waker's process as the recording said it when
        the task itself was not seen)."""
        if self.native is not None:  # the names the native reader kept
            for tid, pid, comm, cg, ts, to in self.native.why_tasks():
                self.comms[tid] = comm
                if pid is not None:
                    self.pids[tid] = pid
                self.cgroups[tid] = cg
                if ts is not None:
                    self.last[tid] = (ts, to)
        if end_ts is not None and self.want_stacks:
            for tid, (ts, state) in self.last.items():
                if end_ts > ts and blocked_state(state):
                    g = self.group(NO_REASON if self.by == "reason" else self.key_of_tid(tid))
                    g.at_end[state] = g.at_end.get(state, 0) + (end_ts - ts)
        named = self.by != "reason"
        known: dict = {}  # tid -> (pid, comm, group) by its last record

        def of(tid):
            k = known.get(tid)
            if k is None:
                k = known[tid] = (self.pids.get(tid, 0), self.comms.get(tid) or "", self.key_of_tid(tid))
            return k

        for g in self.groups.values():
            g.namer = of  # (the antagonists, many: named when shown)
            if self.native is not None:
                g.native = functools.partial(self._native_cut, g)
            for w in g.wakers.values():
                if w.kind == "task":
                    w.pid = w.pid or self.pids.get(w.tid, 0)
                    w.comm = self.comms.get(w.tid) or ""
                    if named:
                        w.group = self._key(w.pid, w.tid, w.comm or None, NO_REASON, self.cgroups.get(w.tid))

    def _native_cut(self, g: GroupCauses, rows: int | None) -> tuple:
        """GroupCauses.antagonist_cut of a group whose antagonists the
        native reader holds (with those the careful path kept of CPUs it
        does not, merged)."""
        top = -1 if rows is None or g.antagonists else rows
        cuts = self._native_cuts.get(top)
        if cuts is None:
            cuts = self._native_cuts[top] = self.native.why_antagonists(top)
        shown, rest_n, rest_ns = cuts.get(self.numbers[g.key], ([], 0, 0))
        shown = [Antagonist(NOT_SEEN if tid < 0 else tid, 0, "", ns, waits) for tid, ns, waits in shown]
        if g.antagonists:  # (a CPU beyond NATIVE_CPUS: the careful path's own)
            merged = {a.tid: a for a in shown}
            for a in g.antagonists.values():
                m = merged.get(a.tid)
                if m is None:
                    merged[a.tid] = Antagonist(a.tid, 0, "", a.ns, a.waits)
                else:
                    m.ns += a.ns
                    m.waits += a.waits
            every = sorted(merged.values(), key=antagonist_order)
            shown, rest = every[:rows], every[rows:] if rows is not None else []
            rest_n, rest_ns = len(rest), sum(a.ns for a in rest)
        return shown, rest_n, rest_ns

    def stack_states(self) -> frozenset | None:
        """The states the input took stacks of (None: it took none)."""
        return frozenset(self.stacked) or None

    def ordered(self) -> list:
        """The groups by blocked time (by reason or all), longest first."""
        return sorted(self.groups.values(), key=lambda g: (-(g.blocked_ns() + g.runq_ns), str(g.key)))


def _id(v) -> bool:
    """Whether v is an int as record writes ids, times and CPUs (0 <= v < 2^63)."""
    return type(v) is int and 0 <= v < 1 << 63


def _hist(table: dict, key) -> LogHist:
    h = table.get(key)
    if h is None:
        h = table[key] = LogHist()
    return h


def callers(frames: str, reason: str | None, n: int = 3) -> list[str]:
    """The function names of a stack from its reason's frame toward the
    root (at most n after the reason), e.g. for a table cell."""
    names = [vocab.frame_name(f) for f in vocab.leaf_first(frames)]
    if reason and reason in names:
        names = names[names.index(reason):]
    return names[:n + 1]


# --- reading ---------------------------------------------------------------------



class _Sink:
    """The reader's records to the Aggregator (state rows in batches) and to
    the Causes, in order; with the native Digester (native()), what it read
    in bulk to each before the next record the careful path read that
    depends on it: to the Aggregator before a state or exec record
    (timeinstate.TAKE_BEFORE, as ingest.LineDigester), to the Causes before
    a process or cgroup record that may move a task to another group (--by
    a service)."""

    BATCH = 4096

    def __init__(self, agg: Aggregator, causes: Causes):
        self.agg = agg
        self.causes = causes
        self.filt = causes.filt  # applied here, after the Causes have seen each record
        self.pending: list = []  # state rows the Aggregator has not had yet
        self.dig = None  # the native Digester, in why mode
        self.agg_due = False  # it read what the Aggregator has not had
        self.causes_due = False  # and the Causes
        self.forget = None  # its forget: what it knows of pids may change with a process or cgroup record

    def native(self, max_line: int):
        """A bulk reader for StreamReader (fast): the native Digester,
        summing for the Aggregator and for the views the Causes select();
        None when it is not built."""
        if _digest is None:
            return None
        agg, causes, filt = self.agg, self.causes, self.filt
        dig = self.dig = _digest.Digester(agg.digest_by, agg.state_id, agg.digest_group)
        dig.set_why(causes.select, causes.careful_stacks, SLICES_PER_CPU, causes.want_stacks, causes.want_wakers)
        causes.native = dig
        if filt is not None:
            dig.set_filter(*filt.native_spec())
        if agg.services is not None or (filt is not None and filt.needs_identities):
            self.forget = dig.forget
        digest = dig.digest

        def fast(buf, pos, end, _n):
            self.flush()  # the careful rows before
            self.agg_due = self.causes_due = True  # (also if a callback it makes is interrupted)
            stop, n, due = digest(buf, pos, end, max_line, agg.clip_ts)
            if due:
                self.settle_agg(True)
            return stop, n, n

        return fast

    def settle_agg(self, flush: bool = False) -> None:
        if self.dig is not None and (self.agg_due or flush):
            self.agg_due = False
            self.agg.add_digested(*self.dig.take(flush))

    def settle_causes(self) -> None:
        if self.causes_due:
            self.causes_due = False
            self.causes.add_native(*self.dig.take_why())

    def flush(self) -> None:
        if self.pending:
            rows, self.pending = self.pending, []
            self.agg.add_rows(rows)

    def end(self) -> None:
        self.flush()
        self.settle_agg(True)
        self.settle_causes()

    def record(self, rec: dict, weight: int) -> None:
        t = rec["type"]
        if self.agg_due and t in TAKE_BEFORE:
            self.settle_agg()
        filt = self.filt
        if t == "state":
            own = filt is None or filt.match(rec)
            self.causes.add(rec, own)
            if own:
                self.pending.append(state_row(rec, weight))
                if len(self.pending) >= self.BATCH:
                    self.flush()
            return
        self.flush()
        if t in ("process", "cgroup"):
            if self.causes_due and self.causes.services is not None:
                self.settle_causes()  # (its sums are of the groups as they were)
            if self.forget is not None:
                self.forget(rec.get("pid") if t == "process" and type(rec.get("pid")) is int else None)
        if filt is not None:  # as the reader applies a filter (reader.StreamReader)
            if t == "meta":
                rec.update(filt.read_fields())
            elif t in ("process", "cgroup"):
                filt.note(rec)
            elif not filt.match(rec):
                self.causes.add(rec)  # (a name, for the wakers and antagonists)
                return
        if t == "meta":
            self.agg.begin_window(rec)
        self.agg.add_record(rec)
        self.causes.add(rec)


def digest(sources, agg: Aggregator, causes: Causes, stats: ReadStats, *, strict: bool = False,
           use_native: bool = True, chunk: int = 1 << 20, filt=None) -> None:
    """Files ("-" is stdin), in order, into both (see the module
    docstring); use_native False: the careful path only. filt (-p, -c,
    --title, ...): the tasks whose groups are shown, applied after
    attributing (Causes.filt): every record is read."""
    if filt is not None and filt.active:
        causes.filt = filt
    sink = _Sink(agg, causes)
    fast = sink.native(MAX_LINE) if use_native else None
    reader = StreamReader(sink, stats, strict=strict, max_line=MAX_LINE, fast=fast, dicts=True)
    try:
        for src in sources:
            feed_file(src, reader, stats, chunk)
    finally:  # also on an error or ^C: what was read counts
        sink.end()


# The native reader (None when not built or PSTATE_PURE=1; tests switch it).
_digest = native.load("_digest")

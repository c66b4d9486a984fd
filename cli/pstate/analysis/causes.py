"""Why a thread waited: blocked time by kernel stack and by reason, the
wakers that ended blocked states, and the tasks that held the CPU while a
task waited on a run queue (its antagonists).

A Causes digests what the one reader hands out, in stream order, next to
the timeinstate.Aggregator that reads the same (digest()): plain state
records as state rows, read in bulk by pstate._digest.parse_states when it
is built, and as records (dicts, the careful path) the lines that hold what
a row has not (record_keys(): stack_id, reason, the waker fields), with the
same results either way. Its size grows with the number of groups,
distinct stacks, wakers and antagonists, not of events (the run-queue
slices it keeps per CPU are bounded: SLICES_PER_CPU).

- Stacks: a state record leaving a blocked state (timeinstate.latency_kind
  says which; a wake-up, or a switch-in whose wake-up was not seen) adds its dur_ns to (state, stack) of its group, the stack
  being the frames of the stream's `stack` record its stack_id names
  (NO_STACK without one); the time a task is still blocked at the end of
  the window is added as AT_END, so that the stacks of a state sum to the
  blocked time stats reports for it. Stacks are keyed by their frames, so
  the same stack in two concatenated recordings is one.
- Reasons: the same intervals by the record's reason (NO_REASON without).
- Wakers: the same intervals by who ended them: a task (waker_tid, with its
  pid, and the comm last seen for that tid), or irq/softirq (the record's
  waker), or UNKNOWN_WAKER (waker_tid 0 without waker, or no wake-up seen).
- Antagonists: every switch-out (running -> anything) leaves an on-CPU
  slice [ts - dur_ns, ts] on its CPU; a switch-in after a wake-up or a
  preemption waited [ts - dur_ns, ts] on the CPU it got, and the slices of
  other tasks on that CPU within that wait are the time they caused. The
  part no recorded slice covers (the CPU idle, a task the recording
  filtered out, or older than the slices kept) is NOT_SEEN.

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

from pstate.analysis import services
from pstate.analysis.ingest import feed_file
from pstate.analysis.latency import LogHist
from pstate.analysis.timeinstate import ALL, RUNQ_PREEMPTED, RUNQ_WAKEUP, Aggregator, latency_kind
from pstate.stream import schema, vocab
from pstate.stream.reader import StreamReader, state_row
from pstate.stream.streamio import MAX_LINE, ReadStats

NO_STACK = "[no stack]"
AT_END = "[blocked at the end]"
NO_REASON = "-"
UNKNOWN_WAKER = "[unknown]"
NOT_SEEN = "[idle or unseen]"
WHY_BY_KEYS = ("reason",)  # groupings of their own, besides timeinstate.BY_KEYS
SLICES_PER_CPU = 1 << 16  # on-CPU slices kept per CPU for --antagonists


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


@dataclass
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

    def antagonist_rows(self) -> list:
        return sorted(self.antagonists.values(), key=lambda a: (-a.ns, a.tid == NOT_SEEN, str(a.tid)))


@functools.lru_cache(maxsize=512)
def blocked_state(state: str) -> bool:
    """Whether time in a state is blocked time (S, D, T, ...), as stats counts it."""
    return vocab.is_blocked(state)


class Causes:
    """See the module docstring. add(rec) for every record in order, then
    finish(end_ts) once; groups holds a GroupCauses per group key."""

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
        self.last: dict = {}  # tid -> (ts, state entered, group key)
        self.slices: dict = {}  # cpu -> deque of (start, end, tid)
        self.has_stacks = False  # the input had stack records
        self.stacked: set = set()  # the states whose intervals came with a stack_id
        self._blocked: dict = {}  # state -> blocked_state(state)
        self._runq_kinds: dict = {}  # from-state -> latency_kind(from, running)
        # --by cgroup, unit, container, title, ppid: what the stream's process
        # and cgroup records said so far, and the keys they give, cached
        self.services = services.GroupKeys(by, role) if by in services.BY_KEYS else None
        self.cgroups: dict = {}  # tid -> the cgroup id its last record carried (None: none)

    def group(self, key) -> GroupCauses:
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = GroupCauses(key=key)
        return g

    def record_keys(self) -> tuple:
        """What a state line must hold to be wanted whole (as a record)
        rather than as a row: the fields of the views asked for."""
        keys = []
        if self.want_stacks or self.by == "reason":
            keys.append(b'"stack_id"')
            keys.append(b'"reason"')
        if self.want_wakers:
            keys.append(b'"waker')
        return tuple(keys)

    def add(self, rec: dict, own: bool = True) -> None:
        """A record from the reader (a state record whole: its fields beyond
        a row's are used); own: a state record the filter keeps."""
        t = rec["type"]
        if t == "state":
            self._state(rec["ts"], rec["pid"], rec["tid"], rec.get("comm"), rec["from"], rec["to"],
                        rec.get("dur_ns"), rec["cpu"], rec, None, own)
        elif t == "stack":
            self.frames[(self.stream, rec["stack_id"])] = rec["frames"]
            self.has_stacks = True
        elif t == "meta":
            self.stream += 1  # stack ids are per stream
        elif t in ("fork", "exec", "exit", "waker"):
            self.comms[rec["tid"]] = rec.get("comm")
        elif self.services is not None and t in ("process", "cgroup"):
            self.services.note(rec)
        elif t == "slice":  # a task a filtered recording does not follow, on a CPU a followed one waited for
            self.comms[rec["tid"]] = rec.get("comm")
            self.pids[rec["tid"]] = rec["pid"]
            if self.want_antagonists and type(rec.get("dur_ns")) is int:
                self._slice(rec["cpu"], rec["ts"] - rec["dur_ns"], rec["ts"], rec["tid"])

    def add_rows(self, rows) -> list:
        """State rows (reader.ROW_FIELDS) of lines without record_keys();
        those the filter keeps (all without one)."""
        state = self._state
        filt = self.filt
        if filt is None:
            self._plain_rows(rows)
            return rows
        kept = []
        match = filt.match_state
        for row in rows:
            ts, pid, tid, comm, frm, to, d, cpu, _w, cg, _steal = row
            own = match(pid, tid, comm, cpu, frm, to, d, cg)
            state(ts, pid, tid, comm, frm, to, d, cpu, None, cg, own)
            if own:
                kept.append(row)
        return kept

    def _plain_rows(self, rows) -> None:
        """_state of rows, every one the Causes' own (no filter), inlined:
        the bulk of a stream. A row has no stack_id, reason or waker
        (those lines come as records)."""
        by = self.by
        by_pid, by_tid, by_comm = by == "pid", by == "tid", by == "comm"
        service = self.services.group if self.services is not None else None
        const = NO_REASON if by == "reason" else ALL
        groups_get = self.groups.get
        new_group = self.group
        names = self.want_wakers or self.want_antagonists
        comms, pids, last = self.comms, self.pids, self.last
        cgroups = self.cgroups if service is not None else None
        stacks, wakers, antagonists = self.want_stacks, self.want_wakers, self.want_antagonists
        blocked = self._blocked
        slices = self.slices
        running = schema.RUNNING
        runq = self._runq_kinds
        at_end_key = by != "reason"
        for ts, pid, tid, comm, frm, to, d, cpu, _w, cg, _steal in rows:
            if names:
                comms[tid] = comm
                pids[tid] = pid
            if cgroups is not None:
                cgroups[tid] = cg
            if by_pid:
                key = pid
            elif by_tid:
                key = tid
            elif by_comm:
                key = comm
            elif service is not None:
                key = service(pid, cg)
            else:
                key = const
            g = groups_get(key)
            if g is None:
                g = new_group(key)
            g.comm = comm or ""
            if stacks:
                last[tid] = (ts, to, key if at_end_key else NO_REASON)
            if d is None:
                continue
            b = blocked.get(frm)
            if b is None:
                b = blocked[frm] = blocked_state(frm)
            if b:
                if stacks:
                    _hist(g.stacks, (frm, NO_STACK)).add(d)
                    _hist(g.reasons, (frm, NO_REASON)).add(d)
                if wakers:
                    self._waker(g, {}, d)
            elif antagonists:
                if frm == running:
                    q = slices.get(cpu)
                    if q is None:
                        q = slices[cpu] = deque(maxlen=SLICES_PER_CPU)
                    q.append((ts - d, ts, tid))
                elif to == running:
                    kind = runq.get(frm)
                    if kind is None:
                        kind = runq[frm] = latency_kind(frm, to)
                    if kind in (RUNQ_WAKEUP, RUNQ_PREEMPTED):
                        g.runq_kind_ns[kind] = g.runq_kind_ns.get(kind, 0) + d
                        self._wait(g, cpu, ts - d, ts, tid)

    def _key(self, pid, tid, comm, rec, cg=None):
        by = self.by
        if by == "pid":
            return pid
        if by == "tid":
            return tid
        if by == "comm":
            return comm
        if by == "reason":
            return (rec.get("reason") if rec is not None else None) or NO_REASON
        if self.services is not None:
            return self.services.group(pid, cg)
        return ALL

    def key_of_tid(self, tid):
        """The group key of a task by its last record (None: by reason)."""
        if self.by == "reason":
            return None
        return self._key(self.pids.get(tid, 0), tid, self.comms.get(tid), None, self.cgroups.get(tid))

    def _state(self, ts, pid, tid, comm, frm, to, d, cpu, rec, cg=None, own=True) -> None:
        self.comms[tid] = comm
        self.pids[tid] = pid
        if rec is not None:
            cg = rec.get("cgroup")
        if self.services is not None:
            self.cgroups[tid] = cg
        if not own:  # a task the filter leaves out: only its on-CPU slices count (for others' antagonists)
            if ts > self.last_ts:
                self.last_ts = ts
            if rec is not None and rec.get("stack_id") is not None and d is not None and blocked_state(frm):
                self.stacked.add(frm)  # the states the recording took stacks of
            if self.want_antagonists and d is not None and frm == schema.RUNNING:
                self._slice(cpu, ts - d, ts, tid)
            return
        key = self._key(pid, tid, comm, rec, cg)
        g = self.group(key)
        g.comm = comm or ""
        self.last[tid] = (ts, to, key if self.by != "reason" else NO_REASON)
        if d is None:
            return
        if blocked_state(frm):  # a wake-up, or a switch-in whose wake-up was not seen
            if self.want_stacks:
                sid = rec.get("stack_id") if rec is not None else None
                if sid is not None:
                    self.stacked.add(frm)
                frames = self.frames.get((self.stream, sid), NO_STACK) if sid is not None else NO_STACK
                _hist(g.stacks, (frm, frames)).add(d)
                _hist(g.reasons, (frm, (rec.get("reason") if rec is not None else None) or NO_REASON)).add(d)
            if self.want_wakers:
                self._waker(g, rec or {}, d)
        elif self.want_antagonists:
            if frm == schema.RUNNING:
                self._slice(cpu, ts - d, ts, tid)
            elif to == schema.RUNNING:
                kind = latency_kind(frm, to)
                if kind in (RUNQ_WAKEUP, RUNQ_PREEMPTED):
                    g.runq_kind_ns[kind] = g.runq_kind_ns.get(kind, 0) + d
                    self._wait(g, cpu, ts - d, ts, tid)

    def _waker(self, g: GroupCauses, rec: dict, d: int) -> None:
        irq = rec.get("waker")
        wtid = rec.get("waker_tid") or 0
        if irq:
            wkey = (irq, 0)
        elif wtid:
            wkey = ("task", wtid)
        else:
            wkey = ("unknown", 0)
        w = g.wakers.get(wkey)
        if w is None:
            w = g.wakers[wkey] = Waker(kind=wkey[0], tid=wtid if wkey[0] == "task" else 0)
        if w.kind == "task":
            w.pid = rec.get("waker_pid") or self.pids.get(wtid, 0)
            w.comm = self.comms.get(wtid) or w.comm
            if self.by != "reason":
                w.group = self._key(w.pid, wtid, w.comm or None, None, self.cgroups.get(wtid))
        w.count += 1
        w.ended_ns += d

    def _slice(self, cpu: int, start: int, end: int, tid: int) -> None:
        q = self.slices.get(cpu)
        if q is None:
            q = self.slices[cpu] = deque(maxlen=SLICES_PER_CPU)
        q.append((start, end, tid))

    def _wait(self, g: GroupCauses, cpu: int, start: int, end: int, tid: int) -> None:
        g.runq_ns += end - start
        g.runq_waits += 1
        if end <= start:
            return
        seen = 0
        for s, e, other in reversed(self.slices.get(cpu, ())):
            if e <= start:
                break
            if other == tid:
                continue
            ov = min(e, end) - max(s, start)
            if ov <= 0:
                continue
            a = g.antagonists.get(other)
            if a is None:
                a = g.antagonists[other] = Antagonist(tid=other, group=self.key_of_tid(other))
            a.pid = self.pids.get(other, 0)
            a.comm = self.comms.get(other) or ""
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
        """The time tasks are still blocked at the end of the window, under
        the group of their last record."""
        if end_ts is None or not self.want_stacks:
            return
        for ts, state, key in self.last.values():
            if not blocked_state(state):
                continue
            if end_ts > ts:
                g = self.group(key)
                g.at_end[state] = g.at_end.get(state, 0) + (end_ts - ts)

    def stack_states(self) -> frozenset | None:
        """The states the input took stacks of (None: it took none)."""
        return frozenset(self.stacked) or None

    def ordered(self) -> list:
        """The groups by blocked time (by reason or all), longest first."""
        return sorted(self.groups.values(), key=lambda g: (-(g.blocked_ns() + g.runq_ns), str(g.key)))


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
    """The reader's rows and records to the Aggregator (state rows in
    batches, whichever path read them) and to the Causes, in order."""

    BATCH = 4096

    def __init__(self, agg: Aggregator, causes: Causes):
        self.agg = agg
        self.causes = causes
        self.filt = causes.filt  # applied here, after the Causes have seen each record
        self.pending: list = []  # state rows the Aggregator has not had yet

    def flush(self) -> None:
        if self.pending:
            rows, self.pending = self.pending, []
            self.agg.add_rows(rows)

    def rows(self, rows: list) -> None:
        self.pending.extend(self.causes.add_rows(rows))
        if len(self.pending) >= self.BATCH:
            self.flush()

    def record(self, rec: dict, weight: int) -> None:
        t = rec["type"]
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
    reader = StreamReader(sink, stats, strict=strict, max_line=MAX_LINE, native_rows=use_native, dicts=True,
                          careful_keys=causes.record_keys())
    try:
        for src in sources:
            feed_file(src, reader, stats, chunk)
    finally:  # also on an error or ^C: what was read counts
        sink.flush()

"""Thread State Analysis: where each task's time goes, state by state.

An Aggregator digests state and lifecycle records into totals whose size
depends on the number of tasks (and latency buckets), never on the number of
events:

- per group (pid, tid or comm) and transition (from, to), a "cell": the
  count, the count whose dur_ns is null, the sum and max of dur_ns, and a
  log-linear histogram of dur_ns (latency.py). Time in state, transition
  counts and matrix, voluntary/involuntary switches and every latency
  distribution are rolled up from the cells;
- per task (thread), its first and last transition: for the time between
  its last transition and the end of the window (attributed to the state it
  is in), and for the part of the window before its first transition when
  that transition's start was not seen (reported as unobserved).

summarise() turns that into a Summary for the renderers. Input reaches the
Aggregator through the one reader (reader.StreamReader, wrapped by
ingest.LineDigester): state rows in batches (add_rows), other records one at a time
(add_record), and, on the fast path, what the native Digester summed up over
a run of plain state records (add_digested, add_buckets: the documented
interface of pstate._digest, which never touches the Aggregator itself). A
large file can be cut into parts at line starts, digested by several
processes and merged in file order (ingest.digest_parallel). All give the same
numbers; the tests hold them to it.

Accounting: for a task seen through the whole window, running + waiting +
blocked + ... + unobserved = window, up to lost events; the difference is its
deviation, reported in the summary's accounting block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pstate.analysis import services
from pstate.analysis.latency import SUB_BITS, LogHist
from pstate.stream import schema, vocab
from pstate.stream.meta import TASK_FILTERS, TRANSITION_FILTERS, filters_in_force, stream_window
from pstate.stream.reader import state_row
from pstate.stream.streamio import ReadStats

ALL = "all"  # by all: the one group's key
BY_KEYS = ("pid", "tid", "comm", ALL) + services.BY_KEYS
# groups with a name (a comm, all, a title, a cgroup path, ...) rather than a pid or tid
NAMED_BY = ("comm", ALL) + services.BY_KEYS
LIFECYCLE = ("fork", "exec", "exit")
# The records before which a native reader hands over its sums (the
# Digester's take): a careful state record, which must follow the transitions
# before it, and an exec, which renames its task (add_lifecycle). A fork or
# an exit only counts in its group, whatever came before: no take.
TAKE_BEFORE = ("state", "exec")

# Kinds of latency distribution (stream.vocab's table), in display order;
# blocked_<state> follow.
RUNQ_WAKEUP = vocab.RUNQ_WAKEUP.name
RUNQ_PREEMPTED = vocab.RUNQ_PREEMPTED.name
ONCPU = vocab.ONCPU.name
BLOCKED_PREFIX = vocab.BLOCKED_PREFIX
LATENCY_KINDS = tuple(k.name for k in vocab.WAIT_KINDS if not k.name.startswith(BLOCKED_PREFIX))

_INVOLUNTARY = frozenset({schema.PREEMPTED, schema.RUNNABLE})
_GONE = schema.REAPED

latency_kind = vocab.wait_kind  # which latency distribution a transition's dur_ns belongs to


def state_order(name: str) -> tuple:
    """Vocabulary order first, then unknown kernel states by name."""
    keys = list(schema.STATES)
    return (keys.index(name), "") if name in schema.STATES else (len(keys), name)


def kind_order(kind: str) -> tuple:
    if kind in LATENCY_KINDS:
        return (LATENCY_KINDS.index(kind), ())
    return (len(LATENCY_KINDS), state_order(kind[len(BLOCKED_PREFIX):]))


# --- results --------------------------------------------------------------


@dataclass
class Group:
    """Everything known about one group (a pid, a tid or a comm)."""

    key: object
    by: str
    comm: str = ""
    pids: set = field(default_factory=set)
    tids: set = field(default_factory=set)
    state_ns: dict = field(default_factory=dict)  # state -> ns (incl. the tail)
    unobserved_ns: int = 0
    null_dur: int = 0
    transitions: dict = field(default_factory=dict)  # (from, to) -> [count, sum_ns, n_known]
    voluntary: int = 0
    involuntary: int = 0
    impossible: int = 0  # running -> running: a switch-in with no switch-out before it
    cpu_limit_ns: int | None = None  # on-CPU above this (its threads, the CPUs, the window): flagged
    lifecycle: dict = field(default_factory=dict)  # fork/exec/exit -> count
    latency: dict = field(default_factory=dict)  # kind -> LogHist
    steal_irq_ns: int = 0  # of the time running, what the kernel counted as steal and interrupt time

    @property
    def observed_ns(self) -> int:
        return sum(self.state_ns.values())

    @property
    def n_transitions(self) -> int:
        return sum(v[0] for v in self.transitions.values())

    def time_in(self, states) -> int:
        return sum(self.state_ns.get(s, 0) for s in states)

    @property
    def oncpu_exceeds(self) -> bool:
        return self.cpu_limit_ns is not None and self.state_ns.get(schema.RUNNING, 0) > self.cpu_limit_ns

    def category_ns(self, category: str) -> int:
        return sum(ns for s, ns in self.state_ns.items() if schema.state_category(s) == category)


@dataclass
class Summary:
    by: str
    start_ts: int | None
    end_ts: int | None
    groups: list  # of Group
    stats: ReadStats
    events: int = 0  # state + lifecycle records digested
    tasks: int = 0
    checked_tasks: int = 0  # tasks seen through the whole window
    max_abs_deviation_ns: int = 0
    max_deviation_task: tuple | None = None  # (tid, comm) of the task behind it
    total_abs_deviation_ns: int = 0
    impossible: int = 0  # running -> running switch-ins
    transition_filters: list = field(default_factory=list)  # --state, --cpu, --min-dur in force
    task_filters: list = field(default_factory=list)  # --pid, --tid, --comm in force
    read_filters: list = field(default_factory=list)  # those of them applied by this read (not recorded)
    cut: bool = False  # the input said which window it covers (window_begin_ts/_end_ts)
    null_dur: int = 0
    unobserved_ns: int = 0
    interval: dict | None = None  # {"seq", "start_ts", "end_ts"} in --interval mode
    interrupted: bool = False

    @property
    def window_ns(self) -> int:
        if self.start_ts is None or self.end_ts is None:
            return 0
        return max(0, self.end_ts - self.start_ts)

    @property
    def ledger(self) -> bool:
        """Whether time in state can be told: no filter dropped transitions
        of the tasks kept (counts and latencies of the kept ones stay exact)."""
        return not self.transition_filters

    @property
    def lost(self) -> int:
        return self.stats.lost

    @property
    def complete(self) -> bool:
        return not (self.stats.lost or self.stats.n_skipped or self.stats.truncated_tail or self.stats.nul_starts
                    or self.interrupted)

    @property
    def lost_pct(self) -> float:
        total = self.events + self.stats.lost
        return 100.0 * self.stats.lost / total if total else 0.0


# --- aggregation ------------------------------------------------------------

# Transitions are counted per group in "cells" keyed by one int:
#   group << 16 | from-id << 8 | to-id
# (group: the pid or tid, or an id for a comm; state ids index a table of the
# state names seen: at most 255, more is garbage and lands in "state_?").
# A cell is [count, count with null dur_ns, sum of dur_ns, max dur_ns,
# {latency bucket: count}, min dur_ns, sum of steal_irq_ns].
C_N, C_NULL, C_SUM, C_MAX, C_HIST, C_MIN, C_STEAL = range(7)
_NO_MIN = 1 << 64  # above any dur_ns
_MAX_STATES = 255
_OVERFLOW_STATE = "state_?"

# A task is a list, for speed: the pid, comm, ts and state of its last
# record, when its first record was, whether that record's dur_ns was null,
# the group of that record, the interval it was first seen in, the dur_ns it
# has summed (less what was clipped at the interval start), and the cgroup
# its last record carried (None: none).
(T_PID, T_COMM, T_LAST_TS, T_LAST_TO, T_FIRST_TS, T_HEAD_NULL, T_FIRST_G, T_SEEN_AT,
 T_KNOWN, T_CGROUP) = range(10)


class Aggregator:
    """Digests validated records; see the module docstring.

    Transitions count under the group (pid, tid or comm) of their own
    record; the time after a task's last record, under the group of that
    record. By cgroup, unit and container a record's group is that of the
    cgroup it carries, when it carries one (services.Directory.key), so a
    thread moved to another cgroup counts each interval under the cgroup
    of the record that ends it: where the task was at that transition. clip_ts: in --interval mode, the start of the current interval.
    The part of a transition's dur_ns before it was counted already (as the
    task's tail) in the previous interval, so only the rest is added to the
    time in state; latency histograms still get the whole dur_ns.
    """

    def __init__(self, by: str = "pid"):
        self.spec = by  # as given: 'title:REGEX' too
        by, role = services.parse_by(by)
        if by not in BY_KEYS:
            raise ValueError(by)
        self.by = by
        self.cells: dict = {}
        self.tasks: dict = {}  # tid -> task list
        self.state_ids: dict = {}  # state name -> id
        self.state_names: list = []  # id -> state name
        self.comm_ids: dict = {}  # by comm: comm -> group id
        self.comm_names: list = [ALL] if by == ALL else []  # by all: every comm is group 0
        self.cuts: dict = {}  # (group, state) -> ns clipped off at clip_ts
        self.life: dict = {}  # (group, type) -> count
        self.life_last_ts = 0
        self.events = 0
        self.clip_ts: int | None = None
        self.window_end: int | None = None  # a cut stream's window_end_ts
        self.window_cut = False  # a meta record said which window the stream covers
        self.flushers: list = []  # callables that add_buckets what native digesters hold back
        self.named = by in NAMED_BY
        # --by cgroup, unit, container, title, ppid: the stream's process and
        # cgroup records, and pid -> group id as they said at this point
        self.services = services.GroupKeys(by, role, self.comm_id) if by in services.BY_KEYS else None

    def sync(self) -> None:
        """Bring in what native digesters hold back (latency bucket counts,
        through add_buckets): call before reading or replacing the cells."""
        for flush in self.flushers:
            flush()

    def __getstate__(self):
        self.sync()
        state = dict(self.__dict__)
        state["flushers"] = []
        return state

    def state_id(self, name: str) -> int:
        sid = self.state_ids.get(name)
        if sid is None:
            if len(self.state_names) >= _MAX_STATES - 1 and name != _OVERFLOW_STATE:
                return self.state_id(_OVERFLOW_STATE)  # the last id is kept for it
            sid = self.state_ids[name] = len(self.state_names)
            self.state_names.append(name)
        return sid

    @property
    def digest_by(self) -> str:
        """The grouping the native Digester is told (by all: comm, whose
        comm_id is always 0; by cgroup, unit, container, title, ppid:
        pid_group, the group of the record's pid and cgroup)."""
        if self.services is not None:
            return "pid_group"
        return "comm" if self.by == ALL else self.by

    @property
    def digest_group(self):
        """The group callable the native Digester is given with digest_by:
        comm_id, or pid_group (the group of a record's pid and cgroup, as
        the stream said so far)."""
        return self.services.group if self.services is not None else self.comm_id

    def comm_id(self, comm) -> int:
        if self.by == ALL:
            return 0
        cid = self.comm_ids.get(comm)
        if cid is None:
            cid = self.comm_ids[comm] = len(self.comm_names)
            self.comm_names.append(comm)
        return cid

    def group_of(self, pid: int, tid: int, comm, cgroup=None) -> int:
        by = self.by
        if self.services is not None:
            return self.services.group(pid, cgroup)
        return pid if by == "pid" else (tid if by == "tid" else self.comm_id(comm))

    def group_name(self, g: int):
        return self.comm_names[g] if self.named else g

    def begin_window(self, meta: dict) -> None:
        """A meta record: when it says the stream is cut (window_begin_ts),
        durations reaching back before the window are clipped to it, as at
        an interval start; before the first transition only."""
        begin, end = stream_window([meta])
        self.window_cut = self.window_cut or begin is not None or end is not None
        if begin is not None and self.clip_ts is None and not self.tasks:
            self.clip_ts = begin
        if end is not None:
            self.window_end = end if self.window_end is None else max(self.window_end, end)

    def add_record(self, rec: dict) -> None:
        """One checked record: state and lifecycle records count, others not."""
        t = rec["type"]
        if t == "state":
            self.add_rows([state_row(rec)])
        elif t in LIFECYCLE:
            self.add_lifecycle(rec)
        elif self.services is not None and t in ("process", "cgroup"):
            self.services.note(rec)

    def add_state(self, rec: dict) -> None:
        self.add_rows([state_row(rec)])

    def add_rows(self, rows) -> None:
        """State rows (reader.ROW_FIELDS; the weight is not used), in order:
        the one place a transition is counted in Python."""
        tasks = self.tasks
        tasks_get = tasks.get
        cells = self.cells
        cells_get = cells.get
        sid_get = self.state_ids.get
        state_id = self.state_id
        comm_get = self.comm_ids.get
        by_pid = self.by == "pid"
        by_tid = self.by == "tid"
        by_comm = self.by in ("comm", ALL)  # (by all: comm_id is always 0)
        keys = self.services  # (None by pid, tid, comm and all)
        pg_get = keys.pids.get if keys is not None else None
        by_cgroup = keys is not None and keys.by_cgroup
        cg_get = keys.cgroups.get if keys is not None else None
        clip = self.clip_ts
        shift = SUB_BITS + 1
        n = 0
        for ts, pid, tid, comm, frm, to, d, _cpu, _w, cg, steal in rows:
            n += 1
            fi = sid_get(frm)
            if fi is None:
                fi = state_id(frm)
            ti = sid_get(to)
            if ti is None:
                ti = state_id(to)
            if by_pid:
                g = pid
            elif by_tid:
                g = tid
            elif by_comm:
                g = comm_get(comm)
                if g is None:
                    g = self.comm_id(comm)
            elif cg is not None and by_cgroup:
                g = cg_get(cg)
                if g is None:
                    g = keys.group(pid, cg)
            else:
                g = pg_get(pid)
                if g is None:
                    g = keys.group(pid)
            task = tasks_get(tid)
            if task is None:
                task = tasks[tid] = [pid, comm, ts, to, ts, d is None, g, clip, d or 0, cg]
            else:
                task[T_PID] = pid
                task[T_COMM] = comm
                task[T_LAST_TS] = ts
                task[T_LAST_TO] = to
                task[T_CGROUP] = cg
                if d:
                    task[T_KNOWN] += d
            key = (g << 16) | (fi << 8) | ti
            c = cells_get(key)
            if c is None:
                c = cells[key] = [0, 0, 0, 0, {}, _NO_MIN, 0]
            c[C_N] += 1
            if d is None:
                c[C_NULL] += 1
                continue
            if steal:  # of d, what the kernel counted as steal and interrupt time
                c[C_STEAL] += steal
            c[C_SUM] += d
            if d > c[C_MAX]:
                c[C_MAX] = d
            if d < c[C_MIN]:
                c[C_MIN] = d
            # latency.bucket_index, inlined
            s = d.bit_length() - shift
            idx = ((s << SUB_BITS) + (d >> s)) if s > 0 else d
            hist = c[C_HIST]
            hist[idx] = hist.get(idx, 0) + 1
            if clip is not None and d > ts - clip:
                cut = self._clip(g, frm, d, ts)
                task[T_KNOWN] -= cut
                if steal and d:  # the clipped part's share of it
                    c[C_STEAL] -= steal * cut // d
                if task[T_FIRST_TS] == ts and task[T_SEEN_AT] == clip:
                    # its first record reaches back before the window: there
                    # from the window's start, nothing of it unobserved
                    task[T_FIRST_TS] = clip
                    task[T_HEAD_NULL] = True
        self.events += n

    def add_digested(self, events: int, tasks: list, cells: list, buckets: list) -> None:
        """What a native Digester summed up over `events` plain state records
        (its take()): per task (tid, pid, comm, last_ts, to, first_ts,
        head_null, first_group, known, the last record's cgroup) and per cell (key, n, n_null, sum,
        max, min), each in the order first seen, and latency bucket counts
        per cell (key, {bucket: count}) of cells known by now. The same as
        add_rows of those records; the bucket counts may come later."""
        own = self.tasks
        own_get = own.get
        clip = self.clip_ts
        for tid, pid, comm, last_ts, to, first_ts, head_null, g_first, known, cg in tasks:
            task = own_get(tid)
            if task is None:
                own[tid] = [pid, comm, last_ts, to, first_ts, head_null, g_first, clip, known, cg]
            else:
                task[T_PID] = pid
                task[T_COMM] = comm
                task[T_LAST_TS] = last_ts
                task[T_LAST_TO] = to
                task[T_CGROUP] = cg
                task[T_KNOWN] += known
        own_cells = self.cells
        cells_get = own_cells.get
        for key, n, nulls, total, vmax, vmin, steal in cells:
            c = cells_get(key)
            if c is None:
                own_cells[key] = [n, nulls, total, vmax, {}, vmin if n > nulls else _NO_MIN, steal]
                continue
            c[C_N] += n
            c[C_STEAL] += steal
            if nulls:
                c[C_NULL] += nulls
            if n > nulls:
                c[C_SUM] += total
                if vmax > c[C_MAX]:
                    c[C_MAX] = vmax
                if vmin < c[C_MIN]:
                    c[C_MIN] = vmin
        for key, counts in buckets:
            c = own_cells[key]
            hist = c[C_HIST]
            if not hist:
                c[C_HIST] = counts
                continue
            for idx, k in counts.items():
                hist[idx] = hist.get(idx, 0) + k
        self.events += events

    def _clip(self, g: int, frm: str, d: int, ts: int) -> int:
        """The part of d before the interval start: counted already."""
        cut = d - max(0, ts - self.clip_ts)
        k = (g, frm)
        self.cuts[k] = self.cuts.get(k, 0) + cut
        return cut

    def add_lifecycle(self, rec: dict) -> None:
        self.events += 1
        t = rec["type"]
        k = (self.group_of(rec["pid"], rec["tid"], rec.get("comm")), t)
        self.life[k] = self.life.get(k, 0) + 1
        if rec["ts"] > self.life_last_ts:
            self.life_last_ts = rec["ts"]
        if t == "exec":
            task = self.tasks.get(rec["tid"])
            if task is not None:
                task[T_COMM] = rec.get("comm")

    # --- interval bookkeeping -------------------------------------------

    def start_interval(self, ts: int) -> None:
        """Forget the aggregates, keep what each live task is doing."""
        self.sync()
        self.cells = {}
        self.cuts = {}
        self.life = {}
        self.events = 0
        self.clip_ts = ts
        gone = [tid for tid, t in self.tasks.items() if t[T_LAST_TO] == _GONE]
        for tid in gone:
            del self.tasks[tid]
        for t in self.tasks.values():
            t[T_KNOWN] = 0

    def reaches(self, ts: int) -> None:
        """The input went on to ts in records a filter applied after reading
        left out (stats -p with a why view): the window reaches it, as it
        does for the whole input."""
        if ts > self.life_last_ts:
            self.life_last_ts = ts

    def last_ts(self) -> int | None:
        self.sync()
        ts = max((t[T_LAST_TS] for t in self.tasks.values()), default=None)
        if self.life_last_ts and (ts is None or self.life_last_ts > ts):
            ts = self.life_last_ts
        return ts

    def first_ts(self) -> int | None:
        self.sync()
        return min((t[T_FIRST_TS] for t in self.tasks.values()), default=None)

    def absorb(self, later: "Aggregator") -> None:
        """Add what another Aggregator digested from the input that follows
        this one's (a later part of the same file): the result is what one
        Aggregator would have made of both parts in order."""
        self.sync()
        later.sync()
        ids = [self.state_id(name) for name in later.state_names]
        gmap = ([self.comm_id(c) for c in later.comm_names] if self.named else None)

        def regroup(g):
            return gmap[g] if gmap is not None else g

        for key, lc in later.cells.items():
            key = (regroup(key >> 16) << 16) | (ids[(key >> 8) & 255] << 8) | ids[key & 255]
            c = self.cells.get(key)
            if c is None:
                self.cells[key] = lc
                continue
            c[C_N] += lc[C_N]
            c[C_NULL] += lc[C_NULL]
            c[C_SUM] += lc[C_SUM]
            c[C_STEAL] += lc[C_STEAL]
            if lc[C_MAX] > c[C_MAX]:
                c[C_MAX] = lc[C_MAX]
            if lc[C_MIN] < c[C_MIN]:
                c[C_MIN] = lc[C_MIN]
            hist = c[C_HIST]
            for idx, n in lc[C_HIST].items():
                hist[idx] = hist.get(idx, 0) + n
        for tid, lt in later.tasks.items():
            task = self.tasks.get(tid)
            if task is None:
                lt[T_FIRST_G] = regroup(lt[T_FIRST_G])
                self.tasks[tid] = lt
                continue
            task[T_PID], task[T_COMM] = lt[T_PID], lt[T_COMM]
            task[T_LAST_TS], task[T_LAST_TO] = lt[T_LAST_TS], lt[T_LAST_TO]
            task[T_CGROUP] = lt[T_CGROUP]
            task[T_KNOWN] += lt[T_KNOWN]
        for (g, typ), n in later.life.items():
            k = (regroup(g), typ)
            self.life[k] = self.life.get(k, 0) + n
        for (g, frm), n in later.cuts.items():
            k = (regroup(g), frm)
            self.cuts[k] = self.cuts.get(k, 0) + n
        self.life_last_ts = max(self.life_last_ts, later.life_last_ts)
        self.events += later.events
        if self.services is not None:  # what the stream said of each pid by the later part's end
            self.services.directory = later.services.directory
            self.services.forget()

    # --- roll-up ----------------------------------------------------------

    def summarise(self, stats: ReadStats, start_ts: int | None = None, end_ts: int | None = None) -> Summary:
        """Roll the cells and tasks up into groups. start_ts/end_ts default
        to the window the input describes: its meta and end records, else
        the first and last event; in --interval mode, the interval's start."""
        self.sync()
        if start_ts is None:
            start_ts = self.clip_ts
        if start_ts is None:
            metas = [m.get("ts") for m in stats.metas if type(m.get("ts")) is int]
            start_ts = min(metas) if metas else self.first_ts()
            # record writes its meta once the programs are attached and the
            # tasks seeded: the first events can be a little older
            first = self.first_ts()
            if first is not None and start_ts is not None and first < start_ts:
                start_ts = first
        if end_ts is None:
            last = self.last_ts()
            ends = [e.get("ts") for e in stats.ends if type(e.get("ts")) is int]
            end_ts = max(ends + ([last] if last is not None else []), default=None)
        if end_ts is not None and self.window_end is not None and end_ts > self.window_end:
            end_ts = self.window_end
        by = self.by
        groups: dict = {}

        def group(g) -> Group:
            grp = groups.get(g)
            if grp is None:
                grp = groups[g] = Group(key=g, by=by)
            return grp

        names = self.state_names
        for key, (n, nulls, total, vmax, hist, vmin, steal) in self.cells.items():
            grp = group(key >> 16)
            if steal:
                grp.steal_irq_ns += steal
            frm = names[(key >> 8) & 255]
            to = names[key & 255]
            grp.transitions[(frm, to)] = [n, total, n - nulls]
            grp.null_dur += nulls
            if frm == schema.RUNNING:
                if to == schema.RUNNING:
                    grp.impossible += n
                elif to in _INVOLUNTARY:
                    grp.involuntary += n
                else:
                    grp.voluntary += n
            if n == nulls:
                continue
            grp.state_ns[frm] = grp.state_ns.get(frm, 0) + total
            kind = latency_kind(frm, to)
            if kind is not None:
                h = grp.latency.get(kind)
                if h is None:
                    h = grp.latency[kind] = LogHist()
                h.add_counts(hist, n - nulls, total, vmin, vmax)
        for (g, frm), cut in self.cuts.items():
            grp = group(g)
            grp.state_ns[frm] = grp.state_ns.get(frm, 0) - cut
        for (g, typ), n in self.life.items():
            grp = group(g)
            grp.lifecycle[typ] = grp.lifecycle.get(typ, 0) + n

        clip = self.clip_ts
        checked = max_dev = total_dev = unobserved = 0
        dev_task = None
        for tid, t in self.tasks.items():
            pid = t[T_PID]
            grp = group(self.group_of(pid, tid, t[T_COMM], t[T_CGROUP]))
            grp.tids.add(tid)
            grp.pids.add(pid)
            if not grp.comm or (by == "pid" and tid == pid):
                grp.comm = t[T_COMM] or ""
            new_here = clip is None or t[T_SEEN_AT] == clip
            head = 0
            if t[T_HEAD_NULL] and new_here and start_ts is not None:
                head = max(0, t[T_FIRST_TS] - start_ts)
                group(t[T_FIRST_G]).unobserved_ns += head
                unobserved += head
            tail = 0
            last_to = t[T_LAST_TO]
            gone = last_to == _GONE
            if not gone and end_ts is not None:
                since = t[T_LAST_TS] if clip is None else max(t[T_LAST_TS], clip)
                tail = max(0, end_ts - since)
                if tail:
                    grp.state_ns[last_to] = grp.state_ns.get(last_to, 0) + tail
            # A task was there for the whole window when its first transition
            # left a state whose start was not seen (it predates the window),
            # or, per interval, when it was known before the interval began.
            whole = (t[T_HEAD_NULL] if new_here else True) and not gone
            if whole and start_ts is not None and end_ts is not None:
                dev = abs((end_ts - start_ts) - (head + t[T_KNOWN] + tail))
                checked += 1
                total_dev += dev
                if dev > max_dev:
                    max_dev = dev
                    dev_task = (tid, t[T_COMM] or "")
        ncpu = _cpus(stats.metas)
        window = (end_ts - start_ts) if start_ts is not None and end_ts is not None else None
        for grp in groups.values():
            if window is not None and window > 0:
                grp.cpu_limit_ns = window * max(1, min(len(grp.tids), ncpu) if ncpu else len(grp.tids))
            grp.key = self.group_name(grp.key)
            if by in ("comm", ALL):
                grp.comm = grp.key or ""
        ordered = sorted(groups.values(), key=lambda x: _sort_key(x.key))
        return Summary(
            by=by, start_ts=start_ts, end_ts=end_ts, groups=ordered, stats=stats,
            events=self.events, tasks=len(self.tasks), checked_tasks=checked,
            max_abs_deviation_ns=max_dev, max_deviation_task=dev_task, total_abs_deviation_ns=total_dev,
            null_dur=sum(x.null_dur for x in ordered), unobserved_ns=unobserved,
            impossible=sum(x.impossible for x in ordered),
            transition_filters=filters_in_force(stats.metas, TRANSITION_FILTERS),
            task_filters=filters_in_force(stats.metas, TASK_FILTERS),
            read_filters=filters_in_force(stats.metas, prefixes=("read_",)),
            cut=self.window_cut,
        )


def _cpus(metas) -> int:
    """The CPUs a recording's tasks could use: its --cpu values, else ncpu (0: not known)."""
    for m in metas:
        cpus = m.get("filter_cpu") or m.get("replay_filter_cpu")
        if isinstance(cpus, list) and cpus:
            return len(cpus)
    n = [m.get("ncpu") for m in metas if type(m.get("ncpu")) is int and m.get("ncpu") > 0]
    return max(n) if n else 0


def _sort_key(k):
    return (0, k, "") if isinstance(k, int) else (1, 0, str(k))

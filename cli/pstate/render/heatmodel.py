"""Heat map models: pstate events and snapshots bucketed into grids.

Three maps, all pure computation:

- state map: rows = tasks, columns = time buckets, each cell the time spent
  in each state in that bucket (drawn as the dominant state, or shaded by
  the share of one state);
- latency map: columns = time buckets, rows = log2 buckets of one kind of
  duration (run-queue wait, time blocked, on-CPU slice), cell = count;
- snapshot map: rows = processes, columns = snapshots, cell = time in the
  chosen states per interval (heatviews.py, with what renderers draw).

Time in a state is known from the transition that leaves it: a record with
from=S, dur_ns=d at ts says the task was in S during [ts - d, ts]. The state
a task entered last is "open" until its next transition; it is drawn up to
the end of the data (or "now" in the live view), so a task stuck in D shows
from the moment it entered D.

Columns are absolute bucket numbers counted from an origin: column c covers
[origin + c*bucket, origin + (c+1)*bucket).
"""

from __future__ import annotations

from array import array
from collections import deque

from pstate.analysis import services
from pstate.stream import schema, vocab
from pstate.stream.filters import Filter
from pstate.stream.streamio import MAX_INT

# --- state vocabulary as indices --------------------------------------------

STATE_NAMES: tuple[str, ...] = tuple(schema.STATES) + ("other",)
STATE_INDEX: dict[str, int] = {name: i for i, name in enumerate(STATE_NAMES)}
OTHER = STATE_INDEX["other"]  # any state_<letter> a newer kernel reports
NSTATES = len(STATE_NAMES)
BUSY = NSTATES  # extra slot in every cell: the sum of the "busy" states

# Background states: a task in them is not doing or waiting for anything
# interesting, so they do not count as activity when ranking rows.
BACKGROUND = frozenset({"sleeping", "idle", "parked", schema.UNKNOWN, schema.REAPED})
IS_BUSY: tuple[bool, ...] = tuple(name not in BACKGROUND for name in STATE_NAMES)
REAPED_IDX = STATE_INDEX[schema.REAPED]
RUNNING_IDX = STATE_INDEX[schema.RUNNING]
# A switch-in of a task already running (running -> running: its switch-out
# was never traced, as the kernel shows some VM agents' threads): what the
# task did since the switch-in before is not known, not on a CPU.
UNKNOWN_IDX = STATE_INDEX[schema.UNKNOWN]


def _valid_int(v) -> bool:
    return type(v) is int and 0 <= v < MAX_INT


def state_index(name) -> int:
    i = STATE_INDEX.get(name)
    return OTHER if i is None else i


# --- latency measures: which transitions give which durations ---------------

# measure -> (title, states whose time (dur_ns of leaving them) is counted)
_RUNQ, _PREEMPT = vocab.RUNQ_WAKEUP.frm, vocab.RUNQ_PREEMPTED.frm  # (stream.vocab's kinds of wait)
_S, _D = vocab.SLEEPING.frm, vocab.UNINTERRUPTIBLE.frm
MEASURES: dict[str, tuple[str, frozenset]] = {
    "runq": ("run-queue wait (runnable -> running)", frozenset(_RUNQ)),
    "preempt": ("wait after preemption (preempted -> running)", frozenset(_PREEMPT)),
    "wait": ("time runnable, woken or preempted", frozenset(_RUNQ + _PREEMPT)),
    "blocked": ("time blocked (S or D)", frozenset(_S + _D)),
    "S": ("interruptible sleep (S)", frozenset(_S)),
    "D": ("uninterruptible sleep (D)", frozenset(_D)),
    "oncpu": ("on-CPU slices (running)", frozenset(vocab.ONCPU.frm)),
}
NLOG2 = 65  # dur.bit_length() for a 64-bit duration: 0..64


# A latency map's rows: stream.vocab's log2 floor convention, bucket b
# holds durations in [2**(b-1), 2**b), bucket 0 holds 0.
log2_bucket = vocab.log2_floor
log2_lower = vocab.log2_floor_lower


# --- bucket and window arithmetic --------------------------------------------


def nice_bucket(span_ns: int, ncols: int) -> int:
    """The smallest bucket with at most two significant digits (170ms, 2.5s)
    that fits span_ns into ncols columns."""
    raw = max(1, -(-max(span_ns, 1) // max(ncols, 1)))
    if raw < 100:
        return raw
    mag = 10 ** (len(str(raw)) - 2)
    return -(-raw // mag) * mag


class Grid:
    """Column-major sparse grid: col -> key -> list of ns per state (+ BUSY)."""

    __slots__ = ("origin", "bucket", "cols")

    def __init__(self, origin: int, bucket: int):
        self.origin = origin
        self.bucket = bucket
        self.cols: dict[int, dict] = {}

    def paint(self, key, s: int, start: int, end: int, lo: int | None = None) -> None:
        """Add [start, end) in state s to row key; columns below lo are dropped."""
        if end <= start:
            return
        b = self.bucket
        o = self.origin
        c = (start - o) // b
        if lo is not None and c < lo:
            c = lo
            start = o + lo * b
            if end <= start:
                return
        last = (end - 1 - o) // b
        busy = IS_BUSY[s]
        cols = self.cols
        while True:
            cs = o + c * b
            ce = cs + b
            ov = (end if end < ce else ce) - (start if start > cs else cs)
            col = cols.get(c)
            if col is None:
                col = cols[c] = {}
            cell = col.get(key)
            if cell is None:
                cell = col[key] = [0] * (NSTATES + 1)
            cell[s] += ov
            if busy:
                cell[BUSY] += ov
            if c >= last:
                return
            c += 1

    def cell(self, c: int, key):
        col = self.cols.get(c)
        return None if col is None else col.get(key)

    def drop_before(self, lo: int) -> None:
        cols = self.cols
        for c in [c for c in cols if c < lo]:
            del cols[c]


# --- the stream tracker: events -> intervals ---------------------------------


def key_of(by: str, directory: services.Directory | None = None):
    """The row key of a task's record: its tid, pid or comm, or (--by title
    and the like) what the stream's process records said of its pid (by
    cgroup, unit and container, the cgroup the record carries when it
    carries one: services.Directory.key)."""
    if by == "tid":
        return lambda pid, tid, comm, cgroup=None: tid
    if by == "pid":
        return lambda pid, tid, comm, cgroup=None: pid or tid
    if directory is not None:
        return lambda pid, tid, comm, cgroup=None: directory.key(by, pid, cgroup)
    return lambda pid, tid, comm, cgroup=None: comm


class Tracker:
    """Turns state records into (key, state, start, end) intervals.

    Subclasses decide what an interval or a latency sample does (emit,
    sample). Keeps per-key labels, event counts and per-state totals (for
    ranking rows), the open state of every thread, and the time range seen.

    sample_every > 1 means the caller feeds only some of the records (live
    decimation): the gap between two kept records of a thread is then
    credited to the state the thread was last seen entering, and latency
    samples carry the weight the caller passes.
    """

    def __init__(self, by: str = "tid", filt: Filter | None = None, measure: str | None = None):
        by, role = services.parse_by(by)  # --by 'title:REGEX': the role is REGEX's group
        self.by = by
        self.directory = services.Directory(role) if by in services.BY_KEYS else None
        self.keyf = key_of(by, self.directory)
        self.filt = filt if (filt is not None and filt.active) else None
        self.skip_idle = filt is None or not filt.include_idle
        self.measure = measure
        self.measure_states = frozenset(state_index(s) for s in MEASURES[measure][1]) if measure else frozenset()
        self.comm: dict = {}  # key -> comm for its label
        self.events: dict = {}  # key -> state records seen
        self.totals: dict = {}  # key -> [ns per state] + [busy]
        self.open: dict = {}  # tid -> (state idx, since ts, key)
        self.first_ts: int | None = None
        self.last_ts: int | None = None
        self.start_ts: int | None = None  # stream start from meta records
        self.end_ts: int | None = None  # from end trailers
        self.n_events = 0  # state/lifecycle records that passed the filter
        self.n_samples = 0  # latency samples (weighted)
        self.sample_every = 1
        self.input_sample_every = 1  # record --max-rate, from rate records
        self.hosts: list = []
        self.wall_ns: int | None = None  # wall clock at start_ts

    # hooks -----------------------------------------------------------------
    def emit(self, key, s: int, start: int, end: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def sample(self, ts: int, b: int, weight: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # feeding ---------------------------------------------------------------
    def feed(self, rec: dict, weight: int = 1) -> None:
        """One validated record (see streamio.check_record)."""
        t = rec["type"]
        if t == "state":
            if self.filt is not None:
                if not self.filt.match(rec):
                    return
            elif self.skip_idle and rec["tid"] == 0:
                return
            self.state(rec["ts"], rec["pid"], rec["tid"], rec.get("comm") or "?",
                       rec["from"], rec["to"], rec.get("dur_ns"), weight, rec.get("cgroup"))
        elif t in ("exec", "fork", "exit"):
            if self.filt is not None and not self.filt.match(rec):
                return
            if self.skip_idle and rec["tid"] == 0:
                return
            self.n_events += 1
            ts = rec["ts"]
            self._saw_ts(ts)
            if t == "exec":
                comm = rec.get("comm") or "?"
                key = self.keyf(rec["pid"], rec["tid"], comm)
                if self.by in ("tid", "pid"):
                    self.comm[key] = comm
        elif t == "meta":
            # Only event times are checked by the reader; these go into int64
            # arrays too, so they follow the same policy (0 <= v < 2**63).
            ts = rec.get("ts")
            if _valid_int(ts) and (self.start_ts is None or ts < self.start_ts):
                self.start_ts = ts
                w = rec.get("wall_ns")
                self.wall_ns = w if _valid_int(w) else None
            h = rec.get("host")
            if isinstance(h, str) and h not in self.hosts:
                self.hosts.append(h)
        elif t == "end":
            ts = rec.get("ts")
            if _valid_int(ts) and (self.end_ts is None or ts > self.end_ts):
                self.end_ts = ts
        elif t in ("process", "cgroup"):
            if self.directory is not None:
                self.directory.note(rec)
        elif t == "rate":
            n = rec.get("sample_every")
            if type(n) is int and n >= 1:
                self.input_sample_every = n

    # a sink of reader.StreamReader: state rows in batches, other records one by one
    def rows(self, rows: list) -> None:
        """State rows (reader.ROW_FIELDS), as feed() takes state records."""
        filt, skip_idle, state = self.filt, self.skip_idle, self.state
        for ts, pid, tid, comm, frm, to, dur, cpu, weight, cg, _steal in rows:
            if filt is not None:
                if not filt.match_state(pid, tid, comm, cpu, frm, to, dur, cg):
                    continue
            elif skip_idle and tid == 0:
                continue
            state(ts, pid, tid, comm or "?", frm, to, dur, weight, cg)

    def record(self, rec: dict, weight: int) -> None:
        self.feed(rec, weight)

    def _saw_ts(self, ts: int) -> None:
        if self.first_ts is None or ts < self.first_ts:
            self.first_ts = ts
        if self.last_ts is None or ts > self.last_ts:
            self.last_ts = ts

    def state(self, ts, pid, tid, comm, frm, to, dur, weight=1, cgroup=None) -> None:
        self.n_events += 1
        if self.last_ts is None or ts > self.last_ts:
            self.last_ts = ts
        if self.first_ts is None or ts < self.first_ts:
            self.first_ts = ts
        key = self.keyf(pid, tid, comm, cgroup)
        if self.by != "pid" or tid == pid or key not in self.comm:
            self.comm[key] = comm
        self.events[key] = self.events.get(key, 0) + 1
        start = None if dur is None else ts - dur
        if self.measure_states:
            if start is not None and STATE_INDEX.get(frm, OTHER) in self.measure_states:
                self.n_samples += weight
                self.sample(ts, log2_bucket(dur), weight)
            return
        s = STATE_INDEX.get(frm, OTHER)
        if s == RUNNING_IDX and to == frm:
            s = UNKNOWN_IDX
        prev = self.open.get(tid)
        if prev is not None and self.sample_every > 1:
            # Records in between were not looked at: credit the gap to the
            # state this thread entered last.
            gap_end = ts if start is None else start
            if gap_end > prev[1]:
                self._interval(prev[2], prev[0], prev[1], gap_end)
        if start is not None:
            self._interval(key, s, start, ts)
        ns = STATE_INDEX.get(to, OTHER)
        if ns == REAPED_IDX:
            self.open.pop(tid, None)
        else:
            self.open[tid] = (ns, ts, key)

    def _interval(self, key, s, start, end) -> None:
        tot = self.totals.get(key)
        if tot is None:
            tot = self.totals[key] = [0] * (NSTATES + 1)
        d = end - start
        tot[s] += d
        if IS_BUSY[s]:
            tot[BUSY] += d
        self.emit(key, s, start, end)

    # ranking ---------------------------------------------------------------
    def label(self, key) -> str:
        if self.by not in ("tid", "pid"):
            return str(key)
        return f"{self.comm.get(key, '?')} {key}"

    def candidates(self, score) -> set:
        """The rows rank() chooses from: those with a score or an event."""
        return set(score) | set(self.events)

    def rank(self, score, top: int) -> list:
        """Keys by score (desc), then events (desc), then key; at most top."""
        order = sorted(self.candidates(score), key=lambda k: (-score.get(k, 0), -self.events.get(k, 0), str(k)))
        return order[:top]


# --- recorded (static) maps ---------------------------------------------------


class RecordedStates(Tracker):
    """Keeps every interval compactly (about 25 bytes each) until the time
    range is known, then buckets the rows that made the top N."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.key_ids: dict = {}
        self.keys: list = []
        self.iv_key = array("l")
        self.iv_state = array("B")
        self.iv_start = array("q")
        self.iv_end = array("q")
        self.lat_ts = array("q")
        self.lat_b = array("B")

    def emit(self, key, s, start, end):
        kid = self.key_ids.get(key)
        if kid is None:
            kid = self.key_ids[key] = len(self.keys)
            self.keys.append(key)
        self.iv_key.append(kid)
        self.iv_state.append(s)
        self.iv_start.append(start)
        self.iv_end.append(end)

    def sample(self, ts, b, weight):
        self.lat_ts.append(ts)
        self.lat_b.append(b)

    def close(self) -> None:
        """End of input: the open state of every thread lasts to the end."""
        end = self.range()[1]
        if end is None:
            return
        for tid, (s, since, key) in sorted(self.open.items(), key=lambda kv: kv[0]):
            if end > since:
                self._interval(key, s, since, end)
        self.open.clear()

    def range(self) -> tuple[int | None, int | None]:
        if self.first_ts is None:
            return None, None
        start = self.first_ts if self.start_ts is None else min(self.start_ts, self.first_ts)
        end = self.last_ts if self.end_ts is None else max(self.end_ts, self.last_ts)
        return start, end

    def state_grid(self, keys: list, origin: int, bucket: int, end: int) -> Grid:
        g = Grid(origin, bucket)
        want = {self.key_ids[k] for k in keys if k in self.key_ids}
        ks, st, a, b = self.iv_key, self.iv_state, self.iv_start, self.iv_end
        keyl = self.keys
        for i in range(len(ks)):
            kid = ks[i]
            if kid in want:
                s0 = a[i] if a[i] > origin else origin
                e0 = b[i] if b[i] < end else end
                if e0 > s0:
                    g.paint(keyl[kid], st[i], s0, e0)
        return g

    def latency_counts(self, origin: int, bucket: int) -> dict:
        """col -> [count per log2 bucket]."""
        cols: dict = {}
        for ts, b in zip(self.lat_ts, self.lat_b):
            c = (ts - origin) // bucket
            col = cols.get(c)
            if col is None:
                col = cols[c] = [0] * NLOG2
            col[b] += 1
        return cols


MAX_OPEN = 1 << 18  # threads whose current state the live view remembers


class Window(Tracker):
    """A sliding window of ncols buckets ending at the newest event (live view).

    Columns are ts // bucket (origin 0); intervals and samples older than the
    window are dropped as they arrive, old columns when the window moves.
    """

    def __init__(self, bucket: int, ncols: int, *a, **kw):
        super().__init__(*a, **kw)
        self.bucket = bucket
        self.ncols = ncols
        self.grid = Grid(0, bucket)
        self.lat: dict = {}  # col -> [weighted count per log2 bucket]
        self.lo = None  # first column of the window

    def _lo(self) -> int:
        return (self.last_ts or 0) // self.bucket - self.ncols + 1

    def state(self, ts, pid, tid, comm, frm, to, dur, weight=1, cgroup=None) -> None:
        # Tracker.state for the live window: state maps go through states();
        # latency maps (measure_states) only count samples.
        if not self.measure_states:
            self.states(((ts, pid, tid, comm, frm, to, dur, 0, weight, cgroup, None),))
            return
        self.n_events += 1
        lt = self.last_ts
        if lt is None or ts > lt:
            if lt is None:
                self.first_ts = ts
            self.last_ts = ts
        by = self.by
        if by == "tid":
            key = tid
            self.comm[key] = comm
        elif by == "pid":
            key = pid or tid
            if tid == pid or key not in self.comm:
                self.comm[key] = comm
        else:
            key = self.keyf(pid, tid, comm, cgroup)
        ev = self.events
        ev[key] = ev.get(key, 0) + 1
        if dur is not None and STATE_INDEX.get(frm, OTHER) in self.measure_states:
            self.n_samples += weight
            self.sample(ts, log2_bucket(dur), weight)

    def states(self, rows, skip_idle: bool = False) -> None:
        """state() for every (ts, pid, tid, comm, from, to, dur_ns, cpu,
        weight, cgroup) of rows, with comm None or "" as "?" and, with skip_idle,
        tid 0 left out. The one implementation of the state map's update:
        one call per batch, lookups hoisted, the window start recomputed
        only when the newest ts moves."""
        if self.measure_states:
            state = self.state
            for ts, pid, tid, comm, frm, to, dur, _cpu, weight, cg, _steal in rows:
                if tid == 0 and skip_idle:
                    continue
                state(ts, pid, tid, comm or "?", frm, to, dur, weight, cg)
            return
        b = self.bucket
        ncols = self.ncols
        paint = self.grid.paint
        cols = self.grid.cols
        cols_get = cols.get
        names = self.comm
        events = self.events
        events_get = events.get
        opened = self.open
        open_get = opened.get
        index = STATE_INDEX.get
        is_busy = IS_BUSY
        width = NSTATES + 1
        by_tid = self.by == "tid"
        by_pid = self.by == "pid"
        by_comm = self.by == "comm"
        keyf = self.keyf
        gaps = self.sample_every > 1
        lt = self.last_ts
        lo = 0 if lt is None else lt // b - ncols + 1
        next_col = 0 if lt is None else (lt // b + 1) * b  # where the window moves on
        cc = None  # the column last added to, and its dict
        col = None
        n = 0
        for ts, pid, tid, comm, frm, to, dur, _cpu, _weight, cg, _steal in rows:
            if tid == 0 and skip_idle:
                continue
            n += 1
            if lt is None or ts > lt:
                if lt is None:
                    self.first_ts = ts
                lt = ts
                if ts >= next_col:
                    c = ts // b
                    lo = c - ncols + 1
                    next_col = (c + 1) * b
            if not comm:
                comm = "?"
            if by_tid:
                key = tid
                names[key] = comm
            elif by_pid:
                key = pid or tid
                if tid == pid or key not in names:
                    names[key] = comm
            elif by_comm:
                key = comm
            else:
                key = keyf(pid, tid, comm, cg)
            events[key] = events_get(key, 0) + 1
            s = index(frm, OTHER)
            if s == RUNNING_IDX and to == frm:
                s = UNKNOWN_IDX  # (Tracker.state)
            if gaps:
                prev = open_get(tid)
                if prev is not None:
                    gap_end = ts if dur is None else ts - dur
                    if gap_end > prev[1]:
                        paint(prev[2], prev[0], prev[1], gap_end, lo)
            if dur:
                start = ts - dur
                c = start // b
                if c >= lo and ts - c * b <= b:  # (ts - 1) // b == c: in one bucket
                    if c != cc:
                        col = cols_get(c)
                        if col is None:
                            col = cols[c] = {}
                        cc = c
                    cell = col.get(key)
                    if cell is None:
                        cell = col[key] = [0] * width
                    cell[s] += dur
                    if is_busy[s]:
                        cell[BUSY] += dur
                else:
                    paint(key, s, start, ts, lo)
            ns = index(to, OTHER)
            if ns == REAPED_IDX:
                opened.pop(tid, None)
            else:
                opened[tid] = (ns, ts, key)
        self.last_ts = lt
        self.n_events += n

    def _interval(self, key, s, start, end) -> None:
        # no per-key totals: ranking is over the window only
        self.grid.paint(key, s, start, end, self._lo())

    def sample(self, ts, b, weight):
        c = ts // self.bucket
        if c < self._lo():
            return
        col = self.lat.get(c)
        if col is None:
            col = self.lat[c] = [0] * NLOG2
        col[b] += weight

    def advance(self) -> int:
        """Forget columns that left the window; return its first column."""
        lo = self._lo()
        if self.lo != lo:
            self.grid.drop_before(lo)
            for c in [c for c in self.lat if c < lo]:
                del self.lat[c]
            self.lo = lo
        return lo

    def prune(self) -> None:
        """Forget tasks that are neither in the window nor open (bounded memory)."""
        self.advance()
        if len(self.open) > MAX_OPEN:
            # lost reap events leave threads open forever: drop the stalest
            stale = sorted(self.open.items(), key=lambda kv: kv[1][1])[:len(self.open) - MAX_OPEN]
            for tid, _ in stale:
                del self.open[tid]
        alive = set()
        for col in self.grid.cols.values():
            alive.update(col)
        for _s, _t, key in self.open.values():
            alive.add(key)
        for d in (self.comm, self.events):
            for k in [k for k in d if k not in alive]:
                del d[k]

    def scores(self, shade: int | None = None) -> dict:
        """Busy time (or time in state shade) per key over the window,
        counting the open states up to now."""
        slot = BUSY if shade is None else shade
        lo = self.advance()
        score: dict = {}
        for col in self.grid.cols.values():
            for key, cell in col.items():
                score[key] = score.get(key, 0) + cell[slot]
        now = self.last_ts or 0
        lo_ts = lo * self.bucket
        for s, since, key in self.open.values():
            if (IS_BUSY[s] if shade is None else s == shade) and now > since:
                score[key] = score.get(key, 0) + now - (since if since > lo_ts else lo_ts)
            elif key not in score:
                score[key] = 0
        return score

    def overlay(self, keys) -> Grid:
        """The open states of the given rows, painted up to now (not kept)."""
        want = set(keys)
        g = Grid(0, self.bucket)
        lo = self._lo()
        now = self.last_ts or 0
        for s, since, key in self.open.values():
            if key in want and now > since:
                g.paint(key, s, since, now, lo)
        return g

    def tasks_in_window(self) -> int:
        keys = set()
        for col in self.grid.cols.values():
            keys.update(col)
        for _s, _t, key in self.open.values():
            keys.add(key)
        return len(keys)


REASON_STATE = "uninterruptible"  # heat --live's reason column: the reasons of D intervals


class Reasons:
    """heat --live's reason column: per row (the model's key), the reasons
    of its D intervals that ended lately (the wake-ups of a recording made
    with record --stacks carry them), and the one with the most D time in
    the window shown."""

    def __init__(self, keyf):
        self.keyf = keyf
        self.seen: dict = {}  # key -> deque of (ts, reason, dur_ns)

    def note(self, rec: dict) -> None:
        reason = rec.get("reason")
        if not reason or rec["from"] != REASON_STATE or not isinstance(reason, str):
            return
        key = self.keyf(rec["pid"], rec["tid"], rec.get("comm") or "?", rec.get("cgroup"))
        q = self.seen.get(key)
        if q is None:
            q = self.seen[key] = deque(maxlen=256)
        q.append((rec["ts"], reason, rec.get("dur_ns") or 0))

    def top(self, key, since: int) -> str:
        q = self.seen.get(key)
        if not q:
            return ""
        while q and q[0][0] < since:
            q.popleft()
        by: dict = {}
        for _ts, reason, dur in q:
            by[reason] = by.get(reason, 0) + dur
        return min(by, key=lambda r: (-by[r], r)) if by else ""

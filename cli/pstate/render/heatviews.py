"""Heat map views: what a renderer draws from the models of heatmodel.py
(the time axis, rows of cells for state and latency maps, the dominant
state of a cell), and the snapshot map's values (rows = processes, columns =
snapshots, cell = time in the chosen states per interval)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pstate.analysis import services
from pstate.render.heatmodel import Grid, NLOG2, NSTATES, key_of
from pstate.snapshots import snapdir


# --- views: what a renderer draws -------------------------------------------


@dataclass
class TimeAxis:
    """Column c starts at start_ns + c*bucket_ns (relative to the axis zero).
    ago=True labels times as "-Ns" back from the right edge (live view)."""

    start_ns: int
    bucket_ns: int
    ago: bool = False


@dataclass
class View:
    """A grid ready to draw. kind: "state" (cells are state indices or None),
    "share", "count" or "value" (cells are numbers or None)."""

    kind: str
    title: str
    row_labels: list
    cells: list  # rows x columns
    axis: TimeAxis | None = None
    col_labels: list | None = None  # (column, text) ticks, when not a time axis
    scale_max: float = 1.0
    scale_mode: str = "linear"  # or "log" (counts)
    scale_title: str = ""
    scale_unit: str = ""  # "%" for shares
    footer: list = field(default_factory=list)
    states_present: list = field(default_factory=list)
    row_notes: list | None = None  # a word drawn right of each row's cells (heat --live: D reasons)


def dominant(cell) -> int | None:
    """Index of the state with the most time in a cell (first on ties)."""
    if cell is None:
        return None
    best = None
    bv = 0
    for i in range(NSTATES):
        v = cell[i]
        if v > bv:
            bv = v
            best = i
    return best


def state_rows(grid: Grid, keys: list, c0: int, ncols: int, shade: int | None, overlay: Grid | None = None):
    """Rows of cells for keys over columns c0..c0+ncols-1, and the states seen.

    Without shade a cell is the dominant state index; with shade it is the
    share (0..1) of the observed time in that cell spent in state shade.
    None: the task was not observed in that bucket. overlay (open states in
    the live view) adds to the grid's cells."""
    rows = []
    seen = set()
    cols = grid.cols
    ocols = overlay.cols if overlay is not None else {}
    for key in keys:
        row = []
        for c in range(c0, c0 + ncols):
            col = cols.get(c)
            cell = None if col is None else col.get(key)
            ocol = ocols.get(c)
            extra = None if ocol is None else ocol.get(key)
            if extra is not None:
                cell = extra if cell is None else [x + y for x, y in zip(cell, extra)]
            if cell is None:
                row.append(None)
                continue
            if shade is None:
                d = dominant(cell)
                row.append(d)
                if d is not None:
                    seen.add(d)
            else:
                tot = sum(cell[:NSTATES])
                row.append(cell[shade] / tot if tot else None)
        rows.append(row)
    return rows, sorted(seen)


def latency_rows(cols: dict, c0: int, ncols: int, max_rows: int):
    """Rows (largest durations first) of counts per column, labels, and the
    log2 buckets each row covers. Rows span the populated range; when it is
    taller than max_rows, neighbouring log2 buckets are merged."""
    lo, hi = None, None
    for c in range(c0, c0 + ncols):
        col = cols.get(c)
        if col is None:
            continue
        for b in range(NLOG2):
            if col[b]:
                if lo is None or b < lo:
                    lo = b
                if hi is None or b > hi:
                    hi = b
    if lo is None:
        return [], [], 1
    n = hi - lo + 1
    per = max(1, -(-n // max(1, max_rows)))
    lo = hi - (-(-n // per) * per) + 1  # align so the top row ends at hi
    if lo < 0:
        lo = 0
    rows, spans = [], []
    b = hi
    while b >= lo:
        b0 = max(lo, b - per + 1)
        row = []
        for c in range(c0, c0 + ncols):
            col = cols.get(c)
            row.append(0 if col is None else sum(col[b0:b + 1]))
        rows.append(row)
        spans.append((b0, b))
        b = b0 - 1
    return rows, spans, per


# --- snapshots -----------------------------------------------------------------

# Snapshot files are read by snapshots.snapdir (read_dir); the state counters of a row.
STATE_FIELDS = tuple(f"{name}_ns" for name in snapdir.STATE_FIELDS)


def _run_of(meta: dict) -> tuple:
    """Snapshots of one run of pstate snap share counters; runs differ by
    boot, run id or start."""
    return (meta.get("boot_id"), meta.get("run_id"), meta.get("run_start_ts"))


def _interval_of(meta: dict, prev: dict | None):
    a = meta.get("interval_start_ts")
    b = meta.get("interval_end_ts", meta.get("ts"))
    if prev is not None:
        pb = prev.get("interval_end_ts", prev.get("ts"))
        if type(pb) is int:
            a = pb
    if type(a) is not int or type(b) is not int or b <= a:
        return None
    return a, b


def snapshot_values(snaps: list[snapdir.Snapshot], states: tuple[str, ...], by: str = "pid"):
    """Per snapshot: (interval (start, end) or None, {key: ns in states}),
    plus labels {key: comm} (by pid or tid). by: tid, pid, comm or one of
    snapdir.SERVICE_KEYS (what the rows say of their process), or
    'title:REGEX'.

    Cumulative snapshots are differenced against the previous snapshot of
    the same run (boot, run id) and the same thread identity (pid, tid,
    start_ts); the first snapshot of a run counts from the run's start. A
    thread whose times do not fit in the interval (counted since before it,
    or a counter that went back) is left out."""
    fields = tuple(f"{s}_ns" for s in states)
    by, role = services.parse_by(by)  # --by 'title:REGEX': the role is REGEX's group
    service = by in snapdir.SERVICE_KEYS  # (what each row says of its process)
    keyf = None if service else key_of(by)
    labels: dict = {}
    out = []
    last_of_run: dict = {}  # run -> (meta, {identity: row}) of its latest snapshot so far
    for snap in snaps:
        meta = snap.meta
        cumulative = meta.get("mode") == "cumulative"
        run = _run_of(meta)
        prev = last_of_run.get(run) if cumulative else None
        if prev is not None and not (type(meta.get("ts")) is int and type(prev[0].get("ts")) is int
                                     and meta["ts"] > prev[0]["ts"]):
            prev = None
        iv = _interval_of(meta, prev[0] if prev is not None else None)
        prev_rows = prev[1] if prev is not None else {}
        vals: dict = {}
        rows: dict = {}
        on_cpu = 0  # the interval's on-CPU ns, and the rows that may be why it is impossible
        suspects = []
        for t in snap.rows:
            ident = (t["pid"], t["tid"], t.get("start_ts"))
            rows[ident] = t
            comm = t.get("comm") if isinstance(t.get("comm"), str) else "?"
            key = snapdir.service_key(by, t, role) if service else keyf(t["pid"], t["tid"], comm)
            if by == "pid":
                if t["tid"] == t["pid"] or key not in labels:
                    labels[key] = comm
            elif by == "tid":
                labels[key] = comm
            if iv is None:
                continue
            v = sum(t.get(f, 0) for f in fields)
            total = sum(t.get(f, 0) for f in STATE_FIELDS)
            p = prev_rows.get(ident)
            if p is not None:
                v -= sum(p.get(f, 0) for f in fields)
                total -= sum(p.get(f, 0) for f in STATE_FIELDS)
            span = iv[1] - iv[0]
            if v < 0 or total > span + span // 20 + 1_000_000:
                continue
            vals[key] = vals.get(key, 0) + v
            ran = t.get("running_ns", 0) - (p.get("running_ns", 0) if p is not None else 0)
            on_cpu += ran
            if _no_switch(t, p, iv[0]) and "running_ns" in fields:
                suspects.append((key, ran))
        if iv is not None and type(meta.get("ncpu")) is int and on_cpu > meta["ncpu"] * (iv[1] - iv[0]):
            for key, ran in suspects:  # switch-outs not traced (snapdir.intervals): not on-CPU time
                vals[key] -= ran
        out.append((iv, vals))
        if cumulative:
            last_of_run[run] = (meta, rows)
    return out, labels


def _no_switch(t: dict, p: dict | None, start: int) -> bool:
    """A row running since before the interval with no switch or wake-up in it."""
    since = t.get("state_since_ts")
    return t.get("state") == "running" and type(since) is int and since <= start and \
        not any(t.get(k, 0) - (p.get(k, 0) if p is not None else 0) for k in snapdir.COUNT_FIELDS)


def snapshot_view_cells(values, keys: list, ncols: int):
    """Columns = snapshots, merged into groups when there are more than ncols.
    Cell = ns in the states / interval ns (the average number of threads in
    them), None when unknown. Returns cells, per-column (start, end)."""
    n = len(values)
    per = max(1, -(-n // max(1, ncols)))
    groups = [values[i:i + per] for i in range(0, n, per)]
    spans = []
    cells = [[] for _ in keys]
    for g in groups:
        ivs = [iv for iv, _ in g if iv is not None]
        span = sum(b - a for a, b in ivs)
        spans.append((ivs[0][0], ivs[-1][1]) if ivs else None)
        for r, key in enumerate(keys):
            have = [vals[key] for iv, vals in g if iv is not None and key in vals]
            cells[r].append(sum(have) / span if (have and span) else None)
    return cells, spans, per


def human_count(n: float) -> str:
    n = float(n)
    if n >= 10_000_000:
        return f"{n / 1e6:.0f}M"
    if n >= 10_000:
        return f"{n / 1e3:.0f}k"
    if n == int(n):
        return str(int(n))
    return f"{n:.2g}"

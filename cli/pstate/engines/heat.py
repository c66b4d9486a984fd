"""heat: the state map, the latency map or the snapshot map of recordings,
a stream or a snapshot directory, composed from the model (render.heatmodel),
its views (render.heatviews) and the drawing (render.heatdraw); --live runs
the dashboard's loop (engines.live). heat(), the one entry, is what `pstate
heat` runs: commands/heat.py declares and checks the options."""

from __future__ import annotations

import datetime
import os
import shutil
import stat
import sys

import click

from pstate import lifecycle
from pstate.analysis import services
from pstate.engines import inputs, live
from pstate.exitcodes import ExitCode, PstateError
from pstate.render import heatdraw as hr
from pstate.render import heatmodel as hm
from pstate.render import heatviews
from pstate.stream import schema
from pstate.snapshots import snapdir
from pstate.stream.durations import fmt_ns
from pstate.stream.filters import Filter
from pstate.stream.reader import StreamReader, feed_sources
from pstate.stream.streamio import ReadStats, open_input

UNITS = {"tid": "thread", "pid": "process", "comm": "command", "cgroup": "cgroup", "unit": "unit",
         "container": "container", "title": "title", "ppid": "parent"}
PLURAL = {"thread": "threads", "process": "processes", "command": "commands", "cgroup": "cgroups", "unit": "units",
          "container": "containers", "title": "titles", "parent": "parents"}
DEFAULT_ROWS = 20  # rows when the output is not a terminal and no --top/--height
DEFAULT_LAT_ROWS = 32
OVERHEAD = 7  # title, axis (2), legend (2), footer (2)
MAX_BANDS = 100


def heat(paths: list[str], *, latency, shade, by, top, bucket, width, height, color: str, live_view: bool,
         window: int, refresh: float, filt: Filter, strict: bool) -> int:
    """Draw the map the options ask for; the exit status."""
    isatty = sys.stdout.isatty()
    style = hr.pick_style(color, isatty)
    term = shutil.get_terminal_size((80, 24))
    W = width or (term.columns if (isatty or "COLUMNS" in os.environ) else 80)
    fit_height = height is not None or isatty
    H = height or (term.lines if isatty else 0)
    shade_i = hm.STATE_INDEX.get(shade) if shade else None
    if shade and shade_i is None:
        shade_i = hm.OTHER

    sources = list(paths) or ["-"]
    if inputs.kind(sources) != inputs.EVENTS:
        if len(sources) != 1:
            raise PstateError("give one snapshot directory, or recordings, not both", ExitCode.USAGE)
        if live_view:
            raise PstateError("--live reads a stream, not a snapshot directory", ExitCode.USAGE,
                              hint=f"pstate heat {sources[0]} draws the snapshots")
        if latency:
            raise PstateError("snapshots hold time per state, not single waits: no latency map",
                              ExitCode.USAGE, hint="use --shade STATE (e.g. --shade runnable)")
        stats = ReadStats()
        with lifecycle.interruptible():
            lines = snapshot_map(sources[0], stats, strict, shade or "running", by or "pid", top, W,
                                 H if fit_height else 0, filt, style)
        _emit(lines)
        return stats.report("pstate heat", strict=strict)

    if inputs.stdin_is_terminal(sources):
        raise PstateError("no input: heat reads a recording, a snapshot directory or a stream on "
                          "standard input, and standard input is a terminal", ExitCode.USAGE,
                          hint="pstate heat rec.jsonl, or sudo pstate record | pstate heat --live")
    by = by or "tid"
    if live_view:
        if len(sources) != 1:
            raise PstateError("--live reads one stream (a file, a pipe or standard input)", ExitCode.USAGE)
        src = sources[0]
        if src == "-":
            fd, name = sys.stdin.fileno(), "<stdin>"
        else:
            fp = open_input(src, decompress=False)  # read by descriptor
            fd, name = fp.fileno(), src
        # A regular file has no pace to keep up with: read all of it.
        adaptive = not stat.S_ISREG(os.fstat(fd).st_mode)
        opts = live.LiveOptions(by=by, top=top, shade=shade_i, measure=latency, window_ns=window,
                                bucket_ns=bucket, refresh=refresh, width=width, height=height,
                                style=style, filt=filt, strict=strict, name=name, adaptive=adaptive)
        sys.stdout.flush()
        res = live.run_live(fd, sys.stdout.fileno(), opts, tty=isatty)
        return live.stderr_report(res, strict)

    stats = ReadStats()
    tracker = hm.RecordedStates(by, Filter(include_idle=filt.include_idle), latency)  # the reader filters
    try:
        # state records as rows, read by the native row reader when it is built
        # (the reader applies the filter, on the careful path)
        with lifecycle.interruptible():
            rd = StreamReader(tracker, stats, strict=strict, native_rows=True, filt=filt)
            for _ in feed_sources(rd, sources, stats):
                pass
    except KeyboardInterrupt:
        # `pstate record | pstate heat`: Ctrl-C ends the recording; draw what came.
        click.echo("pstate heat: interrupted; drawing what was read", err=True)
    # read: a signal from now on changes nothing, what was read is drawn
    lifecycle.done()
    tracker.close()
    if latency:
        lines = latency_map(tracker, stats, latency, bucket, W, H if fit_height else 0, style, sources)
    else:
        lines = state_map(tracker, stats, shade_i, top, bucket, W, H if fit_height else 0, style, sources)
    _emit(lines)
    return stats.report("pstate heat", strict=strict)


def _emit(lines: list[str]) -> None:
    sys.stdout.write("\n".join(lines) + "\n")


# --- building views -------------------------------------------------------------------


def _footer(tracker: hm.Tracker | None, stats: ReadStats, sources, what: str) -> list[str]:
    parts = [what]
    if stats.lost:
        reasons = ", ".join(f"{r} {n:,}" for r, n in sorted(stats.loss.items()))
        parts.append(f"lost {stats.lost:,} events ({reasons}): incomplete")
    else:
        parts.append("lost 0")
    if stats.n_skipped:
        parts.append(f"skipped {stats.n_skipped:,} bad lines")
    if stats.truncated_tail:
        parts.append("truncated last line")
    if tracker is not None and tracker.input_sample_every > 1:
        parts.append(f"recorded with sampling 1/{tracker.input_sample_every}")
    src = ", ".join("stdin" if s == "-" else os.path.basename(s) for s in sources)
    if len(src) > 60:
        src = f"{len(sources)} inputs"
    head = f"Input: {src}"
    if tracker is not None and tracker.hosts:
        head += f" (host {', '.join(tracker.hosts)})"
    if tracker is not None and tracker.wall_ns:
        t = datetime.datetime.fromtimestamp(tracker.wall_ns / 1e9, datetime.timezone.utc)
        head += f", start {t:%Y-%m-%d %H:%M:%S} UTC"
    return [head + "; " + "; ".join(parts) + "."]


def _rows_fit(top, H, default) -> int:
    if top:
        return top
    if H:
        return max(3, H - OVERHEAD)
    return default


def state_map(tracker: hm.RecordedStates, stats, shade, top, bucket, W, H, style, sources) -> list[str]:
    t0, t1 = tracker.range()
    unit = UNITS[tracker.by]
    events = f"{tracker.n_events:,} events"
    if t0 is None or not tracker.totals:
        view = heatviews.View("state", "No state transitions in the input", [], [],
                       footer=_footer(tracker, stats, sources, events))
        return hr.render(view, W, style)
    slot = hm.BUSY if shade is None else shade
    score = {k: v[slot] for k, v in tracker.totals.items()}
    keys = tracker.rank(score, _rows_fit(top, H, DEFAULT_ROWS))
    labels = [tracker.label(k) for k in keys]
    lw = hr.label_width(labels, W)
    ncols = hr.map_columns(W, lw)
    span = max(1, t1 - t0)
    b = bucket or hm.nice_bucket(span, ncols)
    total_cols = max(1, -(-span // b))
    grid = tracker.state_grid(keys, t0, b, t1)
    nall = len(set(tracker.totals) | set(tracker.events))
    if shade is None:
        title = (f"Dominant state per {unit}: {len(keys)} of {nall} {PLURAL[unit]}, busiest first; "
                 f"{fmt_ns(span)} in {fmt_ns(b)} buckets")
    else:
        name = hm.STATE_NAMES[shade]
        letter = schema.STATES.get(name, ("?",))[0]
        title = (f"Share of each {fmt_ns(b)} bucket spent {name} ({letter}): {len(keys)} of {nall} "
                 f"{PLURAL[unit]}, most {name} first; {fmt_ns(span)}")
    return _bands(grid, keys, labels, lw, ncols, total_cols, b, shade, title, W, style,
                  _footer(tracker, stats, sources, events))


def _bands(grid, keys, labels, lw, ncols, total_cols, b, shade, title, W, style, footer) -> list[str]:
    nb = -(-total_cols // ncols)
    out = []
    if nb > MAX_BANDS:
        click.echo(f"pstate heat: warning: {total_cols} buckets make {nb} bands; showing the first "
                   f"{MAX_BANDS} (use a larger --bucket)", err=True)
        nb = MAX_BANDS
    seen_all: set = set()
    bands = []
    for i in range(nb):
        c0 = i * ncols
        n = min(ncols, total_cols - c0)
        rows, seen = heatviews.state_rows(grid, keys, c0, n, shade)
        seen_all.update(seen)
        bands.append((c0, rows))
    for i, (c0, rows) in enumerate(bands):
        view = heatviews.View("state" if shade is None else "share", title, labels, rows,
                       axis=heatviews.TimeAxis(c0 * b, b), scale_max=1.0, scale_title="share",
                       scale_unit="%", footer=footer, states_present=sorted(seen_all))
        out.extend(hr.render(view, W, style, label_w=lw, head=i == 0, tail=i == len(bands) - 1))
        if i < len(bands) - 1:
            out.append("")
    return out


def latency_map(tracker: hm.RecordedStates, stats, measure, bucket, W, H, style, sources) -> list[str]:
    t0, t1 = tracker.range()
    what, _states = hm.MEASURES[measure]
    footer = _footer(tracker, stats, sources, f"{tracker.n_samples:,} samples of {tracker.n_events:,} events")
    if t0 is None or not tracker.n_samples:
        view = heatviews.View("count", f"Latency heat map of {what}: no such durations in the input", [], [],
                       footer=footer)
        return hr.render(view, W, style)
    lw = 7
    ncols = hr.map_columns(W, lw)
    span = max(1, t1 - t0)
    b = bucket or hm.nice_bucket(span, ncols)
    total_cols = max(1, -(-span // b))
    cols = tracker.latency_counts(t0, b)
    max_rows = max(3, H - OVERHEAD) if H else DEFAULT_LAT_ROWS
    rows, spans, per = heatviews.latency_rows(cols, 0, total_cols, max_rows)
    labels = [fmt_ns(hm.log2_lower(b0)).rjust(lw) for b0, _ in spans]
    vmax = max((max(r) for r in rows), default=0)
    merged = "" if per == 1 else f" ({per} log2 buckets per row)"
    title = (f"Latency heat map of {what}: count per {fmt_ns(b)} bucket (x) and log2 duration (y, "
             f"row = lower bound){merged}; {fmt_ns(span)}")
    nb = min(MAX_BANDS, -(-total_cols // ncols))
    out = []
    for i in range(nb):
        c0 = i * ncols
        band = [r[c0:c0 + ncols] for r in rows]
        view = heatviews.View("count", title, labels, band, axis=heatviews.TimeAxis(c0 * b, b), scale_max=vmax,
                       scale_mode="log", scale_title="count (log scale)", footer=footer)
        out.extend(hr.render(view, W, style, label_w=lw, head=i == 0, tail=i == nb - 1))
        if i < nb - 1:
            out.append("")
    return out


def _read_snapshots(path: str, stats, problems: list, strict: bool) -> list:
    """A snapshot directory's snapshots (incomplete ones too: heat draws what
    there is), or the one of a snapshot file."""
    if os.path.isdir(path):
        return snapdir.read_dir(path, stats, problems, strict=strict)
    snap = snapdir.read_snapshot(path, stats, problems, strict=strict, keep_incomplete=True)
    return [snap] if snap is not None else []


def _input_name(path: str) -> str:
    name = os.path.basename(os.path.normpath(path))
    return name + "/" if os.path.isdir(path) else name


def snapshot_map(directory, stats, strict, state, by, top, W, H, filt, style) -> list[str]:
    problems: list = []
    snaps = _read_snapshots(directory, stats, problems, strict)
    for p in problems:
        click.echo(f"pstate heat: warning: {p}", err=True)
    unused = [opt for opt, on in (("--state", filt.states), ("--cpu", filt.cpus), ("--min-dur", filt.min_dur_ns))
              if on]
    if unused:  # (a row is a thread's time per state, not its transitions)
        click.echo(f"pstate heat: warning: {', '.join(unused)} not used with snapshots", err=True)
    if filt.active:
        for s in snaps:
            s.rows = [t for t in s.rows if _task_match(filt, t)]
    elif not filt.include_idle:
        for s in snaps:
            s.rows = [t for t in s.rows if t["tid"] != 0]
    unit = UNITS[services.parse_by(by)[0]]  # (by title:REGEX: titles)
    footer_what = f"{len(snaps)} snapshots"
    if len(snaps) < 1:
        view = heatviews.View("value", f"No snapshots in {directory}", [], [],
                       footer=[f"Input: {_input_name(directory)}; no pstate-snap-*.jsonl files."])
        return hr.render(view, W, style)
    values, comms = heatviews.snapshot_values(snaps, (state,), by)
    totals: dict = {}
    for _iv, vals in values:
        for k, v in vals.items():
            totals[k] = totals.get(k, 0) + v
    order = sorted(set(totals) | set(comms), key=lambda k: (-totals.get(k, 0), str(k)))
    keys = order[:_rows_fit(top, H, DEFAULT_ROWS)]
    labels = [f"{comms.get(k, '?')} {k}" if by in ("pid", "tid") else str(k) for k in keys]
    lw = hr.label_width(labels, W)
    ncols = hr.map_columns(W, lw)
    cells, spans, per = heatviews.snapshot_view_cells(values, keys, ncols)
    vmax = max((v for row in cells for v in row if v is not None), default=0) or 1.0
    # Few snapshots: draw each several characters wide so the map is readable.
    rep = max(1, min(8, ncols // max(1, len(spans))))
    if rep > 1:
        cells = [[v for v in row for _ in range(rep)] for row in cells]
    # Column labels: the wall-clock time (UTC) a snapshot was taken. Runs
    # and boots have their own monotonic clocks; the wall clock spans them.
    walls = []
    for c in range(len(spans)):
        w = snaps[min(len(snaps) - 1, (c + 1) * per - 1)].meta
        w = w.get("wall_end_ns", w.get("wall_ns"))
        walls.append(datetime.datetime.fromtimestamp(w / 1e9, datetime.timezone.utc) if type(w) is int else None)
    days = {w.date() for w in walls if w is not None}
    fmt = "%H:%M:%S" if len(days) <= 1 else "%m-%d %H:%M"
    col_labels = []
    free = 0  # first column a label may start at
    for c, w in enumerate(walls):
        text = w.strftime(fmt) if w is not None else ""
        if text and c * rep >= free:
            col_labels.append((c * rep, text))
            free = c * rep + len(text) + 2
    letter = schema.STATES.get(state, ("?",))[0]
    grouped = "" if per == 1 else f", {per} snapshots per column"
    title = (f"Time {state} ({letter}) per {unit} and snapshot interval, as the average number of "
             f"threads {state}: {len(keys)} of {len(order)} {PLURAL[unit]}{grouped}; "
             f"columns end at the times shown (UTC)")
    meta0 = snaps[0].meta
    head = f"Input: {_input_name(directory)}"
    if isinstance(meta0.get("host"), str):
        head += f" (host {meta0['host']})"
    w = meta0.get("wall_start_ns", meta0.get("wall_ns"))
    if type(w) is int:
        t = datetime.datetime.fromtimestamp(w / 1e9, datetime.timezone.utc)
        head += f", first interval from {t:%Y-%m-%d %H:%M:%S} UTC"
    modes = sorted({str(s.meta.get("mode")) for s in snaps})
    incomplete = sum(1 for s in snaps if s.end is None)
    tail = f"; {footer_what} ({'/'.join(modes)})"
    if incomplete:
        tail += f"; {incomplete} without an end record"
    truncated = sum(1 for s in snaps if s.meta.get("truncated") or s.meta.get("map_full"))
    if truncated:
        tail += f"; {truncated} truncated (task map full): incomplete"
    view = heatviews.View("value", title, labels, cells, col_labels=col_labels, scale_max=vmax,
                   scale_mode="linear", scale_title=f"threads {state}", footer=[head + tail + "."])
    return hr.render(view, W, style, label_w=lw)


def _task_match(filt: Filter, t: dict) -> bool:
    return filt.match_row(t["pid"], t["tid"], t.get("comm"), t.get("title"), t.get("cgroup_path"))

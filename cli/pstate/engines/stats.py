"""stats: the Thread State Analysis of a stream or of recordings, whole,
by interval (--interval, in engines.intervals) or with the why views
(--stacks, --wakers, --antagonists, --by reason); snapshots go to their own
analysis (analysis.snapseries). stats(), the one entry, is what `pstate
stats` runs: commands/stats.py declares and checks the options."""

from __future__ import annotations

import io
import os
import sys

import click

from pstate import lifecycle
from pstate.analysis import causes, ingest, selection, services, snapseries, timeinstate
from pstate.engines import inputs
from pstate.engines.intervals import IntervalRunner
from pstate.exitcodes import ExitCode, PstateError
from pstate.render import snaptables, tables, whytables
from pstate.snapshots import snapdir
from pstate.stream import schema
from pstate.stream.names import cell
from pstate.stream.streamio import ReadStats

PROG = "pstate stats"
# Reads from files: the native loop writes its sums back once per chunk, so
# bigger chunks mean fewer cold Python objects touched per event.
FILE_CHUNK = 8 << 20


def stats(sources: list[str], *, by: str, interval: int | None, count: int | None, strict: bool, reader: str,
          jobs: int, filt, opts: dict, why: tuple, ignored: dict) -> int:
    """Summarise the sources ("-" for standard input); the exit status.
    opts: what the output shows (selection, format: see commands/stats.py);
    why: --stacks, --wakers and --antagonists as given; ignored: the options
    snapshots do not use, by name, for a warning."""
    kind = inputs.kind(sources)
    if kind == inputs.MIXED:
        raise PstateError("cannot mix snapshots and event streams in one run", ExitCode.USAGE,
                          hint="run pstate stats once on the snapshots and once on the streams")
    if kind == inputs.SNAPSHOTS:
        return _snapshots(sources, fmt=opts["fmt"], top=opts["top"], by=by, strict=strict, interval=interval,
                          ignored=ignored)
    opts = {**opts, "why": _why_options(by, *why, opts["fmt"], interval)}
    out = sys.stdout
    stats = ReadStats()
    agg = timeinstate.Aggregator(causes.aggregation_key(by))
    opts["pass_sigint"] = 1 if inputs.any_pipe(sources) else 0
    if opts["why"]:
        return _run_why(sources, agg, stats, out, strict=strict, opts=opts, by=by, reader=reader, filt=filt)
    if interval:
        return _run_intervals(sources, agg, stats, out, strict=strict, interval_ns=interval, count=count,
                              opts=opts, filt=filt)
    return _run_once(sources, agg, stats, out, strict=strict, reader=reader, opts=opts,
                     jobs=jobs or _cpus(), filt=filt)


def _reading(opts: dict):
    """The region the input is read in: a signal stops it at once. On a
    pipe the first Ctrl-C is let by: `pstate record`, which gets it too,
    ends the stream, and the summary is printed at its end; a second one (or
    a first one on a file) stops reading (KeyboardInterrupt), and the
    summary covers what was read."""
    return lifecycle.interruptible(pass_sigint=opts["pass_sigint"])


# --- why: --stacks, --wakers, --antagonists, --by reason -------------------------


def _why_options(by, stack_states, wakers, antagonists, fmt, interval) -> dict | None:
    """What the why views need ({stacks, states, wakers, antagonists}), or
    None when no such view is asked for."""
    if fmt == "folded" or by == "reason":
        stack_states = stack_states or "all"
    if not (stack_states or wakers or antagonists):
        return None
    if interval:
        raise click.UsageError("--stacks, --wakers, --antagonists, --by reason and --format folded "
                               "summarise the whole input, not --interval")
    if fmt == "csv":
        raise click.UsageError("--format csv has no columns for stacks, wakers or antagonists: use json")
    if fmt == "dot" and by == "reason" and not wakers:
        raise click.UsageError("--by reason has no state graph: add --wakers for the wake-up graph")
    return {"stacks": bool(stack_states), "states": _blocked_states(stack_states), "wakers": wakers,
            "antagonists": antagonists}


def _blocked_states(spec: str | None) -> frozenset | None:
    """--stacks' states as stream state names (None: every state)."""
    if not spec or spec == "all":
        return None
    out = set()
    for part in (p.strip() for p in spec.split(",")):
        name = schema.STATE_LETTERS.get(part) or (part if part in schema.STATES else None)
        if not name:
            raise click.BadParameter(f"{part!r} is not a state (letters such as D or S, or names such as "
                                     "uninterruptible)", param_hint="'--stacks'")
        out.add(name)
    return frozenset(out)


# --- whole input ---------------------------------------------------------------


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _run_once(sources, agg, stats, out, *, strict, reader, opts, jobs=1, filt=None) -> int:
    interrupted = False
    try:
        with _reading(opts):
            ingest.digest_files(sources, agg, stats, strict=strict, chunk=FILE_CHUNK, jobs=jobs,
                                use_native=reader == "fast", filt=filt)
    except KeyboardInterrupt:
        interrupted = True
    summary = agg.summarise(stats)
    summary.interrupted = interrupted
    _refuse_snapshot_stream(summary)
    _emit(summary, out, opts)
    code = stats.report(PROG, strict=strict)
    if interrupted:
        print(f"{PROG}: interrupted; the summary covers the input read so far", file=sys.stderr)
        return int(ExitCode.SIGINT)
    return code


# --- why: --stacks, --wakers, --antagonists, --by reason -------------------------


def _run_why(sources, agg, stats, out, *, strict, opts, by, reader, filt) -> int:
    """The whole input through the one reader: the Aggregator and the Causes
    read the same rows and records (causes.digest)."""
    why = opts["why"]
    found = causes.Causes(by, stacks=why["stacks"], wakers=why["wakers"], antagonists=why["antagonists"])
    interrupted = False
    try:
        with _reading(opts):
            causes.digest(sources, agg, found, stats, strict=strict, use_native=reader == "fast",
                          chunk=FILE_CHUNK, filt=filt)
    except KeyboardInterrupt:
        interrupted = True
    agg.reaches(found.last_ts)  # a filter applied after attributing: the window is the input's
    summary = agg.summarise(stats)
    summary.interrupted = interrupted
    found.finish(summary.end_ts)
    _refuse_snapshot_stream(summary)
    _emit_why(summary, found, out, opts, by)
    code = stats.report(PROG, strict=strict)
    if interrupted:
        print(f"{PROG}: interrupted; the summary covers the input read so far", file=sys.stderr)
        return int(ExitCode.SIGINT)
    return code


def _emit_why(summary, found, out, opts, by) -> None:
    why = opts["why"]
    states = why["states"] if why["states"] is not None else found.stack_states()  # --stacks alone
    kw = dict(top=opts["top"], stacks=why["stacks"], wakers=why["wakers"], antagonists=why["antagonists"],
              states=states)
    fmt = opts["fmt"]
    if by in causes.WHY_BY_KEYS:
        rep = whytables.reason_report(summary, found, **kw)
    else:
        groups = selection.select(summary.groups, states=opts["states"], min_dur_ns=opts["min_dur_ns"],
                                  sort=opts["sort"], top=opts["top"])
        rep = tables.build_report(summary, groups, hist=opts["hist"], with_matrix=opts["with_matrix"])
        whytables.attach(rep, found, **kw)
    if fmt == "json":
        text = tables.render_json(rep)
    elif fmt == "folded":
        text = whytables.render_folded(found, [g["key"] for g in rep["groups"]], states)
    elif fmt == "dot":
        text = whytables.render_wake_dot(rep) if why["wakers"] else tables.render_dot(rep)
    elif by in causes.WHY_BY_KEYS:
        text = whytables.render_reason_table(rep, _width(out, opts))
    else:
        width = _width(out, opts)
        text = tables.render_table(rep, hist=opts["hist"], with_matrix=opts["with_matrix"], width=width)
        text += "\n".join(whytables.render_tables(rep, width)) + "\n"
    out.write(text)
    out.flush()


def _width(out, opts) -> int | None:
    """The tables' width: the terminal's (or COLUMNS), None with --wide."""
    return None if opts.get("wide") else tables.table_width(out)


def _refuse_snapshot_stream(summary) -> None:
    """Snapshots replayed into a pipe (pstate replay DIR | pstate stats) hold
    no transitions: say where their analysis is instead of "0 events"."""
    if summary.events or not any(m.get("source") == "snap" for m in summary.stats.metas):
        return
    raise PstateError("the input holds snapshots (from pstate snap), not an event stream",
                      ExitCode.DATAERR,
                      hint="give the snapshot directory or files to stats itself: pstate stats DIR/")


def _emit(summary, out, opts, banner: str | None = None) -> None:
    groups, rest, total = selection.select_with_rest(summary.groups, states=opts["states"],
                                                     min_dur_ns=opts["min_dur_ns"], sort=opts["sort"],
                                                     top=opts["top"])
    rep = tables.build_report(summary, groups, hist=opts["hist"], with_matrix=opts["with_matrix"],
                              rest=rest, total=total)
    fmt = opts["fmt"]
    if fmt == "json":
        text = tables.render_json(rep)
    elif fmt == "csv":
        seq = (summary.interval or {}).get("seq", 1)
        text = tables.render_csv(rep, with_matrix=opts["with_matrix"], header=seq == 1)
    elif fmt == "dot":
        text = tables.render_dot(rep)
    else:
        text = tables.render_table(rep, hist=opts["hist"], with_matrix=opts["with_matrix"], width=_width(out, opts))
        if banner:
            text = banner + "\n" + text
    out.write(text)
    out.flush()


# --- --interval ----------------------------------------------------------------


def _run_intervals(sources, agg, stats, out, *, strict, interval_ns, count, opts, filt=None) -> int:
    """Per-interval summaries. Pipes and terminals tick on the wall clock
    (the interval fires even when nothing arrives); regular files tick on
    the recorded time."""
    runner = IntervalRunner(agg, stats, out, interval_ns=interval_ns, count=count, opts=opts, filt=filt,
                            emit=_emit)
    interrupted = False
    try:
        with _reading(opts):
            for src in sources:
                if runner.done:
                    break
                if inputs.is_regular(src):
                    runner.file(src, strict=strict)
                else:
                    runner.stream(src, strict=strict)
            if not runner.done:
                runner.finish()
    except KeyboardInterrupt:
        interrupted = True
        if not runner.done:
            runner.tick(final=True, interrupted=True)
    code = stats.report(PROG, strict=strict)
    return int(ExitCode.SIGINT) if interrupted else code



# --- snapshots -----------------------------------------------------------------


def _snapshots(paths, *, fmt, top, by, strict, interval, ignored) -> int:
    if interval:
        raise PstateError("--interval reads a stream; snapshots are already per interval", ExitCode.USAGE)
    unused = [name for name, val in ignored.items() if val]
    if unused:
        print(f"{PROG}: warning: {', '.join(unused)} not used with snapshots", file=sys.stderr)
    return snapshot_stats(list(paths), fmt=fmt, top=top, by=by, out=sys.stdout, strict=strict)


def snapshot_stats(paths: list[str], *, fmt: str, top: int | None, by: str, out, min_run: int = snapseries.MIN_RUN,
        strict: bool = False, err=None) -> int:
    """`pstate stats` over snapshot files or directories (analysis.snapseries,
    render.snaptables). Returns the exit code."""
    if fmt not in snaptables.RENDERERS:
        raise PstateError(f"unknown output format {fmt!r} for snapshots (table, json or csv)", ExitCode.USAGE)
    by, role = services.parse_by(by)  # (--by 'title:REGEX': the role is REGEX's group)
    group_by = snapseries.BY_CHOICES.get(by)
    if group_by is None:
        raise PstateError(f"snapshots can be grouped by pid, tid, comm, cgroup, unit, container, title or ppid, "
                          f"not {by!r}", ExitCode.USAGE)
    stats = ReadStats()
    problems: list[str] = []
    snaps = snapdir.load(paths, stats, problems)
    err = err or sys.stderr
    code = stats.report("pstate stats", err, strict=strict)
    for p in problems:
        print(f"pstate stats: warning: {p}", file=err)
    if problems and strict:
        code = int(ExitCode.DATAERR)
    if not snaps:
        # Files that were read but hold no snapshot are bad input; an empty directory is no input.
        bad = problems or stats.n_skipped or stats.records or stats.truncated_tail
        raise PstateError(f"no complete snapshots in {', '.join(paths)}",
                          ExitCode.DATAERR if bad else ExitCode.NOINPUT,
                          hint="snapshot files are named pstate-snap-*.jsonl (written by pstate snap --dir DIR)")
    rep = snapseries.analyse(snaps, by=group_by, role=role, min_run=min_run)
    if rep["untraced"]:
        who = ", ".join(f"{cell(u['comm'])} {u['tid']}" for u in rep["untraced"][:5])
        print(f"pstate stats: warning: {len(rep['untraced'])} thread(s) ran through whole intervals with no "
              f"switch ({who}): their switch-outs were not traced, their time is counted unknown, not on-CPU; "
              "/proc/TID/schedstat counts since a thread began, not per snapshot interval: not used", file=err)
    if rep["truncated"]:
        print(f"pstate stats: warning: {rep['truncated']} snapshot(s) are truncated (the task map was full); "
              "some threads are missing (raise snap --max-tasks)", file=err)
    buf = io.StringIO()
    enc = getattr(out, "encoding", None) or "utf-8"
    snaptables.RENDERERS[fmt](rep, buf, top, unicode=enc.lower().replace("-", "").startswith("utf"))
    out.write(buf.getvalue())
    return code


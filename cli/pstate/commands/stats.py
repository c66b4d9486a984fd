"""pstate stats: Thread State Analysis of a stream, a recording or snapshots."""

from __future__ import annotations

import os
import select
import signal
import stat as statmod
import sys
import time

import click

from pstate.stream import schema
from pstate.render import tables
from pstate.analysis import timeinstate
from pstate.analysis import ingest
from pstate.analysis import selection
from pstate.analysis import causes
from pstate.render import whytables
from pstate.stream.durations import Duration, parse_ns
from pstate.exitcodes import ExitCode, PstateError
from pstate.commands.options import STATE_LETTERS, StateName, read_filter_options
from pstate.stream.streamio import ReadStats, open_input
from pstate.stream.reader import read_records
from pstate.stream.meta import boot_id
from pstate.snapshots import snapdir

PROG = "pstate stats"
FORMATS = ("table", "json", "csv", "dot", "folded")
BY_CHOICES = timeinstate.BY_KEYS + ("reason",)
CHUNK = 1 << 20
# Reads from files: the native loop writes its sums back once per chunk, so
# bigger chunks mean fewer cold Python objects touched per event.
FILE_CHUNK = 8 << 20

EPILOG = """\b
Examples:
  sudo pstate record | pstate stats           summary at Ctrl-C (record ends, stats prints)
  pstate stats rec.jsonl                      per process: time in each state, latencies
  pstate stats rec.jsonl --by tid --hist      per thread, with log2 latency histograms
  pstate stats rec.jsonl --by all --hist      system-wide histograms, as runqlat prints
  pstate stats rec.jsonl --in-state D --top 5 the 5 processes most in uninterruptible sleep
  pstate stats rec.jsonl --sort runq-p99      worst run-queue waits first
  pstate stats rec.jsonl -c nginx --by tid    only the nginx threads, per thread
  pstate stats rec.jsonl --matrix             transition counts and mean durations
  pstate stats rec.jsonl --top 1 --format dot | dot -Tsvg > states.svg
  sudo pstate record | pstate stats --interval 1 --count 10
  pstate stats /var/lib/pstate/               snapshots (from pstate snap)
  sudo pstate record --stacks -d 10 -o rec.jsonl
  pstate stats rec.jsonl --stacks=D --top 3   the 3 stacks most time in D, per process
  pstate stats rec.jsonl --by reason          blocked time of every task, by reason
  pstate stats rec.jsonl -f folded | flamegraph.pl > offcpu.svg
  pstate stats rec.jsonl --wakers -f dot | dot -Tsvg > wakeups.svg
  pstate stats rec.jsonl --by tid --antagonists   who held the CPU while each waited

\b
Time in state: dur_ns summed by the state left; the time from a task's last
transition to the end of the window counts for the state it is in, so a task
seen through the whole window sums to the window (the headline reports the
largest deviation). When the start of a task's first state was not seen
(dur_ns null), the time before it is "unobserved", not guessed. Percentages
are of the time observed. Latencies: run-queue wait after a wake-up
(runnable -> running) and after preemption (preempted -> running), on-CPU
slice (running -> anything), blocked time per sleeping state (sleeping,
uninterruptible, stopped, ... -> runnable): count, p50, p90, p99 and max.
Percentiles come from log-linear histograms (within 1.6%; exact for one or
two samples); max is exact.
A stream cut to a window (replay --begin/--end; a file record started anew
on SIGHUP) says so in its meta record (window_begin_ts, window_end_ts): every
duration is clipped to that window, as to an interval with --interval.
A recording made with --state, --cpu or --min-dur holds only some
transitions of each task: stats then shows no time in state (no percentage
it cannot support), only the counts and latency distributions of the
transitions kept, and says so. -p/-t/-c keep every transition of the tasks
they keep: their time in state stays. The same filters given to stats (as
record takes them: -p, -t, -c, --cpu, --state, --min-dur) are applied as it
reads, with the same effect on time in state; --in-state and --min-time
select groups instead.
Sanity: a switch-in of a task already running (running -> running, as the
threads of some VM agents show) is counted apart as impossible, not as a
switch; a group on a CPU longer than its threads and the CPUs allow is
flagged; the headline names the task of the largest deviation.
A transition counts under the pid and comm of its own record (a thread that
execs moves to its new name). --by cgroup, unit, container, title and ppid
group processes by what the recording's process and cgroup records (written
by record) said of them at that point of the stream: a process whose title
changes moves to its new title; one the stream says nothing of is in "?".
By cgroup, unit and container a state record that carries its task's own
cgroup counts under that cgroup, one without (null: the tracepoint path's
switch-ins and wake-ups; older recordings) under its process's: a thread
moved to another cgroup has each interval counted under the cgroup of the
record that ends it (where the task was at that transition), and the time
after its last record under that record's. --cgroup keeps records by the same rule.
Units and containers come from the cgroup path (system.slice/x.service,
docker-ID.scope, kubepods/.../podUID/ID). When --top hides groups, a row
"(N more)" sums them up and a row "(total)" all the groups chosen. Memory grows with the number of tasks and
latency buckets, not of events.

\b
Input with loss records, skipped lines or a truncated end (or a run cut short
by Ctrl-C) is summarised but flagged INCOMPLETE (json: input.complete false, input.lost_total,
input.lost_pct, input.skipped_total; with --interval, of that interval).
Bad lines are skipped and reported on stderr; --strict makes them exit 65. A newer event format exits 65.
While its input is a pipe, stats ignores the first Ctrl-C (so that `record`,
which gets it too, can end the stream) and prints at end of input; a second
Ctrl-C prints what it has at once.

\b
""" + tables.REPORT_FIELDS + """\b
Why (--stacks, --wakers, --antagonists, --by reason, --format folded): read
the whole input as records (no --interval; csv has no columns for them).
--stacks ranks, per group, the kernel stacks of the blocked intervals that
ended (the stack_id of the wake-up, from record --stacks), by total time,
with count, p50, p99 and max; "[no stack]" for blocked time without one,
"[blocked at the end]" for tasks still blocked when the window ends (so a
state's stacks sum to its blocked time). --format folded writes every stack
of the shown groups as "GROUP;STATE;root;...;leaf MICROSECONDS" lines.
--wakers: per group, who woke it from a blocked state: a task (comm tid),
irq or softirq, or [unknown]. --antagonists: per group, the run-queue time
(after a wake-up and after a preemption) and the tasks whose on-CPU slices
on the CPU it then got fall within it; "[idle or unseen]" is the rest (the
CPU idle, a task the recording left out). Rows per group: --top N, else 5.
""" + whytables.WHY_FIELDS + """
\b
--format csv writes one row per group (fixed columns: STATE_ns for every
state, KIND_count/_p50_ns/_p90_ns/_p99_ns/_max_ns); with --matrix, one row
per group and transition instead; with --interval, a first column "interval"
and one header. --format dot writes the state-transition graph of the groups
shown (Graphviz).
"""


def _sort_help() -> str:
    keys = ", ".join(k for k in selection.SORT_KEYS if k not in schema.STATES)
    return (f"Order groups by KEY (descending; key and comm ascending): {keys}, or a state name "
            "(time in it). Default: time in the --in-state states, else time running.")


@click.command(name="stats", epilog=EPILOG)
@click.argument("files", nargs=-1, type=click.Path(allow_dash=True), metavar="[INTERVAL [COUNT]] [FILE]...")
@click.option("--by", type=click.Choice(BY_CHOICES), default="pid", show_default=True,
              help="Group by process (pid), thread (tid) or task name (comm); by what the recording's "
                   "process records say: cgroup (v2 path), unit (systemd unit), container (container id, "
                   "pod), title (process title) or ppid (parent); all: every task in one group (with "
                   "--hist, the one system-wide histogram runqlat prints); reason: the blocked time of "
                   "every task by its reason (a recording made with record --stacks; implies --stacks).")
@click.option("--top", type=click.IntRange(min=1), metavar="N",
              help="Show only the first N groups (and, with --stacks, --wakers or --antagonists, the first "
                   "N rows of each).")
@click.option("--sort", "sort_key", type=click.Choice(list(selection.SORT_KEYS)), metavar="KEY", help=_sort_help())
@click.option("--in-state", "in_states", type=StateName(), multiple=True, metavar="STATE",
              help="Only groups that spent time in STATE (name or kernel letter: D, S, stopped, "
                   "preempted, ...). Repeatable: any of them.")
@click.option("--min-time", "min_time", type=Duration("s"), default=0, metavar="DURATION",
              help="Only groups that spent at least DURATION in the --in-state states (without "
                   "--in-state: observed at least that long), e.g. 10ms.")
@click.option("--hist", is_flag=True,
              help="Add log2 histograms of every latency, like runqlat (usecs; msecs when the max is "
                   "100 ms or more and the median 16 ms or more).")
@click.option("--matrix", "with_matrix", is_flag=True,
              help="Add the transition matrix: from -> to counts and mean time in the state left.")
@click.option("--stacks", "stack_states", is_flag=False, flag_value="all", metavar="STATES",
              help="Add the kernel stacks blocked tasks had (a recording made with record --stacks), ranked "
                   "by the blocked time they ended: count, total, p50, p99, max, and the reasons; only of "
                   "these states (comma-separated letters or names; --stacks alone: the states the recording "
                   "took stacks of, else every state). Rows per group: --top N, else 5. Example: --stacks=D.")
@click.option("--wakers", is_flag=True,
              help="Add who ended each group's blocked states: the waking task, irq or softirq, by wake-ups "
                   "and by the blocked time they ended; with --format dot, the wake-up graph.")
@click.option("--antagonists", is_flag=True,
              help="Add, for run-queue waits (after a wake-up and after a preemption), the tasks that held "
                   "the CPU meanwhile, by the run-queue time they caused.")
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="Output format: table (80 columns), json, csv, dot (Graphviz: the state graph; with "
                   "--wakers, the wake-up graph) or folded (blocked time by stack, in microseconds, for "
                   "flamegraph.pl, speedscope or inferno; implies --stacks).")
@click.option("-i", "--interval", type=Duration("s", positive=True), metavar="DURATION",
              help="Print a summary of every DURATION (e.g. 500ms, 5s, 1m; a plain number is seconds) while the stream flows in (of recorded time "
                   "for a file), each covering only its interval.")
@click.option("-n", "--count", type=click.IntRange(min=1), metavar="N",
              help="With --interval: stop after N summaries.")
@click.option("-T", "--timestamp", is_flag=True,
              help="With --interval: open every table with its wall-clock time, taken from this "
                   "machine's clock when the stream does not tell it.")
@click.option("--strict", is_flag=True,
              help="Exit non-zero (65) on any malformed, truncated or skipped input line.")
@click.option("-j", "--jobs", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Digest a large file (32 MiB or more) in N processes; 0: one per CPU. "
                   "Memory then grows with N times the number of tasks.")
@click.option("--reader", type=click.Choice(("fast", "careful")), default="fast", hidden=True,
              help="Input path: the native reader where it applies, or the careful (pure-Python) one.")
@read_filter_options
@click.pass_context
def cli(ctx, files, by, top, sort_key, in_states, min_time, hist, with_matrix, stack_states, wakers, antagonists,
        fmt, interval, count, timestamp, strict, jobs, reader, filt):
    """Thread State Analysis: where each task's time goes, state by state.

    Reads a pstate event stream (from a pipe, standard input, or recordings
    given as FILES, in order) and prints per group: time in each state,
    transitions, voluntary/involuntary switches, and latency distributions.
    Snapshot files or directories written by `pstate snap` are summarised
    too (trends per task).

    As with BCC's tools, `pstate stats 1 5` is --interval 1 --count 5: a
    leading number (a DURATION, then a count) that is not an existing file
    is taken as the interval and count. A number that names an existing file
    is read as that file; write ./1 to make sure a file named 1 is read.
    """
    files, interval, count = interval_positionals(files, interval, count)
    if timestamp and not interval:
        raise click.UsageError("-T stamps --interval summaries: give an interval")
    if timestamp and fmt != "table":
        raise click.UsageError("-T stamps the table; json and csv carry each interval's start_ts and end_ts")
    if count and not interval:
        raise click.UsageError("--count needs --interval")
    sources = list(files) or ["-"]
    if sources == ["-"] and sys.stdin.isatty():
        raise PstateError("standard input is a terminal, not a stream", ExitCode.USAGE,
                          hint="pipe one in (pstate record | pstate stats) or give a file")
    if _is_snapshot_input(sources):
        ctx.exit(_snapshots(sources, fmt=fmt, top=top, by=by, strict=strict, interval=interval,
                            ignored={"--hist": hist, "--matrix": with_matrix, "--sort": sort_key,
                                     "--in-state": in_states, "--min-time": min_time, "--stacks": stack_states,
                                     "--wakers": wakers, "--antagonists": antagonists,
                                     "the event filters": filt.active}))
    why = _why_options(by, stack_states, wakers, antagonists, fmt, interval)
    opts = dict(states=tuple(dict.fromkeys(in_states)), min_dur_ns=min_time, sort=sort_key, top=top,
                hist=hist, with_matrix=with_matrix or (fmt == "dot" and not wakers), fmt=fmt,
                timestamp=timestamp, why=why)
    out = sys.stdout
    stats = ReadStats()
    agg = timeinstate.Aggregator(by if by in timeinstate.BY_KEYS else "pid")
    with PipeInterruptGuard(sources):
        if why:
            code = _run_why(sources, agg, stats, out, strict=strict, opts=opts, by=by, reader=reader, filt=filt)
        elif interval:
            code = _run_intervals(sources, agg, stats, out, strict=strict, interval_ns=interval,
                                  count=count, opts=opts, filt=filt)
        else:
            code = _run_once(sources, agg, stats, out, strict=strict, reader=reader, opts=opts,
                             jobs=jobs or _cpus(), filt=filt)
    ctx.exit(code)


def interval_positionals(files: tuple, interval, count) -> tuple[tuple, int | None, int | None]:
    """BCC's [interval [count]]: leading arguments that are numbers and not
    existing files become --interval and --count (unless those were given)."""
    files = list(files)
    lead = []
    while files and len(lead) < 2 and _number(files[0], first=not lead) and not os.path.exists(files[0]):
        lead.append(files.pop(0))
    if not lead:
        return tuple(files), interval, count
    if interval is not None or (len(lead) == 2 and count is not None):
        raise click.UsageError(f"{' '.join(lead)}: give the interval either as a number or with --interval, not both")
    interval = Duration("s", positive=True).convert(lead[0], None, None)
    if len(lead) == 2:
        count = click.IntRange(min=1).convert(lead[1], None, None)
    return tuple(files), interval, count


def _number(text: str, first: bool) -> bool:
    """An interval (5, 0.5, 500ms) or, after it, a count (5)."""
    if not first:
        return text.isdigit()
    try:
        parse_ns(text)
    except ValueError:
        return False
    return True


# --- whole input ---------------------------------------------------------------


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _run_once(sources, agg, stats, out, *, strict, reader, opts, jobs=1, filt=None) -> int:
    interrupted = False
    try:
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
        name = STATE_LETTERS.get(part) or (part if part in schema.STATES else None)
        if not name:
            raise click.BadParameter(f"{part!r} is not a state (letters such as D or S, or names such as "
                                     "uninterruptible)", param_hint="'--stacks'")
        out.add(name)
    return frozenset(out)


def _run_why(sources, agg, stats, out, *, strict, opts, by, reader, filt) -> int:
    """The whole input through the one reader: the Aggregator and the Causes
    read the same rows and records (causes.digest)."""
    why = opts["why"]
    found = causes.Causes(by, stacks=why["stacks"], wakers=why["wakers"], antagonists=why["antagonists"])
    interrupted = False
    try:
        causes.digest(sources, agg, found, stats, strict=strict, use_native=reader == "fast", chunk=FILE_CHUNK,
                      filt=filt)
    except KeyboardInterrupt:
        interrupted = True
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
        rep = tables.build_report(summary, [])
        groups = whytables.reason_groups(found, **{**kw, "top": None})
        rep["by"] = by
        rep["accounting"]["groups"] = len(groups)
        rep["groups"] = groups[:opts["top"]] if opts["top"] else groups
        rep["accounting"]["groups_shown"] = len(rep["groups"])
        rep["why"] = {"stacks": why["stacks"], "wakers": why["wakers"], "antagonists": why["antagonists"],
                      "stack_records": found.has_stacks, "rows_per_group": None}
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
        text = whytables.render_reason_table(rep)
    else:
        text = tables.render_table(rep, hist=opts["hist"], with_matrix=opts["with_matrix"])
        text += "\n".join(whytables.render_tables(rep)) + "\n"
    out.write(text)
    out.flush()


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
        text = tables.render_table(rep, hist=opts["hist"], with_matrix=opts["with_matrix"])
        if banner:
            text = banner + "\n" + text
    out.write(text)
    out.flush()


# --- --interval ----------------------------------------------------------------


def _run_intervals(sources, agg, stats, out, *, strict, interval_ns, count, opts, filt=None) -> int:
    """Per-interval summaries. Pipes and terminals tick on the wall clock
    (the interval fires even when nothing arrives); regular files tick on
    the recorded time."""
    runner = IntervalRunner(agg, stats, out, interval_ns=interval_ns, count=count, opts=opts, filt=filt)
    interrupted = False
    try:
        for src in sources:
            if runner.done:
                break
            if _is_regular(src):
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


class IntervalRunner:
    def __init__(self, agg, stats, out, *, interval_ns, count, opts, filt=None):
        self.agg = agg
        self.filt = filt
        self.stats = stats
        self.out = out
        self.interval_ns = interval_ns
        self.count = count
        self.opts = opts
        self.seq = 0
        self.done = False
        self.live = False  # a pipe was read: intervals on the wall clock
        self.t0: int | None = None  # data-time start of the current interval
        self.mark = stats.mark()  # the input counts when the current interval began
        self.next_wall = time.monotonic() + interval_ns / 1e9
        self.dig = ingest.LineDigester(agg, stats, strict=False, filt=filt)

    def window_start(self) -> int | None:
        if self.t0 is not None:
            return self.t0
        if self.agg.clip_ts is not None:  # a cut stream's window_begin_ts
            return self.agg.clip_ts
        metas = [m.get("ts") for m in self.stats.metas if type(m.get("ts")) is int]
        return min(metas) if metas else self.agg.first_ts()

    def tick(self, end_ts: int | None = None, final: bool = False, interrupted: bool = False) -> None:
        """Print the interval ending at end_ts (data time), start the next."""
        self.agg.sync()
        start = self.window_start()
        if end_ts is None:
            end_ts = self._now_ts(start)
        if final and self.seq and not self.agg.events and (end_ts is None or end_ts == start):
            return  # nothing since the last summary
        self.seq += 1
        summary = self.agg.summarise(self.stats.since(self.mark), start_ts=start, end_ts=end_ts)
        self.mark = self.stats.mark()
        summary.interval = {"seq": self.seq, "start_ts": start, "end_ts": end_ts}
        summary.interrupted = interrupted
        _emit(summary, self.out, self.opts, banner=self._banner(summary))
        if end_ts is not None:
            self.t0 = end_ts
            self.agg.start_interval(end_ts)
        if self.count and self.seq >= self.count:
            self.done = True

    def finish(self) -> None:
        """The last summaries: for files (recorded time), every whole
        interval up to the stream's end record, then the partial one; for a
        live stream, the partial one."""
        end = self.end_ts()
        if end is not None and self.t0 is not None and not self.live:
            while end > self.t0 + self.interval_ns and not self.done:
                self.tick(end_ts=self.t0 + self.interval_ns)
        if not self.done:
            self.tick(end_ts=end, final=True)

    def end_ts(self) -> int | None:
        """Where the stream said it ended (its end records), if it did."""
        ends = [e.get("ts") for e in self.stats.ends if type(e.get("ts")) is int]
        if not ends:
            return None
        last = self.agg.last_ts()
        return max(ends + ([last] if last is not None else []))

    def _now_ts(self, start) -> int | None:
        """The current time in the stream's clock: the live monotonic clock
        when the stream comes from this boot, else the last event seen."""
        last = self.agg.last_ts()
        meta = self.stats.metas[-1] if self.stats.metas else None
        if meta and not meta.get("replayed") and meta.get("boot_id") and meta.get("boot_id") == boot_id():
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            return max(now, last or 0, start or 0)
        if last is None:
            return start
        return max(last, start or last)

    def _banner(self, summary) -> str | None:
        meta = self.stats.metas[0] if self.stats.metas else {}
        wall = None
        if type(meta.get("wall_ns")) is int and type(meta.get("ts")) is int and summary.end_ts is not None:
            wall = meta["wall_ns"] + (summary.end_ts - meta["ts"])
        elif self.opts.get("timestamp"):
            wall = time.time_ns()
        return tables.interval_banner(wall)

    # A regular file: intervals of recorded time, exact at record granularity.
    def file(self, src: str, *, strict: bool) -> None:
        agg = self.agg
        for rec in read_records([src], self.stats, strict=strict, filt=self.filt):
            t = rec["type"]
            if t == "meta":
                agg.begin_window(rec)  # a cut stream: clipped to its window
            if t in ("process", "cgroup"):
                agg.add_record(rec)  # (--by title and the like)
                continue
            if t != "state" and t not in timeinstate.LIFECYCLE:
                continue
            ts = rec["ts"]
            if self.t0 is None:
                self.t0 = self.window_start() if self.stats.metas else ts
            while ts >= self.t0 + self.interval_ns:
                self.tick(end_ts=self.t0 + self.interval_ns)
                if self.done:
                    return
            agg.add_record(rec)

    # A pipe or a terminal: wall-clock intervals, select() so they fire with no input.
    def stream(self, src: str, *, strict: bool) -> None:
        self.live = True
        fp = open_input(src, decompress=False)  # select() and os.read on its descriptor
        fd = fp.fileno()
        dig = self.dig
        dig.strict = strict
        dig.begin("<stdin>" if src == "-" else src)
        try:
            while not self.done:
                timeout = max(0.0, self.next_wall - time.monotonic())
                ready, _w, _x = select.select([fd], [], [], timeout)
                if ready:
                    data = os.read(fd, CHUNK)
                    if not data:
                        dig.end()
                        return
                    dig.feed(data)
                if time.monotonic() >= self.next_wall:
                    self.next_wall += self.interval_ns / 1e9
                    if self.next_wall < time.monotonic():  # we fell behind: skip, don't burst
                        self.next_wall = time.monotonic() + self.interval_ns / 1e9
                    self.tick()
        finally:
            if fp is not sys.stdin.buffer:
                fp.close()


# --- inputs ---------------------------------------------------------------------


def _is_regular(src: str) -> bool:
    try:
        st = os.fstat(sys.stdin.fileno()) if src == "-" else os.stat(src)
    except (OSError, ValueError):
        return False
    return statmod.S_ISREG(st.st_mode)


def _is_pipe(src: str) -> bool:
    try:
        st = os.fstat(sys.stdin.fileno()) if src == "-" else os.stat(src)
    except (OSError, ValueError):
        return False
    return statmod.S_ISFIFO(st.st_mode) or statmod.S_ISSOCK(st.st_mode)


class PipeInterruptGuard:
    """While reading a pipe, the first SIGINT is ignored: Ctrl-C reaches the
    whole pipeline, and `pstate record` answers it by writing its trailer and
    closing the pipe, after which stats prints the summary. A second SIGINT
    stops reading at once (KeyboardInterrupt, caught by the caller)."""

    def __init__(self, sources):
        self.active = any(_is_pipe(s) for s in sources)
        self.hits = 0
        self.old = None

    def _handler(self, signum, frame):
        self.hits += 1
        if self.hits >= 2:
            raise KeyboardInterrupt

    def __enter__(self):
        if self.active:
            try:
                self.old = signal.signal(signal.SIGINT, self._handler)
            except ValueError:  # not the main thread
                self.active = False
        return self

    def __exit__(self, *exc):
        if self.active and self.old is not None:
            signal.signal(signal.SIGINT, self.old)
        return False


def _is_snapshot_input(sources) -> bool:
    flags = [snapdir.is_snapshot_source(s) for s in sources]
    if any(flags) and not all(flags):
        raise PstateError("cannot mix snapshots and event streams in one run", ExitCode.USAGE,
                          hint="run pstate stats once on the snapshots and once on the streams")
    return bool(flags) and all(flags)


def _snapshots(paths, *, fmt, top, by, strict, interval, ignored) -> int:
    if interval:
        raise PstateError("--interval reads a stream; snapshots are already per interval", ExitCode.USAGE)
    from pstate.analysis import snapseries

    unused = [name for name, val in ignored.items() if val]
    if unused:
        print(f"{PROG}: warning: {', '.join(unused)} not used with snapshots", file=sys.stderr)
    return snapseries.run(list(paths), fmt=fmt, top=top, by=by, out=sys.stdout, strict=strict)

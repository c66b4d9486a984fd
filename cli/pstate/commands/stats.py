"""pstate stats: Thread State Analysis of a stream, a recording or snapshots."""

from __future__ import annotations

import os
import sys

import click

from pstate.analysis import selection, timeinstate
from pstate.commands.options import StateName, read_filter_options
from pstate.engines.stats import stats
from pstate.exitcodes import ExitCode, PstateError
from pstate.render import tables, whytables
from pstate.stream import schema
from pstate.stream.durations import Duration, parse_ns

FORMATS = ("table", "json", "csv", "dot", "folded")
BY_CHOICES = timeinstate.BY_KEYS + ("reason",)

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
    opts = dict(states=tuple(dict.fromkeys(in_states)), min_dur_ns=min_time, sort=sort_key, top=top,
                hist=hist, with_matrix=with_matrix or (fmt == "dot" and not wakers), fmt=fmt,
                timestamp=timestamp, why=None)
    ignored = {"--hist": hist, "--matrix": with_matrix, "--sort": sort_key, "--in-state": in_states,
               "--min-time": min_time, "--stacks": stack_states, "--wakers": wakers, "--antagonists": antagonists,
               "the event filters": filt.active}
    ctx.exit(stats(sources, by=by, interval=interval, count=count, strict=strict, reader=reader, jobs=jobs,
                   filt=filt, opts=opts, why=(stack_states, wakers, antagonists), ignored=ignored))


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

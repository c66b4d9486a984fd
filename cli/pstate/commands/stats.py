"""pstate stats: Thread State Analysis of a stream, a recording or snapshots."""

from __future__ import annotations

import os
import sys

import click

from pstate.analysis import selection, timeinstate
from pstate.commands.options import ByKey, Command, StateName, read_filter_options
from pstate.engines.stats import stats
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream import schema
from pstate.stream.durations import Duration, parse_ns

FORMATS = ("table", "json", "csv", "dot", "folded")
BY_CHOICES = timeinstate.BY_KEYS + ("reason",)
# The why views and the arguments that ask for each: every --by key works with every one
WHY_VIEWS = {"stacks": ("--stacks",), "wakers": ("--wakers",), "antagonists": ("--antagonists",),
             "folded": ("-f", "folded")}

EPILOG = """\b
Examples:
  sudo pstate record | pstate stats          summary when record ends
  pstate stats rec.jsonl                     per process: time in states
  pstate stats rec.jsonl --by tid --hist     per thread, log2 histograms
  pstate stats rec.jsonl --by all --hist     system-wide, as runqlat prints
  pstate stats rec.jsonl --in-state D --top 5
                                             the 5 processes most in D
  pstate stats rec.jsonl --sort runq-p99     worst run-queue waits first
  pstate stats rec.jsonl -c nginx --by tid   the nginx threads, per thread
  pstate stats rec.jsonl --matrix            transition counts, mean times
  pstate stats rec.jsonl --top 1 --format dot | dot -Tsvg > states.svg
  sudo pstate record | pstate stats --interval 1 --count 10
  pstate stats /var/lib/pstate/              snapshots (from pstate snap)
  sudo pstate record --stacks -d 10 -o rec.jsonl
  pstate stats rec.jsonl --stacks=D --top 3  the 3 stacks most time in D
  pstate stats rec.jsonl --by reason         blocked time by reason
  pstate stats rec.jsonl -f folded | flamegraph.pl > offcpu.svg
  pstate stats rec.jsonl --wakers -f dot | dot -Tsvg > wakeups.svg
  pstate stats rec.jsonl --by tid --antagonists
                                             who held the CPU meanwhile

More in man pstate-stats; the JSON report's fields in man 5 pstate-events.
"""


def _sort_help() -> str:
    keys = ", ".join(k for k in selection.SORT_KEYS if k not in schema.STATES)
    return (f"Order groups by KEY (descending; key and comm ascending): {keys}, or a state name "
            "(time in it). Default: time in the --in-state states, else time running.")


@click.command(name="stats", epilog=EPILOG, cls=Command)
@click.argument("files", nargs=-1, type=click.Path(allow_dash=True), metavar="[INTERVAL [COUNT]] [FILE]...")
@click.option("--by", type=ByKey(BY_CHOICES), default="pid", show_default=True,
              help="Group by process (pid), thread (tid) or task name (comm); by what the recording's "
                   "process records say: cgroup (v2 path), unit (systemd unit), container (container id, "
                   "pod), title (the role: a title less its volatile part; title:REGEX, REGEX's group) or "
                   "ppid (parent); all: every task in one group (with "
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
              help="Output format: table (the terminal's width), json, csv, dot (Graphviz: the state graph; with "
                   "--wakers, the wake-up graph) or folded (blocked time by stack, in microseconds, for "
                   "flamegraph.pl, speedscope or inferno; implies --stacks).")
@click.option("--wide", is_flag=True, help="Tables: cut no title, path or frame (else they fit the terminal).")
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
        wide, fmt, interval, count, timestamp, strict, jobs, reader, filt):
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
                timestamp=timestamp, why=None, wide=wide)
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

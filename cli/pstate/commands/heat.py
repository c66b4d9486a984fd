"""pstate heat: terminal heat maps of task states and latencies, from a
recording, a stream, or a snapshot directory; --live redraws in place."""

from __future__ import annotations

import os
import sys

import click

from pstate.analysis import services
from pstate.commands.options import ByKey, Choice, RenamedCommand, StateName, read_filter_options
from pstate.engines.heat import heat
from pstate.exitcodes import ExitCode, PstateError
from pstate.render import heatmodel as hm
from pstate.stream.durations import Duration

EPILOG = """\b
Examples:
  pstate heat rec.jsonl                    dominant state per thread
  pstate heat rec.jsonl --by pid --top 10  the 10 busiest processes
  pstate heat rec.jsonl --shade D          share of each bucket in D
  pstate heat rec.jsonl --latency          run-queue latency (log2 rows)
  pstate heat rec.jsonl --latency=D        how long D sleeps lasted, when
  pstate heat rec.jsonl --bucket 100ms     fixed buckets, wrapped in bands
  pstate heat /var/lib/pstate --shade D    processes x snapshots, time in D
  sudo pstate record | pstate heat --live  live dashboard, Ctrl-C or q quits
  pstate replay rec.jsonl --speed 10 | pstate heat --live --window 30s
  pstate heat rec.jsonl --no-color | less  plain ASCII glyphs

\b
Glyphs: # running  + runnable  ! preempted  . sleeping  D uninterruptible
  T stopped  t traced  Z zombie  X dead  P parked  I idle  n new  ? unknown
  ' ' not seen; intensity ramp " .:-=+*#%@" (low to high).
"""


class MeasureChoice(Choice):
    """--latency's optional value; says how to fix `--latency FILE`."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.lower() in ("s", "d"):
            value = value.upper()
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            if isinstance(value, str) and (os.path.exists(value) or value == "-"):
                self.fail(f"{value!r} is not a measure; it looks like an input: put inputs before "
                          f"--latency, or write --latency=runq", param, ctx)
            raise


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]},
               cls=RenamedCommand, renamed={"-n": "--top"})
@click.argument("inputs", nargs=-1, type=click.Path(allow_dash=True), metavar="[FILE|DIR]...")
@click.option("--latency", type=MeasureChoice(list(hm.MEASURES), case_sensitive=False), is_flag=False,
              flag_value="runq", default=None, metavar="[MEASURE]",
              help="Draw a latency heat map instead: x = time, y = log2 duration, shade = count. "
                   "MEASURE: runq (run-queue wait, the default), preempt (wait after preemption), "
                   "wait (both), blocked (S or D), S, D, oncpu (on-CPU slices).")
@click.option("--shade", "shade", type=StateName(), default=None, metavar="STATE",
              help="Shade each cell by the share of the bucket spent in STATE (e.g. D, preempted) "
                   "instead of showing the dominant state; rows are the tasks with the most of it. "
                   "For a snapshot directory: the measure drawn (default running).")
@click.option("--by", type=ByKey(["tid", "pid", "comm", *services.BY_KEYS]), default=None,
              help="One row per thread, process or command name, or per cgroup, unit, container, "
                   "process title (its role; title:REGEX, REGEX's group) or parent, from the "
                   "recording's process records (a snapshot's "
                   "rows; by cgroup, unit and container, a state record's own cgroup where it has one, "
                   "so an interval is drawn in the row of the record that ends it) "
                   "[default: tid; pid for snapshots].")
@click.option("--top", type=click.IntRange(1, 10000), default=None, metavar="N",
              help="Show the N most active rows (busy time: all but sleeping, idle, parked) "
                   "[default: what fits the terminal, or 20].")
@click.option("--bucket", type=Duration("s"), default=None, metavar="DURATION",
              help="Width of a time bucket, e.g. 100ms [default: fit the data to the width]. "
                   "A map wider than the terminal is printed in bands.")
@click.option("--width", type=click.IntRange(30, 2000), default=None, metavar="COLUMNS",
              help="Draw for this many columns [default: the terminal's, or 80].")
@click.option("--height", type=click.IntRange(8, 2000), default=None, metavar="LINES",
              help="Fit the map into this many lines [default: the terminal's when it is one].")
@click.option("--color", "color", type=click.Choice(["auto", "always", "never", "256", "truecolor"]),
              default="auto", show_default=True,
              help="Colour the cells behind their glyphs (the same glyphs as without colour) with ANSI codes: "
                   "auto = on a terminal unless NO_COLOR is set; "
                   "256 or truecolor force that palette (always picks truecolor when "
                   "COLORTERM says so).")
@click.option("--no-color", is_flag=True, help="The glyphs without colour, same as --color never.")
@click.option("--live", is_flag=True,
              help="Read a stream and redraw in place over a sliding window until the input ends "
                   "or Ctrl-C / q. From a recording made with record --stacks, a row with D time shows "
                   "its top reason (most D time in the window) beside it. Example: "
                   "sudo pstate record --stacks | pstate heat --live.")
@click.option("--window", type=Duration("s"), default="10s", show_default=True, metavar="DURATION",
              help="With --live: how much time the map shows.")
@click.option("--refresh", type=click.FloatRange(0.2, 60), default=4.0, show_default=True, metavar="HZ",
              help="With --live: frames per second.")
@read_filter_options
@click.option("--strict", is_flag=True,
              help="Exit non-zero (65) on any malformed, truncated or skipped input line.")
def cli(inputs, latency, shade, by, top, bucket, width, height, color, no_color, live, window, refresh,
        filt, strict):
    """Draw terminal heat maps of task states and latencies.

    The state map has one row per task and one column per time bucket; each
    cell shows the state the task spent most of that bucket in (running,
    runnable, preempted, sleeping, D, ...). The latency map (--latency) shows
    how many waits of each log2 duration ended in each bucket. From a snapshot
    directory (pstate snap --dir DIR) rows are processes (or, with --by, what
    each row says of its process: its title, cgroup, unit, container, and
    its parent when rows carry ppid) and columns are snapshots; --cgroup and
    --title match the rows' own cgroup and title. Input: recordings, a
    stream on standard input, or a directory.
    """
    if latency and shade:
        raise PstateError("--latency and --shade draw different maps; pick one", ExitCode.USAGE)
    sys.exit(heat(list(inputs), latency=latency, shade=shade, by=by, top=top, bucket=bucket, width=width,
                  height=height, color="never" if no_color else color, live_view=live, window=window,
                  refresh=refresh, filt=filt, strict=strict))

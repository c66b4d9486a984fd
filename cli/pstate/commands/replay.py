"""pstate replay: re-emit a recording (or snapshots) as a live stream."""

from __future__ import annotations

import sys

import click

from pstate.commands.options import input_options, output_options, read_filter_options
from pstate.engines.replay import replay
from pstate.stream.filters import Filter
from pstate.stream.timewindow import TimePointType, Window, WindowError

EPILOG = """\b
Examples:
  pstate replay rec.jsonl | pstate heat --live       at the recorded pace
  pstate replay rec.jsonl --speed 10 | pstate heat --live
  pstate replay rec.jsonl -b +30s -e +45s | pstate stats
  pstate replay rec.jsonl -b 12:00:05 -e 12:01 --no-wait > noon.jsonl
  pstate replay rec.jsonl --no-wait -p 1234 --state D
  pstate replay /var/lib/pstate --speed 60           snapshots, 1 min per s
  sudo pstate record | pstate replay -c nginx        filter a live stream
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), metavar="N",
              help="Play N times faster than recorded (0.5: half speed). Default: 1, the original pace.")
@click.option("--no-wait", is_flag=True, help="Write everything as fast as possible, without pauses.")
@click.option("-b", "--begin", type=TimePointType(), metavar="TIME",
              help="Start at this time: +30s after the start, or a wall-clock time (see below).")
@click.option("-e", "--end", type=TimePointType(), metavar="TIME",
              help="Stop before this time, in the same forms as --begin.")
@read_filter_options
@output_options
@input_options
def cli(speed, no_wait, begin, end, filt: Filter, output, unbuffered, files, strict):
    """Re-emit a recording as a stream, at its original pace or faster.

    Reads recordings (FILES one after another, or standard input) or the
    snapshot directory of pstate snap, and writes the same format: each meta
    header marked "replayed": true with the original fields kept, the events
    as they were, the original loss records, and a new end trailer. Whatever
    reads a live stream works the same on a recording.

    Events keep their original spacing, divided by --speed; snapshots keep
    the spacing of their interval ends. The filters select events exactly as
    record's do, so `record -p X` and `record | replay -p X` give the same
    events; without any filter every event is kept, idle tasks included.
    """
    if speed is not None and no_wait:
        raise click.UsageError("--speed and --no-wait cannot be used together")
    window = Window(begin, end)
    try:
        window.check()
    except WindowError as e:
        raise click.UsageError(str(e)) from None
    if not files and sys.stdin.isatty():
        raise click.UsageError("no input: give a recording file or a snapshot directory, or pipe a stream in")
    sys.exit(replay(files, speed=None if no_wait else (speed or 1.0), window=window, filt=filt, output=output,
                    unbuffered=unbuffered, strict=strict))

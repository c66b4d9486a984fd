"""pstate export: a recording as a trace for Perfetto's UI or chrome://tracing."""

from __future__ import annotations

import sys

import click

from pstate.commands.options import input_options, read_filter_options
from pstate.engines.export import export

FORMATS = ("perfetto", "chrome")

EPILOG = """\b
Examples:
  pstate export rec.jsonl -o rec.pftrace            for ui.perfetto.dev
  pstate export rec.jsonl -f chrome -o rec.json     for chrome://tracing
  sudo pstate record -d 10 | pstate export -o live.pftrace
  pstate replay rec.jsonl -b +30s -e +40s --no-wait | pstate export -o cut.pftrace

\b
Open a Perfetto trace at https://ui.perfetto.dev with "Open trace file":
CPU tracks show which thread ran where, each thread has a state track
(Running, Runnable, Runnable (Preempted), Sleeping, Uninterruptible Sleep,
Stopped, ...), and wake-ups draw arrows. A recording made with task, CPU,
state or duration filters, or sampled by --max-rate, does not hold every
switch of a CPU: it is exported as one track of state slices per thread
instead, and the export says so. Loss, sampling and end records appear as
instants on a "pstate" track.

--format chrome writes trace-event JSON: one slice per state interval of each
thread (the time stats counts; in its args the cgroup of the record that ends
it, where that record has one), thread and process names as metadata.

The perfetto format needs the optional extra: pip install 'pstate[perfetto]'
(make setup installs it). Exit status: 0 done, 2 bad usage, 65 bad input with
--strict or a newer event format, 66 unreadable input, 73 the output cannot
be created, 74 writing failed, 77 the output is a link or another user's file.
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-f", "--format", "fmt", type=click.Choice(FORMATS), default="perfetto", show_default=True,
              help="perfetto: a Perfetto protobuf trace; chrome: Chrome trace-event JSON.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default=None, metavar="FILE",
              help="Write to FILE instead of standard output.")
@click.option("-q", "--quiet", is_flag=True, help="No progress and no notes on stderr (warnings stay).")
@read_filter_options
@input_options
def cli(fmt, output, quiet, files, strict, filt):
    """Export a recording as a trace for Perfetto or chrome://tracing.

    Reads recordings (FILES one after another, or standard input) through the
    same reader as stats, heat and replay, and writes one trace, streaming:
    memory depends on the number of threads and CPUs, not on the length of
    the recording. The filters are record's (-p, -t, -c, --cpu, --state,
    --min-dur): the trace holds only the events they pass.
    """
    if not files and sys.stdin.isatty():
        raise click.UsageError("no input: give a recording file, or pipe a stream in")
    sys.exit(export(files, fmt=fmt, output=output, quiet=quiet, strict=strict, filt=filt))

"""pstate export: a recording as a trace for Perfetto's UI or chrome://tracing."""

from __future__ import annotations

import sys

import click

from pstate.commands.options import input_options, read_filter_options
from pstate.engines.export import export

FORMATS = ("perfetto", "chrome")

EPILOG = """\b
Examples:
  pstate export rec.jsonl -o rec.pftrace         for ui.perfetto.dev
  pstate export rec.jsonl -f chrome -o rec.json  for chrome://tracing
  sudo pstate record -d 10 | pstate export -o live.pftrace
  # seconds 30 to 40 of a recording
  pstate replay rec.jsonl -b +30s -e +40s --no-wait \\
      | pstate export -o cut.pftrace
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
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

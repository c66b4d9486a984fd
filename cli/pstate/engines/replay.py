"""replay: recordings, or the snapshots of a directory, written again as a
stream at their pace or faster (stream.replayer.Replayer). replay(), the one
entry, is what `pstate replay` runs: commands/replay.py declares and checks
the options."""

from __future__ import annotations

import os
import sys

import click

from pstate import lifecycle
from pstate.exitcodes import ExitCode, PstateError
from pstate.snapshots import snapdir
from pstate.stream.filters import Filter
from pstate.stream.replayer import Replayer
from pstate.stream.streamio import LineWriter, ReadStats, silence_stdout
from pstate.stream.timewindow import Window

PROG = "pstate replay"
SNAPSHOT_GLOB = "pstate-snap-*.jsonl"


def replay(files: tuple, *, speed: float | None, window: Window, filt: Filter, output: str | None,
           unbuffered: bool, strict: bool) -> int:
    """Replay the files (standard input without any; speed None: no
    waiting); the exit status."""
    sources = resolve_sources(files)
    if filt.active and any(snap for _p, snap in sources):
        raise click.UsageError("filters select events of recordings; they do not apply to snapshot directories")
    if output and output != "-" and any(_same_file(output, p) for p, _s in sources if p != "-"):
        raise click.UsageError(f"the output {output} is also an input")
    if any(s in lifecycle.STOPPING for s in lifecycle.peek()):
        lifecycle.take()
        return int(ExitCode.OK)  # stopped before it began (a normal end): no output made

    stats = ReadStats()
    writer = LineWriter(output, unbuffered=unbuffered)
    rep = Replayer(writer, speed=speed, filt=filt, window=window, strict=strict, stats=stats)
    try:
        # a signal ends the replay between two records (at once while it
        # sleeps or waits for input), and the trailer is written
        with lifecycle.handled(rep.on_signal):
            rep.run(sources)
        writer.close(sync=bool(output and output != "-"))
        lifecycle.done()
    except BrokenPipeError:
        # `pstate replay rec.jsonl | head`: the reader has all it wanted.
        if not writer.owned:
            silence_stdout()
        return int(ExitCode.OK)
    except OSError as e:
        raise PstateError(f"writing {output or 'standard output'} failed: {e.strerror or e}",
                          ExitCode.IOERR) from None
    note = rep.window_note()
    if note:
        print(f"{PROG}: warning: {note}", file=sys.stderr)
    return stats.report(PROG, strict=strict, lost=False)  # its loss records are in the output


def resolve_sources(files: tuple[str, ...]) -> list[tuple[str, bool]]:
    """(path, is_snapshot) for every input, checked before anything is written."""
    sources: list[tuple[str, bool]] = []
    for f in files or ("-",):
        if f != "-" and os.path.isdir(f):
            snaps = snapdir.list_dir(f)
            if not snaps:
                raise PstateError(f"{f} holds no snapshots ({SNAPSHOT_GLOB})", ExitCode.NOINPUT,
                                  hint="give a recording file, or the --dir directory of pstate snap")
            sources += [(p, True) for p in snaps]
            continue
        if f != "-" and not os.path.exists(f):
            raise PstateError(f"cannot open {f}: No such file or directory", ExitCode.NOINPUT)
        sources.append((f, False))
    return sources


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False




"""export: recordings read through the one reader and written as one trace
for Perfetto or chrome://tracing (render.traceexport), streaming; a file is
written aside and renamed into place at the end. export(), the one entry,
is what `pstate export` runs: commands/export.py declares the options."""

from __future__ import annotations

import os
import sys
import time

import click

from pstate import lifecycle
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream import outfiles
from pstate.stream.reader import StreamReader, feed_sources
from pstate.stream.streamio import ReadStats

PROG = "pstate export"


def export(files: tuple, *, fmt: str, output: str | None, quiet: bool, strict: bool, filt) -> int:
    """Export the files (standard input without any) as one trace; the exit status."""
    stats = ReadStats()
    feed = _Feed(lambda metas: make_writer(fmt, fp, metas))
    rd = StreamReader(feed, stats, strict=strict, native_rows=True, wide=True, filt=filt)
    reading = feed_sources(rd, files or ("-",), stats)
    with lifecycle.interruptible():  # (a pipe may keep it waiting: Ctrl-C ends it at once)
        next(reading, None)  # the first chunk: an unreadable input is found before the output is made
    fp, out = _open_output(output, fmt)
    progress = Progress(not quiet and sys.stderr.isatty())
    done = False
    try:
        with lifecycle.interruptible():
            feed.go()
            for _ in reading:
                progress.tick(feed.n)
        writer = feed.open()
        with lifecycle.interruptible():
            writer.close()
        with lifecycle.finishing():  # the trace is published whole, or not at all
            _finish(fp, out)
            done = True
    except BrokenPipeError:
        from pstate.stream.streamio import silence_stdout

        silence_stdout()
        return int(ExitCode.OK)
    except OSError as e:
        left = f"; {output} was left as it was (no partial trace)" if out is not None and out.tmp is not None \
            else ""
        raise PstateError(f"writing {output or 'standard output'} failed: {e.strerror or e}{left}",
                          ExitCode.IOERR) from None
    finally:
        progress.done()
        if not done:
            _abandon(fp, out)
    why, sampled = feed.why, feed.sampled
    if why and not quiet:
        print(f"{PROG}: note: no CPU tracks, thread tracks only: {why}", file=sys.stderr)
    if sampled and fmt == "perfetto" and not why:
        print(f"{PROG}: warning: the recording was sampled (--max-rate) part of the time: "
              "CPU tracks miss switches from then on", file=sys.stderr)
    odd = getattr(writer, "out_of_range", 0)
    if odd:
        from pstate.render.traceexport import INT32_MAX

        print(f"{PROG}: warning: left out {odd} record{'s' if odd != 1 else ''} whose pid, tid or CPU is "
              f"beyond {INT32_MAX} (no task has one: is the input damaged?)", file=sys.stderr)
    unpaired = getattr(writer, "unpaired_switch_ins", 0)
    if unpaired and not quiet:
        print(f"{PROG}: note: {unpaired} switch-ins without the switch-out before them (lost events)",
              file=sys.stderr)
    return stats.report(PROG, strict=strict)


def _open_output(path: str | None, fmt: str):
    """(the output as a binary file object, its OutputFile or None for
    standard output); a terminal gets no protobuf. A file is written to a
    temporary file beside it and renamed over it at the end (_finish), so a
    failed export (a full disk, an error, a signal) leaves no partial trace
    and an earlier file of that name as it was; a FIFO or a device is
    written as it is. No link followed, other users' files refused."""
    if path is None or path == "-":
        if sys.stdout.isatty() and fmt == "perfetto":
            raise click.UsageError("a Perfetto trace is binary: give -o FILE, or redirect standard output")
        return sys.stdout.buffer, None
    out = outfiles.open_output(path, replace=True)
    return os.fdopen(out.fd, "wb", buffering=1 << 20, closefd=False), out


def _finish(fp, out) -> None:
    """Flush the output; publish a file (fsync, rename into place)."""
    fp.flush()
    if out is not None:
        fp.close()  # the descriptor stays open (closefd=False): publish() syncs and closes it
        outfiles.publish(out)


def _abandon(fp, out) -> None:
    """After a failure: what the buffer holds goes nowhere, the temporary
    file (only the one this run created) is removed."""
    if out is None or out.fd < 0:
        return  # standard output, or already closed (and abandoned) by publish()
    outfiles.silence(out.fd)
    try:
        fp.close()
    except (OSError, ValueError):
        pass
    outfiles.abandon(out)


class Progress:
    """Events exported so far, on a terminal's stderr, twice a second."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.start = self.last = time.monotonic()
        self.shown = False

    def tick(self, n: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.last < 0.5:
            return
        self.last = now
        rate = n / max(now - self.start, 1e-9)
        sys.stderr.write(f"\r{PROG}: {n:,} records, {rate:,.0f}/s")
        sys.stderr.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


class _Feed:
    """The sink of the export's StreamReader. Holds what comes until go()
    (the output is open); then the meta records that come first (they say
    whether every switch is there) until something else comes, when it
    makes the writer, start(metas) -> (writer, why no CPU tracks), and
    hands it everything, state rows in batches."""

    def __init__(self, start):
        self.start = start
        self.held: list | None = []  # records (dicts) and batches of rows (lists), until go()
        self.metas: list = []
        self.writer = None
        self.why = ""
        self.sampled = False  # a rate record said the recording was sampled
        self.n = 0  # records handed on

    def go(self) -> None:
        held, self.held = self.held, None
        for item in held:
            if type(item) is list:
                self.rows(item)
            else:
                self.record(item, 1)

    def open(self):
        if self.writer is None:
            self.writer, self.why = self.start(self.metas)
            for rec in self.metas:
                self._add(rec)
        return self.writer

    def rows(self, rows: list) -> None:
        if self.held is not None:
            self.held.append(rows)
            return
        self.open().rows(rows)
        self.n += len(rows)

    def record(self, rec: dict, weight: int) -> None:
        if self.held is not None:
            self.held.append(rec)
        elif self.writer is None and rec["type"] == "meta":
            self.metas.append(rec)
        else:
            self._add(rec)

    def _add(self, rec: dict) -> None:
        self.open().add(rec)
        self.n += 1
        if rec["type"] == "rate" and rec.get("sample_every", 1) != 1:
            self.sampled = True


def make_writer(fmt: str, fp, metas: list, rates: int = 0):
    from pstate.render import traceexport

    if fmt == "chrome":
        return traceexport.ChromeWriter(fp), ""
    try:
        import perfetto.trace_builder.proto_builder  # noqa: F401
    except ImportError as e:
        raise PstateError(f"--format perfetto needs the perfetto package ({e})", ExitCode.UNAVAILABLE,
                          hint="pip install 'pstate[perfetto]' (or: make setup)") from None
    complete, why = traceexport.cpu_complete(metas, rates)
    return traceexport.PerfettoWriter(fp, cpu_tracks=complete), why

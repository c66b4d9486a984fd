"""heat --live: the dashboard's loop. One thread: select() on the input
(and /dev/tty for the q key, and the signal helper's descriptor) with a
timeout that ends at the next frame. Input is read in large chunks and split
into lines; when processing takes most of the time, only one state record in
k is parsed ("sampling 1/k", doubled or halved every half second), so the
view stays current instead of lagging behind a fast stream. Records that are
rare and matter (entering D, T, Z, ...; fork, exec, exit; loss, meta, end)
are always parsed: only transitions into running, runnable, preempted and
sleeping are skipped, recognised by their bytes without parsing. Plainly
written state records are read by a C reader (pstate._digest.parse_states)
when it is built, and fed to the model in batches; PSTATE_PURE=1 reads them
with orjson instead, with the same results.

Ctrl-C, q, SIGTERM, SIGHUP (pstate.lifecycle) and the end of input end the
run; the terminal is restored (render.dashboard.Terminal) and the last frame
stays on the normal screen.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from pstate import lifecycle
from pstate.render import dashboard as dash_mod
from pstate.render import heatmodel as hm
from pstate.render.dashboard import LiveOptions
from pstate.stream.filters import Filter
from pstate.stream.reader import StreamReader, state_row
from pstate.stream.streamio import MAX_LINE, ReadStats

CHUNK = 1 << 17
MAX_SAMPLE = 1 << 12
REASON_KEY = b'"reason":'

__all__ = ["LiveOptions", "LiveResult", "Feeder", "run_live", "stderr_report"]


@dataclass
class LiveResult:
    """What a run did (for the benchmark and tests)."""

    code: int = 0
    reason: str = ""
    lines: int = 0
    parsed: int = 0
    frames: int = 0
    max_sample: int = 1
    elapsed: float = 0.0
    busy: float = 0.0  # CPU seconds spent reading and drawing
    stats: ReadStats = field(default_factory=ReadStats)


class _Stop(Exception):
    def __init__(self, reason: str, code: int):
        super().__init__(reason)
        self.reason = reason
        self.code = code


class Feeder:
    """Feeds a Window from input bytes through the one reader
    (reader.StreamReader and its rules). Plain state records (the bulk) go
    to the model in batches of state rows (Window.states), read by the
    native row reader (pstate._digest.parse_states) when it is built, else by the careful path,
    with the same results; other records one at a time, in order. k > 1:
    sampling, as StreamReader.k. The bulk reader stops before a line that
    names a reason (record --stacks' wake-ups): the careful path hands it
    out whole (dicts), for the reason column (Reasons), and its row joins
    the batches."""

    def __init__(self, model: hm.Window, stats: ReadStats, name: str, strict: bool, filt: Filter | None = None):
        self.model = model
        self.stats = stats
        self.name = name
        self.total = 0  # bytes received
        self.parsed = 0  # records read (sampled-over lines are not)
        self.reasons = hm.Reasons(model.keyf)
        self._pending: list = []  # rows of state records handed out whole
        # a line with a reason (record --stacks' wake-ups) is the careful path's
        self.reader = StreamReader(self, stats, strict=strict, max_line=MAX_LINE, native_rows=True, dicts=True,
                                   careful_keys=(REASON_KEY,), filt=filt)
        self.reader.begin(name)

    k = property(lambda self: self.reader.k, lambda self, v: setattr(self.reader, "k", v))
    n = property(lambda self: self.reader.lineno)  # lines seen
    tail = property(lambda self: self.reader.pending)
    discarding = property(lambda self: self.reader.discarding)

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        before = self.stats.records
        try:
            self.reader.feed(data)
        finally:  # an error (a newer schema, --strict) leaves what came before it in the model
            self._flush()
        self.parsed += self.stats.records - before

    def finish(self) -> None:
        """End of input: a last line without a newline is a record or the
        truncated final record, as for every reader."""
        before = self.stats.records
        try:
            self.reader.end()
        finally:
            self._flush()
        self.parsed += self.stats.records - before

    def rows(self, rows: list) -> None:
        self._flush()
        self._rows(rows, False)

    def _flush(self) -> None:
        if self._pending:
            rows, self._pending = self._pending, []
            self._rows(rows, False)

    def _rows(self, rows: list, filtered: bool) -> None:
        """State rows (reader.ROW_FIELDS) to the model, through the task
        filter unless filtered."""
        model = self.model
        filt = model.filt
        if filt is None:
            model.states(rows, model.skip_idle)
            return
        if not filtered:
            match = filt.match_state
            rows = [r for r in rows if match(r[1], r[2], r[3], r[7], r[4], r[5], r[6], r[9])]
        model.states(rows, False)

    def record(self, rec: dict, weight: int) -> None:
        if rec["type"] == "state":
            filt = self.model.filt
            if filt is None or filt.match(rec):
                self.reasons.note(rec)
            self._pending.append(state_row(rec, weight))
            return
        self._flush()
        if rec["type"] != "loss":  # (loss records are counted in the ReadStats)
            self.model.feed(rec, weight)


def _status(feeder: Feeder, rate: float, tasks: int, stats: ReadStats, ended: str | None, model: hm.Window) -> str:
    parts = [time.strftime("%H:%M:%S")]
    if ended:
        parts.append(f"input ended ({ended}): {feeder.n:,} lines")
    else:
        parts.append(f"{rate / 1000:.1f}k ev/s" if rate >= 1000 else f"{rate:.0f} ev/s")
    parts.append(f"{tasks} tasks")
    parts.append(f"lost {stats.lost:,}")
    if stats.n_skipped:
        parts.append(f"bad lines {stats.n_skipped:,}")
    if feeder.k > 1:
        parts.append(f"sampling 1/{feeder.k}")
    if model.input_sample_every > 1:
        parts.append(f"input sampled 1/{model.input_sample_every}")
    if not ended:
        parts.append("q or Ctrl-C to quit")
    return "  ".join(parts)


def run_live(in_fd: int, out_fd: int, opts: LiveOptions, tty: bool | None = None,
             stop_after: float | None = None) -> LiveResult:
    """Run the dashboard until the input ends or the user stops it."""
    tty = os.isatty(out_fd) if tty is None else tty
    cursor = tty and dash_mod.can_move_cursor()
    res = LiveResult()
    stats = res.stats
    dash = dash_mod.Dashboard(opts, out_fd, tty, cursor)
    idle = Filter(include_idle=opts.filt is not None and opts.filt.include_idle)  # the reader filters
    model = hm.Window(dash.bucket, dash.ncols, opts.by, idle, opts.measure)
    feeder = Feeder(model, stats, opts.name, opts.strict, filt=opts.filt)
    dash.reasons = feeder.reasons
    term = dash_mod.Terminal(out_fd, opts.keys) if cursor else None
    period = 1.0 / opts.refresh
    resized = []
    watching = tty and lifecycle.installed() and _main_thread()
    if watching:
        lifecycle.watch(signal.SIGWINCH)

    def signals() -> None:
        """The signals that came (pstate.lifecycle): Ctrl-C stops (0),
        SIGTERM and SIGHUP too (143, 129); SIGWINCH redraws at the new size."""
        for s in lifecycle.take():
            if s == signal.SIGWINCH:
                resized.append(1)
            elif s == signal.SIGINT:
                raise _Stop("interrupt", 0)
            elif s in lifecycle.STOPPING:
                raise _Stop("signal", lifecycle.code_of(s))

    t_start = time.monotonic()
    cpu = time.process_time
    busy = 0.0  # CPU seconds spent reading and drawing
    win_cpu, win_t, win_reads, win_pending = 0.0, t_start, 0, 0
    rate = 0.0
    rate_t, rate_lines = t_start, 0
    next_frame = t_start  # draw at once
    next_prune = t_start + 5.0
    try:
        if term:
            term.enter()
        while True:
            signals()
            now = time.monotonic()
            if now >= next_frame:
                c0 = cpu()
                if resized:
                    resized.clear()
                    dash.resized()
                if now - rate_t >= 1.0:
                    rate = (feeder.n - rate_lines) / (now - rate_t)
                    rate_t, rate_lines = now, feeder.n
                if now >= next_prune:
                    model.prune()
                    next_prune = now + 5.0
                dash.draw(dash.frame(model, lambda n: _status(feeder, rate, n, stats, None, model)))
                res.frames += 1
                used = cpu() - c0
                busy += used
                win_cpu += used
                now = time.monotonic()
                next_frame += period
                if next_frame < now:
                    next_frame = now + period
                if stop_after is not None and now - t_start >= stop_after:
                    raise _Stop("time", 0)
            # Decimation control, four times a second. Behind = input was
            # still waiting after every read: sample more sparsely (x4 when
            # the CPU is saturated, the backlog must go). Not behind and
            # mostly idle: sample more densely again.
            if opts.adaptive and now - win_t >= 0.25:
                load = win_cpu / (now - win_t)
                behind = win_reads >= 2 and win_pending == win_reads
                if behind and feeder.k < MAX_SAMPLE:
                    feeder.k = min(MAX_SAMPLE, feeder.k * (4 if load > 0.9 else 2))
                elif not behind and load < 0.4 and feeder.k > 1:
                    feeder.k //= 2
                model.sample_every = feeder.k
                res.max_sample = max(res.max_sample, feeder.k)
                win_cpu, win_t, win_reads, win_pending = 0.0, now, 0, 0
            fds = [in_fd] + ([term.key_fd] if term and term.key_fd is not None else [])
            if lifecycle.wakeup_fd() is not None:
                fds.append(lifecycle.wakeup_fd())  # a signal wakes the loop at once
            try:
                ready, _, _ = select.select(fds, [], [], max(0.0, next_frame - time.monotonic()))
            except InterruptedError:
                continue
            if term and term.key_fd is not None and term.key_fd in ready:
                try:
                    keys = os.read(term.key_fd, 64)
                except (BlockingIOError, InterruptedError):
                    keys = b""
                if b"q" in keys or b"Q" in keys:
                    raise _Stop("quit", 0)
            if in_fd in ready:
                c0 = cpu()
                # Read while input is waiting, until the next frame is due.
                while True:
                    try:
                        data = os.read(in_fd, CHUNK)
                    except (BlockingIOError, InterruptedError):
                        break
                    if not data:
                        feeder.finish()
                        raise _Stop("eof", 0)
                    feeder.feed(data)
                    win_reads += 1
                    more = select.select([in_fd], [], [], 0)[0]
                    if more:
                        win_pending += 1
                    if not more or time.monotonic() >= next_frame:
                        break
                used = cpu() - c0
                busy += used
                win_cpu += used
    except _Stop as stop:
        res.reason = stop.reason
        res.code = stop.code
    except KeyboardInterrupt:
        res.reason = "interrupt"
        res.code = 0
    finally:
        if term:
            term.restore()
        if watching:
            lifecycle.unwatch(signal.SIGWINCH)
    # The last frame stays on the normal screen.
    ended = {"eof": "end of input", "interrupt": "stopped", "quit": "stopped"}.get(res.reason, res.reason)
    dash.prev = []
    final = dash.frame(model, lambda n: _status(feeder, rate, n, stats, ended, model))
    try:
        dash_mod.write_all(out_fd, "\n".join(final) + "\n")
    except OSError:
        pass  # the terminal is gone (SIGHUP)
    res.lines = feeder.n
    res.parsed = feeder.parsed
    res.elapsed = time.monotonic() - t_start
    res.busy = busy
    return res


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def stderr_report(res: LiveResult, strict: bool) -> int:
    code = res.stats.report("pstate heat", sys.stderr, strict=strict)
    return res.code or code

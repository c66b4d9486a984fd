"""The live dashboard of `pstate heat --live`: read a stream, keep a sliding
window of buckets (heatmap.Window), redraw in place at a fixed rate.

One thread: select() on the input (and /dev/tty for the q key) with a
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

Row labels, reasons, the title and the status line are drawn by
heatdraw.render, each a cell (pstate.stream.names.cell): a name's control
characters escaped; the only escape codes written are the dashboard's own
(cursor, screen, colours).

On a terminal the dashboard uses the alternate screen with the cursor
hidden; Ctrl-C, q, SIGTERM, SIGHUP and the end of input restore the terminal
and leave the last frame on the normal screen. When stdout is not a terminal,
frames are printed one after another, separated by a blank line.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field


from pstate.render import heatmodel as hm
from pstate.render import heatviews
from pstate.stream import schema
from pstate.render import heatdraw as hr
from pstate.stream.durations import fmt_ns
from pstate.exitcodes import ExitCode
from pstate.stream.filters import Filter
from pstate.stream.names import cell
from pstate.stream.reader import StreamReader, state_row
from pstate.stream.streamio import MAX_LINE, ReadStats

CHUNK = 1 << 17
ALT_ON, ALT_OFF = "\x1b[?1049h", "\x1b[?1049l"
CUR_HIDE, CUR_SHOW = "\x1b[?25l", "\x1b[?25h"
HOME, CLEAR_EOL, CLEAR_EOS = "\x1b[H", "\x1b[K", "\x1b[J"
MAX_SAMPLE = 1 << 12


@dataclass
class LiveOptions:
    by: str = "tid"
    top: int | None = None
    shade: int | None = None  # state index to shade by share
    measure: str | None = None  # latency map instead of the state map
    window_ns: int = 10_000_000_000
    bucket_ns: int | None = None
    refresh: float = 4.0
    width: int | None = None  # fixed width (else the terminal's)
    height: int | None = None
    style: hr.Style = hr.PLAIN
    filt: Filter | None = None
    strict: bool = False
    name: str = "<stdin>"
    adaptive: bool = True  # decimate when busy
    keys: bool = True  # read q from /dev/tty


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


# what a row is, by --by (heat --by's choices)
ROW_UNITS = {"tid": "thread", "pid": "process", "comm": "command", "cgroup": "cgroup", "unit": "unit",
             "container": "container", "title": "title", "ppid": "parent"}
REASON_KEY = b'"reason":'
REASON_STATE = "uninterruptible"
NOTE_W = 20  # at most this many characters of a reason beside a row


class Reasons:
    """heat --live's reason column: per row (the model's key), the reasons
    of its D intervals that ended lately (the wake-ups of a recording made
    with record --stacks carry them), and the one with the most D time in
    the window shown."""

    def __init__(self, keyf):
        self.keyf = keyf
        self.seen: dict = {}  # key -> deque of (ts, reason, dur_ns)

    def note(self, rec: dict) -> None:
        reason = rec.get("reason")
        if not reason or rec["from"] != REASON_STATE or not isinstance(reason, str):
            return
        key = self.keyf(rec["pid"], rec["tid"], rec.get("comm") or "?", rec.get("cgroup"))
        q = self.seen.get(key)
        if q is None:
            q = self.seen[key] = deque(maxlen=256)
        q.append((rec["ts"], reason, rec.get("dur_ns") or 0))

    def top(self, key, since: int) -> str:
        q = self.seen.get(key)
        if not q:
            return ""
        while q and q[0][0] < since:
            q.popleft()
        by: dict = {}
        for _ts, reason, dur in q:
            by[reason] = by.get(reason, 0) + dur
        return min(by, key=lambda r: (-by[r], r)) if by else ""


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
        self.reasons = Reasons(model.keyf)
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


class Dashboard:
    """Layout and drawing of frames from a Window."""

    OVERHEAD = 6  # title, axis (2), legend, status, spare

    def __init__(self, opts: LiveOptions, out_fd: int, tty: bool, cursor: bool | None = None):
        self.opts = opts
        self.out_fd = out_fd
        self.tty = tty
        self.cursor = tty if cursor is None else cursor  # redraw in place, else frame after frame
        self.prev: list[str] = []
        self.reasons: Reasons | None = None  # the reason column beside D rows (run_live sets it)
        self.size = self._size()
        self.lw = 7 if opts.measure else max(8, min(20, self.size[0] // 4))
        ncols = hr.map_columns(self.size[0] - 1, self.lw)
        if opts.bucket_ns:
            self.bucket = opts.bucket_ns
            self.ncols = max(1, min(ncols, -(-opts.window_ns // opts.bucket_ns)))
        else:
            self.ncols = ncols
            self.bucket = max(1, -(-opts.window_ns // ncols))

    def _size(self) -> tuple[int, int]:
        if self.tty:
            try:
                cols, rows = os.get_terminal_size(self.out_fd)
            except OSError:
                cols, rows = 80, 24
        else:
            cols, rows = 80, 24
        return (self.opts.width or cols or 80, self.opts.height or rows or 24)

    def resized(self) -> None:
        self.size = self._size()
        self.prev = []

    def frame(self, model: hm.Window, status_of) -> list[str]:
        """The lines of one frame; status_of(tasks) gives the status line."""
        width, height = self.size
        width = max(20, width - (1 if self.tty else 0))  # the last column can wrap
        rows_max = max(1, height - self.OVERHEAD)
        lines = self._frame(model, status_of, width, rows_max)
        if self.tty and len(lines) > height:
            # a wrapped title or legend: give up map rows, keep the status line
            lines = self._frame(model, status_of, width, max(1, rows_max - (len(lines) - height)))
            lines = lines[:height - 1] + lines[-1:]
        return lines

    def _frame(self, model: hm.Window, status_of, width: int, rows_max: int) -> list[str]:
        opts = self.opts
        visible = max(1, min(self.ncols, hr.map_columns(width, self.lw)))
        lo = model.advance()
        hi = lo + model.ncols - 1
        c0 = hi - visible + 1
        axis = heatviews.TimeAxis(0, self.bucket, ago=True)
        win = fmt_ns(self.bucket * visible)
        waiting = model.last_ts is None
        if opts.measure:
            rows, spans, per = heatviews.latency_rows(model.lat, c0, visible, rows_max)
            labels = [fmt_ns(hm.log2_lower(b0)) for b0, _ in spans]
            vmax = max((max(r) for r in rows), default=0)
            k = "" if per == 1 else f" ({per} log2 buckets per row)"
            status = status_of(len(model.events))
            title = (f"Live: {hm.MEASURES[opts.measure][0]}, count per {fmt_ns(self.bucket)} bucket and "
                     f"log2 duration{k}, last {win}")
            view = heatviews.View("count", title, [lab.rjust(self.lw) for lab in labels], rows, axis=axis,
                           scale_max=vmax, scale_mode="log", scale_title="count", footer=[status])
        else:
            scores = model.scores(opts.shade)
            total = len(model.candidates(scores))
            status = status_of(total)
            keys = model.rank(scores, min(opts.top or rows_max, rows_max))
            notes = self._notes(model, keys, visible)
            if notes:  # the cells give way to the reason column
                visible = max(1, min(visible, hr.map_columns(width - NOTE_W - 1, self.lw)))
                c0 = hi - visible + 1
                win = fmt_ns(self.bucket * visible)
                notes = self._notes(model, keys, visible)
            overlay = model.overlay(keys)
            rows, seen = heatviews.state_rows(model.grid, keys, c0, visible, opts.shade, overlay)
            unit = ROW_UNITS.get(opts.by, opts.by)
            if opts.shade is None:
                title = f"Live: dominant state per {unit}, busiest {len(keys)} of {total}, last {win}"
                kind = "state"
            else:
                name = hm.STATE_NAMES[opts.shade]
                letter = schema.STATES.get(name, ("?",))[0]
                title = f"Live: share {name} ({letter}), top {len(keys)} of {total} by it, last {win}"
                kind = "share"
            view = heatviews.View(kind, title, [model.label(k) for k in keys], rows, axis=axis,
                           scale_max=1.0, scale_title="share", scale_unit="%",
                           states_present=seen, footer=[status], row_notes=notes)
        if waiting:
            view.title = f"Live: waiting for events on {opts.name}"
        return hr.render(view, width, opts.style, label_w=self.lw)

    def _notes(self, model: hm.Window, keys: list, visible: int) -> list | None:
        """Each row's top D reason in the visible window (None: no row has one)."""
        if self.reasons is None or not self.reasons.seen or model.last_ts is None:
            return None
        since = (model.last_ts // self.bucket - visible + 1) * self.bucket
        notes = [cell(self.reasons.top(k, since), NOTE_W, mark="") for k in keys]
        return notes if any(notes) else None

    def draw(self, lines: list[str]) -> None:
        if not self.cursor:
            _write(self.out_fd, "\n".join(lines) + "\n\n")
            return
        out = []
        for i, line in enumerate(lines):
            if i < len(self.prev) and self.prev[i] == line:
                continue
            out.append(f"\x1b[{i + 1};1H{line}{CLEAR_EOL}")
        if len(lines) < len(self.prev) or not self.prev:
            out.append(f"\x1b[{len(lines) + 1};1H{CLEAR_EOS}")
        self.prev = lines
        if out:
            _write(self.out_fd, "".join(out))


def can_move_cursor(environ=None) -> bool:
    """Whether the terminal takes the alternate screen and cursor movement:
    not with TERM=dumb (plain frames, one after the other, then)."""
    return (os.environ if environ is None else environ).get("TERM") != "dumb"


def _write(fd: int, text: str) -> None:
    data = text.encode("utf-8", "replace")
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except BlockingIOError:
            select.select([], [fd], [], 1.0)
            continue
        data = data[n:]


class _Terminal:
    """Alternate screen, hidden cursor and a quiet /dev/tty for keys; undone
    by restore() whatever happens."""

    def __init__(self, out_fd: int, keys: bool = True):
        self.out_fd = out_fd
        self.keys = keys
        self.key_fd = None
        self.saved = None

    def enter(self) -> None:
        _write(self.out_fd, ALT_ON + CUR_HIDE + HOME + CLEAR_EOS)
        if not self.keys:
            return
        try:
            import termios

            fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_NONBLOCK)
            try:
                self.saved = termios.tcgetattr(fd)
                attrs = termios.tcgetattr(fd)
                attrs[3] &= ~(termios.ECHO | termios.ICANON)  # keep ISIG: Ctrl-C still works
                attrs[6][termios.VMIN] = 0
                attrs[6][termios.VTIME] = 0
                termios.tcsetattr(fd, termios.TCSANOW, attrs)
                self.key_fd = fd
            except termios.error:
                os.close(fd)
        except (OSError, ImportError):
            self.key_fd = None

    def restore(self) -> None:
        if self.key_fd is not None:
            try:
                import termios

                termios.tcsetattr(self.key_fd, termios.TCSADRAIN, self.saved)
            except Exception:
                pass
            os.close(self.key_fd)
            self.key_fd = None
        try:
            _write(self.out_fd, CUR_SHOW + ALT_OFF)
        except OSError:
            pass


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
    cursor = tty and can_move_cursor()
    res = LiveResult()
    stats = res.stats
    dash = Dashboard(opts, out_fd, tty, cursor)
    idle = Filter(include_idle=opts.filt is not None and opts.filt.include_idle)  # the reader filters
    model = hm.Window(dash.bucket, dash.ncols, opts.by, idle, opts.measure)
    feeder = Feeder(model, stats, opts.name, opts.strict, filt=opts.filt)
    dash.reasons = feeder.reasons
    term = _Terminal(out_fd, opts.keys) if cursor else None
    period = 1.0 / opts.refresh
    resized = []
    old_handlers = {}

    def on_signal(signum, _frame):
        raise _Stop("signal", int(ExitCode.SIGTERM) if signum == signal.SIGTERM else 129)

    def on_winch(_signum, _frame):
        resized.append(1)

    in_main = _main_thread()
    if in_main:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            old_handlers[sig] = signal.signal(sig, on_signal)
        if tty:
            old_handlers[signal.SIGWINCH] = signal.signal(signal.SIGWINCH, on_winch)

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
        for sig, h in old_handlers.items():
            signal.signal(sig, h)
    # The last frame stays on the normal screen.
    ended = {"eof": "end of input", "interrupt": "stopped", "quit": "stopped"}.get(res.reason, res.reason)
    dash.prev = []
    final = dash.frame(model, lambda n: _status(feeder, rate, n, stats, ended, model))
    try:
        _write(out_fd, "\n".join(final) + "\n")
    except OSError:
        pass  # the terminal is gone (SIGHUP)
    res.lines = feeder.n
    res.parsed = feeder.parsed
    res.elapsed = time.monotonic() - t_start
    res.busy = busy
    return res


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def stderr_report(res: LiveResult, strict: bool) -> int:
    code = res.stats.report("pstate heat", sys.stderr, strict=strict)
    return res.code or code

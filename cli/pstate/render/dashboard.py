"""The live dashboard's drawing (`pstate heat --live`): frames of a sliding
window (heatmodel.Window) laid out for the terminal and written in place;
the terminal's alternate screen, hidden cursor and quiet keys. The loop that
reads the stream and draws at a fixed rate is the heat engine's
(pstate.engines.live).

Row labels, reasons, the title and the status line are drawn by
heatdraw.render, each a cell (pstate.stream.names.cell): a name's control
characters escaped; the only escape codes written are the dashboard's own
(cursor, screen, colours).

On a terminal the dashboard uses the alternate screen with the cursor
hidden; Terminal.restore() puts it back whatever ended the run, and the
last frame stays on the normal screen. When stdout is not a terminal,
frames are printed one after another, separated by a blank line.
"""

from __future__ import annotations

import os
import select
from dataclasses import dataclass

from pstate.render import heatdraw as hr
from pstate.render import heatmodel as hm
from pstate.render import heatviews
from pstate.stream import schema
from pstate.stream.durations import fmt_ns
from pstate.stream.filters import Filter
from pstate.stream.names import cell

ALT_ON, ALT_OFF = "\x1b[?1049h", "\x1b[?1049l"
CUR_HIDE, CUR_SHOW = "\x1b[?25l", "\x1b[?25h"
HOME, CLEAR_EOL, CLEAR_EOS = "\x1b[H", "\x1b[K", "\x1b[J"


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


# what a row is, by --by (heat --by's choices)
ROW_UNITS = {"tid": "thread", "pid": "process", "comm": "command", "cgroup": "cgroup", "unit": "unit",
             "container": "container", "title": "title", "ppid": "parent"}
NOTE_W = 20  # at most this many characters of a reason beside a row


class Dashboard:
    """Layout and drawing of frames from a Window."""

    OVERHEAD = 6  # title, axis (2), legend, status, spare

    def __init__(self, opts: LiveOptions, out_fd: int, tty: bool, cursor: bool | None = None):
        self.opts = opts
        self.out_fd = out_fd
        self.tty = tty
        self.cursor = tty if cursor is None else cursor  # redraw in place, else frame after frame
        self.prev: list[str] = []
        self.reasons: hm.Reasons | None = None  # the reason column beside D rows (the live loop sets it)
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
            unit = ROW_UNITS.get(model.by, model.by)  # (the key: by title:REGEX, title)
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
            write_all(self.out_fd, "\n".join(lines) + "\n\n")
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
            write_all(self.out_fd, "".join(out))


def can_move_cursor(environ=None) -> bool:
    """Whether the terminal takes the alternate screen and cursor movement:
    not with TERM=dumb (plain frames, one after the other, then)."""
    return (os.environ if environ is None else environ).get("TERM") != "dumb"


def write_all(fd: int, text: str) -> None:
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


class Terminal:
    """Alternate screen, hidden cursor and a quiet /dev/tty for keys; undone
    by restore() whatever happens."""

    def __init__(self, out_fd: int, keys: bool = True):
        self.out_fd = out_fd
        self.keys = keys
        self.key_fd = None
        self.saved = None

    def enter(self) -> None:
        write_all(self.out_fd, ALT_ON + CUR_HIDE + HOME + CLEAR_EOS)
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
            write_all(self.out_fd, CUR_SHOW + ALT_OFF)
        except OSError:
            pass



"""Drawing heat map views (heatmap.View) as text: plain ASCII glyphs, or ANSI
256-colour / truecolor cells. Pure functions from a view and a width to lines.

Every state has its own ASCII glyph and intensities the ramp " .:-=+*#%@";
colour mode draws the same glyphs on background-coloured cells (one RGB
table; 256-colour codes are derived from it), in black or white, whichever
reads better on the colour. Without its escape codes a coloured map is the
plain one: a colour-blind reader, a `tmux capture-pane -p` or a log of it
sees the same map.

Every text a map shows (row labels, the notes beside rows, the title, the
footer) is a cell (pstate.stream.names.cell): a name's control characters
escaped, then cut to its columns; the only escape codes written are the
colours' own.
"""

from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass

from pstate.stream.durations import fmt_ns
from pstate.stream.names import cell, columns
from pstate.render.heatmodel import STATE_NAMES
from pstate.render.heatviews import TimeAxis, View, human_count

# --- glyphs and colours ---------------------------------------------------------

GLYPHS: dict[str, str] = {
    "running": "#", "runnable": "+", "preempted": "!", "new": "n",
    "sleeping": ".", "uninterruptible": "D", "stopped": "T", "traced": "t",
    "dead": "X", "zombie": "Z", "parked": "P", "idle": "I", "reaped": "-",
    "unknown": "?", "other": "~",
}
NOT_SEEN = " "
RAMP = " .:-=+*#%@"  # level 0 (nothing) .. 9 (the most)
LEVELS = len(RAMP) - 1

# Hot colours for waiting and D, cool for sleep: the eye goes to trouble.
STATE_RGB: dict[str, tuple[int, int, int]] = {
    "running": (46, 160, 67),
    "runnable": (230, 190, 0),
    "preempted": (255, 120, 0),
    "new": (240, 230, 140),
    "sleeping": (40, 60, 110),
    "uninterruptible": (220, 20, 60),
    "stopped": (0, 170, 200),
    "traced": (0, 120, 140),
    "dead": (120, 120, 120),
    "zombie": (150, 60, 200),
    "parked": (70, 70, 90),
    "idle": (55, 55, 65),
    "reaped": (90, 90, 90),
    "unknown": (110, 110, 110),
    "other": (255, 255, 255),
}
# An inferno-like ramp, dark to bright, for levels 1..9.
HEAT_RGB: tuple[tuple[int, int, int], ...] = (
    (40, 11, 84), (85, 15, 109), (136, 34, 106), (186, 54, 85), (227, 89, 51),
    (249, 140, 10), (249, 190, 40), (245, 230, 100), (252, 255, 164),
)

assert set(GLYPHS) == set(STATE_NAMES) == set(STATE_RGB)
assert len(set(GLYPHS.values())) == len(GLYPHS) and NOT_SEEN not in GLYPHS.values()

_CUBE = (0, 95, 135, 175, 215, 255)


def rgb_to_256(r: int, g: int, b: int) -> int:
    """Nearest xterm-256 colour: the 6x6x6 cube or the grey ramp."""
    def q(v):
        return min(range(6), key=lambda i: abs(_CUBE[i] - v))

    ci = (q(r), q(g), q(b))
    cube = (_CUBE[ci[0]], _CUBE[ci[1]], _CUBE[ci[2]])
    grey_i = min(23, max(0, round(((r + g + b) / 3 - 8) / 10)))
    grey = 8 + 10 * grey_i

    def dist(c):
        return (c[0] - r) ** 2 + (c[1] - g) ** 2 + (c[2] - b) ** 2

    if dist((grey, grey, grey)) < dist(cube):
        return 232 + grey_i
    return 16 + 36 * ci[0] + 6 * ci[1] + ci[2]


@dataclass(frozen=True)
class Style:
    color: bool = False
    truecolor: bool = False

    def bg(self, rgb) -> str:
        """Background rgb, with a black or white glyph over it."""
        ink = "30" if 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2] > 140 else "97"
        if self.truecolor:
            return f"\x1b[{ink};48;2;{rgb[0]};{rgb[1]};{rgb[2]}m"
        return f"\x1b[{ink};48;5;{rgb_to_256(*rgb)}m"

    reset = "\x1b[0m"
    bold = "\x1b[1m"


PLAIN = Style()


def pick_style(color: str, isatty: bool, environ=None) -> Style:
    """color: auto (colour on a terminal unless NO_COLOR is set or TERM is
    dumb), always, never, 256 or truecolor (colour with that depth)."""
    env = os.environ if environ is None else environ
    if color == "never":
        return PLAIN
    if color == "auto" and (not isatty or env.get("NO_COLOR") or env.get("TERM") == "dumb"):
        return PLAIN
    if color in ("256", "truecolor"):
        return Style(True, color == "truecolor")
    return Style(True, env.get("COLORTERM", "").lower() in ("truecolor", "24bit"))


# --- scales -------------------------------------------------------------------------


def level(v, vmax: float, mode: str) -> int:
    """0 for nothing (None or <= 0), else 1..9."""
    if v is None or v <= 0:
        return 0
    if mode == "log":
        if vmax <= 1 or v <= 1:
            return LEVELS if vmax <= 1 else 1
        return min(LEVELS, 1 + int((LEVELS - 1) * math.log(v) / math.log(vmax) + 1e-9))
    if vmax <= 0:
        return LEVELS
    return min(LEVELS, max(1, math.ceil(v / vmax * LEVELS - 1e-9)))


def scale_items(vmax: float, mode: str, unit: str = "") -> list[tuple[int, str]]:
    """(level, text) for the legend: what each glyph or colour stands for."""
    def fmt(v):
        if unit == "%":
            return f"{v * 100:.0f}%"
        return human_count(v) if mode == "log" else f"{v:.2g}"

    items = [(0, "0")]
    if mode == "log":
        for lv in range(1, LEVELS + 1):
            lb = 1 if lv == 1 else math.ceil(vmax ** ((lv - 1) / (LEVELS - 1)) - 1e-9)
            if lb <= vmax and level(lb, vmax, mode) == lv:
                items.append((lv, f">={fmt(lb)}"))
    else:
        for lv in range(1, LEVELS + 1):
            items.append((lv, f">{fmt(vmax * (lv - 1) / LEVELS)}"))
    return items


# --- layout -------------------------------------------------------------------------

MIN_COLS = 10


def label_width(labels, width: int) -> int:
    cap = max(6, min(24, width // 4))
    longest = max((columns(cell(s)) for s in labels), default=4)
    return max(4, min(cap, longest))


def map_columns(width: int, lw: int) -> int:
    """Columns left for cells next to a label of lw characters."""
    return max(MIN_COLS, width - lw - 1)


def fit_label(label, lw: int) -> str:
    """A row label in lw columns: escaped, padded, or cut with a ~ (a label
    that ends in a number, "comm 1234", keeps the number)."""
    text = cell(label)
    if columns(text) > lw:
        text = cell(label, lw)
        if " " in str(label):
            head, tail = str(label).rsplit(" ", 1)
            tail = cell(tail)
            room = lw - columns(tail) - 1
            if room >= 2:
                text = f"{cell(head, room)} {tail}"
    return text + " " * (lw - columns(text))


def nice_step(min_ns: float) -> int:
    """The smallest "round" time step >= min_ns (1-2-5 below 10 s, then
    clock-like steps)."""
    big = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
    mag = 1
    while True:
        for m in (1, 2, 5):
            if m * mag >= min_ns:
                return m * mag
        mag *= 10
        if mag >= 10_000_000_000:
            break
    for s in big:
        if s * 1_000_000_000 >= min_ns:
            return s * 1_000_000_000
    return math.ceil(min_ns / 86_400e9) * 86_400_000_000_000


def fmt_tick(ns: int) -> str:
    return "0" if ns == 0 else fmt_ns(ns)


def time_ticks(axis: TimeAxis, ncols: int, spacing: int = 10) -> list[tuple[int, str, str]]:
    """(column, text, align) ticks at round times, at most every spacing columns."""
    b = axis.bucket_ns
    step = nice_step(b * spacing)
    out = []
    if axis.ago:
        k = 0
        while True:
            t = k * step
            c = ncols - 1 - t // b
            if c < 0:
                break
            out.append((c, "now" if t == 0 else "-" + fmt_ns(t), "right"))
            k += 1
        return out
    t0 = axis.start_ns
    first = -(-t0 // step) * step
    t = first
    end = t0 + ncols * b
    while t < end:
        out.append(((t - t0) // b, fmt_tick(t), "left"))
        t += step
    return out


def axis_lines(ticks, ncols: int, indent: int) -> list[str]:
    rule = ["-"] * ncols
    text = [" "] * ncols
    busy_to = -1  # last column used by a label, plus a space
    placed = sorted(ticks)
    for c, label, align in placed:
        if not 0 <= c < ncols:
            continue
        a = c if align == "left" else c - len(label) + 1
        e = a + len(label)
        if a <= busy_to or a < 0 or e > ncols:
            continue
        rule[c] = "+"
        text[a:e] = list(label)
        busy_to = e
    pad = " " * indent
    return [pad + "".join(rule), (pad + "".join(text)).rstrip()]


def wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, width=max(20, width), break_on_hyphens=False) or [""]


def join_items(items: list[tuple[str, str]], width: int, lead: str = "") -> list[str]:
    """Legend items (visible text, rendered text) packed into lines of width."""
    lines = []
    cur, n, empty = lead, len(lead), True
    for vis, rendered in items:
        sep = "" if n == 0 else (" " if empty else "  ")
        if not empty and n + len(sep) + len(vis) > width:
            lines.append(cur)
            cur, n, sep = "  ", 2, ""
        cur += sep + rendered
        n += len(sep) + len(vis)
        empty = False
    if cur.strip():
        lines.append(cur)
    return lines


# --- cells ----------------------------------------------------------------------------


def _cell_rgb(view: View, v):
    if view.kind == "state":
        return None if v is None else STATE_RGB[STATE_NAMES[v]]
    lv = level(v, view.scale_max, view.scale_mode)
    return None if lv == 0 else HEAT_RGB[lv - 1]


def _cell_char(view: View, v) -> str:
    if view.kind == "state":
        return NOT_SEEN if v is None else GLYPHS[STATE_NAMES[v]]
    return RAMP[level(v, view.scale_max, view.scale_mode)]


def render_cells(view: View, row, style: Style) -> str:
    if not style.color:
        return "".join(_cell_char(view, v) for v in row)
    out = []
    cur = None  # no colour set
    for v in row:
        rgb = _cell_rgb(view, v)
        if rgb != cur:
            out.append(style.reset if rgb is None else style.bg(rgb))
            cur = rgb
        out.append(_cell_char(view, v))
    if cur is not None:
        out.append(style.reset)
    return "".join(out)


def swatch(style: Style, rgb, glyph: str) -> str:
    return f"{style.bg(rgb)}{glyph}{style.reset}"


def legend_lines(view: View, width: int, style: Style) -> list[str]:
    if view.kind == "state":
        items = []
        for i in view.states_present:
            name = STATE_NAMES[i]
            g = GLYPHS[name]
            vis = f"{g} {name}"
            rendered = vis if not style.color else f"{swatch(style, STATE_RGB[name], g)} {name}"
            items.append((vis, rendered))
        if any(v is None for row in view.cells for v in row):
            items.append(("' ' not seen", "' ' not seen"))
        return join_items(items, width)
    items = []
    for lv, text in scale_items(view.scale_max, view.scale_mode, view.scale_unit):
        vis = rendered = f"'{RAMP[lv]}'{text}"
        if style.color and lv:
            rendered = f"'{swatch(style, HEAT_RGB[lv - 1], RAMP[lv])}'{text}"
        items.append((vis, rendered))
    lead = f"{view.scale_title}:"
    return join_items(items, width, lead)


# --- the whole view ---------------------------------------------------------------------


def render(view: View, width: int, style: Style = PLAIN, label_w: int | None = None,
           head: bool = True, tail: bool = True) -> list[str]:
    """Lines (without newlines) of a view, each at most width visible characters.
    head: draw the title; tail: draw the legend and the footer (bands of a
    long map share them)."""
    ncols = len(view.cells[0]) if view.cells else 0
    lw = label_w if label_w is not None else label_width(view.row_labels, width)
    lines = []
    if head:
        for i, t in enumerate(wrap(cell(view.title), width)):
            lines.append(f"{style.bold}{t}{style.reset}" if style.color else t)
    if not view.cells:
        lines.append("(nothing to show)")
    notes = view.row_notes or [""] * len(view.cells)
    for label, row, note in zip(view.row_labels, view.cells, notes):
        line = f"{fit_label(label, lw)} {render_cells(view, row, style)}"
        lines.append(f"{line} {cell(note)}" if note else line)
    if ncols:
        if view.axis is not None:
            ticks = time_ticks(view.axis, ncols)
        else:
            ticks = [(c, t, "left") for c, t in (view.col_labels or [])]
        lines.extend(axis_lines(ticks, ncols, lw + 1))
    if tail:
        if view.cells:
            lines.extend(legend_lines(view, width, style))
        for f in view.footer:
            lines.extend(wrap(cell(f), width))
    return lines

"""Points in a recording's time for --begin/--end, and the window they make.

A point is written relative to the start of the recording ("+30s",
"+1m30s") or as a wall-clock time ("2026-11-30T12:00:00", "12:00:05",
"@1764500000"). Events carry CLOCK_MONOTONIC timestamps, so a point becomes
a monotonic ts through the meta header's anchor: wall = wall_ns + (t - ts).

Every point is first resolved against the first recording of the input
(relative times count from its start; a time of day falls on the day it
started), then into each recording's own monotonic clock, so concatenated
recordings, even from different boots, are cut at the same wall-clock time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time as dtime, timedelta, timezone

import click

from pstate.stream.durations import UNITS

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_NUM = r"(?:\d+(?:\.\d*)?|\.\d+)"
_UNIT = r"(?:ns|us|µs|ms|s|min|m|h)"
# "+1m30s" (every part with a unit) or "+90" (one bare number: seconds)
_REL_RE = re.compile(rf"^\+(?:(?:\s*{_NUM}\s*{_UNIT})+|\s*{_NUM})\s*$")
_REL_PART = re.compile(rf"({_NUM})\s*({_UNIT})?")
_EPOCH_RE = re.compile(r"^@(\d+(?:\.\d{1,9})?)$")
_CLOCK_RE = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d{1,9}))?)?$")

FORMS = "+30s, +1m30s, 12:00:05, 2026-11-30T12:00:00 or @1764500000"


class WindowError(ValueError):
    """A window that cannot be placed on this input (the message says why)."""


@dataclass(frozen=True)
class TimePoint:
    """A parsed --begin/--end value.

    kind "rel": ns after the start of the recording; "wall": ns since the
    epoch (UTC); "clock": ns after local midnight, on the day the recording
    started.
    """

    kind: str
    ns: int
    text: str


def parse_point(text: str) -> TimePoint:
    """Parse a --begin/--end value. Raises ValueError with the accepted forms."""
    t = text.strip()
    if t.startswith("+"):
        if not _REL_RE.match(t):
            raise ValueError(f"not a time: {text!r} (relative times look like +30s, +1m30s, +1.5s, +500ms)")
        ns = 0
        for value, unit in _REL_PART.findall(t[1:]):
            ns += round(float(value) * UNITS[unit or "s"])
        return TimePoint("rel", ns, text)
    m = _EPOCH_RE.match(t)
    if m:
        whole, _, frac = m.group(1).partition(".")
        return TimePoint("wall", int(whole) * 1_000_000_000 + int((frac + "000000000")[:9]), text)
    m = _CLOCK_RE.match(t)
    if m:
        h, mi, s, frac = m.groups()
        if int(h) > 23 or int(mi) > 59 or int(s or 0) > 59:
            raise ValueError(f"not a time of day: {text!r} (hours 0-23, minutes and seconds 0-59)")
        ns = ((int(h) * 60 + int(mi)) * 60 + int(s or 0)) * 1_000_000_000 + int(((frac or "") + "000000000")[:9])
        return TimePoint("clock", ns, text)
    try:
        dt = datetime.fromisoformat(t)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use e.g. {FORMS})") from None
    return TimePoint("wall", wall_ns_of(dt), text)


def wall_ns_of(dt: datetime) -> int:
    """ns since the epoch; a naive datetime is local time."""
    if dt.tzinfo is None:
        dt = dt.astimezone()  # interprets naive as local time, honouring DST
    d = dt - _EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000_000 + d.microseconds * 1_000


def fmt_wall(ns: int) -> str:
    """Local time, millisecond precision: 2026-11-30T12:00:05.250."""
    dt = datetime.fromtimestamp(ns // 1_000_000_000).replace(microsecond=(ns % 1_000_000_000) // 1_000)
    return dt.isoformat(timespec="milliseconds")


class TimePointType(click.ParamType):
    name = "TIME"

    def convert(self, value, param, ctx):
        if isinstance(value, TimePoint):
            return value
        try:
            return parse_point(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


@dataclass(frozen=True)
class Anchor:
    """Where a recording starts and how its monotonic clock maps to wall time."""

    start_ts: int  # monotonic ns of the start: relative times count from here
    ts: int | None = None  # monotonic ns at which wall_ns was read
    wall_ns: int | None = None

    @classmethod
    def from_meta(cls, meta: dict, start_key: str = "ts") -> "Anchor | None":
        ts, wall = meta.get("ts"), meta.get("wall_ns")
        start = meta.get(start_key, ts)
        if not _is_int(start):
            start = ts
        if not _is_int(start):
            return None
        if not (_is_int(ts) and _is_int(wall)):
            return cls(start)
        return cls(start, ts, wall)

    @property
    def has_wall(self) -> bool:
        return self.wall_ns is not None

    def wall_of(self, mono: int) -> int:
        return self.wall_ns + (mono - self.ts)

    def mono_of(self, wall: int) -> int:
        return self.ts + (wall - self.wall_ns)


def _is_int(v) -> bool:
    return type(v) is int


@dataclass(frozen=True)
class Window:
    """--begin (inclusive) and --end (exclusive), either may be None."""

    begin: TimePoint | None = None
    end: TimePoint | None = None

    @property
    def active(self) -> bool:
        return self.begin is not None or self.end is not None

    def check(self) -> None:
        """Refuse an empty window that is empty whatever the input."""
        b, e = self.begin, self.end
        if b and e and b.kind == e.kind and e.ns <= b.ns:
            raise WindowError(f"--end {e.text} is not after --begin {b.text}")

    def bind(self, first: Anchor) -> "BoundWindow":
        """Resolve both points against the first recording of the input."""
        bw = BoundWindow(_reference(self.begin, first), _reference(self.end, first), self)
        b, e = bw.for_recording(first)
        if b is not None and e is not None and e <= b:
            raise WindowError(f"--end {self.end.text} is not after --begin {self.begin.text}"
                              + _where(first, b, e))
        return bw


def _where(first: Anchor, b: int, e: int) -> str:
    if not first.has_wall:
        return ""
    return f" ({fmt_wall(first.wall_of(e))} is before {fmt_wall(first.wall_of(b))})"


def _reference(point: TimePoint | None, first: Anchor) -> tuple[str, int] | None:
    """A point as ("wall", epoch ns) when the input has a wall-clock anchor,
    else as ("mono", ns) in the first recording's clock."""
    if point is None:
        return None
    if point.kind == "rel":
        if first.has_wall:
            return ("wall", first.wall_of(first.start_ts) + point.ns)
        return ("mono", first.start_ts + point.ns)
    if not first.has_wall:
        raise WindowError(f"{point.text} is a wall-clock time, but the input has no meta header with a "
                          "wall-clock anchor (wall_ns); use a time relative to the start, e.g. +30s")
    if point.kind == "wall":
        return ("wall", point.ns)
    # A time of day falls on the (local) day the recording started.
    start = datetime.fromtimestamp(first.wall_of(first.start_ts) // 1_000_000_000)
    secs, ns = divmod(point.ns, 1_000_000_000)
    day = datetime.combine(start.date(), dtime()) + timedelta(seconds=secs)
    return ("wall", wall_ns_of(day) + ns)


@dataclass(frozen=True)
class BoundWindow:
    begin: tuple[str, int] | None
    end: tuple[str, int] | None
    window: Window

    def for_recording(self, anchor: Anchor) -> tuple[int | None, int | None]:
        """(begin_ts, end_ts) in this recording's monotonic clock."""
        return _mono(self.begin, anchor, self.window.begin), _mono(self.end, anchor, self.window.end)


def _mono(ref: tuple[str, int] | None, anchor: Anchor, point: TimePoint | None) -> int | None:
    if ref is None:
        return None
    kind, ns = ref
    if kind == "mono":
        return ns
    if not anchor.has_wall:
        raise WindowError(f"{point.text} cannot be placed on a recording without a wall-clock anchor "
                          "(meta wall_ns) when it follows one that has it")
    return anchor.mono_of(ns)


def cut_end(last_ts: int | None, end_ts: int | None, ends: list) -> int | None:
    """Where a --begin/--end cut really ends (its trailer's ts): the window's
    end, or the recording's own end record before it, for the tasks stay in
    their states until then; never before the last event written."""
    own = [e.get("ts") for e in ends if type(e.get("ts")) is int]
    if last_ts is None or not own:
        return last_ts
    bound = own[-1] if end_ts is None else min(own[-1], end_ts)
    return max(last_ts, bound)

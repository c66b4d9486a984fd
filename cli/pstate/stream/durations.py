"""Durations on the command line ("5ms", "1.5s", "+30s") and in human output."""

from __future__ import annotations

import re

import click

UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000,
         "m": 60_000_000_000, "min": 60_000_000_000, "h": 3_600_000_000_000}
_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s|min|m|h)?\s*$")


def parse_ns(text: str, default_unit: str = "s") -> int:
    """"5ms" -> 5_000_000. A bare number is in default_unit. Raises ValueError."""
    m = _RE.match(str(text))
    if not m:
        raise ValueError(f"not a duration: {text!r} (use e.g. 500us, 5ms, 2s, 1m)")
    value, unit = m.groups()
    return int(round(float(value) * UNITS[unit or default_unit]))


class Duration(click.ParamType):
    """A click type for durations; the value is an int of nanoseconds."""

    name = "DURATION"

    def __init__(self, default_unit: str = "s", positive: bool = False):
        self.default_unit = default_unit
        self.positive = positive

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            ns = value
        else:
            try:
                ns = parse_ns(value, self.default_unit)
            except ValueError as e:
                self.fail(str(e), param, ctx)
        if self.positive and ns <= 0:
            self.fail(f"{value!r} is not a positive duration (use e.g. 500ms, 5s, 1m)", param, ctx)
        return ns


def fmt_ns(ns: float | int | None, digits: int = 3) -> str:
    """Compact human form: 950ns, 12.3us, 4.56ms, 1.23s, 2m03s."""
    if ns is None:
        return "-"
    ns = float(ns)
    a = abs(ns)
    if a < 999.5:
        return f"{ns:.0f}ns"
    # Pick the unit by the value as rounded for display, so 999999ns reads
    # "1ms", not "1e+03us".
    for div, unit in ((1e3, "us"), (1e6, "ms")):
        if float(f"{a / div:.{digits}g}") < 1000:
            return f"{ns / div:.{digits}g}{unit}"
    if a < 60e9:
        return f"{ns / 1e9:.{digits}g}s"
    if a < 3600e9:
        m, s = divmod(ns / 1e9, 60)
        return f"{int(m)}m{int(s):02d}s"
    h, rem = divmod(ns / 1e9, 3600)
    return f"{int(h)}h{int(rem // 60):02d}m"

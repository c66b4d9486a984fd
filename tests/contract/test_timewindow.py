"""--begin/--end parsing and placing a window on recordings (pstate.stream.timewindow)."""

from __future__ import annotations

import time

import click
import pytest
from click.testing import CliRunner

from pstate.stream.timewindow import (Anchor, TimePoint, TimePointType, Window, WindowError, fmt_wall, parse_point,
                               wall_ns_of)

S = 1_000_000_000
T0 = 5_000 * S  # a recording's meta ts
W0 = 1_764_500_000 * S  # its wall_ns: 2025-11-30T10:53:20Z


@pytest.fixture
def tz(monkeypatch):
    """Run in a given local time zone; restore the real one afterwards."""

    def use(name: str) -> None:
        monkeypatch.setenv("TZ", name)
        time.tzset()

    yield use
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("text,ns", [
    ("+30s", 30 * S),
    ("+1m30s", 90 * S),
    ("+1h2min3s", 3723 * S),
    ("+1.5s", 1_500_000_000),
    ("+.25s", 250_000_000),
    ("+500ms", 500_000_000),
    ("+250us", 250_000),
    ("+90", 90 * S),
    ("+0", 0),
    ("+ 2m 5s", 125 * S),
])
def test_relative(text, ns):
    assert parse_point(text) == TimePoint("rel", ns, text)


@pytest.mark.parametrize("text,ns", [
    ("@1764500000", W0),
    ("@1764500000.5", W0 + 500_000_000),
    ("@1764500000.000000001", W0 + 1),
    ("2025-11-30T10:53:20Z", W0),
    ("2025-11-30 10:53:20.250+00:00", W0 + 250_000_000),
    ("2025-11-30T11:53:20+01:00", W0),
])
def test_absolute_with_zone(text, ns):
    assert parse_point(text) == TimePoint("wall", ns, text)


def test_absolute_local_time(tz):
    tz("Europe/Berlin")  # UTC+1 in November
    assert parse_point("2025-11-30T11:53:20").ns == W0
    assert parse_point("2025-11-30").ns == W0 - (10 * 3600 + 53 * 60 + 20) * S - 3600 * S
    tz("UTC")
    assert parse_point("2025-11-30T10:53:20").ns == W0


@pytest.mark.parametrize("text,ns", [
    ("12:00:05", (12 * 3600 + 5) * S),
    ("0:30", 1800 * S),
    ("23:59:59.5", (86399 * S) + 500_000_000),
])
def test_time_of_day(text, ns):
    assert parse_point(text) == TimePoint("clock", ns, text)


@pytest.mark.parametrize("text,message", [
    ("30s", "not a time: '30s' (use e.g. +30s, +1m30s, 12:00:05, 2026-11-30T12:00:00 or @1764500000)"),
    ("+1 30", "not a time: '+1 30' (relative times look like +30s, +1m30s, +1.5s, +500ms)"),
    ("+1.5.3s", "not a time: '+1.5.3s' (relative times look like +30s, +1m30s, +1.5s, +500ms)"),
    ("+-3s", "not a time: '+-3s' (relative times look like +30s, +1m30s, +1.5s, +500ms)"),
    ("+3 parsecs", "not a time: '+3 parsecs' (relative times look like +30s, +1m30s, +1.5s, +500ms)"),
    ("24:00", "not a time of day: '24:00' (hours 0-23, minutes and seconds 0-59)"),
    ("12:60", "not a time of day: '12:60' (hours 0-23, minutes and seconds 0-59)"),
    ("@-5", "not a time: '@-5' (use e.g. +30s, +1m30s, 12:00:05, 2026-11-30T12:00:00 or @1764500000)"),
    ("1764500000", "not a time: '1764500000' (use e.g. +30s, +1m30s, 12:00:05, 2026-11-30T12:00:00 or @1764500000)"),
    ("", "not a time: '' (use e.g. +30s, +1m30s, 12:00:05, 2026-11-30T12:00:00 or @1764500000)"),
])
def test_bad_points(text, message):
    with pytest.raises(ValueError) as e:
        parse_point(text)
    assert str(e.value) == message


def test_click_type_reports_usage_error():
    @click.command()
    @click.option("--begin", type=TimePointType())
    def cmd(begin):
        click.echo(repr(begin))

    r = CliRunner().invoke(cmd, ["--begin", "soon"])
    assert r.exit_code == 2
    assert r.stderr.endswith("Error: Invalid value for '--begin': not a time: 'soon' (use e.g. +30s, +1m30s, "
                             "12:00:05, 2026-11-30T12:00:00 or @1764500000)\n")
    r = CliRunner().invoke(cmd, ["--begin", "+2s"])
    assert r.stdout == "TimePoint(kind='rel', ns=2000000000, text='+2s')\n"


def test_anchor_from_meta():
    assert Anchor.from_meta({"ts": T0, "wall_ns": W0}) == Anchor(T0, T0, W0)
    assert Anchor.from_meta({"ts": T0}) == Anchor(T0)
    assert Anchor.from_meta({"ts": "x"}) is None
    snap = {"ts": T0 + 60 * S, "wall_ns": W0 + 60 * S, "interval_start_ts": T0}
    assert Anchor.from_meta(snap, "interval_start_ts") == Anchor(T0, T0 + 60 * S, W0 + 60 * S)
    assert Anchor.from_meta({"ts": T0, "wall_ns": W0, "interval_start_ts": None}, "interval_start_ts").start_ts == T0


def bounds(begin=None, end=None, first=Anchor(T0, T0, W0), anchor=None):
    w = Window(begin and parse_point(begin), end and parse_point(end))
    return w.bind(first).for_recording(anchor or first)


def test_relative_window_counts_from_the_start():
    assert bounds("+30s", "+45s") == (T0 + 30 * S, T0 + 45 * S)
    assert bounds("+30s") == (T0 + 30 * S, None)
    assert bounds(None, "+1m") == (None, T0 + 60 * S)
    # Without a wall-clock anchor relative times still work.
    assert bounds("+1s", "+2s", first=Anchor(T0)) == (T0 + S, T0 + 2 * S)


def test_wall_clock_window_through_the_anchor():
    assert bounds("@1764500010", "2025-11-30T10:53:40Z") == (T0 + 10 * S, T0 + 20 * S)
    # The anchor may be taken after the start: wall = wall_ns + (t - ts).
    late = Anchor(T0, T0 + 7 * S, W0 + 7 * S)
    assert bounds("@1764500010", first=late) == (T0 + 10 * S, None)


def test_time_of_day_is_on_the_day_the_recording_started(tz):
    tz("UTC")
    assert bounds("10:53:25", "10:54") == (T0 + 5 * S, T0 + 40 * S)
    tz("America/New_York")  # 05:53:20 local (UTC-5)
    assert bounds("05:53:30") == (T0 + 10 * S, None)
    # A time before the start is on the same day: the window begins before the recording.
    assert bounds("00:00") == (T0 - (5 * 3600 + 53 * 60 + 20) * S, None)


def test_second_recording_is_cut_at_the_same_wall_clock_time():
    # A later recording of another boot: its monotonic clock starts lower.
    other = Anchor(100 * S, 100 * S, W0 + 3600 * S)
    assert bounds("@1764503610", "@1764503620", anchor=other) == (110 * S, 120 * S)
    # Relative points are relative to the first recording, also for later ones.
    assert bounds("+3610s", anchor=other) == (110 * S, None)


def test_wall_clock_time_needs_an_anchor():
    with pytest.raises(WindowError) as e:
        bounds("@1764500010", first=Anchor(T0))
    assert str(e.value) == ("@1764500010 is a wall-clock time, but the input has no meta header with a wall-clock "
                            "anchor (wall_ns); use a time relative to the start, e.g. +30s")
    w = Window(parse_point("@1764500010")).bind(Anchor(T0, T0, W0))
    with pytest.raises(WindowError):
        w.for_recording(Anchor(7 * S))


def test_empty_windows_are_refused(tz):
    tz("UTC")
    with pytest.raises(WindowError) as e:
        Window(parse_point("+45s"), parse_point("+30s")).check()
    assert str(e.value) == "--end +30s is not after --begin +45s"
    Window(parse_point("+30s"), parse_point("12:00")).check()  # different kinds: known only with an anchor
    with pytest.raises(WindowError) as e:
        bounds("+30s", "10:53:30")
    assert str(e.value) == ("--end 10:53:30 is not after --begin +30s "
                            "(2025-11-30T10:53:30.000 is before 2025-11-30T10:53:50.000)")


def test_wall_helpers(tz):
    tz("UTC")
    assert fmt_wall(W0 + 250_000_000) == "2025-11-30T10:53:20.250"
    from datetime import datetime, timezone

    assert wall_ns_of(datetime(2025, 11, 30, 10, 53, 20, 5, tzinfo=timezone.utc)) == W0 + 5000

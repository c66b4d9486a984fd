"""Durations on the command line and in human output."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from pstate.stream.durations import Duration, fmt_ns, parse_ns


@pytest.mark.parametrize("text, ns", [
    ("5ms", 5_000_000), ("1.5s", 1_500_000_000), (".5s", 500_000_000), ("5.", 5_000_000_000),
    ("500us", 500_000), ("500µs", 500_000), ("7ns", 7), ("2m", 120_000_000_000), ("1min", 60_000_000_000),
    ("1h", 3_600_000_000_000), (" 5 ms ", 5_000_000), ("0", 0), ("0.1s", 100_000_000), ("3", 3_000_000_000),
])
def test_parse_ns(text, ns):
    assert parse_ns(text) == ns


def test_default_unit():
    assert parse_ns("5", default_unit="ms") == 5_000_000
    assert parse_ns("5s", default_unit="ms") == 5_000_000_000


@pytest.mark.parametrize("text", ["", "ms", "-5ms", "5 sec", "1e3", "inf", "nan", "5ms5", "5 m s", "1,5s", "0x10"])
def test_parse_ns_rejects(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_ns(text)


def test_duration_click_type():
    @click.command()
    @click.option("--d", type=Duration("s"), default=0)
    def cmd(d):
        click.echo(repr(d))

    r = CliRunner().invoke(cmd, ["--d", "2.5ms"])
    assert (r.exit_code, r.stdout) == (0, "2500000\n")
    assert CliRunner().invoke(cmd, []).stdout == "0\n"
    r = CliRunner().invoke(cmd, ["--d", "soon"], prog_name="cmd")
    assert r.exit_code == 2
    assert r.stderr.endswith("Error: Invalid value for '--d': not a duration: 'soon' (use e.g. 500us, 5ms, "
                             "2s, 1m)\n")


@pytest.mark.parametrize("ns, text", [
    (None, "-"), (0, "0ns"), (950, "950ns"), (999.4, "999ns"), (999.6, "1us"), (12_345, "12.3us"),
    (999_499, "999us"), (999_500, "1ms"), (999_999, "1ms"), (4_560_000, "4.56ms"),
    (999_999_999, "1s"), (1_230_000_000, "1.23s"), (59_000_000_000, "59s"), (60e9, "1m00s"),
    (123e9, "2m03s"), (7500e9, "2h05m"), (-5_000_000, "-5ms"),
])
def test_fmt_ns(ns, text):
    assert fmt_ns(ns) == text


def test_fmt_ns_never_uses_exponents_between_units():
    for exp in range(3, 13):
        for mant in (0.9994, 0.9995, 0.99999, 1.0):
            assert "e" not in fmt_ns(mant * 10**exp), mant * 10**exp

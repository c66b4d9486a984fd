"""The filter bundle on every command that reads a stream: stats, heat
(file and --live), export and replay apply record's filters through the one
reader, so `cmd -p X rec` is `replay -p X rec | cmd`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from pstate.main import cli
from pstate.stream import schema
from pstate.stream.filters import Filter
from pstate.stream.reader import read_records
from conftest import ROOT, TESTS

DATA = TESTS / "data" / "replay"
MIXED = DATA / "mixed.jsonl"

FILTERS = [
    ["-p", "100"],
    ["-t", "101"],
    ["-c", "worker"],
    ["--state", "D"],
    ["--min-dur", "5ms"],
    ["--cpu", "1"],
    ["-p", "100", "--state", "sleeping", "--min-dur", "1ms"],
]


def run(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input, prog_name="pstate")


def replayed(args) -> str:
    r = run("replay", "--no-wait", *args, MIXED)
    assert r.exit_code == 0, r.output
    return r.stdout


def prefiltered(args, tmp_path) -> Path:
    """MIXED with only the events the filter of args passes, its own meta
    and end records kept."""
    from pstate.commands.options import filter_options
    import click

    got = {}

    @click.command()
    @filter_options
    def probe(filt):
        got["filt"] = filt

    CliRunner().invoke(probe, list(args), catch_exceptions=False)
    filt = got["filt"]
    (tmp_path / "filtered").mkdir()
    out = tmp_path / "filtered" / MIXED.name  # the same name: heat prints it
    with open(out, "wb") as f:
        for line in MIXED.read_bytes().splitlines(keepends=True):
            rec = orjson.loads(line)
            if rec.get("type") not in schema.EVENT_TYPES or filt.match(rec):
                f.write(line)
    return out


def _groups(text: str) -> list:
    rep = orjson.loads(text)
    # (not the time in state: replay's end trailer is its last event, not the recording's end)
    return sorted(((g["key"], g["transitions"], g["voluntary"], g["latency"]) for g in rep["groups"]), key=repr)


def test_the_reader_keeps_what_filter_match_keeps():
    filt = Filter(pids=(100,), states=("sleeping",))
    got = list(read_records([str(MIXED)], filt=filt))
    every = list(read_records([str(MIXED)]))
    want = [r for r in every if r["type"] not in schema.EVENT_TYPES or filt.match(r)]
    assert [r for r in got if r["type"] != "meta"] == [r for r in want if r["type"] != "meta"]
    meta = got[0]
    assert meta["read_filter_pid"] == [100] and meta["read_filter_state"] == ["sleeping"]


@pytest.mark.parametrize("args", FILTERS, ids=" ".join)
def test_stats_filters_as_replay_does(args):
    direct = run("stats", "-f", "json", *args, MIXED)
    assert direct.exit_code == 0, direct.output
    piped = run("stats", "-f", "json", input=replayed(args))
    assert piped.exit_code == 0, piped.output
    assert _groups(direct.stdout) == _groups(piped.stdout)
    led, pled = orjson.loads(direct.stdout)["ledger"], orjson.loads(piped.stdout)["ledger"]
    assert (led["transition_filters"], led["task_filters"]) == (pled["transition_filters"], pled["task_filters"])
    assert led["read_filters"] and not pled["read_filters"]


def test_stats_says_which_filters_it_applied():
    r = run("stats", "--state", "D", MIXED)
    assert r.exit_code == 0, r.output
    assert "FILTERED: read with --state: only the transitions that passed are here" in r.stdout
    r = run("stats", "-p", "100", MIXED)
    assert "filtered: read with --pid: only the tasks kept." in r.stdout


@pytest.mark.parametrize("args", FILTERS, ids=" ".join)
def test_heat_filters_as_filter_match_does(args, tmp_path):
    direct = run("heat", "--width", "80", "--no-color", *args, MIXED)
    assert direct.exit_code == 0, direct.output
    piped = run("heat", "--width", "80", "--no-color", prefiltered(args, tmp_path))
    assert piped.exit_code == 0, piped.output
    assert direct.stdout == piped.stdout


def _live_map(*args) -> list[str]:
    """The rows and legend of heat --live's last frame over a file (its
    status line counts input lines, which a filtered copy has fewer of)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "cli")}
    p = subprocess.run([sys.executable, "-m", "pstate", "heat", "--live", "--width", "80", "--no-color",
                        *map(str, args)], capture_output=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    frame = p.stdout.decode().split("\n\n")[-1].splitlines()
    return [x for x in frame if not re.match(r"\d\d:\d\d:\d\d ", x)]


@pytest.mark.parametrize("args", [["-p", "100"], ["--state", "D"]], ids=" ".join)
def test_heat_live_filters_as_filter_match_does(args, tmp_path):
    direct = _live_map(*args, MIXED)
    assert len(direct) > 5
    assert direct == _live_map(prefiltered(args, tmp_path))


@pytest.mark.parametrize("args", [["-p", "100"], ["--cpu", "1"]], ids=" ".join)
def test_export_filters_as_filter_match_does(args, tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    r = run("export", "-f", "chrome", "-q", "-o", a, *args, MIXED)
    assert r.exit_code == 0, r.output
    src = prefiltered(args, tmp_path)
    r = run("export", "-f", "chrome", "-q", "-o", b, src)
    assert r.exit_code == 0, r.output
    strip = lambda ev: [e for e in ev["traceEvents"] if e.get("ph") != "M" or e.get("name") != "process_name"]  # noqa: E731
    assert strip(orjson.loads(a.read_bytes())) == strip(orjson.loads(b.read_bytes()))

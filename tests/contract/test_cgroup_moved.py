"""A thread moved to another cgroup mid-stream (tests/data/stats/moved.jsonl,
synthetic): each interval counts under the cgroup of the record that ends
it, the record's own when it carries one, its process record's when it does
not (null on the tracepoint path, or absent in an older recording); the time
after a thread's last record under that record's. The native digester and
the careful path agree; --cgroup keeps the records by the same rule."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from pstate.main import cli
from conftest import TESTS

HERE = TESTS
DATA = HERE / "data" / "stats" / "moved.jsonl"
GOLDEN = HERE / "golden" / "stats" / "moved-cgroup.txt"
MS = 1_000_000
A, B = "/app.slice/a.service", "/app.slice/b.service"


def run(*args: str, reader: str = "fast"):
    r = CliRunner().invoke(cli, ["stats", str(DATA), "--reader", reader, *args], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    return r.stdout


def states(*args: str, reader: str = "fast") -> dict:
    rep = orjson.loads(run("-f", "json", *args, reader=reader))
    return {g["key"]: {s: v["ns"] // MS for s, v in g["states"].items()} for g in rep["groups"]}


@pytest.mark.parametrize("reader", ["fast", "careful"])
def test_each_interval_goes_to_the_cgroup_of_the_record_that_ends_it(reader):
    # thread 11: 100 ms on CPU in a; asleep, moved, woken in b (200 ms), 10 ms queued and
    # 300 ms on CPU in b; a wake-up with cgroup null (100 ms asleep) and a switch-in without
    # one (20 ms queued): its process's, a; 60 ms on CPU in b, then asleep in b to the end
    # (200 ms). pid 20 carries none: all in a (its process's).
    assert states("--by", "cgroup", reader=reader) == {
        A: {"running": 100 + 840, "runnable": 20 + 10, "sleeping": 100 + 100},
        B: {"running": 300 + 60, "runnable": 10, "sleeping": 200 + 200}}
    assert states("--by", "unit", reader=reader) == {
        "a.service": states("--by", "cgroup")[A], "b.service": states("--by", "cgroup")[B]}
    # --cgroup: the records that carry b's id (and the time after the last of them)
    assert states("--by", "cgroup", "--cgroup", B, reader=reader) == {B: states("--by", "cgroup")[B]}
    # the title is the process's whatever the cgroup: thread 11's time is all its process's
    by_title = states("--by", "title", reader=reader)
    assert by_title["worker --serve"] == {"running": 100 + 300 + 60, "runnable": 10 + 20,
                                          "sleeping": 200 + 100 + 200}


def test_golden_by_cgroup():
    text = run("--by", "cgroup")
    if os.environ.get("PSTATE_REGEN") == "1":
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert text == run("--by", "cgroup", reader="careful")


def test_heat_draws_each_interval_in_the_row_of_the_record_that_ends_it():
    """b's row: asleep from its move (ended by a wake-up in b), queued, on CPU
    to 620 ms; nothing while the records that end the next intervals carry
    no cgroup (a's); on CPU again from 740 ms and asleep to the end."""
    r = CliRunner().invoke(cli, ["heat", str(DATA), "--by", "cgroup"], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    golden = HERE / "golden" / "heat" / "moved-cgroup.txt"
    if os.environ.get("PSTATE_REGEN") == "1":
        golden.write_text(r.stdout)
    assert r.stdout == golden.read_text()
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.startswith("/app.slice/")}
    b = rows[B][len(B) + 1:]
    assert b.startswith("      ....") and "+###" in b and "  ####" in b and b.endswith("....")


def test_export_chrome_carries_each_slice_cgroup(tmp_path):
    out = tmp_path / "moved.json"
    r = CliRunner().invoke(cli, ["export", "-f", "chrome", "-o", str(out), str(DATA)], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    slices = [e for e in orjson.loads(out.read_bytes())["traceEvents"] if e.get("ph") == "X" and e["tid"] == 11]
    assert [(e["name"], e["dur"] * 1000 // MS, e.get("args", {}).get("cgroup")) for e in slices] == [
        ("running", 100, 100), ("sleeping", 200, 200), ("runnable", 10, 200), ("running", 300, 200),
        ("sleeping", 100, None), ("runnable", 20, None), ("running", 60, 200), ("sleeping", 200, 200)]

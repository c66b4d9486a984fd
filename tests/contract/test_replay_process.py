"""pstate replay as a real process: timing, live pipes, a closed pipe and signals."""

from __future__ import annotations

import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TESTS, clean_env, pstate_cmd
from workloads import SCHED_LATE_MEDIAN_S, SCHED_LATE_S

DATA = TESTS / "data" / "replay"
TWO = DATA / "two_seconds.jsonl"  # 41 events, 50 ms apart: they span 2.0 s
SNAPS = DATA / "snaps"  # 3 snapshots, interval ends 1 s apart


def arrivals(*args) -> tuple[list[tuple[float, dict]], bytes, int]:
    """Run replay; return each output record with the time it arrived, its
    stderr and exit code. (Times are compared with each other only: the
    first record comes after the interpreter's start-up, which a loaded
    machine stretches.)"""
    p = subprocess.Popen(pstate_cmd("replay", *map(str, args)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=clean_env())
    got = [(time.monotonic(), json.loads(line)) for line in p.stdout]
    err = p.stderr.read()
    rc = p.wait(timeout=30)
    return got, err, rc


def event_span(got) -> float:
    times = [t for t, rec in got if rec["type"] == "state"]
    return times[-1] - times[0]


def no_wait_around_the_events(got) -> None:
    """The first event follows the meta record at once, and the trailer the
    last event: the run takes the events' time, no more."""
    states = [t for t, rec in got if rec["type"] == "state"]
    assert got[0][1]["type"] == "meta" and got[-1][1]["type"] == "end"
    assert states[0] - got[0][0] < SCHED_LATE_S and got[-1][0] - states[-1] < SCHED_LATE_S


def test_speed_1_takes_the_original_time():
    got, err, rc = arrivals(TWO)
    assert (rc, err) == (0, b"")
    span = event_span(got)
    assert abs(span - 2.0) < SCHED_LATE_S, f"events spanned {span:.3f} s"
    no_wait_around_the_events(got)
    # Each event is written when it is due, not in bursts: a burst would
    # hold back the events before it, and lateness would add up.
    first_t, first_ts = next((t, r["ts"]) for t, r in got if r["type"] == "state")
    late = [abs((t - first_t) - (r["ts"] - first_ts) / 1e9) for t, r in got if r["type"] == "state"]
    assert statistics.median(late) < SCHED_LATE_MEDIAN_S and max(late) < SCHED_LATE_S, late


def test_speed_10_takes_a_tenth():
    got, err, rc = arrivals(TWO, "--speed", "10")
    assert (rc, err) == (0, b"")
    span = event_span(got)
    assert abs(span - 0.2) < SCHED_LATE_S / 2, f"events spanned {span:.3f} s"
    no_wait_around_the_events(got)


def test_snapshots_are_paced_by_their_interval_ends():
    got, err, rc = arrivals(SNAPS, "--speed", "10")
    assert (rc, err) == (0, b"")
    metas = [t for t, rec in got if rec["type"] == "meta"]
    assert len(metas) == 3
    assert abs(metas[-1] - metas[0] - 0.2) < SCHED_LATE_S / 2


def test_live_input_is_passed_on_at_once():
    # `record | replay -p X`: each event must come out while the input is still open.
    p = subprocess.Popen(pstate_cmd("replay", "--no-wait", "-p", "100"), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    lines = TWO.read_bytes().splitlines(keepends=True)
    fd = p.stdout.fileno()
    got = b""
    try:
        p.stdin.write(lines[0] + lines[1])
        p.stdin.flush()
        deadline = time.monotonic() + 10
        while got.count(b"\n") < 2 and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.1)[0]:
                got += os.read(fd, 65536)
        assert [json.loads(x)["type"] for x in got.splitlines()] == ["meta", "state"]
    finally:
        p.stdin.close()
    rest = p.stdout.read()
    err = p.stderr.read()
    assert (p.wait(timeout=10), err) == (0, b"")
    assert json.loads(rest.splitlines()[-1])["reason"] == "eof"


def shell(cmd: str) -> subprocess.CompletedProcess:
    # PYTHONUNBUFFERED is removed: it hides errors at the interpreter's last flush.
    return subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, env=clean_env(),
                          timeout=60)


def test_head_closes_the_pipe_quietly():
    p = shell(f"{sys.executable} -m pstate replay {TWO} | head -n 1")
    assert (p.returncode, p.stderr) == (0, b"")
    assert json.loads(p.stdout)["replayed"] is True


def test_head_closes_the_pipe_quietly_at_full_speed(tmp_path):
    big = tmp_path / "big.jsonl"
    lines = TWO.read_text().splitlines(keepends=True)
    big.write_text(lines[0] + "".join(lines[1:-1]) * 2000)  # ~13 MB: more than a pipe holds
    p = shell(f"{sys.executable} -m pstate replay --no-wait {big} | head -n 1")
    assert (p.returncode, p.stderr) == (0, b"")
    p = shell(f"{sys.executable} -m pstate replay --no-wait -p 100 {big} | head -n 3")
    assert (p.returncode, p.stderr) == (0, b"")
    assert len(p.stdout.splitlines()) == 3


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_ends_with_a_trailer(sig):
    p = subprocess.Popen(pstate_cmd("replay", str(TWO)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=clean_env())
    head = [p.stdout.readline() for _ in range(3)]  # meta and two events: it is pacing now
    p.send_signal(sig)
    out, err = p.communicate(timeout=10)
    assert (p.returncode, err) == (0, b"")
    recs = [json.loads(x) for x in head + out.splitlines()]
    end = recs[-1]
    assert (end["type"], end["reason"]) == ("end", "signal")
    n = sum(1 for r in recs if r["type"] == "state")
    assert end["events"] == n and 2 <= n < 41


def test_module_runs_outside_the_checkout(tmp_path):
    p = subprocess.run(pstate_cmd("replay", "--no-wait", str(TWO)), capture_output=True, cwd=tmp_path,
                       env=clean_env(), timeout=30)
    assert (p.returncode, p.stderr) == (0, b"")

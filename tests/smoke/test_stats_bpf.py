"""End to end, as root: `pstate record -p CHILD` around a controlled workload,
piped into `pstate stats --format json`, gives the workload's known times."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import orjson
import pytest

import workloads
from conftest import clean_env, pstate_cmd

pytestmark = pytest.mark.bpf


def record_into_stats(child: subprocess.Popen, during=None, lines: list | None = None) -> dict:
    """Run record on the child, pipe it into stats, let the child go, and
    return the stats report once record has ended on SIGINT; the lines
    record wrote are added to `lines`."""
    rec = subprocess.Popen(pstate_cmd("record", "-q", "-p", str(child.pid)), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=clean_env())
    stats = None
    try:
        meta = rec.stdout.readline()  # record is attached once its meta line is out
        assert meta, rec.stderr.read().decode(errors="replace")
        stats = subprocess.Popen(pstate_cmd("stats", "--format", "json"), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
        stats.stdin.write(meta)
        if lines is not None:
            lines.append(meta)

        def relay():
            try:
                for line in rec.stdout:
                    stats.stdin.write(line)
                    if lines is not None:
                        lines.append(line)
            finally:
                stats.stdin.close()

        pump = threading.Thread(target=relay, daemon=True)
        pump.start()
        workloads.go(child)
        if during:
            during(child)
        child.wait(timeout=60)
        time.sleep(0.2)  # let record drain the last events
        rec.send_signal(signal.SIGINT)
        rec.wait(timeout=30)
        pump.join(timeout=30)
        stats.stdin = None  # closed by the relay
        out, err = stats.communicate(timeout=60)
        assert stats.returncode == 0, err.decode(errors="replace")
        return orjson.loads(out)
    finally:
        for p in (child, rec, stats):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def group(rep: dict, pid: int) -> dict:
    groups = [g for g in rep["groups"] if g["pid"] == pid]
    assert groups, [g["pid"] for g in rep["groups"]]
    return groups[0]


def test_sleeper_sleeps_one_second():
    child = workloads.start(workloads.SLEEPER.format(n=20, secs=0.05))
    lines: list[bytes] = []
    rep = record_into_stats(child, lines=lines)
    recs = [orjson.loads(x) for x in lines]
    # every nap's end is a wake-up, but for those this VM did not trace
    # (workloads.sleeps): a switch-in straight from sleeping, or the next
    # switch-out with no duration, whose time stats gives no state
    wakes, untraced = workloads.sleeps(recs, child.pid, 20, 49e6, 95e6)
    mine = workloads.states(recs, child.pid)
    unknown = sum(workloads.untraced_runs(mine))
    g = group(rep, child.pid)
    slept = g["states"]["sleeping"]["ns"]
    assert -100_000_000 - unknown <= slept - 1_000_000_000 <= 100_000_000, (g["states"], unknown)
    blocked = g["latency"]["blocked_sleeping"]
    assert blocked["count"] >= 20 - len(untraced)
    assert 45_000_000 <= blocked["p50_ns"] <= 60_000_000
    assert rep["input"]["complete"], rep["input"]


def test_sigstop_for_300ms_is_stopped_time():
    child = workloads.start(workloads.BUSY.format(secs=1.0))

    def stop_and_continue(c):
        time.sleep(0.2)
        os.kill(c.pid, signal.SIGSTOP)
        time.sleep(0.3)
        os.kill(c.pid, signal.SIGCONT)

    rep = record_into_stats(child, during=stop_and_continue)
    g = group(rep, child.pid)
    stopped = g["states"]["stopped"]["ns"]
    assert abs(stopped - 300_000_000) <= 30_000_000, g["states"]
    assert g["latency"]["blocked_stopped"]["count"] == 1

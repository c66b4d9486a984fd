"""The kernel's latency histograms (bpf/snaphist.h) against workloads whose
truth the kernel itself reports: /proc/PID/task/TID/schedstat counts every
arrival on a CPU (each one ends a run-queue wait) and sums the run-queue
delay. Both probe paths (PSTATE_PROBES)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from conftest import clean_env, pstate_cmd
from pstate.engines.stats import snapshot_stats
from pstate.snapshots import snapdir
from test_snap_bpf import snap_start, wait_collecting
from workloads import V2Cgroups, kill_all

# run-queue waits of hogs pinned to CPUs, compared with the kernel's counts: alone
pytestmark = [pytest.mark.bpf, pytest.mark.kernel, pytest.mark.serial]

HOG = "import sys\nsys.stdin.read(1)\nwhile True: pass\n"
TICKER = "import sys, time\nsys.stdin.read(1)\nwhile True: time.sleep(0.001)\n"
# A hog whose slice is 50 ms (sched_setattr's sched_runtime: Linux 6.12's
# custom slices): two of them on one CPU keep each other waiting for 50 ms
# at a time, longer than the default slice (3 ms) of any task that may
# share the CPU and preempt one of them.
LONG_SLICE_HOG = """
import ctypes, struct, sys
attr = ctypes.create_string_buffer(struct.pack("=IIQiIQQQII", 56, 0, 0, 0, 0, 50_000_000, 0, 0, 0, 0), 56)
if ctypes.CDLL(None, use_errno=True).syscall(314, 0, attr, 0) != 0:  # sched_setattr(self) on x86_64
    sys.exit(f"sched_setattr: errno {ctypes.get_errno()}")
sys.stdin.read(1)
while True: pass
"""


def pinned(code: str) -> subprocess.Popen:
    return subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", code], stdin=subprocess.PIPE,
                            start_new_session=True)


def schedstat(pid: int) -> tuple[int, int]:
    """(run-queue waits ended, run-queue ns) over the process's threads."""
    waits = delay = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            _on_cpu, run_delay, arrivals = map(int, f.read().split())
        waits += arrivals
        delay += run_delay
    return waits, delay


def prom_series(text: str) -> dict[str, float]:
    return {k: float(v) for k, v in (x.rsplit(" ", 1) for x in text.splitlines() if x and x[0] != "#")}


def of_pid(series: dict[str, float], name: str, pid: int, after: str) -> float:
    """The value of a pstate_runqueue_wait_seconds series of one pid (--prom-by pid), 0 if none."""
    pat = re.compile(rf'{name}\{{pid="{pid}",comm="[^"]*",after="{after}"\}}$')
    return sum(v for k, v in series.items() if pat.match(k))


@contextlib.contextmanager
def running(snap: subprocess.Popen):
    """The workload processes the block starts (append them to the list it
    gets); they and snap are killed on the way out, whatever happened."""
    kids: list[subprocess.Popen] = []
    try:
        yield kids
    finally:
        kill_all(kids)
        if snap.poll() is None:
            snap.kill()
            snap.wait()


def go(p: subprocess.Popen) -> subprocess.Popen:
    p.stdin.write(b"g")
    p.stdin.flush()
    return p


def test_runqueue_histogram_counts_every_wait_of_two_hogs_and_a_ticker(tmp_path):
    """The workload lives wholly inside the snapshot's interval (started
    after the programs were attached, killed before it ends), so the
    histogram and schedstat count the same waits; schedstat is read just
    before the kill, which adds a few waits of dying."""
    out = tmp_path / "prom"
    snap = snap_start("--dir", out, "-i", "7s", "--format", "prom", "--prom-by", "pid")
    with running(snap) as kids:
        wait_collecting(snap)
        time.sleep(0.5)  # seeding is over
        kids += [pinned(HOG), pinned(HOG), pinned(TICKER)]
        for k in kids:
            go(k)
        time.sleep(3)
        truth = [schedstat(k.pid) for k in kids]
        kill_all(kids)
        assert snap.wait(timeout=60) == 0, snap.stderr.read()
    series = prom_series((out / snapdir.PROM_NAME).read_text())
    count = total = 0.0
    for k in kids:
        for after in ("wakeup", "preemption"):
            count += of_pid(series, "pstate_runqueue_wait_seconds_count", k.pid, after)
            total += of_pid(series, "pstate_runqueue_wait_seconds_sum", k.pid, after)
    waits, delay = sum(w for w, _d in truth), sum(d for _w, d in truth) / 1e9
    assert waits > 2000, truth  # a 1 ms ticker for 3 s, and the hogs preempting each other
    assert abs(count - waits) <= 0.01 * waits, (count, waits)
    assert abs(total - delay) <= 0.01 * delay, (total, delay)
    # the preemptions are the hogs', the wake-ups mostly the ticker's
    assert of_pid(series, "pstate_runqueue_wait_seconds_count", kids[2].pid, "wakeup") > 1000


def test_stats_shows_a_groups_p99_rising_when_a_hog_joins(tmp_path):
    """A group of one hog on a CPU: only other tasks preempt it, for at most
    their slices. After the second snapshot a second hog joins the group on
    that CPU: the two take turns of 50 ms, and the p99 of the group's
    preempted waits rises to that. (The first interval holds the start-up
    of the hog's Python, the third the second one's.)"""
    if os.uname().machine != "x86_64":
        pytest.skip("the hogs call sched_setattr by its x86_64 number")
    with open("/proc/self/sched") as f:
        if "slice" not in f.read():
            pytest.skip("no custom slices (Linux 6.12)")
    out = tmp_path / "jsonl"
    with V2Cgroups("svc") as cg:
        path = cg.paths[0]
        snap = snap_start("--dir", out, "--every", "1500ms", "--count", "5", "--prom-by", "cgroup")
        with running(snap) as kids:
            wait_collecting(snap)
            for _ in range(2):
                kids.append(pinned(LONG_SLICE_HOG))
                cg.move(kids[-1].pid, path)
                if len(kids) == 1:
                    go(kids[0])
                    deadline = time.monotonic() + 30
                    while len(list(out.glob("pstate-snap-*.jsonl"))) < 2 and time.monotonic() < deadline:
                        time.sleep(0.05)
            go(kids[1])
            assert snap.wait(timeout=60) == 0, snap.stderr.read()
    assert all(k.poll() is not None and k.returncode == -9 for k in kids), [k.returncode for k in kids]
    buf = io.StringIO()
    assert snapshot_stats([str(out)], fmt="json", top=None, by="pid", out=buf, err=io.StringIO()) == 0
    lat = orjson.loads(buf.getvalue())["latency"]
    mine = next(e for e in lat if e["group"] == path and e["kind"] == "runq_preempted")
    p99 = {p["interval"]: p["p99_ns"] for p in mine["series"]}
    assert {3, 4} <= set(p99), mine
    after = min(p99[3], p99[4])
    assert after >= 1 << 25, p99  # turns of 50 ms: the bucket (2^25, 2^26] ns
    assert after > 4 * p99.get(1, 0), p99  # the hog alone, preempted by others (if at all)
    buf = io.StringIO()
    snapshot_stats([str(out)], fmt="table", top=None, by="pid", out=buf, err=io.StringIO())
    assert any(line.startswith(path[:30]) and "runq preempted" in line for line in buf.getvalue().splitlines())

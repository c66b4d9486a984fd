"""A filtered recording keeps what its followed tasks' why-views need
(root, BPF): `record -p` and an unfiltered `record`, running at the same
time on the same workload, give a followed task the same antagonists (the
slices of the tasks it does not follow on the CPU it waited for: slice
records) and the same wakers, by name (waker records)."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

import workloads
from pstate.main import cli
from pstate.analysis import causes

pytestmark = pytest.mark.bpf

# The followed task and its waker ping-pong through two pipes; the waker
# renames itself first, so that its name is its own.
PONG = """
import os, sys
r, w = int(sys.argv[1]), int(sys.argv[2])
sys.stdin.read(1)
for _ in range({n}):
    os.read(r, 1)
    os.write(w, b"o")
"""
WAKER = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(15, b"pp-waker", 0, 0, 0)
r, w = int(sys.argv[1]), int(sys.argv[2])
sys.stdin.read(1)
for _ in range({n}):
    os.write(w, b"i")
    os.read(r, 1)
"""
N = 3000


def why(tmp_path, name: str, recs: list[dict], pid: int) -> dict:
    path = tmp_path / f"{name}.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    res = CliRunner().invoke(cli, ["stats", str(path), "-f", "json", "--by", "pid", "--wakers", "--antagonists",
                                   "--top", "100000"], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    return next(g for g in orjson.loads(res.stdout)["groups"] if g["key"] == pid)


def test_a_filtered_and_an_unfiltered_recording_at_once_give_the_same_why(tmp_path):
    import os
    import subprocess
    import sys
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    followed = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", PONG.format(n=N), str(a_r), str(b_w)],
                                stdin=subprocess.PIPE, pass_fds=(a_r, b_w))
    waker = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", WAKER.format(n=N), str(b_r), str(a_w)],
                             stdin=subprocess.PIPE, pass_fds=(b_r, a_w))
    for fd in (a_r, a_w, b_r, b_w):
        os.close(fd)
    hog = workloads.start(workloads.BUSY.format(secs=60), cpu=1)  # holds the followed task's CPU
    kids = [followed, waker, hog]
    try:
        filtered = workloads.Recording("-p", str(followed.pid), "--antagonists")
        unfiltered = workloads.Recording()
        workloads.go(*kids)
        for k in (followed, waker):
            assert k.wait(timeout=120) == 0
        recs = {"filtered": filtered.stop(), "unfiltered": unfiltered.stop()}
    finally:
        workloads.kill_all(kids)
    for name, rs in recs.items():
        assert rs[-1]["type"] == "end" and rs[-1]["lost"] == 0, (name, rs[-1])
    kinds = {name: {r["type"] for r in rs} for name, rs in recs.items()}
    assert {"slice", "waker"} <= kinds["filtered"] and not {"slice", "waker"} & kinds["unfiltered"], kinds
    # the filtered one follows one process: other tasks show only in its slice and waker records
    assert {r["pid"] for r in recs["filtered"] if r["type"] == "state"} == {followed.pid}
    got = {name: why(tmp_path, name, rs, followed.pid) for name, rs in recs.items()}
    ants = {name: {a["tid"]: a["ns"] for a in g["antagonists"]} for name, g in got.items()}
    print(f"\n  antagonists (tid: ns): {ants}")
    held = ants["unfiltered"].get(hog.pid, 0)
    assert held > 0 and abs(ants["filtered"].get(hog.pid, 0) - held) <= 0.01 * held, ants
    waited = {name: sum(a.values()) for name, a in ants.items()}
    assert abs(waited["filtered"] - waited["unfiltered"]) <= 0.01 * waited["unfiltered"], waited
    wakers = {name: {(w["kind"], w["tid"], w["pid"], w["comm"]): w["count"] for w in g["wakers"]}
              for name, g in got.items()}
    print(f"  wakers: {wakers}")
    named = {name: {k[:4] for k in w if k[0] == "task"} for name, w in wakers.items()}
    assert named["filtered"] == named["unfiltered"] and ("task", waker.pid, waker.pid, "pp-waker") in named["filtered"]
    assert causes.UNKNOWN_WAKER not in {w["comm"] for g in got.values() for w in g["wakers"]}


def test_a_storm_on_another_cpu_adds_no_slice():
    """Slices are kept per CPU: only the switch-outs of a CPU where a
    followed task waits. The followed task is pinned to CPU 0 beside a hog;
    a ping-pong storm on CPU 1 switches thousands of times meanwhile and
    gives no slice record (one gate for every CPU wrote each of them)."""
    import os
    import subprocess
    import sys
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    storm = [subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", code.format(n=20 * N), str(r), str(w)],
                              stdin=subprocess.PIPE, pass_fds=(r, w))
             for code, r, w in ((PONG, a_r, b_w), (WAKER, b_r, a_w))]
    for fd in (a_r, a_w, b_r, b_w):
        os.close(fd)
    followed = workloads.start(workloads.BUSY.format(secs=1.0), cpu=0)
    hog = workloads.start(workloads.BUSY.format(secs=60), cpu=0)  # so that the followed task waits
    kids = [followed, hog, *storm]
    try:
        rec = workloads.Recording("-p", str(followed.pid), "--antagonists")
        workloads.go(*kids)
        assert followed.wait(timeout=60) == 0
        recs = rec.stop()
    finally:
        workloads.kill_all(kids)
    assert recs[-1]["type"] == "end" and recs[-1]["lost"] == 0, recs[-1]
    slices = [r for r in recs if r["type"] == "slice"]
    by_cpu = {cpu: sum(r["cpu"] == cpu for r in slices) for cpu in (0, 1)}
    print(f"\n  slice records by CPU: {by_cpu}")
    assert by_cpu[0] > 0 and by_cpu[1] == 0, by_cpu
    assert hog.pid in {r["tid"] for r in slices if r["cpu"] == 0}


def test_a_followed_task_moved_while_it_waits_is_counted_where_it_waits():
    """A followed task moved from one CPU's run queue to another's while it
    waits (its affinity flips every 20 ms between two CPUs, each held by a
    hog) is counted on the CPU it moved to (sched_migrate_task): each of its
    waits ends with the switch-out of the task that hands it the CPU, and
    that switch-out is always a slice record. Counted where it was queued,
    the handoffs after a move were not.

    (A reader credits a wait with the slices of the CPU the task got, over
    the whole wait: an unfiltered recording, which has every switch-out,
    then also credits those of that CPU before the task moved there, which
    a filtered one does not have. Pinned tasks, as in the test above, wait
    where they run.)"""
    import os
    import time
    followed = workloads.start(workloads.BUSY.format(secs=1.5), cpu=1)
    hogs = [workloads.start(workloads.BUSY.format(secs=60), cpu=c) for c in (0, 1)]
    kids = [followed, *hogs]
    try:
        rec = workloads.Recording("-p", str(followed.pid), "--antagonists")
        everything = workloads.Recording()  # what the kernel traced of the others
        workloads.go(*kids)
        moves = 0
        while followed.poll() is None:
            moves += 1
            try:
                os.sched_setaffinity(followed.pid, {moves % 2})
            except ProcessLookupError:
                break
            time.sleep(0.02)
        assert followed.wait(timeout=60) == 0
        recs, every = rec.stop(), everything.stop()
    finally:
        workloads.kill_all(kids)
    for rs in (recs, every):
        assert rs[-1]["type"] == "end" and rs[-1]["lost"] == 0, rs[-1]
    slices = {(r["cpu"], r["ts"], r["tid"]) for r in recs if r["type"] == "slice"}
    waits = [r for r in recs if r["type"] == "state" and r["tid"] == followed.pid and r["cause"] == "switch_in"
             and r["from"] in ("runnable", "preempted") and r["dur_ns"] is not None and r.get("prev_tid")]
    assert {w["cpu"] for w in waits} == {0, 1} and moves >= 20, moves
    missing = [w for w in waits if (w["cpu"], w["ts"], w["prev_tid"]) not in slices]
    # A slice needs its task's switch-in (its duration): one the kernel did
    # not trace (on this VM, a switch back from its agent's thread) leaves
    # none, as the unfiltered recording shows (a switch-out with no duration
    # there, within a millisecond: the two programs read the clock apart).
    outs = {}
    for r in every:
        if r["type"] == "state" and r["cause"] == "switch_out":
            outs.setdefault((r["cpu"], r["tid"]), []).append(r)
    untraced = [w for w in missing if any(o["dur_ns"] is None and abs(o["ts"] - w["ts"]) < 1_000_000
                                          for o in outs.get((w["cpu"], w["prev_tid"]), ()))]
    print(f"\n  {moves} moves, {len(waits)} waits handed over by a task, {len(missing)} with no slice, "
          f"{len(untraced)} of them after a switch-in not traced")
    assert len(missing) == len(untraced), [w for w in missing if w not in untraced][:5]

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

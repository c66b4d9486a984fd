"""pstate snap's two kinds of task map give the same rows.

With pid_max <= --max-tasks the kernel side keeps a thread's row in an array
indexed by tid and seeds wait in a hash until the thread's first event; else
the rows live in a hash that seeding fills directly. The tid_array_rows
fixture gives a --max-tasks that every tid fits (lowering pid_max for the
test where it is larger); --max-tasks 1024 gives the hash. Each test runs
once per kind, against truths it
controls: a thread asleep all along, one stopped all along, one stopped
during the run, and a zombie reaped during the run, all older than snap.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import clean_env, pstate_cmd
from pstate.snapshots import snapdir
from pstate.snapshots.taskmaps import boottime_offset_ns
from test_snap_bpf import py, read_dir, snap_start, wait_collecting

pytestmark = pytest.mark.bpf

KINDS = ("array", "hash")


@pytest.fixture
def kind_opts(request):
    """snap options giving the map kind under test (the array: every tid fits)."""
    if request.param == "hash":
        return ["--max-tasks", "1024"]
    return ["--max-tasks", str(request.getfixturevalue("tid_array_rows"))]
MS = 1_000_000

ZOMBIE_PARENT = """
import os, sys
pid = os.fork()
if pid == 0:
    os._exit(0)
print(pid, flush=True)
sys.stdin.read(1)
os.waitpid(pid, 0)
print("reaped", flush=True)
sys.stdin.read(1)
"""

TICKER = """
import time
print("ready", flush=True)
while True:
    time.sleep(0.01)
"""


def proc_state(pid: int) -> str:
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return chr(data[data.rindex(b")") + 2])


def proc_start_ns(pid: int) -> int:
    """A thread's start on the monotonic clock, as seeding computes it."""
    data = Path(f"/proc/{pid}/stat").read_bytes()
    ticks = int(data[data.rindex(b")") + 2:].split()[19])
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK") - boottime_offset_ns()


def wait_state(pid: int, letter: str, timeout: float = 5) -> None:
    end = time.monotonic() + timeout
    while proc_state(pid) != letter:
        assert time.monotonic() < end, (pid, proc_state(pid))
        time.sleep(0.01)


def kind_of(opts: list[str]) -> bool:
    text = subprocess.run(pstate_cmd("snap", "--ebpf", *opts), capture_output=True, text=True, env=clean_env(),
                          timeout=30, check=True).stdout
    return "#define TASKS_BY_TID\n" in text.split("// pstate snap:", 1)[0]


@pytest.mark.parametrize("kind_opts", KINDS, indirect=True)
def test_options_give_the_map_kind(kind_opts, request):
    assert kind_of(kind_opts) == (request.node.callspec.params["kind_opts"] == "array")


@pytest.mark.parametrize("kind_opts", KINDS, indirect=True)
def test_threads_older_than_snap_keep_their_proc_seed(kind_opts, tmp_path):
    sleeper = py("import time; print('ready', flush=True); time.sleep(3600)")
    stopped = subprocess.Popen(["sleep", "3600"])
    ticker = py(TICKER)
    parent = py(ZOMBIE_PARENT)
    snap = None
    try:
        assert sleeper.stdout.readline() == b"ready\n" and ticker.stdout.readline() == b"ready\n"
        zombie = int(parent.stdout.readline())
        os.kill(stopped.pid, signal.SIGSTOP)
        wait_state(stopped.pid, "T")
        wait_state(zombie, "Z")
        wait_state(sleeper.pid, "S")
        born = {p: proc_start_ns(p) for p in (sleeper.pid, stopped.pid, ticker.pid, zombie)}
        snap = snap_start("--dir", tmp_path, "-i", "1.5", *kind_opts)
        wait_collecting(snap)
        time.sleep(0.4)
        t_stop = time.monotonic_ns()
        os.kill(ticker.pid, signal.SIGSTOP)
        time.sleep(0.2)
        t_reap = time.monotonic_ns()
        parent.stdin.write(b"g")
        parent.stdin.flush()
        assert parent.stdout.readline() == b"reaped\n"
        assert snap.wait(timeout=30) == 0
    finally:
        for p in (sleeper, stopped, ticker, parent, snap):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait()
    (s,) = read_dir(tmp_path)
    span = s.end_ts - s.start_ts
    rows = {r["tid"]: r for r in s.rows if r["tid"] in born and abs(r["start_ts"] - born[r["tid"]]) <= 20 * MS}
    assert sorted(rows) == sorted(born), [r for r in s.rows if r["tid"] in born]

    def other_ns(row, *names):
        return sum(row[k] for k in snapdir.state_fields(row) if k[:-3] not in names)

    # asleep all along: seeded as S, no event since (a seed never taken)
    r = rows[sleeper.pid]
    assert (r["state"], r["exited"], r["nvcsw"], r["nivcsw"], r["wakeups"]) == ("sleeping", False, 0, 0, 0)
    assert r["sleeping_ns"] + r["unknown_ns"] == span and r["sleeping_ns"] > span - 200 * MS
    assert other_ns(r, "sleeping", "unknown") == 0
    # stopped all along
    r = rows[stopped.pid]
    assert (r["state"], r["nvcsw"], r["wakeups"]) == ("stopped", 0, 0)
    assert r["stopped_ns"] + r["unknown_ns"] == span and r["stopped_ns"] > span - 200 * MS
    assert other_ns(r, "stopped", "unknown") == 0
    # seeded, then its events took over the row: stopped for the rest of the run
    r = rows[ticker.pid]
    assert r["state"] == "stopped" and r["wakeups"] >= 10 and r["nvcsw"] >= 10 and r["running_ns"] > 0
    assert s.end_ts - t_stop - 50 * MS <= r["stopped_ns"] <= s.end_ts - t_stop
    assert sum(r[k] for k in snapdir.state_fields(r)) == span
    # a zombie when snap began, reaped during the run: its final row
    r = rows[zombie]
    assert (r["state"], r["exited"]) == ("reaped", True)
    assert s.start_ts < r["state_since_ts"] == r["exit_ts"] and t_reap <= r["exit_ts"] <= s.end_ts
    assert r["zombie_ns"] + r["unknown_ns"] == r["exit_ts"] - s.start_ts
    assert r["zombie_ns"] >= t_reap - s.start_ts - 200 * MS and other_ns(r, "zombie", "unknown") == 0

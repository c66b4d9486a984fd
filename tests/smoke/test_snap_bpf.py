"""pstate snap against real BPF, with workloads whose truth the tests control.

Each run compiles the BPF program (about a second), so runs are few and
short; the writer's rules are tested without BPF in test_snap_writer.py.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from conftest import TESTS, bpf_prog_ids, clean_env, pstate_cmd
from workloads import SIGNAL_EXIT_S, V2Cgroups
from pstate.engines.stats import snapshot_stats
from pstate.snapshots import snapdir

sys.path.insert(0, str(TESTS / "kernels"))
from guest_checks import THREAD_EXEC  # noqa: E402  (the kernel matrix's workload: one for both)

pytestmark = pytest.mark.bpf


def snap_run(*args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run(pstate_cmd("snap", *map(str, args)), capture_output=True, text=True, timeout=timeout,
                          env=clean_env())


def snap_start(*args) -> subprocess.Popen:
    return subprocess.Popen(pstate_cmd("snap", "-v", *map(str, args)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=clean_env())


def wait_collecting(p: subprocess.Popen, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    buf = b""
    while time.monotonic() < end:
        r, _, _ = select.select([p.stderr], [], [], 0.1)
        if r:
            chunk = os.read(p.stderr.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            if b"collecting" in buf:
                return
    raise AssertionError(f"snap did not start: {buf!r}")


def py(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, **kw)


def read_dir(d: Path) -> list[snapdir.Snapshot]:
    snaps = snapdir.load([str(d)])
    assert snaps, list(d.iterdir())
    return snaps


def analyse(d: Path, **kw) -> dict:
    out, err = io.StringIO(), io.StringIO()
    assert snapshot_stats([str(d)], fmt="json", top=None, by="pid", out=out, err=err, **kw) == 0
    return orjson.loads(out.getvalue())


LEAKER = """
import sys, threading, time
def idle():
    time.sleep(3600)
print("ready", flush=True)
while True:
    threading.Thread(target=idle, daemon=True).start()
    time.sleep(0.1)
"""


def test_thread_leaker_is_the_top_leak_suspect(tmp_path):
    leaker = py(LEAKER)
    try:
        assert leaker.stdout.readline() == b"ready\n"
        time.sleep(0.3)
        r = snap_run("--dir", tmp_path, "--every", "0.3", "--count", "6")
        assert r.returncode == 0, r.stderr
    finally:
        leaker.kill()
        leaker.wait()
    assert len(list(tmp_path.glob("pstate-snap-*.jsonl"))) == 6
    rep = analyse(tmp_path)
    top = rep["leaks"][0]
    assert top["pid"] == leaker.pid, [(x["pid"], x["comm"], x["metric"], x["snapshots"], x["first"], x["last"], x["slope_per_min"]) for x in rep["leaks"][:4]]
    assert top["metric"] in ("threads", "sleeping") and top["snapshots"] >= 5
    threads = next(x for x in rep["leaks"] if x["pid"] == leaker.pid and x["metric"] == "threads")
    assert 6 <= threads["slope_per_min"] / 60 <= 14  # ~10 threads a second
    counts = [sum(1 for row in s.rows if row["pid"] == leaker.pid and not row["exited"]) for s in read_dir(tmp_path)]
    assert counts == sorted(counts) and counts[-1] - counts[0] >= 10


CHURN = """
import os, sys
sys.stdin.read(1)
pids = []
for _ in range(100):
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    pids.append(pid)
print(" ".join(map(str, pids)), flush=True)
"""


def test_short_lived_children_appear_as_churn(tmp_path):
    with V2Cgroups("churn") as cg:
        path = cg.paths[0]
        cgid = cg.id_of(path)
        parent = py(CHURN)
        cg.move(parent.pid, path)
        snap = snap_start("--dir", tmp_path, "-i", "3")
        try:
            wait_collecting(snap)
            t0 = time.monotonic_ns()
            parent.stdin.write(b"g")
            parent.stdin.flush()
            kids = [int(x) for x in parent.stdout.readline().split()]
            t1 = time.monotonic_ns()
            assert snap.wait(timeout=30) == 0
        finally:
            for p in (parent, snap):
                if p.poll() is None:
                    p.kill()
                p.wait()
    assert len(kids) == 100
    (s,) = read_dir(tmp_path)
    # (a busy machine may reuse a pid later on: the time of birth tells them apart)
    rows = {r["tid"]: r for r in s.rows if r["pid"] in kids and t0 <= r["start_ts"] <= t1}
    assert sorted(rows) == sorted(kids)
    # gone: freed by the kernel ("reaped"), or on a loaded machine maybe still
    # waiting for the RCU callback that frees it when the interval ends
    assert all(r["state"] in ("reaped", "zombie", "dead") and r["exited"] and r["exit_ts"]
               for r in rows.values()), \
        [r for r in rows.values() if r["state"] != "reaped"]
    assert all(s.start_ts < r["start_ts"] <= r["exit_ts"] <= s.end_ts for r in rows.values())
    # the cgroup each exited in, from the kernel: /proc has nothing left of them
    assert {(r["cgroup"], r["cgroup_path"]) for r in rows.values()} == {(cgid, path)}
    ch = analyse(tmp_path)["churn"]["intervals"][0]
    assert ch["processes_born"] >= 100 and ch["processes_gone"] >= 100 and ch["short_lived_processes"] >= 100


SLEEPER = """
import json, select, sys, time
sys.stdin.read(1)
spans = []
while not select.select([sys.stdin], [], [], 0)[0]:  # until the test closes stdin
    spin = time.monotonic_ns() + 3_000_000
    while time.monotonic_ns() < spin:
        pass
    t0 = time.monotonic_ns()
    time.sleep(0.02)
    spans.append((t0, time.monotonic_ns()))
print(json.dumps(spans), flush=True)
"""


def test_one_shot_sleeper_time_matches_the_truth(tmp_path):
    sleeper = py(SLEEPER)
    try:
        sleeper.stdin.write(b"g")
        sleeper.stdin.flush()
        r = snap_run("--dir", tmp_path, "-i", "1")
        assert r.returncode == 0, r.stderr
        sleeper.stdin.close()
        spans = json.loads(sleeper.stdout.readline())
    finally:
        sleeper.kill()
        sleeper.wait()
    files = list(tmp_path.glob("pstate-snap-*.jsonl"))
    assert len(files) == 1  # one-shot: exactly one snapshot
    (s,) = read_dir(tmp_path)
    a, b = s.start_ts, s.end_ts
    # Asleep for the 20 ms asked for; after that the thread waits for a CPU
    # until time.sleep() returns, which on a busy machine is not short.
    truth = sum(max(0, min(t1, t0 + 20_000_000, b) - max(t0, a)) for t0, t1 in spans)
    (row,) = [x for x in s.rows if x["tid"] == sleeper.pid]
    assert truth > 0.3 * (b - a)  # mostly asleep, however long its waits for a CPU after each sleep
    assert abs(row["sleeping_ns"] - truth) <= 0.10 * truth, (row["sleeping_ns"], truth)
    # each sleep inside the interval is a voluntary switch and a wake-up of its own, but for one at
    # each end: the interval's bounds are read apart from the maps (a wake-up counted 39 of 40 once,
    # under a busy loop on each CPU)
    inside = sum(1 for t0, t1 in spans if a <= t0 and t1 <= b)
    assert inside >= 5 and row["nvcsw"] >= inside - 2 and row["wakeups"] >= inside - 2 and row["running_ns"] > 0


def test_accounting_tiles_the_interval_and_never_shrinks(tmp_path):
    """Per thread, the state times add up to the time it was watched, and a
    cumulative counter never goes down from one snapshot to the next (the
    open interval a snapshot reports is never given to another state later)."""
    for mode, extra in (("cumulative", []), ("delta", ["--clear"])):
        d = tmp_path / mode
        r = snap_run("--dir", d, "--every", "0.3", "--count", "3", *extra)
        assert r.returncode == 0, r.stderr
        snaps = read_dir(d)
        assert [s.mode for s in snaps] == [mode] * 3
        for s in snaps:
            off = []
            for row in s.rows:
                total = sum(row[k] for k in snapdir.state_fields(row))
                begin = max(row["start_ts"], s.start_ts)
                end = row["state_since_ts"] if row["state"] == "reaped" else s.end_ts
                off.append(total - (end - begin))
            assert len(off) >= 20
            # exact but for the events that came while the maps were read
            slack = 1_000_000 + sum(x.meta["read_ns"] for x in snaps)
            bad = [(x, row) for x, row in zip(off, s.rows) if not -slack <= x <= slack]
            assert not bad, (bad, slack, s.start_ts, s.end_ts)
        if mode == "cumulative":
            for a, b in zip(snaps, snaps[1:]):
                before = {(r["tid"], r["start_ts"]): r for r in a.rows}
                for row in b.rows:
                    old = before.get((row["tid"], row["start_ts"]))
                    for k in snapdir.counter_fields(row) if old else ():
                        assert row[k] >= old[k], (k, old, row)


def prog_ids_of(pid: int) -> set[int]:
    """IDs of the BPF programs a process holds open (from /proc/PID/fdinfo)."""
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("prog_id:"):
                        ids.add(int(line.split()[1]))
        except OSError:
            pass
    return ids


@pytest.mark.serial  # compares system-wide program ids
def test_second_instance_is_refused_and_nothing_is_left_behind(tmp_path):
    from test_reliability_stream import leftover_programs

    before = bpf_prog_ids()
    first = snap_start("--dir", tmp_path, "-i", "30")
    try:
        wait_collecting(first)
        ours = prog_ids_of(first.pid)
        assert len(ours) >= 6
        # at once: not after the interval (snap_run's timeout is a minute)
        second = snap_run("--dir", tmp_path, "-i", "3600")
        assert second.returncode == 75
        assert f"locked by pid {first.pid}" in second.stderr
        t0 = time.monotonic()
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 143
        assert time.monotonic() - t0 < SIGNAL_EXIT_S
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert not list(tmp_path.glob("pstate-snap-*")) and not list(tmp_path.glob(".pstate-*.tmp.*"))
    # detached and unloaded: the kernel frees a program after its last fd
    # closes, after a grace period, so a look at once can still list it
    assert leftover_programs(before) == {}


REUSE = """
import os, sys
def spawn(argv):
    pid = os.fork()
    if pid == 0:
        os.execv(argv[0], argv)
    return pid
sys.stdin.read(1)
for attempt in range(100):
    a = spawn(["/bin/true"])
    os.waitpid(a, 0)
    try:
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(a - 1))
    except OSError as e:
        print("skip", e, flush=True)
        sys.exit(0)
    b = spawn(["/bin/sleep", "0.3"])
    os.waitpid(b, 0)
    if b == a:
        print(a, flush=True)
        sys.exit(0)
print("fail", flush=True)
"""


def test_pid_reuse_gives_distinct_identities(tmp_path):
    """The kernel hands out the same pid twice (forced through ns_last_pid):
    the snapshot holds two threads and stats two processes, never one."""
    w = py(REUSE)
    snap = snap_start("--dir", tmp_path, "-i", "1.5")
    try:
        wait_collecting(snap)
        w.stdin.write(b"g")
        w.stdin.flush()
        got = w.stdout.readline().decode().strip()
        assert snap.wait(timeout=30) == 0
    finally:
        for p in (w, snap):
            if p.poll() is None:
                p.kill()
            p.wait()
    if got.startswith("skip"):
        pytest.skip(f"cannot write ns_last_pid: {got}")
    assert got.isdigit(), got
    pid = int(got)
    (s,) = read_dir(tmp_path)
    rows = sorted((r for r in s.rows if r["tid"] == pid), key=lambda r: r["start_ts"])
    assert [r["comm"] for r in rows][-2:] == ["true", "sleep"], rows
    assert rows[-1]["start_ts"] > rows[-2]["exit_ts"]
    procs = {(t["comm"], t["start_ts"]) for t in analyse(tmp_path)["trends"] if t["pid"] == pid}
    assert {c for c, _ in procs} >= {"true", "sleep"} and len(procs) == len(rows)


def wait_wrote(p: subprocess.Popen, n: int, timeout: float = 60) -> None:
    """Until snap -v has said it wrote n snapshots."""
    end, buf = time.monotonic() + timeout, b""
    while buf.count(b"wrote ") < n and time.monotonic() < end:
        if select.select([p.stderr], [], [], 0.1)[0]:
            chunk = os.read(p.stderr.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    assert buf.count(b"wrote ") >= n, buf


def test_a_thread_that_execs_keeps_its_row_and_the_old_leader_is_freed(tmp_path):
    """A thread other than the leader execs: the kernel gives it the
    leader's pid. Its row goes on under that tid with its birth and counters
    (none shrinks), and the old leader, which the kernel frees under the
    thread's former pid later, has its final row in the next snapshot."""
    w = py(THREAD_EXEC)
    snap = snap_start("--dir", tmp_path, "--every", "0.5", "--count", "3")
    try:
        ids = json.loads(w.stdout.readline())
        leader, thread = ids["leader"], ids["thread"]
        wait_collecting(snap)
        wait_wrote(snap, 1)
        w.stdin.write(b"x")
        w.stdin.flush()
        assert snap.wait(timeout=60) == 0
    finally:
        for p in (w, snap):
            if p.poll() is None:
                p.kill()
            p.wait()
    snaps = read_dir(tmp_path)
    first = {r["tid"]: r for r in snaps[0].rows if r["pid"] == leader}
    assert set(first) >= {leader, thread}, first
    born = first[thread]["start_ts"]
    later = [{(r["tid"], r["start_ts"]): r for r in s.rows if r["pid"] == leader} for s in snaps[1:]]
    moved = later[0].get((leader, born))
    assert moved is not None, later[0]  # the thread, now under the leader's tid
    for k in snapdir.counter_fields(moved):
        assert moved[k] >= first[thread][k], (k, first[thread], moved)
    old = later[0].get((leader, first[leader]["start_ts"]))
    assert old is not None and old["state"] == "reaped" and old["exited"], later[0]
    assert (thread, born) not in later[0] and set(later[1]) == {(leader, born)}, later


def test_full_map_says_truncated(tmp_path):
    r = snap_run("--dir", tmp_path, "-i", "0.2", "--max-tasks", "64")
    assert r.returncode == 0, r.stderr
    (s,) = read_dir(tmp_path)
    assert s.meta["truncated"] is True and s.meta["map_full"] > 0
    assert len(s.rows) <= 64 * 2
    out, err = io.StringIO(), io.StringIO()
    snapshot_stats([str(tmp_path)], fmt="table", top=3, by="pid", out=out, err=err)
    assert "are truncated (the task map was full)" in err.getvalue()


@pytest.mark.parametrize("probes", ["tp_btf", "tracepoint"])
def test_ebpf_prints_the_program(probes):
    """The final C of the path asked for: its settings, and no struct from a header on either."""
    r = subprocess.run(pstate_cmd("snap", "--ebpf", "--max-tasks", "1024", "--probes", probes),
                       capture_output=True, text=True, env=clean_env(), timeout=30)
    assert r.returncode == 0, r.stderr
    first = r.stdout.splitlines()[0]
    assert first.startswith("// pstate: bpf/snap.bpf.c as compiled on this kernel (sched_switch ")
    assert f"sched_switch {probes}, " in first and f"; --probes {probes})" in first
    assert "#define MAX_TASKS 1024" in r.stdout and "PSTATE_PROBE(sched, sched_switch)" in r.stdout
    # sched_switch tp_btf (1) or classic (3); the lifecycle tp_btf or raw tracepoints (2), reading the BTF's offsets
    assert f"#define PATH_sched_switch {1 if probes == 'tp_btf' else 3}\n" in r.stdout
    assert f"#define PATH_sched_process_free {1 if probes == 'tp_btf' else 2}\n" in r.stdout
    assert ("#define RAW_REPORT_MAX " in r.stdout) == (probes == "tp_btf")
    assert "#define TASK_PID " in r.stdout and "PSTATE_PROBE(sched, sched_process_free)" in r.stdout
    assert "struct task_struct" not in r.stdout

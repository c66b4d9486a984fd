"""record against the kernel's own per-thread accounting.

Each workload thread reads /proc/thread-self/schedstat (ns on a CPU, ns
waiting on a run queue) and its voluntary/nonvoluntary_ctxt_switches (from
/proc/thread-self/status) with CLOCK_MONOTONIC, once when it starts and once
just before it exits, and prints them. The recording of the same window must
agree: on-CPU within 1 % for CPU-bound threads, on-CPU + run-queue within
2 % for all, switch counts exact. Over the whole stream: no negative
duration, no sleeping/uninterruptible -> running without a wake-up; the end
trailer says how many timestamp pairs were clamped. The kernel leaves time in
interrupts and time stolen by the hypervisor out of a task's on-CPU time:
a hog's tolerances include that time of its CPU (/proc/stat). Run quiet and under a
pinned switch storm on the other CPU, where wake-ups race switch-outs most.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest

from test_collector_bpf import machine  # noqa: F401 (a fixture: the collector is stopped whatever happens)
from workloads import Recording, go, kill_all, sleeps

# kernel truth, pinned to CPUs and compared with the kernel's own counts: alone
pytestmark = [pytest.mark.bpf, pytest.mark.kernel, pytest.mark.serial]

PROLOGUE = """
import os, sys, time, json
def switches():
    sw = {}
    with open("/proc/thread-self/status") as f:
        for line in f:
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                k, v = line.split(":")
                sw[k] = int(v)
    return sw["voluntary_ctxt_switches"], sw["nonvoluntary_ctxt_switches"]
def snap():
    # the switch counts read before and after the clock are the same: no
    # switch happened around t, so the counts are the kernel's at t
    while True:
        before = switches()
        with open("/proc/thread-self/schedstat") as f:
            run, wait, slices = (int(x) for x in f.read().split())
        t = time.monotonic_ns()
        if switches() == before:
            return {"t": t, "run": run, "wait": wait, "slices": slices, "vol": before[0], "invol": before[1]}
sys.stdin.read(1)
first = snap()
"""
EPILOGUE = """
last = snap()
print(json.dumps({"tid": os.getpid(), "first": first, "last": last}), flush=True)
"""

HOG = "end = time.monotonic() + {secs}\nx = 0\nwhile time.monotonic() < end:\n    x += 1\n"
TICKER = "for _ in range({n}):\n    time.sleep(0.001)\n"
SLEEPER = "for _ in range(20):\n    time.sleep(0.05)\n"
# stopped from outside (SIGSTOP for 300 ms) while it naps
STOPPABLE = "for _ in range(60):\n    time.sleep(0.01)\n"
DIRECT_WRITER = """
import mmap
buf = mmap.mmap(-1, 4096)
buf.write(b"x" * 4096)
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_DIRECT | os.O_DSYNC, 0o600)
for i in range(150):
    os.pwrite(fd, buf, (i % 64) * 4096)
os.close(fd)
"""
PING = """
r, w = int(sys.argv[1]), int(sys.argv[2])
for _ in range(300):
    os.write(w, b"p")
    os.read(r, 1)
"""
PONG = """
r, w = int(sys.argv[1]), int(sys.argv[2])
for _ in range(300):
    os.read(r, 1)
    os.write(w, b"p")
"""

WAITING = ("runnable", "preempted")
BLOCKED = ("sleeping", "uninterruptible", "stopped", "traced", "idle", "parked")


def spawn(body: str, cpu: int | None = None, args=(), pass_fds=()) -> subprocess.Popen:
    cmd = [sys.executable, "-c", PROLOGUE + body + EPILOGUE, *map(str, args)]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu)] + cmd
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=pass_fds)


def intervals(states: list[dict], t0: int, t1: int) -> dict:
    """Per state, the ns of [t0, t1] the thread spent in it, from its
    transitions (each one closes the interval of the state it leaves)."""
    out: dict[str, int] = {}
    prev_ts, prev_state = None, None
    for r in states:
        if prev_ts is not None:
            lo, hi = max(prev_ts, t0), min(r["ts"], t1)
            if hi > lo:
                out[prev_state] = out.get(prev_state, 0) + hi - lo
        prev_ts, prev_state = r["ts"], r["to"]
    if prev_ts is not None and prev_ts < t1:
        out[prev_state] = out.get(prev_state, 0) + t1 - max(prev_ts, t0)
    return out


def check_stream(recs: list[dict], tids: set[int]) -> tuple[int, int, int]:
    """Asserts no negative duration and time order per thread. Returns the
    number of transitions whose `from` is not the state the thread's previous
    one entered (a switch the kernel did not trace), of blocked -> running
    without a wake-up, and of wake-ups from a blocked state."""
    by_tid: dict[int, list] = {}
    for r in recs:
        if r["type"] != "state":
            continue
        d = r["dur_ns"]
        assert d is None or 0 <= d < 1 << 63, r
        by_tid.setdefault(r["tid"], []).append(r)
    gaps = unwoken = wakes = 0
    for tid in tids:
        rs = by_tid.get(tid, [])
        assert rs, f"no events of {tid}"
        for a, b in zip(rs, rs[1:]):
            gaps += a["to"] != b["from"]
            assert b["ts"] >= a["ts"], (a, b)
            unwoken += b["to"] == "running" and (a["to"] in BLOCKED or b["from"] in BLOCKED)
            wakes += b["to"] == "runnable" and b["from"] in BLOCKED
    return gaps, unwoken, wakes


def irq_and_steal_ns(cpu: int) -> int:
    """Time CPU `cpu` spent in interrupts or stolen by the hypervisor: the
    kernel leaves it out of a task's on-CPU time, pstate's clock does not."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{cpu} "):
                v = [int(x) for x in line.split()[1:]]
                return (v[5] + v[6] + v[7]) * (1_000_000_000 // os.sysconf("SC_CLK_TCK"))
    return 0


def run_scenario(tmp_path, storm: bool) -> tuple[dict, list[dict]]:
    storm_proc = None
    if storm:
        # its own session: perf's forked partner dies with the group, not left to run for hours
        storm_proc = subprocess.Popen(["taskset", "-c", "0", "perf", "bench", "sched", "pipe", "-l", "100000000"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    kids = {
        "hog_a": spawn(HOG.format(secs=1.2), cpu=1),
        "hog_b": spawn(HOG.format(secs=1.2), cpu=1),
        "ticker_pinned": spawn(TICKER.format(n=600), cpu=1),
        "ticker_free": spawn(TICKER.format(n=600)),
        "sleeper": spawn(SLEEPER),
        "stopped": spawn(STOPPABLE),
        "direct_writer": spawn(DIRECT_WRITER, args=[tmp_path / "direct.bin"]),
        "ping": spawn(PING, args=(r2, w1), pass_fds=(r2, w1)),
        "pong": spawn(PONG, args=(r1, w2), pass_fds=(r1, w2)),
    }
    for fd in (r1, w1, r2, w2):
        os.close(fd)
    truth = {"irq_steal_cpu1": -irq_and_steal_ns(1)}
    try:
        pids = [a for k in kids.values() for a in ("-p", str(k.pid))]
        rec = Recording(*pids)
        for k in kids.values():
            k.stdin.write(b"g")
            k.stdin.flush()
        time.sleep(0.1)
        os.kill(kids["stopped"].pid, signal.SIGSTOP)
        time.sleep(0.3)
        os.kill(kids["stopped"].pid, signal.SIGCONT)
        for name, k in kids.items():
            out, _ = k.communicate(timeout=60)
            assert k.returncode == 0, name
            truth[name] = orjson.loads(out)
        truth["irq_steal_cpu1"] += irq_and_steal_ns(1)
        recs = rec.stop()
    finally:
        for k in kids.values():
            if k.poll() is None:
                k.kill()
                k.wait()
        if storm_proc is not None:
            os.killpg(storm_proc.pid, signal.SIGKILL)
            storm_proc.wait()
    return truth, recs


@pytest.mark.parametrize("storm", [False, True], ids=["quiet", "storm"])
def test_record_agrees_with_the_kernels_accounting(tmp_path, storm):
    for attempt in (1, 2):
        (tmp_path / str(attempt)).mkdir()
        truth, recs = run_scenario(tmp_path / str(attempt), storm)
        end = recs[-1]
        assert end["type"] == "end", end
        # On the classic path the kernel skips a program's run while a bpf(2)
        # map call of any process is under way on its CPU, pstate's own reads
        # of its counters once a second included (lost_skipped, counted and
        # reported: pstate-events(5)). A run whose only loss is that is run
        # once more, and the second must lose nothing (a loss of the
        # programs' own shows in both). A fresh clone's CI lost one event
        # here under the storm on the classic path, when the reason was not
        # printed; it is now.
        if attempt == 1 and 0 < end["lost"] == end.get("lost_skipped"):
            print(f"\n{end['lost']} run(s) skipped by the kernel: once more")
            continue
        assert end["lost"] == 0, {k: v for k, v in end.items() if k.startswith("lost")}
        assert isinstance(end["clamped"], int) and end["clamped"] >= 0
        print(f"\n{'storm' if storm else 'quiet'}: {end['events']} events, {end['clamped']} clamped pairs")
        slack = truth.pop("irq_steal_cpu1")
        tids = {t["tid"] for t in truth.values()}
        gaps, unwoken, wakes = check_stream(recs, tids)
        print(f"  untraced switches: {gaps}; blocked -> running without a wake-up: {unwoken} of {wakes + unwoken} "
              f"sleeps; CPU 1 in interrupts or stolen: {slack / 1e6:.0f} ms")
        # Unwoken sleeps come in bursts on this host (11 of 2,069 in one run
        # of a fresh clone's CI, then 0 or 1 in the next ten): a run over the
        # bound below is run once more, and the second must be within it (a
        # loss of the programs' own shows in both).
        allowed = max(1, (wakes + unwoken) // 400)  # see below
        if unwoken <= allowed:
            break
    # None in 20 scenario runs (10 per path) since the fork, exec, exit and
    # free programs are raw tracepoints or tp_btf (a classic one running in
    # softirq made the kernel skip an interrupt's classic sched_waking). A
    # 60 s ping-pong with fork churn and 1 ms tickers still sees about 5.7
    # sleeps in a million end unwoken on either path: each a timer wake-up
    # whose hard interrupt came while a thread of this VM's agent was current
    # (tokio-rt-worker, threads of PID 1 whose switch-outs the kernel never
    # traces); a parallel ftrace instance has its sched_waking and
    # sched_wakeup, pstate's programs recorded neither (no recursion miss
    # counted). 0.013 per run then. On 2026-12-02 the same VM's classic path
    # ended 0 to 3 of some 2,000 sleeps per run unwoken (about one in 1,700,
    # 17 runs), and the BPF C of the round before this one alike (0 to 2 in 6
    # runs); tp_btf 0 or 1. The rate follows the host, not the programs: up to
    # one in 400 sleeps is allowed. That catches a systematic loss (a kind of
    # wake-up, a CPU, a context never seen), not a rare one such as the
    # skipped classic sched_waking above (one in 10,000): a long run with an
    # ftrace instance beside it tells those apart, as it did then.
    assert unwoken <= allowed, (unwoken, wakes)
    states = [r for r in recs if r["type"] == "state"]
    for name, t in truth.items():
        a, b = t["first"], t["last"]
        mine = [r for r in states if r["tid"] == t["tid"]]
        spent = intervals(mine, a["t"], b["t"])
        on_cpu = spent.get("running", 0)
        waiting = sum(spent.get(s, 0) for s in WAITING)
        k_cpu, k_wait = b["run"] - a["run"], b["wait"] - a["wait"]
        outs = [r for r in mine if r["cause"] == "switch_out" and a["t"] < r["ts"] < b["t"]]
        vol = sum(1 for r in outs if r["voluntary"])
        wakes = sum(1 for r in mine if r["to"] == "runnable" and a["t"] < r["ts"] < b["t"])
        # a sleep that ended with no wake-up seen (allowed above): how much of
        # it was blocked and how much on the run queue is not known
        unseen = sum(y["ts"] - x["ts"] for x, y in zip(mine, mine[1:]) if y["to"] == "running"
                     and (x["to"] in BLOCKED or y["from"] in BLOCKED) and a["t"] < y["ts"] < b["t"])
        print(f"  {name}: on-CPU {on_cpu / 1e6:.2f} ms (kernel {k_cpu / 1e6:.2f}), run queue {waiting / 1e6:.2f} ms "
              f"(kernel {k_wait / 1e6:.2f}), switches {vol}+{len(outs) - vol} (kernel {b['vol'] - a['vol']}+"
              f"{b['invol'] - a['invol']})")
        assert (vol, len(outs) - vol) == (b["vol"] - a["vol"], b["invol"] - a["invol"]), name
        if name.startswith("hog"):
            # pstate's on-CPU runs from switch to switch by ktime, so it holds the
            # switch itself and the programs traced on it, which the kernel's
            # runtime leaves out: up to about 14 us per switch on the classic path
            # under the storm; allowed 15 us per switch besides the 1 %.
            assert abs(on_cpu - k_cpu) <= 0.01 * k_cpu + slack + 15_000 * len(outs), name
        # The kernel's run-queue wait starts at the enqueue, by the run queue's
        # clock; pstate's at sched_waking, by ktime, and on an idle CPU that
        # includes leaving idle and the interrupt that woke it (measured: 1.5-3 us
        # per wake-up on a busy CPU; on an idle vCPU of a quiet VM 8-25 us, the
        # sleeper's 20 timer wake-ups most of all; on 2026-12-02, the host
        # busier, up to 80 us per wake-up of the direct-I/O writer's, in 3 of 6
        # runs, with this round's BPF C and the round before's alike): allowed
        # 100 us per wake-up besides the 2 %. Each switch moves its own few
        # hundred ns between the two clocks as well (measured 0.6 us per switch
        # for the ping-pong's 300 preemptions): allowed 3 us per switch. The
        # switch counts above stay exact.
        assert abs((on_cpu + waiting) - (k_cpu + k_wait)) <= (
            0.02 * (k_cpu + k_wait) + 100_000 * wakes + 3_000 * len(outs) + unseen
            + (slack if name.startswith("hog") else 0)), name


def test_timer_wakeups_are_interrupts_and_pipe_wakeups_name_the_other_side(tmp_path):
    truth, recs = run_scenario(tmp_path, storm=False)
    truth.pop("irq_steal_cpu1")
    states = [r for r in recs if r["type"] == "state" and r["cause"] == "wakeup" and r["from"] == "sleeping"]
    sleeper = truth["sleeper"]["tid"]
    # every 50 ms nap ends by a timer wake-up, but for those whose end this
    # VM did not trace (workloads.sleeps), which may show only in its switch-out
    # at exit; read from the sleeper's own first look at the clock on, so the
    # "go" read is left out
    first = truth["sleeper"]["first"]["t"]
    naps, _ = sleeps([r for r in recs if r["type"] != "state" or first < r["ts"]], sleeper, 20, 40e6, 100e6)
    wakers = Counter((r.get("waker"), r["waker_tid"]) for r in naps)
    assert wakers == {("irq", 0): len(naps)}, wakers
    ping, pong = truth["ping"]["tid"], truth["pong"]["tid"]
    for me, other, name in ((ping, pong, "ping"), (pong, ping, "pong")):
        first, last = truth[name]["first"], truth[name]["last"]
        mine = [r for r in states if r["tid"] == me and first["t"] < r["ts"] < last["t"]]
        # How often a side sleeps on its read depends on how the two were
        # placed (on one CPU the reply is often there already): the kernel's
        # count of its voluntary switches says how many wake-ups there were.
        slept = last["vol"] - first["vol"]
        # (on two idle CPUs a side may hardly ever sleep: then there is little to check here;
        # tests/smoke/test_why_bpf.py checks the wakers of a ping-pong too)
        assert len(mine) >= 0.9 * slept, (name, len(mine), slept)
        wrong = Counter((r.get("waker"), r["waker_tid"]) for r in mine if r["waker_tid"] != other or "waker" in r)
        assert not wrong, (name, other, wrong)



# A hog that says it is ready, then blocks on stdin until it may go.
READY_HOG = """
import sys, time
print("ready", flush=True)
sys.stdin.read(1)
end = time.monotonic() + {secs}
x = 0
while time.monotonic() < end:
    x += 1
"""


def proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def await_state(pid: int, states: str) -> None:
    """Poll until the process is in one of states (S: blocked, Z: exited)."""
    while proc_state(pid) not in states:
        time.sleep(0.001)


def schedstat_run(pid: int) -> int:
    """The first field of /proc/PID/schedstat: se.sum_exec_runtime, which
    the kernel brings up to date at each switch (not while the task runs):
    read here only while the task is off its CPU."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def three_hogs() -> tuple[list[dict], dict, dict, dict]:
    """Three CPU hogs on one CPU, recorded from before they go to after they
    exit: (records, meta, pid -> schedstat's run before it went, pid -> after
    it exited), each read while the hog is off its CPU."""
    hogs = [subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", READY_HOG.format(secs=1.5)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(3)]
    try:
        for h in hogs:
            assert h.stdout.readline() == b"ready\n"
            await_state(h.pid, "S")  # blocked on stdin: off its CPU
        rec = Recording(*(a for h in hogs for a in ("-p", str(h.pid))), cpu=0)
        start = {h.pid: schedstat_run(h.pid) for h in hogs}
        go(*hogs)
        for h in hogs:
            await_state(h.pid, "Z")  # exited, its last switch-out done
        end = {h.pid: schedstat_run(h.pid) for h in hogs}
        recs = rec.stop()
    finally:
        kill_all(hogs)
    return recs, rec.meta, start, end


def test_on_cpu_time_is_the_kernels_with_two_hogs_beside():
    """Each hog's on-CPU time by the kernel's count (record's dur_ns -
    steal_irq_ns, summed over its slices) within 0.5 % of its
    /proc/PID/schedstat (in practice equal to the ns); wall time minus
    that is its steal and interrupt time."""
    for attempt in (1, 2):
        recs, meta, start, end = three_hogs()
        assert meta["on_cpu_time"] == "kernel", meta
        assert recs[-1]["type"] == "end" and recs[-1]["lost"] == 0, recs[-1]
        slices = {pid: [r for r in recs if r["type"] == "state" and r["tid"] == pid and r["cause"] == "switch_out"]
                  for pid in start}
        # On the classic path a task's first slice has its wall time only (its switch-in's count
        # cannot be read there): counted so, with its steal and interrupt time. Where the kernel
        # did not trace that slice's switch-in either (workloads.untraced_runs), once more.
        classic = meta["probe_paths"]["sched_switch"] == "tracepoint"
        if classic and attempt == 1 and any(outs[0]["dur_ns"] is None for outs in slices.values() if outs):
            continue
        break
    for pid, outs in slices.items():
        if classic:
            assert outs and not {"steal_irq_ns", "run_ns"} & set(outs[0]), outs[:1]
            outs[0] = {**outs[0], "steal_irq_ns": 0}
        # a slice whose switch-in the kernel did not trace has no wall time, but its count all the same
        assert outs and all("steal_irq_ns" in r or "run_ns" in r for r in outs), pid
        kernel = sum(r["dur_ns"] - r["steal_irq_ns"] if r["dur_ns"] is not None else r["run_ns"] for r in outs)
        wall = sum(r["dur_ns"] for r in outs if r["dur_ns"] is not None)
        k_cpu = end[pid] - start[pid]
        print(f"\n  hog {pid}: on-CPU {kernel / 1e6:.3f} ms by the kernel's count (schedstat "
              f"{k_cpu / 1e6:.3f} ms, {kernel - k_cpu:+d} ns), wall {wall / 1e6:.3f} ms: steal+irq "
              f"{(wall - kernel) / 1e6:.3f} ms, {len(outs)} slices "
              f"({sum(r['dur_ns'] is None for r in outs)} with no switch-in traced)")
        assert len(outs) >= 10  # it shared its CPU: many slices, each with its own two reads
        assert abs(kernel - k_cpu) <= 0.005 * k_cpu, (kernel, k_cpu)


def _snap_three_hogs(d: Path) -> tuple[dict, dict, dict]:
    """Three CPU hogs on one CPU under the collector, which counts from
    before they go (they are seeded blocked on stdin); its one snapshot is
    taken once all three have exited, so each final slice is closed and
    none is still open: (rows by pid, schedstat's run before, after)."""
    from test_collector_bpf import snap
    from test_snap_bpf import read_dir

    hogs = [subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", READY_HOG.format(secs=0.5)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE) for _ in range(3)]
    try:
        for h in hogs:
            assert h.stdout.readline() == b"ready\n"
            await_state(h.pid, "S")
        r = snap("--start")
        assert r.returncode == 0, r.stderr
        start = {h.pid: schedstat_run(h.pid) for h in hogs}
        go(*hogs)
        for h in hogs:
            await_state(h.pid, "Z")  # its last switch-out done; not reaped before the snapshot
        end = {h.pid: schedstat_run(h.pid) for h in hogs}
        r = snap("--dir", d)
        assert r.returncode == 0, r.stderr
    finally:
        kill_all(hogs)
        snap("--stop")
    (s,) = read_dir(d)
    assert s.meta["on_cpu_time"] == "kernel", s.meta
    return {r["tid"]: r for r in s.rows if r["tid"] in start}, start, end, s.meta


def test_snap_running_less_steal_is_the_kernels_with_two_hogs_beside(tmp_path, machine):
    """snap's rows say the same: each hog's running_ns - steal_irq_ns, over
    its life, within 0.5 % of what its /proc/PID/schedstat grew by, and never
    above it.

    A switch-in the kernel does not trace (on this VM, one back from its
    agent's thread: docs/reliability.md) leaves the slice that follows in
    the hog's preempted time, which record shows as a switch-out with no
    duration and the kernel's run_ns, and snap cannot tell: the hog is then
    short by that slice. A sitting where that hit a hog is tried again, up to
    three times in all. On the classic path such a slice was 1 to 7 ms of
    160 to 340 ms, in about half the sittings here; there the bound is one
    slice (3 %)."""
    from pstate.snapshots import snapdir

    for attempt in range(3):
        rows, start, end, meta = _snap_three_hogs(tmp_path / str(attempt))
        tol = 0.005 if meta["probe_paths"]["sched_switch"] == "tp_btf" else 0.03
        assert sorted(rows) == sorted(start), rows
        off = {}
        for pid, r in rows.items():
            k_cpu = end[pid] - start[pid]
            kernel = r["running_ns"] - r[snapdir.STEAL_FIELD]
            print(f"\n  hog {pid}: snap {kernel / 1e6:.3f} ms on-CPU by the kernel's count (schedstat "
                  f"{k_cpu / 1e6:.3f} ms, {kernel - k_cpu:+d} ns), running {r['running_ns'] / 1e6:.3f} ms: "
                  f"steal+irq {r[snapdir.STEAL_FIELD] / 1e6:.3f} ms, {r['nivcsw']} preemptions")
            assert r["state"] == "zombie" and r["nivcsw"] >= 10, r  # it shared its CPU: many slices
            # never more than the kernel counted; less only by a slice whose switch-in was not traced
            assert kernel <= k_cpu + 0.005 * k_cpu, (kernel, k_cpu, r)
            off[pid] = abs(kernel - k_cpu) / k_cpu
        if max(off.values()) <= tol:
            return
    raise AssertionError(f"3 sittings, each with a hog off by more than {tol:.1%}: {off}")

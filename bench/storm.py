"""Workloads and the interleaved A/B runner.

Workloads:
- the storm: `taskset -c 1 perf bench sched pipe -l N`, two processes
  ping-ponging over a pipe on CPU 1 (tracers are pinned to CPU 0);
- hackbench: `perf bench sched messaging`, on every CPU;
- a paced ping-pong (run this file as `storm.py pingpong RATE SECONDS`):
  one pair on CPU 1 doing RATE round trips per second, for the highest
  rate record keeps without loss.

A/B: each contender run is bracketed by untraced baseline runs and its ratio
is contender throughput / mean of the two baselines around it, so slow drift
of a shared, noisy machine cancels. A round runs every contender once, in an
order rotated each round.
"""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

WORKLOAD_CPU = "1"


@dataclass
class Workload:
    key: str
    label: str
    argv: list[str]
    metric: str  # "ops": the ops/sec perf prints; "time": runs/s = 1 / Total time
    work: float  # ops in one run ("ops"), 1 ("time")

    def run(self, timeout: float = 300.0) -> tuple[float, float]:
        """(throughput, work per CPU second) of one run; higher is better.

        The CPU time is the workload's own (its processes are the only
        children this process reaps meanwhile), so work per CPU second does
        not depend on how much CPU other load left it: the noise-robust
        figure. The tracer's in-kernel cost runs in the workload's context
        and counts there.
        """
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = subprocess.run(self.argv, capture_output=True, text=True, timeout=timeout)
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(self.argv)} failed ({r.returncode}): {r.stderr.strip()[-300:]}")
        cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
        m = re.search(r"Total time:\s*([\d.]+)", r.stdout)
        if not m:
            raise RuntimeError(f"cannot parse {' '.join(self.argv)}: {r.stdout[-300:]}")
        thr = 1.0 / float(m.group(1))
        if self.metric == "ops":
            m = re.search(r"^\s*(\d+)\s+ops/sec", r.stdout, re.M)
            thr = float(m.group(1)) if m else self.work * thr
        return thr, (self.work / cpu if cpu > 0 else float("nan"))


def pipe_storm(loops: int) -> Workload:
    return Workload("storm", f"perf bench sched pipe -l {loops} (CPU 1)",
                    ["taskset", "-c", WORKLOAD_CPU, "perf", "bench", "sched", "pipe", "-l", str(loops)], "ops", loops)


def hackbench(groups: int, loops: int) -> Workload:
    return Workload("hackbench", f"perf bench sched messaging -g {groups} -l {loops} (all CPUs)",
                    ["perf", "bench", "sched", "messaging", "-g", str(groups), "-l", str(loops)], "time", 1)


def loadavg() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def summarize(values: list[float]) -> dict:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def quartiles(values: list[float]) -> dict:
    """Median and quartiles, for measures whose spread matters more than their range."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "q1": None, "q3": None, "n": 0}
    q = statistics.quantiles(vals, n=4) if len(vals) > 1 else [vals[0]] * 3
    return {"median": statistics.median(vals), "q1": q[0], "q3": q[2], "n": len(vals)}


# Two untraced runs around a traced one that differ by more than this part
# of their mean: the machine changed speed within the pair (seen here: a
# VM's vCPU runs the same storm at 240,000 and at 340,000 ops/s from one
# run to the next), and the pair's ratio says more of that than of the
# tracer. Each contender's `steady` summary keeps only the other pairs.
STEADY = 0.03


def interleaved(workload: Workload, contenders: list, rounds: int, run_traced, log, steady: float = STEADY) -> dict:
    """Run rounds of  B c1 B c2 B ... cN B  (B: untraced baseline).

    run_traced(contender, workload) -> ((throughput, per_cpu) or None,
    details); a contender's ratios divide its throughput (and its work per
    CPU second) by the mean of the two baselines around it. `ratio` sums up
    every pair, `steady` the pairs whose two baselines agree within `steady`
    of their mean (see STEADY).
    """
    out = {c.key: {"ratios": [], "cpu_ratios": [], "runs": [], "errors": []} for c in contenders}
    baselines, cpu_baselines = [], []
    for r in range(rounds):
        order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
        before = workload.run()
        baselines.append(before[0])
        cpu_baselines.append(before[1])
        for c in order:
            thr, details = run_traced(c, workload)
            after = workload.run()
            baselines.append(after[0])
            cpu_baselines.append(after[1])
            slot = out[c.key]
            if thr is None:
                slot["errors"].append(details.get("error", "failed"))
                log(f"  {workload.key} round {r + 1}/{rounds} {c.key}: FAILED {details.get('error', '')[:300]}")
            else:
                base = (before[0] + after[0]) / 2
                cpu_base = (before[1] + after[1]) / 2
                details.update(throughput=thr[0], baseline=base, ratio=thr[0] / base, per_cpu=thr[1],
                               cpu_baseline=cpu_base, cpu_ratio=thr[1] / cpu_base,
                               baselines=[before[0], after[0]], baseline_gap=abs(before[0] - after[0]) / base)
                slot["ratios"].append(details["ratio"])
                slot["cpu_ratios"].append(details["cpu_ratio"])
                log(f"  {workload.key} round {r + 1}/{rounds} {c.key}: ratio {details['ratio']:.3f} "
                    f"(per CPU s {details['cpu_ratio']:.3f}; base {before[0]:,.1f}/{after[0]:,.1f}, "
                    f"traced {thr[0]:,.1f}) load {loadavg()[0]:.2f}")
            slot["runs"].append(details)
            before = after
    for c in contenders:
        slot = out[c.key]
        slot["ratio"] = summarize(slot["ratios"])
        slot["cpu_ratio"] = summarize(slot["cpu_ratios"])
        slot["steady"] = summarize([r["ratio"] for r in slot["runs"] if r.get("baseline_gap", 1) <= steady])
    return {"workload": workload.label, "baselines": baselines, "baseline": summarize(baselines),
            "cpu_baseline": summarize(cpu_baselines), "steady_gap": steady, "contenders": out}


# --- paced ping-pong -----------------------------------------------------------

def pingpong(rate: float, seconds: float) -> dict:
    """One pair of processes doing `rate` pipe round trips a second (as many
    as the CPU allows when it cannot). Each round trip is two context
    switches and two wake-ups: about six state transitions."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        rd, wr = os.read, os.write
        while True:
            b = rd(r1, 1)
            if b != b"x":
                os._exit(0)
            wr(w2, b)
    rd, wr = os.read, os.write
    mono = time.monotonic
    t0 = mono()
    end = t0 + seconds
    done = 0
    while True:
        now = mono()
        if now >= end:
            break
        due = int((now - t0) * rate)
        if done >= due:
            # ahead of schedule: sleep for a few round trips' worth
            time.sleep(min(0.001, max(0.0001, (done - due + 1) / rate)))
            continue
        n = min(due - done, 256)
        for _ in range(n):
            wr(w1, b"x")
            rd(r2, 1)
        done += n
    elapsed = mono() - t0
    wr(w1, b"q")
    os.waitpid(pid, 0)
    return {"round_trips": done, "seconds": elapsed, "rate": done / elapsed}


def pingpong_argv(rate: float, seconds: float) -> list[str]:
    return ["taskset", "-c", WORKLOAD_CPU, sys.executable, os.path.abspath(__file__), "pingpong", str(rate),
            str(seconds)]


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "pingpong":
        res = pingpong(float(sys.argv[2]), float(sys.argv[3]))
        print(f"{res['round_trips']} {res['seconds']:.6f} {res['rate']:.1f}")
    else:
        sys.exit(f"usage: {sys.argv[0]} pingpong ROUND_TRIPS_PER_S SECONDS")


def write_results(path: str, results: dict) -> None:
    """A bench's results as JSON, replaced atomically; says where."""
    import json

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(results, f, indent=1, default=str)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"(JSON: {os.path.relpath(path)})")

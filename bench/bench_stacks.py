"""What record --stacks costs: per context switch on the switch storm (all
S: no stack is taken, only the state test runs), and per D transition on a
D-heavy workload (O_DIRECT writes: every write blocks in D once, its stack is
taken in the kernel and read back and freed by record).

Both workloads run pinned to CPU 1 (record on CPU 0), untraced and under
`record` and `record --stacks`, interleaved (storm.interleaved: every traced
run bracketed by untraced ones; medians of the ratios). Then, with
kernel.bpf_stats_enabled=1, the kernel's own run time of each program:

- storm: BPF ns per switch, --stacks minus plain record (target: <= 10 ns);
- direct writes: BPF ns per write more with --stacks (the stack walk), and
  record's own CPU time per write more (reading and freeing the stack map
  slot, symbolizing a new stack once).

    sudo .venv/bin/python bench/bench_stacks.py                 6 rounds
    sudo .venv/bin/python bench/bench_stacks.py --rounds 4 --writes 1000

Hold /tmp/pstate-bpf.lock while it runs (flock). Prints a table and writes
bench/results/stacks.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_kernel_cost as kc  # noqa: E402
import storm  # noqa: E402

CONTENDERS = ("record", "record_stacks")


def dwrites_main(n: int, path: str) -> int:
    """The D-heavy workload: n O_DIRECT writes of 64 KiB at offset 0, then
    perf's "Total time" and "ops/sec" lines (storm.Workload reads them)."""
    import mmap

    buf = mmap.mmap(-1, 65536)
    buf.write(b"x" * 65536)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        t0 = time.monotonic()
        for _ in range(n):
            os.pwrite(fd, buf, 0)
        dt = time.monotonic() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    print(f"Total time: {dt:.6f} [sec]")
    print(f"{int(n / dt)} ops/sec")
    return 0


def dwrites(n: int) -> storm.Workload:
    # /var/tmp: on the root file system (tmpfs refuses O_DIRECT)
    path = f"/var/tmp/pstate-bench-dwrites-{os.getpid()}.bin"
    return storm.Workload("dwrites", f"{n} O_DIRECT writes of 64 KiB (CPU 1)",
                          ["taskset", "-c", storm.WORKLOAD_CPU, sys.executable, os.path.abspath(__file__),
                           "dwrites", str(n), path], "ops", n)


def cpu_s(results: dict, workload: str, key: str) -> float | None:
    """Median CPU seconds of the recorder's whole run (start-up included)."""
    vals = [r["cpu_s"] for r in results[workload]["contenders"][key].get("runs", []) if r.get("cpu_s") is not None]
    return statistics.median(vals) if vals else None


def summary(results: dict, writes: int) -> dict:
    out = {}
    s = results["stats"]
    st = s["storm"]
    a, b = st["record"]["bpf_ns_per_switch"], st["record_stacks"]["bpf_ns_per_switch"]
    out["storm_bpf_ns_per_switch"] = {"record": a, "record_stacks": b,
                                      "stacks_minus_record": None if a is None or b is None else b - a}
    d = s["dwrites"]
    per_write = {}
    for key in CONTENDERS:
        rows = d[key]["runs"]
        vals = [sum(p["run_time_ns"] for p in r["programs"].values()) / writes for r in rows]
        per_write[key] = statistics.median(vals) if vals else None
    out["dwrites_bpf_ns_per_write"] = {**per_write, "stacks_minus_record": (
        None if None in per_write.values() else per_write["record_stacks"] - per_write["record"])}
    # record's own CPU: --stacks' start-up (reading /proc/kallsyms) is the same on the storm, where it
    # takes no stack; what it costs more on the direct writes beyond that is per write
    cpu = {(w, k): cpu_s(results, w, k) for w in ("storm", "dwrites") for k in CONTENDERS}
    out["record_cpu_s"] = {f"{w}_{k}": v for (w, k), v in cpu.items()}
    if None not in cpu.values():
        startup = cpu[("storm", "record_stacks")] - cpu[("storm", "record")]
        more = cpu[("dwrites", "record_stacks")] - cpu[("dwrites", "record")]
        out["record_cpu_us_per_write_stacks_minus_record"] = (more - startup) / writes * 1e6
    for w in ("storm", "dwrites"):
        out[f"{w}_ratio_median"] = {k: results[w]["contenders"][k]["ratio"]["median"] for k in CONTENDERS}
    return out


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "dwrites":
        return dwrites_main(int(sys.argv[2]), sys.argv[3])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    ap.add_argument("--loops", type=int, default=100_000, help="perf bench sched pipe loops (default 100000)")
    ap.add_argument("--writes", type=int, default=2000, help="O_DIRECT writes per run (default 2000)")
    ap.add_argument("--stats-runs", type=int, default=3, help="bpf_stats runs per contender (default 3)")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "stacks.json"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_stacks.py needs root (BPF, sysctl)")
    tmp = tempfile.mkdtemp(prefix="pstate-stacks-")
    try:
        cs = [c for c in kc.make_contenders(os.path.join(kc.ROOT, "bpf"), None, "") if c.key in CONTENDERS]
        results = {"machine": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               "kernel": platform.release(), "ncpu": os.cpu_count(),
                               "loadavg_start": storm.loadavg()},
                   "rounds": a.rounds, "stats_runs": a.stats_runs, "stats": {}}
        runner = kc.Runner(tmp)
        for w in (storm.pipe_storm(a.loops), dwrites(a.writes)):
            kc.log(f"{w.key}: {w.label}, {a.rounds} rounds")
            results[w.key] = storm.interleaved(w, cs, a.rounds, runner.traced, kc.log)
            results["stats"][w.key] = kc.stats_pass(runner, w, cs, a.stats_runs)
        results["machine"]["loadavg_end"] = storm.loadavg()
        results["summary"] = summary(results, a.writes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results["summary"], indent=1))
    storm.write_results(a.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

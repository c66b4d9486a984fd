#!/usr/bin/env python3
"""Overhead of a running `pstate snap` on a pinned context-switch storm.

The storm is `perf bench sched pipe -l N` pinned to CPU 1 (two tasks
ping-ponging a byte through pipes: two context switches and two wake-ups per
op, all on one CPU, so every tracepoint hit lands on the measured path).
`pstate snap` runs pinned to CPU 0 as a daemon taking a snapshot every second,
so its reading and writing compete with nothing it measures; the BPF
programs run on CPU 1 inside each switch, which is the cost being measured.

Pairs alternate the order (traced first, then untraced first) so drift of
the machine cancels; the result is the median over pairs of
ops/s traced / ops/s untraced, with the min and max. Needs root and perf
(Debian: linux-perf).

    sudo python bench/bench_snap.py                  # 8 pairs of 200,000 ops
    sudo python bench/bench_snap.py --pairs 12 --loops 500000
    sudo python bench/bench_snap.py --reference      # bpftrace, to check the method
    sudo python bench/bench_snap.py --rt             # on a machine that is not idle
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def storm(loops: int, cpu: int, rt: bool = False) -> float:
    """ops/s of one perf bench sched pipe run pinned to cpu (SCHED_FIFO with rt)."""
    cmd = ["taskset", "-c", str(cpu), "perf", "bench", "sched", "pipe", "-l", str(loops)]
    if rt:
        cmd = ["chrt", "-f", "50"] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    m = re.search(r"([\d.]+)\s+ops/sec", out)
    if not m:
        raise RuntimeError(f"cannot read perf's output: {out!r}")
    return float(m.group(1))


# --reference: the same measurement with a known tracer, to check the method
# on this machine (the issue measured bpftrace counting switches at 0.91).
BPFTRACE_COUNT = 'tracepoint:sched:sched_switch { @[cpu] = count(); } BEGIN { printf("collecting\\n"); }'


class Snap:
    """`pstate snap` (or the reference tracer) running on CPU 0 until stopped."""

    def __init__(self, cpu: int, out_dir: str, every: float, reference: bool = False):
        env = dict(os.environ, PYTHONPATH=str(ROOT / "cli") + os.pathsep + os.environ.get("PYTHONPATH", ""))
        if reference:
            cmd = ["bpftrace", "-e", BPFTRACE_COUNT]
        else:
            cmd = [sys.executable, "-m", "pstate", "snap", "-v", "--dir", out_dir, "--every", str(every),
                   "--keep", "5"]
        self.proc = subprocess.Popen(["taskset", "-c", str(cpu), *cmd], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, env=env)
        self.proc.stderr = self.proc.stdout
        buf = b""
        end = time.monotonic() + 60
        while b"collecting" not in buf:
            if time.monotonic() > end or self.proc.poll() is not None:
                raise RuntimeError(f"pstate snap did not start: {buf.decode(errors='replace')}")
            r, _, _ = select.select([self.proc.stderr], [], [], 0.2)
            if r:
                buf += os.read(self.proc.stderr.fileno(), 4096)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)
        self.proc.stderr.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=8, help="A/B pairs (default 8)")
    ap.add_argument("--loops", type=int, default=200_000, help="perf bench sched pipe -l (default 200000)")
    ap.add_argument("--every", type=float, default=1.0, help="snap --every SECONDS (default 1)")
    ap.add_argument("--storm-cpu", type=int, default=1)
    ap.add_argument("--snap-cpu", type=int, default=0)
    ap.add_argument("--rt", action="store_true",
                    help="run the storm SCHED_FIFO, so other work on a shared machine cannot take its CPU "
                         "(the tracepoint cost is the same; use it when the machine is not idle)")
    ap.add_argument("--reference", action="store_true",
                    help="measure bpftrace counting switches in a map instead of pstate snap")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_snap: needs root (BPF)", file=sys.stderr)
        return 77
    if not shutil.which("perf"):
        print("bench_snap: perf is not installed (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 69

    storm(args.loops // 10, args.storm_cpu, args.rt)  # warm up
    pairs = []
    with tempfile.TemporaryDirectory(prefix="bench-snap-") as tmp:
        out_dir = os.path.join(tmp, "snaps")
        for i in range(args.pairs):
            traced_first = i % 2 == 0
            if not traced_first:
                base = storm(args.loops, args.storm_cpu, args.rt)
            snap = Snap(args.snap_cpu, out_dir, args.every, args.reference)
            try:
                traced = storm(args.loops, args.storm_cpu, args.rt)
            finally:
                snap.stop()
            if traced_first:
                base = storm(args.loops, args.storm_cpu, args.rt)
            pairs.append((base, traced))
            print(f"pair {i + 1}/{args.pairs}: untraced {base:,.0f} ops/s, traced {traced:,.0f} ops/s, "
                  f"ratio {traced / base:.3f}", file=sys.stderr)
        files = 0 if args.reference else len([n for n in os.listdir(out_dir) if n.startswith("pstate-snap-")])

    ratios = [t / b for b, t in pairs]
    result = {
        "bench": "bpftrace_count_overhead" if args.reference else "snap_overhead", "pairs": len(pairs), "loops": args.loops,
        "rt": args.rt, "every_s": args.every,
        "ratio_median": round(statistics.median(ratios), 4), "ratio_min": round(min(ratios), 4),
        "ratio_max": round(max(ratios), 4),
        "untraced_ops_s_median": round(statistics.median(b for b, _ in pairs)),
        "traced_ops_s_median": round(statistics.median(t for _, t in pairs)),
        "snapshots_kept": files, "target": 0.90,
    }
    print(f"\n{'':<28}{'median':>12}{'min':>10}{'max':>10}")
    print(f"{'ops/s traced / untraced':<28}{result['ratio_median']:>12.3f}{result['ratio_min']:>10.3f}"
          f"{result['ratio_max']:>10.3f}")
    print(f"{'untraced ops/s':<28}{result['untraced_ops_s_median']:>12,}")
    print(f"{'traced ops/s':<28}{result['traced_ops_s_median']:>12,}")
    print(f"target >= 0.90: {'met' if result['ratio_median'] >= 0.90 else 'NOT met'}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A gate run again and again: `make soak` runs a make target RUNS times in
a row, with a busy loop pinned to each CPU the whole time (--no-load: on
the machine as it is), and stops at the first run that fails.

Each run's line says its number, its wall time, its exit status, the load
average when it ended and the suites' own lines; the last line says how
many passed. The busy loops are the point: a test that passes only on a
quiet machine waits for time instead of readiness, and fails here.

  make soak                                    10 runs of test-fast, loaded
  make soak RUNS=3 TARGET=test-truth SOAK_ARGS=--no-load
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def busy_loops() -> list[subprocess.Popen]:
    """One process spinning on each CPU this one may use."""
    out = []
    for cpu in sorted(os.sched_getaffinity(0)):
        out.append(subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c", "while True: pass"],
                                    stdin=subprocess.DEVNULL, start_new_session=True))
    return out


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--target", default="test-fast", help="the make target to run (default test-fast)")
    ap.add_argument("--log", default=None, help="also append each run's output to this file")
    ap.add_argument("--no-load", action="store_true", help="no busy loops: the load average is only logged")
    a = ap.parse_args()
    loops = [] if a.no_load else busy_loops()
    print(f"soak: make {a.target}, {a.runs} runs, " + (f"a busy loop on each of {len(loops)} CPUs" if loops
                                                      else "no load of its own"), flush=True)
    passed = 0
    try:
        for i in range(1, a.runs + 1):
            t0 = time.monotonic()
            res = subprocess.run(["make", "--no-print-directory", a.target], cwd=ROOT, capture_output=True,
                                 text=True)
            took = time.monotonic() - t0
            if a.log:
                with open(a.log, "a") as f:
                    f.write(f"=== run {i}\n{res.stdout}{res.stderr}")
            suites = [ln for ln in res.stdout.splitlines() if ln.startswith(":::")]
            print(f"run {i}: {took:.0f} s, exit {res.returncode}, load average {load()}; "
                  + "; ".join(s.lstrip(": ") for s in suites), flush=True)
            if res.returncode != 0:
                failed = [ln for ln in res.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
                print("\n".join(failed) or res.stdout[-3000:], flush=True)
                break
            passed += 1
    finally:
        for p in loops:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    print(f"soak: {passed} of {a.runs} runs passed", flush=True)
    return 0 if passed == a.runs else 1


if __name__ == "__main__":
    sys.exit(main())

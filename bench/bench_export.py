"""Speed, peak memory and output size of `pstate export` on the readers'
bench recording (bench/readers.py: 5,000,000 events by default, cached under
bench/.cache/).

    python bench/bench_export.py                 # 5M events, 3 runs per format
    python bench/bench_export.py --events 1000000 --runs 1 --json

Per format: median wall and CPU seconds (user + system of the export
process), events per CPU second, peak RSS, and the output's size. The
recording carries no next_tid/prev_tid (the generator's switches name no
partner), so the Perfetto export's CPU-track path takes the switch-in route
for every switch: the same per-record work as a real recording.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import readers  # noqa: E402

FORMATS = ("perfetto", "chrome")


def run_once(path: str, fmt: str, out: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pstate", "export", "-q", "-f", fmt, "-o", out, path],
                       stderr=subprocess.PIPE, text=True)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"export -f {fmt} failed ({r.returncode}): {r.stderr}")
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "rss_mb": after.ru_maxrss / 1024, "bytes": os.path.getsize(out)}


def measure(n: int, runs: int, log=print) -> dict:
    path = readers.recording(n, log=log)
    size = os.path.getsize(path)
    res = {"events": n, "input_bytes": size, "formats": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FORMATS:
            out = os.path.join(tmp, f"out.{fmt}")
            rows = [run_once(path, fmt, out) for _ in range(runs)]
            cpu = statistics.median(r["cpu_s"] for r in rows)
            wall = statistics.median(r["wall_s"] for r in rows)
            res["formats"][fmt] = {
                "wall_s": wall, "cpu_s": cpu, "events_per_cpu_s": n / cpu, "events_per_wall_s": n / wall,
                # RUSAGE_CHILDREN's maxrss is the largest child so far: the
                # first format's figure is its own, later ones an upper bound
                "peak_rss_mb": max(r["rss_mb"] for r in rows), "output_bytes": rows[-1]["bytes"],
                "ratio_to_input": rows[-1]["bytes"] / size,
            }
            log(f"  {fmt}: {n / cpu:,.0f} events per CPU s, {n / wall:,.0f} per wall s, "
                f"{rows[-1]['bytes'] / 1e6:.0f} MB ({rows[-1]['bytes'] / size:.2f} of the input)")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    a = ap.parse_args()
    res = measure(a.events, a.runs, log=lambda m: print(m, file=sys.stderr))
    if a.json:
        print(json.dumps(res, indent=2))
        return
    print(f"pstate export, {a.events:,} events ({res['input_bytes'] / 1e6:.0f} MB), median of {a.runs}")
    for fmt, r in res["formats"].items():
        print(f"{fmt:9} {r['events_per_cpu_s']:>11,.0f} ev/CPU s  {r['wall_s']:6.1f} s wall  "
              f"peak RSS {r['peak_rss_mb']:4.0f} MB  output {r['output_bytes'] / 1e6:6.0f} MB")


if __name__ == "__main__":
    main()

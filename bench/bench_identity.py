#!/usr/bin/env python3
"""How fast `pstate stats` digests a recording grouped by service or role
(--by unit, cgroup, container, title, ppid) and filtered by cgroup or title
(--cgroup, --title), natively and on the pure-Python path.

Generates a recording as bench_stats does (default 1,000,000 state
transitions of 2,000 threads in ~290 processes) with the records `pstate
record` writes for them: a cgroup record for each of 20 services (under
system.slice, some as docker scopes) and a process record the first time a
pid appears (title "svcN: worker"). Then, on one core (the process is
pinned to CPU 1), it times the digest of the file (ingest.digest_files and
summarise, as `stats FILE` runs it) for each mode, native and pure
interleaved (A, B, A, B, ...), and prints the medians, their ratio and one
JSON line for scripts.

    python bench/bench_identity.py                   # 1M events, 5 runs each
    python bench/bench_identity.py --events 200000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "cli"))
sys.path.insert(0, str(ROOT / "bench"))

import orjson  # noqa: E402

import bench_stats  # noqa: E402
from pstate.analysis import ingest, timeinstate  # noqa: E402
from pstate.stream import streamio  # noqa: E402
from pstate.stream.filters import Filter  # noqa: E402

SERVICES = 20
BENCH_CPU = 1

# (label, --by, filter)
MODES = [
    ("--by pid (reference)", "pid", None),
    ("--by unit", "unit", None),
    ("--by container", "container", None),
    ("--by title", "title", None),
    ("--by ppid", "ppid", None),
    ("--cgroup (1 service of 20)", "pid", lambda: Filter(cgroups=("/system.slice/svc3.service",))),
    ("--title 'svc1*' (6 services of 20)", "pid", lambda: Filter(titles=("svc1*",))),
    ("--pid (1 process)", "pid", lambda: Filter(pids=(1007,))),
    ("--by unit --cgroup /system.slice", "unit", lambda: Filter(cgroups=("/system.slice",))),
]


def cgroup_path(k: int) -> str:
    return f"/system.slice/docker-{k:064x}.scope" if k % 4 == 3 else f"/system.slice/svc{k}.service"


def with_identities(src: Path, dst: Path) -> None:
    """src's lines, with a cgroup record per service after the meta record
    and a process record before each pid's first line."""
    loads, dumps = orjson.loads, orjson.dumps
    seen = set()
    with open(src, "rb") as f, open(dst, "wb", buffering=1 << 20) as out:
        w = out.write
        w(f.readline())
        for k in range(SERVICES):
            w(dumps({"type": "cgroup", "ts": bench_stats.T0, "cgroup": 100 + k, "path": cgroup_path(k),
                     "gone": False}) + b"\n")
        for line in f:
            rec = loads(line)
            pid = rec.get("pid")
            if rec["type"] == "state" and pid not in seen:
                seen.add(pid)
                k = pid % SERVICES
                w(dumps({"type": "process", "ts": rec["ts"], "pid": pid, "comm": rec["comm"],
                         "title": f"svc{k}: worker {pid}", "exe": "/usr/bin/svc", "ppid": 1000 + pid % 3,
                         "cgroup": 100 + k, "gone": False, "why": "first"}) + b"\n")
            w(line)


def digest(path: Path, by: str, filt, native: bool) -> float:
    saved = ingest._digest
    ingest._digest = saved if native else None
    try:
        t = time.perf_counter()
        st = streamio.ReadStats()
        agg = timeinstate.Aggregator(by)
        ingest.digest_files([str(path)], agg, st, filt=None if filt is None else filt())
        agg.summarise(st)
        return time.perf_counter() - t
    finally:
        ingest._digest = saved


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if ingest._digest is None:
        print("pstate._digest is not built (or PSTATE_PURE is set): nothing to compare", file=sys.stderr)
        return 1
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {BENCH_CPU if BENCH_CPU in cpus else min(cpus)})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base, path = Path(tmp) / "base.jsonl", Path(tmp) / "who.jsonl"
        bench_stats.generate(base, args.events)
        with_identities(base, path)
        base.unlink()
        lines = sum(1 for _ in open(path, "rb"))
        print(f"{args.events} events, {lines} lines, {path.stat().st_size / 1e6:.0f} MB", file=sys.stderr)
        for label, by, filt in MODES:
            fast, pure = [], []
            for _ in range(args.repeat):  # A/B interleaved
                fast.append(digest(path, by, filt, True))
                pure.append(digest(path, by, filt, False))
            mf, mp = statistics.median(fast), statistics.median(pure)
            rows.append({"what": label, "native_s": round(mf, 3), "pure_s": round(mp, 3),
                         "native_events_per_s": round(args.events / mf), "pure_events_per_s": round(args.events / mp),
                         "speedup": round(mp / mf, 2), "native_runs_s": [round(x, 3) for x in fast],
                         "pure_runs_s": [round(x, 3) for x in pure]})
            print(f"  {label}: native {mf:.2f} s, pure {mp:.2f} s ({mp / mf:.1f}x)", file=sys.stderr)

    from tabulate import tabulate

    print(tabulate([[r["what"], r["native_s"], f"{r['native_events_per_s'] / 1e6:.2f}", r["pure_s"],
                     f"{r['pure_events_per_s'] / 1e6:.2f}", f"{r['speedup']:.1f}x"] for r in rows],
                   ["stats mode (one core)", "native s", "M ev/s", "pure s", "M ev/s", "native speed-up"],
                   tablefmt="simple"))
    print(json.dumps({"bench": "identity", "events": args.events, "repeat": args.repeat,
                      "python": sys.version.split()[0], "cpu": bench_stats._cpu(), "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

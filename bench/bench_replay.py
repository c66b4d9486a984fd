"""Throughput of `pstate replay` in its modes, on a generated recording.

Generates a recording of --events state events (default 2,000,000, shaped
like record's output: ~190 bytes a line, in-band loss records), then runs
`python -m pstate replay FILE ...` --runs times per mode and prints the
median wall time and the median CPU time of replay itself (user + system,
interpreter start-up included), with events/s for both, as a table and as
JSON (--json). On a busy machine the CPU figure is the steadier one.

    python bench/bench_replay.py                 # 2M events, 5 runs each
    python bench/bench_replay.py --events 200000 --runs 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

S = 1_000_000_000

MODES = {
    # name: (extra args, what it exercises)
    "no-wait": (["--no-wait"], "the reader's bulk path: runs of plain state records found by the native reader, "
                "written unparsed"),
    "no-wait to a pipe": (["--no-wait"], "the same into `cat > /dev/null`"),
    "no-wait -p": (["--no-wait", "-p", "4200"], "filter (1 process in 6): the native reader's rows, "
                   "Filter.match_state, kept lines written unparsed"),
    "no-wait window": (["--no-wait", "-b", "+{half_ns}ns"], "window (second half): the native reader's rows for "
                       "their ts"),
    "no-wait --strict": (["--no-wait", "--strict"], "as no-wait: the bulk path accepts only what the careful "
                         "path would"),
}


def generate(path: str, n: int, seed: int = 1) -> tuple[int, int]:
    """Write the recording; return (bytes, ns it spans)."""
    rnd = random.Random(seed)
    dumps = json.dumps
    t = 10_000 * S
    meta = {"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "0.1.0",
            "host": "bench", "kernel": "6.1.0", "boot_id": "bench", "clock": "monotonic", "ts": t,
            "wall_ns": 1_764_500_000 * S, "ncpu": 8, "include_idle": False}
    comms = ["worker", "db", "nginx", "kworker/3:1", "java", "postgres"]
    with open(path, "w") as f:
        f.write(dumps(meta, separators=(",", ":")) + "\n")
        batch = []
        for i in range(n):
            t += rnd.randint(100, 1500)
            pid = 4000 + rnd.randrange(6) * 100
            tid = pid + rnd.randrange(8)
            comm = comms[(pid // 100) % len(comms)]
            k = i % 3
            if k == 0:
                rec = {"type": "state", "ts": t, "cpu": i % 8, "pid": pid, "tid": tid, "comm": comm,
                       "from": "running", "to": "sleeping", "dur_ns": rnd.randint(1000, 5_000_000),
                       "cause": "switch_out", "voluntary": True, "kstate": "S", "prio": 120, "next_tid": 0}
            elif k == 1:
                rec = {"type": "state", "ts": t, "cpu": i % 8, "pid": pid, "tid": tid, "comm": comm,
                       "from": "sleeping", "to": "runnable", "dur_ns": rnd.randint(1000, 50_000_000),
                       "cause": "wakeup", "waker_tid": 17, "waker_pid": 17}
            else:
                rec = {"type": "state", "ts": t, "cpu": i % 8, "pid": pid, "tid": tid, "comm": comm,
                       "from": "runnable", "to": "running", "dur_ns": rnd.randint(500, 200_000),
                       "cause": "switch_in", "prio": 120, "prev_tid": 0}
            batch.append(dumps(rec, separators=(",", ":")))
            if i % 100_000 == 99_999:
                batch.append(dumps({"type": "loss", "ts": t, "reason": "ringbuf_full", "count": 10,
                                    "since_ts": t - S}, separators=(",", ":")))
            if len(batch) >= 10_000:
                f.write("\n".join(batch) + "\n")
                batch = []
        if batch:
            f.write("\n".join(batch) + "\n")
        f.write(dumps({"type": "end", "ts": t, "reason": "duration", "events": n, "lost": 10 * (n // 100_000)})
                + "\n")
    return os.path.getsize(path), t - meta["ts"]


def run_once(path: str, mode: str, args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of replay itself) for one run."""
    cmd = [sys.executable, "-m", "pstate", "replay", path, *args]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    t0 = time.perf_counter()
    with open(os.devnull, "wb") as null:
        if mode.endswith("to a pipe"):
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env)
            cat = subprocess.Popen(["cat"], stdin=p.stdout, stdout=null)
            p.stdout.close()
        else:
            p = subprocess.Popen(cmd, stdout=null, env=env)
            cat = None
        _pid, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        if cat is not None:
            cat.wait()
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, from: " + ", ".join(MODES))
    ap.add_argument("--json", action="store_true", help="print JSON only")
    opts = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="pstate-bench-") as tmp:
        path = os.path.join(tmp, "rec.jsonl")
        size, span = generate(path, opts.events)
        results = []
        for mode in opts.modes.split(","):
            args, what = MODES[mode]
            args = [a.format(half_ns=span // 2) for a in args]
            runs = [run_once(path, mode, args) for _ in range(opts.runs)]
            med = statistics.median(w for w, _c in runs)
            cpu = statistics.median(c for _w, c in runs)
            results.append({"mode": mode, "args": args, "what": what, "runs": opts.runs,
                            "median_s": round(med, 3), "min_s": round(min(w for w, _c in runs), 3),
                            "cpu_s": round(cpu, 3), "events_per_s": round(opts.events / med),
                            "events_per_cpu_s": round(opts.events / cpu), "mb_per_s": round(size / med / 1e6, 1)})
    report = {"events": opts.events, "bytes": size, "python": sys.version.split()[0], "cpus": os.cpu_count(),
              "loadavg_1m_after": os.getloadavg()[0], "results": results}
    if opts.json:
        print(json.dumps(report, indent=2))
        return
    print(f"pstate replay: {opts.events:,} events, {size / 1e6:.0f} MB, median of {opts.runs} runs "
          f"(start-up included; load average after: {report['loadavg_1m_after']:.1f} on {os.cpu_count()} CPUs)")
    print(f"{'mode':<20} {'wall s':>7} {'min s':>7} {'events/s':>11} {'CPU s':>7} {'events/CPU s':>13}")
    for r in results:
        print(f"{r['mode']:<20} {r['median_s']:>7.3f} {r['min_s']:>7.3f} {r['events_per_s']:>11,} "
              f"{r['cpu_s']:>7.3f} {r['events_per_cpu_s']:>13,}")
    print(json.dumps(report))


if __name__ == "__main__":
    main()

"""What `record -p` writes and costs beside an unfiltered `record`, on the
same storm (issue #37: the why-views' context records in a filtered
recording: a `waker` record per new waker, and `slice` records, on by
default: the switch-outs of a CPU while a followed task waits there).

A pipe storm (`perf bench sched pipe`, two processes ping-ponging) runs on
CPU 1 for the whole sitting; each round records it for DURATION seconds,
pinned to CPU 0, once per mode in an order rotated each round:

  all                 record (every event of the machine)
  -p --no-antagonists record -p PERF_PID --no-antagonists (one side of the storm)
  -p                  record -p PERF_PID (its slices on: the storm's other side, on its CPU)
  -p elsewhere        record -p TICKER_PID: a task on CPU 0 waking every ms; the storm's
                      switches on CPU 1 are no slices of it (per-CPU counts)

and reads the end record of each: events written, events per second,
lost, and record's own CPU time per event written. Run as root:

  python bench/bench_record_filter.py --rounds 3 --duration 3
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "record_filter.json"


def pstate() -> list[str]:
    venv = ROOT / ".venv" / "bin" / "pstate"
    return [str(venv)] if venv.exists() else [sys.executable, "-m", "pstate"]


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def one(mode: list[str], duration: float, out: Path) -> dict:
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(["taskset", "-c", "0", *pstate(), "record", "-q", "--duration", str(duration),
                        "-o", str(out), *mode], capture_output=True, text=True, timeout=120)
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise RuntimeError(f"record {' '.join(mode)}: exit {r.returncode}: {r.stderr[-300:]}")
    end = json.loads(out.read_bytes().rstrip().rsplit(b"\n", 1)[-1])
    kinds: dict = {}
    with open(out, "rb") as f:
        for line in f:
            t = json.loads(line)["type"]
            kinds[t] = kinds.get(t, 0) + 1
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    events = end["events"]
    return {"events": events, "events_per_s": round(events / (end["duration_ns"] / 1e9)), "lost": end["lost"],
            "records_by_type": kinds, "cpu_s": round(cpu, 3),
            "cpu_us_per_event": round(cpu / events * 1e6, 3) if events else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args()
    storm = subprocess.Popen(["taskset", "-c", "1", "perf", "bench", "sched", "pipe", "-l", "1000000000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ticker = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c",
                               "import time\nwhile True:\n    time.sleep(0.001)"])
    time.sleep(0.5)  # (its child forked)
    modes = {"all": [], "-p --no-antagonists": ["-p", str(storm.pid), "--no-antagonists"],
             "-p": ["-p", str(storm.pid)], "-p elsewhere": ["-p", str(ticker.pid)]}
    runs: dict = {k: [] for k in modes}
    load0 = loadavg()
    try:
        with tempfile.TemporaryDirectory() as d:
            keys = list(modes)
            for r in range(a.rounds):
                for k in keys[r % len(keys):] + keys[:r % len(keys)]:
                    res = one(modes[k], a.duration, Path(d) / "rec.jsonl")
                    runs[k].append(res)
                    print(f"round {r + 1} {k}: {res['events_per_s']:,} events/s, lost {res['lost']}, "
                          f"{res['cpu_us_per_event']} us CPU per event", file=sys.stderr)
    finally:
        for p in (storm, ticker):
            p.kill()
            p.wait()
    summary = {k: {"events_per_s_median": statistics.median(x["events_per_s"] for x in v),
                   "lost_total": sum(x["lost"] for x in v),
                   "cpu_us_per_event_median": statistics.median(x["cpu_us_per_event"] for x in v if x["cpu_us_per_event"])}
               for k, v in runs.items()}
    doc = {"machine": {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "kernel": os.uname().release,
                       "ncpu": os.cpu_count(), "loadavg_start": load0, "loadavg_end": loadavg()},
           "command": " ".join(["python", "bench/bench_record_filter.py", "--rounds", str(a.rounds), "--duration",
                                str(a.duration)]),
           "summary": summary, "runs": runs}
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    for k, s in summary.items():
        print(f"{k}: {s['events_per_s_median']:,} events/s written, lost {s['lost_total']}, "
              f"{s['cpu_us_per_event_median']} us CPU per event", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

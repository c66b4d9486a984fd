#!/usr/bin/env python3
"""Start-up of `pstate record` and `pstate snap`: cold (the program cache is
empty, so BCC compiles the BPF program and fills the cache) against warm (the
program is loaded from the cache, no compiler), interleaved round by round;
and record with a filter value new to the cache each round (--min-dur), which
loads the cached program too (filters are map values).

For each run: the wall time from exec to the first event on stdout (record)
or to "collecting into" on stderr (snap), the CPU time the process had used
by then (robust on a busy machine), its CPU time in all, and its peak RSS
(ru_maxrss from wait4). record runs on for --after seconds after its
first event, so the peak includes the ring buffer pages that filling it
touches; snap takes one snapshot. Medians over --rounds (at least 5). Needs
root. Uses a private cache directory; the system's cache is not touched.

    sudo python bench/bench_startup.py                 # 7 rounds
    sudo python bench/bench_startup.py --rounds 5 --json bench/results/startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
TARGET_S, TARGET_MB = 1.0, 150


def _env(cache: str, nocache: bool = False) -> dict:
    env = dict(os.environ, PSTATE_CACHE_DIR=cache, PYTHONPATH=str(ROOT / "cli"))
    env.pop("PSTATE_NO_CACHE", None)
    if nocache:
        env["PSTATE_NO_CACHE"] = "1"
    return env


def _cpu_now(pid: int) -> float | None:
    """CPU seconds a running process has used so far (utime + stime)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _finish(proc: subprocess.Popen, t0: float, first: float | None, cpu_first: float | None,
            timeout: float = 30) -> dict:
    end = time.monotonic() + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > end:
            proc.kill()
            pid, status, ru = os.wait4(proc.pid, 0)
            break
        time.sleep(0.01)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"first_s": first, "cpu_first_s": cpu_first, "wall_s": time.monotonic() - t0,
            "cpu_s": ru.ru_utime + ru.ru_stime,
            "maxrss_mb": ru.ru_maxrss / 1024, "rc": proc.returncode}


def run_record(cache: str, after: float, nocache: bool = False, extra: tuple = ()) -> dict:
    cmd = [sys.executable, "-m", "pstate", "record", "-q", "--duration", "30", *extra]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=_env(cache, nocache))
    first = cpu_first = None
    buf = b""
    deadline = t0 + 20
    fd = proc.stdout.fileno()
    while first is None and time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.05)
        if not r:
            if proc.poll() is not None:
                break
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        buf += chunk
        for line in buf.split(b"\n")[:-1]:
            if line.startswith(b'{"type":') and not line.startswith(b'{"type":"meta"'):
                first = time.monotonic() - t0
                cpu_first = _cpu_now(proc.pid)
                break
        buf = buf[buf.rfind(b"\n") + 1:]
    # keep draining while it runs on, so the pipe never stalls the recorder
    stop_at = time.monotonic() + after
    while time.monotonic() < stop_at:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r and not os.read(fd, 1 << 20):
            break
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    while True:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r and not os.read(fd, 1 << 20):
            break
        if not r and proc.poll() is not None:
            break
    return _finish(proc, t0, first, cpu_first)


def run_snap(cache: str, out: str, nocache: bool = False) -> dict:
    cmd = [sys.executable, "-m", "pstate", "snap", "-v", "--dir", out, "-i", "0.2", "-n", "1"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env(cache, nocache))
    first = cpu_first = None
    text = b""
    fd = proc.stderr.fileno()
    while True:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            text += chunk
            if first is None and b"collecting into" in text:
                first = time.monotonic() - t0
                cpu_first = _cpu_now(proc.pid)
        elif proc.poll() is not None:
            break
    return _finish(proc, t0, first, cpu_first)


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["rc"] == 0 and r["first_s"] is not None]
    out = {"runs": len(runs), "ok": len(ok)}
    for k in ("first_s", "cpu_first_s", "cpu_s", "maxrss_mb"):
        vals = [r[k] for r in ok]
        out[k] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)} if vals else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="rounds of cold+warm runs (at least 5)")
    ap.add_argument("--after", type=float, default=1.0, help="seconds record runs on after its first event")
    ap.add_argument("--nocache", action="store_true", help="also run with PSTATE_NO_CACHE=1 (compile, no store)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_startup: needs root", file=sys.stderr)
        return 77
    rounds = max(5, args.rounds)
    base = tempfile.mkdtemp(prefix="pstate-bench-startup-")
    cache = os.path.join(base, "programs")
    kinds = ["cold", "warm"] + (["nocache"] if args.nocache else [])
    runs: dict[str, list[dict]] = {f"{cmd} {k}": [] for cmd in ("record", "snap") for k in kinds}
    runs["record new filter value"] = []
    try:
        for i in range(rounds):
            for cmd in ("record", "snap"):
                for kind in kinds:
                    if kind == "cold":
                        shutil.rmtree(cache, ignore_errors=True)
                    out = tempfile.mkdtemp(dir=base)
                    if cmd == "record":
                        r = run_record(cache, args.after, nocache=kind == "nocache")
                    else:
                        r = run_snap(cache, out, nocache=kind == "nocache")
                    shutil.rmtree(out, ignore_errors=True)
                    runs[f"{cmd} {kind}"].append(r)
                    print(f"round {i + 1}/{rounds} {cmd} {kind}: first {r['first_s']} s, "
                          f"{r['maxrss_mb']:.0f} MB, rc {r['rc']}", file=sys.stderr, flush=True)
                if cmd == "record":
                    # warm cache (before snap's cold run empties it), a filter
                    # value no run had before: filters are map values, so this
                    # loads the cached program too
                    r = run_record(cache, args.after, extra=("--min-dur", f"{1000 + i}ns"))
                    runs["record new filter value"].append(r)
                    print(f"round {i + 1}/{rounds} record new filter value: first {r['first_s']} s, rc {r['rc']}",
                          file=sys.stderr, flush=True)

    finally:
        shutil.rmtree(base, ignore_errors=True)
    results = {name: summarize(rs) for name, rs in runs.items()}
    rows = []
    for name, s in results.items():
        f, cf, c, m = s["first_s"], s["cpu_first_s"], s["cpu_s"], s["maxrss_mb"]
        rows.append([name, f"{s['ok']}/{s['runs']}",
                     "n/a" if not f else f"{f['median']:.2f} ({f['min']:.2f}–{f['max']:.2f})",
                     "n/a" if not cf else f"{cf['median']:.2f}",
                     "n/a" if not c else f"{c['median']:.2f}",
                     "n/a" if not m else f"{m['median']:.0f} ({m['min']:.0f}–{m['max']:.0f})",
                     "yes" if f and m and f["median"] <= TARGET_S and m["median"] <= TARGET_MB else "no"])
    print(tabulate(rows, headers=["run", "ok", "to first event s (min–max)", "CPU s then", "CPU s in all",
                                  "peak RSS MB (min–max)",
                                  f"≤{TARGET_S:.0f} s, ≤{TARGET_MB} MB"]))
    doc = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "kernel": os.uname().release, "rounds": rounds,
           "after_s": args.after, "loadavg": os.getloadavg(), "results": results, "runs": runs}
    print(json.dumps({k: v for k, v in doc.items() if k != "runs"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

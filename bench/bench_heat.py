"""Benchmark: how many events per second `pstate heat --live` keeps up with.

Generates a stream of state transitions (default 1,000,000 events of 600
threads: run, sleep, wake, preempt, some D), then feeds it to the live
dashboard (the real loop, in this process) through a pipe, drawing at 4 Hz
into a pseudo-terminal of 120x40 whose output is read and thrown away by
another process:

- "max": the producer writes as fast as it can; reports the input rate the
  dashboard absorbed, and the sampling it needed to do so;
- "paced R": the producer writes R events/s in real time (event timestamps
  advance at the same pace); the dashboard kept up when it finished within
  0.5 s of the producer and drew about 4 frames a second.

First, "capacity": the dashboard's own CPU cost per event with sampling
fixed at 1 and at 1/8, fed from memory (no producer competing for a core),
which stays meaningful on a busy machine.

Each scenario runs --repeat times; the table shows medians. When the native
reader (pstate._digest.parse_states) is built, every run is made twice, back
to back, with it and with the pure-Python reader (as PSTATE_PURE=1 runs),
so both see the same machine; the table shows both. Prints a table, and JSON
with --json ("capacity" and "results": the default reader; "pure": the same
for the pure-Python one, when the two differ).

    python bench/bench_heat.py [--events N] [--rates 100000,200000,400000] [--repeat 3] [--pure-only]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time

import orjson

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli"))

from pstate.render import heatdraw as hr  # noqa: E402
from pstate.engines import live  # noqa: E402
from pstate.render import dashboard  # noqa: E402
from pstate.stream import reader  # noqa: E402

PRODUCER = r"""
import os, sys, time
path, rate, chunk = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
lines = open(path, "rb").read().split(b"\n")[:-1]
chunks = [b"\n".join(lines[i:i + chunk]) + b"\n" for i in range(0, len(lines), chunk)]
out = sys.stdout.fileno()
t0 = time.monotonic()
sys.stderr.write(repr(t0) + "\n")
for j, buf in enumerate(chunks):
    if rate > 0:
        d = t0 + j * chunk / rate - time.monotonic()
        if d > 0:
            time.sleep(d)
    view = memoryview(buf)
    while view:
        k = os.write(out, view)
        view = view[k:]
sys.stderr.write(repr(time.monotonic()) + "\n")
"""


def make_stream(n: int, rate: int, path: str, ntasks: int = 600) -> None:
    """n events of ntasks threads; event timestamps advance at rate events/s."""
    step = 1_000_000_000 // rate
    ts = 1_000_000_000_000
    states = {}  # tid -> (state, since)
    cycle = {"running": "sleeping", "sleeping": "runnable", "runnable": "running",
             "preempted": "running", "uninterruptible": "runnable"}
    with open(path, "wb") as f:
        f.write(orjson.dumps({"type": "meta", "schema": 1, "source": "record", "tool": "pstate",
                              "version": "0", "host": "bench", "clock": "monotonic", "ts": ts,
                              "wall_ns": 0, "ncpu": 2}) + b"\n")
        buf = []
        for i in range(n):
            ts += step
            tid = 1000 + (i * 7919) % ntasks
            st, since = states.get(tid, ("running", None))
            to = cycle[st]
            if st == "running":
                r = (i * 31) % 20
                to = "preempted" if r < 4 else ("uninterruptible" if r == 5 else "sleeping")
            rec = {"type": "state", "ts": ts, "cpu": tid % 2, "pid": 1000 + tid % 50, "tid": tid,
                   "comm": f"task{tid % 50}", "from": st, "to": to,
                   "dur_ns": None if since is None else ts - since,
                   "cause": "switch_in" if to == "running" else ("switch_out" if st == "running" else "wakeup")}
            if st == "running":
                rec.update({"voluntary": to != "preempted", "kstate": "S", "prio": 120, "next_tid": 0})
            buf.append(orjson.dumps(rec))
            states[tid] = (to, ts)
            if len(buf) >= 10000:
                f.write(b"\n".join(buf) + b"\n")
                buf = []
        if buf:
            f.write(b"\n".join(buf) + b"\n")


NATIVE_READER = reader._parse_states  # None: not built, or PSTATE_PURE=1


def use_reader(impl: str) -> None:
    reader._parse_states = NATIVE_READER if impl == "native" else None


def run_once(path: str, rate: float, args) -> dict:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", args.rows, args.cols, 0, 0))
    drain = subprocess.Popen(["cat"], stdin=master, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(master)
    prod = subprocess.Popen([sys.executable, "-c", PRODUCER, path, str(rate), "200"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # keys=False: leave the terminal this benchmark runs in alone.
    opts = live.LiveOptions(window_ns=10_000_000_000, refresh=4.0, style=hr.Style(True, False), keys=False)
    res = live.run_live(prod.stdout.fileno(), slave, opts, tty=True)
    t_end = time.monotonic()
    times = prod.stderr.read().decode().split()
    prod.wait()
    os.close(slave)
    drain.wait(timeout=10)
    prod_start, prod_end = float(times[0]), float(times[-1])
    lag = t_end - prod_end
    active = t_end - prod_start  # from the first byte sent to the last frame
    return {
        "events": res.lines, "parsed": res.parsed, "elapsed_s": active,
        "events_per_s": res.lines / active, "frames": res.frames,
        "fps": res.frames / res.elapsed, "max_sampling": res.max_sample,
        "cpu_busy": res.busy / res.elapsed, "lag_s": lag,
        # events absorbed per CPU second of the dashboard (reading + drawing)
        "events_per_cpu_s": res.lines / max(res.busy, 1e-9),
        "kept_up": bool(lag < 0.5 and res.frames / res.elapsed > 3.5),
    }


def capacity(path: str, k: int, rate: int = 200_000) -> dict:
    """The dashboard's own cost, without a producer competing for the CPU:
    feed the stream from memory with sampling fixed at 1/k, drawing a
    120x40 colour frame (to /dev/null) for every quarter second of events
    at rate. Returns events per CPU second."""
    from pstate.render import heatmodel as hm
    from pstate.stream.streamio import ReadStats

    data = open(path, "rb").read()
    chunks = [data[i:i + 65536] for i in range(0, len(data), 65536)]
    out = os.open(os.devnull, os.O_WRONLY)
    opts = live.LiveOptions(width=120, height=40, style=hr.Style(True, False), keys=False)
    dash = dashboard.Dashboard(opts, out, True)
    model = hm.Window(dash.bucket, dash.ncols, "tid", None, None)
    model.sample_every = k
    feeder = live.Feeder(model, ReadStats(), "bench", False)
    feeder.k = k
    per_frame = rate // 4
    next_frame = per_frame
    frames = 0
    t0 = time.process_time()
    for c in chunks:
        feeder.feed(c)
        if feeder.n >= next_frame:
            dash.draw(dash.frame(model, lambda n: "status"))
            frames += 1
            next_frame += per_frame
    cpu = time.process_time() - t0
    os.close(out)
    return {"k": k, "events": feeder.n, "parsed": feeder.parsed, "frames": frames, "cpu_s": cpu,
            "events_per_cpu_s": feeder.n / cpu}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rates", default="100000,200000,400000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cols", type=int, default=120)
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pure-only", action="store_true", help="only the pure-Python reader")
    args = ap.parse_args()
    rates = [0] + [int(r) for r in args.rates.split(",") if r]
    impls = ["native", "pure"] if NATIVE_READER is not None and not args.pure_only else ["pure"]
    out = {i: [] for i in impls}
    cap = {i: [] for i in impls}

    def interleaved(fn):
        """fn() --repeat times per reader, the readers alternating."""
        runs = {i: [] for i in impls}
        for _ in range(args.repeat):
            for i in impls:
                use_reader(i)
                runs[i].append(fn())
        use_reader(impls[0])
        return runs

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "capacity.jsonl")
        make_stream(args.events, 200_000, path)
        for k in (1, 8):
            by_impl = interleaved(lambda: capacity(path, k))
            for i, runs in by_impl.items():
                cap[i].append({"k": k, "events_per_cpu_s": statistics.median(r["events_per_cpu_s"] for r in runs),
                               "runs": runs})
        for rate in rates:
            path = os.path.join(tmp, f"stream-{rate}.jsonl")
            make_stream(args.events, rate or 200_000, path)
            by_impl = interleaved(lambda: run_once(path, rate, args))
            for i, runs in by_impl.items():
                med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "kept_up"}
                med["kept_up"] = all(r["kept_up"] for r in runs)
                med["runs"] = runs
                med["scenario"] = "max" if rate == 0 else f"paced {rate}"
                out[i].append(med)
    if args.json:
        doc = {"loadavg": os.getloadavg(), "reader": impls[0], "capacity": cap[impls[0]],
               "results": out[impls[0]]}
        if len(impls) > 1:
            doc["pure"] = {"capacity": cap["pure"], "results": out["pure"]}
        print(json.dumps(doc, indent=2))
        return
    load = os.getloadavg()
    print(f"heat --live, {args.events:,} events, {args.cols}x{args.rows} pty, 4 Hz, "
          f"median of {args.repeat}; {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f}")
    for i in impls:
        for c in cap[i]:
            print(f"{i:<7}capacity, sampling fixed at 1/{c['k']}: {c['events_per_cpu_s']:,.0f} events per CPU "
                  f"second (one core, 4 frames per 200k events)")
    print(f"{'reader':<8}{'scenario':<16}{'events/s':>12}{'per CPU-s':>12}{'fps':>6}{'sampling':>10}{'cpu':>7}"
          f"{'lag s':>8}  kept up")
    for n in range(len(rates)):
        for i in impls:
            m = out[i][n]
            print(f"{i:<8}{m['scenario']:<16}{m['events_per_s']:>12,.0f}{m['events_per_cpu_s']:>12,.0f}"
                  f"{m['fps']:>6.1f}{'1/' + str(int(m['max_sampling'])):>10}{m['cpu_busy']:>7.0%}"
                  f"{m['lag_s']:>8.2f}  {'all' if m['kept_up'] else 'not all'}")
    print("reader: native = pstate._digest.parse_states, pure = orjson (PSTATE_PURE=1); "
          "events/s: input rate absorbed; per CPU-s: events per CPU second the dashboard used; "
          "sampling: sparsest 1/k reached;\ncpu: share of one core; lag: from the producer's last "
          "write to the final frame; kept up: lag < 0.5 s and > 3.5 frames/s in every run.")


if __name__ == "__main__":
    main()

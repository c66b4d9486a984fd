#!/usr/bin/env python3
"""User-space CPU per event of record --flight's ring path against record's
full JSON path, and the memory of a 400 k events/s storm of 60 s.

Both paths take the same realistic batches of 72-byte ring-buffer slots
(bench_encode.make_batch: 8192 slots, record's drain batch) in process CPU
time, interleaved round by round:

  json     record's path: Encoder.encode_bytes (the C loop when built) and
           the write of the lines to /dev/null
  ring     --flight's path once the ring is full (a long run's steady
           state): FlightRecorder.feed, i.e. the copy of the batch into the
           ring's oldest batch, the eviction, and the triggers D>=100ms and
           runq>=100ms checked on the binary slots (none fires)
  ring filling   the same while the ring still grows (new memory per batch)

Then the storm: 60 s of batches timestamped at 400,000 events/s fed to a
ring capped at --flight-memory (256M), a SIGUSR1-style trigger at the end and
the file written to a temporary directory: the window kept, the ring's peak
bytes, the process's peak RSS, and the time to write the file.

    python bench/bench_flight.py
    python bench/bench_flight.py --rounds 31 --rate 400000 --seconds 60 --memory 256
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "cli"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_encode  # noqa: E402
from pstate.kernel import eventcodec as ec  # noqa: E402
from pstate.engines import flight  # noqa: E402
from pstate.snapshots.writer import SnapDir  # noqa: E402
from pstate.stream.meta import meta_record  # noqa: E402

MS = 1_000_000


TRIGGERS = ("D>=100ms", "runq>=100ms")  # checked on every batch, fired by none (the steady state)


def recorder(ks, out_dir: str, memory: int, window_s: float, triggers=TRIGGERS) -> flight.FlightRecorder:
    triggers = [flight.parse_trigger(t, ks) for t in triggers]
    return flight.FlightRecorder(ec.Encoder(ks, resolve_tgid=lambda tid: 0), SnapDir(out_dir),
                                 window_ns=int(window_s * 1e9), memory=memory, triggers=triggers, after_ns=0,
                                 max_dumps=1000, hold_off_ns=0, new_meta=lambda: meta_record("record", ks),
                                 start_ts=0, quiet=True)


def retimed(data: bytes, first: int, last: int) -> bytes:
    """data with its first and last slots' ts set (what the ring's window reads)."""
    buf = bytearray(data)
    off, end = flight.OFF["ts"], len(buf) - flight.STRIDE + flight.OFF["ts"]
    buf[off:off + 8] = first.to_bytes(8, "little")
    buf[end:end + 8] = last.to_bytes(8, "little")
    return bytes(buf)


def per_event(args, ks, data: bytes, tmp: str) -> dict:
    n = len(data) // flight.STRIDE
    view = memoryview(data)
    enc = ec.Encoder(ks, resolve_tgid=lambda tid: 0)
    devnull = open(os.devnull, "wb", buffering=1 << 20)
    fr = recorder(ks, tmp, args.memory << 20, 30)
    while fr.bytes + len(data) < fr.memory:
        fr.feed(view, n)  # a long run's steady state: the ring is full, each batch replaces the oldest
    filling = recorder(ks, tmp, 1 << 40, 3600)  # a ring still growing: every batch is new memory

    def json_path():
        out, nlines, _ = enc.encode_bytes(view, n)
        devnull.write(out)

    def ring_path():
        fr.feed(view, n)

    paths = {"json": json_path, "ring": ring_path, "ring filling": lambda: filling.feed(view, n)}
    for fn in paths.values():
        fn()  # warm the caches
    assert fr.pending is None and filling.pending is None, "a trigger fired on the bench batch: the steady state is none firing"
    times = {k: [] for k in paths}
    for r in range(args.rounds):
        for name in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
            t0 = time.process_time_ns()
            for _ in range(8):
                paths[name]()
            times[name].append((time.process_time_ns() - t0) / (8 * n))
    return {k: statistics.median(v) for k, v in times.items()}


def storm(args, ks, data: bytes, tmp: str) -> dict:
    memory = args.memory << 20
    fr = recorder(ks, tmp, memory, args.seconds, triggers=())  # SIGUSR1 at the end
    n = len(data) // flight.STRIDE
    step = int(1e9 / args.rate)
    total = int(args.rate * args.seconds)
    fed = feed_cpu = 0
    t = 10**12
    while fed < total:
        b = retimed(data, t, t + (n - 1) * step)  # made one at a time: peak RSS is the ring's
        cpu0 = time.process_time_ns()
        fr.feed(memoryview(b), n)
        feed_cpu += time.process_time_ns() - cpu0
        fed += n
        t += n * step
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fr.fire({"type": "trigger", "ts": t, "cause": "signal", "signal": "SIGUSR1"})
    w0 = time.monotonic()
    name = fr.write()
    write_s = time.monotonic() - w0
    with open(os.path.join(tmp, name), "rb") as f:
        f.readline()
        trig = json.loads(f.readline())
    size = os.path.getsize(os.path.join(tmp, name))
    os.unlink(os.path.join(tmp, name))
    return {"events": fed, "feed_cpu_s": feed_cpu / 1e9, "window_s": (trig["ts"] - trig["window_begin_ts"]) / 1e9,
            "shrunk": trig["shrunk"], "ring_peak_mb": fr.peak_bytes / 2**20, "cap_mb": args.memory,
            "peak_rss_mb": base_rss,
            "peak_rss_mb_writing": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "write_s": write_s, "file_mb": size / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--threads", type=int, default=500)
    ap.add_argument("--rate", type=float, default=400_000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--memory", type=int, default=256, help="--flight-memory, MiB")
    args = ap.parse_args()
    ks = bench_encode.kernel_states()
    data = bench_encode.make_batch(8192, args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        st = storm(args, ks, data, tmp)  # first: the process's peak RSS is then the storm's
        med = per_event(args, ks, data, tmp)
    print(f"8192 slots/batch, median of {args.rounds} rounds (process CPU time, interleaved)")
    print(f"{'path':<8}{'ns/event':>10}")
    for k, v in med.items():
        print(f"{k:<8}{v:>10.1f}")
    print(f"ring / json: {med['ring'] / med['json']:.3f} (filling: {med['ring filling'] / med['json']:.3f})")
    print(f"storm {args.rate:,.0f} events/s x {args.seconds:g} s into {args.memory} MiB: window kept "
          f"{st['window_s']:.2f} s (shrunk {st['shrunk']}), ring peak {st['ring_peak_mb']:.1f} MiB, peak RSS "
          f"{st['peak_rss_mb']:.0f} MiB ({st['peak_rss_mb_writing']:.0f} MiB writing the file), feed CPU {st['feed_cpu_s'] * 1e9 / st['events']:.1f} ns/event, "
          f"file {st['file_mb']:.0f} MiB written in {st['write_s']:.2f} s")
    print(json.dumps({"bench": "flight", "rounds": args.rounds,
                      "ns_per_event": {k: round(v, 1) for k, v in med.items()},
                      "ratio": round(med["ring"] / med["json"], 3), "storm": st}))


if __name__ == "__main__":
    main()

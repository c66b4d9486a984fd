#!/usr/bin/env python3
"""How long `pstate record` takes to turn one ring-buffer record into a JSON line.

Builds realistic batches of raw records (the 72-byte ring buffer slots that
bpf/record.bpf.c writes: switch_out/switch_in/wake-up mix of a few hundred
threads, some null durations, now and then a fork, exec, exit or reap), then
times, interleaved in the same run and in process CPU time:

  pure          the Python loop + "".join(lines).encode(): record's path
                without the C extension (Encoder.encode_bytes, PSTATE_PURE=1)
  native lines  the C loop making one str per line (Encoder.encode) + the
                same join/encode
  native bytes  the C loop writing the joined UTF-8 (Encoder.encode_bytes, a
                memoryview of a reused buffer): record's path

Like record, each path's last result stays bound while the next is made.

Each encoder is warmed on the batch first (record runs for seconds to hours:
its caches are warm). Prints a table of medians (ns/event) and one JSON line.

    python bench/bench_encode.py
    python bench/bench_encode.py --batch 8192 --rounds 31 --threads 2000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "cli"))

from pstate.kernel import eventcodec as ec  # noqa: E402
from pstate.kernel.kstates import KernelStates, read_kernel_states  # noqa: E402

COMMS = [b"kworker/0:1", b"python3", b"chrome", b"Xorg", b"systemd-journal", b"postgres",
         b"nginx", b"ksoftirqd/1", b"rcu_preempt", b"java", b"C2 CompilerThre", b"sshd"]


def kernel_states() -> KernelStates:
    try:
        return read_kernel_states()
    except (OSError, ValueError):
        return KernelStates(report_mask=0xFF, preempt_bit=0x100,
                            letters={1: "S", 2: "D", 4: "T", 8: "t", 16: "X", 32: "Z", 64: "P", 128: "I"})


def make_batch(n: int, n_threads: int, seed: int = 1) -> bytes:
    rnd = random.Random(seed)
    threads = []
    for i in range(n_threads):
        pid = 1000 + (i // 7) * 7
        threads.append((pid, pid + i % 7, rnd.choice(COMMS).ljust(16, b"\0")))
    K = ec.ST_KERNEL
    running, runnable, preempted = ec.CODES["running"], ec.CODES["runnable"], ec.CODES["preempted"]
    out = []
    ts = 10**12
    for _ in range(n):
        ts += rnd.randrange(200, 5000)
        pid, tid, comm = rnd.choice(threads)
        cpu = rnd.randrange(2)
        dur = ec.NO_DUR if rnd.random() < 0.01 else int(rnd.lognormvariate(10, 2))
        r = rnd.random()
        opid = otid = kst = flags = 0
        typ, prio = ec.EV_STATE, 120
        if r < 0.40:  # switch_out: sleeping, D or preempted
            cause, frm = 1, running
            kst = rnd.choice((1, 1, 1, 2, 0, 0x100))
            to = K | (kst & 0xFF) if kst & 0xFF else preempted
            flags = ec.F_VOLUNTARY if kst & 0xFF else 0
            otid = rnd.choice(threads)[1]
        elif r < 0.80:  # switch_in
            cause, frm, to = 2, rnd.choice((runnable, preempted)), running
            otid = rnd.choice(threads)[1]
        elif r < 0.98:  # wake-up
            cause, frm, to = 3, K | rnd.choice((1, 2)), runnable
            opid, otid, _ = rnd.choice(threads)
            kst = cpu
        else:
            cause, frm, to = 0, 0, 0
            typ = rnd.choice((ec.EV_FORK, ec.EV_EXEC, ec.EV_EXIT, ec.EV_STATE))
            if typ == ec.EV_STATE:
                cause, frm, to = 5, K | 0x20, ec.CODES["reaped"]
            opid, otid = pid, tid + 1
            flags = rnd.randrange(8)
        out.append(struct.pack(ec.REC_FMT, ec.EVENT_SIZE, 0, ts, dur, pid, tid, opid, otid, kst, frm, to, cpu, typ,
                               cause, prio, flags, comm, 0, 0 if typ != ec.EV_STATE else 4000 + pid % 3))
    return b"".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=8192, help="records per batch (record drains 8192)")
    ap.add_argument("--threads", type=int, default=500, help="distinct threads in the batch")
    ap.add_argument("--rounds", type=int, default=21, help="timed rounds per path (interleaved)")
    args = ap.parse_args()

    ks = kernel_states()
    data = make_batch(args.batch, args.threads)
    view = memoryview(data)
    n = args.batch

    def resolve(tid):
        return 0

    def enc():
        return ec.Encoder(ks, resolve_tgid=resolve)

    e_pure, e_nat, e_bytes = enc(), enc(), enc()
    paths = {
        "pure": lambda: "".join(e_pure.encode_pure(view, n)[0]).encode(),
        "native lines": (lambda: "".join(e_nat._native.encode(view, e_nat)[0]).encode()) if e_nat._native else None,
        "native bytes": (lambda: e_bytes._native.encode_bytes(view, e_bytes)[0]) if e_bytes._native else None,
    }
    paths = {k: v for k, v in paths.items() if v is not None}
    ref = paths["pure"]()
    for name, fn in paths.items():
        assert fn() == ref, f"{name} output differs from pure"
    times: dict[str, list[float]] = {k: [] for k in paths}
    held = {}
    for _ in range(args.rounds):
        for name, fn in paths.items():
            t0 = time.process_time_ns()
            out = fn()
            times[name].append((time.process_time_ns() - t0) / n)
            held[name] = out
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.batch} records/batch, {args.threads} threads, {len(ref) / n:.0f} bytes/line, "
          f"median of {args.rounds} rounds (process CPU time)")
    print(f"{'path':<14}{'ns/event':>10}{'events/s':>14}{'speed-up':>10}")
    for name, v in med.items():
        print(f"{name:<14}{v:>10.0f}{1e9 / v:>14,.0f}{med['pure'] / v:>9.1f}x")
    print(json.dumps({"bench": "encode", "batch": args.batch, "threads": args.threads, "rounds": args.rounds,
                      "ns_per_event": {k: round(v, 1) for k, v in med.items()}}))


if __name__ == "__main__":
    main()

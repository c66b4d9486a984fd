#!/usr/bin/env python3
"""record's zero-loss rate writing zstd (-o x.jsonl.zst) and gzip (.gz)
against a plain file: the same paced ping-pong (bench/run.py's zero-loss
section: CPU 1, 5 s per rate) and the same unpaced pipe storm on each CPU,
with record on CPU 0, the three outputs interleaved in each round (their
order rotated from round to round). Per run: the kernel's events and what
was lost (the end record's count, checked against the kernel's), record's
CPU time per event (process CPU, start-up included), and the size on disk
(compression ratio against the decompressed file).

Needs root. Each invocation runs --rounds rounds; --append FILE adds its runs
to the ones FILE holds (one round per invocation keeps a shared machine's
lock short) and reports the medians of them all.

    python bench/bench_compress.py --rounds 3
    python bench/bench_compress.py --rounds 1 --append bench/results/compress.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from tabulate import tabulate  # noqa: E402

import contenders as ct  # noqa: E402
import run as suite  # noqa: E402
import storm  # noqa: E402

FORMATS = (("plain", ".jsonl"), ("zstd", ".jsonl.zst"), ("gzip", ".jsonl.gz"))
RATES = (300_000, 500_000, 700_000)
SECONDS = 5.0


def one_round(tmp: str, k: int, seconds: float, rates) -> list[dict]:
    order = FORMATS[k % 3:] + FORMATS[:k % 3]
    rows = []
    for target in rates:
        for name, suffix in order:
            c = ct.pstate_record_compressed(f"record_{name}", f"record -o x{suffix}", suffix)
            res = suite.zero_loss(os.path.join(tmp, name), seconds, rates=(target,), c=c, storms=False)
            rows += [dict(r, format=name, round=k) for r in res["rows"]]
    for name, suffix in order:
        c = ct.pstate_record_compressed(f"record_{name}", f"record -o x{suffix}", suffix)
        rows.append(dict(suite.zero_loss_storms(os.path.join(tmp, name), c=c), format=name, round=k))
    return rows


def summary(rows: list[dict]) -> list[dict]:
    out = []
    targets = list(dict.fromkeys(r["target"] for r in rows))
    for target in targets:
        for name, _suffix in FORMATS:
            rs = [r for r in rows if r["target"] == target and r["format"] == name and r.get("ok", True)
                  and r.get("kernel_events")]
            if not rs:
                continue
            ns = [1e9 * r["cpu_s"] / r["kernel_events"] for r in rs if r.get("cpu_s") is not None]
            out.append({
                "target": target, "format": name, "runs": len(rs),
                "achieved_median": round(statistics.median(r["achieved"] for r in rs)),
                "lost": [r["lost"] for r in rs], "unreported": [r.get("unreported") for r in rs],
                "cpu_ns_per_event_median": round(statistics.median(ns), 1) if ns else None,
                "ratio_median": round(statistics.median(r["ratio"] for r in rs), 2) if rs[0].get("ratio") else None,
                "bytes_per_event_median": round(statistics.median(r["bytes"] / r["kernel_events"] for r in rs
                                                                  if r.get("bytes")), 1),
            })
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=SECONDS)
    ap.add_argument("--rates", type=lambda v: tuple(int(x) for x in v.split(",")), default=RATES,
                    help="paced targets, transitions/s (default 300000,500000,700000)")
    ap.add_argument("--append", metavar="FILE", help="add to the runs FILE holds, and write them all to it")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_compress needs root (it runs pstate record)", file=sys.stderr)
        return 1
    old = []
    if args.append and os.path.exists(args.append):
        with open(args.append) as f:
            old = json.load(f).get("runs", [])
    first = 1 + max((r["round"] for r in old), default=-1)
    rows = list(old)
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(first, first + args.rounds):
            suite.log(f"round {k}")
            rows += one_round(tmp, k, args.seconds, args.rates)
    summ = summary(rows)
    print(tabulate([[s["target"], s["format"], s["runs"], f"{s['achieved_median']:,}", " ".join(map(str, s["lost"])),
                     s["cpu_ns_per_event_median"], s["ratio_median"] or "", s["bytes_per_event_median"]]
                    for s in summ],
                   ["target/s", "output", "runs", "achieved/s (median)", "lost per run", "record CPU ns/event",
                    "ratio", "bytes/event"], tablefmt="simple"))
    results = {"bench": "compress", "machine": suite.machine(), "seconds": args.seconds,
               "loadavg_end": storm.loadavg(), "summary": summ, "runs": rows}
    if args.append:
        storm.write_results(args.append, results)
    else:
        print(json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

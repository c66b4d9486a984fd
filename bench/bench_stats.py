#!/usr/bin/env python3
"""How fast `pstate stats` digests a recording, and what bounds its memory.

Generates a synthetic recording (default 5,000,000 state transitions of
2,000 threads in ~290 processes, in the format `pstate record` writes), then
measures on one core (the process is pinned with sched_setaffinity):

  stats fast      the chunked digester that `pstate stats FILE` uses
  stats careful   the per-record reference path (reader.read_records)
  stats e2e       `python -m pstate stats FILE -f json`: wall time, peak RSS
  e2e 1/5         the same on the first fifth of the file: the peak RSS must
                  not grow with the number of events
  e2e all CPUs    the same, unpinned: the file is split into one part per CPU
                  (peak RSS: the largest process)
  parse only      a bare loop of orjson.loads over the lines (the ceiling of
                  any per-line Python design)
  why views       stats --stacks, --wakers, --antagonists (analysis.causes
                  beside the Aggregator, as `pstate stats FILE --wakers`
                  reads), each on its own (--why-views)

and, with --alternatives, native bulk parsers that were candidates for a fast
path (each when importable; single-threaded where the library allows it):

  polars          polars.read_ndjson on 16 MiB chunks, only the needed columns
  duckdb          read_json + one GROUP BY (pid, from, to, bucket) in SQL
  duckdb checked  read_json of the raw fields, type checks, and the per-cell and
                  per-task aggregates an identical result needs (a floor:
                  line-level checks for NaN and trailing commas not included)
  msgspec         msgspec.json.Decoder(Struct).decode_lines on 16 MiB chunks

Prints a table of medians (events/s) and one JSON line for scripts.

    python bench/bench_stats.py                      # 5M events
    python bench/bench_stats.py --events 1000000 --repeat 3 --alternatives
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "cli"))

import orjson  # noqa: E402

from pstate.stream import reader, streamio  # noqa: E402
from pstate.analysis import timeinstate  # noqa: E402
from pstate.analysis import ingest  # noqa: E402
from pstate.analysis import causes  # noqa: E402

T0 = 1_000_000_000_000


def generate(path: Path, n_events: int, n_tasks: int = 2000, seed: int = 1, slices: float = 0.0) -> None:
    """A plausible recording: threads cycle running -> preempted/sleeping/D ->
    runnable -> running with log-normal durations, in global time order.
    slices: after each state record, with this chance, a slice record of a
    task the recording does not follow (what `record -p` adds beside a busy
    task: 0.4 per event on a followed task beside a pipe storm)."""
    rnd = random.Random(seed)
    meta = {"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "bench",
            "host": "bench", "kernel": "6.1.0", "boot_id": "bench", "clock": "monotonic", "ts": T0,
            "wall_ns": 0, "ncpu": 8, "include_idle": False}
    dumps = orjson.dumps
    heap = []
    tasks = {}
    for i in range(n_tasks):
        tid = 1000 + i
        pid = 1000 + (i // 7) * 7
        tasks[tid] = [pid, f"comm{pid % 50}", rnd.choice(["running", "sleeping", "runnable"]), None]
        heap.append((T0 + rnd.randrange(10_000_000), tid))
    heapq.heapify(heap)
    ts = T0
    with open(path, "wb", buffering=1 << 20) as f:
        w = f.write
        w(dumps(meta) + b"\n")
        for _ in range(n_events):
            ts, tid = heapq.heappop(heap)
            t = tasks[tid]
            pid, comm, st, since = t
            rec = {"type": "state", "ts": ts, "cpu": tid % 8, "pid": pid, "tid": tid, "comm": comm,
                   "from": st, "to": None, "dur_ns": None if since is None else ts - since}
            if st == "running":
                r = rnd.random()
                to = "preempted" if r < 0.3 else ("sleeping" if r < 0.9 else "uninterruptible")
                rec.update(to=to, cause="switch_out", voluntary=to != "preempted",
                           kstate={"preempted": "R+", "sleeping": "S"}.get(to, "D"), prio=120, next_tid=0)
                nxt = rnd.lognormvariate(9, 1.5) if to == "preempted" else rnd.lognormvariate(13, 2)
            elif st in ("runnable", "preempted"):
                to = "running"
                rec.update(to=to, cause="switch_in", prio=120, prev_tid=0)
                nxt = rnd.lognormvariate(11, 1.5)
            else:
                to = "runnable"
                rec.update(to=to, cause="wakeup", waker_tid=17, waker_pid=17)
                nxt = rnd.lognormvariate(9, 1.5)
            t[2], t[3] = to, ts
            w(dumps(rec) + b"\n")
            if slices and rnd.random() < slices:
                w(dumps({"type": "slice", "ts": ts, "cpu": tid % 8, "pid": 90000, "tid": 90000 + tid % 16,
                         "comm": "storm", "dur_ns": 1000 + rnd.randrange(4000), "next_tid": tid}) + b"\n")
            heapq.heappush(heap, (ts + 1 + int(nxt), tid))
        w(dumps({"type": "end", "ts": ts, "reason": "eof", "events": n_events, "lost": 0}) + b"\n")


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def cpu_timed(fn):
    """The CPU time of fn (this process's): what a busy machine does not inflate."""
    t = time.process_time()
    fn()
    return time.process_time() - t


def run_fast(path):
    st = streamio.ReadStats()
    agg = timeinstate.Aggregator("pid")
    ingest.digest_files([str(path)], agg, st)
    agg.summarise(st)


def run_why(view: str):
    """stats FILE --VIEW, in this process: the Causes beside the Aggregator."""
    def run(path):
        st = streamio.ReadStats()
        agg = timeinstate.Aggregator("pid")
        found = causes.Causes("pid", **{view: True})
        causes.digest([str(path)], agg, found, st, chunk=8 << 20)
        found.finish(agg.summarise(st).end_ts)
    return run


def run_careful(path):
    st = streamio.ReadStats()
    agg = timeinstate.Aggregator("pid")
    ingest.digest_records(reader.read_records([str(path)], st), agg)
    agg.summarise(st)


def run_parse_only(path):
    loads = orjson.loads
    with open(path, "rb") as f:
        for line in f:
            loads(line)


def run_e2e(path, cpus=None) -> tuple[float, int]:
    """Wall time and peak RSS (KiB) of `pstate stats FILE -f json`, on the
    benchmark's core (affinity is inherited) or on the given CPUs."""
    cmd = [sys.executable, "-m", "pstate", "stats", str(path), "-f", "json", "--top", "1"]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "cli"))
    pre = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            preexec_fn=pre)
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"pstate stats failed with exit code {proc.returncode}")
    return wall, usage.ru_maxrss


def _has(prog: str) -> bool:
    return any(os.access(os.path.join(p, prog), os.X_OK) for p in os.environ.get("PATH", "").split(":"))


def _chunks(path, size=16 << 20):
    with open(path, "rb") as f:
        rest = b""
        while True:
            data = f.read(size)
            if not data:
                if rest:
                    yield rest
                return
            data = rest + data
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            yield data[:cut]


def alt_polars(path):
    os.environ["POLARS_MAX_THREADS"] = "1"
    import polars as pl

    sch = {"type": pl.String, "ts": pl.UInt64, "pid": pl.UInt64, "tid": pl.UInt64, "comm": pl.String,
           "from": pl.String, "to": pl.String, "dur_ns": pl.UInt64}
    for c in _chunks(path):
        df = pl.read_ndjson(c, schema=sch)
        d = pl.col("dur_ns")
        df.with_columns(b=d.cast(pl.Float64).log(2).floor().cast(pl.Int32)) \
          .group_by("pid", "from", "to", "b").agg(pl.len(), d.sum().alias("sum"), d.max().alias("max"))


def alt_duckdb(path):
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads=1")
    cols = ("{'type':'VARCHAR','ts':'UBIGINT','pid':'UBIGINT','tid':'UBIGINT','comm':'VARCHAR',"
            "'from':'VARCHAR','to':'VARCHAR','dur_ns':'UBIGINT'}")
    con.execute(f"""select pid, "from", "to", floor(log2(dur_ns))::int b, count(*), sum(dur_ns), max(dur_ns)
                    from read_json('{path}', format='newline_delimited', columns={cols})
                    group by all""").fetchall()


def alt_duckdb_checked(path):
    """What a duckdb path that gives the same numbers as the Python one must
    do at least: read the fields raw (read_json coerces 1.0, "12" and true
    to integers and numbers to strings), check their types, and aggregate
    per cell (group, from, to, latency bucket) and per task in file order."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads=1")
    raw = ("{'type':'JSON','ts':'JSON','cpu':'JSON','pid':'JSON','tid':'JSON','comm':'JSON',"
           "'from':'JSON','to':'JSON','dur_ns':'JSON'}")
    con.execute(f"""create temp table ev as
        select row_number() over () rn, type::varchar ty, ts::varchar ts, cpu::varchar cpu, pid::varchar pid,
               tid::varchar tid, comm::varchar comm, "from"::varchar frm, "to"::varchar tto, dur_ns::varchar d
        from read_json('{path}', format='newline_delimited', columns={raw})""")

    def canonical(col):  # a JSON integer 0 <= v < 2**64 written the one way orjson reads it
        return f"try_cast({col} as ubigint)::varchar is not distinct from {col}"

    con.execute(f"""select count(*) from ev where ty = '"state"' and not ({canonical('ts')} and {canonical('cpu')}
        and {canonical('pid')} and {canonical('tid')} and (comm is null or comm = 'null' or comm[1] = '"')
        and frm[1] = '"' and tto[1] = '"' and (d is null or d = 'null' or {canonical('d')}))""").fetchall()
    con.execute("""create temp table st as select rn, ts::ubigint ts, pid::ubigint pid, tid::ubigint tid, comm,
        frm, tto, case when d = 'null' then null else d::ubigint end d from ev where ty = '"state"'""")
    # latency.bucket_index: s = bit_length - 6; log2 in doubles, corrected to the exact bit length
    con.execute("""with b as (select *, case when d >= 64 then floor(log2(d))::int end lg from st),
        c as (select *, lg - (case when (1::ubigint << lg) > d then 1 else 0 end)
                 + (case when lg < 63 and (1::ubigint << (lg + 1)) <= d then 1 else 0 end) lg2 from b)
        select pid, frm, tto, case when d < 64 then d else ((lg2 - 5) << 5) + (d >> (lg2 - 5)) end idx,
               count(*), sum(d), min(d), max(d), min(rn) from c group by all order by min(rn)""").fetchall()
    con.execute("""select tid, min(rn), arg_min(ts, rn), arg_min(d is null, rn), arg_min(pid, rn), arg_min(comm, rn),
        max_by(struct_pack(pid, comm, ts, tto), rn), sum(d) from st group by tid order by min(rn)""").fetchall()


def alt_msgspec(path):
    import msgspec

    fields = [("type", str), ("ts", int, 0), ("pid", int, 0), ("tid", int, 0), ("comm", str | None, None),
              ("from_", str, msgspec.field(name="from", default="")), ("to", str, ""),
              ("dur_ns", int | None, None)]
    ev = msgspec.defstruct("Ev", fields, gc=False)
    dec = msgspec.json.Decoder(ev)
    for c in _chunks(path):
        dec.decode_lines(c)


ALTERNATIVES = {"polars read_ndjson + group_by": ("polars", alt_polars),
                "duckdb read_json + GROUP BY": ("duckdb", alt_duckdb),
                "duckdb checked types + cell/task aggregates": ("duckdb", alt_duckdb_checked),
                "msgspec decode_lines (parse only)": ("msgspec", alt_msgspec)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--slices", type=float, default=0.0, metavar="SHARE",
                    help="a filtered recording: a slice record after this share of the events")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--file", type=Path, help="use (or create) this recording instead of a temporary one")
    ap.add_argument("--alternatives", action="store_true", help="also time native bulk parsers")
    ap.add_argument("--no-careful", action="store_true", help="skip the slow reference path")
    ap.add_argument("--why-views", action="store_true", help="also time stats --stacks, --wakers, --antagonists")
    ap.add_argument("--only-why", action="store_true", help="time the why views only")
    args = ap.parse_args()

    all_cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    if all_cpus:
        os.sched_setaffinity(0, {min(all_cpus)})
    tmp = None
    path = args.file
    if path is None:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "bench.jsonl"
    if not path.exists():
        t = timed(lambda: generate(path, args.events, args.tasks, slices=args.slices))
        print(f"generated {args.events} events in {t:.1f}s: {path} ({path.stat().st_size / 1e6:.0f} MB)",
              file=sys.stderr)
    # events: all lines but meta, end and the context records of a filtered recording (slice, waker)
    n = sum(1 for line in open(path, "rb") if not line.startswith((b'{"type":"slice"', b'{"type":"waker"'))) - 2
    part = Path(str(path) + ".part")
    with open(path, "rb") as src, open(part, "wb") as dst:
        for i, line in enumerate(src):
            if i > n // 5:
                break
            dst.write(line)

    rows = []

    def measure(name, fn, events=n, cpu=False):
        times = [(cpu_timed if cpu else timed)(lambda: fn(path)) for _ in range(args.repeat)]
        med = statistics.median(times)
        rows.append({"what": name, "events": events, "median_s": round(med, 3),
                     "events_per_s": round(events / med), "runs_s": [round(x, 3) for x in times]})
        print(f"  {name}: {events / med / 1e6:.3f} M events/s", file=sys.stderr)

    if args.why_views or args.only_why:
        for view in ("stacks", "wakers", "antagonists"):
            measure(f"stats --{view} (why view, per CPU second)", run_why(view), cpu=True)
    if args.only_why:
        rows_only(rows, part)
        return
    measure("parse only (orjson.loads per line)", run_parse_only)
    measure("stats fast (chunked digester)", run_fast)
    if not args.no_careful:
        measure("stats careful (read_records + add_record)", run_careful)
    wall_part, rss_part = run_e2e(part)
    wall, rss = run_e2e(path)
    rows.append({"what": "stats e2e 1/5 of the file", "events": n // 5, "median_s": round(wall_part, 3),
                 "events_per_s": round((n // 5) / wall_part), "peak_rss_kib": rss_part})
    rows.append({"what": "stats e2e whole file", "events": n, "median_s": round(wall, 3),
                 "events_per_s": round(n / wall), "peak_rss_kib": rss})
    if all_cpus and len(all_cpus) > 1:
        wall_j, rss_j = run_e2e(path, all_cpus)
        rows.append({"what": f"stats e2e whole file, {len(all_cpus)} CPUs (-j 0)", "events": n,
                     "median_s": round(wall_j, 3), "events_per_s": round(n / wall_j), "peak_rss_kib": rss_j})
    if args.alternatives:
        for name, (mod, fn) in ALTERNATIVES.items():
            try:
                __import__(mod)
            except ImportError:
                rows.append({"what": name, "skipped": f"{mod} not installed"})
                continue
            measure(name, fn)
    part.unlink()

    from tabulate import tabulate

    table = [[r["what"], r.get("events", ""), r.get("median_s", ""),
              f"{r['events_per_s'] / 1e6:.3f}" if "events_per_s" in r else r.get("skipped", ""),
              r.get("peak_rss_kib", "")] for r in rows]
    print(tabulate(table, ["measurement (one core)", "events", "median s", "M events/s", "peak RSS KiB"],
                   tablefmt="simple"))
    print(json.dumps({"bench": "stats", "python": sys.version.split()[0], "cpu": _cpu(), "results": rows}))
    if tmp:
        tmp.cleanup()


def rows_only(rows, part) -> None:
    part.unlink()
    for r in rows:
        print(f"{r['what']}: {r['events_per_s'] / 1e6:.3f} M events/s", file=sys.stderr)
    print(json.dumps({"bench": "stats", "python": sys.version.split()[0], "cpu": _cpu(), "results": rows}))


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


if __name__ == "__main__":
    main()

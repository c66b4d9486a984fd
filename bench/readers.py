"""Reader throughput: events/s of `pstate stats`, `replay --no-wait` and
`heat` on a large recording.

The recording is synthetic but byte-for-byte what `pstate record` writes: a
simulated scheduler (threads of several processes on 8 CPUs going running ->
sleeping/D/preempted -> runnable -> running, with consistent durations) emits
the BPF side's binary records, and record's own encoder (pstate.kernel.eventcodec)
turns them into JSON lines. It is generated once and cached under
bench/.cache/.
"""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.join(HERE, ".cache")
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cli"))

GEN_VERSION = 1
NCPU = 8


def _kernel_states():
    from pstate.kernel.kstates import KernelStates

    # The print_fmt of current kernels (6.x): what read_kernel_states() finds.
    return KernelStates(report_mask=0xFF, preempt_bit=0x100,
                        letters={1: "S", 2: "D", 4: "T", 8: "t", 16: "X", 32: "Z", 64: "P", 128: "I"})


def generate(path: str, n: int, seed: int = 8, log=print) -> None:
    """Write a v1 recording of n events to path (atomically)."""
    from pstate.kernel import eventcodec as ec
    from pstate.stream.meta import meta_record

    ks = _kernel_states()
    rnd = random.Random(seed)
    nproc, per = 64, 8
    threads = []  # [pid, tid, comm, state, since, cpu]
    comms = ["postgres", "nginx", "java", "kworker/1:2", "redis-server", "python3", "node", "envoy"]
    t = 5_000_000_000_000
    for p in range(nproc):
        pid = 2000 + p * 16
        for k in range(per):
            threads.append([pid, pid + k, comms[p % len(comms)].encode().ljust(16, b"\0"), 0, None, p % NCPU])
    S_, D_ = ec.ST_KERNEL | 1, ec.ST_KERNEL | 2
    RUNNING, RUNNABLE, PREEMPTED = 1, 2, 3
    pack = struct.Struct(ec.REC_FMT).pack
    enc = ec.Encoder(ks, resolve_tgid=lambda tid: 0)
    meta = meta_record("record", ks)
    meta.update({"ts": t, "host": "bench", "ncpu": NCPU, "include_idle": False, "buffer_bytes": 16 << 20})
    tmp = path + ".tmp"
    written = 0
    t_start = time.monotonic()
    with open(tmp, "wb") as f:
        f.write(json.dumps(meta, separators=(",", ":")).encode() + b"\n")
        batch = []
        i = 0
        while i < n:
            th = threads[rnd.randrange(len(threads))]
            pid, tid, comm, st, since, cpu = th
            t += rnd.randint(200, 2000)
            dur = ec.NO_DUR if since is None else t - since
            if st in (0, RUNNING):  # unknown start: treat as running
                r = rnd.random()
                to, kst, vol = (S_, 1, 1) if r < 0.6 else ((PREEMPTED, 0x100, 0) if r < 0.9 else (D_, 2, 1))
                batch.append(pack(ec.EVENT_SIZE, 0, t, dur, pid, tid, 0, 0, kst, RUNNING if st else 0, to, cpu,
                                  ec.EV_STATE, 1, 120, vol, comm, 0, 1))
                th[3] = to
            elif st in (S_, D_):
                waker = threads[rnd.randrange(len(threads))]
                cpu = rnd.randrange(NCPU)
                batch.append(pack(ec.EVENT_SIZE, 0, t, dur, pid, tid, waker[0], waker[1], cpu, st, RUNNABLE, cpu,
                                  ec.EV_STATE, 3, -1, 0, comm, 0, 1))
                th[3], th[5] = RUNNABLE, cpu
            else:  # runnable or preempted -> running
                batch.append(pack(ec.EVENT_SIZE, 0, t, dur, pid, tid, 0, 0, 0, st, RUNNING, cpu, ec.EV_STATE, 2,
                                  120, 0, comm, 0, 1))
                th[3] = RUNNING
            th[4] = t
            i += 1
            if len(batch) == 32768 or i == n:
                view = memoryview(b"".join(batch))
                lines, _ = enc.encode(view, len(batch))
                f.write("".join(lines).encode())
                written += len(lines)
                batch = []
        end = {"type": "end", "ts": t, "reason": "duration", "events": written, "lost": 0, "lost_ringbuf_full": 0,
               "lost_map_full": 0, "lost_sampled": 0, "lost_unread": 0, "kernel_events": written,
               "duration_ns": t - meta["ts"]}
        f.write(json.dumps(end, separators=(",", ":")).encode() + b"\n")
    os.replace(tmp, path)
    log(f"  generated {written:,} events ({os.path.getsize(path) / 1e6:.0f} MB) in {time.monotonic() - t_start:.1f}s")


def recording(n: int, log=print) -> str:
    os.makedirs(CACHE, exist_ok=True)
    path = os.path.join(CACHE, f"recording-{n}-v{GEN_VERSION}.jsonl")
    if not os.path.exists(path):
        log(f"  generating a {n:,}-event recording into {os.path.relpath(path)} (cached for later runs)")
        generate(path, n, log=log)
    return path


def _time(argv: list[str], stdin=None, env=None) -> tuple[float, float, int, str]:
    """Wall seconds, CPU seconds (user + system of the child), exit code, stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    r = subprocess.run(argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       env=env)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.returncode, r.stderr


# The yardstick: a plain Python loop of orjson.loads plus a dict update.
ORJSON_LOOP = """
import sys, orjson
d = {}
with open(sys.argv[1], "rb") as f:
    for line in f:
        r = orjson.loads(line)
        k = r.get("pid")
        d[k] = d.get(k, 0) + 1
"""


def reader_commands(pstate: str, path: str) -> dict[str, tuple[list[str], dict | None]]:
    pure = dict(os.environ, PSTATE_PURE="1")
    return {
        # one process: the figure per core (stats splits big files over all CPUs by default)
        "stats": ([pstate, "stats", "-j", "1", path], None),
        "stats (pure Python)": ([pstate, "stats", "-j", "1", path], pure),
        "orjson loop (yardstick)": ([sys.executable, "-c", ORJSON_LOOP, path], None),
        "replay --no-wait": ([pstate, "replay", "--no-wait", path], None),
        "heat": ([pstate, "heat", path, "--width", "120", "--no-color"], None),
    }


def measure(pstate: str, n: int, runs: int, log=print) -> dict:
    path = recording(n, log=log)
    out = {"events": n, "file_bytes": os.path.getsize(path), "runs": runs, "readers": {}}
    for name, (argv, env) in reader_commands(pstate, path).items():
        times, cpus, err = [], [], None
        for _ in range(runs):
            dt, cpu, rc, stderr = _time(argv, env=env)
            if rc != 0:
                err = f"exit {rc}: {stderr.strip()[-300:]}"
                break
            times.append(dt)
            cpus.append(cpu)
            if sum(times) > 20:  # slow reader: one run says enough, keep the suite short
                break
        if err:
            out["readers"][name] = {"ok": False, "error": err}
            log(f"  {name}: FAILED {err}")
            continue
        med = statistics.median(times)
        cpu_med = statistics.median(cpus)
        out["readers"][name] = {"ok": True, "seconds": times, "median_s": med, "events_per_s": n / med,
                                "min_s": min(times), "max_s": max(times), "cpu_seconds": cpus,
                                "events_per_cpu_s": n / cpu_med if cpu_med else None}
        log(f"  {name}: {n / med:,.0f} events/s, {n / cpu_med:,.0f} per CPU second "
            f"(median {med:.2f}s wall, {cpu_med:.2f}s CPU, of {len(times)})")
    out["readers"]["heat --live"] = heat_live(log)
    return out


def heat_live(log=print, events: int = 1_000_000, rate: int = 200_000) -> dict:
    """heat --live: bench/bench_heat.py's paced run at `rate` events/s and its
    unpaced maximum (1,000,000 events, pseudo-terminal)."""
    script = os.path.join(HERE, "bench_heat.py")
    if not os.path.exists(script):
        return {"ok": False, "error": "bench/bench_heat.py not present"}
    try:
        r = subprocess.run([sys.executable, script, "--events", str(events), "--rates", str(rate), "--repeat", "1",
                            "--json"], capture_output=True, text=True, timeout=300)
        rows = json.loads(r.stdout)
        if isinstance(rows, dict):
            rows = rows.get("results", [])
    except (subprocess.TimeoutExpired, ValueError) as e:
        return {"ok": False, "error": f"bench_heat.py: {e}"}
    res = {"ok": True, "source": "bench/bench_heat.py", "events": events}
    for row in rows:
        if not isinstance(row, dict):
            continue
        if row.get("scenario") == "max":
            res["max_events_per_s"] = row.get("events_per_s")
            res["max_sampling"] = row.get("max_sampling")
        elif row.get("scenario") == f"paced {rate}":
            res["paced_rate"] = rate
            res["paced_kept_up"] = row.get("kept_up")
            res["paced_sampling"] = row.get("max_sampling")
            res["paced_lag_s"] = row.get("lag_s")
    log(f"  heat --live: max {res.get('max_events_per_s') or 0:,.0f} events/s (sampling 1/{res.get('max_sampling')}), "
        f"paced {rate:,}/s kept up: {res.get('paced_kept_up')}")
    return res


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="reader throughput on a large recording")
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    from contenders import pstate_bin

    print(json.dumps(measure(pstate_bin(), a.events, a.runs), indent=2))

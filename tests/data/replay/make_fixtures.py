"""Writes the replay test fixtures in this directory (deterministic).

Regenerate with: python tests/data/replay/make_fixtures.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0 = 5_000_000_000_000  # monotonic ns of the recording start (meta ts)
W0 = 1_764_500_000_000_000_000  # wall clock at T0: 2025-11-30T10:53:20Z
MS = 1_000_000
STATES = {"running": "R", "runnable": "R", "preempted": "R+", "new": "N", "sleeping": "S",
          "uninterruptible": "D", "stopped": "T", "traced": "t", "dead": "X", "zombie": "Z",
          "parked": "P", "idle": "I", "reaped": "-", "unknown": "?"}


def line(rec: dict) -> str:
    return json.dumps(rec, separators=(",", ":")) + "\n"


def meta(ts=T0, wall=W0, boot="4f1c6d1e-0000-4000-8000-000000000001", **extra) -> dict:
    return {"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "0.1.0",
            "host": "fixture", "kernel": "6.1.0-fixture", "boot_id": boot, "clock": "monotonic",
            "ts": ts, "wall_ns": wall, "ncpu": 4, "pstate_pid": 999, "states": STATES,
            "include_idle": False, **extra}


def state(ts, cpu, pid, tid, comm, frm, to, dur, **extra) -> dict:
    cause = {"running": "switch_in"}.get(to) or ("switch_out" if frm == "running" else "wakeup")
    return {"type": "state", "ts": ts, "cpu": cpu, "pid": pid, "tid": tid, "comm": comm, "from": frm,
            "to": to, "dur_ns": dur, "cause": cause, **extra}


def end(ts, events, lost=0, **extra) -> dict:
    return {"type": "end", "ts": ts, "reason": "duration", "events": events, "lost": lost,
            "lost_ringbuf_full": lost, "lost_map_full": 0, "lost_sampled": 0, "duration_ns": ts - T0, **extra}


def two_seconds() -> str:
    """41 events 50 ms apart: the first 250 ms after the start, the last 2 s later."""
    cycle = [("running", "sleeping"), ("sleeping", "runnable"), ("runnable", "running")]
    out = [line(meta())]
    for i in range(41):
        frm, to = cycle[i % 3]
        ts = T0 + 250 * MS + i * 50 * MS
        out.append(line(state(ts, i % 2, 100, 100, "ticker", frm, to, 50 * MS - 1000)))
        if i == 20:
            out.append(line({"type": "loss", "ts": ts + 1, "reason": "ringbuf_full", "count": 3,
                             "since_ts": T0}))
    out.append(line(end(T0 + 2300 * MS, 41, 3)))
    return "".join(out)


def mixed() -> str:
    """Many tasks, CPUs, states and durations, idle tasks, lifecycle, loss and rate records."""
    rnd = random.Random(7)
    tasks = [(100, 100, "worker"), (100, 101, "worker"), (100, 102, "worker-io"), (200, 200, "db"),
             (300, 300, "sh"), (0, 0, "swapper/1"), (400, 400, "a-very-long-nam")]
    states = ["running", "runnable", "preempted", "sleeping", "uninterruptible", "stopped", "zombie", "idle"]
    out = [line(meta(include_idle=True))]
    ts = T0 + 100 * MS
    n = 0
    for i in range(150):
        ts += 10 * MS
        pid, tid, comm = tasks[rnd.randrange(len(tasks))]
        frm, to = rnd.sample(states, 2)
        if i % 17 == 0:
            frm, dur = "unknown", None
        else:
            dur = int(10 ** rnd.uniform(3, 7.7))
        out.append(line(state(ts, rnd.randrange(4), pid, tid, comm, frm, to, dur)))
        n += 1
        if i == 30:
            out.append(line({"type": "fork", "ts": ts + 1, "cpu": 2, "pid": 100, "tid": 100, "comm": "worker",
                             "child_pid": 100, "child_tid": 103, "thread": True}))
            n += 1
        if i == 60:
            out.append(line({"type": "exec", "ts": ts + 1, "cpu": 1, "pid": 300, "tid": 300, "comm": "ls",
                             "old_tid": 300}))
            tasks[4] = (300, 300, "ls")
            n += 1
        if i == 90:
            out.append(line({"type": "exit", "ts": ts + 1, "cpu": 3, "pid": 100, "tid": 101, "comm": "worker",
                             "group_dead": False}))
            n += 1
        if i == 45:
            out.append(line({"type": "loss", "ts": ts + 2, "reason": "ringbuf_full", "count": 5,
                             "since_ts": ts - 400 * MS}))
        if i == 120:
            out.append(line({"type": "loss", "ts": ts + 2, "reason": "map_full", "count": 2,
                             "since_ts": ts - 700 * MS}))
        if i == 100:
            out.append(line({"type": "rate", "ts": ts + 3, "sample_every": 2, "events_per_s": 250000}))
    out.append(line(end(ts + 50 * MS, n, 7, lost_map_full=2)))
    return "".join(out)


def corrupt() -> str:
    """12 good events with damaged lines between them (see test_replay.py)."""
    good = [line(state(T0 + i * 10 * MS, 0, 100, 100, "ticker", "running", "sleeping", 1000)) for i in range(12)]
    bad = [
        "this is not json\n",
        '{"type":"state","ts":5000300000000,"cpu":1,\n',  # cut short
        good[0][:30] + good[1],  # a torn write: the start of one record, then another
        "[1,2,3]\n",
        '{"ts":5}\n',
        '{"type":"state","ts":"late","cpu":0,"pid":1,"tid":1,"comm":"x","from":"running","to":"sleeping","dur_ns":1}\n',
        "\n",
        '{"type":"loss","ts":5000000000001,"reason":"ringbuf_full","count":-1,"since_ts":0}\n',
    ]
    out = [line(meta())]
    for i, g in enumerate(good):
        out.append(g)
        if i < len(bad):
            out.append(bad[i])
    out.append(line(end(T0 + 200 * MS, 12)))
    return "".join(out)


def truncated() -> str:
    out = [line(meta())]
    out += [line(state(T0 + i * 10 * MS, 0, 100, 100, "ticker", "running", "sleeping", 1000)) for i in range(5)]
    cut = line(state(T0 + 50 * MS, 0, 100, 100, "ticker", "running", "sleeping", 1000))
    return "".join(out) + cut[:40]


def snapshot(seq: int, end_ts: int, interval: int = 1000 * MS) -> str:
    start = end_ts - interval
    wall_end = W0 + (end_ts - T0)
    m = {"type": "meta", "schema": 1, "source": "snap", "tool": "pstate", "version": "0.1.0", "host": "fixture",
         "kernel": "6.1.0-fixture", "boot_id": "4f1c6d1e-0000-4000-8000-000000000001", "clock": "monotonic",
         "ts": end_ts, "wall_ns": wall_end, "interval_start_ts": start, "interval_end_ts": end_ts,
         "wall_start_ns": wall_end - interval, "wall_end_ns": wall_end, "seq": seq, "mode": "delta",
         "truncated": False, "map_full": 0, "states": STATES}
    rows = []
    for pid, comm in ((100, "worker"), (200, "db")):
        row = {"type": "task", "ts": end_ts, "pid": pid, "tid": pid, "comm": comm, "start_ts": T0 - 10**9,
               "state": "sleeping", "state_since_ts": end_ts - 5 * MS, "exited": False, "exit_ts": None}
        for s in STATES:
            if s not in ("reaped",):
                row[f"{s}_ns"] = 0
        row["running_ns"] = 100 * MS * seq
        row["sleeping_ns"] = interval - 100 * MS * seq
        row.update(nvcsw=10 * seq, nivcsw=seq, wakeups=10 * seq)
        rows.append(row)
    return "".join(line(r) for r in [m, *rows, {"type": "end", "ts": end_ts, "tasks": 2, "reason": "interval"}])


def main() -> None:
    (HERE / "two_seconds.jsonl").write_text(two_seconds())
    (HERE / "mixed.jsonl").write_text(mixed())
    (HERE / "corrupt.jsonl").write_text(corrupt())
    (HERE / "truncated.jsonl").write_text(truncated())
    (HERE / "newer_schema.jsonl").write_text(line({**meta(), "schema": 2, "version": "9.0.0"})
                                             + line(state(T0 + MS, 0, 1, 1, "x", "running", "sleeping", 1)))
    snaps = HERE / "snaps"
    snaps.mkdir(exist_ok=True)
    for seq in (1, 2, 3):
        end_ts = T0 + seq * 1000 * MS
        stamp = f"20251130T1053{20 + seq:02d}.000000Z"
        (snaps / f"pstate-snap-{stamp}-{seq:06d}.jsonl").write_text(snapshot(seq, end_ts))
    # Not snapshots: a file being written (dot-file) and an unrelated one.
    (snaps / ".pstate-snap-20251130T105324.000000Z-000004.jsonl").write_text(snapshot(4, T0 + 4000 * MS))
    (snaps / "notes.txt").write_text("not a snapshot\n")


if __name__ == "__main__":
    main()

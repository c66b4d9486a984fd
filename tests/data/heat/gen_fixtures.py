"""Writes the heat map fixtures in this directory (deterministic).

    python tests/data/heat/gen_fixtures.py

small.jsonl  about one second of six threads: a CPU hog that gets preempted,
             a database thread with two D periods, two web threads, a job that
             is stopped (T) for 400 ms, and a short-lived child that exits,
             is a zombie and is reaped; one loss record.
snaps/       four cumulative snapshots 60 s apart (one pid reused).
snaps-delta/ three delta snapshots.
"""

from __future__ import annotations

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
T0 = 1_000_000_000_000  # mono ns at the start of the recording
WALL0 = 1_735_732_800_000_000_000  # 2025-01-01 12:00:00 UTC
MS = 1_000_000

META = {"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "0.1.0",
        "host": "fixture", "kernel": "6.1.0", "boot_id": "00000000-0000-0000-0000-000000000000",
        "clock": "monotonic", "ts": T0, "wall_ns": WALL0, "ncpu": 2,
        "states": {"running": "R"}, "include_idle": False}


def cause(frm: str, to: str) -> str:
    if to == "running":
        return "switch_in"
    if frm == "running":
        return "switch_out"
    if to == "reaped":
        return "reap"
    if frm == "new":
        return "wakeup_new"
    return "wakeup"


def task(pid, tid, comm, segments, start=0.0, first_known=False):
    """segments: [(state, ms)], the last one open. Returns state records."""
    out = []
    t = T0 + int(start * MS)
    for i in range(len(segments) - 1):
        frm, ms = segments[i]
        to = segments[i + 1][0]
        dur = int(ms * MS)
        t += dur
        rec = {"type": "state", "ts": t, "cpu": tid % 2, "pid": pid, "tid": tid, "comm": comm,
               "from": frm, "to": to, "dur_ns": dur if (i > 0 or first_known) else None,
               "cause": cause(frm, to)}
        if frm == "running":
            rec.update({"voluntary": to != "preempted",
                        "kstate": {"preempted": "R+", "sleeping": "S", "uninterruptible": "D",
                                   "stopped": "T", "zombie": "Z"}.get(to, "R"), "prio": 120, "next_tid": 0})
        out.append(rec)
    return out


def small() -> list[dict]:
    recs = []
    hog = [("running", 20)] + [("preempted", 4), ("running", 36)] * 24 + [("running", 0)]
    recs += task(100, 101, "worker", hog)
    db = [("sleeping", 100), ("runnable", 0.05), ("running", 10), ("uninterruptible", 300),
          ("runnable", 0.2), ("running", 5), ("sleeping", 200), ("runnable", 0.1), ("running", 30),
          ("uninterruptible", 150), ("runnable", 0.05), ("running", 50), ("sleeping", 0)]
    recs += task(200, 201, "db", db)
    for tid, off in ((301, 0), (302, 15)):
        web = [("sleeping", 30 + off)]
        for i in range(28):
            web += [("runnable", 2 + (i % 5) * 0.5), ("running", 3)]
            web += [("sleeping", 28 - (i % 3))]
        recs += task(300, tid, "web", web)
    job = [("running", 100), ("preempted", 10), ("running", 90), ("stopped", 400), ("runnable", 1),
           ("running", 100), ("sleeping", 0)]
    recs += task(400, 401, "job", job)
    child = [("new", 0.5), ("runnable", 0.3), ("running", 30), ("zombie", 50), ("reaped", 0)]
    recs += task(501, 501, "sh", child, start=600, first_known=True)
    recs.append({"type": "fork", "ts": T0 + 600 * MS, "cpu": 1, "pid": 400, "tid": 401, "comm": "job",
                 "child_pid": 501, "child_tid": 501, "thread": False})
    recs.append({"type": "exec", "ts": T0 + 601 * MS, "cpu": 1, "pid": 501, "tid": 501, "comm": "sh",
                 "old_tid": 501})
    recs.append({"type": "exit", "ts": T0 + int(630.8 * MS), "cpu": 1, "pid": 501, "tid": 501, "comm": "sh",
                 "group_dead": True})
    recs.sort(key=lambda r: (r["ts"], r["tid"]))
    end_ts = T0 + 1000 * MS
    recs = [r for r in recs if r["ts"] <= end_ts]
    mid = len(recs) // 2
    recs.insert(mid, {"type": "loss", "ts": recs[mid]["ts"], "reason": "ringbuf_full", "count": 3,
                      "since_ts": T0})
    n = sum(1 for r in recs if r["type"] in ("state", "fork", "exec", "exit"))
    return [META] + recs + [{"type": "end", "ts": end_ts, "reason": "duration", "events": n, "lost": 3,
                             "lost_ringbuf_full": 3, "lost_map_full": 0, "lost_sampled": 0,
                             "duration_ns": end_ts - T0}]


STATE_KEYS = ("running", "runnable", "preempted", "sleeping", "uninterruptible", "stopped", "traced",
              "zombie", "dead", "parked", "idle", "new", "unknown")


def snap_row(ts, pid, tid, comm, start_ts, state, **ns):
    row = {"type": "task", "ts": ts, "pid": pid, "tid": tid, "comm": comm, "start_ts": start_ts,
           "state": state, "state_since_ts": None, "exited": False, "exit_ts": None}
    for k in STATE_KEYS:
        row[f"{k}_ns"] = int(ns.get(k, 0))
    row.update({"nvcsw": 0, "nivcsw": 0, "wakeups": 0})
    return row


def write_snaps(dirname: str, mode: str, count: int) -> None:
    d = os.path.join(HERE, dirname)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.unlink(os.path.join(d, f))
    interval = 60_000 * MS
    s0 = T0
    sums: dict = {}
    for i in range(count):
        a = s0 + i * interval if mode == "delta" else s0
        b = s0 + (i + 1) * interval
        span = b - a
        def row(pid, tid, comm, state, **ns):
            """A thread's times this interval; cumulative files hold running sums."""
            if mode == "cumulative":
                acc = sums.setdefault((pid, tid), {})
                for k2, v in ns.items():
                    acc[k2] = acc.get(k2, 0) + v
                ns = dict(acc)
            return snap_row(b, pid, tid, comm, s0, state, **ns)

        rows = [
            row(10, 10, "nginx", "sleeping", running=6000 * MS * (1 + i % 2), runnable=300 * MS,
                sleeping=53700 * MS - 6000 * MS * (i % 2)),
            row(10, 11, "nginx", "running", running=20000 * MS, runnable=1000 * MS, sleeping=39000 * MS),
            row(20, 20, "postgres", "uninterruptible", running=3000 * MS,
                uninterruptible=(5000 + 15000 * (i == 2)) * MS, sleeping=(52000 - 15000 * (i == 2)) * MS),
            row(30, 30, "backup", "running", running=45000 * MS, runnable=5000 * MS,
                uninterruptible=10000 * MS),
        ]
        if mode == "cumulative":
            # pid 40 reused: the first process lives in snapshots 0-1, a new one from 2 on
            if i < 2:
                rows.append(row(40, 40, "cron", "sleeping", running=1000 * MS, sleeping=59000 * MS))
            else:
                st = s0 + 2 * interval + 10_000 * MS
                life = b - st
                rows.append(snap_row(b, 40, 40, "rsync", st, "running", running=life // 2,
                                     uninterruptible=life // 2))
            a_meta = s0 + i * interval
        else:
            a_meta = a
        meta = {"type": "meta", "schema": 1, "source": "snap", "tool": "pstate", "version": "0.1.0",
                "host": "fixture", "kernel": "6.1.0", "boot_id": "00000000-0000-0000-0000-000000000000",
                "clock": "monotonic", "ts": b, "wall_ns": WALL0 + (b - T0),
                "interval_start_ts": a_meta if mode == "delta" else s0, "interval_end_ts": b,
                "wall_start_ns": WALL0 + (a_meta - T0), "wall_end_ns": WALL0 + (b - T0), "seq": i,
                "mode": mode, "truncated": False, "map_full": 0, "states": {"running": "R"}}
        assert all(sum(r[f"{k}_ns"] for k in STATE_KEYS) <= (span if mode == "delta" else b - s0)
                   for r in rows if r["start_ts"] == s0)
        name = f"pstate-snap-20250101T12{i:02d}00.000000Z-{i:06d}.jsonl"
        with open(os.path.join(d, name), "w") as f:
            for r in [meta] + rows + [{"type": "end", "ts": b, "tasks": len(rows), "reason": "interval"}]:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
    with open(os.path.join(d, "README.not-a-snapshot"), "w") as f:
        f.write("ignored: not a snapshot file name\n")


def main() -> None:
    with open(os.path.join(HERE, "small.jsonl"), "w") as f:
        for r in small():
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
    write_snaps("snaps", "cumulative", 4)
    write_snaps("snaps-delta", "delta", 3)


if __name__ == "__main__":
    main()

"""Build the snapshot series in tests/data/snap/series/ with the real renderer.

    PSTATE_REGEN=1 pytest tests/contract/test_snap_stats.py   rewrites them (and the goldens)

The story, with every truth known:
boot A, run 1 (cumulative; snapshots at monotonic 110, 120, 130, 140, 150 s,
run started at 100 s):
  pid 100 "leaky"    starts two sleeping threads per interval and never ends them
  pid 200 "hog"      on the CPU all the time, 1 % of it stolen or in interrupts
  pid 300 "dbwriter" in D for 10%, 20%, ... 50% of successive intervals
  pid 400-402 "sh"   born and reaped inside the 2nd interval (short-lived)
  pid 500 "job"      born at 122 s, exits at 135 s; pid 500 is reused at 137 s
                     by "job2" (pid reuse: two processes)
  pid 600 "steady"   two threads sleeping all the time
boot A, run 2 (--clear; monotonic 200-210 and 210-220 s), after the wall
clock was set back one hour: names and wall times go backwards, monotonic
time does not. pid 600's start time differs by 5 ms from run 1 (seeded from
/proc's clock ticks in one run): still the same process.
boot B, run 3: one snapshot after a reboot; pid 200 is another process there.
"""

from __future__ import annotations

import os
import sys

from pstate.snapshots import snapdir
from pstate.snapshots.writer import render_jsonl

S = 1_000_000_000
BOOT_A = "aaaaaaaa-0000-4000-8000-000000000001"
BOOT_B = "bbbbbbbb-0000-4000-8000-000000000002"
WALL_A = 1_800_000_000 * S  # wall time at monotonic 0 in boot A
STATES = {"running": "R", "runnable": "R", "preempted": "R+", "new": "N", "sleeping": "S",
          "uninterruptible": "D", "stopped": "T", "traced": "t", "dead": "X", "zombie": "Z", "parked": "P",
          "idle": "I", "reaped": "-", "unknown": "?"}


def row(end, pid, tid, comm, start, state="sleeping", exited=False, exit_ts=None, **ns):
    r = {"type": "task", "ts": end, "pid": pid, "tid": tid, "comm": comm, "start_ts": start, "state": state,
         "state_since_ts": ns.pop("since", start), "exited": exited, "exit_ts": exit_ts}
    for s in snapdir.STATE_FIELDS:
        r[f"{s}_ns"] = int(ns.get(s, 0))
    r[snapdir.STEAL_FIELD] = int(ns.get("steal", 0))
    r.update(nvcsw=int(ns.get("nvcsw", 0)), nivcsw=int(ns.get("nivcsw", 0)), wakeups=int(ns.get("wakeups", 0)))
    path = CGROUPS.get(comm)
    r.update(title=f"{comm}: worker", cgroup=(sorted(set(CGROUPS.values())).index(path) + 10) if path else None,
             cgroup_path=path, ppid=None)
    return r


# Where each program runs (--by cgroup, unit, container): two services, one
# container, one login session
DOCKER_ID = "c0ffee" + "0" * 58
CGROUPS = {"hog": "/system.slice/hog.service", "dbwriter": "/system.slice/db.service",
           "steady": "/system.slice/db.service", "leaky": f"/system.slice/docker-{DOCKER_ID}.scope",
           "sh": "/user.slice/user-0.slice/session-1.scope", "job": "/system.slice/cron.service",
           "job2": "/system.slice/cron.service"}


def meta(boot, run, seq, start, end, wall0, mode, host="fixture"):
    return {"type": "meta", "schema": 1, "source": "snap", "tool": "pstate", "version": "0.1.0", "host": host,
            "kernel": "6.1.0-test", "boot_id": boot, "clock": "monotonic", "ts": end, "wall_ns": wall0 + end,
            "ncpu": 2, "pstate_pid": 4242, "states": STATES, "max_tasks": 65536, "interval_ns": 10 * S,
            "format": "jsonl", "interval_start_ts": start, "interval_end_ts": end,
            "wall_start_ns": wall0 + start, "wall_end_ns": wall0 + end, "mode": mode, "truncated": False,
            "map_full": 0, "read_ns": 0, "run_id": run,
            "run_start_ts": start if mode == "cumulative" else 200 * S, "seq": seq}


def leaky_birth(j: int) -> int:
    """Thread 101 + j of "leaky": two per 10 s interval from 100 s on."""
    return 100 * S + (j // 2) * 10 * S + (2 + 2 * (j % 2)) * S


def run1():
    """Cumulative rows since 100 s, at each end time."""
    t0 = 100 * S
    snaps = []
    for k, end in enumerate((110 * S, 120 * S, 130 * S, 140 * S, 150 * S), start=1):
        el = end - t0
        rows = [row(end, 100, 100, "leaky", 50 * S, sleeping=el)]
        for j in range(2 * k):  # two new threads per interval, born 2 s and 4 s into it
            born = leaky_birth(j)
            rows.append(row(end, 100, 101 + j, "leaky", born, sleeping=end - born))
        rows.append(row(end, 200, 200, "hog", 20 * S, state="running", running=el, steal=el // 100,
                        nivcsw=el // S))
        d = sum(0.1 * i * 10 * S for i in range(1, k + 1))
        rows.append(row(end, 300, 300, "dbwriter", 30 * S, uninterruptible=d, sleeping=el - d, nvcsw=k * 5))
        if k == 2:
            for i, pid in enumerate((400, 401, 402)):
                b = 112 * S + i * S
                rows.append(row(end, pid, pid, "sh", b, state="reaped", exited=True, exit_ts=b + S // 2,
                                since=b + S // 2 + 1000, running=S // 4, sleeping=S // 4))
        if k >= 3:
            b = 122 * S
            if k == 3:
                rows.append(row(end, 500, 500, "job", b, state="running", running=end - b))
            elif k == 4:
                rows.append(row(end, 500, 500, "job", b, state="reaped", exited=True, exit_ts=135 * S,
                                since=136 * S, running=13 * S, zombie=S))
            b2 = 137 * S
            if k >= 4:
                rows.append(row(end, 500, 500, "job2", b2, running=(end - b2) // 2, sleeping=(end - b2) // 2))
        for tid in (600, 601):
            rows.append(row(end, 600, tid, "steady", 60 * S, sleeping=el, wakeups=k))
        rows.sort(key=lambda r: (r["pid"], r["tid"], r["start_ts"]))
        snaps.append((meta(BOOT_A, "run-1", k, t0, end, WALL_A, "cumulative"), rows))
    return snaps


def run2():
    """--clear: deltas over 200-210 s and 210-220 s; the wall clock went back 1 h."""
    wall0 = WALL_A - 3600 * S
    snaps = []
    prev = 200 * S
    for k, end in enumerate((210 * S, 220 * S), start=6):
        el = end - prev
        rows = [row(end, 100, 100, "leaky", 50 * S, sleeping=el)]
        rows += [row(end, 100, 101 + j, "leaky", leaky_birth(j), sleeping=el) for j in range(10)]
        rows.append(row(end, 200, 200, "hog", 20 * S, state="running", running=el))
        rows.append(row(end, 300, 300, "dbwriter", 30 * S, sleeping=el))
        for tid in (600, 601):
            rows.append(row(end, 600, tid, "steady", 60 * S + 5_000_000, sleeping=el))
        snaps.append((meta(BOOT_A, "run-2", k, prev, end, wall0, "delta"), rows))
        prev = end
    return snaps


def run3():
    wall0 = WALL_A + 7200 * S
    end = 15 * S
    rows = [row(end, 200, 200, "hog", 1 * S, state="running", running=10 * S)]
    return [(meta(BOOT_B, "run-3", 8, 5 * S, end, wall0, "cumulative"), rows)]


def generate(out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    names = []
    for m, rows in run1() + run2() + run3():
        end = {"type": "end", "ts": m["ts"], "tasks": len(rows), "reason": "interval"}
        name = snapdir.snapshot_name(m["wall_end_ns"], m["seq"], "jsonl")
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(render_jsonl(m, rows, end))
        names.append(name)
    return names


if __name__ == "__main__":
    generate(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "series"))

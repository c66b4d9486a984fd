"""Writes the small hand-made streams that the stats tests read.

Run from anywhere: python tests/data/stats/stats_fixtures.py
The timeline of each task is spelled out below so the expected numbers can
be worked out by hand (window: 1 s from the meta record to the end record).
"""

from __future__ import annotations

from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
T0 = 1_000_000_000  # meta ts
MS = 1_000_000
US = 1_000
WALL = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z

META = {"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "0.1.0",
        "host": "fixture", "kernel": "6.1.0", "boot_id": "00000000-0000-0000-0000-000000000000",
        "clock": "monotonic", "ts": T0, "wall_ns": WALL, "ncpu": 2, "include_idle": False}


class Task:
    def __init__(self, out, pid, tid, comm, state, since=None, cpu=0):
        self.out, self.pid, self.tid, self.comm = out, pid, tid, comm
        self.state, self.since, self.cpu = state, since, cpu

    def go(self, at, to, cause, **extra):
        ts = T0 + at
        rec = {"type": "state", "ts": ts, "cpu": self.cpu, "pid": self.pid, "tid": self.tid,
               "comm": self.comm, "from": self.state, "to": to,
               "dur_ns": None if self.since is None else ts - self.since, "cause": cause}
        if cause == "switch_out":
            rec.update(prio=120, voluntary=to != "preempted", kstate=extra.pop("kstate", "S"), next_tid=0)
        elif cause == "switch_in":
            rec.update(prio=120, prev_tid=0)
        elif cause == "wakeup":
            rec.update(waker_tid=1, waker_pid=1)
        rec.update(extra)
        self.out.append(rec)
        self.state, self.since = to, ts

    def life(self, at, kind, **fields):
        self.out.append({"type": kind, "ts": T0 + at, "cpu": self.cpu, "pid": self.pid, "tid": self.tid,
                         "comm": self.comm, **fields})


def basic() -> list[dict]:
    ev: list[dict] = []
    # server (pid 100), main thread: asleep when the recording starts.
    s = Task(ev, 100, 100, "server", "sleeping")
    s.go(100 * MS, "runnable", "wakeup")
    s.go(100 * MS + 50 * US, "running", "switch_in")
    s.go(130 * MS, "preempted", "switch_out", kstate="R+")
    s.go(131 * MS, "running", "switch_in")
    s.go(200 * MS, "sleeping", "switch_out")
    s.go(400 * MS, "runnable", "wakeup")
    s.go(400 * MS + 20 * US, "running", "switch_in")
    s.go(600 * MS, "uninterruptible", "switch_out", kstate="D")
    s.go(650 * MS, "runnable", "wakeup")
    s.go(650 * MS + 100 * US, "running", "switch_in")  # then runs to the end
    # server, second thread: running when the recording starts, then mostly asleep.
    t = Task(ev, 100, 101, "server", "running", cpu=1)
    t.go(50 * MS, "sleeping", "switch_out")
    t.go(550 * MS, "runnable", "wakeup")
    t.go(550 * MS + 500 * US, "running", "switch_in")
    t.go(560 * MS, "sleeping", "switch_out")
    # worker (pid 200) forks a child that execs sleep, exits and is reaped.
    w = Task(ev, 200, 200, "worker", "runnable", cpu=1)
    w.go(10 * MS, "running", "switch_in")
    w.life(300 * MS, "fork", child_pid=201, child_tid=201, thread=False)
    w.go(310 * MS, "sleeping", "switch_out")
    w.go(700 * MS, "runnable", "wakeup")
    w.go(700 * MS + 200 * US, "running", "switch_in")
    w.go(800 * MS, "preempted", "switch_out", kstate="R+")
    w.go(800 * MS + 500 * US, "running", "switch_in")
    c = Task(ev, 201, 201, "worker", "new", since=T0 + 300 * MS, cpu=0)
    c.go(300 * MS + 10 * US, "runnable", "wakeup_new")
    c.go(300 * MS + 20 * US, "running", "switch_in")
    c.comm = "sleep"  # an exec record carries the new name
    c.life(301 * MS, "exec", old_tid=201)
    c.go(302 * MS, "sleeping", "switch_out")
    c.go(402 * MS, "runnable", "wakeup")
    c.go(402 * MS + 10 * US, "running", "switch_in")
    c.life(403 * MS, "exit", group_dead=True)
    c.go(403 * MS + 10 * US, "zombie", "switch_out", kstate="Z")
    c.go(450 * MS, "reaped", "reap")
    # stopper (pid 300): stopped by SIGSTOP for 300 ms, continued, asleep.
    p = Task(ev, 300, 300, "stopper", "running", cpu=0)
    p.go(200 * MS, "stopped", "switch_out", kstate="T")
    p.go(500 * MS, "runnable", "wakeup")
    p.go(500 * MS + 100 * US, "running", "switch_in")
    p.go(510 * MS, "sleeping", "switch_out")
    ev.sort(key=lambda r: r["ts"])
    end = {"type": "end", "ts": T0 + 1000 * MS, "reason": "signal", "events": len(ev), "lost": 0,
           "lost_ringbuf_full": 0, "lost_map_full": 0, "lost_sampled": 0, "duration_ns": 1000 * MS}
    return [META] + ev + [end]


def dumps(recs) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in recs)


def lossy() -> bytes:
    """basic, with 5 events lost, bad lines and a truncated last record."""
    recs = basic()
    lines = [orjson.dumps(r) for r in recs[:-1]]
    lines.insert(10, orjson.dumps({"type": "loss", "ts": T0 + 300 * MS, "reason": "ringbuf_full",
                                   "count": 5, "since_ts": T0}))
    lines.insert(5, b"this is not json")
    lines.insert(7, b'{"type":"state","ts":1,"cpu":0,"pid":1,"tid":"x","from":"running","to":"sleeping"}')
    lines.insert(12, b"")
    return b"\n".join(lines) + b'\n{"type":"state","ts":12'


def newer() -> bytes:
    return orjson.dumps({**META, "schema": 99, "version": "9.0"}) + b"\n"


def state_d() -> list[dict]:
    """What `record --state D` keeps of a dd: only its transitions into and
    out of D (10 x: 2 ms on the CPU, then 5 ms in D), none of its time on a
    run queue or asleep. Its ledger is not complete: no time in state."""
    ev: list[dict] = [{**META, "filter_state": ["uninterruptible"]}]
    for i in range(10):
        at = T0 + 10 * MS + i * 90 * MS
        base = {"type": "state", "cpu": 0, "pid": 500, "tid": 500, "comm": "dd"}
        ev.append({**base, "ts": at, "from": "running", "to": "uninterruptible", "dur_ns": 2 * MS,
                   "cause": "switch_out", "prio": 120, "voluntary": True, "kstate": "D", "next_tid": 0})
        ev.append({**base, "ts": at + 5 * MS, "from": "uninterruptible", "to": "runnable", "dur_ns": 5 * MS,
                   "cause": "wakeup", "waker_tid": 0, "waker_pid": 0})
    ev.append({"type": "end", "ts": T0 + 1000 * MS, "reason": "signal", "events": 20, "lost": 0})
    return ev


def impossible() -> list[dict]:
    """Three threads of an agent (pid 700) that are switched in again and
    again without a switch-out between (running -> running, as a VM's agent
    threads show): each on a CPU for the whole second, 3 s of on-CPU time on
    2 CPUs. A plain sleeper beside them (pid 800), and a task whose records
    disagree with their own timestamps (tid 900: 50 ms of its 1 s missing)."""
    ev: list[dict] = []
    threads = [Task(ev, 700, tid, "agent", "runnable", cpu=tid % 2) for tid in (700, 701, 702)]
    for t in threads:
        t.go(10 * MS, "running", "switch_in")
    for k in range(1, 10):
        for t in threads:
            t.go(k * 100 * MS, "running", "switch_in")
    s = Task(ev, 800, 800, "sleeper", "sleeping")
    s.go(300 * MS, "runnable", "wakeup")
    s.go(301 * MS, "running", "switch_in")
    s.go(302 * MS, "sleeping", "switch_out")
    liar = Task(ev, 900, 900, "liar", "sleeping")
    liar.go(500 * MS, "runnable", "wakeup")
    liar.go(600 * MS, "running", "switch_in")
    ev[-1]["dur_ns"] = 50 * MS  # the record says 50 ms; its timestamps say 100 ms
    ev.sort(key=lambda r: r["ts"])
    return [META, *ev, {"type": "end", "ts": T0 + 1000 * MS, "reason": "signal", "events": len(ev), "lost": 0}]


def main() -> None:
    (HERE / "state-d.jsonl").write_bytes(dumps(state_d()))
    (HERE / "impossible.jsonl").write_bytes(dumps(impossible()))
    (HERE / "basic.jsonl").write_bytes(dumps(basic()))
    (HERE / "lossy.jsonl").write_bytes(lossy())
    (HERE / "newer.jsonl").write_bytes(newer())


if __name__ == "__main__":
    main()

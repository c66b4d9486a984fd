"""Writes why.jsonl: a recording made with record --stacks whose causes are
known by construction, for stats --stacks, --wakers, --antagonists and
--by reason (tests/contract/test_why.py).

- dd (pid 100) on CPU 0: 8 direct writes, each 1 ms in D (the last one 2
  ms): 6 with stack 1 (reason __iomap_dio_rw), 2 with stack 2
  (submit_bio_wait, under blkdev_issue_flush); woken by an irq; 10 us on the run queue after.
- ping (200) and pong (201) on CPU 2 wake each other through S, 6 rounds.
- hog (300) and hog2 (301) on CPU 1 preempt each other every 4 ms, 6 times.
- sleeper (400) on CPU 2 sleeps 5 ms, 3 times, woken by a softirq; still
  asleep at the end (stack 3, nanosleep) for 1 ms.

why-services.jsonl is the same recording as the services it belongs to
name it (SERVICES): each process's cgroup and process record first, and
the cgroup on the state records of dd and the hogs (as the tp_btf path
writes it; the others' by their process records), for every --by key.

Run: python tests/data/stats/why_fixtures.py
"""

from __future__ import annotations

from pathlib import Path

import orjson

US = 1000
MS = 1000 * US
T0 = 1_000_000_000

STACKS = {
    1: "entry_SYSCALL_64_after_hwframe+0x76;do_syscall_64+0x82;ksys_pwrite64+0x8a;vfs_write+0x1e0;"
       "ext4_file_write_iter+0x3c5;iomap_dio_rw+0x12;__iomap_dio_rw+0x4d2;io_schedule+0x46;schedule+0x27;"
       "__schedule+0x3b1",
    2: "entry_SYSCALL_64_after_hwframe+0x76;do_syscall_64+0x82;__x64_sys_fsync+0x3b;ext4_sync_file+0x1bd;"
       "blkdev_issue_flush+0x52;submit_bio_wait+0x5c;wait_for_completion_io+0x1b;io_schedule_timeout+0x1a;"
       "schedule+0x27;__schedule+0x3b1",
    3: "entry_SYSCALL_64_after_hwframe+0x76;do_syscall_64+0x82;__x64_sys_clock_nanosleep+0xc6;"
       "common_nsleep+0x44;hrtimer_nanosleep+0xb6;do_nanosleep+0x66;schedule+0x27;__schedule+0x3b1",
}
REASONS = {1: "__iomap_dio_rw", 2: "submit_bio_wait", 3: "do_nanosleep"}
CONTAINER = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
CGROUPS = {11: "/system.slice/db.service", 12: "/system.slice/pp.service",
           13: "/user.slice/user-0.slice/session-1.scope", 14: f"/system.slice/docker-{CONTAINER}.scope"}
# pid -> (cgroup id, title, ppid); ping and pong are two backends of one role
SERVICES = {
    100: (11, "postgres: 15/main: checkpointer", 1),
    200: (12, "postgres: 15/main: app shop 10.0.0.7(40112) idle", 50),
    201: (12, "postgres: 15/main: app shop 10.0.0.9(40118) UPDATE waiting", 50),
    300: (13, "hog --spin", 60),
    301: (13, "hog2 --spin", 60),
    400: (14, "sleeper", 1),
}
OWN_CGROUP = (100, 300, 301)  # pids whose state records carry their cgroup


def main() -> None:
    ev = []  # (ts, seq, record)

    def state(ts, cpu, pid, tid, comm, frm, to, dur, cause, **extra):
        rec = {"type": "state", "ts": ts, "cpu": cpu, "pid": pid, "tid": tid, "comm": comm, "from": frm,
               "to": to, "dur_ns": dur, "cause": cause, **extra}
        ev.append((ts, len(ev), rec))

    # dd on CPU 0
    t = T0 + 1 * MS
    state(t, 0, 100, 100, "dd", "runnable", "running", None, "switch_in", prio=120, prev_tid=0)
    for i in range(8):
        sid = 2 if i in (3, 6) else 1
        d = 2 * MS if i == 7 else 1 * MS
        t += 50 * US
        state(t, 0, 100, 100, "dd", "running", "uninterruptible", 50 * US, "switch_out", prio=120,
              voluntary=True, kstate="D", next_tid=0)
        t += d
        state(t, 0, 100, 100, "dd", "uninterruptible", "runnable", d, "wakeup", waker_tid=0, waker_pid=0,
              target_cpu=0, waker="irq", stack_id=sid, reason=REASONS[sid])
        t += 10 * US
        state(t, 0, 100, 100, "dd", "runnable", "running", 10 * US, "switch_in", prio=120, prev_tid=0)

    # ping and pong on CPU 2
    t = T0 + 1 * MS
    state(t, 2, 200, 200, "ping", "runnable", "running", None, "switch_in", prio=120, prev_tid=0)
    state(t, 2, 201, 201, "pong", "running", "sleeping", None, "switch_out", prio=120, voluntary=True,
          kstate="S", next_tid=200)
    run, wake = (200, "ping"), (201, "pong")
    since = {200: t, 201: t}
    for _ in range(12):
        t += 20 * US
        (rt, rc), (wt, wc) = run, wake
        state(t, 2, wt, wt, wc, "sleeping", "runnable", t - since[wt], "wakeup", waker_tid=rt, waker_pid=rt,
              target_cpu=2)
        woke = t
        t += 2 * US
        state(t, 2, rt, rt, rc, "running", "sleeping", t - since[rt], "switch_out", prio=120, voluntary=True,
              kstate="S", next_tid=wt)
        since[rt] = t
        t += 3 * US
        state(t, 2, wt, wt, wc, "runnable", "running", t - woke, "switch_in", prio=120, prev_tid=rt)
        since[wt] = t
        run, wake = wake, run

    # hogs on CPU 1
    t = T0 + 1 * MS
    state(t, 1, 300, 300, "hog", "runnable", "running", None, "switch_in", prio=120, prev_tid=0)
    state(t, 1, 301, 301, "hog2", "running", "preempted", None, "switch_out", prio=120, voluntary=False,
          kstate="R+", next_tid=300)
    run, wait = (300, "hog"), (301, "hog2")
    for i in range(6):
        t += 4 * MS
        (rt, rc), (wt, wc) = run, wait
        state(t, 1, rt, rt, rc, "running", "preempted", 4 * MS, "switch_out", prio=120, voluntary=False,
              kstate="R+", next_tid=wt)
        state(t, 1, wt, wt, wc, "preempted", "running", 4 * MS if i else None, "switch_in", prio=120,
              prev_tid=rt)
        run, wait = wait, run

    # the sleeper on CPU 2 (between pings)
    t = T0 + 2 * MS
    state(t, 2, 400, 400, "sleeper", "running", "sleeping", None, "switch_out", prio=120, voluntary=True,
          kstate="S", next_tid=0)
    for _ in range(3):
        t += 5 * MS
        state(t, 2, 400, 400, "sleeper", "sleeping", "runnable", 5 * MS, "wakeup", waker_tid=0, waker_pid=0,
              target_cpu=2, waker="softirq", stack_id=3, reason=REASONS[3])
        t += 1 * US
        state(t, 2, 400, 400, "sleeper", "runnable", "running", 1 * US, "switch_in", prio=120, prev_tid=0)
        t += 4 * US
        state(t, 2, 400, 400, "sleeper", "running", "sleeping", 4 * US, "switch_out", prio=120, voluntary=True,
              kstate="S", next_tid=0)
    end = t + 1 * MS

    ev.sort(key=lambda e: (e[0], e[1]))
    lines = [{"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "0.1.0",
              "host": "fixture", "kernel": "6.18.0", "boot_id": "00000000-0000-0000-0000-000000000000",
              "clock": "monotonic", "ts": T0, "wall_ns": 1767225600000000000, "ncpu": 3,
              "include_idle": False}]
    defined = set()
    for _ts, _seq, rec in ev:
        sid = rec.get("stack_id")
        if sid is not None and sid not in defined:
            defined.add(sid)
            lines.append({"type": "stack", "ts": rec["ts"], "stack_id": sid, "frames": STACKS[sid]})
        lines.append(rec)
    n = sum(1 for x in lines if x["type"] == "state")
    lines.append({"type": "end", "ts": end, "reason": "duration", "events": n, "lost": 0,
                  "lost_ringbuf_full": 0, "lost_map_full": 0, "lost_sampled": 0, "lost_unread": 0,
                  "duration_ns": end - T0, "stack_failed": 0, "stack_lost": 0})
    here = Path(__file__).resolve().parent
    (here / "why.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    ids = [{"type": "cgroup", "ts": T0, "cgroup": cg, "path": path, "gone": False} for cg, path in CGROUPS.items()]
    comms = {r["pid"]: r["comm"] for r in lines if r["type"] == "state"}
    ids += [{"type": "process", "ts": T0, "pid": pid, "comm": comms[pid], "title": title, "exe": "/usr/bin/x",
             "ppid": ppid, "cgroup": cg, "gone": False, "why": "first"}
            for pid, (cg, title, ppid) in SERVICES.items()]
    svc = [lines[0]] + ids
    for x in lines[1:]:
        if x["type"] == "state" and x["pid"] in OWN_CGROUP:
            x = {**x, "cgroup": SERVICES[x["pid"]][0]}
        svc.append(x)
    (here / "why-services.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in svc))


if __name__ == "__main__":
    main()

"""The native why-views (the Digester's set_why sums) against the careful
path's, on generated recordings that mix everything the two read apart:
plain state lines and lines the careful path takes (an escaped comm, a
stack_id and reason, a float, a huge cpu) between them, wakers of every
kind, filtered-out tasks' slice records, process and cgroup records that
move a task to another service mid-stream, and records without dur_ns.
Every --by key with every view, with and without a filter: the same
report, byte for byte."""

from __future__ import annotations

import json
import random

import orjson
import pytest
from click.testing import CliRunner

from pstate.analysis import timeinstate
from pstate.commands.stats import WHY_VIEWS
from pstate.main import cli
from pstate.analysis import causes

NATIVE = causes._digest is not None
US = 1000
T0 = 1_000_000_000
CGROUPS = {21: "/system.slice/a.service", 22: "/system.slice/b.service", 23: "/user.slice/user-0.slice/s-1.scope"}
# pid -> (threads, comm, cgroup id, title)
PROCS = {
    500: (3, "db", 21, "postgres: 15/main: app shop 10.0.0.7 idle"),
    510: (2, "db", 21, "postgres: 15/main: app shop 10.0.0.9 UPDATE waiting"),
    520: (2, "web", 22, "nginx: worker process"),
    530: (1, "k\u00e9", 23, "odd"),  # (an escaped comm: its lines are the careful path's)
    540: (2, "hog", 23, "hog --spin"),
}
STACK = "entry_SYSCALL_64+0x1;do_syscall_64+0x2;vfs_fsync+0x3;submit_bio_wait+0x4;io_schedule+0x5;schedule+0x6"


def recording(seed: int, n: int = 2500) -> bytes:
    """A recording whose CPUs each run one task at a time (NCPU CPUs, a
    run queue per CPU), every kind of waker, and the odd lines."""
    rnd = random.Random(seed)
    ncpu = 3
    out = [{"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "t", "host": "h",
            "kernel": "6.1.0", "boot_id": "b", "clock": "monotonic", "ts": T0, "wall_ns": 0, "ncpu": ncpu,
            "include_idle": False}]
    out += [{"type": "cgroup", "ts": T0, "cgroup": cg, "path": p, "gone": False} for cg, p in CGROUPS.items()]
    out += [{"type": "process", "ts": T0, "pid": pid, "comm": comm, "title": title, "exe": "/usr/bin/x", "ppid": 1,
             "cgroup": cg, "gone": False, "why": "first"} for pid, (_n, comm, cg, title) in PROCS.items()]
    out.append({"type": "stack", "ts": T0, "stack_id": 7, "frames": STACK})
    tasks = {}  # tid -> [pid, comm, state, since, cpu]
    for pid, (nthreads, comm, _cg, _t) in PROCS.items():
        for i in range(nthreads):
            tasks[pid + i] = [pid, comm, "sleeping", None, rnd.randrange(ncpu)]
    running = {cpu: None for cpu in range(ncpu)}
    queued = {cpu: [] for cpu in range(ncpu)}
    ts = T0

    def state(tid, to, cause, **extra):
        t = tasks[tid]
        rec = {"type": "state", "ts": ts, "cpu": t[4], "pid": t[0], "tid": tid, "comm": t[1], "from": t[2],
               "to": to, "dur_ns": None if t[3] is None else ts - t[3], "cause": cause, **extra}
        if t[0] in (500, 540) and rnd.random() < 0.8:
            rec["cgroup"] = PROCS[t[0]][2]  # (as the tp_btf path writes it, for some)
        if rnd.random() < 0.01:
            rec["dur_ns"] = None
        t[2], t[3] = to, ts
        out.append(rec)

    for _ in range(n):
        ts += rnd.randrange(1, 40 * US)
        r = rnd.random()
        cpu = rnd.randrange(ncpu)
        cur = running[cpu]
        if cur is not None and r < 0.35:  # the running task leaves the CPU
            to = rnd.choice(["preempted", "sleeping", "sleeping", "uninterruptible"])
            state(cur, to, "switch_out", voluntary=to != "preempted", next_tid=0)
            running[cpu] = None
            if to == "preempted":
                queued[cpu].append(cur)
        elif cur is None and queued[cpu] and r < 0.7:  # the next on the run queue gets it
            tid = queued[cpu].pop(rnd.randrange(len(queued[cpu])))
            state(tid, "running", "switch_in", prev_tid=0)
            running[cpu] = tid
        elif r < 0.85:  # a sleeper wakes
            asleep = [tid for tid, t in tasks.items() if t[2] in ("sleeping", "uninterruptible")]
            if not asleep:
                continue
            tid = rnd.choice(asleep)
            tasks[tid][4] = rnd.randrange(ncpu)
            kind = rnd.random()
            extra = {}
            if kind < 0.5:
                w = rnd.choice(list(tasks))
                extra = {"waker_tid": w, "waker_pid": tasks[w][0]}
                if rnd.random() < 0.2:
                    del extra["waker_pid"]
            elif kind < 0.7:
                extra = {"waker_tid": 0, "waker_pid": 0, "waker": rnd.choice(["irq", "softirq"])}
            elif kind < 0.8:
                extra = {"waker_tid": 9999, "waker_pid": 9990}  # a task never seen
            if tasks[tid][2] == "uninterruptible" and rnd.random() < 0.5:
                extra.update(stack_id=7, reason="submit_bio_wait")
            state(tid, "runnable", "wakeup", **extra)
            queued[tasks[tid][4]].append(tid)
        elif r < 0.9:  # a task the recording does not follow held a CPU
            out.append({"type": "slice", "ts": ts, "cpu": cpu, "pid": 77, "tid": 77, "comm": "other",
                        "dur_ns": rnd.randrange(1, 50 * US)})
        elif r < 0.92:  # a process moves to another service, or is named anew
            pid = rnd.choice(list(PROCS))
            _n, comm, _cg, title = PROCS[pid]
            out.append({"type": "process", "ts": ts, "pid": pid, "comm": comm, "title": title + " x",
                        "exe": "/usr/bin/x", "ppid": 1, "cgroup": rnd.choice(list(CGROUPS)), "gone": False,
                        "why": "changed"})
        elif r < 0.925:
            out.append({"type": "waker", "ts": ts, "tid": 9999, "pid": 9990, "comm": "ghost"})
    lines = [orjson.dumps(rec) for rec in out]
    for i in rnd.sample(range(10, len(lines)), 5):  # a float, spaces: lines the careful path reads
        lines[i] = lines[i].replace(b'"ts":', b'"ts": ')
    return b"\n".join(lines) + b"\n"


BY = timeinstate.BY_KEYS + ("reason", r"title:^postgres: \S+ \S+ (\S+)")
FILTERS = [(), ("-p", "500"), ("-c", "db"), ("--cgroup", "a.service")]
CASES = [(by, view, filt) for by in BY for view in WHY_VIEWS for filt in FILTERS]


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    d = tmp_path_factory.mktemp("why-native")
    out = []
    for seed in (1, 2):
        p = d / f"r{seed}.jsonl"
        p.write_bytes(recording(seed))
        out.append(str(p))
    return out


def stats(path: str, *args: str) -> tuple:
    res = CliRunner().invoke(cli, ["stats", path, "--top", "50", *args], catch_exceptions=False)
    return res.exit_code, res.stdout, res.stderr


@pytest.mark.skipif(not NATIVE, reason="the native reader is not built (PSTATE_PURE=1)")
@pytest.mark.parametrize("by,view,filt", CASES, ids=[f"{b[:12]}-{v}-{'_'.join(f) or 'all'}" for b, v, f in CASES])
def test_native_and_careful_why_views_agree(recordings, by, view, filt):
    args = ["--by", by, *WHY_VIEWS[view], *filt]
    if view != "folded":
        args += ["-f", "json"]
    for path in recordings:
        fast = stats(path, *args)
        careful = stats(path, *args, "--reader", "careful")
        assert fast == careful, path
        assert fast[0] == 0, fast[2]


def test_the_recordings_hold_what_they_are_for(recordings):
    # what the comparison would miss if the generator lost it
    recs = [orjson.loads(line) for line in open(recordings[0], "rb")]
    states = [r for r in recs if r["type"] == "state"]
    assert {r.get("waker") for r in states} >= {None, "irq", "softirq"}
    assert any(r.get("stack_id") for r in states) and any(r["type"] == "slice" for r in recs)
    assert any(r["type"] == "process" and r["why"] == "changed" for r in recs)
    assert any(r["from"] == "preempted" and r["to"] == "running" for r in states)
    assert any(r["comm"] == "k\u00e9" for r in states)
    json = orjson.loads(stats(recordings[0], "--antagonists", "--wakers", "-f", "json")[1])
    assert any(a["tid"] for g in json["groups"] for a in g["antagonists"])
    assert any(w["kind"] == "task" and w["pid"] for g in json["groups"] for w in g["wakers"])


@pytest.mark.skipif(not NATIVE, reason="the native reader is not built (PSTATE_PURE=1)")
def test_a_fold_comes_between_a_take_and_the_next_read():
    # the antagonists of a take's sums wait for why_fold; a read before it is refused, and a take
    # after an interrupted one (no fold came) drops them rather than give them to the wrong groups
    agg = timeinstate.Aggregator("pid")
    found = causes.Causes("pid", antagonists=True)
    dig = causes._digest.Digester("pid", agg.state_id, agg.comm_id)
    dig.set_why(found.select, False, causes.SLICES_PER_CPU, False, False)
    lines = [{"type": "state", "ts": T0 + 10, "cpu": 0, "pid": 1, "tid": 1, "comm": "a", "from": "running",
              "to": "preempted", "dur_ns": 10},
             {"type": "state", "ts": T0 + 20, "cpu": 0, "pid": 2, "tid": 2, "comm": "b", "from": "preempted",
              "to": "running", "dur_ns": 15}]
    buf = b"\n".join(orjson.dumps(x) for x in lines) + b"\n"
    assert dig.digest(buf, 0, len(buf) - 1, 1 << 20)[1] == 2
    sums, _last, _names = dig.take_why()
    assert [s[4] for s in sums] == [causes.WAIT_PREEMPTED]
    with pytest.raises(RuntimeError, match="why_fold"):
        dig.digest(buf, 0, len(buf) - 1, 1 << 20)
    assert dig.take_why()[0] == [] and dig.why_antagonists(-1) == {}
    dig.why_fold([])
    later = b"\n".join(orjson.dumps({**x, "ts": x["ts"] + 100}) for x in lines) + b"\n"
    assert dig.digest(later, 0, len(later) - 1, 1 << 20)[1] == 2
    dig.why_fold([5] * len(dig.take_why()[0]))
    # a's slice [T0+100, T0+110] lies within b's wait [T0+105, T0+120] for 5 ns; no slice covers the rest
    assert dig.why_antagonists(-1) == {5: ([(-1, 10, 1), (1, 5, 1)], 0, 0)}


ODD = [  # lines record never writes, which the reader takes as they are
    {"type": "state", "ts": T0 + 5 * US, "cpu": 0, "pid": 500, "tid": 500, "comm": "db", "from": "sleeping",
     "to": "runnable", "dur_ns": 7, "cause": "wakeup", "waker": "task", "waker_tid": 520, "waker_pid": 520},
    {"type": "state", "ts": T0 + 6 * US, "cpu": 0, "pid": 500, "tid": 501, "comm": "db", "from": "sleeping",
     "to": "runnable", "dur_ns": 7, "cause": "wakeup", "cgroup": "x"},
    {"type": "state", "ts": T0 + 7 * US, "cpu": 0, "pid": 500, "tid": 502, "comm": "db", "from": "sleeping",
     "to": "runnable", "dur_ns": 7, "cause": "wakeup", "cgroup": 2**64},
    {"type": "waker", "ts": T0, "tid": "x", "pid": 1, "comm": "w"},
    {"type": "waker", "ts": T0, "comm": "w"},
    {"type": "slice", "ts": T0 + 8 * US, "cpu": 0, "pid": 77, "tid": -1, "comm": "neg", "dur_ns": 5},
    {"type": "slice", "ts": 1.5, "cpu": 0, "pid": 77, "tid": 78, "comm": "float", "dur_ns": 1},
    {"type": "slice", "ts": T0 + 9 * US, "cpu": 0, "tid": 79, "comm": "nopid", "dur_ns": 1},
    {"type": "slice", "ts": T0 + 9 * US, "cpu": 0, "pid": 80, "tid": 80, "comm": "long", "dur_ns": T0 * 2},
]


@pytest.mark.skipif(not NATIVE, reason="the native reader is not built (PSTATE_PURE=1)")
@pytest.mark.parametrize("view", list(WHY_VIEWS))
def test_odd_records_read_the_same_both_ways(recordings, tmp_path, view):
    lines = open(recordings[0], "rb").read().splitlines()
    odd = tmp_path / "odd.jsonl"
    odd.write_bytes(b"\n".join(lines[:40] + [json.dumps(x).encode() for x in ODD] + lines[40:]) + b"\n")
    for by in ("pid", "unit"):
        args = ["--by", by, *WHY_VIEWS[view], "--stacks", "--wakers", "--antagonists"]
        fast = stats(str(odd), *args, "-f", "json") if view != "folded" else stats(str(odd), *args)
        careful = (stats(str(odd), *args, "-f", "json", "--reader", "careful") if view != "folded"
                   else stats(str(odd), *args, "--reader", "careful"))
        assert fast == careful
        assert fast[0] == 0, fast[2]
    report = orjson.loads(stats(str(odd), "--wakers", "-f", "json")[1])
    named = [w for g in report["groups"] for w in g["wakers"] if w["kind"] == "task" and w["tid"] == 0]
    assert named  # (a waker string "task" is a kind, with no tid, both ways)

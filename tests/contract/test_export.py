"""pstate export: the Perfetto trace holds every switch and wake-up of the
recording (decoded with the perfetto package's own protos), and the time in
each state Perfetto derives from them per thread is the time stats reports
(derived here as its trace processor does: its binary is downloaded on first
use, which cannot be done here); the Chrome JSON's slices add up to the time
stats reports, filtered recordings get thread tracks only, and the errors are
the documented ones."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time

import orjson
import pytest
from click.testing import CliRunner

from conftest import clean_env, pstate_cmd, until
from pstate.commands.export import cli as export_cli
from pstate.render.traceexport import prev_state_bits

pb = pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")

META = {"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "0.1.0", "host": "t",
        "kernel": "6.18.0", "boot_id": "b", "clock": "monotonic", "ts": 1000, "wall_ns": 0, "ncpu": 2,
        "kernel_states": {"0x1": "sleeping", "0x2": "uninterruptible", "0x4": "stopped", "0x8": "traced",
                          "0x10": "dead", "0x20": "zombie", "0x40": "parked", "0x80": "idle", "0x100": "+"},
        "include_idle": False}


def st(ts, cpu, pid, tid, comm, frm, to, dur, cause, **kw):
    return {"type": "state", "ts": ts, "cpu": cpu, "pid": pid, "tid": tid, "comm": comm, "from": frm, "to": to,
            "dur_ns": dur, "cause": cause, **kw}


# CPU 0: idle -> A(10) -> B(20) (A preempted) -> idle (B sleeps); B woken on CPU 1
# by C(30), which runs there; A back at the end; A's thread 11 forks, 20 is reaped.
STREAM = [
    META,
    st(2000, 0, 10, 10, "a", "runnable", "running", None, "switch_in", prio=120, prev_tid=0),
    st(3000, 0, 10, 10, "a", "running", "preempted", 1000, "switch_out", prio=120, kstate="R+",
       voluntary=False, next_tid=20),
    st(3000, 0, 20, 20, "b", "runnable", "running", None, "switch_in", prio=110, prev_tid=10),
    st(3500, 1, 30, 30, "c", "runnable", "running", None, "switch_in", prio=120, prev_tid=0),
    st(4000, 0, 20, 20, "b", "running", "uninterruptible", 1000, "switch_out", prio=110, kstate="D",
       voluntary=True, next_tid=10),
    st(4000, 0, 10, 10, "a", "preempted", "running", 1000, "switch_in", prio=120, prev_tid=20),
    st(4500, 1, 20, 20, "b", "uninterruptible", "runnable", 500, "wakeup", waker_tid=30, waker_pid=30,
       target_cpu=0),
    {"type": "fork", "ts": 4600, "cpu": 0, "pid": 10, "tid": 10, "comm": "a", "child_pid": 10, "child_tid": 11,
     "thread": True},
    st(5000, 0, 10, 10, "a", "running", "sleeping", 1000, "switch_out", prio=120, kstate="S", voluntary=True,
       next_tid=0),
    {"type": "loss", "ts": 5100, "reason": "ringbuf_full", "count": 3, "since_ts": 1000},
    {"type": "end", "ts": 6000, "reason": "duration", "events": 9, "lost": 3, "lost_ringbuf_full": 3,
     "lost_map_full": 0, "lost_sampled": 0, "lost_unread": 0, "duration_ns": 5000},
]


def write(path, recs):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    return path


def decode(data: bytes):
    """(switches, wakings, threads, instants, slices) from a Perfetto trace."""
    trace = pb.Trace()
    trace.ParseFromString(data)
    switches, wakings, threads, instants, slices = [], [], {}, [], []
    for p in trace.packet:
        if p.HasField("ftrace_events"):
            b = p.ftrace_events
            cs = b.compact_sched
            names = list(cs.intern_table)
            ts = 0
            for i, d in enumerate(cs.switch_timestamp):
                ts += d
                switches.append((b.cpu, ts, cs.switch_prev_state[i], cs.switch_next_pid[i],
                                 names[cs.switch_next_comm_index[i]], cs.switch_next_prio[i]))
            ts = 0
            for i, d in enumerate(cs.waking_timestamp):
                ts += d
                wakings.append((b.cpu, ts, cs.waking_pid[i], cs.waking_target_cpu[i]))
        if p.HasField("process_tree"):
            for t in p.process_tree.threads:
                threads[t.tid] = (t.tgid, t.name)
        if p.HasField("track_event"):
            ev = p.track_event
            if ev.type == ev.TYPE_INSTANT:
                instants.append((p.timestamp, ev.name))
            else:
                slices.append((ev.track_uuid, p.timestamp, ev.type, ev.name))
    return sorted(switches), sorted(wakings), threads, instants, slices


# What a task leaves in at a switch, by its prev_state bits, as Perfetto's sched importer reads them
# (most telling bit first); none or the preemption bit alone: Perfetto's Runnable and Runnable
# (Preempted), both pstate's preempted (its runnable is a woken task's wait).
_LEFT_IN = (("D", "uninterruptible"), ("T", "stopped"), ("t", "traced"), ("X", "dead"), ("Z", "zombie"),
            ("P", "parked"), ("I", "idle"), ("S", "sleeping"))


def trace_thread_states(data: bytes, bits: dict) -> dict:
    """{(tid, state): ns} derived from a Perfetto trace's scheduler events
    alone, the way Perfetto's trace processor builds its thread_state table
    (its binary cannot be had here: it is downloaded on first use): per CPU,
    a switch ends the running task (the one the CPU's previous switch put
    there; unknown for a CPU's first switch) in the state its prev_state
    says and starts the next one running; a waking makes a task runnable;
    sched_process_free ends a task; a state still open at the trace's last
    timestamp lasts until then. A task's time before its first event is
    not known (stats reports it as unobserved)."""
    trace = pb.Trace()
    trace.ParseFromString(data)
    events = []  # (ts, order, kind, cpu, a, b)
    for p in trace.packet:
        if p.HasField("track_event"):
            events.append((p.timestamp, 3, "mark", 0, 0, 0))
        if not p.HasField("ftrace_events"):
            continue
        b = p.ftrace_events
        cs = b.compact_sched
        ts = 0
        for i, d in enumerate(cs.switch_timestamp):
            ts += d
            events.append((ts, 1, "switch", b.cpu, cs.switch_prev_state[i], cs.switch_next_pid[i]))
        ts = 0
        for i, d in enumerate(cs.waking_timestamp):
            ts += d
            events.append((ts, 0, "waking", b.cpu, cs.waking_pid[i], 0))
        for ev in b.event:
            if ev.HasField("sched_process_free"):
                events.append((ev.timestamp, 2, "free", b.cpu, ev.sched_process_free.pid, 0))
    events.sort()
    now: dict = {}  # tid -> (state, since)
    on_cpu: dict = {}  # cpu -> tid
    out: dict = {}

    def enter(tid, state, ts):
        if tid == 0:
            return  # the idle task
        old = now.pop(tid, None)
        if old is not None:
            out[(tid, old[0])] = out.get((tid, old[0]), 0) + ts - old[1]
        if state is not None:
            now[tid] = (state, ts)

    for ts, _o, kind, cpu, a, nxt in events:
        if kind == "switch":
            prev = on_cpu.get(cpu)
            if prev is not None:
                left = next((name for letter, name in _LEFT_IN if a & bits.get(letter, 0)), None)
                enter(prev, left or "preempted", ts)
            enter(nxt, "running", ts)
            on_cpu[cpu] = nxt
        elif kind == "waking":
            if now.get(a, ("",))[0] != "running":
                enter(a, "runnable", ts)
        elif kind == "free":
            enter(a, None, ts)
    end = events[-1][0] if events else 0
    for tid, (state, since) in now.items():
        out[(tid, state)] = out.get((tid, state), 0) + end - since
    return {k: v for k, v in out.items() if v}


def stats_states(src, pstate) -> dict:
    """{(tid, state): ns} of pstate stats --by tid."""
    rep = json.loads(pstate("stats", "--by", "tid", "--format", "json", str(src)).stdout)
    return {(g["tid"], s): v["ns"] for g in rep["groups"] for s, v in g["states"].items() if v["ns"]}


def run(*args, input=None):
    r = CliRunner().invoke(export_cli, list(args), input=input, catch_exceptions=False)
    return r


def test_synthetic_stream_every_switch_and_waking(tmp_path):
    src = write(tmp_path / "rec.jsonl", STREAM)
    r = run(str(src), "-o", str(tmp_path / "t.pftrace"))
    assert r.exit_code == 0, r.output
    switches, wakings, threads, instants, slices = decode((tmp_path / "t.pftrace").read_bytes())
    assert switches == [
        (0, 2000, 0, 10, "a", 120),  # from idle (switch-in with prev_tid 0)
        (0, 3000, 0x100, 20, "b", 110),  # a preempted (R+), b's own prio and name
        (0, 4000, 0x2, 10, "a", 120),  # b into D
        (0, 5000, 0x1, 0, "swapper/0", 120),  # a sleeps, the CPU goes idle
        (1, 3500, 0, 30, "c", 120),
    ]
    assert wakings == [(1, 4500, 20, 0)]
    assert threads[10] == (10, "a") and threads[11] == (10, "a") and threads[20] == (20, "b")
    assert [name for _ts, name in instants] == ["loss: 3 events (ringbuf_full)", "end: duration"]
    assert slices == []
    assert r.output.endswith("pstate export: warning: the input reports 3 lost events; results are incomplete\n")


def test_thread_states_read_from_the_trace_equal_stats(tmp_path, pstate):
    """Per thread and state, the time Perfetto derives from the exported
    switches and wakings is the time pstate stats reports."""
    src = write(tmp_path / "rec.jsonl", STREAM)
    assert run(str(src), "-o", str(tmp_path / "t.pftrace")).exit_code == 0
    got = trace_thread_states((tmp_path / "t.pftrace").read_bytes(), prev_state_bits(META))
    assert got == stats_states(src, pstate)
    assert got[(20, "uninterruptible")] == 500 and got[(10, "preempted")] == 1000


def test_prev_state_bits_come_from_the_kernel_table():
    meta = dict(META, kernel_states={"0x1": "sleeping", "0x2": "uninterruptible", "0x400": "+"})
    assert prev_state_bits(meta) == {"S": 1, "D": 2, "+": 0x400}
    assert prev_state_bits({})["+"] == 0x100  # kernels since 4.14


def test_filtered_recording_gets_thread_tracks_and_a_note(tmp_path):
    src = write(tmp_path / "rec.jsonl", [dict(META, filter_pid=[10])] + STREAM[1:])
    r = run(str(src), "-o", str(tmp_path / "t.pftrace"))
    assert r.exit_code == 0
    assert "pstate export: note: no CPU tracks, thread tracks only: it was recorded with --pid\n" in r.output
    switches, wakings, _threads, _instants, slices = decode((tmp_path / "t.pftrace").read_bytes())
    assert switches == [] and wakings == []
    # thread a: running 2000-3000, preempted 3000-4000, running 4000-5000, then sleeping
    a = [(ts, kind, name) for uuid, ts, kind, name in slices if uuid == (1 << 32) + 10]
    B, E = pb.TrackEvent.TYPE_SLICE_BEGIN, pb.TrackEvent.TYPE_SLICE_END
    assert a == [(2000, B, "running"), (3000, E, ""), (3000, B, "preempted"), (4000, E, ""),
                 (4000, B, "running"), (5000, E, ""), (5000, B, "sleeping")]


def test_chrome_slices_add_up_to_stats(tmp_path, pstate):
    src = write(tmp_path / "rec.jsonl", STREAM)
    r = run(str(src), "-f", "chrome", "-o", str(tmp_path / "t.json"))
    assert r.exit_code == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    assert_chrome_matches_stats(doc, src, pstate)


def test_a_state_of_no_time_draws_no_chrome_slice(tmp_path, pstate):
    """A wake-up that came before the switch-out: the blocked state lasted 0 ns."""
    recs = STREAM[:-2] + [
        st(5200, 1, 30, 30, "c", "running", "uninterruptible", 1700, "switch_out", prio=120, kstate="D",
           voluntary=True, next_tid=0),
        st(5200, 1, 30, 30, "c", "uninterruptible", "runnable", 0, "wakeup", waker_tid=10, waker_pid=10,
           target_cpu=1),
        st(5300, 1, 30, 30, "c", "runnable", "running", 100, "switch_in", prio=120, prev_tid=0),
    ]
    src = write(tmp_path / "rec.jsonl", recs)
    assert run(str(src), "-f", "chrome", "-o", str(tmp_path / "t.json")).exit_code == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    assert not [e for e in doc["traceEvents"] if e["ph"] == "X" and e["tid"] == 30 and e["name"] == "uninterruptible"]
    assert_chrome_matches_stats(doc, src, pstate)


def assert_chrome_matches_stats(doc: dict, src, pstate) -> None:
    got: dict = {}
    n = 0
    for ev in doc["traceEvents"]:
        if ev["ph"] == "X":
            k = (ev["tid"], ev["name"])
            got[k] = got.get(k, 0) + ev["dur"] * 1000
            n += 1
    rep = json.loads(pstate("stats", "--by", "tid", "--format", "json", str(src)).stdout)
    want = {(g["tid"], s): v["ns"] for g in rep["groups"] for s, v in g["states"].items() if v["ns"]}
    assert set(got) == set(want)
    for k, ns in want.items():
        assert abs(got[k] - ns) <= 1, k  # µs floats: within a nanosecond per state


def test_perfetto_to_a_terminal_is_refused(tmp_path):
    src = write(tmp_path / "rec.jsonl", STREAM)
    main, sub = pty.openpty()
    try:
        p = subprocess.run(pstate_cmd("export", str(src)), stdout=sub, stderr=subprocess.PIPE, env=clean_env(),
                           timeout=60)
    finally:
        os.close(main)
        os.close(sub)
    assert p.returncode == 2
    assert b"a Perfetto trace is binary: give -o FILE, or redirect standard output" in p.stderr


def test_missing_perfetto_package_names_the_extra(monkeypatch, tmp_path):
    src = write(tmp_path / "rec.jsonl", STREAM)
    monkeypatch.setitem(sys.modules, "perfetto.trace_builder.proto_builder", None)
    r = CliRunner().invoke(export_cli, [str(src), "-o", str(tmp_path / "t.pftrace")])
    assert r.exit_code == 69
    assert "fix: pip install 'pstate[perfetto]' (or: make setup)" in r.output


def test_bad_lines_are_skipped_and_counted(tmp_path):
    src = tmp_path / "rec.jsonl"
    src.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in STREAM[:3]) + b"{nope\n")
    r = run(str(src), "-f", "chrome", "-o", str(tmp_path / "t.json"))
    assert r.exit_code == 0
    assert "pstate export: warning: skipped 1 line: not valid JSON" in r.output
    json.loads((tmp_path / "t.json").read_text())
    assert run(str(src), "-f", "chrome", "--strict", "-o", str(tmp_path / "t2.json")).exit_code == 65


def test_a_closed_pipe_ends_quietly(tmp_path):
    big = [META] + [st(2000 + i, 0, 10, 10, "a", "running", "sleeping", 5, "switch_out", kstate="S", next_tid=0)
                    for i in range(20000)]
    src = write(tmp_path / "rec.jsonl", big)
    p = subprocess.run(f"{' '.join(pstate_cmd('export', '-f', 'chrome', str(src)))} | head -c 100 >/dev/null",
                       shell=True, capture_output=True, env=clean_env(), timeout=60)
    assert p.returncode == 0 and p.stderr == b""


# --- a real recording -----------------------------------------------------------

PINGPONG = """
import os, sys, time
sys.stdin.read(1)
r1, w1 = os.pipe(); r2, w2 = os.pipe()
if os.fork() == 0:
    for _ in range(200):
        os.read(r1, 1); os.write(w2, b"x")
    os._exit(0)
for _ in range(200):
    os.write(w1, b"x"); os.read(r2, 1)
os.wait()
time.sleep(0.05)
"""


@pytest.mark.bpf
def test_real_recording_round_trips(tmp_path, pstate):
    """Everything record saw of a pipe ping-pong, unfiltered, is in the trace:
    every switch (with the state the task left in) and every wake-up."""
    rec = tmp_path / "rec.jsonl"
    child = subprocess.Popen([sys.executable, "-c", PINGPONG], stdin=subprocess.PIPE)
    proc = subprocess.Popen(pstate_cmd("record", "-q", "-o", str(rec)), env=clean_env())
    try:
        # attached once its meta line is out
        until("record wrote its meta line", proc, lambda: rec.exists() and rec.read_bytes().endswith(b"\n"), 60)
        child.stdin.write(b"g")
        child.stdin.flush()
        child.wait(timeout=60)
        time.sleep(0.2)
    finally:
        proc.send_signal(2)
        proc.wait(timeout=30)
    assert proc.returncode == 0
    r = pstate("export", str(rec), "-o", str(tmp_path / "t.pftrace"))
    assert r.returncode == 0, r.stderr
    recs = [orjson.loads(x) for x in rec.read_bytes().splitlines()]
    meta = recs[0]
    bits = prev_state_bits(meta)
    want_sw, want_wk = set(), set()
    for x in recs:
        if x["type"] != "state":
            continue
        if x["cause"] == "switch_out":
            v = 0
            for ch in x["kstate"]:
                v |= bits.get(ch, 0)
            want_sw.add((x["cpu"], x["ts"], v, x["next_tid"]))
        elif x["cause"] == "switch_in" and x.get("prev_tid") == 0:
            want_sw.add((x["cpu"], x["ts"], 0, x["tid"]))
        elif x["cause"] in ("wakeup", "wakeup_new"):
            want_wk.add((x["cpu"], x["ts"], x["tid"], x["target_cpu"]))
    switches, wakings, threads, _i, _s = decode((tmp_path / "t.pftrace").read_bytes())
    assert {s[:4] for s in switches} == want_sw
    assert len(switches) == len(want_sw)
    assert set(wakings) == want_wk
    pids = {child.pid} | {x["child_pid"] for x in recs if x["type"] == "fork" and x["pid"] == child.pid}
    pp = [x for x in recs if x["type"] == "state" and x["pid"] in pids]
    assert len(pids) == 2 and len([x for x in pp if x["cause"] == "wakeup"]) >= 200
    for x in pp:
        assert threads[x["tid"]][0] == x["pid"]
    # Time in state of the ping-pong pair as Perfetto derives it from the trace, against stats:
    # the child lived inside the recording (its whole life is in both; before its first wake-up it
    # was new, which the trace does not show); the parent slept in its read from before the
    # recording (stats has that sleep from /proc, the trace from its first event on).
    # A thread whose ledger has a gap is left out: on this kind of VM the agent's threads never
    # switch out where pstate's programs see it, so a task that gets the CPU back from one
    # comes back with no switch-in, and stats and the trace each bridge the gap their own way.
    # Only such a gap is allowed: one after a switch to a thread that never switched out, or a
    # switch-out with no switch-in since the task was woken (or went to sleep: a wake-up while
    # such a thread runs is not seen either), where such a thread got that CPU in between (it
    # handed the CPU to the task untraced).
    never_out = {x["next_tid"] for x in recs if x["type"] == "state" and x["cause"] == "switch_out"} - {
        x["tid"] for x in recs if x["type"] == "state" and x["cause"] == "switch_out"} - {0}  # idle: no records

    def handed_over(a: dict, b: dict) -> bool:
        return (a["to"] != "running" and b["cause"] == "switch_out" and any(
            x["type"] == "state" and x["cause"] == "switch_out" and x["cpu"] == b["cpu"]
            and x["next_tid"] in never_out and a["ts"] <= x["ts"] <= b["ts"] for x in recs))

    gapped = set()
    for tid in pids:
        seq = [x for x in pp if x["tid"] == tid]
        for a, b in zip(seq, seq[1:]):
            if a["to"] != b["from"]:
                assert a["cause"] == "switch_out" and a["next_tid"] in never_out or handed_over(a, b), [
                    {k: x.get(k) for k in ("ts", "cpu", "tid", "from", "to", "dur_ns", "cause", "next_tid",
                                           "prev_tid", "waker_tid")} for x in (a, b)]
                gapped.add(tid)
    got = trace_thread_states((tmp_path / "t.pftrace").read_bytes(), bits)
    want = stats_states(rec, pstate)
    kid = next(iter(pids - {child.pid}))
    for (tid, state), ns in want.items():
        if tid in gapped:
            continue
        if tid == kid and state != "new" or tid == child.pid and state != "sleeping":
            assert got.get((tid, state), 0) == ns, (tid, state)
    assert got[(kid, "running")] > 0 and got[(child.pid, "runnable")] > 0
    r = pstate("export", str(rec), "-f", "chrome", "-o", str(tmp_path / "t.json"))
    assert r.returncode == 0
    assert_chrome_matches_stats(json.loads((tmp_path / "t.json").read_text()), rec, pstate)


# --- a full disk -----------------------------------------------------------------------------


def test_a_full_disk_leaves_no_partial_trace_and_exits_74(tmp_path):
    """export -o on a full file system: exit 74 with one message, no partial
    or empty file, no temporary file left; an earlier file of that name is
    left as it was."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "tiny"
    d.mkdir(mode=0o700)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "pstate-test", str(d)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        big = [META] + [st(2000 + i, 0, 10, 10, "a", "running", "sleeping", 5, "switch_out", kstate="S",
                           next_tid=0) for i in range(20000)]
        src = write(tmp_path / "rec.jsonl", big)
        fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError:
            pass
        finally:
            os.close(fd)
        os.truncate(d / "filler", (d / "filler").stat().st_size - 16384)
        (d / "old.json").write_bytes(b"an earlier trace\n")
        for fmt, name in (("chrome", "t.json"), ("chrome", "old.json"), ("perfetto", "t.pftrace")):
            p = subprocess.run(pstate_cmd("export", "-f", fmt, str(src), "-o", str(d / name)), capture_output=True,
                               env=clean_env(), timeout=120)
            err = p.stderr.decode(errors="replace")
            assert p.returncode == 74, err
            assert "Traceback" not in err and "No space left on device" in err, err
            assert len(err.strip().splitlines()) <= 2, err
            assert sorted(os.listdir(d)) == ["filler", "old.json"], os.listdir(d)
            assert (d / "old.json").read_bytes() == b"an earlier trace\n"
        # with room, an export replaces the earlier file whole
        os.unlink(d / "filler")
        small = write(tmp_path / "small.jsonl", STREAM)
        p = subprocess.run(pstate_cmd("export", "-f", "chrome", str(small), "-o", str(d / "old.json")),
                           capture_output=True, env=clean_env(), timeout=120)
        assert p.returncode == 0, p.stderr
        assert json.loads((d / "old.json").read_bytes())["traceEvents"]
        assert sorted(os.listdir(d)) == ["old.json"]
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)

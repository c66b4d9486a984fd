"""record --flight without the kernel: triggers on binary batches, the ring's
window and memory cap, dumps (atomic, read by stats as complete recordings),
the hold-off, --max-dumps and the extension of a dump by a later trigger."""

from __future__ import annotations

import os
import struct

import orjson
import pytest
from click.testing import CliRunner

from pstate.kernel import eventcodec as ec
from pstate.main import cli as pstate_cli
from pstate.kernel.kstates import KernelStates
from pstate.engines import flight
from pstate.snapshots.writer import SnapDir
from pstate.stream import schema

KS = KernelStates(report_mask=0xFF, preempt_bit=0x100,
                  letters={1: "S", 2: "D", 4: "T", 8: "t", 16: "X", 32: "Z", 64: "P", 128: "I"})
D = ec.ST_KERNEL | 2
S = ec.ST_KERNEL | 1
RUNNING, RUNNABLE = ec.CODES["running"], ec.CODES["runnable"]
MS = 1_000_000
WAKEUP = ec.eventlayout.DEFINES["CAUSE_WAKEUP"]


def slot(ts, *, frm=RUNNING, to=S, dur=1000, cause=ec.CAUSE_SWITCH_OUT, tid=100, comm=b"worker", hdr=ec.EVENT_SIZE,
         typ=ec.EV_STATE, pid=None, cgroup=0):
    kst = 1 if cause == ec.CAUSE_SWITCH_OUT else 0
    return struct.pack(ec.REC_FMT, hdr, 0, ts, dur, tid if pid is None else pid, tid, 0, 0, kst, frm, to, 0, typ,
                       cause, 120, ec.F_VOLUNTARY if kst else 0, comm.ljust(16, b"\0"), 0, cgroup, ec.NO_DUR)


def batch(*slots) -> bytes:
    return b"".join(slots)


def background(t0, n=50, step=MS):
    """n ordinary switch-outs and switch-ins, step apart, from t0."""
    out = []
    for k in range(n):
        ts = t0 + k * step
        out.append(slot(ts) if k % 2 else slot(ts, frm=RUNNABLE, to=RUNNING, cause=ec.CAUSE_SWITCH_IN))
    return out


@pytest.mark.parametrize("text, fires, quiet", [
    ("D>=100ms", slot(5, frm=D, to=RUNNABLE, dur=150 * MS, cause=WAKEUP),
     slot(5, frm=D, to=RUNNABLE, dur=90 * MS, cause=WAKEUP)),
    ("uninterruptible>=100ms", slot(5, frm=D, to=RUNNABLE, dur=100 * MS, cause=WAKEUP),
     slot(5, frm=S, to=RUNNABLE, dur=900 * MS, cause=WAKEUP)),
    ("runq>=50ms", slot(5, frm=RUNNABLE, to=RUNNING, dur=60 * MS, cause=ec.CAUSE_SWITCH_IN),
     slot(5, frm=RUNNING, to=S, dur=60 * MS)),
    ("comm=postgres:D", slot(5, to=D, comm=b"postgres"), slot(5, to=D, comm=b"nginx")),
    ("D", slot(5, to=D), slot(5, to=S)),
])
def test_a_condition_fires_on_its_event_only(text, fires, quiet):
    trig = flight.parse_trigger(text, KS)
    assert flight.match(trig, batch(*background(0, 20), fires, *background(0, 5))) == 20
    assert flight.match(trig, batch(*background(0, 20), quiet)) is None


def test_discarded_slots_and_unknown_durations_never_fire():
    trig = flight.parse_trigger("D>=100ms", KS)
    discarded = slot(5, frm=D, to=RUNNABLE, dur=200 * MS, cause=WAKEUP, hdr=ec.EVENT_SIZE | ec.DISCARD)
    unknown = slot(5, frm=D, to=RUNNABLE, dur=ec.NO_DUR, cause=WAKEUP)
    assert flight.match(trig, batch(discarded, unknown)) is None
    runq = flight.parse_trigger("runq>=1ms", KS)
    assert flight.match(runq, batch(slot(1, frm=RUNNABLE, to=RUNNING, dur=ec.NO_DUR,
                                         cause=ec.CAUSE_SWITCH_IN))) is None


def test_a_condition_for_some_tasks_fires_on_theirs_only():
    """pid=, title= and cgroup= limit a condition to some tasks' events: another
    task's long D does not fire it first."""
    me = os.getpid()
    other = slot(5, frm=D, to=RUNNABLE, dur=900 * MS, cause=WAKEUP, pid=1, tid=1)
    mine = slot(6, frm=D, to=RUNNABLE, dur=150 * MS, cause=WAKEUP, pid=me, tid=me + 1, cgroup=77)
    for text in (f"pid=12,{me}:D>=100ms", "title=pytest|python:D>=100ms"):
        trig = flight.parse_trigger(text, KS)
        assert flight.match(trig, batch(*background(0, 3), other, mine)) == 4, text
        assert flight.match(trig, batch(*background(0, 3), other)) is None, text
    trig = flight.parse_trigger("pid=12:D>=100ms", KS)
    assert flight.match(trig, batch(other, mine)) is None
    trig.pids, trig.cgroups = None, frozenset({77})  # what cgroup=PATH resolves to: ids of it and below
    assert flight.match(trig, batch(other, mine)) == 1
    assert flight.parse_trigger("title=^a:b:c:D", KS).title.pattern == "^a:b:c"


@pytest.mark.parametrize("text", ["D>=", "runq", "comm=x", "Q>=1ms", "D>=soon", "pid=x:D", "pid=:D",
                                  "title=(:D", "cgroup=/no/such/cgroup/here:D", "comm=sixteen-bytes-xy:D"])
def test_a_bad_condition_says_why(text):
    with pytest.raises(ValueError):
        flight.parse_trigger(text, KS)


class Clock:
    def __init__(self, monkeypatch, t0):
        self.now = t0
        monkeypatch.setattr(flight.time, "monotonic_ns", lambda: self.now)


def recorder(tmp_path, **kw):
    from pstate.stream.meta import meta_record

    args = dict(window_ns=5000 * MS, memory=64 << 20, triggers=[flight.parse_trigger("D>=100ms", KS)],
                after_ns=1000 * MS, max_dumps=10, hold_off_ns=0, start_ts=0, quiet=True)
    args.update(kw)
    enc = ec.Encoder(KS, resolve_tgid=lambda tid: 0)
    return flight.FlightRecorder(enc, SnapDir(str(tmp_path)), new_meta=lambda: meta_record("record", KS), **args)


def feed(fr, data: bytes) -> int:
    return fr.feed(memoryview(data), len(data) // flight.STRIDE)


def d_exit(ts, tid=4242):
    return slot(ts, frm=D, to=RUNNABLE, dur=150 * MS, cause=WAKEUP, tid=tid, comm=b"dd")


def run(fr, clock, t_from, t_to, step=100 * MS, extra=None):
    """Feed background batches every step from t_from to t_to (ns), with extra[ts] slots added."""
    t = t_from
    while t < t_to:
        clock.now = t
        more = (extra or {}).get(t, [])
        feed(fr, batch(*background(t - step, 10, step // 10), *more))  # what happened until now
        fr.tick()
        t += step


def lines(path):
    return [orjson.loads(x) for x in open(path, "rb")]


def test_a_dump_holds_the_window_before_and_after_and_reads_as_complete(tmp_path, monkeypatch):
    clock = Clock(monkeypatch, 0)
    fr = recorder(tmp_path)
    t0 = 1_000 * MS
    trig_at = t0 + 8_000 * MS
    run(fr, clock, t0, t0 + 12_000 * MS, extra={trig_at: [d_exit(trig_at - 5)]})
    assert len(fr.files) == 1
    recs = lines(tmp_path / fr.files[0])
    meta, trig, end = recs[0], recs[1], recs[-1]
    assert meta["type"] == "meta" and trig["type"] == "trigger" and end["type"] == "end"
    assert trig["tid"] == 4242 and trig["comm"] == "dd" and trig["condition"] == "D>=100ms"
    assert trig["from"] == "uninterruptible" and trig["dur_ns"] == 150 * MS and trig["ts"] == trig_at - 5
    assert meta["window_begin_ts"] == meta["ts"] == trig["window_begin_ts"] <= trig["ts"] - 5000 * MS
    assert meta["window_end_ts"] == trig["window_end_ts"] >= trig["ts"] + 1000 * MS
    assert trig["shrunk"] is False
    events = [r for r in recs if r["type"] in schema.EVENT_TYPES]
    assert end["events"] == len(events) and any(r["tid"] == 4242 for r in events)
    assert all(meta["window_begin_ts"] <= r["ts"] <= meta["window_end_ts"] for r in events)
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".pstate-") and "tmp" in n]
    res = CliRunner().invoke(pstate_cli, ["stats", "--strict", str(tmp_path / fr.files[0])])
    assert res.exit_code == 0, res.output
    assert oct(os.stat(tmp_path / fr.files[0]).st_mode & 0o777) == "0o600"


def test_a_dump_early_in_the_run_starts_at_the_recording_start(tmp_path, monkeypatch):
    clock = Clock(monkeypatch, 0)
    fr = recorder(tmp_path, start_ts=900 * MS)
    t0 = 1_000 * MS
    run(fr, clock, t0, t0 + 3_000 * MS, extra={t0 + 1_000 * MS: [d_exit(t0 + 1_000 * MS - 5)]})
    trig = lines(tmp_path / fr.files[0])[1]
    assert trig["window_begin_ts"] == 900 * MS and trig["shrunk"] is False


def test_triggers_inside_after_extend_one_dump(tmp_path, monkeypatch):
    clock = Clock(monkeypatch, 0)
    fr = recorder(tmp_path)
    t0 = 1_000 * MS
    extra = {t0 + k * 100 * MS: [d_exit(t0 + k * 100 * MS - 5)] for k in range(10, 25)}  # every 100 ms for 1.5 s
    run(fr, clock, t0, t0 + 6_000 * MS, extra=extra)
    assert len(fr.files) == 1
    trig = lines(tmp_path / fr.files[0])[1]
    assert trig["triggers"] == 15
    assert trig["window_end_ts"] >= t0 + 2_400 * MS + 1_000 * MS  # the last trigger's --after


def test_a_storm_respects_the_hold_off_and_max_dumps(tmp_path, monkeypatch):
    clock = Clock(monkeypatch, 0)
    fr = recorder(tmp_path, after_ns=200 * MS, hold_off_ns=2_000 * MS, max_dumps=3)
    t0 = 1_000 * MS
    extra = {t: [d_exit(t - 5)] for t in range(t0, t0 + 20_000 * MS, 100 * MS)}  # true every 100 ms
    run(fr, clock, t0, t0 + 20_000 * MS, extra=extra)
    assert len(fr.files) == 3
    trigs = [lines(tmp_path / f)[1] for f in fr.files]
    for a, b in zip(trigs, trigs[1:]):
        assert b["ts"] >= a["window_end_ts"] + 2_000 * MS
        # a condition true all the time extends a dump by one window at most
        assert b["window_end_ts"] - b["ts"] <= 200 * MS + 5_000 * MS + 100 * MS
    assert fr.skipped > 30  # held off (one per batch: a batch fires a trigger once)


def test_the_memory_cap_wins_and_the_trigger_says_which_window(tmp_path, monkeypatch):
    clock = Clock(monkeypatch, 0)
    cap = 1 << 20
    fr = recorder(tmp_path, memory=cap, after_ns=0)
    t0 = 1_000 * MS
    t = t0
    big = 4000  # slots per 10 ms: 400 k events/s
    while t < t0 + 3_000 * MS:
        clock.now = t
        feed(fr, batch(*[slot(t + k * 2500) for k in range(big)]))
        assert fr.bytes <= cap + big * flight.STRIDE + flight.BATCH_OVERHEAD
        t += 10 * MS
    clock.now = t
    feed(fr, d_exit(t - 5))
    fr.tick()
    trig = lines(tmp_path / fr.files[0])[1]
    assert trig["shrunk"] is True
    assert trig["ts"] - trig["window_begin_ts"] < 200 * MS  # ~1 MB of 72-byte slots at 400 k/s
    assert fr.peak_bytes <= cap + big * flight.STRIDE + flight.BATCH_OVERHEAD


def test_sigusr1_is_a_manual_trigger(tmp_path, monkeypatch):
    clock = Clock(monkeypatch, 0)
    fr = recorder(tmp_path, triggers=[], after_ns=0)
    run(fr, clock, 1_000 * MS, 2_000 * MS)
    fr.manual()
    fr.tick()
    trig = lines(tmp_path / fr.files[0])[1]
    assert trig["cause"] == "signal" and trig["signal"] == "SIGUSR1"


def test_flight_options_need_their_directory_and_flight():
    res = CliRunner().invoke(pstate_cli, ["record", "--trigger", "D>=100ms"])
    assert res.exit_code == 2 and "--trigger needs --flight DURATION" in res.output
    res = CliRunner().invoke(pstate_cli, ["record", "--flight", "5s", "--flight-memory", "10k", "-o", "x"])
    assert res.exit_code == 2 and "at least 1M" in res.output


def test_the_native_scan_and_its_twin_agree():
    from pstate import native

    mod = native.load("_encode")
    if mod is None:
        pytest.skip("the C extension is not built (PSTATE_PURE=1?)")
    long_d = slot(1, frm=D, to=RUNNABLE, dur=7 * MS, cause=WAKEUP)
    cases = [b"", batch(*background(0, 30)), batch(*background(0, 5), long_d, *background(0, 5)),
             batch(slot(1, dur=ec.NO_DUR)), batch(slot(1, dur=9 * MS, hdr=ec.EVENT_SIZE | ec.DISCARD), slot(2, dur=3)),
             batch(slot(1, dur=5), slot(2, dur=50, hdr=64 | ec.BUSY), slot(3, dur=99)),
             batch(slot(1, dur=(1 << 63) - 1))]
    for data in cases:
        assert mod.scan(data) == flight.scan_pure(memoryview(data)), data[:80]
    assert flight.scan_pure(memoryview(cases[5])) == (1, 5)
    assert flight.scan_pure(memoryview(cases[3])) == (1, -1)

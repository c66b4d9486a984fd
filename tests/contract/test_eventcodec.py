"""The ring-buffer record encoder: synthetic binary records in, JSON lines out,
checked against the documented fields of schema.RECORDS."""

from __future__ import annotations

import struct

import orjson
import pytest

from pstate.kernel import eventcodec as ec
from pstate.stream import schema
from pstate.kernel.eventcodec import REC_FMT, Encoder
from pstate.kernel.kstates import KernelStates
from pstate.stream.streamio import check_record

KS = KernelStates(report_mask=0xFF, preempt_bit=0x100,
                  letters={1: "S", 2: "D", 4: "T", 8: "t", 16: "X", 32: "Z", 64: "P", 128: "I"})
K = ec.ST_KERNEL
SLEEPING, DISK, ZOMBIE = K | 1, K | 2, K | 0x20


def rec(*, typ=ec.EV_STATE, cause=1, ts=1_000, dur=5_000, pid=100, tid=101, opid=0, otid=0, kstate=0,
        frm=ec.CODES["running"], to=SLEEPING, cpu=1, prio=120, flags=0, comm=b"worker", hdr=88, stack=0,
        cgroup=0, run=ec.NO_DUR) -> bytes:
    return struct.pack(REC_FMT, hdr, 0, ts, dur, pid, tid, opid, otid, kstate, frm, to, cpu, typ, cause,
                       prio, flags, comm, stack, cgroup, run)


@pytest.fixture(autouse=True, params=["native", "pure"])
def encoder_path(request, monkeypatch):
    """Every test here runs on the C loop and on the Python one."""
    if request.param == "pure":
        monkeypatch.setattr(ec, "_encode", None)
    elif ec._encode is None:
        pytest.skip("pstate._encode is not built (or PSTATE_PURE=1)")
    return request.param


def encode(*records: bytes, enc: Encoder | None = None):
    enc = enc or Encoder(KS, resolve_tgid=lambda tid: 0)
    lines, consumed = enc.encode(memoryview(b"".join(records)), len(records))
    return [orjson.loads(x) for x in lines], consumed, lines


def documented(rec: dict) -> set:
    return set(schema.COMMON_FIELDS) | set(schema.RECORDS[rec["type"]][1])


def test_record_layout_matches_the_bpf_struct():
    assert struct.calcsize(REC_FMT) == 8 + ec.EVENT_SIZE == 96  # one ring buffer slot, 8-aligned


def test_switch_out_voluntary():
    (r,), n, lines = encode(rec(cause=1, kstate=1, flags=ec.F_VOLUNTARY, otid=7, cgroup=4242))
    assert n == 1 and lines[0].endswith("\n") and lines[0].count("\n") == 1
    assert r == {"type": "state", "ts": 1000, "cpu": 1, "pid": 100, "tid": 101, "comm": "worker", "cgroup": 4242,
                 "from": "running", "to": "sleeping", "dur_ns": 5000, "cause": "switch_out",
                 "voluntary": True, "kstate": "S", "prio": 120, "next_tid": 7}


@pytest.mark.parametrize("run, steal", [(4_200, 800), (5_000, 0), (5_300, -300)])
def test_switch_out_with_the_kernels_count_says_the_rest_as_steal_irq(run, steal):
    """steal_irq_ns: dur_ns less the slice's on-CPU time by the kernel's
    count; a little below 0 where the kernel read its clock before the
    tracepoint at both ends unevenly."""
    (r,), _, _ = encode(rec(cause=1, kstate=1, flags=ec.F_VOLUNTARY, otid=7, run=run))
    assert (r["dur_ns"], r["steal_irq_ns"]) == (5000, steal)
    assert list(r)[-2:] == ["steal_irq_ns", "cgroup"]


def test_switch_out_without_the_kernels_count_has_neither_and_without_its_start_the_count_alone():
    (a, b, c), _, _ = encode(rec(cause=1, kstate=1, run=ec.NO_DUR), rec(cause=1, kstate=1, dur=ec.NO_DUR, run=7),
                             rec(cause=1, kstate=1, dur=ec.NO_DUR, run=ec.NO_DUR))
    assert not {"steal_irq_ns", "run_ns"} & (set(a) | set(c))
    assert (b["dur_ns"], b["run_ns"]) == (None, 7) and "steal_irq_ns" not in b


def test_context_records_of_a_filtered_recording():
    """slice: a switch-out of a task not followed; waker: a waker's name."""
    (s, w), _, _ = encode(rec(typ=ec.EV_SLICE, otid=7, dur=4_000), rec(typ=ec.EV_WAKER, tid=55, pid=50, comm=b"wk"))
    assert s == {"type": "slice", "ts": 1000, "cpu": 1, "pid": 100, "tid": 101, "comm": "worker", "dur_ns": 4000,
                 "next_tid": 7}
    assert w == {"type": "waker", "ts": 1000, "cpu": 1, "pid": 50, "tid": 55, "comm": "wk"}
    assert set(s) == documented(s) and set(w) == documented(w)


def test_switch_out_preempted_with_plus_bit():
    (r,), _, _ = encode(rec(cause=1, kstate=0x100, to=ec.CODES["preempted"], prio=-51))
    assert (r["to"], r["voluntary"], r["kstate"], r["prio"]) == ("preempted", False, "R+", -51)


def test_switch_in():
    (r,), _, _ = encode(rec(cause=2, frm=ec.CODES["runnable"], to=ec.CODES["running"], otid=9, dur=12))
    assert r == {"type": "state", "ts": 1000, "cpu": 1, "pid": 100, "tid": 101, "comm": "worker", "cgroup": None,
                 "from": "runnable", "to": "running", "dur_ns": 12, "cause": "switch_in", "prio": 120,
                 "prev_tid": 9}


@pytest.mark.parametrize("cause, name", [(3, "wakeup"), (4, "wakeup_new")])
def test_wakeups(cause, name):
    frm = SLEEPING if cause == 3 else ec.CODES["new"]
    (r,), _, _ = encode(rec(cause=cause, frm=frm, to=ec.CODES["runnable"], opid=17, otid=18, kstate=3))
    assert r == {"type": "state", "ts": 1000, "cpu": 1, "pid": 100, "tid": 101, "comm": "worker", "cgroup": None,
                 "from": "sleeping" if cause == 3 else "new", "to": "runnable", "dur_ns": 5000,
                 "cause": name, "waker_tid": 18, "waker_pid": 17, "target_cpu": 3}


def test_reap():
    (r,), _, _ = encode(rec(cause=5, frm=ZOMBIE, to=ec.CODES["reaped"]))
    assert r == {"type": "state", "ts": 1000, "cpu": 1, "pid": 100, "tid": 101, "comm": "worker", "cgroup": None,
                 "from": "zombie", "to": "reaped", "dur_ns": 5000, "cause": "reap"}


class Met:
    """A stand-in for the recorder's Identities: the cgroup ids it is told of."""

    def __init__(self):
        self.met = []

    def seen(self, pid, tid, comm):
        pass

    def cgroup_met(self, cgid):
        self.met.append(cgid)


def test_cgroup_ids_tell_the_identities_once_and_lifecycle_records_carry_none():
    enc = Encoder(KS, resolve_tgid=lambda tid: 0)
    enc.identity = Met()
    recs, _, _ = encode(rec(cgroup=7), rec(tid=5, cgroup=7), rec(cgroup=2**64 - 1), rec(cgroup=0),
                        rec(typ=ec.EV_EXIT, cgroup=9), enc=enc)
    assert [r.get("cgroup", "-") for r in recs] == [7, 7, 2**64 - 1, None, "-"]
    assert sorted(enc.identity.met) == [7, 2**64 - 1]


def test_lifecycle_events():
    recs, n, _ = encode(rec(typ=ec.EV_FORK, opid=100, otid=102, flags=ec.F_THREAD),
                        rec(typ=ec.EV_FORK, opid=200, otid=200),
                        rec(typ=ec.EV_EXEC, otid=105),
                        rec(typ=ec.EV_EXIT, flags=ec.F_GROUP_DEAD),
                        rec(typ=ec.EV_EXIT))
    assert n == 5
    task = {"ts": 1000, "cpu": 1, "pid": 100, "tid": 101, "comm": "worker"}
    assert recs == [
        {"type": "fork", **task, "child_pid": 100, "child_tid": 102, "thread": True},
        {"type": "fork", **task, "child_pid": 200, "child_tid": 200, "thread": False},
        {"type": "exec", **task, "old_tid": 105},
        {"type": "exit", **task, "group_dead": True},
        {"type": "exit", **task, "group_dead": False},
    ]


def test_every_emitted_field_is_documented_and_every_record_valid():
    recs, _, _ = encode(*(rec(cause=c) for c in ec.CAUSES),
                        *(rec(typ=t) for t in (ec.EV_FORK, ec.EV_EXEC, ec.EV_EXIT)))
    assert {r["type"] for r in recs} == set(schema.EVENT_TYPES)
    assert {r["cause"] for r in recs if r["type"] == "state"} == set(schema.CAUSES)
    for r in recs:
        assert set(r) <= documented(r), set(r) - documented(r)
        assert check_record(r) is None
        for name, (jtype, _desc) in {**schema.COMMON_FIELDS, **schema.RECORDS[r["type"]][1]}.items():
            if not jtype.endswith("?"):
                assert name in r, (r["type"], name)


def test_busy_record_stops_the_batch():
    recs, consumed, _ = encode(rec(ts=1), rec(ts=2), rec(ts=3, hdr=88 | ec.BUSY), rec(ts=4))
    assert consumed == 2
    assert [r["ts"] for r in recs] == [1, 2]


def test_discarded_records_are_consumed_but_not_written():
    recs, consumed, _ = encode(rec(ts=1), rec(ts=2, hdr=88 | ec.DISCARD), rec(ts=3))
    assert consumed == 3
    assert [r["ts"] for r in recs] == [1, 3]


def test_unknown_event_type_is_consumed_silently():
    recs, consumed, _ = encode(rec(typ=9), rec(ts=2))
    assert consumed == 2 and [r["ts"] for r in recs] == [2]


def test_no_duration_is_null_and_max_values_survive():
    (a, b), _, _ = encode(rec(dur=ec.NO_DUR, frm=ec.CODES["unknown"]),
                          rec(ts=2**63 - 1, dur=2**63 - 2, pid=2**32 - 1, tid=2**32 - 2, cpu=65535))
    assert a["dur_ns"] is None and a["from"] == "unknown"
    assert (b["ts"], b["dur_ns"], b["pid"], b["tid"], b["cpu"]) == (2**63 - 1, 2**63 - 2, 2**32 - 1, 2**32 - 2, 65535)
    assert check_record(b) is None


@pytest.mark.parametrize("raw, text", [
    (b'say "hi"', 'say "hi"'),
    (b"back\\slash", "back\\slash"),
    (b"tab\tnl\n", "tab\tnl\n"),
    (b"\xff\xfebad", "\ufffd\ufffdbad"),
    (b"kworker/0:1H-kb", "kworker/0:1H-kb"),  # 15 bytes, no NUL in the field
    (b"ab\0garbage", "ab"),  # bytes after the NUL are stale
    (b"", ""),
    ("日本".encode(), "日本"),
    (b"\xe6\x97", "\ufffd"),  # a multi-byte character cut at 15 bytes
])
def test_comm_escaping(raw, text):
    (r,), _, lines = encode(rec(comm=raw))
    assert r["comm"] == text
    lines[0].encode("utf-8")  # the line itself is valid UTF-8


def test_state_codes_outside_the_tables():
    (r,), _, _ = encode(rec(frm=K | 0x3, to=77))
    assert r["from"] == "sleeping"  # S|D: named by the lowest bit
    assert r["to"] == "state_77"


def test_kernel_letters_for_every_reported_combination():
    enc = Encoder(KS, resolve_tgid=lambda tid: 0)
    recs, _, _ = encode(*(rec(kstate=k) for k in (0, 1, 2, 0x101, 0x3)), enc=enc)
    assert [r["kstate"] for r in recs] == ["R", "S", "D", "S+", "S|D"]


def test_tgid_resolution_fallback():
    calls = []

    def resolve(tid):
        calls.append(tid)
        return {201: 200}.get(tid, 0)

    enc = Encoder(KS, resolve_tgid=resolve)
    recs, _, _ = encode(
        rec(pid=0, tid=201),  # unknown tgid: asked of /proc (here: the resolver)
        rec(pid=0, tid=201),  # cached: not asked again
        rec(pid=300, tid=301),  # tgid known from the event
        rec(pid=0, tid=301),  # learnt from the earlier event
        rec(pid=0, tid=999),  # gone: pid 0
        rec(pid=0, tid=0, comm=b"swapper/0"),  # idle task: never asked
        enc=enc)
    assert [r["pid"] for r in recs] == [200, 200, 300, 300, 0, 0]
    assert calls == [201, 999]


def test_comm_change_refreshes_the_cached_prefix():
    recs, _, _ = encode(rec(comm=b"python3"), rec(typ=ec.EV_EXEC, comm=b"sleep"), rec(comm=b"sleep"))
    assert [r["comm"] for r in recs] == ["python3", "sleep", "sleep"]


def test_tgid_from_proc_of_this_process():
    import os
    import threading

    assert ec.tgid_from_proc(os.getpid()) == os.getpid()
    assert ec.tgid_from_proc(threading.get_native_id()) == os.getpid()
    assert ec.tgid_from_proc(2**31 - 1) == 0


def test_state_filter_codes_and_mask_bits():
    assert ec.state_code("running", KS) == 1
    assert ec.state_code("uninterruptible", KS) == K | 2
    assert ec.state_code("waking", KS) is None
    assert ec.state_mask_bit(ec.state_code("preempted", KS)) == 1 << 3
    assert ec.state_mask_bit(K | 2) == 2 << 16
    assert ec.state_mask_bit(K | 0x80) == 0x80 << 16


def test_empty_view():
    assert Encoder(KS).encode(memoryview(b""), 0) == ([], 0)


def test_unknown_cause_is_named_not_fatal():
    (r,), n, _ = encode(rec(cause=9))
    assert n == 1 and r["cause"] == "cause_9"

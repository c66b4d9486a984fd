"""The C loop of eventcodec.Encoder (pstate._encode) writes the same bytes as
the Python loop, on crafted batches that reach every branch and on random
records, and asks the Python side for the same things (resolve_tgid calls)."""

from __future__ import annotations

import mmap
import struct
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pstate.kernel import eventcodec as ec
from pstate.kernel.eventcodec import REC_FMT, Encoder
from pstate.kernel.kstates import KernelStates, read_kernel_states

pytestmark = pytest.mark.skipif(ec._encode is None, reason="pstate._encode is not built (or PSTATE_PURE=1)")

KS = KernelStates(report_mask=0xFF, preempt_bit=0x100,
                  letters={1: "S", 2: "D", 4: "T", 8: "t", 16: "X", 32: "Z", 64: "P", 128: "I"})
K = ec.ST_KERNEL
STRIDE = struct.calcsize(REC_FMT)


def running_kernel_states() -> KernelStates | None:
    try:
        return read_kernel_states()
    except (OSError, ValueError):
        return None


def rec(*, typ=ec.EV_STATE, cause=1, ts=1_000, dur=5_000, pid=100, tid=101, opid=0, otid=0, kstate=0,
        frm=ec.CODES["running"], to=K | 1, cpu=1, prio=120, flags=0, comm=b"worker", hdr=88, stack=0,
        cgroup=0, run=ec.NO_DUR) -> bytes:
    return struct.pack(REC_FMT, hdr, 0, ts, dur, pid, tid, opid, otid, kstate, frm, to, cpu, typ, cause,
                       prio, flags, comm, stack, cgroup, run)


class Resolver:
    """A stand-in for /proc: some threads known, the rest gone; logs calls."""

    def __init__(self):
        self.calls = []

    def __call__(self, tid):
        self.calls.append(tid)
        return 0 if tid % 3 == 0 else tid // 10 * 10


class FakeStacks:
    """A stand-in for pstate.kernel.stacks.StackTable: a tail per kernel id."""

    def __init__(self):
        self.calls = []

    def tail(self, kid, since):
        self.calls.append((kid, since))
        return "" if kid % 4 == 3 else f',"stack_id":{kid // 2},"reason":"f\\u00e9{kid}é{since}"'


class CgroupsMet:
    """A stand-in for the recorder's Identities: the cgroup ids it is told of."""

    def __init__(self):
        self.met = set()

    def seen(self, pid, tid, comm):
        pass

    def cgroup_met(self, cgid):
        self.met.add(cgid)


def both(batches, ks=KS, stacks=False):
    """Encode the batches with a native and a pure Encoder; check all agrees.

    Returns the pure lines of every batch."""
    r_nat, r_pure, r_bytes = Resolver(), Resolver(), Resolver()
    nat, pure, byt = (Encoder(ks, resolve_tgid=r) for r in (r_nat, r_pure, r_bytes))
    assert nat._native is not None and byt._native is not None
    if stacks:
        for e in (nat, pure, byt):
            e.stacks = FakeStacks()
    for e in (nat, pure, byt):
        e.identity = CgroupsMet()
    out = []
    for batch in batches:
        view = memoryview(batch)
        want, want_n = pure.encode_pure(view, len(batch) // STRIDE)
        got, got_n = nat.encode(view, len(batch) // STRIDE)
        assert all(type(x) is str for x in got)
        assert (got, got_n) == (want, want_n)
        data, nlines, consumed = byt.encode_bytes(view, len(batch) // STRIDE)
        assert (data, nlines, consumed) == ("".join(want).encode(), len(want), want_n)
        out.append(want)
    assert r_nat.calls == r_pure.calls == r_bytes.calls
    assert nat.identity.met == pure.identity.met == byt.identity.met  # each cgroup id named told of
    if stacks:
        assert nat.stacks.calls == pure.stacks.calls == byt.stacks.calls
    return out


def test_wakeups_with_stacks_carry_the_same_tail():
    # the blocked state's start goes with the id: ts - dur, 0 when not known
    recs = [rec(cause=c, stack=s, flags=f, frm=K | 2, to=ec.CODES["runnable"], ts=ts, dur=dur)
            for c in (ec._D["CAUSE_WAKEUP"], ec._D["CAUSE_SWITCH_OUT"]) for s in (0, 1, 2, 3, 4, 2**32 - 1)
            for f in (0, ec.F_WAKER_IRQ)
            for ts, dur in ((1_000, 5_000), (9_000, 5_000), (2**64 - 2, 2**63), (7_000, ec.NO_DUR), (5, 5))]
    (lines,) = both([b"".join(recs)], stacks=True)
    assert any("é4000" in x for x in lines) and any("é0" in x for x in lines)
    with_stack = [x for x in lines if "stack_id" in x]
    assert with_stack and all('"cause":"wakeup"' in x for x in with_stack)
    assert not any("stack_id" in x for x in lines if "switch_out" in x)


COMMS = [b"worker", b"", b"kworker/0:1H-kb", b"ab\0garbage", b'say "hi"', b"back\\slash", b"tab\tnl\n",
         bytes(range(1, 16)), b"\x7f\x1f\x00", b"\xff\xfebad", "日本".encode(), b"\xe6\x97",
         "x\u2028y\u2029".encode(), b"\xed\xa0\x80surrogate", b"\xf4\x90\x80\x80big", "é".encode() * 7 + b"e",
         b"A" * 16, b"\x80" * 16]


def test_every_record_kind_cause_and_flag():
    recs = []
    for cause in (0, 1, 2, 3, 4, 5, 6, 9, 255):
        for flags in (0, 1, 2, 4, 7, 255):
            recs.append(rec(cause=cause, flags=flags, kstate=cause * 3, opid=7, otid=8))
    for typ in (0, 1, 2, 3, 4, 5, 6, 7, 200, 255):
        for flags in (0, 1, 2, 4, 7):
            recs.append(rec(typ=typ, flags=flags, opid=2**32 - 1, otid=12))
    (lines,) = both([b"".join(recs)])
    assert len(lines) == 9 * 6 + 6 * 5


def test_numbers_at_their_limits():
    recs = []
    for v in (0, 1, 9, 10, 99, 100, 12345, 2**32 - 1, 2**63, ec.NO_DUR - 1):
        recs.append(rec(ts=v, dur=v, pid=v & 0xFFFFFFFF, tid=(v & 0xFFFFFFFF) or 5,
                        opid=v & 0xFFFFFFFF, otid=v & 0xFFFFFFFF, kstate=v & 0xFFFFFFFF, cpu=v & 0xFFFF))
    for prio in (-32768, -51, -1, 0, 1, 99, 120, 139, 32767):
        for cause in (1, 2):
            recs.append(rec(prio=prio, cause=cause))
    recs.append(rec(dur=ec.NO_DUR, frm=ec.CODES["unknown"]))
    recs.append(rec(ts=ec.NO_DUR, dur=ec.NO_DUR))
    both([b"".join(recs)])


def test_every_state_code_and_kernel_letter():
    for ks in filter(None, (KS, running_kernel_states())):
        codes = sorted(Encoder(ks)._all_names()) + [6, 77, 0xFFF, K, K | 0xFFF, K | 0x3, 0xFFFF]
        recs = [rec(frm=a, to=b) for a in codes for b in codes[:12]]
        kstates = [0, ks.preempt_bit, ks.report_mask, ks.report_mask | ks.preempt_bit, 2**32 - 1, 0x10000]
        kstates += [bits | p for bits in range(ks.report_mask + 1) if bits & ~ks.report_mask == 0
                    for p in (0, ks.preempt_bit)][:1024]
        recs += [rec(kstate=k, flags=v) for k in kstates for v in (0, ec.F_VOLUNTARY)]
        both([b"".join(recs)], ks)


def test_voluntary_flag_is_not_taken_from_an_earlier_record_with_the_same_kstate():
    (lines,) = both([rec(kstate=1, flags=ec.F_VOLUNTARY) + rec(kstate=1, flags=0)])
    assert '"voluntary":true' in lines[0] and '"voluntary":false' in lines[1]


@pytest.mark.parametrize("comm", COMMS)
def test_odd_comms(comm):
    both([rec(comm=comm) + rec(typ=ec.EV_EXEC, comm=comm) + rec(comm=b"plain") + rec(comm=comm)])


def test_busy_and_discarded_records():
    batch = [rec(ts=1), rec(ts=2, hdr=88 | ec.DISCARD), rec(ts=3, hdr=88 | ec.DISCARD | 0x1234),
             rec(ts=4), rec(ts=5, hdr=88 | ec.BUSY), rec(ts=6)]
    (lines,) = both([b"".join(batch)])
    assert len(lines) == 2
    both([rec(hdr=ec.BUSY | ec.DISCARD)])  # busy wins
    both([b""])


def test_unknown_types_still_learn_the_tgid():
    # as in Python: the pid/tid/comm prefix is made before the type is looked at
    (lines,) = both([rec(typ=9, pid=500, tid=503) + rec(pid=0, tid=503) + rec(typ=0, pid=0, tid=906)
                     + rec(pid=0, tid=906)])
    assert '"pid":500' in lines[0]


def test_tgid_resolution_calls_match_across_batches():
    batches = []
    for b in range(4):
        batches.append(b"".join(rec(pid=(tid // 10 * 10) if (tid + b) % 4 == 0 else 0, tid=tid,
                                    comm=COMMS[(tid + b // 2) % len(COMMS)])
                                for tid in range(1, 60)))
    both(batches)


def test_prefix_cache_empties_at_the_same_size():
    # tgid 0 with a resolver that finds nothing is not cached in _tgid: the
    # resolver is asked again exactly when the prefix cache forgot the thread.
    n = (1 << 18) + 5
    batch = b"".join(rec(pid=0, tid=t, typ=9, comm=b"x") for t in range(1, n + 1))
    edge = (1 << 18) + 1  # the last one stored before the clear
    again = b"".join(rec(pid=0, tid=t, comm=b"x") for t in (1, 2, edge, edge + 1, n))
    calls = {}
    for path in ("native", "pure"):
        log = []
        enc = Encoder(KS, resolve_tgid=lambda tid: log.append(tid) or 0)
        f = enc.encode if path == "native" else enc.encode_pure
        f(memoryview(batch), n)
        lines, _ = f(memoryview(again), 5)
        calls[path] = (log[n:], lines)
    assert calls["native"] == calls["pure"]
    assert calls["pure"][0] == [1, 2, edge]  # forgotten at the clear; the ones after it kept


def test_long_lines_grow_the_buffer():
    esc = bytes(range(1, 16)) + b"\x01"  # 6 bytes each once escaped
    batch = b"".join(rec(tid=t, comm=esc, cause=t % 6) for t in range(1, 20_000))
    (lines,) = both([batch])
    assert len(lines) == 19_999


def test_buffer_kinds_and_alignment():
    batch = b"".join(rec(ts=t, tid=t % 7 + 1) for t in range(40))
    want = Encoder(KS).encode_pure(memoryview(batch), 40)
    enc = Encoder(KS, resolve_tgid=lambda tid: 0)
    enc2 = Encoder(KS, resolve_tgid=lambda tid: 0)
    assert enc.encode(batch, 40) == want  # bytes
    assert enc.encode(bytearray(batch), 40) == want
    unaligned = memoryview(b"\0" + batch)[1:]
    assert enc2.encode(unaligned, 40) == want
    with mmap.mmap(-1, len(batch) + 4096) as m:  # like the ring buffer's mapping
        m[8:8 + len(batch)] = batch
        v = memoryview(m)[8:8 + len(batch)]
        assert enc.encode(v, 40) == want
        v.release()  # no export left behind


def test_bad_buffers_raise_like_python():
    enc = Encoder(KS)
    for bad in (b"x" * 71, b"x" * 73, memoryview(b"x" * 100)):
        with pytest.raises(struct.error) as native_err:
            enc.encode(bad, 1)
        with pytest.raises(struct.error) as pure_err:
            enc.encode_pure(bad, 1)
        assert str(native_err.value) == str(pure_err.value)
    for bad in (5, None, "text"):
        with pytest.raises(TypeError):
            enc.encode(bad, 1)
        with pytest.raises(TypeError):
            enc.encode_pure(bad, 1)


def test_errors_from_python_propagate_and_leave_the_encoder_usable():
    def boom(tid):
        raise OSError("proc gone")

    enc = Encoder(KS, resolve_tgid=boom)
    with pytest.raises(OSError, match="proc gone"):
        enc.encode(rec(pid=0, tid=5), 1)
    enc.resolve_tgid = lambda tid: 0
    assert enc.encode(rec(pid=0, tid=5), 1) == enc.encode_pure(rec(pid=0, tid=5), 1)

    class BadText(Encoder):
        def mid_text(self, frm, to):
            return 5

    with pytest.raises(TypeError, match="mid_text must return str"):
        BadText(KS).encode(rec(), 1)
    with pytest.raises(TypeError):
        BadText(KS).encode_bytes(rec(), 1)


def test_reentry_is_refused():
    enc = Encoder(KS)
    enc.resolve_tgid = lambda tid: enc.encode(rec(), 1) and 0
    with pytest.raises(RuntimeError, match="again while encoding"):
        enc.encode(rec(pid=0, tid=5), 1)
    enc.resolve_tgid = lambda tid: 0
    assert enc.encode(rec(pid=0, tid=5), 1)[1] == 1


def test_no_references_leak():
    enc = Encoder(KS, resolve_tgid=lambda tid: 0)
    batch = b"".join(rec(tid=t % 50 + 1, cause=t % 6, typ=t % 5, comm=COMMS[t % len(COMMS)]) for t in range(500))
    view = memoryview(batch)
    enc.encode(view, 500)
    before = sys.getrefcount(enc), sys.getrefcount(batch), sys.getrefcount(view)
    for _ in range(50):
        enc.encode(view, 500)
        enc.encode_bytes(view, 500)
    assert (sys.getrefcount(enc), sys.getrefcount(batch), sys.getrefcount(view)) == before


def test_joined_lines_stay_intact_while_held():
    enc = Encoder(KS, resolve_tgid=lambda tid: 0)
    batches = [b"".join(rec(ts=i * 100 + t, tid=t + 1) for t in range(i + 1)) for i in range(6)]
    want = [b"".join(x.encode() for x in Encoder(KS).encode_pure(b, 0)[0]) for b in batches]
    held = [enc.encode_bytes(b, 0)[0] for b in batches]  # all held at once
    assert [bytes(h) for h in held] == want
    assert all(h.readonly for h in held)
    with pytest.raises(TypeError):
        held[0][0] = 1
    for b, w in zip(batches, want):  # one at a time, the way record drains
        data, n, _ = enc.encode_bytes(b, 0)
        assert bytes(data) == w and n == w.count(b"\n")
    first = enc.encode_bytes(batches[5], 0)[0]
    keep = memoryview(first)  # a second export of the same chunk
    del first
    enc.encode_bytes(batches[0], 0)
    enc.encode_bytes(batches[1], 0)
    assert bytes(keep) == want[5]


def test_cache_sizes_follow_the_records():
    enc = Encoder(KS, resolve_tgid=lambda tid: 0)
    enc.encode(rec(tid=1) + rec(tid=2, to=K | 2, cgroup=5) + rec(tid=1, kstate=1, flags=1, cgroup=6), 3)
    assert enc._native.cache_sizes() == {"prefixes": 2, "mids": 2, "tails": 2, "cgroups": 3}


def test_record_uses_the_native_loop():
    assert Encoder(KS)._native is not None


# ---- random records ----

u32 = st.integers(0, 2**32 - 1)
kstates = st.one_of(st.sampled_from([0, 1, 2, 3, 0x100, 0x101, 0x80, 0x400, 2**32 - 1]), u32)
codes = st.one_of(st.sampled_from(sorted(ec.SYNTHETIC) + [K | 1, K | 2, K | 3, K | 0x20, K | 0x80, K, 77]),
                  st.integers(0, 0xFFFF))
comms = st.one_of(st.sampled_from(COMMS), st.binary(max_size=16))
records = st.builds(
    rec,
    typ=st.one_of(st.sampled_from([1, 1, 1, 2, 3, 4]), st.integers(0, 255)),
    cause=st.one_of(st.sampled_from([1, 2, 3, 4, 5]), st.integers(0, 255)),
    ts=st.integers(0, 2**64 - 1), dur=st.one_of(st.just(ec.NO_DUR), st.integers(0, 2**64 - 1)),
    pid=st.one_of(st.just(0), st.sampled_from([100, 200]), u32), tid=st.one_of(st.integers(0, 12), u32),
    opid=u32, otid=u32, kstate=kstates, frm=codes, to=codes, cpu=st.integers(0, 0xFFFF),
    prio=st.integers(-32768, 32767), flags=st.integers(0, 255), comm=comms,
    cgroup=st.one_of(st.sampled_from([0, 1, 4026531835]), st.integers(0, 2**64 - 1)),
    hdr=st.sampled_from([80] * 12 + [80 | ec.DISCARD, 80 | ec.BUSY, 0, ec.DISCARD | 7]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(records, max_size=30), min_size=1, max_size=4))
def test_random_records_match(batches):
    both([b"".join(b) for b in batches])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(records, max_size=20), min_size=1, max_size=3))
def test_random_records_match_on_the_running_kernels_table(batches):
    ks = running_kernel_states()
    if ks is None:
        pytest.skip("tracefs not readable")
    both([b"".join(b) for b in batches], ks)

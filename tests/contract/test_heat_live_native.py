"""The native reader of heat --live (pstate._digest.parse_states) gives
exactly what the pure-Python Feeder gives: the same model, the same frames,
the same ReadStats and errors, on fixtures, on lines it must leave to the
careful path (spliced among plain ones, in chunks of several sizes, with and
without a last newline), with decimation, filters and maps of every kind,
and on random spellings of records. Window.states (the batch the Feeder
uses) agrees with one state() call per record."""

from __future__ import annotations

import os

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from odd_lines import ODD_LINES
from pstate.render import heatmodel as hm
from pstate.render import heatdraw as hr
from pstate import native
from pstate.engines import live
from pstate.render import dashboard
from pstate.stream import reader
from pstate.exitcodes import PstateError
from pstate.stream.filters import Filter
from pstate.stream.streamio import ReadStats
from conftest import TESTS, jsonl, state_record

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
NATIVE = reader._parse_states if reader._parse_states is not None else getattr(
    native.load("_digest"), "parse_states", None)
SMALL = TESTS / "data" / "heat" / "small.jsonl"

pytestmark = pytest.mark.skipif(NATIVE is None and not IN_CI and not native.PURE,
                                reason="pstate._digest not built (no C compiler?)")


def test_native_reader_is_built():
    """CI must test the native path, not fall back to the pure one quietly."""
    if native.PURE:
        pytest.skip("PSTATE_PURE is set")
    assert NATIVE is not None, "pstate._digest did not build or import: pip install -e . needs gcc and python3-dev"
    assert reader._parse_states is NATIVE


# --- running a Feeder both ways -------------------------------------------------------


def model_state(m: hm.Window) -> tuple:
    """Everything a Window holds, dict orders included."""
    return (m.n_events, m.n_samples, m.first_ts, m.last_ts, m.start_ts, m.end_ts, m.wall_ns, m.hosts,
            m.input_sample_every, list(m.comm.items()), list(m.events.items()), list(m.open.items()),
            [(c, list(col.items())) for c, col in m.grid.cols.items()], list(m.lat.items()))


def frame(m: hm.Window, opts: live.LiveOptions) -> list[str]:
    dash = dashboard.Dashboard(opts, -1, False)
    dash.bucket, dash.ncols = m.bucket, m.ncols
    return dash.frame(m, lambda n: f"{n} tasks")


def run(data: bytes, chunk: int, *, use_native: bool, k: int = 1, by: str = "tid", measure=None,
        filt=None, strict: bool = False, shade=None, max_line: int | None = None):
    saved = reader._parse_states, live.MAX_LINE
    reader._parse_states = NATIVE if use_native else None
    if max_line is not None:
        live.MAX_LINE = max_line
    try:
        opts = live.LiveOptions(by=by, measure=measure, shade=shade, width=100, height=20, filt=filt,
                                style=hr.PLAIN, window_ns=50_000_000)
        model = hm.Window(1_000_000, 50, by, filt, measure)
        model.sample_every = k
        stats = ReadStats()
        f = live.Feeder(model, stats, "in.jsonl", strict)
        f.k = k
        err = None
        try:
            for i in range(0, len(data), chunk):
                f.feed(data[i:i + chunk])
            f.finish()
        except PstateError as e:
            err = (e.exit_code, e.message)
        return (err, f.n, f.parsed, f.tail, f.discarding, stats.lines, stats.records, stats.skipped,
                stats.first_bad, stats.truncated_tail, stats.metas, stats.loss, stats.ends,
                model_state(model), frame(model, opts))
    finally:
        reader._parse_states, live.MAX_LINE = saved


def both(data: bytes, chunk: int = 1 << 17, **kw):
    a = run(data, chunk, use_native=True, **kw)
    b = run(data, chunk, use_native=False, **kw)
    assert a == b
    return a


def rec(**kw) -> dict:
    return state_record(**{"ts": 1_000_000, **kw})


lines = jsonl


FROM = ["running", "sleeping", "runnable", "preempted", "running", "uninterruptible"]
TO = ["sleeping", "runnable", "running", "running", "uninterruptible", "runnable"]
PLAIN = [rec(ts=1_000_000 + i * 170_000, tid=11 + i % 5, pid=10 + i % 2, comm=f"w{i % 3}",
             dur_ns=(i * 7919) % 3_000_000 or None, cpu=i % 2, **{"from": FROM[i % 6], "to": TO[i % 6]})
         for i in range(300)]


# --- fixtures ------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000, 1 << 17])
def test_fixture_file_agrees(chunk):
    out = both(SMALL.read_bytes(), chunk)
    assert out[0] is None and out[1] == 245 and out[13][0] > 0
    assert out[11]  # the fixture's loss records were counted


@pytest.mark.parametrize("by", ["tid", "pid", "comm"])
@pytest.mark.parametrize("measure", [None, "oncpu", "wait"])
@pytest.mark.parametrize("chunk", [13, 4096])
def test_plain_records_agree(by, measure, chunk):
    out = both(lines(*PLAIN), chunk, by=by, measure=measure)
    assert out[2] == 300


@pytest.mark.parametrize("k", [2, 3, 8])
@pytest.mark.parametrize("measure", [None, "oncpu"])
def test_decimation_agrees(k, measure):
    data = lines(*PLAIN[:100], b'{"type":"exit","ts":2,"cpu":0,"pid":10,"tid":12,"comm":"w","group_dead":false}',
                 *PLAIN[100:])
    out = both(data, 777, k=k, measure=measure)
    assert out[2] < 301


@pytest.mark.parametrize("filt", [
    Filter(pids=(10,)), Filter(tids=(12, 13)), Filter(comms=("w1",)), Filter(states=("uninterruptible",)),
    Filter(cpus=(1,)), Filter(min_dur_ns=1_000_000), Filter(include_idle=True), Filter(comms=("?",)),
])
def test_filters_agree(filt):
    idle = [rec(ts=3_000_000 + i, tid=0, pid=0, comm=None) for i in range(5)]
    data = lines(*PLAIN[:150], *idle, rec(ts=4_000_000, comm=""), *PLAIN[150:])
    both(data, 512, filt=filt)
    both(data, 512, filt=filt, k=4)


def test_idle_is_skipped_alike():
    data = lines(*[rec(ts=1_000_000 + i * 1000, tid=i % 2, pid=0) for i in range(50)])
    out = both(data)
    assert [k for k, _ in out[13][10]] == [1]


# Lines the native reader must leave to the careful path, each beside plain ones.
ODD = ODD_LINES


@pytest.mark.parametrize("i", range(len(ODD)))
@pytest.mark.parametrize("strict", [False, True])
def test_odd_lines_agree(i, strict):
    data = lines(*PLAIN[:50], ODD[i], *PLAIN[50:100])
    for chunk in (1 << 17, 33):
        both(data, chunk, strict=strict)
        both(data, chunk, strict=strict, by="pid", k=3)
    both(data.rstrip(b"\n"), strict=strict)  # and as an unterminated last line
    both(lines(ODD[i]), strict=strict)
    both(ODD[i], strict=strict)  # the only line, unterminated
    both(ODD[i] + b"\n" + lines(*PLAIN[:5]), 5, strict=strict)  # the first line, cut small


def test_all_odd_lines_together():
    mixed = []
    for i, odd in enumerate(ODD):
        if odd != b'{"type":"meta","schema":99,"ts":1}':
            mixed += [PLAIN[i], odd]
    data = lines(*mixed)
    for chunk in (1, 10, 100, 1 << 17):
        for k in (1, 2, 5):
            both(data, chunk, k=k)
            both(data, chunk, k=k, measure="runq", by="comm")


@pytest.mark.parametrize("chunk", [1, 2, 3, 50, 1 << 17])
def test_byte_order_mark_alike(chunk):
    data = b"\xef\xbb\xbf" + lines(b'{"type":"meta","schema":1,"ts":1}', *PLAIN[:30])
    out = both(data, chunk)
    assert out[7] == {} and len(out[10]) == 1
    both(b"\xef\xbb", chunk)
    both(b"\xef\xbb\xbf", chunk)
    both(b"\xef\xbb\xbf\n" + lines(*PLAIN[:3]), chunk)
    both(lines(*PLAIN[:3]) + b"\xef\xbb\xbf" + lines(*PLAIN[3:6]), chunk)  # not at the start: a bad line


@pytest.mark.parametrize("chunk", [7, 64, 190, 1000])
def test_over_long_lines_alike(chunk):
    long = orjson.dumps(rec(comm="x" * 300))
    data = lines(*PLAIN[:20], long, *PLAIN[20:40], long, long, *PLAIN[40:45])
    out = both(data, chunk, max_line=200)
    both(data, chunk, max_line=200, k=2)
    both(data.rstrip(b"\n"), chunk, max_line=200)
    both(lines(*PLAIN[:3]) + long, chunk, max_line=200)  # the unterminated tail is over-long
    if chunk <= 200:
        assert out[7] == {"line longer than 200 bytes": 3}


def test_truncated_final_record_alike():
    data = lines(*PLAIN[:10]) + orjson.dumps(PLAIN[10])[:40]
    out = both(data, 16)
    assert out[9] == "in.jsonl: byte %d, line 11" % len(lines(*PLAIN[:10]))
    out = both(data, 16, strict=True)
    assert out[0][1] == "in.jsonl:11: truncated record"


def test_reaped_and_new_threads_alike():
    recs = []
    for i in range(200):
        tid = 20 + i % 7
        recs.append(rec(ts=1_000_000 + i * 300_000, tid=tid, pid=20, dur_ns=None if i < 7 else 250_000 + i * 5000,
                        **{"from": "running", "to": "reaped" if i % 23 == 0 else "sleeping"}))
    for k in (1, 4):
        both(lines(*recs), 100, k=k)


# --- the reader itself -------------------------------------------------------------------------


def test_parse_states_protocol():
    if NATIVE is None:
        pytest.skip("not built")
    a = orjson.dumps(rec(ts=7, comm="abc", dur_ns=None))
    b = orjson.dumps(rec(ts=8, comm="abc", tid=12))
    data = a + b"\n\n" + b + b"\n{odd}\n" + a
    end = len(data)
    stop, n, rows = NATIVE(data, 0, end, 1 << 20)
    assert (stop, n) == (data.index(b"{odd}"), 3)
    assert rows == [(7, 10, 11, "abc", "running", "sleeping", None, 0, 1, None, None),
                    (8, 10, 12, "abc", "running", "sleeping", 500, 0, 1, None, None)]
    assert rows[0][3] is rows[1][3] and rows[0][4] is rows[1][4] and rows[0][1] is rows[1][1]  # shared
    stop, n, rows = NATIVE(data, data.index(b"{odd}") + 6, end, 1 << 20)
    assert (stop, n, len(rows)) == (end + 1, 1, 1)
    assert NATIVE(data, end + 1, end, 1 << 20) == (end + 1, 0, [])
    assert NATIVE(data, 0, end, 10)[:2] == (0, 0)  # over-long: the caller's
    # decimation: after line n, frequent lines numbered a multiple of k are kept, weighing k
    stop, n, rows = NATIVE(data, 0, end, 1 << 20, 2, 1)  # lines 2, 3, 4
    assert (n, [r[0] for r in rows], [r[8] for r in rows]) == (3, [7, 8], [2, 2])
    stop, n, rows = NATIVE(data, 0, end, 1 << 20, 2, 0)  # lines 1, 2, 3
    assert (stop, n, rows) == (data.index(b"{odd}"), 3, [])
    stop, n, rows = NATIVE(data, 0, end, 1 << 20, 3, 0)
    assert [(r[0], r[8]) for r in rows] == [(8, 3)]


def test_parse_states_bad_arguments_raise():
    if NATIVE is None:
        pytest.skip("not built")
    with pytest.raises(ValueError):
        NATIVE(b"abc", 0, 10, 100)
    with pytest.raises(ValueError):
        NATIVE(b"abc", 5, 2, 100)
    with pytest.raises(ValueError):
        NATIVE(b"abc", 0, 3, 100, 0, 0)
    with pytest.raises(TypeError):
        NATIVE("text", 0, 1, 100)


# --- the batch model call ---------------------------------------------------------------------------


@pytest.mark.parametrize("by", ["tid", "pid", "comm"])
@pytest.mark.parametrize("measure", [None, "oncpu"])
@pytest.mark.parametrize("k", [1, 4])
def test_window_states_equals_state_calls(by, measure, k):
    rows = [(r["ts"], r["pid"], r["tid"], r["comm"] if i % 11 else None, r["from"], r["to"], r["dur_ns"],
             r["cpu"], k, r.get("cgroup"), r.get("steal_irq_ns")) for i, r in enumerate(PLAIN)]
    rows += [(90_000_000, 0, 0, "idle", "running", "idle", 5, 0, 1, None, None),
             (1, 3, 3, "", "x", "reaped", 10**9, 0, 1, 42, None)]
    a = hm.Window(700_000, 40, by, None, measure)
    b = hm.Window(700_000, 40, by, None, measure)
    a.sample_every = b.sample_every = k
    for skip_idle in (True, False):
        for i in range(0, len(rows), 37):
            a.states(rows[i:i + 37], skip_idle)
        for ts, pid, tid, comm, frm, to, dur, _cpu, w, cg, _steal in rows:
            if not (skip_idle and tid == 0):
                b.state(ts, pid, tid, comm or "?", frm, to, dur, w, cg)
        assert model_state(a) == model_state(b)


# --- random spellings of records --------------------------------------------------------------------

names = st.sampled_from(["running", "runnable", "preempted", "sleeping", "uninterruptible", "stopped",
                         "unknown", "zombie", "reaped", "state_Q"])
comms = st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["java", "kworker/0:1", "a b", "", '"to":"run']))
ints = st.one_of(st.integers(0, 5000), st.integers(0, 200_000_000), st.integers(0, (1 << 63) - 1),
                 st.integers(-3, 3), st.sampled_from([1 << 47, 1 << 63, 1.5, True, None, "7"]))
ws = st.sampled_from(["", " ", "\t", "\r"])


@st.composite
def spelled(draw) -> bytes:
    r = {"type": draw(st.sampled_from(["state"] * 10 + ["exit", "loss", "meta", "end"])),
         "ts": draw(st.one_of(st.integers(1_000_000, 300_000_000), ints)), "cpu": draw(ints),
         "pid": draw(st.integers(0, 40)), "tid": draw(st.integers(0, 60)), "comm": draw(comms),
         "from": draw(names), "to": draw(names), "dur_ns": draw(st.one_of(st.none(), st.integers(0, 90_000_000),
                                                                           ints))}
    for k in draw(st.lists(st.sampled_from(list(r)), max_size=2)):
        r.pop(k, None)
    extra = draw(st.dictionaries(st.sampled_from(["cause", "prio", "schema", "reason", "count", "x"]),
                                 st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 40), st.text(max_size=5)),
                                 max_size=3))
    r.update(extra)
    items = list(r.items())
    order = draw(st.permutations(range(len(items))))
    sep = draw(ws)

    def value(v) -> str:
        return repr(v) if isinstance(v, float) else orjson.dumps(v).decode()

    body = ("," + sep).join(f"{orjson.dumps(items[i][0]).decode()}{draw(ws)}:{sep}{value(items[i][1])}"
                            for i in order)
    return (draw(ws) + "{" + body + "}" + draw(ws)).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(st.one_of(spelled(), st.sampled_from(ODD)), max_size=40),
       by=st.sampled_from(["pid", "tid", "comm"]), measure=st.sampled_from([None, None, "wait"]),
       chunk=st.sampled_from([1, 13, 256, 1 << 17]), k=st.sampled_from([1, 1, 2, 3]), strict=st.booleans(),
       cut=st.booleans(), bom=st.booleans())
def test_random_spellings_agree(recs, by, measure, chunk, k, strict, cut, bom):
    data = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(recs) + (b"" if cut else b"\n")
    both(data, chunk, by=by, measure=measure, k=k, strict=strict)

"""The native stats loop (_digest.c) gives exactly what the pure-Python loop
gives: same numbers, same skipped lines, same errors, on plain records, on
records it must leave to the careful path, and on random JSON spellings."""

from __future__ import annotations

import os

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import jsonl, state_record
from odd_lines import ODD_LINES
from pstate import native
from pstate.stream import streamio
from pstate.render import tables
from pstate.analysis import timeinstate
from pstate.analysis import ingest
from pstate.analysis import services
from pstate.stream.filters import Filter
from pstate.analysis.latency import bucket_index
from pstate.exitcodes import PstateError

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
NATIVE = native.load("_digest")

pytestmark = pytest.mark.skipif(NATIVE is None and (native.PURE or not IN_CI),
                                reason="PSTATE_PURE is set, or pstate._digest not built (no C compiler?)")


def test_native_loop_is_built():
    """CI must test the native path, not fall back to the pure one quietly."""
    if native.PURE:
        pytest.skip("PSTATE_PURE is set")
    assert NATIVE is not None, "pstate._digest did not build or import: pip install -e . needs gcc and python3-dev"
    assert ingest._digest is NATIVE


def digest(data: bytes, by: str, chunk: int, *, use_native: bool, strict: bool = False,
           interval_at: int | None = None, max_line: int = 1 << 20, filt=None):
    saved = ingest._digest
    ingest._digest = NATIVE if use_native else None
    try:
        stats = streamio.ReadStats()
        agg = timeinstate.Aggregator(by)
        dig = ingest.LineDigester(agg, stats, strict=strict, max_line=max_line,
                                  filt=None if filt is None else filt())
        dig.begin("in.jsonl")
        try:
            for i in range(0, len(data), chunk):
                if interval_at is not None and i >= interval_at and agg.clip_ts is None:
                    agg.summarise(stats)
                    agg.start_interval(agg.last_ts() or 0)
                dig.feed(data[i:i + chunk])
            dig.end()
        except PstateError as e:
            return ("error", e.exit_code, e.message)
        s = agg.summarise(stats)
        rep = tables.build_report(s, s.groups, hist=True, with_matrix=True)
        return ("ok", rep, dict(stats.first_bad), stats.metas, stats.ends, stats.lines, stats.records,
                stats.truncated_tail, agg.events, list(agg.tasks.items()), list(agg.cells.items()),
                stats.out_of_order, stats.order)
    finally:
        ingest._digest = saved


def both(data: bytes, by: str = "pid", chunk: int = 1 << 20, **kw):
    a = digest(data, by, chunk, use_native=True, **kw)
    b = digest(data, by, chunk, use_native=False, **kw)
    assert a == b
    return a


rec = state_record
lines = jsonl


PLAIN = [rec(ts=1000 + i * 7, tid=11 + i % 3, pid=10 + i % 2, dur_ns=(i * 7919) % 100000 or None,
             **{"from": ["running", "sleeping", "runnable", "preempted"][i % 4],
                "to": ["sleeping", "runnable", "running", "running"][i % 4]}) for i in range(200)]


@pytest.mark.parametrize("by", ["pid", "tid", "comm"])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_plain_records(by, chunk):
    out = both(lines(*PLAIN), by, chunk)
    assert out[0] == "ok" and out[8] == 200


# Lines the native loop must leave to the careful path, each beside plain ones.
ODD = ODD_LINES


@pytest.mark.parametrize("i", range(len(ODD)))
@pytest.mark.parametrize("by", ["pid", "comm"])
@pytest.mark.parametrize("strict", [False, True])
def test_odd_lines_agree(i, by, strict):
    data = lines(*PLAIN[:50], ODD[i], *PLAIN[50:100])
    both(data, by, 1 << 20, strict=strict)
    both(data, by, 33, strict=strict)
    both(data.rstrip(b"\n"), by, 1 << 20, strict=strict)  # and as an unterminated last line
    both(lines(ODD[i]), by, 1 << 20, strict=strict)


def test_overlong_lines_agree():
    data = lines(*PLAIN[:20], rec(comm="x" * 300), *PLAIN[20:40])
    both(data, max_line=200)
    both(data, chunk=50, max_line=200)


def test_sums_beyond_64_bits():
    big = (1 << 63) - 1
    recs = [rec(ts=big, tid=1, dur_ns=big) for _ in range(5)]
    out = both(lines(*recs))
    assert out[0] == "ok"


def test_many_states_and_comms():
    recs = [rec(ts=i, tid=i % 50, comm=f"c{i % 300}", **{"from": f"s{i % 280}", "to": f"t{i % 7}"})
            for i in range(3000)]
    for by in ("pid", "tid", "comm"):
        both(lines(*recs), by, 4096)


# Records out of order on their CPU, among plain ones: a step back on cpu 0,
# one on a CPU beyond the native table, one after a record the careful path
# reads, a new recording (meta) and records a filter leaves out.
DISORDER = [rec(ts=5000, cpu=0), rec(ts=6000, cpu=1), rec(ts=4000, cpu=0), rec(ts=4500, cpu=0),
            rec(ts=100, cpu=5000), rec(ts=99, cpu=5000), b'{"type": "state", "ts": 7000, "cpu": 1, "pid": 10, '
            b'"tid": 11, "from": "running", "to": "sleeping", "dur_ns": 5}', rec(ts=6500, cpu=1),
            rec(ts=6400, cpu=1, pid=99), rec(ts=6300, cpu=1, comm="other"),
            {"type": "meta", "schema": 1, "ts": 1}, rec(ts=10, cpu=0), rec(ts=9, cpu=0)]


@pytest.mark.parametrize("chunk", [1, 13, 64, 1 << 20])
@pytest.mark.parametrize("f", [None, 3, 5])
def test_records_out_of_order_agree(chunk, f):
    out = both(lines(*PLAIN[:30], *DISORDER, *PLAIN[30:60]), "tid", chunk,
               filt=None if f is None else FILTERS[f])
    assert out[0] == "ok" and out[11] == 6


def test_the_native_loop_notes_the_order_it_takes():
    """digest, parse_states and plain_states note the ts of the records they
    take in the table bound in this thread, and leave to the careful path
    what it must place: the first on a CPU before any meta record, the first
    out of order, one on a CPU beyond the table."""
    data = lines(rec(ts=10), rec(ts=20), rec(ts=15), rec(ts=30), rec(ts=1, cpu=5000))
    for call in (lambda b: NATIVE.plain_states(b, 0, len(b) - 1, 1 << 20),
                 lambda b: NATIVE.parse_states(b, 0, len(b) - 1, 1 << 20),
                 lambda b: NATIVE.Digester("tid", lambda s: len(s), lambda c: 1).digest(b, 0, len(b) - 1, 1 << 20)):
        order = streamio.ReadStats().order
        assert call(data)[:2] == (len(data), 5)  # unbound: nothing noted, all taken
        assert NATIVE.bind_order(order.table) is None
        try:
            assert call(data)[:2] == (0, 0)  # the first on cpu 0 before any meta record: the careful path's
            order.reset()
            assert call(data)[:2] == (data.index(b"\n", data.index(b"\n") + 1) + 1, 2)  # then the first back
            assert (order.count, order.cells[3]) == (0, 20)
            order.note(0, 15, "in", 3)
            stop = call(data[data.index(b'{"type":"state","ts":30'):])
            assert stop[1] == 1 and (order.count, order.cells[3]) == (1, 30)  # the cpu beyond the table: Python's
            assert call(lines(rec(ts=25)))[1] == 1 and (order.count, order.cells[3]) == (2, 25)
        finally:
            assert NATIVE.bind_order(None) is order.table
    with pytest.raises(TypeError):
        NATIVE.bind_order(5)
    with pytest.raises(ValueError):
        NATIVE.bind_order(bytearray(3))
        try:
            NATIVE.plain_states(data, 0, len(data) - 1, 1 << 20)
        finally:
            NATIVE.bind_order(None)


@pytest.mark.parametrize("at", [0, 3000, 9000])
def test_intervals_clip_alike(at):
    both(lines(*PLAIN), "tid", 512, interval_at=at)


def test_take_is_idempotent_and_sync_runs_before_reads():
    agg = timeinstate.Aggregator("pid")
    dig = NATIVE.Digester("pid", agg.state_id, agg.comm_id)
    data = lines(*PLAIN)
    stop, n, due = dig.digest(data, 0, len(data) - 1, 1 << 20)
    assert (stop, n, due) == (len(data), 200, False)
    agg.add_digested(*dig.take())
    agg.flushers.append(lambda: agg.add_digested(*dig.take(True)))
    assert len(agg.tasks) == 3 and sum(c[timeinstate.C_N] for c in agg.cells.values()) == 200
    assert all(not c[timeinstate.C_HIST] for c in agg.cells.values())  # held back until sync
    agg.sync()
    agg.sync()
    assert sum(sum(c[timeinstate.C_HIST].values()) for c in agg.cells.values()) == sum(
        1 for r in PLAIN if r["dur_ns"] is not None)
    assert dig.take(True) == (0, [], [], [])


def test_the_digester_touches_no_python_object():
    """It is given its state and comm ids by callables and hands back plain
    tuples: an Aggregator's attributes are not its business."""
    seen = []

    def state_id(name):
        seen.append(name)
        return len(seen) - 1

    dig = NATIVE.Digester("comm", state_id, lambda comm: 7)
    data = lines(rec(), rec(ts=2000, **{"from": "sleeping", "to": "runnable"}, dur_ns=None))
    assert dig.digest(data, 0, len(data) - 1, 1 << 20) == (len(data), 2, False)
    assert seen == ["running", "sleeping", "runnable"]
    events, tasks, cells, buckets = dig.take()
    assert events == 2 and buckets == []
    assert tasks == [(11, 10, "w", 2000, "runnable", 1000, False, 7, 500, None)]
    assert cells == [((7 << 16) | 1, 1, 0, 500, 500, 500, 0), ((7 << 16) | (1 << 8) | 2, 1, 1, 0, 0, 0, 0)]
    assert dig.take(True) == (0, [], [], [((7 << 16) | 1, {bucket_index(500): 1})])


def test_bad_arguments_raise_not_crash():
    agg = timeinstate.Aggregator("pid")
    dig = NATIVE.Digester("pid", agg.state_id, agg.comm_id)
    with pytest.raises(ValueError):
        dig.digest(b"abc", 0, 10, 100)
    with pytest.raises(ValueError):
        dig.digest(b"abc", 5, 2, 100)
    with pytest.raises(TypeError):
        dig.digest("text", 0, 1, 100)
    with pytest.raises(TypeError):
        dig.digest(b"abc", 0, 1, 100, "clip")
    with pytest.raises(RuntimeError):
        dig.__init__("pid", agg.state_id, agg.comm_id)
    with pytest.raises(ValueError):
        NATIVE.Digester("cpu", agg.state_id, agg.comm_id)
    with pytest.raises(TypeError):
        NATIVE.Digester("pid", None, agg.comm_id)
    broken = NATIVE.Digester("pid", lambda name: 1 / 0, agg.comm_id)  # a failing callable is an error
    with pytest.raises(ZeroDivisionError):
        broken.digest(lines(rec()), 0, len(lines(rec())) - 1, 1 << 20)


# --- random spellings of records -----------------------------------------------------

names = st.sampled_from(["running", "runnable", "preempted", "sleeping", "uninterruptible", "stopped",
                         "unknown", "zombie", "reaped", "state_Q"])
comms = st.one_of(st.none(), st.text(max_size=20), st.sampled_from(["java", "kworker/0:1", "a b", ""]))
ints = st.one_of(st.integers(0, 5000), st.integers(0, (1 << 63) - 1), st.integers(-3, 3),
                 st.sampled_from([1 << 47, 1 << 63, 1.5, True, None, "7"]))
ws = st.sampled_from(["", " ", "\t", "\r", "  "])


@st.composite
def spelled(draw) -> bytes:
    r = {"type": draw(st.sampled_from(["state"] * 8 + ["exit", "loss", "slice", "waker"])), "ts": draw(ints),
         "cpu": draw(ints),
         "pid": draw(st.integers(0, 40)), "tid": draw(st.integers(0, 60)), "comm": draw(comms),
         "from": draw(names), "to": draw(names), "dur_ns": draw(st.one_of(st.none(), ints))}
    for k in draw(st.lists(st.sampled_from(list(r)), max_size=2)):
        r.pop(k, None)
    extra = draw(st.dictionaries(st.sampled_from(["cause", "prio", "voluntary", "kstate", "x", "steal_irq_ns"]),
                                 st.one_of(st.none(), st.booleans(), st.integers(-5, 1 << 40), st.text(max_size=5)),
                                 max_size=3))
    r.update(extra)
    items = list(r.items())
    order = draw(st.permutations(range(len(items))))
    sep = draw(ws)
    body = ("," + sep).join(f"{orjson.dumps(items[i][0]).decode()}{draw(ws)}:{sep}"
                            f"{orjson.dumps(items[i][1]).decode() if not isinstance(items[i][1], float) else repr(items[i][1])}"
                            for i in order)
    return (draw(ws) + "{" + body + "}" + draw(ws)).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(spelled(), max_size=40), by=st.sampled_from(["pid", "tid", "comm"]),
       chunk=st.sampled_from([1, 13, 256, 1 << 20]), strict=st.booleans(), cut=st.booleans())
def test_random_spellings_agree(recs, by, chunk, strict, cut):
    data = b"\n".join(recs) + (b"" if cut else b"\n")
    both(data, by, chunk, strict=strict)


# --- identity keys (--by cgroup, unit, ...) and event filters ------------------------------

def identity(kind: str, **kw) -> dict:
    r = {"type": kind, "ts": 900}
    if kind == "cgroup":
        r.update(cgroup=5, path="/system.slice/web.service", gone=False)
    else:
        r.update(pid=10, comm="pg", title="pg: main", exe="/usr/bin/pg", ppid=1, cgroup=5, gone=False, why="first")
    r.update(kw)
    return r


# Process and cgroup records among the state records, changing what a pid's group is as they come
# (a title set after fork, a move to another cgroup, a process gone before it was read).
IDENTITIES = [
    identity("cgroup"), identity("cgroup", cgroup=6, path="/docker-0123456789abcdef.scope"),
    identity("cgroup", cgroup=7, path=None, gone=True),
    identity("process"), identity("process", pid=11, title="pg: walwriter", ppid=10, cgroup=6),
]
LATER = [identity("process", title="pg: checkpointer", why="recheck"),
         identity("process", pid=11, cgroup=7, why="recheck"), identity("process", pid=12, gone=True, why="first"),
         identity("cgroup", cgroup=8, path="/kubepods/burstable/pod1234/abcdef0123456789")]
# What a filtered recording adds for its why-views: no time in state, passed over natively without them.
CONTEXT = [{"type": "slice", "ts": 1100 + i, "cpu": i % 2, "pid": 90, "tid": 91 + i % 2, "comm": "hog",
            "dur_ns": 50 + i, "next_tid": 11} for i in range(12)] + [
    {"type": "waker", "ts": 1200, "cpu": 0, "pid": 80, "tid": 81, "comm": "kworker/0:1"}]
WHO = (PLAIN[:60] + IDENTITIES + PLAIN[60:100] + CONTEXT[:6] + PLAIN[100:120] + LATER[:2] + PLAIN[120:160]
       + CONTEXT[6:] + LATER[2:] + PLAIN[160:])

FILTERS = [
    lambda: Filter(cgroups=("/system.slice",)),
    lambda: Filter(titles=("pg: *",)),
    lambda: Filter(titles=("*checkpointer",), include_idle=True),
    lambda: Filter(pids=(10,), states=("sleeping",)),
    lambda: Filter(tids=(11, 13), min_dur_ns=20000),
    lambda: Filter(comms=("w", "x" * 20), cpus=(0,)),
    lambda: Filter(comms=("nothing",)),
    lambda: Filter(include_idle=True, cpus=(1, 0), cgroups=("/",)),
]


@pytest.mark.parametrize("by", services.BY_KEYS + ("pid", "comm", "all"))
@pytest.mark.parametrize("chunk", [1, 97, 1 << 20])
def test_identity_keys_agree(by, chunk):
    out = both(lines(*WHO), by, chunk)
    assert out[0] == "ok" and out[8] == 200


@pytest.mark.parametrize("f", range(len(FILTERS)))
@pytest.mark.parametrize("by", ["pid", "tid", "title", "unit"])
def test_filters_agree(f, by):
    idle = [rec(ts=5000 + i, pid=0, tid=0, comm="swapper/0") for i in range(5)]
    data = lines(*WHO[:100], *idle, *WHO[100:])
    both(data, by, 1 << 20, filt=FILTERS[f])
    both(data, by, 61, filt=FILTERS[f])
    both(data, by, 512, filt=FILTERS[f], interval_at=3000)


def test_filtered_lines_are_read_natively():
    """A filter no longer sends every line to the careful path: the native
    loop reads the records it leaves out, and sums the others."""
    agg = timeinstate.Aggregator("pid")
    dig = NATIVE.Digester("pid", agg.state_id, agg.comm_id)
    dig.set_filter((10,), (), (), (), (), 0, False, None)
    data = lines(*PLAIN)
    assert dig.digest(data, 0, len(data) - 1, 1 << 20) == (len(data), 200, False)
    events, tasks, _cells, _b = dig.take()
    assert events == 100 and {t[1] for t in tasks} == {10}


def test_context_records_are_passed_over_natively():
    """Plain stats of a filtered recording: its slice and waker records are
    read, checked and passed over by the native loop (not one by one by the
    careful path), and only without why-views (which read them)."""
    data = lines(*PLAIN[:10], *CONTEXT, *PLAIN[10:20])
    agg = timeinstate.Aggregator("pid")
    dig = NATIVE.Digester("pid", agg.state_id, agg.comm_id)
    assert dig.digest(data, 0, len(data) - 1, 1 << 20) == (len(data), 20 + len(CONTEXT), False)
    assert dig.take()[0] == 20
    assert NATIVE.plain_states(data, 0, len(data) - 1, 1 << 20, True)[:2] == (len(data), 20 + len(CONTEXT))
    assert NATIVE.plain_states(data, 0, len(data) - 1, 1 << 20)[:2] == (len(lines(*PLAIN[:10])), 10)
    dig = NATIVE.Digester("pid", agg.state_id, agg.comm_id)
    dig.set_why(lambda f, t: 0, False, 1 << 8, False, False)
    assert dig.digest(data, 0, len(data) - 1, 1 << 20)[:2] == (len(lines(*PLAIN[:10])), 10)


def test_pid_groups_are_asked_once_per_pid_until_forget():
    asked = []

    def group_id(pid, cgroup):
        assert cgroup is None
        asked.append(pid)
        return pid % 2

    dig = NATIVE.Digester("pid_group", lambda name: 0, group_id)
    data = lines(*PLAIN[:20])
    dig.digest(data, 0, len(data) - 1, 1 << 20)
    assert sorted(asked) == [10, 11]
    dig.forget()
    dig.digest(data, 0, len(data) - 1, 1 << 20)
    assert sorted(asked) == [10, 10, 11, 11]
    dig.forget(11)  # a process record of pid 11
    dig.forget(1 << 70)
    dig.digest(data, 0, len(data) - 1, 1 << 20)
    assert sorted(asked) == [10, 10, 11, 11, 11]
    # a record's own cgroup is asked about with its pid, once per pid and cgroup in a row
    asked = []
    dig = NATIVE.Digester("pid_group", lambda name: 0, lambda pid, cg: asked.append((pid, cg)) or 0)
    data = lines(rec(cgroup=5), rec(ts=2000, cgroup=5), rec(ts=3000, cgroup=None), rec(ts=4000, cgroup=5),
                 rec(ts=5000, cgroup=6), rec(ts=6000))
    dig.digest(data, 0, len(data) - 1, 1 << 20)
    assert asked == [(10, 5), (10, None), (10, 6)]
    assert dig.take()[1][0][-1] is None  # the task's last record carried none
    with pytest.raises(TypeError):
        dig.set_filter((), (), (), (), (), 0, False, "not callable")
    with pytest.raises(TypeError):
        dig.set_filter(("x",), (), (), (), (), 0, False, None)


pids = st.integers(0, 6)
titles = st.one_of(st.none(), st.sampled_from(["pg: main", "pg: wal", "nginx: worker", ""]))
paths = st.one_of(st.none(), st.sampled_from(["/", "/a.slice/b.service", "/a.slice/c.scope",
                                              "/docker-0123456789abcdef0.scope", "/a.slice"]))


@st.composite
def who_line(draw) -> bytes:
    kind = draw(st.sampled_from(["state"] * 6 + ["process", "cgroup"]))
    if kind == "cgroup":
        r = {"type": "cgroup", "ts": 1, "cgroup": draw(st.integers(1, 4)), "path": draw(paths), "gone": False}
    elif kind == "process":
        r = {"type": "process", "ts": 1, "pid": draw(pids), "comm": "p", "title": draw(titles),
             "ppid": draw(st.one_of(st.none(), pids)), "cgroup": draw(st.one_of(st.none(), st.integers(1, 4))),
             "gone": draw(st.booleans()), "why": "first"}
    else:
        r = rec(ts=draw(st.integers(0, 10000)), pid=draw(pids), tid=draw(st.integers(0, 9)),
                cpu=draw(st.integers(0, 2)), comm=draw(st.sampled_from(["w", "x", None])),
                dur_ns=draw(st.one_of(st.none(), st.integers(0, 50000))),
                **{"from": draw(names), "to": draw(names)})
        cg = draw(st.sampled_from(["absent", None, 1, 2, 3, 4, 9]))  # a state record's own cgroup
        if cg != "absent":
            r["cgroup"] = cg
        steal = draw(st.sampled_from(["absent", None, 0, 7, -2, 400]))  # of dur_ns, the kernel's steal and irq
        if steal != "absent":
            r["steal_irq_ns"] = steal
    return orjson.dumps(r)


filters = st.one_of(st.none(), st.builds(
    lambda p, t, c, s, cpu, d, idle, cg, ti: (lambda: Filter(pids=p, tids=t, comms=c, states=s, cpus=cpu,
                                                             min_dur_ns=d, include_idle=idle, cgroups=cg,
                                                             titles=ti)),
    st.lists(pids, max_size=2).map(tuple), st.lists(st.integers(0, 9), max_size=2).map(tuple),
    st.lists(st.sampled_from(["w", "x"]), max_size=1).map(tuple), st.lists(names, max_size=2).map(tuple),
    st.lists(st.integers(0, 2), max_size=2).map(tuple), st.sampled_from([0, 0, 1000]), st.booleans(),
    st.lists(st.sampled_from(["/a.slice", "/", "/docker-0123456789abcdef0.scope"]), max_size=1).map(tuple),
    st.lists(st.sampled_from(["pg: *", "*worker"]), max_size=1).map(tuple)))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=st.lists(who_line(), max_size=60), by=st.sampled_from(services.BY_KEYS + ("pid", "tid")),
       chunk=st.sampled_from([1, 50, 1 << 20]), filt=filters)
def test_random_identities_and_filters_agree(recs, by, chunk, filt):
    both(b"\n".join(recs) + b"\n", by, chunk, filt=filt)


@pytest.mark.parametrize("by", ["pid", "unit", "title", "container", "ppid"])
@pytest.mark.parametrize("f", [None, 0, 1])
@pytest.mark.parametrize("use_native, jobs", [(True, 2), (False, 2), (True, 1)])
def test_parts_know_the_identities_before_them(tmp_path, by, f, use_native, jobs):
    """-j: a part that starts after process and cgroup records was told
    what they said (it groups and filters its pids as one pass does)."""
    data = lines(*WHO)
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    starts = [0] + [i + 1 for i, c in enumerate(data) if c == 10][:-1]
    bounds = starts[::37] + [len(data)]
    parts = list(zip(bounds, bounds[1:]))
    filt = (lambda: None) if f is None else FILTERS[f]

    def report(parallel: bool):
        saved = ingest._digest
        ingest._digest = NATIVE if use_native else None
        try:
            stats = streamio.ReadStats()
            agg = timeinstate.Aggregator(by)
            if parallel:
                ingest.digest_parallel(str(path), agg, stats, jobs=jobs, parts=parts, filt=filt())
            else:
                ingest.digest_files([str(path)], agg, stats, filt=filt())
            s = agg.summarise(stats)
            return tables.build_report(s, s.groups, hist=True, with_matrix=True), stats.lines, stats.records
        finally:
            ingest._digest = saved

    assert len(parts) > 4
    assert report(True) == report(False)

"""One reader, two paths: the native bulk readers and the careful (pure
Python) path of reader.StreamReader give the same results everywhere.

- `pstate stats` (fast) and `pstate stats --reader careful`: identical
  stdout, stderr and exit code on every corpus file, every golden input and
  hypothesis-generated streams, in every format, with and without --strict;
- the records a command reads are the same through the native row reader
  (heat --live's), the careful path, read_records (heat, snapshots) and
  replay --no-wait's output;
- the rule for record types (pstate-events(5)): unknown types are counted,
  never bad lines; annotation records are not events;
- records out of order (a ts lower than the one before on the same CPU) are
  counted alike by every path and every command, and fail --strict.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_stats
from pstate import native
from pstate.engines import live
from pstate.stream import schema
from pstate.main import cli
from pstate.stream import reader, replayer
from pstate.stream.reader import RecordList, StreamReader, read_records
from pstate.stream.streamio import BOM, ReadStats
from conftest import TESTS

HERE = TESTS
DATA = HERE / "data"
CORPUS = sorted((DATA / "corpus").glob("*.jsonl"))
INPUTS = CORPUS + sorted((DATA / "golden-v1").glob("*.jsonl")) + sorted((DATA / "stats").glob("*.jsonl")) + [
    DATA / "heat" / "small.jsonl"] + sorted((DATA / "replay").glob("*.jsonl"))
NATIVE_ROWS = native.load("_digest")


def stats(path: str, *args: str, reader: str = "fast", input: bytes | None = None):
    res = CliRunner().invoke(cli, ["stats", "--reader", reader, *args, path], input=input, catch_exceptions=False)
    return res.exit_code, res.stdout, res.stderr


def both(path: str, *args: str, input: bytes | None = None):
    fast = stats(path, *args, input=input)
    careful = stats(path, *args, reader="careful", input=input)
    assert fast == careful
    return fast


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.parametrize("args", [(), ("-f", "json", "--hist", "--matrix"), ("--strict", "-f", "csv"),
                                  ("--by", "comm", "-f", "json")], ids=["table", "json", "strict-csv", "comm"])
def test_stats_fast_and_careful_agree(path, args):
    both(str(path), *args)


@pytest.mark.parametrize("name, args", test_stats.GOLDENS, ids=[g[0] for g in test_stats.GOLDENS])
def test_every_golden_through_both_paths(name, args, monkeypatch):
    monkeypatch.chdir(test_stats.DATA)
    fast = CliRunner().invoke(cli, ["stats", *args], catch_exceptions=False)
    careful = CliRunner().invoke(cli, ["stats", "--reader", "careful", *args], catch_exceptions=False)
    assert (fast.exit_code, fast.stdout, fast.stderr) == (careful.exit_code, careful.stdout, careful.stderr)
    assert careful.stdout == (test_stats.GOLDEN / name).read_text()


def test_a_byte_order_mark_is_dropped_by_every_reader():
    path = DATA / "corpus" / "bom.jsonl"
    assert path.read_bytes().startswith(BOM)
    code, out, err = both(str(path), "-f", "json")
    assert code == 0 and err == ""
    rep = orjson.loads(out)
    assert rep["input"]["complete"] is True
    want = read_through(path.read_bytes(), native_rows=False)
    assert want[0]["type"] == "meta" and want[-1][3] == {}  # nothing skipped
    if NATIVE_ROWS is not None:
        assert read_through(path.read_bytes(), native_rows=True) == want


# --- the records, through each reader --------------------------------------------


def read_through(data: bytes, *, native_rows: bool, chunk: int = 1 << 16, name: str = "in") -> list:
    """What a StreamReader hands out, as records, with or without the native row reader."""
    sink = RecordList()
    fast = None
    if native_rows:
        def fast(buf, pos, end, n):
            stop, lines, rows = NATIVE_ROWS.parse_states(buf, pos, end, 1 << 20, 1, n)
            if rows:
                sink.rows(rows)
            return stop, lines, len(rows)
    stats = ReadStats()
    rd = StreamReader(sink, stats, fast=fast)
    rd.begin(name)
    try:
        for i in range(0, len(data), chunk):
            rd.feed(data[i:i + chunk])
        rd.end()
    except Exception as e:  # a newer schema: the same error either way
        return [("error", str(e))]
    return sink.out + [summary(stats)]


def summary(stats: ReadStats) -> tuple:
    return ("stats", stats.lines, stats.records, stats.skipped, stats.truncated_tail, stats.unknown,
            stats.out_of_order, stats.order.first)


class Kept:
    """A sink that keeps rows and records as they come."""

    def __init__(self):
        self.out: list = []

    def rows(self, rows: list) -> None:
        self.out.extend(rows)

    def record(self, rec: dict, weight: int) -> None:
        self.out.append(rec)


def rows_through(data: bytes, *, native_rows: bool, wide: bool, chunk: int = 1 << 16) -> list:
    """What a StreamReader with native_rows hands out (rows as tuples), with
    the native row reader or without it."""
    sink = Kept()
    stats = ReadStats()
    rd = StreamReader(sink, stats, native_rows=native_rows, wide=wide)
    assert (rd.fast is not None) == (native_rows and NATIVE_ROWS is not None)
    rd.begin("in")
    try:
        for i in range(0, len(data), chunk):
            rd.feed(data[i:i + chunk])
        rd.end()
    except Exception as e:
        return [("error", str(e))]
    return sink.out + [summary(stats)]


def state_fields(rec: dict) -> dict:
    if rec.get("type") != "state":
        return rec
    return {k: rec.get(k) for k in ("type", "ts", "cpu", "pid", "tid", "comm", "from", "to", "dur_ns", "cgroup")}


@pytest.mark.skipif(NATIVE_ROWS is None, reason="pstate._digest not built or PSTATE_PURE set")
@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_same_records_through_every_reader(path):
    data = path.read_bytes()
    careful = read_through(data, native_rows=False, name=str(path))
    assert read_through(data, native_rows=True, name=str(path)) == careful
    assert read_through(data, native_rows=True, chunk=7, name=str(path)) == careful
    if isinstance(careful[0], tuple) and careful[0][0] == "error":
        return
    st_ = ReadStats()
    whole = list(read_records([str(path)], st_))
    assert [state_fields(r) for r in whole] == careful[:-1]
    assert summary(st_) == careful[-1]


def test_the_wide_fields_are_named_once():
    if NATIVE_ROWS is not None:
        assert NATIVE_ROWS.WIDE_FIELDS == reader.WIDE_FIELDS
    rec = dict(BASE, prio=120, next_tid=7, kstate="S", waker="irq")
    assert reader.state_row(rec, 1, True) == (
        *reader.state_row(rec), *(rec.get(k) for k in reader.WIDE_FIELDS))
    assert len(reader.state_row(rec, 1, True)) == len(reader.ROW_FIELDS) + len(reader.WIDE_FIELDS)


@pytest.mark.skipif(NATIVE_ROWS is None, reason="pstate._digest not built or PSTATE_PURE set")
@pytest.mark.parametrize("wide", [False, True], ids=["rows", "wide"])
@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_same_rows_through_the_native_row_reader(path, wide):
    data = path.read_bytes()
    careful = rows_through(data, native_rows=False, wide=wide)
    assert rows_through(data, native_rows=True, wide=wide) == careful
    assert rows_through(data, native_rows=True, wide=wide, chunk=7) == careful


EXPORTS = [("-f", "chrome"), ("-f", "perfetto")]


def export_both(monkeypatch, path: str, *args: str, input: bytes | None = None):
    return fast_and_careful(monkeypatch, ["export", "-q", *args, path], input)


@pytest.mark.parametrize("args", EXPORTS, ids=["chrome", "perfetto"])
@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_export_fast_and_careful_agree(monkeypatch, path, args):
    export_both(monkeypatch, str(path), *args)


def fast_and_careful(monkeypatch, argv: list, input: bytes | None = None):
    """A command's (exit code, stdout, stderr) with the native row reader and without it: the same."""
    def once():
        res = CliRunner().invoke(cli, argv, input=input, catch_exceptions=False)
        return res.exit_code, res.stdout_bytes, res.stderr

    fast = once()
    with monkeypatch.context() as m:
        m.setattr(reader, "_parse_states", None)
        m.setattr(replayer, "_parse_states", None)
        m.setattr(replayer, "_plain_states", None)
        careful = once()
    assert fast == careful
    return fast


HEATS = [(), ("--latency",), ("--by", "pid", "--shade", "D"), ("-p", "10,4242", "--bucket", "1ms"), ("--strict",)]


@pytest.mark.parametrize("args", HEATS, ids=["states", "latency", "shade", "filter", "strict"])
@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_heat_fast_and_careful_agree(monkeypatch, path, args):
    fast_and_careful(monkeypatch, ["heat", "--width", "100", "--no-color", *args, str(path)])


REPLAYS = [("--no-wait",), ("--no-wait", "-p", "10", "-p", "4242"), ("--no-wait", "-b", "+1ms", "--state", "D"),
           ("--speed", "1e12"), ("--no-wait", "--strict")]


@pytest.mark.parametrize("args", REPLAYS, ids=["no-wait", "filter", "window", "paced", "strict"])
@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_replay_fast_and_careful_agree(monkeypatch, path, args):
    fast_and_careful(monkeypatch, ["replay", *args, str(path)])


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_replay_passes_the_events_the_reader_reads(path):
    res = CliRunner().invoke(cli, ["replay", "--no-wait", str(path)], catch_exceptions=False)
    try:
        want = [r for r in read_records([str(path)]) if r["type"] in schema.EVENT_TYPES]
    except Exception:
        assert res.exit_code == 65
        return
    got = [orjson.loads(x) for x in res.stdout_bytes.splitlines()]
    assert [r for r in got if r["type"] in schema.EVENT_TYPES] == want


def test_the_live_feeder_reads_what_read_records_reads(tmp_path):
    """heat --live's Feeder and heat FILE's read_records: the same events."""
    from pstate.render import heatmodel as hm

    path = DATA / "heat" / "small.jsonl"
    model = hm.Window(10**9, 40, by="tid")
    seen = []
    model_states = model.states
    model.states = lambda rows, skip_idle=False: (seen.extend(r[:8] for r in rows), model_states(rows, skip_idle))
    f = live.Feeder(model, ReadStats(), "small", False)
    f.feed(path.read_bytes())
    f.finish()
    want = [tuple(state_fields(r)[k] for k in ("ts", "pid", "tid", "comm", "from", "to", "dur_ns", "cpu"))
            for r in read_records([str(path)]) if r["type"] == "state"]
    assert seen == want and f.parsed == sum(1 for _ in read_records([str(path)]))


# --- hypothesis: streams of good, odd and bad lines --------------------------------

BASE = {"type": "state", "ts": 1000, "cpu": 0, "pid": 10, "tid": 11, "comm": "w", "from": "running",
        "to": "sleeping", "dur_ns": 500, "cause": "switch_out"}
META = {"type": "meta", "schema": 1, "source": "record", "ts": 900, "wall_ns": 10**18}


@st.composite
def line(draw) -> bytes:
    kind = draw(st.sampled_from(["state"] * 6 + ["fork", "exit", "loss", "end", "cgroup", "future", "bad", "blank",
                                                 "meta"]))
    if kind == "meta":  # a recording starts: the order per CPU too
        return orjson.dumps(dict(META, ts=draw(st.integers(0, 10**6))))
    if kind == "bad":
        return draw(st.sampled_from([b"{", b"nope", b"[1]", b'{"type":1}', b'{"type":"state","ts":-1}', b"\x00\x00"]))
    if kind == "blank":
        return draw(st.sampled_from([b"", b"  ", b"\r"]))
    rec = dict(BASE)
    # ts out of order on a CPU or not; a CPU beyond the native table (streamio.ORDER_CPUS) now and then
    rec.update(ts=draw(st.integers(1000, 10**6)), pid=draw(st.integers(0, 5)), tid=draw(st.integers(0, 9)),
               cpu=draw(st.sampled_from([0, 0, 0, 1, 1, 3, 4095, 4096, 2**40])),
               dur_ns=draw(st.one_of(st.none(), st.integers(0, 1 << 40))),
               comm=draw(st.one_of(st.none(), st.sampled_from(["w", "java", "ünï", "a\"b"]))),
               **{"from": draw(st.sampled_from(["running", "runnable", "sleeping", "preempted", "state_Q"])),
                  "to": draw(st.sampled_from(["running", "runnable", "uninterruptible", "zombie"]))})
    if kind != "state":
        rec = {"type": kind, "ts": rec["ts"], "cpu": rec["cpu"], "pid": rec["pid"], "tid": rec["tid"], "comm": "w"}
        if kind == "loss":
            rec = {"type": "loss", "ts": 1, "reason": "ringbuf_full", "count": draw(st.integers(0, 9))}
        elif kind == "end":
            rec = {"type": "end", "ts": rec["ts"], "reason": "eof", "events": 1, "lost": 0}
    if kind == "state":  # what a trace export reads of switches and wake-ups, any JSON scalar
        for k in draw(st.lists(st.sampled_from(reader.WIDE_FIELDS), max_size=4, unique=True)):
            rec[k] = draw(st.sampled_from([0, 7, 120, -1, 2**40, None, True, "switch_out", "switch_in", "wakeup",
                                           "S", "R+", "irq", "ü"]))
    text = orjson.dumps(rec)
    if draw(st.booleans()):
        text = text.replace(b",", b", ")  # a spelling only the careful path reads
    return text


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(lines=st.lists(line(), max_size=30), bom=st.booleans(), cut=st.integers(0, 12),
       args=st.sampled_from([("-f", "json", "--hist"), ("--strict",), ("--by", "tid", "-f", "csv")]))
def test_generated_streams_agree(tmp_path, monkeypatch, lines, bom, cut, args):
    data = (BOM if bom else b"") + orjson.dumps(META) + b"\n" + b"\n".join(lines) + b"\n"
    if cut:
        data = data[:-cut]
    path = tmp_path / "gen.jsonl"
    path.write_bytes(data)
    both(str(path), *args)
    both("-", *args, input=data)
    for fmt in EXPORTS:
        export_both(monkeypatch, str(path), *fmt, *(("--strict",) if "--strict" in args else ()))
    for rargs in REPLAYS:
        fast_and_careful(monkeypatch, ["replay", *rargs, str(path)])
    if NATIVE_ROWS is not None:
        assert read_through(data, native_rows=True, chunk=5) == read_through(data, native_rows=False)
        assert (rows_through(data, native_rows=True, wide=True, chunk=5)
                == rows_through(data, native_rows=False, wide=True))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.sampled_from([0, 1, 2, 4096]), st.integers(-3, 5), st.booleans()), max_size=60),
       chunk=st.sampled_from([5, 64, 1 << 16]))
def test_generated_orders_agree(steps, chunk):
    """Runs of ts per CPU that mostly go forward, with steps back, meta
    records and lines only the careful path reads (", " spellings) between
    them: the native readers and the careful path count alike."""
    ts = {}
    out = []
    for cpu, step, careful in steps:
        if step == -3:
            out.append(orjson.dumps(dict(META, ts=1)))
            continue
        ts[cpu] = ts.get(cpu, 5000) + step * 100
        text = orjson.dumps(dict(BASE, ts=max(ts[cpu], 0), cpu=cpu))
        out.append(text.replace(b",", b", ") if careful else text)
    data = b"\n".join(out) + b"\n"
    careful = read_through(data, native_rows=False, chunk=chunk)
    assert rows_through(data, native_rows=False, wide=False, chunk=chunk)[-1] == careful[-1]
    if NATIVE_ROWS is not None:
        assert read_through(data, native_rows=True, chunk=chunk) == careful
        assert rows_through(data, native_rows=True, wide=True, chunk=chunk)[-1] == careful[-1]


# --- records out of order, through every command --------------------------------------

DISORDER = [META, dict(BASE, ts=2000), dict(BASE, ts=3000, cpu=1), dict(BASE, ts=1500),  # back on cpu 0
            {"type": "fork", "ts": 2500, "cpu": 1, "pid": 10, "tid": 11, "comm": "w", "child_pid": 12,
             "child_tid": 12, "thread": False},  # back on cpu 1
            dict(BASE, ts=1600), dict(BASE, ts=1600, tid=12), {"type": "loss", "ts": 1, "reason": "ringbuf_full",
                                                              "count": 0},
            dict(META, ts=100), dict(BASE, ts=200)]  # a new recording starts anew


@pytest.mark.parametrize("argv", [["stats"], ["stats", "-f", "json"], ["heat", "--width", "60"],
                                  ["replay", "--no-wait"], ["export", "-q", "-f", "chrome"], ["export", "-q"]],
                         ids=["stats", "stats-json", "heat", "replay", "export-chrome", "export-perfetto"])
def test_records_out_of_order_are_counted_and_fail_strict(tmp_path, monkeypatch, argv):
    path = tmp_path / "disorder.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in DISORDER))
    warning = (f"pstate {argv[0]}: warning: 2 records out of order: a ts lower than that of the record before it "
               f"on the same CPU (first at {path}:4)\n")
    code, _out, err = fast_and_careful(monkeypatch, [*argv, str(path)])
    assert code == 0 and warning in err
    code, _out, err = fast_and_careful(monkeypatch, [*argv, "--strict", str(path)])
    assert code == 65 and warning in err
    if argv[0] == "stats":
        assert both(str(path), "--strict") == stats(str(path), "--strict")
    in_order = tmp_path / "ordered.jsonl"
    in_order.write_bytes(b"".join(orjson.dumps(r) + b"\n" for i, r in enumerate(DISORDER) if i not in (3, 4, 5, 6)))
    code, _out, err = fast_and_careful(monkeypatch, [*argv, "--strict", str(in_order)])
    assert code == 0 and "out of order" not in err


# Parts of one line each are read in this process only: in children it
# would be a process per line, and the merge is the same code either way.
@pytest.mark.parametrize("jobs,every", [(1, 1), (1, 2), (1, 5), (2, 2), (2, 5)])
def test_records_out_of_order_across_parts(tmp_path, every, jobs):
    """stats -j: a record that goes back from the last one of an earlier
    part counts, as in one pass."""
    recs = [dict(BASE, ts=t, cpu=c) for t, c in [(10, 0), (20, 1), (5, 0), (30, 0), (15, 1), (25, 0), (40, 2),
                                                  (35, 2), (50, 1)]]
    for lead in ([], [META]):
        data = b"".join(orjson.dumps(r) + b"\n" for r in lead + recs + [META] + recs[:4])
        path = tmp_path / "parts.jsonl"
        path.write_bytes(data)
        one, _rep = test_stats.serial(str(path))
        assert one.out_of_order == 4 + 1
        got, _rep = test_stats.in_parts(str(path), test_stats.parts_of(data, every), jobs)
        assert (got.out_of_order, got.order.first, got.problems()) == (one.out_of_order, one.order.first,
                                                                        one.problems())
        assert got.order == one.order


# --- the rule for record types ------------------------------------------------------


def test_unknown_types_are_counted_and_annotations_are_not_events(tmp_path):
    recs = [META, BASE, {"type": "cgroup", "ts": 1000, "id": 3, "path": "/x"}, {"type": "hologram", "ts": 1},
            {"type": "stack", "ts": 1000, "id": 1, "frames": ["a"]}, dict(BASE, ts=2000, tid=12)]
    path = tmp_path / "future.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    code, out, err = both(str(path), "-f", "json")
    assert code == 0 and err == ""
    rep = orjson.loads(out)
    assert rep["input"]["events"] == 2 and rep["input"]["complete"] is True
    st_ = ReadStats()
    got = [r["type"] for r in read_records([str(path)], st_)]
    assert got == ["meta", "state", "cgroup", "stack", "state"]
    assert st_.unknown == {"hologram": 1} and st_.n_skipped == 0
    assert set(schema.ANNOTATION_TYPES) <= schema.KNOWN_TYPES
    assert not set(schema.ANNOTATION_TYPES) & set(schema.EVENT_TYPES)



# --- input that is not a recording, or two of the same -------------------------------


@pytest.mark.parametrize("data, code", [
    (b"", 0), (b"\n\n\n", 0), (b"  \n\r\n", 0),  # empty input: nothing to read, nothing wrong
    (b"hello\n", 65), (b"\xff\xfe{\x00\n", 65), (b'{"type":"meta"', 65), (b"[1, 2]\n", 65),
    (orjson.dumps(META) + b"\n", 0),
])
def test_input_without_one_valid_record_exits_65(tmp_path, data, code):
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    for args in ((), ("-f", "json")):
        got, _out, err = both(str(path), *args)
        assert got == code
        assert ("error: not one valid record in the input" in err) == (code == 65)
    r = CliRunner().invoke(cli, ["heat", str(path)], catch_exceptions=False)
    assert r.exit_code == code


def test_a_file_that_starts_with_nul_bytes_is_reported_as_cut(tmp_path):
    recs = [dict(BASE, ts=1000 + i, tid=11 + i % 2) for i in range(4)]
    path = tmp_path / "rotated.jsonl"
    path.write_bytes(b"\0" * 70000 + b"".join(orjson.dumps(r) + b"\n" for r in recs))
    code, out, err = both(str(path), "-f", "json")
    assert code == 0 and orjson.loads(out)["input"]["events"] == 4
    assert err == (f"pstate stats: warning: {path} starts with 70000 NUL bytes and has no meta record: it was cut "
                   "while being written (log rotation with copytruncate?); the records after them were read\n")
    assert orjson.loads(out)["input"]["complete"] is False
    assert stats(str(path), "--strict")[0] == 65


def test_the_same_recording_twice_is_noticed():
    data = (DATA / "stats" / "basic.jsonl").read_bytes()
    code, out, err = both("-", "-f", "json", input=data + data)
    assert code == 0
    assert "<stdin>: a recording of the same boot overlaps one read before it (the same recording twice?)" in err
    code, _out, err = both("-", input=data)
    assert code == 0 and err == ""


@pytest.mark.parametrize("jobs,every", [(1, 1), (1, 4), (1, 50), (2, 4), (2, 50)])
def test_the_same_recording_twice_is_noticed_across_parts(tmp_path, every, jobs):
    """stats -j: each part reads on its own; the merge still sees the second
    meta of the same boot inside the first recording's time."""
    data = (DATA / "stats" / "basic.jsonl").read_bytes()
    path = tmp_path / "twice.jsonl"
    path.write_bytes(data + data)
    parts = test_stats.parts_of(data + data, every)
    st_, _rep = test_stats.in_parts(str(path), parts, jobs)
    one, _rep = test_stats.serial(str(path))
    assert one.overlaps == [str(path)]
    assert st_.overlaps == one.overlaps and st_.problems() == one.problems()
    single = tmp_path / "once.jsonl"
    single.write_bytes(data)
    st_, _rep = test_stats.in_parts(str(single), test_stats.parts_of(data, every), jobs)
    assert st_.overlaps == [] and st_.problems() == []


def test_stats_jobs_reports_the_overlap_as_one_pass_does(tmp_path, monkeypatch):
    from pstate.analysis import ingest

    monkeypatch.setattr(ingest, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(ingest, "_PART_MIN_BYTES", 64)
    data = (DATA / "stats" / "basic.jsonl").read_bytes()
    path = tmp_path / "twice.jsonl"
    path.write_bytes(data + data)
    assert len(ingest.file_parts(str(path), 2)) == 2
    one = stats(str(path), "-j", "1")
    two = stats(str(path), "-j", "2")
    assert one == two and "overlaps one read before it" in one[2]

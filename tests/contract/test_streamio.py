"""streamio: the robust JSON-lines reader (skips, counts, truncation, limits,
schema versions, strict mode) and LineWriter."""

from __future__ import annotations

import io
import os
import sys

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pstate.stream import schema
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.reader import StreamReader
from pstate.stream.streamio import LineWriter, ReadStats, check_record, open_input, plain_state_ok, record_problem
from pstate.stream.reader import read_records

META = b'{"type":"meta","schema":1,"source":"record","tool":"pstate","version":"0.1.0","clock":"monotonic","ts":1}\n'
STATE = (b'{"type":"state","ts":%d,"cpu":0,"pid":10,"tid":11,"comm":"a","from":"running","to":"sleeping",'
         b'"dur_ns":5,"cause":"switch_out","voluntary":true,"kstate":"S","prio":120,"next_tid":0}\n')
END = b'{"type":"end","ts":99,"reason":"eof","events":2,"lost":0}\n'


def write(tmp_path, data: bytes, name="in.jsonl") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def read(path, **kw):
    st = ReadStats()
    return list(read_records([path], st, **kw)), st


def test_valid_stream(tmp_path):
    p = write(tmp_path, META + STATE % 2 + STATE % 3 + END)
    recs, st = read(p)
    assert [r["type"] for r in recs] == ["meta", "state", "state", "end"]
    assert (st.lines, st.records, st.n_skipped, st.truncated_tail) == (4, 4, 0, None)
    assert st.metas[0]["schema"] == 1 and st.ends[0]["events"] == 2
    assert st.problems() == []
    err = io.StringIO()
    assert st.report("pstate x", err=err, strict=True) == 0 and err.getvalue() == ""


def test_types_filter_and_blank_lines(tmp_path):
    p = write(tmp_path, META + b"\n  \n" + STATE % 2 + b"\r\n" + END)
    st = ReadStats()
    recs = list(read_records([p], st, types=frozenset({"state"})))
    assert [r["type"] for r in recs] == ["state"]
    assert st.records == 3 and st.n_skipped == 0  # blank lines are not records, not errors
    assert len(st.metas) == 1 and len(st.ends) == 1


@pytest.mark.parametrize("line, reason", [
    (b"{not json\n", "not valid JSON"),
    (b"[1,2]\n", "not a JSON object"),
    (b'"str"\n', "not a JSON object"),
    (b'{"ts":1}\n', 'no string "type" field'),
    (b'{"type":7}\n', 'no string "type" field'),
    (b'{"type":"meta","schema":"1"}\n', "meta record without an integer schema"),
    (b'{"type":"meta","schema":true}\n', "meta record without an integer schema"),
    (b'{"type":"state","ts":-1,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b"}\n', 'bad or missing "ts"'),
    (b'{"type":"state","ts":1.5,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b"}\n', 'bad or missing "ts"'),
    (b'{"type":"state","ts":18446744073709551616,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b"}\n',
     'bad or missing "ts"'),
    # integers are valid below 2**63 only, in every reader (int64 arithmetic)
    (b'{"type":"state","ts":9223372036854775808,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b"}\n',
     'bad or missing "ts"'),
    (b'{"type":"state","ts":1,"cpu":18446744073709551615,"pid":1,"tid":1,"from":"a","to":"b"}\n',
     'bad or missing "cpu"'),
    (b'{"type":"fork","ts":1,"cpu":0,"pid":9223372036854775808,"tid":1}\n', 'bad or missing "pid"'),
    (b'{"type":"exit","ts":1,"cpu":0,"pid":1,"tid":9223372036854775808}\n', 'bad or missing "tid"'),
    (b'{"type":"state","ts":1,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b","dur_ns":9223372036854775808}\n',
     'bad "dur_ns"'),
    (b'{"type":"loss","ts":1,"reason":"ringbuf_full","count":9223372036854775808}\n', "bad loss record"),
    (b'{"type":"state","ts":1,"cpu":true,"pid":1,"tid":1,"from":"a","to":"b"}\n', 'bad or missing "cpu"'),
    (b'{"type":"exit","ts":1,"cpu":0,"tid":1}\n', 'bad or missing "pid"'),
    (b'{"type":"fork","ts":1,"cpu":0,"pid":1,"tid":null}\n', 'bad or missing "tid"'),
    (b'{"type":"exec","ts":1,"cpu":0,"pid":1,"tid":1,"comm":5}\n', 'bad "comm"'),
    (b'{"type":"state","ts":1,"cpu":0,"pid":1,"tid":1,"from":null,"to":"b"}\n', 'bad "from"/"to"'),
    (b'{"type":"state","ts":1,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b","dur_ns":-3}\n', 'bad "dur_ns"'),
    (b'{"type":"state","ts":1,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b","dur_ns":"3"}\n', 'bad "dur_ns"'),
    (b'{"type":"loss","ts":1,"reason":"ringbuf_full","count":-1}\n', "bad loss record"),
    (b'{"type":"loss","ts":1,"count":1}\n', "bad loss record"),
    (b"\xef\xbb\xbf{}\n", "not valid JSON"),  # a byte order mark
    (b'{"type":"state","comm":"\xff"}\n', "not valid JSON"),  # not UTF-8
    (b'{"type":"state","ts":NaN}\n', "not valid JSON"),
    (b'{"type":"state","ts":1e400}\n', "not valid JSON"),
    (b"[" * 100_000 + b"\n", "not valid JSON"),
])
def test_bad_lines_are_skipped_and_counted(tmp_path, line, reason):
    p = write(tmp_path, META + line + STATE % 2 + line + END)
    recs, st = read(p)
    assert [r["type"] for r in recs] == ["meta", "state", "end"]
    assert st.skipped == {reason: 2}
    assert st.first_bad == {reason: f"{p}:2"}
    assert st.problems() == [f"skipped 2 lines: {reason} (first at {p}:2)"]
    with pytest.raises(PstateError) as e:
        read(p, strict=True)
    assert e.value.exit_code == ExitCode.DATAERR and e.value.message == f"{p}:2: {reason}"


def test_unknown_types_are_counted_unknown_fields_and_states_pass_through(tmp_path):
    """pstate-events(5): a record type this pstate does not know is skipped
    quietly and counted, never a bad line; new fields and states are kept."""
    future = b'{"type":"hint","ts":1,"x":[1]}\n'
    odd = b'{"type":"state","ts":1,"cpu":0,"pid":1,"tid":1,"from":"state_Q","to":"levitating","new_field":{}}\n'
    note = b'{"type":"cgroup","ts":1,"id":7,"path":"/a"}\n'
    recs, st = read(write(tmp_path, META + future + odd + note + future))
    assert [r["type"] for r in recs] == ["meta", "state", "cgroup"] and st.n_skipped == 0
    assert recs[1]["new_field"] == {} and st.unknown == {"hint": 2} and st.records == 5


def test_truncated_tail_is_reported(tmp_path):
    data = META + STATE % 2 + (STATE % 3)[:40]
    p = write(tmp_path, data)
    recs, st = read(p)
    assert [r["type"] for r in recs] == ["meta", "state"]
    assert st.n_skipped == 0
    assert st.truncated_tail == f"{p}: byte {len(META + STATE % 2)}, line 3"
    assert st.problems() == [f"truncated final record at {p}: byte {len(META + STATE % 2)}, line 3"]
    err = io.StringIO()
    assert st.report("pstate stats", err=err) == 0
    assert err.getvalue() == f"pstate stats: warning: truncated final record at {st.truncated_tail}\n"
    assert st.report("pstate stats", err=io.StringIO(), strict=True) == ExitCode.DATAERR
    with pytest.raises(PstateError, match=r":3: truncated record$"):
        read(p, strict=True)


def test_complete_record_without_final_newline_is_not_truncation(tmp_path):
    recs, st = read(write(tmp_path, META + (STATE % 2).rstrip(b"\n")))
    assert [r["type"] for r in recs] == ["meta", "state"]
    assert st.truncated_tail is None and st.problems() == []


def test_over_long_line_is_discarded_without_buffering(tmp_path):
    long = b'{"type":"state","pad":"' + b"x" * 5000 + b'"}\n'
    p = write(tmp_path, META + long + STATE % 2 + b"y" * 3000)
    st = ReadStats()
    recs = list(read_records([p], st, max_line=1000))
    assert [r["type"] for r in recs] == ["meta", "state"]
    assert st.skipped == {"line longer than 1000 bytes": 2}
    assert st.truncated_tail is None  # an over-long tail is a skip, not a truncation
    assert st.lines == 4


def test_read_records_reads_in_bounded_pieces(tmp_path):
    class Spy(io.BytesIO):
        sizes = []

        def read1(self, size=-1):
            Spy.sizes.append(size)
            return super().read1(size)

    p = write(tmp_path, b"a" * 1_000_000 + b"\n" + META)
    st_ = ReadStats()
    real_open = streamio_open = __import__("pstate.stream.reader", fromlist=["open_input"]).open_input
    import pstate.stream.reader as reader_mod

    reader_mod.open_input = lambda path: Spy(open(path, "rb").read())
    try:
        recs = list(read_records([p], st_, max_line=1000))
    finally:
        reader_mod.open_input = real_open
    assert [r["type"] for r in recs] == ["meta"]
    assert Spy.sizes and all(0 < n <= 1 << 16 for n in Spy.sizes)
    assert st_.skipped == {"line longer than 1000 bytes": 1}
    del streamio_open


def test_line_of_exactly_the_limit_is_kept(tmp_path):
    line = b'{"type":"end","p":"' + b"a" * (1000 - 22) + b'"}\n'
    assert len(line) == 1000
    recs, st = read(write(tmp_path, line + line[:-1] + b"aa\n"), max_line=998)
    assert recs == [] and st.skipped == {"line longer than 998 bytes": 2}
    recs, st = read(write(tmp_path, line), max_line=999)
    assert len(recs) == 1 and st.n_skipped == 0


def test_newer_schema_is_refused_with_exit_65(tmp_path):
    p = write(tmp_path, b'{"type":"meta","schema":2,"version":"9.0"}\n' + STATE % 2)
    with pytest.raises(PstateError) as e:
        read(p)
    assert e.value.exit_code == 65
    assert e.value.message == (f"{p} was written in event format 2 (by pstate 9.0); this pstate reads formats "
                               f"up to {schema.SCHEMA_VERSION}\n  fix: upgrade pstate")


def test_older_or_equal_schema_is_accepted(tmp_path):
    recs, _ = read(write(tmp_path, b'{"type":"meta","schema":0}\n{"type":"meta","schema":1}\n'))
    assert len(recs) == 2


def test_loss_records_are_summed(tmp_path):
    loss = b'{"type":"loss","ts":1,"reason":"ringbuf_full","count":%d,"since_ts":0}\n'
    _, st = read(write(tmp_path, META + loss % 3 + loss % 4 + b'{"type":"loss","ts":1,"reason":"map_full","count":1}\n'))
    assert st.loss == {"ringbuf_full": 7, "map_full": 1} and st.lost == 8
    err = io.StringIO()
    assert st.report("pstate heat", err=err) == 0
    assert err.getvalue() == "pstate heat: warning: the input reports 8 lost events; results are incomplete\n"


def test_several_files_in_order_and_stdin(tmp_path, monkeypatch):
    a = write(tmp_path, META + STATE % 1, "a.jsonl")
    b = write(tmp_path, STATE % 2 + b"junk\n", "b.jsonl")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(STATE % 3)))
    st = ReadStats()
    recs = list(read_records([a, b, "-"], st))
    assert [r.get("ts") for r in recs] == [1, 1, 2, 3]
    assert st.first_bad == {"not valid JSON": f"{b}:2"}


def test_missing_directory_and_device_inputs(tmp_path):
    for path, msg in ((str(tmp_path / "nope"), "cannot open"), (str(tmp_path), "is a directory"),
                      ("/dev/zero", "is not a regular file or a pipe")):
        with pytest.raises(PstateError, match=msg) as e:
            open_input(path)
        assert e.value.exit_code == ExitCode.NOINPUT


def test_fifo_input(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    pid = os.fork()
    if pid == 0:  # writer
        try:
            with open(fifo, "wb") as f:
                f.write(META + STATE % 5)
        finally:
            os._exit(0)
    recs, _ = read(str(fifo))
    os.waitpid(pid, 0)
    assert [r["type"] for r in recs] == ["meta", "state"]


def test_check_record_accepts_what_the_writers_write():
    assert check_record({"type": "end", "reason": "eof"}) is None
    assert check_record({"type": "rate", "ts": 1, "sample_every": 2}) is None
    assert check_record({"type": "state", "ts": 0, "cpu": 0, "pid": 0, "tid": 0, "from": "unknown",
                         "to": "running", "dur_ns": None}) is None


# --- LineWriter -------------------------------------------------------------


def test_line_writer_to_a_file(tmp_path):
    out = tmp_path / "o.jsonl"
    w = LineWriter(str(out))
    w.record({"type": "meta", "schema": 1})
    w.raw(b'{"a":1}\n{"b":2}\n', 2)
    assert w.lines == 3
    w.close(sync=True)
    assert out.read_bytes() == b'{"type":"meta","schema":1}\n{"a":1}\n{"b":2}\n'
    assert out.stat().st_mode & 0o777 == 0o600


def test_line_writer_cannot_create(tmp_path):
    with pytest.raises(PstateError) as e:
        LineWriter(str(tmp_path / "no" / "such" / "dir.jsonl"))
    assert e.value.exit_code == ExitCode.CANTCREAT
    assert "cannot create" in e.value.message and "No such file or directory" in e.value.message


def test_line_writer_to_stdout_flushes_when_unbuffered(monkeypatch):
    class Out(io.BytesIO):
        flushes = 0

        def flush(self):
            Out.flushes += 1

    buf = Out()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buf))
    w = LineWriter(None, unbuffered=True)
    w.record({"x": 1})
    w.raw(b"{}\n", 1)
    assert Out.flushes >= 2
    w.close()
    assert buf.getvalue() == b'{"x":1}\n{}\n'
    assert w.owned is False


def test_line_writer_round_trip(tmp_path):
    recs = [{"type": "meta", "schema": 1, "states": schema.state_vocabulary()},
            {"type": "state", "ts": 2**63 - 1, "cpu": 0, "pid": 1, "tid": 1, "comm": 'q"\\\n\u2603',
             "from": "a", "to": "b", "dur_ns": None}]
    out = tmp_path / "rt.jsonl"
    w = LineWriter(str(out))
    for r in recs:
        w.record(r)
    w.close()
    assert read(str(out))[0] == recs
    assert [orjson.loads(x) for x in out.read_bytes().splitlines()] == recs


# --- the line splitter of reader.StreamReader ----------------------------------


class Lines:
    """A sink for input of which no line is a record."""

    def rows(self, rows):
        raise AssertionError("no state records here")

    def record(self, rec, weight):
        raise AssertionError("strings are no records")


@settings(max_examples=300, deadline=None)
@given(data=st.text(alphabet="ab \n", max_size=300).map(str.encode),
       limit=st.integers(1, 40), chunk=st.integers(1, 50))
def test_line_splitter_counts_lines_like_splitlines(data, limit, chunk):
    """However the input is cut into chunks, the lines, the over-long ones
    and the truncated tail come out as a split at newlines makes them."""
    st_ = ReadStats()
    rd = StreamReader(Lines(), st_, max_line=limit)
    rd.begin("x", at_start=False)
    for i in range(0, len(data), chunk):
        rd.feed(data[i:i + chunk])
    rd.end()
    parts = data.split(b"\n")
    tail = parts.pop()
    want_long = sum(1 for p in parts + [tail] if len(p) > limit)
    assert st_.lines == len(parts) + (1 if tail else 0)
    assert st_.skipped.get(f"line longer than {limit} bytes", 0) == want_long
    assert st_.skipped.get("not valid JSON", 0) == sum(1 for p in parts if p.strip() and len(p) <= limit)
    assert (st_.truncated_tail is not None) == (0 < len(tail) <= limit)


def test_a_cut_in_an_earlier_file_stays_reported(tmp_path):
    a = write(tmp_path, META + (STATE % 1)[:30], "a.jsonl")
    b = write(tmp_path, (STATE % 2).rstrip(b"\n"), "b.jsonl")  # complete, without a final newline
    st_ = ReadStats()
    recs = list(read_records([a, b], st_))
    assert [r.get("ts") for r in recs] == [1, 2]
    assert st_.truncated_tail == f"{a}: byte {len(META)}, line 2"


def test_largest_valid_integer_is_2_to_the_63_minus_1():
    big = 2**63 - 1
    assert check_record({"type": "state", "ts": big, "cpu": big, "pid": big, "tid": big, "from": "a", "to": "b",
                         "dur_ns": big}) is None
    assert check_record({"type": "loss", "ts": 1, "reason": "map_full", "count": big}) is None


def test_a_byte_order_mark_at_the_start_of_each_file_is_dropped(tmp_path):
    bom = b"\xef\xbb\xbf"
    a = write(tmp_path, bom + META + STATE % 1, "a.jsonl")
    b = write(tmp_path, bom + META + (STATE % 2)[:30], "b.jsonl")
    st_ = ReadStats()
    recs = list(read_records([a, b], st_, strict=False))
    assert [r["type"] for r in recs] == ["meta", "state", "meta"]
    assert st_.n_skipped == 0 and len(st_.metas) == 2
    assert st_.truncated_tail == f"{b}: byte {len(bom + META)}, line 2"  # offsets count the mark
    only = write(tmp_path, bom + b"\n" + META, "c.jsonl")
    assert [r["type"] for r in read(only)[0]] == ["meta"]


# --- check_record's quick accept agrees with its full checks ----------------------

_values = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.integers(2**63 - 2, 2**63 + 2),
                    st.integers(2**64 - 2, 2**64 + 2), st.integers(-(2**64), -(2**62)),
                    st.floats(allow_nan=False), st.text(max_size=3), st.lists(st.integers(), max_size=2))


@settings(max_examples=800, deadline=None)
@given(st.dictionaries(st.sampled_from(["ts", "cpu", "pid", "tid", "comm", "from", "to", "dur_ns"]), _values),
       st.booleans())
def test_the_quick_accept_of_a_state_record_accepts_only_what_the_full_checks_accept(fields, typical):
    rec = {"type": "state", "ts": 1, "cpu": 0, "pid": 1, "tid": 1, "comm": "a", "from": "x", "to": "y",
           "dur_ns": 3} if typical else {"type": "state"}
    rec.update(fields)
    if plain_state_ok(rec):
        assert record_problem(rec) is None
    assert check_record(rec) == record_problem(rec)
    if typical and not fields:
        assert plain_state_ok(rec)


# --- records out of order (issue #35) ------------------------------------------------


def ev(ts: int, cpu: int = 0, kind: str = "state", **kw) -> bytes:
    rec = {"type": kind, "ts": ts, "cpu": cpu, "pid": 10, "tid": 11, "comm": "a"}
    if kind == "state":
        rec.update({"from": "running", "to": "sleeping", "dur_ns": 5})
    rec.update(kw)
    return orjson.dumps(rec) + b"\n"


OTHER = [  # records without a cpu: never checked, whatever their ts
    b'{"type":"loss","ts":1,"reason":"ringbuf_full","count":1}\n',
    b'{"type":"process","ts":1,"pid":10,"comm":"a","why":"first"}\n',
    b'{"type":"cgroup","ts":1,"cgroup":5,"path":"/x","gone":false}\n',
    b'{"type":"rate","ts":1,"sample_every":2,"events_per_s":9}\n',
    b'{"type":"stack","ts":1,"stack_id":1,"frames":"a;b"}\n',
    b'{"type":"hologram","ts":1,"cpu":0}\n',  # a type this pstate does not know: not read
]


@pytest.mark.parametrize("data, count, first", [
    (META + ev(10) + ev(20) + ev(20) + ev(30), 0, None),  # equal ts are in order
    (META + ev(10) + ev(5) + ev(7) + ev(6), 2, 3),  # each step back counts, against the record before it
    (META + ev(10) + ev(10**12) + ev(20) + ev(30), 1, 4),  # one in the future makes one count, not all after
    (META + ev(10, cpu=0) + ev(5, cpu=1) + ev(11, cpu=0) + ev(6, cpu=1), 0, None),  # per CPU
    (META + ev(10, cpu=1) + ev(5, cpu=1, kind="fork", child_pid=1, child_tid=1, thread=False)
     + ev(4, cpu=1, kind="exec", old_tid=11) + ev(3, cpu=1, kind="exit", group_dead=True), 3, 3),
    (META + ev(10) + b"".join(OTHER) + ev(11), 0, None),
    (META + ev(10) + META + ev(5) + ev(6), 0, None),  # a meta record starts a recording
    (ev(10) + ev(9) + META + ev(1), 1, 2),  # (records before any meta too)
    (META + ev(10, cpu=2**62) + ev(9, cpu=2**62) + ev(8, cpu=4096) + ev(9, cpu=4096), 1, 3),  # any cpu
    (META + ev(10) + b"{bad\n" + ev(5, tid="x") + ev(9), 1, 5),  # skipped lines are not records
])
def test_records_out_of_order_per_cpu(tmp_path, data, count, first):
    p = write(tmp_path, data)
    recs, st_ = read(p)
    assert st_.out_of_order == count
    assert st_.order.first == ((p, first) if first else None)
    problems = [x for x in st_.problems() if "out of order" in x]
    if count:
        assert problems == [f"{count} record{'s' if count > 1 else ''} out of order: a ts lower than that of the "
                            f"record before it on the same CPU (first at {p}:{first})"]
        assert st_.report("pstate x", err=io.StringIO()) == 0
        assert st_.report("pstate x", err=io.StringIO(), strict=True) == 65
    else:
        assert problems == []


def test_sources_read_one_after_another_continue_one_another(tmp_path):
    a = write(tmp_path, META + ev(10) + ev(20), "a.jsonl")
    b = write(tmp_path, ev(15) + ev(25), "b.jsonl")  # a part of the same recording
    c = write(tmp_path, META + ev(1), "c.jsonl")  # another recording
    st_ = ReadStats()
    list(read_records([a, b, c], st_))
    assert (st_.out_of_order, st_.order.first) == (1, (b, 1))


def test_out_of_order_per_interval_and_after_a_pickle():
    import pickle

    st_ = ReadStats()
    rd = StreamReader(type("S", (), {"rows": lambda s, r: None, "record": lambda s, r, w: None})(), st_)
    rd.begin("in")
    rd.feed(META + ev(10) + ev(5))
    mark = st_.mark()
    rd.feed(ev(4) + ev(3) + ev(8))
    assert st_.out_of_order == 3 and st_.since(mark).out_of_order == 2
    assert "2 records out of order" in st_.since(mark).problems()[0] and "(first at in:3)" in st_.problems()[0]
    again = pickle.loads(pickle.dumps(st_))
    assert again == st_ and again.out_of_order == 3 and again.order.cells[3] == 8


def test_a_part_read_on_its_own_joins_what_came_before():
    """stats -j: the first record on each CPU in a part goes against the last
    one before the part; a part with a meta record starts anew."""
    def part(data: bytes, at_start: bool) -> ReadStats:
        st_ = ReadStats()
        rd = StreamReader(type("S", (), {"rows": lambda s, r: None, "record": lambda s, r, w: None})(), st_)
        rd.begin("f", at_start=at_start)
        rd.feed(data)
        rd.end()
        return st_

    one, two, three = META + ev(10) + ev(20, cpu=1), ev(5) + ev(4) + ev(30, cpu=1), META + ev(1) + ev(2)
    whole = part(one + two + three, True)
    joined = part(one, True)
    for data in (two, three):
        p = part(data, False)
        joined.lines += p.lines  # (as ingest.merge_read_stats does, before join_spans)
        joined.join_spans(p)
    assert (joined.out_of_order, joined.order.first) == (whole.out_of_order, whole.order.first) == (2, ("f", 4))
    assert joined.order == whole.order

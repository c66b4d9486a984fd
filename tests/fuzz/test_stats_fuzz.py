"""The fast path and the reference path agree on any input, however broken:
same counts of lines, records and skipped lines (with the same first bad
line), same truncated tail, same numbers; with --strict, the same error."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pstate.stream import reader, streamio
from pstate.render import tables
from pstate.analysis import timeinstate
from pstate.analysis import ingest
from pstate.exitcodes import PstateError
from conftest import TESTS

BASIC = (TESTS / "data" / "stats" / "basic.jsonl").read_bytes()
LINES = BASIC.splitlines(keepends=True)
MAX_LINE = 400

odd_values = st.sampled_from([None, True, -1, 1.5, "x", [], {}, 2**64 - 1, 0, "running", "\u00e9"])
fields = st.sampled_from(["type", "ts", "cpu", "pid", "tid", "comm", "from", "to", "dur_ns",
                          "reason", "count", "schema", "voluntary"])


@st.composite
def mutated(draw) -> bytes:
    lines = list(LINES)
    for _ in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["field", "drop-field", "bytes", "cut", "blank", "dup", "long",
                                   "join", "array", "loss", "meta"]))
        line = lines[i]
        if op in ("field", "drop-field"):
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if type(rec) is not dict:
                continue
            f = draw(fields)
            if op == "field":
                rec[f] = draw(odd_values)
            else:
                rec.pop(f, None)
            lines[i] = orjson.dumps(rec) + b"\n"
        elif op == "bytes":
            pos = draw(st.integers(0, len(line)))
            junk = draw(st.binary(max_size=8))
            lines[i] = line[:pos] + junk + line[pos:]
        elif op == "cut":
            lines[i] = line[:draw(st.integers(0, len(line)))]
        elif op == "blank":
            lines.insert(i, draw(st.sampled_from([b"\n", b"   \n", b"\t\r\n"])))
        elif op == "dup":
            lines.insert(i, line)
        elif op == "long":
            lines.insert(i, b'{"type":"state","comm":"' + b"x" * draw(st.integers(MAX_LINE - 40, MAX_LINE + 40))
                         + b'"}\n')
        elif op == "join":
            lines[i] = line.rstrip(b"\n")
        elif op == "array":
            lines.insert(i, b"[" + line.rstrip(b"\n") + b"]\n")
        elif op == "loss":
            lines.insert(i, orjson.dumps({"type": "loss", "ts": 5, "reason": "map_full",
                                          "count": draw(st.integers(0, 9))}) + b"\n")
        elif op == "meta":
            lines.insert(i, orjson.dumps({"type": "meta", "schema": draw(st.sampled_from([1, 1, 2])),
                                          "ts": 10}) + b"\n")
    data = b"".join(lines)
    if draw(st.booleans()):
        data = data[:draw(st.integers(0, len(data)))]
    return data


def fast(data: bytes, by: str, chunk: int, strict: bool):
    stats = streamio.ReadStats()
    agg = timeinstate.Aggregator(by)
    dig = ingest.LineDigester(agg, stats, strict=strict, max_line=MAX_LINE)
    dig.begin("in.jsonl")
    for i in range(0, len(data), chunk):
        dig.feed(data[i:i + chunk])
    dig.end()
    return stats, agg


def careful(data: bytes, by: str, strict: bool, tmp: Path):
    (tmp / "in.jsonl").write_bytes(data)
    stats = streamio.ReadStats()
    agg = timeinstate.Aggregator(by)
    ingest.digest_records(reader.read_records([str(tmp / "in.jsonl")], stats, max_line=MAX_LINE,
                                             strict=strict), agg)
    return stats, agg


def outcome(fn):
    try:
        stats, agg = fn()
    except PstateError as e:
        return ("error", e.exit_code, e.message.replace(str(TMP[0]) + "/", ""))
    s = agg.summarise(stats)
    rep = tables.build_report(s, s.groups, hist=True, with_matrix=True)
    rep["input"]["truncated_tail"] = (rep["input"]["truncated_tail"] or "").replace(str(TMP[0]) + "/", "")
    first_bad = {k: v.replace(str(TMP[0]) + "/", "") for k, v in stats.first_bad.items()}
    return ("ok", rep, first_bad, stats.metas, stats.ends)


TMP: list = []


@pytest.fixture(autouse=True)
def tmp(tmp_path):
    TMP[:] = [tmp_path]
    return tmp_path


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated(), by=st.sampled_from(["pid", "tid", "comm"]), chunk=st.sampled_from([1, 5, 64, 4096]),
       strict=st.booleans())
def test_fast_and_careful_agree(tmp, data, by, chunk, strict):
    a = outcome(lambda: fast(data, by, chunk, strict))
    b = outcome(lambda: careful(data, by, strict, tmp))
    assert a == b


def in_parts(data: bytes, by: str, strict: bool, tmp: Path, cuts: list):
    (tmp / "in.jsonl").write_bytes(data)
    starts = sorted({0} | {data.find(b"\n", c) + 1 for c in cuts if 0 <= data.find(b"\n", c) < len(data) - 1})
    bounds = starts + [len(data)]
    parts = [(a, b) for a, b in zip(bounds, bounds[1:]) if a < b] or [(0, len(data))]
    stats = streamio.ReadStats()
    agg = timeinstate.Aggregator(by)
    ingest.digest_parallel(str(tmp / "in.jsonl"), agg, stats, jobs=1, strict=strict, max_line=MAX_LINE,
                        parts=parts)
    return stats, agg


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mutated(), by=st.sampled_from(["pid", "tid", "comm"]), strict=st.booleans(),
       cuts=st.lists(st.integers(0, 8000), max_size=6))
def test_parts_merged_agree_with_careful(tmp, data, by, strict, cuts):
    a = outcome(lambda: in_parts(data, by, strict, tmp, cuts))
    b = outcome(lambda: careful(data, by, strict, tmp))
    assert a == b

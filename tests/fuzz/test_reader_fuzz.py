"""Readers on untrusted input (issue #9, items 12-16).

12. a valid file cut at every byte offset: records before the cut are used,
    the truncated tail is reported, never a traceback;
13. a 2 GB single line and a line nested 200,000 deep: a clear skip, bounded
    memory (< 200 MB peak RSS);
14. property tests over every field (wrong types, NaN/inf, huge numbers,
    unknown states, bad UTF-8): only skips or clean errors; read(write(x)) == x;
15. the fuzz corpus in tests/data/corpus/ through read_records and the stats,
    replay and heat commands, on every run;
16. golden recordings of every format version stay readable with zero skips.

The commands run in a forked child of this process (main() with its own
stdin/stdout/stderr and exit code, without interpreter start-up), or as real
subprocesses where memory or the whole program matters.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pstate.commands.heat  # noqa: F401  (imported before forking, so children start fast)
import pstate.commands.replay  # noqa: F401
import pstate.commands.stats  # noqa: F401
from conftest import TESTS, clean_env, pstate_cmd, run_measured
from pstate.stream import schema
from pstate.exitcodes import PstateError
from pstate.main import main as pstate_main
from pstate.stream.streamio import LineWriter, ReadStats, check_record
from pstate.stream.reader import read_records

CORPUS_DIR = TESTS / "data" / "corpus"
GOLDEN_DIRS = sorted(TESTS.glob("data/golden-v*"))
GOLDEN = sorted(p for d in GOLDEN_DIRS for p in d.glob("*.jsonl"))
CORPUS = sorted(CORPUS_DIR.glob("*.jsonl")) + GOLDEN
NEWER_SCHEMA = {"newer-schema.jsonl", "newer-schema-later.jsonl"}
MB = 1 << 20

COMMANDS = {
    "stats": ["stats"],
    "stats-careful": ["stats", "--reader", "careful"],
    "stats-json": ["stats", "--format", "json"],
    "replay": ["replay", "--no-wait"],
    "heat": ["heat"],
    "export": ["export", "-q"],
    "export-chrome": ["export", "-q", "-f", "chrome"],
}

# (command, corpus file) pairs that crash today, kept visible as expected
# failures until the command is fixed (then they pass and can be removed).
KNOWN_CRASHES: dict = {}


# --- running a command --------------------------------------------------------


@dataclass
class Run:
    code: int
    out: bytes
    err: str
    maxrss_kb: int = 0


def run_forked(args: list[str], stdin: str | None = None, timeout: float = 60) -> Run:
    """`pstate ARGS` through main() in a forked child: real exit code, stdout and
    stderr; an uncaught exception prints its traceback and exits 1, as Python does."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # child: never returns
            code = 1
            try:
                fd = os.open(stdin or os.devnull, os.O_RDONLY)
                os.dup2(fd, 0)
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                signal.signal(signal.SIGPIPE, signal.SIG_DFL)
                sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
                sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
                sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                              line_buffering=True)
                sys.argv = ["pstate", *args]
                try:
                    pstate_main()
                    code = 0
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                for f in (sys.stdout, sys.stderr):
                    try:
                        f.flush()
                    except Exception:
                        pass
            finally:
                os._exit(code)
        deadline = time.monotonic() + timeout
        while True:
            wpid, status, ru = os.wait4(pid, os.WNOHANG)
            if wpid:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                pytest.fail(f"pstate {' '.join(args)} did not finish within {timeout} s")
            time.sleep(0.002)
        out.seek(0)
        err.seek(0)
        code = os.waitstatus_to_exitcode(status)
        return Run(code, out.read(), err.read().decode("utf-8", "replace"), ru.ru_maxrss)


def run_process(args: list[str], timeout: float = 120) -> Run:
    """`python -m pstate ARGS` as a real process."""
    proc = subprocess.run(pstate_cmd(*args), stdin=subprocess.DEVNULL, capture_output=True, env=clean_env(),
                          timeout=timeout)
    return Run(proc.returncode, proc.stdout, proc.stderr.decode("utf-8", "replace"))


def assert_clean(r: Run, allowed=(0, 65)):
    assert "Traceback" not in r.err, r.err[-3000:]
    assert r.code in allowed, (r.code, r.err[-3000:])


def replay_output_parses(out: bytes) -> list[dict]:
    """Every line replay wrote is one JSON object, newline-terminated."""
    assert out == b"" or out.endswith(b"\n")
    return [orjson.loads(x) for x in out.split(b"\n")[:-1]]


def read_all(path, strict=False):
    stats = ReadStats()
    recs = list(read_records([str(path)], stats, strict=strict))
    return recs, stats


# --- 16. golden files of every format version ---------------------------------


def test_there_is_a_golden_recording_of_the_current_format():
    assert (TESTS / f"data/golden-v{schema.SCHEMA_VERSION}").is_dir()
    assert GOLDEN


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_golden_recording_reads_with_zero_skips(path):
    recs, stats = read_all(path, strict=True)
    assert stats.n_skipped == 0 and stats.truncated_tail is None and stats.problems() == []
    assert stats.records == stats.lines == len(recs) == len(path.read_bytes().splitlines())
    assert recs[0]["type"] == "meta" and recs[0]["schema"] <= schema.SCHEMA_VERSION
    assert recs[-1]["type"] == "end"
    events = [r for r in recs if r["type"] in schema.EVENT_TYPES]
    assert len(events) == recs[-1]["events"] > 0
    for r in recs:
        doc = set(schema.COMMON_FIELDS) | set(schema.RECORDS[r["type"]][1])
        assert set(r) <= doc, (r["type"], set(r) - doc)
        if r["type"] == "state":
            assert r["cause"] in schema.CAUSES
            assert r["from"] in schema.STATES and r["to"] in schema.STATES


@pytest.mark.parametrize("cmd", ["stats", "stats-careful", "stats-json", "replay", "heat"])
def test_golden_recording_through_the_readers(cmd):
    for path in GOLDEN:
        r = run_forked([*COMMANDS[cmd], str(path)])
        assert (r.code, r.err) == (0, ""), r.err
        if cmd == "replay":
            out = replay_output_parses(r.out)
            src = [orjson.loads(x) for x in path.read_bytes().splitlines()]
            assert [x for x in out if x["type"] in schema.EVENT_TYPES] == \
                   [x for x in src if x["type"] in schema.EVENT_TYPES]
        if cmd == "stats-json":
            inp = orjson.loads(r.out)["input"]
            assert inp["skipped_total"] == 0 and inp["truncated_tail"] is None


# --- 12. truncation at every byte offset ---------------------------------------


def three_records() -> bytes:
    """meta, one state record, end: the golden v1 recording cut down."""
    lines = GOLDEN[0].read_bytes().splitlines(keepends=True)
    state = next(x for x in lines if b'"type":"state"' in x)
    return lines[0] + state + lines[-1]


def test_truncated_at_every_byte_offset(tmp_path):
    from pstate.analysis import timeinstate
    from pstate.analysis import ingest

    data = three_records()
    full = [orjson.loads(x) for x in data.splitlines()]
    starts = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A]
    path = tmp_path / "cut.jsonl"
    for cut in range(len(data) + 1):
        path.write_bytes(data[:cut])
        recs, stats = read_all(path)
        complete = data[:cut].count(b"\n")
        at_boundary = cut in starts
        whole_without_newline = not at_boundary and data[cut:cut + 1] == b"\n"
        expect = full[:complete + (1 if whole_without_newline else 0)]
        assert recs == expect, cut
        assert stats.n_skipped == 0, (cut, stats.skipped)
        if at_boundary or whole_without_newline:
            assert stats.truncated_tail is None, cut
            assert list(read_records([str(path)], ReadStats(), strict=True)) == expect
        else:
            line_start = max(s for s in starts if s <= cut)
            assert stats.truncated_tail == f"{path}: byte {line_start}, line {complete + 1}", cut
            assert stats.report("t", err=io.StringIO(), strict=True) == 65
            with pytest.raises(PstateError) as e:
                list(read_records([str(path)], ReadStats(), strict=True))
            assert e.value.exit_code == 65 and e.value.message.endswith(f":{complete + 1}: truncated record")
        # stats' fast path must agree with the reference reader
        fast = ReadStats()
        ingest.digest_files([str(path)], timeinstate.Aggregator("pid"), fast, chunk=97)
        assert (fast.records, fast.n_skipped, fast.truncated_tail) == (len(recs), 0, stats.truncated_tail), cut


def _cut_points(data: bytes) -> list[int]:
    first_nl = data.index(b"\n")
    mid_state = data.index(b'"type":"state"', first_nl) + 40
    last_nl = data.rindex(b"\n", 0, len(data) - 1)
    return [first_nl // 2, mid_state, last_nl + 1, len(data) - 1]


@pytest.mark.parametrize("cmd", ["stats", "replay", "heat"])
def test_truncated_recording_through_the_real_commands(tmp_path, cmd):
    data = GOLDEN[0].read_bytes()
    full = [orjson.loads(x) for x in data.splitlines()]
    strict_checked = False
    for cut in _cut_points(data):
        path = tmp_path / f"cut-{cut}.jsonl"
        path.write_bytes(data[:cut])
        args = ["stats", "--format", "json"] if cmd == "stats" else COMMANDS[cmd]
        r = run_process([*args, str(path)])
        complete = data[:cut].count(b"\n")
        whole = data[cut:cut + 1] == b"\n"  # the cut only removed the final newline
        if not complete and not whole:  # not one valid record in non-empty input: 65 (issue 22)
            assert_clean(r, allowed=(65,))
            assert "error: not one valid record in the input" in r.err, r.err
        else:
            assert_clean(r, allowed=(0,))
        boundary = cut == 0 or data[cut - 1:cut] == b"\n"
        if boundary or whole:
            assert "truncated" not in r.err, (cut, r.err)
        else:
            start = data.rindex(b"\n", 0, cut) + 1 if complete else 0
            assert f"warning: truncated final record at {path}: byte {start}, line {complete + 1}" in r.err, r.err
        events = [x for x in full[:complete + whole] if x["type"] in schema.EVENT_TYPES]
        if cmd == "stats":
            assert orjson.loads(r.out)["input"]["events"] == len(events)
        elif cmd == "replay":
            out = [x for x in replay_output_parses(r.out) if x["type"] in schema.EVENT_TYPES]
            assert out == events
        else:
            assert r.out
        if not (boundary or whole or strict_checked):
            strict_checked = True
            strict = run_process([*args, "--strict", str(path)])
            assert_clean(strict, allowed=(65,))


# --- 13. a 2 GB line and deep nesting: bounded memory -------------------------

GEN_2GB = (
    "import sys\n"
    "w = sys.stdout.buffer.write\n"
    "b = b'a' * (1 << 20)\n"
    "for _ in range(2048):\n"
    "    w(b)\n"
    "w(b'\\n' + sys.argv[1].encode())\n"
)
READ_STDIN = (
    "import sys\n"
    "from pstate.stream.streamio import ReadStats\nfrom pstate.stream.reader import read_records\n"
    "st = ReadStats()\n"
    "n = sum(1 for _ in read_records(['-'], st))\n"
    "st.report('read_records')\n"
    "print(n)\n"
)


def _tail_lines() -> str:
    meta = {"type": "meta", "schema": 1, "source": "record", "ts": 1}
    state = {"type": "state", "ts": 2, "cpu": 0, "pid": 5, "tid": 5, "comm": "x", "from": "running",
             "to": "sleeping", "dur_ns": 1000, "cause": "switch_out"}
    return orjson.dumps(meta).decode() + "\n" + orjson.dumps(state).decode() + "\n"


def _reader_cmd(cmd: str) -> list[str]:
    if cmd == "read_records":
        return [sys.executable, "-c", READ_STDIN]
    return pstate_cmd(*{"stats": ["stats", "--format", "json"], "replay": ["replay", "--no-wait"],
                        "heat": ["heat"]}[cmd])


def _run_measured(argv: list[str], stdin, timeout: float = 60) -> Run:
    """Run argv; its exit code, output and peak RSS."""
    return Run(*run_measured(argv, stdin, timeout))


def _check_long_line_skipped(cmd: str, r: Run, where: str, why: str | None = None):
    assert_clean(r, allowed=(0,))
    why = why or f"skipped 1 line: line longer than 1048576 bytes (first at {where}:1)"
    assert why in r.err, r.err
    assert r.maxrss_kb * 1024 < 200 * MB, f"peak RSS {r.maxrss_kb} KB"
    if cmd == "read_records":
        assert r.out == b"2\n"
    elif cmd == "stats":
        assert orjson.loads(r.out)["input"]["events"] == 1
    elif cmd == "replay":
        assert [x["type"] for x in replay_output_parses(r.out)].count("state") == 1


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ["read_records", "stats", "replay", "heat"])
def test_2gb_single_line_on_a_pipe(cmd):
    gen = subprocess.Popen([sys.executable, "-c", GEN_2GB, _tail_lines()], stdout=subprocess.PIPE)
    try:
        r = _run_measured(_reader_cmd(cmd), gen.stdout)
    finally:
        gen.stdout.close()
        gen.kill()
        gen.wait()
    print(f"{cmd}: 2 GiB line on a pipe, peak RSS {r.maxrss_kb / 1024:.1f} MB")
    _check_long_line_skipped(cmd, r, "<stdin>")


@pytest.mark.slow
@pytest.mark.parametrize("cmd", ["stats", "heat"])
def test_long_single_line_in_a_sparse_file(tmp_path, cmd):
    # A regular file rather than a pipe; 256 MiB (reading 2 GiB of holes
    # only fills the page cache with zeros for 10 s more).
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as f:
        f.truncate(256 << 20)  # NUL bytes that take no disk space
        f.seek(0, os.SEEK_END)
        f.write(b"\n" + _tail_lines().encode())
    r = _run_measured(_reader_cmd(cmd) + [str(path)], subprocess.DEVNULL)
    print(f"{cmd}: 256 MiB sparse file, peak RSS {r.maxrss_kb / 1024:.1f} MB")
    # A file that starts with a hole reads as one cut while being written
    # (copytruncate): the NUL bytes are counted and reported, never held.
    _check_long_line_skipped(cmd, r, str(path), why=f"{path} starts with {256 << 20} NUL bytes")


def test_orjson_is_new_enough_for_deep_nesting():
    version = tuple(int(x) for x in orjson.__version__.split(".")[:3])
    assert version >= (3, 9, 15), "orjson < 3.9.15 crashes on deeply nested input"


def _deep_file(tmp_path) -> Path:
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b"[" * 200_000 + b"\n" + b'{"a":' * 200_000 + b"\n" + _tail_lines().encode())
    return path


def test_200000_deep_nesting_read_records(tmp_path):
    recs, stats = read_all(_deep_file(tmp_path))
    assert [r["type"] for r in recs] == ["meta", "state"]
    assert stats.skipped == {"not valid JSON": 2}


@pytest.mark.parametrize("cmd", ["read_records", "stats", "replay", "heat"])
def test_200000_deep_nesting_commands(tmp_path, cmd):
    with open(_deep_file(tmp_path), "rb") as f:
        r = _run_measured(_reader_cmd(cmd), f)
    assert_clean(r, allowed=(0,))
    print(f"{cmd}: 200,000-deep lines, peak RSS {r.maxrss_kb / 1024:.1f} MB")
    assert "skipped 2 lines: not valid JSON (first at <stdin>:1)" in r.err, r.err
    assert r.maxrss_kb * 1024 < 200 * MB


# --- 15. the fuzz corpus -------------------------------------------------------


def test_corpus_is_seeded():
    names = {p.name for p in CORPUS}
    assert len(names) >= 30
    assert {"deep-nesting.jsonl", "huge-numbers.jsonl", "nul-bytes.jsonl", "crlf.jsonl", "bom.jsonl",
            "malformed-json.jsonl", "bad-utf8.jsonl"} <= names


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_corpus_read_records(path):
    for strict in (False, True):
        stats = ReadStats()
        try:
            for rec in read_records([str(path)], stats, strict=strict):
                assert check_record(rec) is None
        except PstateError as e:
            assert e.exit_code == 65, e.message
            assert strict or path.name in NEWER_SCHEMA, e.message
            continue
        assert path.name not in NEWER_SCHEMA
        assert stats.lines <= path.read_bytes().count(b"\n") + 1
        assert stats.records + stats.n_skipped <= stats.lines


def _corpus_cases():
    for cmd in COMMANDS:
        for path in CORPUS:
            why = KNOWN_CRASHES.get((cmd, path.name))
            marks = [pytest.mark.xfail(reason=why, strict=False)] if why else []
            yield pytest.param(cmd, path, id=f"{cmd}-{path.name}", marks=marks)


@pytest.mark.parametrize("cmd, path", list(_corpus_cases()))
def test_corpus_through_the_commands(cmd, path):
    r = run_forked([*COMMANDS[cmd], str(path)])
    assert_clean(r)
    if path.name in NEWER_SCHEMA:
        assert r.code == 65 and "this pstate reads formats up to" in r.err
    if cmd == "replay" and r.code == 0:
        replay_output_parses(r.out)  # replay writes valid JSON lines, whatever it read
    if cmd == "stats-json" and r.code == 0:
        orjson.loads(r.out)


# --- 14. properties over every field -------------------------------------------

BASES = {
    "state": {"type": "state", "ts": 10**9, "cpu": 1, "pid": 10, "tid": 11, "comm": "w", "from": "running",
              "to": "sleeping", "dur_ns": 5000, "cause": "switch_out", "voluntary": True, "kstate": "S",
              "prio": 120, "next_tid": 0, "prev_tid": 0, "waker_tid": 1, "waker_pid": 1, "target_cpu": 0},
    "fork": {"type": "fork", "ts": 10**9, "cpu": 0, "pid": 10, "tid": 11, "comm": "w", "child_pid": 12,
             "child_tid": 12, "thread": False},
    "exec": {"type": "exec", "ts": 10**9, "cpu": 0, "pid": 10, "tid": 11, "comm": "w", "old_tid": 11},
    "exit": {"type": "exit", "ts": 10**9, "cpu": 0, "pid": 10, "tid": 11, "comm": "w", "group_dead": True},
    "loss": {"type": "loss", "ts": 10**9, "reason": "ringbuf_full", "count": 3, "since_ts": 0},
    "rate": {"type": "rate", "ts": 10**9, "sample_every": 2, "events_per_s": 1000},
    "end": {"type": "end", "ts": 10**9, "reason": "eof", "events": 1, "lost": 0, "lost_ringbuf_full": 0,
            "lost_map_full": 0, "lost_sampled": 0, "lost_unread": 0, "kernel_events": 1, "duration_ns": 1},
    "meta": {"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "0.1.0",
             "clock": "monotonic", "ts": 10**9, "wall_ns": 10**18, "ncpu": 2,
             "states": schema.state_vocabulary(), "include_idle": False},
}
HEADER = orjson.dumps(BASES["meta"]) + b"\n"
TRAILER = orjson.dumps(BASES["state"]) + b"\n"

NASTY = [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e400", b"nan", b"null", b"true", b"false", b"[]",
         b"{}", b'""', b"-0", b"0.0", b"1.5", b"18446744073709551615", b"18446744073709551616",
         b"-9223372036854775809", b"123456789012345678901234567890123456789", b'"\xff\xfe"', b'"\xed\xa0\x80"',
         b'"\\ud800"', b'"state_Q"', b'"levitating"', b'"\\u0000"', b"[[[[[[[[]]]]]]]]", b'{"type":"meta"}',
         b'"\x1b[2J"']


def _raw_string(b: bytes) -> bytes:
    """Arbitrary bytes as a JSON string body: possibly invalid UTF-8, never a broken line."""
    return b'"' + b.replace(b"\\", b"").replace(b'"', b"").replace(b"\n", b"") + b'"'


EDGE_INTS = [0, 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1, 2**64, -1, -(2**63)]

raw_values = st.one_of(
    st.sampled_from(NASTY),
    st.sampled_from(EDGE_INTS).map(lambda i: str(i).encode()),
    st.integers(min_value=-(2**70), max_value=2**70).map(lambda i: str(i).encode()),
    st.floats(allow_nan=False, allow_infinity=False).map(orjson.dumps),
    st.text(max_size=20).map(lambda s: orjson.dumps(s)),
    st.binary(max_size=12).map(_raw_string),
    st.sampled_from(sorted(schema.STATES)).map(lambda s: orjson.dumps(s)),
    st.lists(st.integers(), max_size=3).map(lambda v: b"[" + b",".join(str(i).encode() for i in v) + b"]"),
)


@st.composite
def mutated_lines(draw):
    """A valid record of any type with one field replaced by a raw JSON value or removed."""
    t = draw(st.sampled_from(sorted(BASES)))
    base = dict(BASES[t])
    key = draw(st.sampled_from(sorted(base) + ["extra"]))
    if draw(st.integers(0, 9)) == 0:
        base.pop(key, None)
        return orjson.dumps(base) + b"\n"
    base[key] = "@@RAW@@"
    return orjson.dumps(base).replace(b'"@@RAW@@"', draw(raw_values)) + b"\n"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(line=mutated_lines())
def test_any_field_any_value_is_a_skip_or_a_clean_error(tmp_path, line):
    path = tmp_path / "m.jsonl"
    path.write_bytes(HEADER + line + TRAILER)
    stats = ReadStats()
    try:
        recs = list(read_records([str(path)], stats))
    except PstateError as e:  # only a newer schema in a meta record may stop a lenient reader
        assert e.exit_code == 65 and "this pstate reads formats up to" in e.message
        rec = orjson.loads(line)
        assert rec["type"] == "meta" and rec["schema"] > schema.SCHEMA_VERSION
        return
    assert all(check_record(r) is None for r in recs)
    assert recs[0] == BASES["meta"] and recs[-1] == BASES["state"]
    assert stats.lines == 3 and stats.records + stats.n_skipped == 3
    try:
        st_strict = ReadStats()
        n = len(list(read_records([str(path)], st_strict, strict=True)))
        assert n + sum(st_strict.unknown.values()) == 3  # an unknown type is counted, not an error
    except PstateError as e:
        assert e.exit_code == 65


def _cli_property(cmd):
    from click.testing import CliRunner

    from pstate.main import cli

    @settings(max_examples=100, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(lines=st.lists(mutated_lines(), min_size=1, max_size=4))
    def prop(lines):
        data = HEADER + b"".join(lines) + TRAILER
        r = CliRunner().invoke(cli, COMMANDS[cmd], input=data, prog_name="pstate")
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            raise AssertionError("".join(traceback.format_exception(*r.exc_info))) from None
        assert r.exit_code in (0, 65), (r.exit_code, r.stderr)

    prop()


@pytest.mark.parametrize("cmd", [
    "stats", "stats-careful",
    "stats-json",
    "replay", "heat", "export", "export-chrome",
])
def test_any_field_any_value_through_the_commands(cmd):
    _cli_property(cmd)


# read(write(x)) == x for valid records of every type

# Integers in ts, cpu, pid, tid, dur_ns and count are valid below 2**63 only.
i63 = st.integers(min_value=0, max_value=2**63 - 1)
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
JSON_TYPES = {
    "int": i63, "int?": st.none() | i63, "string": text, "string?": st.none() | text, "bool": st.booleans(),
    "bool?": st.none() | st.booleans(), "list?": st.none() | st.lists(st.integers(0, 2**32) | text, max_size=3),
    "object": st.dictionaries(text, text, max_size=4),
    "float?": st.none() | st.floats(allow_nan=False, allow_infinity=False),
}
extra_values = st.recursive(st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | text
                            | st.floats(allow_nan=False, allow_infinity=False),
                            lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3), max_leaves=4)


@st.composite
def valid_records(draw):
    t = draw(st.sampled_from(sorted(schema.RECORDS)))
    fields = {**schema.COMMON_FIELDS, **schema.RECORDS[t][1]}
    rec = {"type": t}
    for name, (jtype, _desc) in fields.items():
        if name == "type":
            continue
        if name == "schema":
            rec[name] = draw(st.integers(0, schema.SCHEMA_VERSION))
            continue
        value = draw(JSON_TYPES.get(jtype, extra_values))  # a type added later: any JSON value
        if jtype.endswith("?") and value is None and draw(st.booleans()):
            continue  # optional fields may be absent as well as null
        rec[name] = value
    extras = draw(st.dictionaries(st.sampled_from(["x", "future_field", "ts2", "\u2603"]), extra_values, max_size=2))
    return {**rec, **extras}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recs=st.lists(valid_records(), min_size=1, max_size=6))
def test_read_of_write_is_identity(tmp_path, recs):
    for r in recs:
        assert check_record(r) is None, r
    path = tmp_path / "rt.jsonl"
    w = LineWriter(str(path))
    for r in recs:
        w.record(r)
    w.close()
    back, stats = read_all(path, strict=True)
    assert back == recs
    assert stats.n_skipped == 0 and stats.truncated_tail is None

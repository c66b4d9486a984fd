"""pstate replay through the command line (in-process, CliRunner): output
format, filters, windows, snapshots, bad input and error messages.

Fixtures: tests/data/replay/ (regenerate with tests/data/replay/make_fixtures.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from pstate import __version__
from pstate.stream import schema
from pstate.main import cli as pstate_cli
from pstate.commands.options import filter_options
from conftest import TESTS

DATA = TESTS / "data" / "replay"
TWO = DATA / "two_seconds.jsonl"
MIXED = DATA / "mixed.jsonl"
CORRUPT = DATA / "corrupt.jsonl"
TRUNCATED = DATA / "truncated.jsonl"
SNAPS = DATA / "snaps"
MS = 1_000_000
T0 = 5_000_000_000_000


def loss(**counts) -> dict:
    """The loss totals of an end trailer."""
    return {"lost": sum(counts.values()), **{f"lost_{r}": counts.get(r, 0) for r in schema.LOSS_REASONS}}


EMPTY_LOSS = loss()


def replay(*args, input=None):
    return CliRunner().invoke(pstate_cli, ["replay", *map(str, args)], input=input, prog_name="pstate")


def records(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines()]


def event_lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if json.loads(x)["type"] in schema.EVENT_TYPES]


def fixture_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


# --- output format ----------------------------------------------------------


def test_no_wait_output_is_the_recording_marked_as_replayed():
    r = replay(TWO, "--no-wait")
    assert (r.exit_code, r.stderr) == (0, "")
    src = fixture_lines(TWO)
    out = r.stdout.splitlines()
    meta_in, meta_out = json.loads(src[0]), json.loads(out[0])
    assert meta_out == {**meta_in, "replayed": True, "replay_speed": None}
    assert list(meta_out)[:len(meta_in)] == list(meta_in)  # original fields first, in their order
    assert out[1:-1] == src[1:-1]  # events and the loss record, byte for byte
    assert json.loads(out[-1]) == {
        "type": "end", "ts": T0 + 2250 * MS, "reason": "eof", "events": 41, **loss(ringbuf_full=3),
        "duration_ns": 2250 * MS, "wall_time": "2025-11-30T10:53:22.250000000Z", "replay_skipped": 0}


def test_paced_meta_records_the_speed():
    r = replay(TWO, "--speed", "1000")
    assert r.exit_code == 0
    assert json.loads(r.stdout.splitlines()[0])["replay_speed"] == 1000.0


def test_stdin_is_the_default_input():
    r = replay("--no-wait", input=MIXED.read_bytes())
    assert r.exit_code == 0
    assert r.stdout.splitlines()[1:-1] == fixture_lines(MIXED)[1:-1]


def test_concatenated_recordings_keep_both_headers_and_get_one_trailer(tmp_path):
    second = tmp_path / "second.jsonl"
    second.write_text(_second_recording())
    r = replay(TWO, second, "--no-wait")
    assert r.exit_code == 0
    recs = records(r.stdout)
    metas = [x for x in recs if x["type"] == "meta"]
    assert [m["boot_id"] for m in metas] == ["4f1c6d1e-0000-4000-8000-000000000001", "second-boot"]
    assert all(m["replayed"] for m in metas)
    assert [x["type"] for x in recs].count("end") == 1
    end = recs[-1]
    assert (end["events"], end["lost"], end["ts"], end["duration_ns"]) == (41 + 3, 3, 103 * 10**9, 3 * 10**9)


def _second_recording() -> str:
    lines = [json.loads(fixture_lines(TWO)[0])]
    lines[0].update(boot_id="second-boot", ts=100 * 10**9, wall_ns=1_764_503_600 * 10**9)
    for i in range(3):
        lines.append({"type": "state", "ts": (101 + i) * 10**9, "cpu": 0, "pid": 7, "tid": 7, "comm": "later",
                      "from": "running", "to": "sleeping", "dur_ns": 5, "cause": "switch_out"})
    lines.append({"type": "end", "ts": 104 * 10**9, "reason": "signal", "events": 3, "lost": 0})
    return "".join(json.dumps(x) + "\n" for x in lines)


def test_input_without_a_header_gets_one():
    body = "".join(x + "\n" for x in fixture_lines(TWO)[1:4])
    r = replay("--no-wait", input=body)
    assert r.exit_code == 0
    out = r.stdout.splitlines()
    assert json.loads(out[0]) == {"type": "meta", "schema": 1, "source": "replay", "tool": "pstate",
                                  "version": __version__, "clock": "monotonic", "ts": T0 + 250 * MS,
                                  "replayed": True, "replay_speed": None}
    assert out[1:4] == body.splitlines()
    assert json.loads(out[4]) == {"type": "end", "ts": T0 + 350 * MS, "reason": "eof", "events": 3,
                                  **EMPTY_LOSS, "duration_ns": 100 * MS, "replay_skipped": 0}


def test_empty_input_is_still_a_stream():
    r = replay("--no-wait", input="")
    assert (r.exit_code, r.stderr) == (0, "")
    assert records(r.stdout) == [
        {"type": "meta", "schema": 1, "source": "replay", "tool": "pstate", "version": __version__,
         "clock": "monotonic", "replayed": True, "replay_speed": None},
        {"type": "end", "reason": "eof", "events": 0, **EMPTY_LOSS, "replay_skipped": 0},
    ]


def test_output_file(tmp_path):
    out = tmp_path / "out.jsonl"
    r = replay(TWO, "--no-wait", "-o", out)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "", "")
    assert out.read_text().splitlines()[1:-1] == fixture_lines(TWO)[1:-1]


# --- filters: the same events as Filter.match, i.e. as record's filters -----


def filter_of(args: list[str]):
    got = {}

    @click.command()
    @filter_options
    def parse(filt):
        got["filt"] = filt

    res = CliRunner().invoke(parse, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return got["filt"]


FILTERS = [
    ["-p", "100"],
    ["-p", "100", "-p", "200"],
    ["-t", "101"],
    ["-c", "worker"],
    ["-c", "a-very-long-name-beyond-15"],  # compared on the first 15 bytes, like the kernel's comm
    ["-c", "ls"],
    ["--state", "D"],
    ["--state", "preempted", "--state", "stopped"],
    ["--min-dur", "5ms"],
    ["--cpu", "1"],
    ["--cpu", "0", "--include-idle"],
    ["-p", "0", "--include-idle"],
    ["-p", "100", "--state", "sleeping", "--min-dur", "1ms"],
    ["-t", "103"],  # only the fork's child: nothing
]


@pytest.mark.parametrize("args", FILTERS, ids=" ".join)
def test_filters_select_what_filter_match_selects(args):
    filt = filter_of(args)
    src = fixture_lines(MIXED)
    want = [x for x in src if json.loads(x)["type"] in schema.EVENT_TYPES and filt.match(json.loads(x))]
    r = replay(MIXED, "--no-wait", *args)
    assert (r.exit_code, r.stderr) == (0, "")
    assert event_lines(r.stdout) == want
    recs = records(r.stdout)
    # Loss records cannot be attributed to a task: they all pass.
    assert [x for x in recs if x["type"] == "loss"] == [json.loads(x) for x in src if '"type":"loss"' in x]
    meta = recs[0]
    assert {k: v for k, v in meta.items() if k.startswith("replay_") and k != "replay_speed"} == {
        f"replay_{k}": v for k, v in filt.meta_fields().items()}
    assert recs[-1]["events"] == len(want)


def test_filters_are_paced_the_same(tmp_path):
    fast = replay(MIXED, "--speed", "1e6", "--state", "D")
    slow = replay(MIXED, "--no-wait", "--state", "D")
    assert event_lines(fast.stdout) == event_lines(slow.stdout)


def test_without_filters_every_event_is_kept_idle_tasks_too():
    src = fixture_lines(MIXED)
    r = replay(MIXED, "--no-wait")
    assert event_lines(r.stdout) == [x for x in src if json.loads(x)["type"] in schema.EVENT_TYPES]
    assert any(json.loads(x)["tid"] == 0 for x in event_lines(r.stdout))
    assert "replay_include_idle" not in records(r.stdout)[0]


# --- windows ----------------------------------------------------------------


def window_ts(*args) -> list[int]:
    r = replay(TWO, "--no-wait", *args)
    assert (r.exit_code, r.stderr) == (0, "")
    return [json.loads(x)["ts"] for x in event_lines(r.stdout)]


EXPECTED_WINDOW = [T0 + 250 * MS + i * 50 * MS for i in range(5, 15)]  # [+0.5s, +1s)


@pytest.mark.parametrize("begin,end", [
    ("+0.5s", "+1s"),
    ("+500ms", "+1000ms"),
    ("@1764500000.5", "@1764500001"),
    ("2025-11-30T10:53:20.500Z", "2025-11-30T10:53:21Z"),
    ("2025-11-30T11:53:20.5+01:00", "2025-11-30T11:53:21+01:00"),
    ("10:53:20.5", "10:53:21"),  # local time: UTC here
    ("2025-11-30T10:53:20.5", "2025-11-30 10:53:21"),
])
def test_window_by_relative_and_absolute_time(utc, begin, end):
    assert window_ts("-b", begin, "-e", end) == EXPECTED_WINDOW


def test_window_edges_and_meta(utc):
    assert window_ts("--begin", "+2.25s") == [T0 + 2250 * MS]  # begin is inclusive
    assert window_ts("--end", "+0.3s") == [T0 + 250 * MS]  # end is exclusive
    r = replay(TWO, "--no-wait", "-b", "+0.5s", "-e", "+1s")
    recs = records(r.stdout)
    assert (recs[0]["replay_begin_ts"], recs[0]["replay_end_ts"]) == (T0 + 500 * MS, T0 + 1000 * MS)
    assert recs[0]["ts"] == T0 and recs[0]["wall_ns"] == 1_764_500_000 * 10**9  # the original anchor
    # The loss record at +1.25s covers [start, +1.25s]: it overlaps the window.
    assert [x["type"] for x in recs].count("loss") == 1
    # The trailer's ts is the latest written: that loss record's.
    assert recs[-1] == {"type": "end", "ts": T0 + 1250 * MS + 1, "reason": "eof", "events": 10,
                        **loss(ringbuf_full=3), "duration_ns": 1250 * MS + 1,
                        "wall_time": "2025-11-30T10:53:21.250000001Z", "replay_skipped": 0}
    later = records(replay(TWO, "--no-wait", "-b", "+1.3s").stdout)
    assert [x["type"] for x in later].count("loss") == 0


def test_window_across_concatenated_recordings(tmp_path, utc):
    second = tmp_path / "second.jsonl"
    second.write_text(_second_recording())  # starts an hour later, on another boot
    r = replay(TWO, second, "--no-wait", "-b", "+2.2s", "-e", "11:53:22")
    assert r.exit_code == 0
    assert [json.loads(x)["ts"] for x in event_lines(r.stdout)] == [T0 + 2200 * MS, T0 + 2250 * MS,
                                                                    101 * 10**9]


def test_window_without_events_warns(utc):
    r = replay(TWO, "--no-wait", "-b", "+10s")
    assert r.exit_code == 0
    assert r.stderr == ("pstate replay: warning: no events from +10s; the events read span "
                        "2025-11-30T10:53:20.250 .. 2025-11-30T10:53:22.250\n")
    assert records(r.stdout)[-1]["events"] == 0


def test_wall_clock_window_needs_a_wall_clock_anchor():
    body = "".join(x + "\n" for x in fixture_lines(TWO)[1:4])
    r = replay("--no-wait", "-b", "12:00", input=body)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("Error: 12:00 is a wall-clock time, but the input has no meta header with a wall-clock "
                        "anchor (wall_ns); use a time relative to the start, e.g. +30s\n")


# --- snapshot directories -----------------------------------------------------


def test_snapshot_directory_is_replayed_file_by_file():
    files = sorted(SNAPS.glob("pstate-snap-*.jsonl"))
    assert len(files) == 3  # the dot-file and notes.txt are not snapshots
    r = replay(SNAPS, "--no-wait")
    assert (r.exit_code, r.stderr) == (0, "")
    out = r.stdout.splitlines()
    want = []
    for f in files:
        lines = f.read_text().splitlines()
        meta = {**json.loads(lines[0]), "replayed": True, "replay_speed": None}
        want += [json.dumps(meta, separators=(",", ":"))] + lines[1:]
    assert out[:-1] == want
    assert json.loads(out[-1]) == {"type": "end", "ts": T0 + 3000 * MS, "reason": "eof", "events": 0, **EMPTY_LOSS,
                                   "wall_time": "2025-11-30T10:53:23.000000000Z", "snapshots": 3,
                                   "replay_skipped": 0}


def test_snapshot_window_selects_whole_snapshots():
    r = replay(SNAPS, "--no-wait", "-b", "+1.5s")  # relative to the first interval's start
    recs = records(r.stdout)
    assert [x["seq"] for x in recs if x["type"] == "meta"] == [2, 3]
    assert [x["type"] for x in recs].count("task") == 4


def test_snapshot_directory_refuses_filters():
    r = replay(SNAPS, "-p", "100")
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr.endswith("Error: filters select events of recordings; they do not apply to snapshot "
                             "directories\n")


# --- bad input -----------------------------------------------------------------


def test_corrupt_lines_are_skipped_counted_and_reported():
    r = replay(CORRUPT, "--speed", "1e6")  # paced: every line is parsed
    assert r.exit_code == 0
    p = str(CORRUPT)
    assert r.stderr == (
        f"pstate replay: warning: skipped 1 line: bad loss record (first at {p}:17)\n"
        f"pstate replay: warning: skipped 1 line: bad or missing \"ts\" (first at {p}:13)\n"
        f"pstate replay: warning: skipped 1 line: no string \"type\" field (first at {p}:11)\n"
        f"pstate replay: warning: skipped 1 line: not a JSON object (first at {p}:9)\n"
        f"pstate replay: warning: skipped 3 lines: not valid JSON (first at {p}:3)\n")
    good = [x for x in fixture_lines(CORRUPT) if '"ticker"' in x and x.count('{"type"') == 1]
    assert len(good) == 12
    assert event_lines(r.stdout) == good
    end = records(r.stdout)[-1]
    assert (end["events"], end["replay_skipped"]) == (12, 7)


def test_corrupt_input_with_strict_stops_at_the_first_bad_line():
    r = replay(CORRUPT, "--no-wait", "--strict")
    assert r.exit_code == 65
    assert r.stderr == f"Error: {CORRUPT}:3: not valid JSON\n"
    recs = records(r.stdout)
    assert [x["type"] for x in recs] == ["meta", "state", "end"]
    assert recs[-1]["reason"] == "error"


def test_truncated_input():
    r = replay(TRUNCATED, "--no-wait")
    assert r.exit_code == 0
    assert r.stderr == f"pstate replay: warning: truncated final record at {TRUNCATED}: byte 1232, line 7\n"
    assert event_lines(r.stdout) == fixture_lines(TRUNCATED)[1:6]
    assert records(r.stdout)[-1]["replay_skipped"] == 1
    r = replay(TRUNCATED, "--no-wait", "--strict")
    assert (r.exit_code, r.stderr) == (65, f"Error: {TRUNCATED}:7: truncated record\n")


def test_complete_last_line_without_newline_is_kept():
    text = TWO.read_text().rstrip("\n")
    r = replay("--no-wait", input=text)
    assert (r.exit_code, r.stderr) == (0, "")
    assert records(r.stdout)[-1]["events"] == 41  # the original trailer was the unterminated line


def test_newer_schema_is_refused():
    r = replay(DATA / "newer_schema.jsonl")
    assert (r.exit_code, r.stdout) == (65, "")
    assert r.stderr == (f"Error: {DATA / 'newer_schema.jsonl'} was written in event format 2 (by pstate 9.0.0); "
                        "this pstate reads formats up to 1\n  fix: upgrade pstate\n")


# --- command line ----------------------------------------------------------------


def test_help():
    r = replay("--help")
    assert r.exit_code == 0
    assert r.stdout.startswith("Usage: pstate replay [OPTIONS] [FILES]...\n\n  Re-emit a recording as a stream")
    assert "\n  Examples:\n    pstate replay rec.jsonl | pstate heat --live" in r.stdout
    for opt in ("--speed N", "--no-wait", "-b, --begin TIME", "-e, --end TIME", "-p, --pid PID", "--state STATE",
                "--min-dur DURATION", "--cpu CPU", "-o, --output FILE", "-u, --unbuffered", "--strict"):
        assert opt in r.stdout
    assert replay("-h").stdout == r.stdout


USAGE = "Usage: pstate replay [OPTIONS] [FILES]...\nTry 'pstate replay --help' for help.\n\n"


@pytest.mark.parametrize("args,code,stderr", [
    (["--speed", "0", TWO], 2, USAGE + "Error: Invalid value for '--speed': 0.0 is not in the range x>0.\n"),
    (["--speed", "fast", TWO], 2, USAGE + "Error: Invalid value for '--speed': 'fast' is not a valid float range.\n"),
    (["--speed", "2", "--no-wait", TWO], 2, USAGE + "Error: --speed and --no-wait cannot be used together\n"),
    (["-b", "soon", TWO], 2, USAGE + "Error: Invalid value for '-b' / '--begin': not a time: 'soon' (use e.g. "
                                     "+30s, +1m30s, 12:00:05, 2026-11-30T12:00:00 or @1764500000)\n"),
    (["-b", "+45s", "-e", "+30s", TWO], 2, USAGE + "Error: --end +30s is not after --begin +45s\n"),
    (["--state", "Q", TWO], 2, None),
    (["nope.jsonl"], 66, "Error: cannot open nope.jsonl: No such file or directory\n"),
    (["-o", TWO, TWO], 2, USAGE + f"Error: the output {TWO} is also an input\n"),
])
def test_errors(args, code, stderr):
    r = replay(*args)
    assert (r.exit_code, r.stdout) == (code, "")
    if stderr is not None:
        assert r.stderr == stderr
    assert "Traceback" not in r.stderr


def test_directory_without_snapshots(tmp_path):
    (tmp_path / "notes.txt").write_text("x\n")
    r = replay(tmp_path)
    assert (r.exit_code, r.stdout) == (66, "")
    assert r.stderr == (f"Error: {tmp_path} holds no snapshots (pstate-snap-*.jsonl)\n"
                        "  fix: give a recording file, or the --dir directory of pstate snap\n")


def test_unwritable_output(tmp_path):
    r = replay(TWO, "--no-wait", "-o", tmp_path / "missing" / "out.jsonl")
    assert r.exit_code == 73
    assert r.stderr == f"Error: cannot create {tmp_path / 'missing' / 'out.jsonl'}: No such file or directory\n"

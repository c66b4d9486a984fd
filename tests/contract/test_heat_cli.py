"""`pstate heat` command line: errors and exit codes, help, input handling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pstate.main import cli
from conftest import ROOT, TESTS

DATA = TESTS / "data" / "heat"
SMALL = str(DATA / "small.jsonl")


def _env(**extra):
    """This checkout's code, whatever is installed."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = str(ROOT / "cli")
    return env


def heat(*args, input=None):
    return CliRunner().invoke(cli, ["heat", *args], input=input, env={"NO_COLOR": None, "COLORTERM": None})


def test_help_has_examples_and_glyphs():
    r = heat("--help")
    assert r.exit_code == 0
    assert "Examples:" in r.stdout and "pstate heat --live" in r.stdout
    assert "# running" in r.stdout and "--latency" in r.stdout and "--window" in r.stdout


def test_reads_stdin():
    r = heat("--width", "80", input=Path(SMALL).read_bytes())
    assert r.exit_code == 0
    assert r.stdout.splitlines()[1].startswith("worker 101 ")
    assert "Input: stdin" in r.stdout
    assert r.stderr == "pstate heat: warning: the input reports 3 lost events; results are incomplete\n"


def test_missing_file_exits_66():
    r = heat("/nonexistent/rec.jsonl")
    assert r.exit_code == 66
    assert r.stderr == "Error: cannot open /nonexistent/rec.jsonl: No such file or directory\n"
    assert r.stdout == ""


def test_newer_schema_exits_65(tmp_path):
    f = tmp_path / "new.jsonl"
    f.write_text('{"type":"meta","schema":2,"version":"9.0"}\n')
    r = heat(str(f))
    assert r.exit_code == 65 and "event format 2" in r.stderr and r.stdout == ""


def test_bad_lines_are_skipped_and_counted_or_fatal_with_strict(tmp_path):
    f = tmp_path / "bad.jsonl"
    lines = Path(SMALL).read_text().splitlines()
    lines.insert(5, "{not json")
    lines.insert(9, json.dumps({"type": "state", "ts": "x"}))
    f.write_text("\n".join(lines) + "\n")
    r = heat(str(f), "--width", "80")
    assert r.exit_code == 0
    assert "skipped 2 bad lines" in r.stdout.replace("\n", " ")
    assert "skipped 1 line: not valid JSON (first at" in r.stderr
    r = heat(str(f), "--width", "80", "--strict")
    assert r.exit_code == 65 and r.stdout == ""
    assert r.stderr.startswith(f"Error: {f}:6: not valid JSON")


def test_truncated_tail_warns_and_strict_fails(tmp_path):
    f = tmp_path / "cut.jsonl"
    f.write_bytes(Path(SMALL).read_bytes()[:-40])
    r = heat(str(f), "--width", "80")
    assert r.exit_code == 0 and "truncated final record" in r.stderr
    assert "truncated last line" in r.stdout.replace("\n", " ")
    r = heat(str(f), "--width", "80", "--strict")
    assert r.exit_code == 65


def test_times_outside_int64_in_meta_and_end_are_ignored(tmp_path):
    # Event times are checked by the reader; the meta and end times that
    # stretch the map are kept to the same policy (0 <= ts < 2**63).
    f = tmp_path / "small.jsonl"  # the same name: the same footer
    lines = Path(SMALL).read_text().splitlines()
    lines.insert(1, json.dumps({"type": "meta", "schema": 1, "ts": 2**64 - 1, "wall_ns": -1}))
    lines.append(json.dumps({"type": "end", "ts": 2**64 - 1, "reason": "eof"}))
    f.write_text("\n".join(lines) + "\n")
    for args in ([], ["--latency", "runq"]):
        r = heat(str(f), "--width", "80", *args)
        assert r.exit_code == 0 and r.exception is None, r.stderr
    assert heat(str(f), "--width", "80").stdout == heat(SMALL, "--width", "80").stdout


def test_a_byte_order_mark_does_not_lose_the_header(tmp_path):
    f = tmp_path / "small.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + Path(SMALL).read_bytes())
    r = heat(str(f), "--width", "80")
    assert r.exit_code == 0 and "skipped" not in r.stderr
    assert r.stdout == heat(SMALL, "--width", "80").stdout
    p = subprocess.run([sys.executable, "-m", "pstate", "heat", "--live", str(f), "--width", "80"],
                       capture_output=True, timeout=60, env=_env())
    assert p.returncode == 0 and b"skipped" not in p.stderr and b"input ended" in p.stdout


def test_latency_followed_by_a_file_reads_the_file():
    # an optional value never swallows an existing file (or "-"): --latency alone, then the input
    r = heat("--latency", SMALL, "--width", "80")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == heat(SMALL, "--latency", "--width", "80").stdout
    assert "run-queue wait" in r.stdout.splitlines()[0]
    d = heat("--latency", "D", SMALL, "--width", "80")
    assert d.exit_code == 0 and "uninterruptible" in d.stdout.splitlines()[0]
    r = heat("--latency=" + SMALL)
    assert r.exit_code == 2
    assert "looks like an input: put inputs before --latency, or write --latency=runq" in r.stderr


def test_latency_measure_names_are_case_insensitive():
    assert heat(SMALL, "--latency", "d", "--width", "60").exit_code == 0
    r = heat(SMALL, "--latency", "bogus")
    assert r.exit_code == 2 and "bogus" in r.stderr


@pytest.mark.parametrize("args,msg", [
    ([str(DATA / "snaps"), "--live"], "--live reads a stream, not a snapshot directory"),
    ([str(DATA / "snaps"), "--latency"], "snapshots hold time per state"),
    ([str(DATA / "snaps"), SMALL], "give one snapshot directory, or recordings, not both"),
    ([SMALL, "--latency", "--shade", "D"], "--latency and --shade draw different maps"),
    ([SMALL, SMALL, "--live"], "--live reads one stream"),
])
def test_usage_errors_exit_2(args, msg):
    r = heat(*args)
    assert r.exit_code == 2, r.output
    assert msg in r.stderr and r.stdout == ""


def test_filters(tmp_path):
    r = heat(SMALL, "--width", "80", "-p", "200", "-p", "300")
    assert r.exit_code == 0
    rows = [line.split()[0] + " " + line.split()[1] for line in r.stdout.splitlines()[1:4]]
    assert rows == ["db 201", "web 301", "web 302"]
    assert "(nothing to show)" in heat(SMALL, "-p", "200", "-c", "web").stdout  # filters combine
    r = heat(SMALL, "--width", "80", "-t", "501")
    assert r.stdout.splitlines()[1].startswith("sh 501")
    assert "1 of 1 threads" in r.stdout


def test_empty_snapshot_dir(tmp_path):
    r = heat(str(tmp_path), "--width", "60")
    assert r.exit_code == 0
    # wrapped at 60 columns, a long temporary path anywhere
    assert "".join(r.stdout.split()).startswith("".join(f"No snapshots in {tmp_path} (nothing to show)".split()))


def test_stdin_terminal_is_refused():
    # Needs a real terminal on stdin: use a pty.
    import pty

    master, slave = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "pstate", "heat"], stdin=slave, capture_output=True,
                           timeout=30, env=_env())
    finally:
        os.close(master)
        os.close(slave)
    assert p.returncode == 2
    assert b"standard input is a terminal" in p.stderr


def test_closed_output_pipe_is_quiet(tmp_path):
    env = {k: v for k, v in _env().items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.run(f"{sys.executable} -m pstate heat {SMALL} --bucket 1ms --width 80 | head -n1",
                       shell=True, capture_output=True, env=env, timeout=60)
    assert p.returncode == 0
    assert p.stdout.startswith(b"Dominant state per thread")
    assert b"Traceback" not in p.stderr and b"BrokenPipe" not in p.stderr

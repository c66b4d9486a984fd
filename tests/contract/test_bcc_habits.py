"""BCC's and perf's habits: `stats [interval [count]]`, -T, `record -p` of a
process that does not exist."""

from __future__ import annotations

import os
import re

import pytest
from click.testing import CliRunner

from pstate.main import cli

META = '{"type":"meta","schema":1,"source":"record","ts":0}\n'
STATE = ('{"type":"state","ts":%d,"cpu":0,"pid":3,"tid":3,"comm":"a","from":"sleeping",'
         '"to":"runnable","dur_ns":4}\n')


def run(*args):
    return CliRunner().invoke(cli, list(map(str, args)), prog_name="pstate")


@pytest.fixture
def rec(tmp_path):
    path = tmp_path / "rec.jsonl"
    path.write_text(META + "".join(STATE % (i * 400_000_000) for i in range(1, 11)))
    return path


def intervals(text: str) -> list[str]:
    return re.findall(r"^interval (\d+),", text, re.M)


def test_interval_and_count_positionals_are_the_options(rec):
    by_option = run("stats", "--interval", "1", "--count", "2", rec)
    assert by_option.exit_code == 0, by_option.stderr
    assert intervals(by_option.stdout) == ["1", "2"]
    by_position = run("stats", "1", "2", rec)
    assert (by_position.exit_code, by_position.stdout) == (0, by_option.stdout)
    assert run("stats", "500ms", rec).stdout == run("stats", "-i", "500ms", rec).stdout


def test_a_number_that_names_a_file_is_the_file(rec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "1").write_text(rec.read_text())
    r = run("stats", "1")
    assert r.exit_code == 0, r.stderr
    assert intervals(r.stdout) == [] and r.stdout == run("stats", "./1").stdout


def test_an_interval_given_twice_is_a_usage_error(rec):
    r = run("stats", "1", "-i", "2", rec)
    assert r.exit_code == 2
    assert "Error: 1: give the interval either as a number or with --interval, not both" in r.stderr


def test_T_stamps_every_interval_with_the_clock_when_the_stream_has_none(rec):
    plain = run("stats", "1", "2", rec)
    stamped = run("stats", "-T", "1", "2", rec)
    assert stamped.exit_code == 0, stamped.stderr
    assert not re.search(r"^--- \d\d:\d\d:\d\d$", plain.stdout, re.M)
    assert len(re.findall(r"^--- \d\d:\d\d:\d\d$", stamped.stdout, re.M)) == 2
    assert run("stats", "-T", rec).exit_code == 2
    assert "-T stamps the table" in run("stats", "-T", "1", "-f", "json", rec).stderr


def _free_pid() -> int:
    pid = 4_000_000
    while os.path.exists(f"/proc/{pid}"):
        pid -= 1
    return pid


def test_record_of_no_such_process_exits_66():
    pid = _free_pid()
    r = run("record", "-p", pid, "-d", "1")
    assert r.exit_code == 66
    assert r.stderr == (f"Error: no such process: {pid}\n  fix: give the pid of a running process "
                        "(pgrep NAME finds one), or -c NAME to follow processes by name\n")


@pytest.mark.bpf
def test_record_warns_of_a_missing_process_among_others(tmp_path):
    pid = _free_pid()
    out = tmp_path / "rec.jsonl"
    r = run("record", "-p", pid, "-p", os.getpid(), "-d", "200ms", "-o", out)
    assert r.exit_code == 0, r.stderr
    assert f"pstate record: warning: no such process: {pid}; recording the others" in r.stderr
    quiet = run("record", "-q", "-p", pid, "-p", os.getpid(), "-d", "200ms", "-o", out)
    assert (quiet.exit_code, quiet.stderr) == (0, "")

"""The option table: one meaning and one value type per spelling across
pstate's commands, the task filter bundle the same as record's everywhere,
durations written one way, and old spellings working for one release."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from pstate.docs import flagtable
from pstate.main import cli
from conftest import ROOT

ROWS = flagtable.option_rows()
BUNDLE = ("-p", "-t", "-c", "--cpu", "--state", "--min-dur", "--cgroup", "--include-idle")
READ_BUNDLE = BUNDLE + ("--title",)  # (a title is known only from the process records of a stream)


def test_every_spelling_has_one_meaning_and_one_value_type():
    assert flagtable.conflicts(ROWS) == []


def test_the_table_covers_every_command():
    from pstate.main import COMMANDS

    assert {r.command for r in ROWS} == set(COMMANDS)
    assert all(r.help for r in ROWS), [r for r in ROWS if not r.help]


def test_a_conflict_is_found():
    rows = [flagtable.OptionRow("a", ("-n", "--count"), "count", "INTEGER", "x"),
            flagtable.OptionRow("b", ("-n", "--top"), "top", "INTEGER", "y")]
    assert flagtable.conflicts(rows) == ["-n means different things: a: count (INTEGER), b: top (INTEGER)"]


def test_the_filter_bundle_means_record_s_filters_wherever_it_appears():
    spelled = flagtable.by_spelling(ROWS)
    record = {s: r for s in BUNDLE for r in spelled[s] if r.command == "record"}
    assert set(record) == set(BUNDLE)
    for spelling in BUNDLE:
        for row in spelled[spelling]:
            assert (row.meaning, row.value, row.help) == \
                (record[spelling].meaning, record[spelling].value, record[spelling].help), row


@pytest.mark.parametrize("cmd", ["record", "replay", "stats", "heat", "export"])
def test_every_command_that_reads_or_records_a_stream_has_the_whole_bundle(cmd):
    spelled = flagtable.by_spelling(ROWS)
    bundle = BUNDLE if cmd == "record" else READ_BUNDLE
    assert all(any(r.command == cmd for r in spelled[s]) for s in bundle), cmd
    titles = {r.help for r in spelled["--title"]}
    assert len(titles) == 1 and "record" not in {r.command for r in spelled["--title"]}


def test_durations_are_one_type_everywhere():
    timed = {"duration", "interval", "every", "min_dur", "max_age", "bucket", "window", "drain_interval"}
    for row in ROWS:
        if row.meaning in timed:
            assert row.value == "DURATION", row


@pytest.mark.parametrize("cmd, old, new", [
    ("heat", "-n", "--top"),
    ("snap", "-o", "--dir"), ("snap", "--out", "--dir"), ("snap", "-e", "--every"),
])
def test_old_spellings_are_listed_as_renamed(cmd, old, new):
    row = next(r for r in ROWS if r.command == cmd and new in r.spellings)
    assert old in row.renamed_from


def test_an_old_spelling_still_works_with_a_warning_on_stderr(tmp_path):
    from pstate.commands.options import rename_args

    renamed = {"-n": "--top", "--state": "--shade"}
    assert rename_args(["-n", "5", "x"], renamed, "p") == ["--top", "5", "x"]
    assert rename_args(["-n5", "--state=D", "--", "-n"], renamed, "p") == \
        ["--top", "5", "--shade", "D", "--", "-n"]
    rec = tmp_path / "r.jsonl"
    rec.write_text('{"type":"meta","schema":1,"source":"record","ts":0}\n')
    r = CliRunner().invoke(cli, ["heat", "-n", "3", str(rec)], prog_name="pstate")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.splitlines()[:1] == [
        "pstate heat: -n is deprecated and goes in the next release: use --top"]


def test_the_table_is_in_pstate_1():
    from pathlib import Path

    page = (ROOT / "man" / "pstate.1").read_text()
    assert "OPTIONS OF EVERY COMMAND" in page
    assert "\\-\\-shade" in page

"""The report schemas of pstate.stream.reports are the keys the commands
write: every key of `stats --format json` (on a stream, with each view, and
on snapshots) is declared, and every declared field is written by one of
these runs. pstate-events(5) renders them (REPORTS)."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from pstate.docs import docgen
from pstate.main import cli
from pstate.stream import reports, schema

from conftest import TESTS

DATA = TESTS / "data"


def stats_json(*args) -> list[dict]:
    r = CliRunner().invoke(cli, ["stats", *args, "-f", "json"], catch_exceptions=False)
    assert r.exit_code in (0, 65), r.output
    text = r.stdout.strip()
    if text.startswith("{\n"):  # snapshots: one indented object
        return [orjson.loads(text)]
    return [orjson.loads(line) for line in text.splitlines()]


def paths(value, prefix: str = "") -> set[str]:
    """Every key path of a JSON value: a.b, a[].b; lists and objects as
    themselves too."""
    out = {prefix} if prefix else set()
    if isinstance(value, dict):
        for k, v in value.items():
            out |= paths(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, dict):
                out |= paths(v, prefix + "[]")
    return out


def generalise(path: str) -> str:
    """A written key path as the schema names it: state names, wait kinds
    and reasons as STATE, KIND and REASON."""
    path = re.sub(r"\.states\.[a-z_]+", ".states.STATE", path)
    path = re.sub(r"\.latency\.[a-z_]+", ".latency.KIND", path)
    path = re.sub(r"^input\.(skipped|lost)\.[^.]+$", r"input.\1.REASON", path)
    return path


def covered(path: str, declared: dict) -> bool:
    """Declared as itself, under a collective FIELD or LABEL entry, or as a
    part of a declared object (rest and total carry a group's fields)."""
    if path in declared:
        return True
    for d in declared:
        head, _sep, last = d.rpartition(".")
        if last in ("FIELD", "LABEL") and (path == head or path.startswith(head + ".") or path.startswith(head + "[]")):
            return True
        if d.endswith("[].FIELD") and (path == d[:-len(".FIELD")] or path.startswith(d[:-len(".FIELD")])):
            return True
    top = path.split(".")[0].split("[")[0]
    return top in ("rest", "total") and top in declared


def written_paths(runs: list[list[dict]]) -> set[str]:
    return {generalise(p) for objs in runs for obj in objs for p in paths(obj)}


@pytest.fixture(scope="module")
def stats_runs() -> list[list[dict]]:
    stats = DATA / "stats"
    return [
        stats_json(str(stats / "basic.jsonl"), "--hist", "--matrix", "--top", "1"),
        stats_json(str(stats / "lossy.jsonl"), "-i", "1", "--by", "tid"),
        stats_json(str(stats / "why.jsonl"), "--stacks", "--wakers", "--antagonists", "--top", "1"),
        stats_json(str(stats / "why-services.jsonl"), "--by", "unit", "--wakers", "--top", "1", "--sort", "sleeping"),
    ]


def test_every_key_stats_writes_is_declared(stats_runs):
    declared = reports.STATS_FIELDS
    missing = sorted(p for p in written_paths(stats_runs) if not covered(p, declared)
                     and not any(d.startswith(p + ".") or d.startswith(p + "[]") for d in declared))
    assert missing == []


def test_every_declared_stats_field_is_written(stats_runs):
    written = written_paths(stats_runs)
    unused = [d for d in reports.STATS_FIELDS
              if not d.endswith((".FIELD", ".LABEL")) and d not in written
              and d not in ("groups[].tid", "groups[].processes", "groups[].latency.KIND.hist")]
    assert unused == []


def test_every_key_of_the_snapshot_report_is_declared():
    objs = stats_json(str(DATA / "snap" / "series"))
    assert objs[0]["type"] == "snapstats"
    declared = reports.SNAPSTATS_FIELDS
    tops = {d.split(".")[0].split("[")[0] for d in declared}
    assert set(objs[0]) == tops
    missing = sorted(p for p in written_paths([objs]) if not covered(p, declared)
                     and not any(d.startswith(p + ".") or d.startswith(p + "[]") for d in declared))
    assert missing == []


def test_the_reports_are_in_the_events_page():
    page = docgen.events_page()
    assert ".SH REPORTS" in page
    for name, (_desc, fields) in reports.REPORTS.items():
        assert f".SS {name}" in page
        for path in fields:
            assert f"\\fB{docgen.esc(path)}\\fR" in page


def test_report_types_are_not_record_types():
    assert not set(reports.REPORTS) & set(schema.RECORDS)

"""snap's steal_irq_ns: of a row's running_ns, what the kernel did not count
as the thread's own (steal and interrupts). A counter like the others
(subtracted between snapshots, summed per group), never a state: the states
alone tile an interval, and the Prometheus file gives it a family of its
own. stats DIR/ shows it as a STEAL column, only where snapshots carry it."""

from __future__ import annotations

import importlib.util

import orjson
from click.testing import CliRunner

import test_stats
from pstate.main import cli
from pstate.snapshots import promexport, snapdir
from pstate.snapshots.writer import render_jsonl

_spec = importlib.util.spec_from_file_location("make_fixtures", test_stats.HERE / "data" / "snap" / "make_fixtures.py")
mf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mf)
S = mf.S
MS = 1_000_000


def _snapshots(tmp_path, steal: bool = True):
    """Two cumulative snapshots 10 s apart: a hog on a CPU all the time, 1 %
    of it stolen per interval (100 ms, then 200 ms in all), and a sleeper."""
    t0 = 100 * S
    for k, end in enumerate((110 * S, 120 * S), start=1):
        el = end - t0
        rows = [mf.row(end, 200, 200, "hog", 20 * S, state="running", since=end - MS, running=el, nivcsw=k * 10),
                mf.row(end, 300, 300, "sleeper", 30 * S, sleeping=el, wakeups=k)]
        for r in rows:
            if steal:
                r[snapdir.STEAL_FIELD] = k * 100 * MS if r["pid"] == 200 else 0
            else:  # as snapshots of an older pstate
                del r[snapdir.STEAL_FIELD]
        m = mf.meta(mf.BOOT_A, "run-s", k, t0, end, mf.WALL_A, "cumulative")
        (tmp_path / snapdir.snapshot_name(m["wall_end_ns"], k, "jsonl")).write_bytes(
            render_jsonl(m, rows, {"type": "end", "ts": end, "tasks": len(rows), "reason": "interval"}))
    return str(tmp_path)


def _stats(*args) -> str:
    res = CliRunner().invoke(cli, ["stats", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    return res.stdout


def test_a_counter_not_a_state():
    row = mf.row(10 * S, 1, 1, "a", 0, running=5 * S)
    row[snapdir.STEAL_FIELD] = 7
    assert snapdir.STEAL_FIELD in snapdir.counter_fields(row)
    assert snapdir.STEAL_FIELD not in snapdir.state_fields(row)
    assert set(snapdir.state_fields(row)) == {f"{s}_ns" for s in snapdir.STATE_FIELDS}
    later = dict(row, running_ns=6 * S, steal_irq_ns=10)
    assert snapdir.subtract(later, row)[snapdir.STEAL_FIELD] == 3


def test_stats_dir_shows_it_per_interval_and_as_a_column(tmp_path):
    rep = orjson.loads(_stats(_snapshots(tmp_path), "-f", "json"))
    hog = next(r for r in rep["trends"] if r["pid"] == 200)
    assert [s["steal_irq_ns"] for s in hog["series"]] == [100 * MS, 100 * MS]
    assert hog["steal_irq_ns"] == 200 * MS and hog["running_ns"] == 20 * S
    table = _stats(_snapshots(tmp_path))
    head = next(ln for ln in table.splitlines() if "ON-CPU" in ln)
    assert head.split()[:4] == ["PID", "COMM", "ON-CPU", "STEAL"], head
    hog_line = next(ln for ln in table.splitlines() if " hog " in f" {ln} ")
    assert "1.0%" in hog_line.split()[3:5], hog_line
    assert "STEAL: of ON-CPU, the time the kernel counted as stolen" in table


def test_no_column_for_snapshots_without_it(tmp_path):
    table = _stats(_snapshots(tmp_path, steal=False))
    assert "STEAL" not in table
    rep = orjson.loads(_stats(_snapshots(tmp_path, steal=False), "-f", "json"))
    assert {r["steal_irq_ns"] for r in rep["trends"]} == {0}


def test_prometheus_gives_it_a_family_and_no_state():
    prom = promexport.PromExport("comm")
    row = dict(mf.row(10 * S, 1, 1, "a", 0, state="running", running=5 * S), exited=False)
    row[snapdir.STEAL_FIELD] = 250 * MS
    prom.update([row], [snapdir.subtract(row, None)], [True], 0)
    text = prom.render({"wall_end_ns": 0, "interval_start_ts": 0, "interval_end_ts": S, "truncated": False,
                        "map_full": 0}).decode()
    assert 'pstate_steal_irq_seconds_total{comm="a"} 0.250000000' in text
    assert "steal_irq" not in "".join(ln for ln in text.splitlines() if ln.startswith("pstate_state_seconds"))


def test_csv_carries_it_per_interval(tmp_path):
    text = _stats(_snapshots(tmp_path), "-f", "csv")
    block = text.split("# trends\n", 1)[1].split("\n\n", 1)[0].splitlines()
    head = block[0].split(",")
    rows = [dict(zip(head, ln.split(","))) for ln in block[1:]]
    assert [r["steal_irq_ns"] for r in rows if r["comm"] == "hog"] == [str(100 * MS)] * 2

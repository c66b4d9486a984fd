"""Offline analysis across snapshots (snapdir + snapseries), on a series whose
truth is known (tests/data/snap/make_fixtures.py tells the story).

Regenerate the series and the goldens: PSTATE_REGEN=1 pytest tests/contract/test_snap_stats.py
"""

from __future__ import annotations

import filecmp
import io
import os
import shutil
import sys
from pathlib import Path

import orjson
import pytest

from pstate.render import snaptables
from pstate.engines.stats import snapshot_stats
from pstate.snapshots import snapdir
from pstate.exitcodes import PstateError

from conftest import TESTS

HERE = TESTS
DATA = HERE / "data" / "snap"
SERIES = DATA / "series"
GOLDEN = HERE / "golden" / "snap"
REGEN = os.environ.get("PSTATE_REGEN") == "1"

sys.path.insert(0, str(DATA))
import make_fixtures  # noqa: E402

S = 1_000_000_000


@pytest.fixture(autouse=True)
def _in_data_dir(monkeypatch):
    # goldens name the files relative to tests/data/snap, wherever the checkout is
    monkeypatch.chdir(DATA)


def run(paths, fmt="json", by="pid", top=None, **kw):
    out, err = io.StringIO(), io.StringIO()
    code = snapshot_stats([str(p) for p in paths], fmt=fmt, top=top, by=by, out=out, err=err, **kw)
    return code, out.getvalue(), err.getvalue()


def report(**kw):
    code, out, err = run(["series"], **kw)
    assert code == 0 and err == ""
    return orjson.loads(out)


def test_series_is_current(tmp_path):
    names = make_fixtures.generate(str(tmp_path))
    if REGEN:
        shutil.rmtree(SERIES, ignore_errors=True)
        shutil.copytree(tmp_path, SERIES)
    assert sorted(os.listdir(SERIES)) == sorted(names)
    for n in names:
        assert filecmp.cmp(tmp_path / n, SERIES / n, shallow=False), n


@pytest.mark.parametrize("fmt,by,name", [
    ("table", "pid", "stats-pid.txt"), ("json", "pid", "stats-pid.json"), ("csv", "pid", "stats-pid.csv"),
    ("table", "comm", "stats-comm.txt"), ("table", "tid", "stats-tid.txt"),
])
def test_golden(fmt, by, name):
    code, out, err = run(["series"], fmt=fmt, by=by)
    assert code == 0 and err == ""
    path = GOLDEN / name
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(out)
    assert out == path.read_text()


def test_leaker_is_top_suspect_ranked_by_slope():
    leaks = report()["leaks"]
    assert (leaks[0]["pid"], leaks[0]["comm"], leaks[0]["metric"]) == (100, "leaky", "threads")
    assert leaks[0]["snapshots"] == 5 and leaks[0]["first"] == 3 and leaks[0]["last"] == 11
    assert leaks[0]["slope_per_min"] == pytest.approx(12.0)  # two threads per 10 s
    slopes = [r["slope_per_min"] for r in leaks]
    assert slopes == sorted(slopes, reverse=True)
    d = next(r for r in leaks if r["metric"] == "uninterruptible")
    assert d["pid"] == 300 and d["first"] == pytest.approx(0.1) and d["last"] == pytest.approx(0.5)
    # nothing that merely stays busy or asleep is a suspect
    assert {r["pid"] for r in leaks} == {100, 300}


def test_min_run_is_respected():
    code, out, _ = run([SERIES], min_run=6)
    leaks = orjson.loads(out)["leaks"]
    assert [(r["pid"], r["metric"]) for r in leaks] == [(100, "sleeping")]  # 6 intervals of growth
    code, out, _ = run([SERIES], min_run=8)
    assert orjson.loads(out)["leaks"] == []


def test_churn_counts_short_lived_ones():
    ch = report()["churn"]
    second = ch["intervals"][1]
    assert (second["processes_born"], second["processes_gone"], second["short_lived_processes"]) == (3, 3, 3)
    assert second["threads_born"] == 5  # the three sh + two leaky threads
    assert ch["by_comm"][0] == {"comm": "sh", "processes_born": 3, "processes_gone": 3, "short_lived_processes": 3}
    assert ch["totals"]["processes_gone"] == 4  # three sh and the first pid 500


def test_pid_reuse_gives_two_processes():
    rows = [r for r in report()["trends"] if r["pid"] == 500]
    assert sorted((r["comm"], r["start_ts"]) for r in rows) == [("job", 122 * S), ("job2", 137 * S)]
    job = next(r for r in rows if r["comm"] == "job")
    # job ran from 122 s to 135 s: 8 s of the 120-130 s interval, 5 s of the next
    assert [s["running_ns"] for s in job["series"]] == [8 * S, 5 * S]
    assert [s["interval"] for s in job["series"]] == [2, 3]
    assert [s["threads"] for s in job["series"]] == [1, 0]


def test_never_subtracts_across_boots():
    hogs = [r for r in report()["trends"] if r["pid"] == 200]
    assert len(hogs) == 2
    b = next(r for r in hogs if r["boot_id"] == make_fixtures.BOOT_B)
    assert [(s["running_ns"], s["duration_ns"]) for s in b["series"]] == [(10 * S, 10 * S)]
    a = next(r for r in hogs if r["boot_id"] == make_fixtures.BOOT_A)
    assert all(s["cpu_share"] == 1.0 for s in a["series"])


def test_intervals_come_from_the_monotonic_clock():
    rep = report()
    ivs = rep["intervals"]
    # run 2's wall clock is one hour behind run 1's, yet it comes after it
    assert [iv["seq"] for iv in ivs] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert ivs[5]["wall_end_ns"] < ivs[4]["wall_end_ns"]
    assert all(iv["duration_ns"] == 10 * S for iv in ivs)
    assert rep["covered_ns"] == 80 * S


def test_start_times_within_slack_link_across_runs():
    steady = [r for r in report()["trends"] if r["pid"] == 600]
    assert len(steady) == 1 and steady[0]["snapshots"] == 7


def test_delta_snapshots_are_used_as_they_are():
    leaky = next(r for r in report()["trends"] if r["pid"] == 100)
    last = leaky["series"][-1]
    assert last["sleeping_ns"] == 11 * 10 * S and last["threads"] == 11


def test_top_limits_every_list():
    rep = orjson.loads(run([SERIES], top=1)[1])
    assert len(rep["trends"]) == len(rep["leaks"]) == len(rep["changed"]) == 1


def test_by_comm_merges_processes():
    rep = report(by="comm")
    sh = next(r for r in rep["trends"] if r["comm"] == "sh")
    assert sh["series"][0]["running_ns"] == 3 * (S // 4)
    assert "start_ts" not in sh


def test_files_and_directories_mix_without_duplicates():
    one = sorted(SERIES.iterdir())[0]
    rep = orjson.loads(run([SERIES, one])[1])
    assert rep["snapshots"] == 8


def test_incomplete_snapshot_is_left_out(tmp_path):
    shutil.copytree(SERIES, tmp_path / "s")
    victim = sorted((tmp_path / "s").iterdir())[3]
    data = victim.read_bytes()
    victim.write_bytes(data[: data.rindex(b'{"type":"end"')])
    code, out, err = run([tmp_path / "s"])
    assert code == 0
    assert f"warning: {victim}: incomplete snapshot" in err
    assert orjson.loads(out)["snapshots"] == 7
    code, _out, _err = run([tmp_path / "s"], strict=True)
    assert code == 65


def test_bad_rows_are_skipped_and_counted(tmp_path):
    src = sorted(SERIES.iterdir())[0]
    lines = src.read_bytes().splitlines(keepends=True)
    bad = orjson.loads(lines[1])
    bad["pid"] = "100"
    lines[1] = orjson.dumps(bad) + b"\n"
    lines.insert(2, b"{not json\n")
    dst = tmp_path / src.name
    dst.write_bytes(b"".join(lines))
    code, out, err = run([dst])
    assert code == 0
    assert 'skipped 1 line: task row with a bad or missing "pid"' in err
    assert "skipped 1 line: not valid JSON" in err
    assert orjson.loads(out)["snapshots"] == 1


def test_truncated_snapshots_warn(tmp_path):
    src = sorted(SERIES.iterdir())[0]
    lines = src.read_bytes().splitlines(keepends=True)
    meta = orjson.loads(lines[0])
    meta.update(truncated=True, map_full=12)
    (tmp_path / src.name).write_bytes(orjson.dumps(meta) + b"\n" + b"".join(lines[1:]))
    code, out, err = run([tmp_path])
    assert code == 0 and "1 snapshot(s) are truncated" in err
    code, out, err = run([tmp_path], fmt="table")
    assert out.splitlines()[2] == "1 truncated: the task map was full, some threads are missing"


def test_refuses_what_is_not_a_snapshot(tmp_path):
    rec = tmp_path / "rec.jsonl"
    rec.write_text('{"type":"meta","schema":1,"source":"record"}\n{"type":"end","ts":1}\n')
    with pytest.raises(PstateError) as e:
        run([rec])
    assert e.value.exit_code == 65 and "is not a pstate snapshot" in e.value.message
    (tmp_path / "empty").mkdir()
    with pytest.raises(PstateError) as e:
        run([tmp_path / "empty"])
    assert e.value.exit_code == 66
    with pytest.raises(PstateError) as e:
        run([SERIES], by="cpu")
    assert e.value.exit_code == 2
    with pytest.raises(PstateError) as e:
        run([SERIES], fmt="yaml")
    assert e.value.exit_code == 2


def test_newer_schema_is_refused(tmp_path):
    src = sorted(SERIES.iterdir())[0]
    lines = src.read_bytes().splitlines(keepends=True)
    meta = orjson.loads(lines[0])
    meta["schema"] = 99
    (tmp_path / src.name).write_bytes(orjson.dumps(meta) + b"\n" + b"".join(lines[1:]))
    with pytest.raises(PstateError) as e:
        run([tmp_path])
    assert e.value.exit_code == 65


def test_directory_listing_ignores_other_files(tmp_path):
    shutil.copy(sorted(SERIES.iterdir())[0], tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / ".pstate-x.tmp.1.ab").write_text("partial")
    (tmp_path / "pstate-snap-20270101T000000.000000Z-000009.jsonl").symlink_to("/etc/passwd")
    assert [Path(p).name for p in snapdir.list_dir(str(tmp_path))] == [sorted(SERIES.iterdir())[0].name]


def test_is_snapshot_source(tmp_path):
    rec = tmp_path / "rec.jsonl"
    rec.write_text('{"type":"meta","schema":1,"source":"record"}\n')
    assert snapdir.is_snapshot_source(str(SERIES))
    assert snapdir.is_snapshot_source(str(sorted(SERIES.iterdir())[0]))
    assert not snapdir.is_snapshot_source(str(rec))
    assert not snapdir.is_snapshot_source("-")


def test_names_round_trip_and_sort_by_time():
    a = snapdir.snapshot_name(1_800_000_000 * S + 123_456_000, 7, "jsonl")
    assert a == "pstate-snap-20270115T080000.123456Z-000007.jsonl"
    assert snapdir.parse_name(a) == (1_800_000_000 * S + 123_456_000, 7, "jsonl")
    b = snapdir.snapshot_name(1_800_000_001 * S, 8, "jsonl")
    assert sorted([b, a]) == [a, b]
    assert snapdir.parse_name("pstate-snap-2027.jsonl") is None
    assert snapdir.parse_name(".pstate-" + a + ".tmp.1.ab") is None


def test_subtract_never_goes_negative():
    assert snapdir.subtract({"running_ns": 5, "nvcsw": 1}, {"running_ns": 7, "nvcsw": 0}) == \
        {"running_ns": 0, "nvcsw": 1}


def test_sparkline():
    assert snaptables.spark([0, 1, 2, 4]) == "▁▃▅█"
    assert snaptables.spark([0, 0]) == "▁▁"
    assert len(snaptables.spark(list(range(100)))) == snaptables.SPARK_WIDTH
    assert snaptables.spark([1, 2], unicode=False) == "+@"


def test_table_fits_80_columns():
    for by in ("pid", "comm"):
        _code, out, _err = run(["series"], fmt="table", by=by)
        assert max(map(len, out.splitlines())) <= 80, by


def test_documented_fields_match_the_rows():
    assert list(snapdir.TASK_RECORD[1]) == [f for f in snapdir.ROW_FIELDS if f not in ("type", "ts")]
    rows = snapdir.read_snapshot(str(sorted(SERIES.iterdir())[0])).rows
    assert all(list(r) == list(snapdir.ROW_FIELDS) for r in rows)
    meta = snapdir.read_snapshot(str(sorted(SERIES.iterdir())[0])).meta
    assert set(snapdir.SNAP_META_FIELDS) <= set(meta)


def test_csv_snapshots_read_as_their_json_lines_twins(tmp_path):
    """snap --format csv writes what stats DIR/ reads back: the same series
    as CSV gives the same report (paths aside)."""
    from pstate.snapshots import writer

    for src in sorted(SERIES.iterdir()):
        recs = [orjson.loads(x) for x in src.read_bytes().splitlines()]
        meta, rows, end = recs[0], recs[1:-1], recs[-1]
        (tmp_path / src.name.replace(".jsonl", ".csv")).write_bytes(writer.render_csv(meta, rows, end))
    want = report()
    code, out, err = run([tmp_path])
    assert code == 0 and err == ""
    got = orjson.loads(out)
    for iv in got["intervals"]:
        iv["file"] = "series/" + Path(iv["file"]).name.replace(".csv", ".jsonl")
    assert got == want


def test_a_csv_snapshot_with_a_damaged_row_skips_it_and_says_so(tmp_path):
    from pstate.snapshots import writer

    src = sorted(SERIES.iterdir())[0]
    recs = [orjson.loads(x) for x in src.read_bytes().splitlines()]
    data = writer.render_csv(recs[0], recs[1:-1], recs[-1]).splitlines(keepends=True)
    data.insert(3, b"1,2,3\n")
    path = tmp_path / src.name.replace(".jsonl", ".csv")
    path.write_bytes(b"".join(data))
    stats = snapdir.ReadStats()
    snap = snapdir.read_snapshot(str(path), stats)
    assert snap is not None and len(snap.rows) == len(recs) - 2
    assert stats.skipped == {"CSV row with a wrong number of fields": 1}
    assert stats.first_bad["CSV row with a wrong number of fields"] == f"{path}:4"
    with pytest.raises(PstateError, match=r":4: 3 CSV fields"):
        snapdir.read_snapshot(str(path), snapdir.ReadStats(), strict=True)


@pytest.mark.parametrize("by, names", [
    ("unit", {"hog.service", "db.service", "cron.service", "session-1.scope",
              f"docker-{make_fixtures.DOCKER_ID}.scope"}),
    ("container", {"host", make_fixtures.DOCKER_ID[:12]}),
    ("cgroup", set(make_fixtures.CGROUPS.values())),
    ("title", {f"{c}: worker" for c in make_fixtures.CGROUPS}),
])
def test_snapshots_grouped_by_service_and_role(by, names):
    rep = report(by=by)
    trends = {r["comm"]: r for r in rep["trends"]}
    assert set(trends) == names
    if by == "unit":
        assert trends["hog.service"]["cpu_share_avg"] == pytest.approx(1.0)
        assert trends["db.service"]["d_ns_per_interval"] > 0 and trends["hog.service"]["d_ns_per_interval"] == 0
    if by == "container":
        leaky = trends[make_fixtures.DOCKER_ID[:12]]
        assert leaky["series"][-1]["threads"] > leaky["series"][0]["threads"]  # the leaky one's threads


# --- heat DIR/ by service and role, and --by ppid ------------------------------------------

def _heat(*args):
    from click.testing import CliRunner

    from pstate.main import cli

    res = CliRunner().invoke(cli, ["heat", "series", "--width", "240", *args])
    return res.exit_code, res.stdout, res.stderr


def _heat_rows(out: str) -> list[str]:
    """The row labels of a heat map (the lines before its axis)."""
    lines = out.splitlines()
    axis = next(i for i, x in enumerate(lines) if x.lstrip().startswith("+-"))
    width = lines[axis].index("+")  # the labels' column
    return [x[:width].rstrip() for x in lines[1:axis]]  # (the title fits one line at this width)


@pytest.mark.parametrize("by, names", [
    ("unit", {"hog.service", "db.service", "cron.service", "session-1.scope",
              "docker-" + make_fixtures.DOCKER_ID[:16] + "~"}),  # (a long label is cut)
    ("container", {"host", make_fixtures.DOCKER_ID[:12]}),
    ("title", {f"{c}: worker" for c in make_fixtures.CGROUPS}),
])
def test_heat_draws_snapshots_by_service_and_role(by, names):
    code, out, err = _heat("--by", by)
    assert code == 0, err
    assert set(_heat_rows(out)) == names
    assert f"per {by} and snapshot interval" in out


def test_heat_snapshot_rows_hold_each_threads_time_in_its_service():
    """The time a map row by unit holds is the time of the threads whose
    rows name that unit's cgroup, snapshot by snapshot."""
    from pstate.render import heatviews

    snaps = snapdir.read_dir("series", snapdir.ReadStats())
    by_unit, _ = heatviews.snapshot_values(snaps, ("running",), "unit")
    by_tid, labels = heatviews.snapshot_values(snaps, ("running",), "tid")
    unit_of_tid = {}
    for s in snaps:
        for r in s.rows:
            unit_of_tid[r["tid"]] = snapdir.service_key("unit", r)
    for (iv_u, vu), (iv_t, vt) in zip(by_unit, by_tid):
        assert iv_u == iv_t
        want: dict = {}
        for tid, v in vt.items():
            want[unit_of_tid[tid]] = want.get(unit_of_tid[tid], 0) + v
        assert vu == want
    assert any(v.get("hog.service") for _iv, v in by_unit)


@pytest.mark.parametrize("args, rows", [
    (["--cgroup", "/system.slice/db.service"], {"db.service"}),
    (["--cgroup", "/system.slice", "--title", "job*"], {"cron.service"}),
    (["--title", "hog: *"], {"hog.service"}),
])
def test_heat_snapshot_filters_read_the_rows_identity(args, rows):
    code, out, err = _heat("--by", "unit", *args)
    assert code == 0, err
    assert set(_heat_rows(out)) == rows


def test_heat_snapshots_say_which_event_filters_they_do_not_use():
    code, out, err = _heat("--by", "unit", "--cpu", "1", "--state", "D", "--title", "hog: *")
    assert code == 0
    assert err == "pstate heat: warning: --state, --cpu not used with snapshots\n"
    assert set(_heat_rows(out)) == {"hog.service"}


def _with_ppid(tmp_path) -> Path:
    """The series with a parent pid in each row (pid 1 for odd pids, 2 else)."""
    for src in SERIES.iterdir():
        recs = [orjson.loads(x) for x in src.read_bytes().splitlines()]
        for r in recs:
            if r["type"] == "task":
                r["ppid"] = 1 if r["pid"] % 2 else 2
        (tmp_path / src.name).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    return tmp_path


def test_snapshots_grouped_by_ppid(tmp_path):
    path = _with_ppid(tmp_path)
    code, out, err = run([path], by="ppid")
    assert code == 0 and err == ""
    rep = orjson.loads(out)
    assert {r["comm"] for r in rep["trends"]} <= {"1", "2"} and len(rep["trends"]) == 2
    code, out, err = run([SERIES], by="ppid")  # rows without a ppid: one group, "?"
    assert code == 0 and {r["comm"] for r in orjson.loads(out)["trends"]} == {"?"}
    code, out, err = _heat_dir(path, "--by", "ppid")
    assert code == 0 and set(_heat_rows(out)) == {"1", "2"}


def _heat_dir(path, *args):
    from click.testing import CliRunner

    from pstate.main import cli

    res = CliRunner().invoke(cli, ["heat", str(path), "--width", "240", *args])
    return res.exit_code, res.stdout, res.stderr

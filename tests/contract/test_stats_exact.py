"""stats is honest about distorted input and checks its own ledger: cut
windows are clipped, filtered recordings get no time in state, impossible
sequences are counted apart, on-CPU above the CPUs is flagged, the largest
deviation is named; histograms keep their bulk apart; snapshots replayed
into stats are sent where their analysis is; --interval counts skipped
lines per interval.

The fixtures (state-d.jsonl, impossible.jsonl) come from
tests/data/stats/stats_fixtures.py; test_one_reader holds both paths to them.
"""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

import test_stats
from pstate.analysis.latency import LogHist, pick_unit
from pstate.main import cli
from test_stats import DATA, MS, both_paths, by_key, report, run

T0 = 1_000_000_000


@pytest.fixture(autouse=True)
def in_data_dir(monkeypatch):
    monkeypatch.chdir(DATA)


def replay(*args) -> bytes:
    res = CliRunner().invoke(cli, ["replay", "--no-wait", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    return res.stdout_bytes


# --- item 3: cut windows and filtered recordings -----------------------------------


def test_replay_cut_says_which_window_it_covers_and_ends_there():
    lines = [orjson.loads(x) for x in replay("-b", "+0.3s", "-e", "+0.6s", test_stats.BASIC).splitlines()]
    meta, end = lines[0], lines[-1]
    assert (meta["window_begin_ts"], meta["window_end_ts"]) == (T0 + 300 * MS, T0 + 600 * MS)
    assert end["type"] == "end" and end["ts"] == T0 + 600 * MS  # not its last event (560 ms)


def test_a_cut_past_the_recording_ends_with_the_recording():
    lines = [orjson.loads(x) for x in replay("-b", "+0.5s", "-e", "+9s", test_stats.BASIC).splitlines()]
    assert lines[-1]["ts"] == T0 + 1000 * MS  # the recording's own end, not the window's


def test_a_replay_window_through_stats_is_the_interval_of_the_whole_recording():
    cut = replay("-b", "+0.3s", "-e", "+0.6s", test_stats.BASIC)
    rep = orjson.loads(both_paths(["--by", "tid"], input=cut).stdout)
    whole = [orjson.loads(x) for x in run(test_stats.BASIC, "--by", "tid", "-i", "0.3", "-f", "json",
                                          "--hist", "--matrix").stdout.splitlines()]
    second = whole[1]
    assert rep["window"] == {"start_ts": T0 + 300 * MS, "end_ts": T0 + 600 * MS, "duration_ns": 300 * MS}
    assert rep["ledger"]["cut"] is True
    for g in rep["groups"]:
        assert g["observed_ns"] <= 300 * MS  # no duration reaches back before --begin
    assert [(g["key"], g["states"], g["latency"]) for g in rep["groups"]] == \
        [(g["key"], g["states"], g["latency"]) for g in second["groups"]]
    # the tasks there from the window's start sum to it, exactly
    assert rep["accounting"]["tasks_whole_window"] == 4
    assert rep["accounting"]["max_abs_deviation_ns"] == 0


def test_a_state_d_recording_gets_counts_and_latencies_but_no_time_in_state():
    res = both_paths(["state-d.jsonl"])
    rep = orjson.loads(res.stdout)
    assert rep["ledger"] == {"time_in_state": False, "transition_filters": ["--state"], "task_filters": [],
                             "read_filters": [], "cut": False}
    dd = by_key(rep)[500]
    assert dd["states"] == {} and dd["observed_ns"] is None  # never RUNQ 88 %
    assert (dd["transitions"], dd["voluntary"]) == (20, 10)
    lat = dd["latency"]
    assert (lat["blocked_uninterruptible"]["count"], lat["blocked_uninterruptible"]["p50_ns"],
            lat["blocked_uninterruptible"]["max_ns"]) == (10, 5 * MS, 5 * MS)
    assert (lat["oncpu"]["count"], lat["oncpu"]["max_ns"]) == (10, 2 * MS)
    table = run("state-d.jsonl")
    assert table.exit_code == 0
    assert "Time in state" not in table.stdout and "%" not in table.stdout
    assert ("FILTERED: recorded with --state: only the transitions that passed are here, so\n"
            "  time in state is not shown; counts and latencies are of the transitions kept.\n") in table.stdout
    csv = run("state-d.jsonl", "-f", "csv").stdout.splitlines()
    head, row = csv[0].split(","), csv[1].split(",")
    assert row[head.index("running_ns")] == "" and row[head.index("observed_ns")] == ""


@pytest.mark.parametrize("field,option", [("filter_cpu", "--cpu"), ("filter_min_dur_ns", "--min-dur"),
                                          ("replay_filter_state", "--state")])
def test_every_transition_filter_takes_time_in_state_away(field, option, tmp_path):
    lines = (DATA / test_stats.BASIC).read_bytes().splitlines(keepends=True)
    meta = orjson.loads(lines[0])
    meta[field] = 10 * MS if field.endswith("_ns") else [1]
    path = tmp_path / "f.jsonl"
    path.write_bytes(orjson.dumps(meta) + b"\n" + b"".join(lines[1:]))
    rep = report(str(path))
    assert rep["ledger"]["transition_filters"] == [option]
    assert all(g["states"] == {} for g in rep["groups"])


def test_a_task_filter_keeps_time_in_state(tmp_path):
    lines = (DATA / test_stats.BASIC).read_bytes().splitlines(keepends=True)
    meta = {**orjson.loads(lines[0]), "filter_pid": [100, 200, 300]}
    path = tmp_path / "p.jsonl"
    path.write_bytes(orjson.dumps(meta) + b"\n" + b"".join(lines[1:]))
    rep, plain = report(str(path)), report(test_stats.BASIC)
    assert rep["ledger"]["task_filters"] == ["--pid"] and rep["ledger"]["time_in_state"] is True
    assert rep["groups"] == plain["groups"]
    assert "filtered: recorded with --pid: only the tasks kept." in run(str(path)).stdout


# --- item 4: the ledger checks itself ------------------------------------------------


def test_running_to_running_switch_ins_are_counted_apart():
    rep = orjson.loads(both_paths(["impossible.jsonl"]).stdout)
    agent = by_key(rep)[700]
    assert (agent["impossible"], agent["voluntary"], agent["involuntary"]) == (27, 0, 0)
    assert by_key(rep)[800]["voluntary"] == 1
    assert rep["accounting"]["impossible_transitions"] == 27
    out = run("impossible.jsonl").stdout
    assert ("impossible: 27 switch-ins of a task already running (running -> running),\n"
            "  counted apart, not as switches\n") in out


def test_a_group_on_cpu_above_its_cpus_is_flagged():
    rep = report("impossible.jsonl")
    assert rep["accounting"]["oncpu_exceeds_cpus"] == [700]
    assert [g["key"] for g in rep["groups"] if g["oncpu_exceeds_cpus"]] == [700]
    assert by_key(rep)[700]["states"]["running"]["ns"] > 2 * 1000 * MS  # 3 threads, 2 CPUs, 1 s
    # by thread, each is on its one CPU at most the whole window: nothing to flag
    assert report("impossible.jsonl", "--by", "tid")["accounting"]["oncpu_exceeds_cpus"] == []
    assert "FLAGGED: on-CPU above the CPUs the group could use (pid 700)" in run("impossible.jsonl").stdout


def test_the_deviation_line_names_its_task():
    rep = report("impossible.jsonl")
    acc = rep["accounting"]
    assert (acc["max_abs_deviation_ns"], acc["max_deviation_tid"], acc["max_deviation_comm"]) == \
        (50 * MS, 900, "liar")
    assert "max deviation 50ms (tid 900 liar);" in run("impossible.jsonl").stdout


# --- item 5: small defects -----------------------------------------------------------


def test_one_long_outlier_does_not_collapse_the_bulk_into_one_bucket():
    h = LogHist()
    for i in range(1003):
        h.add(900_000 + (i % 200) * 1_000)  # ~1 ms slices
    h.add(150 * MS)
    assert pick_unit(h) == ("usecs", 1_000)
    rows = {(lo, hi): n for lo, hi, n in h.log2_buckets(1_000)}
    assert rows[(512, 1023)] and rows[(1024, 2047)]  # the median's row and its neighbour, apart
    slow = LogHist()
    for i in range(50):
        slow.add(20 * MS + i * MS)
    slow.add(300 * MS)
    assert pick_unit(slow) == ("msecs", 1_000_000)


def test_replayed_snapshots_into_stats_say_where_their_analysis_is():
    snaps = replay(str(DATA.parent / "snap" / "series"))
    res = run(input=snaps)
    assert res.exit_code == 65
    assert res.stdout == ""
    assert res.stderr == ("Error: the input holds snapshots (from pstate snap), not an event stream\n"
                          "  fix: give the snapshot directory or files to stats itself: pstate stats DIR/\n")


def test_interval_skipped_total_is_per_interval(tmp_path):
    lines = (DATA / test_stats.BASIC).read_bytes().splitlines(keepends=True)
    path = tmp_path / "bad.jsonl"
    path.write_bytes(lines[0] + b"not json\n" + b"".join(lines[1:]))
    reps = [orjson.loads(x) for x in run(str(path), "-i", "0.3", "-f", "json").stdout.splitlines()]
    assert [r["input"]["skipped_total"] for r in reps] == [1] + [0] * (len(reps) - 1)
    assert reps[0]["input"]["complete"] is False and reps[-1]["input"]["complete"] is True


# --- as root: a real `record --state D` ----------------------------------------------

DISK_WRITER = """
import mmap, os, sys
sys.stdin.read(1)
buf = mmap.mmap(-1, 4096)
buf.write(b"x" * 4096)
fd = os.open({path!r}, os.O_WRONLY | os.O_CREAT | os.O_DIRECT | os.O_DSYNC, 0o600)
for i in range(100):
    os.pwrite(fd, buf, (i % 64) * 4096)
os.close(fd)
"""


@pytest.mark.bpf
def test_record_state_d_through_stats_counts_its_d_sleeps_and_shows_no_time_in_state(tmp_path):
    import workloads

    recs, child = workloads.record_workload(DISK_WRITER.format(path=str(tmp_path / "direct.bin")),
                                            "--state", "D")
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    d_sleeps = [r for r in workloads.states(recs, child.pid) if r["from"] == "uninterruptible"]
    assert len(d_sleeps) >= 50  # a synchronous direct write sleeps in D
    rep = orjson.loads(both_paths([str(path), "--by", "tid"]).stdout)
    assert rep["ledger"]["time_in_state"] is False and rep["ledger"]["transition_filters"] == ["--state"]
    g = by_key(rep)[child.pid]
    assert g["states"] == {} and g["observed_ns"] is None
    lat = g["latency"]["blocked_uninterruptible"]
    known = [r["dur_ns"] for r in d_sleeps if r["dur_ns"] is not None]
    assert (lat["count"], lat["max_ns"]) == (len(known), max(known))
    out = run(str(path), "--by", "tid").stdout
    assert "Time in state" not in out and "FILTERED: recorded with --state" in out


def test_a_cut_stream_in_intervals_is_clipped_to_its_window(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_bytes(replay("-b", "+0.3s", "-e", "+0.6s", test_stats.BASIC))
    cut, whole = ([orjson.loads(x) for x in run(src, "--by", "tid", "-i", "0.15", "-f", "json").stdout.splitlines()]
                  for src in (str(path), test_stats.BASIC))
    assert [r["window"] for r in cut] == [r["window"] for r in whole[2:4]]
    for c, w in zip(cut, whole[2:4]):
        # a task with no transition yet in the cut is not in it: the rest is the same
        assert c["groups"] == [g for g in w["groups"] if g["key"] in by_key(c)]
    assert cut[1]["groups"] == whole[3]["groups"]

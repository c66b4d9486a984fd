"""Unit tests of the heat map models: bucketing, intervals, windows, snapshots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pstate.render import heatmodel as hm
from pstate.render import heatviews
from pstate.snapshots import snapdir
from pstate.stream.filters import Filter
from pstate.stream.streamio import ReadStats
from conftest import TESTS

DATA = TESTS / "data" / "heat"
MS = 1_000_000
R = hm.STATE_INDEX["running"]
S = hm.STATE_INDEX["sleeping"]
D = hm.STATE_INDEX["uninterruptible"]
Q = hm.STATE_INDEX["runnable"]


def st(ts, tid, frm, to, dur, pid=None, comm="t"):
    return {"type": "state", "ts": ts, "cpu": 0, "pid": tid if pid is None else pid, "tid": tid,
            "comm": comm, "from": frm, "to": to, "dur_ns": dur, "cause": "x"}


# --- arithmetic -------------------------------------------------------------------------


@pytest.mark.parametrize("span,ncols,want", [
    (1_000_000_000, 68, 15_000_000),  # 14.7ms -> 15ms
    (10_200_000_000, 63, 170_000_000),  # 161.9ms -> 170ms
    (1000, 68, 15),
    (0, 80, 1),
    (60_000_000_000, 60, 1_000_000_000),
])
def test_nice_bucket(span, ncols, want):
    b = hm.nice_bucket(span, ncols)
    assert b == want
    assert -(-max(span, 1) // b) <= ncols


def test_log2_bucket_bounds():
    assert hm.log2_bucket(0) == 0
    assert hm.log2_bucket(1) == 1
    assert hm.log2_bucket(1023) == 10 and hm.log2_bucket(1024) == 11
    for b in range(1, 40):
        lo = hm.log2_lower(b)
        assert hm.log2_bucket(lo) == b and hm.log2_bucket(2 * lo - 1) == b


def test_grid_paint_splits_and_clamps():
    g = hm.Grid(1000, 10)
    g.paint("a", R, 1005, 1035)
    assert [g.cell(c, "a")[R] for c in range(4)] == [5, 10, 10, 5]
    assert g.cell(0, "a")[hm.BUSY] == 5
    g.paint("a", S, 1000, 1040, lo=2)
    assert g.cell(0, "a")[S] == 0 and g.cell(2, "a")[S] == 10 and g.cell(3, "a")[S] == 10
    assert g.cell(2, "a")[hm.BUSY] == 10  # sleeping is not busy
    g.paint("a", S, 1000, 1010, lo=5)  # entirely before lo: nothing
    assert 5 not in g.cols


def test_dominant_prefers_most_time_and_first_on_ties():
    cell = [0] * (hm.NSTATES + 1)
    assert heatviews.dominant(cell) is None
    cell[S] = 5
    cell[R] = 5
    assert heatviews.dominant(cell) == R  # running comes first in the vocabulary
    cell[D] = 6
    assert heatviews.dominant(cell) == D


# --- tracker ---------------------------------------------------------------------------------


def feed(t, recs):
    for r in recs:
        t.feed(r)
    return t


def test_intervals_come_from_dur_ns_and_open_states_last_to_the_end():
    t = hm.RecordedStates()
    feed(t, [
        {"type": "meta", "schema": 1, "ts": 0},
        st(10 * MS, 1, "sleeping", "runnable", None),  # start unseen: nothing drawn before 10ms
        st(12 * MS, 1, "runnable", "running", 2 * MS),
        st(20 * MS, 1, "running", "uninterruptible", 8 * MS),
        st(30 * MS, 2, "running", "sleeping", 30 * MS),
        {"type": "end", "ts": 50 * MS},
    ])
    t.close()
    assert t.range() == (0, 50 * MS)
    assert t.totals[1][Q] == 2 * MS and t.totals[1][R] == 8 * MS
    assert t.totals[1][D] == 30 * MS  # open D from 20ms to the end of the stream
    assert t.totals[2][S] == 20 * MS
    assert t.totals[1][hm.BUSY] == 40 * MS and t.totals[2][hm.BUSY] == 30 * MS
    g = t.state_grid([1, 2], 0, 10 * MS, 50 * MS)
    rows, seen = heatviews.state_rows(g, [1, 2], 0, 5, None)
    assert rows[0] == [None, R, D, D, D]
    assert rows[1] == [R, R, R, S, S]
    assert seen == sorted({R, D, S})
    share, _ = heatviews.state_rows(g, [1], 0, 5, D)
    assert share == [[None, 0.0, 1.0, 1.0, 1.0]]


def test_reaped_tasks_are_not_extended_and_clip_to_range():
    t = hm.RecordedStates()
    feed(t, [
        st(10 * MS, 5, "running", "zombie", None),
        st(15 * MS, 5, "zombie", "reaped", 5 * MS),
        st(40 * MS, 6, "running", "sleeping", 100 * MS),  # began before the stream: clipped
    ])
    t.close()
    assert t.totals[5][hm.STATE_INDEX["zombie"]] == 5 * MS
    assert t.totals[5][hm.STATE_INDEX["reaped"]] == 0
    g = t.state_grid([6], 10 * MS, 10 * MS, 40 * MS)
    assert sum(c[6][R] for c in g.cols.values()) == 30 * MS


def test_by_pid_and_comm_aggregate_and_label():
    for by, want in (("pid", {100: "main 100"}), ("comm", {"main": "main", "helper": "helper"})):
        t = hm.RecordedStates(by)
        feed(t, [st(10, 101, "running", "sleeping", 5, pid=100, comm="helper"),
                 st(20, 100, "running", "sleeping", 5, pid=100, comm="main")])
        t.close()
        assert {k: t.label(k) for k in t.totals} == want


def test_filter_and_idle():
    t = hm.RecordedStates("tid", Filter(pids=(7,)))
    feed(t, [st(10, 1, "running", "sleeping", 5), st(10, 8, "running", "sleeping", 5, pid=7)])
    assert set(t.totals) == {8}
    t = hm.RecordedStates("tid", Filter())
    feed(t, [st(10, 0, "running", "sleeping", 5)])
    assert not t.totals
    t = hm.RecordedStates("tid", Filter(include_idle=True))
    feed(t, [st(10, 0, "running", "sleeping", 5)])
    assert set(t.totals) == {0}


def test_unknown_future_state_is_other():
    t = hm.RecordedStates()
    feed(t, [st(10, 1, "state_Q", "running", 4)])
    assert t.totals[1][hm.OTHER] == 4


def test_latency_samples_by_measure():
    t = hm.RecordedStates("tid", None, "runq")
    feed(t, [st(100, 1, "runnable", "running", 1000), st(200, 1, "running", "sleeping", 50),
             st(300, 1, "runnable", "running", 3000), st(400, 1, "runnable", "running", None)])
    assert t.n_samples == 2
    cols = t.latency_counts(0, 1000)
    assert cols[0][hm.log2_bucket(1000)] == 1 and cols[0][hm.log2_bucket(3000)] == 1
    t = hm.RecordedStates("tid", None, "oncpu")
    feed(t, [st(100, 1, "runnable", "running", 1000), st(200, 1, "running", "sleeping", 50)])
    assert t.n_samples == 1 and list(t.lat_b) == [hm.log2_bucket(50)]


def test_latency_rows_merge_when_taller_than_allowed():
    cols = {0: [0] * hm.NLOG2, 3: [0] * hm.NLOG2}
    cols[0][10] = 4
    cols[3][20] = 1
    rows, spans, per = heatviews.latency_rows(cols, 0, 4, 100)
    assert per == 1 and len(rows) == 11 and spans[0] == (20, 20) and spans[-1] == (10, 10)
    assert rows[0] == [0, 0, 0, 1] and rows[-1] == [4, 0, 0, 0]
    rows, spans, per = heatviews.latency_rows(cols, 0, 4, 4)
    assert per == 3 and len(rows) == 4 and spans[0] == (18, 20)
    assert sum(map(sum, rows)) == 5
    assert heatviews.latency_rows({}, 0, 4, 4) == ([], [], 1)


# --- the live window -------------------------------------------------------------------------


def test_window_slides_and_forgets_old_columns():
    w = hm.Window(10, 5)
    for ts in range(10, 200, 10):
        w.feed(st(ts, 1, "preempted", "running", 10))
    lo = w.advance()
    assert lo == 190 // 10 - 5 + 1
    assert min(w.grid.cols) >= lo and max(w.grid.cols) == 18
    assert w.scores()[1] == 50 - 10 + 10 * 0  # 4 full buckets + open running from 190 up to now (0)


def test_window_overlay_shows_a_task_stuck_in_d():
    w = hm.Window(10, 10)
    w.feed(st(100, 1, "running", "uninterruptible", 10))
    for ts in range(110, 200, 10):  # another task moves time on
        w.feed(st(ts, 2, "sleeping", "sleeping", 10))
    scores = w.scores()
    assert scores[1] == 90  # D since 100, up to now (190); D is busy time
    keys = w.rank(scores, 5)
    assert keys[0] == 1
    ov = w.overlay(keys)
    rows, seen = heatviews.state_rows(w.grid, keys, w.advance(), 10, None, ov)
    assert rows[0] == [D] * 9 + [None] and D in seen  # now is the start of the last bucket
    w.feed(st(195, 2, "sleeping", "sleeping", 5))
    rows, seen = heatviews.state_rows(w.grid, keys, w.advance(), 10, None, w.overlay(keys))
    assert rows[0] == [D] * 10
    assert w.scores(D)[1] == 95 and w.scores(D).get(2, 0) == 0


def test_window_gap_fill_when_sampling():
    w = hm.Window(10, 100)
    w.sample_every = 4
    w.feed(st(100, 1, "running", "sleeping", 10))
    w.feed(st(300, 1, "runnable", "running", 20))  # records in between were skipped
    c = w.grid.cols
    assert sum(col[1][S] for col in c.values() if 1 in col) == 180  # 100..280 credited to sleeping
    assert sum(col[1][Q] for col in c.values() if 1 in col) == 20


def test_window_prune_forgets_dead_tasks():
    w = hm.Window(10, 3)
    w.feed(st(10, 1, "zombie", "reaped", 5))
    w.feed(st(1000, 2, "running", "running", 5))
    w.prune()
    assert 1 not in w.events and 2 in w.events


# --- snapshots -------------------------------------------------------------------------------


def test_snapshot_reader_lists_only_snapshot_files_in_order():
    names = snapdir.list_dir(str(DATA / "snaps"))
    assert len(names) == 4 and names == sorted(names)
    stats = ReadStats()
    snaps = snapdir.read_dir(str(DATA / "snaps"), stats)
    assert [s.meta["seq"] for s in snaps] == [0, 1, 2, 3] and all(s.end is not None for s in snaps)


def test_snapshot_cumulative_differences_and_pid_reuse():
    snaps = snapdir.read_dir(str(DATA / "snaps"), ReadStats())
    values, labels = heatviews.snapshot_values(snaps, ("running",), "pid")
    per_snap = [vals for _iv, vals in values]
    # nginx: 6 s (+6 s on odd intervals) + 20 s per interval, differenced
    assert [v[10] for v in per_snap] == [26000 * MS, 32000 * MS, 26000 * MS, 32000 * MS]
    # pid 40: cron (1 s) in 0-1, then rsync (a new identity) counted from its start
    assert per_snap[0][40] == 1000 * MS and per_snap[2][40] == 25000 * MS and per_snap[3][40] == 30000 * MS
    assert labels[40] == "rsync"
    cells, spans, per = heatviews.snapshot_view_cells(values, [10], 80)
    assert per == 1 and cells[0][0] == pytest.approx(26 / 60)
    cells, spans, per = heatviews.snapshot_view_cells(values, [10], 2)
    assert per == 2 and cells[0][0] == pytest.approx(58 / 120)


def test_snapshot_values_skip_counts_from_before_the_interval(tmp_path):
    s = 1_000_000_000
    meta = {"type": "meta", "schema": 1, "ts": 2 * s, "interval_start_ts": s, "interval_end_ts": 2 * s,
            "mode": "delta"}
    row = {"type": "task", "ts": 2 * s, "pid": 1, "tid": 1, "comm": "x", "start_ts": 0, "running_ns": 5 * s}
    ok = dict(row, tid=2, running_ns=s // 2)
    values, _ = heatviews.snapshot_values([snapdir.Snapshot("a", meta, [row, ok], {})], ("running",), "tid")
    assert values[0][1] == {2: s // 2}  # 5 s of running in a 1 s interval cannot be right


def test_snapshot_bad_rows_are_skipped(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    lines = [{"type": "meta", "schema": 1, "source": "snap", "ts": 10, "mode": "delta",
              "interval_start_ts": 5, "interval_end_ts": 10},
             {"type": "task", "ts": 10, "pid": "x", "tid": 1, "start_ts": 0},
             {"type": "task", "ts": 10, "pid": 1, "tid": 1, "start_ts": 0, "running_ns": -5},
             {"type": "task", "ts": 10, "pid": 1, "tid": 1, "start_ts": 0, "running_ns": 5}]
    (d / "pstate-snap-20250101T120000.000000Z-000000.jsonl").write_text(
        "\n".join(json.dumps(x) for x in lines) + "\n")
    (d / ".pstate-snap-20250101T120100.000000Z-000001.jsonl").write_text("hidden\n")
    stats = ReadStats()
    snaps = snapdir.read_dir(str(d), stats)
    assert len(snaps) == 1 and len(snaps[0].rows) == 1 and snaps[0].end is None
    assert stats.skipped == {'task row with a bad or missing "pid"': 1, 'task row with a bad "running_ns"': 1}


def test_snapshot_runs_are_not_differenced_across():
    s = 1_000_000_000

    def snap(run, boot, start, end, seq, running, mode="cumulative"):
        meta = {"type": "meta", "schema": 1, "ts": end, "interval_start_ts": start, "interval_end_ts": end,
                "mode": mode, "run_id": run, "boot_id": boot, "seq": seq}
        row = {"type": "task", "ts": end, "pid": 1, "tid": 1, "comm": "x", "start_ts": start,
               "running_ns": running}
        return snapdir.Snapshot(f"s{seq}", meta, [row], {})

    snaps = [
        snap("r1", "b1", 0, 10 * s, 1, 4 * s),
        snap("r1", "b1", 0, 20 * s, 2, 9 * s),  # +5 s in (10, 20]
        snap("r2", "b1", 100 * s, 110 * s, 3, 2 * s),  # a new run: counts from its own start
        snap("r1", "b2", 0, 30 * s, 4, 1 * s),  # another boot with the same run id: not a continuation
    ]
    values, _ = heatviews.snapshot_values(snaps, ("running",), "pid")
    assert [iv for iv, _ in values] == [(0, 10 * s), (10 * s, 20 * s), (100 * s, 110 * s), (0, 30 * s)]
    assert [v.get(1) for _, v in values] == [4 * s, 5 * s, 2 * s, 1 * s]


def test_window_bounds_open_threads(monkeypatch):
    monkeypatch.setattr(hm, "MAX_OPEN", 3)
    w = hm.Window(10, 3)
    for tid in range(1, 7):
        w.feed(st(100 + tid, tid, "running", "sleeping", 1))
    w.prune()
    assert sorted(w.open) == [4, 5, 6]

"""Folded exits without BPF (snapshots/folds.py): the kernel's group rows
become growth of their --prom-by groups and the directory's fold rows; a
thread shown alive and folded since is not counted twice; nothing decreases."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import orjson
import pytest

from pstate.engines.stats import snapshot_stats
from pstate import lifecycle
from pstate.kernel import identity
from pstate.snapshots import folds, histograms, snapdir, writer

from conftest import TESTS

HERE = TESTS
sys.path.insert(0, str(HERE / "data" / "snap"))
import fake_snap  # noqa: E402


def group(folded: int, running: int, nvcsw: int, cgroup: int = 101, comm: str = "work") -> dict:
    row = {"cgroup": cgroup, "comm": comm, "folded": folded, "hist": None}
    row.update({f"{s}_ns": 0 for s in snapdir.STATE_FIELDS})
    row.update({c: 0 for c in snapdir.COUNT_FIELDS})
    row.update(running_ns=running, nvcsw=nvcsw)
    return row


class FoldCollector:
    """pid 1000 (fake1.service, cgroup 101) runs 100 ns by the first
    snapshot; then the kernel folds it (150 ns, 2 switches in all) with 4
    tasks never shown (10 ns, 1 switch each), then one more such task."""

    def __init__(self):
        self.k = 0

    def start(self) -> int:
        self.t0 = time.monotonic_ns()
        return self.t0

    def collect(self) -> writer.Sample:
        self.k += 1
        now = time.monotonic_ns()
        rows, groups = [], []
        if self.k == 1:
            rows.append(fake_snap.fake_row(1000, 1000, self.t0 + 1, now, comm="work", running_ns=100, nvcsw=1))
        elif self.k == 2:
            groups.append(group(5, 190, 6))
        else:
            groups.append(group(6, 200, 7))
        counts = {"gone_full": sum(g["folded"] for g in groups), "folded": sum(g["folded"] for g in groups)}
        return writer.Sample(ts=now, rows=rows, map_full=0, folds=groups, counts=counts)


def take(tmp_path, monkeypatch, fmt: str, clear: bool = False, source=None) -> Path:
    fake_snap.install(setter=monkeypatch.setattr)
    monkeypatch.setattr(identity.CgroupPaths, "path_of", lambda self, cgid: f"/system.slice/fake{cgid - 100}.service")
    d = writer.SnapDir(str(tmp_path / fmt))
    d.lock()
    plan = writer.Plan(fmt=fmt, interval_ns=10_000_000, count=3, prom_by="unit", clear=clear)
    base = {"type": "meta", "schema": 1, "source": "snap", "boot_id": "b", "host": "h"}
    proms = []
    snapper = writer.Snapper(d, source or FoldCollector(), plan, base, lifecycle.Stopper())
    if fmt == "prom":
        publish = snapper._publish

        def keep(*args):
            name = publish(*args)
            proms.append((tmp_path / fmt / snapdir.PROM_NAME).read_text())
            return name

        snapper._publish = keep
    try:
        assert snapper.run() == 0
    finally:
        d.close()
    return proms if fmt == "prom" else tmp_path / fmt


def value(text: str, series: str) -> float:
    (line,) = [x for x in text.splitlines() if x.startswith(series + " ")]
    return float(line.rsplit(" ", 1)[1])


def test_prom_groups_add_the_folded_growth_once_and_never_decrease(tmp_path, monkeypatch):
    texts = take(tmp_path, monkeypatch, "prom")
    run = [value(t, 'pstate_state_seconds_total{unit="fake1.service",state="running"}') for t in texts]
    # 100 ns shown alive, then its remaining 50 and the 4 others' 40, then 10 more
    assert [round(v * 1e9) for v in run] == [100, 190, 200]
    sw = [value(t, 'pstate_context_switches_total{unit="fake1.service",kind="voluntary"}') for t in texts[1:]]
    assert sw == [6, 7]
    assert [value(t, 'pstate_threads_folded_total{unit="fake1.service"}') for t in texts[1:]] == [5, 6]
    assert [value(t, "pstate_rows_folded_total") for t in texts] == [0, 5, 6]
    assert value(texts[-1], "pstate_tasks_exited_total") == 6


@pytest.mark.parametrize("clear", [False, True])
def test_fold_rows_and_stats_count_each_folded_thread_once(tmp_path, monkeypatch, clear):
    out = take(tmp_path, monkeypatch, "jsonl", clear)
    files = sorted(out.glob("pstate-snap-*.jsonl"))
    recs = [[orjson.loads(x) for x in f.read_bytes().splitlines()] for f in files]
    fold_rows = [[r for r in f if r["type"] == "fold"] for f in recs]
    assert [len(f) for f in fold_rows] == [0, 1, 1]
    r2, r3 = fold_rows[1][0], fold_rows[2][0]
    assert (r2["cgroup"], r2["cgroup_path"], r2["comm"]) == (101, "/system.slice/fake1.service", "work")
    want = [(5, 90, 5), (1, 10, 1)] if clear else [(5, 90, 5), (6, 100, 6)]
    assert [(r["folded"], r["running_ns"], r["nvcsw"]) for r in (r2, r3)] == want
    assert all(snapdir.check_fold(r) is None for r in (r2, r3))
    assert [f[-1]["folds"] for f in recs] == [0, 1, 1] and recs[1][-1]["folded"] == 5
    snaps = snapdir.load([str(out)])
    assert [len(s.folds) for s in snaps] == [0, 1, 1]
    ivs = snapdir.intervals(snaps)
    unit = [sum(t.values.get("running_ns", 0) for t in iv.tasks if t.cgroup_path == "/system.slice/fake1.service")
            for iv in ivs]
    assert unit == [100, 90, 10]  # 200 in all: the truth
    assert [sum(t.folded for t in iv.tasks) for iv in ivs] == [0, 5, 1]
    res = io.StringIO()
    assert snapshot_stats([str(out)], fmt="json", top=None, by="unit", out=res, err=io.StringIO()) == 0
    doc = orjson.loads(res.getvalue())
    assert [c["threads_gone"] for c in doc["churn"]["intervals"]] == [0, 5, 1]
    (g,) = [t for t in doc["trends"] if t["comm"] == "fake1.service"]
    assert g["running_ns"] == 200


def test_a_cursor_keeps_the_groups_read_and_the_totals():
    f = folds.Folds()
    paths = type("P", (), {"path_of": lambda self, cgid: "/x"})()
    f.step([group(2, 20, 2)], [], paths, 1, False)
    again = folds.Folds()
    again.restore(orjson.loads(orjson.dumps(f.state())))
    ((rec, growth, _h),) = again.step([group(3, 25, 3)], [], paths, 2, False)
    assert (growth["folded"], growth["running_ns"]) == (1, 5) and (rec["folded"], rec["running_ns"]) == (3, 25)
    # a thread shown alive before (its earlier 4 ns) and folded since: taken off, never below 0
    ((rec, growth, _h),) = again.step([group(4, 30, 4)], [{"running_ns": 4, "nvcsw": 9, "fold": [101, "work"]}],
                                      paths, 3, False)
    assert (growth["folded"], growth["running_ns"], growth["nvcsw"]) == (1, 1, 0)


def test_a_thread_folded_after_the_groups_were_read_is_taken_off_their_next_growth():
    """snap reads `folds` before the threads: a thread folded between the
    two reads is neither alive nor in its group at that snapshot; what it
    owes (the part its task rows showed) comes off its group's growth at the
    next one, which holds its final row, and a debt no final row paid (a
    fold the kernel lost) is dropped after that."""
    f = folds.Folds()
    paths = type("P", (), {"path_of": lambda self, cgid: "/x"})()
    n = histograms.NKINDS

    def grp(folded, running, nvcsw, buckets):
        g = group(folded, running, nvcsw)
        g["hist"] = (*[0] * n, *buckets)
        return g

    def step(g, vanished=()):
        ((rec, growth, hist),) = f.step([g], list(vanished), paths, 1, False)
        return growth["folded"], growth["running_ns"], growth["nvcsw"], hist[n:]

    assert step(grp(2, 20, 2, (1, 0))) == (2, 20, 2, (1, 0))
    shown = {"running_ns": 4, "nvcsw": 1, "hist": [*[0] * n, 0, 1], "fold": [101, "work"]}
    assert step(grp(2, 20, 2, (1, 0)), [shown]) == (0, 0, 0, (0, 0))  # its final row is not in the group yet
    assert f.owed == {(101, "work"): {"running_ns": 4, "nvcsw": 1, "hist": [*[0] * n, 0, 1]}}
    # its final row (10 ns, 2 switches, 2 waits) arrives: only what no task row showed is growth
    assert step(grp(3, 30, 4, (2, 1))) == (1, 6, 1, (1, 0))
    assert f.owed == {}
    # a thread that vanished and was never folded (the kernel lost its row): its debt eats one growth only
    assert step(grp(3, 30, 4, (2, 1)), [shown]) == (0, 0, 0, (0, 0))
    assert step(grp(4, 37, 5, (3, 1))) == (1, 3, 0, (1, 0))
    assert step(grp(5, 40, 6, (3, 2))) == (1, 3, 1, (0, 1))
    assert f.owed == {}
    # a debt to a group with no row yet (its first thread folded after `folds` was read) waits for it
    f.step([], [{"running_ns": 2, "fold": [7, "late"]}], paths, 1, False)
    assert f.owed == {(7, "late"): {"running_ns": 2}}
    ((_rec, growth, _h),) = f.step([group(1, 5, 1, cgroup=7, comm="late")], [], paths, 1, False)
    assert growth["running_ns"] == 3


class ExecCollector(FoldCollector):
    """pid 1000's leader (100 ns) and its thread 1001 (50 ns); then the
    thread execs: its row moves to tid 1000 (80 ns, the new program's comm)
    and the old leader's final row (120 ns) is freed; then 10 ns more."""

    def collect(self) -> writer.Sample:
        self.k += 1
        now = time.monotonic_ns()
        t0 = self.t0
        if self.k == 1:
            rows = [fake_snap.fake_row(1000, 1000, t0 + 1, now, comm="sh", running_ns=100),
                    fake_snap.fake_row(1000, 1001, t0 + 2, now, comm="sh", running_ns=50)]
        elif self.k == 2:
            rows = [fake_snap.fake_row(1000, 1000, t0 + 1, now, comm="sh", state="reaped", exited=True,
                                       exit_ts=now, running_ns=120),
                    fake_snap.fake_row(1000, 1000, t0 + 2, now, comm="prog", running_ns=80)]
        else:
            rows = [fake_snap.fake_row(1000, 1000, t0 + 2, now, comm="prog", running_ns=90)]
        return writer.Sample(ts=now, rows=rows, map_full=0, folds=[], counts={})


def test_a_thread_that_execs_and_takes_the_leaders_pid_goes_on_from_its_row(tmp_path, monkeypatch):
    """Its row moves to the leader's tid (the kernel gives it that pid): its
    growth is taken from its row under its former tid, not counted again
    from its birth, and it is no vanished thread of a folded group."""
    texts = take(tmp_path, monkeypatch, "prom", source=ExecCollector())
    run = [value(t, 'pstate_state_seconds_total{unit="fake1.service",state="running"}') for t in texts]
    assert [round(v * 1e9) for v in run] == [150, 200, 210]
    assert value(texts[-1], "pstate_tasks_started_total") == 2 and value(texts[-1], "pstate_tasks_exited_total") == 1
    out = take(tmp_path, monkeypatch, "jsonl", clear=True, source=ExecCollector())
    files = sorted(out.glob("pstate-snap-*.jsonl"))
    tasks = [[(r["tid"], r["comm"], r["running_ns"]) for r in map(orjson.loads, f.read_bytes().splitlines())
              if r["type"] == "task"] for f in files]
    assert tasks == [[(1000, "sh", 100), (1001, "sh", 50)], [(1000, "sh", 20), (1000, "prog", 30)],
                     [(1000, "prog", 10)]]


class SameTickExec(ExecCollector):
    """As ExecCollector, the thread seeded in its leader's clock tick: the
    same start_ts, so its row under the leader's pid is shown 1 ns later
    (taskmaps; the kernel moves the row's own start the same way)."""

    def collect(self) -> writer.Sample:
        s = super().collect()
        t0 = self.t0
        for r in s.rows:
            r["start_ts"] = t0 + 1 if r["comm"] == "sh" else t0 + 2  # (t0 + 2: t0 + 1, 1 ns later)
        return s


def test_a_thread_born_in_its_leaders_tick_that_execs_still_goes_on_from_its_row(tmp_path, monkeypatch):
    texts = take(tmp_path, monkeypatch, "prom", source=SameTickExec())
    run = [value(t, 'pstate_state_seconds_total{unit="fake1.service",state="running"}') for t in texts]
    assert [round(v * 1e9) for v in run] == [150, 200, 210]
    assert value(texts[-1], "pstate_tasks_started_total") == 2


def test_execs_moved_matches_one_row_of_the_same_birth_or_none():
    prev = {(1001, 5): {"pid": 1000, "running_ns": 1}, (1000, 5): {"pid": 1000, "running_ns": 2},
            (2001, 7): {"pid": 2000}, (2002, 7): {"pid": 2000}, (3001, 9): {"running_ns": 3}}
    rows = [{"pid": 1000, "tid": 1000, "start_ts": 6}, {"pid": 2000, "tid": 2000, "start_ts": 7},
            {"pid": 3000, "tid": 3000, "start_ts": 9}]
    here = {(r["tid"], r["start_ts"]) for r in rows} | {(1000, 5)}
    # 1001's row, 1 ns later; two candidates of pid 2000: neither; 3001's of a cursor without pids: none
    assert snapdir.execs_moved(prev, rows, here) == {(1000, 6): (1001, 5)}


def test_a_moved_row_shown_as_its_old_leader_is_shown_1ns_later_from_then_on():
    """Started from /proc, the thread and its leader show the same start (a
    clock tick) though the kernel's first-seen starts differ: the exec'd
    thread's row under the leader's tid is shown 1 ns later, for good."""
    from types import SimpleNamespace as NS
    from pstate.snapshots import taskmaps
    r = object.__new__(taskmaps.MapReader)
    r.slots, r.fields = ["unknown", "running"], ["unknown_ns", "running_ns"]
    r.run_start = r.seed_ts = 0
    r.seeded, r.later, r.tgids = set(), set(), {}
    r.start_fix = {111: 100, 222: 100}  # both seen before seeding, born in the same tick (/proc: 100)

    def row(start, flags, state=1):
        return NS(ns=[0, 5], state=state, flags=flags, since=0, start_ts=start, tgid=1000, comm=b"x",
                  exit_ts=0, nvcsw=0, nivcsw=0, wakeups=0)

    old = row(111, taskmaps.F_GUESSED | taskmaps._D["SNAP_F_FREED"])
    moved = row(222, taskmaps.F_GUESSED)
    raw = [(1000, old), (1000, moved)]
    rows = [r._row(t, v, 10) for t, v in raw]
    assert [x["start_ts"] for x in rows] == [100, 100]
    r._apart(rows, raw, 10)
    assert [(x["state"], x["start_ts"]) for x in rows] == [("reaped", 100), ("running", 101)]
    assert r._row(1000, moved, 20)["start_ts"] == 101  # and at the next snapshot, the old leader gone


def test_a_debt_of_unknown_time_is_not_carried():
    """A seeded thread's shown rows hold the time before its seeding
    (unknown_ns), which its folded final row lacks: that part of what it
    owes is taken off one growth only, never carried to other threads'."""
    f = folds.Folds()
    paths = type("P", (), {"path_of": lambda self, cgid: "/x"})()
    g = group(1, 10, 1)
    f.step([g], [], paths, 1, False)
    f.step([g], [{"running_ns": 4, "unknown_ns": 7, "fold": [101, "work"]}], paths, 2, False)
    assert f.owed == {(101, "work"): {"running_ns": 4}}
    g2 = group(2, 20, 2)
    g2["unknown_ns"] = 5  # another seeded thread's, folded
    ((_rec, growth, _h),) = f.step([g2], [], paths, 3, False)
    assert (growth["running_ns"], growth["unknown_ns"]) == (6, 5)

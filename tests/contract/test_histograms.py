"""The latency histograms of snapshots without BPF: the bucket layout, the
per-group sums (hist rows, Prometheus histograms), and the latency trends
of `pstate stats DIR/`. The kernel side is tested in test_snap_bpf.py."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from pstate.engines.stats import snapshot_stats
from pstate import lifecycle
from pstate.analysis.latency import LogHist, bounded_percentile
from pstate.snapshots import histograms, snapdir, writer

from conftest import TESTS

HERE = TESTS
sys.path.insert(0, str(HERE / "data" / "snap"))
import fake_snap  # noqa: E402
from test_snap_writer import _promtool  # noqa: E402

NB, NK = histograms.NBUCKETS, histograms.NKINDS
S = 1_000_000_000


def test_bucket_bounds_are_fixed_and_le_exact():
    assert histograms.UPPER_NS[0] == 1024 and histograms.UPPER_NS[-2] == 1 << 34
    assert histograms.UPPER_NS[-1] is None and len(histograms.UPPER_NS) == NB
    for b, le in enumerate(histograms.UPPER_NS[:-1]):
        assert histograms.bucket_of(le) == b  # le: at most the bound
        assert histograms.bucket_of(le + 1) == b + 1
    assert histograms.bucket_of(1) == 0 and histograms.bucket_of(10**15) == NB - 1
    assert histograms.KINDS == ("runq_wakeup", "runq_preempted", "sleeping", "uninterruptible")
    assert histograms.bucket_fields()[:2] == ["le_1024", "le_2048"] and histograms.bucket_fields()[-1] == "le_inf"


def test_one_percentile_formula():
    counts = [0] * NB
    counts[2] = 98  # (2048, 4096]
    counts[12] = 2  # (2^21, 2^22]
    assert bounded_percentile(counts, histograms.UPPER_NS, 50) == 3072
    assert bounded_percentile(counts, histograms.UPPER_NS, 98) == 3072
    assert bounded_percentile(counts, histograms.UPPER_NS, 99) == (1 << 21) + (1 << 20)
    counts[-1] = 100
    assert bounded_percentile(counts, histograms.UPPER_NS, 99) == 1 << 34  # the open bucket: its lower bound
    assert bounded_percentile([0] * NB, histograms.UPPER_NS, 50) is None
    h = LogHist()  # the same nearest rank as LogHist's
    for v in [1] * 98 + [5] * 2:
        h.add(v)
    assert h.percentile(98) == 1 and h.percentile(99) == 5


def hist(**by_kind) -> tuple:
    """A row's histograms: kind=[(bucket, count), ...]; sums at the buckets' bounds."""
    sums, counts = [0] * NK, [0] * (NK * NB)
    for kind, pairs in by_kind.items():
        k = histograms.KINDS.index(kind)
        for b, n in pairs:
            counts[k * NB + b] += n
            sums[k] += n * histograms.UPPER_NS[b]
    return (*sums, *counts)


def add(a: tuple, b: tuple) -> tuple:
    return tuple(x + y for x, y in zip(a, b))


class HistCollector:
    """Two processes of two services; at every snapshot pid 1000 waits 100
    times for 3 us, and from the third on also 5 times for 3 ms (a hog
    joined); pid 1001's thread 1002 exits after the second snapshot."""

    def __init__(self):
        self.k = 0
        self.h = {1000: hist(), 1001: hist(), 1002: hist()}

    def start(self) -> int:
        self.t0 = time.monotonic_ns()
        return self.t0

    def collect(self) -> writer.Sample:
        self.k += 1
        now = time.monotonic_ns()
        slow = [(11, 5)] if self.k >= 3 else []
        self.h[1000] = add(self.h[1000], hist(runq_wakeup=[(2, 100), *slow], uninterruptible=[(14, 1)]))
        self.h[1001] = add(self.h[1001], hist(runq_preempted=[(4, 7)]))
        rows = [dict(fake_snap.fake_row(1000, 1000, 5, now, running_ns=now - self.t0), hist=self.h[1000]),
                dict(fake_snap.fake_row(1001, 1001, 5, now), hist=self.h[1001])]
        if self.k <= 3:
            if self.k <= 2:
                self.h[1002] = add(self.h[1002], hist(runq_preempted=[(4, 3)]))
            gone = self.k == 3
            rows.append(dict(fake_snap.fake_row(1001, 1002, 6, now, state="reaped" if gone else "running",
                                                exited=gone, exit_ts=now if gone else None), hist=self.h[1002]))
        return writer.Sample(ts=now, rows=rows, map_full=0)


def take(tmp_path, monkeypatch, fmt: str, count: int = 5, by: str = "unit", clear: bool = False) -> Path:
    fake_snap.install(setter=monkeypatch.setattr)  # who the fake processes are
    d = writer.SnapDir(str(tmp_path / fmt))
    d.lock()
    plan = writer.Plan(fmt=fmt, interval_ns=S // 50, count=count, prom_by=by, clear=clear)
    base = {"type": "meta", "schema": 1, "source": "snap", "boot_id": "b", "host": "h"}
    try:
        assert writer.Snapper(d, HistCollector(), plan, base, lifecycle.Stopper()).run() == 0
    finally:
        d.close()
    return tmp_path / fmt


def test_hist_rows_per_group_and_kind_never_decrease(tmp_path, monkeypatch):
    out = take(tmp_path, monkeypatch, "jsonl")
    files = sorted(out.glob("pstate-snap-*.jsonl"))
    assert len(files) == 5
    seen = {}
    for f in files:
        recs = [orjson.loads(x) for x in f.read_bytes().splitlines()]
        rows = [r for r in recs if r["type"] == "hist"]
        assert recs[-1]["hists"] == len(rows) and recs[-1]["tasks"] == sum(r["type"] == "task" for r in recs)
        assert all("hist" not in r for r in recs if r["type"] == "task")
        for r in rows:
            assert set(r) == {"type", "ts", "by", "unit", "kind", "count", "sum_ns", *histograms.bucket_fields()}
            assert r["count"] == r["le_inf"] and snapdir.check_hist(r) is None
            key = (r["unit"], r["kind"])
            assert r["count"] >= seen.get(key, 0)  # the exited thread's waits stay in its group
            seen[key] = r["count"]
    # pid 1000 is fake1.service (fake_process: pid % 3), pid 1001 fake2.service
    assert seen[("fake1.service", "runq_wakeup")] == 5 * 100 + 3 * 5
    assert seen[("fake2.service", "runq_preempted")] == 5 * 7 + 2 * 3
    snap = snapdir.read_snapshot(str(files[-1]))
    assert len(snap.hists) == 3 and len(snap.rows) == 2


@pytest.mark.parametrize("clear", [False, True])
def test_stats_shows_p99_rising_when_a_hog_joins(tmp_path, monkeypatch, clear):
    """Cumulative hist rows are subtracted per run; --clear ones hold their
    own interval: the same trends either way."""
    out = take(tmp_path, monkeypatch, "jsonl", clear=clear)
    last = [orjson.loads(x) for x in sorted(out.glob("pstate-snap-*.jsonl"))[-1].read_bytes().splitlines()]
    wake = next(r for r in last if r["type"] == "hist" and r["kind"] == "runq_wakeup")
    assert wake["count"] == (105 if clear else 515)
    buf = io.StringIO()
    assert snapshot_stats([str(out)], fmt="json", top=None, by="unit", out=buf, err=io.StringIO()) == 0
    lat = orjson.loads(buf.getvalue())["latency"]
    e = next(x for x in lat if x["group"] == "fake1.service" and x["kind"] == "runq_wakeup")
    assert [p["count"] for p in e["series"]] == [100, 100, 105, 105, 105]
    assert [p["p99_ns"] for p in e["series"]] == [3072] * 2 + [(1 << 20) + (1 << 19)] * 3
    assert {p["p50_ns"] for p in e["series"]} == {3072}
    gone = next(x for x in lat if x["group"] == "fake2.service" and x["kind"] == "runq_preempted")
    assert [p["count"] for p in gone["series"]] == [10, 10, 7, 7, 7]  # per interval: deltas of the group
    buf = io.StringIO()
    snapshot_stats([str(out)], fmt="table", top=None, by="unit", out=buf, err=io.StringIO())
    text = buf.getvalue()
    assert "Latency per interval" in text
    line = next(x for x in text.splitlines() if x.startswith("fake1.service") and "runq wake-up" in x)
    assert "3.07us>3.07us" in line and "3.07us>1.57ms" in line, line
    buf = io.StringIO()
    snapshot_stats([str(out)], fmt="csv", top=None, by="unit", out=buf, err=io.StringIO())
    assert "# latency\nby,group,kind,interval,end_ts,wall_end_ns,count,sum_ns,p50_ns,p99_ns\n" in buf.getvalue()


def test_prom_histograms_pass_promtool_and_only_grow(tmp_path, monkeypatch):
    out = take(tmp_path, monkeypatch, "prom", count=4)
    text = (out / snapdir.PROM_NAME).read_text()
    r = subprocess.run([_promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = dict(x.rsplit(" ", 1) for x in text.splitlines() if x and not x.startswith("#"))
    wake = 'pstate_runqueue_wait_seconds_count{unit="fake1.service",after="wakeup"}'
    assert lines[wake] == str(4 * 100 + 2 * 5)
    assert lines['pstate_runqueue_wait_seconds_bucket{unit="fake1.service",after="wakeup",le="4.096e-06"}'] == "400"
    assert lines['pstate_runqueue_wait_seconds_bucket{unit="fake1.service",after="wakeup",le="+Inf"}'] == "410"
    assert lines['pstate_runqueue_wait_seconds_count{unit="fake2.service",after="preemption"}'] == str(4 * 7 + 2 * 3)
    assert lines['pstate_blocked_seconds_count{unit="fake1.service",state="D"}'] == "4"
    assert float(lines['pstate_blocked_seconds_sum{unit="fake1.service",state="D"}']) == pytest.approx(4 * 2**24 / 1e9)


def test_prom_per_pid_series_end_with_their_process():
    prom = writer.PromExport("pid")
    row = dict(fake_snap.fake_row(5, 5, 0, 0, comm="a"))
    prom.update([row], [snapdir.subtract(row, None)], [True], 0, [hist(sleeping=[(9, 2)])])
    assert "pstate_blocked_seconds_count{pid=\"5\",comm=\"a\",state=\"S\"} 2" in prom.render(_meta()).decode()
    prom.update([], [], [], 0, [])
    assert "pstate_blocked_seconds_count" not in prom.render(_meta()).decode()


def test_counts_wrap_modulo_2_32():
    a, b = hist(sleeping=[(3, 5)]), list(hist(sleeping=[(3, 2**32 - 2)]))
    assert histograms.delta(a, tuple(b))[NK + 2 * NB + 3] == 7


def _meta() -> dict:
    return {"wall_end_ns": S, "interval_end_ts": 2 * S, "interval_start_ts": S, "truncated": False, "map_full": 0}

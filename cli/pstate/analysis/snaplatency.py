"""Latency trends across snapshots (`pstate stats DIR/`): the kernel's
histograms (the "hist" rows of snapshots/histograms.py) per interval.

A cumulative snapshot's hist row counts since its run began; its interval's
histogram is its difference from the previous snapshot of the same run
(the first of a run, or a --clear snapshot, already covers its interval),
as snapdir.intervals() does for task rows. Per group and kind each interval
gets a count, a sum and percentiles, by the one nearest-rank formula of
analysis/latency.py applied to the log2 buckets.
"""

from __future__ import annotations

from pstate.analysis.latency import bounded_percentile
from pstate.snapshots import histograms, snapdir

PERCENTILES = (50, 99)
_NOT_GROUP = frozenset(("type", "ts", "by", "kind", "count", "sum_ns", *histograms.bucket_fields()))


def group_of(rec: dict) -> tuple[str, str]:
    """(by, the group's name: its label values joined by spaces)."""
    names = histograms.LABELS.get(rec["by"]) or sorted(k for k in rec if k not in _NOT_GROUP)
    return rec["by"], " ".join(str(rec.get(n, "")) for n in names)


def series(snaps: list[snapdir.Snapshot]) -> list[dict]:
    """One entry per (group, kind) with a point per interval it had counts in."""
    last: dict[tuple, dict] = {}  # (boot, run) -> {(by, group, kind): counts, sum} of the run's last snapshot
    out: dict[tuple, dict] = {}
    for i, snap in enumerate(snaps):
        run = (snap.boot_id, snap.run_id)
        prev = last.get(run) if snap.mode == "cumulative" else None
        now = {}
        for rec in snap.hists:
            by, group = group_of(rec)
            key = (by, group, rec["kind"])
            counts = histograms.counts_of(rec)
            now[key] = (counts, rec["sum_ns"])
            if prev is not None and key in prev:
                pc, ps = prev[key]
                counts, total = [max(0, a - b) for a, b in zip(counts, pc)], max(0, rec["sum_ns"] - ps)
            else:
                total = rec["sum_ns"]
            n = sum(counts)
            if not n:
                continue
            entry = out.setdefault(key, {"by": by, "group": group, "kind": rec["kind"], "series": []})
            point = {"interval": i, "end_ts": snap.end_ts, "wall_end_ns": snap.wall_end_ns, "count": n,
                     "sum_ns": total}
            for p in PERCENTILES:
                point[f"p{p}_ns"] = bounded_percentile(counts, histograms.UPPER_NS, p)
            entry["series"].append(point)
        if snap.mode == "cumulative":
            last[run] = now
    order = {k: i for i, k in enumerate(histograms.KINDS)}
    res = list(out.values())
    for e in res:
        e["count"] = sum(p["count"] for p in e["series"])
        e["p99_max_ns"] = max(p["p99_ns"] for p in e["series"])
    res.sort(key=lambda e: (order[e["kind"]], -e["count"], e["group"]))
    return res


def top_of(entries: list[dict], top: int) -> list[dict]:
    """The first top entries of each kind (series() ranks them by count)."""
    shown: dict[str, int] = {}
    out = []
    for e in entries:
        shown[e["kind"]] = shown.get(e["kind"], 0) + 1
        if shown[e["kind"]] <= top:
            out.append(e)
    return out

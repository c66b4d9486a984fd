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

from typing import IO

from pstate.analysis.latency import bounded_percentile
from pstate.snapshots import histograms, snapdir
from pstate.stream import vocab
from pstate.stream.durations import fmt_ns

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


KIND_WORDS = {k.hist_name: k.series_label for k in vocab.WAIT_KINDS if k.kernel}  # (stream.vocab's table)


def top_of(entries: list[dict], top: int) -> list[dict]:
    """The first top entries of each kind (series() ranks them by count)."""
    shown: dict[str, int] = {}
    out = []
    for e in entries:
        shown[e["kind"]] = shown.get(e["kind"], 0) + 1
        if shown[e["kind"]] <= top:
            out.append(e)
    return out


def render_table(entries: list[dict], out: IO[str], top: int, spark) -> None:
    """Per kind, the top groups by count: p50 and p99 of the first and the
    last interval, and the p99 of each interval as a sparkline."""
    out.write("Latency per interval, from the kernel's log2 buckets (each value: its bucket's middle)\n")
    rows = []
    for e in top_of(entries, top):
        s = e["series"]
        rows.append([e["group"][:30], KIND_WORDS[e["kind"]], e["count"],
                     f"{fmt_ns(s[0]['p50_ns'])}>{fmt_ns(s[-1]['p50_ns'])}",
                     f"{fmt_ns(s[0]['p99_ns'])}>{fmt_ns(s[-1]['p99_ns'])}",
                     spark([p["p99_ns"] for p in s])])
    by = entries[0]["by"]
    cells = [[by.upper(), "WAIT", "COUNT", "P50 FIRST>LAST", "P99 FIRST>LAST", "P99 EACH"], *rows]
    widths = [max(len(str(r[i])) for r in cells) for i in range(6)]
    for r in cells:
        out.write("  ".join(str(c).rjust(w) if i == 2 else str(c).ljust(w)
                            for i, (c, w) in enumerate(zip(r, widths))).rstrip() + "\n")


CSV_COLUMNS = ["by", "group", "kind", "interval", "end_ts", "wall_end_ns", "count", "sum_ns",
               *(f"p{p}_ns" for p in PERCENTILES)]


def csv_rows(entries: list[dict]):
    for e in entries:
        for p in e["series"]:
            yield [e["by"], e["group"], e["kind"], *(p[c] for c in CSV_COLUMNS[3:])]

"""Latency distributions in bounded memory: log-linear histograms, percentiles
and log2 histogram rendering.

A LogHist keeps counts in log-linear buckets (HDR-style): values below 64 ns
are exact; above, every power-of-two octave is split into 32 equal
sub-buckets, so a bucket's width is at most 1/32 of its lower bound. At most
~1,900 buckets cover 0..2^64 ns whatever the number of samples; in practice a
distribution touches a few hundred. A bucket is a dict entry holding a count.
Percentiles report the midpoint of the bucket that holds the requested rank
(relative error at most 1/64, about 1.6%), kept within the exact minimum and
maximum, which are tracked apart like the count and the sum; the first and
the last rank are those exact values (so a percentile of one or two samples
is exact).
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import Iterable

from pstate.stream.vocab import log2_floor, log2_floor_lower

SUB_BITS = 5  # 32 sub-buckets per octave
_SUB = 1 << SUB_BITS
_LOW = _SUB << 1  # values below this are their own bucket (exact)

PERCENTILES = (50, 90, 99)


def bucket_index(v: int) -> int:
    """Bucket of a non-negative integer value (ns)."""
    s = v.bit_length() - (SUB_BITS + 1)
    if s <= 0:
        return v
    return (s << SUB_BITS) + (v >> s)


def bucket_bounds(idx: int) -> tuple[int, int]:
    """[lo, hi) of the values that fall in bucket idx."""
    if idx < _LOW:
        return idx, idx + 1
    s = (idx >> SUB_BITS) - 1
    lo = (idx - (s << SUB_BITS)) << s
    return lo, lo + (1 << s)


def bucket_mid(idx: int) -> int:
    lo, hi = bucket_bounds(idx)
    return lo + (hi - 1 - lo) // 2


def nearest_rank(count: int, p: float) -> int:
    """The rank of percentile p (0 < p <= 100) among count values: ceil(count * p / 100)."""
    return max(1, -(-count * p // 100))


def rank_bucket(items, rank: int):
    """The bucket of (bucket, count) items, in ascending order, that holds
    the value of that rank; None when there are fewer values."""
    seen = 0
    for idx, n in items:
        seen += n
        if seen >= rank:
            return idx
    return None


def bounded_percentile(counts: list[int], upper: tuple, p: float) -> int | None:
    """Nearest-rank percentile p of values counted in buckets with the given
    upper bounds (a value v in bucket b: upper[b-1] < v <= upper[b]; None
    for an open last bucket), as LogHist does: the midpoint of the bucket
    that holds the rank, or the lower bound of an open one. For the kernel's
    log2 buckets (snapshots/histograms.py), whose min and max are not known."""
    total = sum(counts)
    if not total:
        return None
    b = rank_bucket(enumerate(counts), nearest_rank(total, p))
    lo = upper[b - 1] if b else 0
    hi = upper[b]
    return lo if hi is None else lo + (hi - lo) // 2


class LogHist:
    """Counts of values (ns) in log-linear buckets, with exact count, sum,
    min and max."""

    __slots__ = ("buckets", "count", "total", "min", "max")

    def __init__(self):
        self.buckets: dict[int, int] = {}  # bucket -> count
        self.count = 0
        self.total = 0
        self.min: int | None = None
        self.max: int | None = None

    def add(self, v: int, n: int = 1) -> None:
        idx = bucket_index(v)
        self.buckets[idx] = self.buckets.get(idx, 0) + n
        self.count += n
        self.total += v * n
        if self.max is None or v > self.max:
            self.max = v
        if self.min is None or v < self.min:
            self.min = v

    def add_counts(self, buckets: dict, count: int, total: int, vmin: int, vmax: int) -> None:
        """Add {bucket: count} of count values summing to total, from vmin to vmax."""
        if not count:
            return
        b = self.buckets
        if not b:
            self.buckets = dict(buckets)  # (most groups have one task: one copy, not a loop)
        else:
            for idx, n in buckets.items():
                b[idx] = b.get(idx, 0) + n
        self.count += count
        self.total += total
        if self.max is None or vmax > self.max:
            self.max = vmax
        if self.min is None or vmin < self.min:
            self.min = vmin

    def merge(self, other: "LogHist") -> None:
        self.add_counts(other.buckets, other.count, other.total, other.min, other.max)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    def percentile(self, p: float) -> int | None:
        """Nearest-rank percentile p (0 < p <= 100): the midpoint of the
        bucket that holds that rank, within the exact min and max."""
        return self.percentiles((p,))[0]

    def percentiles(self, ps: Iterable[float]) -> list:
        """percentile(p) of each p, the buckets sorted once."""
        count = self.count
        if not count:
            return [None for _ in ps]
        keys = seen = None
        out = []
        for p in ps:
            rank = nearest_rank(count, p)
            if rank >= count:
                out.append(self.max)
            elif rank == 1:
                out.append(self.min)
            else:
                if keys is None:  # (rank_bucket's walk, done once: the running counts, then a search per rank)
                    keys = sorted(self.buckets)
                    seen = list(accumulate(map(self.buckets.__getitem__, keys)))
                i = bisect_left(seen, rank)
                out.append(self.max if i == len(keys) else min(max(bucket_mid(keys[i]), self.min), self.max))
        return out

    def summary(self, percentiles: Iterable[int] = PERCENTILES) -> dict:
        out = {"count": self.count}
        percentiles = tuple(percentiles)
        for p, v in zip(percentiles, self.percentiles(percentiles)):
            out[f"p{p}_ns"] = v
        out["max_ns"] = self.max
        out["mean_ns"] = round(self.total / self.count) if self.count else None
        return out

    def log2_buckets(self, unit_ns: int = 1000) -> list[tuple[int, int, int]]:
        """(lo, hi, count) rows in whole units of unit_ns, powers of two like
        BCC's runqlat: 0-1, 2-3, 4-7, ... Each log-linear bucket goes where
        its midpoint goes, so row edges are exact to within 1/64."""
        if not self.count:
            return []
        by_slot: dict[int, int] = {}
        for idx, n in self.buckets.items():
            # slot k (stream.vocab's log2 floor convention) holds [2^(k-1), 2^k - 1]; slot 1 also holds 0.
            slot = max(1, log2_floor(min(max(bucket_mid(idx), self.min), self.max) // unit_ns))
            by_slot[slot] = by_slot.get(slot, 0) + n
        first = min(by_slot)
        return [(0 if k == 1 else log2_floor_lower(k), log2_floor_lower(k + 1) - 1, by_slot.get(k, 0))
                for k in range(first, max(by_slot) + 1)]

    def to_dict(self) -> dict:
        return {"buckets": {str(k): v for k, v in sorted(self.buckets.items())},
                "count": self.count, "total": self.total, "min": self.min, "max": self.max}


# msecs rows only when the median is this long: its row (16 -> 31 msecs) and
# the rows around it stay apart, so the bulk of a distribution never
# collapses into "0 -> 1 msecs" because of one long outlier.
MSECS_MEDIAN_NS = 16_000_000


def pick_unit(hist: LogHist) -> tuple[str, int]:
    """usecs, or msecs (like runqlat -m, so rows stay short) when the
    largest value is 100 ms or more and the median 16 ms or more."""
    if hist.max is not None and hist.max >= 100_000_000 and (hist.percentile(50) or 0) >= MSECS_MEDIAN_NS:
        return "msecs", 1_000_000
    return "usecs", 1_000


def render_log2(hist: LogHist, unit: tuple[str, int] | None = None, width: int = 30) -> list[str]:
    """A BCC-style ASCII log2 histogram."""
    name, unit_ns = unit or pick_unit(hist)
    return render_log2_rows(hist.log2_buckets(unit_ns), name, width)


def render_log2_rows(rows: list, unit_name: str, width: int = 30) -> list[str]:
    """Render (lo, hi, count) rows; at most 80 columns for counts below 10^9."""
    if not rows:
        return []
    peak = max(n for _lo, _hi, n in rows) or 1
    lo_w = max(len(str(lo)) for lo, _hi, _n in rows)
    hi_w = max(len(str(hi)) for _lo, hi, _n in rows)
    span_w = max(lo_w + hi_w + 4, len(unit_name))
    n_w = max(5, max(len(str(n)) for _lo, _hi, n in rows))
    out = [f"{unit_name:>{span_w}} : {'count':<{n_w}} distribution"]
    for lo, hi, n in rows:
        stars = int(round(n * width / peak))
        span = f"{lo:>{lo_w}} -> {hi:<{hi_w}}"
        out.append(f"{span:>{span_w}} : {n:<{n_w}} |{'*' * stars:<{width}}|")
    return out

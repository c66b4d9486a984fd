"""Log-linear histograms: buckets, percentiles, merging, log2 rendering."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from pstate.analysis.latency import LogHist, bucket_bounds, bucket_index, bucket_mid, render_log2

values = st.integers(min_value=0, max_value=(1 << 64) - 1)


@given(values)
def test_value_lies_in_its_bucket(v):
    lo, hi = bucket_bounds(bucket_index(v))
    assert lo <= v < hi


@given(values)
def test_bucket_width_at_most_a_32nd(v):
    lo, hi = bucket_bounds(bucket_index(v))
    assert hi - lo == 1 if v < 64 else (hi - lo) * 32 <= lo


@given(values, values)
def test_buckets_are_monotonic(a, b):
    if a <= b:
        assert bucket_index(a) <= bucket_index(b)


def test_buckets_are_contiguous():
    # Every bucket starts where the previous one ended.
    for idx in range(bucket_index((1 << 64) - 1)):
        assert bucket_bounds(idx)[1] == bucket_bounds(idx + 1)[0]
    assert bucket_index((1 << 64) - 1) < 1920


def test_small_values_are_exact():
    assert [bucket_index(v) for v in range(64)] == list(range(64))
    assert bucket_bounds(bucket_index(64)) == (64, 66)
    assert bucket_mid(bucket_index(1000)) in range(992, 1008)


def nearest_rank(sorted_vals, p):
    return sorted_vals[max(1, math.ceil(len(sorted_vals) * p / 100)) - 1]


@settings(max_examples=200)
@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=1, max_size=300),
       st.sampled_from([1, 50, 90, 99, 99.9]))
def test_percentile_within_half_a_bucket(vals, p):
    h = LogHist()
    for v in vals:
        h.add(v)
    exact = nearest_rank(sorted(vals), p)
    got = h.percentile(p)
    lo, hi = bucket_bounds(bucket_index(exact))
    assert lo <= got < hi and min(vals) <= got <= max(vals)  # the exact value's bucket, within min..max
    assert abs(got - exact) * 64 <= max(exact, 64)


def test_first_and_last_rank_are_exact():
    h = LogHist()
    h.add(100_000)
    assert [h.percentile(p) for p in (1, 50, 99, 100)] == [100_000] * 4
    h.add(30_001)
    assert [h.percentile(p) for p in (50, 99)] == [30_001, 100_000]


def test_summary_counts_and_exact_max():
    h = LogHist()
    for v in [50_000, 20_000, 100_000, 500_000]:
        h.add(v)
    assert h.summary() == {"count": 4, "p50_ns": bucket_mid(bucket_index(50_000)), "p90_ns": 500_000,
                           "p99_ns": 500_000, "max_ns": 500_000, "mean_ns": 167_500}
    assert abs(h.percentile(50) - 50_000) <= 50_000 / 64
    assert LogHist().summary() == {"count": 0, "p50_ns": None, "p90_ns": None, "p99_ns": None,
                                   "max_ns": None, "mean_ns": None}


def test_percentile_of_many_values():
    h = LogHist()
    for v in range(1, 100_001):
        h.add(v * 1000)  # 1us .. 100ms
    p50 = h.percentile(50)
    assert abs(p50 - 50_000_000) <= 50_000_000 / 32
    assert h.percentile(100) == h.max == 100_000_000
    assert h.count == 100_000


@given(st.lists(values, max_size=50), st.lists(values, max_size=50))
def test_merge_equals_adding_everything(a, b):
    ha, hb, hall = LogHist(), LogHist(), LogHist()
    for v in a:
        ha.add(v)
        hall.add(v)
    for v in b:
        hb.add(v)
        hall.add(v)
    ha.merge(hb)
    assert ha.to_dict() == hall.to_dict()
    assert [ha.percentile(p) for p in (50, 99)] == [hall.percentile(p) for p in (50, 99)]


def test_memory_is_bounded_by_buckets_not_samples():
    h = LogHist()
    for v in range(0, 10**9, 997):
        h.add(v)
    assert h.count > 1_000_000
    assert len(h.buckets) < 1000


def test_log2_buckets_like_runqlat():
    h = LogHist()
    for us, n in ((0, 3), (1, 2), (3, 4), (5, 1), (100, 7)):
        for _ in range(n):
            h.add(us * 1000 + 10)
    rows = h.log2_buckets(1000)
    assert rows == [(0, 1, 5), (2, 3, 4), (4, 7, 1), (8, 15, 0), (16, 31, 0), (32, 63, 0), (64, 127, 7)]
    assert sum(n for _lo, _hi, n in rows) == h.count


def test_render_log2():
    h = LogHist()
    for ns in (1500, 2100, 2500, 3500, 700_000):
        h.add(ns)
    lines = render_log2(h)
    assert lines == [
        "      usecs : count distribution",
        "  0 -> 1    : 1     |**********                    |",
        "  2 -> 3    : 3     |******************************|",
        "  4 -> 7    : 0     |                              |",
        "  8 -> 15   : 0     |                              |",
        " 16 -> 31   : 0     |                              |",
        " 32 -> 63   : 0     |                              |",
        " 64 -> 127  : 0     |                              |",
        "128 -> 255  : 0     |                              |",
        "256 -> 511  : 0     |                              |",
        "512 -> 1023 : 1     |**********                    |",
    ]
    assert all(len(x) <= 80 for x in lines)
    assert render_log2(LogHist()) == []


def test_the_native_reader_uses_the_same_buckets():
    """One bucket formula: _digest.c takes its sub-bucket bits from one
    define, exported so that this test holds it to latency.SUB_BITS; the
    Aggregator's inlined copy is checked by the stats tests (native == pure)."""
    import pytest

    from pstate import native
    from pstate.analysis import latency

    mod = native.load("_digest")
    if mod is None:
        pytest.skip("pstate._digest not built or PSTATE_PURE set")
    assert mod.BUCKET_SUB_BITS == latency.SUB_BITS

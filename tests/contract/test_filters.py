"""Filter.match: the rules record's BPF side applies, in Python (replay, heat)."""

from __future__ import annotations

import pytest

from pstate.stream.filters import Filter

MS = 1_000_000


def state(**kw):
    r = {"type": "state", "ts": 1, "cpu": 1, "pid": 10, "tid": 11, "comm": "worker", "from": "running",
         "to": "sleeping", "dur_ns": 5 * MS, "cause": "switch_out"}
    r.update(kw)
    return r


def fork(**kw):
    r = {"type": "fork", "ts": 1, "cpu": 1, "pid": 10, "tid": 11, "comm": "worker", "child_pid": 12,
         "child_tid": 12, "thread": False}
    r.update(kw)
    return r


def test_default_filter_passes_everything_but_idle():
    f = Filter()
    assert not f.active
    assert f.match(state()) and f.match(fork())
    assert not f.match(state(tid=0, pid=0, comm="swapper/0"))
    assert not f.match(fork(tid=0))
    assert Filter(include_idle=True).match(state(tid=0, pid=0))


@pytest.mark.parametrize("rec", [
    {"type": "meta", "schema": 1}, {"type": "loss", "reason": "ringbuf_full", "count": 1},
    {"type": "end", "reason": "eof"}, {"type": "rate", "sample_every": 2}, {"type": "future"},
])
def test_non_events_always_pass(rec):
    f = Filter(pids=(1,), tids=(2,), comms=("x",), states=("stopped",), cpus=(3,), min_dur_ns=10**12)
    assert f.match(rec)


@pytest.mark.parametrize("make", [state, fork])
def test_task_filters_apply_to_every_event(make):
    assert Filter(pids=(10, 99)).match(make()) and not Filter(pids=(99,)).match(make())
    assert Filter(tids=(11,)).match(make()) and not Filter(tids=(10,)).match(make())
    assert Filter(comms=("worker",)).match(make()) and not Filter(comms=("work",)).match(make())
    assert Filter(cpus=(0, 1)).match(make()) and not Filter(cpus=(0,)).match(make())
    # several filters: all must match
    assert Filter(pids=(10,), cpus=(1,)).match(make()) and not Filter(pids=(10,), cpus=(2,)).match(make())


def test_comm_filter_compares_the_kernels_15_bytes():
    long = "a-very-long-thread-name"
    assert Filter(comms=(long,)).match(state(comm=long[:15]))


def test_state_filter_matches_from_or_to_on_state_records_only():
    f = Filter(states=("uninterruptible",))
    assert f.match(state(to="uninterruptible"))
    assert f.match(state(**{"from": "uninterruptible", "to": "runnable"}))
    assert not f.match(state())
    assert f.match(fork())  # lifecycle events pass


def test_min_dur_on_state_records_only():
    f = Filter(min_dur_ns=5 * MS)
    assert f.match(state(dur_ns=5 * MS)) and not f.match(state(dur_ns=5 * MS - 1))
    assert not f.match(state(dur_ns=None))  # an unknown duration is not "at least"
    assert f.match(fork())


def test_meta_fields():
    assert Filter().meta_fields() == {"include_idle": False}
    f = Filter(pids=(1, 2), tids=(3,), comms=("a",), states=("stopped",), cpus=(0,), min_dur_ns=7,
               include_idle=True)
    assert f.active
    assert f.meta_fields() == {"filter_pid": [1, 2], "filter_tid": [3], "filter_comm": ["a"],
                               "filter_state": ["stopped"], "filter_cpu": [0], "filter_min_dur_ns": 7,
                               "include_idle": True}

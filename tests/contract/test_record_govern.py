"""record --max-rate: the governor decides from the kernel's event count, not
from what the consumer managed to write."""

from __future__ import annotations

import pytest

from pstate.kernel import loader
from pstate.engines import record


class FakeTable:
    def __init__(self):
        self.values = {}

    def __setitem__(self, key, value):  # ctypes key and value, as bcc takes them
        self.values[key.value] = value.value


class FakeProg:
    def __init__(self):
        self.attempted = 0
        self.sample_every = FakeTable()

    def counters(self):
        c = [0] * 5
        c[loader.STAT_ATTEMPTED] = self.attempted
        for reason, idx in loader.DROP_REASONS.items():
            c[idx] = self.dropped.get(reason, 0)
        return c

    dropped: dict = {}

    def skipped(self):
        return 0

    def table(self, name):
        assert name == "sample_every"
        return self.sample_every


class FakeWriter:
    def __init__(self):
        self.records = []

    def record(self, rec):
        self.records.append(rec)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def monotonic(self):
        return self.t

    def monotonic_ns(self):
        return int(self.t * 1e9)


@pytest.fixture
def gov(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(record.time, "monotonic", clock.monotonic)
    monkeypatch.setattr(record.time, "monotonic_ns", clock.monotonic_ns)
    rec = record.Recorder.__new__(record.Recorder)
    rec.prog = FakeProg()
    rec.writer = FakeWriter()
    rec.max_rate = 100_000
    rec.sample_every = 1
    rec.events = 0

    def tick(kernel_per_s: int, written_per_s: int):
        """One second: the kernel tried kernel_per_s events, the consumer wrote written_per_s."""
        clock.t += 1.0
        rec.prog.attempted += kernel_per_s
        rec.events += written_per_s
        rec.govern(float(written_per_s))
        return rec.sample_every

    return rec, tick


def test_overload_hidden_by_a_slow_consumer_still_samples(gov):
    rec, tick = gov
    # 500k/s in the kernel, but the consumer only wrote 80k/s (the ring buffer dropped the rest)
    assert tick(500_000, 80_000) == 5
    assert rec.writer.records[-1]["sample_every"] == 5
    assert rec.writer.records[-1]["events_per_s"] == 500_000
    assert rec.prog.sample_every.values == {0: 5}  # the kernel side was told
    assert tick(500_000, 100_000) == 5  # steady: no new rate record
    assert len(rec.writer.records) == 1


def test_within_budget_changes_nothing(gov):
    rec, tick = gov
    assert tick(90_000, 90_000) == 1
    assert tick(90_000, 90_000) == 1
    assert rec.writer.records == []


def test_backs_down_with_hysteresis(gov):
    rec, tick = gov
    assert tick(400_000, 100_000) == 4
    assert tick(250_000, 62_500) == 4  # 3 would do, but not half of 4: stay
    assert tick(150_000, 37_500) == 2
    assert tick(40_000, 20_000) == 1
    assert [r["sample_every"] for r in rec.writer.records] == [4, 2, 1]


def test_a_stalled_consumer_does_not_switch_sampling_off(gov):
    rec, tick = gov
    assert tick(600_000, 100_000) == 6
    assert tick(600_000, 0) == 6  # nothing written this second; the kernel rate is unchanged


def test_the_first_loss_says_once_which_options_help(gov, capsys):
    rec, _tick = gov
    rec.lost_reported = {r: 0 for r in (*loader.DROP_REASONS, loader.SKIPPED)}
    rec.last_loss_ts = 0
    rec.loss_hinted = False
    rec.prog.dropped = {"ringbuf_full": 7}
    rec.loss_records()
    rec.prog.dropped = {"ringbuf_full": 9}
    rec.loss_records()
    err = capsys.readouterr().err.splitlines()
    assert err == ["pstate record: warning: 7 events lost (ringbuf_full)",
                   "pstate record: " + record.LOSS_HINTS["ringbuf_full"],
                   "pstate record: warning: 2 events lost (ringbuf_full)"]
    for option in ("--cgroup", "-p", "--min-dur", "--max-rate", "--buffer-size"):
        assert option in err[1]
    assert [(r["reason"], r["count"]) for r in rec.writer.records] == [("ringbuf_full", 7), ("ringbuf_full", 2)]

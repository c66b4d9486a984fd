"""Feature probes (pstate.kernel.features): a kernel below what a program
needs gets one refusal naming the missing feature, found by trying it, not
by its version."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from pstate.kernel import features
from pstate.main import cli

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the probes load BPF objects")


@pytest.fixture
def lacking(monkeypatch):
    """lacking(feature): the probe of that feature fails as an old kernel's would."""
    def lack(feature, why="Invalid argument"):
        monkeypatch.setitem(features.PROBES, feature, lambda: why)
        features.missing.cache_clear()
    yield lack
    features.missing.cache_clear()


@needs_root
def test_this_kernel_has_every_feature():
    features.missing.cache_clear()
    assert {f: features.missing(f) for f in features.PROBES} == dict.fromkeys(features.FEATURES)


@needs_root
def test_record_without_a_ring_buffer_is_refused_by_name(lacking):
    lacking(features.RINGBUF)
    r = CliRunner().invoke(cli, ["record", "-d", "0.1", "-o", os.devnull])
    assert (r.exit_code, r.stdout) == (69, "")
    assert r.stderr == ("Error: this kernel has no BPF ring buffer (BPF_MAP_TYPE_RINGBUF): pstate record passes its "
                        "events through one (it came with Linux 5.8, or a backport; the probe said: Invalid "
                        "argument)\n  fix: pstate snap needs no ring buffer\n")


def test_the_collector_needs_links_of_each_kind_its_plan_attaches(lacking):
    from types import SimpleNamespace

    from pstate.snapshots import collector

    both = SimpleNamespace(paths={"sched_switch": "tracepoint", "task_newtask": "raw_tracepoint"})
    assert collector.link_features(both) == (features.RAW_TP_LINK, features.PERF_LINK)
    assert collector.link_features(SimpleNamespace(paths={"sched_switch": "tp_btf"})) == (features.RAW_TP_LINK,)
    lacking(features.PERF_LINK, "Invalid argument")
    lacking(features.RAW_TP_LINK, None)
    with pytest.raises(Exception) as e:
        features.require(*collector.link_features(both))
    assert e.value.exit_code == 69
    assert e.value.message == (
        "this kernel has no BPF links for classic tracepoints (BPF_LINK_CREATE on a perf event): the snap collector "
        "pins a classic tracepoint's attachment as a link (it came with Linux 5.15, or a backport; the probe said: "
        "Invalid argument)\n  fix: --probes auto takes tp_btf or raw tracepoints, which this kernel may link")
    features.require(*collector.link_features(SimpleNamespace(paths={"sched_switch": "tp_btf"})))

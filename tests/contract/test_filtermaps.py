"""record's filters as the map values of its one program (pstate.kernel.filtermaps)."""

from __future__ import annotations

import pytest

from pstate.kernel import filtermaps
from pstate.exitcodes import PstateError
from pstate.stream.filters import Filter
from pstate.kernel.kstates import KernelStates

KS = KernelStates(report_mask=0xFF, preempt_bit=0x100, letters={
    1: "S", 2: "D", 4: "T", 8: "t", 16: "X", 32: "Z", 64: "P", 128: "I"})


def test_no_filter_is_all_states_and_no_set():
    s = filtermaps.settings_for(Filter(), KS)
    assert s == filtermaps.Settings()
    assert (s.state_mask, s.min_dur, s.task_filters, s.include_idle) == ((1 << 64) - 1, 0, 0, False)


def test_every_filter_has_its_value():
    f = Filter(pids=(5,), tids=(6,), cpus=(1,), comms=("nginx", "a-very-long-thread-name", "nginx"),
               states=("uninterruptible", "preempted"), min_dur_ns=5_000_000, include_idle=True)
    s = filtermaps.settings_for(f, KS)
    assert s.state_mask == (2 << 16) | (1 << 3)
    assert s.min_dur == 5_000_000 and s.include_idle
    assert s.task_filters == filtermaps.TF_CPU | filtermaps.TF_TID | filtermaps.TF_PID | filtermaps.TF_COMM
    assert (s.pids, s.tids, s.cpus) == ((5,), (6,), (1,))
    # cut to the kernel's 15 bytes, zero after the name, each name once
    assert s.comms == (b"nginx" + b"\0" * 11, b"a-very-long-thr\0")


def test_a_state_this_kernel_lacks_is_refused():
    with pytest.raises(PstateError, match="does not report the state 'state_Q'"):
        filtermaps.settings_for(Filter(states=("state_Q",)), KS)


def test_sets_have_limits():
    with pytest.raises(PstateError, match="at most 1024 --pid values"):
        filtermaps.settings_for(Filter(pids=tuple(range(1025))), KS)


# --antagonists: the others' slices while a followed task waits, on by
# default where tasks are followed; one place decides when a recording
# follows tasks (the command asks settings_for)
FOLLOWING = [({"pids": (1,)}, {}), ({"tids": (1,)}, {}), ({"comms": ("nginx",)}, {}),
             ({}, {"follow": (1,)}), ({}, {"command": True})]
NOT_FOLLOWING = [({}, {}), ({"cpus": (0,)}, {}), ({"states": ("sleeping",)}, {})]


@pytest.mark.parametrize("filt,kw", FOLLOWING)
def test_antagonists_with_a_followed_task(filt, kw):
    assert filtermaps.settings_for(Filter(**filt), KS, antagonists=True, **kw).antagonists
    assert filtermaps.settings_for(Filter(**filt), KS, **kw).antagonists
    assert not filtermaps.settings_for(Filter(**filt), KS, antagonists=False, **kw).antagonists


@pytest.mark.parametrize("filt,kw", NOT_FOLLOWING)
def test_antagonists_without_a_followed_task_is_a_usage_error(filt, kw):
    with pytest.raises(PstateError, match="--antagonists keeps what -p, -t, -c, --cgroup or -- CMD"):
        filtermaps.settings_for(Filter(**filt), KS, antagonists=True, **kw)
    # asked for by nobody: off, no error
    assert not filtermaps.settings_for(Filter(**filt), KS, **kw).antagonists

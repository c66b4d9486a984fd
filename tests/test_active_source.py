"""pstate.kernel.tpbtf.active_source and the wake list's defines: which
programs a source compiles under its -D settings, so that only those are
loaded, attached and cached."""

from __future__ import annotations

import pytest

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import btf, loader, tpbtf

TEXT = """\
PSTATE_PROBE(sched, sched_switch) {}
#ifdef WAKE_AT_WAKEUP
PSTATE_PROBE(sched, sched_wakeup) {}
#ifndef NO_NOTE
PSTATE_PROBE(csd, csd_queue_cpu) {}
#endif
#else
PSTATE_PROBE(sched, sched_waking) {}
#endif
#if LINUX_VERSION_CODE > 1
PSTATE_PROBE(a, kept_if) {}
#else
PSTATE_PROBE(a, kept_else) {}
#endif
PSTATE_LIFE(task, task_newtask) {}
"""


def test_the_else_branch_without_the_define():
    assert tpbtf.probes_in(tpbtf.active_source(TEXT, {})) == [
        "sched_switch", "sched_waking", "kept_if", "kept_else", "task_newtask"]
    assert tpbtf.probes_in(tpbtf.active_source(TEXT, {"WAKE_AT_WAKEUP": False})) == [
        "sched_switch", "sched_waking", "kept_if", "kept_else", "task_newtask"]


def test_the_ifdef_branch_with_it_and_nested_ones():
    assert tpbtf.probes_in(tpbtf.active_source(TEXT, {"WAKE_AT_WAKEUP": True})) == [
        "sched_switch", "sched_wakeup", "csd_queue_cpu", "kept_if", "kept_else", "task_newtask"]
    assert tpbtf.probes_in(tpbtf.active_source(TEXT, {"WAKE_AT_WAKEUP": 1, "NO_NOTE": True})) == [
        "sched_switch", "sched_wakeup", "kept_if", "kept_else", "task_newtask"]


def test_lines_keep_their_places():
    out = tpbtf.active_source(TEXT, {})
    assert out.count("\n") == TEXT.count("\n")


def test_record_attaches_one_wake_up_probe_either_way():
    text = loader.source("record")
    on = tpbtf.probes_in(tpbtf.active_source(text, {"WAKE_AT_WAKEUP": True}))
    off = tpbtf.probes_in(tpbtf.active_source(text, {}))
    assert "sched_wakeup" in on and "csd_queue_cpu" in on and "sched_waking" not in on
    assert "sched_waking" in off and "sched_wakeup" not in off and "csd_queue_cpu" not in off
    assert sorted(set(on) - {"sched_wakeup", "csd_queue_cpu"}) == sorted(set(off) - {"sched_waking"})


def test_wake_list_defines_need_every_fact():
    offsets = {"TASK_WAKE_ENTRY": 56, "CSD_FLAGS": 8, "CSD_TYPE_TTWU": 48, "CSD_TYPE_MASK": 240, "TASK_PID": 1}
    targets = {"csd_queue_cpu": 7}
    assert tpbtf.wake_list_defines(offsets, targets) == {
        "WAKE_AT_WAKEUP": True, "TASK_WAKE_ENTRY": 56, "CSD_FLAGS": 8, "CSD_TYPE_TTWU": 48, "CSD_TYPE_MASK": 240}
    assert tpbtf.wake_list_defines(offsets, {}) == {}
    for name in (*btf.WAKE_LIST_MEMBERS, *btf.WAKE_LIST_ENUMS):
        assert tpbtf.wake_list_defines({k: v for k, v in offsets.items() if k != name}, targets) == {}


def test_pstate_wake_list_off_takes_the_wake_ups_at_sched_waking(monkeypatch):
    offsets = {"TASK_WAKE_ENTRY": 56, "CSD_FLAGS": 8, "CSD_TYPE_TTWU": 48, "CSD_TYPE_MASK": 240}
    targets = {"csd_queue_cpu": 7}
    monkeypatch.setenv(tpbtf.WAKE_LIST_ENV, "auto")
    assert tpbtf.wake_list_defines(offsets, targets)["WAKE_AT_WAKEUP"] is True
    monkeypatch.setenv(tpbtf.WAKE_LIST_ENV, "off")
    assert tpbtf.wake_list_defines(offsets, targets) == {}
    assert "WAKE_AT_WAKEUP" not in tpbtf.life_raw_defines({"TASK_PID": 1, "TASK_COMM": 2, "HRTIMER_IS_SOFT": 3,
                                                           **offsets}, targets)
    monkeypatch.setenv(tpbtf.WAKE_LIST_ENV, "no")
    with pytest.raises(PstateError) as e:
        tpbtf.wake_list_defines(offsets, targets)
    assert e.value.exit_code == ExitCode.USAGE
    assert e.value.message == "PSTATE_WAKE_LIST='no' is not auto or off\n  fix: unset PSTATE_WAKE_LIST, or set it to off"


def test_the_texts_own_defines_and_undefs_count_from_where_they_stand():
    text = "#undef WAKE_AT_WAKEUP\n" + TEXT + "#define LATE\n#ifdef LATE\nPSTATE_PROBE(a, late) {}\n#endif\n"
    assert tpbtf.probes_in(tpbtf.active_source(text, {"WAKE_AT_WAKEUP": True})) == [
        "sched_switch", "sched_waking", "kept_if", "kept_else", "task_newtask", "late"]
    skipped = "#ifdef NOPE\n#define LATE\n#endif\n#ifdef LATE\nPSTATE_PROBE(a, late) {}\n#endif\n"
    assert tpbtf.probes_in(tpbtf.active_source(skipped, {})) == []

"""pstate.kernel.tpbtf.active_source: which programs a source compiles
under its -D settings, so that only those are planned, loaded, attached and
cached."""

from __future__ import annotations

from pstate.kernel import loader, tpbtf

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
PSTATE_PROBE(task, task_newtask) {}
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


def test_the_texts_own_defines_and_undefs_count_from_where_they_stand():
    text = "#undef WAKE_AT_WAKEUP\n" + TEXT + "#define LATE\n#ifdef LATE\nPSTATE_PROBE(a, late) {}\n#endif\n"
    assert tpbtf.probes_in(tpbtf.active_source(text, {"WAKE_AT_WAKEUP": True})) == [
        "sched_switch", "sched_waking", "kept_if", "kept_else", "task_newtask", "late"]
    skipped = "#ifdef NOPE\n#define LATE\n#endif\n#ifdef LATE\nPSTATE_PROBE(a, late) {}\n#endif\n"
    assert tpbtf.probes_in(tpbtf.active_source(skipped, {})) == []

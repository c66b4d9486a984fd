"""The plan, per tracepoint (pstate.kernel.probeplan), from kernels made up
here: what each lacks decides its path, how the difference is served, and
what the plan says of it. The real kernels' plans are held by
tests/contract/test_kernel_plans.py from their committed BTF."""

from __future__ import annotations

import copy

import pytest

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import btf, loader, probeplan, tpbtf
from pstate.kernel.probeplan import RAW, TP_BTF, TRACEPOINT

TASK = "struct task_struct *"
# a kernel like 6.18: every tracepoint with its BTF prototype, the wake list, group_dead
FACTS = {
    "members": {name: [8 * (i + 1), sizes[0]] for i, (name, (_s, _sp, sizes)) in enumerate(btf.MEMBERS.items())},
    "enums": {"CSD_TYPE_MASK": 240, "CSD_TYPE_TTWU": 48},
    "tracepoints": {
        "sched_switch": {"target": 11, "args": ["_Bool", TASK, TASK, "unsigned int"]},
        "sched_waking": {"target": 12, "args": [TASK]},
        "sched_wakeup": {"target": 13, "args": [TASK]},
        "sched_wakeup_new": {"target": 14, "args": [TASK]},
        "task_newtask": {"target": 15, "args": [TASK, "long long unsigned int"]},
        "sched_process_fork": {"target": 16, "args": [TASK, TASK]},
        "sched_process_exec": {"target": 17, "args": [TASK, "int", "struct linux_binprm *"]},
        "sched_process_exit": {"target": 18, "args": [TASK, "_Bool"]},
        "sched_process_free": {"target": 19, "args": [TASK]},
        "csd_queue_cpu": {"target": 20, "args": ["unsigned int", "long unsigned int", "prototype *",
                                                 "struct __call_single_data *"]},
        "sched_migrate_task": {"target": 21, "args": [TASK, "int"]},
    },
    "records": {
        "sched_switch": {f: "int" for f in ("prev_comm", "prev_pid", "prev_prio", "prev_state", "next_comm",
                                            "next_pid", "next_prio")},
        "sched_waking": {"comm": "char[16]", "pid": "int", "prio": "int", "target_cpu": "int"},
        "sched_wakeup": {"comm": "char[16]", "pid": "int", "prio": "int", "target_cpu": "int"},
        "sched_wakeup_new": {"comm": "char[16]", "pid": "int", "prio": "int", "target_cpu": "int"},
        "task_newtask": {"pid": "int", "comm": "char[16]", "clone_flags": "long long unsigned int"},
        "sched_process_fork": {"parent_pid": "int", "child_pid": "int"},
        "sched_process_exec": {"pid": "int", "old_pid": "int"},
        "sched_process_exit": {"comm": "char[16]", "pid": "int", "prio": "int", "group_dead": "_Bool"},
        "sched_process_free": {"comm": "__data_loc char[]", "pid": "int", "prio": "int"},
        "sched_migrate_task": {"comm": "char[16]", "pid": "int", "prio": "int", "orig_cpu": "int",
                               "dest_cpu": "int"},
    },
}
EVENTS = ("sched_switch", "sched_wakeup", "csd_queue_cpu", "sched_wakeup_new", "sched_migrate_task", "task_newtask",
          "sched_process_fork", "sched_process_exec", "sched_process_exit", "sched_process_free")
LIFE = ("task_newtask", "sched_process_fork", "sched_process_exec", "sched_process_exit", "sched_process_free")


def kernel(drop_args=(), drop_members=(), drop_tracepoints=(), drop_fields=(), records=True):
    """A made-up kernel: FACTS less some arguments ((event, count) of
    trailing arguments), members, BTF tracepoints and classic fields
    ((event, field))."""
    facts = copy.deepcopy(FACTS)
    for event, n in drop_args:
        del facts["tracepoints"][event]["args"][-n:]
    for m in drop_members:
        del facts["members"][m]
    for event in drop_tracepoints:
        del facts["tracepoints"][event]
    for event, f in drop_fields:
        del facts["records"][event][f]
    k = probeplan.Kernel.from_btf_facts(facts)
    return k if records else probeplan.Kernel(facts, "", lambda event: None)


def record_events(defines):
    """record.bpf.c's tracepoints with these settings (its #ifdefs)."""
    return tpbtf.events_of(loader.source("record"))(defines)


def plan(k, choice="auto", refused=frozenset(), events_of=record_events):
    return probeplan.plan(events_of, choice, k, 0xFF, frozenset(refused))


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv(probeplan.ENV, raising=False)
    monkeypatch.delenv(probeplan.WAKE_LIST_ENV, raising=False)


def test_a_kernel_with_everything_is_tp_btf_throughout():
    p = plan(kernel())
    assert p.paths == {e: TP_BTF for e in EVENTS}
    assert (p.path, p.life, p.why, p.notes, p.wake_list, p.reason) == (TP_BTF, TP_BTF, {}, [], True, "auto")
    assert p.targets == {e: FACTS["tracepoints"][e]["target"] for e in EVENTS}
    assert p.defines["EXIT_GROUP_DEAD_ARG"] is True and "SW_STATE_FROM_TASK" not in p.defines
    assert {p.defines[f"PATH_{e}"] for e in EVENTS} == {1}
    assert p.defines["RAW_REPORT_MAX"] == "0x100" and p.defines["TASK_STATE_SIZE"] == 4
    assert p.meta() == {"probes": TP_BTF, "probes_reason": "auto", "probe_paths": {e: TP_BTF for e in EVENTS},
                        "probe_notes": [], "on_cpu_time": "kernel"}


def test_no_prev_state_argument_reads_the_task_state():
    """Before Linux 5.18 sched_switch has no prev_state: the state is read
    from the task, as the kernel's own tracepoint then did."""
    p = plan(kernel(drop_args=[("sched_switch", 1)]))
    assert p.paths["sched_switch"] == TP_BTF and p.defines["SW_STATE_FROM_TASK"] is True
    assert p.notes == [probeplan.STATE_FROM_TASK.note]
    # without the task's state in the BTF either, sched_switch is classic, and says why
    p = plan(kernel(drop_args=[("sched_switch", 1)], drop_members=["TASK_STATE"]))
    assert p.paths["sched_switch"] == TRACEPOINT and p.path == probeplan.MIXED
    assert p.why == {"sched_switch": "sched_switch has no prev_state argument, and the kernel's BTF lacks "
                                     "task_struct.__state"}
    with pytest.raises(PstateError) as e:
        plan(kernel(drop_args=[("sched_switch", 1)], drop_members=["TASK_STATE"]), "tp_btf")
    assert e.value.exit_code == ExitCode.UNAVAILABLE
    assert e.value.message.startswith("--probes tp_btf: sched_switch: sched_switch has no prev_state argument")


def test_group_dead_from_the_argument_the_field_or_the_live_thread_count():
    exit_arg = [("sched_process_exit", 1)]
    p = plan(kernel(drop_args=exit_arg))
    assert p.paths["sched_process_exit"] == TP_BTF and p.defines["EXIT_GROUP_DEAD_FROM_SIGNAL"] is True
    assert "EXIT_GROUP_DEAD_ARG" not in p.defines and p.notes == [probeplan.GROUP_DEAD_FROM_SIGNAL.note]
    p = plan(kernel(drop_args=exit_arg, drop_members=["SIGNAL_LIVE"]))
    assert p.paths["sched_process_exit"] == TP_BTF and p.notes == [probeplan.GROUP_DEAD_UNKNOWN]
    assert "EXIT_GROUP_DEAD_FROM_SIGNAL" not in p.defines and "EXIT_GROUP_DEAD_ARG" not in p.defines
    # classic: the field where the record has it
    no_btf_exit = kernel(drop_tracepoints=["sched_process_exit"])
    p = plan(no_btf_exit)
    assert p.paths["sched_process_exit"] == TRACEPOINT and p.defines["EXIT_GROUP_DEAD_FIELD"] is True
    assert p.why["sched_process_exit"] == ("the kernel's BTF has no tracepoint sched_process_exit "
                                           "(btf_trace_sched_process_exit)")
    p = plan(kernel(drop_tracepoints=["sched_process_exit"], drop_fields=[("sched_process_exit", "group_dead")]))
    assert p.defines["EXIT_GROUP_DEAD_FROM_SIGNAL"] is True and "EXIT_GROUP_DEAD_FIELD" not in p.defines


def test_the_classic_free_reads_the_name_as_the_record_lays_it_out():
    p = plan(kernel(), "tracepoint")
    assert p.paths["sched_process_free"] == RAW and "FREE_COMM_DATA_LOC" not in p.defines
    k = kernel(drop_tracepoints=["sched_process_free"])
    assert plan(k).defines["FREE_COMM_DATA_LOC"] is True
    k.btf["records"]["sched_process_free"]["comm"] = "char[16]"
    assert "FREE_COMM_DATA_LOC" not in plan(k).defines


def test_probes_tracepoint_takes_classic_hot_tracepoints_and_raw_lifecycle_ones():
    p = plan(kernel(), "tracepoint")
    assert p.paths == {**{e: TRACEPOINT for e in ("sched_switch", "sched_wakeup", "sched_wakeup_new")},
                       **{e: RAW for e in ("csd_queue_cpu", "sched_migrate_task", *LIFE)}}
    assert (p.path, p.life, p.forced, p.targets, p.reason) == (TRACEPOINT, RAW, True, {}, "--probes tracepoint")
    assert "RAW_REPORT_MAX" not in p.defines and p.defines["PATH_sched_switch"] == 3
    assert p.defines["PATH_task_newtask"] == 2 and p.defines["TASK_PID"] == FACTS["members"]["TASK_PID"][0]


def test_no_btf_is_classic_throughout_and_tp_btf_names_the_gap():
    k = probeplan.Kernel(None, "no BTF here", probeplan.Kernel.from_btf_facts(FACTS).records)
    p = plan(k)
    assert set(p.paths.values()) == {TRACEPOINT} and not p.wake_list and "sched_waking" in p.paths
    assert p.why["sched_switch"] == "no usable kernel BTF (no BTF here)"
    assert not any(d.startswith(("TASK_", "CSD_")) for d in p.defines)
    with pytest.raises(PstateError) as e:
        plan(k, "tp_btf")
    assert e.value.message.startswith("--probes tp_btf: sched_switch: no usable kernel BTF (no BTF here); ")
    assert e.value.message.endswith("\n  fix: --probes auto takes each tracepoint the best way this kernel allows")


def test_a_tracepoint_no_way_can_take_is_refused_by_name():
    k = kernel(drop_tracepoints=["task_newtask"], drop_fields=[("task_newtask", "clone_flags")])
    with pytest.raises(PstateError) as e:
        plan(k)
    assert e.value.message == ("this kernel cannot attach: task_newtask: the kernel's BTF has no tracepoint "
                               "task_newtask (btf_trace_task_newtask)\n  fix: run `pstate doctor`")
    assert e.value.exit_code == ExitCode.UNAVAILABLE


def test_an_argument_of_another_type_is_a_gap():
    k = kernel()
    k.btf["tracepoints"]["sched_process_exec"]["args"][1] = "long int"
    p = plan(k)
    assert p.paths["sched_process_exec"] == TRACEPOINT  # raw reads the same arguments
    assert p.why["sched_process_exec"] == "sched_process_exec's old_pid is long int, the programs read int"


def test_the_wake_list_needs_csd_queue_cpu_and_its_members(monkeypatch):
    assert not plan(kernel(drop_tracepoints=["csd_queue_cpu"])).wake_list
    p = plan(kernel(drop_members=["TASK_WAKE_ENTRY"]))
    assert not p.wake_list and "sched_waking" in p.paths and "csd_queue_cpu" not in p.paths
    assert not plan(kernel(drop_members=["CSD_FLAGS"])).wake_list
    k = kernel()
    del k.btf["enums"]["CSD_TYPE_TTWU"]
    assert not plan(k).wake_list
    monkeypatch.setenv(probeplan.WAKE_LIST_ENV, "off")
    assert not plan(kernel()).wake_list
    monkeypatch.setenv(probeplan.WAKE_LIST_ENV, "no")
    with pytest.raises(PstateError) as e:
        plan(kernel())
    assert e.value.exit_code == ExitCode.USAGE
    assert e.value.message == "PSTATE_WAKE_LIST='no' is not auto or off\n  fix: unset PSTATE_WAKE_LIST, or set it to off"


def test_a_program_without_the_wake_list_gets_none_of_it():
    snap = tpbtf.events_of(loader.source("snap"))
    p = plan(kernel(), events_of=snap)
    assert not p.wake_list and "csd_queue_cpu" not in p.paths and "sched_wakeup" in p.paths


def test_refused_tracepoints_go_classic_and_a_refused_waker_takes_the_wake_list_off():
    p = plan(kernel(), refused={"sched_process_exec"})
    assert p.paths["sched_process_exec"] == TRACEPOINT and p.path == probeplan.MIXED
    assert p.why == {"sched_process_exec": "the kernel refused it as tp_btf"}
    assert p.refused == {"sched_process_exec"} and "sched_process_exec" not in p.targets
    p = plan(kernel(), refused={"csd_queue_cpu"})
    assert not p.wake_list and p.paths["sched_waking"] == TP_BTF
    # the wake-ups read through one set of accessors: one refused takes them all
    p = plan(kernel(), refused={"sched_wakeup_new"})
    assert (p.paths["sched_wakeup"], p.paths["sched_wakeup_new"]) == (TRACEPOINT, TRACEPOINT)


def test_choices_from_the_option_or_the_environment(monkeypatch):
    assert probeplan.choice_of(None) == "auto"
    monkeypatch.setenv(probeplan.ENV, "tracepoint")
    assert probeplan.choice_of(None) == "tracepoint" and probeplan.choice_of("tp_btf") == "tp_btf"
    monkeypatch.setenv(probeplan.ENV, "fast")
    with pytest.raises(PstateError) as e:
        probeplan.choice_of(None)
    assert e.value.exit_code == ExitCode.USAGE


FORMAT = """\
name: sched_process_free
ID: 320
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:__data_loc char[] comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:char prev_comm[16];\toffset:16;\tsize:16;\tsigned:0;

print fmt: "comm=%s pid=%d", __get_str(comm), REC->pid
"""


def test_format_fields_as_the_btf_names_them():
    assert probeplan.format_fields(FORMAT) == {"comm": "__data_loc char[]", "pid": "pid_t", "prev_comm": "char[16]"}


def test_every_planned_tracepoint_is_read_from_the_btf():
    """A tracepoint of the plan whose prototype the BTF reader does not
    collect would go classic on every kernel, its reason "no tracepoint in
    the BTF": btf.EVENTS and btf.RAW_CLASSES follow TRACEPOINTS."""
    assert set(btf.EVENTS) == set(probeplan.TRACEPOINTS)
    classic = {e for e, tp in probeplan.TRACEPOINTS.items() if TRACEPOINT in tp.paths}
    assert set(btf.RAW_CLASSES) == classic

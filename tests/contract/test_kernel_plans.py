"""The kernels users run, planned from their committed BTF
(tests/kernels/btf/<id>.btf.xz, refreshed by `make test-kernels`) through
the same planning code record and snap use (pstate.kernel.probeplan), each
held to its committed expected plan (tests/kernels/expected/<id>.json): the
kernel matrix's static half, offline and in seconds. The guests' meta
records are held to the same files by the matrix itself.

With bcc at hand, each kernel's programs are also compiled (not loaded)
with that kernel's plan, so that every combination of settings the kernels
of the list take compiles."""

from __future__ import annotations

import copy
import functools
import json
import lzma
import os
from pathlib import Path

import pytest

from pstate.kernel import btf, loader, probeplan, tpbtf
from conftest import TESTS

KERNELS = TESTS / "kernels"
IDS = [k["id"] for k in json.loads((KERNELS / "kernels.json").read_text())["kernels"] if k["id"] != "host"]
PROGRAMS = ("record", "snap")
REPORT_MASK = 0xFF  # print_fmt's of every kernel of the list (S D T t X Z P I)


@functools.lru_cache(maxsize=None)
def _facts(kid: str) -> dict:
    return btf.facts(btf.Btf(lzma.decompress((KERNELS / "btf" / f"{kid}.btf.xz").read_bytes())))


def facts_of(kid: str) -> dict:
    return copy.deepcopy(_facts(kid))


def plan_of(kid: str, name: str, choice: str = "auto") -> probeplan.Plan:
    kernel = probeplan.Kernel.from_btf_facts(facts_of(kid))
    return probeplan.plan(tpbtf.events_of(loader.source(name)), choice, kernel, REPORT_MASK)


@pytest.fixture(autouse=True)
def _auto(monkeypatch):
    monkeypatch.delenv(probeplan.ENV, raising=False)
    monkeypatch.delenv(probeplan.WAKE_LIST_ENV, raising=False)


def test_every_kernel_of_the_list_has_its_btf_and_expected_plan():
    assert IDS and sorted(IDS) == sorted(p.name.split(".")[0] for p in (KERNELS / "btf").glob("*.btf.xz"))
    assert sorted(IDS) == sorted(p.stem for p in (KERNELS / "expected").glob("*.json") if p.stem != "host")


@pytest.mark.parametrize("kid", IDS)
def test_plans_from_the_committed_btf_are_the_expected_ones(kid):
    expected = json.loads((KERNELS / "expected" / f"{kid}.json").read_text())
    for name in PROGRAMS:
        p = plan_of(kid, name)
        got = {"probe_paths": p.paths}
        if name == "record":
            got["wakeups_at"] = "sched_wakeup" if p.wake_list else "sched_waking"
        want = {k: v for k, v in expected[name].items() if k in got}
        assert got == want, (kid, name)


@pytest.mark.parametrize("kid", IDS)
def test_every_tracepoint_of_the_list_is_tp_btf_and_says_what_it_lacks(kid):
    """tp_btf for every tracepoint each kernel's BTF has; the notes say how
    what it lacks is served."""
    facts = facts_of(kid)
    for name in PROGRAMS:
        p = plan_of(kid, name)
        assert set(p.paths.values()) == {probeplan.TP_BTF} and p.why == {}, (kid, name, p.why)
        has_prev_state = len(facts["tracepoints"]["sched_switch"]["args"]) == 4
        assert (probeplan.STATE_FROM_TASK.note in p.notes) == (not has_prev_state)
        has_group_dead = len(facts["tracepoints"]["sched_process_exit"]["args"]) == 2
        assert (probeplan.GROUP_DEAD_FROM_SIGNAL.note in p.notes) == (not has_group_dead)
        # --probes tp_btf takes the same plan; --probes tracepoint: classic hot, raw lifecycle
        assert plan_of(kid, name, "tp_btf").paths == p.paths
        t = plan_of(kid, name, "tracepoint")
        assert t.path == probeplan.TRACEPOINT and t.life == probeplan.RAW, (kid, name, t.paths)


@pytest.mark.bpf
@pytest.mark.parametrize("choice", ["auto", "tracepoint"])
@pytest.mark.parametrize("kid", IDS)
def test_each_kernels_programs_compile_with_its_plan(kid, choice):
    """BCC compiles every program with the settings each kernel's plan gives
    (its offsets, its PATH_* and what it lacks); nothing is loaded."""
    import bcc

    from pstate.kernel import recordprog
    from pstate.snapshots.taskmaps import defines_for

    ks = loader.kernel_states()
    settings = {"record": recordprog.defines_for(ks, max_tasks=4096, rb_pages=64, sample=False),
                "snap": defines_for(ks, 4096)}
    os.environ["BCC_KERNEL_SOURCE"] = loader.find_headers(None).path
    for name in PROGRAMS:
        p = plan_of(kid, name, choice)
        text = loader.source(name)
        module = _compile_only(bcc, text, loader.cflags_of({**settings[name], **p.defines}))
        try:
            names = {probeplan.TP_BTF: "tp_btf__{e}", probeplan.RAW: "raw_tracepoint__{e}",
                     probeplan.TRACEPOINT: "tracepoint__{c}__{e}"}
            for event, path in p.paths.items():
                fn = names[path].format(e=event, c=probeplan.TRACEPOINTS[event].category)
                assert len(module.dump_func(fn.encode())) > 16, (kid, name, fn)
        finally:
            module.cleanup()


def _compile_only(bcc, text: str, cflags: list[str]):
    """A BCC module compiled from text, its programs not loaded or attached."""
    cls = type("CompileOnly", (bcc.BPF,), {"_trace_autoload": lambda self: None})
    return cls(text=text.encode(), cflags=cflags)

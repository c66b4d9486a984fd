"""The kernel matrix's expected plans and table (tests/kernels/kplan.py):
no root, no network, no guest."""

from __future__ import annotations

import json
import lzma
import os

import pytest

import kplan

HERE = os.path.dirname(os.path.abspath(__file__))
KERNELS = ("deb510", "deb61", "deb61rt", "deb612")


def raw_btf(kid: str) -> bytes:
    with lzma.open(os.path.join(HERE, "btf", f"{kid}.btf.xz")) as f:
        return f.read()


@pytest.mark.parametrize("kid", KERNELS + ("host",))
def test_every_expected_plan_names_record_and_snap(kid):
    with open(os.path.join(HERE, "expected", f"{kid}.json")) as f:
        expected = json.load(f)
    for program in ("record", "snap"):
        assert set(expected[program]) >= {"probe_paths"}
        assert set(expected[program]["probe_paths"].values()) <= {"tp_btf", "raw_tracepoint", "tracepoint"}
    assert "wakeups_at" in expected["record"] and "wakeups_at" not in expected["snap"]


def test_the_wake_list_only_from_6_5():
    assert kplan.expected_plan(raw_btf("deb612"))["record"]["wakeups_at"] == "sched_wakeup"
    for kid in ("deb510", "deb61", "deb61rt"):
        plan = kplan.expected_plan(raw_btf(kid))["record"]
        assert plan["wakeups_at"] == "sched_waking" and "csd_queue_cpu" not in plan["probe_paths"]


def test_a_missing_field_or_program_is_a_difference_not_a_crash():
    expected = {"_kernel": "x", "record": {"probe_paths": {"sched_switch": "tp_btf"}, "wakeups_at": "sched_waking"},
                "snap": {"wakeups_at": "sched_wakeup"}}
    got = {"record": {"probes": "tracepoint", "wakeups_at": "sched_waking"}}
    assert kplan.compare(expected, got) == [
        "record.probe_paths: absent from the meta record (expected 1 events (tp_btf))",
        "snap: no meta record (the program did not start)",
    ]
    got = {"record": {"probe_paths": {"sched_switch": "raw_tracepoint", "irq_handler_entry": "raw_tracepoint"},
                      "wakeups_at": "sched_wakeup"}, "snap": {"wakeups_at": "sched_wakeup"}}
    assert kplan.compare(expected, got) == [
        "record.probe_paths.irq_handler_entry: raw_tracepoint, expected absent",
        "record.probe_paths.sched_switch: raw_tracepoint, expected tp_btf",
        "record.wakeups_at: sched_wakeup, expected sched_waking",
    ]
    assert kplan.compare(expected, {"record": expected["record"], "snap": {"wakeups_at": "sched_wakeup"}}) == []


def test_the_table_has_a_row_per_check_and_a_column_per_kernel():
    results = {("host", "record"): {"ok": True, "seconds": 0.24}, ("deb61", "record"): {"ok": False, "seconds": 140},
               ("deb61", "snap"): {"ok": None, "seconds": 0}, ("host", "snap"): {"ok": True, "seconds": 754}}
    text = kplan.table(["host", "deb61"], ["boot", "record", "snap"], results, [("wall", {"host": "28s"})])
    assert text.splitlines() == [
        "check   host       deb61",
        "boot    -          -",
        "record  ok 0.2s    FAIL 140s",
        "snap    ok 12m34s  skip",
        "wall    28s        -",
    ]
    assert kplan.failed(["host", "deb61"], ["record", "snap"], results) == [("deb61", "record")]


def test_docs_kernels_md_is_generated_from_the_matrix_files():
    """docs/kernels.md is kdoc.render() of kernels.json, btf/ and last/: run
    tests/kernels/kdoc.py after changing them (or the planner)."""
    import kdoc

    with open(kdoc.DOC) as f:
        assert f.read() == kdoc.render(), "docs/kernels.md is stale: run tests/kernels/kdoc.py"


def test_a_matrix_run_is_kept_per_kernel(tmp_path, monkeypatch):
    import kdoc

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps({
        "kernels": {"host": {"kernel": "6.18", "accel": "host"}, "deb61": {"kernel": "6.1.0-57-amd64", "accel": "tcg"}},
        "results": [{"name": "boot", "ok": True, "kernel": "deb61"}, {"name": "snap", "ok": False, "kernel": "deb61"},
                    {"name": "record", "ok": True, "kernel": "host"}],
        "plan_differences": {"deb61": [], "host": []}}))
    monkeypatch.setattr(kdoc, "LAST", str(tmp_path / "last"))
    assert kdoc.keep_run(str(run)) == ["deb61"]
    entry = kdoc.last_run("deb61")
    assert entry["checks"] == {"boot": "ok", "snap": "FAIL"} and entry["plan"] == "as expected"
    assert kdoc._result(entry).startswith("1/2 ok (failed: snap), plan as expected, ")

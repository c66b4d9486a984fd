"""The kernel matrix's expected plans and its table, apart from any kernel
or guest (tests/kernels/test_kplan.py tests them).

A plan is what a program's meta record says of how it attached: probes (the
summary path), probe_paths (tracepoint event -> tp_btf, raw_tracepoint or
tracepoint) and wakeups_at. expected/<id>.json holds, per program, the
fields to compare: {"record": {"probe_paths": {...}, "wakeups_at": ...},
"snap": {"probe_paths": {...}}}. `matrix.py --write-expected` writes them
from each kernel's committed BTF through the planner itself
(expected_plan()); a change of plan is then a reviewed change of these
files, and tests/contract/test_kernel_plans.py holds the planner to them offline.
"""

from __future__ import annotations

PLAN_FIELDS = ("probes", "probe_paths", "wakeups_at", "probes_reason")
PROGRAMS = ("record", "snap")
# the states every kernel of the list reports in sched_switch's print_fmt
# (S D T t X Z P I): what the plan needs of them does not vary across the list
REPORT_MASK = 0xFF


def expected_plan(raw: bytes) -> dict:
    """The plan record's and snap's own planner (pstate.kernel.probeplan)
    makes from a kernel's raw BTF, in the meta record's terms: probe_paths
    for both, and record's wakeups_at (snap's run-queue wait always starts
    at sched_wakeup and its meta record does not say so)."""
    from pstate.kernel import btf, loader, probeplan, tpbtf

    kernel = probeplan.Kernel.from_btf_facts(btf.facts(btf.Btf(raw)))
    plans = {}
    for name in PROGRAMS:
        p = probeplan.plan(tpbtf.events_of(loader.source(name)), "auto", kernel, REPORT_MASK)
        plans[name] = {"probe_paths": dict(sorted(p.paths.items()))}
        if name == "record":
            plans[name]["wakeups_at"] = "sched_wakeup" if p.wake_list else "sched_waking"
    return plans


# --- comparison -----------------------------------------------------------------------

def compare(expected: dict, got: dict) -> list[str]:
    """What differs between an expected plan and the plans a run's meta
    records gave (program -> their plan fields; a program that wrote no meta
    record is absent): one line per difference, none when they agree."""
    diffs = []
    for program, want in expected.items():
        if program.startswith("_") or not isinstance(want, dict):
            continue
        have = got.get(program)
        if have is None:
            diffs.append(f"{program}: no meta record (the program did not start)")
            continue
        for key, value in want.items():
            if key not in have:
                diffs.append(f"{program}.{key}: absent from the meta record (expected {_short(value)})")
            elif isinstance(value, dict) and isinstance(have[key], dict):
                for event in sorted(set(value) | set(have[key])):
                    a, b = value.get(event), have[key].get(event)
                    if a != b:
                        diffs.append(f"{program}.{key}.{event}: {b or 'absent'}, expected {a or 'absent'}")
            elif have[key] != value:
                diffs.append(f"{program}.{key}: {_short(have[key])}, expected {_short(value)}")
    return diffs


def _short(value) -> str:
    if isinstance(value, dict):
        paths = sorted(set(value.values()))
        return f"{len(value)} events ({', '.join(paths)})"
    return str(value)


# --- the table ------------------------------------------------------------------------

def cell(result: dict | None) -> str:
    """ok 12s, FAIL 140s, skip, or - (no result: not run)."""
    if result is None:
        return "-"
    if result.get("ok") is None:
        return "skip"
    word = "ok" if result["ok"] else "FAIL"
    secs = result.get("seconds")
    return f"{word} {fmt_secs(secs)}" if secs else word


def fmt_secs(secs: float | None) -> str:
    if secs is None:
        return "-"
    if secs < 10:
        return f"{secs:.1f}s"
    if secs < 600:
        return f"{secs:.0f}s"
    return f"{int(secs // 60)}m{int(secs % 60):02d}s"


def table(kernels: list[str], checks: list[str], results: dict, extra_rows: list[tuple[str, dict]] = ()) -> str:
    """One row per check, one column per kernel: results[(kernel, check)] is
    a check's result; extra_rows are (label, {kernel: text}) rows below."""
    rows = [["check"] + kernels]
    for check in checks:
        rows.append([check] + [cell(results.get((k, check))) for k in kernels])
    for label, values in extra_rows:
        rows.append([label] + [str(values.get(k, "-")) for k in kernels])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def failed(kernels: list[str], checks: list[str], results: dict) -> list[tuple[str, str]]:
    """(kernel, check) of every check that failed."""
    return [(k, c) for k in kernels for c in checks if (results.get((k, c)) or {}).get("ok") is False]

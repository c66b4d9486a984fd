"""The kernel matrix's expected plans and its table, apart from any kernel
or guest (tests/kernels/test_kplan.py tests them).

A plan is what a program's meta record says of how it attached: probes (the
summary path), probe_paths (tracepoint event -> tp_btf, raw_tracepoint or
tracepoint) and wakeups_at. expected/<id>.json holds, per program, the
fields to compare: {"record": {"probe_paths": {...}, "wakeups_at": ...},
"snap": {...}}. `matrix.py --write-expected` writes them from each kernel's
BTF by the rule in expected_plan(); they are then edited by hand where the
planner decides otherwise.
"""

from __future__ import annotations

import struct

# The tracepoints each program attaches to (bpf/record.bpf.c, bpf/snap.bpf.c);
# record's wake-up is sched_wakeup (with csd_queue_cpu for the wake list's
# wakers) where the kernel has csd_queue_cpu, else sched_waking.
LIFECYCLE = ("task_newtask", "sched_process_fork", "sched_process_exec", "sched_process_exit", "sched_process_free")
RECORD_EVENTS = ("sched_switch", "sched_wakeup_new") + LIFECYCLE
SNAP_EVENTS = ("sched_switch", "sched_wakeup", "sched_wakeup_new", "task_newtask", "sched_process_exec",
               "sched_process_exit", "sched_process_free")
PLAN_FIELDS = ("probes", "probe_paths", "wakeups_at", "probes_reason")

# --- BTF: the btf_trace_<event> typedefs ----------------------------------------------

# bytes that follow a btf_type of each kind: (fixed, per vlen)
_KIND_EXTRA = {1: (4, 0), 2: (0, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 7: (0, 0), 8: (0, 0),
               9: (0, 0), 10: (0, 0), 11: (0, 0), 12: (0, 0), 13: (0, 8), 14: (4, 0), 15: (0, 12), 16: (0, 0),
               17: (4, 0), 18: (0, 0), 19: (0, 12)}
KIND_TYPEDEF = 8


def btf_typedefs(raw: bytes, prefix: str = "btf_trace_") -> set[str]:
    """The names of raw BTF's typedefs that start with prefix."""
    magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", raw, 0)
    if magic != 0xEB9F:
        raise ValueError("not raw BTF (little-endian)")
    type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", raw, 8)
    types, strings = hdr_len + type_off, hdr_len + str_off
    names, at, end = set(), types, types + type_len
    while at < end:
        name_off, info, _ = struct.unpack_from("<III", raw, at)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        fixed, per = _KIND_EXTRA[kind]
        if kind == KIND_TYPEDEF:
            stop = raw.index(b"\0", strings + name_off)
            name = raw[strings + name_off:stop].decode()
            if name.startswith(prefix):
                names.add(name)
        at += 12 + fixed + per * vlen
    return names


def expected_plan(typedefs: set[str]) -> dict:
    """The plan a kernel's BTF allows: tp_btf for every tracepoint it has a
    btf_trace_ typedef of (the classic tracepoint for any other); record's
    wake-ups at sched_wakeup where csd_queue_cpu exists, else sched_waking;
    snap's at sched_wakeup (its only wake-up program)."""
    def path(event):
        return "tp_btf" if f"btf_trace_{event}" in typedefs else "tracepoint"

    wake_list = "btf_trace_csd_queue_cpu" in typedefs
    record = list(RECORD_EVENTS) + (["sched_wakeup", "csd_queue_cpu"] if wake_list else ["sched_waking"])
    return {
        "record": {"probe_paths": {e: path(e) for e in sorted(record)},
                   "wakeups_at": "sched_wakeup" if wake_list else "sched_waking"},
        "snap": {"probe_paths": {e: path(e) for e in sorted(SNAP_EVENTS)}, "wakeups_at": "sched_wakeup"},
    }


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

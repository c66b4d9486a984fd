"""The meta header every writer puts first: what wrote the stream, where, and
how its timestamps map to wall-clock time."""

from __future__ import annotations

import os
import socket
import time

from pstate import __version__
from pstate.stream import schema


def boot_id() -> str:
    """The running kernel's boot id ("" when it cannot be read): the one
    reader of it (meta records, the collector's manifest, the BTF cache)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def clock_anchor() -> tuple[int, int]:
    """(CLOCK_MONOTONIC ns, wall-clock ns) taken as close together as possible."""
    best = None
    for _ in range(3):
        m0 = time.monotonic_ns()
        w = time.time_ns()
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, (m0 + m1) // 2, w)
    return best[1], best[2]


def rfc3339(wall_ns: int) -> str:
    """Wall-clock ns since the epoch as RFC 3339 UTC with all nine digits
    ("2026-12-01T09:28:15.117604579Z"): the same instant as the integer, in
    a form that tools whose JSON numbers are doubles (jq 1.6, pandas) keep."""
    secs, ns = divmod(wall_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{ns:09d}Z"


def wall_time_at(meta: dict, ts: int) -> str | None:
    """The wall_time (rfc3339) of monotonic ts by a meta record's anchor
    (wall = wall_ns + (ts - meta ts)), or None when the meta has none."""
    wall, base = meta.get("wall_ns"), meta.get("ts")
    if type(wall) is not int or type(base) is not int or type(ts) is not int:
        return None
    return rfc3339(wall + ts - base)


def meta_record(source: str, kernel_states=None) -> dict:
    mono, wall = clock_anchor()
    rec = {
        "type": "meta",
        "schema": schema.SCHEMA_VERSION,
        "source": source,
        "tool": "pstate",
        "version": __version__,
        "host": socket.gethostname(),
        "kernel": os.uname().release,
        "boot_id": boot_id(),
        "clock": "monotonic",
        "ts": mono,
        "wall_ns": wall,
        "wall_time": rfc3339(wall),
        "ncpu": os.cpu_count() or 0,
        "pstate_pid": os.getpid(),
        "states": schema.state_vocabulary(),
    }
    if kernel_states is not None:
        rec["kernel_states"] = kernel_states.meta()
    return rec


# Filters that drop transitions of the tasks they keep: what is left is no
# ledger of their time. Task filters keep every transition of the tasks kept.
TRANSITION_FILTERS = (("filter_state", "--state"), ("filter_cpu", "--cpu"), ("filter_min_dur_ns", "--min-dur"))
TASK_FILTERS = (("filter_pid", "--pid"), ("filter_tid", "--tid"), ("filter_comm", "--comm"),
                ("filter_cgroup", "--cgroup"), ("filter_title", "--title"), ("filter_command", "-- CMD"))


def filters_in_force(metas, fields=TRANSITION_FILTERS + TASK_FILTERS, prefixes=("", "replay_", "read_")) -> list:
    """The options (--state, ...) behind the filter_*, replay_filter_* and
    read_filter_* fields (prefixes: only those) set in any of the meta
    records, in the order of fields. read_filter_* fields are added by the
    reader that applied the filter (stream.reader)."""
    found = []
    for field, option in fields:
        if any(m.get(p + field) for m in metas for p in prefixes):
            found.append(option)
    return found


def _int(v):
    return v if type(v) is int else None


def stream_window(metas) -> tuple:
    """(begin, end) of the window a cut stream covers, CLOCK_MONOTONIC ns,
    either None: window_begin_ts/window_end_ts of its meta records (or
    replay_begin_ts/replay_end_ts, written by replays before them). Every
    duration reaching back before begin is clipped to it; no time counts
    past end."""
    begins = [b for b in (_int(m.get("window_begin_ts", m.get("replay_begin_ts"))) for m in metas)
              if b is not None]
    ends = [e for e in (_int(m.get("window_end_ts", m.get("replay_end_ts"))) for m in metas) if e is not None]
    return (min(begins) if begins else None, max(ends) if ends else None)

"""The meta header every writer puts first: what wrote the stream, where, and
how its timestamps map to wall-clock time."""

from __future__ import annotations

import os
import socket
import time

from pstate import __version__
from pstate.stream import schema


def boot_id() -> str:
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

"""Where record's and snap's programs keep a row per thread (bpf/record.bpf.c,
bpf/snap.bpf.c): a hash keyed by tid, or, when every tid fits, an array
indexed by tid, whose lookup costs no helper call. The one decision of which."""

from __future__ import annotations

import os

from pstate.kernel import loader

MAPPED_SINCE = (5, 5)  # arrays user space can map (BPF_F_MMAPABLE)


def tasks_by_tid(max_tasks: int, *, mapped: bool = False) -> bool:
    """Whether a program with room for max_tasks rows indexes them by tid
    (TASKS_BY_TID): every tid is below pid_max, so when pid_max <= max_tasks
    each has its own slot. mapped: user space reads the array through a
    shared mapping (snap), which the kernel allows from Linux 5.5."""
    if loader.pid_max() > max_tasks:
        return False
    return not mapped or kernel_at_least(*MAPPED_SINCE)


def kernel_at_least(major: int, minor: int) -> bool:
    try:
        have = tuple(int(x) for x in os.uname().release.split("-", 1)[0].split(".")[:2])
    except ValueError:
        return False
    return have >= (major, minor)

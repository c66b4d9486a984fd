"""record's filters as map values of its BPF program (bpf/record.bpf.c).

The program's text does not depend on the filters, so one compiled (and
cached) program serves every -p/-t/-c/--cpu/--state/--min-dur value: the
`settings` row holds the state mask, the minimum duration, --include-idle
and which filter sets to consult; pid_filter, tid_filter, comm_filter and
cpu_filter hold the set members. The program reports nothing until the row
is written with active set (start) and stops reporting at once when it is
cleared (stop); it keeps its task rows either way.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from pstate.kernel import eventlayout
from pstate.kernel.eventcodec import state_code, state_mask_bit
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.filters import Filter
from pstate.kernel.kstates import KernelStates

_D = eventlayout.DEFINES
TF_CPU, TF_TID, TF_PID, TF_COMM = _D["TF_CPU"], _D["TF_TID"], _D["TF_PID"], _D["TF_COMM"]
ALL_STATES = (1 << 64) - 1
MAX_IDS, MAX_COMMS, MAX_CPUS = 1024, 256, 4096  # the sets' sizes in bpf/record.bpf.c


@dataclass(frozen=True)
class Settings:
    """The values of the program's settings row and sets for one Filter."""

    state_mask: int = ALL_STATES
    min_dur: int = 0
    task_filters: int = 0
    include_idle: bool = False
    pids: tuple[int, ...] = ()
    tids: tuple[int, ...] = ()
    comms: tuple[bytes, ...] = ()
    cpus: tuple[int, ...] = ()
    stack_mask: int = 0  # record --stacks: prev_state bits whose switch-out takes the stack


def comm_key(name: str) -> bytes:
    """The 16-byte key of a --comm value: the kernel's comm is at most 15
    bytes, zero after the name."""
    return name.encode()[:15].ljust(16, b"\0")


def settings_for(filt: Filter, ks: KernelStates) -> Settings:
    """PstateError (usage) for a state this kernel does not report or more
    set members than the program's sets hold."""
    mask = ALL_STATES
    if filt.states:
        mask = 0
        for name in filt.states:
            code = state_code(name, ks)
            if code is None:
                raise PstateError(f"this kernel does not report the state {name!r}", ExitCode.USAGE)
            mask |= state_mask_bit(code)
    comms = tuple(dict.fromkeys(comm_key(c) for c in filt.comms))
    for what, vals, limit in (("--pid", filt.pids, MAX_IDS), ("--tid", filt.tids, MAX_IDS),
                              ("--comm", comms, MAX_COMMS)):
        if len(set(vals)) > limit:
            raise PstateError(f"record takes at most {limit} {what} values", ExitCode.USAGE,
                              hint=f"record without {what} and filter with `pstate replay {what} ...`")
    flags = ((TF_CPU if filt.cpus else 0) | (TF_TID if filt.tids else 0) | (TF_PID if filt.pids else 0)
             | (TF_COMM if comms else 0))
    return Settings(state_mask=mask, min_dur=filt.min_dur_ns or 0, task_filters=flags,
                    include_idle=filt.include_idle, pids=tuple(filt.pids), tids=tuple(filt.tids), comms=comms,
                    cpus=tuple(filt.cpus))


def start(prog, s: Settings) -> None:
    """Fill the sets, then the settings row with active set: from then on the
    program reports, through these filters."""
    one = ctypes.c_uint8(1)
    for name, vals in (("pid_filter", s.pids), ("tid_filter", s.tids)):
        t = prog.table(name)
        for v in vals:
            t[ctypes.c_uint32(v)] = one
    if s.comms:
        t = prog.table("comm_filter")
        for raw in s.comms:
            key = t.Key()
            ctypes.memmove(ctypes.addressof(key), raw, 16)
            t[key] = one
    if s.cpus:
        t = prog.table("cpu_filter")
        for c in s.cpus:
            t[ctypes.c_int(c)] = one
    _write(prog, s, active=1)


def stop(prog, s: Settings) -> None:
    """The program stops reporting at once (it keeps running until detached)."""
    _write(prog, s, active=0)


def _write(prog, s: Settings, active: int) -> None:
    t = prog.table("settings")
    row = t.Leaf()
    row.state_mask = s.state_mask
    row.min_dur = s.min_dur
    row.task_filters = s.task_filters
    row.include_idle = 1 if s.include_idle else 0
    row.active = active
    row.stack_mask = s.stack_mask
    t[ctypes.c_int(0)] = row

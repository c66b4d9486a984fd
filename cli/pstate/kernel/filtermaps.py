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
import os
from dataclasses import dataclass

from pstate.kernel import eventlayout, identity
from pstate.kernel.eventcodec import state_code, state_mask_bit
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.filters import Filter
from pstate.kernel.kstates import KernelStates

_D = eventlayout.DEFINES
TF_CPU, TF_TID, TF_PID, TF_COMM = _D["TF_CPU"], _D["TF_TID"], _D["TF_PID"], _D["TF_COMM"]
TF_FOLLOW, TF_CGROUP = _D["TF_FOLLOW"], _D["TF_CGROUP"]
ALL_STATES = (1 << 64) - 1
# the sets' sizes (bpf/pstate.h FILTER_*)
MAX_IDS, MAX_COMMS, MAX_CPUS = _D["FILTER_IDS"], _D["FILTER_COMMS"], _D["FILTER_CPUS"]
MAX_CGROUPS, MAX_FOLLOWED = _D["FILTER_CGROUPS"], _D["FILTER_FOLLOWED"]


@dataclass(frozen=True)
class Settings:
    """The values of the program's settings row and sets for one Filter."""

    state_mask: int = ALL_STATES
    min_dur: int = 0
    task_filters: int = 0
    include_idle: bool = False
    antagonists: bool = False  # with task filters: the others' slices while a followed task is queued
    pids: tuple[int, ...] = ()
    tids: tuple[int, ...] = ()
    comms: tuple[bytes, ...] = ()
    cpus: tuple[int, ...] = ()
    stack_mask: int = 0  # record --stacks: prev_state bits whose switch-out takes the stack
    cgroup_ids: tuple[int, ...] = ()  # --cgroup: the ids of its cgroups and of those below them
    cgroup_pids: tuple[int, ...] = ()  # the processes in them when recording starts


def comm_key(name: str) -> bytes:
    """The 16-byte key of a --comm value: the kernel's comm is at most 15
    bytes, zero after the name."""
    return name.encode()[:15].ljust(16, b"\0")


def settings_for(filt: Filter, ks: KernelStates, *, follow: tuple[int, ...] = (),
                 antagonists: bool | None = None, command: bool = False) -> Settings:
    """PstateError (usage) for a state this kernel does not report, a
    --cgroup that does not exist, a --title (a title is known only after a
    process's first events), more set members than the program's sets
    hold, or --antagonists with no task to follow. antagonists: None, on
    where tasks are followed (their slices are kept per CPU, so the cost
    is bounded by their waits); False, off. follow: processes whose
    descendants join them (--children, record -- CMD): the descendants
    living now, and those forked from now; command: a command will be
    followed (record -- CMD, before it is started)."""
    if filt.titles:
        raise PstateError("record cannot filter by --title: a process's title is read after its first events",
                          ExitCode.USAGE, hint="filter the recording: pstate stats --title PATTERN rec.jsonl")
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
    pids = tuple(dict.fromkeys(filt.pids + follow + tuple(p for f in follow for p in identity.descendants(f))))
    cg_ids, cg_pids = _cgroups(filt.cgroups)
    flags = ((TF_CPU if filt.cpus else 0) | (TF_TID if filt.tids else 0) | (TF_PID if pids else 0)
             | (TF_COMM if comms else 0) | (TF_FOLLOW if follow else 0) | (TF_CGROUP if filt.cgroups else 0))
    followed = flags & ~TF_CPU or command  # tasks followed, others left out: their antagonists are among them
    if antagonists is None:
        antagonists = bool(followed)
    if antagonists and not followed:
        raise PstateError("--antagonists keeps what -p, -t, -c, --cgroup or -- CMD would leave out: give one",
                          ExitCode.USAGE)
    return Settings(state_mask=mask, min_dur=filt.min_dur_ns or 0, task_filters=flags,
                    include_idle=filt.include_idle, antagonists=bool(antagonists),
                    pids=pids, tids=tuple(filt.tids), comms=comms,
                    cpus=tuple(filt.cpus), cgroup_ids=cg_ids, cgroup_pids=cg_pids)


def _cgroups(paths: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids of --cgroup's cgroups and those below them, and the processes
    in them now."""
    if not paths:
        return (), ()
    cg = identity.CgroupPaths()
    if cg.mount is None:
        raise PstateError("--cgroup needs cgroup v2, and this system has no cgroup2 mount", ExitCode.USAGE)
    ids: list[int] = []
    for path in paths:
        if cg.id_of(path) is None:
            raise PstateError(f"no cgroup {path} under the cgroup v2 mount {cg.mount}", ExitCode.USAGE,
                              hint=f"the paths are those of /proc/PID/cgroup's 0:: line, e.g. "
                                   f"{identity.process_cgroup(os.getpid()) or '/'}")
        ids += cg.below(path)
    ids = list(dict.fromkeys(ids))
    if len(ids) > MAX_CGROUPS:
        raise PstateError(f"--cgroup names {len(ids)} cgroups with those below them; record takes at most "
                          f"{MAX_CGROUPS}", ExitCode.USAGE)
    return tuple(ids), tuple(dict.fromkeys(p for i in ids for p in cg.procs(i)))


def start(prog, s: Settings) -> None:
    """Fill the sets, then the settings row with active set: from then on the
    program reports, through these filters."""
    one = ctypes.c_uint8(1)
    for name, vals in (("pid_filter", s.pids), ("tid_filter", s.tids), ("cgroup_pids", s.cgroup_pids)):
        if vals:  # (a set the program may not have when unused: bench --against an older revision)
            t = prog.table(name)
            for v in vals:
                t[ctypes.c_uint32(v)] = one
    if s.cgroup_ids:
        t = prog.table("cgroup_filter")
        for v in s.cgroup_ids:
            t[ctypes.c_uint64(v)] = one
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
    row.antagonists = 1 if s.antagonists else 0
    row.active = active
    row.stack_mask = s.stack_mask
    t[ctypes.c_int(0)] = row

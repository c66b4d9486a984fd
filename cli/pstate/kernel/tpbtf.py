"""Which way record's and snap's programs attach to the hot sched
tracepoints, and the loading of the BTF-typed ones.

Two paths, one C source each (bpf/tpargs.h has the argument accessors):

- tp_btf: BTF-typed raw tracepoint programs (BPF_PROG_TYPE_TRACING,
  attach type BPF_TRACE_RAW_TP) on sched_switch and the wake-ups. They get
  the raw arguments with no trace record built, and read task_struct with
  plain loads at offsets from the running kernel's BTF (pstate.kernel.btf).
  BCC compiles them like any function; its loader knows no tp_btf target
  for a tracepoint, so their instructions (map fds already in place) are
  loaded here with plain bpf(2) calls, with the btf_trace_<event> typedef as
  the attach target.
- tracepoint: classic tracepoints, whose arguments BCC lays out from the
  tracefs format files. The fallback: no BTF, a kernel before 5.5, or
  programs the verifier refuses.

The lifecycle programs (task_newtask, sched_process_fork/exec/exit/free:
PSTATE_LIFE in bpf/tpargs.h) are tp_btf programs on the tp_btf path; on the
tracepoint path they are raw tracepoints (LIFE_RAW: task fields read with
bpf_probe_read_kernel at the BTF's offsets) when the kernel's BTF has what
they read, and classic tracepoints only without it. A classic lifecycle
program, which runs with interrupts on, makes the kernel skip every classic
sched program an interrupt runs on its CPU meanwhile (bpf_prog_active).

`--probes auto|tp_btf|tracepoint` (or PSTATE_PROBES when the option is not
given) chooses; auto takes tp_btf when the kernel has what it needs, and
falls back to tracepoint, keeping the reason, when the kernel refuses it.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import bpfsys, btf

AUTO, TP_BTF, TRACEPOINT = "auto", "tp_btf", "tracepoint"
CHOICES = (AUTO, TP_BTF, TRACEPOINT)
ENV = "PSTATE_PROBES"
# "off": record takes its wake-ups at sched_waking even where the kernel has
# the wake list (wake_list_defines): the path of older kernels, kept testable
WAKE_LIST_ENV = "PSTATE_WAKE_LIST"
PREFIX = "tp_btf__"  # the function of a tp_btf probe: PREFIX + event (bpf/tpargs.h)

# The kernel's task state bits (include/linux/sched.h, the same since Linux
# 6.1 and, but for TASK_FROZEN, since 5.15) that sched_switch's format folds
# into the state it reports; #defines, so they are in no BTF. The reported
# bits themselves come from the format's print_fmt (pstate.kernel.kstates).
TASK_UNINTERRUPTIBLE = 0x0002
TASK_NOLOAD = 0x0400
TASK_RTLOCK_WAIT = 0x1000
TASK_FROZEN = 0x8000

_PROBE = re.compile(r"^PSTATE_(?:PROBE|LIFE)\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)", re.M)
# the offsets the raw tracepoint programs of the tracepoint path read: the
# lifecycle ones' (LIFE_RAW, bpf/tpargs.h LF_*) and record's hrtimer tracker's
LIFE_OFFSETS = ("TASK_PID", "TASK_COMM", "HRTIMER_IS_SOFT")
_COND = re.compile(r"^\s*#\s*(ifdef|ifndef|if|elif|else|endif|define|undef)\b\s*(\w*)")


class Refused(Exception):
    """The kernel would not load or attach a tp_btf program; the message says why."""


@dataclass
class Plan:
    """The path a program is loaded on, and why."""

    path: str  # TP_BTF or TRACEPOINT
    reason: str
    forced: bool = False  # asked for by name: no fallback
    defines: dict = field(default_factory=dict)  # the path's -D settings
    targets: dict = field(default_factory=dict)  # event -> BTF id of btf_trace_<event>

    @property
    def life(self) -> str:
        """How the lifecycle programs attach: tp_btf, raw_tracepoint or tracepoint."""
        if self.path == TP_BTF:
            return TP_BTF
        return "raw_tracepoint" if self.defines.get("LIFE_RAW") else TRACEPOINT


def choice_of(option: str | None) -> str:
    """The --probes value, or PSTATE_PROBES, or auto."""
    value = option or os.environ.get(ENV) or AUTO
    if value not in CHOICES:
        raise PstateError(f"{ENV}={value!r} is not one of {', '.join(CHOICES)}", ExitCode.USAGE)
    return value


def raw_state_defines(report_mask: int) -> dict:
    """The -D settings reported_switch_state() needs, from the reported mask
    (print_fmt's state bits, the idle bit highest)."""
    report_max = report_mask + 1  # the preemption bit
    return {
        "RAW_TASK_REPORT": f"0x{(report_max >> 1) - 1:x}",
        "RAW_REPORT_IDLE": f"0x{report_max >> 1:x}",
        "RAW_REPORT_MAX": f"0x{report_max:x}",
        "RAW_TASK_IDLE": f"0x{TASK_UNINTERRUPTIBLE | TASK_NOLOAD:x}",
        "RAW_UNINTERRUPTIBLE": f"0x{TASK_UNINTERRUPTIBLE:x}",
        "RAW_AS_UNINTERRUPTIBLE": f"0x{TASK_RTLOCK_WAIT | TASK_FROZEN:x}",
    }


def read_facts(path: str) -> dict:
    """btf.facts of the BTF at path, read and parsed now."""
    return btf.facts(btf.Btf.read(path))


def plan(option: str | None, report_mask: int, path: str = btf.VMLINUX, facts=read_facts) -> Plan:
    """Which path to try. tp_btf needs the kernel's BTF with every member and
    tracepoint the programs read; without it auto takes the tracepoint path,
    and a --probes tp_btf run stops with what is missing. facts(path) gives
    what the programs take from the BTF (btf.facts), or raises BtfError."""
    choice = choice_of(option)
    try:
        got = facts(path)
        offsets, targets = got["offsets"], got["targets"]
    except btf.BtfError as e:
        if choice == TP_BTF:
            raise PstateError(f"--probes tp_btf: {e}", ExitCode.UNAVAILABLE,
                              hint="the kernel needs CONFIG_DEBUG_INFO_BTF=y (Linux 5.5 or later); "
                                   "--probes tracepoint works without it") from None
        if choice == TRACEPOINT:
            return Plan(TRACEPOINT, f"--probes tracepoint; no usable kernel BTF ({e}): classic lifecycle "
                                    "programs", forced=True)
        return Plan(TRACEPOINT, f"no usable kernel BTF ({e})")
    if choice == TRACEPOINT:
        return Plan(TRACEPOINT, "--probes tracepoint", forced=True, defines=life_raw_defines(offsets, targets))
    defines = {"TP_BTF": True, **offsets, **raw_state_defines(report_mask), **wake_list_defines(offsets, targets)}
    why = "--probes tp_btf" if choice == TP_BTF else f"the kernel has BTF ({path})"
    return Plan(TP_BTF, why, forced=choice == TP_BTF, defines=defines, targets=targets)


def life_raw_defines(offsets: dict, targets: dict | None = None) -> dict:
    """The -D settings of raw tracepoint lifecycle programs on the
    tracepoint path (LIFE_RAW, bpf/tpargs.h), from btf.facts' offsets, with
    the wake list's where the kernel has it (wake_list_defines)."""
    return {"LIFE_RAW": True, **{k: offsets[k] for k in LIFE_OFFSETS}, **wake_list_defines(offsets, targets or {})}


def wake_list_defines(offsets: dict, targets: dict) -> dict:
    """WAKE_AT_WAKEUP and the wake list's offsets (btf.wake_list), or
    nothing when the kernel lacks them: record then takes its wake-ups at
    sched_waking (bpf/record.bpf.c)."""
    event = btf.WAKE_LIST_TRACEPOINT[0]
    names = (*btf.WAKE_LIST_MEMBERS, *btf.WAKE_LIST_ENUMS)
    if not wake_list_wanted() or event not in targets or any(n not in offsets for n in names):
        return {}
    return {"WAKE_AT_WAKEUP": True, **{n: offsets[n] for n in names}}


def wake_list_wanted() -> bool:
    """False when PSTATE_WAKE_LIST=off asks for the sched_waking path."""
    value = os.environ.get(WAKE_LIST_ENV, "auto")
    if value not in ("auto", "off"):
        raise PstateError(f"{WAKE_LIST_ENV}={value!r} is not auto or off", ExitCode.USAGE,
                          hint=f"unset {WAKE_LIST_ENV}, or set it to off")
    return value == "auto"


def active_source(text: str, defines: dict) -> str:
    """text with the lines that `defines` (the -D settings: a name is defined
    unless its value is None or False) leave out of an #ifdef or #ifndef
    blanked, so that probes_in() names only the programs that compile; the
    text's own #define and #undef lines count from where they stand. An #if
    or #elif keeps every branch (no probe is put under one)."""
    defined = {k for k, v in defines.items() if v is not None and v is not False}
    stack: list[tuple[bool, bool]] = []  # (this branch kept, the #if's branches are all kept)
    out = []
    for line in text.split("\n"):
        m = _COND.match(line)
        outer = all(kept for kept, _ in stack)
        if m:
            kind, name = m.groups()
            if kind == "define" and outer:
                defined.add(name)
            elif kind == "undef" and outer:
                defined.discard(name)
            elif kind in ("ifdef", "ifndef"):
                stack.append(((name in defined) == (kind == "ifdef"), False))
            elif kind == "if":
                stack.append((True, True))
            elif kind in ("else", "elif") and stack:
                kept, both = stack[-1]
                stack[-1] = (both or not kept, both)
            elif kind == "endif" and stack:
                stack.pop()
            out.append(line)
            continue
        out.append(line if outer else "")
    return "\n".join(out)


def fallback(p: Plan, why: str) -> Plan:
    """The tracepoint plan after the kernel refused the tp_btf one: every
    program a classic tracepoint (a kernel that refuses tp_btf programs may
    have a BTF that pstate does not read right)."""
    return Plan(TRACEPOINT, f"the kernel refused the tp_btf programs: {why}")


def probes_in(text: str) -> list[str]:
    """The events a source attaches through PSTATE_PROBE or PSTATE_LIFE (tp_btf on that path)."""
    return [event for _cat, event in _PROBE.findall(text)]


def load_one(insns: bytes, name: str, btf_id: int, license: str = "GPL", kern_version: int = 0) -> int:
    """Load a tp_btf program; its fd, or Refused with the verifier's last words."""
    fd, _ = bpfsys.prog_load(bpfsys.PROG_TRACING, insns, license, kern_version, name, attach_btf_id=btf_id)
    if fd >= 0:
        return fd
    err = os.strerror(-fd)
    _, log = bpfsys.prog_load(bpfsys.PROG_TRACING, insns, license, kern_version, name, log_size=1 << 22,
                              attach_btf_id=btf_id)
    last = " / ".join(line for line in log.strip().splitlines()[-3:] if line)
    raise Refused(f"{name}: {err}" + (f" ({last})" if last else ""))


def attach_one(prog_fd: int, name: str) -> int:
    """Attach a loaded tp_btf program; the link fd (closing it detaches), or Refused."""
    try:
        return bpfsys.attach_raw_tracepoint(prog_fd, None)
    except OSError as e:
        raise Refused(f"{name}: attaching failed: {e.strerror}") from None


class Attached:
    """The tp_btf programs of one compiled module, loaded and attached."""

    def __init__(self):
        self.prog_fds: dict[str, int] = {}  # event -> program fd
        self.link_fds: dict[str, int] = {}  # event -> link fd

    def detach(self) -> None:
        for fd in self.link_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.link_fds.clear()

    def close(self) -> None:
        self.detach()
        for fd in self.prog_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.prog_fds.clear()


def attach_module(bpf, text: str, targets: dict) -> Attached:
    """Load and attach every PSTATE_PROBE function of a BCC module compiled
    with TP_BTF; Refused (with everything closed again) if the kernel will not."""
    out = Attached()
    try:
        for event in probes_in(text):
            if event not in targets:
                raise Refused(f"no BTF attach target for {event}")
            name = PREFIX + event
            insns = bytes(bpf.dump_func(name.encode()))
            out.prog_fds[event] = load_one(insns, name, targets[event])
        for event, fd in out.prog_fds.items():
            out.link_fds[event] = attach_one(fd, PREFIX + event)
    except BaseException:
        out.close()
        raise
    return out

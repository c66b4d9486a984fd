"""How record's and snap's programs are attached on this kernel: the plan,
made per tracepoint.

Each tracepoint a program reads (its PSTATE_PROBE functions, bpf/tpargs.h)
is taken one of three ways:

- tp_btf: a BTF-typed raw tracepoint program. It gets the tracepoint's raw
  arguments with no trace record built, and reads task_struct with plain
  loads at offsets from the kernel's BTF (pstate.kernel.btf): the cheapest.
- raw_tracepoint: the same raw arguments, task fields read with
  bpf_probe_read_kernel at the same offsets. For the lifecycle tracepoints
  (and csd_queue_cpu) where tp_btf cannot be had: unlike a classic
  tracepoint's program it does not keep an interrupt's classic programs from
  running on its CPU.
- tracepoint: a classic tracepoint, whose trace record BCC lays out from the
  tracefs format file. Needs no BTF.

What decides is what the kernel has, never its version: each tracepoint's
BTF prototype (its arguments, in order, with their types) and the fields of
its classic record (the tracefs format file on a running kernel; the
`trace_event_raw_*` struct of the BTF when a kernel is planned from its BTF
alone, as the kernel matrix does), and the members of kernel structs the
program would read. An argument a kernel lacks is served another way where
one exists (TRACEPOINTS: `instead`): sched_switch's prev_state (Linux 5.18)
is read from the task's state, as older kernels' own tracepoint did;
sched_process_exit's group_dead is derived from the process's count of live
threads. A tracepoint that cannot be taken as tp_btf goes on the raw or the
classic path while the others stay on tp_btf; the plan says which, and why.

`--probes auto|tp_btf|tracepoint` (or PSTATE_PROBES) chooses: auto takes the
best way each tracepoint allows; tp_btf insists on it for every one and
names each gap; tracepoint takes the classic tracepoints for sched_switch and
the wake-ups, and the raw ones for the rest where the BTF allows. A program
the kernel refuses to load as tp_btf (its verifier) is planned again with
that tracepoint classic (refused: a kernel that refuses it may have a BTF
pstate does not read right, so no BTF offset is taken on trust for it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import btf

AUTO, TP_BTF, RAW, TRACEPOINT = "auto", "tp_btf", "raw_tracepoint", "tracepoint"
CHOICES = (AUTO, TP_BTF, TRACEPOINT)
PATHS = (TP_BTF, RAW, TRACEPOINT)
# -DPATH_<event>=N: the path codes of bpf/tpargs.h (PSTATE_TP_BTF ...)
PATH_CODES = {TP_BTF: 1, RAW: 2, TRACEPOINT: 3}
ENV = "PSTATE_PROBES"
# "off": record takes its wake-ups at sched_waking even where the kernel has
# the wake list: the path of older kernels, kept testable
WAKE_LIST_ENV = "PSTATE_WAKE_LIST"
MIXED = "mixed"  # Plan.path of a plan whose tracepoints are not all on one path
META_FIELDS = ("probes", "probes_reason", "probe_paths", "probe_notes", "on_cpu_time")  # Plan.meta()'s

TASK = "struct task_struct *"
CGROUP_CHAIN = ("TASK_CGROUPS", "CSS_SET_DFL_CGRP", "CGROUP_KN", "KERNFS_NODE_ID")


@dataclass(frozen=True)
class Instead:
    """How a kernel without an argument or field is served: the -D setting
    that tells the program, the BTF members it then reads, and what the
    plan says of it."""

    define: str
    members: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class Arg:
    """A raw argument a program reads (ctx[index] on the tp_btf path,
    ctx->args[index] on the raw one), with the types it may have."""

    index: int
    name: str
    types: tuple[str, ...]
    instead: Instead | None = None  # where a kernel lacks it
    optional: bool = False  # may be missing with no way instead (the program then does without)
    present: str = ""  # the -D setting that says the kernel has it (an optional one)
    unknown: str = ""  # what an optional one missing, with no way instead, changes


@dataclass(frozen=True)
class Tracepoint:
    event: str
    category: str
    paths: tuple[str, ...]  # the ways it may be taken, best first
    args: tuple[Arg, ...]  # raw arguments read on the tp_btf and raw paths
    members: tuple[str, ...]  # BTF members (btf.MEMBERS) read on those paths
    fields: tuple[str, ...]  # classic record fields read
    enums: tuple[str, ...] = ()  # BTF enumerators (btf.ENUMS) read
    # classic record fields the programs read where the kernel has them:
    # field -> (the -D setting that says so, the Instead where it lacks
    # them, what lacking both changes)
    optional_fields: dict = field(default_factory=dict)
    hot: bool = False  # sched_switch and the wake-ups: on every context switch


STATE_FROM_TASK = Instead(
    "SW_STATE_FROM_TASK", ("TASK_STATE",),
    "sched_switch has no prev_state argument: the state is read from the task (task_struct.state), "
    "as the kernel's own tracepoint reads it there")
GROUP_DEAD_FROM_SIGNAL = Instead(
    "EXIT_GROUP_DEAD_FROM_SIGNAL", ("TASK_SIGNAL", "SIGNAL_LIVE"),
    "sched_process_exit has no group_dead: it is derived from the process's count of live threads "
    "(signal->live), the first thread to see it at 0 taking it")
GROUP_DEAD_UNKNOWN = ("sched_process_exit has no group_dead, and the kernel's BTF lacks what derives it: "
                      "exit records say group_dead false")
_WAKE_ARGS = (Arg(0, "p", (TASK,)),)
_WAKE_MEMBERS = ("TASK_PID", "TASK_TGID", "TASK_CPU", "TASK_COMM", *CGROUP_CHAIN)
_WAKE_FIELDS = ("pid", "target_cpu", "comm")
_LIFE = (TP_BTF, RAW, TRACEPOINT)

# Every tracepoint record and snap attach through the plan (the interrupt
# marks are raw tracepoints on every kernel: they read no argument but
# hrtimer's, whose softness is optional).
TRACEPOINTS = {t.event: t for t in (
    Tracepoint("sched_switch", "sched", (TP_BTF, TRACEPOINT),
               (Arg(0, "preempt", ("_Bool",)), Arg(1, "prev", (TASK,)), Arg(2, "next", (TASK,)),
                Arg(3, "prev_state", ("unsigned int",), instead=STATE_FROM_TASK)),
               ("TASK_PID", "TASK_TGID", "TASK_PRIO", "TASK_COMM", "TASK_EXIT_STATE", *CGROUP_CHAIN),
               ("prev_pid", "next_pid", "prev_prio", "next_prio", "prev_state", "prev_comm", "next_comm"),
               hot=True),
    Tracepoint("sched_waking", "sched", (TP_BTF, TRACEPOINT), _WAKE_ARGS, _WAKE_MEMBERS, _WAKE_FIELDS, hot=True),
    Tracepoint("sched_wakeup", "sched", (TP_BTF, TRACEPOINT), _WAKE_ARGS, _WAKE_MEMBERS, _WAKE_FIELDS, hot=True),
    Tracepoint("sched_wakeup_new", "sched", (TP_BTF, TRACEPOINT), _WAKE_ARGS, _WAKE_MEMBERS, _WAKE_FIELDS,
               hot=True),
    Tracepoint("task_newtask", "task", _LIFE,
               (Arg(0, "task", (TASK,)), Arg(1, "clone_flags", ("long long unsigned int", "long unsigned int"))),
               ("TASK_PID", "TASK_COMM"), ("pid", "clone_flags", "comm")),
    Tracepoint("sched_process_fork", "sched", _LIFE, (Arg(0, "parent", (TASK,)), Arg(1, "child", (TASK,))),
               ("TASK_PID",), ("parent_pid", "child_pid")),
    Tracepoint("sched_process_exec", "sched", _LIFE, (Arg(0, "p", (TASK,)), Arg(1, "old_pid", ("int",))),
               (), ("pid", "old_pid")),
    Tracepoint("sched_process_exit", "sched", _LIFE,
               (Arg(0, "p", (TASK,)), Arg(1, "group_dead", ("_Bool",), instead=GROUP_DEAD_FROM_SIGNAL,
                                          optional=True, present="EXIT_GROUP_DEAD_ARG", unknown=GROUP_DEAD_UNKNOWN)),
               (), ("pid",),
               optional_fields={"group_dead": ("EXIT_GROUP_DEAD_FIELD", GROUP_DEAD_FROM_SIGNAL, GROUP_DEAD_UNKNOWN)}),
    Tracepoint("sched_process_free", "sched", _LIFE, (Arg(0, "p", (TASK,)),),
               ("TASK_PID", "TASK_COMM", *CGROUP_CHAIN), ("pid", "comm")),
    # record's followed tasks moved between run queues (the per-CPU counts
    # of --antagonists): with rq locks held and interrupts off, so any path
    Tracepoint("sched_migrate_task", "sched", _LIFE, (Arg(0, "p", (TASK,)), Arg(1, "dest_cpu", ("int",))),
               ("TASK_PID",), ("pid", "dest_cpu")),
    # the wake list's waker (record's WAKE_AT_WAKEUP): never a classic
    # tracepoint (bpf/record.bpf.c says why)
    Tracepoint("csd_queue_cpu", "csd", (TP_BTF, RAW),
               (Arg(0, "cpu", ("unsigned int",)), Arg(1, "callsite", ("long unsigned int",)),
                Arg(2, "func", ("prototype *",)), Arg(3, "csd", ("struct __call_single_data *",))),
               ("TASK_WAKE_ENTRY", "TASK_PID", "CSD_FLAGS"), (), enums=("CSD_TYPE_TTWU", "CSD_TYPE_MASK")),
)}
WAKE_EVENTS = ("sched_waking", "sched_wakeup", "sched_wakeup_new")  # one set of accessors (WK_*): one path
# record's wake-ups at sched_wakeup need these (btf.MEMBERS, btf.ENUMS), and csd_queue_cpu
WAKE_LIST_EVENT = "csd_queue_cpu"
# members read where the kernel has them, whatever the path: by programs
# that are no tracepoint of the plan (record's hrtimer marks), and the
# task's own on-CPU time, which record's and snap's sched_switch read from
# the task on the tp_btf path and from the current task on the classic one
# (without it, on-CPU time is wall time alone: on_cpu_clock)
EXTRA_MEMBERS = ("HRTIMER_IS_SOFT", "TASK_SUM_EXEC")

# The kernel's task state bits (include/linux/sched.h) that sched_switch's
# format folds into the state it reports; #defines, so in no BTF.
# TASK_RTLOCK_WAIT (Linux 5.15) and TASK_FROZEN (6.1) are reported as
# uninterruptible; on a kernel without them the bits are never set in a
# task's state (5.10 has neither: its highest state bit is 0x800), so the
# fold changes nothing there. The reported bits themselves come from the
# format's print_fmt (pstate.kernel.kstates).
TASK_UNINTERRUPTIBLE = 0x0002
TASK_NOLOAD = 0x0400
TASK_RTLOCK_WAIT = 0x1000
TASK_FROZEN = 0x8000


class Refused(Exception):
    """The kernel would not load or attach tp_btf programs: event -> why."""

    def __init__(self, why: dict):
        super().__init__("; ".join(why.values()))
        self.why = dict(why)

    @property
    def events(self) -> tuple:
        return tuple(self.why)


@dataclass
class Kernel:
    """What a plan is made from. btf: btf.facts() of the kernel's BTF, or
    None (btf_error says why); records(event): the fields of the event's
    classic record (name -> type), or None when it has no such tracepoint."""

    btf: dict | None
    btf_error: str = ""
    records: object = None  # callable event -> dict | None

    @classmethod
    def from_btf_facts(cls, facts: dict) -> "Kernel":
        """A kernel known by its BTF alone (the kernel matrix's committed
        BTF): its classic records from the BTF's trace_event_raw structs."""
        return cls(facts, "", lambda event: facts.get("records", {}).get(event))


@dataclass
class Plan:
    """Per tracepoint, how a program attaches on this kernel, and why."""

    choice: str
    paths: dict  # event -> TP_BTF | RAW | TRACEPOINT, every tracepoint the program attaches
    why: dict  # event -> why it is not on tp_btf (absent where it is)
    notes: list  # how a kernel difference is served (Instead.note), once each
    defines: dict  # the -D settings of the plan
    targets: dict  # event -> BTF id of btf_trace_<event>, for the tp_btf ones
    refused: frozenset = frozenset()  # events the kernel refused as tp_btf

    @property
    def forced(self) -> bool:
        """Asked for by name (--probes): no fallback."""
        return self.choice != AUTO

    @property
    def path(self) -> str:
        """One word for the plan: the path of every tracepoint when they
        share one; tracepoint when sched_switch and the wake-ups are classic
        and the rest raw (--probes tracepoint on a kernel with BTF); else mixed."""
        kinds = set(self.paths.values())
        if len(kinds) == 1:
            return kinds.pop()
        if all(p == TRACEPOINT for e, p in self.paths.items() if TRACEPOINTS[e].hot) and TP_BTF not in kinds:
            return TRACEPOINT
        return MIXED

    @property
    def life(self) -> str:
        """How the lifecycle programs attach (tp_btf, raw_tracepoint,
        tracepoint or mixed)."""
        kinds = {p for e, p in self.paths.items() if not TRACEPOINTS[e].hot and e != WAKE_LIST_EVENT}
        return kinds.pop() if len(kinds) == 1 else MIXED

    @property
    def wake_list(self) -> bool:
        return bool(self.defines.get("WAKE_AT_WAKEUP"))

    @property
    def reason(self) -> str:
        """Why the plan is what it is, in a line."""
        head = {AUTO: "auto", TP_BTF: "--probes tp_btf", TRACEPOINT: "--probes tracepoint"}[self.choice]
        gaps = [f"{e}: {w}" for e, w in self.why.items() if w != head]
        return head + (f" ({'; '.join(gaps)})" if gaps else "")

    def meta(self) -> dict:
        """The plan's fields of a meta record (pstate-events(5))."""
        return {"probes": self.path, "probes_reason": self.reason, "probe_paths": dict(self.paths),
                "probe_notes": list(self.notes), "on_cpu_time": on_cpu_clock(self.defines)}


def on_cpu_clock(defines: dict) -> str:
    """What on-CPU time is on a plan with these -D settings: kernel (the
    task's own se.sum_exec_runtime, read at switch-in and switch-out: steal
    and interrupt time the kernel accounts apart are record's switch-outs'
    steal_irq_ns, snap rows' steal_irq_ns) or wall (the time between the two, where the kernel's BTF
    has no offset for it)."""
    return "kernel" if "TASK_SUM_EXEC" in defines else "wall"


def choice_of(option: str | None) -> str:
    """The --probes value, or PSTATE_PROBES, or auto."""
    value = option or os.environ.get(ENV) or AUTO
    if value not in CHOICES:
        raise PstateError(f"{ENV}={value!r} is not one of {', '.join(CHOICES)}", ExitCode.USAGE)
    return value


def wake_list_wanted() -> bool:
    """False when PSTATE_WAKE_LIST=off asks for the sched_waking path."""
    value = os.environ.get(WAKE_LIST_ENV, "auto")
    if value not in ("auto", "off"):
        raise PstateError(f"{WAKE_LIST_ENV}={value!r} is not auto or off", ExitCode.USAGE,
                          hint=f"unset {WAKE_LIST_ENV}, or set it to off")
    return value == "auto"


def raw_state_defines(report_mask: int) -> dict:
    """The -D settings reported_switch_state() needs on the tp_btf path,
    from the reported mask (print_fmt's state bits, the idle bit highest)."""
    report_max = report_mask + 1  # the preemption bit
    return {
        "RAW_TASK_REPORT": f"0x{(report_max >> 1) - 1:x}",
        "RAW_REPORT_IDLE": f"0x{report_max >> 1:x}",
        "RAW_REPORT_MAX": f"0x{report_max:x}",
        "RAW_TASK_IDLE": f"0x{TASK_UNINTERRUPTIBLE | TASK_NOLOAD:x}",
        "RAW_UNINTERRUPTIBLE": f"0x{TASK_UNINTERRUPTIBLE:x}",
        "RAW_AS_UNINTERRUPTIBLE": f"0x{TASK_RTLOCK_WAIT | TASK_FROZEN:x}",
    }


# --- one tracepoint ------------------------------------------------------------

def _missing_members(names, facts: dict) -> list[str]:
    return [n for n in names if n not in facts["members"]]


def _member_text(define: str) -> str:
    struct_name, spellings, _sizes = btf.MEMBERS[define]
    return f"{struct_name}.{spellings[0]}"


@dataclass
class Fit:
    """How a tracepoint fits one path on a kernel: gap says why it cannot
    (None: it can); defines and notes, how its differences are served."""

    gap: str | None
    defines: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)


def _instead(way: Instead | None, facts: dict | None) -> Fit | None:
    """The way a missing argument or field is served on this kernel, or None."""
    if way and facts is not None and not _missing_members(way.members, facts):
        return Fit(None, {way.define: True}, [way.note])
    return None


def btf_fit(tp: Tracepoint, kernel: Kernel) -> Fit:
    """Whether tp can be taken as tp_btf or raw on this kernel."""
    facts = kernel.btf
    if facts is None:
        return Fit(f"no usable kernel BTF ({kernel.btf_error})")
    have = facts["tracepoints"].get(tp.event)
    if have is None:
        return Fit(f"the kernel's BTF has no tracepoint {tp.event} (btf_trace_{tp.event})")
    args, out = have["args"], Fit(None)
    for a in tp.args:
        if a.index < len(args):
            if args[a.index] not in a.types:
                return Fit(f"{tp.event}'s {a.name} is {args[a.index]}, the programs read {a.types[0]}")
            if a.present:
                out.defines[a.present] = True
            continue
        way = _instead(a.instead, facts)
        if way:
            out.defines.update(way.defines)
            out.notes += way.notes
        elif a.optional:
            out.notes.append(a.unknown)
        else:
            lacks = f", and the kernel's BTF lacks {', '.join(map(_member_text, a.instead.members))}" if a.instead else ""
            return Fit(f"{tp.event} has no {a.name} argument{lacks}")
    missing = _missing_members(tp.members, facts) + [e for e in tp.enums if e not in facts["enums"]]
    if missing:
        return Fit("the kernel's BTF lacks " + ", ".join(_member_text(m) if m in btf.MEMBERS else m for m in missing))
    return out


def classic_fit(tp: Tracepoint, kernel: Kernel) -> Fit:
    """Whether tp can be taken as a classic tracepoint on this kernel."""
    fields = kernel.records(tp.event) if kernel.records else None
    if fields is None:
        return Fit(f"the kernel has no tracepoint {tp.category}:{tp.event}")
    missing = [f for f in tp.fields if f not in fields]
    if missing:
        return Fit(f"{tp.category}:{tp.event} has no field {', '.join(missing)}")
    out = Fit(None)
    for name, (present, way, unknown) in tp.optional_fields.items():
        if name in fields:
            out.defines[present] = True
        elif _instead(way, kernel.btf):
            out.defines[way.define] = True
            out.notes.append(way.note)
        else:
            out.notes.append(unknown)
    if tp.event == "sched_process_free" and str(fields.get("comm", "")).startswith("__data_loc"):
        out.defines["FREE_COMM_DATA_LOC"] = True
    return out


def _fit(tp: Tracepoint, path: str, kernel: Kernel) -> Fit:
    return classic_fit(tp, kernel) if path == TRACEPOINT else btf_fit(tp, kernel)


def _preference(tp: Tracepoint, choice: str, refused: bool) -> tuple[str, ...]:
    """The paths to try for tp, best first."""
    if refused:
        return tuple(p for p in tp.paths if p == TRACEPOINT)
    if choice == TP_BTF:
        return (TP_BTF,)
    if choice == TRACEPOINT:
        # classic where the tracepoint is hot; raw for the rest where it can
        return (TRACEPOINT,) if tp.hot else tuple(p for p in tp.paths if p != TP_BTF)
    return tp.paths


def _choose(tp: Tracepoint, choice: str, kernel: Kernel, refused: bool) -> tuple[str | None, str, Fit]:
    """(path or None, why it is not tp_btf ('' when it is, or the gap of
    the first path tried when none can be had), its Fit there)."""
    first_gap = ""
    for path in _preference(tp, choice, refused):
        fit = _fit(tp, path, kernel)
        if fit.gap is None:
            if path == TP_BTF:
                return path, "", fit
            if refused:
                why = "the kernel refused it as tp_btf"
            elif first_gap:  # a better path of those tried cannot be had
                why = first_gap
            elif choice == TRACEPOINT:
                why = "--probes tracepoint"
            else:
                why = btf_fit(tp, kernel).gap or ""
            return path, why, fit
        first_gap = first_gap or fit.gap
    if refused:
        first_gap = "the kernel refused it as tp_btf" + (f"; {first_gap}" if first_gap else "")
    return None, first_gap, Fit(first_gap)


# --- a program -------------------------------------------------------------------

def wake_list_defines(kernel: Kernel, choice: str, refused: frozenset = frozenset()) -> dict:
    """WAKE_AT_WAKEUP and the wake list's offsets and constants, or nothing
    when this kernel (or PSTATE_WAKE_LIST=off) leaves record's wake-ups at
    sched_waking (bpf/record.bpf.c)."""
    if not wake_list_wanted() or kernel.btf is None:
        return {}
    for event in (WAKE_LIST_EVENT, "sched_wakeup"):
        if _choose(TRACEPOINTS[event], choice, kernel, event in refused)[0] is None:
            return {}
    return {"WAKE_AT_WAKEUP": True}


def _offsets(kernel: Kernel) -> dict:
    """Every member offset (and size) and enumerator the kernel's BTF has, as -D settings."""
    if kernel.btf is None:
        return {}
    out = {}
    for name, (off, size) in kernel.btf["members"].items():
        out[name] = off
        if name == "TASK_STATE":
            out["TASK_STATE_SIZE"] = size
    out.update(kernel.btf["enums"])
    return dict(sorted(out.items()))


def plan(events_of, choice: str, kernel: Kernel, report_mask: int, refused: frozenset = frozenset()) -> Plan:
    """The plan of a program. events_of(defines) names the tracepoints the
    program attaches with those -D settings (tpbtf.probes_in of its source,
    its #ifdefs settled): record's wake-ups depend on the wake list's.
    PstateError when a tracepoint can be had no way, or --probes tp_btf
    cannot have one as tp_btf: the message names each gap."""
    defines = dict(wake_list_defines(kernel, choice, refused))
    events = list(events_of(defines))
    if WAKE_LIST_EVENT not in events:  # a program without the wake list's waker (snap)
        defines = {}
        events = list(events_of(defines))
    paths, why, notes, targets, gaps = {}, {}, [], {}, []
    groups = _shared_paths(events)
    for event in events:
        tp = TRACEPOINTS[event]
        path, reason, fit = _choose(tp, choice, kernel, bool(refused & groups.get(event, {event})))
        if path is None:
            gaps.append(f"{event}: {reason}")
            continue
        paths[event] = path
        if reason:
            why[event] = reason
        defines.update(fit.defines)
        notes += [n for n in fit.notes if n not in notes]
        if path == TP_BTF:
            targets[event] = kernel.btf["tracepoints"][event]["target"]
    # the wake-ups read through one set of accessors: the lowest path of any is theirs
    wake = [e for e in events if e in WAKE_EVENTS and e in paths]
    if len({paths[e] for e in wake}) > 1:
        for e in wake:
            if paths[e] == TP_BTF:
                paths[e] = TRACEPOINT
                why[e] = "another wake-up tracepoint cannot be taken as tp_btf"
                targets.pop(e, None)
    if gaps:
        if choice == TP_BTF:
            raise PstateError("--probes tp_btf: " + "; ".join(gaps), ExitCode.UNAVAILABLE,
                              hint="--probes auto takes each tracepoint the best way this kernel allows")
        raise PstateError("this kernel cannot attach: " + "; ".join(gaps), ExitCode.UNAVAILABLE,
                          hint="run `pstate doctor`")
    for event, path in paths.items():
        defines[f"PATH_{event}"] = PATH_CODES[path]
    if kernel.btf is not None and any(p != TRACEPOINT for p in paths.values()):
        defines.update(_offsets(kernel))
    elif kernel.btf is not None:
        defines.update({k: v for k, v in _offsets(kernel).items() if k in EXTRA_MEMBERS})
    if paths.get("sched_switch") == TP_BTF:
        defines.update(raw_state_defines(report_mask))
    return Plan(choice, paths, why, notes, defines, targets, refused)


def _shared_paths(events) -> dict:
    """event -> the events that share its path (the wake-ups)."""
    wake = frozenset(e for e in events if e in WAKE_EVENTS)
    return {e: wake for e in wake}


# --- the running kernel ------------------------------------------------------------

_FIELD = re.compile(r"^\s*field:(.*?)\s+([A-Za-z_]\w*)(\[\d*\])?;", re.M)


def format_fields(text: str) -> dict[str, str]:
    """The fields of a tracefs format file: name -> type ("char[16]",
    "__data_loc char[]", "pid_t"...), the common_ ones left out."""
    out = {}
    for typ, name, dims in _FIELD.findall(text):
        if name.startswith("common_"):
            continue
        out[name] = f"{typ.strip()}{dims}" if not typ.startswith("__data_loc") else "__data_loc char[]"
    return out


def tracefs_records(tracefs: str):
    """records(event) of the running kernel, from its tracefs format files."""
    def records(event: str) -> dict | None:
        tp = TRACEPOINTS.get(event)
        if tp is None:
            return None
        try:
            with open(os.path.join(tracefs, "events", tp.category, event, "format")) as f:
                return format_fields(f.read())
        except OSError:
            return None
    return records

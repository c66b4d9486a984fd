"""The pstate event format, version 1: record types, fields and the state vocabulary.

This module is the single source of truth for the format. Writers (record,
replay, snap) build records with these names, readers validate against them,
and man/pstate-events.5 is generated from the tables below.

Every line is one flat JSON object with a "type". A stream starts with a
"meta" header and ends with an "end" trailer; "loss" records appear in-band
whenever events were dropped.
"""

from __future__ import annotations

SCHEMA_VERSION = 1

# --- states ---------------------------------------------------------------
# Names of the states a task can be in. The kernel-reported ones are decoded
# from the running kernel's sched_switch print_fmt (see kstates.py); this table
# only gives the kernel's letters readable names, as /proc/PID/status does.

RUNNING = "running"
RUNNABLE = "runnable"
PREEMPTED = "preempted"
NEW = "new"
REAPED = "reaped"
UNKNOWN = "unknown"

# name -> (letter, category, description). Category groups states for summaries:
#   cpu: on a CPU; wait: runnable, waiting for a CPU; blocked: waiting for an
#   event; stopped: stopped by a signal or a tracer; dead: exiting or gone.
STATES: dict[str, tuple[str, str, str]] = {
    RUNNING: ("R", "cpu", "on a CPU"),
    RUNNABLE: ("R", "wait", "woken up, waiting in a run queue for a CPU"),
    PREEMPTED: ("R+", "wait", "switched out against its will (R or R+), still runnable"),
    NEW: ("N", "wait", "created by fork/clone, not yet woken for the first time"),
    "sleeping": ("S", "blocked", "interruptible sleep (TASK_INTERRUPTIBLE)"),
    "uninterruptible": ("D", "blocked", "uninterruptible sleep, usually I/O (TASK_UNINTERRUPTIBLE)"),
    "stopped": ("T", "stopped", "stopped by a signal such as SIGSTOP (__TASK_STOPPED)"),
    "traced": ("t", "stopped", "stopped by a tracer such as ptrace (__TASK_TRACED)"),
    "dead": ("X", "dead", "exited and reaped at once, final switch-out (EXIT_DEAD)"),
    "zombie": ("Z", "dead", "exited, waiting for its parent to reap it (EXIT_ZOMBIE)"),
    "parked": ("P", "blocked", "kthread parked (TASK_PARKED)"),
    "idle": ("I", "blocked", "idle kernel thread sleep (TASK_IDLE)"),
    REAPED: ("-", "dead", "task freed by the kernel; its last record"),
    UNKNOWN: ("?", "unknown", "state before pstate started watching the task"),
}

# Kernel letter -> state name, for letters decoded from print_fmt. A letter a
# future kernel adds and this table lacks is named "state_<letter>".
LETTER_NAMES: dict[str, str] = {
    letter: name
    for name, (letter, _cat, _desc) in STATES.items()
    if name not in (RUNNING, RUNNABLE, PREEMPTED, NEW, REAPED, UNKNOWN)
}
# Older kernels report these too.
LETTER_NAMES.update({"W": "waking", "K": "wakekill", "N": "noload", "x": "dead"})

# Letter -> state name for options that take a state by its letter (--state D,
# --stacks D): every named state but unknown; R is running (the runnable and
# preempted states share it).
STATE_LETTERS: dict[str, str] = {letter: name for name, (letter, _c, _d) in STATES.items()
                                 if name not in (UNKNOWN, RUNNABLE, PREEMPTED)}

WAIT_STATES = frozenset({RUNNABLE, PREEMPTED, NEW})
BLOCKED_CATEGORIES = frozenset({"blocked", "stopped"})


def letter_name(letter: str) -> str:
    return LETTER_NAMES.get(letter, f"state_{letter}")


def state_category(name: str) -> str:
    info = STATES.get(name)
    return info[1] if info else "blocked"


# --- causes: which kernel event made a state transition --------------------
CAUSES = {
    "switch_out": "sched_switch: the task left the CPU (from is running)",
    "switch_in": "sched_switch: the task got a CPU (to is running); dur_ns is its run-queue wait",
    "wakeup": ("sched_wakeup (sched_waking before Linux 6.5 or without BTF): a blocked task was woken (runnable "
               "from now); dur_ns is the time it was blocked"),
    "wakeup_new": "sched_wakeup_new: a new task became runnable for the first time",
    "reap": ("sched_process_free: the kernel freed the task (after zombie or dead), in an RCU callback "
             "after its reaping, usually within 100 ms; until then the task stays in its final state, "
             "and so does a task whose free was not traced"),
}

# --- record types and their fields ------------------------------------------
# field -> (JSON type, description). "?" after a type: may be null or absent.

COMMON_FIELDS = {
    "type": ("string", "record type"),
    "ts": ("int", "CLOCK_MONOTONIC time of the event, ns (bpf_ktime_get_ns)"),
}

TASK_FIELDS = {
    "cpu": ("int", "CPU the event happened on"),
    "pid": ("int", "process id (tgid) of the task; 0 when unknown (on the tracepoint path only: a thread "
                   "first seen as it is switched in or woken)"),
    "tid": ("int", "thread id of the task (the kernel's pid)"),
    "comm": ("string", "task name (comm), at most 15 bytes"),
}

RECORDS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "meta": (
        "first line of every stream and snapshot: what wrote it, where, and how to read it",
        {
            "schema": ("int", "format version; readers refuse a newer major version"),
            "source": ("string", "record, replay or snap"),
            "tool": ("string", "always pstate"),
            "version": ("string", "pstate version that wrote the stream"),
            "host": ("string", "host name"),
            "kernel": ("string", "kernel release (uname -r)"),
            "boot_id": ("string", "/proc/sys/kernel/random/boot_id; timestamps compare only within one boot"),
            "clock": ("string", "always monotonic: ts fields are CLOCK_MONOTONIC ns"),
            "ts": ("int", "CLOCK_MONOTONIC ns when the stream started"),
            "wall_ns": ("int", "wall-clock (UTC, ns since the epoch) at ts: wall = wall_ns + (t - ts)"),
            "wall_time": ("string", "the same instant as wall_ns, RFC 3339 UTC with nanoseconds "
                          "(2026-12-01T09:28:15.117604579Z), for tools whose JSON numbers are doubles"),
            "ncpu": ("int", "number of possible CPUs"),
            "states": ("object", "state vocabulary: name -> kernel letter"),
            "kernel_states": ("object", "kernel prev_state bit (hex) -> state name, from the running kernel's print_fmt"),
            "filter_pid": ("list?", "--pid values in force"),
            "filter_tid": ("list?", "--tid values in force"),
            "filter_comm": ("list?", "--comm values in force"),
            "filter_state": ("list?", "--state values in force"),
            "filter_cpu": ("list?", "--cpu values in force"),
            "filter_min_dur_ns": ("int?", "--min-dur in force, ns"),
            "filter_cgroup": ("list?", "--cgroup paths in force (each with everything below it)"),
            "filter_title": ("list?", "--title patterns in force (replay, stats, heat, export)"),
            "filter_children": ("bool?", "record -p --children: the descendants of the -p processes are recorded too"),
            "filter_command": ("list?", "record -- CMD: the command (argv) whose processes were recorded"),
            "command_pid": ("int?", "record -- CMD: its pid"),
            "include_idle": ("bool", "whether the idle task (tid 0) is reported"),
            "pstate_pid": ("int", "process id of the pstate process that wrote the stream"),
            "buffer_bytes": ("int?", "record: size of the BPF ring buffer"),
            "max_rate": ("int?", "record: the --max-rate in force, events/s"),
            "probes": ("string?", "record, snap: how the programs attached, in a word: tp_btf (every "
                       "tracepoint), tracepoint (sched_switch and the wake-ups classic, the rest raw or classic) "
                       "or mixed; probe_paths says it per tracepoint (--probes)"),
            "probe_paths": ("object?", "record, snap: tracepoint -> how its program attached: tp_btf, "
                            "raw_tracepoint or tracepoint (classic)"),
            "probe_notes": ("list?", "record, snap: how what this kernel's tracepoints lack is served (e.g. "
                            "sched_switch without prev_state: the state is read from the task)"),
            "wakeups_at": ("string?", "record: the tracepoint wake-ups are taken at: sched_wakeup (as the task "
                           "is queued; Linux 6.5+ with BTF) or sched_waking (as the wake-up begins)"),
            "on_cpu_time": ("string?", "record, snap: what a switch_out's (record) or a task row's (snap) "
                            "steal_irq_ns rests on: kernel (the task's own "
                            "se.sum_exec_runtime, what /proc/PID/schedstat counts, read at switch-in and switch-out "
                            "at its offset in the kernel's BTF) or wall (the kernel's BTF gives no such offset, the "
                            "classic tracepoint path without BTF: on-CPU time is wall time alone, steal_irq_ns 0)"),
            "probes_reason": ("string?", "record, snap: --probes (auto, tp_btf or tracepoint), with why each "
                              "tracepoint not on tp_btf is not (what the kernel lacks, or its refusal)"),
            "replayed": ("bool?", "true when written by pstate replay (other fields keep the original's values)"),
            "replay_speed": ("float?", "replay: --speed, null with --no-wait"),
            "replay_begin_ts": ("int?", "replay: start of the --begin/--end window, ns"),
            "replay_end_ts": ("int?", "replay: end of the window (exclusive), ns"),
            "window_begin_ts": ("int?", "a cut stream (a replay --begin window, a file record started anew "
                                "on SIGHUP, a --flight dump): where its window begins, ns; readers clip every "
                                "duration reaching back before it"),
            "window_end_ts": ("int?", "a cut stream (replay --end, a --flight dump): where its window ends "
                              "(exclusive), ns; no time counts past it"),
            "replay_filter_*": ("list?", "replay: the filters replay applied (same names as filter_*)"),
            "replay_include_idle": ("bool?", "replay: --include-idle"),
        },
    ),
    "state": (
        "a state transition of one thread; dur_ns is the time spent in the state it left",
        {
            **TASK_FIELDS,
            "cgroup": ("int?", "the id of the task's own cgroup (v2; see the cgroup record) at the transition; "
                       "null when not known: on the tracepoint path for a task other than the running one "
                       "(switch_in, wakeup, wakeup_new), and for reap on either path"),
            "from": ("string", "state left"),
            "to": ("string", "state entered"),
            "dur_ns": ("int?", "time spent in from, ns; null when pstate did not see it start"),
            "cause": ("string", "kernel event behind the transition: " + ", ".join(CAUSES)),
            "prio": ("int?", "kernel priority of the task (switch_out, switch_in)"),
            "voluntary": ("bool?", "switch_out: true when the task blocked, false when preempted"),
            "kstate": ("string?", "switch_out: prev_state as the kernel prints it (R, R+, S, D, ...)"),
            "next_tid": ("int?", "switch_out: the thread that got the CPU"),
            "steal_irq_ns": ("int?", "switch_out: the part of dur_ns the kernel does not count as the task's own "
                             "on-CPU time (its se.sum_exec_runtime, as /proc/PID/schedstat): time stolen by the "
                             "hypervisor and spent in interrupts, where the kernel accounts them apart "
                             "(CONFIG_PARAVIRT_TIME_ACCOUNTING, CONFIG_IRQ_TIME_ACCOUNTING); dur_ns - steal_irq_ns "
                             "is the kernel's count. Per slice the kernel's run-queue clock, not read anew at every "
                             "switch, moves a few microseconds between a task and the next (a slice's value may be "
                             "below 0); a task's sum is exact. Absent where dur_ns is null (see run_ns) and "
                             "when not known: meta on_cpu_time wall, or on the classic tracepoint path the first "
                             "slice of a task seen (only the running task's count can be read there)"),
            "run_ns": ("int?", "switch_out whose switch-in was not seen (dur_ns null): the task's on-CPU time "
                       "by the kernel's count since the last switch of it that was (se.sum_exec_runtime grows "
                       "only while it runs); absent when not known"),
            "prev_tid": ("int?", "switch_in: the thread that left the CPU"),
            "waker_tid": ("int?", "wakeup: thread that woke this one (0: interrupt, see waker, or unknown)"),
            "waker_pid": ("int?", "wakeup: process of the waker (0 with waker_tid 0)"),
            "target_cpu": ("int?", "wakeup: the task's CPU when woken (it last ran there; the kernel then picks its run queue)"),
            "waker": ("string?", "wakeup: irq or softirq when woken from interrupt context (waker_tid is then 0); "
                      "absent when a task woke it"),
            "stack_id": ("int?", "wakeup, record --stacks: the stack record of the kernel stack the task blocked "
                         "with (the state in from); absent when not taken"),
            "reason": ("string?", "wakeup, with stack_id: the first function of that stack, from the leaf, that "
                       "is not scheduler plumbing (schedule, io_schedule, schedule_timeout, bit_wait_io, "
                       "wait_for_completion, ...: pstate.stream.vocab.PLUMBING), e.g. __iomap_dio_rw"),
        },
    ),
    "slice": (
        "record -p/-c/--cgroup (unless --no-antagonists): an on-CPU slice of a task the filters do not take, "
        "ended on a CPU while a task they take waits in that CPU's run queue (runnable or preempted): who "
        "held its CPU meanwhile (stats --antagonists); no time in state of its own",
        {
            **TASK_FIELDS,
            "dur_ns": ("int", "its time on the CPU, ns: the slice is [ts - dur_ns, ts]"),
            "next_tid": ("int", "the thread that got the CPU"),
        },
    ),
    "waker": (
        "record -p/-c/--cgroup: the name of a thread that woke a task (or queued a wake-up on another CPU's "
        "wake list), once per thread and again after it execs, so that wake-ups naming it by waker_tid name "
        "it though the filters leave its own records out (stats --wakers)",
        {
            **TASK_FIELDS,
        },
    ),
    "stack": (
        "record --stacks: a kernel stack that blocked tasks had, written once per distinct stack before the "
        "first wake-up naming it",
        {
            "stack_id": ("int", "the id state records name it by (unique within the stream)"),
            "frames": ("string", "the frames, root first, joined by ';' (the folded convention), each "
                       "function+0xoffset from /proc/kallsyms, then ' [module]' for a module's"),
        },
    ),
    "cgroup": (
        "record: a cgroup (v2) the stream meets for the first time, before the first record naming its id",
        {
            "cgroup": ("int", "the cgroup id (what bpf_get_current_cgroup_id gives: the inode number of its "
                       "directory on the cgroup v2 mount)"),
            "path": ("string?", "its path below the v2 mount, / for the root (e.g. /system.slice/nginx.service); "
                     "null when gone"),
            "gone": ("bool", "true when no cgroup had the id any more when pstate looked it up"),
        },
    ),
    "process": (
        "record: who a process is, read from /proc the first time the stream meets its pid, again once "
        "shortly after (titles are set after fork) and after its main thread changes its name (exec); "
        "a new record only when something changed",
        {
            "pid": ("int", "process id (tgid), as in the events"),
            "comm": ("string?", "the name of its main thread (/proc/PID/status); when gone, as the events "
                     "showed it, if they did"),
            "title": ("string?", "its process title: /proc/PID/cmdline, arguments joined by spaces (what ps "
                      "shows, e.g. 'postgres: checkpointer'); null for a kernel thread or when gone"),
            "exe": ("string?", "its executable (/proc/PID/exe); null for a kernel thread, when gone or unreadable"),
            "ppid": ("int?", "its parent's process id; null when gone"),
            "cgroup": ("int?", "the id of its cgroup (see the cgroup record); null when gone or without cgroup v2"),
            "ns_pid": ("int?", "its pid in its own pid namespace, when that is not the initial one"),
            "gone": ("bool", "true when the process had exited before pstate could read it: nothing else is known"),
            "why": ("string", "first (first sight), recheck (the second look) or exec (its main thread's name "
                    "changed)"),
        },
    ),
    "fork": (
        "a task created a process or a thread",
        {
            **TASK_FIELDS,
            "child_pid": ("int", "process id of the child (equals pid for a new thread)"),
            "child_tid": ("int", "thread id of the child"),
            "thread": ("bool", "true for a new thread (CLONE_THREAD), false for a new process"),
        },
    ),
    "exec": (
        "a task executed a new program; comm is the new name",
        {
            **TASK_FIELDS,
            "old_tid": ("int", "thread id before exec (differs when a non-leader thread exec'd)"),
        },
    ),
    "exit": (
        "a thread exited (the task then switches out as zombie or dead)",
        {
            **TASK_FIELDS,
            "group_dead": ("bool", "true when it was the last thread of its process"),
        },
    ),
    "loss": (
        "events were dropped since the previous loss record (one record per reason)",
        {
            "reason": ("string", "ringbuf_full, map_full, sampled (see --max-rate), skipped or unread"),
            "count": ("int", "events dropped for this reason (skipped: program runs the kernel skipped)"),
            "since_ts": ("int", "start of the window the count covers, ns"),
        },
    ),
    "rate": (
        "record --max-rate changed how events are kept: from ts on, keep one event in every sample_every",
        {
            "sample_every": ("int", "1 means every event is kept again"),
            "events_per_s": ("int", "event rate that triggered the change"),
        },
    ),
    "trigger": (
        "record --flight: what made this file be written, and the window it really covers (after the meta record)",
        {
            "ts": ("int", "when the trigger fired: the ts of the event that fired it, or of the signal"),
            "cause": ("string", "condition (a --trigger held) or signal (SIGUSR1)"),
            "condition": ("string?", "the --trigger condition that held, as given (D>=100ms)"),
            "signal": ("string?", "cause signal: the signal's name"),
            "pid": ("int?", "condition: process id (tgid) of the task whose event fired it"),
            "tid": ("int?", "condition: thread id of that task"),
            "comm": ("string?", "condition: its name"),
            "from": ("string?", "condition: the state its event left"),
            "to": ("string?", "condition: the state its event entered"),
            "dur_ns": ("int?", "condition: time spent in from, ns"),
            "window_begin_ts": ("int", "first instant the file covers, ns: --flight before ts, less when the "
                                "memory cap or the start of the run cut it"),
            "window_end_ts": ("int", "last instant the file covers, ns: --after past the last trigger it took in"),
            "flight_ns": ("int", "--flight: the window asked for before the trigger, ns"),
            "after_ns": ("int", "--after, ns"),
            "shrunk": ("bool", "true when --flight-memory pushed out events of the window asked for"),
            "triggers": ("int", "triggers this file took in: later ones inside its --after extended it"),
            "memory_bytes": ("int", "--flight-memory in force"),
        },
    ),
    "end": (
        "last line of a stream: why it ended and totals",
        {
            "reason": ("string", "duration, signal, eof, pipe or error; exit: record -- CMD's command exited; "
                       "a --flight file: flight, or stopped when the run ended during its --after"),
            "events": ("int", "state and lifecycle records written, and record's slice and waker records "
                       "(excluding meta, loss, rate, end and the annotations)"),
            "lost": ("int", "events dropped in total, all reasons"),
            "lost_ringbuf_full": ("int", "dropped: the BPF ring buffer was full (consumer too slow)"),
            "lost_map_full": ("int", "transitions whose task could not be tracked: task map full"),
            "lost_sampled": ("int", "dropped on purpose by --max-rate sampling"),
            "lost_skipped": ("int?", "record: runs of pstate's programs the kernel skipped, each a transition or "
                             "wake-up not seen: on the classic tracepoint path while another BPF program or a "
                             "bpf(2) map call of any process was under way on that CPU (the tp_btf path is not "
                             "skipped so); counted by Linux 6.7 and later"),
            "lost_unread": ("int", "left in the ring buffer when the final drain (at most 1 s) ended"),
            "kernel_events": ("int?", "record: events the kernel side tried to emit after its filters; "
                              "events + lost_ringbuf_full + lost_sampled + lost_unread equals it"),
            "clamped": ("int?", "record: durations clamped to 0 because their two timestamps, read on two CPUs, "
                        "came out of order (never wrapped around)"),
            "skipped_notes": ("int?", "record: runs the kernel skipped of the programs that only note context "
                              "for other records (the waker of a wake-up queued on another CPU's wake list, "
                              "interrupt entry and exit, a followed task's move to another run queue), one "
                              "already running on that CPU: no transition is lost, a wake-up may name the wrong "
                              "waker or context, a wait its slices"),
            "duration_ns": ("int", "time from the meta record to this one, ns"),
            "wall_time": ("string?", "wall clock at ts, RFC 3339 UTC with nanoseconds, by the meta record's "
                          "anchor (as meta's wall_time)"),
            "stack_failed": ("int?", "record --stacks: blocking switch-outs whose stack the kernel could not "
                             "keep (its stack map slot held another stack, or the map was full)"),
            "stack_lost": ("int?", "record --stacks: wake-ups whose stack could not be read back"),
            "replay_skipped": ("int?", "replay: input lines skipped as malformed"),
            "snapshots": ("int?", "replay of a snapshot directory: snapshot files re-emitted"),
        },
    ),
}

EVENT_TYPES = ("state", "fork", "exec", "exit")
# Records that describe what events refer to (a cgroup, a process, a stack, a
# trigger) rather than being events: they do not count in the end record's
# events (events + lost = kernel_events), and readers that do not use them
# pass over them. Adding one, or a field, is additive: no new SCHEMA_VERSION.
ANNOTATION_TYPES = ("cgroup", "process", "stack", "trigger")
# Every record type this pstate knows; readers skip any other type quietly
# and count it (ReadStats.unknown), never as a bad line. "task", "hist" and
# "fold" are the rows of a snapshot file (snapshots/snapdir.py, histograms.py, folds.py).
SNAPSHOT_TYPES = ("task", "hist", "fold")
# What a filtered recording (record -p/-c/--cgroup) keeps of the tasks it
# does not follow for the why-views of those it does: written by the kernel
# side (counted in the end record's events, so that the kernel's counters
# add up), never time in state; the filters of the readers pass them.
CONTEXT_TYPES = ("slice", "waker")
KNOWN_TYPES = frozenset(("meta", *EVENT_TYPES, "loss", "rate", "end", *SNAPSHOT_TYPES, *ANNOTATION_TYPES,
                         *CONTEXT_TYPES))
LOSS_REASONS = ("ringbuf_full", "map_full", "sampled", "skipped", "unread")


def state_vocabulary() -> dict[str, str]:
    """The "states" field of a meta record: name -> kernel letter."""
    return {name: letter for name, (letter, _c, _d) in STATES.items()}

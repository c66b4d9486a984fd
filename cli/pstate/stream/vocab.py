"""The words pstate's records, reports and metrics share: one table per
concept, everything else a view of it (tests/contract/test_vocab.py holds every view
equal to its table). The states themselves are schema.STATES.

- WAIT_KINDS: the kinds of wait and slice a latency distribution is kept
  of, with their names in stats' reports and in snapshots' hist rows, their
  labels, their Prometheus family and the index of the kernel's histogram
  (bpf/pstate.h HK_*);
- the blocked states: those of schema.STATES' categories blocked and
  stopped, and any state a newer kernel names (is_blocked);
- the log2 bucketings of durations, one function per convention;
- a kernel stack's frames ("name+0x1a [mod]") and its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from pstate.stream import schema

# --- the blocked states --------------------------------------------------------------

# schema.STATES' categories a task waits for an event in; a state the table
# does not know (state_<letter> of a newer kernel) counts as blocked too.
BLOCKED_CATEGORIES = schema.BLOCKED_CATEGORIES


def is_blocked(state: str) -> bool:
    """Whether a task in this state waits for an event (S, D, T, t, P, I, and
    any state a newer kernel names): the time in it ends with a wake-up."""
    return schema.state_category(state) in BLOCKED_CATEGORIES


BLOCKED_STATES: tuple[str, ...] = tuple(s for s in schema.STATES if is_blocked(s))

# --- kinds of wait -------------------------------------------------------------------


@dataclass(frozen=True)
class WaitKind:
    """One kind of wait (or slice): the durations of the transitions from
    `frm` (to `to`, when it matters) belong to it.

    name: its name in stats' reports (a latency key, csv columns KIND_*, the
    why views' KIND_ns) and, for the kinds snap's kernel side keeps, in a
    snapshot's hist rows (`hist`, where it differs); label: how tables show
    it (series: how the snapshot series do, where it differs); kernel: the
    bpf/pstate.h define of its kernel histogram; prom: its Prometheus
    family, the labels that tell it from the family's other kinds, and the
    family's HELP (given on the family's first kind)."""

    name: str
    label: str
    frm: tuple[str, ...]
    to: str | None = None
    hist: str | None = None
    series: str | None = None
    kernel: str | None = None
    prom: tuple | None = None

    @property
    def hist_name(self) -> str:
        return self.hist or self.name

    @property
    def series_label(self) -> str:
        return self.series or self.label


BLOCKED_PREFIX = "blocked_"  # stats' name of the wait in a blocked state: blocked_<state>


def blocked_kind(state: str) -> str:
    """stats' name of the time blocked in a state."""
    return BLOCKED_PREFIX + state


RUNQ_WAKEUP = WaitKind("runq_wakeup", "runq wake-up", (schema.RUNNABLE, schema.NEW), to=schema.RUNNING,
                       kernel="HK_RUNQ_WAKEUP",
                       prom=("pstate_runqueue_wait_seconds", (("after", "wakeup"),),
                             "Time on the run queue before running, after a wake-up or a preemption."))
RUNQ_PREEMPTED = WaitKind("runq_preempted", "runq preempted", (schema.PREEMPTED,), to=schema.RUNNING,
                          kernel="HK_RUNQ_PREEMPTED",
                          prom=("pstate_runqueue_wait_seconds", (("after", "preemption"),), None))
ONCPU = WaitKind("oncpu", "on-cpu slice", (schema.RUNNING,))
SLEEPING = WaitKind(blocked_kind("sleeping"), "sleeping (S)", ("sleeping",), hist="sleeping",
                    kernel="HK_SLEEPING",
                    prom=("pstate_blocked_seconds", (("state", "S"),),
                          "Time blocked before a wake-up, in S (sleeping) or D (uninterruptible)."))
UNINTERRUPTIBLE = WaitKind(blocked_kind("uninterruptible"), "uninterruptible (D)", ("uninterruptible",),
                           hist="uninterruptible", series="disk (D)", kernel="HK_UNINTERRUPTIBLE",
                           prom=("pstate_blocked_seconds", (("state", "D"),), None))

# The table, in the order reports show them; the other blocked states'
# kinds (blocked_stopped, ...) follow by the rule of blocked_kind().
WAIT_KINDS: tuple[WaitKind, ...] = (RUNQ_WAKEUP, RUNQ_PREEMPTED, ONCPU, SLEEPING, UNINTERRUPTIBLE)
# Names stats' report gave before its schema 2 (pstate 0.1.0 wrote schema
# 1): its documentation says what became of them. No reader takes them.
FORMER_NAMES: dict[str, str] = {"runq_preempt": RUNQ_PREEMPTED.name}

# The run-queue kinds by the state the wait was in (the switch-in ends it).
RUNQ_KINDS: tuple[WaitKind, ...] = tuple(k for k in WAIT_KINDS if k.to == schema.RUNNING)
_RUNQ_OF = {s: k.name for k in RUNQ_KINDS for s in k.frm}


def wait_kind(frm: str, to: str) -> str | None:
    """The name of the kind a transition's duration belongs to, or None."""
    if to == schema.RUNNING:
        return _RUNQ_OF.get(frm)
    if frm == schema.RUNNING:
        return ONCPU.name
    if is_blocked(frm):
        return blocked_kind(frm)
    return None


def kind_label(name: str) -> str | None:
    """How tables show a kind of the table (None for any other)."""
    return next((k.label for k in WAIT_KINDS if k.name == name), None)


# --- log2 bucketings of durations ------------------------------------------------------
# Two conventions, each one function. Bucket b of the floor convention holds
# the durations d with 2^(b-1) <= d < 2^b, bucket 0 holds 0: b is d's bit
# length, as BCC's runqlat prints its rows (stats --hist) and heat draws its
# latency rows. Bucket b of the ceiling convention holds 2^(s+b-1) < d <=
# 2^(s+b) (bucket 0: d <= 2^s): upper bounds as Prometheus' le, in
# snap's kernel histograms (bpf/snaphist.h hist_bucket, s = HIST_SHIFT).

log2_floor = int.bit_length  # log2_floor(d): the floor convention's bucket of d >= 0


def log2_floor_lower(b: int) -> int:
    """The least duration of the floor convention's bucket b."""
    return 0 if b == 0 else 1 << (b - 1)


def log2_ceil(d: int, shift: int = 0) -> int:
    """The ceiling convention's bucket of a duration d >= 1."""
    return ((d - 1) >> shift).bit_length()


def log2_ceil_upper(b: int, shift: int = 0) -> int:
    """The greatest duration of the ceiling convention's bucket b."""
    return 1 << (shift + b)


# --- kernel stack frames -----------------------------------------------------------------
# A frame is "name+0x1a [mod]" (" [mod]" for a module's function), or an
# address; a stack record's frames are joined by ";", from the root to the leaf.

# Scheduler plumbing: the frames a blocked task's stack has above the code
# that made it wait. A stack's reason is its first frame, from the leaf, not
# in this list (and not starting with one of PLUMBING_PREFIXES).
PLUMBING = frozenset((
    "__schedule", "schedule", "schedule_idle", "preempt_schedule", "preempt_schedule_common",
    "io_schedule", "io_schedule_timeout", "schedule_timeout", "schedule_timeout_uninterruptible",
    "schedule_timeout_interruptible", "schedule_timeout_killable", "schedule_hrtimeout", "schedule_hrtimeout_range",
    "schedule_hrtimeout_range_clock", "schedule_preempt_disabled", "bit_wait", "bit_wait_io", "bit_wait_timeout",
    "__wait_on_bit", "out_of_line_wait_on_bit", "__wait_on_bit_lock", "out_of_line_wait_on_bit_lock",
    "wait_for_completion", "wait_for_completion_io", "wait_for_completion_timeout",
    "wait_for_completion_io_timeout", "wait_for_completion_killable", "wait_for_completion_interruptible",
    "__wait_for_common", "wait_for_common", "wait_for_common_io", "do_wait_for_common",
    "rwsem_down_read_slowpath", "rwsem_down_write_slowpath", "__mutex_lock", "__mutex_lock_slowpath",
    "mutex_lock", "down_read", "down_write", "__rt_mutex_slowlock", "rt_mutex_slowlock",
    "folio_wait_bit_common", "__folio_lock", "__folio_lock_killable", "io_wait_event",
    "__cond_resched", "_cond_resched",
))
PLUMBING_PREFIXES = ("schedule_", "__schedule", "wait_for_completion")


def frame_name(frame: str) -> str:
    """The function of a frame: "name+0x1a [mod]" -> "name"."""
    return frame.split("+", 1)[0].split(" ", 1)[0]


def frame_function(frame: str) -> str:
    """A frame without its offset: "name+0x1a [mod]" -> "name [mod]" (one
    frame per function, as flame graphs merge them)."""
    name, _, rest = frame.partition("+")
    mod = rest.partition(" ")[2]
    return f"{name} {mod}" if mod else name


def leaf_first(frames: str) -> list[str]:
    """A stack record's frames (root first, joined by ";"), leaf first."""
    return frames.split(";")[::-1]


def reason_of(leaf_first_frames: list[str]) -> str:
    """A stack's reason: the first function from the leaf that is not
    scheduler plumbing (record puts it on the wake-up; stats shows it)."""
    for frame in leaf_first_frames:
        name = frame_name(frame)
        if name not in PLUMBING and not name.startswith(PLUMBING_PREFIXES):
            return name
    return frame_name(leaf_first_frames[-1]) if leaf_first_frames else "unknown"

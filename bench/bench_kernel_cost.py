"""The in-kernel cost of pstate's BPF programs per context switch.

Runs the pinned pipe storm (`taskset -c 1 perf bench sched pipe`, tracers on
CPU 0) untraced and traced, interleaved (storm.interleaved: every traced run
is bracketed by untraced ones), for:

- floor: empty BPF programs on record's tracepoints, so the cost of the
  tracepoints themselves is known; floor_btf, the same on the tp_btf path
  (empty tp_btf programs on sched_switch and sched_waking), and acct_btf, a
  minimal tp_btf per-thread accounting program (two array lookups, a clock
  read, sums; pids by direct load), both built the way pstate builds its
  programs (bpf/tpargs.h, offsets from the kernel's BTF, pstate's loader):
  the floor every change is judged against in its own sitting; acct_ts, the
  same accounting with its rows in task local storage (a helper call per
  row, found from the task pointer, where the array needs the pid);
  floor_btf_wakeup and acct_btf_wakeup, floor_btf and acct_btf with their
  wake-up program on sched_wakeup (snap's) instead of sched_waking
  (record's), for what the tracepoint itself costs;
- snap, record --min-dur 1ms, record (all events) on the tp_btf path, and
  the same on the classic tracepoint path (keys ending in _tp), record
  --stacks (the storm is all S: what taking D stacks costs every other
  switch): the BPF C in bpf/; snap_nohist (and snap_nohist_tp), snap
  compiled with SNAP_NO_HIST: the same program without its latency
  histograms' observations (bpf/snaphist.h), so that what they cost per
  switch is measured in the sitting of every change (a revision from before
  SNAP_NO_HIST compiles as snap);
- a running collector (snap --start: the programs stay attached by pinned
  links with no process; the contender holds the links open only so that
  bpf_stats names them);
- bpftrace's one-line sched_switch map count, and count_tp, the same
  program as pstate's loader builds it (COUNT_TP_C), which --toggled can
  switch on and off;
- the same with the BPF C of a git revision (--against REV, e.g. HEAD), so a
  change is measured side by side with what it replaces (keys ending in
  _<REV>; on both paths when the revision has the tp_btf one).

Then, with kernel.bpf_stats_enabled=1 (which itself costs two clock reads per
program run, so it is kept off during the ratio rounds), one storm per
contender and repetition reads run_time_ns / run_cnt of each program.

    sudo .venv/bin/python bench/bench_kernel_cost.py                  6 rounds
    sudo .venv/bin/python bench/bench_kernel_cost.py --against HEAD --rounds 8
    sudo .venv/bin/python bench/bench_kernel_cost.py --only floor,snap --stats-runs 3
    sudo .venv/bin/python bench/bench_kernel_cost.py --rounds 8 --only btf    the tp_btf comparison
    sudo .venv/bin/python bench/bench_kernel_cost.py --against-dir /tmp/before --only record,record_before
                       the BPF C in a directory (keys end in its name), e.g. an older revision's given
                       this tree's struct event, so that this user space decodes its records
    sudo .venv/bin/python bench/bench_kernel_cost.py --only snap,snap_nohist --rounds 6 --stats-runs 8
                                                                   what the histograms cost

--paired A,B (bpf_stats only): A and B attached at the same time to the same
storms, A first in odd runs and B first in even ones (programs on one
tracepoint run in the order they were attached), each program's run time
read for both. On this machine one storm's BPF ns per switch moves by 20 %
or more from one run to the next (the host), more than most changes cost;
two programs that see the same switches in the same moments share that
noise, and the difference of each pair (B - A) is then steady. The medians
of A, B and B - A are printed with the pairs' quartiles.

    sudo .venv/bin/python bench/bench_kernel_cost.py --paired snap_nohist,snap --stats-runs 16
                                                     what the histograms cost, pair by pair
    sudo .venv/bin/python bench/bench_kernel_cost.py --against HEAD --paired snap_HEAD,snap --stats-runs 16

--parts: what each part of record's programs costs in the storm, as
experiments on the BPF C of the revision they were written for (PARTS_FROM,
--parts-from; beside that revision's unchanged program) (PARTS:
sched_switch's body, its clock read alone, sched_waking's body; reserving a
record, filling it, reading the cgroup id, a copy from the stack instead of
a reservation, one reservation for a switch's two records), each as
record's BPF C with one change, beside the unchanged program and the floor.
Best with --toggled.

    sudo .venv/bin/python bench/bench_kernel_cost.py --parts --toggled 25 --rounds 2 --stats-runs 0

Prints a table and writes bench/results/kernel_cost.json.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import contenders as ct  # noqa: E402
import storm  # noqa: E402
import toggled  # noqa: E402

# Empty programs on the tracepoints record attaches to (snap's are a subset,
# with sched_wakeup where record has sched_waking: both are here).
FLOOR_TRACEPOINTS = ("sched_switch", "sched_waking", "sched_wakeup", "sched_wakeup_new", "sched_process_fork",
                     "sched_process_exec", "sched_process_exit", "sched_process_free")
FLOOR_C = "".join(f"TRACEPOINT_PROBE(sched, {tp}) {{ return 0; }}\n" for tp in FLOOR_TRACEPOINTS)
FLOOR_C += "TRACEPOINT_PROBE(task, task_newtask) { return 0; }\n"


def on_wakeup(source: str) -> str:
    """A floor program with its wake-up on sched_wakeup (snap's) instead of sched_waking (record's)."""
    if source.count("PSTATE_PROBE(sched, sched_waking)") != 1:
        sys.exit("on_wakeup: the program has no sched_waking probe to move")
    return source.replace("PSTATE_PROBE(sched, sched_waking)", "PSTATE_PROBE(sched, sched_wakeup)")


# Only the two that fire at the storm's rate in snap (a switch and a wake-up)
FLOOR2_C = "".join(f"TRACEPOINT_PROBE(sched, {tp}) {{ return 0; }}\n" for tp in ("sched_switch", "sched_wakeup"))
# The tp_btf path's floor (see the top): on the two tracepoints that fire at
# the storm's rate (record's wake-up is sched_waking)
FLOOR_BTF_C = '#include "tpargs.h"\n' + "".join(f"PSTATE_PROBE(sched, {tp}) {{ return 0; }}\n"
                                                 for tp in ("sched_switch", "sched_waking"))
ACCT_BTF_C = """#include "tpargs.h"
struct acct {
    u64 since;
    u64 run_ns;
    u64 switches;
    u64 wakeups;
};
BPF_ARRAY(acct, struct acct, TID_SLOTS);

PSTATE_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 prev = SW_PREV_PID;
    u32 next = SW_NEXT_PID;
    struct acct *a = acct.lookup(&prev);
    if (a) {
        if (a->since)
            a->run_ns += now - a->since;
        a->switches++;
        a->since = now;
    }
    a = acct.lookup(&next);
    if (a)
        a->since = now;
    return 0;
}

PSTATE_PROBE(sched, sched_waking) {
    u32 pid = WK_PID;
    struct acct *a = acct.lookup(&pid);
    if (a)
        a->wakeups++;
    return 0;
}
"""
# The same accounting with the rows in task local storage (the task's own
# storage, found from the tracepoint's task pointer: no pid read, no array)
ACCT_TS_C = """#include "tpargs.h"
struct acct {
    u64 since;
    u64 run_ns;
    u64 switches;
    u64 wakeups;
};
BPF_TASK_STORAGE(acct, struct acct);

PSTATE_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    struct acct *a = acct.task_storage_get((void *)ctx[1], 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (a) {
        if (a->since)
            a->run_ns += now - a->since;
        a->switches++;
        a->since = now;
    }
    a = acct.task_storage_get((void *)ctx[2], 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (a)
        a->since = now;
    return 0;
}

PSTATE_PROBE(sched, sched_waking) {
    struct acct *a = acct.task_storage_get((void *)ctx[0], 0, 0);
    if (a)
        a->wakeups++;
    return 0;
}
"""
# bpftrace's one-liner (contenders.py: `tracepoint:sched:sched_switch { @[cpu]
# = count(); }`) as pstate's loader builds it, so that it can be switched on
# and off (--toggled), which bpftrace cannot: a classic tracepoint, the CPU as
# the key of a per-CPU hash of bpftrace's default size, and count() as
# bpftrace 0.17 compiles it, a lookup and an update of the element.
COUNT_TP_C = """
BPF_PERCPU_HASH(counts, u64, u64, 4096);

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 key = bpf_get_smp_processor_id();
    u64 *old = counts.lookup(&key);
    u64 n = old ? *old + 1 : 1;
    counts.update(&key, &n);
    return 0;
}
"""
# snap_nohist: snap without its latency histograms (bpf/snaphist.h)
NO_HIST = "#define SNAP_NO_HIST 1\n"
# --only btf: the contenders of the tp_btf comparison, in table order
BTF_SET = ("floor2", "floor_btf", "acct_btf", "snap", "snap_tp", "collector", "record_min_dur", "record_min_dur_tp",
           "record", "record_tp", "bpftrace")
READY = "bench-kernel-cost: attached"

# --parts: what each part of record's programs costs in the storm. Each part
# is record's BPF C with one change, written to a directory of its own and
# run as record --min-dur 1ms (the path of a switch that reports nothing) or
# record (every event), beside the unchanged program. The parts are
# experiments on the BPF C of the revision they were written for
# (PARTS_FROM; --parts-from another), never on the product's own files:
# bpf/ changes without them. Every change must match that text exactly, or
# the bench stops with the part's name rather than measure something else.
PARTS_FROM = "d6aac1f"
_SWITCH = "PSTATE_PROBE(sched, sched_switch) {\n"
_CLOCK = "    u64 now = bpf_ktime_get_ns();\n"
_SUBMIT = "    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);\n"
_RESERVE = "    struct slot_pos *pos = 0;\n    struct event *e = reserve(irqs_on, &pos);\n"
_FILL_START = "    e->ts = now;\n"
_FILL_END = "    submit(e, pos);\n}\n"
_DISCARD = "    events.ringbuf_discard(e, BPF_RB_NO_WAKEUP);\n"
_TO_DISCARD = (_SUBMIT, _DISCARD, None)  # submit() discards instead
_RB_RESERVE = "    struct event *e = events.ringbuf_reserve(sizeof(struct event));\n"


def _fill(text: str) -> str:
    """emit()'s fill of a reserved record in record.bpf.c, `e->ts = now;`
    up to its submit: the one list of the record's fields the parts use."""
    i = text.index(_FILL_START)
    return text[i:text.index(_FILL_END, i)]


def _output(text: str) -> str:
    return ("    count_in(irqs_on, STAT_ATTEMPTED);\n    if (sampled_out(irqs_on))\n        return;\n"
            "    struct event ev;\n" + _fill(text).replace("e->", "ev.") +
            "    if (events.ringbuf_output(&ev, sizeof(ev), BPF_RB_NO_WAKEUP) != 0)\n"
            "        count_in(irqs_on, DROP_RINGBUF);\n}\n")


_RETURN = "    if (1)\n        return 0;\n"
# Every record through the ring buffer, none into the per-CPU slots: record as
# it was before the slots (the parts that take the ring buffer apart need it).
_SLOT_START = "    u32 cpu = bpf_get_smp_processor_id();\n    struct slot_pos *p = slot_pos.lookup(&cpu);\n"
_RING_ONLY = (_SLOT_START, _RETURN + _SLOT_START, None)
_NO_FALLBACK = ("        if (se)\n            return se;\n", "        return se;\n", None)
_SLOT_INDEX = "    u32 i = cpu * CPU_SLOTS + (u32)(head & (CPU_SLOTS - 1));\n"
_NEXT_SIDE = "    if (next != 0) {\n        struct task_state *ts = task_row(next);\n"

# The "switch_pair" part: a switch's switch-out held on the stack and put
# with its switch-in into one reservation of two records, each with a
# header (the second written by the program), which user space reads as two
# slots of its stride: one reservation and one submit per switch fewer.
_EMIT_START = "// One event of any type, through the task and CPU filters.\n"


def _fill_fn(text: str) -> str:
    return ("static __always_inline void fill(struct event *e, u8 type, u64 now, u32 cpu, u32 tgid, u32 tid,\n"
            "                                 const char *comm, u16 from, u16 to, u64 dur, u8 cause, s32 prio, u8 flags,\n"
            "                                 u32 kstate, u32 other_pid, u32 other_tid, u32 stack, u64 cgroup) {\n" +
            _fill(text).replace("cgroup_of(cg, task)", "cgroup") + "}\n\n" + _EMIT_START)


_PAIR_FILL = """    fill(e, type, now, cpu, tgid, tid, comm, from, to, dur, cause, prio, flags, kstate, other_pid, other_tid, stack,
         cgroup_of(cg, task));
    submit(e, pos);
}

struct event_pair {
    struct event a;
    u32 len;
    u32 pg_off;
    struct event b;
};

static __always_inline void flush_held(struct event *held) {
    struct event *e = events.ringbuf_reserve(sizeof(struct event));
    if (!e) {
        count(DROP_RINGBUF);
        return;
    }
    *e = *held;
    submit(e, 0);
}
"""
_HELD_DECL = ("    u32 prev_tgid = 0; // through current_tgid()\n    COMM_BUF(comm);\n",
              "    u32 prev_tgid = 0; // through current_tgid()\n    COMM_BUF(comm);\n"
              "    struct event held;\n    u8 have_held = 0;\n")
_OUT_OLD = """            emit_state(cfg, now, cpu, current_tgid(&prev_tgid), prev, comm, ST_RUNNING, to, dur, CAUSE_SWITCH_OUT,
                       SW_PREV_PRIO, bits ? F_VOLUNTARY : 0, kstate, 0, next, 0, CG_CURRENT, 0);
"""
_OUT_HELD = """            u32 tg = current_tgid(&prev_tgid);
            if (task_match(cfg, cpu, tg, prev, comm)) {
                count(STAT_ATTEMPTED);
                if (!sampled_out(0)) {
                    fill(&held, EV_STATE, now, cpu, tg, prev, comm, ST_RUNNING, to, dur, CAUSE_SWITCH_OUT, SW_PREV_PRIO,
                         bits ? F_VOLUNTARY : 0, kstate, 0, next, 0, bpf_get_current_cgroup_id());
                    have_held = 1;
                }
            }
"""
_IN_OLD = """            emit_state(cfg, now, cpu, tgid, next, comm, from, ST_RUNNING, dur, CAUSE_SWITCH_IN, SW_NEXT_PRIO,
                       0, 0, prev ? current_tgid(&prev_tgid) : 0, prev, 0, CG_TASK, SW_NEXT_TASK);
"""
_IN_PAIR = """            if (!have_held) {
                emit_state(cfg, now, cpu, tgid, next, comm, from, ST_RUNNING, dur, CAUSE_SWITCH_IN, SW_NEXT_PRIO,
                           0, 0, prev ? current_tgid(&prev_tgid) : 0, prev, 0, CG_TASK, SW_NEXT_TASK);
            } else if (task_match(cfg, cpu, tgid, next, comm)) {
                count(STAT_ATTEMPTED);
                if (!sampled_out(0)) {
                    struct event_pair *pr = events.ringbuf_reserve(sizeof(struct event_pair));
                    if (pr) {
                        pr->a = held;
                        pr->len = sizeof(struct event);
                        pr->pg_off = 0;
                        fill(&pr->b, EV_STATE, now, cpu, tgid, next, comm, from, ST_RUNNING, dur, CAUSE_SWITCH_IN,
                             SW_NEXT_PRIO, 0, 0, current_tgid(&prev_tgid), prev, 0, task_cgroup_id(SW_NEXT_TASK));
                        events.ringbuf_submit(pr, BPF_RB_NO_WAKEUP);
                    } else {
                        count(DROP_RINGBUF);
                        count(DROP_RINGBUF);
                    }
                    have_held = 0;
                }
            }
"""
_SWITCH_END = "    return 0;\n}\n\n// Wake-ups are taken where the waker is current"
# "staged_output", the other way to fewer ring calls, measured before the
# per-CPU slots (bpf/record.bpf.c struct slot) were built: each record is
# written to a per-CPU staging buffer of STAGE_N and the buffer is copied
# into the ring by one bpf_ringbuf_output when it is full (one call per
# STAGE_N records instead of two per record). It measures a CPU's own
# records only: it ignores nesting and the flush of a quiet CPU, which a
# real producer must handle (0.834 against the slots' 0.849 in one sitting).
_RB_DECL = "BPF_RINGBUF_OUTPUT(events, RB_PAGES);\n"
_STAGE_DECL = _RB_DECL + """#define STAGE_N 16
struct stage_buf {
    u32 n;
    u32 pad;
    struct event ev[STAGE_N];
};
BPF_PERCPU_ARRAY(stage, struct stage_buf, 1);
"""
# "direct_slots": the first measure of the slots, before they were built
# (0.849 against the ring buffer's 0.789 in one sitting, where the slots as
# built keep 0.81 to 0.82): each record written straight into a per-CPU run
# of STAGE_SLOTS slots of a plain array, overwriting the oldest, the run's
# position in a per-CPU array; no reader, no check for room, no nesting.
# Its variants take one step each toward the slots as built.
_SLOTS_DECL = "BPF_F_TABLE(\"array\", u32, struct slot_pos, slot_pos, SLOT_CPUS, BPF_F_MMAPABLE);\n"


def _direct_decl(value: str, n: int, mmapable: bool = False) -> str:
    table = (f"BPF_F_TABLE(\"array\", u32, {value}, stage, 8 * {n}, BPF_F_MMAPABLE);\n" if mmapable
             else f"BPF_ARRAY(stage, {value}, 8 * {n});\n")
    return _SLOTS_DECL + table + "BPF_PERCPU_ARRAY(stage_head, u64, 1);\n"


def _direct(value: str, n: int, pos: bool = False):
    def make(text: str) -> str:
        get = ("    struct event *e = stage.lookup(&slot);\n    if (!e)\n        return;\n" if value == "struct event"
               else "    struct slot *sl = stage.lookup(&slot);\n    if (!sl)\n        return;\n"
                    "    struct event *e = &sl->ev;\n")
        if pos:  # the run's head in slot_pos, the slots' own array of positions
            head = ("    u32 c = bpf_get_smp_processor_id();\n    struct slot_pos *p = slot_pos.lookup(&c);\n"
                    "    if (!p)\n        return;\n    u64 *head = &p->head;\n")
        else:
            head = "    u64 *head = stage_head.lookup(&zero);\n    if (!head)\n        return;\n"
        return (_TAKE + head + f"    u32 slot = (bpf_get_smp_processor_id() & 7) * {n} + (*head & ({n} - 1));\n" +
                get + "    (*head)++;\n" + _fill(text) + "}\n")
    return make


_TAKE = ("    count_in(irqs_on, STAT_ATTEMPTED);\n    if (sampled_out(irqs_on))\n        return;\n"
         "    u32 zero = 0;\n")


def _staged(text: str) -> str:
    return (_TAKE + "    struct stage_buf *sb = stage.lookup(&zero);\n    if (!sb)\n        return;\n"
            "    u32 n = sb->n;\n    if (n >= STAGE_N)\n        n = 0;\n    struct event *e = &sb->ev[n];\n" +
            _fill(text) +
            "    if (n + 1 < STAGE_N) {\n        sb->n = n + 1;\n        return;\n    }\n    sb->n = 0;\n"
            "    void *out = &sb->ev[0]; // (BCC's rewriter aborts on sizeof(sb->ev))\n"
            "    if (events.ringbuf_output(out, STAGE_N * sizeof(struct event), BPF_RB_NO_WAKEUP) != 0)\n"
            "        count_in(irqs_on, DROP_RINGBUF);\n}\n")


# A part whose slots user space cannot read (another size than struct event's)
# runs with a reader that only moves the consumer position to the producer's
# (pstate-unread): every record of such a part is discarded, and the reader
# that decodes by struct event's stride would stall on them and let the ring
# fill, which measures dropped events, not records.
UNREAD = "unread"
PARTS = {
    # part: (the contender it changes, label, [(from, new, through), ...][, UNREAD]): the text from
    # `from` (through `through`, when given) becomes `new` (a function: of record.bpf.c's text)
    "no_switch_body": ("record_min_dur", "sched_switch returns at once", [(_SWITCH, _SWITCH + _RETURN, None)]),
    "switch_clock_only": ("record_min_dur", "sched_switch reads the clock and returns",
                          [(_SWITCH + _CLOCK, _SWITCH + _CLOCK + _RETURN, None)]),
    "no_waking_body": ("record_min_dur", "sched_waking returns at once",
                       [("PSTATE_PROBE(sched, sched_waking) {\n",
                         "PSTATE_PROBE(sched, sched_waking) {\n" + _RETURN, None)]),
    "switch_prev_only": ("record_min_dur", "sched_switch does prev's side only (returns before next's)",
                         [(_NEXT_SIDE, _RETURN + _NEXT_SIDE, None)]),
    "switch_next_only": ("record_min_dur", "sched_switch does next's side only (skips prev's)",
                         [("    if (prev != 0) {\n", "    if (prev != 0 && 0) {\n", None)]),
    "no_irq_clear": ("record_min_dur", "sched_switch does not clear the CPU's interrupt marks",
                     [("        struct irq_ctx *ic = irq_state.lookup(&zero);\n        if (ic && *(u64 *)ic)\n",
                       "        struct irq_ctx *ic = irq_state.lookup(&zero);\n        if (0)\n", None)]),
    "ring_buffer": ("record", "every record through the ring buffer (record before the per-CPU slots)",
                    [_RING_ONLY]),
    **{f"slots_{n}": ("record", f"runs of {n} slots a CPU (the rest to the ring buffer)",
                      [("#include \"pstate.h\"\n", f"#undef CPU_SLOTS\n#define CPU_SLOTS {n}\n#include \"pstate.h\"\n",
                        None)]) for n in (1024, 8192, 65536)},
    # small runs read often: fewer pages cycled through by the producers, more wake-ups of the reader
    **{f"slots_{n}_drain_{every}": ("record", f"runs of {n} slots a CPU, drained every {every}",
                                    [("#include \"pstate.h\"\n",
                                      f"#undef CPU_SLOTS\n#define CPU_SLOTS {n}\n#include \"pstate.h\"\n", None)])
       for n, every in ((1024, "1ms"), (2048, "2ms"))},
    "slots_unread": ("record", "the per-CPU slots never read (the reader only moves the tails to the heads)",
                     [("#include \"pstate.h\"\n", "// records never read (UNREAD)\n#include \"pstate.h\"\n", None)],
                     UNREAD),
    "slots_no_busy": ("record", "the per-CPU slots without their busy mark (unsafe where programs nest)",
                      [("    if (!p || p->busy)\n", "    if (!p)\n", None), ("    p->busy = 1;\n", "", None),
                       ("        pos->busy = 0;\n", "", None)]),
    "slots_no_fallback": ("record", "the sched programs' records never fall back to the ring buffer (no ring call "
                          "in their code)", [_NO_FALLBACK]),
    "slots_bare": ("record", "the per-CPU slots with no fallback, no busy mark and no check for room",
                   [_NO_FALLBACK, ("    if (!p || p->busy)\n", "    if (!p)\n", None), ("    p->busy = 1;\n", "", None),
                    ("        pos->busy = 0;\n", "", None),
                    ("    if (head - *(volatile u64 *)&p->tail >= CPU_SLOTS)\n", "    if (0)\n", None)]),
    "slots_no_tail": ("record", "the per-CPU slots never checked for room (overwrite the oldest)",
                      [("    if (head - *(volatile u64 *)&p->tail >= CPU_SLOTS)\n", "    if (0)\n", None)]),
    **{f"slots_{n}_unread": ("record", f"the per-CPU slots never read, each CPU's index wrapping at {n} "
                                   "(fewer cache lines cycled through)",
                                   [(_SLOT_INDEX, _SLOT_INDEX.replace("(CPU_SLOTS - 1)", str(n - 1)), None)], UNREAD)
        for n in (1024, 8192)},
    "fill_discard": ("record", "each record filled, then discarded (bpf_ringbuf_discard)",
                     [_RING_ONLY, _TO_DISCARD]),
    "reserve_discard": ("record", "each record reserved and discarded, not filled",
                        [_RING_ONLY, (_FILL_START, _DISCARD + "}\n", _FILL_END)]),
    "small_discard": ("record", "each record reserved as its first 48 bytes (no name, stack, cgroup), filled, "
                      "then discarded",
                      [_RING_ONLY, (_RB_RESERVE, _RB_RESERVE.replace("sizeof(struct event)", "48"), None),
                       ("    COMM_COPY(e->comm, comm);\n", "", "    e->cgroup = cgroup_of(cg, task);\n"),
                       _TO_DISCARD], UNREAD),
    "small56_discard": ("record", "each record reserved as 56 bytes (its first 48 and the cgroup id: no name, no "
                        "stack), filled, then discarded",
                        [_RING_ONLY, (_RB_RESERVE, _RB_RESERVE.replace("sizeof(struct event)", "56"), None),
                         ("    COMM_COPY(e->comm, comm);\n", "    *(u64 *)((char *)e + 48) = cgroup_of(cg, task);\n",
                          "    e->cgroup = cgroup_of(cg, task);\n"),
                         _TO_DISCARD], UNREAD),
    "unread_discard": ("record", "each record filled, then discarded, its slot never read (the reference for the "
                       "slot sizes above)",
                       [_RING_ONLY, _TO_DISCARD], UNREAD),
    "big_discard": ("record", "each record reserved as 120 bytes (a 128-byte slot), filled, then discarded",
                    [_RING_ONLY,
                     (_RB_RESERVE, _RB_RESERVE.replace("sizeof(struct event)", "sizeof(struct event) + 40"), None),
                     _TO_DISCARD], UNREAD),
    "no_switch_in_records": ("record", "no switch-in records (switch-outs and wake-ups only)",
                             [_RING_ONLY, (_IN_OLD, "            (void)comm;\n", None)]),
    "no_wakeup_records": ("record", "no wake-up records (switch-outs and switch-ins only)",
                          [_RING_ONLY,
                           ("        emit_state(cfg, now, bpf_get_smp_processor_id(), tgid, tid, comm, from, "
                            "ST_RUNNABLE, dur, cause, -1, ctx,\n",
                            "        (void)comm;\n", "CG_TASK, task);\n")]),
    "bare_reserve_discard": ("record", "each record only reserved and discarded: no filter test, count or fill",
                             [_RING_ONLY, ("    if (!task_match(cfg, cpu, tgid, tid, comm))\n        return;\n" + _RESERVE,
                               _RB_RESERVE + "    if (e)\n    " + _DISCARD + "}\n", _FILL_END)]),
    "no_attempted_count": ("record", "no count of the events tried (STAT_ATTEMPTED)",
                           [_RING_ONLY, ("    count_in(irqs_on, STAT_ATTEMPTED);\n", "", None)]),
    "no_cgroup": ("record", "no cgroup id read (0 in every record)",
                  [_RING_ONLY, ("    e->cgroup = cgroup_of(cg, task);\n", "    e->cgroup = 0;\n", None)]),
    "ringbuf_output": ("record", "each record built on the stack, copied in by bpf_ringbuf_output",
                       [(_RESERVE, _output, _FILL_END)]),
    **{f"direct_slots{tag}": ("record", f"records written straight into a per-CPU run of {n} {value} slots of a plain "
                                        "array (no ring call, no reader" + {"_pos": "; its head in slot_pos)",
                                                                           "_mm": "; the array mmap-able)",
                                                                           "_65536_mm": "; the array mmap-able)"
                                                                           }.get(tag, ")"),
                                        [(_SLOTS_DECL, _direct_decl(value, n, tag.endswith("_mm")), None),
                                         (_RESERVE, _direct(value, n, tag == "_pos"), _FILL_END)], UNREAD)
       for tag, value, n in (("", "struct event", 1024), ("_96", "struct slot", 1024),
                             ("_65536", "struct event", 65536), ("_pos", "struct event", 1024),
                             ("_mm", "struct event", 1024), ("_65536_mm", "struct event", 65536))},
    # record as it was before WAKE_AT_WAKEUP: its wake-ups at sched_waking (see floor_btf_wakeup)
    **{f"waking_probe{tag}": (base, "wake-ups taken at sched_waking (as before the wake list's note)",
                              [("#include \"pstate.h\"\n", "#undef WAKE_AT_WAKEUP\n#include \"pstate.h\"\n", None)])
       for tag, base in (("", "record_min_dur"), ("_all", "record"))},
    # the code size test: emit() reduced to a count, the filters' branches kept. With --min-dur
    # the storm never takes them, so the path run is the same; only the program is smaller.
    "emit_count_only": ("record_min_dur", "emit() only counts (the same path run, a program without the "
                        "code that fills records)",
                        [("    if (!task_match(cfg, cpu, tgid, tid, comm))\n        return;\n",
                          "    count(STAT_ATTEMPTED);\n}\n", _FILL_END)]),
    # one part of each record at a time, with the slots (the parts above without them take the ring buffer)
    "slots_no_attempted": ("record", "no count of the events tried (STAT_ATTEMPTED)",
                           [("    count_in(irqs_on, STAT_ATTEMPTED);\n", "", None)]),
    "slots_no_cgroup": ("record", "no cgroup id read (0 in every record)",
                        [("    e->cgroup = cgroup_of(cg, task);\n", "    e->cgroup = 0;\n", None)]),
    "slots_no_comm": ("record", "no name copied into the records", [("    COMM_COPY(e->comm, comm);\n", "", None)]),
    "staged_output": ("record", "records staged per CPU, 16 copied into the ring by one bpf_ringbuf_output",
                      [(_RB_DECL, _STAGE_DECL, None), (_RESERVE, _staged, _FILL_END)], UNREAD),
    "switch_pair": ("record", "a switch's two records in one reservation",
                    [_RING_ONLY, (_FILL_START, _PAIR_FILL, _FILL_END), (_EMIT_START, _fill_fn, None),
                     (*_HELD_DECL, None), (_OUT_OLD, _OUT_HELD, None),
                     (_IN_OLD, _IN_PAIR, None),
                     (_SWITCH_END, "    if (have_held)\n        flush_held(&held);\n" + _SWITCH_END, None)]),
}


def part_source(text: str, part: str) -> str:
    """record.bpf.c with one of PARTS' changes."""
    source = text
    for old, new, through in PARTS[part][2]:
        if text.count(old) != 1 or (through and through not in text[text.find(old):]):
            sys.exit(f"--parts {part}: this record.bpf.c has not the text it changes (--parts-from the revision "
                     f"it was written for): {old.strip()!r}")
        i = text.index(old)
        j = text.index(through, i) + len(through) if through else i + len(old)
        text = text[:i] + (new(source) if callable(new) else new) + text[j:]
    return text


def part_dirs(src: str, tmp: str) -> dict[str, str]:
    """A copy of the BPF C directory for each part, with its change."""
    out = {}
    with open(os.path.join(src, "record.bpf.c")) as f:
        record = f.read()
    for part in PARTS:
        d = os.path.join(tmp, "parts", part)
        shutil.copytree(src, d)
        with open(os.path.join(d, "record.bpf.c"), "w") as f:
            f.write(part_source(record, part))
        out[part] = d
    return out


ct.RESULT_READERS["floor"] = lambda run: {"ok": READY in run.text()} if READY in run.text() else {
    "ok": False, "error": f"exit {run.returncode}: {run.text()[-300:]}"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- helper modes (run as the traced process) ------------------------------------

def _patch_source(src_dir: str | None, text: str | None = None, prefix: str = "") -> None:
    """Make pstate's loader compile BPF C from src_dir (or `text`), each
    program's text after `prefix`."""
    from pstate.kernel import loader

    def read(name: str) -> str:
        with open(os.path.join(src_dir, name)) as f:
            return f.read()

    def source(name: str) -> str:
        if text is not None:
            return text
        c = prefix + loader.with_headers(read(f"{name}.bpf.c"), read)
        return c.replace("PSTATE_LIFE(", "PSTATE_PROBE(") if older else c

    # A revision from before the plan per tracepoint (no PATH_<event> in its
    # bpf/tpargs.h) knows one switch for the tp_btf path (TP_BTF) and one for
    # raw lifecycle programs (LIFE_RAW), and names those PSTATE_LIFE: given
    # both from this tree's plan, it builds as it did.
    older = (text is None and src_dir is not None and os.path.exists(os.path.join(src_dir, "tpargs.h"))
             and "PATH_" not in read("tpargs.h"))
    loader.source = source
    if older:
        from pstate.kernel import probeplan

        plan_of = loader.probe_plan

        def probe_plan(*args, **kwargs):
            plan = plan_of(*args, **kwargs)
            plan.defines["TP_BTF"] = plan.path == probeplan.TP_BTF
            plan.defines["LIFE_RAW"] = plan.life == probeplan.RAW
            return plan

        loader.probe_plan = probe_plan


def floor_main(text: str = FLOOR_C, probes: str = "tracepoint") -> int:
    """Attach the programs of `text` through pstate's loader on the path
    `probes`; wait for SIGTERM."""
    from pstate.kernel import loader

    def read(name: str) -> str:
        with open(os.path.join(ROOT, "bpf", name)) as f:
            return f.read()

    ks = loader.kernel_states()
    _patch_source(None, loader.with_headers(text, read))
    prog = loader.Program("floor", {"REPORT_MASK": f"0x{ks.report_mask:x}", "TID_SLOTS": loader.pid_max()},
                          probes=probes)
    if prog.plan.path != probes:
        sys.exit(f"the floor took the {prog.plan.path} path: {prog.plan.reason}")
    attached_until_stopped()
    prog.close()
    return 0


def attached_until_stopped() -> None:
    """Say the contender is attached; return on SIGTERM or SIGINT."""
    import signal

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    print(READY, flush=True)
    while not stop:
        time.sleep(0.05)


def pstate_main(src_dir: str, args: list[str], prefix: str = "", unread: bool = False) -> int:
    """pstate with its BPF C taken from src_dir (after `prefix`); `unread`:
    record's ring reader reads nothing and moves the consumer position to
    the producer's (see UNREAD)."""
    _patch_source(src_dir, prefix=prefix)
    if unread:
        from pstate.kernel import loader

        from pstate.kernel import slotrings

        def read(self, max_records=None):
            self.skip()
            return memoryview(b""), 0

        loader.RingReader.read = read
        slotrings.SlotRings.read = read
    from pstate.main import main

    sys.argv = ["pstate"] + args
    return main()


# --- contenders ------------------------------------------------------------------

def _self(*args: str) -> list[str]:
    return ["taskset", "-c", ct.TRACER_CPU, sys.executable, os.path.abspath(__file__), *args]


def make_contenders(src: str, against: str | None, tag: str,
                    parts: dict[str, str] | None = None) -> list[ct.Contender]:
    """floor, then snap / record --min-dur 1ms / record from src_dir (and from
    the `against` dir, keys suffixed with _<tag>), then record's parts
    (--parts: part -> its directory, keys <record_min_dur or record>_<part>)."""
    cs = [ct.Contender("floor", "empty programs (floor)", "floor", _self("floor"), ready=f"text:{READY}"),
          ct.Contender("floor2", "empty programs on sched_switch and sched_wakeup only", "floor", _self("floor2"),
                       ready=f"text:{READY}"),
          ct.Contender("floor_btf", "empty tp_btf programs on sched_switch and sched_waking", "floor",
                       _self("floor_btf"), ready=f"text:{READY}"),
          ct.Contender("acct_btf", "minimal tp_btf accounting (pstate's loader)", "floor", _self("acct_btf"),
                       ready=f"text:{READY}"),
          # the same on sched_wakeup, snap's wake-up, in place of sched_waking, record's
          ct.Contender("floor_btf_wakeup", "empty tp_btf programs on sched_switch and sched_wakeup", "floor",
                       _self("floor_btf_wakeup"), ready=f"text:{READY}"),
          ct.Contender("acct_btf_wakeup", "minimal tp_btf accounting, its wake-ups at sched_wakeup", "floor",
                       _self("acct_btf_wakeup"), ready=f"text:{READY}"),
          ct.Contender("acct_ts", "minimal tp_btf accounting, rows in task local storage", "floor",
                       _self("acct_ts"), ready=f"text:{READY}"),
          ct.Contender("count_tp", "bpftrace's sched_switch count as pstate's loader builds it", "floor",
                       _self("count_tp"), ready=f"text:{READY}")]
    for d, suffix, what in ((src, "", "bpf/"), (against, f"_{tag}", tag)):
        if d is None:
            continue
        # a revision from before the tp_btf path (no bpf/tpargs.h) has the classic one only
        both = not suffix or os.path.exists(os.path.join(d, "tpargs.h"))
        paths = (("", "tp_btf"), ("_tp", "tracepoint")) if both else (("", "tracepoint"),)
        for end, probes in paths:
            p = ("--probes", probes)
            label = f"{what}, {probes}"
            cs += [
                ct.Contender(f"snap{end}{suffix}", f"pstate snap ({label})", "snap",
                             _self("pstate", d, "snap", "--dir", "{dir}", "--interval", "60", "-v", *p),
                             ready="text:collecting into"),
                ct.Contender(f"snap_nohist{end}{suffix}", f"pstate snap without its histograms ({label})", "snap",
                             _self("pstate-nohist", d, "snap", "--dir", "{dir}", "--interval", "60", "-v", *p),
                             ready="text:collecting into"),
                ct.Contender(f"collector{end}{suffix}", f"pstate snap --start, a running collector ({label})",
                             "floor", _self("collector", d, probes), ready=f"text:{READY}"),
                ct.Contender(f"record_min_dur{end}{suffix}", f"pstate record --min-dur 1ms ({label})", "record",
                             _self("pstate", d, "record", "-q", "-o", "{out}", "--min-dur", "1ms", *p),
                             ready="meta"),
                ct.Contender(f"record{end}{suffix}", f"pstate record ({label})", "record",
                             _self("pstate", d, "record", "-q", "-o", "{out}", *p), ready="meta"),
            ]
        cs += [
            ct.Contender(f"record_stacks{suffix}", f"pstate record --stacks ({what})", "record",
                         _self("pstate", d, "record", "-q", "-o", "{out}", "--stacks"), ready="meta"),
            ct.Contender(f"record_filters{suffix}", f"pstate record -c perf --cpu 1 ({what})",
                         "record", _self("pstate", d, "record", "-q", "-o", "{out}", "-c", "perf",
                                         "--cpu", "1"), ready="meta"),
        ]
        # how often user space wakes to drain (default 5ms), where the kernel side reports little
        cs += [ct.Contender(f"record_min_dur_drain_{every}{suffix}",
                            f"pstate record --min-dur 1ms --drain-interval {every} ({what})", "record",
                            _self("pstate", d, "record", "-q", "-o", "{out}", "--min-dur", "1ms", "--drain-interval",
                                  every), ready="meta") for every in ("1s", "500us")]
        # smaller buffers: fewer cache lines cycled through by the producers (and room for fewer events)
        cs += [ct.Contender(f"record_buffer_{size.lower()}{suffix}", f"pstate record --buffer-size {size} ({what})",
                            "record", _self("pstate", d, "record", "-q", "-o", "{out}", "--buffer-size", size),
                            ready="meta") for size in ("1M", "256K")]
        if suffix:  # the BPF C of an older revision may have no stack map
            cs = [c for c in cs if not c.key.startswith("record_stacks")]
    for part, d in (parts or {}).items():
        base, label = PARTS[part][:2]
        extra = ("--min-dur", "1ms") if base == "record_min_dur" else ()
        if "_drain_" in part:
            extra += ("--drain-interval", part.rpartition("_")[2])
        mode = "pstate-unread" if UNREAD in PARTS[part][3:] else "pstate"
        cs.append(ct.Contender(f"{base}_{part}", f"pstate {' '.join(('record',) + extra)}: {label}", "record",
                               _self(mode, d, "record", "-q", "-o", "{out}", *extra), ready="meta"))
    cs += [c for c in ct.default_contenders() if c.key == "bpftrace"]
    return cs


class Runner:
    def __init__(self, tmp: str):
        self.tmp = tmp
        self.n = 0

    def traced(self, c: ct.Contender, workload: storm.Workload, *, stats: bool = False):
        self.n += 1
        wd = os.path.join(self.tmp, f"{self.n:04d}-{c.key}")
        run = None
        try:
            run = ct.Running(c, wd)
            run.wait_ready()
            if c.kind == "record":
                run.wait_first_event()
            progs0 = prog_stats(run.pid) if stats else None
            thr = workload.run()
            progs1 = prog_stats(run.pid) if stats else None
            run.stop()
            res = ct.collect(run)
            if stats:
                res["programs"] = _prog_delta(progs0, progs1)
            if not res.get("ok"):
                return None, res
            return thr, res
        except ct.StartFailed as e:
            return None, {"ok": False, "error": str(e)}
        finally:
            if run is not None and run.returncode is None:
                run.stop()
            shutil.rmtree(wd, ignore_errors=True)


    def together(self, cs: tuple[ct.Contender, ...], workload: storm.Workload):
        """Start cs in order (each ready before the next), run the storm once
        under all of them: (throughput, {key: per-program runs and run time
        during the storm})."""
        runs = []
        try:
            for c in cs:
                self.n += 1
                run = ct.Running(c, os.path.join(self.tmp, f"{self.n:04d}-{c.key}"))
                runs.append(run)
                run.wait_ready()
                if c.kind == "record":
                    run.wait_first_event()
            before = [prog_stats(run.pid) for run in runs]
            thr = workload.run()
            after = [prog_stats(run.pid) for run in runs]
            for run in runs:
                run.stop()
            out = {}
            for c, run, b0, b1 in zip(cs, runs, before, after):
                res = ct.collect(run)
                if not res.get("ok"):
                    return None, res
                out[c.key] = _prog_delta(b0, b1)
            return thr, out
        except ct.StartFailed as e:
            return None, {"ok": False, "error": str(e)}
        finally:
            for run in runs:
                if run.returncode is None:
                    run.stop()
                shutil.rmtree(run.workdir, ignore_errors=True)


def prog_stats(pid: int) -> list[dict]:
    """run_cnt and run_time_ns of the programs pid holds, named by the
    tracepoint they are attached to (a program loaded without BTF has only a
    truncated name)."""
    return [{**p, "name": p["tracepoint"] or p["name"]} for p in ct.prog_stats(pid)]


def _prog_delta(before: list[dict], after: list[dict]) -> dict:
    """Per program: runs and run time during the workload alone."""
    b = {p["prog_id"]: p for p in before}
    out = {}
    for p in after:
        p0 = b.get(p["prog_id"], {"run_cnt": 0, "run_time_ns": 0})
        cnt = p["run_cnt"] - p0["run_cnt"]
        ns = p["run_time_ns"] - p0["run_time_ns"]
        out[p["name"]] = {"run_cnt": cnt, "run_time_ns": ns, "ns_per_run": ns / cnt if cnt else None}
    return out


def stats_pass(runner: Runner, workload: storm.Workload, cs: list[ct.Contender], runs: int) -> dict:
    """ns per run per program, and all programs' ns per context switch."""
    res = {c.key: [] for c in cs}
    with ct.BpfStats():
        for r in range(runs):
            for c in cs:
                thr, d = runner.traced(c, workload, stats=True)
                if thr is None:
                    log(f"  stats {c.key}: FAILED {d.get('error', '')[:300]}")
                    continue
                progs = d["programs"]
                sw = progs.get("sched_switch", {}).get("run_cnt") or 0
                total = sum(p["run_time_ns"] for p in progs.values())
                res[c.key].append({"programs": progs, "switches": sw,
                                   "bpf_ns_per_switch": total / sw if sw else None})
                busy = sorted((k, p) for k, p in progs.items() if p["run_cnt"])
                log(f"  stats {c.key} ({r + 1}/{runs}): " + ", ".join(
                    f"{k} {p['ns_per_run']:.0f} ns x {p['run_cnt']:,}" for k, p in busy)
                    + (f"; {total / sw:.0f} ns/switch" if sw else ""))
    out = {}
    for key, rows in res.items():
        names = sorted({n for r in rows for n in r["programs"]})
        per = {}
        for n in names:
            vals = [r["programs"][n]["ns_per_run"] for r in rows if r["programs"].get(n, {}).get("ns_per_run")]
            cnts = [r["programs"][n]["run_cnt"] for r in rows if n in r["programs"]]
            if vals:
                per[n] = {"ns_per_run": statistics.median(vals), "run_cnt": statistics.median(cnts)}
        nsw = [r["bpf_ns_per_switch"] for r in rows if r["bpf_ns_per_switch"]]
        out[key] = {"programs": per, "bpf_ns_per_switch": statistics.median(nsw) if nsw else None, "runs": rows}
    return out


def paired_pass(runner: Runner, workload: storm.Workload, a: ct.Contender, b: ct.Contender, runs: int) -> dict:
    """A and B attached at once to each storm (see the top), the order
    alternated: per run the BPF ns per switch of each, and B - A."""
    rows = []
    with ct.BpfStats():
        for r in range(runs):
            order = (a, b) if r % 2 == 0 else (b, a)
            thr, d = runner.together(order, workload)
            if thr is None:
                log(f"  paired run {r + 1}: FAILED {d.get('error', '')[:300]}")
                continue
            row = {"first": order[0].key}
            for c in (a, b):
                progs = d[c.key]
                sw = progs.get("sched_switch", {}).get("run_cnt") or 0
                row[c.key] = {"programs": progs, "switches": sw,
                              "bpf_ns_per_switch": sum(p["run_time_ns"] for p in progs.values()) / sw if sw else None}
            if None in (row[a.key]["bpf_ns_per_switch"], row[b.key]["bpf_ns_per_switch"]):
                continue
            row["diff"] = row[b.key]["bpf_ns_per_switch"] - row[a.key]["bpf_ns_per_switch"]
            rows.append(row)
            log(f"  paired {r + 1}/{runs} ({order[0].key} first): {a.key} {row[a.key]['bpf_ns_per_switch']:.0f}, "
                f"{b.key} {row[b.key]['bpf_ns_per_switch']:.0f} ns/switch; {b.key} - {a.key} {row['diff']:+.1f}")

    return {"a": a.key, "b": b.key, "runs": rows,
            "a_ns_per_switch": storm.quartiles([x[a.key]["bpf_ns_per_switch"] for x in rows]),
            "b_ns_per_switch": storm.quartiles([x[b.key]["bpf_ns_per_switch"] for x in rows]),
            "diff_ns_per_switch": storm.quartiles([x["diff"] for x in rows]),
            # each side's own order: the one attached first and second
            "diff_when_a_first": storm.quartiles([x["diff"] for x in rows if x["first"] == a.key]),
            "diff_when_b_first": storm.quartiles([x["diff"] for x in rows if x["first"] == b.key]),
            **balanced(rows, a, b)}


def balanced(rows: list[dict], a: ct.Contender, b: ct.Contender) -> dict:
    """B - A with the order taken out: the program attached first meets the
    switch's data cold and pays for it (some 20 ns here), so the mean of the
    two orders' median differences; and the order's own cost, half their
    gap."""
    af = [x["diff"] for x in rows if x["first"] == a.key]
    bf = [x["diff"] for x in rows if x["first"] == b.key]
    if not af or not bf:
        return {"diff_balanced": None, "first_cost": None}
    ma, mb = statistics.median(af), statistics.median(bf)
    return {"diff_balanced": (ma + mb) / 2, "first_cost": (mb - ma) / 2}


def paired_report(p: dict, labels: dict) -> str:
    def q(d: dict) -> str:
        if d.get("median") is None:
            return "n/a"
        return f"{d['median']:.1f} ({d['q1']:.1f} to {d['q3']:.1f}, n={d['n']})"

    return "\n".join([f"paired bpf_stats, the same storms, attach order alternated; medians (quartiles):",
                      f"  A {p['a']} ({labels[p['a']]}): {q(p['a_ns_per_switch'])} ns/switch",
                      f"  B {p['b']} ({labels[p['b']]}): {q(p['b_ns_per_switch'])} ns/switch",
                      f"  B - A: {q(p['diff_ns_per_switch'])} ns/switch; A attached first: "
                      f"{q(p['diff_when_a_first'])}, B first: {q(p['diff_when_b_first'])}",
                      "  B - A, order taken out (the mean of those two): " + (
                          "n/a" if p["diff_balanced"] is None else
                          f"{p['diff_balanced']:+.1f} ns/switch (attached first costs {p['first_cost']:.1f})")])


def git_tree(rev: str, dest: str) -> str:
    """bpf/*.bpf.c at a revision, written to dest (read-only git use)."""
    os.makedirs(dest, exist_ok=True)
    ls = subprocess.run(["git", "-C", ROOT, "ls-tree", "--name-only", f"{rev}:bpf"], capture_output=True,
                        text=True, check=True).stdout.split()
    for name in [n for n in ls if n.endswith((".bpf.c", ".h"))]:
        r = subprocess.run(["git", "-C", ROOT, "show", f"{rev}:bpf/{name}"], capture_output=True, text=True)
        if r.returncode != 0 and name.endswith(".h"):
            continue  # a revision before the shared header
        r.check_returncode()
        with open(os.path.join(dest, name), "w") as f:
            f.write(r.stdout)
    return dest


def fmt(s: dict) -> str:
    if not s or s.get("median") is None:
        return "n/a"
    return f"{s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f}, n={s['n']})"


def report(results: dict, labels: dict) -> str:
    from tabulate import tabulate

    st = results.get("storm", {})
    acc = results.get("stats", {})
    rows = []
    for key, label in labels.items():
        c = (st.get("contenders") or {}).get(key) or {}
        a = acc.get(key) or {}
        progs = a.get("programs") or {}
        per = ", ".join(f"{n} {p['ns_per_run']:.0f}" for n, p in sorted(progs.items(), key=lambda kv: -kv[1]["run_cnt"])
                        if p.get("run_cnt"))
        nsw = a.get("bpf_ns_per_switch")
        rows.append([label, fmt(c.get("ratio")), fmt(c.get("steady")), fmt(c.get("cpu_ratio")),
                     "n/a" if nsw is None else f"{nsw:.0f}", per or "n/a"])
    m = results["machine"]
    head = (f"{m['date']}, kernel {m['kernel']}, {m['ncpu']} CPUs; storm {st.get('workload')}, "
            f"{results['rounds']} rounds (baseline median {(st.get('baseline') or {}).get('median') or 0:,.0f} ops/s); "
            f"bpf_stats: {results['stats_runs']} run(s) each, medians")
    head += (f"\nsteady pairs: those whose two untraced runs agree within {st.get('steady_gap', 0) * 100:.0f} % "
             f"(storm.STEADY)") if st else ""
    return head + "\n" + tabulate(rows, ["contender", "storm ratio (min–max)", "steady pairs", "per CPU s",
                                         "BPF ns/switch", "ns/run per program"], tablefmt="simple",
                                  disable_numparse=True)


def collector_main(src_dir: str, probes: str) -> int:
    """A running collector (snap --start, from src_dir's BPF C) as a
    contender: start it, hold its links open (so bpf_stats and bpftool name
    its programs as for a tracer process), wait for SIGTERM, stop it."""

    from pstate.kernel import pins
    from pstate.snapshots import collector as resident

    def snap(*args: str, check: bool = True) -> None:
        subprocess.run([sys.executable, os.path.abspath(__file__), "pstate", src_dir, "snap", *args], check=check,
                       stdout=subprocess.DEVNULL)

    snap("--stop", check=False)  # none may be left from an earlier run
    snap("--start", "--quiet", "--probes", probes)
    fds = []
    try:
        fds = [pins.get(os.path.join(resident.PIN_DIR, n)) for n in sorted(os.listdir(resident.PIN_DIR))
               if n.startswith("link_")]
        attached_until_stopped()
    finally:
        for fd in fds:
            os.close(fd)
        snap("--stop")
    return 0


def toggled_pass(tmp: str, cs: list[ct.Contender], rounds: int, on_phases: int) -> dict:
    """The storm ratio of each contender with its attachments switched on and
    off within one storm (bench/toggled.py), `rounds` storms of `on_phases`
    on-phases each, the contenders' order rotated each round. Each contender
    runs once untoggled first, so that its program is in the cache (a
    program compiled by bcc is attached by bcc, which no toggle reaches)."""
    here = os.path.abspath(__file__)
    left_out = [c.key for c in cs if here not in c.argv]
    if left_out:
        log(f"  toggled: left out (not attached through pstate's loader): {', '.join(left_out)}")
    cs = [c for c in cs if here in c.argv]
    out = {c.key: {"ratios": [], "runs": [], "errors": []} for c in cs}
    for c in cs:
        run = ct.Running(c, os.path.join(tmp, f"warm-{c.key}"))
        try:
            run.wait_ready()
        except ct.StartFailed as e:
            log(f"  warm-up {c.key}: FAILED {e}")
        finally:
            run.stop()
    for r in range(rounds):
        for c in cs[r % len(cs):] + cs[:r % len(cs)]:
            wd = os.path.join(tmp, f"toggled-{r}-{c.key}")
            i = c.argv.index(here)
            tc = ct.Contender(c.key, c.label, c.kind, c.argv[:i + 1] + ["toggled"] + c.argv[i + 1:], c.ready,
                              env={**c.env, toggled.ACK_ENV: os.path.join(wd, "toggle-ack")})
            run = None
            try:
                run = ct.Running(tc, wd)
                run.wait_ready()
                m = toggled.measure(run.pid, tc.env[toggled.ACK_ENV], on_phases, storm.WORKLOAD_CPU, ct.TRACER_CPU)
                run.stop()
                res = ct.collect(run)
                res.update(attached=m["attached"], rates=m["rates"])
                if not res.get("ok") or not m["attached"]:
                    out[c.key]["errors"].append(res.get("error") or "nothing was attached")
                    log(f"  toggled round {r + 1}/{rounds} {c.key}: FAILED {res.get('error', 'nothing attached')}")
                    continue
                out[c.key]["ratios"] += m["ratios"]
                out[c.key]["runs"].append(res)
                log(f"  toggled round {r + 1}/{rounds} {c.key}: median {statistics.median(m['ratios']):.3f} of "
                    f"{len(m['ratios'])} on-phases ({m['attached']} attachments) load {storm.loadavg()[0]:.2f}")
            except (ct.StartFailed, RuntimeError) as e:
                out[c.key]["errors"].append(str(e))
                log(f"  toggled round {r + 1}/{rounds} {c.key}: FAILED {e}")
            finally:
                if run is not None and run.returncode is None:
                    run.stop()
                shutil.rmtree(wd, ignore_errors=True)
    for slot in out.values():
        slot["ratio"] = storm.quartiles(slot["ratios"])
    return {"phase_s": toggled.PHASE_S, "settle_s": toggled.SETTLE_S, "on_phases": on_phases, "contenders": out}


def toggled_report(t: dict, labels: dict) -> str:
    from tabulate import tabulate

    rows = []
    for key, slot in t["contenders"].items():
        q = slot["ratio"]
        rows.append([labels[key], "n/a" if q["median"] is None else
                     f"{q['median']:.3f} ({q['q1']:.3f} to {q['q3']:.3f}, n={q['n']})", len(slot["errors"])])
    return (f"storm ratio, tracer switched on and off within one storm ({t['phase_s']:.2f} s phases; "
            f"median and quartiles of the on-phases):\n"
            + tabulate(rows, ["contender", "storm ratio", "failed runs"], tablefmt="simple", disable_numparse=True))


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "toggled":
        toggled.enable()
        del sys.argv[1]
        return main()
    if len(sys.argv) > 3 and sys.argv[1] == "collector":
        return collector_main(sys.argv[2], sys.argv[3])
    if len(sys.argv) > 1 and sys.argv[1] == "floor":
        return floor_main()
    if len(sys.argv) > 1 and sys.argv[1] == "floor2":
        return floor_main(FLOOR2_C)
    if len(sys.argv) > 1 and sys.argv[1] == "floor_btf":
        return floor_main(FLOOR_BTF_C, "tp_btf")
    if len(sys.argv) > 1 and sys.argv[1] == "acct_btf":
        return floor_main(ACCT_BTF_C, "tp_btf")
    if len(sys.argv) > 1 and sys.argv[1] == "floor_btf_wakeup":
        return floor_main(on_wakeup(FLOOR_BTF_C), "tp_btf")
    if len(sys.argv) > 1 and sys.argv[1] == "acct_btf_wakeup":
        return floor_main(on_wakeup(ACCT_BTF_C), "tp_btf")
    if len(sys.argv) > 1 and sys.argv[1] == "acct_ts":
        return floor_main(ACCT_TS_C, "tp_btf")
    if len(sys.argv) > 1 and sys.argv[1] == "count_tp":
        return floor_main(COUNT_TP_C)
    if len(sys.argv) > 2 and sys.argv[1] == "pstate":
        return pstate_main(sys.argv[2], sys.argv[3:])
    if len(sys.argv) > 2 and sys.argv[1] == "pstate-unread":
        return pstate_main(sys.argv[2], sys.argv[3:], unread=True)
    if len(sys.argv) > 2 and sys.argv[1] == "pstate-nohist":
        return pstate_main(sys.argv[2], sys.argv[3:], NO_HIST)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--rounds", type=int, default=6, help="interleaved rounds (default 6)")
    ap.add_argument("--loops", type=int, default=100_000, help="perf bench sched pipe loops (default 100000)")
    ap.add_argument("--stats-runs", type=int, default=2, help="bpf_stats storms per contender (default 2; 0: none)")
    ap.add_argument("--against", metavar="REV", help="also run bpf/*.bpf.c of this git revision")
    ap.add_argument("--against-dir", metavar="DIR", help="also run the BPF C in DIR (keys end in _<its name>): "
                    "a variant the user space of this tree decodes, e.g. a revision with this struct event")
    ap.add_argument("--src", default=os.path.join(ROOT, "bpf"), help="directory of the BPF C (default bpf/)")
    ap.add_argument("--only", help="comma-separated contender keys")
    ap.add_argument("--steady", type=float, default=storm.STEADY * 100, metavar="PCT",
                    help="a pair is steady when its two untraced runs agree within PCT %% (default %(default)g)")
    ap.add_argument("--toggled", type=int, metavar="N", help="the storm ratio with the tracer switched on and off "
                    "within one storm (bench/toggled.py): N on-phases per storm, --rounds storms per contender")
    ap.add_argument("--parts", action="store_true", help="also run record with each of PARTS' changes (see there), "
                    "with the unchanged record and record --min-dur 1ms and the floor")
    ap.add_argument("--paired", metavar="A,B", help="only bpf_stats, A and B attached at once (see the top)")
    ap.add_argument("--parts-from", metavar="REV", default=PARTS_FROM,
                    help=f"the revision whose BPF C --parts changes (default {PARTS_FROM}, theirs)")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "kernel_cost.json"))
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_kernel_cost.py needs root (BPF, sysctl)")
    tmp = tempfile.mkdtemp(prefix="pstate-kcost-")
    try:
        if a.parts and (a.against or a.against_dir):
            sys.exit("--parts runs beside the revision its parts change (--parts-from), not --against")
        if a.parts:
            a.against = a.parts_from
        tag = (a.against or "").replace("/", "_")[:12]
        against = git_tree(a.against, os.path.join(tmp, "against")) if a.against else None
        if a.against_dir:
            if a.against:
                sys.exit("--against and --against-dir: one of them")
            against, tag = os.path.abspath(a.against_dir), os.path.basename(os.path.abspath(a.against_dir))[:12]
        parts = part_dirs(against, tmp) if a.parts else None
        cs = make_contenders(os.path.abspath(a.src), against, tag, parts)
        if parts and not a.only:
            a.only = ",".join(["floor_btf", f"record_min_dur_{tag}", f"record_{tag}"]
                              + [f"{PARTS[p][0]}_{p}" for p in parts])
        labels = {c.key: c.label for c in cs}
        results = {"machine": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               "kernel": platform.release(), "ncpu": os.cpu_count(),
                               "loadavg_start": storm.loadavg()},
                   "rounds": a.rounds, "stats_runs": a.stats_runs, "against": a.against or a.against_dir}
        runner = Runner(tmp)
        pipe = storm.pipe_storm(a.loops)
        if a.paired:
            pair = a.paired.split(",")
            by_key = {c.key: c for c in cs}
            if len(pair) != 2 or not all(k in by_key for k in pair):
                sys.exit(f"--paired takes two of: {', '.join(by_key)}")
            log(f"paired: {pair[0]} and {pair[1]} at once, {a.stats_runs} storms")
            results["paired"] = paired_pass(runner, pipe, by_key[pair[0]], by_key[pair[1]], a.stats_runs)
            text = paired_report(results["paired"], labels)
        else:
            if a.only:
                want = BTF_SET if a.only == "btf" else a.only.split(",")
                cs = sorted((c for c in cs if c.key in want), key=lambda c: want.index(c.key))
                labels = {c.key: c.label for c in cs}
            if a.toggled:
                log(f"toggled: {a.rounds} storms of {a.toggled} on-phases for each of {len(cs)} contenders")
                results["toggled"] = toggled_pass(tmp, cs, a.rounds, a.toggled)
                text = toggled_report(results["toggled"], labels)
            else:
                log(f"storm: {pipe.label}, {a.rounds} rounds of {len(cs)} contenders")
                results["storm"] = storm.interleaved(pipe, cs, a.rounds, runner.traced, log, a.steady / 100)
                if a.stats_runs:
                    log("bpf_stats")
                    results["stats"] = stats_pass(runner, pipe, cs, a.stats_runs)
                text = report(results, labels)
        results["machine"]["loadavg_end"] = storm.loadavg()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(text)
    storm.write_results(a.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

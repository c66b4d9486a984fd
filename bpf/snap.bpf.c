// pstate snap: per-thread time in each scheduler state, accumulated in a BPF
// map that user space reads at each snapshot. No events leave the kernel.
//
// It reads no kernel struct through a header: each tracepoint is taken the
// way the plan says (pstate.kernel.probeplan, bpf/tpargs.h): as a tp_btf
// program (raw arguments, task_struct fields at offsets from the running
// kernel's BTF), a raw tracepoint (the same offsets, read with
// bpf_probe_read_kernel) or a classic one (only the tracepoint's fields, whose
// layout BCC builds from the running kernel's tracefs format files). So it
// compiles against any kernel header tree, even one of another kernel
// version: that is what lets pstate run where no matching headers exist.
// Keep it so: no struct from a header, no kernel memory read but at offsets
// from the BTF.
//
// Compile-time settings (-D cflags, set by cli/pstate/snapshots/taskmaps.py):
//   REPORT_MASK   prev_state bits that name a blocked state (from print_fmt)
//   NR_KBITS      number of those bits that get a counter (highest bit + 1)
//   MAX_TASKS     size of the live-thread hash, and of the map of freed threads
//   MAX_FOLDS     size of the map of folded groups (`folds`)
//   TASKS_BY_TID  every tid fits (pid_max <= MAX_TASKS): `tasks` is an array
//                 of TID_SLOTS (= pid_max) rows indexed by tid. The verifier
//                 inlines an array lookup, where a hash lookup is a function
//                 call, twice per context switch; a row whose `since` is 0 is
//                 a thread not seen. Needs Linux 5.5 (mmap of an array)
//   PATH_<event>  how each tracepoint is taken, with the offsets and the
//                 settings for what a kernel lacks (bpf/tpargs.h)
//
// Layout: `tasks` holds one row per live thread, keyed by tid. When the
// kernel frees a thread its final row moves to `gone`, keyed by (tid,
// start_ts) so a reused tid cannot overwrite it; user space drains `gone` at
// each snapshot. A task that lives and dies between two snapshots is thus
// still in the next one. Each row also holds its thread's latency
// histograms (bpf/snaphist.h). When `gone` has no room (an exit burst
// larger than the map, or readers that lag), the final row is folded: its
// counters and histograms are added to its group's row in `folds`, kept
// since the program was loaded (see fold()).
//
// Seeding: at the start user space writes a row for every live thread, from
// /proc, but only where none exists (the program may have created one since
// it was attached): bpf/taskrow.h.

#include "pstate.h" // SLOT_*, SNAP_F_*, SNAP_CNT_*: shared with cli/pstate/snapshots/taskmaps.py
#include "tpargs.h" // PSTATE_PROBE, SW_*, WK_*: the arguments on either path
#include "snaphist.h" // struct snap_hist, hist_*: latency histograms in the rows

#define NR_SLOTS (SLOT_KERNEL + NR_KBITS)

#define CLONE_THREAD_FLAG 0x00010000

// user space decodes this through BCC's generated ctypes layout
struct snap_task {
    u64 start_ts; // fork time, or first seen (SNAP_F_GUESSED), or /proc start time (seeded)
    u64 since;    // when the thread entered `state`
    u64 exit_ts;  // 0 while alive
    u64 nvcsw;    // voluntary switch-outs (blocked)
    u64 nivcsw;   // involuntary switch-outs (preempted)
    u64 wakeups;  // wake-ups from a blocked state
    u64 ns[NR_SLOTS];
    // Of ns[SLOT_RUNNING], the time the kernel did not count as the task's
    // own (stolen by the hypervisor, or spent in interrupts, where it
    // accounts them apart): per slice, wall time less the growth of the
    // task's se.sum_exec_runtime (add_steal_irq). Running time stays wall
    // time, so the states still tile the interval and never shrink at a
    // snapshot (the open slice's part is known at its switch-out).
    u64 steal_irq;
    u64 steal_owed; // slices the kernel counted longer than their wall time, not yet made up (add_steal_irq)
    u64 exec; // se.sum_exec_runtime + 1 at the last switch seen (bpf/tpargs.h SW_*_EXEC); 0: not known
    u32 tgid; // 0 = not known yet (first seen as the next task of a switch)
    u8 state;
    u8 flags;
    u16 pad;
    char comm[16];
    u64 cgroup; // v2 cgroup id: the parent's at task_newtask, the task's own at exit; 0 = not known
    struct snap_hist hist; // last: the fields above are those every event touches
};

// A group of folded final rows: the v2 cgroup the task exited in and the
// name of its process (the main thread's comm, as user space groups a
// process's threads). From those two, user space derives every group
// --prom-by has that outlives its processes: the cgroup, its unit, the
// comm (and a title cannot be read for a task gone: "[comm]"). A pid or
// tid in the key would make it as large as the rows it replaces.
struct fold_key {
    u64 cgroup;
    char comm[16];
};

struct snap_fold {
    u64 tasks; // final rows folded into it
    u64 nvcsw;
    u64 nivcsw;
    u64 wakeups;
    u64 ns[NR_SLOTS];
    u64 steal_irq;
    struct snap_hist hist;
};

struct gone_key {
    u32 tid;
    u32 pad;
    u64 start_ts;
};

#ifdef TASKS_BY_TID
// BPF_F_MMAPABLE (not from the headers, which may predate it): user space
// reads the array through a shared mapping, with no copy of the empty rows
#define MAP_MMAPABLE (1U << 10)
BPF_F_TABLE("array", u32, struct snap_task, tasks, TID_SLOTS, MAP_MMAPABLE);
#else
BPF_HASH(tasks, u32, struct snap_task, MAX_TASKS);
#endif
#define TASKROW_T struct snap_task
#define TASKROW_SEEDS TID_SLOTS
#include "taskrow.h" // `seeds`: the rows from /proc of the threads alive at the start
BPF_HASH(gone, struct gone_key, struct snap_task, MAX_TASKS);
BPF_HASH(folds, struct fold_key, struct snap_fold, MAX_FOLDS);
// one all-zero group row, never written: what a new group starts from (it
// does not fit the stack)
BPF_ARRAY(fold_zero, struct snap_fold, 1);
BPF_PERCPU_ARRAY(counters, u64, SNAP_NR_COUNTERS);
// A row is larger than the BPF stack (512 bytes) since it holds histograms:
// rows are built in a per-CPU scratch row, one slot per context that can
// interrupt another on a CPU, so that no program's row is overwritten
// halfway by one that interrupted it. SCRATCH_SCHED serves sched_switch and
// the wake-ups, which run with interrupts off (a hard interrupt's wake-up
// can interrupt any other program, but not these). SCRATCH_TASK serves
// task_newtask and exec, in process context with interrupts on: neither
// interrupts the other. SCRATCH_FREE serves sched_process_free, which runs
// in an RCU callback, in softirq, and so can interrupt task_newtask or exec
// on the same CPU: as a classic tracepoint it could not (the kernel ran no
// classic program while another ran on the CPU: bpf_prog_active), as a
// tp_btf or raw tracepoint program it can (only the same program is kept
// from running twice on a CPU: free cannot interrupt free). (exit takes no
// scratch row.)
#define SCRATCH_SCHED 0
#define SCRATCH_TASK 1
#define SCRATCH_FREE 2
BPF_PERCPU_ARRAY(scratch, struct snap_task, 3);

// The scratch row of slot idx, zeroed; 0 only if the map lookup failed.
static __always_inline struct snap_task *scratch_row(u32 idx) {
    struct snap_task *t = scratch.lookup(&idx);
    if (t)
        __builtin_memset(t, 0, sizeof(*t));
    return t;
}

// Only rare counts (a full map), some taken by programs that run with
// interrupts on (task_newtask, exec, exit, free), where an interrupt's
// wake-up program, or free in softirq, could run between a load and a store:
// an atomic add.
static __always_inline void count(u32 idx) {
    u64 *c = counters.lookup(&idx);
    if (c)
        __sync_fetch_and_add(c, 1);
}

// Whether the slot tasks.lookup() gave holds a thread's row (a hash holds
// only those; an array row is all zero until its tid is seen, and every row
// written has `since` set), and emptying one.
static __always_inline int known(struct snap_task *t) {
#ifdef TASKS_BY_TID
    return t && t->since;
#else
    return t != 0;
#endif
}

static __always_inline void forget(u32 tid, struct snap_task *t) {
#ifdef TASKS_BY_TID
    taskrow_forget(tid, t);
#else
    tasks.delete(&tid);
#endif
}

// The thread's row, given its slot from tasks.lookup(), or 0 when it has none
// yet. With TASKS_BY_TID a thread's first event takes its seed, if any
// (taskrow.h).
static __always_inline struct snap_task *row_of(u32 tid, struct snap_task *slot) {
#ifdef TASKS_BY_TID
    if (!slot || slot->since)
        return slot;
    return taskrow_take_seed(tid, slot) ? slot : 0;
#else
    return slot;
#endif
}

// Write a thread's row into its slot (with TASKS_BY_TID) or the hash; the
// hash write is an insert when `only_new`, so a row created meanwhile on
// another CPU is not overwritten.
static __always_inline void put(u32 tid, struct snap_task *slot, struct snap_task *row, int only_new) {
#ifdef TASKS_BY_TID
    if (slot) {
        *slot = *row;
        return;
    }
    count(SNAP_CNT_TASKS_FULL); // a tid beyond pid_max at load time
#else
    if ((only_new ? tasks.insert(&tid, row) : tasks.update(&tid, row)) != 0)
        count(SNAP_CNT_TASKS_FULL);
#endif
}

// Counter slot of reported prev_state bits: the lowest set bit names a
// combination, as the kernel's own letters do.
static __always_inline u8 kernel_slot(u32 bits) {
#pragma unroll
    for (int i = 0; i < NR_KBITS; i++) {
        if (bits & (1u << i))
            return SLOT_KERNEL + i;
    }
    return SLOT_PREEMPTED;
}

// Add the time since the last event to the current state, and enter `to`.
static __always_inline void move_to(struct snap_task *t, u8 to, u64 now) {
    u32 slot = t->state;
    if (t->since && now > t->since && slot < NR_SLOTS)
        t->ns[slot] += now - t->since;
    t->state = to;
    t->since = now;
}

static __always_inline void first_seen(u32 tid, struct snap_task *slot, u32 tgid, u8 state, u64 now,
                                       const char *comm, u64 exec) {
    struct snap_task *fresh = scratch_row(SCRATCH_SCHED);
    if (!fresh)
        return;
    fresh->start_ts = now;
    fresh->since = now;
    fresh->tgid = tgid;
    fresh->state = state;
    fresh->flags = SNAP_F_GUESSED;
    fresh->exec = exec;
    COMM_COPY(fresh->comm, comm);
    put(tid, slot, fresh, 1);
}

// A running slice ends at `now`, the task's count being `exec` (+ 1; 0: not
// known): what of its wall time the kernel did not count as the task's own
// goes to steal_irq. Known only when the count was read at the slice's
// start too (or at the task's last switch-out: it grows only while the task
// runs). A slice may be counted longer than its wall time: after a wake-up
// preempts a task, the kernel's switch reuses the run-queue clock of the
// wake-up, so the task preempted is charged short and the one woken long,
// by the same gap (and the two clocks differ by their rounding). record
// keeps such a slice's difference negative; here a counter never shrinks,
// so it is owed and made up from the task's later slices first: per
// thread, steal_irq is the most the signed sum has been, not a sum of the
// positive parts.
static __always_inline void add_steal_irq(struct snap_task *t, u64 exec, u64 now) {
    u64 run = exec_growth(exec, t->exec);
    if (run == ~0ULL || t->state != SLOT_RUNNING || !t->since || now <= t->since)
        return;
    u64 wall = now - t->since;
    if (wall < run) {
        t->steal_owed += run - wall;
        return;
    }
    u64 d = wall - run;
    if (d <= t->steal_owed) {
        t->steal_owed -= d;
        return;
    }
    t->steal_irq += d - t->steal_owed;
    t->steal_owed = 0;
}

// One clock read per run, taken first: it is the costliest step (a VM's
// clock read is not cheap) and both sides of the switch share it.
PSTATE_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 prev = SW_PREV_PID;
    u32 next = SW_NEXT_PID;

    if (prev != 0) {
        u32 bits = SW_PREV_STATE & REPORT_MASK;
        u8 to = bits ? kernel_slot(bits) : SLOT_PREEMPTED;
        struct snap_task *slot = tasks.lookup(&prev);
        struct snap_task *t = row_of(prev, slot);
        u64 exec = SW_PREV_EXEC;
        if (t) {
            add_steal_irq(t, exec, now);
            if (exec)
                t->exec = exec;
            // The time since the last event goes to the state the row says,
            // even when an event was missed (a task seeded as R was queued,
            // or the kernel did not trace a switch): user space has already
            // reported the open interval that way, and counters never shrink.
            hist_switch_out(HIST_ROW(t));
            move_to(t, to, now);
            // prev is the current task: its tgid and name are known for sure
            // (comm changes with prctl(PR_SET_NAME) and /proc/PID/comm: the
            // name is taken again at each switch-out, two 8-byte loads).
            // A thread's tgid never changes under its tid (exec moves the row
            // to the new tid), so the helper is called only for a row without
            // it: one call less on almost every switch.
            if (!t->tgid)
                t->tgid = SW_PREV_TGID;
            SW_PREV_COMM(t->comm);
            if (bits)
                t->nvcsw++;
            else
                t->nivcsw++;
        } else {
            COMM_BUF(comm);
            SW_PREV_COMM(comm);
            first_seen(prev, slot, SW_PREV_TGID, to, now, comm, exec);
        }
    }

    if (next != 0) {
        struct snap_task *slot = tasks.lookup(&next);
        struct snap_task *t = row_of(next, slot);
        // (0 on the classic path: the row keeps its last switch-out's)
        u64 exec = SW_NEXT_EXEC;
        if (t) {
            hist_switch_in(HIST_ROW(t), now);
            move_to(t, SLOT_RUNNING, now);
            if (exec)
                t->exec = exec;
        } else {
            COMM_BUF(comm);
            SW_NEXT_COMM(comm);
            first_seen(next, slot, SW_NEXT_TGID, SLOT_RUNNING, now, comm, exec);
        }
    }
    return 0;
}

// comm: the wakee's name (WK_COMM_AT), task: the wakee (WK_TASK), each read
// only for a wakee first seen
static __always_inline void woken(u32 tid, const char *comm, const char *task, int is_new) {
    struct snap_task *slot = tasks.lookup(&tid);
    struct snap_task *t = row_of(tid, slot);
    if (!t) {
        first_seen(tid, slot, WK_TGID_OF(task), SLOT_RUNNABLE, bpf_ktime_get_ns(), comm, 0);
        return;
    }
    // Woken before it got off the CPU, or already queued: it never blocked
    // (checked before reading the clock, which is not free in a VM).
    if (t->state == SLOT_RUNNING || t->state == SLOT_RUNNABLE || t->state == SLOT_PREEMPTED)
        return;
    if (!is_new)
        t->wakeups++;
    u64 now = bpf_ktime_get_ns();
    hist_woken(HIST_ROW(t), now);
    move_to(t, SLOT_RUNNABLE, now);
}

PSTATE_PROBE(sched, sched_wakeup) {
    COMM_BUF(buf);
    woken(WK_PID, WK_COMM_AT(buf), WK_TASK, 0);
    return 0;
}

PSTATE_PROBE(sched, sched_wakeup_new) {
    COMM_BUF(buf);
    woken(WK_PID, WK_COMM_AT(buf), WK_TASK, 1);
    return 0;
}

// The group row of a final row, created when missing; 0 when the map is full.
static __always_inline struct snap_fold *fold_group(struct snap_task *last) {
    struct fold_key key = {};
    key.cgroup = last->cgroup;
    COMM_COPY(key.comm, last->comm);
    // a thread goes by its process's name: the main thread's row, while it
    // has one (it is freed last)
    u32 leader = last->tgid;
    if (leader) {
        struct snap_task *l = tasks.lookup(&leader);
        if (known(l))
            COMM_COPY(key.comm, l->comm);
    }
    struct snap_fold *f = folds.lookup(&key);
    if (f)
        return f;
    u32 zero = 0;
    struct snap_fold *empty = fold_zero.lookup(&zero);
    if (!empty)
        return 0;
    folds.insert(&key, empty); // (fails when another CPU created it meanwhile)
    return folds.lookup(&key);
}

// Add a final row to its group. Frees of two CPUs may fold into one group
// at once, and an interrupt's free may come between a load and a store on
// this one: every add is atomic. Rare (gone is full), so never on the hot path.
static __always_inline void fold(struct snap_task *last) {
    struct snap_fold *f = fold_group(last);
    if (!f) {
        count(SNAP_CNT_FOLD_LOST);
        return;
    }
    __sync_fetch_and_add(&f->tasks, 1);
    __sync_fetch_and_add(&f->nvcsw, last->nvcsw);
    __sync_fetch_and_add(&f->nivcsw, last->nivcsw);
    __sync_fetch_and_add(&f->wakeups, last->wakeups);
#pragma unroll
    for (int i = 0; i < NR_SLOTS; i++)
        __sync_fetch_and_add(&f->ns[i], last->ns[i]);
    __sync_fetch_and_add(&f->steal_irq, last->steal_irq);
#pragma unroll
    for (int k = 0; k < HIST_KINDS; k++) {
        __sync_fetch_and_add(&f->hist.k[k].sum, last->hist.k[k].sum);
#pragma unroll
        for (int b = 0; b < HIST_BUCKETS; b++)
            if (last->hist.k[k].n[b])
                __sync_fetch_and_add(&f->hist.k[k].n[b], last->hist.k[k].n[b]);
    }
    count(SNAP_CNT_FOLDED);
}

// Move a thread's final row to `gone`, closing its last state at `now`;
// with no room there, fold it into its group. Built in scratch slot `idx`,
// the caller's (see SCRATCH_*).
static __always_inline void finish(u32 tid, struct snap_task *t, u64 now, u32 idx) {
    struct snap_task *last = scratch_row(idx);
    if (!last)
        return;
    *last = *t;
    move_to(last, SLOT_REAPED, now);
    last->flags |= SNAP_F_FREED | SNAP_F_EXITED;
    if (!last->exit_ts)
        last->exit_ts = now;
    struct gone_key key = {};
    key.tid = tid;
    key.start_ts = last->start_ts;
    if (gone.update(&key, last) != 0) {
        count(SNAP_CNT_GONE_FULL);
        fold(last);
    }
    forget(tid, t);
}

// task_newtask runs in the parent's context with the clone flags: the child's
// tgid is the parent's for a thread, its own pid for a process. Its time is
// the child's birth: the identity (tid, start_ts) survives tid reuse.
PSTATE_PROBE(task, task_newtask) {
    u64 now = bpf_ktime_get_ns();
    u32 child = LF_NEW_PID;
    // The kernel frees a task (sched_process_free) an RCU grace period after
    // its pid was released, so the pid may already be in use again: a row
    // still under this tid is the previous owner's, and final.
    struct snap_task *slot = tasks.lookup(&child);
    if (known(slot))
        finish(child, slot, now, SCRATCH_TASK);
    struct snap_task *fresh = scratch_row(SCRATCH_TASK);
    if (!fresh)
        return 0;
    fresh->start_ts = now;
    fresh->since = now;
    fresh->state = SLOT_NEW;
    // the child's se.sum_exec_runtime is 0 until it first runs (sched_fork):
    // its first slice is known on every path
    fresh->exec = 1;
    fresh->tgid = (LF_NEW_CLONE_FLAGS & CLONE_THREAD_FLAG) ? (u32)(bpf_get_current_pid_tgid() >> 32) : child;
    fresh->cgroup = bpf_get_current_cgroup_id(); // the parent's (current): the child's at fork
    LF_NEW_COMM(fresh->comm);
    put(child, slot, fresh, 0);
    return 0;
}

PSTATE_PROBE(sched, sched_process_exec) {
    u32 tid = LF_EXEC_PID;
    u32 old = LF_EXEC_OLD_PID;
    if (old != tid) {
        // A non-leader thread exec'd and took over the leader's pid. The old
        // leader, dead by now, is freed later under the thread's former pid,
        // whose row is gone by then: its final row under this pid goes to
        // `gone` now, before the thread's row takes its place. (row_of: a
        // seed no event took yet is the row.)
        int had_leader = 0;
        u64 leader_start = 0;
        struct snap_task *leader = row_of(tid, tasks.lookup(&tid));
        if (leader) {
            had_leader = 1;
            leader_start = leader->start_ts;
            finish(tid, leader, bpf_ktime_get_ns(), SCRATCH_TASK);
        }
        struct snap_task *o = row_of(old, tasks.lookup(&old));
        if (o) {
            struct snap_task *copy = scratch_row(SCRATCH_TASK);
            if (!copy)
                return 0;
            *copy = *o;
            // A thread and its leader seeded from /proc in the same clock
            // tick have the same start: the thread's moves 1 ns on, so that
            // the two stay two threads under this tid (user space matches it).
            if (had_leader && copy->start_ts == leader_start)
                copy->start_ts += 1;
            forget(old, o);
            put(tid, tasks.lookup(&tid), copy, 0);
        }
    }
    struct snap_task *t = tasks.lookup(&tid);
    if (known(t))
        bpf_get_current_comm(t->comm, sizeof(t->comm));
    return 0;
}

PSTATE_PROBE(sched, sched_process_exit) {
    u32 tid = LF_EXIT_PID;
    struct snap_task *t = row_of(tid, tasks.lookup(&tid));
    if (t) {
        t->flags |= SNAP_F_EXITED;
        t->exit_ts = bpf_ktime_get_ns();
        t->cgroup = bpf_get_current_cgroup_id(); // the exiting task is current: exact
    }
    return 0;
}

// The kernel frees the task (after its parent reaped the zombie, or at once
// for a thread): close its last state and move the final row to `gone`. A
// row that has not exited belongs to a new task that reuses the pid. (A
// zombie seeded from /proc has had no event yet: this takes its seed.)
PSTATE_PROBE(sched, sched_process_free) {
    u32 tid = LF_FREE_PID;
    struct snap_task *t = row_of(tid, tasks.lookup(&tid));
    if (t && (t->flags & SNAP_F_EXITED))
        finish(tid, t, bpf_ktime_get_ns(), SCRATCH_FREE);
    return 0;
}

// pstate record: scheduler state transitions of every thread, from the sched
// tracepoints, into a BPF ring buffer that user space drains in batches.
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
// Compile-time settings (-D cflags, set by pstate.commands.record and the plan):
//   REPORT_MASK    prev_state bits that name a blocked state (from print_fmt)
//   DEAD_BITS      the bits of the dead (X) and zombie (Z) states
//   MAX_TASKS      size of the per-thread state map
//   TASKS_BY_TID   the map is an array indexed by tid (set when pid_max <=
//                  MAX_TASKS): its lookup is inlined, where a hash lookup is
//                  a call; an all-zero row is a thread not seen
//   RB_PAGES       ring buffer size in pages
//   SAMPLE         keep one event in sample_every[0] (--max-rate)
//   STACK_ENTRIES  record --stacks: size of the stack-trace map (unset: no map,
//                  no stacks)
//   PATH_<event>   how each tracepoint is taken, with the offsets and the
//                  settings for what a kernel lacks (bpf/tpargs.h)
//   CPU_SLOTS      records of the sched programs go to per-CPU runs of this
//                  many slots (a power of two) before the ring buffer (see
//                  struct slot), for SLOT_CPUS possible CPUs
//   WAKE_AT_WAKEUP wake-ups at sched_wakeup, with the waker of one queued on
//                  the target CPU's wake list noted at csd_queue_cpu (see
//                  there), where the kernel has them: TASK_WAKE_ENTRY
//                  CSD_FLAGS CSD_TYPE_TTWU CSD_TYPE_MASK (pstate.kernel.btf
//                  MEMBERS, probeplan); else at sched_waking
//
// Filters are map values, written by user space before the first event
// (cli/pstate/kernel/filtermaps.py), so one compiled program serves every filter: the
// `settings` row (state mask, minimum duration, idle, which sets to consult)
// and the sets pid_filter, tid_filter, comm_filter and cpu_filter. The
// cheapest tests come first: the state mask and minimum duration, then the
// CPU array, then the hash sets.

#include "pstate.h"
#include "tpargs.h" // PSTATE_PROBE, SW_*, WK_*: the arguments on either path

#define CLONE_THREAD_FLAG 0x00010000
#define ALL_STATES 0xffffffffffffffffULL
#define WAKE_PENDING 0x80 // task_state.wake_flags: a waker is kept for the switch-in
#define WAKE_QUEUED 0x40  // task_state.wake_flags: the waker of a wake-up on a wake list (WAKE_AT_WAKEUP)
// task_state.flags besides F_THREAD (record -p/-c/--cgroup, see queued_followed):
#define TS_QUEUED 0x100 // a followed task in a run queue, counted in queued_followed
#define TS_NAMED 0x200  // its waker record was written (since its last exec)

struct task_state {
    u64 since; // when the task entered state; 0 = not seen
    u32 tgid;  // 0 = not known yet
    u16 state;
    u16 flags;
    // A wake-up that came while the row still said running: sched_waking on
    // another CPU before this task's sched_switch (try_to_wake_up does not
    // wait for the switch-out), or a wake-up that found the task still on
    // its run queue. The waker is kept here until the task's next switch
    // tells them apart (see sched_switch).
    u32 wake_pid;
    u32 wake_tid;
    u32 wake_cpu;
    u8 wake_flags; // WAKE_PENDING or WAKE_QUEUED, | F_WAKER_*
    u8 pad[3];
    u32 stack; // stack map id + 1 of the kernel stack it blocked with (settings.stack_mask); 0: none
    u32 qcpu;  // TS_QUEUED: the CPU whose count in queued_followed holds it
    u64 exec; // its se.sum_exec_runtime + 1 at its last switch seen (bpf/tpargs.h SW_*_EXEC); 0: not known
};

// The filters (see the top of this file). Until user space has written
// them (active 1) the program keeps its task rows but reports nothing;
// active 0 again stops the reports at once (record's --duration), however
// long detaching then takes.
struct settings {
    u64 state_mask;   // ALL_STATES, or report transitions into or out of these states only
    u64 min_dur;      // report transitions whose left state lasted at least this (0: all)
    u32 task_filters; // TF_* of the sets to consult
    u8 include_idle;  // report the idle task (tid 0) too
    u8 active;
    // record -p/-c/--cgroup/-- CMD unless --no-antagonists: the others'
    // slices on a CPU while a followed task waits there
    u8 antagonists;
    u8 pad;
    u64 stack_mask;   // prev_state bits whose switch-out takes the kernel stack (record --stacks; 0: none)
};

struct comm_key {
    u64 w[2]; // the name, zero after it
};

// Whether this CPU is in interrupt context now, kept by the irq, softirq
// and hrtimer tracepoints. No context switch happens in interrupt context,
// so sched_switch clears whatever an exit missed while attaching.
struct irq_ctx {
    u8 hard;  // in a device interrupt handler
    u8 timer; // in an hrtimer callback in hard irq (without HRTIMER_IS_SOFT: any hrtimer callback)
    u8 soft;  // in a softirq handler
    u8 pad[5]; // 8 bytes: per-CPU values are read in 8-byte units
};

#ifdef TASKS_BY_TID
BPF_ARRAY(tasks, struct task_state, MAX_TASKS);
#else
BPF_HASH(tasks, u32, struct task_state, MAX_TASKS);
#endif
// the rows from /proc of the threads alive at the start (`seeds`)
#define TASKROW_T struct task_state
#define TASKROW_SEEDS MAX_TASKS
#include "taskrow.h"
BPF_RINGBUF_OUTPUT(events, RB_PAGES);
#ifdef CPU_SLOTS
// Per-CPU slot rings: each CPU's run of CPU_SLOTS slots, written only by the
// programs on that CPU, with no helper call: the ring buffer's reserve and
// submit are two calls and a lock per record, about half of what record pays
// over --min-dur in a switch storm. A slot is laid out as a ring buffer
// record (user space writes every header once: the length, never busy), so
// user space decodes both alike; it reads each CPU's run between tail and
// head and merges the runs and the ring buffer by time
// (cli/pstate/kernel/slotrings.py). A run holds what --buffer-size holds per
// CPU, 1024 to 8192 slots (cli/pstate/kernel/recordprog.py slots_per_cpu); what
// it cannot hold between two reads of user space goes to the ring buffer,
// which takes bursts.
//
// A slot's fields are stored before head moves past it: a compiler barrier
// is enough where stores are not reordered (x86-64, where user space turns
// this on); user space writes tail once it has copied the slots out.
// Only programs that run with interrupts off write slots (those of the
// sched tracepoints); the rest use the ring buffer, and so does a program
// that finds its CPU's run in use by one it interrupted (busy), so two never
// write one slot.
struct slot {
    u32 len; // written by user space: sizeof(struct event), never busy
    u32 pg_off;
    struct event ev;
};
struct slot_pos {
    u64 head;  // slots written on this CPU (the program's)
    u64 busy;  // a program on this CPU is writing a slot
    u64 pad[6];
    u64 tail;  // slots copied out (user space's), on a cache line of its own
    u64 pad2[7];
};
BPF_F_TABLE("array", u32, struct slot, slots, SLOT_CPUS * CPU_SLOTS, BPF_F_MMAPABLE);
BPF_F_TABLE("array", u32, struct slot_pos, slot_pos, SLOT_CPUS, BPF_F_MMAPABLE);
#endif
BPF_PERCPU_ARRAY(counters, u64, REC_NR_COUNTERS);
BPF_ARRAY(settings, struct settings, 1);
BPF_HASH(pid_filter, u32, u8, FILTER_FOLLOWED); // -p values, and with TF_FOLLOW their descendants
// --cgroup: the ids of its cgroups, and the processes (tgids) known to be in
// one: seeded by user space, grown at sched_switch and by fork, emptied by free
BPF_HASH(cgroup_filter, u64, u8, FILTER_CGROUPS);
BPF_HASH(cgroup_pids, u32, u8, FILTER_FOLLOWED);
BPF_HASH(tid_filter, u32, u8, FILTER_IDS);
BPF_HASH(comm_filter, struct comm_key, u8, FILTER_COMMS);
BPF_ARRAY(cpu_filter, u8, FILTER_CPUS);
BPF_PERCPU_ARRAY(irq_state, struct irq_ctx, 1);
// record -p/-c/--cgroup keeps what the followed tasks' why-views need of the
// tasks it does not follow: while a followed task waits in a run queue
// (runnable or preempted: the count below, kept by its row's TS_QUEUED), the
// switch-outs of the others (EV_SLICE: who held a CPU while it waited, its
// antagonists), and, once per thread, the name of every thread that wakes
// one (EV_WAKER, for the wake-ups naming it). One count per CPU, of the
// followed tasks in its run queue: a switch-out is a slice only on a CPU
// where one waits, so a storm on another CPU costs nothing. A task counts on
// the CPU it was queued on (a wake-up's target, a preemption's CPU) and
// moves with it (sched_migrate_task), so the slices are those of the CPU it
// waits on, which a reader takes from the CPU it got. Signed: a count is
// taken back where it was given, and a lost event (a missed switch-in)
// leaves at worst a count one too high, never a negative one read as many.
BPF_ARRAY(queued_followed, s64, FILTER_CPUS);
// Kernel stacks of tasks blocking in the states of settings.stack_mask. User
// space reads each slot when the wake-up that ends the blocked state arrives,
// and frees it.
#ifdef STACK_ENTRIES
BPF_STACK_TRACE(stacks, STACK_ENTRIES);
#endif
#ifdef SAMPLE
BPF_ARRAY(sample_every, u32, 1);
BPF_PERCPU_ARRAY(sample_tick, u32, 1);
#endif
#ifdef EXIT_GROUP_DEAD_FROM_SIGNAL
// sched_process_exit's group_dead where the kernel's tracepoint lacks it
// (bpf/tpargs.h): tgid -> the signal_struct of the process whose last thread
// a thread claimed; removed when the process's main thread is freed.
BPF_HASH(exit_claims, u32, u64, 16384);
#endif

// The sched programs run with interrupts off; the fork, exec, exit and free
// programs run with them on (free in an RCU callback, in softirq), so an
// interrupt's wake-up program can run on the same CPU between their load
// and store of a counter, and its count would be lost; so can free, in
// softirq, within task_newtask, fork, exec or exit (tp_btf and raw
// tracepoint programs, unlike classic ones, may interrupt one another:
// bpf/tpargs.h). Those programs count with an atomic add (a lock-prefixed
// instruction: kept off the hot path), and so do the rare counts any
// program may take. The other per-CPU value they change, sample_tick, is
// no count: an interrupted update only moves which event is kept.
static __always_inline void count(u32 idx) {
    u64 *c = counters.lookup(&idx);
    if (c)
        (*c)++;
}

static __always_inline void count_atomic(u32 idx) {
    u64 *c = counters.lookup(&idx);
    if (c)
        __sync_fetch_and_add(c, 1);
}

static __always_inline void count_in(u8 irqs_on, u32 idx) {
    if (irqs_on)
        count_atomic(idx);
    else
        count(idx);
}

static __always_inline struct settings *get_settings(void) {
    u32 zero = 0;
    return settings.lookup(&zero);
}

// Time from `since` to `now`, taken on two CPUs: a pair out of order (the
// later event read the clock first) is clamped to 0 and counted, never
// wrapped around.
static __always_inline u64 elapsed(u64 now, u64 since) {
    if (now >= since)
        return now - since;
    count_atomic(STAT_CLAMPED);
    return 0;
}

// Whether a row is a thread's (a hash holds only those; an array row is all
// zero until its tid is seen), and removing one.
static __always_inline int known(struct task_state *ts) {
#ifdef TASKS_BY_TID
    return ts && (ts->since || ts->state || ts->tgid);
#else
    return ts != 0;
#endif
}

// A thread's row, as tasks.lookup() gives it; with TASKS_BY_TID an empty
// slot first takes the thread's seed, if one waits (taskrow.h).
static __always_inline struct task_state *task_row(u32 tid) {
    struct task_state *ts = tasks.lookup(&tid);
#ifdef TASKS_BY_TID
    if (ts && !known(ts))
        taskrow_take_seed(tid, ts);
#endif
    return ts;
}

static __always_inline void forget(u32 tid, struct task_state *ts) {
#ifdef TASKS_BY_TID
    taskrow_forget(tid, ts);
#else
    tasks.delete(&tid);
#endif
}

static __always_inline u64 state_bit(u16 st) {
    // Bit of a state in the state mask: ours in 0..15, kernel bits shifted by 16.
    if (st & ST_KERNEL)
        return ((u64)(st & 0xfff)) << 16;
    return 1ULL << (st & 15);
}

// The bytes of a little-endian word of a name up to its first zero byte,
// the rest zeroed; all of it when it has no zero byte. Without a loop over
// the bytes: one branch per byte would multiply the paths the verifier walks.
static __always_inline u64 name_part(u64 v) {
    u64 zeros = (v - 0x0101010101010101ULL) & ~v & 0x8080808080808080ULL; // exact up to the first zero byte
    if (!zeros)
        return v;
    u64 first = zeros & (~zeros + 1); // bit 7 of the first zero byte
    return v & ((first >> 7) - 1);
}

// Filters that depend on the task and CPU only: the idle test and the CPU
// array first, the hash sets after.
static __always_inline int task_match(struct settings *cfg, u32 cpu, u32 tgid, u32 tid, const char *comm) {
    if (!cfg->active || (tid == 0 && !cfg->include_idle))
        return 0;
    u32 f = cfg->task_filters;
    if (!f)
        return 1;
    if (f & TF_CPU) {
        u8 *ok = cpu_filter.lookup(&cpu);
        if (!ok || !*ok)
            return 0;
    }
    if ((f & TF_TID) && !tid_filter.lookup(&tid))
        return 0;
    if ((f & TF_PID) && !pid_filter.lookup(&tgid))
        return 0;
    if ((f & TF_CGROUP) && !cgroup_pids.lookup(&tgid))
        return 0;
    if (f & TF_COMM) {
        struct comm_key key;
        COMM_COPY(&key, comm);
        u64 lo = name_part(key.w[0]);
        key.w[1] = (lo == key.w[0]) ? name_part(key.w[1]) : 0;
        key.w[0] = lo;
        if (!comm_filter.lookup(&key))
            return 0;
    }
    return 1;
}

static __always_inline int transition_match(struct settings *cfg, u16 from, u16 to, u64 dur) {
    u64 mask = cfg->state_mask;
    if (mask != ALL_STATES && !((state_bit(from) | state_bit(to)) & mask))
        return 0;
    u64 min = cfg->min_dur;
    if (min && (dur == NO_DUR || dur < min))
        return 0;
    return 1;
}

static __always_inline int sampled_out(u8 irqs_on) {
#ifdef SAMPLE
    u32 zero = 0;
    u32 *every = sample_every.lookup(&zero);
    if (!every || *every <= 1)
        return 0;
    u32 *tick = sample_tick.lookup(&zero);
    if (!tick)
        return 0;
    u32 t = *tick + 1;
    if (t >= *every)
        t = 0;
    *tick = t;
    if (t != 0) {
        count_in(irqs_on, DROP_SAMPLED);
        return 1;
    }
#endif
    return 0;
}

struct slot_pos;

#ifdef CPU_SLOTS
// This CPU's next slot, marked busy (*pos: its run's positions), or 0 (use
// the ring buffer): the run is full, or in use by the program this one
// interrupted, or this CPU has none.
static __always_inline struct event *slot_take(struct slot_pos **pos) {
    u32 cpu = bpf_get_smp_processor_id();
    struct slot_pos *p = slot_pos.lookup(&cpu);
    if (!p || p->busy)
        return 0;
    u64 head = p->head;
    if (head - *(volatile u64 *)&p->tail >= CPU_SLOTS)
        return 0;
    u32 i = cpu * CPU_SLOTS + (u32)(head & (CPU_SLOTS - 1));
    struct slot *sl = slots.lookup(&i);
    if (!sl)
        return 0;
    p->busy = 1;
    *pos = p;
    return &sl->ev;
}
#endif

// irqs_on: called from a program that runs with interrupts on (see count_atomic).
// *pos: set when the record is a slot (see struct slot), left 0 for the ring buffer.
static __always_inline struct event *reserve(u8 irqs_on, struct slot_pos **pos) {
    count_in(irqs_on, STAT_ATTEMPTED);
    if (sampled_out(irqs_on))
        return 0;
#ifdef CPU_SLOTS
    if (!irqs_on) {
        struct event *se = slot_take(pos);
        if (se)
            return se;
    }
#endif
    struct event *e = events.ringbuf_reserve(sizeof(struct event));
    if (!e) {
        count_in(irqs_on, DROP_RINGBUF);
        return 0;
    }
    return e;
}

static __always_inline void submit(struct event *e, struct slot_pos *pos) {
    // Emitted = attempted - dropped: not counted here, to save a map lookup
    // per event.
#ifdef CPU_SLOTS
    if (pos) {
        asm volatile("" ::: "memory"); // the slot's stores before head's
        pos->head++;
        pos->busy = 0;
        return;
    }
#endif
    // No wake-up per event: user space drains on a timer, which keeps the
    // cost per context switch low under a storm.
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

// Whose cgroup id an event carries (struct event cgroup), taken only once
// it is emitted: the current task's (the helper), the task the probe was
// given (bpf/tpargs.h task_cgroup_id: tp_btf only, 0 on the classic path),
// or none (0).
#define CG_NONE 0
#define CG_CURRENT 1
#define CG_TASK 2

static __always_inline u64 cgroup_of(u8 cg, const char *task) {
    if (cg == CG_CURRENT)
        return bpf_get_current_cgroup_id();
    if (cg == CG_TASK)
        return task_cgroup_id(task);
    return 0;
}

// What one record says, named at its call site (the fields it leaves out
// are 0): the record's own fields (struct event), the task's name where it
// lies, whose cgroup id it carries (cg, with the task for CG_TASK), and
// whether the caller runs with interrupts on (see count_atomic). Every
// caller is inlined, and so is this struct: no copy of it is made.
struct emit_args {
    u64 now;
    u64 dur;
    u64 run; // switch_out: NO_DUR when not known
    const char *comm;
    const char *task;
    u32 cpu;
    u32 tgid;
    u32 tid;
    u32 kstate;
    u32 other_pid;
    u32 other_tid;
    u32 stack;
    s32 prio;
    u16 from;
    u16 to;
    u8 type;
    u8 cause;
    u8 flags;
    u8 cg;
    u8 irqs_on;
    u8 context; // EV_SLICE, EV_WAKER: of a task the filters may not take, written all the same
};

// One event of any type, through the task and CPU filters. A state record's
// caller has checked transition_match(from, to, dur) first: the cheapest
// test, and the one that fails most often under --state or --min-dur.
// Returns whether the task passed the filters (context records: always).
static __always_inline int emit(struct settings *cfg, const struct emit_args *a) {
    if (!a->context && !task_match(cfg, a->cpu, a->tgid, a->tid, a->comm))
        return 0;
    struct slot_pos *pos = 0;
    struct event *e = reserve(a->irqs_on, &pos);
    if (!e)
        return 1;
    e->ts = a->now;
    e->dur = a->dur;
    e->pid = a->tgid;
    e->tid = a->tid;
    e->other_pid = a->other_pid;
    e->other_tid = a->other_tid;
    e->kstate = a->kstate;
    e->from = a->from;
    e->to = a->to;
    e->cpu = a->cpu;
    e->type = a->type;
    e->cause = a->cause;
    e->prio = a->prio;
    e->flags = a->flags;
    e->pad = 0;
    COMM_COPY(e->comm, a->comm);
    e->stack = a->stack;
    e->pad2 = 0;
    e->cgroup = cgroup_of(a->cg, a->task);
    e->run = a->run;
    submit(e, pos);
    return 1;
}

// exec: the task's se.sum_exec_runtime + 1 at a switch (SW_PREV_EXEC,
// SW_NEXT_EXEC); 0 keeps the row's.
static __always_inline void set_state(u32 tid, struct task_state *ts, u32 tgid, u16 state, u64 now, u64 exec) {
    if (ts) {
        ts->state = state;
        ts->since = now;
        if (tgid)
            ts->tgid = tgid;
        if (exec)
            ts->exec = exec;
        return;
    }
    struct task_state fresh = {};
    fresh.state = state;
    fresh.since = now;
    fresh.tgid = tgid;
    fresh.exec = exec;
    if (tasks.update(&tid, &fresh) != 0)
        count_atomic(DROP_MAP_FULL);
}

// A followed task's row entering the run queue of `cpu` (on) or leaving
// its run queue: counted in queued_followed once (TS_QUEUED), on the CPU
// its row names. Queued again while counted (its switch-in was not traced),
// it moves to the new CPU. A row with no count to take back is left alone,
// so a switch-in the kernel did not trace is made good at the task's next
// switch-out.
static __always_inline void queued_mark(struct task_state *ts, int on, u32 cpu) {
    if (!ts)
        return;
    if (ts->flags & TS_QUEUED) {
        if (on && ts->qcpu == cpu)
            return;
        u32 was = ts->qcpu;
        s64 *old = queued_followed.lookup(&was);
        if (old)
            __sync_fetch_and_add(old, -1);
        ts->flags &= ~TS_QUEUED;
    }
    if (!on)
        return;
    s64 *n = queued_followed.lookup(&cpu);
    if (!n)
        return; // a CPU beyond FILTER_CPUS: not counted
    ts->flags |= TS_QUEUED;
    ts->qcpu = cpu;
    __sync_fetch_and_add(n, 1);
}

// A row about to be overwritten (a tid reused by a new task, the leader's
// tid an exec takes over) gives its count back first: one left counted
// (its last switch-in and switch-out both missed) would make every
// switch-out on its CPU a slice from then on.
static __always_inline void queued_release(u32 tid) {
    struct task_state *old = tasks.lookup(&tid);
    if (old && (old->flags & TS_QUEUED))
        queued_mark(old, 0, 0);
}

// Whether a followed task waits in the run queue of `cpu`.
static __always_inline int any_queued(u32 cpu) {
    s64 *n = queued_followed.lookup(&cpu);
    return n && *n > 0;
}

// The current task's name, once per thread (and again after it execs): it
// woke a task, or queued a wake-up (record -p/-c/--cgroup).
static __always_inline void name_waker(struct settings *cfg, u64 now, u8 irqs_on) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct task_state *w = task_row(tid);
    if (!tid || !w || (w->flags & TS_NAMED))
        return;
    w->flags |= TS_NAMED;
    COMM_BUF(comm);
    bpf_get_current_comm(comm, sizeof(comm));
    emit(cfg, &(struct emit_args){.type = EV_WAKER, .now = now, .cpu = bpf_get_smp_processor_id(),
                                  .tgid = id >> 32, .tid = tid, .comm = comm, .dur = NO_DUR, .run = NO_DUR,
                                  .context = 1, .irqs_on = irqs_on, .cg = CG_NONE});
}

// F_WAKER_IRQ or F_WAKER_SOFTIRQ when this CPU is in interrupt context now.
static __always_inline u8 waker_context(void) {
    u32 zero = 0;
    struct irq_ctx *ic = irq_state.lookup(&zero);
    if (!ic)
        return 0;
#ifdef HRTIMER_IS_SOFT
    if (ic->hard || ic->timer) // timer: a hard one's callback (hrtimer_is_soft)
        return F_WAKER_IRQ;
#else
    if (ic->hard || (ic->timer && !ic->soft))
        return F_WAKER_IRQ;
#endif
    if (ic->soft)
        return F_WAKER_SOFTIRQ;
    return 0;
}

// The wake-up ending a blocked state: from -> runnable at `now`. In
// interrupt context the waker is no task (whichever task was interrupted
// is not it): waker 0 and the context in the flags. ctx WAKER_CURRENT: the
// waker is the current task, its ids and this CPU's context read only when
// the wake-up is reported (not on the path --min-dur or a filter drops).
// task: the wakee (bpf/tpargs.h WK_TASK, SW_NEXT_TASK), for its cgroup id.
#define WAKER_CURRENT 0xff

static __always_inline void woken(struct settings *cfg, u64 now, u32 tid, u32 tgid, struct task_state *ts,
                                  const char *comm, u8 cause, u32 target_cpu, u32 waker_pid, u32 waker_tid, u8 ctx,
                                  const char *task) {
    u16 from = ST_UNKNOWN;
    u64 dur = NO_DUR;
    u32 stack = 0;
    if (ts) {
        from = ts->state;
        if (ts->tgid)
            tgid = ts->tgid;
        stack = ts->stack;
        ts->stack = 0;
        ts->wake_flags = 0;
        if (ts->since && from != ST_UNKNOWN) {
            dur = elapsed(now, ts->since);
            if (now < ts->since)
                now = ts->since; // clamped: the wake-up is not before the state began
        }
    }
    int followed = -1; // not known yet
    if (transition_match(cfg, from, ST_RUNNABLE, dur)) {
        u8 current = ctx == WAKER_CURRENT;
        if (current) {
            u64 id = bpf_get_current_pid_tgid();
            waker_pid = id >> 32;
            waker_tid = (u32)id;
            ctx = waker_context();
        }
        // kstate carries the CPU the task was queued on (waking: the one it last ran on).
        if (ctx)
            waker_pid = waker_tid = 0;
        // the waker's name goes before the wake-up that names it, so that a
        // reader meets the name first (even for a waker's only wake-up)
        if (current && !ctx && cfg->task_filters) {
            followed = task_match(cfg, bpf_get_smp_processor_id(), tgid, tid, comm);
            if (followed)
                name_waker(cfg, now, 0);
        }
        followed = emit(cfg, &(struct emit_args){.type = EV_STATE, .now = now, .cpu = bpf_get_smp_processor_id(),
                                                 .tgid = tgid, .tid = tid, .comm = comm, .from = from,
                                                 .to = ST_RUNNABLE, .dur = dur, .cause = cause, .prio = -1,
                                                 .flags = ctx, .kstate = target_cpu, .other_pid = waker_pid,
                                                 .other_tid = waker_tid, .stack = stack, .cg = CG_TASK,
                                                 .task = task});
    }
    set_state(tid, ts, tgid, ST_RUNNABLE, now, 0);
    if (cfg->task_filters) {
        if (followed < 0)
            followed = task_match(cfg, bpf_get_smp_processor_id(), tgid, tid, comm);
        if (followed)
            queued_mark(ts, 1, target_cpu);
    }
}

// prev is the current task at sched_switch, so its tgid is known for sure;
// it is read (a helper call on the tracepoint path) only when an event or an
// unknown row needs it.
#define current_tgid(cache) (*(cache) ? *(cache) : (*(cache) = SW_PREV_TGID))

PSTATE_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 cpu = bpf_get_smp_processor_id();
    u32 prev = SW_PREV_PID;
    u32 next = SW_NEXT_PID;
    u32 kstate = SW_PREV_STATE;
    u32 prev_tgid = 0; // through current_tgid()
    COMM_BUF(comm);
    struct settings *cfg = get_settings();
    if (!cfg)
        return 0;
    {
        // never in interrupt context here: clear what a missed exit left
        u32 zero = 0;
        struct irq_ctx *ic = irq_state.lookup(&zero);
        if (ic && *(u64 *)ic)
            *(u64 *)ic = 0;
    }

    if (prev != 0) {
        struct task_state *ts = task_row(prev);
        u64 dur = NO_DUR;
        if (ts && ts->state == ST_RUNNING && ts->since)
            dur = elapsed(now, ts->since);
        u32 bits = kstate & REPORT_MASK;
        u16 to = bits ? (ST_KERNEL | bits) : ST_PREEMPTED;
        // --cgroup: prev is the current task, so the helper gives its cgroup;
        // a process seen switching out in one of the cgroups is followed from
        // then on (one that moves out stays followed). Every other switch pays
        // one test of the settings row.
        if (cfg->task_filters & TF_CGROUP) {
            u64 cg = bpf_get_current_cgroup_id();
            if (cgroup_filter.lookup(&cg)) {
                u8 one = 1;
                u32 tg = current_tgid(&prev_tgid);
                cgroup_pids.update(&tg, &one);
            }
        }
        // The slice's on-CPU time by the kernel's count: the growth of the
        // task's own se.sum_exec_runtime (bpf/tpargs.h SW_PREV_EXEC) since
        // its row's: its switch-in's, or its last switch-out's where its
        // switch-in was not seen (the count grows only while it runs). Kept
        // on the row for its next slice.
        u64 exec = SW_PREV_EXEC;
        int followed = -1; // not known yet
        u64 run = ts ? exec_growth(exec, ts->exec) : NO_DUR; // (NO_DUR is ~0: not known)
        if (transition_match(cfg, ST_RUNNING, to, dur)) {
            SW_PREV_COMM(comm);
            followed = emit(cfg, &(struct emit_args){.type = EV_STATE, .now = now, .cpu = cpu,
                                          .tgid = current_tgid(&prev_tgid), .tid = prev, .comm = comm,
                                          .from = ST_RUNNING, .to = to, .dur = dur, .run = run,
                                          .cause = CAUSE_SWITCH_OUT,
                                          .prio = SW_PREV_PRIO, .flags = bits ? F_VOLUNTARY : 0, .kstate = kstate,
                                          .other_tid = next, .cg = CG_CURRENT});
        }
        // record -p/-c/--cgroup: a followed task preempted stays queued here;
        // the slice of one not followed is kept while a followed one waits
        if (cfg->task_filters) {
            if (followed < 0) {
                SW_PREV_COMM(comm);
                followed = task_match(cfg, cpu, current_tgid(&prev_tgid), prev, comm);
            }
            if (followed)
                queued_mark(ts, !bits, cpu);
            else if (dur != NO_DUR && cfg->antagonists && any_queued(cpu))
                emit(cfg, &(struct emit_args){.type = EV_SLICE, .now = now, .cpu = cpu,
                                              .tgid = current_tgid(&prev_tgid), .tid = prev, .comm = comm,
                                              .dur = dur, .run = run, .other_tid = next, .context = 1,
                                              .cg = CG_CURRENT});
        }
        // The stack of a task blocking in a --stacks state; every other
        // switch pays one test of the settings row. Only a reported task's:
        // user space frees a slot when it reads the wake-up, so a stack it
        // never sees would hold its slot for good.
        u32 stack = 0;
#ifdef STACK_ENTRIES
        if (bits & cfg->stack_mask) {
            bpf_get_current_comm(comm, sizeof(comm)); // prev is current
            if (task_match(cfg, cpu, current_tgid(&prev_tgid), prev, comm)) {
                // BCC rewrites no map call with a macro in it: the context by name
#if PATH_sched_switch == PSTATE_TP_BTF
                int id = stacks.get_stackid(ctx, 0);
#else
                int id = stacks.get_stackid(args, 0);
#endif
                if (id >= 0)
                    stack = (u32)id + 1;
                else
                    count(STAT_STACK_FAILED);
            }
        }
#endif
        // A thread's tgid never changes under its tid (exec moves the row
        // to the new tid): a row that has it keeps it.
        set_state(prev, ts, (ts && ts->tgid) ? 0 : current_tgid(&prev_tgid), to, now, exec);
        if (ts) {
            ts->stack = stack;
            if (!bits)
                ts->wake_flags = 0; // still queued: a wake-up kept it running
        }
    } else if (cfg->include_idle && transition_match(cfg, ST_RUNNING, ST_PREEMPTED, NO_DUR)) {
        SW_PREV_COMM(comm);
        emit(cfg, &(struct emit_args){.type = EV_STATE, .now = now, .cpu = cpu, .comm = comm, .from = ST_RUNNING,
                                      .to = ST_PREEMPTED, .dur = NO_DUR, .cause = CAUSE_SWITCH_OUT,
                                      .prio = SW_PREV_PRIO, .kstate = kstate, .other_tid = next, .cg = CG_CURRENT});
    }

    if (next != 0) {
        struct task_state *ts = task_row(next);
#ifndef WAKE_AT_WAKEUP
        // Switched in from a blocked state with a waker still kept, and no
        // wake-up since: the waker's sched_waking came before this task's
        // switch-out was traced. try_to_wake_up had the wake-up under way
        // then: it waits for the switch-out to finish and queues the task
        // at once, or it found the task still queued (its dequeue delayed)
        // and took it back, while sched_switch reported the state it had
        // read before. Either way the task was woken from its switch-out on:
        // the wake-up is reported there, a sleep of 0. (A waker kept from a
        // wake-up that kept the task running is dropped by its next
        // preemption, or replaced by the wake-up that ends a later sleep.)
        if (ts && (ts->wake_flags & WAKE_PENDING) && (ts->state & ST_KERNEL) && !(ts->state & DEAD_BITS)) {
            u8 wf = ts->wake_flags;
            SW_NEXT_COMM(comm);
            woken(cfg, ts->since, next, 0, ts, comm, CAUSE_WAKEUP, ts->wake_cpu, ts->wake_pid, ts->wake_tid,
                  wf & (F_WAKER_IRQ | F_WAKER_SOFTIRQ), SW_NEXT_TASK);
        }
#endif
        u16 from = ST_UNKNOWN;
        u64 dur = NO_DUR;
        u32 tgid = 0;
        if (ts) {
            from = ts->state;
            tgid = ts->tgid;
            if (ts->since && from != ST_UNKNOWN)
                dur = elapsed(now, ts->since);
        }
        if (!tgid)
            tgid = SW_NEXT_TGID; // known on the tp_btf path only
        if (transition_match(cfg, from, ST_RUNNING, dur)) {
            SW_NEXT_COMM(comm);
            emit(cfg, &(struct emit_args){.type = EV_STATE, .now = now, .cpu = cpu, .tgid = tgid, .tid = next,
                                          .comm = comm, .from = from, .to = ST_RUNNING, .dur = dur,
                                          .cause = CAUSE_SWITCH_IN, .prio = SW_NEXT_PRIO,
                                          .other_pid = prev ? current_tgid(&prev_tgid) : 0, .other_tid = prev,
                                          .cg = CG_TASK, .task = SW_NEXT_TASK});
        }
        set_state(next, ts, tgid, ST_RUNNING, now, SW_NEXT_EXEC);
        if (ts && (ts->flags & TS_QUEUED))
            queued_mark(ts, 0, 0);
    } else if (cfg->include_idle && transition_match(cfg, ST_PREEMPTED, ST_RUNNING, NO_DUR)) {
        SW_NEXT_COMM(comm);
        emit(cfg, &(struct emit_args){.type = EV_STATE, .now = now, .cpu = cpu, .comm = comm, .from = ST_PREEMPTED,
                                      .to = ST_RUNNING, .dur = NO_DUR, .cause = CAUSE_SWITCH_IN,
                                      .prio = SW_NEXT_PRIO, .other_pid = prev ? current_tgid(&prev_tgid) : 0,
                                      .other_tid = prev, .cg = CG_TASK, .task = SW_NEXT_TASK});
    }
    return 0;
}

// Wake-ups are taken where the waker is current, so that its ids and its
// CPU's interrupt context are simply read. With WAKE_AT_WAKEUP at
// sched_wakeup, as the task is queued: the waker's context, except for a
// wake-up queued on the target CPU's wake list (a task woken onto an idle
// CPU, say), which that CPU activates from an IPI or its idle loop;
// csd_queue_cpu noted its waker on the row, in the waker's context (see
// there). A wake-up that finds the row running or queued never ended a
// blocked state: sched_wakeup runs once the task's switch-out, if it had
// one, is traced (the waker waits for it to finish, or the task's own CPU
// activates it after), so this path needs no waker kept for a switch.
// Without WAKE_AT_WAKEUP at sched_waking, which runs in the waker's context
// and only once the wake-up is certain to happen, but may run before the
// task's switch-out is traced: a wake-up that finds the row still running is
// settled at the task's next switch (see task_state.wake_flags). An empty
// program on sched_waking costs the pinned pipe storm 0.03 more than one on
// sched_wakeup (bench/bench_kernel_cost.py floor_btf_wakeup).
// tgid: the wakee's, where the path knows it (tp_btf), else 0
static __always_inline void waking(u32 tid, u32 tgid, const char *comm, u8 cause, u32 target_cpu,
                                   const char *task) {
    struct settings *cfg = get_settings();
    if (!cfg)
        return;
    struct task_state *ts = task_row(tid);
#ifdef WAKE_AT_WAKEUP
    u8 ctx = WAKER_CURRENT;
    u32 waker_pid = 0, waker_tid = 0;
    if (ts) {
        u8 wf = ts->wake_flags;
        if (wf & WAKE_QUEUED) {
            ctx = wf & (F_WAKER_IRQ | F_WAKER_SOFTIRQ);
            waker_pid = ts->wake_pid;
            waker_tid = ts->wake_tid;
        }
        u16 st = ts->state;
        if (st == ST_RUNNING || st == ST_RUNNABLE || st == ST_PREEMPTED) {
            ts->wake_flags = 0; // woken before it got off its CPU, or still queued: it never blocked
            return;
        }
    }
    woken(cfg, bpf_ktime_get_ns(), tid, tgid, ts, comm, cause, target_cpu, waker_pid, waker_tid, ctx, task);
#else
    if (ts) {
        u16 st = ts->state;
        if (st == ST_RUNNING) {
            // Still on its CPU: it may be about to block (the switch-out is
            // under way on another CPU) or not (the wake-up keeps it
            // running). Keep the waker; its next switch decides.
            u64 id = bpf_get_current_pid_tgid();
            ts->wake_pid = id >> 32;
            ts->wake_tid = (u32)id;
            ts->wake_cpu = target_cpu;
            ts->wake_flags = WAKE_PENDING | waker_context();
            return;
        }
        // Already queued: it never blocked, no transition.
        if (st == ST_RUNNABLE || st == ST_PREEMPTED)
            return;
    }
    woken(cfg, bpf_ktime_get_ns(), tid, tgid, ts, comm, cause, target_cpu, 0, 0, WAKER_CURRENT, task);
#endif
}

#ifdef WAKE_AT_WAKEUP
PSTATE_PROBE(sched, sched_wakeup) {
    COMM_BUF(buf);
    waking(WK_PID, WK_TGID, WK_COMM_AT(buf), CAUSE_WAKEUP, WK_TARGET_CPU, WK_TASK);
    return 0;
}

// A wake-up the waker queues on the target CPU's wake list (an entry of
// type CSD_TYPE_TTWU: the task's wake_entry) runs its sched_wakeup there,
// where current is not the waker: the waker is noted on the task's row now,
// in its own context, for that sched_wakeup. Other entries (function calls
// on another CPU) return at once. The entry is read with
// bpf_probe_read_kernel, as the task around it: it is at a negative offset
// from the pointer the tracepoint gives, which the verifier would not
// follow; this runs only for wake-ups that cross CPUs through a wake list.
// The plan takes it as a tp_btf or raw tracepoint (pstate.kernel.probeplan),
// never a classic one, since the kernel
// queues other entries with interrupts on (a TLB shootdown's), and while a
// classic program runs the kernel skips every classic one an interrupt
// starts on its CPU: the wake-up of an interrupt that came meanwhile was
// lost (lost_skipped).
PSTATE_PROBE(csd, csd_queue_cpu) {
    u64 csd = LF_CSD_ENTRY;
    u32 flags = 0;
    bpf_probe_read_kernel(&flags, sizeof(flags), (const void *)(csd + CSD_FLAGS));
    if ((flags & CSD_TYPE_MASK) != CSD_TYPE_TTWU)
        return 0;
    u32 tid = 0;
    bpf_probe_read_kernel(&tid, sizeof(tid), (const void *)(csd - TASK_WAKE_ENTRY + TASK_PID));
    u64 id = bpf_get_current_pid_tgid();
    u8 wf = WAKE_QUEUED | waker_context();
    struct settings *cfg = get_settings();
    if (cfg && cfg->task_filters && !(wf & (F_WAKER_IRQ | F_WAKER_SOFTIRQ)))
        name_waker(cfg, bpf_ktime_get_ns(), 1); // any wakee: which it is, is not read here
    struct task_state *ts = task_row(tid);
    if (ts) {
        ts->wake_pid = id >> 32;
        ts->wake_tid = (u32)id;
        ts->wake_flags = wf;
        return 0;
    }
    // A task not seen yet: a row for it, its state not known; never over
    // one another CPU made meanwhile. No loss is counted when the map has
    // no room: the note is no event, and the wake-up that follows counts
    // the row it cannot make.
    struct task_state fresh = {};
    fresh.wake_pid = id >> 32;
    fresh.wake_tid = (u32)id;
    fresh.wake_flags = wf;
    tasks.insert(&tid, &fresh);
    return 0;
}
#else
PSTATE_PROBE(sched, sched_waking) {
    COMM_BUF(buf);
    waking(WK_PID, WK_TGID, WK_COMM_AT(buf), CAUSE_WAKEUP, WK_TARGET_CPU, WK_TASK);
    return 0;
}
#endif

PSTATE_PROBE(sched, sched_wakeup_new) {
    COMM_BUF(buf);
    waking(WK_PID, WK_TGID, WK_COMM_AT(buf), CAUSE_WAKEUP_NEW, WK_TARGET_CPU, WK_TASK);
    return 0;
}

// A task moved to another CPU's run queue: a followed one waiting there is
// counted there from now on (queued_followed). Only slices read the counts:
// without --antagonists nothing is done. A wake-up taken at sched_waking
// counted the task on the CPU it last ran on; the wake-up's own move, if
// any, comes right after, here.
PSTATE_PROBE(sched, sched_migrate_task) {
    struct settings *cfg = get_settings();
    if (!cfg || !cfg->antagonists)
        return 0;
    u32 tid = MG_PID;
    struct task_state *ts = tasks.lookup(&tid);
    if (ts && (ts->flags & TS_QUEUED))
        queued_mark(ts, 1, MG_DEST_CPU);
    return 0;
}

// Interrupt context of this CPU (see struct irq_ctx), kept by raw
// tracepoints on both paths, which read no argument. Not classic ones: a
// classic tracepoint's program runs only when no other classic one is running
// on its CPU (the kernel's bpf_prog_active), and softirq handlers and soft
// hrtimer callbacks run with interrupts on: an interrupt arriving during
// softirq_entry's program lost the classic sched_waking or sched_wakeup it
// ran (the IPI that queues a wake-up on its CPU, a timer's wake-up), which is
// how a sleep ended without a wake-up on the classic path. Raw tracepoint
// programs are skipped only when the same program is running already.
enum irq_mark { MARK_HARD, MARK_TIMER, MARK_SOFT }; // the fields of struct irq_ctx

static __always_inline void irq_mark(enum irq_mark which, u8 on) {
    u32 zero = 0;
    struct irq_ctx *ic = irq_state.lookup(&zero);
    if (!ic)
        return;
    if (which == MARK_HARD)
        ic->hard = on;
    else if (which == MARK_TIMER)
        ic->timer = on;
    else
        ic->soft = on;
}

RAW_TRACEPOINT_PROBE(irq_handler_entry) {
    irq_mark(MARK_HARD, 1);
    return 0;
}

RAW_TRACEPOINT_PROBE(irq_handler_exit) {
    irq_mark(MARK_HARD, 0);
    return 0;
}

// An hrtimer's callback runs in the timer interrupt, or for a soft timer in
// the HRTIMER softirq (which softirq_entry marks). With the offset of
// hrtimer.is_soft from the kernel's BTF (HRTIMER_IS_SOFT) only a hard one's
// marks the hard interrupt, so that one interrupting a softirq handler is
// told from a soft one; without it, a timer inside a softirq reads as soft.
static __always_inline int hrtimer_is_soft(u64 timer) {
#ifdef HRTIMER_IS_SOFT
    u8 soft = 0;
    bpf_probe_read_kernel(&soft, sizeof(soft), (const void *)(timer + HRTIMER_IS_SOFT));
    return soft;
#else
    return 0;
#endif
}

RAW_TRACEPOINT_PROBE(hrtimer_expire_entry) {
    if (!hrtimer_is_soft(ctx->args[0]))
        irq_mark(MARK_TIMER, 1);
    return 0;
}

RAW_TRACEPOINT_PROBE(hrtimer_expire_exit) {
    if (!hrtimer_is_soft(ctx->args[0]))
        irq_mark(MARK_TIMER, 0);
    return 0;
}

RAW_TRACEPOINT_PROBE(softirq_entry) {
    irq_mark(MARK_SOFT, 1);
    return 0;
}

RAW_TRACEPOINT_PROBE(softirq_exit) {
    irq_mark(MARK_SOFT, 0);
    return 0;
}

// task_newtask runs in the parent's context and has the clone flags, so the
// child's tgid is known without reading the task: the parent's for a thread,
// the child's own pid for a process.
PSTATE_PROBE(task, task_newtask) {
    u64 now = bpf_ktime_get_ns();
    u32 child = LF_NEW_PID;
    u32 parent_tgid = bpf_get_current_pid_tgid() >> 32;
    struct task_state fresh = {};
    fresh.state = ST_NEW;
    fresh.since = now;
    if (LF_NEW_CLONE_FLAGS & CLONE_THREAD_FLAG) {
        fresh.tgid = parent_tgid;
        fresh.flags = F_THREAD;
    } else {
        fresh.tgid = child;
    }
    queued_release(child);
    if (tasks.update(&child, &fresh) != 0)
        count_atomic(DROP_MAP_FULL);
    return 0;
}

static __always_inline void emit_life(u8 type, u32 tgid, u32 tid, u32 other_pid, u32 other_tid, u8 flags) {
    struct settings *cfg = get_settings();
    if (!cfg)
        return;
    COMM_BUF(comm);
    bpf_get_current_comm(comm, sizeof(comm));
    emit(cfg, &(struct emit_args){.type = type, .now = bpf_ktime_get_ns(), .cpu = bpf_get_smp_processor_id(),
                                  .tgid = tgid, .tid = tid, .comm = comm, .dur = NO_DUR, .flags = flags,
                                  .other_pid = other_pid, .other_tid = other_tid, .irqs_on = 1, .cg = CG_NONE});
}

PSTATE_PROBE(sched, sched_process_fork) {
    u32 child = LF_FORK_CHILD_PID;
    u32 child_tgid = child;
    u8 flags = 0;
    struct task_state *ts = tasks.lookup(&child);
    if (known(ts)) {
        child_tgid = ts->tgid;
        if (ts->flags & F_THREAD)
            flags |= F_THREAD;
    }
    // TF_FOLLOW, TF_CGROUP: a new process of a followed one is followed
    // (before any event of the child: it has not run yet).
    struct settings *cfg = get_settings();
    if (cfg && (cfg->task_filters & (TF_FOLLOW | TF_CGROUP)) && !(flags & F_THREAD)) {
        u32 parent = bpf_get_current_pid_tgid() >> 32;
        u8 one = 1;
        if ((cfg->task_filters & TF_FOLLOW) && pid_filter.lookup(&parent))
            pid_filter.update(&child_tgid, &one);
        if ((cfg->task_filters & TF_CGROUP) && cgroup_pids.lookup(&parent))
            cgroup_pids.update(&child_tgid, &one);
    }
    emit_life(EV_FORK, bpf_get_current_pid_tgid() >> 32, LF_FORK_PARENT_PID, child_tgid, child, flags);
    return 0;
}

PSTATE_PROBE(sched, sched_process_exec) {
    u32 tid = LF_EXEC_PID;
    u32 old = LF_EXEC_OLD_PID;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (old != tid) {
        // A non-leader thread exec'd and took over the leader's pid.
        struct task_state *ts = task_row(old);
        if (known(ts)) {
            struct task_state copy = *ts;
            copy.tgid = tgid;
            queued_release(tid);
            tasks.update(&tid, &copy);
            forget(old, ts);
        }
    }
    struct task_state *row = task_row(tid);
    if (known(row))
        row->flags &= ~TS_NAMED; // its new name is written when it wakes a task again
    emit_life(EV_EXEC, tgid, tid, tgid, old, 0);
    return 0;
}

#ifdef EXIT_GROUP_DEAD_FROM_SIGNAL
// The thread that finds its process's count of live threads at 0 first: a
// claim only one thread of a process can make (another one that saw the
// count at 0 too finds it made). A claim left by an earlier process of the
// same tgid (whose main thread's free was not seen) names another
// signal_struct and is taken over.
static __always_inline u8 exit_group_dead(void) {
    u64 sig = 0;
    if (!current_group_dead(&sig))
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (exit_claims.insert(&tgid, &sig) == 0)
        return 1;
    u64 *had = exit_claims.lookup(&tgid);
    if (had && *had == sig)
        return 0;
    exit_claims.update(&tgid, &sig);
    return 1;
}
#endif

PSTATE_PROBE(sched, sched_process_exit) {
    u64 id = bpf_get_current_pid_tgid();
    emit_life(EV_EXIT, id >> 32, LF_EXIT_PID, 0, 0, LF_EXIT_GROUP_DEAD ? F_GROUP_DEAD : 0);
    return 0;
}

// The kernel frees the task (after its parent reaped the zombie, or at once
// for a dead thread): close its last state and forget it.
PSTATE_PROBE(sched, sched_process_free) {
    u32 tid = LF_FREE_PID;
#ifdef EXIT_GROUP_DEAD_FROM_SIGNAL
    // a process's claim goes with its main thread, whose tid is its tgid
    // (while the claim lasts no other task can have that tid)
    exit_claims.delete(&tid);
#endif
    struct task_state *ts = task_row(tid);
    if (!ts)
        return 0;
    // The free comes after an RCU grace period, when the tid may already
    // belong to a new task: only a row that went dead or zombie is ours.
    if (!(ts->state & ST_KERNEL) || !(ts->state & DEAD_BITS))
        return 0;
    struct settings *cfg = get_settings();
    if (!cfg)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 dur = ts->since ? elapsed(now, ts->since) : NO_DUR;
    u16 from = ts->state;
    u32 tgid = ts->tgid;
    queued_mark(ts, 0, 0);
    forget(tid, ts);
    if (transition_match(cfg, from, ST_REAPED, dur)) {
        COMM_BUF(comm);
        LF_FREE_COMM(comm);
        // cgroup: the freed task's (on the tp_btf path; not known on the others)
        emit(cfg, &(struct emit_args){.type = EV_STATE, .now = now, .cpu = bpf_get_smp_processor_id(),
                                      .tgid = tgid, .tid = tid, .comm = comm, .from = from, .to = ST_REAPED,
                                      .dur = dur, .cause = CAUSE_REAP, .prio = -1, .cg = CG_TASK,
                                      .task = LF_FREE_TASK, .irqs_on = 1}); // in an RCU callback: interrupts on
    }
    // A followed process is gone with its main thread: its pid may come back
    // as another process's.
    if (tid == tgid && (cfg->task_filters & (TF_FOLLOW | TF_CGROUP))) {
        if (cfg->task_filters & TF_FOLLOW)
            pid_filter.delete(&tgid);
        if (cfg->task_filters & TF_CGROUP)
            cgroup_pids.delete(&tgid);
    }
    return 0;
}

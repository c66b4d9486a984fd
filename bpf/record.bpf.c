// pstate record: scheduler state transitions of every thread, from the sched
// tracepoints, into a BPF ring buffer that user space drains in batches.
//
// This program reads tracepoint arguments only, never a kernel struct. BCC
// builds the argument layout from the running kernel's tracefs format files,
// so it compiles against any kernel header tree, even one of another kernel
// version: that is what lets pstate run where no matching headers exist.
// Keep it so: no task_struct, no bpf_probe_read of kernel memory.
//
// Compile-time settings (-D cflags, set by pstate/loader.py):
//   REPORT_MASK    prev_state bits that name a blocked state (from print_fmt)
//   DEAD_BITS      the bits of the dead (X) and zombie (Z) states
//   MAX_TASKS      size of the per-thread state map
//   TASKS_BY_TID   the map is an array indexed by tid (set when pid_max <=
//                  MAX_TASKS): its lookup is inlined, where a hash lookup is
//                  a call; an all-zero row is a thread not seen
//   RB_PAGES       ring buffer size in pages
//   INCLUDE_IDLE   report the idle task (tid 0) too
//   FILTER_PID / FILTER_TID / FILTER_CPU   look the task up in a filter map
//   FILTER_COMM    compare comm with COMM_0..COMM_15 (one name)
//   STATE_MASK     report transitions into or out of these states only
//   MIN_DUR_NS     report transitions whose left state lasted at least this
//   SAMPLE         keep one event in sample_every[0] (--max-rate)

#define ST_UNKNOWN 0
#define ST_RUNNING 1
#define ST_RUNNABLE 2
#define ST_PREEMPTED 3
#define ST_NEW 4
#define ST_REAPED 5
#define ST_KERNEL 0x1000 // | reported prev_state bits

#define EV_STATE 1
#define EV_FORK 2
#define EV_EXEC 3
#define EV_EXIT 4

#define CAUSE_SWITCH_OUT 1
#define CAUSE_SWITCH_IN 2
#define CAUSE_WAKEUP 3
#define CAUSE_WAKEUP_NEW 4
#define CAUSE_REAP 5

#define F_VOLUNTARY 1
#define F_THREAD 2
#define F_GROUP_DEAD 4

#define DROP_RINGBUF 0
#define DROP_MAP_FULL 1
#define DROP_SAMPLED 2
#define STAT_EMITTED 3 // unused: emitted = attempted - dropped
#define STAT_ATTEMPTED 4
#define NR_COUNTERS 5

#define NO_DUR ((u64)-1)
#define CLONE_THREAD_FLAG 0x00010000

struct task_state {
    u64 since; // when the task entered state; 0 = not seen
    u32 tgid;  // 0 = not known yet
    u16 state;
    u16 flags;
};

// 64 bytes; user space decodes it with struct format "<QQIIIIIHHHBBhBx16s".
struct event {
    u64 ts;
    u64 dur;
    u32 pid;
    u32 tid;
    u32 other_pid;
    u32 other_tid;
    u32 kstate;
    u16 from;
    u16 to;
    u16 cpu;
    u8 type;
    u8 cause;
    s16 prio;
    u8 flags;
    u8 pad;
    char comm[16];
};

#ifdef TASKS_BY_TID
BPF_ARRAY(tasks, struct task_state, MAX_TASKS);
#else
BPF_HASH(tasks, u32, struct task_state, MAX_TASKS);
#endif
BPF_RINGBUF_OUTPUT(events, RB_PAGES);
BPF_PERCPU_ARRAY(counters, u64, NR_COUNTERS);
#ifdef FILTER_PID
BPF_HASH(pid_filter, u32, u8, 1024);
#endif
#ifdef FILTER_TID
BPF_HASH(tid_filter, u32, u8, 1024);
#endif
#ifdef FILTER_CPU
BPF_ARRAY(cpu_filter, u8, 4096);
#endif
#ifdef SAMPLE
BPF_ARRAY(sample_every, u32, 1);
BPF_PERCPU_ARRAY(sample_tick, u32, 1);
#endif

static __always_inline void count(u32 idx) {
    u64 *c = counters.lookup(&idx);
    if (c)
        (*c)++;
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

static __always_inline void forget(u32 tid, struct task_state *ts) {
#ifdef TASKS_BY_TID
    ts->since = 0;
    ts->tgid = 0;
    ts->state = 0;
    ts->flags = 0;
#else
    tasks.delete(&tid);
#endif
}

static __always_inline u64 state_bit(u16 st) {
    // Bit of a state in STATE_MASK: ours in 0..15, kernel bits shifted by 16.
    if (st & ST_KERNEL)
        return ((u64)(st & 0xfff)) << 16;
    return 1ULL << (st & 15);
}

// Filters that depend on the task only.
static __always_inline int task_match(u32 tgid, u32 tid, const char *comm) {
#ifndef INCLUDE_IDLE
    if (tid == 0)
        return 0;
#endif
#ifdef FILTER_PID
    if (!pid_filter.lookup(&tgid))
        return 0;
#endif
#ifdef FILTER_TID
    if (!tid_filter.lookup(&tid))
        return 0;
#endif
#ifdef FILTER_COMM
    const char want[16] = {COMM_0, COMM_1, COMM_2, COMM_3, COMM_4, COMM_5, COMM_6, COMM_7,
                           COMM_8, COMM_9, COMM_10, COMM_11, COMM_12, COMM_13, COMM_14, COMM_15};
#pragma unroll
    for (int i = 0; i < 16; i++) {
        if (comm[i] != want[i])
            return 0;
        if (want[i] == 0)
            break;
    }
#endif
    return 1;
}

static __always_inline int cpu_match(u32 cpu) {
#ifdef FILTER_CPU
    u8 *ok = cpu_filter.lookup(&cpu);
    if (!ok || !*ok)
        return 0;
#endif
    return 1;
}

static __always_inline int transition_match(u16 from, u16 to, u64 dur) {
#ifdef STATE_MASK
    if (!((state_bit(from) | state_bit(to)) & (u64)STATE_MASK))
        return 0;
#endif
#ifdef MIN_DUR_NS
    if (dur == NO_DUR || dur < (u64)MIN_DUR_NS)
        return 0;
#endif
    return 1;
}

static __always_inline int sampled_out(void) {
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
        count(DROP_SAMPLED);
        return 1;
    }
#endif
    return 0;
}

static __always_inline struct event *reserve(void) {
    count(STAT_ATTEMPTED);
    if (sampled_out())
        return 0;
    struct event *e = events.ringbuf_reserve(sizeof(struct event));
    if (!e) {
        count(DROP_RINGBUF);
        return 0;
    }
    return e;
}

static __always_inline void submit(struct event *e) {
    // Emitted = attempted - dropped: not counted here, to save a map lookup
    // per event.
    // No wake-up per event: user space drains on a timer, which keeps the
    // cost per context switch low under a storm.
    events.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

// One event of any type, through the task and CPU filters.
static __always_inline void emit(u8 type, u64 now, u32 cpu, u32 tgid, u32 tid, const char *comm, u16 from,
                                 u16 to, u64 dur, u8 cause, s32 prio, u8 flags, u32 kstate,
                                 u32 other_pid, u32 other_tid) {
    if (!task_match(tgid, tid, comm) || !cpu_match(cpu))
        return;
    struct event *e = reserve();
    if (!e)
        return;
    e->ts = now;
    e->dur = dur;
    e->pid = tgid;
    e->tid = tid;
    e->other_pid = other_pid;
    e->other_tid = other_tid;
    e->kstate = kstate;
    e->from = from;
    e->to = to;
    e->cpu = cpu;
    e->type = type;
    e->cause = cause;
    e->prio = prio;
    e->flags = flags;
    e->pad = 0;
    __builtin_memcpy(e->comm, comm, 16);
    submit(e);
}

// the caller has checked transition_match(from, to, dur): the cheapest
// test, and the one that fails most often under --state or --min-dur
static __always_inline void emit_state(u64 now, u32 cpu, u32 tgid, u32 tid, const char *comm, u16 from,
                                       u16 to, u64 dur, u8 cause, s32 prio, u8 flags, u32 kstate,
                                       u32 other_pid, u32 other_tid) {
    emit(EV_STATE, now, cpu, tgid, tid, comm, from, to, dur, cause, prio, flags, kstate, other_pid, other_tid);
}

static __always_inline void set_state(u32 tid, struct task_state *ts, u32 tgid, u16 state, u64 now) {
    if (ts) {
        ts->state = state;
        ts->since = now;
        if (tgid)
            ts->tgid = tgid;
        return;
    }
    struct task_state fresh = {};
    fresh.state = state;
    fresh.since = now;
    fresh.tgid = tgid;
    if (tasks.update(&tid, &fresh) != 0)
        count(DROP_MAP_FULL);
}

// prev is the current task at sched_switch, so its tgid is known for sure;
// the helper call is made only when an event or an unknown row needs it.
static __always_inline u32 current_tgid(u32 *cache) {
    if (!*cache)
        *cache = bpf_get_current_pid_tgid() >> 32;
    return *cache;
}

TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 cpu = bpf_get_smp_processor_id();
    u32 prev = args->prev_pid;
    u32 next = args->next_pid;
    u32 kstate = (u32)args->prev_state;
    u32 prev_tgid = 0; // through current_tgid()
    char comm[16];

    if (prev != 0) {
        struct task_state *ts = tasks.lookup(&prev);
        u64 dur = NO_DUR;
        if (ts && ts->state == ST_RUNNING && ts->since)
            dur = now - ts->since;
        u32 bits = kstate & REPORT_MASK;
        u16 to = bits ? (ST_KERNEL | bits) : ST_PREEMPTED;
        if (transition_match(ST_RUNNING, to, dur)) {
            __builtin_memcpy(comm, args->prev_comm, 16);
            emit_state(now, cpu, current_tgid(&prev_tgid), prev, comm, ST_RUNNING, to, dur, CAUSE_SWITCH_OUT,
                       args->prev_prio, bits ? F_VOLUNTARY : 0, kstate, 0, next);
        }
        // A thread's tgid never changes under its tid (exec moves the row
        // to the new tid): a row that has it keeps it.
        set_state(prev, ts, (ts && ts->tgid) ? 0 : current_tgid(&prev_tgid), to, now);
    }
#ifdef INCLUDE_IDLE
    else if (transition_match(ST_RUNNING, ST_PREEMPTED, NO_DUR)) {
        __builtin_memcpy(comm, args->prev_comm, 16);
        emit_state(now, cpu, 0, 0, comm, ST_RUNNING, ST_PREEMPTED, NO_DUR, CAUSE_SWITCH_OUT,
                   args->prev_prio, 0, kstate, 0, next);
    }
#endif

    if (next != 0) {
        struct task_state *ts = tasks.lookup(&next);
        u16 from = ST_UNKNOWN;
        u64 dur = NO_DUR;
        u32 tgid = 0;
        if (ts) {
            from = ts->state;
            tgid = ts->tgid;
            if (ts->since && from != ST_UNKNOWN)
                dur = now - ts->since;
        }
        if (transition_match(from, ST_RUNNING, dur)) {
            __builtin_memcpy(comm, args->next_comm, 16);
            emit_state(now, cpu, tgid, next, comm, from, ST_RUNNING, dur, CAUSE_SWITCH_IN, args->next_prio,
                       0, 0, prev ? current_tgid(&prev_tgid) : 0, prev);
        }
        set_state(next, ts, 0, ST_RUNNING, now);
    }
#ifdef INCLUDE_IDLE
    else if (transition_match(ST_PREEMPTED, ST_RUNNING, NO_DUR)) {
        __builtin_memcpy(comm, args->next_comm, 16);
        emit_state(now, cpu, 0, 0, comm, ST_PREEMPTED, ST_RUNNING, NO_DUR, CAUSE_SWITCH_IN,
                   args->next_prio, 0, 0, prev ? current_tgid(&prev_tgid) : 0, prev);
    }
#endif
    return 0;
}

// Wake-ups are taken at sched_waking, which runs in the waker's context (so
// the waker is simply "current") and only once the wake-up is certain to
// happen; sched_wakeup can run later on the target CPU, where current is not
// the waker. One program instead of two per wake-up halves their cost.
static __always_inline void wakeup(void *ctx, u32 tid, const char *comm, u8 cause, u32 target_cpu) {
    u64 now = bpf_ktime_get_ns();
    struct task_state *ts = tasks.lookup(&tid);
    u16 from = ST_UNKNOWN;
    u64 dur = NO_DUR;
    u32 tgid = 0;
    if (ts) {
        // A task woken before it got off the CPU never blocked: no transition.
        if (ts->state == ST_RUNNING || ts->state == ST_RUNNABLE || ts->state == ST_PREEMPTED)
            return;
        from = ts->state;
        tgid = ts->tgid;
        if (ts->since && from != ST_UNKNOWN)
            dur = now - ts->since;
    }
    if (transition_match(from, ST_RUNNABLE, dur)) {
        u64 id = bpf_get_current_pid_tgid();
        // kstate carries the CPU the task was queued on (waking: the one it last ran on).
        emit_state(now, bpf_get_smp_processor_id(), tgid, tid, comm, from, ST_RUNNABLE, dur, cause, -1, 0,
                   target_cpu, id >> 32, (u32)id);
    }
    set_state(tid, ts, 0, ST_RUNNABLE, now);
}

TRACEPOINT_PROBE(sched, sched_waking) {
    char comm[16];
    __builtin_memcpy(comm, args->comm, 16);
    wakeup(args, args->pid, comm, CAUSE_WAKEUP, args->target_cpu);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup_new) {
    char comm[16];
    __builtin_memcpy(comm, args->comm, 16);
    wakeup(args, args->pid, comm, CAUSE_WAKEUP_NEW, args->target_cpu);
    return 0;
}

// task_newtask runs in the parent's context and has the clone flags, so the
// child's tgid is known without reading the task: the parent's for a thread,
// the child's own pid for a process.
TRACEPOINT_PROBE(task, task_newtask) {
    u64 now = bpf_ktime_get_ns();
    u32 child = args->pid;
    u32 parent_tgid = bpf_get_current_pid_tgid() >> 32;
    struct task_state fresh = {};
    fresh.state = ST_NEW;
    fresh.since = now;
    if (args->clone_flags & CLONE_THREAD_FLAG) {
        fresh.tgid = parent_tgid;
        fresh.flags = F_THREAD;
    } else {
        fresh.tgid = child;
    }
    if (tasks.update(&child, &fresh) != 0)
        count(DROP_MAP_FULL);
    return 0;
}

static __always_inline void emit_life(u8 type, u32 tgid, u32 tid, u32 other_pid, u32 other_tid, u8 flags) {
    char comm[16];
    bpf_get_current_comm(comm, sizeof(comm));
    emit(type, bpf_ktime_get_ns(), bpf_get_smp_processor_id(), tgid, tid, comm, 0, 0, NO_DUR, 0, 0, flags, 0,
         other_pid, other_tid);
}

TRACEPOINT_PROBE(sched, sched_process_fork) {
    u32 child = args->child_pid;
    u32 child_tgid = child;
    u8 flags = 0;
    struct task_state *ts = tasks.lookup(&child);
    if (known(ts)) {
        child_tgid = ts->tgid;
        if (ts->flags & F_THREAD)
            flags |= F_THREAD;
    }
    emit_life(EV_FORK, bpf_get_current_pid_tgid() >> 32, args->parent_pid, child_tgid, child, flags);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec) {
    u32 tid = args->pid;
    u32 old = args->old_pid;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (old != tid) {
        // A non-leader thread exec'd and took over the leader's pid.
        struct task_state *ts = tasks.lookup(&old);
        if (known(ts)) {
            struct task_state copy = *ts;
            copy.tgid = tgid;
            tasks.update(&tid, &copy);
            forget(old, ts);
        }
    }
    emit_life(EV_EXEC, tgid, tid, tgid, old, 0);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 id = bpf_get_current_pid_tgid();
    emit_life(EV_EXIT, id >> 32, args->pid, 0, 0, args->group_dead ? F_GROUP_DEAD : 0);
    return 0;
}

// The kernel frees the task (after its parent reaped the zombie, or at once
// for a dead thread): close its last state and forget it.
TRACEPOINT_PROBE(sched, sched_process_free) {
    u32 tid = args->pid;
    struct task_state *ts = tasks.lookup(&tid);
    if (!ts)
        return 0;
    // The free comes after an RCU grace period, when the tid may already
    // belong to a new task: only a row that went dead or zombie is ours.
    if (!(ts->state & ST_KERNEL) || !(ts->state & DEAD_BITS))
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 dur = ts->since ? now - ts->since : NO_DUR;
    u16 from = ts->state;
    u32 tgid = ts->tgid;
    forget(tid, ts);
    if (!transition_match(from, ST_REAPED, dur))
        return 0;
    char comm[16];
    TP_DATA_LOC_READ_STR(comm, comm, sizeof(comm));
    emit_state(now, bpf_get_smp_processor_id(), tgid, tid, comm, from, ST_REAPED, dur, CAUSE_REAP, -1, 0, 0,
               0, 0);
    return 0;
}

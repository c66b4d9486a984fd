// snaphist.h: latency histograms kept in each snap task row, included by
// bpf/snap.bpf.c (after struct snap_task, whose `hist` field holds them).
//
// Per thread, per kind (HK_* in bpf/pstate.h): the count of durations in
// each fixed log2 bucket and their exact sum. User space adds each thread's
// growth between snapshots to its group (--prom-by), as it does with the
// time-in-state counters, so groups are chosen there (unit, cgroup, title,
// comm, pid or thread) and the kernel does no lookup of its own: a
// histogram costs a bucket computation and two adds in a row the program
// already holds. Memory is bounded with the rows (--max-tasks).
//
// An interval is observed when it ends with a transition the program saw
// begin: the first one of a row seeded from /proc (SNAP_F_SEEDED) is not,
// since its start is not known.

#ifndef SNAPHIST_H
#define SNAPHIST_H

// One kind's sum beside its counts, so that an observation mostly writes
// one cache line; the row keeps them after its hot fields.
struct snap_hist_kind {
    u64 sum;             // ns, exact
    u32 n[HIST_BUCKETS]; // counts per bucket
};

struct snap_hist {
    struct snap_hist_kind k[HIST_KINDS];
};

// bit_length(v >> HIST_SHIFT), at most HIST_BUCKETS - 1. Without branches
// on the value (BPF has no conditional set: (C - d) >> 63 is d > C, for
// d < 2^63), so durations that vary cost no mispredicted jumps. The empty
// asm hides d's range from the compiler, which would otherwise see that
// d < 2^54 and turn each (C - d) >> 63 back into a compare and a jump.
static __always_inline u32 hist_bucket(u64 v) {
    u64 d = v >> HIST_SHIFT;
    asm volatile("" : "+r"(d));
    u64 b = ((0xffffULL - d) >> 63) << 4;
    d >>= b;
    u64 s = ((0xffULL - d) >> 63) << 3;
    d >>= s;
    b |= s;
    s = ((0xfULL - d) >> 63) << 2;
    d >>= s;
    b |= s;
    s = ((0x3ULL - d) >> 63) << 1;
    d >>= s;
    b |= s;
    s = (0x1ULL - d) >> 63;
    d >>= s;
    b |= s;
    b += d; // d is now 0 or 1, unless v >= 2^(HIST_SHIFT+32): then b is past the last bucket anyway
    return b < HIST_BUCKETS - 1 ? (u32)b : HIST_BUCKETS - 1;
}

// The functions take a row's parts (struct snap_task includes this struct,
// so it is not complete here): its histograms, flags, state and since.
#define HIST_ROW(t) &(t)->hist, &(t)->flags, (t)->state, (t)->since

// Rows the program holds always have `since` set (bpf/snap.bpf.c).
static __always_inline void hist_add(struct snap_hist *h, u64 kind, u64 since, u64 now) {
    asm volatile("" : "+r"(kind)); // the bound checked on the register that indexes (see below)
    if (now <= since || kind >= HIST_KINDS)
        return;
    u64 d = now - since;
    struct snap_hist_kind *k = &h->k[kind];
    u64 b = hist_bucket(d - 1); // so bucket b holds d <= 2^(HIST_SHIFT+b): le
    // hist_bucket() is at most HIST_BUCKETS - 1, which the compiler knows
    // and older verifiers (Linux 6.1's) cannot follow through its
    // arithmetic: the empty asm makes the compiler keep this bound check,
    // on the register that then indexes the array.
    asm volatile("" : "+r"(b));
    if (b < HIST_BUCKETS)
        k->n[b]++;
    k->sum += d;
}

// The row's state is about to change: 0 when the program did not see the
// state begin (the row was seeded while in it), which it then forgets.
static __always_inline int hist_seen(u8 *flags) {
    if (*flags & SNAP_F_SEEDED) {
        *flags &= ~SNAP_F_SEEDED;
        return 0;
    }
    return 1;
}

// sched_switch, prev leaving the CPU: nothing observed, a seeded state ends
static __always_inline void hist_switch_out(struct snap_hist *h, u8 *flags, u8 state, u64 since) {
    hist_seen(flags);
}

#if SLOT_PREEMPTED != SLOT_RUNNABLE + 1 || HK_RUNQ_PREEMPTED != HK_RUNQ_WAKEUP + 1 || \
    HK_UNINTERRUPTIBLE != HK_SLEEPING + 1
#error "the kinds must follow the order of the slots they observe"
#endif

// sched_switch, next getting the CPU: a run-queue wait ends (runnable:
// after a wake-up; preempted)
static __always_inline void hist_switch_in(struct snap_hist *h, u8 *flags, u8 state, u64 since, u64 now) {
    u32 k = (u32)state - SLOT_RUNNABLE;
    if (hist_seen(flags) && k < 2)
        hist_add(h, HK_RUNQ_WAKEUP + k, since, now);
}

// a wake-up ends a blocked state: S and D have histograms (the kernel slots
// of the two lowest reported bits, TASK_INTERRUPTIBLE and TASK_UNINTERRUPTIBLE)
static __always_inline void hist_woken(struct snap_hist *h, u8 *flags, u8 state, u64 since, u64 now) {
    u32 k = (u32)state - SLOT_KERNEL;
    if (hist_seen(flags) && k < 2)
        hist_add(h, HK_SLEEPING + k, since, now);
}

#ifdef SNAP_NO_HIST
// The same program without the observations (the rows keep their
// histograms, all zero): bench/bench_kernel_cost.py's snap_nohist, so what
// the histograms cost is measured in the sitting of every change.
#define hist_switch_out(...) ((void)0)
#define hist_switch_in(...) ((void)0)
#define hist_woken(...) ((void)0)
#endif

#endif

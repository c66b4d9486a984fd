// taskrow.h: the per-thread rows of record.bpf.c and snap.bpf.c, seeded
// from /proc at the start.
//
// Where the rows are a hash, user space writes each live thread's seed
// straight into it with BPF_NOEXIST: a row the program made first is kept.
// Where they are an array indexed by tid (TASKS_BY_TID), a slot cannot be
// written "only if empty" from user space, so the seeds wait in the `seeds`
// hash and a thread's first event moves its own into its empty slot:
//
//   1. copy the seed aside, into this CPU's scratch row (a deleted hash
//      element may be reused at once, and a row can be too large for the
//      stack);
//   2. claim it by deleting it: only one delete succeeds, so when two CPUs
//      see the same thread's first events at once, one takes the seed and
//      the other leaves the slot alone; user space withdraws a seed never
//      taken (the thread died first) by deleting it too;
//   3. write the slot only when the claim succeeded.
//
// A program that runs with interrupts on (fork, exec, exit) can be
// interrupted on its CPU by another that takes a seed: the scratch row is
// marked busy while in use, and the inner one leaves its seed for the
// thread's next event.
//
// Before including: TASKROW_T, the row's type; TASKROW_SEEDS, the size of
// the seeds hash; with TASKS_BY_TID, the `tasks` array.

#ifdef TASKS_BY_TID
BPF_HASH(seeds, u32, TASKROW_T, TASKROW_SEEDS);

struct taskrow_scratch {
    u64 busy;
    TASKROW_T row;
};
BPF_PERCPU_ARRAY(taskrow_aside, struct taskrow_scratch, 1);

// Move tid's seed into its empty slot; 1 if the slot now holds it.
static __always_inline int taskrow_take_seed(u32 tid, TASKROW_T *slot) {
    TASKROW_T *seed = seeds.lookup(&tid);
    if (!seed)
        return 0;
    u32 zero = 0;
    struct taskrow_scratch *aside = taskrow_aside.lookup(&zero);
    if (!aside || aside->busy)
        return 0;
    aside->busy = 1;
    aside->row = *seed;
    int claimed = seeds.delete(&tid) == 0;
    if (claimed)
        *slot = aside->row;
    aside->busy = 0;
    return claimed;
}

// Empty a thread's slot when it is freed; a seed never taken goes with it,
// so that it cannot seed a later thread of the same tid.
static __always_inline void taskrow_forget(u32 tid, TASKROW_T *slot) {
    __builtin_memset(slot, 0, sizeof(*slot));
    seeds.delete(&tid);
}
#endif

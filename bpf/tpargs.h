// tpargs.h: the arguments of the hot sched tracepoints (sched_switch and the
// wake-ups), read in one of two ways, and of the lifecycle ones (task_newtask,
// sched_process_fork/exec/exit/free), read in one of three, so that each
// program has one source for every path. Included by bpf/record.bpf.c and
// bpf/snap.bpf.c.
//
// Classic tracepoint (the default): BCC builds `args` from the running
// kernel's tracefs format file; the kernel has already copied the fields
// into a trace record.
//
// TP_BTF (set by pstate.kernel.loader when the kernel has BTF and accepts
// the programs): a BTF-typed raw tracepoint program gets the tracepoint's
// raw arguments in ctx[] (sched_switch: preempt, prev, next, prev_state;
// the wake-ups: the task) with no trace record built, and reads task_struct
// fields with plain loads that the verifier checks against BTF. Every offset
// is a -D setting read from /sys/kernel/btf/vmlinux (pstate.kernel.btf),
// never from a header tree, which may be another kernel's:
//   TASK_PID TASK_TGID TASK_EXIT_STATE TASK_PRIO TASK_COMM TASK_CPU
// and the kernel's task state bits that sched_switch's format folds into
// what it reports (pstate.kernel.tpbtf.RAW_STATE_DEFINES):
//   RAW_TASK_REPORT RAW_REPORT_IDLE RAW_REPORT_MAX RAW_TASK_IDLE
//   RAW_UNINTERRUPTIBLE RAW_AS_UNINTERRUPTIBLE
//
// Each program names a probe PSTATE_PROBE(category, event) and reads its
// arguments only through the macros below. The context is `ctx` on the
// tp_btf path and `args` on the other (BCC rewrites no map call, such as
// get_stackid's, with a macro among its arguments).

#ifndef TPARGS_H
#define TPARGS_H

// A task name (16 bytes) copied between two 8-byte-aligned places in two
// 8-byte loads and stores. From a task on the tp_btf path every load is a
// checked one (the JIT guards each against a user address): a byte-wise
// copy there was 16 of them, on every switch. COMM_BUF declares a name
// buffer on the stack that it can copy to or from.
#define COMM_COPY(dst, src) \
    __builtin_memcpy(__builtin_assume_aligned(dst, 8), __builtin_assume_aligned(src, 8), 16)
#define COMM_BUF(name) char name[16] __attribute__((aligned(8)))

#ifdef TP_BTF

#define PSTATE_PROBE(category, event) int tp_btf__##event(u64 *ctx)
#define TP_TASK(i) ((const char *)ctx[i])
#define TASK_U32(t, off) (*(const u32 *)((t) + (off)))
#define TASK_S32(t, off) (*(const s32 *)((t) + (off)))

// sched_switch's prev_state as its format reports it
// (__trace_sched_switch_state): the preemption bit, or the one reported
// bit of the state the task blocked in (its highest set bit).
static __always_inline u32 reported_switch_state(u64 *ctx) {
    if ((u8)ctx[0])
        return RAW_REPORT_MAX;
    u32 raw = (u32)ctx[3];
    u32 state = (raw | TASK_U32(TP_TASK(1), TASK_EXIT_STATE)) & RAW_TASK_REPORT;
    if ((raw & RAW_TASK_IDLE) == RAW_TASK_IDLE)
        state = RAW_REPORT_IDLE;
    if (raw & RAW_AS_UNINTERRUPTIBLE)
        state = RAW_UNINTERRUPTIBLE;
    // running, S and D, nearly every switch: each is its own highest bit
    if (state <= 2)
        return state;
    state |= state >> 1;
    state |= state >> 2;
    state |= state >> 4;
    state |= state >> 8;
    state |= state >> 16;
    return state - (state >> 1);
}

#define SW_PREV_PID TASK_U32(TP_TASK(1), TASK_PID)
#define SW_NEXT_PID TASK_U32(TP_TASK(2), TASK_PID)
#define SW_PREV_PRIO TASK_S32(TP_TASK(1), TASK_PRIO)
#define SW_NEXT_PRIO TASK_S32(TP_TASK(2), TASK_PRIO)
#define SW_PREV_STATE reported_switch_state(ctx)
// A task's name where it lies: in the task (the kernel aligns it, and the
// names are then read as two words; buf is not used), or copied into buf.
#if TASK_COMM % 8 == 0
#define TASK_COMM_AT(t, buf) ((const char *)(t) + TASK_COMM)
#define TASK_COMM_COPY(dst, t) COMM_COPY(dst, (t) + TASK_COMM)
#else
#define TASK_COMM_AT(t, buf) ((void)__builtin_memcpy(buf, (t) + TASK_COMM, 16), (const char *)(buf))
#define TASK_COMM_COPY(dst, t) __builtin_memcpy(dst, (t) + TASK_COMM, 16)
#endif
#define SW_PREV_COMM(dst) TASK_COMM_COPY(dst, TP_TASK(1))
#define SW_NEXT_COMM(dst) TASK_COMM_COPY(dst, TP_TASK(2))
// tgids: prev's is the current task's; next's and the wakee's are known on
// this path only (0: not known)
#define SW_PREV_TGID TASK_U32(TP_TASK(1), TASK_TGID)
#define SW_NEXT_TGID TASK_U32(TP_TASK(2), TASK_TGID)
#define WK_TGID TASK_U32(TP_TASK(0), TASK_TGID)

// sched_waking, sched_wakeup, sched_wakeup_new: (the task woken)
#define WK_PID TASK_U32(TP_TASK(0), TASK_PID)
#define WK_TARGET_CPU TASK_U32(TP_TASK(0), TASK_CPU)
#define WK_COMM(dst) TASK_COMM_COPY(dst, TP_TASK(0))
// The wakee's name for COMM_COPY, read only where it is copied: a COMM_BUF
// is filled only where the name is not read in place.
#define WK_COMM_AT(buf) TASK_COMM_AT(TP_TASK(0), buf)

#else // classic tracepoints

#define PSTATE_PROBE(category, event) TRACEPOINT_PROBE(category, event)

#define SW_PREV_PID ((u32)args->prev_pid)
#define SW_NEXT_PID ((u32)args->next_pid)
#define SW_PREV_PRIO args->prev_prio
#define SW_NEXT_PRIO args->next_prio
#define SW_PREV_STATE ((u32)args->prev_state)
#define SW_PREV_COMM(dst) __builtin_memcpy(dst, args->prev_comm, 16)
#define SW_NEXT_COMM(dst) __builtin_memcpy(dst, args->next_comm, 16)
#define SW_PREV_TGID ((u32)(bpf_get_current_pid_tgid() >> 32))
#define SW_NEXT_TGID 0
#define WK_TGID 0

#define WK_PID ((u32)args->pid)
#define WK_TARGET_CPU args->target_cpu
#define WK_COMM(dst) __builtin_memcpy(dst, args->comm, 16)
#define WK_COMM_AT(buf) ((void)__builtin_memcpy(buf, args->comm, 16), (const char *)(buf))

#endif

// --- the cgroup id (v2) of a task that is not the current one ---
// The task a probe describes, for task_cgroup_id(): next at sched_switch
// (SW_NEXT_TASK), the wakee (WK_TASK). On the tp_btf path the id is read as
// bpf_get_current_cgroup_id() reads current's, task->cgroups->dfl_cgrp->kn->id,
// with plain loads at the offsets of the kernel's BTF (TASK_CGROUPS
// CSS_SET_DFL_CGRP CGROUP_KN KERNFS_NODE_ID; the verifier types each pointer
// it loads, and a fault reads 0). The classic path has no task to read
// (0: not known; no bpf_probe_read of kernel memory).
#ifdef TP_BTF
#define SW_NEXT_TASK TP_TASK(2)
#define WK_TASK TP_TASK(0)
#define TASK_PTR(t, off) (*(const char *const *)((t) + (off)))
#define TASK_TGID_OF(t) TASK_U32(t, TASK_TGID)
static __always_inline u64 task_cgroup_id(const char *t) {
    const char *kn = TASK_PTR(TASK_PTR(TASK_PTR(t, TASK_CGROUPS), CSS_SET_DFL_CGRP), CGROUP_KN);
    return *(const u64 *)(kn + KERNFS_NODE_ID);
}
#else
#define SW_NEXT_TASK ((const char *)0)
#define WK_TASK ((const char *)0)
#define TASK_TGID_OF(t) 0
static __always_inline u64 task_cgroup_id(const char *t) {
    return 0;
}
#endif

// --- the lifecycle programs: PSTATE_LIFE(category, event), LF_* ---
//
// They run with interrupts on (sched_process_free in an RCU callback, in
// softirq). A classic tracepoint's program runs only while no other classic
// one runs on its CPU (the kernel's bpf_prog_active): an interrupt's classic
// sched_waking or sched_wakeup that came while one of them ran was skipped,
// and the sleep it ended had no wake-up. So wherever the kernel's BTF gives
// the offsets they are no classic tracepoints:
//
// TP_BTF: tp_btf programs, like the hot ones (raw arguments in ctx[], task
// fields by plain loads at TASK_* offsets).
//
// LIFE_RAW (the classic path on a kernel with BTF, set by
// pstate.kernel.tpbtf): raw tracepoint programs (BPF_PROG_TYPE_RAW_TRACEPOINT),
// raw arguments in ctx->args[], task fields read with bpf_probe_read_kernel
// at the same TASK_* offsets (a raw tracepoint's pointer is no typed one).
//
// Neither (no usable BTF): classic tracepoints, which can still hide an
// interrupt's wake-up as above (man pstate-record says so).
//
// Both others are skipped only when the same program already runs on the
// CPU; they can interrupt one another (free in softirq interrupting
// task_newtask or exec in process context): per-CPU scratch they share is
// split by context in the programs (bpf/snap.bpf.c).
//
// The raw arguments (the kernel's TP_PROTOs): task_newtask(task,
// clone_flags), sched_process_fork(parent, child), sched_process_exec(p,
// old_pid, bprm), sched_process_exit(p, group_dead), sched_process_free(p);
// exec's and exit's p is the current task, fork's parent too.

#if defined(TP_BTF) || defined(LIFE_RAW)

#ifdef TP_BTF
#define PSTATE_LIFE(category, event) int tp_btf__##event(u64 *ctx)
#define LF_ARG(i) ctx[i]
#define LF_TASK_PID(i) TASK_U32(TP_TASK(i), TASK_PID)
#define LF_TASK_COMM(i, dst) TASK_COMM_COPY(dst, TP_TASK(i))
#else
#define PSTATE_LIFE(category, event) RAW_TRACEPOINT_PROBE(event)
#define LF_ARG(i) ctx->args[i]
static __always_inline u32 lf_task_u32(u64 task, u32 off) {
    u32 v = 0;
    bpf_probe_read_kernel(&v, sizeof(v), (const void *)(task + off));
    return v;
}
#define LF_TASK_PID(i) lf_task_u32(ctx->args[i], TASK_PID)
#define LF_TASK_COMM(i, dst) bpf_probe_read_kernel(dst, 16, (const void *)(ctx->args[i] + TASK_COMM))
#endif

// csd_queue_cpu(cpu, callsite, func, csd): the address of the entry queued.
// Only with WAKE_AT_WAKEUP, which needs the BTF: never a classic tracepoint
// (it runs with interrupts on where the kernel calls a function on other
// CPUs, a TLB shootdown say).
#define LF_CSD_ENTRY ((u64)LF_ARG(3))
#define LF_NEW_PID LF_TASK_PID(0)
#define LF_NEW_CLONE_FLAGS ((u64)LF_ARG(1))
#define LF_NEW_COMM(dst) LF_TASK_COMM(0, dst)
#define LF_FORK_PARENT_PID ((u32)bpf_get_current_pid_tgid()) // parent is current
#define LF_FORK_CHILD_PID LF_TASK_PID(1)
#define LF_EXEC_PID ((u32)bpf_get_current_pid_tgid()) // p is current (its pid after de_thread)
#define LF_EXEC_OLD_PID ((u32)LF_ARG(1))
#define LF_EXIT_PID ((u32)bpf_get_current_pid_tgid()) // p is current
#define LF_EXIT_GROUP_DEAD ((u8)LF_ARG(1))
#define LF_FREE_PID LF_TASK_PID(0)
#define LF_FREE_COMM(dst) LF_TASK_COMM(0, dst)
#ifdef TP_BTF
#define LF_FREE_TASK TP_TASK(0) // for task_cgroup_id()
#else
#define LF_FREE_TASK ((const char *)0)
#endif

#else // classic tracepoints: the trace record's fields

#ifdef WAKE_AT_WAKEUP
#error "WAKE_AT_WAKEUP needs TP_BTF or LIFE_RAW (csd_queue_cpu as no classic tracepoint)"
#endif
#define PSTATE_LIFE(category, event) TRACEPOINT_PROBE(category, event)
#define LF_NEW_PID ((u32)args->pid)
#define LF_NEW_CLONE_FLAGS args->clone_flags
#define LF_NEW_COMM(dst) __builtin_memcpy(dst, args->comm, 16)
#define LF_FORK_PARENT_PID ((u32)args->parent_pid)
#define LF_FORK_CHILD_PID ((u32)args->child_pid)
#define LF_EXEC_PID ((u32)args->pid)
#define LF_EXEC_OLD_PID ((u32)args->old_pid)
#define LF_EXIT_PID ((u32)args->pid)
#define LF_EXIT_GROUP_DEAD args->group_dead
#define LF_FREE_PID ((u32)args->pid)
#define LF_FREE_COMM(dst) TP_DATA_LOC_READ_STR(dst, comm, 16)
#define LF_FREE_TASK ((const char *)0)

#endif

#endif

// tpargs.h: the arguments of the tracepoints record and snap attach, read
// the way the plan says for each (pstate.kernel.probeplan), so that each
// program has one source for every kernel. Included by bpf/record.bpf.c and
// bpf/snap.bpf.c.
//
// A program names a tracepoint PSTATE_PROBE(category, event) and reads its
// arguments only through the accessors below. For each event it attaches,
// the plan sets PATH_<event> to one of:
//
// PSTATE_TP_BTF: a BTF-typed raw tracepoint program, `u64 *ctx` holding the
//   tracepoint's raw arguments (sched_switch: preempt, prev, next[,
//   prev_state]; the wake-ups: the task), task_struct fields read with plain
//   loads the verifier checks against BTF. Loaded by pstate itself
//   (pstate.kernel.tpbtf): BCC knows no tp_btf target for a tracepoint.
// PSTATE_RAW: a raw tracepoint program (BPF_PROG_TYPE_RAW_TRACEPOINT), the
//   same raw arguments in ctx->args[], task fields read with
//   bpf_probe_read_kernel (a raw tracepoint's pointer is no typed one).
// PSTATE_CLASSIC: a classic tracepoint: BCC builds `args` from the running
//   kernel's tracefs format file; the kernel has already copied the fields
//   into a trace record.
//
// Every kernel struct offset is a -D setting read from the kernel's BTF
// (pstate.kernel.btf MEMBERS), never from a header tree, which may be
// another kernel's:
//   TASK_PID TASK_TGID TASK_EXIT_STATE TASK_PRIO TASK_COMM TASK_CPU
//   TASK_STATE (TASK_STATE_SIZE) TASK_SIGNAL SIGNAL_LIVE, the cgroup chain
// and the kernel's task state bits that sched_switch's format folds into
// what it reports (probeplan.raw_state_defines):
//   RAW_TASK_REPORT RAW_REPORT_IDLE RAW_REPORT_MAX RAW_TASK_IDLE
//   RAW_UNINTERRUPTIBLE RAW_AS_UNINTERRUPTIBLE
// Where a kernel lacks an argument the plan says how it is served instead:
//   SW_STATE_FROM_TASK    sched_switch without prev_state (before Linux 5.18)
//   EXIT_GROUP_DEAD_FROM_SIGNAL  sched_process_exit without group_dead
//   FREE_COMM_DATA_LOC    sched_process_free's classic comm is a __data_loc string
//
// The three wake-ups (sched_waking, sched_wakeup, sched_wakeup_new) read
// through one set of accessors (WK_*): the plan gives them one path, and
// the accessors follow sched_wakeup_new's, which every program attaches.
//
// The lifecycle programs (task_newtask, sched_process_fork/exec/exit/free)
// run with interrupts on (free in an RCU callback, in softirq). A classic
// tracepoint's program runs only while no other classic one runs on its CPU
// (the kernel's bpf_prog_active): an interrupt's classic sched_waking or
// sched_wakeup that came while one of them ran was skipped, and the sleep it
// ended had no wake-up. So wherever the kernel's BTF allows they are no
// classic tracepoints. tp_btf and raw programs are skipped only when the
// same program already runs on the CPU; they can interrupt one another (free
// in softirq interrupting task_newtask or exec in process context): per-CPU
// scratch they share is split by context in the programs (bpf/snap.bpf.c).
//
// The raw arguments (the kernel's TP_PROTOs): task_newtask(task,
// clone_flags), sched_process_fork(parent, child), sched_process_exec(p,
// old_pid, bprm), sched_process_exit(p[, group_dead]), sched_process_free(p),
// csd_queue_cpu(cpu, callsite, func, csd), sched_migrate_task(p, dest_cpu);
// exec's and exit's p is the current task, fork's parent too.

#ifndef TPARGS_H
#define TPARGS_H

#define PSTATE_TP_BTF 1
#define PSTATE_RAW 2
#define PSTATE_CLASSIC 3

#define PSTATE_ATTACH_1(category, event) int tp_btf__##event(u64 *ctx)
#define PSTATE_ATTACH_2(category, event) RAW_TRACEPOINT_PROBE(event)
#define PSTATE_ATTACH_3(category, event) TRACEPOINT_PROBE(category, event)
#define PSTATE_ATTACH_(path, category, event) PSTATE_ATTACH_##path(category, event)
#define PSTATE_ATTACH(path, category, event) PSTATE_ATTACH_(path, category, event)
#define PSTATE_PROBE(category, event) PSTATE_ATTACH(PATH_##event, category, event)

// A task name (16 bytes) copied between two 8-byte-aligned places in two
// 8-byte loads and stores. From a task on the tp_btf path every load is a
// checked one (the JIT guards each against a user address): a byte-wise
// copy there was 16 of them, on every switch. COMM_BUF declares a name
// buffer on the stack that it can copy to or from.
#define COMM_COPY(dst, src) \
    __builtin_memcpy(__builtin_assume_aligned(dst, 8), __builtin_assume_aligned(src, 8), 16)
#define COMM_BUF(name) char name[16] __attribute__((aligned(8)))

// --- task fields, by plain load (tp_btf) or bpf_probe_read_kernel (raw) ---
#define TP_TASK(i) ((const char *)ctx[i])
#define TASK_U32(t, off) (*(const u32 *)((t) + (off)))
#define TASK_S32(t, off) (*(const s32 *)((t) + (off)))
#define TASK_PTR(t, off) (*(const char *const *)((t) + (off)))
// A task's name where it lies: in the task (the kernel aligns it, and the
// names are then read as two words; buf is not used), or copied into buf.
#if defined(TASK_COMM) && TASK_COMM % 8 == 0
#define TASK_COMM_AT(t, buf) ((const char *)(t) + TASK_COMM)
#define TASK_COMM_COPY(dst, t) COMM_COPY(dst, (t) + TASK_COMM)
#else
#define TASK_COMM_AT(t, buf) ((void)__builtin_memcpy(buf, (t) + TASK_COMM, 16), (const char *)(buf))
#define TASK_COMM_COPY(dst, t) __builtin_memcpy(dst, (t) + TASK_COMM, 16)
#endif

static __always_inline u32 raw_task_u32(u64 task, u32 off) {
    u32 v = 0;
    bpf_probe_read_kernel(&v, sizeof(v), (const void *)(task + off));
    return v;
}

// The v2 cgroup id of a task that is not the current one (next at
// sched_switch, a wakee, a freed task: SW_NEXT_TASK, WK_TASK, LF_FREE_TASK,
// each 0 where its tracepoint gives no typed task): read as
// bpf_get_current_cgroup_id() reads current's, task->cgroups->dfl_cgrp->kn->id,
// with plain loads at the offsets of the kernel's BTF (the verifier types
// each pointer it loads, and a fault reads 0). 0: not known.
#ifdef KERNFS_NODE_ID
static __always_inline u64 task_cgroup_id(const char *t) {
    if (!t)
        return 0;
    const char *kn = TASK_PTR(TASK_PTR(TASK_PTR(t, TASK_CGROUPS), CSS_SET_DFL_CGRP), CGROUP_KN);
    return *(const u64 *)(kn + KERNFS_NODE_ID);
}
#else
static __always_inline u64 task_cgroup_id(const char *t) {
    return 0;
}
#endif

// --- sched_switch: SW_* ---
#if PATH_sched_switch == PSTATE_TP_BTF

// The task's raw state: the argument (Linux 5.18+), or the task's own
// field as the kernel's tracepoint read it before (an 8-byte `state`
// before 5.14: its low half holds every state bit)
#ifdef SW_STATE_FROM_TASK
#if TASK_STATE_SIZE == 8
#define SW_RAW_STATE ((u32) * (const u64 *)(TP_TASK(1) + TASK_STATE))
#else
#define SW_RAW_STATE TASK_U32(TP_TASK(1), TASK_STATE)
#endif
#else
#define SW_RAW_STATE ((u32)ctx[3])
#endif

// sched_switch's prev_state as its format reports it
// (__trace_sched_switch_state): the preemption bit, or the one reported
// bit of the state the task blocked in (its highest set bit).
static __always_inline u32 reported_switch_state(u64 *ctx) {
    if ((u8)ctx[0])
        return RAW_REPORT_MAX;
    u32 raw = SW_RAW_STATE;
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
#define SW_PREV_COMM(dst) TASK_COMM_COPY(dst, TP_TASK(1))
#define SW_NEXT_COMM(dst) TASK_COMM_COPY(dst, TP_TASK(2))
// tgids: prev's is the current task's; next's is known on this path only (0: not known)
#define SW_PREV_TGID TASK_U32(TP_TASK(1), TASK_TGID)
#define SW_NEXT_TGID TASK_U32(TP_TASK(2), TASK_TGID)
#define SW_NEXT_TASK TP_TASK(2)

#else // classic

#define SW_PREV_PID ((u32)args->prev_pid)
#define SW_NEXT_PID ((u32)args->next_pid)
#define SW_PREV_PRIO args->prev_prio
#define SW_NEXT_PRIO args->next_prio
#define SW_PREV_STATE ((u32)args->prev_state)
#define SW_PREV_COMM(dst) __builtin_memcpy(dst, args->prev_comm, 16)
#define SW_NEXT_COMM(dst) __builtin_memcpy(dst, args->next_comm, 16)
#define SW_PREV_TGID ((u32)(bpf_get_current_pid_tgid() >> 32))
#define SW_NEXT_TGID 0
#define SW_NEXT_TASK ((const char *)0)

#endif

// The task's own on-CPU time as the kernel counts it (se.sum_exec_runtime
// at TASK_SUM_EXEC, pstate.kernel.btf), plus 1, so that 0 says not known.
// On the tp_btf path both tasks' are plain loads; on the classic one only
// prev's can be read, as the current task's (SW_NEXT_EXEC 0: the program
// keeps prev's on its row at every switch-out, which is the task's at its
// next switch-in, since the count grows only while it runs). Without the
// offset neither is known.
#if defined(TASK_SUM_EXEC) && PATH_sched_switch == PSTATE_TP_BTF
#define SW_PREV_EXEC (*(const u64 *)(TP_TASK(1) + TASK_SUM_EXEC) + 1)
#define SW_NEXT_EXEC (*(const u64 *)(TP_TASK(2) + TASK_SUM_EXEC) + 1)
#elif defined(TASK_SUM_EXEC)
static __always_inline u64 current_sum_exec(void) {
    u64 v = 0;
    if (bpf_probe_read_kernel(&v, sizeof(v), (const char *)bpf_get_current_task() + TASK_SUM_EXEC))
        return 0;
    return v + 1;
}
#define SW_PREV_EXEC current_sum_exec()
#define SW_NEXT_EXEC 0
#else
#define SW_PREV_EXEC 0
#define SW_NEXT_EXEC 0
#endif

// The growth of such a count since a row's (both as SW_*_EXEC give them: 0
// not known), the part of a slice the kernel counted as the task's; ~0 when
// either is not known, or when the row's is later (a reused row).
static __always_inline u64 exec_growth(u64 now, u64 then) {
    return now && then && now >= then ? now - then : ~0ULL;
}

// --- sched_waking, sched_wakeup, sched_wakeup_new: WK_* (the task woken) ---
#if PATH_sched_wakeup_new == PSTATE_TP_BTF

#define WK_PID TASK_U32(TP_TASK(0), TASK_PID)
#define WK_TGID TASK_U32(TP_TASK(0), TASK_TGID)
#define WK_TARGET_CPU TASK_U32(TP_TASK(0), TASK_CPU)
#define WK_COMM(dst) TASK_COMM_COPY(dst, TP_TASK(0))
// The wakee's name for COMM_COPY, read only where it is copied: a COMM_BUF
// is filled only where the name is not read in place.
#define WK_COMM_AT(buf) TASK_COMM_AT(TP_TASK(0), buf)
// the wakee, for its cgroup id, and its tgid read from it
#define WK_TASK TP_TASK(0)
#define WK_TGID_OF(t) TASK_U32(t, TASK_TGID)

#else // classic

#define WK_PID ((u32)args->pid)
#define WK_TGID 0
#define WK_TARGET_CPU args->target_cpu
#define WK_COMM(dst) __builtin_memcpy(dst, args->comm, 16)
#define WK_COMM_AT(buf) ((void)__builtin_memcpy(buf, args->comm, 16), (const char *)(buf))
#define WK_TASK ((const char *)0)
#define WK_TGID_OF(t) 0

#endif

// --- the lifecycle tracepoints: LF_* ---
// The raw argument i of an event, on its path (tp_btf or raw).
#define LF_ARG_1(i) ctx[i]
#define LF_ARG_2(i) ctx->args[i]
#define LF_ARG_(path, i) LF_ARG_##path(i)
#define LF_ARG_AT(path, i) LF_ARG_(path, i)
#define LF_ARG(event, i) LF_ARG_AT(PATH_##event, i)
// A u32 field of the task in raw argument i, on a tp_btf or raw path.
#define LF_TASK_U32_1(event, i, off) TASK_U32(TP_TASK(i), off)
#define LF_TASK_U32_2(event, i, off) raw_task_u32(ctx->args[i], off)
#define LF_TASK_U32_(path, event, i, off) LF_TASK_U32_##path(event, i, off)
#define LF_TASK_U32_AT(path, event, i, off) LF_TASK_U32_(path, event, i, off)
#define LF_TASK_U32(event, i, off) LF_TASK_U32_AT(PATH_##event, event, i, off)
#define LF_TASK_COMM_1(event, i, dst) TASK_COMM_COPY(dst, TP_TASK(i))
#define LF_TASK_COMM_2(event, i, dst) bpf_probe_read_kernel(dst, 16, (const void *)(ctx->args[i] + TASK_COMM))
#define LF_TASK_COMM_(path, event, i, dst) LF_TASK_COMM_##path(event, i, dst)
#define LF_TASK_COMM_AT(path, event, i, dst) LF_TASK_COMM_(path, event, i, dst)
#define LF_TASK_COMM(event, i, dst) LF_TASK_COMM_AT(PATH_##event, event, i, dst)

// task_newtask: the new task, its clone flags and name
#if PATH_task_newtask == PSTATE_CLASSIC
#define LF_NEW_PID ((u32)args->pid)
#define LF_NEW_CLONE_FLAGS ((u64)args->clone_flags)
#define LF_NEW_COMM(dst) __builtin_memcpy(dst, args->comm, 16)
#else
#define LF_NEW_PID LF_TASK_U32(task_newtask, 0, TASK_PID)
#define LF_NEW_CLONE_FLAGS ((u64)LF_ARG(task_newtask, 1))
#define LF_NEW_COMM(dst) LF_TASK_COMM(task_newtask, 0, dst)
#endif

// sched_process_fork: the parent is current
#if PATH_sched_process_fork == PSTATE_CLASSIC
#define LF_FORK_PARENT_PID ((u32)args->parent_pid)
#define LF_FORK_CHILD_PID ((u32)args->child_pid)
#else
#define LF_FORK_PARENT_PID ((u32)bpf_get_current_pid_tgid())
#define LF_FORK_CHILD_PID LF_TASK_U32(sched_process_fork, 1, TASK_PID)
#endif

// sched_process_exec: p is current (its pid after de_thread)
#if PATH_sched_process_exec == PSTATE_CLASSIC
#define LF_EXEC_PID ((u32)args->pid)
#define LF_EXEC_OLD_PID ((u32)args->old_pid)
#else
#define LF_EXEC_PID ((u32)bpf_get_current_pid_tgid())
#define LF_EXEC_OLD_PID ((u32)LF_ARG(sched_process_exec, 1))
#endif

// sched_process_exit: p is current. group_dead, the last thread of its
// process: the argument or the classic field where the kernel has one
// (EXIT_GROUP_DEAD_ARG, EXIT_GROUP_DEAD_FIELD); else
// (EXIT_GROUP_DEAD_FROM_SIGNAL) derived from the process's count of live
// threads, which do_exit() has decremented before the tracepoint: at 0 the
// process is dead. Two threads exiting at once can both see it at 0, so the
// program's exit_group_dead() lets the first claim it. Without any of them
// it is not known (false).
#if PATH_sched_process_exit == PSTATE_CLASSIC
#define LF_EXIT_PID ((u32)args->pid)
#else
#define LF_EXIT_PID ((u32)bpf_get_current_pid_tgid())
#endif
#if defined(EXIT_GROUP_DEAD_FROM_SIGNAL)
#define LF_EXIT_GROUP_DEAD exit_group_dead()
// Whether the current task's process has no live thread left; *signal: its
// signal_struct, which names the process for exit_group_dead()'s claim.
static __always_inline int current_group_dead(u64 *signal) {
    const char *task = (const char *)bpf_get_current_task();
    u64 sig = 0;
    s32 live = 1;
    bpf_probe_read_kernel(&sig, sizeof(sig), task + TASK_SIGNAL);
    if (!sig)
        return 0;
    bpf_probe_read_kernel(&live, sizeof(live), (const char *)sig + SIGNAL_LIVE);
    *signal = sig;
    return live == 0;
}
#elif defined(EXIT_GROUP_DEAD_FIELD)
#define LF_EXIT_GROUP_DEAD args->group_dead
#elif defined(EXIT_GROUP_DEAD_ARG)
#define LF_EXIT_GROUP_DEAD ((u8)LF_ARG(sched_process_exit, 1))
#else
#define LF_EXIT_GROUP_DEAD 0
#endif

// sched_process_free: the task freed
#if PATH_sched_process_free == PSTATE_CLASSIC
#define LF_FREE_PID ((u32)args->pid)
#ifdef FREE_COMM_DATA_LOC
#define LF_FREE_COMM(dst) TP_DATA_LOC_READ_STR(dst, comm, 16)
#else
#define LF_FREE_COMM(dst) __builtin_memcpy(dst, args->comm, 16)
#endif
#else
#define LF_FREE_PID LF_TASK_U32(sched_process_free, 0, TASK_PID)
#define LF_FREE_COMM(dst) LF_TASK_COMM(sched_process_free, 0, dst)
#endif
#if PATH_sched_process_free == PSTATE_TP_BTF
#define LF_FREE_TASK TP_TASK(0) // for task_cgroup_id()
#else
#define LF_FREE_TASK ((const char *)0)
#endif

// sched_migrate_task(p, dest_cpu): the task moved to another CPU's run
// queue (set_task_cpu: a wake-up placed on another CPU, a load balance, NUMA
// moves), under the run queues' locks with interrupts off.
#if PATH_sched_migrate_task == PSTATE_CLASSIC
#define MG_PID ((u32)args->pid)
#define MG_DEST_CPU ((u32)args->dest_cpu)
#else
#define MG_PID LF_TASK_U32(sched_migrate_task, 0, TASK_PID)
#define MG_DEST_CPU ((u32)LF_ARG(sched_migrate_task, 1))
#endif

// csd_queue_cpu(cpu, callsite, func, csd): the address of the entry queued.
// Only with WAKE_AT_WAKEUP, never as a classic tracepoint (it runs with
// interrupts on where the kernel calls a function on other CPUs, a TLB
// shootdown say).
#ifdef WAKE_AT_WAKEUP
#if PATH_csd_queue_cpu == PSTATE_CLASSIC || !defined(PATH_csd_queue_cpu)
#error "WAKE_AT_WAKEUP needs csd_queue_cpu as a tp_btf or raw tracepoint"
#endif
#define LF_CSD_ENTRY ((u64)LF_ARG(csd_queue_cpu, 3))
#endif

#endif

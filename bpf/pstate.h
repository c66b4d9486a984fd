// pstate.h: the one definition of what pstate's kernel side and user space
// exchange: record's event layout, its codes and flags, and the index of
// every counter. Included by bpf/record.bpf.c, bpf/snap.bpf.c and
// cli/pstate/_encode.c; pstate.kernel.eventlayout reads the same text for Python.
//
// Rules for this file (pstate.kernel.eventlayout parses it): plain `#define NAME
// value` lines with integer values, and one `struct event` of fixed-size
// fields (u8/u16/u32/u64, s16/s32, char NAME[N]), one field per line.
// Callers define u8..u64 and s16/s32 before including it.

#ifndef PSTATE_H
#define PSTATE_H

// --- record: state codes (struct event from/to, task rows) ---
#define ST_UNKNOWN 0
#define ST_RUNNING 1
#define ST_RUNNABLE 2
#define ST_PREEMPTED 3
#define ST_NEW 4
#define ST_REAPED 5
#define ST_KERNEL 0x1000 // | reported prev_state bits

// --- record: event types (struct event type) ---
#define EV_STATE 1
#define EV_FORK 2
#define EV_EXEC 3
#define EV_EXIT 4
// EV_SLICE, record -p/-c/--cgroup: a switch-out of a task not followed while
// a followed one is queued on its CPU
#define EV_SLICE 5
#define EV_WAKER 6 // record -p/-c/--cgroup: the name of a thread that wakes others, once per thread (and exec)

// --- record: causes of a state event (struct event cause) ---
#define CAUSE_SWITCH_OUT 1
#define CAUSE_SWITCH_IN 2
#define CAUSE_WAKEUP 3
#define CAUSE_WAKEUP_NEW 4
#define CAUSE_REAP 5

// --- record: struct event flags ---
#define F_VOLUNTARY 1     // switch_out: the task blocked
#define F_THREAD 2        // fork: a new thread
#define F_GROUP_DEAD 4    // exit: the last thread of its process
#define F_WAKER_IRQ 8     // wakeup: woken from hard interrupt context
#define F_WAKER_SOFTIRQ 16 // wakeup: woken from softirq context

// --- record: the counters per-CPU array ---
#define DROP_RINGBUF 0
#define DROP_MAP_FULL 1
#define DROP_SAMPLED 2
#define STAT_EMITTED 3   // unused: emitted = attempted - dropped
#define STAT_ATTEMPTED 4 // events that passed the filters
#define STAT_CLAMPED 5   // durations whose two timestamps came out of order across CPUs, clamped to 0
#define STAT_STACK_FAILED 6 // record --stacks: no stack id (a different stack held its slot, or the map was full)
#define REC_NR_COUNTERS 7

// --- record: which filter sets the settings map's task_filters asks for ---
#define TF_CPU 1
#define TF_TID 2
#define TF_PID 4
#define TF_COMM 8
#define TF_FOLLOW 16 // not a set: pid_filter takes in the processes its members fork (--children, record -- CMD)
#define TF_CGROUP 32 // cgroup_pids: the processes of --cgroup's cgroups (cgroup_filter), forks followed
// record's filter sets: how many members each holds (pstate.kernel.filtermaps
// refuses more)
#define FILTER_IDS 1024       // tid_filter; and pid_filter's -p values
#define FILTER_FOLLOWED 16384 // pid_filter, with the processes it follows; cgroup_pids
#define FILTER_COMMS 256      // comm_filter
#define FILTER_CPUS 4096      // cpu_filter
#define FILTER_CGROUPS 1024   // cgroup_filter

#define NO_DUR 0xffffffffffffffff // dur of a state whose start was not seen

// --- snap: the counters per-CPU array ---
#define SNAP_CNT_TASKS_FULL 0 // a row could not be created: tasks map full
#define SNAP_CNT_GONE_FULL 1  // a final row found the gone map full: it was folded or lost
#define SNAP_CNT_FOLDED 2     // final rows folded into their group's row (folds map)
#define SNAP_CNT_FOLD_LOST 3  // final rows lost: gone full, and the folds map too
#define SNAP_NR_COUNTERS 4

// --- snap: row state slots and flags ---
#define SLOT_UNKNOWN 0
#define SLOT_RUNNING 1
#define SLOT_RUNNABLE 2
#define SLOT_PREEMPTED 3
#define SLOT_NEW 4
#define SLOT_KERNEL 5     // + index of the lowest reported prev_state bit
#define SLOT_REAPED 0xff  // final state of a freed thread; has no counter
#define SNAP_F_EXITED 1   // sched_process_exit seen
#define SNAP_F_FREED 2    // final row: the kernel freed the thread, or its tid was reused
#define SNAP_F_GUESSED 4  // first seen by a switch or wake-up: start_ts is when pstate saw it first
#define SNAP_F_SEEDED 8   // seeded from /proc (set by user space; the program keeps it): its current state
                          // began before, and the histograms skip that interval

// --- snap: latency histograms in each task row (bpf/snaphist.h) ---
// log2 buckets of a duration d in ns: bucket 0 holds d <= 2^HIST_SHIFT, bucket
// b (1 .. HIST_BUCKETS-2) holds 2^(HIST_SHIFT+b-1) < d <= 2^(HIST_SHIFT+b)
// (Prometheus' le), the last one everything above 2^(HIST_SHIFT+HIST_BUCKETS-2)
// ns (17.2 s). Fixed, so series of every host and version aggregate.
#define HIST_SHIFT 10
#define HIST_BUCKETS 26
#define HK_RUNQ_WAKEUP 0    // run-queue wait after a wake-up (runnable -> running)
#define HK_RUNQ_PREEMPTED 1 // run-queue wait after a preemption (preempted -> running)
#define HK_SLEEPING 2       // blocked in S, ended by a wake-up
#define HK_UNINTERRUPTIBLE 3 // blocked in D, ended by a wake-up
#define HIST_KINDS 4

// record's ring buffer record: 88 bytes, little-endian, after the ring
// buffer's own 8-byte header.
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
    u32 stack; // wakeup: the stack map id + 1 of the blocked state's kernel stack (record --stacks); 0: none
    u32 pad2;
    u64 cgroup; // state: the v2 cgroup id of the task (bpf_get_current_cgroup_id's); 0: not known
    u64 run; // switch_out: its on-CPU time by the kernel's count (se.sum_exec_runtime's growth); NO_DUR: not known
};

#endif

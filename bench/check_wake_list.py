"""Who wakes a task whose wake-up goes through the target CPU's wake list.

record takes its wake-ups at sched_wakeup where the kernel allows it
(bpf/record.bpf.c WAKE_AT_WAKEUP): an empty program on sched_waking costs
the pinned storm 0.03 more than on sched_wakeup (bench_kernel_cost.py
floor_btf_wakeup). But sched_wakeup runs in the waker's context only when
the waker activates the task itself; a wake-up queued on the target CPU's
wake list (a task woken onto an idle CPU) is activated there, from an IPI or
the idle loop. The waker queues it through __smp_call_single_queue, whose
tracepoint csd:csd_queue_cpu (Linux 6.5+) runs in the waker's context with
the queued entry: the task's wake_entry, so the task is found from it (its
offset from the kernel's BTF), and record notes the waker there.

This checks that way of naming the waker against sched_waking's own
current, on classic tracepoints (the check's cost does not matter): for
every sched_wakeup, the waker is sched_waking's current; record's is the one
csd_queue_cpu noted for the task when there is one, else sched_wakeup's
current. It runs a cross-CPU workload of its own (a waker on CPU 0, two
sleepers on CPU 1) and exits 1 if any waker differs:

    sudo .venv/bin/python bench/check_wake_list.py 5        for 5 seconds
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

from pstate.kernel import btf, headers

WORKLOAD = """
import os, threading, time
os.sched_setaffinity(0, {0})
evs = [threading.Event() for _ in range(2)]
def sleeper(e):
    os.sched_setaffinity(0, {1})
    while True:
        e.wait()
        e.clear()
for e in evs:
    threading.Thread(target=sleeper, args=(e,), daemon=True).start()
end = time.monotonic() + float(os.environ["SECONDS"])
while time.monotonic() < end:
    for e in evs:
        e.set()
    time.sleep(0.0005)
"""

PROGRAM = r"""
BPF_HASH(waker_at_waking, u32, u32, 65536);
BPF_HASH(noted, u32, u32, 65536);
BPF_ARRAY(counts, u64, 8);

static void inc(int i) {
    u64 *c = counts.lookup(&i);
    if (c)
        __sync_fetch_and_add(c, 1);
}

TRACEPOINT_PROBE(sched, sched_waking) {
    u32 pid = args->pid;
    u32 waker = bpf_get_current_pid_tgid();
    waker_at_waking.update(&pid, &waker);
    return 0;
}

TRACEPOINT_PROBE(csd, csd_queue_cpu) {
    if ((u64)args->func != TTWU_PENDING)
        return 0;
    u32 pid = 0;
    bpf_probe_read_kernel(&pid, sizeof(pid), (char *)args->csd - WAKE_ENTRY + TASK_PID);
    u32 waker = bpf_get_current_pid_tgid();
    noted.update(&pid, &waker);
    inc(0);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup) {
    u32 pid = args->pid;
    u32 current = bpf_get_current_pid_tgid();
    u32 *truth = waker_at_waking.lookup(&pid);
    u32 *note = noted.lookup(&pid);
    inc(1);
    if (!truth) {
        inc(2);
        return 0;
    }
    if (note) {
        inc(*note == *truth ? 3 : 4);
        noted.delete(&pid);
    } else {
        inc(current == *truth ? 5 : 6);
    }
    waker_at_waking.delete(&pid);
    return 0;
}
"""


def main() -> int:
    from bcc import BPF

    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    os.environ.setdefault("BCC_KERNEL_SOURCE", headers.find().path)
    b = btf.Btf.read()
    wake_entry = b.member("task_struct", "wake_entry")[0]
    pid = b.member("task_struct", "pid")[0]
    with open("/proc/kallsyms") as f:
        ttwu = next(int(line.split()[0], 16) for line in f if line.rstrip().endswith(" sched_ttwu_pending"))
    prog = BPF(text=PROGRAM, cflags=[f"-DTTWU_PENDING={ttwu:#x}ULL", f"-DWAKE_ENTRY={wake_entry}",
                                     f"-DTASK_PID={pid}"])
    load = subprocess.Popen([sys.executable, "-c", WORKLOAD], env={**os.environ, "SECONDS": str(seconds)})
    load.wait()
    time.sleep(0.1)
    c = [prog["counts"][ctypes.c_int(i)].value for i in range(7)]
    print(f"sched_wakeup {c[1]} ({c[2]} with no sched_waking seen); through a wake list {c[0]}: the waker noted "
          f"at csd_queue_cpu is sched_waking's current {c[3]}, is not {c[4]}; activated by the waker: "
          f"sched_wakeup's current is sched_waking's {c[5]}, is not {c[6]}")
    return 1 if c[4] or c[6] else 0


if __name__ == "__main__":
    sys.exit(main())

"""record's BPF program (bpf/record.bpf.c) as record builds it: its -D
settings, its buffers (the ring buffer's pages, the per-CPU runs of slots
before it) and the seeding of its task rows. Filters are not among the
settings: they are map values (pstate.kernel.filtermaps), so a new filter
needs no new compile."""

from __future__ import annotations

import ctypes
import errno
import os
import platform

from pstate.kernel import bpfsys, eventlayout, loader, taskrows
from pstate.kernel.bpfsys import BPF_NOEXIST
from pstate.kernel.eventcodec import EVENT_SIZE
from pstate.kernel.kstates import KernelStates

ST_KERNEL = eventlayout.DEFINES["ST_KERNEL"]  # a task row's state: | the reported prev_state bits
DEFAULT_BUFFER = "16M"  # --buffer-size's default, as written
DEFAULT_BUFFER_BYTES = 16 << 20
SLOTS_MIN, SLOTS_MAX = 1024, 8192  # a CPU's run of slots: 88 to 704 KiB (bpf/record.bpf.c struct slot)
BUFFER_MIN, BUFFER_MAX = 4096, 1 << 31  # --buffer-size: the kernel caps a ring buffer below 4 GiB


def pow2_pages(nbytes: int) -> int:
    """The ring buffer's pages for nbytes: a power of two, rounded up."""
    pages = max(1, nbytes // os.sysconf("SC_PAGE_SIZE"))
    return 1 << (pages - 1).bit_length()


def slots_per_cpu(rb_bytes: int, ncpus: int) -> int:
    """Each CPU's run of slots, 0 for none: what --buffer-size holds when
    shared by the possible CPUs, a power of two from SLOTS_MIN to SLOTS_MAX
    (what a run cannot hold goes to the ring buffer). Only on x86-64, where
    the programs' stores are not reordered (pstate.kernel.slotrings)."""
    if platform.machine() != "x86_64":
        return 0
    fit = max(SLOTS_MIN, min(SLOTS_MAX, rb_bytes // loader.RingReader.stride_of(EVENT_SIZE) // max(1, ncpus)))
    return 1 << (fit.bit_length() - 1)


def buffers_summary() -> str:
    """Where record's events go on this machine with the default --buffer-size, for doctor."""
    buffer_size = DEFAULT_BUFFER
    rb_bytes = pow2_pages(DEFAULT_BUFFER_BYTES) * os.sysconf("SC_PAGE_SIZE")
    ncpus = bpfsys.possible_cpus()
    rb = f"the {rb_bytes >> 20} MiB ring buffer" if rb_bytes >= 1 << 20 else f"the {rb_bytes >> 10} KiB ring buffer"
    per_cpu = slots_per_cpu(rb_bytes, ncpus)
    if not per_cpu:
        return (f"{rb} only (per-CPU slots are used on x86-64 alone, where the programs' stores keep "
                f"their order; this is {platform.machine()}; --buffer-size {buffer_size})")
    kib = per_cpu * loader.RingReader.stride_of(EVENT_SIZE) >> 10
    return (f"switches and wake-ups go to per-CPU runs of {per_cpu} slots ({kib} KiB each, {ncpus} possible "
            f"CPUs), then to {rb}; the other events to the ring buffer (--buffer-size {buffer_size})")


def defines_for(ks: KernelStates, *, max_tasks: int, rb_pages: int, sample: bool, stack_entries: int = 0) -> dict:
    """The program's -D settings."""
    d = {
        "REPORT_MASK": f"0x{ks.report_mask:x}",
        "DEAD_BITS": f"0x{(ks.bit_of('dead') or 0) | (ks.bit_of('zombie') or 0):x}",
        "MAX_TASKS": max_tasks,
        "RB_PAGES": rb_pages,
        "SAMPLE": sample,
    }
    ncpus = bpfsys.possible_cpus()
    per_cpu = slots_per_cpu(rb_pages * os.sysconf("SC_PAGE_SIZE"), ncpus)
    if per_cpu:
        d["CPU_SLOTS"] = per_cpu
        d["SLOT_CPUS"] = ncpus
    if stack_entries:
        d["STACK_ENTRIES"] = stack_entries
    if taskrows.tasks_by_tid(max_tasks):
        d["TASKS_BY_TID"] = True  # (record's array has MAX_TASKS rows: no TID_SLOTS)
    return d


def seed(prog: loader.Program, ks: KernelStates, by_tid: bool) -> None:
    """Give the kernel side the tgid and state of every thread alive now, so
    the first events of existing tasks carry their process id. A row the
    program has made since it was attached is fresher and is kept."""
    # the hash takes seeds where no row exists; with the array they wait in
    # `seeds` for the thread's first event (bpf/record.bpf.c, task_row)
    tasks = prog.table("seeds" if by_tid else "tasks")
    lib = prog.lib
    fd = tasks.map_fd
    letters = {letter: bit for bit, letter in ks.letters.items()}
    Leaf = tasks.Leaf
    Key = tasks.Key
    for tgid, tid, letter, _comm, _start in loader.seed_tasks():
        bit = letters.get(letter)
        leaf = Leaf()
        leaf.tgid = tgid
        leaf.since = 0  # start not seen: durations of this first state are unknown
        leaf.state = (ST_KERNEL | bit) if bit else 0
        key = Key(tid)
        rc = lib.bpf_update_elem(fd, ctypes.byref(key), ctypes.byref(leaf), BPF_NOEXIST)
        if rc != 0 and ctypes.get_errno() != errno.EEXIST:
            break  # map full: later events count map_full drops

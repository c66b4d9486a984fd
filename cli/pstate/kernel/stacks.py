"""record --stacks: kernel stacks of blocked states, as `stack` records.

The BPF side (bpf/record.bpf.c, STACK_ENTRIES) takes the kernel stack of a
task as it switches out into one of the --stacks states and puts the stack
map id (+ 1) in the wake-up event that ends the state. StackTable reads that
map slot when the wake-up is encoded and frees it, so the kernel can reuse
the id; stream stack ids are given per distinct stack *content*, so a
reused kernel id never redefines one. A slot freed after a task blocked
(two tasks blocked with the same stack; the first wake-up freed it, and
another stack may have taken the id since) is taken from what was read
under that id when it was freed: each wake-up says when its blocked state
began.
"""

from __future__ import annotations

import bisect
import ctypes
import re
import threading
import time

import orjson

from pstate.stream.names import decode as decode_name
from pstate.stream.vocab import frame_name, reason_of

MAX_DEPTH = 127  # PERF_MAX_STACK_DEPTH: a stack map value holds this many u64 addresses
# contents kept per kernel id, each with the time it was last freed: a task
# blocked before the oldest kept is counted lost (its stack is not known)
FREED_KEPT = 4

# Frames of the tracing itself at the leaf of a stack a tp_btf program takes
# (the program, and the kernel's call into it), above the __schedule every
# blocked task's stack ends in: not the task's, and not on the tracepoint path.
TRACING_PREFIXES = ("bpf_prog_", "bpf_trace_run", "__bpf_trace_", "__traceiter_")


def task_frames(leaf_first: list[str]) -> list[str]:
    """leaf_first without the tracing frames at its leaf."""
    i = 0
    while i < len(leaf_first) and frame_name(leaf_first[i]).startswith(TRACING_PREFIXES):
        i += 1
    return leaf_first[i:]


KALLSYMS = "/proc/kallsyms"
# the linker's bounds of a text section, listed at the address of the
# section's first function (or just past its last)
SECTION_MARK = re.compile(r"_stext$|_etext$|_sinittext$|_einittext$|__start_|__stop_|__\w+_text_(start|end)$")


class Kallsyms:
    """Addresses to "function+0xoff" (" [module]" for a module's), from
    /proc/kallsyms (root sees the addresses); path None: no symbols, every
    frame an address."""

    def __init__(self, path: str | None = KALLSYMS):
        self.addrs: list[int] = []
        self.names: list[str] = []
        if path is None:
            return
        addrs, names = [], []
        with open(path, "rb") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3 or parts[1] not in (b"t", b"T", b"w", b"W"):
                    continue
                name = decode_name(parts[2])  # (shown, not matched: U+FFFD for what is not UTF-8)
                if len(parts) > 3:
                    name += " " + decode_name(parts[3])
                addrs.append(int(parts[0], 16))
                names.append(name)
        # one name per address: a function rather than a section's bounds
        # (Linux 6.1 lists __sched_text_start at __schedule's address)
        order = sorted(range(len(addrs)), key=lambda i: (addrs[i], bool(SECTION_MARK.match(names[i]))))
        for i in order:
            if not self.addrs or self.addrs[-1] != addrs[i]:
                self.addrs.append(addrs[i])
                self.names.append(names[i])

    def frame(self, ip: int) -> str:
        i = bisect.bisect_right(self.addrs, ip) - 1
        if i < 0 or not self.addrs[i]:
            return f"0x{ip:x}"
        name, _, mod = self.names[i].partition(" ")
        off = ip - self.addrs[i]
        return f"{name}+0x{off:x}" + (f" {mod}" if mod else "")


class BackgroundKallsyms:
    """Kallsyms read in a thread of its own. Reading and sorting the
    kernel's 100 000 and more symbols takes about 80 ms, which record
    --stacks would otherwise spend before its first line; the first frame
    named waits for them. A file that cannot be opened fails here, at once,
    as Kallsyms does; one that fails while read gives addresses, no names."""

    def __init__(self, path: str = KALLSYMS):
        with open(path, "rb"):
            pass
        self._symbols: Kallsyms | None = None
        self._thread = threading.Thread(target=self._read, args=(path,), name="pstate-kallsyms", daemon=True)
        self._thread.start()

    def _read(self, path: str) -> None:
        try:
            self._symbols = Kallsyms(path)
        except Exception:
            self._symbols = Kallsyms(None)

    def frame(self, ip: int) -> str:
        if self._symbols is None:
            self._thread.join()
        return self._symbols.frame(ip)


class StackTable:
    """Kernel stack map ids to stream stack ids, reasons and `stack` records.

    tail(kernel_id) gives a wake-up's ',"stack_id":..,"reason":".."' and
    queues a stack record the first time its content is seen; the recorder
    writes the queued records (take_pending) before the lines that use them.
    """

    def __init__(self, map_fd: int, calls, symbols: Kallsyms | BackgroundKallsyms | None = None):
        self.fd = map_fd
        self.calls = calls
        self.symbols = symbols or BackgroundKallsyms()  # read while recording starts
        self._by_content: dict[tuple, tuple[int, str]] = {}  # addresses -> (stream id, tail)
        # kernel id -> what it held between frees, oldest first, the last
        # FREED_KEPT: (when it was last freed holding them, addresses); a
        # content freed again in a row moves its time on
        self._freed: dict[int, list[tuple[int, tuple]]] = {}
        self._dropped: dict[int, int] = {}  # kernel id -> the time of its last entry let go
        self.pending: list[dict] = []
        self.lost = 0  # wake-ups whose slot could not be read

    def _read(self, kid: int, since: int) -> tuple | None:
        freed = self._freed.get(kid)
        if freed and since:
            # freed after the task blocked: the stack it took is what the
            # slot held at the first free since (another stack may hold the
            # id now); not known when that free's entry was let go
            if since <= self._dropped.get(kid, 0):
                return None
            for when, ips in freed:
                if when >= since:
                    return ips
        key = ctypes.c_uint32(kid)
        val = (ctypes.c_uint64 * MAX_DEPTH)()
        if self.calls.bpf_lookup_elem(self.fd, ctypes.byref(key), ctypes.byref(val)) != 0:
            # freed before the task blocked, and empty since: not its stack
            # (when not known: the last read, as likely as any)
            return freed[-1][1] if freed and not since else None
        self.calls.bpf_delete_elem(self.fd, ctypes.byref(key))
        ips = tuple(ip for ip in val if ip)
        now = time.monotonic_ns()
        freed = self._freed.setdefault(kid, [])
        if freed and freed[-1][1] == ips:
            freed[-1] = (now, ips)
        else:
            freed.append((now, ips))
            if len(freed) > FREED_KEPT:
                self._dropped[kid] = freed.pop(0)[0]
        return ips

    def tail(self, kid: int, since: int = 0) -> str:
        """The wake-up's tail for kernel stack id kid, of a blocked state
        that began at `since` (CLOCK_MONOTONIC ns; 0: not known)."""
        ips = self._read(kid, since)
        if not ips:
            self.lost += 1
            return ""
        known = self._by_content.get(ips)
        if known is None:
            leaf_first = task_frames([self.symbols.frame(ip) for ip in ips])
            sid = len(self._by_content) + 1
            reason = reason_of(leaf_first)
            known = (sid, f',"stack_id":{sid},"reason":{orjson.dumps(reason).decode()}')
            self._by_content[ips] = known
            self.pending.append({"type": "stack", "ts": time.monotonic_ns(), "stack_id": sid, "frames": ";".join(reversed(leaf_first))})
        return known[1]

    def take_pending(self) -> list[dict]:
        out, self.pending = self.pending, []
        return out

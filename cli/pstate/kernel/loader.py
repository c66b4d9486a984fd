"""The one module that owns BPF: finding bcc, kernel headers and tracefs,
compiling bpf/*.bpf.c with -D settings (or loading it from the program
cache, pstate.kernel.progcache), attaching, draining the ring buffer, counting
drops, and detaching.

Only record, snap and doctor import it; everything else runs without bcc.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.resources
import mmap
import os
import re
import struct
import sys
import time
from typing import Iterable

from pstate.kernel import bpfsys, btf, eventlayout, features, headers, kstates, pins, probeplan, progcache, tpbtf
from pstate.kernel.bccimport import import_bcc, quiet_fd
from pstate.exitcodes import ExitCode, PstateError

# Tracepoints every program needs; doctor checks each one.
TRACEPOINTS = (
    "sched/sched_switch", "sched/sched_waking", "sched/sched_wakeup", "sched/sched_wakeup_new",
    "sched/sched_process_fork", "sched/sched_process_exec", "sched/sched_process_exit",
    "sched/sched_process_free", "task/task_newtask",
    "irq/irq_handler_entry", "irq/irq_handler_exit", "irq/softirq_entry", "irq/softirq_exit",
    "timer/hrtimer_expire_entry", "timer/hrtimer_expire_exit",
)

# record's counters map indexes (bpf/pstate.h)
_D = eventlayout.DEFINES
DROP_RINGBUF, DROP_MAP_FULL, DROP_SAMPLED = _D["DROP_RINGBUF"], _D["DROP_MAP_FULL"], _D["DROP_SAMPLED"]
STAT_ATTEMPTED, STAT_CLAMPED = _D["STAT_ATTEMPTED"], _D["STAT_CLAMPED"]
STAT_STACK_FAILED = _D["STAT_STACK_FAILED"]
DROP_REASONS = {"ringbuf_full": DROP_RINGBUF, "map_full": DROP_MAP_FULL, "sampled": DROP_SAMPLED}
SKIPPED = "skipped"  # the loss reason of Program.skipped(): not a counter of the programs' own
# Programs whose runs only note context for other records: record's waker of
# a wake-up queued on a wake list (csd_queue_cpu), the interrupt marks, and
# the move of a followed task's run-queue count (sched_migrate_task). A run
# of one the kernel skips (another run of it under way on the CPU: the csd
# program, running with interrupts on, interrupted by one that queues an
# entry too) loses no transition, at most the waker or context a wake-up
# names, or the slices of one wait: Program.skipped() leaves them out,
# Program.skipped_notes() counts them.
NOTE_EVENTS = ("csd_queue_cpu", "irq_handler_entry", "irq_handler_exit", "softirq_entry", "softirq_exit",
               "hrtimer_expire_entry", "hrtimer_expire_exit", "sched_migrate_task")

CAP_PERFMON, CAP_BPF, CAP_SYS_ADMIN = 38, 39, 21

# What each program needs of the kernel's BPF beyond the tracepoints
# (pstate.kernel.features): record's events pass through a ring buffer.
NEEDS = {"record": (features.RINGBUF,)}


def effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def check_privileges() -> None:
    caps = effective_caps()
    if os.geteuid() == 0 and caps & (1 << CAP_SYS_ADMIN):
        return
    need = (1 << CAP_BPF) | (1 << CAP_PERFMON)
    if caps & need == need or caps & (1 << CAP_SYS_ADMIN):
        return
    raise PstateError(
        "loading BPF programs needs root, or CAP_BPF and CAP_PERFMON (plus read access to tracefs)",
        ExitCode.NOPERM,
        hint="run with sudo; pstate stats, heat and replay need no privilege",
    )


def ensure_tracefs() -> str:
    """Return the tracefs directory, mounting tracefs when it is not mounted."""
    d = kstates.tracefs_dir()
    if d:
        return d
    target = kstates.TRACEFS_DIRS[0]
    if os.path.isdir(target):
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.mount(b"nodev", target.encode(), b"tracefs", 0, None)
        if rc == 0 and kstates.tracefs_dir():
            return target
        err = os.strerror(ctypes.get_errno())
    else:
        err = f"{target} does not exist"
    raise PstateError(
        f"tracefs is not mounted and mounting it failed ({err}); BCC needs it for tracepoints",
        ExitCode.UNAVAILABLE,
        hint="mount -t tracefs nodev /sys/kernel/tracing",
    )


def kernel_states(ebpf_only: bool = False) -> kstates.KernelStates:
    """The running kernel's prev_state decoding, mounting tracefs if needed.

    ebpf_only (--ebpf prints the program without loading it): where tracefs
    cannot be read, fall back to the letters of current kernels.
    """
    try:
        return kstates.read_kernel_states()
    except (OSError, ValueError):
        if ebpf_only:
            return kstates.KernelStates(report_mask=0xFF, preempt_bit=0x100, letters={
                1: "S", 2: "D", 4: "T", 8: "t", 16: "X", 32: "Z", 64: "P", 128: "I"})
        check_privileges()
        ensure_tracefs()
        return kstates.read_kernel_states()


def missing_tracepoints(tracefs: str, names: Iterable[str] = TRACEPOINTS) -> list[str]:
    return [n for n in names if not os.path.exists(os.path.join(tracefs, "events", n, "format"))]


def find_headers(explicit: str | None = None) -> headers.HeaderTree:
    try:
        return headers.find(explicit)
    except headers.HeadersNotFound as e:
        arch = "amd64" if os.uname().machine == "x86_64" else os.uname().machine
        raise PstateError(
            f"{e}; BCC compiles pstate's BPF at run time and needs a kernel header tree",
            ExitCode.UNAVAILABLE,
            hint=f"apt-get install linux-headers-{arch} (any version works), or pass --kernel-headers DIR",
        ) from None
    except OSError as e:
        raise PstateError(f"cannot prepare kernel headers: {e}", ExitCode.UNAVAILABLE) from None


_LOCAL_INCLUDE = re.compile(r'^#include "([\w.]+)"[^\n]*$', re.M)


def source(name: str) -> str:
    """The C text of bpf/<name>.bpf.c, from the installed package or a checkout,
    with its headers from bpf/ in place (see with_headers)."""
    files = importlib.resources.files("pstate.bpf")
    return with_headers(files.joinpath(f"{name}.bpf.c").read_text(), lambda h: files.joinpath(h).read_text())


def with_headers(text: str, read) -> str:
    """text with each `#include "NAME"` replaced by read(NAME), once each.

    BCC compiles a text in memory, which has no directory for quoted
    includes to be found in; and the program cache keys the text it is given,
    so the header's content must be part of that text."""
    seen: set[str] = set()

    def put(m):
        name = m.group(1)
        if name in seen:
            return f"// {name}: included above"
        seen.add(name)
        return f"// --- bpf/{name} ---\n" + _LOCAL_INCLUDE.sub(put, read(name)) + f"\n// --- end of bpf/{name} ---"

    return _LOCAL_INCLUDE.sub(put, text)


def cflags_of(defines: dict) -> list[str]:
    out = []
    for k, v in defines.items():
        if v is None or v is False:
            continue
        out.append(f"-D{k}" if v is True else f"-D{k}={v}")
    return out


def running_kernel(tracefs: str | None = None) -> probeplan.Kernel:
    """What the plan is made from on this machine: the kernel's BTF (kept
    in the program cache until the next boot) and its tracefs format files."""
    try:
        facts, why = progcache.btf_facts(), ""
    except btf.BtfError as e:
        facts, why = None, str(e)
    tracefs = tracefs or kstates.tracefs_dir() or kstates.TRACEFS_DIRS[0]
    return probeplan.Kernel(facts, why, probeplan.tracefs_records(tracefs))


def probe_plan(name: str, defines: dict, probes: str | None, refused: frozenset = frozenset(),
               kernel: probeplan.Kernel | None = None) -> probeplan.Plan:
    """The plan of program `name` (bpf/<name>.bpf.c) with these settings,
    --probes (None: PSTATE_PROBES, else auto) and this kernel."""
    return probeplan.plan(tpbtf.events_of(source(name)), probeplan.choice_of(probes), kernel or running_kernel(),
                          int(str(defines["REPORT_MASK"]), 0), refused)


def program_text(name: str, defines: dict, probes: str | None = None) -> str:
    """The final C as compiled on this kernel's plan (a tp_btf program
    needs its load to tell a refusal; this does not load): the -D settings
    as #defines, then the source."""
    plan = probe_plan(name, defines, probes)
    defines = {**defines, **plan.defines}
    paths = ", ".join(f"{e} {p}" for e, p in plan.paths.items())
    lines = [f"// pstate: bpf/{name}.bpf.c as compiled on this kernel ({paths}; {plan.reason}), "
             "with its -D settings"]
    for k, v in defines.items():
        if v is None or v is False:
            continue
        lines.append(f"#define {k}" if v is True else f"#define {k} {v}")
    return "\n".join(lines) + "\n\n" + source(name)


class Program:
    """An attached BPF program. close() detaches it; so does exit.

    The first run with a given program text and kernel compiles it with BCC
    and keeps the result in the program cache (pstate.kernel.progcache); later runs
    load that without starting a compiler. `origin` says which happened.

    `plan` says how each tracepoint is attached (tp_btf, raw_tracepoint or
    tracepoint, pstate.kernel.probeplan) and why: a tp_btf program the
    kernel refuses goes on its next path unless --probes tp_btf asked for
    it by name.
    """

    def __init__(self, name: str, defines: dict, kernel_headers: str | None = None, probes: str | None = None):
        self.name = name
        self.bpf = None  # the bcc.BPF object when compiled in this run
        self.cached = None  # the progcache.Loaded when loaded from the cache
        self.btf_progs = None  # the tpbtf.Attached of the tp_btf programs of a module compiled in this run
        self.origin = "compiled"
        self.cache_note = ""  # why the cache was not used, for debugging
        check_privileges()
        features.require(*NEEDS.get(name, ()))
        self.tracefs = ensure_tracefs()
        missing = missing_tracepoints(self.tracefs)
        if missing:
            raise PstateError(f"this kernel lacks tracepoints: {', '.join(missing)}", ExitCode.UNAVAILABLE)
        self.headers = find_headers(kernel_headers)
        kernel = running_kernel(self.tracefs)
        self.plan = probe_plan(name, defines, probes, kernel=kernel)
        text = source(name)
        # A tp_btf program the kernel refuses goes on its next path, and the
        # module is compiled again (unless --probes tp_btf asked for it).
        while True:
            try:
                self._load(name, text, {**defines, **self.plan.defines})
                break
            except probeplan.Refused as e:
                self.close()
                if self.plan.forced and self.plan.choice == probeplan.TP_BTF:
                    raise PstateError(f"--probes tp_btf: the kernel refused the program: {e}", ExitCode.OSERR,
                                      hint="--probes auto takes another way where the kernel refuses one") from None
                if set(e.events) & self.plan.refused:
                    raise PstateError(f"the kernel refused the program: {e}", ExitCode.OSERR) from None
                self.plan = probe_plan(name, defines, probes, self.plan.refused | set(e.events), kernel)
                for event, why in e.why.items():
                    if event in self.plan.why:
                        self.plan.why[event] = f"the kernel refused it as tp_btf ({why})"
        if os.environ.get("PSTATE_CACHE_DEBUG"):
            note = f" ({self.cache_note})" if self.cache_note else ""
            print(f"pstate: {name}: {'loaded from the program cache' if self.cached is not None else 'compiled'}"
                  f"{note}; {self.plan.path}: {self.plan.paths}", file=sys.stderr)

    def _load(self, name: str, text: str, defines: dict) -> None:
        """From the cache, or compiled (and then cached); probeplan.Refused when
        the kernel refuses a tp_btf program."""
        self.cached, self.origin, self.cache_note = None, "compiled", ""
        cflags = cflags_of(defines)
        key = self._from_cache(name, text, cflags)
        if self.cached is None:
            self._compile(text, cflags)
            compiled = tpbtf.active_source(text, defines)  # the programs these settings compile
            if self.plan.targets:
                self.btf_progs = tpbtf.attach_module(self.bpf, self.plan.targets)
            if key:
                self._to_cache(key, name, compiled)
            _trim_heap()

    def _from_cache(self, name: str, text: str, cflags: list[str]) -> str | None:
        if not progcache.enabled():
            self.cache_note = "PSTATE_NO_CACHE is set"
            return None
        try:
            key = progcache.key_of(progcache.key_material(name, text, cflags, self.tracefs, self.headers.path,
                                                          probes=self.plan.paths))
        except Exception as e:  # the cache must never fail a run
            self.cache_note = f"no cache key: {e!r}"
            return None
        try:
            self.cached = progcache.load(progcache.lookup(key, name), self.tracefs)
            self.origin = "cache"
        except progcache.CacheMiss as e:
            self.cache_note = str(e)
        except Exception as e:
            self.cache_note = f"cache entry unusable: {e!r}"
        return key

    def _to_cache(self, key: str, name: str, text: str) -> None:
        try:
            lib = sys.modules["bcc"].libbcc.lib
            progcache.store(progcache.export(self.bpf, lib, key, name, text, self.tracefs, self.plan.targets))
        except progcache.NotCacheable as e:
            self.cache_note = f"not cacheable: {e}"
        except Exception as e:  # the cache must never fail a run
            self.cache_note = f"storing failed: {e!r}"

    def _compile(self, text: str, cflags: list[str]) -> None:
        headers.verify(self.headers)  # headers are code: nobody but root may have written them
        bcc = import_bcc()
        said_out = said_err = None
        os.environ["BCC_KERNEL_SOURCE"] = self.headers.path
        try:
            # libbcc prints on both stdout and stderr; stdout may be the
            # JSON-lines stream, which must only ever hold records.
            sys.stdout.flush()
            with quiet_fd(1) as said_out, quiet_fd(2) as said_err:
                self.bpf = bcc.BPF(text=text.encode(), cflags=cflags)
        except Exception as e:  # bcc raises plain Exception on compile/load errors
            said = "\n".join(c.text().strip() for c in (said_out, said_err) if c)
            msg = said.strip() or str(e)
            raise PstateError(
                f"compiling or loading the BPF program failed: {msg[-2000:]}",
                ExitCode.OSERR,
                hint="run `pstate doctor`; `pstate record --ebpf` prints the program",
            ) from None

    def table(self, name: str):
        return self.cached.table(name) if self.cached is not None else self.bpf[name.encode()]

    @property
    def lib(self):
        """Map element calls with libbcc's signatures (bpf_update_elem...)."""
        return map_calls()

    def counters(self) -> list[int]:
        """Sum over CPUs of the counters per-CPU array."""
        return percpu_sums(self.table("counters"))

    def named_prog_fds(self) -> dict[str, int]:
        """The module's loaded programs: function (or tp_btf event) name -> fd."""
        if self.cached is not None:
            return dict(self.cached.prog_fds)
        out = {}
        if self.bpf is not None:
            out.update({k.decode() if isinstance(k, bytes) else k: f.fd for k, f in self.bpf.funcs.items()})
        if self.btf_progs is not None:
            out.update(self.btf_progs.prog_fds)
        return out

    def prog_fds(self) -> list[int]:
        """The fds of the module's loaded programs."""
        return list(self.named_prog_fds().values())

    def skipped(self) -> int:
        """Runs of the module's programs that the kernel skipped since they
        were loaded (bpfsys.prog_info's recursion_misses): each a transition
        or wake-up they never saw. On the classic tracepoint path the kernel
        runs no tracepoint program on a CPU while another BPF program, or a
        bpf(2) map call of any process, is under way there; tp_btf and raw
        tracepoint programs are skipped only while the same program runs.
        The programs of NOTE_EVENTS are left out (skipped_notes)."""
        return skipped_runs(fd for name, fd in self.named_prog_fds().items() if not _is_note(name))

    def skipped_notes(self) -> int:
        """Runs of the programs of NOTE_EVENTS the kernel skipped: no
        transition lost, at most a wake-up's waker or context."""
        return skipped_runs(fd for name, fd in self.named_prog_fds().items() if _is_note(name))

    def maps(self) -> dict[str, dict]:
        """Every map of the program: name -> fd, type, max_entries, flags and
        BCC's key/leaf descriptions (what bpfmaps.make_table needs)."""
        if self.cached is not None:
            return {m["name"]: {"fd": self.cached.map_fds[m["name"]], "type": m["type"],
                                "max_entries": m["max_entries"], "flags": m["flags"], "key_desc": m["key_desc"],
                                "leaf_desc": m["leaf_desc"]} for m in self.cached.maps}
        lib = sys.modules["bcc"].libbcc.lib
        progcache._bcc_lib_prototypes(lib)
        mod, out = self.bpf.module, {}
        for i in range(lib.bpf_num_tables(mod)):
            fd = lib.bpf_table_fd_id(mod, i)
            info = bpfsys.map_info(fd)
            out[lib.bpf_table_name(mod, i).decode()] = {
                "fd": fd, "type": info["type"], "max_entries": info["max_entries"], "flags": info["flags"],
                "key_desc": (lib.bpf_table_key_desc_id(mod, i) or b"").decode(),
                "leaf_desc": (lib.bpf_table_leaf_desc_id(mod, i) or b"").decode()}
        return out

    def take_links(self) -> dict[str, int]:
        """Make every attachment a BPF link, which can be pinned: target ->
        link fd, now the caller's (close() no longer detaches them). A
        tp_btf or raw tracepoint attachment is a link already; a classic
        tracepoint's perf event is detached first, then the same program
        linked to a new one (the gap is a few microseconds, before any row
        was seeded)."""
        links: dict[str, int] = {}
        if self.cached is not None:
            links.update(self.cached.raw_fds)
            self.cached.raw_fds = {}
            classic = {t: self.cached.prog_fds[f"tracepoint__{t.replace(':', '__')}"]
                       for t in list(self.cached.perf_fds)}
            detach = self.cached.detach_one
        else:
            if self.btf_progs is not None:
                links.update(self.btf_progs.link_fds)
                self.btf_progs.link_fds = {}
            raw = self.bpf.raw_tracepoint_fds  # taken out, so that bcc's cleanup leaves them open
            for tp in list(raw):
                links[tp.decode() if isinstance(tp, bytes) else tp] = raw.pop(tp)
            classic = {}
            for tp in list(self.bpf.tracepoint_fds):
                t = tp.decode() if isinstance(tp, bytes) else tp
                classic[t] = self.bpf.funcs[f"tracepoint__{t.replace(':', '__')}".encode()].fd
            detach = lambda t: self.bpf.detach_tracepoint(t.encode())  # noqa: E731
        for target, prog_fd in classic.items():
            detach(target)
            cat, _, event = target.partition(":")
            links[target] = pins.perf_link(prog_fd, self.tracefs, cat, event)
        return links

    def detach(self, settle_s: float = 0.5) -> None:
        """Stop the programs from running, keeping maps and ring buffer.

        After this the counters and the ring buffer no longer change, so a
        final drain and count add up exactly. Closing a tracepoint's perf
        event does not wait for a run already under way on another CPU, so
        wait (at most settle_s) until the counters stop moving.
        """
        if self._detach_programs():
            self.settle(settle_s)

    def settle(self, settle_s: float = 0.5) -> None:
        """Wait (at most settle_s) until the counters stop moving: after the
        programs were detached or told to stop, runs already under way on
        other CPUs finish."""
        deadline = time.monotonic() + settle_s
        last = self.counters()
        while time.monotonic() < deadline:
            time.sleep(0.01)
            now = self.counters()
            if now == last:
                break
            last = now

    def close(self) -> None:
        self._detach_programs()
        cached, self.cached = self.cached, None
        if cached is not None:
            cached.close()
        btf_progs, self.btf_progs = self.btf_progs, None
        if btf_progs is not None:
            btf_progs.close()
        bpf, self.bpf = self.bpf, None
        if bpf is not None:
            with contextlib.suppress(Exception):
                bpf.cleanup()

    def _detach_programs(self) -> bool:
        """Detach what is still attached, however it was loaded; False when
        nothing is loaded."""
        if self.cached is not None:
            _detach_all(self.cached.attached(), self.cached.detach_one)
        elif self.bpf is not None:
            if self.btf_progs is not None:
                self.btf_progs.detach()
            _detach_all(list(self.bpf.tracepoint_fds), self.bpf.detach_tracepoint)
        else:
            return False
        return True


def _is_note(name: str) -> bool:
    return name.endswith(NOTE_EVENTS)


def skipped_runs(prog_fds) -> int:
    """recursion_misses summed over programs (0 for one that cannot be read)."""
    total = 0
    for fd in prog_fds:
        try:
            total += bpfsys.prog_info(fd)["recursion_misses"]
        except OSError:
            pass
    return total


def percpu_sums(t) -> list[int]:
    """Each slot of a per-CPU array, summed over the CPUs."""
    return [int(sum(t[ctypes.c_int(i)])) for i in range(len(t))]


def pid_max() -> int:
    """The kernel's tid limit (every tid is below it): when it is small
    enough, record and snap index their per-thread rows by tid."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 22  # PID_MAX_LIMIT: assume any tid may come


def map_calls():
    """bpf_update_elem, bpf_lookup_elem, bpf_delete_elem... as in libbcc, on
    any map fd, without loading libbcc."""
    return bpfsys.lib


def _detach_all(targets: list, detach) -> None:
    """Detach every tracepoint from a thread of its own. Closing a
    tracepoint's perf event waits for RCU grace periods (tens of ms each);
    the close runs without the GIL, so the waits partly overlap instead of
    adding up to most of a second at every exit."""
    import threading

    def one(tp):
        with contextlib.suppress(Exception):
            detach(tp)

    threads = [threading.Thread(target=one, args=(tp,), daemon=True) for tp in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _trim_heap() -> None:
    """Give the compiler's freed memory back to the system (tens of MB)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class RingReader:
    """Drain a BPF ring buffer of fixed-size records in batches.

    BCC's ring buffer API calls back into Python once per record; at a
    million events a second that alone saturates a CPU. The ring buffer's
    memory is mmap-able, so this reads every committed record between the
    consumer and producer positions as one slice and decodes it with
    struct.iter_unpack, then advances the consumer position once.
    """

    HDR = 8

    @classmethod
    def stride_of(cls, record_size: int) -> int:
        """Bytes a record of record_size takes in the ring: header, record, padding to 8."""
        return (record_size + cls.HDR + 7) & ~7

    def __init__(self, map_fd: int, size: int, record_size: int):
        self.page = mmap.PAGESIZE
        self.size = size
        self.mask = size - 1
        self.rec = record_size
        self.stride = self.stride_of(record_size)
        self.cons = mmap.mmap(map_fd, self.page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        # producer page, then the data area mapped twice so records that wrap
        # around the end read contiguously.
        self.prod = mmap.mmap(map_fd, self.page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=self.page)
        self.view = memoryview(self.prod)
        self._cons_pos = ctypes.c_uint64.from_buffer(self.cons, 0)

    def available(self) -> int:
        prod_pos = struct.unpack_from("<Q", self.prod, 0)[0]
        return prod_pos - self._cons_pos.value

    def read(self, max_records: int | None = None) -> tuple[memoryview, int]:
        """A contiguous view of the next n stride-sized slots, and n.

        Each slot starts with the kernel's 8-byte header (length with the
        busy and discard bits); the caller decodes in order, stops at the
        first busy record, and commits the number it consumed.
        """
        cons_pos = self._cons_pos.value
        prod_pos = struct.unpack_from("<Q", self.prod, 0)[0]
        n = (prod_pos - cons_pos) // self.stride
        if max_records is not None:
            n = min(n, max_records)
        if n <= 0:
            return memoryview(b""), 0
        start = self.page + (cons_pos & self.mask)
        return self.view[start:start + n * self.stride], n

    def settle(self) -> None:
        """The producers have stopped (for the interface of
        pstate.kernel.slotrings.SlotRings: this reader holds nothing back)."""

    def skip(self) -> None:
        """Give up every record committed so far, unread: the consumer
        position moves to the producer's (records of any size)."""
        self._cons_pos.value = struct.unpack_from("<Q", self.prod, 0)[0]

    def commit(self, nrecords: int) -> None:
        if nrecords:
            # An aligned 8-byte store; the kernel reads it with smp_load_acquire.
            self._cons_pos.value = self._cons_pos.value + nrecords * self.stride

    def close(self) -> None:
        with contextlib.suppress(Exception):
            del self._cons_pos
            self.view.release()
            self.cons.close()
            self.prod.close()


def proc_threads(proc: str = "/proc") -> Iterable[tuple[int, int]]:
    """(tgid, tid) of every thread alive now, from proc's <pid>/task
    directories; a process that ends while it is listed is left out."""
    try:
        pids = [int(d.name) for d in os.scandir(proc) if d.name.isdigit()]
    except OSError:
        return
    for tgid in pids:
        try:
            tids = os.listdir(f"{proc}/{tgid}/task")
        except OSError:
            continue
        for t in tids:
            if t.isdigit():
                yield tgid, int(t)


def seed_tasks() -> Iterable[tuple[int, int, str, bytes, int]]:
    """(tgid, tid, state letter, comm, start time in clock ticks since boot) of
    every thread alive now, from /proc/<pid>/task/<tid>/stat."""
    for tgid, t in proc_threads():
        try:
            with open(f"/proc/{tgid}/task/{t}/stat", "rb") as f:
                data = f.read()
            # comm may hold ')' and spaces: the fields follow its last ')'
            close = data.rindex(b")")
            comm = data[data.index(b"(") + 1:close]
            fields = data[close + 2:].split()
            # fields[0] is field 3 (state); starttime is field 22
            yield tgid, t, chr(fields[0][0]), comm[:15], int(fields[19])
        except (OSError, ValueError, IndexError):
            continue

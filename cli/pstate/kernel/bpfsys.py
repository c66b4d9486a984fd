"""The bpf(2) and perf_event_open(2) calls pstate needs to load a program it
compiled before, without BCC: create maps, load programs, attach them to
tracepoints, and the map element calls (with libbcc's signatures). The map
classes over them are pstate.kernel.bpfmaps. Nothing here loads libbcc (and
with it LLVM).
"""

from __future__ import annotations

import ctypes as ct
import errno
import fcntl
import os
import struct

# syscall numbers per architecture: (bpf, perf_event_open)
_SYSCALLS = {
    "x86_64": (321, 298), "aarch64": (280, 241), "riscv64": (280, 241), "loongarch64": (280, 241),
    "ppc64le": (361, 319), "ppc64": (361, 319), "s390x": (351, 331), "i686": (357, 336), "armv7l": (386, 364),
}

# bpf(2) commands
MAP_CREATE, MAP_LOOKUP_ELEM, MAP_UPDATE_ELEM, MAP_DELETE_ELEM, MAP_GET_NEXT_KEY, PROG_LOAD = 0, 1, 2, 3, 4, 5
OBJ_GET_INFO_BY_FD, RAW_TRACEPOINT_OPEN = 15, 17
MAP_LOOKUP_BATCH, MAP_LOOKUP_AND_DELETE_BATCH, MAP_UPDATE_BATCH, MAP_DELETE_BATCH = 24, 25, 26, 27

# flags of map updates
BPF_ANY, BPF_NOEXIST, BPF_EXIST = 0, 1, 2

# map types (those whose user-space side pstate implements: bpfmaps.CLASSES)
MAP_HASH, MAP_ARRAY, MAP_PERCPU_HASH, MAP_PERCPU_ARRAY = 1, 2, 5, 6
MAP_STACK_TRACE, MAP_LRU_HASH, MAP_LRU_PERCPU_HASH, MAP_RINGBUF = 7, 9, 10, 27

# A stack-trace map (BCC's BPF_STACK_TRACE): a u32 stack id -> PERF_MAX_STACK_DEPTH
# u64 addresses, zero after the last frame; with BPF_F_STACK_BUILD_ID (BCC's
# BPF_STACK_TRACE_BUILDID) each frame is a struct bpf_stack_build_id instead
# (status, build id, offset or ip: 32 bytes). The flags the kernel accepts
# for one: BPF_F_NUMA_NODE, BPF_F_RDONLY, BPF_F_WRONLY, BPF_F_STACK_BUILD_ID.
STACK_MAX_DEPTH = 127
STACK_KEY_SIZE = 4
STACK_BUILD_ID_SIZE = 32
BPF_F_NUMA_NODE, BPF_F_RDONLY, BPF_F_WRONLY, BPF_F_STACK_BUILD_ID = 1 << 2, 1 << 3, 1 << 4, 1 << 5
STACK_MAP_FLAGS = BPF_F_NUMA_NODE | BPF_F_RDONLY | BPF_F_WRONLY | BPF_F_STACK_BUILD_ID

PROG_TRACEPOINT, PROG_RAW_TRACEPOINT, PROG_TRACING = 5, 17, 26
TRACE_RAW_TP = 23  # expected attach type of a BTF-typed raw tracepoint (tp_btf) program

# ld_imm64 and the source-register marker that makes its immediate a map fd
LD_IMM64 = 0x18
PSEUDO_MAP_FD = 1

PERF_TYPE_TRACEPOINT = 2
PERF_FLAG_FD_CLOEXEC = 8
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_DISABLE = 0x2401
PERF_EVENT_IOC_SET_BPF = 0x40042408

ENOTSUPP = 524  # the kernel's own errno for an operation a map lacks

_ATTR_SIZE = 128  # bytes of union bpf_attr passed; the kernel wants the unknown tail zero


class BpfError(OSError):
    pass


_libc = None


def supported() -> bool:
    return os.uname().machine in _SYSCALLS


def _syscall():
    global _libc
    if _libc is None:
        _libc = ct.CDLL(None, use_errno=True)
        _libc.syscall.restype = ct.c_long
    return _libc.syscall


def _nr(which: int) -> int:
    try:
        return _SYSCALLS[os.uname().machine][which]
    except KeyError:
        raise BpfError(errno.ENOSYS, f"no bpf syscall numbers for {os.uname().machine}") from None


def bpf(cmd: int, attr: ct.Array) -> int:
    """bpf(cmd, attr); the result, or -1 with ctypes' errno set."""
    return _syscall()(ct.c_long(_nr(0)), ct.c_int(cmd), attr, ct.c_uint(ct.sizeof(attr)))


def _attr(fmt: str, *values) -> ct.Array:
    buf = ct.create_string_buffer(_ATTR_SIZE)
    struct.pack_into(fmt, buf, 0, *values)
    return buf


def _check(res: int, what: str) -> int:
    if res < 0:
        err = ct.get_errno()
        raise BpfError(err, f"{what}: {os.strerror(err)}")
    return res


def _addr(p) -> int:
    """The address behind a ctypes object, a byref() or a plain int (None = NULL)."""
    if p is None:
        return 0
    if isinstance(p, int):
        return p
    return ct.cast(p, ct.c_void_p).value or 0


def _name16(name: str) -> bytes:
    # the kernel accepts [A-Za-z0-9_.] in object names, at most 15 of them
    clean = "".join(c if c.isalnum() or c in "_." else "_" for c in name)
    return clean.encode()[:15]


# --- objects ---------------------------------------------------------------

def map_create(map_type: int, key_size: int, value_size: int, max_entries: int, flags: int, name: str) -> int:
    attr = _attr("<IIIIIII16s", map_type, key_size, value_size, max_entries, flags, 0, 0, _name16(name))
    return _check(bpf(MAP_CREATE, attr), f"creating map {name}")


def map_info(fd: int) -> dict:
    """type, key_size, value_size, max_entries, flags and name of a map fd."""
    info = ct.create_string_buffer(88)
    attr = _attr("<IIQ", fd, len(info), ct.addressof(info))
    _check(bpf(OBJ_GET_INFO_BY_FD, attr), "reading map info")
    mtype, _id, ksz, vsz, maxe, flags, name = struct.unpack_from("<IIIIII16s", info, 0)
    return {"type": mtype, "key_size": ksz, "value_size": vsz, "max_entries": maxe, "flags": flags,
            "name": name.split(b"\0", 1)[0].decode(errors="replace")}


# struct bpf_prog_info (linux/bpf.h): the offsets of the fields read here
_PROG_INFO_SIZE = 232
_PROG_INFO_FIELDS = {"type": (0, "I"), "id": (4, "I"), "name": (64, "16s"), "run_time_ns": (192, "Q"),
                     "run_cnt": (200, "Q"), "recursion_misses": (208, "Q")}


def prog_info(fd: int) -> dict:
    """type, id, name, run_time_ns, run_cnt and recursion_misses of a program fd.

    recursion_misses counts the runs the kernel skipped: a classic
    tracepoint's program while any BPF program, or a bpf(2) map call, was
    under way on its CPU (the kernel's bpf_prog_active; Linux 6.7 on), a
    tp_btf or raw tracepoint program while the same program was (Linux
    5.12 on). A kernel older than a field leaves it 0."""
    info = ct.create_string_buffer(_PROG_INFO_SIZE)
    attr = _attr("<IIQ", fd, len(info), ct.addressof(info))
    _check(bpf(OBJ_GET_INFO_BY_FD, attr), "reading program info")
    out = {k: struct.unpack_from("<" + f, info, off)[0] for k, (off, f) in _PROG_INFO_FIELDS.items()}
    out["name"] = out["name"].split(b"\0", 1)[0].decode(errors="replace")
    return out


def prog_load(prog_type: int, insns: bytes, license: str, kern_version: int, name: str,
              log_size: int = 0, attach_btf_id: int = 0) -> tuple[int, str]:
    """Load instructions; (fd or -errno, verifier log when log_size was given).
    With attach_btf_id the program is a tp_btf program (PROG_TRACING,
    TRACE_RAW_TP) for the tracepoint whose btf_trace_<name> typedef that is."""
    ibuf = ct.create_string_buffer(insns, len(insns))
    lic = ct.create_string_buffer(license.encode())
    log = ct.create_string_buffer(log_size) if log_size else None
    attr = _attr("<IIQQIIQII16s", prog_type, len(insns) // 8, ct.addressof(ibuf), ct.addressof(lic),
                 1 if log else 0, log_size, ct.addressof(log) if log else 0, kern_version, 0, _name16(name))
    if attach_btf_id:
        struct.pack_into("<I", attr, 68, TRACE_RAW_TP)  # expected_attach_type
        struct.pack_into("<I", attr, 108, attach_btf_id)
    fd = bpf(PROG_LOAD, attr)
    if fd < 0:
        fd = -ct.get_errno()
    return fd, (log.value.decode(errors="replace") if log else "")


def tracepoint_id(tracefs: str, category: str, event: str) -> int:
    with open(os.path.join(tracefs, "events", category, event, "id")) as f:
        return int(f.read())


class _PerfEventAttr(ct.Structure):
    _fields_ = [("type", ct.c_uint32), ("size", ct.c_uint32), ("config", ct.c_uint64),
                ("sample_period", ct.c_uint64), ("sample_type", ct.c_uint64), ("read_format", ct.c_uint64),
                ("flags", ct.c_uint64), ("wakeup_events", ct.c_uint32), ("bp_type", ct.c_uint32),
                ("config1", ct.c_uint64), ("config2", ct.c_uint64), ("branch_sample_type", ct.c_uint64),
                ("sample_regs_user", ct.c_uint64), ("sample_stack_user", ct.c_uint32),
                ("clockid", ct.c_int32), ("sample_regs_intr", ct.c_uint64), ("aux_watermark", ct.c_uint32),
                ("sample_max_stack", ct.c_uint16), ("reserved2", ct.c_uint16)]


def attach_tracepoint(prog_fd: int, tracefs: str, category: str, event: str) -> int:
    """A perf event on the tracepoint running prog_fd (what BCC does); its fd."""
    attr = _PerfEventAttr(type=PERF_TYPE_TRACEPOINT, size=ct.sizeof(_PerfEventAttr),
                          config=tracepoint_id(tracefs, category, event), sample_period=1, wakeup_events=1)
    fd = _syscall()(ct.c_long(_nr(1)), ct.byref(attr), ct.c_int(-1), ct.c_int(0), ct.c_int(-1),
                    ct.c_ulong(PERF_FLAG_FD_CLOEXEC))
    _check(fd, f"perf_event_open on {category}:{event}")
    try:
        fcntl.ioctl(fd, PERF_EVENT_IOC_SET_BPF, prog_fd)
        fcntl.ioctl(fd, PERF_EVENT_IOC_ENABLE, 0)
    except OSError:
        os.close(fd)
        raise
    return fd


def attach_raw_tracepoint(prog_fd: int, event: str | None) -> int:
    """Attach a raw tracepoint program to event, or a tp_btf program (event
    None) to the tracepoint it was loaded for; the fd whose close detaches it."""
    name = ct.create_string_buffer(event.encode()) if event else None
    attr = _attr("<QI", ct.addressof(name) if name else 0, prog_fd)
    return _check(bpf(RAW_TRACEPOINT_OPEN, attr), f"attaching raw tracepoint {event or 'of a tp_btf program'}")


def close_perf_event(fd: int) -> None:
    try:
        fcntl.ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
    except OSError:
        pass
    os.close(fd)


# --- map element calls, with the signatures of libbcc's -------------------
# Each returns 0 (or a count) on success and -errno on failure, with ctypes'
# errno set, so code written against bcc.libbcc.lib runs unchanged.

def _elem(cmd: int, fd: int, key, value, flags: int) -> int:
    attr = _attr("<IIQQQ", fd, 0, _addr(key), _addr(value), flags)
    res = bpf(cmd, attr)
    return -ct.get_errno() if res < 0 else res


def _batch(cmd: int, fd: int, in_batch, out_batch, keys, values, count) -> int:
    cnt = ct.cast(count, ct.POINTER(ct.c_uint32))
    attr = _attr("<QQQQIIQQ", _addr(in_batch), _addr(out_batch), _addr(keys), _addr(values),
                 cnt.contents.value, fd, 0, 0)
    res = bpf(cmd, attr)
    err = ct.get_errno()
    cnt.contents.value = struct.unpack_from("<I", attr, 32)[0]
    ct.set_errno(err)
    return -err if res < 0 else res


class MapCalls:
    """A drop-in for the map calls of bcc.libbcc.lib."""

    @staticmethod
    def bpf_lookup_elem(fd, key, value):
        return _elem(MAP_LOOKUP_ELEM, fd, key, value, 0)

    @staticmethod
    def bpf_update_elem(fd, key, value, flags):
        return _elem(MAP_UPDATE_ELEM, fd, key, value, flags)

    @staticmethod
    def bpf_delete_elem(fd, key):
        return _elem(MAP_DELETE_ELEM, fd, key, None, 0)

    @staticmethod
    def bpf_get_next_key(fd, key, next_key):
        return _elem(MAP_GET_NEXT_KEY, fd, key, next_key, 0)

    @staticmethod
    def bpf_get_first_key(fd, key, key_size=None):
        return _elem(MAP_GET_NEXT_KEY, fd, None, key, 0)

    @staticmethod
    def bpf_lookup_batch(fd, in_batch, out_batch, keys, values, count):
        return _batch(MAP_LOOKUP_BATCH, fd, in_batch, out_batch, keys, values, count)

    @staticmethod
    def bpf_lookup_and_delete_batch(fd, in_batch, out_batch, keys, values, count):
        return _batch(MAP_LOOKUP_AND_DELETE_BATCH, fd, in_batch, out_batch, keys, values, count)

    @staticmethod
    def bpf_update_batch(fd, keys, values, count):
        return _batch(MAP_UPDATE_BATCH, fd, None, None, keys, values, count)

    @staticmethod
    def bpf_delete_batch(fd, keys, count):
        return _batch(MAP_DELETE_BATCH, fd, None, None, keys, None, count)


lib = MapCalls()


def possible_cpus() -> int:
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            text = f.read().strip()
    except OSError:
        return os.cpu_count() or 1
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n

"""The bpf(2) and perf_event_open(2) calls pstate needs to load a program it
compiled before, without BCC: create maps, load programs, attach them to
tracepoints, and read and write maps.

The map classes mirror the subset of BCC's table API pstate uses (a
MutableMapping of ctypes keys and leaves, map_fd, Key/Leaf, the batch
operations), so the rest of pstate sees the same objects whichever way a
program was loaded. Nothing here loads libbcc (and with it LLVM).
"""

from __future__ import annotations

import ctypes as ct
import errno
import fcntl
import json
import os
import struct
from collections.abc import MutableMapping
from functools import reduce

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

# map types whose user-space side this module implements
MAP_HASH, MAP_ARRAY, MAP_PERCPU_HASH, MAP_PERCPU_ARRAY = 1, 2, 5, 6
MAP_STACK_TRACE, MAP_LRU_HASH, MAP_LRU_PERCPU_HASH, MAP_RINGBUF = 7, 9, 10, 27
SUPPORTED_MAP_TYPES = frozenset({MAP_HASH, MAP_ARRAY, MAP_PERCPU_HASH, MAP_PERCPU_ARRAY, MAP_STACK_TRACE,
                                 MAP_LRU_HASH, MAP_LRU_PERCPU_HASH, MAP_RINGBUF})

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


# --- key/leaf types from BCC's JSON descriptions -----------------------------

_SCALARS = {
    "_Bool": ct.c_bool, "char": ct.c_char, "signed char": ct.c_byte, "wchar_t": ct.c_wchar,
    "unsigned char": ct.c_ubyte, "short": ct.c_short, "unsigned short": ct.c_ushort, "int": ct.c_int,
    "unsigned int": ct.c_uint, "long": ct.c_long, "unsigned long": ct.c_ulong, "long long": ct.c_longlong,
    "unsigned long long": ct.c_ulonglong, "float": ct.c_float, "double": ct.c_double,
    "long double": ct.c_longdouble, "__int128": ct.c_int64 * 2, "unsigned __int128": ct.c_uint64 * 2,
}


def decode_type(desc):
    """The ctypes type BCC builds for a key or leaf description (a scalar
    name, or [name, [[field, type(, [n] | bits | kind)]...], kind])."""
    if isinstance(desc, str):
        return _SCALARS[desc]
    fields, anon = [], []
    for f in desc[1]:
        if len(f) == 2:
            fields.append((f[0], decode_type(f[1])))
        elif len(f) == 3 and isinstance(f[2], list):
            fields.append((f[0], decode_type(f[1]) * f[2][0]))
        elif len(f) == 3 and isinstance(f[2], int):
            fields.append((f[0], decode_type(f[1]), f[2]))
        elif len(f) == 3 and f[2] in ("struct", "union", "struct_packed"):
            name = f[0] or f"__anon{len(anon)}"
            if not f[0]:
                anon.append(name)
            fields.append((name, decode_type(f)))
        else:
            raise ValueError(f"cannot decode type {f!r}")
    kind = desc[2] if len(desc) > 2 else "struct"
    base = ct.Union if kind == "union" else ct.Structure
    ns = {"_anonymous_": anon, "_fields_": fields}
    if kind == "struct_packed":
        ns["_pack_"] = 1
    return type(str(desc[0]), (base,), ns)


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


# --- tables ------------------------------------------------------------------

# copies of a value written meanwhile before the last is taken as it is (one
# program's write takes well under a microsecond, a copy about as long)
COPY_TRIES = 8


def settle(copy, first: bytes | None = None) -> bytes | None:
    """A value the programs write in place (a map's rows, which no lock
    keeps whole while user space copies one), copied by copy() until two
    copies in a row agree: a copy taken across a write mixes the row before
    and the row after. copy() gives the value's bytes, or None once the
    entry is gone (then so does this); `first`, a copy already taken."""
    row = copy() if first is None else first
    for _ in range(COPY_TRIES):
        if row is None:
            return None
        again = copy()
        if again == row:
            return row
        row = again
    return row


class Table(MutableMapping):
    """A hash map: ctypes Key -> Leaf. Errors as BCC's: KeyError when absent,
    Exception when an update fails."""

    def __init__(self, map_fd: int, name: str, key_type, leaf_type, map_type: int, max_entries: int,
                 flags: int = 0):
        self.map_fd = map_fd
        self.name = self._name = name
        self.Key = key_type
        self.Leaf = leaf_type
        self.ttype = map_type
        self.max_entries = max_entries
        self.flags = flags

    @classmethod
    def over(cls, table) -> "Table":
        """A Table on another table object's map (BCC's, say): the same fd,
        key and leaf types, so that every map is read through this class."""
        if isinstance(table, Table):
            return table
        info = map_info(table.map_fd)
        return cls(table.map_fd, getattr(table, "name", ""), table.Key, table.Leaf, info["type"],
                   info["max_entries"], info["flags"])

    def get_fd(self):
        return self.map_fd

    def insert(self, key, leaf) -> int:
        """Add key only where it is absent (BPF_NOEXIST): 0, or the errno
        (EEXIST when it is there)."""
        if lib.bpf_update_elem(self.map_fd, ct.byref(key), ct.byref(leaf), BPF_NOEXIST) == 0:
            return 0
        return ct.get_errno()

    def remove(self, key) -> bool:
        """Delete key; whether it was there (a delete that succeeds is a claim on it)."""
        return lib.bpf_delete_elem(self.map_fd, ct.byref(key)) == 0

    def read_all(self, delete: bool = False, chunk: int = 1024) -> list:
        """(key, leaf) of every entry (deleting them if `delete`), read in
        batches of `chunk`: buffers for the whole map at every call would be
        megabytes for a mostly empty one. Kernels without batch operations
        (before 5.6) are read key by key."""
        Key, Leaf = self.Key, self.Leaf
        batches = self._batches(delete, chunk)
        if batches is None:
            return self._read_slowly(delete)
        return [(Key.from_buffer_copy(k), Leaf.from_buffer_copy(v)) for k, v in batches]

    def _batches(self, delete: bool, chunk: int):
        """The (key bytes, value bytes) of every entry, read in batches; None
        where the kernel has no batch operations."""
        call = lib.bpf_lookup_and_delete_batch if delete else lib.bpf_lookup_batch
        ksz, vsz = ct.sizeof(self.Key), ct.sizeof(self.Leaf)
        keys, values = (self.Key * chunk)(), (self.Leaf * chunk)()
        kview, vview = memoryview(keys).cast("B"), memoryview(values).cast("B")
        # the resume token is a bucket number for hash maps, a key for arrays
        token, cnt, out = ct.create_string_buffer(max(ksz, 8)), ct.c_uint32(0), []
        first = True
        while True:
            cnt.value = chunk
            res = call(self.map_fd, None if first else ct.byref(token), ct.byref(token), ct.byref(keys),
                       ct.byref(values), ct.byref(cnt))
            err = ct.get_errno()
            if res != 0 and err != errno.ENOENT:
                if first and err in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP):
                    return None
                raise BpfError(err, f"BPF_MAP_LOOKUP{'_AND_DELETE' if delete else ''}_BATCH: {os.strerror(err)}")
            first = False
            out += [(kview[i * ksz:(i + 1) * ksz].tobytes(), vview[i * vsz:(i + 1) * vsz].tobytes())
                    for i in range(cnt.value)]
            if res != 0 or cnt.value == 0:
                return out

    def read_settled(self) -> list:
        """(key, leaf) of every entry of a map whose programs write rows in
        place (read_all, whose copies a concurrent write can tear): read
        twice, and a row whose two copies differ is looked up alone until
        two copies agree (settle). A row gone by the second read is left
        out: deleted meanwhile."""
        first = self._batches(False, 1024)
        second = self._batches(False, 1024) if first is not None else None
        if second is None:  # (no batch operations: key by key)
            first = [(bytes(k), bytes(v)) for k, v in self.read_all()]
            second = [(bytes(k), bytes(v)) for k, v in self.read_all()]
        before = dict(first)
        Key, Leaf, out = self.Key, self.Leaf, []
        for kraw, raw in second:
            key = Key.from_buffer_copy(kraw)
            if before.get(kraw) != raw:
                raw = settle(lambda: self.copy(key), raw)
                if raw is None:
                    continue
            out.append((key, Leaf.from_buffer_copy(raw)))
        return out

    def copy(self, key) -> bytes | None:
        """The bytes of key's value, or None when it is absent."""
        leaf = self.Leaf()
        if lib.bpf_lookup_elem(self.map_fd, ct.byref(key), ct.byref(leaf)) < 0:
            return None
        return bytes(leaf)

    def _read_slowly(self, delete: bool) -> list:
        items = self.items()
        if delete:
            for k, _v in items:
                self.remove(k)
        return items

    def __getitem__(self, key):
        leaf = self.Leaf()
        if lib.bpf_lookup_elem(self.map_fd, ct.byref(key), ct.byref(leaf)) < 0:
            raise KeyError(key)
        return leaf

    def __setitem__(self, key, leaf):
        if lib.bpf_update_elem(self.map_fd, ct.byref(key), ct.byref(leaf), 0) < 0:
            raise Exception(f"Could not update table: {os.strerror(ct.get_errno())}")

    def __delitem__(self, key):
        if lib.bpf_delete_elem(self.map_fd, ct.byref(key)) < 0:
            raise KeyError(key)

    def __iter__(self):
        key = None
        while True:
            nxt = self.Key()
            if key is None:
                res = lib.bpf_get_first_key(self.map_fd, ct.byref(nxt))
            else:
                res = lib.bpf_get_next_key(self.map_fd, ct.byref(key), ct.byref(nxt))
            if res < 0:
                return
            yield nxt
            key = nxt

    def __len__(self):
        return sum(1 for _ in self)

    def keys(self):
        return iter(self)

    def itervalues(self):
        for key in self:
            try:
                yield self[key]
            except KeyError:  # deleted since its key was read
                pass

    def iteritems(self):
        for key in self:
            try:
                yield key, self[key]
            except KeyError:
                pass

    def items(self):
        return list(self.iteritems())

    def values(self):
        return list(self.itervalues())

    def clear(self):
        for k in list(self.keys()):
            try:
                del self[k]
            except KeyError:
                pass

    def zero(self):
        for k in list(self.keys()):
            self[k] = self.Leaf()

    def items_lookup_batch(self):
        yield from self._batch_items(delete=False)

    def items_lookup_and_delete_batch(self):
        yield from self._batch_items(delete=True)

    def items_delete_batch(self, ct_keys=None):
        if ct_keys is None:
            for _ in self.items_lookup_and_delete_batch():
                pass
            return
        cnt = ct.c_uint32(len(ct_keys))
        if lib.bpf_delete_batch(self.map_fd, ct.byref(ct_keys), ct.byref(cnt)) != 0:
            raise Exception(f"BPF_MAP_DELETE_BATCH has failed: {os.strerror(ct.get_errno())}")

    def items_update_batch(self, ct_keys, ct_values):
        if len(ct_keys) != len(ct_values):
            raise ValueError("keys array length != values array length")
        cnt = ct.c_uint32(len(ct_keys))
        if lib.bpf_update_batch(self.map_fd, ct.byref(ct_keys), ct.byref(ct_values), ct.byref(cnt)) != 0:
            raise Exception(f"BPF_MAP_UPDATE_BATCH has failed: {os.strerror(ct.get_errno())}")

    def _batch_items(self, delete: bool):
        yield from self.read_all(delete)


class ArrayTable(Table):
    """An array map: keys 0..max_entries-1 always exist; deleting zeroes."""

    def _normalize_key(self, key):
        if isinstance(key, int):
            key = self.Key(key + len(self) if key < 0 else key)
        if not isinstance(key, ct._SimpleCData):
            raise IndexError("Array index must be an integer type")
        if key.value >= len(self):
            raise IndexError("Array index out of range")
        return key

    def __len__(self):
        return self.max_entries

    def __getitem__(self, key):
        return super().__getitem__(self._normalize_key(key))

    def __setitem__(self, key, leaf):
        super().__setitem__(self._normalize_key(key), leaf)

    def __delitem__(self, key):
        self.clearitem(key)

    def clearitem(self, key):
        super().__setitem__(self._normalize_key(key), self.Leaf())

    def __iter__(self):
        return (self.Key(i) for i in range(len(self)))


class _PerCpu:
    """Per-CPU leaves: one value per possible CPU, each padded to 8 bytes."""

    def _per_cpu(self, reducer=None):
        self.reducer = reducer
        self.sLeaf = self.Leaf
        self.total_cpu = possible_cpus()
        self.alignment = ct.sizeof(self.sLeaf) % 8
        if self.alignment == 0:
            self.Leaf = self.sLeaf * self.total_cpu
        elif self.sLeaf == ct.c_uint:
            self.Leaf = ct.c_uint64 * self.total_cpu
        elif self.sLeaf == ct.c_int:
            self.Leaf = ct.c_int64 * self.total_cpu
        else:
            raise IndexError("Leaf must be aligned to 8 bytes")

    def getvalue(self, key):
        result = Table.__getitem__(self, self._key(key))
        if self.alignment == 0:
            return result
        ret = (self.sLeaf * self.total_cpu)()
        for i in range(self.total_cpu):
            ret[i] = result[i]
        return ret

    def __getitem__(self, key):
        vals = self.getvalue(key)
        return reduce(self.reducer, vals) if self.reducer else vals

    def sum(self, key):
        if isinstance(self.Leaf(), ct.Structure):
            raise IndexError("Leaf must be an integer type for default sum functions")
        return self.sLeaf(sum(self.getvalue(key)))

    def max(self, key):
        if isinstance(self.Leaf(), ct.Structure):
            raise IndexError("Leaf must be an integer type for default max functions")
        return self.sLeaf(max(self.getvalue(key)))

    def average(self, key):
        return self.sum(key).value / self.total_cpu


class PerCpuTable(_PerCpu, Table):
    def __init__(self, *args, reducer=None, **kwargs):
        Table.__init__(self, *args, **kwargs)
        self._per_cpu(reducer)

    def _key(self, key):
        return key


class PerCpuArrayTable(_PerCpu, ArrayTable):
    def __init__(self, *args, reducer=None, **kwargs):
        ArrayTable.__init__(self, *args, **kwargs)
        self._per_cpu(reducer)

    def _key(self, key):
        return self._normalize_key(key)


class RingBufTable(Table):
    """A ring buffer: only its fd is of use (pstate mmaps it directly)."""

    def __len__(self):
        return 0

    def __iter__(self):
        return iter(())

    def open_ring_buffer(self, *args, **kwargs):
        raise NotImplementedError("read this ring buffer through its map_fd (pstate.kernel.loader.RingReader)")


class StackTraceTable(Table):
    """A stack-trace map, as BCC's StackTrace: Key a c_int stack id, Leaf
    BCC's struct bpf_stacktrace (ip: STACK_MAX_DEPTH u64 addresses).
    walk(stack_id) gives a stack's addresses, leaf first, up to the first
    zero; `del t[t.Key(id)]` frees a stack id (KeyError when it is not in
    use), so that the kernel can give it to another stack. User space cannot
    write one (the kernel refuses updates: an Exception, as BCC's), and, as
    in BCC, clear() does nothing: stack ids are freed one by one, by whoever
    read them."""

    MAX_DEPTH = STACK_MAX_DEPTH
    BPF_F_STACK_BUILD_ID = BPF_F_STACK_BUILD_ID
    BPF_STACK_BUILD_ID_EMPTY, BPF_STACK_BUILD_ID_VALID, BPF_STACK_BUILD_ID_IP = 0, 1, 2

    def walk(self, stack_id: int, resolve=None):
        """The addresses of a stack (resolve(addr) of each, if given), leaf
        first; KeyError when the id holds no stack. A build-id stack gives
        its struct bpf_stack_build_id entries, up to the first that is no
        valid build id, as BCC's walk does."""
        leaf = self[self.Key(stack_id)]
        build_id = self.flags & BPF_F_STACK_BUILD_ID
        frames = leaf.trace if build_id else leaf.ip
        out = []
        for addr in frames[:self.MAX_DEPTH]:
            if build_id:
                if addr.status in (self.BPF_STACK_BUILD_ID_IP, self.BPF_STACK_BUILD_ID_EMPTY):
                    break
            elif addr == 0:
                break
            out.append(resolve(addr) if resolve else addr)
        return iter(out)

    def clear(self):
        pass


def make_table(map_fd: int, name: str, key_desc: str, leaf_desc: str, map_type: int, max_entries: int,
               flags: int = 0):
    """The table object for a map, from BCC's JSON key/leaf descriptions."""
    key = decode_type(json.loads(key_desc))
    leaf = decode_type(json.loads(leaf_desc))
    cls = {MAP_HASH: Table, MAP_LRU_HASH: Table, MAP_ARRAY: ArrayTable, MAP_PERCPU_HASH: PerCpuTable,
           MAP_LRU_PERCPU_HASH: PerCpuTable, MAP_PERCPU_ARRAY: PerCpuArrayTable, MAP_RINGBUF: RingBufTable,
           MAP_STACK_TRACE: StackTraceTable}
    try:
        return cls[map_type](map_fd, name, key, leaf, map_type, max_entries, flags)
    except KeyError:
        raise ValueError(f"map type {map_type} is not supported") from None

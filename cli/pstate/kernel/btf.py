"""A small reader of the kernel's BTF (/sys/kernel/btf/vmlinux): the type
information the running kernel was built with.

pstate compiles its BPF against whatever header tree is installed, which
need not be this kernel's; the offsets of the task_struct fields its tp_btf
programs read therefore come from here, never from headers. The format
(Documentation/bpf/btf.rst) is a header, a type section and a string
section; types are numbered from 1 in the order they appear.

Only what pstate needs is decoded: finding a named type, the byte offset
and size of a member (through typedefs, modifiers and anonymous structs and
unions), and the arguments of a BTF-typed tracepoint (`btf_trace_<name>`).
"""

from __future__ import annotations

import hashlib
import os
import struct

VMLINUX = "/sys/kernel/btf/vmlinux"
MAGIC = 0xEB9F

# kinds (BTF_KIND_*)
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(12, 20)

_MODIFIERS = frozenset({TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG})
_SIZED = frozenset({INT, STRUCT, UNION, ENUM, FLOAT, ENUM64})


class BtfError(ValueError):
    """The BTF is missing, malformed, or lacks what was asked for."""


def _extra(kind: int, vlen: int) -> int:
    """Bytes that follow the 12-byte btf_type of a kind."""
    if kind in (INT, VAR, DECL_TAG):
        return 4
    if kind == ARRAY:
        return 12
    if kind in (STRUCT, UNION, DATASEC, ENUM64):
        return 12 * vlen
    if kind in (ENUM, FUNC_PROTO):
        return 8 * vlen
    if kind in (PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG):
        return 0
    raise BtfError(f"unknown BTF kind {kind}")


class Btf:
    """The types of one BTF blob (split BTF of modules is not read)."""

    def __init__(self, data: bytes):
        if len(data) < 24:
            raise BtfError("BTF data is too short")
        magic, version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != MAGIC or version != 1:
            raise BtfError(f"not BTF (magic {magic:#x}, version {version})")
        if not 24 <= hdr_len <= len(data):
            raise BtfError(f"BTF header length {hdr_len} is wrong")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        self.data = data
        self._types = hdr_len + type_off
        self._strs = hdr_len + str_off
        self._str_end = self._strs + str_len
        if self._types + type_len > len(data) or self._str_end > len(data):
            raise BtfError("BTF sections run past the end of the data")
        if type_off % 4 or type_len % 4 or (hdr_len + type_off) % 4:
            raise BtfError("the BTF type section is not aligned")
        self._at = self._walk(type_len)

    @classmethod
    def read(cls, path: str = VMLINUX) -> "Btf":
        try:
            with open(path, "rb") as f:
                return cls(f.read())
        except OSError as e:
            raise BtfError(f"{path}: {e.strerror}") from None

    def _walk(self, type_len: int) -> list[int]:
        """Where each type's btf_type starts (a byte offset into data), by id;
        id 0 is void. One pass over 32-bit words: the kernel's BTF has over
        100 000 types, and this runs before every compile."""
        words = memoryview(self.data)[self._types:self._types + type_len].cast("I")
        fixed = {k: _extra(k, 0) // 4 for k in range(1, 20)}
        per = {k: (_extra(k, 1) - _extra(k, 0)) // 4 for k in range(1, 20)}
        at, i, n, base = [0], 0, len(words), self._types
        while i < n:
            at.append(base + 4 * i)
            info = words[i + 1]
            kind = (info >> 24) & 0x1F
            if kind not in fixed:
                raise BtfError(f"unknown BTF kind {kind}")
            i += 3 + fixed[kind] + per[kind] * (info & 0xFFFF)
        if i != n:
            raise BtfError("the type section does not end on a type")
        return at

    def __len__(self) -> int:
        return len(self._at) - 1

    # --- types ---------------------------------------------------------------

    def name_at(self, off: int) -> str:
        start = self._strs + off
        return self.data[start:self.data.index(b"\0", start)].decode()

    def kind(self, tid: int) -> int:
        return (self._info(tid) >> 24) & 0x1F

    def _info(self, tid: int) -> int:
        return struct.unpack_from("<I", self.data, self._at[tid] + 4)[0]

    def _type(self, tid: int) -> tuple[str, int, int, bool, int]:
        """(name, kind, vlen, kind_flag, size or referenced type id) of a type."""
        if not 0 < tid < len(self._at):
            raise BtfError(f"no BTF type {tid}")
        name_off, info, size_type = struct.unpack_from("<III", self.data, self._at[tid])
        return self.name_at(name_off), (info >> 24) & 0x1F, info & 0xFFFF, bool(info >> 31), size_type

    def find(self, name: str, kind: int) -> int:
        """The id of the first type of that name and kind; BtfError when there is none."""
        offs = self._string_offsets(name)
        if offs:
            base = self._types
            words = memoryview(self.data)[base:self._at[-1] + 12].cast("I")
            for tid in range(1, len(self._at)):
                w = (self._at[tid] - base) >> 2
                if words[w] in offs and (words[w + 1] >> 24) & 0x1F == kind:
                    return tid
        raise BtfError(f"this kernel's BTF has no {_KIND_NAMES.get(kind, kind)} {name!r}")

    def enum_value(self, name: str) -> int:
        """The value of an enumerator (of a named or anonymous enum); BtfError when there is none."""
        offs = self._string_offsets(name)
        if offs:
            for tid in range(1, len(self._at)):
                _n, kind, vlen, _flag, _size = self._type(tid)
                if kind not in (ENUM, ENUM64):
                    continue
                step = 8 if kind == ENUM else 12
                for i in range(vlen):
                    at = self._at[tid] + 12 + i * step
                    if struct.unpack_from("<I", self.data, at)[0] in offs:
                        if kind == ENUM:
                            return struct.unpack_from("<i", self.data, at + 4)[0]
                        lo, hi = struct.unpack_from("<II", self.data, at + 4)
                        return lo | hi << 32
        raise BtfError(f"this kernel's BTF has no enumerator {name!r}")

    def _string_offsets(self, name: str) -> set[int]:
        """Offsets in the string section of every copy of name."""
        want = b"\0" + name.encode() + b"\0"
        out, pos = set(), self._strs - 1
        while True:
            pos = self.data.find(want, pos, self._str_end)
            if pos < 0:
                return out
            out.add(pos + 1 - self._strs)
            pos += 1

    def resolve(self, tid: int) -> int:
        """tid with typedefs and modifiers (const, volatile...) taken off."""
        for _ in range(64):
            if tid == 0:
                return 0
            _name, kind, _vlen, _kf, ref = self._type(tid)
            if kind not in _MODIFIERS:
                return tid
            tid = ref
        raise BtfError("a typedef chain does not end")

    def size(self, tid: int) -> int:
        """Bytes of a type (through typedefs and modifiers)."""
        tid = self.resolve(tid)
        _name, kind, _vlen, _kf, size = self._type(tid)
        if kind in _SIZED:
            return size
        if kind == PTR:
            return 8
        if kind == ARRAY:
            elem, _index, nelems = struct.unpack_from("<III", self.data, self._at[tid] + 12)
            return self.size(elem) * nelems
        raise BtfError(f"BTF type {tid} has no size")

    def members(self, tid: int) -> list[tuple[str, int, int, int]]:
        """(name, type id, bit offset, bitfield size) of a struct's or union's members."""
        _name, kind, vlen, kind_flag, _size = self._type(tid)
        if kind not in (STRUCT, UNION):
            raise BtfError(f"BTF type {tid} is no struct or union")
        out = []
        base = self._at[tid] + 12
        for i in range(vlen):
            name_off, mtype, off = struct.unpack_from("<III", self.data, base + 12 * i)
            bits, bitfield = (off & 0xFFFFFF, off >> 24) if kind_flag else (off, 0)
            out.append((self.name_at(name_off), mtype, bits, bitfield))
        return out

    # --- what pstate asks -------------------------------------------------------

    def member(self, struct_name: str, path: str) -> tuple[int, int]:
        """(byte offset, byte size) of a member of a struct, e.g.
        member("task_struct", "thread_info.cpu"). A member in an anonymous
        struct or union is found as if it were the struct's own."""
        tid = self.find(struct_name, STRUCT)
        offset = 0
        for part in path.split("."):
            found = self._member_in(tid, part)
            if found is None:
                raise BtfError(f"struct {struct_name} has no member {path!r} in this kernel's BTF")
            bits, mtype = found
            offset += bits
            tid = self.resolve(mtype)
        if offset % 8:
            raise BtfError(f"{struct_name}.{path} is a bit field")
        return offset // 8, self.size(tid)

    def _member_in(self, tid: int, name: str, depth: int = 0) -> tuple[int, int] | None:
        """(bit offset, type id) of a named member, looking into anonymous members."""
        if depth > 8:
            return None
        for mname, mtype, bits, bitfield in self.members(self.resolve(tid)):
            if mname == name:
                if bitfield:
                    raise BtfError(f"member {name!r} is a bit field")
                return bits, mtype
            if not mname and self.kind(self.resolve(mtype)) in (STRUCT, UNION):
                inner = self._member_in(mtype, name, depth + 1)
                if inner is not None:
                    return bits + inner[0], inner[1]
        return None

    def tracepoint(self, event: str) -> tuple[int, list[str]]:
        """(id of the typedef btf_trace_<event>, its raw argument types) —
        the attach target of a tp_btf program and what ctx[i] holds. The
        typedef's prototype starts with the tracepoint's private data
        pointer, which the program does not see; it is left out."""
        tid = self.find(f"btf_trace_{event}", TYPEDEF)
        ptr = self.resolve(tid)
        if self.kind(ptr) != PTR:
            raise BtfError(f"btf_trace_{event} is not a function pointer")
        proto = self._type(ptr)[4]
        _name, kind, vlen, _kf, _ret = self._type(proto)
        if kind != FUNC_PROTO:
            raise BtfError(f"btf_trace_{event} is not a function pointer")
        base = self._at[proto] + 12
        args = [self.describe(struct.unpack_from("<II", self.data, base + 8 * i)[1]) for i in range(vlen)]
        return tid, args[1:]

    def describe(self, tid: int) -> str:
        """A short C-like spelling of a type: 'struct task_struct *', 'bool'."""
        tid = self.resolve(tid)
        if tid == 0:
            return "void"
        name, kind, _vlen, _kf, ref = self._type(tid)
        if kind == PTR:
            return self.describe(ref) + " *"
        if kind in (STRUCT, UNION):
            return f"{'struct' if kind == STRUCT else 'union'} {name}"
        return name or _KIND_NAMES.get(kind, str(kind))


_KIND_NAMES = {INT: "int", PTR: "pointer", ARRAY: "array", STRUCT: "struct", UNION: "union", ENUM: "enum",
               TYPEDEF: "typedef", FUNC: "function", FUNC_PROTO: "prototype", ENUM64: "enum"}


# What pstate's tp_btf programs (and on the tracepoint path its raw lifecycle
# ones, bpf/tpargs.h) read: -D name -> the task_struct member (the first of the
# spellings this kernel has), and the raw arguments each tracepoint must have
# (its ctx[0], ctx[1]...; a tuple of spellings where kernels differ).
TASK_MEMBERS = {
    "TASK_PID": ("pid",),
    "TASK_TGID": ("tgid",),
    "TASK_EXIT_STATE": ("exit_state",),
    "TASK_PRIO": ("prio",),
    "TASK_COMM": ("comm",),
    "TASK_CPU": ("thread_info.cpu", "cpu"),  # task_cpu()
}
TASK = "struct task_struct *"
TRACEPOINT_ARGS = {
    "sched_switch": ("_Bool", TASK, TASK, "unsigned int"),
    "sched_waking": (TASK,),
    "sched_wakeup": (TASK,),
    "sched_wakeup_new": (TASK,),
    "task_newtask": (TASK, ("long long unsigned int", "long unsigned int")),  # clone_flags: u64, or unsigned long before
    "sched_process_fork": (TASK, TASK),
    "sched_process_exec": (TASK, "int"),
    "sched_process_exit": (TASK, "_Bool"),  # group_dead
    "sched_process_free": (TASK,),
}


def task_offsets(b: Btf) -> dict[str, int]:
    """-D name -> byte offset of each member in TASK_MEMBERS; BtfError when one
    is missing or not of the size the programs load (comm: 16 bytes, the
    others 4)."""
    out = {}
    for define, spellings in TASK_MEMBERS.items():
        for path in spellings:
            try:
                off, size = b.member("task_struct", path)
                break
            except BtfError as e:
                err = e
        else:
            raise err
        want = 16 if define == "TASK_COMM" else 4
        if size != want:
            raise BtfError(f"task_struct.{path} is {size} bytes in this kernel, the programs read {want}")
        out[define] = off
    return out


# Members of other structs than task_struct: -D name -> (struct, member,
# bytes the programs load).
# - The v2 cgroup id of a task the program is not running as (next at
#   sched_switch, a wakee), as bpf_get_current_cgroup_id() reads current's:
#   task->cgroups->dfl_cgrp->kn->id (task_dfl_cgroup, cgroup_id): three
#   pointers, then the 8-byte id.
# - Whether an expiring hrtimer is a soft one, whose callback runs in softirq
#   (record's hrtimer_expire_entry/exit trackers: a hard one's runs in the
#   timer interrupt).
MEMBERS = {
    "TASK_CGROUPS": ("task_struct", "cgroups", 8),
    "CSS_SET_DFL_CGRP": ("css_set", "dfl_cgrp", 8),
    "CGROUP_KN": ("cgroup", "kn", 8),
    "KERNFS_NODE_ID": ("kernfs_node", "id", 8),
    "HRTIMER_IS_SOFT": ("hrtimer", "is_soft", 1),
}


def member_offsets(b: Btf) -> dict[str, int]:
    """-D name -> byte offset of each member in MEMBERS; BtfError when one is
    missing or not of the size the programs load."""
    out = {}
    for define, (struct_name, path, want) in MEMBERS.items():
        off, size = b.member(struct_name, path)
        if size != want:
            raise BtfError(f"{struct_name}.{path} is {size} bytes in this kernel, the programs read {want}")
        out[define] = off
    return out


def check_tracepoints(b: Btf) -> dict[str, int]:
    """event -> attach target id of every tracepoint in TRACEPOINT_ARGS; BtfError
    when one is missing or its arguments are not what the programs read."""
    out = {}
    for event, want in TRACEPOINT_ARGS.items():
        tid, args = b.tracepoint(event)
        spellings = [w if isinstance(w, tuple) else (w,) for w in want]
        if len(args) < len(want) or any(a not in s for a, s in zip(args, spellings)):
            raise BtfError(f"tracepoint {event} has arguments ({', '.join(args)}), the programs read "
                           f"({', '.join(s[0] for s in spellings)})")
        out[event] = tid
    return out


# The wake list. record takes its wake-ups at sched_wakeup where the kernel
# has what follows, else at sched_waking (bpf/record.bpf.c WAKE_AT_WAKEUP):
# sched_wakeup runs in the waker's context except for a wake-up queued on
# the target CPU's wake list, which that CPU activates (from an IPI or its
# idle loop). The waker queues it in its own context through
# csd_queue_cpu (Linux 6.5+), whose entry is the task's wake_entry: an
# entry of type CSD_TYPE_TTWU in its flags. Optional: a kernel without
# one of them gets the sched_waking programs.
WAKE_LIST_MEMBERS = {
    "TASK_WAKE_ENTRY": ("task_struct", "wake_entry", 16),
    "CSD_FLAGS": ("__call_single_data", "node.u_flags", 4),
}
WAKE_LIST_ENUMS = {"CSD_TYPE_TTWU": "CSD_TYPE_TTWU", "CSD_TYPE_MASK": "CSD_FLAG_TYPE_MASK"}
WAKE_LIST_TRACEPOINT = ("csd_queue_cpu", ("unsigned int", "long unsigned int", "prototype *",
                                          "struct __call_single_data *"))


def wake_list(b: Btf) -> tuple[dict[str, int], dict[str, int]]:
    """(offsets and constants, {"csd_queue_cpu": target}) of the wake list,
    or two empty dicts when this kernel lacks one of them."""
    try:
        out = {}
        for define, (struct_name, path, want) in WAKE_LIST_MEMBERS.items():
            off, size = b.member(struct_name, path)
            if size != want:
                return {}, {}
            out[define] = off
        for define, name in WAKE_LIST_ENUMS.items():
            out[define] = b.enum_value(name)
        event, want = WAKE_LIST_TRACEPOINT
        tid, args = b.tracepoint(event)
        if tuple(args[:len(want)]) != want:
            return {}, {}
    except BtfError:
        return {}, {}
    return out, {event: tid}


def facts(b: Btf) -> dict:
    """What the tp_btf path takes from a kernel's BTF: the task_struct
    offsets (task_offsets), those of other structs (member_offsets)
    and the attach targets (check_tracepoints), each
    sorted by name: they become -D settings, whose order is part of the
    program cache's key, and a copy kept as JSON must give the same key."""
    wl_offsets, wl_targets = wake_list(b)
    offsets = {**task_offsets(b), **member_offsets(b), **wl_offsets}
    targets = {**check_tracepoints(b), **wl_targets}
    return {"offsets": dict(sorted(offsets.items())), "targets": dict(sorted(targets.items()))}


def offset_defines() -> frozenset:
    """The -D names facts() gives offsets for (a kept copy lacking one is stale)."""
    return frozenset(TASK_MEMBERS) | frozenset(MEMBERS)


def optional_defines() -> frozenset:
    """The -D names facts() gives where the kernel has them (the wake list's)."""
    return frozenset(WAKE_LIST_MEMBERS) | frozenset(WAKE_LIST_ENUMS)


def wanted() -> str:
    """What facts() looks for, as text: facts kept from a BTF (the program
    cache's) are those of this text only."""
    return repr((sorted(TASK_MEMBERS.items()), sorted(MEMBERS.items()), sorted(TRACEPOINT_ARGS.items()),
                 sorted(WAKE_LIST_MEMBERS.items()), sorted(WAKE_LIST_ENUMS.items()), WAKE_LIST_TRACEPOINT))


def boot_identity(path: str = VMLINUX) -> str | None:
    """Names the BTF of the running kernel for this boot (the boot id, the
    file's size and times), or None: the kernel's own BTF cannot change
    until the next boot, so what was read from it may be kept until then."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        st = os.stat(path)
    except OSError:
        return None
    return f"{boot}:{path}:{st.st_size}:{st.st_mtime_ns}:{st.st_ino}"


def vmlinux_hash(path: str = VMLINUX) -> str | None:
    """sha256 of the kernel's BTF, or None without it: the program cache keys
    on it, so a kernel whose types moved never gets offsets of another."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None

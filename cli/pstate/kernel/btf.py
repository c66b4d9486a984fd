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

from pstate.stream.meta import boot_id

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
        if kind == ARRAY:  # 'char[16]', as a tracefs format file spells a field
            elem, _index, nelems = struct.unpack_from("<III", self.data, self._at[tid] + 12)
            return f"{self.describe(elem)}[{nelems}]"
        return name or _KIND_NAMES.get(kind, str(kind))


_KIND_NAMES = {INT: "int", PTR: "pointer", ARRAY: "array", STRUCT: "struct", UNION: "union", ENUM: "enum",
               TYPEDEF: "typedef", FUNC: "function", FUNC_PROTO: "prototype", ENUM64: "enum"}


# --- what pstate reads from a kernel's BTF ----------------------------------
#
# The members the programs read, as -D settings (bpf/tpargs.h), each with
# its struct, its spellings (the first this kernel has) and the sizes the
# programs can load. Which of them a program needs depends on how each
# tracepoint is taken (pstate.kernel.probeplan): facts() reads all that
# this kernel has, and the plan asks for what it needs.
MEMBERS = {
    "TASK_PID": ("task_struct", ("pid",), (4,)),
    "TASK_TGID": ("task_struct", ("tgid",), (4,)),
    "TASK_EXIT_STATE": ("task_struct", ("exit_state",), (4,)),
    "TASK_PRIO": ("task_struct", ("prio",), (4,)),
    "TASK_COMM": ("task_struct", ("comm",), (16,)),
    "TASK_CPU": ("task_struct", ("thread_info.cpu", "cpu"), (4,)),  # task_cpu()
    # the task's raw state: `unsigned int __state` since Linux 5.14, a
    # `long state` before; read where sched_switch has no prev_state
    # argument (before 5.18)
    "TASK_STATE": ("task_struct", ("__state", "state"), (4, 8)),
    # sched_process_exit's group_dead where the tracepoint lacks the
    # argument: the process's count of live threads (signal->live)
    "TASK_SIGNAL": ("task_struct", ("signal",), (8,)),
    "SIGNAL_LIVE": ("signal_struct", ("live",), (4,)),
    # The v2 cgroup id of a task the program is not running as (next at
    # sched_switch, a wakee), as bpf_get_current_cgroup_id() reads current's:
    # task->cgroups->dfl_cgrp->kn->id: three pointers, then the 8-byte id.
    "TASK_CGROUPS": ("task_struct", ("cgroups",), (8,)),
    "CSS_SET_DFL_CGRP": ("css_set", ("dfl_cgrp",), (8,)),
    "CGROUP_KN": ("cgroup", ("kn",), (8,)),
    "KERNFS_NODE_ID": ("kernfs_node", ("id",), (8,)),
    # Whether an expiring hrtimer is a soft one, whose callback runs in
    # softirq (record's hrtimer trackers: a hard one's runs in the timer
    # interrupt).
    "HRTIMER_IS_SOFT": ("hrtimer", ("is_soft",), (1,)),
    # The task's own on-CPU time as the kernel counts it (what
    # /proc/PID/schedstat's first field shows): it grows only while the task
    # runs, by the run-queue clock, which leaves out the time the kernel
    # accounts apart (steal, and interrupts with IRQ_TIME_ACCOUNTING).
    # record reads it at switch-in and switch-out (bpf/record.bpf.c).
    "TASK_SUM_EXEC": ("task_struct", ("se.sum_exec_runtime",), (8,)),
    # The wake list (record's wake-ups at sched_wakeup, probeplan): the
    # task's wake_entry, an entry of type CSD_TYPE_TTWU in its flags.
    "TASK_WAKE_ENTRY": ("task_struct", ("wake_entry",), (16,)),
    "CSD_FLAGS": ("__call_single_data", ("node.u_flags",), (4,)),
}
# enumerators the programs use: -D name -> enumerator
ENUMS = {"CSD_TYPE_TTWU": "CSD_TYPE_TTWU", "CSD_TYPE_MASK": "CSD_FLAG_TYPE_MASK"}
# the tracepoints whose BTF prototype pstate reads (probeplan.TRACEPOINTS
# says what each program reads of them)
EVENTS = ("sched_switch", "sched_waking", "sched_wakeup", "sched_wakeup_new", "task_newtask",
          "sched_process_fork", "sched_process_exec", "sched_process_exit", "sched_process_free",
          "csd_queue_cpu", "sched_migrate_task")
# the trace record of each event's class (struct trace_event_raw_<class>):
# the classic tracepoint's fields, as the tracefs format file gives them on
# a running kernel, for planning from a kernel's BTF alone
RAW_CLASSES = {
    "sched_switch": ("sched_switch",),
    "sched_waking": ("sched_wakeup_template",),
    "sched_wakeup": ("sched_wakeup_template",),
    "sched_wakeup_new": ("sched_wakeup_template",),
    "task_newtask": ("task_newtask",),
    "sched_process_fork": ("sched_process_fork",),
    "sched_process_exec": ("sched_process_exec",),
    "sched_process_exit": ("sched_process_exit", "sched_process_template"),
    "sched_process_free": ("sched_process_free", "sched_process_template"),
    "sched_migrate_task": ("sched_migrate_task",),
}


def _member(b: Btf, struct_name: str, spellings: tuple, sizes: tuple) -> tuple[int, int] | None:
    """(offset, size) of the first spelling this BTF has, if its size is one
    the programs load; None otherwise."""
    for path in spellings:
        try:
            off, size = b.member(struct_name, path)
        except BtfError:
            continue
        return (off, size) if size in sizes else None
    return None


def record_fields(b: Btf, event: str) -> dict[str, str] | None:
    """The fields of an event's classic trace record as the kernel's BTF
    describes them (struct trace_event_raw_<class>): name -> type, with a
    __data_loc field as the format file names it ("__data_loc char[]");
    None when the BTF has no such struct."""
    for cls in RAW_CLASSES.get(event, ()):
        try:
            tid = b.find(f"trace_event_raw_{cls}", STRUCT)
        except BtfError:
            continue
        out = {}
        for name, mtype, _bits, _bf in b.members(tid):
            if name in ("ent", "__data") or not name:
                continue
            if name.startswith("__data_loc_"):
                out[name[len("__data_loc_"):]] = "__data_loc char[]"
            else:
                out[name] = b.describe(mtype)
        return out
    return None


def facts(b: Btf) -> dict:
    """What the programs may take from a kernel's BTF, as JSON-able data
    (the program cache keeps it per boot, the kernel matrix per kernel):
    - members: -D name -> [offset, size] of each MEMBERS entry this kernel has
    - enums: -D name -> value of each ENUMS entry it has
    - tracepoints: event -> {"target": id of btf_trace_<event>, "args":
      its raw argument types} for each EVENTS entry it has
    - records: event -> its classic trace record's fields (record_fields)
    Each is sorted by name: -D settings from them are part of the program
    cache's key, and a copy kept as JSON must give the same key."""
    members = {}
    for define, (struct_name, spellings, sizes) in MEMBERS.items():
        found = _member(b, struct_name, spellings, sizes)
        if found:
            members[define] = list(found)
    enums = {}
    for define, name in ENUMS.items():
        try:
            enums[define] = b.enum_value(name)
        except BtfError:
            pass
    tps = {}
    for event in EVENTS:
        try:
            tid, args = b.tracepoint(event)
        except BtfError:
            continue
        tps[event] = {"target": tid, "args": args}
    records = {}
    for event in RAW_CLASSES:
        fields = record_fields(b, event)
        if fields is not None:
            records[event] = fields
    return {"members": dict(sorted(members.items())), "enums": dict(sorted(enums.items())),
            "tracepoints": dict(sorted(tps.items())), "records": dict(sorted(records.items()))}


FACT_PARTS = ("members", "enums", "tracepoints", "records")  # the parts of facts()


def read_facts(path: str = VMLINUX) -> dict:
    """facts() of the BTF at path, read and parsed now."""
    return facts(Btf.read(path))


def wanted() -> str:
    """What facts() looks for, as text: facts kept from a BTF (the program
    cache's) are those of this text only."""
    return repr((sorted(MEMBERS.items()), sorted(ENUMS.items()), EVENTS, sorted(RAW_CLASSES.items())))


def boot_identity(path: str = VMLINUX) -> str | None:
    """Names the BTF of the running kernel for this boot (the boot id, the
    file's size and times), or None: the kernel's own BTF cannot change
    until the next boot, so what was read from it may be kept until then."""
    boot = boot_id()
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not boot:
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

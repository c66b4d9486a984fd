"""Turn the BPF program's binary events into JSON lines, in batches.

The kernel side (bpf/record.bpf.c, struct event) writes fixed 88-byte records.
This is the hot loop of `pstate record`: one f-string per event, with
per-batch struct.iter_unpack and caches for names, instead of building a dict
and serialising it.

When the C extension pstate._encode is built, Encoder.encode runs its loop
there instead. The C side only assembles lines from numbers and cached text:
every piece of text (the pid/tid/comm prefix, state names, kernel letters,
cause names) comes from the methods below, called on a cache miss, so the
names, the kernel's letter table and the comm escaping have one source and
both paths write the same bytes. PSTATE_PURE=1 (or _encode = None before an
Encoder is made) keeps to the Python loop.
"""

from __future__ import annotations

import struct

import orjson

from pstate import native
from pstate.kernel import eventlayout
from pstate.kernel.kstates import KernelStates
from pstate.stream import names, schema

# ring buffer header (len, pg_off) + struct event (bpf/pstate.h)
EVENT_SIZE = struct.calcsize(eventlayout.EVENT_FORMAT)
REC_FMT = "<II" + eventlayout.EVENT_FORMAT[1:]
# encode_pure unpacks the fields (padding skipped) in this order
_FIELD_ORDER = ("ts", "dur", "pid", "tid", "other_pid", "other_tid", "kstate", "from", "to", "cpu", "type",
                "cause", "prio", "flags", "comm", "stack", "cgroup", "run")
assert eventlayout.unpacked_names(eventlayout.EVENT_FIELDS) == _FIELD_ORDER, "bpf/pstate.h changed struct event"

BUSY = 1 << 31
DISCARD = 1 << 30
_D = eventlayout.DEFINES
NO_DUR = _D["NO_DUR"]

ST_KERNEL = _D["ST_KERNEL"]
SYNTHETIC = {_D["ST_UNKNOWN"]: schema.UNKNOWN, _D["ST_RUNNING"]: schema.RUNNING, _D["ST_RUNNABLE"]: schema.RUNNABLE,
             _D["ST_PREEMPTED"]: schema.PREEMPTED, _D["ST_NEW"]: schema.NEW, _D["ST_REAPED"]: schema.REAPED}
CODES = {name: code for code, name in SYNTHETIC.items()}

EV_STATE, EV_FORK, EV_EXEC, EV_EXIT = _D["EV_STATE"], _D["EV_FORK"], _D["EV_EXEC"], _D["EV_EXIT"]
EV_SLICE, EV_WAKER = _D["EV_SLICE"], _D["EV_WAKER"]
CAUSES = {code: name for name, code in eventlayout.with_prefix("CAUSE_").items()}
CAUSE_SWITCH_OUT, CAUSE_SWITCH_IN, CAUSE_REAP = _D["CAUSE_SWITCH_OUT"], _D["CAUSE_SWITCH_IN"], _D["CAUSE_REAP"]
F_VOLUNTARY, F_THREAD, F_GROUP_DEAD = _D["F_VOLUNTARY"], _D["F_THREAD"], _D["F_GROUP_DEAD"]
F_WAKER_IRQ, F_WAKER_SOFTIRQ = _D["F_WAKER_IRQ"], _D["F_WAKER_SOFTIRQ"]

# The native loop (None when not built or PSTATE_PURE=1; tests switch it).
_encode = native.load("_encode")


def state_code(name: str, ks: KernelStates) -> int | None:
    """BPF state code of a state name (for the --state filter)."""
    if name in CODES:
        return CODES[name]
    bit = ks.bit_of(name)
    return None if bit is None else ST_KERNEL | bit


def state_mask_bit(code: int) -> int:
    """The bit of a state code in the state mask (bpf: state_bit())."""
    if code & ST_KERNEL:
        return (code & 0xFFF) << 16
    return 1 << (code & 15)


class Encoder:
    def __init__(self, ks: KernelStates, resolve_tgid=None):
        self.ks = ks
        self._names: dict[int, str] = dict(SYNTHETIC)
        self._comms: dict[bytes, str] = {}
        self._kletters: dict[int, str] = {}
        self._tgid: dict[int, int] = {}
        self._prefixes: dict[int, tuple] = {}
        self._mids: dict[int, str] = {}  # (from << 16 | to) -> '"from":..,"to":..,"dur_ns":'
        self._out_tails: dict[int, str] = {}  # prev_state << 1 | voluntary -> switch_out fields before prio
        self._cgroups: dict[int, str] = {}  # cgroup id -> ',"cgroup":..'
        self.resolve_tgid = resolve_tgid or tgid_from_proc
        self._native = _encode.Encoder() if _encode is not None else None
        # record --stacks: pstate.kernel.stacks.StackTable, which turns a
        # wake-up's stack map id into its stack_id and reason
        self.stacks = None
        # record: pstate.kernel.identity.Identities, told of every new
        # (pid, tid, comm) the encoder meets (a prefix cache miss)
        self.identity = None

    def name(self, code: int) -> str:
        n = self._names.get(code)
        if n is None:
            n = self.ks.name(code & 0xFFF) if code & ST_KERNEL else f"state_{code}"
            self._names[code] = n
        return n

    def comm(self, raw: bytes) -> str:
        c = self._comms.get(raw)
        if c is None:
            c = orjson.dumps(names.comm(raw)).decode()
            if len(self._comms) > 65536:
                self._comms.clear()
            self._comms[raw] = c
        return c

    def kletter(self, kstate: int) -> str:
        k = self._kletters.get(kstate)
        if k is None:
            k = self._kletters[kstate] = self.ks.letter(kstate)
        return k

    def pid(self, tgid: int, tid: int) -> int:
        if tgid or not tid:
            if tgid and tid:
                self._tgid[tid] = tgid
            return tgid
        p = self._tgid.get(tid)
        if p is None:
            p = self.resolve_tgid(tid)
            if p:
                if len(self._tgid) > 1 << 20:
                    self._tgid.clear()
                self._tgid[tid] = p
        return p or 0

    # Text pieces of a line. Both loops call these on a cache miss only.

    def prefix_text(self, pid: int, tid: int, comm: bytes) -> str:
        pid = self.pid(pid, tid)
        if self.identity is not None:
            self.identity.seen(pid, tid, names.comm(comm))
        return f'"pid":{pid},"tid":{tid},"comm":{self.comm(comm)}'

    def cgroup_text(self, cgid: int) -> str:
        """',"cgroup":..' of a state record whose task is in cgroup cgid (0:
        not known, null); the stream's identities are told of an id met for
        the first time (its cgroup record goes before the batch's lines)."""
        if not cgid:
            return ',"cgroup":null'
        if self.identity is not None:
            self.identity.cgroup_met(cgid)
        return f',"cgroup":{cgid}'

    def mid_text(self, frm: int, to: int) -> str:
        return f'"from":"{self.name(frm)}","to":"{self.name(to)}","dur_ns":'

    def out_tail(self, kstate: int, voluntary: int) -> str:
        return (f',"cause":"switch_out","voluntary":{"true" if voluntary else "false"},'
                f'"kstate":"{self.kletter(kstate)}","prio":')

    def stack_tail(self, stack: int, since: int = 0) -> str:
        """',"stack_id":..,"reason":".."' of a wake-up whose blocked state
        has kernel stack map id stack - 1 and began at `since` (0: not
        known); '' when it cannot be read."""
        return self.stacks.tail(stack - 1, since) if self.stacks is not None else ""

    def cause_name(self, cause: int) -> str:
        return CAUSES.get(cause) or f"cause_{cause}"  # a kernel side newer than this decoder

    def _all_names(self) -> dict[int, str]:
        """Every state code the kernel side can produce, named once."""
        names = dict(SYNTHETIC)
        mask = self.ks.report_mask
        if mask < 1 << 12:
            for bits in range(1, mask + 1):
                if bits & ~mask == 0:
                    names[ST_KERNEL | bits] = self.ks.name(bits)
        return names

    def encode(self, view, n: int) -> tuple[list[str], int]:
        """Encode the records in view; stop at the first still-busy one.

        Returns (lines, records consumed).
        """
        if self._native is not None:
            return self._native.encode(view, self)
        return self.encode_pure(view, n)

    def encode_bytes(self, view, n: int) -> tuple[bytes, int, int]:
        """As encode, joined: (UTF-8 lines, number of lines, records consumed).

        record's path: with the C loop no str is made per line, and the lines
        come as a read-only memoryview of a buffer the encoder reuses once
        the caller has let go of it (bytes from the Python loop).
        """
        if self._native is not None:
            return self._native.encode_bytes(view, self)
        lines, consumed = self.encode_pure(view, n)
        return "".join(lines).encode(), len(lines), consumed

    def encode_pure(self, view, n: int) -> tuple[list[str], int]:
        """The Python loop (the reference for the C one)."""
        out = []
        append = out.append
        prefixes = self._prefixes
        mids = self._mids
        out_tails = self._out_tails
        cgroups = self._cgroups
        consumed = 0
        for (hdr, _pg, ts, dur, pid, tid, opid, otid, kst, frm, to, cpu, typ, cause, prio, flags,
             comm, stack, cgid, run) in struct.iter_unpack(REC_FMT, view):
            if hdr & BUSY:
                break
            consumed += 1
            if hdr & DISCARD:
                continue
            # "pid":..,"tid":..,"comm":.. is the same for most events of a thread
            pre = prefixes.get(tid)
            if pre is None or pre[0] != comm or pre[1] != pid:
                pre = (comm, pid, self.prefix_text(pid, tid, comm))
                if len(prefixes) > 1 << 18:
                    prefixes.clear()
                prefixes[tid] = pre
            ptc = pre[2]
            if typ == EV_STATE:
                d = "null" if dur == NO_DUR else dur
                cg = cgroups.get(cgid)
                if cg is None:
                    if len(cgroups) > 1 << 16:
                        cgroups.clear()
                    cg = cgroups[cgid] = self.cgroup_text(cgid)
                # '"from":"..","to":"..","dur_ns":' for this pair of states
                mid = mids.get((frm << 16) | to)
                if mid is None:
                    mid = mids[(frm << 16) | to] = self.mid_text(frm, to)
                if cause == CAUSE_SWITCH_OUT:
                    # the BPF side derives voluntary from kstate; keyed on both all the same
                    tk = (kst << 1) | (flags & F_VOLUNTARY)
                    tail = out_tails.get(tk)
                    if tail is None:
                        tail = out_tails[tk] = self.out_tail(kst, flags & F_VOLUNTARY)
                    # the part of the slice the kernel does not count as the task's
                    # (steal, irq); without the slice's start, the kernel's count alone
                    si = ("" if run == NO_DUR else f',"run_ns":{run}' if dur == NO_DUR
                          else f',"steal_irq_ns":{_signed(dur - run)}')
                    append(f'{{"type":"state","ts":{ts},"cpu":{cpu},{ptc},{mid}{d}{tail}{prio},'
                           f'"next_tid":{otid}{si}{cg}}}\n')
                elif cause == CAUSE_SWITCH_IN:
                    append(f'{{"type":"state","ts":{ts},"cpu":{cpu},{ptc},{mid}{d},"cause":"switch_in",'
                           f'"prio":{prio},"prev_tid":{otid}{cg}}}\n')
                elif cause == CAUSE_REAP:
                    append(f'{{"type":"state","ts":{ts},"cpu":{cpu},{ptc},{mid}{d},"cause":"reap"{cg}}}\n')
                else:
                    c = CAUSES.get(cause) or self.cause_name(cause)
                    ctx = ("" if not flags & (F_WAKER_IRQ | F_WAKER_SOFTIRQ) else
                           ',"waker":"irq"' if flags & F_WAKER_IRQ else ',"waker":"softirq"')
                    append(f'{{"type":"state","ts":{ts},"cpu":{cpu},{ptc},{mid}{d},"cause":"{c}",'
                           f'"waker_tid":{otid},"waker_pid":{opid},"target_cpu":{kst}{ctx}'
                           f'{self.stack_tail(stack, ts - dur if dur <= ts else 0) if stack else ""}{cg}}}\n')
            elif typ == EV_FORK:
                append(f'{{"type":"fork","ts":{ts},"cpu":{cpu},{ptc},'
                       f'"child_pid":{opid},"child_tid":{otid},"thread":{"true" if flags & F_THREAD else "false"}}}\n')
            elif typ == EV_EXEC:
                append(f'{{"type":"exec","ts":{ts},"cpu":{cpu},{ptc},"old_tid":{otid}}}\n')
            elif typ == EV_EXIT:
                append(f'{{"type":"exit","ts":{ts},"cpu":{cpu},{ptc},'
                       f'"group_dead":{"true" if flags & F_GROUP_DEAD else "false"}}}\n')
            elif typ == EV_SLICE:
                append(f'{{"type":"slice","ts":{ts},"cpu":{cpu},{ptc},"dur_ns":{dur},"next_tid":{otid}}}\n')
            elif typ == EV_WAKER:
                append(f'{{"type":"waker","ts":{ts},"cpu":{cpu},{ptc}}}\n')
        return out, consumed


def _signed(v: int) -> int:
    """A difference of two u64 values as the kernel side's wrapping arithmetic gives it, signed."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


def tgid_from_proc(tid: int) -> int:
    try:
        with open(f"/proc/{tid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0

"""Per-CPU slot rings: record's sched programs write each record into their
CPU's own run of slots (bpf/record.bpf.c struct slot), with no helper call,
where the ring buffer costs two calls and a lock per record. This reads
those runs together with the ring buffer (which keeps the other programs'
records) and hands its caller one stream in time order, laid out as the
ring buffer's records (pstate.kernel.loader.RingReader): the same read,
commit and skip, and the same decoders behind them.

Order. The ring buffer gives records in the order they were written; the
runs give each CPU's records in that order, and nothing orders two CPUs.
Each run is merged by its running maximum of keys, a record's key being
its time, doubled, plus one when its dur is 0: a wake-up settled at a
switch-in carries the older time of the switch-out it follows (a sleep of
0), keeps its place just before that switch-in in its run, and comes after
that switch-out, from another CPU at the same time. So that a record still
being written on one CPU cannot come out after a later one from another,
records within HOLD_NS of the moment the positions were read wait for the
next read, unless the producers have stopped (settle()).

Memory order: a program stores a slot's fields, then moves head (a compiler
barrier between: stores are not reordered on x86-64, the only architecture
where record turns the slots on); this loads head, then the slots, copies
them out, then stores tail.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import itertools
import mmap
import struct
import time

from pstate.exitcodes import PstateError
from pstate.kernel import bpfsys, eventlayout
from pstate.kernel.eventcodec import BUSY, DISCARD
from pstate.kernel.loader import RingReader

HOLD_NS = 2_000_000  # longer than any program runs between its clock read and its commit
GATHER = 16384  # records one read copies out of all the sources together: bounds its memory
POS_SIZE = 128  # struct slot_pos: head and busy on one cache line, tail on the next
HEAD_OFF, TAIL_OFF = 0, 64
# a record's time and dur, in u64 words of a slot (after its header; a slot has neither of the
# ring buffer's header bits, BUSY and DISCARD)
TS_WORD = (RingReader.HDR + eventlayout.offset_of("ts")) // 8
DUR_WORD = (RingReader.HDR + eventlayout.offset_of("dur")) // 8


def _mapped(fd: int, nbytes: int) -> mmap.mmap:
    size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)


class SlotRings:
    """The ring buffer `ring` and the per-CPU runs of the `slots` array
    (ncpus x per_cpu slots, each ring.stride bytes) with their positions in
    the `positions` array, read as one."""

    def __init__(self, ring: RingReader, slots_fd: int, positions_fd: int, ncpus: int, per_cpu: int,
                 gather: int = GATHER):
        if per_cpu & (per_cpu - 1):
            raise ValueError(f"slots per CPU must be a power of two, not {per_cpu}")
        self.ring = ring
        self.stride = ring.stride
        self.rec = ring.rec
        self.ncpus = ncpus
        self.per_cpu = per_cpu
        self.slots = _mapped(slots_fd, ncpus * per_cpu * self.stride)
        self.positions = _mapped(positions_fd, ncpus * POS_SIZE)
        self._tails = [ctypes.c_uint64.from_buffer(self.positions, c * POS_SIZE + TAIL_OFF) for c in range(ncpus)]
        self.words = self.stride // 8
        # Every slot's header, once: the length, never busy. The programs
        # write only the record after it, so this may race with them.
        hdr = memoryview(self.slots).cast("Q")
        hdr[0:ncpus * per_cpu * self.words:self.words] = memoryview(
            struct.pack("<Q", self.rec) * (ncpus * per_cpu)).cast("Q")
        hdr.release()
        self.last_key = [0] * (ncpus + 1)  # per run (the ring buffer last): its running maximum
        self.pending = b""  # merged records not yet committed by the caller
        self.offset = 0  # records of `pending` already committed
        self.npending = 0
        self.settled = False
        self.cap = max(1, gather // (ncpus + 1))  # records copied out of one source per read

    def settle(self) -> None:
        """The producers have stopped: from now on nothing is held back."""
        self.settled = True

    def head(self, cpu: int) -> int:
        return struct.unpack_from("<Q", self.positions, cpu * POS_SIZE + HEAD_OFF)[0]

    def available(self) -> int:
        """Bytes of records not yet committed, as RingReader.available()."""
        waiting = sum(min(self.head(c) - self._tails[c].value, self.per_cpu) for c in range(self.ncpus))
        return self.ring.available() + (waiting + self.npending - self.offset) * self.stride

    def read(self, max_records: int | None = None) -> tuple[memoryview, int]:
        """A contiguous view of the next n records in time order, and n."""
        if self.offset >= self.npending:
            self._gather()
        n = self.npending - self.offset
        if max_records is not None:
            n = min(n, max_records)
        if n <= 0:
            return memoryview(b""), 0
        start = self.offset * self.stride
        return memoryview(self.pending)[start:start + n * self.stride], n

    def commit(self, nrecords: int) -> None:
        self.offset = min(self.npending, self.offset + nrecords)

    def skip(self) -> None:
        """Give up every record written so far, unread."""
        self.ring.skip()
        for c in range(self.ncpus):
            self._tails[c].value = self.head(c)
        self.pending, self.offset, self.npending = b"", 0, 0

    def _keys(self, src: int, data, n: int) -> list[int]:
        """The keys of the n records of one source in `data`: running maxima."""
        words = memoryview(data).cast("Q")
        ts = words[TS_WORD::self.words].tolist()[:n]
        dur = words[DUR_WORD::self.words].tolist()[:n]
        words.release()
        return list(itertools.accumulate([2 * t + (d == 0) for t, d in zip(ts, dur)], max,
                                         initial=self.last_key[src]))[1:]

    def _gather(self) -> None:
        """Copy out the next records of every source that are due, at most
        self.cap of each, and merge them. A source that has more than the cap
        bounds what the others give: its next records' keys are at least its
        last one's."""
        bound = (1 << 66) if self.settled else 2 * (time.monotonic_ns() - HOLD_NS)
        found = []  # per source: (src, data, keys, ring headers or None, more waiting), the ring buffer first
        view, n = self.ring.read(self.cap)
        if n:
            words = view.cast("I")
            hdrs = words[0::self.stride // 4].tolist()
            words.release()
            end = next((i for i, h in enumerate(hdrs) if h & BUSY), n)
            data = bytes(view[:end * self.stride])
            found.append((self.ncpus, data, self._keys(self.ncpus, data, end), hdrs,
                          end == self.cap and self.ring.available() > end * self.stride))
        view.release()
        for c in range(self.ncpus):
            tail = self._tails[c].value
            waiting = min(self.head(c) - tail, self.per_cpu)
            n = min(waiting, self.cap)
            if n <= 0:
                continue
            first = tail & (self.per_cpu - 1)
            base = c * self.per_cpu
            seg = min(n, self.per_cpu - first)
            lo = (base + first) * self.stride
            data = self.slots[lo:lo + seg * self.stride]
            if seg < n:
                data += self.slots[base * self.stride:(base + n - seg) * self.stride]
            found.append((c, data, self._keys(c, data, n), None, waiting > n))
        for _src, _data, keys, _hdrs, more in found:
            if more and keys and keys[-1] < bound:
                bound = keys[-1] + 1  # the records it still holds come at or after its last one
        keys_out: list[int] = []
        parts: list[bytes] = []
        for src, data, keys, hdrs, _more in found:
            k = bisect.bisect_left(keys, bound)
            if not k:
                continue
            self.last_key[src] = keys[k - 1]
            keys = keys[:k]
            if src == self.ncpus:
                self.ring.commit(k)
                kept = [i for i in range(k) if not hdrs[i] & DISCARD]
                if len(kept) < k:
                    data = b"".join(data[i * self.stride:(i + 1) * self.stride] for i in kept)
                    keys = [keys[i] for i in kept]
                k = len(kept)
            else:
                self._tails[src].value += k  # copied out: the program may reuse them
            if k:
                keys_out += keys
                parts.append(data[:k * self.stride])
        blob = b"".join(parts)
        if len(parts) > 1:
            order = sorted(range(len(keys_out)), key=keys_out.__getitem__)  # stable: ties keep the sources' order
            s = self.stride
            mv = memoryview(blob)
            blob = b"".join([mv[i * s:i * s + s] for i in order])
            mv.release()
        self.pending, self.offset, self.npending = blob, 0, len(keys_out)

    @classmethod
    def of_maps(cls, ring: RingReader, slots_fd: int, positions_fd: int, ncpus: int) -> SlotRings:
        """SlotRings over a loaded program's maps (ncpus runs in the slots
        array), once their layout is checked against what this reads."""
        info = bpfsys.map_info(slots_fd)
        per_cpu = info["max_entries"] // ncpus
        if info["value_size"] != ring.stride or per_cpu * ncpus != info["max_entries"] or per_cpu & (per_cpu - 1):
            raise PstateError(f"the BPF program's slots ({info['max_entries']} of {info['value_size']} bytes) "
                              f"are not {ncpus} runs of a power of two slots of {ring.stride} bytes, which this "
                              "pstate reads: bpf/record.bpf.c and pstate/kernel/slotrings.py disagree")
        return cls(ring, slots_fd, positions_fd, ncpus, per_cpu)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            del self._tails
            self.slots.close()
            self.positions.close()
        self.ring.close()

"""Rows the programs write in place are read while they are written: a row
copied across a write, or a slot emptied between the scan and the copy, is
not reported as a row (snapshots/taskmaps.py TidArray.rows, the array of
rows by tid; kernel/bpfmaps.py Table.read_settled, the hash of rows)."""

from __future__ import annotations

import ctypes

from pstate.kernel import bpfmaps
from pstate.snapshots import taskmaps


class Leaf(ctypes.Structure):
    _fields_ = [("start_ts", ctypes.c_uint64), ("since", ctypes.c_uint64), ("ns", ctypes.c_uint64 * 2)]


EMPTY = bytes(ctypes.sizeof(Leaf))


def row(start: int, since: int, a: int, b: int) -> bytes:
    return bytes(Leaf(start, since, (ctypes.c_uint64 * 2)(a, b)))


class Memory:
    """A mapping whose slots change as they are read: slot i gives the
    copies in script[i] one after the other, then the last for ever."""

    def __init__(self, script: dict[int, list[bytes]]):
        self.size = ctypes.sizeof(Leaf)
        self.script = {i: list(copies) for i, copies in script.items()}
        self.reads: dict[int, int] = {}

    def __getitem__(self, s: slice) -> bytes:
        i = s.start // self.size
        self.reads[i] = self.reads.get(i, 0) + 1
        copies = self.script.get(i) or [EMPTY]
        return copies.pop(0) if len(copies) > 1 else copies[0]


def array(n: int, script: dict[int, list[bytes]]) -> taskmaps.TidArray:
    a = object.__new__(taskmaps.TidArray)
    a.Leaf, a.size, a.n = Leaf, ctypes.sizeof(Leaf), n
    a.mm = Memory(script)
    a.since = memoryview(bytearray(8 * n)).cast("Q")  # the scan: every slot held a row
    for i in range(n):
        a.since[i] = 1
    return a


def as_tuple(v) -> tuple:
    return v.start_ts, v.since, tuple(v.ns)


def test_a_still_row_is_copied_twice_and_kept():
    a = array(2, {1: [row(10, 20, 5, 6)]})
    got = a.rows()
    assert {t: as_tuple(v) for t, v in got.items()} == {1: (10, 20, (5, 6))}
    assert a.mm.reads[1] == 2


def test_a_slot_emptied_after_the_scan_is_left_out():
    # freed between the scan of `since` and the copy: its final row is in `gone`
    a = array(2, {0: [EMPTY], 1: [row(10, 20, 5, 6), EMPTY]})
    assert a.rows() == {}


def test_a_copy_across_a_write_is_taken_again():
    # half emptied (since still set, the counters zeroed), then empty; and a
    # switch's write seen half done (the time moved, since not yet), then done
    half = row(10, 20, 0, 0)
    a = array(3, {1: [half, EMPTY],
                  2: [row(10, 20, 5, 9), row(10, 30, 5, 9), row(10, 30, 5, 9)]})
    got = {t: as_tuple(v) for t, v in a.rows().items()}
    assert got == {2: (10, 30, (5, 9))}


def test_a_row_that_never_holds_still_gives_its_last_copy():
    copies = [row(10, 20 + i, i, i) for i in range(bpfmaps.COPY_TRIES + 1)]
    a = array(1, {0: copies + [row(99, 99, 9, 9)]})
    got = a.rows()
    assert as_tuple(got[0]) == (10, 20 + bpfmaps.COPY_TRIES, (bpfmaps.COPY_TRIES,) * 2)
    assert a.mm.reads[0] == bpfmaps.COPY_TRIES + 1


class Hash(bpfmaps.Table):
    """A hash whose batch reads and lookups give scripted rows."""

    def __init__(self, batches: list[dict[int, bytes]], lookups: dict[int, list[bytes | None]]):
        super().__init__(-1, "tasks", ctypes.c_uint32, Leaf, 1, 16)
        self.batches, self.lookups = list(batches), {k: list(v) for k, v in lookups.items()}

    def _batches(self, delete: bool, chunk: int):
        return [(bytes(ctypes.c_uint32(k)), v) for k, v in self.batches.pop(0).items()]

    def copy(self, key) -> bytes | None:
        left = self.lookups[key.value]
        return left.pop(0) if len(left) > 1 else left[0]


def settled(h: Hash) -> dict:
    return {k.value: as_tuple(v) for k, v in h.read_settled()}


def test_a_hash_row_read_the_same_twice_is_kept_without_a_lookup():
    h = Hash([{1: row(10, 20, 5, 6)}, {1: row(10, 20, 5, 6)}], {})
    assert settled(h) == {1: (10, 20, (5, 6))}


def test_a_hash_row_torn_in_a_read_is_looked_up_until_it_holds():
    # the second read tore a switch (time moved, since not yet): looked up alone
    torn, done = row(10, 20, 9, 6), row(10, 30, 9, 6)
    h = Hash([{1: row(10, 20, 5, 6), 2: row(7, 8, 1, 1)}, {1: torn, 2: row(7, 8, 1, 1)}], {1: [done, done]})
    assert settled(h) == {1: (10, 30, (9, 6)), 2: (7, 8, (1, 1))}


def test_a_hash_row_deleted_or_new_between_the_reads():
    # 1 freed between the reads (absent from the second); 3 new in the
    # second, checked alone, and deleted before the check
    h = Hash([{1: row(10, 20, 5, 6)}, {3: row(40, 40, 0, 0)}], {3: [None]})
    assert settled(h) == {}


def test_settle_gives_up_after_its_tries_with_the_last_copy():
    copies = iter(range(100))
    assert bpfmaps.settle(lambda: bytes([next(copies)])) == bytes([bpfmaps.COPY_TRIES])


def test_a_kernel_without_batch_reads_reads_key_by_key_twice():
    class Slow(Hash):
        def _batches(self, delete, chunk):
            return None

        def read_all(self, delete=False, chunk=1024):
            return [(ctypes.c_uint32(k), Leaf.from_buffer_copy(v)) for k, v in self.batches.pop(0).items()]

    torn, done = row(10, 20, 9, 6), row(10, 30, 9, 6)
    h = Slow([{1: row(10, 20, 5, 6), 2: row(7, 8, 1, 1)}, {1: torn, 2: row(7, 8, 1, 1)}], {1: [done, done]})
    assert settled(h) == {1: (10, 30, (9, 6)), 2: (7, 8, (1, 1))}

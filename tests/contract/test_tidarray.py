"""The tid-indexed array is read while the program writes it: a row copied
across a write, or a slot emptied between the scan and the copy, is not
reported as a row (snapshots/taskmaps.py TidArray.rows)."""

from __future__ import annotations

import ctypes

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
    copies = [row(10, 20 + i, i, i) for i in range(taskmaps.COPY_TRIES + 1)]
    a = array(1, {0: copies + [row(99, 99, 9, 9)]})
    got = a.rows()
    assert as_tuple(got[0]) == (10, 20 + taskmaps.COPY_TRIES, (taskmaps.COPY_TRIES,) * 2)
    assert a.mm.reads[0] == taskmaps.COPY_TRIES + 1

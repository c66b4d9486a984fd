"""pstate.kernel.slotrings.SlotRings over files laid out as record's maps:
the per-CPU runs of slots, their positions, and the ring buffer (laid out as
in tests/contract/test_ringreader.py)."""

import mmap
import os
import struct
import time

import pytest

from pstate.kernel import eventlayout, loader, slotrings
from pstate.kernel.eventcodec import EVENT_SIZE

PAGE = mmap.PAGESIZE
RING = 4 * PAGE
NCPUS = 2
PER_CPU = 4
STRIDE = loader.RingReader.stride_of(EVENT_SIZE)
FAR = 1 << 62  # a time no read reaches before settle()


def _fd(name, size):
    fd = os.memfd_create(name)
    os.ftruncate(fd, -(-size // PAGE) * PAGE)  # as a map's mmap: whole pages
    return fd


class Maps:
    def __init__(self):
        self.ring = _fd("ring", 2 * PAGE + 2 * RING)
        self.slots = _fd("slots", NCPUS * PER_CPU * STRIDE)
        self.pos = _fd("slot_pos", NCPUS * slotrings.POS_SIZE)
        self.prod = 0

    def reader(self, gather=slotrings.GATHER):
        return slotrings.SlotRings(loader.RingReader(self.ring, RING, EVENT_SIZE), self.slots, self.pos,
                                   NCPUS, PER_CPU, gather)

    def head(self, cpu):
        return struct.unpack("<Q", os.pread(self.pos, 8, cpu * slotrings.POS_SIZE))[0]

    def tail(self, cpu):
        return struct.unpack("<Q", os.pread(self.pos, 8, cpu * slotrings.POS_SIZE + slotrings.TAIL_OFF))[0]

    def slot(self, cpu, ts, mark, dur=1):
        """A record written on cpu as the program does: the event (its ts,
        dur, and `mark` as its pid), then head."""
        head = self.head(cpu)
        i = cpu * PER_CPU + head % PER_CPU
        os.pwrite(self.slots, struct.pack("<QQI", ts, dur, mark), i * STRIDE + 8)
        os.pwrite(self.pos, struct.pack("<Q", head + 1), cpu * slotrings.POS_SIZE)

    def ring_record(self, ts, mark, flags=0):
        os.pwrite(self.ring, struct.pack("<IIQQI", EVENT_SIZE | flags, 0, ts, 1, mark), 2 * PAGE + self.prod)
        self.prod += STRIDE
        os.pwrite(self.ring, struct.pack("<Q", self.prod), PAGE)

    def close(self):
        for fd in (self.ring, self.slots, self.pos):
            os.close(fd)


@pytest.fixture
def maps():
    m = Maps()
    yield m
    m.close()


def _read_all(r):
    out = []
    while True:
        view, n = r.read(3)
        if not n:
            return out
        for i in range(n):
            hdr, _pg, ts, _dur, mark = struct.unpack_from("<IIQQI", view, i * STRIDE)
            assert hdr == EVENT_SIZE  # the length, never busy: as the ring buffer's records
            out.append((ts, mark))
        view.release()
        r.commit(n)


def test_every_slot_header_is_the_record_length(maps):
    r = maps.reader()
    hdrs = [struct.unpack("<I", os.pread(maps.slots, 4, i * STRIDE))[0] for i in range(NCPUS * PER_CPU)]
    assert hdrs == [EVENT_SIZE] * (NCPUS * PER_CPU)
    r.close()


def test_runs_and_ring_merge_in_time_order(maps):
    r = maps.reader()
    maps.slot(0, 100, 1)
    maps.slot(0, 300, 3)
    maps.slot(1, 200, 2)
    maps.slot(1, 400, 4)
    maps.ring_record(250, 25)
    assert [m for _ts, m in _read_all(r)] == [1, 2, 25, 3, 4]
    assert (maps.tail(0), maps.tail(1)) == (2, 2)  # copied out: the program may reuse them
    assert r.available() == 0
    r.close()


def test_a_settled_wakeup_keeps_its_place_before_the_switch_in(maps):
    r = maps.reader()
    maps.slot(0, 100, 1)  # switch-out on CPU 0
    maps.slot(1, 150, 2)
    maps.slot(1, 100, 3, dur=0)  # the wake-up settled at the switch-in: the switch-out's time, a sleep of 0
    maps.slot(1, 180, 4)  # the switch-in
    assert [m for _ts, m in _read_all(r)] == [1, 2, 3, 4]
    r.close()


@pytest.mark.parametrize("out_cpu", [0, 1])
def test_a_settled_wakeup_comes_after_its_switch_out_at_the_same_time(maps, out_cpu):
    r = maps.reader()
    maps.slot(1 - out_cpu, 50, 1)
    maps.slot(1 - out_cpu, 100, 3, dur=0)  # settled at the switch-in on this CPU, nothing here since 50
    maps.slot(1 - out_cpu, 180, 4)
    maps.slot(out_cpu, 100, 2)  # the switch-out it settles, on the other CPU, at the same time
    assert [m for _ts, m in _read_all(r)] == [1, 2, 3, 4]
    r.close()


def test_recent_records_wait_until_the_producers_stop(maps):
    r = maps.reader()
    now = time.monotonic_ns()
    maps.slot(0, now - 10 * slotrings.HOLD_NS, 1)
    maps.slot(0, FAR, 2)
    maps.slot(1, FAR, 3)
    assert _read_all(r) == [(now - 10 * slotrings.HOLD_NS, 1)]
    assert maps.tail(0) == 1 and maps.tail(1) == 0  # the held records stay in their slots
    assert r.available() == 2 * STRIDE
    r.settle()
    assert [m for _ts, m in _read_all(r)] == [2, 3]
    r.close()


def test_a_run_that_wraps_reads_in_order(maps):
    r = maps.reader()
    for i in range(3):
        maps.slot(0, 10 + i, i)
    assert len(_read_all(r)) == 3
    for i in range(3, 7):  # slots 3, 0, 1, 2
        maps.slot(0, 10 + i, i)
    assert [m for _ts, m in _read_all(r)] == [3, 4, 5, 6]
    assert maps.tail(0) == 7
    r.close()


def test_ring_records_stop_at_a_busy_one_and_skip_discarded_ones(maps):
    r = maps.reader()
    maps.ring_record(10, 1)
    maps.ring_record(20, 2, slotrings.DISCARD)
    maps.ring_record(30, 3)
    maps.ring_record(40, 4, slotrings.BUSY)
    assert [m for _ts, m in _read_all(r)] == [1, 3]
    assert r.available() == STRIDE  # the busy one: still being written
    r.close()


@pytest.mark.parametrize("gather", [3, 6])  # 1 and 2 records of each source a read
def test_a_read_copies_out_a_bounded_part_of_each_source_in_order(maps, gather):
    r = maps.reader(gather)
    cap = gather // (NCPUS + 1)
    for i in range(4):
        maps.slot(0, 10 * i + 1, 10 * i + 1)
        maps.slot(1, 10 * i + 2, 10 * i + 2)
    for i in range(6):
        maps.ring_record(10 * i + 3, 10 * i + 3)
    out = []
    while True:
        view, n = r.read()
        if not n:
            break
        assert n <= (NCPUS + 1) * cap
        out += [struct.unpack_from("<Q", view, i * STRIDE + 8)[0] for i in range(n)]
        view.release()
        r.commit(n)
    assert out == sorted(out) and len(out) == 14  # a source read in part holds the others back
    r.close()


def test_commit_of_part_of_a_read_keeps_the_rest(maps):
    r = maps.reader()
    for i in range(3):
        maps.slot(1, 10 + i, i)
    view, n = r.read()
    assert n == 3
    view.release()
    r.commit(1)
    view, n = r.read()
    assert n == 2 and struct.unpack_from("<Q", view, 16)[0] == 1
    view.release()
    r.close()


def test_skip_gives_up_everything(maps):
    r = maps.reader()
    maps.slot(0, 10, 1)
    maps.slot(1, 20, 2)
    maps.ring_record(30, 3)
    r.skip()
    assert r.read()[1] == 0 and r.available() == 0
    assert (maps.tail(0), maps.tail(1)) == (1, 1)
    r.close()


def test_runs_only_where_stores_keep_their_order(monkeypatch):
    from pstate.kernel import recordprog

    monkeypatch.setattr(recordprog.platform, "machine", lambda: "x86_64")
    assert recordprog.slots_per_cpu(16 << 20, 2) == 8192  # at most 704 KiB a CPU: the rest goes to the ring buffer
    assert recordprog.slots_per_cpu(1 << 20, 2) == 4096  # the buffer's size, shared by the CPUs
    assert recordprog.slots_per_cpu(16 << 20, 256) == 1024  # at least 1024, however many CPUs share it
    assert recordprog.slots_per_cpu(4096, 1) == 1024
    monkeypatch.setattr(recordprog.platform, "machine", lambda: "aarch64")
    assert recordprog.slots_per_cpu(16 << 20, 2) == 0  # stores may be reordered there: the ring buffer only


def test_time_and_dur_words_follow_struct_event():
    # the 8-byte header, then struct event's ts and dur (bpf/pstate.h)
    assert (slotrings.TS_WORD, slotrings.DUR_WORD) == (1, 2)
    assert eventlayout.offset_of("run") == EVENT_SIZE - 8

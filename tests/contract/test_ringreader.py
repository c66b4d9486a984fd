"""pstate.kernel.loader.RingReader over a file laid out as a BPF ring
buffer's mmap: the consumer page, the producer page, the data twice."""

import mmap
import os
import struct

from pstate.kernel import loader

PAGE = mmap.PAGESIZE
SIZE = 4 * PAGE


def _ring():
    fd = os.memfd_create("ring")
    os.ftruncate(fd, 2 * PAGE + 2 * SIZE)
    return fd


def _set_producer(fd, pos):
    os.pwrite(fd, struct.pack("<Q", pos), PAGE)


def _consumer(fd):
    return struct.unpack("<Q", os.pread(fd, 8, 0))[0]


def test_read_commit_and_skip_move_the_consumer_position(tmp_path):
    fd = _ring()
    try:
        ring = loader.RingReader(fd, SIZE, 80)
        assert ring.stride == 88
        _set_producer(fd, 3 * 88)
        view, n = ring.read()
        assert n == 3 and len(view) == 3 * 88
        view.release()
        ring.commit(2)
        assert _consumer(fd) == 2 * 88 and ring.available() == 88
        _set_producer(fd, 1000)  # records of another size: skip gives them all up
        ring.skip()
        assert _consumer(fd) == 1000 and ring.available() == 0
        assert ring.read()[1] == 0
        ring.close()
    finally:
        os.close(fd)

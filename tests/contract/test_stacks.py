"""pstate.kernel.stacks without a kernel: symbols, reasons, and stream ids
kept per stack content when the kernel reuses a stack map slot."""

from __future__ import annotations

import ctypes

import orjson
import pytest

from pstate.kernel import stacks
from pstate.stream import vocab

KALLSYMS = b"""\
ffffffff81000000 T _stext
ffffffff81100000 T __schedule
ffffffff81100400 T schedule
ffffffff81100800 T io_schedule
ffffffff81200000 t __iomap_dio_rw
ffffffff81300000 T do_nanosleep
ffffffff81400000 d some_data
ffffffffc0100000 t ext4_file_write_iter\t[ext4]
"""


class FakeMap:
    """bpf_lookup_elem/bpf_delete_elem over a dict of kernel id -> addresses."""

    def __init__(self):
        self.slots: dict[int, list[int]] = {}

    def bpf_lookup_elem(self, fd, key, val):
        kid = ctypes.cast(key, ctypes.POINTER(ctypes.c_uint32)).contents.value
        if kid not in self.slots:
            return -1
        arr = ctypes.cast(val, ctypes.POINTER(ctypes.c_uint64 * stacks.MAX_DEPTH)).contents
        for i, ip in enumerate(self.slots[kid]):
            arr[i] = ip
        return 0

    def bpf_delete_elem(self, fd, key):
        self.slots.pop(ctypes.cast(key, ctypes.POINTER(ctypes.c_uint32)).contents.value, None)
        return 0


def _table(tmp_path):
    p = tmp_path / "kallsyms"
    p.write_bytes(KALLSYMS)
    m = FakeMap()
    return stacks.StackTable(3, m, stacks.Kallsyms(str(p))), m


IO = [0xFFFFFFFF81100010, 0xFFFFFFFF81100810, 0xFFFFFFFF81200683, 0xFFFFFFFFC010037C]
SLEEP = [0xFFFFFFFF81100010, 0xFFFFFFFF81100410, 0xFFFFFFFF81300020]


def test_frames_root_first_with_module_and_reason(tmp_path):
    t, m = _table(tmp_path)
    m.slots[0] = IO
    tail = t.tail(0)
    assert orjson.loads("{" + tail[1:] + "}") == {"stack_id": 1, "reason": "__iomap_dio_rw"}
    (r,) = t.take_pending()
    assert r["type"] == "stack" and r["stack_id"] == 1
    assert r["frames"] == "ext4_file_write_iter+0x37c [ext4];__iomap_dio_rw+0x683;io_schedule+0x10;__schedule+0x10"
    assert 0 not in m.slots, "the slot is freed once read"


def test_a_reused_kernel_id_gets_a_new_stream_id(tmp_path):
    t, m = _table(tmp_path)
    m.slots[0] = IO
    a = t.tail(0)
    m.slots[0] = SLEEP  # the kernel reused slot 0 for another stack
    b = t.tail(0)
    assert a != b and '"stack_id":2' in b and '"reason":"do_nanosleep"' in b
    m.slots[5] = IO  # the first stack again, under another kernel id: its stream id
    assert t.tail(5) == a
    assert [r["stack_id"] for r in t.take_pending()] == [1, 2]
    # a second wake-up with a slot the first one freed: the content last read there
    assert t.tail(5) == a and t.lost == 0
    assert t.tail(9) == "" and t.lost == 1


def test_a_slot_freed_and_taken_by_another_stack_after_a_task_blocked(tmp_path, monkeypatch):
    """Two tasks blocked with one stack (one kernel id); the first wake-up
    freed the slot and a third task's other stack took the id; the second
    wake-up, of a state that began before that free, gets the first stack."""
    now = [1_000]
    monkeypatch.setattr(stacks.time, "monotonic_ns", lambda: now[0])
    t, m = _table(tmp_path)
    m.slots[0] = IO
    a = t.tail(0, since=500)  # freed at 1000
    now[0] = 2_000
    m.slots[0] = SLEEP  # the id taken by another stack, at 1500
    assert t.tail(0, since=600) == a  # blocked at 600, before the free
    sleep = t.tail(0, since=1_500)  # the new stack's own wake-up: read and freed at 2000
    assert '"reason":"do_nanosleep"' in sleep
    assert t.tail(0, since=1_200) == sleep  # blocked after the first free, before the second
    assert t.tail(0, since=900) == a
    assert t.tail(0) == sleep and t.lost == 0  # not known when: the last read
    # blocked after the last free, and the slot empty since: not known
    assert t.tail(0, since=2_500) == "" and t.lost == 1


def test_contents_freed_again_in_a_row_are_one_entry_and_the_oldest_go(tmp_path, monkeypatch):
    now = [0]
    monkeypatch.setattr(stacks.time, "monotonic_ns", lambda: now[0])
    t, m = _table(tmp_path)
    io = sleep = None
    for i in range(3):  # the same stack freed three times: one entry, its time moved on
        now[0] = 1_000 + i
        m.slots[0] = IO
        io = t.tail(0, since=now[0])
    assert t.tail(0, since=900) == io  # blocked before the first of them: the same content
    for i in range(stacks.FREED_KEPT):  # contents taking turns: the oldest entries go
        now[0] = 2_000 + i
        m.slots[0] = SLEEP if i % 2 == 0 else IO
        got = t.tail(0, since=now[0])
        sleep = got if i == 0 else sleep
    assert t.lost == 0
    # the IO entry of 1000-1002 went: a task blocked then has a stack not known
    assert t.tail(0, since=900) == "" and t.lost == 1
    assert t.tail(0, since=1_500) == sleep  # the first free after 1500: SLEEP's at 2000


def test_reason_skips_plumbing():
    assert vocab.reason_of(["__schedule+0x1", "schedule+0x2", "schedule_hrtimeout_range_clock+0x3",
                             "do_epoll_wait+0x4"]) == "do_epoll_wait"
    assert vocab.reason_of(["__schedule+0x1", "io_schedule+0x2", "bit_wait_io+0x3", "__wait_on_bit+0x4",
                             "out_of_line_wait_on_bit+0x5", "jbd2_log_wait_commit+0x6 [jbd2]"]) == "jbd2_log_wait_commit"
    assert vocab.reason_of(["__schedule+0x1"]) == "__schedule"


def test_tracing_frames_of_a_tp_btf_program_are_left_out():
    """A tp_btf program's stack starts in the program and the kernel's call
    into it; the task's own frames, the same on both paths, start at __schedule."""
    tp_btf = ["bpf_prog_18a0a5255ad45d6f_tp_btf__sched_s+0xced [bpf]", "bpf_trace_run4+0x10d",
              "__schedule+0x628", "schedule+0x23", "futex_do_wait+0x46"]
    assert stacks.task_frames(tp_btf) == tp_btf[2:]
    assert stacks.task_frames(tp_btf[2:]) == tp_btf[2:]
    assert vocab.reason_of(stacks.task_frames(tp_btf)) == "futex_do_wait"


def test_symbols_read_in_the_background_name_the_same_frames(tmp_path):
    """Without symbols given, a StackTable reads them in a thread of its own
    (record --stacks writes its first line meanwhile): the same frames."""
    p = tmp_path / "kallsyms"
    p.write_bytes(KALLSYMS)
    bg = stacks.BackgroundKallsyms(str(p))
    now = stacks.Kallsyms(str(p))
    for ip in IO + SLEEP + [0x10, 0xFFFFFFFF81400010]:
        assert bg.frame(ip) == now.frame(ip)
    m = FakeMap()
    m.slots[0] = IO
    t = stacks.StackTable(3, m, bg)
    assert '"reason":"__iomap_dio_rw"' in t.tail(0)


def test_background_symbols_fail_at_once_for_a_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        stacks.BackgroundKallsyms(str(tmp_path / "none"))


def test_no_symbols_gives_addresses():
    assert stacks.Kallsyms(None).frame(0xFFFFFFFF81100010) == "0xffffffff81100010"


def test_a_function_is_named_not_the_section_bound_at_its_address(tmp_path):
    """Linux 6.1 lists __sched_text_start at __schedule's address (before or
    after it): a frame there is __schedule's, and its reason is not the bound."""
    for order in ((0, 1), (1, 0)):
        lines = [b"ffffffff81100000 T __sched_text_start", b"ffffffff81100000 T __schedule"]
        p = tmp_path / "kallsyms"
        p.write_bytes(b"\n".join([lines[order[0]], lines[order[1]],
                                  b"ffffffff81100400 T schedule",
                                  b"ffffffff81200000 t __iomap_dio_rw",
                                  b"ffffffff81200000 T __sched_text_end"]) + b"\n")
        ks = stacks.Kallsyms(str(p))
        assert ks.frame(0xFFFFFFFF81100010) == "__schedule+0x10"
        assert ks.frame(0xFFFFFFFF81200683) == "__iomap_dio_rw+0x683"
        m = FakeMap()
        m.slots[0] = [0xFFFFFFFF81100010, 0xFFFFFFFF81200683]
        assert '"reason":"__iomap_dio_rw"' in stacks.StackTable(3, m, ks).tail(0)

"""Decoding sched_switch's prev_state from the kernel's own print_fmt, for the
running kernel's format and for older and newer layouts."""

from __future__ import annotations

import os

import pytest

from pstate.kernel import kstates
from pstate.kernel.kstates import KernelStates, parse_print_fmt

# `print fmt:` of events/sched/sched_switch/format on Linux 6.1-6.18 (x86_64).
FMT_6X = (
    '"prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s next_pid=%d next_prio=%d", '
    "REC->prev_comm, REC->prev_pid, REC->prev_prio, (REC->prev_state & ((((0x00000000 | 0x00000001 | "
    "0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) - 1)) ? "
    "__print_flags(REC->prev_state & ((((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | "
    '0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) - 1), "|", { 0x00000001, "S" }, { 0x00000002, "D" }, '
    '{ 0x00000004, "T" }, { 0x00000008, "t" }, { 0x00000010, "X" }, { 0x00000020, "Z" }, { 0x00000040, "P" }, '
    '{ 0x00000080, "I" }) : "R", REC->prev_state & (((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | '
    '0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) ? "+" : "", REC->next_comm, '
    "REC->next_pid, REC->next_prio"
)

# A hypothetical newer kernel: one more state bit (0x100 "N") and an unknown
# letter (0x200 "Q"), so the preemption bit moves to 0x400.
FMT_NEWER = (
    '"prev_state=%s%s", (REC->prev_state & ((((0x0000 | 0x0001 | 0x0002 | 0x0004 | 0x0008 | 0x0010 | '
    "0x0020 | 0x0040 | 0x0080 | 0x0100) + 1) << 1) - 1)) ? __print_flags(REC->prev_state & ((((0x0000 | "
    '0x0001 | 0x0002 | 0x0004 | 0x0008 | 0x0010 | 0x0020 | 0x0040 | 0x0080 | 0x0100) + 1) << 1) - 1), "|", '
    '{ 0x0001, "S" }, { 0x0002, "D" }, { 0x0004, "T" }, { 0x0008, "t" }, { 0x0010, "X" }, { 0x0020, "Z" }, '
    '{ 0x0040, "P" }, { 0x0080, "I" }, { 0x0100, "N" }, { 0x0200, "Q" }) : "R", REC->prev_state & '
    "(((0x0000 | 0x0001 | 0x0002 | 0x0004 | 0x0008 | 0x0010 | 0x0020 | 0x0040 | 0x0080 | 0x0100) + 1) << 1) "
    '? "+" : ""'
)

# Linux 4.4 style: decimal values, TASK_STATE_MAX-1 as the mask, Z and X in the
# other order, K/W/N bits, and a bare (unparenthesised) preemption bit.
FMT_4_4 = (
    '"prev_comm=%s prev_pid=%d prev_prio=%d prev_state=%s%s ==> next_comm=%s next_pid=%d next_prio=%d", '
    "REC->prev_comm, REC->prev_pid, REC->prev_prio, REC->prev_state & (2048-1) ? "
    '__print_flags(REC->prev_state & (2048-1), "|", { 1, "S"} , { 2, "D" }, { 4, "T" }, { 8, "t" }, '
    '{ 16, "Z" }, { 32, "X" }, { 64, "x" }, { 128, "K" }, { 256, "W" }, { 512, "P" }, { 1024, "N" }) : "R", '
    'REC->prev_state & 2048 ? "+" : "", REC->next_comm, REC->next_pid, REC->next_prio'
)

# Linux 3.10 style: a smaller mask than the letters listed ("K", "W" and "P"
# lie outside it and are never printed).
FMT_3_10 = (
    '"prev_state=%s%s", REC->prev_state & (64-1) ? __print_flags(REC->prev_state & (64-1), "|", '
    '{ 1, "S"} , { 2, "D" }, { 4, "T" }, { 8, "t" }, { 16, "Z" }, { 32, "X" }, { 64, "x" }, { 128, "K" }, '
    '{ 256, "W" }, { 512, "P" }) : "R", REC->prev_state & 1024 ? "+" : ""'
)


def test_current_kernels_format():
    ks = parse_print_fmt(FMT_6X)
    assert ks.report_mask == 0xFF
    assert ks.preempt_bit == 0x100
    assert ks.default_letter == "R"
    assert ks.letters == {1: "S", 2: "D", 4: "T", 8: "t", 16: "X", 32: "Z", 64: "P", 128: "I"}
    assert ks.names == {1: "sleeping", 2: "uninterruptible", 4: "stopped", 8: "traced", 16: "dead",
                        32: "zombie", 64: "parked", 128: "idle"}


@pytest.mark.parametrize("prev_state, letter", [
    (0, "R"), (0x100, "R+"), (1, "S"), (2, "D"), (3, "S|D"), (0x101, "S+"), (0x80, "I"),
    (0x20, "Z"), (0x10, "X"), (0x402, "D"),  # bits outside the mask and the + bit are not printed
])
def test_letter_like_the_kernel_prints_it(prev_state, letter):
    assert parse_print_fmt(FMT_6X).letter(prev_state) == letter


def test_name_of_reported_bits():
    ks = parse_print_fmt(FMT_6X)
    assert ks.name(0) == "preempted"
    assert ks.name(0x100) == "preempted"  # the + bit alone: still runnable
    assert ks.name(2) == "uninterruptible"
    assert ks.name(3) == "sleeping"  # a combination is named by its lowest bit
    assert ks.bit_of("zombie") == 0x20
    assert ks.bit_of("waking") is None


def test_meta_lists_bits_and_the_preempt_bit():
    meta = parse_print_fmt(FMT_6X).meta()
    assert meta == {"0x1": "sleeping", "0x2": "uninterruptible", "0x4": "stopped", "0x8": "traced",
                    "0x10": "dead", "0x20": "zombie", "0x40": "parked", "0x80": "idle", "0x100": "+"}


def test_newer_kernel_with_more_bits():
    ks = parse_print_fmt(FMT_NEWER)
    assert ks.report_mask == 0x3FF
    assert ks.preempt_bit == 0x400
    assert ks.names[0x100] == "noload"
    assert ks.names[0x200] == "state_Q"  # a letter this pstate has never seen
    assert ks.letter(0x400) == "R+"
    assert ks.letter(0x200) == "Q"
    assert ks.letter(0x301) == "S|N|Q"


def test_linux_4_4_format():
    ks = parse_print_fmt(FMT_4_4)
    assert ks.report_mask == 2047
    assert ks.preempt_bit == 2048
    assert ks.names == {1: "sleeping", 2: "uninterruptible", 4: "stopped", 8: "traced", 16: "zombie",
                        32: "dead", 64: "dead", 128: "wakekill", 256: "waking", 512: "parked",
                        1024: "noload"}
    assert ks.letter(16) == "Z"
    assert ks.letter(2048) == "R+"
    assert ks.letter(130) == "D|K"


def test_linux_3_10_format_mask_smaller_than_the_letters():
    ks = parse_print_fmt(FMT_3_10)
    assert ks.report_mask == 63
    assert ks.preempt_bit == 1024
    assert ks.letter(1024) == "R+"
    assert ks.letter(64) == "R"
    assert ks.letter(128 | 1) == "S"
    assert ks.name(128) == "preempted"


@pytest.mark.parametrize("bad, why", [
    ('"prev_state=%d", REC->prev_state', "no __print_flags"),
    ('__print_flags(REC->prev_state & 3, "|") : "R"', "lists no state flags"),
    ('__print_flags(REC->prev_state & (3, "|", { 1, "S" }', "unbalanced"),
    ('__print_flags(REC->prev_state & (TASK_REPORT_MAX - 1), "|", { 1, "S" }) : "R"', "unexpected expression"),
    ('__print_flags(prev_state & 3, "|", { 1, "S" }) : "R"', "cannot find the prev_state mask"),
])
def test_unparseable_formats_raise_value_error(bad, why):
    with pytest.raises(ValueError, match=why):
        parse_print_fmt(bad)


def test_expression_evaluator_refuses_anything_but_integer_arithmetic():
    assert kstates._eval_int("((0x1 | 0x2) + 1) << 1") == 8
    for expr in ("__import__('os')", "1.5", "2 ** 3", "'a'"):
        with pytest.raises(ValueError):
            kstates._eval_int(expr)


def test_explicit_names_are_kept():
    ks = KernelStates(report_mask=1, preempt_bit=2, letters={1: "S"}, names={1: "custom"})
    assert ks.name(1) == "custom"


def test_read_kernel_states_from_a_tracefs_tree(tmp_path):
    fmt = tmp_path / "events/sched/sched_switch/format"
    fmt.parent.mkdir(parents=True)
    fmt.write_text("name: sched_switch\nID: 1\nformat:\n\tfield:long prev_state;\n\nprint fmt: " + FMT_4_4 + "\n")
    assert kstates.read_kernel_states(str(tmp_path)).preempt_bit == 2048
    fmt.write_text("name: sched_switch\n")
    with pytest.raises(ValueError, match="no print fmt"):
        kstates.read_kernel_states(str(tmp_path))


@pytest.mark.skipif(not kstates.tracefs_dir(), reason="tracefs is not mounted")
def test_running_kernel_decodes_to_known_names():
    ks = kstates.read_kernel_states()
    assert {"sleeping", "uninterruptible", "stopped", "zombie"} <= set(ks.names.values())
    assert ks.preempt_bit > ks.report_mask
    assert ks.letter(0) == "R"
    path = os.path.join(kstates.tracefs_dir(), kstates.SWITCH_FORMAT)
    line = next(ln for ln in open(path) if ln.startswith("print fmt:"))
    assert parse_print_fmt(line[len("print fmt:"):]) == ks

"""Decode sched_switch's prev_state the way the running kernel prints it.

The kernel's tracepoint format file holds the print_fmt that turns prev_state
bits into letters (S, D, T, t, X, Z, P, I; "R" when no bit is set; "+" for the
preemption bit). Parsing it, instead of hard-coding a table, keeps pstate right
when the kernel renumbers its states — the bug that makes perf 6.1 print "K"
for idle kernel threads on newer kernels.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

from pstate.stream import schema

TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
SWITCH_FORMAT = "events/sched/sched_switch/format"

_OPS = {ast.BitOr: operator.or_, ast.BitAnd: operator.and_, ast.Add: operator.add,
        ast.Sub: operator.sub, ast.LShift: operator.lshift, ast.RShift: operator.rshift}


def _eval_int(expr: str) -> int:
    """Evaluate a constant integer expression of the print_fmt (hex, | & + - << >>)."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError(f"unexpected expression in print_fmt: {expr!r}")

    return ev(ast.parse(expr.strip(), mode="eval"))


def _balanced(text: str, start: int) -> str:
    """The parenthesised expression that opens at text[start] == '('."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
    raise ValueError("unbalanced parentheses in print_fmt")


@dataclass
class KernelStates:
    """How this kernel reports prev_state."""

    report_mask: int  # bits that name a sleeping/stopped/dead state
    preempt_bit: int  # the "+" bit: preempted inside the kernel
    letters: dict[int, str]  # single bit -> letter
    default_letter: str = "R"
    names: dict[int, str] = field(default_factory=dict)  # single bit -> state name

    def __post_init__(self):
        if not self.names:
            self.names = {bit: schema.letter_name(letter) for bit, letter in self.letters.items()}

    def letter(self, prev_state: int) -> str:
        """The kernel's own rendering, e.g. "S", "D", "R+", "S|D"."""
        bits = prev_state & self.report_mask
        if bits:
            s = "|".join(letter for bit, letter in sorted(self.letters.items()) if bits & bit)
        else:
            s = self.default_letter
        if prev_state & self.preempt_bit:
            s += "+"
        return s

    def name(self, bits: int) -> str:
        """State name for reported bits (0 means runnable: preempted)."""
        bits &= self.report_mask
        if not bits:
            return schema.PREEMPTED
        low = bits & -bits  # lowest set bit names a combination
        return self.names.get(low, f"state_0x{bits:x}")

    def bit_of(self, name: str) -> int | None:
        for bit, n in self.names.items():
            if n == name:
                return bit
        return None

    def meta(self) -> dict:
        """The kernel_states field of a meta record."""
        out = {f"0x{bit:x}": name for bit, name in sorted(self.names.items())}
        out[f"0x{self.preempt_bit:x}"] = "+"
        return out


def parse_print_fmt(fmt: str) -> KernelStates:
    """Parse the sched_switch print fmt line (the part after "print fmt:")."""
    m = re.search(r"__print_flags\(", fmt)
    if not m:
        raise ValueError("sched_switch print_fmt has no __print_flags()")
    call = _balanced(fmt, m.end() - 1)
    pairs = re.findall(r"\{\s*(0x[0-9a-fA-F]+|\d+)\s*,\s*\"([^\"]*)\"\s*\}", call)
    if not pairs:
        raise ValueError("sched_switch print_fmt lists no state flags")
    letters = {int(v, 0): s for v, s in pairs}
    # The mask is the first argument of __print_flags: "REC->prev_state & (EXPR)".
    first = call[1:].split(",", 1)[0]
    mm = re.search(r"REC->prev_state\s*&\s*", first)
    if not mm:
        raise ValueError("cannot find the prev_state mask in print_fmt")
    rest = first[mm.end():]
    mask = _eval_int(_balanced(rest, 0) if rest.startswith("(") else rest)
    # Default letter for no bits: the string after ") :" that ends the ternary.
    dm = re.search(r"\)\s*:\s*\"([^\"]*)\"", fmt[m.start():])
    default = dm.group(1) if dm else "R"
    # The preemption flag: 'REC->prev_state & (EXPR) ? "+"', or a bare
    # number on older kernels ('REC->prev_state & 2048 ? "+"').
    pm = re.search(r"REC->prev_state\s*&\s*(\(.*?\)|0x[0-9a-fA-F]+|\d+)\s*\?\s*\"\+\"",
                   fmt[m.start() + len(call):])
    if pm and not pm.group(1).startswith("("):
        preempt = int(pm.group(1), 0)
    elif pm:
        expr = pm.group(1)
        # the lazy match may stop early: rebalance from its start
        start = fmt.index(expr, m.start() + len(call))
        preempt = _eval_int(_balanced(fmt, start))
    else:
        preempt = mask + 1
    return KernelStates(report_mask=mask, preempt_bit=preempt, letters=letters, default_letter=default)


def tracefs_dir() -> str | None:
    import os

    for d in TRACEFS_DIRS:
        if os.path.exists(os.path.join(d, "events/sched")):
            return d
    return None


def read_kernel_states(tracefs: str | None = None) -> KernelStates:
    """KernelStates of the running kernel (needs tracefs mounted)."""
    tracefs = tracefs or tracefs_dir()
    if not tracefs:
        raise FileNotFoundError("tracefs is not mounted")
    with open(f"{tracefs}/{SWITCH_FORMAT}") as f:
        text = f.read()
    line = next((ln for ln in text.splitlines() if ln.startswith("print fmt:")), None)
    if line is None:
        raise ValueError("sched_switch format has no print fmt")
    return parse_print_fmt(line[len("print fmt:"):])

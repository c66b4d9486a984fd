"""Loading and attaching the tp_btf programs of a module BCC compiled, and
reading which tracepoints a source attaches.

BCC compiles a tp_btf program (PSTATE_PROBE on the tp_btf path, bpf/tpargs.h:
`int tp_btf__<event>(u64 *ctx)`) like any function; its loader knows no tp_btf
target for a tracepoint, so the instructions (map fds already in place) are
loaded here with plain bpf(2) calls, BPF_PROG_TYPE_TRACING with attach type
BPF_TRACE_RAW_TP and the btf_trace_<event> typedef of the kernel's BTF as the
attach target, and attached with BPF_RAW_TRACEPOINT_OPEN. Which tracepoints
are taken that way is the plan's (pstate.kernel.probeplan).
"""

from __future__ import annotations

import contextlib
import os
import re

from pstate.kernel import bpfsys
from pstate.kernel.probeplan import Refused

PREFIX = "tp_btf__"  # the function of a tp_btf probe: PREFIX + event (bpf/tpargs.h)

_PROBE = re.compile(r"^PSTATE_PROBE\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)", re.M)
_COND = re.compile(r"^\s*#\s*(ifdef|ifndef|if|elif|else|endif|define|undef)\b\s*(\w*)")


def active_source(text: str, defines: dict) -> str:
    """text with the lines that `defines` (the -D settings: a name is defined
    unless its value is None or False) leave out of an #ifdef or #ifndef
    blanked, so that probes_in() names only the programs that compile; the
    text's own #define and #undef lines count from where they stand. An #if
    or #elif keeps every branch (no probe is put under one)."""
    defined = {k for k, v in defines.items() if v is not None and v is not False}
    stack: list[tuple[bool, bool]] = []  # (this branch kept, the #if's branches are all kept)
    out = []
    for line in text.split("\n"):
        m = _COND.match(line)
        outer = all(kept for kept, _ in stack)
        if m:
            kind, name = m.groups()
            if kind == "define" and outer:
                defined.add(name)
            elif kind == "undef" and outer:
                defined.discard(name)
            elif kind in ("ifdef", "ifndef"):
                stack.append(((name in defined) == (kind == "ifdef"), False))
            elif kind == "if":
                stack.append((True, True))
            elif kind in ("else", "elif") and stack:
                kept, both = stack[-1]
                stack[-1] = (both or not kept, both)
            elif kind == "endif" and stack:
                stack.pop()
            out.append(line)
            continue
        out.append(line if outer else "")
    return "\n".join(out)


def probes_in(text: str) -> list[str]:
    """The events a source attaches through PSTATE_PROBE."""
    return [event for _cat, event in _PROBE.findall(text)]


def events_of(text: str):
    """events_of(defines) for probeplan.plan: the events the source attaches
    with those -D settings."""
    return lambda defines: probes_in(active_source(text, defines))


def load_one(insns: bytes, name: str, btf_id: int, license: str = "GPL", kern_version: int = 0) -> int:
    """Load a tp_btf program; its fd, or Refused with the verifier's last
    words (PSTATE_VERIFIER_LOG=FILE: all of them, in FILE)."""
    fd, _ = bpfsys.prog_load(bpfsys.PROG_TRACING, insns, license, kern_version, name, attach_btf_id=btf_id)
    if fd >= 0:
        return fd
    err = os.strerror(-fd)
    _, log = bpfsys.prog_load(bpfsys.PROG_TRACING, insns, license, kern_version, name, log_size=1 << 22,
                              attach_btf_id=btf_id)
    if os.environ.get("PSTATE_VERIFIER_LOG"):
        with open(os.environ["PSTATE_VERIFIER_LOG"], "a") as f:
            f.write(f"--- {name}: {err}\n{log}\n")
    last = " / ".join(line for line in log.strip().splitlines()[-3:] if line)
    event = name[len(PREFIX):] if name.startswith(PREFIX) else name
    raise Refused({event: f"{name}: {err}" + (f" ({last})" if last else "")})


def attach_one(prog_fd: int, name: str) -> int:
    """Attach a loaded tp_btf program; the link fd (closing it detaches), or Refused."""
    try:
        return bpfsys.attach_raw_tracepoint(prog_fd, None)
    except OSError as e:
        raise Refused({name[len(PREFIX):]: f"{name}: attaching failed: {e.strerror}"}) from None


class Attached:
    """The tp_btf programs of one compiled module, loaded and attached."""

    def __init__(self):
        self.prog_fds: dict[str, int] = {}  # event -> program fd
        self.link_fds: dict[str, int] = {}  # event -> link fd

    def detach(self) -> None:
        for fd in self.link_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.link_fds.clear()

    def close(self) -> None:
        self.detach()
        for fd in self.prog_fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.prog_fds.clear()


def attach_module(bpf, targets: dict) -> Attached:
    """Load and attach the tp_btf functions of a BCC module, one per event of
    targets (event -> BTF id of its attach target); Refused, naming every
    event the kernel would not take (with everything closed again)."""
    out = Attached()
    refused: dict = {}
    try:
        for event in targets:
            name = PREFIX + event
            insns = bytes(bpf.dump_func(name.encode()))
            try:
                out.prog_fds[event] = load_one(insns, name, targets[event])
            except Refused as e:
                refused.update(e.why)
        if refused:
            raise Refused(refused)
        for event, fd in out.prog_fds.items():
            out.link_fds[event] = attach_one(fd, PREFIX + event)
    except BaseException:
        out.close()
        raise
    return out

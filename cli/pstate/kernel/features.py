"""What this kernel's BPF can do that pstate needs, found by trying it (a
feature probe), never read off its version: distributions backport BPF
features (RHEL 8's 4.18 has the ring buffer), and a version says nothing of
a kernel's configuration.

Each probe creates the smallest object that has the feature and closes it
again; each runs once per process. What needs what:

- record: the BPF ring buffer (BPF_MAP_TYPE_RINGBUF, Linux 5.8).
- the snap collector (`snap --start`): BPF links it can pin, for each way
  the plan attaches a tracepoint: a raw or tp_btf tracepoint's attachment is
  a link from Linux 5.7; a classic tracepoint's program is linked to its
  perf event with BPF_LINK_CREATE from Linux 5.15.

A kernel without one gets one clear refusal naming the feature, what needs
it and what still works (requirement()).
"""

from __future__ import annotations

import contextlib
import functools
import os
import struct

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import bpfsys

RINGBUF = "ringbuf"
RAW_TP_LINK = "raw_tp_link"
PERF_LINK = "perf_link"

# feature -> (what it is, where it first came, what lacks it, what still works)
FEATURES = {
    RINGBUF: ("BPF ring buffer (BPF_MAP_TYPE_RINGBUF)", "Linux 5.8", "pstate record passes its events through one",
              "pstate snap needs no ring buffer"),
    RAW_TP_LINK: ("BPF links for raw and tp_btf tracepoints", "Linux 5.7",
                  "the snap collector (snap --start) pins its attachments as links",
                  "pstate snap --dir DIR and record work without it"),
    PERF_LINK: ("BPF links for classic tracepoints (BPF_LINK_CREATE on a perf event)", "Linux 5.15",
                "the snap collector pins a classic tracepoint's attachment as a link",
                "--probes auto takes tp_btf or raw tracepoints, which this kernel may link"),
}

_EXIT0 = struct.pack("<BBhi", 0xB7, 0, 0, 0) + struct.pack("<BBhi", 0x95, 0, 0, 0)  # r0 = 0; exit


def _ringbuf() -> str | None:
    try:
        fd = bpfsys.map_create(bpfsys.MAP_RINGBUF, 0, 0, os.sysconf("SC_PAGE_SIZE"), 0, "pstate_probe")
    except OSError as e:
        return os.strerror(e.errno)
    os.close(fd)
    return None


def _program(prog_type: int) -> int:
    fd, _log = bpfsys.prog_load(prog_type, _EXIT0, "GPL", 0, "pstate_probe")
    if fd < 0:
        raise OSError(-fd, os.strerror(-fd))
    return fd


def _raw_tp_link() -> str | None:
    """A raw tracepoint's attachment is a link (pinnable) where its fd is one."""
    try:
        prog = _program(bpfsys.PROG_RAW_TRACEPOINT)
    except OSError as e:
        return f"loading a raw tracepoint program: {e.strerror}"
    try:
        fd = bpfsys.attach_raw_tracepoint(prog, "sched_switch")
    except OSError as e:
        os.close(prog)
        return f"attaching it: {e.strerror}"
    try:
        kind = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as e:
        kind = e.strerror
    finally:
        os.close(fd)
        os.close(prog)
    return None if kind == "anon_inode:bpf_link" else f"its attachment is {kind}, no link"


def _perf_link() -> str | None:
    from pstate.kernel import kstates, pins

    tracefs = kstates.tracefs_dir()
    if tracefs is None:
        return "tracefs is not mounted"
    try:
        prog = _program(bpfsys.PROG_TRACEPOINT)
    except OSError as e:
        return f"loading a tracepoint program: {e.strerror}"
    try:
        fd = pins.perf_link(prog, tracefs, "sched", "sched_switch")
    except OSError as e:
        return e.strerror or str(e)
    finally:
        os.close(prog)
    os.close(fd)
    return None


PROBES = {RINGBUF: _ringbuf, RAW_TP_LINK: _raw_tp_link, PERF_LINK: _perf_link}


@functools.lru_cache(maxsize=None)
def missing(feature: str) -> str | None:
    """Why this kernel lacks a feature (the probe's error), or None when it has it."""
    with contextlib.suppress(KeyError):
        return PROBES[feature]()
    raise ValueError(f"no probe for {feature!r}")


def requirement(feature: str) -> PstateError | None:
    """The refusal to raise where a feature is missing, or None."""
    why = missing(feature)
    if why is None:
        return None
    what, since, need, still = FEATURES[feature]
    return PstateError(f"this kernel has no {what}: {need} (it came with {since}, or a backport; "
                       f"the probe said: {why})",
                       ExitCode.UNAVAILABLE, hint=still)


def require(*features: str) -> None:
    """PstateError for the first feature this kernel lacks."""
    for f in features:
        err = requirement(f)
        if err is not None:
            raise err

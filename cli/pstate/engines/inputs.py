"""What stats and heat read, told apart in one place: snapshots (pstate
snap's directories, and files whose name or meta record says snap) or an
event stream (recordings, a pipe, standard input); and of a stream's
sources, which are regular files (read to their end, in recorded time) and
which are pipes (read as they come, with Ctrl-C reaching both ends)."""

from __future__ import annotations

import os
import stat
import sys

from pstate.snapshots import snapdir

SNAPSHOTS, EVENTS, MIXED = "snapshots", "events", "mixed"


def kind(paths: list[str]) -> str:
    """SNAPSHOTS when every path is a snapshot source, EVENTS when none is,
    MIXED otherwise (no command reads both at once)."""
    flags = [snapdir.is_snapshot_source(p) for p in paths]
    if flags and all(flags):
        return SNAPSHOTS
    return MIXED if any(flags) else EVENTS


def stdin_is_terminal(paths: list[str]) -> bool:
    """Whether the input is standard input and that is a terminal (nothing
    piped in: a command says so instead of waiting)."""
    return "-" in paths and sys.stdin.isatty()


def _mode(src: str) -> int | None:
    try:
        st = os.fstat(sys.stdin.fileno()) if src == "-" else os.stat(src)
    except (OSError, ValueError):
        return None
    return st.st_mode


def is_regular(src: str) -> bool:
    mode = _mode(src)
    return mode is not None and stat.S_ISREG(mode)


def is_pipe(src: str) -> bool:
    mode = _mode(src)
    return mode is not None and (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode))


def any_pipe(paths: list[str]) -> bool:
    return any(is_pipe(p) for p in paths)

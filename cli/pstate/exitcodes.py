"""Exit codes of every pstate command, and the error type that carries one.

The numbers follow sysexits(3) where one fits, so scripts and cron can tell a
bad input file from a missing privilege from a busy output directory.
"""

from __future__ import annotations

import enum

import click


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1  # generic failure (a closed output pipe, as in `pstate ... | head`, is a normal end: 0)
    USAGE = 2  # bad command line (click's own code)
    LOSS = 3  # record --strict: events were lost
    DATAERR = 65  # input unreadable, malformed (with --strict) or of a newer schema
    NOINPUT = 66  # an input file does not exist or cannot be opened
    UNAVAILABLE = 69  # bcc, kernel headers, tracefs or a tracepoint is missing
    SOFTWARE = 70  # internal error (a bug: please report it)
    OSERR = 71  # the kernel refused: BPF load or attach failed
    CANTCREAT = 73  # an output file cannot be created (e.g. disk full)
    IOERR = 74  # writing output failed
    TEMPFAIL = 75  # another instance holds the lock; try again later
    NOPERM = 77  # not enough privilege, or an unsafe output directory
    SIGINT = 130  # snap interrupted by Ctrl-C before a snapshot was published
    SIGTERM = 143  # snap interrupted by SIGTERM before a snapshot was published


class PstateError(click.ClickException):
    """A user-facing error: one message on stderr, a named exit code, no traceback."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE, hint: str | None = None):
        if hint:
            message = f"{message}\n  fix: {hint}"
        super().__init__(message)
        self.exit_code = int(code)

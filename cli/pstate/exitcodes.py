"""Exit codes of every pstate command, and the error type that carries one.

The numbers follow sysexits(3) where one fits, so scripts and cron can tell a
bad input file from a missing privilege from a busy output directory.
"""

from __future__ import annotations

import enum

import click


class ExitCode(enum.IntEnum):
    """The exit codes; MEANINGS (below) says what each means."""

    OK = 0
    FAILURE = 1
    USAGE = 2
    LOSS = 3
    DATAERR = 65
    NOINPUT = 66
    UNAVAILABLE = 69
    SOFTWARE = 70
    OSERR = 71
    CANTCREAT = 73
    IOERR = 74
    TEMPFAIL = 75
    NOPERM = 77
    SIGINT = 130
    SIGTERM = 143


class PstateError(click.ClickException):
    """A user-facing error: one message on stderr, a named exit code, no traceback."""

    def __init__(self, message: str, code: ExitCode = ExitCode.FAILURE, hint: str | None = None):
        if hint:
            message = f"{message}\n  fix: {hint}"
        super().__init__(message)
        self.exit_code = int(code)


# What each exit code means (the EXIT STATUS sections of the man pages)
MEANINGS = {
    ExitCode.OK: "Success.",
    ExitCode.FAILURE: "Generic failure.",
    ExitCode.USAGE: "Bad command line: an unknown option, a bad value or a missing argument.",
    ExitCode.LOSS: "`record --strict`: events were lost.",
    ExitCode.DATAERR: "Input unreadable or of a newer schema; with `--strict` also any malformed, "
                      "truncated or skipped input line.",
    ExitCode.NOINPUT: "An input file does not exist or cannot be opened.",
    ExitCode.UNAVAILABLE: "bcc, kernel headers, tracefs or a needed tracepoint is missing; "
                          "`pstate doctor` says how to fix it.",
    ExitCode.SOFTWARE: "Internal error: a bug, please report it.",
    ExitCode.OSERR: "The kernel refused: loading or attaching the BPF program failed.",
    ExitCode.CANTCREAT: "An output file cannot be created (for example, the disk is full).",
    ExitCode.IOERR: "Writing the output failed.",
    ExitCode.TEMPFAIL: "Another instance holds the lock; try again later.",
    ExitCode.NOPERM: "Not enough privilege (root, or CAP_BPF and CAP_PERFMON), "
                     "or an unsafe output directory.",
    ExitCode.SIGINT: "Interrupted by Ctrl-C before a snapshot was published.",
    ExitCode.SIGTERM: "Interrupted by SIGTERM before a snapshot was published.",
}

_BPF_EXIT = {
    ExitCode.UNAVAILABLE: MEANINGS[ExitCode.UNAVAILABLE],
    ExitCode.OSERR: MEANINGS[ExitCode.OSERR],
    ExitCode.NOPERM: "Not enough privilege: run as root, or with CAP_BPF and CAP_PERFMON "
                     "(kernel 5.8 or later).",
}

_READER_EXIT = {
    ExitCode.DATAERR: MEANINGS[ExitCode.DATAERR],
    ExitCode.NOINPUT: MEANINGS[ExitCode.NOINPUT],
}

# What an exit code means for one command, where it says more than MEANINGS
BY_COMMAND = {
    "record": {
        **_BPF_EXIT,
        ExitCode.NOPERM: "Not enough privilege: run as root, or with CAP_BPF and CAP_PERFMON "
                         "(kernel 5.8 or later); or `-o FILE` is a link, another user's file or "
                         "a file with several links; or the kernel header tree is not safe to "
                         "compile as root (see FILES).",
        ExitCode.CANTCREAT: "`-o FILE` cannot be created, or nobody reads the FIFO FILE.",
        ExitCode.LOSS: "`--strict` was given and events were lost.",
        ExitCode.IOERR: "Writing the output failed (a closed pipe is not an error).",
    },
    "snap": {
        **_BPF_EXIT,
        ExitCode.CANTCREAT: "The output directory or a snapshot file cannot be created "
                            "(for example, the disk is full); earlier snapshots are left intact.",
        ExitCode.IOERR: "Writing a snapshot failed.",
        ExitCode.NOPERM: "Not enough privilege, or the output directory is unsafe: a symlink, "
                         "group- or world-writable, or owned by another user.",
        ExitCode.TEMPFAIL: "Another pstate snap holds the lock of the output directory.",
        ExitCode.SIGINT: "Interrupted by Ctrl-C before the interval's snapshot was published "
                         "(the partial file is removed).",
        ExitCode.SIGTERM: "Interrupted by SIGTERM before the interval's snapshot was published "
                          "(the partial file is removed).",
    },
    "replay": {**_READER_EXIT, ExitCode.IOERR: MEANINGS[ExitCode.IOERR]},
    "stats": {
        **_READER_EXIT,
        ExitCode.UNAVAILABLE: "Snapshot analysis is not available in this build of pstate.",
        ExitCode.SIGINT: "Interrupted by Ctrl-C (the second one while reading a pipe); the "
                         "summary of the input read so far has been printed.",
    },
    "heat": {
        **_READER_EXIT,
        ExitCode.OK: "Success; also when Ctrl-C or q ends `--live`.",
        ExitCode.SIGTERM: "`--live` ended by SIGTERM (SIGHUP: 129); the terminal is restored.",
    },
    "doctor": {
        ExitCode.OK: "Every check passed (a skipped live test is a warning): record and snap can run.",
        ExitCode.UNAVAILABLE: "A required piece is missing: bcc, kernel headers, tracefs, "
                              "a tracepoint, or the kernel's state format cannot be parsed.",
        ExitCode.OSERR: "Everything was found but the live test failed: the BPF program did not "
                        "compile, attach or report correctly decoded events.",
        ExitCode.NOPERM: "Not root and no CAP_BPF and CAP_PERFMON (other checks still run).",
    },
}

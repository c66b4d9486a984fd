"""record -- CMD: the command record runs and records, with every process
it forks. It is forked at once and waits on a pipe for the word to exec, so
that the kernel side follows it before it runs; record's loop reaps it
(Command.exited()) and record exits with its status."""

from __future__ import annotations

import os
import shutil
import sys

from pstate import lifecycle
from pstate.exitcodes import ExitCode, PstateError


def check(command: tuple) -> None:
    if not (os.sep in command[0] or shutil.which(command[0])):
        raise PstateError(f"{command[0]}: command not found", ExitCode.USAGE,
                          hint="give the command after --, as a path or a name on PATH")


class Command:
    """record -- CMD: CMD forked at once, waiting on a pipe for the word to
    exec (so that the kernel side follows it before it runs), then reaped
    by the recorder's loop (exited())."""

    def __init__(self, argv: tuple, to_stderr: bool):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: exec or _exit, nothing else
            try:
                os.close(w)
                go = os.read(r, 1)
                os.close(r)
                if go:
                    if to_stderr:
                        os.dup2(2, 1)  # the stream has standard output
                    lifecycle.before_exec()
                    os.execvp(argv[0], list(argv))
            except OSError as e:
                os.write(2, f"pstate record: cannot run {argv[0]}: {e.strerror}\n".encode())
                os._exit(127)
            finally:
                os._exit(127)
        os.close(r)
        self.pid = pid
        self.argv = argv
        self._w = w
        self.status: int | None = None
        self.started = False  # go() was said: CMD runs

    def go(self) -> None:
        os.write(self._w, b"g")
        self.started = True
        self.release_pipe()

    def release_pipe(self) -> None:
        if self._w is not None:
            os.close(self._w)
            self._w = None

    def exited(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is not None

    def exit_code(self, code: int, quiet: bool) -> int:
        """CMD's status (128 + N for signal N), or record's own when CMD
        exited 0 and record had a reason to fail (--strict and loss)."""
        if not self.exited():
            if not quiet:
                print(f"pstate record: {self.argv[0]} (pid {self.pid}) is still running", file=sys.stderr)
            return code
        status = self.status if self.status >= 0 else 128 - self.status
        return status or code

    def release(self) -> None:
        """Never started (an error came first): the closed pipe makes it exit."""
        if self._w is not None:
            self.release_pipe()
            os.waitpid(self.pid, 0)
            self.status = 127

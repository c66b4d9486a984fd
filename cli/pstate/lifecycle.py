"""Signals, from a process's first line to its exit: the one place pstate
handles them.

entry.run() calls install() before it imports anything else. From then on
SIGINT, SIGTERM and SIGHUP never kill pstate half-way, nor raise where it
cannot clean up: each is noted, and wakes wakeup_fd(). A command meets the
signals that came, during its start-up too, at points of its choosing:

- a loop polls them (record, heat --live; snap through a Stopper): take()
  hands out the signals noted since the last take(), wait() sleeps until a
  deadline or a signal, wakeup_fd() is readable once one came (for
  select()); or, within `with handled(fn):`, has fn called at each one
  (replay);
- a reader stops wherever it is (stats, heat, export, doctor): within
  `with interruptible():` a signal, noted before or arriving, raises at
  once: SIGINT as Interrupted (a KeyboardInterrupt), SIGTERM and SIGHUP as
  Terminated. interruptible(pass_sigint=1) lets the first SIGINT by (stats
  reading a pipe: `pstate record`, which gets the Ctrl-C too, ends the
  stream, and stats then prints).

A signal no command took is the exit status on the way out (main:
exit_code(): 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP). watch()
notes one more signal the same way (SIGWINCH for heat --live, SIGUSR1 for
record --flight). In a forked child, before_exec() gives CMD the default
actions, worker() makes a helper process leave Ctrl-C to its parent.
Without install() (pstate's code called in another program, the tests'
CliRunner) nothing is noted and interruptible() leaves Python's own
KeyboardInterrupt as it is.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# exitcodes.ExitCode.SIGINT and .SIGTERM (that module imports click, which
# takes a while: this one imports nothing of pstate's; tests/contract/test_lifecycle.py
# holds the two equal)
CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class Interrupted(KeyboardInterrupt):
    """SIGINT within an interruptible() region."""

    signum = signal.SIGINT


class Terminated(BaseException):
    """SIGTERM or SIGHUP within an interruptible() region."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _State:
    installed = False
    noted: list = []  # signals noted and not yet taken, in order
    first: int | None = None  # the first stopping signal noted
    raising = 0  # depth of interruptible() regions
    handler = None  # handled()'s function
    pass_sigint = 0  # SIGINTs an interruptible() region lets by
    wake_r = wake_w = -1
    watched: dict = {}  # extra signal -> its previous handler


_S = _State()


def install() -> None:
    """Note SIGINT, SIGTERM and SIGHUP from now on (the main thread; once)."""
    if _S.installed:
        return
    _S.wake_r, _S.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(_S.wake_w, warn_on_full_buffer=False)
    for s in STOPPING:
        signal.signal(s, _on_signal)
    _S.installed = True


def installed() -> bool:
    return _S.installed


def _on_signal(signum: int, _frame) -> None:
    if signum in STOPPING and _S.first is None:
        _S.first = signum
    if _S.handler is not None and signum in STOPPING:
        _S.handler(signum)
        return
    _S.noted.append(signum)
    if _S.raising:
        _raise_noted()


def _raise_noted() -> None:
    """Raise the first stopping signal noted (taking it); watched ones stay for take()."""
    while True:
        i = next((i for i, s in enumerate(_S.noted) if s in STOPPING), None)
        if i is None:
            return
        s = _S.noted.pop(i)
        if s == signal.SIGINT and _S.pass_sigint > 0:
            _S.pass_sigint -= 1
            continue
        raise Interrupted() if s == signal.SIGINT else Terminated(s)


@contextlib.contextmanager
def interruptible(pass_sigint: int = 0):
    """A region a signal ends at once (raising Interrupted or Terminated),
    one noted before it began too; the first pass_sigint SIGINTs (noted
    before or arriving) are let by."""
    if not _S.installed:
        yield
        return
    _S.pass_sigint, saved = pass_sigint, _S.pass_sigint
    _S.raising += 1
    try:
        _raise_noted()
        yield
    finally:
        _S.raising -= 1
        _S.pass_sigint = saved


@contextlib.contextmanager
def handled(fn):
    """A region in which fn(signum) runs at each stopping signal, the ones
    noted before it began first (taken): a loop that marks the signal and
    stops where it may (replay ends between two records, and at once while
    it sleeps or waits for input: fn may raise). fn runs where any Python
    signal handler does: in the main thread, between two bytecodes."""
    if not _S.installed:
        yield
        return
    saved, _S.handler = _S.handler, fn
    try:
        for s in [s for s in _S.noted if s in STOPPING]:
            _S.noted.remove(s)
            fn(s)
        yield
    finally:
        _S.handler = saved


def take() -> list[int]:
    """The signals noted since the last take() (stopping and watched), in order."""
    out, _S.noted = _S.noted, []
    _drain()
    return out


def peek() -> tuple[int, ...]:
    """The signals noted that no take() handed out yet, left where they are."""
    return tuple(_S.noted)


def first() -> int | None:
    """The first stopping signal this process was sent, taken or not."""
    return _S.first


def code_of(signum: int) -> int:
    """A stopping signal's exit status: 130 (SIGINT), 143 (SIGTERM), 128 + N."""
    return CODES.get(signum, 128 + int(signum))


def exit_code() -> int | None:
    """The exit status of the first stopping signal no command took, or None."""
    left = [s for s in _S.noted if s in STOPPING]
    return code_of(left[0]) if left else None


def block() -> None:
    """The run is over: the stopping signals wait, unseen, until the exit
    (the interpreter puts the default actions back while it finalizes, and
    one then would kill the process after its work was done)."""
    if _S.installed:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)


@contextlib.contextmanager
def finishing():
    """The step that makes the work whole (publishing a file): a signal noted
    before it ends the run there (raised, as in interruptible()); one that
    comes from then on waits, unseen, until the exit, and the exit status is
    the command's."""
    block()
    with interruptible():
        pass
    yield
    take()


def done() -> None:
    """The command's work is out (its trailer written): a signal changes
    nothing from now on (blocked until the exit), and one noted meanwhile is
    taken: the exit status is the command's."""
    block()
    take()


def wakeup_fd() -> int | None:
    """A descriptor readable once a signal came (None without install())."""
    return _S.wake_r if _S.installed else None


def _drain() -> None:
    if _S.installed:
        with contextlib.suppress(OSError):
            while os.read(_S.wake_r, 256):
                pass


def wait(deadline_ns: int) -> bool:
    """Sleep until the monotonic deadline; True at once when a signal was
    noted (before or meanwhile), for take()."""
    while not _S.noted:
        left = deadline_ns - time.monotonic_ns()
        if left <= 0:
            return False
        if not _S.installed:
            time.sleep(min(left / 1e9, 0.05))
            continue
        ready, _w, _x = select.select([_S.wake_r], [], [], left / 1e9)
        if ready:
            _drain()
    return True


class Stopper:
    """A loop's stop (snapshots.writer.Snapper): the first stopping signal
    taken ends it, one noted while the command started too; nothing is
    interrupted half-way (a snapshot being written is finished or removed)."""

    def __init__(self):
        self.signum: int | None = None

    def _poll(self) -> None:
        for s in take():
            if s in STOPPING and self.signum is None:
                self.signum = s

    @property
    def stopped(self) -> bool:
        self._poll()
        return self.signum is not None

    def exit_code(self) -> int:
        """130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP)."""
        return code_of(self.signum or 0)

    def wait_until(self, deadline_ns: int) -> bool:
        """Sleep until the monotonic deadline; True if a signal came first."""
        while not self.stopped:
            if not wait(deadline_ns):
                return self.stopped
        return True


def watch(signum: int) -> None:
    """Note one more signal (SIGWINCH, SIGUSR1) for take(); unwatch() ends it."""
    if signum not in _S.watched:
        _S.watched[signum] = signal.signal(signum, _on_signal)


def unwatch(signum: int) -> None:
    if signum in _S.watched:
        signal.signal(signum, _S.watched.pop(signum))


def before_exec() -> None:
    """In a forked child about to exec another program: the default actions."""
    for s in (*STOPPING, *_S.watched):
        signal.signal(s, signal.SIG_DFL)


def worker() -> None:
    """In a forked helper process: Ctrl-C is the parent's to handle; SIGTERM
    and SIGHUP end it as they end any process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)

"""The paths pstate writes below are walked one directory at a time, never
re-resolved by name: a user who owns a directory on the way to -o, and
swaps one of its subdirectories for a link to a root-only directory
(renameat2 RENAME_EXCHANGE) while root's pstate opens, creates or discards
the output, never makes root create, truncate or unlink a file in that
root-only directory. Played deterministically (the swap made before each
file-system call of one open, in turn) and live (nobody swapping in a loop
while root opens and discards in a loop), for -o (open_output, discard),
export's replacement file, a snapshot --dir and the program cache.

Needs root (chown to nobody, setuid in a forked child); in CI a missing root
fails them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from conftest import IN_CI
from pstate.exitcodes import ExitCode, PstateError
from pstate import trust
from pstate.kernel import progcache
from pstate.snapshots import writer
from pstate.stream import outfiles

NOBODY = 65534
SYS_RENAMEAT2 = 316  # x86-64
AT_FDCWD = -100
RENAME_EXCHANGE = 2
SECRET = b"root's data\n"
# the file-system calls a walk or an open by name makes; the swap is made
# just before one of them
FS_CALLS = ("open", "lstat", "stat", "unlink", "rename", "readlink", "mkdir", "chmod", "chown")

_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture(autouse=True)
def need_root(monkeypatch):
    if os.geteuid() != 0 or os.uname().machine != "x86_64":
        why = "needs root on x86-64 (chown, setuid, renameat2 by number)"
        if IN_CI:
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    monkeypatch.delenv("SUDO_UID", raising=False)
    monkeypatch.delenv("SUDO_GID", raising=False)


def exchange(a, b, dfd: int = AT_FDCWD) -> None:
    """renameat2(a, b, RENAME_EXCHANGE): the two names trade places at once."""
    r = _libc.syscall(ctypes.c_long(SYS_RENAMEAT2), ctypes.c_int(dfd), os.fsencode(str(a)), ctypes.c_int(dfd),
                      os.fsencode(str(b)), ctypes.c_uint(RENAME_EXCHANGE))
    if r != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


class Arena:
    """base/p3r: nobody's directory, holding sub (nobody's directory) and swp
    (nobody's link to base/victimdir, root's, mode 0700, holding target)."""

    def __init__(self, base: Path):
        self.base = base
        self.p3r = base / "p3r"
        self.victimdir = base / "victimdir"
        self.victimdir.mkdir(mode=0o700)
        (self.victimdir / "target").write_bytes(SECRET)
        self.p3r.mkdir(mode=0o755)
        (self.p3r / "sub").mkdir(mode=0o755)
        (self.p3r / "swp").symlink_to(self.victimdir)
        for p in (self.p3r, self.p3r / "sub", self.p3r / "swp"):
            os.chown(p, NOBODY, NOBODY, follow_symlinks=False)

    def path(self, name: str = "target") -> str:
        return str(self.p3r / "sub" / name)

    def swap(self) -> None:
        exchange(self.p3r / "sub", self.p3r / "swp")

    def reset(self) -> None:
        """sub a directory again, no output left in it."""
        if (self.p3r / "sub").is_symlink():
            self.swap()
        for n in os.listdir(self.p3r / "sub"):
            p = self.p3r / "sub" / n
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()

    def victim_intact(self) -> None:
        assert sorted(os.listdir(self.victimdir)) == ["target"], os.listdir(self.victimdir)
        assert (self.victimdir / "target").read_bytes() == SECRET


@pytest.fixture
def arena(tmp_path):
    return Arena(tmp_path)


@contextlib.contextmanager
def swap_before_call(k: int, swap):
    """Count the file-system calls made by name (os.open, os.lstat, ...)
    inside the block; just before the k-th one (k >= 1), call swap."""
    count = [0]
    saved = {n: getattr(os, n) for n in FS_CALLS}

    def wrap(real):
        def call(*a, **kw):
            count[0] += 1
            if count[0] == k:
                swap()
            return real(*a, **kw)
        return call

    for n, real in saved.items():
        setattr(os, n, wrap(real))
    try:
        yield count
    finally:
        for n, real in saved.items():
            setattr(os, n, real)


def calls_made(fn) -> int:
    with swap_before_call(0, lambda: None) as count:
        with contextlib.suppress(PstateError):
            fn()
    return count[0]


def refused_for_the_link(e: PstateError, arena: Arena) -> None:
    """The documented refusal: exit 77, naming nobody's link, with a fix."""
    assert e.exit_code == ExitCode.NOPERM, e.message
    assert f"the directory {arena.p3r / 'sub'} is a symbolic link owned by uid {NOBODY}" in e.message, e.message
    assert "\n  fix: " in e.message, e.message


def close_output(out: outfiles.OutputFile) -> None:
    os.close(out.fd)
    if getattr(out, "dir_fd", None) is not None:
        os.close(out.dir_fd)


# --- (a) the swap between two steps of the walk ------------------------------------------------


@pytest.mark.parametrize("name", ["target", "fresh"])
def test_a_swap_before_any_step_never_reaches_the_root_only_directory(arena, name):
    """For every file-system call open_output makes, a run with sub swapped
    for nobody's link just before that call: the file in victimdir is never
    created, opened for writing or truncated; the open either lands in the
    real sub directory or is refused as documented."""
    n = calls_made(lambda: close_output(outfiles.open_output(arena.path(name))))
    assert n >= 2
    arena.reset()
    outcomes = set()
    for k in range(1, n + 1):
        with swap_before_call(k, arena.swap):
            try:
                out = outfiles.open_output(arena.path(name))
            except PstateError as e:
                refused_for_the_link(e, arena)
                outcomes.add("refused")
            else:
                st = os.fstat(out.fd)
                close_output(out)
                arena.victim_intact()
                real = os.lstat(arena.p3r / ("swp" if (arena.p3r / "sub").is_symlink() else "sub") / name)
                assert (st.st_dev, st.st_ino) == (real.st_dev, real.st_ino)  # in nobody's real directory
                outcomes.add("opened")
        arena.victim_intact()
        arena.reset()
    assert outcomes == {"refused", "opened"}, outcomes


def test_the_walk_refuses_a_directory_swapped_after_its_parent_was_opened(arena, monkeypatch):
    """The seam inside the walker: once p3r is open, sub becomes nobody's
    link; the next step finds the link, not the directory it points to."""
    real_open_at = trust._open_at
    done = []

    def open_at(dfd, name, flags, mode=0o777):
        fd = real_open_at(dfd, name, flags, mode)
        if name == "p3r" and not done:
            arena.swap()
            done.append(1)
        return fd

    monkeypatch.setattr(trust, "_open_at", open_at)
    with pytest.raises(PstateError) as e:
        outfiles.open_output(arena.path())
    refused_for_the_link(e.value, arena)
    assert done
    arena.victim_intact()


def test_export_replacement_never_reaches_the_root_only_directory(arena):
    """export -o writes a temporary file beside the output and renames it:
    a swap before any step of that leaves victimdir as it was."""
    def run():
        out = outfiles.open_output(arena.path(), replace=True)
        os.write(out.fd, b"trace\n")
        outfiles.publish(out)

    n = calls_made(run)
    arena.reset()
    for k in range(1, n + 1):
        with swap_before_call(k, arena.swap):
            try:
                run()
            except PstateError as e:
                assert e.exit_code in (ExitCode.NOPERM, ExitCode.CANTCREAT, ExitCode.IOERR), e.message
        arena.victim_intact()
        arena.reset()


# --- (c) discard ---------------------------------------------------------------------------------


def test_discard_never_unlinks_a_file_in_the_swapped_in_directory(arena):
    """discard() of the empty file this run created, with sub swapped for the
    link before each of its file-system calls in turn: the file in victimdir
    (same name) is never unlinked."""
    def fresh() -> outfiles.OutputFile:
        arena.reset()
        return outfiles.open_output(arena.path())

    n = calls_made(lambda: outfiles.discard(fresh()))
    for k in range(1, n + 2):
        out = fresh()
        with swap_before_call(k, arena.swap):
            outfiles.discard(out)
        arena.victim_intact()
    # without a swap the empty file is removed, as before
    out = fresh()
    outfiles.discard(out)
    assert os.listdir(arena.p3r / "sub") == []


# --- (b) live: nobody swapping in a loop ---------------------------------------------------------


def _swapper(p3r: Path, seconds: float) -> int:
    """Fork a child that becomes nobody and exchanges sub and swp in a loop."""
    dfd = os.open(p3r, os.O_RDONLY | os.O_DIRECTORY)
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                exchange("sub", "swp", dfd)
        finally:
            os._exit(0)
    os.close(dfd)
    return pid


def test_live_swaps_never_truncate_or_unlink_a_root_only_file(arena):
    """nobody exchanges sub and swp (RENAME_EXCHANGE) as fast as it can
    while root opens p3r/sub/target and discards it again in a loop, until
    each has happened 300 times (both sides of the race, many times over):
    victimdir/target is never truncated or unlinked, and every refusal is
    the documented one."""
    pid = _swapper(arena.p3r, 120)
    opened = refused = 0
    try:
        while min(opened, refused) < 300 and opened + refused < 100_000:
            try:
                out = outfiles.open_output(arena.path())
            except PstateError as e:
                refused_for_the_link(e, arena)
                refused += 1
                continue
            opened += 1
            outfiles.discard(out)
            assert (arena.victimdir / "target").read_bytes() == SECRET
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    arena.victim_intact()
    assert min(opened, refused) >= 300, (opened, refused)


# --- snapshot directories and the program cache --------------------------------------------------


def test_snap_dir_below_a_swapped_directory_is_refused_or_real(arena):
    target = arena.p3r / "sub" / "snaps"
    n = calls_made(lambda: os.close(writer.open_out_dir(str(target))))
    for k in range(1, n + 1):
        arena.reset()
        with swap_before_call(k, arena.swap):
            try:
                fd = writer.open_out_dir(str(target))
            except PstateError as e:
                assert e.exit_code == ExitCode.NOPERM, e.message
                assert f"{arena.p3r / 'sub'} is a symbolic link owned by uid {NOBODY}" in e.message, e.message
            else:
                os.close(fd)
        arena.victim_intact()  # no directory made in victimdir


def test_flight_directory_through_nobodys_link_is_refused(arena):
    """record --flight -o DIR opens DIR as a snapshot directory: the same walk."""
    from pstate.engines import flight

    arena.swap()
    with pytest.raises(PstateError) as e:
        flight.prepare({"triggers": []}, None, arena.path("flight"))
    assert e.value.exit_code == ExitCode.NOPERM
    assert f"{arena.p3r / 'sub'} is a symbolic link owned by uid {NOBODY}" in e.value.message, e.value.message
    arena.victim_intact()
    arena.swap()
    prepared = flight.prepare({"triggers": []}, None, arena.path("flight"))
    assert os.path.isdir(arena.path("flight"))
    prepared["dir"].close()


def test_walk_rules(tmp_path):
    """Links on the way: root's link in a directory only root writes is
    followed; nobody's link, or root's link in a directory nobody can write,
    is refused; the final component is followed only when asked."""
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (tmp_path / "rootlink").symlink_to(real)
    fd = trust.open_dir(str(tmp_path / "rootlink"))
    assert os.fstat(fd).st_ino == real.stat().st_ino
    os.close(fd)
    with pytest.raises(trust.WalkError) as e:
        trust.open_dir(str(tmp_path / "rootlink"), follow_last=False)
    assert e.value.unsafe and "is a symbolic link" in e.value.why
    (tmp_path / "theirs").symlink_to(real)
    os.chown(tmp_path / "theirs", NOBODY, NOBODY, follow_symlinks=False)
    with pytest.raises(trust.WalkError) as e:
        trust.open_dir(str(tmp_path / "theirs" / "x"))
    assert e.value.unsafe and e.value.why == f"{tmp_path / 'theirs'} is a symbolic link owned by uid {NOBODY}"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "l").symlink_to(real)
    with pytest.raises(trust.WalkError) as e:
        trust.open_dir(str(shared / "l"))
    assert e.value.unsafe and "another user can write" in e.value.why, e.value.why
    with pytest.raises(trust.WalkError) as e:
        trust.open_dir(str(tmp_path / "missing" / "x"))
    assert not e.value.unsafe and e.value.errno == errno.ENOENT
    (tmp_path / "file").write_text("x")
    with pytest.raises(trust.WalkError) as e:
        trust.open_dir(str(tmp_path / "file" / "x"))
    assert not e.value.unsafe and e.value.errno == errno.ENOTDIR
    # strict: every directory passed held to the cache's rules
    with pytest.raises(trust.WalkError) as e:
        trust.open_dir(str(shared / "x"), strict=True, create=0o755)
    assert e.value.unsafe and "writable by group or others" in e.value.why
    assert not (shared / "x").exists()
    made = tmp_path / "a" / "b"
    old = os.umask(0)
    try:
        os.close(trust.open_dir(str(made), strict=True, create=0o755))
    finally:
        os.umask(old)
    assert stat.S_IMODE(made.stat().st_mode) == stat.S_IMODE(made.parent.stat().st_mode) == 0o755


def test_cache_below_a_swapped_directory_is_never_used(arena):
    """The program cache directory below nobody's directory: refused before
    anything is read or stored, whatever is swapped when."""
    cache = arena.p3r / "sub" / "programs"
    for k in range(1, 12):
        arena.reset()
        with swap_before_call(k, arena.swap):
            assert progcache.store({"format": progcache.FORMAT, "name": "record", "key": "ab" * 32, "maps": [],
                                    "progs": [], "attach": []}, str(cache)) is None
        arena.victim_intact()
    assert not os.path.exists(arena.p3r / "sub" / "programs") and not os.path.exists(arena.p3r / "swp" / "programs")

"""Opening -o FILE for the commands that write a stream (record, replay).

pstate record runs as root, often in a directory others can write (/tmp),
so the output file is opened the way snapshots are published:

- a new file is created with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600 whatever
  the umask; under sudo (real uid 0, SUDO_UID set) it is given to the
  invoking user, so `sudo pstate record -o rec.jsonl` then `pstate stats
  rec.jsonl` works;
- an existing file is truncated and rewritten only if it is a regular file
  with one link, not a symbolic link, owned by root or the invoking user;
- a symbolic link is never followed to a regular file, and is followed to a
  pipe, terminal or device (/dev/stdout, /dev/fd/N) only when root or the
  invoking user owns it; a directory on the way that is a link must be
  theirs too;
- a FIFO (or a pipe, terminal, /dev/null) is written as it is, never
  fsync'd; a FIFO nobody reads yet is waited for at most FIFO_WAIT_S.

A file pstate created is removed again only when the run fails before
writing to it, and only while the path still names that very file.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time
from dataclasses import dataclass

from pstate.exitcodes import ExitCode, PstateError

FIFO_WAIT_S = 10.0  # how long to wait for a reader of a FIFO before giving up


@dataclass
class OutputFile:
    """An open output: its descriptor, what it is, and how it was opened."""

    fd: int
    path: str
    regular: bool  # a regular file: fsync'd, and reopened by SIGHUP
    created: bool  # pstate created it in this open


def invoking_user() -> tuple[int, int] | None:
    """(uid, gid) of the user who ran `sudo pstate`, or None."""
    if os.getuid() != 0:
        return None
    try:
        uid = int(os.environ["SUDO_UID"])
        gid = int(os.environ.get("SUDO_GID", uid))
    except (KeyError, ValueError):
        return None
    return (uid, gid) if uid > 0 else None


def _owners() -> set[int]:
    sudo = invoking_user()
    return {0, os.geteuid()} | ({sudo[0]} if sudo else set())


def _refuse(path: str, why: str, hint: str) -> PstateError:
    return PstateError(f"refusing to write {path}: {why}", ExitCode.NOPERM, hint=hint)


def _check_dirs(path: str, owners: set[int]) -> None:
    """No directory on the way to path may be a link someone else owns."""
    parent = os.path.dirname(os.path.abspath(path))
    cur = "/"
    for part in [p for p in parent.split("/") if p]:
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except OSError:
            return  # the open reports it
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in owners:
                raise _refuse(path, f"the directory {cur} is a symbolic link owned by uid {st.st_uid}",
                              "write into a directory that is not another user's link")
            cur = os.path.realpath(cur)


def _wait_for_reader(path: str, flags: int, wait_s: float) -> int:
    """Open a FIFO for writing once someone reads it, or give up after wait_s."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            return os.open(path, flags | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
        if time.monotonic() >= deadline:
            raise PstateError(f"nobody reads the FIFO {path} (waited {wait_s:g} s)", ExitCode.CANTCREAT,
                              hint=f"start its reader first, e.g. `pstate stats {path} &`")
        if not said:
            print(f"pstate: waiting for a reader of the FIFO {path}", file=sys.stderr)
            said = True
        time.sleep(0.05)


def open_output(path: str, *, fifo_wait_s: float | None = None) -> OutputFile:
    """Open path for writing by the rules above; PstateError (exit 77 for an
    unsafe target, 73 when it cannot be created) otherwise."""
    owners = _owners()
    _check_dirs(path, owners)
    # O_APPEND: after logrotate's copytruncate the next line goes to the
    # start of the emptied file, not past a hole of NUL bytes
    base = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, base | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        fd = None
    except OSError as e:
        raise PstateError(f"cannot create {path}: {e.strerror}", ExitCode.CANTCREAT) from None
    if fd is not None:
        try:
            os.fchmod(fd, 0o600)
            sudo = invoking_user()
            if sudo:
                os.fchown(fd, sudo[0], sudo[1])
        except OSError as e:
            os.close(fd)
            raise PstateError(f"cannot create {path}: {e.strerror}", ExitCode.CANTCREAT) from None
        return OutputFile(fd, path, True, True)
    return _open_existing(path, owners, base, FIFO_WAIT_S if fifo_wait_s is None else fifo_wait_s)


def _stat(path: str, follow: bool) -> os.stat_result:
    try:
        return os.stat(path, follow_symlinks=follow)
    except OSError as e:
        raise PstateError(f"cannot open {path}: {e.strerror}", ExitCode.CANTCREAT) from None


def _open_existing(path: str, owners: set[int], base: int, fifo_wait_s: float) -> OutputFile:
    lst = _stat(path, follow=False)
    link = stat.S_ISLNK(lst.st_mode)
    if link and lst.st_uid not in owners:
        raise _refuse(path, f"it is a symbolic link owned by uid {lst.st_uid}",
                      "remove the link, or name a file of your own")
    st = _stat(path, follow=True)
    if stat.S_ISDIR(st.st_mode):
        raise PstateError(f"cannot write {path}: it is a directory", ExitCode.CANTCREAT)
    if link and stat.S_ISREG(st.st_mode):
        raise _refuse(path, f"it is a symbolic link (to {os.path.realpath(path)}); pstate never writes a "
                            "file through a link", "name the file itself, or use -o - for standard output")
    flags = base | (0 if link else os.O_NOFOLLOW)
    try:
        if stat.S_ISFIFO(st.st_mode):
            fd = _wait_for_reader(path, flags, fifo_wait_s)
        else:
            fd = os.open(path, flags | os.O_NONBLOCK)
        os.set_blocking(fd, True)
    except OSError as e:
        if e.errno == errno.ELOOP:  # swapped for a link since the lstat
            raise _refuse(path, "it became a symbolic link", "try again in a directory only you can write") from None
        raise PstateError(f"cannot open {path}: {e.strerror}", ExitCode.CANTCREAT) from None
    try:
        fst = os.fstat(fd)
        why = None
        if fst.st_uid not in owners:
            why = f"it is owned by uid {fst.st_uid}, neither root nor you"
        elif not link and (fst.st_dev, fst.st_ino) != (lst.st_dev, lst.st_ino):
            why = "it was replaced while it was being opened"
        elif stat.S_ISREG(fst.st_mode) and fst.st_nlink > 1:
            why = f"it has {fst.st_nlink} hard links (another name could be a file you did not mean)"
        if why:
            raise _refuse(path, why, "remove it, or name a new file")
        regular = stat.S_ISREG(fst.st_mode)
        if regular:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return OutputFile(fd, path, regular, False)


def still_at_path(out: OutputFile) -> bool:
    """Whether out.path still names the file out.fd has open."""
    try:
        a, b = os.lstat(out.path), os.fstat(out.fd)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def discard(out: OutputFile) -> None:
    """Close out; remove the file if this run created it, nothing was
    written to it, and its path still names it (a failed start leaves no
    empty file behind, and never removes another one)."""
    try:
        if out.created and still_at_path(out) and os.fstat(out.fd).st_size == 0:
            os.unlink(out.path)
    except OSError:
        pass
    finally:
        os.close(out.fd)

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
  theirs too, in a directory no one else can write;
- a FIFO (or a pipe, terminal, /dev/null) is written as it is, never
  fsync'd; a FIFO nobody reads yet is waited for at most FIFO_WAIT_S.

The directory is found by pstate.trust.open_dir, one component at a
time from / (or the working directory) by descriptor, never by its name
again: a directory on the way swapped for a link meanwhile is met as that
link, and a link on the way is followed only when root (or you) own it and
no one else can write the directory it is in; any other is refused (exit
77). The file is then created, opened, renamed and removed relative to that
directory's descriptor, which the OutputFile keeps.

A file pstate created is removed again only when the run fails before
writing to it, and only while its name in that directory still names that
very file.

open_output(path, replace=True) (export) writes a new version of a regular
file aside, as .NAME.tmp.PID.RAND in the same directory, and publish()
renames it over the name at the end: a failed or interrupted run leaves
the earlier file as it was and no partial one (abandon() removes the
temporary file, the one it created and no other).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import sys
import time
from dataclasses import dataclass

from pstate.exitcodes import ExitCode, PstateError
from pstate import trust

FIFO_WAIT_S = 10.0  # how long to wait for a reader of a FIFO before giving up


@dataclass
class OutputFile:
    """An open output: its descriptor, what it is, and how it was opened."""

    fd: int
    path: str
    regular: bool  # a regular file: fsync'd, and reopened by SIGHUP
    created: bool  # pstate created it in this open
    dir_fd: int | None = None  # the directory holding it (a regular file only), kept open
    name: str | None = None  # its name there
    ident: tuple[int, int] | None = None  # (st_dev, st_ino) of what pstate created
    tmp: str | None = None  # replace=True: the temporary name written until publish()


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


def _open_dir_of(path: str, owners: set[int]) -> tuple[int, str]:
    """(descriptor of the directory path is in, path's last component),
    walked by trust.open_dir; PstateError when refused or missing."""
    parent, name = os.path.split(path)
    if name in ("", ".", ".."):
        raise PstateError(f"cannot write {path}: it is a directory", ExitCode.CANTCREAT)
    try:
        return trust.open_dir(parent, tuple(owners)), name
    except trust.WalkError as e:
        if e.unsafe:
            raise _refuse(path, f"the directory {e.why}",
                          "write into a directory that is not another user's link, on a path no other "
                          "user can change") from None
        why = os.strerror(e.errno) if e.errno else e.why
        raise PstateError(f"cannot create {path}: {why}", ExitCode.CANTCREAT) from None


def _wait_for_reader(path: str, dfd: int, name: str, flags: int, wait_s: float) -> int:
    """Open a FIFO for writing once someone reads it, or give up after wait_s."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            return os.open(name, flags | os.O_NONBLOCK, dir_fd=dfd)
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


def open_output(path: str, *, fifo_wait_s: float | None = None, replace: bool = False) -> OutputFile:
    """Open path for writing by the rules above; PstateError (exit 77 for an
    unsafe target, 73 when it cannot be created) otherwise. replace: a
    regular file (or a new one) is written aside and renamed into place by
    publish(); a FIFO or device is opened as it is."""
    owners = _owners()
    dfd, name = _open_dir_of(path, owners)
    try:
        wait = FIFO_WAIT_S if fifo_wait_s is None else fifo_wait_s
        if replace:
            out = _open_replacement(path, dfd, name, owners)
            if out is not None:
                return out
            out = _open_existing(path, dfd, name, owners, _BASE, wait)
        else:
            out = _open_at(path, dfd, name, owners, wait)
    except BaseException:
        os.close(dfd)
        raise
    if not out.regular:
        os.close(dfd)  # nothing is done by name to a FIFO or a device
    else:
        out.dir_fd, out.name = dfd, name
    return out


# O_APPEND: after logrotate's copytruncate the next line goes to the start of
# the emptied file, not past a hole of NUL bytes
_BASE = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOCTTY


def _create(path: str, dfd: int, name: str, flags: int) -> int | None:
    """A new file name in dfd, 0600 whatever the umask (the invoking user's
    under sudo); None when the name exists."""
    try:
        fd = os.open(name, flags | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=dfd)
    except FileExistsError:
        return None
    except OSError as e:
        raise PstateError(f"cannot create {path}: {e.strerror}", ExitCode.CANTCREAT) from None
    try:
        os.fchmod(fd, 0o600)
        sudo = invoking_user()
        if sudo:
            os.fchown(fd, sudo[0], sudo[1])
    except OSError as e:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=dfd)
        raise PstateError(f"cannot create {path}: {e.strerror}", ExitCode.CANTCREAT) from None
    return fd


def _open_at(path: str, dfd: int, name: str, owners: set[int], fifo_wait_s: float) -> OutputFile:
    fd = _create(path, dfd, name, _BASE)
    if fd is not None:
        st = os.fstat(fd)
        return OutputFile(fd, path, True, True, ident=(st.st_dev, st.st_ino))
    return _open_existing(path, dfd, name, owners, _BASE, fifo_wait_s)


def _stat(path: str, dfd: int, name: str, follow: bool) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=dfd, follow_symlinks=follow)
    except OSError as e:
        raise PstateError(f"cannot open {path}: {e.strerror}", ExitCode.CANTCREAT) from None


def _check_existing(path: str, dfd: int, name: str, owners: set[int]) -> tuple[os.stat_result, os.stat_result]:
    """(lstat, stat) of an existing name, refused when it is a link to a
    regular file, another user's link, or a directory."""
    lst = _stat(path, dfd, name, follow=False)
    link = stat.S_ISLNK(lst.st_mode)
    if link and lst.st_uid not in owners:
        raise _refuse(path, f"it is a symbolic link owned by uid {lst.st_uid}",
                      "remove the link, or name a file of your own")
    st = _stat(path, dfd, name, follow=True)
    if stat.S_ISDIR(st.st_mode):
        raise PstateError(f"cannot write {path}: it is a directory", ExitCode.CANTCREAT)
    if link and stat.S_ISREG(st.st_mode):
        raise _refuse(path, f"it is a symbolic link (to {os.path.realpath(path)}); pstate never writes a "
                            "file through a link", "name the file itself, or use -o - for standard output")
    return lst, st


def _why_not_replaced(fst: os.stat_result, owners: set[int]) -> str | None:
    if fst.st_uid not in owners:
        return f"it is owned by uid {fst.st_uid}, neither root nor you"
    if stat.S_ISREG(fst.st_mode) and fst.st_nlink > 1:
        return f"it has {fst.st_nlink} hard links (another name could be a file you did not mean)"
    return None


def _open_existing(path: str, dfd: int, name: str, owners: set[int], base: int, fifo_wait_s: float) -> OutputFile:
    lst, st = _check_existing(path, dfd, name, owners)
    link = stat.S_ISLNK(lst.st_mode)
    flags = base | (0 if link else os.O_NOFOLLOW)
    try:
        if stat.S_ISFIFO(st.st_mode):
            fd = _wait_for_reader(path, dfd, name, flags, fifo_wait_s)
        else:
            fd = os.open(name, flags | os.O_NONBLOCK, dir_fd=dfd)
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
        elif link and stat.S_ISREG(fst.st_mode):  # the link was swapped since it was checked
            why = "it became a symbolic link to a regular file; pstate never writes a file through a link"
        elif not link and (fst.st_dev, fst.st_ino) != (lst.st_dev, lst.st_ino):
            why = "it was replaced while it was being opened"
        else:
            why = _why_not_replaced(fst, owners)
        if why:
            raise _refuse(path, why, "remove it, or name a new file")
        regular = stat.S_ISREG(fst.st_mode)
        if regular:
            os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return OutputFile(fd, path, regular, False)


def _open_replacement(path: str, dfd: int, name: str, owners: set[int]) -> OutputFile | None:
    """A temporary file beside name for publish() to rename over it, when
    name is missing or a regular file pstate may replace; None when it is
    something written as it is (a FIFO, a device, a link to one)."""
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        old = None
    except OSError as e:
        raise PstateError(f"cannot open {path}: {e.strerror}", ExitCode.CANTCREAT) from None
    else:
        lst, st = _check_existing(path, dfd, name, owners)
        if not stat.S_ISREG(lst.st_mode):
            return None  # a FIFO, a device, or a link to one: written as it is
        why = _why_not_replaced(lst, owners)
        if why:
            raise _refuse(path, why, "remove it, or name a new file")
        old = lst
    for _ in range(100):
        tmp = f".{name[:200]}.tmp.{os.getpid()}.{secrets.token_hex(4)}"
        fd = _create(path, dfd, tmp, os.O_WRONLY | os.O_CLOEXEC | os.O_NOCTTY)
        if fd is not None:
            break
    else:
        raise PstateError(f"cannot create a temporary file beside {path}", ExitCode.CANTCREAT)
    if old is not None:
        try:  # the new version keeps the old one's owner and mode
            os.fchown(fd, old.st_uid, old.st_gid)
            os.fchmod(fd, stat.S_IMODE(old.st_mode) & 0o777)
        except OSError as e:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise PstateError(f"cannot create {path}: {e.strerror}", ExitCode.CANTCREAT) from None
    st = os.fstat(fd)
    return OutputFile(fd, path, True, True, dir_fd=dfd, name=name, ident=(st.st_dev, st.st_ino), tmp=tmp)


def publish(out: OutputFile) -> None:
    """The end of a replace=True output: fsync the temporary file, rename it
    over the name (refused, and removed, if the name became something pstate
    may not replace), fsync the directory, close both. A FIFO or device
    output is only closed. OSError when writing failed (the temporary file
    is then removed): the caller reports it."""
    try:
        if out.tmp is not None and out.fd >= 0:
            os.fsync(out.fd)
        if out.fd >= 0:
            fd, out.fd = out.fd, -1
            os.close(fd)
        if out.tmp is None:
            return
        try:
            lst = os.stat(out.name, dir_fd=out.dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:
            why = ("it became a symbolic link" if stat.S_ISLNK(lst.st_mode)
                   else None if stat.S_ISREG(lst.st_mode) else "it is no longer a regular file")
            why = why or _why_not_replaced(lst, _owners())
            if why:
                raise _refuse(out.path, why, "remove it, or name a new file")
        os.rename(out.tmp, out.name, src_dir_fd=out.dir_fd, dst_dir_fd=out.dir_fd)
        out.tmp = None
        with contextlib.suppress(OSError):
            os.fsync(out.dir_fd)
    except BaseException:
        abandon(out)
        raise
    finally:
        close_dir(out)


def abandon(out: OutputFile) -> None:
    """Close a replace=True output without publishing it: its temporary file
    is removed, if its name still names the file it created."""
    try:
        if out.tmp is not None and out.dir_fd is not None and _names(out.dir_fd, out.tmp, out.ident):
            os.unlink(out.tmp, dir_fd=out.dir_fd)
    except OSError:
        pass
    finally:
        if out.fd >= 0:
            fd, out.fd = out.fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)
        close_dir(out)


def _names(dfd: int, name: str, ident: tuple[int, int] | None) -> bool:
    """Whether name in the directory dfd is the file ident (st_dev, st_ino)."""
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except OSError:
        return False
    return ident is not None and (st.st_dev, st.st_ino) == ident


def still_at_path(out: OutputFile) -> bool:
    """Whether out's name in its directory still names the file out.fd has open."""
    try:
        b = os.fstat(out.fd)
        if out.dir_fd is None:
            a = os.lstat(out.path)
        else:
            a = os.stat(out.name, dir_fd=out.dir_fd, follow_symlinks=False)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def close_dir(out: OutputFile) -> None:
    """Close the descriptor of out's directory (out.fd is the caller's)."""
    if out.dir_fd is not None:
        with contextlib.suppress(OSError):
            os.close(out.dir_fd)
        out.dir_fd = None


def discard(out: OutputFile) -> None:
    """Close out; remove the file if this run created it, nothing was
    written to it, and its name in its directory still names it (a failed
    start leaves no empty file behind, and never removes another one)."""
    if out.tmp is not None:
        abandon(out)
        return
    try:
        if (out.created and out.dir_fd is not None and _names(out.dir_fd, out.name, out.ident)
                and os.fstat(out.fd).st_size == 0):
            os.unlink(out.name, dir_fd=out.dir_fd)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            os.close(out.fd)
        out.fd = -1
        close_dir(out)


def silence(fd: int) -> None:
    """Point fd at /dev/null: whatever a buffered writer still holds for it
    goes nowhere (after a failed write, or an abandoned output)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.dup2(null, fd, inheritable=False)
    except OSError:
        pass
    finally:
        os.close(null)

"""What root may read code from, and how pstate creates its directories.

pstate runs as root and puts code into the kernel, so everything it compiles
or loads (kernel headers, cached programs) must be out of every other user's
reach: each file and each directory on the way to it owned by root (or the
given owner) and not writable by group or others. A world-writable directory
on the way is accepted only when it is root-owned and sticky (/tmp): there
nobody can rename or delete an entry root owns. Symbolic links are followed
and their targets checked the same way.
"""

from __future__ import annotations

import os
import stat


def why_untrusted_stat(path: str, st: os.stat_result, owners: tuple[int, ...] = (0,),
                       directory: bool | None = None, ancestor: bool = False) -> str | None:
    """Why the file st describes (an lstat or fstat of path) must not be
    trusted, or None. ancestor: a directory on the way to what is read."""
    if directory is True and not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if directory is False and not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_uid not in owners:
        who = "root" if owners == (0,) else " or ".join(f"uid {o}" for o in owners)
        return f"{path} is owned by uid {st.st_uid}, not {who}"
    if st.st_mode & 0o022:
        if ancestor and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0:
            return None
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def why_untrusted(path: str, owners: tuple[int, ...] = (0,), directory: bool | None = None) -> str | None:
    """Why path itself (not following a final symlink) must not be trusted, or
    None. directory: True for a directory, False for a regular file, None
    for either."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as e:
        return f"{path}: {e.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    return why_untrusted_stat(path, st, owners, directory)


def why_untrusted_ancestors(path: str, owners: tuple[int, ...] = (0,)) -> str | None:
    """Why a directory on the way to path (from / down, path excluded) could
    be changed by another user, or None. path is taken as it is resolved:
    symbolic links on the way are followed, each one's target checked."""
    real = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    parts = [p for p in real.split("/") if p]
    cur = "/"
    for i in range(len(parts) + 1):
        if i:
            cur = os.path.join(cur, parts[i - 1])
        try:
            st = os.lstat(cur)
        except OSError as e:
            return f"{cur}: {e.strerror}"
        why = why_untrusted_stat(cur, st, (0,) + tuple(o for o in owners if o != 0), True, ancestor=True)
        if why:
            return why
    return None


def why_untrusted_path(path: str, owners: tuple[int, ...] = (0,), directory: bool | None = None) -> str | None:
    """why_untrusted for path and every directory above it."""
    return why_untrusted_ancestors(path, owners) or why_untrusted(path, owners, directory)


def why_untrusted_tree(top: str, subdirs: tuple[str, ...] = (), owners: tuple[int, ...] = (0,)) -> str | None:
    """Why anything in the tree at top (only top/<subdir> for each of
    subdirs, when given) is not safe to read as root, or None: every
    directory and file root-owned and not group/world-writable, symbolic
    links followed and their targets and the directories above them
    checked. About 0.15 s for a distribution's 16,500-file header tree."""
    why = why_untrusted_path(top, owners, True)
    if why:
        return why
    checked_dirs: set[str] = set()  # resolved directories whose ancestors were checked
    seen: set[tuple[int, int]] = set()  # directories walked
    stack = [os.path.join(top, s) for s in subdirs] if subdirs else [top]
    stack = [p for p in stack if os.path.lexists(p)]
    while stack:
        path = stack.pop()
        try:
            st = os.lstat(path)
        except OSError as e:
            return f"{path}: {e.strerror}"
        if stat.S_ISLNK(st.st_mode):
            if st.st_uid not in owners:
                return f"{path} is a symbolic link owned by uid {st.st_uid}"
            target = os.path.realpath(path)
            parent = os.path.dirname(target)
            if parent not in checked_dirs:
                why = why_untrusted_ancestors(target, owners)
                if why:
                    return f"{path} points to {target}: {why}"
                checked_dirs.add(parent)
            try:
                st = os.lstat(target)
            except OSError as e:
                return f"{path} points to {target}: {e.strerror}"
            path = target
        if stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) in seen:
                continue  # reached again through a link
            seen.add((st.st_dev, st.st_ino))
            why = why_untrusted_stat(path, st, owners, True)
            if why:
                return why
            checked_dirs.add(path)
            try:
                with os.scandir(path) as it:
                    stack.extend(e.path for e in it)
            except OSError as e:
                return f"{path}: {e.strerror}"
        else:
            why = why_untrusted_stat(path, st, owners, False)
            if why:
                return why
    return None


def make_dirs(path: str, mode: int = 0o755) -> None:
    """mkdir -p with every directory it creates set to mode whatever the
    umask (a first run under umask 000 must not leave a 0777 directory)."""
    path = os.path.abspath(path)
    missing = []
    cur = path
    while not os.path.isdir(cur):
        missing.append(cur)
        parent = os.path.dirname(cur)
        if parent == cur:
            break
        cur = parent
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue  # made by another run, or not a directory: the caller's checks decide
        os.chmod(d, mode, follow_symlinks=False)

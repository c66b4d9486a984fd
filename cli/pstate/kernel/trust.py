"""What root may read code from, and how pstate creates its directories.

pstate runs as root and puts code into the kernel, so everything it compiles
or loads (kernel headers, cached programs) must be out of every other user's
reach: each file and each directory on the way to it owned by root (or the
given owner) and not writable by group or others. A world-writable directory
on the way is accepted only when it is root-owned and sticky (/tmp): there
nobody can rename or delete an entry root owns. Symbolic links are followed
hop by hop as the kernel resolves them: each link on the way must be root's
(or the given owner's), and so must every directory passed through on the
way to each link's target, so a root-owned link to a link in another user's
directory is refused even when the chain ends at a trusted file.
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


_MAX_LINKS = 40  # the kernel's limit on links followed in one lookup


def _why_untrusted_way(path: str, owners: tuple[int, ...], checked: set[str],
                       check_last: bool = True) -> tuple[str | None, str]:
    """Resolve path one component at a time, as the kernel does: why a
    directory passed through or a symbolic link followed on the way could be
    changed by another user (None when none could), and the resolved path.
    Directories are held to the rule for ancestors (root or owners, a
    root-owned sticky directory allowed); check_last=False leaves the final
    component (once no longer a link) to the caller. checked: resolved
    directories already found fine, added to."""
    allowed = (0,) + tuple(o for o in owners if o != 0)
    pending = [p for p in os.path.abspath(path).split("/") if p][::-1]  # a stack: the next one last
    cur = "/"
    if cur not in checked:
        try:
            why = why_untrusted_stat(cur, os.lstat(cur), allowed, True, ancestor=True)
        except OSError as e:
            return f"{cur}: {e.strerror}", cur
        if why:
            return why, cur
        checked.add(cur)
    links = 0
    while pending:
        name = pending.pop()
        if name == ".":
            continue
        if name == "..":
            cur = os.path.dirname(cur)  # a prefix of a checked directory: checked
            continue
        nxt = os.path.join(cur, name)
        if nxt in checked:
            cur = nxt
            continue
        try:
            st = os.lstat(nxt)
        except OSError as e:
            return f"{nxt}: {e.strerror}", nxt
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > _MAX_LINKS:
                return f"{path}: too many levels of symbolic links", nxt
            if st.st_uid not in allowed:
                return f"{nxt} is a symbolic link owned by uid {st.st_uid}", nxt
            try:
                target = os.readlink(nxt)
            except OSError as e:
                return f"{nxt}: {e.strerror}", nxt
            if target.startswith("/"):
                cur = "/"
            pending.extend(p for p in reversed(target.split("/")) if p)
            continue  # relative targets resolve from cur, the link's directory
        if pending or check_last:
            why = why_untrusted_stat(nxt, st, allowed, True, ancestor=True)
            if why:
                return why, nxt
            checked.add(nxt)
        cur = nxt
    return None, cur


def why_untrusted_ancestors(path: str, owners: tuple[int, ...] = (0,)) -> str | None:
    """Why a directory on the way to path (from / down, path excluded) could
    be changed by another user, or None. path is taken as it is resolved:
    every symbolic link on the way is followed hop by hop, each link and
    every directory on the way to each target checked."""
    return _why_untrusted_way(os.path.dirname(os.path.abspath(path)), owners, set())[0]


def why_untrusted_path(path: str, owners: tuple[int, ...] = (0,), directory: bool | None = None) -> str | None:
    """why_untrusted for path and every directory above it."""
    return why_untrusted_ancestors(path, owners) or why_untrusted(path, owners, directory)


def why_untrusted_tree(top: str, subdirs: tuple[str, ...] = (), owners: tuple[int, ...] = (0,)) -> str | None:
    """Why anything in the tree at top (only top/<subdir> for each of
    subdirs, when given) is not safe to read as root, or None: every
    directory and file root-owned and not group/world-writable, symbolic
    links followed hop by hop, each link of a chain and every directory on
    the way to each of its targets checked, then the final target. About
    0.15 s for a distribution's 16,500-file header tree."""
    why = why_untrusted_path(top, owners, True)
    if why:
        return why
    checked_dirs: set[str] = set()  # resolved directories found fine on the way to a link's target
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
            why, target = _why_untrusted_way(path, owners, checked_dirs, check_last=False)
            if why:
                return f"{path} points to {os.path.realpath(path)}: {why}"
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

"""Finding pstate's pin sets wherever they are in bpffs: a set is found by
its manifest (pstate.kernel.pins), and its pins by the object ids the
manifest lists, so that a directory or a pin another user moved is still
seen, reported and removed. The walk is bounded and never follows a
symbolic link nor leaves a mount."""

from __future__ import annotations

import dataclasses
import os
import stat

from pstate.kernel import pins

# The bounds of search(): directories below a mount's top it goes down,
# entries it looks at in all, and manifests it keeps (a bpffs holds some
# pins per tool; a user can make any number of directories, so the walk
# must end).
MAX_DEPTH = 24
MAX_ENTRIES = 100_000
MAX_SETS = 64


@dataclasses.dataclass
class Search:
    sets: list[pins.PinSet]
    cut: str | None  # why not all of bpffs was looked at, or None

    def close(self) -> None:
        for s in self.sets:
            s.close()


def search(max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> Search:
    """Every manifest root pinned in the bpffs mounts here, wherever its
    directory was moved, with its pins: those in its directory, and those
    the manifest lists that were moved out of it, found by their ids. The
    walk never follows a symbolic link nor leaves a mount, and stops at
    max_depth directories down and max_entries entries (cut says where)."""
    sets: list[pins.PinSet] = []
    others: list[str] = []  # root's pins outside every manifest's directory: where a moved pin may be
    state = {"entries": 0, "cut": None}

    def cut(why: str) -> None:
        if state["cut"] is None:
            state["cut"] = why

    def walk(dfd: int, path: str, dev: int, depth: int, exposed: str | None) -> None:
        here = os.fstat(dfd)
        subdirs, files = [], []
        try:
            with os.scandir(dfd) as it:
                for e in it:
                    state["entries"] += 1
                    if state["entries"] > max_entries:
                        cut(f"bpffs holds more than {max_entries} entries")
                        return
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        subdirs.append((e.name, st))
                    elif stat.S_ISREG(st.st_mode) and st.st_uid == 0:
                        files.append(e.name)
        except OSError:
            return
        manifest = None
        for name in files:
            p = os.path.join(path, name)
            if name.endswith(".debug") and depth == 0:
                continue  # the kernel's own maps.debug, progs.debug
            if manifest is None and len(sets) >= MAX_SETS:
                cut(f"more than {MAX_SETS} manifests")
            elif manifest is None:
                try:
                    got = pins._manifest_at(dfd, name, p, pins.BPF_F_RDONLY)
                except OSError:
                    got = None
                if got is not None:
                    proven = pins.map_id(got[0])
                    os.close(got[0])  # reopened read-write (a reader updates the set's maps): the same map
                    try:
                        fd = pins.get_at(dfd, name)
                    except OSError:
                        continue
                    if pins.object_id(fd) != proven:
                        os.close(fd)
                        continue
                    manifest = pins.PinSet(path, got[1], fd, os.dup(dfd), name, exposed=exposed or pins._changeable(path, here))
                    sets.append(manifest)
                    continue
            others.append(p)
        if manifest is not None:
            listed = set(manifest.doc["pins"]) - {pins.META}
            others[:] = [o for o in others if not (os.path.dirname(o) == path and os.path.basename(o) in listed)]
        for name, st in subdirs:
            sub = os.path.join(path, name)
            if depth + 1 > max_depth:
                cut(f"{sub} is more than {max_depth} directories down")
                continue
            try:
                sfd = os.open(name, pins._DIR_FLAGS, dir_fd=dfd)
            except OSError:
                continue
            try:
                sst = os.fstat(sfd)
                if sst.st_dev != dev:
                    continue  # another file system mounted there
                moved_by = exposed or pins._exposure(path, here, sub, st)
                before = len(sets)
                walk(sfd, sub, dev, depth + 1, moved_by)
                for s in sets[before:]:
                    if s.dir == sub and s.parent_fd is None:
                        s.parent_fd = os.dup(dfd)
            finally:
                os.close(sfd)
            if state["cut"] and state["entries"] > max_entries:
                return

    for mp, dev in pins.bpffs_mounts():
        try:
            fd = os.open(mp, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if os.fstat(fd).st_dev == dev:
                walk(fd, mp.rstrip("/") or "/", dev, 0, None)
        finally:
            os.close(fd)
    _find_strays(sets, others)
    return Search(sets, state["cut"])


def _find_strays(sets: list[pins.PinSet], others: list[str]) -> None:
    """Look for the pins a set lacks among root's other pins, by kind and id."""
    wanted: dict[tuple[str, int], tuple[pins.PinSet, str]] = {}
    for s in sets:
        for name in s.missing():
            kind, oid = pins.kind_of(name, s.doc), s.doc["pins"][name]
            wanted[(kind, oid)] = (s, name)
    if not wanted:
        return
    for p in others:
        d, name = os.path.split(p)
        try:
            dfd = pins._open_walk(d)
        except OSError:
            continue
        try:
            try:
                fd = pins.get_at(dfd, name)
            except OSError:
                continue
            try:
                key = (pins._fd_kind(fd), pins.object_id(fd))
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
        if key in wanted:
            s, listed = wanted.pop(key)
            s.strays[listed] = (d, name)
            if not wanted:
                return

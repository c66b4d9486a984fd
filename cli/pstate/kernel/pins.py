"""BPF objects that outlive pstate: bpffs, pinned maps and links, and the
manifest that proves which pins pstate made.

A pinned link keeps its program attached after every fd is closed; a pinned
map keeps its contents. So a set of pins under one directory of bpffs is a
collector that goes on counting with no process running, until the pins are
removed (then the kernel detaches and frees everything).

Every set has a manifest: a pinned one-entry array map named `pstate_meta`
whose value is JSON (bpffs holds no regular files). It lists every pin of the
set with its object id, and carries whatever its owner stores (layout,
start time, settings). pstate removes a pin only when the manifest lists it
and the pinned object still has the id recorded: a pin it cannot prove it
made stays, and is reported.

Another user in bpffs. bpffs is mounted world-writable (sticky), so any
user can make directories there and rename what sits in a directory they
can write, but no one else can write into a directory root made 0700, read
or change a map root created (a pin is opened only with the permission of
its inode, and pstate's are root's, 0600), or make a pin owned by root. So:

- a manifest is believed only when its pin is owned by root: its JSON was
  written by root, and the ids it lists are what root pinned;
- a set's pins are the objects whose ids its manifest lists, wherever the
  walk finds them: a directory that was renamed or moved is still found by
  search(), which walks every bpffs mount (bounded in depth and entries,
  never following a symbolic link or leaving the mount);
- every pin is opened relative to an open directory (BPF_F_PATH_FD, or
  /proc/self/fd on kernels before 6.5), after an lstat that refuses a
  symbolic link, and its id is checked against the manifest before it is
  used; a pin is removed only from a directory no other user can write
  (root's, not group- or world-writable, or root's sticky), so no one can
  swap the entry between the check and the unlink;
- pstate's own pin directory is checked the same way before anything is
  pinned in it (open_pin_dir).
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import os
import pwd
import stat
import struct

import orjson

from pstate.exitcodes import ExitCode, PstateError
from pstate import trust
from pstate.kernel import bpfsys

BPFFS = "/sys/fs/bpf"

# bpf(2) commands and attach types used here
OBJ_PIN, OBJ_GET = 6, 7
PROG_GET_FD_BY_ID, MAP_GET_FD_BY_ID = 13, 14
LINK_CREATE = 28
ATTACH_PERF_EVENT = 41  # BPF_PERF_EVENT: a link on a perf event (a classic tracepoint)
BPF_F_RDONLY = 1 << 3  # an OBJ_GET file flag: a read-only fd (of a map; a link or program refuses it)
BPF_F_PATH_FD = 1 << 14  # an OBJ_PIN/OBJ_GET file flag: pathname is relative to path_fd (Linux 6.5)

META = "meta"  # the manifest's pin name
META_NAME = "pstate_meta"  # the manifest map's kernel name
META_SIZE = 32768  # bytes of JSON the manifest holds
MAGIC = "pstate-pins"


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PinError(OSError):
    pass


def _check(res: int, what: str) -> int:
    if res < 0:
        err = ct.get_errno()
        raise PinError(err, f"{what}: {os.strerror(err)}")
    return res


def is_bpffs(path: str) -> bool:
    try:
        with open("/proc/self/mounts") as f:
            return any(line.split()[1] == path and line.split()[2] == "bpf" for line in f)
    except OSError:
        return False


def ensure_bpffs(path: str = BPFFS) -> bool:
    """Mount bpffs at path when it is not mounted there; True when this call mounted it."""
    if is_bpffs(path):
        return False
    if not os.path.isdir(path):
        raise PstateError(f"{path} does not exist: cannot mount the BPF file system", ExitCode.UNAVAILABLE,
                          hint="the kernel needs CONFIG_BPF_SYSCALL; mkdir -p /sys/fs/bpf")
    libc = ct.CDLL(None, use_errno=True)
    if libc.mount(b"bpf", path.encode(), b"bpf", 0, None) != 0:
        err = os.strerror(ct.get_errno())
        raise PstateError(f"bpffs is not mounted at {path} and mounting it failed ({err})", ExitCode.UNAVAILABLE,
                          hint=f"mount -t bpf bpf {path}")
    return True


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape").encode("latin-1").decode("utf-8", "surrogateescape")


def bpffs_mounts() -> list[tuple[str, int]]:
    """(mount point, device) of each bpffs mounted here, one per file system
    (a mount of its top first)."""
    found: dict[int, tuple[bool, str]] = {}
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    for line in lines:
        left, _, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if len(a) < 5 or not b or b[0] != "bpf":
            continue
        major, minor = (int(x) for x in a[2].split(":"))
        dev, top = os.makedev(major, minor), a[3] == "/"
        if dev not in found or (top and not found[dev][0]):
            found[dev] = (top, _unescape(a[4]))
    return [(mp, dev) for dev, (_top, mp) in sorted(found.items(), key=lambda kv: not kv[1][0])]


def owner(uid: int) -> str:
    """uid 65534 (nobody)."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def why_foreign(path: str, st: os.stat_result) -> str | None:
    """Why a directory (its fstat or lstat) is not one only root can change, or None."""
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link, not a directory"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != 0:
        return f"{path} is owned by {owner(st.st_uid)}, not root"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _entry_guarded(parent: os.stat_result, entry: os.stat_result) -> bool:
    """Whether only root can rename or remove an entry of a directory."""
    if parent.st_uid != 0:
        return False
    if not parent.st_mode & 0o022:
        return True
    return bool(parent.st_mode & stat.S_ISVTX) and entry.st_uid == 0


def _changeable(path: str, st: os.stat_result) -> str | None:
    """Who besides root can change the entries of the directory path (its
    fstat), said as `PATH, which WHO owns|can write`; None when no one."""
    if st.st_uid != 0:
        return f"{path}, which {owner(st.st_uid)} owns"
    if st.st_mode & 0o022:
        return f"{path}, which group or others can write (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _exposure(parent_path: str, parent: os.stat_result, path: str, entry: os.stat_result) -> str | None:
    """Who besides root can rename or remove the entry path of the directory
    parent_path (their lstat and fstat), said as _changeable does; None
    when no one: a root-owned entry of root's sticky directory is safe."""
    if parent.st_uid == 0 and parent.st_mode & 0o022 and parent.st_mode & stat.S_ISVTX:
        return None if entry.st_uid == 0 else f"{path}, which {owner(entry.st_uid)} owns"
    return _changeable(parent_path, parent)


# --- opening pins relative to a directory ----------------------------------

_path_fd: bool | None = None


def _has_path_fd() -> bool:
    """Whether bpf(2) takes BPF_F_PATH_FD (Linux 6.5): with a bad path_fd a
    kernel that knows the flag says EBADF, one that does not says EINVAL."""
    global _path_fd
    if _path_fd is None:
        name = ct.create_string_buffer(b"x")
        attr = bpfsys._attr("<QIIi", ct.addressof(name), 0, BPF_F_PATH_FD, -1)
        _path_fd = bpfsys.bpf(OBJ_GET, attr) < 0 and ct.get_errno() == errno.EBADF
    return _path_fd


def _at(dir_fd: int, name: str) -> tuple[ct.Array, int, int]:
    """(pathname, file flag, path_fd) naming name in the directory dir_fd."""
    if "/" in name or name in ("", ".", ".."):
        raise PinError(errno.EINVAL, f"{name!r} is no pin name")
    if _has_path_fd():
        return ct.create_string_buffer(os.fsencode(name)), BPF_F_PATH_FD, dir_fd
    return ct.create_string_buffer(os.fsencode(f"/proc/self/fd/{dir_fd}/{name}")), 0, 0


def pin(fd: int, path: str) -> None:
    name = ct.create_string_buffer(path.encode())
    attr = bpfsys._attr("<QI", ct.addressof(name), fd)
    _check(bpfsys.bpf(OBJ_PIN, attr), f"pinning {path}")


def pin_at(fd: int, dir_fd: int, name: str) -> None:
    """Pin fd as name in the directory dir_fd."""
    path, flag, path_fd = _at(dir_fd, name)
    attr = bpfsys._attr("<QIIi", ct.addressof(path), fd, flag, path_fd)
    _check(bpfsys.bpf(OBJ_PIN, attr), f"pinning {name}")


def _get(path: ct.Array, flags: int, path_fd: int, what: str) -> int:
    attr = bpfsys._attr("<QIIi", ct.addressof(path), 0, flags, path_fd)
    res = bpfsys.bpf(OBJ_GET, attr)
    if res < 0:
        err = ct.get_errno()
        if err == errno.ENOENT:
            raise FileNotFoundError(err, f"nothing pinned at {what}")
        raise PinError(err, f"opening {what}: {os.strerror(err)}")
    return res


def get(path: str, flags: int = 0) -> int:
    """An fd of the object pinned at path (FileNotFoundError when none)."""
    return _get(ct.create_string_buffer(path.encode()), flags, 0, path)


def get_at(dir_fd: int, name: str, flags: int = 0) -> int:
    """An fd of the object pinned as name in the directory dir_fd, never
    through a symbolic link (FileNotFoundError when none). flags:
    BPF_F_RDONLY for a read-only fd of a map (a link or program refuses it:
    EINVAL)."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise PinError(errno.ELOOP, f"{name} is a symbolic link")
    if not stat.S_ISREG(st.st_mode):
        raise PinError(errno.EINVAL, f"{name} is no pin")
    path, flag, path_fd = _at(dir_fd, name)
    return _get(path, flags | flag, path_fd, name)


def _info(fd: int, size: int = 256) -> ct.Array:
    info = ct.create_string_buffer(size)
    attr = bpfsys._attr("<IIQ", fd, len(info), ct.addressof(info))
    _check(bpfsys.bpf(bpfsys.OBJ_GET_INFO_BY_FD, attr), "reading object info")
    return info


def map_id(fd: int) -> int:
    return struct.unpack_from("<I", _info(fd, 88), 4)[0]


def link_info(fd: int) -> dict:
    """type, id and prog_id of a link fd."""
    ltype, lid, prog_id = struct.unpack_from("<III", _info(fd, 64), 0)
    return {"type": ltype, "id": lid, "prog_id": prog_id}


@contextlib.contextmanager
def prog_fd(prog_id: int):
    """An fd of the program with this id, closed on leaving."""
    attr = bpfsys._attr("<I", prog_id)
    fd = _check(bpfsys.bpf(PROG_GET_FD_BY_ID, attr), f"opening program {prog_id}")
    try:
        yield fd
    finally:
        os.close(fd)


def prog_stats(prog_id: int) -> dict:
    """bpfsys.prog_info of a program by its id: name, run_time_ns and
    run_cnt (counted while kernel.bpf_stats_enabled is 1), recursion_misses."""
    with prog_fd(prog_id) as fd:
        return bpfsys.prog_info(fd)


def object_id(fd: int) -> int:
    """The id of a map or link fd (whichever it is)."""
    try:
        return map_id(fd) if _is_map(fd) else link_info(fd)["id"]
    except OSError:
        return 0


def _fd_kind(fd: int) -> str | None:
    """map, link or prog: what a bpf fd is (its fdinfo says)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                for kind in ("map", "link", "prog"):
                    if line.startswith(f"{kind}_type:"):
                        return kind
    except OSError:
        pass
    return None


def _is_map(fd: int) -> bool:
    return _fd_kind(fd) == "map"


def kind_of(name: str, doc: dict) -> str:
    """map or link: the kind of a manifest's pin (recorded since the kinds
    were; before, a link's pin name began with link)."""
    kinds = doc.get("kinds") or {}
    return kinds.get(name) or ("link" if name.startswith("link") else "map")


def perf_link(prog_fd: int, tracefs: str, category: str, event: str) -> int:
    """A BPF link running prog_fd on a classic tracepoint (BPF_LINK_CREATE on
    a perf event): unlike PERF_EVENT_IOC_SET_BPF, it can be pinned."""
    from pstate.kernel.bpfsys import _PerfEventAttr  # the same perf_event_attr as attach_tracepoint's

    attr = _PerfEventAttr(type=bpfsys.PERF_TYPE_TRACEPOINT, size=ct.sizeof(_PerfEventAttr),
                          config=bpfsys.tracepoint_id(tracefs, category, event), sample_period=1, wakeup_events=1)
    pfd = bpfsys._syscall()(ct.c_long(bpfsys._nr(1)), ct.byref(attr), ct.c_int(-1), ct.c_int(0), ct.c_int(-1),
                            ct.c_ulong(bpfsys.PERF_FLAG_FD_CLOEXEC))
    _check(pfd, f"perf_event_open on {category}:{event}")
    try:
        la = bpfsys._attr("<IIII", prog_fd, pfd, ATTACH_PERF_EVENT, 0)
        return _check(bpfsys.bpf(LINK_CREATE, la), f"linking a program to {category}:{event}")
    finally:
        os.close(pfd)  # the link holds the perf event


# --- pstate's own pin directory ------------------------------------------------

class ForeignDir(PinError):
    """A pin directory another user could change (why: the reason)."""

    def __init__(self, why: str):
        super().__init__(errno.EPERM, why)
        self.why = why


def _open_walk(path: str) -> int:
    """An fd of the directory path, each component opened with O_NOFOLLOW."""
    fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in [p for p in path.split("/") if p]:
            nfd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _bpffs_devs() -> set[int]:
    return {dev for _mp, dev in bpffs_mounts()}


def open_pin_dir(path: str, create: bool = False) -> int | None:
    """An fd of a directory to pin in, once it is safe: a real directory (no
    symbolic link) owned by root and writable by no one else, every
    directory above it root's (a sticky one allowed: /sys/fs/bpf), on
    bpffs. create: make it 0700 (whatever the umask) when it is missing;
    else None then. ForeignDir when it is not safe; FileNotFoundError when
    its parent is missing; PinError EXDEV when it is not on bpffs."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    if not os.path.isdir(parent):
        raise FileNotFoundError(errno.ENOENT, f"{parent} does not exist")
    why = trust.why_untrusted_ancestors(path)
    if why:
        raise ForeignDir(why)
    pfd = _open_walk(os.path.realpath(parent))
    created = False
    try:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            if not create:
                return None
            if os.fstat(pfd).st_dev not in _bpffs_devs():
                raise PinError(errno.EXDEV, f"{parent} is not on a BPF file system (bpffs)") from None
            try:
                os.mkdir(name, 0o700, dir_fd=pfd)
                created = True
            except FileExistsError:
                pass  # made meanwhile: checked as any other
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            raise ForeignDir(why_foreign(path, st))
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=pfd)
        except OSError as e:  # ELOOP: a symbolic link now
            raise ForeignDir(f"{path}: {e.strerror}") from None
    finally:
        os.close(pfd)
    try:
        if created:
            os.fchmod(fd, 0o700)  # the umask took nothing away it should not have, and added nothing
        st = os.fstat(fd)  # what was opened, not what was looked at
        why = why_foreign(path, st)
        if why:
            raise ForeignDir(why)
        if st.st_dev not in _bpffs_devs():
            raise PinError(errno.EXDEV, f"{path} is not on a BPF file system (bpffs)")
    except BaseException:
        os.close(fd)
        raise
    return fd


# --- the manifest -------------------------------------------------------------

def create_manifest() -> int:
    return bpfsys.map_create(bpfsys.MAP_ARRAY, 4, META_SIZE, 1, 0, META_NAME)


def write_manifest(fd: int, doc: dict) -> None:
    data = orjson.dumps({"magic": MAGIC, **doc})
    if len(data) >= META_SIZE:
        raise PinError(errno.E2BIG, f"the manifest needs {len(data)} bytes, more than {META_SIZE}")
    key, value = ct.c_uint32(0), ct.create_string_buffer(data, META_SIZE)
    if bpfsys.lib.bpf_update_elem(fd, ct.byref(key), value, bpfsys.BPF_ANY) != 0:
        raise PinError(ct.get_errno(), f"writing the manifest: {os.strerror(ct.get_errno())}")


def read_manifest(fd: int) -> dict | None:
    """The manifest's JSON, or None when fd is no pstate manifest."""
    try:
        info = bpfsys.map_info(fd)
    except OSError:
        return None
    if info["name"] != META_NAME or info["type"] != bpfsys.MAP_ARRAY or info["value_size"] != META_SIZE:
        return None
    key, value = ct.c_uint32(0), ct.create_string_buffer(META_SIZE)
    if bpfsys.lib.bpf_lookup_elem(fd, ct.byref(key), value) != 0:
        return None
    try:
        doc = orjson.loads(value.raw.split(b"\0", 1)[0])
    except orjson.JSONDecodeError:
        return None
    if not (isinstance(doc, dict) and doc.get("magic") == MAGIC and isinstance(doc.get("pins"), dict)):
        return None
    return doc


def _manifest_at(dir_fd: int, name: str, path: str, flags: int = 0) -> tuple[int, dict] | None:
    """(fd, JSON) of the manifest pinned as name in dir_fd, when it is one
    root pinned; None when name is no manifest."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0:
        return None  # another user's pin proves nothing: its JSON is that user's
    try:
        fd = get_at(dir_fd, name, flags)
    except FileNotFoundError:
        return None
    except PinError as e:
        if e.errno == errno.EINVAL:
            return None  # a link or a program: no read-only fd
        raise PinError(e.errno, f"opening {path}: {os.strerror(e.errno)}") from None
    doc = read_manifest(fd)
    if doc is None or doc["pins"].get(META) not in (None, map_id(fd)):
        os.close(fd)
        return None  # not a manifest, or a copy of another's pinned anew
    return fd, doc


def _exists_at(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


class PinSet:
    """The pins of one manifest: those in its directory, and those found
    elsewhere (or renamed) by their ids: strays."""

    def __init__(self, directory: str, doc: dict, meta_fd: int, dir_fd: int,
                 meta_name: str = META, parent_fd: int | None = None, exposed: str | None = None):
        self.dir = directory
        self.doc = doc
        self.meta_fd = meta_fd
        self.meta_name = meta_name
        self.dir_fd = dir_fd
        self.parent_fd = parent_fd
        self.exposed = exposed  # the directory (on the way) whose entries another user can change, or None
        self.strays: dict[str, tuple[str, str]] = {}  # listed name -> (directory, name there)
        self._fds: dict[str, int] = {}

    @classmethod
    def open(cls, directory: str) -> "PinSet | None":
        """The set pinned there; None when nothing is (PinError when the
        directory holds something that is not a pstate manifest pinned by root)."""
        directory = os.path.abspath(directory)
        try:
            pfd = os.open(os.path.dirname(directory), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            return cls.open_at(pfd, os.path.basename(directory), directory)
        finally:
            os.close(pfd)

    @classmethod
    def open_at(cls, parent_fd: int, name: str, directory: str) -> "PinSet | None":
        """The set pinned in the directory name of parent_fd (its path:
        directory), never through a symbolic link; None when nothing is
        pinned there. exposed says why, when another user can change it."""
        try:
            dfd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise PinError(e.errno, f"{directory}: {e.strerror}") from None
        try:
            got = _manifest_at(dfd, META, os.path.join(directory, META))
            if got is None:
                if _exists_at(dfd, META):
                    raise PinError(errno.EINVAL,
                                   f"{os.path.join(directory, META)} is not a pstate manifest pinned by root")
                os.close(dfd)
                return None
        except BaseException:
            os.close(dfd)
            raise
        return cls(directory, got[1], got[0], dfd, parent_fd=os.dup(parent_fd),
                   exposed=_changeable(directory, os.fstat(dfd)))

    def _where(self, name: str) -> tuple[int, str, bool]:
        """(directory fd, name there, whether to close the fd) of the pin
        the manifest lists as name."""
        if name in self.strays:
            d, there = self.strays[name]
            return _open_walk(d), there, True
        return self.dir_fd, (self.meta_name if name == META else name), False

    def _open_checked(self, name: str) -> int:
        """An fd of the pin the manifest lists as name, checked to be the object it recorded."""
        dfd, there, close = self._where(name)
        try:
            fd = get_at(dfd, there)
        finally:
            if close:
                os.close(dfd)
        if object_id(fd) != self.doc["pins"].get(name):
            os.close(fd)
            raise PinError(errno.ESTALE, f"{os.path.join(self.dir, name)} is not the object the manifest recorded")
        return fd

    def fd(self, pin_name: str) -> int:
        """An fd of one of the set's pins (opened once, its id checked)."""
        if pin_name not in self._fds:
            self._fds[pin_name] = self._open_checked(pin_name)
        return self._fds[pin_name]

    def path(self, name: str) -> str:
        """Where the pin the manifest lists as name is."""
        if name in self.strays:
            return os.path.join(*self.strays[name])
        return os.path.join(self.dir, self.meta_name if name == META else name)

    def verified(self) -> dict[str, bool]:
        """pin name -> whether the object pinned there is the one the manifest
        recorded (same id); pins the manifest lists but that are gone are left out."""
        out = {}
        for name in self.doc["pins"]:
            try:
                os.close(self._open_checked(name))
                out[name] = True
            except FileNotFoundError:
                continue
            except PinError as e:
                if e.errno == errno.ENOENT:
                    continue
                out[name] = False
            except OSError:
                out[name] = False
        return out

    def missing(self) -> list[str]:
        """The pins the manifest lists that are not where the set is (nor found elsewhere)."""
        have = self.verified()
        return [n for n in self.doc["pins"] if n not in have]

    def _unlink(self, name: str) -> bool:
        """Unpin name when its directory is one no other user can change; whether it was."""
        dfd, there, close = self._where(name)
        try:
            try:
                entry = os.stat(there, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                return True
            if not _entry_guarded(os.fstat(dfd), entry):
                return False  # another user could swap it between the check and the unlink
            with contextlib.suppress(FileNotFoundError):
                os.unlink(there, dir_fd=dfd)
            return True
        finally:
            if close:
                os.close(dfd)

    def remove(self) -> list[str]:
        """Unpin every object the manifest proves pstate made, the manifest
        last, and the directory when empty; the paths left (not proven, or
        in a directory another user can change)."""
        left = []
        for name, ok in self.verified().items():
            if name == META:
                continue
            if not (ok and self._unlink(name)):
                left.append(self.path(name))
        self.close(keep_dir=True)
        try:
            moved_here = {there for d, there in self.strays.values() if d == self.dir}
            others = [n for n in os.listdir(self.dir_fd) if n != self.meta_name and n not in moved_here]
            if not left and not others:
                self._unlink(META)
                self._rmdir()
            else:
                left += [os.path.join(self.dir, n) for n in others if os.path.join(self.dir, n) not in left]
        finally:
            self.close()
        return left

    def _rmdir(self) -> None:
        st = os.fstat(self.dir_fd)
        base = os.path.basename(self.dir)
        try:
            if self.parent_fd is not None:
                now = os.stat(base, dir_fd=self.parent_fd, follow_symlinks=False)
                if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
                    os.rmdir(base, dir_fd=self.parent_fd)
            elif (os.lstat(self.dir).st_dev, os.lstat(self.dir).st_ino) == (st.st_dev, st.st_ino):
                os.rmdir(self.dir)
        except OSError:
            pass

    def close(self, keep_dir: bool = False) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        if self.meta_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.meta_fd)
            self.meta_fd = None
        if keep_dir:
            return
        for attr in ("dir_fd", "parent_fd"):
            fd = getattr(self, attr)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(self, attr, None)


def pin_all(dir_fd: int, name: str, objects: dict[str, int], doc: dict) -> None:
    """Pin objects (pin name -> map or link fd) under a new directory name
    (0700) of the directory dir_fd, with a manifest listing each one's id
    and kind: the manifest first, so that whatever a killed run pinned is
    listed and can be removed."""
    os.mkdir(name, 0o700, dir_fd=dir_fd)
    sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    meta = create_manifest()
    try:
        os.fchmod(sub, 0o700)
        ids = {n: object_id(fd) for n, fd in objects.items()}
        if not all(ids.values()):
            raise PinError(errno.EINVAL, f"no object id for {[n for n, i in ids.items() if not i]}")
        ids[META] = map_id(meta)
        kinds = {n: _fd_kind(fd) for n, fd in objects.items()}
        kinds[META] = "map"
        write_manifest(meta, {**doc, "pins": ids, "kinds": kinds})
        pin_at(meta, sub, META)
        for n, fd in objects.items():
            pin_at(fd, sub, n)
    finally:
        os.close(meta)
        os.close(sub)

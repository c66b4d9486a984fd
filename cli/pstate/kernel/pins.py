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
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import os
import struct

import orjson

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import bpfsys

BPFFS = "/sys/fs/bpf"

# bpf(2) commands and attach types used here
OBJ_PIN, OBJ_GET = 6, 7
PROG_GET_FD_BY_ID, MAP_GET_FD_BY_ID = 13, 14
LINK_CREATE = 28
ATTACH_PERF_EVENT = 41  # BPF_PERF_EVENT: a link on a perf event (a classic tracepoint)

META = "meta"  # the manifest's pin name
META_NAME = "pstate_meta"  # the manifest map's kernel name
META_SIZE = 32768  # bytes of JSON the manifest holds
MAGIC = "pstate-pins"


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


def pin(fd: int, path: str) -> None:
    name = ct.create_string_buffer(path.encode())
    attr = bpfsys._attr("<QI", ct.addressof(name), fd)
    _check(bpfsys.bpf(OBJ_PIN, attr), f"pinning {path}")


def get(path: str) -> int:
    """An fd of the object pinned at path (FileNotFoundError when none)."""
    name = ct.create_string_buffer(path.encode())
    attr = bpfsys._attr("<QII", ct.addressof(name), 0, 0)
    res = bpfsys.bpf(OBJ_GET, attr)
    if res < 0:
        err = ct.get_errno()
        if err == errno.ENOENT:
            raise FileNotFoundError(err, f"nothing pinned at {path}")
        raise PinError(err, f"opening {path}: {os.strerror(err)}")
    return res


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


def _is_map(fd: int) -> bool:
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            return any(line.startswith("map_type:") for line in f)
    except OSError:
        return False


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
    return doc if isinstance(doc, dict) and doc.get("magic") == MAGIC else None


class PinSet:
    """The pins under one bpffs directory, as its manifest lists them."""

    def __init__(self, directory: str, doc: dict, meta_fd: int):
        self.dir = directory
        self.doc = doc
        self.meta_fd = meta_fd
        self._fds: dict[str, int] = {}

    @classmethod
    def open(cls, directory: str) -> "PinSet | None":
        """The set pinned there; None when nothing is (PinError when the
        directory holds something that is not a pstate manifest)."""
        try:
            fd = get(os.path.join(directory, META))
        except FileNotFoundError:
            return None
        doc = read_manifest(fd)
        if doc is None:
            os.close(fd)
            raise PinError(errno.EINVAL, f"{os.path.join(directory, META)} is not a pstate manifest")
        return cls(directory, doc, fd)

    def fd(self, pin_name: str) -> int:
        """An fd of one of the set's pins (opened once)."""
        if pin_name not in self._fds:
            self._fds[pin_name] = get(os.path.join(self.dir, pin_name))
        return self._fds[pin_name]

    def verified(self) -> dict[str, bool]:
        """pin name -> whether the object pinned there is the one the manifest
        recorded (same id); pins the manifest lists but that are gone are left out."""
        out = {}
        for name, oid in self.doc.get("pins", {}).items():
            try:
                fd = get(os.path.join(self.dir, name))
            except OSError:
                continue
            try:
                out[name] = object_id(fd) == oid
            finally:
                os.close(fd)
        return out

    def remove(self) -> list[str]:
        """Unpin every object the manifest proves pstate made, the manifest
        last, and the directory when empty; the names left (not proven)."""
        left = []
        for name, ok in self.verified().items():
            if name == META:
                continue
            if ok:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.dir, name))
            else:
                left.append(name)
        self.close()
        left += [n for n in os.listdir(self.dir) if n != META and n not in left]
        if not left:
            os.unlink(os.path.join(self.dir, META))
            with contextlib.suppress(OSError):
                os.rmdir(self.dir)
        return left

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        if self.meta_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.meta_fd)
            self.meta_fd = None


def pin_all(directory: str, objects: dict[str, int], doc: dict) -> None:
    """Pin objects (pin name -> map or link fd) under a new directory, with a
    manifest listing each one's id: the manifest first, so that whatever a
    killed run pinned is listed and can be removed."""
    os.mkdir(directory, 0o700)
    meta = create_manifest()
    try:
        ids = {name: object_id(fd) for name, fd in objects.items()}
        if not all(ids.values()):
            raise PinError(errno.EINVAL, f"no object id for {[n for n, i in ids.items() if not i]}")
        ids[META] = map_id(meta)
        write_manifest(meta, {**doc, "pins": ids})
        pin(meta, os.path.join(directory, META))
        for name, fd in objects.items():
            pin(fd, os.path.join(directory, name))
    finally:
        os.close(meta)

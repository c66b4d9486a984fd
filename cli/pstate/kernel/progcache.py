"""A cache of compiled BPF programs, so that only the first run pays for
BCC's clang/LLVM (about a second and 150 MB).

After BCC compiles and loads a program, pstate keeps what it takes to load the
same program again without a compiler: each function's instructions (with
where they reference a map fd), each map's definition, BCC's key/leaf type
descriptions, and which tracepoint runs which function. A later run with
the same key creates the maps, patches their fds into the instructions, loads
and attaches the programs with plain bpf(2) and perf_event_open(2) calls.

The key covers everything that changes the bytecode: the final C text and
its -D cflags, the BCC build, the kernel (release, build, possible CPUs), the
kernel's BTF (a hash of /sys/kernel/btf/vmlinux: the offsets come from it),
the plan (how each tracepoint is taken), the header tree, the format
files of the tracepoints used, and pstate's version. A tp_btf program is
kept with the BTF id of its attach target, valid for that BTF only.

Entries live in /var/cache/pstate/programs (PSTATE_CACHE_DIR elsewhere). A
directory or file not owned by root, or writable by others, or below such a
directory, is never read: the instructions in it run in the kernel (rules in
pstate.trust). An entry is opened once, without following a link, from a
descriptor of the checked directory, and the open file is checked. Pruning
removes only entries this cache wrote (named for their key, which their
checksummed content repeats), never another file. Entries are written atomically and
carry a checksum; any entry that is unreadable, stale or refused by the
verifier is ignored and the program compiled again. PSTATE_NO_CACHE=1
bypasses the cache.

Beside the programs (in its btf/ directory) the cache keeps, per boot, what
the plan reads from the kernel's BTF (btf_facts), so that a start-up on a cached program
does not parse 100 000 BTF types again.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes as ct
import errno
import glob
import hashlib
import importlib.util
import json
import os
import re
import secrets
import struct
import sys

from pstate import __version__
from pstate.kernel import bpfmaps, bpfsys
from pstate.kernel import btf
from pstate.kernel import headers
from pstate.kernel import tpbtf
from pstate import trust

FORMAT = 1
DEFAULT_DIR = "/var/cache/pstate/programs"
KEEP_ENTRIES = 64  # per directory; the oldest go first
MAX_ENTRY_BYTES = 16 << 20

# PSTATE_PROBE (bpf/tpargs.h) is a TRACEPOINT_PROBE where the plan takes the
# classic tracepoint: the format files of those the source names are keyed
_TRACEPOINT_PROBE = re.compile(r"\b(?:TRACEPOINT_PROBE|PSTATE_PROBE)\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)")
# BCC features whose maps or attachments this cache cannot reproduce (a map
# of a type bpfmaps does not implement is refused by its type once compiled;
# the stack-trace map of record --stacks is kept: bpfmaps.StackTraceTable)
_UNCACHEABLE_SOURCE = re.compile(r"\bBPF_TABLE_(PINNED|SHARED|PUBLIC)\b|\"extern\"|\bBPF_PERF_OUTPUT\b|"
                                 r"\bBPF_PROG_ARRAY\b|\bBPF_(HASH|ARRAY)_OF_MAPS\b")


class CacheMiss(Exception):
    """No usable entry; the message says why (for `pstate doctor` and debugging)."""


class NotCacheable(Exception):
    """The compiled program uses something the cache cannot reproduce."""


def enabled() -> bool:
    return os.environ.get("PSTATE_NO_CACHE", "") in ("", "0")


def cache_dir() -> str:
    return os.environ.get("PSTATE_CACHE_DIR") or DEFAULT_DIR


# --- trust -------------------------------------------------------------------

def untrusted(path: str, owner: int = 0, directory: bool = False) -> str | None:
    """Why path must not be trusted (a reason), or None when it may be."""
    return trust.why_untrusted(path, (owner,), directory)


def _untrusted_dir(directory: str, owner: int) -> str | None:
    # every directory above too: whoever can write there can swap the directory
    return trust.why_untrusted_path(directory, (owner,), True)


def _open_dir(directory: str, owner: int) -> int:
    """A descriptor of the checked cache directory (not a link), or
    CacheMiss. The path is walked by descriptor from / (trust.open_dir):
    each directory above is checked as it is opened and the next one opened
    from it, so no other user can swap the path between the check and the
    open; the open directory is checked again."""
    try:
        fd = trust.open_dir(directory, (owner,), strict=True, follow_last=False, check_last=False)
    except trust.WalkError as e:
        raise CacheMiss(e.why) from None
    why = trust.why_untrusted_stat(directory, os.fstat(fd), (owner,), True)
    if why:
        os.close(fd)
        raise CacheMiss(why)
    return fd


def _read_entry_file(dfd: int, name: str, where: str, owner: int) -> bytes:
    """The bytes of DIR/name opened once without following a link, checked
    on the open file (fstat), or CacheMiss."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        raise CacheMiss(f"{where} does not exist") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CacheMiss(f"{where} is not a regular file (a symbolic link)") from None
        raise CacheMiss(f"{where}: {e.strerror}") from None
    try:
        why = trust.why_untrusted_stat(where, os.fstat(fd), (owner,), False)
        if why:
            raise CacheMiss(why)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_ENTRY_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_ENTRY_BYTES:
        raise CacheMiss(f"{where} is too large")
    return data


# --- key ---------------------------------------------------------------------

def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat_id(path: str):
    try:
        st = os.stat(path)
        return [os.path.realpath(path), st.st_size, st.st_mtime_ns]
    except OSError:
        return None


def _bcc_dirs() -> list[str]:
    if "bcc" in sys.modules:
        return [os.path.dirname(sys.modules["bcc"].__file__ or "")]
    try:
        spec = importlib.util.find_spec("bcc")
    except (ImportError, ValueError):
        spec = None
    if spec and spec.submodule_search_locations:
        return list(spec.submodule_search_locations)
    # where pstate.kernel.bccimport.import_bcc looks when the venv lacks it
    return [d for d in sorted(glob.glob("/usr/lib/python3/dist-packages/bcc"))
            + sorted(glob.glob("/usr/lib/python3*/site-packages/bcc")) if os.path.isdir(d)][:1]


def _libbcc() -> str | None:
    arch = getattr(sys.implementation, "_multiarch", "")
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [f"/usr/lib/{arch}", f"/lib/{arch}", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/usr/local/lib64"]
    for d in dirs:
        p = os.path.join(d, "libbcc.so.0")
        if os.path.exists(p):
            return p
    return None


def bcc_identity() -> dict:
    """The BCC build, found without importing bcc (which loads LLVM)."""
    dirs = _bcc_dirs()
    version = _read_bytes(os.path.join(dirs[0], "version.py")) if dirs else None
    lib = _libbcc()
    return {"python": _sha(version) if version else None, "lib": _stat_id(lib) if lib else None}


def tracepoints_in(text: str) -> list[str]:
    return sorted({f"{c}:{e}" for c, e in _TRACEPOINT_PROBE.findall(text)})


def format_hash(tracefs: str, tp: str) -> str | None:
    cat, _, event = tp.partition(":")
    data = _read_bytes(os.path.join(tracefs, "events", cat, event, "format"))
    return _sha(data) if data is not None else None


def _headers_identity(path: str | None):
    """The header tree: its identity (pstate.kernel.headers: the merged tree's
    manifest, the packages' identity), and the files that say which kernel
    configuration it is for. The whole tree is not walked on every run:
    it is checked before every compile, and only root can change it."""
    if not path:
        return None
    files = ("Makefile", "include/generated/autoconf.h", "include/generated/uapi/linux/version.h",
             "include/config/kernel.release")
    return headers.identity(path) + [_stat_id(os.path.join(path, f)) for f in files]


def key_material(name: str, text: str, cflags: list[str], tracefs: str, headers_path: str | None,
                 bcc: dict | None = None, probes: str = "tracepoint") -> dict:
    u = os.uname()
    return {
        "format": FORMAT,
        "pstate": __version__,
        "name": name,
        "text": _sha(text.encode()),
        "cflags": list(cflags),
        "bcc": bcc if bcc is not None else bcc_identity(),
        "kernel": [u.release, u.version, u.machine, bpfsys.possible_cpus()],
        "btf": btf.vmlinux_hash(),
        "probes": probes,
        "headers": _headers_identity(headers_path),
        "tracepoints": {tp: format_hash(tracefs, tp) for tp in tracepoints_in(text)},
    }


def key_of(material: dict) -> str:
    return _sha(json.dumps(material, sort_keys=True, separators=(",", ":")).encode())


_ENTRY_NAME = re.compile(r"^([A-Za-z0-9_.-]+)-([A-Za-z0-9]{40})\.json$")


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def entry_path(directory: str, name: str, key: str) -> str:
    return os.path.join(directory, f"{_safe_name(name)}-{key[:40]}.json")


# --- entry format ------------------------------------------------------------

def _checksum(entry: dict) -> str:
    body = {k: v for k, v in entry.items() if k != "sum"}
    return _sha(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def encode(entry: dict) -> bytes:
    entry = dict(entry, sum=_checksum(entry))
    return json.dumps(entry, sort_keys=True, separators=(",", ":")).encode()


def decode(data: bytes, key: str, name: str, validate=None) -> dict:
    """A checked entry, or CacheMiss."""
    try:
        entry = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise CacheMiss("entry is not valid JSON") from None
    if not isinstance(entry, dict) or entry.get("sum") != _checksum(entry):
        raise CacheMiss("entry checksum does not match")
    if entry.get("format") != FORMAT:
        raise CacheMiss(f"entry format {entry.get('format')!r}, want {FORMAT}")
    if entry.get("key") != key or entry.get("name") != name:
        raise CacheMiss("entry is for another key")
    try:
        (validate or _validate)(entry)
    except (KeyError, TypeError, ValueError, AssertionError) as e:
        raise CacheMiss(f"entry is malformed: {e!r}") from None
    return entry


def _validate(entry: dict) -> None:
    assert isinstance(entry["license"], str) and isinstance(entry["kern_version"], int)
    names = set()
    for m in entry["maps"]:
        for f in ("type", "key_size", "value_size", "max_entries", "flags"):
            assert isinstance(m[f], int) and m[f] >= 0, f
        assert m["type"] in bpfmaps.SUPPORTED_MAP_TYPES, m["type"]
        assert isinstance(m["name"], str) and isinstance(m["key_desc"], str) and isinstance(m["leaf_desc"], str)
        if m["type"] == bpfsys.MAP_STACK_TRACE:
            _validate_stack_map(m)
        names.add(m["name"])
    progs = set()
    for p in entry["progs"]:
        assert p["type"] in (bpfsys.PROG_TRACEPOINT, bpfsys.PROG_RAW_TRACEPOINT, bpfsys.PROG_TRACING)
        assert p["type"] != bpfsys.PROG_TRACING or (isinstance(p["btf_id"], int) and p["btf_id"] > 0)
        insns = base64.b64decode(p["insns"], validate=True)
        assert insns and len(insns) % 8 == 0
        n = len(insns) // 8
        for idx, mname in p["maps"]:
            assert isinstance(idx, int) and 0 <= idx < n - 1 and mname in names
            assert insns[idx * 8] == bpfsys.LD_IMM64
        progs.add(p["name"])
    for a in entry["attach"]:
        assert a["kind"] in ("tracepoint", "raw_tracepoint", "tp_btf") and a["prog"] in progs
        assert isinstance(a["target"], str)


def _validate_stack_map(m: dict) -> None:
    """A stack-trace map as BCC declares one: a u32 stack id, a value of
    whole frames (u64 addresses, or struct bpf_stack_build_id with
    BPF_F_STACK_BUILD_ID), at most STACK_MAX_DEPTH of them, some slots,
    flags the kernel takes for one, and key/leaf types of those sizes (the
    kernel copies value_size bytes into a Leaf at every lookup)."""
    frame = bpfsys.STACK_BUILD_ID_SIZE if m["flags"] & bpfsys.BPF_F_STACK_BUILD_ID else 8
    assert m["key_size"] == bpfsys.STACK_KEY_SIZE, "key_size"
    assert 0 < m["value_size"] <= frame * bpfsys.STACK_MAX_DEPTH and m["value_size"] % frame == 0, "value_size"
    assert m["max_entries"] > 0, "max_entries"
    # BPF_F_NUMA_NODE would need the node, which the entry does not keep
    assert not m["flags"] & ~(bpfsys.STACK_MAP_FLAGS & ~bpfsys.BPF_F_NUMA_NODE), "flags"
    for desc, size in (("key_desc", "key_size"), ("leaf_desc", "value_size")):
        try:
            t = bpfmaps.decode_type(json.loads(m[desc]))
        except (LookupError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{desc}: {e!r}") from None
        assert ct.sizeof(t) == m[size], desc


# --- reading and writing -----------------------------------------------------

def lookup(key: str, name: str, directory: str | None = None, owner: int = 0, validate=None) -> dict:
    directory = directory or cache_dir()
    path = entry_path(directory, name, key)
    dfd = _open_dir(directory, owner)
    try:
        data = _read_entry_file(dfd, os.path.basename(path), path, owner)
    finally:
        os.close(dfd)
    return decode(data, key, name, validate)


# --- what the plan reads from the kernel's BTF ----------------------------

BTF_FACTS = "btf-facts"


def _validate_facts(entry: dict) -> None:
    """A kept btf.facts(): its parts of the shapes facts() gives."""
    for part in btf.FACT_PARTS:
        assert isinstance(entry[part], dict), part
    for k, v in entry["members"].items():
        assert k in btf.MEMBERS and isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v), k
    for k, v in entry["enums"].items():
        assert k in btf.ENUMS and isinstance(v, int), k
    for k, v in entry["tracepoints"].items():
        assert k in btf.EVENTS and isinstance(v["target"], int) and v["target"] > 0, k
        assert isinstance(v["args"], list) and all(isinstance(a, str) for a in v["args"]), k
    for k, v in entry["records"].items():
        assert isinstance(v, dict) and all(isinstance(t, str) for t in v.values()), k


def btf_facts(path: str = btf.VMLINUX) -> dict:
    """btf.facts of the running kernel's BTF, kept in the cache until the next
    boot: parsing its 100 000 types takes about 0.1 s of every start-up, and
    that BTF cannot change while the kernel runs. BtfError when the kernel
    has none; another path, or a disabled cache, is parsed each time."""
    ident = btf.boot_identity(path) if enabled() and path == btf.VMLINUX else None
    if ident is None:
        return btf.read_facts(path)
    key = _sha(json.dumps([FORMAT, __version__, ident, btf.wanted()]).encode())
    directory = os.path.join(cache_dir(), "btf")  # apart from the programs: it is no program entry
    try:
        entry = lookup(key, BTF_FACTS, directory, validate=_validate_facts)
        return {part: entry[part] for part in btf.FACT_PARTS}
    except CacheMiss:
        pass
    got = btf.read_facts(path)
    # nothing is created in a cache directory root may not trust (another user's)
    if not _untrusted_dir(cache_dir(), 0):
        store({"format": FORMAT, "name": BTF_FACTS, "key": key, **got}, directory)
    return got


def store(entry: dict, directory: str | None = None, owner: int = 0) -> str | None:
    """Write an entry atomically; the path, or None when the directory is not
    ours to write (the cache is an optimisation: it never fails a run)."""
    directory = directory or cache_dir()
    try:
        trust.make_dirs(directory, 0o755, (owner,))
        dfd = _open_dir(directory, owner)
    except (OSError, CacheMiss):
        return None
    path = entry_path(directory, entry["name"], entry["key"])
    name = os.path.basename(path)
    tmp = f".tmp-{secrets.token_hex(8)}.json"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(encode(entry))
                f.flush()
                os.fchmod(fd, 0o644)
                os.fsync(fd)
        finally:
            os.close(fd)
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            pass
        else:  # replace only what the cache could have written itself
            if trust.why_untrusted_stat(name, st, (owner,), False):
                raise OSError(errno.EEXIST, f"{path} is not the cache's to replace")
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        os.close(dfd)
        return None
    try:
        _prune_at(dfd, owner)
    finally:
        os.close(dfd)
    return path


def _own_entries(dfd: int, owner: int = 0) -> list[tuple[int, str]]:
    """(mtime ns, name) of the files in the cache directory this cache wrote:
    a regular file named like an entry, owned by owner, whose content is an
    entry (its checksum holds) for the key its name carries. Nothing else
    is ever counted, pruned or reported."""
    out = []
    for e in os.scandir(dfd):
        m = _ENTRY_NAME.match(e.name)
        if not m or not e.is_file(follow_symlinks=False):
            continue
        try:
            data = _read_entry_file(dfd, e.name, e.name, owner)
            st = os.stat(e.name, dir_fd=dfd, follow_symlinks=False)
            entry = json.loads(data)
        except (CacheMiss, OSError, ValueError, UnicodeDecodeError):
            continue
        if (isinstance(entry, dict) and entry.get("sum") == _checksum(entry)
                and str(entry.get("key", ""))[:40] == m.group(2)
                and _safe_name(str(entry.get("name"))) == m.group(1)):
            out.append((st.st_mtime_ns, e.name))
    return out


def prune(directory: str, owner: int = 0, keep: int = KEEP_ENTRIES) -> list[str]:
    """Remove the oldest of this cache's own entries past keep; the names
    removed. Files the cache did not write are never touched."""
    dfd = _open_dir(directory, owner)
    try:
        return _prune_at(dfd, owner, keep)
    finally:
        os.close(dfd)


def _prune_at(dfd: int, owner: int = 0, keep: int = KEEP_ENTRIES) -> list[str]:
    removed = []
    with contextlib.suppress(OSError):
        entries = sorted(_own_entries(dfd, owner), reverse=True)
        for _, name in entries[keep:]:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dfd)
                removed.append(name)
    return removed


def status(directory: str | None = None, owner: int = 0) -> tuple[bool, str]:
    """(usable, one line) for `pstate doctor`."""
    directory = directory or cache_dir()
    if not enabled():
        return True, "disabled (PSTATE_NO_CACHE is set): every run compiles"
    if not os.path.isdir(directory):
        return True, f"{directory}: empty (the next record/snap compiles and fills it)"
    try:
        dfd = _open_dir(directory, owner)
    except CacheMiss as e:
        return False, f"not used: {e}"
    try:
        names = [n for _, n in _own_entries(dfd, owner)]
        size = sum(os.stat(n, dir_fd=dfd, follow_symlinks=False).st_size for n in names)
    except OSError as e:
        return False, f"{directory}: {e.strerror}"
    finally:
        os.close(dfd)
    return True, f"{directory}: {len(names)} compiled program(s), {size // 1024} KiB"


# --- from a BCC module -------------------------------------------------------

def _bcc_lib_prototypes(lib) -> None:
    """Declare the libbcc calls bcc's own Python module leaves undeclared."""
    for fn, res, args in (
        ("bpf_num_tables", ct.c_size_t, [ct.c_void_p]),
        ("bpf_table_name", ct.c_char_p, [ct.c_void_p, ct.c_size_t]),
        ("bpf_table_fd_id", ct.c_int, [ct.c_void_p, ct.c_size_t]),
        ("bpf_table_key_desc_id", ct.c_char_p, [ct.c_void_p, ct.c_size_t]),
        ("bpf_table_leaf_desc_id", ct.c_char_p, [ct.c_void_p, ct.c_size_t]),
        ("bpf_module_license", ct.c_char_p, [ct.c_void_p]),
        ("bpf_module_kern_version", ct.c_uint, [ct.c_void_p]),
    ):
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args


def map_refs(insns: bytes, fd_names: dict[int, str]) -> list[list]:
    """[instruction index, map name] of every ld_imm64 that loads a map fd.
    NotCacheable for any other kind of pseudo load (BTF ids, map values...),
    whose relocation this cache does not know."""
    refs = []
    i, n = 0, len(insns) // 8
    while i < n:
        code, regs, _off, imm = struct.unpack_from("<BBhi", insns, i * 8)
        if code == bpfsys.LD_IMM64:
            src = regs >> 4
            if src == bpfsys.PSEUDO_MAP_FD:
                if imm not in fd_names:
                    raise NotCacheable(f"instruction {i} loads fd {imm}, which is no map of this module")
                refs.append([i, fd_names[imm]])
            elif src != 0:
                raise NotCacheable(f"instruction {i} is a pseudo load of kind {src}")
            i += 2
        else:
            i += 1
    return refs


def export(bpf, lib, key: str, name: str, text: str, tracefs: str, btf_targets: dict | None = None) -> dict:
    """The cache entry for a loaded bcc.BPF object; NotCacheable if it uses
    anything beyond maps of the supported types and (raw) tracepoints.
    btf_targets (event -> BTF id): the module was compiled for the tp_btf
    path, and these PSTATE_PROBE functions run as tp_btf programs
    (pstate.kernel.tpbtf)."""
    if _UNCACHEABLE_SOURCE.search(text):
        raise NotCacheable("the program uses shared, pinned, perf-output or program maps")
    for attr in ("kprobe_fds", "uprobe_fds", "kfunc_entry_fds", "kfunc_exit_fds", "lsm_fds",
                 "perf_buffers", "open_perf_events"):
        if getattr(bpf, attr, None):
            raise NotCacheable(f"the program uses {attr[:-4] if attr.endswith('_fds') else attr}")
    _bcc_lib_prototypes(lib)
    mod = bpf.module
    maps, fd_names = [], {}
    for i in range(lib.bpf_num_tables(mod)):
        mname = lib.bpf_table_name(mod, i).decode()
        fd = lib.bpf_table_fd_id(mod, i)
        if fd < 0:
            raise NotCacheable(f"map {mname} has no fd")
        info = bpfsys.map_info(fd)
        if info["type"] not in bpfmaps.SUPPORTED_MAP_TYPES:
            raise NotCacheable(f"map {mname} is of type {info['type']}")
        fd_names[fd] = mname
        maps.append({"name": mname, "kname": info["name"], "type": info["type"], "key_size": info["key_size"],
                     "value_size": info["value_size"], "max_entries": info["max_entries"], "flags": info["flags"],
                     "key_desc": (lib.bpf_table_key_desc_id(mod, i) or b"").decode(),
                     "leaf_desc": (lib.bpf_table_leaf_desc_id(mod, i) or b"").decode()})
    progs = []
    for fn in bpf.funcs:
        fname = fn.decode() if isinstance(fn, bytes) else fn
        if fname.startswith("tracepoint__"):
            ptype = bpfsys.PROG_TRACEPOINT
        elif fname.startswith("raw_tracepoint__"):
            ptype = bpfsys.PROG_RAW_TRACEPOINT
        else:
            raise NotCacheable(f"function {fname} is neither a tracepoint nor a raw tracepoint program")
        insns = bytes(bpf.dump_func(fn))
        progs.append({"name": fname, "type": ptype, "maps": map_refs(insns, fd_names),
                      "insns": base64.b64encode(insns).decode()})
    attach = []
    for event, btf_id in (btf_targets or {}).items():
        if event not in tpbtf.probes_in(text):
            continue
        fname = tpbtf.PREFIX + event
        insns = bytes(bpf.dump_func(fname.encode()))
        progs.append({"name": fname, "type": bpfsys.PROG_TRACING, "btf_id": btf_id,
                      "maps": map_refs(insns, fd_names), "insns": base64.b64encode(insns).decode()})
        attach.append({"kind": "tp_btf", "target": event, "prog": fname})
    loaded = {p["name"] for p in progs}
    for tp in bpf.tracepoint_fds:
        target = tp.decode() if isinstance(tp, bytes) else tp
        cat, _, event = target.partition(":")
        prog = f"tracepoint__{cat}__{event}"
        if prog not in loaded:
            raise NotCacheable(f"cannot tell which function runs at {target}")
        attach.append({"kind": "tracepoint", "target": target, "prog": prog, "format": format_hash(tracefs, target)})
    for tp in getattr(bpf, "raw_tracepoint_fds", {}):
        target = tp.decode() if isinstance(tp, bytes) else tp
        prog = f"raw_tracepoint__{target}"
        if prog not in loaded:
            raise NotCacheable(f"cannot tell which function runs at raw tracepoint {target}")
        attach.append({"kind": "raw_tracepoint", "target": target, "prog": prog})
    if not attach:
        raise NotCacheable("nothing is attached")
    return {"format": FORMAT, "key": key, "name": name,
            "license": (lib.bpf_module_license(mod) or b"GPL").decode(),
            "kern_version": int(lib.bpf_module_kern_version(mod)),
            "maps": maps, "progs": progs, "attach": attach}


# --- loading an entry ----------------------------------------------------------

class Loaded:
    """Maps, programs and attachments created from an entry; table(name)
    gives the same kind of object as bcc.BPF()[name]."""

    def __init__(self):
        self.map_fds: dict[str, int] = {}
        self.tables: dict[str, object] = {}
        self.prog_fds: dict[str, int] = {}
        self.perf_fds: dict[str, int] = {}  # tracepoint -> perf event fd
        self.raw_fds: dict[str, int] = {}  # raw tracepoint -> fd
        self.maps: list[dict] = []  # the entry's map definitions (with BCC's key/leaf descriptions)

    def table(self, name: str):
        return self.tables[name]

    def detach_one(self, target: str) -> None:
        fd = self.perf_fds.pop(target, None)
        if fd is not None:
            bpfsys.close_perf_event(fd)
        fd = self.raw_fds.pop(target, None)
        if fd is not None:
            os.close(fd)

    def attached(self) -> list[str]:
        return list(self.perf_fds) + list(self.raw_fds)

    def close(self) -> None:
        for target in self.attached():
            with contextlib.suppress(OSError):
                self.detach_one(target)
        for fds in (self.prog_fds, self.map_fds):
            for fd in fds.values():
                with contextlib.suppress(OSError):
                    os.close(fd)
            fds.clear()
        self.tables.clear()


def _create_map(m: dict) -> int:
    args = (m["type"], m["key_size"], m["value_size"], m["max_entries"], m["flags"], m["kname"] or m["name"])
    try:
        return bpfsys.map_create(*args)
    except OSError as e:
        if e.errno != 1:  # EPERM: kernels before 5.11 charge maps to RLIMIT_MEMLOCK
            raise
        import resource
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        return bpfsys.map_create(*args)


def _patched(insns: bytes, refs: list, fds: dict[str, int]) -> bytes:
    buf = bytearray(insns)
    for idx, mname in refs:
        struct.pack_into("<i", buf, idx * 8 + 4, fds[mname])
    return bytes(buf)


def load(entry: dict, tracefs: str) -> Loaded:
    """Create, load and attach everything in an entry; CacheMiss (with all
    that was created closed again) if anything fails or is stale."""
    for a in entry["attach"]:
        if a["kind"] == "tracepoint" and a["format"] != format_hash(tracefs, a["target"]):
            raise CacheMiss(f"the format of tracepoint {a['target']} changed")
    if not bpfsys.supported():
        raise CacheMiss("no bpf syscall numbers for this architecture")
    out = Loaded()
    out.maps = entry["maps"]
    try:
        for m in entry["maps"]:
            out.map_fds[m["name"]] = fd = _create_map(m)
            out.tables[m["name"]] = bpfmaps.make_table(fd, m["name"], m["key_desc"], m["leaf_desc"], m["type"],
                                                      m["max_entries"], m["flags"])
        for p in entry["progs"]:
            insns = _patched(base64.b64decode(p["insns"]), p["maps"], out.map_fds)
            fd, _log = bpfsys.prog_load(p["type"], insns, entry["license"], entry["kern_version"], p["name"],
                                        attach_btf_id=p.get("btf_id", 0))
            if fd < 0:
                raise CacheMiss(f"the kernel refused cached program {p['name']}: {os.strerror(-fd)}")
            out.prog_fds[p["name"]] = fd
        for a in entry["attach"]:
            prog = out.prog_fds[a["prog"]]
            if a["kind"] == "tracepoint":
                cat, _, event = a["target"].partition(":")
                out.perf_fds[a["target"]] = bpfsys.attach_tracepoint(prog, tracefs, cat, event)
            else:  # a tp_btf program attaches to the target it was loaded for
                out.raw_fds[a["target"]] = bpfsys.attach_raw_tracepoint(
                    prog, a["target"] if a["kind"] == "raw_tracepoint" else None)
    except CacheMiss:
        out.close()
        raise
    except Exception as e:  # whatever is wrong with an entry, compiling is the answer
        out.close()
        raise CacheMiss(f"loading the cached program failed: {e!r}") from None
    return out

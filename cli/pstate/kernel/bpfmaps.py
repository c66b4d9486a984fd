"""BPF maps as pstate reads and writes them: the subset of BCC's table API
pstate uses (a MutableMapping of ctypes keys and leaves, map_fd, Key/Leaf,
the batch operations), over the calls of pstate.kernel.bpfsys, so the rest
of pstate sees the same objects whichever way a program was loaded; and
the one rule for rows the programs write in place while they are read
(settle)."""

from __future__ import annotations

import ctypes as ct
import errno
import json
import os
from collections.abc import MutableMapping
from functools import reduce

from pstate.kernel.bpfsys import (BPF_F_STACK_BUILD_ID, BPF_NOEXIST, ENOTSUPP, MAP_ARRAY, MAP_HASH, MAP_LRU_HASH,
                                  MAP_LRU_PERCPU_HASH, MAP_PERCPU_ARRAY, MAP_PERCPU_HASH, MAP_RINGBUF, MAP_STACK_TRACE,
                                  STACK_MAX_DEPTH, BpfError, lib, map_info, possible_cpus)


# --- key/leaf types from BCC's JSON descriptions -----------------------------

_SCALARS = {
    "_Bool": ct.c_bool, "char": ct.c_char, "signed char": ct.c_byte, "wchar_t": ct.c_wchar,
    "unsigned char": ct.c_ubyte, "short": ct.c_short, "unsigned short": ct.c_ushort, "int": ct.c_int,
    "unsigned int": ct.c_uint, "long": ct.c_long, "unsigned long": ct.c_ulong, "long long": ct.c_longlong,
    "unsigned long long": ct.c_ulonglong, "float": ct.c_float, "double": ct.c_double,
    "long double": ct.c_longdouble, "__int128": ct.c_int64 * 2, "unsigned __int128": ct.c_uint64 * 2,
}


def decode_type(desc):
    """The ctypes type BCC builds for a key or leaf description (a scalar
    name, or [name, [[field, type(, [n] | bits | kind)]...], kind])."""
    if isinstance(desc, str):
        return _SCALARS[desc]
    fields, anon = [], []
    for f in desc[1]:
        if len(f) == 2:
            fields.append((f[0], decode_type(f[1])))
        elif len(f) == 3 and isinstance(f[2], list):
            fields.append((f[0], decode_type(f[1]) * f[2][0]))
        elif len(f) == 3 and isinstance(f[2], int):
            fields.append((f[0], decode_type(f[1]), f[2]))
        elif len(f) == 3 and f[2] in ("struct", "union", "struct_packed"):
            name = f[0] or f"__anon{len(anon)}"
            if not f[0]:
                anon.append(name)
            fields.append((name, decode_type(f)))
        else:
            raise ValueError(f"cannot decode type {f!r}")
    kind = desc[2] if len(desc) > 2 else "struct"
    base = ct.Union if kind == "union" else ct.Structure
    ns = {"_anonymous_": anon, "_fields_": fields}
    if kind == "struct_packed":
        ns["_pack_"] = 1
    return type(str(desc[0]), (base,), ns)


# --- tables ------------------------------------------------------------------

# copies of a value written meanwhile before the last is taken as it is (one
# program's write takes well under a microsecond, a copy about as long)
COPY_TRIES = 8


def settle(copy, first: bytes | None = None) -> bytes | None:
    """A value the programs write in place (a map's rows, which no lock
    keeps whole while user space copies one), copied by copy() until two
    copies in a row agree: a copy taken across a write mixes the row before
    and the row after. copy() gives the value's bytes, or None once the
    entry is gone (then so does this); `first`, a copy already taken."""
    row = copy() if first is None else first
    for _ in range(COPY_TRIES):
        if row is None:
            return None
        again = copy()
        if again == row:
            return row
        row = again
    return row


class Table(MutableMapping):
    """A hash map: ctypes Key -> Leaf. Errors as BCC's: KeyError when absent,
    Exception when an update fails."""

    def __init__(self, map_fd: int, name: str, key_type, leaf_type, map_type: int, max_entries: int,
                 flags: int = 0):
        self.map_fd = map_fd
        self.name = self._name = name
        self.Key = key_type
        self.Leaf = leaf_type
        self.ttype = map_type
        self.max_entries = max_entries
        self.flags = flags

    @classmethod
    def over(cls, table) -> "Table":
        """A Table on another table object's map (BCC's, say): the same fd,
        key and leaf types, so that every map is read through this class."""
        if isinstance(table, Table):
            return table
        info = map_info(table.map_fd)
        return cls(table.map_fd, getattr(table, "name", ""), table.Key, table.Leaf, info["type"],
                   info["max_entries"], info["flags"])

    def get_fd(self):
        return self.map_fd

    def insert(self, key, leaf) -> int:
        """Add key only where it is absent (BPF_NOEXIST): 0, or the errno
        (EEXIST when it is there)."""
        if lib.bpf_update_elem(self.map_fd, ct.byref(key), ct.byref(leaf), BPF_NOEXIST) == 0:
            return 0
        return ct.get_errno()

    def remove(self, key) -> bool:
        """Delete key; whether it was there (a delete that succeeds is a claim on it)."""
        return lib.bpf_delete_elem(self.map_fd, ct.byref(key)) == 0

    def read_all(self, delete: bool = False, chunk: int = 1024) -> list:
        """(key, leaf) of every entry (deleting them if `delete`), read in
        batches of `chunk`: buffers for the whole map at every call would be
        megabytes for a mostly empty one. Kernels without batch operations
        (before 5.6) are read key by key."""
        Key, Leaf = self.Key, self.Leaf
        batches = self._batches(delete, chunk)
        if batches is None:
            return self._read_slowly(delete)
        return [(Key.from_buffer_copy(k), Leaf.from_buffer_copy(v)) for k, v in batches]

    def _batches(self, delete: bool, chunk: int):
        """The (key bytes, value bytes) of every entry, read in batches; None
        where the kernel has no batch operations."""
        call = lib.bpf_lookup_and_delete_batch if delete else lib.bpf_lookup_batch
        ksz, vsz = ct.sizeof(self.Key), ct.sizeof(self.Leaf)
        keys, values = (self.Key * chunk)(), (self.Leaf * chunk)()
        kview, vview = memoryview(keys).cast("B"), memoryview(values).cast("B")
        # the resume token is a bucket number for hash maps, a key for arrays
        token, cnt, out = ct.create_string_buffer(max(ksz, 8)), ct.c_uint32(0), []
        first = True
        while True:
            cnt.value = chunk
            res = call(self.map_fd, None if first else ct.byref(token), ct.byref(token), ct.byref(keys),
                       ct.byref(values), ct.byref(cnt))
            err = ct.get_errno()
            if res != 0 and err != errno.ENOENT:
                if first and err in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP):
                    return None
                raise BpfError(err, f"BPF_MAP_LOOKUP{'_AND_DELETE' if delete else ''}_BATCH: {os.strerror(err)}")
            first = False
            out += [(kview[i * ksz:(i + 1) * ksz].tobytes(), vview[i * vsz:(i + 1) * vsz].tobytes())
                    for i in range(cnt.value)]
            if res != 0 or cnt.value == 0:
                return out

    def read_settled(self) -> list:
        """(key, leaf) of every entry of a map whose programs write rows in
        place (read_all, whose copies a concurrent write can tear): read
        twice, and a row whose two copies differ is looked up alone until
        two copies agree (settle). A row gone by the second read is left
        out: deleted meanwhile."""
        def read() -> list:
            rows = self._batches(False, 1024)
            if rows is None:  # (no batch operations: key by key)
                rows = [(bytes(k), bytes(v)) for k, v in self.read_all()]
            return rows

        before = dict(read())
        Key, Leaf, out = self.Key, self.Leaf, []
        for kraw, raw in read():
            key = Key.from_buffer_copy(kraw)
            if before.get(kraw) != raw:
                raw = settle(lambda: self.copy(key), raw)
                if raw is None:
                    continue
            out.append((key, Leaf.from_buffer_copy(raw)))
        return out

    def copy(self, key) -> bytes | None:
        """The bytes of key's value, or None when it is absent."""
        leaf = self.get(key)
        return None if leaf is None else bytes(leaf)

    def _read_slowly(self, delete: bool) -> list:
        items = self.items()
        if delete:
            for k, _v in items:
                self.remove(k)
        return items

    def __getitem__(self, key):
        leaf = self.Leaf()
        if lib.bpf_lookup_elem(self.map_fd, ct.byref(key), ct.byref(leaf)) < 0:
            raise KeyError(key)
        return leaf

    def __setitem__(self, key, leaf):
        if lib.bpf_update_elem(self.map_fd, ct.byref(key), ct.byref(leaf), 0) < 0:
            raise Exception(f"Could not update table: {os.strerror(ct.get_errno())}")

    def __delitem__(self, key):
        if lib.bpf_delete_elem(self.map_fd, ct.byref(key)) < 0:
            raise KeyError(key)

    def __iter__(self):
        key = None
        while True:
            nxt = self.Key()
            if key is None:
                res = lib.bpf_get_first_key(self.map_fd, ct.byref(nxt))
            else:
                res = lib.bpf_get_next_key(self.map_fd, ct.byref(key), ct.byref(nxt))
            if res < 0:
                return
            yield nxt
            key = nxt

    def __len__(self):
        return sum(1 for _ in self)

    def keys(self):
        return iter(self)

    def itervalues(self):
        for key in self:
            try:
                yield self[key]
            except KeyError:  # deleted since its key was read
                pass

    def iteritems(self):
        for key in self:
            try:
                yield key, self[key]
            except KeyError:
                pass

    def items(self):
        return list(self.iteritems())

    def values(self):
        return list(self.itervalues())

    def clear(self):
        for k in list(self.keys()):
            try:
                del self[k]
            except KeyError:
                pass

    def zero(self):
        for k in list(self.keys()):
            self[k] = self.Leaf()

    def items_lookup_batch(self):
        yield from self._batch_items(delete=False)

    def items_lookup_and_delete_batch(self):
        yield from self._batch_items(delete=True)

    def items_delete_batch(self, ct_keys=None):
        if ct_keys is None:
            for _ in self.items_lookup_and_delete_batch():
                pass
            return
        cnt = ct.c_uint32(len(ct_keys))
        if lib.bpf_delete_batch(self.map_fd, ct.byref(ct_keys), ct.byref(cnt)) != 0:
            raise Exception(f"BPF_MAP_DELETE_BATCH has failed: {os.strerror(ct.get_errno())}")

    def items_update_batch(self, ct_keys, ct_values):
        if len(ct_keys) != len(ct_values):
            raise ValueError("keys array length != values array length")
        cnt = ct.c_uint32(len(ct_keys))
        if lib.bpf_update_batch(self.map_fd, ct.byref(ct_keys), ct.byref(ct_values), ct.byref(cnt)) != 0:
            raise Exception(f"BPF_MAP_UPDATE_BATCH has failed: {os.strerror(ct.get_errno())}")

    def _batch_items(self, delete: bool):
        yield from self.read_all(delete)


class ArrayTable(Table):
    """An array map: keys 0..max_entries-1 always exist; deleting zeroes."""

    def _normalize_key(self, key):
        if isinstance(key, int):
            key = self.Key(key + len(self) if key < 0 else key)
        if not isinstance(key, ct._SimpleCData):
            raise IndexError("Array index must be an integer type")
        if key.value >= len(self):
            raise IndexError("Array index out of range")
        return key

    def __len__(self):
        return self.max_entries

    def __getitem__(self, key):
        return super().__getitem__(self._normalize_key(key))

    def __setitem__(self, key, leaf):
        super().__setitem__(self._normalize_key(key), leaf)

    def __delitem__(self, key):
        self.clearitem(key)

    def clearitem(self, key):
        super().__setitem__(self._normalize_key(key), self.Leaf())

    def __iter__(self):
        return (self.Key(i) for i in range(len(self)))


class _PerCpu:
    """Per-CPU leaves: one value per possible CPU, each padded to 8 bytes."""

    def _per_cpu(self, reducer=None):
        self.reducer = reducer
        self.sLeaf = self.Leaf
        self.total_cpu = possible_cpus()
        self.alignment = ct.sizeof(self.sLeaf) % 8
        if self.alignment == 0:
            self.Leaf = self.sLeaf * self.total_cpu
        elif self.sLeaf == ct.c_uint:
            self.Leaf = ct.c_uint64 * self.total_cpu
        elif self.sLeaf == ct.c_int:
            self.Leaf = ct.c_int64 * self.total_cpu
        else:
            raise IndexError("Leaf must be aligned to 8 bytes")

    def getvalue(self, key):
        result = Table.__getitem__(self, self._key(key))
        if self.alignment == 0:
            return result
        ret = (self.sLeaf * self.total_cpu)()
        for i in range(self.total_cpu):
            ret[i] = result[i]
        return ret

    def __getitem__(self, key):
        vals = self.getvalue(key)
        return reduce(self.reducer, vals) if self.reducer else vals

    def sum(self, key):
        if isinstance(self.Leaf(), ct.Structure):
            raise IndexError("Leaf must be an integer type for default sum functions")
        return self.sLeaf(sum(self.getvalue(key)))

    def max(self, key):
        if isinstance(self.Leaf(), ct.Structure):
            raise IndexError("Leaf must be an integer type for default max functions")
        return self.sLeaf(max(self.getvalue(key)))

    def average(self, key):
        return self.sum(key).value / self.total_cpu


class PerCpuTable(_PerCpu, Table):
    def __init__(self, *args, reducer=None, **kwargs):
        Table.__init__(self, *args, **kwargs)
        self._per_cpu(reducer)

    def _key(self, key):
        return key


class PerCpuArrayTable(_PerCpu, ArrayTable):
    def __init__(self, *args, reducer=None, **kwargs):
        ArrayTable.__init__(self, *args, **kwargs)
        self._per_cpu(reducer)

    def _key(self, key):
        return self._normalize_key(key)


class RingBufTable(Table):
    """A ring buffer: only its fd is of use (pstate mmaps it directly)."""

    def __len__(self):
        return 0

    def __iter__(self):
        return iter(())

    def open_ring_buffer(self, *args, **kwargs):
        raise NotImplementedError("read this ring buffer through its map_fd (pstate.kernel.loader.RingReader)")


class StackTraceTable(Table):
    """A stack-trace map, as BCC's StackTrace: Key a c_int stack id, Leaf
    BCC's struct bpf_stacktrace (ip: STACK_MAX_DEPTH u64 addresses).
    walk(stack_id) gives a stack's addresses, leaf first, up to the first
    zero; `del t[t.Key(id)]` frees a stack id (KeyError when it is not in
    use), so that the kernel can give it to another stack. User space cannot
    write one (the kernel refuses updates: an Exception, as BCC's), and, as
    in BCC, clear() does nothing: stack ids are freed one by one, by whoever
    read them."""

    MAX_DEPTH = STACK_MAX_DEPTH
    BPF_F_STACK_BUILD_ID = BPF_F_STACK_BUILD_ID
    BPF_STACK_BUILD_ID_EMPTY, BPF_STACK_BUILD_ID_VALID, BPF_STACK_BUILD_ID_IP = 0, 1, 2

    def walk(self, stack_id: int, resolve=None):
        """The addresses of a stack (resolve(addr) of each, if given), leaf
        first; KeyError when the id holds no stack. A build-id stack gives
        its struct bpf_stack_build_id entries, up to the first that is no
        valid build id, as BCC's walk does."""
        leaf = self[self.Key(stack_id)]
        build_id = self.flags & BPF_F_STACK_BUILD_ID
        frames = leaf.trace if build_id else leaf.ip
        out = []
        for addr in frames[:self.MAX_DEPTH]:
            if build_id:
                if addr.status in (self.BPF_STACK_BUILD_ID_IP, self.BPF_STACK_BUILD_ID_EMPTY):
                    break
            elif addr == 0:
                break
            out.append(resolve(addr) if resolve else addr)
        return iter(out)

    def clear(self):
        pass


# the table class of each map type pstate implements
CLASSES = {MAP_HASH: Table, MAP_LRU_HASH: Table, MAP_ARRAY: ArrayTable, MAP_PERCPU_HASH: PerCpuTable,
           MAP_LRU_PERCPU_HASH: PerCpuTable, MAP_PERCPU_ARRAY: PerCpuArrayTable, MAP_RINGBUF: RingBufTable,
           MAP_STACK_TRACE: StackTraceTable}
SUPPORTED_MAP_TYPES = frozenset(CLASSES)


def make_table(map_fd: int, name: str, key_desc: str, leaf_desc: str, map_type: int, max_entries: int,
               flags: int = 0):
    """The table object for a map, from BCC's JSON key/leaf descriptions."""
    key = decode_type(json.loads(key_desc))
    leaf = decode_type(json.loads(leaf_desc))
    try:
        return CLASSES[map_type](map_fd, name, key, leaf, map_type, max_entries, flags)
    except KeyError:
        raise ValueError(f"map type {map_type} is not supported") from None

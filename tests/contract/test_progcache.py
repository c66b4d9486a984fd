"""The compiled-program cache: its key, entry format, trust rules and
corruption handling (no root needed), and, with BPF, that a program loaded
from the cache attaches and records what a freshly compiled one does."""

from __future__ import annotations

import base64
import ctypes as ct
import json
import os
import struct

import pytest

from conftest import cache_entries
from pstate.kernel import bpfmaps, bpfsys
from pstate.kernel import progcache
from pstate.kernel.progcache import CacheMiss, NotCacheable
from pstate.stream import vocab

ME = os.geteuid()

TEXT = """
BPF_HASH(tasks, u32, u64, 128);
TRACEPOINT_PROBE(sched, sched_switch) { return 0; }
TRACEPOINT_PROBE( task , task_newtask ) { return 0; }
"""


def ld_map(fd: int, src: int = bpfsys.PSEUDO_MAP_FD) -> bytes:
    """ld_imm64 r1, <fd> (two slots)."""
    return struct.pack("<BBhi", bpfsys.LD_IMM64, (src << 4) | 1, 0, fd) + struct.pack("<BBhi", 0, 0, 0, 0)


MOV_R0_0 = struct.pack("<BBhi", 0xB7, 0, 0, 0)
EXIT = struct.pack("<BBhi", 0x95, 0, 0, 0)


@pytest.fixture
def tracefs(tmp_path):
    root = tmp_path / "tracefs"
    for tp in ("sched/sched_switch", "task/task_newtask"):
        d = root / "events" / tp
        d.mkdir(parents=True)
        (d / "format").write_text(f"name: {tp}\nfield:int pid;\n")
        (d / "id").write_text("1\n")
    return str(root)


@pytest.fixture
def cachedir(tmp_path):
    d = tmp_path / "cache" / "programs"
    d.mkdir(parents=True)
    os.chmod(d.parent, 0o755)
    os.chmod(d, 0o755)
    return str(d)


def material(tracefs, **over):
    args = {"name": "record", "text": TEXT, "cflags": ["-DMAX_TASKS=128"], "tracefs": tracefs,
            "headers_path": None, "bcc": {"python": "v", "lib": None}}
    args.update(over)
    return progcache.key_material(**args)


def entry(key="k" * 64, name="record", **over) -> dict:
    insns = MOV_R0_0 + ld_map(7) + EXIT
    e = {"format": progcache.FORMAT, "key": key, "name": name, "license": "GPL", "kern_version": 0,
         "maps": [{"name": "tasks", "kname": "tasks", "type": bpfsys.MAP_HASH, "key_size": 4, "value_size": 8,
                   "max_entries": 128, "flags": 0, "key_desc": '"unsigned int"',
                   "leaf_desc": '"unsigned long long"'}],
         "progs": [{"name": "tracepoint__sched__sched_switch", "type": bpfsys.PROG_TRACEPOINT,
                    "insns": base64.b64encode(insns).decode(), "maps": [[1, "tasks"]]}],
         "attach": [{"kind": "tracepoint", "target": "sched:sched_switch",
                     "prog": "tracepoint__sched__sched_switch", "format": None}]}
    e.update(over)
    return e


# --- key -------------------------------------------------------------------------

def test_key_is_stable_and_covers_every_input(tracefs, monkeypatch):
    base = progcache.key_of(material(tracefs))
    assert base == progcache.key_of(material(tracefs))
    assert len(base) == 64
    changed = {
        "text": progcache.key_of(material(tracefs, text=TEXT + "\n")),
        "cflags": progcache.key_of(material(tracefs, cflags=["-DMAX_TASKS=256"])),
        "name": progcache.key_of(material(tracefs, name="snap")),
        "bcc": progcache.key_of(material(tracefs, bcc={"python": "w", "lib": None})),
    }
    monkeypatch.setattr(progcache, "__version__", "9.9.9")
    changed["pstate version"] = progcache.key_of(material(tracefs))
    monkeypatch.undo()
    with open(os.path.join(tracefs, "events/task/task_newtask/format"), "a") as f:
        f.write("field:int extra;\n")
    changed["tracepoint format"] = progcache.key_of(material(tracefs))
    real = os.uname()
    monkeypatch.setattr(progcache.os, "uname", lambda: os.uname_result(
        (real.sysname, real.nodename, real.release + "-other", real.version, real.machine)))
    changed["kernel"] = progcache.key_of(material(tracefs))
    monkeypatch.undo()
    changed["probes"] = progcache.key_of(material(tracefs, probes="tp_btf"))
    monkeypatch.setattr(progcache.btf, "vmlinux_hash", lambda path=None: "another kernel's BTF")
    changed["kernel BTF"] = progcache.key_of(material(tracefs))
    assert len(set(changed.values()) | {base}) == len(changed) + 1, changed


def test_tp_btf_probes_count_as_tracepoints_in_the_text():
    """On the tracepoint path a PSTATE_PROBE is a TRACEPOINT_PROBE: its format is in the key."""
    assert progcache.tracepoints_in("PSTATE_PROBE(sched, sched_switch) {}\nTRACEPOINT_PROBE(task, task_newtask)") \
        == ["sched:sched_switch", "task:task_newtask"]


def test_tp_btf_entry_round_trip():
    tp = {"name": "tp_btf__sched_switch", "type": bpfsys.PROG_TRACING, "btf_id": 10306,
          "insns": base64.b64encode(MOV_R0_0 + EXIT).decode(), "maps": []}
    e = entry()
    e = entry(progs=e["progs"] + [tp],
              attach=e["attach"] + [{"kind": "tp_btf", "target": "sched_switch", "prog": "tp_btf__sched_switch"}])
    assert progcache.decode(progcache.encode(e), e["key"], "record")["progs"][1]["btf_id"] == 10306
    bad = dict(e, progs=e["progs"][:1] + [dict(tp, btf_id=0)])
    with pytest.raises(CacheMiss, match="malformed"):
        progcache.decode(progcache.encode(bad), e["key"], "record")


def test_key_covers_the_header_tree(tracefs, tmp_path):
    a, b = tmp_path / "ha", tmp_path / "hb"
    for d in (a, b):
        d.mkdir()
        (d / "Makefile").write_text("VERSION = 6\n")
    assert progcache.key_of(material(tracefs, headers_path=str(a))) != \
        progcache.key_of(material(tracefs, headers_path=str(b)))


def test_tracepoints_in_text():
    assert progcache.tracepoints_in(TEXT) == ["sched:sched_switch", "task:task_newtask"]


def test_bcc_identity_does_not_import_bcc():
    import sys

    had = "bcc" in sys.modules
    ident = progcache.bcc_identity()
    assert set(ident) == {"python", "lib"}
    assert ("bcc" in sys.modules) == had


def test_bypass_env(monkeypatch):
    monkeypatch.delenv("PSTATE_NO_CACHE", raising=False)
    assert progcache.enabled()
    monkeypatch.setenv("PSTATE_NO_CACHE", "1")
    assert not progcache.enabled()
    monkeypatch.setenv("PSTATE_NO_CACHE", "0")
    assert progcache.enabled()


# --- entry format --------------------------------------------------------------------

def test_encode_decode_round_trip():
    e = entry()
    assert progcache.decode(progcache.encode(e), e["key"], "record") == dict(e, sum=progcache._checksum(e))


@pytest.mark.parametrize("mangle, why", [
    (lambda d: d[: len(d) // 2], "not valid JSON"),
    (lambda d: b"\xff\xfe" + d, "not valid JSON"),
    (lambda d: b"[]", "checksum"),
    (lambda d: d.replace(b'"license":"GPL"', b'"license":"BSD"'), "checksum"),
    (lambda d: b"", "not valid JSON"),
])
def test_corrupt_entries_are_misses(mangle, why):
    e = entry()
    with pytest.raises(CacheMiss, match=why):
        progcache.decode(mangle(progcache.encode(e)), e["key"], "record")


def test_entry_for_another_key_or_format_is_a_miss():
    e = entry()
    data = progcache.encode(e)
    with pytest.raises(CacheMiss, match="another key"):
        progcache.decode(data, "x" * 64, "record")
    with pytest.raises(CacheMiss, match="another key"):
        progcache.decode(data, e["key"], "snap")
    with pytest.raises(CacheMiss, match="format"):
        progcache.decode(progcache.encode(entry(format=progcache.FORMAT + 1)), e["key"], "record")


@pytest.mark.parametrize("over", [
    {"progs": [{"name": "p", "type": 5, "insns": base64.b64encode(EXIT).decode(), "maps": [[5, "tasks"]]}],
     "attach": []},  # map reference beyond the program
    {"progs": [{"name": "p", "type": 5, "insns": base64.b64encode(MOV_R0_0 + EXIT).decode(),
                "maps": [[0, "tasks"]]}], "attach": []},  # a reference that is no ld_imm64
    {"progs": [{"name": "p", "type": 5, "insns": "!!!", "maps": []}], "attach": []},
    {"progs": [{"name": "p", "type": 5, "insns": base64.b64encode(EXIT[:5]).decode(), "maps": []}],
     "attach": []},
    {"progs": [{"name": "p", "type": 1, "insns": base64.b64encode(EXIT).decode(), "maps": []}], "attach": []},
    {"maps": [{"name": "m", "type": 4, "key_size": 4, "value_size": 4, "max_entries": 2, "flags": 0,
               "key_desc": "", "leaf_desc": ""}]},  # perf event array: not supported
    {"attach": [{"kind": "kprobe", "target": "x", "prog": "tracepoint__sched__sched_switch"}]},
    {"attach": [{"kind": "tracepoint", "target": "a:b", "prog": "nonesuch"}]},
    {"license": None},
    {"maps": "nope"},
])
def test_malformed_entries_are_misses(over):
    e = entry(**over)
    with pytest.raises(CacheMiss, match="malformed"):
        progcache.decode(progcache.encode(e), e["key"], "record")


STACK_MAP = {"name": "stacks", "kname": "stacks", "type": bpfsys.MAP_STACK_TRACE, "key_size": 4,
             "value_size": 8 * bpfsys.STACK_MAX_DEPTH, "max_entries": 16384, "flags": 0, "key_desc": '"int"',
             "leaf_desc": '["bpf_stacktrace", [["ip","unsigned long long", [127]] ], "struct_packed"]'}


def test_stack_trace_map_round_trip():
    """A stack-trace map (record --stacks) is kept like the other maps."""
    e = entry(maps=entry()["maps"] + [STACK_MAP])
    assert progcache.decode(progcache.encode(e), e["key"], "record")["maps"][1] == STACK_MAP


@pytest.mark.parametrize("over", [
    {"key_size": 8},
    {"value_size": 8 * bpfsys.STACK_MAX_DEPTH + 8},  # more than a Leaf: the kernel would write past it
    {"value_size": 1012},
    {"value_size": 0},
    {"max_entries": 0},
    {"flags": bpfsys.BPF_F_NUMA_NODE},  # the node is not kept
    {"flags": 1},  # BPF_F_NO_PREALLOC: not for a stack map
    {"leaf_desc": '["bpf_stacktrace", [["ip","unsigned long long", [64]] ], "struct_packed"]'},
    {"leaf_desc": '["bpf_stacktrace"]'},
    {"key_desc": '"unsigned long long"'},
    {"key_desc": "nonsense"},
])
def test_malformed_stack_maps_are_misses(over):
    e = entry(maps=entry()["maps"] + [dict(STACK_MAP, **over)])
    with pytest.raises(CacheMiss, match="malformed"):
        progcache.decode(progcache.encode(e), e["key"], "record")


def test_stack_entries_are_in_the_key(tracefs):
    """record --stack-entries N compiles -DSTACK_ENTRIES=N (the map's size,
    BPF_STACK_TRACE(stacks, STACK_ENTRIES)): another N, or none, is another key."""
    keys = {progcache.key_of(material(tracefs, cflags=["-DMAX_TASKS=128"] + extra))
            for extra in ([], ["-DSTACK_ENTRIES=16384"], ["-DSTACK_ENTRIES=1"])}
    assert len(keys) == 3


def test_map_refs():
    insns = MOV_R0_0 + ld_map(7) + ld_map(0, src=0) + ld_map(9) + EXIT
    assert progcache.map_refs(insns, {7: "a", 9: "b"}) == [[1, "a"], [5, "b"]]
    with pytest.raises(NotCacheable, match="no map"):
        progcache.map_refs(insns, {7: "a"})
    with pytest.raises(NotCacheable, match="kind 2"):
        progcache.map_refs(MOV_R0_0 + ld_map(7, src=2) + EXIT, {7: "a"})


def test_patched_instructions_carry_the_new_fds():
    insns = MOV_R0_0 + ld_map(7) + EXIT
    out = progcache._patched(insns, [[1, "a"]], {"a": 42})
    assert struct.unpack_from("<BBhi", out, 8) == (bpfsys.LD_IMM64, 0x11, 0, 42)
    assert out[:8] == insns[:8] and out[16:] == insns[16:]


# --- storage and trust -------------------------------------------------------------------

def test_store_then_lookup(cachedir):
    e = entry()
    path = progcache.store(e, cachedir, owner=ME)
    assert path == progcache.entry_path(cachedir, "record", e["key"])
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert cache_entries(cachedir) == [os.path.basename(path)]  # no temporary left behind
    assert progcache.lookup(e["key"], "record", cachedir, owner=ME)["progs"] == e["progs"]


def test_missing_entry_is_a_miss(cachedir):
    with pytest.raises(CacheMiss, match="does not exist"):
        progcache.lookup("a" * 64, "record", cachedir, owner=ME)


def test_corrupt_file_on_disk_is_a_miss_and_is_replaced(cachedir):
    e = entry()
    path = progcache.store(e, cachedir, owner=ME)
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"XXXX")
    with pytest.raises(CacheMiss):
        progcache.lookup(e["key"], "record", cachedir, owner=ME)
    progcache.store(e, cachedir, owner=ME)
    assert progcache.lookup(e["key"], "record", cachedir, owner=ME)


@pytest.mark.parametrize("where", ["dir", "parent", "file"])
def test_writable_by_others_is_refused(cachedir, where):
    e = entry()
    path = progcache.store(e, cachedir, owner=ME)
    target = {"dir": cachedir, "parent": os.path.dirname(cachedir), "file": path}[where]
    os.chmod(target, os.stat(target).st_mode | 0o002)
    with pytest.raises(CacheMiss, match="writable by group or others"):
        progcache.lookup(e["key"], "record", cachedir, owner=ME)
    assert progcache.status(cachedir, owner=ME)[0] is (where == "file")


def test_foreign_owner_is_refused(cachedir):
    e = entry()
    progcache.store(e, cachedir, owner=ME)
    with pytest.raises(CacheMiss, match="owned by uid"):
        progcache.lookup(e["key"], "record", cachedir, owner=ME + 1)
    assert progcache.store(e, cachedir, owner=ME + 1) is None
    usable, detail = progcache.status(cachedir, owner=ME + 1)
    assert not usable and "owned by uid" in detail


def test_symlinked_entry_is_refused(cachedir, tmp_path):
    e = entry()
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(progcache.encode(e))
    os.symlink(elsewhere, progcache.entry_path(cachedir, "record", e["key"]))
    with pytest.raises(CacheMiss, match="not a regular file"):
        progcache.lookup(e["key"], "record", cachedir, owner=ME)


def test_store_creates_the_directory(tmp_path):
    parent = tmp_path / "c"
    parent.mkdir(mode=0o755)
    os.chmod(parent, 0o755)
    d = str(parent / "programs")
    assert progcache.store(entry(), d, owner=ME)
    assert progcache.status(d, owner=ME) == (True, f"{d}: 1 compiled program(s), 0 KiB")


def test_store_creates_directories_0755_under_umask_000(tmp_path):
    base = tmp_path / "c"
    base.mkdir()
    os.chmod(base, 0o755)
    d = base / "var" / "cache" / "programs"
    old = os.umask(0)
    try:
        assert progcache.store(entry(), str(d), owner=ME)
    finally:
        os.umask(old)
    assert [oct(os.stat(p).st_mode & 0o777) for p in (d.parent.parent, d.parent, d)] == [oct(0o755)] * 3
    assert progcache.lookup(entry()["key"], "record", str(d), owner=ME)


def test_entry_is_checked_on_the_open_file(cachedir, monkeypatch):
    """lookup opens an entry once and checks what it opened: a file swapped
    in after any path check is still refused."""
    e = entry()
    path = progcache.store(e, cachedir, owner=ME)
    real_open = os.open

    def swapping_open(p, flags, *a, **kw):
        if p == os.path.basename(path):  # just before the open, someone widens the file's mode
            os.chmod(path, 0o666)
        return real_open(p, flags, *a, **kw)

    monkeypatch.setattr(os, "open", swapping_open)
    with pytest.raises(CacheMiss, match="writable by group or others"):
        progcache.lookup(e["key"], "record", cachedir, owner=ME)


def test_prune_keeps_the_newest(cachedir):
    for i in range(5):
        p = progcache.store(entry(key=str(i) * 64), cachedir, owner=ME)
        os.utime(p, ns=(i * 10**9, i * 10**9))
    progcache.prune(cachedir, owner=ME, keep=2)
    assert cache_entries(cachedir) == sorted(
        os.path.basename(progcache.entry_path(cachedir, "record", str(i) * 64)) for i in (3, 4))


def test_prune_deletes_only_entries_the_cache_wrote(cachedir):
    """Files named like entries but not written by the cache (wrong content,
    a checksum that fails, another key than the name says, a link) survive
    pruning, and do not count against the entries kept."""
    own = [progcache.store(entry(key=f"{i:x}" * 64), cachedir, owner=ME) for i in range(3)]
    for i, p in enumerate(own):
        os.utime(p, ns=((10 + i) * 10**9,) * 2)
    forged = dict(entry(key="f" * 64), sum="0" * 64)
    foreign = {
        "notes.json": b"{}",
        "record-" + "a" * 40 + ".json": b"not json",
        "record-" + "b" * 40 + ".json": json.dumps(forged).encode(),
        "record-" + "c" * 40 + ".json": progcache.encode(entry(key="d" * 64)),  # another key than its name
        "other.txt": b"x",
    }
    for name, data in foreign.items():
        with open(os.path.join(cachedir, name), "wb") as f:
            f.write(data)
        os.utime(os.path.join(cachedir, name), ns=(1, 1))  # oldest of all
    os.symlink(own[0], os.path.join(cachedir, "record-" + "e" * 40 + ".json"))
    before = {n: open(os.path.join(cachedir, n), "rb").read() for n in foreign}
    assert progcache.prune(cachedir, owner=ME, keep=2) == [os.path.basename(own[0])]
    assert {n: open(os.path.join(cachedir, n), "rb").read() for n in foreign} == before
    assert os.path.islink(os.path.join(cachedir, "record-" + "e" * 40 + ".json"))
    assert progcache.status(cachedir, owner=ME)[1].startswith(f"{cachedir}: 2 compiled program(s)")


def test_status_lines(tmp_path, monkeypatch):
    monkeypatch.setenv("PSTATE_NO_CACHE", "1")
    assert progcache.status(str(tmp_path))[1].startswith("disabled")
    monkeypatch.delenv("PSTATE_NO_CACHE")
    assert "empty" in progcache.status(str(tmp_path / "none"))[1]


def test_stale_tracepoint_format_is_a_miss(tracefs):
    e = entry()
    e["attach"][0]["format"] = "0" * 64
    with pytest.raises(CacheMiss, match="format of tracepoint sched:sched_switch changed"):
        progcache.load(e, tracefs)


# --- key and leaf types -------------------------------------------------------------

DESCS = [
    '"unsigned int"',
    '"int"',
    '["task_state", [["since","unsigned long long"], ["tgid","unsigned int"], ["state","unsigned short"],'
    ' ["flags","unsigned short"] ], "struct_packed"]',
    '["snap", [["ns","unsigned long long", [14]], ["comm","char",[16]], ["x","unsigned int", 3],'
    ' ["y","unsigned int", 29]], "struct"]',
    '["u", [["a","int"], ["b","unsigned long long"]], "union"]',
    '["outer", [["", [["p","int"]], "struct"], ["q","short"]], "struct"]',
]


@pytest.mark.parametrize("desc", DESCS)
def test_decoded_types_match_bcc(desc):
    t = bpfmaps.decode_type(json.loads(desc))
    try:
        from pstate.kernel import loader

        bcc = loader.import_bcc()
    except Exception:
        bcc = None
    if bcc is None:
        assert ct.sizeof(t) > 0
        return
    want = bcc.BPF._decode_table_type(json.loads(desc))
    assert ct.sizeof(t) == ct.sizeof(want)
    assert getattr(t, "_fields_", None) is None or \
        [f[0] for f in t._fields_] == [f[0] for f in want._fields_]


def test_percpu_leaf_is_padded_per_cpu():
    t = bpfmaps.make_table(-1, "c", '"int"', '"unsigned int"', bpfsys.MAP_PERCPU_ARRAY, 5)
    assert t.Leaf == ct.c_uint64 * bpfsys.possible_cpus()
    assert len(t) == 5 and [k.value for k in t] == [0, 1, 2, 3, 4]
    with pytest.raises(IndexError):
        t[ct.c_int(5)]


class _Stacks(bpfmaps.StackTraceTable):
    """A stack-trace table whose lookups come from a dict (stack id -> addresses)."""

    slots: dict = {}

    def __getitem__(self, key):
        if key.value not in self.slots:
            raise KeyError(key)
        leaf = self.Leaf()
        for i, ip in enumerate(self.slots[key.value]):
            leaf.ip[i] = ip
        return leaf


def test_stack_trace_table_walks_like_bccs():
    t = bpfmaps.make_table(-1, "stacks", STACK_MAP["key_desc"], STACK_MAP["leaf_desc"], bpfsys.MAP_STACK_TRACE,
                          16384)
    assert type(t) is bpfmaps.StackTraceTable
    assert (t.Key, ct.sizeof(t.Leaf)) == (ct.c_int, STACK_MAP["value_size"])
    t.__class__ = _Stacks
    t.slots = {3: [0x10, 0x20, 0x30], 4: list(range(1, bpfsys.STACK_MAX_DEPTH + 1))}  # 4: a full stack
    assert list(t.walk(3)) == [0x10, 0x20, 0x30]  # leaf first, up to the first zero
    assert list(t.walk(3, resolve=hex)) == ["0x10", "0x20", "0x30"]
    assert len(list(t.walk(4))) == bpfsys.STACK_MAX_DEPTH
    with pytest.raises(KeyError):
        t.walk(5)
    t.clear()  # as BCC's: nothing (ids are freed one by one)


def test_unsupported_map_type():
    with pytest.raises(ValueError):
        bpfmaps.make_table(-1, "p", '"int"', '"int"', 4, 2)


# --- with BPF ------------------------------------------------------------------------------

def _record_defines(stack_entries: int = 0):
    from pstate.kernel import loader
    from pstate.kernel import recordprog

    ks = loader.kernel_states()
    return recordprog.defines_for(ks, max_tasks=4096, rb_pages=64, sample=False, stack_entries=stack_entries)


@pytest.mark.serial  # compares system-wide program ids
@pytest.mark.bpf
def test_warm_program_has_the_same_tables(root_cache):
    from pstate.kernel import loader

    d = _record_defines()
    cold = loader.Program("record", d)
    try:
        assert cold.origin == "compiled" and cold.bpf is not None
        assert len(cache_entries(root_cache)) == 1, cold.cache_note
        shapes = {n: (type(cold.table(n)).__name__, ct.sizeof(cold.table(n).Key), ct.sizeof(cold.table(n).Leaf))
                  for n in ("tasks", "events", "counters")}
    finally:
        cold.close()
    warm = loader.Program("record", d)
    try:
        assert warm.origin == "cache", warm.cache_note
        assert warm.bpf is None
        for n, (_cls, ksz, lsz) in shapes.items():
            t = warm.table(n)
            assert (ct.sizeof(t.Key), ct.sizeof(t.Leaf)) == (ksz, lsz), n
        tasks = warm.table("tasks")
        leaf = tasks.Leaf()
        leaf.tgid = 4242
        tasks[tasks.Key(4243)] = leaf
        assert tasks[tasks.Key(4243)].tgid == 4242
        assert 4243 in [getattr(k, "value", k) for k, _v in tasks.items_lookup_batch()]
        del tasks[tasks.Key(4243)]
        with pytest.raises(KeyError):
            tasks[tasks.Key(4243)]
        import time

        from pstate.kernel import filtermaps
        from pstate.stream.filters import Filter

        filtermaps.start(warm, filtermaps.settings_for(Filter(), loader.kernel_states()))  # report from now on
        time.sleep(0.2)
        assert warm.counters()[loader.STAT_ATTEMPTED] > 0  # the attached programs run
        warm.detach()
        assert warm.cached.attached() == []
    finally:
        warm.close()


@pytest.mark.bpf
def test_refused_cached_program_falls_back_to_compiling(root_cache):
    from pstate.kernel import loader

    d = _record_defines()
    loader.Program("record", d).close()
    (name,) = cache_entries(root_cache)
    path = os.path.join(root_cache, name)
    e = json.loads(open(path, "rb").read())
    # r0 is never set: the verifier refuses this
    e["progs"][0]["insns"] = base64.b64encode(EXIT).decode()
    e["progs"][0]["maps"] = []
    with open(path, "wb") as f:
        f.write(progcache.encode({k: v for k, v in e.items() if k != "sum"}))
    p = loader.Program("record", d)
    try:
        assert p.origin == "compiled"
        assert "refused" in p.cache_note
    finally:
        p.close()
    # and the entry was written again, good this time
    p = loader.Program("record", d)
    try:
        assert p.origin == "cache", p.cache_note
    finally:
        p.close()


@pytest.mark.bpf
def test_bypass_compiles(root_cache, monkeypatch):
    from pstate.kernel import loader

    d = _record_defines()
    loader.Program("record", d).close()
    monkeypatch.setenv("PSTATE_NO_CACHE", "1")
    p = loader.Program("record", d)
    try:
        assert p.origin == "compiled" and "PSTATE_NO_CACHE" in p.cache_note
    finally:
        p.close()


@pytest.mark.serial  # compares system-wide program ids
@pytest.mark.bpf
def test_cold_and_warm_record_the_same_sleeper(root_cache, monkeypatch):
    from conftest import bpf_prog_ids
    from test_reliability_stream import leftover_programs
    from workloads import SLEEPER, record_all, sleeps, start, states

    monkeypatch.setenv("PSTATE_CACHE_DEBUG", "1")
    before = bpf_prog_ids()
    seen = {}
    for run in ("cold", "warm"):
        child = start(SLEEPER.format(n=10, secs=0.03))
        recs, rec = record_all([child])
        assert rec.returncode == 0, rec.stderr
        want = "compiled" if run == "cold" else "loaded from the program cache"
        assert f"pstate: record: {want}" in rec.stderr, rec.stderr
        assert recs[-1]["type"] == "end" and recs[-1]["lost"] == 0
        wakes, _ = sleeps(recs, child.pid, 10, 29e6, 60e6)
        outs = [r for r in states(recs, child.pid) if r["to"] == "sleeping"]
        assert all(r["cause"] == "wakeup" for r in wakes), wakes
        assert all(r["voluntary"] and r["kstate"] == "S" for r in outs)
        seen[run] = (len(outs) >= 10, recs[-1]["events"] == recs[-1]["kernel_events"])
    assert seen["cold"] == seen["warm"] == (True, True), seen
    assert leftover_programs(before) == {}


@pytest.mark.bpf
def test_warm_snap_loads_from_the_cache(root_cache, tmp_path, monkeypatch):
    import subprocess

    from conftest import clean_env, pstate_cmd

    monkeypatch.setenv("PSTATE_CACHE_DEBUG", "1")
    out = tmp_path / "snaps"
    for want in ("compiled", "loaded from the program cache"):
        p = subprocess.run(pstate_cmd("snap", "--dir", str(out), "-i", "0.2", "-n", "1"), capture_output=True,
                           env=clean_env(), timeout=120)
        assert p.returncode == 0, p.stderr
        assert f"pstate: snap: {want}".encode() in p.stderr, p.stderr
    files = sorted(out.glob("pstate-snap-*.jsonl"))
    assert len(files) == 2
    for f in files:
        lines = f.read_text().splitlines()
        assert json.loads(lines[0])["type"] == "meta" and json.loads(lines[-1])["type"] == "end"
        assert len(lines) > 10  # a row per live thread


def test_btf_facts_are_kept_until_the_next_boot(tmp_path, monkeypatch):
    """What tp_btf reads from the kernel's BTF is parsed once per boot: a
    second start-up takes it from the cache; another boot, a damaged entry or
    a disabled cache parse it again, with the same result."""
    from pstate.kernel import btf, loader, probeplan
    if not os.path.exists(btf.VMLINUX):
        if os.environ.get("CI"):
            pytest.fail("no kernel BTF on the CI machine")
        pytest.skip("no kernel BTF")
    monkeypatch.setenv("PSTATE_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PSTATE_NO_CACHE", raising=False)
    parsed = []
    real = btf.read_facts
    monkeypatch.setattr(btf, "read_facts", lambda path: parsed.append(path) or real(path))
    truth = btf.facts(btf.Btf.read())
    assert progcache.btf_facts() == truth and len(parsed) == 1
    kept = progcache.btf_facts()
    assert len(parsed) == 1  # and in the same order: the -D settings, and so the program's key, are the same
    assert [list(kept[p].items()) for p in kept] == [list(truth[p].items()) for p in truth]
    (entry,) = [p for p in (tmp_path / "btf").iterdir() if p.name.startswith(progcache.BTF_FACTS)]
    assert not [p for p in tmp_path.iterdir() if p.is_file()]  # no program entry among the programs
    # a well-formed entry naming a member pstate does not read: read again
    key = json.loads(entry.read_bytes())["key"]
    progcache.store({"format": progcache.FORMAT, "name": progcache.BTF_FACTS, "key": key,
                     **kept, "members": {**kept["members"], "TASK_X": [1, 4]}}, str(tmp_path / "btf"))
    assert progcache.btf_facts() == truth and len(parsed) == 2
    entry.write_bytes(entry.read_bytes().replace(b'"members":{', b'"members":{"TASK_X":[1,4],'))
    assert progcache.btf_facts() == truth and len(parsed) == 3
    monkeypatch.setattr(btf, "boot_identity", lambda path=btf.VMLINUX: "another boot")
    assert progcache.btf_facts() == truth and len(parsed) == 4
    monkeypatch.setenv("PSTATE_NO_CACHE", "1")
    assert progcache.btf_facts() == truth and progcache.btf_facts() == truth and len(parsed) == 6
    plan = loader.probe_plan("record", {"REPORT_MASK": "0x7f"}, "auto")
    assert plan.path == probeplan.TP_BTF
    assert plan.targets == {e: truth["tracepoints"][e]["target"] for e in plan.paths}


# --- record --stacks from the cache ----------------------------------------------------------

@pytest.fixture
def disk_file():
    # O_DIRECT needs a real file system on a block device (tmpfs refuses it): the root's
    path = f"/var/tmp/pstate-progcache-{os.getpid()}.bin"
    yield path
    if os.path.exists(path):
        os.unlink(path)


def _d_bit() -> int:
    from pstate.kernel import loader

    return {letter: bit for bit, letter in loader.kernel_states().letters.items()}["D"]


def _take_write_stacks(prog, path: str, kallsyms) -> dict[int, tuple[str, ...]]:
    """Have the program take the kernel stack of this process's switches
    into D (the settings row of record --stacks D -p <this process>), write
    to path with O_DIRECT until one of those stacks blocked in a direct
    write (how many writes block depends on the disk), stop the program
    reporting, and give every stack id in the map with its functions, leaf
    first (through bpfmaps' table: a compiled program's map read the same)."""
    import dataclasses
    import mmap

    from pstate.kernel import filtermaps, loader
    from pstate.kernel import stacks as kstacks
    from pstate.stream.filters import Filter

    ks = loader.kernel_states()
    settings = dataclasses.replace(filtermaps.settings_for(Filter(pids=(os.getpid(),)), ks), stack_mask=_d_bit())
    m = prog.maps()["stacks"]
    t = bpfmaps.make_table(m["fd"], "stacks", m["key_desc"], m["leaf_desc"], m["type"], m["max_entries"], m["flags"])

    def functions() -> dict[int, tuple[str, ...]]:
        return {k.value: tuple(vocab.frame_name(f)
                               for f in kstacks.task_frames(list(t.walk(k.value, kallsyms.frame))))
                for k in t}

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    buf = mmap.mmap(-1, 65536)
    buf.write(b"x" * 65536)
    filtermaps.start(prog, settings)
    try:
        for i in range(100_000):
            os.pwrite(fd, buf, 0)
            if i % 20 == 19 and any("__iomap_dio_rw" in f for f in functions().values()):
                break
    finally:
        filtermaps.stop(prog, settings)
        os.close(fd)
    got = functions()
    assert any("__iomap_dio_rw" in f for f in got.values()), got
    return got


@pytest.mark.serial  # compares system-wide program ids
@pytest.mark.bpf
def test_cached_stack_map_reads_as_the_compiled_one(root_cache, disk_file):
    """The stack map of record --stacks is cached: the cached program's map
    is the compiled one's (type, sizes, flags, STACK_ENTRIES rounded up to a
    power of two as BCC declares it), its table reads and frees stack ids as
    BCC's StackTrace does, and it takes the same stacks of the same work."""
    from conftest import bpf_prog_ids
    from test_reliability_stream import leftover_programs

    from pstate.kernel import loader
    from pstate.kernel import stacks as kstacks

    before = bpf_prog_ids()
    kallsyms = kstacks.Kallsyms()
    d = _record_defines(stack_entries=1000)
    assert "-DSTACK_ENTRIES=1000" in loader.cflags_of(d)  # in the key (test_stack_entries_are_in_the_key)
    cold = loader.Program("record", d)
    try:
        assert cold.origin == "compiled"
        (name,) = cache_entries(root_cache)  # cached, stack map and all
        e = json.loads(open(os.path.join(root_cache, name), "rb").read())
        assert {m["name"]: m["type"] for m in e["maps"]}["stacks"] == bpfsys.MAP_STACK_TRACE
        # the program that takes stacks loads the map's fd like any other (bpf_get_stackid's argument)
        assert [p["name"] for p in e["progs"] if any(m == "stacks" for _i, m in p["maps"])], e["progs"]
        theirs = cold.table("stacks")
        assert type(theirs).__name__ == "StackTrace"
        info = bpfsys.map_info(theirs.map_fd)
        assert (info["type"], info["max_entries"]) == (bpfsys.MAP_STACK_TRACE, 1024)
        shape = (ct.sizeof(theirs.Key), ct.sizeof(theirs.Leaf))
        cold_stacks = _take_write_stacks(cold, disk_file, kallsyms)
        # bpfmaps' table on the compiled map and BCC's: the same stacks, the same errors
        m = cold.maps()["stacks"]
        ours = bpfmaps.make_table(m["fd"], "stacks", m["key_desc"], m["leaf_desc"], m["type"], m["max_entries"],
                                 m["flags"])
        assert type(ours) is bpfmaps.StackTraceTable and (ct.sizeof(ours.Key), ct.sizeof(ours.Leaf)) == shape
        ids = sorted(k.value for k in ours)
        assert ids == sorted(k.value for k in theirs) and len(ours) == len(theirs) == len(ids)
        for i in ids:
            assert list(ours.walk(i)) == list(theirs.walk(i)) != []
            assert list(ours.walk(i, kallsyms.frame)) == list(theirs.walk(i, kallsyms.frame))
        for table in (ours, theirs):
            with pytest.raises(Exception, match="Could not update table"):
                table[table.Key(ids[0])] = table.Leaf()  # only the kernel writes a stack map
            table.clear()  # nothing, in both
        assert len(ours) == len(ids)
        del ours[ours.Key(ids[0])]  # frees the id, for both
        with pytest.raises(KeyError):
            theirs.walk(ids[0])
        with pytest.raises(KeyError):
            del theirs[theirs.Key(ids[0])]
        if len(ids) > 1:  # and the other way round
            del theirs[theirs.Key(ids[-1])]
            with pytest.raises(KeyError):
                ours.walk(ids[-1])
    finally:
        cold.close()
    os.unlink(disk_file)  # the second run writes a new file too

    warm = loader.Program("record", d)
    try:
        assert warm.origin == "cache", warm.cache_note
        t = warm.table("stacks")
        assert type(t) is bpfmaps.StackTraceTable and (ct.sizeof(t.Key), ct.sizeof(t.Leaf)) == shape
        assert bpfsys.map_info(t.map_fd) == info
        warm_stacks = _take_write_stacks(warm, disk_file, kallsyms)
        # a direct write blocks with the same functions, whichever way the program was loaded
        writes = [{f for f in stacks.values() if "__iomap_dio_rw" in f} for stacks in (cold_stacks, warm_stacks)]
        assert writes[0] & writes[1], writes
        i = next(iter(warm_stacks))
        del t[t.Key(i)]
        with pytest.raises(KeyError):
            t.walk(i)
    finally:
        warm.close()
    assert leftover_programs(before) == {}


@pytest.mark.bpf
def test_cold_and_warm_record_the_same_stacks(root_cache, monkeypatch, disk_file):
    """record --stacks D loads from the cache on its second run, and its
    stacks for a writer's D intervals (O_DIRECT writes, which block in
    __iomap_dio_rw until the disk completes them) are the compiled run's."""
    from test_stacks_bpf import DIRECT_WRITES
    from workloads import record_all, start, states

    monkeypatch.setenv("PSTATE_CACHE_DEBUG", "1")
    top = {}
    for run in ("cold", "warm"):
        if os.path.exists(disk_file):
            os.unlink(disk_file)
        child = start(DIRECT_WRITES.format(path=disk_file, n=20_000, between="pass", blocked=60))
        recs, rec = record_all([child], "--stacks", "D")  # (its meta line: attached and reporting)
        assert rec.returncode == 0, rec.stderr
        want = "compiled" if run == "cold" else "loaded from the program cache"
        assert f"pstate: record: {want}" in rec.stderr, rec.stderr
        end = recs[-1]
        assert end["type"] == "end" and end["stack_lost"] == 0 and end["stack_failed"] == 0, end
        frames = {r["stack_id"]: r["frames"] for r in recs if r["type"] == "stack"}
        ds = [r for r in states(recs, child.pid) if r["from"] == "uninterruptible" and r["to"] == "runnable"
              and r["dur_ns"] is not None]
        assert len(ds) >= 10, (run, len(ds))  # the writer sleeps until it has slept 60 times
        assert all("stack_id" in r and r["stack_id"] in frames for r in ds), (run, ds)
        # the stack that holds most of the D time: its functions, root first
        by = {}
        for r in ds:
            by[r["stack_id"]] = by.get(r["stack_id"], 0) + r["dur_ns"]
        sid = max(by, key=by.get)
        top[run] = tuple(vocab.frame_name(f) for f in frames[sid].split(";"))
        assert {"__x64_sys_pwrite64", "__iomap_dio_rw"} <= set(top[run]), (run, top[run])
    assert top["cold"] == top["warm"], top

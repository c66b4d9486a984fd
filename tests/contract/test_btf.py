"""pstate.kernel.btf: the offsets pstate's tp_btf programs read, checked
against bpftool's own dump of the running kernel's BTF, and the reader's
handling of typedefs, anonymous members and bad data on a small blob."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess

import pytest

from pstate.kernel import btf


def blob(types: list[bytes], strings: bytes) -> bytes:
    tsec = b"".join(types)
    return struct.pack("<HBBIIIII", btf.MAGIC, 1, 0, 24, 0, len(tsec), len(tsec), len(strings)) + tsec + strings


def t(name_off: int, kind: int, vlen: int, size_or_type: int, kind_flag: int = 0) -> bytes:
    return struct.pack("<III", name_off, (kind_flag << 31) | (kind << 24) | vlen, size_or_type)


def m(name_off: int, type_id: int, bits: int) -> bytes:
    return struct.pack("<III", name_off, type_id, bits)


STRINGS = b"\0int\0outer\0pid\0inner\0cpu\0u32_t\0comm\0char\0"
S = {n.decode(): STRINGS.index(b"\0" + n + b"\0") + 1 for n in STRINGS.strip(b"\0").split(b"\0")}


def small() -> btf.Btf:
    types = [
        t(S["int"], btf.INT, 0, 4) + struct.pack("<I", 32),  # 1 int
        t(S["u32_t"], btf.TYPEDEF, 0, 1),  # 2 typedef int u32_t
        t(0, btf.UNION, 2, 8) + m(S["cpu"], 2, 32) + m(0, 1, 0),  # 3 anonymous union {cpu at 4}
        t(S["char"], btf.INT, 0, 1) + struct.pack("<I", 8),  # 4 char
        t(0, btf.ARRAY, 0, 0) + struct.pack("<III", 4, 1, 16),  # 5 char[16]
        t(S["outer"], btf.STRUCT, 3, 40) + m(S["pid"], 2, 64) + m(0, 3, 128) + m(S["comm"], 5, 192),  # 6
    ]
    return btf.Btf(blob(types, STRINGS))


def test_member_through_typedef_and_anonymous_union():
    b = small()
    assert len(b) == 6
    assert b.find("outer", btf.STRUCT) == 6
    assert b.member("outer", "pid") == (8, 4)
    assert b.member("outer", "cpu") == (20, 4)  # 16 (the union) + 4
    assert b.member("outer", "comm") == (24, 16)


def test_what_is_missing_says_so():
    b = small()
    with pytest.raises(btf.BtfError, match="no member 'tgid'"):
        b.member("outer", "tgid")
    with pytest.raises(btf.BtfError, match="no struct 'task_struct'"):
        b.member("task_struct", "pid")


@pytest.mark.parametrize("data", [b"", b"\x9f\xeb\x01\x00" + b"\0" * 20, b"\x00" * 40,
                                  blob([t(0, btf.STRUCT, 2, 8)], b"\0")], ids=["empty", "no-header", "no-magic",
                                                                            "truncated-struct"])
def test_bad_data_is_refused(data):
    with pytest.raises(btf.BtfError):
        btf.Btf(data)


def _bpftool_dump() -> str:
    exe = shutil.which("bpftool") or "/usr/sbin/bpftool"
    if not os.path.exists(btf.VMLINUX) or not os.path.exists(exe):
        pytest.skip("no kernel BTF or no bpftool here")
    return subprocess.run([exe, "btf", "dump", "file", btf.VMLINUX, "format", "raw"], check=True,
                          capture_output=True, text=True).stdout


def _types(dump: str) -> dict[int, tuple[str, str, list[tuple[str, int, int]]]]:
    """id -> (kind, name, [(member name, type id, bit offset)]) from bpftool's raw dump."""
    out: dict[int, tuple[str, str, list]] = {}
    cur = None
    for line in dump.splitlines():
        h = re.match(r"\[(\d+)\] (\w+) '([^']*)'(.*)", line)
        if h:
            cur = []
            out[int(h.group(1))] = (h.group(2), h.group(3), cur, h.group(4))
            continue
        mm = re.match(r"\s+'([^']*)' type_id=(\d+)(?: bits_offset=(\d+))?", line)
        if mm and cur is not None:
            cur.append((mm.group(1), int(mm.group(2)), int(mm.group(3) or 0)))
    return out


def _bpftool_member(types, struct_name: str, path: str) -> int:
    """The bit offset bpftool's dump gives, walking anonymous members and typedefs by hand."""
    tid = next(i for i, (k, n, _m, _r) in types.items() if k == "STRUCT" and n == struct_name)

    def strip(i):
        while types[i][0] in ("TYPEDEF", "CONST", "VOLATILE"):
            i = int(re.search(r"type_id=(\d+)", types[i][3]).group(1))
        return i

    def look(i, name):
        for mname, mtype, bits in types[strip(i)][2]:
            if mname == name:
                return bits, mtype
            if mname == "(anon)" and types[strip(mtype)][0] in ("STRUCT", "UNION"):
                inner = look(mtype, name)
                if inner:
                    return bits + inner[0], inner[1]
        return None

    total = 0
    for part in path.split("."):
        bits, tid = look(tid, part)
        total += bits
    return total


def test_offsets_match_bpftool():
    """Every member the programs may read, and every attach target, as
    bpftool's own dump of this kernel's BTF gives them."""
    dump = _bpftool_dump()
    types = _types(dump)
    b = btf.Btf.read()
    assert len(b) == max(types)
    facts = btf.facts(b)
    assert set(facts["members"]) == set(btf.MEMBERS), "this kernel (6.18) has them all"
    for define, (struct_name, spellings, sizes) in btf.MEMBERS.items():
        off, size = facts["members"][define]
        path = next(p for p in spellings if _has(b, struct_name, p))
        assert off * 8 == _bpftool_member(types, struct_name, path), (struct_name, path)
        assert size in sizes
    for path in ("__state", "cgroups", "thread_info"):  # more members, resolved the same way
        assert b.member("task_struct", path)[0] * 8 == _bpftool_member(types, "task_struct", path), path
    assert set(facts["tracepoints"]) == set(btf.EVENTS)
    for event, tp in facts["tracepoints"].items():
        kind, name, _m, _rest = types[tp["target"]]
        assert (kind, name) == ("TYPEDEF", f"btf_trace_{event}")
    for define, name in btf.ENUMS.items():
        assert facts["enums"][define] == _bpftool_enum(dump, name)


def _has(b, struct_name, path) -> bool:
    try:
        b.member(struct_name, path)
        return True
    except btf.BtfError:
        return False


def test_classic_records_as_the_tracefs_formats_give_them():
    """The fields of each classic trace record from the BTF
    (trace_event_raw_*) are those of the running kernel's format files."""
    from pstate.kernel import kstates, probeplan

    tracefs = kstates.tracefs_dir()
    if tracefs is None or not os.path.exists(btf.VMLINUX):
        pytest.skip("no tracefs or no kernel BTF")
    records = btf.facts(btf.Btf.read())["records"]
    assert set(records) == set(btf.RAW_CLASSES)
    formats = probeplan.tracefs_records(tracefs)
    for event, fields in records.items():
        assert set(fields) == set(formats(event)), event
        for name, typ in fields.items():  # char[16], __data_loc char[] alike; ints by their typedefs
            assert typ.startswith("__data_loc") == formats(event)[name].startswith("__data_loc"), (event, name)
            assert typ.endswith("[16]") == formats(event)[name].endswith("[16]"), (event, name)


def test_known_offsets_of_this_kernel_family():
    """The research numbers (6.18): fields moved from where Debian 6.1's headers put them."""
    if not os.path.exists(btf.VMLINUX):
        pytest.skip("no kernel BTF")
    b = btf.Btf.read()
    off, size = b.member("task_struct", "comm")
    assert size == 16
    assert b.tracepoint("sched_switch")[1] == ["_Bool", "struct task_struct *", "struct task_struct *",
                                               "unsigned int"]


def _bpftool_enum(dump: str, name: str) -> int:
    m = re.search(rf"^\s+'{name}' val=(-?\d+)", dump, re.M)
    assert m, name
    return int(m.group(1))


def test_enum_values_and_their_absence():
    if not os.path.exists(btf.VMLINUX):
        pytest.skip("no kernel BTF")
    b = btf.Btf.read()
    assert b.enum_value("CSD_TYPE_TTWU") == btf.facts(b)["enums"]["CSD_TYPE_TTWU"]
    with pytest.raises(btf.BtfError):
        b.enum_value("NO_SUCH_ENUMERATOR_HERE")

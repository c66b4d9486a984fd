"""Names from the system (pstate.stream.names): the one decoding rule
(lossless for cgroup paths, which --cgroup matches and pstate opens again;
U+FFFD for names only shown) and the one cell function (control characters
escaped, then cut to a width); and a cgroup whose name is not UTF-8, which
`record` crashed on (#35), recorded, filtered by and summarised.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import orjson
import pytest
from click.testing import CliRunner

from conftest import clean_env, pstate_cmd
from pstate.stream import names
from pstate.stream.names import cell, columns, decode, encode

# --- the decoding rule -----------------------------------------------------------------


def test_shown_names_have_u_fffd_for_what_is_not_utf8():
    assert decode(b"bad\xffcg") == "bad\ufffdcg"
    assert decode(os.fsdecode(b"bad\xffcg")) == "bad\ufffdcg"  # an os function's str
    assert decode("caf\u00e9 \x1b[2J") == "caf\u00e9 \x1b[2J"  # UTF-8 and controls kept (JSON escapes them)
    assert decode(b"\xed\xa0\x80") == "\ufffd" * 3  # an encoded surrogate is no UTF-8


@pytest.mark.parametrize("raw, text", [
    (b"/bad\xffcg", "/bad\\xffcg"),
    (b"/a\xc3(b", "/a\\xc3(b"),  # a lead byte without its continuation
    (b"/\xed\xa0\x80", "/\\xed\\xa0\\x80"),
    (b"/system.slice/system-systemd\\x2dfsck.slice", "/system.slice/system-systemd\\x2dfsck.slice"),  # systemd's
    (b"/lit\\xffcg", "/lit\\x5cxffcg"),  # a literal backslash that would read as an escape
    (b"/lit\\x5c", "/lit\\x5cx5c"),
    (b"/lit\\xFF\\x41\\", "/lit\\xFF\\x41\\"),  # (upper case, ASCII and a last backslash are no escapes)
    (b"/caf\xc3\xa9", "/caf\u00e9"),
])
def test_lossless_names_escape_what_is_not_utf8(raw, text):
    assert decode(raw, lossless=True) == text
    assert encode(text) == raw
    assert decode(os.fsdecode(raw), lossless=True) == text
    orjson.dumps(text)  # a writer takes it


def test_lossless_is_exact_for_any_bytes():
    rng = random.Random(35)
    alphabet = b"\\x5cfF89ab0/\x80\x9b\xc3\xa9\xe4\xb8\xad\xff\xed"
    seen = {}
    for _ in range(20000):
        raw = bytes(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        text = decode(raw, lossless=True)
        assert encode(text) == raw, (raw, text)
        assert decode(encode(text), lossless=True) == text  # a value typed in its written form
        assert seen.setdefault(text, raw) == raw, "two names, one text"
        orjson.dumps(text)


def test_a_cgroup_filter_takes_the_path_in_either_form():
    from pstate.stream.filters import Filter, cgroup_path

    written = "/user.slice/bad\\xffcg"
    assert cgroup_path(written) == cgroup_path(os.fsdecode(b"/user.slice/bad\xffcg/")) == written
    assert cgroup_path("/system.slice/system-systemd\\x2dfsck.slice") == "/system.slice/system-systemd\\x2dfsck.slice"
    for given in (written, os.fsdecode(b"user.slice/bad\xffcg")):
        f = Filter(cgroups=(given,))
        assert f.cgroups == (written,)
        orjson.dumps(f.meta_fields())  # the meta record of record --cgroup
        assert f._who_ok(written + "/child", None) and f._who_ok(written, None)
        assert not f._who_ok("/user.slice/bad\\x5cxffcg", None)  # the literal name is another cgroup


def test_cgroup_paths_of_a_mount_with_a_name_that_is_not_utf8(tmp_path):
    """CgroupPaths over a directory tree as the v2 mount: ids, paths and the
    walk below a cgroup, with the lossless text."""
    from pstate.kernel.identity import CgroupPaths

    mount = tmp_path / "mnt"
    bad = os.path.join(os.fsencode(mount), b"a.slice", b"bad\xffcg")
    os.makedirs(os.path.join(bad, b"sub"))
    with open(os.path.join(bad, b"cgroup.procs"), "w") as f:
        f.write("123\n456\n")
    cg = CgroupPaths(str(mount))
    ino = os.stat(bad).st_ino
    assert cg.id_of("/a.slice/bad\\xffcg") == ino
    assert cg.id_of(os.fsdecode(b"/a.slice/bad\xffcg")) == ino
    assert cg.id_of("/a.slice/bad\ufffdcg") is None  # a shown name finds nothing
    fresh = CgroupPaths(str(mount))
    assert fresh.path_of(ino) == "/a.slice/bad\\xffcg"  # by walking the mount
    assert sorted(fresh.below("/a.slice/bad\\xffcg")) == sorted([ino, os.stat(os.path.join(bad, b"sub")).st_ino])
    assert fresh.procs(ino) == [123, 456]
    orjson.dumps([fresh.path_of(i) for i in fresh.below("/")])


def test_a_process_title_and_exe_that_are_not_utf8_can_be_written(tmp_path):
    """read_process of a program whose file name and argv are not UTF-8:
    U+FFFD in title and exe, and a writer takes the record."""
    from pstate.kernel.identity import read_process

    exe = os.path.join(os.fsencode(tmp_path), b"sl\xffeep")
    os.symlink(b"/bin/sleep", exe)  # (the kernel names the link's target; a copy it names by itself)
    copy = os.path.join(os.fsencode(tmp_path), b"co\xffpy")
    with open("/bin/sleep", "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    os.chmod(copy, 0o755)
    p = subprocess.Popen([copy, b"5"])
    try:
        deadline = time.monotonic() + 10
        info = None
        while time.monotonic() < deadline:
            info = read_process(p.pid)
            if info and info["exe"] and "co" in info["exe"]:
                break
            time.sleep(0.02)
        assert info is not None
        assert info["exe"].endswith("co\ufffdpy") and info["title"].startswith(os.fsdecode(tmp_path))
        assert "co\ufffdpy 5" in info["title"]
        orjson.dumps(info)
    finally:
        p.kill()
        p.wait()


def test_kernel_symbols_that_are_not_utf8(tmp_path):
    from pstate.kernel.stacks import Kallsyms

    path = tmp_path / "kallsyms"
    path.write_bytes(b"ffffffff81000000 T good_fn\nffffffff81000100 T bad\xfffn [mo\xffd]\n")
    ks = Kallsyms(str(path))
    assert ks.frame(0xffffffff81000104) == "bad\ufffdfn+0x4 [mo\ufffdd]"


# --- the cell function ---------------------------------------------------------------


@pytest.mark.parametrize("text, shown", [
    ("\x1b]0;pwned\x07\x1b[2J", "\\x1b]0;pwned\\x07\\x1b[2J"),
    ("a\nb\tc\rd\x00e", "a\\x0ab\\x09c\\x0dd\\x00e"),
    ("del\x7f c1\u0085\u009b", "del\\x7f c1\\x85\\x9b"),
    ("\u202eevil\u2066x\u2069\u200f", "\\u202eevil\\u2066x\\u2069\\u200f"),
    ("line\u2028para\u2029", "line\\u2028para\\u2029"),
    (os.fsdecode(b"raw\xff"), "raw\\xff"),  # an os function's undecodable byte
    (b"raw\xff\x1b", "raw\\xff\\x1b"),
    ("caf\u00e9 \u4e2d\u6587 \U0001f600 e\u0301", "caf\u00e9 \u4e2d\u6587 \U0001f600 e\u0301"),  # ordinary Unicode
    ("system-systemd\\x2dfsck.slice", "system-systemd\\x2dfsck.slice"),
    (None, ""),
    (1234, "1234"),
])
def test_cell_escapes_control_characters(text, shown):
    assert cell(text) == shown
    assert cell(cell(text)) == cell(text)


def test_cell_cuts_after_escaping_and_never_inside_an_escape():
    assert cell("abcdefghij", 6) == "abcde~"
    assert cell("abcdefghij", 6, keep="end") == "~fghij"
    assert cell("abcdefghij", 6, keep="middle") == "abc~ij"
    assert cell("abcdefghij", 6, mark="") == "abcdef"
    assert cell("abcdef", 6) == "abcdef"
    assert cell("ab\x1bcdef", 6) == "ab~"  # \x1b is 4 columns, kept whole or not at all
    assert cell("ab\x1bcdef", 8) == "ab\\x1bc~"
    assert cell("\x1b[2J" * 10, 9, keep="end") == "~J\\x1b[2J"
    assert cell("\u4e2d\u6587\u4e2d\u6587", 5) == "\u4e2d\u6587~"  # wide characters: 2 columns each
    assert columns(cell("\u4e2d\u6587\u4e2d\u6587", 5)) <= 5
    for w in range(0, 12):
        for keep in names.KEEP:
            out = cell("a\x1bb\u4e2dc\u202ed", w, keep=keep)
            assert columns(out) <= w and not names._CONTROL.search(out)
    with pytest.raises(ValueError):
        cell("x", 3, keep="left")


# --- a cgroup whose name is not UTF-8, recorded (#35) ----------------------------------

LOOP = """
import sys, time
print("ready", flush=True)
while True:
    time.sleep(0.02)
"""
BAD = b"bad\xffcg"


def _read(path) -> list[dict]:
    with open(path, "rb") as f:
        return [orjson.loads(x) for x in f.read().splitlines()]


def _record(tmp_path, name, *args):
    out = tmp_path / name
    p = subprocess.run(pstate_cmd("record", "-q", "-d", "1.5", "-o", str(out)) + list(args), capture_output=True,
                       timeout=120, env=clean_env())
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    return _read(out)


@pytest.fixture
def bad_cgroup():
    """A cgroup named bad\\xffcg (not UTF-8) below the test's own v2
    directory, with a process in it (moved, and seen there): (its path as
    the records write it, its id, the pid); removed afterwards."""
    from workloads import V2Cgroups

    bad = os.fsdecode(BAD)
    with V2Cgroups(bad) as cg:
        child = subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE)
        try:
            assert child.stdout.readline() == b"ready\n"
            cg.move(child.pid, cg.paths[0])
            deadline = time.monotonic() + 10
            while True:  # the move is done when /proc says so
                with open(f"/proc/{child.pid}/cgroup", "rb") as f:
                    if f.read().endswith(b"/" + BAD + b"\n"):
                        break
                assert time.monotonic() < deadline, "the process did not move"
                time.sleep(0.01)
            yield f"{cg.top}/bad\\xffcg", cg.id_of(cg.paths[0]), child.pid, cg.top
        finally:
            child.kill()
            child.wait()
    assert not os.path.exists(os.path.join(os.fsencode(cg.mount), os.fsencode(cg.top.lstrip("/"))))


@pytest.mark.bpf
def test_record_names_a_cgroup_that_is_not_utf8(bad_cgroup, tmp_path):
    path, cgid, pid, _top = bad_cgroup
    recs = _record(tmp_path, "all.jsonl")
    assert recs[-1]["type"] == "end"
    named = [r for r in recs if r["type"] == "cgroup" and r["cgroup"] == cgid]
    assert [(r["path"], r["gone"]) for r in named] == [(path, False)]
    procs = [r for r in recs if r["type"] == "process" and r["pid"] == pid]
    assert procs and procs[0]["cgroup"] == cgid and not procs[0]["gone"]
    states = [r for r in recs if r["type"] == "state" and r["pid"] == pid]
    assert states and {r["cgroup"] for r in states if r.get("cgroup") is not None} == {cgid}
    assert recs.index(named[0]) < recs.index(states[0])

    # stats by cgroup: the path as written, exactly in JSON, safely in the table
    f = tmp_path / "all.jsonl"
    r = CliRunner().invoke(_cli(), ["stats", "-f", "json", "--by", "cgroup", str(f)], catch_exceptions=False)
    assert r.exit_code == 0
    groups = {g["key"]: g for g in orjson.loads(r.stdout)["groups"]}
    assert groups[path]["processes"] == 1
    r = CliRunner().invoke(_cli(), ["stats", "--by", "cgroup", "--cgroup", path, str(f)], catch_exceptions=False)
    assert r.exit_code == 0
    table = r.stdout_bytes.decode("utf-8")
    assert "bad\\xffcg" in table and "1 groups by cgroup" in table
    assert not any(c < 0x20 and c != 0x0a for c in r.stdout_bytes)


@pytest.mark.bpf
@pytest.mark.parametrize("form", ["written", "bytes", "root"])
def test_record_follows_a_cgroup_that_is_not_utf8(bad_cgroup, tmp_path, form):
    """record --cgroup with the path as the records write it (\\xff), with
    its bytes as they are, and --cgroup / (every cgroup, this one too)."""
    path, cgid, pid, top = bad_cgroup
    arg = {"written": path, "bytes": os.fsencode(top) + b"/" + BAD, "root": "/"}[form]
    recs = _record(tmp_path, f"{form}.jsonl", "--cgroup", arg)
    meta = recs[0]
    assert meta["filter_cgroup"] == [path if form != "root" else "/"]
    assert any(r["type"] == "state" and r["pid"] == pid for r in recs)
    assert [r["path"] for r in recs if r["type"] == "cgroup" and r["cgroup"] == cgid] == [path]
    if form != "root":
        assert {r["pid"] for r in recs if r["type"] == "state"} <= {pid}


def _cli():
    from pstate.main import cli

    return cli

"""What another user plants is never compiled, loaded, written through or
deleted by root's pstate: each test plays an attack or fault as the
unprivileged user nobody (header trees, the program cache, -o links in a
sticky directory, foreign files, umask 000, a FIFO without a reader,
/dev/null, log rotation) and checks that nothing untrusted reached the
kernel (bpftool: pstate's programs with their expected map sizes), that no
foreign file changed (hashes before and after), and the exit code and
message.

Needs root (setpriv to become nobody); in CI a missing root fails them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest

from conftest import IN_CI, bpf_prog_ids, cache_entries, clean_env, pstate_cmd
from pstate.kernel import progcache
from pstate.stream import schema
from test_reliability_stream import leftover_programs, prog_ids_held
from workloads import SCHED_LATE_S, SIGNAL_EXIT_S

NOBODY_UID = 65534
NOBODY = ["setpriv", f"--reuid={NOBODY_UID}", f"--regid={NOBODY_UID}", "--clear-groups"]
EVIL_TASKS = 4242  # what the attacks try to get compiled or loaded as the task map's size
TASKS = 65536  # record's default --max-tasks


@pytest.fixture(autouse=True)
def need_root():
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("bpftool"):
        why = "needs root, setpriv and bpftool"
        if IN_CI:
            pytest.fail(why, pytrace=False)
        pytest.skip(why)


@pytest.fixture
def sticky():
    """A world-writable sticky directory like /tmp, of this test's own."""
    d = Path(tempfile.mkdtemp(prefix="pstate-sticky-"))
    d.chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def cache(tmp_path):
    """A private, trusted program cache directory."""
    d = tmp_path / "cache"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    return d / "programs"


def as_nobody(script: str, cwd: Path) -> None:
    subprocess.run(NOBODY + ["sh", "-c", script], cwd=cwd, check=True, env={"PATH": "/usr/bin:/bin"})


def digests(paths) -> dict:
    out = {}
    for p in paths:
        p = Path(p)
        out[str(p)] = ("link", os.readlink(p)) if p.is_symlink() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def tree_digests(root: Path) -> dict:
    return digests(sorted(p for p in root.rglob("*") if p.is_symlink() or p.is_file()))


def env(**extra) -> dict:
    e = clean_env()
    for k in ("PSTATE_KERNEL_HEADERS", "BCC_KERNEL_SOURCE", "PSTATE_NO_CACHE", "SUDO_UID", "SUDO_GID"):
        e.pop(k, None)
    e.update({k: str(v) for k, v in extra.items()})
    return e


def record(*args, timeout=120, cwd=None, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(pstate_cmd("record", "-q", *map(str, args)), capture_output=True, timeout=timeout,
                          env=env(**extra), cwd=cwd)


def map_sizes(pid: int) -> dict[str, int]:
    """name -> max_entries of the BPF maps a process holds."""
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("map_id:"):
                ids.add(int(line.split()[1]))
    out = {}
    for i in ids:
        p = subprocess.run(["bpftool", "-j", "map", "show", "id", str(i)], capture_output=True, text=True)
        if p.returncode == 0 and p.stdout.strip():
            info = json.loads(p.stdout)
            out[info.get("name", "")] = info["max_entries"]
    return out


def running_record_maps(path: Path, **extra) -> tuple[dict, subprocess.CompletedProcess]:
    """Start record -o path, wait for its meta line, read its map sizes,
    stop it; (sizes, finished process)."""
    proc = subprocess.Popen(pstate_cmd("record", "-q", "-o", str(path)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env(**extra))
    deadline = time.monotonic() + 60
    while not (path.exists() and b"\n" in path.read_bytes()):
        assert proc.poll() is None, proc.stderr.read().decode(errors="replace")
        assert time.monotonic() < deadline, "record wrote no meta line"
        time.sleep(0.05)
    sizes = map_sizes(proc.pid)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    return sizes, subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_refused(p: subprocess.CompletedProcess, code: int, *phrases: str) -> str:
    err = p.stderr.decode(errors="replace")
    assert p.returncode == code, (p.returncode, err)
    assert "Traceback" not in err and "fix: " in err, err
    for phrase in phrases:
        assert phrase in err, err
    return err


def planted_tree(sticky: Path) -> Path:
    """nobody's header tree: kconfig.h, which BCC includes first, redefines the map size."""
    as_nobody(f"mkdir -p evil/include/linux evil/include/generated evil/arch/x86/include && "
              f"echo '#define MAX_TASKS {EVIL_TASKS}' > evil/include/linux/kconfig.h && "
              f"echo 'VERSION = 6' > evil/Makefile", sticky)
    return sticky / "evil"


# --- 1: header trees ---------------------------------------------------------------------------


@pytest.mark.bpf
def test_headers_another_user_planted_are_never_compiled(sticky, cache, tmp_path):
    evil = planted_tree(sticky)
    # a root-owned arch tree whose Makefile includes nobody's "common" tree
    arch = tmp_path / "src" / "linux-headers-9.9.9-amd64"
    (arch / "include" / "generated").mkdir(parents=True)
    (arch / "arch").mkdir()
    (arch / "Makefile").write_text(f"include {evil}/Makefile\n")
    for p in (tmp_path / "src", arch, arch / "include", arch / "include" / "generated", arch / "arch"):
        p.chmod(0o755)
    before = tree_digests(evil)
    out = tmp_path / "out.jsonl"
    attempts = [
        ({"PSTATE_KERNEL_HEADERS": evil}, f"kernel header tree {evil} is not safe to compile as root: "
                                          f"{evil} is owned by uid {NOBODY_UID}, not root"),
        ({"BCC_KERNEL_SOURCE": evil}, f"{evil} is owned by uid {NOBODY_UID}"),
        ({"PSTATE_KERNEL_HEADERS": arch}, f"{evil} is owned by uid {NOBODY_UID}"),
    ]
    for extra, phrase in attempts:
        p = record("-d", "0.5", "-o", out, PSTATE_CACHE_DIR=cache, **extra)
        assert_refused(p, 77, phrase, "fix: use a tree only root can write")
        assert not out.exists(), "a refused run left its output file"
    p = record("--kernel-headers", evil, "-d", "0.5", PSTATE_CACHE_DIR=cache)
    assert_refused(p, 77, "not safe to compile as root")
    assert not cache.exists() or cache_entries(cache) == [], "something was compiled and cached"
    assert tree_digests(evil) == before
    # a clean run afterwards compiles the real headers: the map has its real size
    sizes, done = running_record_maps(tmp_path / "clean.jsonl", PSTATE_CACHE_DIR=cache)
    assert done.returncode == 0, done.stderr
    assert sizes["tasks"] == TASKS, sizes
    assert len(cache_entries(cache)) == 1


@pytest.mark.bpf
def test_a_header_reached_through_nobodys_link_is_never_compiled(sticky, cache, tmp_path):
    """A root-owned tree whose kconfig.h is a root-owned link to a link
    nobody made in a sticky directory, which points at the real kconfig.h:
    the chain ends at a trusted file today, but nobody can repoint the
    middle link at any time, so the tree is refused; linked straight to the
    real file it compiles."""
    from pstate.kernel import headers

    real = Path(headers.find().path)
    tree = tmp_path / "tree"
    (tree / "include" / "linux").mkdir(parents=True)
    for name in os.listdir(real / "include"):
        if name != "linux":
            (tree / "include" / name).symlink_to(os.path.realpath(real / "include" / name))
    for name in os.listdir(real / "include" / "linux"):
        if name != "kconfig.h":
            (tree / "include" / "linux" / name).symlink_to(os.path.realpath(real / "include" / "linux" / name))
    (tree / "arch").symlink_to(os.path.realpath(real / "arch"))
    kconfig = os.path.realpath(real / "include" / "linux" / "kconfig.h")
    as_nobody(f"mkdir theirs && ln -s {kconfig} theirs/kconfig.h", sticky)
    planted = tree / "include" / "linux" / "kconfig.h"
    planted.symlink_to(sticky / "theirs" / "kconfig.h")
    out = tmp_path / "out.jsonl"
    p = record("-d", "0.3", "-o", out, PSTATE_CACHE_DIR=cache, PSTATE_KERNEL_HEADERS=tree)
    assert_refused(p, 77, f"kernel header tree {tree} is not safe to compile as root: {planted} points to "
                          f"{kconfig}: {sticky}/theirs is owned by uid {NOBODY_UID}, not root")
    assert not out.exists() and (not cache.exists() or cache_entries(cache) == [])
    planted.unlink()
    planted.symlink_to(kconfig)
    p = record("-d", "0.3", "-o", out, PSTATE_CACHE_DIR=cache, PSTATE_KERNEL_HEADERS=tree)
    assert p.returncode == 0, p.stderr.decode(errors="replace")


# --- 2 and 5: the program cache ------------------------------------------------------------------


def _poisoned_copy(entry_path: Path, dst_dir: Path) -> Path:
    """The entry as an attacker would rewrite it: a valid checksum, and a
    task map of EVIL_TASKS rows."""
    entry = json.loads(entry_path.read_bytes())
    entry.pop("sum")
    for m in entry["maps"]:
        if m["name"] == "tasks":
            m["max_entries"] = EVIL_TASKS
    dst = dst_dir / entry_path.name
    dst.write_bytes(progcache.encode(entry))
    return dst


@pytest.mark.bpf
def test_cache_entries_another_user_could_write_are_never_loaded(cache, sticky, tmp_path):
    # a genuine entry, from a trusted cache
    done = record("-d", "0.3", "-o", tmp_path / "warm.jsonl", PSTATE_CACHE_DIR=cache)
    assert done.returncode == 0, done.stderr
    (genuine,) = [cache / n for n in cache_entries(cache)]
    # nobody's own cache directory, holding the rewritten entry
    as_nobody("mkdir -p theirs/programs", sticky)
    theirs = sticky / "theirs" / "programs"
    planted = _poisoned_copy(genuine, tmp_path)
    shutil.copy(planted, theirs / planted.name)
    os.chown(theirs / planted.name, NOBODY_UID, NOBODY_UID)
    # ... and in root's own directory, a file nobody owns (as a swap would leave it)
    trusted = tmp_path / "trusted" / "programs"
    trusted.mkdir(parents=True)
    shutil.copy(planted, trusted / planted.name)
    os.chown(trusted / planted.name, NOBODY_UID, NOBODY_UID)
    before = digests([theirs / planted.name, trusted / planted.name])
    for d, why in ((theirs, f"owned by uid {NOBODY_UID}"), (trusted, f"owned by uid {NOBODY_UID}")):
        sizes, p = running_record_maps(tmp_path / f"{d.parent.name}.jsonl", PSTATE_CACHE_DIR=d,
                                       PSTATE_CACHE_DEBUG=1)
        err = p.stderr.decode(errors="replace")
        assert p.returncode == 0, err
        assert "pstate: record: compiled (" in err and why in err, err
        assert sizes["tasks"] == TASKS, sizes
    assert digests([theirs / planted.name, trusted / planted.name]) == before
    assert os.listdir(theirs) == [planted.name], "root stored an entry in nobody's directory"
    # the genuine entry still loads from the trusted cache
    sizes, p = running_record_maps(tmp_path / "again.jsonl", PSTATE_CACHE_DIR=cache, PSTATE_CACHE_DEBUG=1)
    assert "loaded from the program cache" in p.stderr.decode(), p.stderr
    assert sizes["tasks"] == TASKS


@pytest.mark.bpf
def test_umask_000_first_run_creates_0755_directories_and_0600_output(tmp_path):
    base = tmp_path / "fresh"
    base.mkdir(mode=0o755)
    base.chmod(0o755)
    cache = base / "var" / "cache" / "pstate" / "programs"
    out = tmp_path / "out.jsonl"
    p = subprocess.run(["sh", "-c", 'umask 000 && exec "$@"', "sh", *pstate_cmd("record", "-q", "-d", "0.3",
                                                                                 "-o", str(out))],
                       capture_output=True, timeout=120, env=env(PSTATE_CACHE_DIR=cache))
    assert p.returncode == 0, p.stderr
    for d in (base / "var", base / "var" / "cache", base / "var" / "cache" / "pstate", cache):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755, d
    (entry,) = [cache / n for n in cache_entries(cache)]
    assert stat.S_IMODE(entry.stat().st_mode) == 0o644
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    snaps = tmp_path / "snaps"
    p = subprocess.run(["sh", "-c", 'umask 000 && exec "$@"', "sh",
                        *pstate_cmd("snap", "--dir", str(snaps), "-i", "0.2")],
                       capture_output=True, timeout=120, env=env(PSTATE_CACHE_DIR=cache))
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(snaps.stat().st_mode) == 0o700
    assert {stat.S_IMODE(f.stat().st_mode) for f in snaps.iterdir()} == {0o600}


# --- 3: -o FILE ----------------------------------------------------------------------------------


@pytest.mark.serial  # compares system-wide program ids
@pytest.mark.bpf
def test_output_link_planted_in_a_sticky_directory_is_never_followed(sticky, tmp_path):
    victim = tmp_path / "root-only"
    victim.write_bytes(b"root's secret\n")
    victim.chmod(0o600)
    as_nobody(f"ln -s {victim} out.jsonl && echo theirs > theirs.jsonl && ln -s /dev/null null-link", sticky)
    before = digests([victim, sticky / "out.jsonl", sticky / "theirs.jsonl"])
    progs_before = bpf_prog_ids()
    p = record("-d", "0.5", "-o", sticky / "out.jsonl")
    assert_refused(p, 77, f"refusing to write {sticky / 'out.jsonl'}: it is a symbolic link owned by uid "
                          f"{NOBODY_UID}", "fix: remove the link")
    p = record("-d", "0.5", "-o", sticky / "theirs.jsonl")
    assert_refused(p, 77, f"it is owned by uid {NOBODY_UID}, neither root nor you")
    p = record("-d", "0.5", "-o", sticky / "null-link")  # nobody's link, even to /dev/null
    assert_refused(p, 77, f"it is a symbolic link owned by uid {NOBODY_UID}")
    assert digests([victim, sticky / "out.jsonl", sticky / "theirs.jsonl"]) == before
    assert leftover_programs(progs_before) == {}


@pytest.mark.bpf
def test_under_sudo_the_output_belongs_to_the_invoking_user(sticky):
    p = record("-d", "0.5", "-o", sticky / "rec.jsonl", SUDO_UID=NOBODY_UID, SUDO_GID=NOBODY_UID)
    assert p.returncode == 0, p.stderr
    st = (sticky / "rec.jsonl").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY_UID, NOBODY_UID, 0o600)
    s = subprocess.run(NOBODY + pstate_cmd("stats", "rec.jsonl"), cwd=sticky, capture_output=True, timeout=60,
                       env=env(HOME=str(sticky)))
    assert s.returncode == 0, s.stderr
    assert s.stdout.startswith(b"window "), s.stdout


# --- 4: foreign files in the snapshot and cache directories ----------------------------------------


@pytest.mark.bpf
def test_foreign_files_survive_retention_and_cache_pruning(tmp_path, cache):
    from pstate.snapshots import snapdir

    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    now = time.time_ns()
    foreign = [snaps / snapdir.snapshot_name(now - 3600 * 10**9, 999999, "jsonl"),
               snaps / snapdir.snapshot_name(now - 48 * 3600 * 10**9, 1, "jsonl"),
               snaps / "notes.txt"]
    for f in foreign:
        f.write_bytes(b"not pstate's\n")
    cache.mkdir()
    cache.chmod(0o755)
    junk = [cache / f"unrelated-{i}.json" for i in range(70)] + [cache / ("record-" + "a" * 40 + ".json")]
    for f in junk:
        f.write_bytes(b'{"mine": true}\n')
        os.utime(f, ns=(1, 1))  # older than anything pstate writes
    before = digests(foreign + junk)
    p = subprocess.run(pstate_cmd("snap", "--dir", str(snaps), "--every", "0.3", "--count", "4", "--keep", "2",
                                  "--max-age", "1h"),
                       capture_output=True, timeout=120, env=env(PSTATE_CACHE_DIR=cache))
    assert p.returncode == 0, p.stderr
    mine = sorted(f.name for f in snaps.glob("pstate-snap-*") if f not in foreign)
    assert [snapdir.parse_name(n)[1] for n in mine] == [3, 4], mine
    assert digests(foreign + junk) == before
    assert len([n for n in cache_entries(cache) if n.startswith("snap-")]) == 1


# --- 6: outputs that are not files ------------------------------------------------------------------


@pytest.mark.bpf
def test_dev_null_dev_stdout_and_a_fifo_exit_0(tmp_path):
    p = record("-d", "0.5", "-o", "/dev/null")
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    p = record("-d", "0.5", "-o", "/dev/stdout")  # a pipe to this test
    assert p.returncode == 0 and p.stderr == b"", p.stderr
    lines = p.stdout.splitlines()
    assert orjson.loads(lines[0])["type"] == "meta" and orjson.loads(lines[-1])["type"] == "end"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    copy = tmp_path / "copy.jsonl"
    with open(copy, "wb") as f:
        reader = subprocess.Popen(["cat", str(fifo)], stdout=f)
        p = record("-d", "0.5", "-o", fifo)
        reader.wait(timeout=30)
    got = copy.read_bytes().splitlines()
    assert p.returncode == 0, p.stderr
    assert orjson.loads(got[0])["type"] == "meta" and orjson.loads(got[-1])["type"] == "end"


@pytest.mark.bpf
def test_fifo_without_a_reader_attaches_nothing_and_times_out(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    proc = subprocess.Popen(pstate_cmd("record", "-q", "-o", str(fifo)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env())
    said = proc.stderr.readline()  # written when its wait of 10 s has begun
    t0 = time.monotonic()
    assert said.decode() == f"pstate: waiting for a reader of the FIFO {fifo}\n", said
    while time.monotonic() - t0 < 3:
        assert proc.poll() is None
        assert prog_ids_held(proc.pid) == set(), "BPF programs attached while waiting for a reader"
        time.sleep(0.2)
    _out, err = proc.communicate(timeout=30)
    took = time.monotonic() - t0
    err = err.decode(errors="replace")
    assert proc.returncode == 73, err
    assert f"nobody reads the FIFO {fifo} (waited 10 s)" in err and "fix: start its reader first" in err, err
    assert 10 - SCHED_LATE_S < took < 10 + SIGNAL_EXIT_S, took


# --- 8: long runs -----------------------------------------------------------------------------------


def _wait_lines(path: Path, n: int = 1, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_bytes().count(b"\n") >= n):
        assert time.monotonic() < deadline, f"{path}: fewer than {n} lines"
        time.sleep(0.05)


@pytest.mark.bpf
def test_sighup_starts_the_output_file_anew_for_logrotate(tmp_path):
    out = tmp_path / "rec.jsonl"
    proc = subprocess.Popen(pstate_cmd("record", "-q", "-o", str(out)), stderr=subprocess.PIPE, env=env())
    _wait_lines(out, 3)
    os.rename(out, tmp_path / "rec.jsonl.1")
    proc.send_signal(signal.SIGHUP)
    _wait_lines(out, 3)
    proc.send_signal(signal.SIGHUP)  # the file is still in place: nothing starts anew
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    old = [orjson.loads(x) for x in (tmp_path / "rec.jsonl.1").read_bytes().splitlines()]
    new = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert old[0]["type"] == "meta" and "window_begin_ts" not in old[0]
    assert old[-1]["type"] == "end" and old[-1]["reason"] == "reopen"
    assert [r["type"] for r in new].count("meta") == 1 and new[0]["type"] == "meta"
    assert new[0]["window_begin_ts"] == old[-1]["ts"] <= new[0]["ts"]
    assert new[-1]["type"] == "end" and new[-1]["reason"] == "signal"
    for recs in (old, new):
        events = sum(r["type"] in schema.EVENT_TYPES for r in recs)
        assert recs[-1]["events"] == events
    for f in (tmp_path / "rec.jsonl.1", out):
        s = subprocess.run(pstate_cmd("stats", "--strict", str(f)), capture_output=True, timeout=60, env=env())
        assert s.returncode == 0, s.stderr


@pytest.mark.bpf
def test_sighup_on_standard_output_still_ends_the_run():
    proc = subprocess.Popen(pstate_cmd("record", "-q"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    first = proc.stdout.readline()
    assert orjson.loads(first)["type"] == "meta"
    proc.send_signal(signal.SIGHUP)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert orjson.loads(out.splitlines()[-1])["reason"] == "signal"


def test_cache_below_a_directory_nobody_writes_is_never_read_while_they_swap_it(sticky):
    """The check-then-open race: the cache directory (root's, with a genuine
    entry) lies below nobody's directory; nobody swaps in a directory of
    their own holding a poisoned entry under the same name while root looks
    it up. Not one lookup may return the poisoned entry (none returns
    anything: the directory above is nobody's)."""
    key, name = "ab" * 32, "record"

    def entry(rows):
        maps = [{"name": "tasks", "kname": "tasks", "type": 1, "key_size": 4, "value_size": 8,
                 "max_entries": rows, "flags": 0, "key_desc": '"unsigned int"', "leaf_desc": '"unsigned long long"'}]
        return progcache.encode({"format": progcache.FORMAT, "key": key, "name": name, "license": "GPL",
                                 "kern_version": 0, "maps": maps, "progs": [], "attach": []})

    fname = os.path.basename(progcache.entry_path("", name, key))
    as_nobody("mkdir -m 755 x x/evil x/evil/programs", sticky)
    genuine = sticky / "x" / "y" / "programs"
    genuine.mkdir(parents=True, mode=0o755)
    genuine.chmod(0o755)
    genuine.parent.chmod(0o755)
    (genuine / fname).write_bytes(entry(TASKS))
    (genuine / fname).chmod(0o644)
    (sticky / fname).write_bytes(entry(EVIL_TASKS))
    (sticky / fname).chmod(0o644)
    as_nobody(f"cp {fname} x/evil/programs/ && chmod 644 x/evil/programs/{fname}", sticky)
    swapper = subprocess.Popen(NOBODY + ["sh", "-c", "cd x; while :; do mv y t && mv evil y && mv y evil && "
                                         "mv t y; done"], cwd=sticky, env={"PATH": "/usr/bin:/bin"})
    got = {"refused": 0}
    seen, swaps = None, 0
    try:
        while swaps < 200:  # lookups until x/y has changed under them 200 times
            try:
                ino = os.lstat(sticky / "x" / "y").st_ino
            except FileNotFoundError:
                ino = 0
            swaps += seen is not None and ino != seen
            seen = ino
            try:
                rows = progcache.lookup(key, name, str(genuine))["maps"][0]["max_entries"]
                got[rows] = got.get(rows, 0) + 1
            except progcache.CacheMiss:
                got["refused"] += 1
    finally:
        swapper.kill()
        swapper.wait()
    assert got.get(EVIL_TASKS, 0) == 0 and got.get(TASKS, 0) == 0 and got["refused"] >= swaps, (got, swaps)

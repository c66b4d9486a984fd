"""pstate snap's writer without BPF: the output directory, atomic publishing,
the lock, retention, signals, formats. The CLI runs for real (as a
subprocess) with a synthetic collector in place of the BPF program
(tests/data/snap/fake_snap.py), so these tests start it many times.

Regenerate the render goldens: PSTATE_REGEN=1 pytest tests/contract/test_snap_writer.py
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import io
import os
import random
import re
import select
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from conftest import TESTS, clean_env
from workloads import SIGNAL_EXIT_S
from pstate.engines.stats import snapshot_stats
from pstate import lifecycle
from pstate.snapshots import snapdir
from pstate.snapshots import histograms, writer
from pstate.main import cli as main_cli
from pstate.stream.meta import rfc3339

HERE = TESTS
DATA = HERE / "data" / "snap"
GOLDEN = HERE / "golden" / "snap"
FAKE = DATA / "fake_snap.py"
REGEN = os.environ.get("PSTATE_REGEN") == "1"
S = 1_000_000_000

sys.path.insert(0, str(DATA))
import fake_snap  # noqa: E402


def fake_cmd(*args) -> list[str]:
    return [sys.executable, str(FAKE), *map(str, args)]


def fake_env(**extra) -> dict:
    env = clean_env()
    env.update({k: str(v) for k, v in extra.items()})
    return env


def snap(*args, umask=None, timeout=60, **env):
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run(fake_cmd(*args), capture_output=True, text=True, timeout=timeout, env=fake_env(**env),
                          preexec_fn=pre)


def start(*args, **env) -> subprocess.Popen:
    return subprocess.Popen(fake_cmd(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=fake_env(**env))


def wait_line(p: subprocess.Popen, text: str, timeout: float = 20) -> None:
    """Read p's stderr until a line holds text."""
    end = time.monotonic() + timeout
    buf = b""
    fd = p.stderr.fileno()
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.1)
        if r:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
            if text.encode() in buf:
                return
    raise AssertionError(f"no {text!r} on stderr; got {buf!r}")


def snapshots(d: Path, ext: str = "jsonl") -> list[Path]:
    return sorted((p for p in d.iterdir() if (snapdir.parse_name(p.name) or (0, 0, ""))[2] == ext),
                  key=lambda p: snapdir.parse_name(p.name)[1])


def temps(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if snapdir.TEMP_RE.match(p.name)]


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def lines(p: Path) -> list[dict]:
    return [orjson.loads(x) for x in p.read_bytes().splitlines()]


# --- one snapshot ---------------------------------------------------------------


def test_one_shot_writes_exactly_one_complete_file(tmp_path):
    out = tmp_path / "out"
    r = snap("--dir", out, "-i", "0.05")
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # quiet on success: cron mails nothing
    files = snapshots(out)
    assert len(files) == 1 and files[0].name.endswith("-000001.jsonl")
    recs = lines(files[0])
    meta, rows, end = recs[0], recs[1:-1], recs[-1]
    for f in ("schema", "source", "tool", "version", "host", "kernel", "boot_id", "clock", "ts", "wall_ns",
              "interval_start_ts", "interval_end_ts", "wall_start_ns", "wall_end_ns", "seq", "mode", "truncated",
              "map_full", "states"):
        assert f in meta, f
    assert (meta["type"], meta["source"], meta["mode"], meta["seq"], meta["truncated"]) == \
        ("meta", "snap", "cumulative", 1, False)
    assert 0.05e9 <= meta["interval_end_ts"] - meta["interval_start_ts"] < 1e9
    assert meta["ts"] == meta["interval_end_ts"] and meta["wall_ns"] == meta["wall_end_ns"]
    assert len(rows) == 50 and all(r["type"] == "task" and r["ts"] == meta["ts"] for r in rows)
    assert all(list(r) == list(snapdir.ROW_FIELDS) for r in rows)
    assert end == {"type": "end", "ts": meta["ts"], "tasks": 50, "reason": "interval", "wall_time": meta["wall_time"],
                   "folded": 0, "fold_lost": 0, "hists": 0, "folds": 0}
    assert (meta["gone_full"], meta["folded"], meta["fold_lost"]) == (0, 0, 0)
    assert meta["wall_time"] == rfc3339(meta["wall_ns"])
    status = orjson.loads((out / snapdir.STATUS_NAME).read_bytes())
    assert status["ok"] is True and status["file"] == files[0].name and status["error"] is None
    assert sorted(p.name for p in out.iterdir()) == sorted([files[0].name, snapdir.STATUS_NAME,
                                                            snapdir.LOCK_NAME, writer.LEDGER_NAME])


@pytest.mark.parametrize("umask", [0o000, 0o077, 0o777])
def test_files_are_0600_whatever_the_umask(tmp_path, umask):
    out = tmp_path / "new"
    r = snap("--dir", out, "-i", "0.01", umask=umask)
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    for p in out.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name


def test_group_makes_files_0640(tmp_path):
    r = snap("--dir", tmp_path / "g", "-i", "0.01", "--group", "root")
    assert r.returncode == 0, r.stderr
    f = snapshots(tmp_path / "g")[0]
    assert stat.S_IMODE(f.stat().st_mode) == 0o640 and f.stat().st_gid == 0


def test_csv_format(tmp_path):
    r = snap("--dir", tmp_path, "-i", "0.01", "--format", "csv")
    assert r.returncode == 0, r.stderr
    (f,) = snapshots(tmp_path, "csv")
    text = f.read_text().splitlines()
    meta = orjson.loads(text[0][2:])
    end = orjson.loads(text[-1][2:])
    assert meta["source"] == "snap" and end["tasks"] == 50
    rows = list(csv.DictReader(text[1:-1]))
    assert list(rows[0]) == [c for c in snapdir.ROW_FIELDS if c != "type"]
    assert len(rows) == 50 and rows[0]["exited"] == "false" and rows[0]["exit_ts"] == ""


PROM_LINE = re.compile(r'^[a-z_]+(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? -?[0-9.e+]+$')


def test_prom_format_is_one_stable_file(tmp_path):
    r = snap("--dir", tmp_path, "--every", "0.05", "--count", "3", "--format", "prom", "--prom-by", "pid")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([snapdir.PROM_NAME, snapdir.STATUS_NAME,
                                                                 snapdir.LOCK_NAME])
    text = (tmp_path / snapdir.PROM_NAME).read_text()
    assert text.endswith("# EOF\n")
    typed = set()
    for ln in text.splitlines()[:-1]:
        if ln.startswith("# TYPE "):
            typed.add(ln.split()[2])
        elif not ln.startswith("# HELP "):
            assert PROM_LINE.match(ln), ln  # no timestamps: the textfile collector rejects them
            assert ln.split("{")[0].split(" ")[0] in typed, ln
    m = re.search(r'pstate_state_seconds_total\{pid="1000",comm="w0",state="sleeping"\} ([0-9.]+)', text)
    # 4 threads, 90% asleep, for 3 intervals of 50 ms
    assert 4 * 0.9 * 0.15 <= float(m.group(1)) < 4 * 0.9 * 1.0
    assert 'pstate_threads{pid="1000",comm="w0"} 4' in text


def _promtool() -> str:
    import shutil

    tool = shutil.which("promtool") or str(Path(sys.executable).parent / "promtool")
    assert os.access(tool, os.X_OK), "promtool is missing: make setup installs it"
    return tool


@pytest.mark.parametrize("by, series", [("unit", 3), ("cgroup", 3), ("title", 1), ("comm", 47), ("pid", 47),
                                        ("thread", 50)])
def test_prom_text_passes_promtool_and_is_bounded_by_units(tmp_path, by, series):
    # 50 threads of 13 processes (fake pids 1000-1012) in 3 services; only pid 1000 has its leader
    # (its 4 threads take its comm), so per comm or pid: 47 series; their titles "fake: worker
    # <pid>" are one role (the number is the volatile part), so per title: 1
    r = snap("--dir", tmp_path, "--every", "0.05", "--count", "2", "--format", "prom", "--prom-by", by)
    assert r.returncode == 0, r.stderr
    path = tmp_path / snapdir.PROM_NAME
    check = subprocess.run([_promtool(), "check", "metrics"], stdin=open(path, "rb"), capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    threads = [ln for ln in path.read_text().splitlines() if ln.startswith("pstate_threads{")]
    assert len(threads) == series, threads
    if by == "unit":
        assert sorted(ln.split()[0] for ln in threads) == [
            f'pstate_threads{{unit="fake{k}.service"}}' for k in range(3)]
        assert sum(int(ln.split()[1]) for ln in threads) == 50


# --- who may read the files (the rule at the top of snapshots/writer.py) ---------


@pytest.fixture
def open_base():
    """A directory any user can enter (pytest's tmp_path is under a 0700 one of
    root's), as a textfile collector's directory is."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="pstate-prom-", dir="/tmp"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("umask", [0o000, 0o077, 0o777])
def test_prom_file_is_0644_for_the_textfile_collector(open_base, umask):
    # node_exporter runs as its own user: it lists DIR and reads the file; nothing else is opened to it
    out = open_base / "textfile"
    r = snap("--dir", out, "-i", "0.01", "--format", "prom", "-v", umask=umask)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == {snapdir.PROM_NAME: 0o644, snapdir.STATUS_NAME: 0o600, snapdir.LOCK_NAME: 0o600}


def test_prom_file_with_group_is_0640_for_that_group(open_base):
    out = open_base / "textfile"
    r = snap("--dir", out, "-i", "0.01", "--format", "prom", "--group", "nogroup", "-v", umask=0o077)
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr
    st, f = out.stat(), (out / snapdir.PROM_NAME).stat()
    assert (stat.S_IMODE(st.st_mode), st.st_gid) == (0o750, 65534)
    assert (stat.S_IMODE(f.st_mode), f.st_gid) == (0o640, 65534)


def test_jsonl_and_csv_stay_root_only_in_an_open_dir(open_base):
    for fmt in ("jsonl", "csv"):
        out = open_base / fmt
        r = snap("--dir", out, "-i", "0.01", "--format", fmt)
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(out.stat().st_mode) == 0o700
        assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o600}


def test_prom_in_a_dir_a_collector_cannot_list_is_said(open_base, tmp_path):
    # an existing DIR is left as it is; --verbose (or a terminal) says why a collector cannot read the file;
    # cron (no terminal, no -v) gets nothing on success
    shut = open_base / "shut"
    shut.mkdir(mode=0o700)
    r = snap("--dir", shut, "-i", "0.01", "--format", "prom", "-v")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(shut.stat().st_mode) == 0o700
    assert stat.S_IMODE((shut / snapdir.PROM_NAME).stat().st_mode) == 0o644
    assert f"cannot read {shut}/{snapdir.PROM_NAME}: {shut} is mode 0700 (no read and search for others)" in r.stderr
    assert "/var/lib/prometheus/node-exporter" in r.stderr
    r = snap("--dir", shut, "-i", "0.01", "--format", "prom")
    assert r.returncode == 0 and r.stderr == ""
    # a directory on the way that others cannot search (pytest's own 0700 one)
    r = snap("--dir", tmp_path / "deep", "-i", "0.01", "--format", "prom", "-v")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE((tmp_path / "deep").stat().st_mode) == 0o755
    assert ", on its path, is mode 0700 (no search for others)" in r.stderr


def test_prom_labels_carry_titles_only_when_asked(tmp_path):
    for by in ("unit", "cgroup", "comm", "pid", "thread"):
        r = snap("--dir", tmp_path / by, "-i", "0.01", "--format", "prom", "--prom-by", by)
        assert r.returncode == 0, r.stderr
        text = (tmp_path / by / snapdir.PROM_NAME).read_text()
        assert "title=" not in text and "fake: worker" not in text, by
    r = snap("--dir", tmp_path / "title", "-i", "0.01", "--format", "prom", "--prom-by", "title")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "title" / snapdir.PROM_NAME).read_text()
    assert 'title="fake: worker N"' in text and "fake: worker 1000" not in text  # the role, as stats --by title


def _under_hidepid(*args) -> subprocess.CompletedProcess:
    """The fake snap in a mount namespace of its own whose /proc is a new
    instance mounted hidepid=invisible (the host's /proc is not touched)."""
    script = 'mount -t proc -o hidepid=invisible proc /proc && exec "$@"'
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                           *fake_cmd(*args)], capture_output=True, text=True, timeout=60, env=fake_env())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a /proc of its own")
def test_prom_under_hidepid_shows_no_one_what_proc_hides(open_base):
    for by, group, mode in (("title", None, 0o600), ("pid", None, 0o600), ("comm", None, 0o600),
                            ("title", "nogroup", 0o640), ("unit", None, 0o644), ("cgroup", None, 0o644)):
        out = open_base / f"{by}-{group}"
        r = _under_hidepid("--dir", out, "-i", "0.01", "--format", "prom", "--prom-by", by, "-v",
                           *(["--group", group] if group else []))
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE((out / snapdir.PROM_NAME).stat().st_mode) == mode, (by, group)
        said = f"hidepid=invisible) and --prom-by {by} labels name them" in r.stderr
        assert said == (mode == 0o600), r.stderr


def test_procfs_hidepid_reads_the_top_proc_mount(tmp_path):
    from pstate.snapshots.promexport import procfs_hidepid

    host = "22 27 0:21 / /proc rw,relatime - proc proc rw\n"
    f = tmp_path / "mountinfo"
    for text, want in ((host, None),
                       (host + "76 53 0:41 / /proc rw,relatime - proc proc rw,hidepid=invisible\n", "invisible"),
                       (host.replace("proc rw", "proc rw,hidepid=2"), "2"),
                       (host.replace("proc rw", "proc rw,hidepid=0"), None),
                       (host.replace("proc rw", "proc rw,hidepid=off"), None),
                       ("76 53 0:41 / /proc rw - proc proc rw,hidepid=2\n" + host, None),  # the later one is on top
                       ("30 22 0:41 / /proc/sys rw - proc proc rw,hidepid=2\n", None)):
        f.write_text(text)
        assert procfs_hidepid(str(f)) == want, text
    assert procfs_hidepid(str(tmp_path / "none")) is None


def test_snapshot_rows_carry_title_and_cgroup(tmp_path):
    r = snap("--dir", tmp_path, "--count", "1", "--interval", "0.05")
    assert r.returncode == 0, r.stderr
    snap_file = next(p for p in tmp_path.iterdir() if p.name.endswith(".jsonl"))
    rows = [orjson.loads(x) for x in snap_file.read_bytes().splitlines() if b'"type":"task"' in x]
    assert {(r["pid"], r["title"], r["cgroup"], r["cgroup_path"]) for r in rows} == {
        (p, f"fake: worker {p}", 100 + p % 3, f"/system.slice/fake{p % 3}.service") for p in range(1000, 1013)}


def test_clear_makes_each_snapshot_a_delta(tmp_path):
    r = snap("--dir", tmp_path, "--every", "0.05", "--count", "3", "--clear")
    assert r.returncode == 0, r.stderr
    metas, prev_end = [], None
    for f in snapshots(tmp_path):
        recs = lines(f)
        m = recs[0]
        assert m["mode"] == "delta"
        if prev_end is not None:
            assert m["interval_start_ts"] == prev_end
        prev_end = m["interval_end_ts"]
        dur = m["interval_end_ts"] - m["interval_start_ts"]
        for row in recs[1:-1]:
            assert abs(row["running_ns"] - dur / 10) <= 2 and abs(row["sleeping_ns"] - dur * 0.9) <= 2
        metas.append(m)
    assert len(metas) == 3


def test_wall_clock_steps_do_not_matter(tmp_path, monkeypatch):
    """The wall clock is set back an hour between snapshots: names stay unique,
    intervals come from the monotonic clock, and stats orders by it."""
    calls = {"n": 0}
    real = writer.clock_anchor

    def stepping():
        mono, wall = real()
        calls["n"] += 1
        return mono, wall - (3600 * S if calls["n"] > 2 else 0)

    monkeypatch.setattr(writer, "clock_anchor", stepping)
    d = writer.SnapDir(str(tmp_path))
    d.lock()
    plan = writer.Plan(interval_ns=S // 20, count=3)
    base = {"type": "meta", "schema": 1, "source": "snap", "boot_id": "b", "host": "h"}
    code = writer.Snapper(d, fake_snap.FakeCollector(4), plan, base, lifecycle.Stopper()).run()
    d.close()
    assert code == 0
    files = snapshots(tmp_path)
    assert [snapdir.parse_name(f.name)[1] for f in files] == [1, 2, 3]
    walls = [lines(f)[0]["wall_end_ns"] for f in files]
    assert walls[2] < walls[0]  # names and wall times went back; sequence numbers did not
    out = io.StringIO()
    snapshot_stats([str(tmp_path)], fmt="json", top=None, by="pid", out=out, err=io.StringIO())
    ivs = orjson.loads(out.getvalue())["intervals"]
    assert [iv["seq"] for iv in ivs] == [1, 2, 3]
    # an hour's step would show; a loaded machine's late wake-ups must not
    # (a late snapshot makes the next interval of the schedule shorter)
    assert all(0 < iv["duration_ns"] < 60e9 for iv in ivs)


# --- the directory ----------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o720])
def test_refuses_group_or_world_writable_dir(tmp_path, mode):
    d = tmp_path / "d"
    d.mkdir()
    d.chmod(mode)
    r = snap("--dir", d, "-i", "0.01")
    assert r.returncode == 77
    assert f"--dir {d} is group- or world-writable (mode {mode:04o})" in r.stderr
    assert "Traceback" not in r.stderr and list(d.iterdir()) == []


def test_refuses_symlinked_out(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    r = snap("--dir", tmp_path / "link", "-i", "0.01")
    assert r.returncode == 77 and "is a symbolic link" in r.stderr
    assert list((tmp_path / "real").iterdir()) == []


def test_refuses_symlinked_lock_file(tmp_path):
    canary = tmp_path / "canary"
    canary.write_text("keep")
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    (d / snapdir.LOCK_NAME).symlink_to(canary)
    r = snap("--dir", d, "-i", "0.01")
    assert r.returncode == 77 and "lock file" in r.stderr
    assert canary.read_text() == "keep"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_refuses_dir_owned_by_someone_else(tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    os.chown(d, 65534, 65534)
    r = snap("--dir", d, "-i", "0.01")
    assert r.returncode == 77 and "owned by uid 65534" in r.stderr


def test_bad_out_paths(tmp_path):
    r = snap("--dir", tmp_path / "a" / "b", "-i", "0.01")
    assert r.returncode == 73 and "no such directory, and its parent" in r.stderr
    (tmp_path / "file").write_text("x")
    r = snap("--dir", tmp_path / "file", "-i", "0.01")
    assert r.returncode == 73 and "is not a directory" in r.stderr


def test_stale_temp_files_are_removed_never_through_symlinks(tmp_path):
    canary = tmp_path / "canary"
    canary.write_text("keep")
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    for i in range(3):
        (d / f".pstate-pstate-snap-x.jsonl.tmp.{100 + i}.ab12").write_text("partial")
    (d / ".pstate-evil.tmp.1.ab").symlink_to(canary)
    (d / ".pstate-dir.tmp.1.ab").mkdir()
    (d / "notes.txt").write_text("mine")
    r = snap("--dir", d, "-i", "0.01")
    assert r.returncode == 0, r.stderr
    assert "removed 3 temp files an interrupted run left" in r.stderr
    assert sorted(temps(d)) == [".pstate-dir.tmp.1.ab", ".pstate-evil.tmp.1.ab"]
    assert canary.read_text() == "keep" and (d / "notes.txt").read_text() == "mine"


# --- one instance per directory ---------------------------------------------------------


def test_second_instance_exits_75_at_once(tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    fd = os.open(d / snapdir.LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"4242\n")
        # at once: not after the interval (snap's timeout is a minute)
        r = snap("--dir", d, "-i", "3600")
        assert r.returncode == 75
        assert f"{d} is locked by pid 4242 (another pstate snap writes there)" in r.stderr
        assert snapshots(d) == []
    finally:
        os.close(fd)


def test_ten_concurrent_runs_one_writes(tmp_path):
    """Runs started together race for the directory's lock: one takes it,
    every other one exits 75. The one that took it waits at a gate before
    it collects, so it holds the lock until all the others have tried,
    however slowly they start."""
    d = tmp_path / "d"
    gate = tmp_path / "gate"
    procs = [subprocess.Popen(fake_cmd("--dir", d, "-i", "0.01"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, env=fake_env(FAKE_SNAP_GATE=gate), text=True)
             for _ in range(10)]
    try:
        while sum(p.poll() is not None for p in procs) < len(procs) - 1:
            time.sleep(0.01)
        gate.touch()
        results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = sorted(c for c, _ in results)
    assert codes == [0] + [75] * 9, results
    # the holder's pid, or "another process" if it has the lock but has not written its pid yet
    assert all(re.search(r"is locked by (pid \d+|another process) ", err) for c, err in results if c == 75), results
    assert len(snapshots(d)) == 1 and temps(d) == []


def test_a_killed_holder_does_not_block_the_next_run(tmp_path):
    d = tmp_path / "d"
    p = start("--dir", d, "-i", "30", "-v")
    try:
        wait_line(p, "collecting")
        p.kill()
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
    r = snap("--dir", d, "-i", "0.01")
    assert r.returncode == 0, r.stderr
    assert len(snapshots(d)) == 1


# --- crashes and signals -------------------------------------------------------------


def test_sigkill_at_random_moments_never_publishes_a_partial_file(tmp_path):
    """Each run is killed at a random moment once it collects, snapshots
    being written back to back: never a partial snapshot, and the next run
    removes the temp files left."""
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    rng = random.Random(4)
    left = 0
    for _ in range(20):
        p = start("--dir", d, "--every", "0.02", "--keep", "3", "-v", FAKE_SNAP_ROWS=3000)
        wait_line(p, "collecting")
        time.sleep(rng.uniform(0, 0.1))
        p.kill()
        p.wait()
        p.stderr.close()
        left += bool(temps(d))
        for f in snapshots(d):
            assert snapdir.read_snapshot(str(f)) is not None, f  # complete, with its end record
    r = snap("--dir", d, "-i", "0.01")
    assert r.returncode == 0
    assert temps(d) == []
    print(f"{left} of 20 kills left a temp file behind; the next run removed them")


def test_sigterm_exits_143_promptly_and_leaves_nothing(tmp_path):
    d = tmp_path / "d"
    p = start("--dir", d, "-i", "30", "-v")
    wait_line(p, "collecting")
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 143
    assert time.monotonic() - t0 < SIGNAL_EXIT_S
    assert snapshots(d) == [] and temps(d) == []
    status = orjson.loads((d / snapdir.STATUS_NAME).read_bytes())
    assert status["ok"] is False and "interrupted by signal 15" in status["error"]


def test_sigint_exits_130(tmp_path):
    p = start("--dir", tmp_path, "-i", "30", "-v")
    wait_line(p, "collecting")
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=5) == 130
    assert snapshots(tmp_path) == [] and temps(tmp_path) == []


def test_sigterm_at_random_moments(tmp_path):
    """A signal while a snapshot is being collected or written lets it finish
    (exit 0); while waiting, it ends the run (143); before snap has even
    set up its handlers (Python still starting) it kills it outright, with
    nothing yet written. Never a partial file, never a temp file.

    The first two runs are signalled as soon as they are started (in
    start-up), the others at a random moment once they collect."""
    rng = random.Random(7)
    seen = set()
    for i in range(10):
        d = tmp_path / f"d{i}"
        p = start("--dir", d, "--every", "0.05", "-v", FAKE_SNAP_ROWS=3000, FAKE_SNAP_SLOW=0.02)
        if i >= 2:
            wait_line(p, "collecting")
            time.sleep(rng.uniform(0, 0.12))
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        code = p.wait(timeout=30)
        p.stderr.close()
        assert time.monotonic() - t0 < SIGNAL_EXIT_S
        assert code in (0, 143, -signal.SIGTERM)
        seen.add(code)
        assert temps(d) == [] if d.exists() else True
        for f in snapshots(d) if d.exists() else []:
            assert snapdir.read_snapshot(str(f)) is not None
    assert seen & {0, 143}, seen


@pytest.fixture
def tiny_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "tiny"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "pstate-test", str(d)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_disk_full_is_a_clear_error_and_keeps_earlier_snapshots(tiny_fs):
    d = tiny_fs
    r = snap("--dir", d, "-i", "0.01", FAKE_SNAP_ROWS=20)
    assert r.returncode == 0, r.stderr
    (first,) = snapshots(d)
    before = sha(first)
    # fill the file system but for 16 KiB
    fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    os.truncate(d / "filler", max(0, (d / "filler").stat().st_size - 16384))
    r = snap("--dir", d, "-i", "0.01", FAKE_SNAP_ROWS=3000)
    assert r.returncode == 73, r.stderr
    assert f"cannot write snapshot {d}/pstate-snap-" in r.stderr
    assert "No space left on device (ENOSPC)" in r.stderr and "earlier snapshots are intact" in r.stderr
    assert "Traceback" not in r.stderr
    assert snapshots(d) == [first] and sha(first) == before and temps(d) == []
    status = orjson.loads((d / snapdir.STATUS_NAME).read_bytes())
    assert status["ok"] is False and "ENOSPC" in status["error"]


# --- retention ----------------------------------------------------------------------------


def test_keep_keeps_exactly_n_and_only_touches_own_files(tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    (d / "notes.txt").write_text("mine")
    foreign = "pstate-snap-20000101T000000.000000Z-000000.jsonl"
    (d / foreign).symlink_to(tmp_path / "elsewhere")
    (d / "pstate-snap-20000101T000000.000000Z-000000.csv").write_text("other format")
    r = snap("--dir", d, "--every", "0.02", "--count", "7", "--keep", "3")
    assert r.returncode == 0, r.stderr
    assert [snapdir.parse_name(f.name)[1] for f in snapshots(d) if not f.is_symlink()] == [5, 6, 7]
    r = snap("--dir", d, "--every", "0.02", "--count", "2", "--keep", "3")
    assert r.returncode == 0, r.stderr
    assert [snapdir.parse_name(f.name)[1] for f in snapshots(d) if not f.is_symlink()] == [7, 8, 9]
    assert (d / "notes.txt").exists() and (d / foreign).is_symlink()
    assert len(snapshots(d, "csv")) == 1


def test_max_age_deletes_old_files_by_name_time(tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    out = writer.SnapDir(str(d))
    out.lock()
    now = time.time_ns()
    old = [out.publish_snapshot(now - h * 3600 * S, "jsonl", lambda seq: b"{}\n") for h in (3, 2)]
    recent = out.publish_snapshot(now - 60 * S, "jsonl", lambda seq: b"{}\n")
    out.close()
    planted = snapdir.snapshot_name(now - 5 * 3600 * S, 1, "jsonl")  # old, but not pstate's
    (d / planted).write_text("{}\n")
    r = snap("--dir", d, "-i", "0.01", "--max-age", "1h")
    assert r.returncode == 0, r.stderr
    names = [f.name for f in snapshots(d)]
    assert not set(old) & set(names)
    assert names[:2] == [planted, recent] and len(names) == 3 and names[2].endswith("-000004.jsonl")


def test_retention_deletes_only_what_pstate_wrote(tmp_path):
    """Files named like snapshots that pstate did not write (a foreign
    sequence number 999999 among them) are never deleted, and do not make
    --keep delete pstate's own newest files."""
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    foreign = {snapdir.snapshot_name(time.time_ns() - 3600 * S, 999999, "jsonl"): b"a\n",
               snapdir.snapshot_name(time.time_ns() + 3600 * S, 1, "jsonl"): b"b\n",
               snapdir.snapshot_name(time.time_ns() - 99 * 3600 * S, 5, "jsonl"): b"c\n"}
    for name, data in foreign.items():
        (d / name).write_bytes(data)
    before = {n: sha(d / n) for n in foreign}
    r = snap("--dir", d, "--every", "0.02", "--count", "5", "--keep", "2", "--max-age", "1m")
    assert r.returncode == 0, r.stderr
    mine = [f.name for f in snapshots(d) if f.name not in foreign]
    assert [snapdir.parse_name(n)[1] for n in mine] == [4, 5]  # pstate's own newest two
    assert {n: sha(d / n) for n in foreign} == before
    assert (d / writer.LEDGER_NAME).read_text().splitlines() == mine


def test_prune_never_deletes_the_newest(tmp_path):
    d = writer.SnapDir(str(tmp_path))
    d.lock()
    name = d.publish_snapshot(1_000 * S, "jsonl", lambda seq: b"{}\n")
    assert d.prune(ext="jsonl", keep=1, max_age_ns=1, now_wall_ns=10**19, protect=name) == []
    d.close()


# --- rendering -------------------------------------------------------------------------------


def _sample_records():
    meta = {"type": "meta", "schema": 1, "source": "snap", "boot_id": "b", "ts": 20 * S, "wall_ns": 1_700_000_020 * S,
            "interval_start_ts": 10 * S, "interval_end_ts": 20 * S, "wall_start_ns": 1_700_000_010 * S,
            "wall_end_ns": 1_700_000_020 * S, "seq": 3, "mode": "cumulative", "truncated": False, "map_full": 0}
    rows = [{"type": "task", "ts": 20 * S, **fake_snap.fake_row(7, 7, 5 * S, 20 * S, comm='we"ird,name', running_ns=S,
                                                                 steal_irq_ns=S // 50, sleeping_ns=9 * S, nvcsw=3)},
            {"type": "task", "ts": 20 * S, **fake_snap.fake_row(7, 8, 6 * S, 20 * S, comm="helper", state="reaped",
                                                                 exited=True, exit_ts=15 * S, zombie_ns=S)}]
    end = {"type": "end", "ts": 20 * S, "tasks": 2, "reason": "interval"}
    return meta, rows, end


def _sample_hist() -> tuple:
    """A thread's histograms (histograms.from_row's layout): 3 wake-up waits
    of 3 us and one of 20 us, 2 D waits of 10 ms."""
    nb, counts = histograms.NBUCKETS, [0] * (histograms.NKINDS * histograms.NBUCKETS)
    counts[2] += 3  # 2048 < d <= 4096 ns
    counts[5] += 1  # 16384 < d <= 32768
    counts[3 * nb + 14] += 2  # 2^23 < d <= 2^24 ns
    return (29_000, 0, 0, 20_000_000, *counts)


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "prom"])
def test_render_golden(fmt):
    meta, rows, end = _sample_records()
    if fmt == "jsonl":
        out = writer.render_jsonl(meta, rows, end)
    elif fmt == "csv":
        out = writer.render_csv(meta, rows, end)
    else:
        prom = writer.PromExport("process")
        prom.update(rows, [snapdir.subtract(r, None) for r in rows], [True, True], 0, [_sample_hist(), None])
        out = prom.render(meta)
    path = GOLDEN / f"render.{fmt}"
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(out)
    assert out == path.read_bytes()


def test_prom_counters_only_grow_across_exec_and_exit():
    prom = writer.PromExport("comm")
    t = dict(fake_snap.fake_row(1, 1, 0, 0, comm="a", running_ns=5 * S))
    prom.update([t], [snapdir.subtract(t, None)], [True], 0)
    first = prom.totals[("a",)]["running_ns"]
    t2 = dict(t, comm="b", running_ns=7 * S)  # exec renamed it: only its growth moves to "b"
    prom.update([t2], [snapdir.subtract(t2, t)], [False], 0)
    assert prom.totals[("a",)]["running_ns"] == first == 5 * S
    assert prom.totals[("b",)]["running_ns"] == 2 * S
    by_proc = writer.PromExport("process")
    gone = dict(t, state="reaped", exited=True)
    by_proc.update([gone], [snapdir.subtract(gone, None)], [True], 0)
    assert by_proc.threads[(1, "a")] == 0 and by_proc.exited == 1
    by_proc.update([], [], [], 0)
    assert by_proc.totals == {}  # shown once after it ended, then its series stop


def test_usage_errors(monkeypatch, tmp_path):
    fake_snap.install(setter=monkeypatch.setattr)
    runner = CliRunner()
    cases = [
        (["--every", "1s", "--interval", "2s"], "give --every or --interval, not both"),
        (["--format", "prom", "--clear"], "drop --clear"),
        (["--format", "prom", "--keep", "3"], "--keep and --max-age do not apply"),
        (["-i", "1ms"], "must be at least 10ms"),
        ([], None),
    ]
    for extra, msg in cases:
        args = ["snap"] + (["--dir", str(tmp_path / "u")] if extra else []) + extra
        r = runner.invoke(main_cli, args)
        assert r.exit_code == 2, (extra, r.output)
        assert (msg or "Missing option '--dir'") in r.stderr


def test_quiet_says_nothing_on_stderr(tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    (d / ".pstate-pstate-snap-x.jsonl.tmp.100.ab12").write_text("partial")
    r = snap("--dir", d, "-i", "0.01", "-q")
    assert (r.returncode, r.stderr) == (0, "")
    assert temps(d) == [] and len(snapshots(d)) == 1
    r = snap("--dir", d, "-i", "0.01", "-q", "-v")
    assert r.returncode == 2 and "--quiet and --verbose contradict each other" in r.stderr

"""Privilege: what record and snap need is said exactly, setuid is never
recommended, and the readers (stats, heat, replay) need no privilege.

The unprivileged runs use setpriv (util-linux) to become nobody, so they need
root to start; in CI a missing root or setpriv fails them instead of skipping.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from conftest import IN_CI, clean_env
from pstate.main import cli as main_cli

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# Fallback when nobody cannot reach this checkout (e.g. it lives under a
# 0700 home): uid 0 with every capability removed, which the kernel treats
# as unprivileged for BPF and perf.
NO_CAPS = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all"]


def _setuid_only_discouraged(text: str) -> list[str]:
    """Sentences that mention setuid without saying never/not to use it."""
    bad = []
    for sentence in re.split(r"(?<=[.;:!?])\s+|\n\s*\n", text):
        if re.search(r"set-?uid|chmod\s+u\+s|\+s\b", sentence, re.I) and not re.search(
                r"\b(never|not|don't|do not|no)\b", sentence, re.I):
            bad.append(sentence.strip())
    return bad


def _names_the_privileges(text: str) -> None:
    flat = " ".join(text.split())
    assert "root" in flat, text
    assert "CAP_BPF" in flat and "CAP_PERFMON" in flat, text
    assert "tracefs" in flat, text


# --- what doctor says -----------------------------------------------------------


def test_doctor_help_says_which_privileges_and_never_setuid():
    r = CliRunner().invoke(main_cli, ["doctor", "--help"])
    assert r.exit_code == 0, r.output
    _names_the_privileges(r.stdout)
    assert re.search(r"\bnever\b[^.]*setuid", r.stdout, re.I), "doctor --help should warn against setuid"
    assert not _setuid_only_discouraged(r.stdout), _setuid_only_discouraged(r.stdout)
    for cmd in ("stats", "heat", "replay"):
        assert cmd in r.stdout  # ... which need no privilege


def test_record_help_never_recommends_setuid():
    for cmd in ("record", "snap"):
        r = CliRunner().invoke(main_cli, [cmd, "--help"])
        assert r.exit_code == 0, r.output
        assert not _setuid_only_discouraged(r.stdout), (cmd, _setuid_only_discouraged(r.stdout))


# --- running as an unprivileged user ---------------------------------------------


@functools.lru_cache(maxsize=None)
def _unprivileged() -> tuple[list[str], str]:
    """The setpriv prefix to run pstate without privilege, and who that is."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        why = "needs root and setpriv (util-linux) to drop privileges"
        if IN_CI:
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    probe = [sys.executable, "-c", "import pstate.main"]
    if subprocess.run(NOBODY + probe, capture_output=True, cwd="/", env=_env("/tmp")).returncode == 0:
        return NOBODY, "nobody (uid 65534)"
    return NO_CAPS, "uid 0 without capabilities (nobody cannot read this checkout)"


def _env(home: str) -> dict:
    env = clean_env()
    env.update(HOME=home, PYTHONDONTWRITEBYTECODE="1", COLUMNS="100", LINES="40")
    env.pop("PSTATE_KERNEL_HEADERS", None)
    return env


def small_recording() -> bytes:
    """A short valid recording: two threads, one second, a loss record."""
    t0 = 1_000_000_000
    meta = {"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "0.1.0",
            "host": "fixture", "kernel": "6.1.0", "boot_id": "00000000-0000-0000-0000-000000000000",
            "clock": "monotonic", "ts": t0, "wall_ns": 1_767_225_600_000_000_000, "ncpu": 2,
            "include_idle": False}
    recs = [meta]
    ts = t0
    for i in range(10):
        for tid, comm, cpu in ((300, "web", 0), (301, "db", 1)):
            base = ts + tid
            recs.append({"type": "state", "ts": base + 1_000_000, "cpu": cpu, "pid": 300, "tid": tid, "comm": comm,
                         "from": "sleeping", "to": "runnable", "dur_ns": None if i == 0 else 80_000_000,
                         "cause": "wakeup", "waker_tid": 1, "waker_pid": 1, "target_cpu": cpu})
            recs.append({"type": "state", "ts": base + 1_050_000, "cpu": cpu, "pid": 300, "tid": tid, "comm": comm,
                         "from": "runnable", "to": "running", "dur_ns": 50_000, "cause": "switch_in",
                         "prio": 120, "prev_tid": 0})
            recs.append({"type": "state", "ts": base + 21_050_000, "cpu": cpu, "pid": 300, "tid": tid,
                         "comm": comm, "from": "running", "to": "sleeping", "dur_ns": 20_000_000,
                         "cause": "switch_out", "voluntary": True, "kstate": "S", "prio": 120, "next_tid": 0})
        ts += 100_000_000
    recs.append({"type": "loss", "ts": ts, "reason": "ringbuf_full", "count": 3, "since_ts": t0})
    n = sum(r["type"] == "state" for r in recs)
    recs.append({"type": "end", "ts": ts + 1, "reason": "signal", "events": n, "lost": 3, "lost_ringbuf_full": 3,
                 "lost_map_full": 0, "lost_sampled": 0, "lost_unread": 0, "kernel_events": n + 3,
                 "duration_ns": ts + 1 - t0})
    return b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in recs)


@pytest.fixture
def world_readable():
    """A world-readable directory outside pytest's private tmp tree, holding
    the recording as rec.jsonl."""
    d = Path(tempfile.mkdtemp(prefix="pstate-priv-"))
    d.chmod(0o755)
    rec = d / "rec.jsonl"
    rec.write_bytes(small_recording())
    rec.chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run_unprivileged(d: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess:
    prefix, _who = _unprivileged()
    return subprocess.run(prefix + [sys.executable, "-m", "pstate", *args], capture_output=True, cwd=d,
                          env=_env(str(d)), input=input, timeout=120)


def _assert_no_traceback(p: subprocess.CompletedProcess) -> None:
    err = p.stderr.decode(errors="replace")
    assert "Traceback" not in err, err


@pytest.mark.parametrize("args", [
    ("stats", "rec.jsonl"),
    ("stats", "--by", "tid", "--hist", "rec.jsonl"),
    ("heat", "--no-color", "--width", "80", "rec.jsonl"),
    ("replay", "--no-wait", "rec.jsonl"),
], ids=lambda a: " ".join(a))
def test_readers_run_without_privilege(world_readable, args):
    p = _run_unprivileged(world_readable, *args)
    _assert_no_traceback(p)
    assert p.returncode == 0, (p.returncode, p.stderr.decode(errors="replace"))
    assert p.stdout.strip(), f"{args[0]} printed nothing"
    if args[0] == "replay":
        recs = [orjson.loads(x) for x in p.stdout.splitlines()]
        assert recs[0]["type"] == "meta" and recs[-1]["type"] == "end"
        assert sum(r["type"] == "state" for r in recs) == 60


def test_replay_into_stats_without_privilege(world_readable):
    rep = _run_unprivileged(world_readable, "replay", "--no-wait", "rec.jsonl")
    assert rep.returncode == 0, rep.stderr
    p = _run_unprivileged(world_readable, "stats", "--by", "tid", input=rep.stdout)
    _assert_no_traceback(p)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    assert b"web" in p.stdout and b"db" in p.stdout


def test_record_without_privilege_exits_77_with_a_clear_message(world_readable):
    p = _run_unprivileged(world_readable, "record", "-d", "1", "-o", "out.jsonl")
    _assert_no_traceback(p)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 77, (p.returncode, err)
    assert p.stdout == b""
    _names_the_privileges(err)
    assert not _setuid_only_discouraged(err), err
    assert not (world_readable / "out.jsonl").exists(), "record created its output before failing"


def test_snap_without_privilege_exits_77(world_readable):
    p = _run_unprivileged(world_readable, "snap", "--dir", str(world_readable / "snaps"))
    _assert_no_traceback(p)
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 77, (p.returncode, err)
    assert "CAP_BPF" in err or "root" in err, err


def test_doctor_without_privilege_says_what_is_missing(world_readable):
    p = _run_unprivileged(world_readable, "doctor", "--no-live", "--format", "json")
    _assert_no_traceback(p)
    assert p.returncode == 77, (p.returncode, p.stderr.decode(errors="replace"))
    rows = {r["check"]: r for r in orjson.loads(p.stdout)}
    priv = rows["privileges"]
    assert priv["status"] == "PROBLEM", priv
    text = f"{priv['detail']} {priv['fix']}"
    assert "CAP_BPF" in text and "CAP_PERFMON" in text and "root" in text, priv
    assert not _setuid_only_discouraged(text), priv
    # the table form says the same
    t = _run_unprivileged(world_readable, "doctor", "--no-live")
    assert t.returncode == 77 and b"CAP_PERFMON" in t.stdout, t.stdout


def test_doctor_without_privilege_does_not_call_tracefs_unmounted(world_readable):
    mounted = any(line.split()[2] == "tracefs" for line in Path("/proc/mounts").read_text().splitlines())
    if not mounted:
        pytest.skip("tracefs is not mounted here")
    p = _run_unprivileged(world_readable, "doctor", "--no-live", "--format", "json")
    rows = {r["check"]: r for r in orjson.loads(p.stdout)}
    assert "not mounted" not in rows["tracefs"]["detail"], rows["tracefs"]

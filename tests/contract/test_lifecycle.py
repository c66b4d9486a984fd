"""The one signal helper (pstate.lifecycle): installed before anything that
can be interrupted, so a signal during start-up gives each command's
documented exit status and leaves no empty or stray file; and no other
module of the package handles signals itself.

"At once" is the moment the helper is installed (conftest.wait_ready: the
process catches SIGTERM); the random moments fall within the half second
after it, while the command imports, parses, opens its output, loads its
program. (Before, for the few milliseconds the interpreter takes to start,
the kernel's default action applies: no pstate code has run yet.)"""

from __future__ import annotations

import ast
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from conftest import TESTS, clean_env, pstate_cmd, wait_ready
from pstate import lifecycle
from pstate.exitcodes import ExitCode

HERE = TESTS
PKG = HERE.parent / "cli" / "pstate"
DATA = HERE / "data"
RECORDING = DATA / "stats" / "basic.jsonl"
FAKE_SNAP = DATA / "snap" / "fake_snap.py"
SIGNALS = (signal.SIGINT, signal.SIGTERM)
TRIES = 5  # random moments per command and signal


def test_codes_are_the_documented_ones():
    assert lifecycle.code_of(signal.SIGINT) == ExitCode.SIGINT == 130
    assert lifecycle.code_of(signal.SIGTERM) == ExitCode.SIGTERM == 143
    assert lifecycle.code_of(signal.SIGHUP) == 129


def test_only_the_helper_handles_signals():
    """signal.signal and set_wakeup_fd appear in pstate/lifecycle.py alone."""
    allowed = {"lifecycle.py"}
    found = []
    for path in PKG.rglob("*.py"):
        rel = str(path.relative_to(PKG))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("signal", "set_wakeup_fd", "default_int_handler") \
                    and isinstance(node.value, ast.Name) and node.value.id == "signal" and rel not in allowed:
                found.append(f"{rel}:{node.lineno}")
    assert found == []


# --- the helper in a process of its own --------------------------------------------

HELPER = """
import os, signal, sys, time
from pstate import lifecycle
lifecycle.install()
me = os.getpid()
os.kill(me, signal.SIGTERM)          # noted while starting: nothing raised
os.kill(me, signal.SIGINT)
assert lifecycle.peek() == (signal.SIGTERM, signal.SIGINT), lifecycle.peek()
try:
    with lifecycle.interruptible():  # the first noted is raised at once
        raise SystemExit("not raised")
except lifecycle.Terminated as e:
    assert e.signum == signal.SIGTERM
try:
    with lifecycle.interruptible():
        raise SystemExit("not raised")
except KeyboardInterrupt as e:
    assert isinstance(e, lifecycle.Interrupted)
os.kill(me, signal.SIGINT)
with lifecycle.interruptible(pass_sigint=1):  # stats on a pipe: the first Ctrl-C is let by
    pass
assert lifecycle.peek() == ()
os.kill(me, signal.SIGHUP)
assert lifecycle.wait(time.monotonic_ns() + 10**9) is True
assert lifecycle.take() == [signal.SIGHUP] and lifecycle.take() == []
got = []
os.kill(me, signal.SIGTERM)
with lifecycle.handled(got.append):   # replay: its function marks the stop
    os.kill(me, signal.SIGINT)
assert got == [signal.SIGTERM, signal.SIGINT] and lifecycle.peek() == ()
lifecycle.watch(signal.SIGUSR1)
os.kill(me, signal.SIGUSR1)
os.kill(me, signal.SIGHUP)
assert lifecycle.exit_code() == 129       # a stopping signal no one took
assert lifecycle.take() == [signal.SIGUSR1, signal.SIGHUP]
assert lifecycle.exit_code() is None and lifecycle.first() == signal.SIGTERM
t0 = time.monotonic()
assert lifecycle.wait(time.monotonic_ns() + 50_000_000) is False and time.monotonic() - t0 >= 0.05
print("ok")
"""


def test_the_helper_notes_raises_and_hands_out():
    r = subprocess.run([sys.executable, "-c", HELPER], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "ok\n", "")


def test_a_signal_wakes_a_wait_at_once():
    code = ("import os, signal, threading, time\nfrom pstate import lifecycle\nlifecycle.install()\n"
            "threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
            "t0 = time.monotonic()\nassert lifecycle.wait(time.monotonic_ns() + 30 * 10**9)\n"
            "print(round(time.monotonic() - t0, 1))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert r.returncode == 0 and float(r.stdout) < 5, r.stderr


# --- every command, signalled while it starts ----------------------------------------


def _signal_early(cmd: list[str], sig: int, delay: float, *, stdin=None, env=None) -> subprocess.CompletedProcess:
    p = subprocess.Popen(cmd, stdin=stdin if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**clean_env(), **(env or {})})
    try:
        try:
            wait_ready(p)
        except AssertionError:
            # a short command (export of a small file) can do all its work
            # while a loaded machine keeps this test off CPU between two
            # looks at it: with exit 0 it simply ended before the signal
            if p.poll() != 0:
                raise
            out, err = p.communicate()
            return subprocess.CompletedProcess(cmd, p.returncode, out, err)
        time.sleep(delay)
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def _moments(seed: int) -> list[float]:
    rng = random.Random(seed)
    return [0.0] + [rng.uniform(0, 0.5) for _ in range(TRIES)]


def _no_traceback(r) -> None:
    assert b"Traceback" not in r.stderr, r.stderr.decode(errors="replace")


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file())


def _recording_whole(path: Path) -> None:
    """A recording signalled early is absent or whole: a meta record first,
    an end record last, never an empty or torn file."""
    if not path.exists():
        return
    recs = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    assert recs and recs[0]["type"] == "meta" and recs[-1]["type"] == "end", path


@pytest.mark.parametrize("sig", SIGNALS)
def test_stats_of_a_file(sig):
    for delay in _moments(sig):
        r = _signal_early(pstate_cmd("stats", str(RECORDING), "-f", "json"), sig, delay)
        _no_traceback(r)
        # Ctrl-C prints what was read (130); SIGTERM ends it (143), or it was done first
        assert r.returncode in (lifecycle.code_of(sig), 0), (delay, r.stderr)
        if r.returncode == ExitCode.SIGINT:
            assert orjson.loads(r.stdout)["input"]["interrupted"] is True


def test_stats_on_a_pipe_lets_the_first_ctrl_c_by():
    for delay in _moments(3):
        r, w = os.pipe()
        try:
            os.write(w, RECORDING.read_bytes())
            p = subprocess.Popen(pstate_cmd("stats", "-f", "json"), stdin=r, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=clean_env())
            os.close(r)
            wait_ready(p)
            time.sleep(delay)
            p.send_signal(signal.SIGINT)
            os.close(w)  # the end of the stream, as record's trailer ends it
            w = -1
            out, err = p.communicate(timeout=60)
        finally:
            if w >= 0:
                os.close(w)
        assert p.returncode == 0, err
        assert orjson.loads(out)["input"]["interrupted"] is False


@pytest.mark.parametrize("sig", SIGNALS)
def test_heat_of_a_file(sig):
    for delay in _moments(10 + sig):
        r = _signal_early(pstate_cmd("heat", str(RECORDING)), sig, delay)
        _no_traceback(r)
        # Ctrl-C draws what was read (0); SIGTERM ends it (143), or it was done first
        assert r.returncode in ((0,) if sig == signal.SIGINT else (143, 0)), (delay, r.stderr)


@pytest.mark.parametrize("sig", SIGNALS)
def test_replay_to_a_file(sig, tmp_path):
    for i, delay in enumerate(_moments(20 + sig)):
        out = tmp_path / f"r{i}.jsonl"
        r = _signal_early(pstate_cmd("replay", str(RECORDING), "-o", str(out)), sig, delay)
        _no_traceback(r)
        assert r.returncode == 0, (delay, r.stderr)  # Ctrl-C and SIGTERM end a replay normally
        if out.exists():
            recs = [orjson.loads(x) for x in out.read_bytes().splitlines()]
            assert recs and recs[-1]["type"] == "end"
        assert _files(tmp_path) == sorted(tmp_path.glob("r*.jsonl"))


@pytest.mark.parametrize("sig", SIGNALS)
def test_export_to_a_file(sig, tmp_path):
    for i, delay in enumerate(_moments(30 + sig)):
        out = tmp_path / f"t{i}.json"
        r = _signal_early(pstate_cmd("export", "-f", "chrome", str(RECORDING), "-o", str(out)), sig, delay)
        _no_traceback(r)
        assert r.returncode in (lifecycle.code_of(sig), 0), (delay, r.stderr)
        if r.returncode:
            assert not out.exists()
        else:
            assert orjson.loads(out.read_bytes())
        assert all(not p.name.startswith(".") for p in _files(tmp_path))  # no temporary file left


@pytest.mark.parametrize("sig", SIGNALS)
def test_snap_with_its_fake_collector(sig, tmp_path):
    """snap's own loop and files (the fake collector of test_snap_writer):
    130 or 143 and nothing in DIR, or a whole snapshot and 0."""
    for i, delay in enumerate(_moments(40 + sig)):
        d = tmp_path / f"d{i}"
        r = _signal_early([sys.executable, str(FAKE_SNAP), "--dir", str(d), "-i", "1"], sig, delay,
                          env={"FAKE_SNAP_ROWS": "20"})
        _no_traceback(r)
        assert r.returncode == lifecycle.code_of(sig), (delay, r.stderr)
        names = [p.name for p in _files(d)] if d.exists() else []
        assert not [n for n in names if n.startswith("pstate-snap-") or ".tmp." in n], names


@pytest.mark.parametrize("sig", SIGNALS)
def test_doctor(sig):
    for delay in _moments(50 + sig)[:3]:
        r = _signal_early(pstate_cmd("doctor", "--no-live"), sig, delay)
        _no_traceback(r)
        assert r.returncode in (lifecycle.code_of(sig), 0, ExitCode.NOPERM, ExitCode.UNAVAILABLE), r.stderr


@pytest.mark.bpf
@pytest.mark.parametrize("sig", SIGNALS)
def test_record_to_a_file(sig, tmp_path):
    """record ends normally on Ctrl-C and SIGTERM (0); signalled while it
    starts, its -o FILE is not there, or is a whole recording."""
    for i, delay in enumerate(_moments(60 + sig)):
        out = tmp_path / f"rec{i}.jsonl"
        r = _signal_early(pstate_cmd("record", "-q", "-p", str(os.getpid()), "-o", str(out)), sig, delay)
        _no_traceback(r)
        assert r.returncode == 0, (delay, r.stderr)
        _recording_whole(out)


@pytest.mark.bpf
def test_record_to_a_pipe_at_once():
    """Signalled at once, record writes nothing, or a whole stream."""
    for sig in SIGNALS:
        r = _signal_early(pstate_cmd("record", "-q", "-p", str(os.getpid())), sig, 0.0)
        _no_traceback(r)
        assert r.returncode == 0, r.stderr
        recs = [orjson.loads(x) for x in r.stdout.splitlines()]
        assert not recs or (recs[0]["type"] == "meta" and recs[-1]["type"] == "end")

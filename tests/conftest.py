"""Shared test set-up.

Tests marked `bpf` need root and a working bcc/tracefs/kernel-header set-up.
Locally they are skipped when that is missing; in CI (CI=true) a missing set-up
fails them instead, so BPF tests can never pass by silently not running.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest
from hypothesis import settings

ROOT = Path(__file__).resolve().parent.parent
# this directory: data/ and golden/ are found from here, wherever a test module is
TESTS = ROOT / "tests"

# Test modules import helpers from each other (import test_stats) across the
# directories they are kept in: each such directory is on the path before any
# module is collected, whichever comes first.
for _d in sorted(TESTS.iterdir()):
    if _d.is_dir() and next(_d.glob("test_*.py"), None) is not None and str(_d) not in sys.path:
        sys.path.insert(0, str(_d))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The gates are deterministic: a property test draws the same examples on
# every run. HYPOTHESIS_PROFILE=explore draws new ones each time (what it
# finds becomes an example of its own).
settings.register_profile("gate", derandomize=True, database=None)
settings.register_profile("explore")
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))


@functools.lru_cache(maxsize=None)
def bpf_unavailable() -> str | None:
    """Why BPF tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "not root"
    try:
        from pstate.kernel import loader

        loader.import_bcc()
        loader.ensure_tracefs()
        loader.find_headers(None)
    except Exception as e:  # PstateError carries the reason
        return f"BPF set-up incomplete: {e}"
    return None


@pytest.fixture
def root_cache(tmp_path, monkeypatch):
    """A program cache of the test's own (root-owned, 0755), in use."""
    base = tmp_path / "pc"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    d = str(base / "programs")
    monkeypatch.setenv("PSTATE_CACHE_DIR", d)
    monkeypatch.delenv("PSTATE_NO_CACHE", raising=False)
    return d


def cache_entries(directory) -> list[str]:
    """The files in a program cache directory (its btf/ directory holds what
    the cache keeps of the kernel's BTF, no program)."""
    return sorted(n for n in os.listdir(directory) if os.path.isfile(os.path.join(directory, n)))


def pytest_runtest_setup(item):
    if item.get_closest_marker("bpf") is not None:
        why = bpf_unavailable()
        if why:
            if IN_CI:
                pytest.fail(f"BPF test cannot run in CI: {why}", pytrace=False)
            pytest.skip(why)


# One test may take this long (seconds; a test may ask for more with
# @pytest.mark.time_limit(N)). Past it the test fails with its stack, and the
# run goes on: a hang costs one test, not the whole CI run. If the main thread
# cannot take the signal, every thread's stack is dumped a minute later and
# the run ends.
TIME_LIMIT = float(os.environ.get("PSTATE_TEST_TIME_LIMIT", "300"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    mark = item.get_closest_marker("time_limit")
    limit = float(mark.args[0]) if mark else TIME_LIMIT

    def over(_signum, _frame):
        pytest.fail(f"over the time limit of {limit:g} s", pytrace=True)

    old = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, limit)
    faulthandler.dump_traceback_later(limit + 60, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, old)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if IN_CI:
        skipped = [r for r in terminalreporter.stats.get("skipped", []) if "bpf" in getattr(r, "keywords", {})]
        if skipped:
            terminalreporter.write_line(f"ERROR: {len(skipped)} BPF tests were skipped in CI", red=True)


def pstate_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pstate", *args]


def clean_env() -> dict:
    """The environment for subprocess runs: no PYTHONUNBUFFERED (it hides
    buffering bugs, e.g. with closed pipes)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return env


def until(what: str, proc, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout} s")
        time.sleep(0.002)


def caught_signals(pid: int) -> set[int]:
    """The signals a process has a handler for (/proc/PID/status SigCgt)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
    except (OSError, StopIteration):
        return set()
    return {n + 1 for n in range(64) if mask >> n & 1}


def wait_ready(proc, timeout: float = 30) -> None:
    """Until pstate's signal helper is installed (pstate.lifecycle: SIGINT,
    SIGTERM and SIGHUP caught): from then on every signal gets the documented
    exit status. (Before, for the few milliseconds the interpreter takes to
    start, the kernel's default action applies.)"""
    want = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    until("pstate's signal handlers were installed", proc, lambda: want <= caught_signals(proc.pid), timeout)


def wait_delivered(proc, signum: int, timeout: float = 30) -> None:
    """Until a signal sent to the process is no longer pending (the kernel
    delivered it: another of the same number is then one more, not merged)."""
    def delivered() -> bool:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                masks = [int(line.split()[1], 16) for line in f if line.startswith(("SigPnd:", "ShdPnd:"))]
        except OSError:
            return True
        return not any(m >> (signum - 1) & 1 for m in masks)
    until(f"signal {signum} was delivered", proc, delivered, timeout)


def wait_reading_pipe(proc, timeout: float = 30) -> None:
    """Until the process sleeps in a read of an empty pipe (it took what
    was written and waits for more)."""
    def reading() -> bool:
        try:
            with open(f"/proc/{proc.pid}/wchan") as f:
                return "pipe_read" in f.read()
        except OSError:
            return False
    until("it waited on its input pipe", proc, reading, timeout)


def bpf_prog_ids() -> set[int]:
    """IDs of loaded BPF programs (bpftool), to check that pstate leaves none."""
    out = subprocess.run(["bpftool", "-j", "prog", "list"], capture_output=True, text=True, check=True).stdout
    import json

    return {p["id"] for p in json.loads(out or "[]")}


def fdinfos(pid: int | str = "*"):
    """(pid, fdinfo text) of every open fd of one process, or of all of them."""
    pids = [str(pid)] if pid != "*" else [p for p in os.listdir("/proc") if p.isdigit()]
    for p in pids:
        try:
            fds = os.listdir(f"/proc/{p}/fdinfo")
        except OSError:
            continue
        for fd in fds:
            try:
                with open(f"/proc/{p}/fdinfo/{fd}") as f:
                    yield int(p), f.read()
            except OSError:
                continue


@pytest.fixture
def pstate():
    """Run `python -m pstate ARGS` and return the CompletedProcess."""

    def run(*args, input=None, timeout=120, check=False):
        return subprocess.run(pstate_cmd(*args), input=input, capture_output=True, timeout=timeout,
                              env=clean_env(), check=check)

    return run


PID_MAX_PATH = "/proc/sys/kernel/pid_max"


def highest_tid() -> int:
    top = 0
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                top = max(top, *(int(t) for t in os.listdir(f"/proc/{p}/task")))
            except (OSError, ValueError):
                top = max(top, int(p))
    return top


@pytest.fixture
def tid_array_rows():
    """--max-tasks for which record and snap keep per-thread rows in an
    array indexed by tid (pid_max must not exceed it). Where pid_max is
    larger (systemd sets 4194304), it is lowered for the test, above every
    tid in use, and restored afterwards, so the array path is tested on
    every machine."""
    with open(PID_MAX_PATH) as f:
        old = int(f.read())
    if old <= 65536:
        yield 65536
        return
    rows = 1 << max(16, (highest_tid() + 4096).bit_length())
    if rows >= old:
        pytest.fail(f"tids in use up to {highest_tid()}: no array size below pid_max {old}")
    with open(PID_MAX_PATH, "w") as f:
        f.write(str(rows))
    try:
        yield rows
    finally:
        with open(PID_MAX_PATH, "w") as f:
            f.write(str(old))


# ru_maxrss survives exec (and vfork shares the parent's memory until then): a
# reader started straight from pytest would report pytest's own peak. A small
# launcher in between starts it from a small image and reports the reader's.
_MAXRSS_LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.argv[2], sys.argv[2:])\n"
    "_, status, ru = os.wait4(pid, 0)\n"
    "with open(sys.argv[1], 'w') as f:\n"
    "    f.write(str(ru.ru_maxrss))\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def run_measured(argv: list[str], stdin=subprocess.DEVNULL, timeout: float = 60) -> tuple[int, bytes, str, int]:
    """Run argv in a process of its own: (exit code, stdout, stderr, peak
    RSS in KiB); the test fails if it does not finish within timeout."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as rss:
        proc = subprocess.Popen([sys.executable, "-c", _MAXRSS_LAUNCHER, rss.name, *argv], stdin=stdin,
                                stdout=out, stderr=err, env=clean_env())
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"{argv} did not finish within {timeout} s")
        out.seek(0)
        err.seek(0)
        return proc.returncode, out.read(), err.read().decode("utf-8", "replace"), int(rss.read() or 0)


def state_record(**kw) -> dict:
    """A valid state record (a switch-out into S), with kw's fields instead."""
    r = {"type": "state", "ts": 1000, "cpu": 0, "pid": 10, "tid": 11, "comm": "w", "from": "running",
         "to": "sleeping", "dur_ns": 500, "cause": "switch_out", "voluntary": True, "kstate": "S"}
    r.update(kw)
    return r


def jsonl(*recs) -> bytes:
    """The lines of records (dicts, or bytes written as they are)."""
    return b"".join((r if isinstance(r, bytes) else orjson.dumps(r)) + b"\n" for r in recs)


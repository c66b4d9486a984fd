"""`pstate heat --live` in a real terminal: tmux runs a shell, the shell runs
the dashboard reading a fifo, the test writes events into the fifo and reads
the screen with capture-pane. Skipped without tmux, except in CI (CI=true),
where a missing tmux fails the test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest
from conftest import ROOT

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
TMUX = shutil.which("tmux")
PROMPT = "READY$ "


class Pane:
    def __init__(self, tmp: Path):
        self.sock = f"pstate-heat-test-{uuid.uuid4().hex[:8]}"
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp), "LANG": "C.UTF-8",
               "PS1": PROMPT, "PYTHONPATH": str(ROOT / "cli"), "TERM": "xterm-256color"}
        shell = " ".join(f"{k}='{v}'" for k, v in env.items())
        self.tmux("new-session", "-d", "-s", "heat", "-x", "100", "-y", "30",
                  f"env -i {shell} bash --norc --noprofile")
        self.wait_for(lambda s: PROMPT.strip() in s, "the shell prompt")

    def tmux(self, *args) -> str:
        p = subprocess.run([TMUX, "-L", self.sock, "-f", "/dev/null", *args], capture_output=True,
                           text=True, timeout=20)
        assert p.returncode == 0, p.stderr
        return p.stdout

    def capture(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "heat")

    def flags(self) -> str:
        return self.tmux("display", "-p", "-t", "heat", "#{cursor_flag} #{alternate_on}").strip()

    def type(self, text: str) -> None:
        self.tmux("send-keys", "-t", "heat", "-l", text)
        self.tmux("send-keys", "-t", "heat", "Enter")

    def wait_for(self, pred, what: str, timeout: float = 20.0) -> str:
        t0 = time.monotonic()
        screen = ""
        while time.monotonic() - t0 < timeout:
            screen = self.capture()
            if pred(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}; screen:\n{screen}")

    def close(self) -> None:
        subprocess.run([TMUX, "-L", self.sock, "kill-server"], capture_output=True, timeout=20)


@pytest.fixture
def pane(tmp_path):
    if TMUX is None:
        if IN_CI:
            pytest.fail("tmux is required for the live terminal test in CI (apt-get install tmux)",
                        pytrace=False)
        pytest.skip("tmux is not installed")
    p = Pane(tmp_path)
    try:
        yield p
    finally:
        p.close()


class Stream:
    """Writes state records with real monotonic timestamps into a fifo."""

    def __init__(self, path: Path, timeout: float = 20.0):
        t0 = time.monotonic()
        while True:  # no reader yet: ENXIO; the shell opens the fifo when it runs the command
            try:
                self.fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                if time.monotonic() - t0 > timeout:
                    raise
                time.sleep(0.05)
        os.set_blocking(self.fd, True)
        self.since: dict = {}
        self.write({"type": "meta", "schema": 1, "source": "record", "tool": "pstate",
                    "ts": time.monotonic_ns(), "clock": "monotonic"})

    def write(self, rec: dict) -> None:
        os.write(self.fd, orjson.dumps(rec) + b"\n")

    def move(self, tid: int, comm: str, frm: str, to: str) -> None:
        now = time.monotonic_ns()
        prev = self.since.get(tid)
        self.write({"type": "state", "ts": now, "cpu": 0, "pid": tid, "tid": tid, "comm": comm,
                    "from": frm, "to": to, "dur_ns": None if prev is None else now - prev, "cause": "x"})
        self.since[tid] = now

    def busy(self, seconds: float, alpha_runs: bool = True) -> None:
        """alpha runs and gets preempted (unless it is blocked); beta mostly sleeps."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if alpha_runs:
                self.move(11, "alpha", "running", "preempted")
                time.sleep(0.003)
                self.move(11, "alpha", "preempted", "running")
            self.move(22, "beta", "sleeping", "running")
            time.sleep(0.002)
            self.move(22, "beta", "running", "sleeping")
            time.sleep(0.015)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


def row(screen: str, name: str) -> str:
    return next((line for line in screen.splitlines() if line.startswith(name)), "")


def start(pane: Pane, tmp_path: Path) -> Stream:
    fifo = tmp_path / "events"
    os.mkfifo(fifo)
    pane.type(f"{sys.executable} -m pstate heat --live --window 2s --refresh 10 --color never "
              f"< {fifo}; echo EXIT=$?")
    s = Stream(fifo)
    s.move(11, "alpha", "sleeping", "running")
    s.move(22, "beta", "running", "sleeping")
    return s


def wait_restored(pane: Pane) -> str:
    screen = pane.wait_for(lambda s: "EXIT=" in s and s.rstrip().endswith(PROMPT.strip()),
                           "the dashboard to end and the prompt to return")
    assert pane.flags() == "1 0", "cursor hidden or alternate screen still on"
    return screen


def test_map_changes_and_terminal_is_restored_at_end_of_input(pane, tmp_path):
    s = start(pane, tmp_path)
    try:
        s.busy(1.0)
        first = pane.wait_for(lambda sc: "#" in row(sc, "alpha 11"), "alpha running on the map")
        assert pane.flags() == "0 1"  # cursor hidden, alternate screen on
        assert "Live: dominant state per thread" in first
        s.move(11, "alpha", "running", "uninterruptible")  # alpha blocks in D and stays there
        s.busy(1.2, alpha_runs=False)
        second = pane.wait_for(lambda sc: row(sc, "alpha 11").rstrip().endswith("DDDD"),
                               "alpha's D period on the map")
        assert first != second
        assert "D uninterruptible" in second
    finally:
        s.close()  # end of input
    screen = wait_restored(pane)
    assert "EXIT=0" in screen
    assert "input ended (end of input)" in screen  # the last frame stays on the screen
    assert "alpha 11" in screen


@pytest.mark.parametrize("keys", ["C-c", "q"])
def test_ctrl_c_or_q_restores_the_terminal(pane, tmp_path, keys):
    s = start(pane, tmp_path)
    try:
        s.busy(0.8)
        pane.wait_for(lambda sc: "#" in row(sc, "alpha 11"), "alpha running on the map")
        pane.tmux("send-keys", "-t", "heat", keys)
        screen = wait_restored(pane)
    finally:
        s.close()
    assert "EXIT=0" in screen
    assert "input ended (stopped)" in screen
    # the shell still echoes what is typed: the terminal modes are back
    pane.type("echo typed-$((6*7))")
    pane.wait_for(lambda sc: "echo typed-$((6*7))" in sc and "typed-42" in sc, "the shell to echo input")

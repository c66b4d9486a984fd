"""Workloads whose ground truth the tests control, and a way to record them.

A workload is a child Python process that waits for a byte on stdin before it
starts, so `pstate record -p CHILD` can attach first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import orjson

from conftest import clean_env, pstate_cmd

SLEEPER = """
import sys, time
sys.stdin.read(1)
for _ in range({n}):
    time.sleep({secs})
"""

BUSY = """
import sys, time
sys.stdin.read(1)
end = time.monotonic() + {secs}
x = 0
while time.monotonic() < end:
    x += 1
"""

FORK_EXEC = """
import os, sys, time
sys.stdin.read(1)
pid = os.fork()
if pid == 0:
    os.execv("/bin/sleep", ["sleep", "0.1"])
os.waitpid(pid, 0)
time.sleep(0.05)
"""

IDLE_WAIT = """
import sys, time
sys.stdin.read(1)
time.sleep({secs})
"""


def start(code: str, cpu: int | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-c", code]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu)] + cmd
    return subprocess.Popen(cmd, stdin=subprocess.PIPE)


def go(*children: subprocess.Popen) -> None:
    for c in children:
        c.stdin.write(b"g")
        c.stdin.flush()


class Recording:
    """`pstate record ARGS` running in the background, reading its stdout."""

    def __init__(self, *args: str, cpu: int | None = None):
        # Unbuffered: the first line is read here, the rest by communicate(),
        # which would not see bytes left in a read buffer. cpu: pin record
        # there (away from a workload's CPU).
        cmd = pstate_cmd("record", "-q", *args)
        if cpu is not None:
            cmd = ["taskset", "-c", str(cpu)] + cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=clean_env(), bufsize=0)
        first = self.proc.stdout.readline()
        if not first:
            err = self.proc.stderr.read().decode(errors="replace")
            raise RuntimeError(f"pstate record did not start: {err}")
        self.meta = orjson.loads(first)
        self.lines = [first]

    def stop(self, sig=signal.SIGINT, timeout: float = 30) -> list[dict]:
        time.sleep(0.05)  # let the last drain pick up trailing events
        self.proc.send_signal(sig)
        out, err = self.proc.communicate(timeout=timeout)
        self.stderr = err.decode(errors="replace")
        self.returncode = self.proc.returncode
        self.lines += out.splitlines(keepends=True)
        return [orjson.loads(x) for x in self.lines]


def record_workload(code: str, *args: str, cpu: int | None = None, during=None) -> tuple[list[dict], subprocess.Popen]:
    child = start(code, cpu)
    try:
        rec = Recording("-p", str(child.pid), *args)
        go(child)
        if during:
            during(child)
        child.wait(timeout=60)
        return rec.stop(), child
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def record_children(children: list, *args: str, cpu: int | None = None) -> list[dict]:
    """`pstate record ARGS` (pinned to cpu) around children started with
    start(): let them go, wait for them, stop record; kill what is left."""
    try:
        rec = Recording(*args, cpu=cpu)
        go(*children)
        for c in children:
            c.wait(timeout=60)
        return rec.stop()
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()


def states(recs: list[dict], tid: int | None = None) -> list[dict]:
    return [r for r in recs if r["type"] == "state" and (tid is None or r["tid"] == tid)]


def wait_os(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass

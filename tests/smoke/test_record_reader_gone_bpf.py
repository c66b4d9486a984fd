"""record ends when its reader goes, even while it writes nothing (root,
BPF): `record -p IDLE | heat --live` and q in heat, or any reader closing
the pipe, ends record at its next look at the pipe (POLLERR/POLLHUP on its
standard output), not at the next event it would write."""

from __future__ import annotations

import fcntl
import os
import pty
import subprocess
import termios

import orjson
import pytest

import workloads
from conftest import clean_env, pstate_cmd

pytestmark = pytest.mark.bpf


def test_record_of_an_idle_task_ends_when_its_reader_closes_the_pipe():
    idle = workloads.start(workloads.IDLE_WAIT.format(secs=300))  # blocked on stdin: no event for minutes
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(pstate_cmd("record", "-p", str(idle.pid)), stdout=w, stderr=subprocess.PIPE,
                                env=clean_env())
        os.close(w)
        with os.fdopen(r, "rb") as reader:
            meta = orjson.loads(reader.readline())  # record is attached and running
            assert meta["type"] == "meta"
        # the reader is gone; record writes nothing more, yet ends by itself
        assert proc.wait(timeout=60) == 0, proc.stderr.read()
        assert b"Traceback" not in proc.stderr.read()
    finally:
        workloads.kill_all([idle])
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_under_sudo_with_use_pty_record_still_sees_its_reader_go():
    """`sudo pstate record -p IDLE | heat --live` typed in a terminal: with
    sudo's use_pty (Debian's default sudoers) the command runs in a pty of
    sudo's, but a standard stream that is not a terminal (record's output,
    the pipe) is passed through, so record sees heat leave."""
    listed = subprocess.run(["sudo", "-ll"], capture_output=True, text=True, timeout=30)
    assert "use_pty" in listed.stdout, listed.stdout  # the case this test is for
    idle = workloads.start(workloads.IDLE_WAIT.format(secs=300))
    master, slave = pty.openpty()

    def in_the_terminal():  # stdin and stderr on a terminal that is sudo's controlling one
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    proc = None
    try:
        proc = subprocess.Popen(["sudo", "--", *pstate_cmd("record", "-p", str(idle.pid))], stdin=slave,
                                stderr=slave, stdout=subprocess.PIPE, preexec_fn=in_the_terminal)
        os.close(slave)
        meta = orjson.loads(proc.stdout.readline())  # record is attached and running
        assert meta["type"] == "meta"
        proc.stdout.close()  # the reader is gone
        assert proc.wait(timeout=60) == 0
        said = b""
        while True:  # what sudo relayed, to the end (EIO: no process holds the terminal any more)
            try:
                part = os.read(master, 65536)
            except OSError:
                break
            if not part:
                break
            said += part
        assert b"Tracing" in said and b"Traceback" not in said, said  # (its stderr went through sudo's pty)
    finally:
        workloads.kill_all([idle])
        os.close(master)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

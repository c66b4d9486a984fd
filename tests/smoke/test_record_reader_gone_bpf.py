"""record ends when its reader goes, even while it writes nothing (root,
BPF): `record -p IDLE | heat --live` and q in heat, or any reader closing
the pipe, ends record at its next look at the pipe (POLLERR/POLLHUP on its
standard output), not at the next event it would write."""

from __future__ import annotations

import os
import subprocess

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

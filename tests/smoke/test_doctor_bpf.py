"""pstate doctor's live checks against real BPF."""

from __future__ import annotations

import subprocess

import orjson
import pytest

from conftest import clean_env, pstate_cmd
from workloads import SLEEPER, go, start

pytestmark = pytest.mark.bpf


def test_doctor_looks_for_threads_whose_switches_are_not_traced():
    """The live doctor records, for a second, the threads that switched in
    a first look and compares their switch-outs with the kernel's counts: a
    sleeper of ours, switching some 500 times a second, is among them and
    never named."""
    child = start(SLEEPER.format(n=30000, secs=0.001))
    go(child)
    try:
        p = subprocess.run(pstate_cmd("doctor", "--format", "json"), capture_output=True, timeout=180,
                           env=clean_env())
    finally:
        child.kill()
        child.wait()
    assert p.returncode == 0, p.stderr.decode()
    rows = {r["check"]: r for r in orjson.loads(p.stdout)}
    assert rows["compile, attach, events"]["status"] == "ok", rows
    row = rows["unseen switches"]
    detail = row["detail"]
    if row["status"] == "ok":
        assert detail.startswith("every switch of ") and detail.endswith(" busy threads traced (2 s)"), detail
    else:
        assert row["status"] == "warning" and " switched with no switch-out traced in 2 s: " in detail, row
        assert row["fix"].startswith("the kernel traces nothing on a CPU while they run"), row
    assert f"(tid {child.pid}," not in detail, detail

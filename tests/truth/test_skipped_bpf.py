"""Runs of pstate's programs that the kernel skips are reported, never silent.

On the classic tracepoint path the kernel runs no tracepoint program on a
CPU while another BPF program, or a bpf(2) map call of any process, is under
way there (its per-CPU bpf_prog_active): a context switch or wake-up in that
window is lost to pstate. Linux 6.7 and later count each skipped run in the
program's recursion_misses. Here processes call bpf(2) in a loop on both
CPUs while sleepers switch and are woken beside them: the classic path skips
runs and record and snap say how many; the tp_btf path skips none.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import orjson
import pytest

from conftest import clean_env, pstate_cmd
from workloads import SLEEPER, Recording, go, kill_all, record_all, start
from pstate.kernel import bpfsys, btf

# the runs the kernel skipped, read beside bpftool's view of every program: alone
pytestmark = [pytest.mark.bpf, pytest.mark.kernel, pytest.mark.serial]

needs_btf = pytest.mark.skipif(not os.path.exists(btf.VMLINUX), reason="the kernel has no BTF")

# bpf(2) map lookups in a loop, for `secs` after the go byte
MAP_CALLS = """
import ctypes as ct, sys, time
from pstate.kernel import bpfsys
fd = bpfsys.map_create(bpfsys.MAP_HASH, 4, 8, 16, 0, "pstate_test")
k, v = ct.c_uint32(0), ct.c_uint64(0)
bpfsys.MapCalls.bpf_update_elem(fd, ct.byref(k), ct.byref(v), 0)
sys.stdin.read(1)
end = time.monotonic() + {secs}
look = bpfsys.MapCalls.bpf_lookup_elem
while time.monotonic() < end:
    for _ in range(500):
        look(fd, ct.byref(k), ct.byref(v))
"""


def _beside_map_calls(secs: float) -> list:
    """A map-calling process and a 0.5 ms sleeper on each CPU."""
    return [start(code, cpu=cpu) for cpu in (0, 1)
            for code in (MAP_CALLS.format(secs=secs), SLEEPER.format(n=int(secs / 0.0005), secs=0.0005))]


def _record(probes: str) -> tuple[list[dict], Recording]:
    return record_all(_beside_map_calls(3), "--probes", probes)


def test_prog_info_reads_what_bpftool_reads():
    """bpfsys.prog_info: the offsets of struct bpf_prog_info, against bpftool."""
    from pstate.kernel import loader
    from pstate.kernel import recordprog

    prog = loader.Program("record", recordprog.defines_for(loader.kernel_states(), max_tasks=4096, rb_pages=64,
                                                        sample=False))
    try:
        with open("/proc/sys/kernel/bpf_stats_enabled", "r+") as f:
            was = f.read().strip()
            f.seek(0)
            f.write("1")
        try:
            time.sleep(0.3)
        finally:
            with open("/proc/sys/kernel/bpf_stats_enabled", "w") as f:
                f.write(was)
        infos = [bpfsys.prog_info(fd) for fd in prog.prog_fds()]
        shown = {p["id"]: p for p in json.loads(subprocess.run(["bpftool", "prog", "show", "-j"], check=True,
                                                                capture_output=True).stdout)}
        assert infos and sum(i["run_cnt"] for i in infos) > 0
        for i in infos:
            p = shown[i["id"]]
            assert i["name"] and i["name"] in p["name"]  # bpftool may show the longer name of the BTF
            assert p.get("run_cnt", 0) == i["run_cnt"] and p.get("run_time_ns", 0) == i["run_time_ns"]
            assert p.get("recursion_misses", 0) == i["recursion_misses"]
    finally:
        prog.close()


def test_classic_path_reports_the_runs_the_kernel_skipped():
    recs, rec = _record("tracepoint")
    end = recs[-1]
    assert rec.returncode == 0 and end["type"] == "end", rec.stderr
    assert end["lost_skipped"] > 0, end
    told = sum(r["count"] for r in recs if r["type"] == "loss" and r["reason"] == "skipped")
    assert told == end["lost_skipped"]
    assert end["lost"] == sum(v for k, v in end.items() if k.startswith("lost_"))
    assert "the kernel skipped" in rec.stderr and "--probes tp_btf avoids it" in rec.stderr


@needs_btf
def test_tp_btf_path_skips_no_run():
    recs, rec = _record("tp_btf")
    end = recs[-1]
    assert rec.returncode == 0 and end["type"] == "end", rec.stderr
    assert end["lost_skipped"] == 0 and not [r for r in recs if r["type"] == "loss"], end


def test_snap_says_how_many_runs_were_skipped(tmp_path):
    children = _beside_map_calls(3)
    try:
        go(*children)
        r = subprocess.run(pstate_cmd("snap", "--probes", "tracepoint", "--dir", str(tmp_path), "-i", "2"),
                           capture_output=True, text=True, timeout=60, env=clean_env())
        assert r.returncode == 0, r.stderr
    finally:
        kill_all(children)
    (f,) = tmp_path.glob("pstate-snap-*.jsonl")
    meta = orjson.loads(f.read_bytes().splitlines()[0])
    assert meta["type"] == "meta" and meta["skipped"] > 0, meta

"""Following processes in the kernel: record -- CMD (its descendants by
sched_process_fork; stops when CMD exits, exits with its status), -p PID
--children, --cgroup PATH (that cgroup and below), and pids of another pid
namespace."""

from __future__ import annotations

import subprocess
import time

import orjson
import pytest

from conftest import clean_env, pstate_cmd
from workloads import BUSY, FORK_EXEC, SLEEPER, V2Cgroups, kill_all, record_all, record_workload, start

pytestmark = pytest.mark.bpf


def record_cmd(tmp_path, *args, timeout=120):
    out = tmp_path / "rec.jsonl"
    p = subprocess.run(pstate_cmd("record", "-q", "-o", str(out), *args), capture_output=True, timeout=timeout,
                       env=clean_env())
    recs = [orjson.loads(x) for x in out.read_bytes().splitlines()] if out.exists() else []
    return p, recs


def _pids(recs, types=("state", "fork", "exec", "exit")) -> set:
    return {r["pid"] for r in recs if r["type"] in types}


def test_a_command_and_every_process_it_starts_and_nothing_else(tmp_path):
    p, recs = record_cmd(tmp_path, "--", "sh", "-c", "sleep 0.2; (sleep 0.1 &); wait")
    assert p.returncode == 0, p.stderr
    assert recs[-1]["type"] == "end" and recs[-1]["reason"] == "exit"
    execs = [r for r in recs if r["type"] == "exec"]
    shell = next(r["pid"] for r in execs if r["comm"] == "sh")
    assert recs[0]["filter_command"] == ["sh", "-c", "sleep 0.2; (sleep 0.1 &); wait"]
    assert recs[0]["command_pid"] == shell
    forks = [r for r in recs if r["type"] == "fork" and not r["thread"]]
    kids = {r["child_pid"] for r in forks}
    # the shell forks the first sleep and the subshell, the subshell the second sleep
    assert len(kids) == 3, forks
    assert _pids(recs) == {shell} | kids
    assert [r["comm"] for r in execs if r["pid"] in kids].count("sleep") >= 1
    by_parent = {}
    for r in forks:
        by_parent.setdefault(r["pid"], set()).add(r["child_pid"])
    assert len(by_parent[shell]) == 2 and any(len(v) == 1 for k, v in by_parent.items() if k != shell)
    procs = {r["pid"] for r in recs if r["type"] == "process"}
    assert shell in procs


def test_record_exits_with_the_command_s_status(tmp_path):
    p, recs = record_cmd(tmp_path, "--", "sh", "-c", "sleep 0.05; exit 3")
    assert p.returncode == 3, p.stderr
    assert recs[-1]["reason"] == "exit"
    p, _recs = record_cmd(tmp_path, "--", "sh", "-c", "kill -TERM $$")
    assert p.returncode == 128 + 15


# A command that switches often (400 short processes forked, run and reaped) recorded into a one-page
# ring buffer drained once a second: events are lost, by the kernel's own count (the end record's lost).
FLOOD = "i=0; while [ $i -lt 400 ]; do /bin/true; i=$((i + 1)); done"
TINY_RING = ("--buffer-size", "4k", "--drain-interval", "1s")


def test_strict_exits_3_when_the_command_exits_0_but_events_were_lost(tmp_path):
    p, recs = record_cmd(tmp_path, "--strict", *TINY_RING, "--", "sh", "-c", FLOOD)
    end = recs[-1]
    assert end["type"] == "end" and end["reason"] == "exit"
    assert end["lost"] > 0, end
    assert sum(r["count"] for r in recs if r["type"] == "loss") == end["lost"]
    assert p.returncode == 3, p.stderr
    # without --strict, the loss is reported and the command's 0 stands
    p, recs = record_cmd(tmp_path, *TINY_RING, "--", "sh", "-c", FLOOD)
    assert recs[-1]["lost"] > 0 and p.returncode == 0, p.stderr
    # a command that fails keeps its own status, loss or not
    p, recs = record_cmd(tmp_path, "--strict", *TINY_RING, "--", "sh", "-c", FLOOD + "; exit 5")
    assert recs[-1]["lost"] > 0 and p.returncode == 5, p.stderr


def test_a_command_not_found_is_a_usage_error(tmp_path):
    p, recs = record_cmd(tmp_path, "--", "no-such-command-pstate")
    assert p.returncode == 2 and recs == []
    assert b"no-such-command-pstate: command not found" in p.stderr


def test_children_picks_up_a_child_forked_after_the_start():
    recs, child = record_workload(FORK_EXEC, "--children")
    assert recs[0]["filter_children"] is True and recs[0]["filter_pid"] == [child.pid]
    forks = [r for r in recs if r["type"] == "fork" and r["pid"] == child.pid and not r["thread"]]
    assert len(forks) == 1
    kid = forks[0]["child_pid"]
    assert any(r["type"] == "exec" and r["pid"] == kid and r["comm"] == "sleep" for r in recs)
    assert any(r["type"] == "state" and r["pid"] == kid and r["to"] == "sleeping" for r in recs)
    assert _pids(recs) == {child.pid, kid}


def test_without_children_the_child_is_not_recorded():
    recs, child = record_workload(FORK_EXEC)
    assert _pids(recs) == {child.pid}


def test_a_task_in_another_pid_namespace_shows_both_pids(tmp_path):
    # alive long enough to be read from /proc (a busy machine reads it late;
    # one gone first is written as gone, with no pids to show)
    p, recs = record_cmd(tmp_path, "--", "unshare", "-p", "--fork", "sh", "-c", "sleep 1")
    assert p.returncode == 0, p.stderr
    inner = [r for r in recs if r["type"] == "process" and r.get("ns_pid") == 1]
    assert inner and all(r["pid"] != 1 for r in inner)
    assert any(r["type"] == "state" and r["pid"] == inner[0]["pid"] for r in recs)


def test_cgroup_records_only_the_processes_of_that_cgroup():
    with V2Cgroups("hog.service", "sleeper.service") as cg:
        hog, sleeper = start(BUSY.format(secs=0.4)), start(SLEEPER.format(n=4, secs=0.1))
        try:
            cg.move(hog.pid, cg.top + "/hog.service")
            cg.move(sleeper.pid, cg.top + "/sleeper.service")
        except BaseException:
            kill_all([hog, sleeper])
            raise
        recs, rec = record_all([hog, sleeper], "--cgroup", cg.top + "/hog.service", by_pid=False)
    assert rec.returncode == 0, rec.stderr
    assert _pids(recs) == {hog.pid}
    assert recs[0]["filter_cgroup"] == [cg.top + "/hog.service"]
    # its 0.4 s loop, on a CPU or waiting for one (a loaded machine gives it little of a CPU)
    busy = ("running", "runnable", "preempted")
    assert sum(r["dur_ns"] or 0 for r in recs if r["type"] == "state" and r["from"] in busy) >= 0.39e9


def test_a_cgroup_that_does_not_exist_is_a_usage_error(tmp_path):
    p, recs = record_cmd(tmp_path, "--cgroup", "/no/such/pstate-cgroup", "-d", "1")
    assert p.returncode == 2 and b"no cgroup /no/such/pstate-cgroup" in p.stderr

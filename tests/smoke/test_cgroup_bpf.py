"""The cgroup of every state record, from a real recording: a process moved
to another cgroup v2 after its process record was written carries the new
id from its first transition after the move (on the tp_btf path every
transition; on the classic one its switch-outs, the rest null), and the new
id is named by a cgroup record before the first record carrying it."""

from __future__ import annotations

import time

import orjson
import pytest
from click.testing import CliRunner

from pstate.main import cli
from workloads import SLEEPER, V2Cgroups, record_all, start, untraced_runs

pytestmark = pytest.mark.bpf

BEFORE, AFTER = "cgid-a.service", "cgid-b.service"


@pytest.fixture(scope="module")
def moved():
    """A sleeper (10 ms sleeps) recorded with -p, moved from BEFORE to AFTER
    by cgroup.procs half-way, 0.4 s after its start (its process record and
    second look are written by then); (records, ids, the move's CLOCK_MONOTONIC
    bounds, its pid)."""
    with V2Cgroups(BEFORE, AFTER) as cg:
        a, b = cg.top + "/" + BEFORE, cg.top + "/" + AFTER
        ids = {"a": cg.id_of(a), "b": cg.id_of(b)}
        bounds = []

        def move(child):
            time.sleep(0.4)
            bounds.append(time.monotonic_ns())
            cg.move(child.pid, b)
            bounds.append(time.monotonic_ns())

        child = start(SLEEPER.format(n=80, secs=0.01))
        try:
            cg.move(child.pid, a)
        except BaseException:
            child.kill()
            child.wait()
            raise
        recs = _record(child, move)
        yield recs, ids, tuple(bounds), child.pid, cg.top


def _record(child, during) -> list[dict]:
    """record -p the child from its go to its end, during(child) meanwhile."""
    return record_all([child], during=during)[0]


def test_state_records_carry_the_cgroup_the_task_is_in(moved):
    recs, ids, (t0, t1), pid, _top = moved
    tp_btf = recs[0]["probes"] == "tp_btf"
    mine = [r for r in recs if r["type"] == "state" and r["pid"] == pid and r["cause"] != "reap"]
    before = [r for r in mine if r["ts"] < t0]
    after = [r for r in mine if r["ts"] > t1]
    assert len(before) > 40 and len(after) > 40, (len(before), len(after))
    for part, want in ((before, ids["a"]), (after, ids["b"])):
        for r in part:
            exact = tp_btf or r["cause"] == "switch_out"  # the running task's, on either path
            assert r["cgroup"] == (want if exact else None), (r, want)
    # a process record said the old cgroup; none of it was read again after the move
    procs = [r for r in recs if r["type"] == "process" and r["pid"] == pid]
    assert procs and all(p["cgroup"] == ids["a"] for p in procs if p["ts"] < t0)


def test_each_cgroup_id_is_named_before_the_first_record_carrying_it(moved):
    recs, ids, _bounds, _pid, top = moved
    first = {}
    for i, r in enumerate(recs):
        cg = r.get("cgroup") if r["type"] in ("state", "process") else None
        if cg is not None:
            first.setdefault(cg, i)
    named = {}
    for i, r in enumerate(recs):
        if r["type"] == "cgroup":
            assert r["cgroup"] not in named, r  # once
            named[r["cgroup"]] = (i, r["path"])
    for cg, i in first.items():
        assert cg in named and named[cg][0] < i, cg
    assert named[ids["a"]][1] == f"{top}/{BEFORE}" and named[ids["b"]][1] == f"{top}/{AFTER}"


def test_stats_by_cgroup_splits_the_time_at_the_move(moved, tmp_path):
    """tp_btf: the time up to the move goes to the old cgroup, the time after
    it to the new one, within one interval of the move (the sleeper's longest,
    as the kernel's timestamps give it); tracepoint: as documented, the new
    cgroup gets the intervals its switch-outs end (on-CPU time), the rest
    goes by the process record (the old one)."""
    recs, ids, (t0, t1), pid, top = moved
    path = tmp_path / "moved.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    r = CliRunner().invoke(cli, ["stats", "-f", "json", "--by", "cgroup", str(path)], prog_name="pstate")
    assert r.exit_code == 0, r.output
    report = orjson.loads(r.stdout)
    groups = {g["key"]: {s: v["ns"] for s, v in g["states"].items()} for g in report["groups"]}
    a, b = groups[f"{top}/{BEFORE}"], groups[f"{top}/{AFTER}"]
    assert set(groups) == {f"{top}/{BEFORE}", f"{top}/{AFTER}"}
    mine = [x for x in recs if x["type"] == "state" and x["pid"] == pid]
    first, last = mine[0]["ts"] - (mine[0]["dur_ns"] or 0), mine[-1]["ts"]  # (the first interval's start)
    margin = max(x["dur_ns"] or 0 for x in mine[1:]) + 1_000_000
    # stats gives no state the time a switch-out closes whose switch-in this
    # VM did not trace (workloads.untraced_runs)
    unknown = untraced_runs(mine)
    assert len(unknown) <= 2, unknown
    margin += sum(unknown)
    if recs[0]["probes"] == "tp_btf":
        assert abs(sum(a.values()) - (t0 - first)) <= margin + (t1 - t0), (a, t0 - first, margin)
        # after the move: up to its last record, and at most to the window's end (the time a task
        # that exited spends dead or a zombie until the recording ends, longer on a loaded machine)
        end = report["window"]["end_ts"]
        slack = margin + (t1 - t0)
        assert last - t1 - slack <= sum(b.values()) <= end - t1 + slack, (b, last - t1, end - t1, margin)
        assert b.get("sleeping", 0) > b.get("running", 0)  # a sleeper, wherever it is
    else:
        # (zombie: the time after its last switch-out, when its reap came after the recording)
        assert set(b) <= {"running", "zombie", "dead"} and a.get("sleeping", 0) > 0.5 * (last - first), (a, b)

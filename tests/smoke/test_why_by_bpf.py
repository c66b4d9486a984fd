"""Every --by key with every why view on a real recording (root, BPF) of
services whose truth the test sets up: three processes, each in a cgroup of
its own (a unit each): db.service writes with O_DIRECT and fsyncs (D time in
the I/O path, ended by interrupts), pp.service ping-pongs between two
threads (each the other's waker), hog.service spins on the ping-pong's CPU
(an antagonist of it). The combinations are generated from stats' tables of
keys and views (none can be skipped); each group must hold the tasks its key
says, with the sum of their figures, and the services their known causes."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson
import pytest
from click.testing import CliRunner

import workloads
from pstate.analysis import timeinstate
from pstate.commands.stats import WHY_VIEWS
from pstate.kernel.identity import role_of
from pstate.main import cli
from test_stacks_bpf import DIRECT_WRITES, IO_FRAMES
from test_why_bpf import PING_PONG

# three services pinned to CPUs: alone
pytestmark = [pytest.mark.bpf, pytest.mark.serial]

UNITS = ("db.service", "pp.service", "hog.service")
COMBINATIONS = [(by, view) for by in timeinstate.BY_KEYS for view in WHY_VIEWS]


def _script(tmp, name: str, code: str) -> str:
    """The workload as a file (its title: python PATH), seen alive by record
    first: it sleeps 0.3 s after the go, before its work (record reads a
    process when the stream first meets it; one gone by then is "(gone)")."""
    path = tmp / f"{name}.py"
    head, sep, rest = code.partition("sys.stdin.read(1)\n")
    assert sep
    path.write_text(head + sep + "import time as _t\n_t.sleep(0.3)\n" + rest)
    return str(path)


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """The three services recorded with --stacks, in their cgroups:
    (path of the recording, {unit: pid}, {pid: title}, {pid: tids}, top cgroup)."""
    tmp = tmp_path_factory.mktemp("services")
    disk = f"/var/tmp/pstate-why-by-{os.getpid()}.bin"
    codes = {"db.service": DIRECT_WRITES.format(path=disk, n=20_000, between="os.fsync(fd) if i % 4 == 0 else None",
                                                blocked=60),
             "pp.service": PING_PONG.format(n=3000),
             "hog.service": workloads.BUSY.format(secs=1.0)}
    cpus = {"db.service": 0, "pp.service": 1, "hog.service": 1}
    with workloads.V2Cgroups(*UNITS) as cg:
        children, pids = [], {}
        try:
            for unit in UNITS:
                path = _script(tmp, unit.split(".")[0], codes[unit])
                c = subprocess.Popen(["taskset", "-c", str(cpus[unit]), sys.executable, path],
                                     stdin=subprocess.PIPE)
                children.append(c)
                pids[unit] = c.pid
            for unit, c in zip(UNITS, children):
                workloads.wait_exec(c.pid, sys.executable)
                cg.move(c.pid, cg.top + "/" + unit)
            titles = {c.pid: workloads.title_of(c.pid) for c in children}
            recs, _rec = workloads.record_all(children, "--stacks", "--cgroup", cg.top, by_pid=False)
        finally:
            workloads.kill_all(children)
            if os.path.exists(disk):
                os.unlink(disk)
        out = tmp / "rec.jsonl"
        out.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
        tids: dict = {}
        for r in recs:
            if r["type"] == "state":
                tids.setdefault(r["pid"], set()).add(r["tid"])
        yield str(out), pids, titles, tids, cg.top


def stats(path: str, *args: str) -> str:
    res = CliRunner().invoke(cli, ["stats", path, "--top", "1000", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    return res.stdout


def report(path: str, *args: str) -> dict:
    return {g["key"]: g for g in orjson.loads(stats(path, "-f", "json", *args))["groups"]}


def truth(by: str, services) -> dict:
    """group key -> the pids (by tid: the tids) in it, as the set-up says."""
    _path, pids, titles, tids, top = services
    out: dict = {}
    for unit, pid in pids.items():
        comm = os.path.basename(sys.executable)[:15]
        keys = {"pid": [pid], "tid": sorted(tids[pid]), "comm": [comm], "all": ["all"],
                "cgroup": [f"{top}/{unit}"], "unit": [unit], "container": ["host"],
                "title": [role_of(titles[pid])], "ppid": [os.getpid()]}[by]
        for k in keys:
            out.setdefault(k, set()).add(k if by == "tid" else pid)
    return out


def _merge(per: dict, members, field: str, name: str, value: str) -> dict:
    out: dict = {}
    for m in members:
        for item in per[m].get(field, []):
            out[item[name]] = out.get(item[name], 0) + item[value]
    return out


@pytest.mark.parametrize("by,view", COMBINATIONS, ids=[f"{b}-{v}" for b, v in COMBINATIONS])
def test_every_key_with_every_view(services, by, view):
    path, pids, _titles, tids, _top = services
    want = truth(by, services)
    base = "tid" if by == "tid" else "pid"
    per = report(path, "--by", base, "--stacks", "--wakers", "--antagonists")
    if view == "folded":
        got: dict = {}
        for line in stats(path, "--by", by, "-f", "folded").splitlines():
            label, state = line.rpartition(" ")[0].split(";")[:2]
            got[(label, state)] = got.get((label, state), 0) + int(line.rpartition(" ")[2])
        blocked = {}
        for key, members in want.items():
            label = None if by in ("pid", "tid") else str(key)
            for m in members:
                for s in per[m].get("stacks", []):
                    k = (label or f"{per[m]['comm']}-{m}", s["state"])
                    blocked[k] = blocked.get(k, 0) + s["total_ns"]
        assert {k for k, ns in blocked.items() if ns >= 1000} <= set(got)
        for k, us in got.items():
            assert abs(us * 1000 - blocked[k]) <= 0.001 * blocked[k] + 1000 * len(want), (k, us, blocked[k])
        return
    got = report(path, "--by", by, *WHY_VIEWS[view])
    assert set(got) == set(want)
    for key, members in want.items():
        g = got[key]
        if view == "stacks":
            assert g["blocked_ns"] == sum(per[m]["blocked_ns"] for m in members)
        elif view == "wakers":
            assert {w["name"]: w["count"] for w in g["wakers"]} == _merge(per, members, "wakers", "name", "count")
        else:
            assert g["runq_ns"] == sum(per[m]["runq_ns"] for m in members)
            assert {a["name"]: a["ns"] for a in g["antagonists"]} == _merge(per, members, "antagonists", "name", "ns")


def test_each_service_s_causes_by_unit(services):
    path, pids, _titles, tids, _top = services
    g = report(path, "--by", "unit", "--stacks=D", "--wakers", "--antagonists")
    db, pp, hog = (g[u] for u in UNITS)
    io = sum(s["total_ns"] for s in db["stacks"] if any(f in s["frames"] for f in IO_FRAMES + ("flush",)))
    assert db["blocked_ns"] > 0 and io >= 0.9 * db["blocked_ns"], db["stacks"]
    pp_tids = tids[pids["pp.service"]]
    by_tid = {w["tid"]: w for w in pp["wakers"] if w["kind"] == "task"}
    # the ping-pong's threads end each other's sleeps: the bulk of the service's blocked time ended
    assert set(by_tid) >= pp_tids and all(by_tid[t]["group"] == "pp.service" for t in pp_tids)
    assert sum(by_tid[t]["count"] for t in pp_tids) >= 0.9 * pp["wakers_total"]["count"]
    # the hog held the ping-pong's CPU while it waited, and the other way round
    assert any(a["tid"] == pids["hog.service"] and a["group"] == "hog.service" for a in pp["antagonists"])
    assert any(a["group"] == "pp.service" for a in hog["antagonists"])


@pytest.mark.parametrize("view", list(WHY_VIEWS))
def test_stats_p_selects_after_attributing(services, view):
    # stats -p X of the recording: X's figures as attributing everything gives them, wakers' names included
    path, pids, _titles, _tids, _top = services
    pp = pids["pp.service"]
    if view == "folded":
        whole = [x for x in stats(path, "-f", "folded").splitlines() if x.split(";")[0].endswith(f"-{pp}")]
        assert stats(path, "-f", "folded", "-p", str(pp)).splitlines() == whole
        return
    whole = report(path, *WHY_VIEWS[view])
    got = report(path, *WHY_VIEWS[view], "-p", str(pp))
    assert set(got) == {pp} and got[pp] == whole[pp]
    if view == "antagonists":
        assert any(a["tid"] == pids["hog.service"] for a in got[pp]["antagonists"])

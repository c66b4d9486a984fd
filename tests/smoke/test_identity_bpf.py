"""Process and cgroup records from a real recording, with real cgroup v2
directories: who each task is, which cgroup, unit and container its time
goes to, and titles rewritten after start told apart."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from pstate.main import cli
from pstate.snapshots import snapdir

import workloads
from workloads import BUSY, SLEEPER, V2Cgroups, go, kill_all, record_all, start, start_titled

pytestmark = pytest.mark.bpf

DOCKER_ID = "0123456789ab" + "cdef" * 13
SERVICE = "test.slice/pstate-test.service"
SCOPE = f"system.slice/docker-{DOCKER_ID}.scope"


def _stats(path, *args) -> dict:
    r = CliRunner().invoke(cli, ["stats", "-f", "json", *args, str(path)], prog_name="pstate")
    assert r.exit_code == 0, r.output
    return orjson.loads(r.stdout)


@pytest.fixture(scope="module")
def hog_and_sleeper(tmp_path_factory):
    """A CPU hog in test.slice/pstate-test.service and a sleeper in a
    docker-like scope, recorded; (records, path of the file, cgroups, pids)."""
    with V2Cgroups(SERVICE, SCOPE) as cg:
        hog, sleeper = start(BUSY.format(secs=0.6)), start(SLEEPER.format(n=6, secs=0.1))
        try:
            cg.move(hog.pid, cg.top + "/" + SERVICE)
            cg.move(sleeper.pid, cg.top + "/" + SCOPE)
        except BaseException:
            kill_all([hog, sleeper])
            raise
        recs, _rec = record_all([hog, sleeper])
        path = tmp_path_factory.mktemp("identity") / "rec.jsonl"
        path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
        ids = {SERVICE: cg.id_of(cg.top + "/" + SERVICE), SCOPE: cg.id_of(cg.top + "/" + SCOPE)}
        yield recs, path, cg.top, ids, hog.pid, sleeper.pid


def test_each_process_and_cgroup_is_named_once_before_its_events(hog_and_sleeper):
    recs, _path, top, ids, hog, sleeper = hog_and_sleeper
    for pid, where in ((hog, SERVICE), (sleeper, SCOPE)):
        procs = [r for r in recs if r["type"] == "process" and r["pid"] == pid]
        assert procs and procs[0]["why"] == "first" and not procs[0]["gone"]
        assert procs[0]["cgroup"] == ids[where] and procs[0]["ppid"] > 1
        assert procs[0]["exe"].startswith("/") and "python" in procs[0]["title"]
        first_event = next(i for i, r in enumerate(recs) if r["type"] == "state" and r["pid"] == pid)
        assert recs.index(procs[0]) < first_event
        groups = [r for r in recs if r["type"] == "cgroup" and r["cgroup"] == ids[where]]
        assert [(g["path"], g["gone"]) for g in groups] == [(f"{top}/{where}", False)]
        assert recs.index(groups[0]) < recs.index(procs[0])


KEYS = [
    ("cgroup", lambda top: (f"{top}/{SERVICE}", f"{top}/{SCOPE}")),
    ("unit", lambda top: ("pstate-test.service", f"docker-{DOCKER_ID}.scope")),
    ("container", lambda top: ("host", DOCKER_ID[:12])),
]


@pytest.mark.parametrize("by, keys", KEYS)
def test_time_goes_to_the_right_group(hog_and_sleeper, by, keys):
    recs, path, top, _ids, hog, sleeper = hog_and_sleeper
    hog_key, sleeper_key = keys(top)
    groups = {g["key"]: g for g in _stats(path, "--by", by)["groups"]}
    assert set(groups) == {hog_key, sleeper_key}
    h, s = groups[hog_key], groups[sleeper_key]
    assert (h["processes"], s["processes"]) == (1, 1)
    # Truths the workloads fix whatever the machine's load: the hog's 0.6 s
    # loop is spent on a CPU or waiting for one, the sleeper's six 0.1 s
    # sleeps asleep; a busy machine only adds wake-up latency around them.
    # Time this VM leaves untraced (workloads.untraced_runs: a switch-out
    # with no duration) goes to no state, and is the one allowance.
    def ns(g, *states):
        return sum(g["states"].get(k, {"ns": 0})["ns"] for k in states)

    mine = workloads.states(recs, hog)
    untraced = sum(workloads.untraced_runs(mine))
    assert ns(h, "running", "runnable", "preempted") + untraced >= 0.59e9, (h["states"], mine)
    assert ns(s, "sleeping") >= 0.6e9
    assert max(s["states"], key=lambda k: s["states"][k]["ns"]) == "sleeping"
    assert ns(s, "running") < ns(h, "running") / 10


@pytest.mark.parametrize("by, keys", KEYS)
def test_heat_draws_the_same_groups(hog_and_sleeper, by, keys):
    from pstate.render import heatmodel as hm
    from pstate.stream.reader import read_records

    _recs, path, top, _ids, _hog, _sleeper = hog_and_sleeper
    hog_key, sleeper_key = keys(top)
    tracker = hm.RecordedStates(by)
    for rec in read_records([str(path)]):
        tracker.feed(rec)
    tracker.close()
    assert set(tracker.totals) == {hog_key, sleeper_key}
    running = hm.STATE_INDEX["running"]
    assert tracker.totals[hog_key][running] > 10 * tracker.totals[sleeper_key][running]
    r = CliRunner().invoke(cli, ["heat", "--by", by, "--no-color", "--width", "100", str(path)],
                           prog_name="pstate")
    assert r.exit_code == 0, r.output
    assert f"2 of 2 {dict(cgroup='cgroups', unit='units', container='containers')[by]}" in r.stdout


def test_titles_rewritten_after_start_are_told_apart(tmp_path):
    titles = ("pstate-test: backend", "pstate-test: walwriter", "pstate-test: checkpointer")
    # alive well past record's second look (200 ms after the first), which a
    # loaded machine may delay (workloads.Recording reads record's output as
    # it goes: a full pipe held that look back until the children were gone)
    kids = [start_titled(t, secs=2.5) for t in titles]
    recs, _rec = record_all(kids)
    for c, t in zip(kids, titles):
        procs = [r for r in recs if r["type"] == "process" and r["pid"] == c.pid]
        assert procs[-1]["title"] == t, procs  # the second look saw the new title
        assert procs[-1]["comm"] == procs[0]["comm"]  # one comm for all
    path = tmp_path / "titled.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    groups = {g["key"]: g for g in _stats(path, "--by", "title")["groups"]}
    for t in titles:
        assert groups[t]["processes"] == 1 and groups[t]["transitions"] > 0
    rep = _stats(path, "--by", "title", "--top", "2")
    shown, rest, total = rep["groups"], rep["rest"], rep["total"]
    assert len(shown) == 2 and rest["processes"] >= 1
    for field in ("observed_ns", "transitions", "voluntary", "involuntary", "unobserved_ns"):
        assert sum(g[field] for g in shown) + rest[field] == total[field], field
    for st in total["states"]:
        assert sum(g["states"].get(st, {"ns": 0})["ns"] for g in shown) + \
            rest["states"].get(st, {"ns": 0})["ns"] == total["states"][st]["ns"], st
    table = CliRunner().invoke(cli, ["stats", "--by", "title", "--top", "2", str(path)], prog_name="pstate")
    assert table.exit_code == 0
    assert f"({len(groups) - 2} more)" in table.stdout and "(total)" in table.stdout


def test_snapshots_carry_the_cgroup_and_stats_dir_groups_by_it(tmp_path):
    import subprocess

    from conftest import clean_env, pstate_cmd

    with V2Cgroups(SERVICE, SCOPE) as cg:
        # both outlast snap's start and interval on a slow machine (killed after): a sleeper that
        # had exited before snap read it carried no cgroup path, once under a busy loop on each CPU
        hog, sleeper = start(BUSY.format(secs=5)), start(SLEEPER.format(n=50, secs=0.1))
        try:
            cg.move(hog.pid, cg.top + "/" + SERVICE)
            cg.move(sleeper.pid, cg.top + "/" + SCOPE)
            go(hog, sleeper)
            p = subprocess.run(pstate_cmd("snap", "-q", "--dir", str(tmp_path), "--interval", "0.6", "--count", "1"),
                               capture_output=True, timeout=120, env=clean_env())
            assert p.returncode == 0, p.stderr
        finally:
            kill_all([hog, sleeper])
        top = cg.top
    rows = [orjson.loads(x) for f in tmp_path.glob("pstate-snap-*.jsonl") for x in f.read_bytes().splitlines()]
    mine = {r["pid"]: r for r in rows if r.get("type") == "task" and r["pid"] in (hog.pid, sleeper.pid)}
    assert mine[hog.pid]["cgroup_path"] == f"{top}/{SERVICE}" and mine[sleeper.pid]["cgroup_path"] == f"{top}/{SCOPE}"
    r = CliRunner().invoke(cli, ["stats", "-f", "json", "--by", "unit", str(tmp_path)], prog_name="pstate")
    assert r.exit_code == 0, r.output
    trends = {t["comm"]: t for t in orjson.loads(r.stdout)["trends"]}
    # the hog never blocks: its interval is all on a CPU or waiting for one, however loaded the
    # machine; the sleeper's mostly asleep, so its unit's share is the smaller
    hog_row = mine[hog.pid]
    total = sum(hog_row.get(f"{s}_ns") or 0 for s in snapdir.STATE_FIELDS)
    assert total and (hog_row["running_ns"] + sum(hog_row.get(f) or 0 for f in snapdir.WAIT_FIELDS)) >= 0.95 * total
    assert trends["pstate-test.service"]["cpu_share_avg"] > trends[f"docker-{DOCKER_ID}.scope"]["cpu_share_avg"]
    assert trends[f"docker-{DOCKER_ID}.scope"]["cpu_share_avg"] < 0.1
    r = CliRunner().invoke(cli, ["stats", "-f", "json", "--by", "container", str(tmp_path)], prog_name="pstate")
    trends = {t["comm"]: t for t in orjson.loads(r.stdout)["trends"]}
    assert trends[DOCKER_ID[:12]]["cpu_share_avg"] < 0.1 and "host" in trends

"""Every --by key with every why view (--stacks, --wakers, --antagonists,
-f folded), the combinations generated from stats' own tables of keys and
views, on a recording whose services are known by construction
(data/stats/why_fixtures.py: why-services.jsonl): each group holds the
processes its key says, with the sum of their figures."""

from __future__ import annotations

import importlib.util

import orjson
import pytest
from click.testing import CliRunner

import test_stats
from pstate.analysis import timeinstate
from pstate.commands.stats import WHY_VIEWS
from pstate.main import cli

_spec = importlib.util.spec_from_file_location("why_fixtures", test_stats.DATA / "why_fixtures.py")
fx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fx)

SERVICES = "why-services.jsonl"
MS = 1_000_000
COMMS = {100: "dd", 200: "ping", 201: "pong", 300: "hog", 301: "hog2", 400: "sleeper"}
UNITS = {11: "db.service", 12: "pp.service", 13: "session-1.scope", 14: f"docker-{fx.CONTAINER}.scope"}
CONTAINERS = {11: "host", 12: "host", 13: "host", 14: fx.CONTAINER[:12]}


# the roles of the titles (their volatile part gone: the two backends are one)
ROLES = {100: "postgres: 15/main: checkpointer", 200: "postgres: 15/main: app shop",
         201: "postgres: 15/main: app shop", 300: "hog --spin", 301: "hog2 --spin", 400: "sleeper"}
# --by 'title:REGEX': its group where it matches, else the role above
PATTERN = r"title:^postgres: \S+ (\S+)"
NAMED_ROLES = {100: "checkpointer", 200: "app", 201: "app", 300: "hog --spin", 301: "hog2 --spin", 400: "sleeper"}
# every grouping (--by reason has groups of its own: test_why), and a role named by a pattern
BY_KEYS = timeinstate.BY_KEYS + (PATTERN,)
COMBINATIONS = [(by, view) for by in BY_KEYS for view in WHY_VIEWS]


def member_key(by: str, pid: int):
    """The group a process of the fixture is in, by the fixture's truth."""
    cg, _title, ppid = fx.SERVICES[pid]
    return {"pid": pid, "tid": pid, "comm": COMMS[pid], "all": "all", "cgroup": fx.CGROUPS[cg],
            "unit": UNITS[cg], "container": CONTAINERS[cg], "title": ROLES[pid], "ppid": ppid,
            PATTERN: NAMED_ROLES[pid]}[by]


def groups_of(by: str) -> dict:
    out: dict = {}
    for pid in fx.SERVICES:
        out.setdefault(member_key(by, pid), set()).add(pid)
    return out


@pytest.fixture(autouse=True)
def in_data_dir(monkeypatch):
    monkeypatch.chdir(test_stats.DATA)


def run(*args):
    res = CliRunner().invoke(cli, ["stats", SERVICES, "--top", "100", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    return res.stdout


def report(by: str, *args) -> dict:
    return {g["key"]: g for g in orjson.loads(run("--by", by, "-f", "json", *args))["groups"]}


def folded(by: str) -> dict:
    """(group label, state) -> microseconds."""
    out: dict = {}
    for line in run("--by", by, "-f", "folded").splitlines():
        path, _, us = line.rpartition(" ")
        group, state = path.split(";")[:2]
        out[(group, state)] = out.get((group, state), 0) + int(us)
    return out


def merged(per_pid: dict, pids: set, field: str, name: str, value: str) -> dict:
    out: dict = {}
    for pid in pids:
        for item in per_pid[pid][field]:
            out[item[name]] = out.get(item[name], 0) + item[value]
    return out


def test_every_key_and_view_is_combined():
    assert set(WHY_VIEWS) == {"stacks", "wakers", "antagonists", "folded"}
    assert len(COMBINATIONS) == len(BY_KEYS) * len(WHY_VIEWS)
    assert set(BY_KEYS) >= {"pid", "tid", "comm", "cgroup", "unit", "container", "title", "ppid", "all"}


@pytest.mark.parametrize("by,view", COMBINATIONS, ids=[f"{b}-{v}" for b, v in COMBINATIONS])
@pytest.mark.parametrize("reader", ["fast", "careful"])
def test_every_key_with_every_view(by, view, reader):
    truth = groups_of(by)
    per_pid = report("pid", "--stacks", "--wakers", "--antagonists", "--reader", reader)
    if view == "folded":
        sums = folded(by)
        pid_sums = folded("pid")
        expect: dict = {}
        for key, pids in truth.items():
            for pid in pids:
                for (label, state), us in pid_sums.items():
                    if label == f"{COMMS[pid]}-{pid}":
                        lab = f"{COMMS[pid]}-{pid}" if by in ("pid", "tid") else str(key)
                        expect[(lab, state)] = expect.get((lab, state), 0) + us
        assert sums.keys() == expect.keys()
        for k, us in expect.items():
            assert abs(sums[k] - us) <= 2, (k, sums[k], us)  # each line rounded to a microsecond
        return
    got = report(by, *WHY_VIEWS[view], "--reader", reader)
    assert set(got) == set(truth)
    for key, pids in truth.items():
        g = got[key]
        if view == "stacks":
            assert g["blocked_ns"] == sum(per_pid[p]["blocked_ns"] for p in pids), key
            tot = {}
            for s in g["stacks"]:
                tot[(s["state"], s["frames"])] = tot.get((s["state"], s["frames"]), 0) + s["total_ns"]
            want = {}
            for p in pids:
                for s in per_pid[p]["stacks"]:
                    want[(s["state"], s["frames"])] = want.get((s["state"], s["frames"]), 0) + s["total_ns"]
            assert tot == want, key
        elif view == "wakers":
            assert {w["name"]: w["ended_ns"] for w in g["wakers"]} == merged(per_pid, pids, "wakers", "name",
                                                                            "ended_ns"), key
            assert {w["name"]: w["count"] for w in g["wakers"]} == merged(per_pid, pids, "wakers", "name", "count")
            assert sum(w["pct"] for w in g["wakers"]) == pytest.approx(100, abs=0.05) or not g["wakers"]
        else:
            assert g["runq_ns"] == sum(per_pid[p]["runq_ns"] for p in pids), key
            assert {a["name"]: a["ns"] for a in g["antagonists"]} == merged(per_pid, pids, "antagonists", "name",
                                                                            "ns"), key


def test_per_service_figures_by_unit():
    # what the fixture built: the db's D time, the ping-pong's wakers, the hogs' antagonists
    g = report("unit", "--stacks=D", "--wakers", "--antagonists")
    db, pp, session = g["db.service"], g["pp.service"], g["session-1.scope"]
    assert db["blocked_ns"] == 9 * MS
    assert [(s["reason"], s["count"]) for s in db["stacks"]] == [("__iomap_dio_rw", 6), ("submit_bio_wait", 2)]
    assert [(w["name"], w["count"], w["group"]) for w in db["wakers"]] == [("irq", 8, None)]
    assert sorted((w["name"], w["count"], w["group"]) for w in pp["wakers"]) == [
        ("ping 200", 6, "pp.service"), ("pong 201", 6, "pp.service")]
    assert session["runq_ns"] == 20 * MS
    assert [(a["name"], a["ns"], a["group"]) for a in session["antagonists"]] == [
        ("hog2 301", 12 * MS, "session-1.scope"), ("hog 300", 8 * MS, "session-1.scope")]


def test_wake_graph_by_a_service_key_joins_the_groups():
    out = run("--by", "unit", "--wakers", "-f", "dot")
    assert '"g:pp.service" -> "g:pp.service"' in out
    assert '"k:irq" -> "g:db.service"' in out


def test_shares_are_of_the_group_s_total_whatever_top_shows():
    pcts = {}
    for top in ("1", "2", "10"):
        res = CliRunner().invoke(cli, ["stats", SERVICES, "--by", "unit", "--wakers", "--antagonists", "-f", "json",
                                       "--top", top, "--sort", "sleeping"], catch_exceptions=False)
        g = {x["key"]: x for x in orjson.loads(res.stdout)["groups"]}
        pcts[top] = [w["pct"] for w in g["pp.service"]["wakers"]]
        other = g["pp.service"]["wakers_other"]
        assert (other is None) == (top != "1")
        if other:
            assert (other["wakers"], other["count"], other["pct"]) == (1, 6, 49.45)
    assert pcts == {"1": [50.55], "2": [50.55, 49.45], "10": [50.55, 49.45]}
    out = CliRunner().invoke(cli, ["stats", SERVICES, "--by", "unit", "--antagonists", "--top", "1",
                                   "--sort", "preempted"]).stdout
    assert [x.split() for x in out.splitlines() if "more)" in x or "hog2 301" in x][-2:] == [
        ["session-1.scope", "20ms", "hog2", "301", "12ms", "60.0"], ["(1", "more)", "8ms", "40.0"]]


FILTERS = [(("-p", "201"), {201}), (("-c", "hog"), {300}), (("--title", "postgres:*"), {100, 200, 201}),
           (("--cgroup", "/system.slice/pp.service"), {200, 201}), (("-p", "300", "-p", "400"), {300, 400})]


@pytest.mark.parametrize("view", list(WHY_VIEWS))
@pytest.mark.parametrize("filt,pids", FILTERS, ids=[" ".join(f) for f, _p in FILTERS])
@pytest.mark.parametrize("reader", ["fast", "careful"])
def test_a_filter_selects_after_attributing(filt, pids, view, reader):
    # stats -p X --antagonists of a whole recording: the same as attributing everything, then selecting X
    if view == "folded":
        whole = run("-f", "folded", "--reader", reader).splitlines()
        got = run("-f", "folded", "--reader", reader, *filt).splitlines()
        assert got == [x for x in whole if int(x.split(";")[0].rpartition("-")[2]) in pids]
        return
    whole = report("pid", *WHY_VIEWS[view], "--reader", reader)
    got = report("pid", *WHY_VIEWS[view], "--reader", reader, *filt)
    assert set(got) == pids
    for pid in pids:
        assert got[pid] == whole[pid], pid
    if view == "wakers" and 201 in pids:
        assert [w["name"] for w in got[201]["wakers"]] == ["ping 200"]  # a name, not "? 200"
    if view == "antagonists" and 300 in pids:
        assert [(a["name"], a["ns"]) for a in got[300]["antagonists"]] == [("hog2 301", 12 * MS)]


WIDTHS = [("why-services-cgroup.txt", {}, (), 80), ("why-services-cgroup-120.txt", {"COLUMNS": "120"}, (), 120),
          ("why-services-cgroup-wide.txt", {}, ("--wide",), None)]


@pytest.mark.parametrize("name,env,args,width", WIDTHS, ids=[w[0] for w in WIDTHS])
def test_tables_fit_the_width_and_keep_both_ends_of_a_path(monkeypatch, name, env, args, width):
    monkeypatch.delenv("COLUMNS", raising=False)
    res = CliRunner().invoke(cli, ["stats", SERVICES, "--by", "cgroup", "--stacks", "--wakers", "--antagonists",
                                   *args], env=env, catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    test_stats.check_golden(name, res.stdout)
    longest = max(len(x) for x in res.stdout.splitlines())
    docker = f"/system.slice/docker-{fx.CONTAINER}.scope"
    if width is None:
        assert docker in res.stdout and longest > 120
    else:
        assert longest <= width and docker not in res.stdout
        # cut in the middle: the start and the distinguishing end stay
        cuts = {x.split()[0] for x in res.stdout.splitlines() if x.startswith("/system.slic") and "~" in x.split()[0]}
        assert cuts and all(docker.startswith(c.split("~")[0]) and docker.endswith(c.split("~")[1]) for c in cuts)
        assert all(c.endswith("bcdef.scope") for c in cuts), cuts


def test_the_table_width_is_the_terminal_s_or_columns(monkeypatch):
    import io

    from pstate.render import tables

    monkeypatch.delenv("COLUMNS", raising=False)
    assert tables.table_width(io.StringIO()) == 80  # not a terminal
    monkeypatch.setenv("COLUMNS", "132")
    assert tables.table_width(io.StringIO()) == 132
    monkeypatch.setenv("COLUMNS", "40")
    assert tables.table_width(io.StringIO()) == 80  # never narrower than the 80-column layout

    class Tty(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("COLUMNS")
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback: __import__("os").terminal_size((150, 50)))
    assert tables.table_width(Tty()) == 150

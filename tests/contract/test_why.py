"""stats --stacks, --wakers, --antagonists, --by reason and --format folded
over a recording whose causes are known by construction
(data/stats/why_fixtures.py): numbers, golden files, usage errors.

Regenerate the goldens:  PSTATE_REGEN=1 pytest tests/contract/test_why.py
"""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

import test_stats
from pstate.analysis import causes
from pstate.main import cli

WHY = "why.jsonl"
MS = 1_000_000
US = 1000


@pytest.fixture(autouse=True)
def in_data_dir(monkeypatch):
    monkeypatch.chdir(test_stats.DATA)


def run(*args):
    return CliRunner().invoke(cli, ["stats", *args], catch_exceptions=False)


def report(*args) -> dict:
    res = run(WHY, "-f", "json", *args)
    assert res.exit_code == 0, res.stderr
    return orjson.loads(res.stdout)


def by_key(rep: dict) -> dict:
    return {g["key"]: g for g in rep["groups"]}


GOLDENS = [
    ("why-stacks.txt", ["--stacks"]),
    ("why-all.txt", ["--stacks=D", "--wakers", "--antagonists", "--top", "3"]),
    ("why-reason.txt", ["--by", "reason", "--wakers"]),
    ("why.json", ["--stacks", "--wakers", "--antagonists", "-f", "json", "--by", "tid", "--top", "4"]),
    ("why.folded", ["-f", "folded"]),
    ("why-d.folded", ["-f", "folded", "--stacks=D"]),
    ("why-wakers.dot", ["--wakers", "-f", "dot"]),
    ("why-all-hist.txt", ["--by", "all", "--hist"]),
    ("why-all.csv", ["--by", "all", "-f", "csv"]),
]


@pytest.mark.parametrize("name,args", GOLDENS, ids=[g[0] for g in GOLDENS])
def test_golden(name, args):
    res = run(WHY, *args)
    assert res.exit_code == 0, res.stderr
    test_stats.check_golden(name, res.stdout)
    if name.endswith(".txt"):
        assert max(len(x) for x in res.stdout.splitlines()) <= 80


def folded_sums(text: str) -> dict:
    """(group label, state) -> microseconds."""
    out: dict = {}
    for line in text.splitlines():
        path, _, us = line.rpartition(" ")
        group, state = path.split(";")[:2]
        out[(group, state)] = out.get((group, state), 0) + int(us)
    return out


def test_folded_sums_to_the_blocked_time_stats_reports():
    rep = report()
    res = run(WHY, "-f", "folded")
    sums = folded_sums(res.stdout)
    checked = 0
    for g in rep["groups"]:
        for state in ("sleeping", "uninterruptible"):
            ns = g["states"].get(state, {}).get("ns", 0)
            if not ns:
                continue
            us = sums[(f"{g['comm']}-{g['key']}", state)]
            assert abs(us * US - ns) <= 0.01 * ns, (g["key"], state, us, ns)
            checked += 1
    assert checked == 4  # dd's D, ping's, pong's and the sleeper's S
    assert {s for _g, s in sums} == {"sleeping", "uninterruptible"}


def test_stacks_rank_by_blocked_time_with_their_reason():
    dd = by_key(report("--stacks=D"))[100]
    assert [(s["reason"], s["count"], s["total_ns"]) for s in dd["stacks"]] == [
        ("__iomap_dio_rw", 6, 7 * MS), ("submit_bio_wait", 2, 2 * MS)]
    assert dd["stacks"][0]["max_ns"] == 2 * MS
    assert dd["stacks"][0]["p50_ns"] == pytest.approx(1 * MS, rel=0.016)
    assert dd["blocked_ns"] == 9 * MS
    assert [r["reason"] for r in dd["reasons"]] == ["__iomap_dio_rw", "submit_bio_wait"]
    sleeper = by_key(report("--stacks=D"))[400]
    assert sleeper["stacks"] == [] and sleeper["blocked_ns"] == 0  # S is not asked for


def test_by_reason_groups_every_task_s_blocked_time():
    rep = report("--by", "reason")
    g = by_key(rep)
    assert rep["by"] == "reason"
    assert g["__iomap_dio_rw"]["blocked_ns"] == 7 * MS
    assert g["do_nanosleep"]["reasons"][0]["count"] == 3
    assert list(g)[:2] == [causes.NO_REASON, "do_nanosleep"]  # longest first


def test_wakers_name_each_side_of_a_ping_pong_and_the_interrupts():
    g = by_key(report("--wakers"))
    assert [(w["kind"], w["tid"], w["count"]) for w in g[200]["wakers"]] == [("task", 201, 6)]
    assert [(w["kind"], w["tid"], w["comm"]) for w in g[201]["wakers"]] == [("task", 200, "ping")]
    assert [(w["kind"], w["count"], w["ended_ns"]) for w in g[100]["wakers"]] == [("irq", 8, 9 * MS)]
    assert [w["kind"] for w in g[400]["wakers"]] == ["softirq"]


def test_antagonists_are_the_tasks_that_held_the_cpu():
    g = by_key(report("--antagonists"))
    hog = g[300]
    assert hog["runq_ns"] == 12 * MS and hog["runq_waits"] == 3
    assert (hog["runq_preempted_ns"], hog["runq_wakeup_ns"]) == (12 * MS, 0)
    assert (g[100]["runq_preempted_ns"], g[100]["runq_wakeup_ns"]) == (0, 80 * US)
    assert [(a["tid"], a["ns"], a["pct"]) for a in hog["antagonists"]] == [(301, 12 * MS, 100.0)]
    # dd waits on an idle CPU (its prev_tid is 0): no task held it
    assert [(a["name"], a["ns"]) for a in g[100]["antagonists"]] == [(causes.NOT_SEEN, 80 * US)]
    ping = {a["tid"]: a["ns"] for a in g[200]["antagonists"]}
    assert ping[201] == 6 * 2 * US  # pong ran 2 us of each of ping's 5 us waits


def test_top_cuts_rows_per_group_too():
    g = by_key(report("--stacks", "--top", "1"))
    assert len(g) == 1 and all(len(x["stacks"]) <= 1 for x in g.values())


def test_a_stream_without_stacks_says_how_to_get_them():
    res = run("basic.jsonl", "--stacks")
    assert res.exit_code == 0
    assert "record it with pstate record --stacks" in res.stdout


@pytest.mark.parametrize("args, message", [
    (["--stacks", "--interval", "1"], "not --interval"),
    (["--wakers", "-f", "csv"], "use json"),
    (["--by", "reason", "-f", "dot"], "add --wakers"),
    (["--stacks=Q"], "'Q' is not a state"),
])
def test_usage_errors(args, message):
    res = run(WHY, *args)
    assert res.exit_code == 2
    assert message in res.stderr


def test_stack_ids_are_per_stream():
    # The same file twice: its stack ids name the same stacks in each stream
    rep = orjson.loads(run(WHY, WHY, "-f", "json", "--stacks=D").stdout)
    dd = by_key(rep)[100]
    assert [(s["reason"], s["count"]) for s in dd["stacks"]] == [("__iomap_dio_rw", 12), ("submit_bio_wait", 4)]


@pytest.mark.parametrize("reader", ["fast", "careful"])
def test_by_all_is_the_sum_of_every_group(reader):
    per_pid = report("--reader", reader, "--hist")
    everything = report("--reader", reader, "--by", "all", "--hist")
    assert everything["by"] == "all" and [g["key"] for g in everything["groups"]] == ["all"]
    (g,) = everything["groups"]
    for state in ("running", "sleeping", "uninterruptible", "preempted"):
        assert g["states"][state]["ns"] == sum(x["states"].get(state, {}).get("ns", 0) for x in per_pid["groups"])
    for kind, d in g["latency"].items():
        assert d["count"] == sum(x["latency"].get(kind, {}).get("count", 0) for x in per_pid["groups"])
        assert sum(n for _lo, _hi, n in d["hist"]) == d["count"]
    assert g["threads"] == 6 and g["processes"] == 6


def test_by_all_with_the_why_views():
    (g,) = report("--by", "all", "--stacks=D", "--wakers")["groups"]
    assert g["blocked_ns"] == 9 * MS
    assert {w["name"] for w in g["wakers"]} == {"irq", "softirq", "ping 200", "pong 201"}


def test_by_all_fast_and_careful_agree():
    for path in ("why.jsonl", "basic.jsonl", "lossy.jsonl"):
        fast = run(path, "--by", "all", "--hist", "-f", "json")
        careful = run(path, "--by", "all", "--hist", "-f", "json", "--reader", "careful")
        assert (fast.exit_code, fast.stdout) == (careful.exit_code, careful.stdout)


WHY_ARGS = [("--stacks", "--wakers", "--antagonists", "-f", "json"), ("-f", "folded"), ("--by", "reason", "--wakers"),
            ("--strict", "--stacks=D", "--antagonists")]


@pytest.mark.parametrize("args", WHY_ARGS, ids=["json", "folded", "reason", "strict"])
def test_why_views_fast_and_careful_agree(args):
    import test_one_reader

    for path in [test_stats.DATA / WHY, *test_one_reader.INPUTS]:
        fast = run(str(path), *args)
        careful = run(str(path), *args, "--reader", "careful")
        assert (fast.exit_code, fast.stdout, fast.stderr) == (careful.exit_code, careful.stdout, careful.stderr), path


def test_lines_with_what_rows_lack_take_the_careful_path_wherever_they_are():
    # a stack_id/waker line first in a chunk, last, and between plain ones: the same report
    data = (test_stats.DATA / WHY).read_bytes()
    whole = run(WHY, "--stacks", "--wakers", "--antagonists", "-f", "json").stdout
    res = CliRunner().invoke(cli, ["stats", "--stacks", "--wakers", "--antagonists", "-f", "json", "-"],
                             input=data, catch_exceptions=False)
    assert res.exit_code == 0 and orjson.loads(res.stdout)["groups"] == orjson.loads(whole)["groups"]
    from pstate.stream import reader as c

    calls = []

    def bulk(buf, pos, end, n):
        calls.append(buf[pos:end + 1])
        return end + 1, buf.count(b"\n", pos, end + 1), 0

    fast = c.stop_before((b'"k"',), bulk)
    buf = b'{"a":1}\n{"k":2}\n{"b":3}\n'
    assert fast(buf, 0, len(buf) - 1, 0) == (8, 1, 0) and calls == [b'{"a":1}\n']
    assert fast(buf, 8, len(buf) - 1, 1) == (8, 0, 0)  # the line with the key: to the careful path
    assert fast(buf, 16, len(buf) - 1, 2) == (24, 1, 0) and calls[-1] == b'{"b":3}\n'


def test_stacks_alone_shows_the_states_the_recording_took_stacks_of(tmp_path):
    # as record --stacks (D only) writes it: no sleep carries a stack
    out = []
    for raw in (test_stats.DATA / WHY).read_bytes().splitlines():
        rec = orjson.loads(raw)
        if rec["type"] == "state" and rec["from"] == "sleeping":
            rec.pop("stack_id", None)
            rec.pop("reason", None)
        out.append(orjson.dumps(rec))
    path = tmp_path / "d-only.jsonl"
    path.write_bytes(b"\n".join(out) + b"\n")
    rep = orjson.loads(run(str(path), "--stacks", "-f", "json").stdout)
    assert {s["state"] for g in rep["groups"] for s in g["stacks"]} == {"uninterruptible"}
    folded = run(str(path), "-f", "folded").stdout
    assert all(";uninterruptible;" in line for line in folded.splitlines())
    asked = orjson.loads(run(str(path), "--stacks=S", "-f", "json").stdout)
    sleeper = by_key(asked)[400]
    assert [s["frames"] for s in sleeper["stacks"]] == [causes.NO_STACK, causes.AT_END]


@pytest.mark.parametrize("args", [("--stacks", WHY), ("--stacks", WHY, "--wakers"), (WHY, "--stacks"),
                                  ("--stacks", "-")])
def test_an_optional_value_never_swallows_the_input(args):
    data = (test_stats.DATA / WHY).read_bytes()
    res = CliRunner().invoke(cli, ["stats", *args, "-f", "json"], input=data, catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    rep = orjson.loads(res.stdout)
    assert rep["why"]["stacks"] and by_key(rep)[100]["blocked_ns"] == 9 * MS
    assert by_key(rep)[400]["blocked_ns"] > 0  # --stacks alone: every state the recording took stacks of
    d = orjson.loads(run("--stacks", "D", WHY, "-f", "json").stdout)
    assert by_key(d)[400]["blocked_ns"] == 0 and by_key(d)[100]["blocked_ns"] == 9 * MS

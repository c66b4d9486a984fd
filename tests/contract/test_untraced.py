"""Threads whose switch-outs are never traced (the kernel reports them
switching in, never out: some VM agents' threads): their records or rows
say they ran all the time. stats of a stream flags the impossible switch-ins
and keeps every share within 100 %; stats of snapshots (DIR/) flags an
interval whose threads were on a CPU longer than its CPUs allow, counts the
time of the threads on a CPU through it with no switch as unknown, not
on-CPU, and says so, and why /proc/TID/schedstat cannot stand in."""

from __future__ import annotations

import importlib.util

import orjson
from click.testing import CliRunner

import test_stats
from pstate.main import cli
from pstate.snapshots import snapdir
from pstate.snapshots.writer import render_jsonl

_spec = importlib.util.spec_from_file_location("make_fixtures", test_stats.HERE / "data" / "snap" / "make_fixtures.py")
mf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mf)
S = mf.S
MS = 1_000_000


def _stats(*args):
    res = CliRunner().invoke(cli, ["stats", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.stderr
    return res


def _snapshots(tmp_path, agent_switches: int = 0):
    """Two cumulative snapshots of a 2-CPU machine, 10 s apart: PID 1's two
    threads (agent) running since before the run with no switch, a hog on a
    CPU all the time (preempted now and then), a sleeper."""
    t0, wall0 = 100 * S, mf.WALL_A
    for k, end in enumerate((110 * S, 120 * S), start=1):
        el = end - t0
        rows = [mf.row(end, 1, 1, "agent", 1 * S, state="running", since=50 * S, running=el,
                       nivcsw=agent_switches * k),
                mf.row(end, 1, 2, "agent", 1 * S, state="running", since=50 * S, running=el),
                mf.row(end, 200, 200, "hog", 20 * S, state="running", since=end - MS, running=el, nivcsw=k * 10),
                mf.row(end, 300, 300, "sleeper", 30 * S, sleeping=el, wakeups=k)]
        m = mf.meta(mf.BOOT_A, "run-u", k, t0, end, wall0, "cumulative")
        name = snapdir.snapshot_name(m["wall_end_ns"], k, "jsonl")
        (tmp_path / name).write_bytes(render_jsonl(m, rows, {"type": "end", "ts": end, "tasks": len(rows),
                                                               "reason": "interval"}))
    return str(tmp_path)


def test_snapshot_threads_that_never_switch_out_are_flagged_and_not_counted_on_cpu(tmp_path):
    res = _stats(_snapshots(tmp_path), "-f", "json")
    rep = orjson.loads(res.stdout)
    assert [(u["pid"], u["tid"], u["intervals"], u["unknown_ns"]) for u in rep["untraced"]] == [
        (1, 1, 2, 20 * S), (1, 2, 2, 20 * S)]
    shares = {r["pid"]: r["cpu_share_max"] for r in rep["trends"]}
    assert shares[1] == 0.0 and shares[200] == 1.0  # the hog's time stays
    assert all(r["cpu_share_max"] <= 1.0 for r in rep["trends"])
    assert "2 thread(s) ran through whole intervals with no switch (agent 1, agent 2)" in res.stderr
    assert "/proc/TID/schedstat counts since a thread began, not per snapshot interval: not used" in res.stderr
    table = _stats(_snapshots(tmp_path)).stdout
    assert "200.0%" not in table


def test_only_threads_with_no_switch_are_suspects_and_a_possible_interval_is_left(tmp_path):
    # thread 1 switched out in every interval: only thread 2 (no switch) is why 3 CPUs' worth ran on 2
    rep = orjson.loads(_stats(_snapshots(tmp_path, agent_switches=5), "-f", "json").stdout)
    assert [(u["tid"]) for u in rep["untraced"]] == [2]
    one = tmp_path / "one"
    one.mkdir()
    # a lone thread on a CPU with no switch is possible (an idle machine): not flagged
    m = mf.meta(mf.BOOT_A, "run-v", 1, 100 * S, 110 * S, mf.WALL_A, "cumulative")
    rows = [mf.row(110 * S, 200, 200, "hog", 20 * S, state="running", since=50 * S, running=10 * S)]
    (one / snapdir.snapshot_name(m["wall_end_ns"], 1, "jsonl")).write_bytes(
        render_jsonl(m, rows, {"type": "end", "ts": 110 * S, "tasks": 1, "reason": "interval"}))
    res = _stats(str(one), "-f", "json")
    assert orjson.loads(res.stdout)["untraced"] == [] and res.stderr == ""


def _untraced_stream() -> bytes:
    """A thread switched in four times on CPU 0 and never out, beside a
    sleeper on the same CPU: the impossible switch-ins are flagged."""
    T0 = 1_000_000_000
    lines = [{"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "0.1.0", "host": "h",
              "kernel": "6.18.0", "boot_id": "b", "clock": "monotonic", "ts": T0, "wall_ns": 0, "ncpu": 1,
              "include_idle": False}]
    prev = "runnable"
    for i in range(4):
        lines.append({"type": "state", "ts": T0 + (i + 1) * 10 * MS, "cpu": 0, "pid": 1, "tid": 1, "comm": "agent",
                      "from": prev, "to": "running", "dur_ns": None if i == 0 else 10 * MS, "cause": "switch_in"})
        prev = "running"
        lines.append({"type": "state", "ts": T0 + (i + 1) * 10 * MS + MS, "cpu": 0, "pid": 9, "tid": 9,
                      "comm": "sleeper", "from": "running", "to": "sleeping", "dur_ns": MS, "cause": "switch_out"})
        lines.append({"type": "state", "ts": T0 + (i + 1) * 10 * MS + 5 * MS, "cpu": 0, "pid": 9, "tid": 9,
                      "comm": "sleeper", "from": "sleeping", "to": "running", "dur_ns": 4 * MS,
                      "cause": "switch_in"})
    lines.append({"type": "end", "ts": T0 + 50 * MS, "reason": "eof", "events": 12, "lost": 0})
    return b"".join(orjson.dumps(x) + b"\n" for x in lines)


def test_a_stream_s_switch_ins_without_switch_outs_are_flagged_and_shares_stay_within_100(tmp_path):
    path = tmp_path / "untraced.jsonl"
    path.write_bytes(_untraced_stream())
    for by in ("pid", "tid", "all"):
        rep = orjson.loads(_stats(str(path), "-f", "json", "--by", by).stdout)
        assert rep["accounting"]["impossible_transitions"] == 3
        assert all(s["pct"] <= 100.0 for g in rep["groups"] for s in g["states"].values())
    text = _stats(str(path)).stdout
    assert "impossible" in text


def test_heat_of_snapshots_does_not_draw_them_on_cpu(tmp_path):
    from pstate.render import heatviews
    from pstate.stream.streamio import ReadStats

    snaps = snapdir.load([_snapshots(tmp_path)], ReadStats(), [])
    values, _labels = heatviews.snapshot_values(snaps, ("running",), "pid")
    assert [vals for _iv, vals in values] == [{1: 0, 200: 10 * S, 300: 0}, {1: 0, 200: 10 * S, 300: 0}]
    res = CliRunner().invoke(cli, ["heat", str(tmp_path), "--shade", "running", "--width", "80"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.stderr


def test_heat_does_not_draw_a_thread_with_no_switch_out_on_a_cpu(tmp_path):
    from pstate.render import heatmodel as hm

    recs = [orjson.loads(x) for x in _untraced_stream().splitlines()]
    rows = [(r["ts"], r["pid"], r["tid"], r["comm"], r["from"], r["to"], r["dur_ns"], r["cpu"], 1, None, None)
            for r in recs if r["type"] == "state"]
    rec = hm.RecordedStates(by="tid")
    for r in rows:
        rec.state(*r[:7])
    live = hm.Window(10 * MS, 10, by="tid")
    live.states(rows)
    # the agent's three impossible switch-ins: 30 ms not known, none of it on a CPU
    tot = rec.totals[1]
    assert tot[hm.RUNNING_IDX] == 0 and tot[hm.UNKNOWN_IDX] == 30 * MS
    cells = [col[1] for col in live.grid.cols.values() if 1 in col]
    assert sum(c[hm.RUNNING_IDX] for c in cells) == 0 and sum(c[hm.UNKNOWN_IDX] for c in cells) == 30 * MS


def test_snap_prom_counts_a_thread_with_no_switch_as_unknown(tmp_path):
    """snap --format prom (a run's own program or the collector's rows, one
    writer): the agent threads' time is not on-CPU, the workers' is."""
    import subprocess
    import sys

    from conftest import TESTS, clean_env

    fake = TESTS / "data" / "snap" / "fake_snap.py"
    r = subprocess.run([sys.executable, str(fake), "--dir", str(tmp_path), "--every", "0.05", "--count", "3",
                        "--format", "prom", "--prom-by", "comm"], capture_output=True, text=True, timeout=60,
                       env=clean_env() | {"FAKE_SNAP_AGENT": "2", "FAKE_SNAP_ROWS": "40"})
    assert r.returncode == 0, r.stderr
    text = (tmp_path / snapdir.PROM_NAME).read_text()
    series = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines()
              if ln.startswith("pstate_state_seconds_total{")}
    assert 'pstate_state_seconds_total{comm="agent",state="running"}' not in series
    assert series['pstate_state_seconds_total{comm="agent",state="unknown"}'] > 0
    assert series['pstate_state_seconds_total{comm="w0",state="running"}'] > 0

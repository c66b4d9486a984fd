"""The README's "Works with" recipes, run as written against a recording of
pstate's format (meta, state, fork, loss and end records)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import orjson
import pytest

from pstate.stream.meta import meta_record, rfc3339
from conftest import ROOT

README = (ROOT / "README.md").read_text()

JQ_D = """jq -c 'select(.type=="state" and .from=="uninterruptible" and .dur_ns>10000000)' rec.jsonl"""
JQ_WALL = """jq -r 'select(.type=="meta") | .wall_time' rec.jsonl"""
DUCKDB = ("""SELECT comm, "from", count(*) AS n, sum(dur_ns) AS ns FROM read_json('rec.jsonl', sample_size=-1) """
          """WHERE type = 'state' GROUP BY ALL ORDER BY ns DESC;""")
PANDAS = '''df = pd.read_json("rec.jsonl", lines=True, dtype_backend="numpy_nullable")
states = df[df.type == "state"]
start = pd.Timestamp(df[df.type == "meta"].wall_time.iloc[0])'''

PANDAS_CSV = 'tasks = pd.read_csv("pstate-snap-20261201T093635.117604Z-000001.csv", comment="#")'

PROM = ("sudo pstate snap --format prom --dir /var/lib/prometheus/node-exporter --every 15s",
        "promtool check metrics < /var/lib/prometheus/node-exporter/pstate-snap.prom")
FLAME = "pstate stats rec.jsonl --stacks -f folded | flamegraph.pl --countname=us > offcpu.svg"

WALL_NS = 1796117795117604579  # 19 digits: a double keeps 15-17


@pytest.fixture
def rec(tmp_path, monkeypatch) -> Path:
    """30,000 records (more than DuckDB's default inference sample), with
    the keys of the loss and end records appearing only at the end."""
    meta = meta_record("record")
    meta.update(ts=1_000, wall_ns=WALL_NS, wall_time=rfc3339(WALL_NS))
    lines = [meta]
    ts = 1_000
    for i in range(30_000):
        ts += 1000
        frm, to = ("uninterruptible", "runnable") if i % 3 == 0 else ("running", "sleeping")
        lines.append({"type": "state", "ts": ts, "cpu": i % 2, "pid": 100 + i % 4, "tid": 100 + i % 4,
                      "comm": f"w{i % 4}", "from": frm, "to": to, "dur_ns": 20_000_000 if i == 3 else 1000,
                      "cause": "wakeup" if frm == "uninterruptible" else "switch_out"})
    lines.append({"type": "fork", "ts": ts + 1, "cpu": 0, "pid": 100, "tid": 100, "comm": "w0", "child_pid": 200,
                  "child_tid": 200, "thread": False})
    lines.append({"type": "loss", "ts": ts + 2, "reason": "ringbuf_full", "count": 2, "since_ts": 1_000})
    lines.append({"type": "end", "ts": ts + 3, "reason": "duration", "events": 30_001, "lost": 2,
                  "lost_ringbuf_full": 2, "lost_map_full": 0, "lost_sampled": 0, "lost_unread": 0,
                  "kernel_events": 30_003, "duration_ns": ts + 2 - 1_000})
    path = tmp_path / "rec.jsonl"
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    monkeypatch.chdir(tmp_path)
    return path


def test_recipes_are_the_readmes():
    for recipe in (JQ_D, JQ_WALL, DUCKDB, *PANDAS.splitlines(), PANDAS_CSV, *PROM, FLAME):
        assert recipe in README, recipe


def test_wall_time_is_wall_ns_exactly():
    assert rfc3339(WALL_NS) == "2026-12-01T09:36:35.117604579Z"
    assert rfc3339(0) == "1970-01-01T00:00:00.000000000Z"


@pytest.mark.skipif(not shutil.which("jq"), reason="jq not installed")
def test_jq_recipes(rec):
    out = subprocess.run(JQ_D, shell=True, capture_output=True, text=True, check=True).stdout.splitlines()
    assert [orjson.loads(x)["dur_ns"] for x in out] == [20_000_000]
    wall = subprocess.run(JQ_WALL, shell=True, capture_output=True, text=True, check=True).stdout
    assert wall == "2026-12-01T09:36:35.117604579Z\n"


def test_duckdb_recipe(rec):
    duckdb = pytest.importorskip("duckdb")
    rows = duckdb.sql(DUCKDB).fetchall()
    assert sum(n for _c, _f, n, _ns in rows) == 30_000
    assert rows[0][:2] == ("w3", "uninterruptible")  # the 20 ms sleep is the largest sum
    # a default read of the whole file does not break at the trailer either
    kinds = dict(duckdb.sql("SELECT type, count(*) FROM read_json_auto('rec.jsonl') GROUP BY ALL").fetchall())
    assert kinds == {"meta": 1, "state": 30_000, "fork": 1, "loss": 1, "end": 1}


def test_pandas_recipe(rec):
    pd = pytest.importorskip("pandas")
    scope = {"pd": pd}
    exec(PANDAS, scope)
    states, start = scope["states"], scope["start"]
    assert str(states.pid.dtype) == "Int64" and str(states.dur_ns.dtype) == "Int64"
    assert int(states.dur_ns.sum()) == 20_000_000 + 29_999 * 1000
    assert start.value == WALL_NS  # to the nanosecond


def test_pandas_csv_snapshot_recipe(tmp_path, monkeypatch):
    pd = pytest.importorskip("pandas")
    from pstate.snapshots import writer

    meta = meta_record("snap")
    rows = [{"type": "task", "ts": 5, "pid": 7, "tid": 7 + i, "comm": "a,b" if i else "123", "start_ts": 1,
             "state": "sleeping", "state_since_ts": 2, "exited": False, "exit_ts": None, "running_ns": 10 * i,
             "sleeping_ns": 3, "nvcsw": 1, "nivcsw": 0, "wakeups": 1} for i in range(3)]
    end = {"type": "end", "ts": 6, "tasks": 3}
    monkeypatch.chdir(tmp_path)
    Path("pstate-snap-20261201T093635.117604Z-000001.csv").write_bytes(writer.render_csv(meta, rows, end))
    scope = {"pd": pd}
    exec(PANDAS_CSV, scope)
    tasks = scope["tasks"]
    assert len(tasks) == 3 and list(tasks.tid) == [7, 8, 9] and list(tasks.running_ns) == [0, 10, 20]
    assert list(tasks.comm.astype(str)) == ["123", "a,b", "a,b"]


def test_prometheus_recipe(tmp_path):
    """snap's options as in the recipe (a test directory, a short interval,
    two snapshots), then promtool's check as written."""
    import shlex

    from test_snap_writer import _promtool, snap

    args = shlex.split(PROM[0])[3:]  # after `sudo pstate snap`
    args[args.index("--dir") + 1] = str(tmp_path)
    args[args.index("--every") + 1] = "0.05"
    r = snap(*args, "--count", "2")
    assert r.returncode == 0, r.stderr
    check = PROM[1].replace("/var/lib/prometheus/node-exporter", str(tmp_path)).replace("promtool", _promtool(), 1)
    res = subprocess.run(check, shell=True, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_flamegraph_recipe(monkeypatch):
    """The pstate half of the pipe on a recording with stacks: lines of
    `frame;frame;... COUNT`, as flamegraph.pl (and speedscope, inferno) read them."""
    from click.testing import CliRunner

    from pstate.main import cli

    monkeypatch.chdir(ROOT / "tests" / "data" / "stats")
    argv = FLAME.split(" | ")[0].split()[1:]
    res = CliRunner().invoke(cli, [argv[0], "why.jsonl", *argv[2:]])
    assert res.exit_code == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines and all(len(ln.rsplit(" ", 1)) == 2 and ln.rsplit(" ", 1)[1].isdigit() and ";" in ln
                         for ln in lines), lines[:3]

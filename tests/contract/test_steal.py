"""stats shows steal and interrupt time apart: the switch-outs'
steal_irq_ns (the part of a slice the kernel did not count as the task's
own) summed per group, a part of its running time, the same on the native
and the careful path; a recording without it shows no such column."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from conftest import jsonl, state_record
from pstate.main import cli

MS = 1_000_000
META = {"type": "meta", "schema": 1, "source": "record", "ts": 0, "ncpu": 2, "on_cpu_time": "kernel"}


def slices(pid: int, comm: str, steal_ms: int | None) -> list:
    """Four 10 ms slices on a CPU, each followed by 10 ms asleep."""
    out = []
    for i in range(4):
        t = 20 * MS * i
        out.append(state_record(ts=t, pid=pid, tid=pid, comm=comm, **{"from": "sleeping", "to": "running"},
                                dur_ns=10 * MS if i else None, cause="switch_in"))
        out.append(state_record(ts=t + 10 * MS, pid=pid, tid=pid, comm=comm, dur_ns=10 * MS,
                                **({"steal_irq_ns": steal_ms * MS} if steal_ms is not None else {})))
    return out


def recording(tmp_path, steal: bool):
    recs = [META] + sorted(slices(100, "vm", 2 if steal else None) + slices(200, "db", 0 if steal else None),
                           key=lambda r: r["ts"])
    path = tmp_path / "rec.jsonl"
    path.write_bytes(jsonl(*recs, {"type": "end", "ts": 80 * MS, "reason": "duration"}))
    return path


@pytest.mark.parametrize("reader", ["fast", "careful"])
def test_steal_is_summed_per_group_and_shown_as_a_part_of_run(tmp_path, reader):
    path = recording(tmp_path, steal=True)
    r = CliRunner().invoke(cli, ["stats", "-f", "json", "--reader", reader, str(path)])
    assert r.exit_code == 0, r.output
    groups = {g["pid"]: g for g in orjson.loads(r.stdout)["groups"]}
    assert groups[100]["steal_irq_ns"] == 8 * MS and groups[200]["steal_irq_ns"] == 0
    assert groups[100]["states"]["running"]["ns"] == 40 * MS  # wall time: the steal is a part of it
    r = CliRunner().invoke(cli, ["stats", "--reader", reader, str(path)])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    header = next(ln for ln in lines if ln.lstrip().startswith("PID") and "OBSERVED" in ln)
    assert header.split()[:6] == ["PID", "COMM", "OBSERVED", "RUN", "STEAL", "RUNQ"]
    row = next(ln for ln in lines if ln.split()[:2] == ["100", "vm"])
    assert row.split()[3:5] == ["50.0", "10.0"]  # 40 of 80 ms running, 8 of them stolen
    assert any(ln.startswith("STEAL: of RUN") for ln in lines)


def test_no_steal_no_column(tmp_path):
    r = CliRunner().invoke(cli, ["stats", str(recording(tmp_path, steal=False))])
    assert r.exit_code == 0, r.output
    assert "STEAL" not in r.stdout
    r = CliRunner().invoke(cli, ["stats", "-f", "csv", str(recording(tmp_path, steal=False))])
    head, *rows = r.stdout.splitlines()
    i = head.split(",").index("steal_irq_ns")
    assert [row.split(",")[i] for row in rows] == ["0", "0"]

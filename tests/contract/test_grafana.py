"""The Grafana dashboard in cli/share/grafana (installed by make install): every
query names metrics pstate snap --format prom exports, with the labels it
exports for them (per unit, the default --prom-by), plus the ones
Prometheus adds when it scrapes (instance, job)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from pstate.snapshots import snapdir, writer

from conftest import ROOT, TESTS

DASHBOARD = ROOT / "cli" / "share" / "grafana" / "pstate-dashboard.json"
sys.path.insert(0, str(TESTS))
from test_histograms import _meta, hist  # noqa: E402
sys.path.insert(0, str(TESTS / "data" / "snap"))
import fake_snap  # noqa: E402

SCRAPE_LABELS = {"instance", "job"}
_SERIES = re.compile(r"^([a-z_:]+)(?:\{(.*)\})? \S+$")
_MATCHER = re.compile(r"(pstate_\w+)\s*\{([^}]*)\}")
_LABEL = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")


def exported() -> dict[str, set[str]]:
    """{metric name: its label names} of a prom file with every family."""
    prom = writer.PromExport("unit")
    row = dict(fake_snap.fake_row(5, 5, 0, 0, comm="a", running_ns=1, uninterruptible_ns=2, nvcsw=1),
               cgroup_path="/system.slice/a.service")
    prom.update([row], [snapdir.subtract(row, None)], [True], 0,
                [hist(runq_wakeup=[(3, 1)], runq_preempted=[(4, 1)], sleeping=[(9, 1)], uninterruptible=[(12, 1)])])
    out: dict[str, set[str]] = {}
    for line in prom.render(_meta()).decode().splitlines():
        if line.startswith("#"):
            continue
        name, labels = _SERIES.match(line).groups()
        out.setdefault(name, set()).update(re.findall(r'(\w+)="', labels or ""))
    return out


def queries(dash: dict) -> list[str]:
    out = []
    for p in dash["panels"]:
        out += [t["expr"] for t in p.get("targets", [])]
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            out.append(v["query"]["query"] if isinstance(v["query"], dict) else v["query"])
    return out


def test_every_query_names_exported_metrics_and_labels():
    dash = json.loads(DASHBOARD.read_text())
    metrics = exported()
    assert {"pstate_runqueue_wait_seconds_bucket", "pstate_blocked_seconds_count",
            "pstate_state_seconds_total"} <= set(metrics)
    exprs = queries(dash)
    assert len(exprs) >= 8
    for expr in exprs:
        named = set(re.findall(r"\bpstate_\w+", expr))
        assert named, expr
        assert named <= set(metrics), (expr, named - set(metrics))
        known = set().union(*(metrics[m] for m in named)) | SCRAPE_LABELS
        for metric, body in _MATCHER.findall(expr):
            labels = set(_LABEL.findall(body))
            assert labels <= metrics[metric] | SCRAPE_LABELS, (expr, labels - metrics[metric])
        for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
            labels = {x.strip() for x in group.split(",") if x.strip()}
            assert labels <= known, (expr, labels - known)
        for fn in re.findall(r"label_values\((?:[^,]*),\s*(\w+)\)", expr):
            assert fn in known, expr
    for p in dash["panels"]:
        for t in p.get("targets", []):
            named = set(re.findall(r"\bpstate_\w+", t["expr"]))
            known = set().union(*(metrics[m] for m in named)) | SCRAPE_LABELS
            assert set(re.findall(r"\{\{(\w+)\}\}", t.get("legendFormat", ""))) <= known, t


def test_the_views_the_issue_asks_for():
    dash = json.loads(DASHBOARD.read_text())
    kinds = {p["type"] for p in dash["panels"]}
    assert "heatmap" in kinds
    heat = next(p for p in dash["panels"] if p["type"] == "heatmap")
    assert "pstate_runqueue_wait_seconds_bucket" in heat["targets"][0]["expr"]
    exprs = " ".join(queries(dash))
    assert 'state="uninterruptible"' in exprs and "runnable|preempted" in exprs and "topk(" in exprs
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])

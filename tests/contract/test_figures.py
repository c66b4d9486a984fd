"""Measured figures come from one source, bench/results/latest.json: the
README's overhead table, docs/performance.md's summary and the man pages'
OVERHEAD sections are rendered from it, and are stale when they differ."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pstate.docs import docgen, figures, manprose

from conftest import ROOT

README = ROOT / "README.md"


@pytest.fixture(scope="module")
def results() -> dict:
    return figures.load(ROOT)


def test_generated_regions_are_fresh():
    stale = [p for p, text in figures.render_documents(ROOT).items() if (ROOT / p).read_text() != text]
    assert not stale, "stale: run `make artifacts`\n  " + "\n  ".join(stale)


def test_each_document_has_one_region():
    for path in figures.regions(figures.load(ROOT)):
        text = (ROOT / path).read_text()
        assert text.count(figures.BEGIN) == 1 and text.count(figures.END) == 1, path


def test_readme_table_is_the_results(results):
    text = README.read_text()
    record = results["storm"]["contenders"]["record"]["cpu_ratio"]
    row = next(line for line in text.splitlines() if line.startswith("| `pstate record` (every event)"))
    assert f"| {record['median']:.2f} ({record['min']:.2f}–{record['max']:.2f}) |" in row


def test_man_overhead_follows_the_results(results, monkeypatch):
    """Another results file gives other man pages: no figure is copied by hand."""
    changed = json.loads(json.dumps(results))
    changed["storm"]["contenders"]["record"]["cpu_ratio"]["median"] = 0.123
    changed["readers"]["readers"]["stats"]["events_per_cpu_s"] = 4_321_000
    monkeypatch.setattr(docgen, "_FIGURES", figures.overhead_figures(changed))
    pages = docgen.render_all()
    assert "kept 0.12 of its untraced throughput" in pages["man/pstate-record.1"]
    assert "4,320,000 events per CPU second" in pages["man/pstate-stats.1"]
    assert not hasattr(manprose, "OVERHEAD_FIGURES")


def test_region_is_replaced_whole():
    text = f"a\n{figures.BEGIN}\nold\nlines\n{figures.END}\nb\n"
    assert figures.fill_region(text, ["new"], "x.md") == f"a\n{figures.BEGIN}\nnew\n{figures.END}\nb\n"


@pytest.mark.parametrize("value,digits,text", [(1_644_674.6, 3, "1,640,000"), (2_959_284, 2, "3,000,000"),
                                               (188.4, 3, "188"), (0, 3, "0")])
def test_approx(value, digits, text):
    assert figures.approx(value, digits) == text


def test_kernel_series_never_names_the_release():
    assert figures.kernel_series("6.18.44-fc-v782") == "Linux 6.18"


def test_readme_is_short_and_undated():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    dates = re.findall(r"\b20\d\d-\d\d-\d\d\b", text)
    assert not dates, f"dated measurements belong in docs/performance.md: {dates}"


def test_machine_says_whether_it_was_virtual():
    m = {"ncpu": 8, "cpu_model": "Xeon", "kernel": "6.1.0-9-amd64"}
    assert figures.machine({"machine": {**m, "virt": "none"}}) == "an 8-CPU Xeon machine with Linux 6.1"
    assert figures.machine({"machine": {**m, "virt": "kvm"}}) == "an 8-CPU Xeon virtual machine with Linux 6.1"
    assert figures.machine({"machine": m}).endswith("virtual machine with Linux 6.1")

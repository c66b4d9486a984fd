"""bench/bench_kernel_cost.py --parts: the machinery that writes each part's
change into a copy of record's BPF C. The parts are experiments on the BPF
C of the revision they were written for (PARTS_FROM), never on bpf/: these
tests hold the machinery on texts of their own, so that bpf/ changes freely
(the bench itself stops, naming the part, when a text it changes is gone)."""

import importlib.util
import os

import pytest
from conftest import ROOT

ROOT = str(ROOT)


def _bench():
    path = os.path.join(ROOT, "bench", "bench_kernel_cost.py")
    spec = importlib.util.spec_from_file_location("bench_kernel_cost", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()
TEXT = "int a(void) {\n    one();\n    two();\n    three();\n}\n"


@pytest.fixture
def parts(monkeypatch):
    table = {
        "replace": ("record", "one becomes uno", [("    one();\n", "    uno();\n", None)]),
        "through": ("record", "one through three become none", [("    one();\n", "", "    three();\n")]),
        "of_text": ("record", "a function of the whole text", [("    two();\n", lambda t: f"    // {len(t)}\n", None)]),
        "gone": ("record", "a text that is not there", [("    four();\n", "", None)]),
        "twice": ("record", "a text that is there twice", [("();\n", "", None)]),
    }
    monkeypatch.setattr(BENCH, "PARTS", table)
    return table


def test_a_part_changes_its_text_once(parts):
    assert BENCH.part_source(TEXT, "replace") == TEXT.replace("one", "uno")
    assert BENCH.part_source(TEXT, "through") == "int a(void) {\n}\n"
    assert BENCH.part_source(TEXT, "of_text") == TEXT.replace("    two();\n", f"    // {len(TEXT)}\n")


@pytest.mark.parametrize("part", ["gone", "twice"])
def test_a_part_whose_text_is_not_there_once_stops_the_bench(parts, part):
    with pytest.raises(SystemExit) as e:
        BENCH.part_source(TEXT, part)
    assert f"--parts {part}:" in str(e.value) and "--parts-from" in str(e.value)


def test_parts_write_a_directory_each_from_the_copy_they_are_given(parts, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "record.bpf.c").write_text(TEXT)
    (src / "pstate.h").write_text("// the layout\n")
    del parts["gone"], parts["twice"]
    dirs = BENCH.part_dirs(str(src), str(tmp_path / "out"))
    assert sorted(dirs) == sorted(parts)
    for part, d in dirs.items():
        assert open(os.path.join(d, "record.bpf.c")).read() == BENCH.part_source(TEXT, part)
        assert open(os.path.join(d, "pstate.h")).read() == "// the layout\n"
    assert (src / "record.bpf.c").read_text() == TEXT  # the copy changes, never what it was taken from


def test_every_part_names_a_contender_and_its_changes():
    for part, (base, label, changes, *rest) in BENCH.PARTS.items():
        assert base in ("record", "record_min_dur") and label, part
        assert changes and all(len(c) == 3 for c in changes), part
        assert set(rest) <= {BENCH.UNREAD}, part
    assert len(BENCH.PARTS_FROM) >= 7

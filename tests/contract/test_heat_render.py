"""Golden renders of `pstate heat` (plain and colour, several widths) and unit
tests of the renderer. Regenerate the golden files after an intended change:

    PSTATE_REGEN=1 .venv/bin/python -m pytest -q tests/contract/test_heat_render.py
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from pstate.render import heatviews
from pstate.render import heatdraw as hr
from pstate.main import cli
from conftest import TESTS

HERE = TESTS
DATA = HERE / "data" / "heat"
GOLDEN = HERE / "golden" / "heat"
SMALL = str(DATA / "small.jsonl")
SNAPS = str(DATA / "snaps")
SNAPS_DELTA = str(DATA / "snaps-delta")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def visible(s: str) -> str:
    return ANSI.sub("", s)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("PSTATE_REGEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"no golden file {path}: run with PSTATE_REGEN=1"
    assert text == path.read_text(), f"{name} differs from its golden file (PSTATE_REGEN=1 to accept)"


def heat(*args, env=None):
    env = {"NO_COLOR": None, "COLORTERM": None, **(env or {})}
    return CliRunner().invoke(cli, ["heat", *args], env=env)


GOLDEN_CASES = {
    "state-w40.txt": [SMALL, "--width", "40"],
    "state-w80.txt": [SMALL, "--width", "80"],
    "state-w120.txt": [SMALL, "--width", "120"],
    "state-w80-256.ansi": [SMALL, "--width", "80", "--color", "256"],
    "state-w80-truecolor.ansi": [SMALL, "--width", "80", "--color", "truecolor"],
    "state-top3-w80.txt": [SMALL, "--width", "80", "--top", "3"],
    "state-by-pid-w80.txt": [SMALL, "--width", "80", "--by", "pid"],
    "state-by-comm-w80.txt": [SMALL, "--width", "80", "--by", "comm"],
    "state-bands-w80.txt": [SMALL, "--width", "80", "--bucket", "5ms"],
    "share-D-w80.txt": [SMALL, "--width", "80", "--shade", "D"],
    "share-D-w80-256.ansi": [SMALL, "--width", "80", "--shade", "D", "--color", "256"],
    "latency-runq-w80.txt": [SMALL, "--width", "80", "--latency"],
    "latency-runq-w40.txt": [SMALL, "--width", "40", "--latency=runq"],
    "latency-oncpu-w120.txt": [SMALL, "--width", "120", "--latency=oncpu"],
    "latency-oncpu-w80-truecolor.ansi": [SMALL, "--width", "80", "--latency=oncpu", "--color", "truecolor"],
    "latency-oncpu-h12-w80.txt": [SMALL, "--width", "80", "--height", "12", "--latency=oncpu"],
    "snaps-w80.txt": [SNAPS, "--width", "80"],
    "snaps-w40.txt": [SNAPS, "--width", "40"],
    "snaps-w80-256.ansi": [SNAPS, "--width", "80", "--color", "256"],
    "snaps-delta-D-w80.txt": [SNAPS_DELTA, "--width", "80", "--shade", "D"],
    "snaps-by-tid-w120.txt": [SNAPS, "--width", "120", "--by", "tid", "--shade", "uninterruptible"],
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden(name):
    r = heat(*GOLDEN_CASES[name])
    assert r.exit_code == 0, r.stderr
    check_golden(name, r.stdout)
    if name.endswith(".txt"):
        assert "\x1b" not in r.stdout
    else:
        assert ";48;" in r.stdout


@pytest.mark.parametrize("width", [40, 80, 120])
@pytest.mark.parametrize("mode", [[SMALL], [SMALL, "--shade", "D"], [SMALL, "--latency"], [SNAPS],
                                  [SMALL, "--by", "comm", "--latency=blocked"]])
@pytest.mark.parametrize("color", ["never", "256"])
def test_every_line_fits_the_width(width, mode, color):
    r = heat(*mode, "--width", str(width), "--color", color)
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert len(lines) > 5
    for line in lines:
        assert len(visible(line)) <= width, line


def test_map_uses_most_of_the_width():
    for width in (40, 80, 120):
        r = heat(SMALL, "--width", str(width))
        row = next(line for line in r.stdout.splitlines() if line.startswith("worker"))
        assert len(row) >= width * 0.85


def test_colour_only_on_a_terminal_and_never_with_no_color():
    assert hr.pick_style("auto", False, {}) == hr.PLAIN
    assert hr.pick_style("auto", True, {}) == hr.Style(True, False)
    assert hr.pick_style("auto", True, {"NO_COLOR": "1"}) == hr.PLAIN
    assert hr.pick_style("auto", True, {"TERM": "dumb"}) == hr.PLAIN
    assert hr.pick_style("auto", True, {"COLORTERM": "truecolor"}) == hr.Style(True, True)
    assert hr.pick_style("always", False, {"COLORTERM": "24bit"}) == hr.Style(True, True)
    assert hr.pick_style("never", True, {}) == hr.PLAIN
    assert hr.pick_style("256", False, {"COLORTERM": "truecolor"}) == hr.Style(True, False)
    r = heat(SMALL, "--width", "80", "--no-color", "--color", "always")
    assert "\x1b" not in r.stdout


def test_glyphs_are_distinct_ascii():
    glyphs = list(hr.GLYPHS.values())
    assert len(set(glyphs)) == len(glyphs)
    assert all(len(g) == 1 and 33 <= ord(g) < 127 for g in glyphs)
    assert hr.GLYPHS["running"] == "#" and hr.GLYPHS["uninterruptible"] == "D"
    assert hr.RAMP == " .:-=+*#%@"


@pytest.mark.parametrize("rgb,want", [((0, 0, 0), 16), ((255, 255, 255), 231), ((255, 0, 0), 196),
                                       ((0, 255, 0), 46), ((128, 128, 128), 244)])
def test_rgb_to_256(rgb, want):
    assert hr.rgb_to_256(*rgb) == want


def test_levels_linear_and_log():
    assert hr.level(None, 10, "linear") == 0 and hr.level(0, 10, "linear") == 0
    assert hr.level(10, 10, "linear") == 9 and hr.level(0.01, 10, "linear") == 1
    assert hr.level(1, 1000, "log") == 1 and hr.level(1000, 1000, "log") == 9
    assert hr.level(1, 1, "log") == 9
    # each legend entry's threshold maps to its own level
    for vmax in (1, 2, 3, 17, 1000, 123456):
        for lv, text in hr.scale_items(vmax, "log")[1:]:
            assert text.startswith(">=")
        levels = [lv for lv, _ in hr.scale_items(vmax, "log")]
        assert levels == sorted(set(levels))


def test_time_ticks():
    axis = heatviews.TimeAxis(0, 100 * 1_000_000)
    ticks = hr.time_ticks(axis, 60)
    assert ticks[0] == (0, "0", "left") and ticks[1] == (10, "1s", "left")
    ago = hr.time_ticks(heatviews.TimeAxis(0, 100 * 1_000_000, ago=True), 60)
    assert ago[0] == (59, "now", "right") and ago[1] == (49, "-1s", "right")
    lines = hr.axis_lines(ticks, 60, 3)
    assert lines[0].startswith("   +---------+") and lines[1].startswith("   0         1s")


def test_fit_label_keeps_the_id():
    assert hr.fit_label("kworker/u16:3-events_unbound 123456", 16) == "kworker/~ 123456"
    assert hr.fit_label("db 1", 8) == "db 1    "
    assert hr.fit_label("averyveryverylongname", 8) == "averyve~"


def test_nothing_to_show(tmp_path):
    f = tmp_path / "empty.jsonl"
    f.write_text('{"type":"meta","schema":1,"ts":5}\n')
    r = heat(str(f), "--width", "60")
    assert r.exit_code == 0
    assert r.stdout.startswith("No state transitions in the input\n(nothing to show)\n")
    r = heat(str(f), "--width", "60", "--latency")
    assert "no such durations in the input" in r.stdout.replace("\n", " ")


@pytest.mark.parametrize("name", sorted(n for n in GOLDEN_CASES if n.endswith(".ansi")))
def test_colour_maps_are_the_plain_maps_under_their_colours(name):
    """The same glyphs with and without colour: a colour-blind reader, a
    pasted capture or a --color never log sees the same map."""
    args = [a for a in GOLDEN_CASES[name]]
    i = args.index("--color")
    coloured = heat(*args)
    plain = heat(*args[:i], *args[i + 2:], "--color", "never")
    assert coloured.exit_code == plain.exit_code == 0
    assert visible(coloured.stdout) == plain.stdout


@pytest.mark.parametrize("color", ["never", "256"])
def test_live_final_frame(color):
    """The live map's last frame (its status line holds the time of day:
    left out), with the same glyphs in colour as without."""
    import sys as _sys

    _sys.path.insert(0, str(HERE))
    from test_heat_live import run_pipe

    style = hr.PLAIN if color == "never" else hr.Style(True, False)
    _res, text = run_pipe(Path(SMALL).read_bytes(), window_ns=1_000_000_000, style=style)
    frame = text.split("\n\n")[-1].splitlines()[:-1]
    check_golden(f"live-final-w80.{'txt' if color == 'never' else 'ansi'}", "\n".join(frame) + "\n")
    if color != "never":
        assert "\x1b[" in frame[1]
        _res, plain = run_pipe(Path(SMALL).read_bytes(), window_ns=1_000_000_000)
        assert [visible(x) for x in frame] == plain.split("\n\n")[-1].splitlines()[:-1]

"""`--help` is usage, options and examples (bcc's convention), at most 80
columns however wide the terminal, for pstate and every command of
main.py's table; the explanations are in the man pages, which man renders
without a warning at 80 columns."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from pstate.main import COMMANDS, cli

from conftest import ROOT

WIDTH = 80
NOTE_LINES = 5  # a short note after the examples (the glyphs, the privileges)


def help_text(name: str | None, columns: int) -> str:
    args = [name, "--help"] if name else ["--help"]
    r = CliRunner().invoke(cli, args, env={"COLUMNS": str(columns)}, prog_name="pstate", catch_exceptions=False)
    assert r.exit_code == 0 and r.stderr == "", r.output
    return r.stdout


@pytest.mark.parametrize("name", [None, *COMMANDS])
@pytest.mark.parametrize("columns", [40, 80, 300])
def test_help_fits_80_columns(name, columns):
    long = [line for line in help_text(name, columns).splitlines() if len(line) > WIDTH]
    assert long == []


@pytest.mark.parametrize("name", [None, *COMMANDS])
def test_help_is_usage_options_examples(name):
    text = help_text(name, 300)
    assert text.startswith(f"Usage: pstate{' ' + name if name else ''} ")
    sections = [line.strip() for line in text.splitlines() if re.fullmatch(r"\s{0,2}[A-Z][a-z]+:", line)]
    assert sections[-1] == "Examples:" and "Options:" in sections
    after = text.split("Examples:\n", 1)[1].split("\n\n", 1)
    notes = [line for line in (after[1] if len(after) > 1 else "").splitlines() if line.strip()]
    assert len(notes) <= NOTE_LINES, notes


def test_pstate_cmd_help_through_a_pipe():
    """As a user checks it: `pstate CMD --help | awk 'length > 80'` prints nothing."""
    exe = shutil.which("pstate", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("pstate is not installed beside this interpreter")
    for name in ["", *COMMANDS]:
        cmd = f"COLUMNS=300 {exe} {name} --help | awk 'length > {WIDTH}'"
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
        assert (r.stdout, r.returncode) == ("", 0), name


MAN_PAGES = sorted((ROOT / "man").iterdir())


@pytest.mark.skipif(shutil.which("man") is None, reason="man not installed")
@pytest.mark.parametrize("page", MAN_PAGES, ids=[p.name for p in MAN_PAGES])
def test_man_page_has_no_warnings(page):
    env = {**os.environ, "MANWIDTH": str(WIDTH), "MANPAGER": "cat", "PAGER": "cat", "LC_ALL": "C.UTF-8"}
    r = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True, text=True, env=env,
                       timeout=60)
    assert (r.returncode, r.stderr) == (0, "")

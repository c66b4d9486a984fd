"""Man pages and shell completions: generated from the click commands, committed,
kept fresh, valid roff, and completion that offers useful values."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import click

from pstate.commands.options import STATE_LETTERS, StateName
import pytest
from click.shell_completion import ShellComplete

from pstate.docs import docgen
from pstate.docs import formatprose, manprose
from pstate.stream import schema
from pstate import exitcodes
from pstate.exitcodes import ExitCode
from pstate.main import COMMANDS, cli
from conftest import ROOT

STALE = "man pages/completions are stale: run `make artifacts`"
HAVE_GROFF = shutil.which("groff") is not None
HAVE_MAN = shutil.which("man") is not None


def groff_warnings(path: Path) -> str:
    r = subprocess.run(["groff", "-man", "-ww", "-z", str(path)], capture_output=True, text=True,
                       env={**os.environ, "LC_ALL": "C.UTF-8"}, timeout=60)
    return r.stderr + ("" if r.returncode == 0 else f"(exit {r.returncode})")


def render_man(path: Path, width: int = 80) -> subprocess.CompletedProcess:
    env = {**os.environ, "MANWIDTH": str(width), "MANPAGER": "cat", "PAGER": "cat", "LC_ALL": "C.UTF-8"}
    return subprocess.run(["man", "-l", str(path)], capture_output=True, text=True, env=env, timeout=60)


# --- a command made for the generator: every kind of parameter ---------------------

FAKE_EPILOG = """\b
Examples:
  pstate fake -n 3 --format json     three, as JSON
  pstate fake a.jsonl b.jsonl        two files
  pstate fake --long-option-name-here value | pstate fake - --format text
      a pipe, described on its own line
  # described before
  pstate fake .dotfile

\b
A closing note with a 'quote, a back\\slash and -dashes.
"""


@click.command(epilog=FAKE_EPILOG)
@click.argument("files", nargs=-1, type=click.Path(allow_dash=True))
@click.option("-n", "--count", type=int, default=1, show_default=True, help="How many.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              help="Output format.")
@click.option("--color/--no-color", default=None, help="Colour or not.")
@click.option("-v", "--verbose", count=True, help="More output; repeat for more.")
@click.option("--state", "states", multiple=True, metavar="STATE", help="A state; repeatable.")
@click.option("--long-option-name-here", metavar="VALUE", help=".starts with a dot")
@click.option("--secret", hidden=True, help="Not for users.")
def fake(files, count, fmt, color, verbose, states, long_option_name_here, secret):
    """Do a fake thing with files.

    A second paragraph with \\backslashes, 'quotes, ≥ unicode and -dashes
    that wraps over lines. e.g. Not a sentence break.

    \b
      verbatim line one
    .line starting with a dot
    """


@pytest.fixture(scope="module")
def fake_page(tmp_path_factory) -> Path:
    text = docgen.command_page(docgen.root_context(), "fake", fake, "Fake things for tests.")
    path = tmp_path_factory.mktemp("fake") / "pstate-fake.1"
    path.write_text(text)
    return path


def test_fake_page_sections_and_escapes(fake_page):
    text = fake_page.read_text()
    lines = text.splitlines()
    assert lines[0].startswith('.\\" Generated')
    assert lines[2] == '.TH PSTATE\\-FAKE 1 "%s" "pstate %s" "pstate manual"' % (
        docgen.RELEASES[docgen.__version__], docgen.__version__.replace("-", "\\-"))
    for sec in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXAMPLES", '"EXIT STATUS"', '"SEE ALSO"'):
        assert f".SH {sec}" in lines
    assert "pstate\\-fake \\- fake things for tests" in lines
    # synopsis from the params, hidden ones left out
    assert "[\\fB\\-n\\fR\\ \\fIINTEGER\\fR]" in lines
    assert "[\\fB\\-\\-format\\fR\\ {\\fItext\\fR|\\:\\fIjson\\fR}]" in lines  # \\: a break point
    assert "[\\fB\\-\\-color\\fR|\\fB\\-\\-no\\-color\\fR]" in lines
    assert "[\\fB\\-v\\fR]..." in lines
    assert "[\\fB\\-\\-state\\fR\\ \\fISTATE\\fR]..." in lines
    assert "[\\fIFILES\\fR]..." in lines
    assert "secret" not in text
    # options with their help and click's extras
    i = lines.index("\\fB\\-n\\fR, \\fB\\-\\-count\\fR \\fIINTEGER\\fR")
    assert lines[i - 1] == ".TP" and lines[i + 1] == "How many. [default: 1]"
    assert "\\fB\\-\\-color\\fR / \\fB\\-\\-no\\-color\\fR" in lines
    # roff escapes: backslash, leading dot and quote, hyphens, non-ASCII
    assert "\\&.starts with a dot" in lines
    assert ("A second paragraph with \\ebackslashes, 'quotes, \\(>= unicode and \\-dashes "
            "that wraps over lines. e.g. Not a sentence break.") in lines
    assert "\\&.line starting with a dot" in lines
    assert lines[lines.index("\\&.line starting with a dot") - 1] == "  verbatim line one"
    requests = {".TH", ".SH", ".SS", ".PP", ".TP", ".IP", ".RS", ".RE", ".nf", ".fi", ".sp", ".br",
                ".SY", ".YS", ".na", ".ad", '.\\"'}
    assert not [x for x in lines if x.startswith("'") or (x.startswith(".") and x.split()[0] not in requests)]


def test_fake_page_examples(fake_page):
    lines = fake_page.read_text().splitlines()
    ex = lines[lines.index(".SH EXAMPLES"):lines.index('.SH "EXIT STATUS"')]
    cmd = docgen.command_text
    assert ex[1:5] == [".na", ".TP", cmd("pstate fake -n 3 --format json"), "three, as JSON"]
    assert ex[-1] == ".ad"
    assert cmd("pstate fake -n 3") == "\\fB\\%pstate \\%fake \\%\\-n \\%3\\fR"
    i = ex.index(cmd("pstate fake --long-option-name-here value | pstate fake - --format text"))
    assert ex[i + 1] == "a pipe, described on its own line"
    i = ex.index(cmd("pstate fake .dotfile"))
    assert ex[i + 1] == "described before"
    assert "A closing note with a 'quote, a back\\eslash and \\-dashes." in ex


def test_exit_status_lists_generic_and_command_codes():
    out = docgen.exit_status_section({ExitCode.LOSS: "lost events"}, {ExitCode.IOERR})
    assert out == ['.SH "EXIT STATUS"',
                   ".TP", "\\fB0\\fR", "Success.",
                   ".TP", "\\fB2\\fR", *docgen.fill(exitcodes.MEANINGS[ExitCode.USAGE]),
                   ".TP", "\\fB3\\fR", "lost events",
                   ".TP", "\\fB74\\fR", "Writing the output failed."]


def test_every_exit_code_and_state_category_is_described():
    assert set(exitcodes.MEANINGS) == set(ExitCode)
    assert {cat for _l, cat, _d in schema.STATES.values()} <= set(formatprose.STATE_CATEGORIES)
    assert set(manprose.PAGES) <= {"pstate", *COMMANDS}


def test_every_overhead_figure_is_quoted():
    texts = [page.get("overhead", "") for page in manprose.PAGES.values()]
    unused = [k for k in docgen.overhead_figures() if not any("{%s}" % k in t for t in texts)]
    assert not unused


def test_page_does_not_depend_on_terminal_width(monkeypatch, fake_page):
    monkeypatch.setenv("COLUMNS", "37")
    again = docgen.command_page(docgen.root_context(), "fake", fake, "Fake things for tests.")
    assert again == fake_page.read_text()


@pytest.mark.skipif(not HAVE_GROFF, reason="groff not installed")
def test_fake_page_is_clean_roff(fake_page):
    assert groff_warnings(fake_page) == ""


@pytest.mark.skipif(not HAVE_MAN, reason="man not installed")
def test_fake_page_renders(fake_page):
    r = render_man(fake_page)
    assert r.returncode == 0, r.stderr
    assert ("pstate fake [-n INTEGER] [--format {text|json}] [--color|--no-color] [-v]... "
            "[--state STATE]... [--long-option-name-here VALUE] [-h] [FILES]...") in " ".join(r.stdout.split())
    assert "A closing note with a 'quote, a back\\slash and -dashes." in " ".join(r.stdout.split())


def test_events_page_covers_every_record_field_and_state():
    text = docgen.events_page()
    for rtype, (_desc, fields) in schema.RECORDS.items():
        assert f".SS {rtype}" in text
        for field in fields:
            assert f"\\fB{docgen.esc(field)}\\fR (" in text
    for name in schema.STATES:
        assert f".TP\n\\fB{name}\\fR (" in text
    for cause in schema.CAUSES:
        assert f"\\fB{cause}\\fR" in text
    for field in ("interval_start_ts", "start_ts", "state_since_ts", "nvcsw", "running_ns", "unknown_ns"):
        assert field in text


# --- the real commands: these need every command module to import -----------------

@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    files = docgen.render_all()
    out = tmp_path_factory.mktemp("artifacts")
    docgen.write_all(out, files)
    return out, files


def test_committed_artifacts_are_fresh(rendered):
    out, files = rendered
    stale = [p for p in files
             if not (ROOT / p).is_file() or (ROOT / p).read_bytes() != (out / p).read_bytes()]
    leftover = [p for p in docgen.stale_files(ROOT, files) if p not in files]
    assert not stale and not leftover, f"{STALE}\n  " + "\n  ".join(stale + leftover)


def test_generation_is_byte_stable(rendered):
    _out, files = rendered
    assert docgen.render_all() == files


def test_nothing_machine_specific_in_artifacts(rendered):
    _out, files = rendered
    uname = os.uname()
    local = {uname.nodename, uname.release, str(Path.home()), str(ROOT), f"default: {os.cpu_count()}]"}
    found = {p: [x for x in local if len(x) > 3 and x in text] for p, text in files.items()}
    assert not {p: x for p, x in found.items() if x}


def test_check_names_the_refresh_command(tmp_path, rendered):
    cmd = [sys.executable, "-m", "pstate.docs.docgen", "--check", "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert STALE in r.stderr and "man/pstate-record.1" in r.stderr
    docgen.write_all(tmp_path, rendered[1])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stderr) == (0, "")


def test_every_page_and_completion_is_generated(rendered):
    _out, files = rendered
    assert sorted(files) == sorted(
        ["man/pstate.1", "man/pstate-events.5", *(f"man/pstate-{c}.1" for c in COMMANDS),
         "completions/pstate.bash", "completions/_pstate", "completions/pstate.fish"])
    assert files["completions/_pstate"].startswith("#compdef pstate")
    assert "_PSTATE_COMPLETE=bash_complete" in files["completions/pstate.bash"]


@pytest.mark.skipif(not HAVE_GROFF, reason="groff not installed")
def test_pages_are_clean_roff(rendered):
    out, files = rendered
    noisy = {p: w for p in files if p.startswith("man/") and (w := groff_warnings(out / p))}
    assert not noisy


@pytest.mark.parametrize("shell,path", [(sh, p) for sh, p in docgen.COMPLETIONS.items()])
def test_completion_script_parses(shell, path):
    if not shutil.which(shell):
        pytest.skip(f"{shell} not installed")
    r = subprocess.run([shell, "-n", str(ROOT / path)], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (0, "")


@pytest.mark.skipif(not HAVE_MAN, reason="man not installed")
def test_man_renders_record_page():
    r = render_man(ROOT / "man" / "pstate-record.1")
    assert r.returncode == 0 and r.stderr == ""
    text = " ".join(r.stdout.split())
    for heading in ("NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXAMPLES", "EXIT STATUS", "SEE ALSO"):
        assert heading in r.stdout
    assert "pstate record [-p PID]..." in text


@pytest.mark.parametrize("name", ["pstate", *COMMANDS])
def test_help_ends_with_examples(name):
    cmd = cli if name == "pstate" else cli.get_command(click.Context(cli), name)
    assert cmd.epilog and "Examples:" in cmd.epilog, f"{name}: no Examples: block in its epilog"
    assert docgen.parse_examples(cmd.epilog)[0][0] == "examples"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_subcommand_page_has_options_of_its_command(name):
    page = docgen.subcommand_page(docgen.root_context(), name, COMMANDS[name][1])
    cmd = cli.get_command(click.Context(cli), name)
    for param in cmd.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert docgen.bold(param.opts[-1]) in page, param.opts


# --- completion --------------------------------------------------------------------

def complete(words: str) -> list[str]:
    """Run the program as bash's completion function does; lines of type,value."""
    cword = len(words.split(" ")) - 1
    env = {**os.environ, "COMP_WORDS": words, "COMP_CWORD": str(cword),
           "_PSTATE_COMPLETE": "bash_complete"}
    r = subprocess.run([sys.executable, "-m", "pstate"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout.splitlines()


def test_completes_subcommands():
    assert complete("pstate ") == [f"plain,{name}" for name in COMMANDS]


def test_completes_state_names():
    got = complete("pstate record --state ")
    for name in ("running", "preempted", "sleeping", "uninterruptible", "stopped", "zombie"):
        assert f"plain,{name}" in got
    assert complete("pstate record --state unin") == ["plain,uninterruptible"]


def test_completes_options():
    assert "plain,--duration" in complete("pstate record --")


def _in_process(args: list[str], incomplete: str):
    comp = ShellComplete(cli, {}, "pstate", "_PSTATE_COMPLETE")
    return comp.get_completions(args, incomplete)


def _option_cases():
    for name in COMMANDS:
        try:
            cmd = cli.get_command(click.Context(cli), name)
        except ImportError:
            continue
        for p in cmd.params:
            if isinstance(p, click.Option) and not p.hidden and not p.is_flag:
                if isinstance(p.type, (click.Choice, click.Path)):
                    yield pytest.param(name, p.opts[-1], p.type, id=f"{name} {p.opts[-1]}")


@pytest.mark.parametrize("name,opt,typ", list(_option_cases()))
def test_option_values_complete(name, opt, typ):
    items = _in_process([name, opt], "")
    if isinstance(typ, click.Choice):
        fold = (lambda v: v) if typ.case_sensitive else str.lower
        got = [fold(i.value) for i in items]
        want = [fold(str(c)) for c in typ.choices]
        if isinstance(typ, StateName):  # the kernel letters follow the names, as they are
            got, want = got[:len(want)] + [i.value for i in items[len(want):]], want + list(STATE_LETTERS)
        assert got == want
    else:
        assert [i.type for i in items] == ["dir" if typ.dir_okay and not typ.file_okay else "file"]


def test_exit_status_comes_from_exitcodes_only():
    """Every code has one meaning in exitcodes.MEANINGS; a command's own
    notes (exitcodes.BY_COMMAND) are for commands that exist, and the man
    pages' prose names no exit code."""
    assert set(exitcodes.MEANINGS) == set(ExitCode) and all(exitcodes.MEANINGS.values())
    assert set(exitcodes.BY_COMMAND) <= set(COMMANDS)
    for notes in exitcodes.BY_COMMAND.values():
        assert set(notes) <= set(ExitCode) and all(notes.values())
    assert all("exit_status" not in page for page in manprose.PAGES.values())


@pytest.mark.parametrize("page", ["pstate", "record", "snap", "stats", "heat", "replay"])
def test_pages_say_their_caveats(page):
    name = "pstate.1" if page == "pstate" else f"pstate-{page}.1"
    text = (ROOT / "man" / name).read_text()
    assert '.SH CAVEATS' in text and text.index(".SH CAVEATS") < text.index('.SH "SEE ALSO"')

"""`make install`: pstate, its man pages and completions land where the system
looks for them, with PREFIX and DESTDIR honoured."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pstate import __version__
from pstate.main import COMMANDS
from conftest import ROOT

BASH_COMPLETION = Path("/usr/share/bash-completion/bash_completion")

pytestmark = [
    pytest.mark.slow,  # each install builds a venv and a wheel: about 15 s
    pytest.mark.serial,  # make install rebuilds the checkout's build/: one install at a time
    pytest.mark.skipif(not (shutil.which("make") and Path("/usr/bin/python3").exists()),
                       reason="needs make and /usr/bin/python3"),
]

INSTALLED = [
    "bin/pstate",
    "lib/pstate/bin/pstate",
    "share/man/man1/pstate.1",
    *(f"share/man/man1/pstate-{name}.1" for name in COMMANDS),
    "share/man/man5/pstate-events.5",
    "share/bash-completion/completions/pstate",
    "share/zsh/site-functions/_pstate",
    "share/fish/vendor_completions.d/pstate.fish",
    "share/pstate/grafana/pstate-dashboard.json",
    "lib/systemd/system/pstate-collector.service",
    "lib/systemd/system/pstate-snap.service",
    "lib/systemd/system/pstate-snap.timer",
    "share/doc/pstate/pstate-snap.cron",
]
UNITS = INSTALLED[-4:]


def make_install(**variables: str) -> None:
    args = ["make", "-C", str(ROOT), "install", *(f"{k}={v}" for k, v in variables.items())]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, f"make install failed:\n{r.stdout}\n{r.stderr}"


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    """A package-style install: DESTDIR staging, final PREFIX /usr."""
    dest = tmp_path_factory.mktemp("destdir")
    make_install(DESTDIR=str(dest), PREFIX="/usr")
    return dest


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    """A real install into a PREFIX of its own, to run it from there."""
    pfx = tmp_path_factory.mktemp("prefix") / "usr"
    make_install(PREFIX=str(pfx))
    return pfx


def run(cmd: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "LC_ALL": "C.UTF-8", **env})


def test_destdir_puts_everything_under_prefix(staged):
    usr = staged / "usr"
    missing = [p for p in INSTALLED if not (usr / p).exists()]
    assert not missing
    assert os.readlink(usr / "bin/pstate") == "../lib/pstate/bin/pstate"
    # the venv is made for its final place, not the staging directory
    assert (usr / "lib/pstate/bin/pstate").read_text().splitlines()[0] == "#!/usr/lib/pstate/bin/python"
    # no staged file names the staging directory or the clone it was built
    # from: not a script, not byte code, no direct_url.json
    leaks = [f for f in staged.rglob("*") if f.is_file() and not f.is_symlink()
             and (str(staged).encode() in f.read_bytes() or str(ROOT).encode() in f.read_bytes())]
    assert leaks == []
    assert list(staged.rglob("direct_url.json")) == []
    assert list(staged.rglob("*.pyc")), "byte code is compiled for the final paths"
    assert "include-system-site-packages = true" in (usr / "lib/pstate/pyvenv.cfg").read_text()
    # the private venv holds pstate and its dependencies, not pip or setuptools
    site = next((usr / "lib/pstate/lib").glob("python3*/site-packages"))
    assert not [p.name for p in site.iterdir() if p.name.split("-")[0] in ("pip", "setuptools", "_distutils_hack")]
    assert (usr / "share/doc/pstate/LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    r = run([str(usr / "lib/pstate/bin/python"), "-m", "pstate", "--version"])
    assert r.stdout == f"pstate, version {__version__}\n"
    for p in UNITS:  # the collector's units and crontab, naming the installed command
        text = (usr / p).read_text()
        assert "@BINDIR@" not in text and ("/usr/bin/pstate snap --" in text or p.endswith(".timer")), p
    unit = (usr / "lib/systemd/system/pstate-collector.service").read_text()
    assert "ExecStart=/usr/bin/pstate snap --start --quiet" in unit and "ExecStop=/usr/bin/pstate snap --stop" in unit
    for p in INSTALLED[2:-len(UNITS)]:
        assert (usr / p).read_bytes() == (ROOT / {
            "share/bash-completion/completions/pstate": "completions/pstate.bash",
            "share/zsh/site-functions/_pstate": "completions/_pstate",
            "share/fish/vendor_completions.d/pstate.fish": "completions/pstate.fish",
            "share/pstate/grafana/pstate-dashboard.json": "cli/share/grafana/pstate-dashboard.json",
        }.get(p, "man/" + Path(p).name)).read_bytes()


def test_installed_pstate_runs(prefix):
    r = run([str(prefix / "bin/pstate"), "--help"])
    assert r.returncode == 0 and "Examples:" in r.stdout
    assert run([str(prefix / "bin/pstate"), "-V"]).stdout == f"pstate, version {__version__}\n"


@pytest.mark.skipif(not shutil.which("man"), reason="man not installed")
def test_man_finds_the_installed_pages(prefix):
    manpath = str(prefix / "share/man")
    assert run(["man", "-w", "pstate"], MANPATH=manpath).stdout.strip() == f"{manpath}/man1/pstate.1"
    assert run(["man", "-w", "pstate-record"], MANPATH=manpath).stdout.strip().endswith("man1/pstate-record.1")
    assert run(["man", "-w", "5", "pstate-events"], MANPATH=manpath).stdout.strip().endswith("man5/pstate-events.5")
    r = run(["man", "pstate"], MANPATH=manpath, MANPAGER="cat", PAGER="cat", MANWIDTH="80")
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.startswith("PSTATE(1)") and "pstate-record(1)" in r.stdout


COMPLETE = r"""
source "$1"
complete -p pstate
shift
COMP_WORDS=("$@")
COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
COMPREPLY=()
_pstate_completion pstate
printf '%s\n' "${COMPREPLY[@]}"
"""


def bash_complete(prefix: Path, *words: str) -> list[str]:
    """Load the installed bash completion as bash-completion would, press TAB
    after `words` (the last one being the word under the cursor)."""
    script = prefix / "share/bash-completion/completions/pstate"
    r = run(["bash", "--norc", "--noprofile", "-c", COMPLETE, "bash", str(script), *words],
            PATH=f"{prefix / 'bin'}:{os.environ['PATH']}")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "complete -o nosort -F _pstate_completion pstate"
    return lines[1:]


def test_bash_completes_subcommands(prefix):
    assert bash_complete(prefix, "pstate", "") == list(COMMANDS)
    assert bash_complete(prefix, "pstate", "st") == ["stats"]


def test_bash_completes_options_and_values(prefix):
    assert "--duration" in bash_complete(prefix, "pstate", "record", "--")
    assert bash_complete(prefix, "pstate", "record", "--state", "unin") == ["uninterruptible"]


@pytest.mark.skipif(not BASH_COMPLETION.exists(), reason="bash-completion not installed")
def test_bash_completion_loads_on_demand(prefix):
    # bash-completion looks in $XDG_DATA_DIRS/bash-completion/completions
    # (/usr/local/share and /usr/share by default, i.e. the standard PREFIXes).
    script = f'source {BASH_COMPLETION}; __load_completion pstate && complete -p pstate'
    r = run(["bash", "--norc", "--noprofile", "-c", script], PATH=f"{prefix / 'bin'}:{os.environ['PATH']}",
            XDG_DATA_DIRS=f"{prefix / 'share'}:/usr/local/share:/usr/share")
    assert "_pstate_completion" in r.stdout, r.stderr


def install_dir(kind: str, **variables: str) -> str:
    args = ["make", "-s", "-C", str(ROOT), "print-install-dirs", *(f"{k}={v}" for k, v in variables.items())]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    out = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env, check=True).stdout
    return dict(line.split(" ", 1) for line in out.splitlines())[kind]


@pytest.mark.skipif(not shutil.which("fish"), reason="fish not installed")
@pytest.mark.parametrize("prefix_dir", ["/usr", "/usr/local"])
def test_fish_looks_where_completions_are_installed(prefix_dir, tmp_path):
    """With a clean environment (XDG_DATA_DIRS unset), fish's completion path
    holds the directory `make install` uses for the standard prefixes."""
    target = install_dir("fish_completions", PREFIX=prefix_dir)
    r = subprocess.run(["env", "-i", f"HOME={tmp_path}", "PATH=/usr/bin:/bin", "fish", "-c",
                        "string join \\n -- $fish_complete_path"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert target in r.stdout.splitlines()


def test_fish_completions_under_another_prefix_go_below_it():
    assert install_dir("fish_completions", PREFIX="/opt/pstate") == "/opt/pstate/share/fish/vendor_completions.d"

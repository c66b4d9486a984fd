"""The sdist and the wheel, built as a distribution packager builds them: with
the distribution's own setuptools (Debian 12: 66), offline, from the tracked
files. The sdist must hold what a packager builds and tests from; both carry
the licence."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT

SYSTEM_PYTHON = Path("/usr/bin/python3")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not SYSTEM_PYTHON.exists() or not shutil.which("git"),
                       reason="needs the distribution's python3 and git"),
]

BUILD = """
import sys
from setuptools import build_meta, __version__
print(__version__)
print(getattr(build_meta, "build_" + sys.argv[1])(sys.argv[2]))
"""


def build(kind: str, src: Path, out: Path) -> Path:
    r = subprocess.run([str(SYSTEM_PYTHON), "-c", BUILD, kind, str(out)], cwd=src, capture_output=True,
                       text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(out), "LC_ALL": "C.UTF-8"})
    assert r.returncode == 0, r.stderr
    return out / r.stdout.splitlines()[-1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """An sdist of the tracked files (a clean checkout's content)."""
    src = tmp_path_factory.mktemp("checkout")
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    return build("sdist", src, tmp_path_factory.mktemp("sdist"))


def test_sdist_holds_what_a_packager_needs(sdist):
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
        pkg_info = tf.extractfile(next(n for n in tf.getnames() if n.endswith("/PKG-INFO"))).read().decode()
    tracked = subprocess.run(["git", "ls-files", "man", "completions", "tests", "bpf", "cli", ".ci"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    missing = sorted(set(tracked + ["LICENSE", "Makefile", "README.md", "pyproject.toml", "setup.py"]) - names)
    assert missing == []
    assert "License: Apache-2.0" in pkg_info
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".so"))]


def test_wheel_from_the_sdist_carries_the_licence(sdist, tmp_path):
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp_path)
    src = next(tmp_path.glob("pstate-*"))
    wheel = build("wheel", src, tmp_path / "wheel")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        lic = next(n for n in names if n.endswith(".dist-info/LICENSE"))
        assert zf.read(lic) == (ROOT / "LICENSE").read_bytes()
    assert "pstate/bpf/record.bpf.c" in names

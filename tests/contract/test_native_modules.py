"""Every C extension in cli/pstate/ is built and imports. Locally a missing
compiler only makes pstate slower (the pure-Python twins take over), but CI
must test the native paths, not fall back to the pure ones quietly."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pstate import native

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
SOURCES = sorted(p.stem for p in (Path(native.__file__).parent).glob("_*.c"))


def test_there_are_native_modules():
    assert SOURCES == ["_digest", "_encode"]


@pytest.mark.parametrize("name", SOURCES)
def test_native_module_imports(name):
    if native.PURE:
        pytest.skip("PSTATE_PURE is set")
    mod = native.load(name)
    if mod is None and not IN_CI:
        pytest.skip(f"pstate.{name} not built (no C compiler or Python headers?)")
    assert mod is not None, f"pstate.{name} did not build or import: `pip install -e .` needs gcc and python3-dev"


def test_pure_switch(monkeypatch):
    monkeypatch.setattr(native, "PURE", True)
    assert native.load("_digest") is None

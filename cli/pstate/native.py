"""Optional native speed-ups: the C extensions setup.py builds (pstate._*).

Each has a pure-Python twin that gives the same output; the native one is
used when it was built and imports. PSTATE_PURE=1 in the environment turns
them all off (for comparison and debugging).
"""

from __future__ import annotations

import importlib
import os

PURE = os.environ.get("PSTATE_PURE", "").strip() not in ("", "0")


def load(name: str):
    """The extension module pstate.<name>, or None (not built, or PURE)."""
    if PURE:
        return None
    try:
        return importlib.import_module(f"pstate.{name}")
    except ImportError:
        return None

"""The package's layout as the README describes it: one line per subpackage
(its __init__ docstring), listed bottom up, and no import from a subpackage
to one listed after it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "cli" / "pstate"
README = (ROOT / "README.md").read_text()


def listed() -> list[tuple[str, str]]:
    section = README[README.index("## Layout"):README.index("## The pipeline")]
    return re.findall(r"^- `(\w+)/`: (.+)$", section, re.M)


def subpackages() -> dict[str, str]:
    return {d.name: ast.get_docstring(ast.parse((d / "__init__.py").read_text())) or ""
            for d in sorted(PKG.iterdir()) if (d / "__init__.py").is_file()}


def test_readme_names_every_subpackage_with_its_docstring():
    assert sorted(listed()) == sorted(subpackages().items())


def test_no_import_reaches_a_subpackage_listed_later():
    rank = {name: i for i, (name, _doc) in enumerate(listed())}
    wrong = []
    for name in rank:
        for path in (PKG / name).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                targets = []
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pstate"):
                    parts = node.module.split(".")
                    targets = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
                elif isinstance(node, ast.Import):
                    targets = [a.name.split(".")[1] for a in node.names if a.name.startswith("pstate.")]
                wrong += [f"{path.relative_to(PKG)} imports {t}" for t in targets
                          if t in rank and rank[t] > rank[name]]
    assert wrong == []


def test_no_module_grows_past_its_jobs():
    """About 600 lines at most for a module (the generated and native ones aside)."""
    big = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if len(p.read_text().splitlines()) > 700]
    assert big == []

"""The package's layout as the README describes it: one line per subpackage
(its __init__ docstring), listed bottom up, and no import from a subpackage
to one listed after it."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from conftest import ROOT

PKG = ROOT / "cli" / "pstate"
README = (ROOT / "README.md").read_text()


def listed() -> list[tuple[str, str]]:
    start = README.index("## Layout")
    end = README.find("\n## ", start)
    section = README[start:end if end > 0 else None]
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


COMMAND_MAX_LINES = 250  # options, their checks, one engine call and its exit status
COMMANDS = PKG / "commands"
ENGINES = PKG / "engines"


def command_modules() -> list[Path]:
    from pstate.main import COMMANDS as TABLE

    return [COMMANDS / f"{module}.py" for module, _summary in TABLE.values()]


def test_command_modules_stay_thin():
    """A command module declares its options, checks them, calls its engine
    and exits with what it returns: the work is in engines/."""
    big = {p.name: n for p in command_modules() if (n := len(p.read_text().splitlines())) > COMMAND_MAX_LINES}
    assert big == {}


def test_each_command_calls_exactly_one_engine_entry():
    """One `from pstate.engines.<module> import <entry>` per command module,
    nothing else of engines/, and the entry a function of that module."""
    import importlib

    wrong = {}
    for path in command_modules():
        imports = [node for node in ast.walk(ast.parse(path.read_text()))
                   if (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pstate.engines"))
                   or (isinstance(node, ast.Import) and any(a.name.startswith("pstate.engines") for a in node.names))]
        entries = [(node.module, a.name) for node in imports if isinstance(node, ast.ImportFrom) for a in node.names]
        if len(imports) != 1 or len(entries) != 1 or entries[0][0].count(".") != 2:
            wrong[path.name] = entries or "no engine"
            continue
        module, name = entries[0]
        if not callable(getattr(importlib.import_module(module), name, None)):
            wrong[path.name] = f"{module}.{name} is not a function"
    assert wrong == {}


def test_no_command_module_imports_another():
    """Of commands/, a command module imports only options.py (the option
    bundles several share); what two commands share is below, in engines/
    or a layer under it."""
    wrong = []
    for path in command_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pstate.commands") \
                    and node.module != "pstate.commands.options":
                wrong.append(f"{path.name} imports {node.module}")
    assert wrong == []

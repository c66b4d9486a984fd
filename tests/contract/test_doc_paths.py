"""Every repository path named in the README, docs/, the man pages and the
comments and docstrings of the C and Python sources exists: a file moved or
renamed takes the texts that name it along. A path is a word that starts
with one of the repository's top directories (cli/, bpf/, tests/, bench/,
docs/, man/, completions/), or with pstate/ (the import package, under
cli/)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from conftest import ROOT

TOPS = ("cli", "bpf", "tests", "bench", "docs", "man", "completions", "pstate")
PATH = re.compile(r"(?<![\w./$-])((?:%s)/[\w.*/-]*[\w*])" % "|".join(TOPS))
# Paths that need not be in a checkout, and why.
ALLOWED = {"bench/.cache": "made by the benchmarks, git-ignored"}
# Words that look like paths and are prose.
NOT_PATHS = {"man/completion": "docs/architecture.md: \"man/completion text\", man pages and completions"}
# Trees the scan skips: generated, vendored or test input.
SKIP = ("tests/data/", "tests/golden/", ".venv/", "build/")


def exists(path: str) -> bool:
    path = path.rstrip(".")
    if path in ALLOWED:
        return True
    candidates = [ROOT / path] + ([ROOT / "cli" / path] if path.startswith("pstate/") else [])
    if "*" in path:
        return any(list(ROOT.glob(str(c.relative_to(ROOT)))) for c in candidates)
    return any(c.exists() for c in candidates)


def python_prose(text: str) -> str:
    """The comments and docstrings of a Python source."""
    parts = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            parts.append(tok.string)
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node) or "")
    return "\n".join(parts)


def c_prose(text: str) -> str:
    """The comments of a C source."""
    return "\n".join(m.group(0) for m in re.finditer(r"/\*.*?\*/|//[^\n]*", text, re.S))


def roff_text(text: str) -> str:
    """A man page's words: escapes and font changes taken out."""
    text = re.sub(r"\\f[BIRP]", "", text)
    return text.replace("\\-", "-").replace("\\&", "").replace("\\%", "").replace("\\:", "")


def sources() -> dict[str, str]:
    """Each scanned file (relative path) -> the text in which paths count."""
    out = {"README.md": (ROOT / "README.md").read_text()}
    for path in sorted((ROOT / "docs").glob("*.md")):
        out[str(path.relative_to(ROOT))] = path.read_text()
    for path in sorted((ROOT / "man").iterdir()):
        out[str(path.relative_to(ROOT))] = roff_text(path.read_text())
    for pattern, prose in (("**/*.py", python_prose), ("**/*.c", c_prose), ("**/*.h", c_prose)):
        for path in sorted(ROOT.glob(pattern)):
            rel = str(path.relative_to(ROOT))
            if not rel.startswith(SKIP):
                out[rel] = prose(path.read_text())
    return out


def test_every_named_path_exists():
    missing = sorted({f"{src}: {p}" for src, text in sources().items() for p in PATH.findall(text)
                      if p not in NOT_PATHS and not exists(p)})
    assert missing == []


def test_the_scan_finds_paths():
    """The scan sees what it should: a stale path in each kind of text."""
    assert PATH.findall("see `cli/pstate/reader.py` and pstate/filtermaps.py.") == \
        ["cli/pstate/reader.py", "pstate/filtermaps.py"]
    assert not exists("cli/pstate/reader.py") and not exists("pstate/filtermaps.py")
    assert exists("pstate/kernel/filtermaps.py") and exists("bench/results/*.json")
    assert PATH.findall("/sys/fs/bpf/pstate/snap DIR/pstate-snap-x $PREFIX/share/pstate/x") == []
    assert "bpf/x.h" in python_prose("# bpf/x.h\nx = 'bpf/y.h'\n")
    assert "bpf/y.h" not in python_prose("# bpf/x.h\nx = 'bpf/y.h'\n")
    assert c_prose("int a; /* tests/x.py */ // bench/y.py\n").count("/") == 6

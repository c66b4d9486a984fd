"""Find a kernel header tree for BCC's run-time compiler.

Order: an explicit tree (--kernel-headers / PSTATE_KERNEL_HEADERS, or a
BCC_KERNEL_SOURCE already set), the running kernel's
/lib/modules/$(uname -r)/build, else an installed distribution tree.

A distribution tree of another kernel version is good enough because pstate's
BPF programs read tracepoint arguments only, never a kernel struct: BCC takes
the argument layout from the running kernel's tracefs format files, and the
headers only have to define the basic types and helpers. Debian splits one
tree into linux-headers-<ver>-common and linux-headers-<ver>-<arch>; BCC
wants one directory, so the two are merged into a cached tree of symlinks.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass

CACHE_ROOT = "/var/cache/pstate/kernel-headers"
SRC_ROOT = "/usr/src"
_MARK = ".pstate-merged"


@dataclass
class HeaderTree:
    path: str  # directory to hand to BCC (BCC_KERNEL_SOURCE)
    origin: str  # "explicit", "running kernel", "distribution (merged)", "distribution"
    detail: str = ""  # e.g. which distribution trees were merged

    def describe(self) -> str:
        return f"{self.path} ({self.origin}{': ' + self.detail if self.detail else ''})"


class HeadersNotFound(Exception):
    pass


def _usable(tree: str) -> bool:
    return os.path.isdir(os.path.join(tree, "include")) and os.path.isdir(os.path.join(tree, "arch"))


def _version_key(name: str):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


def _companion(tree: str) -> str | None:
    """The common tree an arch tree includes (Debian: "include <dir>/Makefile")."""
    try:
        with open(os.path.join(tree, "Makefile")) as f:
            text = f.read(4096)
    except OSError:
        return None
    m = re.search(r"^include\s+(\S+)/Makefile\s*$", text, re.M)
    if m and os.path.isdir(m.group(1)):
        return os.path.realpath(m.group(1))
    return None


def distribution_trees(src_root: str = SRC_ROOT) -> list[tuple[str, str | None]]:
    """(arch tree, common tree or None) pairs, newest first."""
    try:
        names = sorted(os.listdir(src_root), key=_version_key, reverse=True)
    except OSError:
        return []
    out = []
    for name in names:
        if not name.startswith("linux-headers-"):
            continue
        tree = os.path.join(src_root, name)
        if not os.path.isdir(os.path.join(tree, "include", "generated")):
            continue  # a common tree, used as a companion
        out.append((tree, _companion(tree)))
    return out


def _merge(dst: str, sources: list[str]) -> None:
    """Overlay sources into dst: a path present in one source becomes a symlink
    to it; directories present in several are merged recursively (earlier
    sources win for files)."""
    os.makedirs(dst, exist_ok=True)
    entries: dict[str, list[str]] = {}
    for src in sources:
        try:
            for name in os.listdir(src):
                entries.setdefault(name, []).append(os.path.join(src, name))
        except OSError:
            continue
    for name, paths in entries.items():
        target = os.path.join(dst, name)
        dirs = [p for p in paths if os.path.isdir(p)]
        if len(dirs) > 1:
            _merge(target, dirs)
        else:
            os.symlink(os.path.realpath(paths[0]), target)


def merged_tree(arch_tree: str, common: str, cache_root: str = CACHE_ROOT) -> str:
    """A cached merge of an arch tree and its common tree; built once, atomically."""
    dst = os.path.join(cache_root, os.path.basename(arch_tree))
    if os.path.exists(os.path.join(dst, _MARK)):
        return dst
    os.makedirs(cache_root, mode=0o755, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".merge-", dir=cache_root)
    try:
        _merge(tmp, [arch_tree, common])
        with open(os.path.join(tmp, _MARK), "w") as f:
            f.write(f"{arch_tree}\n{common}\n")
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, dst)
        except OSError:
            if not os.path.exists(os.path.join(dst, _MARK)):
                shutil.rmtree(dst, ignore_errors=True)
                os.rename(tmp, dst)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return dst


def find(explicit: str | None = None, release: str | None = None, cache_root: str = CACHE_ROOT) -> HeaderTree:
    explicit = explicit or os.environ.get("PSTATE_KERNEL_HEADERS") or os.environ.get("BCC_KERNEL_SOURCE")
    if explicit:
        if not os.path.isdir(explicit):
            raise HeadersNotFound(f"kernel header directory {explicit} does not exist")
        common = _companion(explicit)
        # Debian's arch tree has include/ and arch/ too, but not include/linux:
        # its headers live in the common tree, so it still needs the merge.
        if common and not os.path.isdir(os.path.join(explicit, "include", "linux")):
            return HeaderTree(merged_tree(explicit, common, cache_root), "explicit, merged", f"{explicit} + {common}")
        return HeaderTree(explicit, "explicit")
    release = release or os.uname().release
    build = f"/lib/modules/{release}/build"
    if os.path.isdir(build):
        return HeaderTree(os.path.realpath(build), "running kernel")
    for arch_tree, common in distribution_trees():
        if common:
            path = merged_tree(arch_tree, common, cache_root)
            return HeaderTree(path, "distribution, merged", f"{os.path.basename(arch_tree)} + {os.path.basename(common)}")
        if _usable(arch_tree):
            return HeaderTree(arch_tree, "distribution")
    raise HeadersNotFound(f"no kernel headers for {release}: /lib/modules/{release}/build is missing and "
                          f"{SRC_ROOT} has no linux-headers-* tree")

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

Headers are code that root compiles into the kernel, so a tree is used only
when no other user can change it (pstate.kernel.trust): the tree and every
directory above it root-owned and not group/world-writable, checked on every
run; before each compile, every directory and file under include/ and arch/
(what BCC reads), symbolic links followed to their targets. A merged tree is
built only from trusted trees, its links point only into them, and its name
carries a hash of the trees and their packages' identity, so an upgrade (or
an older, unchecked merge) never stands in for the trees it came from.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass

from pstate.kernel import trust
from pstate.exitcodes import ExitCode, PstateError

CACHE_ROOT = "/var/cache/pstate/kernel-headers"
SRC_ROOT = "/usr/src"
DPKG_INFO = "/var/lib/dpkg/info"
_MARK = ".pstate-merged"
_MARK_FORMAT = "pstate-merged 2"
READ_BY_BCC = ("include", "arch")  # the parts of a tree BCC's compiler reads


@dataclass
class HeaderTree:
    path: str  # directory to hand to BCC (BCC_KERNEL_SOURCE)
    origin: str  # "explicit", "running kernel", "distribution (merged)", "distribution"
    detail: str = ""  # e.g. which distribution trees were merged

    def describe(self) -> str:
        return f"{self.path} ({self.origin}{': ' + self.detail if self.detail else ''})"


class HeadersNotFound(Exception):
    pass


class HeadersUntrusted(PstateError):
    """A header tree another user could change: root must not compile it."""

    def __init__(self, tree: str, why: str):
        super().__init__(
            f"kernel header tree {tree} is not safe to compile as root: {why}", ExitCode.NOPERM,
            hint="use a tree only root can write (chown -R root: and chmod -R go-w it and the directories "
                 "above it), e.g. an installed linux-headers package, or pass --kernel-headers DIR")


def check_top(path: str) -> None:
    """The cheap check of every run: path and every directory above it
    trusted. HeadersUntrusted otherwise."""
    why = trust.why_untrusted_path(path, directory=True)
    if why:
        raise HeadersUntrusted(path, why)


def verify(tree: "HeaderTree") -> None:
    """Before a compile: everything BCC reads in the tree trusted, links
    followed (about 0.15 s for a distribution tree). HeadersUntrusted otherwise."""
    why = trust.why_untrusted_tree(tree.path, READ_BY_BCC)
    if why:
        raise HeadersUntrusted(tree.path, why)


def _package_identity(tree: str) -> list:
    """What changes when the distribution package holding a tree is
    installed again or upgraded: its dpkg file list's identity."""
    name = os.path.basename(os.path.realpath(tree))
    out = []
    for ext in ("list", "md5sums"):
        try:
            st = os.stat(os.path.join(DPKG_INFO, f"{name}.{ext}"))
            out.append([ext, st.st_size, st.st_mtime_ns, st.st_ino])
        except OSError:
            out.append([ext, None])
    return out


def identity(path: str) -> list:
    """The part of the program cache's key that stands for a header tree,
    cheap enough for every run: where it is, the manifest of a merged tree
    (its sources and their packages' identity), the package identity of
    the tree itself, and the top directories BCC reads."""
    real = os.path.realpath(path)
    out: list = [real]
    try:
        with open(os.path.join(real, _MARK)) as f:
            out.append(f.read(4096))
    except OSError:
        out.append(None)
    out.append(_package_identity(real))
    for d in READ_BY_BCC:
        try:
            st = os.stat(os.path.join(real, d))
            out.append([d, st.st_mtime_ns, st.st_ino])
        except OSError:
            out.append([d, None])
    return out


def _usable(tree: str) -> bool:
    return os.path.isdir(os.path.join(tree, "include")) and os.path.isdir(os.path.join(tree, "arch"))


def _version_key(name: str):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


def _companion(tree: str) -> str | None:
    """The common tree an arch tree includes (Debian: "include <dir>/Makefile").
    The Makefile is read only when no other user could have written it, and
    the tree it names must be trusted too."""
    makefile = os.path.join(tree, "Makefile")
    if not os.path.lexists(makefile):
        return None
    # a link in a directory only root can write was made by root: check its target
    why = (trust.why_untrusted_path(tree, directory=True)
           or trust.why_untrusted_path(os.path.realpath(makefile), directory=False))
    if why:
        raise HeadersUntrusted(tree, why)
    try:
        with open(makefile) as f:
            text = f.read(4096)
    except OSError:
        return None
    m = re.search(r"^include\s+(\S+)/Makefile\s*$", text, re.M)
    if m and os.path.isdir(m.group(1)):
        common = os.path.realpath(m.group(1))
        check_top(common)
        return common
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
        try:
            out.append((tree, _companion(tree)))
        except HeadersUntrusted:
            out.append((tree, None))  # find() says why if it comes to this tree
    return out


def _merge(dst: str, sources: list[str]) -> None:
    """Overlay sources into dst: a path present in one source becomes a symlink
    to it; directories present in several are merged recursively (earlier
    sources win for files)."""
    trust.make_dirs(dst, 0o755)
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


def _manifest(arch_tree: str, common: str) -> str:
    """What a merged tree is made of: the mark file's content."""
    arch_tree, common = os.path.realpath(arch_tree), os.path.realpath(common)
    ident = [_package_identity(arch_tree), _package_identity(common)]
    return f"{_MARK_FORMAT}\n{arch_tree}\n{common}\n{ident!r}\n"


def _reusable(dst: str, manifest: str) -> bool:
    """An existing merged tree is used only if only root can have written it
    and it was made of exactly these trees (the mark says so)."""
    mark = os.path.join(dst, _MARK)
    if trust.why_untrusted_path(dst, directory=True) or trust.why_untrusted(mark, directory=False):
        return False
    try:
        with open(mark) as f:
            return f.read(len(manifest) + 1) == manifest
    except OSError:
        return False


def _retire(dst: str, cache_root: str) -> None:
    """Remove a merge under dst that is no longer right (its mark says it
    is one of pstate's): renamed away first, then deleted without
    following a link. Anything without the mark is left alone (OSError)."""
    if not os.path.isfile(os.path.join(dst, _MARK)) or os.path.islink(dst):
        raise OSError(f"{dst} is in the way and is not a merge pstate made; remove it")
    old = tempfile.mkdtemp(prefix=".stale-", dir=cache_root)
    os.rename(dst, os.path.join(old, "tree"))
    shutil.rmtree(old, ignore_errors=True)


def merged_tree(arch_tree: str, common: str, cache_root: str = CACHE_ROOT) -> str:
    """A cached merge of an arch tree and its common tree; built once, atomically,
    from trees checked first (HeadersUntrusted otherwise)."""
    manifest = _manifest(arch_tree, common)
    tag = hashlib.sha256(manifest.encode()).hexdigest()[:12]
    dst = os.path.join(cache_root, f"{os.path.basename(arch_tree)}-{tag}")
    if _reusable(dst, manifest):
        return dst
    for src in (arch_tree, common):
        why = trust.why_untrusted_tree(src, READ_BY_BCC)
        if why:
            raise HeadersUntrusted(src, why)
    trust.make_dirs(cache_root, 0o755)
    why = trust.why_untrusted_path(cache_root, directory=True)
    if why:
        raise HeadersUntrusted(cache_root, why)
    tmp = tempfile.mkdtemp(prefix=".merge-", dir=cache_root)
    try:
        _merge(tmp, [os.path.realpath(arch_tree), os.path.realpath(common)])
        with open(os.path.join(tmp, _MARK), "w") as f:
            f.write(manifest)
        os.chmod(os.path.join(tmp, _MARK), 0o644)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, dst)
        except OSError:
            if _reusable(dst, manifest):  # another run's finished merge
                return dst
            _retire(dst, cache_root)
            os.rename(tmp, dst)
    finally:
        if os.path.exists(tmp):  # this run's own temporary merge, not renamed
            shutil.rmtree(tmp, ignore_errors=True)
    return dst


def find(explicit: str | None = None, release: str | None = None, cache_root: str = CACHE_ROOT) -> HeaderTree:
    explicit = explicit or os.environ.get("PSTATE_KERNEL_HEADERS") or os.environ.get("BCC_KERNEL_SOURCE")
    if explicit:
        if not os.path.isdir(explicit):
            raise HeadersNotFound(f"kernel header directory {explicit} does not exist")
        check_top(os.path.realpath(explicit))
        common = _companion(explicit)
        # Debian's arch tree has include/ and arch/ too, but not include/linux:
        # its headers live in the common tree, so it still needs the merge.
        if common and not os.path.isdir(os.path.join(explicit, "include", "linux")):
            return HeaderTree(merged_tree(explicit, common, cache_root), "explicit, merged", f"{explicit} + {common}")
        return HeaderTree(explicit, "explicit")
    release = release or os.uname().release
    build = f"/lib/modules/{release}/build"
    if os.path.isdir(build):
        check_top(os.path.realpath(build))
        return HeaderTree(os.path.realpath(build), "running kernel")
    for arch_tree, common in distribution_trees():
        check_top(arch_tree)
        common = common or _companion(arch_tree)
        if common:
            path = merged_tree(arch_tree, common, cache_root)
            return HeaderTree(path, "distribution, merged", f"{os.path.basename(arch_tree)} + {os.path.basename(common)}")
        if _usable(arch_tree):
            return HeaderTree(arch_tree, "distribution")
    raise HeadersNotFound(f"no kernel headers for {release}: /lib/modules/{release}/build is missing and "
                          f"{SRC_ROOT} has no linux-headers-* tree")

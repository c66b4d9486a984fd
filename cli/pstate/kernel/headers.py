"""Find a kernel header tree for BCC's run-time compiler.

Where distributions put one, in the order find() looks:

1. an explicit tree: --kernel-headers / PSTATE_KERNEL_HEADERS, or a
   BCC_KERNEL_SOURCE already set;
2. the running kernel's /lib/modules/$(uname -r)/build: a full tree
   (Fedora, RHEL: /usr/src/kernels/<release>), or a Debian/Ubuntu arch tree
   (/usr/src/linux-headers-<release>, include/generated and the config only)
   whose Makefile includes the common tree that holds include/linux;
3. an installed distribution tree of any version: /usr/src/linux-headers-*
   (the arch tree of a Debian/Ubuntu pair, newest first, or an unsplit
   tree), then /usr/src/kernels/* (Fedora, RHEL);
4. the kernel's own headers, /sys/kernel/kheaders.tar.xz (CONFIG_IKHEADERS;
   `modprobe kheaders` is tried when the file is absent), extracted into
   /var/cache/pstate/kernel-headers/kheaders-<archive hash>.

A tree of another kernel version is good enough because pstate's BPF
programs read kernel structs only at offsets from the running kernel's BTF
and tracepoint arguments from its tracefs format files: the headers only
have to define the basic types and helpers. BCC wants one directory, so an
arch tree that includes a common tree (the explicit, build-link and /usr/src
cases alike, with_companion) is merged with it into a cached tree of
symlinks. compile_check() says whether BCC can compile against a tree.

Headers are code that root compiles into the kernel, so a tree is used only
when no other user can change it (pstate.trust): the tree and every
directory above it root-owned and not group/world-writable, checked on every
run; before each compile, every directory and file under include/ and arch/
(what BCC reads), symbolic links followed hop by hop to their targets. A
merged tree is built only from trees whose tops are trusted, its links point
only into them (what they lead to is checked before each compile, with
the rest), and its name carries a hash of the trees and their packages' identity,
so an upgrade (or an older, unchecked merge) never stands in for the trees
it came from. A kheaders tree is extracted from a root-owned archive into a
temporary directory and renamed into place, members that could reach out of
it (absolute paths, `..`, links leaving the tree, devices) left out; it is
reused only when its mark names the same archive hash.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from typing import Callable

from pstate import trust
from pstate.exitcodes import ExitCode, PstateError

CACHE_ROOT = "/var/cache/pstate/kernel-headers"
MODULES_ROOT = "/lib/modules"
SRC_ROOT = "/usr/src"
KHEADERS = "/sys/kernel/kheaders.tar.xz"
DPKG_INFO = "/var/lib/dpkg/info"
_MARK = ".pstate-merged"
_MARK_FORMAT = "pstate-merged 2"
_KH_MARK = ".pstate-kheaders"
_KH_FORMAT = "pstate-kheaders 1"
READ_BY_BCC = ("include", "arch")  # the parts of a tree BCC's compiler reads
_SBIN = "/usr/sbin:/sbin:/usr/bin:/bin"


@dataclass
class HeaderTree:
    path: str  # directory to hand to BCC (BCC_KERNEL_SOURCE)
    origin: str  # "explicit", "running kernel", "distribution", "kheaders"; ", merged" when merged
    detail: str = ""  # e.g. which trees were merged

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


def _complete(tree: str) -> bool:
    """A tree BCC can compile against on its own: the kernel's include/linux and arch/."""
    return os.path.isdir(os.path.join(tree, "include", "linux")) and os.path.isdir(os.path.join(tree, "arch"))


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


def with_companion(tree: str, cache_root: str = CACHE_ROOT) -> tuple[str, str | None]:
    """(the directory to hand BCC for tree, the common tree merged in or None).
    An arch tree (Debian/Ubuntu: include/ and arch/ but no include/linux)
    whose Makefile includes a common tree is merged with it (merged_tree);
    any other tree is itself. HeadersUntrusted if either is not trusted."""
    real = os.path.realpath(tree)
    common = _companion(real)
    if common and not os.path.isdir(os.path.join(real, "include", "linux")):
        return merged_tree(real, common, cache_root), common
    return tree, None


def distribution_trees(src_root: str = SRC_ROOT) -> list[tuple[str, str | None]]:
    """(tree, common tree or None) pairs: the arch (or unsplit) trees of
    src_root/linux-headers-*, then the trees of src_root/kernels/*, each
    newest first."""
    out = []
    try:
        names = sorted(os.listdir(src_root), key=_version_key, reverse=True)
    except OSError:
        names = []
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
    kernels = os.path.join(src_root, "kernels")
    try:
        names = sorted(os.listdir(kernels), key=_version_key, reverse=True)
    except OSError:
        names = []
    out += [(os.path.join(kernels, n), None) for n in names if os.path.isdir(os.path.join(kernels, n))]
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


def _reusable(dst: str, manifest: str, mark_name: str = _MARK) -> bool:
    """An existing cached tree is used only if only root can have written it
    and it was made of exactly these sources (its mark says so)."""
    mark = os.path.join(dst, mark_name)
    if trust.why_untrusted_path(dst, directory=True) or trust.why_untrusted(mark, directory=False):
        return False
    try:
        with open(mark) as f:
            return f.read(len(manifest) + 1) == manifest
    except OSError:
        return False


def _retire(dst: str, cache_root: str, mark_name: str = _MARK) -> None:
    """Remove a cached tree under dst that is no longer right (its mark says
    it is one of pstate's): renamed away first, then deleted without
    following a link. Anything without the mark is left alone (OSError)."""
    if not os.path.isfile(os.path.join(dst, mark_name)) or os.path.islink(dst):
        raise OSError(f"{dst} is in the way and is not a tree pstate made; remove it")
    old = tempfile.mkdtemp(prefix=".stale-", dir=cache_root)
    os.rename(dst, os.path.join(old, "tree"))
    shutil.rmtree(old, ignore_errors=True)


def _cached(dst: str, manifest: str, mark_name: str, cache_root: str, fill: Callable[[str], None]) -> str:
    """dst, built by fill(temporary directory) with its mark and renamed into
    place in one step, unless a trusted tree of the same manifest is there."""
    if _reusable(dst, manifest, mark_name):
        return dst
    trust.make_dirs(cache_root, 0o755)
    why = trust.why_untrusted_path(cache_root, directory=True)
    if why:
        raise HeadersUntrusted(cache_root, why)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=cache_root)
    try:
        fill(tmp)
        with open(os.path.join(tmp, mark_name), "w") as f:
            f.write(manifest)
        os.chmod(os.path.join(tmp, mark_name), 0o644)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, dst)
        except OSError:
            if _reusable(dst, manifest, mark_name):  # another run's finished tree
                return dst
            _retire(dst, cache_root, mark_name)
            os.rename(tmp, dst)
    finally:
        if os.path.exists(tmp):  # this run's own temporary tree, not renamed
            shutil.rmtree(tmp, ignore_errors=True)
    return dst


def merged_tree(arch_tree: str, common: str, cache_root: str = CACHE_ROOT) -> str:
    """A cached merge of an arch tree and its common tree; built once,
    atomically, of links into the two, whose tops (and every directory above
    them) are checked here (HeadersUntrusted otherwise). What the links lead
    to is checked with the merged tree before every compile (verify: each
    link followed hop by hop into the trees): walking the two trees here as
    well would read every file's metadata twice on the first compile, which
    on a slow file system (a guest's 9p root) takes minutes."""
    manifest = _manifest(arch_tree, common)
    tag = hashlib.sha256(manifest.encode()).hexdigest()[:12]
    dst = os.path.join(cache_root, f"{os.path.basename(arch_tree)}-{tag}")
    if _reusable(dst, manifest):
        return dst
    for src in (arch_tree, common):
        check_top(os.path.realpath(src))
    sources = [os.path.realpath(arch_tree), os.path.realpath(common)]
    return _cached(dst, manifest, _MARK, cache_root, lambda tmp: _merge(tmp, sources))


# --- kheaders ---------------------------------------------------------------------------------


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def _make_parents(root: str, parts: list[str]) -> str | None:
    """root/parts..., each a real directory made here (0755) when missing;
    None when one on the way is a link or not a directory."""
    cur = root
    for p in parts:
        cur = os.path.join(cur, p)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            os.mkdir(cur, 0o755)
            os.chmod(cur, 0o755)
            continue
        if not stat.S_ISDIR(st.st_mode):
            return None
    return cur


def _write_file(path: str, src) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(src, out)
        os.fchmod(out.fileno(), 0o644)
        if os.geteuid() == 0:
            os.fchown(out.fileno(), 0, 0)


def extract_safely(tf: tarfile.TarFile, root: str) -> list[str]:
    """Extract an archive's directories, regular files and links that stay
    inside root, the directories 0755 and files 0644 (owned by root when
    root runs this); return what was left out and why. Left out: absolute
    names, names with `..`, anything under a link, links leaving root (at
    once or, through other links, once all are in place), hard links to
    anything but a file extracted before, devices and FIFOs."""
    real_root = os.path.realpath(root)
    skipped: list[str] = []
    links: list[str] = []
    for m in tf:
        if m.name.startswith("/"):
            skipped.append(f"{m.name}: absolute name")
            continue
        parts = [p for p in m.name.split("/") if p not in ("", ".")]
        if ".." in parts:
            skipped.append(f"{m.name}: `..` in its name")
            continue
        if not parts:
            continue  # the archive's top directory
        parent = _make_parents(root, parts[:-1])
        if parent is None:
            skipped.append(f"{m.name}: under a link or a file")
            continue
        path = os.path.join(parent, parts[-1])
        try:
            if m.isdir():
                if not os.path.lexists(path):
                    os.mkdir(path, 0o755)
                if os.path.islink(path) or not os.path.isdir(path):
                    skipped.append(f"{m.name}: a directory where a link or file is")
                    continue
                os.chmod(path, 0o755)
            elif m.isreg():
                _write_file(path, tf.extractfile(m))
            elif m.issym():
                target = m.linkname
                lexical = os.path.normpath(os.path.join(os.path.dirname("/".join(parts)), target))
                if target.startswith("/") or lexical == ".." or lexical.startswith("../"):
                    skipped.append(f"{m.name}: a link to {target}, out of the tree")
                    continue
                os.symlink(target, path)
                if os.geteuid() == 0:
                    os.lchown(path, 0, 0)
                links.append(path)
            elif m.islnk():
                src_parts = [p for p in m.linkname.split("/") if p not in ("", ".")]
                src = os.path.join(root, *src_parts) if src_parts and ".." not in src_parts else None
                if (src is None or m.linkname.startswith("/") or os.path.islink(src) or not os.path.isfile(src)
                        or not _under(os.path.realpath(src), real_root)):
                    skipped.append(f"{m.name}: a hard link to {m.linkname}, not a file of the tree")
                    continue
                with open(src, "rb") as f:
                    _write_file(path, f)
            else:
                skipped.append(f"{m.name}: not a file, directory or link")
        except FileExistsError:
            skipped.append(f"{m.name}: a second member of that name")
    # a link that stays inside on its own may leave through another one:
    # drop the links that resolve outside until none does
    while True:
        out = [p for p in links if not _under(os.path.realpath(p), real_root)]
        if not out:
            return skipped
        for p in out:
            os.unlink(p)
            links.remove(p)
            skipped.append(f"{os.path.relpath(p, root)}: a link that resolves out of the tree")


def kheaders_tree(archive: str = KHEADERS, cache_root: str = CACHE_ROOT) -> tuple[str, list[str]]:
    """(the extracted tree of a kheaders archive, the members left out of it
    when it was extracted now). The archive must be root's; the tree is
    cached under a hash of the archive's bytes and reused while its mark
    names that hash."""
    why = trust.why_untrusted_path(archive, directory=False)
    if why:
        raise HeadersUntrusted(archive, why)
    with open(archive, "rb") as f:
        data = f.read()  # hashed and extracted from the same bytes
    digest = hashlib.sha256(data).hexdigest()
    manifest = f"{_KH_FORMAT}\n{digest}\n"
    dst = os.path.join(cache_root, f"kheaders-{digest[:16]}")
    skipped: list[str] = []

    def fill(tmp: str) -> None:
        try:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
                skipped.extend(extract_safely(tf, tmp))
        except (tarfile.TarError, EOFError, OSError) as e:
            raise OSError(f"cannot extract {archive}: {e}") from None

    return _cached(dst, manifest, _KH_MARK, cache_root, fill), skipped


def _modprobe_kheaders() -> str:
    """`modprobe kheaders`: "" when it worked, else why not."""
    if os.geteuid() != 0:
        return "not root"
    exe = shutil.which("modprobe", path=_SBIN)
    if not exe:
        return "no modprobe"
    try:
        p = subprocess.run([exe, "kheaders"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return str(e)
    if p.returncode == 0:
        return ""
    said = p.stderr.decode(errors="replace").strip().splitlines()
    return said[-1] if said else f"exit status {p.returncode}"


# --- find ---------------------------------------------------------------------------------------


def find(explicit: str | None = None, release: str | None = None, cache_root: str = CACHE_ROOT, *,
         modules_root: str = MODULES_ROOT, src_root: str = SRC_ROOT, kheaders: str = KHEADERS,
         modprobe: Callable[[], str] | None = None) -> HeaderTree:
    """The header tree to compile against, in the order of the module's
    docstring. modprobe: what loads the kheaders module when the archive
    is absent ("" when it worked, else why not); by default
    `modprobe kheaders`, tried only for the kernel's own archive path.
    HeadersNotFound names every place looked at; HeadersUntrusted when the
    tree found could be changed by another user."""
    explicit = explicit or os.environ.get("PSTATE_KERNEL_HEADERS") or os.environ.get("BCC_KERNEL_SOURCE")
    if explicit:
        if not os.path.isdir(explicit):
            raise HeadersNotFound(f"kernel header directory {explicit} does not exist")
        check_top(os.path.realpath(explicit))
        path, common = with_companion(explicit, cache_root)
        if common:
            return HeaderTree(path, "explicit, merged", f"{explicit} + {common}")
        return HeaderTree(explicit, "explicit")

    release = release or os.uname().release
    looked: list[str] = []
    build = os.path.join(modules_root, release, "build")
    if os.path.isdir(build):
        real = os.path.realpath(build)
        check_top(real)
        path, common = with_companion(real, cache_root)
        if common:
            return HeaderTree(path, "running kernel, merged", f"{real} + {common}")
        if _complete(real):
            return HeaderTree(real, "running kernel", build)
        looked.append(f"{build} ({real}) has no include/linux and no common tree")
    else:
        looked.append(f"{build} is missing")

    trees = distribution_trees(src_root)
    for tree, _ in trees:
        check_top(tree)
        path, common = with_companion(tree, cache_root)
        if common:
            return HeaderTree(path, "distribution, merged", f"{os.path.basename(tree)} + {os.path.basename(common)}")
        if _complete(tree):
            return HeaderTree(tree, "distribution")
        looked.append(f"{tree} has no include/linux and no common tree")
    if not trees:
        looked.append(f"{src_root} has no linux-headers-* or kernels/* tree")

    origin = "kheaders"
    if not os.path.exists(kheaders):
        if modprobe is None and kheaders == KHEADERS:
            modprobe = _modprobe_kheaders
        if modprobe is None:
            looked.append(f"{kheaders} is missing")
        else:
            why = modprobe()
            if os.path.exists(kheaders):
                origin = "kheaders, after modprobe kheaders"
            else:
                looked.append(f"{kheaders} is missing (modprobe kheaders: {why or 'no archive appeared'})")
    if os.path.exists(kheaders):
        path, _ = kheaders_tree(kheaders, cache_root)
        if _complete(path):
            return HeaderTree(path, origin, f"extracted from {kheaders}")
        looked.append(f"{kheaders} has no include/linux")
    raise HeadersNotFound(f"no kernel headers for {release}: " + "; ".join(looked))


# --- does it compile? ---------------------------------------------------------------------------

_NOISE = re.compile(r"^(\d+ (warning|error)s? generated\.|In file included from |[\^~ ]*$)")


def compiler_words(said: str, n: int = 3) -> str:
    """The last n meaningful lines of what the compiler said: its error
    lines when it named any, else its last lines; joined with "; "."""
    lines = [line.strip() for line in said.splitlines() if line.strip() and not _NOISE.match(line.strip())]
    errors = [line for line in lines if re.search(r"\berror\b", line, re.I)]
    return "; ".join((errors or lines)[-n:])


def compile_check(tree: "HeaderTree | str") -> tuple[bool, str]:
    """(True, "") when BCC compiles a tiny program against the tree, else
    (False, the compiler's last meaningful lines). The tree is verified
    first (HeadersUntrusted). Needs bcc (pstate.kernel.bccimport), not
    root: nothing is loaded into the kernel."""
    from pstate.kernel.bccimport import import_bcc, quiet_fd

    if isinstance(tree, str):
        tree = HeaderTree(tree, "explicit")
    verify(tree)
    bcc = import_bcc()
    before = os.environ.get("BCC_KERNEL_SOURCE")
    os.environ["BCC_KERNEL_SOURCE"] = tree.path
    said_out = said_err = None
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        with quiet_fd(1) as said_out, quiet_fd(2) as said_err:
            bpf = bcc.BPF(text=b"int f(void *ctx) { return 0; }")
        bpf.cleanup()
        return True, ""
    except Exception as e:  # bcc raises plain Exception when compiling fails
        said = "\n".join(c.text() for c in (said_out, said_err) if c)
        return False, compiler_words(said) or str(e)
    finally:
        if before is None:
            os.environ.pop("BCC_KERNEL_SOURCE", None)
        else:
            os.environ["BCC_KERNEL_SOURCE"] = before

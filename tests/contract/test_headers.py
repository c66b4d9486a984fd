"""Finding a kernel header tree in each layout distributions use (Debian's
split trees merged), kheaders extracted safely, and whether BCC compiles
against it."""

from __future__ import annotations

import hashlib
import io
import lzma
import os
import stat
import tarfile

import pytest

from pstate import trust
from pstate.kernel import headers
from pstate.kernel.headers import HeadersNotFound

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


def debian_split(root, version="6.1.0-9"):
    """A fake /usr/src with linux-headers-<v>-common and linux-headers-<v>-amd64."""
    common = root / f"linux-headers-{version}-common"
    arch = root / f"linux-headers-{version}-amd64"
    for d in ("include/linux", "arch/x86/include/asm", "scripts"):
        (common / d).mkdir(parents=True)
    (common / "include/linux/sched.h").write_text("/* common */\n")
    (common / "arch/x86/include/asm/ptrace.h").write_text("/* common asm */\n")
    (common / "Makefile").write_text("# the real kernel Makefile\n")
    for d in ("include/generated", "include/config", "arch/x86/include/generated/asm"):
        (arch / d).mkdir(parents=True)
    (arch / "include/generated/autoconf.h").write_text("#define CONFIG_X86 1\n")
    (arch / "arch/x86/include/generated/asm/orc.h").write_text("/* generated */\n")
    (arch / ".config").write_text("CONFIG_X86=y\n")
    (arch / "Makefile").write_text(f"include {common}/Makefile\n")
    return arch, common


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("PSTATE_KERNEL_HEADERS", "BCC_KERNEL_SOURCE"):
        monkeypatch.delenv(var, raising=False)


def test_distribution_trees_pairs_arch_with_common(tmp_path):
    old, _ = debian_split(tmp_path, "5.10.0-30")
    new, new_common = debian_split(tmp_path, "6.1.0-9")
    (tmp_path / "unrelated").mkdir()
    assert headers.distribution_trees(str(tmp_path)) == [(str(new), str(new_common)), (str(old), str(tmp_path / "linux-headers-5.10.0-30-common"))]
    assert headers.distribution_trees(str(tmp_path / "missing")) == []


def test_merged_tree_resolves_files_from_both(tmp_path):
    arch, common = debian_split(tmp_path / "src")
    cache = tmp_path / "cache"
    dst = headers.merged_tree(str(arch), str(common), str(cache))
    assert os.path.dirname(dst) == str(cache) and os.path.basename(dst).startswith(arch.name + "-")
    assert open(os.path.join(dst, "include/linux/sched.h")).read() == "/* common */\n"
    assert open(os.path.join(dst, "include/generated/autoconf.h")).read() == "#define CONFIG_X86 1\n"
    assert open(os.path.join(dst, "arch/x86/include/asm/ptrace.h")).read() == "/* common asm */\n"
    assert open(os.path.join(dst, "arch/x86/include/generated/asm/orc.h")).read() == "/* generated */\n"
    assert os.path.exists(os.path.join(dst, ".config"))
    # the arch tree wins where both have a file
    assert os.path.realpath(os.path.join(dst, "Makefile")) == str(arch / "Makefile")
    assert [n for n in os.listdir(cache) if n.startswith(".")] == []  # no temporary left


def test_merged_tree_is_built_once(tmp_path, monkeypatch):
    arch, common = debian_split(tmp_path / "src")
    cache = str(tmp_path / "cache")
    first = headers.merged_tree(str(arch), str(common), cache)
    calls = []
    monkeypatch.setattr(headers, "_merge", lambda *a: calls.append(a))
    assert headers.merged_tree(str(arch), str(common), cache) == first
    assert calls == []


def test_find_explicit_split_tree_is_merged(tmp_path, clean_env):
    arch, common = debian_split(tmp_path / "src")
    tree = headers.find(str(arch), cache_root=str(tmp_path / "cache"))
    assert tree.origin == "explicit, merged"
    assert tree.detail == f"{arch} + {common}"
    assert os.path.isfile(os.path.join(tree.path, "include/linux/sched.h"))
    assert tree.describe() == f"{tree.path} (explicit, merged: {arch} + {common})"


def test_find_explicit_full_tree_is_used_as_is(tmp_path, clean_env):
    arch, common = debian_split(tmp_path / "src")
    assert headers.find(str(common), cache_root=str(tmp_path / "cache")).path == str(common)
    merged = headers.merged_tree(str(arch), str(common), str(tmp_path / "cache"))
    # handing the merged tree back in does not merge it again
    assert headers.find(merged, cache_root=str(tmp_path / "cache")).path == merged


def test_find_explicit_from_environment(tmp_path, clean_env, monkeypatch):
    _, common = debian_split(tmp_path / "src")
    monkeypatch.setenv("PSTATE_KERNEL_HEADERS", str(common))
    assert headers.find().describe() == f"{common} (explicit)"
    monkeypatch.setenv("PSTATE_KERNEL_HEADERS", str(tmp_path / "nope"))
    with pytest.raises(HeadersNotFound, match="does not exist"):
        headers.find()


# --- the layouts distributions use, in find()'s order ------------------------------------------


def full_tree(path):
    """A tree that compiles on its own (Fedora's /usr/src/kernels/<release>, an unsplit tree)."""
    for d in ("include/linux", "include/generated", "arch/x86/include/asm"):
        (path / d).mkdir(parents=True)
    (path / "include/linux/kconfig.h").write_text("/* full */\n")
    (path / "Makefile").write_text("VERSION = 6\ninclude $(srctree)/arch/$(SRCARCH)/Makefile\n")
    return path


class Roots:
    """Empty stand-ins for /lib/modules, /usr/src, /sys/kernel/kheaders.tar.xz
    and the cache, and find() pointed at them."""

    release = "6.1.0-9-amd64"

    def __init__(self, tmp_path):
        self.modules = tmp_path / "lib-modules"
        self.src = tmp_path / "usr-src"
        self.kheaders = tmp_path / "sys-kernel" / "kheaders.tar.xz"
        self.cache = tmp_path / "cache"
        for d in (self.modules, self.src, self.kheaders.parent):
            d.mkdir(parents=True)
        self.modprobed = []

    def build_link(self, target, release=None):
        d = self.modules / (release or self.release)
        d.mkdir(parents=True)
        (d / "build").symlink_to(target)
        return d / "build"

    def modprobe(self):
        self.modprobed.append(True)
        return "modprobe: FATAL: Module kheaders not found in directory /lib/modules/" + self.release

    def find(self, **kw):
        kw = {"release": self.release, "cache_root": str(self.cache), "modules_root": str(self.modules),
              "src_root": str(self.src), "kheaders": str(self.kheaders), "modprobe": self.modprobe, **kw}
        return headers.find(**kw)


@pytest.fixture
def roots(tmp_path, clean_env):
    return Roots(tmp_path)


def test_debian_split_behind_the_build_link_is_merged(roots):
    """Debian/Ubuntu: build -> the arch tree, whose Makefile includes the common tree."""
    arch, common = debian_split(roots.src, "6.1.0-9")
    debian_split(roots.src, "6.9.0-1")  # a newer installed tree: the running kernel's comes first
    build = roots.build_link(arch)
    tree = roots.find()
    assert tree == headers.HeaderTree(headers.merged_tree(str(arch), str(common), str(roots.cache)),
                                      "running kernel, merged", f"{arch} + {common}")
    assert os.path.dirname(tree.path) == str(roots.cache)
    assert open(os.path.join(tree.path, "include/linux/sched.h")).read() == "/* common */\n"
    assert open(os.path.join(tree.path, "include/generated/autoconf.h")).read() == "#define CONFIG_X86 1\n"
    assert roots.modprobed == []
    # the same merge, whichever way it was reached
    assert headers.find(str(build), cache_root=str(roots.cache)).path == tree.path
    assert roots.find(release="0.0.0-none").path != tree.path  # the newer /usr/src tree


def test_full_tree_behind_the_build_link_is_used_as_it_is(roots):
    """Fedora/RHEL: build -> /usr/src/kernels/<release>, one full tree."""
    tree_dir = full_tree(roots.src / "kernels" / "6.5.6-300.fc39.x86_64")
    build = roots.build_link(tree_dir, "6.5.6-300.fc39.x86_64")
    tree = roots.find(release="6.5.6-300.fc39.x86_64")
    assert tree == headers.HeaderTree(str(tree_dir), "running kernel", str(build))
    assert not roots.cache.exists()


def test_build_link_to_an_arch_tree_without_its_common_tree_is_passed_over(roots):
    arch, common = debian_split(roots.src, "6.1.0-9")
    (arch / "Makefile").write_text(f"include {roots.src}/linux-headers-6.1.0-9-gone/Makefile\n")
    roots.build_link(arch)
    full = full_tree(roots.src / "kernels" / "5.14.0-362.el9.x86_64")
    assert roots.find() == headers.HeaderTree(str(full), "distribution")


def test_usr_src_debian_pair_newest_first(roots):
    debian_split(roots.src, "5.10.0-30")
    arch, common = debian_split(roots.src, "6.1.0-9")
    full_tree(roots.src / "kernels" / "6.5.6-300.fc39.x86_64")  # after the linux-headers-* trees
    tree = roots.find(release="0.0.0-no-such-kernel")
    assert tree == headers.HeaderTree(headers.merged_tree(str(arch), str(common), str(roots.cache)),
                                      "distribution, merged", f"{arch.name} + {common.name}")
    assert os.path.isfile(os.path.join(tree.path, "include/generated/autoconf.h"))


def test_usr_src_unsplit_tree(roots):
    tree_dir = roots.src / "linux-headers-4.19.0"
    for d in ("include/generated", "include/linux", "arch/x86"):
        (tree_dir / d).mkdir(parents=True)
    assert roots.find() == headers.HeaderTree(str(tree_dir), "distribution")


def test_usr_src_kernels_single_trees_newest_first(roots):
    full_tree(roots.src / "kernels" / "5.14.0-362.el9.x86_64")
    new = full_tree(roots.src / "kernels" / "6.5.6-300.fc39.x86_64")
    (roots.src / "kernels" / "README").write_text("not a tree\n")
    assert headers.distribution_trees(str(roots.src)) == [
        (str(new), None), (str(roots.src / "kernels" / "5.14.0-362.el9.x86_64"), None)]
    assert roots.find() == headers.HeaderTree(str(new), "distribution")
    assert not roots.cache.exists()


def test_nothing_found_names_every_place_looked_at(roots):
    (roots.src / "linux-kbuild-6.1").mkdir()
    with pytest.raises(HeadersNotFound) as e:
        roots.find()
    r = roots.release
    assert str(e.value) == (
        f"no kernel headers for {r}: {roots.modules}/{r}/build is missing; "
        f"{roots.src} has no linux-headers-* or kernels/* tree; "
        f"{roots.kheaders} is missing (modprobe kheaders: "
        f"modprobe: FATAL: Module kheaders not found in directory /lib/modules/{r})")
    assert roots.modprobed == [True]


def test_nothing_found_without_a_modprobe_to_try(roots):
    arch, _ = debian_split(roots.src, "6.1.0-9")
    (arch / "Makefile").write_text("# no common tree\n")
    with pytest.raises(HeadersNotFound) as e:
        roots.find(modprobe=None)  # not the kernel's own archive path: nothing to load
    assert str(e.value) == (
        f"no kernel headers for {roots.release}: {roots.modules}/{roots.release}/build is missing; "
        f"{arch} has no include/linux and no common tree; {roots.kheaders} is missing")


# --- kheaders --------------------------------------------------------------------------------------


def _member(tf, name, data=None, kind=tarfile.REGTYPE, linkname="", mode=0o644, uid=1000):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.uid, info.gid = kind, linkname, mode, uid, uid
    if data is not None:
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    else:
        tf.addfile(info)


def kheaders_archive(path, escape_dir, hostile=True, extra=b""):
    """A kheaders.tar.xz as the kernel lays it out (./include, ./arch), and
    members that try to reach out of the tree."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        _member(tf, ".", kind=tarfile.DIRTYPE, mode=0o777)
        _member(tf, "./include", kind=tarfile.DIRTYPE, mode=0o777)
        _member(tf, "./include/linux", kind=tarfile.DIRTYPE)
        _member(tf, "./include/linux/kconfig.h", b"#include <generated/autoconf.h>\n" + extra, mode=0o4777)
        _member(tf, "./include/generated/autoconf.h", b"#define CONFIG_X86 1\n")
        _member(tf, "./arch/x86/include/asm/ptrace.h", b"/* asm */\n")
        _member(tf, "./include/asm", kind=tarfile.SYMTYPE, linkname="../arch/x86/include/asm")
        _member(tf, "./include/linux/copy.h", kind=tarfile.LNKTYPE, linkname="./include/linux/kconfig.h")
        if hostile:
            _member(tf, f"{escape_dir}/absolute.h", b"evil\n")
            _member(tf, "../dotdot.h", b"evil\n")
            _member(tf, "./include/../../dotdot2.h", b"evil\n")
            _member(tf, "./include/linux/passwd.h", kind=tarfile.SYMTYPE, linkname="/etc/passwd")
            _member(tf, "./include/up", kind=tarfile.SYMTYPE, linkname="../..")
            _member(tf, "./include/here", kind=tarfile.SYMTYPE, linkname=".")
            _member(tf, "./include/out", kind=tarfile.SYMTYPE, linkname="here/../..")  # lexically inside
            _member(tf, "./include/asm/through.h", b"evil\n")  # written through a link
            _member(tf, "./include/linux/hard.h", kind=tarfile.LNKTYPE, linkname="/etc/passwd")
            _member(tf, "./dev-null", kind=tarfile.CHRTYPE)
            _member(tf, "./fifo", kind=tarfile.FIFOTYPE)
            _member(tf, "./include/linux/kconfig.h", b"second\n")
    path.write_bytes(lzma.compress(raw.getvalue(), format=lzma.FORMAT_XZ))
    return path


def test_kheaders_extracted_safely_into_the_cache(roots, tmp_path):
    escape = tmp_path / "escape"
    escape.mkdir()
    archive = kheaders_archive(roots.kheaders, escape)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    path, skipped = headers.kheaders_tree(str(archive), str(roots.cache))
    assert path == str(roots.cache / f"kheaders-{digest[:16]}")
    assert skipped == [
        f"{escape}/absolute.h: absolute name",
        "../dotdot.h: `..` in its name",
        "./include/../../dotdot2.h: `..` in its name",
        "./include/linux/passwd.h: a link to /etc/passwd, out of the tree",
        "./include/up: a link to ../.., out of the tree",
        "./include/asm/through.h: under a link or a file",
        "./include/linux/hard.h: a hard link to /etc/passwd, not a file of the tree",
        "./dev-null: not a file, directory or link",
        "./fifo: not a file, directory or link",
        "./include/linux/kconfig.h: a second member of that name",
        "include/out: a link that resolves out of the tree",
    ]
    assert os.listdir(escape) == [] and not (roots.cache / "dotdot.h").exists()
    assert not (tmp_path / "dotdot2.h").exists() and not (roots.cache / "dotdot2.h").exists()
    assert sorted(os.listdir(roots.cache)) == [os.path.basename(path)]  # no temporary left
    files, links = {}, {}
    for d, dirs, names in os.walk(path):
        for n in dirs + names:
            p = os.path.join(d, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, path)
            assert (st.st_uid, st.st_gid) == (0, 0), rel
            if stat.S_ISLNK(st.st_mode):
                links[rel] = os.readlink(p)
            else:
                files[rel] = stat.S_IFMT(st.st_mode) | (st.st_mode & 0o7777)
    assert links == {"include/asm": "../arch/x86/include/asm", "include/here": "."}
    D, F = stat.S_IFDIR | 0o755, stat.S_IFREG | 0o644
    assert files == {"include": D, "include/linux": D, "include/generated": D, "arch": D, "arch/x86": D,
                     "arch/x86/include": D, "arch/x86/include/asm": D, "include/linux/kconfig.h": F,
                     "include/linux/copy.h": F, "include/generated/autoconf.h": F,
                     "arch/x86/include/asm/ptrace.h": F, ".pstate-kheaders": F}
    assert os.stat(path).st_mode & 0o7777 == 0o755
    assert open(os.path.join(path, "include/linux/copy.h")).read() == "#include <generated/autoconf.h>\n"
    assert open(os.path.join(path, ".pstate-kheaders")).read() == f"pstate-kheaders 1\n{digest}\n"
    headers.verify(headers.HeaderTree(path, "kheaders"))


def test_find_falls_back_to_kheaders_and_reuses_the_extraction(roots, tmp_path, monkeypatch):
    archive = kheaders_archive(roots.kheaders, tmp_path, hostile=False)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    tree = roots.find()
    assert tree == headers.HeaderTree(str(roots.cache / f"kheaders-{digest[:16]}"), "kheaders",
                                      f"extracted from {archive}")
    assert roots.modprobed == []  # the archive was there
    monkeypatch.setattr(headers, "extract_safely", lambda *a: pytest.fail("extracted again"))
    assert roots.find() == tree
    assert headers.kheaders_tree(str(archive), str(roots.cache)) == (tree.path, [])


def test_kheaders_of_another_archive_or_with_a_tampered_mark_is_extracted_again(roots, tmp_path):
    archive = kheaders_archive(roots.kheaders, tmp_path, hostile=False)
    first, _ = headers.kheaders_tree(str(archive), str(roots.cache))
    kheaders_archive(roots.kheaders, tmp_path, hostile=False, extra=b"/* another build */\n")
    second, _ = headers.kheaders_tree(str(archive), str(roots.cache))
    assert second != first and b"another build" in open(os.path.join(second, "include/linux/kconfig.h"), "rb").read()
    with open(os.path.join(second, ".pstate-kheaders"), "a") as f:
        f.write("tampered\n")
    (roots.cache / os.path.basename(second) / "include/linux/planted.h").write_text("x\n")
    again, _ = headers.kheaders_tree(str(archive), str(roots.cache))
    assert again == second and not os.path.exists(os.path.join(again, "include/linux/planted.h"))
    assert sorted(os.listdir(roots.cache)) == sorted(os.path.basename(p) for p in (first, second))


def test_kheaders_after_modprobe(roots, tmp_path):
    def modprobe():
        kheaders_archive(roots.kheaders, tmp_path, hostile=False)
        return ""

    tree = roots.find(modprobe=modprobe)
    assert (tree.origin, tree.detail) == ("kheaders, after modprobe kheaders", f"extracted from {roots.kheaders}")
    assert os.path.isfile(os.path.join(tree.path, "include/linux/kconfig.h"))


def test_every_distribution_tree_comes_before_kheaders(roots, tmp_path):
    kheaders_archive(roots.kheaders, tmp_path, hostile=False)
    full = full_tree(roots.src / "kernels" / "5.14.0-362.el9.x86_64")
    assert roots.find() == headers.HeaderTree(str(full), "distribution")
    assert not roots.cache.exists()


@needs_root
def test_kheaders_archive_of_another_user_is_refused(roots, tmp_path):
    archive = kheaders_archive(roots.kheaders, tmp_path, hostile=False)
    os.chown(archive, NOBODY, NOBODY)
    with pytest.raises(headers.HeadersUntrusted, match=f"{archive} is owned by uid {NOBODY}, not root"):
        roots.find()
    assert not roots.cache.exists()


# --- does BCC compile against it? ----------------------------------------------------------------


def test_compiler_words_keep_the_errors():
    said = ("Unable to find kernel headers. Try rebuilding kernel with CONFIG_IKHEADERS=m (module)\n"
            "<built-in>:1:10: fatal error: './include/linux/kconfig.h' file not found\n"
            '#include "./include/linux/kconfig.h"\n'
            "         ^~~~~~~~~~~~~~~~~~~~~~~~~~~\n"
            "1 error generated.\n\n")
    assert headers.compiler_words(said) == "<built-in>:1:10: fatal error: './include/linux/kconfig.h' file not found"
    assert headers.compiler_words("a\nb\n\nc\nd\n") == "b; c; d"


@pytest.mark.bpf
def test_compile_check_passes_this_machines_tree_and_fails_a_tree_without_include_linux(tmp_path, clean_env):
    tree = headers.find()
    assert headers.compile_check(tree) == (True, "")
    assert "BCC_KERNEL_SOURCE" not in os.environ
    arch, _ = debian_split(tmp_path / "src")
    (arch / "Makefile").write_text("# an arch tree whose common tree is not installed\n")
    assert headers.compile_check(str(arch)) == (
        False, "<built-in>:1:10: fatal error: './include/linux/kconfig.h' file not found")
    assert "BCC_KERNEL_SOURCE" not in os.environ


@pytest.mark.bpf
def test_doctor_says_problem_for_a_tree_that_does_not_compile(tmp_path, clean_env):
    from pstate.engines import doctor

    arch, _ = debian_split(tmp_path / "src")
    (arch / "Makefile").write_text("# an arch tree whose common tree is not installed\n")
    report, code = doctor.run_checks(str(arch), live=False)
    (row,) = [r for r in report.rows if r[0] == "kernel headers"]
    assert row[1:] == (doctor.PROBLEM, f"{arch} (explicit) does not compile: <built-in>:1:10: fatal error: "
                                       "'./include/linux/kconfig.h' file not found", row[3])
    assert row[3].startswith("install a complete tree") and code == 69
    report, _ = doctor.run_checks(None, live=False)
    assert [r[1] for r in report.rows if r[0] == "kernel headers"] == [doctor.OK]


# --- trust: headers are code that root compiles ----------------------------------------------



def test_umask_000_merge_makes_0755_directories(tmp_path):
    arch, common = debian_split(tmp_path / "src")
    cache = tmp_path / "var" / "cache" / "kernel-headers"
    old = os.umask(0)
    try:
        dst = headers.merged_tree(str(arch), str(common), str(cache))
    finally:
        os.umask(old)
    for d in (cache.parent.parent, cache.parent, cache, dst, os.path.join(dst, "include")):
        assert os.stat(d).st_mode & 0o777 == 0o755, d
    assert os.stat(os.path.join(dst, ".pstate-merged")).st_mode & 0o777 == 0o644


@needs_root
def test_explicit_tree_of_another_user_is_refused(tmp_path, clean_env):
    _, common = debian_split(tmp_path / "src")
    os.chown(common, NOBODY, NOBODY)
    with pytest.raises(headers.HeadersUntrusted) as e:
        headers.find(str(common), cache_root=str(tmp_path / "cache"))
    assert e.value.exit_code == 77
    assert e.value.message.startswith(f"kernel header tree {common} is not safe to compile as root: "
                                      f"{common} is owned by uid {NOBODY}, not root")
    assert "fix: use a tree only root can write" in e.value.message


@needs_root
def test_writable_directory_above_the_tree_is_refused(tmp_path, clean_env):
    _, common = debian_split(tmp_path / "src")
    os.chmod(tmp_path / "src", 0o777)  # not sticky: anyone could swap the tree
    with pytest.raises(headers.HeadersUntrusted, match="writable by group or others"):
        headers.find(str(common), cache_root=str(tmp_path / "cache"))


@needs_root
def test_companion_of_another_user_is_never_merged(tmp_path, clean_env):
    """The arch tree's Makefile names a common tree another user owns."""
    arch, common = debian_split(tmp_path / "src")
    os.chown(common, NOBODY, NOBODY)
    cache = tmp_path / "cache"
    with pytest.raises(headers.HeadersUntrusted, match=f"owned by uid {NOBODY}"):
        headers.find(str(arch), cache_root=str(cache))
    assert not cache.exists() or not [n for n in os.listdir(cache) if not n.startswith(".")]


@needs_root
def test_a_header_of_another_user_deep_in_the_tree_fails_verify(tmp_path, clean_env):
    _, common = debian_split(tmp_path / "src")
    planted = common / "include/linux/kconfig.h"
    planted.write_text("#define MAX_TASKS 4242\n")
    os.chown(planted, NOBODY, NOBODY)
    tree = headers.find(str(common), cache_root=str(tmp_path / "cache"))  # the top is fine
    with pytest.raises(headers.HeadersUntrusted, match=f"{planted} is owned by uid {NOBODY}"):
        headers.verify(tree)


@needs_root
def test_a_link_into_another_users_directory_fails_verify(tmp_path, clean_env):
    _, common = debian_split(tmp_path / "src")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "kconfig.h").write_text("#define MAX_TASKS 4242\n")
    os.chown(theirs, NOBODY, NOBODY)
    (common / "include/linux/kconfig.h").symlink_to(theirs / "kconfig.h")
    tree = headers.find(str(common), cache_root=str(tmp_path / "cache"))
    with pytest.raises(headers.HeadersUntrusted, match=f"points to {theirs}/kconfig.h: {theirs} is owned"):
        headers.verify(tree)


def test_verify_passes_a_merged_tree_of_trusted_trees(tmp_path, clean_env):
    arch, _ = debian_split(tmp_path / "src")
    tree = headers.find(str(arch), cache_root=str(tmp_path / "cache"))
    headers.verify(tree)


@needs_root
def test_an_older_or_foreign_merge_is_not_reused(tmp_path, clean_env):
    """A directory in the cache that merely carries the mark (as an older
    pstate's merge did, linking wherever its Makefile said) is not used:
    the merge is made again from the trusted trees, under its own name."""
    arch, common = debian_split(tmp_path / "src")
    cache = tmp_path / "cache"
    theirs = tmp_path / "theirs"
    (theirs / "include/linux").mkdir(parents=True)
    (theirs / "include/linux/kconfig.h").write_text("#define MAX_TASKS 4242\n")
    os.chown(theirs, NOBODY, NOBODY)
    first = headers.merged_tree(str(arch), str(common), str(cache))
    name = os.path.basename(first)
    # a poisoned merge under the old name and under the new one
    for poisoned in (cache / arch.name, cache / (name + ".bad")):
        poisoned.mkdir(parents=True)
        (poisoned / "include").symlink_to(theirs / "include")
        (poisoned / ".pstate-merged").write_text(f"{arch}\n{theirs}\n")
    with open(os.path.join(first, ".pstate-merged"), "a") as f:
        f.write("tampered\n")
    again = headers.merged_tree(str(arch), str(common), str(cache))
    assert os.path.realpath(os.path.join(again, "include/linux/sched.h")) == str(common / "include/linux/sched.h")
    assert headers.identity(again)[1].startswith("pstate-merged 2\n")


def test_identity_is_cheap_and_changes_with_the_package(tmp_path, monkeypatch):
    arch, common = debian_split(tmp_path / "src")
    info = tmp_path / "dpkg-info"
    info.mkdir()
    monkeypatch.setattr(headers, "DPKG_INFO", str(info))
    a = headers.identity(str(common))
    (info / f"{common.name}.list").write_text("/usr/src/...\n")
    assert headers.identity(str(common)) != a


# --- links followed hop by hop -------------------------------------------------------------------


def _two_hop_chain(tmp_path, common, relative=False):
    """common's kconfig.h -> theirs/hop -> a root-owned file elsewhere: the
    chain ends at a trusted file, but its middle link sits in a directory
    nobody owns, so nobody can point it anywhere."""
    real = tmp_path / "real"
    real.mkdir()
    (real / "kconfig.h").write_text("/* root's */\n")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "hop").symlink_to("../real/kconfig.h" if relative else real / "kconfig.h")  # root's own link
    os.chown(theirs, NOBODY, NOBODY)
    planted = common / "include/linux/kconfig.h"
    planted.symlink_to(theirs / "hop")
    return planted, real, theirs


@needs_root
@pytest.mark.parametrize("relative", [False, True])
def test_a_two_hop_link_through_another_users_directory_fails_verify(tmp_path, clean_env, relative):
    _, common = debian_split(tmp_path / "src")
    planted, real, theirs = _two_hop_chain(tmp_path, common, relative)
    tree = headers.find(str(common), cache_root=str(tmp_path / "cache"))
    with pytest.raises(headers.HeadersUntrusted) as e:
        headers.verify(tree)
    assert e.value.message.split("\n")[0] == (
        f"kernel header tree {common} is not safe to compile as root: "
        f"{planted} points to {real}/kconfig.h: {theirs} is owned by uid {NOBODY}, not root")
    os.chown(theirs, 0, 0)  # the same chain with root's directory in the middle is fine
    headers.verify(tree)


@needs_root
def test_a_middle_link_of_another_user_fails_verify(tmp_path, clean_env):
    _, common = debian_split(tmp_path / "src")
    planted, real, theirs = _two_hop_chain(tmp_path, common)
    os.chown(theirs, 0, 0)
    os.lchown(theirs / "hop", NOBODY, NOBODY)
    with pytest.raises(headers.HeadersUntrusted, match=f"{planted} points to {real}/kconfig.h: "
                                                       f"{theirs}/hop is a symbolic link owned by uid {NOBODY}"):
        headers.verify(headers.find(str(common), cache_root=str(tmp_path / "cache")))


@needs_root
def test_a_directory_reached_through_a_chain_is_checked_at_every_hop(tmp_path):
    """The directories above a path: a root-owned link to a link in nobody's
    directory, that one to a root-owned directory."""
    (tmp_path / "real").mkdir()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "hop").symlink_to(tmp_path / "real")
    os.chown(theirs, NOBODY, NOBODY)
    (tmp_path / "via").symlink_to(theirs / "hop")
    assert trust.why_untrusted_ancestors(str(tmp_path / "via" / "kconfig.h")) == \
        f"{theirs} is owned by uid {NOBODY}, not root"
    assert trust.why_untrusted_ancestors(str(tmp_path / "real" / "kconfig.h")) is None


def test_a_file_others_can_write_in_a_merged_tree_source_is_refused_before_the_compile(tmp_path, clean_env):
    """The merge is links; what they lead to is checked with the merged tree
    before each compile (verify), hop by hop into the source trees."""
    arch, common = debian_split(tmp_path / "src")
    os.chmod(common / "include/linux/sched.h", 0o666)
    tree = headers.find(str(arch), cache_root=str(tmp_path / "cache"))
    assert tree.origin == "explicit, merged"
    with pytest.raises(headers.HeadersUntrusted, match="sched.h is writable by group or others"):
        headers.verify(tree)

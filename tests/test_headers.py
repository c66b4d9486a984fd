"""Finding a kernel header tree, and merging Debian's split trees."""

from __future__ import annotations

import os

import pytest

from pstate.kernel import headers
from pstate.kernel.headers import HeadersNotFound


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
    assert [n for n in os.listdir(cache) if n.startswith(".merge-")] == []  # no temporary left


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


def test_find_distribution_tree_when_the_running_kernel_has_none(tmp_path, clean_env, monkeypatch):
    src = tmp_path / "src"
    arch, common = debian_split(src)
    real = headers.distribution_trees
    monkeypatch.setattr(headers, "distribution_trees", lambda: real(str(src)))
    tree = headers.find(release="0.0.0-no-such-kernel", cache_root=str(tmp_path / "cache"))
    assert tree.origin == "distribution, merged"
    assert tree.detail == f"{arch.name} + {common.name}"
    assert os.path.isfile(os.path.join(tree.path, "include/generated/autoconf.h"))


def test_find_unsplit_distribution_tree(tmp_path, clean_env, monkeypatch):
    tree_dir = tmp_path / "src" / "linux-headers-4.19.0"
    for d in ("include/generated", "include/linux", "arch/x86"):
        (tree_dir / d).mkdir(parents=True)
    monkeypatch.setattr(headers, "distribution_trees", lambda: [(str(tree_dir), None)])
    tree = headers.find(release="0.0.0-no-such-kernel", cache_root=str(tmp_path / "cache"))
    assert (tree.path, tree.origin) == (str(tree_dir), "distribution")


def test_headers_not_found(tmp_path, clean_env, monkeypatch):
    monkeypatch.setattr(headers, "distribution_trees", lambda: [])
    with pytest.raises(HeadersNotFound) as e:
        headers.find(release="0.0.0-no-such-kernel", cache_root=str(tmp_path / "cache"))
    assert str(e.value) == ("no kernel headers for 0.0.0-no-such-kernel: /lib/modules/0.0.0-no-such-kernel/build "
                            "is missing and /usr/src has no linux-headers-* tree")


def test_running_kernel_build_dir_comes_first(clean_env):
    release = os.uname().release
    if not os.path.isdir(f"/lib/modules/{release}/build"):
        pytest.skip("the running kernel has no /lib/modules/<release>/build")
    tree = headers.find()
    assert tree.origin == "running kernel"


# --- trust: headers are code that root compiles ----------------------------------------------

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


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

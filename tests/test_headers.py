"""Finding a kernel header tree, and merging Debian's split trees."""

from __future__ import annotations

import os

import pytest

from pstate import headers
from pstate.headers import HeadersNotFound


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
    assert dst == str(cache / arch.name)
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

"""Fetching a kernel of the matrix (tests/kernels/fetch.py) into a cache that
does not exist yet, as on a fresh machine: apt and dpkg are stood in for, so
no root, no network."""

from __future__ import annotations

import os

import fetch

KVER = "6.1.0-57-amd64"
PACKAGES = [f"linux-image-{KVER}", f"linux-headers-{KVER}", "linux-headers-6.1.0-57-common"]


def fake_run(cmd, cwd=None, **kw):
    """apt-get download writes one .deb per package; dpkg-deb -x unpacks a
    boot/ and lib/modules/ tree; everything else succeeds with no output."""
    if cmd[0] == "apt-get" and "download" in cmd:
        for name in cmd[cmd.index("download") + 1:]:
            open(os.path.join(cwd, f"{name}_1_amd64.deb"), "w").close()
    elif cmd[:2] == ["dpkg-deb", "-x"]:
        root = cmd[3]
        os.makedirs(os.path.join(root, "boot"), exist_ok=True)
        os.makedirs(os.path.join(root, "lib", "modules", KVER), exist_ok=True)
        open(os.path.join(root, "boot", f"vmlinuz-{KVER}"), "w").close()
    return ""


def test_a_fresh_cache_gets_its_roots_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(fetch, "_run", fake_run)
    monkeypatch.setattr(fetch, "archive_uris", lambda: {"main": "http://archive.invalid/debian"})
    monkeypatch.setattr(fetch, "packages", lambda opts, image: (KVER, PACKAGES))
    cache = tmp_path / "cache"  # not there yet
    kernel = {"id": "deb61", "suites": ["bookworm"], "image": "linux-image-6.1.*-amd64"}
    root, kver = fetch.fetch(kernel, str(cache), log=lambda *a: None)
    assert (root, kver) == (str(cache / "roots" / "deb61"), KVER)
    assert (cache / "roots" / "deb61" / "KVER").read_text() == KVER + "\n"
    assert (cache / "roots" / "deb61" / "PACKAGES").read_text().split() == sorted(f"{p}_1_amd64.deb" for p in PACKAGES)
    assert sorted(os.listdir(cache / "roots")) == ["deb61"]  # no temporary directory is left
    # a second call takes what is there
    assert fetch.fetch(kernel, str(cache), log=lambda *a: None) == (root, kver)

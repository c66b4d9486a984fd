"""Fetch one kernel of the matrix: its Debian packages, downloaded with apt in
a private configuration and unpacked under the harness's cache; and its raw
BTF, taken out of the vmlinux inside the image.

Nothing is installed: apt reads a sources list, package lists, a status
file and an archive directory of its own (CACHE/apt/<id>/), and only
`apt-get download` runs. The archive URIs are the machine's own, read at run
time from /etc/apt/sources.list and /etc/apt/sources.list.d/ (one-line and
deb822 formats); the signatures are checked against Debian's keyring.

    CACHE/roots/<id>/      the packages unpacked (boot/, lib/modules/, usr/src/, usr/lib/linux-kbuild-*)
    CACHE/roots/<id>/KVER  the kernel release (uname -r of the guest)
    CACHE/debs/<id>/       the .deb files
"""

from __future__ import annotations

import glob
import lzma
import os
import re
import shutil
import subprocess
import tempfile
import zlib

KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# Debian suite names (a machine's other sources, a vendor's, are left out)
DEBIAN_SUITE = re.compile(r"^(buster|bullseye|bookworm|trixie|forky|duke|sid|oldoldstable|oldstable|stable|"
                          r"testing|unstable)(-updates|-security|-backports|-proposed-updates)?$")
BTF_MAGIC = b"\x9f\xeb"  # 0xeB9F, little-endian


class FetchError(Exception):
    pass


# --- the machine's apt sources -----------------------------------------------

def _one_line_sources(text: str):
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith("deb "):
            continue
        words = line.split()[1:]
        if words and words[0].startswith("["):  # options: [signed-by=... arch=...]
            while words and not words[0].endswith("]"):
                words.pop(0)
            words.pop(0)
        if len(words) >= 2:
            yield words[0], [words[1]]


def _deb822_sources(text: str):
    for stanza in re.split(r"\n\s*\n", text):
        fields, key = {}, None
        for line in stanza.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            if line[0] in " \t" and key:  # a continuation line
                fields[key] += " " + line.strip()
                continue
            key, _, value = line.partition(":")
            key = key.strip().lower()
            fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            yield uri, fields.get("suites", "").split()


def archive_uris(etc: str = "/etc/apt") -> dict[str, str]:
    """{"main": URI, "security": URI} of the Debian archives the machine's apt
    sources name (the security archive falls back to the main one's URI)."""
    found = []
    paths = [os.path.join(etc, "sources.list")] + sorted(glob.glob(os.path.join(etc, "sources.list.d", "*")))
    for path in paths:
        if not os.path.isfile(path):
            continue
        with open(path, errors="replace") as f:
            text = f.read()
        if path.endswith(".sources"):
            found += list(_deb822_sources(text))
        elif path.endswith(".list"):
            found += list(_one_line_sources(text))
    uris = {}
    for uri, suites in found:
        for suite in suites:
            if DEBIAN_SUITE.match(suite):
                uris.setdefault("security" if suite.endswith("-security") else "main", uri.rstrip("/"))
    if "main" not in uris:
        raise FetchError(f"no Debian archive in {etc}/sources.list or {etc}/sources.list.d/: "
                         "the kernels are fetched from the machine's own Debian mirror")
    uris.setdefault("security", uris["main"])
    return uris


# --- apt in a private configuration ------------------------------------------

def apt_options(adir: str) -> list[str]:
    """apt-get/apt-cache options that keep every piece of state in adir."""
    return ["-o", f"Dir::Etc::SourceList={adir}/sources.list",
            "-o", f"Dir::Etc::SourceParts={adir}/sources.list.d",
            "-o", f"Dir::Etc::Preferences={adir}/preferences",
            "-o", f"Dir::Etc::PreferencesParts={adir}/preferences.d",
            "-o", f"Dir::State={adir}/state",
            "-o", f"Dir::State::Lists={adir}/lists",
            "-o", f"Dir::State::status={adir}/status",
            "-o", f"Dir::Cache={adir}/cache",
            "-o", "APT::Get::List-Cleanup=false",
            "-o", "Acquire::Languages=none"]


def _apt_setup(adir: str, suites: list[str], uris: dict[str, str]) -> list[str]:
    for d in ("sources.list.d", "preferences.d", "state", "lists/partial", "cache/archives/partial"):
        os.makedirs(os.path.join(adir, d), exist_ok=True)
    open(os.path.join(adir, "status"), "a").close()
    lines = [f"deb [signed-by={KEYRING}] {uris['security' if s.endswith('-security') else 'main']} {s} main"
             for s in suites]
    with open(os.path.join(adir, "sources.list"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return apt_options(adir)


def _run(cmd: list[str], **kw) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        words = [c for i, c in enumerate(cmd) if not c.startswith("-") and (i == 0 or cmd[i - 1] != "-o")]
        name = " ".join(words[:2])
        raise FetchError(f"{name} failed (exit {p.returncode}): {p.stderr.strip()[-2000:]}")
    return p.stdout


def _natural(name: str):
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


def _depends(opts: list[str], package: str) -> list[str]:
    out = _run(["apt-cache", *opts, "depends", package])
    return [line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("Depends:")]


def packages(opts: list[str], image_re: str) -> tuple[str, list[str]]:
    """The kernel release and the packages to download: the newest image
    matching image_re, its linux-headers, and what those depend on of
    linux-headers-*-common* and linux-kbuild-*."""
    names = _run(["apt-cache", *opts, "pkgnames", "linux-image-"]).split()
    images = sorted((n for n in names if re.fullmatch(image_re, n)), key=_natural)
    if not images:
        raise FetchError(f"no package matches {image_re}")
    image = images[-1]
    kver = image[len("linux-image-"):]
    headers = f"linux-headers-{kver}"
    more = [d for d in _depends(opts, headers) if d.startswith(("linux-headers-", "linux-kbuild-"))]
    if not any(d.startswith("linux-headers-") for d in more):
        raise FetchError(f"{headers} depends on no linux-headers-*-common package")
    return kver, [image, headers, *more]


def fetch(kernel: dict, cache: str, refresh: bool = False, log=print) -> tuple[str, str]:
    """The unpacked root of the kernel and its release, fetched when missing
    (or, with refresh, when the archive has a newer one)."""
    kid = kernel["id"]
    root = os.path.join(cache, "roots", kid)
    kver_file = os.path.join(root, "KVER")
    if os.path.exists(kver_file) and not refresh:
        with open(kver_file) as f:
            return root, f.read().strip()
    adir = os.path.join(cache, "apt", kid)
    opts = _apt_setup(adir, kernel["suites"], archive_uris())
    log(f"{kid}: apt-get update ({', '.join(kernel['suites'])})")
    _run(["apt-get", *opts, "-q", "update"])
    kver, pkgs = packages(opts, kernel["image"])
    if os.path.exists(kver_file):
        with open(kver_file) as f:
            if f.read().strip() == kver:
                return root, kver
    debs = os.path.join(cache, "debs", kid)
    shutil.rmtree(debs, ignore_errors=True)
    os.makedirs(debs)
    log(f"{kid}: downloading {' '.join(pkgs)}")
    _run(["apt-get", *opts, "-q", "download", *pkgs], cwd=debs)
    os.makedirs(os.path.join(cache, "roots"), mode=0o755, exist_ok=True)  # a fresh machine has none
    tmp = tempfile.mkdtemp(prefix=f".{kid}-", dir=os.path.join(cache, "roots"))
    for deb in sorted(glob.glob(os.path.join(debs, "*.deb"))):
        _run(["dpkg-deb", "-x", deb, tmp])
    # usr-merged packages (trixie) ship usr/lib/modules only
    if not os.path.exists(os.path.join(tmp, "lib", "modules")) and os.path.isdir(os.path.join(tmp, "usr/lib/modules")):
        os.makedirs(os.path.join(tmp, "lib"), exist_ok=True)
        os.symlink("../usr/lib/modules", os.path.join(tmp, "lib", "modules"))
    # the packages' postinst would run depmod; the guest's modprobe needs modules.dep
    _run(["depmod", "-b", tmp, kver])
    os.chmod(tmp, 0o755)
    with open(os.path.join(tmp, "KVER"), "w") as f:
        f.write(kver + "\n")
    with open(os.path.join(tmp, "PACKAGES"), "w") as f:
        f.write("\n".join(sorted(os.path.basename(d) for d in glob.glob(os.path.join(debs, "*.deb")))) + "\n")
    if os.path.exists(root):
        shutil.rmtree(root)
    os.rename(tmp, root)
    log(f"{kid}: {kver} unpacked in {root}")
    return root, kver


# --- the kernel's BTF ----------------------------------------------------------

def _decompressors():
    def xz(data):
        return lzma.LZMADecompressor().decompress(data)

    def gz(data):
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)

    def zstd(data):
        try:
            import zstandard
        except ImportError:
            return subprocess.run(["zstd", "-dc"], input=data, capture_output=True).stdout
        return zstandard.ZstdDecompressor().decompressobj().decompress(data)

    return ((b"\xfd7zXZ\x00", xz), (b"\x1f\x8b\x08", gz), (b"\x28\xb5\x2f\xfd", zstd))


def vmlinux_of(image: bytes) -> bytes:
    """The ELF vmlinux inside a bzImage: the first xz, gzip or zstd stream
    that decompresses to an ELF file."""
    for magic, decompress in _decompressors():
        at = image.find(magic)
        while at >= 0:
            try:
                out = decompress(image[at:])
            except Exception:
                out = b""
            if out[:4] == b"\x7fELF":
                return out
            at = image.find(magic, at + 1)
    raise FetchError("no compressed vmlinux found in the kernel image")


def raw_btf(vmlinuz: str) -> bytes:
    """The .BTF section of the vmlinux inside the image at vmlinuz."""
    with open(vmlinuz, "rb") as f:
        elf = vmlinux_of(f.read())
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "vmlinux"), os.path.join(tmp, "btf")
        with open(src, "wb") as f:
            f.write(elf)
        _run(["objcopy", "-O", "binary", "--only-section=.BTF", src, dst])
        with open(dst, "rb") as f:
            data = f.read()
    if data[:2] != BTF_MAGIC:
        raise FetchError(f"{vmlinuz}: its vmlinux has no .BTF section")
    return data


def save_btf(raw: bytes, path: str) -> bool:
    """Write raw BTF xz-compressed at path, unless it holds the same BTF
    already; True when the file was (re)written."""
    if os.path.exists(path):
        with lzma.open(path) as f:
            if f.read() == raw:
                return False
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME))
    os.rename(tmp, path)
    return True

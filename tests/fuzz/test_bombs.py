"""Compressed input has a memory bound (issue #35, item 2).

A small file can decompress to gigabytes: 263 KB of zstd made of 8 GiB of
zeros grew `pstate stats` to 16.9 GB. Here bombs are made at a small scale
(48 MiB decompressed, a few KB to 150 KB compressed): zeros, one valid
state line repeated, and one line longer than the line limit, each as gzip
and as zstd. Every reader command (the commands whose arguments are
files, found from the command table, so a new one cannot be left out)
reads each in a process of its own, whose peak RSS must stay within twice
that of `pstate stats` on an empty file, measured in the same test; and
each reports the bomb exactly as it reports the same bytes uncompressed.

A zstd frame that asks for a window larger than pstate accepts
(compression.MAX_WINDOW) is refused with a message saying so, before
anything that large is allocated.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import click
import orjson
import pytest

from conftest import pstate_cmd, run_measured
from pstate.main import COMMANDS, cli
from pstate.stream import compression
from pstate.stream.streamio import MAX_LINE

zstd = pytest.importorskip("zstandard")

MB = 1 << 20
SIZE = 48 * MB  # decompressed bytes of a bomb
LINE = (b'{"type":"state","ts":1000,"cpu":0,"pid":1,"tid":1,"comm":"bomb","from":"running","to":"sleeping",'
        b'"dur_ns":5,"cause":"switch_out"}\n')
VALID_LINES = SIZE // len(LINE)
TAIL = LINE.replace(b'"ts":1000', b'"ts":2000')  # a record after the long line
SNAP_NAME = "pstate-snap-20250101T000000.000000Z-000001"  # a name stats DIR/ reads


def reader_commands() -> list[str]:
    """The commands of `pstate` that read recordings: those that take FILE
    arguments (main.COMMANDS, through click)."""
    out = []
    for name in COMMANDS:
        cmd = cli.get_command(None, name)
        if any(isinstance(p, click.Argument) and isinstance(p.type, click.Path) for p in cmd.params):
            out.append(name)
    return out


READERS = reader_commands()
# What a reader needs besides its files to read them to the end without a terminal.
ARGS = {"replay": ["--no-wait"], "export": ["-q"]}


def directory_readers() -> list[str]:
    """The readers that take a directory (of snapshots) as well: those that
    do not refuse an empty one as a directory."""
    from click.testing import CliRunner

    out = []
    with tempfile.TemporaryDirectory() as d:
        for name in READERS:
            r = CliRunner().invoke(cli, [name, *ARGS.get(name, []), d + "/"])
            if "is a directory" not in r.output:
                out.append(name)
    return out


DIR_READERS = directory_readers()
BOMBS = ["zeros", "valid", "long"]
CODECS = ["gzip", "zstd"]


def test_the_readers_are_found():
    assert {"stats", "heat", "replay", "export"} <= set(READERS)
    assert "record" not in READERS and "snap" not in READERS
    assert {"stats", "heat"} <= set(DIR_READERS) <= set(READERS)


# --- making bombs ----------------------------------------------------------------


def pieces(kind: str):
    """The decompressed bytes of a bomb, in pieces."""
    if kind == "zeros":
        for _ in range(SIZE // MB):
            yield b"\0" * MB
    elif kind == "valid":
        block = LINE * (MB // len(LINE))
        n = VALID_LINES
        while n:
            k = min(n, MB // len(LINE))
            yield block[:k * len(LINE)]
            n -= k
    else:
        yield b'{"type":"state","comm":"'
        for _ in range(SIZE // MB):
            yield b"a" * MB
        yield b'"}\n' + TAIL


def write_compressed(path, kind: str, codec: str, window_log: int = 23) -> None:
    """A bomb as a stream compressor writes it (the size unknown up front,
    as from a pipe): gzip, or zstd with a window of 2**window_log bytes."""
    with open(path, "wb") as f:
        if codec == "gzip":
            c = zlib_gzip()
            for p in pieces(kind):
                f.write(c.compress(p))
            f.write(c.flush())
        else:
            params = zstd.ZstdCompressionParameters.from_level(3, window_log=window_log)
            c = zstd.ZstdCompressor(compression_params=params).compressobj()
            for p in pieces(kind):
                f.write(c.compress(p))
            f.write(c.flush())


def zlib_gzip():
    import zlib

    return zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory):
    """dir/plain/<kind>.jsonl and dir/<codec>/<kind>.jsonl: the same name, so
    that reports differ only in the directory."""
    base = tmp_path_factory.mktemp("bombs")
    for sub in ["plain", *CODECS]:
        (base / sub).mkdir()
    for kind in BOMBS:
        with open(base / "plain" / f"{kind}.jsonl", "wb") as f:
            for p in pieces(kind):
                f.write(p)
        for codec in CODECS:
            write_compressed(base / codec / f"{kind}.jsonl", kind, codec)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_the_bombs_are_bombs(bombs):
    for kind in BOMBS:
        assert (bombs / "plain" / f"{kind}.jsonl").stat().st_size > SIZE - len(LINE)
        for codec in CODECS:
            small = (bombs / codec / f"{kind}.jsonl").stat().st_size
            assert small < SIZE // 200, (kind, codec, small)
    assert gzip.decompress((bombs / "gzip" / "valid.jsonl").read_bytes()) == LINE * VALID_LINES
    frame = zstd.get_frame_parameters((bombs / "zstd" / "zeros.jsonl").read_bytes()[:18])
    assert frame.window_size == compression.MAX_WINDOW  # the largest window accepted


# --- running a reader, measured ----------------------------------------------------

@dataclass
class Run:
    code: int
    out_digest: str  # sha256 of stdout, with the directory of the input made neutral
    out: bytes  # its first 64 KiB
    err: str
    rss: int  # peak RSS, bytes


def run(args: list[str], neutral: str | None = None, timeout: float = 240) -> Run:
    """pstate ARGS in a process of its own: exit code, stdout, stderr and peak
    RSS; neutral: a directory named in the output, replaced by DIR."""
    code, data, text, rss = run_measured(pstate_cmd(*args), timeout=timeout)
    if neutral:
        data = data.replace(neutral.encode(), b"DIR")
        text = text.replace(neutral, "DIR")
    return Run(code, hashlib.sha256(data).hexdigest(), data[:1 << 16], text, rss * 1024)


def baseline() -> int:
    """Peak RSS of `pstate stats` on an empty file."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as empty:
        r = run(["stats", empty.name])
    assert r.code == 0, r.err
    return r.rss


def within_bound(r: Run, base: int, what: str) -> None:
    print(f"{what}: peak RSS {r.rss / MB:.1f} MB (stats on an empty file: {base / MB:.1f} MB)")
    assert "Traceback" not in r.err, r.err[-3000:]
    assert r.rss <= 2 * base, f"{what}: peak RSS {r.rss / MB:.1f} MB > 2 x {base / MB:.1f} MB"


_plain_runs: dict = {}


def plain(bombs, cmd: str, kind: str) -> Run:
    """The command on the uncompressed bomb (once per module)."""
    key = (cmd, kind)
    if key not in _plain_runs:
        _plain_runs[key] = run([cmd, *ARGS.get(cmd, []), str(bombs / "plain" / f"{kind}.jsonl")],
                               neutral=str(bombs / "plain"))
    return _plain_runs[key]


@pytest.mark.time_limit(600)
@pytest.mark.parametrize("kind", BOMBS)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("cmd", READERS)
def test_a_bomb_is_read_in_bounded_memory_as_plain_input_is(bombs, cmd, codec, kind):
    base = baseline()
    got = run([cmd, *ARGS.get(cmd, []), str(bombs / codec / f"{kind}.jsonl")], neutral=str(bombs / codec))
    within_bound(got, base, f"{cmd} {kind}.{codec}")
    want = plain(bombs, cmd, kind)
    # the same bytes uncompressed: the same exit code, output and report
    assert (got.code, got.err, got.out_digest) == (want.code, want.err, want.out_digest), (got.err, want.err)
    if kind == "zeros":  # garbage: not one valid record
        assert got.code == 65
        assert f"DIR/zeros.jsonl starts with {SIZE} NUL bytes" in got.err
        assert "error: not one valid record in the input" in got.err
    elif kind == "long":
        assert got.code == 0
        assert f"skipped 1 line: line longer than {MAX_LINE} bytes (first at DIR/long.jsonl:1)" in got.err
    else:
        assert got.code == 0 and got.err == ""


@pytest.mark.time_limit(300)
@pytest.mark.parametrize("codec", CODECS)
def test_the_valid_line_bomb_is_counted(bombs, codec):
    base = baseline()
    r = run(["stats", "--format", "json", str(bombs / codec / "valid.jsonl")])
    within_bound(r, base, f"stats --format json valid.{codec}")
    assert r.code == 0, r.err
    rep = orjson.loads(r.out)
    assert rep["input"]["records"] == rep["input"]["lines"] == VALID_LINES
    assert rep["input"]["complete"] is True


@pytest.mark.time_limit(300)
@pytest.mark.parametrize("kind", BOMBS)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("cmd", DIR_READERS)
def test_a_bomb_in_a_snapshot_directory(bombs, tmp_path, cmd, codec, kind):
    """stats DIR/ (and every reader that takes a directory) opens snapshot
    files through the same reader: a compressed one is bounded too."""
    d = tmp_path / "snaps"
    d.mkdir()
    shutil.copy(bombs / codec / f"{kind}.jsonl", d / f"{SNAP_NAME}.jsonl")
    base = baseline()
    r = run([cmd, *ARGS.get(cmd, []), f"{d}/"])
    within_bound(r, base, f"{cmd} DIR/ with {kind}.{codec}")
    assert r.code in (0, 1, 65, 66), r.err  # (1: no usable snapshot in DIR)


@pytest.mark.parametrize("cmd", ["stats", "heat"])
def test_a_zero_bomb_as_a_csv_snapshot(bombs, tmp_path, cmd):
    d = tmp_path / "snaps"
    d.mkdir()
    shutil.copy(bombs / "zstd" / "zeros.jsonl", d / f"{SNAP_NAME}.csv")
    base = baseline()
    r = run([cmd, f"{d}/"])
    within_bound(r, base, f"{cmd} DIR/ with a CSV zeros.zstd")


# --- windows ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def wide_window(tmp_path_factory):
    """8 MiB of zeros in a zstd frame with a 128 MiB window (zstd --long=27)."""
    path = tmp_path_factory.mktemp("wide") / "wide.jsonl.zst"
    params = zstd.ZstdCompressionParameters.from_level(3, window_log=27, enable_ldm=True)
    c = zstd.ZstdCompressor(compression_params=params).compressobj()
    with open(path, "wb") as f:
        f.write(c.compress(b"\0" * (8 * MB)))
        f.write(c.flush())
    assert zstd.get_frame_parameters(path.read_bytes()[:18]).window_size == 128 * MB
    return path


def refused(r: Run, path, window: str) -> None:
    assert r.code == 65, r.err
    assert (f"{path}: a zstd frame needs a window of {window} to decompress; pstate reads frames of "
            f"windows up to {compression.MAX_WINDOW >> 20} MiB") in r.err, r.err
    assert "zstd -dc --long=31" in r.err


@pytest.mark.parametrize("cmd", READERS)
def test_a_window_larger_than_the_limit_is_refused(wide_window, cmd):
    base = baseline()
    r = run([cmd, *ARGS.get(cmd, []), str(wide_window)])
    within_bound(r, base, f"{cmd} with a 128 MiB window")
    refused(r, wide_window, "128 MiB")


@pytest.mark.skipif(not os.access("/usr/bin/zstd", os.X_OK), reason="no zstd command")
def test_the_reproduction_of_the_issue(tmp_path):
    """head -c 8G /dev/zero | zstd -19 --long=27 (here 64 MiB): refused, in a
    bounded memory."""
    path = tmp_path / "b.zst"
    with open(path, "wb") as out:
        gen = subprocess.Popen(["head", "-c", str(64 * MB), "/dev/zero"], stdout=subprocess.PIPE)
        subprocess.run(["/usr/bin/zstd", "-q", "-19", "--long=27", "-c"], stdin=gen.stdout, stdout=out, check=True)
        gen.stdout.close()
        gen.wait()
    base = baseline()
    r = run(["stats", str(path)])
    within_bound(r, base, "stats b.zst (zstd -19 --long=27)")
    refused(r, path, "128 MiB")


def test_bounded_lines_passes_over_a_long_line_as_it_comes():
    import io

    from pstate.snapshots.snapdir import bounded_lines

    data = b"a,b\n" + b"x" * 100 + b"\n1,2\n" + b"y" * 50 + b"\ntail"
    assert list(bounded_lines(io.BytesIO(data), max_line=40, chunk=7)) == [b"a,b\n", None, b"1,2\n", None, b"tail"]
    assert list(bounded_lines(io.BytesIO(b"z" * 100), max_line=40, chunk=7)) == [None]
    assert list(bounded_lines(io.BytesIO(b""), max_line=40)) == []

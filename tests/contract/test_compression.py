"""Compressed streams: recognised by their magic bytes, frames one after
another read as one stream, a cut or corrupt stream ends where it stops
decoding and says so, and what the writers write reads back."""

from __future__ import annotations

import gzip
import io
import os
import sys

import pytest

from pstate.stream import compression
from pstate.exitcodes import PstateError

zstd = pytest.importorskip("zstandard")

DATA = b"".join(b'{"type":"state","ts":%d,"cpu":0,"pid":1,"tid":1,"from":"running","to":"sleeping"}\n' % i
                for i in range(50_000))


class Trickle(io.RawIOBase):
    """A pipe: reads return at most 3 bytes."""

    def __init__(self, data: bytes):
        self.data = data

    def readable(self):
        return True

    def read(self, n=-1):
        n = 3 if n is None or n < 0 else min(n, 3)
        out, self.data = self.data[:n], self.data[n:]
        return out


def read_all(data: bytes, trickle: bool = False):
    src = Trickle(data) if trickle else io.BytesIO(data)
    fp, kind = compression.open_decompressed(src, "x")
    out = []
    while True:
        chunk = fp.read(65536)
        if not chunk:
            break
        out.append(chunk)
    return b"".join(out), kind, getattr(fp, "damage", None)


def zst(data: bytes) -> bytes:
    return zstd.ZstdCompressor(level=3).compress(data)


@pytest.mark.parametrize("trickle", [False, True])
def test_magic_bytes_not_names(trickle):
    assert read_all(zst(DATA[:5000]), trickle) == (DATA[:5000], "zstd", None)
    assert read_all(gzip.compress(DATA[:5000]), trickle) == (DATA[:5000], "gzip", None)
    assert read_all(DATA[:5000], trickle) == (DATA[:5000], None, None)
    assert read_all(b"{", trickle) == (b"{", None, None)
    assert read_all(b"", trickle) == (b"", None, None)


def test_concatenated_frames_are_one_stream():
    half = len(DATA) // 2
    assert read_all(zst(DATA[:half]) + zst(DATA[half:])) == (DATA, "zstd", None)
    assert read_all(gzip.compress(DATA[:half]) + gzip.compress(DATA[half:])) == (DATA, "gzip", None)


@pytest.mark.parametrize("make", [zst, gzip.compress], ids=["zstd", "gzip"])
def test_a_cut_stream_ends_where_it_stops_decoding(make):
    whole = make(DATA)
    out, _kind, damage = read_all(whole[: len(whole) // 2])
    assert damage == "truncated"
    assert DATA.startswith(out) and len(out) < len(DATA)


def test_a_corrupt_stream_says_so():
    whole = bytearray(zst(DATA))
    whole[len(whole) // 2:] = os.urandom(len(whole) - len(whole) // 2)
    out, _kind, damage = read_all(bytes(whole))
    assert damage and damage.startswith(("corrupt", "truncated"))
    assert DATA.startswith(out)


@pytest.mark.parametrize("kind", ["zstd", "gzip"])
def test_writers_round_trip(kind, tmp_path):
    path = tmp_path / ("x.zst" if kind == "zstd" else "x.gz")
    assert compression.compressor_for(str(path)) == kind
    with open(path, "wb") as raw:
        w = compression.compressed_writer(raw, kind)
        w.write(DATA[:1000])
        w.flush()  # a block boundary: what was written so far decodes
        assert read_all(path.read_bytes())[0] == DATA[:1000]
        w.write(DATA[1000:])
        w.close()
    assert read_all(path.read_bytes()) == (DATA, kind, None)


def test_names():
    assert compression.compressor_for("rec.jsonl") is None
    assert compression.compressor_for("-") is None
    assert compression.compressor_for("rec.jsonl.zst") == "zstd"
    assert compression.compressor_for("rec.jsonl.gz") == "gzip"


def test_without_zstandard_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(PstateError) as e:
        compression.open_decompressed(io.BytesIO(zst(b"x\n")), "rec.zst")
    assert e.value.exit_code == 69
    assert "rec.zst is zstd-compressed, and the zstandard package is not installed" in e.value.message
    assert "pip install 'pstate[zstd]'" in e.value.message
    # gzip needs nothing
    assert read_all(gzip.compress(b"x\n"))[0] == b"x\n"


# --- bounded memory (issue #35) -----------------------------------------------------


def zeros_gzip(n: int) -> bytes:
    c = __import__("zlib").compressobj(9, 8, 16 + 15)
    return b"".join([c.compress(b"\0" * (1 << 20)) for _ in range(n >> 20)]) + c.flush()


def zeros_zstd(n: int, window_log: int = 23) -> bytes:
    params = zstd.ZstdCompressionParameters.from_level(3, window_log=window_log)
    c = zstd.ZstdCompressor(compression_params=params).compressobj()
    return b"".join([c.compress(b"\0" * (1 << 20)) for _ in range(n >> 20)]) + c.flush()


@pytest.mark.parametrize("make", [zeros_gzip, zeros_zstd], ids=["gzip", "zstd"])
def test_a_bomb_decompresses_in_bounded_pieces(make):
    """64 MiB of zeros from a few KB: read 64 KiB at a time, never more than
    a couple of MiB held (Python's allocations: tracemalloc)."""
    import tracemalloc

    data = make(64 << 20)
    assert len(data) < 100_000
    fp, _kind = compression.open_decompressed(io.BytesIO(data), "bomb")
    tracemalloc.start()
    try:
        total = 0
        while True:
            chunk = fp.read(1 << 16)
            if not chunk:
                break
            assert len(chunk) <= 1 << 16
            total += len(chunk)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == 64 << 20 and fp.damage is None
    assert peak < 4 << 20, f"peak {peak / (1 << 20):.1f} MiB held"


def test_read_gives_at_most_what_is_asked():
    fp, _kind = compression.open_decompressed(io.BytesIO(zst(DATA)), "x")
    got = [fp.read(1000) for _ in range(5)]
    assert all(len(g) == 1000 for g in got) and b"".join(got) == DATA[:5000]
    assert fp.read1(7) == DATA[5000:5007]
    assert fp.read() == DATA[5007:]


@pytest.mark.parametrize("trickle", [False, True])
def test_a_window_up_to_the_limit_is_read_and_a_larger_one_refused(trickle):
    assert compression.MAX_WINDOW == 8 << 20
    data = zeros_zstd(2 << 20, window_log=23)
    assert zstd.get_frame_parameters(data[:18]).window_size == compression.MAX_WINDOW
    assert read_all(data, trickle) == (b"\0" * (2 << 20), "zstd", None)
    wide = zeros_zstd(2 << 20, window_log=24)
    with pytest.raises(PstateError) as e:
        read_all(wide, trickle)
    assert e.value.exit_code == 65
    assert e.value.message.startswith("x: a zstd frame needs a window of 16 MiB to decompress; pstate reads "
                                      "frames of windows up to 8 MiB")
    assert "fix: decompress it first: zstd -dc --long=31 x | pstate ... -" in e.value.message
    # a later frame is held to it too
    with pytest.raises(PstateError):
        read_all(zst(DATA[:100]) + wide)


def test_a_single_segment_frame_needs_its_content_size_as_window():
    """zstd writes a frame whose content size is known and no larger than
    its window as one segment: the window is then the content size."""
    small = zstd.ZstdCompressor(level=3).compress(DATA[:1000])
    assert small[4] & 0x20  # single segment
    assert read_all(small) == (DATA[:1000], "zstd", None)
    big = zstd.ZstdCompressor(level=22).compress(b"x" * (9 << 20))
    assert big[4] & 0x20 and zstd.get_frame_parameters(big[:18]).window_size == 9 << 20
    with pytest.raises(PstateError, match="needs a window of 9 MiB"):
        read_all(big)


@pytest.mark.parametrize("trickle", [False, True])
def test_skippable_frames_are_passed_over(trickle):
    skip = compression._SKIPPABLE.to_bytes(4, "little") + (5).to_bytes(4, "little") + b"hello"
    data = zst(DATA[:3000]) + skip + zst(DATA[3000:6000]) + skip
    assert read_all(data, trickle) == (DATA[:6000], "zstd", None)


@pytest.mark.parametrize("cut", [3, 5, 6, 9, 12])
def test_a_stream_cut_in_a_frame_header_is_truncated(cut):
    one = zst(DATA[:3000])
    out, _kind, damage = read_all(one + zst(DATA[3000:6000])[:cut])
    assert (out, damage) == (DATA[:3000], "truncated")


def test_garbage_after_a_frame_is_corrupt():
    for tail in (b"garbage!", b"\0" * 64):
        out, _kind, damage = read_all(zst(DATA[:3000]) + tail)
        assert out == DATA[:3000] and damage.startswith("corrupt"), damage
    out, _kind, damage = read_all(gzip.compress(DATA[:3000]) + b"garbage!")
    assert out == DATA[:3000] and damage.startswith("corrupt"), damage


def test_a_compressed_file_is_a_context_manager(tmp_path):
    """(csv_records reads CSV snapshots with `with open_input(path) as fp`)"""
    from pstate.stream.streamio import open_input

    path = tmp_path / "x.csv"
    path.write_bytes(zst(b"a,b\n1,2\n"))
    with open_input(str(path)) as fp:
        assert io.TextIOWrapper(fp, encoding="utf-8").read() == "a,b\n1,2\n"
    assert fp.closed


# --- through the commands ---------------------------------------------------------

import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

from conftest import TESTS, clean_env, pstate_cmd  # noqa: E402

GOLDEN_INPUT = TESTS / "data" / "heat" / "small.jsonl"


def cmd(*args, stdin=None):
    return subprocess.run(pstate_cmd(*args), input=stdin, capture_output=True, env=clean_env(), timeout=120)


@pytest.fixture
def packed(tmp_path):
    """The golden input compressed, under its own name (heat prints it)."""
    plain = GOLDEN_INPUT.read_bytes()
    for kind, data in (("zst", zst(plain)), ("gz", gzip.compress(plain))):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / GOLDEN_INPUT.name).write_bytes(data)  # magic bytes, not names
    return tmp_path


@pytest.mark.parametrize("args", [["stats"], ["stats", "--format", "json"], ["heat", "--width", "60"],
                                  ["replay", "--no-wait"], ["export", "-f", "chrome"]])
def test_every_reader_reads_compressed_input_as_plain(packed, args):
    want = cmd(*args, str(GOLDEN_INPUT))
    assert want.returncode == 0
    for kind in ("zst", "gz"):
        got = cmd(*args, str(packed / kind / GOLDEN_INPUT.name))
        assert (got.returncode, got.stdout, got.stderr.replace(bytes(packed / kind), bytes(GOLDEN_INPUT.parent))) == \
            (0, want.stdout, want.stderr), kind
    piped = cmd(*args, stdin=(packed / "zst" / GOLDEN_INPUT.name).read_bytes())
    assert (piped.returncode, piped.stdout) == (0, cmd(*args, stdin=GOLDEN_INPUT.read_bytes()).stdout)


def test_a_cut_compressed_file_is_reported_like_a_truncated_one(packed, tmp_path):
    whole = zst(DATA)
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes(whole[: len(whole) // 2])
    r = cmd("stats", str(cut))
    assert r.returncode == 0
    assert (f"pstate stats: warning: truncated final record at {cut} (the compressed data is cut short: "
            "read up to there)\n").encode() in r.stderr
    assert cmd("stats", "--strict", str(cut)).returncode == 65


def test_writing_compressed(tmp_path):
    for name in ("out.jsonl.zst", "out.jsonl.gz"):
        r = cmd("replay", "--no-wait", str(GOLDEN_INPUT), "-o", str(tmp_path / name))
        assert r.returncode == 0, r.stderr
        assert (tmp_path / name).read_bytes()[:2] in (compression.ZSTD_MAGIC[:2], compression.GZIP_MAGIC)
        assert cmd("replay", "--no-wait", str(tmp_path / name)).stdout == \
            cmd("replay", "--no-wait", str(GOLDEN_INPUT)).stdout

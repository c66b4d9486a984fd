"""Compressed streams: recognised by their magic bytes, frames one after
another read as one stream, a cut or corrupt stream ends where it stops
decoding and says so, and what the writers write reads back."""

from __future__ import annotations

import gzip
import io
import os
import sys

import pytest

from pstate import compression
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

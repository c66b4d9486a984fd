"""Compressed recordings: zstd and gzip, read by magic bytes, written by name.

Reading: open_decompressed() looks at the first bytes of a stream (a file or
standard input, never its name) and returns a reader of the decompressed
bytes, or the stream itself when it is not compressed. A compressed stream
that ends early (a copy cut short, a recorder killed mid-frame) or is corrupt
ends the data at the last byte that decoded, and the reader says so in its
`damage` attribute, which the stream reader reports like a truncated file.

Writing: compressor_for(path) picks zstd for *.zst and gzip for *.gz;
compressed_writer() wraps an open binary file. zstd compresses on a worker
thread of its own (zstandard's threads=1), so the recorder's thread only
hands it blocks; gzip (the standard library) compresses on the caller's.

zstd needs the zstandard package (pip install 'pstate[zstd]'; make setup
installs it); gzip needs nothing.
"""

from __future__ import annotations

import gzip
import zlib
from typing import IO

from pstate.exitcodes import ExitCode, PstateError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"
SUFFIXES = {".zst": "zstd", ".zstd": "zstd", ".gz": "gzip"}
ZSTD_LEVEL = 1  # ratio 8.7 on a recording (level 3: 8.8) for three quarters of the CPU
GZIP_LEVEL = 6
_CHUNK = 1 << 20
HINT = "pip install 'pstate[zstd]' (or: make setup), or write an uncompressed file"


def _zstandard():
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard


def _read_exact(fp: IO[bytes], n: int) -> bytes:
    """Up to n bytes: short only at the end of the stream (pipes return less)."""
    out = b""
    while len(out) < n:
        data = fp.read(n - len(out))
        if not data:
            break
        out += data
    return out


class _Prefixed:
    """A stream whose first bytes were read already: gives them back first."""

    def __init__(self, head: bytes, fp: IO[bytes]):
        self.head = head
        self.fp = fp

    def read(self, n: int = -1) -> bytes:
        if self.head:
            if n < 0:
                data, self.head = self.head + self.fp.read(), b""
                return data
            data, self.head = self.head[:n], self.head[n:]
            return data
        return self.fp.read(n)

    read1 = read

    def close(self) -> None:
        self.fp.close()


class _Decompressed:
    """The decompressed bytes of a zstd or gzip stream, read(n) at a time;
    frames (members) one after another are read as one stream."""

    def __init__(self, src, kind: str):
        self.src = src
        self.kind = kind
        self.damage: str | None = None  # "truncated" or "corrupt: ..." once seen
        self._out = bytearray()
        self._obj = None
        self._eof = False
        if kind == "zstd":
            self._dctx = _zstandard().ZstdDecompressor()

    def _new(self):
        if self.kind == "zstd":
            return self._dctx.decompressobj()
        return zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing

    def _fill(self) -> None:
        while not self._out and not self._eof:
            data = self.src.read(_CHUNK)
            if not data:
                self._eof = True
                if self._obj is not None and not self._obj.eof:
                    self.damage = "truncated"
                return
            while data:
                if self._obj is None:
                    self._obj = self._new()
                try:
                    self._out += self._obj.decompress(data)
                except Exception as e:  # zstd.ZstdError, zlib.error: the rest is unreadable
                    self.damage = f"corrupt ({e})"
                    self._eof = True
                    return
                if self._obj.eof:
                    data = self._obj.unused_data
                    self._obj = None
                else:
                    data = b""

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = []
            while True:
                chunk = self.read(_CHUNK)
                if not chunk:
                    return b"".join(parts)
                parts.append(chunk)
        self._fill()
        data = bytes(self._out[:n])
        del self._out[:n]
        return data

    read1 = read

    def fileno(self) -> int:
        raise PstateError("compressed input cannot be followed live (select on its descriptor)",
                          ExitCode.USAGE, hint="decompress it into the pipe: zstdcat FILE | pstate ...")

    def close(self) -> None:
        close = getattr(self.src, "close", None)
        if close is not None:
            close()


def sniff(head: bytes) -> str | None:
    """"zstd", "gzip" or None, from a stream's first four bytes."""
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    return None


def open_decompressed(fp: IO[bytes], name: str):
    """(stream, kind): the decompressed bytes of fp and "zstd"/"gzip", or an
    uncompressed fp itself and None (its first bytes looked at with peek()
    where it has one, else given back by a wrapper)."""
    head = fp.peek(4)[:4] if hasattr(fp, "peek") else b""
    if len(head) >= 4 or (head and not (ZSTD_MAGIC.startswith(head) or GZIP_MAGIC.startswith(head))):
        src = fp  # decided without consuming anything
        if not head.startswith((ZSTD_MAGIC, GZIP_MAGIC)):
            return fp, None
    else:
        head = _read_exact(fp, 4)
        src = _Prefixed(head, fp)
    if head.startswith(ZSTD_MAGIC):
        if _zstandard() is None:
            raise PstateError(f"{name} is zstd-compressed, and the zstandard package is not installed",
                              ExitCode.UNAVAILABLE, hint=HINT)
        return _Decompressed(src, "zstd"), "zstd"
    if head.startswith(GZIP_MAGIC):
        return _Decompressed(src, "gzip"), "gzip"
    return src, None


def compressor_for(path: str | None) -> str | None:
    """The compression an output file's name asks for, or None."""
    if not path or path == "-":
        return None
    for suffix, kind in SUFFIXES.items():
        if path.endswith(suffix):
            return kind
    return None


class _Writer:
    """write/flush/close over a compressor; close() ends the frame and
    flushes the file, which the caller owns (and syncs and closes)."""

    def __init__(self, raw: IO[bytes], kind: str):
        self.raw = raw
        self.kind = kind
        if kind == "zstd":
            zstd = _zstandard()
            if zstd is None:
                raise PstateError("writing a .zst file needs the zstandard package", ExitCode.UNAVAILABLE,
                                  hint=HINT)
            self._flush_block = zstd.FLUSH_BLOCK
            cctx = zstd.ZstdCompressor(level=ZSTD_LEVEL, threads=1)
            self._w = cctx.stream_writer(raw, write_size=_CHUNK, closefd=False)
        else:
            self._flush_block = None
            self._w = gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0)

    def write(self, data) -> int:
        return self._w.write(data)

    def flush(self) -> None:
        """Make what was written so far decodable (a block boundary)."""
        if self._flush_block is not None:
            self._w.flush(self._flush_block)
        else:
            self._w.flush()
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        self._w.close()
        self.raw.flush()


def compressed_writer(raw: IO[bytes], kind: str) -> _Writer:
    return _Writer(raw, kind)

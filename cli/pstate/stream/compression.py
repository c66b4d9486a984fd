"""Compressed recordings: zstd and gzip, read by magic bytes, written by name.

Reading: open_decompressed() looks at the first bytes of a stream (a file or
standard input, never its name) and returns a reader of the decompressed
bytes, or the stream itself when it is not compressed. A compressed stream
that ends early (a copy cut short, a recorder killed mid-frame) or is corrupt
ends the data at the last byte that decoded, and the reader says so in its
`damage` attribute, which the stream reader reports like a truncated file.
Its memory is bounded whatever the data decompresses to (a few KB of zstd
can hold gigabytes of zeros): compressed bytes are read and decompressed a
bounded piece at a time, and a zstd frame is decompressed with a window of
at most MAX_WINDOW (8 MiB, what zstd writes up to level 19); a frame that
asks for more (zstd --long, --ultra) is refused with PstateError (exit 65)
before a window that large is allocated.

Writing: compressor_for(path) picks zstd for *.zst and gzip for *.gz;
compressed_writer() wraps an open binary file. zstd compresses on a worker
thread of its own (zstandard's threads=1), so the recorder's thread only
hands it blocks; gzip (the standard library) compresses on the caller's.

zstd needs the zstandard package (pip install 'pstate[zstd]'; make setup
installs it); gzip needs nothing.
"""

from __future__ import annotations

import gzip
import io
import zlib
from typing import IO

from pstate.exitcodes import ExitCode, PstateError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_MAGIC_INT = 0xFD2FB528
_SKIPPABLE = 0x184D2A50  # the magic numbers of skippable frames, less their last 4 bits
GZIP_MAGIC = b"\x1f\x8b"
SUFFIXES = {".zst": "zstd", ".zstd": "zstd", ".gz": "gzip"}
ZSTD_LEVEL = 1  # ratio 8.7 on a recording (level 3: 8.8) for three quarters of the CPU
GZIP_LEVEL = 6
_CHUNK = 1 << 20
# Reading: a zstd frame is decompressed with a window of at most MAX_WINDOW
# bytes (what zstd -19 writes, the largest of its levels without --ultra or
# --long; RFC 8878 asks every decoder to support 8 MiB); compressed bytes are
# read _IN at a time, and at most _OUT decompressed bytes are held (zstd: the
# output of _BLOCKS blocks of at most 128 KiB).
MAX_WINDOW = 8 << 20
_IN = 1 << 16
_OUT = 1 << 20
_BLOCKS = _OUT >> 17
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


class _Decompressed(io.BufferedIOBase):
    """The decompressed bytes of a zstd or gzip stream, read(n) at a time;
    frames (members) one after another are read as one stream.

    Memory is bounded whatever the stream decompresses to: compressed bytes
    are read _IN at a time, and decompressed in steps of at most _OUT bytes
    each (zlib's max_length; for zstd, at most _BLOCKS blocks of a frame,
    each at most 128 KiB, fed at a time, as _ZstdFrames finds them), held
    until read with an offset into them. A zstd frame is decompressed with a
    window of at most MAX_WINDOW: a frame asking for more is refused before
    anything is allocated for it."""

    def __init__(self, src, kind: str, name: str = "input"):
        super().__init__()
        self.src = src
        self.kind = kind
        self.name = name
        self.damage: str | None = None  # "truncated" or "corrupt: ..." once seen
        self._out = b""  # decompressed bytes, read up to _pos
        self._pos = 0
        self._in = b""  # compressed bytes read, fed up to _at
        self._at = 0
        self._obj = None  # the decompressor of the current frame (member)
        self._full = False  # (gzip) its last output was _OUT bytes
        self._done = False  # no more output: the end, or decoding stopped
        if kind == "zstd":
            self._dctx = _zstandard().ZstdDecompressor(max_window_size=MAX_WINDOW)
            self._frames = _ZstdFrames(name)

    def _more(self) -> bool:
        """Append what the source has next to the bytes not fed yet; False at its end."""
        data = self.src.read(_IN)
        if not data:
            return False
        self._in = self._in[self._at:] + data if self._at < len(self._in) else data
        self._at = 0
        return True

    def _stop(self, damage: str | None) -> bytes:
        self.damage = damage
        self._done = True
        self._obj = None
        self._in, self._at = b"", 0
        return b""

    def _fill_gzip(self) -> bytes:
        # (self._at stays 0: zlib keeps what it did not take, unconsumed_tail)
        while True:
            if not self._in and not self._full:
                if not self._more():
                    return self._stop("truncated" if self._obj is not None else None)
            if self._obj is None:
                self._obj = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
            try:
                out = self._obj.decompress(self._in, _OUT)
            except zlib.error as e:  # the rest is unreadable
                return self._stop(f"corrupt ({e})")
            self._full = len(out) >= _OUT  # more may come out without more input
            if self._obj.eof:  # a member ended: another may follow
                self._in = self._obj.unused_data
                self._obj, self._full = None, False
            else:
                self._in = self._obj.unconsumed_tail
            if out:
                return out

    def _fill_zstd(self) -> bytes:
        frames = self._frames
        while True:
            start = self._at
            end, feed = frames.walk(self._in, start)  # (raises PstateError on a window too large)
            if frames.bad:
                return self._stop(f"corrupt ({frames.bad})")
            if end == start:  # a header not whole yet, or nothing left: read on
                if not self._more():
                    whole = frames.between and self._at >= len(self._in)
                    return self._stop(None if whole else "truncated")
                continue
            self._at = end
            if not feed:  # a skippable frame
                continue
            if self._obj is None:
                self._obj = self._dctx.decompressobj()
            try:
                out = self._obj.decompress(memoryview(self._in)[start:end])
            except Exception as e:  # zstd.ZstdError: the rest is unreadable
                return self._stop(f"corrupt ({e})")
            if frames.ended:
                frames.ended = False
                if not self._obj.eof:
                    return self._stop("corrupt (a frame ended before its last block)")
                self._obj = None
            if out:
                return out

    def read(self, n: int | None = -1) -> bytes:
        if n is None or n < 0:
            parts = []
            while True:
                chunk = self.read(_OUT)
                if not chunk:
                    return b"".join(parts)
                parts.append(chunk)
        if self._pos >= len(self._out):
            self._out, self._pos = b"", 0
            if self._done or not n:
                return b""
            self._out = self._fill_zstd() if self.kind == "zstd" else self._fill_gzip()
        p = self._pos
        data = self._out[p:p + n]  # (the whole, not a copy, when n covers it)
        self._pos = p + len(data)
        return data

    read1 = read

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        raise PstateError("compressed input cannot be followed live (select on its descriptor)",
                          ExitCode.USAGE, hint="decompress it into the pipe: zstdcat FILE | pstate ...")

    def close(self) -> None:
        if not self.closed:
            close = getattr(self.src, "close", None)
            if close is not None:
                close()
            self._out, self._in = b"", b""
        super().close()


def _size(n: int) -> str:
    return f"{n / (1 << 20):g} MiB" if n >= 1 << 20 else f"{n / 1024:g} KiB"


class _ZstdFrames:
    """Where the frames and blocks of a zstd stream (RFC 8878) begin and end,
    read from its bytes as they pass, so that _Decompressed feeds the
    decompressor at most _BLOCKS blocks at a time (a block decompresses to
    at most 128 KiB), refuses a frame whose window is larger than MAX_WINDOW
    before the decompressor sees it, passes over skippable frames, and tells
    a stream cut inside a frame from one that ended between two.

    walk(buf, pos) -> (end, feed): buf[pos:end] is the next piece: to feed
    to the decompressor (feed True) or of a skippable frame (False). It ends
    after _BLOCKS blocks, at the end of a frame (ended is then set) or where
    buf ends; end == pos: a header is not whole in buf, more bytes are
    needed. bad: why the bytes are not zstd (the walk then stops)."""

    _FRAME, _BLOCK, _BODY, _CHECKSUM, _SKIP = range(5)

    def __init__(self, name: str):
        self.name = name
        self.state = self._FRAME
        self.left = 0  # bytes of the current block body, checksum or skippable frame still to come
        self.last = False  # the current block is the frame's last
        self.checksum = False  # the current frame ends with a checksum
        self.ended = False
        self.bad: str | None = None

    @property
    def between(self) -> bool:
        """At the start of a frame (or of the stream)."""
        return self.state == self._FRAME

    def walk(self, buf: bytes, pos: int) -> tuple[int, bool]:
        n = len(buf)
        if self.state == self._FRAME:
            if n - pos < 4:
                return pos, True
            magic = int.from_bytes(buf[pos:pos + 4], "little")
            if magic & 0xFFFFFFF0 == _SKIPPABLE:
                if n - pos < 8:
                    return pos, True
                self.left = 8 + int.from_bytes(buf[pos + 4:pos + 8], "little")
                self.state = self._SKIP
            elif magic == _ZSTD_MAGIC_INT:
                if n - pos < 5:
                    return pos, True
                fhd = buf[pos + 4]
                single = fhd & 0x20
                fcs = (0, 2, 4, 8)[fhd >> 6] or (1 if single else 0)
                size = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3] + fcs
                if n - pos < size:
                    return pos, True
                if single:  # the window is the content size
                    window = int.from_bytes(buf[pos + size - fcs:pos + size], "little") + (256 if fcs == 2 else 0)
                else:
                    wd = buf[pos + 5]
                    base = 1 << (10 + (wd >> 3))
                    window = base + (base >> 3) * (wd & 7)
                if window > MAX_WINDOW:
                    where = "FILE" if self.name.startswith("<") else self.name
                    raise PstateError(
                        f"{self.name}: a zstd frame needs a window of {_size(window)} to decompress; pstate "
                        f"reads frames of windows up to {_size(MAX_WINDOW)} (zstd --long and --ultra levels "
                        "write larger ones)", ExitCode.DATAERR,
                        hint=f"decompress it first: zstd -dc --long=31 {where} | pstate ... -")
                self.checksum = bool(fhd & 4)
                self.state = self._BLOCK
                return self._blocks(buf, pos, pos + size)
            else:
                self.bad = "not zstd data after the last frame"
                return pos, True
        if self.state == self._SKIP:
            k = min(self.left, n - pos)
            self.left -= k
            if not self.left:
                self.state = self._FRAME
            return pos + k, False
        return self._blocks(buf, pos, pos)

    def _blocks(self, buf: bytes, start: int, pos: int) -> tuple[int, bool]:
        n = len(buf)
        blocks = 0
        while True:
            if self.state == self._BLOCK:
                if n - pos < 3:
                    break
                head = int.from_bytes(buf[pos:pos + 3], "little")
                self.last = bool(head & 1)
                self.left = 1 if (head >> 1) & 3 == 1 else head >> 3  # an RLE block has one byte
                self.state = self._BODY
                pos += 3
            if self.state == self._BODY:
                k = min(self.left, n - pos)
                pos += k
                self.left -= k
                if self.left:
                    break
                blocks += 1
                self.state = self._CHECKSUM if self.last else self._BLOCK
                self.left = 4 if self.last and self.checksum else 0
            if self.state == self._CHECKSUM:
                k = min(self.left, n - pos)
                pos += k
                self.left -= k
                if self.left:
                    break
                self.state = self._FRAME
                self.ended = True
                break
            if blocks >= _BLOCKS:
                break
        return pos, True


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
        return _Decompressed(src, "zstd", name), "zstd"
    if head.startswith(GZIP_MAGIC):
        return _Decompressed(src, "gzip", name), "gzip"
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

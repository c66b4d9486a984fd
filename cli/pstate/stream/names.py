"""Names from the system as pstate writes and shows them: the one decoding
rule (decode, and encode, its reverse) and the one cell function (cell).

Names come from the kernel and /proc as bytes, and nothing makes those
bytes UTF-8 or printable: any user can name a thread, set a process title
or (in a delegated subtree) create a cgroup with escape codes or bytes that
are not UTF-8 in it. So every such name goes through decode() before any
writer sees it, and every renderer that writes to a terminal or a table
goes through cell().

decode(raw) (the records' text, see pstate-events(5)):

- a name that is only shown (comm, process title, exe path, kernel symbol):
  UTF-8, with each invalid sequence U+FFFD, as most tools show it;
- a name that is matched again (lossless=True: cgroup paths, which
  --cgroup matches and which are opened again below the v2 mount): UTF-8,
  with each byte of an invalid sequence written \\xNN (two lowercase hex
  digits, 80 to ff), and a backslash that would read as such an escape
  (one followed by x5c or by x and two hex digits 80 to ff) written \\x5c.
  Nothing else changes: a systemd name such as system-systemd\\x2dfsck.slice
  stays as it is. encode() gives the bytes back, exactly.

Control characters are kept in both: the records are JSON, which escapes
them, so JSON, CSV and folded output keep the names' exact text. cell()
escapes them where text meets a terminal.
"""

from __future__ import annotations

import re
import unicodedata

# --- the decoding rule ----------------------------------------------------------

_INVALID = re.compile("[\udc80-\udcff]")  # the bytes surrogateescape could not decode
_AMBIGUOUS = re.compile(r"\\(?=x(?:5c|[89a-f][0-9a-f]))")  # a literal backslash that reads as an escape
_ESCAPED = re.compile(rb"\\x(5c|[89a-f][0-9a-f])")


def _bytes(raw) -> bytes:
    """Bytes of a name: as given, or the bytes an os function's str (which
    holds the undecodable bytes as lone surrogates) stands for."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return bytes(raw)
    try:
        return raw.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that is no byte of a file name
        return raw.encode("utf-8", "surrogatepass")


def decode(raw, lossless: bool = False) -> str:
    """The text of a name from the system (bytes, or a str from an os
    function): U+FFFD for what is not UTF-8, or (lossless) \\xNN escapes
    that encode() reverses. See the module docstring."""
    if isinstance(raw, str) and raw.isascii() and (not lossless or "\\" not in raw):
        return raw
    b = _bytes(raw)
    if not lossless:
        return b.decode("utf-8", "replace")
    text = b.decode("utf-8", "surrogateescape")
    if "\\" in text:
        text = _AMBIGUOUS.sub(r"\\x5c", text)
    return _INVALID.sub(lambda m: f"\\x{ord(m.group()) - 0xdc00:02x}", text)


def comm(raw: bytes) -> str:
    """The text of a kernel task name: its bytes up to the first NUL (the
    kernel's 16-byte comm), decoded as a name that is only shown."""
    return decode(bytes(raw).split(b"\0", 1)[0])


def encode(text: str) -> bytes:
    """The bytes of a name decode(..., lossless=True) wrote: its \\xNN
    escapes (80 to ff, and 5c) are bytes again. Also takes a str an os
    function gave (lone surrogates for the bytes), and, as --cgroup does,
    a value a user typed in either form."""
    b = _bytes(text)
    if b"\\x" not in b:
        return b
    return _ESCAPED.sub(lambda m: bytes((int(m.group(1), 16),)), b)


# --- the cell function ----------------------------------------------------------

# C0 controls, DEL and C1 controls (U+009B is CSI to a terminal that takes
# 8-bit controls), the bidirectional formatting characters (they reorder
# what follows them on the line), the line and paragraph separators, and
# surrogates (the bytes an os function could not decode: no terminal gets them).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff]")
KEEP = ("start", "end", "middle")


def _escape_char(c: str) -> str:
    n = ord(c)
    if 0xdc80 <= n <= 0xdcff:
        n -= 0xdc00  # an undecodable byte: that byte
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def _char_columns(c: str) -> int:
    if c.isascii():
        return 1
    if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1


def columns(text: str) -> int:
    """The terminal columns text takes once shown (text from cell():
    no control characters): wide characters 2, combining marks 0."""
    if text.isascii():
        return len(text)
    return sum(_char_columns(c) for c in text)


def _pieces(text: str) -> list[str]:
    """text shown: its characters, with each control character replaced by
    its escape, one piece (never cut in half)."""
    return [_escape_char(c) if _CONTROL.match(c) else c for c in text]


def cell(text, width: int | None = None, keep: str = "start", mark: str = "~") -> str:
    """Text as a terminal or a table shows it: every control character
    escaped, then cut to width columns (None: whole).

    Escaping first: C0 controls, DEL, C1 controls, bidirectional formatting
    characters, U+2028/U+2029 and surrogates are written \\xNN (a code point
    below 256, or the undecodable byte a surrogate stands for) or \\uNNNN.
    Not `?` as ps and top show them: \\x1b says which byte it was, and a
    name with escapes in it looks doctored, where `?` would hide that and
    read like a real question mark. Everything else, ordinary Unicode
    included, is shown as it is. A backslash is not escaped: the shown
    text is for reading (systemd's \\x2d stays readable); the exact name is
    in JSON, CSV and folded output. cell(cell(x)) == cell(x).

    Then cutting: keep says which part of a longer text survives: "start"
    (titles, names), "end" (paths: the unit is at the end) or "middle" (the
    middle gives way: both ends kept), with mark ("~", or "" for a plain
    cut) where text was left out. An escape is never cut in half. bytes
    are shown as UTF-8, with \\xNN for what is not; None as "".
    """
    if text is None:
        return ""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "surrogateescape")
    elif not isinstance(text, str):
        text = str(text)
    if keep not in KEEP:
        raise ValueError(f"keep must be one of {KEEP}, not {keep!r}")
    if _CONTROL.search(text) is None:
        if width is None or (text.isascii() and len(text) <= width) or columns(text) <= width:
            return text
        pieces = list(text)
    else:
        pieces = _pieces(text)
        if width is None:
            return "".join(pieces)
    widths = [len(p) if len(p) > 1 else _char_columns(p) for p in pieces]
    if sum(widths) <= width:
        return "".join(pieces)
    room = width - columns(mark)
    if room < 0:
        return mark[:max(0, width)]
    if keep == "start":
        return _take(pieces, widths, room) + mark
    if keep == "end":
        return mark + _take_end(pieces, widths, room)
    head = (room + 1) // 2
    return _take(pieces, widths, head) + mark + _take_end(pieces, widths, room - head)


def _take(pieces: list[str], widths: list[int], room: int) -> str:
    out, used = [], 0
    for p, w in zip(pieces, widths):
        if used + w > room:
            break
        out.append(p)
        used += w
    return "".join(out)


def _take_end(pieces: list[str], widths: list[int], room: int) -> str:
    out, used = [], 0
    for p, w in zip(reversed(pieces), reversed(widths)):
        if used + w > room:
            break
        out.append(p)
        used += w
    return "".join(reversed(out))

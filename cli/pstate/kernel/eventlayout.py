"""The kernel side's layout for Python, read from its one definition,
bpf/pstate.h (also included by both BPF programs and by pstate._encode).

DEFINES holds every `#define NAME value` of the header; EVENT_FIELDS the
fields of `struct event` in order, as (name, struct format code), and
EVENT_FORMAT their struct format. The header is read once, at import.
"""

from __future__ import annotations

import importlib.resources
import re
import struct

HEADER = "pstate.h"

_DEFINE = re.compile(r"^#define\s+([A-Z][A-Z0-9_]*)\s+(0x[0-9a-fA-F]+|\d+)\b", re.M)
_STRUCT = re.compile(r"^struct event \{\n(.*?)^\};", re.M | re.S)
_FIELD = re.compile(r"^\s*(u8|u16|u32|u64|s16|s32|char)\s+(\w+)(?:\[(\d+)\])?;")
_CODES = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "s16": "h", "s32": "i"}


def header_text() -> str:
    return importlib.resources.files("pstate.bpf").joinpath(HEADER).read_text()


def parse(text: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """(defines, struct event fields) of the header text."""
    defines = {name: int(value, 0) for name, value in _DEFINE.findall(text)}
    body = _STRUCT.search(text)
    if body is None:
        raise ValueError(f"{HEADER} has no struct event")
    fields = []
    for line in body.group(1).splitlines():
        m = _FIELD.match(line)
        if m is None:
            if line.strip():
                raise ValueError(f"{HEADER}: cannot read struct event field {line.strip()!r}")
            continue
        ctype, name, count = m.groups()
        if ctype == "char":
            fields.append((name, f"{int(count or 1)}s"))
        elif count:
            raise ValueError(f"{HEADER}: arrays of {ctype} are not supported ({name})")
        else:
            fields.append((name, _CODES[ctype]))
    return defines, fields


_SIZES = {"B": 1, "H": 2, "I": 4, "Q": 8, "h": 2, "i": 4}


def _is_pad(name: str) -> bool:
    return name.startswith("pad")


def struct_format(fields: list[tuple[str, str]]) -> str:
    """Little-endian, no alignment (the header lays its fields out packed);
    fields named pad* are skipped bytes (x), not values."""
    return "<" + "".join(f"{_SIZES.get(code, 1)}x" if _is_pad(name) else code for name, code in fields)


def unpacked_names(fields: list[tuple[str, str]]) -> tuple[str, ...]:
    """The names of the values struct_format(fields) unpacks, in order."""
    return tuple(name for name, _code in fields if not _is_pad(name))


def offset_of(name: str) -> int:
    """The byte offset of a field in struct event (packed, as struct_format)."""
    off = 0
    for field, code in EVENT_FIELDS:
        if field == name:
            return off
        off += struct.calcsize("<" + code)
    raise KeyError(name)


def with_prefix(prefix: str) -> dict[str, int]:
    """The defines whose names start with prefix, without it, lowercased:
    with_prefix("CAUSE_") -> {"switch_out": 1, ...}."""
    return {name[len(prefix):].lower(): v for name, v in DEFINES.items() if name.startswith(prefix)}


DEFINES, EVENT_FIELDS = parse(header_text())
EVENT_FORMAT = struct_format(EVENT_FIELDS)

"""bpf/pstate.h is the one definition of the event layout and counter
indices: the BPF programs and pstate._encode include it, and Python reads it
(pstate.kernel.eventlayout). These tests hold every side to it."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from pstate.kernel import eventcodec
from pstate.kernel import eventlayout
from pstate.kernel import loader
from conftest import ROOT

HEADER = ROOT / "bpf" / "pstate.h"


def test_python_format_is_the_header_struct():
    assert struct.calcsize(eventlayout.EVENT_FORMAT) == eventcodec.EVENT_SIZE == 88
    assert eventcodec.REC_FMT == "<II" + eventlayout.EVENT_FORMAT[1:]
    assert [n for n, _ in eventlayout.EVENT_FIELDS][:4] == ["ts", "dur", "pid", "tid"]


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (CI has one)")
def test_c_offsets_match_python_offsets(tmp_path):
    """The C compiler's layout of struct event (natural alignment) is the
    packed one Python unpacks: no implicit padding anywhere."""
    names = [n for n, _ in eventlayout.EVENT_FIELDS]
    prog = tmp_path / "layout.c"
    prog.write_text(
        "#include <stdio.h>\n#include <stddef.h>\n#include <stdint.h>\n"
        "typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef uint64_t u64;\n"
        "typedef int16_t s16; typedef int32_t s32;\n"
        '#include "pstate.h"\n'
        "int main(void) {\n"
        + "".join(f'    printf("{n} %zu\\n", offsetof(struct event, {n}));\n' for n in names)
        + '    printf("sizeof %zu\\n", sizeof(struct event));\n'
        + "".join(f'    printf("define {k} %llu\\n", (unsigned long long)({k}));\n' for k in eventlayout.DEFINES)
        + "    return 0;\n}\n")
    exe = tmp_path / "layout"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", f"-I{HEADER.parent}", "-o", str(exe), str(prog)], check=True)
    out = dict(line.rsplit(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                                check=True).stdout.splitlines())
    offset = 0
    for name, code in eventlayout.EVENT_FIELDS:
        assert int(out[name]) == offset, name
        offset += struct.calcsize("<" + (code if not name.startswith("pad") else eventlayout.struct_format([(name, code)])[1:]))
    assert int(out["sizeof"]) == offset == 88
    for k, v in eventlayout.DEFINES.items():
        assert int(out[f"define {k}"]) == v, k


def test_every_side_includes_the_header_and_none_redefines_it():
    header_names = set(eventlayout.DEFINES) | {"struct event"}
    for path in (ROOT / "bpf" / "record.bpf.c", ROOT / "bpf" / "snap.bpf.c", ROOT / "cli" / "pstate" / "_encode.c"):
        text = path.read_text()
        assert re.search(r'^#include "pstate\.h"', text, re.M), path
        own = set(re.findall(r"^#define\s+(\w+)", text, re.M)) | set(re.findall(r"^(struct event) \{", text, re.M))
        assert not own & header_names, (path.name, own & header_names)


def test_compiled_text_has_the_header_in_place():
    """bcc compiles from memory (quoted includes have no directory to be found
    in) and the program cache keys the text: the header is part of it."""
    for name in ("record", "snap"):
        text = loader.source(name)
        assert '#include "pstate.h"' not in text
        assert "struct event {" in text and "#define STAT_CLAMPED" in text


def test_with_headers_expands_once():
    files = {"a.h": '#include "b.h"\nA', "b.h": "B"}
    out = loader.with_headers('#include "a.h"\n#include "b.h"\nmain', files.__getitem__)
    assert out.count("\nB\n") == 1 and "A" in out and out.endswith("main")


def test_cause_and_state_names_come_from_the_header():
    assert eventcodec.CAUSES == {v: k for k, v in eventlayout.with_prefix("CAUSE_").items()}
    assert eventcodec.SYNTHETIC[eventlayout.DEFINES["ST_RUNNING"]] == "running"
    assert loader.STAT_ATTEMPTED == eventlayout.DEFINES["STAT_ATTEMPTED"]

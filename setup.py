"""Native speed-ups, built when a C compiler and Python headers are present.

Everything else is configured in pyproject.toml. Each cli/pstate/_*.c file is
one extension module pstate._<name>; each is optional: without a compiler
pstate installs and runs on its pure-Python paths (slower, same output).
"""

from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).parent
SOURCES = sorted((HERE / "cli" / "pstate").glob("_*.c"))

setup(
    ext_modules=[
        Extension(
            f"pstate.{src.stem}",
            [str(src.relative_to(HERE))],
            include_dirs=["bpf"],  # pstate.h: the event layout shared with the BPF programs
            depends=["bpf/pstate.h"],
            # no build path in the binaries (reproducible, and nothing of
            # the build machine left in an installed tree)
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                f"-ffile-prefix-map={HERE.resolve()}=."],
            optional=True,
        )
        for src in SOURCES
    ],
)

"""bcc's Python module, wherever the distribution put it, and what libbcc
prints while it compiles: the two things every compile (loader, the header
check) needs from bcc before anything else."""

from __future__ import annotations

import contextlib
import glob
import os
import sys

from pstate.exitcodes import ExitCode, PstateError


def import_bcc():
    """Import bcc; it may live in the system's dist-packages outside a venv."""
    try:
        import bcc  # noqa: F401
        return bcc
    except ImportError:
        pass
    # bcc's Python module is pure Python over libbcc (ctypes): the
    # distribution's copy works from any Python 3 that can see it.
    for d in sorted(glob.glob("/usr/lib/python3/dist-packages")) + sorted(glob.glob("/usr/lib/python3*/site-packages")):
        if os.path.isdir(os.path.join(d, "bcc")) and d not in sys.path:
            sys.path.append(d)
            try:
                import bcc  # noqa: F401
                return bcc
            except ImportError:
                sys.path.remove(d)
    raise PstateError(
        "bcc (the BPF Compiler Collection's Python module) is not installed",
        ExitCode.UNAVAILABLE,
        hint="apt-get install python3-bpfcc   (not PyPI's unrelated 'bcc'); in a venv use --system-site-packages",
    )


class _Captured:
    content = ""

    def text(self) -> str:
        return self.content


@contextlib.contextmanager
def quiet_fd(fd: int):
    """Collect what libbcc prints on a file descriptor (compiler warnings about
    the foreign header tree) and show it only if compiling fails."""
    import tempfile

    saved = os.dup(fd)
    cap = _Captured()
    with tempfile.TemporaryFile(prefix="pstate-bcc-") as tmp:
        try:
            os.dup2(tmp.fileno(), fd)
            yield cap
        finally:
            os.dup2(saved, fd)
            os.close(saved)
            tmp.seek(0)
            cap.content = tmp.read(1 << 20).decode(errors="replace")

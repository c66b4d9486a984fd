"""The fleet path's last mile: the real node_exporter, running as an
unprivileged user as Debian runs it, scrapes the file `pstate snap --format
prom` wrote, with no scrape error.

node_exporter is the binary on PATH (prometheus-node-exporter or
node_exporter), else the one in Debian's package, fetched with `apt-get
download` into a cache (PSTATE_TEST_CACHE, default /var/cache/pstate-tests)
and unpacked with dpkg-deb -x: never installed, so no service starts and no
user is added. It runs as nobody, bound to 127.0.0.1 on a free port, with the
textfile collector alone. snap runs for real (root and BPF). Where
node_exporter cannot be had (no archive reachable), the test is skipped
locally with the reason and fails in CI.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import IN_CI, clean_env, pstate_cmd

CACHE = Path(os.environ.get("PSTATE_TEST_CACHE", "/var/cache/pstate-tests"))
PACKAGE = "prometheus-node-exporter"
PROM_NAME = "pstate-snap.prom"
USER, GROUP = "nobody", "nogroup"  # Debian's node_exporter runs as prometheus, which is not created here

pytestmark = pytest.mark.bpf


def _unavailable(why: str):
    if IN_CI:
        pytest.fail(f"node_exporter is required in CI: {why}", pytrace=False)
    pytest.skip(why)


def _run(args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)


def _download(into: Path) -> str | None:
    """apt-get download the package into `into`; None, or why it failed.
    A first failure may be a machine whose package lists were never fetched:
    apt-get update once, then again."""
    r = _run(["apt-get", "download", "-q", PACKAGE], cwd=into)
    if r.returncode != 0:
        _run(["apt-get", "update", "-qq"])
        r = _run(["apt-get", "download", "-q", PACKAGE], cwd=into)
    if r.returncode != 0 or not list(into.glob(f"{PACKAGE}_*.deb")):
        return f"`apt-get download {PACKAGE}` failed: {(r.stderr or r.stdout).strip()[-500:]}"
    return None


def node_exporter() -> str:
    """The node_exporter binary: on PATH, or unpacked from Debian's package
    into the cache (downloaded once, under a lock)."""
    for name in (PACKAGE, "node_exporter"):
        found = shutil.which(name)
        if found:
            return found
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        _unavailable(f"no node_exporter on PATH, and no apt-get/dpkg-deb to fetch {PACKAGE}")
    unpacked = CACHE / "node-exporter"
    binary = unpacked / "usr" / "bin" / PACKAGE
    CACHE.mkdir(mode=0o755, parents=True, exist_ok=True)
    st = CACHE.stat()
    # root runs what is in it: no one else may have put it there
    assert st.st_uid == 0 and not st.st_mode & 0o022, f"{CACHE} must be root's and writable by no one else"
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(binary, os.X_OK):
            return str(binary)
        shutil.rmtree(unpacked, ignore_errors=True)  # half of an earlier unpacking
        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=CACHE))
        try:
            why = _download(tmp)
            if why:
                _unavailable(why)
            (deb,) = tmp.glob(f"{PACKAGE}_*.deb")
            r = _run(["dpkg-deb", "-x", str(deb), str(tmp / "x")])
            assert r.returncode == 0, r.stderr
            os.chmod(tmp / "x", 0o755)  # nobody runs the binary
            os.rename(tmp / "x", unpacked)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    assert os.access(binary, os.X_OK), f"{PACKAGE} has no {binary.relative_to(unpacked)}"
    return str(binary)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


class NodeExporter:
    """node_exporter as nobody on 127.0.0.1, its textfile collector alone."""

    def __init__(self, binary: str, textfile_dir: Path, group: str):
        self.binary, self.dir, self.group = binary, textfile_dir, group
        self.proc: subprocess.Popen | None = None
        self.log = tempfile.TemporaryFile()
        self.port = 0
        self.last_log = ""

    def log_text(self) -> str:
        if self.log.closed:
            return self.last_log
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]

    def start(self) -> "NodeExporter":
        for _ in range(5):  # a port taken between _free_port and node_exporter's bind: another one
            self.port = _free_port()
            self.log.seek(0)
            self.log.truncate()
            self.proc = subprocess.Popen(
                [self.binary, f"--web.listen-address=127.0.0.1:{self.port}", "--collector.disable-defaults",
                 "--collector.textfile", f"--collector.textfile.directory={self.dir}",
                 "--web.disable-exporter-metrics"],
                stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT, cwd="/",
                env={"PATH": "/usr/bin:/bin"}, user=USER, group=self.group, extra_groups=[])
            if self._ready(time.monotonic() + 30):
                return self
            if self.proc.poll() is None:
                self.stop()
                pytest.fail(f"node_exporter did not answer on port {self.port} within 30 s:\n{self.log_text()}")
            if "address already in use" not in self.log_text():
                pytest.fail(f"node_exporter exited {self.proc.returncode}:\n{self.log_text()}")
        pytest.fail(f"node_exporter found no free port:\n{self.log_text()}")

    def _ready(self, deadline: float) -> bool:
        """Poll /metrics until it answers (True) or the process ends (False)."""
        while time.monotonic() < deadline:
            try:
                _scrape(self.port)
                return True
            except (urllib.error.URLError, ConnectionError):
                pass
            try:
                self.proc.wait(timeout=0.05)
                return False
            except subprocess.TimeoutExpired:
                pass
        return False

    def uid(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("Uid:"))

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.last_log = self.log_text()
        self.log.close()


def _collector_running() -> bool:
    # with a collector running, a snap writes one snapshot of it at once and takes no --interval
    return _run(pstate_cmd("snap", "--status"), env=clean_env()).returncode == 0


@pytest.fixture
def textfile_base():
    """A directory in /tmp that node_exporter's user can enter (pytest's
    tmp_path is under a 0700 directory of root's)."""
    base = Path(tempfile.mkdtemp(prefix="pstate-textfile-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.time_limit(600)
@pytest.mark.parametrize("case", ["new-dir", "debian-dir", "group"])
def test_node_exporter_as_nobody_scrapes_the_prom_file(textfile_base, case):
    """new-dir: snap creates the directory; debian-dir: the directory exists
    as Debian's package ships it (root's, 0755); group: `--group` names the
    collector's group (node_exporter runs as nobody:nogroup)."""
    binary = node_exporter()
    textdir = textfile_base / "node-exporter"
    if case == "debian-dir":
        textdir.mkdir()
        os.chmod(textdir, 0o755)
    args = ["snap", "--dir", str(textdir), "--format", "prom"]
    if case == "group":
        args += ["--group", GROUP]
    if not _collector_running():
        args += ["--interval", "500ms"]
    r = _run(pstate_cmd(*args), env=clean_env())
    assert r.returncode == 0, r.stderr
    assert (textdir / PROM_NAME).is_file()
    ne = NodeExporter(binary, textdir, GROUP).start()
    try:
        assert ne.uid() == 65534, "node_exporter must run unprivileged"
        text = _scrape(ne.port)
    finally:
        ne.stop()
    lines = text.splitlines()
    assert "node_textfile_scrape_error 0" in lines, \
        "\n".join(ln for ln in lines if ln.startswith("node_textfile")) + "\n" + ne.log_text()
    for series in ("pstate_state_seconds_total{", "pstate_context_switches_total{", "pstate_threads{",
                   "pstate_snapshot_timestamp_seconds "):
        assert any(ln.startswith(series) for ln in lines), series
    threads = sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if ln.startswith("pstate_threads{"))
    assert threads > 0
    assert any(ln.startswith("node_textfile_mtime_seconds{") and PROM_NAME in ln for ln in lines)

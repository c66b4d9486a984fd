"""Opening -o FILE (pstate.stream.outfiles): no link followed to a file, new files
0600 whatever the umask and the invoking user's under sudo, other users'
files refused, FIFOs and devices written but never fsync'd."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import threading
from pathlib import Path

import orjson
import pytest

from pstate.stream import outfiles
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.streamio import LineWriter

ROOT = os.geteuid() == 0


@pytest.fixture(autouse=True)
def no_sudo(monkeypatch):
    monkeypatch.delenv("SUDO_UID", raising=False)
    monkeypatch.delenv("SUDO_GID", raising=False)


def refused(path, code=ExitCode.NOPERM, **kw) -> str:
    with pytest.raises(PstateError) as e:
        outfiles.open_output(str(path), **kw)
    assert e.value.exit_code == code, e.value.message
    return e.value.message


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_new_file_is_0600_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        out = outfiles.open_output(str(tmp_path / "o.jsonl"))
    finally:
        os.umask(old)
    os.close(out.fd)
    assert (out.regular, out.created) == (True, True)
    assert stat.S_IMODE(os.stat(tmp_path / "o.jsonl").st_mode) == 0o600


def test_existing_file_is_truncated_and_keeps_its_owner(tmp_path):
    p = tmp_path / "o.jsonl"
    p.write_bytes(b"old contents\n")
    out = outfiles.open_output(str(p))
    os.write(out.fd, b"new\n")
    os.close(out.fd)
    assert (out.regular, out.created) == (True, False)
    assert p.read_bytes() == b"new\n"


def test_symlink_to_a_file_is_never_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    link = tmp_path / "o.jsonl"
    link.symlink_to(victim)
    msg = refused(link)
    assert msg.startswith(f"refusing to write {link}: it is a symbolic link (to {victim})"), msg
    assert "fix: name the file itself" in msg
    assert victim.read_bytes() == b"precious\n"


def test_dangling_symlink_is_not_created_through(tmp_path):
    link = tmp_path / "o.jsonl"
    link.symlink_to(tmp_path / "would-be-created")
    refused(link, ExitCode.CANTCREAT)
    assert not (tmp_path / "would-be-created").exists()


def test_file_with_several_links_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    os.link(victim, tmp_path / "o.jsonl")
    assert "2 hard links" in refused(tmp_path / "o.jsonl")
    assert victim.read_bytes() == b"precious\n"


@pytest.mark.skipif(not ROOT, reason="chown needs root")
def test_another_users_file_is_refused(tmp_path):
    p = tmp_path / "o.jsonl"
    p.write_bytes(b"theirs\n")
    os.chown(p, 65534, 65534)
    assert "owned by uid 65534, neither root nor you" in refused(p)
    assert p.read_bytes() == b"theirs\n"


@pytest.mark.skipif(not ROOT, reason="sudo's hand-over needs root")
def test_under_sudo_a_new_file_belongs_to_the_invoking_user(tmp_path, monkeypatch):
    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65533")
    out = outfiles.open_output(str(tmp_path / "o.jsonl"))
    os.close(out.fd)
    st = os.stat(tmp_path / "o.jsonl")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65533, 0o600)
    # ... and that user's existing file may be replaced
    outfiles.open_output(str(tmp_path / "o.jsonl"))


@pytest.mark.skipif(not ROOT, reason="chown needs root")
def test_a_directory_link_owned_by_another_user_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "d"
    link.symlink_to(real)
    os.chown(link, 65534, 65534, follow_symlinks=False)
    assert "the directory" in refused(link / "o.jsonl") and not (real / "o.jsonl").exists()


def test_dev_null_and_dev_stdout_are_written_not_synced(tmp_path):
    out = outfiles.open_output("/dev/null")
    assert (out.regular, out.created) == (False, False)
    w = LineWriter(out)
    w.record({"type": "meta", "schema": 1})
    w.close(sync=True)  # no fsync on a device: no EINVAL
    r, wfd = os.pipe()
    saved = os.dup(1)
    os.dup2(wfd, 1)
    try:
        out = outfiles.open_output("/dev/stdout")
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(wfd)
    w = LineWriter(out)
    w.record({"x": 1})
    w.close(sync=True)
    assert os.read(r, 100) == b'{"x":1}\n'
    os.close(r)


def test_fifo_without_a_reader_times_out(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo, 0o600)
    msg = refused(fifo, ExitCode.CANTCREAT, fifo_wait_s=0.2)
    assert msg.startswith(f"nobody reads the FIFO {fifo}") and "start its reader first" in msg


def test_fifo_with_a_reader(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo, 0o600)
    got = []
    t = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    t.start()
    out = outfiles.open_output(str(fifo), fifo_wait_s=5)
    w = LineWriter(out)
    assert not w.regular
    w.record({"x": 1})
    w.close(sync=True)
    t.join(5)
    assert got == [b'{"x":1}\n']


def test_discard_removes_only_the_empty_file_it_created(tmp_path):
    p = tmp_path / "o.jsonl"
    out = outfiles.open_output(str(p))
    outfiles.discard(out)
    assert not p.exists()
    p.write_bytes(b"kept\n")
    out = outfiles.open_output(str(p))  # an existing file: not created by this run
    outfiles.discard(out)
    assert p.exists()
    out = outfiles.open_output(str(tmp_path / "n.jsonl"))
    os.rename(tmp_path / "n.jsonl", tmp_path / "moved")
    (tmp_path / "n.jsonl").write_bytes(b"another\n")  # the path names another file now
    outfiles.discard(out)
    assert (tmp_path / "n.jsonl").read_bytes() == b"another\n" and (tmp_path / "moved").exists()


def test_line_writer_reopen_starts_a_new_file_after_a_rename(tmp_path):
    p = tmp_path / "o.jsonl"
    w = LineWriter(str(p))
    w.record({"n": 1})
    assert not w.moved()
    os.rename(p, tmp_path / "o.jsonl.1")
    assert w.moved()
    w.reopen()
    w.record({"n": 2})
    w.close(sync=True)
    assert (tmp_path / "o.jsonl.1").read_bytes() == b'{"n":1}\n'
    assert p.read_bytes() == b'{"n":2}\n'


def test_output_is_appended_after_a_copytruncate(tmp_path):
    p = tmp_path / "o.jsonl"
    w = LineWriter(str(p), unbuffered=True)
    w.record({"n": 1})
    os.truncate(p, 0)  # logrotate's copytruncate
    w.record({"n": 2})
    w.close()
    assert p.read_bytes() == b'{"n":2}\n'  # no hole of NUL bytes before it


def test_replace_writes_aside_and_renames_at_the_end(tmp_path):
    """open_output(replace=True), as export uses it: the name keeps its old
    content until publish(); abandon() leaves it and no temporary file."""
    p = tmp_path / "t.json"
    out = outfiles.open_output(str(p), replace=True)
    os.write(out.fd, b"new\n")
    assert not p.exists() and len(os.listdir(tmp_path)) == 1  # only the temporary file
    outfiles.publish(out)
    assert p.read_bytes() == b"new\n" and os.listdir(tmp_path) == ["t.json"]
    assert stat.S_IMODE(p.stat().st_mode) == 0o600
    out = outfiles.open_output(str(p), replace=True)
    os.write(out.fd, b"partial")
    outfiles.abandon(out)
    assert p.read_bytes() == b"new\n" and os.listdir(tmp_path) == ["t.json"]
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    (tmp_path / "l.json").symlink_to(victim)
    assert "it is a symbolic link (to" in refused(tmp_path / "l.json", replace=True)
    assert victim.read_bytes() == b"precious\n"


@pytest.mark.skipif(not ROOT, reason="chown needs root")
def test_replace_keeps_the_owner_and_mode_of_the_file_it_replaces(tmp_path, monkeypatch):
    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65534")
    p = tmp_path / "t.json"
    p.write_bytes(b"old\n")
    os.chown(p, 65534, 65534)
    p.chmod(0o644)
    out = outfiles.open_output(str(p), replace=True)
    os.write(out.fd, b"new\n")
    outfiles.publish(out)
    st = p.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (65534, 65534, 0o644)
    assert p.read_bytes() == b"new\n"


def test_replace_writes_a_fifo_as_it_is(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo, 0o600)
    got = []
    t = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    t.start()
    out = outfiles.open_output(str(fifo), replace=True, fifo_wait_s=5)
    assert out.tmp is None and not out.regular
    os.write(out.fd, b"x\n")
    outfiles.publish(out)
    t.join(5)
    assert got == [b"x\n"] and os.listdir(tmp_path) == ["f"]


# --- a full disk -----------------------------------------------------------------------------


@pytest.fixture
def full_fs(tmp_path):
    """A 64 KiB tmpfs filled up but for free(n) bytes: a function."""
    if not ROOT:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "tiny"
    d.mkdir(mode=0o700)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "pstate-test", str(d)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")

    def free(n: int) -> Path:
        fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        finally:
            os.close(fd)
        os.truncate(d / "filler", max(0, (d / "filler").stat().st_size - n))
        return d

    try:
        yield free
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def whole_lines(data: bytes) -> list[dict]:
    assert data.endswith(b"\n"), data[-80:]
    return [orjson.loads(x) for x in data.splitlines()]


@pytest.mark.parametrize("unbuffered", [False, True])
def test_a_full_disk_leaves_whole_lines_and_nothing_more(full_fs, unbuffered):
    """LineWriter on a full file system: ENOSPC raised once, the file cut back
    to its last complete line, nothing written after (not by close, not at
    exit)."""
    d = full_fs(8192)
    w = LineWriter(str(d / "o.jsonl"), unbuffered=unbuffered)
    rec = {"type": "state", "ts": 1, "comm": "x" * 37, "n": 0}
    with pytest.raises(OSError) as e:
        for n in range(100000):
            rec["n"] = n
            w.record(rec)
            if n % 50 == 49:
                w.flush()
        w.close()
    assert e.value.errno == errno.ENOSPC
    assert "No space left on device" in str(e.value)
    recs = whole_lines((d / "o.jsonl").read_bytes())
    assert [r["n"] for r in recs] == list(range(len(recs))) and len(recs) > 10
    size = (d / "o.jsonl").stat().st_size
    with pytest.raises(OSError) as again:  # nothing more is written
        w.record(rec)
    assert again.value is e.value
    w.close(sync=True)
    del w
    import gc

    gc.collect()
    assert (d / "o.jsonl").stat().st_size == size


@pytest.mark.bpf
def test_record_on_a_full_disk_ends_on_a_line_and_exits_74(full_fs):
    from conftest import clean_env, pstate_cmd

    d = full_fs(12288)
    p = subprocess.run(pstate_cmd("record", "-q", "-d", "20", "-o", str(d / "rec.jsonl")), capture_output=True,
                       timeout=120, env=clean_env())
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 74, err
    assert "Traceback" not in err and "No space left on device" in err, err
    assert len(err.strip().splitlines()) <= 2, err  # one message (and its fix)
    recs = whole_lines((d / "rec.jsonl").read_bytes())
    assert recs[0]["type"] == "meta" and len(recs) > 1

"""Writing snapshots: the output directory, atomic publishing, the lock,
retention, the status marker, the file formats and the snapshot loop.

Nothing here touches BPF: the loop takes a source of samples (engines/snap.py
gives it the reader of snap's maps), so every rule below is testable with a
fake; it stops as pstate.lifecycle's Stopper says.

Directory rules (a root job from cron writes here):
- --dir must be a real directory (not a symlink), owned by root or the
  caller, and not group- or world-writable; a missing one is created 0700
  when its parent exists. The path to it is walked by descriptor
  (pstate.trust.open_dir: a link on the way followed only when it is
  root's or the caller's in a directory no one else can write), and every
  file operation goes through one directory file descriptor opened with
  O_NOFOLLOW, so a path swapped later is never followed.
- one instance per directory: flock on DIR/.pstate.lock; a second instance
  exits 75 at once naming the holder. The kernel drops the lock when the
  holder dies, even by SIGKILL.
- a snapshot is written to .pstate-<name>.tmp.<pid>.<rand> (O_EXCL,
  O_NOFOLLOW, mode 0600 whatever the umask), fsync'd, renamed to a name
  that does not exist yet, and the directory is fsync'd. A reader never
  sees a partial snapshot; temp files a killed run left are removed by the
  next one (under the lock, so none of them can be in use).
- who may read what (the rule): pstate writes what root sees, so what it
  writes is root's (0600) unless a reader is named. --group GROUP names
  one: files are 0640 with that group. The --format prom file is written for
  a reader that is not root, the textfile collector, which runs as its own
  user (Debian: prometheus): it is 0644 (0640 with --group), and it holds
  only the labels --prom-by asks for. By default (unit) and per cgroup those
  are names every local user can read in /sys/fs/cgroup anyway; process
  titles (command lines, which may carry secrets), comm and pids appear
  only when asked (--prom-by title, comm, pid, thread). Where /proc hides
  other users' processes (hidepid), such a file stays 0600 without --group,
  and snap says so: it shows no one what /proc would not show them. A DIR
  a prom run creates is 0755 (0750 with --group's group), so the collector
  can list it; an existing one is left as it is, with a warning when the
  reader could not list it. Everything else (JSON-lines and CSV snapshots,
  the ledger, the status, the lock, the collector's cursor) keeps the rule
  above.
- retention (--keep, --max-age) deletes only snapshots pstate wrote there:
  each published name is appended to DIR/.pstate-written, and only names
  listed there, oldest first in the order they were written, are ever
  removed; a file merely named like a snapshot is never touched, and its
  sequence number does not move pstate's own.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import stat
import sys
from dataclasses import dataclass, field
from typing import Callable, Protocol

import orjson

from pstate import lifecycle, trust
from pstate.kernel import identity
from pstate.snapshots import folds as foldrows, histograms, snapdir
from pstate.snapshots.promexport import PER_PROCESS, PromExport, procfs_hidepid
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.meta import clock_anchor, rfc3339

LEDGER_NAME = ".pstate-written"  # the snapshot names pstate published here, one a line, in order
_NOSPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_REFUSED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _errname(e: OSError) -> str:
    return errno.errorcode.get(e.errno, str(e.errno)) if e.errno else "error"


# --- the directory ----------------------------------------------------------


def open_out_dir(path: str, create: bool = True) -> int:
    """Check --dir and return an O_DIRECTORY|O_NOFOLLOW descriptor of it."""
    return _open_out_dir(path, create)[0]


def _open_out_dir(path: str, create: bool) -> tuple[int, bool]:
    """open_out_dir's descriptor, and whether this call created the directory.
    The directory it is in is walked by trust.open_dir (by descriptor, a
    link on the way followed only when root's or yours in a directory only
    you can write); --dir is then created, checked and opened relative to
    that directory's descriptor."""
    parent, name = os.path.split(path.rstrip("/") or "/")
    if name in ("", ".", ".."):
        parent, name = os.path.split(os.path.abspath(path))
        name = name or "."  # --dir /
    try:
        pfd = trust.open_dir(parent, (0, os.geteuid()))
    except trust.WalkError as e:
        if e.unsafe:
            raise PstateError(f"--dir {path}: {e.why}", ExitCode.NOPERM,
                              hint="use a directory whose path no other user can change") from None
        if e.errno == errno.ENOENT:
            raise PstateError(f"--dir {path}: no such directory, and its parent {os.path.abspath(parent or '.')} "
                              "does not exist either", ExitCode.CANTCREAT, hint=f"mkdir -p -m 0700 {path}") from None
        raise PstateError(f"--dir {path}: {os.strerror(e.errno) if e.errno else e.why}", ExitCode.CANTCREAT) from None
    try:
        return _open_out_dir_at(path, pfd, name, create)
    finally:
        os.close(pfd)


def _open_out_dir_at(path: str, pfd: int, name: str, create: bool) -> tuple[int, bool]:
    made = False
    try:
        st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
    except FileNotFoundError:
        if not create:
            parent = os.path.dirname(os.path.abspath(path))
            raise PstateError(f"--dir {path}: no such directory, and its parent {parent} does not exist either",
                              ExitCode.CANTCREAT, hint=f"mkdir -p -m 0700 {path}") from None
        try:
            os.mkdir(name, 0o700, dir_fd=pfd)
            made = True
        except FileExistsError:
            pass
        except OSError as e:
            raise PstateError(f"cannot create --dir {path}: {e.strerror}",
                              ExitCode.NOPERM if e.errno in (errno.EACCES, errno.EPERM) else ExitCode.CANTCREAT
                              ) from None
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except OSError as e:
            raise PstateError(f"--dir {path}: {e.strerror}", ExitCode.CANTCREAT) from None
    except OSError as e:
        raise PstateError(f"--dir {path}: {e.strerror}", ExitCode.CANTCREAT) from None
    if stat.S_ISLNK(st.st_mode):
        raise PstateError(f"--dir {path} is a symbolic link; pstate writes only into a real directory",
                          ExitCode.NOPERM, hint=f"pass the directory it points to: {os.path.realpath(path)}")
    if not stat.S_ISDIR(st.st_mode):
        raise PstateError(f"--dir {path} is not a directory", ExitCode.CANTCREAT)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=pfd)
    except OSError as e:
        code = ExitCode.NOPERM if e.errno in (errno.ELOOP, errno.EACCES, errno.EPERM, errno.ENOTDIR) \
            else ExitCode.CANTCREAT
        raise PstateError(f"cannot open --dir {path}: {e.strerror}", code) from None
    st2 = os.fstat(fd)
    if (st2.st_dev, st2.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise PstateError(f"--dir {path} changed while it was being opened", ExitCode.NOPERM)
    if made and st.st_uid == os.geteuid():
        with contextlib.suppress(OSError):  # 0700 whatever the umask
            os.fchmod(fd, 0o700)
            st = os.fstat(fd)
    if st.st_mode & 0o022:
        os.close(fd)
        raise PstateError(
            f"--dir {path} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o}); "
            "another user could replace or plant snapshots there",
            ExitCode.NOPERM, hint=f"chmod go-w {path}, or use a directory of your own")
    if st.st_uid not in (0, os.geteuid()):
        os.close(fd)
        raise PstateError(f"--dir {path} is owned by uid {st.st_uid}, neither root nor you", ExitCode.NOPERM,
                          hint=f"chown {os.geteuid()} {path}, or use a directory of your own")
    return fd, made


def _closed_to_reader(path: str, st: os.stat_result, gid: int | None) -> str | None:
    """Why a reader that is neither root nor DIR's owner (in group gid, with
    --group) could not list DIR, or None. Its path's directories must let
    it search them, DIR let it read and search."""
    def lets(s: os.stat_result, need: int) -> bool:
        shift = 3 if gid is not None and s.st_gid == gid else 0  # its group's bits, else the others'
        return (s.st_mode >> shift) & need == need

    def who() -> str:
        return "others" if gid is None else f"group {gid} and others"

    if not lets(st, 0o5):
        return f"{path} is mode {stat.S_IMODE(st.st_mode):04o} (no read and search for {who()})"
    above = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            ast = os.stat(above)
        except OSError:
            return None
        if not lets(ast, 0o1):
            return f"{above}, on its path, is mode {stat.S_IMODE(ast.st_mode):04o} (no search for {who()})"
        if above == "/":
            return None
        above = os.path.dirname(above)


_libc = None


def _rename_noreplace(dfd: int, src: str, dst: str) -> None:
    """renameat2(RENAME_NOREPLACE): never overwrite; FileExistsError if dst exists."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(_libc, "renameat2", None)
    if fn is not None:
        if fn(dfd, src.encode(), dfd, dst.encode(), 1) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(err, os.strerror(err), dst)
    # The file system or libc lacks it; the lock keeps other pstates out.
    try:
        os.stat(dst, dir_fd=dfd, follow_symlinks=False)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    except FileNotFoundError:
        pass
    os.rename(src, dst, src_dir_fd=dfd, dst_dir_fd=dfd)


class SnapDir:
    """The --dir directory, locked for this process."""

    def __init__(self, path: str, *, create: bool = True, gid: int | None = None):
        self.path = path
        self.fd, self.made = _open_out_dir(path, create)
        self.gid = gid
        self.mode = 0o640 if gid is not None else 0o600  # root's, or --group's
        self.shared_mode = 0o640 if gid is not None else 0o644  # a file for a reader of its own (--format prom)
        self.lock_fd: int | None = None
        self.seq = 0

    def where(self, name: str) -> str:
        return os.path.join(self.path, name)

    def open_to_reader(self) -> str | None:
        """DIR for a reader that runs as its own user (a textfile collector
        lists DIR): made 0755 (0750 with --group's group) when this run
        created it; an existing one is left as it is. Returns why such a
        reader could not list DIR, or None."""
        if self.made:
            with contextlib.suppress(OSError):
                if self.gid is not None:
                    os.fchown(self.fd, -1, self.gid)
                os.fchmod(self.fd, 0o750 if self.gid is not None else 0o755)
        return _closed_to_reader(self.path, os.fstat(self.fd), self.gid)

    def lock(self) -> None:
        """Take DIR/.pstate.lock or exit 75 naming the holder."""
        try:
            fd = os.open(snapdir.LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self.fd)
        except OSError as e:
            code = ExitCode.NOPERM if e.errno in (errno.ELOOP, errno.EACCES, errno.EPERM) else ExitCode.CANTCREAT
            raise PstateError(f"cannot open the lock file {self.where(snapdir.LOCK_NAME)}: {e.strerror}",
                              code) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise PstateError(f"{self.where(snapdir.LOCK_NAME)} is not a regular file", ExitCode.NOPERM)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if not isinstance(e, BlockingIOError):
                os.close(fd)
                raise PstateError(f"cannot lock {self.where(snapdir.LOCK_NAME)}: {e.strerror}",
                                  ExitCode.CANTCREAT, hint="use a local file system for --dir") from None
            holder = ""
            try:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            except OSError:
                pass
            os.close(fd)
            who = f"pid {holder}" if holder.isdigit() else "another process"
            raise PstateError(f"{self.path} is locked by {who} (another pstate snap writes there)",
                              ExitCode.TEMPFAIL, hint="one pstate snap per directory; try again later") from None
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o600)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.lock_fd = fd
        self.seq = max((snapdir.parse_name(n)[1] for n in self.written()), default=0)

    def written(self) -> list[str]:
        """The names DIR/.pstate-written lists (a torn last line is ignored)."""
        try:
            fd = os.open(LEDGER_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except FileNotFoundError:
            return []
        except OSError as e:
            if e.errno == errno.ELOOP:
                return []  # a link is not pstate's ledger
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid not in (0, os.geteuid()):
                return []
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read()
        finally:
            os.close(fd)
        names, seen = [], set()
        for line in data.split(b"\n")[:-1]:
            name = line.decode(errors="replace")
            if snapdir.parse_name(name) and name not in seen:
                names.append(name)
                seen.add(name)
        return names

    def _note_written(self, name: str) -> None:
        """Append a published snapshot's name to the ledger (under the lock)."""
        fd = os.open(LEDGER_NAME, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, f"{self.where(LEDGER_NAME)} is not a regular file")
            if self.gid is not None:
                os.fchown(fd, -1, self.gid)
            os.fchmod(fd, self.mode)  # whatever the umask
            end = os.lseek(fd, 0, os.SEEK_END)
            if end and os.pread(fd, 1, end - 1) != b"\n":
                os.write(fd, b"\n")  # a torn line a crash left ends here
            os.write(fd, name.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def clean_temps(self) -> int:
        """Remove temp files killed runs left behind. Only regular files with
        pstate's temp name; never follows a symlink. Call with the lock held."""
        removed = 0
        for e in os.scandir(self.fd):
            if snapdir.TEMP_RE.match(e.name) and e.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(e.name, dir_fd=self.fd)
                    removed += 1
        return removed

    def own_files(self, ext: str | None) -> list[tuple[int, int, str]]:
        """(seq, wall ns, name) of the snapshot files pstate wrote here (the
        ledger lists them) that are still regular files, oldest first."""
        out = []
        for name in self.written():
            parsed = snapdir.parse_name(name)
            if ext is not None and parsed[2] != ext:
                continue
            try:
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                out.append((parsed[1], parsed[0], name))
        return out

    def _write_temp(self, name: str, data: bytes, mode: int) -> str:
        tmp = f".pstate-{name}.tmp.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.fd)
        try:
            if self.gid is not None:
                os.fchown(fd, -1, self.gid)
            os.fchmod(fd, mode)  # after the group, and whatever the umask
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)  # an fsync error is never ignored: the data may be gone
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise
        os.close(fd)
        return tmp

    def publish(self, name: str, data: bytes, *, replace: bool = False, mode: int | None = None) -> None:
        """Write data to DIR/name atomically and durably, mode self.mode
        unless told. replace=False never overwrites (FileExistsError)."""
        tmp = None
        try:
            tmp = self._write_temp(name, data, self.mode if mode is None else mode)
            if replace:
                os.rename(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            else:
                _rename_noreplace(self.fd, tmp, name)
            tmp = None
            os.fsync(self.fd)
        except FileExistsError:
            raise
        except OSError as e:
            if e.errno in _NOSPACE:
                raise PstateError(
                    f"cannot write snapshot {self.where(name)}: {e.strerror} ({_errname(e)}); "
                    "earlier snapshots are intact", ExitCode.CANTCREAT,
                    hint="free space there, or keep fewer snapshots (--keep, --max-age)") from None
            code = ExitCode.CANTCREAT if e.errno in _REFUSED else ExitCode.IOERR
            raise PstateError(f"cannot write snapshot {self.where(name)}: {e.strerror} ({_errname(e)})",
                              code) from None
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=self.fd)

    def publish_snapshot(self, wall_ns: int, ext: str, render: Callable[[int], bytes]) -> str:
        """Publish render(seq) under the next free pstate-snap-<time>-<seq> name."""
        for _ in range(100):
            self.seq += 1
            name = snapdir.snapshot_name(wall_ns, self.seq, ext)
            try:
                self.publish(name, render(self.seq))
            except FileExistsError:
                continue  # someone else's file took the name: take the next sequence
            try:
                self._note_written(name)
            except OSError as e:
                print(f"pstate snap: warning: cannot note {name} in {self.where(LEDGER_NAME)}: {e.strerror}; "
                      "retention will not remove it", file=sys.stderr)
            return name
        raise PstateError(f"cannot find a free snapshot name in {self.path}", ExitCode.CANTCREAT)

    def prune(self, *, ext: str, keep: int | None, max_age_ns: int | None, now_wall_ns: int,
              protect: str) -> list[str]:
        """Delete pstate's own oldest snapshot files past --keep or --max-age
        (age from the wall time in the name). Never the newest, never other files."""
        files = [f for f in self.own_files(ext) if f[2] != protect]
        doomed = []
        if keep is not None:
            excess = len(files) + 1 - keep
            if excess > 0:
                doomed.extend(files[:excess])
                files = files[excess:]
        if max_age_ns is not None:
            doomed.extend(f for f in files if now_wall_ns - f[1] > max_age_ns)
        removed = []
        for _seq, _w, name in doomed:
            try:
                os.unlink(name, dir_fd=self.fd)
                removed.append(name)
            except FileNotFoundError:
                pass
        if removed:
            # the ledger keeps only what is still there
            gone = set(removed)
            keep_names = [n for _s, _w, n in self.own_files(None) if n not in gone]
            self.publish(LEDGER_NAME, "".join(n + "\n" for n in keep_names).encode(), replace=True)
        return removed

    def write_status(self, rec: dict) -> None:
        """DIR/.pstate-last.json: outcome of the latest run, for alerting on
        stale or failing snapshots (like node_exporter's textfile mtime)."""
        self.publish(snapdir.STATUS_NAME, orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE), replace=True)

    def close(self) -> None:
        for fd in (self.lock_fd, self.fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.lock_fd = None
        self.fd = None


# --- formats -----------------------------------------------------------------


def _dumps(rec: dict) -> bytes:
    return orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE)


def render_jsonl(meta: dict, rows: list[dict], end: dict) -> bytes:
    return b"".join([_dumps(meta), *map(_dumps, rows), _dumps(end)])


def csv_columns(rows: list[dict]) -> list[str]:
    cols = [c for c in snapdir.ROW_FIELDS if c != "type"]
    seen = set(cols)
    for r in rows[:1]:
        cols.extend(k for k in r if k not in seen and k != "type")
    return cols


def _csv_cell(v) -> str:
    if v is None:
        return ""
    if v is True or v is False:
        return "true" if v else "false"
    s = str(v)
    if any(c in s for c in ',"\n\r'):
        return '"' + s.replace('"', '""') + '"'
    return s


def render_csv(meta: dict, rows: list[dict], end: dict) -> bytes:
    """A header row and one row per task; the meta and end records ride
    along as JSON in '#' comment lines (pandas: read_csv(comment='#'))."""
    cols = csv_columns(rows)
    lines = [b"# " + orjson.dumps(meta) + b"\n", ",".join(cols).encode() + b"\n"]
    for r in rows:
        lines.append(",".join(_csv_cell(r.get(c)) for c in cols).encode() + b"\n")
    lines.append(b"# " + orjson.dumps(end) + b"\n")
    return b"".join(lines)


# --- the loop ----------------------------------------------------------------


@dataclass
class Sample:
    """What a SampleSource read: cumulative rows, exact at ts."""

    ts: int  # CLOCK_MONOTONIC ns
    rows: list  # dicts with the task fields except type and ts; freed threads appear once
    map_full: int  # failed map updates since the run began
    read_ns: int = 0  # how long reading took: rows may hold events up to ts + read_ns
    folds: list = field(default_factory=list)  # group rows of folded final rows (cumulative), taskmaps._fold
    counts: dict = field(default_factory=dict)  # the kernel's counters by name (taskmaps.COUNTERS)


class SampleSource(Protocol):
    """What the loop reads: taskmaps.MapReader (a program of this run),
    collector.PinnedReader (the running collector), or a test's fake."""

    def start(self) -> int:
        """Begin counting; return the monotonic ns counting starts at."""

    def collect(self) -> Sample:
        ...


@dataclass
class Plan:
    fmt: str = "jsonl"  # jsonl | csv | prom
    interval_ns: int = 5_000_000_000
    count: int = 1  # 0: until stopped
    clear: bool = False
    keep: int | None = None
    max_age_ns: int | None = None
    prom_by: str = "unit"


class Snapper:
    """Take snapshots on a drift-free schedule and publish each one."""

    def __init__(self, out: SnapDir, source: SampleSource, plan: Plan, meta_base: dict, stopper: lifecycle.Stopper,
                 log: Callable[[str], None] = lambda msg: None):
        self.out = out
        self.source = source
        self.plan = plan
        self.meta_base = meta_base
        self.stopper = stopper
        self.log = log
        self.prom = PromExport(plan.prom_by) if plan.fmt == "prom" else None
        self.prom_mode = self._prom_mode() if self.prom is not None else None
        self.hists = histograms.HistTotals(plan.prom_by)  # jsonl's hist rows
        self.prev: dict[tuple, dict] = {}  # (tid, start_ts) -> row of the previous snapshot
        self.prev_ts: int | None = None  # when the previous snapshot was taken (prom: the interval of the growth)
        self.folds = foldrows.Folds()  # the folded groups read last, and this directory's totals of them
        self.identities = identity.RowIdentities()  # each row's title and cgroup
        self.run_id = secrets.token_hex(8)

    def _prom_mode(self) -> int:
        """The .prom file's mode, by the rule at the top: 0644 (0640 with
        --group) for the textfile collector's user; 0600 where its labels
        name processes /proc hides from other users. Says why a collector
        could not read it (on a terminal, or with --verbose: cron mails
        nothing on success)."""
        def warn(msg: str) -> None:
            if sys.stderr.isatty():
                print(f"pstate snap: warning: {msg}", file=sys.stderr)
            else:
                self.log(f"warning: {msg}")

        hidden = procfs_hidepid()
        if hidden and self.out.gid is None and self.plan.prom_by in PER_PROCESS:
            warn(f"/proc hides other users' processes here (hidepid={hidden}) and --prom-by {self.plan.prom_by} "
                 f"labels name them: {snapdir.PROM_NAME} is readable by root only (0600); --group GROUP (the "
                 "textfile collector's group) makes it 0640 for that group")
            return self.out.mode
        why = self.out.open_to_reader()
        if why:
            warn(f"a textfile collector running as its own user cannot read {self.out.where(snapdir.PROM_NAME)}: "
                 f"{why}; use a directory it can list (Debian's: /var/lib/prometheus/node-exporter)")
        return self.out.shared_mode

    def run(self) -> int:
        """Returns the exit code: 0, or 130/143 when a signal ends the run
        before the interval in progress was published."""
        if self.stopper.stopped:
            return self.stopper.exit_code()
        run_start = self.source.start()
        mono, wall = clock_anchor()
        start_ts, wall_start = run_start, wall + (run_start - mono)
        k = 0
        while self.plan.count == 0 or k < self.plan.count:
            k += 1
            if self.stopper.wait_until(run_start + k * self.plan.interval_ns):
                return self.stopper.exit_code()
            sample = self.source.collect()
            mono, wall = clock_anchor()
            wall_end = wall + (sample.ts - mono)
            name = self._publish(sample, run_start, start_ts, wall_start, wall_end)
            self.log(f"wrote {self.out.where(name)} ({len(sample.rows)} tasks)")
            self._after_publish(name, wall_end, sample)
            if self.plan.clear:  # the next snapshot starts where this one ended
                start_ts, wall_start = sample.ts, wall_end
            if self.stopper.stopped:
                break  # this interval's snapshot is out: a normal end
        return int(ExitCode.OK)

    def _publish(self, sample: Sample, run_start: int, start_ts: int, wall_start: int, wall_end: int) -> str:
        ts = sample.ts
        meta = dict(self.meta_base)
        meta.update({
            "ts": ts, "wall_ns": wall_end, "wall_time": rfc3339(wall_end),
            "interval_start_ts": start_ts, "interval_end_ts": ts,
            "wall_start_ns": wall_start, "wall_end_ns": wall_end,
            "mode": "delta" if self.plan.clear else "cumulative",
            "truncated": sample.map_full > 0, "map_full": sample.map_full, "read_ns": sample.read_ns,
            "run_id": self.run_id, "run_start_ts": run_start,
            **{k: sample.counts.get(k, 0) for k in ("gone_full", "folded", "fold_lost", "skipped")},
        })
        rows, deltas, new, hists = [], [], [], []
        who = self.identities.of(r["pid"] for r in sample.rows)
        leader = {r["pid"]: r["comm"] for r in sample.rows if r["tid"] == r["pid"]}
        here = {(r["tid"], r["start_ts"]) for r in sample.rows}
        moved = snapdir.execs_moved(self.prev, sample.rows, here)
        for r in sample.rows:
            k = (r["tid"], r["start_ts"])
            prev = self.prev.get(k) or self.prev.get(moved.get(k))
            d = snapdir.subtract(r, prev)
            ident = self.identities.exact_cgroup(who[r["pid"]], r.pop("kernel_cgroup", None), r["exited"])
            row = {"type": "task", "ts": ts, **r, **ident}
            r["fold"] = foldrows.key(ident["cgroup"], leader.get(r["pid"], r["comm"]))  # its group if folded
            hists.append(histograms.delta(row.pop("hist", None), prev and prev.get("hist")))
            if self.plan.clear:
                row.update(d)
            rows.append(row)
            deltas.append(d)
            new.append(prev is None)
        gone_on = set(moved.values())  # (moved under their process's pid: not vanished)
        vanished = [p for k, p in self.prev.items() if k not in here and k not in gone_on]  # folded (or lost) since
        folded = self.folds.step(sample.folds, vanished, self.identities.cgroups, ts, self.plan.clear)
        fold_keys = foldrows.group_keys(self.plan.prom_by, [f[0] for f in folded])
        self.prev = {(r["tid"], r["start_ts"]): r for r in sample.rows if r["state"] != "reaped"}
        end = {"type": "end", "ts": ts, "tasks": len(rows), "reason": "interval", "wall_time": meta["wall_time"],
               "folded": meta["folded"], "fold_lost": meta["fold_lost"]}
        if self.plan.fmt == "prom":
            # threads the kernel never reports switching out: their time is
            # unknown, not on-CPU (as stats DIR/ counts it)
            since = self.prev_ts if self.prev_ts is not None else start_ts
            snapdir.move_untraced([(row["state"], row.get("state_since_ts"), d) for row, d in zip(rows, deltas)],
                                  since, ts - since, meta.get("ncpu"))
            self.prev_ts = ts
            self.prom.update(rows, deltas, new, run_start, hists,
                             [(k, growth, h) for k, (_rec, growth, h) in zip(fold_keys, folded)])
            self.out.seq += 1
            meta["seq"] = self.out.seq
            self.out.publish(snapdir.PROM_NAME, self.prom.render(meta), replace=True, mode=self.prom_mode)
            return snapdir.PROM_NAME
        render = render_csv if self.plan.fmt == "csv" else render_jsonl
        if self.plan.fmt == "jsonl":  # + a hist row per group and kind (CSV holds task rows only)
            self.hists = histograms.HistTotals(self.plan.prom_by) if self.plan.clear else self.hists
            self.hists.update(rows, hists + [h for _r, _g, h in folded],
                              histograms.group_keys(self.hists.by, rows) + fold_keys)
            more = self.hists.records(ts)
            # + a fold row per group of folded threads
            rows, end["hists"], end["folds"] = rows + [f[0] for f in folded] + more, len(more), len(folded)

        def with_seq(seq: int) -> bytes:
            meta["seq"] = seq
            return render(meta, rows, end)

        return self.out.publish_snapshot(wall_end, snapdir.EXTENSIONS[self.plan.fmt], with_seq)

    def _after_publish(self, name: str, wall_end: int, sample: Sample) -> None:
        try:
            self.out.write_status({"ok": True, "ts": sample.ts, "wall_ns": wall_end, "file": name,
                                   "seq": self.out.seq, "tasks": len(sample.rows),
                                   "truncated": sample.map_full > 0, "pid": os.getpid(), "error": None})
        except PstateError as e:
            print(f"pstate snap: warning: {e.message}", file=sys.stderr)
        if self.plan.fmt == "prom" or (self.plan.keep is None and self.plan.max_age_ns is None):
            return
        try:
            removed = self.out.prune(ext=snapdir.EXTENSIONS[self.plan.fmt], keep=self.plan.keep,
                                     max_age_ns=self.plan.max_age_ns, now_wall_ns=wall_end, protect=name)
        except OSError as e:
            print(f"pstate snap: warning: retention failed in {self.out.path}: {e.strerror}", file=sys.stderr)
            return
        for n in removed:
            self.log(f"removed {self.out.where(n)} (retention)")

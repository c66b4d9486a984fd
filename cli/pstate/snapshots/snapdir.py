"""Snapshot files of `pstate snap`: names, row fields, and the shared reader.

A snapshot is a JSON-lines file: a meta header (source "snap"), one "task"
row per thread, and an "end" trailer (man pstate-events). This module lists
and reads them, orders them, and turns them into intervals: per-thread
counters over the time between consecutive snapshots, with identities that
survive pid reuse. stats, heat and replay all read snapshots through it.

Rules the readers rely on:
- time comes from the monotonic fields; wall time only labels and orders
  boots. Nothing is subtracted across two boot ids or two runs.
- a thread is (pid, tid, start_ts). start_ts of a thread seeded from /proc
  has the kernel's clock-tick resolution, and a thread seen at fork has the
  exact fork time, so two runs may disagree by up to a tick: across runs,
  start times within START_SLACK_NS are the same thread. Within a run they
  must be equal. A thread other than the leader that execs takes its
  process's pid: its row moves to that tid, keeping its start_ts (1 ns
  later if that was the old leader's) and counters (the writer takes its
  growth from its row under its former tid: execs_moved).
"""

from __future__ import annotations

import calendar
import csv
import os
import re
import stat
import time
from dataclasses import dataclass, field
from typing import Iterable

import orjson

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import identity
from pstate.snapshots import histograms
from pstate.stream.streamio import MAX_LINE, ReadStats, open_input
from pstate.stream.reader import overlong, read_records

# --- names -----------------------------------------------------------------

PREFIX = "pstate-snap-"
NAME_RE = re.compile(r"^pstate-snap-(\d{8}T\d{6})\.(\d{6})Z-(\d{6,})\.(jsonl|csv)$")
PROM_NAME = "pstate-snap.prom"  # one stable name: node_exporter reads every *.prom file
TEMP_RE = re.compile(r"^\.pstate-.+\.tmp\.\d+\.[0-9a-f]+$")
LOCK_NAME = ".pstate.lock"
STATUS_NAME = ".pstate-last.json"
EXTENSIONS = {"jsonl": "jsonl", "csv": "csv", "prom": "prom"}

START_SLACK_NS = 20_000_000  # two clock ticks at HZ=100

# --- row fields ------------------------------------------------------------

# Every row has a <state>_ns field for each of these (0 when never seen);
# a kernel that reports more states adds more <state>_ns fields.
STATE_FIELDS = ("running", "runnable", "preempted", "new", "sleeping", "uninterruptible", "stopped",
                "traced", "zombie", "dead", "parked", "idle", "unknown")
COUNT_FIELDS = ("nvcsw", "nivcsw", "wakeups")
# Of running_ns, the time the kernel did not count as the thread's own
# (meta on_cpu_time kernel; 0 with wall): a counter, not a state
STEAL_FIELD = "steal_irq_ns"
IDENTITY_FIELDS = ("title", "cgroup", "cgroup_path", "ppid")  # who the thread's process is (kernel.identity)
ROW_FIELDS = ("type", "ts", "pid", "tid", "comm", "start_ts", "state", "state_since_ts", "exited", "exit_ts",
              *(f"{s}_ns" for s in STATE_FIELDS), STEAL_FIELD, *COUNT_FIELDS, *IDENTITY_FIELDS)
WAIT_FIELDS = ("runnable_ns", "preempted_ns", "new_ns")

# Field descriptions for the format documentation (schema.RECORDS style).
TASK_RECORD = (
    "one thread in a snapshot (pstate snap): its time per state and counts, over the interval",
    {
        "pid": ("int", "process id (tgid); 0 when unknown"),
        "tid": ("int", "thread id"),
        "comm": ("string", "task name at the snapshot (or when it ended)"),
        "start_ts": ("int", "CLOCK_MONOTONIC ns the thread started (fork), or /proc's start time for threads "
                            "alive when snap began (clock-tick resolution); with pid and tid, the identity"),
        "state": ("string", "state at the snapshot; reaped once the kernel freed the thread"),
        "state_since_ts": ("int?", "when it entered that state"),
        "exited": ("bool", "the thread has exited (it may still be a zombie)"),
        "exit_ts": ("int?", "when it exited"),
        **{f"{s}_ns": ("int", f"ns spent {s} in the interval (cumulative mode: since the run began)")
           for s in STATE_FIELDS},
        STEAL_FIELD: ("int", "of running_ns, the time the kernel did not count as the thread's own on-CPU time "
                             "(/proc/TID/schedstat's): stolen by the hypervisor or spent in interrupts, per slice "
                             "at its switch-out; 0 where meta on_cpu_time is wall, or absent in older snapshots"),
        "nvcsw": ("int", "voluntary switches off the CPU (blocked)"),
        "nivcsw": ("int", "involuntary switches off the CPU (preempted)"),
        "wakeups": ("int", "wake-ups from a blocked state"),
        "title": ("string?", "its process's title (as ps shows it; null for a kernel thread or when not known)"),
        "cgroup": ("int?", "the id of its process's cgroup v2 (as in cgroup records); of a thread that "
                           "exited, the one it exited in; null when not known"),
        "cgroup_path": ("string?", "that cgroup's path below the v2 mount (/system.slice/x.service)"),
        "ppid": ("int?", "its process's parent (pid); null when not known"),
    },
)
SNAP_META_FIELDS = {
    "interval_start_ts": ("int", "snap: CLOCK_MONOTONIC ns the interval starts (cumulative: the run's start)"),
    "interval_end_ts": ("int", "snap: CLOCK_MONOTONIC ns of the snapshot"),
    "wall_start_ns": ("int", "snap: wall-clock ns at interval_start_ts"),
    "wall_end_ns": ("int", "snap: wall-clock ns at interval_end_ts (labels only; intervals use monotonic time)"),
    "seq": ("int", "snap: sequence number in the directory"),
    "mode": ("string", "snap: cumulative (since the run began) or delta (--clear: over this interval)"),
    "truncated": ("bool", "snap: the task map was full at some point; threads are missing"),
    "map_full": ("int", "snap: rows missing since the run began (task map full, or a final row lost)"),
    "read_ns": ("int", "snap: time taken to read the kernel's maps; rows may include events up to "
                       "interval_end_ts + read_ns"),
    "run_id": ("string", "snap: one value per run; snapshots of one run can be subtracted"),
    "run_start_ts": ("int", "snap: CLOCK_MONOTONIC ns the run began counting"),
    "max_tasks": ("int", "snap: --max-tasks"),
    "interval_ns": ("int", "snap: --interval"),
    "format": ("string", "snap: jsonl, csv or prom"),
}


# Groups of threads by who their process is (--by of stats and heat on snapshots)
SERVICE_KEYS = identity.GROUP_KEYS


def service_key(by: str, row: dict, role=None):
    """The group of a task row by one of SERVICE_KEYS, from its identity
    fields (identity.group_key), as the stream readers group by a process's
    records; role: the pattern of --by 'title:REGEX'."""
    return identity.group_key(by, title=row.get("title"), comm=row.get("comm"), ppid=row.get("ppid"),
                              cgroup_path=row.get("cgroup_path"), role=role)


def snapshot_name(wall_ns: int, seq: int, ext: str) -> str:
    """pstate-snap-<UTC YYYYmmddTHHMMSS.ffffffZ>-<seq>.<ext>: sorts by time."""
    secs, rem = divmod(wall_ns, 1_000_000_000)
    return f"{PREFIX}{time.strftime('%Y%m%dT%H%M%S', time.gmtime(secs))}.{rem // 1000:06d}Z-{seq:06d}.{ext}"


def parse_name(name: str) -> tuple[int, int, str] | None:
    """(wall ns, seq, extension) of a snapshot file name, or None."""
    m = NAME_RE.match(name)
    if not m:
        return None
    try:
        secs = calendar.timegm(time.strptime(m.group(1), "%Y%m%dT%H%M%S"))
    except ValueError:
        return None
    return secs * 1_000_000_000 + int(m.group(2)) * 1000, int(m.group(3)), m.group(4)


def counter_fields(row: dict) -> list[str]:
    """Every counter of a row: the <state>_ns fields, STEAL_FIELD and
    COUNT_FIELDS (state_fields: the states alone)."""
    return [k for k in row if k.endswith("_ns")] + [k for k in COUNT_FIELDS if k in row]


def execs_moved(prev: dict, rows: list, here: set) -> dict:
    """{(tid, start_ts) of a row now: the key in prev of the same thread's
    row under another tid} for the threads that took their process's pid: a
    thread other than the leader that execs becomes the leader (the kernel
    gives it the leader's pid), and its row moves there with its counters.
    That is the one previous row of the same process and the same birth (or
    1 ns before: born in the old leader's tick, the thread is shown 1 ns
    later so that the two stay apart; taskmaps) that is no longer under its
    own tid. Two such rows match neither. prev: (tid, start_ts) -> row,
    whose "pid" a cursor file of an older pstate may lack."""
    by_birth: dict[tuple, list] = {}
    for (tid, start), p in prev.items():
        if (tid, start) not in here and p.get("pid") not in (None, tid):
            by_birth.setdefault((p["pid"], start), []).append((tid, start))
    out = {}
    for r in rows:
        k = (r["tid"], r["start_ts"])
        if r["tid"] == r["pid"] and k not in prev:
            found = by_birth.get((r["pid"], r["start_ts"]), []) + by_birth.get((r["pid"], r["start_ts"] - 1), [])
            if len(found) == 1:
                out[k] = found[0]
    return out


def state_fields(row: dict) -> list[str]:
    """The <state>_ns fields of a row: its counters that tile the interval."""
    return [k for k in row if k.endswith("_ns") and k != STEAL_FIELD]


def subtract(cur: dict, prev: dict | None) -> dict[str, int]:
    """Counters of cur minus those of prev (an earlier row of the same thread
    in the same run); all of cur's when prev is None."""
    out = {}
    for k in counter_fields(cur):
        v = cur[k]
        if prev is not None:
            v -= prev.get(k, 0)
        out[k] = v if v > 0 else 0
    return out


# --- reading ---------------------------------------------------------------


@dataclass
class Snapshot:
    path: str
    meta: dict
    rows: list
    end: dict | None = None
    hists: list = field(default_factory=list)  # its "hist" rows (histograms.HIST_RECORD)
    folds: list = field(default_factory=list)  # its "fold" rows (snapshots/folds.py FOLD_RECORD)

    @property
    def boot_id(self) -> str:
        return str(self.meta.get("boot_id") or "")

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or f"{self.meta.get('pstate_pid')}:{self.meta.get('run_start_ts')}")

    @property
    def start_ts(self) -> int:
        return self.meta["interval_start_ts"]

    @property
    def end_ts(self) -> int:
        return self.meta["interval_end_ts"]

    @property
    def wall_end_ns(self) -> int:
        return self.meta.get("wall_end_ns") or 0

    @property
    def mode(self) -> str:
        return self.meta.get("mode", "cumulative")

    @property
    def truncated(self) -> bool:
        return bool(self.meta.get("truncated"))


def _int(v) -> bool:
    return type(v) is int and v >= 0


def check_task(rec: dict) -> str | None:
    """Why a task row is unusable, or None."""
    for f in ("pid", "tid", "start_ts"):
        if not _int(rec.get(f)):
            return f'task row with a bad or missing "{f}"'
    for k in counter_fields(rec):
        if not _int(rec[k]):
            return f'task row with a bad "{k}"'
    for f in ("exit_ts", "state_since_ts"):
        if rec.get(f) is not None and not _int(rec[f]):
            return f'task row with a bad "{f}"'
    return None


def check_hist(rec: dict) -> str | None:
    """Why a hist row is unusable, or None."""
    if rec.get("kind") not in histograms.KINDS or type(rec.get("by")) is not str:
        return 'hist row with a bad "kind" or "by"'
    if not _int(rec.get("sum_ns")) or histograms.counts_of(rec) is None:
        return "hist row with bad counts (le_* must be cumulative integers)"
    return None


def check_fold(rec: dict) -> str | None:
    """Why a fold row is unusable, or None."""
    if type(rec.get("comm")) is not str or not _int(rec.get("folded")):
        return 'fold row with a bad "comm" or "folded"'
    if rec.get("cgroup") is not None and not _int(rec["cgroup"]):
        return 'fold row with a bad "cgroup"'
    for k in counter_fields(rec):
        if not _int(rec[k]):
            return f'fold row with a bad "{k}"'
    return None


_CHECKS = {"task": check_task, "hist": check_hist, "fold": check_fold}


def _check_meta(meta: dict, name: str) -> None:
    if meta.get("source") != "snap":
        raise PstateError(f"{name} is not a pstate snapshot (source {meta.get('source')!r})", ExitCode.DATAERR,
                          hint="pass snapshot files or a directory written by `pstate snap`")
    for f in ("interval_start_ts", "interval_end_ts"):
        if not _int(meta.get(f)):
            raise PstateError(f"{name}: snapshot header without a valid {f}", ExitCode.DATAERR)


# --- CSV snapshots (snap --format csv) ----------------------------------------

_CSV_BOOL = {"true": True, "false": False}


def _csv_cell(name: str, text: str):
    """A CSV cell as the JSON-lines row would hold it: empty is null; the
    typed fields (TASK_RECORD) and any other <state>_ns are ints, exited a
    bool; comm and state stay strings even when they look like numbers."""
    if text == "":
        return None
    kind = TASK_RECORD[1].get(name, ("int" if name.endswith("_ns") else "string",))[0]
    if kind.startswith("int"):
        try:
            return int(text)
        except ValueError:
            return text  # check_task names the field
    if kind.startswith("bool"):
        return _CSV_BOOL.get(text, text)
    return text


def bounded_lines(fp, max_line: int = MAX_LINE, chunk: int = 1 << 16):
    """The lines of a binary stream (bytes, each with its newline), None for
    one longer than max_line, which is passed over as it comes: the memory
    taken is bounded by max_line, whatever the input, as the one reader's is."""
    pending, discarding = b"", False
    while True:
        data = fp.read(chunk)
        if not data:
            break
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                if not discarding:
                    pending += data[start:]
                    if len(pending) > max_line:
                        pending, discarding = b"", True
                break
            if discarding:
                discarding = False
                yield None
            else:
                line = pending + data[start:nl + 1]
                pending = b""
                yield None if len(line) - 1 > max_line else line
            start = nl + 1
    if discarding:
        yield None
    elif pending:
        yield pending


def csv_records(path: str, stats: ReadStats, *, strict: bool = False):
    """The records of a CSV snapshot, as read_records gives those of a
    JSON-lines one: the meta and end records from their '#' comment lines
    (first and last), then a "task" record per row under the header."""
    def bad(lineno: int, reason: str, detail: str) -> None:
        if strict:
            raise PstateError(f"{path}:{lineno}: {detail}", ExitCode.DATAERR)
        stats.skip(reason, f"{path}:{lineno}")

    with open_input(path) as fp:
        header = None
        for lineno, raw in enumerate(bounded_lines(fp), 1):
            stats.lines += 1
            if raw is None:  # as the one reader takes a line over its limit
                bad(lineno, overlong(MAX_LINE), f"a line longer than {MAX_LINE} bytes")
                continue
            line = raw.decode("utf-8", "replace")
            if line.startswith("#"):
                try:
                    rec = orjson.loads(line[1:])
                except orjson.JSONDecodeError:
                    rec = None
                if not isinstance(rec, dict) or rec.get("type") not in ("meta", "end"):
                    bad(lineno, "CSV comment that is not a meta or end record",
                        "a comment line that is not a meta or end record")
                    continue
                stats.records += 1
                stats.note(rec, path)
                yield rec
                continue
            if not line.strip():
                continue
            cells = next(csv.reader([line]), [])
            if header is None:
                header = cells
                continue
            if len(cells) != len(header):
                bad(lineno, "CSV row with a wrong number of fields",
                    f"{len(cells)} CSV fields, the header has {len(header)}")
                continue
            stats.records += 1
            row = {"type": "task"}
            row.update((k, _csv_cell(k, v)) for k, v in zip(header, cells))
            yield row


def read_snapshot(path: str, stats: ReadStats | None = None, problems: list | None = None, *,
                  strict: bool = False, keep_incomplete: bool = False) -> Snapshot | None:
    """One snapshot file (its meta, task rows and end), or None when it is
    unusable (why: appended to problems). The one snapshot reader: stats,
    heat and replay take snapshot files through it (or list_dir).

    Malformed rows are skipped and counted in stats (strict: the first one
    is an error); a snapshot without its end trailer, or with fewer rows
    than the trailer announces, is left out unless keep_incomplete (its end
    is then None when there was none).
    """
    stats = stats if stats is not None else ReadStats()
    problems = problems if problems is not None else []
    meta = None
    rows, hists, folds = [], [], []
    end = None
    bad = 0
    records = (csv_records(path, stats, strict=strict) if path.endswith(".csv")
               else read_records([path], stats, strict=strict))
    for rec in records:
        t = rec["type"]
        if t == "meta":
            if meta is not None:
                problems.append(f"{path}: a second meta record: not a single snapshot; not used")
                return None
            _check_meta(rec, path)
            meta = rec
        elif t in _CHECKS:
            why = _CHECKS[t](rec)
            if why:
                if strict:
                    raise PstateError(f"{path}: {why}", ExitCode.DATAERR)
                stats.skip(why, path)
                bad += t == "task"  # (the end record counts task rows)
                continue
            {"task": rows, "hist": hists, "fold": folds}[t].append(rec)
        elif t == "end":
            end = rec
    if meta is None:
        problems.append(f"{path}: no meta header; not used")
        return None
    announced = end.get("tasks") if end is not None else None
    if end is None or (type(announced) is int and len(rows) + bad < announced):
        if keep_incomplete:
            return Snapshot(path, meta, rows, None, hists, folds)
        problems.append(f"{path}: incomplete snapshot (no end record, or fewer rows than it announces); not used")
        return None
    return Snapshot(path, meta, rows, end, hists, folds)


def read_dir(path: str, stats: ReadStats | None = None, problems: list | None = None, *,
             strict: bool = False) -> list[Snapshot]:
    """The snapshots of a directory in list_dir's order, incomplete ones
    included (end None): heat draws what there is."""
    out = []
    for p in list_dir(path):
        s = read_snapshot(p, stats, problems, strict=strict, keep_incomplete=True)
        if s is not None:
            out.append(s)
    return out


def list_dir(path: str) -> list[str]:
    """Snapshot files of a directory (JSON lines or CSV), oldest first (by
    sequence). Dot-files, other names, symlinks and non-regular files are
    not snapshots."""
    found = []
    try:
        entries = list(os.scandir(path))
    except OSError as e:
        raise PstateError(f"cannot read directory {path}: {e.strerror}", ExitCode.NOINPUT) from None
    for e in entries:
        parsed = parse_name(e.name)
        if parsed and e.is_file(follow_symlinks=False):
            found.append((parsed[1], e.name))
    found.sort()
    return [os.path.join(path, n) for _seq, n in found]


def expand(paths: Iterable[str]) -> list[str]:
    """Files to read: directories expand to their snapshot files."""
    out = []
    for p in paths:
        if p != "-" and os.path.isdir(p):
            out.extend(list_dir(p))
        else:
            out.append(p)
    return out


def is_snapshot_source(path: str) -> bool:
    """True for a directory, or a file whose meta header says source "snap"
    (lets stats tell snapshots from recordings)."""
    if path == "-":
        return False
    try:
        st = os.stat(path)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        return True
    if parse_name(os.path.basename(path)):
        return True
    if not stat.S_ISREG(st.st_mode):
        return False
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 16)
    except OSError:
        return False
    return b'"source":"snap"' in first.replace(b" ", b"")


def load(paths: Iterable[str], stats: ReadStats | None = None, problems: list | None = None) -> list[Snapshot]:
    """Read snapshots and order them: boots by wall time, then by the
    monotonic end of each interval within a boot. Duplicates are dropped;
    unusable files are left out with a reason in problems."""
    stats = stats if stats is not None else ReadStats()
    snaps = {}
    for p in expand(paths):
        s = read_snapshot(p, stats, problems)
        if s is not None:
            snaps.setdefault((s.boot_id, s.run_id, s.end_ts), s)
    boot_first: dict[str, int] = {}
    for s in snaps.values():
        w = s.wall_end_ns
        boot_first[s.boot_id] = min(boot_first.get(s.boot_id, w), w)
    return sorted(snaps.values(), key=lambda s: (boot_first[s.boot_id], s.boot_id, s.end_ts, s.meta.get("seq", 0)))


# --- intervals ---------------------------------------------------------------


@dataclass
class TaskInterval:
    """One thread over one interval: counters spent in it, and its life."""

    key: tuple  # (boot_id, tid, start_ts): the thread
    proc: tuple  # (boot_id, pid, start_ts of the leader): the process
    pid: int
    tid: int
    comm: str
    start_ts: int
    state: str
    values: dict
    born: bool  # started inside the interval
    gone: bool  # exited inside the interval
    alive: bool  # not exited at the end of the interval
    title: str | None = None  # its process's (IDENTITY_FIELDS; None in older snapshots)
    cgroup_path: str | None = None
    ppid: int | None = None  # its process's parent, in rows that carry it
    folded: int = 0  # a fold row's threads folded in the interval (then pid and tid are 0)
    untraced: int = 0  # on-CPU ns not counted as such: running the whole interval with no switch (untraced)
    row: dict | None = field(default=None, repr=False)  # the snapshot's row


@dataclass
class Interval:
    snapshot: Snapshot
    start_ts: int
    end_ts: int
    tasks: list = field(default_factory=list)

    @property
    def boot_id(self) -> str:
        return self.snapshot.boot_id

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ts - self.start_ts)

    @property
    def wall_end_ns(self) -> int:
        return self.snapshot.wall_end_ns


class _Identities:
    """Canonical start times, so one thread keeps one key across runs."""

    def __init__(self):
        self.starts: dict[tuple, list] = {}  # (boot, tid) -> [(start_ts, run_id)]

    def canon(self, boot: str, tid: int, start: int, run: str) -> int:
        known = self.starts.setdefault((boot, tid), [])
        for s, r in known:
            if s == start:
                return s
        for s, r in known:
            if r != run and abs(s - start) <= START_SLACK_NS:
                return s
        known.append((start, run))
        return start


def intervals(snapshots: list[Snapshot]) -> list[Interval]:
    """Per-thread counters over each snapshot's interval.

    Snapshots of a cumulative run are subtracted from the previous one of
    the same run; the first of a run (or a --clear snapshot) already covers
    its own interval. Snapshots must come ordered, as load() returns them.
    """
    ids = _Identities()
    last_of_run: dict[tuple, tuple[int, dict]] = {}  # (boot, run) -> (end_ts, {(tid, start): row})
    proc_start: dict[tuple, int] = {}  # (boot, pid) -> leader start_ts last seen
    out = []
    for snap in snapshots:
        boot, run = snap.boot_id, snap.run_id
        prev = last_of_run.get((boot, run))
        if snap.mode == "cumulative" and prev is not None and prev[0] < snap.end_ts:
            start, prev_rows = prev[0], prev[1]
        else:
            start, prev_rows = snap.start_ts, None
        iv = Interval(snap, start, snap.end_ts)
        canon = {}
        for r in snap.rows:
            canon[id(r)] = ids.canon(boot, r["tid"], r["start_ts"], run)
        # A reused pid may have two leader rows (the freed one and the new
        # one): a thread belongs to the latest leader that started before it.
        leaders: dict[int, list] = {}
        first_thread: dict[int, int] = {}
        for r in snap.rows:
            if r["tid"] == r["pid"]:
                leaders.setdefault(r["pid"], []).append(canon[id(r)])
            first_thread[r["pid"]] = min(first_thread.get(r["pid"], canon[id(r)]), canon[id(r)])
        for r in snap.rows:
            pid, tid = r["pid"], r["tid"]
            st = canon[id(r)]
            if tid == pid:
                lead = st
            else:
                lead = max((s for s in leaders.get(pid, ()) if s <= st + START_SLACK_NS), default=None)
                if lead is None:
                    known = proc_start.get((boot, pid))
                    lead = known if known is not None and known <= st + START_SLACK_NS else first_thread[pid]
                proc_start[(boot, pid)] = lead
            values = subtract(r, prev_rows.get((tid, r["start_ts"])) if prev_rows is not None else None)
            exit_ts = r.get("exit_ts")
            exited = bool(r.get("exited"))
            iv.tasks.append(TaskInterval(
                key=(boot, tid, st), proc=(boot, pid, lead if pid else 0), pid=pid, tid=tid,
                comm=str(r.get("comm", "")), start_ts=st, state=str(r.get("state", "")), values=values,
                born=start < r["start_ts"] <= snap.end_ts,
                gone=exited and exit_ts is not None and start < exit_ts <= snap.end_ts,
                alive=not exited, title=r.get("title") if type(r.get("title")) is str else None,
                cgroup_path=r.get("cgroup_path") if type(r.get("cgroup_path")) is str else None,
                ppid=r.get("ppid") if type(r.get("ppid")) is int else None, row=r,
            ))
        _untraced(iv, snap.meta.get("ncpu"))
        iv.tasks += _fold_intervals(snap, prev_rows)
        if snap.mode == "cumulative":
            rows = {(r["tid"], r["start_ts"]): r for r in snap.rows}
            rows.update({_fold_key(f): f for f in snap.folds})
            last_of_run[(boot, run)] = (snap.end_ts, rows)
        out.append(iv)
    return out


def move_untraced(tasks, start_ts: int, duration_ns: int, ncpu) -> list[int]:
    """The rule for threads whose switch-outs the kernel never reports (some
    VM agents' threads): when the threads of an interval were on a CPU
    longer than its CPUs allow (ncpu x the interval: impossible), those on
    a CPU through the whole interval with no switch and no wake-up in it
    (running since before it began) are why, and their on-CPU time is not
    known: it moves from running_ns to unknown_ns (no share counts it).
    tasks: (state, state_since_ts, values over the interval) of each
    thread, values changed in place. Returns the indexes of those moved."""
    if type(ncpu) is not int or ncpu <= 0 or \
            sum(v.get("running_ns", 0) for _s, _since, v in tasks) <= ncpu * duration_ns:
        return []
    moved = []
    for i, (state, since, v) in enumerate(tasks):
        ns = v.get("running_ns", 0)
        if state != "running" or type(since) is not int or since > start_ts or not ns or \
                any(v.get(k, 0) for k in COUNT_FIELDS):
            continue
        v["running_ns"] = 0
        v["unknown_ns"] = v.get("unknown_ns", 0) + ns
        moved.append(i)
    return moved


def _untraced(iv, ncpu) -> None:
    """move_untraced over an interval's tasks; what moved is noted in
    TaskInterval.untraced."""
    before = [t.values.get("running_ns", 0) for t in iv.tasks]
    for i in move_untraced([(t.state, t.row.get("state_since_ts") if t.row is not None else None, t.values)
                            for t in iv.tasks], iv.start_ts, iv.duration_ns, ncpu):
        iv.tasks[i].untraced = before[i]


def _fold_key(rec: dict) -> tuple:
    return ("fold", rec.get("cgroup"), rec["comm"])  # (never a thread's (tid, start_ts))


def _fold_intervals(snap: Snapshot, prev_rows: dict | None) -> list[TaskInterval]:
    """A snapshot's fold rows as intervals of their groups: the threads folded
    in the interval, with their counters, in pid 0 (they have no process)."""
    out = []
    for f in snap.folds:
        prev = prev_rows.get(_fold_key(f)) if prev_rows is not None else None
        values = subtract(f, prev)
        path = f.get("cgroup_path") if type(f.get("cgroup_path")) is str else None
        out.append(TaskInterval(
            key=(snap.boot_id, *_fold_key(f)), proc=(snap.boot_id, 0, 0), pid=0, tid=0, comm=f["comm"], start_ts=0,
            state="reaped", values=values, born=False, gone=False, alive=False, cgroup_path=path,
            folded=max(0, f["folded"] - (prev.get("folded", 0) if prev is not None else 0))))
    return out

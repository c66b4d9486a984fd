"""pstate snap: point-in-time snapshots of per-thread scheduler state times."""

from __future__ import annotations

import ctypes
import errno
import grp
import itertools
import mmap
import os
import sys
import time

import click

from pstate.kernel import bpfsys, eventlayout, loader
from pstate.snapshots import histograms, snapdir
from pstate.kernel.bpfsys import BPF_NOEXIST
from pstate.stream.durations import Duration
from pstate.commands.options import RenamedCommand, probes_option
from pstate.kernel.eventcodec import tgid_from_proc
from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel.kstates import KernelStates
from pstate.stream.meta import meta_record
from pstate.snapshots.writer import Plan, Sample, SnapDir, Snapper, Stopper

EPILOG = """\b
Examples:
  sudo pstate snap --dir /var/lib/pstate          one 5 s snapshot (from cron)
  sudo pstate snap --dir /var/lib/pstate -k 1440  ... keeping the newest 1440
  sudo pstate snap --dir DIR --every 10s --max-age 24h    a daemon
  sudo pstate snap --dir DIR --every 1m --clear   each file covers its minute
  sudo pstate snap --dir /var/lib/node_exporter/textfile --every 15s \\
       --format prom --group prometheus           for Prometheus
  pstate stats DIR/                               trends, churn, leak suspects
  jq -c 'select(.type=="task" and .uninterruptible_ns > 0)' DIR/pstate-snap-*

\b
Files: pstate-snap-<UTC time>-<seq>.jsonl (or .csv) in DIR, mode 0600
(0640 with --group), published atomically: a meta header, one task row per
thread, an end trailer (man pstate-events). CSV has the same columns, with
the meta and end records as JSON in '#' comment lines. --format prom keeps
one file, pstate-snap.prom, replaced at each snapshot, for node_exporter's
textfile collector; series are per systemd unit by default (--prom-by).
Rows carry their process's title and cgroup (title, cgroup, cgroup_path),
read from /proc at each snapshot.

\b
--prom-by unit is the default because a Prometheus operator aggregates by
service, and series per pid grow with every process started (their
cardinality follows churn, not the services): per unit, cgroup or title
the number of series is bounded by the services running and they never
disappear; per comm too; per pid or thread they come and go with the
processes (--prom-by process is the old name of pid).
DIR/.pstate-last.json tells the outcome of the latest snapshot.

\b
Values are cumulative since the run began (the state a thread was in when
the run began counts from then on); --clear makes each file a delta over its
own interval. Threads that exited stay in the next snapshot, then go.
A missing DIR is created (mode 0700) when its parent exists. DIR must not be
a symlink, nor group- or world-writable (exit 77). One snap per DIR: another
one exits 75. A full disk exits 73 and leaves earlier snapshots intact.
SIGINT/SIGTERM remove the snapshot in progress and exit 130/143, unless the
interval's snapshot was already out (exit 0).
"""

# state slots and row flags of bpf/snap.bpf.c (bpf/pstate.h)
_D = eventlayout.DEFINES
SLOT_RUNNING, SLOT_KERNEL, SLOT_REAPED = _D["SLOT_RUNNING"], _D["SLOT_KERNEL"], _D["SLOT_REAPED"]
SYNTHETIC_SLOTS = ("unknown", "running", "runnable", "preempted", "new")
assert [_D[f"SLOT_{n.upper()}"] for n in SYNTHETIC_SLOTS] == list(range(len(SYNTHETIC_SLOTS)))
F_EXITED, F_FREED, F_GUESSED = _D["SNAP_F_EXITED"], _D["SNAP_F_FREED"], _D["SNAP_F_GUESSED"]
F_SEEDED = _D["SNAP_F_SEEDED"]
ENOTSUPP = 524  # the kernel's own errno for an operation a map lacks


def defines_for(ks: KernelStates, max_tasks: int) -> dict:
    d = {
        "REPORT_MASK": f"0x{ks.report_mask:x}",
        "NR_KBITS": max(1, ks.report_mask.bit_length()),
        "MAX_TASKS": max_tasks,
    }
    limit = loader.pid_max()
    if limit <= max_tasks and _kernel_at_least(5, 5):
        # every tid fits: an array indexed by tid, whose lookup costs no call
        # (5.5 made arrays mappable, which is how user space reads it)
        d["TASKS_BY_TID"] = True
        d["TID_SLOTS"] = limit
    return d


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        have = tuple(int(x) for x in os.uname().release.split("-", 1)[0].split(".")[:2])
    except ValueError:
        return False
    return have >= (major, minor)


def slot_names(ks: KernelStates) -> list[str]:
    """State name of each counter slot."""
    kernel = [ks.names.get(1 << i, f"state_0x{1 << i:x}") for i in range(max(1, ks.report_mask.bit_length()))]
    return list(SYNTHETIC_SLOTS) + kernel


def boottime_offset_ns() -> int:
    """CLOCK_BOOTTIME - CLOCK_MONOTONIC: the time the machine spent suspended."""
    best = None
    for _ in range(3):
        m0 = time.monotonic_ns()
        b = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        m1 = time.monotonic_ns()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, b - (m0 + m1) // 2)
    return best[1]


def _tid(key) -> int:
    # batch reads give a u32 key as an int, iteration as a ctypes value
    return key if isinstance(key, int) else key.value


def _decode_comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


class TidArray:
    """The tid-indexed `tasks` array, read through a shared mapping
    (BPF_F_MMAPABLE): a snapshot scans the `since` word of every slot and
    copies out only the rows that hold a thread."""

    def __init__(self, table):
        self.Leaf = table.Leaf
        self.size = ctypes.sizeof(self.Leaf)  # a multiple of 8: the kernel's row stride
        self.n = bpfsys.map_info(table.map_fd)["max_entries"]
        page = mmap.PAGESIZE
        self.mm = mmap.mmap(table.map_fd, (self.n * self.size + page - 1) // page * page, mmap.MAP_SHARED,
                            mmap.PROT_READ)
        self.words = memoryview(self.mm).cast("Q")
        step = self.size // 8
        self.since = self.words[self.Leaf.since.offset // 8:self.n * step:step]

    def rows(self) -> dict:
        """{tid: copy of its row} of every slot whose `since` is set."""
        seen = itertools.compress(range(self.n), self.since.tolist())
        return {tid: self.Leaf.from_buffer_copy(self.mm, tid * self.size) for tid in seen}

    def close(self) -> None:
        self.since.release()
        self.words.release()
        self.mm.close()


def read_hash(table, delete: bool = False, chunk: int = 1024) -> list:
    """(key, row) of every entry of a hash map (deleting them if `delete`),
    read in batches of `chunk`: a table's own batch read allocates buffers
    for the whole map at every call, megabytes for a mostly empty one."""
    lib = loader.map_calls()
    call = lib.bpf_lookup_and_delete_batch if delete else lib.bpf_lookup_batch
    Key, Leaf = table.Key, table.Leaf
    ksz, vsz = ctypes.sizeof(Key), ctypes.sizeof(Leaf)
    keys, values = (Key * chunk)(), (Leaf * chunk)()
    token, cnt, out = ctypes.c_uint64(0), ctypes.c_uint32(0), []
    first = True
    while True:
        cnt.value = chunk
        res = call(table.map_fd, None if first else ctypes.byref(token), ctypes.byref(token),
                   ctypes.byref(keys), ctypes.byref(values), ctypes.byref(cnt))
        err = ctypes.get_errno()
        if res != 0 and err != errno.ENOENT:
            if first and err in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP):
                return _read_slowly(table, delete)  # no batch operations (kernels before 5.6)
            raise OSError(err, f"BPF_MAP_LOOKUP{'_AND_DELETE' if delete else ''}_BATCH: {os.strerror(err)}")
        first = False
        out += [(Key.from_buffer_copy(keys, i * ksz), Leaf.from_buffer_copy(values, i * vsz))
                for i in range(cnt.value)]
        if res != 0 or cnt.value == 0:
            return out


def _read_slowly(table, delete: bool) -> list:
    items = list(table.items())
    if delete:
        for k, _v in items:
            try:
                del table[k]
            except KeyError:
                pass
    return items


class BpfCollector:
    """Reads bpf/snap.bpf.c's maps into snapshot rows.

    The live rows are in `tasks`: a hash keyed by tid, or (TASKS_BY_TID) an
    array indexed by tid plus the `seeds` hash of seed rows no event has
    taken yet. Both give the same rows.
    """

    def __init__(self, prog: loader.Program, ks: KernelStates, loaded_ts: int):
        self.prog = prog
        self.loaded_ts = loaded_ts  # monotonic ns before the program was loaded
        self.tasks = prog.table("tasks")
        self.gone = prog.table("gone")
        # told by the map itself, so any build of the program reads right
        self.by_tid = bpfsys.map_info(self.tasks.map_fd)["type"] == bpfsys.MAP_ARRAY
        self.seeds = prog.table("seeds") if self.by_tid else None
        self.array = TidArray(self.tasks) if self.by_tid else None
        self.slots = slot_names(ks)
        self.fields = [f"{s}_ns" for s in snapdir.STATE_FIELDS]
        self.fields += [f"{s}_ns" for s in self.slots if f"{s}_ns" not in self.fields]
        self.letter_slot = {"R": SLOT_RUNNING}
        for bit, letter in ks.letters.items():
            if bit & ks.report_mask and bit & (bit - 1) == 0:
                self.letter_slot.setdefault(letter, SLOT_KERNEL + bit.bit_length() - 1)
        self.seed_failed = 0
        self.seeds_pending = True
        self.run_start = self.seed_ts = 0
        self.seeded: dict[int, int] = {}  # tid -> start_ts of the rows seeding created
        self.start_fix: dict[int, int] = {}  # tid -> /proc start of a thread seen before it was seeded
        self.tgids: dict[tuple, int] = {}

    def start(self) -> int:
        """Seed every live thread in the state /proc shows. Counting began
        when the first tracepoint fired: threads it saw before they were
        seeded have their counts from then on; for the others the time
        between that and their seeding is "unknown". So per thread, the
        state times always add up to the interval."""
        self.seed_ts = time.monotonic_ns()
        self.seed(self.seed_ts)
        first = self.seed_ts
        rows = self._live(settle=True)
        rows += [(k.tid, v) for k, v in read_hash(self.gone)]
        for tid, v in rows:
            if self.seeded.get(tid) != v.start_ts and v.start_ts >= self.loaded_ts:
                first = min(first, v.start_ts)
        self.run_start = first
        return first

    def seed(self, since: int) -> None:
        lib = loader.map_calls()
        hz = os.sysconf("SC_CLK_TCK")
        offset = boottime_offset_ns()
        # the hash takes seed rows where no row exists; with the array they
        # wait in `seeds` for the thread's first event (bpf/snap.bpf.c)
        table = self.seeds if self.by_tid else self.tasks
        fd = table.map_fd
        Key, Leaf = table.Key, table.Leaf
        for tgid, tid, letter, comm, ticks in loader.seed_tasks():
            start = ticks * 1_000_000_000 // hz - offset
            leaf = Leaf()
            leaf.start_ts = max(start, 0)
            leaf.since = since
            leaf.tgid = tgid
            leaf.state = self.letter_slot.get(letter, 0)
            # a zombie's row is final once the kernel frees it, as when its
            # exit was seen
            leaf.flags = (F_EXITED if letter in "ZX" else 0) | F_SEEDED
            leaf.comm = comm
            key = Key(tid)
            if lib.bpf_update_elem(fd, ctypes.byref(key), ctypes.byref(leaf), BPF_NOEXIST) == 0:
                # It may have died between the read and the insert, and then
                # nothing would ever remove its row. A seed the program took
                # meanwhile (the delete fails) is the thread's row now.
                if os.path.exists(f"/proc/{tgid}/task/{tid}") or (
                        self.by_tid and lib.bpf_delete_elem(fd, ctypes.byref(key)) != 0):
                    self.seeded[tid] = leaf.start_ts
                elif not self.by_tid:
                    lib.bpf_delete_elem(fd, ctypes.byref(key))
                continue
            err = ctypes.get_errno()
            if err == errno.EEXIST:
                if not self.by_tid:
                    self.start_fix[tid] = leaf.start_ts  # already seen by an event: keep its counters
            else:
                self.seed_failed += 1

    def _live(self, settle: bool = False) -> list[tuple[int, object]]:
        """(tid, row) of every live thread."""
        if not self.by_tid:
            return [(_tid(k), v) for k, v in read_hash(self.tasks)]
        # Seeds first: one taken between the two reads is then in both, and
        # the array's copy (the later) wins.
        seeds = [(_tid(k), v) for k, v in read_hash(self.seeds)] if self.seeds_pending else []
        rows = self.array.rows()
        pending = self._pending_seeds(seeds, rows, settle)
        # none left: user space writes none after the start, so none will come
        self.seeds_pending = bool(pending)
        return pending + list(rows.items())

    def _pending_seeds(self, seeds: list, rows: dict, settle: bool) -> list:
        """The seed rows no event has taken yet (threads idle all along).

        A seed whose tid has an array row, or (checked once, when `settle`,
        right after seeding) whose thread is gone, will never be taken: the
        program saw the thread before its seed was written (as an insert into
        the hash would have found), or it died first. Withdraw it, unless the
        program takes it first. Later a seed leaves only when taken: a thread
        cannot exit, be freed or lend its tid to another without an event."""
        lib = loader.map_calls()
        out = []
        for tid, v in seeds:
            row = rows.get(tid)
            if row is None and (not settle or os.path.exists(f"/proc/{v.tgid}/task/{tid}")):
                out.append((tid, v))
                continue
            if lib.bpf_delete_elem(self.seeds.map_fd, ctypes.byref(self.seeds.Key(tid))) != 0:
                continue  # taken meanwhile: the array or `gone` has its row
            if self.seeded.get(tid) == v.start_ts:
                del self.seeded[tid]
            if row is not None:
                self.start_fix[tid] = v.start_ts  # seen by an event before it was seeded
        return out

    def close(self) -> None:
        if self.array is not None:
            self.array.close()
            self.array = None

    def collect(self) -> Sample:
        # The snapshot's time is taken before the maps are read. An open
        # interval is closed at `now`; the kernel adds at least as much to
        # the same state later (its next event comes after the read), so
        # counters never shrink from one snapshot to the next. Events
        # between `now` and the read are already in the counters: rows are
        # exact to within read_ns.
        now = time.monotonic_ns()
        try:
            live = self._live()
            freed = read_hash(self.gone, delete=True)
        except Exception as e:  # bcc raises plain Exception
            raise PstateError(f"reading the BPF maps failed: {e}", ExitCode.OSERR) from None
        read_ns = time.monotonic_ns() - now
        # A thread freed between the two reads is in both: its final row wins.
        latest = {(tid, v.start_ts): (tid, v) for tid, v in live}
        for k, v in freed:
            latest[(k.tid, v.start_ts)] = (k.tid, v)
        rows = [self._row(tid, v, now) for tid, v in latest.values()]
        for k, v in freed:
            self.start_fix.pop(k.tid, None)
            if self.seeded.get(k.tid) == v.start_ts:
                del self.seeded[k.tid]
        rows.sort(key=lambda r: (r["pid"], r["tid"], r["start_ts"]))
        return Sample(ts=now, rows=rows, map_full=sum(self.prog.counters()) + self.seed_failed, read_ns=read_ns)

    def _row(self, tid: int, v, now: int) -> dict:
        ns = list(v.ns)
        slot = v.state
        freed = bool(v.flags & F_FREED)
        if not freed and v.since and now > v.since and slot < len(ns):
            ns[slot] += now - v.since  # close the open interval: exact at `now`
        start = v.start_ts
        if v.flags & F_GUESSED and tid in self.start_fix:
            # seen by an event before seeding reached it: unknown before that
            ns[0] += max(0, start - self.run_start)
            start = self.start_fix[tid]
        elif self.seeded.get(tid) == start:
            ns[0] += self.seed_ts - self.run_start
        tgid = v.tgid or self._tgid(tid, start)
        counts = dict.fromkeys(self.fields, 0)
        for i, n in enumerate(ns):
            counts[f"{self.slots[i]}_ns"] += n
        return {
            "pid": tgid, "tid": tid, "comm": _decode_comm(v.comm), "start_ts": start,
            "state": "reaped" if freed else (self.slots[slot] if slot < len(self.slots) else "unknown"),
            "state_since_ts": v.since or None,
            "exited": bool(v.flags & F_EXITED), "exit_ts": v.exit_ts or None,
            **counts,
            "nvcsw": v.nvcsw, "nivcsw": v.nivcsw, "wakeups": v.wakeups,
            # (a program built from an older bpf/ has none: told by the row itself)
            "hist": histograms.from_row(v.hist) if hasattr(v, "hist") else None,
        }

    def _tgid(self, tid: int, start: int) -> int:
        """Process of a thread first seen being switched in: from /proc."""
        key = (tid, start)
        if key not in self.tgids:
            if len(self.tgids) > 65536:
                self.tgids.clear()
            self.tgids[key] = tgid_from_proc(tid)
        return self.tgids[key]


def make_collector(prog: loader.Program, ks: KernelStates, loaded_ts: int) -> BpfCollector:
    return BpfCollector(prog, ks, loaded_ts)


def load_program(ks: KernelStates, max_tasks: int, kernel_headers: str | None,
                 probes: str | None = None) -> loader.Program:
    return loader.Program("snap", defines_for(ks, max_tasks), kernel_headers, probes)


def _gid(group: str | None) -> int | None:
    if group is None:
        return None
    try:
        return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise click.BadParameter(f"no such group: {group}", param_hint="--group") from None


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]},
               cls=RenamedCommand, renamed={"-o": "--dir", "--out": "--dir", "-e": "--every"})
@click.option("--dir", "out_dir", type=click.Path(), metavar="DIR",
              help="Directory for the snapshot files (created 0700 if missing and its parent exists). Required.")
@click.option("-i", "--interval", type=Duration("s"), default=None, metavar="DURATION",
              help="Time each snapshot covers, e.g. 500ms, 5s, 1m.  [default: 5s]")
@click.option("-n", "--count", type=click.IntRange(min=0), default=None, metavar="N",
              help="Take N snapshots, one per interval (0: until stopped).  [default: 1]")
@click.option("--every", type=Duration("s"), default=None, metavar="DURATION",
              help="Keep running, one snapshot per DURATION, until stopped: --interval DURATION --count 0.")
@click.option("--clear", is_flag=True,
              help="Each snapshot holds the deltas over its own interval, not totals since the start.")
@click.option("-f", "--format", "fmt", type=click.Choice(["jsonl", "csv", "prom"]), default="jsonl",
              show_default=True, help="File format: JSON lines, CSV, or Prometheus text for node_exporter.")
@click.option("--prom-by", type=click.Choice(["unit", "cgroup", "title", "comm", "pid", "thread", "process"]),
              default="unit", show_default=True,
              help="Groups of the --format prom series and of the latency hist rows: one per systemd unit, "
                   "cgroup, process title, command name, process (pid) or thread.")
@click.option("-k", "--keep", type=click.IntRange(min=1), default=None, metavar="N",
              help="Delete pstate's own oldest snapshot files beyond the newest N.")
@click.option("--max-age", type=Duration("s"), default=None, metavar="DURATION",
              help="Delete pstate's own snapshot files older than this, e.g. 36h (age from the time in the name).")
@click.option("--max-tasks", type=click.IntRange(64, 4_194_304), default=65536, show_default=True,
              help="Threads the kernel side can track; beyond that the snapshot says truncated.")
@click.option("--group", metavar="GROUP",
              help="Make files group-readable (0640) by this group, e.g. for node_exporter.")
@click.option("--kernel-headers", type=click.Path(file_okay=False), envvar="PSTATE_KERNEL_HEADERS",
              metavar="DIR", help="Kernel header tree for BCC [env: PSTATE_KERNEL_HEADERS].")
@click.option("-v", "--verbose", is_flag=True, help="Say on stderr when collecting starts and each file written.")
@click.option("-q", "--quiet", is_flag=True, help="No notes on stderr (errors are still reported).")
@probes_option
@click.option("--ebpf", is_flag=True, hidden=True, help="Print the BPF program and exit.")
def cli(out_dir, interval, count, every, clear, fmt, prom_by, keep, max_age, max_tasks, group, kernel_headers,
        verbose, quiet, probes, ebpf):
    """Write point-in-time snapshots of every thread's time per scheduler state.

    A BPF program counts, per thread, the time spent running, runnable,
    preempted, sleeping (S), uninterruptible (D), stopped and so on, with
    context switches and wake-ups. Every live thread is seeded from /proc
    at the start. By default snap collects for one interval, writes one
    snapshot and exits: run it from cron, and analyse the directory later
    with `pstate stats DIR/` (trends, churn, leak suspects).
    """
    if out_dir is None and not ebpf:
        raise click.UsageError("Missing option '--dir' (the directory for the snapshot files).")
    if quiet and verbose:
        raise click.UsageError("--quiet and --verbose contradict each other: give one")
    if every is not None and interval is not None and every != interval:
        raise click.UsageError("--every is the interval of a running snap: give --every or --interval, not both")
    if every is not None:
        interval = every
        count = 0 if count is None else count
    interval = interval if interval is not None else 5_000_000_000
    count = 1 if count is None else count
    if interval < 10_000_000:
        raise click.BadParameter("must be at least 10ms", param_hint="--interval/--every")
    if fmt == "prom" and clear:
        raise click.UsageError("--format prom writes counters, which are cumulative: drop --clear")
    if fmt == "prom" and (keep is not None or max_age is not None):
        raise click.UsageError("--format prom keeps one file (pstate-snap.prom): --keep and --max-age do not apply")
    gid = _gid(group)
    ks = loader.kernel_states(ebpf)
    if ebpf:
        click.echo(loader.program_text("snap", defines_for(ks, max_tasks), probes))
        return

    def log(msg: str) -> None:
        if verbose:
            print(f"pstate snap: {msg}", file=sys.stderr, flush=True)

    loader.check_privileges()  # before anything is created in DIR
    stopper = Stopper().install()
    out = prog = collector = None
    try:
        out = SnapDir(out_dir, gid=gid)
        out.lock()
        stale = out.clean_temps()
        if stale and not quiet:
            print(f"pstate snap: removed {stale} temp file{'s' if stale != 1 else ''} an interrupted run left "
                  f"in {out_dir}", file=sys.stderr)
        if stopper.stopped:
            sys.exit(stopper.exit_code())
        loaded_ts = time.monotonic_ns()
        prog = load_program(ks, max_tasks, kernel_headers, probes=probes)
        meta = meta_record("snap", ks)
        meta.update({"max_tasks": max_tasks, "interval_ns": interval, "format": fmt, "probes": prog.plan.path,
                     "probes_reason": prog.plan.reason})
        plan = Plan(fmt=fmt, interval_ns=interval, count=count, clear=clear, keep=keep, max_age_ns=max_age,
                    prom_by=prom_by)
        collector = make_collector(prog, ks, loaded_ts)
        snapper = Snapper(out, collector, plan, meta, stopper, log)
        log(f"collecting into {out_dir}, {'until stopped' if count == 0 else f'{count} snapshot(s)'}, "
            f"every {interval / 1e9:g}s")
        code = snapper.run()
        if code:
            _status_failed(out, f"interrupted by signal {stopper.signum} before the snapshot was written")
    except PstateError as e:
        if out is not None and out.lock_fd is not None:
            _status_failed(out, e.message)
        raise
    finally:
        if collector is not None and hasattr(collector, "close"):
            collector.close()
        if prog is not None:
            prog.close()
        if out is not None:
            out.close()
        stopper.restore()
    if code:
        sys.exit(code)


def _status_failed(out: SnapDir, message: str) -> None:
    try:
        out.write_status({"ok": False, "ts": time.monotonic_ns(), "wall_ns": time.time_ns(), "file": None,
                          "pid": os.getpid(), "error": message.split("\n", 1)[0]})
    except PstateError:
        print(f"pstate snap: could not record the failure in {out.where(snapdir.STATUS_NAME)} either",
              file=sys.stderr)

"""snap's BPF program (bpf/snap.bpf.c) and its maps read into snapshot rows:
the settings the program is built with and the one place it is loaded,
seeding every live thread from /proc, and the reading of the live and freed
threads' rows (MapReader), whether the maps belong to a program loaded by
this run or to a collector pinned in bpffs (collector.PinnedReader)."""

from __future__ import annotations

import ctypes
import errno
import itertools
import mmap
import os
import time

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import bpfmaps, bpfsys, eventlayout, loader, taskrows
from pstate.kernel.eventcodec import tgid_from_proc
from pstate.kernel.kstates import KernelStates
from pstate.snapshots import histograms, snapdir
from pstate.stream import names
from pstate.snapshots.writer import Sample

# state slots and row flags of bpf/snap.bpf.c (bpf/pstate.h)
_D = eventlayout.DEFINES
SLOT_RUNNING, SLOT_KERNEL, SLOT_REAPED = _D["SLOT_RUNNING"], _D["SLOT_KERNEL"], _D["SLOT_REAPED"]
SYNTHETIC_SLOTS = ("unknown", "running", "runnable", "preempted", "new")
assert [_D[f"SLOT_{n.upper()}"] for n in SYNTHETIC_SLOTS] == list(range(len(SYNTHETIC_SLOTS)))
F_EXITED, F_FREED, F_GUESSED = _D["SNAP_F_EXITED"], _D["SNAP_F_FREED"], _D["SNAP_F_GUESSED"]
F_SEEDED = _D["SNAP_F_SEEDED"]
# the counters array (bpf/pstate.h SNAP_CNT_*), in index order
COUNTERS = ("tasks_full", "gone_full", "folded", "fold_lost")
assert [_D[f"SNAP_CNT_{n.upper()}"] for n in COUNTERS] == list(range(_D["SNAP_NR_COUNTERS"]))
MAX_FOLDS = 4096  # groups of folded final rows at most (fewer for a small --max-tasks)


def defines_for(ks: KernelStates, max_tasks: int) -> dict:
    """snap's -D settings."""
    d = {
        "REPORT_MASK": f"0x{ks.report_mask:x}",
        "NR_KBITS": max(1, ks.report_mask.bit_length()),
        "MAX_TASKS": max_tasks,
        "MAX_FOLDS": max_folds(max_tasks),
    }
    if taskrows.tasks_by_tid(max_tasks, mapped=True):  # (MapReader reads the array through a mapping)
        d["TASKS_BY_TID"] = True
        d["TID_SLOTS"] = loader.pid_max()
    return d


def load_program(ks: KernelStates, max_tasks: int, kernel_headers: str | None,
                 probes: str | None = None) -> loader.Program:
    """snap's program, loaded and attached: the one place it is built (a
    run's own, and the collector's, snapshots.collector)."""
    return loader.Program("snap", defines_for(ks, max_tasks), kernel_headers, probes)


def max_folds(max_tasks: int) -> int:
    """Size of the map of folded groups (one per cgroup and process name)."""
    return max(64, min(MAX_FOLDS, max_tasks // 4))


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
    return names.comm(raw)


def _steal(v) -> int:
    """A row's (or a group row's) steal_irq: 0 from a program built from an
    older bpf/, which has none."""
    return getattr(v, "steal_irq", 0)


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
        """{tid: copy of its row} of every slot whose `since` is set.

        The program writes a slot while it is copied: a switch moves time to
        another state, a freed thread's slot is emptied (and its tid may go to
        a new thread). A copy taken across such a write mixes the two rows,
        and a slot emptied after the scan was copied as zeros (a row of state
        unknown and start 0 beside the thread's final one). So a row is
        copied until two copies in a row agree (bpfmaps.settle), and a slot
        emptied meanwhile is left out: its row is in `gone`, read after this
        (freed), or under the tid its thread took (exec)."""
        out = {}
        size, mm = self.size, self.mm
        for tid in itertools.compress(range(self.n), self.since.tolist()):
            off = tid * size
            leaf = self.Leaf.from_buffer_copy(bpfmaps.settle(lambda: mm[off:off + size]))
            if leaf.since:
                out[tid] = leaf
        return out

    def close(self) -> None:
        self.since.release()
        self.words.release()
        self.mm.close()


def _folds_table(prog):
    """`folds` as a Table, or None for a program built from an older bpf/."""
    try:
        return bpfmaps.Table.over(prog.table("folds"))
    except KeyError:  # (BCC and the pinned set both raise it for a missing map)
        return None


def read_hash(table, delete: bool = False) -> list:
    """(key, row) of every entry of a hash map (deleting them if `delete`):
    the one map-reading path, bpfmaps.Table's."""
    return bpfmaps.Table.over(table).read_all(delete)


class MapReader:
    """Reads the maps of bpf/snap.bpf.c loaded by this run into snapshot
    rows (a collector's pinned maps: collector.PinnedReader).

    The live rows are in `tasks`: a hash keyed by tid, or (TASKS_BY_TID) an
    array indexed by tid plus the `seeds` hash of seed rows no event has
    taken yet. Both give the same rows.
    """

    def __init__(self, prog: loader.Program, ks: KernelStates, loaded_ts: int):
        self.prog = prog
        self.loaded_ts = loaded_ts  # monotonic ns before the program was loaded
        self.tasks = bpfmaps.Table.over(prog.table("tasks"))
        self.gone = bpfmaps.Table.over(prog.table("gone"))
        # told by the map itself, so any build of the program reads right
        self.by_tid = bpfsys.map_info(self.tasks.map_fd)["type"] == bpfsys.MAP_ARRAY
        self.seeds = bpfmaps.Table.over(prog.table("seeds")) if self.by_tid else None
        self.folds = _folds_table(prog)
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
        # (process, start_ts) of the rows seeding created: by birth, not tid, since a thread that execs
        # takes its leader's tid with its row (and threads alive at the start are all it ever holds)
        self.seeded: set[tuple[int, int]] = set()
        # the first-seen start_ts of a thread seen by an event before it was seeded -> its /proc start
        # (by that start, not tid: a thread that execs takes its leader's tid with its row)
        self.start_fix: dict[int, int] = {}
        # (tid, start_ts as the kernel has it) of a row shown 1 ns later than its start: a thread that
        # exec'd and took its leader's pid, whose start as shown was the old leader's (snapdir.execs_moved)
        self.later: set[tuple[int, int]] = set()
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
            if (v.tgid, v.start_ts) not in self.seeded and v.start_ts >= self.loaded_ts:
                first = min(first, v.start_ts)
        self.run_start = first
        return first

    def seed(self, since: int) -> None:
        hz = os.sysconf("SC_CLK_TCK")
        offset = boottime_offset_ns()
        # the hash takes seed rows where no row exists; with the array they
        # wait in `seeds` for the thread's first event (bpf/taskrow.h)
        table = self.seeds if self.by_tid else self.tasks
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
            err = table.insert(key, leaf)
            if err == 0:
                # It may have died between the read and the insert, and then
                # nothing would ever remove its row. A seed the program took
                # meanwhile (the delete fails) is the thread's row now.
                if os.path.exists(f"/proc/{tgid}/task/{tid}") or (self.by_tid and not table.remove(key)):
                    self.seeded.add((tgid, leaf.start_ts))
                elif not self.by_tid:
                    table.remove(key)
                continue
            if err == errno.EEXIST:
                if not self.by_tid:  # already seen by an event: keep its counters
                    try:
                        self.start_fix[table[key].start_ts] = leaf.start_ts
                    except KeyError:
                        pass  # (freed meanwhile)
            else:
                self.seed_failed += 1

    def _live(self, settle: bool = False) -> list[tuple[int, object]]:
        """(tid, row) of every live thread."""
        if not self.by_tid:
            # rows the programs write in place: a copy is taken whole (a torn
            # one counts a state's time twice, and shrinks at the next read)
            return [(_tid(k), v) for k, v in self.tasks.read_settled()]
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
        out = []
        for tid, v in seeds:
            row = rows.get(tid)
            if row is None and (not settle or os.path.exists(f"/proc/{v.tgid}/task/{tid}")):
                out.append((tid, v))
                continue
            if not self.seeds.remove(self.seeds.Key(tid)):
                continue  # taken meanwhile: the array or `gone` has its row
            if row is not None:
                self.start_fix[row.start_ts] = v.start_ts  # seen by an event before it was seeded
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
            # `folds` first: a thread folded after it was read is not in the groups, and (the kernel folds
            # its final row before it empties its slot) not shown alive after it either, so never twice
            # (snapshots/folds.py: what it owes waits for its group's next growth)
            folds = [self._fold(k, v) for k, v in read_hash(self.folds)] if self.folds is not None else []
            live = self._live()
            freed = self._read_gone(now)
        except Exception as e:  # bcc raises plain Exception
            raise PstateError(f"reading the BPF maps failed: {e}", ExitCode.OSERR) from None
        read_ns = time.monotonic_ns() - now
        # A thread freed between the two reads is in both: its final row wins.
        latest = {(tid, v.start_ts): (tid, v) for tid, v in live}
        for k, v in freed:
            latest[(k.tid, v.start_ts)] = (k.tid, v)
        rows = [self._row(tid, v, now) for tid, v in latest.values()]
        self._apart(rows, list(latest.values()), now)
        for k, v in freed:
            self.start_fix.pop(v.start_ts, None)
            self.later.discard((k.tid, v.start_ts))
        rows.sort(key=lambda r: (r["pid"], r["tid"], r["start_ts"]))
        counts = self.counts()
        return Sample(ts=now, rows=rows, map_full=counts["tasks_full"] + counts["fold_lost"] + self.seed_failed,
                      read_ns=read_ns, folds=folds, counts=counts)

    def counts(self) -> dict:
        """The program's counters by name (COUNTERS), and `skipped`: runs of
        its programs the kernel skipped (loader.Program.skipped). Rows lost: a
        program built from an older bpf/ (no folds) loses every row `gone` had
        no room for."""
        counts = dict.fromkeys(COUNTERS, 0)
        counts.update(zip(COUNTERS, self.prog.counters()))
        counts["skipped"] = self.prog.skipped()
        if self.folds is None:
            counts["fold_lost"] = counts["gone_full"]
        return counts

    def _counts(self, v) -> dict:
        """A row's time per state (<state>_ns) from its per-slot counters."""
        counts = dict.fromkeys(self.fields, 0)
        for i, n in enumerate(v):
            counts[f"{self.slots[i]}_ns"] += n
        return counts

    def _fold(self, k, v) -> dict:
        """A group row of `folds`: final rows added up, since the program was loaded."""
        return {"cgroup": k.cgroup or None, "comm": _decode_comm(k.comm), "folded": v.tasks,
                **self._counts(v.ns), snapdir.STEAL_FIELD: _steal(v), "nvcsw": v.nvcsw, "nivcsw": v.nivcsw,
                "wakeups": v.wakeups, "hist": histograms.from_row(v.hist)}

    def _row(self, tid: int, v, now: int) -> dict:
        ns = list(v.ns)
        slot = v.state
        freed = bool(v.flags & F_FREED)
        if not freed and v.since and now > v.since and slot < len(ns):
            ns[slot] += now - v.since  # close the open interval: exact at `now`
        start = v.start_ts
        if v.flags & F_GUESSED and start in self.start_fix:
            # seen by an event before seeding reached it: unknown before that
            ns[0] += max(0, start - self.run_start)
            start = self.start_fix[start]
        elif self._was_seeded(tid, v):
            ns[0] += self.seed_ts - self.run_start
        if (tid, v.start_ts) in self.later:
            start += 1
        tgid = v.tgid or self._tgid(tid, start)
        counts = self._counts(ns)
        return {
            "pid": tgid, "tid": tid, "comm": _decode_comm(v.comm), "start_ts": start,
            "state": "reaped" if freed else (self.slots[slot] if slot < len(self.slots) else "unknown"),
            "state_since_ts": v.since or None,
            "exited": bool(v.flags & F_EXITED), "exit_ts": v.exit_ts or None,
            **counts,
            snapdir.STEAL_FIELD: _steal(v),
            "nvcsw": v.nvcsw, "nivcsw": v.nivcsw, "wakeups": v.wakeups,
            # (a program built from an older bpf/ has none: told by the row itself)
            "hist": histograms.from_row(v.hist) if hasattr(v, "hist") else None,
            # the kernel's cgroup id (Snapper: a freed row's, where /proc has none)
            "kernel_cgroup": getattr(v, "cgroup", 0) or None,
        }

    def _apart(self, rows: list, raw: list, now: int) -> None:
        """Two rows shown as one thread (tid, start_ts): a thread that
        exec'd and took its leader's pid, its start as shown from /proc the
        leader's tick. The live one is shown 1 ns later from now on (the
        kernel does the same where the two rows' own starts are equal)."""
        same: dict[tuple, list] = {}
        for i, r in enumerate(rows):
            same.setdefault((r["tid"], r["start_ts"]), []).append(i)
        for idx in same.values():
            live = [i for i in idx if rows[i]["state"] != "reaped"] if len(idx) > 1 else []
            for i in live[:1]:
                tid, v = raw[i]
                if (tid, v.start_ts) not in self.later:
                    self.later.add((tid, v.start_ts))
                    rows[i] = self._row(tid, v, now)

    def _read_gone(self, now: int) -> list:
        """The final rows of freed threads, taken out of `gone`."""
        return read_hash(self.gone, delete=True)

    def _was_seeded(self, tid: int, v) -> bool:
        # (1 ns later: a thread that exec'd, born in its leader's tick; bpf/snap.bpf.c)
        return (v.tgid, v.start_ts) in self.seeded or (v.tgid, v.start_ts - 1) in self.seeded

    def _tgid(self, tid: int, start: int) -> int:
        """Process of a thread first seen being switched in: from /proc."""
        key = (tid, start)
        if key not in self.tgids:
            if len(self.tgids) > 65536:
                self.tgids.clear()
            self.tgids[key] = tgid_from_proc(tid)
        return self.tgids[key]

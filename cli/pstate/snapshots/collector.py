"""The kernel-resident snap collector: bpf/snap.bpf.c loaded once, its maps
and links pinned in bpffs (pstate.kernel.pins) so it goes on counting with
no process running, and each `pstate snap --dir DIR` run reading it at once.

Starting it (`pstate snap --start`) loads the program, makes every
attachment a link, seeds every live thread, and pins the maps and links
under a new directory of the pin directory (PIN_ROOT, or --pin-dir), renamed
to PIN_NAME when complete: a start killed half-way leaves a directory named
for its pid, which the next start, --stop and doctor find and remove.

The pin directory must be one only root can change (pins.open_pin_dir): a
real directory, root's, writable by no one else, made 0700; any other is
refused (exit 77) with how to recover. A collector is found by its
manifest wherever it is (pinsearch.search walks bpffs): one an older pstate
pinned in a directory another user made, and that user moved, is still
seen by --status and doctor, removed by --stop, and keeps --start from
starting a second one. The manifest (pins.PinSet) carries the
layout, when counting began, the settings, and each map's key/leaf types,
so a reader needs no compiler: it opens the pins and reads the maps
(PinnedReader, a taskmaps.MapReader), as a run with its own program does.

The layout is a hash of the program's source: a pstate whose snap program
differs refuses to read the maps (their rows would be misread) and says to
run --restart. Final rows of freed threads are read at each snapshot and
deleted only once that snapshot is published and the directory's cursor
(CURSOR_NAME: the collector, and the last snapshot's time) is written: a run
killed before that loses none of them (the next run shows them again).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import hashlib
import os
import re
import struct
import time
import types

import orjson

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import bpfmaps, bpfsys, features, loader, pins, pinsearch, probeplan
from pstate.kernel.kstates import KernelStates
from pstate.snapshots import histograms, snapdir
from pstate.stream import meta
from pstate.snapshots.taskmaps import COUNTERS, F_SEEDED, MapReader, TidArray, defines_for, load_program, read_hash

LAYOUT = 2  # the version of what the manifest holds; with the source's hash, the layout
PIN_ROOT = os.path.join(pins.BPFFS, "pstate")  # the pin directory (--pin-dir names another)
PIN_NAME = "snap"  # the collector's directory in it
PIN_DIR = os.path.join(PIN_ROOT, PIN_NAME)
WHAT = "snap collector"  # what a manifest of the collector says it is
_PARTIAL = re.compile(r"^snap_new_(\d+)$")  # a start in progress (or killed): its pid
CURSOR_NAME = ".pstate-collector.json"  # in DIR: this reader's cursor and the previous run's rows
MAX_STATE = 64 << 20
READERS = "readers"  # the map of reader cursors (user space's own, pinned with the set)
READER_KEY = 32
READER_EXPIRY_NS = 3600 * 10**9  # a reader silent this long holds no rows back
# how long before a snapshot's time a freed row may have been freed and
# still come after the snapshot read `gone`: the program reads the clock,
# then writes the row; a vCPU held up in between holds the write back
LATE_NS = 1_000_000_000


def layout_id() -> str:
    """The layout of the maps this pstate reads: its version and a hash of
    snap's program text (bpf/snap.bpf.c with its headers)."""
    digest = hashlib.sha256(loader.source("snap").encode()).hexdigest()[:16]
    return f"{LAYOUT}:{digest}"


def _pin_name(kind: str, name: str) -> str:
    return f"{kind}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}"


def pin_root(pin_dir: str | None = None) -> str:
    """The pin directory: --pin-dir's, or PIN_ROOT."""
    return os.path.abspath(pin_dir) if pin_dir else PIN_ROOT


def root_fix(root: str) -> str:
    return (f"as root, remove it (bpffs holds only pins there): rm -r {root}; or pin the collector "
            f"elsewhere: pstate snap --start --pin-dir DIR (a new directory on bpffs, e.g. {pins.BPFFS}/pstate_root)")


def open_root(root: str, create: bool = False) -> int | None:
    """An fd of the pin directory (pins.open_pin_dir), or PstateError: NOPERM
    when another user could change it, with how to recover."""
    try:
        return pins.open_pin_dir(root, create)
    except pins.ForeignDir as e:
        raise PstateError(f"refusing the pin directory {root}: {e.why}; another user could move or hide the "
                          "collector's pins there", ExitCode.NOPERM, hint=root_fix(root)) from None
    except OSError as e:
        if e.errno == errno.EXDEV:
            raise PstateError(f"{e.strerror}: pins live only there", ExitCode.UNAVAILABLE,
                              hint=f"--pin-dir a directory on bpffs, e.g. {pins.BPFFS}/pstate_root") from None
        if e.errno == errno.ENOENT:
            raise PstateError(f"the pin directory {root} cannot be made: {os.path.dirname(root)} does not exist",
                              ExitCode.CANTCREAT) from None
        raise PstateError(f"the pin directory {root}: {e.strerror or e}", ExitCode.OSERR) from None


def _safe(root: str) -> bool:
    """Whether root is a pin directory only root can change."""
    try:
        fd = pins.open_pin_dir(root)
    except OSError:
        return False
    if fd is None:
        return False
    os.close(fd)
    return True


def _starttime(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _starting(found: pins.PinSet) -> bool:
    """Whether a set is a start still under way (its process alive)."""
    m = _PARTIAL.match(os.path.basename(found.dir))
    if not m or ("pid" not in found.doc and found.exposed):
        return False  # (a name another user could have given it)
    pid = found.doc.get("pid") or int(m.group(1))
    now = _starttime(pid)
    return now is not None and found.doc.get("pid_start", now) == now


@dataclasses.dataclass
class Survey:
    """What bpffs holds of the collector (pinsearch.search): the pin directory
    and why it may not be used, the collectors running (the one in the pin
    directory first), what killed starts left, starts under way, and why
    the search did not see all of bpffs."""
    root: str
    root_problem: str | None
    running: list
    partial: list
    starting: list
    cut: str | None

    def close(self) -> None:
        for s in self.running + self.partial + self.starting:
            s.close()


def survey(root: str = PIN_ROOT) -> Survey:
    problem = None
    try:
        fd = pins.open_pin_dir(root)
        if fd is not None:
            os.close(fd)
    except pins.ForeignDir as e:
        problem = e.why
    except FileNotFoundError:
        pass  # no bpffs, or --pin-dir's parent missing: nothing to say of it here
    except OSError as e:
        problem = f"{root}: {e.strerror or e}"
    found = pinsearch.search()
    running, partial, starting = [], [], []
    for s in found.sets:
        if s.doc.get("what", WHAT) != WHAT or "layout" not in s.doc:
            s.close()
        elif _starting(s):
            starting.append(s)
        elif _PARTIAL.match(os.path.basename(s.dir)) or s.missing():
            partial.append(s)
        else:
            running.append(s)
    running.sort(key=lambda s: s.dir != os.path.join(root, PIN_NAME))
    return Survey(root, problem, running, partial, starting, found.cut)


def find(root: str = PIN_ROOT) -> pins.PinSet | None:
    """The running collector: the one in the pin directory when that is
    safe, else the first pinsearch.search finds anywhere in bpffs; or None."""
    try:
        fd = pins.open_pin_dir(root)
    except OSError:
        fd = None
    if fd is not None:
        try:
            found = pins.PinSet.open_at(fd, PIN_NAME, os.path.join(root, PIN_NAME))
        except OSError:
            found = None
        finally:
            os.close(fd)
        if found is not None:
            if found.doc.get("what", WHAT) == WHAT and found.exposed is None and \
                    set(found.doc["pins"]) <= set(os.listdir(found.dir_fd)) | {pins.META}:
                return found  # else: pins were moved (the search finds them) or it is no collector
            found.close()
    sv = survey(root)
    if not sv.running:
        sv.close()
        return None
    first = sv.running.pop(0)
    sv.close()
    return first


def check_layout(found: pins.PinSet) -> None:
    have = found.doc.get("layout")
    if have != layout_id():
        raise PstateError(f"the running snap collector has another layout ({have}, this pstate reads "
                          f"{layout_id()}): it was started by another pstate version", ExitCode.DATAERR,
                          hint="sudo pstate snap --restart   (replaces it; counting starts again)")


def _clear_empty_partials(root_fd: int) -> None:
    """Remove the directories of starts killed before they pinned their
    manifest (empty, their process gone)."""
    with contextlib.suppress(OSError):
        for n in os.listdir(root_fd):
            m = _PARTIAL.match(n)
            if m and _starttime(int(m.group(1))) is None:
                with contextlib.suppress(OSError):
                    os.rmdir(n, dir_fd=root_fd)


def _remove_at(root_fd: int, name: str, path: str) -> list[str]:
    """Remove a pin set of the pin directory; what it could not prove it made stays (its paths)."""
    try:
        found = pins.PinSet.open_at(root_fd, name, path)
    except OSError:
        found = None
    if found is None:
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=root_fd)  # empty: a start killed before its manifest
        try:
            os.stat(name, dir_fd=root_fd, follow_symlinks=False)
        except FileNotFoundError:
            return []
        return [path]
    return found.remove()


def link_features(plan) -> tuple:
    """The kinds of BPF link the collector pins for a plan (pstate.kernel.features)."""
    kinds = set(plan.paths.values())
    return tuple(f for f, need in ((features.RAW_TP_LINK, kinds - {probeplan.TRACEPOINT}),
                                   (features.PERF_LINK, kinds & {probeplan.TRACEPOINT})) if need)


def start(ks: KernelStates, max_tasks: int, kernel_headers: str | None, probes: str | None,
          root: str = PIN_ROOT) -> tuple[dict, bool, list[str]]:
    """Start the collector in the pin directory root unless one runs
    anywhere in bpffs: (its manifest, whether this call started it, notes).
    A running one of another layout is refused (--restart replaces it), and
    so is one another user can move (--stop removes it wherever it is)."""
    loader.check_privileges()
    if root == PIN_ROOT or root.startswith(pins.BPFFS + "/"):
        pins.ensure_bpffs()
    sv = survey(root)
    notes = []
    try:
        for s in sv.partial:
            s.remove()
        if sv.running:
            found = sv.running[0]
            if found.exposed:
                raise PstateError(f"a collector is running, pinned in {found.dir}, under {found.exposed}: another "
                                  "user can move or hide it; not starting a second one", ExitCode.NOPERM,
                                  hint="sudo pstate snap --stop (it finds the collector wherever it is), then start "
                                  "one again in a pin directory of root's")
            check_layout(found)
            return found.doc, False, notes
        if sv.cut:
            notes.append(f"the search of bpffs for a running collector was cut short ({sv.cut}): one pinned beyond "
                         "it would not have been seen")
    finally:
        sv.close()
    root_fd = open_root(root, create=True)  # refused before anything is loaded
    try:
        _clear_empty_partials(root_fd)
        defines = defines_for(ks, max_tasks)
        features.require(*link_features(loader.probe_plan("snap", defines, probes)))
        return _start(ks, max_tasks, kernel_headers, probes, root, root_fd), True, notes
    finally:
        os.close(root_fd)


def _start(ks, max_tasks, kernel_headers, probes, root: str, root_fd: int) -> dict:
    loaded_ts = time.monotonic_ns()
    prog = load_program(ks, max_tasks, kernel_headers, probes)
    links: dict[str, int] = {}
    reader = None
    try:
        links = prog.take_links()
        maps = prog.maps()
        reader = MapReader(prog, ks, loaded_ts)
        run_start = reader.start()
        doc = {
            "what": WHAT, "pid": os.getpid(), "pid_start": _starttime(os.getpid()), "pin_dir": root,
            "layout": layout_id(), "id": os.urandom(8).hex(), "boot_id": meta.boot_id(),
            "loaded_ts": loaded_ts, "run_start_ts": run_start, "seed_ts": reader.seed_ts,
            "started_wall_ns": time.time_ns() - (time.monotonic_ns() - run_start),
            "max_tasks": max_tasks, **prog.plan.meta(),
            "seed_failed": reader.seed_failed,
            "maps": {n: {k: v for k, v in m.items() if k != "fd"} for n, m in maps.items()},
            "links": sorted(t for t in links if t != "readers"),
        }
        readers = bpfsys.map_create(bpfsys.MAP_HASH, READER_KEY, 16, 256, 0, "pstate_readers")
        links["readers"] = readers  # (closed with the links)
        objects = {_pin_name("map", n): m["fd"] for n, m in maps.items()}
        objects[READERS] = readers
        objects.update({_pin_name("link", t): fd for t, fd in links.items() if t != "readers"})
        partial = f"snap_new_{os.getpid()}"
        try:
            pins.pin_all(root_fd, partial, objects, doc)
            os.rename(partial, PIN_NAME, src_dir_fd=root_fd, dst_dir_fd=root_fd)
        except OSError as e:
            _remove_at(root_fd, partial, os.path.join(root, partial))
            raise PstateError(f"pinning the collector in {root} failed: {e.strerror or e}",
                              ExitCode.OSERR) from None
        return doc
    finally:
        for fd in links.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        if reader is not None:
            reader.close()
        prog.close()


def stop(root: str = PIN_ROOT) -> tuple[dict | None, list[str], Survey]:
    """Remove every collector found in bpffs, and what killed starts left:
    (the manifest of the one removed, or None when none ran; the pins left
    because pstate cannot prove it made them or another user could swap
    them; the survey, closed, for its notes)."""
    loader.check_privileges()
    sv = survey(root)
    doc, left = None, []
    try:
        for s in sv.running + sv.partial:
            if doc is None and s in sv.running:
                doc = s.doc
            made_in = s.doc.get("pin_dir")
            here = s.remove()
            left += here
            if not here and made_in and made_in != root and os.path.dirname(s.dir) == made_in and _safe(made_in):
                with contextlib.suppress(OSError):  # another --pin-dir's, root's, and empty now
                    os.rmdir(made_in)
    finally:
        sv.close()
    if sv.root_problem is None:
        try:
            fd = pins.open_pin_dir(root)
        except OSError:
            fd = None
        if fd is not None:
            _clear_empty_partials(fd)
            os.close(fd)
        with contextlib.suppress(OSError):
            os.rmdir(root)  # only when empty: nothing else is pinned there
    return doc, left, sv


class PinnedProgram:
    """A running collector's maps, with the loaded program's table() and counters()."""

    def __init__(self, found: pins.PinSet):
        self.found = found
        self.doc = found.doc
        self.plan = types.SimpleNamespace(path=self.doc["probes"], reason=self.doc["probes_reason"],
                                          paths=self.doc.get("probe_paths", {}))
        self._tables: dict[str, object] = {}

    def table(self, name: str):
        if name not in self._tables:
            m = self.doc["maps"][name]
            fd = self.found.fd(_pin_name("map", name))
            self._tables[name] = bpfmaps.make_table(fd, name, m["key_desc"], m["leaf_desc"], m["type"],
                                                   m["max_entries"], m["flags"])
        return self._tables[name]

    def table_raw(self, pin_name: str) -> int:
        """The fd of a pinned map pstate created itself (no BCC types)."""
        return self.found.fd(pin_name)

    def counters(self) -> list[int]:
        return loader.percpu_sums(self.table("counters"))

    def skipped(self) -> int:
        """Runs of the collector's programs the kernel skipped (loader.Program.skipped)."""
        ids = []
        for target in self.doc.get("links", []):
            with contextlib.suppress(OSError):
                ids.append(pins.link_info(self.found.fd(_pin_name("link", target)))["prog_id"])
        with contextlib.ExitStack() as stack:
            fds = []
            for prog_id in set(ids):
                with contextlib.suppress(OSError):
                    fds.append(stack.enter_context(pins.prog_fd(prog_id)))
            return loader.skipped_runs(fds)

    def close(self) -> None:
        self._tables.clear()
        self.found.close()


class PinnedReader(MapReader):
    """Reads the maps of the running collector (PinnedProgram): rows are
    totals since it began counting.

    Final rows of freed threads stay in `gone` until every registered reader
    has published a snapshot holding them. Each reader (a snapshot
    directory) keeps a cursor: the time of its last published snapshot. A
    freed row's `since` is when the kernel freed the thread; the program
    writes the row a little after it read that time, and a row freed just
    before a snapshot's time may come after the snapshot read `gone`. So a
    reader shows the rows freed since LATE_NS before its cursor, each once:
    those it showed freed after LATE_NS before its snapshot's time are kept
    (`late`) and not shown again. A row is deleted once every registered
    reader's cursor passed it by LATE_NS; a reader that read nothing for
    READER_EXPIRY_NS no longer holds rows back.
    """

    def __init__(self, prog: PinnedProgram, ks: KernelStates, state: dict | None = None):
        doc = prog.doc
        super().__init__(prog, ks, doc["loaded_ts"])
        self.run_start = doc["run_start_ts"]
        self.seed_ts = doc["seed_ts"]
        self.seed_failed = doc.get("seed_failed", 0)
        state = state or {}
        self.cursor = state.get("ts")
        self.late = {tuple(k) for k in state.get("late", [])}  # shown already, freed after cursor - LATE_NS
        self.new_late: list = []
        self.read: list = []  # (key, since) of every final row read
        self.last_ts = None

    def start(self) -> int:
        return self.run_start  # counting began when the collector started

    def _read_gone(self, now: int) -> list:
        rows = read_hash(self.gone)
        self.read = [(k, v.since) for k, v in rows]
        out = []
        for k, v in rows:
            key = (k.tid, v.start_ts)
            seen = self.cursor is not None and (v.since < self.cursor - LATE_NS or key in self.late)
            if v.since >= now - LATE_NS:
                self.new_late.append(key)  # shown now or before: not again at the next cursor (now)
            if not seen:
                out.append((k, v))
        return out

    def _was_seeded(self, tid: int, v) -> bool:
        return bool(v.flags & F_SEEDED)

    def collect(self):
        sample = super().collect()
        self.last_ts = sample.ts
        return sample

    def commit(self, reader: bytes) -> int:
        """Register this reader's cursor (the published snapshot's time) and
        delete the final rows every registered reader has read; how many."""
        fd = self.prog.table_raw(READERS)
        mono = time.monotonic_ns()
        lib = bpfsys.lib
        key = ctypes.create_string_buffer(reader, READER_KEY)
        lib.bpf_update_elem(fd, key, ctypes.create_string_buffer(struct.pack("<QQ", self.last_ts, mono), 16),
                            bpfsys.BPF_ANY)
        low, stale = self.last_ts, []
        prev, nxt = None, ctypes.create_string_buffer(READER_KEY)
        while lib.bpf_get_next_key(fd, prev, nxt) == 0:
            prev = ctypes.create_string_buffer(nxt.raw, READER_KEY)
            val = ctypes.create_string_buffer(16)
            if lib.bpf_lookup_elem(fd, prev, val) != 0:
                continue
            cur, touched = struct.unpack("<QQ", val.raw)
            if mono - touched > READER_EXPIRY_NS:
                stale.append(prev)
            else:
                low = min(low, cur)
        for k in stale:
            lib.bpf_delete_elem(fd, k)
        n = 0
        for k, since in self.read:
            if since < low - LATE_NS and self.gone.remove(k):
                n += 1
        self.read = []
        return n


def reader_id(out) -> bytes:
    """A snapshot directory's identity as a reader: its device and inode."""
    st = os.fstat(out.fd)
    return hashlib.sha256(f"{st.st_dev}:{st.st_ino}".encode()).digest()


def load_state(out, doc: dict) -> dict:
    """DIR's cursor file, when it is of this collector ({} otherwise)."""
    try:
        fd = os.open(CURSOR_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=out.fd)
    except OSError:
        return {}
    try:
        with os.fdopen(fd, "rb") as f:
            state = orjson.loads(f.read(MAX_STATE))
    except (OSError, orjson.JSONDecodeError):
        return {}
    if not isinstance(state, dict) or state.get("collector") != doc["id"] or not isinstance(state.get("ts"), int):
        return {}
    return state


def restore(state: dict, snapper) -> None:
    """Give a snapper the previous run's rows and Prometheus totals, so its
    deltas and counters go on from there (a counter never goes down)."""
    snapper.prev = {(tid, start): counts for tid, start, counts in state.get("prev", [])}
    snapper.folds.restore(state.get("folds"))
    prom = state.get("prom")
    if snapper.prom is not None and prom and prom.get("by") == snapper.prom.by:
        snapper.prom.totals = {tuple(k): v for k, v in prom["totals"]}
        snapper.prom.started, snapper.prom.exited = prom["started"], prom["exited"]
    hist, totals = state.get("hist"), _hist_totals(snapper)
    if hist and hist.get("by") == totals.by:
        totals.totals = {tuple(k): v for k, v in hist["totals"]}


def _hist_totals(snapper) -> histograms.HistTotals:
    """The latency histograms a snapper sums per group: its Prometheus
    export's, or those of its JSON-lines hist rows."""
    return snapper.prom.hist if snapper.prom is not None else snapper.hists


def save_state(out, doc: dict, snapper, reader: PinnedReader) -> None:
    """Write DIR's cursor file (atomically) after a snapshot was published."""
    # each thread's counters and histograms (its next row's growth is taken
    # from them), and each group's histogram totals (they never go down)
    counts = [[tid, start, {**{k: r[k] for k in snapdir.counter_fields(r)}, **({"pid": r["pid"]} if "pid" in r else {}),
                            **({"hist": list(r["hist"])} if r.get("hist") else {}),
                            **({"fold": list(r["fold"])} if r.get("fold") else {})}]
              for (tid, start), r in snapper.prev.items()]
    totals = _hist_totals(snapper)
    state = {"collector": doc["id"], "ts": reader.last_ts, "late": reader.new_late, "prev": counts,
             "folds": snapper.folds.state(),
             "hist": {"by": totals.by, "totals": [[list(k), v] for k, v in totals.totals.items()]}}
    if snapper.prom is not None:
        p = snapper.prom
        state["prom"] = {"by": p.by, "totals": [[list(k), v] for k, v in p.totals.items()], "started": p.started,
                         "exited": p.exited}
    out.publish(CURSOR_NAME, orjson.dumps(state, option=orjson.OPT_APPEND_NEWLINE), replace=True)


def describe(found: pins.PinSet) -> dict:
    """What --status and doctor show of a running collector."""
    doc = found.doc
    prog = PinnedProgram(found)
    out = {"since_wall_ns": doc["started_wall_ns"], "layout": doc["layout"], "layout_ok": doc["layout"] == layout_id(),
           "probes": doc["probes"], "max_tasks": doc["max_tasks"], "pin_dir": found.dir, "exposed": found.exposed}
    mem = 0
    for name, m in doc["maps"].items():
        info = bpfsys.map_info(found.fd(_pin_name("map", name)))
        per = info["key_size"] + info["value_size"] * (bpfsys.possible_cpus() if m["type"] in (
            bpfsys.MAP_PERCPU_ARRAY, bpfsys.MAP_PERCPU_HASH) else 1)
        mem += per * info["max_entries"]
    out["map_bytes"] = mem
    if out["layout_ok"]:
        tasks = prog.table("tasks")
        if bpfsys.map_info(tasks.map_fd)["type"] == bpfsys.MAP_ARRAY:
            arr = TidArray(tasks)
            try:  # with the seeds no event has taken yet (threads idle since the start)
                out["live_rows"] = len(arr.rows()) + len(read_hash(prog.table("seeds")))
            finally:
                arr.close()
        else:
            out["live_rows"] = len(read_hash(tasks))
        out["gone_rows"] = len(read_hash(prog.table("gone")))
        out["gone_max"] = doc["maps"]["gone"]["max_entries"]
        out["counters"] = {**dict(zip(COUNTERS, prog.counters())), "skipped": prog.skipped()}
        out["fold_groups"] = len(read_hash(prog.table("folds")))
        out["fold_max"] = doc["maps"]["folds"]["max_entries"]
    out["cost"] = switch_cost(found)
    return out


def switch_cost(found: pins.PinSet) -> dict | None:
    """run_cnt and ns per run of the program on sched_switch (kernel.bpf_stats_enabled=1 counts them)."""
    for target in found.doc.get("links", []):
        if target.endswith("sched_switch"):
            try:
                st = pins.prog_stats(pins.link_info(found.fd(_pin_name("link", target)))["prog_id"])
            except OSError:
                return None
            st["ns_per_run"] = st["run_time_ns"] / st["run_cnt"] if st["run_cnt"] else None
            return st
    return None


def status_lines(info: dict) -> list[str]:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(info["since_wall_ns"] // 1_000_000_000))
    lines = [f"running since {since}, pinned in {info['pin_dir']}, on the {info['probes']} path",
             f"kernel memory: {info['map_bytes'] / 2**20:.1f} MiB of maps (--max-tasks {info['max_tasks']})"]
    if info.get("exposed"):
        lines.append(f"unsafe: pinned under {info['exposed']}: another user can move or hide it; "
                     "`pstate snap --stop` removes it wherever it is, then start it again in a pin directory of root's")
    if not info["layout_ok"]:
        lines.append(f"layout {info['layout']} is not this pstate's ({layout_id()}): "
                     "`pstate snap --restart` replaces it")
    else:
        c = info["counters"]
        lines.append(f"rows: {info['live_rows']} live threads, {info['gone_rows']} of {info['gone_max']} "
                     f"freed threads waiting to be read; folded: {c['folded']} freed threads into "
                     f"{info['fold_groups']} of {info['fold_max']} groups (freed-thread map full); "
                     f"lost: {c['tasks_full']} (task map full), {c['fold_lost']} (group map full too)")
        if c.get("skipped"):
            lines.append(f"skipped: {c['skipped']} runs of its programs, each a transition or wake-up not "
                         "counted (the kernel runs no classic tracepoint program on a CPU while another BPF "
                         "program or a bpf(2) map call is under way there; --restart --probes tp_btf avoids it)")
    cost = info["cost"]
    if cost and cost["run_cnt"]:
        lines.append(f"cost: {cost['ns_per_run']:.0f} ns per context switch ({cost['run_cnt']} switches counted "
                     "while kernel.bpf_stats_enabled=1)")
    else:
        lines.append("cost per context switch: not counted (sysctl kernel.bpf_stats_enabled=1 counts it)")
    return lines

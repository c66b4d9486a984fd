"""The kernel-resident snap collector: bpf/snap.bpf.c loaded once, its maps
and links pinned in bpffs (pstate.kernel.pins) so it goes on counting with
no process running, and each `pstate snap --dir DIR` run reading it at once.

Starting it (`pstate snap --start`) loads the program, makes every
attachment a link, seeds every live thread, and pins the maps and links
under a new directory, renamed to PIN_DIR when complete: a start killed
half-way leaves a directory named for its pid, which the next start,
--stop and doctor find and remove. The manifest (pins.PinSet) carries the
layout, when counting began, the settings, and each map's key/leaf types,
so a reader needs no compiler: it opens the pins and reads the maps through
snapshots.taskmaps, as a run with its own program does.

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
import hashlib
import os
import re
import struct
import time
import types

import orjson

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import bpfsys, features, loader, pins, probeplan
from pstate.kernel.kstates import KernelStates
from pstate.snapshots import histograms, snapdir
from pstate.snapshots.taskmaps import COUNTERS, F_SEEDED, BpfCollector, TidArray, defines_for, read_hash

LAYOUT = 2  # the version of what the manifest holds; with the source's hash, the layout
PIN_ROOT = os.path.join(pins.BPFFS, "pstate")
PIN_DIR = os.path.join(PIN_ROOT, "snap")
_PARTIAL = re.compile(r"^snap_new_(\d+)$")  # a start in progress (or killed): its pid
CURSOR_NAME = ".pstate-collector.json"  # in DIR: this reader's cursor and the previous run's rows
MAX_STATE = 64 << 20
READERS = "readers"  # the map of reader cursors (user space's own, pinned with the set)
READER_KEY = 32
READER_EXPIRY_NS = 3600 * 10**9  # a reader silent this long holds no rows back


def layout_id() -> str:
    """The layout of the maps this pstate reads: its version and a hash of
    snap's program text (bpf/snap.bpf.c with its headers)."""
    digest = hashlib.sha256(loader.source("snap").encode()).hexdigest()[:16]
    return f"{LAYOUT}:{digest}"


def _pin_name(kind: str, name: str) -> str:
    return f"{kind}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}"


def find() -> pins.PinSet | None:
    """The collector pinned at PIN_DIR, or None."""
    if not os.path.isdir(PIN_DIR):
        return None
    try:
        return pins.PinSet.open(PIN_DIR)
    except OSError as e:
        raise PstateError(f"{PIN_DIR} holds something pstate cannot read: {e.strerror or e}", ExitCode.OSERR,
                          hint="remove what is there by hand if no other tool made it") from None


def check_layout(found: pins.PinSet) -> None:
    have = found.doc.get("layout")
    if have != layout_id():
        raise PstateError(f"the running snap collector has another layout ({have}, this pstate reads "
                          f"{layout_id()}): it was started by another pstate version", ExitCode.DATAERR,
                          hint="sudo pstate snap --restart   (replaces it; counting starts again)")


def partial_dirs() -> list[str]:
    """Pin directories of starts that did not finish and whose process is gone."""
    try:
        names = os.listdir(PIN_ROOT)
    except OSError:
        return []
    out = []
    for n in names:
        m = _PARTIAL.match(n)
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            out.append(os.path.join(PIN_ROOT, n))
    return out


def _remove(directory: str) -> list[str]:
    """Remove a pin set; what it could not prove it made stays (its names)."""
    try:
        found = pins.PinSet.open(directory)
    except OSError:
        found = None
    if found is None:
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # empty: a start killed before its manifest
        return [n for n in os.listdir(directory)] if os.path.isdir(directory) else []
    return found.remove()


def remove_partial() -> list[str]:
    """Remove what killed starts left; the directories that stay."""
    left = []
    for d in partial_dirs():
        if _remove(d):
            left.append(d)
    return left


def link_features(plan) -> tuple:
    """The kinds of BPF link the collector pins for a plan (pstate.kernel.features)."""
    kinds = set(plan.paths.values())
    return tuple(f for f, need in ((features.RAW_TP_LINK, kinds - {probeplan.TRACEPOINT}),
                                   (features.PERF_LINK, kinds & {probeplan.TRACEPOINT})) if need)


def start(ks: KernelStates, max_tasks: int, kernel_headers: str | None, probes: str | None) -> tuple[dict, bool]:
    """Start the collector unless one runs: (its manifest, whether this call started it).
    A running one of another layout is refused (--restart replaces it)."""
    loader.check_privileges()
    pins.ensure_bpffs()
    remove_partial()
    found = find()
    if found is not None:
        try:
            check_layout(found)
            return found.doc, False
        finally:
            found.close()
    defines = defines_for(ks, max_tasks)
    features.require(*link_features(loader.probe_plan("snap", defines, probes)))
    os.makedirs(PIN_ROOT, mode=0o700, exist_ok=True)
    loaded_ts = time.monotonic_ns()
    prog = loader.Program("snap", defines, kernel_headers, probes)
    links: dict[str, int] = {}
    collector = None
    try:
        links = prog.take_links()
        maps = prog.maps()
        collector = BpfCollector(prog, ks, loaded_ts)
        run_start = collector.start()
        boot_id = ""
        with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        doc = {
            "layout": layout_id(), "id": os.urandom(8).hex(), "boot_id": boot_id,
            "loaded_ts": loaded_ts, "run_start_ts": run_start, "seed_ts": collector.seed_ts,
            "started_wall_ns": time.time_ns() - (time.monotonic_ns() - run_start),
            "max_tasks": max_tasks, **prog.plan.meta(),
            "seed_failed": collector.seed_failed,
            "maps": {n: {k: v for k, v in m.items() if k != "fd"} for n, m in maps.items()},
            "links": sorted(t for t in links if t != "readers"),
        }
        readers = bpfsys.map_create(bpfsys.MAP_HASH, READER_KEY, 16, 256, 0, "pstate_readers")
        links["readers"] = readers  # (closed with the links)
        objects = {_pin_name("map", n): m["fd"] for n, m in maps.items()}
        objects[READERS] = readers
        objects.update({_pin_name("link", t): fd for t, fd in links.items() if t != "readers"})
        partial = os.path.join(PIN_ROOT, f"snap_new_{os.getpid()}")
        try:
            pins.pin_all(partial, objects, doc)
            os.rename(partial, PIN_DIR)
        except OSError as e:
            _remove(partial)
            raise PstateError(f"pinning the collector in {PIN_ROOT} failed: {e.strerror or e}",
                              ExitCode.OSERR) from None
        return doc, True
    finally:
        for fd in links.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        if collector is not None:
            collector.close()
        prog.close()


def stop() -> tuple[dict | None, list[str]]:
    """Remove the collector: (its manifest or None when none ran, the pins
    left because pstate cannot prove it made them)."""
    loader.check_privileges()
    left = remove_partial()
    found = find()
    doc = None
    if found is not None:
        doc = found.doc
        left += [os.path.join(PIN_DIR, n) for n in found.remove()]
    with contextlib.suppress(OSError):
        os.rmdir(PIN_ROOT)  # only when empty: nothing else of pstate's is pinned (a killed start made it)
    return doc, left


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
            self._tables[name] = bpfsys.make_table(fd, name, m["key_desc"], m["leaf_desc"], m["type"],
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


class PinnedCollector(BpfCollector):
    """Reads a running collector: rows are totals since it began counting.

    Final rows of freed threads stay in `gone` until every registered reader
    has published a snapshot holding them. Each reader (a snapshot
    directory) keeps a cursor: the time of its last published snapshot. A
    freed row's `since` is when the kernel freed the thread, so a reader
    whose snapshot was taken at T read every row freed before T; it shows
    the rows freed since its previous cursor (and those freed while it read,
    `late`, only once). A row is deleted once every registered reader's
    cursor passed it; a reader that read nothing for READER_EXPIRY_NS no
    longer holds rows back.
    """

    def __init__(self, prog: PinnedProgram, ks: KernelStates, state: dict | None = None):
        doc = prog.doc
        super().__init__(prog, ks, doc["loaded_ts"])
        self.run_start = doc["run_start_ts"]
        self.seed_ts = doc["seed_ts"]
        self.seed_failed = doc.get("seed_failed", 0)
        state = state or {}
        self.cursor = state.get("ts")
        self.late = {tuple(k) for k in state.get("late", [])}  # shown already, though freed after the cursor
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
            if self.cursor is not None and (v.since < self.cursor or (k.tid, v.start_ts) in self.late):
                continue  # in an earlier snapshot of this directory
            if v.since >= now:
                self.new_late.append((k.tid, v.start_ts))
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
            if since < low and self.gone.remove(k):
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


def save_state(out, doc: dict, snapper, reader: PinnedCollector) -> None:
    """Write DIR's cursor file (atomically) after a snapshot was published."""
    # each thread's counters and histograms (its next row's growth is taken
    # from them), and each group's histogram totals (they never go down)
    counts = [[tid, start, {**{k: r[k] for k in snapdir.counter_fields(r)},
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
           "probes": doc["probes"], "max_tasks": doc["max_tasks"], "pin_dir": found.dir}
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

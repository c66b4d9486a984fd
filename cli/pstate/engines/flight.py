"""record --flight: the last seconds of binary events in memory, written to a
file when a trigger fires.

Until a trigger fires nothing is encoded: each drained batch of ring-buffer
slots (bpf/pstate.h's struct event after the kernel's 8-byte header) is
copied as bytes into a bounded ring, and the triggers look at the few fields
they need through memoryview columns (max() of the dur column, or the
positions of one state code in the from/to column), in C, not per event in
Python. A dump encodes the ring's batches with record's own Encoder and
publishes the file like a snapshot: an O_EXCL|O_NOFOLLOW temp file in the
directory, fsync, renameat2(RENAME_NOREPLACE), fsync of the directory.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import secrets
import signal
import struct
import sys
import time
from dataclasses import dataclass, field

import orjson

from pstate import lifecycle, native
from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import eventcodec, eventlayout, identity
from pstate.kernel.loader import RingReader
from pstate.stream import names, schema, vocab
from pstate.stream.durations import fmt_ns, parse_ns
from pstate.stream.meta import rfc3339, wall_time_at
from pstate.stream.outfiles import invoking_user
from pstate.snapshots.writer import SnapDir, _rename_noreplace

HDR = RingReader.HDR  # the ring buffer's own header before each struct event
STRIDE = RingReader.stride_of(eventcodec.EVENT_SIZE)
BATCH_OVERHEAD = 200  # bytes a kept batch costs beyond its slots (the bytes object, the deque entry)
ENCODE_CHUNK = 8192  # slots encoded per write while a dump is written


OFF = {name: HDR + eventlayout.offset_of(name) for name, _code in eventlayout.EVENT_FIELDS}  # within a slot
assert STRIDE % 8 == 0 and OFF["dur"] % 8 == 0 and OFF["ts"] % 8 == 0 and OFF["from"] % 2 == 0
# runq>=DUR: the waits a switch-in ends (stream.vocab's run-queue kinds)
WAIT_CODES = frozenset(eventcodec.CODES[s] for k in vocab.RUNQ_KINDS for s in k.frm)
_COND = re.compile(r"^(?P<state>[A-Za-z_+-]+)(?:>=(?P<dur>.+))?$")
# whose events a condition looks at: WHO=VALUE: before it (the value may hold colons)
SELECTORS = ("comm", "pid", "cgroup", "title")


@dataclass
class Trigger:
    """One --trigger condition: a state left after at least min_ns (min_ns
    set), or a state entered (min_ns None), optionally by one comm."""

    text: str
    codes: frozenset
    min_ns: int | None
    comm: bytes | None = None
    runq: bool = False  # runq>=DUR: the wait before a switch-in
    pids: frozenset | None = None  # pid=N[,N..]: these processes' events only
    cgroups: frozenset | None = None  # cgroup=PATH: events of tasks in it or below (cgroup ids)
    title: re.Pattern | None = None  # title=REGEX: of processes whose title (cmdline) it finds
    titles: dict = field(default_factory=dict)  # pid -> title, read once

    def whose(self, batch, i: int) -> bool:
        """Whether slot i is an event of a task the selector names (pid, cgroup, title)."""
        pid = _field(batch, i, "pid", 4)
        if self.pids is not None and pid not in self.pids:
            return False
        if self.cgroups is not None and _field(batch, i, "cgroup", 8) not in self.cgroups:
            return False
        if self.title is not None:
            title = self.titles.get(pid)
            if title is None:
                if len(self.titles) > 4096:
                    self.titles.clear()
                title = self.titles[pid] = _title(pid)
            if not self.title.search(title):
                return False
        return True


def _title(pid: int) -> str:
    """A process's title as record's process records say it ('' when gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return identity.title_of(f.read())
    except OSError:
        return ""


def parse_trigger(text: str, ks) -> Trigger:
    """'D>=100ms', 'runq>=50ms', 'comm=NAME:D', 'pid=42,43:D>=10ms',
    'cgroup=/system.slice/x.service:runq>=5ms', 'title=REGEX:D>=1s' ->
    Trigger; ValueError says why."""
    who, cond = None, text.strip()
    key = cond.partition("=")[0]
    if key in SELECTORS and ":" in cond:
        sel, _, cond = cond.rpartition(":")
        who = (key, sel[len(key) + 1:])
    m = _COND.match(cond)
    if m is None or (who is not None and not who[1]):
        raise ValueError(f"{text!r} is not a condition (e.g. D>=100ms, runq>=50ms, comm=postgres:D, "
                         f"pid=42:D>=10ms, cgroup=/system.slice/x.service:runq>=5ms, 'title=^postgres:D>=1s')")
    state, dur = m.group("state"), m.group("dur")
    comm = who[1] if who is not None and who[0] == "comm" else None
    if comm is not None and len(comm.encode()) > 15:
        raise ValueError(f"{text!r}: a comm is at most 15 bytes")
    min_ns = parse_ns(dur) if dur is not None else None
    if state == "runq":
        if min_ns is None:
            raise ValueError(f"{text!r}: runq needs a duration (runq>=50ms)")
        codes, runq = WAIT_CODES, True
    else:
        letters = {letter: name for name, (letter, _c, _d) in schema.STATES.items()}
        name = letters.get(state, state) if state not in ("R",) else schema.RUNNING
        code = eventcodec.state_code(name, ks)
        if code is None:
            raise ValueError(f"{text!r}: unknown state {state!r} (a name such as uninterruptible, or a letter: D, S)")
        codes, runq = frozenset((code,)), False
    raw = comm.encode()[:15] if comm is not None else None
    trig = Trigger(text, codes, min_ns, raw, runq)
    if who is not None and who[0] == "pid":
        try:
            trig.pids = frozenset(int(p) for p in who[1].split(","))
        except ValueError:
            raise ValueError(f"{text!r}: pid= takes process ids, e.g. pid=42,43:D>=10ms") from None
    elif who is not None and who[0] == "cgroup":
        paths = identity.CgroupPaths()
        if paths.mount is None or paths.id_of(who[1]) is None:
            raise ValueError(f"{text!r}: no cgroup {who[1]} under the cgroup v2 mount")
        trig.cgroups = frozenset(paths.below(who[1]))  # as record --cgroup: with those below it now
    elif who is not None and who[0] == "title":
        try:
            trig.title = re.compile(who[1])
        except re.error as e:
            raise ValueError(f"{text!r}: title= takes a regular expression ({e})") from None
    return trig


def _positions(column: list, value: int) -> list[int]:
    out, i = [], -1
    with contextlib.suppress(ValueError):
        while True:
            i = column.index(value, i + 1)
            out.append(i)
    return out


def _live(batch, i: int) -> bool:
    """Slot i holds a committed event (not one the kernel discarded)."""
    return not int.from_bytes(batch[i * STRIDE:i * STRIDE + 4], "little") & (eventcodec.DISCARD | eventcodec.BUSY)


def _field(batch, i: int, name: str, size: int) -> int:
    at = i * STRIDE + OFF[name]
    return int.from_bytes(batch[at:at + size], "little")


_COLUMNS: dict[int, struct.Struct] = {}


def columns(view, n: int) -> tuple[tuple, tuple]:
    """(headers, durations) of n slots, in one struct call: the only two
    fields every batch needs. Durations read signed: the unknown one (all
    ones) is -1, which max() passes over."""
    st = _COLUMNS.get(n)
    if st is None:
        if len(_COLUMNS) > 64:
            _COLUMNS.clear()
        gap = OFF["dur"] - 4
        st = _COLUMNS[n] = struct.Struct("<" + f"I{gap}xq{STRIDE - OFF['dur'] - 8}x" * n)
    vals = st.unpack_from(view)
    return vals[0::2], vals[1::2]


def scan_pure(view) -> tuple[int, int]:
    """(slots before the first busy one, the longest known dur among them
    that are not discarded, or -1): all a batch needs when no trigger fires.
    The C twin is pstate._encode.scan."""
    n = len(view) // STRIDE
    if not n:
        return 0, -1
    hdrs, durs = columns(view, n)
    top = max(hdrs)
    if top < eventcodec.DISCARD:  # both flags are above any length: max() sees them
        return n, max(max(durs), -1)
    consumed = next((i for i, h in enumerate(hdrs) if h & eventcodec.BUSY), n)
    return consumed, max((d for h, d in zip(hdrs[:consumed], durs) if not h & eventcodec.DISCARD), default=-1)


_encode = native.load("_encode")
scan = getattr(_encode, "scan", None) or scan_pure


def _long_durations(durs, min_ns: int) -> list[int]:
    """Slots whose dur is at least min_ns, in order (long states are few)."""
    return [i for i, d in enumerate(durs) if d >= min_ns]


def _comm_slots(batch, comm: bytes) -> list[int]:
    """Slots whose comm is comm, found by bytes.find (in C)."""
    needle = comm + b"\0"
    out, at = [], batch.find(needle)
    while at >= 0:
        if at % STRIDE == OFF["comm"]:
            out.append(at // STRIDE)
        at = batch.find(needle, at + 1)
    return out


def match(trig: Trigger, batch, longest=None) -> int | None:
    """Index of the first slot of batch (bytes of whole slots) that fires trig, or None.
    longest: scan()'s longest dur of the batch, when known."""
    n = len(batch) // STRIDE
    if not n:
        return None
    mv = memoryview(batch)
    if trig.min_ns is not None:
        if longest is None:
            longest = scan(batch)[1]
        if longest < trig.min_ns:
            return None  # the usual batch: decided in C
        cand = _long_durations(columns(mv, n)[1], trig.min_ns)
    elif trig.comm is not None:
        cand = _comm_slots(batch, trig.comm)
    else:
        col = mv.cast("H")[OFF["to"] // 2::STRIDE // 2].tolist()
        cand = sorted(i for code in trig.codes for i in _positions(col, code))
    for i in cand:
        if not _live(batch, i) or _field(batch, i, "type", 1) != eventcodec.EV_STATE:
            continue
        if _field(batch, i, "from" if trig.min_ns is not None else "to", 2) not in trig.codes:
            continue
        if trig.runq and _field(batch, i, "cause", 1) != eventcodec.CAUSE_SWITCH_IN:
            continue
        if trig.comm is not None:
            at = i * STRIDE + OFF["comm"]
            if bytes(batch[at:at + 16]).split(b"\0", 1)[0] != trig.comm:
                continue
        if not trig.whose(batch, i):
            continue
        return i
    return None


@dataclass
class Dump:
    """A dump waiting for its --after to run out."""

    trigger: dict
    due_ns: int
    fired: int = 1
    extended: list = field(default_factory=list)


class FlightRecorder:
    """The ring of binary batches, the triggers, and the dumps."""

    def __init__(self, enc, dir: SnapDir, *, window_ns: int, memory: int, triggers: list[Trigger],
                 after_ns: int, max_dumps: int, hold_off_ns: int, new_meta, start_ts: int, quiet: bool,
                 lost_counts=None):
        self.enc = enc
        self.dir = dir
        self.window_ns = window_ns
        self.memory = memory
        self.triggers = triggers
        self.after_ns = after_ns
        self.max_dumps = max_dumps
        self.hold_off_ns = hold_off_ns
        self.new_meta = new_meta
        self.start_ts = start_ts
        self.quiet = quiet
        self.ring: collections.deque = collections.deque()  # (first ts, last ts, bytes)
        self.bytes = 0
        self.peak_bytes = 0
        self.shrunk_ts = None  # newest first ts of a batch the memory cap pushed out
        self.pending: Dump | None = None
        self.dumps = 0
        self.files: list[str] = []
        self.last_dump_end = None
        self.manual_asked = False
        self.spare = None  # one evicted batch, reused (at most one batch beyond the cap)
        self.writing = False  # a dump holds the ring's batches: none is reused meanwhile
        self.skipped = 0  # triggers the hold-off or --max-dumps ignored
        # (monotonic ns, drops per reason so far), once a second: a dump's end record counts its window's
        self.lost_counts = lost_counts or dict
        self.lost_marks: collections.deque = collections.deque([(start_ts, dict(self.lost_counts()))])

    # --- the hot path ---

    def feed(self, view, n: int) -> int:
        """Keep the committed slots of view; look for triggers. Returns slots consumed."""
        consumed, longest = scan(view)  # stops before a slot the kernel is still writing
        if not consumed:
            return 0
        size = consumed * STRIDE
        spare, self.spare = self.spare, None
        if spare is not None and len(spare) == size:
            spare[:] = view[:size]  # the batch evicted last: memory already mapped, no page faults
            batch = spare
        else:
            batch = bytearray(view[:size])
        q = memoryview(batch).cast("Q")
        first, last = q[OFF["ts"] // 8], q[(consumed - 1) * STRIDE // 8 + OFF["ts"] // 8]
        self.ring.append((first, last, batch))
        self.bytes += len(batch) + BATCH_OVERHEAD
        for trig in self.triggers:
            i = match(trig, batch, longest)
            if i is not None:
                self._fire(trig, batch, i)
        self._evict(last)
        return consumed

    def _evict(self, now_ts: int) -> None:
        keep_from = now_ts - self.window_ns
        if self.pending is not None:
            keep_from = min(keep_from, self.pending.trigger["ts"] - self.window_ns)
        ring = self.ring
        # the oldest batch goes once the next one starts at keep_from or before (the ring then
        # still covers keep_from), or when the memory cap says so (the window shrinks)
        while len(ring) > 1 and (ring[1][0] <= keep_from or self.bytes > self.memory):
            if ring[1][0] > keep_from:
                self.shrunk_ts = ring[1][0]
            old = ring.popleft()[2]
            self.bytes -= len(old) + BATCH_OVERHEAD
            if not self.writing:
                self.spare = old  # the next batch goes into it
        self.peak_bytes = max(self.peak_bytes, self.bytes)

    # --- triggers ---

    def _fire(self, trig: Trigger, batch, i: int) -> None:
        pid, tid = _field(batch, i, "pid", 4), _field(batch, i, "tid", 4)
        at = i * STRIDE + OFF["comm"]
        rec = {"type": "trigger", "ts": _field(batch, i, "ts", 8), "cause": "condition", "condition": trig.text,
               "pid": self.enc.pid(pid, tid), "tid": tid,
               "comm": names.comm(batch[at:at + 16]),
               "from": self.enc.name(_field(batch, i, "from", 2)), "to": self.enc.name(_field(batch, i, "to", 2))}
        dur = _field(batch, i, "dur", 8)
        rec["dur_ns"] = None if dur == eventcodec.NO_DUR else dur
        self.fire(rec)

    def manual(self) -> None:
        self.manual_asked = True  # SIGUSR1: tick() fires it

    def fire(self, rec: dict) -> None:
        """A trigger: start a dump, extend the pending one, or count it as held off."""
        ts = rec["ts"]
        if self.pending is not None:
            # extended, but by at most one window: a condition true all the time still gets written
            limit = self.pending.trigger["ts"] + self.after_ns + self.window_ns
            self.pending.due_ns = min(limit, max(self.pending.due_ns, ts + self.after_ns))
            self.pending.fired += 1
            return
        if self.dumps >= self.max_dumps or (
                self.last_dump_end is not None and ts < self.last_dump_end + self.hold_off_ns):
            self.skipped += 1
            return
        self.pending = Dump(rec, ts + self.after_ns)
        if not self.quiet:
            print(f"pstate record: trigger {rec.get('condition') or rec['cause']} "
                  f"({rec.get('comm', '')} {rec.get('tid', '')}); writing in {fmt_ns(self.after_ns)}",
                  file=sys.stderr)

    def tick(self, between=None) -> None:
        """Called by record's loop: a manual trigger, and a dump whose --after ran out."""
        if self.manual_asked:
            self.manual_asked = False
            self.fire({"type": "trigger", "ts": time.monotonic_ns(), "cause": "signal", "signal": "SIGUSR1"})
        now = time.monotonic_ns()
        if now - self.lost_marks[-1][0] >= 1_000_000_000:
            self.lost_marks.append((now, dict(self.lost_counts())))
            while len(self.lost_marks) > 2 and self.lost_marks[1][0] < now - self.window_ns - self.after_ns:
                self.lost_marks.popleft()
        if self.pending is not None and now >= self.pending.due_ns:
            self.write(between)

    def close(self, between=None) -> None:
        """The end of the run: a pending dump is written with what there is."""
        if self.pending is not None:
            self.write(between, reason="stopped")

    # --- dumps ---

    def write(self, between=None, reason: str = "flight") -> str:
        dump, self.pending = self.pending, None
        end_ts = time.monotonic_ns()
        self.last_dump_end = end_ts  # a trigger while this one is written is held off from here
        batches = list(self.ring)
        want_ts = dump.trigger["ts"] - self.window_ns
        first = max((k for k, b in enumerate(batches) if b[0] <= want_ts), default=0)
        batches = batches[first:]
        begin = batches[0][0] if batches else end_ts
        if self.shrunk_ts is None and begin <= self.start_ts + self.window_ns and want_ts <= self.start_ts:
            begin = min(begin, self.start_ts)  # nothing evicted yet: the file covers the run from its start
        meta = self.new_meta()
        # the file starts where its window does (wall_ns keeps the same anchor)
        meta["wall_ns"] -= meta["ts"] - begin
        meta["wall_time"] = rfc3339(meta["wall_ns"])
        meta["ts"] = begin
        meta["window_begin_ts"] = begin
        meta["window_end_ts"] = end_ts
        trig = dict(dump.trigger)
        trig.update(window_begin_ts=begin, window_end_ts=end_ts, flight_ns=self.window_ns, after_ns=self.after_ns,
                    shrunk=begin > want_ts and begin > self.start_ts, triggers=dump.fired,
                    memory_bytes=self.memory)
        name = self._name(trig["ts"])
        self.writing = True
        try:
            events = self._publish(name, meta, trig, batches, end_ts, reason, between)
        finally:
            self.writing = False
        self.dumps += 1
        self.last_dump_end = end_ts
        self.files.append(name)
        if not self.quiet:
            print(f"pstate record: wrote {self.dir.where(name)} ({events} events, "
                  f"{fmt_ns(end_ts - begin)} window)", file=sys.stderr)
        return name

    def _name(self, ts: int) -> str:
        wall = time.time_ns() - (time.monotonic_ns() - ts)
        secs, ns = divmod(wall, 1_000_000_000)
        base = "flight-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime(secs)) + f".{ns // 1_000_000:03d}Z"
        name, k = base + ".jsonl", 1
        while _exists(self.dir.fd, name):
            k += 1
            name = f"{base}-{k}.jsonl"
        return name

    def _publish(self, name, meta, trig, batches, end_ts, reason, between) -> int:
        tmp = f".pstate-{name}.tmp.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=self.dir.fd)
        except OSError as e:
            raise _write_error(self.dir.where(name), e) from None
        events = 0
        try:
            os.fchmod(fd, 0o600)
            sudo = invoking_user()
            if sudo:
                os.fchown(fd, sudo[0], sudo[1])
            with os.fdopen(fd, "wb", buffering=1 << 20, closefd=False) as fp:
                fp.write(orjson.dumps(meta, option=orjson.OPT_APPEND_NEWLINE))
                fp.write(orjson.dumps(trig, option=orjson.OPT_APPEND_NEWLINE))
                for k, (_first, _last, batch) in enumerate(batches):
                    view = memoryview(batch)
                    data, nlines, _consumed = self.enc.encode_bytes(view, len(batch) // STRIDE)
                    fp.write(data)
                    del data
                    view.release()
                    events += nlines
                    if between is not None and k % 16 == 15:
                        between()  # keep the BPF ring buffer drained while a large dump is written
                fp.write(orjson.dumps(self._end(end_ts, reason, events, meta), option=orjson.OPT_APPEND_NEWLINE))
            os.fsync(fd)
            os.close(fd)
            fd = None
            _rename_noreplace(self.dir.fd, tmp, name)
            tmp = None
            os.fsync(self.dir.fd)
        except OSError as e:
            raise _write_error(self.dir.where(name), e) from None
        finally:
            if fd is not None:
                os.close(fd)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=self.dir.fd)
        return events


    def _end(self, end_ts: int, reason: str, events: int, meta: dict) -> dict:
        """The dump's end record: its events, and the drops counted since the
        last once-a-second mark at or before its window began."""
        begin = meta["ts"]
        base = next((m for t, m in reversed(self.lost_marks) if t <= begin), self.lost_marks[0][1])
        now = self.lost_counts()
        lost = {r: n - base.get(r, 0) for r, n in now.items()}
        return {"type": "end", "ts": end_ts, "reason": reason, "events": events, "lost": sum(lost.values()),
                **{f"lost_{r}": n for r, n in lost.items()}, "duration_ns": end_ts - begin,
                "wall_time": wall_time_at(meta, end_ts)}


def _exists(dfd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dfd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _write_error(path: str, e: OSError) -> PstateError:
    return PstateError(f"cannot write the flight recording {path}: {e.strerror or e}", ExitCode.CANTCREAT,
                       hint="free space there, or lower --max-dumps or --flight-memory")


def prepare(flight: dict, ks, output: str | None) -> dict:
    """Check record's --flight settings before anything is loaded: the
    triggers parsed, the directory opened (created 0700 if missing)."""
    if not output or output == "-":
        raise PstateError("--flight needs -o DIR, the directory the recordings go to", ExitCode.USAGE,
                          hint="e.g. sudo pstate record --flight 30s --trigger 'D>=100ms' -o /var/tmp/flight")
    try:
        triggers = [parse_trigger(t, ks) for t in flight["triggers"]]
    except ValueError as e:
        raise PstateError(f"--trigger {e}", ExitCode.USAGE) from None
    return {**flight, "triggers": triggers, "dir": SnapDir(output)}


def start(prepared: dict, enc, new_meta, start_ts: int, quiet: bool, lost_counts=None) -> FlightRecorder:
    """The FlightRecorder for prepare()'s settings; SIGUSR1 fires it (record's
    loop takes the signal: FlightRecorder.manual)."""
    rec = FlightRecorder(enc, **prepared, new_meta=new_meta, start_ts=start_ts, quiet=quiet, lost_counts=lost_counts)
    lifecycle.watch(signal.SIGUSR1)
    return rec

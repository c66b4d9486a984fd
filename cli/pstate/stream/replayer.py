"""The engine behind `pstate replay`: read recordings (or snapshot files) as
bytes, select and pace their lines, and write them out again unchanged.

Input is untrusted, as in every reader: bad lines are skipped and counted in
a ReadStats (or, with strict, end the replay), over-long lines are dropped
without being buffered, a newer schema is refused.

Speed: a line is parsed into Python objects only when something must be
decided about it. With --no-wait, no filter, no window and no --strict, runs
of lines are first checked with a few byte counts (each line starts like an
event record, ends with "}", holds no second record start and no NUL, is
shorter than 2 KiB, and the run is valid UTF-8), then read by the native
reader of plain state records (pstate._digest.plain_states, the parser of
reader.StreamReader's fast path), and written as they are; every other line
(meta, loss, end, lifecycle records, unusual spellings, damaged lines) is
parsed and checked on its own, so replay passes exactly the records the
reader accepts. Without the native module (PSTATE_PURE=1) every line is
parsed, with the same result (_plain_states is None).
"""

from __future__ import annotations

import codecs
import os
import sys
import time
from typing import Callable, Iterator

import orjson

from pstate import __version__, native
from pstate.stream import schema
from pstate.stream.durations import fmt_ns
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.filters import Filter
from pstate.stream.streamio import BOM, MAX_INT, MAX_LINE, LineWriter, ReadStats, check_record, check_schema, note_damage, open_input
from pstate.stream.timewindow import Anchor, BoundWindow, Window, WindowError, cut_end, fmt_wall

_plain_states = getattr(native.load("_digest"), "plain_states", None)
BLOCK = 1 << 18  # bytes per read
FAST_MIN = 1 << 12  # runs shorter than this that fail the quick check are parsed line by line
_PROBE = 1 << 10  # the quick check passes lines shorter than twice this (see event_lines)
OUT_BATCH = 1 << 16  # bytes of pending output that trigger a write
SLACK_NS = 1_000_000  # a record due sooner than this is written without sleeping
MAX_GAP_NS = 60 * 1_000_000_000  # recorded time waited for at most between two records

_EVENT_STARTS = tuple(b'\n{"type":"%s",' % t.encode() for t in schema.EVENT_TYPES)
_RECORD_START = b'{"type":"'
_EVENT_TYPES = frozenset(schema.EVENT_TYPES)


def _valid_ts(v) -> int | None:
    """v when it is a timestamp the policy accepts, else None: the ts of meta,
    loss, end and other records is not checked by check_record, and a value
    outside int64 must not reach the pacer or the end trailer."""
    return v if type(v) is int and 0 <= v < MAX_INT else None


def _anchor(meta: dict, start_key: str = "ts") -> Anchor | None:
    """Anchor.from_meta with times outside the integer policy treated as
    absent, so window bounds derived from them stay in range."""
    return Anchor.from_meta({k: _valid_ts(meta.get(k)) for k in ("ts", "wall_ns", start_key)}, start_key)


def _event_ok(rec: dict) -> bool:
    """A quicker form of streamio.check_record for the common case: True only
    when check_record would accept this event record. When False, the caller
    asks check_record (for the reason, or because this was too cautious)."""
    g = rec.get
    ts, cpu, pid, tid, comm = g("ts"), g("cpu"), g("pid"), g("tid"), g("comm")
    # For ints, the OR is >= 0 and < 2**63 exactly when each of them is.
    if not (type(ts) is type(cpu) is type(pid) is type(tid) is int and 0 <= (ts | cpu | pid | tid) < MAX_INT
            and (comm is None or type(comm) is str)):
        return False
    if g("type") == "state":
        d = g("dur_ns")
        return (type(g("from")) is str and type(g("to")) is str
                and (d is None or (type(d) is int and 0 <= d < MAX_INT)))
    return True


class Stop(Exception):
    """A signal asked the replay to end (the trailer says reason "signal")."""


class Pacer:
    """Sleeps so that records keep their original spacing, divided by speed.

    Each deadline is computed from one monotonic start, so time spent
    writing or sleeping too long never accumulates. Timestamps that go
    backwards a little (events of different CPUs) are written at once.
    rebase() starts a new recording: it continues the timeline where it is,
    so the gap (or a clock reset) between two recordings is not waited for.
    A jump forward of more than max_gap_ns of recorded time (a valid but
    huge ts) is shortened to max_gap_ns; on_cap(ts, gap_ns) is told.
    """

    def __init__(self, speed: float | None, *, clock: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[float], None] = time.sleep, before_sleep: Callable[[], None] = lambda: None,
                 slack_ns: int = SLACK_NS, max_gap_ns: int = MAX_GAP_NS,
                 on_cap: Callable[[int, int], None] = lambda ts, gap: None):
        self.speed = speed
        self.max_gap_ns = max_gap_ns
        self.on_cap = on_cap
        self.clock = clock
        self.sleep = sleep
        self.before_sleep = before_sleep
        self.slack_ns = slack_ns
        self.t0: int | None = None  # clock() when the first record was written
        self.base_ts: int | None = None  # original ts that maps to base_pos
        self.base_pos = 0  # replay timeline: original ns since the first record
        self.pos = 0  # furthest point of the timeline reached

    def rebase(self) -> None:
        self.base_ts = None

    def wait(self, ts: int) -> None:
        if self.speed is None:
            return
        if self.base_ts is None:
            self.base_ts, self.base_pos = ts, self.pos
            if self.t0 is None:
                self.t0 = self.clock()
        pos = self.base_pos + (ts - self.base_ts)
        if pos <= self.pos:
            return
        if pos - self.pos > self.max_gap_ns:
            self.on_cap(ts, pos - self.pos)
            self.base_pos -= pos - self.pos - self.max_gap_ns
            pos = self.pos + self.max_gap_ns
        self.pos = pos
        deadline = self.t0 + pos / self.speed
        if deadline - self.clock() > self.slack_ns:
            self.before_sleep()  # live readers get what is due before we sleep
            delay = deadline - self.clock()
            if delay > 0:
                self.sleep(delay / 1e9)


def iter_blocks(read: Callable[[int], bytes], on_overlong: Callable[[], None], *,
                max_line: int = MAX_LINE, block: int = BLOCK) -> Iterator[tuple[int, bytes, int, int]]:
    """Yield (offset, buf, s, e): buf[s:e] is a run of complete lines, each
    ending in a newline, that starts at file offset `offset`; buf[s-1] is
    always a newline. Last may come a final line that has none (a truncated
    tail), as buf[s:e] with buf[e-1] not a newline.

    A line longer than max_line is dropped without being held in memory and
    on_overlong() is called where it was. Every yielded line is at most
    max_line bytes (plus its newline).

    Most of each read is yielded in place; only the line that spans two reads
    is copied. (Joining whole reads made blocks of varying sizes, and the
    allocator then returned and refetched memory from the kernel each time.)
    """
    block = max(1, min(block, max_line))  # so a line inside one read is never too long
    pending = b""  # the start of a line whose newline has not been read yet
    offset = 0  # file offset of pending (or of what comes next)
    discarding = False  # inside an over-long line: drop up to its newline
    while True:
        chunk = read(block)
        if not chunk:
            break
        first = chunk.find(b"\n")
        if first < 0:
            if discarding:
                offset += len(chunk)
            elif len(pending) + len(chunk) > max_line:
                discarding = True
                offset += len(pending) + len(chunk)
                pending = b""
            else:
                pending += chunk
            continue
        head = len(pending) + first  # the line that ends here, without its newline
        if discarding or head > max_line:
            discarding = False
            on_overlong()
        else:
            line = b"".join((b"\n", pending, chunk[:first + 1]))
            yield offset, line, 1, len(line)
        offset += head + 1
        last = chunk.rfind(b"\n")
        if last > first:
            yield offset, chunk, first + 1, last + 1
            offset += last - first
        pending = chunk[last + 1:]
    if discarding:
        on_overlong()
    elif pending:
        yield offset, b"\n" + pending, 1, len(pending) + 1


def event_lines(buf: bytes, s: int, e: int) -> int:
    """The number of records in buf[s:e] when it is a run of event records,
    each on its own line, else -1. buf[s-1] and buf[e-1] must be newlines.

    Checked with byte counts only: the run starts with an event record
    ({"type":"<event type>",), every line that starts a record starts an
    event record, every newline after "}" is followed by a record start (or
    ends the run), every record start follows "}" and a newline, and no
    record starts inside a line (as a torn write would leave). The bytes
    between a record's start and its "}" are not parsed, but the run is
    valid UTF-8 and holds no NUL (a crash can leave zeroed pages), and every
    line is shorter than 2 * _PROBE bytes: nesting deeper than orjson's limit
    (1024) takes at least 2050. Other damage inside a well-framed line (a
    token such as NaN or 1e400, a control character in a string) is not seen
    here; readers downstream skip such lines.
    """
    if buf[e - 2:e] != b"}\n" or buf[s:s + 9] != _RECORD_START:
        return -1
    k = buf.count(_EVENT_STARTS[0], s - 1, e - 1)  # "state": nearly every line
    n = buf.count(b'{"typ', s, e)  # record starts anywhere (a fast pattern)
    if k != n:
        for start in _EVENT_STARTS[1:]:
            k += buf.count(start, s - 1, e - 1)
        if k != n:
            return -1
    if buf.count(b"}\n", s, e) != k or buf.count(b'}\n{"type":"', s, e) != k - 1:
        return -1
    if buf.find(b"\0", s, e) >= 0:  # memchr: nearly free
        return -1
    if not buf.isascii():  # the whole read at C speed; decode only a rare non-ASCII run
        try:
            codecs.utf_8_decode(memoryview(buf)[s:e], "strict", True)
        except UnicodeDecodeError:
            return -1
    # A newline in every window of _PROBE bytes starting at s + i * _PROBE: a line
    # of 2 * _PROBE bytes or more holds a whole window. One memchr per 1 KiB.
    find = buf.find
    for p in range(s, e - _PROBE + 1, _PROBE):
        if find(b"\n", p, p + _PROBE) < 0:
            return -1
    return k


class Replayer:
    """Replays sources one after another into a LineWriter.

    speed None means --no-wait. filt is applied only when it is active, so a
    replay without filters keeps every event (idle tasks included).
    """

    def __init__(self, writer: LineWriter, *, speed: float | None = 1.0, filt: Filter | None = None,
                 window: Window | None = None, strict: bool = False, stats: ReadStats | None = None,
                 max_line: int = MAX_LINE, clock: Callable[[], int] = time.monotonic_ns,
                 sleep: Callable[[float], None] = time.sleep):
        self.writer = writer
        self.speed = speed
        self.filt = filt if filt is not None and filt.active else None
        self.window = window or Window()
        self.strict = strict
        self.stats = stats if stats is not None else ReadStats()
        self.max_line = max_line
        self._sleep_fn = sleep
        self.pacer = Pacer(speed, clock=clock, sleep=self._sleep, before_sleep=self.flush, on_cap=self._gap_capped)
        self.gaps_capped = 0
        self.paced = speed is not None
        self.windowed = self.window.active
        self.fast = not self.paced and self.filt is None and not self.windowed and not strict

        self.events = 0  # event lines written
        self.lost: dict[str, int] = {}  # reason -> count, from the loss records written
        self.snapshots = 0
        self.header = False  # a meta line has been written
        self.bound: BoundWindow | None = None  # the window, resolved on the first recording
        self.seg_bound = False  # the window is placed on the current recording
        self.begin_ts: int | None = None
        self.end_ts: int | None = None
        self.seg_start: int | None = None  # ts of the current recording's meta
        self.last_ts: int | None = None  # latest ts written in the current recording
        self.seen: list[int] = []  # [min, max] event ts read, for the empty-window warning
        self.snap_boot: object = None
        self.snap_ts: int | None = None
        self.skip_file = False  # snapshot outside the window: drop the rest of the file

        self.stop_reason: str | None = None
        self.interruptible = False
        self.pending: list = []  # lines to write, one line each
        self.pending_bytes = 0
        self.name = ""
        self.lineno = 0
        self.earlier_tail: str | None = None
        self.mode = "stream"

    # --- signals: end at the next safe point ------------------------------

    def _gap_capped(self, ts: int, gap_ns: int) -> None:
        self.gaps_capped += 1
        if self.gaps_capped == 1:
            print(f"pstate replay: note: {self.name} jumps {fmt_ns(gap_ns)} ahead at ts {ts}; waiting "
                  f"{fmt_ns(MAX_GAP_NS)} of recorded time instead (longer gaps are shortened)", file=sys.stderr)

    def on_signal(self, signum, frame) -> None:
        self.stop_reason = "signal"
        if self.interruptible:  # sleeping or waiting for input: end now
            self.interruptible = False
            raise Stop()

    def _sleep(self, secs: float) -> None:
        self.interruptible = True
        try:
            if self.stop_reason:
                raise Stop()
            self._sleep_fn(secs)
        finally:
            self.interruptible = False

    # --- output -----------------------------------------------------------

    def _out(self, line: bytes) -> None:
        self.pending.append(line)
        self.pending_bytes += len(line)
        if self.pending_bytes >= OUT_BATCH:
            self._drain()

    def _drain(self) -> None:
        if self.pending:
            data = b"".join(self.pending)
            n = len(self.pending)
            self.pending.clear()
            self.pending_bytes = 0
            self.writer.raw(data, n)

    def flush(self) -> None:
        self._drain()
        self.writer.flush()

    # --- sources ----------------------------------------------------------

    def run(self, sources: list[tuple[str, bool]]) -> str:
        """Replay (path, is_snapshot) sources and write the end trailer.
        Returns the reason written: eof or signal."""
        reason = "eof"
        try:
            for path, snap in sources:
                if snap and not os.path.exists(path):
                    # snap's retention removed it since the directory was listed
                    self.stats.skip("snapshot removed before it was read", path)
                    continue
                self.play(path, snapshot=snap)
                if self.stop_reason:
                    raise Stop()
        except Stop:
            reason = "signal"
        except (PstateError, WindowError) as e:
            if self.header:
                self.finish("error")  # readers see where the stream ended
            if isinstance(e, WindowError):
                raise PstateError(str(e), ExitCode.USAGE) from None
            raise
        self.finish(reason)
        return reason

    def play(self, path: str, snapshot: bool = False) -> None:
        self.name = "<stdin>" if path == "-" else path
        self.lineno = 0
        self.earlier_tail = self.stats.truncated_tail  # an earlier file's cut stays reported
        self.mode = "snap" if snapshot else "stream"
        self.skip_file = False
        fp = open_input(path)
        read = getattr(fp, "read1", fp.read)

        def interruptible_read(n: int) -> bytes:
            self.flush()  # the next read may block: write what is due first
            self.interruptible = True
            try:
                if self.stop_reason:
                    raise Stop()
                return read(n)
            finally:
                self.interruptible = False

        try:
            for offset, buf, s, e in iter_blocks(interruptible_read, self._overlong, max_line=self.max_line):
                if offset == 0 and buf.startswith(BOM, s):
                    # The first block is the first line alone: drop the byte order
                    # mark some editors write, keeping buf[s - 1] a newline.
                    buf = b"\n" + buf[s + 3:e]
                    offset, s, e = 3, 1, len(buf)
                    if e == 1:
                        continue
                if self.fast and self.mode == "stream" and buf[e - 1:e] == b"\n":
                    self._fast_range(buf, s, e)
                else:
                    self._lines(buf, s, e, offset)
                if self.stop_reason:
                    raise Stop()
            note_damage(fp, self.name, self.stats)
        except OSError as e:
            if isinstance(e, BrokenPipeError):
                raise
            raise PstateError(f"reading {self.name} failed: {e.strerror or e}", ExitCode.IOERR) from None
        finally:
            if fp is not getattr(sys.stdin, "buffer", None):
                fp.close()

    # --- the quick path ---------------------------------------------------

    def _fast_range(self, buf: bytes, s: int, e: int) -> None:
        n = event_lines(buf, s, e) if self.header and _plain_states is not None else -1
        if n > 0:
            self._plain_runs(buf, s, e)
            return
        if n < 0 and e - s > FAST_MIN and _plain_states is not None:
            mid = buf.find(b"\n", (s + e) // 2, e - 1)
            if mid >= 0:
                self._fast_range(buf, s, mid + 1)
                self._fast_range(buf, mid + 1, e)
                return
        self._lines(buf, s, e, 0)

    def _plain_runs(self, buf: bytes, s: int, e: int) -> None:
        """Write the well-framed event lines of buf[s:e] unparsed while the
        native reader finds them plainly written state records the reader
        accepts (so replay passes only what stats would read); any other
        line is parsed and checked on its own."""
        last = e - 1  # the newline of the last line
        pos = s
        while pos < e:
            stop, n = _plain_states(buf, pos, last, self.max_line)
            if n:
                end = min(stop, e)
                self._drain()
                self.writer.raw(memoryview(buf)[pos:end], n)
                self.events += n
                self.lineno += n
                self.stats.lines += n
                self.stats.records += n
                start = buf.rfind(b"\n", pos, end - 1) + 1
                ts = _valid_ts(orjson.loads(buf[max(start, pos):end]).get("ts"))
                if ts is not None and (self.last_ts is None or ts > self.last_ts):
                    self.last_ts = ts
                pos = end
            if pos >= e:
                return
            nl = buf.find(b"\n", pos, e)
            self._lines(buf, pos, nl + 1, 0)
            pos = nl + 1
            if self.stop_reason:
                raise Stop()

    # --- line by line -----------------------------------------------------

    def _overlong(self) -> None:
        self.lineno += 1
        self.stats.lines += 1
        self._skip(f"line longer than {self.max_line} bytes")

    def _skip(self, why: str) -> None:
        where = f"{self.name}:{self.lineno}"
        if self.strict:
            raise PstateError(f"{where}: {why}", ExitCode.DATAERR)
        self.stats.skip(why, where)

    def _lines(self, buf: bytes, s: int, e: int, offset: int) -> None:
        """Parse and handle buf[s:e] line by line; valid events take a short cut."""
        find = buf.find
        loads = orjson.loads
        decode_error = orjson.JSONDecodeError
        quick = self.mode == "stream"
        event = self._event
        base = self.lineno
        k = records = 0
        i = s
        try:
            while i < e:
                j = find(b"\n", i, e)
                k += 1
                if j < 0:
                    self.lineno = base + k
                    self._tail(buf[i:e], offset + i - s)
                    return
                line = buf[i:j + 1]
                i = j + 1
                try:
                    rec = loads(line)
                except decode_error:
                    if line.strip():  # blank lines are no records and no errors
                        self.lineno = base + k
                        self._skip("not valid JSON")
                    continue
                if (quick and type(rec) is dict and type(rec.get("type")) is str and rec["type"] in _EVENT_TYPES
                        and _event_ok(rec)):
                    records += 1
                    event(rec, line)
                else:
                    self.lineno = base + k
                    self._checked(rec, line)
                if self.stop_reason:
                    raise Stop()
        finally:
            self.lineno = base + k
            self.stats.lines += k
            self.stats.records += records

    def _tail(self, line: bytes, offset: int) -> None:
        """The last line had no newline: a complete record or a truncated one."""
        self.stats.truncated_tail = f"{self.name}: byte {offset}, line {self.lineno}"
        if not line.strip():
            return
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            if self.strict:
                raise PstateError(f"{self.name}:{self.lineno}: truncated record", ExitCode.DATAERR) from None
            return  # reported as the truncated final record
        self.stats.truncated_tail = self.earlier_tail  # the last line was complete after all
        self._checked(rec, line + b"\n")

    def _checked(self, rec, line: bytes) -> None:
        why = check_record(rec)
        if why:
            self._skip(why)
            return
        self.stats.records += 1
        t = rec["type"]
        if t == "meta":
            self._meta(rec)
            return
        if self.skip_file:
            return
        if t in schema.EVENT_TYPES:
            self._event(rec, line)
        elif t == "loss":
            self._loss(rec, line)
        elif t == "end":
            self.stats.ends.append(rec)
            if self.mode == "snap":
                self._out(line)  # a snapshot's own end (tasks, reason interval) is part of it
        else:
            self._other(rec, line)

    # --- records ----------------------------------------------------------

    def _meta(self, meta: dict) -> None:
        check_schema(meta, self.name)
        self.stats.metas.append(meta)
        snap = self.mode == "snap"
        anchor = _anchor(meta, "interval_start_ts" if snap else "ts")
        ts = _valid_ts(meta.get("ts"))
        self.seg_bound = False
        if anchor is not None:
            self._place(anchor)
        if snap:
            self.skip_file = ts is not None and not self._inside(ts)
            if self.skip_file:
                return
            if ts is not None:
                boot = meta.get("boot_id")
                if self.snap_ts is not None and (boot != self.snap_boot or ts < self.snap_ts):
                    self.pacer.rebase()  # another boot: its clock starts over
                self.snap_boot, self.snap_ts = boot, ts
                self.pacer.wait(ts)
            self.snapshots += 1
        else:
            if self.header:
                self.pacer.rebase()
            self.seg_start = ts
        self.last_ts = ts
        self._out(self._marked(meta))
        self.header = True

    def _marked(self, meta: dict) -> bytes:
        out = dict(meta)
        out["replayed"] = True
        out["replay_speed"] = self.speed
        if self.begin_ts is not None:
            out.update(replay_begin_ts=self.begin_ts, window_begin_ts=max(self.begin_ts, out.get("window_begin_ts") or 0))
        if self.end_ts is not None:
            out["replay_end_ts"] = self.end_ts
            out["window_end_ts"] = min(self.end_ts, _valid_ts(out.get("window_end_ts")) or self.end_ts)
        if self.filt is not None:
            out.update({f"replay_{k}": v for k, v in self.filt.meta_fields().items()})
        return orjson.dumps(out, option=orjson.OPT_APPEND_NEWLINE)

    def _start_headless(self, ts: int | None) -> None:
        """Records before any meta header: write one so the output is a stream."""
        meta = {"type": "meta", "schema": schema.SCHEMA_VERSION, "source": "replay", "tool": "pstate",
                "version": __version__, "clock": "monotonic"}
        if ts is not None:
            meta["ts"] = ts
            self._place(Anchor(ts))
        self.header = True
        self.seg_start = self.last_ts = ts
        self._out(self._marked(meta))

    def _place(self, anchor: Anchor) -> None:
        """Resolve the window in the clock of the recording that starts here."""
        if self.window.active:
            if self.bound is None:
                self.bound = self.window.bind(anchor)
            # Clamped to [0, 2**63]: the same selection for every valid ts, and
            # bounds orjson can write into the meta line (-b +99999999999h).
            self.begin_ts, self.end_ts = (None if t is None else min(max(t, 0), MAX_INT)
                                          for t in self.bound.for_recording(anchor))
        self.seg_bound = True

    def _inside(self, ts: int) -> bool:
        return not ((self.begin_ts is not None and ts < self.begin_ts)
                    or (self.end_ts is not None and ts >= self.end_ts))

    def _timed(self, ts) -> None:
        ts = _valid_ts(ts)
        if not self.header:
            self._start_headless(ts)
        elif not self.seg_bound and ts is not None:
            self._place(Anchor(ts))  # a meta without a ts: the recording starts here

    def _event(self, rec: dict, line: bytes) -> None:
        ts = rec["ts"]
        if not self.seg_bound:
            self._timed(ts)
        if self.windowed:
            seen = self.seen
            if not seen:
                seen += [ts, ts]
            elif ts < seen[0]:
                seen[0] = ts
            elif ts > seen[1]:
                seen[1] = ts
            if not self._inside(ts):
                return
        if self.filt is not None and not self.filt.match(rec):
            return
        if self.paced and self.mode == "stream":
            self.pacer.wait(ts)
        self.pending.append(line)
        self.pending_bytes += len(line)
        if self.pending_bytes >= OUT_BATCH:
            self._drain()
        self.events += 1
        if self.last_ts is None or ts > self.last_ts:
            self.last_ts = ts

    def _loss(self, rec: dict, line: bytes) -> None:
        ts, since = _valid_ts(rec.get("ts")), _valid_ts(rec.get("since_ts"))
        self._timed(ts)
        # A loss record covers [since_ts, ts]: keep it when that overlaps the window.
        if ts is not None and self.begin_ts is not None and ts < self.begin_ts:
            return
        start = since if since is not None else ts
        if start is not None and self.end_ts is not None and start >= self.end_ts:
            return
        self._out(line)
        reason = rec["reason"]
        # Saturating: each count is below 2**63, their sum need not be.
        self.lost[reason] = min(self.lost.get(reason, 0) + rec["count"], MAX_INT - 1)
        if ts is not None and (self.last_ts is None or ts > self.last_ts):
            self.last_ts = ts

    def _other(self, rec: dict, line: bytes) -> None:
        # rate and process records, snapshot rows, types of a later format: before the
        # window they still say what is in force (sampling, who a pid is), so keep them.
        if self.filt is not None and rec["type"] in ("process", "cgroup"):  # (--cgroup, --title)
            self.filt.note(rec)
        ts = _valid_ts(rec.get("ts"))
        self._timed(ts)
        if ts is not None and self.mode == "stream":
            if self.end_ts is not None and ts >= self.end_ts:
                return
            if self.last_ts is None or ts > self.last_ts:
                self.last_ts = ts
        self._out(line)

    # --- the end ----------------------------------------------------------

    def finish(self, reason: str) -> None:
        if not self.header:
            self._start_headless(None)
        end: dict = {"type": "end"}
        last = (self.last_ts if not self.window.active or self.mode == "snap"  # a cut ends at its window
                else cut_end(self.last_ts, self.end_ts, self.stats.ends[-1:]))
        if last is not None:
            end["ts"] = last
        end.update(reason=reason, events=self.events, lost=min(sum(self.lost.values()), MAX_INT - 1))
        for r in (*schema.LOSS_REASONS, *sorted(set(self.lost) - set(schema.LOSS_REASONS))):
            end[f"lost_{r}"] = self.lost.get(r, 0)
        if last is not None and self.seg_start is not None:
            end["duration_ns"] = last - self.seg_start
        if self.snapshots:
            end["snapshots"] = self.snapshots
        end["replay_skipped"] = self.stats.n_skipped + (1 if self.stats.truncated_tail else 0)
        self._out(orjson.dumps(end, option=orjson.OPT_APPEND_NEWLINE))
        self.flush()

    def window_note(self) -> str | None:
        """A warning when the window missed every event that was read."""
        if not self.window.active or self.events or not self.seen or self.filt is not None:
            return None
        parts = []
        if self.window.begin is not None:
            parts.append(f"from {self.window.begin.text}")
        if self.window.end is not None:
            parts.append(f"until {self.window.end.text}")
        span = f"ts {self.seen[0]} .. {self.seen[1]}"
        if len(self.stats.metas) == 1:
            a = _anchor(self.stats.metas[0])
            if a is not None and a.has_wall:
                span = f"{fmt_wall(a.wall_of(self.seen[0]))} .. {fmt_wall(a.wall_of(self.seen[1]))}"
        return f"no events {' '.join(parts)}; the events read span {span}"

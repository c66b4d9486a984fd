"""The engine behind `pstate replay`: read recordings (or snapshot files) as
bytes, select and pace their lines, and write them out again unchanged.

Input is read by the one reader (reader.StreamReader, with its rules: a
byte order mark dropped, bad lines skipped and counted in a ReadStats or,
with strict, ending the replay, over-long lines dropped without being
buffered, a truncated tail reported, a newer schema refused); the Replayer
is its sink and writes the lines of the records it keeps unchanged.

Speed: with --no-wait, no filter, no window and no --strict, the reader's
bulk path is the native reader of plain state records
(pstate._digest.plain_states, the parser of every fast path): runs of them
are written as they are, unparsed; every other line (meta, loss, end,
lifecycle records, unusual spellings, damaged lines) takes the careful path,
so replay passes exactly the records the reader accepts. Without the native
module (PSTATE_PURE=1) every line is parsed, with the same result.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

import orjson

from pstate import __version__, native
from pstate.stream import schema
from pstate.stream.durations import fmt_ns
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.filters import Filter
from pstate.stream.meta import wall_time_at
from pstate.stream.reader import StreamReader
from pstate.stream.streamio import MAX_INT, MAX_LINE, LineWriter, ReadStats, note_damage, open_input
from pstate.stream.timewindow import Anchor, BoundWindow, Window, WindowError, cut_end, fmt_wall

_plain_states = getattr(native.load("_digest"), "plain_states", None)
# ... and the native row reader, for replays that select or pace what they copy
_parse_states = getattr(native.load("_digest"), "parse_states", None)
BLOCK = 1 << 18  # bytes per read
OUT_BATCH = 1 << 16  # bytes of pending output that trigger a write
SLACK_NS = 1_000_000  # a record due sooner than this is written without sleeping
MAX_GAP_NS = 60 * 1_000_000_000  # recorded time waited for at most between two records

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
        # the one reader, with this as its sink (line()); its bulk path copies plain state
        # records, all of them or those the filter and the window keep, at the pace asked for
        if not self.paced and self.filt is None and not self.windowed:
            fast = self._plain if _plain_states is not None else None
        else:
            fast = self._plain_rows if _parse_states is not None else None
        self.reader = StreamReader(self, self.stats, strict=strict, max_line=max_line, lines=True, unknown=True,
                                   fast=fast)

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
        self.mode = "stream"

    # --- signals: end at the next safe point ------------------------------

    def _gap_capped(self, ts: int, gap_ns: int) -> None:
        self.gaps_capped += 1
        if self.gaps_capped == 1:
            print(f"pstate replay: note: {self.name} jumps {fmt_ns(gap_ns)} ahead at ts {ts}; waiting "
                  f"{fmt_ns(MAX_GAP_NS)} of recorded time instead (longer gaps are shortened)", file=sys.stderr)

    def on_signal(self, signum, frame=None) -> None:
        """A signal (pstate.lifecycle.handled calls it): end at the next safe point."""
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
        self.mode = "snap" if snapshot else "stream"
        self.skip_file = False
        fp = open_input(path)
        read = getattr(fp, "read1", fp.read)
        rd = self.reader
        try:
            rd.begin(self.name)
            while True:
                self.flush()  # the next read may block: write what is due first
                self.interruptible = True
                try:
                    if self.stop_reason:
                        raise Stop()
                    data = read(BLOCK)
                finally:
                    self.interruptible = False
                if not data:
                    break
                rd.feed(data)
                if self.stop_reason:
                    raise Stop()
            rd.end()
            note_damage(fp, self.name, self.stats)
        except OSError as e:
            if isinstance(e, BrokenPipeError):
                raise
            raise PstateError(f"reading {self.name} failed: {e.strerror or e}", ExitCode.IOERR) from None
        finally:
            if fp is not getattr(sys.stdin, "buffer", None):
                fp.close()

    # --- from the reader ----------------------------------------------------

    def _plain(self, buf: bytes, pos: int, end: int, _n: int) -> tuple[int, int, int]:
        """The reader's bulk path (--no-wait, no filter, no window): the
        plainly written state records of the lines of buf[pos:end] from pos
        on, as the native reader finds them (what the careful path would
        accept), written unparsed."""
        if not self.header or self.mode != "stream":
            return pos, 0, 0  # (a record before any meta: the careful path writes one first)
        stop, n, ts = _plain_states(buf, pos, end, self.max_line)
        if n:
            self._drain()
            self.writer.raw(memoryview(buf)[pos:stop], n)
            self.events += n
            if self.last_ts is None or ts > self.last_ts:
                self.last_ts = ts  # (the largest of theirs: events of several CPUs interleave)
            if self.stop_reason:
                raise Stop()
        return stop, n, n

    def _plain_rows(self, buf: bytes, pos: int, end: int, _n: int) -> tuple[int, int, int]:
        """The bulk path of a replay that selects or paces: the same records
        as the native row reader's rows, each kept (or not) and paced as the
        careful path would, from its fields; its line written unparsed."""
        if not self.header or self.mode != "stream":
            return pos, 0, 0
        stop, lines, rows = _parse_states(buf, pos, end, self.max_line)
        if rows:
            keep = self._keep
            match = self.filt.match_state if self.filt is not None else None
            i = 0
            for seg in buf[pos:stop - 1].split(b"\n"):  # one a line read; empty lines have no row
                if seg:
                    ts, pid, tid, comm, frm, to, dur, cpu, _w, cg, _steal = rows[i]
                    i += 1
                    keep(ts, seg + b"\n", match is None or match(pid, tid, comm, cpu, frm, to, dur, cg))
                    if self.stop_reason:
                        raise Stop()
        return stop, lines, len(rows)

    def line(self, rec: dict, line: bytes) -> None:
        """A checked record and its line (newline included), from the reader."""
        t = rec["type"]
        if t in _EVENT_TYPES:
            if not self.skip_file:
                self._event(rec, line)
        elif t == "meta":
            self._meta(rec)
        elif self.skip_file:
            pass
        elif t == "loss":
            self._loss(rec, line)
        elif t == "end":
            if self.mode == "snap":
                self._out(line)  # a snapshot's own end (tasks, reason interval) is part of it
        else:
            self._other(rec, line)
        if self.stop_reason:
            raise Stop()

    # --- records ----------------------------------------------------------

    def _meta(self, meta: dict) -> None:
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
        self._keep(rec["ts"], line, self.filt is None or self.filt.match(rec))

    def _keep(self, ts: int, line: bytes, passes: bool) -> None:
        """An event at ts: written unless the window or the filter (passes) drops it."""
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
        if not passes:
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
        if last is not None and self.stats.metas and (wall := wall_time_at(self.stats.metas[-1], last)):
            end["wall_time"] = wall
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

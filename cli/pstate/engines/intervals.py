"""stats --interval: per-interval summaries of a stream (engines.stats
prints each)."""

from __future__ import annotations

import os
import select
import sys
import time

from pstate.analysis import ingest, timeinstate
from pstate.render import tables
from pstate.stream.meta import boot_id
from pstate.stream.reader import read_records
from pstate.stream.streamio import open_input

CHUNK = 1 << 20


class IntervalRunner:
    """stats --interval: a summary of every interval, of the wall clock while
    a pipe or a terminal is read, of recorded time in a regular file."""

    def __init__(self, agg, stats, out, *, interval_ns, count, opts, filt=None, emit=None):
        self.agg = agg
        self.emit = emit  # emit(summary, out, opts, banner): prints one interval's summary
        self.filt = filt
        self.stats = stats
        self.out = out
        self.interval_ns = interval_ns
        self.count = count
        self.opts = opts
        self.seq = 0
        self.done = False
        self.live = False  # a pipe was read: intervals on the wall clock
        self.t0: int | None = None  # data-time start of the current interval
        self.mark = stats.mark()  # the input counts when the current interval began
        self.next_wall = time.monotonic() + interval_ns / 1e9
        self.dig = ingest.LineDigester(agg, stats, strict=False, filt=filt)

    def window_start(self) -> int | None:
        if self.t0 is not None:
            return self.t0
        if self.agg.clip_ts is not None:  # a cut stream's window_begin_ts
            return self.agg.clip_ts
        metas = [m.get("ts") for m in self.stats.metas if type(m.get("ts")) is int]
        return min(metas) if metas else self.agg.first_ts()

    def tick(self, end_ts: int | None = None, final: bool = False, interrupted: bool = False) -> None:
        """Print the interval ending at end_ts (data time), start the next."""
        self.agg.sync()
        start = self.window_start()
        if end_ts is None:
            end_ts = self._now_ts(start)
        if final and self.seq and not self.agg.events and (end_ts is None or end_ts == start):
            return  # nothing since the last summary
        self.seq += 1
        summary = self.agg.summarise(self.stats.since(self.mark), start_ts=start, end_ts=end_ts)
        self.mark = self.stats.mark()
        summary.interval = {"seq": self.seq, "start_ts": start, "end_ts": end_ts}
        summary.interrupted = interrupted
        self.emit(summary, self.out, self.opts, banner=self._banner(summary))
        if end_ts is not None:
            self.t0 = end_ts
            self.agg.start_interval(end_ts)
        if self.count and self.seq >= self.count:
            self.done = True

    def finish(self) -> None:
        """The last summaries: for files (recorded time), every whole
        interval up to the stream's end record, then the partial one; for a
        live stream, the partial one."""
        end = self.end_ts()
        if end is not None and self.t0 is not None and not self.live:
            while end > self.t0 + self.interval_ns and not self.done:
                self.tick(end_ts=self.t0 + self.interval_ns)
        if not self.done:
            self.tick(end_ts=end, final=True)

    def end_ts(self) -> int | None:
        """Where the stream said it ended (its end records), if it did."""
        ends = [e.get("ts") for e in self.stats.ends if type(e.get("ts")) is int]
        if not ends:
            return None
        last = self.agg.last_ts()
        return max(ends + ([last] if last is not None else []))

    def _now_ts(self, start) -> int | None:
        """The current time in the stream's clock: the live monotonic clock
        when the stream comes from this boot, else the last event seen."""
        last = self.agg.last_ts()
        meta = self.stats.metas[-1] if self.stats.metas else None
        if meta and not meta.get("replayed") and meta.get("boot_id") and meta.get("boot_id") == boot_id():
            now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            return max(now, last or 0, start or 0)
        if last is None:
            return start
        return max(last, start or last)

    def _banner(self, summary) -> str | None:
        meta = self.stats.metas[0] if self.stats.metas else {}
        wall = None
        if type(meta.get("wall_ns")) is int and type(meta.get("ts")) is int and summary.end_ts is not None:
            wall = meta["wall_ns"] + (summary.end_ts - meta["ts"])
        elif self.opts.get("timestamp"):
            wall = time.time_ns()
        return tables.interval_banner(wall)

    # A regular file: intervals of recorded time, exact at record granularity.
    def file(self, src: str, *, strict: bool) -> None:
        agg = self.agg
        for rec in read_records([src], self.stats, strict=strict, filt=self.filt):
            t = rec["type"]
            if t == "meta":
                agg.begin_window(rec)  # a cut stream: clipped to its window
            if t in ("process", "cgroup"):
                agg.add_record(rec)  # (--by title and the like)
                continue
            if t != "state" and t not in timeinstate.LIFECYCLE:
                continue
            ts = rec["ts"]
            if self.t0 is None:
                self.t0 = self.window_start() if self.stats.metas else ts
            while ts >= self.t0 + self.interval_ns:
                self.tick(end_ts=self.t0 + self.interval_ns)
                if self.done:
                    return
            agg.add_record(rec)

    # A pipe or a terminal: wall-clock intervals, select() so they fire with no input.
    def stream(self, src: str, *, strict: bool) -> None:
        self.live = True
        fp = open_input(src, decompress=False)  # select() and os.read on its descriptor
        fd = fp.fileno()
        dig = self.dig
        dig.strict = strict
        dig.begin("<stdin>" if src == "-" else src)
        try:
            while not self.done:
                timeout = max(0.0, self.next_wall - time.monotonic())
                ready, _w, _x = select.select([fd], [], [], timeout)
                if ready:
                    data = os.read(fd, CHUNK)
                    if not data:
                        dig.end()
                        return
                    dig.feed(data)
                if time.monotonic() >= self.next_wall:
                    self.next_wall += self.interval_ns / 1e9
                    if self.next_wall < time.monotonic():  # we fell behind: skip, don't burst
                        self.next_wall = time.monotonic() + self.interval_ns / 1e9
                    self.tick()
        finally:
            if fp is not sys.stdin.buffer:
                fp.close()

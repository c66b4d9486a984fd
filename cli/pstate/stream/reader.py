"""The one reader of pstate's JSON-lines event format.

Every command that reads recordings (stats, heat, heat --live, replay,
export) reads them through a StreamReader, so one set of rules holds
everywhere:

- input comes in chunks of any size and is cut into lines at "\\n";
- a UTF-8 byte order mark at the very start of a source is dropped (some
  editors write one; the meta line behind it is kept);
- NUL bytes at the start of a source (a file cut while being written, as
  log rotation with copytruncate leaves it) are counted and reported in
  ReadStats.nul_starts, and the records after them are read;
- a line longer than max_line bytes (its newline not counted) is skipped and
  counted without being held in memory;
- a blank line (only whitespace) is neither a record nor an error;
- a line that is not JSON, or not a usable record (streamio.check_record),
  is skipped and counted under its reason; with strict it raises LineError;
- a last line without a newline is a record when it parses and checks;
  otherwise it is reported as the truncated final record (strict: an error);
- meta, loss and end records are noted in the ReadStats (ReadStats.note): a
  meta record of a newer schema raises PstateError (exit 65);
- a record type this pstate does not know (schema.KNOWN_TYPES) is skipped
  quietly and counted in ReadStats.unknown, never a bad line;
- a record out of order is read, and counted in ReadStats.out_of_order
  (strict: the report's exit code is 65). The rule (streamio.CpuOrder):
  only records that carry a cpu count, the events (state, fork, exec,
  exit); within a recording (from one meta record to the next, across the
  sources read one after another), one whose ts is lower than that of the
  record before it with the same cpu is out of order; equal ts are not. The
  lines heat --live passes over unparsed (k > 1) are not checked.
- with a filter (stream.filters.Filter, the options record takes), only
  the event records it passes come out (other records all do), and each
  meta record comes out with the read_filter_* fields of the filter; the
  bulk reader is used only when it applies the same filter (the native
  Digester of stats), else every line takes the careful path.

What comes out, in input order, goes to a sink with two methods:

- sink.rows(rows): plain state records as state rows, tuples of ROW_FIELDS
  (ts, pid, tid, comm, from, to, dur_ns, cpu, weight, cgroup, steal_irq_ns);
  comm, dur_ns, cgroup and steal_irq_ns are None when null or absent,
  weight is 1 (k when sampling keeps 1 line in k);
  wide rows (wide=True, for the trace export) go on with the fields of
  WIDE_FIELDS (cause, prio, next_tid, prev_tid, kstate, target_cpu, waker),
  each as orjson read it, None when null or absent;
- sink.record(rec, weight): every other usable record of a known type, as
  the dict orjson made of it (lifecycle, meta, loss, end, rate, annotations);
- with lines=True (replay, which writes the lines it passes unchanged), the
  sink's line(rec, line) instead of record(): line is the record's bytes
  with a newline at the end (added to a last line that had none);
  with unknown=True, records of types this pstate does not know go to the
  sink too (counted all the same).

Two paths, one result. The careful path parses every line with orjson and
checks it with check_record. The fast path is a bulk reader, a callable
fast(buf, pos, end, n) -> (stop, lines, records) that takes the plainly
written state records among the lines of buf[pos:end] in one go (from line
n + 1 on) and stops where it meets a line it is not sure about; that line
takes the careful path, then the bulk reader goes on after it. The bulk
readers are in C (pstate._digest): Digester, which sums the rows up for
stats (timeinstate.Aggregator.add_digested), parse_states, which hands them
out as rows (native_rows=True: heat, heat --live, export; replay's filters,
window and pacing), and plain_states, which only finds them (replay copies
their lines). A bulk reader notes the ts of the records it takes in the
reader's CpuOrder (ReadStats.order), which the reader binds for the call
(pstate._digest.bind_order), and leaves to the careful path a record it
cannot place there: the first on a CPU before any meta record, the first
out of order, one on a CPU beyond ORDER_CPUS. PSTATE_PURE=1 leaves every
line to the careful path; the tests hold the two paths to the same rows,
records, counts, errors and output.

Memory is bounded by max_line (a longer line is dropped as it comes),
whatever the source: compressed input comes in bounded pieces
(stream.compression).
"""

from __future__ import annotations

import orjson

from pstate import native
from pstate.stream import schema
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.streamio import (BOM, CPU_TYPES, MAX_LINE, ReadStats, note_damage, open_input, plain_state_ok,
                                    record_problem)

CHUNK = 1 << 16  # bytes per read: read1() drains a pipe in big reads

ROW_FIELDS = ("ts", "pid", "tid", "comm", "from", "to", "dur_ns", "cpu", "weight", "cgroup", "steal_irq_ns")
WIDE_FIELDS = ("cause", "prio", "next_tid", "prev_tid", "kstate", "target_cpu", "waker")
# The native row reader (None when not built or PSTATE_PURE=1).
_parse_states = getattr(native.load("_digest"), "parse_states", None)
# The binding of a reader's CpuOrder for the native bulk readers it calls.
_bind_order = getattr(native.load("_digest"), "bind_order", None)
# Sampling (heat --live) may pass over transitions into these states, which
# are the bulk of a stream, recognised by their bytes without parsing.
_TO = b'"to":"'
_FREQUENT = frozenset({b"run", b"sle", b"pre"})  # running, runnable, sleeping, preempted
_NOTED = frozenset(("meta", "loss", "end"))  # what ReadStats.note takes note of


class LineError(PstateError):
    """A bad line under --strict, with its place kept apart so that a part of
    a file read on its own can be renumbered."""

    def __init__(self, name: str, lineno: int, why: str):
        super().__init__(f"{name}:{lineno}: {why}", ExitCode.DATAERR)
        self.name, self.lineno, self.why = name, lineno, why


def state_row(rec: dict, weight: int = 1, wide: bool = False) -> tuple:
    """The state row of a checked state record (wide: with WIDE_FIELDS); a
    steal_irq_ns that is not an int is None, as the native reader has it."""
    g = rec.get
    steal = g("steal_irq_ns")
    if type(steal) is not int:
        steal = None
    if wide:
        return (rec["ts"], rec["pid"], rec["tid"], g("comm"), rec["from"], rec["to"], g("dur_ns"), rec["cpu"],
                weight, g("cgroup"), steal, g("cause"), g("prio"), g("next_tid"), g("prev_tid"),
                g("kstate"), g("target_cpu"), g("waker"))
    return (rec["ts"], rec["pid"], rec["tid"], g("comm"), rec["from"], rec["to"], g("dur_ns"), rec["cpu"], weight,
            g("cgroup"), steal)


def overlong(max_line: int) -> str:
    return f"line longer than {max_line} bytes"


def stop_before(keys: tuple, bulk):
    """A bulk reader for reader.StreamReader (fast) that leaves every line
    holding one of keys (bytes) to the careful path: bulk(buf, pos, end, n)
    is given the lines before the first such line only. Where each key
    next occurs in a buffer is remembered, so a buffer is searched once per
    key and occurrence, not once per call."""
    if not keys:
        return bulk
    seen = [None, -1, {}]  # the buffer, its end, key -> next occurrence (-1: none up to end)

    def fast(buf, pos, end, n):
        if seen[0] is not buf or seen[1] != end:
            seen[0], seen[1], seen[2] = buf, end, {}
        nxt = seen[2]
        cut = end
        for k in keys:
            r = nxt.get(k)
            if r is None or 0 <= r < pos:
                r = nxt[k] = buf.find(k, pos, end)
            if 0 <= r < cut:
                cut = r
        if cut < end:
            end = buf.rfind(b"\n", pos, cut)
            if end < 0:  # the first line: the careful path's
                return pos, 0, 0
        return bulk(buf, pos, end, n)

    return fast



class StreamReader:
    """Cuts byte chunks into lines, checks them and hands rows and records to
    a sink; see the module docstring for the rules.

    begin(name) starts a source (at_start=False for a part of a file that
    does not start at its first byte), feed(data) as often as data comes,
    end() at its end. k > 1 (heat --live, when busy): a transition into
    running, runnable, sleeping or preempted on a line whose number is not a
    multiple of k is passed over unparsed, and one that is kept weighs k.
    dicts: state records go to sink.record as the dicts they were parsed
    into, like every other record (read_records; the careful path only).
    native_rows: the bulk reader is the native row reader (parse_states),
    when built, handing its rows to sink.rows; wide: wide rows.
    careful_keys: lines holding one of these (bytes, e.g. b'"reason":')
    are left to the careful path by the bulk reader (stop_before): for a
    sink that wants what a row lacks. filt: only the events it passes;
    the bulk reader fast is then used only when it applies the filter
    itself (fast_filters: the native Digester's set_filter).
    """

    def __init__(self, sink, stats: ReadStats, *, strict: bool = False, max_line: int = MAX_LINE, fast=None,
                 dicts: bool = False, native_rows: bool = False, wide: bool = False, lines: bool = False,
                 unknown: bool = False, careful_keys: tuple = (), filt=None, fast_filters: bool = False):
        self.sink = sink
        self.filt = filt if filt is not None and filt.active else None
        if self.filt is not None and not fast_filters:
            fast, native_rows = None, False  # the row readers do not filter
        self.dicts = dicts or lines  # state records to the sink as dicts too (read_records, replay)
        self.wide = wide
        self.lines = lines
        self.unknown = unknown
        self.stats = stats
        self.strict = strict
        self.max_line = max_line
        if native_rows and fast is None and _parse_states is not None:
            fast = self._native_rows
        if fast is not None and careful_keys:
            fast = stop_before(tuple(careful_keys), fast)
        self.fast = fast
        self.k = 1
        self.name = "<stdin>"
        self._rows: list = []
        self._reset(True)

    def _native_rows(self, buf: bytes, pos: int, end: int, n: int):
        stop, lines, rows = _parse_states(buf, pos, end, self.max_line, self.k, n, self.wide)
        if rows:
            self.sink.rows(rows)
        return stop, lines, len(rows)

    def _reset(self, at_start: bool) -> None:
        self.lineno = 0
        self.offset = 0  # bytes consumed before self.pending
        self.pending = b""
        self.discarding = False  # inside an over-long line
        self.at_start = at_start  # a byte order mark may come first
        self.nuls = -1  # >= 0: inside the NUL bytes a source starts with
        self.earlier_tail = self.stats.truncated_tail  # an earlier source's cut stays reported

    def begin(self, name: str, at_start: bool = True) -> None:
        self.name = name
        self._reset(at_start)

    # --- framing ------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        if not data:
            return
        if self.at_start:
            if self.pending or len(data) < len(BOM):
                data = self.pending + data
                self.pending = b""
                if len(data) < len(BOM) and BOM.startswith(data):
                    self.pending = data  # too early to tell
                    return
            self.at_start = False
            if data.startswith(BOM):
                data = data[len(BOM):]
                self.offset += len(BOM)
            self.nuls = 0 if data[:1] == b"\0" else -1
        if self.nuls >= 0:
            # A file cut while being written (copytruncate) starts with a hole
            # of NUL bytes: count them, read what follows.
            rest = data.lstrip(b"\0")
            self.nuls += len(data) - len(rest)
            self.offset += len(data) - len(rest)
            if not rest:
                return
            self.stats.nul_starts.append((self.name, self.nuls))
            self.nuls = -1
            data = rest
        if self.discarding:
            nl = data.find(b"\n")
            if nl < 0:
                self.offset += len(data)
                return
            self.offset += nl + 1
            self.discarding = False
            data = data[nl + 1:]
        start = 0
        if self.pending:
            nl = data.find(b"\n")
            if nl < 0:
                self._hold(self.pending + data)
                return
            line = self.pending + data[:nl + 1]
            self.pending = b""
            self.offset += len(line)
            self._run(line, 0, len(line) - 1)
            start = nl + 1
        cut = data.rfind(b"\n", start)
        if cut < 0:
            self._hold(data[start:])
            return
        self.offset += cut + 1 - start
        self._run(data, start, cut)
        self._hold(data[cut + 1:])

    def _hold(self, rest: bytes) -> None:
        if len(rest) > self.max_line:
            # An over-long line: count it now, drop its bytes until the newline.
            self.lineno += 1
            self.stats.lines += 1
            self._bad(overlong(self.max_line), self.lineno)
            self.offset += len(rest)
            self.pending = b""
            self.discarding = True
        else:
            self.pending = rest

    def end(self) -> None:
        """End of the current source: a last line without a newline."""
        rest = self.pending
        self.pending = b""
        self.at_start = False
        if self.nuls > 0:  # nothing but NUL bytes
            self.stats.nul_starts.append((self.name, self.nuls))
        self.nuls = -1
        if self.discarding or not rest:
            self.discarding = False
            return
        self.stats.truncated_tail = f"{self.name}: byte {self.offset}, line {self.lineno + 1}"
        self.lineno += 1
        self.stats.lines += 1
        self._line(rest, self.lineno, False)
        self._flush_rows()

    def _run(self, buf: bytes, pos: int, end: int) -> None:
        """The lines of buf[pos:end] (cut at "\\n" as bytes.split cuts them;
        buf[end] is the newline of the last one)."""
        fast = self.fast
        stats = self.stats
        max_line = self.max_line
        while True:
            if fast is not None:
                self._flush_rows()
                if _bind_order is not None:
                    prev = _bind_order(stats.order.table)  # what the bulk reader takes, it notes there
                    try:
                        pos, lines, records = fast(buf, pos, end, self.lineno)
                    finally:
                        _bind_order(prev)
                else:
                    pos, lines, records = fast(buf, pos, end, self.lineno)
                self.lineno += lines
                stats.lines += lines
                stats.records += records
                if pos > end:
                    return
            nl = buf.find(b"\n", pos, end)
            stop = end if nl < 0 else nl
            self.lineno += 1
            stats.lines += 1
            if stop - pos > max_line:
                self._bad(overlong(max_line), self.lineno)
            else:
                self._line(buf[pos:stop + 1], self.lineno, True)  # (with its newline)
            pos = stop + 1
            if pos > end:
                self._flush_rows()
                return

    # --- the careful path -----------------------------------------------------

    def _line(self, line: bytes, lineno: int, terminated: bool) -> None:
        weight = 1
        k = self.k
        if k > 1:
            p = line.find(_TO)
            if p >= 0 and line[p + 6:p + 9] in _FREQUENT:
                if lineno % k:
                    return
                weight = k
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            if not line.strip():
                return  # a blank line: no record and no error
            if terminated:
                self._bad("not valid JSON", lineno)
            elif self.strict:
                self._flush_rows()
                raise LineError(self.name, lineno, "truncated record") from None
            return  # (unterminated: reported as the truncated final record)
        if not (type(rec) is dict and rec.get("type") == "state" and plain_state_ok(rec)):
            why = record_problem(rec)  # (check_record, its quick accept done here)
            if why:
                self._bad(why, lineno)
                return
        stats = self.stats
        if not terminated:
            stats.truncated_tail = self.earlier_tail  # the last line was complete after all
        stats.records += 1
        t = rec["type"]
        if t in CPU_TYPES:
            stats.order.note(rec["cpu"], rec["ts"], self.name, lineno)
        filt = self.filt
        if t == "state":
            if filt is not None and not filt.match_state(rec["pid"], rec["tid"], rec.get("comm"), rec["cpu"],
                                                         rec["from"], rec["to"], rec.get("dur_ns"), rec.get("cgroup")):
                return
            if not self.dicts:
                self._rows.append(state_row(rec, weight, self.wide))
                return
        else:  # (with dicts, rows are never held back)
            if t not in schema.KNOWN_TYPES:
                stats.unknown[t] = stats.unknown.get(t, 0) + 1
                if not self.unknown:
                    return
            if filt is not None:
                if t == "meta":
                    rec.update(filt.read_fields())
                elif t in ("process", "cgroup"):
                    filt.note(rec)  # (--cgroup, --title)
                elif not filt.match(rec):
                    return
            if self._rows:
                self._flush_rows()
            if t in _NOTED:
                stats.note(rec, self.name)
        if self.lines:
            self.sink.line(rec, line if terminated else line + b"\n")
        else:
            self.sink.record(rec, weight)

    def _flush_rows(self) -> None:
        if self._rows:
            rows, self._rows = self._rows, []
            self.sink.rows(rows)

    def _bad(self, why: str, lineno: int) -> None:
        if self.strict:
            self._flush_rows()  # the sink has what came before the bad line
            raise LineError(self.name, lineno, why)
        self.stats.skip(why, f"{self.name}:{lineno}")


class RecordList:
    """A sink that keeps what a StreamReader hands out as dicts, in order
    (state rows as state records with the fields of ROW_FIELDS but weight)."""

    def __init__(self):
        self.out: list = []

    def rows(self, rows: list) -> None:
        add = self.out.append
        for ts, pid, tid, comm, frm, to, dur, cpu, _w, cg, _steal in rows:
            add({"type": "state", "ts": ts, "cpu": cpu, "pid": pid, "tid": tid, "comm": comm, "from": frm,
                 "to": to, "dur_ns": dur, "cgroup": cg})

    def record(self, rec: dict, weight: int) -> None:
        self.out.append(rec)


class _Collect:
    def __init__(self, types):
        self.types = types
        self.out: list = []

    def record(self, rec: dict, weight: int) -> None:
        if self.types is None or rec["type"] in self.types:
            self.out.append(rec)

    def take(self) -> list:
        out, self.out = self.out, []
        return out


def feed_sources(rd: StreamReader, sources, stats: ReadStats):
    """Read files (or "-" for stdin), in order, into rd: each one begun,
    fed in chunks and ended, its compression damage noted in stats. A
    generator: it yields after every chunk and at the end of every source,
    so that the caller can pass on what the sink has by then."""
    import sys

    for src in sources:
        name = "<stdin>" if src == "-" else src
        fp = open_input(src)
        try:
            rd.begin(name)
            read = getattr(fp, "read1", None) or fp.read
            while True:
                data = read(CHUNK)
                if not data:
                    break
                rd.feed(data)
                yield
            rd.end()
            note_damage(fp, name, stats)
            yield
        finally:
            if fp is not sys.stdin.buffer:
                fp.close()


def read_records(sources, stats: ReadStats | None = None, *, max_line: int = MAX_LINE, strict: bool = False,
                 types: frozenset | None = None, filt=None):
    """Yield the usable records of files (or "-" for stdin), in order, as
    dicts: the careful path of a StreamReader, for readers that want whole
    records (types: only these; filt: only the events it passes). meta, loss and end records are also noted
    in stats; a newer schema raises PstateError; with strict, so does the
    first bad line (LineError)."""
    stats = stats if stats is not None else ReadStats()
    sink = _Collect(types)
    rd = StreamReader(sink, stats, strict=strict, max_line=max_line, dicts=True, filt=filt)
    for _ in feed_sources(rd, sources, stats):
        if sink.out:
            yield from sink.take()

"""The one reader of pstate's JSON-lines event format.

Every command that reads recordings (stats, heat, replay's checks) reads them
through a StreamReader, so one set of rules holds everywhere:

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
  quietly and counted in ReadStats.unknown, never a bad line.
- with a filter (stream.filters.Filter, the options record takes), only
  the event records it passes come out (other records all do), and each
  meta record comes out with the read_filter_* fields of the filter; the
  bulk reader is not used (every line takes the careful path).

What comes out, in input order, goes to a sink with two methods:

- sink.rows(rows): plain state records as state rows, tuples of ROW_FIELDS
  (ts, pid, tid, comm, from, to, dur_ns, cpu, weight); comm and dur_ns are
  None when null or absent, weight is 1 (k when sampling keeps 1 line in k);
- sink.record(rec, weight): every other usable record of a known type, as
  the dict orjson made of it (lifecycle, meta, loss, end, rate, annotations).

Two paths, one result. The careful path parses every line with orjson and
checks it with check_record. The fast path is a bulk reader, a callable
fast(buf, pos, end, n) -> (stop, lines, records) that takes the plainly
written state records among the lines of buf[pos:end] in one go (from line
n + 1 on) and stops where it meets a line it is not sure about; that line
takes the careful path, then the bulk reader goes on after it. The bulk
readers are in C (pstate._digest): Digester, which sums the rows up for
stats (timeinstate.Aggregator.add_digested), and parse_states, which hands them out
as rows (heat --live). PSTATE_PURE=1 leaves every line to the careful path;
the tests hold the two paths to the same rows, records, counts and errors.
"""

from __future__ import annotations

import orjson

from pstate.stream import schema
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.streamio import BOM, MAX_LINE, ReadStats, check_record, note_damage, open_input

CHUNK = 1 << 16  # bytes per read: read1() drains a pipe in big reads

ROW_FIELDS = ("ts", "pid", "tid", "comm", "from", "to", "dur_ns", "cpu", "weight")
# Sampling (heat --live) may pass over transitions into these states, which
# are the bulk of a stream, recognised by their bytes without parsing.
_TO = b'"to":"'
_FREQUENT = frozenset({b"run", b"sle", b"pre"})  # running, runnable, sleeping, preempted


class LineError(PstateError):
    """A bad line under --strict, with its place kept apart so that a part of
    a file read on its own can be renumbered."""

    def __init__(self, name: str, lineno: int, why: str):
        super().__init__(f"{name}:{lineno}: {why}", ExitCode.DATAERR)
        self.name, self.lineno, self.why = name, lineno, why


def state_row(rec: dict, weight: int = 1) -> tuple:
    """The state row of a checked state record."""
    return (rec["ts"], rec["pid"], rec["tid"], rec.get("comm"), rec["from"], rec["to"], rec.get("dur_ns"),
            rec["cpu"], weight)


def overlong(max_line: int) -> str:
    return f"line longer than {max_line} bytes"


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
    """

    def __init__(self, sink, stats: ReadStats, *, strict: bool = False, max_line: int = MAX_LINE, fast=None,
                 dicts: bool = False, filt=None):
        self.sink = sink
        self.filt = filt if filt is not None and filt.active else None
        if self.filt is not None:
            fast = None  # the bulk readers do not filter
        self.dicts = dicts  # state records to sink.record as dicts too (read_records)
        self.stats = stats
        self.strict = strict
        self.max_line = max_line
        self.fast = fast
        self.k = 1
        self.name = "<stdin>"
        self._rows: list = []
        self._reset(True)

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
                self._line(buf[pos:stop], self.lineno, True)
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
        if not line.strip():
            return
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            if terminated:
                self._bad("not valid JSON", lineno)
            elif self.strict:
                self._flush_rows()
                raise LineError(self.name, lineno, "truncated record") from None
            return  # (unterminated: reported as the truncated final record)
        why = check_record(rec)
        if why:
            self._bad(why, lineno)
            return
        stats = self.stats
        if not terminated:
            stats.truncated_tail = self.earlier_tail  # the last line was complete after all
        stats.records += 1
        t = rec["type"]
        filt = self.filt
        if t == "state" and not self.dicts:
            if filt is None or filt.match_state(rec["pid"], rec["tid"], rec.get("comm"), rec["cpu"], rec["from"],
                                                rec["to"], rec.get("dur_ns")):
                self._rows.append(state_row(rec, weight))
            return
        if t not in schema.KNOWN_TYPES:
            stats.unknown[t] = stats.unknown.get(t, 0) + 1
            return
        if filt is not None:
            if t == "meta":
                rec.update(filt.read_fields())
            elif t in ("process", "cgroup"):
                filt.note(rec)  # (--cgroup, --title)
            elif not filt.match(rec):
                return
        self._flush_rows()
        stats.note(rec, self.name)
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
        for ts, pid, tid, comm, frm, to, dur, cpu, _w in rows:
            add({"type": "state", "ts": ts, "cpu": cpu, "pid": pid, "tid": tid, "comm": comm, "from": frm,
                 "to": to, "dur_ns": dur})

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


def read_records(sources, stats: ReadStats | None = None, *, max_line: int = MAX_LINE, strict: bool = False,
                 types: frozenset | None = None, filt=None):
    """Yield the usable records of files (or "-" for stdin), in order, as
    dicts: the careful path of a StreamReader, for readers that want whole
    records (types: only these; filt: only the events it passes). meta, loss and end records are also noted
    in stats; a newer schema raises PstateError; with strict, so does the
    first bad line (LineError)."""
    import sys

    stats = stats if stats is not None else ReadStats()
    sink = _Collect(types)
    rd = StreamReader(sink, stats, strict=strict, max_line=max_line, dicts=True, filt=filt)
    for src in sources:
        fp = open_input(src)
        try:
            rd.begin("<stdin>" if src == "-" else src)
            read = getattr(fp, "read1", None) or fp.read
            while True:
                data = read(CHUNK)
                if not data:
                    break
                rd.feed(data)
                if sink.out:
                    yield from sink.take()
            rd.end()
            note_damage(fp, "<stdin>" if src == "-" else src, stats)
            yield from sink.take()
        finally:
            if fp is not sys.stdin.buffer:
                fp.close()

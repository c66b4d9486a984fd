"""Reading and writing pstate JSON-lines streams: what a reader saw
(ReadStats), the check of one record (check_record), opening inputs, and the
writer.

Readers treat input as untrusted: a malformed, over-long or wrongly typed line
is skipped and counted, never a traceback; a truncated last line is reported;
a stream of a newer schema is refused; records whose ts goes back on their CPU
are counted (CpuOrder). Memory is bounded by the line limit, and compressed
input by the bounds of pstate.stream.compression. The one reader that applies
these rules is reader.StreamReader.
"""

from __future__ import annotations

import io
import os
import stat as _stat
import sys
from dataclasses import dataclass, field
from typing import IO

import orjson

from pstate.stream import schema
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.outfiles import OutputFile, open_output, still_at_path

MAX_LINE = 1 << 20  # bytes; longer lines are skipped without being buffered

_INT_FIELDS = ("ts", "cpu", "pid", "tid")
# Integers in ts, cpu, pid, tid, dur_ns and count must be 0 <= v < 2**63: every
# reader keeps them in int64 arithmetic (arrays, sums, differences), and a
# reader that accepted a value another rejects would disagree on the counts.
MAX_INT = 1 << 63
BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which orjson rejects
# The records that carry a cpu (and a ts): the events. Their order per CPU is checked (CpuOrder).
CPU_TYPES = frozenset(schema.EVENT_TYPES)
ORDER_CPUS = 4096  # CPUs 0..4095 in CpuOrder's table; the native readers leave records of others to Python
_COUNT, _PLACED, _LEAD, _HEAD = 0, 1, 2, 3  # the cells of CpuOrder.table before the last ts per CPU


class CpuOrder:
    """The order of the records a reader read, per CPU.

    The rule: within a recording (from one meta record to the next), a
    record that carries a cpu (CPU_TYPES: state, fork, exec and exit, the
    events; every other record has no cpu, and is not checked) is out of
    order when its ts is lower than that of the record before it with the
    same cpu. Equal ts are in order. Each such record counts once (a record
    far in the future makes only the record after it count, not all that
    follow). Sources read one after another (files, stats -j's parts)
    continue one another: only a meta record starts anew.

    The state is shared by the reader's careful path (note) and its native
    bulk readers (pstate._digest, given table by reader.StreamReader through
    bind_order), so that both count alike: table holds int64 cells, [0]
    the records out of order, [1] 1 once the first of them is placed
    (first: its source and line, which the careful path notes: the native
    readers leave that record to it), [2] 1 until the first meta record,
    then the ts of the last record per CPU below ORDER_CPUS (-1: none since
    the last meta record); big holds the others. lead: the first record on
    each CPU before the first meta record (cpu -> (ts, source, line), noted
    by the careful path too), which a part of a file read on its own
    compares with what came before it (join)."""

    def __init__(self):
        self.table = bytearray(b"\xff" * (8 * (_HEAD + ORDER_CPUS)))
        self._cells = None
        cells = self.cells
        cells[_COUNT] = cells[_PLACED] = 0
        cells[_LEAD] = 1
        self.big: dict = {}
        self.first: tuple | None = None  # (source, line)
        self.lead: dict = {}

    @property
    def cells(self) -> memoryview:
        if self._cells is None:
            self._cells = memoryview(self.table).cast("q")
        return self._cells

    @property
    def count(self) -> int:
        return self.cells[_COUNT]

    def __getstate__(self):  # (stats -j: a part's ReadStats comes back pickled)
        return {"table": bytes(self.table), "big": self.big, "first": self.first, "lead": self.lead}

    def __setstate__(self, state) -> None:
        self.table = bytearray(state["table"])
        self._cells = None
        self.big, self.first, self.lead = state["big"], state["first"], state["lead"]

    def __eq__(self, other) -> bool:
        return isinstance(other, CpuOrder) and self.__getstate__() == other.__getstate__()

    def note(self, cpu: int, ts: int, name: str, line: int) -> None:
        """A record on cpu at ts, at line of name (the careful path)."""
        cells = self.cells
        if cpu < ORDER_CPUS:
            last = cells[_HEAD + cpu]
            cells[_HEAD + cpu] = ts
        else:
            last = self.big.get(cpu, -1)
            self.big[cpu] = ts
        if last < 0:
            if cells[_LEAD] and cpu not in self.lead:
                self.lead[cpu] = (ts, name, line)
        elif ts < last:
            cells[_COUNT] += 1
            if not cells[_PLACED]:
                cells[_PLACED] = 1
                self.first = (name, line)

    def reset(self) -> None:
        """A meta record: a recording starts."""
        self.table[8 * _HEAD:] = b"\xff" * (8 * ORDER_CPUS)
        self.big.clear()
        self.cells[_LEAD] = 0

    def _last(self, cpu: int) -> int:
        return self.cells[_HEAD + cpu] if cpu < ORDER_CPUS else self.big.get(cpu, -1)

    def join(self, part: "CpuOrder", line_base: int) -> None:
        """What a part of the input read on its own (stats -j) saw, after
        everything read here: its records out of order, and its first
        record on each CPU (before any meta record in it) against the last
        one here; line_base: the lines read before the part."""
        cells, pcells = self.cells, part.cells
        firsts = [(part.first[1] + line_base, part.first[0])] if part.first else []
        for cpu, (ts, name, line) in sorted(part.lead.items(), key=lambda kv: kv[1][2]):
            last = self._last(cpu)
            if last >= 0 and ts < last:
                cells[_COUNT] += 1
                firsts.append((line + line_base, name))
            if cells[_LEAD] and cpu not in self.lead:
                self.lead[cpu] = (ts, name, line + line_base)
        cells[_COUNT] += pcells[_COUNT]
        if firsts and not cells[_PLACED]:
            line, name = min(firsts)
            self.first = (name, line)
            cells[_PLACED] = 1
        if not pcells[_LEAD]:  # the part read a meta record: its recording is the one going on
            self.table[8 * _HEAD:] = part.table[8 * _HEAD:]
            self.big = dict(part.big)
            cells[_LEAD] = 0
        else:
            for cpu in range(ORDER_CPUS):
                ts = pcells[_HEAD + cpu]
                if ts >= 0:
                    cells[_HEAD + cpu] = ts
            self.big.update(part.big)


class _OrderSince:
    """The records out of order since a mark (ReadStats.since)."""

    def __init__(self, count: int, first: tuple | None):
        self.count, self.first = count, first


@dataclass
class ReadStats:
    """What a reader saw and skipped, for the end-of-run report."""

    lines: int = 0
    records: int = 0
    skipped: dict = field(default_factory=dict)  # reason -> count
    first_bad: dict = field(default_factory=dict)  # reason -> "file:line"
    truncated_tail: str | None = None  # "file: byte N" when the last line had no newline
    metas: list = field(default_factory=list)
    loss: dict = field(default_factory=dict)  # reason -> count, from in-band loss records
    ends: list = field(default_factory=list)
    unknown: dict = field(default_factory=dict)  # record type -> count, of types this pstate does not know
    nul_starts: list = field(default_factory=list)  # (source, NUL bytes) of sources that start with NULs
    overlaps: list = field(default_factory=list)  # "where": meta records of a recording read already
    # [boot_id, meta ts, end ts, where, overlapped] per meta record read; the
    # ts of an end record read before any meta (a part of a file: the end of
    # a recording whose meta an earlier part read)
    _spans: list = field(default_factory=list, repr=False, compare=False)
    _lead_end: int | None = field(default=None, repr=False, compare=False)
    order: CpuOrder = field(default_factory=CpuOrder, repr=False)  # ts per CPU (out_of_order)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1
        self.first_bad.setdefault(reason, where)

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())

    @property
    def out_of_order(self) -> int:
        """Records whose ts goes back on their CPU (CpuOrder has the rule)."""
        return self.order.count

    def note(self, rec: dict, name: str) -> str:
        """Collect a valid record's meta, loss and end information; return its type.

        A meta record of a newer schema raises PstateError (exit 65).
        """
        t = rec["type"]
        if t == "meta":
            check_schema(rec, name)
            self.metas.append(rec)
            self._overlap(rec, name)
            self.order.reset()
        elif t == "loss":
            r = rec["reason"]
            self.loss[r] = self.loss.get(r, 0) + rec["count"]
        elif t == "end":
            self.ends.append(rec)
            self._end_span(rec.get("ts"))
        return t

    def _end_span(self, ts) -> None:
        if type(ts) is not int:
            return
        if self._spans:
            if self._spans[-1][2] is None:
                self._spans[-1][2] = ts
        elif self._lead_end is None:
            self._lead_end = ts

    def _overlaps(self, boot: str, ts: int) -> bool:
        return any(b == boot and start <= ts <= (end if end is not None else start)
                   for b, start, end, _where, _hit in self._spans)

    def _overlap(self, meta: dict, name: str) -> None:
        """A meta record of the same boot whose time falls inside a recording
        read before (`cat rec rec | pstate stats`): its events would count twice."""
        boot, ts = meta.get("boot_id"), meta.get("ts")
        if type(boot) is not str or type(ts) is not int:
            return
        hit = self._overlaps(boot, ts)
        if hit:
            self.overlaps.append(name)
        self._spans.append([boot, ts, None, name, hit])

    def join_spans(self, part: "ReadStats") -> None:
        """The recordings a part of the input read on its own saw (a file
        read in parts, stats -j), after everything read here: a recording
        it read that overlaps one read here is noted as an overlap, as it is
        when one reader reads both (the part's own overlaps are its own);
        so are its records out of order, and its first record on each CPU
        that goes back from the last one here (CpuOrder.join). The part's
        lines are counted in lines already (ingest.merge_read_stats adds
        them first): they are the ones after line_base."""
        self.order.join(part.order, self.lines - part.lines)
        self._end_span(part._lead_end)
        for boot, ts, end, where, hit in part._spans:
            if not hit and self._overlaps(boot, ts):
                hit = True
                self.overlaps.append(where)
            self._spans.append([boot, ts, end, where, hit])

    @property
    def lost(self) -> int:
        return sum(self.loss.values())

    def mark(self) -> dict:
        """The counts so far, for since()."""
        return {"skipped": dict(self.skipped), "loss": dict(self.loss), "out_of_order": self.out_of_order}

    def since(self, mark: dict) -> "ReadStats":
        """What was skipped and lost, and the records out of order, after
        mark() (stats --interval: per interval, like its events); lines and
        records read, meta and end records, the truncated tail and damaged
        starts as they are."""
        def minus(now: dict, then: dict) -> dict:
            return {k: n - then.get(k, 0) for k, n in now.items() if n - then.get(k, 0)}

        view = ReadStats(**{f: getattr(self, f) for f in ("lines", "records", "metas", "ends", "unknown",
                                                          "nul_starts", "overlaps", "truncated_tail",
                                                          "first_bad")})
        view.skipped = minus(self.skipped, mark["skipped"])
        view.loss = minus(self.loss, mark["loss"])
        view.order = _OrderSince(self.out_of_order - mark["out_of_order"], self.order.first)
        return view

    def problems(self) -> list[str]:
        out = []
        for reason, n in sorted(self.skipped.items()):
            out.append(f"skipped {n} line{'s' if n != 1 else ''}: {reason} (first at {self.first_bad[reason]})")
        if self.truncated_tail:
            out.append(f"truncated final record at {self.truncated_tail}")
        n = self.order.count
        if n:
            name, line = self.order.first or ("?", "?")
            out.append(f"{n} record{'s' if n != 1 else ''} out of order: a ts lower than that of the record "
                       f"before it on the same CPU (first at {name}:{line})")
        if self.overlaps:
            out.append(f"{self.overlaps[0]}: a recording of the same boot overlaps one read before it "
                       "(the same recording twice?); its events count twice: give each recording once")
        for name, n in self.nul_starts:
            out.append(f"{name} starts with {n} NUL bytes{'' if self.metas else ' and has no meta record'}: "
                       "it was cut while being written (log rotation with copytruncate?); "
                       "the records after them were read")
        return out

    @property
    def no_record(self) -> bool:
        """Input that is not empty yet holds not one usable record (blank
        lines alone are empty input)."""
        return not self.records and bool(self.skipped or self.truncated_tail or self.nul_starts)

    def report(self, prog: str, err: IO[str] | None = None, strict: bool = False, lost: bool = True) -> int:
        """Print skipped/truncated input on stderr; return the exit code it
        deserves. lost False: no word of the input's loss records (replay
        passes them on to the reader after it)."""
        err = err or sys.stderr
        problems = self.problems()
        for p in problems:
            print(f"{prog}: warning: {p}", file=err)
        if lost and self.lost:
            print(f"{prog}: warning: the input reports {self.lost} lost events; results are incomplete", file=err)
        if self.no_record:
            print(f"{prog}: error: not one valid record in the input: is it a recording of pstate record "
                  "(JSON lines, see pstate-events(5))?", file=err)
            return int(ExitCode.DATAERR)
        return int(ExitCode.DATAERR) if (strict and problems) else int(ExitCode.OK)


def open_input(path: str, decompress: bool = True) -> IO[bytes]:
    """A source to read: a file or "-" (standard input), decompressed when
    its first bytes say zstd or gzip (pstate.stream.compression). decompress False
    (readers that select() on the descriptor and read it directly): the
    source as it is, nothing read from it yet."""
    if path == "-":
        return _decompressed(sys.stdin.buffer, "<stdin>") if decompress else sys.stdin.buffer
    try:
        st = os.stat(path)
    except OSError as e:
        raise PstateError(f"cannot open {path}: {e.strerror}", ExitCode.NOINPUT) from None
    if _stat.S_ISDIR(st.st_mode):
        raise PstateError(f"{path} is a directory", ExitCode.NOINPUT)
    if not (_stat.S_ISREG(st.st_mode) or _stat.S_ISFIFO(st.st_mode)):
        # /dev/zero and friends would never end.
        raise PstateError(f"{path} is not a regular file or a pipe", ExitCode.NOINPUT)
    try:
        fp = open(path, "rb")
    except OSError as e:
        raise PstateError(f"cannot open {path}: {e.strerror}", ExitCode.NOINPUT) from None
    return _decompressed(fp, path) if decompress else fp


def _decompressed(fp, name: str):
    """fp, or a reader of its decompressed bytes. A regular file is looked at
    without moving its offset; a pipe through its buffer (peek), so readers
    take its bytes with read() or read1(), never from the raw file under it."""
    from pstate.stream.compression import open_decompressed, sniff

    try:
        try:
            fd = fp.fileno()
        except (OSError, ValueError, io.UnsupportedOperation):
            fd = None  # an in-memory stream (tests): peek() serves
        if fd is not None and _stat.S_ISREG(os.fstat(fd).st_mode):
            if not sniff(os.pread(fd, 4, 0)):
                return fp
        return open_decompressed(fp, name)[0]
    except BaseException:
        if fp is not sys.stdin.buffer:
            fp.close()
        raise


def note_damage(fp, name: str, stats: "ReadStats") -> None:
    """After a source was read to its end: a compressed stream that was cut
    short or corrupt is reported like a truncated file."""
    damage = getattr(fp, "damage", None)
    if damage:
        what = "cut short" if damage == "truncated" else damage
        stats.truncated_tail = f"{name} (the compressed data is {what}: read up to there)"


def _valid_int(v) -> bool:
    return type(v) is int and 0 <= v < MAX_INT


def plain_state_ok(rec: dict) -> bool:
    """check_record's quick accept of a state record as pstate writes it:
    True only when the full checks accept it too (tests hold it to that)."""
    g = rec.get
    ts, cpu, pid, tid, d, c = g("ts"), g("cpu"), g("pid"), g("tid"), g("dur_ns"), g("comm")
    # For ints, the OR is >= 0 and < 2**63 exactly when each of them is.
    return (type(ts) is int and type(cpu) is int and type(pid) is int and type(tid) is int
            and 0 <= (ts | cpu | pid | tid) < MAX_INT and type(g("from")) is str and type(g("to")) is str
            and (d is None or (type(d) is int and 0 <= d < MAX_INT)) and (c is None or type(c) is str))


def check_record(rec) -> str | None:
    """Return why a parsed line is not a usable record, or None when it is."""
    if type(rec) is dict and rec.get("type") == "state" and plain_state_ok(rec):
        return None
    return record_problem(rec)


def record_problem(rec) -> str | None:
    """check_record without its quick accept: every check, one by one."""
    if type(rec) is not dict:
        return "not a JSON object"
    t = rec.get("type")
    if type(t) is not str:
        return "no string \"type\" field"
    if t == "meta":
        v = rec.get("schema")
        if type(v) is not int:
            return "meta record without an integer schema"
        return None
    if t in schema.EVENT_TYPES:
        g = rec.get
        ts, cpu, pid, tid = g("ts"), g("cpu"), g("pid"), g("tid")
        # the common case in one test (bool is not int here: type() is exact)
        if not (type(ts) is int and type(cpu) is int and type(pid) is int and type(tid) is int
                and 0 <= ts < MAX_INT and 0 <= cpu < MAX_INT and 0 <= pid < MAX_INT and 0 <= tid < MAX_INT):
            for f in _INT_FIELDS:
                if not _valid_int(rec.get(f)):
                    return f"bad or missing \"{f}\""
        c = rec.get("comm")
        if c is not None and type(c) is not str:
            return "bad \"comm\""
        if t == "state":
            if type(rec.get("from")) is not str or type(rec.get("to")) is not str:
                return "bad \"from\"/\"to\""
            d = rec.get("dur_ns")
            if d is not None and not _valid_int(d):
                return "bad \"dur_ns\""
        return None
    if t == "loss":
        if type(rec.get("reason")) is not str or not _valid_int(rec.get("count")):
            return "bad loss record"
        return None
    return None  # end, rate and unknown future types pass through


def check_schema(meta: dict, name: str) -> None:
    v = meta.get("schema")
    if v > schema.SCHEMA_VERSION:
        raise PstateError(
            f"{name} was written in event format {v} (by pstate {meta.get('version', '?')}); "
            f"this pstate reads formats up to {schema.SCHEMA_VERSION}",
            ExitCode.DATAERR,
            hint="upgrade pstate",
        )


# --- writing --------------------------------------------------------------


def silence_stdout() -> None:
    """After the reader of stdout went away (`pstate ... | head`): point stdout
    at /dev/null so later flushes, and the interpreter's last one, cannot
    raise again (the Python docs' note on SIGPIPE)."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
    except (OSError, ValueError):
        pass



class LineWriter:
    """Writes JSON lines to stdout or an output file.

    target: None or "-" for stdout, an open outfiles.OutputFile, or a path
    (opened with outfiles.open_output: no links followed, new files 0600).
    Flushes after every write() batch when the output is a terminal or
    unbuffered is set; otherwise when the buffer fills or flush() is called.
    Only a regular file is fsync'd (a FIFO, pipe or /dev/null cannot be).
    A file named *.zst or *.gz is written compressed (pstate.stream.compression);
    flush() then ends a compressed block, so what was written decodes.
    BrokenPipeError propagates: the caller decides to end quietly.

    A full file system (ENOSPC, EDQUOT, EFBIG) ends the writing: a regular
    file is cut back to its last complete line (a compressed one to the end
    of its last flushed block), nothing more is written to it (not what the
    buffers hold, not at close or exit), and the OSError raised says so;
    every later write raises it again.
    """

    def __init__(self, target: "str | OutputFile | None" = None, unbuffered: bool = False):
        self.out = None
        self._file = None
        self.failed: OSError | None = None  # the error that ended the writing
        self._good = 0  # the file's size after the last flush that succeeded: a line (block) boundary
        self._compressed = False
        if target is None or target == "-":
            self.path = target
            self.fp = sys.stdout.buffer
            self.tty = sys.stdout.isatty()
            self.owned = False
            try:
                self._good = os.fstat(self.fp.fileno()).st_size
            except (OSError, ValueError):
                pass
        else:
            self._attach(target if isinstance(target, OutputFile) else open_output(target))
        self.autoflush = unbuffered or self.tty
        self.lines = 0

    def _attach(self, out: "OutputFile") -> None:
        from pstate.stream.compression import compressed_writer, compressor_for

        self.out = out
        self.path = out.path
        self._file = io.open(out.fd, "wb", buffering=1 << 20)
        kind = compressor_for(out.path)  # rec.jsonl.zst, rec.jsonl.gz
        self.fp = compressed_writer(self._file, kind) if kind else self._file
        self._compressed = bool(kind)
        self.tty = os.isatty(out.fd)
        self.owned = True
        self._good = os.fstat(out.fd).st_size

    def _close_file(self) -> None:
        from pstate.stream.outfiles import close_dir

        try:
            self.fp.close()  # a compressor ends its frame
        finally:
            try:
                if self._file is not self.fp:
                    self._file.close()
            finally:
                if self.out is not None:
                    close_dir(self.out)

    @property
    def regular(self) -> bool:
        """Writing to a regular file (which fsync and reopen apply to)."""
        return self.out is not None and self.out.regular

    def _fd(self) -> int:
        return self._file.fileno() if self._file is not None else self.fp.fileno()

    def _flushed(self) -> None:
        """After a flush that succeeded: the file ends on a line (a block) here."""
        try:
            self._good = os.fstat(self._fd()).st_size
        except (OSError, ValueError):
            pass

    def _failing(self, e: OSError) -> OSError:
        """The error to raise for e: for a full file system, cut the file back
        to its last complete line, send whatever is still buffered nowhere,
        and remember the error; any other error as it is."""
        import errno

        from pstate.stream.outfiles import silence

        if self.failed is not None:
            return self.failed
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return e
        try:
            fd = self._fd()
        except (OSError, ValueError):
            fd = None
        kept = None
        if fd is not None:
            try:
                st = os.fstat(fd)
                if _stat.S_ISREG(st.st_mode):
                    kept = min(st.st_size, self._good) if self._compressed else self._last_line_end(fd, st.st_size)
                    os.ftruncate(fd, kept)
            except OSError:
                kept = None
            silence(fd)
        name = errno.errorcode.get(e.errno, str(e.errno))
        what = (f": the file ends after its last complete {'block' if self._compressed else 'line'}, "
                "nothing more was written" if kept is not None else ": nothing more was written")
        self.failed = OSError(e.errno, f"{e.strerror or os.strerror(e.errno)} ({name}){what}")
        return self.failed

    def _last_line_end(self, fd: int, size: int) -> int:
        """The offset just past the file's last newline (0 without one),
        read through a second descriptor of the same file (fd is write-only);
        without one, the size after the last flush that succeeded."""
        try:
            rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return min(size, self._good)
        try:
            if os.fstat(rfd).st_ino != os.fstat(fd).st_ino:
                return min(size, self._good)
            end = size
            while end > 0:
                start = max(0, end - 65536)
                chunk = os.pread(rfd, end - start, start)
                k = chunk.rfind(b"\n")
                if k >= 0:
                    return start + k + 1
                end = start
            return 0
        finally:
            os.close(rfd)

    def record(self, rec: dict) -> None:
        if self.failed is not None:
            raise self.failed
        try:
            self.fp.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))
            self.lines += 1
            if self.autoflush:
                self.fp.flush()
                self._flushed()
        except OSError as e:
            raise self._failing(e) from None

    def raw(self, data: "bytes | memoryview", nlines: int) -> None:
        """Write pre-serialised lines (record's fast path)."""
        if self.failed is not None:
            raise self.failed
        try:
            self.fp.write(data)
            self.lines += nlines
            if self.autoflush:
                self.fp.flush()
                self._flushed()
        except OSError as e:
            raise self._failing(e) from None

    def flush(self) -> None:
        if self.failed is not None:
            raise self.failed
        try:
            self.fp.flush()
        except OSError as e:
            raise self._failing(e) from None
        self._flushed()

    def sync(self) -> None:
        """Flush, and fsync a regular file (an error is raised: data may be gone)."""
        self.flush()
        if self.regular:
            try:
                os.fsync(self.fp.fileno())
            except OSError as e:
                raise self._failing(e) from None

    def moved(self) -> bool:
        """Whether the output file's path no longer names it (logrotate
        renamed it, or removed it)."""
        return self.regular and not still_at_path(self.out)

    def reopen(self) -> None:
        """Finish the current file (flush, fsync, close) and open its path
        again: after logrotate renamed it, a new file. Regular files only."""
        self.sync()
        self._close_file()
        self._attach(open_output(self.out.path))

    def close(self, sync: bool = False) -> None:
        """Flush (fsync with sync) and close; after a full file system, only
        close (what the buffers hold goes nowhere)."""
        if self.failed is not None:
            if self.owned:
                try:
                    self._close_file()
                except OSError:
                    pass
                self.owned = False
            return
        try:
            if sync:
                self.sync()
            else:
                self.flush()
        finally:
            if self.owned:
                self.owned = False
                if self.failed is not None:
                    try:
                        self._close_file()
                    except OSError:
                        pass
                else:
                    self._close_file()

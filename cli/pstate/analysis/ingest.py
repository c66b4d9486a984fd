"""Streams into an Aggregator: the fast path over files and standard input
(LineDigester: the one stream reader with the native digester as its bulk
reader), and a large file cut into parts at line starts, digested by several
processes and merged in file order (digest_parallel): the same numbers as
one pass, which the tests hold it to."""

from __future__ import annotations

import os
import pickle
import re
import signal
import stat as statmod

import orjson

from pstate import lifecycle, native
from pstate.analysis.timeinstate import TAKE_BEFORE, Aggregator
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.reader import LineError, StreamReader
from pstate.stream.streamio import MAX_LINE, ReadStats, note_damage, open_input

IDENTITY = ("process", "cgroup")  # the records that say which group and filter a pid is in


# --- from bytes to the Aggregator -----------------------------------------------


class LineDigester:
    """Digests byte chunks into an Aggregator through the one reader
    (reader.StreamReader and its rules): plain state records summed up by
    the native Digester when it is built (else, and for any line it leaves,
    the careful path's state rows, add_rows), other records one at a time.
    begin(name), feed(data), end() as for StreamReader."""

    def __init__(self, agg: Aggregator, stats: ReadStats, *, strict: bool = False, max_line: int = MAX_LINE,
                 use_native: bool = True, filt=None):
        self.agg = agg
        self.stats = stats
        self._take = None  # the native Digester's take, while it holds sums back
        self._forget = None  # its forget: what it knows of pids may change with a process or cgroup record
        fast = None
        if use_native and _digest is not None:
            dig = _digest.Digester(agg.digest_by, agg.state_id, agg.digest_group)
            if filt is not None and filt.active:
                dig.set_filter(*filt.native_spec())
            if agg.services is not None or (filt is not None and filt.needs_identities):
                self._forget = dig.forget
            digest = dig.digest
            take = dig.take

            def settle(flush: bool = False) -> None:
                self._take = None
                agg.add_digested(*take(flush))

            def fast(buf, pos, end, _n):
                stop, n, due = digest(buf, pos, end, max_line, agg.clip_ts)
                if n:
                    self._take = settle
                if due:
                    settle(True)
                return stop, n, n

            agg.flushers.append(lambda: settle(True))
        self.reader = StreamReader(self, stats, strict=strict, max_line=max_line, fast=fast, filt=filt,
                                   fast_filters=True)

    def rows(self, rows: list) -> None:
        if self._take is not None:
            self._take()  # what the Digester read came first
        self.agg.add_rows(rows)

    def record(self, rec: dict, weight: int) -> None:
        if self._take is not None and rec["type"] in TAKE_BEFORE:
            self._take()
        if rec["type"] == "meta":
            self.agg.begin_window(rec)
        elif self._forget is not None and rec["type"] in IDENTITY:
            self._forget(rec.get("pid") if rec["type"] == "process" and type(rec.get("pid")) is int else None)
        self.agg.add_record(rec)

    @property
    def strict(self) -> bool:
        return self.reader.strict

    @strict.setter
    def strict(self, value: bool) -> None:
        self.reader.strict = value

    @property
    def name(self) -> str:
        return self.reader.name

    def begin(self, name: str, at_start: bool = True) -> None:
        self.reader.begin(name, at_start)

    def feed(self, data: bytes) -> None:
        self.reader.feed(data)

    def end(self) -> None:
        self.reader.end()


# The native loop (None when not built or PSTATE_PURE=1; tests switch it).
_digest = native.load("_digest")

PARALLEL_MIN_BYTES = 32 << 20  # smaller files are not worth the processes
_PART_MIN_BYTES = 16 << 20


def digest_files(sources, agg: Aggregator, stats: ReadStats, *, strict: bool = False,
                 max_line: int = MAX_LINE, chunk: int = 1 << 20, jobs: int = 1, use_native: bool = True,
                 filt=None) -> None:
    """Files ("-" is stdin), in order, through LineDigester. A large regular
    file is split into jobs parts, digested by as many processes. use_native
    False: the careful path only (stats --reader careful). filt: only the
    events it passes (stream.filters.Filter)."""
    dig = LineDigester(agg, stats, strict=strict, max_line=max_line, use_native=use_native, filt=filt)
    for src in sources:
        if jobs > 1 and src != "-" and _size(src) >= PARALLEL_MIN_BYTES and not compressed(src):
            agg.begin_window(_first_meta(src))  # the parts after the first never see it
            digest_parallel(src, agg, stats, jobs=jobs, strict=strict, max_line=max_line, chunk=chunk,
                            use_native=use_native, filt=filt)
            continue
        feed_file(src, dig, stats, chunk)


def feed_file(src: str, dig, stats: ReadStats, chunk: int = 1 << 20) -> None:
    """One file ("-" is stdin) into a digester (begin, feed, end: a
    LineDigester or a StreamReader), its damage noted in stats."""
    import sys

    name = "<stdin>" if src == "-" else src
    fp = open_input(src)
    try:
        dig.begin(name)
        read = getattr(fp, "read1", None) or fp.read  # a peeked pipe's bytes are in its buffer
        while True:
            data = read(chunk)
            if not data:
                break
            dig.feed(data)
        dig.end()
        note_damage(fp, name, stats)
    finally:
        if fp is not sys.stdin.buffer:
            fp.close()


def _first_meta(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            rec = orjson.loads(f.readline(MAX_LINE + 1))
    except (OSError, orjson.JSONDecodeError):
        return {}
    return rec if type(rec) is dict and rec.get("type") == "meta" else {}


def compressed(path: str) -> bool:
    """Whether a file starts like zstd or gzip data (parts of it cannot be
    read on their own)."""
    from pstate.stream.compression import GZIP_MAGIC, ZSTD_MAGIC

    try:
        with open(path, "rb") as f:
            return f.read(4).startswith((ZSTD_MAGIC, GZIP_MAGIC))
    except OSError:
        return False


def _size(path: str) -> int:
    try:
        st = os.stat(path)
    except OSError:
        return 0
    return st.st_size if statmod.S_ISREG(st.st_mode) else 0


def file_parts(path: str, parts: int) -> list:
    """[start, end) byte ranges of about equal size, each starting at a line."""
    size = _size(path)
    parts = max(1, min(parts, size // _PART_MIN_BYTES or 1))
    bounds = [0]
    with open(path, "rb") as f:
        for k in range(1, parts):
            pos = max(size * k // parts, bounds[-1])
            f.seek(pos)
            while True:  # to just after the next newline (lines never straddle parts)
                block = f.read(1 << 16)
                if not block:
                    pos = size
                    break
                nl = block.find(b"\n")
                if nl >= 0:
                    pos += nl + 1
                    break
                pos += len(block)
            if bounds[-1] < pos < size:
                bounds.append(pos)
    bounds.append(size)
    return list(zip(bounds, bounds[1:]))


def digest_part(path: str, start: int, end: int, by: str, clip_ts, strict: bool, max_line: int,
                chunk: int, last: bool, use_native: bool = True, filt=None):
    """Digest bytes [start, end) of a file on their own. Line numbers and
    byte offsets in what comes back are relative to start."""
    agg = Aggregator(by)
    agg.clip_ts = clip_ts
    stats = ReadStats()
    who = filt is not None and filt.needs_identities
    try:
        if start > 0 and (agg.services is not None or who):
            # what the process and cgroup records before the part said
            for rec in identities_before(path, start, max_line, chunk, use_native):
                agg.add_record(rec)
                if who:
                    filt.note(rec)
        dig = LineDigester(agg, stats, strict=strict, max_line=max_line, use_native=use_native, filt=filt)
        dig.begin(path, at_start=start == 0)
        feed_range(path, start, end, dig, chunk)
        if last:
            dig.end()
    except LineError as e:
        return ("line-error", e.name, e.lineno, e.why, stats.lines)
    except PstateError as e:
        return ("error", e.message, e.exit_code)
    except OSError as e:
        return ("error", f"cannot read {path}: {e.strerror}", int(ExitCode.NOINPUT))
    return ("ok", agg, stats)


class _Identities:
    """A reader's sink that keeps the process and cgroup records only."""

    def __init__(self):
        self.records: list = []

    def rows(self, rows: list) -> None:
        pass

    def record(self, rec: dict, weight: int) -> None:
        if rec["type"] in IDENTITY:
            self.records.append(rec)


def identities_before(path: str, start: int, max_line: int = MAX_LINE, chunk: int = 1 << 20,
                      use_native: bool = True) -> list:
    """The process and cgroup records of a file's bytes [0, start) (start:
    a line's start), read as the one reader reads them, plain state, slice
    and waker records passed over by the native plain_states: what a part of
    the file that starts there must know of the pids before it (--by cgroup,
    unit, ..., --cgroup, --title). Bad lines are the earlier parts' to report."""
    sink = _Identities()
    fast = None
    if use_native and _digest is not None:
        plain = _digest.plain_states

        def fast(buf, pos, end, _n):
            stop, n, _ts = plain(buf, pos, end, max_line, True)
            return stop, n, n

    rd = StreamReader(sink, ReadStats(), max_line=max_line, fast=fast)
    rd.begin(path)
    feed_range(path, 0, start, rd, chunk)
    return sink.records


def feed_range(path: str, start: int, end: int, dig, chunk: int) -> None:
    """Bytes [start, end) of a file into a digester's feed, chunk at a time."""
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        left = end - start
        while left > 0:
            data = f.read(min(chunk, left))
            if not data:
                break
            left -= len(data)
            dig.feed(data)


def _part_in_child(args) -> tuple[int, int]:
    """Fork a child that digests one part and writes its pickled result to
    a pipe: (pid, read end)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no return from here
        code = 0
        try:
            os.close(rfd)
            lifecycle.worker()  # the parent handles ^C
            try:
                res = digest_part(*args)
            except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises it
                res = ("error", f"cannot digest a part of {args[0]}: {e!r}", int(ExitCode.SOFTWARE))
            data = pickle.dumps(res, protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(wfd, "wb") as out:
                out.write(data)
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            code = 1
        finally:
            os._exit(code)
    os.close(wfd)
    return pid, rfd


def _result_of(pid: int, rfd: int):
    with os.fdopen(rfd, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    if not data:
        return ("error", "a part's process ended without a result", int(ExitCode.SOFTWARE))
    return pickle.loads(data)


def parts_in_children(args: list, jobs: int):
    """Each part's digest_part result, in file order, computed by up to
    `jobs` forked children at once. Plain fork and one pipe per part (no
    pool: its helper threads and shared locks can hang at shutdown); when
    the caller stops early (an error, ^C), the children still running are
    killed and reaped."""
    running: list[tuple[int, int]] = []
    todo = iter(args)
    try:
        for a in todo:
            running.append(_part_in_child(a))
            if len(running) >= jobs:
                break
        while running:
            pid, rfd = running.pop(0)
            res = _result_of(pid, rfd)
            nxt = next(todo, None)
            if nxt is not None:
                running.append(_part_in_child(nxt))
            yield res
    finally:
        for pid, rfd in running:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.close(rfd)
            os.waitpid(pid, 0)


def digest_parallel(path: str, agg: Aggregator, stats: ReadStats, *, jobs: int, strict: bool = False,
                    max_line: int = MAX_LINE, chunk: int = 1 << 20, parts: list | None = None,
                    use_native: bool = True, filt=None) -> None:
    """Digest one regular file in parts, one process each, and merge the
    parts in file order: the same result as reading it in one go. On
    KeyboardInterrupt, the parts done in order so far are kept and the
    interrupt is raised again."""
    parts = parts or file_parts(path, jobs)
    last = len(parts) - 1
    args = [(path, a, b, agg.spec, agg.clip_ts, strict, max_line, chunk, i == last, use_native, filt)
            for i, (a, b) in enumerate(parts)]
    if jobs <= 1 or len(parts) == 1:  # in this process, one part after the other
        results = (digest_part(*a) for a in args)
    else:
        results = parts_in_children(args, min(jobs, len(parts)))
    line_base = 0
    try:
        for (start, _end), res in zip(parts, results):
            if res[0] == "line-error":
                _name, lineno, why, _lines = res[1:]
                raise LineError(path, line_base + lineno, why)
            if res[0] == "error":
                raise PstateError(res[1], ExitCode(res[2]))
            _ok, part_agg, part = res
            merge_read_stats(stats, part, line_base, start)
            agg.absorb(part_agg)
            line_base += part.lines
    finally:
        results.close()  # kills the children still at work


_WHERE = re.compile(r"^(.*):(\d+)$")
_TAIL = re.compile(r"^(.*): byte (\d+), line (\d+)$")


def merge_read_stats(into: ReadStats, part: ReadStats, line_base: int, byte_base: int) -> None:
    """Add a part's ReadStats, renumbering its places by the lines and bytes
    that came before it."""
    into.lines += part.lines
    into.records += part.records
    for reason, n in part.skipped.items():
        into.skipped[reason] = into.skipped.get(reason, 0) + n
        if reason not in into.first_bad:
            m = _WHERE.match(part.first_bad[reason])
            into.first_bad[reason] = f"{m.group(1)}:{int(m.group(2)) + line_base}" if m else part.first_bad[reason]
    if part.truncated_tail:  # only a file's last part can end without a newline
        m = _TAIL.match(part.truncated_tail)
        into.truncated_tail = (f"{m.group(1)}: byte {int(m.group(2)) + byte_base}, "
                               f"line {int(m.group(3)) + line_base}") if m else part.truncated_tail
    into.metas.extend(part.metas)
    into.join_spans(part)
    for reason, n in part.loss.items():
        into.loss[reason] = into.loss.get(reason, 0) + n
    into.ends.extend(part.ends)
    into.nul_starts.extend(part.nul_starts)
    into.overlaps.extend(part.overlaps)
    for t, n in part.unknown.items():
        into.unknown[t] = into.unknown.get(t, 0) + n


def digest_records(records, agg: Aggregator) -> None:
    """Records from reader.read_records, one at a time."""
    add = agg.add_record
    for rec in records:
        add(rec)

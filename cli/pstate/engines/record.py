"""record: the kernel side loaded, its records drained, encoded and written
until a signal, --duration or -- CMD's exit ends the run, then the trailer
that adds the run up. record(), the one entry, is what `pstate record`
runs: commands/record.py declares and checks the options."""

from __future__ import annotations

import ctypes
import dataclasses
import math
import os
import select
import signal
import stat
import sys
import time

import click

from pstate import lifecycle
from pstate.engines import child, flight as flightrec
from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import filtermaps, identity, loader, recordprog, slotrings, stacks
from pstate.kernel.eventcodec import EVENT_SIZE, Encoder
from pstate.kernel.kstates import KernelStates
from pstate.stream.filters import Filter
from pstate.stream.meta import meta_record, wall_time_at
from pstate.stream.outfiles import discard, open_output
from pstate.stream.streamio import LineWriter, silence_stdout

SYNC_S = 5.0  # how often a regular output file is fsync'd: a crash loses seconds, not the page cache
GOVERN_S = 0.25  # how often --max-rate looks at the kernel's event rate
DRAIN_BATCH = 8192  # records decoded per write; bounds the memory a batch takes


@dataclasses.dataclass
class RecordArgs:
    """record's options, checked by the command."""

    filt: Filter
    output: str | None = None
    unbuffered: bool = False
    flight: dict | None = None  # --flight's settings (commands.options.flight_options)
    duration_ns: int | None = None
    rb_bytes: int = 16 << 20
    max_tasks: int = 65536
    drain_ns: int = 5_000_000
    max_rate: int | None = None
    kernel_headers: str | None = None
    strict: bool = False
    quiet: bool = False
    stack_states: str | None = None
    stack_entries: int = 16384
    children: bool = False
    antagonists: bool | None = None  # slices of the others while a followed task waits; None: where tasks are followed
    probes: str | None = None
    ebpf: bool = False
    command: tuple = ()


def _stop_noted(hup_reopens: bool) -> bool:
    """Whether a signal that ends the run came while record was starting
    (then taken: the run ends normally, with nothing created, or what was
    removed)."""
    stops = (signal.SIGINT, signal.SIGTERM) + (() if hup_reopens else (signal.SIGHUP,))
    if not any(s in stops for s in lifecycle.peek()):
        return False
    lifecycle.take()
    return True


def record(**options) -> int:
    """Run record with RecordArgs' options; its exit status."""
    a = RecordArgs(**options)
    rb_pages = recordprog.pow2_pages(a.rb_bytes)
    if not a.ebpf:
        check_pids(a.filt.pids, a.quiet)
    ks = loader.kernel_states(ebpf_only=a.ebpf)
    follow = tuple(a.filt.pids) if a.children else ()
    settings = filtermaps.settings_for(a.filt, ks, follow=follow, antagonists=a.antagonists, command=bool(a.command))
    if a.command and not a.ebpf:
        child.check(a.command)
    if a.stack_states:
        settings = dataclasses.replace(settings, stack_mask=stack_mask(a.stack_states, ks))
    defines = recordprog.defines_for(ks, max_tasks=a.max_tasks, rb_pages=rb_pages, sample=bool(a.max_rate),
                                     stack_entries=a.stack_entries if a.stack_states else 0)
    if a.ebpf:
        click.echo(loader.program_text("record", defines, a.probes))
        return int(ExitCode.OK)
    to_file = bool(a.output) and a.output != "-"
    if _stop_noted(to_file):
        return int(ExitCode.OK)  # stopped before it began: nothing made

    # The output is opened before any program is attached: a FIFO nobody
    # reads, or a refused file, must not leave every context switch paying
    # for a recorder that records nothing.
    flight = flightrec.prepare(a.flight, ks, a.output) if a.flight else None  # -o DIR: the recordings' directory
    out = open_output(a.output) if to_file and not flight else None
    try:
        prog = loader.Program("record", defines, a.kernel_headers, a.probes)
    except BaseException:
        if out is not None:
            discard(out)
        raise
    if _stop_noted(to_file):  # (a compile takes a second)
        if out is not None:
            discard(out)
        prog.close()
        return int(ExitCode.OK)
    writer = LineWriter(out if not flight else open_output(os.devnull), unbuffered=a.unbuffered)
    rec = None
    cmd = None
    code = ExitCode.OK
    try:
        if a.command:
            # CMD waits for the word to exec until the kernel side follows it
            cmd = child.Command(a.command, to_stderr=not to_file)
            settings = filtermaps.settings_for(a.filt, ks, follow=follow + (cmd.pid,), antagonists=a.antagonists)
        filtermaps.start(prog, settings)
        recordprog.seed(prog, ks, "TASKS_BY_TID" in defines)

        def new_meta() -> dict:
            meta = meta_record("record", ks)
            meta.update(a.filt.meta_fields())
            meta["buffer_bytes"] = rb_pages * os.sysconf("SC_PAGE_SIZE")
            meta.update(prog.plan.meta())
            meta["wakeups_at"] = "sched_wakeup" if prog.plan.wake_list else "sched_waking"
            if a.max_rate:
                meta["max_rate"] = a.max_rate
            if a.children:
                meta["filter_children"] = True
            if cmd is not None:
                meta.update(filter_command=list(a.command), command_pid=cmd.pid)
            return meta

        meta = new_meta()
        rec = Recorder(prog, ks, writer, drain_s=a.drain_ns / 1e9, max_rate=a.max_rate,
                       rb_size=rb_pages * os.sysconf("SC_PAGE_SIZE"), with_stacks=bool(a.stack_states),
                       slot_cpus=defines.get("SLOT_CPUS", 0))
        window = Window(meta, rec)
        if flight:
            rec.flight = flightrec.start(flight, rec.enc, new_meta, meta["ts"], a.quiet, lambda: rec.lost_reported)
            rec.enc.identity = None

        def reopen() -> None:
            # SIGHUP: the current file ends as a complete recording, and the
            # file at the same path (logrotate moved the old one) begins one
            nonlocal window
            if not writer.moved():
                writer.sync()  # SIGHUP with the file still in place: nothing to start anew
                return
            rec.drain(limit_s=0.1)
            totals = rec.loss_records()
            totals["unread"] = 0
            counters = prog.counters()
            end = window.end_record("reopen", totals, counters)
            writer.record(end)
            writer.reopen()
            new = new_meta()
            new["window_begin_ts"] = end["ts"]
            writer.record(new)
            rec.enc.identity.forget()  # the new file's readers know none of them
            writer.flush()
            window = Window(new, rec, counters)

        if writer.regular:
            rec.reopen = reopen
        writer.record(meta)
        writer.flush()
        if not a.quiet:
            print("Tracing scheduler state transitions... Ctrl-C to end.", file=sys.stderr)
        if _stop_noted(to_file):
            rec.stop_reason = "signal"  # it came while record started: the trailer follows the meta
        elif cmd is not None:
            rec.command = cmd
            cmd.go()
        rec.run(a.duration_ns / 1e9 if a.duration_ns else None)
        # Stop the producers first: then the final drain and the counters
        # describe the same events, and the trailer adds up exactly. At the
        # end of --duration the settings row stops them at once, and
        # detaching (RCU grace periods, a good part of a second) waits until
        # the stream is complete; on a signal they are detached first, so the
        # programs never run without reporting.
        if rec.stop_reason in ("duration", "exit"):
            filtermaps.stop(prog, settings)
            prog.settle()
        else:
            prog.detach()
        rec.ring.settle()  # nothing more comes: no record is held back for order
        rec.drain(limit_s=1.0)
        if rec.flight is not None:
            rec.flight.close()
        totals = rec.loss_records()
        # Whatever the bounded final drain left in the ring buffer is lost too.
        unread = rec.unread()
        if unread:
            writer.record({"type": "loss", "ts": time.monotonic_ns(), "reason": "unread", "count": unread,
                           "since_ts": rec.last_loss_ts})
        totals["unread"] = unread
        end = window.end_record(rec.stop_reason or "eof", totals, prog.counters())
        writer.record(end)
        writer.close(sync=True)
        lifecycle.done()
        if a.strict and end["lost"]:
            code = ExitCode.LOSS
        if cmd is not None and cmd.started:
            code = cmd.exit_code(code, a.quiet)
    except BrokenPipeError:
        # The reader went away (`pstate record | head`): a normal end.
        silence_stdout()
    except OSError as e:
        raise PstateError(f"writing {a.output or 'standard output'} failed: {e.strerror or e}",
                          ExitCode.IOERR) from None
    finally:
        if cmd is not None:
            cmd.release()
        if rec is not None:
            rec.ring.close()
        prog.close()
        if flight:
            lifecycle.unwatch(signal.SIGUSR1)
    return int(code)


# What helps when events are lost, said once per run on the first loss.
LOSS_HINTS = {
    "ringbuf_full": ("fewer events or more room would help: follow fewer tasks (-p, -c, --cgroup), leave out "
                     "short transitions (--min-dur) or, following tasks, the others' slices (--no-antagonists), "
                     "sample (--max-rate) or a larger buffer (--buffer-size)"),
    "map_full": ("the task map is full: follow fewer tasks (-p, -c, --cgroup); the map holds one row per "
                 "thread up to pid_max"),
}


class Recorder:
    def __init__(self, prog: loader.Program, ks: KernelStates, writer: LineWriter, *,
                 drain_s: float, max_rate: int | None, rb_size: int, with_stacks: bool = False,
                 slot_cpus: int = 0):
        self.prog = prog
        self.writer = writer
        self.enc = Encoder(ks)
        self.ring = loader.RingReader(prog.table("events").map_fd, rb_size, EVENT_SIZE)
        if slot_cpus:  # the sched programs' records are in per-CPU slots first, for this many CPUs
            self.ring = slotrings.SlotRings.of_maps(self.ring, prog.table("slots").map_fd,
                                                    prog.table("slot_pos").map_fd, slot_cpus)
        self.drain_s = drain_s
        self.max_rate = max_rate
        self.sample_every = 1
        self.events = 0
        self.lost_reported = {r: 0 for r in (*loader.DROP_REASONS, loader.SKIPPED)}
        self.last_loss_ts = time.monotonic_ns()
        self.stop_reason: str | None = None
        self.reopen_asked = False  # SIGHUP with -o FILE: start the file anew
        self.reopen = None  # what does it (a function of no arguments); without it SIGHUP stops
        self.reader_gone = reader_gone_check(writer)
        self.loss_hinted = False  # LOSS_HINTS said once
        if with_stacks:
            self.enc.stacks = stacks.StackTable(prog.table("stacks").map_fd, prog.lib)
        self.enc.identity = identity.Identities()  # process and cgroup records (not in --flight files)
        self.flight = None  # --flight: batches go to its ring, not to the writer
        self.command = None  # record -- CMD: stop when it exits

    def drain(self, limit_s: float | None = None) -> int:
        """Decode and write what the ring buffer and the slots hold. Returns records read."""
        total = 0
        deadline = None if limit_s is None else time.monotonic() + limit_s
        while True:
            view, n = self.ring.read(DRAIN_BATCH)
            if not n:
                break
            if self.flight is not None:
                nlines, consumed = 0, self.flight.feed(view, n)
            else:
                data, nlines, consumed = self.enc.encode_bytes(view, n)
            view.release()
            self.ring.commit(consumed)
            if self.enc.stacks is not None:
                for r in self.enc.stacks.take_pending():
                    self.writer.record(r)  # before the wake-ups that name it
            self.identities()  # before the batch's lines
            if nlines:
                self.writer.raw(data, nlines)
                self.events += nlines
            total += consumed
            if consumed < n or (deadline and time.monotonic() > deadline):
                break  # a record still being written: come back next round
        self.identities()  # second looks come due with or without events
        return total

    def identities(self) -> None:
        if self.flight is None and self.enc.identity is not None:
            for r in self.enc.identity.take():
                self.writer.record(r)

    def unread(self) -> int:
        return max(0, self.ring.available()) // self.ring.stride

    def loss_records(self) -> dict:
        counters = self.prog.counters()
        now = time.monotonic_ns()
        totals = {reason: counters[idx] for reason, idx in loader.DROP_REASONS.items()}
        totals[loader.SKIPPED] = self.prog.skipped()
        for reason, total in totals.items():
            delta = total - self.lost_reported[reason]
            if delta > 0:
                self.writer.record({"type": "loss", "ts": now, "reason": reason, "count": delta,
                                    "since_ts": self.last_loss_ts})
                self.lost_reported[reason] = total
                if reason == loader.SKIPPED:
                    print(f"pstate record: warning: the kernel skipped {delta} runs of the programs, each a "
                          "transition or wake-up lost (on the classic tracepoint path it runs none while another "
                          "BPF program or a bpf(2) map call is under way on the CPU; --probes tp_btf avoids it)",
                          file=sys.stderr)
                elif reason != "sampled":
                    print(f"pstate record: warning: {delta} events lost ({reason})", file=sys.stderr)
                    if not self.loss_hinted:
                        self.loss_hinted = True
                        print(f"pstate record: {LOSS_HINTS.get(reason, LOSS_HINTS['ringbuf_full'])}", file=sys.stderr)
        self.last_loss_ts = now
        return totals

    def govern(self, rate: float) -> None:
        """--max-rate: keep one event in k when the rate exceeds the budget.

        `rate` is what was written per second since the last call; it cannot
        exceed what this process manages to write, so under overload it hides
        the events the ring buffer dropped and sampling would never start.
        The budget is about the kernel's rate: the BPF side counts every
        event it tries to emit (STAT_ATTEMPTED, before sampling and before
        the ring buffer), and that count's change per second is it.
        """
        now = time.monotonic()
        attempted = self.prog.counters()[loader.STAT_ATTEMPTED]
        prev = getattr(self, "_governed", None)
        self._governed = (now, attempted)
        if prev is not None and now > prev[0]:
            kernel_rate = (attempted - prev[1]) / (now - prev[0])
        elif self.events:
            # first call: the window began with the program, at 0 written
            kernel_rate = rate * attempted / self.events
        else:
            kernel_rate = float(attempted)  # nothing written in a 1 s window
        k = self.sample_every
        want = max(1, math.ceil(kernel_rate / self.max_rate))
        # Back down only when half the current sampling would do (no flapping).
        if want > k or (want < k and kernel_rate < 0.5 * self.max_rate * k):
            self.prog.table("sample_every")[ctypes.c_int(0)] = ctypes.c_uint32(want)
            self.writer.record({"type": "rate", "ts": time.monotonic_ns(), "sample_every": want,
                                "events_per_s": int(kernel_rate)})
            self.sample_every = want

    def signals(self) -> None:
        """The signals that came (pstate.lifecycle): SIGINT and SIGTERM stop
        the run, SIGHUP starts the output file anew (without a file to
        start anew it stops too), SIGUSR1 fires --flight."""
        for s in lifecycle.take():
            if s == signal.SIGHUP and self.reopen is not None:
                self.reopen_asked = True
            elif s == signal.SIGUSR1:
                if self.flight is not None:
                    self.flight.manual()
            elif s in lifecycle.STOPPING:
                self.stop_reason = "signal"

    def run(self, duration_s: float | None) -> None:
        start = time.monotonic()
        end = start + duration_s if duration_s else None
        next_tick = start + 1.0
        next_govern = start + GOVERN_S
        flush_at = start + 0.2
        sync_at = start + SYNC_S
        events_at_tick = 0
        first = True
        while True:
            self.signals()
            if self.stop_reason is not None:
                break
            # Bounded: under a sustained storm the ring buffer never empties,
            # and an unbounded drain would never look at signals or -d.
            got = self.drain(limit_s=0.1)
            now = time.monotonic()
            if self.max_rate and now >= next_govern:
                self.govern((self.events - events_at_tick) / (now - next_govern + GOVERN_S))
                events_at_tick = self.events
                next_govern = now + GOVERN_S
            if now >= next_tick:
                self.loss_records()
                next_tick = now + 1.0
            if first and self.events:
                flush_at = now  # the first events go out at once
                first = False
            if now >= flush_at:
                self.writer.flush()
                if self.reader_gone():
                    # Nothing may be written for a long time (narrow filters),
                    # so a closed pipe would otherwise go unnoticed.
                    raise BrokenPipeError
                flush_at = now + 0.2
            if self.reopen_asked and self.reopen:
                self.reopen_asked = False
                self.reopen()
                sync_at = now + SYNC_S
            elif now >= sync_at and self.writer.regular:
                self.writer.sync()
                sync_at = now + SYNC_S
            if self.flight is not None:
                self.flight.tick(lambda: self.drain(limit_s=0.05))
            if end and now >= end:
                self.stop_reason = "duration"
                break
            if self.command is not None and self.command.exited():
                self.stop_reason = "exit"
                break
            if got < DRAIN_BATCH // 4:
                time.sleep(self.drain_s)


def check_pids(pids, quiet: bool) -> None:
    """-p names processes that exist now: like perf -p, a pid that matches
    nothing is an error, not a silent empty recording."""
    missing = [p for p in pids if not os.path.exists(f"/proc/{p}")]
    if pids and len(missing) == len(pids):
        raise PstateError(f"no such process: {', '.join(map(str, missing))}", ExitCode.NOINPUT,
                          hint="give the pid of a running process (pgrep NAME finds one), or -c NAME "
                               "to follow processes by name")
    if missing and not quiet:
        print(f"pstate record: warning: no such process: {', '.join(map(str, missing))}; "
              "recording the others", file=sys.stderr)


def reader_gone_check(writer: LineWriter):
    """A function telling whether the reader of a pipe or socket output left."""
    try:
        fd = writer.fp.fileno()
        kind = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):
        return lambda: False
    if not (stat.S_ISFIFO(kind) or stat.S_ISSOCK(kind)):
        return lambda: False
    poller = select.poll()
    poller.register(fd, 0)  # POLLERR and POLLHUP are reported even when not asked for

    def gone() -> bool:
        return any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0))

    return gone


def stack_mask(spec: str, ks: KernelStates) -> int:
    """The prev_state bits of --stacks' states (letters such as D or names
    such as uninterruptible)."""
    by_letter = {letter: bit for bit, letter in ks.letters.items()}
    mask = 0
    for part in (p.strip() for p in spec.split(",")):
        bit = by_letter.get(part) or (ks.bit_of(part) if part else None)
        if not bit:
            raise click.BadParameter(f"{part!r} is not a blocked state this kernel reports (e.g. D, S)",
                                     param_hint="'--stacks'")
        mask |= bit
    return mask


class Window:
    """What one output file covers: the end trailer counts its own events
    and losses (all of the run, unless SIGHUP started new files)."""

    def __init__(self, meta: dict, rec: Recorder, counters=None):
        self.meta = meta
        self.meta_ts = meta["ts"]
        self.events = rec.events
        self.lost = dict(rec.lost_reported)
        # the kernel's counters where the window begins (events tried, pairs clamped)
        self.attempted = counters[loader.STAT_ATTEMPTED] if counters else 0
        self.clamped = counters[loader.STAT_CLAMPED] if counters else 0
        self.stack_failed = counters[loader.STAT_STACK_FAILED] if counters else 0
        self.skipped_notes = rec.prog.skipped_notes() if counters else 0
        self.stack_lost = rec.enc.stacks.lost if rec.enc.stacks is not None else 0
        self.rec = rec

    def end_record(self, reason: str, totals: dict, counters) -> dict:
        lost = {r: n - self.lost.get(r, 0) for r, n in totals.items()}
        now = time.monotonic_ns()
        end = {
            "type": "end", "ts": now, "reason": reason,
            "events": self.rec.events - self.events, "lost": sum(lost.values()),
            **{f"lost_{r}": n for r, n in lost.items()},
            "kernel_events": counters[loader.STAT_ATTEMPTED] - self.attempted,
            "clamped": counters[loader.STAT_CLAMPED] - self.clamped,
            "skipped_notes": self.rec.prog.skipped_notes() - self.skipped_notes,
            "duration_ns": now - self.meta_ts,
            "wall_time": wall_time_at(self.meta, now),
        }
        st = self.rec.enc.stacks
        if st is not None:
            end["stack_failed"] = counters[loader.STAT_STACK_FAILED] - self.stack_failed
            end["stack_lost"] = st.lost - self.stack_lost
        return end

"""pstate record: stream scheduler state transitions as JSON lines."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import math
import os
import platform
import shutil
import signal
import sys
import time

import click

from pstate.kernel import bpfsys, eventlayout, filtermaps, identity, loader, slotrings, stacks
from pstate.kernel.bpfsys import BPF_NOEXIST
from pstate.kernel.eventcodec import EVENT_SIZE, Encoder
from pstate.exitcodes import ExitCode, PstateError
from pstate.stream.durations import Duration
from pstate.stream.filters import Filter
from pstate.kernel.kstates import KernelStates
from pstate.snapshots import flight as flightrec
from pstate.stream.meta import meta_record, wall_time_at
from pstate.commands.options import filter_options, output_options, probes_option
from pstate.stream.outfiles import discard, open_output
from pstate.stream.streamio import LineWriter, silence_stdout

EPILOG = """\b
Examples:
  sudo pstate record -d 10 -o rec.jsonl       10 seconds, everything, to a file
  sudo pstate record | pstate stats           live summary; Ctrl-C ends both
  sudo pstate record -p 1234                  one process and all its threads
  sudo pstate record -c nginx --state D       nginx tasks entering or leaving D
  sudo pstate record --min-dur 5ms            only states that lasted >= 5 ms
  sudo pstate record --max-rate 200000        sample when the rate gets higher
  sudo pstate record --flight 30s --trigger 'D>=100ms' -o /var/tmp/flight
                                              the last 30 s, written when a task
                                              was in D for 100 ms (or on SIGUSR1)
  sudo pstate record | jq -c 'select(.to=="uninterruptible")'
  sudo pstate record -o rec.jsonl -- make -j4 a command and every process it starts
  sudo pstate record -p 1234 --children       a process and its descendants
  sudo pstate record --cgroup /system.slice/nginx.service
                                              the processes of a cgroup and below

\b
The first line is a meta header, the last an end trailer with totals;
loss records appear in-band when events are dropped (man pstate-events).
Ctrl-C, SIGTERM and --duration end the run normally (exit 0) after writing
the trailer; a closed output pipe ends it quietly. With -o FILE, SIGHUP
starts FILE anew (for logrotate: rename FILE, then send SIGHUP): the old
file gets its end trailer, the new one a meta header whose window_begin_ts
says where it starts; on standard output SIGHUP ends the run. A regular
output file is fsync'd every few seconds.

\b
With -- CMD ARGS..., record starts CMD once the kernel side is ready and
records it and every process it forks, and theirs (the kernel follows
forks: nothing else is recorded); it stops when CMD exits and exits with
CMD's status (128 + N when a signal N ended it; 3 when CMD exited 0, --strict
is given and events were lost). When the stream goes to standard output,
CMD's standard output goes to standard error, so that the two do not mix.
-p PID --children follows the descendants of PID the same way, those living
now and those forked from now on. --cgroup PATH follows the processes of
the cgroup and of those below it: those in them when recording starts, those
seen switching out in them later, and what they fork. A process moved out
stays followed.
"""

SYNC_S = 5.0  # how often a regular output file is fsync'd: a crash loses seconds, not the page cache
GOVERN_S = 0.25  # how often --max-rate looks at the kernel's event rate
DRAIN_BATCH = 8192  # records decoded per write; bounds the memory a batch takes
ST_KERNEL = eventlayout.DEFINES["ST_KERNEL"]  # a task row's state: | the reported prev_state bits


def _size(text: str) -> int:
    """"16M" -> bytes. Raises ValueError for anything but a sane positive size."""
    value = flightrec.size_bytes(text)
    if not (4096 <= value <= (1 << 31)):  # the kernel caps a ring buffer below 4 GiB
        raise ValueError(text)
    return int(value)


def _pow2_pages(nbytes: int) -> int:
    pages = max(1, nbytes // os.sysconf("SC_PAGE_SIZE"))
    return 1 << (pages - 1).bit_length()


DEFAULT_BUFFER = "16M"
SLOTS_MIN, SLOTS_MAX = 1024, 8192  # a CPU's run of slots: 88 to 704 KiB (bpf/record.bpf.c struct slot)


def slots_per_cpu(rb_bytes: int, ncpus: int) -> int:
    """Each CPU's run of slots, 0 for none: what --buffer-size holds when
    shared by the possible CPUs, a power of two from SLOTS_MIN to SLOTS_MAX
    (what a run cannot hold goes to the ring buffer). Only on x86-64, where
    the programs' stores are not reordered (pstate.kernel.slotrings)."""
    if platform.machine() != "x86_64":
        return 0
    fit = max(SLOTS_MIN, min(SLOTS_MAX, rb_bytes // loader.RingReader.stride_of(EVENT_SIZE) // max(1, ncpus)))
    return 1 << (fit.bit_length() - 1)


def buffers_summary(buffer_size: str = DEFAULT_BUFFER) -> str:
    """Where record's events go on this machine with --buffer-size buffer_size, for doctor."""
    rb_bytes = _pow2_pages(_size(buffer_size)) * os.sysconf("SC_PAGE_SIZE")
    ncpus = bpfsys.possible_cpus()
    rb = f"the {rb_bytes >> 20} MiB ring buffer" if rb_bytes >= 1 << 20 else f"the {rb_bytes >> 10} KiB ring buffer"
    per_cpu = slots_per_cpu(rb_bytes, ncpus)
    if not per_cpu:
        return (f"{rb} only (per-CPU slots are used on x86-64 alone, where the programs' stores keep "
                f"their order; this is {platform.machine()}; --buffer-size {buffer_size})")
    kib = per_cpu * loader.RingReader.stride_of(EVENT_SIZE) >> 10
    return (f"switches and wake-ups go to per-CPU runs of {per_cpu} slots ({kib} KiB each, {ncpus} possible "
            f"CPUs), then to {rb}; the other events to the ring buffer (--buffer-size {buffer_size})")


def defines_for(ks: KernelStates, *, max_tasks: int, rb_pages: int, sample: bool, stack_entries: int = 0) -> dict:
    """The program's -D settings. Filters are not among them: they are map
    values (pstate.kernel.filtermaps), so a new filter needs no new compile."""
    d = {
        "REPORT_MASK": f"0x{ks.report_mask:x}",
        "DEAD_BITS": f"0x{(ks.bit_of('dead') or 0) | (ks.bit_of('zombie') or 0):x}",
        "MAX_TASKS": max_tasks,
        "RB_PAGES": rb_pages,
        "SAMPLE": sample,
    }
    ncpus = bpfsys.possible_cpus()
    per_cpu = slots_per_cpu(rb_pages * os.sysconf("SC_PAGE_SIZE"), ncpus)
    if per_cpu:
        d["CPU_SLOTS"] = per_cpu
        d["SLOT_CPUS"] = ncpus
    if stack_entries:
        d["STACK_ENTRIES"] = stack_entries
    if loader.pid_max() <= max_tasks:
        # every tid fits: an array indexed by tid, whose lookup costs no call
        d["TASKS_BY_TID"] = True
    return d


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
        self.reopen = None  # what does it (a function of no arguments)
        self.reader_gone = _reader_gone_check(writer)
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
            import ctypes

            self.prog.table("sample_every")[ctypes.c_int(0)] = ctypes.c_uint32(want)
            self.writer.record({"type": "rate", "ts": time.monotonic_ns(), "sample_every": want,
                                "events_per_s": int(kernel_rate)})
            self.sample_every = want

    def run(self, duration_s: float | None) -> None:
        start = time.monotonic()
        end = start + duration_s if duration_s else None
        next_tick = start + 1.0
        next_govern = start + GOVERN_S
        flush_at = start + 0.2
        sync_at = start + SYNC_S
        events_at_tick = 0
        first = True
        while self.stop_reason is None:
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


def _check_pids(pids, quiet: bool) -> None:
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


def _reader_gone_check(writer: LineWriter):
    """A function telling whether the reader of a pipe or socket output left."""
    import select
    import stat

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


def _install_signals(rec: Recorder, reopen_on_hup: bool):
    def stop(signum, _frame):
        rec.stop_reason = "signal"

    def reopen(signum, _frame):
        rec.reopen_asked = True

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, stop)
    signal.signal(signal.SIGHUP, reopen if reopen_on_hup else stop)


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@filter_options
@output_options
@flightrec.flight_options
@click.option("-d", "--duration", type=Duration("s", positive=True), metavar="DURATION",
              help="Stop after this long, e.g. 500ms, 30s, 1m; a plain number is seconds "
                   "(default: until Ctrl-C or SIGTERM).")
@click.option("--buffer-size", default=DEFAULT_BUFFER, show_default=True, metavar="SIZE",
              help="BPF ring buffer size (k/M/G suffixes); rounded up to a power of two pages. On x86-64 "
                   "context switches and wake-ups go first to per-CPU runs of slots (as much again, shared by the "
                   "CPUs, 88 to 704 KiB each), and to the ring buffer when those are full.")
@click.option("--max-tasks", type=click.IntRange(1024, 4_194_304), default=65536, show_default=True, metavar="N",
              help="Threads the kernel side can track at once.")
@click.option("--drain-interval", type=Duration("s", positive=True), default="5ms", show_default=True,
              metavar="DURATION", help="How often the ring buffer is drained, 500us to 1s (no per-event wake-ups).")
@click.option("--max-rate", type=click.IntRange(1000), metavar="EVENTS/S",
              help="Above this rate keep only one event in N (recorded as rate and loss records).")
@click.option("--kernel-headers", type=click.Path(file_okay=False), envvar="PSTATE_KERNEL_HEADERS",
              metavar="DIR", help="Kernel header tree for BCC [env: PSTATE_KERNEL_HEADERS].")
@click.option("--strict", is_flag=True, help="Exit 3 if any event was lost.")
@click.option("-q", "--quiet", is_flag=True, help="No banner and no warnings on stderr.")
@click.option("--stacks", "stack_states", is_flag=False, flag_value="D", metavar="STATES",
              help="Take the kernel stack of a task as it blocks in these states (comma-separated letters or "
                   "names; --stacks alone: D): stack records, and stack_id and reason on the wake-up that ends "
                   "the state. Example: --stacks=D,S.")
@click.option("--stack-entries", type=click.IntRange(1, 1 << 20), default=16384, hidden=True,
              help="Slots of the kernel's stack map.")
@click.option("--children", is_flag=True,
              help="With -p: also every process below the given ones, those living now and those they "
                   "fork from now on.")
@probes_option
@click.option("--ebpf", is_flag=True, hidden=True, help="Print the BPF program and exit.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD [ARGS]...]")
def cli(filt: Filter, output, unbuffered, flight, duration, buffer_size, max_tasks, drain_interval, max_rate,
        kernel_headers, strict, quiet, stack_states, stack_entries, children, probes, ebpf, command):
    """Stream every scheduler state transition as JSON lines.

    Each state record says which thread went from which state to which, and
    dur_ns, how long it was in the state it left: the on-CPU slice when it
    switches out, the run-queue wait when it switches in, the time blocked
    when it is woken. fork, exec and exit records follow the task lifecycle.
    Filters run in the kernel, so what is filtered out costs no bandwidth.
    """
    try:
        rb_bytes = _size(buffer_size)
    except (ValueError, IndexError, OverflowError):
        raise click.BadParameter(f"{buffer_size!r} is not a size from 4k to 2G (e.g. 16M)",
                                 param_hint="'--buffer-size'") from None
    if not 500_000 <= drain_interval <= 1_000_000_000:
        raise click.BadParameter("must be from 500us to 1s", param_hint="'--drain-interval'")
    rb_pages = _pow2_pages(rb_bytes)
    if children and not filt.pids:
        raise click.UsageError("--children follows the processes of -p: give -p PID")
    if command and flight:
        raise click.UsageError("--flight records until stopped; it does not run a command")
    if not ebpf:
        _check_pids(filt.pids, quiet)
    ks = loader.kernel_states(ebpf_only=ebpf)
    follow = tuple(filt.pids) if children else ()
    settings = filtermaps.settings_for(filt, ks, follow=follow)
    if command and not ebpf:
        _check_command(command)
    if stack_states:
        settings = dataclasses.replace(settings, stack_mask=_stack_mask(stack_states, ks))
    defines = defines_for(ks, max_tasks=max_tasks, rb_pages=rb_pages, sample=bool(max_rate),
                          stack_entries=stack_entries if stack_states else 0)
    if ebpf:
        click.echo(loader.program_text("record", defines, probes))
        return

    # The output is opened before any program is attached: a FIFO nobody
    # reads, or a refused file, must not leave every context switch paying
    # for a recorder that records nothing.
    if flight:
        flight = flightrec.prepare(flight, ks, output)  # -o DIR: the directory of the recordings
    out = open_output(output) if output and output != "-" and not flight else None
    try:
        prog = loader.Program("record", defines, kernel_headers, probes)
    except BaseException:
        if out is not None:
            discard(out)
        raise
    writer = LineWriter(out if not flight else open_output(os.devnull), unbuffered=unbuffered)
    rec = None
    cmd = None
    code = ExitCode.OK
    try:
        if command:
            # CMD waits for the word to exec until the kernel side follows it
            cmd = Command(command, to_stderr=not output or output == "-")
            settings = filtermaps.settings_for(filt, ks, follow=follow + (cmd.pid,))
        filtermaps.start(prog, settings)
        _seed(prog, ks, "TASKS_BY_TID" in defines)

        def new_meta() -> dict:
            meta = meta_record("record", ks)
            meta.update(filt.meta_fields())
            meta["buffer_bytes"] = rb_pages * os.sysconf("SC_PAGE_SIZE")
            meta.update(prog.plan.meta())
            meta["wakeups_at"] = "sched_wakeup" if prog.plan.wake_list else "sched_waking"
            if max_rate:
                meta["max_rate"] = max_rate
            if children:
                meta["filter_children"] = True
            if cmd is not None:
                meta.update(filter_command=list(command), command_pid=cmd.pid)
            return meta

        meta = new_meta()
        rec = Recorder(prog, ks, writer, drain_s=drain_interval / 1e9, max_rate=max_rate,
                       rb_size=rb_pages * os.sysconf("SC_PAGE_SIZE"), with_stacks=bool(stack_states),
                       slot_cpus=defines.get("SLOT_CPUS", 0))
        window = _Window(meta, rec)
        if flight:
            rec.flight = flightrec.start(flight, rec.enc, new_meta, meta["ts"], quiet, lambda: rec.lost_reported)
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
            window = _Window(new, rec, counters)

        if writer.regular:
            rec.reopen = reopen
        _install_signals(rec, reopen_on_hup=writer.regular)
        writer.record(meta)
        writer.flush()
        if not quiet:
            print("Tracing scheduler state transitions... Ctrl-C to end.", file=sys.stderr)
        if cmd is not None:
            rec.command = cmd
            cmd.go()
        rec.run(duration / 1e9 if duration else None)
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
        if strict and end["lost"]:
            code = ExitCode.LOSS
        if cmd is not None:
            code = cmd.exit_code(code, quiet)
    except BrokenPipeError:
        # The reader went away (`pstate record | head`): a normal end.
        silence_stdout()
    except OSError as e:
        raise PstateError(f"writing {output or 'standard output'} failed: {e.strerror or e}", ExitCode.IOERR)
    finally:
        if cmd is not None:
            cmd.release()
        if rec is not None:
            rec.ring.close()
        prog.close()
    if code:
        sys.exit(int(code))


def _check_command(command: tuple) -> None:
    if not (os.sep in command[0] or shutil.which(command[0])):
        raise PstateError(f"{command[0]}: command not found", ExitCode.USAGE,
                          hint="give the command after --, as a path or a name on PATH")


class Command:
    """record -- CMD: CMD forked at once, waiting on a pipe for the word to
    exec (so that the kernel side follows it before it runs), then reaped
    by the recorder's loop (exited())."""

    def __init__(self, argv: tuple, to_stderr: bool):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: exec or _exit, nothing else
            try:
                os.close(w)
                go = os.read(r, 1)
                os.close(r)
                if go:
                    if to_stderr:
                        os.dup2(2, 1)  # the stream has standard output
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    signal.signal(signal.SIGHUP, signal.SIG_DFL)
                    os.execvp(argv[0], list(argv))
            except OSError as e:
                os.write(2, f"pstate record: cannot run {argv[0]}: {e.strerror}\n".encode())
                os._exit(127)
            finally:
                os._exit(127)
        os.close(r)
        self.pid = pid
        self.argv = argv
        self._w = w
        self.status: int | None = None

    def go(self) -> None:
        os.write(self._w, b"g")
        self.release_pipe()

    def release_pipe(self) -> None:
        if self._w is not None:
            os.close(self._w)
            self._w = None

    def exited(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
        return self.status is not None

    def exit_code(self, code: int, quiet: bool) -> int:
        """CMD's status (128 + N for signal N), or record's own when CMD
        exited 0 and record had a reason to fail (--strict and loss)."""
        if not self.exited():
            if not quiet:
                print(f"pstate record: {self.argv[0]} (pid {self.pid}) is still running", file=sys.stderr)
            return code
        status = self.status if self.status >= 0 else 128 - self.status
        return status or code

    def release(self) -> None:
        """Never started (an error came first): the closed pipe makes it exit."""
        if self._w is not None:
            self.release_pipe()
            os.waitpid(self.pid, 0)
            self.status = 127



class _Window:
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


def _stack_mask(spec: str, ks: KernelStates) -> int:
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


def _seed(prog: loader.Program, ks: KernelStates, by_tid: bool) -> None:
    """Give the kernel side the tgid and state of every thread alive now, so
    the first events of existing tasks carry their process id. A row the
    program has made since it was attached is fresher and is kept."""
    # the hash takes seeds where no row exists; with the array they wait in
    # `seeds` for the thread's first event (bpf/record.bpf.c, task_row)
    tasks = prog.table("seeds" if by_tid else "tasks")
    lib = prog.lib
    fd = tasks.map_fd
    letters = {letter: bit for bit, letter in ks.letters.items()}
    Leaf = tasks.Leaf
    Key = tasks.Key
    for tgid, tid, letter, _comm, _start in loader.seed_tasks():
        bit = letters.get(letter)
        leaf = Leaf()
        leaf.tgid = tgid
        leaf.since = 0  # start not seen: durations of this first state are unknown
        leaf.state = (ST_KERNEL | bit) if bit else 0
        key = Key(tid)
        rc = lib.bpf_update_elem(fd, ctypes.byref(key), ctypes.byref(leaf), BPF_NOEXIST)
        if rc != 0 and ctypes.get_errno() != errno.EEXIST:
            break  # map full: later events count map_full drops

"""pstate record: stream scheduler state transitions as JSON lines."""

from __future__ import annotations

import sys

import click

from pstate.commands.options import filter_options, flight_options, output_options, probes_option, size_bytes
from pstate.engines.record import record
from pstate.kernel import recordprog
from pstate.stream.durations import Duration
from pstate.stream.filters import Filter

EPILOG = """\b
Examples:
  sudo pstate record -d 10 -o rec.jsonl   10 s of everything, to a file
  sudo pstate record | pstate stats       live summary; Ctrl-C ends both
  sudo pstate record -p 1234              one process and all its threads
  sudo pstate record -c nginx --state D   nginx tasks entering or leaving D
  sudo pstate record --min-dur 5ms        only states that lasted >= 5 ms
  sudo pstate record --max-rate 200000    sample above 200,000 events/s
  sudo pstate record -p 1234 --children   a process and its descendants
  sudo pstate record --stacks -o rec.jsonl  kernel stacks of D states
  # a command and every process it starts; exits as the command does
  sudo pstate record -o rec.jsonl -- make -j4
  # the processes of a cgroup and below
  sudo pstate record --cgroup /system.slice/nginx.service
  # the last 30 s, written when a task was in D for 100 ms (or on SIGUSR1)
  sudo pstate record --flight 30s --trigger 'D>=100ms' -o /var/tmp/flight
  sudo pstate record | jq -c 'select(.to=="uninterruptible")'
"""


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@filter_options
@output_options
@flight_options
@click.option("-d", "--duration", type=Duration("s", positive=True), metavar="DURATION",
              help="Stop after this long, e.g. 500ms, 30s, 1m; a plain number is seconds "
                   "(default: until Ctrl-C or SIGTERM).")
@click.option("--buffer-size", default=recordprog.DEFAULT_BUFFER, show_default=True, metavar="SIZE",
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
@click.option("--antagonists/--no-antagonists", default=None,
              help="With -p, -t, -c, --cgroup or -- CMD (on by default there): also write who held a CPU while "
                   "a followed task waited (slice records, for stats --antagonists): the switch-outs of the CPU "
                   "it waits on, while it waits. --no-antagonists leaves them out.")
@probes_option
@click.option("--ebpf", is_flag=True, hidden=True, help="Print the BPF program and exit.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- CMD [ARGS]...]")
def cli(filt: Filter, output, unbuffered, flight, duration, buffer_size, max_tasks, drain_interval, max_rate,
        kernel_headers, strict, quiet, stack_states, stack_entries, children, antagonists, probes, ebpf, command):
    """Stream every scheduler state transition as JSON lines.

    Each state record says which thread went from which state to which, and
    dur_ns, how long it was in the state it left: the on-CPU slice when it
    switches out, the run-queue wait when it switches in, the time blocked
    when it is woken. fork, exec and exit records follow the task lifecycle.
    Filters run in the kernel, so what is filtered out costs no bandwidth.
    """
    try:
        rb_bytes = size_bytes(buffer_size)
        if not recordprog.BUFFER_MIN <= rb_bytes <= recordprog.BUFFER_MAX:
            raise ValueError(buffer_size)
    except (ValueError, IndexError, OverflowError):
        raise click.BadParameter(f"{buffer_size!r} is not a size from 4k to 2G (e.g. 16M)",
                                 param_hint="'--buffer-size'") from None
    if not 500_000 <= drain_interval <= 1_000_000_000:
        raise click.BadParameter("must be from 500us to 1s", param_hint="'--drain-interval'")
    if children and not filt.pids:
        raise click.UsageError("--children follows the processes of -p: give -p PID")
    if command and flight:
        raise click.UsageError("--flight records until stopped; it does not run a command")
    sys.exit(record(filt=filt, output=output, unbuffered=unbuffered, flight=flight, duration_ns=duration,
                    rb_bytes=rb_bytes, max_tasks=max_tasks, drain_ns=drain_interval, max_rate=max_rate,
                    kernel_headers=kernel_headers, strict=strict, quiet=quiet, stack_states=stack_states,
                    stack_entries=stack_entries, children=children, antagonists=antagonists, probes=probes,
                    ebpf=ebpf, command=command))

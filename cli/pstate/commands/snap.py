"""pstate snap: point-in-time snapshots of per-thread scheduler state times."""

from __future__ import annotations

import grp
import sys

import click

from pstate.commands.options import RenamedCommand, probes_option
from pstate.engines.snap import snap
from pstate.stream.durations import Duration

EPILOG = """\b
Examples:
  sudo pstate snap --start                 a collector counting in the kernel
  sudo pstate snap --dir /var/lib/pstate   one snapshot of it at once (cron)
  sudo pstate snap --status                since when, cost, memory, fill
  sudo pstate snap --stop                  remove it
  sudo pstate snap --dir /var/lib/pstate   without one: one 5 s snapshot
  sudo pstate snap --dir DIR -k 1440       ... keeping the newest 1440
  sudo pstate snap --dir DIR --every 10s --max-age 24h
                                           a daemon, a day of snapshots
  sudo pstate snap --dir DIR --every 1m --clear
                                           each file covers its minute
  # for Prometheus, into the directory Debian's node_exporter reads
  sudo pstate snap --format prom --every 15s \\
      --dir /var/lib/prometheus/node-exporter
  pstate stats DIR/                        trends, churn, leak suspects
  jq -c 'select(.type=="task" and .uninterruptible_ns > 0)' DIR/pstate-snap-*
"""


def _gid(group: str | None) -> int | None:
    if group is None:
        return None
    try:
        return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise click.BadParameter(f"no such group: {group}", param_hint="--group") from None


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]},
               cls=RenamedCommand, renamed={"-o": "--dir", "--out": "--dir", "-e": "--every"})
@click.option("--dir", "out_dir", type=click.Path(), metavar="DIR",
              help="Directory for the snapshot files (created 0700 if missing and its parent exists). Required.")
@click.option("-i", "--interval", type=Duration("s"), default=None, metavar="DURATION",
              help="Time each snapshot covers, e.g. 500ms, 5s, 1m.  [default: 5s]")
@click.option("-n", "--count", type=click.IntRange(min=0), default=None, metavar="N",
              help="Take N snapshots, one per interval (0: until stopped).  [default: 1]")
@click.option("--every", type=Duration("s"), default=None, metavar="DURATION",
              help="Keep running, one snapshot per DURATION, until stopped: --interval DURATION --count 0.")
@click.option("--clear", is_flag=True,
              help="Each snapshot holds the deltas over its own interval, not totals since the start.")
@click.option("-f", "--format", "fmt", type=click.Choice(["jsonl", "csv", "prom"]), default="jsonl",
              show_default=True, help="File format: JSON lines, CSV, or Prometheus text for node_exporter.")
@click.option("--prom-by", type=click.Choice(["unit", "cgroup", "title", "comm", "pid", "thread", "process"]),
              default="unit", show_default=True,
              help="Groups of the --format prom series and of the latency hist rows: one per systemd unit, "
                   "cgroup, process title (its role, as stats --by title), command name, process (pid) "
                   "or thread.")
@click.option("-k", "--keep", type=click.IntRange(min=1), default=None, metavar="N",
              help="Delete pstate's own oldest snapshot files beyond the newest N.")
@click.option("--max-age", type=Duration("s"), default=None, metavar="DURATION",
              help="Delete pstate's own snapshot files older than this, e.g. 36h (age from the time in the name).")
@click.option("--max-tasks", type=click.IntRange(64, 4_194_304), default=65536, show_default=True,
              help="Threads the kernel side can track; beyond that the snapshot says truncated.")
@click.option("--group", metavar="GROUP",
              help="Make files group-readable (0640) by this group, e.g. for node_exporter.")
@click.option("--kernel-headers", type=click.Path(file_okay=False), envvar="PSTATE_KERNEL_HEADERS",
              metavar="DIR", help="Kernel header tree for BCC [env: PSTATE_KERNEL_HEADERS].")
@click.option("-v", "--verbose", is_flag=True, help="Say on stderr when collecting starts and each file written.")
@click.option("-q", "--quiet", is_flag=True, help="No notes on stderr (errors are still reported).")
@click.option("--start", "action", flag_value="start",
              help="Start the collector: snap's program keeps counting in the kernel, with no process running, "
                   "until --stop; each `snap --dir DIR` then writes one snapshot of it at once.")
@click.option("--stop", "action", flag_value="stop", help="Stop the collector: remove its programs, links and maps.")
@click.option("--restart", "action", flag_value="restart",
              help="Replace the collector (after a pstate upgrade); counting starts again.")
@click.option("--status", "action", flag_value="status",
              help="Show the collector: since when, its cost, memory and fill (exit 1 when none runs).")
@click.option("--pin-dir", type=click.Path(file_okay=False), metavar="DIR",
              help="The collector's pin directory, on bpffs: root's, writable by no one else, created 0700 when "
                   "missing (its parent must exist). --status, --stop and snapshots find a collector wherever it is "
                   "pinned.  [default: /sys/fs/bpf/pstate]")
@probes_option
@click.option("--ebpf", is_flag=True, hidden=True, help="Print the BPF program and exit.")
def cli(out_dir, interval, count, every, clear, fmt, prom_by, keep, max_age, max_tasks, group, kernel_headers,
        verbose, quiet, action, pin_dir, probes, ebpf):
    """Write point-in-time snapshots of every thread's time per scheduler state.

    A BPF program counts, per thread, the time spent running, runnable,
    preempted, sleeping (S), uninterruptible (D), stopped and so on, with
    context switches and wake-ups. Every live thread is seeded from /proc
    at the start. By default snap collects for one interval, writes one
    snapshot and exits: run it from cron, and analyse the directory later
    with `pstate stats DIR/` (trends, churn, leak suspects).
    """
    if out_dir is None and not ebpf and action is None:
        raise click.UsageError("Missing option '--dir' (the directory for the snapshot files).")
    explicit = [o for o, v in (("--interval", interval), ("--count", count), ("--every", every), ("--clear", clear))
                if v not in (None, False)]
    if action is None or ebpf:
        if quiet and verbose:
            raise click.UsageError("--quiet and --verbose contradict each other: give one")
        if every is not None and interval is not None and every != interval:
            raise click.UsageError("--every is the interval of a running snap: give --every or --interval, not both")
        if every is not None:
            interval = every
            count = 0 if count is None else count
        interval = interval if interval is not None else 5_000_000_000
        count = 1 if count is None else count
        if interval < 10_000_000:
            raise click.BadParameter("must be at least 10ms", param_hint="--interval/--every")
        if fmt == "prom" and clear:
            raise click.UsageError("--format prom writes counters, which are cumulative: drop --clear")
        if fmt == "prom" and (keep is not None or max_age is not None):
            raise click.UsageError("--format prom keeps one file (pstate-snap.prom): --keep and --max-age do not "
                                   "apply")
    sys.exit(snap(out_dir=out_dir, interval=interval, count=count, clear=clear, fmt=fmt, prom_by=prom_by, keep=keep,
                  max_age=max_age, max_tasks=max_tasks, gid=_gid(group) if action is None or ebpf else None,
                  kernel_headers=kernel_headers, verbose=verbose, quiet=quiet, action=action, pin_dir=pin_dir,
                  probes=probes, ebpf=ebpf, explicit=explicit))

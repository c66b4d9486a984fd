"""pstate snap: point-in-time snapshots of per-thread scheduler state times."""

from __future__ import annotations

import grp
import os
import sys
import time

import click

from pstate.kernel import loader, probeplan
from pstate.snapshots import collector as resident, snapdir
from pstate.stream.durations import Duration
from pstate.commands.options import RenamedCommand, probes_option
from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel.kstates import KernelStates
from pstate.stream.meta import meta_record
from pstate.snapshots.taskmaps import BpfCollector, boottime_offset_ns, defines_for  # noqa: F401
from pstate.snapshots.writer import Plan, SnapDir, Snapper, Stopper

EPILOG = """\b
Examples:
  sudo pstate snap --start                        a collector that counts in the kernel
  sudo pstate snap --dir /var/lib/pstate          one snapshot of it at once (from cron)
  sudo pstate snap --status                       since when, cost, memory, fill
  sudo pstate snap --stop                         remove it
  sudo pstate snap --dir /var/lib/pstate          without one: one 5 s snapshot
  sudo pstate snap --dir /var/lib/pstate -k 1440  ... keeping the newest 1440
  sudo pstate snap --dir DIR --every 10s --max-age 24h    a daemon
  sudo pstate snap --dir DIR --every 1m --clear   each file covers its minute
  # for Prometheus, into the directory Debian's node_exporter reads
  sudo pstate snap --dir /var/lib/prometheus/node-exporter --format prom --every 15s
  pstate stats DIR/                               trends, churn, leak suspects
  jq -c 'select(.type=="task" and .uninterruptible_ns > 0)' DIR/pstate-snap-*

\b
Files: pstate-snap-<UTC time>-<seq>.jsonl (or .csv) in DIR, mode 0600
(0640 with --group), published atomically: a meta header, one task row per
thread, an end trailer (man pstate-events). CSV has the same columns, with
the meta and end records as JSON in '#' comment lines. --format prom keeps
one file, pstate-snap.prom, replaced at each snapshot, for node_exporter's
textfile collector, which runs as its own user: mode 0644 (0640 with
--group), in a DIR it can list; series are per systemd unit by default
(--prom-by), and carry process titles only with --prom-by title (man
pstate-snap: who may read what).
Rows carry their process's title and cgroup (title, cgroup, cgroup_path),
read from /proc at each snapshot.

\b
--prom-by unit is the default because a Prometheus operator aggregates by
service, and series per pid grow with every process started (their
cardinality follows churn, not the services): per unit, cgroup or title
the number of series is bounded by the services running and they never
disappear; per comm too; per pid or thread they come and go with the
processes (--prom-by process is the old name of pid).
DIR/.pstate-last.json tells the outcome of the latest snapshot.

\b
Values are cumulative since the run began (the state a thread was in when
the run began counts from then on); --clear makes each file a delta over its
own interval. Threads that exited stay in the next snapshot, then go.
A missing DIR is created (mode 0700) when its parent exists. DIR must not be
a symlink, nor group- or world-writable (exit 77). One snap per DIR: another
one exits 75. A full disk exits 73 and leaves earlier snapshots intact.
SIGINT/SIGTERM remove the snapshot in progress and exit 130/143, unless the
interval's snapshot was already out (exit 0).

\b
The collector (--start): snap's BPF programs and maps stay in the kernel,
pinned in /sys/fs/bpf/pstate/snap (bpffs is mounted there when it is not),
attached by BPF links, and count with no process running, in kernel memory
bounded by --max-tasks. Each `snap --dir DIR` then writes one snapshot of it
at once and exits: totals since the collector started, every thread that
exited since the last snapshot included, with the previous snapshot's time
(prev_ts) in the meta record; --interval, --count, --every and --clear do
not apply. --start is idempotent; --stop removes every program, link, map
and pin it made; --restart replaces it (a pstate of another layout refuses
to read it, exit 65). Without a collector, snap collects for one interval
(and says so on a terminal).

\b
The pin directory (/sys/fs/bpf/pstate, or --pin-dir DIR on bpffs) is
created 0700. bpffs is writable by every user, so one that is not a real
directory, not root's, or writable by group or others is refused (exit 77):
another user could move or hide the collector there. Remove it as root
(rm -r DIR: bpffs holds only pins) or choose another with --pin-dir;
doctor names its owner. --status, --stop, doctor and each snapshot find a
collector by its manifest wherever it was moved in bpffs (a bounded walk
that follows no symbolic link), --stop removes only pins the manifest
proves pstate made, and --start starts no second one.
"""

def make_collector(prog: loader.Program, ks: KernelStates, loaded_ts: int) -> BpfCollector:
    return BpfCollector(prog, ks, loaded_ts)


def load_program(ks: KernelStates, max_tasks: int, kernel_headers: str | None,
                 probes: str | None = None) -> loader.Program:
    return loader.Program("snap", defines_for(ks, max_tasks), kernel_headers, probes)


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
                   "cgroup, process title, command name, process (pid) or thread.")
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
    if action is not None and not ebpf:
        return _collector_command(action, max_tasks, kernel_headers, probes, quiet, resident.pin_root(pin_dir))
    if out_dir is None and not ebpf:
        raise click.UsageError("Missing option '--dir' (the directory for the snapshot files).")
    explicit = [o for o, v in (("--interval", interval), ("--count", count), ("--every", every), ("--clear", clear))
                if v not in (None, False)]
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
        raise click.UsageError("--format prom keeps one file (pstate-snap.prom): --keep and --max-age do not apply")
    gid = _gid(group)
    ks = loader.kernel_states(ebpf)
    if ebpf:
        click.echo(loader.program_text("snap", defines_for(ks, max_tasks), probes))
        return

    def log(msg: str) -> None:
        if verbose:
            print(f"pstate snap: {msg}", file=sys.stderr, flush=True)

    loader.check_privileges()  # before anything is created in DIR
    found = running_collector(resident.pin_root(pin_dir))
    if found is not None:
        return _from_collector(found, ks, out_dir, gid, fmt, prom_by, keep, max_age, explicit, quiet, log)
    if not quiet and count == 1 and (verbose or sys.stderr.isatty()):  # cron mails nothing on success
        print(f"pstate snap: no collector is running: this snapshot covers the next {interval / 1e9:g}s "
              "(`pstate snap --start` keeps one counting in the kernel)", file=sys.stderr)
    stopper = Stopper().install()
    out = prog = collector = None
    try:
        out = SnapDir(out_dir, gid=gid)
        _lock(out, quiet)
        if stopper.stopped:
            sys.exit(stopper.exit_code())
        loaded_ts = time.monotonic_ns()
        prog = load_program(ks, max_tasks, kernel_headers, probes=probes)
        meta = meta_record("snap", ks)
        meta.update({"max_tasks": max_tasks, "interval_ns": interval, "format": fmt, **prog.plan.meta()})
        plan = Plan(fmt=fmt, interval_ns=interval, count=count, clear=clear, keep=keep, max_age_ns=max_age,
                    prom_by=prom_by)
        collector = make_collector(prog, ks, loaded_ts)
        snapper = Snapper(out, collector, plan, meta, stopper, log)
        log(f"collecting into {out_dir}, {'until stopped' if count == 0 else f'{count} snapshot(s)'}, "
            f"every {interval / 1e9:g}s")
        code = snapper.run()
        if code:
            _status_failed(out, f"interrupted by signal {stopper.signum} before the snapshot was written")
    except PstateError as e:
        if out is not None and out.lock_fd is not None:
            _status_failed(out, e.message)
        raise
    finally:
        if collector is not None and hasattr(collector, "close"):
            collector.close()
        if prog is not None:
            prog.close()
        if out is not None:
            out.close()
        stopper.restore()
    if code:
        sys.exit(code)


def running_collector(root: str = resident.PIN_ROOT):
    """The running collector's pins (checked to be of this pstate's layout), or None."""
    found = resident.find(root)
    if found is not None:
        try:
            resident.check_layout(found)
        except PstateError:
            found.close()
            raise
    return found


def _collector_command(action: str, max_tasks: int, kernel_headers, probes, quiet: bool,
                       root: str = resident.PIN_ROOT) -> None:
    def say(msg: str) -> None:
        if not quiet:
            print(f"pstate snap: {msg}", file=sys.stderr)

    def notes(sv: resident.Survey) -> None:
        for s in sv.partial:
            say(f"a start killed half-way left pins in {s.dir} (`pstate snap --stop` removes them)")
        for s in sv.starting:
            say(f"a start under way (pid {s.doc.get('pid', '?')}) is pinning in {s.dir}: left alone")
        if sv.root_problem:
            say(f"the pin directory {sv.root_problem}: `pstate snap --start` refuses it (another user could move "
                f"or hide the collector there); fix: {resident.root_fix(root)}")

    cut_hint = ("`bpftool map show name pstate_meta` lists the collectors' manifests the kernel holds; remove what "
                "other users made in bpffs (as root), then run this again")
    if action == "status":
        sv = resident.survey(root)
        try:
            if not sv.running:
                notes(sv)
                if sv.cut:
                    raise PstateError(f"no collector found, but the search of bpffs was cut short ({sv.cut}): one "
                                      "pinned beyond it would not be seen", ExitCode.FAILURE, hint=cut_hint)
                say("no collector is running (`pstate snap --start` starts one)")
                sys.exit(int(ExitCode.FAILURE))
            for found in sv.running:
                for line in resident.status_lines(resident.describe(found)):
                    click.echo(line)
            if len(sv.running) > 1:
                say(f"{len(sv.running)} collectors are running, each counting (and costing) on its own: "
                    "`pstate snap --restart` leaves one")
            notes(sv)
            if sv.cut:
                say(f"the search of bpffs was cut short ({sv.cut}): a collector pinned beyond it would not be seen")
        finally:
            sv.close()
        return
    if action in ("stop", "restart"):
        doc, left, sv = resident.stop(root)
        if left:
            raise PstateError(f"the collector is stopped, but pins stay that pstate cannot prove it made, or that sit "
                              f"where another user could swap them: {', '.join(left)}", ExitCode.FAILURE,
                              hint="remove them by hand if they are not another tool's (bpftool map show / link show "
                              "tell what they are)")
        say("collector stopped: its programs, links and maps are gone" if doc else "no collector was running")
        for s in sv.starting:
            say(f"a start under way (pid {s.doc.get('pid', '?')}) is pinning in {s.dir}: left alone")
        if sv.cut:
            raise PstateError(f"the search of bpffs was cut short ({sv.cut}): a collector pinned beyond it, if any, "
                              "is still running", ExitCode.FAILURE, hint=cut_hint)
        if action == "stop":
            if sv.root_problem:
                say(f"the pin directory {sv.root_problem}: the next `pstate snap --start` refuses it; "
                    f"fix: {resident.root_fix(root)}")
            return
    ks = loader.kernel_states()
    doc, started, said = resident.start(ks, max_tasks, kernel_headers, probes, root)
    for note in said:
        say(note)
    if started:
        say(f"collector started on the {doc['probes']} path, pinned in {os.path.join(root, resident.PIN_NAME)}: "
            "`pstate snap --dir DIR` writes a snapshot of it, `pstate snap --stop` removes it")
    else:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(doc["started_wall_ns"] // 1_000_000_000))
        say(f"a collector is already running (since {since})")


def _from_collector(found, ks, out_dir, gid, fmt, prom_by, keep, max_age, explicit, quiet, log) -> None:
    """One snapshot of the running collector, at once."""
    if explicit:
        found.close()
        raise click.UsageError(f"a collector is running: each snap run writes one snapshot of it at once, "
                               f"so {', '.join(explicit)} {'does' if len(explicit) == 1 else 'do'} not apply "
                               "(`pstate snap --stop` stops it)")
    doc = found.doc
    stopper = Stopper().install()
    out = reader = None
    code = 0
    try:
        prog = resident.PinnedProgram(found)
        out = SnapDir(out_dir, gid=gid)
        _lock(out, quiet)
        state = resident.load_state(out, doc)
        reader = resident.PinnedCollector(prog, ks, state)
        meta = meta_record("snap", ks)
        meta.update({"max_tasks": doc["max_tasks"], "interval_ns": 0, "format": fmt,
                     **{k: doc[k] for k in probeplan.META_FIELDS if k in doc}, "collector_id": doc["id"],
                     "prev_ts": state.get("ts")})
        plan = Plan(fmt=fmt, interval_ns=0, count=1, keep=keep, max_age_ns=max_age, prom_by=prom_by)
        snapper = Snapper(out, reader, plan, meta, stopper, log)
        snapper.run_id = doc["id"]  # one collector, one run: its snapshots subtract
        resident.restore(state, snapper)
        code = snapper.run()
        if code:
            _status_failed(out, f"interrupted by signal {stopper.signum} before the snapshot was written")
        else:
            resident.save_state(out, doc, snapper, reader)
            reader.commit(resident.reader_id(out))
    except PstateError as e:
        if out is not None and out.lock_fd is not None:
            _status_failed(out, e.message)
        raise
    finally:
        if reader is not None:
            reader.close()
        found.close()
        if out is not None:
            out.close()
        stopper.restore()
    if code:
        sys.exit(code)


def _lock(out: SnapDir, quiet: bool) -> None:
    """Take DIR's lock, and remove the temp files killed runs left there."""
    out.lock()
    stale = out.clean_temps()
    if stale and not quiet:
        print(f"pstate snap: removed {stale} temp file{'s' if stale != 1 else ''} an interrupted run left "
              f"in {out.path}", file=sys.stderr)


def _status_failed(out: SnapDir, message: str) -> None:
    try:
        out.write_status({"ok": False, "ts": time.monotonic_ns(), "wall_ns": time.time_ns(), "file": None,
                          "pid": os.getpid(), "error": message.split("\n", 1)[0]})
    except PstateError:
        print(f"pstate snap: could not record the failure in {out.where(snapdir.STATUS_NAME)} either",
              file=sys.stderr)

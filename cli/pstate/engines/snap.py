"""snap: snapshots of every thread's time per state, from a program this
run loads for one interval or more (taskmaps.MapReader) or at once from the
running collector (collector.PinnedReader), published by
snapshots.writer.Snapper; and --start, --stop, --status of the collector
(snapshots.collector). snap(), the one entry, is what `pstate snap` runs:
commands/snap.py declares and checks the options."""

from __future__ import annotations

import os
import sys
import time

import click

from pstate import lifecycle
from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import loader, probeplan
from pstate.kernel.kstates import KernelStates
from pstate.snapshots import collector, snapdir, taskmaps
from pstate.snapshots.taskmaps import MapReader, defines_for
from pstate.snapshots.writer import Plan, SnapDir, Snapper
from pstate.stream.meta import meta_record


def snap(*, out_dir: str | None, interval: int, count: int, clear: bool, fmt: str, prom_by: str, keep: int | None,
         max_age: int | None, max_tasks: int, gid: int | None, kernel_headers: str | None, verbose: bool,
         quiet: bool, action: str | None, pin_dir: str | None, probes: str | None, ebpf: bool,
         explicit: list) -> int:
    """Take the snapshots the options ask for, or start, stop or show the
    collector (action); the exit status. explicit: the interval options
    given, which a running collector makes void."""
    if action is not None and not ebpf:
        return _collector_command(action, max_tasks, kernel_headers, probes, quiet, collector.pin_root(pin_dir))
    ks = loader.kernel_states(ebpf)
    if ebpf:
        click.echo(loader.program_text("snap", defines_for(ks, max_tasks), probes))
        return int(ExitCode.OK)

    def log(msg: str) -> None:
        if verbose:
            print(f"pstate snap: {msg}", file=sys.stderr, flush=True)

    loader.check_privileges()  # before anything is created in DIR
    found = running_collector(collector.pin_root(pin_dir))
    if found is not None:
        return _from_collector(found, ks, out_dir, gid, fmt, prom_by, keep, max_age, explicit, quiet, log)
    if not quiet and count == 1 and (verbose or sys.stderr.isatty()):  # cron mails nothing on success
        print(f"pstate snap: no collector is running: this snapshot covers the next {interval / 1e9:g}s "
              "(`pstate snap --start` keeps one counting in the kernel)", file=sys.stderr)
    stopper = lifecycle.Stopper()  # (a signal while snap started is its first)
    if stopper.stopped:
        return stopper.exit_code()  # nothing made
    out = prog = reader = None
    try:
        out = SnapDir(out_dir, gid=gid)
        _lock(out, quiet)
        if stopper.stopped:
            return stopper.exit_code()
        loaded_ts = time.monotonic_ns()
        prog = load_program(ks, max_tasks, kernel_headers, probes=probes)
        meta = meta_record("snap", ks)
        meta.update({"max_tasks": max_tasks, "interval_ns": interval, "format": fmt, **prog.plan.meta()})
        plan = Plan(fmt=fmt, interval_ns=interval, count=count, clear=clear, keep=keep, max_age_ns=max_age,
                    prom_by=prom_by)
        reader = make_reader(prog, ks, loaded_ts)
        snapper = Snapper(out, reader, plan, meta, stopper, log)
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
        if reader is not None and hasattr(reader, "close"):
            reader.close()
        if prog is not None:
            prog.close()
        if out is not None:
            out.close()
    return code


def make_reader(prog: loader.Program, ks: KernelStates, loaded_ts: int) -> MapReader:
    """The reader of the maps of this run's program (the tests give a fake)."""
    return MapReader(prog, ks, loaded_ts)


def load_program(ks: KernelStates, max_tasks: int, kernel_headers: str | None,
                 probes: str | None = None) -> loader.Program:
    return taskmaps.load_program(ks, max_tasks, kernel_headers, probes)


def running_collector(root: str = collector.PIN_ROOT):
    """The running collector's pins (checked to be of this pstate's layout), or None."""
    found = collector.find(root)
    if found is not None:
        try:
            collector.check_layout(found)
        except PstateError:
            found.close()
            raise
    return found


def _collector_command(action: str, max_tasks: int, kernel_headers, probes, quiet: bool,
                       root: str = collector.PIN_ROOT) -> int:
    def say(msg: str) -> None:
        if not quiet:
            print(f"pstate snap: {msg}", file=sys.stderr)

    def notes(sv: collector.Survey) -> None:
        for s in sv.partial:
            say(f"a start killed half-way left pins in {s.dir} (`pstate snap --stop` removes them)")
        for s in sv.starting:
            say(f"a start under way (pid {s.doc.get('pid', '?')}) is pinning in {s.dir}: left alone")
        if sv.root_problem:
            say(f"the pin directory {sv.root_problem}: `pstate snap --start` refuses it (another user could move "
                f"or hide the collector there); fix: {collector.root_fix(root)}")

    cut_hint = ("`bpftool map show name pstate_meta` lists the collectors' manifests the kernel holds; remove what "
                "other users made in bpffs (as root), then run this again")
    if action == "status":
        sv = collector.survey(root)
        try:
            if not sv.running:
                notes(sv)
                if sv.cut:
                    raise PstateError(f"no collector found, but the search of bpffs was cut short ({sv.cut}): one "
                                      "pinned beyond it would not be seen", ExitCode.FAILURE, hint=cut_hint)
                say("no collector is running (`pstate snap --start` starts one)")
                return int(ExitCode.FAILURE)
            for found in sv.running:
                for line in collector.status_lines(collector.describe(found)):
                    click.echo(line)
            if len(sv.running) > 1:
                say(f"{len(sv.running)} collectors are running, each counting (and costing) on its own: "
                    "`pstate snap --restart` leaves one")
            notes(sv)
            if sv.cut:
                say(f"the search of bpffs was cut short ({sv.cut}): a collector pinned beyond it would not be seen")
        finally:
            sv.close()
        return int(ExitCode.OK)
    if action in ("stop", "restart"):
        doc, left, sv = collector.stop(root)
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
                    f"fix: {collector.root_fix(root)}")
            return int(ExitCode.OK)
    ks = loader.kernel_states()
    if any(s in lifecycle.STOPPING for s in lifecycle.peek()):
        return lifecycle.code_of(lifecycle.take()[0])  # (a signal while snap started: nothing started)
    doc, started, said = collector.start(ks, max_tasks, kernel_headers, probes, root)
    for note in said:
        say(note)
    if started:
        say(f"collector started on the {doc['probes']} path, pinned in {os.path.join(root, collector.PIN_NAME)}: "
            "`pstate snap --dir DIR` writes a snapshot of it, `pstate snap --stop` removes it")
    else:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(doc["started_wall_ns"] // 1_000_000_000))
        say(f"a collector is already running (since {since})")
    return int(ExitCode.OK)


def _from_collector(found, ks, out_dir, gid, fmt, prom_by, keep, max_age, explicit, quiet, log) -> int:
    """One snapshot of the running collector, at once."""
    if explicit:
        found.close()
        raise click.UsageError(f"a collector is running: each snap run writes one snapshot of it at once, "
                               f"so {', '.join(explicit)} {'does' if len(explicit) == 1 else 'do'} not apply "
                               "(`pstate snap --stop` stops it)")
    doc = found.doc
    stopper = lifecycle.Stopper()  # (a signal while snap started is its first)
    out = reader = None
    code = 0
    try:
        if stopper.stopped:
            return stopper.exit_code()  # nothing made
        prog = collector.PinnedProgram(found)
        out = SnapDir(out_dir, gid=gid)
        _lock(out, quiet)
        state = collector.load_state(out, doc)
        reader = collector.PinnedReader(prog, ks, state)
        meta = meta_record("snap", ks)
        meta.update({"max_tasks": doc["max_tasks"], "interval_ns": 0, "format": fmt,
                     **{k: doc[k] for k in probeplan.META_FIELDS if k in doc}, "collector_id": doc["id"],
                     "prev_ts": state.get("ts")})
        plan = Plan(fmt=fmt, interval_ns=0, count=1, keep=keep, max_age_ns=max_age, prom_by=prom_by)
        snapper = Snapper(out, reader, plan, meta, stopper, log)
        snapper.run_id = doc["id"]  # one collector, one run: its snapshots subtract
        collector.restore(state, snapper)
        code = snapper.run()
        if code:
            _status_failed(out, f"interrupted by signal {stopper.signum} before the snapshot was written")
        else:
            collector.save_state(out, doc, snapper, reader)
            reader.commit(collector.reader_id(out))
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
    return code


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

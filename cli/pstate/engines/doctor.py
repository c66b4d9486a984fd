"""doctor: can this machine run record and snap? Each check, with what to
fix; the live test records a sleeper with `pstate record` in a child
process. doctor(), the one entry, is what `pstate doctor` runs."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import click
from tabulate import tabulate

from pstate import lifecycle
from pstate.exitcodes import ExitCode, PstateError

OK, PROBLEM, WARN = "ok", "PROBLEM", "warning"


def doctor(kernel_headers: str | None, live: bool, live_timeout: float, fmt: str) -> int:
    """Run the checks and print the report (a table, or json); the exit status."""
    with lifecycle.interruptible():
        report, code = run_checks(kernel_headers, live, live_timeout)
    if fmt == "json":
        import orjson

        click.echo(orjson.dumps([dict(zip(("check", "status", "detail", "fix"), r)) for r in report.rows]).decode())
    else:
        from pstate.stream.names import cell

        # names in the details (threads, paths) shown escaped; the line break is the table's own
        rows = [(cell(c), cell(s), cell(d) + (f"\n  fix: {cell(f)}" if f else "")) for c, s, d, f in report.rows]
        click.echo(tabulate(rows, headers=("check", "status", "detail"), tablefmt="plain", maxcolwidths=[None, None, 60]))
    if report.failed:
        click.echo("pstate doctor: some checks failed; see the fixes above", err=True)
        return int(code or ExitCode.UNAVAILABLE)
    return int(ExitCode.OK)


class Report:
    def __init__(self):
        self.rows = []

    def add(self, check, status, detail, fix=""):
        self.rows.append((check, status, detail, fix))
        return status == OK

    @property
    def failed(self):
        return any(r[1] == PROBLEM for r in self.rows)


def _short(text: str, n: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def run_checks(kernel_headers: str | None, live: bool, live_timeout: float = 60.0) -> tuple[Report, ExitCode]:
    from pstate.kernel import headers
    from pstate.kernel import kstates
    from pstate.kernel import loader

    r = Report()
    code = ExitCode.OK

    # privileges
    try:
        loader.check_privileges()
        r.add("privileges", OK, "root" if os.geteuid() == 0 else "CAP_BPF + CAP_PERFMON")
        privileged = True
    except PstateError as e:
        r.add("privileges", PROBLEM, "not root and no CAP_BPF/CAP_PERFMON (and tracefs read access)",
              "run as root (sudo), or grant CAP_BPF,CAP_PERFMON via a systemd unit; never setuid")
        privileged = False
        code = ExitCode.NOPERM
        del e

    # bcc
    try:
        bcc = loader.import_bcc()
        ver = getattr(bcc, "__version__", "") or "installed"
        r.add("bcc", OK, f"python module {ver} ({os.path.dirname(bcc.__file__)})")
        have_bcc = True
    except PstateError:
        r.add("bcc", PROBLEM, "python module 'bcc' not found",
              "apt-get install python3-bpfcc (not PyPI's bcc); venvs need --system-site-packages")
        have_bcc = False
        code = code or ExitCode.UNAVAILABLE

    # tracefs
    tracefs = kstates.tracefs_dir()
    if tracefs:
        r.add("tracefs", OK, f"mounted at {tracefs}")
    elif privileged:
        try:
            tracefs = loader.ensure_tracefs()
            r.add("tracefs", OK, f"was not mounted; mounted it at {tracefs}")
        except PstateError:
            r.add("tracefs", PROBLEM, "not mounted, and mounting failed", "mount -t tracefs nodev /sys/kernel/tracing")
            code = code or ExitCode.UNAVAILABLE
    else:
        mounted = next((d for d in kstates.TRACEFS_DIRS if os.path.ismount(d)), None)
        if mounted:
            r.add("tracefs", PROBLEM, f"mounted at {mounted} but not readable by this user",
                  "run as root, or give the pstate user read access to tracefs")
        else:
            r.add("tracefs", PROBLEM, "not mounted", "mount -t tracefs nodev /sys/kernel/tracing (as root)")
        code = code or ExitCode.UNAVAILABLE

    # tracepoints and state decoding
    ks = None
    if tracefs:
        missing = loader.missing_tracepoints(tracefs)
        if missing:
            r.add("tracepoints", PROBLEM, "missing: " + ", ".join(missing), "a kernel with CONFIG_TRACEPOINTS and sched, irq and timer events")
            code = code or ExitCode.UNAVAILABLE
        else:
            r.add("tracepoints", OK, f"{len(loader.TRACEPOINTS)} sched, task, irq and timer tracepoints present")
        try:
            ks = kstates.read_kernel_states(tracefs)
            letters = " ".join(f"{ks.letters[b]}={ks.names[b]}" for b in sorted(ks.letters))
            r.add("state decoding", OK, f"from sched_switch print_fmt: {letters}; R/R+=preempted "
                  f"(mask 0x{ks.report_mask:x}, + bit 0x{ks.preempt_bit:x})")
        except (OSError, ValueError) as e:
            r.add("state decoding", PROBLEM, f"cannot parse sched_switch format: {_short(e)}",
                  "please report this kernel's events/sched/sched_switch/format")
            code = code or ExitCode.UNAVAILABLE
    plan = _probes(r, ks)
    if privileged:
        lacking = _features(r)
        code = code or lacking or ExitCode.OK
    from pstate.kernel import recordprog

    r.add("record buffers", OK, recordprog.buffers_summary())

    # kernel headers
    tree = None
    try:
        tree = headers.find(kernel_headers)
        headers.verify(tree)
        compiles, said = headers.compile_check(tree) if have_bcc else (True, "")
        if compiles:
            r.add("kernel headers", OK, tree.describe())
        else:  # BCC cannot build even an empty program against it: record would fail the same way
            r.add("kernel headers", PROBLEM, _short(f"{tree.describe()} does not compile: {said}", 400),
                  "install a complete tree (apt-get install linux-headers-amd64, any version; "
                  "dnf install kernel-devel), or pass --kernel-headers DIR of one")
            tree = None
            code = code or ExitCode.UNAVAILABLE
    except headers.HeadersUntrusted as e:
        tree = None
        problem, _, fix = e.message.partition("\n  fix: ")
        r.add("kernel headers", PROBLEM, _short(problem), fix)
        code = code or ExitCode.NOPERM
    except headers.HeadersNotFound as e:
        r.add("kernel headers", PROBLEM, _short(e),
              "apt-get install linux-headers-amd64 (any version), or --kernel-headers DIR")
        code = code or ExitCode.UNAVAILABLE
    except OSError as e:
        r.add("kernel headers", PROBLEM, f"cannot prepare the header tree: {_short(e)}",
              "check that /var/cache/pstate is writable")
        code = code or ExitCode.UNAVAILABLE

    # program cache: shown only when it is refused (then every run compiles, about a second)
    from pstate.kernel import progcache

    usable, detail = progcache.status()
    if not usable:
        r.add("program cache", WARN, detail,
              f"chown root and chmod go-w {progcache.cache_dir()} and every directory above it, or remove it")

    if privileged:
        _collector(r)

    if not live:
        r.add("live test", WARN, "skipped (--no-live)")
        return r, code
    if not (privileged and have_bcc and tracefs and tree and ks):
        r.add("live test", PROBLEM, "skipped: fix the problems above first")
        return r, code or ExitCode.UNAVAILABLE

    ok, detail, fix = _live_test(kernel_headers, plan, live_timeout)
    r.add("compile, attach, events", OK if ok else PROBLEM, detail, fix)
    if not ok:
        code = code or ExitCode.OSERR
    else:
        r.add("unseen switches", *_unseen_switches(kernel_headers))
    return r, code


def _collector(r: Report) -> None:
    """The snap collector (`pstate snap --start`): running, since when, its
    cost and fill; one of another pstate's layout; one pinned where another
    user can move it (found wherever it is); pins a killed start left; a pin
    directory another user made or can write; a search of bpffs cut short."""
    from pstate.snapshots import collector

    try:
        sv = collector.survey()
    except OSError as e:
        r.add("snap collector", WARN, _short(f"bpffs could not be searched: {e.strerror or e}"),
              f"look at {collector.PIN_ROOT}")
        return
    warn, details, fixes = False, [], []
    try:
        for found in sv.running:
            info = collector.describe(found)
            lines = collector.status_lines(info)
            if not info["layout_ok"]:
                warn = True
                details.append("stale: " + "; ".join(lines))
                fixes.append("pstate snap --restart")
            else:
                details.append("; ".join(lines))
            if info.get("exposed"):
                warn = True
                fixes.append("sudo pstate snap --stop (it finds the collector wherever it is), then start it again "
                             "in a pin directory of root's")
    finally:
        sv.close()
    if len(sv.running) > 1:
        warn = True
        details.append(f"{len(sv.running)} collectors are running, each costing as much")
        fixes.append("pstate snap --restart leaves one")
    if sv.partial:
        warn = True
        details.append(f"a start killed half-way left pins in {', '.join(s.dir for s in sv.partial)}")
        fixes.append("pstate snap --stop removes them")
    if sv.root_problem:
        warn = True
        details.append(f"the pin directory {sv.root_problem}: `pstate snap --start` refuses it (another user "
                       "could move or hide the collector there)")
        fixes.append(collector.root_fix(sv.root))
    if sv.cut:
        warn = True
        details.append(f"the search of bpffs was cut short ({sv.cut}): a collector pinned beyond it would not be seen")
        fixes.append("remove what other users made in bpffs (as root); `bpftool map show name pstate_meta` lists "
                     "the collectors' manifests the kernel holds")
    if not sv.running:
        details.insert(0, "none running (`pstate snap --start` starts one)")
    r.add("snap collector", WARN if warn else OK, "; ".join(details), "; ".join(dict.fromkeys(fixes)))


def _features(r: Report) -> ExitCode | None:
    """What the kernel's BPF can do, probed (pstate.kernel.features): record
    cannot run without the ring buffer; the collector, without links."""
    from pstate.kernel import features

    have, lack = [], []
    for f, (what, since, need, still) in features.FEATURES.items():
        why = features.missing(f)
        if why is None:
            have.append(what)
        else:
            lack.append((f, f"no {what}: {need} (it came with {since}; the probe said: {why})", still))
    if not lack:
        r.add("BPF features", OK, "; ".join(have))
        return None
    for f, detail, still in lack:
        r.add("BPF features", PROBLEM if f == features.RINGBUF else WARN, detail, still)
    return ExitCode.UNAVAILABLE if any(f == features.RINGBUF for f, _d, _s in lack) else None


def _probes(r: Report, ks):
    """How record and snap attach each tracepoint here (pstate.kernel.probeplan)
    and why, as far as it is known without loading (the live test loads);
    record's plan, or None when it cannot be told."""
    from pstate.kernel import loader, probeplan

    if ks is None:
        return None
    try:
        plans = {name: loader.probe_plan(name, {"REPORT_MASK": ks.report_mask}, None) for name in ("record", "snap")}
    except PstateError as e:
        problem, _, fix = e.message.partition("\n  fix: ")
        r.add("probes", PROBLEM, _short(problem, 400), fix or "unset PSTATE_PROBES and PSTATE_WAKE_LIST, or set them to auto")
        return None
    plan = plans["record"]
    if plan.wake_list:
        wake = "record's wake-ups at sched_wakeup, the waker of one on a wake list noted at csd_queue_cpu"
    elif os.environ.get(probeplan.WAKE_LIST_ENV) == "off":
        wake = f"record's wake-ups at sched_waking ({probeplan.WAKE_LIST_ENV}=off)"
    else:
        wake = "record's wake-ups at sched_waking (the kernel has no csd_queue_cpu with the wake list's members)"
    by_path: dict = {}
    for p in plans.values():
        for event, path in p.paths.items():
            by_path.setdefault(path, [])
            if event not in by_path[path]:
                by_path[path].append(event)
    parts = [f"{path}: {', '.join(events)}" for path, events in sorted(by_path.items(), key=lambda kv: kv[0] != "tp_btf")]
    detail = "; ".join(parts) + f" ({plan.reason}); {wake}"
    notes = list(dict.fromkeys(n for p in plans.values() for n in p.notes))
    if notes:
        detail += "; " + "; ".join(notes)
    gaps = {e: w for p in plans.values() for e, w in p.why.items()}
    if all(p.path == probeplan.TP_BTF for p in plans.values()) or plan.forced:
        r.add("probes", OK, detail)
    else:
        r.add("probes", WARN, detail, "; ".join(f"{e}: {w}" for e, w in gaps.items())
              or "a kernel whose BTF has each tracepoint gets the cheaper tp_btf path")
    return plan


class _Each:
    """A sink of the one reader (pstate.stream.reader) that hands every record on."""

    def __init__(self, each):
        self.each = each

    def record(self, rec: dict, weight: int) -> None:
        self.each(rec)


def _read_output(chunks, each):
    """Record's output (chunks of bytes, as they come) through the one
    reader, each record to each(rec); its ReadStats (lines skipped)."""
    from pstate.stream.reader import ReadStats, StreamReader

    stats = ReadStats()
    rd = StreamReader(_Each(each), stats, dicts=True)
    rd.begin("pstate record")
    for data in chunks:
        rd.feed(data)
    rd.end()
    return stats


def _live_test(kernel_headers: str | None, plan=None, timeout: float = 60.0) -> tuple[bool, str, str]:
    """Record a child that sleeps; check the events (and which path the
    programs took, when the plan was tp_btf). The child sleeps until record
    is done: a cold compile on a busy machine may take seconds before
    record's 1.2 s begin."""
    cmd = [sys.executable, "-m", "pstate", "record", "-q", "-d", "1.2"]
    if kernel_headers:
        cmd += ["--kernel-headers", kernel_headers]
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nwhile True: time.sleep(0.05)"])
    try:
        t0 = time.monotonic()
        p = subprocess.run(cmd + ["-p", str(child.pid)], capture_output=True, timeout=timeout)
        elapsed = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        child.kill()
        return False, f"record did not finish within {timeout:g} s", \
            "run `pstate record -d 1` to see where it hangs; a first compile on a slow machine may need " \
            "a longer --live-timeout"
    finally:
        child.kill()
        child.wait()
    if p.returncode != 0:
        return False, f"record failed (exit {p.returncode}): {_short(p.stderr.decode(errors='replace'), 300)}", \
            "see the message; `pstate record --ebpf` prints the program"
    lines = p.stdout.splitlines()
    recs: list[dict] = []
    stats = _read_output([p.stdout], recs.append)
    if stats.n_skipped:
        return False, f"record wrote {stats.n_skipped} lines that are not records ({_short(stats.first_bad)})", \
            "please report this"
    states = [x for x in recs if x.get("type") == "state"]
    sleeps = [x for x in states if x.get("from") == "sleeping" and x.get("cause") == "wakeup"]
    bad = {x["to"] for x in states if x["to"].startswith("state_")} | {x["from"] for x in states if x["from"].startswith("state_")}
    end = recs[-1] if recs else {}
    if not states or end.get("type") != "end":
        return False, f"no events arrived ({len(lines)} lines)", "check dmesg for BPF errors"
    if bad:
        return False, f"undecoded states: {sorted(bad)}", "please report this kernel's sched_switch format"
    if not sleeps:
        return False, "events flow but no sleeping->runnable wake-up was seen", "please report this"
    meta = recs[0] if recs and recs[0].get("type") == "meta" else {}
    path = meta.get("probes", "?")
    if plan is not None and meta.get("probe_paths", plan.paths) != plan.paths:
        path += f" (the kernel refused tp_btf: {_short(meta.get('probes_reason', '?'), 200)})"
    return True, (f"{len(states)} transitions of a test sleeper decoded, {len(sleeps)} wake-ups, "
                  f"lost {end.get('lost', '?')}, on the {path} path; run took {elapsed:.1f} s"), ""


UNSEEN_MIN = 2  # switches the kernel counts, none traced: a thread record cannot see switch
UNSEEN_LOOK_S, UNSEEN_RECORD_S = 0.5, 2  # the first look, the recording


def _unseen_switches(kernel_headers: str | None) -> tuple[str, str, str]:
    """(status, detail, fix): threads whose context switches the kernel
    counts (/proc) while record traces no switch-out of theirs, so that
    they read as running all the time (pstate.kernel.switchcounts). Records
    the threads that switched in a first look, for two seconds."""
    from pstate.kernel import switchcounts

    first = switchcounts.read()
    time.sleep(UNSEEN_LOOK_S)
    mine = {int(t) for t in os.listdir(f"/proc/{os.getpid()}/task") if t.isdigit()}
    tids = switchcounts.busiest(first, switchcounts.read(), 1, 1000, exclude=mine)
    if not tids:
        return OK, f"no thread switched in {UNSEEN_LOOK_S} s: nothing to compare", ""
    cmd = [sys.executable, "-m", "pstate", "record", "-q", "-d", str(UNSEEN_RECORD_S)]
    if kernel_headers:
        cmd += ["--kernel-headers", kernel_headers]
    cmd += [x for t in tids for x in ("-t", str(t))]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    watchdog = threading.Timer(60, p.kill)
    watchdog.start()
    before, after, outs, end = None, None, {}, {}

    def each(rec: dict) -> None:
        nonlocal before, after, end
        kind = rec["type"]
        if kind == "meta" and before is None:
            before = switchcounts.read()  # the programs report from here on
        elif kind == "state" and rec["cause"] == "switch_out":
            outs[rec["tid"]] = outs.get(rec["tid"], 0) + 1
        elif kind == "end" and not end:
            # the programs stopped before the final drain: read now, not
            # after record's exit (detaching them wakes kernel threads)
            after, end = switchcounts.read(), rec

    try:
        stats = _read_output(iter(lambda: p.stdout.read1(1 << 16), b""), each)
        p.wait()
    finally:
        watchdog.cancel()
    if stats.n_skipped:
        return WARN, f"not checked: record wrote {stats.n_skipped} lines that are not records", "please report this"
    if p.returncode != 0 or before is None or after is None:
        why = f"exit {p.returncode}" if p.returncode != 0 else "no meta or end record"
        return WARN, f"not checked: record of {len(tids)} threads failed ({why})", "run `pstate record -d 1` to see why"
    if end.get("lost"):
        return WARN, f"not checked: record lost {end['lost']} events", ""
    found = switchcounts.unseen(before, after, outs, UNSEEN_MIN, tids)
    if not found:
        return OK, f"every switch of {len(tids)} busy threads traced ({UNSEEN_RECORD_S} s)", ""
    names = ", ".join(f"{name} (tid {tid}, {n} switches)" for tid, name, n in found[:5])
    more = f" and {len(found) - 5} more" if len(found) > 5 else ""
    threads = f"{len(found)} thread{'s' if len(found) > 1 else ''}"
    return WARN, (f"{threads} switched with no switch-out traced in {UNSEEN_RECORD_S} s: {names}{more}; record, "
                  "snap and heat show them running all the time"), \
        ("the kernel traces nothing on a CPU while they run (a hypervisor agent's threads, say); read their "
         "time from /proc/PID/task/TID/schedstat, or leave them out (-p, -c)")



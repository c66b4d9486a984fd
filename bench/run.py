"""pstate's benchmark suite (issue #8): overhead side by side with the peers,
record's overhead knobs, the highest rate record keeps without loss, and the
readers' throughput. `make bench` runs it; it needs root.

    python bench/run.py                  full run (10-16 min, depending on other load)
    python bench/run.py --quick          fewer rounds, a smaller recording (~5 min)
    python bench/run.py --only storm,readers --rounds 4

Sections (--only): storm, hackbench, accounting, governor, zero-loss, readers.
Prints a table per section, a markdown table for the README, and writes
bench/results/latest.json (date, kernel, CPU, load average, every run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from tabulate import tabulate

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import contenders as ct  # noqa: E402
import readers  # noqa: E402
import storm  # noqa: E402

SECTIONS = ("storm", "hackbench", "accounting", "governor", "zero-loss", "readers")
ZERO_LOSS_RATES = (100_000, 200_000, 300_000, 500_000, 700_000)
TRANSITIONS_PER_ROUND_TRIP = 6  # 2 switches (out + in each) and 2 wake-ups

TARGETS = {
    "record_ratio": 0.75, "record_min_dur_ratio": 0.88, "snap_ratio": 0.90, "zero_loss_rate": 500_000,
    "stats_eps": 1_000_000, "replay_eps": 1_000_000, "heat_live_eps": 200_000, "startup_s": 1.0,
    "rss_mb": 150,
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- machine -------------------------------------------------------------------

def _first(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        return (r.stdout or r.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "n/a"


def machine() -> dict:
    cpu = "n/a"
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.+)$", f.read(), re.M)
            cpu = m.group(1).strip() if m else cpu
    except OSError:
        pass
    try:
        import pstate

        pver = pstate.__version__
    except ImportError:
        pver = "n/a"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(), "kernel": platform.release(), "cpu_model": cpu,
        "ncpu": os.cpu_count(), "python": platform.python_version(), "pstate": pver,
        "perf": _first(["perf", "--version"]), "bpftrace": _first(["bpftrace", "--version"]),
        "virt": _first(["systemd-detect-virt"]),  # "none" on bare metal; the pages say which
        "loadavg_start": storm.loadavg(),
    }


# --- one traced run -------------------------------------------------------------

class Runner:
    def __init__(self, tmp: str):
        self.tmp = tmp
        self.n = 0

    def traced(self, c: ct.Contender, workload: storm.Workload, *, accounting: bool = False):
        """Start c, wait until it is ready, run the workload, stop c.
        Returns (throughput or None, details)."""
        self.n += 1
        wd = os.path.join(self.tmp, f"{self.n:04d}-{c.key}")
        run = None
        try:
            run = ct.Running(c, wd)
            run.wait_ready()
            if c.kind == "record":
                run.wait_first_event()
            t0 = time.monotonic()
            thr = workload.run()
            t1 = time.monotonic()
            kstats = None
            if accounting:
                m0 = time.monotonic_ns()
                progs = ct.prog_stats(run.pid)
                m1 = time.monotonic_ns()
                kstats = ct.switch_prog(progs)
                if kstats:
                    kstats = dict(kstats)  # not an element of its own all_programs
                    kstats["read_at_ns"] = (m0 + m1) // 2
                    kstats["read_window_ns"] = m1 - m0
                    kstats["all_programs"] = progs
            run.stop()
            t2 = time.monotonic()
            res = ct.collect(run)
            res["workload_s"] = round(t1 - t0, 3)
            res["traced_s"] = round(t2 - run.t0 - (run.ready_s or 0), 3)
            if res.get("events") and not res.get("events_per_s"):
                res["events_per_s"] = res["events"] / res["traced_s"]
            if kstats:
                res["kernel_prog"] = kstats
                # all the tracer's programs per context switch (other load has
                # switches too, so this does not depend on how much there was)
                if kstats.get("run_cnt"):
                    res["bpf_ns_per_switch"] = (sum(p["run_time_ns"] for p in kstats["all_programs"])
                                                / kstats["run_cnt"])
                if c.kind == "record" and os.path.exists(run.out):
                    res["switches_in_file"] = switches_in_file(run.out, kstats["read_at_ns"])
            if not res.get("ok"):
                return None, res
            return thr, res
        except ct.StartFailed as e:
            return None, {"ok": False, "error": str(e)}
        finally:
            if run is not None and run.returncode is None:
                run.stop()
            shutil.rmtree(wd, ignore_errors=True)


def switches_in_file(path: str, t_max: int) -> int:
    """sched_switch calls a recording saw up to t_max: each call writes a
    switch_out (prev not idle) and/or a switch_in (next not idle); a switch_in
    with prev_tid 0 is the only record of a switch from idle."""
    n = 0
    with open(path, "rb") as f:
        for line in f:
            if b'"cause":"switch_' not in line:
                continue
            i = line.find(b'"ts":') + 5
            if int(line[i:line.find(b",", i)]) > t_max:
                continue
            if b'"cause":"switch_out"' in line or line.endswith(b'"prev_tid":0}\n'):
                n += 1
    return n


# --- sections -------------------------------------------------------------------

def preflight(headers: str | None) -> tuple[list[ct.Contender], dict]:
    """Which contenders can run here; runqlat-bpfcc is tried as installed,
    then with pstate's merged header tree as BCC_KERNEL_SOURCE."""
    notes = {}
    if os.geteuid() != 0:
        sys.exit("bench/run.py needs root (BPF, perf, sysctl)")
    cs = ct.default_contenders(headers)
    keep = []
    for c in cs:
        exe = c.argv[3]
        if shutil.which(exe) is None and not os.path.exists(exe):
            notes[c.key] = f"n/a: {exe} not installed"
            continue
        keep.append(c)
    # runqlat: does it load at all on this kernel?
    rq = [c for c in keep if c.key == "runqlat"]
    if rq:
        plain = ct.Contender("runqlat", "runqlat-bpfcc", "bcc", ["taskset", "-c", ct.TRACER_CPU, "runqlat-bpfcc"],
                             ready="text:Tracing run queue latency", stop_signal=2)
        err = _try_start(plain)
        if err is None:
            keep[keep.index(rq[0])] = plain
            notes["runqlat"] = "runs as installed"
        else:
            # Its failure as installed is the finding; the runs then use
            # pstate's merged header tree (a run that fails says so).
            notes["runqlat_as_installed"] = f"fails: {err}"
            if headers:
                notes["runqlat"] = f"runs with BCC_KERNEL_SOURCE={headers}"
            else:
                notes["runqlat"] = "n/a: fails as installed and no merged header tree to try"
                keep.remove(rq[0])
    return keep, notes


def _try_start(c: ct.Contender) -> str | None:
    tmp = tempfile.mkdtemp(prefix="pstate-bench-try-")
    try:
        run = ct.Running(c, tmp)
        try:
            run.wait_ready(timeout=60)
        except ct.StartFailed as e:
            return _first_error(str(e))
        run.stop()
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _first_error(text: str) -> str:
    for pat in (r"Unable to find kernel headers[^.]*", r"Exception: [^\n]+", r"error: [^\n]{0,160}"):
        m = re.search(pat, text)
        if m:
            return m.group(0)[:200]
    return text[:200]


def accounting(runner: Runner, workload: storm.Workload, cs: list[ct.Contender]) -> dict:
    """One run per contender with kernel.bpf_stats_enabled=1: the kernel's own
    count of sched_switch program runs next to what each tool reported."""
    out = {}
    with ct.BpfStats():
        for c in cs:
            thr, res = runner.traced(c, workload, accounting=True)
            out[c.key] = res
            kp = res.get("kernel_prog") or {}
            msg = f"run_cnt {kp.get('run_cnt')}" if kp else "no BPF program"
            if "switches_in_file" in res:
                msg += f", switches in file {res['switches_in_file']}"
            if "counted" in res:
                msg += f", counted {res['counted']}"
            if res.get("lost_reported") is not None:
                msg += f", lost reported {res['lost_reported']}"
            log(f"  accounting {c.key}: {msg}" + ("" if res.get("ok") else f" FAILED {res.get('error', '')[:200]}"))
    return {"contenders": out}


def governor_details(runs: list[dict]) -> dict:
    """What --max-rate did, summed over the runs."""
    keys = ("events_per_s", "lost_reported", "rate_records")
    d = {k: statistics.median([r[k] for r in runs if r.get(k) is not None] or [0]) for k in keys}
    d["sampled"] = statistics.median([r.get("lost", {}).get("sampled", 0) for r in runs] or [0])
    d["ringbuf_full"] = statistics.median([r.get("lost", {}).get("ringbuf_full", 0) for r in runs] or [0])
    return d


def zero_loss(tmp: str, seconds: float, rates=ZERO_LOSS_RATES, c: ct.Contender | None = None,
              storms: bool = True) -> dict:
    """The highest transition rate record keeps for `seconds` without loss,
    default buffer, from a paced ping-pong on CPU 1 (then, with storms, an
    unpaced storm on each CPU). c: the record to run (default: plain -o)."""
    rows = []
    best = None
    fails = 0
    c = c or ct.pstate_record("record", "pstate record")
    for target in rates:
        wd = os.path.join(tmp, f"zl-{target}")
        run = ct.Running(c, wd)
        try:
            run.wait_ready()
            run.wait_first_event()
            r = subprocess.run(storm.pingpong_argv(target / TRANSITIONS_PER_ROUND_TRIP, seconds),
                               capture_output=True, text=True)
            run.stop()
            res = ct.collect(run)
        except ct.StartFailed as e:
            rows.append({"target": target, "ok": False, "error": str(e)})
            break
        finally:
            if run.returncode is None:
                run.stop()
        rt, secs, rt_rate = r.stdout.split()
        kev = res.get("kernel_events") or 0
        dur = res.get("duration_s") or seconds
        lost = res.get("lost_not_sampled", 0)
        # the kernel side's rate while the generator ran (other load included)
        row = {"target": target, "achieved": kev / max(float(secs), 1e-9), "generator_round_trips_per_s": float(rt_rate),
               "generator": float(rt_rate) * TRANSITIONS_PER_ROUND_TRIP,
               "kernel_events": kev, "events": res.get("events"), "lost": lost, "lost_by_reason": res.get("lost"),
               "unreported": res.get("unreported"), "cpu_s": res.get("cpu_s"), "duration_s": dur,
               "bytes": res.get("bytes"), "ratio": res.get("ratio"), "loadavg": storm.loadavg()[0]}
        rows.append(row)
        shutil.rmtree(wd, ignore_errors=True)
        log(f"  zero-loss target {target:,}/s: achieved {row['achieved']:,.0f}/s, lost {lost:,}, "
            f"unreported {row['unreported']}, record CPU {row['cpu_s']}s")
        if lost == 0:
            best = max(best or 0, row["achieved"])
            fails = 0
        else:
            fails += 1
            if fails >= 2:
                break
    if storms:
        storm_row = zero_loss_storms(tmp, c=c)
        rows.append(storm_row)
        if storm_row.get("ok", True) and storm_row.get("lost") == 0:
            best = max(best or 0, storm_row["achieved"])
    return {"seconds": seconds, "rows": rows, "max_zero_loss_rate": best}


def events_between(path: str, t0_ns: int, t1_ns: int) -> int:
    """Event records in a recording whose ts lies in [t0_ns, t1_ns]."""
    n = 0
    with open(path, "rb") as f:
        for line in f:
            p = line.find(b'"ts":')
            if p < 0 or line.startswith(b'{"type":"meta"') or line.startswith(b'{"type":"end"') \
                    or line.startswith(b'{"type":"loss"') or line.startswith(b'{"type":"rate"'):
                continue
            q = p + 5
            e = q
            while e < len(line) and 48 <= line[e] <= 57:
                e += 1
            if e > q and t0_ns <= int(line[q:e]) <= t1_ns:
                n += 1
    return n


def zero_loss_storms(tmp: str, loops: int = 300_000, c: ct.Contender | None = None) -> dict:
    """Beyond what the paced generator reaches: an unpaced pipe storm on each
    CPU at once (record shares CPU 0 with one of them). The rate is the
    events the file holds from the storms' window over its length."""
    c = c or ct.pstate_record("record", "pstate record")
    wd = os.path.join(tmp, "zl-storms")
    run = ct.Running(c, wd)
    try:
        run.wait_ready()
        run.wait_first_event()
        t0 = time.monotonic_ns()
        procs = [subprocess.Popen(["taskset", "-c", cpu, "perf", "bench", "sched", "pipe", "-l", str(loops)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for cpu in ("0", "1")]
        for p in procs:
            p.wait()
        t1 = time.monotonic_ns()
        run.stop()
        res = ct.collect(run)
    except ct.StartFailed as e:
        return {"target": "2 storms", "ok": False, "error": str(e)}
    finally:
        if run.returncode is None:
            run.stop()
    plain = ct.plain_copy(run.out)
    in_window = events_between(plain, t0, t1)
    if plain != run.out:
        os.unlink(plain)
    secs = (t1 - t0) / 1e9
    lost = res.get("lost_not_sampled", 0)
    row = {"target": "2 storms", "achieved": in_window / secs, "generator": None, "kernel_events": res.get("kernel_events"),
           "events": res.get("events"), "lost": lost, "lost_by_reason": res.get("lost"), "unreported": res.get("unreported"),
           "cpu_s": res.get("cpu_s"), "duration_s": secs, "bytes": res.get("bytes"), "ratio": res.get("ratio"),
           "loadavg": storm.loadavg()[0]}
    shutil.rmtree(wd, ignore_errors=True)
    log(f"  zero-loss, a pipe storm on each CPU: {row['achieved']:,.0f} transitions/s for {secs:.1f}s, lost {lost:,}, "
        f"unreported {row['unreported']}, record CPU {row['cpu_s']}s")
    return row


# --- tables ----------------------------------------------------------------------

def fmt_ratio(s: dict | None) -> str:
    if not s or s.get("median") is None:
        return "n/a"
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def _med(runs: list[dict], key: str):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def _num(v, fmt="{:,.0f}") -> str:
    return "n/a" if v is None else v if isinstance(v, str) else fmt.format(v)


def contender_rows(results: dict, labels: dict, notes: dict) -> list[list]:
    labels = {k: v for k, v in labels.items() if not k.startswith("gov_")}
    storm_r = results.get("storm", {}).get("contenders", {})
    hack_r = results.get("hackbench", {}).get("contenders", {})
    rows = []
    for key, label in labels.items():
        s = storm_r.get(key)
        h = hack_r.get(key)
        runs = [r for r in (s or {}).get("runs", []) if r.get("ok")]
        all_runs = runs + [r for r in (h or {}).get("runs", []) if r.get("ok")]
        if not s and not h:
            rows.append([label, notes.get(key, "not run")] + [""] * (len(HEADERS) - 2))
            continue
        eps = _med(runs, "events_per_s")
        bpe = _med(runs, "bytes_per_event")
        drops = "n/a"
        unrep = "n/a"
        if runs and runs[0].get("kernel_events") is not None:
            lost = [r["lost_not_sampled"] / r["kernel_events"] for r in runs if r.get("kernel_events")]
            drops = f"{statistics.median(lost):.1%}" if lost else "n/a"
            unrep = str(max((r.get("unreported") or 0) for r in runs))
        elif runs and "lost_reported" in runs[0] and runs[0]["lost_reported"] is not None:
            drops = _num(_med(runs, "lost_reported"))
        ready = _med(all_runs, "ready_s")
        first = _med(all_runs, "first_event_s") if key == "record" else None
        startup = "n/a" if ready is None else (f"{ready:.2f} s" if first is None else f"{ready:.2f} / {first:.2f} s")
        rss = max((r.get("maxrss_mb") or 0 for r in all_runs), default=None)
        rows.append([label, fmt_ratio((s or {}).get("ratio")), fmt_ratio((s or {}).get("cpu_ratio")),
                     fmt_ratio((h or {}).get("ratio")), _num(eps),
                     _num(bpe, "{:.0f}"), drops, unrep, startup, _num(rss, "{:.0f} MB")])
    return rows


HEADERS = ["contender", "storm ratio", "storm ratio per CPU s", "hackbench ratio", "events/s", "bytes/event", "lost",
           "unreported", "ready (/ first event)", "peak RSS"]


def consumer_cost(results: dict) -> dict | None:
    """CPU per event of record's user-space side: the all-events run's CPU
    time minus the --min-dur run's (which writes almost nothing and so costs
    start-up alone), divided by the extra events."""
    st = (results.get("storm") or {}).get("contenders") or {}
    a = [r for r in (st.get("record") or {}).get("runs", []) if r.get("ok")]
    b = [r for r in (st.get("record_min_dur") or {}).get("runs", []) if r.get("ok")]
    if not a or not b:
        return None
    cpu_a, cpu_b = _med(a, "cpu_s"), _med(b, "cpu_s")
    ev_a, ev_b = _med(a, "events"), _med(b, "events")
    if None in (cpu_a, cpu_b, ev_a, ev_b) or ev_a <= ev_b:
        return None
    return {"us_per_event": (cpu_a - cpu_b) / (ev_a - ev_b) * 1e6, "startup_cpu_s": cpu_b,
            "events_per_cpu_s": (ev_a - ev_b) / max(1e-9, cpu_a - cpu_b)}


def targets(results: dict) -> list[dict]:
    st = results.get("storm", {}).get("contenders", {})
    out = []

    def add(name, value, ok, shown):
        out.append({"target": name, "measured": shown, "value": value, "met": ok})

    def ratio(key, which):
        return ((st.get(key) or {}).get(which) or {}).get("median")

    # The verdict uses the ratio per CPU second: on a shared machine the
    # wall-clock ratio measures the other load as much as the tracer. On a
    # quiet machine the two agree (the storm keeps CPU 1 busy either way).
    for key, tkey, label in (("record", "record_ratio", "record ratio ≥ 0.75"),
                             ("record_min_dur", "record_min_dur_ratio", "record --min-dur 1ms ratio ≥ 0.88"),
                             ("snap", "snap_ratio", "snap ratio ≥ 0.90")):
        v = ratio(key, "cpu_ratio")
        w = ratio(key, "ratio")
        add(label, v, None if v is None else v >= TARGETS[tkey],
            f"{_num(v, '{:.2f}')} per CPU s (wall clock {_num(w, '{:.2f}')})")
    runs = [r for r in (st.get("record") or {}).get("runs", []) if r.get("ok")]
    if runs:
        unrep = max((r.get("unreported") or 0) for r in runs)
        add("record: 0 unreported drops", unrep, unrep == 0, str(unrep))
    zl = results.get("zero_loss", {}).get("max_zero_loss_rate")
    if "zero_loss" in results:
        add("record zero loss ≥ 500k transitions/s", zl, None if zl is None else zl >= TARGETS["zero_loss_rate"],
            _num(zl, "{:,.0f}/s") if zl else "none")
    rd = results.get("readers", {}).get("readers", {})
    for name, tkey in (("stats", "stats_eps"), ("replay --no-wait", "replay_eps")):
        r = rd.get(name) or {}
        # one process on one core: per CPU second where measured (stats -j 1)
        v = r.get("events_per_cpu_s") or r.get("events_per_s")
        add(f"{name} ≥ 1 M events/s (one core)", v, None if v is None else v >= TARGETS[tkey],
            f"{_num(v, '{:,.0f}')} per CPU s ({_num(r.get('events_per_s'), '{:,.0f}')}/s wall)")
    hl = rd.get("heat --live") or {}
    if hl:
        # keeping up means drawing every event: kept up while sampling 1/k is not it
        ok = None if hl.get("paced_kept_up") is None else bool(hl["paced_kept_up"] and (hl.get("paced_sampling") or 1) <= 1)
        add("heat --live keeps up with 200k events/s (no sampling)", hl.get("paced_kept_up"), ok,
            f"in time: {hl.get('paced_kept_up')}, sampling 1/{hl.get('paced_sampling')}")
    allruns = []
    for sec in ("storm", "hackbench"):
        for key in ("record",):
            allruns += [r for r in ((results.get(sec, {}).get("contenders", {}).get(key) or {}).get("runs", []))
                        if r.get("ok")]
    if allruns:
        su = _med(allruns, "first_event_s")
        add("start-up ≤ 1 s to the first event", su, None if su is None else su <= TARGETS["startup_s"],
            _num(su, "{:.2f} s (median)"))
        for sec in ("storm", "hackbench"):
            for key in ("record_min_dur", "snap"):
                allruns += [r for r in ((results.get(sec, {}).get("contenders", {}).get(key) or {}).get("runs", []))
                            if r.get("ok")]
        rss = max(r.get("maxrss_mb") or 0 for r in allruns)
        add("peak RSS ≤ 150 MB", rss, rss <= TARGETS["rss_mb"], f"{rss:.0f} MB (max of record, --min-dur, snap)")
    return out


def report(results: dict, labels: dict, notes: dict) -> str:
    m = results["machine"]
    lines = [f"pstate benchmarks, {m['date']}: {m['cpu_model']}, {m['ncpu']} CPUs, kernel {m['kernel']}, "
             f"load average {m['loadavg_start'][0]:.2f} at the start, {results.get('loadavg_end', [0])[0]:.2f} at "
             f"the end", ""]
    if "storm" in results or "hackbench" in results:
        s = results.get("storm", {})
        h = results.get("hackbench", {})
        lines.append(f"Overhead: ratio = traced / untraced throughput (median, min–max of {results['rounds']} "
                     f"rounds on the storm, {results['hack_rounds']} on hackbench); storm baseline "
                     f"{_num((s.get('baseline') or {}).get('median'))} ops/s, hackbench baseline "
                     f"{_num((h.get('baseline') or {}).get('median'), '{:.2f}')} runs/s. \"per CPU s\": the same "
                     f"with ops per CPU second of the workload, which other load on the machine does not move.")
        rows = contender_rows(results, labels, notes)
        lines += [tabulate(rows, HEADERS, tablefmt="simple", disable_numparse=True), ""]
        lines.append("  events/s: events written per second traced; lost: pstate = median share of the kernel side's "
                     "events dropped (reported in-band), perf = LOST records; unreported: max over runs of kernel "
                     "events minus events in the file minus reported drops; ready: process start to attached "
                     "(pstate: meta line written), first event: to the first event line in the file")
        for k, v in notes.items():
            lines.append(f"  {k}: {v}")
        cc = results.get("record_consumer")
        if cc:
            lines.append(f"  pstate record's consumer: {cc['us_per_event']:.2f} µs of CPU per event written "
                         f"(its CPU time beyond start-up, which is {cc['startup_cpu_s']:.2f} s: median of record "
                         f"minus median of record --min-dur, per extra event)")
        lines.append("")
    acc = (results.get("accounting") or {}).get("contenders")
    if acc:
        rows = []
        for key, r in acc.items():
            kp = r.get("kernel_prog") or {}
            seen = r.get("switches_in_file", r.get("counted"))
            rows.append([labels.get(key, key), _num(kp.get("run_cnt")), _num(seen),
                         _num(r.get("kernel_events")), _num(r.get("events")), _num(r.get("lost_reported")),
                         _num(r.get("unreported")) if "unreported" in r else "n/a",
                         _num((kp.get("run_time_ns") or 0) / kp["run_cnt"], "{:.0f}") if kp.get("run_cnt") else "n/a",
                         _num(r.get("bpf_ns_per_switch"), "{:,.0f}")])
        lines.append("Drops vs the kernel's count (one storm run each, kernel.bpf_stats_enabled=1): run_cnt of the "
                     "tool's sched_switch program; switches the tool saw (pstate: switch records in the file up to "
                     "that moment; bpftrace/runqlat: its own count); switch ns/run: that program's mean run time; "
                     "BPF ns/switch: all the tool's programs' run time per context switch")
        lines += [tabulate(rows, ["contender", "sched_switch run_cnt", "switches seen", "kernel_events", "events",
                                  "lost reported", "unreported", "switch ns/run", "BPF ns/switch"], tablefmt="simple",
                           disable_numparse=True)]
        for key in ("record", "snap"):
            progs = ((acc.get(key) or {}).get("kernel_prog") or {}).get("all_programs") or []
            busy = [p for p in progs if p["run_cnt"]]
            if busy:
                lines.append(f"  {labels.get(key, key)}, per program: " + ", ".join(
                    f"{p['name'].replace('tracepoint__', '')} {p['run_cnt']:,} x {p['ns_per_run']:.0f} ns"
                    for p in sorted(busy, key=lambda p: -p["run_time_ns"])))
        lines.append("")
    gov = results.get("governor")
    if gov:
        rows = []
        for key, g in gov["contenders"].items():
            runs = [r for r in g["runs"] if r.get("ok")]
            rows.append([labels.get(key, key), fmt_ratio(g.get("ratio")), fmt_ratio(g.get("cpu_ratio")),
                         _num(_med(runs, "events_per_s")),
                         _num(_med(runs, "kernel_events")),
                         _num(statistics.median([r["lost"].get("sampled", 0) for r in runs]) if runs else None),
                         _num(statistics.median([r["lost"].get("ringbuf_full", 0) for r in runs]) if runs else None),
                         _num(_med(runs, "rate_records")), _num(_med(runs, "cpu_s"), "{:.2f}")])
        lines.append(f"record's overhead knobs on the storm ({gov['rounds']} rounds; medians per run)")
        lines += [tabulate(rows, ["record", "storm ratio", "per CPU s", "written/s", "kernel events", "sampled", "ringbuf_full",
                                  "rate records", "CPU s"], tablefmt="simple", disable_numparse=True), ""]
    zl = results.get("zero_loss")
    if zl:
        rows = [[_num(r.get("target")), _num(r.get("generator")), _num(r.get("achieved")), _num(r.get("events")),
                 _num(r.get("lost")),
                 _num(r.get("unreported")), _num(r.get("cpu_s"), "{:.2f}"), _num(r.get("loadavg"), "{:.1f}")]
                for r in zl["rows"]]
        lines.append(f"Zero-loss rate of `pstate record` (paced ping-pong on CPU 1, {zl['seconds']:g} s each; last row: "
                     f"an unpaced pipe storm on each CPU at once, record sharing CPU 0; "
                     f"default 16 MB buffer; generator/s = its round trips x {TRANSITIONS_PER_ROUND_TRIP}, all "
                     f"transitions/s = what the kernel side saw, other load included): highest rate without loss "
                     f"{_num(zl.get('max_zero_loss_rate'), '{:,.0f}')} transitions/s")
        lines += [tabulate(rows, ["target/s", "generator/s", "all transitions/s", "written", "lost", "unreported", "record CPU s", "load"], tablefmt="simple",
                           disable_numparse=True), ""]
    rd = results.get("readers")
    if rd:
        rows = []
        for name, r in rd["readers"].items():
            if name == "heat --live":
                rows.append([name, _num(r.get("max_events_per_s")), "",
                             f"paced {r.get('paced_rate', 0):,}/s kept up: {r.get('paced_kept_up')} "
                             f"(sampling 1/{r.get('paced_sampling')}; unpaced max sampled 1/{r.get('max_sampling')})"
                             if r.get("ok") else r.get("error", "")])
            elif r.get("ok"):
                rows.append([name, _num(r["events_per_s"]), _num(r.get("events_per_cpu_s")),
                             f"median {r['median_s']:.2f}s of {len(r['seconds'])}"])
            else:
                rows.append([name, "n/a", "", r.get("error", "")])
        lines.append(f"Readers on a {rd['events']:,}-event recording ({rd['file_bytes'] / 1e6:.0f} MB), whole "
                     f"process (start-up included)")
        lines += [tabulate(rows, ["reader", "events/s", "per CPU s", ""], tablefmt="simple", disable_numparse=True), ""]
    for name in SECTIONS:
        err = (results.get(name.replace("-", "_")) or {}).get("error")
        if err:
            lines += [f"{name}: FAILED: {err}", ""]
    tg = results.get("targets")
    if tg:
        rows = [[t["target"], t["measured"], {True: "met", False: "MISSED", None: "n/a"}[t["met"]]] for t in tg]
        lines.append("Targets (issue #8)")
        lines += [tabulate(rows, ["target", "measured", ""], tablefmt="simple", disable_numparse=True), ""]
    if "storm" in results or "hackbench" in results:
        lines.append("Markdown (README):")
        lines.append("")
        lines.append(f"Measured {m['date'][:10]} on {m['cpu_model']} ({m['ncpu']} CPUs), kernel {m['kernel']}, "
                     f"load average {m['loadavg_start'][0]:.1f}:")
        lines.append("")
        lines.append(tabulate(contender_rows(results, labels, notes), HEADERS, tablefmt="github",
                              disable_numparse=True))
    return "\n".join(lines)


# --- main ------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer rounds and a smaller recording")
    ap.add_argument("--rounds", type=int, help="storm rounds (default 8, quick 3)")
    ap.add_argument("--hack-rounds", type=int, help="hackbench rounds (default 3, quick 2)")
    ap.add_argument("--gov-rounds", type=int, help="governor rounds (default 2, quick 1)")
    ap.add_argument("--loops", type=int, help="perf bench sched pipe loops (default 100000, quick 50000)")
    ap.add_argument("--reader-events", type=int, help="events in the readers' recording (default 5M, quick 1M)")
    ap.add_argument("--zero-loss-seconds", type=float, default=5.0)
    ap.add_argument("--only", help=f"comma-separated sections: {', '.join(SECTIONS)}")
    ap.add_argument("--contenders", help="comma-separated contender keys (default: all)")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "latest.json"),
                    help="where to write the JSON (default bench/results/latest.json)")
    a = ap.parse_args()
    q = a.quick
    rounds = a.rounds or (3 if q else 8)
    hack_rounds = a.hack_rounds or (2 if q else 3)
    gov_rounds = a.gov_rounds or (1 if q else 2)
    loops = a.loops or (50_000 if q else 100_000)
    reader_events = a.reader_events or (1_000_000 if q else 5_000_000)
    sections = SECTIONS if not a.only else tuple(s.strip() for s in a.only.split(","))
    bad = set(sections) - set(SECTIONS)
    if bad:
        ap.error(f"unknown sections: {', '.join(sorted(bad))}")

    results = {"machine": machine(), "rounds": rounds, "hack_rounds": hack_rounds, "quick": q}
    log(f"pstate bench: {results['machine']['cpu_model']}, kernel {results['machine']['kernel']}, "
        f"load {results['machine']['loadavg_start']}")
    headers = ct.merged_headers()
    t_start = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="pstate-bench-")
    runner = Runner(tmp)
    labels = {c.key: c.label for c in ct.default_contenders(headers)}
    labels.update({c.key: c.label for c in ct.governor_contenders()})
    try:
        need_tracers = {"storm", "hackbench", "accounting"} & set(sections)
        cs, notes = preflight(headers) if need_tracers else ([], {})
        if a.contenders:
            wanted = a.contenders.split(",")
            cs = [c for c in cs if c.key in wanted]
        results["notes"] = notes
        pipe = storm.pipe_storm(loops)
        hb = storm.hackbench(4, 250)
        gcs = ct.governor_contenders()
        plan = {
            "storm": (f"storm: {pipe.label}, {rounds} rounds of {len(cs)} contenders",
                      lambda: storm.interleaved(pipe, cs, rounds, runner.traced, log)),
            "hackbench": (f"hackbench: {hb.label}, {hack_rounds} rounds",
                          lambda: storm.interleaved(hb, cs, hack_rounds, runner.traced, log)),
            "accounting": ("accounting: kernel.bpf_stats_enabled=1, one storm run per contender",
                           lambda: accounting(runner, pipe, cs)),
            "governor": (f"governor: {len(gcs)} record settings, {gov_rounds} rounds",
                         lambda: dict(storm.interleaved(pipe, gcs, gov_rounds, runner.traced, log),
                                      rounds=gov_rounds)),
            "zero-loss": ("zero-loss: paced ping-pong at increasing rates",
                          lambda: zero_loss(tmp, a.zero_loss_seconds)),
            "readers": (f"readers: {reader_events:,} events",
                        lambda: readers.measure(ct.pstate_bin(), reader_events, 1 if q else 3, log)),
        }
        for name in SECTIONS:
            if name not in sections:
                continue
            what, fn = plan[name]
            log(what)
            t = time.monotonic()
            key = name.replace("-", "_")
            try:
                results[key] = fn()
            except Exception as e:  # keep the other sections' results
                log(f"  {name} FAILED: {type(e).__name__}: {e}")
                results[key] = {"error": f"{type(e).__name__}: {e}"}
            if isinstance(results[key], dict):
                results[key]["elapsed_s"] = round(time.monotonic() - t, 1)
                results[key]["loadavg"] = storm.loadavg()
            log(f"  ({name}: {time.monotonic() - t:.0f}s, load {storm.loadavg()[0]:.2f})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results["loadavg_end"] = storm.loadavg()
    results["elapsed_s"] = round(time.monotonic() - t_start, 1)
    results["record_consumer"] = consumer_cost(results)
    results["targets"] = targets(results)
    text = report(results, labels, results.get("notes", {}))
    print(text)
    print(f"\n({results['elapsed_s']:.0f}s; JSON: {os.path.relpath(a.json)})")
    os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
    tmpjson = a.json + ".tmp"
    with open(tmpjson, "w") as f:
        json.dump(results, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmpjson, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())

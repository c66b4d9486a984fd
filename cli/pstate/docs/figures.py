"""Measured figures, from one source: bench/results/latest.json.

`make bench` (bench/run.py) writes that file; `make artifacts` renders from
it the man pages' OVERHEAD sections (through overhead_figures()), the
README's overhead table and the summary at the top of docs/performance.md
(through regions()). Those two markdown files are written by hand except
between the markers below, which the generator owns; a test fails when
what is between them is not what the results file says.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pstate.exitcodes import ExitCode, PstateError

RESULTS = "bench/results/latest.json"
BEGIN = ("<!-- generated from bench/results/latest.json by `make artifacts` "
         "(pstate.docs.figures): do not edit -->")
END = "<!-- end of generated text -->"

# The contenders of the README's table, in its order: key in the results'
# storm and hackbench sections -> label.
CONTENDERS = {
    "record": "`pstate record` (every event)",
    "record_min_dur": "`pstate record --min-dur 1ms`",
    "snap": "`pstate snap`",
    "perf_sched": "`perf sched record`",
    "bpftrace": "bpftrace, a `sched_switch` count",
    "runqlat": "`runqlat-bpfcc`",
}


def load(root: Path) -> dict:
    path = root / RESULTS
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PstateError(f"cannot read {RESULTS}: {e}", ExitCode.SOFTWARE,
                          hint="run `make bench`, or restore the file from git") from e


# --- numbers as the pages print them ------------------------------------------

def approx(value: float, digits: int = 3) -> str:
    """A count rounded to `digits` significant figures, with thousands
    separators: 1644674.6 -> "1,640,000"."""
    if value <= 0:
        return "0"
    places = len(str(int(value))) - digits
    return f"{int(round(value, -places) if places > 0 else round(value)):,}"


def kernel_series(release: str) -> str:
    """"6.18.44-fc-v782" -> "Linux 6.18": the series, never the host's release."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return f"Linux {m.group(1)}.{m.group(2)}" if m else "Linux"


def machine(results: dict) -> str:
    """"a 2-CPU AMD EPYC virtual machine with Linux 6.18". Results from
    before bench/run.py recorded systemd-detect-virt's answer were all
    taken on the development VM."""
    m = results["machine"]
    kind = "machine" if m.get("virt", "vm") in ("none", "n/a") else "virtual machine"
    article = "an" if str(m["ncpu"]).startswith("8") or m["ncpu"] in (11, 18) else "a"
    return f"{article} {m['ncpu']}-CPU {m['cpu_model']} {kind} with {kernel_series(m['kernel'])}"


def _storm(results: dict, key: str, section: str = "storm") -> dict:
    return ((results.get(section) or {}).get("contenders") or {}).get(key) or {}


def _median(runs: list[dict], field: str):
    values = sorted(r[field] for r in runs if r.get("ok") and r.get(field) is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _ratio(results: dict, key: str, which: str = "cpu_ratio", section: str = "storm") -> float | None:
    return (_storm(results, key, section).get(which) or {}).get("median")


def _kernel_ns(results: dict, key: str) -> float | None:
    return (((results.get("accounting") or {}).get("contenders") or {}).get(key) or {}).get("bpf_ns_per_switch")


def _reader(results: dict, name: str) -> dict:
    return ((results.get("readers") or {}).get("readers") or {}).get(name) or {}


def overhead_figures(results: dict) -> dict[str, str]:
    """The figures the man pages' OVERHEAD text quotes ({name} in manprose)."""
    record_runs = _storm(results, "record").get("runs", [])
    consumer = results.get("record_consumer") or {}
    heat_live = _reader(results, "heat --live")
    return {
        "machine": f"{machine(results)} shared with other work, on {results['machine']['date'][:10]}",
        "record_ratio": f"{_ratio(results, 'record'):.2f}",
        "record_ratio_wall": f"{_ratio(results, 'record', 'ratio'):.2f}",
        "perf_ratio": f"{_ratio(results, 'perf_sched'):.2f}",
        "rounds": str(results["rounds"]),
        "record_kernel_ns": f"{_kernel_ns(results, 'record'):.0f} ns",
        "record_user_us": f"{consumer['us_per_event']:.2f} µs",
        "record_max_rate": approx(consumer["events_per_cpu_s"], 2),
        "record_zero_loss": approx(results["zero_loss"]["max_zero_loss_rate"]),
        "startup_warm": f"{_median(record_runs, 'first_event_s'):.2f} s",
        "startup_warm_rss": f"{max(r['maxrss_mb'] for r in record_runs if r.get('ok')):.0f} MB",
        "snap_ratio": f"{_ratio(results, 'snap'):.2f}",
        "snap_ns_per_event": f"{_kernel_ns(results, 'snap'):.0f} ns",
        "stats_events_per_s": approx(_reader(results, "stats")["events_per_cpu_s"]),
        "replay_events_per_s": approx(_reader(results, "replay --no-wait")["events_per_cpu_s"]),
        "heat_live_events_per_s": approx(heat_live["paced_rate"]),
    }


# --- markdown -----------------------------------------------------------------

def _spread(s: dict | None) -> str:
    if not s or s.get("median") is None:
        return "–"
    return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"


def overhead_table(results: dict) -> list[str]:
    """The README's table: one row per contender of the storm."""
    rows = ["| tool | storm kept, per CPU s | hackbench kept, per CPU s | BPF ns per switch "
            "| events/s written | first event | peak RSS |",
            "|---|---|---|---|---|---|---|"]
    for key, label in CONTENDERS.items():
        storm = _storm(results, key)
        if not storm:
            continue
        runs = [r for r in storm.get("runs", []) if r.get("ok")]
        eps = _median(runs, "events_per_s")
        first = _median(runs, "first_event_s") or _median(runs, "ready_s")
        rss = max((r.get("maxrss_mb") or 0 for r in runs), default=0)
        ns = _kernel_ns(results, key)
        rows.append(" | ".join([
            f"| {label}", _spread(storm.get("cpu_ratio")),
            f"{_ratio(results, key, section='hackbench'):.2f}" if _ratio(results, key, section="hackbench") else "–",
            f"{ns:,.0f}" if ns else "–", f"{eps:,.0f}" if eps else "–",
            f"{first:.2f} s" if first else "–", f"{rss:.0f} MB |" if rss else "– |"]))
    return rows


def readme_region(results: dict) -> list[str]:
    storm = results["storm"]["workload"].split(" (")[0]
    return [
        f"On {machine(results)} (`make bench`; medians, min–max of {results['rounds']} rounds):",
        f"a context-switch storm (`{storm}`) pinned to one CPU, the tracer on the other;",
        "each figure is the storm's throughput with the tool running divided by without it",
        "(1.00: no cost).",
        "",
        *overhead_table(results),
    ]


def performance_region(results: dict) -> list[str]:
    m = results["machine"]
    fig = overhead_figures(results)
    zero = results["zero_loss"]
    lost = sum(r.get("lost") or 0 for r in zero.get("rows", []))
    return [
        f"The latest `make bench` run: {m['date'][:16].replace('T', ' ')} UTC, "
        f"{machine(results)} (Python {m['python']}, {m['perf']}, {m['bpftrace']}), load average "
        f"{m['loadavg_start'][0]:.2f} at the start; {results['rounds']} storm rounds, "
        f"{results['hack_rounds']} hackbench rounds.",
        "",
        *overhead_table(results),
        "",
        f"- record's user space: {fig['record_user_us']} of CPU per event written, about "
        f"{fig['record_max_rate']} events per CPU second; no loss up to {fig['record_zero_loss']} "
        f"transitions/s ({lost} events lost in the zero-loss runs).",
        f"- Readers, one CPU each, on a recording of {results['readers']['events']:,} events: "
        f"`stats -j 1` {fig['stats_events_per_s']} events per CPU second, `replay --no-wait` "
        f"{fig['replay_events_per_s']}; `heat --live` kept up with a paced "
        f"{fig['heat_live_events_per_s']} events/s without sampling.",
    ]


def regions(results: dict) -> dict[str, list[str]]:
    """Markdown file -> the lines the generator owns in it."""
    return {"README.md": readme_region(results), "docs/performance.md": performance_region(results)}


def fill_region(text: str, lines: list[str], path: str) -> str:
    """text with what is between BEGIN and END replaced by lines."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise PstateError(f"{path} has no generated region", ExitCode.SOFTWARE,
                          hint="put the two markers of pstate.docs.figures where it goes")
    head = text[:start + len(BEGIN)]
    return head + "\n" + "\n".join(lines) + "\n" + text[end:]


def render_documents(root: Path) -> dict[str, str]:
    """Every hand-written markdown file with its generated region filled in:
    path relative to the checkout -> text."""
    results = load(root)
    out = {}
    for path, lines in regions(results).items():
        try:
            text = (root / path).read_text()
        except OSError as e:
            raise PstateError(f"cannot read {path}: {e}", ExitCode.SOFTWARE) from e
        out[path] = fill_region(text, lines, path)
    return out

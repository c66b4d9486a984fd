"""The tables, json and csv of `pstate stats DIR/` (snapshots): the views
analysis.snapseries and analysis.snaplatency compute, rendered. Names are
escaped in the tables (pstate.stream.names.cell); json and csv carry their
exact text."""

from __future__ import annotations

import csv
import time
from typing import IO

import orjson

from pstate.analysis import snaplatency
from pstate.analysis.snapseries import NAMED
from pstate.render import tables
from pstate.stream import vocab
from pstate.stream.durations import fmt_ns
from pstate.stream.names import cell

SPARK_WIDTH = 24
TABLE_SPARK_WIDTH = 8  # keeps the trends table within 80 columns
COMM_WIDTH = 15
DEFAULT_TOP = 15  # rows of each table without --top
# the snapshot series' words for the kinds of wait the kernel keeps (stream.vocab's table)
KIND_WORDS = {k.hist_name: k.series_label for k in vocab.WAIT_KINDS if k.kernel}




def _utc(wall_ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall_ns // 1_000_000_000))


def _when(wall_ns: int) -> str:
    """Month-day and time of day (UTC) with milliseconds: 01-15 08:02:10.250."""
    return time.strftime("%m-%d %H:%M:%S", time.gmtime(wall_ns // 1_000_000_000)) + \
        f".{wall_ns // 1_000_000 % 1000:03d}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def spark(values: list[float], width: int = SPARK_WIDTH, unicode: bool = True) -> str:
    """A sparkline scaled to the values' own maximum, averaged down to width."""
    if not values:
        return ""
    if len(values) > width:
        edges = [round(i * len(values) / width) for i in range(width + 1)]
        values = [sum(values[a:b]) / (b - a) for a, b in zip(edges, edges[1:]) if b > a]
    chars = "▁▂▃▄▅▆▇█" if unicode else "_.-=+*#@"
    top = max(values)
    if top <= 0:
        return chars[0] * len(values)
    return "".join(chars[int(v / top * (len(chars) - 1) + 0.5)] for v in values)


def grid(headers: list[str], rows: list[list], right: frozenset = frozenset()) -> str:
    """Columns two spaces apart; the columns numbered in right are right-aligned."""
    cells = [[str(c) for c in r] for r in [headers, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines) + "\n"


def _who(r: dict) -> list:
    return [r["pid"], r["tid"]] if "tid" in r else [r["pid"]]


def _name(text) -> str:
    """A group's name (comm, title, cgroup, ...) in the tables: escaped and
    cut to COMM_WIDTH (pstate.stream.names.cell)."""
    return cell(text, COMM_WIDTH, mark="")


def render_table(rep: dict, out: IO[str], top: int | None, unicode: bool = True) -> None:
    """Four tables in about 80 columns; JSON and CSV carry every value (and
    every name's exact text: the tables escape them, cell)."""
    top = DEFAULT_TOP if top is None else top
    by = rep["by"]
    boots = rep["boots"] > 1 and by not in NAMED
    who_hdr = (["BOOT"] if boots else []) + {"process": ["PID"], "thread": ["PID", "TID"]}.get(by, [])
    name_hdr = by.upper() if by in NAMED else "COMM"
    nwho = len(who_hdr)
    nums = frozenset(range(nwho)) - ({0} if boots else set())

    def who(r):
        if by in NAMED:
            return []
        return ([cell(r["boot_id"], 8, mark="")] if boots else []) + _who(r)

    # the snapshots' steal_irq_ns, where they have any: of ON-CPU, as a share
    # (its column takes room from the sparklines)
    steal = any(r.get("steal_irq_ns") for r in rep["trends"][:top])
    spark_width = TABLE_SPARK_WIDTH - (4 if steal else 0)

    def sp(values):
        return spark(values, spark_width, unicode)

    n = rep["snapshots"]
    out.write(f"{n} snapshot{'s' if n != 1 else ''} from {', '.join(cell(h) for h in rep['hosts']) or '?'}, "
              f"{rep['boots']} boot{'s' if rep['boots'] != 1 else ''}, {rep['runs']} run{'s' if rep['runs'] != 1 else ''}, "
              f"{fmt_ns(rep['covered_ns'])} covered\nfrom {_utc(rep['first_wall_ns'])} to {_utc(rep['last_wall_ns'])}\n")
    if rep["truncated"]:
        out.write(f"{rep['truncated']} truncated: the task map was full, some threads are missing\n")
    out.write("\n")

    group_word = {"comm": "command"}.get(by, by)
    out.write(f"Trends per {group_word}, top {top} by on-CPU time (average, then each interval)\n")
    rows = []
    for r in rep["trends"][:top]:
        s = r["series"]
        rows.append([*who(r), _name(r["comm"]),
                     f"{_pct(r['cpu_share_avg']):>6} {sp([x['cpu_share'] for x in s])}",
                     *([_pct(r["steal_share_avg"])] if steal else []),
                     f"{_pct(r['wait_share_avg']):>6} {sp([x['wait_share'] for x in s])}",
                     f"{fmt_ns(r['d_ns_per_interval']):>6} {sp([x['uninterruptible_ns'] for x in s])}",
                     f"{s[0]['threads']}>{s[-1]['threads']}" if s else "-"])
    steal_col = [tables.STEAL_HEADER] if steal else []
    out.write(grid([*who_hdr, name_hdr, "ON-CPU", *steal_col, "RUN-QUEUE", "D/INTERVAL", "THREADS"], rows,
                   nums | ({nwho + 2} if steal else set())))
    if steal:
        out.write(tables.wrap(tables.steal_legend("ON-CPU")) + "\n")
    out.write("\n")

    ch = rep["churn"]
    out.write("Churn per interval: processes and threads born (+) and gone (-); short: both\n")
    rows = [[_when(c["wall_end_ns"]), fmt_ns(c["duration_ns"]), c["processes"], c["processes_born"],
             c["processes_gone"], c["short_lived_processes"], c["threads"], c["threads_born"], c["threads_gone"],
             c["short_lived_threads"]] for c in ch["intervals"]]
    t = ch["totals"]
    rows.append(["total", "", "", t["processes_born"], t["processes_gone"], t["short_lived_processes"], "",
                 t["threads_born"], t["threads_gone"], t["short_lived_threads"]])
    out.write(grid(["END (UTC)", "LENGTH", "PROCS", "+", "-", "SHORT", "THREADS", "+", "-", "SHORT"], rows,
                   frozenset(range(1, 10))))
    if ch["by_comm"]:
        top_c = ", ".join(f"{cell(e['comm'])} +{e['processes_born']}/-{e['processes_gone']}"
                          for e in ch["by_comm"][:5])
        out.write(f"Most process churn: {top_c}\n")
    out.write("\n")

    out.write(f"Leak suspects: growing at each of >= {rep['min_run']} consecutive snapshots, by slope\n"
              "(a state counts the threads in it on average: 1 = one thread all the time)\n")
    if rep["leaks"]:
        rows = [[*who(r), _name(r["comm"]), r["metric"], r["snapshots"], f"{r['first']:.4g}",
                 f"{r['last']:.4g}", f"{r['slope_per_min']:+.4g}"] for r in rep["leaks"][:top]]
        out.write(grid([*who_hdr, name_hdr, "METRIC", "SNAPS", "FIRST", "LAST", "PER MINUTE"], rows,
                       nums | frozenset(range(nwho + 2, nwho + 6))))
    else:
        out.write("none\n")
    out.write("\n")

    out.write("Changed most between the first and the last snapshot each was in\n")
    if rep["changed"]:
        rows = []
        for r in rep["changed"][:top]:
            a, b = r["first"], r["last"]
            rows.append([*who(r), _name(r["comm"]), f"{_pct(a['cpu_share'])}>{_pct(b['cpu_share'])}",
                         f"{_pct(a['wait_share'])}>{_pct(b['wait_share'])}",
                         f"{_pct(a['d_share'])}>{_pct(b['d_share'])}", f"{a['threads']}>{b['threads']}"])
        out.write(grid([*who_hdr, name_hdr, "ON-CPU", "RUN-QUEUE", "D", "THREADS"], rows, nums))
    else:
        out.write("none (nothing was in two snapshots, or nothing changed)\n")
    if rep["latency"]:
        out.write("\n")
        shown = [dict(e, group=cell(e["group"], 30, mark="")) for e in rep["latency"]]
        render_latency_table(shown, out, top, sp)


def render_json(rep: dict, out: IO[str], top: int | None, unicode: bool = True) -> None:
    if top is not None:
        rep = dict(rep, trends=rep["trends"][:top], leaks=rep["leaks"][:top], changed=rep["changed"][:top])
        rep["latency"] = snaplatency.top_of(rep["latency"], top)
    out.write(orjson.dumps(rep, option=orjson.OPT_INDENT_2).decode() + "\n")


def render_csv(rep: dict, out: IO[str], top: int | None, unicode: bool = True) -> None:
    """One block per view, each a '# name' line, a header and rows; blank
    lines between blocks. Trends are in long form: one row per group and interval."""
    w = csv.writer(out, lineterminator="\n")
    lim = (lambda xs: xs[:top]) if top is not None else (lambda xs: xs)
    who_cols = {"process": ["boot_id", "pid", "start_ts"],
                "thread": ["boot_id", "pid", "tid", "start_ts"]}.get(rep["by"], [])
    cols = ["interval", "end_ts", "wall_end_ns", "duration_ns", "running_ns", "steal_irq_ns", "wait_ns",
            "uninterruptible_ns", "sleeping_ns", "threads", "cpu_share", "wait_share"]
    out.write("# trends\n")
    w.writerow([*who_cols, "comm", *cols])
    for r in lim(rep["trends"]):
        for s in r["series"]:
            w.writerow([*(r.get(c) for c in who_cols), r["comm"], *(s[c] for c in cols)])
    out.write("\n# churn\n")
    ccols = ["interval", "start_ts", "end_ts", "wall_end_ns", "duration_ns", "processes", "processes_born",
             "processes_gone", "short_lived_processes", "threads", "threads_born", "threads_gone",
             "short_lived_threads"]
    w.writerow(ccols)
    for c in rep["churn"]["intervals"]:
        w.writerow([c[k] for k in ccols])
    out.write("\n# leaks\n")
    lcols = ["metric", "snapshots", "first", "last", "slope_per_min", "from_ts", "to_ts"]
    w.writerow([*who_cols, "comm", *lcols])
    for r in lim(rep["leaks"]):
        w.writerow([*(r.get(c) for c in who_cols), r["comm"], *(r[c] for c in lcols)])
    out.write("\n# changed\n")
    keys = ["cpu_share", "wait_share", "d_share", "threads"]
    w.writerow([*who_cols, "comm", *(f"first_{k}" for k in keys), *(f"last_{k}" for k in keys), "score"])
    for r in lim(rep["changed"]):
        w.writerow([*(r.get(c) for c in who_cols), r["comm"], *(r["first"][k] for k in keys),
                    *(r["last"][k] for k in keys), r["score"]])
    if rep["latency"]:
        out.write("\n# latency\n")
        w.writerow(LATENCY_CSV_COLUMNS)
        w.writerows(latency_csv_rows(rep["latency"]))


RENDERERS = {"table": render_table, "json": render_json, "csv": render_csv}


def render_latency_table(entries: list[dict], out: IO[str], top: int, spark) -> None:
    """Per kind, the top groups by count: p50 and p99 of the first and the
    last interval, and the p99 of each interval as a sparkline."""
    out.write("Latency per interval, from the kernel's log2 buckets (each value: its bucket's middle)\n")
    rows = []
    for e in snaplatency.top_of(entries, top):
        s = e["series"]
        rows.append([e["group"][:30], KIND_WORDS[e["kind"]], e["count"],
                     f"{fmt_ns(s[0]['p50_ns'])}>{fmt_ns(s[-1]['p50_ns'])}",
                     f"{fmt_ns(s[0]['p99_ns'])}>{fmt_ns(s[-1]['p99_ns'])}",
                     spark([p["p99_ns"] for p in s])])
    by = entries[0]["by"]
    cells = [[by.upper(), "WAIT", "COUNT", "P50 FIRST>LAST", "P99 FIRST>LAST", "P99 EACH"], *rows]
    widths = [max(len(str(r[i])) for r in cells) for i in range(6)]
    for r in cells:
        out.write("  ".join(str(c).rjust(w) if i == 2 else str(c).ljust(w)
                            for i, (c, w) in enumerate(zip(r, widths))).rstrip() + "\n")


LATENCY_CSV_COLUMNS = ["by", "group", "kind", "interval", "end_ts", "wall_end_ns", "count", "sum_ns",
               *(f"p{p}_ns" for p in snaplatency.PERCENTILES)]


def latency_csv_rows(entries: list[dict]):
    for e in entries:
        for p in e["series"]:
            yield [e["by"], e["group"], e["kind"], *(p[c] for c in LATENCY_CSV_COLUMNS[3:])]

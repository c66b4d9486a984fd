"""Renderers for `pstate stats`: table (80 columns), json, csv and dot.

build_report() turns a Summary and the groups chosen for output into the
JSON model (its fields: pstate.stream.reports); the table, csv and dot
renderers read that same model, so every format says the same thing.
"""

from __future__ import annotations

import csv
import io
import textwrap
import time

import orjson
import tabulate as _tabulate_mod

from pstate.stream import reports, schema, vocab
from pstate.stream.durations import fmt_ns
from pstate.stream.names import cell
from pstate.analysis.latency import PERCENTILES, pick_unit, render_log2_rows
from pstate.analysis.timeinstate import (BLOCKED_PREFIX, LATENCY_KINDS, NAMED_BY, Group, Summary, kind_order,
                                         state_order)
from pstate.analysis.selection import matrix

REPORT_SCHEMA = reports.STATS_SCHEMA  # the report's fields: pstate.stream.reports

# Kinds always present as csv columns (others are appended when seen).
CSV_KINDS = LATENCY_KINDS + tuple(vocab.blocked_kind(s) for s in vocab.BLOCKED_STATES)
CSV_STATES = tuple(s for s in schema.STATES if s != schema.REAPED)

# Table columns: header -> states summed into it.
TABLE_STATE_COLUMNS = (
    ("RUN", ("running",)),
    ("RUNQ", ("runnable", "new")),
    ("PRMT", ("preempted",)),
    ("SLP", ("sleeping", "idle", "parked")),
    ("DISK", ("uninterruptible",)),
    ("STOP", ("stopped", "traced")),
)
_COLUMN_STATES = frozenset(s for _h, states in TABLE_STATE_COLUMNS for s in states)
TABLE_LEGEND = ("RUN running, RUNQ runnable after a wake-up, PRMT preempted, SLP sleeping "
                "(S, I, P), DISK uninterruptible (D), STOP stopped (T, t), OTHR the rest")
# shown when the input says it (record's or snap's steal_irq_ns): a part of RUN
STEAL_HEADER = "STEAL"


def steal_legend(of: str = "RUN") -> str:
    """The STEAL column's legend; of: the on-CPU column it is a part of."""
    return (f"STEAL: of {of}, the time the kernel counted as stolen by the hypervisor or "
            "spent in interrupts, not as the task's own")


KIND_LABELS = {k.name: k.label for k in vocab.WAIT_KINDS}


def kind_label(kind: str) -> str:
    """A latency kind as tables show it (a state the input named: escaped)."""
    if kind in KIND_LABELS:
        return KIND_LABELS[kind]
    state = kind[len(BLOCKED_PREFIX):]
    letter = schema.STATES.get(state, ("",))[0]
    return f"{state} ({letter})" if letter else cell(state)


# --- the JSON model -----------------------------------------------------------


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def group_dict(g: Group, by: str, *, hist: bool = False, with_matrix: bool = False) -> dict:
    observed = g.observed_ns
    out: dict = {"key": g.key}
    if by == "tid":
        out["tid"] = g.key
        out["pid"] = min(g.pids) if g.pids else None
    elif by == "pid":
        out["pid"] = g.key
        out["threads"] = len(g.tids)
    else:
        out["processes"] = len(g.pids)
        out["threads"] = len(g.tids)
    out["comm"] = g.comm
    out["observed_ns"] = observed
    out["unobserved_ns"] = g.unobserved_ns
    out["oncpu_exceeds_cpus"] = g.oncpu_exceeds
    out["states"] = {s: {"ns": ns, "pct": _pct(ns, observed)}
                     for s, ns in sorted(g.state_ns.items(), key=lambda kv: state_order(kv[0])) if ns}
    out["steal_irq_ns"] = g.steal_irq_ns
    out["transitions"] = g.n_transitions
    out["voluntary"] = g.voluntary
    out["involuntary"] = g.involuntary
    out["impossible"] = g.impossible
    out["null_dur"] = g.null_dur
    out["forks"] = g.lifecycle.get("fork", 0)
    out["execs"] = g.lifecycle.get("exec", 0)
    out["exits"] = g.lifecycle.get("exit", 0)
    lat = {}
    for kind in sorted(g.latency, key=kind_order):
        h = g.latency[kind]
        d = h.summary(PERCENTILES)
        if hist:
            unit, unit_ns = pick_unit(h)
            d["hist_unit"] = unit
            d["hist"] = [[lo, hi, n] for lo, hi, n in h.log2_buckets(unit_ns)]
        lat[kind] = d
    out["latency"] = lat
    if with_matrix:
        out["matrix"] = _matrix_rows([g])
    return out


def _matrix_rows(groups: list) -> list:
    return [{"from": frm, "to": to, "count": n, "mean_ns": round(total / known) if known else None,
             "total_ns": total}
            for frm, to, n, total, known in matrix(groups)]


def build_report(s: Summary, groups: list, *, hist: bool = False, with_matrix: bool = False,
                 rest: Group | None = None, total: Group | None = None) -> dict:
    st = s.stats
    rep: dict = {
        "type": "stats",
        "schema": REPORT_SCHEMA,
        "by": s.by,
        "window": {"start_ts": s.start_ts, "end_ts": s.end_ts, "duration_ns": s.window_ns},
    }
    if s.interval is not None:
        rep["interval"] = s.interval
    rep["input"] = {
        "lines": st.lines,
        "records": st.records,
        "events": s.events,
        "skipped": dict(sorted(st.skipped.items())),
        "skipped_total": st.n_skipped,
        "truncated_tail": st.truncated_tail,
        "unknown": dict(sorted(st.unknown.items())),  # record types this pstate does not know: skipped
        "lost": dict(sorted(st.loss.items())),
        "lost_total": st.lost,
        "lost_pct": round(s.lost_pct, 3),
        "complete": s.complete,
        "interrupted": s.interrupted,
    }
    rep["accounting"] = {
        "tasks": s.tasks,
        "groups": len(s.groups),
        "groups_shown": len(groups),
        "tasks_whole_window": s.checked_tasks,
        "max_abs_deviation_ns": s.max_abs_deviation_ns,
        "total_abs_deviation_ns": s.total_abs_deviation_ns,
        "null_dur_transitions": s.null_dur,
        "unobserved_ns": s.unobserved_ns,
    }
    dev_tid, dev_comm = s.max_deviation_task or (None, None)
    rep["accounting"]["max_deviation_tid"] = dev_tid
    rep["accounting"]["max_deviation_comm"] = dev_comm
    rep["accounting"]["impossible_transitions"] = s.impossible
    rep["accounting"]["oncpu_exceeds_cpus"] = [g.key for g in s.groups if g.oncpu_exceeds]
    rep["ledger"] = {"time_in_state": s.ledger, "transition_filters": s.transition_filters,
                     "task_filters": s.task_filters, "read_filters": s.read_filters, "cut": s.cut}
    rep["groups"] = [group_dict(g, s.by, hist=hist, with_matrix=with_matrix) for g in groups]
    if rest is not None:  # --top hid groups: what they add up to, and the total
        rep["rest"] = group_dict(rest, "rest")
        rep["total"] = group_dict(total, "rest")
    if not s.ledger:  # no percentage the input cannot support
        for g in rep["groups"] + [rep[k] for k in ("rest", "total") if k in rep]:
            g["observed_ns"] = None
            g["states"] = {}
    if with_matrix:
        rep["matrix"] = _matrix_rows(groups)
    return rep


def render_json(rep: dict) -> str:
    return orjson.dumps(rep).decode() + "\n"


# --- table ----------------------------------------------------------------------


def tabulate(rows, headers, **kw) -> str:
    """tabulate's "simple" format without its extra padding around headers
    (which would push the tables past 80 columns)."""
    saved = _tabulate_mod.MIN_PADDING
    _tabulate_mod.MIN_PADDING = 0
    try:
        return _tabulate_mod.tabulate(rows, headers, tablefmt="simple", disable_numparse=True, **kw)
    finally:
        _tabulate_mod.MIN_PADDING = saved


BY_HEADER = {"pid": "PID", "tid": "TID", "comm": "COMM", "all": "ALL", "cgroup": "CGROUP", "unit": "UNIT",
             "container": "CONTAINER", "title": "TITLE", "ppid": "PPID"}
KEY_WIDTH = 30  # a longer title or cgroup path is cut to this in 80-column tables (json and csv keep it)
TABLE_WIDTH = 80  # the tables' width when not written to a terminal (or a narrower one)


def table_width(out) -> int:
    """The columns the tables may take: COLUMNS when set, else the width of
    the terminal out is; TABLE_WIDTH otherwise, and at least that."""
    import os
    import shutil

    try:
        tty = out.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not (tty or "COLUMNS" in os.environ):
        return TABLE_WIDTH
    return max(TABLE_WIDTH, shutil.get_terminal_size((TABLE_WIDTH, 24)).columns)


def key_width(width: int | None) -> int | None:
    """A key cell's columns in a table `width` wide (None: --wide, whole)."""
    return None if width is None else KEY_WIDTH + max(0, width - TABLE_WIDTH)


def _pct_cell(part: int, whole: int) -> str:
    if not whole or not part:
        return "-" if not part else "0.0"
    p = 100.0 * part / whole
    return "100" if p >= 99.95 else f"{p:.1f}"


def _headline(rep: dict) -> list[str]:
    inp, acc, win = rep["input"], rep["accounting"], rep["window"]
    lines = []
    iv = rep.get("interval")
    what = f"interval {iv['seq']}, " if iv else ""
    lines.append(
        f"{what}window {fmt_ns(win['duration_ns'])}: {inp['events']} events, {acc['tasks']} tasks, "
        f"{acc['groups']} groups by {rep['by']} ({acc['groups_shown']} shown)")
    problems = []
    if inp["lost_total"]:
        reasons = ", ".join(f"{cell(r)} {n}" for r, n in inp["lost"].items())
        problems.append(f"{inp['lost_total']} events lost ({inp['lost_pct']:.2g}%: {reasons})")
    if inp["skipped_total"]:
        problems.append(f"{inp['skipped_total']} bad lines skipped")
    if inp["truncated_tail"]:
        problems.append("truncated last line")
    if inp.get("interrupted"):
        problems.append("interrupted before the end")
    if problems:
        lines.append("INCOMPLETE: " + "; ".join(problems) + ".")
    who = ""
    if acc.get("max_deviation_tid") is not None:
        who = f" (tid {acc['max_deviation_tid']} {_comm(acc['max_deviation_comm'])})"
    lines.append(
        f"accounting: {acc['tasks_whole_window']} tasks seen through the window, max deviation "
        f"{fmt_ns(acc['max_abs_deviation_ns'])}{who}; {acc['null_dur_transitions']} transitions of unseen "
        f"start, {fmt_ns(acc['unobserved_ns'])} unobserved")
    if acc.get("impossible_transitions"):
        lines.append(f"impossible: {acc['impossible_transitions']} switch-ins of a task already running "
                     "(running -> running), counted apart, not as switches")
    if acc.get("oncpu_exceeds_cpus"):
        keys = ", ".join(cell(k) for k in acc["oncpu_exceeds_cpus"][:8])
        lines.append(f"FLAGGED: on-CPU above the CPUs the group could use ({rep['by']} {keys}): "
                     "its records are inconsistent")
    led = rep.get("ledger") or {}
    if led.get("transition_filters"):
        lines.append(f"FILTERED: {_filtered_with(led, led['transition_filters'])}: only the "
                     "transitions that passed are here, so time in state is not shown; counts and "
                     "latencies are of the transitions kept.")
    elif led.get("task_filters"):
        lines.append(f"filtered: {_filtered_with(led, led['task_filters'])}: only the tasks kept.")
    return [wrap(x) for x in lines]


def _filtered_with(led: dict, options: list) -> str:
    """"recorded with --state", "read with --pid" or both: filters of the
    recording (its meta records) and those this read applied."""
    read = set(led.get("read_filters") or ())
    parts = []
    for how, opts in (("recorded", [o for o in options if o not in read]), ("read", [o for o in options if o in read])):
        if opts:
            parts.append(f"{how} with {', '.join(opts)}")
    return ", ".join(parts)


def wrap(text: str, width: int = 80) -> str:
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  ")) or text


def _comm(c) -> str:
    """A thread name as tables show it: escaped (pstate.stream.names.cell),
    at most 15 columns."""
    return cell(c, 15, mark="")


def _key_cell(g: dict, by: str, width: int | None = KEY_WIDTH):
    """A group's key as tables show it: a name escaped, and cut to width
    columns in its middle (a path's and a title's both ends say the most:
    the unit, a backend's role; None: whole)."""
    key = g["key"]
    if by == "comm":
        return _comm(key)
    if isinstance(key, str):
        return cell(key, width, keep="middle")
    return key


def fitted(render, width: int | None):
    """render(kw) with the widest key cells that keep its lines within
    width columns (key_width(width) at most; None: whole keys)."""
    kw = key_width(width)
    text = render(kw)
    if width is None:
        return text
    over = max((len(x) for x in (text if isinstance(text, list) else [text]) for x in x.splitlines()),
               default=0) - width
    if over > 0 and kw > 8:
        text = render(max(8, kw - over))
    return text


def render_table(rep: dict, *, hist: bool = False, with_matrix: bool = False, width: int | None = TABLE_WIDTH) -> str:
    """The tables, their keys cut to fit `width` columns (None: --wide)."""
    return fitted(lambda kw: _render_table(rep, hist, with_matrix, kw), width)


def _render_table(rep: dict, hist: bool, with_matrix: bool, kw) -> str:
    out = _headline(rep)
    by = rep["by"]
    groups = rep["groups"]
    if not groups:
        out.append("")
        out.append("no groups to show")
        return "\n".join(out) + "\n"
    key_h = BY_HEADER[by]
    key_al = "left" if by in NAMED_BY and by != "ppid" else "right"

    extra = [rep[k] for k in ("rest", "total") if k in rep]  # --top hid groups
    if rep.get("ledger", {}).get("time_in_state", True):
        out.extend(_state_table(groups, by, key_h, key_al, extra, kw))
    out.extend(_rest_tables(rep, groups, by, key_h, key_al, hist=hist, with_matrix=with_matrix, extra=extra,
                            kw=kw))
    return "\n".join(out) + "\n"


def _state_table(groups: list, by: str, key_h: str, key_al: str, extra: list = (), kw=KEY_WIDTH) -> list:
    out = []
    rows = []
    extra = list(extra)
    steal = any(g.get("steal_irq_ns") for g in groups + extra)
    for g in groups + extra:
        obs = g["observed_ns"]
        ns = {s: v["ns"] for s, v in g["states"].items()}
        cells = [_pct_cell(sum(ns.get(s, 0) for s in states), obs) for _h, states in TABLE_STATE_COLUMNS]
        other = sum(v for s, v in ns.items() if s not in _COLUMN_STATES)
        cells.append(_pct_cell(other, obs))
        if steal:
            cells.insert(1, _pct_cell(max(0, g.get("steal_irq_ns", 0)), obs))
        first = [_key_cell(g, by, kw)] if by in NAMED_BY else [_key_cell(g, by, kw), _comm(g["comm"])]
        rows.append(first + [fmt_ns(obs)] + cells)
    columns = [h for h, _s in TABLE_STATE_COLUMNS] + ["OTHR"]
    if steal:
        columns.insert(1, STEAL_HEADER)
    headers = ([key_h] if by in NAMED_BY else [key_h, "COMM"]) + ["OBSERVED"] + columns
    out.append("")
    out.append("Time in state, % of the time observed:")
    out.append(wrap(TABLE_LEGEND))
    if steal:
        out.append(wrap(steal_legend()))
    out.append(tabulate(rows, headers,
                        colalign=(key_al,) + ("left",) * (0 if by in NAMED_BY else 1) + ("right",) * (1 + len(columns))))
    return out


def _rest_tables(rep: dict, groups: list, by: str, key_h: str, key_al: str, *, hist: bool,
                 with_matrix: bool, extra: list = (), kw=KEY_WIDTH) -> list:
    out = []
    rows = []
    for g in groups + list(extra):
        rows.append([_key_cell(g, by, kw), g["transitions"], g["voluntary"], g["involuntary"],
                     g["forks"], g["execs"], g["exits"], g["null_dur"], fmt_ns(g["unobserved_ns"])])
    out.append("")
    out.append("Transitions: voluntary (blocked) and involuntary (preempted) switches,")
    out.append("lifecycle events, transitions whose start was not seen (NOSTART) and the")
    out.append("time before them (UNOBS):")
    out.append(tabulate(rows, [key_h, "TRANS", "VOL", "INVOL", "FORK", "EXEC", "EXIT", "NOSTART",
                               "UNOBS"],
                        colalign=(key_al,) + ("right",) * 8))

    # Latency.
    rows = []
    for g in groups:
        first = True
        for kind, d in g["latency"].items():
            rows.append([_key_cell(g, by, kw) if first else "", kind_label(kind), d["count"]]
                        + [fmt_ns(d[f"p{p}_ns"]) for p in PERCENTILES] + [fmt_ns(d["max_ns"])])
            first = False
    out.append("")
    out.append("Latency: run-queue waits, on-CPU slices and blocked times until woken:")
    if rows:
        out.append(tabulate(rows, [key_h, "WHAT", "COUNT"] + [f"P{p}" for p in PERCENTILES] + ["MAX"],
                            
                            colalign=(key_al, "left") + ("right",) * 5))
    else:
        out.append("(no transitions with a known duration)")

    if hist:
        out.extend(_hist_lines(rep, kw))
    if with_matrix:
        out.append("")
        out.append("Transition matrix (shown groups): count and mean time in the state left:")
        rows = [[cell(m["from"]), cell(m["to"]), m["count"], fmt_ns(m["mean_ns"]), fmt_ns(m["total_ns"])]
                for m in rep.get("matrix", [])]
        out.append(tabulate(rows, ["FROM", "TO", "COUNT", "MEAN", "TOTAL"],
                            colalign=("left", "left", "right", "right", "right")))
    return out


def _hist_lines(rep: dict, kw=KEY_WIDTH) -> list[str]:
    out = []
    by = rep["by"]
    for g in rep["groups"]:
        for kind, d in g["latency"].items():
            rows = d.get("hist")
            if not rows:
                continue
            who = "all tasks" if by == "all" else f"{BY_HEADER[by].lower()} {_key_cell(g, by, kw)}"
            if by not in NAMED_BY:
                who += f" ({_comm(g['comm'])})"
            out.append("")
            out.append(f"{who}, {kind_label(kind)}:")
            out.extend(render_log2_rows(rows, d.get("hist_unit", "usecs")))
    return out


# --- csv ------------------------------------------------------------------------


def render_csv(rep: dict, *, with_matrix: bool = False, header: bool = True) -> str:
    """One row per group; with --interval, a first column says which
    interval (the header comes once, with the first)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    by = rep["by"]
    groups = rep["groups"]
    iv = rep.get("interval")
    pre = [] if iv is None else [iv["seq"]]
    if with_matrix:
        if header:
            w.writerow((["interval"] if pre else []) + [by, "from", "to", "count", "mean_ns", "total_ns"])
        for g in groups:
            for m in g.get("matrix", []):
                w.writerow(pre + [g["key"], m["from"], m["to"], m["count"], _num(m["mean_ns"]), m["total_ns"]])
        return buf.getvalue()
    states = list(CSV_STATES)
    extra = sorted({s for g in groups for s in g["states"]} - set(states))
    states += extra
    kinds = list(CSV_KINDS)
    kinds += sorted({k for g in groups for k in g["latency"]} - set(kinds), key=kind_order)
    ident = CSV_IDENTITY[by]
    head = (["interval"] if pre else []) + list(ident) + ["observed_ns", "unobserved_ns"]
    head += [f"{s}_ns" for s in states]
    head += ["steal_irq_ns", "transitions", "voluntary", "involuntary", "null_dur", "forks", "execs", "exits"]
    for k in kinds:
        head += [f"{k}_count"] + [f"{k}_p{p}_ns" for p in PERCENTILES] + [f"{k}_max_ns"]
    if header:
        w.writerow(head)
    for g in groups:
        row = pre + [_num(g["key"] if c == by else g.get(c)) for c in ident] + [g["observed_ns"],
                                                                              g["unobserved_ns"]]
        row += [g["states"].get(s, {}).get("ns", 0) if g["observed_ns"] is not None else "" for s in states]
        row += [g["steal_irq_ns"], g["transitions"], g["voluntary"], g["involuntary"], g["null_dur"], g["forks"],
                g["execs"], g["exits"]]
        for k in kinds:
            d = g["latency"].get(k)
            if d is None:
                row += [0] + [""] * (len(PERCENTILES) + 1)
            else:
                row += [d["count"]] + [_num(d[f"p{p}_ns"]) for p in PERCENTILES] + [_num(d["max_ns"])]
        w.writerow(row)
    return buf.getvalue()


CSV_IDENTITY = {"pid": ("pid", "comm", "threads"), "tid": ("tid", "pid", "comm"),
                **{by: (by, "processes", "threads") for by in NAMED_BY}}


def _num(v) -> str:
    return "" if v is None else str(v)


# --- dot ------------------------------------------------------------------------


def _q(s) -> str:
    """A DOT quoted string; a newline becomes DOT's line break."""
    text = str(s).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def render_dot(rep: dict) -> str:
    """The state-transition graph of the shown groups: states as nodes
    (labelled with the time spent in them), transitions as edges labelled
    with their count and the mean time in the state left. Graphviz shows
    the text, and so may a terminal: names (states the input named) are
    escaped as in the tables (cell)."""
    rows = rep.get("matrix")
    if rows is None:
        rows = []
    totals: dict = {}
    observed = 0
    for g in rep["groups"]:
        observed += g["observed_ns"]
        for s, v in g["states"].items():
            totals[s] = totals.get(s, 0) + v["ns"]
    nodes = set(totals)
    for m in rows:
        nodes.add(m["from"])
        nodes.add(m["to"])
    peak = max((m["count"] for m in rows), default=1)
    out = ["digraph pstate {",
           "  rankdir=LR;",
           '  node [shape=box, style="rounded,filled", fillcolor="#f4f4f4", fontname="Helvetica"];',
           '  edge [fontname="Helvetica", fontsize=10];']
    for s in sorted(nodes, key=state_order):
        ns = totals.get(s, 0)
        label = f"{cell(s)}\n{fmt_ns(ns)} ({_pct(ns, observed):.1f}%)" if ns else cell(s)
        out.append(f"  {_q(cell(s))} [label={_q(label)}];")
    for m in rows:
        mean = fmt_ns(m["mean_ns"]) if m["mean_ns"] is not None else "?"
        width = 1 + 3 * (m["count"] / peak)
        label = f"{m['count']}\nmean {mean}"
        out.append(f"  {_q(cell(m['from']))} -> {_q(cell(m['to']))} [label={_q(label)}, penwidth={width:.2f}];")
    out.append("}")
    return "\n".join(out) + "\n"


def interval_banner(wall_ns: int | None) -> str | None:
    """The line that opens each --interval table: the wall-clock time of the
    interval's end (local time), when the stream tells it."""
    if not wall_ns:
        return None
    return "--- " + time.strftime("%H:%M:%S", time.localtime(wall_ns / 1e9))

"""Renderers for why tasks waited (stats --stacks, --wakers, --antagonists,
--by reason): their part of the JSON model, the tables, folded stacks
(flamegraph.pl, speedscope, inferno) and the wake-up graph (Graphviz).

attach() puts the rows of analysis.causes into the groups of the report
tables.build_report made; the table and dot renderers read that model, so
the formats say the same thing. Folded output reads the Causes themselves:
every stack, never cut to --top rows.
"""

from __future__ import annotations

from pstate.analysis.causes import AT_END, NO_STACK, NOT_SEEN, GroupCauses, callers
from pstate.analysis.latency import LogHist
from pstate.analysis.timeinstate import RUNQ_PREEMPTED, RUNQ_WAKEUP
from pstate.render import tables
from pstate.stream import schema, vocab
from pstate.stream.durations import fmt_ns
from pstate.stream.names import cell

DEFAULT_ROWS = 5  # rows per group in the table and json, unless --top says
KEY_HEADER = {**tables.BY_HEADER, "reason": "REASON"}
_CELL = 30  # characters of a stack cell's line
_REASON = 24  # characters of a reason


def letter(state: str) -> str:
    """A state's letter as the tables show it (a state the input named: escaped)."""
    return schema.STATES.get(state, (None,))[0] or cell(state)


def _dist(h: LogHist, ended: bool = True) -> dict:
    if not ended or not h.count:
        return {"count": None, "total_ns": h.total, "p50_ns": None, "p99_ns": None, "max_ns": None}
    return {"count": h.count, "total_ns": h.total, "p50_ns": h.percentile(50), "p99_ns": h.percentile(99),
            "max_ns": h.max}


def stack_reason(frames: str) -> str | None:
    if frames in (NO_STACK, AT_END):
        return None
    return vocab.reason_of(vocab.leaf_first(frames))


def _waker_name(w) -> str:
    if w.kind == "task":
        return f"{(w.comm or '?')[:15]} {w.tid}"
    return w.kind if w.kind in ("irq", "softirq") else "[unknown]"


def group_rows(gc: GroupCauses, *, rows: int | None, stacks: bool, wakers: bool, antagonists: bool,
               states=None) -> dict:
    """The JSON model of one group's causes, each list cut to `rows`."""
    out: dict = {}
    if stacks:
        out["blocked_ns"] = gc.blocked_ns(states)
        out["stacks"] = [{"state": s, "reason": stack_reason(f), "frames": f, **_dist(h, f != AT_END)}
                         for s, f, h in gc.stack_rows(states)[:rows]]
        out["reasons"] = [{"state": s, "reason": r, **_dist(h)} for s, r, h in gc.reason_rows(states)[:rows]]
    if wakers:
        every = gc.waker_rows()
        total = sum(w.ended_ns for w in every)
        out["wakers"] = [{"kind": w.kind, "tid": w.tid, "pid": w.pid, "comm": w.comm, "name": _waker_name(w),
                          "group": w.group, "count": w.count, "ended_ns": w.ended_ns,
                          "pct": tables._pct(w.ended_ns, total)} for w in every[:rows]]
        out["wakers_total"] = {"count": sum(w.count for w in every), "ended_ns": total}
        rest = every[rows:] if rows is not None else []
        ns = sum(w.ended_ns for w in rest)
        out["wakers_other"] = {"wakers": len(rest), "count": sum(w.count for w in rest), "ended_ns": ns,
                               "pct": tables._pct(ns, total)} if rest else None
    if antagonists:
        out["runq_ns"] = gc.runq_ns
        for kind in (RUNQ_WAKEUP, RUNQ_PREEMPTED):
            out[f"{kind}_ns"] = gc.runq_kind_ns.get(kind, 0)
        out["runq_waits"] = gc.runq_waits
        shown, rest_n, ns = gc.antagonist_cut(rows)
        out["antagonists"] = [{"tid": None if a.tid == NOT_SEEN else a.tid, "pid": a.pid, "comm": a.comm,
                               "name": NOT_SEEN if a.tid == NOT_SEEN else f"{(a.comm or '?')[:15]} {a.tid}",
                               "group": a.group, "ns": a.ns, "pct": tables._pct(a.ns, gc.runq_ns),
                               "waits": a.waits}
                              for a in shown]
        out["antagonists_other"] = {"tasks": rest_n, "ns": ns, "pct": tables._pct(ns, gc.runq_ns)} \
            if rest_n else None
    return out


def attach(rep: dict, causes, *, top: int | None, stacks: bool, wakers: bool, antagonists: bool,
           states=None) -> None:
    """Add each shown group's causes to the report (rows per group: --top,
    else DEFAULT_ROWS)."""
    rows = top or DEFAULT_ROWS
    for g in rep["groups"]:
        gc = causes.groups.get(g["key"])
        if gc is None:
            gc = GroupCauses(key=g["key"])
        g.update(group_rows(gc, rows=rows, stacks=stacks, wakers=wakers, antagonists=antagonists,
                            states=states))
    rep["why"] = {"stacks": stacks, "wakers": wakers, "antagonists": antagonists,
                  "stack_records": causes.has_stacks, "rows_per_group": rows}


def reason_report(summary, causes, *, top: int | None, stacks: bool, wakers: bool, antagonists: bool,
                  states=None) -> dict:
    """stats --by reason: the report of the summary's window, input and
    accounting whose groups are the reasons (reason_groups), the first `top`
    of them shown."""
    rep = tables.build_report(summary, [])
    groups = reason_groups(causes, top=None, stacks=stacks, wakers=wakers, antagonists=antagonists, states=states)
    rep["by"] = "reason"
    rep["accounting"]["groups"] = len(groups)
    rep["groups"] = groups[:top] if top else groups
    rep["accounting"]["groups_shown"] = len(rep["groups"])
    rep["why"] = {"stacks": stacks, "wakers": wakers, "antagonists": antagonists,
                  "stack_records": causes.has_stacks, "rows_per_group": None}
    return rep


def reason_groups(causes, *, top: int | None, stacks: bool, wakers: bool, antagonists: bool, states=None) -> list:
    """--by reason: the groups are the Causes' own, with blocked or
    run-queue time, longest first."""
    out = []
    for gc in causes.ordered():
        if not (gc.blocked_ns(states) or (antagonists and gc.runq_ns) or (wakers and gc.wakers)):
            continue
        g = {"key": gc.key}
        g.update(group_rows(gc, rows=None, stacks=stacks, wakers=wakers, antagonists=antagonists, states=states))
        out.append(g)
    return out[:top] if top else out


# --- tables -------------------------------------------------------------------


def _key(g: dict, by: str, kw=tables.KEY_WIDTH):
    """A group's key as the tables show it (names escaped: cell), cut as
    the main table cuts it (to kw columns; None: whole)."""
    if by == "reason":
        return cell(str(g["key"]), _REASON if kw is None or kw <= tables.KEY_WIDTH else kw, mark="")
    if by in ("comm", "all"):
        return tables._comm(g["key"])
    return tables._key_cell(g, by, kw)


def _stack_cell(row: dict, width: int) -> str:
    """The reason, then its callers, a line each (the cell's own line
    breaks), each name escaped and cut to width."""
    frames = row["frames"]
    if frames in (NO_STACK, AT_END):
        return frames
    names = callers(frames, row["reason"])
    lines = [names[0]] + ["< " + n for n in names[1:]]
    return "\n".join(cell(x, width, keep="middle") for x in lines)


def render_tables(rep: dict, width: int | None = tables.TABLE_WIDTH) -> list[str]:
    """The why tables, cut to fit `width` columns (None: --wide, nothing cut)."""
    by = rep["by"]
    why = rep.get("why", {})
    groups = rep["groups"]
    key_h = KEY_HEADER.get(by, by.upper())
    key_al = "right" if by in ("pid", "tid", "ppid") else "left"
    out: list[str] = []
    if why.get("stacks"):
        out.extend(tables.fitted(lambda kw: _stack_table(groups, by, key_h, key_al, why, width, kw), width))
    if why.get("wakers"):
        out.extend(tables.fitted(lambda kw: _waker_table(groups, by, key_h, key_al, kw), width))
    if why.get("antagonists"):
        out.extend(tables.fitted(lambda kw: _antagonist_table(groups, by, key_h, key_al, kw), width))
    return out


def _stack_table(groups, by, key_h, key_al, why, total=tables.TABLE_WIDTH, kw=tables.KEY_WIDTH) -> list[str]:
    out = ["", "Blocked time by kernel stack (the reason, then its callers; --format folded",
           "gives every stack whole):"]
    if not why.get("stack_records"):
        out.append("(the input has no stack records: record it with pstate record --stacks)")

    def table(width: int | None) -> str:
        rows = []
        for g in groups:
            first = True
            for r in g.get("stacks", []):
                ended = r["count"] is not None
                rows.append([_key(g, by, kw) if first else "", letter(r["state"]), r["count"] if ended else "-",
                             fmt_ns(r["total_ns"])] + [fmt_ns(r[k]) for k in ("p50_ns", "p99_ns", "max_ns")]
                            + [_stack_cell(r, width)])
                first = False
        if not rows:
            return ""
        return tables.tabulate(rows, [key_h, "ST", "COUNT", "TOTAL", "P50", "P99", "MAX", "STACK"],
                               colalign=(key_al, "left") + ("right",) * 5 + ("left",))

    width = None if total is None else _CELL + max(0, total - tables.TABLE_WIDTH)
    text = table(width)
    while width is not None and width > 12 and max((len(x) for x in text.splitlines()), default=0) > total:
        width -= 1  # long keys (reasons): the stack cells give way
        text = table(width)
    out.append(text or "(no blocked time with a known duration)")
    rows = []
    for g in groups:
        first = True
        for r in g.get("reasons", []):
            rows.append([_key(g, by, kw) if first else "", letter(r["state"]), cell(r["reason"], _REASON, mark=""),
                         r["count"],
                         fmt_ns(r["total_ns"]), fmt_ns(r["p50_ns"]), fmt_ns(r["p99_ns"]), fmt_ns(r["max_ns"])])
            first = False
    if rows and by != "reason":
        out.append("")
        out.append("Blocked time by reason (the first function that is not scheduler plumbing):")
        out.append(tables.tabulate(rows, [key_h, "ST", "REASON", "COUNT", "TOTAL", "P50", "P99", "MAX"],
                                   colalign=(key_al, "left", "left") + ("right",) * 5))
    return out


def _per_group(groups, by, key_h, key_al, field: str, cells, headers: list, align: tuple, empty: str,
               other=None, kw=tables.KEY_WIDTH) -> str:
    """One table of a list each group has (field): cells(g, item, first)
    gives a row after the key cell; other(g): the cells of a last row for
    the items past those shown (None: there are none)."""
    rows = []
    for g in groups:
        for i, item in enumerate(g.get(field, [])):
            rows.append([_key(g, by, kw) if i == 0 else ""] + cells(g, item, i == 0))
        last = other(g) if other is not None and g.get(field) else None
        if last is not None:
            rows.append([""] + last)
    if not rows:
        return empty
    return tables.tabulate(rows, [key_h] + headers, colalign=(key_al,) + align)


def _waker_table(groups, by, key_h, key_al, kw=tables.KEY_WIDTH) -> list[str]:
    def cells(g, w, _first):
        total = g["wakers_total"]["ended_ns"]
        return [cell(w["name"]), w["count"], fmt_ns(w["ended_ns"]), tables._pct_cell(w["ended_ns"], total)]

    def other(g):
        o = g.get("wakers_other")
        if not o:
            return None
        return [f"({o['wakers']} more)", o["count"], fmt_ns(o["ended_ns"]),
                tables._pct_cell(o["ended_ns"], g["wakers_total"]["ended_ns"])]

    return ["", "Wakers: who ended the blocked states (a task, irq or softirq), by the blocked",
            "time ended (% of the group's):",
            _per_group(groups, by, key_h, key_al, "wakers", cells, ["WAKER", "WAKEUPS", "ENDED", "%"],
                       ("left", "right", "right", "right"), "(no wake-ups from a blocked state)", other, kw)]


def _antagonist_table(groups, by, key_h, key_al, kw=tables.KEY_WIDTH) -> list[str]:
    def cells(g, a, first):
        return [fmt_ns(g["runq_ns"]) if first else "", cell(a["name"]), fmt_ns(a["ns"]),
                tables._pct_cell(a["ns"], g["runq_ns"])]

    def other(g):
        o = g.get("antagonists_other")
        if not o:
            return None
        return ["", f"({o['tasks']} more)", fmt_ns(o["ns"]), tables._pct_cell(o["ns"], g["runq_ns"])]

    return ["", "Antagonists: the tasks that held the CPU while a task waited on its run queue",
            "(after a wake-up or a preemption), by the run-queue time they caused:",
            _per_group(groups, by, key_h, key_al, "antagonists", cells, ["RUNQ", "HELD THE CPU", "TIME", "%"],
                       ("right", "left", "right", "right"), "(no run-queue waits with a known duration)", other,
                       kw)]


def render_reason_table(rep: dict, width: int | None = tables.TABLE_WIDTH) -> str:
    """--by reason: the headline, then the tables of the reasons."""
    out = tables._headline(rep)
    if not rep["groups"]:
        out += ["", "no groups to show"]
    else:
        out.extend(render_tables(rep, width))
    return "\n".join(out) + "\n"


# --- folded -------------------------------------------------------------------


def group_label(gc: GroupCauses, by: str) -> str:
    if by in ("pid", "tid"):
        return f"{gc.comm or '?'}-{gc.key}"
    return str(gc.key if gc.key is not None else "?")


def _one_line(text: str) -> str:
    """A name in a folded line: its exact text, but for a line break (it
    would end the line, and the next would read as a stack of its own)."""
    if "\n" in text or "\r" in text:
        return text.replace("\r", "\\x0d").replace("\n", "\\x0a")
    return text


def render_folded(causes, keys, states=None) -> str:
    """One `frame;frame;... <microseconds>` line per group, state and stack
    (group label and state as the first two frames), every stack of the
    groups with these keys; blocked time without a stack under NO_STACK or
    AT_END. Names keep their exact text (control characters too: this is
    for flamegraph.pl and the like, not a terminal), but for the format's
    own separators: a ';' of a group label is ':', a line break \\x0a."""
    by = causes.by
    out = []
    for key in keys:
        gc = causes.groups.get(key)
        if gc is None:
            continue
        acc: dict = {}
        for s, frames, h in gc.stack_rows(states):
            path = frames if frames in (NO_STACK, AT_END) else ";".join(vocab.frame_function(f) for f in frames.split(";"))
            k = _one_line(f"{group_label(gc, by).replace(';', ':')};{s};{path}")
            acc[k] = acc.get(k, 0) + h.total
        for k, ns in sorted(acc.items(), key=lambda kv: (-kv[1], kv[0])):
            us = round(ns / 1000)
            if us:
                out.append(f"{k} {us}")
    return "\n".join(out) + ("\n" if out else "")


# --- the wake-up graph ----------------------------------------------------------


def render_wake_dot(rep: dict) -> str:
    """Wakers -> the groups they woke, edges labelled with the wake-ups and
    the blocked time they ended (shown groups that were woken; their listed
    wakers). Names escaped as in the tables (cell): Graphviz shows them."""
    by = rep["by"]
    nodes: dict = {}
    edges = []
    for g in rep["groups"]:
        gid = f"g:{g['key']}"
        if g.get("wakers"):
            nodes[gid] = _node_label(by, g["key"], g.get("comm"))
        for w in g.get("wakers", []):
            if w["kind"] == "task":
                wkey = w.get("group") if by not in ("all", "reason") else None
                wid = f"g:{wkey}" if wkey is not None else f"t:{w['tid']}"
                nodes.setdefault(wid, _node_label(by, wkey, w["comm"]) if wkey is not None else cell(w["name"]))
            else:
                wid = f"k:{w['kind']}"
                nodes.setdefault(wid, cell(w["name"]))
            edges.append((wid, gid, w["count"], w["ended_ns"]))
    peak = max((e[3] for e in edges), default=1) or 1
    out = ["digraph wakeups {",
           "  rankdir=LR;",
           '  node [shape=box, style="rounded,filled", fillcolor="#f4f4f4", fontname="Helvetica"];',
           '  edge [fontname="Helvetica", fontsize=10];']
    for nid, label in sorted(nodes.items()):
        extra = ', shape=ellipse, fillcolor="#fde2c8"' if nid.startswith("k:") else ""
        out.append(f"  {tables._q(cell(nid))} [label={tables._q(label)}{extra}];")
    for wid, gid, n, ns in edges:
        label = f"{n} wake-ups\n{fmt_ns(ns)} ended"
        out.append(f"  {tables._q(cell(wid))} -> {tables._q(cell(gid))} [label={tables._q(label)}, "
                   f"penwidth={1 + 3 * ns / peak:.2f}];")
    out.append("}")
    return "\n".join(out) + "\n"


def _node_label(by: str, key, comm) -> str:
    if by in ("pid", "tid"):
        return f"{cell(comm or '?')}\n{by} {key}"
    return cell(key)

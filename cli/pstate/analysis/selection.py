"""Choosing and ordering the groups of a Summary: --state, --min-dur,
--sort and --top, and the transition matrix over groups."""

from __future__ import annotations

from pstate.analysis.latency import LogHist
from pstate.analysis.timeinstate import ONCPU, RUNQ_PREEMPTED, RUNQ_WAKEUP, Group, _sort_key, state_order
from pstate.stream import schema


# --- choosing and ordering groups ---------------------------------------------

SORT_KEYS = {
    "key": "the group key (pid, tid or comm), ascending",
    "comm": "task name, ascending",
    "observed": "time observed",
    "unobserved": "time unobserved",
    "transitions": "number of transitions",
    "voluntary": "voluntary switches (blocked)",
    "involuntary": "involuntary switches (preempted)",
    "wait": "time waiting for a CPU (runnable, preempted, new)",
    "blocked": "time blocked or stopped (S, D, T, t, I, P, ...)",
    "runq-p99": "p99 run-queue wait (after wake-up or preemption, whichever is worse)",
    "runq-max": "max run-queue wait",
    "oncpu-p99": "p99 on-CPU slice",
}
SORT_KEYS.update({s: f"time {desc}" for s, (_l, _c, desc) in schema.STATES.items() if s != schema.REAPED})


def _runq(g: Group, what: str) -> int:
    vals = []
    for kind in (RUNQ_WAKEUP, RUNQ_PREEMPTED):
        h = g.latency.get(kind)
        if h is not None and h.count:
            vals.append(h.max if what == "max" else h.percentile(99))
    return max(vals, default=-1)


def sort_value(g: Group, key: str):
    if key == "key":
        return _sort_key(g.key)
    if key == "comm":
        return (g.comm, _sort_key(g.key))
    if key == "observed":
        return g.observed_ns
    if key == "unobserved":
        return g.unobserved_ns
    if key == "transitions":
        return g.n_transitions
    if key == "voluntary":
        return g.voluntary
    if key == "involuntary":
        return g.involuntary
    if key == "wait":
        return g.category_ns("wait")
    if key == "blocked":
        return g.category_ns("blocked") + g.category_ns("stopped")
    if key == "runq-p99":
        return _runq(g, "p99")
    if key == "runq-max":
        return _runq(g, "max")
    if key == "oncpu-p99":
        h = g.latency.get(ONCPU)
        return h.percentile(99) if h is not None and h.count else -1
    return g.state_ns.get(key, 0)


def select(groups: list, *, states=(), min_dur_ns: int = 0, sort: str | None = None,
           top: int | None = None) -> list:
    """--state, --min-dur, --sort and --top, in that order.

    --state keeps the groups that spent time in any of the states; --min-dur
    keeps those that spent at least that long in them (in total, without
    --state). Sorting is descending except for key and comm; the default is
    time in the --state states, else time running.
    """
    out = list(groups)
    if states:
        out = [g for g in out if g.time_in(states) > 0]
    if min_dur_ns:
        out = [g for g in out if (g.time_in(states) if states else g.observed_ns) >= min_dur_ns]
    if sort is None:
        out.sort(key=lambda g: (-g.time_in(states) if states else -g.state_ns.get(schema.RUNNING, 0),
                                _sort_key(g.key)))
    elif sort in ("key", "comm"):
        out.sort(key=lambda g: sort_value(g, sort))
    else:
        out.sort(key=lambda g: (-sort_value(g, sort), _sort_key(g.key)))
    if top is not None:
        out = out[:top]
    return out


def select_with_rest(groups: list, *, states=(), min_dur_ns: int = 0, sort: str | None = None,
                     top: int | None = None) -> tuple[list, Group | None, Group | None]:
    """select(), and when --top hides some of the groups chosen: the
    hidden ones merged into one "everything else" group, and the total of
    all chosen (shown + rest = total, figure by figure); else None, None."""
    chosen = select(groups, states=states, min_dur_ns=min_dur_ns, sort=sort)
    if top is None or len(chosen) <= top:
        return chosen, None, None
    hidden = chosen[top:]
    return chosen[:top], merged(hidden, f"({len(hidden)} more)"), merged(chosen, "(total)")


def merged(groups: list, key: str) -> Group:
    """One group of the sums of groups (latency distributions merged)."""
    out = Group(key=key, by=groups[0].by if groups else "pid")
    for g in groups:
        out.pids |= g.pids
        out.tids |= g.tids
        for st, ns in g.state_ns.items():
            out.state_ns[st] = out.state_ns.get(st, 0) + ns
        out.unobserved_ns += g.unobserved_ns
        out.null_dur += g.null_dur
        for k, (n, total, known) in g.transitions.items():
            v = out.transitions.setdefault(k, [0, 0, 0])
            v[0] += n
            v[1] += total
            v[2] += known
        out.voluntary += g.voluntary
        out.involuntary += g.involuntary
        out.impossible += g.impossible
        out.steal_irq_ns += g.steal_irq_ns
        for k, n in g.lifecycle.items():
            out.lifecycle[k] = out.lifecycle.get(k, 0) + n
        for kind, h in g.latency.items():
            mine = out.latency.get(kind)
            if mine is None:
                mine = out.latency[kind] = LogHist()
            mine.merge(h)
    return out


def matrix(groups: list) -> list:
    """Transition counts over groups: [(from, to, count, total_ns, n_known)]."""
    acc: dict = {}
    for g in groups:
        for (frm, to), (n, total, known) in g.transitions.items():
            v = acc.get((frm, to))
            if v is None:
                acc[(frm, to)] = [n, total, known]
            else:
                v[0] += n
                v[1] += total
                v[2] += known
    return [(frm, to, n, total, known) for (frm, to), (n, total, known)
            in sorted(acc.items(), key=lambda kv: (state_order(kv[0][0]), state_order(kv[0][1])))]

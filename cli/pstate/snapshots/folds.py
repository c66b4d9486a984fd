"""Folded exits: the kernel's group rows of freed threads whose final row
found no room in `gone` (an exit burst larger than the map, or readers that
lag behind), and how a reader turns them into growth of its groups.

bpf/snap.bpf.c adds such a final row's counters and histograms into the row
of its group in `folds`, keyed by the v2 cgroup the task exited in and its
process's name; a group row counts since the program was loaded and only
grows. Each reader (a snap run; with a collector, each snapshot directory,
with its cursor) keeps the group rows it read last, and takes their growth
since: it goes into the --prom-by groups of the Prometheus counters and the
hist rows (so no series decreases when threads are folded), and into the
directory's own running totals, which its JSON-lines "fold" rows carry
(cumulative, as task rows are; --clear: the interval's growth).

A thread the reader's previous snapshot showed alive and that was folded
since had that part counted already, through its task row: its counters
then are taken off its group's growth (the group it was in then, `key`).
The maps are read `folds` first, then the threads (taskmaps), so a thread
folded between the two reads is neither shown alive nor in its group yet:
what it owes then is taken off its group's growth of the next snapshot (in
which its final row is, as the kernel folds a row before it empties the
thread's), and what is still owed after that was lost (fold_lost).
"""

from __future__ import annotations

from pstate.snapshots import histograms, snapdir

COUNT_FIELDS = ("folded",)  # a group row's count of final rows, beside snapdir.counter_fields


def key(cgroup: int | None, comm: str) -> tuple:
    """A group's identity: the kernel's key (cgroup id, process name)."""
    return (cgroup or 0, comm)


def counters(row: dict) -> dict:
    return {k: row[k] for k in (*snapdir.counter_fields(row), *COUNT_FIELDS) if k in row}


def _minus(a: dict, b: dict | None) -> dict:
    return {k: max(0, v - (b or {}).get(k, 0)) for k, v in a.items()}


UNCARRIED = "unknown_ns"  # a seeded thread's shown rows hold the time before its seeding; its final row does not


def _pay(growth: dict, hist, debt: dict | None) -> tuple:
    """(growth, histogram growth, what is still owed or None) once a debt
    (counters, and "hist": its histogram) is taken off a group's growth."""
    if not debt:
        return growth, hist, None
    rest = {}
    paid = dict(growth)
    for f, n in debt.items():
        if f == "hist" or not n:
            continue
        take = min(n, paid.get(f, 0))
        if f in paid:
            paid[f] -= take
        if n > take:
            rest[f] = n - take
    h = debt.get("hist")
    if h and hist is not None:
        left = [max(0, y - x) for x, y in zip(hist, h)]
        hist = tuple(max(0, x - y) for x, y in zip(hist, h))
        if any(left):
            rest["hist"] = left
    elif h:
        rest["hist"] = list(h)
    return paid, hist, rest or None


class Folds:
    """One reader's view of the kernel's group rows."""

    def __init__(self):
        self.seen: dict[tuple, dict] = {}  # key -> the group row read last (counters, "hist")
        self.totals: dict[tuple, dict] = {}  # key -> this reader's growth summed since it began
        self.owed: dict[tuple, dict] = {}  # key -> what vanished threads owe its next growth (counters, "hist")

    def step(self, groups: list[dict], vanished: list[dict], paths, ts: int, clear: bool) -> list[tuple]:
        """(record, growth, histogram growth) per group row read now.

        groups: the kernel's rows (taskmaps: cgroup, comm, folded, counters,
        hist), cumulative; vanished: the previous rows (with their "fold"
        key) of threads shown alive last time and neither alive nor freed
        now; paths: the cgroup id -> path lookup (identity.CgroupPaths)."""
        owed: dict[tuple, dict] = {}
        for v in vanished:
            k = tuple(v.get("fold") or ())
            if len(k) != 2:
                continue
            acc = owed.setdefault(k, {})
            for f, n in counters(v).items():
                acc[f] = acc.get(f, 0) + n
            if v.get("hist"):
                h = acc.get("hist") or [0] * len(v["hist"])
                acc["hist"] = [x + y for x, y in zip(h, v["hist"])]
        earlier, self.owed = self.owed, {}
        out = []
        seen = {}
        for g in groups:
            k = key(g["cgroup"], g["comm"])
            last = self.seen.get(k)
            growth = _minus(counters(g), last)
            hist = histograms.delta(g.get("hist"), last and last.get("hist"))
            # what was owed since the last snapshot, then what is owed now (the rest: next time)
            growth, hist, _rest = _pay(growth, hist, earlier.pop(k, None))
            growth, hist, rest = _pay(growth, hist, owed.pop(k, None))
            self._owe(k, rest)
            seen[k] = {**counters(g), "hist": list(g["hist"]) if g.get("hist") else None}
            total = self.totals.setdefault(k, {})
            for f, n in growth.items():
                total[f] = total.get(f, 0) + n
            rec = {"type": "fold", "ts": ts, "cgroup": g["cgroup"],
                   "cgroup_path": paths.path_of(g["cgroup"]) if g["cgroup"] else None, "comm": g["comm"],
                   **(growth if clear else total)}
            out.append((rec, growth, hist))
        self.seen = seen
        for k, debt in owed.items():  # (threads of groups with no row yet: folded after `folds` was read)
            self._owe(k, debt)
        return out

    def _owe(self, k: tuple, debt: dict | None) -> None:
        """What of a debt waits for group k's next growth: all but its
        unknown time, which a seeded thread's folded final row never pays
        (user space adds it to the rows it shows), so that it cannot take
        other threads' growth."""
        carried = {f: n for f, n in (debt or {}).items() if f != UNCARRIED}
        if carried:
            self.owed[k] = carried

    def state(self) -> list:
        """What a cursor file keeps of it."""
        return [[k[0], k[1], self.seen.get(k), self.totals.get(k), self.owed.get(k)]
                for k in sorted(set(self.seen) | set(self.totals) | set(self.owed))]

    def restore(self, state) -> None:
        for cg, comm, seen, total, *owed in state or ():  # (no owed: an older pstate's cursor)
            if seen is not None:
                self.seen[(cg, comm)] = seen
            if total is not None:
                self.totals[(cg, comm)] = total
            if owed and owed[0]:
                self.owed[(cg, comm)] = owed[0]


def group_keys(by: str, records: list[dict]) -> list[tuple]:
    """The --prom-by group of each fold record: its cgroup (and unit) and
    its process name; no title is known of a task gone ("[comm]"), and per
    pid or thread folded tasks are pid 0."""
    by = histograms.grouping(by)
    out = []
    for r in records:
        row = {"cgroup_path": r["cgroup_path"], "title": None, "pid": 0, "tid": 0}
        out.append(tuple(histograms.label_value(f, row, r["comm"]) for f in histograms.LABELS[by]))
    return out


FOLD_RECORD = (
    "a group of folded threads in a snapshot (pstate snap --format jsonl): threads freed when the "
    "kernel's map of final rows had no room, added up per cgroup and process name",
    {
        "cgroup": ("int?", "the id of the cgroup v2 the threads exited in; null when not known"),
        "cgroup_path": ("string?", "its path below the v2 mount (null once the cgroup is removed)"),
        "comm": ("string", "their process's name (its main thread's comm)"),
        "folded": ("int", "threads folded into the group (cumulative mode: since the directory's first "
                          "snapshot of the collector or run)"),
        "<state>_ns, nvcsw, nivcsw, wakeups": ("int", "their counters, as in task rows, summed (only what no "
                                                      "task row of the directory counted)"),
    },
)

"""Latency histograms of snapshots: the kernel's log2 buckets, per group.

bpf/snap.bpf.c keeps, in every task row, four histograms (bpf/snaphist.h):
the run-queue wait after a wake-up and after a preemption, and the time
blocked in S and in D, each as counts in fixed log2 buckets plus the exact
sum. A snapshot adds each thread's growth since the previous snapshot to
its group, with the groups of `--prom-by` (the same labels as the
Prometheus counters), so a group's histogram only grows over a run even as
its threads exit. Out of it come Prometheus classic histograms
(pstate_*_seconds_bucket{le}, _sum, _count) and "hist" rows of JSON-lines
snapshots, one per group and kind.

Bucket bounds are fixed (bpf/pstate.h): bucket b holds durations d with
2^(SHIFT+b-1) < d <= 2^(SHIFT+b) ns (bucket 0: d <= 2^SHIFT), the last one
everything longer, so le bounds are exact and the same on every host.
"""

from __future__ import annotations

from pstate.kernel import eventlayout, identity
from pstate.stream import vocab

_D = eventlayout.DEFINES
SHIFT, NBUCKETS, NKINDS = _D["HIST_SHIFT"], _D["HIST_BUCKETS"], _D["HIST_KINDS"]
# the kinds the kernel keeps (stream.vocab's table), in its order (HK_*)
_KERNEL_KINDS = sorted((k for k in vocab.WAIT_KINDS if k.kernel), key=lambda k: _D[k.kernel])
KINDS = tuple(k.hist_name for k in _KERNEL_KINDS)  # as hist rows name them
assert len(KINDS) == NKINDS
# upper bound (le) of each bucket, ns; None for the last (+Inf)
UPPER_NS = tuple(vocab.log2_ceil_upper(b, SHIFT) for b in range(NBUCKETS - 1)) + (None,)
U32 = 1 << 32

# the Prometheus family that carries each kind: (family, its labels, the family's HELP)
FAMILIES = {k.hist_name: (k.prom[0], dict(k.prom[1]), k.prom[2]) for k in _KERNEL_KINDS}

# --prom-by: the labels of a group (PromExport's series, hist rows)
LABELS = {"unit": ("unit",), "cgroup": ("cgroup",), "title": ("title",), "comm": ("comm",),
          "pid": ("pid", "comm"), "thread": ("pid", "tid", "comm")}

STAYING = ("unit", "cgroup", "title", "comm")  # groups that outlive their processes


def grouping(by: str) -> str:
    return "pid" if by == "process" else by  # (process: the old name of pid)


def label_value(field: str, r: dict, comm: str):
    """A row's value of one label: its process's unit, cgroup or title's
    role (identity.group_key: as stats --by names them, so a PostgreSQL
    backend's client does not make a series of its own), comm, pid or tid."""
    if field == "comm":
        return comm
    if field in ("unit", "cgroup", "title"):
        return identity.group_key(field, title=r.get("title"), comm=comm, cgroup_path=r.get("cgroup_path") or None)
    return r[field]


def group_keys(by: str, rows: list[dict]) -> list[tuple]:
    """The group (label values of LABELS[by]) of each row; a process's
    threads go by its main thread's name, except per thread."""
    leader = {r["pid"]: r["comm"] for r in rows if r["tid"] == r["pid"]}
    out = []
    for r in rows:
        comm = leader.get(r["pid"], r["comm"]) if by != "thread" else r["comm"]
        out.append(tuple(label_value(f, r, comm) for f in LABELS[by]))
    return out


def bucket_of(d_ns: int) -> int:
    """The bucket of a duration (d >= 1 ns): bpf/snaphist.h's hist_bucket(d - 1),
    stream.vocab's log2 ceiling convention."""
    return min(vocab.log2_ceil(d_ns, SHIFT), NBUCKETS - 1)


def from_row(h) -> tuple:
    """A task row's histograms (the kernel's struct snap_hist: per kind its
    sum and counts) as one flat tuple: NKINDS sums, then the counts kind by
    kind."""
    return (*(k.sum for k in h.k), *(n for k in h.k for n in k.n))


def delta(cur: tuple | None, prev: tuple | None) -> tuple | None:
    """Growth of a thread's histograms since its previous row (counts are
    u32 in the kernel: taken modulo 2^32, so a wrap between two snapshots
    is no loss)."""
    if cur is None or prev is None:
        return cur
    return (*(max(0, a - b) for a, b in zip(cur[:NKINDS], prev[:NKINDS])),
            *((a - b) % U32 for a, b in zip(cur[NKINDS:], prev[NKINDS:])))


class HistTotals:
    """Per group and kind: bucket counts and sum, summed over threads."""

    def __init__(self, by: str = "unit"):
        self.by = grouping(by)
        self.totals: dict[tuple, list[int]] = {}  # group -> flat like from_row

    def add(self, keys: list[tuple], deltas: list) -> None:
        for key, d in zip(keys, deltas):
            if not d or not any(d):
                continue
            acc = self.totals.get(key)
            if acc is None:
                self.totals[key] = list(d)
            else:
                for i, v in enumerate(d):
                    acc[i] += v

    def update(self, rows: list[dict], deltas: list, keys: list[tuple] | None = None) -> None:
        """Add the rows' growth (delta() of each) to their groups (keys:
        group_keys() of the rows). Per pid or thread a group ends once it
        has no row (a freed thread's final row is its last)."""
        keys = group_keys(self.by, rows) if keys is None else keys
        self.add(keys, deltas)
        if self.by not in STAYING:
            self.keep_only(set(keys))

    def keep_only(self, keys) -> None:
        """Forget the groups not in keys (series that end: per pid or thread)."""
        for key in [k for k in self.totals if k not in keys]:
            del self.totals[key]

    def items(self):
        """(group, kind, sum_ns, counts per bucket) of every histogram with a count."""
        for key in sorted(self.totals, key=lambda k: tuple(str(x) for x in k)):
            t = self.totals[key]
            for k, kind in enumerate(KINDS):
                counts = t[NKINDS + k * NBUCKETS:NKINDS + (k + 1) * NBUCKETS]
                if any(counts):
                    yield key, kind, t[k], counts

    def records(self, ts: int) -> list[dict]:
        """The "hist" rows of a JSON-lines snapshot: flat, with cumulative
        le_<ns> counts like Prometheus buckets."""
        names = LABELS[self.by]
        out = []
        for key, kind, total, counts in self.items():
            rec = {"type": "hist", "ts": ts, "by": self.by, **dict(zip(names, key)), "kind": kind,
                   "count": sum(counts), "sum_ns": total}
            rec.update(zip(bucket_fields(), cumulative(counts)))
            out.append(rec)
        return out

    def prom(self, labels) -> str:
        """Prometheus classic histograms; labels(key, **extra) renders a label set."""
        out = []
        done = set()
        rows = list(self.items())
        for kind in KINDS:
            family, extra, help_text = FAMILIES[kind]
            if family not in done:
                done.add(family)
                kinds = [k for k in KINDS if FAMILIES[k][0] == family]
                out.append(f"# HELP {family} {FAMILIES[kinds[0]][2]}\n# TYPE {family} histogram\n")
                for key, k, total, counts in rows:
                    if k not in kinds:
                        continue
                    ex = FAMILIES[k][1]
                    for le, n in zip(UPPER_NS, cumulative(counts)):
                        out.append(f"{family}_bucket{labels(key, **ex, le=le_text(le))} {n}\n")
                    out.append(f"{family}_sum{labels(key, **ex)} {total / 1e9:.9f}\n")
                    out.append(f"{family}_count{labels(key, **ex)} {sum(counts)}\n")
        return "".join(out)


def cumulative(counts) -> list[int]:
    out, n = [], 0
    for c in counts:
        n += c
        out.append(n)
    return out


def le_text(le_ns: int | None) -> str:
    return "+Inf" if le_ns is None else repr(le_ns / 1e9)


def bucket_fields() -> list[str]:
    """Field names of a hist row's buckets: le_<upper bound in ns>, le_inf."""
    return [f"le_{b}" if b is not None else "le_inf" for b in UPPER_NS]


def counts_of(rec: dict) -> list[int] | None:
    """Per-bucket counts of a hist row (from its cumulative fields), or None
    when it lacks one or they decrease."""
    cum = [rec.get(f) for f in bucket_fields()]
    if any(type(c) is not int or c < 0 for c in cum):
        return None
    counts = [b - a for a, b in zip([0, *cum], cum)]
    return counts if min(counts) >= 0 else None


HIST_RECORD = (
    "a latency histogram of one group in a snapshot (pstate snap --format jsonl), for one kind of wait; "
    "counts cumulative since the run began (--clear: over the interval), like the task rows",
    {
        "by": ("string", "what groups the rows: snap --prom-by (unit, cgroup, title, comm, pid or thread)"),
        "unit, cgroup, title, comm, pid, tid": ("string|int", "the group: the fields --prom-by names (as the "
                                                "labels of --format prom; title: the title's role, as "
                                                "stats --by title)"),
        "kind": ("string", f"{KINDS[0]} (run-queue wait after a wake-up), {KINDS[1]} (after a "
                           f"preemption), {KINDS[2]} (blocked in S until a wake-up) or {KINDS[3]} (in D)"),
        "count": ("int", "durations counted (le_inf)"),
        "sum_ns": ("int", "their sum, ns"),
        "le_<N>": ("int", "durations of at most N ns (cumulative, as Prometheus buckets); N = 2^10, 2^11, ... "
                          f"2^{SHIFT + NBUCKETS - 2}: fixed on every host"),
        "le_inf": ("int", "every duration (= count)"),
    },
)

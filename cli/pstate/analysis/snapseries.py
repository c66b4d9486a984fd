"""Offline analysis across snapshots (`pstate stats DIR/`).

Four views, each a pure function of the intervals snapdir.intervals()
derives from the snapshots:
- trends: per group (process by default), per interval: on-CPU share,
  run-queue wait share, time in D;
- churn: processes and threads born and gone per interval, short-lived ones
  (born and gone in the same interval) included;
- leak suspects: a group whose thread count, or whose share of time in one
  state, grows at every one of at least MIN_RUN consecutive snapshots,
  ranked by slope (least squares, per minute). A state's share is the
  average number of threads in it, so both kinds of slope are in threads
  per minute and rank together;
- changed: groups seen in at least two snapshots, their first against their
  last, ranked by the largest change of those shares (or relative change of
  the thread count);
- latency: per group of the snapshots' own hist rows (snap --prom-by) and
  kind of wait, count, p50 and p99 per interval (analysis/snaplatency.py).

Shares are fractions of the interval: 1.0 is one thread for the whole
interval (one CPU's worth for on-CPU time). Intervals are measured on the
monotonic clock; wall time only labels them. render.snaptables renders the
views; engines.stats runs them over snapshot files (snapshot_stats).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pstate.analysis import snaplatency
from pstate.snapshots import snapdir

MIN_RUN = 4  # snapshots of uninterrupted growth before a leak is suspected
MIN_SHARE_STEP = 0.005  # a state share must grow by this much per snapshot (noise floor)
BY_CHOICES = {"pid": "process", "process": "process", "tid": "thread", "thread": "thread", "comm": "comm",
              "cgroup": "cgroup", "unit": "unit", "container": "container", "title": "title", "ppid": "ppid"}
# groups named by one value (the COMM column holds it), not by a pid
NAMED = ("comm",) + snapdir.SERVICE_KEYS
LEAK_STATES = ("running", "runnable", "preempted", "sleeping", "uninterruptible", "stopped", "traced",
               "zombie", "parked", "idle")


# --- grouping ---------------------------------------------------------------


@dataclass
class Point:
    """One group over one interval."""

    i: int  # interval index
    duration_ns: int
    end_ts: int
    wall_end_ns: int
    values: dict = field(default_factory=dict)  # counter -> ns or count, summed over the group's threads
    threads: int = 0  # live threads at the end of the interval

    def share(self, key: str) -> float:
        return self.values.get(key, 0) / self.duration_ns if self.duration_ns else 0.0

    @property
    def running(self) -> int:
        return self.values.get("running_ns", 0)

    @property
    def wait(self) -> int:
        return sum(self.values.get(k, 0) for k in snapdir.WAIT_FIELDS)

    @property
    def d(self) -> int:
        return self.values.get("uninterruptible_ns", 0)

    def cpu_share(self) -> float:
        return self.share("running_ns")

    def wait_share(self) -> float:
        return self.wait / self.duration_ns if self.duration_ns else 0.0


@dataclass
class Group:
    key: tuple
    pid: int
    tid: int | None
    comm: str
    start_ts: int | None
    boot_id: str | None
    points: list = field(default_factory=list)

    def label(self) -> dict:
        out = {"boot_id": self.boot_id} if self.boot_id is not None else {}
        out["pid"] = self.pid
        if self.tid is not None:
            out["tid"] = self.tid
        out["comm"] = self.comm
        if self.start_ts is not None:
            out["start_ts"] = self.start_ts
        return out


def _group_of(t: snapdir.TaskInterval, by: str, role=None):
    if by == "thread":
        return t.key, t.pid, t.tid, t.start_ts, t.key[0]
    if by == "comm":
        return ("comm", t.comm), 0, None, None, None
    if by in NAMED:  # the title, cgroup and parent rows carry
        name = snapdir.service_key(by, {"title": t.title, "comm": t.comm, "cgroup_path": t.cgroup_path,
                                        "ppid": t.ppid}, role)
        return (by, name), 0, None, None, None
    return t.proc, t.pid, None, t.proc[2], t.proc[0]


def groups(ivs: list[snapdir.Interval], by: str, role=None) -> list[Group]:
    """The groups of the intervals' tasks by `by`; role: the pattern of
    --by 'title:REGEX'."""
    out: dict[tuple, Group] = {}
    for i, iv in enumerate(ivs):
        here: dict[tuple, Point] = {}
        for t in iv.tasks:
            key, pid, tid, start, boot = _group_of(t, by, role)
            g = out.get(key)
            if g is None:
                g = out[key] = Group(key, pid, tid, str(key[1]) if by in NAMED else t.comm, start, boot)
            if by not in NAMED and (t.tid == t.pid or by == "thread"):
                g.comm = t.comm  # the leader's name names the process
            p = here.get(key)
            if p is None:
                p = here[key] = Point(i, iv.duration_ns, iv.end_ts, iv.wall_end_ns)
                g.points.append(p)
            for k, v in t.values.items():
                p.values[k] = p.values.get(k, 0) + v
            if t.alive:
                p.threads += 1
    return list(out.values())


# --- the four views -----------------------------------------------------------


def trends(gs: list[Group]) -> list[dict]:
    rows = []
    for g in gs:
        total_run = sum(p.running for p in g.points)
        total_dur = sum(p.duration_ns for p in g.points)
        series = [{
            "interval": p.i, "end_ts": p.end_ts, "wall_end_ns": p.wall_end_ns, "duration_ns": p.duration_ns,
            "running_ns": p.running, "steal_irq_ns": p.values.get(snapdir.STEAL_FIELD, 0), "wait_ns": p.wait,
            "uninterruptible_ns": p.d,
            "sleeping_ns": p.values.get("sleeping_ns", 0), "threads": p.threads,
            "cpu_share": round(p.cpu_share(), 6), "wait_share": round(p.wait_share(), 6),
        } for p in g.points]
        total_steal = sum(s["steal_irq_ns"] for s in series)
        rows.append({
            **g.label(), "snapshots": len(g.points),
            "cpu_share_avg": round(total_run / total_dur, 6) if total_dur else 0.0,
            "cpu_share_max": max((s["cpu_share"] for s in series), default=0.0),
            "wait_share_avg": round(sum(p.wait for p in g.points) / total_dur, 6) if total_dur else 0.0,
            "d_ns_per_interval": sum(p.d for p in g.points) // max(1, len(g.points)),
            "running_ns": total_run,
            "steal_irq_ns": total_steal,
            "steal_share_avg": round(total_steal / total_dur, 6) if total_dur else 0.0,
            "series": series,
        })
    rows.sort(key=lambda r: (-r["running_ns"], -r["wait_share_avg"], r["pid"], r.get("tid", 0)))
    return rows


def churn(ivs: list[snapdir.Interval]) -> dict:
    per = []
    by_comm: dict[str, dict] = {}
    for i, iv in enumerate(ivs):
        procs: dict[tuple, list] = {}
        for t in iv.tasks:
            procs.setdefault(t.proc, []).append(t)
        c = {"interval": i, "start_ts": iv.start_ts, "end_ts": iv.end_ts, "wall_end_ns": iv.wall_end_ns,
             "duration_ns": iv.duration_ns,
             "processes": sum(1 for ts in procs.values() if any(t.alive for t in ts)),
             "threads": sum(1 for t in iv.tasks if t.alive),
             "processes_born": 0, "processes_gone": 0, "short_lived_processes": 0,
             "threads_born": sum(1 for t in iv.tasks if t.born),
             "threads_gone": sum(1 for t in iv.tasks if t.gone) + sum(t.folded for t in iv.tasks),
             "short_lived_threads": sum(1 for t in iv.tasks if t.born and t.gone)}
        for ts in procs.values():
            leader = next((t for t in ts if t.tid == t.pid), None)
            born = leader is not None and leader.born
            gone = any(t.gone for t in ts) and not any(t.alive for t in ts)
            c["processes_born"] += born
            c["processes_gone"] += gone
            c["short_lived_processes"] += born and gone
            if born or gone:
                name = leader.comm if leader else ts[0].comm
                e = by_comm.setdefault(name, {"comm": name, "processes_born": 0, "processes_gone": 0,
                                              "short_lived_processes": 0})
                e["processes_born"] += born
                e["processes_gone"] += gone
                e["short_lived_processes"] += born and gone
        per.append(c)
    keys = ("processes_born", "processes_gone", "short_lived_processes", "threads_born", "threads_gone",
            "short_lived_threads")
    totals = {k: sum(c[k] for c in per) for k in keys}
    comms = sorted(by_comm.values(), key=lambda e: (-(e["processes_born"] + e["processes_gone"]), e["comm"]))
    return {"intervals": per, "totals": totals, "by_comm": comms}


def _slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def _longest_growth(values: list[float], min_step: float) -> tuple[int, int]:
    """(start, length) of the longest run where each value exceeds the previous by > min_step."""
    best = (0, 1)
    start = 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] - values[i - 1] <= min_step:
            if i - start > best[1]:
                best = (start, i - start)
            start = i
    return best


def leaks(gs: list[Group], ivs: list[snapdir.Interval], min_run: int = MIN_RUN) -> list[dict]:
    out = []
    for g in gs:
        # consecutive snapshots only: a gap in the group's presence breaks a run
        segments, seg = [], []
        for p in g.points:
            if seg and p.i != seg[-1].i + 1:
                segments.append(seg)
                seg = []
            seg.append(p)
        segments.append(seg)
        best_per_metric: dict[str, dict] = {}
        for seg in segments:
            if len(seg) < min_run:
                continue
            metrics = {"threads": ([float(p.threads) for p in seg], 0.5)}
            for s in LEAK_STATES:
                metrics[s] = ([p.share(f"{s}_ns") for p in seg], MIN_SHARE_STEP)
            for name, (ys, step) in metrics.items():
                start, n = _longest_growth(ys, step)
                if n < min_run:
                    continue
                run_pts = seg[start:start + n]
                xs = [(p.end_ts - run_pts[0].end_ts) / 1e9 for p in run_pts]
                slope = _slope(xs, ys[start:start + n]) * 60.0
                first, last = ys[start], ys[start + n - 1]
                cand = {**g.label(), "metric": name, "snapshots": n,
                        "first": round(first, 6), "last": round(last, 6), "slope_per_min": round(slope, 6),
                        "from_ts": run_pts[0].end_ts, "to_ts": run_pts[-1].end_ts,
                        "from_wall_ns": run_pts[0].wall_end_ns, "to_wall_ns": run_pts[-1].wall_end_ns}
                if name not in best_per_metric or slope > best_per_metric[name]["slope_per_min"]:
                    best_per_metric[name] = cand
        out.extend(best_per_metric.values())
    out.sort(key=lambda r: (-r["slope_per_min"], -r["snapshots"], r["pid"], r["metric"]))
    return out


def changed(gs: list[Group]) -> list[dict]:
    """Groups seen in at least two snapshots: their first against their last."""
    out = []
    for g in gs:
        if len(g.points) < 2:
            continue
        a, b = g.points[0], g.points[-1]
        first = {"cpu_share": a.cpu_share(), "wait_share": a.wait_share(), "d_share": a.share("uninterruptible_ns"),
                 "threads": a.threads}
        last = {"cpu_share": b.cpu_share(), "wait_share": b.wait_share(), "d_share": b.share("uninterruptible_ns"),
                "threads": b.threads}
        delta = {k: last[k] - first[k] for k in first}
        score = max(abs(delta["cpu_share"]), abs(delta["wait_share"]), abs(delta["d_share"]),
                    abs(delta["threads"]) / max(first["threads"], 1))
        if score <= 0:
            continue

        def r6(d):
            return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in d.items()}

        out.append({**g.label(), "first_interval": a.i, "last_interval": b.i, "first": r6(first), "last": r6(last),
                    "delta": r6(delta), "score": round(score, 6)})
    out.sort(key=lambda r: (-r["score"], r["pid"], r.get("tid", 0), r["comm"]))
    return out


def summary(snaps: list[snapdir.Snapshot], ivs: list[snapdir.Interval]) -> dict:
    return {
        "snapshots": len(snaps),
        "hosts": sorted({str(s.meta.get("host", "")) for s in snaps}),
        "boots": len({s.boot_id for s in snaps}),
        "runs": len({(s.boot_id, s.run_id) for s in snaps}),
        "covered_ns": sum(iv.duration_ns for iv in ivs),
        "first_wall_ns": min((s.wall_end_ns for s in snaps), default=0),
        "last_wall_ns": max((s.wall_end_ns for s in snaps), default=0),
        "truncated": sum(1 for s in snaps if s.truncated),
        "untraced": untraced(ivs),
        "intervals": [{"interval": i, "file": iv.snapshot.path, "boot_id": iv.boot_id, "seq": iv.snapshot.meta.get("seq"),
                       "start_ts": iv.start_ts, "end_ts": iv.end_ts, "duration_ns": iv.duration_ns,
                       "wall_end_ns": iv.wall_end_ns, "tasks": len(iv.tasks),
                       "truncated": iv.snapshot.truncated}
                      for i, iv in enumerate(ivs)],
    }


def untraced(ivs: list[snapdir.Interval]) -> list[dict]:
    """The threads on a CPU through a whole interval with no switch in it
    (snapdir.untraced_run): flagged, their on-CPU time in those intervals
    not counted (unknown), one entry per thread."""
    out: dict = {}
    for iv in ivs:
        for t in iv.tasks:
            if t.untraced:
                u = out.setdefault(t.key, {"pid": t.pid, "tid": t.tid, "comm": t.comm, "intervals": 0,
                                           "unknown_ns": 0})
                u["intervals"] += 1
                u["unknown_ns"] += t.untraced
    return sorted(out.values(), key=lambda u: (-u["unknown_ns"], u["tid"]))


def analyse(snaps: list[snapdir.Snapshot], *, by: str = "process", role=None, min_run: int = MIN_RUN) -> dict:
    ivs = snapdir.intervals(snaps)
    gs = groups(ivs, by, role)
    return {
        "type": "snapstats", "by": by, "min_run": min_run,
        **summary(snaps, ivs),
        "trends": trends(gs),
        "churn": churn(ivs),
        "leaks": leaks(gs, ivs, min_run),
        "changed": changed(gs),
        "latency": snaplatency.series(snaps),
    }

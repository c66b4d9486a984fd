"""Prometheus text of snapshots (`pstate snap --format prom`), for
node_exporter's textfile collector.

The file is read by the collector's own user (Debian: prometheus), so it
is readable by others (writer.py has the rule) and carries only the labels
--prom-by asks for: per unit (the default) and per cgroup, names any local
user reads in /sys/fs/cgroup anyway; process titles (command lines, which
may hold secrets), comm and pids only per title, comm, pid or thread.
"""

from __future__ import annotations

from pstate.snapshots import histograms, snapdir

# Groupings whose labels name processes: what /proc shows every user, but
# only to the process's owner where /proc is mounted with hidepid.
PER_PROCESS = ("title", "comm", "pid", "thread", "process")


def procfs_hidepid(mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """The hidepid= value of the /proc this process sees when it hides other
    users' processes (1, 2, invisible, noaccess, ptraceable), else None. The
    last /proc in mountinfo is the one on top."""
    try:
        with open(mountinfo, "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    found = None
    for line in text.splitlines():
        mount, _, sb = line.partition(" - ")
        fields = mount.split()
        if len(fields) < 6 or fields[4] != "/proc":
            continue
        found = None
        for opt in ",".join([fields[5], *sb.split()[2:3]]).split(","):
            if opt.startswith("hidepid=") and opt[len("hidepid="):] not in ("0", "off"):
                found = opt[len("hidepid="):]
    return found


def _label(v) -> str:
    return str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class PromExport:
    """Prometheus text for node_exporter's textfile collector.

    Counters must never go down, but threads exit, exec renames them and
    rows leave the map; so each snapshot adds every thread's growth over
    its interval to the series of its current labels, and the sums only
    grow. Series per unit (the default), cgroup, title or comm stay, and
    their number is bounded by the services, not the pids; per pid or per
    thread they disappear once the process or thread is gone.
    No sample timestamps: the textfile collector rejects them. The latency
    histograms (snapshots/histograms.py) are summed the same way.
    """

    LABELS = histograms.LABELS
    STAYING = histograms.STAYING  # series that outlive their processes

    def __init__(self, by: str = "unit"):
        self.by = histograms.grouping(by)
        self.hist = histograms.HistTotals(by)
        self.totals: dict[tuple, dict[str, int]] = {}
        self.threads: dict[tuple, int] = {}
        self.started = 0
        self.exited = 0

    def update(self, rows: list[dict], deltas: list[dict], new: list[bool], run_start_ts: int,
               hist_deltas: list | None = None, folds: list | None = None) -> None:
        """Add the rows' growth (deltas) to their groups; folds: (group,
        growth, histogram growth) of the folded groups (snapshots/folds.py)."""
        keys = histograms.group_keys(self.by, rows)
        threads: dict[tuple, int] = {}
        for r, d, is_new, key in zip(rows, deltas, new, keys):
            acc = self.totals.setdefault(key, {})
            for k, v in d.items():
                acc[k] = acc.get(k, 0) + v
            threads.setdefault(key, 0)
            if not r["exited"]:
                threads[key] += 1
            if is_new and r["start_ts"] >= run_start_ts:
                self.started += 1
            if r["state"] == "reaped":
                self.exited += 1
        hist_deltas = list(hist_deltas or ())
        for key, d, hd in folds or ():
            acc = self.totals.setdefault(key, {})
            for k, v in d.items():
                acc[k] = acc.get(k, 0) + v
            threads.setdefault(key, 0)
            self.exited += d.get("folded", 0)
            keys.append(key)
            hist_deltas.append(hd)
        if self.by not in self.STAYING:
            # A process or thread is shown once more after it is freed (with
            # 0 threads); then its series ends.
            for key in [k for k in self.totals if k not in threads]:
                del self.totals[key]
        self.hist.update(rows, hist_deltas, keys)
        self.threads = threads

    def render(self, meta: dict) -> bytes:
        names = self.LABELS[self.by]
        out = []

        def family(name, kind, help_text):
            out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")

        def labels(key, **extra):
            pairs = list(zip(names, key)) + list(extra.items())
            return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in pairs) + "}"

        keys = sorted(self.totals, key=lambda k: tuple(str(x) for x in k))
        family("pstate_state_seconds_total", "counter", "Time threads spent in each scheduler state.")
        for key in keys:
            t = self.totals[key]
            for field in snapdir.state_fields(t):
                if t[field]:
                    out.append(f"pstate_state_seconds_total{labels(key, state=field[:-3])} {t[field] / 1e9:.9f}\n")
        if any(t.get(snapdir.STEAL_FIELD) for t in self.totals.values()):
            family("pstate_steal_irq_seconds_total", "counter",
                   "Of the running state's time, what the kernel did not count as the threads' own: stolen "
                   "by the hypervisor or spent in interrupts (running less this is /proc's schedstat time).")
            for key in keys:
                out.append(f"pstate_steal_irq_seconds_total{labels(key)} "
                           f"{self.totals[key].get(snapdir.STEAL_FIELD, 0) / 1e9:.9f}\n")
        family("pstate_context_switches_total", "counter",
               "Switches off the CPU: voluntary (blocked) or involuntary (preempted).")
        for key in keys:
            t = self.totals[key]
            out.append(f"pstate_context_switches_total{labels(key, kind='voluntary')} {t.get('nvcsw', 0)}\n")
            out.append(f"pstate_context_switches_total{labels(key, kind='involuntary')} {t.get('nivcsw', 0)}\n")
        family("pstate_wakeups_total", "counter", "Wake-ups from a blocked state.")
        for key in keys:
            out.append(f"pstate_wakeups_total{labels(key)} {self.totals[key].get('wakeups', 0)}\n")
        family("pstate_threads_folded_total", "counter",
               "Threads freed when the kernel's map of final rows was full, added up into their group.")
        for key in keys:
            if self.totals[key].get("folded"):
                out.append(f"pstate_threads_folded_total{labels(key)} {self.totals[key]['folded']}\n")
        out.append(self.hist.prom(labels))
        family("pstate_threads", "gauge", "Live threads at the snapshot.")
        for key in keys:
            out.append(f"pstate_threads{labels(key)} {self.threads.get(key, 0)}\n")
        family("pstate_tasks_started_total", "counter", "Threads and processes started since pstate snap began.")
        out.append(f"pstate_tasks_started_total {self.started}\n")
        family("pstate_tasks_exited_total", "counter", "Threads and processes freed since pstate snap began.")
        out.append(f"pstate_tasks_exited_total {self.exited}\n")
        family("pstate_snapshot_timestamp_seconds", "gauge", "Wall-clock time of the snapshot.")
        out.append(f"pstate_snapshot_timestamp_seconds {meta['wall_end_ns'] / 1e9:.6f}\n")
        family("pstate_snapshot_interval_seconds", "gauge", "Length of the interval the snapshot covers.")
        out.append(f"pstate_snapshot_interval_seconds "
                   f"{(meta['interval_end_ts'] - meta['interval_start_ts']) / 1e9:.6f}\n")
        family("pstate_snapshot_truncated", "gauge", "1 when the task map was full and rows are missing.")
        out.append(f"pstate_snapshot_truncated {int(meta['truncated'])}\n")
        family("pstate_map_full_total", "counter", "Task map updates that failed because the map was full.")
        out.append(f"pstate_map_full_total {meta['map_full']}\n")
        for name, field, help_text in (
                ("pstate_gone_full_total", "gone_full", "Final rows of freed threads the kernel's map had no room for."),
                ("pstate_rows_folded_total", "folded", "Of those, rows folded into their group's row."),
                ("pstate_rows_lost_total", "fold_lost", "Of those, rows lost: the map of groups was full too."),
                ("pstate_skipped_runs_total", "skipped", "Runs of pstate's programs the kernel skipped: each a "
                 "transition or wake-up not counted (the classic tracepoint path only).")):
            family(name, "counter", help_text)
            out.append(f"{name} {meta.get(field, 0)}\n")
        out.append("# EOF\n")
        return "".join(out).encode()

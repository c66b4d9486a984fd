"""The JSON reports the readers write, declared as data beside schema.RECORDS:
`pstate stats --format json` on a stream (type "stats") and on snapshots
(type "snapstats"). pstate-events(5) is generated from these tables (REPORTS),
and tests/contract/test_reports.py holds them to the keys the commands really write.

Each report is (description, fields); a field is named by its path: `a.b` is
key b of object a, `a[].b` key b of each object of list a, and an upper-case
part stands for several keys: STATE, KIND and REASON for each key of that
kind, FIELD and LABEL for the keys the description lists. Types as in
schema.RECORDS; "?" marks a field that may be null or absent.

`pstate replay` writes no report of its own: its output is the event format,
whose meta record says "replayed" and, for a cut stream, its window
(schema.RECORDS["meta"]).
"""

from __future__ import annotations

from pstate.stream import vocab

# The stats report's version (its "schema" field): it grows when a field is
# renamed or changes its meaning, not when one is added. 2: the wait after
# a preemption has the name snapshot hist rows give it (vocab.FORMER_NAMES:
# pstate 0.1.0 wrote schema 1).
STATS_SCHEMA = 2
_KINDS = ", ".join(k.name for k in vocab.WAIT_KINDS if not k.name.startswith(vocab.BLOCKED_PREFIX)) \
    + " or " + vocab.blocked_kind("STATE")
_FORMER = "; ".join(f"schema 1 (pstate 0.1.0) named {new} {old}, in every field named after it"
                    for old, new in vocab.FORMER_NAMES.items())
_WAKEUP, _PREEMPTED = vocab.RUNQ_WAKEUP.name, vocab.RUNQ_PREEMPTED.name

_GROUP = {
    "key": ("int|string", "the group: the pid, tid, comm, cgroup path, unit, container, title or ppid"),
    "pid": ("int?", "by pid and tid"),
    "tid": ("int?", "by tid"),
    "threads": ("int?", "threads in the group (by pid, comm)"),
    "processes": ("int?", "processes in the group (by comm)"),
    "comm": ("string", "task name"),
    "observed_ns": ("int?", "time the group was observed, summed over its tasks; null when the "
                            "input does not support time in state (ledger.time_in_state false)"),
    "unobserved_ns": ("int", "time before transitions whose state's start was not seen"),
    "oncpu_exceeds_cpus": ("bool", "on a CPU longer than its threads and the CPUs allow: inconsistent records"),
    "states.STATE.ns": ("int", "time in STATE"),
    "states.STATE.pct": ("float", "percent of observed_ns"),
    "steal_irq_ns": ("int", "of states.running.ns, the time the kernel counted as stolen by the hypervisor "
                            "or spent in interrupts (the switch-outs' steal_irq_ns summed; 0 where the "
                            "recording has none: meta on_cpu_time \"wall\")"),
    "transitions": ("int", "state transitions"),
    "voluntary": ("int", "switches out that blocked"),
    "involuntary": ("int", "switches out by preemption"),
    "impossible": ("int", "switch-ins of a task already running (running -> running), counted apart"),
    "null_dur": ("int", "transitions whose state's start was not seen (dur_ns null)"),
    "forks": ("int", "forks of the group's tasks"),
    "execs": ("int", "execs"),
    "exits": ("int", "exits"),
    "latency.KIND.count": ("int", f"waits of KIND: {_KINDS}"),
    "latency.KIND.p50_ns": ("int", "median, from a log-linear histogram (within 1.6 %)"),
    "latency.KIND.p90_ns": ("int", "90th percentile"),
    "latency.KIND.p99_ns": ("int", "99th percentile"),
    "latency.KIND.max_ns": ("int", "maximum, exact"),
    "latency.KIND.mean_ns": ("int", "mean"),
    "latency.KIND.hist_unit": ("string?", "with --hist: usecs or msecs"),
    "latency.KIND.hist": ("array?", "with --hist: log2 buckets [[lo, hi, count], ...] in hist_unit"),
    "matrix[].FIELD": ("", "with --matrix: the group's transitions, with the fields of the report's matrix"),
    "blocked_ns": ("int?", "with --stacks: blocked time of the states asked for"),
    "stacks[].state": ("string", "with --stacks: the blocked state"),
    "stacks[].reason": ("string", "the first frame that is not scheduler plumbing"),
    "stacks[].frames": ("string", "kernel frames, root first, joined by ;"),
    "stacks[].count": ("int", "blocked intervals the stack ended"),
    "stacks[].total_ns": ("int", "blocked time they ended"),
    "stacks[].p50_ns": ("int", "median blocked interval"),
    "stacks[].p99_ns": ("int", "99th percentile"),
    "stacks[].max_ns": ("int", "maximum"),
    "reasons[].FIELD": ("", "with --stacks, per state and reason: state, reason, count, total_ns, p50_ns, "
                            "p99_ns, max_ns"),
    "wakers[].kind": ("string", "with --wakers: task, irq, softirq or unknown"),
    "wakers[].tid": ("int?", "the waking task"),
    "wakers[].pid": ("int?", "its process"),
    "wakers[].comm": ("string?", "its name"),
    "wakers[].name": ("string", "as the table shows it: comm tid, the irq or softirq"),
    "wakers[].count": ("int", "wake-ups from a blocked state"),
    "wakers[].ended_ns": ("int", "blocked time they ended"),
    "wakers[].group": ("int|string?", "the key of the waker's own group (a task's; null for irq, softirq, unknown)"),
    "wakers[].pct": ("float", "percent of the group's blocked time ended (wakers_total), whatever --top shows"),
    "wakers_total.count": ("int?", "with --wakers: every wake-up of the group"),
    "wakers_total.ended_ns": ("int?", "the blocked time they ended"),
    "wakers_other": ("object?", "the wakers past the rows shown; null when none are"),
    "wakers_other.wakers": ("int", "how many"),
    "wakers_other.count": ("int", "their wake-ups"),
    "wakers_other.ended_ns": ("int", "the blocked time they ended"),
    "wakers_other.pct": ("float", "percent of wakers_total.ended_ns"),
    "runq_ns": ("int?", f"with --antagonists: run-queue time, {_WAKEUP}_ns plus {_PREEMPTED}_ns"),
    f"{_WAKEUP}_ns": ("int?", "run-queue time after a wake-up"),
    f"{_PREEMPTED}_ns": ("int?", "run-queue time after a preemption"),
    "runq_waits": ("int?", "run-queue waits"),
    "antagonists[].tid": ("int?", "a task that held the CPU meanwhile; null for [idle or unseen]"),
    "antagonists[].pid": ("int?", "its process"),
    "antagonists[].comm": ("string?", "its name"),
    "antagonists[].name": ("string", "as the table shows it"),
    "antagonists[].ns": ("int", "run-queue time it caused"),
    "antagonists[].pct": ("float", "percent of runq_ns"),
    "antagonists[].waits": ("int", "waits it fell within"),
    "antagonists[].group": ("int|string?", "the key of its own group (null for [idle or unseen])"),
    "antagonists_other": ("object?", "the antagonists past the rows shown; null when none are"),
    "antagonists_other.tasks": ("int", "how many"),
    "antagonists_other.ns": ("int", "run-queue time they caused"),
    "antagonists_other.pct": ("float", "percent of runq_ns"),
}

STATS_FIELDS: dict[str, tuple[str, str]] = {
    "type": ("string", '"stats"'),
    "schema": ("int", f"{STATS_SCHEMA}; {_FORMER}"),
    "by": ("string", "the --by grouping"),
    "window.start_ts": ("int", "first instant summarised, CLOCK_MONOTONIC ns"),
    "window.end_ts": ("int", "last instant"),
    "window.duration_ns": ("int", "its length"),
    "interval.seq": ("int?", "with --interval: the interval's number"),
    "interval.start_ts": ("int?", "its start"),
    "interval.end_ts": ("int?", "its end"),
    "input.lines": ("int", "lines read"),
    "input.records": ("int", "records among them"),
    "input.events": ("int", "events summarised"),
    "input.skipped.REASON": ("int", "lines skipped, by reason"),
    "input.skipped_total": ("int", "their sum"),
    "input.truncated_tail": ("bool", "the input ended inside a line"),
    "input.unknown": ("object", "records of types this pstate does not know (skipped), by type"),
    "input.lost.REASON": ("int", "events the input's loss records report, by reason"),
    "input.lost_total": ("int", "their sum"),
    "input.lost_pct": ("float", "percent of the events"),
    "input.complete": ("bool", "false with loss, skipped lines, a truncated tail or an interruption: "
                               "the table says INCOMPLETE"),
    "input.interrupted": ("bool", "the run was cut short by Ctrl-C"),
    "accounting.tasks": ("int", "tasks seen"),
    "accounting.groups": ("int", "groups formed"),
    "accounting.groups_shown": ("int", "groups in the report (--top, --in-state, --min-time)"),
    "accounting.tasks_whole_window": ("int", "tasks seen through the whole window, whose states sum to it"),
    "accounting.max_abs_deviation_ns": ("int", "their largest deviation from the window"),
    "accounting.total_abs_deviation_ns": ("int", "the sum of their deviations"),
    "accounting.max_deviation_tid": ("int?", "the task of the largest deviation"),
    "accounting.max_deviation_comm": ("string?", "its name"),
    "accounting.null_dur_transitions": ("int", "transitions whose state's start was not seen"),
    "accounting.unobserved_ns": ("int", "time before them, left out of the percentages"),
    "accounting.impossible_transitions": ("int", "switch-ins of a task already running"),
    "accounting.oncpu_exceeds_cpus": ("array", "keys of the groups flagged so"),
    "ledger.time_in_state": ("bool", "false when the input holds only some transitions of each task "
                                     "(recorded or read with --state, --cpu or --min-dur): states is then "
                                     "empty and observed_ns null"),
    "ledger.transition_filters": ("array", "the options that kept only some transitions"),
    "ledger.task_filters": ("array", "the options that kept only some tasks"),
    "ledger.read_filters": ("array", "those stats applied itself"),
    "ledger.cut": ("object?", "the window a cut stream says it covers"),
    **{f"groups[].{k}": v for k, v in _GROUP.items()},
    "matrix[].from": ("string", "with --matrix: the state left"),
    "matrix[].to": ("string", "the state entered"),
    "matrix[].count": ("int", "transitions"),
    "matrix[].mean_ns": ("int?", "mean time in the state left"),
    "matrix[].total_ns": ("int", "total time in the state left"),
    "rest": ("object?", "when --top hides groups: the hidden groups summed up, with a group's fields"),
    "total": ("object?", "and all the groups chosen: shown + rest = total, figure by figure"),
    "why.stacks": ("bool?", "--stacks was asked for (the why object is there only with one of the three)"),
    "why.wakers": ("bool?", "--wakers was asked for"),
    "why.antagonists": ("bool?", "--antagonists was asked for"),
    "why.rows_per_group": ("int?", "rows per group: --top N, else 5"),
    "why.stack_records": ("int?", "stack records in the input"),
}

_INTERVAL_LABEL = "pid, comm, start_ts and boot_id by pid; tid too by tid; key for the other --by"

SNAPSTATS_FIELDS: dict[str, tuple[str, str]] = {
    "type": ("string", '"snapstats"'),
    "by": ("string", "the --by grouping: process, thread, comm, cgroup, unit, container, title or ppid"),
    "min_run": ("int", "snapshots a trend must span to be a leak suspect"),
    "snapshots": ("int", "snapshot files read"),
    "hosts": ("array", "their hosts"),
    "boots": ("int", "boots they span"),
    "runs": ("int", "snap runs they span"),
    "covered_ns": ("int", "time the intervals cover"),
    "first_wall_ns": ("int", "wall-clock time of the first snapshot, ns"),
    "last_wall_ns": ("int", "of the last"),
    "truncated": ("int", "snapshots that end early"),
    "untraced[].FIELD": ("", "threads on a CPU through a whole interval with no switch in it (their "
                             "switch-outs not traced): pid, tid, comm, intervals, unknown_ns (their time "
                             "then, counted unknown, not running)"),
    "intervals[].FIELD": ("", "per interval: interval, file, boot_id, seq, start_ts, end_ts, duration_ns, "
                              "wall_end_ns, tasks, truncated"),
    "trends[].LABEL": ("", f"per group ({_INTERVAL_LABEL}): snapshots, cpu_share_avg, cpu_share_max, "
                           "wait_share_avg, d_ns_per_interval, running_ns, steal_irq_ns (of running_ns, "
                           "what the kernel did not count as the threads' own: steal and interrupts), "
                           "steal_share_avg (that, of the intervals' time), and series"),
    "trends[].series[].FIELD": ("", "per interval: interval, end_ts, wall_end_ns, duration_ns, running_ns, "
                                    "steal_irq_ns, wait_ns, uninterruptible_ns, sleeping_ns, threads, cpu_share, "
                                    "wait_share"),
    "churn.intervals[].FIELD": ("", "per interval: interval, start_ts, end_ts, wall_end_ns, duration_ns, "
                                    "processes, threads, processes_born, processes_gone, short_lived_processes, "
                                    "threads_born, threads_gone (folded threads included), short_lived_threads"),
    "churn.totals.FIELD": ("", "the same counts over every interval"),
    "churn.by_comm[].FIELD": ("", "per name: comm, processes_born, processes_gone, short_lived_processes"),
    "leaks[].LABEL": ("", "leak suspects, per group and metric: metric, snapshots, first, last, "
                          "slope_per_min, from_ts, to_ts, from_wall_ns, to_wall_ns"),
    "changed[].LABEL": ("", "groups whose behaviour changed most: first_interval, last_interval, and first, "
                            "last and delta of cpu_share, wait_share, d_share and threads, and score"),
    "latency[].FIELD": ("", "per group and kind of the snapshots' hist rows: by, group, kind, count, "
                            "p99_max_ns, and series (per interval: interval, end_ts, wall_end_ns, count, "
                            "sum_ns, percentiles)"),
}

REPORTS: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "stats": ("`pstate stats --format json` on a stream or recording: one object (one a line, one per "
              "interval, with --interval)", STATS_FIELDS),
    "snapstats": ("`pstate stats --format json` on snapshot files or directories: one object", SNAPSTATS_FIELDS),
}

"""What each command does in detail, for its man page's DESCRIPTION.

`--help` shows usage, options and examples only (bcc's convention, at most
80 columns: tests/contract/test_help.py); the explanations that do not fit there are
here, in manprose's light markup, and docgen.py renders them after the
command's own description. Report schemas are data, in pstate.stream.reports.
"""

from __future__ import annotations

NOTES: dict[str, str] = {
    "record": """
        The first line is a meta header, the last an end trailer with
        totals; loss records appear in-band when events are dropped
        (pstate-events(5)). Ctrl-C, SIGTERM and `--duration` end the run
        normally (exit 0) after writing the trailer; a closed output pipe
        ends it quietly.

        With `-- CMD ARGS...`, record starts CMD once the kernel side is
        ready and records it and every process it forks, and theirs (the
        kernel follows forks: nothing else is recorded); it stops when CMD
        exits and exits with CMD's status (128 + N when a signal N ended it;
        3 when CMD exited 0, `--strict` is given and events were lost). When
        the stream goes to standard output, CMD's standard output goes to
        standard error, so that the two do not mix. `-p PID --children`
        follows the descendants of PID the same way, those living now and
        those forked from now on. `--cgroup PATH` follows the processes of
        the cgroup and of those below it: those in them when recording
        starts, those seen switching out in them later, and what they fork.
        A process moved out stays followed.
        """,
    "snap": """
        Files: pstate-snap-<UTC time>-<seq>.jsonl (or .csv) in DIR,
        published atomically: a meta header, one task row per thread, an
        end trailer (SNAPSHOTS in pstate-events(5)). CSV has the same
        columns, with the meta and end records as JSON in `#` comment lines.
        `--format prom` keeps one file, pstate-snap.prom, replaced at each
        snapshot, for node_exporter's textfile collector. Rows carry their
        process's title and cgroup (title, cgroup, cgroup_path), read from
        /proc at each snapshot. DIR/.pstate-last.json tells the outcome of
        the latest snapshot.

        `--prom-by unit` is the default because a Prometheus operator
        aggregates by service, and series per pid grow with every process
        started (their cardinality follows churn, not the services): per
        unit, cgroup or title the number of series is bounded by the
        services running and they never disappear; per comm too; per pid or
        thread they come and go with the processes (`--prom-by process` is
        the old name of pid).

        Values are cumulative since the run began (the state a thread was in
        when the run began counts from then on); `--clear` makes each file a
        delta over its own interval. Threads that exited stay in the next
        snapshot, then go. A missing DIR is created (mode 0700) when its
        parent exists. DIR must not be a symlink, nor group- or
        world-writable (exit 77). One snap per DIR: another one exits 75. A
        full disk exits 73 and leaves earlier snapshots intact. SIGINT and
        SIGTERM remove the snapshot in progress and exit 130 and 143, unless
        the interval's snapshot was already out (exit 0).

        The collector (`--start`): snap's BPF programs and maps stay in the
        kernel, pinned in /sys/fs/bpf/pstate/snap (bpffs is mounted there
        when it is not), attached by BPF links, and count with no process
        running, in kernel memory bounded by `--max-tasks`. Each `snap --dir
        DIR` then writes one snapshot of it at once and exits: totals since
        the collector started, every thread that exited since the last
        snapshot included, with the previous snapshot's time (prev_ts) in
        the meta record; `--interval`, `--count`, `--every` and `--clear` do
        not apply. `--start` is idempotent; `--stop` removes every program,
        link, map and pin it made; `--restart` replaces it (a pstate of
        another layout refuses to read it, exit 65). Without a collector,
        snap collects for one interval (and says so on a terminal).

        The pin directory (/sys/fs/bpf/pstate, or `--pin-dir DIR` on bpffs)
        is created 0700. bpffs is writable by every user, so one that is not
        a real directory, not root's, or writable by group or others is
        refused (exit 77): another user could move or hide the collector
        there. Remove it as root (`rm -r DIR`: bpffs holds only pins) or
        choose another with `--pin-dir`; doctor names its owner. `--status`,
        `--stop`, doctor and each snapshot find a collector by its manifest
        wherever it was moved in bpffs (a bounded walk that follows no
        symbolic link), `--stop` removes only pins the manifest proves
        pstate made, and `--start` starts no second one.
        """,
    "replay": """
        TIME is +30s or +1m30s (after the start of the recording), 12:00:05
        (that time of day, local, on the day the recording started),
        2026-11-30T12:00:00 (local time unless it ends in Z or +hh:mm) or
        @1764500000 (epoch seconds). `--begin` is inclusive, `--end`
        exclusive. Gaps between concatenated recordings are not waited for.
        Bad input lines are skipped and counted on standard error
        (`--strict`: exit 65). Ctrl-C, SIGTERM and a closed pipe end the
        replay normally (exit 0); the first two still write the end trailer.
        """,
    "stats": """
        Time in state: dur_ns summed by the state left; the time from a
        task's last transition to the end of the window counts for the state
        it is in, so a task seen through the whole window sums to the window
        (the headline reports the largest deviation). When the start of a
        task's first state was not seen (dur_ns null), the time before it is
        "unobserved", not guessed. Percentages are of the time observed.

        Latencies: run-queue wait after a wake-up (runnable \u2192 running)
        and after preemption (preempted \u2192 running), on-CPU slice
        (running \u2192 anything), blocked time per sleeping state (sleeping,
        uninterruptible, stopped, ... \u2192 runnable): count, p50, p90, p99
        and max. Percentiles come from log-linear histograms (within 1.6 %;
        exact for one or two samples); max is exact.

        A stream cut to a window (`replay --begin/--end`; a file record
        started anew on SIGHUP) says so in its meta record (window_begin_ts,
        window_end_ts): every duration is clipped to that window, as to an
        interval with `--interval`.

        A recording made with `--state`, `--cpu` or `--min-dur` holds only
        some transitions of each task: stats then shows no time in state (no
        percentage it cannot support), only the counts and latency
        distributions of the transitions kept, and says so. `-p`, `-t` and
        `-c` keep every transition of the tasks they keep: their time in
        state stays. The same filters given to stats (as record takes them)
        are applied as it reads, with the same effect on time in state;
        `--in-state` and `--min-time` select groups instead.

        Sanity: a switch-in of a task already running (running \u2192
        running, as the threads of some VM agents show) is counted apart as
        impossible, not as a switch; a group on a CPU longer than its
        threads and the CPUs allow is flagged; the headline names the task
        of the largest deviation.

        A transition counts under the pid and comm of its own record (a
        thread that execs moves to its new name). `--by` cgroup, unit,
        container, title and ppid group processes by what the recording's
        process and cgroup records (written by record) said of them at that
        point of the stream: a process whose title changes moves to its new
        title; one the stream says nothing of is in "?". By cgroup, unit and
        container a state record that carries its task's own cgroup counts
        under that cgroup, one without (null: the tracepoint path's
        switch-ins and wake-ups; older recordings) under its process's: a
        thread moved to another cgroup has each interval counted under the
        cgroup of the record that ends it (where the task was at that
        transition), and the time after its last record under that
        record's. `--cgroup` keeps records by the same rule. Units and
        containers come from the cgroup path (system.slice/x.service,
        docker-ID.scope, kubepods/.../podUID/ID). When `--top` hides groups,
        a row "(N more)" sums them up and a row "(total)" all the groups
        chosen. Memory grows with the number of tasks and latency buckets,
        not of events.

        Input with loss records, skipped lines or a truncated end (or a run
        cut short by Ctrl-C) is summarised but flagged INCOMPLETE (in json:
        input.complete false, with input.lost_total, input.lost_pct and
        input.skipped_total; with `--interval`, of that interval). Bad lines
        are skipped and reported on standard error; `--strict` makes them
        exit 65. A newer event format exits 65. While its input is a pipe,
        stats ignores the first Ctrl-C (so that record, which gets it too,
        can end the stream) and prints at end of input; a second Ctrl-C
        prints what it has at once.

        Why (`--stacks`, `--wakers`, `--antagonists`, `--by reason`,
        `--format folded`): these read the whole input as records (no
        `--interval`; csv has no columns for them). `--stacks` ranks, per
        group, the kernel stacks of the blocked intervals that ended (the
        stack_id of the wake-up, from `record --stacks`), by total time,
        with count, p50, p99 and max; "[no stack]" for blocked time without
        one, "[blocked at the end]" for tasks still blocked when the window
        ends (so a state's stacks sum to its blocked time). `--format
        folded` writes every stack of the shown groups as
        "GROUP;STATE;root;...;leaf MICROSECONDS" lines. `--wakers`: per
        group, who woke it from a blocked state: a task (comm tid), irq or
        softirq, or [unknown]. `--antagonists`: per group, the run-queue
        time (after a wake-up and after a preemption) and the tasks whose
        on-CPU slices on the CPU it then got fall within it; "[idle or
        unseen]" is the rest (the CPU idle, a task the recording left out;
        in a filtered recording, also the part of a wait before the task
        was moved to the CPU it got).
        Rows per group: `--top N`, else 5. The filters (`-p`, `-c`,
        `--title`, ...) select after attributing: wakers' names and
        antagonists come from the whole input. Shares are of the group's
        total; the rows `--top` leaves out are one "(N more)" row.

        `--format json` writes one JSON object (one a line, one per interval
        with `--interval`); REPORTS in pstate-events(5) lists its fields, and
        those of the report on snapshots. `--format csv` writes one row per
        group (fixed columns: STATE_ns for every state,
        KIND_count/_p50_ns/_p90_ns/_p99_ns/_max_ns); with `--matrix`, one
        row per group and transition instead; with `--interval`, a first
        column "interval" and one header. `--format dot` writes the
        state-transition graph of the groups shown (Graphviz).
        """,
    "heat": """
        `--live` on a terminal redraws in place (alternate screen) and
        leaves the last frame on the screen when it ends; with standard
        output not a terminal it prints one frame after another, separated
        by a blank line. A stream faster than it can draw is sampled (the
        status line says "sampling 1/k").
        """,
    "export": """
        Open a Perfetto trace at https://ui.perfetto.dev with "Open trace
        file": CPU tracks show which thread ran where, each thread has a
        state track (Running, Runnable, Runnable (Preempted), Sleeping,
        Uninterruptible Sleep, Stopped, ...), and wake-ups draw arrows. A
        recording made with task, CPU, state or duration filters, or sampled
        by `--max-rate`, does not hold every switch of a CPU: it is exported
        as one track of state slices per thread instead, and the export says
        so. Loss, sampling and end records appear as instants on a "pstate"
        track.

        `--format chrome` writes trace-event JSON: one slice per state
        interval of each thread (the time stats counts; in its args the
        cgroup of the record that ends it, where that record has one),
        thread and process names as metadata.

        The perfetto format needs the optional extra: `pip install
        'pstate[perfetto]'` (`make setup` installs it).
        """,
}

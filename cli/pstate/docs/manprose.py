"""Man page prose that click has no place for, keyed by command name.

docgen.py takes SYNOPSIS, OPTIONS, DESCRIPTION and EXAMPLES from the click
commands; this module adds the rest. Text is light markup: paragraphs split
by blank lines, `code` in bold, indented blocks shown verbatim, "- " items as
bullets. FIELDS and FILES are lists of (term, description) pairs or
paragraphs. OVERHEAD text may use {names} of
pstate.docs.figures.overhead_figures(), read from bench/results/latest.json.
"""

from __future__ import annotations

from pstate.stream import schema

_TRACEFS_AND_HEADERS = [
    ("/sys/kernel/tracing", "tracefs (or /sys/kernel/debug/tracing): the sched tracepoints, their format "
                            "files (the fields of the classic ones) and the `sched_switch` format, from which "
                            "the kernel's state letters are decoded."),
    ("/lib/modules/RELEASE/build",
     "Kernel headers that bcc compiles the BPF program against (any version's: the programs read kernel "
     "structs only at offsets from the BTF). Looked for in this order: `--kernel-headers` or "
     "PSTATE_KERNEL_HEADERS; the running kernel's build link, a full tree (Fedora, RHEL) or Debian's and "
     "Ubuntu's arch tree, merged with its -common tree under /var/cache/pstate/kernel-headers; the "
     "/usr/src/linux-headers-* and /usr/src/kernels/* trees; the kernel's own /sys/kernel/kheaders.tar.xz "
     "(CONFIG_IKHEADERS), unpacked there. `pstate doctor` compiles a small program against the tree it "
     "finds. Headers are code run as root: a tree is used only if it and every directory above it are "
     "owned by root and writable by no one else, and, before each compile, every file and directory "
     "under its include/ and arch/ too, every link of a chain and every directory on its way checked; "
     "otherwise pstate exits 77."),
]
_PROGRAM_CACHE = ("/var/cache/pstate/programs",
                  "Compiled BPF programs. The first run of a program (per kernel and its BTF, plan (how each "
                  "tracepoint is attached), bcc, settings and pstate version) compiles it with bcc's clang, "
                  "about a second of CPU and 150 MB; later runs load the cached instructions without a "
                  "compiler. Entries must be owned by root and writable by no one else, or they are ignored.")
_BTF = ("/sys/kernel/btf/vmlinux",
        "The running kernel's BTF type information (CONFIG_DEBUG_INFO_BTF). record and snap plan each "
        "tracepoint from it and the tracefs format files, by what the kernel has, never by its version: "
        "tp_btf (a BTF-typed raw tracepoint reading the task itself at offsets from the BTF) where the "
        "kernel's BTF has the tracepoint's prototype and the members the program reads; else, for fork, "
        "exec, exit, the task's free and record's csd_queue_cpu and sched_migrate_task, a raw tracepoint reading "
        "the same offsets; "
        "else the classic tracepoint. What a kernel's tracepoint lacks is served another way and said in "
        "the meta record (probe_notes): before Linux 5.18 sched_switch has no prev_state and the state is "
        "read from the task, as the kernel's own tracepoint read it; sched_process_exit's group_dead is "
        "derived from the process's count of live threads where the tracepoint lacks it. `pstate doctor` "
        "shows the plan and what each tracepoint not on tp_btf lacks; the meta record's probe_paths says "
        "it per tracepoint. A program the kernel refuses as tp_btf is taken another way (unless "
        "`--probes tp_btf`). Classic lifecycle programs run with interrupts on, and while one runs the "
        "kernel skips any other classic tracepoint's program on its CPU: a wake-up an interrupt makes "
        "meanwhile is lost, and the sleep it ends reads as running without a wake-up (rare, more often under "
        "fork churn); the plan takes them as classic ones only where the kernel's BTF does not allow "
        "otherwise. The kernel skips classic programs as well while a bpf(2) map call of any process is "
        "under way on the CPU (a tool that reads BPF maps in a loop makes that frequent); tp_btf programs are "
        "not skipped so. Linux 6.7 and later count the runs skipped: record reports them as loss (reason "
        "skipped, the end record's lost_skipped, a warning on stderr) and snap in its meta record "
        "(skipped) and as pstate_skipped_runs_total. Skipped runs of record's programs that only note "
        "context for other records (csd_queue_cpu's waker, the interrupt marks, sched_migrate_task's move of "
        "a followed task's count) lose no transition and "
        "are counted apart, in the end record's skipped_notes.")
_BPF_FILES = [
    *_TRACEFS_AND_HEADERS,
    _BTF,
    _PROGRAM_CACHE,
    ("/proc/sys/kernel/random/boot_id", "Written to the meta record: timestamps compare only within one boot."),
]

_RECORD_TYPES = [(name, desc) for name, (desc, _fields) in schema.RECORDS.items()]


def _stats_table_fields() -> list:
    from pstate.render import tables
    from pstate.analysis.latency import PERCENTILES

    def names(states):
        return ", ".join(f"{s} ({schema.STATES[s][0]})" for s in states)

    return [
        "The table output (`--format table`) has one row per group in three tables. "
        "Time in state, in percent of the time observed:",
        ("PID, TID or COMM", "The group (`--by`), with the task name."),
        ("OBSERVED", "Time the group was observed: the sum over its tasks."),
        *[(head, f"Time {names(states)}.") for head, states in tables.TABLE_STATE_COLUMNS],
        ("OTHR", "Time in any other state (zombie, dead, new kernel states)."),
        "Transitions:",
        ("TRANS, VOL, INVOL", "State transitions; voluntary switches (the task blocked) and "
                              "involuntary ones (it was preempted)."),
        ("FORK, EXEC, EXIT", "Lifecycle events of the group's tasks."),
        ("NOSTART, UNOBS", "Transitions whose state's start was not seen (dur_ns null), and the "
                           "time before them, left out of the percentages."),
        "Latency, one row per kind of wait:",
        ("WHAT", "runq wake-up (runnable until running), runq preempted (preempted until running), "
                 "on-cpu slice (running until it left), or a blocked state until woken."),
        ("COUNT, " + ", ".join(f"P{p}" for p in PERCENTILES) + ", MAX",
         "Number of such waits, percentiles and the maximum."),
        "`--format json` and `--format csv` hold the same figures; REPORTS in pstate-events(5) lists "
        "the JSON report's fields.",
    ]


_stats_fields = _stats_table_fields()

PAGES: dict[str, dict] = {
    "pstate": {
        "description": """
            pstate is a set of small commands joined by pipes. One command
            observes, the others read what it wrote, from a pipe or a file,
            in the same format:

                sudo pstate record | pstate stats
                sudo pstate record -o rec.jsonl
                pstate replay rec.jsonl --speed 10 | pstate heat --live
                sudo pstate snap --dir /var/lib/pstate
                pstate stats /var/lib/pstate

            `record` writes one JSON object per line: a meta header, then one
            record per state transition (and per fork, exec and exit), loss
            records when events were dropped, and an end trailer with totals.
            Each transition carries the time spent in the state the thread
            left, so summing durations per thread tiles its whole life. The
            format is described in pstate-events(5).

            `snap` keeps per-thread state times in the kernel and writes them
            out as snapshot files at an interval, for long unattended runs
            where a full stream would be too much.

            `stats`, `heat` and `replay` need neither root nor bcc: they read
            streams, recordings and snapshots anywhere. Every command writes
            its results to standard output and its diagnostics to standard
            error, and a closed output pipe ends it quietly.
            """,
        "requirements": """
            `stats`, `heat`, `replay` and `export` need Python 3.9 or later,
            nothing of the kernel and no privilege. `record` and `snap` need
            root (or CAP_BPF and CAP_PERFMON with read access to tracefs),
            bcc (Debian's and Ubuntu's python3-bpfcc), a kernel header tree
            of any version (FILES of pstate-record(1)), tracefs with the sched, task, irq and
            timer tracepoints, and of the kernel's BPF what each finds by
            trying it, never by the kernel's version (distributions backport
            BPF features): `record` the BPF ring buffer (Linux 5.8), the snap
            collector (`snap --start`) BPF links it can pin for the way each
            tracepoint is attached (Linux 5.7 for raw and tp_btf tracepoints,
            5.15 for classic ones). A kernel without one is refused with the
            feature named; `pstate doctor` shows each.

            Each tracepoint is attached the best way the kernel allows
            (/sys/kernel/btf/vmlinux in FILES of pstate-record(1)): the
            kernels pstate is tested on,
            Debian's 5.10, 6.1, 6.1-rt and 6.12 booted under qemu, and this
            project's development kernel, take every tracepoint as tp_btf
            (`make test-kernels`; docs/kernels.md lists what each plans and
            passes). Those guests run the development machine's user space
            (bcc 0.26, Python 3.11): older user spaces are not claimed.
            """,
        "overhead": """
            Only `record` and `snap` run code in the kernel; their pages give
            its cost. The readers run on one CPU each: on {machine}, stats
            digested {stats_events_per_s} events per second, replay
            `--no-wait` wrote {replay_events_per_s}, and heat `--live` kept up
            with a paced {heat_live_events_per_s} without sampling (bench/run.py).
            """,
        "security": """
            record, snap and doctor run as root and load code into the kernel.
            They read code (kernel headers, cached programs) only from files
            and directories owned by root and writable by no one else, every
            directory above them and every link on the way included. Every
            path they write below is walked one directory at a time by
            descriptor (openat with O_NOFOLLOW), and a link or directory
            another user could change is refused (exit 77). Files are created
            0600 whatever the umask (the invoking user's under sudo; the
            Prometheus file of pstate-snap(1) is 0644 for node_exporter's
            user), and pstate deletes only what it can prove it wrote. The
            collector's bpffs pin directory must be root's and writable by no
            one else; a collector is found by the object ids of its manifest
            wherever it is moved. Compressed input is decompressed in bounded
            memory, and names from the system (thread names, titles, cgroup
            paths) are shown with their control characters escaped on a
            terminal and in tables, kept exact in JSON, CSV and folded
            output. Do not make pstate or Python setuid. The source's
            docs/security.md states each rule and the tests that hold it.
            """,
        "files": [
            ("PREFIX/lib/pstate", "The Python environment `make install` creates for pstate; it sees "
                                  "the system's packages, where bcc comes from (python3-bpfcc)."),
            ("PREFIX/share/bash-completion/completions/pstate",
             "Completion for bash; for zsh PREFIX/share/zsh/site-functions/_pstate, for fish "
             "PREFIX/share/fish/vendor_completions.d/pstate.fish. PREFIX is /usr/local unless "
             "`make install PREFIX=...` says otherwise."),
        ],
        "environment": [
            ("PSTATE_KERNEL_HEADERS", "A kernel header tree for bcc (as `--kernel-headers`)."),
            ("PSTATE_NO_CACHE", "When set to 1, record and snap compile their BPF program every "
                                "time instead of loading it from the program cache."),
            ("PSTATE_CACHE_DIR", "Another directory for the program cache (the same ownership "
                                 "rules apply)."),
            ("PSTATE_CACHE_DEBUG", "When set to 1, say on standard error whether the BPF program "
                                   "was compiled or loaded from the cache, and why."),
            ("PSTATE_WAKE_LIST", "When set to off, record takes its wake-ups at sched_waking even where "
                                 "the kernel has the wake list's tracepoint (csd_queue_cpu, Linux 6.5+ with "
                                 "BTF): the path older kernels get, for testing and comparison; it costs a "
                                 "switch storm more. auto (the default) takes them at sched_wakeup there."),
            ("PSTATE_PURE", "When set to 1, use the pure-Python code paths instead of the "
                            "compiled ones (record's encoder, the readers' parsers): the same "
                            "output, slower; for comparison and debugging."),
        ],
        "caveats": """
            pstate sees what the scheduler's tracepoints report. A thread
            that never switches out (a busy poller on a CPU of its own, an
            agent the hypervisor runs) emits no event: record has no
            interval for it and snap counts its time unknown; stats and heat
            name such threads.

            Times are wall time between two transitions. Time stolen by the
            hypervisor and time spent in interrupts while a task runs is in
            its running time; where the kernel's BTF says how the task's own
            clock ran, record's switch-outs and snap's rows carry the
            difference (`steal_irq_ns`): running less it is what
            /proc/TID/schedstat counts.
        """,
        "see_also": ["bpftrace(8)", "perf-sched(1)", "proc(5)", "jq(1)"],
    },
    "record": {
        "description": """
            Time stamps are CLOCK_MONOTONIC nanoseconds; the meta record holds
            the wall-clock time of its own ts, so a reader can convert. A
            thread already running when recording starts has an unknown first
            state: its first transition has from "unknown" or dur_ns null.

            A wake-up is taken as the task is queued to run (sched_wakeup),
            and its waker is the task or interrupt that woke it, on whichever
            CPU: where the kernel queues the wake-up on the target CPU's wake
            list (a task woken onto an idle CPU, say), which then activates it
            from an interrupt or its idle loop, record notes the waker as it
            queues the entry (csd_queue_cpu). The wake-up's cpu is the one it
            was taken on: the target's for such a wake-up, the waker's for
            the others. Kernels before 6.5 have no csd_queue_cpu, and without
            BTF record cannot find the task from the entry: there wake-ups are
            taken at sched_waking, in the waker's context, as the wake-up
            begins, which costs a context-switch storm about 3 % more.

            Events pass from the kernel through a BPF ring buffer that is
            drained in batches. On x86-64 the context switches and wake-ups
            take another way first, cheaper by two helper calls and a lock
            per event: each CPU's programs write them into that CPU's own
            run of slots (what a run cannot hold goes to the ring buffer),
            and record merges the runs and the ring buffer in time
            order (holding back the last 2 ms of each read until the next,
            so that no event still being written can come out of order).
            When the reader cannot keep up, the kernel drops events and
            counts them (reason ringbuf_full);
            record writes the counts as loss records and in the end trailer,
            and warns on standard error.
            `--max-rate` instead keeps one event in N above a given rate.

            `-o FILE` is opened before any BPF program is attached, and as
            snapshots are published, because record runs as root, often in a
            directory others can write: a new FILE is created with
            O_EXCL|O_NOFOLLOW and mode 0600 whatever the umask, and under
            sudo (SUDO_UID set) it belongs to the invoking user, so `pstate
            stats FILE` works without sudo. An existing FILE is replaced only
            if it is a regular file with one link, owned by root or the
            invoking user; a symbolic link is never followed to a regular
            file (exit 77: name the file itself), and is followed to a pipe or
            device (/dev/stdout, /dev/null) only when root or the invoking
            user owns it. Pipes, FIFOs and devices are written as they are and
            never fsync'd; record waits up to 10 s for a reader of a FIFO,
            then exits 73.

            With `-o FILE`, SIGHUP starts the file anew, as logrotate expects
            (rename FILE, then send SIGHUP; copytruncate works too, as FILE is
            written in append mode): the renamed file gets its end trailer
            and reads as a complete recording, and the new FILE begins with a
            meta record whose window_begin_ts (CLOCK_MONOTONIC ns, like ts)
            says where its window starts. SIGHUP with FILE still in place only
            syncs it; on standard output SIGHUP ends the run like SIGTERM. A
            regular output file is fsync'd every 5 seconds, so a crash loses
            seconds of events, not what the page cache held.

            `--flight DURATION -o DIR` is a flight recorder: record keeps the
            most recent DURATION of events in memory as the kernel wrote them
            (binary, not yet JSON), writes nothing, and when a `--trigger`
            condition holds or SIGUSR1 arrives goes on recording for `--after`,
            then writes the window to a new file in DIR named by the trigger's
            time (flight-20261201T110706.352Z.jsonl), published like a
            snapshot (a temp file, fsync, a rename that never replaces), and
            goes on recording. Each file is a complete recording of its window:
            a meta record with window_begin_ts and window_end_ts, a trigger
            record (what fired, on which task, when, and the window the file
            really covers), the events, an end record. `--flight-memory` always
            wins: when the window does not fit, the oldest events go and the
            trigger record says shrunk. A trigger inside a file's `--after`
            extends that file (by one window at most) instead of starting
            another; `--hold-off` ignores triggers for a while after a file,
            and `--max-dumps` ends the writing of files for the run. A
            condition is STATE>=DURATION (a task left STATE after at least
            DURATION: D>=100ms, uninterruptible>=1s), runq>=DURATION (a
            run-queue wait before a switch-in), or [comm=NAME:]STATE (a task,
            or one named NAME, entered STATE: comm=postgres:D); each is
            checked on the binary events, before anything is encoded.
            """,
        "fields": [
            "Output is JSON lines in the format of pstate-events(5). Each line is one of these record types:",
            *_RECORD_TYPES,
            "A state record has these fields besides type and ts:",
            *[(name, f"{desc} ({typ.rstrip('?')}{', may be null' if typ.endswith('?') else ''}).")
              for name, (typ, desc) in schema.RECORDS["state"][1].items()],
        ],
        "overhead": """
            Every context switch and wakeup on the machine runs a short BPF
            program, whether or not its event is kept: filters cut the output,
            not that cost. Measured with bench/run.py on {machine}: a
            context-switch storm pinned to one CPU (perf bench sched pipe),
            with record writing everything to a file from the other CPU, kept
            {record_ratio} of its untraced throughput per CPU second
            ({record_ratio_wall} wall-clock; median of {rounds} interleaved A/B
            pairs; perf sched record kept {perf_ratio} in the same run). The
            kernel side costs about {record_kernel_ns} per context switch.

            Reading events and writing them as JSON costs record about
            {record_user_us} of CPU per event (compiled code builds the
            lines), so it writes up to about {record_max_rate} events a
            second on a free CPU. Above what it can write, the ring buffer
            fills and the kernel drops events; every drop is counted in loss
            records and the end trailer, never silent. In the benchmark it
            kept up without loss at {record_zero_loss} transitions a second,
            the most the benchmark produced. Kernel-side filters
            (`-p`, `--state`, `--min-dur`, ...) cut the rate; `--max-rate`
            samples above a budget and says so in rate records;
            `--buffer-size` absorbs bursts.

            The first run of a program compiles it with bcc (about a second
            of CPU, and more memory than any later run); later runs load it
            from the program cache (see FILES) and see their first event
            after {startup_warm} with a peak of {startup_warm_rss}.
            docs/performance.md has the method and the history of these
            measurements.

            Test with a short `--duration` first on a busy production machine,
            and use `--max-rate` to cap the output rate.
            """,
        "files": _BPF_FILES,
        "caveats": """
            When user space cannot keep up, events are lost, never made up:
            `loss` records say how many and why, the trailer adds them up,
            and `--strict` turns any loss into exit status 3.

            A process's title, executable and cgroup are read from /proc when
            the recording first meets it, again 200 ms later and after an
            exec: a title rewritten after that is not seen, and a process
            gone before it could be read is written as gone.

            Before Linux 5.18 the state a task leaves in is read from the task
            at the switch, not passed by the tracepoint (`probe_notes` in the
            meta record says so); `pstate doctor` shows the path each
            tracepoint takes on this kernel.

            With `-p`, `-t`, `-c`, `--cgroup` or `-- CMD` only the followed
            tasks' transitions are written, with what their why-views need of the
            others: the name of each thread that wakes one (`waker`
            records), and who held a CPU while one waited on it (`slice`
            records: the switch-outs of a CPU while a followed task waits in
            its run queue, counted per CPU and moved with the task when the
            kernel migrates it; `--no-antagonists` leaves them out).
        """,
        "see_also": ["pstate-stats(1)", "pstate-heat(1)", "pstate-replay(1)", "pstate-doctor(1)"],
    },
    "snap": {
        "description": """
            Without `--every` or `--count`, snap collects for one interval
            (5 s), writes one snapshot and exits, which suits cron; with them
            it keeps running and writes one file per interval, so there are
            no gaps between snapshots. The format is described under
            SNAPSHOTS in pstate-events(5); `pstate stats DIR/`, `pstate heat
            DIR/` and `pstate replay DIR/` read the directory.

            Every outcome, success or failure, is also written to
            DIR/.pstate-last.json, so monitoring can alert on a snap that
            stopped working without parsing logs.

            Prometheus: node_exporter's textfile collector reads every *.prom
            file in one directory. Debian's prometheus-node-exporter package
            reads /var/lib/prometheus/node-exporter (its
            `--collector.textfile.directory`; root's, mode 0755), so that is
            the directory for `--format prom`:

                sudo pstate snap --dir /var/lib/prometheus/node-exporter --format prom --every 15s

            Who may read what (SECURITY). Snapshots name processes, their
            titles (command lines), cgroups and systemd units: what /proc and
            /sys/fs/cgroup show every local user, except that where /proc is
            mounted with hidepid other users' processes are hidden, and
            pstate writes what root sees. So what snap writes is readable by
            root only (mode 0600 whatever the umask), or by the group
            `--group` names as well (0640): JSON-lines and CSV snapshots,
            which carry every thread's title, the ledger, the status file and
            the collector's cursor. The one exception is pstate-snap.prom,
            written for a reader that is not root: node_exporter runs as a
            user of its own (prometheus on Debian), so the file is 0644, as
            node_exporter's own instructions assume, or 0640 for `--group`'s
            group. A DIR that a `--format prom` run creates is 0755 (0750,
            owned by that group, with `--group`), so the collector can list
            it; an existing DIR is left as it is, and a run on a terminal or
            with `--verbose` says when the collector could not list it. The
            file holds only the labels `--prom-by` asks for: per unit (the
            default) or per cgroup, names any local user can read under
            /sys/fs/cgroup anyway. Process titles, which may hold secrets
            passed on a command line, are in it only with `--prom-by title`,
            and command names and pids only with comm, pid or thread; where
            /proc hides other users' processes (hidepid), such a file stays
            0600 unless `--group` names who may read it (the run says so on
            a terminal or with `--verbose`), so no one reads in it what /proc
            hides from them.

            What keeps running in the kernel: `pstate snap --start` loads
            snap's BPF programs once and pins them, their BPF links and their
            maps under /sys/fs/bpf/pstate/snap (mounting bpffs at /sys/fs/bpf
            when it is not mounted). They go on counting every context
            switch and wakeup with no pstate process running, in kernel memory
            bounded by `--max-tasks` (`pstate snap --status` and `pstate
            doctor` show how much, since when, the cost per context switch
            and how full the maps are). Each `pstate snap --dir DIR` then
            reads the pinned maps, writes one snapshot at once (totals since
            the collector started; prev_ts in its meta record is the time of
            the previous snapshot in DIR, so the deltas between two are
            exact) and exits. The rows of threads that exited stay in the
            kernel until a snapshot holding them is published in every
            directory that reads the collector. A pin
            directory also holds a manifest map (`meta`) naming every pin
            with its object id and the layout of the maps: a pstate of
            another layout refuses to read them, and `pstate snap --restart`
            replaces the collector. To stop it: `pstate snap --stop`, which
            removes every program, link, map and pin it made (and only
            those); removing the pins by hand (`rm -r /sys/fs/bpf/pstate`)
            or a reboot also ends it.

            Exit bursts: when the kernel's map of final rows (`--max-tasks`
            rows) has no room, because more threads exit between two
            snapshots than it holds or a reader lags behind, a freed
            thread's counters and histograms are folded into the row of its
            group, kept in the kernel per cgroup v2 it exited in and process
            name (in 64 to 4096 groups), instead of being lost. Each snapshot
            adds the groups' growth since the previous one in its directory
            to the `--prom-by` groups (per unit, cgroup or comm exactly; per
            title as "[comm]"; per pid or thread as pid 0), so no Prometheus
            series decreases; JSON-lines snapshots hold a fold row per group
            and `pstate stats DIR/` counts its threads as gone in their
            groups. Every snapshot counts rows folded and rows lost (the map
            of groups full too) in its meta and end records (folded,
            fold_lost, beside gone_full and map_full) and in
            pstate_rows_folded_total and pstate_rows_lost_total; `pstate
            snap --status` and `pstate doctor` show them too. Without a
            collector, a snap run folds the same way.

            `make install` installs systemd units for this, not enabled:
            pstate-collector.service (--start, and --stop when stopped) and
            pstate-snap.timer, which runs pstate-snap.service (one snapshot
            into /var/lib/pstate, the newest 1440 kept) every minute:
            `systemctl enable --now pstate-collector.service
            pstate-snap.timer`. Without systemd, share/doc/pstate/pstate-snap.cron
            holds the same as crontab lines for /etc/cron.d.
            """,
        "fields": [
            "Each snapshot file holds a meta record, one task row per thread, and an end record "
            "(pstate-events(5) lists every field). Task rows have:",
            ("pid, tid, comm", "The thread."),
            ("start_ts", "When pstate first saw the thread (CLOCK_MONOTONIC ns); with pid and tid it "
                         "identifies the thread across pid reuse. A thread other than the leader that "
                         "execs takes its process's pid: its row goes on under that tid with its start_ts "
                         "and counters, and the old leader's row ends, reaped, in the same snapshot."),
            ("state, state_since_ts", "The state at the end of the interval, and since when."),
            ("exited, exit_ts", "Whether and when the thread exited; it stays in one more snapshot."),
            ("<state>_ns", "Time spent in each state (running_ns, runnable_ns, preempted_ns, "
                           "sleeping_ns, uninterruptible_ns, ...), always present."),
            ("nvcsw, nivcsw, wakeups", "Voluntary and involuntary context switches, and wake-ups."),
            "With `--format csv` the columns are these fields, with the meta and end records as JSON "
            "in # comment lines (pandas: `read_csv(path, comment="#")`); stats, heat and replay read CSV "
            "snapshots as they read JSON-lines ones. With `--format prom` the file holds Prometheus counters named "
            "pstate_*, per systemd unit by default (`--prom-by`: unit, cgroup, title, comm, pid or thread; "
            "per unit the number of series is bounded by the services, per pid it grows with churn), "
            "and latency histograms per group: pstate_runqueue_wait_seconds (after=wakeup or preemption) "
            "and pstate_blocked_seconds (state=S or D), with fixed le bounds from 2^10 to 2^34 ns. "
            "JSON-lines snapshots hold the same histograms as hist rows after the task rows, and threads "
            "folded in an exit burst as fold rows (pstate_threads_folded_total per group in Prometheus).",
        ],
        "overhead": """
            snap runs the same kind of BPF programs as record on every context
            switch and wakeup but keeps the sums in a kernel map instead of
            sending events, so its cost does not depend on a reader: about
            {snap_ns_per_event} per context switch; the pinned storm of
            pstate-record(1) kept {snap_ratio} of its throughput per CPU
            second on {machine}. Writing a snapshot
            reads the whole task map once per interval. Each thread's row
            holds its latency histograms, 448 of its about 620 bytes; the
            kernel keeps a row for every possible tid (pid_max, when it is
            at most `--max-tasks`, else `--max-tasks` rows), `--max-tasks`
            rows of threads freed since the last snapshot and up to a
            quarter as many groups of folded rows (at most 4096), so
            `--max-tasks` bounds the memory.
            """,
        "files": [
            ("DIR/pstate-snap-YYYYmmddTHHMMSS.ffffffZ-NNNNNN.jsonl",
             "One snapshot: the UTC time of the interval end and a sequence number (.csv with "
             "`--format csv`). Mode 0600, or 0640 with `--group`."),
            ("DIR/pstate-snap.prom", "With `--format prom`: the latest snapshot, replaced each time, "
                                     "for node_exporter's textfile collector. Mode 0644, or 0640 with "
                                     "`--group` (0600 where /proc hides other users' processes and "
                                     "`--prom-by` names processes: see DESCRIPTION)."),
            ("DIR/.pstate-last.json", "Outcome of the latest snapshot: ok, file, seq, tasks, error."),
            ("DIR/.pstate-written", "The names of the snapshots pstate wrote into DIR, one a line, oldest "
                                    "first. `--keep` and `--max-age` delete only files listed here: a "
                                    "file merely named like a snapshot is never deleted, and its "
                                    "sequence number does not count."),
            ("DIR/.pstate.lock", "Held (flock) while a snap writes into DIR; holds its pid."),
            ("DIR/.pstate-*.tmp.*", "A snapshot being written; one an interrupted run left is "
                                    "removed by the next run."),
            *_BPF_FILES,
        ],
        "caveats": """
            Rows are per thread, keyed by tid and start time; a thread
            that lived and died between two snapshots is in the next one,
            unless the map of exited threads was full: then its counters are
            folded into its group's row (its cgroup and command name), and
            `--prom-by` groups still add up.

            Where /proc hides other users' processes (mount option hidepid),
            their titles and cgroups cannot be read: snap warns, and those
            rows carry only what the kernel maps hold.

            A thread the kernel never reports switching out looks as if it
            ran all the time. When an interval's threads ran longer than its
            CPUs allow, those on a CPU through all of it with no switch are
            why: in `--format prom` their time counts as `unknown`, not
            `running`, as `pstate stats DIR/` counts it.
        """,
        "see_also": ["pstate-stats(1)", "pstate-heat(1)", "pstate-record(1)", "cron(8)"],
    },
    "replay": {
        "arguments": {
            "files": "Recordings or streams to replay one after another (`-` or none: standard "
                     "input), or the --dir directory of pstate snap.",
        },
        "fields": ["The output has the format of the input, pstate-events(5): a meta record marked "
                   "\"replayed\": true that keeps the original's fields (so wall-clock times stay "
                   "those of the recording), the events, the original loss records, and a new end "
                   "record. Snapshot directories are replayed as their snapshot files, one after "
                   "another."],
        "overhead": """
            With `--no-wait` replay wrote {replay_events_per_s} events per
            second on one CPU of {machine} (bench/bench_replay.py); at the
            recorded pace it sleeps between events and costs little.
            """,
        "caveats": """
            Replay keeps the original spacing of the records from one clock;
            on a loaded machine a record can be written late, never early.
        """,
        "see_also": ["pstate-record(1)", "pstate-heat(1)", "pstate-stats(1)"],
    },
    "stats": {
        "description": """
            Roles from titles. `--by title` groups processes by their title
            with its volatile part removed (the default normaliser): a
            PostgreSQL backend's client address or `[local]` and what
            follows it (its activity: idle, idle in transaction, UPDATE
            waiting, ...) are dropped, and a number standing alone as a word
            reads N. `--by 'title:REGEX'` names the role itself: the first
            group of REGEX where it matches the title (the whole match when
            REGEX has no group); titles it does not match keep the default.
            For example:

                --by title                            postgres: 15/main: app shop
                --by 'title:postgres: \\S+ (\\S+)'      checkpointer, walwriter, app, ...
                --by 'title:^nginx: (\\w+)'            master, worker, cache
                --by 'title:-jar (\\S+)'               a JVM by its jar
                --by 'title:-Dservice\\.name=(\\S+)'    a JVM by a system property
            """,
        "arguments": {
            "files": "Recordings or streams to read one after another (`-` or none: standard input), "
                     "or snapshot files and directories of pstate snap.",
        },
        "fields": _stats_fields,
        "overhead": """
            stats digested {stats_events_per_s} events per CPU second from a
            file on {machine} (bench/run.py's readers, `-j 1`): compiled code
            parses, checks and sums the plain state records, and any other
            line takes the careful path. `-j` splits a large file over more
            CPUs. Memory grows with the number of tasks, not with the length
            of the input.
            """,
        "caveats": """
            Shares are of the group's total time; a group's figures are the
            sum of its threads'. By cgroup, unit and container, an interval
            belongs to the cgroup its closing record names, so a thread
            moved between cgroups is split between their groups.

            Latency percentiles come from log2 histograms with sub-buckets:
            they are exact to the bucket, not to the nanosecond.
        """,
        "see_also": ["pstate-record(1)", "pstate-snap(1)", "pstate-heat(1)"],
    },
    "heat": {
        "arguments": {
            "inputs": "Recordings or streams to read (`-` or none: standard input), or one snapshot "
                      "directory of pstate snap.",
        },
        "overhead": """
            heat reads its input once; the live dashboard redraws at
            `--refresh` frames a second and, when the stream is faster than it
            can parse, samples the common transitions (the status line says
            so) instead of falling behind. On {machine} it kept up with a
            paced {heat_live_events_per_s} events per second without sampling
            (bench/bench_heat.py).
            """,
        "caveats": """
            `--live` on a stream faster than it can draw keeps only some of
            the records (the status line says `sampling 1/N`): the time
            between two kept records of a thread goes to the state it was
            last seen entering, so a short state can be missed, and latency
            samples count N times.
        """,
        "see_also": ["pstate-record(1)", "pstate-replay(1)", "pstate-stats(1)"],
    },
    "doctor": {
        "description": """
            The live test (the default; `--no-live` skips it) runs
            `pstate record` for about a second on a child process that sleeps,
            and checks that its transitions arrive decoded, with wake-ups.
            Without privileges, checks that need them report PROBLEM instead
            of failing. A check that fails does not stop the others, so one
            run lists everything to fix.
            """,
        "fields": [
            "One row per check; `--format json` writes a JSON array of objects with these keys:",
            ("check", "What was checked: privileges, bcc, tracefs, tracepoints, state decoding, "
                      "kernel headers, and the live test."),
            ("status", "ok, PROBLEM or warning."),
            ("detail", "What was found: versions, paths, the decoded state letters, event counts."),
            ("fix", "For a PROBLEM, the command or setting that fixes it (in the table: a fix: line)."),
        ],
        "overhead": """
            Without the live test doctor only reads files and runs in well
            under a second. The live test compiles and loads the BPF program
            of record and records one child process for about a second (see
            OVERHEAD in pstate-record(1)), plus the time bcc takes to compile
            the program.
            """,
        "files": [
            *_TRACEFS_AND_HEADERS,
            _BTF,
            ("/var/cache/pstate/kernel-headers", "Merged kernel header trees prepared for bcc; must be writable."),
        ],
        "see_also": ["pstate-record(1)", "pstate-snap(1)", "capabilities(7)"],
    },
}

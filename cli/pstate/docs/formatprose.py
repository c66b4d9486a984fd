"""The prose of pstate-events(5), the man page of the event stream and
snapshot formats (light markup as in manprose.py). docgen.py adds the record
types, fields and states from pstate.stream.schema.
"""

from __future__ import annotations

from pstate.stream import compression, schema

# --- pstate-events(5) ----------------------------------------------------------

STATE_CATEGORIES = {
    "cpu": "on a CPU",
    "wait": "runnable, waiting for a CPU",
    "blocked": "waiting for an event",
    "stopped": "stopped by a signal or a tracer",
    "dead": "exiting or gone",
    "unknown": "not seen",
}

EVENTS = {
    "summary": "event stream and snapshot formats of pstate",
    "synopsis": """
{"type":"meta","schema":1,"source":"record",...}
{"type":"state","ts":...,"tid":...,"from":"running","to":"sleeping","dur_ns":...,...}
{"type":"fork",...}  {"type":"exec",...}  {"type":"exit",...}
{"type":"loss","reason":"ringbuf_full","count":...,...}
{"type":"end","reason":"signal","events":...,"lost":...,...}
""",
    "description": f"""
        pstate record, replay and snap write JSON lines: one flat JSON object
        per line, each with a "type". A stream starts with a meta record and
        ends with an end record; loss records appear in-band whenever events
        were dropped, and rate records when `record --max-rate` changes its
        sampling. This page describes version {schema.SCHEMA_VERSION} of the
        format (the schema field of the meta record).

        Readers skip and count lines they cannot parse, report a stream whose
        end record is missing as truncated, and refuse a stream of a newer
        schema. New fields may be added to any record without a new schema
        version: readers must ignore fields they do not know. READING below
        gives the rules every pstate reader applies.

        All ts fields are CLOCK_MONOTONIC nanoseconds, comparable only within
        one boot (the boot_id field of the meta record). The wall-clock time
        of a ts t is wall_ns + (t - ts), with wall_ns and ts from the meta
        record. Durations are integer nanoseconds.
        """,
    "reading": f"""
        stats, heat and replay read a stream with one reader and one set of
        rules; its fast (native) and careful (Python) paths give the same
        results.

        A UTF-8 byte order mark at the start of a file or a stream is dropped.
        A line longer than 1 MiB is skipped and counted. A blank line is
        neither a record nor an error. A line that is not a JSON object with a
        string type, or whose fields break the rules of its record type (ts,
        cpu, pid, tid, dur_ns and count are integers from 0 to 2^63 - 1), is
        skipped and counted under its reason; with `--strict` it ends the run
        with exit code 65. A last line without a newline is read when it is a
        complete record, else reported as a truncated final record. A meta
        record of a schema newer than {schema.SCHEMA_VERSION} ends the run
        with exit code 65.

        Input that is not empty but holds not one valid record (not a pstate
        recording at all) exits with 65 even without `--strict`; empty input
        (no bytes, or blank lines only) exits with 0. NUL bytes at the start
        of a file, as log rotation with copytruncate leaves them, are
        reported as a file cut while being written, and the records after
        them are read. A meta record of the same boot as one read before,
        whose time falls inside that recording (`cat rec rec | pstate
        stats`), is reported: its events would count twice. Paced replay
        waits at most 60 s of recorded time between two records, and says so
        when it shortens a gap.

        Order. The events ({", ".join(schema.EVENT_TYPES)}) carry the CPU
        they happened on; no other record carries one, and no other record
        is checked. Within a recording (from one meta record to the next,
        across files read one after another), an event whose ts is lower
        than that of the event before it on the same CPU is out of order: it
        is read, and counted and reported once; with `--strict` the run
        exits with 65. Equal ts are in order.

        Compressed input. A file or standard input that starts as zstd or
        gzip data is decompressed as it is read, whatever its name, a
        bounded piece at a time: a small file that decompresses to gigabytes
        takes no more memory than any other, and a line longer than 1 MiB in
        it is skipped as in a plain file. Frames (members) one after another
        read as one stream. A zstd frame is decompressed with a window of at
        most {compression.MAX_WINDOW >> 20} MiB, what zstd writes up to
        level 19; a frame that asks for a larger one (`zstd --long`, the
        `--ultra` levels) ends the run with exit code 65 where it begins,
        before a window that large is allocated: decompress it first (`zstd
        -dc --long=31 FILE | pstate stats`). A compressed stream that is cut
        short or corrupt is read up to where it stops decoding and reported
        as a truncated final record.

        Record types. Events are the state and lifecycle records ({", ".join(schema.EVENT_TYPES)}): only they
        count in the end record's events, so that events plus the lost
        counts equal kernel_events. The other types this pstate knows are
        meta, loss, rate and end, the task rows of snapshots, and the
        annotation records {", ".join(schema.ANNOTATION_TYPES)}, which describe what events refer
        to and are no events. A record of a type a reader does not know is
        skipped quietly and counted (stats --format json shows it under
        input.unknown), never reported as a bad line; replay copies it
        unchanged. Adding a record type or a field is not a schema change:
        the schema field grows only when a reader that ignored the addition
        would misread the stream.
        """,
    "records": """
        Fields marked "may be null or absent" are left out or null when they
        do not apply; all others are always present.

        record and snap attach to sched_switch and the wake-ups in one of two
        ways (meta.probe_paths; `--probes`): tp_btf, BTF-typed raw tracepoints
        that read the task itself, or the classic tracepoints. Both write the
        same records, but for two fields only the tp_btf path can always fill:

        The pid (tgid) of a thread first seen as it is switched in or woken
        up, which the tracepoint path reports as 0 until it sees the thread
        switch out, fork or exec (in a snapshot, the task row's pid). Threads
        alive when recording starts are known to both paths from /proc.

        The cgroup of a state record whose task is not the one running: the
        switch_in, the wake-ups (wakeup, wakeup_new) and the reap. The tp_btf
        path reads that task's own cgroup (a reaped task's is the one it
        exited in); the tracepoint path has no task to read and writes null
        (not known). A switch_out carries it on both paths (the task leaving
        the CPU is the one running, whose cgroup the kernel gives). It is the cgroup the task is in at
        that transition: a thread moved to another cgroup (cgroup.threads,
        or its process by cgroup.procs) carries the new id from its first
        transition after the move, while the process record says where the
        process was when pstate read /proc. Each id is named by a cgroup
        record before the first record that carries it (a --flight file has
        no cgroup records).

        Names come from the system as bytes, which need be neither UTF-8
        nor printable: comm, process titles (title), executables (exe),
        cgroup paths (path, cgroup_path) and kernel symbols (frames,
        reason). Every writer gets them through one rule. A name that is
        only shown (comm, title, exe, kernel symbols) is UTF-8 with U+FFFD
        in place of each sequence that is not. A cgroup path, which
        `--cgroup` matches and pstate opens again, is lossless: each byte of
        a sequence that is not UTF-8 is written `\\xNN` (two lowercase hex
        digits, 80 to ff), and a backslash that would read as such an escape
        (one followed by x5c, or by x and two hex digits from 80 to ff) as
        `\\x5c`; nothing else changes, so systemd's
        system-systemd\\x2dfsck.slice stays as it is. `--cgroup` takes a path
        in that form, or with its bytes as they are. Units and containers
        are read from these paths and keep their escapes. Control characters
        are kept (JSON escapes them): JSON, CSV and folded output carry a
        name's exact text, while tables, heat maps and doctor show each
        control character escaped (`\\x1b`, `\\u202e`).
        """,
    "states": """
        The to and from fields of state records, and the state field of
        snapshot task rows, hold these names. Each is given with the kernel's
        letter (as in ps(1) and /proc/PID/stat) and its category. Per thread,
        the dur_ns of consecutive transitions add up to the time watched.
        """,
    "older_letters": "A letter the running kernel reports and this table lacks is named "
                     "\"state_<letter>\", e.g. `state_W`; older kernels also report {letters}.",
    "causes": """
        The cause field of a state record names the kernel event behind it:
        """,
    "snapshots": """
        pstate snap writes one file per interval into its output directory,
        named pstate-snap-<UTC YYYYmmddTHHMMSS.ffffffZ>-<seq, 6 digits>.jsonl
        (.csv with `--format csv`), so that names sort by time. Dot-files and
        other names in the directory are not snapshots. A file is written
        under a dot-file name and renamed when complete.

        A snapshot is JSON lines too: a meta record, then one task row per
        thread, then an end record. In "cumulative" mode the counters of a
        task row count from the start of the snap run (or from the thread's
        start, if later); in "delta" mode they cover only the interval of the
        snapshot.
        """,
    "snapshot_meta": [
        "Besides the meta fields above (source is snap):",
        ("ts", "End of the interval, CLOCK_MONOTONIC ns; wall_ns is the wall-clock time at ts."),
        ("interval_start_ts, interval_end_ts", "The interval the snapshot covers, CLOCK_MONOTONIC ns: "
                                               "from the start of the run (cumulative) or of the "
                                               "interval (delta)."),
        ("wall_start_ns, wall_end_ns", "The same interval in wall-clock ns since the epoch (UTC)."),
        ("seq", "Sequence number of the snapshot, as in the file name."),
        ("mode", "cumulative or delta (`snap --clear`): what the counters of task rows count."),
        ("run_id, run_start_ts", "Identity and start of the snap run; counters of two snapshots "
                                 "subtract only within one run."),
        ("interval_ns, format, max_tasks", "The settings of the run (interval_ns is 0 for a snapshot of the "
                                           "collector)."),
        ("collector_id, prev_ts", "A snapshot of the collector (`snap --start`): its identity (also the "
                                  "run_id), and the ts of the previous snapshot of it in the directory "
                                  "(null for the first)."),
        ("truncated", "true when not every thread fit in the kernel's maps (see map_full)."),
        ("map_full", "Rows missing since the run began: a thread the task map had no room for, or a final "
                     "row lost (fold_lost)."),
        ("gone_full", "Final rows of freed threads the kernel's map of them had no room for since the run "
                      "began: each was folded or lost."),
        ("folded", "Of those, rows folded into their group's fold row."),
        ("fold_lost", "Of those, rows lost: the map of groups was full too."),
        ("skipped", "Runs of pstate's programs the kernel skipped since they were loaded, each a transition "
                    "or wake-up the counters lack: on the classic tracepoint path the kernel runs no "
                    "tracepoint program on a CPU while another BPF program, or a bpf(2) map call of any "
                    "process, is under way there (the tp_btf path is not skipped so). Linux 6.7 and later "
                    "count them; 0 before."),
    ],
    # One description per field of snapdir.ROW_FIELDS; the <state>_ns
    # fields share one.
    "snapshot_task": {
        "type": "always task",
        "ts": "End of the interval (as in the meta record).",
        "pid": "Process id (tgid) of the thread.",
        "tid": "Thread id.",
        "comm": "Thread name (comm).",
        "start_ts": "When pstate first saw the thread (CLOCK_MONOTONIC ns): its fork, or the start "
                    "time in /proc at clock-tick resolution. With pid and tid it identifies the "
                    "thread even when its ids are reused.",
        "state": "State at the end of the interval.",
        "state_since_ts": "Since when it was in that state; null when not seen.",
        "exited": "true once the thread exited; it then stays in one more snapshot.",
        "exit_ts": "When it exited, or null.",
        "<state>_ns": "Time spent in each state, ns: {fields}. Always present, as integers; a "
                      "kernel that reports more states adds more such fields.",
        "steal_irq_ns": "Of running_ns, the time the kernel did not count as the thread's own on-CPU "
                        "time: stolen by the hypervisor or spent in interrupts, where the kernel accounts "
                        "them apart. running_ns - steal_irq_ns is what /proc/TID/schedstat counts (the "
                        "running slice still open at the snapshot is wall time until it ends; a slice the "
                        "kernel counted longer than its wall time, as after a wake-up preempted the task "
                        "before it, is made up from the thread's later slices first, since a counter never "
                        "shrinks). 0 when the meta record's on_cpu_time is wall.",
        "nvcsw": "Voluntary context switches (the thread blocked).",
        "nivcsw": "Involuntary context switches (the thread was preempted).",
        "wakeups": "Times the thread was woken.",
        "title": "Its process's title (/proc/PID/cmdline as ps shows it); null for a kernel thread "
                 "or when it was never read.",
        "cgroup": "The id of its process's cgroup v2, as in the cgroup records of a recording; for a "
                  "thread that exited, the cgroup it exited in (the kernel's, exact even when /proc has "
                  "nothing left of it); null when not known.",
        "cgroup_path": "That cgroup's path below the v2 mount, e.g. /system.slice/nginx.service.",
        "ppid": "Its process's parent (pid), as /proc said at the snapshot; null when not known "
                "(stats DIR/ --by ppid groups by it).",
    },
    "snapshot_hist": """
        After the task rows, a JSON-lines snapshot has one hist row per
        group and kind of wait with a count: latency histograms the kernel
        keeps per thread in fixed log2 buckets, summed per group of `snap
        --prom-by` (per systemd unit by default) like the Prometheus series.
        Cumulative rows count since the run began and never decrease, even
        as threads exit; `--clear` rows cover their interval. The buckets
        are the same on every host: durations of at most 2^10 ns (1.024 us),
        2^11, ... 2^34 ns (17.2 s), then the rest. `pstate stats DIR/` shows
        their p50 and p99 per interval. CSV snapshots have no hist rows.
        """,
    "snapshot_fold": """
        After the task rows, a JSON-lines snapshot has one fold row per
        group of folded threads: threads freed when the kernel's map of
        final rows had no room (an exit burst larger than `--max-tasks`),
        whose counters the kernel added up per cgroup v2 they exited in and
        process name. Cumulative rows count since the directory's first
        snapshot of the run or collector and never decrease; `--clear` rows
        cover their interval. A thread that a task row of the directory
        showed alive before it was folded counts in the fold row only with
        what that row had not counted.
        """,
    "snapshot_end": [
        ("ts", "End of the interval."),
        ("tasks", "Number of task rows in the file."),
        ("hists", "Number of hist rows in the file (JSON lines)."),
        ("folds", "Number of fold rows in the file (JSON lines)."),
        ("folded, fold_lost", "As in the meta record."),
        ("reason", "Why the snapshot was written: interval."),
    ],
    "reports": """
        Besides the stream, the readers write reports: JSON objects of a
        shape of their own, with a "type" of their own, declared in
        pstate.stream.reports. A field is named by its path: a.b is key b of
        object a, a[].b key b of each object of list a; an upper-case part
        stands for several keys: STATE, KIND and REASON for each key of that
        kind, FIELD and LABEL for the keys its description lists. A field
        may be added in a later pstate; the stats report's schema number
        grows when one is renamed or changes its meaning. `pstate replay`
        writes the stream format itself, its meta record marked replayed.
        """,
    "examples": """
        A thread that sleeps, is woken, waits for a CPU, then runs:

            {"type":"state","ts":123456789,"cpu":1,"pid":4242,"tid":4243,"comm":"worker","from":"running","to":"sleeping","dur_ns":2500000,"cause":"switch_out","voluntary":true,"kstate":"S","prio":120,"next_tid":0}
            {"type":"state","ts":173456789,"cpu":1,"pid":4242,"tid":4243,"comm":"worker","from":"sleeping","to":"runnable","dur_ns":50000000,"cause":"wakeup","waker_tid":17,"waker_pid":17}
            {"type":"state","ts":173468789,"cpu":1,"pid":4242,"tid":4243,"comm":"worker","from":"runnable","to":"running","dur_ns":12000,"cause":"switch_in","prio":120,"prev_tid":0}

        Uninterruptible sleeps longer than 10 ms, with jq:

            jq -c 'select(.type=="state" and .from=="uninterruptible" and .dur_ns>10000000)' rec.jsonl

        Total running time per thread of the latest snapshot:

            jq -r 'select(.type=="task") | "\\(.tid) \\(.comm) \\(.running_ns)"' "$(ls /var/lib/pstate/pstate-snap-*.jsonl | tail -n 1)"
        """,
    "see_also": ["pstate-record(1)", "pstate-snap(1)", "pstate-stats(1)", "jq(1)", "proc(5)"],
}

"""The peers comparison (tests/kernels/peers.py) on canned output of BCC's
offcputime -f and runqlat (-P, -p) and of pstate stats: no root, no guest."""

from __future__ import annotations

import json

import peers

# offcputime-bpfcc -K --state 2 -f -p PID, as bcc 0.26 prints it on Linux 6.1:
# comm, the kernel stack from the root, microseconds off CPU
OFFCPUTIME = """\
python3;entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_read;ksys_read;vfs_read;ext4_file_read_iter;\
filemap_read;filemap_get_pages;folio_wait_bit_common;io_schedule;schedule;__schedule;finish_task_switch.isra.0 150
python3;entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_pwrite64;ksys_pwrite64;vfs_write;ext4_file_write_iter;\
ext4_dio_write_iter;iomap_dio_rw;__iomap_dio_rw;io_schedule;schedule;__schedule;finish_task_switch.isra.0 8000
python3;entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_pwrite64;ksys_pwrite64;vfs_write;ext4_file_write_iter;\
ext4_dio_write_iter;iomap_dio_rw;__iomap_dio_rw;schedule;__schedule;finish_task_switch.isra.0 1850
WARNING: 1 stack traces could not be displayed.
"""

# pstate stats --stacks D -f json --by all -p PID: frames from the root with
# offsets, taken in __schedule as the task leaves
PSTATE_STACKS = {"groups": [{"key": "all", "stacks": [
    {"state": "uninterruptible", "reason": "__iomap_dio_rw", "count": 180, "total_ns": 7_200_000,
     "frames": "entry_SYSCALL_64_after_hwframe+0x6e;do_syscall_64+0x5b;__x64_sys_pwrite64+0x93;ksys_pwrite64+0x78;"
               "vfs_write+0x10f;ext4_file_write_iter+0x3f;ext4_dio_write_iter+0x2c5;iomap_dio_rw+0xe;"
               "__iomap_dio_rw+0x5be;io_schedule+0x42;schedule+0x5a;__schedule+0x3a1"},
    {"state": "uninterruptible", "reason": "__iomap_dio_rw", "count": 20, "total_ns": 1_700_000,
     "frames": "entry_SYSCALL_64_after_hwframe+0x6e;do_syscall_64+0x5b;__x64_sys_pwrite64+0x93;ksys_pwrite64+0x78;"
               "vfs_write+0x10f;ext4_file_write_iter+0x3f;ext4_dio_write_iter+0x2c5;iomap_dio_rw+0xe;"
               "__iomap_dio_rw+0x5a0;schedule+0x5a;__schedule+0x3a1"},
    {"state": "uninterruptible", "reason": "filemap_fault", "count": 1, "total_ns": 100_000,
     "frames": "asm_exc_page_fault+0x22;exc_page_fault+0x176;handle_mm_fault+0xd3;__handle_mm_fault+0x84a;"
               "do_fault+0x4aa;__do_fault+0x34;filemap_fault+0x783;folio_wait_bit_common+0x167;io_schedule+0x3f;"
               "schedule+0x23;__schedule+0x628"},
    {"state": "sleeping", "reason": "do_nanosleep", "count": 3, "total_ns": 9_000_000,
     "frames": "entry_SYSCALL_64_after_hwframe+0x6e;do_nanosleep+0x4c;schedule+0x5a;__schedule+0x3a1"},
]}]}

# runqlat-bpfcc -P, as bcc 0.26 prints it at Ctrl-C: one section per process
RUNQLAT = """\
Tracing run queue latency... Hit Ctrl-C to end.
^C

pid = 0
     usecs               : count     distribution
         0 -> 1          : 3        |****************************************|

pid = 4242
     usecs               : count     distribution
         0 -> 1          : 2        |*                                       |
         2 -> 3          : 10       |*****                                   |
         4 -> 7          : 0        |                                        |
         8 -> 15         : 0        |                                        |
        16 -> 31         : 0        |                                        |
        32 -> 63         : 5        |**                                      |
        64 -> 127        : 80       |****************************************|

pid = 4243
     usecs               : count     distribution
        32 -> 63         : 7        |**                                      |
        64 -> 127        : 90       |****************************************|
       128 -> 255        : 1        |                                        |
"""

RUNQLAT_PLAIN = """\
Tracing run queue latency... Hit Ctrl-C to end.

     usecs               : count     distribution
         0 -> 1          : 1        |**********                              |
         2 -> 3          : 4        |****************************************|
"""

# pstate stats --by all --hist -f json -p 4242 -p 4243
PSTATE_HIST = {"groups": [{"key": "all", "latency": {
    "runq_wakeup": {"count": 2, "hist_unit": "usecs", "hist": [[2, 3, 2]]},
    "runq_preempted": {"count": 192, "hist_unit": "usecs",
                       "hist": [[0, 1, 2], [2, 3, 8], [32, 63, 12], [64, 127, 169], [128, 255, 1]]},
    "oncpu": {"count": 194, "hist_unit": "usecs", "hist": [[1024, 2047, 194]]},
}}]}


def test_folded_lines_and_only_them():
    rows = peers.parse_folded(OFFCPUTIME)
    assert [(c, len(f), v) for c, f, v in rows] == [("python3", 13, 150), ("python3", 13, 8000),
                                                    ("python3", 12, 1850)]
    assert rows[0][1][0] == "entry_SYSCALL_64_after_hwframe" and rows[0][1][-1] == "finish_task_switch.isra.0"


def test_a_stack_is_keyed_by_its_path_down_to_its_reason_whichever_tool_took_it():
    bcc = peers.parse_folded(OFFCPUTIME)[1][1]
    ps = PSTATE_STACKS["groups"][0]["stacks"][0]["frames"].split(";")
    assert peers.stack_key(bcc) == peers.stack_key(ps)
    reason, path = peers.stack_key(bcc)
    assert reason == "__iomap_dio_rw"
    assert path.endswith("iomap_dio_rw;__iomap_dio_rw") and path.startswith("entry_SYSCALL_64_after_hwframe;")
    # the io_schedule and plain schedule variants are one path
    assert peers.stack_key(peers.parse_folded(OFFCPUTIME)[2][1]) == (reason, path)
    assert peers.stack_key(["finish_task_switch"]) == ("unknown", "")


def test_the_stacks_side_by_side():
    c = peers.compare_stacks(peers.offcputime_rows(OFFCPUTIME), peers.pstate_rows(PSTATE_STACKS))
    assert c["offcputime_total_us"] == 10_000
    assert c["pstate_total_us"] == 9_000  # D only: the S stack is not counted
    assert c["top_agrees"]
    top = c["stacks"][0]
    assert top["reason"] == "__iomap_dio_rw"
    assert (top["offcputime_us"], top["offcputime_share"]) == (9850, 0.985)
    assert (top["pstate_us"], top["pstate_share"]) == (8900, 0.9889)
    rest = {s["reason"]: s for s in c["stacks"][1:]}
    assert rest["filemap_get_pages"]["pstate_share"] == 0.0 and rest["filemap_get_pages"]["offcputime_us"] == 150
    assert rest["filemap_fault"]["offcputime_share"] == 0.0
    assert c["reasons"]["offcputime"] == {"__iomap_dio_rw": 0.985, "filemap_get_pages": 0.015}
    assert list(c["reasons"]["pstate"]) == ["__iomap_dio_rw", "filemap_fault"]
    json.dumps(c)


def test_the_top_differs_when_the_tools_do():
    bcc = [("a", "x;a", 10.0), ("b", "x;b", 5.0)]
    ps = [("a", "x;a", 1.0), ("b", "x;b", 5.0)]
    c = peers.compare_stacks(bcc, ps)
    assert not c["top_agrees"] and {s["reason"] for s in c["stacks"]} == {"a", "b"}
    assert not peers.compare_stacks([], ps)["top_agrees"]


def test_runqlat_sections_and_a_plain_histogram():
    s = peers.parse_log2_hist(RUNQLAT)
    assert set(s) == {0, 4242, 4243}
    assert s[4242]["unit"] == "usecs"
    assert s[4242]["hist"][0] == [0, 1, 2] and s[4242]["hist"][-1] == [64, 127, 80]
    assert s[4243]["hist"] == [[32, 63, 7], [64, 127, 90], [128, 255, 1]]
    plain = peers.parse_log2_hist(RUNQLAT_PLAIN)
    assert plain == {None: {"unit": "usecs", "hist": [[0, 1, 1], [2, 3, 4]]}}


def test_the_histograms_side_by_side():
    s = peers.parse_log2_hist(RUNQLAT)
    bcc = peers.merge_hists([s[4242]["hist"], s[4243]["hist"]])
    ps = peers.pstate_runq_hist(PSTATE_HIST)  # after a wake-up plus after a preemption, not on-CPU
    assert ps == [[0, 1, 2], [2, 3, 10], [32, 63, 12], [64, 127, 169], [128, 255, 1]]
    h = peers.compare_hists(bcc, ps)
    assert h["counts"] == [195, 194]
    assert h["modes"] == [[64, 127], [64, 127]]
    # every bucket between the first and the last, as runqlat prints them
    assert [r[:2] for r in h["buckets"]] == [[0, 1], [2, 3], [4, 7], [8, 15], [16, 31], [32, 63], [64, 127],
                                             [128, 255]]
    assert h["buckets"][3] == [8, 15, 0, 0] and h["buckets"][5] == [32, 63, 12, 12]
    assert 0 < h["shape_distance"] < 0.01
    assert peers.compare_hists(bcc, bcc)["shape_distance"] == 0
    assert peers.compare_hists([[0, 1, 5]], [[2, 3, 5]])["shape_distance"] == 1
    assert peers.compare_hists([], ps)["shape_distance"] is None


def test_the_summary_and_its_files(tmp_path):
    s = peers.parse_log2_hist(RUNQLAT)
    doc = {"kernel": "6.1.0-57-amd64", "accel": "tcg",
           "tools": {"offcputime": "/usr/sbin/offcputime-bpfcc", "runqlat": "/usr/sbin/runqlat-bpfcc",
                     "bcc_version": "0.26.0+ds-1", "bcc_headers": "BCC's own lookup"},
           "offcpu": {"writer": {"writes": 400, "nvcsw": 200}, "offcputime_cmd": "offcputime-bpfcc -K --state 2 -f -p PID",
                      "pstate_d_count": 201, "pstate_runq_after_wakeup_us": 800,
                      "compare": peers.compare_stacks(peers.offcputime_rows(OFFCPUTIME),
                                                      peers.pstate_rows(PSTATE_STACKS))},
           "runq": {"hogs": [{}, {}], "cpu": 1, "seconds": 3, "truth_waits": 190, "runqlat_cmd": "runqlat-bpfcc -P",
                    "compare": peers.compare_hists(peers.merge_hists([s[4242]["hist"], s[4243]["hist"]]),
                                                   peers.pstate_runq_hist(PSTATE_HIST))}}
    run = tmp_path / "run" / "deb61"
    run.mkdir(parents=True)
    (run / "peers.json").write_text(json.dumps(doc))
    written = peers.publish(str(run), results=str(tmp_path / "results"))
    assert [p.rsplit("/", 1)[1] for p in written] == ["peers_deb61.json", "peers_deb61.md"]
    assert json.loads((tmp_path / "results" / "peers_deb61.json").read_text()) == doc
    md = (tmp_path / "results" / "peers_deb61.md").read_text()
    assert "| __iomap_dio_rw |" in md and "98.5%" in md and "98.9%" in md
    assert "| 64 -> 127 | 170 | 169 |" in md
    assert "runqlat 195, pstate 194" in md
    # a part that failed says why, and the rest is still summed up
    doc["offcpu"] = {"error": "offcputime-bpfcc: exited 1 before it attached: no kprobes"}
    assert "no kprobes" in peers.markdown(doc) and "| 64 -> 127 |" in peers.markdown(doc)


def test_peers_runs_only_when_named():
    import guest_checks
    import matrix

    assert "peers" in guest_checks.STEPS and "peers" not in matrix.select_steps("")
    assert matrix.select_steps("") == [s for s in guest_checks.STEPS if s != "peers"]
    assert matrix.select_steps("peers") == ["peers"]
    assert matrix.select_steps("record peers-runqlat") == ["record", "peers"]
    assert "peers" not in guest_checks.DEFAULT_STEPS


def test_durations_in_runqlat_rows():
    # 0 and 1 us share runqlat's first row; 999 ns is 0 us
    ns = [0, 999, 1_000, 1_999, 2_000, 3_999, 4_000, 1_000_000, 1_048_575_999]
    assert peers.log2_hist_us(ns) == [[0, 1, 4], [2, 3, 2], [4, 7, 1], [512, 1023, 1], [524288, 1048575, 1]]


# offcputime on Linux 6.1: BCC's ksym names io_schedule, the first function
# of .sched.text, by the section bound kallsyms lists at its address
OFFCPUTIME_61 = """\
python;entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_exit_group;do_group_exit;do_exit;task_work_run;\
__fput;v9fs_dir_release;p9_client_clunk;p9_client_rpc;schedule;__schedule;finish_task_switch.isra.0 22631
python;entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_pwrite64;vfs_write;ext4_file_write_iter;iomap_dio_rw;\
__iomap_dio_rw;__sched_text_start;schedule_timeout;schedule;__schedule;finish_task_switch.isra.0 1083353
"""


def test_a_section_bound_is_not_a_reason():
    rows = peers.offcputime_rows(OFFCPUTIME_61)
    assert rows[1][:2] == ("__iomap_dio_rw", "entry_SYSCALL_64_after_hwframe;do_syscall_64;__x64_sys_pwrite64;"
                                             "vfs_write;ext4_file_write_iter;iomap_dio_rw;__iomap_dio_rw")
    assert rows[0][0] == "p9_client_rpc"
    assert peers.section_bounds(OFFCPUTIME_61) == ["__sched_text_start"]
    assert peers.section_bounds(OFFCPUTIME) == []


def test_d_until_back_on_cpu_from_a_recording():
    frames = PSTATE_STACKS["groups"][0]["stacks"][0]["frames"]
    recs = [
        {"type": "stack", "stack_id": 4, "frames": frames},
        {"type": "state", "tid": 7, "from": "running", "to": "uninterruptible", "dur_ns": 500, "cause": "switch_out"},
        {"type": "state", "tid": 7, "from": "uninterruptible", "to": "runnable", "dur_ns": 3_000_000, "stack_id": 4},
        {"type": "state", "tid": 8, "from": "runnable", "to": "running", "dur_ns": 99_000_000},  # another thread
        {"type": "state", "tid": 7, "from": "runnable", "to": "running", "dur_ns": 200_000},
        {"type": "state", "tid": 7, "from": "running", "to": "uninterruptible", "dur_ns": 500},
        {"type": "state", "tid": 7, "from": "uninterruptible", "to": "runnable", "dur_ns": 1_000_000, "stack_id": 4},
        {"type": "state", "tid": 7, "from": "runnable", "to": "running", "dur_ns": None},  # its end not seen
        {"type": "state", "tid": 7, "from": "preempted", "to": "running", "dur_ns": 5_000_000},  # no D before it
    ]
    rows = peers.pstate_offcpu_rows(recs, 7)
    assert [(r, round(us)) for r, _, us in rows] == [("__iomap_dio_rw", 3200), ("__iomap_dio_rw", 1000)]

"""pstate.kernel.switchcounts: the kernel's per-thread switch counts, and
the threads whose switches no traced switch-out shows (doctor)."""

from __future__ import annotations

import os
import threading
import time

from pstate.kernel import switchcounts

STATUS = """Name:\tworker one
Umask:\t0022
State:\tS (sleeping)
Tgid:\t42
voluntary_ctxt_switches:\t150
nonvoluntary_ctxt_switches:\t545
"""


def test_a_status_file_gives_the_name_and_both_counts():
    assert switchcounts.parse_status(STATUS) == ("worker one", 695)
    assert switchcounts.parse_status("Name:\tx\nvoluntary_ctxt_switches:\t3\n") is None
    assert switchcounts.parse_status("Name:\tx\nvoluntary_ctxt_switches:\tmany\nnonvoluntary_ctxt_switches:\t1\n") \
        is None


def test_a_fake_proc_is_read_thread_by_thread(tmp_path):
    for pid, tid, n in ((10, 10, 1), (10, 11, 5), (20, 20, 7)):
        d = tmp_path / str(pid) / "task" / str(tid)
        d.mkdir(parents=True)
        (d / "status").write_text(f"Name:\tt{tid}\nvoluntary_ctxt_switches:\t{n}\nnonvoluntary_ctxt_switches:\t1\n")
    (tmp_path / "self").mkdir()  # not a pid
    (tmp_path / "30" / "task").mkdir(parents=True)  # a process gone between the two listings
    assert switchcounts.read(str(tmp_path)) == {10: ("t10", 2), 11: ("t11", 6), 20: ("t20", 8)}
    assert switchcounts.read(str(tmp_path / "nowhere")) == {}


def test_a_name_that_is_not_utf8_is_read_as_the_one_rule_decodes_it(tmp_path):
    d = tmp_path / "10" / "task" / "10"
    d.mkdir(parents=True)
    (d / "status").write_bytes(b"Name:\tbad\xff\x1b[2Jname\nvoluntary_ctxt_switches:\t3\nnonvoluntary_ctxt_switches:\t1\n")
    assert switchcounts.read(str(tmp_path)) == {10: ("bad\ufffd\x1b[2Jname", 4)}


def test_this_process_switches_are_counted():
    tid = threading.get_native_id()
    first = switchcounts.read()[tid][1]
    for _ in range(5):
        time.sleep(0.001)
    assert switchcounts.read()[tid][1] >= first + 5
    assert os.getpid() in switchcounts.read()


def test_busiest_most_first_within_the_limit():
    first = {1: ("a", 10), 2: ("b", 10), 3: ("c", 10), 4: ("d", 10)}
    second = {1: ("a", 11), 2: ("b", 30), 3: ("c", 20), 4: ("d", 10), 5: ("new", 99)}
    assert switchcounts.busiest(first, second, 1, 10) == [2, 3, 1]
    assert switchcounts.busiest(first, second, 1, 2) == [2, 3]
    assert switchcounts.busiest(first, second, 11, 10) == [2]
    assert switchcounts.busiest(first, second, 1, 10, exclude={2}) == [3, 1]


def test_unseen_are_the_threads_that_switched_with_no_switch_out_traced():
    before = {1: ("agent", 100), 2: ("traced", 100), 3: ("quiet", 100), 4: ("gone", 100), 7: ("reused", 900)}
    after = {1: ("agent", 104), 2: ("traced", 140), 3: ("quiet", 102), 5: ("born", 50), 7: ("reused", 3)}
    every = [1, 2, 3, 4, 5, 7]
    assert switchcounts.unseen(before, after, {2: 40}, 3, every) == [(1, "agent", 4)]
    assert switchcounts.unseen(before, after, {2: 40, 1: 1}, 3, every) == []
    assert switchcounts.unseen(before, after, {}, 3, every) == [(2, "traced", 40), (1, "agent", 4)]
    assert switchcounts.unseen(before, after, {}, 3, [2]) == [(2, "traced", 40)]  # only the threads recorded

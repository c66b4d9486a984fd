"""pstate stats over event streams: numbers, renderers (golden files), filters,
bad input, the fast path against the reference path, --interval, Ctrl-C.

Regenerate the fixtures: python tests/data/stats/stats_fixtures.py
Regenerate the goldens:  PSTATE_REGEN=1 pytest tests/contract/test_stats.py
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from conftest import TESTS, clean_env, pstate_cmd, wait_delivered, wait_reading_pipe, wait_ready
from pstate.stream import reader, streamio
from pstate.analysis import timeinstate
from pstate.analysis import ingest
from pstate.exitcodes import PstateError
from pstate.main import cli

HERE = TESTS
DATA = HERE / "data" / "stats"
GOLDEN = HERE / "golden" / "stats"
BASIC = "basic.jsonl"  # relative to DATA, where every test runs
LOSSY = "lossy.jsonl"
REGEN = os.environ.get("PSTATE_REGEN") == "1"
MS = 1_000_000


@pytest.fixture(autouse=True)
def in_data_dir(monkeypatch):
    monkeypatch.chdir(DATA)


def run(*args, input=None):
    return CliRunner().invoke(cli, ["stats", *args], input=input, catch_exceptions=False)


def report(*args, input=None) -> dict:
    res = run(*args, "-f", "json", input=input)
    assert res.exit_code == 0, res.stderr
    return orjson.loads(res.stdout)


def by_key(rep: dict) -> dict:
    return {g["key"]: g for g in rep["groups"]}


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


# --- golden files -------------------------------------------------------------

GOLDENS = [
    ("basic.txt", [BASIC]),
    ("basic-tid.txt", [BASIC, "--by", "tid"]),
    ("basic-comm.txt", [BASIC, "--by", "comm"]),
    ("basic-hist-matrix.txt", [BASIC, "--hist", "--matrix", "--top", "2"]),
    ("basic-stopped.txt", [BASIC, "--in-state", "T"]),
    ("basic.json", [BASIC, "-f", "json"]),
    ("basic-hist-matrix.json", [BASIC, "-f", "json", "--hist", "--matrix", "--by", "tid", "--top", "1"]),
    ("basic.csv", [BASIC, "-f", "csv"]),
    ("basic-tid.csv", [BASIC, "-f", "csv", "--by", "tid"]),
    ("basic-matrix.csv", [BASIC, "-f", "csv", "--matrix"]),
    ("basic.dot", [BASIC, "-f", "dot"]),
    ("basic-pid100.dot", [BASIC, "-f", "dot", "--sort", "key", "--top", "1"]),
    ("lossy.txt", [LOSSY]),
    ("lossy.json", [LOSSY, "-f", "json"]),
]


@pytest.mark.parametrize("name,args", GOLDENS, ids=[g[0] for g in GOLDENS])
def test_golden(name, args):
    res = run(*args)
    assert res.exit_code == 0, res.stderr
    check_golden(name, res.stdout)
    if name.endswith(".txt"):
        assert max(len(x) for x in res.stdout.splitlines()) <= 80


def test_lossy_warnings_on_stderr():
    res = run(LOSSY)
    assert res.stderr.splitlines() == [
        f'pstate stats: warning: skipped 1 line: bad or missing "tid" (first at {LOSSY}:8)',
        f"pstate stats: warning: skipped 1 line: not valid JSON (first at {LOSSY}:6)",
        f"pstate stats: warning: truncated final record at {LOSSY}: byte 6358, line 40",
        "pstate stats: warning: the input reports 5 lost events; results are incomplete",
    ]
    assert "INCOMPLETE: 5 events lost (13%: ringbuf_full 5); 2 bad lines skipped;" in res.stdout


def test_lossy_json_says_incomplete_and_by_how_much():
    inp = report(LOSSY)["input"]
    assert inp["complete"] is False
    assert (inp["lost_total"], inp["lost"], inp["skipped_total"]) == (5, {"ringbuf_full": 5}, 2)
    assert inp["lost_pct"] == round(100 * 5 / (34 + 5), 3)
    assert inp["truncated_tail"] == f"{LOSSY}: byte 6358, line 40"
    assert report(BASIC)["input"]["complete"] is True


def test_strict_exits_65_on_bad_lines():
    res = run(LOSSY, "--strict")
    assert res.exit_code == 65
    assert res.stderr == f"Error: {LOSSY}:6: not valid JSON\n"
    assert res.stdout == ""


def test_newer_schema_is_refused():
    res = run("newer.jsonl")
    assert res.exit_code == 65
    assert "written in event format 99" in res.stderr and "upgrade pstate" in res.stderr


# --- the numbers --------------------------------------------------------------


def test_time_in_state_by_thread_worked_by_hand():
    g = by_key(report(BASIC, "--by", "tid"))
    assert {s: v["ns"] for s, v in g[100]["states"].items()} == {
        "running": 29_950_000 + 69 * MS + 199_980_000 + 349_900_000,
        "runnable": 50_000 + 20_000 + 100_000, "preempted": MS,
        "sleeping": 200 * MS, "uninterruptible": 50 * MS}
    assert g[100]["unobserved_ns"] == 100 * MS  # asleep since before the window
    assert g[300]["states"]["stopped"]["ns"] == 300 * MS
    assert g[300]["latency"]["blocked_stopped"]["max_ns"] == 300 * MS
    assert g[201]["states"]["zombie"]["ns"] == 47 * MS - 10_000
    assert g[201]["observed_ns"] == 150 * MS  # forked, exited, reaped: no tail after reaped
    assert g[201]["unobserved_ns"] == 0


def test_threads_seen_through_the_window_sum_to_it():
    rep = report(BASIC, "--by", "tid")
    for tid in (100, 101, 200, 300):
        g = by_key(rep)[tid]
        assert g["observed_ns"] + g["unobserved_ns"] == 1000 * MS
    acc = rep["accounting"]
    assert (acc["tasks_whole_window"], acc["max_abs_deviation_ns"]) == (4, 0)
    assert acc["unobserved_ns"] == (100 + 50 + 10 + 200) * MS
    assert acc["null_dur_transitions"] == 4


def test_process_groups_threads_and_counts_switches():
    g = by_key(report(BASIC))
    assert g[100]["threads"] == 2 and g[100]["comm"] == "server"
    assert g[100]["observed_ns"] + g[100]["unobserved_ns"] == 2000 * MS
    assert (g[100]["voluntary"], g[100]["involuntary"]) == (4, 1)
    assert (g[200]["forks"], g[201]["execs"], g[201]["exits"]) == (1, 1, 1)
    assert g[201]["comm"] == "sleep"
    assert set(g[100]["latency"]) == {"runq_wakeup", "runq_preempted", "oncpu", "blocked_sleeping",
                                      "blocked_uninterruptible"}
    w = g[100]["latency"]["runq_wakeup"]
    assert (w["count"], w["max_ns"]) == (4, 500_000)
    assert abs(w["p50_ns"] - 50_000) <= 50_000 / 64  # percentiles: bucket midpoints


def test_matrix_counts_and_mean_of_the_state_left():
    rows = {(m["from"], m["to"]): m for m in report(BASIC, "--matrix")["matrix"]}
    assert rows[("stopped", "runnable")] == {"from": "stopped", "to": "runnable", "count": 1,
                                             "mean_ns": 300 * MS, "total_ns": 300 * MS}
    assert rows[("running", "stopped")]["mean_ns"] is None  # its start was not seen
    assert rows[("zombie", "reaped")]["count"] == 1


def test_state_filter_min_dur_sort_top():
    keys = lambda *a: [g["key"] for g in report(BASIC, *a)["groups"]]  # noqa: E731
    assert keys() == [100, 200, 300, 201]  # by time running
    assert keys("--in-state", "stopped") == [300]
    assert keys("--in-state", "D", "--in-state", "T") == [300, 100]
    assert keys("--in-state", "S", "--min-time", "400ms") == [100, 300]  # 1.14s, 490ms (not 390ms)
    assert keys("--min-time", "1s") == [100]
    assert keys("--sort", "key") == [100, 200, 201, 300]
    assert keys("--sort", "zombie") == [201, 100, 200, 300]
    assert keys("--sort", "runq-max", "--top", "2") == [100, 200]
    assert report(BASIC, "--top", "1")["accounting"]["groups_shown"] == 1


def test_by_comm():
    g = by_key(report(BASIC, "--by", "comm"))
    assert sorted(g) == ["server", "sleep", "stopper", "worker"]
    assert (g["server"]["threads"], g["server"]["processes"]) == (2, 1)


def test_stdin_and_several_files_in_order():
    data = (DATA / BASIC).read_bytes()
    assert report(input=data) == report("-", input=data)
    assert report(input=data)["groups"] == report(BASIC)["groups"]
    two = report(BASIC, BASIC)
    assert two["input"]["events"] == 68


def test_count_needs_interval():
    res = run(BASIC, "--count", "2")
    assert res.exit_code == 2 and "--count needs --interval" in res.stderr


def test_help_has_examples_and_the_json_keys_are_documented():
    """--help shows usage, options and examples; the report's keys are in
    pstate-events(5), generated from pstate.stream.reports."""
    from pstate.stream import reports

    res = run("--help")
    assert res.exit_code == 0
    for word in ("Examples:", "--interval", "--hist", "--matrix", "dot", "pstate-events"):
        assert word in res.stdout
    fields = " ".join(reports.REPORTS["stats"][1])
    for word in ("max_abs_deviation_ns", "lost_pct", "p99_ns", "runq_preempted"):
        assert word in fields


# --- the fast path equals the reference path ---------------------------------


def both_paths(args, input=None):
    fast = run(*args, "-f", "json", "--hist", "--matrix", input=input)
    careful = run(*args, "-f", "json", "--hist", "--matrix", "--reader", "careful", input=input)
    assert (fast.exit_code, fast.stdout, fast.stderr) == (careful.exit_code, careful.stdout, careful.stderr)
    return fast


@pytest.mark.parametrize("by", ["pid", "tid", "comm"])
@pytest.mark.parametrize("path", [BASIC, LOSSY])
def test_fast_equals_careful_on_fixtures(path, by):
    both_paths([path, "--by", by])


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    sys.path.insert(0, str(HERE.parent / "bench"))
    import bench_stats

    path = tmp_path_factory.mktemp("gen") / "gen.jsonl"
    bench_stats.generate(path, 20_000, n_tasks=300, seed=7)
    return path


def test_fast_equals_careful_on_a_generated_stream(generated):
    res = both_paths([str(generated), "--by", "tid"])
    rep = orjson.loads(res.stdout)
    assert rep["input"]["events"] == 20_000
    assert rep["accounting"]["max_abs_deviation_ns"] == 0


def digest(data: bytes, chunk: int, max_line: int = streamio.MAX_LINE, strict: bool = False):
    st = streamio.ReadStats()
    agg = timeinstate.Aggregator("tid")
    dig = ingest.LineDigester(agg, st, strict=strict, max_line=max_line)
    dig.begin("mem.jsonl")
    for i in range(0, len(data), chunk):
        dig.feed(data[i:i + chunk])
    dig.end()
    return st, agg.summarise(st)


def reference(data: bytes, tmp_path, max_line: int = streamio.MAX_LINE, strict: bool = False):
    os.chdir(tmp_path)
    Path("mem.jsonl").write_bytes(data)
    st = streamio.ReadStats()
    agg = timeinstate.Aggregator("tid")
    ingest.digest_records(reader.read_records(["mem.jsonl"], st, max_line=max_line, strict=strict), agg)
    return st, agg.summarise(st)


def same(a, b):
    from pstate.render import tables

    (sa, ra), (sb, rb) = a, b
    assert sa == sb
    ja = tables.build_report(ra, ra.groups, hist=True, with_matrix=True)
    jb = tables.build_report(rb, rb.groups, hist=True, with_matrix=True)
    assert ja == jb


@pytest.mark.parametrize("chunk", [1, 2, 7, 64, 1000, 1 << 20])
def test_chunk_boundaries_do_not_matter(chunk, tmp_path):
    data = (DATA / LOSSY).read_bytes()
    same(digest(data, chunk), reference(data, tmp_path))


@pytest.mark.parametrize("chunk", [3, 50, 333, 1 << 16])
def test_over_long_lines_are_skipped_alike(chunk, tmp_path):
    lines = (DATA / BASIC).read_bytes().splitlines(keepends=True)
    lines[4] = b'{"type":"state","comm":"' + b"x" * 400 + b'"}\n'
    lines.insert(9, b"y" * 301 + b"\n")
    lines.append(b"z" * 350)  # over-long last line without a newline
    data = b"".join(lines)
    got = digest(data, chunk, max_line=300)
    same(got, reference(data, tmp_path, max_line=300))
    assert got[0].skipped == {"line longer than 300 bytes": 3}
    assert got[0].truncated_tail is None


def test_exactly_max_line_is_kept(tmp_path):
    rec = orjson.loads((DATA / BASIC).read_bytes().splitlines()[1])
    line = orjson.dumps(rec)
    pad = 200 - len(line)
    rec["comm"] = rec["comm"] + "p" * pad
    line = orjson.dumps(rec)
    assert len(line) == 200
    data = line + b"\n" + line
    same(digest(data, 13, max_line=200), reference(data, tmp_path, max_line=200))
    assert digest(data, 13, max_line=200)[0].skipped == {}


# --- --interval -------------------------------------------------------------------


def intervals(*args) -> list[dict]:
    res = run(BASIC, "-f", "json", "--interval", *args)
    assert res.exit_code == 0, res.stderr
    return [orjson.loads(x) for x in res.stdout.splitlines()]


def test_intervals_of_a_file_tile_the_whole_run():
    reps = intervals("0.25", "--by", "tid")
    assert [r["interval"]["seq"] for r in reps] == [1, 2, 3, 4]
    assert [r["window"]["duration_ns"] for r in reps] == [250 * MS] * 4
    whole = by_key(report(BASIC, "--by", "tid"))
    for tid, g in whole.items():
        for state, v in g["states"].items():
            per = [by_key(r).get(tid, {}).get("states", {}).get(state, {}).get("ns", 0) for r in reps]
            assert sum(per) == v["ns"], (tid, state, per)
    for r in reps:
        assert r["accounting"]["max_abs_deviation_ns"] == 0
        for tid in (100, 101, 200, 300):
            g = by_key(r)[tid]
            assert g["observed_ns"] + g["unobserved_ns"] == 250 * MS


def test_interval_count_stops_early():
    reps = intervals("0.1", "--count", "3")
    assert [r["interval"]["seq"] for r in reps] == [1, 2, 3]


def test_interval_table_has_a_clock_banner():
    res = run(BASIC, "--interval", "0.5")
    assert res.exit_code == 0
    banners = [x for x in res.stdout.splitlines() if re.fullmatch(r"--- \d\d:\d\d:\d\d", x)]
    assert len(banners) == 2
    assert "interval 2, window 500ms" in res.stdout


# --- pipes, live intervals and Ctrl-C (subprocesses) --------------------------------

FEED = """
import sys, time
lines = open(sys.argv[1], "rb").read().splitlines(keepends=True)
time.sleep(float(sys.argv[2]))
for i in range(0, len(lines), 10):
    sys.stdout.buffer.write(b"".join(lines[i:i + 10])); sys.stdout.flush()
    time.sleep(float(sys.argv[3]))
time.sleep(float(sys.argv[4]))
"""


def pipeline(stats_args, first=0.0, gap=0.0, last=0.0, watch=None):
    """feed | stats; watch: a list that gets a descriptor of the pipe's read
    end (the caller closes it), to see what is left unread."""
    feed = subprocess.Popen([sys.executable, "-c", FEED, str(DATA / BASIC), str(first), str(gap), str(last)],
                            stdout=subprocess.PIPE, start_new_session=True)
    stats = subprocess.Popen(pstate_cmd("stats", *stats_args), stdin=feed.stdout, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=clean_env(), start_new_session=True)
    if watch is not None:
        watch.append(os.dup(feed.stdout.fileno()))
    feed.stdout.close()
    return feed, stats


def unread(fd: int) -> int:
    """Bytes waiting in a pipe (FIONREAD)."""
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0" * 4))[0]


def test_live_intervals_fire_without_input():
    feed, stats = pipeline(["--interval", "0.2", "--count", "2", "-f", "json"], first=5)
    try:
        out, err = stats.communicate(timeout=30)
    finally:
        feed.kill()
        feed.wait()
    reps = [orjson.loads(x) for x in out.splitlines()]
    assert [r["interval"]["seq"] for r in reps] == [1, 2]
    assert all(r["input"]["events"] == 0 for r in reps)
    assert stats.returncode == 0, err


def test_live_intervals_then_a_final_summary_at_eof():
    feed, stats = pipeline(["--interval", "0.3", "-f", "json"], first=0.5, gap=0.4)
    out, err = stats.communicate(timeout=60)
    feed.wait()
    reps = [orjson.loads(x) for x in out.splitlines()]
    assert len(reps) >= 2
    assert sum(r["input"]["events"] for r in reps) == 34  # every event lands in one interval
    assert reps[-1]["input"]["records"] == 36
    assert stats.returncode == 0, err


def test_first_ctrl_c_is_ignored_on_a_pipe():
    feed, stats = pipeline(["-f", "json"], first=1.5)
    wait_ready(stats)  # a Ctrl-C from here on, during start-up too, is the first one
    stats.send_signal(signal.SIGINT)
    out, err = stats.communicate(timeout=60)
    feed.wait()
    assert stats.returncode == 0, err
    assert orjson.loads(out)["input"]["events"] == 34
    assert b"Traceback" not in err


def test_second_ctrl_c_prints_what_it_has():
    pipe = []
    feed, stats = pipeline(["-f", "json"], gap=1.0, last=10, watch=pipe)
    try:
        wait_ready(stats)
        first = len(b"".join((DATA / BASIC).read_bytes().splitlines(keepends=True)[:10]))
        deadline = time.monotonic() + 30  # the feed wrote its first lines, stats read them and waits for more
        while not (io_counter(feed.pid, "wchar") >= first and unread(pipe[0]) == 0):
            assert time.monotonic() < deadline and stats.poll() is None
            time.sleep(0.002)
        wait_reading_pipe(stats)
    finally:
        os.close(pipe[0])
    stats.send_signal(signal.SIGINT)
    wait_delivered(stats, signal.SIGINT)  # two pending at once would be one
    stats.send_signal(signal.SIGINT)
    out, err = stats.communicate(timeout=60)
    feed.kill()
    feed.wait()
    assert stats.returncode == 130
    rep = orjson.loads(out)
    assert rep["input"]["interrupted"] is True and rep["input"]["complete"] is False
    assert 0 < rep["input"]["records"] < 36
    assert b"Traceback" not in err and b"interrupted" in err


def io_counter(pid: int, name: str) -> int:
    """A counter of /proc/PID/io (rchar, wchar, ...)."""
    try:
        with open(f"/proc/{pid}/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(name + ":"))
    except (OSError, StopIteration):
        return 0


# --- snapshots are somebody else's analysis --------------------------------------


SNAP_SERIES = HERE / "data" / "snap" / "series"


@pytest.mark.skipif(not SNAP_SERIES.is_dir(), reason="no snapshot fixtures")
def test_snapshot_directory_is_delegated():
    res = run(str(SNAP_SERIES), "-f", "json")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.strip()


def test_snapshots_and_streams_do_not_mix(tmp_path):
    res = run(str(tmp_path), BASIC)
    assert res.exit_code == 2 and "cannot mix" in res.stderr


# --- a large file in parts (processes) ------------------------------------------


def line_starts(data: bytes, every: int) -> list:
    starts = [0] + [i + 1 for i, c in enumerate(data) if c == 10][:-1]
    return starts[::every]


def parts_of(data: bytes, every: int) -> list:
    bounds = line_starts(data, every) + [len(data)]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if a < b]


def serial(path: str, strict=False):
    st = streamio.ReadStats()
    agg = timeinstate.Aggregator("tid")
    ingest.digest_files([path], agg, st, strict=strict)
    return st, agg.summarise(st)


def in_parts(path: str, parts, jobs: int, strict=False):
    st = streamio.ReadStats()
    agg = timeinstate.Aggregator("tid")
    ingest.digest_parallel(path, agg, st, jobs=jobs, parts=parts, strict=strict)
    return st, agg.summarise(st)


# Parts of one line each are read in this process only: in children it
# would be a process per line, and the merge is the same code either way.
@pytest.mark.parametrize("jobs,every", [(1, 1), (1, 3), (1, 10), (2, 3), (2, 10)])
def test_parts_merged_in_order_equal_one_go(every, jobs):
    parts = parts_of((DATA / LOSSY).read_bytes(), every)
    assert len(parts) > 3
    same(in_parts(LOSSY, parts, jobs), serial(LOSSY))


def test_strict_error_in_a_later_part_has_its_file_line_number():
    parts = parts_of((DATA / LOSSY).read_bytes(), 4)
    with pytest.raises(PstateError) as e:
        in_parts(LOSSY, parts, 2, strict=True)
    assert e.value.message == "lossy.jsonl:6: not valid JSON"


def test_file_parts_start_at_lines(generated, monkeypatch):
    monkeypatch.setattr(ingest, "_PART_MIN_BYTES", 1 << 16)
    data = generated.read_bytes()
    parts = ingest.file_parts(str(generated), 7)
    assert len(parts) == 7 and parts[0][0] == 0 and parts[-1][1] == len(data)
    assert all(data[a - 1:a] == b"\n" for a, _b in parts[1:])
    assert all(a < b for a, b in parts)
    same(in_parts(str(generated), parts, 2), serial(str(generated)))


def test_jobs_option_gives_the_same_report(generated, monkeypatch):
    monkeypatch.setattr(ingest, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(ingest, "_PART_MIN_BYTES", 1 << 16)
    one = run(str(generated), "-f", "json", "--matrix", "-j", "1")
    two = run(str(generated), "-f", "json", "--matrix", "-j", "3")
    assert one.exit_code == two.exit_code == 0
    assert one.stdout == two.stdout


def test_interval_csv_has_one_header_and_an_interval_column():
    res = run(BASIC, "--interval", "0.5", "-f", "csv")
    lines = res.stdout.splitlines()
    assert lines[0].startswith("interval,pid,comm,threads,observed_ns")
    assert sum(x.startswith("interval,") for x in lines) == 1
    assert {x.split(",")[0] for x in lines[1:]} == {"1", "2"}


def test_garbage_state_names_and_missing_comm_do_not_break_anything():
    lines = [orjson.dumps({"type": "state", "ts": 10 + i, "cpu": 0, "pid": 7, "tid": 7,
                           "from": f"s{i}", "to": f"s{i + 1}", "dur_ns": 1}) for i in range(300)]
    data = b"\n".join(lines) + b"\n"
    rep = report("-", "--by", "comm", input=data)
    (g,) = rep["groups"]
    assert g["key"] is None and g["comm"] == "" and g["transitions"] == 300
    assert "state_?" in g["states"]
    table = run("-", "--by", "comm", input=data)
    assert table.exit_code == 0

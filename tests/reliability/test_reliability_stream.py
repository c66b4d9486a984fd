"""Reliability of `pstate record` as a stream, against real BPF.

Loss accounting under a storm (checked against the kernel's own run counts),
a stalled consumer, a reader that goes away (`| head`), kills during start-up,
and clean ends on signals, alone and in `record | stats`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson
import pytest

from conftest import ROOT, bpf_prog_ids, clean_env, fdinfos, pstate_cmd, until
from workloads import SIGNAL_EXIT_S, STORM_EXIT_S

# storms, kills and system-wide program counts: alone
pytestmark = [pytest.mark.bpf, pytest.mark.reliability, pytest.mark.serial]

EVENT_TYPES = ("state", "fork", "exec", "exit")
LOSS_REASONS = ("ringbuf_full", "map_full", "sampled", "unread")
# Names the kernel gives pstate's programs on any path (bpf/tpargs.h):
# tracepoint__<category>__<event>, tp_btf__<event>, raw_tracepoint__<event>,
# in full (bcc's BTF names them) and as the kernel's first 15 characters
# (a program loaded from the program cache).
_PROBES = [m for src in (ROOT / "bpf").glob("*.bpf.c")
           for m in re.findall(r"\b(TRACEPOINT_PROBE|PSTATE_PROBE|RAW_TRACEPOINT_PROBE)\("
                               r"\s*(?:(\w+),\s*)?(\w+)\)", src.read_text())]
_NAMES = {n for kind, cat, ev in _PROBES for n, on in (
    (f"tracepoint__{cat}__{ev}", kind != "RAW_TRACEPOINT_PROBE"), (f"tp_btf__{ev}", kind.startswith("PSTATE")),
    (f"raw_tracepoint__{ev}", kind in ("PSTATE_PROBE", "RAW_TRACEPOINT_PROBE"))) if on}
OUR_PROGRAMS = _NAMES | {n[:15] for n in _NAMES}


# --- helpers ----------------------------------------------------------------


@contextlib.contextmanager
def storm(seconds: float):
    """A context-switch and fork storm on every CPU, ended on exit (and by
    `timeout` after seconds + 30 s whatever happens to the test)."""
    limit = ["timeout", "-s", "KILL", str(int(seconds) + 30)]
    perf = shutil.which("perf")
    if perf and subprocess.run([perf, "bench", "sched", "pipe", "-l", "10"], capture_output=True).returncode == 0:
        switcher = [perf, "bench", "sched", "pipe", "-l", "1000000000"]
    else:  # two processes bouncing a byte through pipes
        switcher = [sys.executable, "-c", PING_PONG]
    forker = ["bash", "-c", f"end=$((SECONDS+{int(seconds) + 1})); while [ $SECONDS -lt $end ]; do /bin/true; done"]
    procs = [subprocess.Popen(limit + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True) for cmd in (switcher, forker)]
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


PING_PONG = """
import os
r1, w1 = os.pipe(); r2, w2 = os.pipe()
if os.fork() == 0:
    while True:
        os.read(r1, 1); os.write(w2, b"x")
while True:
    os.write(w1, b"x"); os.read(r2, 1)
"""


def read_stream(path: Path, *, allow_torn_tail: bool = False) -> list[dict]:
    """Every line of a stream file, parsed; a line without its newline is
    tolerated only at the very end and only when allowed (SIGKILL)."""
    data = path.read_bytes() if path.exists() else b""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    assert not tail or allow_torn_tail, f"{path}: last line has no newline: {tail[-200:]!r}"
    recs = []
    for i, line in enumerate(lines, 1):
        try:
            recs.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            pytest.fail(f"{path}:{i}: complete line does not parse: {line[:200]!r}")
    return recs


def check_trailer(recs: list[dict], reason: str | None = None) -> dict:
    """The end trailer is last, counts the events written, sums the loss
    records, and events + drops == what the kernel side attempted."""
    assert recs and recs[0]["type"] == "meta", recs[:1]
    end = recs[-1]
    assert end["type"] == "end", f"last record is not the trailer: {end}"
    assert sum(r["type"] == "end" for r in recs) == 1
    if reason:
        assert end["reason"] == reason, end
    n_events = sum(r["type"] in EVENT_TYPES for r in recs)
    assert end["events"] == n_events, (end, n_events)
    loss = {r: 0 for r in LOSS_REASONS}
    for r in recs:
        if r["type"] == "loss":
            assert r["count"] > 0, r
            loss[r["reason"]] += r["count"]
    for reason_ in LOSS_REASONS:
        assert end[f"lost_{reason_}"] == loss[reason_], (reason_, end, loss)
    assert end["lost"] == sum(loss.values()), (end, loss)
    assert (end["events"] + end["lost_ringbuf_full"] + end["lost_sampled"] + end["lost_unread"]
            == end["kernel_events"]), end
    return end


def wait_for_first_line(path: Path, proc: subprocess.Popen, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            data = path.read_bytes()
            if b"\n" in data:
                return orjson.loads(data.split(b"\n", 1)[0])
        assert proc.poll() is None, f"record exited early: {proc.returncode}"
        time.sleep(0.05)
    pytest.fail("record wrote no meta line")


def prog_ids_held(pid: int | str = "*") -> set[int]:
    """IDs of BPF programs some process (or one process) holds an fd of."""
    held = set()
    for _p, text in fdinfos(pid):
        for line in text.splitlines():
            if line.startswith("prog_id:"):
                held.add(int(line.split()[1]))
    return held


def prog_info(prog_id: int) -> dict | None:
    p = subprocess.run(["bpftool", "-j", "prog", "show", "id", str(prog_id)], capture_output=True, text=True)
    return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else None


def leftover_programs(before: set[int]) -> dict[int, str]:
    """pstate programs loaded since `before` that no live process holds.

    Other people's programs (held by their live processes) are ignored, so
    this works while other BPF tools run on the machine. A program must stay
    orphaned over three looks half a second apart to count.
    """
    orphans: dict[int, str] = {}
    for attempt in range(3):
        if attempt:
            time.sleep(0.5)
        new = bpf_prog_ids() - before
        unheld = new - prog_ids_held()
        orphans = {}
        for i in unheld:
            info = prog_info(i)
            if info and info.get("name") in OUR_PROGRAMS:
                orphans[i] = info["name"]
        if not orphans:
            return {}
    return orphans


def vm_kb(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


@pytest.fixture
def bpf_stats():
    """kernel.bpf_stats_enabled=1 for the test, restored afterwards."""
    path = Path("/proc/sys/kernel/bpf_stats_enabled")
    old = path.read_text().strip()
    path.write_text("1")
    try:
        yield
    finally:
        path.write_text(old)


@contextlib.contextmanager
def pinned_programs(ids: dict[str, int]):
    """Pin programs in a private bpffs so their run counts can be read after
    the process that loaded them has exited. Unmounting drops the pins."""
    d = tempfile.mkdtemp(prefix="pstate-test-bpffs-")
    subprocess.run(["mount", "-t", "bpf", "bpf", d], check=True)
    try:
        for name, i in ids.items():
            subprocess.run(["bpftool", "prog", "pin", "id", str(i), f"{d}/{name}"], check=True)

        def run_cnt(name: str) -> int:
            out = subprocess.run(["bpftool", "-j", "prog", "show", "pinned", f"{d}/{name}"], capture_output=True,
                                 text=True, check=True).stdout
            return int(json.loads(out).get("run_cnt", 0))  # bpftool omits it while zero

        yield run_cnt
    finally:
        for name in ids:
            with contextlib.suppress(OSError):
                os.unlink(f"{d}/{name}")
        subprocess.run(["umount", d], check=False)
        os.rmdir(d)


def programs_of(pid: int) -> dict[str, int]:
    """tracepoint -> id of the BPF programs a process has attached: classic
    tracepoints' by its perf events, tp_btf and raw tracepoint programs'
    (the lifecycle ones where the kernel has BTF) by its link fds.

    By attachment, not by name: a program compiled by bcc carries BTF with
    its full function name, one loaded from pstate's program cache only the
    kernel's 15-character name."""
    p = subprocess.run(["bpftool", "-j", "perf", "show"], capture_output=True, text=True)
    rows = json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []
    out = {r["tracepoint"]: r["prog_id"] for r in rows
           if r.get("pid") == pid and r.get("fd_type") == "tracepoint" and "tracepoint" in r}
    for _pid, info in fdinfos(pid):
        fields = dict(line.split(":\t", 1) for line in info.splitlines() if ":\t" in line)
        if fields.get("link_type") == "raw_tracepoint" and "tp_name" in fields:
            out[fields["tp_name"]] = int(fields["prog_id"])
    return out


LIFE_PROGRAMS = {
    "fork": "sched_process_fork",
    "exec": "sched_process_exec",
    "exit": "sched_process_exit",
}


def record_with_run_counts(tmp_path: Path, extra: list[str], during) -> tuple[list[dict], dict[str, int]]:
    """Record with -o while `during()` runs; return the records and the run
    counts of the fork, exec and exit programs over the whole recording."""
    out = tmp_path / "rec.jsonl"
    p = subprocess.Popen(pstate_cmd("record", "-q", "-o", str(out), *extra), env=clean_env(),
                         stderr=subprocess.PIPE)
    try:
        wait_for_first_line(out, p)
        progs = programs_of(p.pid)
        assert set(LIFE_PROGRAMS.values()) <= set(progs), progs
        with pinned_programs({k: progs[v] for k, v in LIFE_PROGRAMS.items()}) as run_cnt:
            during()
            time.sleep(0.2)
            p.send_signal(signal.SIGINT)
            _, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            # the process has exited: the pinned programs no longer run
            counts = {k: run_cnt(k) for k in LIFE_PROGRAMS}
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return read_stream(out), counts


# --- 8. loss accounting -------------------------------------------------------


def test_loss_accounting_is_exact_under_a_storm(tmp_path, bpf_stats):
    """A 8 KiB ring buffer under a switch and fork storm: every event the kernel
    side attempted is either written or counted as a drop, exactly."""

    def stormy():
        with storm(3):
            time.sleep(3)

    recs, run_cnt = record_with_run_counts(tmp_path, ["--buffer-size", "8k"], stormy)
    end = check_trailer(recs, "signal")
    loss_recs = [r for r in recs if r["type"] == "loss" and r["reason"] == "ringbuf_full"]
    assert loss_recs, "no ringbuf_full loss record in the stream"
    assert end["lost_ringbuf_full"] > 0 and end["events"] > 0
    for r in loss_recs:
        assert r["since_ts"] <= r["ts"]
    # The kernel's own count of fork/exec/exit program runs: each run emits
    # exactly one event (no filter), which is either written or one of the
    # drops. Drops are not attributed per program, so in a lossy run the
    # written lines bound the run count from below and lines + all drops
    # from above; the no-loss test below checks equality.
    drops = end["lost_ringbuf_full"] + end["lost_unread"]
    for kind, runs in run_cnt.items():
        lines = sum(r["type"] == kind for r in recs)
        assert lines <= runs <= lines + drops, (kind, lines, runs, drops)
    assert run_cnt["fork"] > 100, run_cnt  # the storm really forked
    print(f"\nstorm: events={end['events']} lost_ringbuf_full={end['lost_ringbuf_full']} "
          f"lost_unread={end['lost_unread']} kernel_events={end['kernel_events']} "
          f"loss records={len(loss_recs)} run_cnt={run_cnt}")


def test_kernel_run_counts_equal_lines_written_without_loss(tmp_path, bpf_stats):
    """With nothing dropped, the fork, exec and exit programs ran exactly as
    often as there are fork, exec and exit lines in the file."""

    def forks():
        subprocess.run(["bash", "-c", "for i in $(seq 200); do /bin/true; done"], check=True, timeout=60)

    for attempt in range(2):  # a very busy machine can still overflow 64 MiB
        recs, run_cnt = record_with_run_counts(tmp_path, ["--buffer-size", "64M"], forks)
        end = check_trailer(recs, "signal")
        if end["lost"] == 0:
            break
    assert end["lost"] == 0, f"events were lost twice even with a 64 MiB buffer: {end}"
    lines = {k: sum(r["type"] == k for r in recs) for k in LIFE_PROGRAMS}
    assert lines == run_cnt, (lines, run_cnt)
    assert run_cnt["fork"] >= 200 and run_cnt["exec"] >= 200, run_cnt
    print(f"\nno loss: lines={lines} run_cnt={run_cnt} events={end['events']}")


# --- 9. stalled consumer ------------------------------------------------------

STALL_S = 15


@pytest.mark.slow
def test_stalled_consumer_memory_is_bounded_and_stream_resumes():
    """`pstate record | (sleep 15; cat)`: the reader is this test, which
    stops reading for 15 s under a storm, then reads again."""
    p = subprocess.Popen(pstate_cmd("record", "-q"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=clean_env())
    samples: list[int] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            kb = vm_kb(p.pid, "VmRSS")
            if kb is not None:
                samples.append(kb)
            stop.wait(1.0)

    err_chunks: list[bytes] = []
    threads = [threading.Thread(target=sample), threading.Thread(target=lambda: err_chunks.append(p.stderr.read()))]
    try:
        assert orjson.loads(p.stdout.readline())["type"] == "meta"
        for t in threads:
            t.start()
        with storm(STALL_S):
            time.sleep(STALL_S)  # not reading: the pipe fills, record blocks
        stall_end = time.monotonic_ns()
        hwm = vm_kb(p.pid, "VmHWM")

        got = {"events": 0, "after_stall": 0, "loss": [], "end": None, "lines": 0}

        def consume():
            for line in p.stdout:
                got["lines"] += 1
                r = orjson.loads(line)
                t = r["type"]
                if t in EVENT_TYPES:
                    got["events"] += 1
                    got["after_stall"] += r["ts"] > stall_end
                elif t == "loss":
                    got["loss"].append(r)
                elif t == "end":
                    got["end"] = r

        reader = threading.Thread(target=consume)
        reader.start()
        time.sleep(3)
        p.send_signal(signal.SIGINT)
        p.wait(timeout=60)
        reader.join(timeout=60)
    finally:
        stop.set()
        if p.poll() is None:
            p.kill()
            p.wait()
        for t in threads:
            if t.is_alive():
                t.join(timeout=10)
    err = b"".join(err_chunks).decode(errors="replace")
    assert p.returncode == 0, err
    assert "Traceback" not in err, err
    peak_mb = max(samples + [hwm or 0]) / 1024
    assert samples and peak_mb < 256, (peak_mb, samples)
    end = got["end"]
    assert end and end["reason"] == "signal", end
    assert end["events"] == got["events"], (end, got["events"])
    ringbuf_loss = sum(r["count"] for r in got["loss"] if r["reason"] == "ringbuf_full")
    assert ringbuf_loss > 0 and end["lost_ringbuf_full"] == ringbuf_loss, (got["loss"], end)
    assert end["events"] + end["lost_ringbuf_full"] + end["lost_sampled"] + end["lost_unread"] == end["kernel_events"]
    assert got["after_stall"] > 0, "the stream did not resume after the stall"
    print(f"\nstall {STALL_S}s: peak RSS {peak_mb:.1f} MB (VmHWM {(hwm or 0) / 1024:.1f} MB), "
          f"lost_ringbuf_full={end['lost_ringbuf_full']}, events={end['events']}, "
          f"events after the stall={got['after_stall']}")


# --- 10. the reader goes away; kills during start-up --------------------------

HEAD_RUNS = 50
HEAD_PARALLEL = 2


def _head_run(_i: int) -> dict:
    rec = subprocess.Popen(pstate_cmd("record"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    head = subprocess.Popen(["head", "-n", "10"], stdin=rec.stdout, stdout=subprocess.PIPE)
    rec.stdout.close()
    t0 = time.monotonic()
    out, _ = head.communicate(timeout=120)
    t_head = time.monotonic()
    try:
        _, err = rec.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        rec.kill()
        _, err = rec.communicate()
    t_rec = time.monotonic()
    return {"lines": out.splitlines(), "rc": rec.returncode, "err": err.decode(errors="replace"),
            "after_head": t_rec - t_head, "total": t_rec - t0}


@pytest.mark.slow
def test_record_into_head_50_times():
    before = bpf_prog_ids()
    with concurrent.futures.ThreadPoolExecutor(HEAD_PARALLEL) as pool:
        runs = list(pool.map(_head_run, range(HEAD_RUNS)))
    for i, r in enumerate(runs):
        assert len(r["lines"]) == 10 and orjson.loads(r["lines"][0])["type"] == "meta", (i, r["lines"][:1])
        assert all(orjson.loads(x) for x in r["lines"])
        assert r["rc"] == 0, (i, r)
        assert "Traceback" not in r["err"] and "Error" not in r["err"], (i, r["err"])
    lags = sorted(r["after_head"] for r in runs)
    assert lags[-1] < SIGNAL_EXIT_S, f"record outlived head by up to {lags[-1]:.2f} s; all: {[round(x, 2) for x in lags]}"
    assert not leftover_programs(before)
    totals = sorted(r["total"] for r in runs)
    print(f"\nhead x{HEAD_RUNS} ({HEAD_PARALLEL} at a time): exit after head median {lags[len(lags) // 2]:.2f} s, "
          f"max {lags[-1]:.2f} s; whole run median {totals[len(totals) // 2]:.2f} s, max {totals[-1]:.2f} s")


def test_quiet_record_notices_head_leaving():
    """With a filter that matches nothing, record writes nothing after the
    meta line; it must still notice that its reader left."""
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        rec = subprocess.Popen(pstate_cmd("record", "-q", "-p", str(sleeper.pid)), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=clean_env())
        head = subprocess.Popen(["head", "-n", "1"], stdin=rec.stdout, stdout=subprocess.PIPE)
        rec.stdout.close()
        out, _ = head.communicate(timeout=120)
        t_head = time.monotonic()
        try:
            _, err = rec.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            rec.kill()
            rec.communicate()
            pytest.fail("record kept running after its reader left")
        lag = time.monotonic() - t_head
    finally:
        sleeper.kill()
        sleeper.wait()
    assert orjson.loads(out)["type"] == "meta"
    assert rec.returncode == 0 and not err, err
    assert lag < SIGNAL_EXIT_S, lag


KILL_RUNS = 20
KILL_PARALLEL = 2


def _kill_run(args) -> dict:
    i, sig, anchor, delay, d = args
    out = Path(d) / f"kill-{i}.jsonl"
    p = subprocess.Popen(pstate_cmd("record", "-q", "-o", str(out)), stderr=subprocess.PIPE, env=clean_env())
    if anchor == "meta":
        wait_for_first_line(out, p)
    time.sleep(delay)
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
        return {"i": i, "sig": sig, "hung": True, "rc": None, "err": "", "out": out,
                "what": f"{sig.name} {delay:.2f}s after {anchor}"}
    return {"i": i, "sig": sig, "hung": False, "rc": p.returncode, "err": err.decode(errors="replace"),
            "out": out, "what": f"{sig.name} {delay:.2f}s after {anchor}"}


@pytest.mark.slow
def test_kills_during_start_up_leave_no_programs_and_no_garbled_file(tmp_path):
    """SIGKILL and SIGTERM at random moments: half of them 0-3 s after the
    process starts (imports, compiling, attaching, seeding), half 0-1 s
    after the meta line (recording has begun)."""
    seed = int(os.environ.get("PSTATE_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    plan = []
    for i in range(KILL_RUNS):
        sig = signal.SIGKILL if i % 2 else signal.SIGTERM
        anchor = "spawn" if i % 4 < 2 else "meta"
        plan.append((i, sig, anchor, rng.uniform(0, 3.0 if anchor == "spawn" else 1.0), tmp_path))
    before = bpf_prog_ids()
    with concurrent.futures.ThreadPoolExecutor(KILL_PARALLEL) as pool:
        runs = list(pool.map(_kill_run, plan))
    summary = {"trailer": 0, "empty": 0, "partial": 0}
    for r in runs:
        what = f"seed={seed} run={r['i']} {r['what']}"
        assert not r["hung"], what
        assert "Traceback" not in r["err"], (what, r["err"])
        if r["sig"] == signal.SIGKILL:
            assert r["rc"] == -signal.SIGKILL, (what, r["rc"])
            recs = read_stream(r["out"], allow_torn_tail=True)
            summary["partial" if recs else "empty"] += 1
        else:
            # Before the handlers are installed SIGTERM kills outright;
            # afterwards record ends normally: with its trailer, or, before
            # the meta line, as a run stopped before it began (nothing made)
            assert r["rc"] in (0, -signal.SIGTERM), (what, r["rc"], r["err"])
            recs = read_stream(r["out"])
            if r["rc"] == 0 and not recs:
                assert not r["out"].exists(), what
                summary["empty"] += 1
            elif r["rc"] == 0:
                check_trailer(recs, "signal")
                summary["trailer"] += 1
            else:
                assert not recs or recs[-1]["type"] != "end", what
                summary["empty" if not recs else "partial"] += 1
        if recs:
            assert recs[0]["type"] == "meta", what
    left = leftover_programs(before)
    assert not left, f"seed={seed}: programs left loaded: {left}"
    print(f"\n{KILL_RUNS} kills (seed {seed}): files {summary}, no programs left")


def test_ctrl_c_while_compiling_is_quiet(tmp_path):
    """SIGINT while BCC compiles: the run ends as one stopped before it
    began (exit 0, nothing said, no file made, no program left)."""
    before = bpf_prog_ids()
    out = tmp_path / "rec.jsonl"
    # no program cache: record compiles (a warm cache never imports bcc)
    p = subprocess.Popen(pstate_cmd("record", "-q", "-o", str(out)), stderr=subprocess.PIPE,
                         env=clean_env() | {"PSTATE_NO_CACHE": "1"})

    def compiling():  # bcc is imported right before compiling
        with contextlib.suppress(OSError):
            return "libbcc" in Path(f"/proc/{p.pid}/maps").read_text()
        return False

    until("bcc loaded", p, compiling, 30)
    time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=30)
    err = err.decode(errors="replace")
    assert (p.returncode, err) == (0, "")
    if out.exists():  # it had already started recording: a normal end
        check_trailer(read_stream(out), "signal")
    assert not leftover_programs(before)


# --- 11. signals end the stream with its trailer -------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_under_load_ends_promptly_with_a_complete_trailer(tmp_path, sig):
    """Under a storm the ring buffer never empties; the signal must still
    end the run within seconds, with the trailer last. (SIGHUP ends a run
    on standard output; with -o FILE it starts the file anew: test_trust.)"""
    out = tmp_path / "rec.jsonl"
    if sig == signal.SIGHUP:
        with open(out, "wb") as stdout:
            p = subprocess.Popen(pstate_cmd("record", "-q"), stdout=stdout, stderr=subprocess.PIPE, env=clean_env())
    else:
        p = subprocess.Popen(pstate_cmd("record", "-q", "-o", str(out)), stderr=subprocess.PIPE, env=clean_env())
    try:
        wait_for_first_line(out, p)
        with storm(8):
            time.sleep(2)
            p.send_signal(sig)
            t_sig = time.monotonic()
            if sig == signal.SIGINT:
                time.sleep(0.1)
                p.send_signal(sig)  # an impatient second Ctrl-C changes nothing
            _, err = p.communicate(timeout=60)
            took = time.monotonic() - t_sig
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    assert b"Traceback" not in err
    end = check_trailer(read_stream(out), "signal")
    assert end["events"] > 0
    print(f"\n{sig.name} under a storm: record ended {took:.2f} s after it")
    assert took < STORM_EXIT_S, f"record took {took:.1f} s to end after {sig.name}"


def test_duration_is_kept_under_a_sustained_storm(tmp_path):
    out = tmp_path / "rec.jsonl"
    p = subprocess.Popen(pstate_cmd("record", "-q", "-d", "3", "-o", str(out)), stderr=subprocess.PIPE,
                         env=clean_env())
    try:
        wait_for_first_line(out, p)
        with storm(10):
            _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    recs = read_stream(out)
    end = check_trailer(recs, "duration")
    assert end["duration_ns"] < 7e9, f"-d 3 ran {end['duration_ns'] / 1e9:.1f} s"
    if end["lost_ringbuf_full"]:
        # losses are in the stream as loss records (written at least once a
        # second while recording; the last ones may come with the trailer)
        losses = [r for r in recs if r["type"] == "loss" and r["reason"] == "ringbuf_full"]
        assert sum(r["count"] for r in losses) == end["lost_ringbuf_full"]


def test_ctrl_c_in_record_into_stats(tmp_path):
    """Ctrl-C reaches the whole pipeline: record writes its trailer, stats
    prints its summary, nobody prints a traceback. `tee -i` (which ignores
    SIGINT) keeps a copy of what record wrote."""
    copy = tmp_path / "copy.jsonl"
    q = " ".join
    cmd = (f"{q(map(shlex.quote, pstate_cmd('record')))} | tee -i {shlex.quote(str(copy))} | "
           f"{q(map(shlex.quote, pstate_cmd('stats')))}")
    p = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(),
                         start_new_session=True)
    err_lines: list[bytes] = []
    banner = threading.Event()

    def read_err():
        for line in p.stderr:
            err_lines.append(line)
            if b"Tracing" in line:
                banner.set()

    t = threading.Thread(target=read_err)
    t.start()
    try:
        assert banner.wait(60), b"".join(err_lines)
        time.sleep(1.0)
        os.killpg(p.pid, signal.SIGINT)
        out = p.stdout.read()
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        t.join(timeout=10)
    err = b"".join(err_lines).decode(errors="replace")
    assert "Traceback" not in err, err
    assert p.returncode == 0, (p.returncode, err)
    assert out.strip(), f"stats printed no summary; stderr: {err}"
    check_trailer(read_stream(copy), "signal")

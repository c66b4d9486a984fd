"""The live dashboard without tmux: the feeder (line splitting, validation,
decimation), frames on a pipe, the terminal sequences on a pty, signals."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson

from pstate.render import heatmodel as hm
from pstate.engines import live
from pstate.render import dashboard
from pstate.stream.streamio import MAX_LINE, ReadStats
from pstate.stream import reader
from conftest import ROOT, TESTS

DATA = TESTS / "data" / "heat"
SMALL = DATA / "small.jsonl"
D = hm.STATE_INDEX["uninterruptible"]


def _env(**extra):
    """This checkout's code, whatever is installed."""
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = str(ROOT / "cli")
    return env


def line(ts, tid, frm, to, dur=1000):
    return orjson.dumps({"type": "state", "ts": ts, "cpu": 0, "pid": tid, "tid": tid, "comm": "t",
                         "from": frm, "to": to, "dur_ns": dur, "cause": "x"}) + b"\n"


def feeder(k=1, measure=None):
    model = hm.Window(1_000_000, 100, "tid", None, measure)
    f = live.Feeder(model, ReadStats(), "<test>", False)
    f.k = k
    model.sample_every = k
    return f, model


def test_feeder_splits_lines_across_chunks():
    f, model = feeder()
    data = b"".join(line(1000 * i, 7, "running", "sleeping") for i in range(1, 50))
    for i in range(0, len(data), 37):
        f.feed(data[i:i + 37])
    f.finish()
    assert f.n == 49 and f.parsed == 49 and model.events[7] == 49
    assert f.stats.n_skipped == 0


def test_feeder_last_line_without_newline_counts():
    f, model = feeder()
    f.feed(line(5000, 3, "running", "sleeping").rstrip(b"\n"))
    assert f.parsed == 0
    f.finish()
    assert f.parsed == 1 and model.events[3] == 1


def test_feeder_skips_and_counts_bad_lines():
    f, model = feeder()
    f.feed(b'{"type":"meta","schema":1,"ts":1}\n{oops\n\n'
           + b'{"type":"state","ts":-1,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b"}\n'
           + b'{"type":"state","ts":5,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b","dur_ns":true}\n'
           + b'{"type":"loss","reason":"ringbuf_full","count":7,"since_ts":0}\n'
           + line(9, 1, "running", "sleeping"))
    assert f.stats.skipped == {"not valid JSON": 1, 'bad or missing "ts"': 1, 'bad "dur_ns"': 1}
    assert f.stats.first_bad["not valid JSON"] == "<test>:2"
    assert f.stats.loss == {"ringbuf_full": 7} and len(f.stats.metas) == 1
    assert model.events == {1: 1}


def test_feeder_discards_an_over_long_line():
    f, model = feeder()
    f.feed(line(1, 1, "running", "sleeping") + b'{"x":"' + b"a" * (MAX_LINE + 10))
    f.feed(b"a" * 1000 + b'"}\n' + line(2, 2, "running", "sleeping"))
    f.finish()
    assert f.stats.skipped == {f"line longer than {MAX_LINE} bytes": 1}
    assert set(model.events) == {1, 2}


def test_feeder_integer_policy_matches_the_reader():
    f, model = feeder()
    f.feed(line(2**63 - 1, 1, "running", "sleeping") + line(2**63, 2, "running", "sleeping")
           + line(5, 3, "running", "sleeping", dur=2**64 - 1))
    assert f.stats.skipped == {'bad or missing "ts"': 1, 'bad "dur_ns"': 1}
    assert set(model.events) == {1}


def test_feeder_drops_a_byte_order_mark_at_the_start_even_split():
    f, model = feeder()
    data = b"\xef\xbb\xbf" + b'{"type":"meta","schema":1,"ts":1}\n' + line(5, 1, "running", "sleeping")
    for i in range(len(data)):
        f.feed(data[i:i + 1])
    f.finish()
    assert f.stats.n_skipped == 0 and len(f.stats.metas) == 1 and model.events == {1: 1}


def test_feeder_reports_a_truncated_final_record():
    f, model = feeder()
    first = line(5, 1, "running", "sleeping")
    f.feed(first + line(6, 2, "running", "sleeping")[:40])
    f.finish()
    assert f.stats.n_skipped == 0 and model.events == {1: 1}
    assert f.stats.truncated_tail == f"<test>: byte {len(first)}, line 2"
    assert f.stats.lines == 2


def test_decimation_keeps_rare_records_and_weighs_samples():
    f, model = feeder(k=8)
    recs = [line(1000 + i, 10 + i % 5, "running", "sleeping") for i in range(800)]
    recs.insert(333, line(5000, 99, "running", "uninterruptible"))  # entering D: always kept
    recs.insert(400, b'{"type":"exit","ts":6000,"cpu":0,"pid":98,"tid":98,"comm":"x","group_dead":true}\n')
    f.feed(b"".join(recs))
    assert f.n == 802
    assert 99 in model.events and model.open[99][0] == D
    assert 100 <= f.parsed <= 110  # 800/8 frequent ones + the two rare ones
    f2, m2 = feeder(k=4, measure="oncpu")
    f2.feed(b"".join(line(1000 + i, 1, "running", "sleeping", 500) for i in range(400)))
    assert m2.n_samples == 400  # 100 kept, each weighs 4
    assert sum(sum(col) for col in m2.lat.values()) == 400


def run_pipe(data: bytes, **kw):
    """run_live reading data from a pipe, writing frames (not a tty) to a pipe."""
    r_in, w_in = os.pipe()
    r_out, w_out = os.pipe()
    out = []

    def writer():
        try:
            with os.fdopen(w_in, "wb") as fp:
                fp.write(data)
        except BrokenPipeError:
            pass

    def reader():
        with os.fdopen(r_out, "rb") as fp:
            out.append(fp.read())

    tw = threading.Thread(target=writer, daemon=True)
    tr = threading.Thread(target=reader, daemon=True)
    tw.start()
    tr.start()
    opts = live.LiveOptions(width=80, height=24, refresh=20, **kw)
    try:
        res = live.run_live(r_in, w_out, opts, tty=False)
    finally:
        os.close(w_out)
        os.close(r_in)  # a writer still writing gets EPIPE and ends
        tw.join(10)
        tr.join(10)
    return res, out[0].decode()


def test_frames_on_a_pipe_end_with_the_final_frame():
    res, text = run_pipe(SMALL.read_bytes(), window_ns=1_000_000_000)
    assert res.code == 0 and res.reason == "eof" and res.lines == 245
    frames = text.split("\n\n")
    assert len(frames) >= 2
    final = frames[-1].splitlines()
    assert final[0].startswith("Live: dominant state per thread, busiest 6 of 6, last")
    assert final[1].startswith("worker 101 ")
    assert "input ended (end of input): 245 lines  6 tasks  lost 3" in final[-1]
    assert "\x1b" not in text


def test_live_latency_and_share_frames():
    res, text = run_pipe(SMALL.read_bytes(), window_ns=1_000_000_000, measure="oncpu")
    final = text.split("\n\n")[-1]
    assert final.startswith("Live: on-CPU slices (running), count per ") and "count:" in final
    res, text = run_pipe(SMALL.read_bytes(), window_ns=1_000_000_000, shade=D)
    final = text.split("\n\n")[-1].splitlines()
    assert final[0].startswith("Live: share uninterruptible (D), top 6 of 6 by it, last")
    assert final[1].startswith("db 201") and "@" in final[1]


def test_decimates_a_fast_stream_and_says_so():
    data = b"".join(line(1_000_000_000 + i * 5000, 100 + i % 300, "running", "sleeping", 4000)
                    for i in range(300_000))
    res, text = run_pipe(data, window_ns=1_000_000_000)
    assert res.code == 0 and res.lines == 300_000
    if res.max_sample > 1:
        # (the status line wraps at the frame's width: "sampling" may end a line)
        assert "sampling 1/" in text.replace("\n", " ")
        assert res.parsed < res.lines
    else:
        # A quiet machine may keep up with this stream: then nothing is
        # sampled and nothing said about it.
        assert res.parsed == res.lines and "sampling 1/" not in text


def _pty_run(args, stdin, send=None, wait=30.0, env_extra=None):
    """Run pstate with stdout on a pty of 100x30; return (rc, output)."""
    master, slave = pty.openpty()
    import fcntl
    import struct
    import termios

    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "pstate", *args], stdin=stdin, stdout=slave,
                         stderr=subprocess.PIPE, start_new_session=True, env=_env(**(env_extra or {})))
    os.close(slave)
    out = b""
    t0 = time.monotonic()
    sent = False
    while time.monotonic() - t0 < wait:
        r, _, _ = select.select([master], [], [], 0.1)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        if send and not sent and b"Live:" in out:
            time.sleep(0.3)
            send(p)
            sent = True
        if p.poll() is not None and not r:
            break
    rc = p.wait(timeout=10)
    os.close(master)
    return rc, out.decode("utf-8", "replace"), p.stderr.read().decode()


def test_terminal_is_set_up_and_restored_at_end_of_input():
    with open(SMALL, "rb") as fp:
        rc, out, err = _pty_run(["heat", "--live", "--window", "1s", "--color", "never"], fp)
    assert rc == 0, err
    assert out.startswith(dashboard.ALT_ON + dashboard.CUR_HIDE)
    i = out.rindex(dashboard.CUR_SHOW + dashboard.ALT_OFF)
    final = out[i:]
    assert "worker 101" in final and "input ended (end of input)" in final


def test_sigterm_restores_the_terminal_and_exits_143():
    r, w = os.pipe()
    os.write(w, SMALL.read_bytes()[:5000])  # keep the input open: only a signal ends it
    try:
        rc, out, err = _pty_run(["heat", "--live", "--window", "1s"], r,
                                send=lambda p: p.send_signal(signal.SIGTERM))
    finally:
        os.close(w)
        os.close(r)
    assert rc == 143
    assert dashboard.CUR_SHOW + dashboard.ALT_OFF in out
    assert "input ended (signal)" in out.split(dashboard.ALT_OFF)[-1]


def test_ctrl_c_restores_the_terminal_and_exits_0():
    r, w = os.pipe()
    os.write(w, SMALL.read_bytes()[:5000])
    try:
        rc, out, err = _pty_run(["heat", "--live", "--window", "1s"], r,
                                send=lambda p: p.send_signal(signal.SIGINT))
    finally:
        os.close(w)
        os.close(r)
    assert rc == 0, err
    assert out.split(dashboard.ALT_OFF)[-1].count("input ended (stopped)") == 1


def test_newer_format_stops_with_65():
    import pytest

    from pstate.exitcodes import PstateError

    with pytest.raises(PstateError) as e:
        run_pipe(b'{"type":"meta","schema":9,"version":"9"}\n' + SMALL.read_bytes())
    assert e.value.exit_code == 65


def test_live_from_a_file_reads_all_of_it():
    p = subprocess.run([sys.executable, "-m", "pstate", "heat", "--live", str(SMALL), "--window", "1s",
                        "--width", "80"], capture_output=True, timeout=60, env=_env())
    assert p.returncode == 0
    final = p.stdout.decode().split("\n\n")[-1]
    assert "input ended (end of input): 245 lines  6 tasks  lost 3" in final
    assert "sampling" not in final
    assert p.stderr.decode() == "pstate heat: warning: the input reports 3 lost events; results are incomplete\n"


def test_a_dumb_terminal_gets_plain_frames_without_cursor_movement():
    with open(SMALL, "rb") as fp:
        rc, out, err = _pty_run(["heat", "--live", "--window", "1s"], fp, env_extra={"TERM": "dumb"})
    assert rc == 0, err
    assert "\x1b" not in out  # no alternate screen, cursor movement nor colour
    frames = out.replace("\r\n", "\n").split("\n\n")
    assert frames[0].startswith("Live:")
    assert "input ended (end of input)" in frames[-2] + frames[-1]


def test_the_header_counts_the_rows_it_chooses_from():
    res, text = run_pipe(SMALL.read_bytes(), window_ns=1_000_000_000, top=3)
    for frame in text.split("\n\n"):
        m = re.match(r"Live: dominant state per thread, busiest (\d+) of (\d+),", frame)
        if m:
            assert int(m[1]) <= int(m[2])


# --- the reason column (a recording made with record --stacks) ---------------------

WHY = TESTS / "data" / "stats" / "why.jsonl"
LIVE_GOLDEN = TESTS / "golden" / "heat" / "live-reasons-w80.txt"
CLOCK = re.compile(r"^\d\d:\d\d:\d\d ", re.M)


def _final_frame(data: bytes) -> str:
    _res, text = run_pipe(data, window_ns=30_000_000)
    return CLOCK.sub("HH:MM:SS ", text.split("\n\n")[-1])


def test_live_shows_the_top_reason_beside_d_rows(monkeypatch):
    frame = _final_frame(WHY.read_bytes())
    if os.environ.get("PSTATE_REGEN") == "1":
        LIVE_GOLDEN.write_text(frame)
    assert frame == LIVE_GOLDEN.read_text()
    assert max(len(x) for x in frame.splitlines()) <= 80
    rows = {x.split()[1]: x for x in frame.splitlines()[1:7]}
    assert rows["100"].endswith(" __iomap_dio_rw")  # dd's D: 7 ms of it, 2 ms submit_bio_wait
    assert not rows["400"].endswith("do_nanosleep")  # S reasons are not D rows
    monkeypatch.setattr(reader, "_parse_states", None)  # the careful path: the same frame
    assert _final_frame(WHY.read_bytes()) == frame


def wake(ts, tid, reason, dur):
    return orjson.dumps({"type": "state", "ts": ts, "cpu": 0, "pid": tid, "tid": tid, "comm": "t",
                         "from": "uninterruptible", "to": "runnable", "dur_ns": dur, "cause": "wakeup",
                         "stack_id": 1, "reason": reason}) + b"\n"


def test_the_top_reason_is_the_one_with_most_d_time_in_the_window():
    f, model = feeder()
    f.feed(wake(1000, 7, "old_wait", 900) + line(2000, 7, "running", "sleeping")
           + wake(5000, 7, "folio_wait_writeback", 300) + wake(6000, 7, "blkdev_issue_flush", 200)
           + wake(7000, 7, "blkdev_issue_flush", 200) + line(8000, 8, "running", "sleeping"))
    f.finish()
    assert model.events == {7: 5, 8: 1}  # the rows handed out whole reach the model too
    assert f.reasons.top(7, 0) == "old_wait"
    assert f.reasons.top(7, 4000) == "blkdev_issue_flush"  # 400 ns of it since 4000, 300 of the other
    assert f.reasons.top(8, 0) == ""

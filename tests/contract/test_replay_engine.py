"""The replay engine (pstate.stream.replayer): pacing with a fake clock, the block
reader, the quick framing check, and that the quick path writes exactly
what the line-by-line path writes."""

from __future__ import annotations

import json
import random

import pytest
from click.testing import CliRunner

from pstate.stream import replayer
from pstate.main import cli as pstate_cli
from pstate.stream.replayer import Pacer, Replayer, Stop
from pstate.stream.streamio import LineWriter
from conftest import TESTS

S = 1_000_000_000
MS = 1_000_000


class FakeTime:
    """A monotonic clock that only moves when slept on (plus optional lateness)."""

    def __init__(self, late_ns: int = 0):
        self.now = 1_000 * S
        self.late_ns = late_ns
        self.sleeps: list[float] = []
        self.flushes = 0

    def clock(self) -> int:
        return self.now

    def sleep(self, secs: float) -> None:
        self.sleeps.append(secs)
        self.now += int(secs * 1e9) + self.late_ns

    def flush(self) -> None:
        self.flushes += 1


def pacer(speed, late_ns=0):
    ft = FakeTime(late_ns)
    return Pacer(speed, clock=ft.clock, sleep=ft.sleep, before_sleep=ft.flush), ft


def test_pacer_keeps_the_original_spacing():
    p, ft = pacer(1.0)
    start = ft.now
    written = []
    for ts in (7 * S, 7 * S + 500 * MS, 8 * S, 9 * S):
        p.wait(ts)
        written.append(ft.now - start)
    assert written == [0, 500 * MS, 1 * S, 2 * S]
    assert ft.flushes == 3  # before every sleep


def test_pacer_divides_by_speed():
    p, ft = pacer(10.0)
    start = ft.now
    for ts in range(0, 2 * S + 1, 100 * MS):
        p.wait(ts)
    assert ft.now - start == pytest.approx(200 * MS, abs=1000)


def test_pacer_does_not_accumulate_lateness():
    p, ft = pacer(1.0, late_ns=3 * MS)  # every sleep overshoots by 3 ms
    start = ft.now
    for i in range(101):
        p.wait(i * 10 * MS)
    # Each wake-up is 3 ms late, but deadlines are absolute: the end is 3 ms late, not 300.
    assert ft.now - start == 1 * S + 3 * MS


def test_pacer_never_sleeps_for_earlier_or_near_timestamps():
    p, ft = pacer(1.0)
    p.wait(10 * S)
    p.wait(11 * S)
    p.wait(10 * S + 500 * MS)  # another CPU's event, a little older: written at once
    p.wait(11 * S + MS // 2)  # due in half a millisecond: not worth a sleep
    assert len(ft.sleeps) == 1


def test_pacer_rebase_skips_the_gap_between_recordings():
    p, ft = pacer(1.0)
    start = ft.now
    p.wait(50 * S)
    p.wait(51 * S)
    p.rebase()
    p.wait(3 * S)  # a later recording of another boot: its clock restarted
    assert ft.now - start == 1 * S
    p.wait(4 * S)
    assert ft.now - start == 2 * S


def test_no_wait_never_sleeps():
    p, ft = pacer(None)
    for ts in (0, 5 * S, 10 * S):
        p.wait(ts)
    assert ft.sleeps == []


def test_a_signal_while_sleeping_stops_the_replay():
    rep = Replayer(LineWriter.__new__(LineWriter), speed=1.0, sleep=lambda s: rep.on_signal(2, None))
    with pytest.raises(Stop):
        rep._sleep(1.0)
    assert rep.stop_reason == "signal"
    rep2 = Replayer(LineWriter.__new__(LineWriter), speed=1.0)
    rep2.on_signal(15, None)  # outside a sleep or a read: only noted, checked at the next line
    assert rep2.stop_reason == "signal"


# --- quick path == line by line ---------------------------------------------------

EV = b'{"type":"state","ts":1,"cpu":0,"pid":1,"tid":1,"comm":"a","from":"running","to":"sleeping","dur_ns":5}\n'


def big_recording(n=30_000, seed=3) -> bytes:
    rnd = random.Random(seed)
    meta = {"type": "meta", "schema": 1, "source": "record", "ts": 10 * S, "wall_ns": 1_764_500_000 * S}
    out = [json.dumps(meta)]
    ts = 10 * S
    for i in range(n):
        ts += rnd.randint(1000, 100_000)
        out.append(json.dumps({"type": "state", "ts": ts, "cpu": i % 4, "pid": 10 + i % 5, "tid": 10 + i % 9,
                               "comm": "w", "from": "running", "to": "sleeping", "dur_ns": i, "cause": "switch_out"},
                              separators=(",", ":")))
        if i % 4000 == 1999:
            out.append(json.dumps({"type": "loss", "ts": ts, "reason": "ringbuf_full", "count": 2, "since_ts": ts - 9}))
        if i == 9000:
            out.append("not json at all")
        if i == 15000:
            out.append(out[-1][:50])  # cut short
        if i == 17000:
            out.append(json.dumps({**meta, "ts": ts + 1}))  # a second recording
        if i == 21000:
            out.append(out[-1][:30] + out[-2])  # torn
    return ("\n".join(out) + "\n").encode()


def run_cli(args, stdin: bytes):
    r = CliRunner().invoke(pstate_cli, ["replay", *args], input=stdin, prog_name="pstate")
    return r.exit_code, r.stdout_bytes, r.stderr


def test_quick_path_writes_what_the_line_by_line_path_writes(monkeypatch):
    data = big_recording()
    quick = run_cli(["--no-wait"], data)
    monkeypatch.setattr(replayer, "_plain_states", None)
    slow = run_cli(["--no-wait"], data)
    assert quick == slow
    code, out, err = quick
    assert code == 0
    assert err == ("pstate replay: warning: skipped 3 lines: not valid JSON (first at <stdin>:9005)\n")
    end = json.loads(out.splitlines()[-1])
    assert (end["events"], end["lost"], end["replay_skipped"]) == (30_000, 8 * 2, 3)
    assert out.count(b'"replayed":true') == 2


SELECTING = [["--no-wait", "-p", "11", "-p", "13"], ["--no-wait", "-t", "12", "--state", "sleeping"],
             ["--no-wait", "-b", "+100ms", "-e", "+500ms"], ["--speed", "1e9"], ["--speed", "1e9", "--cpu", "1"],
             ["--no-wait", "--strict"], ["--no-wait", "--min-dur", "10us"]]


@pytest.mark.parametrize("args", SELECTING, ids=lambda a: " ".join(a))
def test_every_mode_writes_with_the_native_rows_what_it_writes_without(monkeypatch, args):
    data = big_recording(20_000)  # bad lines, a cut one, a second recording, a torn one
    quick = run_cli(args, data)
    monkeypatch.setattr(replayer, "_parse_states", None)
    monkeypatch.setattr(replayer, "_plain_states", None)
    assert run_cli(args, data) == quick
    if "--strict" in args:
        assert quick[0] == 65 and "<stdin>:9005: not valid JSON" in quick[2]
    else:
        assert quick[0] == 0 and 0 < json.loads(quick[1].splitlines()[-1])["events"] <= 20_000


def test_overlong_lines_are_skipped_in_both_paths(monkeypatch):
    data = big_recording(3000)
    lines = data.split(b"\n")
    lines.insert(1500, b'{"type":"state","comm":"' + b"x" * (1 << 20) + b'"}')
    data = b"\n".join(lines)
    quick = run_cli(["--no-wait"], data)
    monkeypatch.setattr(replayer, "_plain_states", None)
    slow = run_cli(["--no-wait"], data)
    assert quick == slow
    assert quick[2] == "pstate replay: warning: skipped 1 line: line longer than 1048576 bytes (first at <stdin>:1501)\n"
    assert json.loads(quick[1].splitlines()[-1])["events"] == 3000


@pytest.mark.parametrize("bad, why", [
    (b'{"type":"state","ts":5,"comm":"\xff\xfe","cpu":0,"pid":1,"tid":1,"from":"a","to":"b"}', "not valid JSON"),
    (b'{"type":"state","ts":5,"comm":' + b"[" * 1025 + b"]" * 1025 + b"}", "not valid JSON"),
    (b'{"type":"state","ts":5,"comm":' + b'{"a":' * 2000 + b"1" + b"}" * 2000 + b"}", "not valid JSON"),
    (b'{"type":"state","ts":5,"comm":"a\x00","cpu":0,"pid":1,"tid":1,"from":"a","to":"b"}', "not valid JSON"),
    (b'{"type":"state","ts":5,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b","x":[1]}', None),  # valid: kept
])
def test_quick_path_passes_only_lines_a_reader_parses(monkeypatch, bad, why):
    # Bad UTF-8, nesting past orjson's limit and NUL bytes in a well-framed line
    # are noticed by the quick check: the line is parsed, skipped and counted.
    lines = big_recording(6000).split(b"\n")
    lines.insert(3000, bad)
    data = b"\n".join(lines)
    quick = run_cli(["--no-wait"], data)
    monkeypatch.setattr(replayer, "_plain_states", None)
    assert run_cli(["--no-wait"], data) == quick
    code, out, err = quick
    assert code == 0
    for line in out.splitlines():
        json.loads(line)
    assert (bad + b"\n" in out) == (why is None)
    if why:
        assert f"skipped 1 line: {why} (first at <stdin>:3001)" in err


def test_quick_path_passes_no_line_the_reader_rejects():
    # A well-framed line with a bad value is skipped and counted by --no-wait
    # too, as by every other mode (and is an error with --strict): replay
    # passes only lines stats would read.
    bad = b'{"type":"state","ts":"late","cpu":0,"pid":1,"tid":1,"comm":"x","from":"a","to":"b","dur_ns":1}\n'
    lines = big_recording(2000).split(b"\n")
    lines.insert(1000, bad.rstrip(b"\n"))
    data = b"\n".join(lines)
    warning = 'pstate replay: warning: skipped 1 line: bad or missing "ts" (first at <stdin>:1001)\n'
    for args in (["--no-wait"], ["--speed", "1e9"]):
        code, out, err = run_cli(args, data)
        assert bad not in out and (code, err) == (0, warning)
        assert json.loads(out.splitlines()[-1])["replay_skipped"] == 1
    code, out, err = run_cli(["--no-wait", "--strict"], data)
    assert (code, err) == (65, 'Error: <stdin>:1001: bad or missing "ts"\n')


def test_snapshot_removed_before_it_is_read_is_skipped(tmp_path):
    from pathlib import Path

    snap = sorted((TESTS / "data" / "replay" / "snaps").glob("pstate-snap-*.jsonl"))[0]
    out = tmp_path / "out.jsonl"
    w = LineWriter(str(out))
    rep = Replayer(w, speed=None)
    gone = str(tmp_path / "pstate-snap-20251130T105399.000000Z-000009.jsonl")
    assert rep.run([(str(snap), True), (gone, True)]) == "eof"
    w.close()
    assert rep.stats.skipped == {"snapshot removed before it was read": 1}
    end = json.loads(out.read_text().splitlines()[-1])
    assert (end["snapshots"], end["replay_skipped"]) == (1, 1)


# --- hostile input: no traceback, valid output -------------------------------------

META = b'{"type":"meta","schema":1,"source":"record","ts":1000}\n'


def test_a_type_that_is_a_list_or_an_object_is_skipped():
    data = META + b'{"type":[]}\n{"type":{}}\n' + EV
    code, out, err = run_cli(["--no-wait"], data)
    assert code == 0
    assert err == 'pstate replay: warning: skipped 2 lines: no string "type" field (first at <stdin>:2)\n'
    assert out.count(b'"type":"state"') == 1


@pytest.mark.parametrize("v, ok", [(2**63 - 1, True), (2**63, False), (2**64 - 1, False), (-1, False)])
def test_integer_policy_in_every_mode(v, ok):
    rec = EV.replace(b'"ts":1,', b'"ts":%d,' % v)
    for args in (["--no-wait"], ["--speed", "1e18"], ["--no-wait", "--strict"]):
        code, out, err = run_cli(args, META + rec)
        end = json.loads(out.splitlines()[-1])
        if ok:
            assert (code, err) == (0, ""), args
            assert end["ts"] == v
        else:  # every mode, the quick path too, checks values as the reader does
            assert code == (65 if "--strict" in args else 0), args
            assert 'bad or missing "ts"' in err and rec not in out


def test_loss_counts_saturate_in_the_trailer():
    loss = b'{"type":"loss","ts":1001,"reason":"map_full","count":%d}\n' % (2**63 - 1)
    code, out, err = run_cli(["--no-wait"], META + loss * 3)
    assert (code, err) == (0, "")
    end = json.loads(out.splitlines()[-1])
    assert end["lost"] == end["lost_map_full"] == 2**63 - 1
    assert out.count(b'"type":"loss"') == 3


def test_times_outside_the_policy_in_meta_loss_and_rate_do_not_reach_the_trailer():
    data = (b'{"type":"meta","schema":1,"ts":18446744073709551615,"wall_ns":-5}\n'
            b'{"type":"loss","ts":18446744073709551615,"since_ts":-1,"reason":"map_full","count":1}\n'
            b'{"type":"rate","ts":-9223372036854775808,"sample_every":2}\n')
    for args in (["--no-wait"], ["--no-wait", "-b", "+1s"], ["--speed", "1e18"]):
        code, out, err = run_cli(args, data)
        assert code == 0, (args, err)
        recs = [json.loads(x) for x in out.splitlines()]
        assert recs[-1]["type"] == "end" and "ts" not in recs[-1]


def test_a_byte_order_mark_starts_each_file(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(b"\xef\xbb\xbf" + META + EV)
    b.write_bytes(b"\xef\xbb\xbf" + META + EV + b"\xef\xbb\xbf" + EV)  # not at the start: a bad line
    code, out, err = run_cli(["--no-wait", str(a), str(b)], b"")
    assert code == 0
    assert err == f"pstate replay: warning: skipped 1 line: not valid JSON (first at {b}:3)\n"
    assert out.count(b'"replayed":true') == 2 and out.count(b'"type":"state"') == 2


def test_a_cut_in_an_earlier_file_stays_reported(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_bytes(META + EV[:30])
    b.write_bytes(META + EV.rstrip(b"\n"))  # complete, without a final newline
    code, out, err = run_cli(["--no-wait", str(a), str(b)], b"")
    assert (code, err) == (0, f"pstate replay: warning: truncated final record at {a}: byte {len(META)}, line 2\n")
    assert out.count(b'"type":"state"') == 1


@pytest.mark.parametrize("args", [["-b", "+99999999999h"], ["-e", "+9999999999999999999s"], ["-b", "@99999999999999"]])
def test_window_bounds_far_outside_the_recording_are_written_in_range(args):
    data = b'{"type":"meta","schema":1,"ts":1000,"wall_ns":1764500000000000000}\n' + EV.replace(b'"ts":1,', b'"ts":1001,')
    code, out, err = run_cli(["--no-wait", *args], data)
    assert code == 0, err
    meta = json.loads(out.splitlines()[0])
    assert 0 <= meta.get("replay_begin_ts", 0) <= 2**63 and 0 <= meta.get("replay_end_ts", 0) <= 2**63


def test_a_huge_jump_in_ts_is_shortened_and_said():
    now = [0]
    slept = []

    def sleep(secs):
        slept.append(secs)
        now[0] += int(secs * 1e9)

    capped = []
    p = Pacer(2.0, clock=lambda: now[0], sleep=sleep, on_cap=lambda ts, gap: capped.append((ts, gap)))
    p.wait(1000)
    p.wait(1000 + S)  # 1 s of recorded time: 0.5 s at speed 2
    p.wait((1 << 63) - 1)  # valid, and centuries ahead: 60 s of recorded time at most
    p.wait((1 << 63) - 1 + 0)
    assert slept == [pytest.approx(0.5), pytest.approx(30.0)]
    assert capped == [((1 << 63) - 1, (1 << 63) - 1 - 1000 - S)]
    p.wait((1 << 63) - 1)  # the timeline continues from where it was capped
    assert len(slept) == 2


def test_replay_says_when_it_shortens_a_gap(tmp_path):
    meta = b'{"type":"meta","schema":1,"source":"record","ts":1000}\n'
    far = EV.replace(b'"ts":1,', b'"ts":%d,' % ((1 << 63) - 1))
    path = tmp_path / "gap.jsonl"
    path.write_bytes(meta + EV.replace(b'"ts":1,', b'"ts":1000,') + far)
    r = CliRunner().invoke(pstate_cli, ["replay", "--speed", "1e6", str(path)], prog_name="pstate")
    assert r.exit_code == 0 and far in r.stdout_bytes
    assert f"pstate replay: note: {path} jumps " in r.stderr and "longer gaps are shortened" in r.stderr


def test_the_end_trailer_has_the_latest_ts_of_events_that_go_back_a_little(monkeypatch):
    """Events of several CPUs interleave: the trailer's ts is the largest
    written, not the last, in the bulk path as in the careful one."""
    meta = b'{"type":"meta","schema":1,"source":"record","ts":900}\n'
    data = meta + EV.replace(b'"ts":1,', b'"ts":1001,') + EV.replace(b'"ts":1,', b'"ts":1000,')
    quick = run_cli(["--no-wait"], data)
    assert json.loads(quick[1].splitlines()[-1])["ts"] == 1001
    monkeypatch.setattr(replayer, "_plain_states", None)
    assert run_cli(["--no-wait"], data) == quick

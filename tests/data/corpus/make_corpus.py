"""Write the seed files of the reader fuzz corpus (tests/data/corpus/*.jsonl).

Run from anywhere: python tests/data/corpus/make_corpus.py. The files are
committed; this script only documents and regenerates the seeds. Inputs that
once crashed a reader are committed as crash-*.jsonl and never regenerated.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent

META = {"type": "meta", "schema": 1, "source": "record", "tool": "pstate", "version": "0.1.0", "host": "corpus",
        "kernel": "6.1.0-test", "boot_id": "00000000-0000-4000-8000-000000000000", "clock": "monotonic",
        "ts": 1_000_000_000, "wall_ns": 1_700_000_000_000_000_000, "ncpu": 2}
T0 = 1_000_000_000


def line(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def state(ts=T0, tid=11, pid=10, frm="running", to="sleeping", dur=1_000_000, cause="switch_out", **kw) -> dict:
    r = {"type": "state", "ts": ts, "cpu": 0, "pid": pid, "tid": tid, "comm": "worker", "from": frm, "to": to,
         "dur_ns": dur, "cause": cause}
    r.update(kw)
    return r


def valid_stream() -> bytes:
    out = [line(META)]
    ts = T0
    for i in range(4):
        out.append(line(state(ts=ts, frm="runnable", to="running", dur=20_000, cause="switch_in", prio=120,
                              prev_tid=0)))
        ts += 2_000_000
        out.append(line(state(ts=ts, frm="running", to="sleeping", dur=2_000_000, voluntary=True, kstate="S",
                              prio=120, next_tid=0)))
        ts += 5_000_000
        out.append(line(state(ts=ts, frm="sleeping", to="runnable", dur=5_000_000, cause="wakeup", waker_tid=1,
                              waker_pid=1, target_cpu=0)))
    out.append(line({"type": "end", "ts": ts, "reason": "eof", "events": 12, "lost": 0}))
    return b"".join(out)


def raw_field(base: dict, key: str, token: bytes) -> bytes:
    """A record whose field `key` holds the raw JSON text `token` (NaN, 1e400, bad UTF-8, ...)."""
    b = dict(base)
    b[key] = "@@RAW@@"
    return line(b).replace(b'"@@RAW@@"', token)


def seeds() -> dict[str, bytes]:
    s: dict[str, bytes] = {}
    valid = valid_stream()
    s["valid.jsonl"] = valid
    s["empty.jsonl"] = b""
    s["only-newlines.jsonl"] = b"\n" * 50
    s["whitespace.jsonl"] = line(META) + b" \t \n\f\n\v\n\r\n  " + line(state())
    s["meta-only.jsonl"] = line(META)
    s["crlf.jsonl"] = valid.replace(b"\n", b"\r\n")
    s["cr-only.jsonl"] = valid.replace(b"\n", b"\r")
    s["bom.jsonl"] = b"\xef\xbb\xbf" + valid
    s["utf16.jsonl"] = valid.decode().encode("utf-16")
    s["no-final-newline.jsonl"] = valid.rstrip(b"\n")
    s["truncated-mid-record.jsonl"] = valid[: len(valid) - 40]
    s["truncated-mid-string.jsonl"] = valid[: valid.rindex(b'"worker"') + 4]
    s["malformed-json.jsonl"] = line(META) + b"".join(x + b"\n" for x in [
        b"{", b"}", b"[", b"]", b'{"type":', b'{"type":"state",}', b"nul", b"tru", b"{'type':'state'}",
        b'{type:"state"}', b'{"type":"state" "ts":1}', b'{"type":"state"}}', b'{"type":"state"}{"type":"end"}',
        b'{"a":1,}', b'{"a":01}', b'{"a":.5}', b'{"a":1.}', b'{"a":+1}', b'{"a":0x10}', b'{"a":"\\x41"}',
        b'{"a":"\\u12"}', b'{"a":"tab\there"}', b"\x00", b"/* comment */ {}", b"{} // comment", b"-",
    ]) + line(state())
    s["deep-nesting.jsonl"] = line(META) + b"".join([
        b"[" * 10_000 + b"]" * 10_000 + b"\n",
        b"[" * 10_000 + b"\n",
        b'{"a":' * 5_000 + b"1" + b"}" * 5_000 + b"\n",
        b'{"type":"state","ts":1,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b","comm":' + b"[" * 3000
        + b"]" * 3000 + b"}\n",
        b'{"type":"state","ts":1,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b","x":' + b"[" * 100
        + b"]" * 100 + b"}\n",
    ]) + line(state())
    base = state()
    huge = [b"18446744073709551615", b"18446744073709551616", b"-1", b"-0", b"0.0", b"1e308", b"1e400", b"-1e400",
            b"123456789012345678901234567890", b"-9223372036854775809", b"4.9e-324", b"1E2", b"NaN", b"Infinity",
            b"-Infinity", b"nan", b"inf"]
    s["huge-numbers.jsonl"] = line(META) + b"".join(
        raw_field(base, key, tok) for key in ("ts", "cpu", "pid", "tid", "dur_ns", "prio", "waker_tid", "next_tid")
        for tok in huge) + b"".join(
        raw_field({"type": "loss", "ts": T0, "reason": "ringbuf_full", "since_ts": 0}, "count", tok) for tok in huge
    ) + b"".join(line({"type": "loss", "ts": T0, "reason": "map_full", "count": 2**64 - 1}) for _ in range(3)) \
        + line(state())
    s["nul-bytes.jsonl"] = line(META) + b"\x00" * 100 + b"\n" + line(state()).replace(b"worker", b"wor\x00ker") \
        + raw_field(base, "comm", b'"a\\u0000b"') + b'{"type":"state"}\x00\n' + b"\x00" + line(state()) \
        + line(state())
    bad_utf8 = [b'"\xff"', b'"\xc0\xaf"', b'"\xed\xa0\x80"', b'"\xf4\x90\x80\x80"', b'"\xe6\x97"', b'"\\ud800"',
                b'"\\udc00\\ud800"', b'"\\ud83d\\ude00"', b'"\x80abc"']
    s["bad-utf8.jsonl"] = line(META) + b"".join(
        raw_field(base, key, tok) for key in ("comm", "from", "to", "cause", "type") for tok in bad_utf8
    ) + raw_field(META, "host", b'"\xff\xfe"') + line(state())
    wrong = [b"null", b"true", b"false", b'"12"', b"[]", b"[1]", b"{}", b'{"a":1}', b"1.5", b'""', b"-5", b"0"]
    keys = ["type", "ts", "cpu", "pid", "tid", "comm", "from", "to", "dur_ns", "cause", "voluntary", "kstate",
            "prio", "next_tid", "prev_tid", "waker_tid", "waker_pid", "target_cpu"]
    s["wrong-types-state.jsonl"] = line(META) + b"".join(
        raw_field(base, k, tok) for k in keys for tok in wrong) + line(state())
    missing = b"".join(line({k: v for k, v in base.items() if k != drop}) for drop in base)
    s["missing-fields.jsonl"] = line(META) + missing + line(state())
    life = {"fork": {"child_pid": 12, "child_tid": 12, "thread": False}, "exec": {"old_tid": 11},
            "exit": {"group_dead": True}}
    out = [line(META)]
    for t, extra in life.items():
        rec = {"type": t, "ts": T0, "cpu": 0, "pid": 10, "tid": 11, "comm": "worker", **extra}
        out.append(line(rec))
        for k in list(extra) + ["comm"]:
            for tok in wrong:
                out.append(raw_field(rec, k, tok))
    s["wrong-types-lifecycle.jsonl"] = b"".join(out) + line(state())
    out = [line(META)]
    for rec in ({"type": "loss", "ts": T0, "reason": "ringbuf_full", "count": 3, "since_ts": 0},
                {"type": "rate", "ts": T0, "sample_every": 2, "events_per_s": 100},
                {"type": "end", "ts": T0, "reason": "eof", "events": 1, "lost": 0, "lost_ringbuf_full": 0,
                 "duration_ns": 5}):
        for k in rec:
            for tok in wrong:
                out.append(raw_field(rec, k, tok))
    s["wrong-types-loss-rate-end.jsonl"] = b"".join(out) + line(state())
    out = [line(META)]
    for k in META:
        for tok in wrong:
            if k != "type":
                out.append(raw_field(META, k, tok))
    s["wrong-types-meta.jsonl"] = b"".join(out) + line(state())
    weird_states = ["", "state_Q", "levitating", "RUNNING", "running ", "x" * 10_000, "日本", "\u202e", "\x1b[2J",
                    "null", "__proto__", "0"]
    s["unknown-states.jsonl"] = line(META) + b"".join(
        line(state(ts=T0 + i, frm=a, to=b)) for i, (a, b) in enumerate(
            [(w, "running") for w in weird_states] + [("running", w) for w in weird_states])) \
        + b"".join(line(state(ts=T0 + 100 + i, cause=c)) for i, c in enumerate(["", "teleport", "switch_in", "reap"]))
    s["newer-schema.jsonl"] = line({**META, "schema": 2, "version": "9.9.9"}) + line(state())
    s["newer-schema-later.jsonl"] = valid + line({**META, "schema": 99}) + line(state())
    s["meta-weird.jsonl"] = b"".join(line(m) for m in (
        {"type": "meta", "schema": 0}, {"type": "meta", "schema": -1}, {"type": "meta", "schema": 1},
        {**META, "ts": None, "wall_ns": "x", "ncpu": -1, "states": [], "kernel_states": {"0x1": 5}},
        {**META, "ts": 2**64 - 1, "wall_ns": -(2**63)}, {**META, "source": "snap"},
        {**META, "filter_pid": "x", "filter_comm": [None], "filter_min_dur_ns": -1})) + line(state())
    s["duplicate-keys.jsonl"] = line(META) + b"".join(x + b"\n" for x in [
        b'{"type":"state","type":"meta","schema":1}',
        b'{"type":"meta","schema":1,"type":"state","ts":1,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b"}',
        b'{"type":"state","ts":1,"cpu":0,"pid":1,"tid":1,"from":"a","to":"b","dur_ns":5,"dur_ns":"x"}',
    ]) + line(state())
    ev = []
    for i in range(20):  # time runs backwards, durations exceed timestamps, pids change under a tid
        ev.append(line(state(ts=T0 - i * 1000, dur=T0 * 10, pid=10 + i % 3)))
    ev.append(line(state(ts=0, dur=2**64 - 1)))
    ev.append(line(state(ts=2**64 - 1, dur=0)))
    ev.append(line(state(ts=5, tid=0, pid=0, frm="running", to="preempted")))
    s["time-travel.jsonl"] = line(META) + b"".join(ev) + line(state(ts=T0)) + line(META) + line(state(ts=1))
    s["events-before-meta.jsonl"] = line(state()) + line(state(ts=T0 + 1)) + line(META) + line(state(ts=T0 + 2))
    s["control-chars.jsonl"] = line(META) + b"".join(line(state(ts=T0 + i, comm=c)) for i, c in enumerate(
        ["\x1b[2J\x1b[H", "\x1b]0;title\x07", "a\rb", "\t\t", "\u0085x", "\u2028", "%s%n%x", "{}", "\ud7ff"]))
    s["huge-comm.jsonl"] = line(META) + line(state(comm="c" * 20_000)) + line(state(comm="日" * 3_000)) \
        + line(state())
    s["many-tasks.jsonl"] = line(META) + b"".join(
        line(state(ts=T0 + i, tid=1000 + i, pid=1000 + i // 4, frm="sleeping", to="runnable", cause="wakeup"))
        for i in range(500))
    snap_meta = {**META, "source": "snap", "interval_start_ts": T0, "interval_end_ts": T0 + 10**10,
                 "wall_start_ns": 1, "wall_end_ns": 10**10, "seq": 1, "mode": "cumulative", "truncated": False,
                 "map_full": 0, "states": {}}
    task = {"type": "task", "ts": T0 + 10**10, "pid": 1, "tid": 1, "comm": "init", "start_ts": 0,
            "state": "sleeping", "state_since_ts": None, "exited": False, "exit_ts": None, "running_ns": 5,
            "sleeping_ns": 10**10 - 5, "nvcsw": 1, "nivcsw": 0, "wakeups": 1}
    out = [line(snap_meta), line(task)]
    for k in task:
        for tok in wrong + [b"1e400", b"NaN", b"18446744073709551616", b"-1"]:
            out.append(raw_field(task, k, tok))
    out.append(line({"type": "end", "ts": T0 + 10**10, "tasks": "many", "reason": 5}))
    s["snap-wrong-types.jsonl"] = b"".join(out)
    s["snap-meta-then-events.jsonl"] = line(snap_meta) + valid
    s["not-json-at-all.jsonl"] = bytes(range(256)) * 8 + b"\n" + b"\x89PNG\r\n\x1a\n" + b"\xff" * 300
    return s


def main() -> None:
    for name, data in seeds().items():
        (HERE / name).write_bytes(data)
    print(f"wrote {len(seeds())} files to {HERE}")


if __name__ == "__main__":
    main()

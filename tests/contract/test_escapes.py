"""Escape codes in names (comm, process title, cgroup path, kernel frame)
through every command and output format.

Any user names their threads and processes, and (in a delegated subtree)
their cgroups: a name such as ESC ] 0 ; pwned BEL ESC [ 2 J would set root's
window title and clear the screen, a newline forge a table row. So a format
a terminal shows (tables, heat maps, heat --live, the snapshot tables,
doctor's table, the dot graphs Graphviz draws) shows every control character
escaped, and a machine format (JSON, CSV, folded, the traces, the snapshot
files) keeps the exact text.

The cases are generated from the commands themselves (pstate.main.COMMANDS
and each one's --format choices): a command or format added later fails
test_every_command_and_format_is_classified until it is given here, as a
terminal or a machine output, with its runs.
"""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from conftest import TESTS, clean_env, pstate_cmd
from pstate.main import COMMANDS, cli
from pstate.render import snaptables

HERE = TESTS
WHY = HERE / "data" / "stats" / "why.jsonl"
SERIES = HERE / "data" / "snap" / "series"

# comm: at most 15 bytes, as the kernel keeps it (OSC title, BEL, DEL, C1 CSI)
EVIL_COMM = "\x1b]0;pwned\x07\x7f\u009b"
EVIL_COMM2 = "\u202epi\n\x1b[2Jng"  # a bidi override, a line break, a screen clear
EVIL_TITLE = "\x1b]0;pwned\x07\x1b[2J\x1b[1;1HFAKE\nrow \u202eevil \u009b31m\u2028end"
EVIL_CGROUP = "/evil\x1b[2J.slice/x\x1b]0;pw\x07\u009b.service"
EVIL_UNIT = "x\x1b]0;pw\x07\u009b.service"
EVIL_FN = "pwn\x1b[2J\x1b[H\x07\u009b_rw"  # no ';', '+' or ' ': a frame is "name+0xoff [mod]"
EVIL_HOST = "host\x1b[2J"
NAMES = (EVIL_COMM, EVIL_COMM2, EVIL_TITLE, EVIL_CGROUP, EVIL_UNIT, EVIL_FN)

TERMINAL, MACHINE = "terminal", "machine"
# what a terminal must never get from a name: C0 controls (but the layout's
# line breaks), DEL, C1, the bidi formatting characters, U+2028/U+2029
UNSAFE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
SGR = re.compile(r"\x1b\[[0-9;]*m")  # heat's colours: the renderer's own escape codes
ESCAPED = ("\\x1b", "\\x07", "\\x9b", "\\u202e")  # a name drawn, escaped


# --- inputs --------------------------------------------------------------------------


def evil_recording(path: Path) -> Path:
    """why.jsonl (stacks, wakers, antagonists known by construction) with
    evil names: dd's comm, ping's comm, a cgroup and titles for every
    process, one kernel frame (the reason of dd's stack 1), the host."""
    out = []
    for line in WHY.read_bytes().splitlines():
        rec = orjson.loads(line)
        if rec.get("comm") == "dd":
            rec["comm"] = EVIL_COMM
        elif rec.get("comm") == "ping":
            rec["comm"] = EVIL_COMM2
        if rec["type"] == "stack":
            rec["frames"] = rec["frames"].replace("__iomap_dio_rw", EVIL_FN)
        if rec.get("reason") == "__iomap_dio_rw":
            rec["reason"] = EVIL_FN
        out.append(rec)
        if rec["type"] == "meta":
            rec["host"] = EVIL_HOST  # (heat's footer names it)
            ts = rec["ts"]
            out.append({"type": "cgroup", "ts": ts, "cgroup": 77, "path": EVIL_CGROUP, "gone": False})
            for pid in (100, 200, 201, 300, 301, 400):
                out.append({"type": "process", "ts": ts, "pid": pid, "comm": "x", "title": f"{EVIL_TITLE} {pid}",
                            "exe": "/usr/bin/x", "ppid": 1, "cgroup": 77, "gone": False, "why": "first"})
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in out))
    return path


def evil_snapshots(directory: Path) -> Path:
    """The first run of the snapshot series (tests/data/snap) with evil
    names: leaky's comm, title and cgroup, the host, and a hist row of the
    evil unit in each snapshot (the latency table)."""
    from pstate.snapshots import histograms

    directory.mkdir()
    names = sorted(n for n in os.listdir(SERIES) if "T0801" in n or "T0802" in n)
    assert len(names) >= 4
    for i, name in enumerate(names):
        out = []
        for line in (SERIES / name).read_bytes().splitlines():
            rec = orjson.loads(line)
            if rec["type"] == "meta":
                rec["host"] = EVIL_HOST
            elif rec["type"] == "task" and rec["comm"] == "leaky":
                rec.update(comm=EVIL_COMM, title=EVIL_TITLE, cgroup_path=EVIL_CGROUP)
            elif rec["type"] == "end":
                cum = [0] * len(histograms.UPPER_NS)
                for b in range(len(cum)):
                    cum[b] = (i + 1) * (3 if b >= 10 else 0) + (i + 1) * (2 if b >= 14 else 0)
                out.append({"type": "hist", "ts": rec["ts"], "by": "unit", "unit": EVIL_UNIT, "kind": "uninterruptible",
                            "count": cum[-1], "sum_ns": (i + 1) * 5_000_000,
                            **dict(zip(histograms.bucket_fields(), cum))})
                rec["hists"] = 1
            out.append(rec)
        (directory / name).write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in out))
    return directory


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    base = tmp_path_factory.mktemp("escapes")
    return {"rec": evil_recording(base / "evil.jsonl"), "snaps": evil_snapshots(base / "snaps"), "tmp": base}


# --- what a terminal may get, what a machine format must keep ---------------------------


def assert_shown_safely(what: str, data: bytes, colour: bool = False, drawn: bool = True) -> None:
    """No raw control character (but line breaks, and with colour the
    renderer's own colour codes); drawn: some evil name was drawn, escaped."""
    text = data.decode("utf-8")  # strict: no byte of a sequence that is not UTF-8 either
    if colour:
        text = SGR.sub("", text)
    bad = UNSAFE.search(text)
    assert bad is None, f"{what}: raw {bad.group()!r} at {bad.start()}: {text[max(0, bad.start() - 80):bad.start() + 40]!r}"
    assert not drawn or any(e in text for e in ESCAPED), f"{what}: no evil name drawn (escaped):\n{text}"
    for line in text.splitlines():  # the title's newline forged no row
        assert not line.startswith(("FAKE", "row ")), f"{what}: a forged line: {line!r}"


def strings_of(obj) -> set:
    if isinstance(obj, str):
        return {obj}
    if isinstance(obj, dict):
        return set().union(*(strings_of(k) | strings_of(v) for k, v in obj.items())) if obj else set()
    if isinstance(obj, list):
        return set().union(*(strings_of(v) for v in obj)) if obj else set()
    return set()


def assert_kept(what: str, strings: set, names) -> None:
    """Each of names is one of the strings (exactly), and none of the
    strings holds a name escaped for display."""
    for name in names:
        assert any(name in s for s in strings), f"{what}: {name!r} not kept exactly"
    shown = [s for s in strings if any(e in s for e in ESCAPED)]
    assert not shown, f"{what}: names escaped in a machine format: {shown[:3]!r}"


def json_strings(data: bytes) -> set:
    data = data.strip()
    try:
        return strings_of(orjson.loads(data))
    except orjson.JSONDecodeError:  # JSON lines
        return set().union(*(strings_of(orjson.loads(x)) for x in data.splitlines() if x.strip()))


def csv_strings(data: bytes) -> set:
    text = data.decode("utf-8")
    lines = [x for x in io.StringIO(text, newline="").read().split("\n") if not x.startswith("#")]
    return {c for row in csv.reader(io.StringIO("\n".join(lines), newline="")) for c in row}


def invoke(*args, color=False) -> bytes:
    r = CliRunner().invoke(cli, [*map(str, args)], prog_name="pstate", color=color, catch_exceptions=False)
    assert r.exit_code == 0, (args, r.output)
    return r.stdout_bytes


# --- the runs of each command and format ------------------------------------------------

BYS = ("comm", "title", "cgroup", "unit", "tid", "pid", "all")
WHY_ARGS = ("--stacks", "--wakers", "--antagonists")
# --by -> the evil names its groups (or their comm column) carry
BY_NAMES = {"comm": (EVIL_COMM, EVIL_COMM2), "title": (EVIL_TITLE,), "cgroup": (EVIL_CGROUP,), "unit": (EVIL_UNIT,),
            "tid": (EVIL_COMM,), "pid": (EVIL_COMM,), "all": ()}


def stats_runs(fmt, inp):
    """(label, args, names a machine format keeps): stats over the evil
    recording, and over the evil snapshots where the format has a
    snapshot renderer (render.snaptables.RENDERERS)."""
    rec, runs = inp["rec"], []
    if fmt in ("table", "json"):
        runs += [(f"--by {b}", [rec, "--by", b], BY_NAMES[b]) for b in BYS]
        runs += [("--by tid --hist --matrix", [rec, "--by", "tid", "--hist", "--matrix"], (EVIL_COMM,)),
                 ("--top 2", [rec, "--by", "title", "--top", "2"], (EVIL_TITLE,)),
                 ("--interval", [rec, "--interval", "5ms", "--by", "cgroup"], (EVIL_CGROUP,)),
                 ("--by reason", [rec, "--by", "reason", "--wakers"], (EVIL_FN,)),
                 ("--cgroup", [rec, "--cgroup", EVIL_CGROUP, "--by", "comm"], (EVIL_COMM,))]
        # (the why views group by pid, tid, comm, all and reason only)
        runs += [(f"why --by {b}", [rec, *WHY_ARGS, "--by", b], (EVIL_FN,) + BY_NAMES[b]) for b in ("pid", "tid", "comm")]
    elif fmt == "csv":
        runs += [(f"--by {b}", [rec, "--by", b], BY_NAMES[b]) for b in BYS]
        runs += [("--matrix", [rec, "--matrix", "--by", "title"], (EVIL_TITLE,)),
                 ("--interval", [rec, "--interval", "5ms", "--by", "comm"], (EVIL_COMM,))]
    elif fmt == "dot":
        runs += [("states", [rec, "--top", "1"], ()), ("--wakers", [rec, "--wakers"], (EVIL_COMM2,)),
                 ("--wakers --by comm", [rec, "--wakers", "--by", "comm"], (EVIL_COMM2,))]
    elif fmt == "folded":
        runs += [(f"--by {b}", [rec, "--by", b], (EVIL_FN,)) for b in ("pid", "tid", "comm")]
    if fmt in snaptables.RENDERERS:
        for b, names in (("pid", (EVIL_COMM,)), ("tid", (EVIL_COMM,)), ("comm", (EVIL_COMM,)),
                         ("title", (EVIL_TITLE,)), ("cgroup", (EVIL_CGROUP,)), ("unit", (EVIL_UNIT,))):
            runs.append((f"snapshots --by {b}", [inp["snaps"], "--by", b], names + (EVIL_UNIT,)))
    return [(label, invoke("stats", "-f", fmt, *args), names, False) for label, args, names in runs]


def heat_runs(_fmt, inp):
    """heat has no --format: a terminal map, whatever the input (recordings,
    snapshots, --latency, --shade, colours) and heat --live's frames."""
    rec, snaps = inp["rec"], inp["snaps"]
    runs = [(f"--by {b}", [rec, "--by", b], False) for b in ("tid", "pid", "comm", "title", "cgroup", "unit")]
    runs += [("--shade D", [rec, "--shade", "D", "--by", "comm"], False),
             ("--latency", [rec, "--latency", "--by", "title"], False),
             ("truecolor", [rec, "--by", "title", "--color", "truecolor"], True),
             ("256", [rec, "--by", "comm", "--color", "256"], True)]
    runs += [(f"snapshots --by {b}", [snaps, "--by", b], False) for b in ("pid", "tid", "title", "cgroup")]
    runs.append(("snapshots truecolor", [snaps, "--color", "truecolor", "--shade", "D"], True))
    # (every map names the evil host in its footer, or evil rows)
    out = [(label, invoke("heat", "--width", "100", *args, color=colour), NAMES, colour)
           for label, args, colour in runs]
    for by in ("tid", "comm", "title", "cgroup"):  # --live, stdout not a terminal: frame after frame
        p = subprocess.run(pstate_cmd("heat", "--live", "--by", by, "--color", "never", str(rec)),
                           capture_output=True, timeout=60, env=clean_env())
        assert p.returncode == 0, p.stderr
        out.append((f"--live --by {by}", p.stdout, NAMES, False))
    return out


def doctor_runs(fmt, _inp, monkeypatch=None):
    """doctor's checks name threads (the unseen switches) and paths: a
    report of evil ones, rendered as the command renders it."""
    from pstate.engines import doctor
    from pstate.exitcodes import ExitCode

    def checks(*_a, **_kw):
        r = doctor.Report()
        r.add("unseen switches", doctor.WARN, f"1 thread switched with no switch-out traced: {EVIL_COMM} (tid 5, "
              "3 switches)", f"look at {EVIL_CGROUP}")
        r.add(EVIL_TITLE, doctor.OK, f"reason {EVIL_FN}")
        return r, ExitCode.OK

    monkeypatch.setattr(doctor, "run_checks", checks)
    # color: as on a terminal (click strips some escape codes from what is not one)
    return [("report", invoke("doctor", "--format", fmt, color=True), (EVIL_COMM, EVIL_TITLE, EVIL_CGROUP, EVIL_FN),
             False)]


def export_runs(fmt, inp):
    out = inp["tmp"] / f"trace.{fmt}"
    invoke("export", "-f", fmt, "-o", out, inp["rec"])
    return [("trace", out.read_bytes(), (EVIL_COMM, EVIL_COMM2), False)]


def replay_runs(_fmt, inp):
    return [("--no-wait", invoke("replay", "--no-wait", inp["rec"]), NAMES[:5], False)]


def snap_runs(fmt, _inp):
    """What snap writes, by its renderers (the rows of a snapshot, read
    from /proc and the kernel: titles, cgroup paths, comms)."""
    from pstate.snapshots import snapdir, writer

    sys.path.insert(0, str(HERE / "data" / "snap"))
    import fake_snap

    S = 1_000_000_000
    meta = {"type": "meta", "schema": 1, "source": "snap", "host": EVIL_HOST, "boot_id": "b", "ts": 20 * S,
            "wall_ns": 1_700_000_020 * S, "interval_start_ts": 10 * S, "interval_end_ts": 20 * S,
            "wall_start_ns": 1_700_000_010 * S, "wall_end_ns": 1_700_000_020 * S, "seq": 3, "mode": "cumulative",
            "truncated": False, "map_full": 0}
    row = {"type": "task", "ts": 20 * S, **fake_snap.fake_row(7, 7, 5 * S, 20 * S, comm=EVIL_COMM, running_ns=S),
           "title": EVIL_TITLE, "cgroup": 77, "cgroup_path": EVIL_CGROUP, "ppid": 1}
    end = {"type": "end", "ts": 20 * S, "tasks": 1, "reason": "interval"}
    if fmt == "jsonl":
        return [("jsonl", writer.render_jsonl(meta, [row], end), (EVIL_COMM, EVIL_TITLE, EVIL_CGROUP), False)]
    if fmt == "csv":
        return [("csv", writer.render_csv(meta, [row], end), (EVIL_COMM, EVIL_TITLE, EVIL_CGROUP), False)]
    out = []
    for by, name in (("comm", EVIL_COMM), ("title", EVIL_TITLE), ("cgroup", EVIL_CGROUP), ("unit", EVIL_UNIT)):
        prom = writer.PromExport(by)
        prom.update([row], [snapdir.subtract(row, None)], [True], 0)
        out.append((f"prom --prom-by {by}", prom.render(meta), (name,), False))
    return out


def record_runs(_fmt, inp):
    """record of a process whose title and comm are evil (BPF): the names
    from the kernel and /proc, kept exactly."""
    recs, lines, pid = record_evil_process()
    procs = [r for r in recs if r["type"] == "process" and r["pid"] == pid and not r["gone"]]
    assert procs and procs[0]["title"].startswith(EVIL_TITLE), procs
    assert {r["comm"] for r in recs if r["type"] == "state" and r["pid"] == pid} == {EVIL_COMM}
    return [("-p", b"".join(lines), (EVIL_COMM, EVIL_TITLE), False)]


# (command, --format) -> (terminal or machine, runs); None: the command has no --format
CASES = {
    ("stats", "table"): (TERMINAL, stats_runs),
    ("stats", "dot"): (TERMINAL, stats_runs),  # Graphviz draws the labels; a terminal may show the text
    ("stats", "json"): (MACHINE, stats_runs),
    ("stats", "csv"): (MACHINE, stats_runs),
    ("stats", "folded"): (MACHINE, stats_runs),
    ("heat", None): (TERMINAL, heat_runs),
    ("doctor", "table"): (TERMINAL, doctor_runs),
    ("doctor", "json"): (MACHINE, doctor_runs),
    ("export", "perfetto"): (MACHINE, export_runs),
    ("export", "chrome"): (MACHINE, export_runs),
    ("replay", None): (MACHINE, replay_runs),
    ("snap", "jsonl"): (MACHINE, snap_runs),
    ("snap", "csv"): (MACHINE, snap_runs),
    ("snap", "prom"): (MACHINE, snap_runs),
    ("record", None): (MACHINE, record_runs),
}


def command_formats() -> list[tuple[str, str | None]]:
    """Every command and each of its --format choices (None: it has none)."""
    out = []
    for name in COMMANDS:
        cmd = cli.get_command(None, name)
        opt = next((p for p in cmd.params if "--format" in getattr(p, "opts", ())), None)
        out += [(name, f) for f in (opt.type.choices if opt is not None else (None,))]
    return out


def test_every_command_and_format_is_classified():
    missing = set(command_formats()) - set(CASES)
    assert not missing, f"say how these show names (terminal or machine) and how to run them: {sorted(missing, key=str)}"
    assert not set(CASES) - set(command_formats()), "CASES names a command or format that is gone"


def _prom_strings(data: bytes) -> set:
    """The label values of Prometheus text, unescaped (\\\\, \\" and \\n)."""
    out = set()
    for m in re.finditer(rb'="((?:[^"\\]|\\.)*)"', data):
        out.add(re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), m.group(1).decode("utf-8")))
    return out


def machine_strings(command, fmt, label, data: bytes) -> set:
    if (command, fmt) == ("stats", "folded"):
        lines = data.decode("utf-8").split("\n")
        assert lines[-1] == "" and all(re.fullmatch(r".+ \d+", x) for x in lines[:-1]), \
            f"{label}: a name broke a folded line: {lines!r}"
        return {data.decode("utf-8")}
    if command == "export" and fmt == "perfetto":
        return {data.decode("utf-8", "replace")} if all(n.encode() in data for n in (EVIL_COMM, EVIL_COMM2)) else set()
    if fmt == "prom":
        return _prom_strings(data)
    if fmt == "csv":
        return csv_strings(data)
    return json_strings(data)


def _case(command, fmt):
    """record runs BPF: a bpf test (run as root, never skipped in CI)."""
    return pytest.param(command, fmt, marks=[pytest.mark.bpf] if command == "record" else [],
                        id=f"{command}-{fmt}")


@pytest.mark.parametrize("command, fmt", [_case(c, f) for c, f in sorted(CASES, key=str)])
def test_names_through_every_command_and_format(command, fmt, inputs, monkeypatch):
    kind, runs = CASES[(command, fmt)]
    outputs = doctor_runs(fmt, inputs, monkeypatch) if runs is doctor_runs else runs(fmt, inputs)
    assert outputs
    for label, data, names, colour in outputs:
        what = f"pstate {command} {fmt or ''} {label}"
        if kind == TERMINAL:
            assert_shown_safely(what, data, colour=colour, drawn=bool(names))
        else:
            kept = machine_strings(command, fmt, label, data)
            if fmt == "folded":  # a group label's ';' is the format's separator (':'), frames exact
                names = tuple(n for n in names if ";" not in n and "\n" not in n)
            assert_kept(what, kept, names)


# --- heat --live in a terminal ------------------------------------------------------------

def test_live_dashboard_in_a_terminal_shows_names_escaped(tmp_path):
    """tmux runs heat --live; the stream names a thread with an OSC title
    sequence, a screen clear and a cursor move to the top left, and its D
    reason (a kernel frame) likewise. The pane's title stays, no FAKE row
    is drawn at the top, and the names are shown escaped."""
    import test_heat_tmux as tt

    if tt.TMUX is None:
        pytest.skip("tmux is not installed")
    pane = tt.Pane(tmp_path)
    try:
        before = pane.tmux("display", "-p", "-t", "heat", "#{pane_title}").strip()
        fifo = tmp_path / "events"
        os.mkfifo(fifo)
        pane.type(f"{sys.executable} -m pstate heat --live --window 2s --refresh 10 --color never "
                  f"< {fifo}; echo EXIT=$?")
        s = tt.Stream(fifo)
        try:
            evil = "\x1b]0;pwned\x07\x1b[2J"
            s.move(11, evil, "sleeping", "running")
            s.move(22, EVIL_TITLE[:40], "running", "sleeping")
            end = time.monotonic() + 1.2
            while time.monotonic() < end:
                s.move(11, evil, "running", "uninterruptible")
                time.sleep(0.01)
                now = time.monotonic_ns()
                s.write({"type": "state", "ts": now, "cpu": 0, "pid": 11, "tid": 11, "comm": evil,
                         "from": "uninterruptible", "to": "runnable", "dur_ns": now - s.since[11], "cause": "wakeup",
                         "reason": EVIL_FN})
                s.since[11] = now
                s.move(11, evil, "runnable", "running")
                s.move(22, EVIL_TITLE[:40], "sleeping", "running")
                time.sleep(0.005)
                s.move(22, EVIL_TITLE[:40], "running", "sleeping")
            screen = pane.wait_for(lambda sc: "\\x1b]0;pwned\\x07" in sc and "pwn\\x1b[2J" in sc,
                                   "the escaped names on the map")
        finally:
            s.close()
        final = tt.wait_restored(pane)
        for sc in (screen, final):
            assert not any(line.startswith(("FAKE", "row ")) for line in sc.splitlines()), sc
            assert "Live: " in sc  # the screen was not cleared under the title
        assert "EXIT=0" in final
        assert pane.tmux("display", "-p", "-t", "heat", "#{pane_title}").strip() == before != "pwned"
    finally:
        pane.close()


# --- record: names read from the kernel and /proc ------------------------------------------

TITLED_CHILD = """
import sys, time
with open("/proc/self/comm", "wb") as f:
    f.write(sys.argv[1].encode())
print("ready", flush=True)
sys.stdin.read(1)
for _ in range(10):
    time.sleep(0.02)
"""


def record_evil_process() -> tuple[list, list, int]:
    """Record a process whose title (argv[0]) and comm are evil: its
    records, lines and pid."""
    from workloads import kill_all, record_all

    child = subprocess.Popen([EVIL_TITLE, "-c", TITLED_CHILD, EVIL_COMM], executable=sys.executable,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"ready\n"  # its comm is set
    except BaseException:
        kill_all([child])
        raise
    recs, rec = record_all([child])
    assert rec.returncode == 0, rec.stderr
    return recs, rec.lines, child.pid


@pytest.mark.bpf
def test_a_recorded_process_is_shown_escaped(tmp_path):
    """The same names as the kernel and /proc give them, recorded, then
    through stats' and heat's tables."""
    _recs, lines, _pid = record_evil_process()
    path = tmp_path / "rec.jsonl"
    path.write_bytes(b"".join(lines))
    for by in ("comm", "title", "pid"):
        assert_shown_safely(f"stats --by {by} of a recording", invoke("stats", "--by", by, path))
        assert_shown_safely(f"heat --by {by} of a recording", invoke("heat", "--by", by, path))

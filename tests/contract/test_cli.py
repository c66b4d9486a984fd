"""The command group and record's option handling, in-process (CliRunner):
help, version, usage errors with their exact messages and exit codes,
`record --ebpf` settings, and `doctor --no-live --format json`."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from pstate import __version__
from pstate.kernel import bpfsys, btf, kstates, probeplan
from pstate.main import COMMANDS, cli

needs_tracefs = pytest.mark.skipif(not kstates.tracefs_dir(), reason="tracefs is not mounted")

USAGE = "Usage: pstate record [OPTIONS] [-- CMD [ARGS]...]\nTry 'pstate record --help' for help.\n\n"
STATES = ("'running', 'runnable', 'preempted', 'new', 'sleeping', 'uninterruptible', 'stopped', 'traced', "
          "'dead', 'zombie', 'parked', 'idle', 'reaped'")


def run(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, prog_name="pstate")


@pytest.mark.parametrize("opt", ["-h", "--help"])
def test_group_help(opt):
    r = run(opt)
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout.startswith("Usage: pstate [OPTIONS] COMMAND [ARGS]...\n")
    assert "Examples:" in r.stdout
    for name in COMMANDS:
        assert f"\n  {name} " in r.stdout


@pytest.mark.parametrize("opt", ["-V", "--version"])
def test_version(opt):
    r = run(opt)
    assert (r.exit_code, r.stdout, r.stderr) == (0, f"pstate, version {__version__}\n", "")


@pytest.mark.parametrize("name", list(COMMANDS))
@pytest.mark.parametrize("opt", ["-h", "--help"])
def test_every_subcommand_has_help_with_examples(name, opt):
    r = run(name, opt)
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith(f"Usage: pstate {name} ")
    assert "Examples:" in r.stdout
    assert r.stderr == ""


def test_unknown_command():
    r = run("bogus")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr == "Usage: pstate [OPTIONS] COMMAND [ARGS]...\nTry 'pstate --help' for help.\n\n" \
                       "Error: No such command 'bogus'.\n"


@pytest.mark.parametrize("args, error", [
    (["--min-dur", "5xs"], "Invalid value for '--min-dur': not a duration: '5xs' (use e.g. 500us, 5ms, 2s, 1m)"),
    (["--min-dur", "-1ms"], "Invalid value for '--min-dur': not a duration: '-1ms' (use e.g. 500us, 5ms, 2s, 1m)"),
    (["--buffer-size", "12Q"], "Invalid value for '--buffer-size': '12Q' is not a size from 4k to 2G (e.g. 16M)"),
    (["--buffer-size", ""], "Invalid value for '--buffer-size': '' is not a size from 4k to 2G (e.g. 16M)"),
    (["--buffer-size", "M"], "Invalid value for '--buffer-size': 'M' is not a size from 4k to 2G (e.g. 16M)"),
    (["--state", "bogus"], f"Invalid value for '--state': 'bogus' is not one of {STATES}."),
    (["-d", "0"], "Invalid value for '-d' / '--duration': '0' is not a positive duration (use e.g. 500ms, 5s, 1m)"),
    (["--max-tasks", "5"], "Invalid value for '--max-tasks': 5 is not in the range 1024<=x<=4194304."),
    (["--cpu", "5000"], "Invalid value for '--cpu': 5000 is not in the range 0<=x<=4095."),
    (["-p", "x"], "Invalid value for '-p' / '--pid': 'x' is not a valid integer."),
    (["--max-rate", "10"], "Invalid value for '--max-rate': 10 is not in the range x>=1000."),
    (["--drain-interval", "2"], "Invalid value for '--drain-interval': must be from 500us to 1s"),
    (["--bogus"], "No such option '--bogus'."),
])
def test_record_usage_errors(args, error):
    r = run("record", *args)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == f"{USAGE}Error: {error}\n"


@pytest.mark.parametrize("size", ["infk", "-5", "0", "1e30", "nan"])
def test_record_rejects_impossible_buffer_sizes(size):
    r = run("record", "--ebpf", "--buffer-size", size)
    assert r.exit_code == 2 and "Invalid value for '--buffer-size'" in r.stderr


def test_record_filters_do_not_change_the_program():
    """Filters are map values: every -p/-t/-c/--cpu/--state/--min-dur value,
    and several -c, give the one program text the cache already holds."""
    plain = run("record", "--ebpf")
    assert plain.exit_code == 0 and "PSTATE_PROBE(sched, sched_switch)" in plain.stdout
    for args in (("-c", "a", "-c", "b"), ("-p", "1", "-t", "2", "--cpu", "1"), ("--state", "D", "--min-dur", "5ms"),
                 ("--include-idle",)):
        r = run("record", "--ebpf", *args)
        assert (r.exit_code, r.stdout, r.stderr) == (0, plain.stdout, ""), args


def test_record_refuses_more_comms_than_its_set_holds():
    r = run("record", "--ebpf", *[a for i in range(257) for a in ("-c", f"n{i}")])
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("Error: record takes at most 256 --comm values\n"
                        "  fix: record without --comm and filter with `pstate replay --comm ...`\n")


@needs_tracefs
def test_record_state_this_kernel_lacks():
    r = run("record", "--state", "state_Q")
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", "Error: this kernel does not report the state 'state_Q'\n")


def defines(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        if line.startswith("#define "):
            parts = line.split(None, 2)
            out[parts[1]] = parts[2] if len(parts) > 2 else True
        elif line.startswith("// pstate record:"):
            break  # the program's own text starts here
    return out


RECORD_EVENTS = ("sched_switch", "sched_wakeup", "csd_queue_cpu", "sched_wakeup_new", "sched_migrate_task",
                 "task_newtask", "sched_process_fork", "sched_process_exec", "sched_process_exit", "sched_process_free")
SNAP_EVENTS = ("sched_switch", "sched_wakeup", "sched_wakeup_new", "task_newtask", "sched_process_exec",
               "sched_process_exit", "sched_process_free")
HOT = ("sched_switch", "sched_wakeup", "sched_waking", "sched_wakeup_new")


def plan_settings(command: str, choice: str) -> dict:
    """The plan's settings (pstate.kernel.probeplan) on this kernel (6.18:
    every tracepoint with its BTF prototype, the wake list, group_dead as
    an argument), as --ebpf prints them: PATH_<event> of each tracepoint
    (tp_btf 1, raw 2, classic 3; --probes tracepoint: sched_switch and the
    wake-ups classic, the rest raw), every offset and constant of the BTF,
    and the state bits the kernel folds into prev_state where sched_switch
    is tp_btf."""
    if not os.path.exists(btf.VMLINUX):
        return {}
    facts = btf.facts(btf.Btf.read())
    assert len(facts["tracepoints"]["sched_process_exit"]["args"]) == 2, "a kernel with group_dead (6.18)"
    events = RECORD_EVENTS if command == "record" else SNAP_EVENTS
    out = {"WAKE_AT_WAKEUP": True} if command == "record" else {}
    out["EXIT_GROUP_DEAD_ARG"] = True
    out.update({f"PATH_{e}": "1" if choice == "tp_btf" else "3" if e in HOT else "2" for e in events})
    out.update({k: str(off) for k, (off, _size) in facts["members"].items()})
    out["TASK_STATE_SIZE"] = str(facts["members"]["TASK_STATE"][1])
    out.update({k: str(v) for k, v in facts["enums"].items()})
    if choice == "tp_btf":
        out.update(probeplan.raw_state_defines(kstates.read_kernel_states().report_mask))
    return out


def first_line(command: str, choice: str) -> str:
    """--ebpf's first line: how each tracepoint is taken, and why."""
    events = RECORD_EVENTS if command == "record" else SNAP_EVENTS
    paths = ", ".join(f"{e} {'tp_btf' if choice == 'tp_btf' else 'tracepoint' if e in HOT else 'raw_tracepoint'}"
                      for e in events)
    return f"// pstate: bpf/{command}.bpf.c as compiled on this kernel ({paths}; --probes {choice}), with its -D settings\n"


def slots(buffer_bytes: int) -> dict:
    """x86-64: the switches and wake-ups go to per-CPU runs of slots first,
    as many as the buffer size holds per possible CPU, 1024 to 8192 (a power
    of two); elsewhere none."""
    if platform.machine() != "x86_64":
        return {}
    ncpus = bpfsys.possible_cpus()
    per_cpu = max(1024, min(8192, buffer_bytes // 96 // ncpus))
    return {"CPU_SLOTS": str(1 << (per_cpu.bit_length() - 1)), "SLOT_CPUS": str(ncpus)}


@needs_tracefs
def test_record_ebpf_defaults():
    r = run("record", "--ebpf", "--probes", "tracepoint")
    assert r.exit_code == 0 and r.stderr == ""
    ks = kstates.read_kernel_states()
    assert r.stdout.startswith(first_line("record", "tracepoint"))
    assert f"#define REPORT_MASK 0x{ks.report_mask:x}\n" in r.stdout
    dead = (ks.bit_of("dead") or 0) | (ks.bit_of("zombie") or 0)
    # every tid fits in the default 65536 rows when pid_max allows: an array indexed by tid
    by_tid = {"TASKS_BY_TID": True} if int(Path("/proc/sys/kernel/pid_max").read_text()) <= 65536 else {}
    assert defines(r.stdout) == {"REPORT_MASK": f"0x{ks.report_mask:x}", "DEAD_BITS": f"0x{dead:x}",
                                 "MAX_TASKS": "65536", "RB_PAGES": "4096", **slots(16 << 20), **by_tid,
                                 **plan_settings("record", "tracepoint")}
    assert "struct event {" in r.stdout and "BPF_RINGBUF_OUTPUT(events, RB_PAGES);" in r.stdout


@needs_tracefs
@pytest.mark.parametrize("max_tasks", [None, 1024])
def test_snap_ebpf_defines(max_tasks):
    r = run("snap", "--ebpf", "--probes", "tracepoint", *(["--max-tasks", str(max_tasks)] if max_tasks else []))
    assert r.exit_code == 0 and r.stderr == ""
    ks = kstates.read_kernel_states()
    settings = r.stdout.split("// pstate snap:", 1)[0]
    assert settings.startswith(first_line("snap", "tracepoint"))
    rows = max_tasks or 65536
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    # every tid fits (and the kernel maps arrays, 5.5+): an array indexed by tid, pid_max rows
    release = tuple(int(x) for x in Path("/proc/sys/kernel/osrelease").read_text().split("-")[0].split(".")[:2])
    by_tid = {"TASKS_BY_TID": True, "TID_SLOTS": str(pid_max)} if pid_max <= rows and release >= (5, 5) else {}
    assert defines(settings) == {"REPORT_MASK": f"0x{ks.report_mask:x}",
                                 "NR_KBITS": str(max(1, ks.report_mask.bit_length())), "MAX_TASKS": str(rows),
                                 "MAX_FOLDS": str(max(64, min(4096, rows // 4))), **by_tid,
                                 **plan_settings("snap", "tracepoint")}


@needs_tracefs
def test_record_ebpf_filters():
    """Only what is not a filter is compiled in; the filters' map values are
    tested in test_filtermaps."""
    r = run("record", "--ebpf", "--probes", "tracepoint", "-p", "5", "-t", "6", "--cpu", "1", "-c", "nginx", "--state", "D",
            "--state", "preempted", "--min-dur", "5ms", "--include-idle", "--max-rate", "5000",
            "--max-tasks", "2048", "--buffer-size", "1M")
    assert r.exit_code == 0, r.stderr
    ks = kstates.read_kernel_states()
    d = defines(r.stdout)
    dead = (ks.bit_of("dead") or 0) | (ks.bit_of("zombie") or 0)
    assert d == {"REPORT_MASK": f"0x{ks.report_mask:x}", "DEAD_BITS": f"0x{dead:x}", "MAX_TASKS": "2048", "RB_PAGES": "256",
                 "SAMPLE": True, **slots(1 << 20), **plan_settings("record", "tracepoint")}


@needs_tracefs
@pytest.mark.parametrize("command", ["record", "snap"])
def test_ebpf_tp_btf_defines(command):
    """The tp_btf path's settings: the classic ones, then every tracepoint
    on tp_btf, every offset from this kernel's BTF and the state bits the
    kernel folds into prev_state."""
    if not os.path.exists(btf.VMLINUX):
        r = run(command, "--ebpf", "--probes", "tp_btf")
        assert r.exit_code == 69 and "--probes tp_btf:" in r.stderr
        return
    classic = defines(run(command, "--ebpf", "--probes", "tracepoint").stdout.split(f"// pstate {command}:")[0])
    tracepoint = plan_settings(command, "tracepoint")
    assert {k: classic.pop(k) for k in tracepoint} == tracepoint
    r = run(command, "--ebpf", "--probes", "tp_btf")
    assert r.exit_code == 0 and r.stderr == ""
    assert r.stdout.startswith(first_line(command, "tp_btf"))
    d = defines(r.stdout.split(f"// pstate {command}:")[0])
    assert d == {**classic, **plan_settings(command, "tp_btf")}


def test_doctor_json_structure():
    r = run("doctor", "--no-live", "--format", "json")
    rows = orjson.loads(r.stdout)
    assert [row["check"] for row in rows][:3] == ["privileges", "bcc", "tracefs"]
    assert rows[-1] == {"check": "live test", "status": "warning", "detail": "skipped (--no-live)", "fix": ""}
    for row in rows:
        assert set(row) == {"check", "status", "detail", "fix"}
        assert row["status"] in ("ok", "PROBLEM", "warning")
        assert all(type(v) is str for v in row.values())
        if row["status"] == "PROBLEM":
            assert row["fix"], row
    failed = any(row["status"] == "PROBLEM" for row in rows)
    assert (r.exit_code != 0) == failed
    if failed:
        assert r.stderr == "pstate doctor: some checks failed; see the fixes above\n"
        assert r.exit_code in (69, 77)
    else:
        assert [row["check"] for row in rows] == ["privileges", "bcc", "tracefs", "tracepoints", "state decoding",
                                                  "probes", "BPF features", "record buffers", "kernel headers",
                                                  "snap collector", "live test"]
        probes = rows[5]["detail"]
        assert probes.startswith("tp_btf: " if os.path.exists(btf.VMLINUX) else "tracepoint: "), probes
        assert r.stderr == ""

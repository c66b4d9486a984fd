"""The tracers the benchmark compares: how to start each one, tell when it is
ready, stop it, and read what it reported.

Every tracer runs pinned to CPU 0 (the storm runs on CPU 1). Its peak RSS
and CPU time come from wait4(2) on the tracer's own process (taskset execs,
so the pid is the tracer's).
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRACER_CPU = "0"


def pstate_bin() -> str:
    """The pstate of the venv this script runs in, else the one on PATH."""
    cand = os.path.join(os.path.dirname(sys.executable), "pstate")
    return cand if os.path.exists(cand) else "pstate"


def merged_headers() -> str | None:
    """pstate's merged kernel header tree (BCC_KERNEL_SOURCE for BCC tools)."""
    trees = sorted(glob.glob("/var/cache/pstate/kernel-headers/*"))
    return trees[-1] if trees else None


def _child_setup() -> None:
    # A harness started in the background inherits SIGINT ignored; Python
    # tools (BCC) then never see Ctrl-C. Give children the default back.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@dataclass
class Contender:
    key: str
    label: str
    kind: str  # record | snap | perf | bpftrace | bcc
    argv: list[str]  # {out} and {dir} are replaced by paths in the work dir
    # "meta": first line of {out}; "text:<s>": s on stdout/stderr; "file": {out}
    # exists; "perfctl": perf acknowledged "enable" on its control FIFO
    ready: str
    stop_signal: int = signal.SIGTERM
    env: dict = field(default_factory=dict)
    settle_s: float = 0.0  # extra wait after ready (perf has no ready signal)
    note: str = ""
    out_suffix: str = ""  # record: {out} is written as out<suffix> (.zst, .gz: compressed by name)

    def command(self, workdir: str) -> list[str]:
        out = os.path.join(workdir, "out")
        subst = {"{out}": out, "{dir}": os.path.join(workdir, "snapdir"), "{ctl}": os.path.join(workdir, "ctl"),
                 "{ack}": os.path.join(workdir, "ack")}
        res = []
        for a in self.argv:  # ({out}<suffix>: Running.out)
            for k, v in subst.items():
                a = a.replace(k, v)
            res.append(a)
        return res


def pstate_record(key: str, label: str, *extra: str, note: str = "") -> Contender:
    return Contender(key, label, "record",
                     ["taskset", "-c", TRACER_CPU, pstate_bin(), "record", "-q", "-o", "{out}", *extra],
                     ready="meta", note=note)


def pstate_record_compressed(key: str, label: str, suffix: str, *extra: str) -> Contender:
    """record -o out<suffix> (.jsonl, .jsonl.zst, .jsonl.gz): ready when its
    banner is out, as the meta line of a compressed file cannot be seen (the
    same readiness for each suffix, so that they compare)."""
    return Contender(key, label, "record",
                     ["taskset", "-c", TRACER_CPU, pstate_bin(), "record", "-o", "{out}" + suffix, *extra],
                     ready="text:Tracing scheduler state transitions", out_suffix=suffix)


def default_contenders(headers: str | None = None) -> list[Contender]:
    """The contenders of issue #8, in table order."""
    bcc_env = {"BCC_KERNEL_SOURCE": headers} if headers else {}
    return [
        pstate_record("record", "pstate record (all events)"),
        pstate_record("record_min_dur", "pstate record --min-dur 1ms", "--min-dur", "1ms"),
        Contender("snap", "pstate snap (running)", "snap",
                  ["taskset", "-c", TRACER_CPU, pstate_bin(), "snap", "--dir", "{dir}", "--interval", "60", "-v"],
                  ready="text:collecting into"),
        # Started with its events disabled (-D -1) and enabled through the
        # control FIFO: the "ack" says perf is recording on every CPU.
        Contender("perf_sched", "perf sched record", "perf",
                  ["taskset", "-c", TRACER_CPU, "perf", "sched", "record", "-o", "{out}",
                   "--control", "fifo:{ctl},{ack}", "-D", "-1"],
                  ready="perfctl", stop_signal=signal.SIGINT),
        Contender("bpftrace", "bpftrace sched_switch map count", "bpftrace",
                  ["taskset", "-c", TRACER_CPU, "bpftrace", "-e",
                   "tracepoint:sched:sched_switch { @[cpu] = count(); }"],
                  ready="text:Attaching", stop_signal=signal.SIGINT, settle_s=0.2),
        Contender("runqlat", "runqlat-bpfcc", "bcc",
                  ["taskset", "-c", TRACER_CPU, "runqlat-bpfcc"],
                  ready="text:Tracing run queue latency", stop_signal=signal.SIGINT, env=bcc_env,
                  note=f"BCC_KERNEL_SOURCE={headers}" if headers else ""),
    ]


def governor_contenders() -> list[Contender]:
    """record's overhead knobs (the governor of issue #8)."""
    return [
        pstate_record("gov_max_rate_100k", "record --max-rate 100000", "--max-rate", "100000"),
        pstate_record("gov_max_rate_250k", "record --max-rate 250000", "--max-rate", "250000"),
        pstate_record("gov_drain_50ms", "record --drain-interval 0.05", "--drain-interval", "0.05"),
        pstate_record("gov_filter_pid1", "record -p 1 (in-kernel filter)", "-p", "1",
                      note="all but pid 1 filtered in the kernel: the BPF side's cost alone"),
    ]


class StartFailed(Exception):
    pass


class Running:
    """One started tracer."""

    def __init__(self, c: Contender, workdir: str):
        self.c = c
        self.workdir = workdir
        os.makedirs(workdir, exist_ok=True)
        self.out = os.path.join(workdir, "out" + c.out_suffix)
        self.stdout_path = os.path.join(workdir, "stdout")
        self.stderr_path = os.path.join(workdir, "stderr")
        env = dict(os.environ)
        env.update(self.c.env)
        if c.ready == "perfctl":
            os.mkfifo(os.path.join(workdir, "ctl"))
            os.mkfifo(os.path.join(workdir, "ack"))
        self._ctl = None
        with open(self.stdout_path, "wb") as so, open(self.stderr_path, "wb") as se:
            self.t0 = time.monotonic()
            self.proc = subprocess.Popen(c.command(workdir), stdout=so, stderr=se, stdin=subprocess.DEVNULL,
                                         env=env, preexec_fn=_child_setup)
        self.ready_s: float | None = None
        self.first_event_s: float | None = None
        self._meta_len: int | None = None
        self.rusage = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def text(self) -> str:
        parts = []
        for p in (self.stdout_path, self.stderr_path):
            try:
                with open(p, errors="replace") as f:
                    parts.append(f.read())
            except OSError:
                pass
        return "\n".join(parts)

    def _poll_first_event(self) -> None:
        if self.first_event_s is not None or self._meta_len is None:
            return
        try:
            if os.path.getsize(self.out) > self._meta_len:
                self.first_event_s = time.monotonic() - self.t0
        except OSError:
            pass

    def _is_ready(self) -> bool:
        r = self.c.ready
        if r == "meta":
            try:
                with open(self.out, "rb") as f:
                    head = f.read(65536)
            except OSError:
                return False
            if b"\n" not in head:
                return False
            self._meta_len = head.index(b"\n") + 1
            return True
        if r == "file":
            return os.path.exists(self.out)
        if r == "perfctl":
            return self._perf_enable()
        if r.startswith("text:"):
            return r[5:] in self.text()
        raise ValueError(r)

    def _perf_enable(self) -> bool:
        if self._ctl is None:
            try:
                self._ctl = os.open(os.path.join(self.workdir, "ctl"), os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: perf has not opened it yet
                return False
            ack = os.open(os.path.join(self.workdir, "ack"), os.O_RDONLY | os.O_NONBLOCK)
            os.write(self._ctl, b"enable\n")
            self._ack = ack
        try:
            got = os.read(self._ack, 64)
        except BlockingIOError:
            return False
        if got.startswith(b"ack"):
            os.close(self._ack)
            os.close(self._ctl)
            return True
        return False

    def wait_ready(self, timeout: float = 60.0) -> float:
        deadline = self.t0 + timeout
        while True:
            if self._is_ready():
                self.ready_s = time.monotonic() - self.t0
                break
            if self.proc.poll() is not None:
                self.returncode = self.proc.returncode
                raise StartFailed(f"exited {self.proc.returncode} before it was ready: {_tail(self.text())}")
            if time.monotonic() > deadline:
                self.stop()
                raise StartFailed(f"not ready after {timeout:.0f}s: {_tail(self.text())}")
            time.sleep(0.002)
        if self.c.settle_s:
            time.sleep(self.c.settle_s)
        return self.ready_s

    def wait_first_event(self, timeout: float = 2.0) -> None:
        """record: poll until an event follows the meta line (bounded)."""
        end = time.monotonic() + timeout
        while self.first_event_s is None and time.monotonic() < end and self._meta_len is not None:
            self._poll_first_event()
            time.sleep(0.002)

    def stop(self, timeout: float = 30.0) -> None:
        self._poll_first_event()
        if self.returncode is not None:
            return
        try:
            self.proc.send_signal(self.c.stop_signal)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                self.proc.kill()  # our own child, by pid
                pid, status, ru = os.wait4(self.proc.pid, 0)
                break
            time.sleep(0.01)
        self.rusage = ru
        self.returncode = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.returncode  # reaped here, not by Popen

    def resources(self) -> dict:
        ru = self.rusage
        if ru is None:
            return {}
        return {"maxrss_mb": round(ru.ru_maxrss / 1024, 1), "cpu_s": round(ru.ru_utime + ru.ru_stime, 3)}


def _tail(text: str, n: int = 400) -> str:
    t = " ".join(text.split())
    return t[-n:] if t else "(no output)"


# --- reading what each tracer wrote -------------------------------------------

def plain_copy(path: str) -> str:
    """path itself, or for a compressed recording (by its magic bytes) a
    decompressed copy beside it (path + ".plain"), through pstate's reader
    of compressed streams."""
    sys.path.insert(0, os.path.join(ROOT, "cli"))
    from pstate.stream.compression import GZIP_MAGIC, ZSTD_MAGIC, open_decompressed

    with open(path, "rb") as f:
        if not f.read(4).startswith((ZSTD_MAGIC, GZIP_MAGIC)):
            return path
    out = path + ".plain"
    with open(path, "rb") as raw, open(out, "wb") as dst:
        src, _kind = open_decompressed(raw, path)
        while True:
            data = src.read(1 << 22)
            if not data:
                break
            dst.write(data)
    return out


def scan_recording(path: str) -> dict:
    """Count the records of a pstate recording without parsing every line,
    and return its end trailer."""
    lines = loss = rate = notes = 0
    last = b""
    rates = []
    with open(path, "rb") as f:
        try:
            meta_ts = json.loads(f.readline()).get("ts")
        except ValueError:
            meta_ts = None
        f.seek(0)
        while True:
            chunk = f.read(1 << 24)
            if not chunk:
                break
            lines += chunk.count(b"\n")
            loss += chunk.count(b'{"type":"loss"')
            # who the events' processes and cgroups are: records of record's own, not kernel events
            notes += chunk.count(b'{"type":"process"') + chunk.count(b'{"type":"cgroup"')
            n = chunk.count(b'{"type":"rate"')
            rate += n
            i = 0
            while n and len(rates) < 100:
                i = chunk.find(b'{"type":"rate"', i)
                if i < 0:
                    break
                j = chunk.find(b"\n", i)
                try:
                    rates.append(json.loads(chunk[i:j if j >= 0 else None]))
                except ValueError:
                    pass
                i += 1
            last = (last + chunk)[-4096:]
    tail = last.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    try:
        end = json.loads(tail)
    except ValueError:
        end = {}
    if end.get("type") != "end":
        end = {}
    events = lines - loss - rate - notes - 1 - (1 if end else 0)
    return {"lines": lines, "events_in_file": events, "loss_records": loss, "rate_records": rate, "rates": rates,
            "end": end, "meta_ts": meta_ts,
            "bytes": os.path.getsize(path)}


def record_result(run: Running) -> dict:
    if not os.path.exists(run.out):
        return {"ok": False, "error": "no output file"}
    plain = plain_copy(run.out)
    s = scan_recording(plain)
    if plain != run.out:  # bytes: what the file takes on disk
        s["plain_bytes"], s["bytes"] = s["bytes"], os.path.getsize(run.out)
        os.unlink(plain)
    end = s["end"]
    if not end:
        return {"ok": False, "error": f"no end trailer (exit {run.returncode}): {_tail(run.text())}", **s}
    lost = {k[5:]: v for k, v in end.items() if k.startswith("lost_")}
    reported = end.get("lost", 0)
    # kernel_events = events + ringbuf_full + sampled + unread (schema.py):
    # whatever is missing beyond that was dropped without a word.
    kev = end.get("kernel_events")
    accounted = s["events_in_file"] + lost.get("ringbuf_full", 0) + lost.get("sampled", 0) + lost.get("unread", 0)
    dur = end.get("duration_ns", 0) / 1e9
    ev = s["events_in_file"]
    return {
        "ok": True, "events": ev, "trailer_events": end.get("events"), "kernel_events": kev,
        "lost_reported": reported, "lost": lost,
        "lost_not_sampled": reported - lost.get("sampled", 0),
        "unreported": None if kev is None else kev - accounted,
        "duration_s": round(dur, 3), "events_per_s": ev / dur if dur else None,
        "bytes": s["bytes"], "bytes_per_event": s["bytes"] / ev if ev else None,
        "rate_records": s["rate_records"], "loss_records": s["loss_records"],
        **({"plain_bytes": s["plain_bytes"], "ratio": s["plain_bytes"] / s["bytes"]} if "plain_bytes" in s else {}),
        "meta_ts": s.get("meta_ts"),
        "rates": [{"after_s": round((r["ts"] - s["meta_ts"]) / 1e9, 3) if s.get("meta_ts") else None,
                   "sample_every": r.get("sample_every"), "events_per_s": r.get("events_per_s")}
                  for r in s["rates"]],
    }


def perf_result(run: Running) -> dict:
    m = re.search(r"Captured and wrote ([\d.]+) MB \S+ \((\d+) samples\)", run.text())
    if not m:
        return {"ok": False, "error": f"exit {run.returncode}: {_tail(run.text())}"}
    n = int(m.group(2))
    size = os.path.getsize(run.out) if os.path.exists(run.out) else 0
    lost = perf_lost(run.out)
    return {"ok": True, "events": n, "bytes": size, "bytes_per_event": size / n if n else None,
            "lost_reported": lost}


def perf_lost(path: str) -> int | None:
    """LOST and LOST_SAMPLES records in a perf.data file (perf report --stats)."""
    try:
        r = subprocess.run(["perf", "report", "-i", path, "--stats"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    total = 0
    for m in re.finditer(r"^\s*LOST(?:_SAMPLES)? events:\s+(\d+)", r.stdout, re.M):
        total += int(m.group(1))
    return total


def bpftrace_result(run: Running) -> dict:
    counts = [int(n) for n in re.findall(r"^@\[\d+\]: (\d+)$", run.text(), re.M)]
    if not counts:
        return {"ok": False, "error": f"exit {run.returncode}: {_tail(run.text())}"}
    lost = re.search(r"(\d+) events? lost", run.text())
    return {"ok": True, "counted": sum(counts), "lost_reported": int(lost.group(1)) if lost else 0}


def runqlat_result(run: Running) -> dict:
    rows = re.findall(r"^\s*\d+ -> \d+\s*:\s*(\d+)\s*\|", run.text(), re.M)
    if not rows:
        return {"ok": False, "error": f"exit {run.returncode}: {_tail(run.text())}"}
    return {"ok": True, "counted": sum(int(n) for n in rows)}


def snap_result(run: Running) -> dict:
    # Killed before its 60 s interval ended: success is having run the workload
    # through without failing.
    t = run.text()
    if "collecting into" not in t:
        return {"ok": False, "error": f"exit {run.returncode}: {_tail(t)}"}
    return {"ok": True}


RESULT_READERS = {"record": record_result, "perf": perf_result, "bpftrace": bpftrace_result,
                  "bcc": runqlat_result, "snap": snap_result}


def collect(run: Running) -> dict:
    res = RESULT_READERS[run.c.kind](run)
    res.update(run.resources())
    res["ready_s"] = None if run.ready_s is None else round(run.ready_s, 3)
    if run.c.kind == "record":
        res["first_event_s"] = None if run.first_event_s is None else round(run.first_event_s, 3)
    res["exit"] = run.returncode
    return res


# --- the kernel's own count of program runs -----------------------------------

def bpf_prog_ids(pid: int) -> list[int]:
    """BPF program ids held open by a process (from /proc/PID/fdinfo)."""
    ids = []
    for p in glob.glob(f"/proc/{pid}/fdinfo/*"):
        try:
            with open(p) as f:
                for line in f:
                    if line.startswith("prog_id:"):
                        ids.append(int(line.split()[1]))
                        break
        except OSError:
            continue
    return sorted(set(ids))


def prog_stats(pid: int) -> list[dict]:
    """run_cnt and run_time_ns of every BPF program the tracer holds (bpftool
    prog show; counted only while kernel.bpf_stats_enabled=1)."""
    out = []
    attached = tracepoints_of_programs()
    for p in [pid] + _children(pid):
        for prog_id in bpf_prog_ids(p):
            try:
                r = subprocess.run(["bpftool", "-j", "prog", "show", "id", str(prog_id)], capture_output=True,
                                   text=True, timeout=10)
                info = json.loads(r.stdout)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                continue
            cnt = info.get("run_cnt") or 0
            out.append({"prog_id": prog_id, "name": info.get("name", ""), "type": info.get("type"),
                        "tracepoint": attached.get(prog_id),
                        "run_cnt": cnt, "run_time_ns": info.get("run_time_ns") or 0,
                        "ns_per_run": (info.get("run_time_ns") or 0) / cnt if cnt else None,
                        "recursion_misses": info.get("recursion_misses", 0)})
    return out


def tracepoints_of_programs() -> dict[int, str]:
    """prog id -> the tracepoint it is attached to (bpftool perf show)."""
    try:
        r = subprocess.run(["bpftool", "-j", "perf", "show"], capture_output=True, text=True, timeout=10)
        rows = json.loads(r.stdout) if r.stdout.strip() else []
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}
    return {row["prog_id"]: row["tracepoint"] for row in rows if "tracepoint" in row and "prog_id" in row}


def switch_prog(progs: list[dict]) -> dict | None:
    """The sched_switch program among them: by attachment (a program loaded
    from pstate's program cache has only the kernel's 15-character name),
    else by the full name bpftool shows from BTF."""
    for p in progs:
        if p.get("tracepoint") == "sched_switch":
            return p
    for p in progs:
        if "sched_switch" in p["name"]:
            return p
    return None


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class BpfStats:
    """kernel.bpf_stats_enabled=1 for a block, restored afterwards."""

    PATH = "/proc/sys/kernel/bpf_stats_enabled"

    def __enter__(self):
        with open(self.PATH) as f:
            self.old = f.read().strip()
        with open(self.PATH, "w") as f:
            f.write("1")
        return self

    def __exit__(self, *exc):
        with open(self.PATH, "w") as f:
            f.write(self.old)

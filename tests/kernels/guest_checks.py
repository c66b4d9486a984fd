"""The kernel matrix's checks, run as root inside a guest (--mode guest,
which sets up the guest's mounts first) or on the host (--mode host, in a
mount namespace of its own); tests/kernels/matrix.py starts it either way.

Each step runs with its own time limit and writes one JSON file per check
to OUT/results/<check>.json: {"name", "ok", "seconds", "detail"} (ok null:
skipped). The probes each program's meta record names go to OUT/plan.json;
every command's standard output and error to OUT/logs/; the recordings and
snapshots stay in OUT/data/.

The counts asserted are exact: each workload says what it did (its thread
ids, how many sleeps, writes, forks, and the CLOCK_MONOTONIC window it did
them in, the clock record's ts fields use) and the records of its threads in
that window must say the same.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import threading
import time

# step -> the checks it reports, in table order
# record first: its compile fills the program cache, which doctor's live test
# (a short record) then takes instead of compiling under emulation again
STEPS = {
    "record": ["record", "record-sleeper", "record-direct-io", "record-fork-exec", "record-thread-exit", "stats"],
    "doctor": ["doctor"],
    "stacks": ["record-stacks"],
    "snap": ["snap"],
    "collector": ["snap-collector"],
    "peers": ["peers-offcpu", "peers-runqlat"],
}
# steps run only when named (CHECKS=peers): BCC's tools beside pstate's, a
# comparison for bench/results rather than a check of pstate alone
OPT_IN = ("peers",)
DEFAULT_STEPS = [s for s in STEPS if s not in OPT_IN]
# s per step: under TCG a first compile of record takes 1.5 min on 6.1, 8 on 5.10
LIMITS = {"doctor": 1200, "record": 1500, "stacks": 1200, "snap": 1200, "collector": 1200, "peers": 1800}
CHECKS = ["boot"] + [c for cs in STEPS.values() for c in cs]

SLEEPS, SLEEP_S = 20, 0.02  # the sleeper thread's sleeps
# O_DIRECT writes: until the kernel has counted BLOCKED of the writer's
# voluntary switches, at most WRITES. Not every write blocks: one whose
# completion comes before the writer is off its CPU does not (81 of 100 did
# in a 6.1 guest under TCG, 2 to 104 of 200 on this machine's disk).
WRITES, BLOCKED = 20_000, 60
FORKS = 5
THREADS = 8
SNAP_SLEEPS = 10
# peers: the writer's blocked writes, the hogs' seconds, and how far the
# run-queue histograms' shapes may differ (total variation distance)
PEER_BLOCKED, HOG_S = 200, 3
PEER_SHAPE_GAP = 0.10
SNAP_INTERVAL = "8s"
PROGRAM_CACHE = "/var/cache/pstate/programs"

PSTATE = os.path.join(os.path.dirname(sys.executable), "pstate")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# --- the workloads: each waits for a byte on stdin, then does its work and
# prints what it did as one JSON line ------------------------------------------------

SLEEPER = """
import ctypes, json, os, sys, threading, time
n, secs = int(sys.argv[1]), float(sys.argv[2])
done_r, done_w = os.pipe()
facts = {}
def in_call_on(tid, fd):  # the thread is in a system call whose first argument is fd
    with open(f"/proc/self/task/{tid}/syscall") as f:
        return f.read().split()[1:2] == [hex(fd)]
def sleeper():
    ctypes.CDLL(None).prctl(15, b"pst-sleeper", 0, 0, 0)
    facts["tid"] = threading.get_native_id()
    os.read(0, 1)
    # the window starts once the main thread sits in read(done_r): it then
    # holds no GIL for this thread to wait on in S (Linux 6.1 under TCG: 5
    # extra S intervals of 0.5-6.5 ms while it ran on after a go byte)
    while not in_call_on(os.getpid(), done_r):
        time.sleep(0.001)
    facts["t0"] = time.monotonic_ns()
    for _ in range(n):
        time.sleep(secs)
    facts["t1"] = time.monotonic_ns()
    os.write(done_w, b"x")
threading.Thread(target=sleeper).start()
os.read(done_r, 1)
print(json.dumps(dict(facts, pid=os.getpid(), sleeps=n, secs=secs)))
"""

DIRECT_WRITER = """
import json, mmap, os, sys, time
path, writes, blocked = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
buf = mmap.mmap(-1, 65536)
buf.write(b"x" * 65536)
os.pwrite(fd, buf, 0)  # the block is allocated before the window: the writes then only overwrite it
def nvcsw():
    with open("/proc/thread-self/status") as f:
        return int(next(x for x in f if x.startswith("voluntary_ctxt_switches")).split()[1])
os.read(0, 1)
v0 = nvcsw()
t0 = time.monotonic_ns()
i = 0
while i < writes:
    os.pwrite(fd, buf, 0)
    i += 1
    if blocked and i % 50 == 0 and nvcsw() - v0 >= blocked:
        break
t1 = time.monotonic_ns()
v1 = nvcsw()
os.close(fd)
print(json.dumps(dict(pid=os.getpid(), tid=os.getpid(), t0=t0, t1=t1, writes=i, nvcsw=v1 - v0)))
"""

FORK_EXEC = """
import json, os, sys
n = int(sys.argv[1])
os.read(0, 1)
kids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        try:
            os.execv("/bin/true", ["true"])
        finally:
            os._exit(127)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
print(json.dumps(dict(pid=os.getpid(), kids=kids)))
"""

THREAD_EXIT = """
import json, os, sys, threading
n = int(sys.argv[1])
os.read(0, 1)
ready = threading.Barrier(n)
def worker():
    ready.wait()
    threading.Event().wait()
threads = [threading.Thread(target=worker, daemon=True) for _ in range(n - 1)]
for t in threads:
    t.start()
ready.wait()
print(json.dumps(dict(pid=os.getpid(), tids=[os.getpid()] + [t.native_id for t in threads])), flush=True)
os._exit(0)  # exit_group: every thread exits, the last one with group_dead
"""

HOG = """
import json, os, sys, time
secs = float(sys.argv[1])
def switches():
    with open("/proc/self/status") as f:
        d = dict(x.split(":", 1) for x in f if ":" in x)
    return int(d["voluntary_ctxt_switches"]), int(d["nonvoluntary_ctxt_switches"])
os.read(0, 1)
t0a = time.monotonic_ns()
v0, n0 = switches()
t0 = time.monotonic_ns()
end = time.monotonic() + secs
while time.monotonic() < end:
    pass
t1a = time.monotonic_ns()
v1, n1 = switches()
t1 = time.monotonic_ns()
# the kernel's counts are of [t0a..t0, t1a..t1]: a switch between t0a and t0,
# or t1a and t1, may or may not be in them
print(json.dumps(dict(pid=os.getpid(), t0a=t0a, t0=t0, t1a=t1a, t1=t1, secs=secs, nvcsw=v1 - v0, nivcsw=n1 - n0,
                      cpus=sorted(os.sched_getaffinity(0)))))
"""

SNAP_SLEEPER = """
import json, os, sys, time
n, secs = int(sys.argv[1]), float(sys.argv[2])
os.read(0, 1)
for _ in range(n):
    time.sleep(secs)
os.write(1, (json.dumps(dict(pid=os.getpid(), sleeps=n, secs=secs, t_done=time.monotonic_ns())) + "\\n").encode())
os.read(0, 1)
"""


# a thread other than the leader that execs on its go byte (the kernel gives
# it the leader's pid); the new program waits for its stdin to close
THREAD_EXEC = """
import json, os, sys, threading
go = threading.Event()
def execs():
    go.wait()
    os.execv(sys.executable, [sys.executable, "-c", "import sys; sys.stdin.read()"])
t = threading.Thread(target=execs)
t.start()
os.write(1, (json.dumps(dict(leader=threading.get_native_id(), thread=t.native_id)) + "\\n").encode())
os.read(0, 1)
go.set()
threading.Event().wait()
"""


class StepTimeout(Exception):
    pass


class Runner:
    """Runs one step's commands within its deadline, each command's output
    kept in OUT/logs/<step>-<n>-<what>.{out,err}."""

    def __init__(self, out: str, step: str, limit: float):
        self.out, self.step = out, step
        self.deadline = time.monotonic() + limit
        self.n = 0
        self.procs: list[subprocess.Popen] = []

    def left(self, cap: float | None = None) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise StepTimeout(f"{self.step}: time limit reached")
        return min(left, cap) if cap else left

    def log(self, what: str) -> tuple[str, str]:
        self.n += 1
        base = os.path.join(self.out, "logs", f"{self.step}-{self.n:02d}-{what}")
        return base + ".out", base + ".err"

    def run(self, args: list[str], what: str, cap: float | None = None) -> subprocess.CompletedProcess:
        """pstate ARGS (or a command when args[0] is a path), output logged."""
        cmd = args if args[0].startswith("/") else [PSTATE, *args]
        out, err = self.log(what)
        with open(out, "w") as fo, open(err, "w") as fe:
            p = subprocess.Popen(cmd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs.append(p)
            try:
                rc = p.wait(timeout=self.left(cap))
            except subprocess.TimeoutExpired:
                kill(p, "timeout")
                raise StepTimeout(f"`{' '.join(cmd[1:4])}` did not end in time (its stack: {err})") from None
        with open(out) as fo, open(err) as fe:
            return subprocess.CompletedProcess(cmd, rc, fo.read(), fe.read())

    def spawn(self, code: str, *args, what: str) -> subprocess.Popen:
        """A workload: a Python child waiting for its go byte."""
        _, err = self.log(what)
        p = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=open(err, "w"), start_new_session=True)
        self.procs.append(p)
        return p

    def facts(self, p: subprocess.Popen, what: str) -> dict:
        """The JSON line a workload printed, once it ended."""
        try:
            out, _ = p.communicate(timeout=self.left(300))
        except subprocess.TimeoutExpired:
            kill(p)
            raise StepTimeout(f"the {what} workload did not end in time") from None
        if p.returncode != 0:
            raise RuntimeError(f"the {what} workload failed (exit {p.returncode}): see logs/")
        return json.loads(out.decode().strip().splitlines()[-1])

    def cleanup(self):
        for p in self.procs:
            if p.poll() is None:
                kill(p)


def kill(p: subprocess.Popen, why: str = ""):
    """End p's process group. With why (a time limit), SIGABRT first: a
    Python there (pstate) writes every thread's stack to its stderr
    (PYTHONFAULTHANDLER), to say where it was."""
    try:
        if why:
            os.killpg(p.pid, signal.SIGABRT)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def go(*procs):
    for p in procs:
        p.stdin.write(b"g")
        p.stdin.flush()


def tail(text: str, n: int = 600) -> str:
    """A command's output in one line: its first error line, then its end."""
    first = next((line.strip() for line in text.splitlines() if "error" in line.lower()), "")
    text = " ".join(text.split())
    end = text if len(text) <= n else "..." + text[-n:]
    return end if not first or first in end else f"{first} [...] {end}"


# --- reading a recording ----------------------------------------------------------

def read_jsonl(path: str) -> list[dict]:
    recs = []
    with open(path, errors="replace") as f:
        for line in f:
            try:
                recs.append(json.loads(line))
            except ValueError:
                pass
    return recs


def plan_of(meta: dict | None) -> dict | None:
    if meta is None:
        return None
    return {k: meta[k] for k in ("probes", "probe_paths", "wakeups_at", "probes_reason") if k in meta}


class Recording:
    """`pstate record ARGS` in the background, its output copied to a file;
    ready once its meta line is out."""

    def __init__(self, r: Runner, path: str, *args: str):
        self.path = path
        _, self.err = r.log("record")
        self.proc = subprocess.Popen([PSTATE, "record", "-q", *args], stdout=subprocess.PIPE,
                                     stderr=open(self.err, "w"), stdin=subprocess.DEVNULL, start_new_session=True)
        r.procs.append(self.proc)
        self.ready = threading.Event()
        self.copier = threading.Thread(target=self._copy, daemon=True)
        self.copier.start()
        self.t0 = time.monotonic()

    def _copy(self):
        with open(self.path, "wb") as f:
            while chunk := os.read(self.proc.stdout.fileno(), 1 << 16):
                f.write(chunk)
                if not self.ready.is_set() and b"\n" in chunk:
                    f.flush()
                    self.ready.set()
        self.ready.set()

    def wait_ready(self, r: Runner, cap: float) -> str | None:
        """None once the meta line is out, else why not."""
        limit = time.monotonic() + r.left(cap)
        while not self.ready.wait(1):
            if time.monotonic() > limit:
                kill(self.proc, "timeout")
                return f"no meta line within {cap:.0f} s (record's stack: {self.err})"
        if os.path.getsize(self.path) == 0:  # its output ended with no line: it exited
            try:
                rc = self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill(self.proc)
                rc = "killed"
            return f"record exited {rc}: {tail(self.stderr())}"
        self.ready_s = time.monotonic() - self.t0
        return None

    def stop(self, r: Runner) -> int:
        time.sleep(1)  # the last drain; frees come in an RCU callback
        self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=r.left(120))
        except subprocess.TimeoutExpired:
            kill(self.proc, "timeout")
            raise StepTimeout(f"record did not stop within 120 s of SIGINT (its stack: {self.err})") from None
        self.copier.join(30)
        return rc

    def stderr(self) -> str:
        with open(self.err, errors="replace") as f:
            return f.read()


def states(recs, tid, t0=None, t1=None):
    return [x for x in recs if x.get("type") == "state" and x.get("tid") == tid
            and (t0 is None or t0 <= x["ts"] <= t1)]


def summary(rs) -> str:
    return "; ".join(f"{x.get('cause')} {x.get('from')}->{x.get('to')} dur={x.get('dur_ns')}" for x in rs[:12])


# --- the checks -------------------------------------------------------------------

class Checks:
    def __init__(self, args):
        self.args = args
        self.out = args.out
        self.guest = args.mode == "guest"
        self.plan: dict = {}
        for d in ("results", "logs", "data"):
            os.makedirs(os.path.join(self.out, d), exist_ok=True)

    def result(self, name: str, ok, seconds: float, detail: str, **extra):
        doc = {"name": name, "ok": ok, "seconds": round(seconds, 1), "detail": detail, **extra}
        path = os.path.join(self.out, "results", name + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.rename(path + ".tmp", path)
        print(f"[{time.monotonic():9.1f}] {name}: {'skip' if ok is None else 'ok' if ok else 'FAIL'} "
              f"{seconds:.1f}s {detail}", flush=True)

    def save_plan(self, program: str, meta: dict | None):
        if meta is not None and program not in self.plan:
            self.plan[program] = plan_of(meta)
            with open(os.path.join(self.out, "plan.json"), "w") as f:
                json.dump(self.plan, f, indent=1)

    def run_step(self, step: str):
        r = Runner(self.out, step, LIMITS[step])
        t0 = time.monotonic()
        done = set()

        def report(name, ok, detail, seconds=None, **extra):
            done.add(name)
            self.result(name, ok, time.monotonic() - t0 if seconds is None else seconds, detail, **extra)

        try:
            getattr(self, "step_" + step)(r, report)
        except Exception as e:  # a step that broke or ran out of time fails its first check left
            why = (f"timeout: {e}" if isinstance(e, StepTimeout) else str(e) if isinstance(e, RuntimeError)
                   else f"{type(e).__name__}: {e}")
            left = [c for c in STEPS[step] if c not in done]
            for i, name in enumerate(left):
                if i == 0:
                    report(name, False, why)
                else:
                    report(name, None, f"not checked: {left[0]} failed", seconds=0)
        finally:
            r.cleanup()

    # doctor ------------------------------------------------------------------------

    def step_doctor(self, r, report):
        helptext = r.run(["doctor", "--help"], "doctor-help", cap=300).stdout
        args, note = ["doctor", "--format", "json"], ""
        if "--live-timeout" in helptext:
            args += ["--live-timeout", str(int(r.left() - 300))]
        elif self.args.accel == "tcg":
            args.append("--no-live")
            note = ("live check skipped: doctor's live test has a 60 s limit that TCG exceeds, "
                    "and doctor has no option to change it")
        p = r.run(args, "doctor")
        try:
            rows = json.loads(p.stdout)
        except ValueError:
            rows = []
        bad = [f"{x['check']}: {x['detail']}" for x in rows if x.get("status") not in ("ok", "warning")]
        warn = [f"{x['check']}: {x['detail']}" for x in rows if x.get("status") == "warning"]
        detail = "; ".join(bad) if bad else (f"{len(rows)} checks ok" + (f", warnings: {'; '.join(warn)}" if warn else ""))
        if not rows:
            detail = f"exit {p.returncode}: {tail(p.stderr or p.stdout)}"
        report("doctor", p.returncode == 0, "; ".join(x for x in (detail, note) if x))

    # record --------------------------------------------------------------------------

    def scratch_file(self, name: str) -> str:
        return os.path.join(self.args.scratch, name)

    def step_record(self, r, report):
        w = {
            "sleeper": r.spawn(SLEEPER, SLEEPS, SLEEP_S, what="sleeper"),
            "direct-io": r.spawn(DIRECT_WRITER, self.scratch_file("direct.bin"), WRITES, BLOCKED, what="direct-io"),
            "fork-exec": r.spawn(FORK_EXEC, FORKS, what="fork-exec"),
            "thread-exit": r.spawn(THREAD_EXIT, THREADS, what="thread-exit"),
        }
        path = os.path.join(self.out, "data", "record.jsonl")
        rec = Recording(r, path)
        why = rec.wait_ready(r, r.left() - 300)
        if why:
            raise RuntimeError(why)
        go(*w.values())
        facts = {k: r.facts(p, k) for k, p in w.items()}
        rc = rec.stop(r)
        recs = read_jsonl(path)
        meta = next((x for x in recs if x.get("type") == "meta"), None)
        end = next((x for x in recs if x.get("type") == "end"), None)
        self.save_plan("record", meta)
        ok = rc == 0 and meta is not None and end is not None
        detail = (f"ready in {rec.ready_s:.1f} s, exit {rc}, {len(recs)} lines" +
                  (f", end: {end.get('events')} events, {end.get('lost')} lost" if end else ", no end record") +
                  (f"; probes {meta.get('probes')}" if meta else ""))
        if rc != 0:
            detail += f"; stderr: {tail(rec.stderr())}"
        report("record", ok, detail, seconds=rec.ready_s)
        self.check_sleeper(recs, facts["sleeper"], report)
        self.check_direct_io(recs, facts["direct-io"], report)
        self.check_fork_exec(recs, facts["fork-exec"], report)
        self.check_thread_exit(recs, facts["thread-exit"], report)
        self.check_stats(r, path, recs, facts, report)

    def check_sleeper(self, recs, f, report):
        mine = states(recs, f["tid"], f["t0"], f["t1"])
        outs = [x for x in mine if x["cause"] == "switch_out" and x["to"] == "sleeping"]
        wakes = [x for x in mine if x["from"] == "sleeping" and x["to"] == "runnable" and x["dur_ns"] is not None]
        # Python's time.sleep() sleeps until a deadline taken as it is
        # called: a thread preempted before it blocks spends less than the
        # sleep in S (Linux 6.1-rt under TCG: 13 ms of a 20 ms sleep), but
        # each sleep still ends at least its length after the previous one
        ends = [f["t0"]] + [x["ts"] for x in wakes]
        short = [x for x, prev in zip(wakes, ends) if x["ts"] - prev < 0.9 * f["secs"] * 1e9 or x["dur_ns"] <= 0]
        n = f["sleeps"]
        ok = len(outs) == n and len(wakes) == n and not short
        detail = f"{len(wakes)} wake-ups ending S and {len(outs)} switch-outs into S for {n} sleeps of tid {f['tid']}"
        if short:
            detail += f"; {len(short)} shorter than the sleep"
        if not ok:
            detail += f"; its records: {summary(mine)}"
        report("record-sleeper", ok, detail, seconds=(f["t1"] - f["t0"]) / 1e9)

    def check_direct_io(self, recs, f, report):
        mine = states(recs, f["tid"], f["t0"], f["t1"])
        vol = [x for x in mine if x["cause"] == "switch_out" and x.get("voluntary") is True]
        d_out = [x for x in vol if x["to"] == "uninterruptible"]
        d_end = [x for x in mine if x["from"] == "uninterruptible" and x["to"] == "runnable" and x["dur_ns"] is not None]
        # In the window the writer only writes: a write that blocks is one
        # voluntary switch-out into D and one wake-up ending it, and the
        # kernel's own count of its voluntary switches (nvcsw, read by the
        # writer around the window) is the number of writes that blocked.
        ok = len(vol) == f["nvcsw"] and len(d_out) == len(vol) == len(d_end) >= min(BLOCKED, f["writes"])
        detail = (f"{f['writes']} O_DIRECT writes: {len(d_out)} switch-outs into D, {len(d_end)} wake-ups ending D, "
                  f"{len(vol)} voluntary switch-outs traced, {f['nvcsw']} counted by the kernel")
        if not ok:
            detail += f"; its records: {summary(mine)}"
        report("record-direct-io", ok, detail, seconds=(f["t1"] - f["t0"]) / 1e9)

    def check_fork_exec(self, recs, f, report):
        kids = f["kids"]
        forks = [x for x in recs if x.get("type") == "fork" and x.get("tid") == f["pid"]]
        execs = [x for x in recs if x.get("type") == "exec" and x.get("tid") in kids]
        exits = [x for x in recs if x.get("type") == "exit" and x.get("tid") in kids]
        problems = []
        if sorted(x["child_tid"] for x in forks) != sorted(kids) or any(x.get("thread") for x in forks):
            problems.append(f"forks: {[(x.get('child_pid'), x.get('child_tid'), x.get('thread')) for x in forks]}")
        if sorted(x["tid"] for x in execs) != sorted(kids) or any(x.get("comm") != "true" for x in execs):
            problems.append(f"execs: {[(x.get('tid'), x.get('comm')) for x in execs]}")
        if sorted(x["tid"] for x in exits) != sorted(kids):
            problems.append(f"exits: {[x.get('tid') for x in exits]}")
        if any(x.get("group_dead") is not True for x in exits):
            problems.append(f"group_dead: {[x.get('group_dead', 'absent') for x in exits]}")
        detail = (f"{len(kids)} children forked, each exec'd /bin/true: {len(forks)} fork, {len(execs)} exec, "
                  f"{len(exits)} exit records")
        report("record-fork-exec", not problems, "; ".join([detail] + problems), seconds=0)

    def check_thread_exit(self, recs, f, report):
        tids = f["tids"]
        exits = [x for x in recs if x.get("type") == "exit" and x.get("tid") in tids]
        forks = [x for x in recs if x.get("type") == "fork" and x.get("child_tid") in tids]
        dead = [x for x in exits if x.get("group_dead") is True]
        ok = (sorted(x["tid"] for x in exits) == sorted(tids) and len(dead) == 1
              and len(forks) == len(tids) - 1 and all(x.get("thread") is True for x in forks))
        detail = (f"a process of {len(tids)} threads exited: {len(exits)} exit records, {len(dead)} with group_dead "
                  f"true; {len(forks)} thread forks of {len(tids) - 1}")
        if not ok:
            detail += f"; group_dead: {[x.get('group_dead', 'absent') for x in exits]}"
        report("record-thread-exit", ok, detail, seconds=0)

    def check_stats(self, r, path, recs, facts, report):
        t0 = time.monotonic()
        p = r.run(["stats", "-f", "json", "--by", "tid", path], "stats", cap=600)
        if p.returncode != 0:
            report("stats", False, f"exit {p.returncode}: {tail(p.stderr)}")
            return
        doc = json.loads(p.stdout)
        groups = {g["tid"]: g for g in doc["groups"]}
        problems = []
        inp = doc["input"]
        if inp.get("skipped_total") or not inp.get("complete"):
            problems.append(f"input: {inp}")
        for what, tid, state in (("sleeper", facts["sleeper"]["tid"], "sleeping"),
                                 ("writer", facts["direct-io"]["tid"], "uninterruptible")):
            raw = sum(1 for x in states(recs, tid) if x["from"] == state and x["dur_ns"] is not None)
            got = groups.get(tid, {}).get("latency", {}).get(f"blocked_{state}", {}).get("count", 0)
            if got != raw:
                problems.append(f"{what}: {got} {state} intervals in stats, {raw} in the recording")
        forks = groups.get(facts["fork-exec"]["pid"], {}).get("forks")
        if forks != FORKS:
            problems.append(f"fork parent: {forks} forks in stats, {FORKS} made")
        detail = "; ".join(problems) or (f"stats -f json --by tid read {inp.get('records')} records; the sleeper's S, "
                                         f"the writer's D intervals and the forks as in the recording")
        report("stats", not problems, detail, seconds=time.monotonic() - t0)

    # record --stacks -------------------------------------------------------------

    def step_stacks(self, r, report):
        writer = r.spawn(DIRECT_WRITER, self.scratch_file("stacks.bin"), WRITES, BLOCKED // 2, what="direct-io")
        path = os.path.join(self.out, "data", "record-stacks.jsonl")
        rec = Recording(r, path, "--stacks", "D")
        why = rec.wait_ready(r, r.left() - 200)
        if why:
            raise RuntimeError(why)
        go(writer)
        f = r.facts(writer, "direct-io")
        rc = rec.stop(r)
        recs = read_jsonl(path)
        self.save_plan("record", next((x for x in recs if x.get("type") == "meta"), None))
        stacks = {x["stack_id"]: x["frames"] for x in recs if x.get("type") == "stack"}
        end = next((x for x in recs if x.get("type") == "end"), {})
        ds = [x for x in states(recs, f["tid"], f["t0"], f["t1"])
              if x["from"] == "uninterruptible" and x["to"] == "runnable" and x["dur_ns"] is not None]
        # each D interval with its stack, in the direct-I/O path, and a reason
        # there (the first frame that is not scheduler plumbing: __iomap_dio_rw)
        with_stack = [x for x in ds if x.get("stack_id") in stacks]
        in_dio = [x for x in with_stack if "dio" in stacks[x["stack_id"]]]
        reasons: dict = {}
        for x in with_stack:
            reasons[x.get("reason")] = reasons.get(x.get("reason"), 0) + 1
        dio_reasons = sum(n for why, n in reasons.items() if why and "dio" in why)
        ok = (rc == 0 and len(ds) == f["nvcsw"] > 0 and len(with_stack) == len(in_dio) == dio_reasons == len(ds)
              and not end.get("stack_lost"))
        detail = (f"ready in {rec.ready_s:.1f} s; {len(ds)} D intervals ({f['nvcsw']} writes blocked), "
                  f"{len(with_stack)} with their stack, {len(in_dio)} of them in the direct-I/O path; reasons "
                  f"{reasons}; stack_failed {end.get('stack_failed')}, stack_lost {end.get('stack_lost')}")
        if rc != 0:
            detail += f"; exit {rc}: {tail(rec.stderr())}"
        report("record-stacks", bool(ok), detail)

    # snap ------------------------------------------------------------------------------

    @staticmethod
    def snapshots(d: str) -> list[list[dict]]:
        return [read_jsonl(p) for p in sorted(glob.glob(os.path.join(d, "pstate-snap-*.jsonl")))]

    def grew(self, before: list[dict], after: list[dict], f: dict) -> list[str]:
        """What is wrong with how the workload's row grew from one snapshot to the next."""
        rows = [next((x for x in s if x.get("type") == "task" and x.get("tid") == f["pid"]), None)
                for s in (before, after)]
        if None in rows:
            return [f"the workload (tid {f['pid']}) is missing from a snapshot: {[x is not None for x in rows]}"]
        a, b = rows
        # its go byte's wake-up, then per sleep a switch-out and a wake-up,
        # then a switch-out as it blocks on its stdin again
        want = f["sleeps"] + 1
        problems = []
        for key in ("wakeups", "nvcsw"):
            if b[key] - a[key] != want:
                problems.append(f"{key} grew by {b[key] - a[key]}, not {want}")
        # of its on-CPU time, what the kernel counted as stolen or spent in
        # interrupts (its own se.sum_exec_runtime grew by the rest)
        if "steal_irq_ns" not in b:
            problems.append("its row has no steal_irq_ns")
        elif not 0 <= b["steal_irq_ns"] - a["steal_irq_ns"] <= b["running_ns"] - a["running_ns"]:
            problems.append(f"steal_irq_ns grew by {b['steal_irq_ns'] - a['steal_irq_ns']}, running_ns by "
                            f"{b['running_ns'] - a['running_ns']}")
        slept = (b["sleeping_ns"] - a["sleeping_ns"]) / 1e9
        if slept < 0.9 * f["sleeps"] * f["secs"]:
            problems.append(f"sleeping_ns grew by {slept:.3f} s only")
        return problems

    @staticmethod
    def exec_moved(before: list[dict], after: list[dict], ids: dict) -> list[str]:
        """A thread that exec'd between the snapshots: its row under the
        leader's tid with its birth, the old leader's final row reaped."""
        leader, thread = ids["leader"], ids["thread"]
        rows = [{(x["tid"], x["start_ts"]): x for x in s if x.get("type") == "task" and x.get("pid") == leader}
                for s in (before, after)]
        first = {tid: row for (tid, _), row in rows[0].items()}
        if set(first) != {leader, thread}:
            return [f"before its exec, the process's rows are of tids {sorted(first)}, not {[leader, thread]}"]
        moved = rows[1].get((leader, first[thread]["start_ts"]))
        old = rows[1].get((leader, first[leader]["start_ts"]))
        problems = []
        if moved is None or moved["sleeping_ns"] < first[thread]["sleeping_ns"]:
            problems.append(f"the thread that exec'd did not go on under the leader's pid: {sorted(rows[1])}")
        if old is None or old["state"] != "reaped":
            problems.append(f"the old leader's final row is missing: {old}")
        return problems

    @staticmethod
    def kernel_clock(snap: list[dict]) -> list[str]:
        """Every kernel of the matrix has se.sum_exec_runtime in its BTF: on-CPU
        time is the kernel's count (steal_irq_ns apart)."""
        meta = snap[0] if snap else {}
        if meta.get("on_cpu_time") != "kernel":
            return [f"on_cpu_time {meta.get('on_cpu_time')!r}, not kernel"]
        return []

    def step_snap(self, r, report):
        d = os.path.join(self.out, "data", "snap")
        w = r.spawn(SNAP_SLEEPER, SNAP_SLEEPS, SLEEP_S, what="sleeper")
        x = r.spawn(THREAD_EXEC, what="thread-exec")
        ids = self.read_line(r, x)
        out, err = r.log("snap")
        t0 = time.monotonic()
        snap = subprocess.Popen([PSTATE, "snap", "--dir", d, "-i", SNAP_INTERVAL, "-n", "2"],
                                stdout=open(out, "w"), stderr=open(err, "w"), stdin=subprocess.DEVNULL,
                                start_new_session=True)
        r.procs.append(snap)
        while len(glob.glob(os.path.join(d, "pstate-snap-*.jsonl"))) < 1:
            if snap.poll() is not None:
                raise RuntimeError(f"snap exited {snap.returncode} before its first snapshot: {tail(open(err).read())}")
            r.left()
            time.sleep(0.5)
        first_s = time.monotonic() - t0
        go(w, x)
        f = self.read_line(r, w)
        try:
            rc = snap.wait(timeout=r.left(300))
        except subprocess.TimeoutExpired:
            raise StepTimeout("snap did not write its second snapshot") from None
        w.stdin.close()
        snaps = self.snapshots(d)
        if snaps:
            self.save_plan("snap", snaps[0][0] if snaps[0] and snaps[0][0].get("type") == "meta" else None)
        if rc != 0 or len(snaps) != 2:
            raise RuntimeError(f"snap exited {rc} with {len(snaps)} snapshots: {tail(open(err).read())}")
        problems = []
        if snaps[1][0]["ts"] < f["t_done"]:
            problems.append(f"the workload ended after the second snapshot (interval {SNAP_INTERVAL} too short here)")
        problems += self.grew(snaps[0], snaps[1], f)
        problems += self.kernel_clock(snaps[0])
        problems += self.exec_moved(snaps[0], snaps[1], ids)
        detail = (f"first snapshot {first_s:.1f} s after start; between the two, {f['sleeps']} sleeps: "
                  + ("; ".join(problems) if problems else f"wakeups and nvcsw grew by {f['sleeps'] + 1}; a thread "
                     "that exec'd went on under its leader's pid and the old leader's row ended reaped"))
        report("snap", not problems, detail)

    def read_line(self, r, p) -> dict:
        limit = time.monotonic() + r.left(300)
        while time.monotonic() < limit:
            ready, _, _ = select.select([p.stdout], [], [], 1)
            if ready:
                return json.loads(p.stdout.readline())
        raise StepTimeout("the workload did not report")

    def step_collector(self, r, report):
        d = os.path.join(self.out, "data", "collector")
        w = r.spawn(SNAP_SLEEPER, SNAP_SLEEPS, SLEEP_S, what="sleeper")
        problems = []
        t0 = time.monotonic()
        p = r.run(["snap", "--start"], "start")
        if p.returncode != 0:
            raise RuntimeError(f"snap --start exited {p.returncode}: {tail(p.stderr)}")
        start_s = time.monotonic() - t0
        try:
            a = r.run(["snap", "--dir", d], "snap-a", cap=600)
            go(w)
            f = self.read_line(r, w)
            b = r.run(["snap", "--dir", d], "snap-b", cap=600)
            st = r.run(["snap", "--status"], "status", cap=300)
        finally:
            stop = r.run(["snap", "--stop"], "stop", cap=300)
        w.stdin.close()
        snaps = self.snapshots(d)
        if snaps and snaps[0]:
            self.save_plan("snap", snaps[0][0])
        for what, q in (("snap --dir (first)", a), ("snap --dir (second)", b), ("snap --status", st),
                        ("snap --stop", stop)):
            if q.returncode != 0:
                problems.append(f"{what} exited {q.returncode}: {tail(q.stderr, 300)}")
        if len(snaps) == 2:
            problems += self.grew(snaps[0], snaps[1], f)
            problems += self.kernel_clock(snaps[0])
        else:
            problems.append(f"{len(snaps)} snapshots written, not 2")
        left = [os.path.join(dp, n) for dp, ds, fs in os.walk("/sys/fs/bpf/pstate") for n in ds + fs]
        if left:
            problems.append(f"left pinned after --stop: {left[:5]}")
        after = r.run(["snap", "--status"], "status-after", cap=300)
        if after.returncode == 0:
            problems.append("snap --status still finds a collector after --stop")
        detail = (f"--start took {start_s:.1f} s; " +
                  ("; ".join(problems) if problems else
                   f"two snapshots of it: wakeups and nvcsw grew by {f['sleeps'] + 1}; --status ok; "
                   "nothing left pinned after --stop"))
        report("snap-collector", not problems, detail)


    # peers: BCC's own tools beside pstate -----------------------------------------------

    def step_peers(self, r, report):
        stats_path = "/proc/sys/kernel/bpf_stats_enabled"
        was = None
        try:
            if not self.guest:  # a system-wide switch: the guest's own only
                raise OSError
            with open(stats_path) as f:
                was = f.read().strip()
            with open(stats_path, "w") as f:
                f.write("1")  # run counts of every program (bpf_programs in peers.json)
        except OSError:
            pass
        try:
            self.run_peers(r, report)
        finally:
            if was is not None:
                with open(stats_path, "w") as f:
                    f.write(was)

    def run_peers(self, r, report):
        """offcputime (D, kernel stacks) and runqlat -p beside record --stacks
        on an O_DIRECT writer and two hogs pinned to one CPU, all at once; the
        comparison (peers.py) goes to OUT/peers.json."""
        import peers

        tools = {t: shutil.which(f"{t}-bpfcc", path=SYSTEM_PATH) for t in ("offcputime", "runqlat")}
        if None in tools.values():
            pkg = subprocess.run(["dpkg-query", "-W", "-f", "${Status} ${Version}", "bpfcc-tools"],
                                 capture_output=True, text=True)
            raise RuntimeError(f"BCC's tools are missing ({', '.join(t + '-bpfcc' for t, p in tools.items() if not p)} "
                               f"not found; bpfcc-tools: {pkg.stdout.strip() or 'not installed'}): nothing to compare with")
        cpus = sorted(os.sched_getaffinity(0))
        wcpu, hcpu = cpus[0], cpus[-1]
        writer = r.spawn(DIRECT_WRITER, self.scratch_file("peers.bin"), WRITES, PEER_BLOCKED, what="direct-io")
        hogs = [r.spawn(HOG, HOG_S, what=f"hog{i}") for i in range(2)]
        os.sched_setaffinity(writer.pid, {wcpu})
        for h in hogs:
            os.sched_setaffinity(h.pid, {hcpu})
        path = os.path.join(self.out, "data", "record-peers.jsonl")
        rec = Recording(r, path, "--stacks", "D")
        env, headers = dict(os.environ), "BCC's own lookup (/lib/modules/<release>/build)"
        off_args = ["-K", "--state", "2", "-f", "-p", str(writer.pid)]
        # runqlat once per hog (-p): -P (bcc 0.26) keys its histogram by
        # {u32 pid; u64 slot} without setting the padding between them, so
        # one row takes several of the map's 64 entries (55 for 24 rows after
        # 3 s here); in a 6.1 guest the map was full before the workload ran
        # and neither the hogs nor the writer had a row (and where a row has
        # several entries the printout keeps one of them)
        # and offcputime of every state: its --state filter reads the task's
        # state in finish_task_switch, after the switch; this one is not
        # filtered (the writer blocks only in D)
        any_args = ["-K", "-f", "-p", str(writer.pid)]
        running = {"offcputime": Peer(r, tools["offcputime"], off_args, env),
                   "offcputime-any": Peer(r, tools["offcputime"], any_args, env)}
        for i, h in enumerate(hogs):
            running[f"runqlat-{i}"] = Peer(r, tools["runqlat"], ["-p", str(h.pid)], env)
        ready, failed = {}, {}
        for name in list(running):
            peer = running[name]
            why = peer.wait_ready(r, r.left() - 400)
            if why and peer.headers_missing():
                # BCC did not find a header tree it can compile with: the one
                # pstate compiles with, as BCC_KERNEL_SOURCE
                from pstate.kernel import headers as kheaders
                tree = kheaders.find()
                env = dict(os.environ, BCC_KERNEL_SOURCE=tree.path)
                headers = f"BCC_KERNEL_SOURCE={tree.path} (pstate's tree, {tree.origin}): BCC's own lookup failed"
                peer = running[name] = Peer(r, peer.exe, peer.args, env)
                why = peer.wait_ready(r, r.left() - 400)
            if why:
                failed[name] = f"{os.path.basename(peer.exe)} {' '.join(peer.args)}: {why}"
                continue
            ready[name] = round(peer.ready_s, 1)
        if len(failed) == len(running):
            raise RuntimeError("; ".join(failed.values()))
        why = rec.wait_ready(r, r.left() - 400)
        if why:
            raise RuntimeError(why)
        time.sleep(1)
        go(writer, *hogs)
        wf = r.facts(writer, "direct-io")
        hf = [r.facts(h, f"hog{i}") for i, h in enumerate(hogs)]
        time.sleep(1)
        progs = bpf_progs({rec.proc.pid: "pstate record", **{p.proc.pid: n for n, p in running.items()}})
        outs = {name: peer.stop(r) if name not in failed else (None, "", failed[name])
                for name, peer in running.items()}
        off_out = outs["offcputime"]
        rc = rec.stop(r)
        recs = read_jsonl(path)
        self.save_plan("record", next((x for x in recs if x.get("type") == "meta"), None))
        if rc != 0:
            raise RuntimeError(f"record exited {rc}: {tail(rec.stderr())}")
        ds = [x for x in states(recs, wf["tid"], wf["t0"], wf["t1"])
              if x["from"] == "uninterruptible" and x["dur_ns"] is not None]
        pkg = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "bpfcc-tools"], capture_output=True, text=True)
        doc = {"kernel": os.uname().release, "accel": self.args.accel,
               "pstate_wakeups_at": (self.plan.get("record") or {}).get("wakeups_at"),
               "tools": {**tools, "bcc_version": pkg.stdout.strip() or "?", "bcc_headers": headers,
                         "ready_s": ready, "record_ready_s": round(rec.ready_s, 1)}}

        # the writer's D time by stack
        stacks = r.run(["stats", "--stacks", "D", "-f", "json", "--by", "all", "--top", "50", "-p", str(wf["pid"]),
                        path], "stats-stacks", cap=600)
        r.run(["stats", "-f", "folded", "--stacks", "D", "-p", str(wf["pid"]), path], "stats-folded", cap=600)
        off_doc = {"writer": wf, "cpu": wcpu, "offcputime_cmd": f"offcputime-bpfcc {' '.join(off_args[:-1])} PID",
                   "pstate_d_count_in_window": len(ds)}
        if stacks.returncode != 0 or off_out[0] != 0:
            off_doc["error"] = (f"stats exited {stacks.returncode}: {tail(stacks.stderr)}" if stacks.returncode
                                else failed.get("offcputime") or f"offcputime exited {off_out[0]}: {tail(off_out[2])}")
        else:
            st = json.loads(stacks.stdout)
            g = (st.get("groups") or [{}])[0]
            lat = g.get("latency", {})
            off_doc["pstate_d_count"] = lat.get("blocked_uninterruptible", {}).get("count", 0)
            runq_w = lat.get("runq_wakeup", {})
            off_doc["pstate_runq_after_wakeup_us"] = round(runq_w.get("count", 0) * runq_w.get("mean_ns", 0) / 1000)
            off_doc["compare"] = peers.compare_stacks(peers.offcputime_rows(off_out[1]), peers.pstate_rows(st))
            off_doc["offcputime_section_bounds"] = peers.section_bounds(off_out[1])
            any_out = outs["offcputime-any"]
            if any_out[0] == 0:
                # until back on CPU, both: offcputime of every state, and
                # pstate's D plus the run-queue wait after its wake-up
                off_doc["offcputime_any_cmd"] = f"offcputime-bpfcc {' '.join(any_args[:-1])} PID"
                off_doc["compare_until_on_cpu"] = peers.compare_stacks(
                    peers.offcputime_rows(any_out[1]), peers.pstate_offcpu_rows(recs, wf["tid"]))
            else:
                off_doc["offcputime_any_error"] = tail(any_out[2])
        # the BPF programs' runs and misses (kprobes skip a run while another
        # BPF program or a bpf() call holds the CPU's bpf_prog_active)
        off_doc["bpf_programs"] = progs
        doc["offcpu"] = off_doc

        # the hogs' run-queue latency
        pids = [f["pid"] for f in hf]
        hist = r.run(["stats", "--by", "all", "--hist", "-f", "json", *[a for p in pids for a in ("-p", str(p))], path],
                     "stats-hist", cap=600)
        rq_doc = {"hogs": hf, "cpu": hcpu, "seconds": HOG_S, "runqlat_cmd": "runqlat-bpfcc -p PID (one per hog)",
                  "truth_waits": sum(f["nvcsw"] + f["nivcsw"] for f in hf),
                  # switch-outs surely inside the counts' window, and maybe
                  "pstate_switch_outs_in_window": sum(
                      1 for f in hf for x in states(recs, f["pid"], f["t0"], f["t1a"]) if x["cause"] == "switch_out"),
                  "pstate_switch_outs_at_edges": sum(
                      1 for f in hf for x in states(recs, f["pid"], f["t0a"], f["t1"]) if x["cause"] == "switch_out"
                      and not f["t0"] <= x["ts"] <= f["t1a"]),
                  "pstate_waits_in_window": sum(
                      1 for f in hf for x in states(recs, f["pid"], f["t0"], f["t1"])
                      if x["from"] in ("runnable", "preempted") and x["dur_ns"] is not None)}
        rq_outs = [outs[f"runqlat-{i}"] for i in range(len(hogs))]
        bad = next((o for o in rq_outs if o[0] != 0), None)
        if hist.returncode != 0 or bad:
            rq_doc["error"] = (f"stats exited {hist.returncode}: {tail(hist.stderr)}" if hist.returncode
                               else f"runqlat exited {bad[0]}: {tail(bad[2])}")
        else:
            sections = [peers.parse_log2_hist(o[1]).get(None) for o in rq_outs]
            found = [p for p, sec in zip(pids, sections) if sec and sec["hist"]]
            rq_doc["runqlat_hogs_found"] = found
            rq_doc["runqlat_units"] = sorted({sec["unit"] for sec in sections if sec})
            bcc = peers.merge_hists([sec["hist"] for sec in sections if sec])
            # and the same from the recording's own records, exact to the ns
            # (stats' histograms are exact to 1/64 of a bucket)
            rq_doc["compare_records"] = peers.compare_hists(bcc, peers.log2_hist_us(
                [x["dur_ns"] for p in pids for x in states(recs, p)
                 if x["from"] in ("runnable", "preempted") and x["dur_ns"] is not None]))
            try:
                rq_doc["compare"] = peers.compare_hists(bcc, peers.pstate_runq_hist(json.loads(hist.stdout)))
            except ValueError as e:  # stats chose msecs rows: the records' rows stand in
                rq_doc["compare_note"] = f"stats: {e}; the histogram of the records instead"
                rq_doc["compare"] = rq_doc["compare_records"]
        doc["runq"] = rq_doc
        with open(os.path.join(self.out, "peers.json"), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")

        # the checks: each tool ran, saw what the workload did, and the two agree
        if "error" in off_doc:
            report("peers-offcpu", False, off_doc["error"])
        else:
            c = off_doc["compare"]
            top = c["stacks"][0] if c["stacks"] else {}
            big = {k for tool in ("offcputime", "pstate") for k, v in c["reasons"][tool].items() if v >= 0.01}
            same = all(c["reasons"][tool].get(k) for tool in ("offcputime", "pstate") for k in big)
            ok = len(ds) == wf["nvcsw"] > 0 and c["top_agrees"] and same
            detail = (f"{wf['nvcsw']} writes blocked, {len(ds)} D intervals in pstate's window; D total "
                      f"offcputime {c['offcputime_total_us'] / 1000:.1f} ms, pstate {c['pstate_total_us'] / 1000:.1f} ms "
                      f"(+{off_doc['pstate_runq_after_wakeup_us'] / 1000:.1f} ms run queue after the wake-ups); top "
                      f"stack {'the same' if c['top_agrees'] else 'NOT the same'}: {top.get('reason')} "
                      f"{100 * top.get('offcputime_share', 0):.1f}% / {100 * top.get('pstate_share', 0):.1f}%; "
                      f"reasons of 1% or more {'in both' if same else 'NOT in both'}: {sorted(big)}")
            u = off_doc.get("compare_until_on_cpu")
            if u:
                detail += (f"; until back on CPU: offcputime (any state) {u['offcputime_total_us'] / 1000:.1f} ms, "
                           f"pstate {u['pstate_total_us'] / 1000:.1f} ms")
            report("peers-offcpu", ok, detail)
        if "error" in rq_doc:
            report("peers-runqlat", False, rq_doc["error"])
        else:
            h = rq_doc["compare"]
            a, b = h["counts"]
            inner = rq_doc["pstate_switch_outs_in_window"]
            ok = (inner <= rq_doc["truth_waits"] <= inner + rq_doc["pstate_switch_outs_at_edges"]
                  and len(rq_doc["runqlat_hogs_found"]) == len(pids) and rq_doc["runqlat_units"] == ["usecs"]
                  and abs(a - b) <= max(4, 0.02 * b) and h["shape_distance"] is not None
                  and h["shape_distance"] <= PEER_SHAPE_GAP)
            detail = (f"hogs' run-queue waits: runqlat {a}, pstate {b}; in the hogs' window the kernel counted "
                      f"{rq_doc['truth_waits']} switches, pstate {inner} switch-outs "
                      f"(+{rq_doc['pstate_switch_outs_at_edges']} as it read them) "
                      f"and {rq_doc['pstate_waits_in_window']} waits ended; "
                      f"fullest bucket {h['modes'][0]} / {h['modes'][1]} us; shape distance {h['shape_distance']}; "
                      f"runqlat histograms for {len(rq_doc['runqlat_hogs_found'])} of {len(pids)} hogs")
            report("peers-runqlat", ok, detail)


def bpf_progs(owners: dict[int, str]) -> list[dict]:
    """The BPF programs these processes hold: names, types, run counts (with
    kernel.bpf_stats_enabled) and misses (bpftool prog show)."""
    p = subprocess.run(["bpftool", "-j", "prog", "show"], capture_output=True, text=True)
    try:
        progs = json.loads(p.stdout)
    except ValueError:
        return [{"error": tail(p.stderr or p.stdout, 200)}]
    ids: dict[int, int] = {}  # program id -> the process holding it (its fds' fdinfo)
    for pid in owners:
        for fd in glob.glob(f"/proc/{pid}/fdinfo/*"):
            try:
                with open(fd) as f:
                    info = dict(line.split(":", 1) for line in f if ":" in line)
            except OSError:
                continue
            if "prog_id" in info:
                ids[int(info["prog_id"])] = pid
    keep = ("id", "type", "name", "run_cnt", "run_time_ns", "recursion_misses")
    return [dict({k: x[k] for k in keep if k in x}, owner=owners[ids[x["id"]]]) for x in progs if x.get("id") in ids]


class Peer:
    """One of BCC's tools running until SIGINT, its output in OUT/logs/;
    attached once it holds a perf event or BPF link (offcputime -f says
    nothing until it ends)."""

    def __init__(self, r: Runner, exe: str, args: list[str], env: dict):
        self.exe, self.args = exe, args
        self.out, self.err = r.log(os.path.basename(exe))
        self.proc = subprocess.Popen([exe, *args], stdout=open(self.out, "w"), stderr=open(self.err, "w"),
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=env,
                                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        r.procs.append(self.proc)
        self.t0 = time.monotonic()

    def attached(self) -> bool:
        fd_dir = f"/proc/{self.proc.pid}/fd"
        try:
            links = [os.readlink(os.path.join(fd_dir, n)) for n in os.listdir(fd_dir)]
        except OSError:
            return False
        return any("perf_event" in x or "bpf_link" in x or "bpf-link" in x for x in links)

    def wait_ready(self, r: Runner, cap: float) -> str | None:
        limit = time.monotonic() + r.left(cap)
        while not self.attached():
            if self.proc.poll() is not None:
                return f"exited {self.proc.returncode} before it attached: {tail(self.stderr())}"
            if time.monotonic() > limit:
                kill(self.proc, "timeout")
                return f"not attached within {cap:.0f} s: {tail(self.stderr())}"
            time.sleep(0.5)
        time.sleep(0.5)  # the rest of its probes
        self.ready_s = time.monotonic() - self.t0
        return None

    def headers_missing(self) -> bool:
        text = self.stderr()
        return any(x in text for x in ("kernel headers", "kheaders", "file not found", "/build)"))

    def stop(self, r: Runner) -> tuple[int | None, str, str]:
        """SIGINT (as Ctrl-C): it prints what it gathered and exits."""
        self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout=r.left(600))
        except subprocess.TimeoutExpired:
            kill(self.proc, "timeout")
            raise StepTimeout(f"{os.path.basename(self.exe)} did not end within 600 s of SIGINT") from None
        with open(self.out, errors="replace") as f:
            return rc, f.read(), self.stderr()

    def stderr(self) -> str:
        with open(self.err, errors="replace") as f:
            return f.read()


# --- the guest's set-up --------------------------------------------------------------

def sh(*cmd, check=True) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def mounted(path: str) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f)


def mount_label(label: str, where: str):
    os.makedirs(where, exist_ok=True)
    for _ in range(20):  # the virtio disks show up shortly after virtio_blk is loaded
        if subprocess.run(["mount", f"LABEL={label}", where], capture_output=True).returncode == 0:
            return
        time.sleep(0.5)
    raise RuntimeError(f"no disk labelled {label} (see /proc/partitions: {open('/proc/partitions').read().split()[4:]})")


def setup_guest(args) -> list[str]:
    """The guest's mounts: its own bpffs, the program cache disk, the scratch
    disk, and the kernel's Debian header trees where the packages put them.
    Returns what did not work (each check then fails on its own)."""
    problems = []

    def step(what, fn, *a):
        try:
            fn(*a)
        except Exception as e:
            problems.append(f"{what}: {e}")

    resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    for fs, where in (("tracefs", "/sys/kernel/tracing"), ("debugfs", "/sys/kernel/debug"), ("bpf", "/sys/fs/bpf")):
        if not mounted(where):
            step(f"mount {fs}", sh, "mount", "-t", fs, fs, where)
    for mod in ("virtio_blk", "ext4"):
        sh("modprobe", mod, check=False)
    step("program cache", setup_program_cache)
    step("scratch disk", mount_label, "pstate-scratch", args.scratch)
    step("header trees", setup_headers, args.kernel_root)
    return problems


def setup_program_cache():
    """The kernel's persistent disk is all of /var/cache/pstate: the program
    cache and the merged header trees whose identity its keys hold. (A tree
    merged anew at each boot, on a tmpfs, has new inodes and times, and every
    key then missed: each run compiled every program again.)"""
    cache = os.path.dirname(PROGRAM_CACHE)
    os.makedirs(cache, exist_ok=True)
    mount_label("pstate-programs", cache)
    for d in (cache, PROGRAM_CACHE):
        os.makedirs(d, exist_ok=True)
        os.chown(d, 0, 0)
        os.chmod(d, 0o755)


def setup_headers(root: str):
    """/usr/src holds the kernel's own trees only (a tmpfs over the host's),
    bound from the unpacked packages, and its linux-kbuild in /usr/lib, so
    /lib/modules/<release>/build leads to the arch tree as on an installed
    Debian system."""
    sh("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", "/usr/src")
    for src in sorted(glob.glob(os.path.join(root, "usr/src/*")) + glob.glob(os.path.join(root, "usr/lib/linux-kbuild-*"))):
        dst = src[len(root):]
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        else:
            os.makedirs(dst, exist_ok=True)
            sh("mount", "--bind", src, dst)


def kernel_facts(out: str, args):
    release = os.uname().release
    cmds = [["uname", "-a"], ["cat", "/proc/cmdline"], ["nproc"], ["ls", "-la", "/sys/kernel/btf/vmlinux"],
            ["ls", "-la", f"/lib/modules/{release}/", "/usr/src/"], ["realpath", f"/lib/modules/{release}/build"],
            ["cat", "/sys/kernel/tracing/events/sched/sched_switch/format"],
            ["ls", "/sys/kernel/tracing/events/sched/"], ["findmnt", "-l"], ["df", "-h"]]
    with open(os.path.join(out, "kernel-facts.txt"), "w") as f:
        for cmd in cmds:
            p = subprocess.run(cmd, capture_output=True, text=True)
            f.write(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", choices=("guest", "host"), required=True)
    ap.add_argument("--accel", default="host", help="how the guest runs (tcg, kvm) or host")
    ap.add_argument("--kernel-root", help="guest: the kernel's unpacked packages")
    ap.add_argument("--scratch", help="a directory on a block device (O_DIRECT); guest: where to mount its disk")
    ap.add_argument("--steps", default=",".join(DEFAULT_STEPS))
    args = ap.parse_args()
    os.umask(0o022)
    os.environ["PYTHONFAULTHANDLER"] = "1"  # see kill()
    if args.mode == "host" and os.environ.get("PSTATE_MATRIX_NS") != str(os.getpid()):
        # on the host, a mount namespace of its own with a bpffs of its own:
        # the collector check meets nobody else's collector
        os.execvpe("unshare", ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c",
                               'export PSTATE_MATRIX_NS=$$; exec "$0" "$@"', sys.executable, *sys.argv], os.environ)
    checks = Checks(args)
    if args.mode == "guest":
        args.scratch = args.scratch or "/mnt/scratch"
        problems = setup_guest(args)
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        checks.result("boot", not problems, up, "; ".join([os.uname().release] + problems), accel=args.accel)
    else:
        sh("mount", "-t", "bpf", "bpf", "/sys/fs/bpf")
        os.makedirs(args.scratch, exist_ok=True)
    kernel_facts(args.out, args)
    for step in args.steps.split(","):
        checks.run_step(step)
    subprocess.run(["sync"])


if __name__ == "__main__":
    main()

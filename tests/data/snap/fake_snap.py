"""`pstate snap` with a synthetic collector instead of BPF.

Run as a script it behaves exactly like `python -m pstate snap ARGS` (lock,
directory checks, publishing, retention, signals, exit codes) but needs no
BPF, so the tests can start it hundreds of times. Environment:
  FAKE_SNAP_ROWS   threads per snapshot (default 50)
  FAKE_SNAP_PAD    bytes of padding in each comm-like field (bigger files)
  FAKE_SNAP_SLOW   seconds to sleep in collect() (to be signalled mid-way)
  FAKE_SNAP_GATE   a path: collect() waits until it exists (the run holds
                   its directory's lock until the test lets it go on)
  FAKE_SNAP_AGENT  threads of PID 1 ("agent") on a CPU since before the run
                   with no switch ever (as some VM agents' threads look)
"""

from __future__ import annotations

import os
import sys
import time
import types

from pstate.snapshots import snapdir
from pstate.kernel.kstates import KernelStates
from pstate.snapshots.writer import Sample

KS = KernelStates(report_mask=0xFF, preempt_bit=0x100,
                  letters={1: "S", 2: "D", 4: "T", 8: "t", 16: "X", 32: "Z", 64: "P", 128: "I"})


def fake_row(pid: int, tid: int, start: int, now: int, *, comm: str = "worker", state: str = "sleeping",
             exited: bool = False, exit_ts: int | None = None, **ns) -> dict:
    """A task row with every field; counters default to 0."""
    row = {"pid": pid, "tid": tid, "comm": comm, "start_ts": start, "state": state, "state_since_ts": start,
           "exited": exited, "exit_ts": exit_ts}
    for s in snapdir.STATE_FIELDS:
        row[f"{s}_ns"] = int(ns.get(f"{s}_ns", 0))
    row[snapdir.STEAL_FIELD] = int(ns.get(snapdir.STEAL_FIELD, 0))
    for c in snapdir.COUNT_FIELDS:
        row[c] = int(ns.get(c, 0))
    return row


class FakeCollector:
    """Threads sleeping 90% and running 10% of the time since start(), 2 % of
    that stolen or in interrupts."""

    def __init__(self, rows: int = 50, pad: int = 0, slow: float = 0.0, gate: str | None = None, agent: int = 0):
        self.n = rows
        self.agent = agent
        self.pad = "x" * pad
        self.slow = slow
        self.gate = gate
        self.t0 = 0

    def start(self) -> int:
        self.t0 = time.monotonic_ns()
        return self.t0

    def collect(self) -> Sample:
        while self.gate and not os.path.exists(self.gate):
            time.sleep(0.005)
        if self.slow:
            time.sleep(self.slow)
        now = time.monotonic_ns()
        el = now - self.t0
        rows = [fake_row(1000 + i // 4, 1000 + i, 5, now, comm=f"w{i}{self.pad}", running_ns=el // 10,
                         steal_irq_ns=el // 500, sleeping_ns=el - el // 10, nvcsw=el // 1_000_000,
                         wakeups=el // 1_000_000)
                for i in range(self.n)]
        rows += [fake_row(1, 1 + i, 1, now, comm="agent", state="running", running_ns=el)
                 for i in range(self.agent)]
        return Sample(ts=now, rows=rows, map_full=0)


class FakeProgram:
    plan = types.SimpleNamespace(meta=lambda: {"probes": "tracepoint", "probes_reason": "a fake program",
                                               "probe_paths": {"sched_switch": "tracepoint"}, "probe_notes": [],
                                               "on_cpu_time": "kernel"})

    def close(self) -> None:
        pass


def install(collector_factory=None, setter=setattr) -> None:
    """Replace the BPF parts of pstate.engines.snap with the fakes
    (pass pytest's monkeypatch.setattr as setter to undo it after a test)."""
    from pstate.engines import snap

    factory = collector_factory or (lambda: FakeCollector(int(os.environ.get("FAKE_SNAP_ROWS", "50")),
                                                          int(os.environ.get("FAKE_SNAP_PAD", "0")),
                                                          float(os.environ.get("FAKE_SNAP_SLOW", "0")),
                                                          os.environ.get("FAKE_SNAP_GATE"),
                                                          int(os.environ.get("FAKE_SNAP_AGENT", "0"))))
    setter(snap.loader, "check_privileges", lambda: None)
    setter(snap.loader, "kernel_states", lambda ebpf_only=False: KS)
    setter(snap, "load_program", lambda ks, max_tasks, kernel_headers, probes=None: FakeProgram())
    setter(snap, "make_reader", lambda prog, ks, loaded_ts: factory())
    setter(snap, "running_collector", lambda root=None: None)  # whatever runs on this machine
    # who the fake processes are: three services, one title each
    from pstate.kernel import identity

    setter(identity, "read_process", fake_process)
    setter(identity.CgroupPaths, "id_of", lambda self, path: 100 + int(path[-9]) if path.endswith(".service") else None)


def fake_process(pid: int) -> dict:
    return {"comm": "w", "title": f"fake: worker {pid}", "exe": "/bin/fake", "ppid": 1,
            "cgroup_path": f"/system.slice/fake{pid % 3}.service", "ns_pid": None}


if __name__ == "__main__":
    install()
    from pstate.main import main

    sys.argv = ["pstate", "snap", *sys.argv[1:]]
    main()

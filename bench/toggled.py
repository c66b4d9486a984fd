"""The storm ratio with the tracer switched on and off within one storm.

Why: on this VM the pinned pipe storm runs at 240,000 ops/s in one run and
at 360,000 in the next, untraced, while a CPU-bound loop on the same CPU
keeps its speed within 3 % (the host's other tenants, not the CPU clock). A
traced run bracketed by untraced runs some seconds apart then measures that
more than the tracer: medians of 30 such pairs still moved by 0.05 from one
sitting to the next. Here the tracer's programs stay loaded and only their
attachments come and go, every PHASE_S (0.2 s by default), during one long
storm: each on-phase's rate of round trips is divided by the mean of the
off-phases around it, so the two sides of a ratio are a few tenths of a
second apart.

The tracer side (`enable()` in the contender's process, before pstate loads
its programs): pstate attaches every program through two bpf(2) calls,
pstate.kernel.bpfsys.attach_tracepoint (classic tracepoints: a perf event)
and attach_raw_tracepoint (tp_btf and raw tracepoints: a link). They are
wrapped so that the attachment is only noted (the caller gets an fd of
/dev/null to hold and close), and SIGUSR1 makes every noted attachment,
SIGUSR2 undoes them; each change is acknowledged by a line in the file
$PSTATE_TOGGLE_ACK. A program compiled by bcc on its first run is attached
by bcc, outside these calls: the controller runs each contender once untoggled
first, so that the toggled run loads it from pstate's program cache.

The controller side (`measure()`): the storm is `perf bench sched pipe` on
CPU 1 with a huge loop count; its rate is read from the parent's
voluntary_ctxt_switches in /proc (one per round trip), before and after each
phase, once the toggle was acknowledged and SETTLE_S more have passed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

ACK_ENV = "PSTATE_TOGGLE_ACK"
PHASE_S = 0.2
SETTLE_S = 0.02


# --- in the contender's process ---------------------------------------------------

def enable() -> None:
    """Hold back pstate's attachments until SIGUSR1 (see the top)."""
    from pstate.kernel import bpfsys

    attach_tp, attach_raw = bpfsys.attach_tracepoint, bpfsys.attach_raw_tracepoint
    noted: list[tuple] = []  # (attach, args, detach)
    live: list[tuple] = []  # (detach, fd)
    ack_path = os.environ[ACK_ENV]

    def placeholder() -> int:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)

    def tp(prog_fd: int, tracefs: str, category: str, event: str) -> int:
        noted.append((attach_tp, (prog_fd, tracefs, category, event), bpfsys.close_perf_event))
        return placeholder()

    def raw(prog_fd: int, event: str | None) -> int:
        noted.append((attach_raw, (prog_fd, event), os.close))
        return placeholder()

    def ack(word: str) -> None:
        with open(ack_path, "a") as f:
            f.write(f"{word} {len(live)}\n")

    def on(*_) -> None:
        if not live:
            for attach, args, detach in noted:
                live.append((detach, attach(*args)))
        ack("on")

    def off(*_) -> None:
        while live:
            detach, fd = live.pop()
            detach(fd)
        ack("off")

    bpfsys.attach_tracepoint, bpfsys.attach_raw_tracepoint = tp, raw
    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)


# --- in the controller -----------------------------------------------------------

def _switches(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise RuntimeError(f"no voluntary_ctxt_switches for {pid}")


def _toggle(pid: int, ack_path: str, on: bool, timeout: float = 5.0) -> int:
    """Switch the contender's attachments; the number it made (0 when off)."""
    before = _lines(ack_path)
    os.kill(pid, signal.SIGUSR1 if on else signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while True:
        lines = _lines(ack_path)
        if len(lines) > len(before):
            word, n = lines[-1].split()
            if word != ("on" if on else "off"):
                raise RuntimeError(f"toggle acknowledged {word!r}, not {'on' if on else 'off'}")
            return int(n)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the contender did not acknowledge switching {'on' if on else 'off'}")
        time.sleep(0.001)


def _lines(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def measure(pid: int, ack_path: str, on_phases: int, cpu: str = "1", tracer_cpu: str = "0",
            phase_s: float = PHASE_S, settle_s: float = SETTLE_S) -> dict:
    """One storm under a started toggled contender (pid): on_phases
    on-phases, each between two off-phases. The ratios (on-rate over the mean
    of the off-rates around it), the rates, and how many attachments an
    on-phase made."""
    # this process reads the storm's count and waits for acknowledgements:
    # on the tracer's CPU, never on the storm's
    os.sched_setaffinity(0, {int(c) for c in tracer_cpu.split(",")})
    # its own session: perf's forked partner, blocked on a pipe it holds both
    # ends of, goes with the group (killing perf alone left it behind)
    storm = subprocess.Popen(["taskset", "-c", cpu, "perf", "bench", "sched", "pipe", "-l", "2000000000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    rates: list[float] = []  # round trips per second, off and on in turn (off first and last)
    attached = None
    try:
        time.sleep(0.3)  # the storm's two processes are running
        for i in range(2 * on_phases + 1):
            on = i % 2 == 1
            n = _toggle(pid, ack_path, on)
            if on:
                attached = n
            time.sleep(settle_s)
            c0, t0 = _switches(storm.pid), time.monotonic()
            time.sleep(phase_s)
            c1, t1 = _switches(storm.pid), time.monotonic()
            rates.append((c1 - c0) / (t1 - t0))
    finally:
        os.killpg(storm.pid, signal.SIGKILL)
        storm.wait()
        try:
            _toggle(pid, ack_path, False)
        except (RuntimeError, ProcessLookupError):
            pass
    ratios = [rates[i] / ((rates[i - 1] + rates[i + 1]) / 2) for i in range(1, len(rates) - 1, 2)]
    return {"ratios": ratios, "rates": rates, "attached": attached}

"""The context switches the kernel counts for each thread
(/proc/PID/task/TID/status: voluntary_ctxt_switches plus
nonvoluntary_ctxt_switches), and the threads whose switches the sched
tracepoints do not show.

Some threads switch without any switch-out traced: under some hypervisors
nothing is traced on a CPU while one of the VM agent's threads is current
there, the switch away from it included. record, snap and heat then show
such a thread running all the time. `pstate doctor` compares the kernel's
counts over a short recording with the switch-outs the recording holds
and names those threads.
"""

from __future__ import annotations

from pstate.kernel.loader import proc_threads
from pstate.stream import names

_COUNTERS = ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")


def read(proc: str = "/proc") -> dict[int, tuple[str, int]]:
    """Every thread's name and context switches so far: tid -> (name, count).
    Threads that end while they are read are left out."""
    out: dict[int, tuple[str, int]] = {}
    for pid, tid in proc_threads(proc):
        try:
            with open(f"{proc}/{pid}/task/{tid}/status", "rb") as f:
                text = names.decode(f.read())  # a thread's name is any bytes
        except OSError:
            continue
        parsed = parse_status(text)
        if parsed is not None:
            out[tid] = parsed
    return out


def parse_status(text: str) -> tuple[str, int] | None:
    """(name, voluntary + nonvoluntary switches) of a status file, None
    when it lacks them."""
    name, total, seen = "", 0, 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key == "Name":
            name = value.strip()
        elif key in _COUNTERS:
            try:
                total += int(value)
            except ValueError:
                return None
            seen += 1
    return (name, total) if seen == len(_COUNTERS) else None


def busiest(first: dict, second: dict, at_least: int, limit: int, exclude=frozenset()) -> list[int]:
    """The tids that switched at least `at_least` times from `first` to
    `second` (read()'s), most first, at most `limit` of them."""
    moved = [(second[t][1] - first[t][1], t) for t in second
             if t in first and t not in exclude and second[t][1] - first[t][1] >= at_least]
    return [t for _n, t in sorted(moved, key=lambda x: (-x[0], x[1]))[:limit]]


def unseen(before: dict, after: dict, switch_outs: dict[int, int], at_least: int,
           traced) -> list[tuple[int, str, int]]:
    """Threads of `traced` (the tids recorded) the kernel counts at least
    `at_least` switches for between `before` and `after` (read()'s) of
    which no switch-out was traced (`switch_outs`: tid -> switch-outs
    recorded meanwhile): (tid, name, switches counted), most first."""
    out = [(t, after[t][0], after[t][1] - before[t][1]) for t in traced
           if t in before and t in after and after[t][1] - before[t][1] >= at_least and not switch_outs.get(t)]
    return sorted(out, key=lambda x: (-x[2], x[0]))

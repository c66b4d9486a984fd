"""Export a pstate stream to trace viewers: Perfetto's protobuf trace format
and Chrome's trace-event JSON.

Both writers take what the one stream reader hands out: state records as
batches of wide state rows (reader.ROW_FIELDS + reader.WIDE_FIELDS) with
rows(), every other validated record (a dict) with add() (which also takes a
state record as a dict), and finish with close(); memory depends on the
number of tasks and CPUs, never on the number of events.

Perfetto: the scheduler data is written the way Perfetto's own ftrace data
source writes it, as per-CPU ftrace bundles in the compact sched encoding
(sched_switch and sched_waking as packed columns), so the UI shows CPU tracks,
per-thread state tracks (Running, Runnable, Runnable (Preempted), Sleeping,
Uninterruptible Sleep, ...) and wake-ups as for a native trace. A switch on a
CPU comes from the switch-out record of the task that left (which names the
task that got the CPU) or, after the idle task, from the switch-in record. That
needs every switch of a CPU: for a filtered or sampled recording the export
writes one track per thread with a slice per state instead (TrackEvent), and
says so. Process and thread names go in process-tree packets; loss, rate and
end records become instants on a "pstate" track.

Chrome JSON: one complete ("X") event per state interval of each thread, the
interval a state record's dur_ns closes (none for one of 0 ns), plus each
task's last state up to the end of the stream, the same time stats attributes
to it; names as metadata events. chrome://tracing, Perfetto's legacy JSON
importer and speedscope-style tools read it.
"""

from __future__ import annotations

from typing import IO

import orjson

from pstate.stream import schema
from pstate.stream.reader import state_row
from pstate.stream.meta import TASK_FILTERS, TRANSITION_FILTERS, filters_in_force

IDLE_COMM = "swapper/{cpu}"
_UNSEEN = object()  # (a comm may be None)
INT32_MAX = (1 << 31) - 1  # pids, tids, CPUs and priorities are int32 in the trace


def _id(v) -> bool:
    """Whether v fits the trace's int32 id columns (a pid, tid, CPU, prio)."""
    return type(v) is int and 0 <= v <= INT32_MAX


def _ts(v) -> int | None:
    """v when it is a time a trace can hold (the reader checks events' ts
    only, not those of loss, rate and end records), else None."""
    return v if type(v) is int and 0 <= v < 1 << 63 else None
DEFAULT_PRIO = 120
BUNDLE_EVENTS = 4096  # compact sched rows per CPU bundle before it is written
CLONE_THREAD = 0x00010000

# prev_state bits of kernels since 4.14 (TASK_REPORT), used when a meta record
# does not carry the running kernel's own table (kernel_states).
_DEFAULT_BITS = {"S": 0x1, "D": 0x2, "T": 0x4, "t": 0x8, "X": 0x10, "Z": 0x20, "P": 0x40, "I": 0x80,
                 "+": 0x100}
# common_flags of a trace entry: the event fired in hard or soft interrupt context
TRACE_FLAG_HARDIRQ = 0x08
TRACE_FLAG_SOFTIRQ = 0x10


def cpu_complete(metas: list, rates: int = 0) -> tuple[bool, str]:
    """Whether a stream holds every switch of every CPU; else why not."""
    found = filters_in_force(metas, TASK_FILTERS + TRANSITION_FILTERS)
    if found:
        return False, f"it was recorded with {found[0]}"
    if rates:
        return False, "it was sampled (--max-rate)"
    return True, ""


def prev_state_bits(meta: dict | None) -> dict:
    """Kernel letter -> prev_state bit, from the meta record's kernel_states
    (bit -> state name, as the running kernel prints them)."""
    table = (meta or {}).get("kernel_states")
    if not isinstance(table, dict):
        return dict(_DEFAULT_BITS)
    bits = {}
    for hexbit, name in table.items():
        try:
            bit = int(hexbit, 16)
        except (TypeError, ValueError):
            continue
        letter = "+" if name == "+" else schema.STATES.get(name, ("",))[0]
        if letter:
            bits[letter] = bit
    return bits or dict(_DEFAULT_BITS)


def encode_prev_state(kstate, to: str, bits: dict) -> int:
    """The raw prev_state of a switch-out: from the kernel's letters (kstate,
    e.g. "S", "D", "R+") or, without them, from the state entered."""
    if not isinstance(kstate, str) or not kstate:
        kstate = "R+" if to == schema.PREEMPTED else schema.STATES.get(to, ("R",))[0]
    v = 0
    for ch in kstate:
        v |= bits.get(ch, 0)
    return v


class _Cpu:
    """One CPU's compact sched columns for the bundle being built."""

    __slots__ = ("cpu", "sw_ts", "sw_state", "sw_pid", "sw_prio", "sw_comm", "wk_ts", "wk_pid", "wk_cpu",
                 "wk_prio", "wk_comm", "wk_flags", "strings", "events", "last_sw", "last_wk", "out_ts",
                 "out_next")

    def __init__(self, cpu: int):
        self.cpu = cpu
        self.out_ts = -1  # ts of the last switch built from a switch-out record
        self.out_next = -1  # and its row, for the switch-in record that follows it
        self._reset()

    def _reset(self) -> None:
        self.sw_ts, self.sw_state, self.sw_pid, self.sw_prio, self.sw_comm = [], [], [], [], []
        self.wk_ts, self.wk_pid, self.wk_cpu, self.wk_prio, self.wk_comm, self.wk_flags = [], [], [], [], [], []
        self.strings: dict = {}
        self.events: list = []  # (ts, kind, fields) for non-compact ftrace events
        self.last_sw = 0
        self.last_wk = 0

    def intern(self, comm: str) -> int:
        i = self.strings.get(comm)
        if i is None:
            i = self.strings[comm] = len(self.strings)
        return i

    def rows(self) -> int:
        return len(self.sw_ts) + len(self.wk_ts) + len(self.events)


def _deltas(values: list) -> list:
    prev = 0
    out = []
    for v in values:
        out.append(v - prev)
        prev = v
    return out


class PerfettoWriter:
    """Records in, Perfetto trace packets out (see the module docstring)."""

    PSTATE_TRACK = 1
    SEQUENCE = 1

    def __init__(self, fp: IO[bytes], *, cpu_tracks: bool = True):
        from perfetto.trace_builder.proto_builder import StreamingTraceProtoBuilder

        self._builder = StreamingTraceProtoBuilder(fp)
        self.cpu_tracks = cpu_tracks
        self.meta: dict | None = None
        self.bits = dict(_DEFAULT_BITS)
        self.cpus: dict = {}
        self.comms: dict = {}  # tid -> comm (latest)
        self.prios: dict = {}  # tid -> prio (latest)
        self.threads: dict = {}  # tid -> (pid, comm) written to a process tree
        self.processes: dict = {}  # pid -> (ppid, comm) written
        self.parents: dict = {}  # child pid -> parent pid, from fork records
        self.tree_threads: dict = {}
        self.tree_processes: dict = {}
        self.thread_tracks: dict = {}  # tid -> [uuid, open slice]
        self.unpaired_switch_ins = 0
        self.out_of_range = 0  # records whose pid, tid or CPU no trace can hold (not a real task's)
        self._state_cache: dict = {}  # (kstate, to) -> prev_state
        self.switches = 0
        self.wakings = 0
        self._started = False

    # --- input ---------------------------------------------------------------

    def add(self, rec: dict) -> None:
        t = rec["type"]
        if t == "state":
            self.rows([state_row(rec, 1, True)])
        elif t in ("fork", "exec", "exit"):
            self._lifecycle(rec)
        elif t == "meta":
            self._meta(rec)
        elif t in ("loss", "rate", "end"):
            self._instant(rec)

    def _meta(self, rec: dict) -> None:
        if self.meta is None:
            self.meta = rec
            self.bits = prev_state_bits(rec)
            self._state_cache.clear()
        self._start()

    def _start(self) -> None:
        if self._started:
            return
        self._started = True
        pkt = self._builder.create_packet()
        uts = pkt.system_info.utsname
        uts.sysname = "Linux"
        uts.release = str((self.meta or {}).get("kernel") or "")
        uts.machine = ""
        if isinstance((self.meta or {}).get("ncpu"), int):
            pkt.system_info.num_cpus = self.meta["ncpu"]
        self._builder.write_packet(pkt)
        pkt = self._builder.create_packet()
        pkt.trusted_packet_sequence_id = self.SEQUENCE
        pkt.track_descriptor.uuid = self.PSTATE_TRACK
        pkt.track_descriptor.name = "pstate"
        self._builder.write_packet(pkt)

    def _see(self, pid: int, tid: int, comm) -> None:
        comm = comm if isinstance(comm, str) else ""
        self.comms[tid] = comm
        t = self.threads.get(tid)
        if t is None or t[0] != pid or t[1] != comm:
            self.threads[tid] = (pid, comm)
            self.tree_threads[tid] = (pid, comm)
        if tid == pid and pid and self.processes.get(pid, (None, None))[1] != comm:
            self.processes[pid] = (self.parents.get(pid, 0), comm)
            self.tree_processes[pid] = self.processes[pid]

    def _cpu(self, cpu: int) -> _Cpu:
        c = self.cpus.get(cpu)
        if c is None:
            c = self.cpus[cpu] = _Cpu(cpu)
        return c

    def rows(self, rows: list) -> None:
        """Wide state rows, in order (see the module docstring)."""
        if not self._started:
            self._start()
        comms, threads, prios, cpus = self.comms, self.threads, self.prios, self.cpus
        cpu_tracks = self.cpu_tracks
        for ts, pid, tid, comm, frm, to, dur, cpu, _w, _cg, _steal, cause, prio, nxt, prev, kstate, target, waker in rows:
            if (pid | tid | cpu) > INT32_MAX:
                self.out_of_range += 1
                continue
            if comms.get(tid, _UNSEEN) != comm or threads[tid][0] != pid:
                self._see(pid, tid, comm)
            if _id(prio):
                prios[tid] = prio
            if not cpu_tracks:
                self._thread_slice(ts, pid, tid, frm, to, dur)
                continue
            if cause == "switch_out":
                nxt = nxt if _id(nxt) else 0
                c = cpus.get(cpu) or self._cpu(cpu)
                self._switch(c, ts, self._prev_state(kstate, to), nxt)
                c.out_ts, c.out_next = ts, nxt
            elif cause == "switch_in":
                c = cpus.get(cpu) or self._cpu(cpu)
                if c.out_ts == ts and c.out_next == tid:
                    # the switch was written from the switch-out record: give it
                    # this task's own priority and name
                    if c.sw_ts and c.sw_ts[-1] == ts and c.sw_pid[-1] == tid:
                        c.sw_prio[-1] = prios.get(tid, DEFAULT_PRIO)
                        c.sw_comm[-1] = c.intern(comms.get(tid, ""))
                    continue
                if _id(prev) and prev != 0:
                    self.unpaired_switch_ins += 1  # its switch-out was lost
                # after the idle task (not reported), or a lost switch-out: the
                # task that left was runnable
                self._switch(c, ts, 0, tid)
            elif cause == "wakeup" or cause == "wakeup_new":
                self._waking(ts, tid, cpu, target, waker)
            elif cause == "reap":
                c = self._cpu(cpu)
                c.events.append((ts, "free", (tid, comms.get(tid, ""), prios.get(tid, DEFAULT_PRIO))))
                self._flush_if_full(c)

    def _prev_state(self, kstate, to: str) -> int:
        if type(kstate) is not str:
            kstate = None  # (any JSON value: encode_prev_state reads a string only)
        key = (kstate, to)
        v = self._state_cache.get(key)
        if v is None:
            v = self._state_cache[key] = encode_prev_state(kstate, to, self.bits)
        return v

    def _switch(self, c: _Cpu, ts: int, prev_state: int, nxt: int) -> None:
        if ts < c.last_sw:
            self._flush(c)
        c.last_sw = ts
        c.sw_ts.append(ts)
        c.sw_state.append(prev_state)
        c.sw_pid.append(nxt)
        c.sw_prio.append(self.prios.get(nxt, DEFAULT_PRIO))
        comm = IDLE_COMM.format(cpu=c.cpu) if nxt == 0 else self.comms.get(nxt, "")
        i = c.strings.get(comm)
        c.sw_comm.append(c.intern(comm) if i is None else i)
        self.switches += 1
        if len(c.sw_ts) >= BUNDLE_EVENTS:
            self._flush(c)

    def _waking(self, ts: int, tid: int, cpu: int, target, waker) -> None:
        c = self._cpu(cpu)
        if ts < c.last_wk:
            self._flush(c)
        c.last_wk = ts
        c.wk_ts.append(ts)
        c.wk_pid.append(tid)
        c.wk_cpu.append(target if _id(target) else cpu)
        c.wk_prio.append(self.prios.get(tid, DEFAULT_PRIO))
        c.wk_comm.append(c.intern(self.comms.get(tid, "")))
        c.wk_flags.append(TRACE_FLAG_HARDIRQ if waker == "irq" else TRACE_FLAG_SOFTIRQ if waker == "softirq" else 0)
        self.wakings += 1
        if len(c.wk_ts) >= BUNDLE_EVENTS:
            self._flush(c)

    def _lifecycle(self, rec: dict) -> None:
        self._start()
        t = rec["type"]
        tid = rec["tid"]
        if (rec["pid"] | tid | rec["cpu"]) > INT32_MAX:
            self.out_of_range += 1
            return
        if t == "fork":
            child_pid, child_tid = rec.get("child_pid"), rec.get("child_tid")
            if _id(child_pid) and _id(child_tid):
                thread = bool(rec.get("thread"))
                if not thread:
                    self.parents[child_pid] = rec["pid"]
                self._see(child_pid, child_tid, rec.get("comm"))
                if self.cpu_tracks:
                    c = self._cpu(rec["cpu"])
                    c.events.append((rec["ts"], "newtask", (tid, child_tid, self.comms.get(child_tid, ""),
                                                           CLONE_THREAD if thread else 0)))
                    self._flush_if_full(c)
        elif t == "exec":
            self._see(rec["pid"], tid, rec.get("comm"))
        elif t == "exit":
            self._see(rec["pid"], tid, rec.get("comm"))

    def _instant(self, rec: dict) -> None:
        self._start()
        ts = _ts(rec.get("ts"))
        if ts is None:
            return
        t = rec["type"]
        if t == "loss":
            name = f"loss: {rec.get('count')} events ({rec.get('reason')})"
        elif t == "rate":
            name = f"sampling: keep 1 in {rec.get('sample_every')}"
        else:
            name = f"end: {rec.get('reason')}"
        pkt = self._builder.create_packet()
        pkt.timestamp = ts
        pkt.trusted_packet_sequence_id = self.SEQUENCE
        ev = pkt.track_event
        ev.type = ev.TYPE_INSTANT
        ev.track_uuid = self.PSTATE_TRACK
        ev.name = name
        for k, v in rec.items():
            if k in ("type", "ts") or isinstance(v, (dict, list)) or v is None:
                continue
            ann = ev.debug_annotations.add()
            ann.name = k
            if isinstance(v, bool):
                ann.bool_value = v
            elif isinstance(v, int) and -(1 << 63) <= v < (1 << 63):
                ann.int_value = v
            else:
                ann.string_value = str(v)
        self._builder.write_packet(pkt)

    # --- thread tracks (recordings that do not hold every switch) -------------

    def _thread_slice(self, ts: int, pid: int, tid: int, frm: str, to: str, d) -> None:
        tr = self.thread_tracks.get(tid)
        if tr is None:
            tr = self.thread_tracks[tid] = [(1 << 32) + tid, None]
            pkt = self._builder.create_packet()
            pkt.trusted_packet_sequence_id = self.SEQUENCE
            desc = pkt.track_descriptor
            desc.uuid = tr[0]
            desc.name = f"{self.comms.get(tid, '')} {tid} state"
            desc.thread.pid = pid
            desc.thread.tid = tid
            desc.thread.thread_name = self.comms.get(tid, "")
            self._builder.write_packet(pkt)
        if tr[1] is None and isinstance(d, int):
            self._slice_event(tr[0], ts - d, "begin", frm)
        if tr[1] is not None or isinstance(d, int):
            self._slice_event(tr[0], ts, "end", None)
        if to != schema.REAPED:
            self._slice_event(tr[0], ts, "begin", to)
            tr[1] = to
        else:
            tr[1] = None

    def _slice_event(self, uuid: int, ts: int, kind: str, name) -> None:
        pkt = self._builder.create_packet()
        pkt.timestamp = ts
        pkt.trusted_packet_sequence_id = self.SEQUENCE
        ev = pkt.track_event
        ev.track_uuid = uuid
        if kind == "begin":
            ev.type = ev.TYPE_SLICE_BEGIN
            ev.name = name
        else:
            ev.type = ev.TYPE_SLICE_END
        self._builder.write_packet(pkt)

    # --- output ----------------------------------------------------------------

    def _flush_if_full(self, c: _Cpu) -> None:
        if len(c.sw_ts) >= BUNDLE_EVENTS or len(c.wk_ts) >= BUNDLE_EVENTS or len(c.events) >= BUNDLE_EVENTS:
            self._flush(c)

    def _process_tree(self) -> None:
        if not (self.tree_threads or self.tree_processes):
            return
        pkt = self._builder.create_packet()
        tree = pkt.process_tree
        for pid, (ppid, comm) in self.tree_processes.items():
            p = tree.processes.add()
            p.pid = pid
            p.ppid = ppid
            p.cmdline.append(comm)
            p.cmdline_is_comm = True
        for tid, (pid, comm) in self.tree_threads.items():
            if tid == 0:
                continue
            th = tree.threads.add()
            th.tid = tid
            th.tgid = pid
            if comm:
                th.name = comm
        self.tree_threads.clear()
        self.tree_processes.clear()
        self._builder.write_packet(pkt)

    def _flush(self, c: _Cpu) -> None:
        if not c.rows():
            return
        self._process_tree()  # names first, so the bundle's tasks are known
        pkt = self._builder.create_packet()
        b = pkt.ftrace_events
        b.cpu = c.cpu
        cs = b.compact_sched
        cs.intern_table.extend(c.strings)
        if c.sw_ts:
            cs.switch_timestamp.extend(_deltas(c.sw_ts))
            cs.switch_prev_state.extend(c.sw_state)
            cs.switch_next_pid.extend(c.sw_pid)
            cs.switch_next_prio.extend(c.sw_prio)
            cs.switch_next_comm_index.extend(c.sw_comm)
        if c.wk_ts:
            cs.waking_timestamp.extend(_deltas(c.wk_ts))
            cs.waking_pid.extend(c.wk_pid)
            cs.waking_target_cpu.extend(c.wk_cpu)
            cs.waking_prio.extend(c.wk_prio)
            cs.waking_comm_index.extend(c.wk_comm)
            cs.waking_common_flags.extend(c.wk_flags)
        for ts, kind, f in c.events:
            ev = b.event.add()
            ev.timestamp = ts
            if kind == "newtask":
                ev.pid = f[0]
                ev.task_newtask.pid = f[1]
                ev.task_newtask.comm = f[2]
                ev.task_newtask.clone_flags = f[3]
            else:
                ev.pid = f[0]
                ev.sched_process_free.pid = f[0]
                ev.sched_process_free.comm = f[1]
                ev.sched_process_free.prio = f[2]
        self._builder.write_packet(pkt)
        c._reset()

    def close(self) -> None:
        self._start()
        for c in self.cpus.values():
            self._flush(c)
        self._process_tree()


class ChromeWriter:
    """Records in, Chrome trace-event JSON out (see the module docstring)."""

    def __init__(self, fp: IO[bytes]):
        self.fp = fp
        self.first = True
        self.meta: dict | None = None
        self.last: dict = {}  # tid -> [pid, ts, state, cgroup] of its last transition
        self.named: dict = {}  # tid -> comm written as thread_name
        self.pnamed: dict = {}  # pid -> comm written as process_name
        self.end_ts: int | None = None
        self.max_ts: int | None = None
        self.slices = 0
        fp.write(b'{"traceEvents":[\n')

    def _emit(self, ev: dict) -> None:
        if not self.first:
            self.fp.write(b",\n")
        self.first = False
        self.fp.write(orjson.dumps(ev))

    def _name(self, pid: int, tid: int, comm) -> None:
        comm = comm if isinstance(comm, str) else ""
        if self.named.get(tid) != comm:
            self.named[tid] = comm
            self._emit({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": comm}})
        if tid == pid and self.pnamed.get(pid) != comm:
            self.pnamed[pid] = comm
            self._emit({"name": "process_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": comm}})

    def _slice(self, pid: int, tid: int, state: str, start: int, dur: int, cgroup=None) -> None:
        if dur <= 0:
            return  # a state that lasted no time (a wake-up before the switch-out): nothing to draw
        ev = {"name": state, "cat": schema.state_category(state), "ph": "X", "ts": start / 1000,
              "dur": dur / 1000, "pid": pid, "tid": tid}
        if cgroup is not None:  # the cgroup of the record that ends it (pstate's state record's)
            ev["args"] = {"cgroup": cgroup}
        self._emit(ev)
        self.slices += 1

    def add(self, rec: dict) -> None:
        t = rec["type"]
        ts = _ts(rec.get("ts"))
        if ts is not None and t != "meta" and (self.max_ts is None or ts > self.max_ts):
            self.max_ts = ts
        if t == "state":
            self.rows([state_row(rec)])
        elif t in ("fork", "exec"):
            self._name(rec["pid"], rec["tid"], rec.get("comm"))
        elif t == "meta":
            if self.meta is None:
                self.meta = rec
        elif t == "end":
            if ts is not None and (self.end_ts is None or ts > self.end_ts):
                self.end_ts = ts
        elif t in ("loss", "rate") and ts is not None:
            args = {k: v for k, v in rec.items() if k not in ("type", "ts")}
            self._emit({"name": t, "ph": "i", "s": "g", "ts": ts / 1000, "pid": 0, "tid": 0, "args": args})

    def rows(self, rows: list) -> None:
        """State rows (reader.ROW_FIELDS, wide or not), in order."""
        named, pnamed, last = self.named, self.pnamed, self.last
        max_ts = self.max_ts
        for row in rows:
            ts, pid, tid, comm, frm, to, d = row[:7]
            cg = row[9]
            if max_ts is None or ts > max_ts:
                max_ts = ts
            if named.get(tid, _UNSEEN) != comm or (tid == pid and pnamed.get(pid, _UNSEEN) != comm):
                self._name(pid, tid, comm)
            if d is not None:
                self._slice(pid, tid, frm, ts - d, d, cg)
            last[tid] = [pid, ts, to, cg]
        self.max_ts = max_ts

    def close(self) -> None:
        # each task's last state lasts to the end of the stream, as in stats
        ends = [x for x in (self.end_ts, self.max_ts) if x is not None]
        if ends:
            end = max(ends)
            for tid, (pid, ts, state, cg) in self.last.items():
                if state != schema.REAPED and end > ts:
                    self._slice(pid, tid, state, ts, end - ts, cg)
        other = {k: v for k, v in (self.meta or {}).items() if not isinstance(v, (dict, list))}
        self.fp.write(b'\n],"displayTimeUnit":"ns","otherData":' + orjson.dumps(other) + b"}\n")

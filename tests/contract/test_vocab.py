"""One table per concept (pstate.stream.vocab, bpf/pstate.h), and every view
of it equal to it: the kinds of wait, the blocked states, the log2
bucketings, a stack's frames and reason, the boot id, record's filter set
sizes and state bits."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pstate.analysis import causes, latency, timeinstate
from pstate.engines import flight
from pstate.kernel import btf, eventcodec, eventlayout, filtermaps, recordprog, stacks
from pstate.render import heatmodel, snaptables, tables, whytables
from pstate.snapshots import histograms
from pstate.stream import meta, reports, schema, vocab
from conftest import ROOT

PKG = ROOT / "cli" / "pstate"
D = eventlayout.DEFINES
KERNEL_KINDS = [k for k in vocab.WAIT_KINDS if k.kernel]
STATES = [*schema.STATES, "state_Q", "waking"]  # (two a newer or older kernel may name)


def test_the_preemption_wait_is_named_in_the_table_alone():
    """runq_preempted (runq_preempt, its name in stats' report schema 1)
    is written in stream/vocab.py only: every other place takes it from the
    table, the kernel's HK_RUNQ_PREEMPTED aside."""
    found = []
    for path in [*PKG.rglob("*.py"), *PKG.rglob("*.c"), *(ROOT / "bpf").glob("*")]:
        if path.is_file() and "runq_preempt" in path.read_text() and path != PKG / "stream" / "vocab.py":
            found.append(str(path.relative_to(ROOT)))
    assert found == []
    assert vocab.RUNQ_PREEMPTED.name == vocab.RUNQ_PREEMPTED.hist_name == "runq_preempted"
    assert vocab.FORMER_NAMES == {"runq_preempt": "runq_preempted"}


# --- kinds of wait ----------------------------------------------------------------------


def test_each_transition_has_the_kind_of_its_table_row():
    for frm in STATES:
        for to in STATES:
            got = timeinstate.latency_kind(frm, to)
            rows = [k.name for k in vocab.WAIT_KINDS if frm in k.frm and (k.to is None or k.to == to)]
            if to == schema.RUNNING:
                want = next((k.name for k in vocab.RUNQ_KINDS if frm in k.frm), None)
            elif frm == schema.RUNNING:
                want = vocab.ONCPU.name
            elif vocab.is_blocked(frm):
                want = vocab.blocked_kind(frm)
            else:
                want = None
            assert got == want, (frm, to)
            if rows and got is not None:
                assert got in rows, (frm, to)


def test_stats_kinds_labels_and_columns_are_the_tables():
    names = [k.name for k in vocab.WAIT_KINDS]
    assert timeinstate.LATENCY_KINDS == tuple(n for n in names if not n.startswith(vocab.BLOCKED_PREFIX))
    assert (timeinstate.RUNQ_WAKEUP, timeinstate.RUNQ_PREEMPTED, timeinstate.ONCPU) == \
        (vocab.RUNQ_WAKEUP.name, vocab.RUNQ_PREEMPTED.name, vocab.ONCPU.name)
    assert tables.KIND_LABELS == {k.name: k.label for k in vocab.WAIT_KINDS}
    for k in vocab.WAIT_KINDS:
        assert tables.kind_label(k.name) == k.label
    for state in vocab.BLOCKED_STATES:  # the rule for the blocked kinds, the table's among them
        assert tables.kind_label(vocab.blocked_kind(state)) == f"{state} ({schema.STATES[state][0]})"
    assert tables.CSV_KINDS == timeinstate.LATENCY_KINDS + tuple(map(vocab.blocked_kind, vocab.BLOCKED_STATES))
    kinds = reports.STATS_FIELDS["groups[].latency.KIND.count"][1]
    assert kinds.endswith(f"{', '.join(timeinstate.LATENCY_KINDS)} or blocked_STATE")
    assert f"groups[].{vocab.RUNQ_PREEMPTED.name}_ns" in reports.STATS_FIELDS


def test_the_kernels_histograms_are_the_tables():
    """bpf/pstate.h's HK_* index the table's kernel kinds, in the order
    snapshots name them; their Prometheus families and the snap series'
    labels come from the table."""
    assert {f"HK_{k.hist_name.upper()}": D[k.kernel] for k in KERNEL_KINDS} == \
        {name: v for name, v in D.items() if name.startswith("HK_")}
    assert sorted(D[k.kernel] for k in KERNEL_KINDS) == list(range(D["HIST_KINDS"]))
    assert histograms.KINDS == tuple(k.hist_name for k in sorted(KERNEL_KINDS, key=lambda k: D[k.kernel]))
    assert histograms.FAMILIES == {k.hist_name: (k.prom[0], dict(k.prom[1]), k.prom[2]) for k in KERNEL_KINDS}
    assert snaptables.KIND_WORDS == {k.hist_name: k.series_label for k in KERNEL_KINDS}
    assert set(histograms.HIST_RECORD[1]["kind"][1].split(" ")) >= {f"{k}" for k in histograms.KINDS}


def test_heat_measures_and_flight_triggers_are_the_tables_states():
    m = heatmodel.MEASURES
    assert m["runq"][1] == frozenset(vocab.RUNQ_WAKEUP.frm)
    assert m["preempt"][1] == frozenset(vocab.RUNQ_PREEMPTED.frm)
    assert m["wait"][1] == frozenset(s for k in vocab.RUNQ_KINDS for s in k.frm)
    assert m["S"][1] == frozenset(vocab.SLEEPING.frm) and m["D"][1] == frozenset(vocab.UNINTERRUPTIBLE.frm)
    assert m["blocked"][1] == m["S"][1] | m["D"][1]
    assert m["oncpu"][1] == frozenset(vocab.ONCPU.frm)
    assert flight.WAIT_CODES == frozenset(eventcodec.CODES[s] for s in m["wait"][1])


# --- the blocked states ------------------------------------------------------------------


def test_the_blocked_states_are_the_categories_blocked_and_stopped():
    assert vocab.BLOCKED_STATES == tuple(s for s, (_l, cat, _d) in schema.STATES.items()
                                         if cat in schema.BLOCKED_CATEGORIES)
    for s in STATES:
        assert causes.blocked_state(s) == vocab.is_blocked(s) == (schema.state_category(s) in ("blocked", "stopped"))
    assert vocab.is_blocked("state_Q")  # a state a newer kernel names waits for something


# --- log2 bucketings ---------------------------------------------------------------------

DURATIONS = [0, 1, 2, 3, 4, 5, 1023, 1024, 1025, 2047, 2048, 2049, 10**6, 2**20, 2**20 + 1, 2**35 - 1, 2**35,
             2**63 - 1]


@pytest.mark.parametrize("d", DURATIONS)
def test_the_floor_convention(d):
    b = vocab.log2_floor(d)
    assert vocab.log2_floor_lower(b) <= d < (vocab.log2_floor_lower(b + 1) if b else 1)
    assert heatmodel.log2_bucket(d) == b and heatmodel.log2_lower(b) == vocab.log2_floor_lower(b)


@pytest.mark.parametrize("d", [d for d in DURATIONS if d])
def test_the_ceiling_convention(d):
    shift = histograms.SHIFT
    b = vocab.log2_ceil(d, shift)
    assert (vocab.log2_ceil_upper(b - 1, shift) if b else 0) < d <= vocab.log2_ceil_upper(b, shift)
    assert histograms.bucket_of(d) == min(b, histograms.NBUCKETS - 1)
    assert histograms.UPPER_NS[:-1] == tuple(vocab.log2_ceil_upper(i, shift) for i in range(histograms.NBUCKETS - 1))


def test_stats_hist_rows_are_the_floor_convention():
    h = latency.LogHist()
    for v in (0, 900, 1000, 1999, 2000, 5000, 64_000, 10**6):
        h.add(v)
    rows = h.log2_buckets(1000)
    for lo, hi, _n in rows:
        k = vocab.log2_floor(hi)
        assert hi == vocab.log2_floor_lower(k + 1) - 1 and lo == (0 if k == 1 else vocab.log2_floor_lower(k))


# --- frames --------------------------------------------------------------------------------

FRAMES = "entry_SYSCALL_64+0x76;vfs_write+0x1e0 [ext4];__iomap_dio_rw+0x4d0;io_schedule+0x46;schedule+0x27;__schedule+0x3b0"


def test_a_stacks_reason_is_one_function():
    assert stacks.reason_of is vocab.reason_of  # record puts it on the wake-up
    assert whytables.stack_reason(FRAMES) == vocab.reason_of(vocab.leaf_first(FRAMES)) == "__iomap_dio_rw"
    assert causes.callers(FRAMES, "__iomap_dio_rw", 1) == ["__iomap_dio_rw", "vfs_write"]
    assert vocab.frame_name("vfs_write+0x1e0 [ext4]") == "vfs_write"
    assert vocab.frame_function("vfs_write+0x1e0 [ext4]") == "vfs_write [ext4]"
    assert vocab.frame_function("0xffffffff81000000") == "0xffffffff81000000"


def test_frames_are_parsed_in_vocab_alone():
    """No other module splits a frame at its "+" itself."""
    found = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
             if p.name != "vocab.py" and re.search(r"""(split|partition)\(["']\+["']""", p.read_text())]
    assert found == []


# --- the boot id, record's sets and state bits -----------------------------------------------


def test_the_boot_id_is_read_in_one_place():
    found = [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
             if re.search(r"open\([^)]*kernel/random/boot_id", p.read_text())]
    assert found == ["stream/meta.py"]
    ident = btf.boot_identity()
    assert ident is None or ident.startswith(meta.boot_id() + ":")


def test_record_sets_and_state_bits_come_from_pstate_h():
    assert (filtermaps.MAX_IDS, filtermaps.MAX_COMMS, filtermaps.MAX_CPUS, filtermaps.MAX_CGROUPS,
            filtermaps.MAX_FOLLOWED) == (D["FILTER_IDS"], D["FILTER_COMMS"], D["FILTER_CPUS"], D["FILTER_CGROUPS"],
                                         D["FILTER_FOLLOWED"])
    text = (ROOT / "bpf" / "record.bpf.c").read_text()
    for m in ("pid_filter", "cgroup_filter", "cgroup_pids", "tid_filter", "comm_filter", "cpu_filter"):
        decl = re.search(rf"BPF_(?:HASH|ARRAY)\({m},[^;]*\);", text).group(0)
        assert re.search(r",\s*FILTER_[A-Z]+\);$", decl), decl
    assert recordprog.ST_KERNEL == D["ST_KERNEL"]
    # a task row's state is ST_KERNEL | the kernel's bits, written with the name
    assert [str(p.relative_to(PKG)) for p in PKG.rglob("*.py")
            if re.search(rf"0x{D['ST_KERNEL']:x}\s*\|", p.read_text())] == []

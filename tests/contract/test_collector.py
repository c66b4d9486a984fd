"""The snap collector's user-space rules without BPF: which freed rows a
reader shows and may delete (cursors), what a directory keeps between runs,
and the command line around a running collector."""

from __future__ import annotations

import ctypes
import types

from click.testing import CliRunner

from pstate.engines import snap
from pstate.main import cli
from pstate.snapshots import collector as resident
from pstate.snapshots.folds import Folds
from pstate.snapshots.writer import PromExport, SnapDir


class Key(ctypes.Structure):
    _fields_ = [("tid", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("start_ts", ctypes.c_uint64)]


# the tests' times are in units of a tenth of LATE_NS (0.1 s)
U = resident.LATE_NS // 10


def reader(rows, state=None):
    """A PinnedReader whose `gone` map holds rows: [(tid, start_ts, since)],
    since and the state's ts in units U."""
    r = resident.PinnedReader.__new__(resident.PinnedReader)
    r.cursor = (state or {}).get("ts") and state["ts"] * U
    r.late = {tuple(k) for k in (state or {}).get("late", [])}
    r.new_late, r.read, r.last_ts = [], [], None
    gone = [(Key(tid, 0, start), types.SimpleNamespace(start_ts=start, since=since * U))
            for tid, start, since in rows]
    removed = []
    r.gone = types.SimpleNamespace(read_all=lambda delete=False: list(gone),
                                   remove=lambda k: removed.append(k.tid) or True)
    r.removed = removed
    return r


def shown(r, now):
    import pstate.snapshots.collector as mod

    saved = mod.read_hash
    mod.read_hash = lambda table, delete=False: table.read_all(delete)
    try:
        return sorted(k.tid for k, _v in r._read_gone(now * U))
    finally:
        mod.read_hash = saved


def test_a_reader_shows_each_freed_row_once():
    rows = [(1, 10, 100), (2, 20, 250), (3, 30, 400)]
    first = reader(rows)
    assert shown(first, now=300) == [1, 2, 3]  # no cursor yet: all there is
    assert first.new_late == [(3, 30)]  # freed while it read, after its snapshot's time
    state = {"ts": 300, "late": first.new_late}
    again = reader(rows + [(4, 40, 500)], state)
    assert shown(again, now=600) == [4]  # 1 and 2 before the cursor, 3 shown late already
    assert again.new_late == []


def test_a_row_written_after_the_read_is_shown_at_the_next():
    """Freed 0.5 s before a snapshot's time but written after it read `gone`
    (the program held up between its clock and its write): the next
    snapshot shows it. With snapshots closer than LATE_NS, a row is still
    shown once."""
    first = reader([(1, 10, 100)])
    assert shown(first, now=300) == [1]
    again = reader([(1, 10, 100), (2, 20, 295)], {"ts": 300, "late": first.new_late})
    assert shown(again, now=600) == [2]
    # every 0.3 s: 4 shown at 702, remembered through each read it may reach
    state = {"ts": 600, "late": again.new_late}
    for now, want in ((702, [4]), (705, []), (708, []), (711, []), (714, [])):
        r = reader([(4, 40, 701)], state)
        assert shown(r, now=now) == want, now
        state = {"ts": now, "late": r.new_late}
    assert state["late"] == []  # 701 is more than LATE_NS before 714


def test_rows_go_once_every_registered_reader_passed_them():
    # 5 is freed before the other reader's cursor, but by less than LATE_NS
    r = reader([(1, 10, 100), (2, 20, 250), (5, 50, 195)])
    shown(r, now=300)
    readers = {}
    lib = types.SimpleNamespace()
    r.last_ts = 300 * U
    r.prog = types.SimpleNamespace(table_raw=lambda name: 7)
    # another reader's cursor at 200: only the row freed before 200 may go
    other = b"o" * resident.READER_KEY
    import pstate.snapshots.collector as mod

    now = [10**12]
    readers[other] = (200 * U, now[0])

    def update(fd, key, val, flags):
        readers[key.raw] = tuple(int.from_bytes(val.raw[i:i + 8], "little") for i in (0, 8))
        return 0

    def next_key(fd, prev, nxt):
        keys = sorted(readers)
        i = 0 if prev is None else keys.index(prev.raw) + 1
        if i >= len(keys):
            return -2
        ctypes.memmove(nxt, keys[i], resident.READER_KEY)
        return 0

    def lookup(fd, key, val):
        cur, touched = readers[key.raw]
        ctypes.memmove(val, cur.to_bytes(8, "little") + touched.to_bytes(8, "little"), 16)
        return 0

    lib.bpf_update_elem, lib.bpf_get_next_key, lib.bpf_lookup_elem = update, next_key, lookup
    lib.bpf_delete_elem = lambda fd, key: readers.pop(key.raw) and 0
    saved = (mod.bpfsys.lib, mod.time.monotonic_ns)
    mod.bpfsys.lib, mod.time.monotonic_ns = lib, lambda: now[0]
    try:
        assert r.commit(b"m" * resident.READER_KEY) == 1
        assert r.removed == [1]
        # a reader silent for longer than the expiry holds nothing back
        r2 = reader([(2, 20, 250)])
        shown(r2, now=300)
        r2.last_ts, r2.prog = 300 * U, r.prog
        now[0] += resident.READER_EXPIRY_NS + 1
        readers[b"m" * resident.READER_KEY] = (300 * U, now[0])
        assert r2.commit(b"m" * resident.READER_KEY) == 1 and r2.removed == [2]
        assert other not in readers
    finally:
        mod.bpfsys.lib, mod.time.monotonic_ns = saved


def test_a_directory_keeps_its_rows_and_prom_totals_for_the_next_run(tmp_path):
    out = SnapDir(str(tmp_path / "d"))
    out.lock()
    doc = {"id": "c0ffee"}
    snapper = types.SimpleNamespace(prev={(5, 50): {"tid": 5, "pid": 4, "sleeping_ns": 7, "nvcsw": 2,
                                                    "fold": (42, "worker")}},
                                    prom=PromExport("comm"), folds=Folds())
    snapper.folds.seen = {(42, "worker"): {"folded": 4, "running_ns": 8, "hist": None}}
    snapper.folds.totals = {(42, "worker"): {"folded": 3, "running_ns": 6}}
    snapper.folds.owed = {(42, "worker"): {"running_ns": 2}, (43, "gone"): {"hist": [0, 1]}}
    snapper.prom.totals = {("worker",): {"sleeping_ns": 9}}
    snapper.prom.started, snapper.prom.exited = 3, 1
    r = types.SimpleNamespace(last_ts=1234, new_late=[(6, 60)])
    resident.save_state(out, doc, snapper, r)
    state = resident.load_state(out, doc)
    assert state["ts"] == 1234 and state["late"] == [[6, 60]]
    assert resident.load_state(out, {"id": "another"}) == {}  # a cursor of another collector is no cursor
    again = types.SimpleNamespace(prev={}, prom=PromExport("comm"), folds=Folds())
    resident.restore(state, again)
    assert again.prev == {(5, 50): {"sleeping_ns": 7, "nvcsw": 2, "pid": 4, "fold": [42, "worker"]}}
    # the folded groups read last, the directory's totals of them and what vanished threads owe them go on
    assert (again.folds.seen, again.folds.totals, again.folds.owed) == (
        snapper.folds.seen, snapper.folds.totals, snapper.folds.owed)
    assert again.prom.totals == {("worker",): {"sleeping_ns": 9}} and (again.prom.started, again.prom.exited) == (3, 1)
    other = types.SimpleNamespace(prev={}, prom=PromExport("unit"), folds=Folds())
    resident.restore(state, other)  # totals per comm are no totals per unit
    assert other.prom.totals == {}
    out.close()


def nothing_found(root=resident.PIN_ROOT, **kw):
    return resident.Survey(**{"root": root, "root_problem": None, "running": [], "partial": [], "starting": [],
                              "cut": None, **kw})


def test_status_without_a_collector_exits_1(monkeypatch):
    monkeypatch.setattr(resident, "survey", lambda root: nothing_found(root))
    r = CliRunner().invoke(cli, ["snap", "--status"])
    assert r.exit_code == 1
    assert r.stderr == "pstate snap: no collector is running (`pstate snap --start` starts one)\n"


def test_a_search_cut_short_is_no_proof_that_none_runs(monkeypatch):
    cut = "/sys/fs/bpf/a/a/a is more than 24 directories down"
    monkeypatch.setattr(resident, "survey", lambda root: nothing_found(root, cut=cut))
    r = CliRunner().invoke(cli, ["snap", "--status"])
    assert r.exit_code == 1
    assert "no collector is running" not in r.stderr
    assert f"no collector found, but the search of bpffs was cut short ({cut})" in r.stderr


def test_status_names_the_owner_of_a_foreign_pin_directory(monkeypatch):
    why = "/sys/fs/bpf/pstate is owned by uid 65534 (nobody), not root"
    monkeypatch.setattr(resident, "survey", lambda root: nothing_found(root, root_problem=why))
    r = CliRunner().invoke(cli, ["snap", "--status"])
    assert r.exit_code == 1
    assert f"the pin directory {why}: `pstate snap --start` refuses it" in r.stderr
    assert "rm -r /sys/fs/bpf/pstate" in r.stderr and "--pin-dir" in r.stderr


def test_interval_options_do_not_apply_to_a_running_collector(monkeypatch, tmp_path):
    closed = []
    monkeypatch.setattr(snap.loader, "check_privileges", lambda: None)
    monkeypatch.setattr(snap.loader, "kernel_states", lambda ebpf_only=False: None)
    monkeypatch.setattr(snap, "running_collector",
                        lambda root=None: types.SimpleNamespace(close=lambda: closed.append(1)))
    r = CliRunner().invoke(cli, ["snap", "--dir", str(tmp_path), "--every", "10s"])
    assert r.exit_code == 2 and closed == [1]
    assert "a collector is running: each snap run writes one snapshot of it at once, so --every does not apply" \
        in r.stderr

"""bench/bench_kernel_cost.py --parts: each part's change still applies to
bpf/record.bpf.c, once, so the bench measures what its table says."""

import importlib.util
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    path = os.path.join(ROOT, "bench", "bench_kernel_cost.py")
    spec = importlib.util.spec_from_file_location("bench_kernel_cost", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()


def _record() -> str:
    with open(os.path.join(ROOT, "bpf", "record.bpf.c")) as f:
        return f.read()


@pytest.mark.parametrize("part", sorted(BENCH.PARTS))
def test_each_part_changes_record_where_it_says(part):
    text = _record()
    out = BENCH.part_source(text, part)
    assert out != text
    assert out.count("PSTATE_PROBE(sched, sched_switch)") == 1  # still one program on the switch


def test_a_part_whose_text_is_gone_stops_the_bench():
    with pytest.raises(SystemExit) as e:
        BENCH.part_source("int main(void) { return 0; }\n", "no_cgroup")
    assert "no_cgroup" in str(e.value) and "no longer has" in str(e.value)


def test_reserve_discard_keeps_the_reservation_and_drops_the_fill():
    out = BENCH.part_source(_record(), "reserve_discard")
    body = out[out.index("static __always_inline void emit("):]
    body = body[:body.index("\n}\n")]
    assert "reserve(irqs_on, &pos)" in body and "ringbuf_discard" in body
    assert "e->ts" not in body and "submit(e, pos)" not in body


def test_ringbuf_output_fills_every_field_of_the_record():
    """the copy from the stack writes what the reservation's fill writes"""
    text = _record()
    fill = text[text.index("    e->ts = now;"):text.index("    submit(e, pos);")]
    out = BENCH.part_source(text, "ringbuf_output")
    body = out[out.index("static __always_inline void emit("):]
    body = body[:body.index("\n}\n")]
    assert "ringbuf_output(&ev" in body and "reserve(" not in body
    assert set(re.findall(r"e->(\w+)", fill)) == set(re.findall(r"ev\.(\w+)", body))


def test_parts_write_a_directory_each(tmp_path):
    dirs = BENCH.part_dirs(os.path.join(ROOT, "bpf"), str(tmp_path))
    assert sorted(dirs) == sorted(BENCH.PARTS)
    for part, d in dirs.items():
        with open(os.path.join(d, "record.bpf.c")) as f:
            assert f.read() == BENCH.part_source(_record(), part)
        assert os.path.exists(os.path.join(d, "pstate.h"))


def test_the_switch_halves_each_leave_the_other_side_out():
    """switch_prev_only returns where next's side begins; switch_next_only
    never enters prev's (the idle branch after it stays)"""
    text = _record()
    prev_only = BENCH.part_source(text, "switch_prev_only")
    start = prev_only.index("PSTATE_PROBE(sched, sched_switch)")
    next_side = prev_only.index("    if (next != 0) {", start)
    assert prev_only[:next_side].endswith(BENCH._RETURN)
    next_only = BENCH.part_source(text, "switch_next_only")
    assert "    if (prev != 0 && 0) {\n" in next_only[next_only.index("PSTATE_PROBE(sched, sched_switch)"):]


@pytest.mark.parametrize("part,size,beyond", [("small_discard", "48", 0), ("small56_discard", "56", 1)])
def test_small_records_write_nothing_past_their_reservation(part, size, beyond):
    """the fields after the first 48 bytes (name, stack, cgroup) are gone
    from the fill; small56 writes the cgroup id at byte 48, inside its 56"""
    out = BENCH.part_source(_record(), part)
    assert f"events.ringbuf_reserve({size});" in out
    body = out[out.index("static __always_inline void emit("):]
    body = body[:body.index("\n}\n")]
    for field in ("comm", "stack", "pad2", "cgroup"):
        assert f"e->{field}" not in body
    assert body.count("(char *)e + 48") == beyond
    assert "ringbuf_discard" in out and "ringbuf_submit" not in out


def test_the_record_parts_drop_one_kind_of_record_only():
    text = _record()
    no_in = BENCH.part_source(text, "no_switch_in_records")
    assert "CAUSE_SWITCH_IN, SW_NEXT_PRIO,\n                       0, 0" not in no_in
    assert no_in.count("CAUSE_SWITCH_OUT") == text.count("CAUSE_SWITCH_OUT")
    no_wake = BENCH.part_source(text, "no_wakeup_records")
    woken = no_wake[no_wake.index("static __always_inline void woken("):]
    woken = woken[:woken.index("\n}\n")]
    assert "emit_state(" not in woken and "set_state(" in woken
    assert no_wake.count("CAUSE_SWITCH_IN") == text.count("CAUSE_SWITCH_IN")


def test_bare_reserve_discard_keeps_nothing_but_the_two_ring_calls():
    out = BENCH.part_source(_record(), "bare_reserve_discard")
    body = out[out.index("static __always_inline void emit("):]
    body = body[:body.index("\n}\n")]
    assert "ringbuf_reserve(sizeof(struct event))" in body and "ringbuf_discard(e, BPF_RB_NO_WAKEUP)" in body
    assert "task_match(" not in body and "reserve(irqs_on, &pos)" not in body and "e->" not in body
    out = BENCH.part_source(_record(), "no_attempted_count")
    body = out[out.index("static __always_inline struct event *reserve("):]
    assert "STAT_ATTEMPTED" not in body[:body.index("\n}\n")]


def test_ring_buffer_part_sends_every_record_through_the_ring():
    out = BENCH.part_source(_record(), "ring_buffer")
    take = out[out.index("static __always_inline struct event *slot_take("):]
    take = take[:take.index("\n}\n")]
    # slot_take gives up before it looks at the CPU's slots: reserve() falls to the ring buffer
    assert take.index("return 0;") < take.index("slot_pos.lookup(")
    assert out.replace(BENCH._RETURN + BENCH._SLOT_START, BENCH._SLOT_START) == _record()


@pytest.mark.parametrize("part", ["fill_discard", "reserve_discard", "unread_discard", "bare_reserve_discard",
                                  "small_discard", "switch_pair"])
def test_the_ring_buffer_parts_keep_the_slots_out(part):
    assert BENCH._RETURN + BENCH._SLOT_START in BENCH.part_source(_record(), part)


def test_the_emit_count_only_part_keeps_the_filters_and_drops_the_fill():
    text = BENCH.part_source(_record(), "emit_count_only")
    body = text[text.index("// One event of any type"):text.index("// the caller has checked transition_match")]
    assert "count(STAT_ATTEMPTED);" in body and "reserve(" not in body and "e->ts" not in body
    assert text.count("transition_match(cfg,") == _record().count("transition_match(cfg,")


def test_small_run_parts_drain_as_often_as_they_say():
    cs = {c.key: c for c in BENCH.make_contenders(os.path.join(ROOT, "bpf"), None, "", parts={p: "/x" for p in BENCH.PARTS})}
    argv = cs["record_slots_1024_drain_1ms"].argv
    assert argv[argv.index("--drain-interval") + 1] == "1ms"
    assert "#define CPU_SLOTS 1024\n" in BENCH.part_source(_record(), "slots_1024_drain_1ms")
    assert "--drain-interval" not in cs["record_slots_1024"].argv


@pytest.mark.parametrize("name", ["FLOOR_BTF_C", "ACCT_BTF_C"])
def test_the_wakeup_floors_move_only_the_wake_up_probe(name):
    source = getattr(BENCH, name)
    moved = BENCH.on_wakeup(source)
    assert "sched_waking" not in moved and moved.count("PSTATE_PROBE(sched, sched_wakeup)") == 1
    assert moved.replace("sched_wakeup)", "sched_waking)") == source

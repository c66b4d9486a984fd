"""The two paths of record's and snap's hot probes (pstate.kernel.tpbtf):
tp_btf when the kernel has BTF and accepts the programs, the classic
tracepoints otherwise; a refusal falls back with its reason kept, unless
--probes tp_btf asked for it; the program cache keeps a tp_btf program and
loads it again."""

from __future__ import annotations

import os
import time

import pytest

from pstate.exitcodes import ExitCode, PstateError
from pstate.kernel import btf, tpbtf

pytestmark = pytest.mark.bpf

needs_btf = pytest.mark.skipif(not os.path.exists(btf.VMLINUX), reason="the kernel has no BTF")


@pytest.fixture
def root_cache(tmp_path, monkeypatch):
    base = tmp_path / "pc"
    base.mkdir(mode=0o755)
    os.chmod(base, 0o755)
    d = str(base / "programs")
    monkeypatch.setenv("PSTATE_CACHE_DIR", d)
    monkeypatch.delenv("PSTATE_NO_CACHE", raising=False)
    monkeypatch.delenv(tpbtf.ENV, raising=False)
    return d


def _defines():
    from pstate.commands import record
    from pstate.kernel import loader

    return record.defines_for(loader.kernel_states(), max_tasks=4096, rb_pages=64, sample=False)


def _runs(prog) -> int:
    """Events the attached programs counted in 0.2 s with every filter open."""
    from pstate.kernel import filtermaps, loader
    from pstate.stream.filters import Filter

    filtermaps.start(prog, filtermaps.settings_for(Filter(), loader.kernel_states()))
    time.sleep(0.2)
    return prog.counters()[loader.STAT_ATTEMPTED]


@needs_btf
def test_refused_tp_btf_falls_back_with_its_reason(root_cache, monkeypatch):
    from pstate.kernel import loader

    def refuse(insns, name, btf_id, license="GPL", kern_version=0):
        raise tpbtf.Refused(f"{name}: Permission denied (a test refusal)")

    monkeypatch.setattr(tpbtf, "load_one", refuse)
    p = loader.Program("record", _defines())
    try:
        assert p.plan.path == tpbtf.TRACEPOINT
        assert p.plan.reason == ("the kernel refused the tp_btf programs: tp_btf__sched_switch: Permission denied "
                                 "(a test refusal)")
        assert _runs(p) > 0
    finally:
        p.close()
    with pytest.raises(PstateError) as e:
        loader.Program("record", _defines(), probes="tp_btf")
    assert e.value.exit_code == ExitCode.OSERR and "--probes tp_btf: the kernel refused" in e.value.message


@needs_btf
@pytest.mark.parametrize("name", ["record", "snap"])
def test_tp_btf_program_is_cached_and_loads_again(root_cache, name):
    from pstate.commands import snap
    from pstate.kernel import loader

    d = _defines() if name == "record" else snap.defines_for(loader.kernel_states(), 4096)
    cold = loader.Program(name, d, probes="tp_btf")
    try:
        assert (cold.origin, cold.plan.path) == ("compiled", "tp_btf")
        assert sorted(cold.btf_progs.link_fds) == sorted(tpbtf.probes_in(loader.source(name)))
    finally:
        cold.close()
    assert len(os.listdir(root_cache)) == 1
    warm = loader.Program(name, d, probes="tp_btf")
    try:
        assert (warm.origin, warm.plan.path) == ("cache", "tp_btf"), warm.cache_note
        assert set(tpbtf.probes_in(loader.source(name))) <= set(warm.cached.attached())
        if name == "record":
            assert _runs(warm) > 0
    finally:
        warm.close()
    # the other path is another entry
    other = loader.Program(name, d, probes="tracepoint")
    try:
        assert (other.origin, other.plan.path) == ("compiled", "tracepoint")
    finally:
        other.close()
    assert len(os.listdir(root_cache)) == 2


def test_no_btf_takes_the_tracepoint_path(tmp_path):
    assert tpbtf.plan("auto", 0xFF, str(tmp_path / "none")).path == tpbtf.TRACEPOINT
    assert "no usable kernel BTF" in tpbtf.plan(None, 0xFF, str(tmp_path / "none")).reason
    with pytest.raises(PstateError) as e:
        tpbtf.plan("tp_btf", 0xFF, str(tmp_path / "none"))
    assert e.value.exit_code == ExitCode.UNAVAILABLE

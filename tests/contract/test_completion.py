"""Completion offers what the options accept, spelled as the help spells it."""

from __future__ import annotations

import subprocess

from conftest import clean_env, pstate_cmd


def complete(*words: str) -> list[str]:
    env = dict(clean_env(), COMP_WORDS=" ".join(("pstate", *words)), COMP_CWORD=str(len(words)),
               _PSTATE_COMPLETE="bash_complete")
    out = subprocess.run(pstate_cmd(), env=env, capture_output=True, text=True, timeout=60).stdout
    return [line.split(",", 1)[1] for line in out.splitlines()]


def test_state_offers_names_and_kernel_letters():
    got = complete("record", "--state", "")
    assert "uninterruptible" in got and "D" in got and "S" in got and "t" in got
    assert complete("record", "--state", "D") == ["dead", "D"]
    assert complete("record", "--state", "t") == ["traced", "t"]


def test_latency_measures_keep_their_case():
    assert complete("heat", "--latency", "") == ["runq", "preempt", "wait", "blocked", "S", "D", "oncpu"]

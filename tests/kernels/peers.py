#!/usr/bin/env python3
"""pstate beside BCC's own tools: the comparison the kernel matrix's peers
step makes (guest_checks.py step_peers) and its summary in bench/results/.

On a kernel with kprobes (Debian 6.1), the step runs BCC's offcputime
(kernel stacks, D state only) and runqlat beside `pstate record --stacks`
on two workloads it controls: an O_DIRECT writer on a virtio disk and two
CPU hogs pinned to one CPU. This module reads what each tool printed and
puts the two side by side:

- the writer's D time by stack: offcputime's folded lines (microseconds
  off CPU per stack) and `pstate stats --stacks D -f json` (each stack's
  blocked time). Both are reduced to the same key, the stack's path from
  its root down to its reason (the first frame from the leaf that is not
  scheduler plumbing, pstate.stream.vocab.reason_of), and each key's share
  of the tool's total. offcputime takes its stack in finish_task_switch as
  the task comes back on CPU, pstate in __schedule as it leaves: the
  scheduler frames below the reason differ, the path above it does not.
  offcputime's time runs until the task is on CPU again (D plus the
  run-queue wait after the wake-up), pstate's D time until the wake-up.
- the hogs' run-queue latency: runqlat -p's log2 histograms (usecs), one
  runqlat per hog, summed, against pstate stats --by all --hist's run-queue
  histograms (after a wake-up and after a preemption) of the same
  processes, bucket by bucket.

    tests/kernels/peers.py --from-run RUN/deb61     writes bench/results/peers_deb61.json and .md

copies a run's peers.json (the matrix prints where it is) and writes the
markdown summary next to it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(REPO, "bench", "results")

TOP = 5  # stacks per tool in the comparison
# offcputime's kprobe: the frames it adds at the leaf of every stack
BCC_LEAF = re.compile(r"^finish_task_switch(\.\w+)*$")
# A section's bound that kallsyms lists at the address of the section's first
# function, and which BCC's ksym may name instead of it: on Linux 6.1 the
# first function of .sched.text (scheduler code, io_schedule there) comes
# out as __sched_text_start. Such a frame is never a stack's reason.
SECTION_BOUND = re.compile(r"^__\w+_text_(start|end)$")


def _vocab():
    try:
        from pstate.stream import vocab
    except ImportError:  # run from a checkout without the package installed
        sys.path.insert(0, os.path.join(REPO, "cli"))
        from pstate.stream import vocab
    return vocab


# --- stacks ---------------------------------------------------------------------------

def parse_folded(text: str) -> list[tuple[str, list[str], int]]:
    """offcputime -f's lines: (comm, frames root first, microseconds).
    Lines that are not folded stacks (warnings, a missed stack's count)
    are left out."""
    rows = []
    for line in text.splitlines():
        line = line.rstrip()
        head, sep, value = line.rpartition(" ")
        if not sep or not value.isdigit() or ";" not in head:
            continue
        comm, *frames = head.split(";")
        rows.append((comm, frames, int(value)))
    return rows


def stack_key(frames_root_first: list[str]) -> tuple[str, str]:
    """(reason, path): a stack's reason and its frames from the root down to
    the reason, function names only, joined by ";". The tool's own leaf
    frames (offcputime's finish_task_switch) go first."""
    vocab = _vocab()
    names = [vocab.frame_name(f) for f in frames_root_first]
    while names and BCC_LEAF.match(names[-1]):
        names.pop()
    if not names:
        return "unknown", ""
    leaf_first = names[::-1]
    reason = vocab.reason_of([n for n in leaf_first if not SECTION_BOUND.match(n)] or leaf_first)
    cut = len(names) - leaf_first.index(reason) if reason in leaf_first else len(names)
    return reason, ";".join(names[:cut])


def section_bounds(text: str) -> list[str]:
    """The section bounds offcputime's stacks name as frames (SECTION_BOUND)."""
    return sorted({f for _, frames, _ in parse_folded(text) for f in frames if SECTION_BOUND.match(f)})


def ranked(rows: list[tuple[str, str, float]], total: float | None = None, top: int = TOP) -> list[dict]:
    """(reason, path, time) rows summed by path, largest first, each with
    its share of total (default: the rows' sum)."""
    by: dict[tuple[str, str], float] = {}
    for reason, path, t in rows:
        by[(reason, path)] = by.get((reason, path), 0) + t
    total = sum(by.values()) if total is None else total
    out = [{"reason": r, "path": p, "time": t, "share": round(t / total, 4) if total else None}
           for (r, p), t in sorted(by.items(), key=lambda kv: (-kv[1], kv[0]))]
    return out[:top] if top else out


def offcputime_rows(text: str) -> list[tuple[str, str, float]]:
    """offcputime -f text -> (reason, path, microseconds) per stack."""
    return [(*stack_key(frames), us) for _, frames, us in parse_folded(text)]


def pstate_rows(stats: dict) -> list[tuple[str, str, float]]:
    """`pstate stats --stacks D -f json --by all` -> (reason, path,
    microseconds of D) per stack; stacks it could not take (no frames) are
    kept under their own reason."""
    rows = []
    for g in stats.get("groups", []):
        for s in g.get("stacks", []):
            if s.get("state") != "uninterruptible":
                continue
            frames = s.get("frames") or ""
            reason, path = stack_key(frames.split(";")) if ";" in frames else (s.get("reason") or frames, frames)
            rows.append((reason, path, (s.get("total_ns") or 0) / 1000))
    return rows


def pstate_offcpu_rows(recs: list[dict], tid: int) -> list[tuple[str, str, float]]:
    """A recording's D intervals of one thread measured as offcputime
    measures them, until the thread is back on CPU: (reason, path,
    microseconds of D plus the run-queue wait after its wake-up) per D
    interval that has a stack."""
    stacks = {x["stack_id"]: x["frames"] for x in recs if x.get("type") == "stack"}
    rows, open_ = [], None
    for x in recs:
        if x.get("type") != "state" or x.get("tid") != tid:
            continue
        if x.get("dur_ns") is None:
            open_ = None
        elif x["from"] == "uninterruptible" and x.get("stack_id") in stacks:
            open_ = [*stack_key(stacks[x["stack_id"]].split(";")), x["dur_ns"]]
            rows.append(open_)
        elif x["from"] == "runnable" and open_ is not None:
            open_[2] += x["dur_ns"]
            open_ = None
        else:
            open_ = None
    return [(r, p, ns / 1000) for r, p, ns in rows]


def compare_stacks(bcc: list[tuple[str, str, float]], ps: list[tuple[str, str, float]], top: int = TOP) -> dict:
    """Each tool's top stacks and, for every path among either tool's top,
    both tools' shares of their own total."""
    bt, pt = sum(x[2] for x in bcc), sum(x[2] for x in ps)
    ball, pall = ranked(bcc, bt, top=0), ranked(ps, pt, top=0)
    bmap = {(x["reason"], x["path"]): x for x in ball}
    pmap = {(x["reason"], x["path"]): x for x in pall}
    keys = []
    for x in ball[:top] + pall[:top]:
        k = (x["reason"], x["path"])
        if k not in keys:
            keys.append(k)
    side = []
    for k in keys:
        b, p = bmap.get(k), pmap.get(k)
        side.append({"reason": k[0], "path": k[1],
                     "offcputime_us": round(b["time"]) if b else 0, "offcputime_share": b["share"] if b else 0.0,
                     "pstate_us": round(p["time"]) if p else 0, "pstate_share": p["share"] if p else 0.0})
    side.sort(key=lambda x: -(x["offcputime_share"] + x["pstate_share"]))

    def by_reason(rows, total):
        acc: dict[str, float] = {}
        for r, _, t in rows:
            acc[r] = acc.get(r, 0) + t
        return {r: round(t / total, 4) for r, t in sorted(acc.items(), key=lambda kv: -kv[1])} if total else {}

    return {"offcputime_total_us": round(bt), "pstate_total_us": round(pt), "stacks": side,
            "reasons": {"offcputime": by_reason(bcc, bt), "pstate": by_reason(ps, pt)},
            "top_agrees": bool(ball and pall and (ball[0]["reason"], ball[0]["path"]) == (pall[0]["reason"], pall[0]["path"]))}


# --- histograms --------------------------------------------------------------------------

_SECTION = re.compile(r"^\s*(\S+) = (.+?)\s*$")
_ROW = re.compile(r"^\s*(\d+)\s*->\s*(\d+)\s*:\s*(\d+)\s*\|")
_UNIT = re.compile(r"^\s*(usecs|msecs|nsecs)\s*:\s*count")


def parse_log2_hist(text: str) -> dict:
    """BCC's print_log2_hist text (runqlat, runqlat -P) -> {section: {"unit",
    "hist": [[lo, hi, count], ...]}}; section None when the histogram has
    no `pid = N` header, else the header's value (int when it is one)."""
    out: dict = {}
    section, unit = None, None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m and "->" not in line:
            v = m.group(2).strip("'\"")
            section = int(v) if v.lstrip("-").isdigit() else v
            continue
        m = _UNIT.match(line)
        if m:
            unit = m.group(1)
            out.setdefault(section, {"unit": unit, "hist": []})
            continue
        m = _ROW.match(line)
        if m:
            out.setdefault(section, {"unit": unit, "hist": []})["hist"].append([int(x) for x in m.groups()])
    return out


def merge_hists(hists: list[list[list[int]]]) -> list[list[int]]:
    """Histograms ([[lo, hi, count], ...], the same unit) summed by bucket."""
    acc: dict[tuple[int, int], int] = {}
    for h in hists:
        for lo, hi, n in h:
            acc[(lo, hi)] = acc.get((lo, hi), 0) + n
    return [[lo, hi, n] for (lo, hi), n in sorted(acc.items())]


def pstate_runq_hist(stats: dict) -> list[list[int]]:
    """`pstate stats --by all --hist -f json`: the run-queue histograms
    (after a wake-up and after a preemption: runqlat counts both) summed."""
    hists = []
    for g in stats.get("groups", []):
        for key, lat in g.get("latency", {}).items():
            if key.startswith("runq") and lat.get("hist"):
                if lat.get("hist_unit", "usecs") != "usecs":
                    raise ValueError(f"{key}: histogram in {lat.get('hist_unit')}, not usecs")
                hists.append(lat["hist"])
    return merge_hists(hists)


def log2_hist_us(durations_ns: list[int]) -> list[list[int]]:
    """Durations (ns) in runqlat's usecs rows, exactly: slot k holds
    [2^(k-1), 2^k - 1] us, slot 1 also 0 (bcc's bpf_log2l of delta / 1000)."""
    acc: dict[int, int] = {}
    for d in durations_ns:
        k = max(1, (d // 1000).bit_length())
        acc[k] = acc.get(k, 0) + 1
    return [[0 if k == 1 else 1 << (k - 1), (1 << k) - 1, n] for k, n in sorted(acc.items())]


def compare_hists(a: list[list[int]], b: list[list[int]]) -> dict:
    """Two log2 histograms side by side: rows [lo, hi, a, b] over every
    bucket either has, the counts, each one's fullest bucket, and the total
    variation distance of their shapes (0: the same shape, 1: disjoint)."""
    am = {(lo, hi): n for lo, hi, n in a}
    bm = {(lo, hi): n for lo, hi, n in b}
    keys = sorted(set(am) | set(bm))
    if keys:  # the buckets in between too: a gap is a row of zeros, as runqlat prints it
        lo0 = keys[0][0]
        full = [(0, 1)] if lo0 == 0 else []
        hi_end = keys[-1][1]
        lo = 2 if lo0 == 0 else lo0
        while lo <= hi_end:
            full.append((lo, 2 * lo - 1))
            lo *= 2
        if all(k in full for k in keys):
            keys = [k for k in full if k >= keys[0]]
    rows = [[lo, hi, am.get((lo, hi), 0), bm.get((lo, hi), 0)] for lo, hi in keys]
    ta, tb = sum(am.values()), sum(bm.values())
    tvd = (0.5 * sum(abs(r[2] / ta - r[3] / tb) for r in rows)) if ta and tb else None

    def mode(i):
        return max(rows, key=lambda r: r[i])[:2] if rows else None

    return {"buckets": rows, "counts": [ta, tb], "modes": [mode(2), mode(3)],
            "shape_distance": round(tvd, 4) if tvd is not None else None}


# --- the summary ----------------------------------------------------------------------------

def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _short_path(path: str, n: int = 4) -> str:
    parts = path.split(";")
    return ";".join(parts if len(parts) <= n else ["…"] + parts[-n:])


def markdown(doc: dict) -> str:
    """The summary of a peers.json."""
    out = [f"# pstate beside BCC's offcputime and runqlat: {doc.get('kernel', '?')}", ""]
    out.append("Generated by `tests/kernels/peers.py` from the kernel matrix's `peers` step "
               "(`make test-kernels KERNELS=<id> CHECKS=peers`); the numbers are in the JSON file of the "
               "same name.")
    out.append("")
    tools = doc.get("tools", {})
    out.append(f"- kernel {doc.get('kernel')}, {doc.get('accel', '?')}; BCC {tools.get('bcc_version', '?')} "
               f"(`{tools.get('offcputime')}`, `{tools.get('runqlat')}`), its headers: {tools.get('bcc_headers', '?')}")
    for name in ("offcpu", "runq"):
        if doc.get(name, {}).get("error"):
            out.append(f"- {name}: {doc[name]['error']}")
    off = doc.get("offcpu", {})
    cmp_ = off.get("compare")
    if cmp_:
        w = off.get("writer", {})
        out += ["", "## D state by stack: an O_DIRECT writer", "",
                f"The writer made {w.get('writes')} O_DIRECT writes of 64 KiB to one block on the guest's virtio "
                f"disk, {w.get('nvcsw')} of which blocked (its voluntary switches, as the kernel counts them). "
                f"`{off.get('offcputime_cmd')}` beside `pstate record --stacks D`, then "
                f"`pstate stats --stacks D -f json --by all -p PID`.",
                "",
                f"- offcputime: {cmp_['offcputime_total_us'] / 1000:.1f} ms off CPU in D (until back on CPU)",
                f"- pstate: {cmp_['pstate_total_us'] / 1000:.1f} ms in D (until the wake-up) in "
                f"{off.get('pstate_d_count')} intervals; plus {off.get('pstate_runq_after_wakeup_us', 0) / 1000:.1f} ms "
                f"in the run queue after the wake-ups "
                f"(D + run queue: {(cmp_['pstate_total_us'] + off.get('pstate_runq_after_wakeup_us', 0)) / 1000:.1f} ms)",
                f"- the top stack is the same in both: {'yes' if cmp_['top_agrees'] else 'no'}",
                *([f"- offcputime names section bounds as frames: {', '.join(off['offcputime_section_bounds'])} "
                   "(BCC's ksym gives the bound kallsyms lists at the address of the section's first function; "
                   "such a frame is not taken for a reason)"] if off.get("offcputime_section_bounds") else []),
                "", "| reason | path (root … reason) | offcputime | share | pstate | share |",
                "|---|---|---:|---:|---:|---:|"]
        for s in cmp_["stacks"]:
            out.append(f"| {s['reason']} | `{_short_path(s['path'])}` | {s['offcputime_us'] / 1000:.2f} ms | "
                       f"{_pct(s['offcputime_share'])} | {s['pstate_us'] / 1000:.2f} ms | {_pct(s['pstate_share'])} |")
        u = off.get("compare_until_on_cpu")
        if u:
            d_paths = {(s["reason"], s["path"]) for s in cmp_["stacks"]}
            rows = [s for s in u["stacks"] if (s["reason"], s["path"]) in d_paths]
            out += ["", f"Until back on CPU, as offcputime counts: `{off.get('offcputime_any_cmd')}` (no state filter: "
                    "its `--state` reads the task's state in finish_task_switch, after the switch) beside pstate's D "
                    "plus the run-queue wait after each wake-up, from the recording; the D stacks above (the "
                    "unfiltered run also has the writer's preemptions and its wait for its go byte):", "",
                    "| reason | offcputime, any state | offcputime --state 2 | pstate D + run queue | pstate D |",
                    "|---|---:|---:|---:|---:|"]
            d_rows = {(s["reason"], s["path"]): s for s in cmp_["stacks"]}
            for s in rows:
                d = d_rows[(s["reason"], s["path"])]
                out.append(f"| {s['reason']} `{_short_path(s['path'], 2)}` | {s['offcputime_us'] / 1000:.1f} ms | "
                           f"{d['offcputime_us'] / 1000:.1f} ms | {s['pstate_us'] / 1000:.1f} ms | "
                           f"{d['pstate_us'] / 1000:.1f} ms |")
        misses = [p for p in off.get("bpf_programs", []) if p.get("recursion_misses")]
        if off.get("bpf_programs"):
            out += ["", "BPF programs' runs and misses at the end (kernel.bpf_stats_enabled in the guest): " +
                    "; ".join(f"{p['owner']} {p.get('name')} ({p.get('type')}) {p.get('run_cnt', '?')} runs"
                              + (f", {p['recursion_misses']} missed" if p.get("recursion_misses") else "")
                              for p in off["bpf_programs"] if p.get("owner", "").startswith(("offcputime", "runqlat")))
                    + (". recursion_misses: none reported." if not misses else ".")]
        out += ["", "Share of D time by reason: offcputime " +
                ", ".join(f"{r} {_pct(v)}" for r, v in list(cmp_["reasons"]["offcputime"].items())[:TOP]) +
                "; pstate " + ", ".join(f"{r} {_pct(v)}" for r, v in list(cmp_["reasons"]["pstate"].items())[:TOP])]
    rq = doc.get("runq", {})
    h = rq.get("compare")
    if h:
        hogs = rq.get("hogs", [])
        out += ["", "## Run-queue latency: two CPU hogs on one CPU", "",
                f"{len(hogs)} processes spinning {rq.get('seconds')} s each, both pinned to CPU {rq.get('cpu')}; "
                f"in their spinning window the kernel counted {rq.get('truth_waits')} switches of theirs "
                f"(voluntary + involuntary: each a wait in the run queue), pstate "
                f"{rq.get('pstate_switch_outs_in_window')} switch-outs (+{rq.get('pstate_switch_outs_at_edges')} "
                f"while the hogs read their counts) and {rq.get('pstate_waits_in_window')} "
                f"run-queue waits that ended; the counts below are of their whole "
                f"lives, start-up and exit included. `{rq.get('runqlat_cmd')}`, "
                f"summed, beside `pstate stats --by all --hist -f json -p PID -p PID` "
                f"(run queue after a wake-up plus after a preemption).",
                *([f"pstate's wait after a wake-up starts at {doc['pstate_wakeups_at']} on this kernel "
                   "(its meta record's wakeups_at), runqlat's at sched_wakeup."] if doc.get("pstate_wakeups_at") else []),
                "",
                f"- waits: runqlat {h['counts'][0]}, pstate {h['counts'][1]}",
                f"- fullest bucket: runqlat {h['modes'][0]}, pstate {h['modes'][1]} usecs",
                f"- shape distance (total variation, 0 = the same shape): {h['shape_distance']}",
                ""]
        exact = rq.get("compare_records")
        if rq.get("compare_note"):
            out += [f"- {rq['compare_note']}"]
        if exact:
            out += [f"- pstate's own records (exact to the ns, whereas stats' rows are to 1/64 of a bucket): "
                    f"{exact['counts'][1]} waits, shape distance {exact['shape_distance']}", ""]
            rows = {(lo, hi): n for lo, hi, _, n in exact["buckets"]}
            out += ["| usecs | runqlat | pstate stats | pstate records |", "|---|---:|---:|---:|"]
            for lo, hi, a, b in h["buckets"]:
                out.append(f"| {lo} -> {hi} | {a} | {b} | {rows.get((lo, hi), 0)} |")
        else:
            out += ["| usecs | runqlat | pstate |", "|---|---:|---:|"]
            for lo, hi, a, b in h["buckets"]:
                out.append(f"| {lo} -> {hi} | {a} | {b} |")
    out.append("")
    return "\n".join(out)


def publish(run_out: str, kid: str | None = None, results: str = RESULTS) -> list[str]:
    """Copy RUN_OUT/peers.json to results/peers_<kid>.json and write the
    markdown beside it; returns the paths written."""
    src = os.path.join(run_out, "peers.json")
    with open(src) as f:
        doc = json.load(f)
    kid = kid or os.path.basename(os.path.normpath(run_out))
    os.makedirs(results, exist_ok=True)
    dst = os.path.join(results, f"peers_{kid}.json")
    shutil.copyfile(src, dst)
    md = os.path.join(results, f"peers_{kid}.md")
    with open(md, "w") as f:
        f.write(markdown(doc))
    return [dst, md]


def main() -> int:
    ap = argparse.ArgumentParser(description="bench/results/peers_<id>.{json,md} from a matrix run's peers step")
    ap.add_argument("--from-run", required=True, metavar="DIR",
                    help="a kernel's directory of a matrix run (CACHE/runs/<time>/<id>), holding peers.json")
    ap.add_argument("--kernel", help="the kernel id (default: DIR's name)")
    ap.add_argument("--results", default=RESULTS)
    args = ap.parse_args()
    for path in publish(args.from_run, args.kernel, args.results):
        print(f"wrote {os.path.relpath(path, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""pstate's kernel matrix: record, snap, the collector and doctor on the
kernels users run, one table of checks per kernel.

    make test-kernels                                  every kernel of kernels.json
    make test-kernels KERNELS="deb61 deb510"           some of them (host: this machine's kernel)
    make test-kernels KERNELS=deb61 CHECKS="record snap"   some steps: doctor record stacks snap collector
    make test-kernels KERNELS=deb61 CHECKS=peers       BCC's offcputime and runqlat beside pstate (opt-in)
    tests/kernels/matrix.py --write-expected           expected/<id>.json from each kernel's BTF

Needs root, the project's venv (`make setup`), apt access to a Debian mirror
(the machine's own apt sources name it) and PyPI (virtme-ng). Missing tools
(qemu-system-x86, e2fsprogs, busybox, ...) are installed with apt.

What it does, per kernel of tests/kernels/kernels.json:

- host: the checks run here directly, as root, in a mount namespace of
  their own (their own bpffs: the collector check meets no other one).
- a Debian kernel: fetch.py downloads its linux-image, linux-headers (arch
  and common) and linux-kbuild packages with apt in a private configuration
  and unpacks them under the cache (nothing is installed), and refreshes
  tests/kernels/btf/<id>.btf.xz, the kernel's raw BTF (commit it when it
  changed). virtme-ng (from PyPI, in a venv under the cache) boots the
  kernel under qemu, 2 vCPUs and 4 GiB, with this machine's root file system
  read-only and writable overlays on /tmp, /mnt, /usr/src and /usr/lib
  (/var/cache and /var/tmp are tmpfs there); the guest sees its packages
  read-only and binds its header trees where they install (/usr/src, with
  /lib/modules/<release>/build leading to the arch tree), a fresh ext4
  virtio disk for the O_DIRECT writes, and a persistent one per kernel at
  /var/cache/pstate (its program cache and merged header trees), so each
  program is compiled once across runs.
  KVM is used when a stock kernel boots under it (a short boot probe,
  remembered in the cache), else TCG. One guest at a time: every boot
  holds flock /var/lock/pstate-guest.lock.
- inside, as root, guest_checks.py runs each step with its own time limit:
  doctor, record (a sleeper thread, an O_DIRECT writer, fork/exec/exit, a
  multithreaded exit, with exact counts; stats on the recording), record
  --stacks D, snap (two snapshots around a workload) and the collector
  (--start, two snapshots, --status, --stop).
- each program's meta record says how it attached (probes, probe_paths,
  wakeups_at); that is compared with expected/<id>.json.

It prints one table, a row per check and a column per kernel (ok/FAIL/skip
with seconds), the plan comparison and each kernel's wall time, and exits 1
when anything failed. Every run's logs (console, guest log, each command's
output, the recordings) stay in CACHE/runs/<time>/<kernel>/.

Environment: PSTATE_KERNELS_CACHE (default /var/cache/pstate-kernels),
ACCEL=kvm|tcg (skip the probe), PSTATE_GUEST_LIMIT (s, default 2700: a guest
still running then is stopped); PSTATE_* variables (PSTATE_PROBES, ...) are
passed to the checks.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import json
import lzma
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import fetch  # noqa: E402
import guest_checks  # noqa: E402
import kplan  # noqa: E402

VIRTME_NG = "virtme-ng==1.42"
LOCK = "/var/lock/pstate-guest.lock"
KEEP_RUNS = 20
TOOLS = {"qemu-system-x86_64": "qemu-system-x86", "mkfs.ext4": "e2fsprogs", "busybox": "busybox-static",
         "objcopy": "binutils", "depmod": "kmod", "dpkg-deb": "dpkg", "apt-get": "apt", "unshare": "util-linux"}
PROBE_LIMIT = 45  # s for a KVM boot probe; a KVM boot takes a few seconds
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def say(*a):
    print(*a, flush=True)


def load_kernels() -> list[dict]:
    with open(os.path.join(HERE, "kernels.json")) as f:
        return json.load(f)["kernels"]


def select_steps(spec: str) -> list[str]:
    """Steps named, or the steps of the checks named (CHECKS=record-stacks);
    none named: every step but the opt-in ones (peers)."""
    if not spec.strip():
        return list(guest_checks.DEFAULT_STEPS)
    steps = []
    for word in spec.replace(",", " ").split():
        step = word if word in guest_checks.STEPS else next(
            (s for s, cs in guest_checks.STEPS.items() if word in cs), None)
        if step is None:
            sys.exit(f"unknown check {word!r}: one of {', '.join(guest_checks.STEPS)} "
                     f"(or a check of theirs: {', '.join(guest_checks.CHECKS)})")
        if step not in steps:
            steps.append(step)
    return [s for s in guest_checks.STEPS if s in steps]


def check_tools():
    missing = sorted({pkg for tool, pkg in TOOLS.items() if shutil.which(tool, path=SYSTEM_PATH) is None})
    if missing:
        say(f"installing {' '.join(missing)}")
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], check=True,
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def virtme(cache: str) -> str:
    """virtme-run from a venv of its own under the cache."""
    venv = os.path.join(cache, "vng")
    run = os.path.join(venv, "bin", "virtme-run")
    stamp = os.path.join(venv, ".installed")
    if not os.path.exists(stamp) or open(stamp).read().strip() != VIRTME_NG:
        say(f"installing {VIRTME_NG} in {venv}")
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run(["/usr/bin/python3", "-m", "venv", venv], check=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "--disable-pip-version-check", VIRTME_NG],
                       check=True)
        with open(stamp, "w") as f:
            f.write(VIRTME_NG + "\n")
    return run


def make_disk(path: str, size: str, label: str):
    subprocess.run(["truncate", "-s", size, path], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", label, path], check=True)


class GuestLock:
    """flock on LOCK around a boot: one guest at a time on this machine."""

    def __enter__(self):
        self.fd = os.open(LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"  waiting for {LOCK} (another guest is running)")
            t = time.monotonic()
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            say(f"  got {LOCK} after {time.monotonic() - t:.0f} s")
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def run_group(cmd: list[str], limit: float, log: str, env=None, poll=None) -> tuple[int | None, float]:
    """cmd in a process group of its own, output to log; killed (rc None)
    after limit s. poll() is called every few seconds meanwhile."""
    t0 = time.monotonic()
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env)
        try:
            while True:
                try:
                    rc = p.wait(timeout=3)
                    break
                except subprocess.TimeoutExpired:
                    if poll:
                        poll()
                    if time.monotonic() - t0 > limit:
                        os.killpg(p.pid, signal.SIGTERM)
                        try:
                            p.wait(timeout=15)
                        except subprocess.TimeoutExpired:
                            os.killpg(p.pid, signal.SIGKILL)
                            p.wait()
                        rc = None
                        break
        except BaseException:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise
    if poll:
        poll()
    return rc, time.monotonic() - t0


def virtme_cmd(vrun: str, root: str, kver: str, accel: dict, script: str, extra: list[str] = ()) -> list[str]:
    cmd = [vrun, "--kimg", os.path.join(root, "boot", f"vmlinuz-{kver}"), "--mods", "auto",
           "--memory", "4G", "--cpus", "2", "--show-boot-console", "-a", "loglevel=5",  # warnings, oopses, panics
           *extra, "--script-sh", script]
    if accel["accel"] == "tcg":
        # one host thread for both vCPUs: with multi-threaded TCG a vCPU can
        # run a stale translation of code the kernel is patching (text_poke's
        # int3), which Linux 6.12 took for a fatal "Oops: int3" in
        # handle_softirqs while tracepoints were attached
        cmd += ["--disable-kvm", "--qemu-opts", "-accel", "tcg,thread=single"]
    if accel.get("qemu_opts"):
        cmd += ["--qemu-opts", *accel["qemu_opts"]]
    return cmd


def choose_accel(cache: str, vrun: str, kid: str, root: str, kver: str) -> dict:
    """tcg or kvm for this kernel: ACCEL, else a remembered probe, else a
    probe: does the kernel boot under KVM within PROBE_LIMIT s? (The caller
    holds the guest lock.)"""
    forced = os.environ.get("ACCEL")
    if forced:
        return {"accel": forced, "why": "ACCEL"}
    if not os.path.exists("/dev/kvm"):
        return {"accel": "tcg", "why": "no /dev/kvm"}
    path = os.path.join(cache, "accel.json")
    known = json.load(open(path)) if os.path.exists(path) else {}
    key = f"{kid} {kver}"
    if key in known:
        return known[key]
    log = os.path.join(cache, f"accel-probe-{kid}.log")
    found = {"accel": "tcg", "why": f"a KVM boot did not finish in {PROBE_LIMIT} s (log: {log})"}
    for opts in ([], ["-cpu", "host,-arch-capabilities"]):
        accel = {"accel": "kvm", "qemu_opts": opts}
        say(f"  probing KVM{' with ' + ' '.join(opts) if opts else ''} (at most {PROBE_LIMIT} s)")
        rc, secs = run_group(virtme_cmd(vrun, root, kver, accel, "echo pstate-kvm-boots", ["--rodir", root]),
                             PROBE_LIMIT, log)
        text = open(log, errors="replace").read()
        if "pstate-kvm-boots" in text:
            found = dict(accel, why=f"a KVM boot took {secs:.0f} s")
            break
        if rc is None or "arch-capabilities" not in text and "arch_capabilities" not in text:
            break
    known[key] = found
    with open(path, "w") as f:
        json.dump(known, f, indent=1)
    return found


def passed_env() -> str:
    keep = {k: v for k, v in os.environ.items() if k.startswith("PSTATE_") and k not in (
        "PSTATE_KERNELS_CACHE", "PSTATE_GUEST_LIMIT")}
    keep.update(PYTHONDONTWRITEBYTECODE="1", PATH=SYSTEM_PATH)
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(keep.items()))


class Watch:
    """Prints each check's result as it lands in a run's results/."""

    def __init__(self, out: str, kid: str):
        self.dir, self.kid, self.seen = os.path.join(out, "results"), kid, set()

    def __call__(self):
        for path in sorted(glob.glob(os.path.join(self.dir, "*.json")), key=os.path.getmtime):
            if path in self.seen:
                continue
            self.seen.add(path)
            try:
                r = json.load(open(path))
            except ValueError:
                self.seen.discard(path)
                continue
            say(f"  {self.kid} {r['name']}: {kplan.cell(r)}  {r['detail'][:160]}")


def run_host(out: str, steps: list[str], limit: float) -> dict:
    scratch = f"/var/tmp/pstate-kernels-{os.getpid()}"
    cmd = [os.path.join(REPO, ".venv", "bin", "python"), os.path.join(HERE, "guest_checks.py"), "--mode", "host", "--out", out, "--scratch", scratch,
           "--steps", ",".join(steps)]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    say(f"host: {os.uname().release}, checks run here -> {out}")
    try:
        rc, secs = run_group(cmd, limit, os.path.join(out, "guest.log"), env=env, poll=Watch(out, "host"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"kernel": os.uname().release, "accel": "host", "wall": secs, "rc": rc}


def run_guest(kernel: dict, cache: str, out: str, steps: list[str], limit: float, refresh: bool) -> dict:
    kid = kernel["id"]
    t = time.monotonic()
    root, kver = fetch.fetch(kernel, cache, refresh=refresh, log=lambda m: say("  " + m))
    raw = fetch.raw_btf(os.path.join(root, "boot", f"vmlinuz-{kver}"))
    if fetch.save_btf(raw, os.path.join(HERE, "btf", f"{kid}.btf.xz")):
        say(f"  tests/kernels/btf/{kid}.btf.xz written from {kver}'s BTF (commit it)")
    fetch_s = time.monotonic() - t
    vrun = virtme(cache)
    programs = os.path.join(cache, "programs", f"{kid}.img")
    if not os.path.exists(programs):
        os.makedirs(os.path.dirname(programs), exist_ok=True)
        make_disk(programs, "1G", "pstate-programs")
    scratch = os.path.join(out, "scratch.img")
    make_disk(scratch, "512M", "pstate-scratch")
    extra = ["--overlay-rwdir", "/tmp", "--overlay-rwdir", "/mnt", "--overlay-rwdir", "/usr/src",
             "--overlay-rwdir", "/usr/lib", "--rodir", root, "--rwdir", out,
             "--blk-disk", f"scratch={scratch}", "--blk-disk", f"programs={programs}"]
    say(f"{kid}: {kver}")
    try:
        with GuestLock():
            accel = choose_accel(cache, vrun, kid, root, kver)
            script = (f"{passed_env()} {os.path.join(REPO, '.venv', 'bin', 'python')} "
                      f"{os.path.join(HERE, 'guest_checks.py')} --mode guest --out {out} --accel {accel['accel']} "
                      f"--kernel-root {root} --steps {','.join(steps)} > {out}/guest.log 2>&1")
            say(f"  booting under {accel['accel']} ({accel['why']}) -> {out}")
            rc, secs = run_group(virtme_cmd(vrun, root, kver, accel, script, extra), limit,
                                 os.path.join(out, "console.log"), poll=Watch(out, kid))
    finally:
        os.unlink(scratch)
    if rc is None:
        say(f"  {kid}: the guest was stopped after {limit:.0f} s (PSTATE_GUEST_LIMIT)")
    else:
        say(f"  {kid}: the guest ended after {kplan.fmt_secs(secs)} (virtme-run exit {rc})")
    return {"kernel": kver, "accel": accel["accel"], "wall": secs, "rc": rc, "fetch": fetch_s}


def expected_for(kid: str) -> tuple[dict, str]:
    """expected/<id>.json; for the host when it was written for another
    kernel, the rule applied to the running kernel's BTF."""
    path = os.path.join(HERE, "expected", f"{kid}.json")
    doc = json.load(open(path)) if os.path.exists(path) else None
    if kid == "host" and (doc is None or doc.get("_kernel") != os.uname().release):
        with open("/sys/kernel/btf/vmlinux", "rb") as f:
            return kplan.expected_plan(f.read()), "from this kernel's BTF"
    if doc is None:
        return {}, f"no {os.path.relpath(path, REPO)}"
    return doc, os.path.relpath(path, REPO)


def write_expected(kernels: list[dict], cache: str):
    for k in kernels:
        if k["id"] == "host":
            raw, release = open("/sys/kernel/btf/vmlinux", "rb").read(), os.uname().release
        else:
            path = os.path.join(HERE, "btf", f"{k['id']}.btf.xz")
            if not os.path.exists(path):
                say(f"{k['id']}: no {path} (run the matrix on it first)")
                continue
            kver = os.path.join(cache, "roots", k["id"], "KVER")
            raw, release = lzma.open(path).read(), open(kver).read().strip() if os.path.exists(kver) else k["what"]
        doc = {"_kernel": release, **kplan.expected_plan(raw)}
        path = os.path.join(HERE, "expected", f"{k['id']}.json")
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        say(f"wrote {os.path.relpath(path, REPO)}")


def crash_of(console: str) -> str | None:
    """What a guest's console says of a kernel crash (its oops or BUG line,
    the RIP, the panic), or None."""
    try:
        lines = open(console, errors="replace").read().splitlines()
    except OSError:
        return None
    said = []
    for pattern in (r"(Oops|BUG|general protection fault|Kernel BUG)\b.*", r"RIP: \S+", r"Kernel panic.*"):
        hit = next((m.group(0) for m in map(re.compile(pattern).search, lines) if m), None)
        if hit:
            said.append(hit.strip())
    return "; ".join(said) or None


# the steps whose meta records give a program's plan
PLAN_STEPS = {"record": ("record", "stacks"), "snap": ("snap", "collector")}


def collect(out: str, checks: list[str], kid: str, runinfo: dict, results: dict, steps: list[str]) -> list[str]:
    """Read a kernel's results into results[(kid, check)]. The check that was
    under way when the run ended fails with why (the guest's time limit, a
    kernel crash, or no message: a triple fault resets the guest silently),
    those after it are skipped. Returns the plan differences."""
    ended = None
    for name in checks:
        path = os.path.join(out, "results", f"{name}.json")
        if os.path.exists(path):
            results[(kid, name)] = json.load(open(path))
        elif ended:
            results[(kid, name)] = {"name": name, "ok": None, "seconds": 0, "detail": f"not run: {ended}"}
        elif name != "boot" or kid != "host":
            crash = crash_of(os.path.join(out, "console.log"))
            if runinfo.get("rc") is None:
                ended, why = "the guest was stopped", f"the guest was stopped at its time limit during {name}"
            elif crash:
                ended, why = "the guest kernel had crashed", f"the guest kernel crashed during {name}: {crash}"
            else:
                ended, why = "the guest had ended", (f"the guest ended during {name} with no kernel message "
                                                     "(a triple fault, say: see console.log)")
            results[(kid, name)] = {"name": name, "ok": False, "seconds": 0, "detail": why}
    plan_path = os.path.join(out, "plan.json")
    got = json.load(open(plan_path)) if os.path.exists(plan_path) else {}
    expected, source = expected_for(kid)
    runinfo["plan_source"] = source
    runinfo["got_plan"] = got
    expected = {p: v for p, v in expected.items() if p.startswith("_") or set(PLAN_STEPS.get(p, ())) & set(steps)}
    return kplan.compare(expected, got) if expected else [f"no expected plan ({source})"]


def prune(runs: str):
    old = sorted(glob.glob(os.path.join(runs, "*")))[:-KEEP_RUNS]
    for d in old:
        shutil.rmtree(d, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description="pstate's kernel matrix (see the top of this file)")
    ap.add_argument("--kernels", default=os.environ.get("KERNELS", ""),
                    help="kernel ids of kernels.json, space- or comma-separated (default: all)")
    ap.add_argument("--checks", default=os.environ.get("CHECKS", ""),
                    help=f"steps to run: {', '.join(guest_checks.STEPS)} (default: all but "
                         f"{', '.join(guest_checks.OPT_IN)})")
    ap.add_argument("--refresh", action="store_true", help="fetch a kernel again when the archive has a newer one")
    ap.add_argument("--write-expected", action="store_true",
                    help="write expected/<id>.json from each kernel's committed BTF, and stop")
    ap.add_argument("--cache", default=os.environ.get("PSTATE_KERNELS_CACHE", "/var/cache/pstate-kernels"))
    args = ap.parse_args()

    kernels = load_kernels()
    if args.kernels.strip():
        ids = args.kernels.replace(",", " ").split()
        unknown = [i for i in ids if i not in {k["id"] for k in kernels}]
        if unknown:
            sys.exit(f"unknown kernel {', '.join(unknown)}: one of {', '.join(k['id'] for k in kernels)}")
        kernels = [k for k in kernels if k["id"] in ids]
    if args.write_expected:
        write_expected(kernels, args.cache)
        return 0
    if os.geteuid() != 0:
        sys.exit("the kernel matrix runs as root (it boots guests and loads BPF programs)")
    if not os.path.exists(os.path.join(REPO, ".venv", "bin", "pstate")):
        sys.exit("no .venv with pstate: run `make setup` first")
    steps = select_steps(args.checks)
    checks = ["boot"] + [c for s in steps for c in guest_checks.STEPS[s]]
    limit = float(os.environ.get("PSTATE_GUEST_LIMIT", "2700"))
    check_tools()
    os.makedirs(args.cache, mode=0o755, exist_ok=True)
    runs = os.path.join(args.cache, "runs")
    run_dir = os.path.join(runs, time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(run_dir)
    prune(runs)

    results, info, diffs = {}, {}, {}
    for k in kernels:
        kid = k["id"]
        out = os.path.join(run_dir, kid)
        os.makedirs(out)
        try:
            if kid == "host":
                info[kid] = run_host(out, steps, limit)
            else:
                info[kid] = run_guest(k, args.cache, out, steps, limit, args.refresh)
        except (fetch.FetchError, subprocess.CalledProcessError, OSError) as e:
            say(f"{kid}: {e}")
            info[kid] = {"kernel": "?", "accel": "-", "wall": 0, "rc": 1, "error": str(e)}
            results[(kid, "boot")] = {"name": "boot", "ok": False, "seconds": 0, "detail": f"not booted: {e}"}
            diffs[kid] = ["not run"]
            continue
        diffs[kid] = collect(out, checks, kid, info[kid], results, steps)
        if os.path.exists(os.path.join(out, "peers.json")):
            say(f"  {kid}: BCC's tools beside pstate in {out}/peers.json; tests/kernels/peers.py --from-run {out} "
                f"copies it to bench/results/peers_{kid}.json with a summary")

    ids = [k["id"] for k in kernels]
    extra = [
        ("plan", {k: "ok" if not diffs[k] else f"MISMATCH {len(diffs[k])}" for k in ids}),
        ("kernel", {k: info[k]["kernel"] for k in ids}),
        ("accel", {k: info[k]["accel"] for k in ids}),
        ("wall", {k: kplan.fmt_secs(info[k]["wall"]) for k in ids}),
    ]
    text = [kplan.table(ids, checks, results, extra)]
    bad = kplan.failed(ids, checks, results)
    if bad:
        text.append("\nfailed:")
        text += [f"  {k} {c}: {results[(k, c)]['detail']}" for k, c in bad]
    mismatched = [k for k in ids if diffs[k]]
    if mismatched:
        text.append("\nplan differences (expected: tests/kernels/expected/<id>.json):")
        for k in mismatched:
            got = info[k].get("got_plan", {})
            probes = ", ".join(f"{p} probes={v.get('probes')!r}" for p, v in sorted(got.items()) if v) or "no meta record"
            text.append(f"  {k} ({probes}; expected {info[k].get('plan_source', '-')}):")
            text += [f"    {d}" for d in diffs[k]]
    text.append(f"\nlogs: {run_dir}")
    report = "\n".join(text)
    with open(os.path.join(run_dir, "summary.txt"), "w") as f:
        f.write(report + "\n")
    with open(os.path.join(run_dir, "results.json"), "w") as f:
        json.dump({"kernels": info, "results": [dict(v, kernel=k) for (k, _), v in results.items()],
                   "plan_differences": diffs}, f, indent=1)
    say("\n" + report)
    return 1 if bad or mismatched else 0


if __name__ == "__main__":
    sys.exit(main())

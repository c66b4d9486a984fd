"""Another user against root's snap collector in bpffs (issue #35, item 3).

bpffs is mounted mode 1777: any user can make /sys/fs/bpf/pstate before
root's first `pstate snap --start`, and rename what root pins in a
directory that user can write. Each test plays that user (`nobody`, through
setpriv) in a private mount namespace with a fresh bpffs of its own at
/sys/fs/bpf: the host's bpffs, and any collector pinned there, are never
touched, and when the namespace ends its pins go, so a failing test leaves
no collector attached.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import time

import pytest

from conftest import clean_env, pstate_cmd
from pstate.kernel import bpfsys

# collectors are found through the kernel's list of every map; links compared by id: alone
pytestmark = [pytest.mark.bpf, pytest.mark.serial]

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]
BPFFS = "/sys/fs/bpf"
ROOT = f"{BPFFS}/pstate"
LINK_GET_FD_BY_ID = 30

# Every object pinned in the namespace's bpffs, and every manifest of pstate
# there with its pins' ids (and each link's program id): read with calls
# the fixed and the unfixed pstate both have.
TREE = r"""
import json, os, stat, sys
from pstate.kernel import pins
out = {"entries": {}, "manifests": {}}
for d, dirs, files in os.walk(sys.argv[1]):
    for n in dirs + files:
        p = os.path.join(d, n)
        st = os.lstat(p)
        kind = "link" if stat.S_ISLNK(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode) else "pin"
        out["entries"][p] = [kind, st.st_uid, stat.S_IMODE(st.st_mode)]
        if kind != "pin" or n.endswith(".debug"):
            continue
        try:
            fd = pins.get(p)
        except OSError:
            continue
        doc = pins.read_manifest(fd)
        os.close(fd)
        if doc is None:
            continue
        progs = {}
        for name in doc["pins"]:
            if name.startswith("link_"):
                lfd = pins.get(os.path.join(d, name))
                progs[str(pins.link_info(lfd)["id"])] = pins.link_info(lfd)["prog_id"]
                os.close(lfd)
        out["manifests"][d] = {"pins": doc["pins"], "links": progs}
print(json.dumps(out))
"""


class Namespace:
    """A private mount namespace with a bpffs of its own at /sys/fs/bpf
    (mode 1777, as here), held by a shell that waits on its stdin."""

    def __init__(self):
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f"mount -t bpf bpf {BPFFS} && chmod 1777 {BPFFS} && echo ready && read _"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.holder.stdout.readline()
        if line != "ready\n":
            self.holder.kill()
            self.holder.wait()
            pytest.fail(f"no private bpffs: {line!r}")

    def run(self, *argv, user: bool = False, umask: int | None = None, timeout=120) -> subprocess.CompletedProcess:
        cmd = [str(a) for a in argv]
        if umask is not None:
            cmd = ["sh", "-c", f'umask {umask:03o} && exec "$@"', "sh", *cmd]
        if user:
            cmd = NOBODY + cmd
        return subprocess.run(["nsenter", "-t", str(self.holder.pid), "-m", "--", *cmd], capture_output=True,
                              text=True, timeout=timeout, env=clean_env())

    def sh(self, script: str, user: bool = False) -> None:
        r = self.run("sh", "-ec", script, user=user)
        assert r.returncode == 0, (script, r.stderr)

    def pstate(self, *args, **kw) -> subprocess.CompletedProcess:
        return self.run(*pstate_cmd(*map(str, args)), **kw)

    def tree(self) -> dict:
        r = self.run(pstate_cmd()[0], "-c", TREE, BPFFS)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def doctor_row(self) -> dict:
        r = self.pstate("doctor", "--no-live", "--format", "json")
        (row,) = [x for x in json.loads(r.stdout) if x["check"] == "snap collector"]
        return row

    def close(self) -> None:
        self.pstate("snap", "--stop")
        self.holder.stdin.close()
        self.holder.wait(timeout=30)


@pytest.fixture
def ns():
    n = Namespace()
    try:
        yield n
    finally:
        n.close()


def attached(links: dict[str, int]) -> list[int]:
    """The ids of links (link id -> program id) still attached to their
    program: the kernel's own view (BPF_LINK_GET_FD_BY_ID, then fdinfo)."""
    out = []
    for lid, prog in links.items():
        fd = bpfsys.bpf(LINK_GET_FD_BY_ID, bpfsys._attr("<I", int(lid)))
        if fd < 0:
            assert ctypes.get_errno() == 2, os.strerror(ctypes.get_errno())
            continue
        try:
            with open(f"/proc/self/fdinfo/{fd}") as f:
                if f"prog_id:\t{prog}" in f.read().splitlines():
                    out.append(int(lid))
        finally:
            os.close(fd)
    return out


def wait_detached(links: dict[str, int]) -> list[int]:
    deadline = time.monotonic() + 10  # a link is freed after its last reference, maybe deferred
    while (left := attached(links)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def pstate_objects(tree: dict) -> list[str]:
    """Paths of what pstate pinned (no manifest or pin of the test's own)."""
    return sorted(p for p, (kind, _uid, _mode) in tree["entries"].items()
                  if kind == "pin" and not p.endswith(".debug"))


# --- the pin directory must be root's -----------------------------------------

HOSTILE = {
    "made by another user, world-writable": ("mkdir -m777 {root}", True, ("uid 65534", "nobody")),
    "made by another user, mode 0700": ("mkdir -m700 {root}", True, ("uid 65534", "nobody")),
    "root's but world-writable": ("mkdir -m777 {root}", False, ("writable by",)),
    "root's but group-writable": ("mkdir -m770 {root}", False, ("writable by",)),
    "a symbolic link to root's directory": ("mkdir -m700 {root}_real && ln -s {root}_real {root}", False,
                                            ("symbolic link",)),
    "a symbolic link another user made": ("mkdir -m777 /sys/fs/bpf/mine && ln -s /sys/fs/bpf/mine {root}", True,
                                          ("symbolic link",)),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_start_refuses_a_pin_directory_another_user_can_change(ns, case):
    script, as_nobody, said = HOSTILE[case]
    ns.sh(script.format(root=ROOT), user=as_nobody)
    before = ns.tree()
    r = ns.pstate("snap", "--start")
    assert r.returncode == 77, (r.returncode, r.stderr)
    assert ROOT in r.stderr and any(s in r.stderr for s in said), r.stderr
    # the fix is named: remove it as root, or pin elsewhere
    assert f"rm -r {ROOT}" in r.stderr and "--pin-dir" in r.stderr, r.stderr
    assert ns.tree() == before  # nothing loaded, nothing pinned
    row = ns.doctor_row()
    assert row["status"] != "ok" and ROOT in row["detail"] and any(s in row["detail"] for s in said), row
    assert "--pin-dir" in row["fix"] and f"rm -r {ROOT}" in row["fix"], row


def test_pin_dir_pins_elsewhere_0700_whatever_the_umask(ns, tmp_path):
    ns.sh(f"mkdir -m777 {ROOT}", user=True)
    mine = f"{BPFFS}/safe"
    r = ns.pstate("snap", "--start", "--pin-dir", mine, umask=0)
    assert r.returncode == 0, r.stderr
    assert f"pinned in {mine}/snap" in r.stderr, r.stderr
    entries = ns.tree()["entries"]
    assert entries[mine] == ["dir", 0, 0o700] and entries[f"{mine}/snap"] == ["dir", 0, 0o700]
    assert all(uid == 0 and mode & 0o077 == 0 for p, (_k, uid, mode) in entries.items() if p.startswith(mine))
    # found wherever it is pinned: status, a reader and stop need no --pin-dir
    status = ns.pstate("snap", "--status")
    assert status.returncode == 0 and f"pinned in {mine}/snap" in status.stdout, status
    d = tmp_path / "snaps"
    r = ns.pstate("snap", "--dir", d)
    assert r.returncode == 0, r.stderr
    assert len(list(d.glob("pstate-snap-*.jsonl"))) == 1
    links = next(iter(ns.tree()["manifests"].values()))["links"]
    stop = ns.pstate("snap", "--stop")
    assert stop.returncode == 0 and "collector stopped" in stop.stderr, stop.stderr
    assert wait_detached(links) == []
    assert mine not in ns.tree()["entries"]
    assert ns.tree()["entries"][ROOT][:2] == ["dir", 65534]  # another user's directory is left to root to remove


# --- a collector another user moved -----------------------------------------

def moved_collector(ns, decoy: bool = False) -> tuple[str, dict]:
    """A collector started in a pin directory that another user owns (as an
    older pstate did when that user made /sys/fs/bpf/pstate first, or root
    gave it away), then moved by that user: the collector's directory
    renamed, the pin directory buried two levels down in that user's own,
    next to a symbolic link back to the top of bpffs. With decoy, that
    user makes a new /sys/fs/bpf/pstate of its own. Where it is, and its
    manifest."""
    r = ns.pstate("snap", "--start")
    assert r.returncode == 0, r.stderr
    ns.sh(f"chown nobody:nogroup {ROOT} && chmod 0777 {ROOT}")
    ns.sh(f"""mkdir -p {BPFFS}/n1/n2
              mv {ROOT}/snap {ROOT}/hidden
              mv {ROOT} {BPFFS}/n1/n2/p
              ln -s {BPFFS} {BPFFS}/n1/loop
              {f'mkdir -m777 {ROOT}' if decoy else ':'}""", user=True)
    where = f"{BPFFS}/n1/n2/p/hidden"
    tree = ns.tree()
    assert list(tree["manifests"]) == [where]
    return where, tree["manifests"][where]


def test_a_collector_another_user_moved_is_still_seen_and_removed(ns, tmp_path):
    where, manifest = moved_collector(ns)
    assert len(manifest["links"]) >= 5
    status = ns.pstate("snap", "--status")
    assert status.returncode == 0 and "running since" in status.stdout, status
    assert f"pinned in {where}" in status.stdout and "uid 65534" in status.stdout, status.stdout
    assert "search" not in status.stdout + status.stderr  # the link loop was not followed: nothing cut short
    row = ns.doctor_row()
    assert row["status"] == "warning" and where in row["detail"] and "uid 65534 (nobody)" in row["detail"], row
    r = ns.pstate("snap", "--dir", tmp_path / "d")  # a reader finds it too
    assert r.returncode == 0, r.stderr
    (snapshot,) = (tmp_path / "d").glob("pstate-snap-*.jsonl")
    assert '"collector_id"' in snapshot.read_text().split("\n", 1)[0]
    stop = ns.pstate("snap", "--stop")
    assert stop.returncode == 0 and "collector stopped" in stop.stderr, stop.stderr
    assert wait_detached(manifest["links"]) == []
    tree = ns.tree()
    assert tree["manifests"] == {} and pstate_objects(tree) == []
    assert where not in tree["entries"] and f"{BPFFS}/n1/n2/p" in tree["entries"]  # that user's own stays
    again = ns.pstate("snap", "--status")
    assert again.returncode == 1, again


@pytest.mark.parametrize("decoy", [False, True], ids=["pin directory moved away", "a new one of that user's"])
def test_a_second_start_does_not_double_a_moved_collector(ns, decoy):
    where, manifest = moved_collector(ns, decoy)
    r = ns.pstate("snap", "--start")
    assert r.returncode == 77, (r.returncode, r.stderr)
    assert where in r.stderr and "pstate snap --stop" in r.stderr, r.stderr
    assert list(ns.tree()["manifests"]) == [where]  # still the one collector
    # --restart removes it wherever it is, and starts one in a pin directory
    # of root's: there is none while that user's stands in its place
    r = ns.pstate("snap", "--restart")
    assert wait_detached(manifest["links"]) == []
    if decoy:
        assert r.returncode == 77 and "uid 65534 (nobody)" in r.stderr, (r.returncode, r.stderr)
        assert ns.tree()["manifests"] == {}
    else:
        assert r.returncode == 0 and "collector started" in r.stderr, r.stderr
        assert list(ns.tree()["manifests"]) == [f"{ROOT}/snap"]
        assert ns.tree()["entries"][ROOT] == ["dir", 0, 0o700]
    stop = ns.pstate("snap", "--stop")
    assert stop.returncode == 0, stop.stderr
    assert ns.tree()["manifests"] == {}


def test_pins_moved_out_of_the_collectors_directory_are_found_by_their_ids(ns, tmp_path):
    """Pins moved (by root) out of the collector's directory, or renamed in
    it, are still its own: found by the ids the manifest lists, read, and
    removed by --stop."""
    assert ns.pstate("snap", "--start").returncode == 0
    manifest = ns.tree()["manifests"][f"{ROOT}/snap"]
    link = sorted(n for n in manifest["pins"] if n.startswith("link_"))[0]
    ns.sh(f"""mkdir -m700 {BPFFS}/elsewhere
              mv {ROOT}/snap/{link} {BPFFS}/elsewhere/renamed
              mv {ROOT}/snap/map_gone {ROOT}/snap/gone_renamed""")
    status = ns.pstate("snap", "--status")
    assert status.returncode == 0 and "running since" in status.stdout, status
    r = ns.pstate("snap", "--dir", tmp_path / "d")
    assert r.returncode == 0, r.stderr
    stop = ns.pstate("snap", "--stop")
    assert stop.returncode == 0 and "collector stopped" in stop.stderr, stop.stderr
    assert wait_detached(manifest["links"]) == []
    tree = ns.tree()
    assert tree["manifests"] == {} and pstate_objects(tree) == [], tree


def test_a_collector_buried_beyond_the_search_is_not_reported_as_none(ns):
    """The search of bpffs is bounded: a collector beyond its depth is not
    found, and --status and --stop say the search was cut short rather
    than that none runs."""
    where, manifest = moved_collector(ns)
    deep = "/".join(["d"] * 40)
    ns.sh(f"mkdir -p {BPFFS}/n1/{deep} && mv {BPFFS}/n1/n2 {BPFFS}/n1/{deep}/n2", user=True)
    status = ns.pstate("snap", "--status")
    assert status.returncode == 1, status
    assert "no collector is running" not in status.stderr and "search" in status.stderr, status.stderr
    stop = ns.pstate("snap", "--stop")
    assert stop.returncode != 0 and "search" in stop.stderr, stop.stderr
    assert len(attached(manifest["links"])) == len(manifest["links"])  # nothing it could not prove was touched
    ns.sh(f"mv {BPFFS}/n1/{deep}/n2 {BPFFS}/n1/n2")  # within reach again
    stop = ns.pstate("snap", "--stop")
    assert "collector stopped" in stop.stderr, stop.stderr
    assert stop.returncode == 1 and "search" in stop.stderr  # what is beyond the bound still is not seen
    assert wait_detached(manifest["links"]) == []
    ns.sh(f"rm -r {BPFFS}/n1/d")
    stop = ns.pstate("snap", "--stop")
    assert stop.returncode == 0 and "no collector was running" in stop.stderr, stop.stderr


FORGE = r"""
import os, sys
from pstate.kernel import bpfsys, pins
victim = bpfsys.map_create(bpfsys.MAP_ARRAY, 4, 8, 1, 0, "victim")
os.mkdir("/sys/fs/bpf/victim", 0o700)
pins.pin(victim, "/sys/fs/bpf/victim/map_tasks")
meta = pins.create_manifest()
pins.write_manifest(meta, {"layout": "x", "pins": {"map_tasks": pins.map_id(victim), "meta": pins.map_id(meta)}})
os.mkdir("/sys/fs/bpf/forged", 0o777)
pins.pin(meta, "/sys/fs/bpf/forged/meta")
os.mkdir("/sys/fs/bpf/forged/snap_new_1", 0o777)
"""


def test_a_manifest_another_user_pinned_proves_nothing(ns):
    """A manifest pinned by another user (were unprivileged BPF allowed)
    lists objects pstate did not make: --stop removes none of them."""
    r = ns.run(pstate_cmd()[0], "-c", FORGE)
    assert r.returncode == 0, r.stderr
    ns.sh(f"chown -h nobody:nogroup {BPFFS}/forged/meta {BPFFS}/forged")
    stop = ns.pstate("snap", "--stop")
    assert stop.returncode == 0, stop.stderr
    assert f"{BPFFS}/victim/map_tasks" in ns.tree()["entries"]
    status = ns.pstate("snap", "--status")
    assert status.returncode == 1, status

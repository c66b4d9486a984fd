"""Process and cgroup records: the v2 mount, ids and paths, titles, and
when Identities writes a record (first sight, the second look, an exec,
gone before it was read)."""

from __future__ import annotations

import os

from pstate.kernel import identity
from pstate.kernel.identity import CgroupPaths, Identities, title_of, v2_mount


def test_the_v2_mount_is_found_in_mountinfo(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text("30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
                    "41 31 0:38 / /sys/fs/cgroup/un\\040ified rw,relatime - cgroup2 cgroup2 rw\n")
    assert v2_mount(str(info)) == "/sys/fs/cgroup/un ified"
    info.write_text("30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n")
    assert v2_mount(str(info)) is None


def test_ids_and_paths_both_ways(tmp_path):
    (tmp_path / "test.slice" / "pstate-test.service").mkdir(parents=True)
    cg = CgroupPaths(str(tmp_path))
    svc = cg.id_of("/test.slice/pstate-test.service")
    assert svc == os.stat(tmp_path / "test.slice" / "pstate-test.service").st_ino
    fresh = CgroupPaths(str(tmp_path))  # knows nothing yet: walks the mount
    assert fresh.path_of(svc) == "/test.slice/pstate-test.service"
    assert fresh.path_of(cg.id_of("/")) == "/"
    assert fresh.path_of(1 << 60) is None
    assert cg.id_of("/nope") is None
    assert sorted(cg.below("/test.slice")) == sorted([cg.id_of("/test.slice"), svc])


def test_titles_as_ps_shows_them():
    assert title_of(b"sleep\x000.1\x00") == "sleep 0.1"
    assert title_of(b"postgres: checkpointer   \x00\x00\x00") == "postgres: checkpointer"
    assert title_of(b"") == ""


def test_this_process_reads_as_itself():
    me = identity.read_process(os.getpid())
    assert me["ppid"] == os.getppid() and me["exe"] == os.readlink("/proc/self/exe")
    assert me["title"] and me["comm"]
    assert identity.read_process(1 << 30) is None


class FakeProcs:
    def __init__(self):
        self.procs = {}

    def __call__(self, pid):
        p = self.procs.get(pid)
        return None if p is None else dict(p)


def _procs(tmp_path):
    (tmp_path / "a.service").mkdir(exist_ok=True)
    procs = FakeProcs()
    procs.procs[10] = {"comm": "postgres", "title": "postgres", "exe": "/usr/bin/postgres", "ppid": 1,
                       "cgroup_path": "/a.service", "ns_pid": None}
    return procs, Identities(CgroupPaths(str(tmp_path)), read=procs, recheck_ns=100)


def test_first_sight_writes_cgroup_then_process(tmp_path):
    procs, ids = _procs(tmp_path)
    ids.seen(10, 11, "worker")  # a thread first: the record still names the process
    ids.seen(10, 10, "postgres")
    ids.seen(10, 12, "worker")
    out = ids.take(now=1000)
    cgid = os.stat(tmp_path / "a.service").st_ino
    assert out == [
        {"type": "cgroup", "ts": 1000, "cgroup": cgid, "path": "/a.service", "gone": False},
        {"type": "process", "ts": 1000, "pid": 10, "comm": "postgres", "title": "postgres",
         "exe": "/usr/bin/postgres", "ppid": 1, "cgroup": cgid, "gone": False, "why": "first"}]
    assert ids.take(now=1050) == []  # the second look is not due yet


def test_the_second_look_writes_only_a_change(tmp_path):
    procs, ids = _procs(tmp_path)
    ids.seen(10, 10, "postgres")
    ids.take(now=1000)
    procs.procs[10]["title"] = "postgres: checkpointer"
    out = ids.take(now=1100)
    assert [(r["title"], r["why"]) for r in out] == [("postgres: checkpointer", "recheck")]
    assert ids.take(now=5000) == []  # once only
    procs2, ids2 = _procs(tmp_path)
    ids2.seen(10, 10, "postgres")
    ids2.take(now=1000)
    assert ids2.take(now=1100) == []  # nothing changed: no record


def test_an_exec_is_looked_at_at_once(tmp_path):
    procs, ids = _procs(tmp_path)
    ids.seen(10, 10, "sh")
    ids.take(now=1000)
    procs.procs[10].update(comm="sleep", title="sleep 1", exe="/bin/sleep")
    ids.seen(10, 10, "sleep")
    out = ids.take(now=1001)
    assert [(r["comm"], r["title"], r["why"]) for r in out] == [("sleep", "sleep 1", "exec")]


def test_gone_before_it_was_read_is_said_and_nothing_guessed(tmp_path):
    procs, ids = _procs(tmp_path)
    ids.seen(77, 77, "short")
    assert ids.take(now=5) == [{"type": "process", "ts": 5, "pid": 77, "comm": "short", "title": None,
                                "exe": None, "ppid": None, "cgroup": None, "gone": True, "why": "first"}]
    assert ids.take(now=500) == []  # gone stays gone


def test_a_namespace_pid_is_kept(tmp_path):
    procs, ids = _procs(tmp_path)
    procs.procs[10]["ns_pid"] = 1
    ids.seen(10, 10, "postgres")
    assert ids.take(now=1)[-1]["ns_pid"] == 1


def test_a_new_file_starts_over(tmp_path):
    procs, ids = _procs(tmp_path)
    ids.seen(10, 10, "postgres")
    ids.take(now=1)
    ids.forget()
    assert [r["type"] for r in ids.take(now=2)] == ["cgroup", "process"]


def test_a_cgroup_a_state_record_names_is_written_once_and_again_in_a_new_file(tmp_path):
    """A thread moved to another cgroup than its process record's: the id its
    state records carry gets its cgroup record too, once (the process's own
    cgroup, met both ways, once as well); a cgroup gone before the look is
    said to be gone; a new file (SIGHUP) names them all again."""
    procs, ids = _procs(tmp_path)
    (tmp_path / "a.service" / "w").mkdir()
    a, w = (os.stat(tmp_path / p).st_ino for p in ("a.service", "a.service/w"))
    ids.seen(10, 10, "postgres")
    ids.cgroup_met(w)
    ids.cgroup_met(a)
    ids.cgroup_met(w)
    ids.cgroup_met(987654321)  # no cgroup has it
    out = ids.take(now=1)
    assert [(r["type"], r.get("cgroup"), r.get("path")) for r in out] == [
        ("cgroup", w, "/a.service/w"), ("cgroup", a, "/a.service"), ("cgroup", 987654321, None), ("process", a, None)]
    assert out[2]["gone"] is True
    ids.cgroup_met(w)
    assert ids.take(now=2) == []
    ids.forget()
    assert sorted(r["cgroup"] for r in ids.take(now=3) if r["type"] == "cgroup") == sorted([a, w, 987654321])

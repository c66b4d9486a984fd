"""--by unit and container from cgroup paths, --by title/ppid from process
records, and --cgroup/--title as user-space filters of the one reader."""

from __future__ import annotations

import pytest

from pstate.analysis.services import Directory
from pstate.kernel.identity import container_of, unit_of
from pstate.stream.filters import Filter
from pstate.stream.reader import read_records

DOCKER = "0123456789ab" + "cdef" * 13


@pytest.mark.parametrize("path, unit", [
    ("/system.slice/nginx.service", "nginx.service"),
    ("/system.slice/nginx.service/worker", "nginx.service"),
    ("/user.slice/user-1000.slice/session-3.scope", "session-3.scope"),
    ("/user.slice", "user.slice"),
    ("/", "-"),
    (None, "?"),
])
def test_units(path, unit):
    assert unit_of(path) == unit


@pytest.mark.parametrize("path, container", [
    (f"/system.slice/docker-{DOCKER}.scope", DOCKER[:12]),
    (f"/docker/{DOCKER}", DOCKER[:12]),
    (f"/system.slice/containerd.service/cri-containerd-{DOCKER}.scope", DOCKER[:12]),
    (f"/machine.slice/libpod-{DOCKER}.scope/container", DOCKER[:12]),
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234abcd_5678_9abc.slice/"
     f"cri-containerd-{DOCKER}.scope", f"pod1234abcd-5678-9abc/{DOCKER[:12]}"),
    (f"/kubepods/besteffort/pod1234abcd-5678-9abc/{DOCKER}", f"pod1234abcd-5678-9abc/{DOCKER[:12]}"),
    ("/system.slice/nginx.service", "host"),
    (None, "?"),
])
def test_containers(path, container):
    assert container_of(path) == container


def test_keys_follow_the_records_as_they_come():
    d = Directory()
    assert d.key("title", 10) == "?"
    d.note({"type": "cgroup", "cgroup": 5, "path": "/a.slice/b.service"})
    d.note({"type": "process", "pid": 10, "comm": "pg", "title": "pg: main", "ppid": 1, "cgroup": 5})
    assert [d.key(b, 10) for b in ("title", "ppid", "cgroup", "unit", "container")] == \
        ["pg: main", 1, "/a.slice/b.service", "b.service", "host"]
    d.note({"type": "process", "pid": 10, "comm": "pg", "title": "pg: walwriter", "ppid": 1, "cgroup": 5})
    assert d.key("title", 10) == "pg: walwriter"
    d.note({"type": "process", "pid": 11, "comm": "kworker/0:1", "title": None, "ppid": 2, "cgroup": 5})
    assert d.key("title", 11) == "[kworker/0:1]"
    d.note({"type": "process", "pid": 12, "comm": "x", "gone": True})
    assert d.key("unit", 12) == "(gone)"


def _stream(tmp_path):
    lines = [
        '{"type":"meta","schema":1,"source":"record","ts":0}',
        '{"type":"cgroup","ts":1,"cgroup":5,"path":"/a.slice/web.service","gone":false}',
        '{"type":"cgroup","ts":1,"cgroup":6,"path":"/a.slice/webby.service","gone":false}',
        '{"type":"process","ts":1,"pid":10,"comm":"pg","title":"pg: walwriter","ppid":1,"cgroup":5,"gone":false,"why":"first"}',
        '{"type":"process","ts":1,"pid":20,"comm":"pg","title":"pg: backend","ppid":1,"cgroup":6,"gone":false,"why":"first"}',
    ]
    for pid in (10, 20, 30):
        lines.append('{"type":"state","ts":5,"cpu":0,"pid":%d,"tid":%d,"comm":"pg","from":"sleeping",'
                     '"to":"runnable","dur_ns":1}' % (pid, pid))
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("filt, pids", [
    (Filter(cgroups=("/a.slice/web.service",)), {10}),  # not webby.service: a path, not a prefix of text
    (Filter(cgroups=("/a.slice",)), {10, 20}),
    (Filter(cgroups=("a.slice/",)), {10, 20}),
    (Filter(titles=("pg: *writer",)), {10}),
    (Filter(titles=("pg: *",), pids=(20, 30)), {20}),  # pid 30 has no process record: it does not pass
])
def test_cgroup_and_title_filters_read_the_process_records(tmp_path, filt, pids):
    got = list(read_records([_stream(tmp_path)], filt=filt))
    assert {r["pid"] for r in got if r["type"] == "state"} == pids
    assert sum(r["type"] == "process" for r in got) == 2  # annotations all pass
    assert got[0]["read_filter_cgroup" if filt.cgroups else "read_filter_title"]


@pytest.mark.parametrize("title,role", [
    ("postgres: 15/main: app shop 10.0.0.7(40112) idle", "postgres: 15/main: app shop"),
    ("postgres: 15/main: app shop 10.0.0.9(40118) idle in transaction", "postgres: 15/main: app shop"),
    ("postgres: 15/main: app shop [local] UPDATE waiting", "postgres: 15/main: app shop"),
    ("postgres: 15/main: walsender repl 2001:db8::7(5432) streaming 0/3000148", "postgres: 15/main: walsender repl"),
    ("postgres: 15/main: checkpointer", "postgres: 15/main: checkpointer"),
    ("nginx: worker process", "nginx: worker process"),
    ("java -Xmx4g -jar /opt/orders/app.jar --port 8080", "java -Xmx4g -jar /opt/orders/app.jar --port N"),
    ("gunicorn: worker [app] 3", "gunicorn: worker [app] N"),
    ("python3.11 serve.py", "python3.11 serve.py"),
])
def test_a_title_s_role_is_it_without_its_volatile_part(title, role):
    from pstate.kernel.identity import role_of

    assert role_of(title) == role


def test_a_pattern_names_the_role():
    import re

    from pstate.kernel.identity import role_of

    pg = re.compile(r"^postgres: \S+ (\S+)")
    assert role_of("postgres: 15/main: checkpointer", pg) == "checkpointer"
    assert role_of("nginx: worker process", re.compile(r"^nginx: (\w+)")) == "worker"
    assert role_of("java -Dservice.name=orders -jar a.jar", re.compile(r"-Dservice\.name=(\S+)")) == "orders"
    assert role_of("java -jar a.jar", re.compile(r"-jar \S+")) == "-jar a.jar"  # no group: the match
    assert role_of("sleep 5", pg) == "sleep N"  # no match: the default

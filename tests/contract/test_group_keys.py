"""The groups --by cgroup, unit, container, title, title:REGEX and ppid name
have one definition (kernel.identity.group_key): a stream's process and
cgroup records and a snapshot's rows give the same key for the same
process, and stats and heat draw the same groups, from recordings and from
snapshot directories alike."""

from __future__ import annotations

import itertools
import re

import orjson
import pytest
from click.testing import CliRunner

import test_stats
from pstate.analysis import services
from pstate.kernel import identity
from pstate.main import cli
from pstate.render import heatmodel as hm
from pstate.snapshots import snapdir
from pstate.stream.reader import read_records

ROLE = re.compile(r"^postgres: \S+ (\S+)")
TITLES = ("postgres: 15/main: app shop 10.0.0.1(5432) idle", "postgres: 15/main: checkpointer", "nginx: worker 3",
          "", None)
COMMS = ("postgres", "kworker/0:1")
PATHS = ("/system.slice/db.service", "/kubepods.slice/kubepods-pod1234abcd_ef.slice/cri-containerd-"
         + "a" * 64 + ".scope", "/", None)
PPIDS = (1, None)
IDENTITIES = list(itertools.product(TITLES, COMMS, PATHS, PPIDS))
KEYS = [(by, role) for by in identity.GROUP_KEYS for role in ((None, ROLE) if by == "title" else (None,))]


@pytest.mark.parametrize("by,role", KEYS, ids=[f"{b}{'-role' if r else ''}" for b, r in KEYS])
def test_a_process_record_and_a_snapshot_row_give_one_key(by, role):
    for n, (title, comm, path, ppid) in enumerate(IDENTITIES):
        d = services.Directory(role)
        rec = {"type": "process", "pid": 100 + n, "comm": comm, "gone": False}
        if title is not None:
            rec["title"] = title
        if ppid is not None:
            rec["ppid"] = ppid
        if path is not None:
            d.note({"type": "cgroup", "cgroup": 7, "path": path})
            rec["cgroup"] = 7
        d.note(rec)
        row = {"title": title, "comm": comm, "cgroup_path": path, "ppid": ppid}
        assert d.key(by, 100 + n) == snapdir.service_key(by, row, role), (by, title, comm, path, ppid)


def test_a_role_pattern_names_its_group_and_leaves_the_rest_to_the_default():
    key = identity.group_key
    assert key("title", title=TITLES[0], role=ROLE) == "app"
    assert key("title", title=TITLES[0]) == "postgres: 15/main: app shop"
    assert key("title", title="nginx: worker 3", role=ROLE) == "nginx: worker N"
    assert key("title", title="", comm="kworker/0:1", role=ROLE) == "[kworker/0:1]"


def test_group_keys_look_a_pid_up_anew_once_its_records_change():
    keys = services.GroupKeys("unit")
    keys.note({"type": "cgroup", "cgroup": 7, "path": "/system.slice/a.service"})
    keys.note({"type": "process", "pid": 5, "cgroup": 7})
    assert keys.group(5) == "a.service" and keys.group(5, 7) == "a.service"
    keys.note({"type": "cgroup", "cgroup": 7, "path": "/system.slice/b.service"})  # every key may change
    assert keys.group(5) == "b.service" and keys.group(5, 7) == "b.service"
    keys.note({"type": "cgroup", "cgroup": 8, "path": "/system.slice/c.service"})
    keys.note({"type": "process", "pid": 5, "cgroup": 8})  # that pid's key changes
    assert keys.group(5) == "c.service" and keys.group(5, 7) == "b.service"


# --- stats and heat draw the same groups ------------------------------------------------------

RECORDING = test_stats.DATA / "why-services.jsonl"
SNAPSHOTS = test_stats.DATA.parent / "snap" / "series"
HEAT_KEYS = ["comm", *identity.GROUP_KEYS, r"title:^postgres: \S+ (\S+)"]


@pytest.mark.parametrize("by", HEAT_KEYS)
def test_heat_rows_of_a_recording_are_the_groups_stats_reports(by):
    r = CliRunner().invoke(cli, ["stats", "-f", "json", "--top", "100", "--by", by, str(RECORDING)])
    assert r.exit_code == 0, r.output
    groups = {str(g["key"]) for g in orjson.loads(r.stdout)["groups"]}
    tracker = hm.RecordedStates(by)
    for rec in read_records([str(RECORDING)]):
        tracker.feed(rec)
    tracker.close()
    assert {str(k) for k in tracker.totals} == groups
    r = CliRunner().invoke(cli, ["heat", "--by", by, "--no-color", "--width", "100", str(RECORDING)])
    assert r.exit_code == 0, r.output
    assert f"{len(groups)} of {len(groups)} " in r.stdout


# The fixture's titles: "hog: worker", "job: worker", "job2: worker", ...;
# the pattern takes the name less its number: job and job2 are one role.
SNAP_ROLE = r"title:^(\w+?)\d*:"


def test_a_title_pattern_groups_snapshots_in_stats_and_heat_alike():
    r = CliRunner().invoke(cli, ["stats", "-f", "json", "--by", SNAP_ROLE, str(SNAPSHOTS)])
    assert r.exit_code == 0, r.output
    roles = [t["comm"] for t in orjson.loads(r.stdout)["trends"]]
    assert sorted(roles) == ["dbwriter", "hog", "job", "leaky", "sh", "steady"]
    r = CliRunner().invoke(cli, ["heat", "--by", SNAP_ROLE, "--no-color", "--width", "80", str(SNAPSHOTS)])
    assert r.exit_code == 0, r.output
    drawn = [line.split()[0] for line in r.stdout.splitlines()[2:2 + len(roles)]]
    assert sorted(drawn) == sorted(roles)
    assert f"{len(roles)} of {len(roles)} titles" in r.stdout


def test_a_title_pattern_that_does_not_compile_is_a_usage_error():
    for cmd in ("stats", "heat"):
        r = CliRunner().invoke(cli, [cmd, "--by", "title:(", str(SNAPSHOTS)])
        assert r.exit_code == 2 and "is not a regular expression" in r.stderr, (cmd, r.output)

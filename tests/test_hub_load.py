"""The class hub under a small load: two attendees in slices of their own run chapter 1's cells and exercise 3's check.

:mod:`packlab.course.hub.loadtest` starts a real hub (configurable-http-proxy from
``make hub-proxy``, bubblewrap where it exists), and two simulated attendees log in through
the hub's REST API at once, start their servers on one core each and run, through the kernel
API, chapter 1's cells up to its first verdict and exercise 3's check. Asserted: no error,
the two servers' affinities disjoint (and what each kernel saw is its own slice), every
check record on the board, each server's memory measured, nothing left running. As root,
each server also runs in cgroups of its own (a memory and a process limit), which the
kernels' probe must show.

Timings are recorded, never asserted: other work on the machine changes them. The
cgroup helpers are tested without a hub first. Like the browser test of the hub, it runs in
``make test``'s phase after the notebooks (``needs_book``), where nothing else is timed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packlab.course.hub import config, loadtest, slices

#: Seconds the whole run may take: a bound against a hang, not a speed test (185 s measured on this 2-core machine
#: under a load average of 12 from other work, data generation and the release included).
WALL_BUDGET = 300


def _root_with_cgroups() -> bool:
    try:
        slices.own_cgroup("memory"), slices.own_cgroup("pids")
    except (slices.CgroupUnavailable, OSError):
        return False
    return os.geteuid() == 0


def test_sizes_are_read_as_sbatch_writes_them():
    assert slices.parse_size("6G") == 6 * 1024**3 and slices.parse_size("512M") == 512 * 1024**2
    assert slices.parse_size("1.5g") == int(1.5 * 1024**3) and slices.parse_size("4096") == 4096
    assert slices.parse_size("2GiB") == 2 * 1024**3
    with pytest.raises(ValueError, match="not a size"):
        slices.parse_size("lots")


def test_the_hubs_cgroup_is_found_from_proc_self_cgroup(tmp_path):
    (tmp_path / "memory" / "hub" / "box").mkdir(parents=True)
    (tmp_path / "memory" / "hub" / "box" / "cgroup.procs").write_text("")
    proc = tmp_path / "cgroup"
    proc.write_text("8:pids:/\n4:memory:/hub/box\n0::/\n")
    assert slices.own_cgroup("memory", root=tmp_path, proc_cgroup=proc) == tmp_path / "memory" / "hub" / "box"
    with pytest.raises(slices.CgroupUnavailable, match="'pids'"):
        slices.own_cgroup("pids", root=tmp_path, proc_cgroup=proc)


@pytest.mark.skipif(not _root_with_cgroups(), reason="the servers' cgroups need root and cgroup v1 hierarchies")
def test_a_servers_cgroups_hold_a_fork_bomb_and_a_hog_and_go_when_it_stops():
    box = slices.ServerCgroups.create("probe", 128 * 1024**2, 40, hub=f"packlab-test-{os.getpid()}")
    try:
        forks = subprocess.run(box.enter_command([sys.executable, "-c", (
            "import os, time\nmade = 0\n"
            "try:\n    for _ in range(100):\n        if os.fork() == 0:\n            time.sleep(1); os._exit(0)\n"
            "        made += 1\nexcept OSError:\n    pass\nprint(made)")]), capture_output=True, text=True, timeout=60)
        assert 0 < int(forks.stdout) < 40, "the pids limit must stop the forks before 40 tasks"
        hog = subprocess.run(box.enter_command([sys.executable, "-c", "b = bytearray(400 * 2**20)"]), timeout=60)
        assert hog.returncode == -9, "the memory cgroup's OOM killer ends the process that passed the limit"
        assert box.peak_memory() <= 128 * 1024**2
        kernel = subprocess.run([sys.executable, "-c", slices.KERNEL_OOM_STARTUP + (
            "import subprocess\nsubprocess.run(['cat', '/proc/self/oom_score_adj'])")], capture_output=True, text=True,
            timeout=60)
        assert kernel.stdout.split() == [str(slices.KERNEL_OOM_SCORE_ADJ)], "what a kernel starts inherits its score"
        orphan = subprocess.Popen(box.enter_command(["sleep", "120"]))  # what a stopped server may leave behind
        deadline = time.monotonic() + 30
        while orphan.pid not in box.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert orphan.pid in box.processes()
    finally:
        box.remove()
    assert orphan.wait(timeout=30) == -9, "remove() kills what is left inside"
    assert not any(folder.exists() for folder in box.folders.values()), "and removes the folders"


def test_the_noisy_cells_end_by_their_deadline_and_say_what_they_did():
    bomb = subprocess.run([sys.executable, "-c", loadtest.fork_bomb(2, children=8)], capture_output=True, text=True,
                          timeout=60)
    summary = eval(bomb.stdout.split("NOISE", 1)[1])  # noqa: S307 - the dict the cell printed, from this test
    assert bomb.returncode == 0 and summary["forks"] >= 8 and summary["most_alive"] <= 8, bomb.stdout + bomb.stderr
    hog = subprocess.run([sys.executable, "-c", loadtest.memory_hog(8, 64 * 2**20)], capture_output=True, text=True,
                         timeout=60)
    summary = eval(hog.stdout.split("NOISE", 1)[1])  # noqa: S307
    assert summary["runs"] >= 1 and summary["finished"] == summary["runs"], hog.stdout + hog.stderr


def test_p95_is_the_nearest_rank_and_slices_overlap_is_found():
    assert loadtest._percentile([3.0, 1.0, 2.0, 9.0, 4.0, 5.0], 0.95) == 9.0
    assert loadtest._percentile(list(map(float, range(1, 21))), 0.95) == 19.0 and loadtest._percentile([], 0.95) is None
    assert loadtest.disjoint([loadtest.Attendee("a", cores=[0]), loadtest.Attendee("b", cores=[1])])
    assert not loadtest.disjoint([loadtest.Attendee("a", cores=[0, 1]), loadtest.Attendee("b", cores=[1, 2])])


@pytest.mark.needs_book
def test_two_attendees_in_their_slices_run_chapter_1_and_exercise_3_onto_the_board(tmp_path):
    if not config.PROXY.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"configurable-http-proxy is not installed at {config.PROXY} (under CI=true this test must run)")
        pytest.skip(f"configurable-http-proxy is not installed at {config.PROXY}: `make hub-proxy`")
    limits = _root_with_cgroups()
    report = loadtest.run(2, tmp_path / "out", cores_per_attendee=1, memory="4G" if limits else None,
                          pids=loadtest.DEFAULT_PIDS if limits else None, log=lambda line: None)
    print((tmp_path / "out" / "report.md").read_text())
    assert not report.get("failure"), report.get("failure_traceback")
    people = report["people"]
    assert [p["errors"] for p in people] == [[], []], [p["errors"] for p in people]
    assert report["run"]["affinities_disjoint"] and all(p["cores"] and len(p["cores"]) == 1 for p in people)
    for p in people:
        assert p["affinity"] == ",".join(map(str, p["cores"])), "the server's process runs on its slice only"
        assert p["probe"].startswith(f"PROBE {p['cores']} 1 "), "the kernel sees its slice and PACKLAB_CORES=1"
        assert p["on_board"] and set(p["board_status"].values()) == {"passed"}, p["board_status"]
        assert p["peak_pss_bytes"] > 0 and p["usage"]["run"]["cpu_seconds"] > 0, "memory and CPU measured"
        assert any("times;" in line for line in p["verdicts"]["run"]), "chapter 1's first verdict was printed"
        if limits:
            # The sandbox's cgroup namespace shows the kernel its own cgroup as "/"; the host sees where it is.
            assert sorted(line.rsplit("/", 1)[-1] for line in p["host_cgroups"]) == [p["name"]] * 2, p["host_cgroups"]
            assert 0 < p["peak_cgroup_bytes"] <= 4 * 1024**3
    assert report["left_running"] == []
    assert report["wall_seconds"] < WALL_BUDGET, json.dumps(report["run"], indent=1)


@pytest.mark.skipif(not _root_with_cgroups(), reason="the servers' cgroups need root and cgroup v1 hierarchies")
def test_the_spawner_starts_a_limited_server_inside_its_cgroups_and_removes_them_when_it_stops(tmp_path):
    from types import SimpleNamespace

    from packlab.course.hub import server

    user = SimpleNamespace(name="ana", url="/user/ana/", server=None, escaped_name="ana")
    spawner = server.CourseSpawner(user=user, hub_folder=str(tmp_path), release_repository=str(tmp_path / "release"),
                                   sandboxed=False, memory_limit="256M", pids_limit=64)
    spawner.core_slice = slices.Slice(0, (sorted(os.sched_getaffinity(0))[0],))
    spawner.limit()
    memory, pids = spawner.cgroups.folders["memory"], spawner.cgroups.folders["pids"]
    assert (memory / "memory.limit_in_bytes").read_text().strip() == str(256 * 2**20)
    assert (pids / "pids.max").read_text().strip() == "64"
    command = spawner.command()
    assert command[:2] == ["/bin/sh", "-c"] and Path(command[4]).name == "taskset", "the cgroups first, then the slice"
    assert spawner.get_state()["cgroups"] == {"memory": str(memory), "pids": str(pids)}
    spawner._release()  # what stop() and clear_state() call
    assert spawner.cgroups is None and not memory.exists() and not pids.exists()

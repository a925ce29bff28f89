"""``make doctor``: one ✓ or ✗ per need, and every ✗ says what to do.

The checks are functions of a :class:`~packlab.course.doctor.Facts` record, so each
failure is faked here by changing one fact of a machine that passes everything; the
last tests run the real thing on this machine.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from packlab import paths
from packlab.course import doctor, footprint

PINS = {"torch": "2.13.0", "torchvision": "0.28.0", "jupyterlab": "4.6.6", "jupytext": "1.19.6", "jupyterlab-myst": "2.7.0",
        "ipykernel": "7.4.0"}


def good() -> doctor.Facts:
    """A machine that passes every check."""
    return doctor.Facts(
        python=(3, 11, 7), platform="linux", machine="x86_64", cores=4, memory_bytes=16 * 2**30,
        data_root=Path("/data"), free_disk_bytes=100 * 10**9, disk_needed_bytes=8 * 10**9, shm_bytes=8 * 2**30,
        start_methods=("fork", "spawn", "forkserver"), packages=dict(PINS), pins=dict(PINS),
        lab_extensions={name: True for name in doctor.LAB_EXTENSIONS}, executable=sys.executable,
        kernel_python=sys.executable, data_count=10_000, data_problems=(), expected_count=10_000,
    )


def result(facts: doctor.Facts, name: str) -> doctor.Result:
    (found,) = [r for r in doctor.run_checks(facts) if r.name == name]
    return found


def test_a_good_machine_passes_every_check():
    results = doctor.run_checks(good())
    assert all(r.ok for r in results), doctor.report(results)
    assert [r.name for r in results] == ["Python", "environment", "notebook kernel", "cores", "memory", "free disk",
                                         "/dev/shm", "start methods", "JupyterLab", "data"]
    assert doctor.report(results).endswith("READY: every check passed.")


FAILURES = {
    "old python": ("Python", dict(python=(3, 9, 18)), "3.10 or newer"),
    "old python on macOS": ("Python", dict(python=(3, 9, 6), platform="darwin"), "UV_PYTHON_DOWNLOADS=automatic"),
    "no torch": ("environment", dict(packages={**PINS, "torch": None}), "make setup"),
    "intel mac": ("environment", dict(packages={**PINS, "torch": None}, platform="darwin", machine="x86_64"), "Intel Macs"),
    "wrong torchvision": ("environment", dict(packages={**PINS, "torchvision": "0.27.1"}), "make distclean setup"),
    "foreign kernel": ("notebook kernel", dict(kernel_python="/usr/bin/python3.8"), "kernelspec"),
    "no kernel": ("notebook kernel", dict(kernel_python=None), "ipykernel"),
    "one core": ("cores", dict(cores=1), "at least 2 cores"),
    "little memory": ("memory", dict(memory_bytes=3 * 2**30), "more memory"),
    "little memory under WSL": ("memory", dict(memory_bytes=3 * 2**30, wsl=True), ".wslconfig"),
    "little disk": ("free disk", dict(free_disk_bytes=5 * 10**9), "PACKLAB_COUNT=2000"),
    "small shm": ("/dev/shm", dict(shm_bytes=64 * 2**20), "medium: Memory"),
    "no shm on linux": ("/dev/shm", dict(shm_bytes=None), "--shm-size"),
    "no fork": ("start methods", dict(start_methods=("spawn",), platform="win32"), "WSL2"),
    "no jupytext": ("JupyterLab", dict(packages={**PINS, "jupytext": None}), "make setup"),
    "no myst extension": ("JupyterLab", dict(lab_extensions={"jupyterlab-jupytext": True, "jupyterlab-myst": False}), "jupyterlab-myst"),
    "no data": ("data", dict(data_count=None), "make data"),
    "altered data": ("data", dict(data_problems=("altered (sha256 differs): /data/images/000007.jpg",)), "--force"),
    "unverifiable data": ("data", dict(data_count=None, data_unverified=True), "make setup"),
    "other size": ("data", dict(data_count=2000), "PACKLAB_COUNT"),
    "bad count setting": ("data", dict(count_setting="PACKLAB_COUNT='lots' is not a whole number of images"), "unset PACKLAB_COUNT"),
}


@pytest.mark.parametrize("case", FAILURES)
def test_each_failure_is_a_cross_that_says_what_to_do(case):
    name, changes, advice = FAILURES[case]
    results = doctor.run_checks(dataclasses.replace(good(), **changes))
    failed = [r for r in results if not r.ok]
    assert [r.name for r in failed] == [name], doctor.report(results)
    assert advice in failed[0].todo, failed[0].todo
    text = doctor.report(results)
    assert f"✗ {name}:" in text and "NOT READY: 1 check(s) failed" in text and f"-> " in text


def test_every_check_can_fail():
    """Each check of the report has at least one faked failure above."""
    assert {name for name, _, _ in FAILURES.values()} == {check(good()).name for check in doctor.CHECKS}


def test_what_cannot_be_measured_is_not_a_failure():
    facts = dataclasses.replace(good(), memory_bytes=None, free_disk_bytes=None, shm_bytes=None, platform="darwin",
                                start_methods=("spawn", "fork", "forkserver"))
    results = doctor.run_checks(facts)
    assert all(r.ok for r in results), doctor.report(results)
    assert "spawn is macOS's default" in result(facts, "start methods").found


def test_small_data_mode_is_named():
    facts = dataclasses.replace(good(), data_count=2000, expected_count=2000)
    assert "small-data mode" in result(facts, "data").found


def test_disk_needed_counts_only_what_is_still_to_write():
    full = footprint.disk_needed(10_000, have_dataset_bytes=0, have_packed_bytes=0)
    # Measured after every chapter and solution had run: 1.07 GB of dataset, 8.36 GB packed.
    assert 9e9 < full < 10e9, "the dataset (1.1 GB) and the packed copies (about 8.4 GB) of the full course"
    small = footprint.disk_needed(2_000, have_dataset_bytes=0, have_packed_bytes=0)
    assert small < full / 3  # the slices and the checks' files do not shrink with the dataset
    assert footprint.disk_needed(10_000, have_dataset_bytes=int(1.1e9), have_packed_bytes=0) == pytest.approx(full - 1.1e9, rel=0.01)
    assert footprint.disk_needed(10_000, have_dataset_bytes=int(1.1e9), have_packed_bytes=int(20e9)) == 0


def test_pins_are_read_from_pyproject_extras_included():
    pins = footprint.pinned_versions(paths.repo_root())
    assert pins["torch"] == PINS["torch"] and "jupyter-book" in pins and "pytest" in pins


def test_the_doctor_runs_here_and_reports_every_check(tmp_path):
    """Without make, in this environment: the same lines (whether they pass depends on the machine)."""
    done = subprocess.run([sys.executable, "-m", "packlab.course.doctor"], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    for name in ("Python", "environment", "cores", "/dev/shm", "start methods", "JupyterLab", "data"):
        assert f" {name}:" in done.stdout
    assert ("READY" in done.stdout) and (done.returncode == 0) == ("NOT READY" not in done.stdout)


def test_environment_sizes_add_up(tmp_path):
    costs = footprint.environment_costs()
    assert sum(size for _, size, _ in costs) > 0
    labels = [label for label, _, _ in costs]
    assert any(label.startswith("book tools") for label in labels) and any(label.startswith("test tools") for label in labels)
    assert "in all" in footprint.sizes_report(costs)

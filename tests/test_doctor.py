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


SETTINGS = (doctor.SettingLine("PACKLAB_COUNT", "10000", "the default"),
            doctor.SettingLine("PACKLAB_DATA", "/data", "settings.mk"))
TRIALS = (doctor.WorkerTrial("fork", True, 2.1), doctor.WorkerTrial("spawn", True, 6.3))


def good() -> doctor.Facts:
    """A machine that passes every check."""
    return doctor.Facts(
        python=(3, 11, 7), platform="linux", machine="x86_64", cores=4, memory_bytes=16 * 2**30,
        data_root=Path("/data"), free_disk_bytes=100 * 10**9, disk_needed_bytes=8 * 10**9, shm_bytes=8 * 2**30,
        start_methods=("fork", "spawn", "forkserver"), packages=dict(PINS), pins=dict(PINS),
        lab_extensions={name: True for name in doctor.LAB_EXTENSIONS}, executable=sys.executable,
        kernel_python=sys.executable, data_count=10_000, data_problems=(), expected_count=10_000,
        repo_root=Path("/home/you/packed-data"), uv_version=(0, 13, 9), uv_path="/usr/bin/uv", settings=SETTINGS,
        worker_trials=TRIALS,
    )


def failed_trial(method: str, error: str = "", timed_out: bool = False) -> tuple[doctor.WorkerTrial, ...]:
    """TRIALS with ``method``'s trial failed as given."""
    return tuple(doctor.WorkerTrial(t.method, False, None if timed_out else 3.0, error, timed_out) if t.method == method
                 else t for t in TRIALS)


def result(facts: doctor.Facts, name: str) -> doctor.Result:
    (found,) = [r for r in doctor.run_checks(facts) if r.name == name]
    return found


def test_a_good_machine_passes_every_check():
    results = doctor.run_checks(good())
    assert all(r.ok for r in results), doctor.report(results)
    assert [r.name for r in results] == ["Python", "uv", "settings", "environment", "notebook kernel", "cores", "memory",
                                         "free disk", "/dev/shm", "start methods", "DataLoader workers", "location",
                                         "JupyterLab", "data", "py-spy"]
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
    "capped to one core": ("cores", dict(cores=16, course_cores=1, cores_origin="from settings.mk"),
                           "make configure PACKLAB_CORES=2"),
    "bad cores setting": ("cores", dict(cores_problem="PACKLAB_CORES='many' (from settings.mk) is not a whole number"),
                          "fix the setting"),
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
    "old uv": ("uv", dict(uv_version=(0, 6, 3)), "uv self update"),
    "unreadable settings file": ("settings", dict(settings=(), settings_problem="settings.mk, line 2: 'COUNT=2' is not a course setting"),
                                 "make configure"),
    "CUDA build without a GPU": ("environment", dict(torch_cuda="13.0"), "make configure TORCH_BACKEND=cpu"),
    "fork crashes on macOS": ("DataLoader workers", dict(platform="darwin", worker_trials=failed_trial(
        "fork", "RuntimeError: DataLoader worker (pid(s) 4711) exited unexpectedly")), "unsafe on macOS"),
    "spawn too slow": ("DataLoader workers", dict(worker_trials=failed_trial("spawn", "no result within 90 s", timed_out=True)),
                       "compute node"),
    "workers without shared memory": ("DataLoader workers", dict(worker_trials=failed_trial(
        "fork", "RuntimeError: DataLoader worker (pid 7) is killed by signal: Bus error.")), "--shm-size"),
    "workers fail otherwise": ("DataLoader workers", dict(worker_trials=failed_trial("spawn", "ImportError: no module x")),
                               "instructor"),
    "no torch for the trial": ("DataLoader workers", dict(worker_trials=None), "make setup"),
    "clone on a Windows drive under WSL": ("location", dict(wsl=True, repo_root=Path("/mnt/c/Users/you/packed-data")),
                                           "Linux home folder"),
    "data on a Windows drive under WSL": ("location", dict(wsl=True, data_root=Path("/mnt/d/packed-data")), "PACKLAB_DATA"),
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
    """Each check of the report has at least one faked failure above (py-spy's never fails: chapter 11 falls back)."""
    assert {name for name, _, _ in FAILURES.values()} == {check(good()).name for check in doctor.CHECKS} - {"py-spy"}


def test_what_cannot_be_measured_is_not_a_failure():
    facts = dataclasses.replace(good(), memory_bytes=None, free_disk_bytes=None, shm_bytes=None, platform="darwin",
                                start_methods=("spawn", "fork", "forkserver"))
    results = doctor.run_checks(facts)
    assert all(r.ok for r in results), doctor.report(results)
    assert "spawn is macOS's default" in result(facts, "start methods").found


def test_a_cuda_build_passes_where_it_was_chosen_or_the_cpu_index_unreachable_or_a_gpu_is_there():
    fallback = "pypi: fallback from cpu on 2026-11-28, https://download.pytorch.org/whl/cpu/torch/ is not reachable from here"
    chosen = (*SETTINGS, doctor.SettingLine("TORCH_BACKEND", "pypi", "settings.mk"))
    for changes in (dict(torch_record=fallback), dict(settings=chosen), dict(gpu=True)):
        facts = dataclasses.replace(good(), torch_cuda="13.0", **changes)
        assert result(facts, "environment").ok, changes
    said = result(dataclasses.replace(good(), torch_cuda="13.0", torch_record=fallback), "environment").found
    assert "not reachable" in said and "3.6 GB" in said  # the fallback is stated, not silent
    assert "CPU-only" in result(good(), "environment").found


def test_a_cpu_backend_recorded_over_a_cuda_build_is_still_a_cross():
    """make setup records what it asked for; the build torch reports is what counts."""
    facts = dataclasses.replace(good(), torch_cuda="13.0", torch_record="cpu")
    assert not result(facts, "environment").ok


def test_mnt_outside_wsl_is_fine():
    facts = dataclasses.replace(good(), repo_root=Path("/mnt/projects/packed-data"), data_root=Path("/mnt/scratch"))
    assert result(facts, "location").ok


def test_every_setting_is_shown_with_its_source():
    found = result(good(), "settings").found
    assert "PACKLAB_COUNT=10000 (the default)" in found and "PACKLAB_DATA=/data (settings.mk)" in found


def test_the_workers_line_gives_each_start_methods_time():
    assert result(good(), "DataLoader workers").found.endswith("fork 2.1 s, spawn 6.3 s")


def test_the_uv_floor_is_the_makefiles():
    makefile = (paths.repo_root() / "Makefile").read_text()
    assert f"MIN_UV := {'.'.join(map(str, doctor.MIN_UV))}" in makefile


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


# ------------------------------------------------------- the facts, gathered from a faked machine


def test_uv_version_is_read_from_the_uv_on_path(tmp_path, monkeypatch):
    from packlab.course.doctor import machine

    fake = tmp_path / "bin" / "uv"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'uv 0.6.3 (a1b2c3 2025-02-24)'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    version, where = machine.uv_facts(tmp_path)
    assert (version, where) == ((0, 6, 3), str(fake))
    assert not doctor.checks.check_uv(dataclasses.replace(good(), uv_version=version, uv_path=where)).ok


def test_torch_cuda_is_read_from_torch_version_py_without_importing_torch(tmp_path, monkeypatch):
    import importlib.machinery
    import importlib.util

    from packlab.course.doctor import machine

    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    spec = importlib.machinery.ModuleSpec("torch", None, origin=str(package / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "torch" else None)
    (package / "version.py").write_text("__version__ = '2.13.0+cu130'\ncuda: Optional[str] = '13.0'\nhip = None\n")
    assert machine.torch_cuda() == "13.0"
    (package / "version.py").write_text("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n")
    assert machine.torch_cuda() is None


def test_a_broken_settings_file_is_a_cross_and_the_rest_is_still_checked(tmp_path, monkeypatch):
    from packlab.course.doctor import machine

    broken = tmp_path / "settings.mk"
    broken.write_text("PACKLAB_COUNT ?= 2000\nCOUNT=2\n")
    monkeypatch.setenv("PACKLAB_SETTINGS", str(broken))
    monkeypatch.delenv("PACKLAB_DATA", raising=False)
    facts = machine.gather(try_workers=False)
    assert "line 2" in facts.settings_problem and str(broken) in facts.settings_problem
    assert facts.data_root == paths.repo_root() / "data"  # looked at as if there were no settings file
    assert not doctor.checks.check_settings(facts).ok


def test_settings_are_shown_with_where_they_came_from(tmp_path, monkeypatch):
    from packlab.course.doctor import machine

    written = tmp_path / "settings.mk"
    written.write_text("PACKLAB_COUNT ?= 2000\nVENV ?= /scratch/venv\n")
    monkeypatch.setenv("PACKLAB_SETTINGS", str(written))
    monkeypatch.setenv("PACKLAB_DATA", str(tmp_path / "data"))
    monkeypatch.delenv("PACKLAB_COUNT", raising=False)
    lines, problem = machine.settings_facts()
    shown = {line.name: (line.value, line.origin) for line in lines}
    assert problem is None
    assert shown["PACKLAB_COUNT"] == ("2000", "settings.mk") and shown["VENV"] == ("/scratch/venv", "settings.mk")
    assert shown["PACKLAB_DATA"] == (str(tmp_path / "data"), "the environment")
    assert shown["TORCH_BACKEND"][1] == "the default"


@pytest.fixture(scope="module")
def trial_images(tmp_path_factory):
    from packlab import data
    from packlab.course.doctor import workers

    root = tmp_path_factory.mktemp("trial")
    data.generate(root, count=workers.IMAGES, workers=1, progress=False)
    return root


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_a_trial_past_its_limit_is_a_timeout_and_leaves_no_process(trial_images):
    from packlab.course.doctor import workers

    trial = workers.run_trial(trial_images, "spawn", time_limit=0.5)  # no interpreter imports torch that fast
    assert not trial.ok and trial.timed_out and trial.seconds is None
    assert not _processes_mentioning(str(trial_images))
    assert "compute node" in doctor.checks.check_workers(dataclasses.replace(good(), worker_trials=(trial,))).todo


def test_a_trial_that_fails_says_why(trial_images, tmp_path):
    import shutil

    from packlab.course.doctor import workers

    damaged = tmp_path / "damaged"
    shutil.copytree(trial_images, damaged)
    (damaged / "images" / "000007.jpg").write_bytes(b"not a jpeg")
    trial = workers.run_trial(damaged, "fork")
    assert not trial.ok and not trial.timed_out and "000007.jpg" in trial.error
    good_trial = workers.run_trial(trial_images, "fork")
    assert good_trial.ok and good_trial.seconds > 0


def test_the_cores_line_says_how_many_are_visible_and_how_many_the_chapters_use():
    plain = result(dataclasses.replace(good(), cores=16), "cores")
    assert plain.ok and "16 cores visible; the chapters use 16 workers (every one)" in plain.found
    capped = result(dataclasses.replace(good(), cores=16, course_cores=2, cores_origin="from /x/settings.mk"), "cores")
    assert capped.ok and "the chapters use 2 workers (PACKLAB_CORES=2, from /x/settings.mk)" in capped.found
    emulated = result(dataclasses.replace(good(), cores=16, course_cores=16, real_cores=2), "cores")
    assert "emulated by PACKLAB_VISIBLE_CORES; this process may run on 2" in emulated.found


def test_packlab_cores_caps_the_cores_the_course_uses_and_never_raises_them(monkeypatch, tmp_path):
    from packlab import cpus, data, settings

    monkeypatch.setenv(settings.SETTINGS_ENV_VAR, str(tmp_path / "none.mk"))
    monkeypatch.setenv("PACKLAB_VISIBLE_CORES", "16")
    monkeypatch.delenv("PACKLAB_CORES", raising=False)
    assert data.available_cores() == 16 and cpus.workers_for(4, 100) == 4 and cpus.workers_for(0) == 1
    monkeypatch.setenv("PACKLAB_CORES", "2")
    assert data.available_cores() == 2 and cpus.workers_for(4) == 2
    monkeypatch.setenv("PACKLAB_CORES", "64")
    assert data.available_cores() == 16
    monkeypatch.delenv("PACKLAB_CORES")
    (tmp_path / "none.mk").write_text("PACKLAB_CORES ?= 3\n")
    assert data.available_cores() == 3 and cpus.cores_cap().source == str(tmp_path / "none.mk")
    monkeypatch.setenv("PACKLAB_CORES", "lots")
    with pytest.raises(settings.SettingsError, match="PACKLAB_CORES='lots'.*make configure PACKLAB_CORES="):
        data.available_cores()


def test_py_spy_that_attaches_is_a_plain_tick():
    from packlab.course.doctor.checks import PyspyTrial

    found = result(dataclasses.replace(good(), pyspy=PyspyTrial(True)), "py-spy")
    assert found.ok and "can attach" in found.found


def test_py_spy_refused_by_yama_does_not_block_ready_and_says_what_to_do():
    from packlab.course.doctor.checks import PyspyTrial

    refused = PyspyTrial(False, "Permission Denied: Try running again with elevated permissions",
                         "probably not allowed: not root and no CAP_SYS_PTRACE; kernel.yama.ptrace_scope is 1")
    facts = dataclasses.replace(good(), pyspy=refused)
    found = result(facts, "py-spy")
    assert found.ok, "chapter 11 has a fallback: a refused attach must not make the machine NOT READY"
    assert "cannot attach" in found.found and "ptrace_scope is 1" in found.found and "Permission Denied" in found.found
    assert "starts its job under py-spy" in found.found
    assert "sudo sysctl kernel.yama.ptrace_scope=0" in found.found
    assert doctor.report(doctor.run_checks(facts)).endswith("READY: every check passed.")
    on_a_mac = result(dataclasses.replace(facts, platform="darwin",
                                          pyspy=PyspyTrial(False, "This program requires root on OSX.",
                                                           "probably not allowed: not root and no CAP_SYS_PTRACE; "
                                                           "the Yama module is not loaded (no ptrace_scope)")), "py-spy")
    assert on_a_mac.ok and "sudo" in on_a_mac.found and "sysctl" not in on_a_mac.found


def test_py_spy_not_tried_is_said_so():
    assert result(good(), "py-spy").found == "not tried"


def test_the_py_spy_trial_reports_a_refusing_py_spy(tmp_path, monkeypatch):
    from packlab import profiling

    real = profiling.pyspy_executable()
    stand_in = tmp_path / "py-spy"
    stand_in.write_text("#!/bin/sh\ncase \"$*\" in *--pid*) echo 'Permission Denied: Try running again' >&2; exit 1;; esac\n"
                        f"exec '{real}' \"$@\"\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv(profiling.PYSPY_VAR, str(stand_in))
    assert profiling.attach_trial(timeout=3) == (False, "Permission Denied: Try running again")

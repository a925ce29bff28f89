"""Chapter 11's py-spy cells where py-spy may not attach, or cannot run at all.

A process running as root with no Yama module (this machine) may attach to anything, so
the refusals are played by stand-in py-spy programs (``$PACKLAB_PYSPY``): one refuses
every ``--pid`` with py-spy's own message and hands everything else to the real py-spy,
the other fails whatever it is asked, as py-spy does on macOS without ``sudo``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from packlab import paths, profiling
from packlab.course import testrun

#: What py-spy 0.4 prints when the kernel refuses to let it attach (its real message).
REFUSED = "Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'"
#: What py-spy prints on macOS without root (there it needs root even for its own children).
NOT_ROOT = "This program requires root on OSX."


def refusing_pyspy(monkeypatch) -> Path:
    """The ptrace-refusing stand-in that ``make test``'s 16-core phase uses: it refuses ``--pid`` as under Yama's
    ptrace_scope=1 and runs the real py-spy otherwise (``$PACKLAB_REAL_PYSPY``)."""
    monkeypatch.setenv("PACKLAB_REAL_PYSPY", profiling.pyspy_executable())
    return paths.repo_root() / testrun.PTRACE_REFUSED_PYSPY


def write_broken_pyspy(folder: Path) -> Path:
    """A py-spy that cannot run at all here: every call fails."""
    script = folder / "py-spy"
    script.write_text(f"#!/bin/sh\necho '{NOT_ROOT}' >&2\nexit 1\n")
    script.chmod(0o755)
    return script


@pytest.fixture
def job_data(small_root, monkeypatch):
    """The training job (a separate Python) reads the small dataset."""
    monkeypatch.setenv("PACKLAB_DATA", str(small_root))
    monkeypatch.setenv("PACKLAB_COUNT", str(len(list((small_root / "images").glob("*.jpg")))))
    return small_root


@pytest.fixture
def sleeper():
    process = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    time.sleep(0.3)
    yield process
    process.kill()
    process.wait()


def test_the_stand_in_is_used_and_a_missing_one_is_named(tmp_path, monkeypatch):
    stand_in = write_broken_pyspy(tmp_path)
    monkeypatch.setenv(profiling.PYSPY_VAR, str(stand_in))
    assert profiling.pyspy_executable() == str(stand_in)
    monkeypatch.setenv(profiling.PYSPY_VAR, str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        profiling.pyspy_executable()


def test_a_refused_dump_says_what_py_spy_said(tmp_path, monkeypatch, sleeper):
    monkeypatch.setenv(profiling.PYSPY_VAR, str(refusing_pyspy(monkeypatch)))
    with pytest.raises(profiling.PyspyError, match="Permission Denied"):
        profiling.pyspy_dump(sleeper.pid)
    assert profiling.attach_trial(timeout=3) == (False, REFUSED)


def test_the_attach_trial_attaches_here_and_reports_a_broken_py_spy(tmp_path, monkeypatch):
    if not profiling.ptrace_permission().startswith("allowed"):
        pytest.skip("py-spy may not attach on this machine")
    started = time.monotonic()
    assert profiling.attach_trial() == (True, "")
    assert time.monotonic() - started < 5
    monkeypatch.setenv(profiling.PYSPY_VAR, str(write_broken_pyspy(tmp_path)))
    assert profiling.attach_trial(timeout=3) == (False, NOT_ROOT)
    monkeypatch.setenv(profiling.PYSPY_VAR, str(tmp_path / "nowhere"))
    attached, said = profiling.attach_trial()
    assert not attached and "nowhere" in said


def test_where_attaching_is_refused_py_spy_starts_the_job_and_sees_its_workers(tmp_path, monkeypatch, job_data):
    monkeypatch.setenv(profiling.PYSPY_VAR, str(refusing_pyspy(monkeypatch)))
    seen = profiling.profile_workers(seconds=1, keys=60, workers=1)
    assert seen.how == profiling.STARTED_UNDER_PYSPY
    assert "Permission Denied" in seen.why and seen.snapshot is None
    assert all(not any("importlib._bootstrap" in frame for frame in stack) for stack, _ in seen.stacks)
    tops = profiling.top_functions(seen.stacks, seen.job_pid)
    assert tops["workers"], "no samples of the DataLoader worker"
    assert f"process {seen.job_pid}:" in seen.busiest_stacks()


def test_where_py_spy_cannot_run_the_workers_work_is_sampled_in_this_process(tmp_path, monkeypatch, job_data):
    monkeypatch.setenv(profiling.PYSPY_VAR, str(write_broken_pyspy(tmp_path)))
    seen = profiling.profile_workers(seconds=1, keys=60, workers=1)
    assert seen.how == profiling.SAMPLED_IN_PROCESS and seen.job_pid == -1
    assert NOT_ROOT in seen.why and seen.snapshot is None
    tops = profiling.top_functions(seen.stacks, seen.job_pid)
    assert tops["main process"] == [] and tops["workers"]
    # A CPU-time timer sees the decode and the resize in the Python functions that call them, by py-spy's names.
    names = [name for name, _ in profiling.top_functions(seen.stacks, seen.job_pid, count=50)["workers"]]
    assert any(name.startswith(("ImageFile.load (PIL/", "Image.resize (PIL/")) for name in names), names


def test_where_py_spy_may_attach_the_job_is_dumped_and_recorded(job_data):
    if not profiling.ptrace_permission().startswith("allowed"):
        pytest.skip("py-spy may not attach on this machine")
    seen = profiling.profile_workers(seconds=1, keys=60, workers=1)
    assert seen.how == profiling.ATTACHED and seen.why == ""
    assert f"Process {seen.job_pid}" in seen.snapshot
    assert profiling.top_functions(seen.stacks, seen.job_pid)["workers"]


def test_the_sampler_sees_the_function_at_work():
    def spin():
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            sum(range(1000))

    stacks = profiling.sample_in_process(spin, rate=200)
    assert sum(n for _, n in stacks) > 10
    assert all(stack[0].startswith("process ") for stack, _ in stacks)
    tops = profiling.top_functions(stacks, -1)
    assert tops["workers"][0][0].startswith("test_the_sampler_sees_the_function_at_work.<locals>.spin (")


def test_import_samples_are_dropped_and_the_root_process_is_the_job():
    stacks = [
        (['process 10:"python -m job"', "<module> (<frozen runpy>:88)",
          "_find_and_load (<frozen importlib._bootstrap>:1176)"], 40),
        (['process 10:"python -m job"', "train_step (train.py:9)"], 5),
        (['process 10:"python -m job"', 'process 11:"python -m job"', "load (PIL/ImageFile.py:300)"], 7),
    ]
    kept = profiling.without_imports(stacks)
    assert [n for _, n in kept] == [5, 7]
    assert profiling.job_pid_of(kept) == 10
    with pytest.raises(profiling.PyspyError, match="no samples"):
        profiling.job_pid_of([])

"""Shared fixtures: a small generated dataset, so unit tests never depend on the full 10k."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # tests draw figures without a display

import pytest

from packlab import data

SMALL_COUNT = 60

# The longest tests, longest first (pytest --durations, make test's unit phase, two cores).
# They are run before the rest, and make test hands tests to its parallel processes two at
# a time (--maxschedchunk 2), so the phase does not end with one long test running alone
# while the other processes sit idle. Order only: every test still runs.
LONGEST_FIRST = (
    "test_bench.py::test_a_quick_benchmark",
    "test_gradebook.py::",
    "test_slurm.py::test_jobs_signalled",
    "test_slurm.py::test_a_job_stopped_while",
    "test_hub_slurm.py::",
    "test_exercises.py::test_the_spawn_part",
    "test_release.py::",
    "test_grading_resumable_reader.py::",
    "test_resume.py::test_a_loop_signalled_at_random_moments",
    "test_grading_formats.py::test_wrong_readers",
    "test_grading_formats.py::test_correct",
    "test_exercises.py::test_grade_command",
    "test_seeding.py::",
    "test_grading.py::test_a_check_called_from_a_script",
    "test_grading.py::test_the_start_up_of_spawn_workers",
    "test_slurm.py::",
    "test_limits.py::",
    "test_torchrun.py::",
    "test_multinode.py::",
    "[spawn]",
)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        return next((i for i, key in enumerate(LONGEST_FIRST) if key in item.nodeid), len(LONGEST_FIRST))

    items.sort(key=rank)  # stable: the others keep their order


@pytest.fixture(scope="session")
def small_root(tmp_path_factory):
    """A 60-image dataset generated once per test session (read-only: copy it before altering)."""
    root = tmp_path_factory.mktemp("small-data")
    data.generate(root, count=SMALL_COUNT, seed=7, workers=2, progress=False)
    return root


@pytest.fixture(scope="session")
def small_manifest(small_root):
    return data.load_manifest(small_root)

"""The machine's limits, reproduced: a 64 MB /dev/shm and a low `ulimit -n`, each error and each fix.

The small /dev/shm is a tmpfs mounted in a private mount namespace (`unshare -m`), so the
machine's own is left alone; that needs root. Without root (or without `unshare`) the
tests skip, except under CI=true, where they must run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from packlab import limits


def _require_namespaces() -> None:
    problem = None
    if os.geteuid() != 0:
        problem = "a private /dev/shm needs root (mount in a new mount namespace)"
    elif shutil.which("unshare") is None:
        problem = "unshare (util-linux) is not installed"
    if problem:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{problem}, and under CI=true this test must run")
        pytest.skip(problem)


@pytest.fixture
def namespaces():
    _require_namespaces()


def test_a_64_mb_dev_shm_stops_float_batches_of_64_with_an_error_naming_shared_memory(namespaces):
    result = limits.run_isolated("64m", samples=256)
    assert not result["ok"] and result["needed_mb"] > 64
    assert "shared memory" in result["error"] or "Bus error" in result["error"], result


@pytest.mark.parametrize("fix", [{"size": "1g"}, {"batch_size": 8}, {"dtype": "uint8"}])
def test_each_fix_lets_the_epoch_through(namespaces, fix):
    fix = dict(fix)
    result = limits.run_isolated(fix.pop("size", "64m"), samples=256, **fix)
    assert result["ok"], result
    assert result["batches"] == (256 + result["batch_size"] - 1) // result["batch_size"]


def test_the_file_system_strategy_does_not_help_a_small_dev_shm(namespaces):
    result = limits.run_isolated("64m", samples=256, strategy="file_system")
    assert not result["ok"] and "shared memory" in result["error"], result


def _in_a_small_dev_shm(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python that sees a private 64 MB /dev/shm."""
    return subprocess.run(limits.small_shm_command([sys.executable, "-c", code]), capture_output=True, text=True,
                          timeout=300)


def test_the_check_before_the_workers_start_names_the_numbers_and_the_fixes(namespaces):
    """Refused below the estimate; a warning between the estimate and the bound (uint8 batches of 64 on 64 MB,
    which the epoch above shows working); silence above the bound."""
    code = ("import warnings\nimport torch\nfrom packlab import limits\n"
            "try:\n    limits.check_shared_memory(limits.batch_nbytes(64), workers=2)\n"
            "except limits.SharedMemoryError as exc:\n    print('REFUSED', exc)\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    limits.check_shared_memory(limits.batch_nbytes(64, dtype=torch.uint8), workers=2)\n"
            "    print('UINT8 WARNED' if caught and caught[0].category is limits.SharedMemoryWarning else 'UINT8 SILENT')\n"
            "    limits.check_shared_memory(limits.batch_nbytes(8), workers=2)\n"
            "    print('BATCH 8 FITS' if len(caught) == 1 else 'BATCH 8 WARNED')\n")
    done = _in_a_small_dev_shm(code)
    assert done.returncode == 0, done.stderr
    assert "REFUSED /dev/shm has 67 MB free (of 67 MB)" in done.stdout, done.stdout
    assert "--shm-size" in done.stdout and "prefetch_factor" in done.stdout
    assert "UINT8 WARNED" in done.stdout and "BATCH 8 FITS" in done.stdout, done.stdout


def test_the_estimate_counts_the_batches_in_flight_and_the_one_held():
    batch = limits.batch_nbytes(64)
    assert limits.shm_needed(batch, workers=2, prefetch_factor=2) == 5 * batch
    assert limits.shm_needed(batch, workers=2, prefetch_factor=2, pin_memory=True) == 6 * batch
    assert limits.shm_bound(batch, workers=2, prefetch_factor=2) == 6 * batch
    assert limits.shm_needed(batch, workers=0) == limits.shm_bound(batch, workers=0) == 0


def test_the_recycling_pool_says_when_dev_shm_is_full(namespaces):
    code = ("from packlab.loaders.recycling import BatchBufferPool\nfrom packlab import limits\n"
            "pool = BatchBufferPool((64, 3, 256, 256), shared=True)\n"
            "try:\n    [pool.acquire() for _ in range(3)]\n"
            "except limits.SharedMemoryError as exc:\n    print('EXPLAINED', exc)\n")
    done = _in_a_small_dev_shm(code)
    assert "EXPLAINED /dev/shm is full" in done.stdout and "--shm-size" in done.stdout, done.stdout + done.stderr


def test_too_many_open_files_with_file_descriptors_and_not_with_file_names():
    """Batches of 4 samples of 64 tensors each, `ulimit -n 64`: descriptors run out; file names do not."""
    failing = limits.run_isolated(None, samples=32, batch_size=4, pieces=64, open_files=64)
    assert not failing["ok"] and ("Too many open files" in failing["error"] or "ancdata" in failing["error"]), failing
    working = limits.run_isolated(None, samples=32, batch_size=4, pieces=64, open_files=64, strategy="file_system")
    assert working["ok"], working

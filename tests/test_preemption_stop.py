"""A stop while a DataLoader worker is blocked in a read: the loop still ends with status 3, at once.

The workers ignore SIGTERM (``preemption.ignore_stop_signals``), so neither the DataLoader's
fallback ``terminate()`` nor Python's exit, which joins daemon children without a timeout,
can end one stuck in a read (a hung file system). The training loop must end its own
workers after the final checkpoint, or the job waits for the scheduler's SIGKILL and ends
killed instead of with ``STOPPED_EXIT_CODE``.
"""

from __future__ import annotations

import signal
import time

import pytest
import torch

from packlab import pack, preemption

#: Long enough for a loop that ends its workers (seconds here), far too short for one that waits on a blocked worker.
HANG_GUARD_SECONDS = 60


@pytest.fixture(scope="module")
def shards(small_root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("stop-shards")
    return [str(p) for p in pack.write_tar_shards(folder, root=small_root, maxcount=10, progress=False)]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_stop_with_a_worker_blocked_in_a_read_exits_with_status_3(shards, tmp_path, method):
    """Worker 0 delivers its first two batches and blocks reading its third; SIGTERM to the whole group after step 1."""
    checkpoint = tmp_path / "checkpoint.pt"
    arguments = ["--shards", pack.brace_pattern(shards), "--checkpoint", checkpoint, "--workers", 2,
                 "--start-method", method, "--batch-size", 4, "--shuffle-buffer", 10, "--every", 100,
                 "--hang-worker-after", 8]
    with preemption._loop_process(arguments, "--pause-after", "1") as (process, progress):
        assert preemption._wait_for(process, progress, lambda step: step >= 1, "step 1", time.monotonic() + 300), \
            process.communicate(timeout=30)[0]
        time.sleep(1.0)  # worker 0 has been asked for its third batch by now, and waits in its read
        preemption._send(process, signal.SIGTERM, group=True)
        sent = time.monotonic()
        try:
            output, _ = process.communicate(timeout=HANG_GUARD_SECONDS)
        except Exception:
            pytest.fail(f"the loop was still running {HANG_GUARD_SECONDS} s after SIGTERM (a worker blocked in a read "
                        f"kept it alive)")
        seconds = time.monotonic() - sent
    print(f"{method}: status {process.returncode}, {seconds:.1f} s after SIGTERM")
    assert preemption.BLOCKED_MESSAGE in output, output  # the stop did meet a worker blocked in its read
    assert process.returncode == preemption.STOPPED_EXIT_CODE, output
    assert "killed by signal" not in output and "Traceback" not in output, output
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["step"] == 1 and not saved["done"] and len(saved["keys"]) == 4

"""The doctor's trial of DataLoader workers: what actually fails on the day, tried in a few seconds.

Versions and sizes can all look right on a machine where workers still fail: a ``fork``
that crashes on macOS, a ``/dev/shm`` too small for a batch in a container, a ``spawn``
start-up that a loaded login node stretches past any patience. So the doctor pushes
:data:`IMAGES` generated images through the course's own loader,
``DataLoader(JpegFolderDataset(...), num_workers=2)``, once per start method, each in a
process of its own with a time limit (:data:`TIME_LIMIT_S`), and checks that every image
arrived exactly once::

    python -m packlab.course.doctor.workers <data root> <start method>   # one trial (what the doctor runs)

A trial costs a few seconds of CPU with ``fork`` (one interpreter that imports torch) and
about three times that with ``spawn``, whose two workers each start a new interpreter
that imports torch again; the limit is generous because a busy machine stretches both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packlab import paths
from packlab.course.doctor.checks import WorkerTrial

#: Images per trial: four batches of 16, two per worker.
IMAGES = 64
BATCH_SIZE = 16
WORKERS = 2
#: Seconds one trial may take, interpreter start-up included; a DataLoader wait inside it is shorter.
TIME_LIMIT_S = 90
BATCH_TIMEOUT_S = 75


def trial(root: Path, method: str) -> None:
    """Read every image of ``root`` through ``DataLoader(num_workers=2)`` started with ``method``; raise if any went wrong."""
    from torch.utils.data import DataLoader

    from packlab import data
    from packlab.loaders import JpegFolderDataset

    dataset = JpegFolderDataset(root, return_key=True)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, num_workers=WORKERS, multiprocessing_context=method,
                        timeout=BATCH_TIMEOUT_S)
    keys = []
    for images, labels, batch_keys in loader:
        if images.shape[0] != len(batch_keys) or labels.shape[0] != len(batch_keys):
            raise RuntimeError(f"a batch of {len(batch_keys)} keys held {images.shape[0]} images")
        keys += batch_keys
    expected = sorted(data.load_labels(root))
    if sorted(keys) != expected:
        raise RuntimeError(f"{len(keys)} images arrived ({len(set(keys))} distinct), {len(expected)} expected")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def run_trial(root: Path, method: str, time_limit: float = TIME_LIMIT_S) -> WorkerTrial:
    """One trial in a process of its own (a crash or a hang stays there), its whole process group killed at the limit."""
    command = [sys.executable, "-m", "packlab.course.doctor.workers", str(root), method]
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=paths.repo_root(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=time_limit)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the trial and its DataLoader workers
        process.communicate()
        return WorkerTrial(method, False, None, f"no result within {time_limit:.0f} s", timed_out=True)
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        return WorkerTrial(method, False, seconds, _last_line(output))
    return WorkerTrial(method, True, seconds)


def run_trials(methods: list[str], time_limit: float = TIME_LIMIT_S) -> tuple[WorkerTrial, ...]:
    """A trial per start method, on :data:`IMAGES` images generated into a temporary folder."""
    from packlab import data

    with tempfile.TemporaryDirectory(prefix="packlab-doctor-") as folder:
        data.generate(Path(folder), count=IMAGES, workers=1, progress=False)
        return tuple(run_trial(Path(folder), method, time_limit) for method in methods)


if __name__ == "__main__":
    trial(Path(sys.argv[1]), sys.argv[2])

"""Two limits of the machine a DataLoader runs into: the size of ``/dev/shm`` and the number of open files.

**Shared memory.** A worker hands each batch to the training process in shared memory:
torch puts the batch's tensors in files on the ``/dev/shm`` tmpfs (``shm_open``) and sends
the other process a way to map them. With ``num_workers`` workers and ``prefetch_factor``
batches each in flight, plus the batch the loop holds, ``(workers x prefetch + 1) x batch
bytes`` sit there at once (:func:`shm_needed`; one more with ``pin_memory=True``, the batch
the pinning thread is copying). A loop that keeps the previous batch alive while the next
one arrives (a reference held past the step) needs one batch more: :func:`shm_bound`. A
float batch of 64 images of 3 x 256 x 256 is 50 MB. Docker gives a container 64 MB of
``/dev/shm`` unless told otherwise (``--shm-size``); PyTorch's issue #5040 is the classic
report. What the user then sees is a worker dying of ``SIGBUS`` ("DataLoader worker ... is
killed by signal: Bus error") or an error about writing to a ``/torch_...`` file, in the
first epoch.

**Open files.** Under the default ``file_descriptor`` sharing strategy every shared tensor
travels as an open file descriptor, and each process may hold only ``ulimit -n`` of them.
Batches made of many small tensors exhaust it: "received 0 items of ancdata" or "Too many
open files" (PyTorch issue #973). ``torch.multiprocessing.set_sharing_strategy('file_system')``
sends file *names* instead, so no descriptor stays open, at the price of files that a
crashed process can leave behind in ``/dev/shm``. It does not make the batches smaller:
it is no cure for a small ``/dev/shm``.

:func:`check_shared_memory` compares the free space with what a loader will need before any
worker starts: it raises below the estimate and warns between the estimate and the bound,
and says what to change. :func:`try_loader` runs one configuration in this process and
reports what happened; ``python -m packlab.limits`` runs it in a fresh process (as the tests
and chapter 12 do inside a private 64 MB ``/dev/shm``, see :func:`small_shm_command`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
import warnings

import torch
from torch.utils.data import DataLoader, Dataset

SHM = "/dev/shm"


class SharedMemoryError(RuntimeError):
    """``/dev/shm`` is too small for the batches a DataLoader is about to keep in flight."""


class SharedMemoryWarning(UserWarning):
    """``/dev/shm`` holds what a DataLoader keeps in flight, but not one batch more: a loop that holds on to a batch fails."""


def shm_space(path: str = SHM) -> tuple[int, int]:
    """``(size, free)`` of the shared-memory filesystem, in bytes."""
    stat = os.statvfs(path)
    return stat.f_blocks * stat.f_frsize, stat.f_bavail * stat.f_frsize


def batch_nbytes(batch_size: int, sample_shape=(3, 256, 256), dtype=torch.float32) -> int:
    """Bytes of one batch of ``batch_size`` samples of ``sample_shape`` in ``dtype``."""
    return batch_size * math.prod(sample_shape) * torch.empty((), dtype=dtype).element_size()


def shm_needed(batch_bytes: int, workers: int, prefetch_factor: int = 2, pin_memory: bool = False) -> int:
    """Bytes of shared memory a DataLoader keeps in use at once: the estimate.

    Every batch in flight (``workers x prefetch_factor``: the DataLoader hands a worker a
    new index as soon as it takes a batch, so as many are always outstanding), plus the
    one the training loop holds, plus, with ``pin_memory``, the one the pinning thread is
    copying into pinned memory. Without workers batches never cross processes: 0.
    """
    return batch_bytes * (workers * prefetch_factor + 1 + int(pin_memory)) if workers else 0


def shm_bound(batch_bytes: int, workers: int, prefetch_factor: int = 2, pin_memory: bool = False) -> int:
    """:func:`shm_needed` plus one batch: for a loop that keeps the previous batch alive while the next one arrives."""
    return shm_needed(batch_bytes, workers, prefetch_factor, pin_memory) + (batch_bytes if workers else 0)


def check_shared_memory(batch_bytes: int, workers: int, prefetch_factor: int = 2, pin_memory: bool = False,
                        path: str = SHM) -> int:
    """Raise :class:`SharedMemoryError` now if ``path`` cannot hold the loader's batches; return the bytes needed.

    Call it before the first epoch, with the bytes of one batch (:func:`batch_nbytes`).
    Below the estimate (:func:`shm_needed`) it raises; between the estimate and the bound
    (:func:`shm_bound`) it warns (:class:`SharedMemoryWarning`): the loader fits as long as
    the loop lets go of each batch before it takes the next. The messages give the numbers
    and each fix, because the failure they prevent (a worker killed by SIGBUS, or an error
    about shared memory, part-way through the first epoch) names none of them.
    """
    needed = shm_needed(batch_bytes, workers, prefetch_factor, pin_memory)
    bound = shm_bound(batch_bytes, workers, prefetch_factor, pin_memory)
    size, free = shm_space(path)
    held = "plus one held by the training loop" + (" and one by the pin_memory thread" if pin_memory else "")
    what = (f"{workers} workers x prefetch_factor={prefetch_factor} batches of {batch_bytes / 1e6:.1f} MB, {held}, "
            f"need about {needed / 1e6:.0f} MB")
    if needed > free:
        raise SharedMemoryError(
            f"{path} has {free / 1e6:.0f} MB free (of {size / 1e6:.0f} MB), but {what}: the workers would fail in the "
            "first epoch (\"unable to allocate shared memory\", or killed by SIGBUS, \"Bus error\"). Fixes: "
            f"{FIXES}. set_sharing_strategy('file_system') uses /dev/shm too and does not help here."
        )
    if bound > free:
        warnings.warn(SharedMemoryWarning(
            f"{path} has {free / 1e6:.0f} MB free (of {size / 1e6:.0f} MB): enough for what {what}, but not for "
            f"{bound / 1e6:.0f} MB, one batch more, which a loop that keeps the previous batch alive while the next "
            f"arrives needs. Let go of each batch in the step (no reference kept past it), or: {FIXES}."
        ), stacklevel=2)
    return needed


FIXES = ("give the container more shared memory (docker run --shm-size=8g; Kubernetes: an emptyDir with medium: "
         "Memory at /dev/shm); lower prefetch_factor or batch_size; hand uint8 images to the loop (4x smaller than "
         "float32); or use fewer workers")


def shm_full_error(error: BaseException, wanted_bytes: int, path: str = SHM) -> SharedMemoryError | None:
    """A :class:`SharedMemoryError` that explains ``error`` when it is torch failing to allocate in a full ``/dev/shm``.

    Returns None for any other error, so callers can re-raise those unchanged.
    """
    text = str(error)
    if "shared memory" not in text and "No space left on device" not in text:
        return None
    size, free = shm_space(path)
    return SharedMemoryError(
        f"{path} is full: {free / 1e6:.0f} MB free of {size / 1e6:.0f} MB, and a batch buffer of {wanted_bytes / 1e6:.1f} "
        f"MB did not fit ({text.strip().splitlines()[-1]}). Fixes: {FIXES}."
    )


# ------------------------------------------------------------ one configuration, tried


class Zeros(Dataset):
    """``count`` samples of zeros of ``shape`` (no decoding: only the hand-over is exercised), in ``pieces`` tensors each."""

    def __init__(self, count: int, shape=(3, 256, 256), pieces: int = 1, dtype=torch.float32):
        self.count, self.shape, self.pieces, self.dtype = count, tuple(shape), pieces, dtype

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        if self.pieces == 1:
            return torch.zeros(self.shape, dtype=self.dtype)
        return [torch.zeros(self.shape, dtype=self.dtype) for _ in range(self.pieces)]


def try_loader(batch_size: int = 64, workers: int = 2, prefetch_factor: int = 2, strategy: str = "file_descriptor",
               samples: int = 512, pieces: int = 1, open_files: int | None = None, dtype: str = "float32",
               hold: int = 0, pin_memory: bool = False, timeout: float = 120.0) -> dict:
    """One epoch of :class:`Zeros` through a DataLoader; what happened, as a dict (``ok``, ``error``, ``seconds``).

    ``strategy`` is the sharing strategy; ``open_files`` lowers this process's ``ulimit -n``
    first; ``hold`` keeps that many batches alive in the loop (as a training step that keeps
    references does), so their descriptors stay open. ``needed_mb`` and ``bound_mb`` are
    :func:`shm_needed` and :func:`shm_bound`.
    """
    if open_files is not None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, hard))
    torch.multiprocessing.set_sharing_strategy(strategy)
    dataset = Zeros(samples, pieces=pieces, dtype=getattr(torch, dtype))
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, multiprocessing_context="fork",
                        prefetch_factor=prefetch_factor if workers else None, timeout=timeout if workers else 0,
                        pin_memory=pin_memory)
    size, free = shm_space()
    batch_bytes = batch_nbytes(batch_size, dtype=getattr(torch, dtype)) * pieces
    result = {"batch_size": batch_size, "workers": workers, "prefetch_factor": prefetch_factor, "strategy": strategy,
              "pieces": pieces, "open_files": open_files, "dtype": dtype, "pin_memory": pin_memory, "shm_mb": size / 1e6,
              "needed_mb": shm_needed(batch_bytes, workers, prefetch_factor, pin_memory) / 1e6,
              "bound_mb": shm_bound(batch_bytes, workers, prefetch_factor, pin_memory) / 1e6}
    start = time.perf_counter()
    held, batches = [], 0
    try:
        for batch in loader:
            batches += 1
            if hold:
                held = (held + [batch])[-hold:]
        result.update(ok=True, error=None)
    except Exception as exc:  # noqa: BLE001 - what the user would see is the result
        result.update(ok=False, error=f"{type(exc).__name__}: {exc}".strip().splitlines()[-1][:400])
    result.update(seconds=time.perf_counter() - start, batches=batches)
    return result


def can_make_private_shm() -> bool:
    """Whether this process can mount a private ``/dev/shm`` (root, Linux, ``unshare`` installed)."""
    import shutil

    return sys.platform == "linux" and os.geteuid() == 0 and shutil.which("unshare") is not None


def small_shm_command(command: list[str], size: str = "64m") -> list[str]:
    """``command`` run with a private ``/dev/shm`` of ``size``: a tmpfs in a new mount namespace (needs root).

    ``unshare -m`` gives the command its own copy of the mount table (with private
    propagation), so the tmpfs mounted over ``/dev/shm`` there is seen by it and its children
    only; the machine's own ``/dev/shm`` is left alone.
    """
    import shlex

    inner = f"mount -t tmpfs -o size={size} tmpfs {SHM} && exec {shlex.join(command)}"
    return ["unshare", "-m", "sh", "-c", inner]


def run_isolated(size: str | None = "64m", timeout: float = 300.0, **config) -> dict:
    """:func:`try_loader` in a fresh process, inside a private ``/dev/shm`` of ``size`` (None: the machine's).

    One process per configuration: a failed epoch's batches take a while to leave
    ``/dev/shm`` (its workers exit, ``file_system`` files stay until they are removed), and
    the next configuration must see the whole tmpfs.
    """
    import subprocess

    command = [sys.executable, "-m", "packlab.limits"]
    for name, value in config.items():
        command += [f"--{name.replace('_', '-')}"] if value is True else [f"--{name.replace('_', '-')}", str(value)]
    if size is not None:
        command = small_shm_command(command, size)
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"ok": False, "error": f"the process ended with status {done.returncode} and no result: "
                                      + (done.stderr.strip().splitlines() or ["(no output)"])[-1][:400],
                "status": done.returncode, "seconds": None, **config}
    return {**json.loads(lines[-1]), "status": done.returncode}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.limits", description=try_loader.__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch-factor", type=int, default=2)
    parser.add_argument("--strategy", default="file_descriptor", choices=["file_descriptor", "file_system"])
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--pieces", type=int, default=1)
    parser.add_argument("--open-files", type=int)
    parser.add_argument("--dtype", default="float32", choices=["float32", "uint8"])
    parser.add_argument("--hold", type=int, default=0)
    parser.add_argument("--pin-memory", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps(try_loader(**vars(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

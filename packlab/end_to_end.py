"""Chapter 11's "All together": the training pipelines and their ceilings, measured in a process of their own.

A training job runs its loader in a fresh process started for it, not in a notebook's kernel
that has already run ten sections, and the two gave different answers. On 30 November, with
the same code and the same 1,024 images, our loader reached 0.80-0.86 of its ceiling (eight runs,
each its median over the ceiling's median, the ratio the course used then) when measured inside chapter 11's kernel at the end of the chapter,
and 0.74-0.80 in a fresh Python process (nine runs), where ``make bench`` (itself a fresh
process) read 0.76 and 0.77. What the kernel's history changes was not found: the same code
in a fresh kernel read 0.76-0.80 (three runs), a notebook of the chapter's set-up, its
storage section and "All together" 0.79 and 0.82, and one with either half of the other
sections added 0.78 and 0.79.

So the chapter measures as a training job and ``make bench`` do, in a :class:`FreshProcess`.
Started at the top of the chapter, the process does its imports (torch, torchvision, DALI)
while the chapter sets up, and then sleeps until "All together" hands it the work: started
at "All together" instead, its start-up added 16 s to the cell.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

#: What the measuring process imports before it is asked for anything: the loaders' modules and DALI's.
WARM_MODULES = ("torchvision.transforms", "packlab.audit", "packlab.ceiling", "packlab.crops", "packlab.steady",
                "packlab.loaders.lineup", "packlab.loaders.dali_pipeline")


class FreshProcess:
    """A Python process of its own (``spawn``: nothing inherited from the caller), kept for later work.

    It starts at once and imports ``modules`` in the background; :meth:`ready` waits for
    that, :meth:`run` hands it a function and returns the result (an exception in it is
    raised here), :meth:`close` ends it. The caller's torch thread count (one, in the
    chapters) goes with it, as ``spawn`` does not carry it. The process is not a daemon, so
    it may start loader workers of its own. Run after :meth:`close` (a notebook cell run a
    second time), it starts a new process, with the imports that then take their time.
    """

    def __init__(self, modules: Sequence[str] = WARM_MODULES) -> None:
        self._modules = tuple(modules)
        self._start()

    def _start(self) -> None:
        import torch

        self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        self._warming: Future = self._pool.submit(_warm_up, torch.get_num_threads(), self._modules)

    def ready(self, timeout: float | None = 300) -> float:
        """Wait until the imports are done; returns the seconds they took in the process."""
        return self._warming.result(timeout=timeout)

    def run(self, function: Callable, *args: Any) -> Any:
        """``function(*args)`` in the process; ``function`` must be importable (a module's top-level function)."""
        if self._pool is None:
            self._start()
        self.ready()
        return self._pool.submit(function, *args).result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> FreshProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _warm_up(threads: int, modules: tuple[str, ...]) -> float:
    import importlib
    import time

    import torch

    start = time.perf_counter()
    torch.set_num_threads(threads)
    for name in modules:
        importlib.import_module(name)
    if "packlab.loaders.dali_pipeline" in modules:
        from packlab.loaders.dali_pipeline import dali_status

        dali_status()  # imports DALI itself, where it is installed
    return time.perf_counter() - start


def crop_pipeline_rates(epoch_shards: Sequence[str], train_shards: Sequence[str], workers: int,
                        rounds: int) -> tuple[dict, dict, list]:
    """The standard pipeline, ours on the stored shards and DALI's, with each one's own ceiling, in turns.

    ``epoch_shards`` are the originals, ``train_shards`` their stored copies (the same
    samples). Each pipeline is a loader with ``workers`` persistent workers (or DALI's
    threads); each ceiling (:func:`packlab.ceiling.crop_ceiling`) runs over the loaders' whole
    epoch in memory. Returns :func:`packlab.steady.steady_rates`'s ``(spreads, epochs)`` and
    the records of one more epoch of ours (:func:`packlab.audit.records_from_batches`), to
    check that the loader measured delivered every sample once.
    """
    from packlab import audit, ceiling, crops, steady
    from packlab.loaders.lineup import CROP_ROWS, crop_factories

    wanted = (CROP_ROWS["standard"], CROP_ROWS["ours, stored"], CROP_ROWS["DALI, stored"])
    made = {name: make(workers) for name, (_, make) in crop_factories(epoch_shards, train_shards,
                                                                       with_keys=True).items() if name in wanted}
    # Each ceiling runs over the loaders' whole epoch, in memory: the originals and their stored copies, the same images.
    original_items, stored_items = ceiling.shard_items(epoch_shards), ceiling.shard_items(train_shards)
    ceilings = {"ceiling: standard crops, originals": ceiling.crop_ceiling(original_items, workers,
                                                                            crops.crop_reference, channels_last=False),
                "ceiling: our crops, stored": ceiling.crop_ceiling(stored_items, workers, crops.crop_fast,
                                                                    channels_last=True)}
    spreads, epochs = steady.steady_rates(made, workers, rounds=rounds, extra=ceilings, warm_up=False)
    records = audit.records_from_batches(made[CROP_ROWS["ours, stored"]], with_pixels=False)
    return spreads, epochs, records

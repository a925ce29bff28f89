"""Chapter 11's "All together": the training pipelines and their ceilings, measured in a process of their own.

A training job runs its loader in a fresh process started for it, not in a notebook's kernel
that has already run ten sections. The same measurement differed between the two: on 30
November, with the same code and the same 1,024 images, our loader reached 0.80-0.86 of its
ceiling (the medians of eight runs) when measured inside chapter 11's kernel at the end of the
chapter, and 0.74-0.80 in a fresh Python process (nine runs), where ``make bench`` (itself a
fresh process) read 0.76 and 0.77. What the kernel's history changes was not found: the same
code run in a fresh kernel read 0.76-0.80 (three runs), a notebook of the chapter's set-up,
its storage section and "All together" 0.79 and 0.82, and one with either half of the other
sections added 0.78 and 0.79. So the chapter measures as a training job and ``make bench`` run,
:func:`in_fresh_process`, and the two instruments differ only by their runs' noise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def crop_pipeline_rates(epoch_shards: Sequence[str], train_shards: Sequence[str], workers: int,
                        rounds: int) -> tuple[dict, dict]:
    """The standard pipeline, ours on the stored shards and DALI's, with each one's own ceiling, in turns.

    ``epoch_shards`` are the originals, ``train_shards`` their stored copies (the same
    samples). Each pipeline is a loader with ``workers`` persistent workers (or DALI's
    threads); each ceiling (:func:`packlab.ceiling.crop_ceiling`) runs over the loaders'
    whole epoch in memory. Returns :func:`packlab.steady.steady_rates`'s ``(spreads, epochs)``.
    """
    from packlab import ceiling, crops, steady
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
    return steady.steady_rates(made, workers, rounds=rounds, extra=ceilings, warm_up=False)


def in_fresh_process(function: Callable, *args: Any) -> Any:
    """``function(*args)`` in a new Python process (``spawn``: nothing inherited from this one), its result back.

    The process is not a daemon, so it may start loader workers of its own; an exception
    in it is raised here.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import torch

    threads = torch.get_num_threads()  # the caller's setting (one, in the chapters), which spawn does not carry
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_with_threads, threads, function, *args).result()


def _with_threads(threads: int, function: Callable, *args: Any) -> Any:
    import torch

    torch.set_num_threads(threads)
    return function(*args)

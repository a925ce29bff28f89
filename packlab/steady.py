"""Rates from steady state: what a loader delivers once it runs, with its start-up reported apart.

:func:`packlab.bench.time_loader` starts its clock before ``iter(loader)``, so the
processes' start and the first batch are inside the time; over a short run that can be
most of it ("start-up is not a rate", exercise 6). A training job runs for hours with
persistent workers; the rate that matters is the one after start-up. :func:`steady_epoch`
times one epoch of a loader that way:

* the **first batch** time, from ``iter()`` to the first batch, is reported on its own;
* the clock starts when **every worker has delivered its first batch** (the ``workers``-th
  batch). Starting it at the very first batch would be biased: the other workers' first
  batches, nearly finished by then, would count as work done inside the clock
  (``workers - 1`` batches for free). From the ``workers``-th batch on, every batch
  counted was made inside the clock;
* the rate is the images of the batches after that one over the time to the last.

:func:`steady_rates` runs several loaders that way, one epoch each per round, in
counterbalanced order (:func:`packlab.bench.interleaved`), reusing each loader, so
DataLoaders with ``persistent_workers=True`` start their processes once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from packlab.bench import Spread, batch_size_of, interleaved


@dataclass(frozen=True)
class SteadyEpoch:
    """One epoch timed from steady state (see the module docstring)."""

    images: int  # all images of the epoch
    first_batch_seconds: float  # iter() to the first batch
    startup_seconds: float  # iter() to the batch that starts the clock
    steady_images: int  # images after that batch
    steady_seconds: float  # from that batch to the last one
    epoch_seconds: float  # iter() to the end

    @property
    def images_per_s(self) -> float:
        """The steady rate: images after start-up over the time they took."""
        return self.steady_images / self.steady_seconds

    @property
    def startup_share(self) -> float:
        """The share of the epoch's wall time spent before the clock started."""
        return self.startup_seconds / self.epoch_seconds

    def as_dict(self) -> dict:
        return {"images": self.images, "first_batch_seconds": self.first_batch_seconds,
                "startup_seconds": self.startup_seconds, "steady_images": self.steady_images,
                "steady_seconds": self.steady_seconds, "epoch_seconds": self.epoch_seconds,
                "images_per_s": self.images_per_s, "startup_share": self.startup_share}


def steady_epoch(loader: Iterable, workers: int, epoch: int | None = None, on_batch: Callable | None = None) -> SteadyEpoch:
    """Iterate one epoch of ``loader``; time it from the ``max(1, workers)``-th batch on.

    ``epoch``, if given, is passed to ``loader.dataset.set_epoch`` first (a persistent
    worker draws the new epoch's order from it). ``on_batch(batch)`` runs on every batch
    inside the clock, e.g. a training step. Raises if the epoch has no more batches than
    the start-up takes.
    """
    dataset = getattr(loader, "dataset", None)
    if epoch is not None and hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)
    startup_batches = max(1, workers)
    count = batches = steady_images = 0
    first = startup = float("nan")
    start = time.perf_counter()
    clock = start
    for batch in loader:
        now = time.perf_counter()
        size = batch_size_of(batch)
        batches += 1
        count += size
        if batches == 1:
            first = now - start
        if batches == startup_batches:
            startup, clock = now - start, now
        elif batches > startup_batches:
            steady_images += size
        if on_batch is not None:
            on_batch(batch)
    end = time.perf_counter()
    if batches <= startup_batches:
        raise RuntimeError(f"an epoch of {batches} batches is too short to time from steady state: the first "
                           f"{startup_batches} (one per worker) are start-up; read more images per epoch")
    return SteadyEpoch(count, first, startup, steady_images, end - clock, end - start)


def steady_rates(loaders: Mapping[str, Iterable], workers: Mapping[str, int] | int, rounds: int | None = None,
                 seed: int | None = 0, warm_up: bool = True,
                 extra: Mapping[str, Callable[[], float]] | None = None) -> tuple[dict[str, Spread], dict[str, list[SteadyEpoch]]]:
    """Steady rates of several loaders, one epoch each per round, in counterbalanced order.

    ``workers`` is each loader's worker count (one number for all). With ``warm_up`` every
    loader first runs one untimed epoch, so persistent workers are up and the files are in
    the page cache before any round. ``extra`` measures (e.g. ceilings, ``lambda: images/s``)
    take their turns in the same rounds. Returns ``({name: Spread of images/s}, {name:
    [SteadyEpoch]})``; each loader's epochs are numbered on, so each round reads a new epoch's order.
    """
    counts = {name: workers if isinstance(workers, int) else workers[name] for name in loaders}
    epochs = {name: 0 for name in loaders}
    details: dict[str, list[SteadyEpoch]] = {name: [] for name in loaders}

    def one(name: str) -> float:
        result = steady_epoch(loaders[name], counts[name], epoch=epochs[name])
        epochs[name] += 1
        details[name].append(result)
        return result.images_per_s

    if warm_up:
        for name in loaders:
            steady_epoch(loaders[name], counts[name], epoch=epochs[name])
            epochs[name] += 1
    measures = {name: (lambda name=name: one(name)) for name in loaders}
    measures.update(extra or {})
    spreads = interleaved(measures, rounds=rounds, seed=seed)
    return spreads, details


def first_batch_spread(details: list[SteadyEpoch]) -> Spread:
    """The first-batch times of a loader's timed epochs, in seconds."""
    return Spread.of(d.first_batch_seconds for d in details)

"""One loader's wait for each batch (:func:`record_waits`), and its own production times (see the package)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

#: The clock and the "compute" of a simulated step. Tests replace them with a fake clock.
_clock = time.perf_counter
_sleep = time.sleep

#: How much longer than the loader's mean production time a step computes in the study:
#: just long enough on average, so that the loader keeps up on average and only its tail shows.
LOAD = 1.05


def _ms(seconds: float) -> float:
    return round(1e3 * float(seconds), 1)


# ----------------------------------------------------------------------------- one loader


@dataclass(frozen=True)
class BatchWaits:
    """Per-batch waits of one loader under a simulated training loop (see :func:`record_waits`).

    ``waits[i]``: seconds the loop was blocked in ``next()`` for counted batch ``i``;
    ``steps[i]``: that step's wall time (the wait plus the compute); ``arrivals``: when every
    batch read arrived, start-up included, in seconds since ``iter()``. The first
    ``startup_batches`` batches (one per worker) are start-up and are not in ``waits``.
    """

    waits: np.ndarray
    steps: np.ndarray
    arrivals: np.ndarray
    compute_s: float
    workers: int
    startup_batches: int

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the waits, in seconds."""
        return float(np.quantile(self.waits, q))

    @property
    def p50(self) -> float:
        return self.quantile(0.5)

    @property
    def p90(self) -> float:
        return self.quantile(0.9)

    @property
    def p99(self) -> float:
        return self.quantile(0.99)

    @property
    def max(self) -> float:
        return float(np.max(self.waits))

    @property
    def mean_step(self) -> float:
        return float(np.mean(self.steps))

    def production_times(self) -> np.ndarray:
        """Seconds each counted batch took its worker to make; valid only for a run with ``compute_s=0``.

        With the training loop never busy, a worker never waits for room in the queue: it
        starts its next batch as soon as it delivers one. Worker ``w`` makes batches ``w,
        w + W, w + 2W, ...`` (round robin), so the time of batch ``k`` is ``arrival[k] -
        arrival[k - W]``. With one worker that is the interval between consecutive batches;
        with W workers the intervals are about a W-th of it. (The DataLoader delivers in
        order, so a fast batch behind a slow one arrives late: the estimate is a little
        smoother than the truth.)
        """
        if self.compute_s > 0:
            raise ValueError("production times need a run with compute_s=0: with a compute, workers wait for room")
        w = max(1, self.workers)
        k = np.arange(max(self.startup_batches, w), len(self.arrivals))
        return self.arrivals[k] - self.arrivals[k - w]

    def row(self, name: str | None = None) -> dict:
        """One table row, milliseconds with one decimal."""
        out = {"loader": name} if name is not None else {}
        out.update({"workers": self.workers, "compute ms": _ms(self.compute_s), "batches": len(self.waits),
                    "wait p50 ms": _ms(self.p50), "wait p90 ms": _ms(self.p90), "wait p99 ms": _ms(self.p99),
                    "wait max ms": _ms(self.max), "mean step ms": _ms(self.mean_step)})
        return out


def _drive(iterator, batches: int, compute_s: float, on_step: Callable[[], object] | None = None):
    """Take ``batches`` batches: time each ``next()`` (the wait), then compute; returns (waits, steps, arrivals)."""
    waits, steps, arrivals = [], [], []
    for _ in range(batches):
        start = _clock()
        try:
            next(iterator)
        except StopIteration:
            raise RuntimeError("the loader ran out of batches: read fewer steps or give it more data") from None
        got = _clock()
        if compute_s > 0:
            _sleep(compute_s)
        if on_step is not None:
            on_step()
        waits.append(got - start)
        steps.append(_clock() - start)
        arrivals.append(got)
    return waits, steps, arrivals


def record_waits(loader: Iterable, steps: int, compute_s: float = 0.0, workers: int = 0) -> BatchWaits:
    """Iterate ``loader`` for ``max(1, workers)`` start-up batches plus ``steps`` timed steps.

    Each step waits for a batch (the time inside ``next()`` is the **wait**), then
    "computes" by sleeping ``compute_s`` seconds. A sleep stands for a GPU step fairly: the
    GPU does the work and the CPU, which the loader's workers need, stays free. The first
    ``max(1, workers)`` batches are start-up (every worker's first batch, as in
    :mod:`packlab.steady`) and are left out of the waits. With ``compute_s=0`` the loop
    never keeps the loader waiting and :meth:`BatchWaits.production_times` gives the
    loader's own production times.
    """
    startup = max(1, workers)
    begin = _clock()
    iterator = iter(loader)
    waits, wall, arrivals = _drive(iterator, startup + steps, compute_s)
    return BatchWaits(np.array(waits[startup:]), np.array(wall[startup:]), np.array(arrivals) - begin,
                      compute_s, workers, startup)


def calibrated_waits(loader: Iterable, steps: int, workers: int = 0, calibrate: int = 15,
                     load: float = LOAD) -> tuple[BatchWaits, np.ndarray]:
    """One pass over ``loader``: ``calibrate`` batches with no compute, then ``steps`` at the loader's limit.

    The calibration measures the per-worker production times ``p``; the timed steps then
    compute for ``load * mean(p) / workers`` seconds, a step just long enough for the loader
    on average (W workers make W batches per production time). Returns (the waits of the
    timed steps, the production times).
    """
    startup = max(1, workers)
    begin = _clock()
    iterator = iter(loader)
    _, _, first = _drive(iterator, startup + calibrate, 0.0)
    production = BatchWaits(np.zeros(0), np.zeros(0), np.array(first) - begin, 0.0, workers, startup).production_times()
    compute_s = load * float(np.mean(production)) / startup
    waits, wall, arrivals = _drive(iterator, steps, compute_s)
    return BatchWaits(np.array(waits), np.array(wall), np.array(arrivals) - begin, compute_s, workers, 0), production



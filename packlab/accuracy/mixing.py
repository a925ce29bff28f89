"""Mixing several sources by weight: exact counts per epoch, the mix kept in every stretch, resumable.

Training on several datasets at once (a large web crawl and a small curated set, say)
means choosing, sample by sample, which source the next one comes from. The common way is
a weighted random choice per sample (webdataset's ``RandomMix``, LitData's
``CombinedStreamingDataset(weights=…)``): right on average, but the counts of one epoch
vary from run to run, a stretch of the stream can hold far more of one source than its
weight, and the epoch ends when the first source runs out. MosaicML Streaming's
``Stream(proportion=…)`` fixes each source's count per epoch and leaves the placement to
its shuffle.

:class:`WeightedMix` is the course's: the counts of an epoch are fixed from the weights
(largest remainder, so they add up to the epoch's length), and the sources are dealt so
that every prefix of the epoch holds each source within one sample of its share
(:func:`mix_schedule`). Each source is read in a permutation drawn from ``(seed, epoch,
source, pass)``, a new pass starting when a source is used up (a small source is repeated,
never cut short). Everything follows from ``(seed, epoch)``, so the position in the epoch
is the whole state: :meth:`WeightedMix.state_dict` is two numbers, and a resumed mix
continues exactly where the stopped one was.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from packlab.loaders.tar import SharedEpoch


def exact_counts(weights: Sequence[float], length: int) -> np.ndarray:
    """How many samples each source gives in an epoch of ``length``: the weights' shares, rounded so they sum to it.

    Largest remainder: each source gets the floor of its share, and the samples left go to
    the largest fractional parts (ties to the earlier source).
    """
    weights = np.asarray(weights, dtype=float)
    if length < 0 or (weights < 0).any() or weights.sum() <= 0:
        raise ValueError(f"need a length >= 0 and non-negative weights with a positive sum, got {length}, {weights}")
    shares = weights / weights.sum() * length
    counts = np.floor(shares).astype(np.int64)
    left = length - int(counts.sum())
    order = sorted(range(len(shares)), key=lambda i: (-(shares[i] - counts[i]), i))
    counts[order[:left]] += 1
    return counts


def mix_schedule(weights: Sequence[float], length: int, seed: int, epoch: int) -> np.ndarray:
    """Which source each position of the epoch comes from: exact counts, every prefix within one sample of its share.

    At each position the source furthest behind its share so far is chosen (its *deficit*,
    ``count × (t + 1) / length − taken``, is largest); ties are broken at random from
    ``(seed, epoch)``, so two epochs interleave differently.
    """
    counts = exact_counts(weights, length)
    rng = np.random.default_rng([seed, epoch, 0x313])
    jitter = rng.random(len(counts)) * 1e-9  # breaks exact ties, differently per epoch
    taken = np.zeros(len(counts), dtype=np.int64)
    schedule = np.empty(length, dtype=np.int64)
    for t in range(length):
        deficit = counts * (t + 1) / max(length, 1) - taken + jitter
        deficit[taken >= counts] = -np.inf
        source = int(np.argmax(deficit))
        schedule[t] = source
        taken[source] += 1
    return schedule


def source_positions(schedule: np.ndarray, sources: int) -> np.ndarray:
    """For each position of ``schedule``: how many samples of its source came before it in the epoch."""
    seen = np.zeros(sources, dtype=np.int64)
    out = np.empty(len(schedule), dtype=np.int64)
    for t, source in enumerate(schedule):
        out[t] = seen[source]
        seen[source] += 1
    return out


def source_item(size: int, position: int, seed: int, epoch: int, source: int) -> int:
    """The index, in a source of ``size`` items, of its ``position``-th sample in ``epoch``.

    The source is read in a permutation per pass over it; pass ``p`` (when the epoch needs
    more samples than the source has) takes a fresh permutation from ``(seed, epoch, source, p)``.
    """
    passes, within = divmod(position, size)
    return int(np.random.default_rng([seed, epoch, source, passes]).permutation(size)[within])


class WeightedMix(IterableDataset):
    """``epoch_length`` samples per epoch from ``datasets`` (map-style) in the shares of ``weights``.

    Worker ``w`` of ``W`` yields the positions ``w, w + W, …`` of the epoch's schedule, so
    the workers together deliver each position once. Call :meth:`set_epoch` before each
    epoch (it reaches persistent workers). Yields ``(source, item)``: which dataset the
    sample came from, and the dataset's item.
    """

    def __init__(self, datasets: Sequence[Dataset], weights: Sequence[float], epoch_length: int, seed: int = 0):
        if len(datasets) != len(weights):
            raise ValueError(f"{len(datasets)} datasets but {len(weights)} weights")
        self.datasets, self.weights = list(datasets), list(weights)
        self.epoch_length, self.seed = epoch_length, seed
        self._epoch = SharedEpoch()
        self._start = 0  # a resumed position, in this process's share
        self._next = 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch.set(epoch)

    def counts(self) -> np.ndarray:
        """Samples per source in one epoch."""
        return exact_counts(self.weights, self.epoch_length)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch = self._epoch.value
        schedule = mix_schedule(self.weights, self.epoch_length, self.seed, epoch)
        positions = source_positions(schedule, len(self.datasets))
        mine = range(worker, self.epoch_length, workers)
        self._next = self._start
        for t in mine[self._start:]:
            source = int(schedule[t])
            index = source_item(len(self.datasets[source]), int(positions[t]), self.seed, epoch, source)
            self._next += 1
            yield source, self.datasets[source][index]
        self._start = 0

    def state_dict(self) -> dict:
        """Where this reader stands: the epoch and how many of its positions it has delivered."""
        return {"epoch": self._epoch.value, "delivered": self._next if self._next else self._start}

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state``: the same epoch, the next position (refuses a state of another epoch)."""
        if state["epoch"] != self._epoch.value:
            raise ValueError(f"a state of epoch {state['epoch']} given to a mix at epoch {self._epoch.value}: call "
                             f"set_epoch({state['epoch']}) first, or start the new epoch from its beginning")
        self._start, self._next = int(state["delivered"]), 0


def window_shares(sources: Sequence[int], source: int, window: int) -> np.ndarray:
    """The share of ``source`` in each consecutive window of ``window`` samples."""
    sources = np.asarray(sources)
    full = len(sources) // window * window
    return (sources[:full].reshape(-1, window) == source).mean(axis=1)

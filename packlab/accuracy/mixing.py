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
that every prefix of the epoch holds each source close to its share, within one sample
with two sources (:func:`mix_schedule`). Each source is read in a permutation keyed by
``(seed, epoch, source, pass)``, a new pass starting when a source is used up (a small
source is repeated, never cut short).

Both are functions of the position, not of what came before it: which source position
``t`` comes from, and which of that source's items it is, take a few integer operations
each (:func:`schedule_at`, :func:`source_item`), with no list of the epoch built first. An
epoch costs O(1) per sample, whatever the sources' sizes, and a worker computes only its
own positions. And the position in the epoch is the whole state:
:meth:`WeightedMix.state_dict` is two numbers, and a resumed mix continues exactly where
the stopped one was.

That last property needs random access: the sources are map-style datasets (``len`` and
``[index]``). A streamed source (an ``IterableDataset``: tar shards, MDS or LitData
streams) cannot be asked for its item 812,345, and a mix of streams must checkpoint each
stream's reader state and shuffle buffer besides its position; :class:`WeightedMix` refuses
one rather than pretend.
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


#: Feistel rounds of the index permutation (four make a pseudo-random permutation, Luby and Rackoff; two more
#: are cheap).
FEISTEL_ROUNDS = 6
#: Positions a worker computes at once: numpy does the arithmetic for a block, Python only yields.
BLOCK = 4096


def _dealing_offsets(counts: np.ndarray, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
    """For each source but the last: the positions still to deal when it is dealt, and its random phase in them."""
    rest = np.cumsum(counts[::-1])[::-1]  # rest[i]: the samples of sources i, i + 1, … in the epoch
    rng = np.random.default_rng([seed, epoch, 0x313])
    phases = np.array([rng.integers(0, max(int(r), 1)) for r in rest[:-1]], dtype=np.int64)
    return rest[:-1].astype(np.int64), phases


def schedule_at(weights: Sequence[float], length: int, seed: int, epoch: int,
                positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(source, n)`` for each position of the epoch: which source it comes from, and that source's ``n``-th sample.

    Bresenham's dealing, one source at a time. Source 0 has ``c`` of the epoch's ``L``
    samples; of the first ``p`` positions it takes ``floor((c·p + r) / L)``, with a phase
    ``r`` in ``[0, L)`` drawn from ``(seed, epoch)``, so position ``p`` is source 0's when
    that count steps up there, and is its ``floor((c·p + r) / L)``-th sample. That count
    stays within one sample of ``c·p / L`` in every prefix, and reaches exactly ``c`` at the
    end. The positions source 0 leaves are numbered ``0, 1, …`` and dealt to source 1 the
    same way, and so on; the last source takes what is left. With two sources every prefix
    holds each within one sample of its share. A source dealt later inherits the rounding of
    those before it: every prefix holds the ``k``-th source (from 0) within ``k + 1`` samples
    of its share. A few integer operations per source and position, for any position, in
    any order.
    """
    counts = exact_counts(weights, length)
    rest, phases = _dealing_offsets(counts, seed, epoch)
    place = np.asarray(positions, dtype=np.int64).copy()  # the position among those not dealt yet
    source = np.full(place.shape, len(counts) - 1, dtype=np.int64)
    nth = place.copy()
    open_ = np.ones(place.shape, dtype=bool)  # not yet given to a source
    for i, (total, phase) in enumerate(zip(rest, phases)):
        if total == 0:
            break
        before = (int(counts[i]) * place + phase) // total  # source i's samples among the earlier positions
        mine = open_ & ((int(counts[i]) * (place + 1) + phase) // total > before)
        source[mine], nth[mine] = i, before[mine]
        open_ &= ~mine
        place = np.where(open_, place - before, place)
        nth = np.where(open_, place, nth)
    return source, nth


def mix_schedule(weights: Sequence[float], length: int, seed: int, epoch: int) -> np.ndarray:
    """Which source each position of the epoch comes from (:func:`schedule_at` for the whole epoch, as one array)."""
    return schedule_at(weights, length, seed, epoch, np.arange(length))[0]


def _feistel_keys(seed: int, epoch: int, source: int, pass_: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch, source, pass_, 0x7E1]).integers(0, 2**63, FEISTEL_ROUNDS,
                                                                                 dtype=np.uint64)


def _round(half: np.ndarray, key: np.uint64, mask: np.uint64) -> np.ndarray:
    """The round function: a 64-bit mix of ``half`` and ``key`` (SplitMix64's finaliser), cut to ``mask``."""
    z = half ^ key
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return (z ^ (z >> np.uint64(31))) & mask


def permute(size: int, within: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """A keyed permutation of ``[0, size)`` applied to ``within``: a Feistel network with cycle walking.

    The network permutes ``[0, 4^k)``, the smallest power of four with ``size`` or more
    values, by swapping two halves of ``k`` bits and mixing one into the other with a keyed
    hash, :data:`FEISTEL_ROUNDS` times: each round is undone by the next, so the whole is a
    bijection. A value that lands outside ``[0, size)`` is sent through again until it is
    inside (*cycle walking*); it stays a bijection on ``[0, size)``, and as at most 3/4 of
    the values lie outside, fewer than four passes are needed on average. Nothing of size
    ``size`` is built.
    """
    with np.errstate(over="ignore"):  # the multiplications wrap around 2^64 on purpose
        bits = max(1, (max(size - 1, 1).bit_length() + 1) // 2)
        mask, shift = np.uint64(2**bits - 1), np.uint64(bits)
        out = np.asarray(within, dtype=np.uint64).copy()
        todo = np.ones(out.shape, dtype=bool)
        while todo.any():
            x = out[todo]
            left, right = x >> shift, x & mask
            for key in keys:
                left, right = right, left ^ _round(right, key, mask)
            out[todo] = (left << shift) | right
            todo[todo] = out[todo] >= np.uint64(size)
    return out.astype(np.int64)


def source_items(size: int, nth: np.ndarray, seed: int, epoch: int, source: int) -> np.ndarray:
    """The indices, in a source of ``size`` items, of its ``nth`` samples in ``epoch`` (an array of them).

    The source is read in a permutation per pass over it; pass ``p`` (when the epoch needs
    more samples than the source has) uses the permutation keyed by ``(seed, epoch, source, p)``.
    """
    nth = np.asarray(nth, dtype=np.int64)
    passes, within = np.divmod(nth, size)
    out = np.empty(nth.shape, dtype=np.int64)
    for p in np.unique(passes):
        here = passes == p
        out[here] = permute(size, within[here], _feistel_keys(seed, epoch, source, int(p)))
    return out


def source_item(size: int, position: int, seed: int, epoch: int, source: int) -> int:
    """The index, in a source of ``size`` items, of its ``position``-th sample in ``epoch`` (:func:`source_items`)."""
    return int(source_items(size, np.array([position]), seed, epoch, source)[0])


class WeightedMix(IterableDataset):
    """``epoch_length`` samples per epoch from ``datasets`` (map-style) in the shares of ``weights``.

    Worker ``w`` of ``W`` yields the positions ``w, w + W, …`` of the epoch's schedule, so
    the workers together deliver each position once. Call :meth:`set_epoch` before each
    epoch (it reaches persistent workers). Yields ``(source, item)``: which dataset the
    sample came from, and the dataset's item. Each sample costs O(1) to place and to find,
    computed :data:`BLOCK` positions at a time. Streamed (iterable) sources are refused:
    see the module's docstring.
    """

    def __init__(self, datasets: Sequence[Dataset], weights: Sequence[float], epoch_length: int, seed: int = 0):
        if len(datasets) != len(weights):
            raise ValueError(f"{len(datasets)} datasets but {len(weights)} weights")
        for number, dataset in enumerate(datasets):
            map_style = hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
            if isinstance(dataset, IterableDataset) or not map_style:
                raise TypeError(f"source {number} ({type(dataset).__name__}) is not map-style: WeightedMix reads each "
                                f"source by index (len and [index]), which is what makes its position its whole state; "
                                f"a stream would need its reader's state and buffer checkpointed too, which this mix "
                                f"does not do")
            if len(dataset) == 0:
                raise ValueError(f"source {number} is empty")
        self.datasets, self.weights = list(datasets), list(weights)
        self.epoch_length, self.seed = epoch_length, seed
        exact_counts(self.weights, epoch_length)  # refuses bad weights now, not in a worker
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
        mine = range(worker, self.epoch_length, workers)[self._start:]
        self._next = self._start
        for first in range(0, len(mine), BLOCK):
            positions = np.asarray(mine[first:first + BLOCK], dtype=np.int64)
            sources, nth = schedule_at(self.weights, self.epoch_length, self.seed, epoch, positions)
            indices = np.empty_like(nth)
            for source, dataset in enumerate(self.datasets):
                here = sources == source
                if here.any():
                    indices[here] = source_items(len(dataset), nth[here], self.seed, epoch, source)
            for source, index in zip(sources.tolist(), indices.tolist()):
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

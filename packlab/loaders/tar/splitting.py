"""Which shards each rank and DataLoader worker reads, in which order, and in which epoch.

Stages 2 and 3 of :mod:`packlab.loaders.tar`: one shard order per epoch, drawn from
``(seed, epoch)`` so that every rank and worker computes the same list, then cut by rank
and by worker into disjoint parts; the epoch itself travels to the workers in shared
memory (:class:`SharedEpoch`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from packlab.loaders.skipping import MAX_WORKERS


class ShardSplitError(ValueError):
    """The shards cannot be split between ranks and workers without starving someone."""


def split_shards_by_rank(shards: Sequence, rank: int, world_size: int) -> list:
    """The shards one rank reads: every ``world_size``-th, starting at ``rank``.

    Pure list arithmetic: the parts of all ranks are disjoint and together hold every
    shard once; with ``len(shards)`` not a multiple of ``world_size`` the first ranks
    get one shard more (nothing is dropped).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return list(shards[rank::world_size])


def split_shards_by_worker(shards: Sequence, worker_id: int, num_workers: int) -> list:
    """The shards one DataLoader worker reads, out of its rank's shards.

    Same rule as :func:`split_shards_by_rank`, applied inside a rank. ``num_workers=0``
    (everything in the main process) counts as one worker.
    """
    num_workers = max(1, num_workers)
    if not 0 <= worker_id < num_workers:
        raise ValueError(f"need 0 <= worker_id < num_workers, got worker_id={worker_id}, num_workers={num_workers}")
    return list(shards[worker_id::num_workers])


def shard_assignment(shards: Sequence, world_size: int, num_workers: int) -> dict[tuple[int, int], list]:
    """Which shards each ``(rank, worker)`` reads: rank split first, then worker split."""
    return {
        (rank, worker): split_shards_by_worker(split_shards_by_rank(shards, rank, world_size), worker, num_workers)
        for rank in range(world_size)
        for worker in range(max(1, num_workers))
    }


def check_shard_split(num_shards: int, world_size: int = 1, num_workers: int = 0) -> None:
    """Raise :class:`ShardSplitError` if splitting ``num_shards`` would starve a reader.

    Two conditions, both checkable before training starts, on every rank alike:

    * every one of the ``world_size * num_workers`` readers needs at least one shard;
      a worker without one just idles, but a *rank* without data never joins the
      collective operations (gradient all-reduce) the others are waiting in;
    * with several ranks, each must get the same number of shards, or some ranks run
      out of batches before the others and training stalls at the end of the epoch.
      (Equal shard counts give equal epochs when the shards hold equal numbers of
      samples, as :func:`packlab.pack.write_tar_shards` cuts them when ``maxcount``
      divides the dataset.)
    """
    readers = world_size * max(1, num_workers)
    fixes = (
        "Fixes: write more, smaller shards (a multiple of ranks x workers, e.g. "
        f"maxcount <= samples / {readers}), use fewer workers, or pass epoch_length=... to "
        "resample shards so every rank yields the same number of samples."
    )
    if num_shards < readers:
        raise ShardSplitError(
            f"{num_shards} shards cannot feed {world_size} rank(s) x {max(1, num_workers)} worker(s) = "
            f"{readers} readers: {readers - num_shards} of them would get no shard. {fixes}"
        )
    if world_size > 1 and num_shards % world_size:
        per_rank = [len(split_shards_by_rank(range(num_shards), r, world_size)) for r in range(world_size)]
        raise ShardSplitError(
            f"{num_shards} shards split over {world_size} ranks gives them {per_rank} shards: the ranks "
            f"with fewer run out of batches first and collective training stalls. {fixes}"
        )


def epoch_shard_order(shards: Sequence, seed: int, epoch: int) -> list:
    """The shards in this epoch's order: a permutation drawn from ``(seed, epoch)``.

    Deterministic, so every rank and worker that asks gets the same list.
    """
    order = np.random.default_rng([seed, epoch]).permutation(len(shards))
    return [shards[i] for i in order]


class RepeatedEpochWarning(UserWarning):
    """A reader started a second pass over the same epoch without ``set_epoch`` in between."""


class SharedEpoch:
    """The epoch number: written by ``set_epoch`` in the training process, read by every DataLoader worker.

    Why shared memory. A DataLoader worker reads its own copy of the dataset. Without
    ``persistent_workers`` it gets a fresh copy every epoch (forked from, or pickled out
    of, the training process's dataset), so a plain ``self.epoch = epoch`` set before the
    epoch reaches it. With ``persistent_workers=True`` the workers start once and keep
    their first copy: at the next epoch the DataLoader only tells each worker to iterate
    its copy again (``_ResumeIteration`` in ``torch/utils/data/_utils/worker.py``), and
    nothing the training process changes in its own dataset reaches them. Every epoch
    would then repeat the first one's shard order and shuffle, silently.

    So the number lives in a small int64 tensor in shared memory, like
    :class:`packlab.loaders.skipping.SkipCounter`'s counts: ``fork`` workers inherit the
    mapping, and under ``spawn`` and ``forkserver`` torch pickles a shared tensor as a
    handle on the same memory. One writer (the training process, between epochs), many
    readers: every reader of every epoch sees the number last set, persistent or not.

    Why not let each worker count its own epochs instead (what ``webdataset``'s
    ``detshuffle`` does)? Fresh workers start from the training process's copy, which never
    counts, so they would repeat epoch 0 for ever; and a reader whose count falls out of
    step with the others (a worker count changed between loaders, a loader abandoned
    mid-epoch) would cut a *different* permutation of the shards than its peers: shards
    lost and duplicated, without an error. One number set in one place cannot disagree.

    Forgetting ``set_epoch`` therefore repeats the last epoch's order everywhere, as it does
    for ``DistributedSampler``. That at least is detected: each process records in its own
    row (row 0 the main process, row ``1 + i`` worker ``i``) which ``set_epoch`` call it last
    iterated under, and :meth:`start_pass` reports a second pass under the same one.
    """

    def __init__(self, max_workers: int = MAX_WORKERS):
        # [epoch, number of set() calls so far, then per process: the set() count of its last pass]
        state = torch.full((2 + 1 + max_workers,), -1, dtype=torch.int64)
        state[:2] = 0
        self._state = state.share_memory_()

    @property
    def value(self) -> int:
        """The epoch last set (0 before any)."""
        return int(self._state[0])

    def set(self, epoch: int) -> None:
        """Set the epoch (in the training process, before the DataLoader's epoch starts)."""
        self._state[0] = epoch
        self._state[1] += 1

    def start_pass(self, reader: int | None = None) -> tuple[int, bool]:
        """``(epoch, repeated)`` for a pass this process starts now.

        ``repeated`` is True when this process (this worker, or the main process) already
        started a pass since the last :meth:`set`: the pass will repeat that one's order.
        Threads that read several shares in one process (``ThreadLoader``'s readers) pass
        their ``reader`` number and get the row of the worker that would read that share,
        so reader 1 does not take reader 0's pass for its own.
        """
        info = get_worker_info()
        if info is not None:
            row = 2 + info.id + 1
        else:
            row = 2 if reader is None else 2 + reader + 1
        generation = int(self._state[1])
        repeated = False
        if row < len(self._state):  # more workers than rows: no check, the epoch is still right
            repeated = int(self._state[row]) == generation
            self._state[row] = generation
        return int(self._state[0]), repeated


def distributed_rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` of this process: from ``torch.distributed`` when it is
    initialised, else from the ``RANK``/``WORLD_SIZE`` variables torchrun sets, else ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return 0, 1

"""Stragglers: why the tail of a loader's per-batch wait, not its median, sets the pace of a big job.

Every rate in the course so far is an epoch median on one machine. In synchronous
data-parallel training every rank computes its part of a step, then all ranks exchange
gradients (an ``all_reduce``) and none can go on until the slowest has arrived. So a step
lasts as long as the **slowest rank's** wait for its batch, plus the compute:

* **The max of N draws grows with N.** If one rank waits longer than some time ``t`` in 1 %
  of its steps, a job of N ranks has at least one such rank in ``1 - 0.99**N`` of its
  steps: 8 % at 8 ranks, 47 % at 64, more than 99.4 % at 512. A batch that is slow once in
  a hundred is rare on one machine and *every step's* problem at 512 ranks: the job runs at
  the pace of the loader's p99, then of its max.
* **Prefetch depth is a jitter buffer.** A DataLoader keeps ``workers * prefetch_factor``
  batches in flight (made or being made) per rank. When the loader is faster than the step
  *on average*, the queue fills in the calm stretches and a slow batch is absorbed by the
  batches already waiting; only a run of slow batches longer than the queue reaches the
  training loop. A deeper queue costs memory (pinned host batches), not speed.

The package, in the order a chapter uses it:

1. :mod:`.waits`: :func:`record_waits` iterates a loader with a simulated training step
   between batches and records, for every batch, the time the training loop was
   **blocked** in ``next()`` (:class:`BatchWaits`: p50, p90, p99, max). With
   ``compute_s=0`` it records the loader's own **production** times instead
   (:meth:`BatchWaits.production_times`); :func:`calibrated_waits` runs a loader just at
   its limit.
2. :mod:`.ranks`: :func:`run_ranks` runs real ranks (processes joined by a ``gloo`` group on
   127.0.0.1), each with its own DataLoader over its part of the shards, each step timed
   as wait, compute, ``all_reduce``.
3. :mod:`.simulate`: two models of N ranks. :func:`slowest_of` draws each rank's wait from
   the waits real ranks measured and takes the largest each step (:func:`slowest_table`;
   :func:`validate_slowest` checks it on the measured run); :func:`simulate_sync` models each
   rank's loader as its workers and a queue, from their measured production times, so that
   it can say what a deeper prefetch does (:func:`simulation_table`, :func:`validate`).
4. :mod:`.study`: the chapter's loaders (:func:`table_loaders`, :func:`tar_rank_loader`) and
   :func:`straggler_study`, all of it in one call; :mod:`.plots` draws the tails and the
   waiting share.

What the simulation leaves out, on purpose, so read its large-N rows as a lower bound:

* **the network**: the ``all_reduce`` of real gradients over a real network takes time and
  grows with N (ring or tree); here it is a constant (the measured local one, or zero);
* **correlated slowdowns**: the simulated ranks draw their batch times independently. A
  shared filesystem or object store that slows down slows *all* ranks at once; then the
  max grows less with N, but the median is worse, and nothing in one machine's
  distribution shows it;
* **slow nodes**: a rank on a node with a bad disk, a throttled CPU or a noisy neighbour is
  slow at *every* step, not at random ones. That is a straggler no queue absorbs;
* **unseen tails**: batch times are resampled from a measurement of a few dozen batches,
  so no simulated batch is slower than the slowest one measured. At 1,024 ranks nearly every
  step draws that slowest batch somewhere; a longer measurement would find slower ones.
"""

from packlab.stragglers.plots import plot_wait_tails, plot_waiting_share
from packlab.stragglers.ranks import RankRun, free_port, run_ranks
from packlab.stragglers.simulate import (
    PREFETCH_FACTOR,
    RANKS,
    SyncRun,
    block_se,
    exchange_cost,
    job_steps,
    next_floor,
    simulate_sync,
    simulation_table,
    slowest_of,
    slowest_table,
    validate,
    validate_slowest,
)
from packlab.stragglers.study import rank_loaders, shard_keys, straggler_study, table_loaders, tar_rank_loader
from packlab.stragglers.waits import LOAD, BatchWaits, calibrated_waits, record_waits

__all__ = ["LOAD", "PREFETCH_FACTOR", "RANKS", "BatchWaits", "RankRun", "SyncRun", "block_se", "calibrated_waits",
           "exchange_cost", "free_port", "job_steps", "next_floor", "plot_wait_tails", "rank_loaders", "shard_keys", "plot_waiting_share",
           "record_waits", "run_ranks", "simulate_sync", "simulation_table", "slowest_of", "slowest_table", "straggler_study", "table_loaders",
           "tar_rank_loader", "validate", "validate_slowest"]

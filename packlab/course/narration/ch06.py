"""Chapter 6, scaling out: the words around the shard arithmetic, the resampled epochs and the launches."""

from __future__ import annotations

import math

from packlab.loaders.tar import split_shards_by_rank
from packlab.course.prose import provides_figures


@provides_figures("readers_16", "ranks_with_more", "more_shards", "ranks_with_fewer", "fewer_shards", "extra_batches_pct", "equal_ranks_16", "equal_readers_16", "equal_readers_16_mb")
def shard_count_figures(shards: int, workers_per_rank: int, ranks: int) -> dict:
    """What ``shards`` equal shards do for ``ranks`` ranks of ``workers_per_rank`` workers: the prose's figures.

    How many ranks get the larger and the smaller share, how many more batches the larger
    share means, and the fewest shards that are a multiple of the ranks (at least one per
    reader) and of the readers, with the shard size the latter gives.
    """
    readers = ranks * workers_per_rank
    shares = [len(split_shards_by_rank(range(shards), r, ranks)) for r in range(ranks)]
    more, fewer = max(shares), min(shares)
    equal_ranks = math.ceil(max(shards, readers) / ranks) * ranks
    equal_readers = math.ceil(shards / readers) * readers
    return {
        "readers_16": f"{readers:,}",
        "ranks_with_more": shares.count(more),
        "more_shards": more,
        "ranks_with_fewer": shares.count(fewer),
        "fewer_shards": fewer,
        "extra_batches_pct": f"{100 * (more - fewer) / fewer:.1f}" if fewer else "infinitely many",
        "equal_ranks_16": equal_ranks,
        "equal_readers_16": equal_readers,
        "equal_readers_16_mb": f"{shards / equal_readers * 1000:.0f}",
    }


@provides_figures("wds_n", "wds_alone", "wds_workers", "wds_samples", "wds_batches", "wds_batch_size", "wds_batch_samples", "wds_per_worker")
def with_epoch_figures(n: int, workers: int, batch_size: int, counted: dict) -> dict:
    """Sentences on what ``webdataset``'s ``.with_epoch(n)`` delivered, from ``counted``.

    ``counted[(where, workers)] = (items, samples)``: ``where`` is ``"samples"`` (with_epoch
    after to_tuple) or ``"batches"`` (after ``.batched``); ``workers`` 0 or ``workers``.
    """
    alone_items, _ = counted["samples", 0]
    items, samples = counted["samples", workers]
    batch_items, batch_samples = counted["batches", workers]
    return {
        "wds_n": n,
        "wds_alone": f"{alone_items:,}",
        "wds_workers": workers,
        "wds_samples": f"{samples:,}",
        "wds_batches": f"{batch_items:,}",
        "wds_batch_size": batch_size,
        "wds_batch_samples": f"{batch_samples:,}",
        "wds_per_worker": f"{n // workers:,}",
    }



@provides_figures("reader_share_sentence")
def reader_share_figures(per_reader: dict) -> dict:
    """The sentence under the share-per-reader figure: how much longer than it needs each job's epoch lasts.

    ``per_reader`` maps a job (``"140 shards"``) to what each of its readers reads; the
    epoch lasts as long as the busiest reader takes, so its length over an even split's is
    the busiest share over the mean share.
    """
    stretch = {name: max(shares) / (sum(shares) / len(shares)) for name, shares in per_reader.items()}
    best = min(stretch, key=stretch.get)
    parts = ", ".join(f"{factor:.2f} times as long with {name}" for name, factor in stretch.items())
    sentence = f"The epoch lasts as long as its busiest reader takes: against an even split, {parts}. "
    if stretch[best] < 1.01:
        sentence += f"With {best} every reader reads the same and none waits for the others."
    else:
        sentence += f"Even {best} leaves some readers idle while the busiest finish."
    return {"reader_share_sentence": sentence}

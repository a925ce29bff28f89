"""The course's tar-shard pipeline written with the ``webdataset`` library.

Chapter 5 builds it stage by stage next to :class:`packlab.loaders.tar.TarShardDataset`,
and the benchmark (``make bench``) times the two against each other, so it lives here
once. Same shards, same shuffle buffer, same transform, batches made in the workers.

Three ``webdataset`` defaults matter (``webdataset/compat.py`` in version 1.0.2):
``shardshuffle=None`` does not shuffle shards and warns; ``workersplitter`` splits
shards between DataLoader workers; ``nodesplitter=single_node_only`` refuses to run on
more than one rank, so multi-rank jobs pass ``wds.split_by_node`` as we do here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import webdataset as wds

from packlab.transforms import standard_transform


def webdataset_pipeline(
    urls: str | Sequence[str],
    *,
    buffer: int = 1000,
    batch_size: int = 64,
    transform: Callable = standard_transform,
    with_keys: bool = True,
    seed: int = 0,
    collation_fn: Callable | None = None,
) -> wds.WebDataset:
    """Shards -> (split by rank, then worker) -> shuffled -> decoded -> ``(images, labels[, keys])`` batches.

    ``collation_fn`` makes the batches (default: webdataset's, which stacks the samples);
    the benchmark passes ``transform=decode_and_resize`` with
    :func:`packlab.loaders.batching.collate_uint8_images`, our own loaders' fast path.
    """
    batching = {} if collation_fn is None else {"collation_fn": collation_fn}
    columns = ("jpg", "cls", "__key__") if with_keys else ("jpg", "cls")
    return (
        wds.WebDataset(urls, shardshuffle=100, nodesplitter=wds.split_by_node,
                       workersplitter=wds.split_by_worker, seed=seed)
        .shuffle(buffer)                                   # the sample buffer, per worker
        .decode(wds.handle_extension("jpg", transform))    # our transform; .cls becomes an int
        .to_tuple(*columns)
        .batched(batch_size, **batching)                   # batches are made inside the workers
    )


def webdataset_loader(
    urls: str | Sequence[str],
    workers: int = 2,
    *,
    timeout: float = 0,
    multiprocessing_context: str | None = None,
    **pipeline_options,
) -> wds.WebLoader:
    """A loader over :func:`webdataset_pipeline` (``batch_size=None``: the pipeline batches already)."""
    return wds.WebLoader(webdataset_pipeline(urls, **pipeline_options), batch_size=None, num_workers=workers,
                         multiprocessing_context=multiprocessing_context if workers else None, timeout=timeout)

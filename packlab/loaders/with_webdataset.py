"""The course's tar-shard pipeline written with the ``webdataset`` library.

Chapter 5 builds it stage by stage next to :class:`packlab.loaders.tar.TarShardDataset`,
and the benchmark (``make bench``) times the two against each other, so it lives here
once. Same shards, same shuffle buffer, same transform, batches made in the workers.

What ``webdataset`` 1.0.2 does by default, read in its source (``compat.py``,
``filters.py``), and why the pipeline below is spelled out stage by stage instead of
using ``wds.WebDataset(...)``:

* ``shardshuffle=None`` does not shuffle shards (and warns); ``workersplitter`` splits
  shards between DataLoader workers; ``nodesplitter=single_node_only`` refuses to run on
  more than one rank, so multi-rank jobs need ``wds.split_by_node``.
* ``WebDataset(shardshuffle=n, seed=s)`` shuffles each worker's shards with
  ``filters.shuffle(n, seed=s)``, which builds ``random.Random(s)`` afresh on every pass:
  **every epoch reads the shards in the same order**. With ``seed=None`` the seed is drawn
  once, when the dataset is built, so the same holds.
* ``detshuffle=True`` seeds from ``seed + epoch``, where ``epoch`` is a counter the stage
  advances itself on every pass. That survives only where the same copy of the dataset
  runs every epoch: ``num_workers=0`` or ``persistent_workers=True``. Without persistent
  workers each epoch's workers start from the training process's copy, whose counter never
  moved, and every epoch is epoch 0 again.

So the shard shuffle here is :class:`EpochShuffle`, seeded from an epoch that
:meth:`EpochPipeline.set_epoch` writes to shared memory (:class:`~packlab.loaders.tar.SharedEpoch`,
as :class:`~packlab.loaders.tar.TarShardDataset` uses): every epoch a new order, with fresh
or persistent workers, under any start method. Call ``set_epoch(epoch)`` before each epoch.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import webdataset as wds
from torch.utils.data import DataLoader

from packlab.loaders.tar import RepeatedEpochWarning, SharedEpoch
from packlab.transforms import standard_transform


class EpochShuffle:
    """A pipeline stage: webdataset's buffer shuffle, with a generator seeded from the epoch.

    ``wds.shuffle(bufsize, rng=...)`` does the shuffling; this stage only chooses the
    generator when a pass starts, from ``(what, seed, epoch, rank, worker)``, reading the
    epoch from ``epoch`` (shared memory, so persistent workers see ``set_epoch`` too).
    With ``warn_on_repeat`` (give it to one stage per pipeline) a second pass without
    ``set_epoch`` in between raises a :class:`~packlab.loaders.tar.RepeatedEpochWarning`.
    """

    def __init__(self, bufsize: int, epoch: SharedEpoch, seed: int = 0, what: str = "samples",
                 warn_on_repeat: bool = False):
        self.bufsize = bufsize
        self.epoch = epoch
        self.seed = seed
        self.what = what
        self.warn_on_repeat = warn_on_repeat

    def __call__(self, source: Iterable) -> Iterable:
        if self.warn_on_repeat:
            epoch, repeated = self.epoch.start_pass()
            if repeated:
                warnings.warn(RepeatedEpochWarning(
                    f"the webdataset pipeline starts another pass over epoch {epoch} without set_epoch() since the "
                    "last one, so it repeats that pass's order. Call set_epoch(epoch) before each epoch."
                ), stacklevel=2)
        else:
            epoch = self.epoch.value
        rank, _, worker, _ = wds.utils.pytorch_worker_info()
        rng = random.Random(f"{self.what}-{self.seed}-{epoch}-{rank}-{worker}")
        return wds.shuffle(self.bufsize, rng=rng)(source)


class EpochPipeline(wds.DataPipeline):
    """A ``wds.DataPipeline`` with ``set_epoch``, for pipelines whose stages read ``epoch``."""

    def __init__(self, *stages, epoch: SharedEpoch):
        super().__init__(*stages)
        self.epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        """This epoch's shard order and shuffle; call before iterating each epoch."""
        self.epoch.set(epoch)


def webdataset_pipeline(
    urls: str | Sequence[str | Path],
    *,
    buffer: int = 1000,
    batch_size: int = 64,
    transform: Callable = standard_transform,
    with_keys: bool = True,
    seed: int = 0,
    shard_buffer: int = 100,
) -> EpochPipeline:
    """Shards -> split by rank, then worker -> shard order of this epoch -> samples -> buffer -> batches.

    Yields ``(images, labels[, keys])`` batches, made inside the workers (use a loader with
    ``batch_size=None``, as :func:`webdataset_loader` does).
    """
    epoch = SharedEpoch()
    urls = urls if isinstance(urls, str) else [str(u) for u in urls]  # webdataset wants strings, not Paths
    columns = ("jpg", "cls", "__key__") if with_keys else ("jpg", "cls")
    return EpochPipeline(
        wds.SimpleShardList(urls),                          # a brace pattern or a list
        wds.split_by_node,                                  # rank r of R: every R-th shard
        wds.split_by_worker,                                # worker w of K: every K-th of those
        EpochShuffle(shard_buffer, epoch, seed, "shards", warn_on_repeat=True),  # new order each epoch
        wds.tarfile_to_samples(),                           # read each shard front to back, group by key
        EpochShuffle(buffer, epoch, seed, "samples"),       # the sample buffer, per worker
        wds.decode(wds.handle_extension("jpg", transform)), # our transform; .cls becomes an int
        wds.to_tuple(*columns),
        wds.batched(batch_size),                            # batches are made inside the workers
        epoch=epoch,
    )


def webdataset_loader(
    urls: str | Sequence[str | Path],
    workers: int = 2,
    *,
    timeout: float = 0,
    multiprocessing_context: str | None = None,
    persistent_workers: bool = False,
    **pipeline_options,
) -> DataLoader:
    """A DataLoader over :func:`webdataset_pipeline` (``batch_size=None``: the pipeline batches already).

    A plain ``torch.utils.data.DataLoader`` rather than ``wds.WebLoader``: ``WebLoader`` wraps
    its DataLoader in a pipeline and has no ``.dataset``, and the pipeline is what
    ``set_epoch`` is called on: ``loader.dataset.set_epoch(epoch)`` before each epoch, as
    :func:`packlab.bench.time_loader` does for every loader.
    """
    return DataLoader(webdataset_pipeline(urls, **pipeline_options), batch_size=None, num_workers=workers,
                      multiprocessing_context=multiprocessing_context if workers else None, timeout=timeout,
                      persistent_workers=persistent_workers and workers > 0)

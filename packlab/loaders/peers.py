"""The modern loaders the benchmark measures beside ours, reading the course's tar shards.

Each is set up the way its library's documentation sets up such a pipeline, and all end
in the course's transform and batching: Pillow decodes and resizes to uint8
(:func:`packlab.transforms.decode_and_resize`), and one float conversion per batch makes
the standard batch (:func:`packlab.loaders.batching.collate_uint8_images`). They read
the same shards with the same reader and shuffle (:func:`shard_samples`) in the main
process and differ in how they run the decoding in parallel:

* :class:`TorchdataNodesLoader`, ``torchdata.nodes`` 0.11: ``Batcher`` groups undecoded
  samples, ``ParallelMapper`` decodes each group on worker threads or worker processes
  (``method="thread"|"process"``) and restores their order, ``Loader`` iterates. Reading
  ``torchdata/nodes/map.py``: a thread feeds an input queue from the source, each worker
  takes items from it, and with ``method="process"`` the queues are
  ``torch.multiprocessing`` queues, so the encoded bytes go to the workers through a pipe
  and each float batch comes back in new shared memory; every worker, thread or process,
  calls ``torch.set_num_threads(1)`` first (``_apply_udf.py``).
* :class:`SpdlPipelineLoader`, SPDL 0.8: a ``PipelineBuilder`` pipeline whose source is
  iterated on its own thread, a ``pipe`` stage decoding samples on a thread pool
  (``concurrency`` at a time), ``aggregate`` into lists of ``batch_size`` and a ``pipe``
  stage collating them; its event loop runs in a background thread of this process.

``webdataset``, the third peer, reads its shards in DataLoader worker processes:
:mod:`packlab.loaders.with_webdataset`.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Sequence

from packlab.loaders.batching import collate_uint8_images
from packlab.loaders.tar import epoch_shard_order, iter_shard_samples, shuffle_buffer
from packlab.transforms import decode_and_resize


def shard_samples(shards: Sequence[str], seed: int = 0, buffer: int = 1000) -> Iterable:
    """A re-iterable stream of undecoded samples from every shard, shuffled as our tar loader shuffles them.

    The source the peers that read in the main process (torchdata.nodes, SPDL) start from:
    each pass permutes the shard order (a new permutation per pass) and shuffles samples in
    a buffer of ``buffer``; same shards, same reader, same shuffle as ``TarShardDataset``.
    """

    class Stream:
        def __init__(self):
            self.passes = 0

        def __iter__(self):
            order = epoch_shard_order(shards, seed, self.passes)
            rng = random.Random(f"buffer-{seed}-{self.passes}")
            self.passes += 1
            return shuffle_buffer((s for shard in order for s in iter_shard_samples(shard)), buffer, rng)

    return Stream()


def decode_sample(sample, transform: Callable = decode_and_resize, with_key: bool = False) -> tuple:
    """An undecoded shard sample to ``(uint8 pixels, label[, key])`` with the course's transform (or ``transform``)."""
    image = transform(sample.image_bytes, sample.source)
    return (image, sample.label, sample.key) if with_key else (image, sample.label)


def decode_batch(samples: Sequence, with_key: bool = False) -> list:
    """A list of undecoded shard samples to the standard ``[images, labels(, keys)]`` batch (the fast path)."""
    return collate_uint8_images([decode_sample(s, with_key=with_key) for s in samples])


class TorchdataNodesLoader:
    """torchdata.nodes: shard stream -> Batcher -> ParallelMapper(decode_batch, thread|process) -> Loader.

    Re-iterable: each pass is an epoch (the node graph resets and the stream starts again).
    ``multiprocessing_context`` is the start method of ``method="process"`` workers;
    ``with_keys=True`` adds each batch's keys.
    """

    def __init__(self, shards: Sequence[str], workers: int = 2, method: str = "thread", batch_size: int = 64,
                 seed: int = 0, multiprocessing_context: str | None = None, with_keys: bool = False):
        import torchdata.nodes as tn

        mapper = tn.ParallelMapper(
            tn.Batcher(tn.IterableWrapper(shard_samples(shards, seed)), batch_size=batch_size, drop_last=False),
            map_fn=functools.partial(decode_batch, with_key=with_keys), num_workers=max(1, workers), method=method,
            in_order=True,
            multiprocessing_context=multiprocessing_context if method == "process" else None,
        )
        self.loader = tn.Loader(mapper)

    def __iter__(self):
        return iter(self.loader)


class SpdlPipelineLoader:
    """SPDL: shard stream -> decode_sample on ``workers`` threads -> aggregate -> collate, a pipeline per epoch.

    Each pass builds and starts a pipeline and stops it at the end (or when the loop
    breaks early): a ``Pipeline`` is iterated once. ``transform(bytes, source)`` and
    ``collate`` default to the course's; the benchmark's stored-JPEG rows pass their own.
    """

    def __init__(self, shards: Sequence[str], workers: int = 2, batch_size: int = 64, seed: int = 0,
                 transform: Callable = decode_and_resize, collate: Callable = collate_uint8_images,
                 with_keys: bool = False):
        self.stream, self.workers, self.batch_size = shard_samples(shards, seed), max(1, workers), batch_size
        self.transform, self.collate, self.with_keys = transform, collate, with_keys

    def __iter__(self):
        from spdl.pipeline import PipelineBuilder

        pipeline = (
            PipelineBuilder()
            .add_source(self.stream)
            .pipe(functools.partial(decode_sample, transform=self.transform, with_key=self.with_keys),
                  concurrency=self.workers)
            .aggregate(self.batch_size)
            .pipe(self.collate)
            .add_sink(2)
            .build(num_threads=self.workers)
        )
        with pipeline.auto_stop():
            yield from pipeline

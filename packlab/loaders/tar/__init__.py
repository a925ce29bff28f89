"""Read WebDataset-style tar shards with an ``IterableDataset``.

A map-style dataset answers "give me sample *i*" and so needs random access. A tar shard
is read front to back, so the dataset is *iterable* instead: each DataLoader worker gets
an iterator over its own shards and yields their samples in turn. One epoch, stage by
stage:

1. **Shard list.** Paths or URLs, or a brace pattern such as ``shard-{000000..000009}.tar``
   (:func:`packlab.pack.expand_pattern`).
2. **Shard order.** Reshuffled every epoch from ``(seed, epoch)``. Every rank and every
   worker computes the *same* order, so the split below cuts one list into disjoint
   parts rather than cutting several different lists. The epoch is set in the training
   process and read by the workers through shared memory (:class:`SharedEpoch`), so it
   reaches persistent workers too.
3. **Split.** By rank first (``order[rank::world_size]``), then by worker
   (``mine[worker::num_workers]``). Without the worker split every worker reads every
   shard and each sample arrives ``num_workers`` times.
4. **Read.** Header, contents, header, contents, front to back, never seeking, so the
   same code reads a local file, a pipe or an HTTP response (:func:`open_shard`,
   :func:`iter_tar_members`).
5. **Group.** Consecutive members that share a key (``000123.cls``, ``000123.jpg``) form
   one sample.
6. **Shuffle buffer.** A bounded buffer shuffles samples *locally* (:func:`shuffle_buffer`).
   It holds encoded bytes (about 110 kB a sample here, as in ImageNet), not decoded
   tensors (786 kB).
7. **Decode + transform.** :func:`packlab.transforms.standard_transform`, as in every
   loader of the course.

Why not :mod:`tarfile` in streaming mode (``"r|"``)? It works, but it stops *silently* at a header it cannot parse or at a file
cut off between two members (it takes either for the end of the archive), and its
general machinery costs more per member than the few lines a sample stream needs. So
:func:`iter_tar_members` reads the format itself, checks every header's checksum and
insists on tar's end-of-archive marker; and :func:`group_samples` insists that every
sample has all of its files.

The stages live in four modules, re-exported here: :mod:`.splitting` (stages 2 and 3),
:mod:`.reading` (4 and 5), :mod:`.shuffling` (6) and :mod:`.dataset`
(:class:`TarShardDataset`, which puts them together and decodes, stage 7).
"""

from packlab.loaders.tar.dataset import RawSampleDecoding, TarShardDataset, skip_decode
from packlab.loaders.tar.reading import (
    IMAGE_EXTENSION,
    LABEL_EXTENSION,
    REQUIRED_EXTENSIONS,
    RawSample,
    ShardError,
    ShardOpener,
    count_samples,
    group_samples,
    iter_sample_spans,
    iter_shard_samples,
    iter_tar_members,
    open_shard,
    read_sample_spans,
    split_key,
)
from packlab.loaders.tar.shuffling import label_mixing, shuffle_buffer
from packlab.loaders.tar.splitting import (
    RepeatedEpochWarning,
    SharedEpoch,
    ShardSplitError,
    check_shard_split,
    distributed_rank_and_world_size,
    epoch_shard_order,
    shard_assignment,
    split_shards_by_rank,
    split_shards_by_worker,
)

__all__ = [
    "IMAGE_EXTENSION", "LABEL_EXTENSION", "REQUIRED_EXTENSIONS", "RawSample", "RawSampleDecoding",
    "RepeatedEpochWarning", "ShardError", "ShardOpener", "ShardSplitError", "SharedEpoch", "TarShardDataset",
    "check_shard_split", "count_samples", "distributed_rank_and_world_size", "epoch_shard_order", "group_samples",
    "iter_sample_spans", "iter_shard_samples", "iter_tar_members", "label_mixing", "open_shard",
    "read_sample_spans", "shard_assignment", "shuffle_buffer", "skip_decode", "split_key",
    "split_shards_by_rank", "split_shards_by_worker",
]

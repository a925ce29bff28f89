"""The line-up: every loader of the course and its modern peers, built the same way to be compared.

:func:`loader_factories` gives each a name, a group (ours, a peer, or a variant that
explains a ratio) and a ``make(workers)`` function; chapter 8 and ``make bench`` time them
side by side on the same shards, with the same transform and batch size.
"""

from __future__ import annotations

import torch

#: Which loaders are the course's own and which are peers; "variant" rows explain a ratio.
OURS, PEER, VARIANT = "ours", "peer", "variant"
#: Loaders that read the dataset re-encoded at the training size (chapter 11), ours and peers:
#: they do not decode the originals, so they are compared with the decode ceiling apart from the rest.
STORED_OURS, STORED_PEER = "stored, ours", "stored, peer"
#: The course's original loaders, also swept over worker counts.
SWEPT = ("JPEG folder", "zip, per-worker handle", "tar shards (ours)", "webdataset")
#: The rows that need ``stored_shards`` (:func:`loader_factories`).
STORED_LOADERS = ("stored 256 px JPEG, uint8 (ours)", "stored 256 px JPEG, recycling (ours)",
                  "webdataset, stored 256 px JPEG", "SPDL, stored 256 px JPEG")


def loader_factories(root, shards: list[str], zip_path, batch_size: int = 64, seed: int = 0,
                     stored_shards: list[str] | None = None) -> dict:
    """name -> ``(group, make(workers))``: every loader of the benchmark, all giving standard float batches.

    All use the same transform: decode and resize to uint8 with Pillow, then one float
    conversion per batch (:func:`packlab.loaders.batching.collate_uint8_images`, or the
    same arithmetic straight into a batch buffer). Map-style loaders read in shuffled
    order, shard readers shuffle in a buffer of 1,000 samples. ``tar, per-sample float``
    converts per sample and stacks with the default collate, to show what batching buys.
    ``tar shards, uint8 to the consumer`` hands uint8 batches over and converts them in
    the training process (:class:`packlab.loaders.batching.FloatBatches`).

    With ``stored_shards`` (the same samples re-encoded at 256 x 256 by
    :mod:`packlab.reencode`) come the rows of :data:`STORED_LOADERS`: each decodes the
    small JPEGs with torchvision (:func:`packlab.decode.stored_decode`); ``uint8`` hands
    uint8 batches over and converts them in the training process (into recycled buffers),
    ``recycling`` converts in the workers straight into chapter 8's recycled shared batch
    buffers, so no batch is built in fresh memory on either side. The peers get the same
    decoder and the uint8 hand-over, not a handicap.
    """
    from torch.utils.data import DataLoader

    from packlab.loaders import JpegFolderDataset, RecyclingLoader, TarShardDataset, ThreadLoader, ZipDataset
    from packlab.loaders import streaming_peers
    from packlab.loaders.batching import FloatBatches, collate_uint8_batch, collate_uint8_images
    from packlab.loaders.peers import SpdlPipelineLoader, TorchdataNodesLoader
    from packlab.loaders.with_webdataset import webdataset_loader
    from packlab.transforms import decode_and_resize

    def context(workers):
        return "fork" if workers else None

    def order():
        return torch.Generator().manual_seed(seed)

    def shuffled(dataset, workers):
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=order(), num_workers=workers,
                          collate_fn=collate_uint8_images, multiprocessing_context=context(workers))

    def tar_dataset(fast=True):
        return TarShardDataset(shards, shuffle_buffer=1000, seed=seed,
                               **({"transform": decode_and_resize} if fast else {}))

    def tar(workers, fast=True):
        return DataLoader(tar_dataset(fast), batch_size=batch_size, num_workers=workers,
                          multiprocessing_context=context(workers),
                          **({"collate_fn": collate_uint8_images} if fast else {}))

    def zip_dataset():
        return ZipDataset(zip_path, transform=decode_and_resize)

    def uint8_tar(workers, shard_list, transform):
        dataset = TarShardDataset(shard_list, shuffle_buffer=1000, seed=seed, transform=transform)
        return FloatBatches(DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                       multiprocessing_context=context(workers), collate_fn=collate_uint8_batch))

    stored = {}
    if stored_shards is not None:
        from packlab.decode import stored_decode, stored_decode_hwc  # import torchvision, which the rest do not need

        stored = {
            STORED_LOADERS[0]: (STORED_OURS, lambda w: uint8_tar(w, stored_shards, stored_decode)),
            STORED_LOADERS[1]: (STORED_OURS, lambda w: RecyclingLoader(
                TarShardDataset(stored_shards, shuffle_buffer=1000, seed=seed, transform=stored_decode_hwc),
                batch_size=batch_size, workers=max(1, w), multiprocessing_context="fork")),
            STORED_LOADERS[2]: (STORED_PEER, lambda w: FloatBatches(webdataset_loader(
                stored_shards, w, multiprocessing_context=context(w), batch_size=batch_size, with_keys=False,
                transform=stored_decode, collation_fn=collate_uint8_batch))),
            STORED_LOADERS[3]: (STORED_PEER, lambda w: FloatBatches(SpdlPipelineLoader(
                stored_shards, w, batch_size, seed, transform=stored_decode, collate=collate_uint8_batch))),
        }

    return {
        "JPEG folder": (OURS, lambda w: shuffled(JpegFolderDataset(root, transform=decode_and_resize), w)),
        "zip, per-worker handle": (OURS, lambda w: shuffled(zip_dataset(), w)),
        "tar shards (ours)": (OURS, tar),
        "threads, zip": (OURS, lambda w: ThreadLoader(zip_dataset(), batch_size=batch_size, threads=max(1, w),
                                                      shuffle=True, generator=order())),
        "threads, tar shards": (OURS, lambda w: ThreadLoader(tar_dataset(), batch_size=batch_size, threads=max(1, w))),
        "recycling, zip": (OURS, lambda w: RecyclingLoader(zip_dataset(), batch_size=batch_size, workers=max(1, w),
                                                           shuffle=True, generator=order(),
                                                           multiprocessing_context="fork")),
        "recycling, tar shards": (OURS, lambda w: RecyclingLoader(tar_dataset(), batch_size=batch_size,
                                                                  workers=max(1, w), multiprocessing_context="fork")),
        "webdataset": (PEER, lambda w: webdataset_loader(
            shards, w, multiprocessing_context=context(w), batch_size=batch_size, with_keys=False,
            transform=decode_and_resize, collation_fn=collate_uint8_images)),
        "torchdata.nodes, threads": (PEER, lambda w: TorchdataNodesLoader(shards, w, "thread", batch_size, seed)),
        "torchdata.nodes, processes": (PEER, lambda w: TorchdataNodesLoader(shards, w, "process", batch_size, seed,
                                                                                     multiprocessing_context="fork")),
        "SPDL, threads": (PEER, lambda w: SpdlPipelineLoader(shards, w, batch_size, seed)),
        "tar shards, uint8 to the consumer": (OURS, lambda w: uint8_tar(w, shards, decode_and_resize)),
        # Their own formats, written once from the same samples in the same order (packlab.loaders.streaming_peers),
        # read with their default (recommended) shuffles: MDS's py1e block shuffle, LitData's chunk + window shuffle.
        "MosaicML Streaming (MDS)": (PEER, lambda w: streaming_peers.mds_loader(
            streaming_peers.ensure_mds(root), w, batch_size, seed)),
        "LitData": (PEER, lambda w: streaming_peers.litdata_loader(
            streaming_peers.ensure_litdata(root), w, batch_size, seed)),
        "tar, per-sample float": (VARIANT, lambda w: tar(w, fast=False)),
        **stored,
    }

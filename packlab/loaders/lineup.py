"""The line-up: every loader of the course and its modern peers, built the same way to be compared.

:func:`loader_factories` gives each a name, a group (ours, a peer, or a variant that
explains a ratio) and a ``make(workers)`` function; chapter 8 and ``make bench`` time them
side by side on the same shards, with the same transform and batch size.
"""

from __future__ import annotations

import torch

#: Which loaders are the course's own and which are peers; "variant" rows explain a ratio.
OURS, PEER, VARIANT = "ours", "peer", "variant"
#: The course's original loaders, also swept over worker counts.
SWEPT = ("JPEG folder", "zip, per-worker handle", "tar shards (ours)", "webdataset")


def loader_factories(root, shards: list[str], zip_path, batch_size: int = 64, seed: int = 0) -> dict:
    """name -> ``(group, make(workers))``: every loader of the benchmark, all giving standard float batches.

    All use the same transform: decode and resize to uint8 with Pillow, then one float
    conversion per batch (:func:`packlab.loaders.batching.collate_uint8_images`, or the
    same arithmetic straight into a batch buffer). Map-style loaders read in shuffled
    order, shard readers shuffle in a buffer of 1,000 samples. ``tar, per-sample float``
    converts per sample and stacks with the default collate, to show what batching buys.
    """
    from torch.utils.data import DataLoader

    from packlab.loaders import JpegFolderDataset, RecyclingLoader, TarShardDataset, ThreadLoader, ZipDataset
    from packlab.loaders import streaming_peers
    from packlab.loaders.batching import collate_uint8_images
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
        # Their own formats, written once from the same samples in the same order (packlab.loaders.streaming_peers),
        # read with their default (recommended) shuffles: MDS's py1e block shuffle, LitData's chunk + window shuffle.
        "MosaicML Streaming (MDS)": (PEER, lambda w: streaming_peers.mds_loader(
            streaming_peers.ensure_mds(root), w, batch_size, seed)),
        "LitData": (PEER, lambda w: streaming_peers.litdata_loader(
            streaming_peers.ensure_litdata(root), w, batch_size, seed)),
        "tar, per-sample float": (VARIANT, lambda w: tar(w, fast=False)),
    }

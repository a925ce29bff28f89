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
#: The training transform's rows (:func:`crop_factories`): the standard pipeline, ours, DALI.
CROPS_STANDARD, CROPS_OURS, CROPS_PEER = "crops, standard", "crops, ours", "crops, peer"


def loader_factories(root, shards: list[str], zip_path, batch_size: int = 64, seed: int = 0,
                     stored_shards: list[str] | None = None, with_keys: bool = False) -> dict:
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

    ``with_keys=True`` makes every loader deliver ``[images, labels, keys]``, so that each
    epoch can be audited (``make bench`` does); the keys cost a tuple of strings per batch.
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

    keys = {"return_key": True} if with_keys else {}

    def shuffled(dataset, workers):
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=order(), num_workers=workers,
                          collate_fn=collate_uint8_images, multiprocessing_context=context(workers))

    def tar_dataset(fast=True):
        return TarShardDataset(shards, shuffle_buffer=1000, seed=seed, **keys,
                               **({"transform": decode_and_resize} if fast else {}))

    def tar(workers, fast=True):
        return DataLoader(tar_dataset(fast), batch_size=batch_size, num_workers=workers,
                          multiprocessing_context=context(workers),
                          **({"collate_fn": collate_uint8_images} if fast else {}))

    def zip_dataset():
        return ZipDataset(zip_path, transform=decode_and_resize, **keys)

    def uint8_tar(workers, shard_list, transform):
        dataset = TarShardDataset(shard_list, shuffle_buffer=1000, seed=seed, transform=transform, **keys)
        return FloatBatches(DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                       multiprocessing_context=context(workers), collate_fn=collate_uint8_batch))

    stored = {}
    if stored_shards is not None:
        from packlab.decode import stored_decode, stored_decode_hwc  # import torchvision, which the rest do not need

        stored = {
            STORED_LOADERS[0]: (STORED_OURS, lambda w: uint8_tar(w, stored_shards, stored_decode)),
            STORED_LOADERS[1]: (STORED_OURS, lambda w: RecyclingLoader(
                TarShardDataset(stored_shards, shuffle_buffer=1000, seed=seed, transform=stored_decode_hwc, **keys),
                batch_size=batch_size, workers=max(1, w), multiprocessing_context="fork")),
            STORED_LOADERS[2]: (STORED_PEER, lambda w: FloatBatches(webdataset_loader(
                stored_shards, w, multiprocessing_context=context(w), batch_size=batch_size, with_keys=with_keys,
                transform=stored_decode, collation_fn=collate_uint8_batch))),
            STORED_LOADERS[3]: (STORED_PEER, lambda w: FloatBatches(SpdlPipelineLoader(
                stored_shards, w, batch_size, seed, transform=stored_decode, collate=collate_uint8_batch,
                with_keys=with_keys))),
        }

    return {
        "JPEG folder": (OURS, lambda w: shuffled(JpegFolderDataset(root, transform=decode_and_resize, **keys), w)),
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
            shards, w, multiprocessing_context=context(w), batch_size=batch_size, with_keys=with_keys,
            transform=decode_and_resize, collation_fn=collate_uint8_images)),
        "torchdata.nodes, threads": (PEER, lambda w: TorchdataNodesLoader(shards, w, "thread", batch_size, seed,
                                                                         with_keys=with_keys)),
        "torchdata.nodes, processes": (PEER, lambda w: TorchdataNodesLoader(shards, w, "process", batch_size, seed,
                                                                           multiprocessing_context="fork",
                                                                           with_keys=with_keys)),
        "SPDL, threads": (PEER, lambda w: SpdlPipelineLoader(shards, w, batch_size, seed, with_keys=with_keys)),
        "tar shards, uint8 to the consumer": (OURS, lambda w: uint8_tar(w, shards, decode_and_resize)),
        # Their own formats, written once from the same samples in the same order (packlab.loaders.streaming_peers),
        # read with their default (recommended) shuffles: MDS's py1e block shuffle, LitData's chunk + window shuffle.
        "MosaicML Streaming (MDS)": (PEER, lambda w: streaming_peers.mds_loader(
            streaming_peers.ensure_mds(root), w, batch_size, seed, with_key=with_keys,
            collate_fn=collate_uint8_images)),
        "LitData": (PEER, lambda w: streaming_peers.litdata_loader(
            streaming_peers.ensure_litdata(root), w, batch_size, seed, with_key=with_keys,
            collate_fn=collate_uint8_images)),
        "tar, per-sample float": (VARIANT, lambda w: tar(w, fast=False)),
        **stored,
    }


def crop_factories(original_shards: list[str], stored_shards: list[str], batch_size: int = 64, seed: int = 0,
                   with_keys: bool = False, dali: bool = True) -> dict:
    """name -> ``(group, make(workers))``: the training transform's pipelines, all delivering the same kind of batch.

    Every row delivers uint8 224 x 224 random resized crops with their flips
    (:mod:`packlab.crops`), batches of ``batch_size``, to the training process, which
    normalises them (on the GPU in a real job):

    * ``crops: standard (originals, Pillow)``: torchvision's transform on Pillow images
      (:func:`packlab.crops.crop_reference`) of the original JPEGs, in DataLoader workers,
      batched N x C x H x W;
    * ``crops: ours (...)``: the course's crop decoder (:func:`packlab.crops.crop_fast`) on
      the originals, and on ``stored_shards`` (the dataset stored at a maximum side, aspect
      kept), batched as ``channels_last`` (:func:`packlab.loaders.batching.collate_channels_last`);
    * ``crops: DALI CPU (...)``: DALI's own pipeline on the same shards
      (:class:`packlab.loaders.dali_pipeline.DaliLoader`, ``threads = workers``), when DALI
      is installed and ``dali`` is true.

    The DataLoaders keep their workers (``persistent_workers=True``), as a training job does;
    each sample's crop comes from ``(seed, epoch, key)``, so every run draws the same crops.
    """
    from torch.utils.data import DataLoader

    from packlab.crops import RandomCrops, crop_fast, crop_reference, encoded
    from packlab.loaders import TarShardDataset
    from packlab.loaders.batching import collate_channels_last, collate_uint8_hwc_as_chw

    def crops(shard_list, decode, collate, workers):
        dataset = RandomCrops(TarShardDataset(shard_list, shuffle_buffer=1000, seed=seed, transform=encoded,
                                              return_key=True), decode=decode, seed=seed, return_key=with_keys)
        return DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate,
                          multiprocessing_context="fork" if workers else None, persistent_workers=workers > 0)

    out = {
        CROP_ROWS["standard"]: (CROPS_STANDARD, lambda w: crops(original_shards, crop_reference,
                                                                collate_uint8_hwc_as_chw, w)),
        CROP_ROWS["ours, originals"]: (CROPS_OURS, lambda w: crops(original_shards, crop_fast, collate_channels_last, w)),
        CROP_ROWS["ours, stored"]: (CROPS_OURS, lambda w: crops(stored_shards, crop_fast, collate_channels_last, w)),
    }
    if dali:
        from packlab.loaders.dali_pipeline import DaliLoader, dali_status

        if dali_status() is None:
            out[CROP_ROWS["DALI, originals"]] = (CROPS_PEER, lambda w: DaliLoader(
                original_shards, "crop", batch_size, threads=max(1, w), seed=seed))
            out[CROP_ROWS["DALI, stored"]] = (CROPS_PEER, lambda w: DaliLoader(
                stored_shards, "crop", batch_size, threads=max(1, w), seed=seed))
    return out


#: The names of :func:`crop_factories`' rows.
CROP_ROWS = {"standard": "crops: standard (originals, Pillow)",
             "ours, originals": "crops: ours (originals)",
             "ours, stored": "crops: ours (stored, max side)",
             "DALI, originals": "crops: DALI CPU (originals)",
             "DALI, stored": "crops: DALI CPU (stored, max side)"}

"""NVIDIA DALI as a peer: its own pipeline over the course's tar shards, on the CPU (or the GPU where there is one).

DALI runs a graph of operators on a pool of threads of its own, in the training process:
no worker processes, no pickling, batches assembled in DALI's memory. The pipeline here
is the one its documentation builds for ImageNet training, reading the course's shards:

* ``fn.readers.webdataset(paths=shards, index_paths=..., ext=["jpg", "cls"],
  random_shuffle=True, ...)`` reads the tar shards through DALI's index files (written
  once with DALI's ``wds2idx``, :func:`ensure_index`) and shuffles through a buffer of
  ``initial_fill`` samples, like the course's reader;
* ``fn.decoders.image_random_crop`` (``mode="crop"``) decodes a random window with
  torchvision's defaults (area 8-100 %, aspect 3/4-4/3, 10 attempts) using nvImageCodec's
  region-of-interest decoding ("When possible, the operator uses the ROI decoding",
  DALI's operator documentation), then ``fn.resize`` to 224 x 224; or
  ``fn.decoders.image`` + ``fn.resize`` to 256 x 256 (``mode="squash"``, the standard
  transform's shape);
* ``fn.crop_mirror_normalize`` mirrors half of the crops (``fn.random.coin_flip``) and
  lays the batch out as N x H x W x C uint8, which is handed over as a ``channels_last``
  N x C x H x W torch tensor without a copy (DLPack), like the course's
  :func:`~packlab.loaders.batching.collate_channels_last`.

An epoch is the reader's ``epoch_size`` samples: with ``pad_last_batch=True`` the reader
fills the last batch with copies of its last sample instead of starting the next epoch,
and :class:`DaliLoader` drops those copies, as ``LastBatchPolicy.PARTIAL`` does in DALI's
own PyTorch iterator. Each sample's key comes from ``fn.get_property(jpegs,
key="source_info")`` (``<shard>:<offset>:<key>.jpg``), so an epoch can be audited like any
loader's. DALI is not in the attendees' install (it is the ``dali`` extra of
``pyproject.toml``, which ``make book``, ``make bench`` and ``make test`` install):
:func:`dali_status` says whether it is here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

#: The operators' arguments for torchvision's RandomResizedCrop defaults.
RANDOM_AREA, RANDOM_ASPECT_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def dali_status() -> str | None:
    """None when DALI can build a CPU pipeline here, else why not (in words)."""
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        return ("DALI is not installed (the `dali` extra: `uv pip install -e '.[dali]'`; `make book`, `make bench` "
                "and `make test` install it)")
    return None


def ensure_index(shard: str) -> str:
    """The DALI index of a tar shard (``<shard>.idx``), written once with DALI's own ``wds2idx``.

    Without an index the reader scans each shard when the pipeline starts, and says so on
    stderr ("Index file not provided, it may take some time..."). The index lists each
    sample's members with their offsets and sizes; it is rewritten when the shard is newer.
    """
    import os
    from pathlib import Path

    from wds2idx import IndexCreator

    index = Path(f"{shard}.idx")
    if index.exists() and index.stat().st_mtime_ns >= Path(shard).stat().st_mtime_ns:
        return str(index)
    partial = index.with_name(f"{index.name}.{os.getpid()}.partial")
    with IndexCreator(str(shard), str(partial), verbose=False) as creator:
        creator.create_index()
    partial.replace(index)
    return str(index)


def key_of(source_info: str) -> str:
    """The sample key in a webdataset reader's ``source_info`` (``"<shard>:<offset>:<key>.jpg"``)."""
    member = source_info.rsplit(":", 1)[-1]
    return member.rsplit(".", 1)[0]


def _pipeline(shards: Sequence[str], mode: str, batch_size: int, threads: int, seed: int, device: str,
              size: int, shuffle_buffer: int):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=0 if device == "mixed" else None, seed=seed,
                  prefetch_queue_depth=2, exec_dynamic=True)
    def build():
        jpegs, labels = fn.readers.webdataset(paths=list(shards), index_paths=[ensure_index(s) for s in shards],
                                              ext=["jpg", "cls"], random_shuffle=shuffle_buffer > 1,
                                              initial_fill=max(1, shuffle_buffer), pad_last_batch=True,
                                              missing_component_behavior="error", name="Reader")
        info = fn.get_property(jpegs, key="source_info")
        if mode == "crop":
            images = fn.decoders.image_random_crop(jpegs, device=device, output_type=types.RGB,
                                                   random_area=list(RANDOM_AREA),
                                                   random_aspect_ratio=list(RANDOM_ASPECT_RATIO), num_attempts=10)
            images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR, antialias=True)
            mirror = fn.random.coin_flip(probability=0.5)
        else:
            images = fn.decoders.image(jpegs, device=device, output_type=types.RGB)
            images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR, antialias=True)
            mirror = 0
        images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="HWC", mirror=mirror)
        return images, labels, info

    pipe = build()
    pipe.build()
    return pipe


class DaliLoader:
    """A DALI pipeline over tar shards, iterated an epoch at a time: ``[images, labels, keys]`` per batch.

    ``mode="crop"``: the training transform (random resized crop to ``size``, default 224,
    and a flip); ``mode="squash"``: decode and resize to ``size`` x ``size`` (default 256).
    ``threads`` is DALI's thread pool (one per core, as the loaders' workers);
    ``device="mixed"`` decodes on the GPU (nvJPEG) where there is one. Images are uint8,
    ``channels_last`` N x C x H x W, on the CPU (``device="cpu"``) or the GPU.
    ``.dataset.set_epoch`` exists so the course's timers can call it; DALI's reader
    reshuffles every epoch by itself.
    """

    class _Epochs:
        def set_epoch(self, epoch: int) -> None:  # the reader draws each epoch's order itself
            self.epoch = epoch

    def __init__(self, shards: Sequence[str], mode: str = "crop", batch_size: int = 64, threads: int = 2, seed: int = 0,
                 device: str = "cpu", size: int | None = None, shuffle_buffer: int = 1000):
        if mode not in ("crop", "squash"):
            raise ValueError(f"mode must be 'crop' or 'squash', not {mode!r}")
        why = dali_status()
        if why is not None:
            raise RuntimeError(why)
        self.mode, self.batch_size, self.device = mode, batch_size, device
        size = size if size is not None else (224 if mode == "crop" else 256)
        self.pipe = _pipeline([str(s) for s in shards], mode, batch_size, threads, seed, device, size, shuffle_buffer)
        self.epoch_size = int(self.pipe.reader_meta("Reader")["epoch_size"])
        self.dataset = self._Epochs()

    def __len__(self) -> int:
        return math.ceil(self.epoch_size / self.batch_size)

    def __iter__(self):
        delivered = 0
        for _ in range(len(self)):
            images, labels, info = self.pipe.run()
            take = min(self.batch_size, self.epoch_size - delivered)
            delivered += take
            yield self._batch(images, labels, info, take)

    def _batch(self, images, labels, info, take: int) -> list:
        # DALI's own memory, on the CPU or the GPU, without a copy; the dynamic executor (exec_dynamic=True) keeps
        # a returned batch intact while the pipeline runs on, for as long as the tensor refers to it.
        nhwc = torch.from_dlpack(images.as_tensor())
        label_values = [int(bytes(np.asarray(labels[i])).decode()) for i in range(take)]
        keys = tuple(key_of(bytes(np.asarray(info[i])).decode()) for i in range(take))
        return [nhwc[:take].permute(0, 3, 1, 2), torch.tensor(label_values, dtype=torch.int64), keys]

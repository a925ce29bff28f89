"""Turn decoded uint8 images into the standard float batch in one step.

Every loader's default transform returns each image as a float tensor (3x256x256, values
in [0, 1]) and the DataLoader's default collate then stacks those into a batch. That is
simple, and it moves a lot of memory: each float image is 786 kB, written once by the
transform, read and written again by the stack, and the stacked batch (50 MB for 64
images) is then handed to the main process through shared memory.

The fast path in this module gives *the same batches* with less traffic. The dataset
stops at uint8 pixels (``transform=packlab.transforms.decode_and_resize``, 196 kB an
image), and :func:`collate_uint8_images` stacks those and converts the whole batch to
float in one pass, writing straight into shared memory when it runs in a worker (which
is what the default collate does too, so nothing is copied again on the way to the main
process); raw-pixel archives pair with
``transform=packlab.transforms.raw_to_array`` the same way::

    dataset = ZipDataset(path, transform=decode_and_resize)
    loader = DataLoader(dataset, batch_size=64, num_workers=2, collate_fn=collate_uint8_images)

The conversion is the same arithmetic as :func:`packlab.transforms.to_tensor`
(``float32(pixel) / 255``), so the pixels are bit-identical to the default path; the
tests check it.

**uint8 to the consumer.** The float batch is four times the bytes of its pixels, and
crossing into the training process in fresh shared memory costs a page fault per 4 kB
(chapter 8). :func:`collate_uint8_batch` stops one step earlier: the batch crosses as
uint8, N x 3 x H x W, and the *consumer* converts it (:func:`to_float_batch`; with
:class:`FloatBatches` around any loader), on the GPU when there is one, where the
conversion is nearly free and the copy to the device is four times smaller too::

    loader = FloatBatches(DataLoader(dataset, batch_size=64, num_workers=2, collate_fn=collate_uint8_batch))

The conversion there is again ``float32(pixel) / 255`` on the CPU, so the batches are
bit-identical to the standard ones (:mod:`packlab.audit` audits uint8 batches through it).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from packlab.transforms import to_tensor



def empty_batch(shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` and ``dtype``; in shared memory inside a DataLoader worker.

    A batch built in a worker travels to the main process through shared memory. Built
    there from the start, it is not copied on the way (the default collate does the same).
    """
    if get_worker_info() is None:
        return torch.empty(tuple(shape), dtype=dtype)
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(math.prod(shape), device="cpu")
    return torch.empty(0, dtype=dtype).new(storage).view(tuple(shape))


def empty_float_batch(shape: Sequence[int]) -> torch.Tensor:
    """An uninitialised float32 batch of ``shape``, in shared memory inside a DataLoader worker."""
    return empty_batch(shape, torch.float32)


def images_to_float_batch(images: Sequence[np.ndarray]) -> torch.Tensor:
    """uint8 images, each height x width x channels, to one float32 batch, N x C x H x W in [0, 1]."""
    if not images:
        raise ValueError("cannot make a batch of no images")
    first = np.asarray(images[0])
    if first.dtype != np.uint8 or first.ndim != 3:
        raise TypeError(f"expected uint8 height x width x channels images, got {first.dtype} {first.shape}")
    height, width, channels = first.shape
    out = empty_float_batch((len(images), channels, height, width))
    for i, image in enumerate(images):
        # Straight into the image's slot in the batch: no per-image float tensor, no stacking copy.
        to_tensor(np.asarray(image), out=out[i])
    return out


def collate_uint8_images(samples: Sequence[tuple]) -> list:
    """Collate ``(uint8 image, label)`` or ``(uint8 image, label, key)`` samples.

    Returns ``[images, labels]`` (or ``[images, labels, keys]``), exactly what the default
    collate returns for the standard float samples: images a float32 N x 3 x 256 x 256
    tensor, labels an int64 tensor, keys a tuple of strings.
    """
    columns = list(zip(*samples))
    if not columns:
        raise ValueError("cannot collate an empty batch")
    images, labels = columns[0], columns[1]
    batch = [images_to_float_batch(images), torch.tensor(labels, dtype=torch.int64)]
    if len(columns) > 2:
        batch.append(columns[2])  # a tuple of strings, as the default collate gives
    return batch


# ------------------------------------------------------------------ uint8 to the consumer


def _channels_first(image) -> torch.Tensor:
    """A uint8 image as a 3 x H x W tensor (a view): from a C x H x W tensor or an H x W x C array."""
    if isinstance(image, torch.Tensor):
        if image.dtype != torch.uint8 or image.dim() != 3:
            raise TypeError(f"expected a uint8 channels x height x width tensor, got {image.dtype} {tuple(image.shape)}")
        return image
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3:
        raise TypeError(f"expected uint8 height x width x channels pixels, got {array.dtype} {array.shape}")
    with warnings.catch_warnings():
        # Arrays over PIL images or bytes are read-only; we only read them.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(array).permute(2, 0, 1)


def images_to_uint8_batch(images: Sequence) -> torch.Tensor:
    """uint8 images (C x H x W tensors or H x W x C arrays) to one N x C x H x W uint8 batch, still uint8.

    Each image is copied once, straight into its slot (channels first), in shared memory
    inside a worker: a quarter of the bytes the float batch would have.
    """
    if not images:
        raise ValueError("cannot make a batch of no images")
    first = _channels_first(images[0])
    out = empty_batch((len(images), *first.shape), torch.uint8)
    for i, image in enumerate(images):
        image = _channels_first(image)
        if image.shape != first.shape:
            raise ValueError(f"image {i} of the batch is {tuple(image.shape)}, the first {tuple(first.shape)}: "
                             "resize every image to the same size before batching")
        out[i].copy_(image)
    return out


def collate_uint8_batch(samples: Sequence[tuple]) -> list:
    """Collate ``(uint8 image, label[, key])`` samples into ``[uint8 images, labels(, keys)]``: nothing converted.

    The images stay uint8, N x 3 x H x W, for the consumer to convert
    (:func:`to_float_batch`); labels an int64 tensor, keys a tuple of strings, as the
    default collate gives.
    """
    return collate_with(images_to_uint8_batch, samples)


def collate_with(make_images, samples: Sequence[tuple]) -> list:
    """``[make_images(images), int64 labels(, keys)]`` from ``(image, label[, key])`` samples, as the default collate lays them out."""
    columns = list(zip(*samples))
    if not columns:
        raise ValueError("cannot collate an empty batch")
    batch = [make_images(columns[0]), torch.tensor(columns[1], dtype=torch.int64)]
    if len(columns) > 2:
        batch.append(columns[2])  # a tuple of strings, as the default collate gives
    return batch


# ------------------------------------------------------------------ channels last


def _hwc_tensor(image) -> torch.Tensor:
    """A uint8 height x width x channels image (array or tensor) as a tensor, without copying."""
    if isinstance(image, torch.Tensor):
        tensor = image
    else:
        array = np.asarray(image)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays over PIL images: we only read them
            tensor = torch.from_numpy(array)
    if tensor.dtype != torch.uint8 or tensor.dim() != 3:
        raise TypeError(f"expected uint8 height x width x channels pixels, got {tensor.dtype} {tuple(tensor.shape)}")
    return tensor


def write_uint8_hwc(image, out: torch.Tensor) -> None:
    """Copy one uint8 H x W x C image into its slot ``out`` (H x W x C) of an N x H x W x C batch: a plain copy."""
    pixels = _hwc_tensor(image)
    if pixels.shape != out.shape:
        raise ValueError(f"image of shape {tuple(pixels.shape)} for a batch of {tuple(out.shape)} images (H x W x C): "
                         "crop or resize every image to the same size before batching")
    out.copy_(pixels)


def write_uint8_chw(image, out: torch.Tensor) -> None:
    """Copy one uint8 H x W x C image into its slot ``out`` (C x H x W): a strided copy, pixel by pixel."""
    out.copy_(_hwc_tensor(image).permute(2, 0, 1))


def images_to_channels_last(images: Sequence) -> torch.Tensor:
    """uint8 H x W x C images to one batch built N x H x W x C and handed over as a ``channels_last`` N x C x H x W.

    Every decoder here writes pixels interleaved (H x W x C), so each image is one
    contiguous copy into its slot. The batch returned is ``nhwc.permute(0, 3, 1, 2)``: the
    shape a model expects (N x C x H x W) with the memory of N x H x W x C, which is
    exactly what ``torch.channels_last`` means (``is_contiguous(memory_format=
    torch.channels_last)``), so ``model.to(memory_format=torch.channels_last)`` takes it
    as it is, on the CPU or after ``.to("cuda")``, which keeps the layout. The standard
    N x C x H x W batch instead costs a strided copy per image (:func:`write_uint8_chw`).
    Built in shared memory inside a worker.
    """
    if not images:
        raise ValueError("cannot make a batch of no images")
    first = _hwc_tensor(images[0])
    out = empty_batch((len(images), *first.shape), torch.uint8)
    for i, image in enumerate(images):
        write_uint8_hwc(image, out[i])
    return out.permute(0, 3, 1, 2)


def collate_channels_last(samples: Sequence[tuple]) -> list:
    """Collate ``(uint8 H x W x C image, label[, key])`` samples into ``[channels_last uint8 images, labels(, keys)]``."""
    return collate_with(images_to_channels_last, samples)


def collate_uint8_hwc_as_chw(samples: Sequence[tuple]) -> list:
    """The same batch as :func:`collate_channels_last`, built N x C x H x W (a strided copy per image), for comparison."""
    def chw(images):
        if not images:
            raise ValueError("cannot make a batch of no images")
        height, width, channels = _hwc_tensor(images[0]).shape
        out = empty_batch((len(images), channels, height, width), torch.uint8)
        for i, image in enumerate(images):
            write_uint8_chw(image, out[i])
        return out

    return collate_with(chw, samples)


#: The per-channel mean and standard deviation of ImageNet's training images (RGB, in [0, 1]),
#: which torchvision's pretrained models expect their inputs to be normalised with.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def to_float_batch(images: torch.Tensor, device=None, mean: Sequence[float] | None = None,
                   std: Sequence[float] | None = None, non_blocking: bool = False,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """The consumer's half of a uint8 hand-over: move a uint8 N x C x H x W batch to ``device``, then make it float.

    Without ``mean``/``std`` the result is the course's standard batch, ``float32(pixel) /
    255`` in [0, 1], bit-identical on the CPU to :func:`packlab.transforms.to_tensor`. With
    them, each channel is then normalised, ``(x - mean) / std``, once. The copy to the
    device happens *before* the conversion, so it moves a quarter of the bytes;
    ``non_blocking=True`` lets a copy from pinned memory overlap other work
    (:mod:`packlab.gpu`). ``out``, a float32 tensor of the batch's shape on its device,
    receives the result instead of new memory.
    """
    if images.dtype != torch.uint8:
        raise TypeError(f"expected a uint8 batch, got {images.dtype}: convert once, in the consumer, and only uint8")
    if device is not None:
        images = images.to(device, non_blocking=non_blocking)
    if out is None:
        # Same layout as the input: a channels_last batch stays channels_last, and the conversion reads in order.
        out = torch.empty_like(images, dtype=torch.float32)
    torch.div(images, 255, out=out)
    if (mean is None) != (std is None):
        raise ValueError("give both mean and std, or neither")
    if mean is not None:
        shape = (1, -1, 1, 1)
        out.sub_(torch.as_tensor(mean, dtype=out.dtype, device=out.device).view(shape))
        out.div_(torch.as_tensor(std, dtype=out.dtype, device=out.device).view(shape))
    return out


class FloatBatches:
    """Any loader of ``[uint8 images, labels, ...]`` batches, delivering the same batches with float images.

    The conversion (:func:`to_float_batch`) runs here, in the consuming process, as each
    batch is taken: on ``device`` if given. On the CPU each float batch is written into a
    recycled buffer (chapter 8's :class:`~packlab.loaders.recycling.BatchBufferPool`),
    which returns to the pool only once the training loop has dropped every reference
    to that batch: 50 MB of new memory per batch would cost a page fault per 4 kB, here
    in the training process (``recycle=False`` allocates anew every time).
    ``.dataset`` and ``len()`` are the wrapped loader's, so
    :func:`packlab.bench.time_loader` (which calls ``dataset.set_epoch``) times it like
    any loader.
    """

    def __init__(self, loader, device=None, mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                 recycle: bool = True):
        self.loader, self.device, self.mean, self.std = loader, device, mean, std
        self.recycle = recycle
        self._pool = None

    def _recycled(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` converted into a buffer of the pool, lent until the training loop drops it."""
        from packlab.loaders.recycling import BatchBufferPool

        count, shape = len(images), tuple(images.shape[1:])
        if self._pool is None or self._pool.shape[1:] != shape or self._pool.shape[0] < count:
            self._pool = BatchBufferPool((count, *shape))
        slot = self._pool.acquire()
        to_float_batch(images, mean=self.mean, std=self.std, out=self._pool.buffer(slot)[:count])
        return self._pool.lend(slot, count)

    @property
    def dataset(self):
        return getattr(self.loader, "dataset", None)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        on_cpu = self.device is None or torch.device(self.device).type == "cpu"
        for batch in self.loader:
            images, *rest = batch
            if self.recycle and on_cpu and images.dtype == torch.uint8:
                yield [self._recycled(images), *rest]
            else:
                yield [to_float_batch(images, self.device, self.mean, self.std), *rest]

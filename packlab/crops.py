"""The training transform: a random resized crop and a flip, drawn per sample, and the decoders that serve it.

Every ImageNet recipe trains on ``RandomResizedCrop(224)`` plus a horizontal flip
(torchvision's reference scripts; FFCV's own benchmark pipeline): a window covering 8 to
100 % of the image's area, with an aspect ratio between 3/4 and 4/3, is cut out and
resized to 224 x 224, and half the time mirrored. This module draws those windows the
way torchvision does (:func:`random_resized_crop` is its ``RandomResizedCrop.get_params``,
step for step, on a generator of our own) but **per sample, from a seed**: the window of
sample ``key`` in ``epoch`` depends on ``(seed, epoch, key)`` and nothing else
(:func:`crop_for`), not on which worker reads it, in which order, or how many batches
came before. A run is therefore reproducible, and a resumed run draws the crops the
uninterrupted one would have.

Three ways to get the 224 x 224 uint8 crop out of JPEG bytes, all given the same
:class:`Crop`:

* :func:`crop_reference`, what torchvision's transform does to a Pillow image: decode the
  whole JPEG, ``crop``, ``resize`` (bilinear), ``hflip``. The standard training pipeline.
* :func:`crop_pillow_draft`, Pillow's cheaper route: ``draft`` asks libjpeg to decode at
  1/2, 1/4 or 1/8 scale when the *crop* is at least that many times larger than 224 (the
  crop, not the image, sets the usable scale), then one ``resize`` with ``box=`` reads
  only the window. Pillow still decodes the whole image, at that scale.
* :func:`crop_roi`, a crop-aware decode: libjpeg-turbo's ``jpeg_crop_scanline`` and
  ``jpeg_skip_scanlines`` decode only the window's columns, and stop after its last row
  (rows above it are still entropy-decoded: a JPEG's Huffman stream cannot be skipped).
  It goes through NVIDIA's nvImageCodec (PyPI ``nvidia-nvimgcodec-cu13``, which DALI
  installs; its libjpeg-turbo extension, ``extensions/libjpeg_turbo/jpeg_mem.cpp``, makes
  exactly those calls) on the CPU only; :func:`roi_available` says whether it is
  installed.

:class:`RandomCrops` wraps a dataset of ``(jpeg bytes, label, key)`` samples (a
``TarShardDataset`` with ``transform=encoded`` and ``return_key=True``) into one of
``(uint8 224 x 224 x 3 crop, label[, key])``.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import IterableDataset

from packlab import sample_seeds
from packlab.transforms import CorruptImageError

#: The side of the crops a training job feeds its model.
TRAIN_SIZE = 224
#: torchvision's ``RandomResizedCrop`` defaults: share of the area, and width / height.
SCALE = (0.08, 1.0)
RATIO = (3 / 4, 4 / 3)
#: How often ``RandomHorizontalFlip`` mirrors an image (its default ``p``).
FLIP_P = 0.5


@dataclass(frozen=True)
class Crop:
    """One sample's window: ``top``, ``left``, ``height``, ``width`` in the pixels of an image of
    ``image_size`` (width, height), and whether it is mirrored."""

    top: int
    left: int
    height: int
    width: int
    flip: bool
    image_size: tuple[int, int]

    def box(self, size: tuple[int, int] | None = None) -> tuple[float, float, float, float]:
        """``(left, top, right, bottom)`` in an image of ``size`` (default: the one it was drawn on).

        A stored copy of the same picture (smaller, aspect kept) gets the same window, scaled:
        that is how the pixel error of a stored copy is measured, crop for crop.
        """
        width, height = self.image_size
        sx, sy = (1.0, 1.0) if size is None else (size[0] / width, size[1] / height)
        return (self.left * sx, self.top * sy, (self.left + self.width) * sx, (self.top + self.height) * sy)


# ------------------------------------------------------------------------------ drawing crops


def sample_seed(seed: int, epoch: int, key: str) -> int:
    """A 63-bit seed for sample ``key`` in one epoch: the same in every process, run and Python.

    The course's one per-sample seed, :func:`packlab.seeding.sample_seed` of ``(seed, epoch,
    index)``, with the key made a number by :func:`packlab.seeding.key_number` (BLAKE2b of
    its bytes; Python's ``hash()`` of a string changes with ``PYTHONHASHSEED`` from one
    interpreter to the next).
    """
    return sample_seeds.sample_seed(seed, epoch, sample_seeds.key_number(key))


@functools.lru_cache(maxsize=8)
def _log_ratio(ratio: tuple[float, float]) -> tuple[float, float]:
    """torchvision's ``torch.log(torch.tensor(ratio))``, as the two numbers ``uniform_`` receives (computed once)."""
    return tuple(torch.log(torch.tensor(ratio)).tolist())


def random_resized_crop(width: int, height: int, generator: torch.Generator, scale=SCALE,
                        ratio=RATIO) -> tuple[int, int, int, int]:
    """``(top, left, height, width)`` of a random window: torchvision's ``RandomResizedCrop.get_params``.

    The same steps (ten tries at an area share and a log-uniform aspect ratio, a uniform
    position, else the central crop), drawn from ``generator`` instead of torch's global
    one; ``tests/test_crops.py`` checks it against torchvision's on the same seed.
    """
    area = height * width
    low, high = _log_ratio(tuple(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(low, high, generator=generator)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,), generator=generator).item()
            j = torch.randint(0, width - w + 1, size=(1,), generator=generator).item()
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def crop_for(key: str, width: int, height: int, seed: int = 0, epoch: int = 0) -> Crop:
    """The window and flip of sample ``key`` in ``epoch``, on an image of ``width`` x ``height``.

    Drawn from a generator seeded by :func:`sample_seed` alone: the crop, then the flip,
    in the order torchvision's ``RandomResizedCrop`` and ``RandomHorizontalFlip`` draw them.
    """
    generator = torch.Generator().manual_seed(sample_seed(seed, epoch, key))
    top, left, h, w = random_resized_crop(width, height, generator)
    flip = bool(torch.rand(1, generator=generator).item() < FLIP_P)
    return Crop(top, left, h, w, flip, (width, height))


_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def jpeg_size(data: bytes, source: str = "<bytes>") -> tuple[int, int]:
    """``(width, height)`` from a JPEG's frame header, without decoding anything.

    Walks the markers from the start of the file to the first start-of-frame segment,
    which holds the height and the width; the crop must be drawn before the decoder runs.
    """
    if data[:2] != b"\xff\xd8":
        raise _corrupt(source, "not a JPEG (no start-of-image marker)")
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            position += 1
            continue
        marker = data[position + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            position += 1 if marker == 0xFF else 2
            continue
        length = int.from_bytes(data[position + 2:position + 4], "big")
        if marker in _SOF_MARKERS and position + 9 <= len(data):
            height = int.from_bytes(data[position + 5:position + 7], "big")
            width = int.from_bytes(data[position + 7:position + 9], "big")
            return width, height
        position += 2 + length
    raise _corrupt(source, "no frame header (start-of-frame marker) before the end of the data")


def _corrupt(source: str, reason) -> CorruptImageError:
    return CorruptImageError(f"cannot decode image {source}: {reason}. Check or regenerate the file "
                             "(`python -m packlab.data --verify` names damaged originals).")


# ------------------------------------------------------------------------------ getting the crop


def _finish(image: Image.Image, crop: Crop) -> np.ndarray:
    """The resized window as height x width x RGB uint8, mirrored if the crop says so."""
    if crop.flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(image)


def crop_reference(data: bytes, crop: Crop, size: int = TRAIN_SIZE, source: str = "<bytes>") -> np.ndarray:
    """What torchvision does to a Pillow image: decode it whole, ``crop``, bilinear ``resize``, ``hflip``.

    ``transforms.functional.resized_crop`` on a PIL image is ``img.crop(box)`` then
    ``img.resize(size, BILINEAR)`` (``torchvision/transforms/_functional_pil.py``). The
    window is taken in the decoded image's pixels, scaled if ``crop`` was drawn on a copy
    of another size. Returns ``size`` x ``size`` x 3 uint8.
    """
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
        image = image if image.mode == "RGB" else image.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise _corrupt(source, exc) from None
    left, top, right, bottom = (round(v) for v in crop.box(image.size))
    return _finish(image.crop((left, top, right, bottom)).resize((size, size), Image.BILINEAR), crop)


def draft_scale_for(crop_width: float, crop_height: float, size: int = TRAIN_SIZE) -> int:
    """The DCT scale a crop allows: the largest of 1, 2, 4, 8 that keeps the window at least ``size`` a side."""
    factor = min(crop_width, crop_height) / size
    return next((s for s in (8, 4, 2) if factor >= s), 1)


def crop_pillow_draft(data: bytes, crop: Crop, size: int = TRAIN_SIZE, source: str = "<bytes>") -> np.ndarray:
    """Pillow, as cheap as it gets: ``draft`` at the scale the crop allows, then one ``resize`` of the window.

    ``Image.draft`` picks ``min(width // w, height // h)`` rounded down to 1, 2, 4 or 8 for
    a requested ``(w, h)`` (``JpegImagePlugin.draft``); asking for the image's size divided
    by the crop's scale (:func:`draft_scale_for`) makes libjpeg decode at that scale.
    ``resize(box=...)`` then resamples only the window, in the decoded image's
    coordinates, with no crop copy in between. Pillow decodes the whole image (at that
    scale): it has no way to decode a window.
    """
    return _draft_and_resize(data, crop, size, source, draft_gap=1.0, reducing_gap=None)


def _draft_and_resize(data: bytes, crop: Crop, size: int, source: str, draft_gap: float | None,
                      reducing_gap: float | None) -> np.ndarray:
    """Decode with ``draft`` at the scale that keeps the window ``draft_gap`` times ``size`` (None: no draft),
    then one bilinear ``resize`` of the window (with ``reducing_gap``, None for a plain resample)."""
    try:
        image = Image.open(io.BytesIO(data))
        full = image.size
        left, top, right, bottom = crop.box(full)
        scale = draft_scale_for((right - left) / draft_gap, (bottom - top) / draft_gap, size) if draft_gap else 1
        if scale > 1:
            image.draft("RGB", (full[0] // scale, full[1] // scale))
        image = image if image.mode == "RGB" else image.convert("RGB")
        image.load()
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise _corrupt(source, exc) from None
    sx, sy = image.size[0] / full[0], image.size[1] / full[1]
    box = (left * sx, top * sy, right * sx, bottom * sy)
    return _finish(image.resize((size, size), Image.BILINEAR, box=box, reducing_gap=reducing_gap), crop)


@functools.lru_cache(maxsize=1)
def _roi_decoder():
    """nvImageCodec's decoder, CPU only (libjpeg-turbo), one thread: one per process, made on first use."""
    from nvidia import nvimgcodec

    return nvimgcodec, nvimgcodec.Decoder(device_id=nvimgcodec.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                                          backends=[nvimgcodec.Backend(nvimgcodec.BackendKind.CPU_ONLY)])


def roi_available() -> str | None:
    """None if :func:`crop_roi` can run here, else why not (in words)."""
    try:
        _roi_decoder()
    except ImportError:
        return ("nvImageCodec is not installed (it comes with the DALI extra: `uv pip install -e '.[dali]'`, "
                "which `make book`, `make bench` and `make test` install)")
    except RuntimeError as exc:
        return f"nvImageCodec could not start a CPU decoder: {exc}"
    return None


def decode_window(data: bytes, window: tuple[int, int, int, int], source: str = "<bytes>") -> np.ndarray:
    """Only the pixels of ``window`` (left, top, right, bottom; integers), decoded by libjpeg-turbo: H x W x RGB uint8."""
    nvimgcodec, decoder = _roi_decoder()
    left, top, right, bottom = window
    try:
        stream = nvimgcodec.CodeStream(data).get_sub_code_stream(region=nvimgcodec.Region(top, left, bottom, right))
        image = decoder.decode(stream)
    except (RuntimeError, ValueError) as exc:
        raise _corrupt(source, exc) from None
    if image is None:
        raise _corrupt(source, f"nvImageCodec could not decode the window {window}")
    return np.asarray(image.cpu())


def crop_roi(data: bytes, crop: Crop, size: int = TRAIN_SIZE, source: str = "<bytes>") -> np.ndarray:
    """A crop-aware decode: only the window's pixels (:func:`decode_window`), then one ``resize`` to ``size``.

    The window is widened to whole pixels; the resize reads the exact (fractional)
    window inside it, so a crop drawn on a copy of another size maps exactly.
    """
    full = jpeg_size(data, source)
    left, top, right, bottom = crop.box(full)
    window = (max(0, math.floor(left)), max(0, math.floor(top)), min(full[0], math.ceil(right)),
              min(full[1], math.ceil(bottom)))
    pixels = decode_window(data, window, source)
    box = (left - window[0], top - window[1], right - window[0], bottom - window[1])
    return _finish(Image.fromarray(pixels).resize((size, size), Image.BILINEAR, box=box), crop)


def crop_torchvision(data: bytes, crop: Crop, size: int = TRAIN_SIZE, source: str = "<bytes>") -> np.ndarray:
    """torchvision: decode the whole JPEG (``decode_jpeg``), take the window, resize it in uint8, interleaved.

    ``decode_jpeg`` returns a channels-first *view* of libjpeg's interleaved (H x W x C)
    pixels. The window is copied once into a ``channels_last`` tensor (row by row, plain
    copies) and resized with torch's antialiased bilinear ``interpolate`` on uint8, the
    kernel ``transforms.v2`` uses; on channels_last input it writes channels_last output,
    so the result is an interleaved ``size`` x ``size`` x 3 image that a channels_last batch
    takes as one plain copy. (``transforms.v2.functional.resize`` would first reshape the
    window into a contiguous channels-first copy, and return channels-first.)
    """
    from packlab.decode import decode_torchvision

    return _resize_window(decode_torchvision(data, source), crop, size)


def _resize_window(image: torch.Tensor, crop: Crop, size: int) -> np.ndarray:
    """The crop's window of a channels-first uint8 image (any size: the window is scaled to it), resized in torch.

    The window is copied once into a ``channels_last`` tensor and resized with torch's
    antialiased bilinear ``interpolate`` on uint8, which writes channels_last output: an
    interleaved ``size`` x ``size`` x 3 image, mirrored if the crop says so.
    """
    left, top, right, bottom = (round(v) for v in crop.box((image.shape[2], image.shape[1])))
    window = image[None, :, top:bottom, left:right].contiguous(memory_format=torch.channels_last)
    out = torch.nn.functional.interpolate(window, size=(size, size), mode="bilinear", antialias=True,
                                          align_corners=False)[0].permute(1, 2, 0)
    return (out.flip(1) if crop.flip else out).numpy()


#: Pillow's ``reducing_gap`` for :func:`crop_pillow_reduce`: the default of ``Image.thumbnail``.
REDUCING_GAP = 2.0


def crop_pillow_reduce(data: bytes, crop: Crop, size: int = TRAIN_SIZE, source: str = "<bytes>",
                       reducing_gap: float = REDUCING_GAP, draft: bool = False) -> np.ndarray:
    """Pillow's two-step shrink: ``resize(..., reducing_gap=g)``, which first shrinks with ``Image.reduce``.

    ``resize`` with ``reducing_gap=g`` first shrinks the window by the whole factor
    ``int(window / size / g)`` with ``Image.reduce`` (the mean of each factor x factor block
    of decoded pixels, cheap), so that the bilinear resample after it shrinks by less than
    ``g``; below ``2 g`` times ``size`` it does nothing. Smaller ``g`` is faster and further
    from a plain resize; Pillow's documentation calls 3 or more indistinguishable in most cases.

    ``draft=False`` decodes the whole image: ``reduce`` then stands in for ``draft``, in
    decoded pixels instead of in the DCT. ``draft=True`` is ``Image.thumbnail``'s way:
    ``draft`` at the DCT scale that keeps the window at least ``g`` times ``size``, then the
    same ``resize``; after that ``draft`` the window's shorter side is under ``2 g`` times
    ``size`` (unless 1/8 is not small enough), so ``reduce`` applies at most along the longer
    side, and the result is mostly a ``draft`` at half the scale of :func:`crop_pillow_draft`,
    resampled from twice the pixels.
    """
    return _draft_and_resize(data, crop, size, source, draft_gap=reducing_gap if draft else None,
                             reducing_gap=reducing_gap)


def crop_pillow_thumbnail_way(data: bytes, crop: Crop, size: int = TRAIN_SIZE, source: str = "<bytes>") -> np.ndarray:
    """:func:`crop_pillow_reduce` with ``draft=True``: ``draft`` to at least twice the target, as ``Image.thumbnail`` does."""
    return crop_pillow_reduce(data, crop, size, source, draft=True)


def crop_libjpeg_scaled(data: bytes, crop: Crop, size: int = TRAIN_SIZE, source: str = "<bytes>",
                        fast: bool = False) -> np.ndarray:
    """libjpeg-turbo's own scaled decode (any M/8, through ``simplejpeg``), then one resize of the window.

    The image is decoded at the smallest of libjpeg-turbo's scales M/8 (M = 1 ... 16) that
    keeps the *window* at least ``size`` a side, not only at 1/2, 1/4 and 1/8 as Pillow's
    ``draft``: a window 1.5 times the target can be decoded at 6/8. ``fast`` also asks for
    libjpeg-turbo's fast integer IDCT and its plain (not "fancy") chroma upsampling, the
    settings that trade a little accuracy for speed (DALI and FFCV decode with libjpeg-turbo
    too). PyTurboJPEG makes the same calls (``scaling_factor=``, ``TJFLAG_FASTDCT``,
    ``TJFLAG_FASTUPSAMPLE``) but needs the system's ``libturbojpeg``; ``simplejpeg`` carries
    its own libjpeg-turbo in its wheel. The resize is Pillow's ``resize(box=...)`` of the
    exact window, as in :func:`crop_pillow_draft` and :func:`crop_roi`.
    """
    import simplejpeg

    width, height = jpeg_size(data, source)
    left, top, right, bottom = crop.box((width, height))
    # The decoded image must be at least size / window of the full image in both directions.
    min_width = math.ceil(width * size / max(right - left, 1e-9))
    min_height = math.ceil(height * size / max(bottom - top, 1e-9))
    try:
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fast, fastupsample=fast,
                                        min_width=min(min_width, width), min_height=min(min_height, height))
    except ValueError as exc:
        raise _corrupt(source, exc) from None
    # The window at the decoded scale has fractional edges; Pillow's resize(box=...) reads them exactly, where
    # rounding them to whole pixels would shift the crop by up to half a pixel of the reduced image.
    box = crop.box((pixels.shape[1], pixels.shape[0]))
    return _finish(Image.fromarray(pixels).resize((size, size), Image.BILINEAR, box=box), crop)


def crop_libjpeg_scaled_fast(data: bytes, crop: Crop, size: int = TRAIN_SIZE, source: str = "<bytes>") -> np.ndarray:
    """:func:`crop_libjpeg_scaled` with libjpeg-turbo's fast IDCT and plain chroma upsampling."""
    return crop_libjpeg_scaled(data, crop, size, source, fast=True)


def crop_fast(data: bytes, crop: Crop, size: int = TRAIN_SIZE, source: str = "<bytes>"):
    """The course's crop decoder: a reduced DCT scale where the crop allows one, else torchvision's.

    Where the window is at least twice ``size`` in both directions (:func:`draft_scale_for`),
    Pillow's ``draft`` decodes at 1/2, 1/4 or 1/8 scale (:func:`crop_pillow_draft`); below
    that no scale applies, and the whole decode with torchvision plus v2's uint8 resize of
    the window (:func:`crop_torchvision`) is the cheaper route (chapter 11 measures all of
    them). Returns ``size`` x ``size`` x 3 uint8.
    """
    left, top, right, bottom = crop.box()
    if draft_scale_for(right - left, bottom - top, size) > 1:
        return crop_pillow_draft(data, crop, size, source)
    return crop_torchvision(data, crop, size, source)


#: The crop decoders by name, as tables and ``make bench`` call them.
DECODERS: dict[str, Callable] = {"Pillow, whole image (reference)": crop_reference,
                                 "Pillow draft + crop box": crop_pillow_draft,
                                 "Pillow reduce + resize (reducing_gap 2)": crop_pillow_reduce,
                                 "Pillow draft to twice 224 + resize (as thumbnail)": crop_pillow_thumbnail_way,
                                 "libjpeg-turbo at M/8 (simplejpeg) + resize": crop_libjpeg_scaled,
                                 "the same, fast IDCT and upsampling": crop_libjpeg_scaled_fast,
                                 "crop-aware (libjpeg-turbo window)": crop_roi,
                                 "torchvision + v2 resize of the window": crop_torchvision,
                                 "ours: draft where the crop allows, else torchvision": crop_fast}


# ------------------------------------------------------------------------------ a dataset of crops


def encoded(data: bytes, source: str = "<bytes>") -> bytes:
    """A transform that decodes nothing: the JPEG bytes as they are (what :class:`RandomCrops` wraps)."""
    return data


class RandomCrops(IterableDataset):
    """``(jpeg bytes, label, key)`` samples to ``(uint8 crop, label[, key])``: the training transform, per sample.

    ``dataset`` is e.g. ``TarShardDataset(shards, transform=encoded, return_key=True)``.
    Each sample's window comes from :func:`crop_for` on ``(seed, dataset.epoch, key)``
    and the image's own size, and ``decode(bytes, crop, size, source)`` produces it
    (:func:`crop_reference`, :func:`crop_pillow_draft` or :func:`crop_roi`). ``set_epoch``
    and ``epoch`` are the wrapped dataset's, which keeps the epoch in shared memory, so
    persistent DataLoader workers draw the new epoch's crops too.
    """

    def __init__(self, dataset, decode: Callable = crop_reference, size: int = TRAIN_SIZE, seed: int = 0,
                 return_key: bool = False):
        super().__init__()
        self.dataset, self.decode, self.size, self.seed, self.return_key = dataset, decode, size, seed, return_key

    @property
    def epoch(self) -> int:
        return self.dataset.epoch

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __iter__(self):
        epoch = self.dataset.epoch
        for data, label, key in self.dataset:
            source = f"sample {key}"
            crop = crop_for(key, *jpeg_size(data, source), seed=self.seed, epoch=epoch)
            image = self.decode(data, crop, self.size, source=source)
            yield (image, label, key) if self.return_key else (image, label)


class CropWork:
    """One worker's per-image work on an in-memory ``(jpeg bytes, key)`` item, for the ceilings (:mod:`packlab.ceiling`).

    Exactly what :class:`RandomCrops` does per sample once the bytes are read: the crop of
    ``(seed, epoch, key)`` on the image's size, then ``decode``.
    """

    def __init__(self, decode: Callable = crop_reference, size: int = TRAIN_SIZE, seed: int = 0, epoch: int = 0):
        self.decode, self.size, self.seed, self.epoch = decode, size, seed, epoch

    def __call__(self, item: tuple[bytes, str]):
        data, key = item
        crop = crop_for(key, *jpeg_size(data, key), seed=self.seed, epoch=self.epoch)
        return self.decode(data, crop, self.size, source=key)

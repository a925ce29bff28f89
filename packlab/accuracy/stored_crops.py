"""Random crops of a stored copy against random crops of the original: the data of chapter 11's accuracy question.

Chapter 11 stores every image once, smaller and re-encoded ("max side 320, quality 90,
4:2:0", :class:`packlab.reencode.StoredFormat`), so that each epoch decodes less. Training
then does what every ImageNet recipe does: a **random resized crop** of each image, drawn
anew every epoch (:mod:`packlab.crops`). The question is whether cropping the stored copy
instead of the original costs the model accuracy: the stored copy has fewer pixels (a small
window of it is enlarged more) and a second lossy encoding (with colour at half
resolution). This module builds the data to answer it with the accuracy instrument
(:mod:`.instrument`), in seconds:

* **Scaled down.** The course's originals are about 400 x 350 px and the stored copy keeps
  320 of the longer side: 0.8 of it. Here the originals are pattern images (:mod:`.patterns`,
  where only the stripes give the class) rendered at :data:`ORIGINAL_SIDE` = 96 px and saved
  as the course's originals are saved; the stored form keeps the same 0.8 of the side
  (:data:`STORED_FORM`, 77 px), the same quality and the same subsampling. The crops are
  resized to the instrument's 16 px, as the course's are resized to 224: what matters is the
  ratio of stored pixels to original pixels, and that the stored copy still has several
  times the pixels the model sees.
* **Crops.** Each image gets one window per *variant* (:func:`crop_windows`), drawn by
  :func:`packlab.crops.crop_for`'s recipe on the original's size; epoch ``e`` trains on
  variant ``e % variants`` (:func:`variant_epochs`), so with as many variants as epochs
  every epoch sees fresh crops, as a loader drawing them per epoch would deliver. The crops
  are cut once, here, and the instrument trains on the small results: nothing is decoded
  during training.
* **No flip.** A recipe mirrors half its crops, which is harmless for photographs (a
  mirrored dog is a dog). Here the class *is* the stripes' orientation, and mirroring turns
  stripes at 36 degrees into stripes at 144 degrees: another class. The flip would teach
  the model wrong labels, so it is turned off (:func:`unflipped_crop`).
* **The same window in both.** The stored copy's crop is the original's window scaled to
  the stored copy's size (:meth:`packlab.crops.Crop.box`, which
  :func:`packlab.crops.crop_reference` applies when the decoded image is not the size the
  crop was drawn on): the two crops show the same part of the picture and differ only in
  what storing did to its pixels (:attr:`StoredCropData.psnr_db` says by how much).
* **Paired.** Both conditions train on the same schedule (the same seed's batches, index
  for index, into two sets built the same way), from the same initial weights: seed ``s``
  differs between the two only in the pixels, so the difference of their accuracies, seed
  by seed (:func:`packlab.accuracy.paired.paired_difference`), keeps the effect of storing
  and cancels most of the seed's own luck.
* **Held out as a model meets new images**: other pattern images, original JPEGs decoded
  whole and resized to 16 px (:func:`holdout_images`), with no crop.

**What crops do to this task.** A resized crop *zooms in*: a window of a quarter of the
area shows the stripes twice as coarse as the whole image does. Half of a pattern's class
is its stripes' frequency (coarse and fine are 1.6 times apart), so the zoom blurs the
classes, and the model trained on crops meets whole images at test time: the smaller the
smallest window, the lower the accuracy and the more the seeds disagree, so the less a
paired comparison can see. The smallest windows are also where the stored copy's fewer
pixels would show most, so chapter 14 runs both torchvision's ``scale`` and a narrower one
and prints each one's accuracy and smallest detectable difference: ``scale`` is a parameter
of everything here.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image

from packlab import crops, reencode
from packlab.accuracy import instrument, patterns
from packlab.accuracy.pixels import SmallImages, psnr
from packlab.accuracy.training import BATCH_SIZE, epochs_of, global_order
from packlab.crops import Crop

#: Epochs of the instrument's recipe: as many crop variants as epochs gives every epoch fresh crops.
EPOCHS = instrument.EPOCHS
#: Side of the rendered originals, in pixels: six times the 16 px the model sees, so that even the smallest crop
#: (8 % of the area: a window of about 27 px) still holds more pixels than it is resized to.
ORIGINAL_SIDE = 96
#: How the originals are saved: as :func:`packlab.data.render` saves the course's (most of ImageNet's way): quality 96
#: (a few of its images at 92 or 94, which we leave out) and no chroma subsampling.
ORIGINAL_QUALITY = 96
ORIGINAL_SUBSAMPLING = "4:4:4"
#: Chapter 11's stored form keeps a longer side of 320 px of originals about 400 x 350 px: 320 / 400 = 0.8 of the
#: original's longer side. The scaled experiment keeps the same share.
STORED_SHARE = 320 / 400
#: Chapter 11's form ("max side 320, q90, 4:2:0"), scaled: max side round(0.8 x 96) = 77, quality 90, 4:2:0.
STORED_FORM = reencode.StoredFormat(round(STORED_SHARE * ORIGINAL_SIDE), 90, "4:2:0", fit="max side")
#: The side the model sees: the instrument's (:data:`packlab.accuracy.patterns.SIDE`).
SIDE = patterns.SIDE
#: Share of the image's area a window covers: torchvision's ``RandomResizedCrop`` default (8 to 100 %), chapter 11's.
#: On this task it costs a lot of accuracy (see the module's docstring); pass ``scale=`` to narrow it.
CROP_SCALE = crops.SCALE


#: The ranges of crop areas chapter 14 compares: torchvision's (where the smallest windows would show the stored
#: copy's fewer pixels most) and a narrower one (where this task's seeds agree more, so a smaller effect shows).
CROP_SCALES = {"8–100 %": CROP_SCALE, "50–100 %": (0.5, 1.0)}


def crop_scales() -> dict[str, tuple[float, float]]:
    """:data:`CROP_SCALES`, or only torchvision's under make test's crash-test cap (its many-cores passes check
    that the experiment runs with that many processes, not what each range shows)."""
    from packlab.bench import crash_test_count

    return dict(list(CROP_SCALES.items())[: crash_test_count(len(CROP_SCALES), cap=1)])


class StoredPatterns(NamedTuple):
    """Pattern images as JPEG files: each original and its stored copy, with labels and keys (one entry per image)."""

    originals: list[bytes]
    stored: list[bytes]
    labels: np.ndarray  # int64, N
    keys: list[str]

    @property
    def original_kb(self) -> float:
        """Mean size of an original, in kB (1,000 bytes)."""
        return float(np.mean([len(b) for b in self.originals])) / 1000

    @property
    def stored_kb(self) -> float:
        """Mean size of a stored copy, in kB (1,000 bytes)."""
        return float(np.mean([len(b) for b in self.stored])) / 1000


class StoredCropData(NamedTuple):
    """The experiment's data: the same crops of the originals and of the stored copies, and the held-out images.

    ``train_originals`` and ``train_stored`` hold ``variants x N`` crops each, image ``i``'s
    crop of variant ``v`` at index ``v * N + i`` (:func:`crop_sets`); train on either with
    ``variant_epochs(N, variants)``. ``original_kb`` and ``stored_kb``: mean bytes per image
    of each form, in kB; ``psnr_db``: the stored crops' PSNR against the original crops.
    """

    train_originals: SmallImages
    train_stored: SmallImages
    holdout: SmallImages
    original_kb: float
    stored_kb: float
    psnr_db: float
    variants: int

    @property
    def count(self) -> int:
        """Training images (each in ``variants`` crops)."""
        return len(self.train_originals) // self.variants

    def schedule(self, epochs: int = EPOCHS, batch_size: int = BATCH_SIZE) -> Callable[[int], list[np.ndarray]]:
        """The schedule both conditions train on: :func:`variant_epochs` of this data."""
        return variant_epochs(self.count, self.variants, epochs, batch_size)


# ------------------------------------------------------------------------------ originals and stored copies


def encode_original(pixels: np.ndarray) -> bytes:
    """Rendered pixels (H x W x 3 uint8) saved as the course saves its originals: quality 96, 4:4:4."""
    return reencode.encode_pixels(pixels, ORIGINAL_QUALITY, ORIGINAL_SUBSAMPLING)


def store(original: bytes, form: reencode.StoredFormat = STORED_FORM, source: str = "<bytes>") -> bytes:
    """An original JPEG stored in ``form``, as chapter 11 stores it: decoded, shrunk (bilinear), re-encoded."""
    pixels = reencode.stored_pixels(original, form.size, source, fit=form.fit)
    return reencode.encode_pixels(pixels, form.quality, form.subsampling)


def pattern_keys(count: int, seed: int) -> list[str]:
    """The keys :func:`packlab.accuracy.patterns.pattern_images` gives the same images: ``p<seed>-<i>``."""
    return [f"p{seed}-{i:06d}" for i in range(count)]


def pattern_jpegs(count: int, seed: int, side: int = ORIGINAL_SIDE) -> tuple[list[bytes], np.ndarray, list[str]]:
    """``count`` pattern images (pattern seed ``seed``) rendered at ``side`` px and saved as originals:
    ``(jpeg bytes per image, labels, keys)``. Rendering costs most of it: about 1.5 ms an image at 96 px."""
    parameters = patterns.pattern_parameters(count, seed)
    pixels = patterns.render(parameters, side, seed)
    return [encode_original(p) for p in pixels], parameters.labels, pattern_keys(count, seed)


def stored_patterns(count: int, seed: int = 1, form: reencode.StoredFormat = STORED_FORM,
                    side: int = ORIGINAL_SIDE) -> StoredPatterns:
    """``count`` training images: each original JPEG (:func:`pattern_jpegs`) and its copy stored in ``form``."""
    originals, labels, keys = pattern_jpegs(count, seed, side)
    stored = [store(b, form, k) for b, k in zip(originals, keys)]
    return StoredPatterns(originals, stored, labels, keys)


# ------------------------------------------------------------------------------ crops


def unflipped_crop(key: str, width: int, height: int, seed: int = 0, epoch: int = 0,
                   scale: tuple[float, float] = CROP_SCALE) -> Crop:
    """:func:`packlab.crops.crop_for`'s window of ``key`` in ``epoch`` on a ``width`` x ``height`` image, unmirrored.

    The same generator, seeded the same way, draws the same window (with the default
    ``scale``, exactly ``crop_for``'s); the flip it would draw next is not drawn, since
    mirroring stripes changes their orientation, hence their class. ``scale``: the share of
    the area a window covers (torchvision's ``RandomResizedCrop(scale=...)``).
    """
    generator = torch.Generator().manual_seed(crops.sample_seed(seed, epoch, key))
    top, left, h, w = crops.random_resized_crop(width, height, generator, scale=scale)
    return Crop(top, left, h, w, False, (width, height))


def crop_windows(keys: Sequence[str], sizes: Sequence[tuple[int, int]], variants: int, seed: int = 0,
                 scale: tuple[float, float] = CROP_SCALE) -> list[list[Crop]]:
    """``windows[v][i]``: image ``i``'s crop in variant ``v`` (the crop epoch ``v`` of a loader would draw), on the
    original's size ``sizes[i]`` (width, height), unflipped (:func:`unflipped_crop`)."""
    return [[unflipped_crop(key, *size, seed=seed, epoch=v, scale=scale) for key, size in zip(keys, sizes)]
            for v in range(variants)]


def _decoded(jpeg: bytes) -> Image.Image:
    """A JPEG decoded whole, in RGB, as :func:`packlab.crops.crop_reference` decodes it."""
    image = Image.open(io.BytesIO(jpeg))
    image.load()
    return image if image.mode == "RGB" else image.convert("RGB")


def cut(image: Image.Image, crop: Crop, side: int) -> np.ndarray:
    """``crop``'s window of a decoded image (scaled to its size), bilinear-resized to ``side``: the pixels
    :func:`packlab.crops.crop_reference` gives for the same crop, without decoding again."""
    left, top, right, bottom = (round(v) for v in crop.box(image.size))
    window = image.crop((left, top, right, bottom)).resize((side, side), Image.BILINEAR)
    return np.asarray(window.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if crop.flip else window)


def crop_sets(originals: Sequence[bytes], stored: Sequence[bytes], keys: Sequence[str], variants: int,
              side: int = SIDE, *, labels: Sequence[int], seed: int = 0,
              scale: tuple[float, float] = CROP_SCALE) -> tuple[SmallImages, SmallImages]:
    """The crops of the originals and the same crops of the stored copies, as two :class:`SmallImages`.

    Entry ``v * N + i`` of each is image ``i``'s crop in variant ``v`` (:func:`crop_windows`,
    drawn on the original's size), resized to ``side``; the stored copy's crop is the same
    window scaled to its size. Labels repeat per variant; keys are ``<key>/v<v>``. Each JPEG
    is decoded once and all its variants are cut from it (:func:`cut`: the pixels
    :func:`packlab.crops.crop_reference` gives, without decoding the JPEG again for every crop).
    """
    n = len(keys)
    if not len(originals) == len(stored) == len(labels) == n:
        raise ValueError(f"{len(originals)} originals, {len(stored)} stored, {len(labels)} labels for {n} keys")
    decoded = [_decoded(b) for b in originals]
    windows = crop_windows(keys, [image.size for image in decoded], variants, seed, scale)
    out = {name: np.empty((variants * n, side, side, 3), dtype=np.uint8) for name in ("originals", "stored")}
    for i, (original, copy) in enumerate(zip(decoded, map(_decoded, stored))):
        for v in range(variants):
            out["originals"][v * n + i] = cut(original, windows[v][i], side)
            out["stored"][v * n + i] = cut(copy, windows[v][i], side)
    repeated = np.tile(np.asarray(labels, dtype=np.int64), variants)
    crop_keys = [f"{key}/v{v}" for v in range(variants) for key in keys]
    return (SmallImages(out["originals"], repeated, crop_keys),
            SmallImages(out["stored"], repeated.copy(), list(crop_keys)))


def holdout_images(count: int, seed: int = 2, side: int = SIDE, original_side: int = ORIGINAL_SIDE) -> SmallImages:
    """``count`` other pattern images (pattern seed ``seed``), original JPEGs decoded whole and resized to ``side``
    (bilinear, as the crops are): what a trained model meets, no crop and no stored copy."""
    jpegs, labels, keys = pattern_jpegs(count, seed, original_side)
    pixels = np.stack([np.asarray(_decoded(b).resize((side, side), Image.BILINEAR)) for b in jpegs])
    return SmallImages(pixels, labels, keys)


# ------------------------------------------------------------------------------ the schedule


def variant_epochs(size: int, variants: int, epochs: int = EPOCHS, batch_size: int = BATCH_SIZE,
                   draw: int = 0) -> Callable[[int], list[np.ndarray]]:
    """``schedule(seed)``: ``epochs`` epochs of ``size`` images, each a fresh permutation of them
    (:func:`packlab.accuracy.instrument.shuffled_epochs`'s), where epoch ``e`` trains on variant ``e % variants``
    (indices ``v * size + i`` into :func:`crop_sets`' arrays)."""
    def order(seed: int, epoch: int) -> np.ndarray:
        return (epoch % variants) * size + global_order(seed * 1_000_003 + draw, epoch, size)

    def schedule(seed: int) -> list[np.ndarray]:
        return epochs_of(order, seed, epochs, batch_size)

    return schedule


# ------------------------------------------------------------------------------ all of it


def stored_crop_data(count: int = 2000, holdout_count: int = 1000, variants: int = EPOCHS, seed: int = 1,
                     holdout_seed: int = 2, side: int = SIDE, form: reencode.StoredFormat = STORED_FORM,
                     scale: tuple[float, float] = CROP_SCALE) -> StoredCropData:
    """The experiment's data (:class:`StoredCropData`): ``count`` training images, each original and stored in
    ``form``, cut into ``variants`` crops of ``side`` px; ``holdout_count`` held-out images. One process, a few
    seconds at the defaults (most of it rendering the 3,000 originals at 96 px)."""
    images = stored_patterns(count, seed, form)
    train_originals, train_stored = crop_sets(images.originals, images.stored, images.keys, variants, side,
                                              labels=images.labels, scale=scale)
    holdout = holdout_images(holdout_count, holdout_seed, side)
    return StoredCropData(train_originals, train_stored, holdout, images.original_kb, images.stored_kb,
                          psnr(train_stored.pixels, train_originals.pixels), variants)

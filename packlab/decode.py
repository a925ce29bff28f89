"""Cheaper ways to turn JPEG bytes into a 256 x 256 uint8 image, and how far each strays from the standard.

The course's standard transform (:mod:`packlab.transforms`) decodes the whole JPEG with
Pillow and resizes the result with Pillow. Both steps can be made cheaper:

* **resize in torch, on uint8** (:func:`resize_uint8`): torchvision's ``transforms.v2``
  resizes a uint8 tensor with torch's antialiased bilinear ``interpolate`` without
  converting it to float first, where the CPU has AVX2 or AVX-512 (or is an ARM); the v1
  ``Resize`` and v2 on other CPUs cast to float32 first;
* **decode with libjpeg-turbo through torchvision** (:func:`decode_torchvision`), which
  returns a channels-first uint8 tensor with no Python work per image; the same call
  decodes on the GPU with nvJPEG (:mod:`packlab.gpu`);
* **decode at a reduced size** (:func:`decode_pillow_draft`, :func:`decode_simplejpeg`):
  a JPEG stores 8 x 8 blocks of frequencies, and libjpeg can turn each block into 4 x 4,
  2 x 2 or 1 x 1 pixels (scales 1/2, 1/4, 1/8) at a fraction of the cost of 8 x 8.
  Pillow exposes this as ``Image.draft``, which only ever uses those three scales, and
  only when the image is at least twice the target size in *both* directions
  (:func:`draft_scale`); ``simplejpeg`` asks libjpeg-turbo for any of its M/8 scales.

Each decoder here returns the same kind of result, ``RAW_SHAPE`` pixels (height x width x
RGB, uint8) or their channels-first tensor, so :func:`psnr` can compare them with the
standard transform's pixels. None of them is bit-identical to the standard: different
resampling filters, a different IDCT. How much they differ is a number (:func:`psnr`,
in dB: 40 and above is hard to see, 30-35 visible on close inspection), and it belongs
beside every speed-up.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

# Imported here, not inside the functions: a DataLoader worker forked from a process that
# has already imported torchvision inherits it, while a worker that imports it itself pays
# the import (seconds, the whole torchvision package) in every worker of every epoch.
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2 import functional as transforms_v2

from packlab.transforms import IMAGE_SIZE, SUBSAMPLING, CorruptImageError, decode_rgb


def _corrupt(source: str, exc: BaseException) -> CorruptImageError:
    return CorruptImageError(
        f"cannot decode image {source}: {exc}. Check or regenerate the file "
        "(`python -m packlab.data --verify` names damaged originals)."
    )


# ------------------------------------------------------------------------------ decoders


def decode_pillow(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """The whole JPEG, decoded by Pillow: height x width x RGB uint8 (the standard transform's first step)."""
    return np.asarray(decode_rgb(data, source))


def draft_scale(width: int, height: int, target: tuple[int, int] = (IMAGE_SIZE, IMAGE_SIZE)) -> int:
    """The reduction Pillow's ``draft`` will ask libjpeg for: 1, 2, 4 or 8.

    Pillow (``JpegImagePlugin.draft``) takes ``min(width // target_w, height // target_h)``
    and rounds it down to a power of two no larger than 8, so that the decoded image is
    never smaller than the target. A 400 x 350 image at 256 x 256 gets 1: no reduction
    (so does a 400 x 250 one, smaller than the target in one direction).
    """
    factor = min(width // target[0], height // target[1])  # 0 where a side is below the target: no reduction
    return next((s for s in (8, 4, 2) if factor >= s), 1)


def decode_pillow_draft(data: bytes, source: str = "<bytes>", size: int = IMAGE_SIZE) -> np.ndarray:
    """Decode at the smallest of Pillow's DCT scales that is still at least ``size`` a side, then resize.

    ``Image.draft`` must be called after ``Image.open`` and before the pixels are loaded;
    it changes the decoder's settings, and ``load()`` then decodes straight to the
    smaller size. The resize to ``size`` x ``size`` is Pillow's bilinear, as in the
    standard transform.
    """
    try:
        image = Image.open(io.BytesIO(data))
        image.draft("RGB", (size, size))
        image = image.convert("RGB") if image.mode != "RGB" else image
        image.load()
        return np.asarray(image.resize((size, size), Image.BILINEAR))
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise _corrupt(source, exc) from None


def decode_torchvision(data: bytes | torch.Tensor, source: str = "<bytes>") -> torch.Tensor:
    """The whole JPEG, decoded by libjpeg-turbo inside torchvision: a 3 x H x W uint8 tensor.

    ``torchvision.io.decode_jpeg`` wants the bytes as a 1-D uint8 tensor. ``frombuffer``
    wraps a buffer without copying, but ``bytes`` are read-only (torch warns that writing to
    such a tensor is undefined), so the bytes are first copied into a ``bytearray``: one copy
    of the compressed file, several times smaller than the image the decoder then writes.
    The result is a channels-first *view* of the decoder's height x width x RGB output.
    """
    encoded = data if isinstance(data, torch.Tensor) else torch.frombuffer(bytearray(data), dtype=torch.uint8)
    try:
        return decode_jpeg(encoded, mode=ImageReadMode.RGB)
    except RuntimeError as exc:
        raise _corrupt(source, exc) from None


def decode_simplejpeg(data: bytes, source: str = "<bytes>", size: int = IMAGE_SIZE) -> np.ndarray:
    """Decode with ``simplejpeg`` at the smallest libjpeg-turbo scale (any M/8) still at least ``size`` a side.

    libjpeg-turbo scales by M/8 for M = 1 ... 16, not only 1/2, 1/4 and 1/8: a 400 x 350
    image can come out at 6/8 (300 x 263), where Pillow's ``draft`` would decode it
    whole. Returns height x width x RGB uint8, *not yet* resized to ``size``.
    """
    import simplejpeg

    try:
        return simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=size, min_width=size)
    except ValueError as exc:
        raise _corrupt(source, exc) from None


# ------------------------------------------------------------------------------ resizing


def resize_pillow(pixels: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
    """Pillow's bilinear resize of height x width x RGB uint8 pixels to ``size`` x ``size`` (the standard's)."""
    return np.asarray(Image.fromarray(pixels).resize((size, size), Image.BILINEAR))


def resize_uint8(image: torch.Tensor, size: int = IMAGE_SIZE) -> torch.Tensor:
    """torchvision ``transforms.v2``'s antialiased bilinear resize of a C x H x W uint8 tensor: uint8 in, uint8 out.

    On CPUs with AVX2 or AVX-512 (and ARM) v2 hands the uint8 tensor to torch's
    ``interpolate`` as it is; elsewhere it converts to float32 and back (see
    :func:`uint8_resize_is_native`).
    """
    return transforms_v2.resize(image, [size, size], antialias=True)


def uint8_resize_is_native() -> bool:
    """Whether torchvision v2 resizes uint8 without a float32 round trip on this CPU (bilinear)."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2.functional._geometry import _do_native_uint8_resize_on_cpu

    return bool(_do_native_uint8_resize_on_cpu(InterpolationMode.BILINEAR))


def hwc(image: torch.Tensor | np.ndarray) -> np.ndarray:
    """Height x width x RGB uint8 pixels, from a channels-first tensor or an array already in that layout."""
    if isinstance(image, torch.Tensor):
        return image.permute(1, 2, 0).contiguous().numpy()
    return np.asarray(image)


# ------------------------------------------------------------ whole transforms (bytes -> 256 x 256)


def torchvision_decode_and_resize(data: bytes, source: str = "<bytes>") -> torch.Tensor:
    """torchvision decode, then v2's uint8 resize: a 3 x 256 x 256 uint8 tensor (no Pillow at all)."""
    return resize_uint8(decode_torchvision(data, source)).contiguous()


def pillow_decode_torch_resize(data: bytes, source: str = "<bytes>") -> torch.Tensor:
    """Pillow decode (as the standard), then v2's uint8 resize in torch: a 3 x 256 x 256 uint8 tensor."""
    pixels = torch.from_numpy(decode_pillow(data, source).copy()).permute(2, 0, 1)
    return resize_uint8(pixels).contiguous()


def simplejpeg_decode_and_resize(data: bytes, source: str = "<bytes>") -> torch.Tensor:
    """simplejpeg's reduced-size decode, then v2's uint8 resize: a 3 x 256 x 256 uint8 tensor."""
    pixels = torch.from_numpy(decode_simplejpeg(data, source)).permute(2, 0, 1)
    return resize_uint8(pixels).contiguous()


def stored_decode(data: bytes, source: str = "<bytes>") -> torch.Tensor:
    """Decode a JPEG stored at the training size (:mod:`packlab.reencode`): a 3 x H x W uint8 tensor.

    Nothing to resize: the whole cost is one small decode. The tensor is a channels-first
    view of the decoder's output; the collate copies it into the batch anyway, so making
    it contiguous here would copy it twice.
    """
    return decode_torchvision(data, source)


def stored_decode_hwc(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """:func:`stored_decode` as height x width x RGB uint8 pixels, without a copy.

    libjpeg writes pixels interleaved (height x width x RGB) and torchvision returns a
    channels-first *view* of that buffer; permuting back gives the buffer itself. This is
    the layout the course's batch writers convert from (:func:`packlab.transforms.to_tensor`),
    e.g. straight into a recycled batch buffer.
    """
    return decode_torchvision(data, source).permute(1, 2, 0).numpy()


# ------------------------------------------------------------------------------ pixel error


def mean_squared_error(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    """Mean squared difference of two uint8 images of one shape, in grey levels squared."""
    a, b = hwc(a).astype(np.float64), hwc(b).astype(np.float64)
    if a.shape != b.shape:
        raise ValueError(f"images differ in shape: {a.shape} and {b.shape}")
    return float(np.mean((a - b) ** 2))


def psnr(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> float:
    """Peak signal-to-noise ratio of two uint8 images, in dB: ``10 log10(255² / MSE)``; infinite when identical."""
    error = mean_squared_error(a, b)
    return math.inf if error == 0 else 10 * math.log10(255**2 / error)


def psnr_over(images: Sequence, references: Sequence) -> float:
    """PSNR of a set of images against their references, from the mean squared error over all of them.

    Averaging the squared errors first (rather than the dB) weighs every pixel alike, and
    an image that happens to match exactly does not make the mean infinite.
    """
    errors = [mean_squared_error(a, b) for a, b in zip(images, references, strict=True)]
    error = float(np.mean(errors))
    return math.inf if error == 0 else 10 * math.log10(255**2 / error)


def largest_difference(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor) -> int:
    """The largest difference of any one value of two uint8 images, in grey levels."""
    return int(np.abs(hwc(a).astype(np.int16) - hwc(b).astype(np.int16)).max())


# ----------------------------------------------------------------- sources larger than the target


def high_resolution_copies(samples: Sequence, folder, scale: int = 4, root=None, quality: int = 90,
                           subsampling: str = "4:2:0", grain: float = 4.0) -> list:
    """Write ``scale`` times larger copies of some dataset images, for showing when a reduced decode pays.

    Our dataset is ImageNet-sized (about 400 x 350); many datasets today hold camera
    photos several times larger. Each copy is the original enlarged ``scale`` times
    (bicubic) with fresh grain of its own at the new size (a standard deviation of
    ``grain`` levels), seeded by the key, so it has fine detail like a photograph rather
    than the smoothness of an enlargement; saved as cameras and the web save JPEGs
    (quality 90, 4:2:0 chroma subsampling), so that the entropy decoding, which no reduced
    decode can skip, weighs what it weighs in a camera JPEG. Files go to
    ``folder/<key>.jpg``; existing ones are kept (the output depends only on the key, the
    original and the arguments: give each set of arguments its own folder). Returns the
    paths in the order of ``samples``.
    """
    from pathlib import Path

    from packlab import data

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for sample in samples:
        target = folder / f"{sample.key}.jpg"
        paths.append(target)
        if target.exists():
            continue
        with Image.open(data.image_path(sample.key, root)) as original:
            big = original.convert("RGB").resize((original.width * scale, original.height * scale), Image.BICUBIC)
        rng = np.random.default_rng([int(sample.key), scale, 0x41D])
        noise = rng.normal(0, grain, size=(big.height, big.width, 1)).astype(np.float32)
        pixels = np.clip(np.asarray(big, dtype=np.float32) + noise, 0, 255).astype(np.uint8)
        partial = target.with_suffix(".partial")
        Image.fromarray(pixels).save(partial, format="JPEG", quality=quality, subsampling=SUBSAMPLING[subsampling])
        partial.replace(target)
    return paths

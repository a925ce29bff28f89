"""The course's standard image transform, in one place.

Every loader in the course (folder, zip, tar, webdataset) ends in the same transform so
their timings compare like with like: decode the JPEG, resize it to 256x256 *while it is
still uint8* (four times less memory traffic than resizing a float tensor), then convert
to a float tensor in [0, 1], channels first.

Raw-pixel archives store the output of :func:`decode_and_resize` as bytes, so
:func:`pixels_to_tensor` on those bytes gives exactly what :func:`standard_transform`
gives on the JPEG.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

#: Side of the square images every loader returns.
IMAGE_SIZE = 256
#: Shape of one raw-pixel sample as stored in packed archives (height, width, channels).
RAW_SHAPE = (IMAGE_SIZE, IMAGE_SIZE, 3)


class CorruptImageError(ValueError):
    """An encoded image could not be decoded. The message names where it came from."""


def decode_rgb(data: bytes, source: str = "<bytes>") -> Image.Image:
    """Decode JPEG (or any Pillow-readable) bytes to an RGB image.

    ``source`` names the file or archive member in the error raised for corrupt data,
    so a bad sample in a 10,000-image epoch can be found and replaced.
    """
    try:
        return Image.open(io.BytesIO(data)).convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise CorruptImageError(
            f"cannot decode image {source}: {exc}. Check or regenerate the file "
            "(`python -m packlab.data --verify` names damaged originals)."
        ) from None


def decode_and_resize(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """Decode and resize to ``RAW_SHAPE``: uint8 array, height x width x RGB."""
    image = decode_rgb(data, source).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR)
    return np.asarray(image)


def to_tensor(pixels: np.ndarray) -> torch.Tensor:
    """uint8 HxWxC array to float32 CxHxW tensor in [0, 1]."""
    if not pixels.flags.writeable:  # arrays over PIL images or bytes are read-only; torch wants to own them
        pixels = pixels.copy()
    return torch.from_numpy(pixels).permute(2, 0, 1).float().div_(255)


def standard_transform(data: bytes, source: str = "<bytes>") -> torch.Tensor:
    """JPEG bytes to the course's standard 3x256x256 float tensor."""
    return to_tensor(decode_and_resize(data, source))


def pixels_to_tensor(raw: bytes, source: str = "<bytes>") -> torch.Tensor:
    """Raw uint8 pixels (as written by :mod:`packlab.pack` with ``members='raw'``) to a tensor."""
    expected = int(np.prod(RAW_SHAPE))
    if len(raw) != expected:
        raise CorruptImageError(f"raw sample {source} has {len(raw)} bytes, expected {expected} ({RAW_SHAPE} uint8)")
    return to_tensor(np.frombuffer(raw, dtype=np.uint8).reshape(RAW_SHAPE))

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
import warnings

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

#: Side of the square images every loader returns.
IMAGE_SIZE = 256
#: Shape of one raw-pixel sample as stored in packed archives (height, width, channels).
RAW_SHAPE = (IMAGE_SIZE, IMAGE_SIZE, 3)
#: Pillow's names for the chroma subsampling of a JPEG it writes (``Image.save(..., subsampling=...)``).
SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}


class CorruptImageError(ValueError):
    """An encoded image could not be decoded. The message names where it came from."""


def decode_rgb(data: bytes, source: str = "<bytes>") -> Image.Image:
    """Decode JPEG (or any Pillow-readable) bytes to an RGB image.

    ``source`` names the file or archive member in the error raised for corrupt data,
    so a bad sample in a 10,000-image epoch can be found and replaced.
    """
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
        # convert() always copies, even to the mode the image already has: skip it then.
        return image if image.mode == "RGB" else image.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise CorruptImageError(
            f"cannot decode image {source}: {exc}. Check or regenerate the file "
            "(`python -m packlab.data --verify` names damaged originals)."
        ) from None


def decode_and_resize(data: bytes, source: str = "<bytes>") -> np.ndarray:
    """Decode and resize to ``RAW_SHAPE``: uint8 array, height x width x RGB."""
    image = decode_rgb(data, source).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR)
    return np.asarray(image)


def to_tensor(pixels: np.ndarray, out: torch.Tensor | None = None) -> torch.Tensor:
    """uint8 HxWxC array to a contiguous float32 CxHxW tensor in [0, 1], written into ``out`` if given.

    The division reads the uint8 pixels channels-first and writes the float tensor in
    one pass. The result is contiguous, so stacking a batch is a plain copy; a merely
    permuted view (``permute(2, 0, 1).float()``) keeps the pixel-interleaved layout and
    makes every later copy a slow strided one. With ``out`` (e.g. one image's slot in a
    batch) nothing else is allocated.
    """
    height, width, channels = pixels.shape
    if out is None:
        out = torch.empty((channels, height, width), dtype=torch.float32)
    with warnings.catch_warnings():
        # Arrays over PIL images or bytes are read-only; we only read them, never write.
        warnings.simplefilter("ignore", UserWarning)
        source = torch.from_numpy(pixels)
    torch.div(source.permute(2, 0, 1), 255, out=out)
    return out


def standard_transform(data: bytes, source: str = "<bytes>") -> torch.Tensor:
    """JPEG bytes to the course's standard 3x256x256 float tensor."""
    return to_tensor(decode_and_resize(data, source))


def raw_to_array(raw: bytes, source: str = "<bytes>") -> np.ndarray:
    """Raw uint8 pixels (as written by :mod:`packlab.pack` with ``members='raw'``) as a ``RAW_SHAPE`` array.

    No copy: the array is a read-only view of ``raw``.
    """
    expected = int(np.prod(RAW_SHAPE))
    if len(raw) != expected:
        raise CorruptImageError(
            f"raw sample {source} has {len(raw)} bytes, expected {expected} ({RAW_SHAPE} uint8): it is truncated or "
            "was written for another image size. Rewrite it with packlab.pack (write_raw_folder or write_zip members='raw')."
        )
    return np.frombuffer(raw, dtype=np.uint8).reshape(RAW_SHAPE)


def pixels_to_tensor(raw: bytes, source: str = "<bytes>") -> torch.Tensor:
    """Raw uint8 pixels (as written by :mod:`packlab.pack` with ``members='raw'``) to the standard tensor."""
    return to_tensor(raw_to_array(raw, source))

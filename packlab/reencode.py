"""Store what you train on: the dataset re-encoded once at the training resolution.

A loader that decodes an ImageNet-sized JPEG and resizes it to 256 x 256 throws most of
the decoded pixels away, every epoch. FFCV's answer is to do that work once: store each
image already reduced (FFCV: to a maximum side, e.g. 256 or 512 px) and re-encoded as
JPEG at a chosen quality, so that every later epoch decodes a small image and resizes
nothing. Three choices set the trade-off, and this module makes each a parameter:

* **size and shape**: ``fit="square"`` squashes every image to ``size`` x ``size``, the
  course's standard transform, done once: at 256 nothing is left to resize, but the
  aspect ratio is gone and a random crop can only cut into the squashed picture.
  ``fit="max side"`` keeps the aspect ratio and shrinks the longer side to ``size``
  (never enlarging), as FFCV does (``RGBImageField(max_resolution=...)``: "resize images
  to have maximum side length equal to this value", ``ffcv/fields/rgb_image.py``), so
  the training transform's random resized crop still sees the whole picture; a larger
  side keeps more detail for small crops, at more bytes and decode time;
* **quality** (1-100): bytes and decode time against the error a second lossy encoding
  adds to the pixels;
* **chroma subsampling**: ``"4:2:0"`` stores colour at half the resolution in each
  direction (libjpeg's default, and what most JPEGs on the web use), ``"4:4:4"`` at full
  resolution, as ImageNet's originals and ours are stored. Half the colour samples means
  fewer bytes and a cheaper decode.

The writing is a map over shards (:func:`packlab.preprocess.map_shards`): one output
shard per input shard, in parallel, atomic and resumable. The output shards hold
``<key>.jpg`` and ``<key>.cls`` like the originals, so the course's tar reader reads them
unchanged; only the transform changes (:func:`packlab.decode.stored_decode`).

The raw-pixel shards of chapters 2 and 7 are the limit of this idea: no decode at all,
no pixel error, and about twice the bytes of the original JPEGs.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from packlab.loaders.tar import RawSample
from packlab.preprocess import MapReport, map_shards
from packlab.transforms import IMAGE_SIZE, RAW_SHAPE, SUBSAMPLING, decode_and_resize, decode_rgb

#: How a stored image gets its size: squashed to a square, or the longer side shrunk with the aspect kept.
FITS = ("square", "max side")


@dataclass(frozen=True)
class StoredFormat:
    """How images are stored for training: side in pixels, JPEG quality, chroma subsampling."""

    size: int = IMAGE_SIZE
    quality: int = 90
    subsampling: str = "4:2:0"
    fit: str = "square"

    def __post_init__(self):
        if self.fit not in FITS:
            raise ValueError(f"fit must be one of {FITS}, got {self.fit!r}")
        if self.subsampling not in SUBSAMPLING:
            raise ValueError(f"subsampling must be one of {sorted(SUBSAMPLING)}, got {self.subsampling!r}")
        if not 1 <= self.quality <= 100:
            raise ValueError(f"JPEG quality must be between 1 and 100, got {self.quality}")

    @property
    def name(self) -> str:
        """How tables call it: ``"256 px, q90, 4:2:0"`` (squashed square), ``"max side 320, q90, 4:2:0"``."""
        shape = f"{self.size} px" if self.fit == "square" else f"max side {self.size}"
        return f"{shape}, q{self.quality}, {self.subsampling}"

    @property
    def folder_name(self) -> str:
        """Where its shards go under the packed folder: ``stored-256-q90-420``, ``stored-max320-q90-420``."""
        shape = f"{self.size}" if self.fit == "square" else f"max{self.size}"
        return f"stored-{shape}-q{self.quality}-{self.subsampling.replace(':', '')}"


def encode_pixels(pixels: np.ndarray, quality: int, subsampling: str = "4:2:0") -> bytes:
    """Height x width x RGB uint8 pixels as JPEG bytes at ``quality`` and ``subsampling``."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=quality, subsampling=SUBSAMPLING[subsampling])
    return out.getvalue()


def max_side_size(width: int, height: int, side: int) -> tuple[int, int]:
    """``(width, height)`` with the longer side shrunk to ``side`` and the aspect ratio kept; never enlarged."""
    longer = max(width, height)
    if longer <= side:
        return width, height
    return max(1, round(width * side / longer)), max(1, round(height * side / longer))


def stored_pixels(image_bytes: bytes, size: int, source: str = "<bytes>", fit: str = "square") -> np.ndarray:
    """What gets encoded, resized with Pillow's bilinear filter (antialiased when it shrinks).

    ``fit="square"``: at the training size exactly the standard transform's pixels (the only
    difference from the standard is then the second JPEG encoding), else ``size`` x ``size``.
    ``fit="max side"``: the longer side ``size``, aspect kept (:func:`max_side_size`).
    """
    if fit == "square":
        if size == IMAGE_SIZE:
            return decode_and_resize(image_bytes, source)
        return np.asarray(decode_rgb(image_bytes, source).resize((size, size), Image.BILINEAR))
    image = decode_rgb(image_bytes, source)
    target = max_side_size(*image.size, size)
    return np.asarray(image if target == image.size else image.resize(target, Image.BILINEAR))


def to_stored_jpeg(sample: RawSample, size: int = IMAGE_SIZE, quality: int = 90, subsampling: str = "4:2:0",
                   fit: str = "square") -> dict:
    """A per-sample function for :func:`packlab.preprocess.map_shards`: ``<key>.jpg`` stored in that form, and ``<key>.cls``."""
    pixels = stored_pixels(sample.image_bytes, size, sample.source, fit)
    return {"cls": str(sample.label).encode(), "jpg": encode_pixels(pixels, quality, subsampling)}


def write_stored_shards(inputs: Sequence[str | Path], folder: str | Path, form: StoredFormat = StoredFormat(),
                        processes: int | None = None, progress: bool = False) -> tuple[list[Path], MapReport]:
    """Re-encode every sample of the ``inputs`` shards in ``form``, one output shard per input, in ``folder``.

    Shards already written are kept (``map_shards`` is resumable), so calling it again
    costs nothing. Returns the output shard paths (in the inputs' order) and the report.
    """
    function = functools.partial(to_stored_jpeg, size=form.size, quality=form.quality, subsampling=form.subsampling,
                                 fit=form.fit)
    report = map_shards(function, inputs, folder, processes=processes, progress=progress)
    return [Path(r.output) for r in report.shards], report


def stored_folder(inputs: Sequence[str | Path], form: StoredFormat, parent: str | Path) -> Path:
    """A folder for the ``inputs`` shards re-encoded in ``form``, named after the inputs' names, sizes and times.

    ``map_shards`` skips an output that exists, by name; should the input shards be
    rewritten (another shard size, a regenerated dataset), their names may stay the same
    while their samples change. Naming the folder after the inputs' sizes and modification
    times means such a change gets a fresh folder instead of stale outputs.
    """
    import hashlib

    digest = hashlib.sha256()
    for path in inputs:
        stat = Path(path).stat()
        digest.update(f"{Path(path).name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return Path(parent) / f"{form.folder_name}-{digest.hexdigest()[:10]}"


def stored_pixel_error(stored_shards: Sequence[str | Path], reference: dict, read, limit: int | None = None) -> dict:
    """PSNR of the stored images, as ``read(jpg_bytes, source)`` delivers them, against ``reference[key]`` pixels.

    ``reference`` maps keys to the standard transform's uint8 pixels (height x width x
    RGB); samples of the shards not in it are passed over, and at most ``limit`` are
    compared. Returns ``{"images", "psnr_db", "largest_difference"}``.
    """
    from packlab.decode import largest_difference, psnr_over
    from packlab.preprocess import iter_samples

    delivered, expected = [], []
    for shard in stored_shards:
        for key, files in iter_samples(shard):
            if key in reference and (limit is None or len(delivered) < limit):
                delivered.append(read(files["jpg"], f"{shard}:{key}.jpg"))
                expected.append(reference[key])
    if not delivered:
        raise ValueError("none of the reference keys is in the stored shards")
    return {"images": len(delivered), "psnr_db": psnr_over(delivered, expected),
            "largest_difference": max(largest_difference(a, b) for a, b in zip(delivered, expected))}


def total_bytes(paths: Sequence[str | Path]) -> int:
    """Bytes on disk of some files (shards, or the original JPEGs)."""
    return sum(Path(p).stat().st_size for p in paths)


def raw_pixel_bytes(images: int) -> int:
    """Bytes of ``images`` samples stored as raw 256 x 256 RGB pixels (chapters 2 and 7), headers aside."""
    return images * int(np.prod(RAW_SHAPE))

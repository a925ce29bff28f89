"""Every image decoded once, small, into memory: the training data of the accuracy experiments.

Decoding a JPEG costs milliseconds; a training step of the tiny model on small images costs
about as much for a whole batch. An experiment that trains dozens of models on the same
images must therefore decode each image once and keep the result. :func:`small_pixels`
does that, for the originals or for any other encoding of the same samples, and caches
the array under ``<data root>/packed/accuracy/`` so that a second run loads it in a
fraction of a second.

What the model then sees is ``side × side`` pixels (32 by default): the tiny CNN's view of
the classes, which differ in colour and coarse pattern. A second lossy encoding leaves
marks finer than that, so :func:`small_pixels` takes the ``side`` as an argument: the
storage experiment uses 64, what :class:`packlab.train.TinyCNN` sees of a 256-pixel image
after its own 4 × 4 pooling.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import NamedTuple

import numpy as np
from PIL import Image

from packlab import cpus, data, paths

#: The side of the small images, in pixels, unless told otherwise.
SIDE = 32
#: Bumped when the way images are made small changes: old caches are then rebuilt.
VERSION = 1
#: Images a process takes at a time (``pool.map``'s chunks) in :func:`shrink_all`:
#: no more processes start than there are chunks, since a process without one would sit idle.
SHRINK_CHUNK = 64


class SmallImages(NamedTuple):
    """Small decoded images with their labels and keys, in manifest order."""

    pixels: np.ndarray  # uint8, N x side x side x 3
    labels: np.ndarray  # int64, N
    keys: list[str]

    def __len__(self) -> int:
        return len(self.keys)


def subset(images: SmallImages, indices) -> SmallImages:
    """The images at ``indices`` (in that order), with their labels and keys."""
    indices = np.asarray(indices, dtype=np.int64)
    return SmallImages(images.pixels[indices], images.labels[indices], [images.keys[i] for i in indices])


def shrink(encoded: bytes, side: int, source: str = "<bytes>") -> np.ndarray:
    """A JPEG's pixels at ``side`` × ``side`` (uint8, H x W x 3).

    Pillow's ``draft`` lets libjpeg decode at 1/2, 1/4 or 1/8 scale where the result
    stays at least twice ``side`` (cheap and, that far above the target, invisible after
    the resize); a box filter then averages the pixels down, as the model's pooling would.
    """
    try:
        with Image.open(io.BytesIO(encoded)) as image:
            image.draft("RGB", (2 * side, 2 * side))
            return np.asarray(image.convert("RGB").resize((side, side), Image.BOX))
    except Exception as exc:  # noqa: BLE001 - every decoder error gets the same message
        raise ValueError(f"{source}: cannot decode this image ({exc}); regenerate the data with `make data`") from exc


def _shrink_job(job: tuple[bytes | str, int, str]) -> np.ndarray:
    item, side, source = job
    encoded = Path(item).read_bytes() if isinstance(item, str) else item
    return shrink(encoded, side, source)


def shrink_all(items: Sequence[bytes | str], side: int, sources: Sequence[str], progress: bool = True,
               workers: int | None = None) -> np.ndarray:
    """:func:`shrink` every item (encoded bytes, or a path to read them from) on the cores; N x side x side x 3.

    ``workers`` processes, by default one per core but no more than chunks of ``SHRINK_CHUNK`` items.
    """
    from tqdm import tqdm

    jobs = [(item, side, source) for item, source in zip(items, sources)]
    workers = workers or cpus.workers_for(math.ceil(len(jobs) / SHRINK_CHUNK))  # a process takes whole chunks
    out = np.empty((len(jobs), side, side, 3), dtype=np.uint8)
    bar = tqdm(total=len(jobs), desc=f"decoding once at {side}x{side}", unit="img", disable=not progress)
    if workers <= 1:
        for i, job in enumerate(jobs):
            out[i] = _shrink_job(job)
            bar.update()
    else:
        with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
            for i, pixels in enumerate(pool.map(_shrink_job, jobs, chunksize=SHRINK_CHUNK)):
                out[i] = pixels
                bar.update()
    bar.close()
    return out


def _cache_path(name: str, side: int, fingerprint: str, root: Path | None) -> Path:
    return paths.packed_dir(root) / "accuracy" / f"{name}-{side}px-v{VERSION}-{fingerprint[:12]}.npz"


def manifest_fingerprint(samples: Sequence[data.Sample]) -> str:
    """A digest of the samples' keys and checksums: a cache made from other images is not reused."""
    digest = hashlib.sha256()
    for sample in samples:
        digest.update(f"{sample.key}:{sample.sha256};".encode())
    return digest.hexdigest()


def cached(name: str, side: int, samples: Sequence[data.Sample], make: Callable[[], np.ndarray],
           root: Path | None = None) -> SmallImages:
    """The small images ``make()`` returns for ``samples``, from the cache when it holds them."""
    path = _cache_path(name, side, manifest_fingerprint(samples), root)
    labels = np.array([s.label for s in samples], dtype=np.int64)
    keys = [s.key for s in samples]
    if path.exists():
        with np.load(path) as stored:
            return SmallImages(stored["pixels"], labels, keys)
    pixels = make()
    if pixels.shape[0] != len(samples):
        raise ValueError(f"{name}: {pixels.shape[0]} images made for {len(samples)} samples")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.stem}.partial-{os.getpid()}.npz")
    np.savez(partial, pixels=pixels)
    os.replace(partial, path)
    return SmallImages(pixels, labels, keys)


def small_pixels(root: Path | None = None, side: int = SIDE, samples: Sequence[data.Sample] | None = None,
                 progress: bool = True) -> SmallImages:
    """The dataset's original JPEGs, each decoded once at ``side`` × ``side`` (cached)."""
    root = root or paths.data_root()
    samples = list(samples) if samples is not None else data.load_manifest(root)
    files = [str(data.image_path(s.key, root)) for s in samples]
    return cached("originals", side, samples,
                  lambda: shrink_all(files, side, files, progress=progress), root)


def small_pixels_of(name: str, encoded: Callable[[data.Sample], bytes], samples: Sequence[data.Sample],
                    side: int = SIDE, root: Path | None = None, progress: bool = True) -> SmallImages:
    """The same samples in another encoding (``encoded(sample)`` gives its bytes), decoded once (cached as ``name``)."""
    samples = list(samples)

    def make() -> np.ndarray:
        blobs = [encoded(s) for s in samples]
        return shrink_all(blobs, side, [f"{name}:{s.key}" for s in samples], progress=progress)

    return cached(name, side, samples, make, root)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB between two uint8 image stacks (inf when identical)."""
    error = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if error == 0 else float(10 * np.log10(255.0**2 / error))

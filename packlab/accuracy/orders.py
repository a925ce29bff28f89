"""The orders a training run can see its samples in, produced by the readers that produce them.

An order here is an array of indices into the training images, as a training loop receives
them. Where a real reader makes the order (the course's :class:`~packlab.loaders.TarShardDataset`
with its shard shuffle and buffer), it is *that reader* that makes it, reading real shards
with a transform that skips decoding: the keys it delivers, in the order it delivers them,
mapped to indices. Only the pixels come from elsewhere (:mod:`.pixels`, decoded once).

With DataLoader workers the training loop does not see one reader's stream but the
workers' batches in turn: worker 0's first batch, worker 1's first, worker 0's second, …
(``_MultiProcessingDataLoaderIter`` with ``in_order=True``). :func:`loader_order` builds
exactly that from each worker's share (:meth:`TarShardDataset.iter_share`), without
starting processes; ``tests/test_accuracy.py`` checks it against a real DataLoader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from packlab import data, pack, paths
from packlab.accuracy.pixels import SmallImages
from packlab.accuracy.training import BATCH_SIZE
from packlab.loaders.tar import TarShardDataset, skip_decode


def copy_folder(name: str, root: Path | None = None) -> Path:
    """Where the chapter keeps a copy it writes once and reads in every build: ``<data root>/packed/accuracy/<name>``."""
    return paths.packed_dir(root) / "accuracy" / name


def shard_copy(samples: Sequence[data.Sample], name: str, per_shard: int, class_sorted: bool,
               root: Path | None = None) -> list[Path]:
    """Tar shards of ``samples`` (cached under ``packed/accuracy/``): written sorted by class, or shuffled first.

    ``class_sorted=True`` writes them as a listing per class would hand them over (a folder
    per class, as ImageNet's), ``per_shard`` to a shard: each shard then holds one class,
    or two where a class ends. ``False`` shuffles them before cutting, as chapter 5 teaches.
    """
    folder = copy_folder(f"{name}-{len(samples)}-{per_shard}", root)
    done = folder / ".complete"
    if not done.exists():
        ordered = sorted(samples, key=lambda s: (s.label, s.key)) if class_sorted else list(samples)
        pack.write_tar_shards(folder, samples=ordered, root=root, maxcount=per_shard, shuffle=not class_sorted,
                              seed=0, progress=False)
        done.touch()
    return sorted(folder.glob("shard-*.tar"))


def image_shards(images: SmallImages, name: str, per_shard: int, class_sorted: bool,
                 root: Path | None = None) -> list[Path]:
    """Tar shards of generated images (:mod:`.patterns`), ``per_shard`` to a shard, cached under ``packed/accuracy/``.

    The same layout as the course's shards (``<key>.cls`` then ``<key>.jpg``, the image as a
    JPEG), so the course's :class:`~packlab.loaders.TarShardDataset` reads them as it reads any.
    ``class_sorted=True`` writes them class by class (a shard holds one class, or two where
    a class ends), ``False`` in a shuffled order, as chapter 5 teaches.
    """
    import io
    import tarfile

    from PIL import Image

    folder = copy_folder(f"{name}-{len(images)}-{per_shard}", root)
    done = folder / ".complete"
    if not done.exists():
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("shard-*.tar"):
            old.unlink()
        labels = np.asarray(images.labels)
        order = (np.argsort(labels, kind="stable") if class_sorted
                 else np.random.default_rng(0).permutation(len(images)))
        for number, start in enumerate(range(0, len(order), per_shard)):
            with tarfile.open(folder / f"shard-{number:06d}.tar", "w") as shard:
                for i in order[start : start + per_shard]:
                    encoded = io.BytesIO()
                    Image.fromarray(images.pixels[i]).save(encoded, format="JPEG", quality=95)
                    for suffix, payload in (("cls", str(int(labels[i])).encode()), ("jpg", encoded.getvalue())):
                        member = tarfile.TarInfo(f"{images.keys[i]}.{suffix}")
                        member.size = len(payload)
                        shard.addfile(member, io.BytesIO(payload))
        done.touch()
    return sorted(folder.glob("shard-*.tar"))


def loader_order(dataset: TarShardDataset, workers: int, batch_size: int) -> list[str]:
    """The keys in the order a DataLoader with ``workers`` workers hands ``dataset``'s samples to the loop.

    Each worker reads its share (``iter_share``); the DataLoader takes one batch from each
    worker in turn, and a worker whose share has ended drops out of the turn. The dataset
    must be built with ``return_key=True``.
    """
    readers = [iter(dataset.iter_share(w, max(workers, 1))) for w in range(max(workers, 1))]
    keys: list[str] = []
    while readers:
        for reader in list(readers):
            batch = [item[2] for _, item in zip(range(batch_size), reader)]
            keys += batch
            if len(batch) < batch_size:
                readers.remove(reader)
    return keys


def tar_order(shards: Sequence[Path], index: Mapping[str, int], seed: int, epoch: int, shuffle_buffer: int,
              workers: int = 2, batch_size: int = BATCH_SIZE) -> np.ndarray:
    """The course's tar reader's order for one epoch: shard shuffle from (seed, epoch), a buffer per worker."""
    dataset = TarShardDataset([str(s) for s in shards], shuffle_buffer=shuffle_buffer, seed=seed, transform=skip_decode,
                              return_key=True, rank=0, world_size=1)
    dataset.set_epoch(epoch)
    return np.array([index[key] for key in loader_order(dataset, workers, batch_size)])


def class_sorted_order(labels: np.ndarray) -> np.ndarray:
    """Every sample of class 0, then of class 1, …: the order of a listing per class, no shuffle at all."""
    return np.argsort(labels, kind="stable")

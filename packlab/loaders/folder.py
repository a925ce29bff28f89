"""One file per sample: the map-style datasets of chapters 1 and 2.

The simplest layout there is, and the one most datasets ship in: a folder of image
files plus a labels file. Reading sample ``i`` opens, reads and closes one file, then
turns its bytes into the image. Every worker opens its own files, so there is no shared
handle to go wrong with workers (compare :mod:`packlab.loaders.zip`); the price is one
``open`` (a metadata lookup) per sample per epoch, which is what packing removes.

* :class:`JpegFolderDataset` reads the original JPEGs, ``<root>/images/<key>.jpg``.
* :class:`RawFolderDataset` reads pixels decoded and resized ahead of time
  (:func:`packlab.pack.write_raw_folder`): as many files, but no decode left to do.
  Chapter 2 compares the two to separate the effect of preprocessing from that of packing.

A file that is listed but missing, or that does not decode, raises an error naming it;
with ``on_bad_sample="skip"`` it is skipped and counted instead (see
:mod:`packlab.loaders.skipping`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import torch
from torch.utils.data import Dataset

from packlab import data, paths
from packlab.loaders.skipping import BadSampleHandling
from packlab.memory import StringColumn, int_column
from packlab.storage import open_local
from packlab.transforms import CorruptImageError, pixels_to_tensor, standard_transform


class FileFolderDataset(Dataset, BadSampleHandling):
    """Map-style dataset over ``<folder>/<key><suffix>``, labels from the dataset's labels file.

    Samples are the keys of the labels file (``<root>/labels.csv``, ``root`` defaulting to
    :func:`packlab.paths.data_root`) in sorted order, or the ``keys`` given (a slice of the
    dataset, in the order given; each must be in the labels file). ``dataset[i]`` is ``(image, label)``,
    or ``(image, label, key)`` with ``return_key=True``. ``transform(file_bytes, source)``
    makes the image; ``source`` is the file's path, so a corrupt file is named in the error.

    ``on_bad_sample="skip"`` skips a file that is missing or does not decode, with a
    :class:`~packlab.loaders.skipping.BadSampleWarning`, and counts it in ``skipped``
    (summed over DataLoader workers). ``dataset[i]`` then returns a
    :class:`~packlab.loaders.skipping.SkippedSample` marker for it, so the DataLoader needs
    ``collate_fn=packlab.loaders.skipping.collate_skipping_bad``. A missing folder or labels
    file raises in either mode.

    ``opener(path)`` opens each file for reading (default: the local filesystem); pass
    :meth:`packlab.storage.NetworkFSModel.open` to read as if over a network filesystem.
    """

    suffix = ""

    def __init__(
        self,
        folder: Path | str,
        *,
        root: Path | str | None = None,
        keys: Sequence[str] | None = None,
        transform: Callable[[bytes, str], torch.Tensor],
        return_key: bool = False,
        on_bad_sample: str = "raise",
        opener: Callable[[str], BinaryIO] = open_local,
    ):
        self._set_bad_sample_mode(on_bad_sample)
        self.opener = opener
        root = Path(root) if root is not None else paths.data_root()
        self.folder = Path(folder)
        self.labels_file = paths.labels_path(root)
        if not self.folder.is_dir():
            raise FileNotFoundError(
                f"folder {self.folder} does not exist. Generate the dataset with `make data` "
                "(or `python -m packlab.data`); for packed copies see packlab.pack."
            )
        labels = data.load_labels(root)  # raises DatasetError naming the labels file
        # The labels file is the index: read once, no directory listing, shared by all workers.
        keys = sorted(labels) if keys is None else list(keys)
        unknown = [k for k in keys if k not in labels]
        if unknown:
            raise data.DatasetError(f"{len(unknown)} keys are not in {self.labels_file} (first: {unknown[:5]}).")
        # Kept as one blob and one array, not as lists of Python objects: workers that read them would
        # otherwise each copy every page of the index (packlab.memory, chapter 12).
        self.keys = StringColumn(keys)
        self.labels = int_column(labels[k] for k in keys)
        self.transform = transform
        self.return_key = return_key

    def __len__(self) -> int:
        return len(self.keys)

    def path_of(self, index: int) -> Path:
        """The file behind sample ``index``."""
        return self.folder / f"{self.keys[index]}{self.suffix}"

    def read_file(self, path: Path) -> bytes:
        """The bytes of one sample's file; a missing file is named together with the labels file."""
        try:
            with self.opener(str(path)) as f:  # one open + read + close per sample, every epoch
                return f.read()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path} is listed in {self.labels_file} but does not exist. "
                "Run `python -m packlab.data --verify` to list every missing original."
            ) from None

    def __getitem__(self, index: int):
        path = self.path_of(index)
        try:
            image = self.transform(self.read_file(path), str(path))  # CorruptImageError names the path
        except (FileNotFoundError, CorruptImageError) as exc:
            if not self.skipping:
                raise
            reason = "missing file" if isinstance(exc, FileNotFoundError) else "corrupt image"
            return self._skip(str(path), reason, exc)
        if self.return_key:
            return image, self.labels[index], self.keys[index]
        return image, self.labels[index]


class JpegFolderDataset(FileFolderDataset):
    """The original JPEGs, ``<root>/images/<key>.jpg``, with labels from ``<root>/labels.csv``.

    ``root`` is the data root (default: :func:`packlab.paths.data_root`). The default
    transform is the course's :func:`packlab.transforms.standard_transform` (decode,
    resize to 256x256 as uint8, then a 3x256x256 float tensor). For ``on_bad_sample``
    see :class:`FileFolderDataset`.
    """

    suffix = ".jpg"

    def __init__(
        self,
        root: Path | str | None = None,
        *,
        keys: Sequence[str] | None = None,
        transform: Callable[[bytes, str], torch.Tensor] = standard_transform,
        return_key: bool = False,
        on_bad_sample: str = "raise",
        opener: Callable[[str], BinaryIO] = open_local,
    ):
        root = Path(root) if root is not None else paths.data_root()
        super().__init__(
            paths.images_dir(root), root=root, keys=keys, transform=transform, return_key=return_key,
            on_bad_sample=on_bad_sample, opener=opener,
        )


class RawFolderDataset(FileFolderDataset):
    """Pre-resized raw pixels, ``<folder>/<key>.raw`` (see :func:`packlab.pack.write_raw_folder`).

    Pass the folder :func:`packlab.pack.ensure_raw_folder` returns. Images are bit-identical
    to :class:`JpegFolderDataset`'s; labels come from ``<root>/labels.csv``. For
    ``on_bad_sample`` see :class:`FileFolderDataset`.
    """

    suffix = ".raw"

    def __init__(
        self,
        folder: Path | str,
        *,
        root: Path | str | None = None,
        keys: Sequence[str] | None = None,
        transform: Callable[[bytes, str], torch.Tensor] = pixels_to_tensor,
        return_key: bool = False,
        on_bad_sample: str = "raise",
        opener: Callable[[str], BinaryIO] = open_local,
    ):
        super().__init__(
            folder, root=root, keys=keys, transform=transform, return_key=return_key, on_bad_sample=on_bad_sample,
            opener=opener,
        )

"""HDF5 (through h5py): one file of named arrays, read by index.

**Layout.** Three one-dimensional datasets of the same length, in sorted key order:
``images`` (variable-length ``uint8``: each element is one sample's JPEG bytes),
``labels`` (``int64``) and ``keys`` (fixed-length ASCII). Storage is *contiguous*: no
chunking and no compression. JPEG bytes do not compress further, and for variable-length
data a filter would not reach them anyway: the dataset itself holds only references into
the file's *global heap*, where the bytes live, and filters apply to the dataset's chunks,
not to the heap (chapter 9 shows it with ``gzip`` on arrays of zeros). Reading element
``i`` reads its reference, then its bytes from the heap.

**The default driver reads with ``pread``.** h5py opens a path with HDF5's ``sec2``
driver, which on Linux reads with positional reads (``pread``: offset given with each
call, the file's shared offset neither used nor moved). So two forked processes reading
through one inherited file do not move each other's reads, unlike zip's seek + read
(chapter 9 shows that reading leaves the file's offset where it was, and audits an epoch). h5py's own advice is still
to open the file in each reader process: the library's state (caches, identifiers, its
lock) is copied by ``fork``, which is safe only as long as nothing in the parent writes.

**A Python file object changes that.** Given a file-like object instead of a path, h5py
uses its ``fileobj`` driver, which calls the object's ``seek`` and ``read``; inherited
through ``fork`` that is chapter 3's shared offset again. That is also how the
slow-storage model (``opener=``) reaches HDF5, so the datasets here open through the
opener in each process, like every other handle.

:class:`NaiveHdf5Dataset` keeps the first attempt (file opened in ``__init__``) for
chapter 9 and the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import BinaryIO

import h5py
import numpy as np

from packlab import data
from packlab.formats.common import (
    DamagedSampleError,
    PackedMapDataset,
    PerProcessHandle,
    ensure_written,
    jpeg_records,
    open_packed,
    progress,
    written_atomically,
)

#: Samples written per assignment: h5py writes a slice of variable-length elements in one call.
WRITE_BATCH = 256


def write_hdf5(dst: Path | str, *, samples: Sequence[data.Sample] | None = None, root: Path | None = None,
               progress_bar: bool = True) -> Path:
    """Write samples (default: the whole manifest) into one HDF5 file at ``dst`` (layout: module docstring)."""
    with written_atomically(dst, samples, root) as (tmp, samples), h5py.File(tmp, "w") as f:
        images = f.create_dataset("images", (len(samples),), dtype=h5py.vlen_dtype(np.uint8))  # contiguous, unfiltered
        f.create_dataset("labels", data=np.array([s.label for s in samples], dtype=np.int64))
        f.create_dataset("keys", data=np.array([s.key for s in samples], dtype="S"))
        f.attrs["layout"] = "images[i]: JPEG bytes of keys[i]; labels[i]: its class"
        batch: list[np.ndarray] = []
        start = 0
        for sample, jpeg in progress(jpeg_records(samples, root), len(samples), "hdf5", progress_bar):
            batch.append(np.frombuffer(jpeg, dtype=np.uint8))
            if len(batch) == WRITE_BATCH or start + len(batch) == len(samples):
                column = np.empty(len(batch), dtype=object)
                column[:] = batch
                images[start : start + len(batch)] = column
                start += len(batch)
                batch = []
    return Path(dst)


def ensure_hdf5(root: Path | None = None, samples: Sequence[data.Sample] | None = None, name: str = "images",
                progress_bar: bool = True) -> Path:
    """The course's HDF5 file ``<data root>/packed/<name>.h5``, written once and then reused."""
    return ensure_written(".h5", write_hdf5, root, samples, name, progress_bar)


class Hdf5File:
    """An open HDF5 file of the course's layout (and the file object under it, if one was given)."""

    def __init__(self, path: Path, opener: Callable[[str], BinaryIO] | None = None):
        self.fileobj, self.file = open_packed(path, opener, "HDF5", "write_hdf5", lambda where: h5py.File(where, "r"),
                                              errors=(OSError,))
        missing = [name for name in ("images", "labels", "keys") if name not in self.file]
        if missing:
            self.close()
            raise data.DatasetError(f"{path} has no dataset {missing[0]!r}: files written by packlab.formats.write_hdf5() have images, labels and keys.")
        self.images = self.file["images"]

    def index(self, path: Path) -> tuple[list[str], list[int]]:
        """All keys and labels, in stored order."""
        keys = [k.decode("ascii") for k in self.file["keys"][:]]
        labels = self.file["labels"][:].tolist()
        if not len(keys) == len(labels) == len(self.images):
            raise data.DatasetError(f"{path}: images, labels and keys differ in length ({len(self.images)}, {len(labels)}, {len(keys)}). Rewrite the file.")
        return keys, labels

    def close(self) -> None:
        self.file.close()  # h5py leaves a file object open: close it after the HDF5 file, as h5py asks
        if self.fileobj is not None:
            self.fileobj.close()


class Hdf5Dataset(PerProcessHandle, PackedMapDataset):
    """Map-style dataset over an HDF5 file written by :func:`write_hdf5`; safe with workers.

    ``dataset[i]`` is ``(image, label)`` for the i-th key in sorted order (or of ``keys``,
    in the order given), ``(image, label, key)`` with ``return_key=True``. Each process
    opens its own file on first use (:class:`~packlab.formats.common.PerProcessHandle`).
    ``opener(path)``, if given, opens the file as a Python file object, which h5py then
    reads through (e.g. :meth:`packlab.storage.NetworkFSModel.open`); by default h5py
    opens the path itself. ``on_bad_sample="skip"`` skips and counts an element that
    cannot be read or decoded; a missing, truncated or damaged file raises in both modes.
    """

    def __init__(self, path: Path | str, *, keys: Sequence[str] | None = None, transform: Callable | None = None,
                 return_key: bool = False, on_bad_sample: str = "raise",
                 opener: Callable[[str], BinaryIO] | None = None):
        self._set_options(transform, return_key, on_bad_sample)
        self.path = Path(path)
        self.opener = opener
        with closing(Hdf5File(self.path, opener)) as first:  # the index is read here, and the file closed at once
            self._keep(*first.index(self.path), keys)

    def _open_handle(self) -> Hdf5File:
        return Hdf5File(self.path, self.opener)

    def read_record(self, index: int) -> tuple[int, bytes]:
        images = self.handle().images
        try:
            payload = images[self.positions[index]].tobytes()
        except (OSError, ValueError) as exc:
            raise DamagedSampleError(
                f"cannot read images[{self.positions[index]}] (key {self.keys[index]}) of HDF5 file {self.path}: {exc}. "
                "Rewrite the file with packlab.formats.write_hdf5()."
            ) from None
        return self.labels[index], payload


class NaiveHdf5Dataset(PackedMapDataset):
    """THE ANTI-PATTERN, kept for chapter 9 and the tests: the file is opened in ``__init__``.

    ``through_file_object=True`` opens it as h5py does for a Python file object (the
    ``fileobj`` driver, ``seek`` + ``read`` on one shared file), the way an ``opener``
    would. Correct in one process; chapter 9 shows what each variant does with workers.
    """

    def __init__(self, path: Path | str, *, return_key: bool = False, through_file_object: bool = False):
        self._set_options(None, return_key, "raise")
        self.path = Path(path)
        self.fileobj = open(self.path, "rb") if through_file_object else None
        self.file = h5py.File(self.fileobj if through_file_object else self.path, "r")  # inherited by forked workers
        self.images = self.file["images"]
        self.keys = [k.decode("ascii") for k in self.file["keys"][:]]
        self.labels = self.file["labels"][:].tolist()

    def read_record(self, index: int) -> tuple[int, bytes]:
        return self.labels[index], self.images[index].tobytes()

    def close(self) -> None:
        self.file.close()
        if self.fileobj is not None:
            self.fileobj.close()

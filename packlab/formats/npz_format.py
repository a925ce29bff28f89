"""NumPy ``.npz``: a zip archive of ``.npy`` arrays, read with ``numpy.load``.

**Layout.** What ``numpy.savez`` writes: a zip (members stored, not compressed) whose
member ``<name>.npy`` holds array ``<name>`` in NumPy's ``.npy`` format. One member per
sample, ``images/<key>.npy``, a one-dimensional ``uint8`` array of the JPEG bytes, plus
``keys.npy`` (the keys, sorted) and ``labels.npy`` (``int64``). :func:`write_npz` writes
the members one at a time with :func:`numpy.lib.format.write_array`, as ``savez`` does,
so the whole dataset never has to be in memory at once; ``numpy.load`` reads the result
like any ``.npz``.

**It is a zip underneath.** ``numpy.load`` returns an ``NpzFile`` holding an open
:class:`zipfile.ZipFile` on a buffered file. Opened in ``__init__`` and inherited by
forked workers, it fails exactly as chapter 3's zip does (``BadZipFile``: bad CRC-32, bad
header); pickled for ``spawn`` workers it fails with ``TypeError: cannot pickle
'_io.BufferedReader' object``. :class:`NpzDataset` opens one ``NpzFile`` per process;
:class:`NaiveNpzDataset` keeps the first attempt for chapter 9 and the tests.
"""

from __future__ import annotations

import zipfile
import zlib
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import BinaryIO

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


def image_member(key: str) -> str:
    """The array name of a sample's image in the archive (``NpzFile[name]``)."""
    return f"images/{key}"


def write_npz(dst: Path | str, *, samples: Sequence[data.Sample] | None = None, root: Path | None = None,
              progress_bar: bool = True) -> Path:
    """Write samples (default: the whole manifest) into one ``.npz`` at ``dst`` (layout: module docstring)."""

    def put(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
        # What numpy.savez does for each array (force_zip64 lets members pass 4 GB).
        with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array(member, array, allow_pickle=False)

    with written_atomically(dst, samples, root) as (tmp, samples), \
            zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        put(archive, "keys", np.array([s.key for s in samples], dtype="U"))
        put(archive, "labels", np.array([s.label for s in samples], dtype=np.int64))
        for sample, jpeg in progress(jpeg_records(samples, root), len(samples), "npz", progress_bar):
            put(archive, image_member(sample.key), np.frombuffer(jpeg, dtype=np.uint8))
    return Path(dst)


def ensure_npz(root: Path | None = None, samples: Sequence[data.Sample] | None = None, name: str = "images",
               progress_bar: bool = True) -> Path:
    """The course's ``.npz`` ``<data root>/packed/<name>.npz``, written once and then reused."""
    return ensure_written(".npz", write_npz, root, samples, name, progress_bar)


class NpzHandle:
    """An open ``NpzFile`` (and the file object under it, if one was given)."""

    def __init__(self, path: Path, opener: Callable[[str], BinaryIO] | None = None):
        self.path = path
        self.fileobj, self.file = open_packed(path, opener, ".npz", "write_npz",
                                              lambda where: np.load(where, allow_pickle=False),
                                              errors=(zipfile.BadZipFile, OSError, ValueError, EOFError))
        if not isinstance(self.file, np.lib.npyio.NpzFile) or not {"keys", "labels"} <= set(self.file.files):
            self.close()
            raise data.DatasetError(f"{path} has no 'keys' and 'labels' arrays: files written by packlab.formats.write_npz() have both.")

    def read(self, key: str) -> bytes:
        """The JPEG bytes of ``key``; a damaged member raises :class:`DamagedSampleError` naming it."""
        name = image_member(key)
        try:
            return self.file[name].tobytes()
        except KeyError:
            raise DamagedSampleError(f"{self.path} has no array {name!r}: rewrite the file with packlab.formats.write_npz().") from None
        except (zipfile.BadZipFile, zlib.error, ValueError, OSError, EOFError) as exc:
            raise DamagedSampleError(
                f"cannot read array {name!r} of {self.path}: {exc}. Test the archive with "
                f"`python -m zipfile -t {self.path}`; rewrite it with packlab.formats.write_npz()."
            ) from None

    def close(self) -> None:
        if isinstance(self.file, np.lib.npyio.NpzFile):
            self.file.close()
        if self.fileobj is not None:
            self.fileobj.close()


class NpzDataset(PerProcessHandle, PackedMapDataset):
    """Map-style dataset over a ``.npz`` written by :func:`write_npz`; safe with workers.

    ``dataset[i]`` is ``(image, label)`` for the i-th key in sorted order (or of ``keys``,
    in the order given), ``(image, label, key)`` with ``return_key=True``. Each process
    opens its own ``NpzFile`` on first use. ``opener(path)``, if given, opens the archive as
    a Python file object for ``numpy.load``. ``on_bad_sample="skip"`` skips and counts a
    member that cannot be read or decoded; a missing or damaged archive raises in both modes.
    """

    def __init__(self, path: Path | str, *, keys: Sequence[str] | None = None, transform: Callable | None = None,
                 return_key: bool = False, on_bad_sample: str = "raise",
                 opener: Callable[[str], BinaryIO] | None = None):
        self._set_options(transform, return_key, on_bad_sample)
        self.path = Path(path)
        self.opener = opener
        with closing(NpzHandle(self.path, opener)) as first:  # the index is read here, and the file closed at once
            self._keep(first.file["keys"].tolist(), first.file["labels"].tolist(), keys)

    def _open_handle(self) -> NpzHandle:
        return NpzHandle(self.path, self.opener)

    def read_record(self, index: int) -> tuple[int, bytes]:
        return self.labels[index], self.handle().read(self.keys[index])


class NaiveNpzDataset(PackedMapDataset):
    """THE ANTI-PATTERN, kept for chapter 9 and the tests: ``numpy.load`` in ``__init__``, kept open."""

    def __init__(self, path: Path | str, *, return_key: bool = False):
        self._set_options(None, return_key, "raise")
        self.path = Path(path)
        self.file = np.load(self.path)  # an NpzFile: a ZipFile on a buffered file, inherited by forked workers
        self.keys = self.file["keys"].tolist()
        self.labels = self.file["labels"].tolist()

    def read_record(self, index: int) -> tuple[int, bytes]:
        return self.labels[index], self.file[image_member(self.keys[index])].tobytes()

    def close(self) -> None:
        self.file.close()

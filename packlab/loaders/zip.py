"""Read samples from one ZIP archive, safely from any number of DataLoader workers.

An archive written by :func:`packlab.pack.write_zip` holds one member per sample,
``<key>.jpg`` (the original JPEG bytes) or ``<key>.raw`` (pixels already decoded and
resized, see :data:`packlab.transforms.RAW_SHAPE`), plus ``labels.csv`` (``key,label``).

The hard part is not the format but the file handle. A :class:`zipfile.ZipFile` reads a
member with two system calls on its underlying file: *seek* to the member's offset, then
*read*. After ``fork`` every worker holds a copy of the parent's file object, and all the
copies share one file offset in the kernel. Two workers that seek and read at the same
time move each other's offset and read the wrong bytes (``BadZipFile``). Under
``spawn`` and ``forkserver`` the dataset is pickled into each worker instead, and an
open file cannot be pickled (``TypeError``). Chapter 3 shows both failures with
:class:`NaiveZipDataset`; :class:`ZipDataset` is the fix chapter 4 builds:

* the index (member names and labels) is read once, in ``__init__``, and the archive is
  closed again, so the dataset object holds no open file when workers are created;
* each process opens its own handle on first use, remembered together with the id of
  the process that opened it (``os.getpid()``), so a handle inherited through ``fork`` is
  never used, even if the parent read samples before the workers started;
* ``__getstate__`` leaves the handle out when the dataset is pickled (spawn, forkserver);
* :meth:`ZipDataset.close` closes this process's handle, and a finalizer closes it when
  the dataset is garbage-collected or the process exits.

:class:`PreadZipDataset` avoids the shared offset altogether: it finds every member's
offset once, in ``__init__``, and reads each with one ``os.pread``, a system call that
names its own offset. Nothing then depends on where the file's offset is, so even a
descriptor inherited through ``fork`` is safe, and a read skips the work
:meth:`zipfile.ZipFile.read` does per member (chapter 2 measures both).

A damaged member (bad CRC-32, damaged header, bad compressed data) or one that does not
decode raises an error naming the member and the archive; with ``on_bad_sample="skip"``
it is skipped and counted instead (see :mod:`packlab.loaders.skipping`).
"""

from __future__ import annotations

import csv
import io
import os
import struct
import zipfile
import zlib
from collections.abc import Callable, Sequence
from multiprocessing import util as mp_util
from pathlib import Path
from typing import BinaryIO

import torch
from torch.utils.data import Dataset, get_worker_info

from packlab.data import DatasetError
from packlab.loaders.skipping import BadSampleHandling
from packlab.memory import SortedLookup, StringColumn, int_column
from packlab.pack import ZIP_LABELS_MEMBER
from packlab.storage import open_local, read_at
from packlab.transforms import CorruptImageError, pixels_to_tensor, standard_transform

#: How each member kind becomes the standard 3x256x256 float tensor, by file extension.
MEMBER_DECODERS: dict[str, Callable[[bytes, str], torch.Tensor]] = {
    ".jpg": standard_transform,
    ".raw": pixels_to_tensor,
}


class _ZipFileOwningItsFile(zipfile.ZipFile):
    """A :class:`zipfile.ZipFile` over an already open file, which it closes with itself.

    (Given a file object rather than a path, ``ZipFile.close`` leaves the file open.)
    """

    def close(self) -> None:
        fileobj = self.fp
        try:
            super().close()
        finally:
            if fileobj is not None:
                fileobj.close()


def open_archive(path: Path, opener: Callable[[str], BinaryIO] = open_local) -> zipfile.ZipFile:
    """Open ``path`` for reading through ``opener``, with errors that name the archive and say what to do."""
    fileobj = _open_file(path, opener)
    try:
        return _ZipFileOwningItsFile(fileobj)
    except zipfile.BadZipFile as exc:
        fileobj.close()
        raise zipfile.BadZipFile(
            f"{path} is not a readable zip archive ({exc}). It may be truncated or not a zip at all; "
            "rewrite it with packlab.pack.write_zip()."
        ) from None


def _open_file(path: Path, opener: Callable[[str], BinaryIO]) -> BinaryIO:
    try:
        return opener(str(path))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"zip archive {path} does not exist. Write it with packlab.pack.ensure_zip() "
            "(or packlab.pack.write_zip()), or check the path."
        ) from None


def read_index(archive: zipfile.ZipFile, path: Path) -> tuple[list[str], list[str], list[int]]:
    """The archive's samples as three parallel lists: keys (sorted), member names, labels.

    Labels come from the archive's own ``labels.csv``. Every labelled key must have exactly
    one member and every member a label: a sample is never silently dropped.
    """
    try:
        text = archive.read(ZIP_LABELS_MEMBER).decode("utf-8")
    except KeyError:
        raise DatasetError(
            f"{path} has no member {ZIP_LABELS_MEMBER!r}; archives written by packlab.pack.write_zip() carry one."
        ) from None
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames != ["key", "label"]:
        raise DatasetError(f"{path}:{ZIP_LABELS_MEMBER} must have the header 'key,label', found {reader.fieldnames}.")
    labels = {row["key"]: int(row["label"]) for row in reader}

    members: dict[str, str] = {}
    for name in archive.namelist():
        if name == ZIP_LABELS_MEMBER:
            continue
        key, ext = os.path.splitext(name)
        if ext not in MEMBER_DECODERS:
            raise DatasetError(f"{path} holds a member {name!r} that is neither <key>.jpg nor <key>.raw.")
        if key in members:
            raise DatasetError(f"{path} holds two members for key {key}: {members[key]!r} and {name!r}.")
        members[key] = name
    unlabelled = sorted(members.keys() - labels.keys())
    missing = sorted(labels.keys() - members.keys())
    if unlabelled or missing:
        raise DatasetError(
            f"{path}: {len(missing)} labelled keys have no member (first: {missing[:5]}), "
            f"{len(unlabelled)} members have no label (first: {unlabelled[:5]}). Rewrite the archive."
        )
    keys = sorted(labels)
    return keys, [members[k] for k in keys], [labels[k] for k in keys]


def _unreadable_member(name: str, path: Path, problem) -> zipfile.BadZipFile:
    return zipfile.BadZipFile(
        f"cannot read member {name!r} of {path}: {problem}. Test the archive with "
        f"`python -m zipfile -t {path}`; if it is damaged, rewrite it with packlab.pack.write_zip()."
    )


class _ZipIndex(Dataset):
    """What both zip datasets share: the index, ``__len__`` and turning member bytes into a sample."""

    path: Path
    keys: list[str]
    members: list[str]
    labels: list[int]

    def _set_index(self, archive: zipfile.ZipFile, keys, transform, return_key: bool) -> None:
        all_keys, members, labels = read_index(archive, self.path)
        if keys is not None:
            position = {k: i for i, k in enumerate(all_keys)}
            unknown = [k for k in keys if k not in position]
            if unknown:
                raise DatasetError(f"{len(unknown)} keys are not in {self.path} (first: {unknown[:5]}).")
            members = [members[position[k]] for k in keys]
            labels = [labels[position[k]] for k in keys]
            all_keys = list(keys)
        # One blob and one array each rather than lists of Python objects: every worker that reads a list's
        # strings writes their reference counts and so copies their pages (packlab.memory, chapter 12).
        self.keys, self.members, self.labels = StringColumn(all_keys), StringColumn(members), int_column(labels)
        self.transform = transform
        self.return_key = return_key

    def __len__(self) -> int:
        return len(self.keys)

    def _sample(self, index: int, payload: bytes):
        """``(image, label)`` or ``(image, label, key)`` from one member's bytes."""
        name = self.members[index]
        source = f"{self.path}:{name}"
        decode = self.transform or MEMBER_DECODERS[os.path.splitext(name)[1]]
        image = decode(payload, source)
        if self.return_key:
            return image, self.labels[index], self.keys[index]
        return image, self.labels[index]


class ZipDataset(_ZipIndex, BadSampleHandling):
    """Map-style dataset over a zip written by :func:`packlab.pack.write_zip`; safe with workers.

    ``dataset[i]`` is ``(image, label)`` for the i-th key in sorted order (or of ``keys``,
    a slice of the archive's keys, in the order given), or ``(image, label, key)`` with
    ``return_key=True``. ``image`` is the course's standard float tensor (3x256x256):
    ``.jpg`` members are decoded and resized, ``.raw`` members only converted.
    ``transform(member_bytes, source)`` replaces that step if given.

    Works with ``num_workers=0`` and with workers under ``fork``, ``spawn`` and
    ``forkserver``: see the module docstring for how.

    ``on_bad_sample="skip"`` skips a member that cannot be read or decoded, with a
    :class:`~packlab.loaders.skipping.BadSampleWarning`, and counts it in ``skipped``
    (summed over DataLoader workers). ``dataset[i]`` then returns a
    :class:`~packlab.loaders.skipping.SkippedSample` marker for it, so the DataLoader needs
    ``collate_fn=packlab.loaders.skipping.collate_skipping_bad``. An archive that is
    missing, not a zip, or without ``labels.csv`` raises in either mode.

    ``opener(path)`` opens the archive file (default: the local filesystem); pass
    :meth:`packlab.storage.NetworkFSModel.open` to read as if over a network filesystem.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        keys: Sequence[str] | None = None,
        transform: Callable | None = None,
        return_key: bool = False,
        on_bad_sample: str = "raise",
        opener: Callable[[str], BinaryIO] = open_local,
    ):
        self._set_bad_sample_mode(on_bad_sample)
        self.path = Path(path)
        self.opener = opener
        # The index is read here, in the parent, and the archive closed again at once.
        with open_archive(self.path, opener) as archive:
            self._set_index(archive, keys, transform, return_key)
        self._archive: zipfile.ZipFile | None = None
        self._archive_pid: int | None = None  # the process that opened self._archive
        self._finalizer = None

    # -- the per-process handle ---------------------------------------------------

    def open(self) -> zipfile.ZipFile:
        """This process's handle on the archive, opened on first use.

        A handle opened by another process (inherited through ``fork``) shares its file
        offset with that process, so it is never used: this process opens its own and
        drops the inherited copy (closing a copy of a descriptor leaves the owner's open).
        """
        pid = os.getpid()
        if self._archive is None or self._archive_pid != pid:
            archive = open_archive(self.path, self.opener)
            self._archive, self._archive_pid = archive, pid
            # atexit handlers do not run in fork and forkserver children, which leave
            # through os._exit (spawn children end with sys.exit, and do run them);
            # multiprocessing's own exit finalizers run under every start method, in
            # workers and in the main process alike. A forked child starts with an empty
            # finalizer registry, so it never closes its parent's handle.
            self._finalizer = mp_util.Finalize(self, archive.close, exitpriority=10)
        return self._archive

    def close(self) -> None:
        """Close this process's handle (the next read opens a new one)."""
        if self._archive is not None and self._archive_pid == os.getpid():
            self._finalizer()  # closes the archive and unregisters the exit hook
        self._archive = self._archive_pid = self._finalizer = None

    def __enter__(self) -> ZipDataset:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        """Pickle the index and settings, never the open handle (spawn, forkserver)."""
        state = self.__dict__.copy()
        state.update(_archive=None, _archive_pid=None, _finalizer=None)
        return state

    # -- reading ------------------------------------------------------------------

    def read_member(self, name: str) -> bytes:
        """One member's bytes through this process's handle; a damaged member is named with the archive."""
        try:
            return self.open().read(name)
        except (zipfile.BadZipFile, zlib.error) as exc:
            raise _unreadable_member(name, self.path, exc) from exc

    def __getitem__(self, index: int):
        name = self.members[index]
        self.open()  # an archive that cannot be opened at all is not a bad sample: raise in both modes
        try:
            return self._sample(index, self.read_member(name))
        except (zipfile.BadZipFile, CorruptImageError) as exc:
            if not self.skipping:
                raise
            reason = "unreadable member" if isinstance(exc, zipfile.BadZipFile) else "corrupt image"
            return self._skip(f"{self.path}:{name}", reason, exc)


def open_archive_in_worker(worker_id: int) -> None:
    """A ``worker_init_fn`` that opens the worker's own handle as soon as the worker starts.

    The alternative to opening on first ``__getitem__``: the cost of opening (parsing the
    central directory) and any error it raises move to worker start-up. ``ZipDataset``
    still opens lazily when there are no workers, or if this function is not passed.
    """
    dataset = get_worker_info().dataset
    while not isinstance(dataset, ZipDataset) and hasattr(dataset, "dataset"):
        dataset = dataset.dataset  # unwrap torch.utils.data.Subset and similar wrappers
    if not isinstance(dataset, ZipDataset):
        raise TypeError(f"open_archive_in_worker expects a ZipDataset, got {type(dataset).__name__}")
    dataset.open()


class NaiveZipDataset(_ZipIndex):
    """THE CHAPTER-3 ANTI-PATTERN, kept on purpose for the demonstration and the tests.

    Do not use it to read data. It opens the :class:`zipfile.ZipFile` once in
    ``__init__`` and keeps it, which is what most first attempts do and what works with
    ``num_workers=0``. With workers it breaks:

    * under ``fork`` all workers share the inherited file offset, their seek+read pairs
      interleave, and reads fail with ``BadZipFile`` (bad magic number, bad CRC-32, name
      mismatch) or ``zlib.error`` for deflated members;
    * under ``spawn``/``forkserver`` pickling it fails: ``TypeError: cannot pickle
      '_io.BufferedReader' object``.

    :class:`ZipDataset` is the fixed version. Same constructor, same samples.
    """

    def __init__(
        self,
        path: Path | str,
        *,
        keys: Sequence[str] | None = None,
        transform: Callable | None = None,
        return_key: bool = False,
    ):
        self.path = Path(path)
        self.archive = open_archive(self.path)  # opened in the parent and inherited by workers: the bug
        self._set_index(self.archive, keys, transform, return_key)

    def read_member(self, name: str) -> bytes:
        """One member's bytes through the shared handle (chapter 3 overrides this to try 'fixes')."""
        return self.archive.read(name)

    def __getitem__(self, index: int):
        return self._sample(index, self.read_member(self.members[index]))


# ---------------------------------------------------------------- positional reads

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then (after 22 bytes) name and extra-field lengths
_LOCAL_SIGNATURE = b"PK\x03\x04"
_READABLE_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)


def member_span(info: zipfile.ZipInfo, path: Path) -> tuple:
    """Where a member lies and how to check it: what :class:`PreadZipDataset` keeps per sample.

    ``(header_offset, name_bytes, extra_length, stored_size, size, crc, method)``. The
    local header repeats the name and usually the central directory's extra field, so
    header and data are expected at ``header_offset`` in ``30 + len(name) + extra``
    plus ``stored_size`` bytes; the reader checks that against the header it reads.
    """
    if info.compress_type not in _READABLE_METHODS or info.flag_bits & 0x1:
        raise DatasetError(
            f"{path}: member {info.filename!r} is encrypted or compressed with method {info.compress_type}; "
            "PreadZipDataset reads stored and deflated members. Rewrite the archive with packlab.pack.write_zip()."
        )
    name = info.filename.encode("ascii" if info.filename.isascii() else "utf-8")
    return (info.header_offset, name, len(info.extra), info.compress_size, info.file_size, info.CRC,
            info.compress_type)


class MemberSpans:
    """:func:`member_span` of every member, kept in arrays rather than a dict of tuples.

    A dict from 1.28 M member names to 7-tuples is about 9 M Python objects (names, tuples,
    ints), and every worker that looks one up writes to several of them (reference counts)
    and so copies their pages: some 300 bytes per member and worker (chapter 12). Here the
    numbers sit in one ``array.array`` per field; ``spans.at(i)`` gives member ``i``'s tuple,
    ``spans[name]`` finds the member by binary search (:class:`packlab.memory.SortedLookup`).
    """

    _FIELDS = ("offset", "extra", "stored_size", "size", "crc", "method")

    def __init__(self, members: StringColumn, spans: Sequence[tuple]):
        self.members = members
        self._columns = {f: int_column(span[i] for span in spans) for f, i in zip(self._FIELDS, (0, 2, 3, 4, 5, 6))}
        self._lookup = SortedLookup(members)

    def __len__(self) -> int:
        return len(self.members)

    def at(self, index: int) -> tuple:
        """``(header_offset, name_bytes, extra_length, stored_size, size, crc, method)`` of member ``index``."""
        offset, extra, stored, size, crc, method = (self._columns[f][index] for f in self._FIELDS)
        name = self.members[index]
        return offset, name.encode("ascii" if name.isascii() else "utf-8"), extra, stored, size, crc, method

    def __getitem__(self, name: str) -> tuple:
        return self.at(self._lookup.index(name))

    def __setitem__(self, name: str, span: tuple) -> None:
        index = self._lookup.index(name)
        for field, value in zip(self._FIELDS, (span[0], *span[2:])):
            self._columns[field][index] = value

    def __contains__(self, name: str) -> bool:
        try:
            self._lookup.index(name)
        except KeyError:
            return False
        return True


class PreadZipDataset(ZipDataset):
    """A :class:`ZipDataset` that reads every member with one positional read (``os.pread``).

    ``ZipFile.read`` does a lot per member: it seeks to the local header and reads it,
    checks its signature and name, wraps the data in a new ``ZipExtFile``, seeks again and
    reads the data, and updates a CRC-32 over it, all through the file's shared offset.
    This reader looks every member up once, when the index is read (:func:`member_span`),
    and then reads header and data of a member with *one* ``os.pread``, which carries its
    own offset. It still checks the local header's signature and name, and the CRC-32
    unless ``check_crc=False``.

    Because ``pread`` neither uses nor moves the file offset, the file is opened in
    ``__init__`` and shared: forked DataLoader workers use the inherited descriptor
    safely (contrast :class:`NaiveZipDataset`). Pickling (spawn, forkserver) leaves the
    file out, and the copy opens its own on first use. Same samples, arguments and
    errors as :class:`ZipDataset`; ``opener`` must return a file with a descriptor
    (``fileno()``) or a ``pread(size, offset)`` method, as
    :meth:`packlab.storage.NetworkFSModel.open` does.
    """

    def __init__(self, path: Path | str, *, check_crc: bool = True, **kwargs):
        super().__init__(path, **kwargs)
        self.check_crc = check_crc
        self.open()  # opened here, in the parent, and shared with forked workers: safe with pread

    def _set_index(self, archive: zipfile.ZipFile, keys, transform, return_key: bool) -> None:
        super()._set_index(archive, keys, transform, return_key)
        self.spans = MemberSpans(self.members, [member_span(archive.getinfo(name), self.path) for name in self.members])

    def open(self) -> BinaryIO:
        """The open archive file: this process's, or one inherited through ``fork`` (safe, see above)."""
        if self._archive is None:
            self._archive = _open_file(self.path, self.opener)
            self._archive_pid = os.getpid()
            self._finalizer = mp_util.Finalize(self, self._archive.close, exitpriority=10)
        return self._archive

    def __getitem__(self, index: int):
        name = self.members[index]
        self.open()  # an archive that cannot be opened at all is not a bad sample: raise in both modes
        try:
            return self._sample(index, self._read_span(name, self.spans.at(index)))
        except (zipfile.BadZipFile, CorruptImageError) as exc:
            if not self.skipping:
                raise
            reason = "unreadable member" if isinstance(exc, zipfile.BadZipFile) else "corrupt image"
            return self._skip(f"{self.path}:{name}", reason, exc)

    def read_member(self, name: str) -> bytes:
        """One member's bytes, checked; a damaged member raises ``BadZipFile`` naming it and the archive."""
        return self._read_span(name, self.spans[name])

    def _read_span(self, name: str, span: tuple) -> bytes:
        offset, name_bytes, extra, stored_size, size, crc, method = span
        expected_header = 30 + len(name_bytes) + extra
        blob = read_at(self.open(), offset, expected_header + stored_size)  # header and data, one request
        if len(blob) < 30:
            raise _unreadable_member(name, self.path, "the archive ends inside its local header")
        signature, name_length, extra_length = _LOCAL_HEADER.unpack_from(blob)
        if signature != _LOCAL_SIGNATURE:
            raise _unreadable_member(name, self.path, "bad magic number for file header")
        if blob[30 : 30 + name_length] != name_bytes:
            raise _unreadable_member(name, self.path, "the local header names another member")
        start = 30 + name_length + extra_length
        if start == expected_header:
            data = blob[start:]
        else:  # the local extra field differs from the central one: one more read, at the right place
            data = read_at(self.open(), offset + start, stored_size)
        if len(data) != stored_size:
            raise _unreadable_member(name, self.path, "the archive ends inside the member's data")
        if method == zipfile.ZIP_DEFLATED:
            try:
                data = zlib.decompress(data, -zlib.MAX_WBITS)  # raw deflate, as zip stores it
            except zlib.error as exc:
                raise _unreadable_member(name, self.path, f"bad compressed data ({exc})") from exc
        if len(data) != size or (self.check_crc and zlib.crc32(data) != crc):
            raise _unreadable_member(name, self.path, f"Bad CRC-32 for file {name!r}")
        return data

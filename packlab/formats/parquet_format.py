"""Parquet (through pyarrow): a table of keys, labels and encoded images, read by row group.

**Layout.** One table with three columns, in sorted key order: ``key`` (string), ``label``
(``int64``) and ``image`` (binary: the original JPEG bytes). It is cut into *row groups*
of :data:`ROW_GROUP_SIZE` rows; within a row group each column is one *column chunk*,
split into pages. No compression (JPEG bytes do not shrink), no dictionary encoding (every
image is different), statistics only for the small columns, and a CRC-32 checksum on every
page, which the readers verify, so a damaged page is an error rather than wrong bytes.

**The unit of reading is a column chunk.** pyarrow reads whole column chunks of a row
group. A map-style dataset that wants one image therefore reads its row group's whole
``image`` chunk (:data:`ROW_GROUP_SIZE` images) and keeps it, so the next sample from the
same row group is free; in shuffled order the next sample is almost never there. The
stream dataset reads each row group once, in turn, which is what the format is built for.
Smaller row groups make random access cheaper and the file's metadata larger.

**Handles.** Given a path, pyarrow reads with positional reads on its own I/O threads; its
``ParquetFile`` cannot be pickled (spawn workers fail with ``TypeError``). Given a Python
file object (how ``opener=`` passes the slow-storage model in), it calls the object's
``seek`` and ``read``, which ``fork`` would share like chapter 3's zip handle. Either way
the datasets open one handle per process (:class:`~packlab.formats.common.PerProcessHandle`).

:class:`NaiveParquetDataset` keeps the first attempt (file opened in ``__init__``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from packlab import data
from packlab.formats.common import (
    BlockStreamDataset,
    DamagedSampleError,
    PackedMapDataset,
    PerProcessHandle,
    ensure_written,
    jpeg_records,
    open_packed,
    progress,
    written_atomically,
)
from packlab.loaders.tar import RawSample

#: Rows per row group: about 3.4 MB of our JPEGs. The unit a map-style read costs and a stream reads.
ROW_GROUP_SIZE = 32

SCHEMA = pa.schema([("key", pa.string()), ("label", pa.int64()), ("image", pa.binary())])


def write_parquet(dst: Path | str, *, samples: Sequence[data.Sample] | None = None, root: Path | None = None,
                  row_group_size: int = ROW_GROUP_SIZE, progress_bar: bool = True) -> Path:
    """Write samples (default: the whole manifest) into one Parquet file at ``dst`` (layout: module docstring)."""
    if row_group_size < 1:
        raise ValueError("row_group_size must be at least 1")
    options = dict(compression="none", use_dictionary=False, write_statistics=["key", "label"], write_page_checksum=True)
    with written_atomically(dst, samples, root) as (tmp, samples), pq.ParquetWriter(tmp, SCHEMA, **options) as writer:
        rows: list[tuple[str, int, bytes]] = []
        for sample, jpeg in progress(jpeg_records(samples, root), len(samples), "parquet", progress_bar):
            rows.append((sample.key, sample.label, jpeg))
            if len(rows) == row_group_size:
                writer.write_table(_table(rows), row_group_size=row_group_size)  # one row group per call
                rows = []
        if rows:
            writer.write_table(_table(rows), row_group_size=row_group_size)
    return Path(dst)


def _table(rows: list[tuple[str, int, bytes]]) -> pa.Table:
    keys, labels, images = zip(*rows)
    return pa.table([pa.array(keys, pa.string()), pa.array(labels, pa.int64()), pa.array(images, pa.binary())],
                    schema=SCHEMA)


def ensure_parquet(root: Path | None = None, samples: Sequence[data.Sample] | None = None, name: str = "images",
                   progress_bar: bool = True) -> Path:
    """The course's Parquet file ``<data root>/packed/<name>.parquet``, written once and then reused."""
    return ensure_written(".parquet", write_parquet, root, samples, name, progress_bar)


class ParquetHandle:
    """An open Parquet file (and the file object under it, if one was given), with one row group kept."""

    def __init__(self, path: Path, opener: Callable[[str], BinaryIO] | None = None):
        self.path = path
        self.fileobj, self.file = open_packed(
            path, opener, "Parquet", "write_parquet", lambda where: pq.ParquetFile(where, page_checksum_verification=True),
            errors=(pa.ArrowException, OSError))
        names = self.file.schema_arrow.names
        if not {"key", "label", "image"} <= set(names):
            self.close()
            raise data.DatasetError(f"{path} has columns {names}; files written by packlab.formats.write_parquet() have key, label and image.")
        self.kept: tuple[int, pa.ChunkedArray] | None = None  # (row group, its image column)

    def read_row_group(self, group: int, columns: list[str]) -> pa.Table:
        """One row group's columns; a damaged page raises :class:`DamagedSampleError` naming the row group."""
        try:
            return self.file.read_row_group(group, columns=columns, use_threads=False)
        except (pa.ArrowException, OSError) as exc:
            raise DamagedSampleError(
                f"cannot read row group {group} of Parquet file {self.path}: {exc}. "
                "Rewrite the file with packlab.formats.write_parquet()."
            ) from None

    def image(self, group: int, row: int) -> bytes:
        """The image in ``row`` of row group ``group``, reading (and keeping) that row group's image column if needed."""
        if self.kept is None or self.kept[0] != group:
            self.kept = (group, self.read_row_group(group, ["image"]).column("image"))
        return self.kept[1][row].as_py()

    def close(self) -> None:
        self.kept = None
        self.file.close()
        if self.fileobj is not None:
            self.fileobj.close()


def read_index(handle: ParquetHandle) -> tuple[list[str], list[int], list[int]]:
    """All keys and labels, in stored order, and the first row of every row group."""
    table = handle.file.read(columns=["key", "label"], use_threads=False)
    metadata = handle.file.metadata
    starts, row = [], 0
    for group in range(metadata.num_row_groups):
        starts.append(row)
        row += metadata.row_group(group).num_rows
    return table.column("key").to_pylist(), table.column("label").to_pylist(), starts


class ParquetDataset(PerProcessHandle, PackedMapDataset):
    """Map-style dataset over a Parquet file written by :func:`write_parquet`; safe with workers.

    ``dataset[i]`` is ``(image, label)`` for the i-th key in sorted order (or of ``keys``,
    in the order given), ``(image, label, key)`` with ``return_key=True``. Reading a sample
    reads its row group's image column and keeps it (one row group per process), so reading
    in stored order costs one row group per :data:`ROW_GROUP_SIZE` samples and shuffled
    order about one per sample. ``opener(path)``, if given, opens the file as a Python file
    object for pyarrow to read through. ``on_bad_sample="skip"`` skips and counts a sample
    whose row group cannot be read or whose image does not decode.
    """

    def __init__(self, path: Path | str, *, keys: Sequence[str] | None = None, transform: Callable | None = None,
                 return_key: bool = False, on_bad_sample: str = "raise",
                 opener: Callable[[str], BinaryIO] | None = None):
        self._set_options(transform, return_key, on_bad_sample)
        self.path = Path(path)
        self.opener = opener
        with closing(ParquetHandle(self.path, opener)) as first:  # the index is read here, and the file closed at once
            all_keys, all_labels, self.group_starts = read_index(first)
        self._keep(all_keys, all_labels, keys)

    def _open_handle(self) -> ParquetHandle:
        return ParquetHandle(self.path, self.opener)

    def read_record(self, index: int) -> tuple[int, bytes]:
        position = self.positions[index]
        group = bisect.bisect_right(self.group_starts, position) - 1
        try:
            return self.labels[index], self.handle().image(group, position - self.group_starts[group])
        except DamagedSampleError as exc:
            raise DamagedSampleError(f"key {self.keys[index]}: {exc}") from None


class ParquetStreamDataset(PerProcessHandle, BlockStreamDataset):
    """The Parquet file read row group by row group: each row group is a block (see
    :class:`~packlab.formats.common.BlockStreamDataset`): shuffled per epoch, split between
    ranks and workers, read whole, its samples shuffled in a buffer of ``shuffle_buffer``.
    Yields ``(image, label)`` or ``(image, label, key)``. With ``on_bad_sample="skip"`` a
    damaged row group is skipped whole and counted once; an image that does not decode, alone.
    """

    smaller_blocks = "write the file with a smaller row_group_size"

    def __init__(self, path: Path | str, *, shuffle_buffer: int = 0, shuffle_blocks: bool = True, seed: int = 0,
                 transform: Callable | None = None, return_key: bool = False, rank: int | None = None,
                 world_size: int | None = None, on_bad_sample: str = "raise",
                 opener: Callable[[str], BinaryIO] | None = None):
        super().__init__()
        self._set_stream_options(shuffle_buffer=shuffle_buffer, shuffle_blocks=shuffle_blocks, seed=seed,
                                 transform=transform, return_key=return_key, rank=rank, world_size=world_size,
                                 on_bad_sample=on_bad_sample)
        self.path = Path(path)
        self.opener = opener
        with closing(ParquetHandle(self.path, opener)) as first:
            self.blocks = list(range(first.file.metadata.num_row_groups))

    def _open_handle(self) -> ParquetHandle:
        return ParquetHandle(self.path, self.opener)

    def read_block(self, group: int) -> Iterator[RawSample]:
        table = self.handle().read_row_group(group, ["key", "label", "image"])
        keys, labels = table.column("key").to_pylist(), table.column("label").to_pylist()
        images = table.column("image")
        for row, key in enumerate(keys):
            yield RawSample(key, labels[row], images[row].as_py(), f"{self.path}:{key}")


class NaiveParquetDataset(PackedMapDataset):
    """THE ANTI-PATTERN, kept for chapter 9 and the tests: the ``ParquetFile`` is opened in ``__init__``."""

    def __init__(self, path: Path | str, *, return_key: bool = False):
        self._set_options(None, return_key, "raise")
        self.path = Path(path)
        self.file = pq.ParquetFile(self.path)  # inherited by forked workers; cannot be pickled for spawn
        table = self.file.read(columns=["key", "label"])
        self.keys, self.labels = table.column("key").to_pylist(), table.column("label").to_pylist()
        self.group_rows = self.file.metadata.row_group(0).num_rows

    def read_record(self, index: int) -> tuple[int, bytes]:
        group, row = divmod(index, self.group_rows)
        return self.labels[index], self.file.read_row_group(group, columns=["image"]).column("image")[row].as_py()

    def close(self) -> None:
        self.file.close()

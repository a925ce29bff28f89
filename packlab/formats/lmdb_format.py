"""LMDB: one memory-mapped B+tree file, read by key or scanned in key order.

**Layout.** One environment stored as a single file (``subdir=False``), one record per
sample in the main database: the key is the sample's key in ASCII (``b"000123"``), the
value is the label as a 4-byte little-endian integer followed by the original JPEG bytes.
Each record carries everything a sample needs, so a cursor scan reads samples without
any other lookup. LMDB keeps keys sorted, so a scan visits them in key order.

**Reading.** LMDB maps the file into memory: a read is a lookup in the tree and a copy
out of the page cache, with no ``read`` system call and no file offset, so there is no
opener through which the slow-storage model could delay reads. Readers open the file
``readonly=True, lock=False``: the file is written once and renamed into place before
anyone reads it, so there is no writer to coordinate with, and without the lock file
there is no reader table to keep (the ``lock=`` option, in LMDB's C docs ``MDB_NOLOCK``,
leaves all coordination to the caller).

**One environment per file per process.** LMDB's rules (its ``lmdb.h`` caveats): use an
environment only in the process that opened it, not after ``fork``; never open the same
file twice in one process. py-lmdb enforces the second rule with a registry of the files
open in the process, and a forked child inherits that registry: it refuses to open the
file its parent had open ("already open in this process") until the inherited copy is
closed. :func:`open_environment` therefore keeps one environment per file *and process*:
it closes an inherited copy (in the child, closing unmaps the child's view and closes the
child's copies of the descriptors; with ``lock=False`` there is no shared table to touch)
and opens the process's own. The datasets hold no handle themselves, only the path, so
pickling them for ``spawn`` workers is trivial.

**A truncated file.** LMDB trusts the page numbers in its tree; reading a page past the
end of a truncated file through the memory map kills the process with ``SIGBUS`` (a bus
error, not a Python exception). :func:`open_environment` compares the file's size with the
last page the tree uses and raises a clear error before anything is read.

:class:`NaiveLmdbDataset` keeps the first attempt (environment opened in ``__init__``, the
library's defaults) for chapter 9 and the tests to show what it does with workers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any

import lmdb

from packlab import data
from packlab.formats.common import (
    BlockStreamDataset,
    DamagedSampleError,
    PackedMapDataset,
    ensure_written,
    jpeg_records,
    open_packed,
    progress,
    select_keys,
    written_atomically,
)
from packlab.loaders.tar import RawSample

#: Bytes of the label that starts every record (little-endian unsigned integer).
LABEL_BYTES = 4
#: Keys per block for sequential reading: the unit split between ranks and workers and shuffled per epoch
#: (about 10 MB of our JPEGs).
BLOCK_SIZE = 100


def encode_record(label: int, jpeg: bytes) -> bytes:
    """One sample's LMDB value: the label (4 bytes, little-endian), then the JPEG bytes."""
    return label.to_bytes(LABEL_BYTES, "little") + jpeg


def decode_record(value: bytes, source: str) -> tuple[int, bytes]:
    """``(label, jpeg bytes)`` from a value written by :func:`encode_record`."""
    if len(value) <= LABEL_BYTES:
        raise DamagedSampleError(f"record {source} holds {len(value)} bytes, too few for a label and an image: rewrite the file.")
    return int.from_bytes(value[:LABEL_BYTES], "little"), value[LABEL_BYTES:]


# ------------------------------------------------------------------------ writing


def write_lmdb(dst: Path | str, *, samples: Sequence[data.Sample] | None = None, root: Path | None = None,
               progress_bar: bool = True) -> Path:
    """Write samples (default: the whole manifest) into one LMDB file at ``dst``.

    Keys are inserted in sorted order with ``append=True`` (each page is filled in turn,
    none split), all in one write transaction, which commits only when every sample is in.
    """
    with written_atomically(dst, samples, root) as (tmp, samples):
        # The map must be large enough for everything; on Linux the file only grows as pages are written.
        map_size = 2 * sum(s.bytes for s in samples) + (64 << 20)
        env = lmdb.open(str(tmp), subdir=False, map_size=map_size, metasync=False, sync=False, lock=False)
        try:
            with env.begin(write=True) as txn:
                for sample, jpeg in progress(jpeg_records(samples, root), len(samples), "lmdb", progress_bar):
                    txn.put(sample.key.encode("ascii"), encode_record(sample.label, jpeg), append=True)
            env.sync(True)
        finally:
            env.close()
            Path(f"{tmp}-lock").unlink(missing_ok=True)  # written by some LMDB versions even with lock=False
    return Path(dst)


def ensure_lmdb(root: Path | None = None, samples: Sequence[data.Sample] | None = None, name: str = "images",
                progress_bar: bool = True) -> Path:
    """The course's LMDB file ``<data root>/packed/<name>.lmdb``, written once and then reused."""
    return ensure_written(".lmdb", write_lmdb, root, samples, name, progress_bar)


# --------------------------------------------------------------- environments per process

#: This process's environments, by the file's real path: ``{path: (pid that opened it, environment, exit hook)}``.
_ENVIRONMENTS: dict[str, tuple[int, Any, Any]] = {}


def _check_not_truncated(env, path: Path) -> None:
    """Raise if the tree refers to pages past the end of the file (reading them would be a SIGBUS)."""
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    size = path.stat().st_size
    if size < needed:
        env.close()
        raise data.DatasetError(
            f"LMDB file {path} is truncated: its tree uses {needed:,} bytes and the file has {size:,}. "
            "Reading it would crash the process with a bus error; rewrite it with packlab.formats.write_lmdb()."
        )


def open_environment(path: Path | str, readahead: bool | None = None):
    """This process's read-only environment on ``path``, opened on first use (see the module docstring).

    ``readahead`` is LMDB's ``MDB_NORDAHEAD`` switch, fixed when the file is opened. ``None``
    takes the environment this process already has as it is (a new one reads ahead, LMDB's
    default). ``True`` or ``False`` is a demand: an environment opened the other way is
    closed and opened again, since py-lmdb allows one per file per process. Without that, a
    dataset asking for random reads without readahead would silently get whatever an earlier
    reader in the process had opened.
    """
    path = Path(path)
    where = os.path.realpath(path)
    pid = os.getpid()
    entry = _ENVIRONMENTS.get(where)
    if entry is not None and entry[0] == pid:
        if readahead is None or entry[1].flags()["readahead"] == readahead:
            return entry[1]
        close_environment(path)  # opened the other way: a transaction still open on it fails with lmdb.Error
    elif entry is not None:  # inherited through fork: close this process's copy, or py-lmdb refuses to reopen
        entry[1].close()
        del _ENVIRONMENTS[where]
    readahead = True if readahead is None else readahead
    _, env = open_packed(path, None, "LMDB", "write_lmdb", errors=(lmdb.Error,),
                         open_file=lambda where: lmdb.open(str(where), subdir=False, readonly=True, lock=False,
                                                           readahead=readahead))
    _check_not_truncated(env, path)
    # DataLoader workers end with os._exit, so atexit never runs there; multiprocessing's exit hooks do.
    _ENVIRONMENTS[where] = (pid, env, mp_util.Finalize(None, env.close, exitpriority=10))
    return env


def close_environment(path: Path | str) -> None:
    """Close this process's environment on ``path``, if it has one (the next read reopens it)."""
    where = os.path.realpath(path)
    entry = _ENVIRONMENTS.get(where)
    if entry is not None and entry[0] == os.getpid():
        entry[2]()  # closes the environment and drops its exit hook
        del _ENVIRONMENTS[where]


def read_keys(path: Path | str) -> list[str]:
    """Every key of the file, in stored (sorted) order: a cursor scan of the keys alone.

    Leaves the process's environment as it found it: a dataset reads its index in
    ``__init__`` and holds nothing open afterwards (the first read opens it again).
    """
    was_open = _ENVIRONMENTS.get(os.path.realpath(path), (None,))[0] == os.getpid()
    env = open_environment(path)
    try:
        with env.begin() as txn:
            return [key.decode("ascii") for key in txn.cursor().iternext(keys=True, values=False)]
    finally:
        if not was_open:
            close_environment(path)


# ------------------------------------------------------------------------ datasets


class LmdbDataset(PackedMapDataset):
    """Map-style dataset over an LMDB file written by :func:`write_lmdb`; safe with workers.

    ``dataset[i]`` is ``(image, label)`` for the i-th key in sorted order (or of ``keys``,
    in the order given), ``(image, label, key)`` with ``return_key=True``. Each read is one
    read-only transaction and one ``get`` in this process's environment
    (:func:`open_environment`). ``transform(jpeg_bytes, source)`` replaces the standard
    transform. With ``on_bad_sample="skip"`` a damaged record or an image that does not
    decode is skipped and counted (use ``collate_fn=collate_skipping_bad``); a missing,
    damaged or truncated file raises in both modes.
    """

    def __init__(self, path: Path | str, *, keys: Sequence[str] | None = None, transform: Callable | None = None,
                 return_key: bool = False, on_bad_sample: str = "raise", readahead: bool = True):
        self._set_options(transform, return_key, on_bad_sample)
        self.path = Path(path)
        self.readahead = readahead
        all_keys = read_keys(self.path)
        self.keys = [all_keys[i] for i in select_keys(all_keys, keys, self.path)]

    def read_record(self, index: int) -> tuple[int, bytes]:
        key = self.keys[index]
        env = open_environment(self.path, self.readahead)
        try:
            with env.begin() as txn:  # one short read transaction per sample: nothing stays open between items
                value = txn.get(key.encode("ascii"))
        except lmdb.Error as exc:
            raise DamagedSampleError(f"cannot read key {key} of LMDB file {self.path}: {exc}. Rewrite the file.") from None
        if value is None:
            raise DamagedSampleError(f"LMDB file {self.path} has no record for key {key}: rewrite the file.")
        return decode_record(value, f"{self.path}:{key}")

    def close(self) -> None:
        """Close this process's environment on the file (shared by every dataset on it in this process)."""
        close_environment(self.path)


class LmdbStreamDataset(BlockStreamDataset):
    """The LMDB file read sequentially with a cursor, in blocks of ``block_size`` consecutive keys.

    The pattern of tensorpack's LMDB pipeline: scan in key order, shuffle locally. Each
    epoch the blocks are shuffled, split between ranks and DataLoader workers, scanned, and
    their samples shuffled in a buffer of ``shuffle_buffer`` (see
    :class:`~packlab.formats.common.BlockStreamDataset`). Yields ``(image, label)`` or
    ``(image, label, key)``. Every block must go to some reader: with ``R`` ranks and ``W``
    workers, ``block_size`` must leave at least ``R x W`` blocks.
    """

    smaller_blocks = "pass a smaller block_size"

    def __init__(self, path: Path | str, *, block_size: int = BLOCK_SIZE, shuffle_buffer: int = 0,
                 shuffle_blocks: bool = True, seed: int = 0, transform: Callable | None = None, return_key: bool = False,
                 rank: int | None = None, world_size: int | None = None, on_bad_sample: str = "raise"):
        super().__init__()
        self._set_stream_options(shuffle_buffer=shuffle_buffer, shuffle_blocks=shuffle_blocks, seed=seed,
                                 transform=transform, return_key=return_key, rank=rank, world_size=world_size,
                                 on_bad_sample=on_bad_sample)
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self.path = Path(path)
        keys = read_keys(self.path)
        # A block is (first key, number of keys): where the cursor starts, and how far it goes.
        self.blocks = [(keys[i], len(keys[i : i + block_size])) for i in range(0, len(keys), block_size)]

    def read_block(self, block: tuple[str, int]) -> Iterator[RawSample]:
        first, count = block
        env = open_environment(self.path)
        try:
            with env.begin() as txn:
                cursor = txn.cursor()
                if not cursor.set_key(first.encode("ascii")):
                    raise DamagedSampleError(f"LMDB file {self.path} has no key {first}, where a block starts: rewrite the file.")
                for _ in range(count):
                    key = cursor.key().decode("ascii")
                    source = f"{self.path}:{key}"
                    label, jpeg = decode_record(cursor.value(), source)
                    yield RawSample(key, label, jpeg, source)
                    if not cursor.next():
                        break
        except lmdb.Error as exc:
            raise DamagedSampleError(f"cannot scan LMDB file {self.path} from key {first}: {exc}. Rewrite the file.") from None

    def close(self) -> None:
        close_environment(self.path)


class NaiveLmdbDataset(PackedMapDataset):
    """THE ANTI-PATTERN, kept for chapter 9 and the tests: the environment is opened in ``__init__``.

    It uses the library's defaults (``lock=True``: a lock file with a table of reader
    slots shared by every process using the file) and one read transaction per sample, as
    a first attempt would. Correct in one process. What it does with workers is shown in
    chapter 9 and asserted in ``tests/test_formats.py``. Call :meth:`close` when done:
    py-lmdb refuses a second environment on the same file in one process.
    """

    def __init__(self, path: Path | str, *, return_key: bool = False, lock: bool = True):
        self._set_options(None, return_key, "raise")
        self.path = Path(path)
        self.env = lmdb.open(str(self.path), subdir=False, readonly=True, lock=lock)  # inherited by forked workers
        with self.env.begin() as txn:
            self.keys = [key.decode("ascii") for key in txn.cursor().iternext(keys=True, values=False)]

    def read_record(self, index: int) -> tuple[int, bytes]:
        with self.env.begin() as txn:
            return decode_record(txn.get(self.keys[index].encode("ascii")), f"{self.path}:{self.keys[index]}")

    def close(self) -> None:
        self.env.close()

"""What every packed format of chapter 9 shares: writing once, per-process handles, map-style and streaming reads.

Each format module (:mod:`~packlab.formats.lmdb_format`, :mod:`~packlab.formats.hdf5_format`,
:mod:`~packlab.formats.parquet_format`, :mod:`~packlab.formats.npz_format`) adds only what is
particular to its library. The rules they follow are the course's:

* **Write once, atomically.** A writer writes to ``<name>.partial-<pid>`` and renames it
  into place when complete (:func:`written_atomically`), so an interrupted run never
  leaves a half-written file under the final name. ``ensure_*`` functions write under
  :func:`packlab.paths.packed_dir` once and reuse the file while it is newer than the
  dataset's manifest (:func:`ensure_written`).
* **One handle per process** (chapter 4). :class:`PerProcessHandle` opens a handle on first
  use in each process, keyed by ``os.getpid()``, never uses one inherited through
  ``fork``, leaves it out of the pickle sent to ``spawn``/``forkserver`` workers and
  closes it with :meth:`~PerProcessHandle.close`, a ``with`` block or at process exit.
* **Map-style datasets** (:class:`PackedMapDataset`) answer ``dataset[i]`` and work with any
  sampler; **stream datasets** (:class:`BlockStreamDataset`) read blocks of consecutive
  samples front to back, split the blocks between ranks and DataLoader workers and shuffle
  within a bounded buffer, with the same functions as chapter 5's tar reader.
* **Bad input** raises an error that names the file and the sample; with
  ``on_bad_sample="skip"`` a damaged sample is skipped, warned about and counted instead
  (:mod:`packlab.loaders.skipping`).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing import util as mp_util
from pathlib import Path
from typing import Any, BinaryIO

from torch.utils.data import Dataset, IterableDataset, get_worker_info

from packlab import data
from packlab.loaders.skipping import BadSampleHandling
from packlab.loaders.tar import (
    RawSample,
    RawSampleDecoding,
    ShardSplitError,
    check_shard_split,
    distributed_rank_and_world_size,
    epoch_shard_order,
    shuffle_buffer,
    split_shards_by_rank,
    split_shards_by_worker,
)
from packlab.transforms import CorruptImageError, standard_transform


class DamagedSampleError(data.DatasetError):
    """A sample's stored bytes cannot be read (a damaged record, heap, member or row group).

    The message names the file and the sample's key and says what to do.
    """


# ------------------------------------------------------------------------ writing


def partial_path(target: Path) -> Path:
    """Where a writer puts ``target`` while writing it: the same folder, a per-process temporary name."""
    return target.with_name(f"{target.name}.partial-{os.getpid()}")


@contextmanager
def written_atomically(dst: Path | str, samples: Sequence[data.Sample] | None, root: Path | None):
    """Prepare a write of ``samples`` (default: the manifest; sorted by key) to ``dst``; yield ``(temporary path, samples)``.

    The writer writes the temporary path. When the block ends normally it is renamed to
    ``dst``; when it raises, the temporary file is removed and ``dst`` left as it was.
    """
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    ordered = sorted(samples if samples is not None else data.load_manifest(root), key=lambda s: s.key)
    tmp = partial_path(dst)
    try:
        yield tmp, ordered
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dst)


def progress(iterable: Iterable, total: int, desc: str, enabled: bool):
    """A progress bar over ``iterable`` (tqdm), or the iterable itself when disabled."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="img", disable=not enabled)


def jpeg_records(samples: Sequence[data.Sample], root: Path | None) -> Iterator[tuple[data.Sample, bytes]]:
    """Each sample with the bytes of its original JPEG, in the order given."""
    for sample in samples:
        yield sample, data.image_path(sample.key, root).read_bytes()


def ensure_written(suffix: str, write: Callable, root: Path | None, samples, name: str, progress_bar: bool) -> Path:
    """``<data root>/packed/<name><suffix>``, written by ``write`` unless it is newer than the dataset's manifest."""
    from packlab import paths

    target = paths.packed_dir(root) / f"{name}{suffix}"
    manifest = paths.manifest_path(root)
    if not (target.exists() and manifest.exists() and target.stat().st_mtime >= manifest.stat().st_mtime):
        write(target, samples=samples, root=root, progress_bar=progress_bar)
    return target


def open_packed(path: Path, opener: Callable[[str], BinaryIO] | None, kind: str, writer: str,
                open_file: Callable, errors: tuple) -> tuple[BinaryIO | None, Any]:
    """``(file object or None, opened file)``: ``path`` opened by ``open_file``, through ``opener`` if given.

    With an ``opener``, the library reads through the Python file object it returns (how the
    slow-storage model reaches it); without, the library opens the path itself. A missing
    file, or one the library cannot open (``errors``), raises an error naming it.
    """
    if not path.exists():
        ensure = writer.replace("write_", "ensure_")
        raise FileNotFoundError(
            f"{kind} file {path} does not exist. Write it with packlab.formats.{ensure}() (or {writer}()), "
            "or check the path."
        )
    fileobj = opener(str(path)) if opener is not None else None
    try:
        return fileobj, open_file(fileobj if fileobj is not None else path)
    except errors as exc:
        if fileobj is not None:
            fileobj.close()
        raise data.DatasetError(
            f"{path} is not a readable {kind} file ({exc}). It may be truncated or damaged; "
            f"rewrite it with packlab.formats.{writer}()."
        ) from None


# ------------------------------------------------------------------ per-process handles


class PerProcessHandle:
    """One handle on ``self.path`` per process, opened on first use (the rule of chapter 4).

    Subclasses implement :meth:`_open_handle`. :meth:`handle` returns this process's handle;
    one inherited through ``fork`` (opened by another process id) is dropped, never used:
    it shares the parent's file offset or library state. Dropping a copy closes only this
    process's copies of its descriptors, never the parent's handle.
    """

    path: Path
    _handle: Any = None
    _handle_pid: int | None = None
    _finalizer: Any = None

    def _open_handle(self) -> Any:
        raise NotImplementedError

    def handle(self) -> Any:
        """This process's handle, opened now if this process has none."""
        pid = os.getpid()
        if self._handle is None or self._handle_pid != pid:
            handle = self._open_handle()
            self._handle, self._handle_pid = handle, pid
            # atexit does not run in DataLoader workers (they end with os._exit); multiprocessing's
            # exit finalizers do. A forked child starts with none registered, so it never closes
            # the parent's handle.
            self._finalizer = mp_util.Finalize(self, handle.close, exitpriority=10)
        return self._handle

    def close(self) -> None:
        """Close this process's handle (the next read opens a new one)."""
        if self._handle is not None and self._handle_pid == os.getpid():
            self._finalizer()
        self._handle = self._handle_pid = self._finalizer = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getstate__(self) -> dict:
        """Pickle the index and the settings, never the open handle (spawn, forkserver)."""
        state = self.__dict__.copy()
        state.update(_handle=None, _handle_pid=None, _finalizer=None)
        return state


# ------------------------------------------------------------------------ map-style


def select_keys(all_keys: Sequence[str], keys: Sequence[str] | None, path: Path) -> list[int]:
    """Positions of ``keys`` (default: all) among ``all_keys``; every key must be there."""
    if keys is None:
        return list(range(len(all_keys)))
    position = {k: i for i, k in enumerate(all_keys)}
    unknown = [k for k in keys if k not in position]
    if unknown:
        raise data.DatasetError(f"{len(unknown)} keys are not in {path} (first: {unknown[:5]}). Check the keys, or rewrite the file.")
    return [position[k] for k in keys]


class PackedMapDataset(Dataset, BadSampleHandling):
    """A map-style dataset over one packed file: ``dataset[i]`` is ``(image, label)`` or ``(image, label, key)``.

    Subclasses set ``self.path``, ``self.keys`` (the samples, in the order read) and
    implement :meth:`read_record`, which returns a sample's label and encoded image. The
    image becomes ``transform(jpeg_bytes, source)`` (default: the standard transform), where
    ``source`` is ``"<file>:<key>"``, so a corrupt image is named in the error.
    """

    path: Path
    keys: list[str]
    transform: Callable[[bytes, str], Any]
    return_key: bool

    def _set_options(self, transform, return_key: bool, on_bad_sample: str) -> None:
        self._set_bad_sample_mode(on_bad_sample)
        self.transform = transform or standard_transform
        self.return_key = return_key

    def _keep(self, all_keys: Sequence[str], all_labels: Sequence[int], keys: Sequence[str] | None) -> None:
        """Keep the samples selected by ``keys`` (default: all): their positions in the file, keys and labels."""
        self.positions = select_keys(all_keys, keys, self.path)
        self.keys = [all_keys[i] for i in self.positions]
        self.labels = [all_labels[i] for i in self.positions]

    def __len__(self) -> int:
        return len(self.keys)

    def read_record(self, index: int) -> tuple[int, bytes]:
        """``(label, encoded image)`` of sample ``index``; :class:`DamagedSampleError` if it cannot be read."""
        raise NotImplementedError

    def __getitem__(self, index: int):
        key = self.keys[index]
        source = f"{self.path}:{key}"
        try:
            label, payload = self.read_record(index)
            image = self.transform(payload, source)
        except (DamagedSampleError, CorruptImageError) as exc:
            if not self.skipping:
                raise
            reason = "unreadable member" if isinstance(exc, DamagedSampleError) else "corrupt image"
            return self._skip(source, reason, exc)
        return (image, label, key) if self.return_key else (image, label)


# ------------------------------------------------------------------------ streaming


class BlockStreamDataset(IterableDataset, RawSampleDecoding):
    """Read a packed file front to back in blocks of consecutive samples, like tar shards (chapter 5).

    Subclasses set ``self.path`` and ``self.blocks`` (any hashable descriptions of runs of
    consecutive samples: key ranges, row groups) and implement :meth:`read_block`, which
    yields a block's :class:`~packlab.loaders.tar.RawSample` in stored order. Per epoch:
    the blocks are permuted from ``(seed, epoch)`` (:func:`~packlab.loaders.tar.epoch_shard_order`),
    split by rank and then by DataLoader worker
    (:func:`~packlab.loaders.tar.split_shards_by_rank`, :func:`~packlab.loaders.tar.split_shards_by_worker`),
    read, shuffled in a buffer of ``shuffle_buffer`` samples
    (:func:`~packlab.loaders.tar.shuffle_buffer`) and decoded. Call :meth:`set_epoch` before
    each epoch; leave ``persistent_workers`` off (a persistent worker keeps its first copy).
    """

    path: Path
    blocks: list

    def _set_stream_options(self, *, shuffle_buffer: int, shuffle_blocks: bool, seed: int, transform,
                            return_key: bool, rank: int | None, world_size: int | None, on_bad_sample: str) -> None:
        self._set_bad_sample_mode(on_bad_sample)
        if rank is None or world_size is None:
            rank, world_size = distributed_rank_and_world_size()
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        self.rank, self.world_size = rank, world_size
        self.shuffle_buffer = shuffle_buffer
        self.shuffle_blocks = shuffle_blocks
        self.seed = seed
        self.transform = transform or standard_transform
        self.return_key = return_key
        self.epoch = 0

    def read_block(self, block) -> Iterator[RawSample]:
        raise NotImplementedError

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch's block order and shuffle; call before iterating each epoch."""
        self.epoch = epoch

    def blocks_for(self, worker_id: int, num_workers: int) -> list:
        """The blocks worker ``worker_id`` of this rank reads this epoch."""
        order = epoch_shard_order(self.blocks, self.seed, self.epoch) if self.shuffle_blocks else list(self.blocks)
        return split_shards_by_worker(split_shards_by_rank(order, self.rank, self.world_size), worker_id, num_workers)

    #: How to get more, smaller blocks (subclasses say it for their format).
    smaller_blocks = "make the blocks smaller"

    def check_split(self, num_workers: int) -> None:
        """Raise :class:`~packlab.loaders.tar.ShardSplitError` if some reader would get no block (or ranks unequal shares)."""
        try:
            check_shard_split(len(self.blocks), self.world_size, num_workers)
        except ShardSplitError:
            readers = f"{self.world_size} rank(s) x {max(1, num_workers)} worker(s)"
            raise ShardSplitError(
                f"{self.path} is read in {len(self.blocks)} blocks, too few to give each of {readers} an equal share "
                f"of at least one: {self.smaller_blocks}, or use fewer workers."
            ) from None

    def _block_samples(self, block) -> Iterator[RawSample]:
        """One block's samples; in skip mode a damaged block ends early and is counted once."""
        if not self.skipping:
            yield from self.read_block(block)
            return
        try:
            yield from self.read_block(block)
        except DamagedSampleError as exc:
            self._skip(f"{self.path}:{block}", "damaged shard", exc)

    def __iter__(self):
        info = get_worker_info()
        worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        self.check_split(num_workers)
        rng = random.Random(f"buffer-{self.seed}-{self.epoch}-{self.rank}-{worker_id}")
        raw = (sample for block in self.blocks_for(worker_id, num_workers) for sample in self._block_samples(block))
        for sample in shuffle_buffer(raw, self.shuffle_buffer, rng):
            item = self._decoded(sample)
            if item is not None:
                yield item

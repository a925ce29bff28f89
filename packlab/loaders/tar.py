"""Read WebDataset-style tar shards with an ``IterableDataset``.

A map-style dataset answers "give me sample *i*" and so needs random access. A tar shard
is read front to back, so the dataset is *iterable* instead: each DataLoader worker gets
an iterator over its own shards and yields their samples in turn. One epoch, stage by
stage:

1. **Shard list.** Paths or URLs, or a brace pattern such as ``shard-{000000..000009}.tar``
   (:func:`packlab.pack.expand_pattern`).
2. **Shard order.** Reshuffled every epoch from ``(seed, epoch)``. Every rank and every
   worker computes the *same* order, so the split below cuts one list into disjoint
   parts rather than cutting several different lists.
3. **Split.** By rank first (``order[rank::world_size]``), then by worker
   (``mine[worker::num_workers]``). Without the worker split every worker reads every
   shard and each sample arrives ``num_workers`` times.
4. **Read.** :mod:`tarfile` in streaming mode (``"r|"``) never seeks, so the same code
   reads a local file, a pipe or an HTTP response (:func:`open_shard`).
5. **Group.** Consecutive members that share a key (``000123.cls``, ``000123.jpg``) form
   one sample.
6. **Shuffle buffer.** A bounded buffer shuffles samples *locally* (:func:`shuffle_buffer`).
   It holds encoded bytes, about 35 kB a sample here, not 786 kB decoded tensors.
7. **Decode + transform.** :func:`packlab.transforms.standard_transform`, as in every
   loader of the course.

Two things :mod:`tarfile` does not do for us, and this module does: in streaming mode it
stops *silently* at a header it cannot parse or at a file cut off between two members
(it takes either for the end of the archive), so :func:`iter_tar_members` checks that
the archive really ends with tar's end-of-archive marker; and it knows nothing about
samples, so :func:`group_samples` insists that every sample has all of its files.
"""

from __future__ import annotations

import collections
import gzip
import itertools
import os
import random
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packlab.pack import expand_pattern
from packlab.transforms import standard_transform

#: Extensions every sample must have: the encoded image and its class label.
IMAGE_EXTENSION = "jpg"
LABEL_EXTENSION = "cls"
REQUIRED_EXTENSIONS = (IMAGE_EXTENSION, LABEL_EXTENSION)

_BLOCK = 512
#: A tar archive ends with two blocks of zeros.
_END_OF_ARCHIVE = bytes(2 * _BLOCK)


class ShardError(RuntimeError):
    """A shard cannot be opened, is truncated or corrupt, or holds an incomplete sample.

    The message always names the shard (and the member, when there is one).
    """


class ShardSplitError(ValueError):
    """The shards cannot be split between ranks and workers without starving someone."""


# ------------------------------------------------------------------ splitting shards


def split_shards_by_rank(shards: Sequence, rank: int, world_size: int) -> list:
    """The shards one rank reads: every ``world_size``-th, starting at ``rank``.

    Pure list arithmetic: the parts of all ranks are disjoint and together hold every
    shard once; with ``len(shards)`` not a multiple of ``world_size`` the first ranks
    get one shard more (nothing is dropped).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return list(shards[rank::world_size])


def split_shards_by_worker(shards: Sequence, worker_id: int, num_workers: int) -> list:
    """The shards one DataLoader worker reads, out of its rank's shards.

    Same rule as :func:`split_shards_by_rank`, applied inside a rank. ``num_workers=0``
    (everything in the main process) counts as one worker.
    """
    num_workers = max(1, num_workers)
    if not 0 <= worker_id < num_workers:
        raise ValueError(f"need 0 <= worker_id < num_workers, got worker_id={worker_id}, num_workers={num_workers}")
    return list(shards[worker_id::num_workers])


def shard_assignment(shards: Sequence, world_size: int, num_workers: int) -> dict[tuple[int, int], list]:
    """Which shards each ``(rank, worker)`` reads: rank split first, then worker split."""
    return {
        (rank, worker): split_shards_by_worker(split_shards_by_rank(shards, rank, world_size), worker, num_workers)
        for rank in range(world_size)
        for worker in range(max(1, num_workers))
    }


def check_shard_split(num_shards: int, world_size: int = 1, num_workers: int = 0) -> None:
    """Raise :class:`ShardSplitError` if splitting ``num_shards`` would starve a reader.

    Two conditions, both checkable before training starts, on every rank alike:

    * every one of the ``world_size * num_workers`` readers needs at least one shard;
      a worker without one just idles, but a *rank* without data never joins the
      collective operations (gradient all-reduce) the others are waiting in;
    * with several ranks, each must get the same number of shards, or some ranks run
      out of batches before the others and training stalls at the end of the epoch.
      (Equal shard counts give equal epochs when the shards hold equal numbers of
      samples, as :func:`packlab.pack.write_tar_shards` cuts them when ``maxcount``
      divides the dataset.)
    """
    readers = world_size * max(1, num_workers)
    fixes = (
        "Fixes: write more, smaller shards (a multiple of ranks x workers, e.g. "
        f"maxcount <= samples / {readers}), use fewer workers, or pass epoch_length=... to "
        "resample shards so every rank yields the same number of samples."
    )
    if num_shards < readers:
        raise ShardSplitError(
            f"{num_shards} shards cannot feed {world_size} rank(s) x {max(1, num_workers)} worker(s) = "
            f"{readers} readers: {readers - num_shards} of them would get no shard. {fixes}"
        )
    if world_size > 1 and num_shards % world_size:
        per_rank = [len(split_shards_by_rank(range(num_shards), r, world_size)) for r in range(world_size)]
        raise ShardSplitError(
            f"{num_shards} shards split over {world_size} ranks gives them {per_rank} shards: the ranks "
            f"with fewer run out of batches first and collective training stalls. {fixes}"
        )


def epoch_shard_order(shards: Sequence, seed: int, epoch: int) -> list:
    """The shards in this epoch's order: a permutation drawn from ``(seed, epoch)``.

    Deterministic, so every rank and worker that asks gets the same list.
    """
    order = np.random.default_rng([seed, epoch]).permutation(len(shards))
    return [shards[i] for i in order]


def distributed_rank_and_world_size() -> tuple[int, int]:
    """``(rank, world_size)`` of this process: from ``torch.distributed`` when it is
    initialised, else from the ``RANK``/``WORLD_SIZE`` variables torchrun sets, else ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return 0, 1


# ----------------------------------------------------------------- reading a shard


def open_shard(name: str, timeout: float = 60.0) -> BinaryIO:
    """Open a shard for sequential reading: a local path, ``file://`` or ``http(s)://`` URL.

    HTTP goes through :func:`urllib.request.urlopen`; ``timeout`` (seconds) bounds every
    wait for the server, so a stalled server raises instead of hanging a worker.
    Object stores (S3, GCS) work the same way through their HTTP endpoints or a client
    library that returns a readable stream: pass such a function as ``opener=``.
    """
    scheme = urllib.parse.urlparse(name).scheme
    if scheme in ("http", "https"):
        try:
            return urllib.request.urlopen(name, timeout=timeout)
        except (urllib.error.URLError, OSError) as exc:
            raise ShardError(f"cannot open shard {name}: {exc}. Is the server up and the name right?") from None
    path = urllib.request.url2pathname(urllib.parse.urlparse(name).path) if scheme == "file" else name
    try:
        return open(path, "rb")
    except OSError as exc:
        raise ShardError(f"cannot open shard {name}: {exc.strerror}. Check the shard list or pattern.") from None


class _RecentBytes:
    """A read-only file wrapper that counts the bytes read and keeps the last few reads.

    :func:`iter_tar_members` uses it to look at the bytes just after the last member
    once :mod:`tarfile` has stopped.
    """

    def __init__(self, raw: BinaryIO, keep_reads: int = 8):
        self.raw = raw
        self.position = 0
        self.recent: collections.deque[bytes] = collections.deque(maxlen=keep_reads)

    def read(self, size: int = -1) -> bytes:
        chunk = self.raw.read(size)
        self.position += len(chunk)
        self.recent.append(chunk)
        return chunk

    def bytes_from(self, offset: int, need: int) -> bytes:
        """At least ``need`` bytes from ``offset`` on (fewer if the stream ends first)."""
        kept = b"".join(self.recent)
        start = offset - (self.position - len(kept))
        if start < 0:
            raise RuntimeError("the end-of-archive check lost track of the stream position")
        tail = kept[start:]
        while len(tail) < need:
            more = self.read(need - len(tail))
            if not more:
                break
            tail += more
        return tail[:need]


def iter_tar_members(stream: BinaryIO, source: str) -> Iterator[tuple[str, bytes]]:
    """Yield ``(member name, bytes)`` for the regular files of a tar stream, in order.

    Reads sequentially with ``tarfile.open(fileobj=..., mode="r|")``; ``source`` names
    the shard in errors. ``.gz`` shards are decompressed on the fly. A shard that is cut
    off, or whose headers are damaged, raises :class:`ShardError` instead of ending early.
    """
    raw = gzip.GzipFile(fileobj=stream) if source.endswith((".gz", ".tgz")) else stream
    recorder = _RecentBytes(raw)
    try:
        with tarfile.open(fileobj=recorder, mode="r|") as tar:
            for info in tar:
                if not info.isfile():
                    continue
                yield info.name, tar.extractfile(info).read()
                # In streaming mode tarfile still appends every header to tar.members;
                # forget them, or a shard of millions of members grows without bound.
                tar.members = []
            # tarfile stops at the first header it cannot parse and at a file that ends
            # between members, as if the archive had ended there. A real end is two zero
            # blocks at tar.offset (where the next header would start): check for them.
            end = recorder.bytes_from(tar.offset, len(_END_OF_ARCHIVE))
    except TimeoutError as exc:
        raise ShardError(f"reading shard {source} timed out ({exc}): is the server or filesystem stalled?") from None
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as exc:
        raise ShardError(f"shard {source} is truncated or corrupt: {exc}. Rewrite or re-download it.") from None
    if len(end) < len(_END_OF_ARCHIVE):
        raise ShardError(
            f"shard {source} is truncated: it stops at byte {tar.offset + len(end)} without tar's "
            "end-of-archive marker, so the samples after that point are missing. Rewrite or re-download it."
        )
    if end != _END_OF_ARCHIVE:
        raise ShardError(
            f"shard {source} has a damaged header at byte {tar.offset}: reading stops there and the "
            "samples after it would be lost. Rewrite or re-download it."
        )


def split_key(member_name: str) -> tuple[str, str]:
    """``"dir/000123.cls"`` -> ``("dir/000123", "cls")``: the key is everything before the
    first dot of the file name, the extension everything after it (WebDataset's rule)."""
    folder, _, filename = member_name.rpartition("/")
    stem, dot, extension = filename.partition(".")
    if not dot:
        return member_name, ""
    return (f"{folder}/{stem}" if folder else stem), extension.lower()


class RawSample(NamedTuple):
    """One sample as read from a shard, before decoding."""

    key: str
    label: int
    image_bytes: bytes
    source: str  # "<shard>:<member>", for error messages


def group_samples(members: Iterable[tuple[str, bytes]], source: str) -> Iterator[RawSample]:
    """Group consecutive members with the same key into samples.

    A sample needs one ``.jpg`` and one ``.cls`` member; other extensions are ignored.
    Missing or repeated files raise :class:`ShardError` naming the shard and the key:
    the files of a sample must sit next to each other in the archive (sorting it by name
    does that).
    """

    def finish(key: str, files: dict[str, bytes]) -> RawSample:
        missing = [f".{ext}" for ext in REQUIRED_EXTENSIONS if ext not in files]
        if missing:
            raise ShardError(
                f"sample {key} in shard {source} has no {' or '.join(missing)} file next to its "
                f"{', '.join('.' + e for e in files) or 'other files'}: each sample needs "
                f"{' and '.join('.' + e for e in REQUIRED_EXTENSIONS)}, stored adjacently (tar --sort=name)."
            )
        text = files[LABEL_EXTENSION].decode("ascii", errors="replace").strip()
        try:
            label = int(text)
        except ValueError:
            raise ShardError(f"{source}:{key}.{LABEL_EXTENSION} holds {text!r}, not an integer class label") from None
        return RawSample(key, label, files[IMAGE_EXTENSION], f"{source}:{key}.{IMAGE_EXTENSION}")

    key, files = None, {}
    for name, payload in members:
        member_key, extension = split_key(name)
        if member_key != key:
            if key is not None:
                yield finish(key, files)
            key, files = member_key, {}
        if extension not in REQUIRED_EXTENSIONS:
            continue
        if extension in files:
            raise ShardError(f"shard {source} holds {name} twice: sample keys must be unique")
        files[extension] = payload
    if key is not None:
        yield finish(key, files)


def iter_shard_samples(
    shard: str, opener: Callable[[str], BinaryIO] = open_shard
) -> Iterator[RawSample]:
    """All samples of one shard, in archive order, undecoded."""
    stream = opener(shard)
    try:
        count = 0
        for sample in group_samples(iter_tar_members(stream, shard), shard):
            count += 1
            yield sample
        if count == 0:
            raise ShardError(f"shard {shard} holds no samples (no .jpg + .cls pairs)")
    finally:
        stream.close()


def count_samples(shard: str | Path) -> int:
    """Number of samples (``.jpg`` members) in a local shard, from its headers alone.

    Random-access mode lets tarfile seek past the data, so this is fast even for large
    shards; chapter 6 uses it to count how many samples each rank would get.
    """
    with tarfile.open(shard, mode="r:") as tar:
        return sum(1 for info in tar if info.isfile() and split_key(info.name)[1] == IMAGE_EXTENSION)


# ------------------------------------------------------------------ shuffling


def shuffle_buffer(items: Iterable, size: int, rng: random.Random) -> Iterator:
    """Shuffle a stream locally with a buffer of ``size`` items.

    Fill the buffer; then, for each new item, yield a randomly chosen buffered item and
    put the new one in its place; at the end, yield what is left in random order. An item
    can move *earlier* by at most ``size`` places, so a stream with long runs (a shard cut
    from a class-sorted list) keeps them unless the buffer is as large as the runs.
    ``size`` 0 or 1 passes the stream through unchanged.
    """
    if size <= 1:
        yield from items
        return
    buffer = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        i = rng.randrange(size)
        yield buffer[i]
        buffer[i] = item
    rng.shuffle(buffer)
    yield from buffer


def label_mixing(labels: Sequence[int], window: int = 100, num_classes: int = 10) -> float:
    """How far the class mix of short stretches of a stream is from the overall mix.

    The mean, over consecutive windows of ``window`` samples, of the total-variation
    distance between the window's class frequencies and the whole stream's: 0 when every
    window has the overall mix, close to 1 when every window holds one class. A perfect
    shuffle does not reach 0 (a window of 100 is a small sample); compare with
    ``label_mixing`` of a random permutation of the same labels.
    """
    labels = np.asarray(labels)
    overall = np.bincount(labels, minlength=num_classes) / len(labels)
    distances = []
    for start in range(0, len(labels) - window + 1, window):
        counts = np.bincount(labels[start : start + window], minlength=num_classes) / window
        distances.append(0.5 * np.abs(counts - overall).sum())
    return float(np.mean(distances))


# ------------------------------------------------------------------ the dataset


def skip_decode(image_bytes: bytes, source: str = "<bytes>") -> torch.Tensor:
    """A transform that does not decode: the encoded size in bytes, as a 0-d tensor.

    For passes that only look at keys and labels (shuffle statistics, split checks),
    where decoding would cost most of the time and tell us nothing.
    """
    return torch.tensor(len(image_bytes))


class TarShardDataset(IterableDataset):
    """Samples from WebDataset-style tar shards, split between ranks and workers.

    ``shards`` is a list of paths/URLs or a brace pattern. Each epoch the shard order is
    permuted from ``(seed, epoch)`` (call :meth:`set_epoch` before each epoch), split by
    rank and then by DataLoader worker, read sequentially, shuffled in a buffer of
    ``shuffle_buffer`` samples per worker (0 or 1: no shuffle) and decoded with the
    standard transform, or ``transform(jpeg_bytes, source)`` if given (``source`` names
    the shard and member, for error messages). Yields ``(image, label)``,
    or ``(image, label, key)`` with ``return_key=True``.

    ``rank``/``world_size`` default to this process's place in ``torch.distributed``
    (or torchrun's environment variables), read when the dataset is created.

    Every epoch checks that each reader gets at least one shard and that ranks get equal
    shares (:func:`check_shard_split`); call :meth:`check_split` yourself to fail even
    earlier. ``epoch_length=N`` switches to resampling: each rank draws shards at random,
    with replacement, and yields exactly ``N`` samples per epoch, whatever the shard count.
    Epochs are then equally long on every rank, but samples are no longer seen exactly once.

    ``split_by_worker=False`` exists to show what goes wrong without the worker split.

    With ``persistent_workers=True`` each worker keeps the copy of the dataset it got when
    it started, so :meth:`set_epoch` no longer reaches it; leave persistent workers off.
    """

    def __init__(
        self,
        shards: str | Path | Sequence[str | Path],
        *,
        shuffle_buffer: int = 0,
        shuffle_shards: bool = True,
        seed: int = 0,
        transform: Callable[[bytes, str], Any] = standard_transform,
        return_key: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        split_by_worker: bool = True,
        epoch_length: int | None = None,
        opener: Callable[[str], BinaryIO] = open_shard,
    ):
        super().__init__()
        if isinstance(shards, (str, Path)):
            self.shards = expand_pattern(str(shards))
        else:
            self.shards = [str(s) for s in shards]
        if not self.shards:
            raise ValueError("no shards given")
        if rank is None or world_size is None:
            rank, world_size = distributed_rank_and_world_size()
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if epoch_length is not None and epoch_length < 1:
            raise ValueError("epoch_length must be a positive number of samples per rank")
        self.rank, self.world_size = rank, world_size
        self.shuffle_buffer = shuffle_buffer
        self.shuffle_shards = shuffle_shards
        self.seed = seed
        self.transform = transform
        self.return_key = return_key
        self.split_by_worker = split_by_worker
        self.epoch_length = epoch_length
        self.opener = opener
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch's shard order and shuffle; call before iterating each epoch."""
        self.epoch = epoch

    def check_split(self, num_workers: int) -> None:
        """Raise :class:`ShardSplitError` now if ``num_workers`` workers per rank would starve."""
        if self.epoch_length is None:
            check_shard_split(len(self.shards), self.world_size, num_workers if self.split_by_worker else 0)

    def shards_for(self, worker_id: int, num_workers: int) -> list[str]:
        """The shards worker ``worker_id`` of this rank reads this epoch (not in resampling mode)."""
        order = epoch_shard_order(self.shards, self.seed, self.epoch) if self.shuffle_shards else list(self.shards)
        mine = split_shards_by_rank(order, self.rank, self.world_size)
        if self.split_by_worker:
            mine = split_shards_by_worker(mine, worker_id, num_workers)
        return mine

    def _raw_samples(self, worker_id: int, num_workers: int) -> Iterator[RawSample]:
        if self.epoch_length is None:
            for shard in self.shards_for(worker_id, num_workers):
                yield from iter_shard_samples(shard, self.opener)
            return
        # Resampling: draw shards with replacement until this worker's share is delivered.
        share = self.epoch_length // num_workers + (worker_id < self.epoch_length % num_workers)
        rng = random.Random(f"shards-{self.seed}-{self.epoch}-{self.rank}-{worker_id}")
        drawn = (rng.choice(self.shards) for _ in itertools.count())
        samples = (s for shard in drawn for s in iter_shard_samples(shard, self.opener))
        yield from itertools.islice(samples, share)

    def __iter__(self):
        info = get_worker_info()
        worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        self.check_split(num_workers)
        rng = random.Random(f"buffer-{self.seed}-{self.epoch}-{self.rank}-{worker_id}")
        raw = self._raw_samples(worker_id, num_workers)
        for sample in shuffle_buffer(raw, self.shuffle_buffer, rng):
            image = self.transform(sample.image_bytes, sample.source)
            yield (image, sample.label, sample.key) if self.return_key else (image, sample.label)

    def __repr__(self) -> str:
        return (
            f"TarShardDataset({len(self.shards)} shards, rank {self.rank}/{self.world_size}, "
            f"shuffle_buffer={self.shuffle_buffer}, epoch={self.epoch})"
        )

"""Read WebDataset-style tar shards with an ``IterableDataset``.

A map-style dataset answers "give me sample *i*" and so needs random access. A tar shard
is read front to back, so the dataset is *iterable* instead: each DataLoader worker gets
an iterator over its own shards and yields their samples in turn. One epoch, stage by
stage:

1. **Shard list.** Paths or URLs, or a brace pattern such as ``shard-{000000..000009}.tar``
   (:func:`packlab.pack.expand_pattern`).
2. **Shard order.** Reshuffled every epoch from ``(seed, epoch)``. Every rank and every
   worker computes the *same* order, so the split below cuts one list into disjoint
   parts rather than cutting several different lists. The epoch is set in the training
   process and read by the workers through shared memory (:class:`SharedEpoch`), so it
   reaches persistent workers too.
3. **Split.** By rank first (``order[rank::world_size]``), then by worker
   (``mine[worker::num_workers]``). Without the worker split every worker reads every
   shard and each sample arrives ``num_workers`` times.
4. **Read.** Header, contents, header, contents, front to back, never seeking, so the
   same code reads a local file, a pipe or an HTTP response (:func:`open_shard`,
   :func:`iter_tar_members`).
5. **Group.** Consecutive members that share a key (``000123.cls``, ``000123.jpg``) form
   one sample.
6. **Shuffle buffer.** A bounded buffer shuffles samples *locally* (:func:`shuffle_buffer`).
   It holds encoded bytes (about 110 kB a sample here, as in ImageNet), not decoded
   tensors (786 kB).
7. **Decode + transform.** :func:`packlab.transforms.standard_transform`, as in every
   loader of the course.

Why not :mod:`tarfile` in streaming mode (``"r|"``)? It works, but it stops *silently* at a header it cannot parse or at a file
cut off between two members (it takes either for the end of the archive), and its
general machinery costs more per member than the few lines a sample stream needs. So
:func:`iter_tar_members` reads the format itself, checks every header's checksum and
insists on tar's end-of-archive marker; and :func:`group_samples` insists that every
sample has all of its files.
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
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packlab.loaders.skipping import MAX_WORKERS, BadSampleHandling
from packlab.pack import expand_pattern
from packlab.resume import (
    STATE_VERSION,
    Piece,
    ResumeError,
    ShardStream,
    epoch_pieces_left,
    stream_state_without_byte_offsets,
    without_byte_offsets,
)
from packlab.transforms import CorruptImageError, standard_transform

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


class RepeatedEpochWarning(UserWarning):
    """A reader started a second pass over the same epoch without ``set_epoch`` in between."""


class SharedEpoch:
    """The epoch number: written by ``set_epoch`` in the training process, read by every DataLoader worker.

    Why shared memory. A DataLoader worker reads its own copy of the dataset. Without
    ``persistent_workers`` it gets a fresh copy every epoch (forked from, or pickled out
    of, the training process's dataset), so a plain ``self.epoch = epoch`` set before the
    epoch reaches it. With ``persistent_workers=True`` the workers start once and keep
    their first copy: at the next epoch the DataLoader only tells each worker to iterate
    its copy again (``_ResumeIteration`` in ``torch/utils/data/_utils/worker.py``), and
    nothing the training process changes in its own dataset reaches them. Every epoch
    would then repeat the first one's shard order and shuffle, silently.

    So the number lives in a small int64 tensor in shared memory, like
    :class:`packlab.loaders.skipping.SkipCounter`'s counts: ``fork`` workers inherit the
    mapping, and under ``spawn`` and ``forkserver`` torch pickles a shared tensor as a
    handle on the same memory. One writer (the training process, between epochs), many
    readers: every reader of every epoch sees the number last set, persistent or not.

    Why not let each worker count its own epochs instead (what ``webdataset``'s
    ``detshuffle`` does)? Fresh workers start from the training process's copy, which never
    counts, so they would repeat epoch 0 for ever; and a reader whose count falls out of
    step with the others (a worker count changed between loaders, a loader abandoned
    mid-epoch) would cut a *different* permutation of the shards than its peers: shards
    lost and duplicated, without an error. One number set in one place cannot disagree.

    Forgetting ``set_epoch`` therefore repeats the last epoch's order everywhere, as it does
    for ``DistributedSampler``. That at least is detected: each process records in its own
    row (row 0 the main process, row ``1 + i`` worker ``i``) which ``set_epoch`` call it last
    iterated under, and :meth:`start_pass` reports a second pass under the same one.
    """

    def __init__(self, max_workers: int = MAX_WORKERS):
        # [epoch, number of set() calls so far, then per process: the set() count of its last pass]
        state = torch.full((2 + 1 + max_workers,), -1, dtype=torch.int64)
        state[:2] = 0
        self._state = state.share_memory_()

    @property
    def value(self) -> int:
        """The epoch last set (0 before any)."""
        return int(self._state[0])

    def set(self, epoch: int) -> None:
        """Set the epoch (in the training process, before the DataLoader's epoch starts)."""
        self._state[0] = epoch
        self._state[1] += 1

    def start_pass(self, reader: int | None = None) -> tuple[int, bool]:
        """``(epoch, repeated)`` for a pass this process starts now.

        ``repeated`` is True when this process (this worker, or the main process) already
        started a pass since the last :meth:`set`: the pass will repeat that one's order.
        Threads that read several shares in one process (``ThreadLoader``'s readers) pass
        their ``reader`` number and get the row of the worker that would read that share,
        so reader 1 does not take reader 0's pass for its own.
        """
        info = get_worker_info()
        if info is not None:
            row = 2 + info.id + 1
        else:
            row = 2 if reader is None else 2 + reader + 1
        generation = int(self._state[1])
        repeated = False
        if row < len(self._state):  # more workers than rows: no check, the epoch is still right
            repeated = int(self._state[row]) == generation
            self._state[row] = generation
        return int(self._state[0]), repeated


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


class ShardOpener:
    """The default ``opener=``: :func:`open_shard` for a whole shard, and ``open_from`` for a part of one.

    ``open_from(name, offset, etag=None, end=None)`` opens a shard at byte ``offset``,
    reading up to byte ``end`` (exclusive; None: to the end of the shard): a ``seek`` on a
    local file, an HTTP ``Range: bytes=offset-(end - 1)`` request for a URL (chapter 10;
    :meth:`packlab.objectstore.S3ShardOpener.open_from` does the same for ``s3://``). A tar
    stream can start again at any member's header, so a reader that knows where a sample's
    headers begin can read that sample alone (:func:`read_sample_spans`): resuming a
    shuffle buffer (:mod:`packlab.resume`) then costs the buffered samples' bytes, not
    their shards' from byte 0. ``etag`` is accepted for the openers' common signature; a
    local file or a plain web server has none to check.
    """

    def __call__(self, name: str) -> BinaryIO:
        return open_shard(name)

    def open_from(self, name: str, offset: int, etag: str | None = None, end: int | None = None) -> BinaryIO:
        scheme = urllib.parse.urlparse(name).scheme
        if scheme in ("http", "https"):
            wanted = f"bytes={offset}-{'' if end is None else end - 1}"
            request = urllib.request.Request(name, headers={"Range": wanted})
            try:
                response = urllib.request.urlopen(request, timeout=60.0)
            except (urllib.error.URLError, OSError) as exc:
                raise ShardError(f"cannot open shard {name} at byte {offset:,}: {exc}. Is the server up?") from None
            if offset and response.status != 206:
                response.close()
                raise ShardError(f"the server of {name} ignored the range request ({wanted}, answered "
                                 f"{response.status}): it cannot resume a shard in the middle")
            return response
        stream = open_shard(name)
        stream.seek(offset)
        return stream


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    """``size`` bytes from ``stream``, or fewer only if the stream ends first.

    Files return everything asked for in one read; pipes and sockets may return less,
    so keep reading.
    """
    chunk = stream.read(size)
    if len(chunk) == size or not chunk:
        return chunk
    parts = [chunk]
    got = len(chunk)
    while got < size:
        more = stream.read(size - got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _header_number(field: bytes) -> int:
    """A numeric header field: octal digits, NUL/space padded, or GNU base-256 for large values."""
    if field[0] & 0x80:  # base-256: the remaining bits are a big-endian binary number
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    return int(digits, 8) if digits else 0


def _header_string(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _pax_records(payload: bytes) -> dict[str, str]:
    """The ``key=value`` records of a pax extended header ("%d %s=%s\\n", length first)."""
    records, position = {}, 0
    while position < len(payload):
        space = payload.index(b" ", position)
        length = int(payload[position:space])
        key, _, value = payload[space + 1 : position + length - 1].partition(b"=")
        records[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
        position += length
    return records


#: Type flags of members whose bytes are a file's contents.
_REGULAR_FILE_TYPES = (b"0", b"\0", b"7")


def iter_tar_members(stream: BinaryIO, source: str) -> Iterator[tuple[str, bytes]]:
    """Yield ``(member name, bytes)`` for the regular files of a tar stream, in order.

    A tar archive is a sequence of members, each a 512-byte header (name, size in octal,
    type, a checksum of the header) followed by the contents padded to a multiple of 512
    bytes, and it ends with two blocks of zeros. This reads it front to back, never
    seeking, so a local file, a pipe and an HTTP response all work; ``.gz`` shards are
    decompressed on the fly. It understands the ustar, GNU and pax variants of the
    format that :mod:`tarfile` and GNU tar write (long names included) and skips
    directories, links and other non-files. ``source`` names the shard in errors.

    Unlike :mod:`tarfile` in streaming mode, which takes a cut-off file or a damaged
    header for the end of the archive and stops silently, this raises
    :class:`ShardError` for both: every header's checksum is verified, and the archive
    must end with its end-of-archive blocks.
    """
    raw = gzip.GzipFile(fileobj=stream) if source.endswith((".gz", ".tgz")) else stream
    offset = 0  # of the next header, for error messages
    long_name: str | None = None  # from a GNU 'L' member, for the member after it
    pax: dict[str, str] = {}  # from a pax 'x' member, for the member after it
    try:
        while True:
            header = _read_exactly(raw, _BLOCK)
            if len(header) < _BLOCK:
                raise ShardError(
                    f"shard {source} is truncated: it stops at byte {offset + len(header)} without tar's "
                    "end-of-archive marker, so the samples after that point are missing. Rewrite or re-download it."
                )
            if header == _END_OF_ARCHIVE[:_BLOCK]:
                second = _read_exactly(raw, _BLOCK)
                if second != _END_OF_ARCHIVE[:_BLOCK]:
                    raise ShardError(
                        f"shard {source} has a block of zeros at byte {offset} that is not followed by a second one: "
                        "the archive is damaged there. Rewrite or re-download it."
                    )
                return
            # The checksum is the sum of the header's bytes with its own field read as spaces.
            try:
                stored = _header_number(header[148:156])
            except ValueError:
                stored = -1
            computed = sum(header[:148]) + 8 * 32 + sum(header[156:])
            if stored != computed:
                raise ShardError(
                    f"shard {source} has a damaged header at byte {offset} (checksum mismatch): reading stops "
                    "there and the samples after it would be lost. Rewrite or re-download it."
                )
            size = int(pax["size"]) if "size" in pax else _header_number(header[124:136])
            padded = size + (-size % _BLOCK)
            contents = _read_exactly(raw, padded)
            if len(contents) < padded:
                raise ShardError(
                    f"shard {source} is truncated: the member whose header is at byte {offset} needs {size} bytes "
                    f"and the file ends after {len(contents)}. Rewrite or re-download it."
                )
            payload = contents[:size] if padded != size else contents
            offset += _BLOCK + padded
            kind = header[156:157]
            if kind == b"L":  # GNU long name: the contents name the next member
                long_name = _header_string(payload)
                continue
            if kind == b"x":  # pax extended header: records for the next member
                pax = _pax_records(payload)
                continue
            if kind in _REGULAR_FILE_TYPES:
                if long_name is not None:
                    name = long_name
                elif "path" in pax:
                    name = pax["path"]
                else:
                    name = _header_string(header[0:100])
                    if header[257:263] == b"ustar\0" and header[345] != 0:  # POSIX ustar: prefix/name
                        name = f"{_header_string(header[345:500])}/{name}"
                yield name, payload
            # Directories, links, pax global headers ('g'), GNU long link names ('K'): not samples.
            long_name, pax = None, {}
    except TimeoutError as exc:
        raise ShardError(f"reading shard {source} timed out ({exc}): is the server or filesystem stalled?") from None
    except (EOFError, OSError, gzip.BadGzipFile, ValueError) as exc:
        raise ShardError(f"shard {source} is truncated or corrupt: {exc}. Rewrite or re-download it.") from None


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
    the files of a sample must sit next to each other in the archive, which is all a
    streaming reader needs (:func:`packlab.pack.write_tar_shards` and
    ``webdataset.ShardWriter`` write them so; the archive need not be sorted).
    """

    def finish(key: str, files: dict[str, bytes]) -> RawSample:
        missing = [f".{ext}" for ext in REQUIRED_EXTENSIONS if ext not in files]
        if missing:
            raise ShardError(
                f"sample {key} in shard {source} has no {' or '.join(missing)} file next to its "
                f"{', '.join('.' + e for e in files) or 'other files'}: each sample needs "
                f"{' and '.join('.' + e for e in REQUIRED_EXTENSIONS)}, next to each other in the shard "
                "(as packlab.pack.write_tar_shards and webdataset.ShardWriter write them)."
            )
        text = files[LABEL_EXTENSION].decode("ascii", errors="replace").strip()
        try:
            label = int(text)
        except ValueError:
            raise ShardError(
                f"{source}:{key}.{LABEL_EXTENSION} holds {text!r}, not an integer class label. Rewrite the shard "
                "(packlab.pack.write_tar_shards), or pass on_bad_sample='skip' to the dataset to skip such samples."
            ) from None
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


class _CountingReader:
    """Reads through to ``stream``, counting the bytes; stops after ``limit`` bytes and then adds tar's end marker.

    With a ``limit`` the reader stands for the tar archive that holds exactly those bytes:
    the members of a sample (or a run of samples) read from the middle of a shard, followed
    by the two blocks of zeros :func:`iter_tar_members` insists on.
    """

    def __init__(self, stream: BinaryIO, limit: int | None = None):
        self.stream, self.limit, self.count = stream, limit, 0
        self._end_marker = b"" if limit is None else _END_OF_ARCHIVE

    def read(self, size: int = -1) -> bytes:
        if self.limit is not None and self.count >= self.limit:
            chunk, self._end_marker = self._end_marker[:size], self._end_marker[size:]
            return chunk
        if self.limit is not None:
            size = self.limit - self.count if size is None or size < 0 else min(size, self.limit - self.count)
        chunk = self.stream.read(size)
        self.count += len(chunk)
        return chunk

    def close(self) -> None:
        self.stream.close()


def iter_sample_spans(stream: BinaryIO, source: str, start: int = 0, limit: int | None = None,
                      ) -> Iterator[tuple[RawSample, int, int]]:
    """``(sample, begin, end)`` for the samples of a tar stream whose first byte is byte ``start`` of the shard.

    ``begin`` is the byte where the sample's first header begins (long-name and pax headers
    included), ``end`` where the next sample's begins (or where the last sample's last
    member ends): the sample is exactly the shard's bytes ``[begin, end)``, and a tar
    reader can start at ``begin``. :func:`group_samples` knows that a sample is complete
    only when it has read the first member of the next one, so the begin of each key's
    first member is noted as the members go by. With ``limit``, only that many bytes are
    read from ``stream`` (see :class:`_CountingReader`).
    """
    counted = _CountingReader(stream, limit)
    begins: collections.deque = collections.deque()  # (key, byte) of each sample whose first member was read
    last = {"end": start, "finished": False}

    def members():
        position = start
        for name, payload in iter_tar_members(counted, source):
            key = split_key(name)[0]
            if not begins or begins[-1][0] != key:
                begins.append((key, position))
            position = last["end"] = start + counted.count
            yield name, payload
        last["finished"] = True

    for sample in group_samples(members(), source):
        _, begin = begins.popleft()
        yield sample, begin, (last["end"] if last["finished"] else begins[0][1])


def read_sample_spans(shard: str, opener: Callable[[str], BinaryIO] = open_shard, begin: int = 0,
                      end: int | None = None) -> Iterator[tuple[RawSample, int, int]]:
    """``(sample, begin, end)`` for the samples of ``shard`` between bytes ``begin`` and ``end`` (None: its end).

    From byte 0 to the end this reads the shard as :func:`iter_shard_samples` does. Anything
    else needs an opener with ``open_from`` (:class:`ShardOpener`, S3's) and a ``begin`` and
    ``end`` that fall on sample boundaries, as :func:`iter_sample_spans` reported them: then
    only those bytes are requested and read. Not for compressed shards, whose byte offsets
    are the compressed stream's.
    """
    whole = begin == 0 and end is None
    if not whole and not hasattr(opener, "open_from"):
        raise ShardError(f"cannot read shard {shard} from byte {begin:,}: the opener {opener!r} has no open_from")
    stream = opener(shard) if whole else opener.open_from(shard, begin, end=end)
    try:
        found = False
        for item in iter_sample_spans(stream, shard, begin, None if end is None else end - begin):
            found = True
            yield item
        if not found and whole:
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
    # Every whole window at once (the bands of packlab.class_mixing call this a thousand times):
    # one row per window, one column per class.
    classes = len(overall)
    windows = labels[: len(labels) // window * window].reshape(-1, window)
    cells = (np.arange(len(windows))[:, None] * classes + windows).ravel()  # (window, class) as one number
    counts = np.bincount(cells, minlength=len(windows) * classes).reshape(-1, classes) / window
    return float(np.mean(0.5 * np.abs(counts - overall).sum(axis=1)))


# ------------------------------------------------------------------ the dataset


def skip_decode(image_bytes: bytes, source: str = "<bytes>") -> torch.Tensor:
    """A transform that does not decode: the encoded size in bytes, as a 0-d tensor.

    For passes that only look at keys and labels (shuffle statistics, split checks),
    where decoding would cost most of the time and tell us nothing.
    """
    return torch.tensor(len(image_bytes))


class RawSampleDecoding(BadSampleHandling):
    """Turns a :class:`RawSample` into a dataset item, for streaming datasets (tar shards,
    and the LMDB and Parquet streams of :mod:`packlab.formats`): ``self.transform`` decodes,
    ``self.return_key`` adds the key, and a corrupt image raises or is skipped."""

    def _decoded(self, sample: RawSample):
        """The item for one sample, or None when it was skipped."""
        try:
            image = self.transform(sample.image_bytes, sample.source)
        except CorruptImageError as exc:
            if not self.skipping:
                raise
            self._skip(sample.source, "corrupt image", exc)
            return None
        return (image, sample.label, sample.key) if self.return_key else (image, sample.label)


class TarShardDataset(IterableDataset, RawSampleDecoding):
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

    ``opener(name)`` opens a shard for reading (default :class:`ShardOpener`: local paths,
    ``file://`` and ``http(s)://`` URLs; :class:`packlab.objectstore.S3ShardOpener` for
    ``s3://``). With an ``open_from`` method, as both have, a resumed reader reads only the
    bytes of the samples it still owes (:mod:`packlab.resume`); without, it reads the
    shards it needs from byte 0.

    Every epoch checks that each reader gets at least one shard and that ranks get equal
    shares (:func:`check_shard_split`); call :meth:`check_split` yourself to fail even
    earlier. ``epoch_length=N`` switches to resampling: each rank draws shards at random,
    with replacement, and yields exactly ``N`` samples per epoch, whatever the shard count.
    Epochs are then equally long on every rank, but samples are no longer seen exactly once.

    ``split_by_worker=False`` exists to show what goes wrong without the worker split.

    The epoch lives in shared memory (:class:`SharedEpoch`), so :meth:`set_epoch` reaches
    DataLoader workers whether they are fresh every epoch or persistent
    (``persistent_workers=True``, where a plain attribute would stay at the value the
    workers started with), under ``fork``, ``spawn`` and ``forkserver`` alike. Without
    ``set_epoch`` every epoch repeats the previous one's order (still every sample once),
    and a :class:`RepeatedEpochWarning` says so.

    A damaged shard, a sample with a bad label or a missing file, or an image that does
    not decode raises (:class:`ShardError`, :class:`~packlab.transforms.CorruptImageError`)
    naming the shard and member. With ``on_bad_sample="skip"`` the bad sample is left out
    instead, with a :class:`~packlab.loaders.skipping.BadSampleWarning`, and counted in
    ``skipped`` (summed over DataLoader workers). A truncated or corrupt shard delivers
    the samples before the damage and counts once, as a damaged shard: how many samples
    were lost after the damage cannot be known. A shard that cannot be opened raises in
    either mode. With ``epoch_length``, a skipped image is replaced by another draw, so
    epochs keep their length.
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
        opener: Callable[[str], BinaryIO] | None = None,
        on_bad_sample: str = "raise",
    ):
        super().__init__()
        self._set_bad_sample_mode(on_bad_sample)
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
        self.opener = ShardOpener() if opener is None else opener
        self._epoch = SharedEpoch()

    @property
    def epoch(self) -> int:
        """The epoch last passed to :meth:`set_epoch` (0 before any)."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch's shard order and shuffle; call before iterating each epoch.

        The value is written to shared memory, so DataLoader workers see it even when they
        are persistent.
        """
        self._epoch.set(epoch)

    def check_split(self, num_workers: int) -> None:
        """Raise :class:`ShardSplitError` now if ``num_workers`` workers per rank would starve."""
        if self.epoch_length is None:
            check_shard_split(len(self.shards), self.world_size, num_workers if self.split_by_worker else 0)

    def shards_for(self, worker_id: int, num_workers: int, epoch: int | None = None) -> list[str]:
        """The shards worker ``worker_id`` of this rank reads in ``epoch`` (default: the current one).

        Not used in resampling mode (``epoch_length``).
        """
        epoch = self.epoch if epoch is None else epoch
        order = epoch_shard_order(self.shards, self.seed, epoch) if self.shuffle_shards else list(self.shards)
        mine = split_shards_by_rank(order, self.rank, self.world_size)
        if self.split_by_worker:
            mine = split_shards_by_worker(mine, worker_id, num_workers)
        return mine

    def _shard_samples(self, shard: str) -> Iterator[RawSample]:
        """One shard's samples; in skip mode without the bad ones."""
        if not self.skipping:
            return iter_shard_samples(shard, self.opener)
        return self._good_samples(shard)

    def _shard_spans(self, shard: str, begin: int = 0, end: int | None = None,
                     ) -> Iterator[tuple[RawSample, int | None, int | None]]:
        """``(sample, begin, end)`` for the samples of one shard between those bytes (the reader of a ShardStream).

        Byte spans are known where the shard can be read from an offset (an opener with
        ``open_from``, an uncompressed shard, the raising mode, and ``_shard_samples`` not
        overridden by a subclass that reads shards its own way); elsewhere ``begin`` and
        ``end`` are None and a resume reads such shards from byte 0.
        """
        if not self._ranged(shard):
            if begin or end is not None:
                raise ResumeError(f"shard {shard} cannot be read from byte {begin:,} with {self.opener!r}")
            yield from ((sample, None, None) for sample in self._shard_samples(shard))
            return
        try:
            yield from read_sample_spans(shard, self.opener, begin, end)
        except ShardError as exc:
            if begin == 0 and end is None:
                raise
            raise ResumeError(f"shard {shard}, from byte {begin:,}: {exc} The shard changed since the state was "
                              "saved: resume only with the shards the state was saved with.") from None

    def _can_range(self) -> bool:
        """Whether this dataset can read a part of a shard: an opener with ``open_from``, and shards read as here."""
        return (hasattr(self.opener, "open_from") and not self.skipping
                and type(self)._shard_samples is TarShardDataset._shard_samples)

    def _ranged(self, shard: str) -> bool:
        return self._can_range() and not shard.endswith((".gz", ".tgz"))

    def _good_samples(self, shard: str) -> Iterator[RawSample]:
        """Skip mode: one shard's samples, leaving out bad ones instead of raising.

        The members are grouped by key and each group becomes a sample on its own, so a
        sample with a bad label or a missing file is skipped alone. Damage to the shard
        itself ends it: the samples before the damage have been delivered.
        """
        stream = self.opener(shard)  # a shard that cannot be opened raises, even in skip mode
        try:
            found = False
            members = iter_tar_members(stream, shard)
            for key, files in itertools.groupby(members, key=lambda member: split_key(member[0])[0]):
                files = list(files)  # a damaged shard raises here, outside the sample's try
                found = True
                try:
                    yield from group_samples(files, shard)
                except ShardError as exc:
                    self._skip(f"{shard}:{key}", "invalid sample", exc)
            if not found:
                raise ShardError(f"shard {shard} holds no samples")
        except ShardError as exc:
            self._skip(shard, "damaged shard", exc)
        finally:
            stream.close()

    def _resampled(self, rng: random.Random) -> Iterator[RawSample]:
        """Samples of shards drawn with replacement, without end (``epoch_length`` mode)."""
        empty: set[str] = set()
        while len(empty) < len(set(self.shards)):
            shard = rng.choice(self.shards)
            found = False
            for sample in self._shard_samples(shard):
                found = True
                yield sample
            if not found:  # only in skip mode; without this check, all-bad shards would loop forever
                empty.add(shard)
        raise ShardError(f"none of the {len(empty)} shards holds a readable sample: check or rewrite them")

    def _raw_samples(
        self, worker_id: int, num_workers: int, epoch: int
    ) -> tuple[Iterator[RawSample], Iterator | None]:
        """This worker's undecoded samples for the epoch, and (resampling only) the endless stream they come from."""
        if self.epoch_length is None:
            shards = self.shards_for(worker_id, num_workers, epoch)
            return (sample for shard in shards for sample in self._shard_samples(shard)), None
        # Resampling: draw shards with replacement until this worker's share is delivered.
        share = self.epoch_length // num_workers + (worker_id < self.epoch_length % num_workers)
        rng = random.Random(f"shards-{self.seed}-{epoch}-{self.rank}-{worker_id}")
        endless = self._resampled(rng)
        return itertools.islice(endless, share), endless

    def __iter__(self):
        info = get_worker_info()
        worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        return self.iter_share(worker_id, num_workers)

    def iter_share(self, worker_id: int, num_workers: int):
        """This epoch's samples for reader ``worker_id`` of ``num_workers``, whoever the reader is.

        ``__iter__`` asks :func:`torch.utils.data.get_worker_info` which share is this
        process's. That answer is per *process*; threads in one process (see
        :class:`packlab.loaders.threads.ThreadLoader`) call this directly with their own id.
        """
        self.check_split(num_workers)
        # From shared memory: persistent workers see set_epoch too. Several readers of one process (threads) each
        # keep their own mark.
        epoch, repeated = self._epoch.start_pass(worker_id if num_workers > 1 else None)
        resumed = self._take_saved_state(epoch, worker_id, num_workers)
        if repeated and resumed is None and self._order_depends_on_epoch():
            warnings.warn(RepeatedEpochWarning(
                f"{self!r} starts another pass over epoch {epoch} without set_epoch() since the last one, so it "
                "repeats that pass's shard order and shuffle. Call dataset.set_epoch(epoch) before each epoch."
            ), stacklevel=2)
        if self.epoch_length is not None:
            rng = random.Random(f"buffer-{self.seed}-{epoch}-{self.rank}-{worker_id}")
            raw, spare = self._raw_samples(worker_id, num_workers, epoch)
            samples = shuffle_buffer(raw, self.shuffle_buffer, rng)
        else:
            spare = None
            samples = self._stream = self._open_stream(epoch, worker_id, num_workers, resumed)
        try:
            for sample in samples:
                item = self._decoded(sample)
                while item is None and spare is not None:  # resampling: draw a replacement, keep the length
                    item = self._decoded(next(spare))
                if item is not None:
                    yield item
        finally:
            if spare is None:
                samples.close()

    # ------------------------------------------------------------ checkpoint and resume

    def _open_stream(self, epoch: int, worker_id: int, num_workers: int, resumed: dict | None) -> ShardStream:
        """This reader's :class:`~packlab.resume.ShardStream`: fresh, or where a saved state left off."""
        self._reader_pid = os.getpid()  # a forked worker inherits these attributes: they are not its own
        self._reader, stream = self._reader_start(epoch, worker_id, num_workers, resumed)
        return stream

    def _reader_start(self, epoch: int, worker_id: int, num_workers: int,
                      resumed: dict | None) -> tuple[dict, ShardStream]:
        """Who this reader is (a dict for its state) and the stream it starts from; changes nothing."""
        reader = {"epoch": epoch, "seed": self.seed, "rank": self.rank, "world_size": self.world_size,
                  "worker_id": worker_id, "num_workers": num_workers}
        if resumed is not None and resumed.get("kind") == "reader":
            reader["share"] = resumed["share"]
            if resumed["stream"] is not None:
                saved = resumed["stream"] if self._can_range() else stream_state_without_byte_offsets(resumed["stream"])
                return reader, ShardStream.restore(saved, self._shard_spans)
            pieces = [Piece(s) for s in resumed["share"]]
        elif resumed is not None:  # an epoch state from another layout: split what is left between our readers
            index = self.rank * num_workers + worker_id
            pieces = epoch_pieces_left(resumed)[index :: self.world_size * num_workers]
            pieces = pieces if self._can_range() else without_byte_offsets(pieces)
            reader["share"] = sorted({p.shard for p in pieces})
            rng = random.Random(f"resumed-{self.seed}-{epoch}-{self.rank}-{worker_id}")
            return reader, ShardStream(pieces, self._shard_spans, self.shuffle_buffer, rng)
        else:
            reader["share"] = self.shards_for(worker_id, num_workers, epoch)
            pieces = [Piece(s) for s in reader["share"]]
        rng = random.Random(f"buffer-{self.seed}-{epoch}-{self.rank}-{worker_id}")
        return reader, ShardStream(pieces, self._shard_spans, self.shuffle_buffer, rng)

    def state_dict(self) -> dict:
        """Where this process's reader stands in the epoch, at sample granularity (plain lists and numbers).

        Called *in a DataLoader worker* (torchdata's ``StatefulDataLoader`` does, after every
        batch) it describes that worker's share; in the main process, the main process's own
        reading (``num_workers=0``). In the main process of a loader with workers it knows
        nothing of what the workers read: save ``loader.state_dict()`` instead. See
        :mod:`packlab.resume` for what the state holds and why.
        """
        if self.epoch_length is not None:
            raise ValueError("a resampling TarShardDataset (epoch_length=...) cannot save its position")
        mine = getattr(self, "_reader_pid", None) == os.getpid()
        stream = getattr(self, "_stream", None) if mine else None
        reader = getattr(self, "_reader", None) if mine else None
        if reader is None:  # nothing read yet in this process: it stands where its next pass will start
            info = get_worker_info()
            worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
            # A loaded state not yet read from is where this reader stands: torchdata asks a resumed worker for
            # its state before its first sample and keeps the answer until the worker sends a batch. (Answering
            # "the epoch's start" made a worker that sent nothing before the next checkpoint read its share
            # again.) Another reader's state is returned as it is; reading refuses it, with the reason.
            resumed = self._saved_state_for(self.epoch, worker_id, num_workers, check=False)
            if resumed is not None and resumed["kind"] == "reader":
                return dict(resumed)
            reader, stream = self._reader_start(self.epoch, worker_id, num_workers, resumed)
            if resumed is None:
                stream = None  # a fresh start: no stream to describe
        return {"version": STATE_VERSION, "kind": "reader", **reader,
                "stream": None if stream is None else stream.state()}

    def load_state_dict(self, state: dict) -> None:
        """Make the next pass over the state's epoch go on where ``state`` was taken.

        ``state`` is a reader's :meth:`state_dict` (what ``StatefulDataLoader`` hands each
        worker when it resumes with the same worker count), or a whole epoch's state from
        :func:`packlab.resume.epoch_state`, which works with any number of workers and ranks.
        In the main process this also sets the epoch to the state's.
        """
        if state.get("kind") not in ("reader", "epoch"):
            raise ResumeError(f"not a TarShardDataset state (keys {sorted(state)[:6]}): pass what state_dict() or "
                              "packlab.resume.epoch_state returned")
        if state.get("version") != STATE_VERSION:
            raise ResumeError(f"this state has layout version {state.get('version')}, this packlab reads version "
                              f"{STATE_VERSION} (byte offsets were added in version 2): resume with the packlab that "
                              "saved it, or start the epoch again")
        if state["kind"] == "reader" and state["seed"] != self.seed:
            raise ResumeError(f"the state was saved with seed={state['seed']}, this dataset has seed={self.seed}")
        self._saved_state = state
        if get_worker_info() is None and state["epoch"] != self.epoch:
            self.set_epoch(state["epoch"])

    def _take_saved_state(self, epoch: int, worker_id: int, num_workers: int) -> dict | None:
        """The state this pass resumes from (None: start the epoch afresh); a reader state is used once."""
        state = self._saved_state_for(epoch, worker_id, num_workers)
        if state is not None and state["kind"] == "reader":
            self._saved_state = None  # used once: the next pass of this process starts its epoch afresh
        return state

    def _saved_state_for(self, epoch: int, worker_id: int, num_workers: int, check: bool = True) -> dict | None:
        """The loaded state reader ``worker_id`` of ``num_workers`` would resume from now; changes nothing.

        A reader's own state, or a whole epoch's state when the layout differs from the one it
        was saved with (the reader then takes its part of what is left); None: the epoch afresh.
        A reader state of another reader raises :class:`ResumeError`, unless ``check`` is False.
        """
        state = getattr(self, "_saved_state", None)
        if state is None or state["epoch"] != epoch:
            return None
        if state["kind"] == "epoch":
            readers = state["readers"]
            same_layout = all(r["num_workers"] == num_workers and r["world_size"] == self.world_size for r in readers)
            if not same_layout:
                return state
            state = next(r for r in readers if r["rank"] == self.rank and r["worker_id"] == worker_id)
        elif check and (state["worker_id"], state["num_workers"], state["rank"], state["world_size"]) != (
                worker_id, num_workers, self.rank, self.world_size):
            raise ResumeError(
                f"this state belongs to worker {state['worker_id']} of {state['num_workers']} on rank "
                f"{state['rank']} of {state['world_size']}, not to worker {worker_id} of {num_workers} on rank "
                f"{self.rank} of {self.world_size}: to resume with another layout, load "
                "packlab.resume.epoch_state(saved loader states) into the dataset"
            )
        return state

    def __getstate__(self) -> dict:
        """Pickled for spawn workers without this process's open stream (a generator holds open shards)."""
        state = self.__dict__.copy()
        state.pop("_stream", None)
        state.pop("_reader", None)
        return state

    def _order_depends_on_epoch(self) -> bool:
        return self.shuffle_shards or self.shuffle_buffer > 1 or self.epoch_length is not None

    def __repr__(self) -> str:
        return (
            f"TarShardDataset({len(self.shards)} shards, rank {self.rank}/{self.world_size}, "
            f"shuffle_buffer={self.shuffle_buffer}, epoch={self.epoch})"
        )

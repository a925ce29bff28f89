"""Retry a remote shard that failed part-way, without delivering any sample twice.

A local disk either has a file or not. An object store or a web server can stop
answering in the middle of a shard: the server restarts, a connection is reset, a read
times out. For a training run of hours that is a normal event, and the right reaction is
to wait a little and try again. For a stream of samples the question is *where* to start
again, and the answer must keep "exactly once per epoch": the first part of the shard
has already gone downstream (into the shuffle buffer, or out in a batch).

* **Where the last delivered sample ended.** Reading counts the shard's bytes, so after
  each sample the reader knows the byte at which the next sample's tar headers begin: a
  place where a tar stream can start. An opener that can open a shard from a byte offset
  (:meth:`packlab.objectstore.S3ShardOpener.open_from`, an HTTP ``Range: bytes=N-``
  request; :class:`LocalRangeOpener` for files) resumes there, and the retry costs at
  most the part of one sample that had arrived: a 1–10 GB shard is not read again from
  its start. The request names the object's version (its ETag, ``If-Match``), so a shard
  replaced in between fails instead of being spliced.
* **The shard, from its start**, with any other opener: a new request for the whole
  shard, whose first samples are read again and *dropped*, checking on the way that they
  are the same keys in the same order.

:func:`iter_shard_samples_resuming` does both, at sample granularity. Only failures of the
*transport* are retried, :class:`ShardReadError`: a shard that is damaged (a bad
checksum, a missing file) fails the same way on every attempt and is reported at once.
The waits between attempts grow (:class:`RetryPolicy`), and when the attempts are used
up the error names the shard, how many attempts were made over how long, and how far the
shard got.

:class:`RetryingTarShardDataset` is :class:`~packlab.loaders.tar.TarShardDataset` reading
every shard this way; ``dataset.retries`` counts the retries of all its DataLoader
workers and ``dataset.bytes_not_reread`` the bytes that resuming saved (shared-memory
counters, as ``dataset.skipped`` in :mod:`packlab.loaders.skipping`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import torch
from torch.utils.data import get_worker_info

from packlab.loaders.tar import (
    RawSample,
    ShardError,
    ShardOpener,
    TarShardDataset,
    group_samples,
    iter_tar_members,
    open_shard,
)

#: How many DataLoader workers a retry counter has rows for.
MAX_WORKERS = 64


class ShardReadError(ShardError):
    """Opening or reading a shard failed for a reason outside the shard: the connection or the server.

    Raised by remote openers (:class:`packlab.objectstore.S3ShardOpener`) for connection
    errors, timeouts, server errors (HTTP 5xx) and responses cut short. Trying again later
    may succeed; :func:`iter_shard_samples_resuming` does.
    """


class ShardRetryWarning(UserWarning):
    """A shard failed part-way and is being read again (the message says which, why, and after how many samples)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often, and after how long, to try a failing shard again.

    ``attempts`` counts every try, the first one included (``attempts=1``: never retry).
    The wait before retry *n* (1, 2, ...) is ``backoff_s * 2 ** (n - 1)``, at most
    ``max_backoff_s``: short for a blip, longer for a server that is restarting. The
    defaults wait 1 + 2 + 4 + 8 + 16 = 31 s in all before giving up: long enough for a
    server restart, short enough that a dead server ends the run with an error within a
    minute. Only exceptions of the types in ``retry_on`` are retried.
    """

    attempts: int = 6
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    retry_on: tuple[type[BaseException], ...] = (ShardReadError,)

    def __post_init__(self):
        if self.attempts < 1:
            raise ValueError("attempts counts the first try too: it must be at least 1")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("waits cannot be negative")

    def wait_before(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        return min(self.backoff_s * 2 ** (retry - 1), self.max_backoff_s)

    def total_wait(self) -> float:
        """Seconds spent waiting in all, when every attempt fails."""
        return sum(self.wait_before(n) for n in range(1, self.attempts))


class LocalRangeOpener(ShardOpener):
    """An ``opener=`` for local shard files that can also open one from a byte offset (``open_from``).

    What :meth:`packlab.objectstore.S3ShardOpener.open_from` does with a ranged ``GET``,
    done with a ``seek``: for tests, and for shards on a filesystem that can fail
    part-way (a network mount). It is :class:`packlab.loaders.tar.ShardOpener`, the
    default opener of ``TarShardDataset``, under the name this module has always used.
    """


class _CountedStream:
    """A stream that counts the bytes read from it (the tar reader only reads and closes)."""

    def __init__(self, stream: BinaryIO):
        self.stream = stream
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        chunk = self.stream.read(size)
        self.count += len(chunk)
        return chunk

    def close(self) -> None:
        self.stream.close()


def samples_with_resume_points(stream: BinaryIO, shard: str, start: int = 0) -> Iterator[tuple[RawSample, int | None]]:
    """``(sample, byte where the next sample begins)`` for each sample of a tar stream that begins at byte ``start``.

    The second value is a place where a tar stream can start again (the first header of
    the next sample's members, long-name and pax headers included), counted from the
    shard's first byte; ``None`` after the last sample. :func:`group_samples` knows a
    sample is complete when it has read the first member of the next one, so the offset
    recorded for that member is exactly the next sample's start.
    """
    counted = _CountedStream(stream)
    begins = [start]  # where the member group_samples read last begins
    finished = []

    def members():
        begin = start
        for name, payload in iter_tar_members(counted, shard):
            begins.append(begin)
            begin = start + counted.count  # this member ends here, the next one's headers begin here
            yield name, payload
        finished.append(True)

    for sample in group_samples(members(), shard):
        yield sample, None if finished else begins[-1]


def iter_shard_samples_resuming(
    shard: str,
    opener: Callable[[str], BinaryIO] = open_shard,
    policy: RetryPolicy = RetryPolicy(),
    on_retry: Callable[..., None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[RawSample]:
    """The samples of one shard, each exactly once, opening the shard again if the transport fails.

    After each delivered sample it remembers the byte where the next one begins. When
    reading fails with one of ``policy.retry_on``, it waits, then, if ``opener`` has an
    ``open_from(shard, offset, etag)`` method (S3, :class:`LocalRangeOpener`), resumes at
    that byte; otherwise it opens the shard again from its start and drops the samples it
    delivered already (checking they are the same keys, in the same order: the shard must
    not have changed in between). Compressed shards always start again from the start.
    Any other error, and the last failed attempt, raise. ``on_retry(shard, error,
    delivered, wait_s, resume_at)`` is called before each wait (for counting or logging;
    ``resume_at`` is the byte the next attempt starts from).
    """
    delivered: list[str] = []  # keys of this shard already yielded, in order
    seen: set[str] = set()
    resume_at = 0  # the byte where the first sample not yet delivered begins
    etag = None  # the object's version, from the first response that named one
    ranged = hasattr(opener, "open_from") and not shard.endswith((".gz", ".tgz"))
    failures = 0
    waited = 0.0
    while True:
        from_middle = ranged and resume_at > 0
        position = 0  # samples read in this attempt
        to_drop = 0 if from_middle else len(delivered)
        stream = None
        try:
            stream = opener.open_from(shard, resume_at, etag) if from_middle else opener(shard)
            etag = etag or getattr(stream, "etag", None)
            for sample, next_begins in samples_with_resume_points(stream, shard, resume_at if from_middle else 0):
                if position < to_drop:
                    if sample.key != delivered[position]:
                        raise ShardError(
                            f"shard {shard} changed between two attempts: sample {position} was {delivered[position]} "
                            f"and is now {sample.key}. A shard must not be rewritten while a job reads it."
                        )
                    position += 1
                    continue  # delivered before the failure: drop it
                if sample.key in seen:
                    raise ShardError(
                        f"shard {shard} resumed at byte {resume_at:,} delivered {sample.key} a second time: the shard "
                        "changed between two attempts. A shard must not be rewritten while a job reads it."
                    )
                delivered.append(sample.key)
                seen.add(sample.key)
                position += 1
                if next_begins is not None:
                    resume_at = next_begins
                yield sample
            if not delivered:
                raise ShardError(f"shard {shard} holds no samples (no .jpg + .cls pairs)")
            return
        except policy.retry_on as exc:
            failures += 1
            if failures >= policy.attempts:
                where = "" if shard in str(exc) else f" (shard {shard})"
                raise ShardReadError(
                    f"{exc}{where} Gave up after {failures} attempts and {waited:.0f} s of waiting; "
                    f"{len(delivered)} samples of this shard had been delivered."
                ) from None
            wait = policy.wait_before(failures)
            if on_retry is not None:
                on_retry(shard, exc, len(delivered), wait, resume_at if ranged else 0)
            sleep(wait)
            waited += wait
        finally:
            if stream is not None:
                stream.close()


class RetryCounter:
    """Retries, and the bytes resuming did not read again, over the main process and every DataLoader worker.

    Shared memory, one row per process (row 0 the main process, row ``1 + i`` worker ``i``).
    """

    def __init__(self, max_workers: int = MAX_WORKERS):
        self._counts = torch.zeros(max_workers + 1, 2, dtype=torch.int64).share_memory_()

    def add(self, bytes_not_reread: int = 0) -> None:
        info = get_worker_info()
        row = self._counts[0 if info is None else min(info.id + 1, len(self._counts) - 1)]
        row[0] += 1
        row[1] += bytes_not_reread

    @property
    def total(self) -> int:
        return int(self._counts[:, 0].sum())

    @property
    def bytes_not_reread(self) -> int:
        return int(self._counts[:, 1].sum())

    def reset(self) -> None:
        self._counts.zero_()


class RetryingTarShardDataset(TarShardDataset):
    """:class:`~packlab.loaders.tar.TarShardDataset` that retries shards whose transport fails.

    Takes every argument of ``TarShardDataset`` and ``retry=RetryPolicy(...)``. Each shard
    is read with :func:`iter_shard_samples_resuming`: a connection lost part-way through a
    shard costs a wait and a new request (from where the last delivered sample ended, when
    the opener can open from an offset), never a lost or repeated sample.
    Each retry is announced with a :class:`ShardRetryWarning` and counted in
    :attr:`retries`. Skip mode (``on_bad_sample="skip"``) reads as ``TarShardDataset``
    does, without retries: a transport error there would be taken for a damaged shard.
    """

    def __init__(self, shards, *, retry: RetryPolicy = RetryPolicy(), **options):
        super().__init__(shards, **options)
        if self.skipping:
            raise ValueError("RetryingTarShardDataset retries in on_bad_sample='raise' mode only")
        self.retry = retry
        self.retry_counter = RetryCounter()

    @property
    def retries(self) -> int:
        """Shard retries so far, in the main process and every DataLoader worker."""
        return self.retry_counter.total

    @property
    def bytes_not_reread(self) -> int:
        """Bytes the retries did not have to read again, because they resumed where a sample ended."""
        return self.retry_counter.bytes_not_reread

    def _count_retry(self, shard: str, error: BaseException, delivered: int, wait: float, resume_at: int) -> None:
        self.retry_counter.add(resume_at)
        where = (f"from byte {resume_at:,}, after its {delivered} delivered samples" if resume_at else
                 f"from its start; its first {delivered} samples were delivered already and will be skipped")
        warnings.warn(ShardRetryWarning(f"{error} -- retrying shard {shard} in {wait:.0f} s, {where}."), stacklevel=2)

    def _shard_samples(self, shard: str) -> Iterator[RawSample]:
        return iter_shard_samples_resuming(shard, self.opener, self.retry, on_retry=self._count_retry)

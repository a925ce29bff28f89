"""Retry a remote shard that failed part-way, without delivering any sample twice.

A local disk either has a file or not. An object store or a web server can stop
answering in the middle of a shard: the server restarts, a connection is reset, a read
times out. For a training run of hours that is a normal event, and the right reaction is
to wait a little and try again. For a stream of samples the question is *what* to try
again:

* **bytes** (an HTTP range request from the byte where the connection broke) needs a
  reader that can pick up a tar stream in the middle of a member;
* **the shard, from its start** needs only a new GET of the same object, and works with
  every opener. But the first part of the shard has already gone downstream (into the
  shuffle buffer, or out in a batch). Delivering it again would break "exactly once per
  epoch"; so the retry *re-reads and drops* the samples this shard already delivered,
  and checks on the way that they are the same keys in the same order.

This module does the second, at shard granularity (:func:`iter_shard_samples_resuming`).
Only failures of the *transport* are retried, :class:`ShardReadError`: a shard that is
damaged (a bad checksum, a missing file) fails the same way on every attempt and is
reported at once. The waits between attempts grow (:class:`RetryPolicy`), and when the
attempts are used up the error names the shard, how many attempts were made over how
long, and how far the shard got.

:class:`RetryingTarShardDataset` is :class:`~packlab.loaders.tar.TarShardDataset` reading
every shard this way; ``dataset.retries`` counts the retries of all its DataLoader
workers (a shared-memory counter, as ``dataset.skipped`` in
:mod:`packlab.loaders.skipping`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import torch
from torch.utils.data import get_worker_info

from packlab.loaders.tar import RawSample, ShardError, TarShardDataset, iter_shard_samples, open_shard

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


def iter_shard_samples_resuming(
    shard: str,
    opener: Callable[[str], BinaryIO] = open_shard,
    policy: RetryPolicy = RetryPolicy(),
    on_retry: Callable[[str, BaseException, int, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[RawSample]:
    """The samples of one shard, each exactly once, reading the shard again if the transport fails.

    Keeps the keys this shard has delivered so far. When reading fails with one of
    ``policy.retry_on`` after *k* samples, it waits, opens the shard again from its start,
    drops the first *k* samples it reads again (checking they are the same keys, in the
    same order: the shard must not have changed in between) and goes on with sample
    *k + 1*. Any other error, and the last failed attempt, raise. ``on_retry(shard, error,
    delivered, wait_s)`` is called before each wait (for counting or logging).
    """
    delivered: list[str] = []  # keys of this shard already yielded, in order
    failures = 0
    waited = 0.0
    while True:
        position = 0  # samples read in this attempt
        try:
            for sample in iter_shard_samples(shard, opener):
                if position < len(delivered):
                    if sample.key != delivered[position]:
                        raise ShardError(
                            f"shard {shard} changed between two attempts: sample {position} was {delivered[position]} "
                            f"and is now {sample.key}. A shard must not be rewritten while a job reads it."
                        )
                    position += 1
                    continue  # delivered before the failure: drop it
                delivered.append(sample.key)
                position += 1
                yield sample
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
                on_retry(shard, exc, len(delivered), wait)
            sleep(wait)
            waited += wait


class RetryCounter:
    """Retries counted over the main process and every DataLoader worker (shared memory, one row each)."""

    def __init__(self, max_workers: int = MAX_WORKERS):
        self._counts = torch.zeros(max_workers + 1, dtype=torch.int64).share_memory_()

    def add(self) -> None:
        info = get_worker_info()
        self._counts[0 if info is None else min(info.id + 1, len(self._counts) - 1)] += 1

    @property
    def total(self) -> int:
        return int(self._counts.sum())

    def reset(self) -> None:
        self._counts.zero_()


class RetryingTarShardDataset(TarShardDataset):
    """:class:`~packlab.loaders.tar.TarShardDataset` that retries shards whose transport fails.

    Takes every argument of ``TarShardDataset`` and ``retry=RetryPolicy(...)``. Each shard
    is read with :func:`iter_shard_samples_resuming`: a connection lost part-way through a
    shard costs a wait and a second read of that shard, never a lost or repeated sample.
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

    def _count_retry(self, shard: str, error: BaseException, delivered: int, wait: float) -> None:
        self.retry_counter.add()
        warnings.warn(
            ShardRetryWarning(
                f"{error} -- retrying shard {shard} from its start in {wait:.0f} s; "
                f"its first {delivered} samples were delivered already and will be skipped."
            ),
            stacklevel=2,
        )

    def _shard_samples(self, shard: str) -> Iterator[RawSample]:
        return iter_shard_samples_resuming(shard, self.opener, self.retry, on_retry=self._count_retry)

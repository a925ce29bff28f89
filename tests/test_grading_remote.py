"""Exercise 9's check can fail: wrong retry loops fail the part that names their mistake; right ones pass.

Each function is a ``resuming_samples(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep)``
someone might write. The solution must score full marks and the untouched stub zero
(``tests/test_exercises.py`` checks both for every exercise); here, every wrong version
fails exactly the parts it deserves, and versions written differently from the solution
pass every part.
"""

from __future__ import annotations

import time

import pytest

from packlab.course.grading import check
from packlab.loaders.tar import ShardError, iter_shard_samples
from packlab.retry import ShardReadError

ALL_PARTS = {"reads_once", "resumes", "several_breaks", "gives_up", "waits", "damage_not_retried"}


def failed_parts(candidate) -> set[str]:
    result = check("resuming_shards", candidate, quiet=True, record=False)
    return {part.name for part in result.parts if not part.passed}


# ------------------------------------------------------------------ wrong


def restarts_and_repeats(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Reads the shard again from its start and yields everything again."""
    for attempt in range(1, attempts + 1):
        try:
            yield from iter_shard_samples(shard, opener)
            return
        except ShardReadError:
            if attempt == attempts:
                raise
            sleep(wait_s * 2 ** (attempt - 1))


def never_retries(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """The first broken connection ends the shard (and the epoch)."""
    yield from iter_shard_samples(shard, opener)


def skips_only_the_last_attempts_samples(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Skips what the *previous* attempt yielded, forgetting the attempts before it."""
    previous = 0
    for attempt in range(1, attempts + 1):
        this_attempt = 0
        try:
            for position, sample in enumerate(iter_shard_samples(shard, opener)):
                if position < previous:
                    continue
                this_attempt += 1
                yield sample
            return
        except ShardReadError:
            if attempt == attempts:
                raise
            previous = this_attempt
            sleep(wait_s * 2 ** (attempt - 1))


def retries_forever(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Ignores ``attempts``: a server that never comes back hangs the run."""
    delivered, failures = 0, 0
    while True:
        try:
            for position, sample in enumerate(iter_shard_samples(shard, opener)):
                if position >= delivered:
                    delivered += 1
                    yield sample
            return
        except ShardReadError:
            failures += 1
            sleep(wait_s * 2 ** (failures - 1))


def gives_up_quietly(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """After the last attempt, returns as if the shard had ended: the rest of it goes missing unnoticed."""
    delivered = 0
    for attempt in range(1, attempts + 1):
        try:
            for position, sample in enumerate(iter_shard_samples(shard, opener)):
                if position >= delivered:
                    delivered += 1
                    yield sample
            return
        except ShardReadError:
            if attempt < attempts:
                sleep(wait_s * 2 ** (attempt - 1))


def never_waits(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Retries at once: a restarting server gets hammered, and the attempts are used up in milliseconds."""
    delivered = 0
    for attempt in range(1, attempts + 1):
        try:
            for position, sample in enumerate(iter_shard_samples(shard, opener)):
                if position >= delivered:
                    delivered += 1
                    yield sample
            return
        except ShardReadError:
            if attempt == attempts:
                raise


def retries_damage_too(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Catches every ShardError, so a damaged shard is read ``attempts`` times before it fails."""
    delivered = 0
    for attempt in range(1, attempts + 1):
        try:
            for position, sample in enumerate(iter_shard_samples(shard, opener)):
                if position >= delivered:
                    delivered += 1
                    yield sample
            return
        except ShardError:
            if attempt == attempts:
                raise
            sleep(wait_s * 2 ** (attempt - 1))


@pytest.mark.parametrize(
    "candidate, expected",
    [
        (restarts_and_repeats, {"resumes", "several_breaks", "gives_up"}),
        (never_retries, {"resumes", "several_breaks", "gives_up", "waits"}),
        (skips_only_the_last_attempts_samples, {"several_breaks", "gives_up"}),  # repeats when breaking thrice too
        (retries_forever, {"gives_up"}),
        (gives_up_quietly, {"gives_up"}),
        (never_waits, {"waits"}),
        (retries_damage_too, {"damage_not_retried"}),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_a_wrong_retry_loop_fails_the_parts_that_name_its_mistake(candidate, expected):
    assert failed_parts(candidate) == expected


# ------------------------------------------------------------------ right, written differently


def by_keys(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Remembers the keys it yielded rather than counting them (keys are unique within a shard)."""
    seen = set()
    failures = 0
    while True:
        try:
            for sample in iter_shard_samples(shard, opener):
                if sample.key not in seen:
                    seen.add(sample.key)
                    yield sample
            return
        except ShardReadError:
            failures += 1
            if failures >= attempts:
                raise
            sleep(wait_s * 2 ** (failures - 1))


class ResumingSamples:
    """An iterator object instead of a generator function, re-opening lazily in ``__next__``."""

    def __init__(self, shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
        self.shard, self.opener, self.attempts, self.wait_s, self.sleep = shard, opener, attempts, wait_s, sleep
        self.delivered, self.failures, self.stream = 0, 0, None

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self.stream is None:
                self.stream, self.position = iter_shard_samples(self.shard, self.opener), 0
            try:
                sample = next(self.stream)
            except ShardReadError:
                self.failures += 1
                self.stream = None
                if self.failures >= self.attempts:
                    raise
                self.sleep(self.wait_s * 2 ** (self.failures - 1))
                continue
            self.position += 1
            if self.position > self.delivered:
                self.delivered += 1
                return sample


@pytest.mark.parametrize("candidate", [by_keys, ResumingSamples], ids=lambda c: c.__name__)
def test_a_right_retry_loop_written_differently_passes_every_part(candidate):
    assert failed_parts(candidate) == set()

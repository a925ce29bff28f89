"""Exercise 9's check can fail: wrong retry loops fail the part that names their mistake; right ones pass.

Each function is a ``resuming_samples(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep)``
someone might write, with one mistake: one promise of the exercise's text broken, each
shown wrong below by evidence outside the grader (``test_the_mistakes_are_real``). The
solution must score full marks and the untouched stub zero (``tests/test_exercises.py``
checks both for every exercise); here every wrong version fails exactly the parts it
deserves, and versions written differently from the solution pass every part.
"""

from __future__ import annotations

import io
import itertools
import time

import pytest

from packlab.loaders.tar import ShardError, iter_shard_samples
from packlab.retry import RetryPolicy, ShardReadError, iter_shard_samples_resuming

from grading_support import Failed, failed_parts as run_check

ALL_PARTS = {"reads_once", "resumes", "several_breaks", "gives_up", "waits", "damage_not_retried"}


def failed_parts(candidate) -> Failed:
    failed = run_check("resuming_shards", candidate)
    assert set(failed.parts) == ALL_PARTS
    return failed


def _resuming(shard, opener, attempts, wait_s, sleep, *, catch=ShardReadError, wait=None, skip=lambda n: n,
              wait_first=False, wait_last=False, raise_last=True):
    """The right loop with its pieces replaceable: what to catch, how long to wait, how many to skip."""
    wait = wait or (lambda failures: wait_s * 2 ** (failures - 1))
    delivered = 0
    if wait_first:
        sleep(wait_s)
    for attempt in range(1, attempts + 1):
        skipped = skip(delivered)  # decided when the attempt starts
        try:
            for position, sample in enumerate(iter_shard_samples(shard, opener)):
                if position < skipped:
                    continue
                delivered += 1
                yield sample
            return
        except catch:
            if attempt == attempts:
                if wait_last:
                    sleep(wait(attempt))
                if raise_last:
                    raise
                return
            sleep(wait(attempt))


# ------------------------------------------------------------------ wrong


def restarts_and_repeats(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Reads the shard again from its start and yields everything again."""
    yield from _resuming(shard, opener, attempts, wait_s, sleep, skip=lambda n: 0)


def never_retries(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """The first broken connection ends the shard (and the epoch)."""
    yield from iter_shard_samples(shard, opener)


def skips_one_too_many(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Off by one when resuming: skips the sample after the last one it yielded, too."""
    yield from _resuming(shard, opener, attempts, wait_s, sleep, skip=lambda n: n + 1 if n else 0)


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
    yield from _resuming(shard, opener, 10**9, wait_s, sleep)


def four_attempts_whatever_asked(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Ignores the ``attempts`` it is given and always tries the default four times."""
    yield from _resuming(shard, opener, 4, wait_s, sleep)


def one_attempt_too_many(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Counts retries where the text counts attempts: ``attempts`` retries after the first read."""
    yield from _resuming(shard, opener, attempts + 1, wait_s, sleep)


def gives_up_quietly(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """After the last attempt, returns as if the shard had ended: the rest of it goes missing unnoticed."""
    yield from _resuming(shard, opener, attempts, wait_s, sleep, raise_last=False)


def gives_up_with_its_own_error(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Gives up with a RuntimeError of its own, which a caller catching ShardReadError will not recognise."""
    try:
        yield from _resuming(shard, opener, attempts, wait_s, sleep)
    except ShardReadError:
        raise RuntimeError("gave up: too many failures") from None


def never_waits(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Retries at once: a restarting server gets hammered, and the attempts are used up in milliseconds."""
    yield from _resuming(shard, opener, attempts, wait_s, lambda seconds: None)


def linear_backoff(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Waits wait_s, 2 wait_s, 3 wait_s: the same as doubling for two retries, not for three."""
    yield from _resuming(shard, opener, attempts, wait_s, sleep, wait=lambda failures: wait_s * failures)


def constant_wait(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Waits wait_s before every retry."""
    yield from _resuming(shard, opener, attempts, wait_s, sleep, wait=lambda failures: wait_s)


def waits_after_the_last_attempt(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Sleeps once more after the last failure, before raising: time lost for nothing."""
    yield from _resuming(shard, opener, attempts, wait_s, sleep, wait_last=True)


def waits_before_the_first_read(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Sleeps before every attempt, the first read included."""
    yield from _resuming(shard, opener, attempts, wait_s, sleep, wait_first=True)


def time_sleep_not_the_argument(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Calls time.sleep itself instead of the ``sleep`` it was given (scaled down here, to keep the test short)."""
    yield from _resuming(shard, opener, attempts, wait_s, lambda seconds: time.sleep(seconds / 100))


def retries_damage_too(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Catches every ShardError, so a damaged shard is read ``attempts`` times before it fails."""
    yield from _resuming(shard, opener, attempts, wait_s, sleep, catch=ShardError)


def retries_everything(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Catches Exception: any error at all is retried."""
    yield from _resuming(shard, opener, attempts, wait_s, sleep, catch=Exception)


WRONG = {
    restarts_and_repeats: {"resumes", "several_breaks", "gives_up"},
    never_retries: {"resumes", "several_breaks", "gives_up", "waits"},
    skips_one_too_many: {"resumes", "several_breaks"},
    skips_only_the_last_attempts_samples: {"several_breaks", "gives_up"},  # repeats when breaking thrice too
    retries_forever: {"gives_up", "waits"},
    four_attempts_whatever_asked: {"several_breaks", "gives_up", "waits"},
    one_attempt_too_many: {"gives_up", "waits"},
    gives_up_quietly: {"gives_up"},
    gives_up_with_its_own_error: {"gives_up"},
    never_waits: {"waits"},
    linear_backoff: {"waits"},
    constant_wait: {"waits"},
    waits_after_the_last_attempt: {"waits"},
    waits_before_the_first_read: {"waits"},
    time_sleep_not_the_argument: {"waits"},
    retries_damage_too: {"damage_not_retried"},
    retries_everything: {"damage_not_retried"},
}


@pytest.mark.parametrize("candidate", WRONG, ids=lambda c: c.__name__)
def test_a_wrong_retry_loop_fails_the_parts_that_name_its_mistake(candidate):
    assert failed_parts(candidate) == WRONG[candidate]


# ------------------------------------------------------- evidence outside the grader


class _Flaky:
    """An opener for one local shard whose first ``breaks`` opens reset after ``cut`` bytes; it counts opens."""

    def __init__(self, shard, breaks, damaged=False):
        self.data = bytearray(open(shard, "rb").read())
        cut = len(self.data) * 6 // 10  # past the middle of the shard
        if damaged:
            self.data[1024 + 100] ^= 0xFF
        self.breaks, self.cut, self.opens = breaks, cut, 0

    def __call__(self, name):
        self.opens += 1
        stream = io.BytesIO(bytes(self.data))
        if self.opens > self.breaks:
            return stream
        cut = self.cut

        class Breaking(io.RawIOBase):
            def readable(self):
                return True

            def readinto(self, buffer):
                if stream.tell() + len(buffer) > cut:
                    raise ShardReadError(f"{name}: connection reset")
                chunk = stream.read(len(buffer))
                buffer[: len(chunk)] = chunk
                return len(chunk)

        return io.BufferedReader(Breaking())


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    from packlab import data, pack

    folder = tmp_path_factory.mktemp("shard")
    (path,) = pack.write_tar_shards(folder, samples=data.load_manifest()[:12], maxcount=12, progress=False)
    return str(path)


def _keys_and_error(candidate, opener, shard, **options):
    keys = []
    try:
        for sample in candidate(shard, opener, **options):
            keys.append(sample.key)
            if len(keys) > 100:
                break
    except Exception as exc:  # noqa: BLE001
        return keys, exc
    return keys, None


def test_the_mistakes_are_real(shard):
    """Each mistake, shown with a plain flaky opener and a list for `sleep`, outside the grader."""
    expected = [s.key for s in iter_shard_samples(shard)]
    once = lambda candidate, **o: _keys_and_error(candidate, _Flaky(shard, breaks=1), shard, sleep=[].append, **o)  # noqa: E731
    assert once(restarts_and_repeats)[0] != expected and len(once(restarts_and_repeats)[0]) > len(expected)
    lost_one = once(skips_one_too_many)[0]
    assert len(lost_one) == len(expected) - 1 and set(lost_one) < set(expected)
    assert isinstance(once(never_retries)[1], ShardReadError)
    for candidate, attempts, opens in ((one_attempt_too_many, 3, 4), (four_attempts_whatever_asked, 2, 4)):
        opener = _Flaky(shard, breaks=99)
        _keys_and_error(candidate, opener, shard, attempts=attempts, sleep=[].append)
        assert opener.opens == opens, candidate.__name__
    assert _keys_and_error(gives_up_quietly, _Flaky(shard, breaks=99), shard, attempts=2, sleep=[].append)[1] is None
    error = _keys_and_error(gives_up_with_its_own_error, _Flaky(shard, breaks=99), shard, attempts=2, sleep=[].append)[1]
    assert not isinstance(error, ShardReadError)
    for candidate, waits in ((linear_backoff, [1, 2, 3]), (constant_wait, [1, 1, 1]), (never_waits, []),
                             (waits_after_the_last_attempt, [1, 2, 4, 8]), (waits_before_the_first_read, [1, 1, 2, 4])):
        slept = []
        _keys_and_error(candidate, _Flaky(shard, breaks=99), shard, attempts=4, wait_s=1.0, sleep=slept.append)
        assert slept == waits, candidate.__name__
    for candidate in (retries_damage_too, retries_everything):
        opener = _Flaky(shard, breaks=0, damaged=True)
        _keys_and_error(candidate, opener, shard, attempts=3, sleep=[].append)
        assert opener.opens == 3, candidate.__name__
    with pytest.raises(ShardReadError):  # skips_only_the_last_attempts_samples: fine for one break...
        list(skips_only_the_last_attempts_samples(shard, _Flaky(shard, breaks=99), attempts=2, sleep=[].append))


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


def with_islice_and_a_doubling_wait(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """Skips with itertools.islice, doubles a running wait, and gives up with a new ShardReadError naming the shard."""
    delivered, wait = 0, wait_s
    for attempt in itertools.count(1):
        try:
            for sample in itertools.islice(iter_shard_samples(shard, opener), delivered, None):
                delivered += 1
                yield sample
            return
        except ShardReadError as exc:
            if attempt >= attempts:
                raise ShardReadError(f"giving up on {shard} after {attempt} attempts") from exc
            sleep(wait)
            wait *= 2


def with_the_course_policy(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep):
    """The course's own resuming reader, with a policy made of the arguments (and no cap on the wait)."""
    policy = RetryPolicy(attempts=attempts, backoff_s=wait_s, max_backoff_s=float("inf"))
    return iter_shard_samples_resuming(shard, opener, policy, sleep=sleep)


@pytest.mark.parametrize("candidate", [by_keys, ResumingSamples, with_islice_and_a_doubling_wait, with_the_course_policy],
                         ids=lambda c: c.__name__)
def test_a_right_retry_loop_written_differently_passes_every_part(candidate):
    assert failed_parts(candidate) == set()

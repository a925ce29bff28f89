"""Checks of exercise 9 (``09_resuming_shards``): retry a remote shard without repeating a sample.

The candidate is a generator function ``resuming_samples(shard, opener, attempts=4,
wait_s=1.0, sleep=time.sleep)``. The parts give it openers that break on purpose: each
open of the shard returns a stream that raises :class:`~packlab.retry.ShardReadError`
after a chosen number of bytes (as a connection reset part-way would), following a
schedule, and refuses to be opened more often than the schedule allows (so a candidate
that retries forever fails quickly instead of running into the part's time limit). The
candidate's ``sleep`` is replaced by a recorder, so no part waits for real.
"""

from __future__ import annotations

import io
from collections import Counter

from packlab.course.grading.core import Context, PartFailed, describe, register
from packlab.course.grading.fixtures import fixture_shards, subset
from packlab.loaders.tar import ShardError, iter_shard_samples
from packlab.retry import ShardReadError

#: Opens beyond the schedule the test opener allows before it calls the candidate endless.
_EXTRA_OPENS = 3


class _TooManyOpens(BaseException):
    """The candidate opened the shard far more often than its ``attempts`` allow.

    A ``BaseException``, so that a candidate catching ``Exception`` cannot swallow it and loop.
    """


class _ScheduledOpener:
    """An opener whose n-th stream breaks after ``cuts[n]`` bytes (``None``: it does not break)."""

    def __init__(self, path: str, cuts: list[int | None], repeat_last: bool = False):
        self.data = open(path, "rb").read()
        self.path, self.cuts, self.repeat_last = path, cuts, repeat_last
        self.opens = 0

    def __call__(self, name: str):
        if name != self.path:
            raise ShardError(f"cannot open shard {name}: this opener only serves {self.path}")
        self.opens += 1
        allowed = len(self.cuts) + _EXTRA_OPENS
        if self.opens > allowed:
            raise _TooManyOpens(f"the shard was opened {self.opens} times")
        index = self.opens - 1
        if index < len(self.cuts):
            cut = self.cuts[index]
        else:
            cut = self.cuts[-1] if self.repeat_last else None
        return _BreakingStream(self.data, cut, name)


class _BreakingStream(io.RawIOBase):
    """The shard's bytes, until ``cut`` of them have been read; then a simulated connection reset."""

    def __init__(self, data: bytes, cut: int | None, name: str):
        super().__init__()
        self.data, self.cut, self.name, self.position = data, cut, name, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        end = len(self.data) if size is None or size < 0 else self.position + size
        if self.cut is not None and end > self.cut:
            raise ShardReadError(
                f"reading shard {self.name} failed after {self.cut:,} bytes (connection reset, simulated)"
            )
        chunk = self.data[self.position : end]
        self.position += len(chunk)
        return chunk


def _fixtures() -> dict:
    shard = fixture_shards("resume-60-30", subset(60, seed=9), maxcount=30)[0]
    keys = [s.key for s in iter_shard_samples(str(shard))]
    return {"shard": str(shard), "keys": keys, "size": shard.stat().st_size}


def _run(ctx: Context, opener: _ScheduledOpener, **kwargs) -> tuple[list[str], BaseException | None, list[float]]:
    """Iterate the candidate; return the keys it yielded, the exception it ended with (or None), and the waits."""
    waits: list[float] = []
    keys: list[str] = []
    try:
        for sample in ctx.call(ctx.fixtures["shard"], opener, sleep=waits.append, **kwargs):
            keys.append(sample.key)
            if len(keys) > 10 * len(ctx.fixtures["keys"]):
                raise PartFailed(f"{len(keys)} samples from a shard of {len(ctx.fixtures['keys'])}: it never ends")
    except _TooManyOpens as exc:
        raise PartFailed(
            f"{exc} although attempts={kwargs.get('attempts', 4)}: the retries must stop after `attempts` tries"
        ) from None
    except PartFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - the part decides whether this error was expected
        return keys, exc, waits
    return keys, None, waits


def _exactly_once(ctx: Context, keys: list[str], what: str) -> None:
    expected = ctx.fixtures["keys"]
    repeated = sorted(k for k, n in Counter(keys).items() if n > 1)
    if repeated:
        raise PartFailed(
            f"{what}: {len(repeated)} samples were yielded twice (e.g. {repeated[0]}): the samples delivered "
            "before the failure must be skipped when the shard is read again"
        )
    if keys != expected:
        missing = [k for k in expected if k not in set(keys)]
        if missing:
            raise PartFailed(f"{what}: {len(missing)} of {len(expected)} samples never came (e.g. {missing[0]})")
        raise PartFailed(f"{what}: every sample came once, but not in the shard's order")


def _fraction(ctx: Context, f: float) -> int:
    return int(ctx.fixtures["size"] * f)


def _reads_once(ctx: Context) -> str:
    opener = _ScheduledOpener(ctx.fixtures["shard"], [None])
    keys, error, waits = _run(ctx, opener, attempts=4, wait_s=0.25)
    if error is not None:
        raise PartFailed(f"a shard that never breaks raised {describe(error)}")
    _exactly_once(ctx, keys, "a shard that never breaks")
    if opener.opens != 1 or waits:
        raise PartFailed(f"a shard that never breaks was opened {opener.opens} times and waited {waits}")
    return f"all {len(keys)} samples, in order, from one open"


def _resumes(ctx: Context) -> str:
    opener = _ScheduledOpener(ctx.fixtures["shard"], [_fraction(ctx, 0.45), None])
    keys, error, _ = _run(ctx, opener, attempts=4, wait_s=0.25)
    if error is not None:
        raise PartFailed(f"a shard that breaks once, half-way, raised {describe(error)} instead of being read again")
    _exactly_once(ctx, keys, "a shard that breaks once, half-way")
    if opener.opens != 2:
        raise PartFailed(f"a shard that breaks once should be opened twice, it was opened {opener.opens} times")
    return "broken half-way, read again from its start: every sample once, in order"


def _several_breaks(ctx: Context) -> str:
    # Before the first sample, then deeper, then less deep than the previous break, then through.
    cuts = [300, _fraction(ctx, 0.6), _fraction(ctx, 0.3), None]
    opener = _ScheduledOpener(ctx.fixtures["shard"], cuts)
    keys, error, _ = _run(ctx, opener, attempts=4, wait_s=0.25)
    if error is not None:
        raise PartFailed(f"a shard that breaks three times (attempts=4) raised {describe(error)}")
    _exactly_once(ctx, keys, "three breaks at different depths")
    return "three breaks, the last one earlier in the shard than the one before: still every sample once"


def _gives_up(ctx: Context) -> str:
    opener = _ScheduledOpener(ctx.fixtures["shard"], [_fraction(ctx, 0.4)] * 3, repeat_last=True)
    keys, error, _ = _run(ctx, opener, attempts=3, wait_s=0.25)
    if error is None:
        raise PartFailed(
            f"a shard that breaks on every attempt ended quietly after {len(keys)} of {len(ctx.fixtures['keys'])} "
            "samples: after the last attempt the error must reach the caller, or samples go missing unnoticed"
        )
    if not isinstance(error, ShardError) or ctx.fixtures["shard"] not in str(error):
        raise PartFailed(f"after the last attempt, expected the ShardReadError naming the shard; got {describe(error)}")
    if opener.opens != 3:
        raise PartFailed(f"attempts=3 should open the shard 3 times; it was opened {opener.opens} times")
    if len(keys) != len(set(keys)):
        raise PartFailed("samples were yielded twice before giving up")
    return "breaks every time: 3 attempts, then the error naming the shard"


def _waits(ctx: Context) -> str:
    opener = _ScheduledOpener(ctx.fixtures["shard"], [_fraction(ctx, 0.2), _fraction(ctx, 0.5), None])
    keys, error, waits = _run(ctx, opener, attempts=4, wait_s=0.25)
    if error is not None:
        raise PartFailed(f"a shard that breaks twice raised {describe(error)}")
    if waits != [0.25, 0.5]:
        raise PartFailed(
            f"two retries with wait_s=0.25 should wait [0.25, 0.5] (through the `sleep` argument); they waited {waits}"
        )
    return "waits wait_s, then twice that, before the retries"


def _damage_not_retried(ctx: Context) -> str:
    data = bytearray(open(ctx.fixtures["shard"], "rb").read())
    data[1024 + 100] ^= 0xFF  # the second member's header: its checksum no longer matches
    opens = []

    def damaged(name):
        opens.append(name)
        return io.BytesIO(bytes(data))

    waits: list[float] = []
    keys: list[str] = []
    try:
        for sample in ctx.call(ctx.fixtures["shard"], damaged, attempts=4, wait_s=0.25, sleep=waits.append):
            keys.append(sample.key)
    except ShardReadError as exc:
        raise PartFailed(f"the damaged shard should raise the reader's ShardError, got {describe(exc)}") from None
    except ShardError as exc:
        if len(opens) != 1 or waits:
            raise PartFailed(
                f"a damaged shard was opened {len(opens)} times (waits {waits}): damage is the same on every "
                "attempt, retry only ShardReadError"
            ) from None
        return f"a damaged shard raises at once ({str(exc)[:60]}...), without retries"
    except PartFailed:
        raise
    except Exception as exc:  # noqa: BLE001
        raise PartFailed(f"the damaged shard should raise ShardError, got {describe(exc)}") from None
    raise PartFailed("a shard with a damaged header was read without an error")


register(
    "resuming_shards",
    "09_resuming_shards",
    "read one remote shard, retrying it from its start when the connection breaks, never yielding a sample twice",
    "resuming_samples(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep): a generator of the shard's "
    "RawSamples (packlab.loaders.tar.iter_shard_samples), each exactly once; retries on ShardReadError only",
    _fixtures,
    [
        ("reads_once", "a shard that never breaks: every sample once, in order, one open, no wait",
         "iterate iter_shard_samples(shard, opener) and yield what it gives", _reads_once),
        ("resumes", "broken half-way once: the shard is read again and no sample is yielded twice",
         "count the samples you have yielded; on the next attempt skip that many before yielding again",
         _resumes),
        ("several_breaks", "three breaks at different depths: still every sample exactly once",
         "the count of samples already yielded covers every earlier attempt, not only the last one",
         _several_breaks),
        ("gives_up", "breaks every time: after `attempts` opens, the ShardReadError reaches the caller",
         "count the attempts; after the last one, re-raise the error instead of returning", _gives_up),
        ("waits", "waits wait_s, 2 x wait_s, 4 x wait_s, ... before the retries, through `sleep`",
         "call sleep(wait_s * 2 ** (failures - 1)) before each new attempt", _waits),
        ("damage_not_retried", "a damaged shard (ShardError that is not ShardReadError) raises at once",
         "catch ShardReadError only: except ShardReadError, not except ShardError or Exception",
         _damage_not_retried),
    ],
)

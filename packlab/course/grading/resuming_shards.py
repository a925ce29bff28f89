"""Checks of exercise 9 (``09_resuming_shards``): retry a remote shard without repeating a sample.

The candidate is a generator function ``resuming_samples(shard, opener, attempts=4,
wait_s=1.0, sleep=time.sleep)``. The parts give it openers that break on purpose: each
open of the shard returns a stream that raises :class:`~packlab.retry.ShardReadError`
after a chosen number of bytes (as a connection reset part-way would), following a
schedule, and refuses to be opened more often than the schedule allows (so a candidate
that retries forever fails quickly instead of running into the part's time limit). The
candidate's ``sleep`` is replaced by a recorder, so no part waits for real.

What one fixed input would hide, the parts vary: ``attempts`` and ``wait_s`` are never
the defaults (a candidate that ignores them gives itself away), the connection breaks
up to five times at different depths (the last break less deep than the one before;
one before the first sample), so three or more waits tell doubling from adding, and
the waits are also counted where nothing breaks and where every attempt breaks (none
before the first attempt, none after the last).
"""

from __future__ import annotations

import io
import math
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
        with open(path, "rb") as f:
            self.data = f.read()
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


def _fraction(ctx: Context, f: float) -> int:
    return int(ctx.fixtures["size"] * f)


#: The scenarios: when each open breaks (a fraction of the shard's bytes, a byte count, or
#: None: it does not), whether the last break repeats for ever, and the options passed.
#: ``attempts`` and ``wait_s`` are never the defaults (4 and 1.0).
SCENARIOS = {
    "never_breaks": dict(cuts=[None], attempts=3, wait_s=0.5),
    "breaks_once": dict(cuts=[0.45, None], attempts=3, wait_s=0.5),
    # Before the first sample, deeper, less deep than the previous break, deeper again, then through.
    "breaks_often": dict(cuts=[300, 0.6, 0.3, 0.8, 0.5, None], attempts=7, wait_s=0.1),
    "always_breaks": dict(cuts=[0.3, 0.5, 0.4, 0.6, 0.2], repeat_last=True, attempts=5, wait_s=0.3),
    "one_attempt": dict(cuts=[0.4], repeat_last=True, attempts=1, wait_s=0.3),
}


class _Outcome:
    """What the candidate did in one scenario: the keys it yielded, how it ended, the waits, the opens."""

    def __init__(self, keys, error, waits, opens, options):
        self.keys, self.error, self.waits, self.opens, self.options = keys, error, waits, opens, options


def _run(ctx: Context, scenario: str) -> _Outcome:
    """Run the candidate once per child on one scenario (parts share the outcome)."""
    key = ("scenario", scenario)
    if key in ctx.memo:
        return ctx.memo[key]
    spec = dict(SCENARIOS[scenario])
    cuts = [c if c is None or isinstance(c, int) else _fraction(ctx, c) for c in spec.pop("cuts")]
    opener = _ScheduledOpener(ctx.fixtures["shard"], cuts, spec.pop("repeat_last", False))
    waits: list[float] = []
    keys: list[str] = []
    error = None
    try:
        for sample in ctx.call(ctx.fixtures["shard"], opener, sleep=waits.append, **spec):
            keys.append(sample.key)
            if len(keys) > 10 * len(ctx.fixtures["keys"]):
                raise PartFailed(f"{len(keys)} samples from a shard of {len(ctx.fixtures['keys'])}: it never ends")
    except _TooManyOpens as exc:
        raise PartFailed(
            f"{exc} although attempts={spec['attempts']}: the retries must stop after `attempts` tries"
        ) from None
    except PartFailed:
        raise
    except Exception as exc:  # noqa: BLE001 - the part decides whether this error was expected
        error = exc
    ctx.memo[key] = _Outcome(keys, error, waits, opener.opens, spec)
    return ctx.memo[key]


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
            raise PartFailed(f"{what}: {len(missing)} of {len(expected)} samples never came (e.g. {missing[0]}): "
                             "skip exactly the samples already yielded, no more")
        raise PartFailed(f"{what}: every sample came once, but not in the shard's order")


def _completed(ctx: Context, scenario: str, what: str) -> _Outcome:
    """The outcome of a scenario that must end normally; an error fails the part, saying which."""
    outcome = _run(ctx, scenario)
    if outcome.error is not None:
        raise PartFailed(f"{what} (attempts={outcome.options['attempts']}) raised {describe(outcome.error)}"
                         + (" instead of being read again" if isinstance(outcome.error, ShardReadError) else ""))
    _exactly_once(ctx, outcome.keys, what)
    return outcome


def _reads_once(ctx: Context) -> str:
    outcome = _completed(ctx, "never_breaks", "a shard that never breaks")
    if outcome.opens != 1:
        raise PartFailed(f"a shard that never breaks was opened {outcome.opens} times: open it once")
    return f"all {len(outcome.keys)} samples, in order, from one open"


def _resumes(ctx: Context) -> str:
    outcome = _completed(ctx, "breaks_once", "a shard that breaks once, half-way")
    if outcome.opens != 2:
        raise PartFailed(f"a shard that breaks once should be opened twice, it was opened {outcome.opens} times")
    return "broken half-way, read again from its start: every sample once, in order"


def _several_breaks(ctx: Context) -> str:
    outcome = _completed(ctx, "breaks_often", "a shard that breaks five times at different depths")
    if outcome.opens != 6:
        raise PartFailed(f"a shard that breaks five times should be opened 6 times, it was opened {outcome.opens} times")
    return "five breaks, one before the first sample and some less deep than the one before: still every sample once"


def _gave_up_properly(ctx: Context, scenario: str) -> str:
    outcome = _run(ctx, scenario)
    attempts = outcome.options["attempts"]
    total = len(ctx.fixtures["keys"])
    if outcome.error is None:
        raise PartFailed(
            f"a shard that breaks on every attempt (attempts={attempts}) ended quietly after {len(outcome.keys)} of "
            f"{total} samples: after the last attempt the error must reach the caller, or samples go missing unnoticed"
        )
    if not isinstance(outcome.error, ShardReadError) or ctx.fixtures["shard"] not in str(outcome.error):
        raise PartFailed(
            f"after the last of attempts={attempts}, expected the ShardReadError naming the shard to reach the "
            f"caller; got {describe(outcome.error)}"
        )
    if outcome.opens != attempts:
        raise PartFailed(f"attempts={attempts} should open the shard {attempts} times in all (the first read "
                         f"included); it was opened {outcome.opens} times")
    if len(outcome.keys) != len(set(outcome.keys)):
        raise PartFailed("samples were yielded twice before giving up")
    return f"attempts={attempts}: {attempts} opens"


def _gives_up(ctx: Context) -> str:
    messages = [_gave_up_properly(ctx, "always_breaks"), _gave_up_properly(ctx, "one_attempt")]
    return f"breaks every time: {' and '.join(messages)}, then the ShardReadError naming the shard"


def _as_expected(waits: list[float], expected: list[float]) -> bool:
    return len(waits) == len(expected) and all(math.isclose(w, e, rel_tol=1e-6) for w, e in zip(waits, expected))


def _waits_wrong(waits: list, wait_s: float, retries: int, where: str) -> str:
    """What is wrong with ``waits``, where ``retries`` retries with ``wait_s`` should wait wait_s, 2 wait_s, ..."""
    expected = [wait_s * 2**n for n in range(retries)]
    shown = [round(w, 6) if isinstance(w, float) else w for w in waits]
    text = f"{where} with wait_s={wait_s} should wait {expected} (through the `sleep` argument); it waited {shown}"
    if not waits and retries:
        return text + ". Call sleep(...) before every retry: retrying at once hammers a server that is restarting"
    if len(waits) == retries + 1:
        return text + ". One wait too many: wait before each retry only, not before the first read or after the last"
    if len(waits) == retries and retries >= 2:
        if all(math.isclose(w, wait_s * (n + 1)) for n, w in enumerate(waits)):
            return text + ". That adds wait_s each time; the wait doubles: wait_s * 2 ** (retry - 1)"
        if all(math.isclose(w, wait_s) for w in waits):
            return text + ". The wait stays the same; it doubles before each further retry"
        if all(math.isclose(w, 2 * e) for w, e in zip(waits, expected)):
            return text + ". Each wait is twice too long: the first retry waits wait_s itself"
    return text


def _waits(ctx: Context) -> str:
    cases = [("breaks_often", 5, "five retries"), ("always_breaks", 4, "attempts=5, every one broken: four retries,"),
             ("never_breaks", 0, "a shard that never breaks"), ("one_attempt", 0, "attempts=1 (no retry)")]
    for scenario, retries, where in cases:
        outcome = _run(ctx, scenario)
        wait_s = outcome.options["wait_s"]
        if not _as_expected(outcome.waits, [wait_s * 2**n for n in range(retries)]):
            raise PartFailed(_waits_wrong(outcome.waits, wait_s, retries, where))
    return "waits wait_s, 2 x wait_s, 4 x wait_s, ... before each retry, and never otherwise"


def _damage_not_retried(ctx: Context) -> str:
    with open(ctx.fixtures["shard"], "rb") as f:
        data = bytearray(f.read())
    data[1024 + 100] ^= 0xFF  # the second member's header: its checksum no longer matches
    opens = []

    def damaged(name):
        opens.append(name)
        return io.BytesIO(bytes(data))

    waits: list[float] = []
    keys: list[str] = []
    try:
        for sample in ctx.call(ctx.fixtures["shard"], damaged, attempts=5, wait_s=0.3, sleep=waits.append):
            keys.append(sample.key)
    except ShardReadError as exc:
        raise PartFailed(f"the damaged shard should raise the reader's ShardError, got {describe(exc)}") from None
    except ShardError as exc:
        if len(opens) != 1:
            raise PartFailed(
                f"a damaged shard was opened {len(opens)} times (waits {waits}): damage is the same on every "
                "attempt, retry only ShardReadError"
            ) from None
        return f"a damaged shard raises at once ({str(exc)[:60]}...), without retries"
    except PartFailed:
        raise
    except Exception as exc:  # noqa: BLE001
        raise PartFailed(f"the damaged shard should raise the reader's ShardError, got {describe(exc)}") from None
    raise PartFailed("a shard with a damaged header was read without an error")


register(
    "resuming_shards",
    "09_resuming_shards",
    "read one remote shard, retrying it from its start when the connection breaks, never yielding a sample twice",
    "resuming_samples(shard, opener, attempts=4, wait_s=1.0, sleep=time.sleep): a generator of the shard's "
    "RawSamples (packlab.loaders.tar.iter_shard_samples), each exactly once; retries on ShardReadError only",
    _fixtures,
    [
        ("reads_once", "a shard that never breaks: every sample once, in order, one open",
         "iterate iter_shard_samples(shard, opener) and yield what it gives", _reads_once),
        ("resumes", "broken half-way once: the shard is read again and no sample is yielded twice",
         "count the samples you have yielded; on the next attempt skip that many before yielding again",
         _resumes),
        ("several_breaks", "five breaks at different depths: still every sample exactly once",
         "the count of samples already yielded covers every earlier attempt, not only the last one",
         _several_breaks),
        ("gives_up", "breaks every time: after `attempts` opens, the ShardReadError reaches the caller",
         "count the attempts (the first read is one); after the last one, re-raise the error instead of returning",
         _gives_up),
        ("waits", "waits wait_s, 2 x wait_s, 4 x wait_s, ... before each retry, through `sleep`, and at no other time",
         "call sleep(wait_s * 2 ** (failures - 1)) before each new attempt, not after the last failure", _waits),
        ("damage_not_retried", "a damaged shard (ShardError that is not ShardReadError) raises at once",
         "catch ShardReadError only: except ShardReadError, not except ShardError or Exception",
         _damage_not_retried),
    ],
)

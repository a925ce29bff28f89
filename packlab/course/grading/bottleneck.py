"""Checks of exercise 6 (``06_bottleneck``): measure the consumer before you tune the loader.

The candidate, ``find_bottleneck(loader, consume, repeats=6, threads=1)``, measures a
loader alone, a consumer alone and the two together, and says which one sets the pace.
The checks hand it a fake loader and a fake consumer whose speeds are known, because
they sleep for set times (a sleeping process uses no CPU). On a busy machine a sleep
lasts a little longer than asked, so the fakes also time each sleep, and the candidate's
rates are compared with what the fakes really did. Each scenario sets the traps a
careless measurement falls into:

* a loader that pauses before the first batch of every epoch (worker start-up), which
  both the loader alone and the two together must leave out, with epochs so short that
  counting the first batch's images shows;
* storage that is slow the first time each batch is read (a cold page cache): reading
  one batch before measuring warms one batch, not the epoch;
* a session whose torch thread count is neither 1, nor the machine's cores, nor the
  count asked for, which is neither of those either;
* a slow loader, which a consumer timed while loading would seem to share;
* runs that must take turns: the fakes log what was measured in which order (the loader
  alone, the consumer alone, the two together), and ``LLLCCCTTT`` is not ``LCTCTLTLC``;
* differences on which :func:`packlab.bench.compare` and simpler rules disagree: a
  loader and a consumer within about 2 % in every run (below its 5 % minimum, though the
  ranges may not touch), a loader whose runs alternate between fast and slow around a
  steady consumer (medians some 14 % apart, runs split evenly), and a clearly faster
  consumer with one slow run that falls among the loader's (ranges that touch, runs split
  clearly): the verdict must follow ``compare`` on the candidate's own runs, not its
  medians, its ranges or a ratio alone (:data:`TEMPTING_RULES`). Where noise on a busy
  machine blurred the difference a scenario was built to show, so that one of those rules
  happens to agree with ``compare`` on the runs of the scenario built to tell it apart,
  that scenario is measured again, up to :data:`EXTRA_ATTEMPTS` times.

``repeats`` is 6 (:data:`packlab.bench.ROUNDS`) in most scenarios and 5 in one, so that
a candidate that ignores it gives itself away. :data:`TIME_SCALE` shrinks every sleep
(the tests of the check use it to run wrong candidates faster); the checks run at 1.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import torch

from packlab import data
from packlab.bench import ROUNDS, chance_of_split, verdict
from packlab.course.grading.core import Context, PartFailed, register

#: Images in every fake batch.
BATCH = 32
#: Every time the fakes take is multiplied by this (tests of the check lower it; see the module docstring).
TIME_SCALE = 1.0


class _FakeLoader:
    """Batches of 32 at a known pace: ``startup`` s before each epoch's first batch, ``per_batch`` s per batch.

    The first read of each batch (by its position in the epoch) is ``cold_factor`` times
    slower, as a page cache that holds what was read once. ``alone_factors`` slow down the
    epochs nobody trains on (the loader measured alone), the k-th such epoch by
    ``alone_factors[k % len]``; whether anybody trains is known from the second batch on.
    ``in_epoch`` counts the epochs being read, so the fake consumer can tell training from
    other calls. ``passes`` logs what the candidate measured, in order: ``"L"`` an epoch
    read alone, ``"T"`` an epoch trained on, ``"C"`` the consumer called outside epochs.
    """

    def __init__(self, per_batch, batches=6, startup=0.0, cold_factor=1.0, alone_factors=(1.0,)):
        self.per_batch, self.batches = per_batch * TIME_SCALE, batches
        self.startup, self.cold_factor, self.alone_factors = startup * TIME_SCALE, cold_factor, alone_factors
        self.read_before: set[int] = set()
        self.alone_epochs = 0
        self.in_epoch = 0
        self.trained_this_epoch = False
        self.passes: list[str] = []
        self.batch_size = BATCH  # what a DataLoader has, for code that looks
        self.dataset = range(batches * BATCH)
        self.timings: list[tuple[int, int, bool, float]] = []  # (epoch's place in passes, batch, plain?, seconds)
        self.spans: list[tuple[int, float]] = []  # (epoch's place in passes, seconds from its first batch to its end)

    def __len__(self):
        return self.batches

    def __iter__(self):
        return self._epoch()

    def _epoch(self):
        self.in_epoch += 1
        self.trained_this_epoch = False
        self.passes.append("?")  # an epoch began: what it is shows when it ends
        position = len(self.passes) - 1
        factor = 1.0
        first_batch_at = None
        try:
            time.sleep(self.startup)
            for index in range(self.batches):
                if index == 1 and not self.trained_this_epoch:
                    factor = self.alone_factors[self.alone_epochs % len(self.alone_factors)]
                    self.alone_epochs += 1
                cold = self.cold_factor if index not in self.read_before else 1.0
                self.read_before.add(index)
                began = time.perf_counter()
                time.sleep(self.per_batch * cold * factor)
                self.timings.append((position, index, cold == factor == 1.0, time.perf_counter() - began))
                if index == 0:
                    first_batch_at = time.perf_counter()
                yield torch.zeros(BATCH, 1), torch.zeros(BATCH, dtype=torch.long)
            # The whole epoch was read: its wall time after the first batch, everything included
            # (the generator's own overhead, and on a busy machine the waits for a core).
            self.spans.append((position, time.perf_counter() - first_batch_at))
        finally:
            self.in_epoch -= 1
            self.passes[position] = "T" if self.trained_this_epoch else "L"

    def seconds_per_batch(self, kind: str) -> float:
        """How long a warm batch took, on average, in the epochs of ``kind`` ("L" or "T"), the first batch aside.

        Measured, not assumed: on a busy machine a sleep lasts a little longer than asked,
        and the candidate's timings include that too.
        """
        taken = [seconds for position, index, plain, seconds in self.timings
                 if plain and index > 0 and self.passes[position] == kind]
        return sum(taken) / len(taken) if taken else self.per_batch

    @property
    def rate(self) -> float:
        """Warm, steady images/s of the loader alone, as it ran: the median over its epochs read
        alone of the images after the first batch over the wall time from that batch to the end.

        Timed around the whole epoch, not only the sleeps, so a machine busy enough to delay the
        generator itself slows this reference exactly as much as it slows the candidate's clock.
        """
        rates = sorted(BATCH * (self.batches - 1) / seconds for position, seconds in self.spans
                       if self.passes[position] == "L" and seconds > 0)
        if not rates or self.batches < 2:
            return BATCH / self.seconds_per_batch("L")
        return rates[len(rates) // 2]


class _FakeConsumer:
    """A training step of known duration that records the torch threads it ran with and whether an epoch was running.

    Calls outside the loader's epochs (the consumer measured alone) are slowed by
    ``alone_factors[k]`` in the k-th pass over them (1 beyond the list).
    """

    def __init__(self, per_batch, loader, alone_factors=()):
        self.per_batch, self.loader = per_batch * TIME_SCALE, loader
        self.alone_factors = alone_factors
        self.alone_passes = 0
        self.threads: list[int] = []
        self.during_epoch: list[bool] = []
        self.timings: list[tuple[bool, bool, float]] = []  # (during an epoch?, plain?, seconds)

    def __call__(self, batch):
        self.threads.append(torch.get_num_threads())
        self.during_epoch.append(self.loader.in_epoch > 0)
        factor = 1.0
        if self.loader.in_epoch:
            self.loader.trained_this_epoch = True
        else:
            if not self.loader.passes or self.loader.passes[-1] != "C":
                self.loader.passes.append("C")
                self.alone_passes += 1
            k = self.alone_passes - 1
            factor = self.alone_factors[k] if k < len(self.alone_factors) else 1.0
        began = time.perf_counter()
        time.sleep(self.per_batch * factor)
        self.timings.append((self.during_epoch[-1], factor == 1.0, time.perf_counter() - began))

    def seconds_per_batch(self, during_epoch: bool) -> float:
        """How long a call took, on average, during the loader's epochs or outside them (measured)."""
        taken = [seconds for during, plain, seconds in self.timings if plain and during == during_epoch]
        return sum(taken) / len(taken) if taken else self.per_batch

    @property
    def rate(self) -> float:
        """Images/s of the consumer alone, as it ran."""
        return BATCH / self.seconds_per_batch(during_epoch=False)


#: The scenarios: loader and consumer seconds per batch of 32, the trap each sets, and `repeats`.
SCENARIOS = {
    "slow_loader": dict(loader=0.015, consumer=0.005),
    "consumer_bound": dict(loader=0.005, consumer=0.015),
    "startup": dict(loader=0.004, consumer=0.012, batches=3, startup=0.1, repeats=5),
    "cold": dict(loader=0.004, consumer=0.012, cold_factor=8.0),
    # Equally fast: the loader sleeps 2 % less, about what its own overheads (a generator, two small
    # tensors per batch) add; measured, the two come out within about 2 % of each other.
    "close": dict(loader=0.0098, consumer=0.010),
    # The loader's runs alternate between fast and 1.6 times slower; the consumer steady in between.
    "noisy": dict(loader=0.006, consumer=0.006 * 1.4, alone_factors=(1.0, 1.6)),
    # The loader's runs spread evenly over 30 %; the consumer 1.3 times faster than the fastest of
    # them, except in its third run, which falls between the loader's second and third fastest.
    "hiccup": dict(loader=0.006, consumer=0.006 / 1.3, alone_factors=(1.0, 1.06, 1.12, 1.18, 1.24, 1.30),
                   consumer_factors=(1.0, 1.0, 1.3 / 0.92)),
}


def thread_counts() -> tuple[int, int]:
    """(threads to ask for, threads the session runs before the call): neither 1 nor the machine's cores, and different."""
    taken = {1, os.cpu_count() or 1, data.available_cores(), torch.get_num_threads()}
    asked = next(n for n in (3, 5, 7, 11) if n not in taken)
    session = next(n for n in (5, 6, 9, 13) if n not in taken | {asked})
    return asked, session


class _Run:
    """One scenario as the candidate measured it: the fakes, the options, its result, the threads after the call."""

    def __init__(self, loader, consumer, options, result, threads_after):
        self.loader, self.consumer, self.options = loader, consumer, options
        self.result, self.threads_after = result, threads_after

    @property
    def repeats(self) -> int:
        return self.options["repeats"]


def _run(ctx: Context, scenario: str, attempt: int = 0) -> _Run:
    """Run the candidate on one scenario; parts share the outcome (``attempt`` > 0 measures it afresh)."""
    key = ("scenario", scenario, attempt)
    if key not in ctx.memo:
        spec = dict(SCENARIOS[scenario])
        consumer_seconds, consumer_factors = spec.pop("consumer"), spec.pop("consumer_factors", ())
        repeats = spec.pop("repeats", ROUNDS)
        loader = _FakeLoader(spec.pop("loader"), **spec)
        consumer = _FakeConsumer(consumer_seconds, loader, consumer_factors)
        asked, session = thread_counts()
        before = torch.get_num_threads()
        torch.set_num_threads(session)
        try:
            result = ctx.call(loader, consumer, repeats=repeats, threads=asked)
            after = torch.get_num_threads()
        finally:
            torch.set_num_threads(before)
        options = {"repeats": repeats, "threads": asked, "session": session}
        ctx.memo[key] = _Run(loader, consumer, options, _validated(result), after)
    return ctx.memo[key]


def _validated(result) -> dict:
    """The candidate's result, checked for shape: three spreads of images/s and a verdict."""
    if not isinstance(result, dict):
        raise PartFailed(f"find_bottleneck must return a dict; it returned {type(result).__name__}")
    for name in ("loader", "consumer", "together"):
        spread = result.get(name)
        if spread is None:
            raise PartFailed(f"the result has no {name!r}: return a packlab.bench.Spread of images/s for each of "
                             "'loader', 'consumer' and 'together'")
        values = getattr(spread, "values", None)
        if not all(hasattr(spread, a) for a in ("median", "low", "high")) or values is None:
            raise PartFailed(f"result[{name!r}] is a {type(spread).__name__}; make it Spread.of(rates), the images/s of each run")
        if not values or not all(v > 0 for v in values):
            raise PartFailed(f"result[{name!r}] holds rates that are not positive: {list(values)}")
    if result.get("bottleneck") not in ("loader", "consumer", "unclear"):
        raise PartFailed(f"result['bottleneck'] is {result.get('bottleneck')!r}; it must be 'loader', 'consumer' or 'unclear'")
    return result


def _near(measured: float, truth: float, what: str, low: float, high: float, why: str = "") -> None:
    if not low * truth <= measured <= high * truth:
        raise PartFailed(f"{what}: you measured {measured:.0f} images/s, but it runs at about {truth:.0f}{why}")


def _consumer_alone_of(run: _Run) -> str:
    result, consumer = run.result, run.consumer
    _near(result["consumer"].median, consumer.rate, f"the consumer alone ({consumer.per_batch:.3f} s per batch of "
          f"{BATCH}, the loader {run.loader.per_batch:.3f} s)", 0.5, 1.15,
          " (timed while loading, it would seem as slow as the loader)")
    return f"consumer alone: {result['consumer'].median:.0f} images/s (it runs at {consumer.rate:.0f})"


#: What a cold first read in a timed run should have had before it.
WARM_UP_ADVICE = "Reading one batch warms one batch: read the whole epoch once, untimed, before measuring"


def _together_rate(loader, consumer) -> float:
    """Images/s of the two together once warm: each batch read while training, then trained on, as the fakes timed them."""
    return BATCH / (loader.seconds_per_batch("T") + consumer.seconds_per_batch(during_epoch=True))


def _together_of(run: _Run) -> str:
    loader, consumer, result = run.loader, run.consumer, run.result
    trained_during_epochs = sum(consumer.during_epoch)
    if trained_during_epochs < run.repeats * (loader.batches - 1):
        raise PartFailed(
            f"over {run.repeats} runs of {loader.batches} batches, the consumer ran on only {trained_during_epochs} "
            "batches while the loader was being read: measure the two together, training on every batch as it "
            "arrives (not computed from the two alone)"
        )
    serial = _together_rate(loader, consumer)
    # Judged against the candidate's own loader-alone figure: a way of counting that moves both alike
    # (the first batch's images counted in, say) is the 'startup' part's to name, not this one's. With
    # 6 batches an epoch it lifts both by 6/5, which would put 'together' right at this part's edge.
    together, alone = result["together"].median, result["loader"].median
    _near(together, alone * serial / loader.rate,
          f"the loader feeding the consumer (in one process their times add up; your loader alone ran at {alone:.0f})",
          0.6, 1.15)
    return (f"together: {together:.0f} images/s, {together / alone:.2f} of your loader alone "
            f"(one process, expected about {serial / loader.rate:.2f})")


def _startup(ctx: Context) -> str:
    run = _run(ctx, "startup")
    loader, consumer, result = run.loader, run.consumer, run.result
    measured = result["loader"].median
    images = loader.batches * BATCH
    per_batch = loader.seconds_per_batch("L")
    counted_all = images / ((loader.batches - 1) * per_batch)
    with_startup = images / (loader.startup + loader.batches * per_batch)
    if measured < 0.4 * loader.rate:
        raise PartFailed(
            f"the loader alone delivers {loader.rate:.0f} images/s once its first batch is there, after a "
            f"{loader.startup:.2f} s start-up per epoch of {loader.batches} batches; you measured {measured:.0f} "
            f"(with the start-up in: {with_startup:.0f}). Start the clock when the first batch arrives"
        )
    if measured > 1.15 * loader.rate:
        raise PartFailed(
            f"the loader alone delivers {loader.rate:.0f} images/s once its first batch is there; you measured "
            f"{measured:.0f} (counting the first batch's images too: {counted_all:.0f}). The clock starts when the "
            "first batch arrives, so count only the images after it"
        )
    serial = _together_rate(loader, consumer)
    together = result["together"].median
    if together < 0.5 * serial:
        raise PartFailed(
            f"the two together run at about {serial:.0f} images/s once the first batch is there; you measured "
            f"{together:.0f}: the start-up is in. Time 'together' like the loader alone, from its first batch on"
        )
    return f"loader alone {measured:.0f} images/s, together {together:.0f}, both from the first batch on"


def _warm_of(run: _Run) -> str:
    loader, consumer, result = run.loader, run.consumer, run.result
    slowest = result["loader"].low
    if slowest < 0.4 * loader.rate:
        raise PartFailed(
            f"the slowest of your loader runs delivered {slowest:.0f} images/s: it read batches for the first time, "
            f"from cold storage ({loader.cold_factor:.0f} times slower than the warm {loader.rate:.0f} images/s). "
            + WARM_UP_ADVICE
        )
    # The runs take turns in a changing order, so the first timed read may be the two together:
    # a cold first read there slows 'together' (by about 2.8 times in this scenario), not the loader.
    serial = _together_rate(loader, consumer)
    slowest_together = result["together"].low
    if slowest_together < 0.6 * serial:
        raise PartFailed(
            f"the slowest of your runs of the two together delivered {slowest_together:.0f} images/s, against about "
            f"{serial:.0f} warm: it read batches for the first time, from cold storage ({loader.cold_factor:.0f} "
            "times slower). " + WARM_UP_ADVICE
        )
    return (f"no timed run was a cold first read (slowest loader run {slowest:.0f} images/s, slowest together "
            f"{slowest_together:.0f})")


def _measured_again_if_slowed(judge: Callable[[_Run], str], scenario: str) -> Callable[[Context], str]:
    """A part that compares the candidate's timings with the fakes': judged on a second, fresh run when the first fails.

    On a busy machine one run of a few dozen milliseconds can stall for a quarter of a second
    (a sleep that overruns while other processes hold the cores), and a correct measurement
    then looks like a cold read or a consumer timed while loading. A mistake fails every run
    alike, so a second fresh run lets the first's stall pass without letting a mistake
    through; a part that fails twice shows the first run's message.
    """
    def part(ctx: Context) -> str:
        try:
            return judge(_run(ctx, scenario))
        except PartFailed as first:
            try:
                shown = judge(_run(ctx, scenario, attempt=1))
            except PartFailed:
                raise first from None
            return f"{shown} (on a second run: the first was slowed, as by a busy machine)"
    return part


_consumer_alone = _measured_again_if_slowed(_consumer_alone_of, "slow_loader")
_together = _measured_again_if_slowed(_together_of, "slow_loader")
_warm = _measured_again_if_slowed(_warm_of, "cold")


def _threads(ctx: Context) -> str:
    run = _run(ctx, "slow_loader")
    consumer = run.consumer
    asked, session = run.options["threads"], run.options["session"]
    if not consumer.threads:
        raise PartFailed("the consumer was never called")
    wrong = sorted(set(consumer.threads) - {asked})
    if wrong:
        share = sum(t != asked for t in consumer.threads) / len(consumer.threads)
        during = {d for t, d in zip(consumer.threads, consumer.during_epoch) if t != asked}
        where = {frozenset({True}): " (the calls while the loader ran: set the threads for 'together' too)",
                 frozenset({False}): " (the calls on batches in memory: set the threads for the consumer alone too)"}
        raise PartFailed(
            f"asked for threads={asked} in a session running {session} torch threads, the consumer ran with "
            f"{', '.join(map(str, wrong))} threads in {share:.0%} of its calls{where.get(frozenset(during), '')}: "
            "torch.set_num_threads(threads), the number given"
        )
    if run.threads_after != session:
        raise PartFailed(f"the session ran {session} torch threads before the call and {run.threads_after} after it: "
                         "restore the setting you found (torch.get_num_threads() before you change it)")
    return f"every consumer call ran with the {asked} threads asked for; the session's {session} were restored"


def _longest_stretch(passes: list[str]) -> int:
    """The most runs of one kind in a row in ``passes`` (``LLLCTT`` has 3; ``LCTTCL`` has 2).

    Runs that take turns, whatever order each round has, never put more than two of a kind
    in a row (the last of one round, the first of the next). Consecutive consumer runs log
    one ``"C"``, so only loader epochs (``L``, ``T``) are counted here.
    """
    longest, previous, count = 0, None, 0
    for kind in passes:
        count = count + 1 if kind == previous else 1
        previous = kind
        if kind != "C":
            longest = max(longest, count)
    return longest


def _turns(ctx: Context) -> str:
    for scenario in ("startup", "slow_loader"):
        run = _run(ctx, scenario)
        for name in ("loader", "consumer", "together"):
            count = len(run.result[name].values)
            if count != run.repeats:
                raise PartFailed(f"result[{name!r}] holds {count} runs; with repeats={run.repeats} measure each "
                                 f"thing {run.repeats} times")
        passes = run.loader.passes[1:]  # the first epoch is the warm-up
        # Taking turns puts at most two epochs of a kind in a row; four when a second mistake makes two
        # things log the same kind (the consumer timed while loading, 'together' read without training).
        # Blocks of all runs of one kind (repeats is 5 or 6) are longer. Taking turns, two consumer runs
        # in a row log one "C" at most: fewer than repeats / 2 of them means its runs were bunched.
        bunched_consumer = "C" in passes and 2 * passes.count("C") < run.repeats
        if _longest_stretch(passes) > 4 or bunched_consumer:
            order = "".join(passes)
            raise PartFailed(
                f"with repeats={run.repeats} your measurements came in this order (L: the loader alone, C: the consumer "
                f"alone, T: together): {order[:40]}{'...' if len(order) > 40 else ''}. They did not take turns, so a "
                "change in the machine's speed while you measure (another job starting, a fan, a cache) favours "
                "whichever came first. Measure each once per round, then the next round "
                "(packlab.bench.interleaved, which also changes the order from round to round)"
            )
    return "`repeats` runs of each, taking turns (each once per round)"


def _decides(ctx: Context) -> str:
    for scenario, truth in (("slow_loader", "loader"), ("consumer_bound", "consumer")):
        run = _run(ctx, scenario)
        result = run.result
        if result["bottleneck"] != truth:
            raise PartFailed(
                f"loader {run.loader.rate:.0f} images/s, consumer {run.consumer.rate:.0f}: the {truth} is the "
                f"bottleneck; you measured loader {result['loader']}, consumer {result['consumer']} and said "
                f"{result['bottleneck']!r}"
                + (". The slower side sets the pace" if result["bottleneck"] != "unclear" else "")
            )
    return "a loader 3 times slower than the consumer is the bottleneck, and the other way round"


def _why_not(loader, consumer, said: str, expected: str) -> str:
    """Why ``compare`` answers ``expected`` where the candidate said ``said``, in words."""
    chance = chance_of_split(loader.values, consumer.values)
    ratio = max(loader.median, consumer.median) / min(loader.median, consumer.median)
    if expected == "unclear":
        if ratio < 1.05:
            return (f" The medians are only {100 * (ratio - 1):.1f} % apart: below 5 % compare calls nothing clear, "
                    "however consistent the runs")
        return (f" The runs are not split clearly: two equal sides would be split like this {100 * chance:.0f} % of "
                "the time (compare wants at most 2 %), although the medians differ")
    if loader.overlaps(consumer):
        return " The ranges overlap, but the runs are split clearly all the same: ranges are not the rule"
    return ""


#: The rules a verdict is tempted to follow instead of :func:`packlab.bench.compare`, each with
#: the scenario built to tell it apart: (its name, the rule, the scenario).
TEMPTING_RULES = (
    ("the medians alone", lambda loader, consumer: "consumer" if loader.median > consumer.median else "loader",
     "noisy"),
    ("whether the ranges overlap",
     lambda loader, consumer: "unclear" if loader.overlaps(consumer)
     else "consumer" if loader.median > consumer.median else "loader",
     "hiccup"),
    ("a 5 % ratio of the medians",
     lambda loader, consumer: "consumer" if loader.median >= 1.05 * consumer.median
     else "loader" if consumer.median >= 1.05 * loader.median else "unclear",
     "noisy"),
)
#: Fresh measurements of a scenario, at most, when noise blurred the difference it was built to show.
EXTRA_ATTEMPTS = 3


def _rules_told_apart(loader, consumer) -> set[str]:
    """The tempting rules that answer differently from ``compare`` on these runs."""
    expected = verdict(loader, consumer, more="consumer", less="loader", same="unclear")
    return {name for name, rule, _ in TEMPTING_RULES if rule(loader, consumer) != expected}


def _judge_verdict(run: _Run) -> str:
    """``compare``'s verdict on the candidate's runs; the part fails if the candidate said otherwise."""
    result = run.result
    loader, consumer = result["loader"], result["consumer"]
    expected = verdict(loader, consumer, more="consumer", less="loader", same="unclear")
    if result["bottleneck"] != expected:
        raise PartFailed(
            f"you measured loader {loader}, consumer {consumer} images/s and said {result['bottleneck']!r}; "
            f"packlab.bench.compare on those runs says {expected!r}.{_why_not(loader, consumer, result['bottleneck'], expected)}"
        )
    return expected


def _verdict(ctx: Context) -> str:
    shown = [_judge_verdict(_run(ctx, scenario)) for scenario in ("close", "noisy", "hiccup", "slow_loader", "consumer_bound")]
    # Sleeps on a busy machine can blur the difference a scenario was built to show (the loader's
    # fastest run delayed, say), so that on those runs a tempting rule agrees with compare and a
    # verdict following it would pass unseen. Such a scenario is measured again, and the
    # candidate's verdict judged each time; a verdict that follows compare passes every time.
    extra = 0
    for name, _, scenario in TEMPTING_RULES:
        for attempt in range(EXTRA_ATTEMPTS + 1):
            fresh = ("scenario", scenario, attempt) not in ctx.memo  # the first attempt was judged above
            run = _run(ctx, scenario, attempt)
            if fresh:
                extra += 1
                _judge_verdict(run)
            if name in _rules_told_apart(run.result["loader"], run.result["consumer"]):
                break
    again = f"; measured again {extra} time{'s' if extra != 1 else ''}, as noise had blurred a scenario" if extra else ""
    return f"the verdict follows packlab.bench.compare on your own runs ({', '.join(shown)}{again})"


register(
    "bottleneck",
    "06_bottleneck",
    "measure a loader alone, its consumer alone and the two together; say which one sets the pace",
    "find_bottleneck(loader, consume, repeats=6, threads=1) -> dict: 'loader', 'consumer', 'together' are "
    "packlab.bench.Spread of images/s over `repeats` interleaved runs (the loader, alone and together, from its "
    "first batch on, after an untimed warm-up epoch; the consumer on batches in memory; consume() with `threads` "
    "torch threads); 'bottleneck' is 'loader', 'consumer' or 'unclear', as packlab.bench.verdict says",
    dict,
    [
        ("consumer_alone", "the consumer alone is timed on batches already in memory, not while loading",
         "keep the batches of the warm-up pass in a list and time consume() over that list", _consumer_alone),
        ("together", "the two together: consume() on every batch as the loader delivers it",
         "for batch in loader: consume(batch), timed like the loader alone", _together),
        ("startup", "the loader's rate, alone and together, is counted from its first batch on",
         "note the time when the first batch arrives; count the images after it and divide by the time since",
         _startup),
        ("warm", "no timed run reads the data for the first time",
         "read the whole loader once, untimed, before any measurement (that pass can also give the batches for the "
         "consumer)", _warm),
        ("threads", "consume() runs with `threads` torch threads, and the session's setting is restored",
         "torch.set_num_threads(threads) before timing the consumer (alone and together); set it back to "
         "torch.get_num_threads()'s earlier value at the end (packlab.bench.torch_threads does both)", _threads),
        ("turns", "`repeats` runs of each thing, measured in turns (loader, consumer, together; and again)",
         "take turns (loader, consumer, together; then again: packlab.bench.interleaved(measures, repeats)) rather "
         "than all loader runs first", _turns),
        ("decides", "a clearly slower loader is 'loader', a clearly slower consumer is 'consumer'",
         "the slower side is the bottleneck: verdict(loader, consumer, more='consumer', less='loader', same='unclear')",
         _decides),
        ("verdict", "the verdict follows packlab.bench.compare on the runs measured, also for small or noisy differences",
         "packlab.bench.verdict(result['loader'], result['consumer'], more='consumer', less='loader', same='unclear'), "
         "not the medians alone nor whether the ranges overlap", _verdict),
    ],
)


# ------------------------------------------------------------- Part C: the answer, from your runs

#: The three words a verdict can be.
PACE_WORDS = ("loader", "consumer", "unclear")
#: The fewest words an explanation may have: a sentence, not a label.
WHY_MIN_WORDS = 8


def _answer(ctx: Context) -> dict:
    """The attendee's answer, called once per check; its shape checked before any part reads it."""
    if "answer" not in ctx.memo:
        given = ctx.call()
        if not isinstance(given, dict) or not {"measured", "pace", "why"} <= set(given):
            raise PartFailed(f"{ctx.name}() returned {type(given).__name__}; return a dict with 'measured' "
                             "(Part B's runs), 'pace' ({workers: 'loader', 'consumer' or 'unclear'}) and 'why' (your sentences)")
        measured = given["measured"]
        if not isinstance(measured, dict) or not measured or not all(
                isinstance(run, dict) and {"loader", "consumer"} <= set(run) for run in measured.values()):
            raise PartFailed("'measured' must be Part B's runs as they are: {workers: find_bottleneck(...)}, "
                             "for every worker count you measured")
        ctx.memo["answer"] = given
    return ctx.memo["answer"]


def _pace_answered(ctx: Context) -> str:
    answer = _answer(ctx)
    pace, measured = answer["pace"], answer["measured"]
    if not isinstance(pace, dict) or set(pace) != set(measured):
        raise PartFailed(f"'pace' answers for {sorted(pace) if isinstance(pace, dict) else pace!r}; "
                         f"you measured {sorted(measured)} workers: give one answer for each")
    wrong = {workers: word for workers, word in pace.items() if word not in PACE_WORDS}
    if wrong:
        raise PartFailed(f"{wrong}: each answer is one of {', '.join(map(repr, PACE_WORDS))}")
    return f"an answer for each of {sorted(measured)} workers"


def _pace_follows_your_runs(ctx: Context) -> str:
    answer = _answer(ctx)
    _pace_answered(ctx)
    said = []
    for workers, run in sorted(answer["measured"].items()):
        runs_say = verdict(run["loader"], run["consumer"], more="consumer", less="loader", same="unclear")
        if answer["pace"][workers] != runs_say:
            raise PartFailed(
                f"with {workers} workers your runs measured loader {run['loader']} and consumer {run['consumer']} "
                f"images/s, which packlab.bench.verdict calls {runs_say!r}; you wrote {answer['pace'][workers]!r}")
        said.append(f"{workers} workers: {runs_say}")
    return "your answers follow your own runs (" + "; ".join(said) + ")"


def _why_written(ctx: Context) -> str:
    why = _answer(ctx)["why"]
    words = why.split() if isinstance(why, str) else []
    if len(words) < WHY_MIN_WORDS:
        raise PartFailed(f"'why' has {len(words)} words: write a sentence or two (at least {WHY_MIN_WORDS} words) on why "
                         "that side set the pace, in your own words")
    if not any(term in why.lower() for term in ("loader", "consumer", "worker", "core", "thread", "model")):
        raise PartFailed("'why' says nothing about the loader, the consumer, the workers or the cores: "
                         "say which of them set the pace, and why on this machine")
    return f"{len(words)} words on why"


register(
    "bottleneck_answer",
    "06_bottleneck",
    "the answer to Part B's question, read from your own runs: which side set the pace, and why",
    "answer() -> dict: 'measured' is Part B's {workers: find_bottleneck(...)} as it is; 'pace' is "
    "{workers: 'loader', 'consumer' or 'unclear'}, what you read in those runs; 'why' is a sentence or two",
    dict,
    [
        ("pace_answered", "an answer for every worker count you measured, each 'loader', 'consumer' or 'unclear'",
         "return {'measured': measured, 'pace': {0: ..., 2: ...}, 'why': '...'}", _pace_answered),
        ("pace_follows_your_runs", "each answer is what your own runs say (packlab.bench.verdict on them)",
         "read the verdict line Part B printed for each worker count, not what you expected", _pace_follows_your_runs),
        ("why", "a sentence or two on why that side set the pace on this machine",
         "name the side, and what made it the slower one here (decode on few cores, workers sharing cores with "
         "the model, ...)", _why_written),
    ],
)

"""Checks of exercise 6 (``06_bottleneck``): measure the consumer before you tune the loader.

The candidate, ``find_bottleneck(loader, consume, repeats=3, threads=1)``, measures a
loader alone, a consumer alone and the two together, and says which one sets the pace.
The checks hand it a fake loader and a fake consumer whose speeds are known, because
they sleep for set times (a sleeping process uses no CPU, so the check's timings hold on
a busy machine too). Each scenario sets one trap that a careless measurement falls into:

* a loader that pauses before the first batch of every epoch (worker start-up);
* a loader whose first epoch is many times slower than the next ones (cold storage);
* a session whose torch thread count is not the one asked for;
* a slow loader, which a consumer timed while loading would seem to share;
* a machine whose speed drifts while it is measured, and a loader and a consumer that
  are equally fast: only runs that take turns show that neither is clearly the slower.
"""

from __future__ import annotations

import time

import torch

from packlab.course.grading.core import Context, PartFailed, register

#: Images in every fake batch.
BATCH = 32


class _Clock:
    """The time since a scenario started, and how much slower the machine has become since (drift)."""

    def __init__(self, drift_per_s: float = 0.0):
        self.start = time.perf_counter()
        self.drift_per_s = drift_per_s

    def slowdown(self) -> float:
        return 1.0 + self.drift_per_s * (time.perf_counter() - self.start)


class _FakeLoader:
    """Batches of 32 at a known pace: ``startup`` s before each epoch's first batch, ``per_batch`` s per batch.

    The first epoch ever is ``cold_factor`` times slower per batch. ``in_epoch`` is true
    while an epoch is being read, so the fake consumer can tell training from other calls.
    """

    def __init__(self, per_batch, clock, batches=6, startup=0.0, cold_factor=1.0):
        self.per_batch, self.clock, self.batches = per_batch, clock, batches
        self.startup, self.cold_factor = startup, cold_factor
        self.epochs = 0
        self.in_epoch = False

    def __len__(self):
        return self.batches

    def __iter__(self):
        self.epochs += 1
        return self._epoch(cold=self.epochs == 1)

    def _epoch(self, cold: bool):
        self.in_epoch = True
        try:
            time.sleep(self.startup)
            for _ in range(self.batches):
                time.sleep(self.per_batch * (self.cold_factor if cold else 1.0) * self.clock.slowdown())
                yield torch.zeros(BATCH, 1), torch.zeros(BATCH, dtype=torch.long)
        finally:
            self.in_epoch = False

    @property
    def rate(self) -> float:
        """Warm, steady images/s (after the first batch, without drift)."""
        return BATCH / self.per_batch


class _FakeConsumer:
    """A training step of known duration that records the torch threads it ran with and whether an epoch was running."""

    def __init__(self, per_batch, clock, loader):
        self.per_batch, self.clock, self.loader = per_batch, clock, loader
        self.threads: list[int] = []
        self.during_epoch: list[bool] = []

    def __call__(self, batch):
        self.threads.append(torch.get_num_threads())
        self.during_epoch.append(self.loader.in_epoch)
        time.sleep(self.per_batch * self.clock.slowdown())

    @property
    def rate(self) -> float:
        return BATCH / self.per_batch


#: The scenarios: loader and consumer seconds per batch of 32, and the trap each one sets.
SCENARIOS = {
    "slow_loader": dict(loader=0.030, consumer=0.010),
    "startup": dict(loader=0.005, consumer=0.015, batches=8, startup=0.15),
    "cold": dict(loader=0.008, consumer=0.024, batches=8, cold_factor=8.0),
    "consumer_bound": dict(loader=0.010, consumer=0.030),
    "drifting": dict(loader=0.015, consumer=0.015, drift=1.5),
}


def _run(ctx: Context, scenario: str):
    """Run the candidate once per child on one scenario, asking for 1 torch thread in a session running 2.

    Parts share the outcome: ``(loader, consumer, result, torch threads after the call)``.
    """
    key = ("scenario", scenario)
    if key not in ctx.memo:
        spec = dict(SCENARIOS[scenario])
        clock = _Clock(spec.pop("drift", 0.0))
        consumer_seconds = spec.pop("consumer")
        loader = _FakeLoader(spec.pop("loader"), clock, **spec)
        consumer = _FakeConsumer(consumer_seconds, clock, loader)
        before = torch.get_num_threads()
        torch.set_num_threads(2)  # as a fresh session on two cores would; the candidate must ask for 1
        try:
            result = ctx.call(loader, consumer, repeats=3, threads=1)
            after = torch.get_num_threads()
        finally:
            torch.set_num_threads(before)
        ctx.memo[key] = (loader, consumer, _validated(result), after)
    return ctx.memo[key]


def _validated(result) -> dict:
    """The candidate's result, checked for shape: three spreads of 3 runs and a verdict."""
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
        if len(values) != 3:
            raise PartFailed(f"result[{name!r}] holds {len(values)} runs; with repeats=3 measure each thing 3 times")
        if not all(v > 0 for v in values):
            raise PartFailed(f"result[{name!r}] holds rates that are not positive: {list(values)}")
    if result.get("bottleneck") not in ("loader", "consumer", "unclear"):
        raise PartFailed(f"result['bottleneck'] is {result.get('bottleneck')!r}; it must be 'loader', 'consumer' or 'unclear'")
    return result


def _near(measured: float, truth: float, what: str, low: float = 0.5, high: float = 1.6) -> None:
    if not low * truth <= measured <= high * truth:
        raise PartFailed(f"{what}: you measured {measured:.0f} images/s, but it runs at about {truth:.0f}")


def _consumer_alone(ctx: Context) -> str:
    loader, consumer, result, _ = _run(ctx, "slow_loader")
    _near(result["consumer"].median, consumer.rate,
          f"the consumer alone (0.010 s per batch of {BATCH}, the loader 0.030 s)")
    return f"consumer alone: {result['consumer'].median:.0f} images/s (it runs at {consumer.rate:.0f})"


def _together(ctx: Context) -> str:
    loader, consumer, result, _ = _run(ctx, "slow_loader")
    trained_during_epochs = sum(consumer.during_epoch)
    if trained_during_epochs < 3 * loader.batches:
        raise PartFailed(
            f"the consumer ran on {trained_during_epochs} batches while the loader was being read, fewer than the "
            f"{3 * loader.batches} of 3 epochs: measure the two together, training on every batch as it arrives"
        )
    serial = BATCH / (loader.per_batch + consumer.per_batch)
    _near(result["together"].median, serial, "the loader feeding the consumer (in one process their times add up)")
    return f"together: {result['together'].median:.0f} images/s (one process, expected about {serial:.0f})"


def _startup(ctx: Context) -> str:
    loader, _, result, _ = _run(ctx, "startup")
    measured = result["loader"].median
    if measured < 0.4 * loader.rate:
        with_startup = (loader.batches * BATCH) / (loader.startup + loader.batches * loader.per_batch)
        raise PartFailed(
            f"the loader alone delivers {loader.rate:.0f} images/s once its first batch is there, after a "
            f"{loader.startup:.2f} s start-up per epoch; you measured {measured:.0f} (with the start-up in: "
            f"{with_startup:.0f}), and concluded {result['bottleneck']!r}"
        )
    if result["bottleneck"] != "consumer":
        raise PartFailed(f"the consumer ({BATCH / SCENARIOS['startup']['consumer']:.0f} images/s) is the slower one here; "
                         f"you said {result['bottleneck']!r}")
    return f"loader alone {measured:.0f} images/s from its first batch on; the consumer sets the pace"


def _warm(ctx: Context) -> str:
    loader, _, result, _ = _run(ctx, "cold")
    slowest = result["loader"].low
    if slowest < 0.5 * loader.rate:
        raise PartFailed(
            f"the slowest of your loader runs delivered {slowest:.0f} images/s: that was the first, cold pass "
            f"({loader.cold_factor:.0f} times slower than the warm ones, {loader.rate:.0f} images/s), compared "
            "with warm runs of the consumer"
        )
    return f"no timed run was the cold first pass (slowest loader run {slowest:.0f} images/s)"


def _threads(ctx: Context) -> str:
    _, consumer, _, after = _run(ctx, "slow_loader")
    wrong = sorted(set(consumer.threads) - {1})
    if not consumer.threads:
        raise PartFailed("the consumer was never called")
    if wrong:
        share = sum(t != 1 for t in consumer.threads) / len(consumer.threads)
        raise PartFailed(
            f"asked for threads=1 in a session running {wrong[0]} torch threads, the consumer ran with "
            f"{', '.join(map(str, wrong))} threads in {share:.0%} of its calls"
        )
    if after != 2:
        raise PartFailed(f"the session ran 2 torch threads before the call and {after} after it: restore the setting you found")
    return "every consumer call ran with the threads asked for; the session's setting was restored"


def _decides(ctx: Context) -> str:
    answers = {}
    for scenario, truth in (("slow_loader", "loader"), ("consumer_bound", "consumer")):
        loader, consumer, result, _ = _run(ctx, scenario)
        answers[scenario] = result["bottleneck"]
        if result["bottleneck"] != truth:
            raise PartFailed(
                f"loader {loader.rate:.0f} images/s, consumer {consumer.rate:.0f}: the {truth} is the bottleneck; you "
                f"measured loader {result['loader']}, consumer {result['consumer']} and said {result['bottleneck']!r}"
            )
    return "a loader 3 times slower than the consumer is the bottleneck, and the other way round"


def _no_clear_difference(ctx: Context) -> str:
    _, _, result, _ = _run(ctx, "drifting")
    if result["bottleneck"] != "unclear":
        raise PartFailed(
            "loader and consumer run equally fast here while the machine slows down as you measure: you measured "
            f"loader {result['loader']}, consumer {result['consumer']} images/s and said {result['bottleneck']!r}. "
            "Runs that take turns see the same slowdown, so their ranges overlap: 'unclear'"
        )
    return f"equally fast on a drifting machine: loader {result['loader']}, consumer {result['consumer']}: 'unclear'"


register(
    "bottleneck",
    "06_bottleneck",
    "measure a loader alone, its consumer alone and the two together; say which one sets the pace",
    "find_bottleneck(loader, consume, repeats=3, threads=1) -> dict: 'loader', 'consumer', 'together' are "
    "packlab.bench.Spread of images/s over `repeats` interleaved runs (the loader from its first batch on, after an "
    "untimed warm-up pass; the consumer on batches in memory; consume() with `threads` torch threads); "
    "'bottleneck' is 'loader', 'consumer' or 'unclear' (ranges overlap)",
    dict,
    [
        ("consumer_alone", "the consumer alone is timed on batches already in memory, not while loading",
         "keep the batches of the warm-up pass in a list and time consume() over that list", _consumer_alone),
        ("together", "the two together: consume() on every batch as the loader delivers it",
         "for batch in loader: consume(batch), timed like the loader alone", _together),
        ("startup", "the loader's rate is counted from its first batch on, not from before the start-up",
         "note the time when the first batch arrives; count the images after it and divide by the time since", _startup),
        ("warm", "no timed run is the cold first pass over the data",
         "read the loader once, untimed, before any measurement (that pass can also give the batches for the consumer)", _warm),
        ("threads", "consume() runs with `threads` torch threads, and the session's setting is restored",
         "torch.set_num_threads(threads) before timing the consumer (alone and together); set it back to "
         "torch.get_num_threads()'s earlier value at the end", _threads),
        ("decides", "a clearly slower loader is 'loader', a clearly slower consumer is 'consumer'",
         "compare the spreads of images/s: the slower side is the bottleneck", _decides),
        ("no_clear_difference", "equally fast on a machine whose speed drifts: interleaved runs, 'unclear'",
         "take turns (loader, consumer, together; then again: packlab.bench.interleaved) rather than three loader runs "
         "first; say 'unclear' when the ranges overlap (Spread.overlaps)", _no_clear_difference),
    ],
)

"""Fake contenders with known answers, for checking a verdict rule before trusting it.

A rule that calls differences "clear" (:func:`packlab.bench.compare`) is only as good as
two numbers: how often it calls contenders that cannot differ different (it should be
rare), and how often it finds a difference that is real. Neither can be read off one real
measurement, because the truth is unknown there. Here the truth is set: each fake
contender returns ``true_rate × noise``, where the noise is lognormal (``noise=0.10``: about
10 % from run to run), and the machine may charge a **position penalty**: the first call of
every round runs ``penalty`` slower (``0.15``: 15 %), as a colder cache or a falling load
would make it. It may also make some runs **outliers**: ``outliers=1/6`` makes one run in six,
at random, take ``slowdown`` times as long (``3.0``), as a run does that another program
interrupts on a shared machine. The fakes go through :func:`packlab.bench.interleaved`
exactly as real loaders do, so the simulation checks the order of the runs as well as the
test, and with ``cheap=True`` it uses the rounds :func:`~packlab.bench.interleaved` gives
work that costs microseconds (:data:`packlab.bench.CHEAP_ROUNDS`).

    >>> from packlab import simulated_runs
    >>> simulated_runs.verdict_rates(contenders=2, penalty=0.15, order="fixed", trials=500)  # doctest: +SKIP
    {'equal called different': 0.92..., '1.3x found': 1.0}
"""

from __future__ import annotations

import numpy as np

from packlab import bench


class PositionPenalty:
    """The machine of the simulation: it knows which call of a round is running, and slows the first.

    :func:`~packlab.bench.interleaved` calls each of ``contenders`` functions once per round,
    so the ``n``-th call overall is the ``n % contenders``-th of its round.
    """

    def __init__(self, contenders: int, penalty: float, noise: float, rng: np.random.Generator,
                 outliers: float = 0.0, slowdown: float = 3.0):
        self.contenders, self.penalty, self.noise, self.rng = contenders, penalty, noise, rng
        self.outliers, self.slowdown = outliers, slowdown
        self.calls = 0

    def fake(self, true_rate: float):
        """A contender whose runs return ``true_rate`` with noise, slowed in the first position of a round,
        and ``slowdown`` times slower in a share ``outliers`` of its runs."""

        def run() -> float:
            first = self.calls % self.contenders == 0
            self.calls += 1
            rate = true_rate * float(self.rng.lognormal(0.0, self.noise))
            if self.outliers and self.rng.random() < self.outliers:
                rate /= self.slowdown
            return rate / (1.0 + self.penalty) if first else rate

        return run


def simulated_spreads(contenders: int, ratio: float, penalty: float, order: str, rng: np.random.Generator,
                      noise: float = 0.10, rounds: int | None = None, outliers: float = 0.0, slowdown: float = 3.0,
                      cheap: bool = False) -> tuple[bench.Spread, bench.Spread]:
    """The runs of contender 0 (``ratio`` times as fast) and contender 1 on the simulated machine.

    The others (``contenders`` of them in all) run at rate 1 too; each trial draws a fresh
    seed for the order, as separate cells of a book would.
    """
    machine = PositionPenalty(contenders, penalty, noise, rng, outliers, slowdown)
    fakes = {f"contender {i}": machine.fake(ratio if i == 0 else 1.0) for i in range(contenders)}
    seed = int(rng.integers(2**31))
    spreads = list(bench.interleaved(fakes, rounds=rounds, order=order, seed=seed, cheap=cheap).values())
    return spreads[0], spreads[1]


def simulated_comparison(contenders: int, ratio: float, penalty: float, order: str, rng: np.random.Generator,
                         noise: float = 0.10, rounds: int | None = None, outliers: float = 0.0, slowdown: float = 3.0,
                         cheap: bool = False) -> int:
    """One comparison on the simulated machine: ``compare`` of contender 0 with contender 1 (:func:`simulated_spreads`)."""
    return bench.compare(*simulated_spreads(contenders, ratio, penalty, order, rng, noise, rounds, outliers, slowdown,
                                            cheap))


def verdict_rates(contenders: int = 2, penalty: float = 0.0, order: str = "balanced", trials: int = 2000,
                  noise: float = 0.10, ratio: float = 1.3, rounds: int | None = None, seed: int = 0,
                  outliers: float = 0.0, slowdown: float = 3.0, cheap: bool = False) -> dict[str, float]:
    """How often ``compare`` calls equal contenders different, and finds a real ``ratio``, over ``trials`` each.

    Also how often the interval of a real ``ratio`` (:func:`packlab.bench.ratio_interval`)
    held the true ratio (``"interval held the ratio"``): it should, at least as often as its
    level promises, outliers or not.
    """
    rng = np.random.default_rng(seed)
    options = dict(noise=noise, rounds=rounds, outliers=outliers, slowdown=slowdown, cheap=cheap)
    equal = sum(simulated_comparison(contenders, 1.0, penalty, order, rng, **options) != 0 for _ in range(trials))
    found = held = 0
    for _ in range(trials):
        a, b = simulated_spreads(contenders, ratio, penalty, order, rng, **options)
        found += bench.compare(a, b) == 1
        interval = bench.ratio_interval(a, b)
        held += interval is not None and interval.low <= ratio <= interval.high
    return {"equal called different": equal / trials, f"{ratio:g}x found": found / trials,
            "interval held the ratio": held / trials}


def passes_its_ceiling(share: float = 1.0, noise: float = 0.05, rounds: int = 6, trials: int = 2000,
                       seed: int = 0, outliers: float = 0.0, slowdown: float = 3.0) -> dict[str, float]:
    """How often a loader at ``share`` of its ceiling's true rate comes out above the ceiling, two ways.

    The loader and its ceiling are fakes (as in :func:`verdict_rates`) run in ``rounds``
    counterbalanced rounds. ``"median above median"`` is how often the loader's median
    passes the ceiling's median; ``"mis-measured"`` how often
    :func:`packlab.ceiling.loader_vs_ceiling` says so (the loader's median above the
    ceiling's best run, or its runs clearly above). For a loader that does exactly the
    ceiling's work (``share=1``) the first is about one half, whatever the rounds: the
    reason the course takes a ceiling's best run as its figure.
    """
    from packlab.ceiling import loader_vs_ceiling

    rng = np.random.default_rng(seed)
    median_above = mis_measured = 0
    for _ in range(trials):
        loader, ceiling = simulated_spreads(2, share, 0.0, "balanced", rng, noise=noise, rounds=rounds,
                                            outliers=outliers, slowdown=slowdown)
        median_above += loader.median > ceiling.median
        mis_measured += loader_vs_ceiling(loader, ceiling).mis_measured
    return {"median above median": median_above / trials, "mis-measured": mis_measured / trials}

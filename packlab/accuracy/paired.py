"""Paired differences of accuracy, seed by seed, with an interval, a verdict and the smallest detectable difference.

**Why pairs.** Seed ``s`` trains from the same initial weights, with the same per-seed
randomness, in both conditions (:mod:`.instrument`). The seed's own luck (a good or bad
start) then moves both accuracies together, and the difference ``A_s - B_s`` keeps mostly
what the conditions changed. Comparing the two *sets* of accuracies instead (as a rank test
of two groups does) would leave that luck in, and need many more seeds for the same
sensitivity.

**The interval.** For ``n`` differences take every average of two of them (each one with
itself included: ``n (n + 1) / 2`` "Walsh averages"); their median is the estimate (the
Hodges-Lehmann estimator: one wild seed moves it no more than any other). Sorted, they give
the interval that Wilcoxon's signed-rank test gives: drop the ``c`` smallest and ``c``
largest, where ``c`` is the test's critical value: were the conditions the same (each
difference as likely positive as negative), a sum of positive ranks of ``c`` or less would
have a chance of at most half of :data:`packlab.bench.FALSE_CLEAR_RATE`. So at 98 % the
interval leaves out 0, for two conditions that do not differ, at most 2 % of the time:
the same promise :func:`packlab.bench.compare` makes for speed. It assumes the differences
are symmetric around their centre, nothing about their shape. With 6 seeds or fewer no
interval at 98 % exists (even 6 differences of one sign happen by chance 2 x 1/64 = 3.1 %
of the time): the verdict is then never "clear".

**No ratio floor.** :func:`packlab.bench.compare` also asks two speeds to differ by 5 % before
calling them clear, because a speed that changes by less is not worth a change of loader.
Accuracy has no such threshold: at 90 %, 5 % would be 4.5 points, far more than any loader
shortcut costs, so such a floor would declare every real effect a null by construction. The
verdict here is clear whenever the interval leaves out 0, and the interval itself says
whether the difference is large enough to matter.

**Smallest detectable difference.** A "no clear difference" means little on its own: the
conditions may not differ, or the seeds may be too few to see it. Beside every verdict
:func:`paired_difference` therefore reports the true difference this comparison would call
clear 80 % of the time, from the observed spread of the differences ``sd`` and their
number ``n``::

    detectable = (t(1 - alpha / 2, n - 1) + t(power, n - 1)) * sd / sqrt(n) / sqrt(3 / pi)

the paired t-test's power formula (``t(p, df)``: Student's quantile; ``alpha``: 2 %;
``power``: 80 %), widened by the signed-rank test's efficiency relative to the t-test on
normally spread differences (3 / pi, about 0.95: the signed-rank test needs about 5 % more
seeds for the same power). It is an approximation: it takes the observed ``sd`` for the
true one. :func:`packlab.accuracy.conditions.planted_effect_power` checks it on planted effects.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from packlab.bench import FALSE_CLEAR_RATE

#: The power at which :func:`paired_difference` reports the smallest detectable difference.
POWER = 0.8


@dataclass(frozen=True)
class PairedDifference:
    """How much condition A's accuracy exceeds B's, in points, from ``seeds`` paired seeds.

    ``estimate``: the Hodges-Lehmann estimate; ``low``..``high``: its interval at ``level``
    (infinite when too few seeds); ``clear``: the interval leaves out 0; ``detectable``: the
    smallest true difference this comparison would find clear with 80 % chance (see the
    module's docstring).
    """

    estimate: float
    low: float
    high: float
    clear: bool
    detectable: float
    seeds: int
    level: float = 1 - FALSE_CLEAR_RATE

    def text(self, unit: str = " points") -> str:
        """``"+1.2 points (0.4 to 2.0)"``, or for a null ``"+0.3 points (-0.5 to 1.1), could have seen 1.4"``."""
        if not math.isfinite(self.low):
            return f"{self.estimate + 0.0:+.1f}{unit} (too few seeds for an interval)"
        d = self.decimals()
        # Adding 0.0 turns a negative zero into a plain one: "-0.0" would claim a sign that is not there.
        estimate, low, high = (round(v, d) + 0.0 for v in (self.estimate, self.low, self.high))
        text = f"{estimate:+.{d}f}{unit} ({low:+.{d}f} to {high:+.{d}f})"
        return text if self.clear else f"{text}, could have seen {self.detectable:.1f}"

    def decimals(self) -> int:
        """One decimal, or more where one would round a clear interval's bound onto 0: a printed "(-1.1 to +0.0)"
        beside "clearly lower" would contradict the verdict it explains."""
        d = 1
        while self.clear and d < 4 and 0 in (round(self.low, d), round(self.high, d)):
            d += 1
        return d


@lru_cache(maxsize=None)
def signed_rank_counts(n: int) -> tuple[int, ...]:
    """How many of the ``2 ** n`` sign patterns of ranks 1..n give each sum of positive ranks (0 .. n(n+1)/2)."""
    counts = [1]
    for rank in range(1, n + 1):
        longer = counts + [0] * rank
        for total, ways in enumerate(counts):
            longer[total + rank] += ways
        counts = longer
    return tuple(counts)


def excluded_per_side(n: int, level: float = 1 - FALSE_CLEAR_RATE) -> int:
    """``c``: the Walsh averages to drop at each end for an interval at ``level`` from ``n`` pairs; -1 if none exists.

    The largest ``c`` with P(sum of positive ranks <= c) <= (1 - level) / 2 for conditions that do not differ: the
    signed-rank test's critical value. At most ``c`` Walsh averages at or below 0 is the test's rejection, so the
    interval leaves out 0 exactly when the test calls the difference clear (without ties).
    """
    counts = signed_rank_counts(n)
    below, critical = 0, -1
    for total, ways in enumerate(counts):
        below += ways
        if below / 2 ** n > (1 - level) / 2:
            break
        critical = total
    return critical


@lru_cache(maxsize=None)
def student_quantile(p: float, df: int) -> float:
    """Student's t quantile, by bisection on the distribution function (Simpson's rule on the density)."""
    if not 0 < p < 1:
        raise ValueError("p must lie strictly between 0 and 1")
    if p < 0.5:
        return -student_quantile(1 - p, df)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float, steps: int = 400) -> float:
        h = x / steps
        density = [math.exp(log_norm - (df + 1) / 2 * math.log1p((i * h) ** 2 / df)) for i in range(steps + 1)]
        return 0.5 + h / 3 * (density[0] + density[-1] + 4 * sum(density[1:-1:2]) + 2 * sum(density[2:-1:2]))

    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, 2 * high
    for _ in range(50):
        middle = (low + high) / 2
        low, high = (middle, high) if cdf(middle) < p else (low, middle)
    return (low + high) / 2


def detectable_difference(sd: float, n: int, level: float = 1 - FALSE_CLEAR_RATE, power: float = POWER) -> float:
    """The smallest true paired difference found clear with chance ``power`` from ``n`` pairs of spread ``sd``
    (the formula in the module's docstring); infinite when ``n`` allows no interval."""
    if n < 2 or excluded_per_side(n, level) < 0:
        return math.inf
    quantiles = student_quantile(1 - (1 - level) / 2, n - 1) + student_quantile(power, n - 1)
    return quantiles * sd / math.sqrt(n) / math.sqrt(3 / math.pi)


def paired_difference(a: Sequence[float], b: Sequence[float], level: float = 1 - FALSE_CLEAR_RATE,
                      power: float = POWER) -> PairedDifference:
    """A minus B, seed by seed (``a[i]`` and ``b[i]`` are the same seed), in the units given (points of accuracy)."""
    differences = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = len(differences)
    if n == 0 or len(a) != len(b):
        raise ValueError(f"need the same, non-zero number of seeds in both conditions, got {len(a)} and {len(b)}")
    i, j = np.triu_indices(n)
    walsh = np.sort((differences[i] + differences[j]) / 2)
    estimate = float(statistics.median(walsh))
    c = excluded_per_side(n, level)
    if c < 0:
        low, high = -math.inf, math.inf
    else:
        low, high = float(walsh[c]), float(walsh[-c - 1])
    spread = float(np.std(differences, ddof=1)) if n > 1 else math.inf
    return PairedDifference(estimate, low, high, bool(low > 0 or high < 0),
                            detectable_difference(spread, n, level, power), n, level)

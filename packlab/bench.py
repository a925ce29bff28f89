"""Time data loaders honestly.

:func:`time_loader` iterates a DataLoader (or any iterable of batches) for a few epochs
and records, per epoch, the wall time, and for the first epoch the time to the first
batch (worker start-up, opening files, filling the prefetch queue). Throughput is
reported as an average over *all* epochs, start-up included, because that is what a
training job pays; the per-epoch times show how much of it is start-up.

Results print as a small table; several results side by side make a
:class:`BenchTable`::

    >>> result = time_loader(loader, epochs=2, name="folder, 2 workers")
    >>> print(result)               # doctest: +SKIP
    >>> BenchTable([r0, r1, r2])    # renders as a table in a notebook
"""

from __future__ import annotations

import functools
import os
import re
import statistics
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch


def batch_size_of(batch) -> int:
    """Number of samples in a batch: the length of its first tensor (or of the batch itself)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    if isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (int, float, str, bytes)):
        batch = batch[0]
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    return len(batch)


@dataclass
class BenchResult:
    """What :func:`time_loader` measured for one loader configuration."""

    name: str
    epoch_seconds: list[float]
    images_per_epoch: int
    first_batch_seconds: float
    bytes_per_epoch: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def total_seconds(self) -> float:
        return sum(self.epoch_seconds)

    @property
    def images_per_s(self) -> float:
        """Images per second over all epochs, start-up included."""
        return self.images_per_epoch * len(self.epoch_seconds) / self.total_seconds

    @property
    def mb_per_s(self) -> float | None:
        """Megabytes (10^6 bytes) read from storage per second, when ``bytes_per_epoch`` is known."""
        if self.bytes_per_epoch is None:
            return None
        return self.bytes_per_epoch * len(self.epoch_seconds) / self.total_seconds / 1e6

    def row(self) -> dict:
        """The result as one table row (rounded for display)."""
        row = {
            "loader": self.name,
            "epochs": len(self.epoch_seconds),
            "s/epoch": " / ".join(f"{s:.2f}" for s in self.epoch_seconds),
            "images/s": round(self.images_per_s),
            "MB/s": None if self.mb_per_s is None else round(self.mb_per_s, 1),
            "first batch (s)": round(self.first_batch_seconds, 2),
        }
        row.update(self.extra)
        return row

    def to_dict(self) -> dict:
        """Raw numbers, for JSON."""
        out = asdict(self)
        out.update(images_per_s=self.images_per_s, mb_per_s=self.mb_per_s)
        return out

    def __str__(self) -> str:
        return str(BenchTable([self]))

    def _repr_html_(self) -> str:
        return BenchTable([self])._repr_html_()


class BenchTable:
    """Several :class:`BenchResult` rows, printable as text and rendered as HTML in notebooks."""

    def __init__(self, results: Sequence[BenchResult]):
        self.results = list(results)

    def rows(self) -> list[dict]:
        return [r.row() for r in self.results]

    def _columns(self) -> list[str]:
        columns: list[str] = []
        for row in self.rows():
            columns += [c for c in row if c not in columns]
        return columns

    def __str__(self) -> str:
        columns = self._columns()
        cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in self.rows()]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        columns = self._columns()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape('' if r.get(c) is None else str(r.get(c)))}</td>" for c in columns) + "</tr>"
            for r in self.rows()
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_table(rows: Sequence[dict]):
    """Rows of dicts (same keys) as a Markdown table, displayed as a table in a notebook."""
    from IPython.display import Markdown

    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join("" if row.get(c) is None else str(row.get(c)) for c in columns) + " |" for row in rows]
    return Markdown("\n".join(lines))


def time_loader(
    loader: Iterable,
    epochs: int = 2,
    name: str | None = None,
    bytes_per_epoch: int | None = None,
    on_batch: Callable | None = None,
) -> BenchResult:
    """Iterate ``loader`` for ``epochs`` full passes and time each one.

    ``on_batch(batch)``, if given, is called on every batch inside the timed region
    (use it to model a consumer, or to touch the data so nothing is lazily skipped).
    ``bytes_per_epoch`` (e.g. the archive's size on disk) turns the timing into MB/s.
    """
    if epochs < 1:
        raise ValueError("epochs must be at least 1")
    epoch_seconds: list[float] = []
    first_batch = float("nan")
    counts = []
    for epoch in range(epochs):
        if hasattr(getattr(loader, "dataset", None), "set_epoch"):
            loader.dataset.set_epoch(epoch)
        count = 0
        start = time.perf_counter()
        for batch in loader:
            if count == 0 and epoch == 0:
                first_batch = time.perf_counter() - start
            count += batch_size_of(batch)
            if on_batch is not None:
                on_batch(batch)
        epoch_seconds.append(time.perf_counter() - start)
        counts.append(count)
    if len(set(counts)) != 1:
        raise RuntimeError(f"epochs delivered different numbers of samples: {counts}")
    if counts[0] == 0:
        raise RuntimeError("the loader delivered no samples")
    return BenchResult(
        name=name or type(loader).__name__,
        epoch_seconds=epoch_seconds,
        images_per_epoch=counts[0],
        first_batch_seconds=first_batch,
        bytes_per_epoch=bytes_per_epoch,
    )


def run_until_error(loader: Iterable) -> tuple[int, BaseException | None]:
    """Iterate one epoch; return ``(complete batches received, the exception raised or None)``.

    For showing a loader fail without ending the notebook or test. The exception comes
    back with its traceback's frames cleared: those frames reference the DataLoader
    iterator, and while it lives its worker processes live too. Clearing them lets the
    iterator go now, so the workers shut down at once rather than at some later garbage
    collection (which can stall for seconds per worker).
    """
    iterator = iter(loader)
    batches = 0
    try:
        for _ in iterator:
            batches += 1
    except Exception as exc:  # noqa: BLE001 - the caller decides which errors it expected
        traceback.clear_frames(exc.__traceback__)
        return batches, exc
    finally:
        del iterator
    return batches, None


def time_per_item(fn: Callable, items: Sequence, repeat: int = 1) -> float:
    """Mean seconds per call of ``fn(item)`` over ``items`` (best of ``repeat`` passes).

    For timing one stage of a pipeline on its own, e.g. decode on bytes already in memory.
    """
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - start)
    return best / len(items)


# ------------------------------------------------ repeated, interleaved measurements
#
# On a shared machine one run of a measurement says little: the load changes from one
# second to the next. A comparison the prose draws a conclusion from is therefore made
# of several runs of each contender, interleaved (A, B, A, B, ... rather than A, A, A,
# B, B, B) so that a busy minute hits every contender alike, and it is called "clear"
# only when an exact rank test says that such a split of the runs would rarely happen by
# chance (see compare()). That test assumes the runs of two equal contenders are
# exchangeable; interleaving alone does not make them so when the *position* in a round
# matters, which is why interleaved() also counterbalances the order (see round_orders()).


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one quantity: the median a sentence follows, and the range it shows.

    Iterating a spread gives its measurements, so ``Spread.of(1e3 * v for v in spread)``
    converts units; ``f"{spread}"`` and ``spread.format(".1f")`` give ``"452 (409–470)"``.
    """

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        values = tuple(float(v) for v in values)
        if not values:
            raise ValueError("a spread needs at least one measurement")
        return cls(values)

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def overlaps(self, other: Spread) -> bool:
        """Whether the two ranges (min to max) share any value: then neither is clearly higher."""
        return self.low <= other.high and other.low <= self.high

    def scaled(self, factor: float) -> Spread:
        """The same measurements in other units (``factor=1e3``: seconds to milliseconds)."""
        return Spread(tuple(v * factor for v in self.values))

    def format(self, spec: str = ".0f") -> str:
        """``"452 (409–470)"``: the median, then the range, each formatted with ``spec``."""
        return f"{self.median:{spec}} ({self.low:{spec}}\u2013{self.high:{spec}})"

    text = format

    def __format__(self, spec: str) -> str:
        return self.format(spec or ".0f")

    __str__ = format


#: Rounds of :func:`interleaved` unless told otherwise: the fewest with which :func:`compare`
#: can call a 1.3x difference clear most of the time under steady noise (see its docstring).
#: With more than two contenders :func:`default_rounds` rounds it up to a whole number of
#: balanced blocks.
ROUNDS = 6
#: Rounds of :func:`interleaved` with ``cheap=True``, for work whose round costs a fraction of
#: a second (microseconds per item). On a shared machine some runs are outliers: a run that
#: another program interrupts takes several times as long. Six runs each cannot survive one:
#: :func:`compare` may lose at most 3 of 36 pairs, and one slow run of the faster contender
#: loses about 5, so a real 1.3x difference is found only when the faster one had no outlier
#: at all (with one run in six slow, a third of the time). No test that assumes nothing about
#: the noise does much better with six runs, because no split of twelve runs is rare enough
#: to be called clear while one of the faster contender's runs sits at the bottom. Twenty
#: runs each give 400 pairs, of which the rule may lose about a quarter: three or four
#: outliers then cost a verdict nothing (:mod:`packlab.simulated_runs` measures it, and
#: ``tests/test_simulated_runs.py`` holds it to at least 80 %).
CHEAP_ROUNDS = 20
#: How :func:`interleaved` orders the contenders within each round.
ORDERS = ("balanced", "shuffled", "fixed")


def balanced_block(count: int) -> list[list[int]]:
    """Rows of a Williams design for ``count`` contenders: the orders of one balanced block of rounds.

    In a block every contender runs in every position equally often, and (for an even
    ``count``; for an odd one the block is the square and its mirror, twice as long) every
    contender runs right after every other equally often. So whatever a position costs
    (the first run of a round meets a colder cache) or a predecessor leaves behind (a
    multi-process ceiling just before a loader), each contender pays it equally.
    """
    if count < 1:
        raise ValueError("a block needs at least one contender")
    first, low, high = [0], 1, count - 1
    while len(first) < count:  # 0, 1, n-1, 2, n-2, ...: each difference between neighbours once
        first.append(low)
        low += 1
        if len(first) < count:
            first.append(high)
            high -= 1
    rows = [[(value + shift) % count for value in first] for shift in range(count)]
    if count % 2 and count > 1:
        rows += [row[::-1] for row in rows]
    return rows


def default_rounds(count: int, at_least: int = ROUNDS) -> int:
    """Rounds for ``count`` contenders: at least ``at_least``, a whole number of balanced blocks where that
    costs at most one block more than ``at_least`` (2 or 3 contenders: 6; 4: 8; 5: 10), else ``at_least``."""
    block = len(balanced_block(count)) if count > 1 else 1
    rounded = -(-at_least // block) * block
    return rounded if rounded - at_least < block and rounded <= 2 * at_least else at_least


def round_orders(count: int, rounds: int, order: str = "balanced", seed: int | None = 0) -> list[list[int]]:
    """The order of ``count`` contenders (0 … count-1) in each of ``rounds`` rounds.

    * ``"balanced"``: whole blocks of :func:`balanced_block`, each with the contenders dealt
      to its symbols at random and its rows shuffled (seeded by ``seed``; ``None`` draws a
      fresh seed). Every contender runs in every position equally often when ``rounds`` is
      a multiple of the block (:func:`default_rounds`), and as nearly so as the rounds allow
      otherwise (off by one: with the chapters' five rounds, two equal contenders whose
      first run of a round is 15 % slower were still called different in well under 2 % of
      2,000 simulated comparisons, :mod:`packlab.simulated_runs`).
    * ``"shuffled"``: a fresh random order each round. The positions then even out only on
      average, so a position effect still leaks into the verdicts (chapter 1 measures how often).
    * ``"fixed"``: the order the contenders were given, every round, for a caller whose
      measurement needs it (and says why).
    """
    import random

    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, not {order!r}")
    if order == "fixed" or count < 2:
        return [list(range(count)) for _ in range(rounds)]
    rng = random.Random(seed)
    if order == "shuffled":
        return [rng.sample(range(count), count) for _ in range(rounds)]
    orders: list[list[int]] = []
    while len(orders) < rounds:
        symbols = rng.sample(range(count), count)  # which contender plays symbol 0, 1, ...
        block = [[symbols[v] for v in row] for row in balanced_block(count)]
        rng.shuffle(block)
        orders += block
    return orders[:rounds]


#: make test's many-cores phases run every notebook as a crash test (every line, with the
#: workers such a machine starts), not for its verdicts: this variable caps the rounds of every
#: measurement there (:mod:`packlab.course.testrun`). Never set it where the numbers are read.
CRASH_TEST_ROUNDS_VAR = "PACKLAB_CRASH_TEST_ROUNDS"


def crash_test_rounds(rounds: int) -> int:
    """``rounds``, or fewer under make test's crash-test cap (``$PACKLAB_CRASH_TEST_ROUNDS``)."""
    cap = os.environ.get(CRASH_TEST_ROUNDS_VAR, "").strip()
    return min(rounds, max(1, int(cap))) if cap.isdigit() else rounds


#: At most this many seeds per condition (a planted effect's whole pool) under the crash-test cap.
CRASH_TEST_SEEDS = 4


def crash_test_count(count: int, cap: int = CRASH_TEST_SEEDS) -> int:
    """``count`` seeds (or runs of a pool), or at most ``cap`` under make test's crash-test cap.

    Chapter 13's accuracy instrument trains the same seeds whatever the core count; the
    many-cores passes check that it runs with that many processes, the full-data pass that
    its numbers and sentences come out right, so the first trains a few seeds only.
    """
    return min(count, cap) if os.environ.get(CRASH_TEST_ROUNDS_VAR, "").strip().isdigit() else count


def interleaved(runs: dict[str, Callable[[], float]], rounds: int | None = None, order: str = "balanced",
                seed: int | None = 0, cheap: bool = False) -> dict[str, Spread]:
    """Call every function of ``runs`` once per round for ``rounds`` rounds, in counterbalanced order: ``{name: Spread}``.

    Each function returns one number (images/s, seconds, ...), e.g.
    ``lambda: time_loader(make_loader(), epochs=1).images_per_s``.

    Why the order changes from round to round: :func:`compare` asks whether the runs of
    two contenders are split more unevenly than chance would split runs that are
    exchangeable. If A always ran first and B second, anything the first position costs
    (a colder cache, a machine whose load falls while a cell runs) would go to A every
    time and split two equal contenders 6:0. So by default (``order="balanced"``, see
    :func:`round_orders`) every contender runs in every position, and after every other
    contender, equally often; a plain random order per round is not enough (chapter 1
    measures both). ``rounds`` defaults to :func:`default_rounds`: six for two or three
    contenders, enough for :func:`compare` to call a real 1.3x difference clear under steady
    noise; with fewer than five runs it can never call anything clear. ``cheap=True`` says a
    round costs a fraction of a second (work timed in microseconds per item): the default
    then becomes :data:`CHEAP_ROUNDS` (twenty, rounded up to whole balanced blocks), which
    keeps the verdict's power when a few runs are outliers. An explicit ``rounds`` wins.

    Why more rounds and not a paired test on each round's ratio: pairing helps when a
    round's runs share their disturbance (a load that shifts between rounds, which the
    balanced order already spreads evenly). An outlier here is one run taking several
    times as long, and it spoils its round's ratio completely; a sign test on twenty
    rounds' ratios may lose only four of them, and a signed-rank test weighs the spoiled
    ratio most of all, while the rank test over all 400 pairs of runs loses only the pairs
    the slow run is in. In a simulation of 5 % noise with one run in six three times as
    long, twenty rounds found a real 1.3x difference about 98 % of the time with the rank
    test, 88 % with the sign test and 49 % with the signed-rank test.
    """
    names = list(runs)
    if rounds is None:
        rounds = default_rounds(len(names), CHEAP_ROUNDS if cheap else ROUNDS)
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    rounds = crash_test_rounds(rounds)
    values: dict[str, list[float]] = {name: [] for name in names}
    for turn in round_orders(len(names), rounds, order, seed):
        for index in turn:
            values[names[index]].append(float(runs[names[index]]()))
    return {name: Spread(tuple(v)) for name, v in values.items()}


def repeat(measure: Callable[[], float], rounds: int = 5) -> Spread:
    """``rounds`` calls of one measure, e.g. the seconds one ``zipfile.ZipFile(path).close()`` takes."""
    return interleaved({"": measure}, rounds)[""]


def seconds_of(fn: Callable[[], object]) -> Callable[[], float]:
    """A measure for :func:`interleaved`: the wall-clock seconds one call of ``fn()`` takes."""

    def measure() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return measure


#: The largest chance, for two contenders that do not differ at all, that :func:`compare`
#: calls them clearly different anyway.
FALSE_CLEAR_RATE = 0.02
#: The smallest ratio of medians :func:`compare` calls clear, however consistent the runs.
MIN_RATIO = 1.05


def rank_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    """Mann-Whitney's U: of all pairs (one run of ``a``, one of ``b``), how many ``a`` won (ties count half)."""
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in a for y in b)


@functools.lru_cache(maxsize=64)
def _rank_statistic_counts(n: int, m: int) -> tuple[int, ...]:
    """``counts[u]``: of the ``comb(n + m, n)`` ways to deal ``n + m`` distinct values into
    groups of ``n`` and ``m``, how many give the first group a :func:`rank_statistic` of ``u``."""
    # ways[i][j][u]: deals of the i + j smallest values, i of them to the first group, with U = u.
    # The next value wins against every value already dealt to the other group.
    ways = [[[0] * (n * m + 1) for _ in range(m + 1)] for _ in range(n + 1)]
    ways[0][0][0] = 1
    for i in range(n + 1):
        for j in range(m + 1):
            for u, count in enumerate(ways[i][j]):
                if not count:
                    continue
                if i < n:
                    ways[i + 1][j][u + j] += count
                if j < m:
                    ways[i][j + 1][u] += count
    return tuple(ways[n][m])


def chance_of_split(a: Sequence[float], b: Sequence[float]) -> float:
    """How often runs of two equal contenders would be split at least as unevenly as ``a`` against ``b``.

    If ``a`` and ``b`` measure the same thing, every way of dealing the pooled runs into
    groups of ``len(a)`` and ``len(b)`` is equally likely. This is the share of those
    deals whose :func:`rank_statistic` lies at least as far from the even split
    (``len(a) * len(b) / 2``) as the observed one, in either direction: the exact,
    two-sided p-value of the Mann-Whitney test. It assumes nothing about the shape of the
    noise. Without ties the deals are counted once per group size; with ties they are
    dealt one by one (up to 20,000 of them, beyond that the normal approximation is used).
    """
    from itertools import combinations
    from math import comb, erfc, sqrt

    n, m = len(a), len(b)
    if not n or not m:
        raise ValueError("both contenders need at least one run")
    even = n * m / 2
    distance = abs(rank_statistic(a, b) - even) - 1e-9
    pooled = [*a, *b]
    if len(set(pooled)) == n + m:
        counts = _rank_statistic_counts(n, m)
        return sum(c for u, c in enumerate(counts) if abs(u - even) >= distance) / comb(n + m, n)
    if comb(n + m, n) <= 20_000:
        hits = total = 0
        for chosen in combinations(range(n + m), n):
            picked = set(chosen)
            group = [pooled[i] for i in chosen]
            rest = [pooled[i] for i in range(n + m) if i not in picked]
            hits += abs(rank_statistic(group, rest) - even) >= distance
            total += 1
        return hits / total
    spread = sqrt(n * m * (n + m + 1) / 12)
    return erfc(max(distance - 0.5, 0.0) / spread / sqrt(2))


@dataclass(frozen=True)
class RatioInterval:
    """How many times ``b`` a contender ``a`` is, with the range the true ratio lies in (see :func:`ratio_interval`).

    ``estimate`` is the median of the ratios of all pairs (a run of ``a`` over a run of
    ``b``); ``low`` and ``high`` bound the true ratio with confidence ``level``. Without
    enough runs for any interval ``low`` is 0 and ``high`` infinite.
    """

    estimate: float
    low: float
    high: float
    level: float

    @property
    def bounded(self) -> bool:
        return self.low > 0 and self.high < float("inf")

    def excludes_one(self) -> bool:
        """Whether the interval leaves out "no difference": then the rank test calls the runs split unevenly."""
        return self.low > 1 or self.high < 1

    def inverted(self) -> RatioInterval:
        """The same interval for ``b`` against ``a``."""
        return RatioInterval(1 / self.estimate, 1 / self.high if self.high < float("inf") else 0.0,
                             1 / self.low if self.low > 0 else float("inf"), self.level)

    def range_text(self) -> str:
        """``"2.1–3.4x"``, each bound with the decimals that keep it on its own side of 1."""
        if not self.bounded:
            return "too few runs for an interval"
        low, high = ratio_number(self.low), ratio_number(self.high)
        if low == high and self.low != self.high:  # a narrow interval: enough decimals to show it is one
            low, high = ratio_number(self.low, 4), ratio_number(self.high, 4)
        return f"{low}\u2013{high}x"

    def text(self) -> str:
        """``"2.7x, 2.1–3.4x"``: the estimate, then the interval (the form a bracket in a sentence holds)."""
        return f"{ratio_number(self.estimate)}x, {self.range_text()}"

    __str__ = text


def ratio_number(value: float, decimals: int = 2) -> str:
    """A ratio with ``decimals`` decimals, or more where they would round it onto 1 (``1.003`` is ``"1.003"``,
    never ``"1.00"``): printed bounds then sit on the same side of 1 as the numbers they show."""
    if abs(value) >= 10:  # "400.00x" claims a precision no run has; two significant digits or more
        decimals = 1 if abs(value) < 100 else 0
    for decimals in range(decimals, 6):
        text = f"{value:.{decimals}f}"
        if value == 1 or float(text) != 1:
            return text
    return f"{value:.6f}"


def _lost_pairs_bound(n: int, m: int, rate: float) -> int:
    """The most pairs (of ``n * m``) a contender may lose while the split is still rarer than ``rate``
    for equal contenders (two-sided); -1 when even a clean sweep is not that rare."""
    from math import comb, sqrt
    from statistics import NormalDist

    if n * m > 1600:  # the exact table grows as (n * m) ** 2; beyond 40 runs each the normal law is close
        z = NormalDist().inv_cdf(1 - rate / 2)
        return int((n * m / 2 - z * sqrt(n * m * (n + m + 1) / 12)) - 0.5)
    counts, total = _rank_statistic_counts(n, m), comb(n + m, n)
    lost, below = -1, 0
    while 2 * (below + counts[lost + 1]) / total <= rate:
        lost += 1
        below += counts[lost]
    return lost


def ratio_interval(a: Spread, b: Spread, level: float | None = None) -> RatioInterval | None:
    """``a`` against ``b`` as a ratio with its interval (Hodges–Lehmann, with the interval the rank test gives).

    Take every pair of runs, one of ``a`` and one of ``b``, and their ratio: ``len(a) *
    len(b)`` ratios, the same pairs :func:`rank_statistic` counts. Their median is the
    estimate, a "typical" ratio that one outlier moves no more than any other run (the
    Hodges–Lehmann estimator, on logarithms). Sorted, they also give the interval: drop
    the ``k`` smallest and ``k`` largest ratios, where ``k`` is the most pairs a contender
    may lose while :func:`compare` still calls the split uneven. So at the default
    ``level`` (``1 - FALSE_CLEAR_RATE``: 98 %) the interval leaves out 1 exactly when the
    rank test calls the runs split unevenly (exactly, for runs without ties and up to 40
    each), and a sentence cannot print "clear" beside an interval that holds 1, or the
    reverse. The interval assumes what the test assumes
    (runs that differ by a factor and are otherwise exchangeable), nothing about the shape
    of the noise. None when a run is not positive or not finite (a ratio then means nothing).
    """
    import math

    level = 1 - FALSE_CLEAR_RATE if level is None else level
    if min(a.low, b.low) <= 0 or not all(math.isfinite(v) for v in (*a, *b)):
        return None
    middle, low, high = difference_interval(Spread.of(map(math.log, a)), Spread.of(map(math.log, b)), level)
    return RatioInterval(math.exp(middle), math.exp(low), math.exp(high), level)


def difference_interval(a: Spread, b: Spread, level: float | None = None) -> tuple[float, float, float]:
    """``(estimate, low, high)`` of how much ``a`` exceeds ``b``, in their units: :func:`ratio_interval` on
    differences instead of ratios, for quantities that add rather than multiply (accuracy in points).
    Without enough runs for an interval, ``low`` and ``high`` are infinite."""
    level = 1 - FALSE_CLEAR_RATE if level is None else level
    differences = sorted(x - y for x in a for y in b)
    middle = float(statistics.median(differences))
    k = _lost_pairs_bound(len(a), len(b), 1 - level)
    if k < 0:
        return middle, float("-inf"), float("inf")
    return middle, differences[k], differences[-k - 1]


def interval_note(a: Spread, b: Spread, estimate: bool = True) -> str:
    """``"1.38x, 1.21–1.60x"``: :func:`ratio_interval` of ``a`` over ``b`` as text, or ``""`` where it means nothing.

    The note a sentence adds to its verdict (``estimate=False``: ``"interval 1.21–1.60x"``, for
    a sentence that states the ratio of the medians itself): a clear verdict gets the size of its
    difference and how sure it is, a "no clear difference" how large a difference could
    still hide in the noise. Where the verdict is not clear although the interval leaves
    out 1, the difference was real but under :data:`MIN_RATIO`, and the note says so.
    """
    interval = ratio_interval(a, b)
    if interval is None:
        return ""
    # ``estimate=False`` for a sentence that already states a ratio (of the medians): one number, not two
    text = interval.text() if estimate else f"interval {interval.range_text()}"
    if compare(a, b) == 0 and interval.bounded and interval.excludes_one():
        text += f", under the {100 * (MIN_RATIO - 1):.0f} % the rule asks"
    return text


def compare(a: Spread, b: Spread) -> int:
    """1 if ``a`` is clearly higher than ``b``, -1 if clearly lower, 0 if the runs cannot tell.

    "Clearly" means two things at once:

    * the runs are split so unevenly that two equal contenders would be split like that
      at most :data:`FALSE_CLEAR_RATE` (2 %) of the time (:func:`chance_of_split`, an exact
      rank test: no assumption about the noise, and one slow run moves it no more than
      any other losing run);
    * the medians differ by at least :data:`MIN_RATIO` (5 %): below that a difference
      decides nothing about a loader, and printed as "1.0x" it reads as none.

    Why six runs each (:data:`ROUNDS`): with four runs each the most uneven split (a clean
    sweep) still happens to equal contenders 2 times in 70, about 2.9 %, so fewer than
    five runs can never be called clear. Five runs each may lose one of their 25 pairs
    (a chance of 4 in 252, 1.6 %); six may lose three of their 36. Under 10 % noise that
    finds a real 1.3x difference most of the time at five runs and more often at six,
    while calling two equal contenders different under 2 % of the time (chapter 1 computes
    both; ``tests/test_bench.py`` checks them, with and without a position effect). The
    test needs runs that are exchangeable when nothing differs: :func:`interleaved`
    counterbalances their order for that. The old rule, ranges of three runs that do not
    overlap, called equal contenders different 10 % of the time.

    Six runs have no room for an outlier, though: one run of the faster contender taking
    three times as long loses about five pairs on its own, so on a shared machine a real
    difference is often missed. Work cheap enough to repeat runs :data:`CHEAP_ROUNDS`
    (``interleaved(..., cheap=True)``), and every sentence prints :func:`ratio_interval`
    beside its verdict, so a "no clear difference" shows how large a difference it could
    have missed.
    """
    if chance_of_split(a.values, b.values) > FALSE_CLEAR_RATE:
        return 0
    high, low = max(a.median, b.median), min(a.median, b.median)
    if low <= 0 or high / low < MIN_RATIO:
        return 0
    return 1 if a.median > b.median else -1


#: What :func:`with_note` adds to a phrase: a bracket holding a ratio's estimate and interval, or the interval alone.
INTERVAL_NOTE = re.compile(r" \((?:[0-9.]+x, )?(?:[0-9.]+\u2013[0-9.]+x|too few runs for an interval)"
                           r"(?:, under the \d+ % the rule asks)?\)")


def without_interval_notes(text: str) -> str:
    """``text`` with every bracket :func:`with_note` added taken out: the words of the verdicts alone."""
    return INTERVAL_NOTE.sub("", text)


def with_note(phrase: str, note: str) -> str:
    """``phrase`` with ``note`` in brackets, before the phrase's closing full stop if it has one."""
    if not note:
        return phrase
    if phrase.endswith("."):
        return f"{phrase[:-1]} ({note})."
    return f"{phrase} ({note})"


def verdict(a: Spread, b: Spread, more: str = "more", less: str = "less", same: str = "no clear difference",
            interval: bool = False) -> str:
    """How ``a`` compares with ``b``, in the caller's words: ``same`` unless :func:`compare` calls it clear.

    The bare words by default, because callers also use them as labels (the bottleneck
    grader's "loader", "consumer" or "unclear"). A sentence passes ``interval=True``: the
    words then end with ``a ÷ b`` and its interval (:func:`interval_note`), and "clearly
    slower (1.38x, 1.21–1.60x)" reads as "a took 1.38 times b, somewhere between 1.21 and
    1.60 times".
    """
    words = {1: more, -1: less, 0: same}[compare(a, b)]
    return with_note(words, interval_note(a, b)) if interval else words


def ratio_words(a: Spread, b: Spread, higher: str = "faster", lower: str = "slower", interval: bool = True) -> str:
    """``a`` against ``b`` in words, from the medians: ``"1.4 times faster (1.21–1.60x)"``, ``"1.2 times slower
    (…)"``, or ``"no clear difference (0.91–1.20x)"`` unless :func:`compare` calls it clear.

    The bracket holds the interval of the ratio the words state (:func:`ratio_interval`;
    for "slower", ``b`` over ``a``); ``interval=False`` leaves it out.
    """
    direction = compare(a, b)
    span = ratio_interval(a, b) if interval else None
    if direction == 0:
        return with_note("no clear difference", span.range_text() if span else "")
    ratio = a.median / b.median if direction > 0 else b.median / a.median
    if span is not None and direction < 0:
        span = span.inverted()
    return with_note(f"{ratio:.1f} times {higher if direction > 0 else lower}", span.range_text() if span else "")


def ranking(spreads: dict[str, Spread], higher: bool = True) -> list[tuple[str, bool | None]]:
    """The contenders best first, each with whether :func:`compare` calls it clearly behind the one ranked just above.

    Returns ``[(name, clear), ...]`` ordered by median (highest first, or lowest first
    with ``higher=False``, for seconds); ``clear`` is None for the first, and for every
    other whether the step from its neighbour above is clear. A sentence built on it
    walks down the ranks: "zip 3,205/s, 1.3x slower than lmdb; npz 1,968/s, no clear
    difference from zip; ...".

    Why neighbours, not the best against every other: a ranking of ``k`` contenders
    makes ``k - 1`` comparisons either way, but comparing each with the best reuses the
    best's runs every time (one unlucky spread of the best moves every verdict at once)
    and says nothing about the order of the others. Each neighbour step is a claim of
    its own, about two contenders next to each other. A chain of steps that are not
    clear does not make its ends equal, either: three contenders 4 % apart in turn may
    be clearly apart end to end. So read the steps as given, never as groups of ties.
    Each step is one verdict, with its own 2 % chance of a false "clear" (see
    :func:`compare`); a ranking of seven contenders makes six of them.
    """
    sign = 1 if higher else -1
    names = sorted(spreads, key=lambda name: -sign * spreads[name].median)
    steps: list[tuple[str, bool | None]] = []
    for above, name in zip([None, *names], names):
        steps.append((name, None if above is None else compare(spreads[above], spreads[name]) == sign))
    return steps


def spread_table(spreads: dict[str, Spread], quantity: str = "images/s", fmt: str = ".0f", label: str = "loader"):
    """``{name: Spread}`` as a Markdown table: median, min–max and number of runs per row."""
    return markdown_table([
        {label: name, f"{quantity}, median": f"{s.median:{fmt}}", "min–max": f"{s.low:{fmt}}–{s.high:{fmt}}",
         "runs": len(s)}
        for name, s in spreads.items()
    ])


@contextmanager
def torch_threads(count: int):
    """Run a block with torch's intra-op thread pool set to ``count`` threads, then restore it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


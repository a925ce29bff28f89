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
#: can call a 1.3x difference clear most of the time (see its docstring). With more than two
#: contenders :func:`default_rounds` rounds it up to a whole number of balanced blocks.
ROUNDS = 6
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
      otherwise.
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


def interleaved(runs: dict[str, Callable[[], float]], rounds: int | None = None, order: str = "balanced",
                seed: int | None = 0) -> dict[str, Spread]:
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
    contenders, enough for :func:`compare` to call a real 1.3x difference clear; with
    fewer than five runs it can never call anything clear.
    """
    names = list(runs)
    rounds = default_rounds(len(names)) if rounds is None else rounds
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
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
    """
    if chance_of_split(a.values, b.values) > FALSE_CLEAR_RATE:
        return 0
    high, low = max(a.median, b.median), min(a.median, b.median)
    if low <= 0 or high / low < MIN_RATIO:
        return 0
    return 1 if a.median > b.median else -1


def verdict(a: Spread, b: Spread, more: str = "more", less: str = "less", same: str = "no clear difference") -> str:
    """How ``a`` compares with ``b``, in the caller's words: ``same`` unless :func:`compare` calls it clear."""
    return {1: more, -1: less, 0: same}[compare(a, b)]


def ratio_words(a: Spread, b: Spread, higher: str = "faster", lower: str = "slower") -> str:
    """``a`` against ``b`` in words, from the medians: ``"1.4 times faster"``, ``"1.2 times slower"``,
    or ``"no clear difference"`` unless :func:`compare` calls it clear."""
    direction = compare(a, b)
    if direction == 0:
        return "no clear difference"
    ratio = a.median / b.median if direction > 0 else b.median / a.median
    return f"{ratio:.1f} times {higher if direction > 0 else lower}"


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


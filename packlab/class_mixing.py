"""How well an order mixes the classes, with a verdict: within the band of random permutations, or not.

:func:`packlab.loaders.tar.label_mixing` (chapter 5) measures how far the class mix of short
windows of an order is from the whole order's mix: 0 when every window has it, near 1 when
each window holds one class. A perfect shuffle does not reach 0 (a window of 100 samples is
a small sample of the mix), so a value means something only beside what random
permutations of the same labels give. :func:`permutation_band` computes that band, and
:func:`mixing_verdicts` puts each order against it: "mixed like a random permutation" when
it falls within the band's top (:data:`BAND_LEVEL`, the 98th percentile), else how many
times the permutations' median distance it is.

One standard for the book: the band's top is set so that an order that mixes exactly like
a random permutation is called "not mixed" 2 % of the time, the same false-alarm rate
:func:`packlab.bench.compare` allows every other verdict (:data:`packlab.bench.FALSE_CLEAR_RATE`).
Chapters 12 and 13 both judge mixing with it, and print the distances with
:func:`band_decimals` digits, so a printed value never looks on the other side of the
printed top from the verdict beside it.

The orders themselves come from the readers: :mod:`packlab.accuracy.orders` (the course's
tar reader over class-sorted shards) and :mod:`packlab.accuracy.peers` (MDS and LitData over
copies that hold only labels). Chapter 12 compares their mixing; chapter 13 their accuracy (and, with
:func:`batch_class_entropy`, the mix of each batch trained on).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from packlab.bench import FALSE_CLEAR_RATE
from packlab.loaders.tar import label_mixing

#: The share of random permutations the band holds: an order above its top is "not mixed".
BAND_LEVEL = 1 - FALSE_CLEAR_RATE
#: Permutations drawn for a band: the band's top is their 98th percentile, and with 1,000 of
#: them twenty lie above it, enough for the top to move little from one seed to the next.
TRIALS = 1000


def permutation_band(labels: Sequence[int], trials: int = TRIALS, seed: int = 0, level: float = BAND_LEVEL,
                     **options) -> tuple[float, float]:
    """``(median, top)`` of :func:`label_mixing` over ``trials`` random permutations of ``labels``; ``top`` is
    the ``level`` quantile (the 98th percentile).

    A shuffle that mixes like a random permutation gives values in this band; one above its
    top mixes measurably worse (one epoch, one order: a test at the 2 % level, the book's
    standard). ``options`` go to :func:`label_mixing` (``window``, ``num_classes``).
    """
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    values = [label_mixing(rng.permutation(labels), **options) for _ in range(trials)]
    return float(np.median(values)), float(np.percentile(values, 100 * level))


def mixing_verdicts(orders: Mapping[str, Sequence[int]], trials: int = TRIALS, **options) -> dict[str, dict]:
    """For each order of labels: its ``mixing``, whether it ``mixes_like_a_permutation``, and how many ``times``
    the permutations' median distance it is.

    Two rows are added: ``"as written"`` (the labels sorted, the worst case) and ``"random
    permutation"`` (the band's median, with ``band_top``, its top, and ``band_level``). Every
    order must hold the same labels.
    """
    labels = next(iter(orders.values()))
    median, top = permutation_band(labels, trials, **options)
    out = {"as written": {"mixing": label_mixing(np.sort(np.asarray(labels)), **options),
                          "mixes_like_a_permutation": False}}
    for name, order in orders.items():
        value = label_mixing(order, **options)
        out[name] = {"mixing": value, "mixes_like_a_permutation": value <= top, "times": value / median}
    out["random permutation"] = {"mixing": median, "band_top": top, "band_level": BAND_LEVEL,
                                 "mixes_like_a_permutation": True, "times": 1.0}
    return out


def band_decimals(values: Sequence[float], top: float, at_least: int = 2) -> int:
    """The fewest decimals (``at_least`` or more) at which every printed value sits on the same side of the
    printed ``top`` as the value itself: "0.134, not mixed" beside "at most 0.131", never "0.13" beside "0.13"."""
    for decimals in range(at_least, 8):
        shown_top = round(top, decimals)
        if all((round(v, decimals) <= shown_top) == (v <= top) for v in values):
            return decimals
    return 8


def batch_class_entropy(batches: Sequence[Sequence[int]], labels: Sequence[int], num_classes: int = 10) -> float:
    """The mean, over ``batches`` (index arrays), of the entropy in bits of each batch's class mix.

    What a BatchNorm layer and one gradient step see: a batch of one class has entropy 0, a
    batch with every class equally often ``log2(num_classes)`` (3.32 bits for ten). Random
    batches of 64 from ten balanced classes average about 3.1: a batch is a small sample.
    Unlike :func:`label_mixing`, which looks at stretches of the stream, this looks at the
    exact groups that were trained on together.
    """
    labels = np.asarray(labels)
    entropies = []
    for batch in batches:
        counts = np.bincount(labels[np.asarray(batch, dtype=np.int64)], minlength=num_classes)
        shares = counts[counts > 0] / counts.sum()
        entropies.append(float(-(shares * np.log2(shares)).sum()))
    return float(np.mean(entropies))

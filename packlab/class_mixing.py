"""How well an order mixes the classes, with a verdict: within the band of random permutations, or not.

:func:`packlab.loaders.tar.label_mixing` (chapter 5) measures how far the class mix of short
windows of an order is from the whole order's mix: 0 when every window has it, near 1 when
each window holds one class. A perfect shuffle does not reach 0 (a window of 100 samples is
a small sample of the mix), so a value means something only beside what random
permutations of the same labels give. :func:`permutation_band` computes that band, and
:func:`mixing_verdicts` puts each order against it: "mixed like a random permutation" when
it falls within the band's 95th percentile, else how many times the permutations' median
distance it is.

The orders themselves come from the readers: :mod:`packlab.accuracy.orders` (the course's
tar reader over class-sorted shards) and :mod:`packlab.accuracy.peers` (MDS and LitData over
copies that hold only labels). Chapter 12 compares their mixing; chapter 13 their accuracy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from packlab.loaders.tar import label_mixing


def permutation_band(labels: Sequence[int], trials: int = 200, seed: int = 0, **options) -> tuple[float, float]:
    """``(median, 95th percentile)`` of :func:`label_mixing` over ``trials`` random permutations of ``labels``.

    A shuffle that mixes like a random permutation gives values in this band; one above its
    95th percentile mixes measurably worse (one epoch, one order: a test at the 5 % level).
    ``options`` go to :func:`label_mixing` (``window``, ``num_classes``).
    """
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    values = [label_mixing(rng.permutation(labels), **options) for _ in range(trials)]
    return float(np.median(values)), float(np.percentile(values, 95))


def mixing_verdicts(orders: Mapping[str, Sequence[int]], trials: int = 200, **options) -> dict[str, dict]:
    """For each order of labels: its ``mixing``, whether it ``mixes_like_a_permutation``, and how many ``times``
    the permutations' median distance it is.

    Two rows are added: ``"as written"`` (the labels sorted, the worst case) and ``"random
    permutation"`` (the band's median, with ``band_top``, its 95th percentile). Every order
    must hold the same labels.
    """
    labels = next(iter(orders.values()))
    median, top = permutation_band(labels, trials, **options)
    out = {"as written": {"mixing": label_mixing(np.sort(np.asarray(labels)), **options),
                          "mixes_like_a_permutation": False}}
    for name, order in orders.items():
        value = label_mixing(order, **options)
        out[name] = {"mixing": value, "mixes_like_a_permutation": value <= top, "times": value / median}
    out["random permutation"] = {"mixing": median, "band_top": top, "mixes_like_a_permutation": True, "times": 1.0}
    return out

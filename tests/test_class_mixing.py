"""The class-mixing verdict: a class-sorted order is not mixed, a permutation is, a small buffer in between.

The readers themselves (ours, MDS, LitData over class-sorted copies) run in chapter 12,
whose notebook test executes them through :mod:`packlab.accuracy.orders` and
:mod:`packlab.accuracy.peers`.
"""

from __future__ import annotations

import random

from packlab import class_mixing
from packlab.loaders.tar import shuffle_buffer


def test_a_permutation_is_mixed_and_a_small_buffer_over_sorted_data_is_not():
    labels = [i // 100 for i in range(1000)]  # written sorted: 10 runs of 100
    orders = {"permuted": random.Random(1).sample(labels, len(labels)),
              "buffer 50": list(shuffle_buffer(labels, 50, random.Random(2)))}  # half a class: cannot undo runs of 100
    verdicts = class_mixing.mixing_verdicts(orders)
    assert verdicts["permuted"]["mixes_like_a_permutation"]
    assert not verdicts["buffer 50"]["mixes_like_a_permutation"] and verdicts["buffer 50"]["times"] > 3
    assert verdicts["as written"]["mixing"] > verdicts["buffer 50"]["mixing"] > verdicts["permuted"]["mixing"]


def test_the_permutation_band_brackets_its_median():
    median, top = class_mixing.permutation_band([i // 100 for i in range(1000)], trials=50)
    assert 0 < median <= top < 0.5

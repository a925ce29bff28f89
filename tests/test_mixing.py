"""The class-mixing statistic and its verdict: a class-sorted order is not mixed, a permutation is.

The readers themselves (ours, MDS, LitData over class-sorted copies) run in chapter 12,
whose notebook test executes :func:`packlab.mixing.write_class_sorted_copies` and
:func:`packlab.mixing.delivered_orders`.
"""

from __future__ import annotations

import random

from packlab import mixing
from packlab.loaders.tar import shuffle_buffer


def _orders():
    keys = [f"k{i:04d}" for i in range(1000)]
    label = {key: i // 100 for i, key in enumerate(keys)}  # written sorted: 10 runs of 100
    permuted = random.Random(1).sample(keys, len(keys))
    small_buffer = list(shuffle_buffer(keys, 50, random.Random(2)))  # half a class: cannot undo runs of 100
    return {"permuted": permuted, "buffer 50": small_buffer}, label


def test_a_permutation_is_mixed_and_a_small_buffer_over_sorted_data_is_not():
    orders, label = _orders()
    verdicts = mixing.mixing_verdicts(orders, label.__getitem__)
    assert verdicts["permuted"]["mixes_like_a_permutation"]
    assert not verdicts["buffer 50"]["mixes_like_a_permutation"] and verdicts["buffer 50"]["times"] > 3
    assert verdicts["as written"]["mixing"] > verdicts["buffer 50"]["mixing"] > verdicts["permuted"]["mixing"]


def test_the_permutation_band_brackets_its_median():
    median, top = mixing.permutation_band([i // 100 for i in range(1000)], trials=50)
    assert 0 < median <= top < 0.5


def test_class_sorted_puts_each_class_together():
    class Sample:
        def __init__(self, key, label):
            self.key, self.label = key, label

    ordered = mixing.class_sorted([Sample("b", 1), Sample("a", 1), Sample("c", 0)])
    assert [(s.label, s.key) for s in ordered] == [(0, "c"), (1, "a"), (1, "b")]

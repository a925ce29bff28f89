"""WeightedMix at the size of a real job: O(1) work per sample, a schedule and permutations computed per position."""

import itertools
import time

import numpy as np
import pytest
from torch.utils.data import IterableDataset

from packlab.accuracy import mixing


class Indices:
    """A map-style source of ``size`` items whose item is its index: no images, only the mixer's own work."""

    def __init__(self, size):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, index):
        return index


HANG_GUARD_SECONDS = 120  # fails a run that has stopped making progress; the speed itself is reported, not asserted


def test_an_epoch_of_a_million_samples_from_a_million_and_300_thousand_completes():
    mix = mixing.WeightedMix([Indices(1_000_000), Indices(300_000)], [0.7, 0.3], epoch_length=1_000_000, seed=3)
    mix.set_epoch(1)
    start = time.perf_counter()
    counts = np.zeros(2, dtype=np.int64)
    small_seen = np.zeros(300_000, dtype=bool)
    for delivered, (source, item) in enumerate(mix):
        counts[source] += 1
        if source == 1:
            small_seen[item] = True
        if delivered % 100_000 == 0 and time.perf_counter() - start > HANG_GUARD_SECONDS:
            pytest.fail(f"only {delivered:,} samples after {HANG_GUARD_SECONDS} s")
    seconds = time.perf_counter() - start
    print(f"an epoch of 1,000,000 samples (70/30 of 1,000,000 and 300,000 items): {seconds:.1f} s")
    assert counts.tolist() == [700_000, 300_000]
    assert small_seen.all()  # 300,000 samples of the small source are its one full pass: each item once


def test_source_permutations_are_bijections_for_any_size():
    for size in [1, 2, 3, 4, 5, 17, 64, 65, 1000, 4097]:
        for pass_ in range(2):
            items = mixing.source_items(size, np.arange(pass_ * size, (pass_ + 1) * size), seed=2, epoch=1, source=0)
            assert sorted(items.tolist()) == list(range(size))
    first, second = (mixing.source_items(1000, np.arange(p * 1000, (p + 1) * 1000), 2, 1, 0) for p in range(2))
    assert not np.array_equal(first, second)  # a new pass is a new order
    assert not np.array_equal(first, mixing.source_items(1000, np.arange(1000), 2, 2, 0))  # and so is a new epoch
    assert mixing.source_item(1000, 1234, 2, 1, 0) == second[234]


def test_the_schedule_at_any_position_agrees_with_the_whole_epoch_and_keeps_every_prefix_near_its_share():
    rng = np.random.default_rng(0)
    for trial in range(60):
        sources = int(rng.integers(2, 6))
        weights, length = rng.random(sources), int(rng.integers(sources, 3000))
        whole, nth = mixing.schedule_at(weights, length, trial, 0, np.arange(length))
        counts = mixing.exact_counts(weights, length)
        for source in range(sources):
            assert np.array_equal(nth[whole == source], np.arange(counts[source]))  # each source's samples in order
            prefix = np.cumsum(whole == source)
            share = counts[source] * np.arange(1, length + 1) / length
            assert np.abs(prefix - share).max() < (1 if sources == 2 else source + 1)
        some = rng.choice(length, size=min(length, 50), replace=False)
        assert np.array_equal(mixing.schedule_at(weights, length, trial, 0, some)[0], whole[some])


def test_a_resume_deep_into_a_large_epoch_is_exact():
    def mix():
        m = mixing.WeightedMix([Indices(100_000), Indices(30_000)], [0.7, 0.3], epoch_length=100_000, seed=9)
        m.set_epoch(4)
        return m

    stopped = mix()
    first = list(itertools.islice(stopped, 61_234))
    resumed = mix()
    resumed.load_state_dict(stopped.state_dict())
    assert first + list(resumed) == list(mix())


def test_a_streamed_source_is_refused_with_the_reason():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(10))

    with pytest.raises(TypeError, match="not map-style"):
        mixing.WeightedMix([range(10), Stream()], [0.5, 0.5], epoch_length=10)

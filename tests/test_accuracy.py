"""packlab.accuracy: the instrument of chapter 13 measures what it says it measures.

The orders are the readers' own (the course's tar reader emulated batch for batch as a
DataLoader interleaves its workers; the peers' readers on label-only copies); the mixer
keeps exact counts and every prefix's share, and resumes where it stopped; the echo
schedules repeat what they should; a training run depends on its seed and schedule only.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from torch.utils.data import DataLoader

from packlab.accuracy import echo, mixing, orders, peers, pixels, training
from packlab.loaders.tar import TarShardDataset, skip_decode


@pytest.fixture(scope="module")
def small_images(small_root, small_manifest):
    return pixels.small_pixels(small_root, side=16, progress=False)


def test_small_pixels_are_decoded_once_and_cached(small_root, small_manifest, small_images):
    assert small_images.pixels.shape == (len(small_manifest), 16, 16, 3)
    assert list(small_images.labels) == [s.label for s in small_manifest]
    cached = list((small_root / "packed" / "accuracy").glob("originals-16px-*.npz"))
    assert len(cached) == 1
    again = pixels.small_pixels(small_root, side=16, progress=False)
    assert np.array_equal(again.pixels, small_images.pixels)
    with pytest.raises(ValueError, match="broken.jpg"):
        pixels.shrink(b"not a jpeg", 16, "broken.jpg")


def test_the_loader_order_is_the_order_a_dataloader_delivers(small_root, small_manifest):
    shards = orders.shard_copy(small_manifest, "test-sorted", per_shard=6, class_sorted=True, root=small_root)
    assert len(shards) == 10

    def dataset():
        ds = TarShardDataset([str(s) for s in shards], shuffle_buffer=8, seed=3, transform=skip_decode,
                             return_key=True, rank=0, world_size=1)
        ds.set_epoch(2)
        return ds

    emulated = orders.loader_order(dataset(), workers=2, batch_size=4)
    real = [key for batch in DataLoader(dataset(), batch_size=4, num_workers=2, multiprocessing_context="fork",
                                        timeout=120) for key in batch[2]]
    assert emulated == real
    assert sorted(emulated) == sorted(s.key for s in small_manifest)


def test_class_sorted_shards_hold_one_class_or_two(small_root, small_manifest):
    from packlab.loaders.tar import iter_shard_samples

    shards = orders.shard_copy(small_manifest, "test-sorted", per_shard=6, class_sorted=True, root=small_root)
    classes = [{s.label for s in iter_shard_samples(str(path))} for path in shards]
    assert all(len(c) <= 2 for c in classes)
    shuffled = orders.shard_copy(small_manifest, "test-shuffled", per_shard=6, class_sorted=False, root=small_root)
    assert max(len({s.label for s in iter_shard_samples(str(p))}) for p in shuffled) > 2


def test_exact_counts_and_a_schedule_that_keeps_every_prefix_at_its_share():
    assert list(mixing.exact_counts([0.7, 0.3], 10)) == [7, 3]
    assert list(mixing.exact_counts([1, 1, 1], 10)) == [4, 3, 3]
    assert mixing.exact_counts([0.5, 0.25, 0.25], 7).sum() == 7
    schedule = mixing.mix_schedule([0.7, 0.3], 1000, seed=1, epoch=0)
    counts = np.cumsum(schedule == 1)
    ideal = 0.3 * np.arange(1, 1001)
    assert np.abs(counts - ideal).max() <= 1.0 and counts[-1] == 300
    assert not np.array_equal(schedule, mixing.mix_schedule([0.5, 0.5], 1000, seed=1, epoch=0))
    with pytest.raises(ValueError):
        mixing.exact_counts([-1, 2], 10)


def test_weighted_mix_resumes_exactly_and_refuses_another_epochs_state():
    def mix():
        m = mixing.WeightedMix([range(50), range(20)], [0.6, 0.4], epoch_length=100, seed=5)
        m.set_epoch(2)
        return m

    whole = list(mix())
    assert Counter(source for source, _ in whole) == {0: 60, 1: 40}
    small_source = [item for source, item in whole if source == 1]
    assert sorted(small_source[:20]) == list(range(20)) and sorted(small_source[20:]) == list(range(20))
    stopped = mix()
    first = list(itertools.islice(stopped, 37))
    state = stopped.state_dict()
    resumed = mix()
    resumed.load_state_dict(state)
    assert first + list(resumed) == whole
    other = mixing.WeightedMix([range(50), range(20)], [0.6, 0.4], epoch_length=100, seed=5)
    other.set_epoch(3)
    with pytest.raises(ValueError, match="a state of epoch 2"):
        other.load_state_dict(state)


def test_weighted_mix_workers_deliver_every_position_once():
    mix = mixing.WeightedMix([range(30), range(30)], [0.5, 0.5], epoch_length=40, seed=0)
    mix.set_epoch(1)
    alone = list(mix)
    with_workers = [(int(s), int(i)) for batch in DataLoader(mix, batch_size=5, num_workers=2,
                                                             multiprocessing_context="fork", timeout=120)
                    for s, i in zip(*batch)]
    assert Counter(with_workers) == Counter(alone)


def test_echo_schedules_repeat_what_they_should():
    order = np.arange(64)
    batched = echo.batch_echo(order, 2, batch_size=8)
    assert len(batched) == 16 and all(np.array_equal(batched[2 * i], batched[2 * i + 1]) for i in range(8))
    sampled = np.concatenate(echo.sample_echo(order, 4, seed=0, buffer=16, batch_size=8))
    assert Counter(sampled.tolist()) == {i: 4 for i in range(64)}
    assert echo.wall_seconds(steps=100, fresh=1000, batch_size=32, loader_rate=100, model_rate=1000) == 10.0
    assert echo.wall_seconds(steps=1000, fresh=1000, batch_size=32, loader_rate=1000, model_rate=1000) == 32.0


def test_a_training_run_depends_on_its_seed_and_schedule_only(small_images):
    train, holdout = training.split_holdout(small_images, 20)
    schedule = training.batches_of(training.global_order(0, 0, len(train)), 8)
    first = training.train_schedule(train, holdout, schedule, seed=4, curve_every=2)
    again = training.train_schedule(train, holdout, schedule, seed=4)
    assert first.accuracy == again.accuracy and 0.0 <= first.accuracy <= 1.0
    assert [steps for steps, _, _ in first.curve] == [2, 4, len(schedule)] and first.curve[-1][1] == len(train)
    runs = training.accuracy_runs({"a": training.Experiment(lambda seed: schedule)}, train, holdout, seeds=[4, 5],
                                  processes=2, progress=False)
    assert runs["a"][0].accuracy == first.accuracy
    assert len(training.accuracy_spreads(runs)["a"]) == 2


def test_the_peers_read_their_label_only_copies_completely(tmp_path):
    rows = [{"index": i, "label": i // 10} for i in range(120)]
    mds = peers.write_mds_rows(tmp_path / "mds", rows, per_shard=10)
    lit = peers.write_litdata_rows(tmp_path / "lit", rows, per_shard=10)
    assert peers.write_mds_rows(tmp_path / "mds", rows, per_shard=10) == mds  # written once
    for algo in ("py1e", "litdata"):
        order = peers.peer_order(mds, lit, seed=1, algo=algo, workers=0, batch_size=8)
        assert sorted(order.tolist()) == list(range(120)), algo
    mix = peers.random_mix([50, 50], [0.7, 0.3], seed=0)
    assert set(mix.tolist()) == {0, 1} and len(mix) < 100


def test_example_echoing_counts_the_fresh_samples_in_its_buffer_as_delivered(small_images):
    """A sample waiting in the shuffle buffer had to be loaded: it counts as fresh, not only what was trained on."""
    order, factor, buffer, batch = np.arange(64), 4, 16, 8
    batches = echo.sample_echo(order, factor, seed=0, buffer=buffer, batch_size=batch)
    distinct = [len(set(np.concatenate(batches[: i + 1]).tolist())) for i in range(len(batches))]
    # By the end of batch i the buffer has taken in its 16 copies and one more for each of the (i + 1) * 8 it gave out.
    expected = [min(len(order), -(-(buffer + batch * (i + 1)) // factor)) for i in range(len(batches))]
    assert batches.delivered.tolist() == expected
    assert all(d >= seen for d, seen in zip(batches.delivered, distinct)) and batches.delivered[0] > distinct[0]
    train, holdout = training.split_holdout(small_images, 20)
    fresh = training.global_order(0, 0, len(train))[:24]
    schedule = echo.sample_echo(fresh, factor, seed=1, buffer=buffer, batch_size=batch)
    result = training.train_schedule(train, holdout, schedule, seed=4, curve_every=1)
    assert [count for _, count, _ in result.curve] == schedule.delivered.tolist()
    assert result.curve[0][1] > len(set(schedule[0].tolist()))


def test_echo_schedules_on_the_instrument_use_each_read_factor_times_with_the_asked_augmentation():
    size, images, variants = 50, 300, 6
    reference = np.concatenate(echo.echo_schedule(size, images, 1, variants=variants)(0))
    # No echo: every read a fresh one; each read epoch its own render (variant) of every image.
    assert len(reference) == images and len(set(reference.tolist())) == images
    assert sorted(set((reference // size).tolist())) == list(range(images // size))
    for how in ("example", "batch"):
        after = np.concatenate(echo.echo_schedule(size, images, 3, how, "after", variants)(0))
        before = np.concatenate(echo.echo_schedule(size, images, 3, how, "before", variants)(0))
        assert len(after) == len(before) == images  # the same steps as no echo
        # After augmentation the three copies of a read are the same pixels: 100 distinct indices, each three times.
        values, counts = np.unique(after, return_counts=True)
        assert len(values) == images // 3 and set(counts.tolist()) == {3}
        # Before it, every copy has its own render: as many distinct indices as uses, the same images underneath.
        assert len(set(before.tolist())) == images
        assert sorted((before % size).tolist()) == sorted((after % size).tolist())
    # Example echoing spreads a read's copies apart; batch echoing repeats a batch in a row.
    batches = echo.echo_schedule(size, images, 3, "batch", "after", variants, batch_size=10)(0)
    assert all((batches[i] == batches[i + 1]).all() for i in (0, 1)) and not np.array_equal(batches[2], batches[3])
    spread = np.concatenate(echo.echo_schedule(size, images, 3, "example", "after", variants, buffer=40)(0))
    assert not all(spread[i] == spread[i + 1] for i in range(0, 30, 3))
    # A seed draws the same reads in every setting: the pairing the instrument relies on.
    assert np.array_equal(echo.reads(4, size, 120), echo.reads(4, size, 120))
    assert not np.array_equal(echo.reads(4, size, 120), echo.reads(5, size, 120))
    with pytest.raises(ValueError, match="augment"):
        echo.echo_schedule(size, images, 2, augment="during")
    with pytest.raises(ValueError, match="whole number of reads"):
        echo.echo_schedule(size, 301, 2)


def test_noise_variants_differ_only_in_their_noise():
    variants = echo.noise_variants(20, 3, seed=0)
    assert len(variants) == 60 and (variants.labels[:20] == variants.labels[20:40]).all()
    first, second = variants.pixels[:20].astype(int), variants.pixels[20:40].astype(int)
    assert not (first == second).all()
    # The same stripes under other noise: the renders agree far better than two different images do.
    assert np.abs(first - second).mean() < np.abs(first - np.roll(second, 1, axis=0)).mean()

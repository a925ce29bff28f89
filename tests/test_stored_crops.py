"""Random crops of stored copies against crops of the originals (chapter 11's accuracy question): the data."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from packlab import crops, reencode
from packlab.accuracy import instrument, patterns, stored_crops
from packlab.crops import crop_reference, jpeg_size

COUNT, VARIANTS = 40, 3


@pytest.fixture(scope="module")
def images() -> stored_crops.StoredPatterns:
    return stored_crops.stored_patterns(COUNT, seed=5)


@pytest.fixture(scope="module")
def sets(images):
    return stored_crops.crop_sets(images.originals, images.stored, images.keys, VARIANTS, labels=images.labels)


def test_the_forms_follow_the_course():
    # The stored form is chapter 11's, scaled: 320 of about 400 px is 0.8 of the longer side.
    assert stored_crops.STORED_FORM == reencode.StoredFormat(77, 90, "4:2:0", fit="max side")
    assert stored_crops.EPOCHS == instrument.EPOCHS


def test_originals_and_stored_copies(images):
    assert len(images.originals) == len(images.stored) == COUNT and images.keys[0] == "p5-000000"
    assert np.array_equal(images.labels, patterns.pattern_parameters(COUNT, 5).labels)
    assert jpeg_size(images.originals[0]) == (96, 96) and jpeg_size(images.stored[0]) == (77, 77)
    assert images.stored_kb < images.original_kb
    with Image.open(io.BytesIO(images.stored[0])) as stored:
        assert stored.layer[0][1:3] == (2, 2)  # luma sampled 2 x 2 per chroma sample: 4:2:0


def test_variants_are_indexed_variant_major(images, sets):
    originals, stored = sets
    assert len(originals) == len(stored) == VARIANTS * COUNT
    assert originals.pixels.shape == (VARIANTS * COUNT, 16, 16, 3)
    for v in range(VARIANTS):
        for i in (0, 7, COUNT - 1):
            assert originals.keys[v * COUNT + i] == stored.keys[v * COUNT + i] == f"{images.keys[i]}/v{v}"
            assert originals.labels[v * COUNT + i] == stored.labels[v * COUNT + i] == images.labels[i]
    # Variants differ: another epoch's window.
    assert not np.array_equal(originals.pixels[:COUNT], originals.pixels[COUNT : 2 * COUNT])


def test_crop_pixels_are_crop_references_unflipped(images, sets):
    originals, stored = sets
    for v, i in [(0, 0), (1, 3), (2, 11), (0, 25), (2, COUNT - 1)]:
        crop = crops.crop_for(images.keys[i], 96, 96, seed=0, epoch=v)
        unflipped = crops.Crop(crop.top, crop.left, crop.height, crop.width, False, crop.image_size)
        assert stored_crops.unflipped_crop(images.keys[i], 96, 96, epoch=v) == unflipped
        assert np.array_equal(originals.pixels[v * COUNT + i], crop_reference(images.originals[i], unflipped, 16))
        # The stored copy (77 px) gets the same window, scaled by crop_reference itself.
        assert np.array_equal(stored.pixels[v * COUNT + i], crop_reference(images.stored[i], unflipped, 16))


def test_no_crop_is_flipped(images):
    windows = stored_crops.crop_windows(images.keys, [(96, 96)] * COUNT, VARIANTS)
    assert all(not crop.flip for variant in windows for crop in variant)
    # crop_for itself would have mirrored about half of them: the flip was turned off, not absent.
    drawn = [crops.crop_for(k, 96, 96, epoch=v) for v in range(VARIANTS) for k in images.keys]
    assert 0.25 < np.mean([c.flip for c in drawn]) < 0.75
    assert [(c.top, c.left, c.height, c.width) for c in drawn] == \
        [(c.top, c.left, c.height, c.width) for variant in windows for c in variant]


def test_stored_crops_differ_a_little(sets):
    originals, stored = sets
    assert not np.array_equal(originals.pixels, stored.pixels)
    assert stored_crops.psnr(stored.pixels, originals.pixels) > 25


def test_holdout_is_whole_images_resized():
    holdout = stored_crops.holdout_images(12, seed=6)
    jpegs, labels, keys = stored_crops.pattern_jpegs(12, 6)
    assert holdout.pixels.shape == (12, 16, 16, 3) and np.array_equal(holdout.labels, labels) and holdout.keys == keys
    whole = crops.Crop(0, 0, 96, 96, False, (96, 96))
    assert np.array_equal(holdout.pixels[4], crop_reference(jpegs[4], whole, 16))


def test_each_epoch_is_a_permutation_of_one_variant():
    size, variants, epochs = 50, 3, 5
    schedule = stored_crops.variant_epochs(size, variants, epochs, batch_size=16)
    batches = schedule(4)
    flat = np.concatenate(batches)
    assert len(flat) == epochs * size and [len(b) for b in batches[:4]] == [16, 16, 16, 2]
    for epoch in range(epochs):
        seen = flat[epoch * size : (epoch + 1) * size]
        v = epoch % variants
        assert sorted(seen.tolist()) == list(range(v * size, (v + 1) * size))
    # A fresh order every epoch, and another for another seed.
    assert not np.array_equal(flat[:size] % size, flat[size : 2 * size] % size)
    assert not np.array_equal(flat, np.concatenate(schedule(5)))
    # The instrument's own shuffle, shifted to the epoch's variant.
    plain = np.concatenate(instrument.shuffled_epochs(size, epochs=epochs, batch_size=16)(4))
    assert np.array_equal(flat % size, plain)


def test_both_conditions_train_on_the_same_schedule():
    data = stored_crops.stored_crop_data(count=20, holdout_count=10, variants=2, seed=7, holdout_seed=8)
    assert len(data.train_originals) == len(data.train_stored) == 40 and data.count == 20
    assert data.train_originals.keys == data.train_stored.keys
    assert np.array_equal(data.train_originals.labels, data.train_stored.labels)
    first, second = data.schedule(), data.schedule()  # what each condition calls
    for seed in (0, 3):
        a, b = first(seed), second(seed)
        assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
        assert max(int(x.max()) for x in a) < len(data.train_stored)
    assert data.psnr_db > 25 and data.stored_kb < data.original_kb
    assert len(data.holdout) == 10 and data.holdout.keys[0] == "p8-000000"

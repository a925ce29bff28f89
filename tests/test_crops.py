"""The training transform, its decoders and its batches; steady-state timing; each pipeline's own ceiling; DALI.

Speed is measured in chapter 11 and ``make bench``, not here: these tests check that the
crops are torchvision's, drawn per sample and reproducible; that every decoder gives the
same window; that stored copies keep their aspect; that the steady clock starts where
it says; that a ceiling does the work it is given; that a channels_last batch is built
in shared memory in a worker; and that DALI's pipeline delivers every key once.
"""

from __future__ import annotations

import io
import math
import time

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision import transforms as T

from packlab import crops, data, decode, pack, reencode, steady
from packlab.loaders import TarShardDataset
from packlab.loaders.batching import collate_channels_last, collate_uint8_hwc_as_chw, write_uint8_hwc


@pytest.fixture(scope="module")
def blobs(small_root):
    return [(s, data.image_path(s.key, small_root).read_bytes()) for s in data.load_manifest(small_root)[:6]]


def test_the_window_is_torchvisions_drawn_from_a_generator_of_its_own():
    image = Image.new("RGB", (417, 331))
    for seed in range(100):
        torch.manual_seed(seed)
        theirs = T.RandomResizedCrop.get_params(image, list(crops.SCALE), list(crops.RATIO))
        assert crops.random_resized_crop(417, 331, torch.Generator().manual_seed(seed)) == tuple(theirs)


def test_a_samples_crop_depends_on_seed_epoch_and_key_only():
    first = crops.crop_for("000123", 400, 350, seed=7, epoch=2)
    assert crops.crop_for("000123", 400, 350, seed=7, epoch=2) == first  # the same in any process, at any time
    others = {crops.crop_for("000123", 400, 350, seed=7, epoch=3), crops.crop_for("000124", 400, 350, seed=7, epoch=2),
              crops.crop_for("000123", 400, 350, seed=8, epoch=2)}
    assert first not in others
    flips = [crops.crop_for(f"{k:06d}", 400, 350).flip for k in range(400)]
    assert 0.4 < sum(flips) / len(flips) < 0.6
    areas = [c.width * c.height / (400 * 350) for c in (crops.crop_for(f"{k:06d}", 400, 350) for k in range(400))]
    assert min(areas) >= 0.07 and max(areas) <= 1.0


def test_jpeg_size_reads_the_frame_header_and_names_bad_input(blobs):
    for sample, blob in blobs:
        assert crops.jpeg_size(blob) == (sample.width, sample.height)
    with pytest.raises(crops.CorruptImageError, match="sample x"):
        crops.jpeg_size(b"not a jpeg", "sample x")


def test_every_crop_decoder_gives_the_same_window(blobs):
    decoders = dict(crops.DECODERS)
    if crops.roi_available() is not None:
        decoders.pop("crop-aware (libjpeg-turbo window)")
    for sample, blob in blobs:
        crop = crops.crop_for(sample.key, sample.width, sample.height)
        reference = crops.crop_reference(blob, crop)
        assert reference.shape == (224, 224, 3) and reference.dtype == np.uint8
        for name, decoder in decoders.items():
            out = np.asarray(decoder(blob, crop))
            assert out.shape == (224, 224, 3) and out.dtype == np.uint8, name
            assert decode.psnr(out, reference) > 35, name  # the same window; a resize that rounds differently at most


def test_the_reference_is_torchvisions_transform_on_a_pillow_image(blobs):
    sample, blob = blobs[0]
    crop = crops.crop_for(sample.key, sample.width, sample.height)
    image = Image.open(io.BytesIO(blob)).convert("RGB")
    theirs = T.functional.resized_crop(image, crop.top, crop.left, crop.height, crop.width, [224, 224])
    if crop.flip:
        theirs = T.functional.hflip(theirs)
    assert np.array_equal(crops.crop_reference(blob, crop), np.asarray(theirs))


def test_a_large_crop_is_decoded_at_a_reduced_scale():
    assert crops.draft_scale_for(1000, 900) == 4 and crops.draft_scale_for(300, 500) == 1
    big = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (1200, 1300, 3), dtype=np.uint8)).save(big, "JPEG")
    crop = crops.Crop(100, 100, 1000, 1000, False, (1300, 1200))
    seen = []
    load = Image.Image.load

    def watched(image):
        seen.append(image.size)
        return load(image)

    Image.Image.load = watched
    try:
        crops.crop_fast(big.getvalue(), crop)
    finally:
        Image.Image.load = load
    assert seen and max(seen) <= (1300 // 4 + 1, 1200 // 4 + 1)


def test_random_crops_are_the_same_with_any_worker_count(small_root, tmp_path):
    shards = [str(p) for p in pack.write_tar_shards(tmp_path / "shards", root=small_root, maxcount=15, shuffle=False,
                                                    progress=False)]

    def epoch(workers):
        dataset = crops.RandomCrops(TarShardDataset(shards, transform=crops.encoded, return_key=True),
                                    decode=crops.crop_fast, return_key=True)
        loader = DataLoader(dataset, batch_size=8, num_workers=workers, collate_fn=collate_channels_last,
                            multiprocessing_context="fork" if workers else None, timeout=60 if workers else 0)
        return {key: images[i].clone() for images, _, keys in loader for i, key in enumerate(keys)}

    alone, two = epoch(0), epoch(2)
    assert alone.keys() == two.keys() and len(alone) == len(data.load_manifest(small_root))
    assert all(torch.equal(alone[k], two[k]) for k in alone)


def test_a_channels_last_batch_is_built_nhwc_in_shared_memory_inside_a_worker():
    images = [np.full((4, 5, 3), i, dtype=np.uint8) for i in range(3)]
    batch, labels = collate_channels_last([(image, i) for i, image in enumerate(images)])
    assert batch.shape == (3, 3, 4, 5) and batch.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(batch, collate_uint8_hwc_as_chw([(image, i) for i, image in enumerate(images)])[0])

    class Images(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return np.full((4, 5, 3), index, dtype=np.uint8), index

    def report(samples):
        batch = collate_channels_last(samples)
        return batch, batch[0].is_shared()

    (crossed, _), shared = next(iter(DataLoader(Images(), batch_size=4, num_workers=1, collate_fn=report,
                                               multiprocessing_context="fork", timeout=60)))
    assert shared and crossed.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match="same size"):
        write_uint8_hwc(np.zeros((4, 4, 3), np.uint8), torch.empty((4, 5, 3), dtype=torch.uint8))


def test_max_side_keeps_the_aspect_and_never_enlarges(blobs):
    assert reencode.max_side_size(400, 300, 320) == (320, 240)
    assert reencode.max_side_size(200, 100, 320) == (200, 100)
    form = reencode.StoredFormat(320, 90, fit="max side")
    assert form.name == "max side 320, q90, 4:2:0" and form.folder_name == "stored-max320-q90-420"
    sample, blob = blobs[0]
    pixels = reencode.stored_pixels(blob, 320, fit="max side")
    assert max(pixels.shape[:2]) == min(320, max(sample.width, sample.height))
    assert math.isclose(pixels.shape[1] / pixels.shape[0], sample.width / sample.height, rel_tol=0.02)
    with pytest.raises(ValueError, match="fit"):
        reencode.StoredFormat(320, 90, fit="crop")


class _Paced:
    """A fake loader: ``batches`` batches of 4, the first ``slow`` of them after ``first`` seconds, then one per ``step``."""

    def __init__(self, batches, first, step, slow=1):
        self.batches, self.first, self.step, self.slow = batches, first, step, slow

    def __iter__(self):
        for i in range(self.batches):
            time.sleep(self.first if i < self.slow else self.step)
            yield [torch.zeros(4, 1)]


def test_the_steady_clock_starts_once_every_worker_has_delivered():
    result = steady.steady_epoch(_Paced(8, first=0.3, step=0.02, slow=1), workers=2)
    assert result.first_batch_seconds >= 0.3 and result.startup_seconds >= result.first_batch_seconds
    assert result.steady_images == 6 * 4 and result.images == 8 * 4
    assert 4 / 0.04 < result.images_per_s < 4 / 0.015  # start-up left out
    assert 0 < result.startup_share < 1
    with pytest.raises(RuntimeError, match="too short"):
        steady.steady_epoch(_Paced(2, 0.0, 0.0), workers=2)
    spreads, details = steady.steady_rates({"a": _Paced(6, 0.0, 0.01)}, 1, rounds=5,
                                           extra={"b": lambda: 100.0})
    assert len(spreads["a"]) == len(details["a"]) == 5 and spreads["b"].median == 100.0


def test_a_ceiling_does_the_work_it_is_given(blobs):
    from packlab.ceiling import measure_ceiling, measure_parallel_ceiling

    items = [(blob, sample.key) for sample, blob in blobs]
    work = crops.CropWork(crops.crop_fast)
    assert np.asarray(work(items[0])).shape == (224, 224, 3)
    shape = (4, 224, 224, 3)
    assert measure_ceiling(items, work, write_uint8_hwc, shape) > 0
    assert measure_parallel_ceiling(items, 2, work, write_uint8_hwc, shape) > 0


def test_dali_delivers_every_key_once_with_its_label(small_root, tmp_path):
    from packlab import audit
    from packlab.loaders.dali_pipeline import DaliLoader, dali_status, key_of

    assert key_of("/x/shard-000001.tar:5149696:006197.jpg") == "006197"
    if dali_status() is not None:
        pytest.skip(dali_status())
    shards = [str(p) for p in pack.write_tar_shards(tmp_path / "shards", root=small_root, maxcount=15, shuffle=False,
                                                    progress=False)]
    loader = DaliLoader(shards, "crop", batch_size=8, threads=2)
    for _ in range(2):
        records = audit.records_from_batches(loader, with_pixels=False)
        report = audit.audit_epoch(records, data.load_manifest(small_root))
        assert report.ok, report.summary()
    images = next(iter(loader))[0]
    assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224)
    assert images.is_contiguous(memory_format=torch.channels_last)


def test_the_profile_keeps_only_steady_steps_and_prints_nothing(capfd):
    from packlab import profiling

    class Slow(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, index):
            time.sleep(0.002)
            return torch.zeros(2), index

    profile = profiling.profile_training(DataLoader(Slow(), batch_size=2), lambda batch: time.sleep(0.003),
                                         wait=1, warmup=1, active=5)
    assert profile.batches == 5 and profile.skipped_steps == 2 and profile.first_batch_seconds > 0
    assert 0 < profile.waiting_share < 1 and 0 < profile.step_share < 1
    assert profile.waiting_seconds + profile.step_seconds <= profile.wall_seconds * 1.05
    printed = capfd.readouterr()
    assert "gpuGetDeviceCount" not in printed.err and "profiler_start" not in printed.err


def test_the_crops_per_sample_seed_is_the_courses_one_seed_scheme():
    """One per-sample seed in the course: ``seeding.sample_seed`` of (seed, epoch, index), a key made a number first."""
    from packlab import seeding

    for seed, epoch, key in [(0, 0, "000000"), (7, 2, "000123"), (1, 5, "n01440764_10026")]:
        assert crops.sample_seed(seed, epoch, key) == seeding.sample_seed(seed, epoch, seeding.key_number(key))


def _large_jpeg() -> bytes:
    """A 1,300 x 1,200 JPEG with detail at a photograph's scale (random noise would alias at any reduced scale)."""
    big = io.BytesIO()
    small = Image.fromarray(np.random.default_rng(1).integers(0, 256, (120, 130, 3), dtype=np.uint8))
    small.resize((1300, 1200), Image.BICUBIC).save(big, "JPEG", quality=90)
    return big.getvalue()


def test_libjpeg_turbos_scaled_decode_takes_the_smallest_m_8_scale_the_window_allows(monkeypatch):
    import simplejpeg

    seen = []
    decode_jpeg = simplejpeg.decode_jpeg

    def watched(*args, **kwargs):
        out = decode_jpeg(*args, **kwargs)
        seen.append(out.shape[:2])
        return out

    monkeypatch.setattr(simplejpeg, "decode_jpeg", watched)
    blob = _large_jpeg()
    crop = crops.Crop(100, 100, 600, 650, False, (1300, 1200))  # 650 x 600: at least 224 a side down to 3/8
    for decoder in (crops.crop_libjpeg_scaled, crops.crop_libjpeg_scaled_fast):
        out = decoder(blob, crop)
        assert out.shape == (224, 224, 3)
        assert decode.psnr(out, crops.crop_reference(blob, crop)) > 25
    # 3/8 of 1200 x 1300 is 450 x 488: the window is then 225 x 244, the smallest scale that keeps it >= 224.
    assert seen == [(450, 488), (450, 488)]


def test_pillows_two_step_shrink_reduces_a_large_window_and_leaves_a_small_one_alone(monkeypatch):
    factors = []
    reduce = Image.Image.reduce

    def watched(image, factor, box=None):
        factors.append(factor)
        return reduce(image, factor, box)

    monkeypatch.setattr(Image.Image, "reduce", watched)
    blob = _large_jpeg()
    large = crops.Crop(0, 0, 1200, 1200, False, (1300, 1200))
    out = crops.crop_pillow_reduce(blob, large)
    assert factors == [(2, 2)], "a window of 1,200 is first averaged in blocks of 2 x 2 (1200 / 224 / 2 = 2.7)"
    assert decode.psnr(out, crops.crop_reference(blob, large)) > 25
    factors.clear()
    crops.crop_pillow_thumbnail_way(blob, large)  # draft at 1/2 leaves a window of 600: nothing for reduce
    assert not factors
    small = crops.Crop(0, 0, 300, 300, True, (1300, 1200))
    assert np.array_equal(crops.crop_pillow_reduce(blob, small), crops.crop_pillow_draft(blob, small))  # no scale, no reduce

"""Chapter 11's library: cheaper decoders and resizes, uint8 batches to the consumer, stored JPEGs, profiling, GPU.

Speed is measured in chapter 11 and ``make bench``, not here: these tests check that each
piece gives what it promises (sizes, dtypes, pixel error within its stated bound, exact
pixels where exactness is claimed, clear errors naming the file) and fails cleanly.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from packlab import audit, data, decode, gpu, pack, profiling, reencode
from packlab.preprocess import iter_samples
from packlab.loaders import TarShardDataset
from packlab.loaders.batching import (
    FloatBatches,
    collate_uint8_batch,
    collate_uint8_images,
    to_float_batch,
)
from packlab.transforms import CorruptImageError, decode_and_resize, standard_transform


@pytest.fixture(scope="module")
def blobs(small_root):
    return [data.image_path(s.key, small_root).read_bytes() for s in data.load_manifest(small_root)[:8]]


def test_draft_scale_follows_pillow():
    assert decode.draft_scale(400, 350) == 1
    assert decode.draft_scale(400, 250) == 1  # smaller than the target one way
    assert decode.draft_scale(600, 520) == 2
    assert decode.draft_scale(1600, 1400) == 4  # min(6, 5) = 5, rounded down to a power of two
    assert decode.draft_scale(4000, 3000) == 8


def test_decoders_give_256_uint8_close_to_the_standard(blobs):
    reference = [decode_and_resize(b) for b in blobs]
    for fn, bound in ((decode.torchvision_decode_and_resize, 45), (decode.pillow_decode_torch_resize, 45),
                      (decode.decode_pillow_draft, math.inf), (decode.simplejpeg_decode_and_resize, 30)):
        out = [fn(b) for b in blobs]
        assert all(decode.hwc(o).shape == (256, 256, 3) and decode.hwc(o).dtype == np.uint8 for o in out)
        assert decode.psnr_over(out, reference) >= bound, fn.__name__
    # the same libjpeg-turbo: torchvision's and Pillow's full decodes are identical
    assert all(np.array_equal(decode.hwc(decode.decode_torchvision(b)), decode.decode_pillow(b)) for b in blobs)


@pytest.mark.parametrize("decoder", [decode.decode_torchvision, decode.decode_simplejpeg, decode.decode_pillow_draft,
                                     decode.stored_decode])
def test_corrupt_bytes_name_the_source(decoder):
    with pytest.raises(CorruptImageError, match="shard-7.tar:000042.jpg"):
        decoder(b"\xff\xd8 not really a jpeg", "shard-7.tar:000042.jpg")


def test_psnr_and_largest_difference():
    a = np.zeros((4, 4, 3), np.uint8)
    b = a.copy()
    assert decode.psnr(a, b) == math.inf
    b[0, 0, 0] = 255
    assert decode.largest_difference(a, b) == 255
    assert decode.psnr(a, b) == pytest.approx(10 * math.log10(48))


def test_v2_resize_keeps_uint8():
    image = torch.randint(0, 256, (3, 300, 280), dtype=torch.uint8)
    out = decode.resize_uint8(image)
    assert out.dtype == torch.uint8 and out.shape == (3, 256, 256)


def test_high_resolution_copies_are_larger_and_deterministic(small_root, tmp_path):
    sample = data.load_manifest(small_root)[0]
    (first,) = decode.high_resolution_copies([sample], tmp_path / "a", scale=2, root=small_root)
    (second,) = decode.high_resolution_copies([sample], tmp_path / "b", scale=2, root=small_root)
    assert first.read_bytes() == second.read_bytes()
    from PIL import Image

    with Image.open(first) as image:
        assert image.size == (2 * sample.width, 2 * sample.height)


def test_uint8_batches_crossing_from_workers_are_the_standard_batches_after_conversion(small_root, tmp_path):
    shards = pack.write_tar_shards(tmp_path / "shards", root=small_root, maxcount=15, shuffle=False, progress=False)

    def loader(collate):
        dataset = TarShardDataset(shards, transform=decode_and_resize, return_key=True, shuffle_shards=False)
        return DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context="fork", timeout=60,
                          collate_fn=collate)

    uint8 = list(loader(collate_uint8_batch))
    floats = list(loader(collate_uint8_images))
    assert all(images.dtype == torch.uint8 and images.shape[1:] == (3, 256, 256) for images, _, _ in uint8)
    converted = list(FloatBatches(uint8))
    for (images, labels, keys), (reference, ref_labels, ref_keys) in zip(converted, floats):
        assert keys == ref_keys and torch.equal(labels, ref_labels) and torch.equal(images, reference)
    manifest = data.load_manifest(small_root)
    report = audit.audit_epoch(audit.records_from_batches(uint8), manifest, audit.reference_digests(
        [s.key for s in manifest], small_root))
    assert report.ok and report.pixels_checked == len(manifest), report.summary()


def test_the_audit_catches_a_wrong_uint8_image(small_root):
    sample = data.load_manifest(small_root)[0]
    pixels = torch.from_numpy(decode_and_resize(data.image_path(sample.key, small_root).read_bytes())).permute(2, 0, 1)
    wrong = pixels.clone()
    wrong[0, 0, 0] ^= 1
    reference = audit.reference_digests([sample.key], small_root)
    for image, ok in ((pixels, True), (wrong, False)):
        records = audit.records_from_batches([(image[None], torch.tensor([sample.label]), [sample.key])])
        assert audit.audit_epoch(records, [sample], reference).ok is ok


def test_to_float_batch_converts_once_and_normalises_once():
    images = torch.arange(256, dtype=torch.uint8).view(1, 1, 16, 16).expand(2, 3, 16, 16).contiguous()
    plain = to_float_batch(images)
    assert plain.dtype == torch.float32 and torch.equal(plain[0, 0], images[0, 0].float() / 255)
    normalised = to_float_batch(images, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4))
    expected = (plain - torch.tensor([0.5, 0.4, 0.3]).view(1, 3, 1, 1)) / torch.tensor([0.2, 0.3, 0.4]).view(1, 3, 1, 1)
    assert torch.allclose(normalised, expected)
    with pytest.raises(TypeError, match="uint8"):
        to_float_batch(plain)
    with pytest.raises(ValueError, match="both"):
        to_float_batch(images, mean=(0.5, 0.5, 0.5))


def test_collate_refuses_images_of_different_sizes():
    samples = [(np.zeros((256, 256, 3), np.uint8), 0), (np.zeros((128, 256, 3), np.uint8), 1)]
    with pytest.raises(ValueError, match="same size"):
        collate_uint8_batch(samples)


def test_stored_shards_keep_every_sample_and_stay_close(small_root, tmp_path):
    shards = pack.write_tar_shards(tmp_path / "shards", root=small_root, maxcount=20, shuffle=False, progress=False)
    form = reencode.StoredFormat(256, 90)
    folder = reencode.stored_folder(shards, form, tmp_path / "stored")
    stored, report = reencode.write_stored_shards(shards, folder, form, processes=2)
    assert report.images == len(data.load_manifest(small_root)) and len(stored) == len(shards)
    assert reencode.total_bytes(stored) < reencode.total_bytes(shards)
    reference = {s.key: decode_and_resize(data.image_path(s.key, small_root).read_bytes())
                 for s in data.load_manifest(small_root)}
    error = reencode.stored_pixel_error(stored, reference, decode.stored_decode)
    assert error["images"] == len(reference) and 30 < error["psnr_db"] < math.inf
    dataset = TarShardDataset([str(p) for p in stored], transform=decode.stored_decode, return_key=True)
    records = audit.records_from_batches(DataLoader(dataset, batch_size=16, collate_fn=collate_uint8_batch),
                                         with_pixels=False)
    assert audit.audit_epoch(records, data.load_manifest(small_root)).ok
    # rewriting the inputs gives a fresh folder, never stale outputs under the same names
    again = pack.write_tar_shards(tmp_path / "shards", root=small_root, maxcount=30, shuffle=False, progress=False)
    assert reencode.stored_folder(again, form, tmp_path / "stored") != folder


def test_stored_format_validates_and_names():
    assert reencode.StoredFormat(256, 90, "4:4:4").folder_name == "stored-256-q90-444"
    with pytest.raises(ValueError, match="subsampling"):
        reencode.StoredFormat(256, 90, "4:1:1")
    with pytest.raises(ValueError, match="quality"):
        reencode.StoredFormat(256, 0)


def test_pyspy_stacks_are_split_into_main_process_and_workers():
    stacks = [
        (['process 10:"python job.py"', "main (job.py:3)", "train_step (train.py:9)"], 5),
        (['process 10:"python job.py"', 'process 11:"python job.py"', "load (PIL/ImageFile.py:300)"], 7),
        (['process 10:"python job.py"', 'process 12:"python job.py"', "resize (PIL/Image.py:2200)"], 3),
    ]
    tops = profiling.top_functions(stacks, 10)
    assert tops["main process"] == [("train_step (train.py)", 1.0)]
    assert tops["workers"] == [("load (PIL/ImageFile.py)", 0.7), ("resize (PIL/Image.py)", 0.3)]


def test_ptrace_permission_and_pyspy_are_there():
    assert profiling.ptrace_permission().startswith(("allowed", "probably not allowed"))
    assert profiling.pyspy_executable().endswith("py-spy")


def test_pyspy_dump_is_plain_text_even_where_colours_are_forced(monkeypatch):
    # CI services may set CLICOLOR_FORCE; py-spy then colours into a pipe, and chapter 11's
    # sliced dump broke the book's ANSI highlighter (a lone ESC at the cut).
    monkeypatch.setenv("CLICOLOR_FORCE", "1")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        time.sleep(0.5)
        dump = profiling.pyspy_dump(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert "sleep" in dump or "<module>" in dump
    assert "\x1b" not in dump


def test_plain_text_removes_colour_sequences_and_a_cut_one():
    assert profiling.plain_text("\x1b[32mmain\x1b[0m (\x1b[36mx.py\x1b[0m:\x1b[2m3\x1b[0m)\n\x1b") == "main (x.py:3)\n"


def test_crossing_seconds_is_positive_for_both_dtypes():
    for dtype in (torch.float32, torch.uint8):
        assert profiling.crossing_seconds(torch.zeros(2, 3, 8, 8, dtype=dtype)) > 0


def test_gpu_status_says_why_not_and_the_prefetcher_needs_cuda():
    status = gpu.cuda_status()
    assert ("CUDA device" in status) if torch.cuda.is_available() else status.startswith("no CUDA device")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            next(iter(gpu.CudaPrefetcher([[torch.zeros(1, 3, 4, 4, dtype=torch.uint8), torch.zeros(1)]])))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prefetcher_and_nvjpeg_on_the_gpu(blobs):
    batches = [[torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8), torch.arange(4)] for _ in range(3)]
    out = list(gpu.CudaPrefetcher(batches, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)))
    for (images, labels), (source, source_labels) in zip(out, batches):
        assert images.is_cuda and torch.allclose(images.cpu(), (source.float() / 255 - 0.5) / 0.25, atol=1e-6)
        assert torch.equal(labels.cpu(), source_labels)
    decoded = gpu.nvjpeg_decode_and_resize(blobs)
    assert decoded.shape == (len(blobs), 3, 256, 256) and decoded.dtype == torch.uint8
    reference = [decode_and_resize(b) for b in blobs]
    assert decode.psnr_over(list(decoded.cpu()), reference) > 30


def test_recycling_loader_on_stored_shards_delivers_every_key_once_as_the_uint8_path(small_root, tmp_path):
    from packlab.loaders import RecyclingLoader

    shards = pack.write_tar_shards(tmp_path / "shards", root=small_root, maxcount=20, shuffle=False, progress=False)
    form = reencode.StoredFormat(256, 90)
    stored, _ = reencode.write_stored_shards(shards, tmp_path / "stored", form, processes=1)
    loader = RecyclingLoader(TarShardDataset([str(p) for p in stored], transform=decode.stored_decode_hwc,
                                             return_key=True), batch_size=16, workers=2, multiprocessing_context="fork",
                             timeout=60)
    delivered = {}
    records = []
    for images, labels, keys in loader:
        records += audit.records_from_batches([(images, labels, keys)], with_pixels=False)
        delivered.update((key, image.clone()) for key, image in zip(keys, images))
    manifest = data.load_manifest(small_root)
    assert audit.audit_epoch(records, manifest).ok
    for key, files in ((k, f) for shard in stored for k, f in iter_samples(shard)):
        expected = to_float_batch(decode.stored_decode(files["jpg"])[None])[0]
        assert torch.equal(delivered[key], expected), key

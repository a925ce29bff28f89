"""The fast path (uint8 pixels, float conversion per batch) gives exactly the default batches."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from packlab import data, pack
from packlab.loaders import JpegFolderDataset, TarShardDataset, ZipDataset
from packlab.loaders.batching import collate_uint8_images, images_to_float_batch
from packlab.transforms import decode_and_resize, pixels_to_tensor, raw_to_array, standard_transform


def test_every_pixel_value_converts_exactly_as_the_standard_transform():
    values = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 16, 1).expand(1, 16, 16, 3).contiguous().numpy()
    assert torch.equal(images_to_float_batch(list(values))[0], torch.from_numpy(values[0]).permute(2, 0, 1).float() / 255)


def test_standard_transform_returns_a_contiguous_tensor(small_root):
    image = standard_transform(data.image_path("000000", small_root).read_bytes())
    assert image.is_contiguous() and image.dtype == torch.float32 and image.shape == (3, 256, 256)


@pytest.mark.parametrize("workers", [0, 2])
def test_fast_batches_equal_default_batches_for_every_loader(small_root, tmp_path, workers):
    zip_path = pack.write_zip(tmp_path / "jpeg.zip", root=small_root, progress=False)
    shards = pack.write_tar_shards(tmp_path / "shards", root=small_root, maxcount=15, shuffle=False, progress=False)
    pairs = {
        "folder": lambda transform: JpegFolderDataset(small_root, transform=transform, return_key=True),
        "zip": lambda transform: ZipDataset(zip_path, transform=transform, return_key=True),
        "tar": lambda transform: TarShardDataset(shards, transform=transform, return_key=True, shuffle_shards=False),
    }
    context = "fork" if workers else None
    for name, make in pairs.items():
        default = list(DataLoader(make(standard_transform), batch_size=16, num_workers=workers,
                                  multiprocessing_context=context, timeout=60 if workers else 0))
        fast = list(DataLoader(make(decode_and_resize), batch_size=16, num_workers=workers,
                               multiprocessing_context=context, timeout=60 if workers else 0,
                               collate_fn=collate_uint8_images))
        assert len(default) == len(fast), name
        for (images, labels, keys), (fast_images, fast_labels, fast_keys) in zip(default, fast):
            assert keys == fast_keys and torch.equal(labels, fast_labels), name
            assert fast_images.dtype == torch.float32 and torch.equal(images, fast_images), name


def test_raw_members_take_the_fast_path_too(small_root):
    raw = decode_and_resize(data.image_path("000001", small_root).read_bytes()).tobytes()
    batch = images_to_float_batch([raw_to_array(raw)])
    assert torch.equal(batch[0], pixels_to_tensor(raw))

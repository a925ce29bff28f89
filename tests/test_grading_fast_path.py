"""Exercise 10's check can fail: each way of getting chapter 11's training crops wrong fails the part that names it.

The mistakes still give plausible crops: windows from a global random generator or from
Python's ``hash()``, an epoch left out of the seed, a squash in place of the window, a
whole decode where the crop allows a reduced one, a ``draft`` sized by the image, a float
crop, an epoch that persistent workers never see, crops seeded by the worker or by a
generator advanced along the stream, a wrapper that loses the reader's position, storage
squashed or enlarged. Each wrong version below makes one of them and must fail the parts
it breaks and no other of the parts it runs. To keep the test cheap, a wrong version runs
only the parts its mistake can reach (the ones without workers, or the dataset parts);
the correct version, written differently from the solution (the course's crop decoder
and ``RandomCrops``-like drawing through ``crops.crop_for``), passes every part. The
solution scores full marks and the untouched stub none (``tests/test_exercises.py``).
"""

from __future__ import annotations

import dataclasses
import io
import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import IterableDataset, get_worker_info

from grading_support import failed_parts
from packlab import crops, reencode
from packlab.course.grading import check, list_checks

PARTS = ("window_valid", "window_reproducible", "window_epochs", "crop_pixels", "reduced_decode", "dataset_epoch",
         "worker_counts", "resume", "store_max_side")
#: The parts that start no DataLoader.
CHEAP = ("window_valid", "window_reproducible", "window_epochs", "crop_pixels", "reduced_decode", "store_max_side")
#: The parts that read the dataset through a DataLoader.
LOADERS = ("dataset_epoch", "worker_counts", "resume")


class Right(IterableDataset):
    """The course's pieces: crop_for's window, crop_fast's decode, FFCV-style storage."""

    def __init__(self, dataset, seed=0, size=224):
        super().__init__()
        self.dataset, self.seed, self.size = dataset, seed, size

    @staticmethod
    def window(key, width, height, seed, epoch):
        return crops.crop_for(key, width, height, seed=seed, epoch=epoch)

    @staticmethod
    def decode(jpeg_bytes, crop, size):
        return np.array(crops.crop_fast(jpeg_bytes, crop, size))

    @staticmethod
    def store(jpeg_bytes, side):
        return reencode.encode_pixels(reencode.stored_pixels(jpeg_bytes, side, fit="max side"), 90)

    def set_epoch(self, epoch):
        self.dataset.set_epoch(epoch)

    def state_dict(self):
        return self.dataset.state_dict()

    def load_state_dict(self, state):
        self.dataset.load_state_dict(state)

    def __iter__(self):
        epoch = self.dataset.epoch
        for data, label, key in self.dataset:
            yield self.decode(data, self.window(key, *crops.jpeg_size(data), self.seed, epoch), self.size), label, key


class GlobalGenerator(Right):
    """torchvision's get_params on torch's global generator: the crop depends on what drew before it."""

    @staticmethod
    def window(key, width, height, seed, epoch):
        top, left, h, w = crops.random_resized_crop(width, height, torch.default_generator)
        return crops.Crop(top, left, h, w, bool(torch.rand(1).item() < 0.5), (width, height))


class PythonHash(Right):
    """A generator seeded by Python's hash() of the key: another seed in every interpreter."""

    @staticmethod
    def window(key, width, height, seed, epoch):
        generator = torch.Generator().manual_seed(hash((seed, epoch, key)) % 2**63)
        top, left, h, w = crops.random_resized_crop(width, height, generator)
        return crops.Crop(top, left, h, w, bool(torch.rand(1, generator=generator).item() < 0.5), (width, height))


class EpochIgnored(Right):
    """The same crops every epoch."""

    @staticmethod
    def window(key, width, height, seed, epoch):
        return crops.crop_for(key, width, height, seed=seed, epoch=0)


class SquashWindow(Right):
    """The whole image as the window, never mirrored: the course's squash, called a crop."""

    @staticmethod
    def window(key, width, height, seed, epoch):
        return crops.Crop(0, 0, height, width, False, (width, height))


class SquashDecode(Right):
    """Draws the window, then resizes the whole image (at the scale the window allows) and ignores the window."""

    @staticmethod
    def decode(jpeg_bytes, crop, size):
        whole = crops.Crop(0, 0, crop.image_size[1], crop.image_size[0], crop.flip, crop.image_size)
        scale = crops.draft_scale_for(crop.width, crop.height, size)
        image = Image.open(io.BytesIO(jpeg_bytes))
        if scale > 1:
            image.draft("RGB", (image.size[0] // scale, image.size[1] // scale))
        return np.array(crops._finish(image.convert("RGB").resize((size, size), Image.BILINEAR), whole))


class FullDecode(Right):
    """The standard route: the whole JPEG decoded, however large, then the window."""

    @staticmethod
    def decode(jpeg_bytes, crop, size):
        return crops.crop_reference(jpeg_bytes, crop, size)


class ImageSizedDraft(Right):
    """draft('RGB', (size, size)): the scale follows the image, and a small window keeps too few pixels."""

    @staticmethod
    def decode(jpeg_bytes, crop, size):
        image = Image.open(io.BytesIO(jpeg_bytes))
        full = image.size
        image.draft("RGB", (size, size))
        image = image.convert("RGB")
        left, top, right, bottom = crop.box(full)
        sx, sy = image.size[0] / full[0], image.size[1] / full[1]
        return np.array(crops._finish(image.resize((size, size), Image.BILINEAR,
                                                   box=(left * sx, top * sy, right * sx, bottom * sy)), crop))


class FloatCrop(Right):
    """Converts in the worker: a float32 crop in [0, 1] (four times the bytes to cross)."""

    @staticmethod
    def decode(jpeg_bytes, crop, size):
        return Right.decode(jpeg_bytes, crop, size).astype(np.float32) / 255


class ChannelsFirst(Right):
    """A 3 x 224 x 224 crop."""

    @staticmethod
    def decode(jpeg_bytes, crop, size):
        return np.ascontiguousarray(Right.decode(jpeg_bytes, crop, size).transpose(2, 0, 1))


class NoFlip(Right):
    """The flip drawn, never applied."""

    @staticmethod
    def decode(jpeg_bytes, crop, size):
        return Right.decode(jpeg_bytes, dataclasses.replace(crop, flip=False), size)


class PlainEpoch(Right):
    """The epoch as a plain attribute: persistent workers keep the one they started with."""

    def __init__(self, dataset, seed=0, size=224):
        super().__init__(dataset, seed, size)
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        for data, label, key in self.dataset:
            yield self.decode(data, self.window(key, *crops.jpeg_size(data), self.seed, self.epoch), self.size), \
                label, key


class WorkerSeeded(Right):
    """The worker's id mixed into the seed: other crops with another worker count."""

    def __iter__(self):
        info = get_worker_info()
        seed = self.seed + (info.id if info is not None else 0)
        epoch = self.dataset.epoch
        for data, label, key in self.dataset:
            yield self.decode(data, self.window(key, *crops.jpeg_size(data), seed, epoch), self.size), label, key


class StreamGenerator(Right):
    """One generator per pass, seeded by (seed, epoch, worker) and advanced sample by sample."""

    def __iter__(self):
        info = get_worker_info()
        epoch = self.dataset.epoch
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch * 1009 + (info.id if info else 0))
        for data, label, key in self.dataset:
            width, height = crops.jpeg_size(data)
            top, left, h, w = crops.random_resized_crop(width, height, generator)
            crop = crops.Crop(top, left, h, w, bool(torch.rand(1, generator=generator).item() < 0.5), (width, height))
            yield self.decode(data, crop, self.size), label, key


class LostPosition(Right):
    """A wrapper with a state of its own that holds nothing: a resume starts the epoch again."""

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


class SquashStore(Right):
    """Stored squashed to side x side."""

    @staticmethod
    def store(jpeg_bytes, side):
        return reencode.encode_pixels(reencode.stored_pixels(jpeg_bytes, side, fit="square"), 90)


class UpscaleStore(Right):
    """The longer side made exactly `side`, enlarging the smaller images."""

    @staticmethod
    def store(jpeg_bytes, side):
        image = Image.open(io.BytesIO(jpeg_bytes)).convert("RGB")
        longer = max(image.size)
        image = image.resize((round(image.size[0] * side / longer), round(image.size[1] * side / longer)),
                             Image.BILINEAR)
        return reencode.encode_pixels(np.asarray(image), 90)


def test_the_check_is_listed_with_its_parts_and_stages():
    from packlab.course.grading import teaching

    (info,) = [i for i in list_checks() if i.id == "fast_path"]
    assert info.notebook == "10_fast_path" and info.parts == PARTS
    stages = teaching.STAGES["fast_path"]
    assert set(stages["core"]) | set(stages["stretch"]) == set(PARTS) and stages["stretch"] == ("store_max_side",)


def test_a_correct_version_other_than_the_solution_passes_every_part():
    result = check("fast_path", Right, quiet=True, record=False)
    assert result.passed, result.report()


#: Parts a wrong version may fail or not from run to run: a worker-seeded crop changes after a resume only
#: when the resumed workers take samples in another split than the uninterrupted epoch's, which varies.
MAY_FAIL = {"WorkerSeeded": {"resume"}}
#: candidate: (parts run, parts it must fail, words in the report)
WRONG = {
    GlobalGenerator: (CHEAP, {"window_reproducible"}, "global random generator"),
    PythonHash: (CHEAP + ("worker_counts",), {"window_reproducible", "worker_counts"}, "hash()"),
    EpochIgnored: (CHEAP + ("dataset_epoch",), {"window_epochs"}, "mix the epoch"),
    SquashWindow: (CHEAP, {"window_valid", "window_epochs"}, "covers 100%"),
    SquashDecode: (CHEAP, {"crop_pixels"}, "PSNR"),
    FullDecode: (CHEAP, {"reduced_decode"}, "allows 1/"),
    ImageSizedDraft: (CHEAP, {"crop_pixels"}, "the crop, not the image"),
    FloatCrop: (CHEAP, {"crop_pixels", "reduced_decode"}, "float32"),
    ChannelsFirst: (CHEAP, {"crop_pixels", "reduced_decode"}, "channels first"),
    NoFlip: (CHEAP, {"crop_pixels"}, "mirror"),
    PlainEpoch: (LOADERS, {"dataset_epoch"}, "did not reach the worker"),
    WorkerSeeded: (LOADERS, {"worker_counts"}, "follows the worker"),
    StreamGenerator: (LOADERS, {"dataset_epoch", "worker_counts", "resume"}, "not the crop of"),
    LostPosition: (("resume",), {"resume"}, "lost the reader's position"),
    SquashStore: (("store_max_side",), {"store_max_side"}, "squashed"),
    UpscaleStore: (("store_max_side",), {"store_max_side"}, "enlarged"),
}


@pytest.mark.parametrize("candidate", list(WRONG), ids=lambda c: c.__name__)
def test_each_mistake_fails_the_parts_it_breaks_and_no_other(candidate):
    parts, failing, words = WRONG[candidate]
    failed = failed_parts("fast_path", candidate, parts=list(parts))
    assert failing <= set(failed) <= failing | MAY_FAIL.get(candidate.__name__, set()), failed
    assert words in failed.report, failed.report


"""Exercise 10's check can fail: each way of getting the fast path wrong fails the part that names it.

The mistakes the exercise warns about still give plausible batches: a float32 crossing,
a batch built in private memory, normalising twice, constants made on every call,
resizing in float, a resize slower than torch's, decoding at full size when a draft
would do, a transform slower than the standard. Each wrong version below makes one of
them and must fail the part of the check that names it, and only the parts it deserves
to fail. To keep the test cheap, a wrong version whose mistake is not about batches runs
the parts that need no workers, and a mistake that is not about time skips the two
timing parts (whose own wrong versions make a difference far beyond their noise). The
correct versions, written differently from the solution (Pillow's draft with torch's
resize, torchvision's decoder for ImageNet-sized JPEGs), pass every part. The solution
scores full marks and the untouched stub none (``tests/test_exercises.py``).
"""

from __future__ import annotations

import io
import time

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms.v2 import functional as F

from grading_support import failed_parts
from packlab.course.grading import check, list_checks

PARTS = ("transform_uint8", "resize_uint8", "reduced_decode", "resize_speed", "timing", "collate_uint8",
         "collate_shared", "normalise_once", "normalise_constants", "audit")
#: The parts that run no worker and time nothing.
CHEAP = ("transform_uint8", "resize_uint8", "reduced_decode", "normalise_once", "normalise_constants")
CONSTANTS: dict = {}


def run(candidate):
    return check("fast_path", candidate, quiet=True, record=False)


def decode_draft(jpeg_bytes):
    image = Image.open(io.BytesIO(jpeg_bytes))
    image.draft("RGB", (256, 256))
    return image.convert("RGB")


def torch_resize(image) -> torch.Tensor:
    return F.resize(torch.from_numpy(np.array(image)).permute(2, 0, 1), [256, 256], antialias=True)


def shared_collate(samples):
    images, labels, *rest = zip(*samples)
    hwc = [image.permute(1, 2, 0) if isinstance(image, torch.Tensor) else torch.from_numpy(np.array(image))
           for image in images]
    return [default_collate(hwc).permute(0, 3, 1, 2), torch.tensor(labels), *rest]


def normalise(images, mean, std):
    key = (tuple(mean), tuple(std), images.device)
    if key not in CONSTANTS:
        CONSTANTS[key] = (torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1))
    mean_t, std_t = CONSTANTS[key]
    return (images.float() / 255 - mean_t) / std_t


class Right:
    """Pillow with draft, torch's uint8 resize, default_collate into shared memory, constants made once."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        return torch_resize(decode_draft(jpeg_bytes))

    collate = staticmethod(shared_collate)
    normalise = staticmethod(normalise)


class RightTorchvision(Right):
    """torchvision's decoder where no reduced decode applies, draft where one does; v2 resize; an empty_batch collate."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        with Image.open(io.BytesIO(jpeg_bytes)) as probe:
            width, height = probe.size
        if width >= 512 and height >= 512:
            return torch_resize(decode_draft(jpeg_bytes))
        pixels = decode_jpeg(torch.frombuffer(bytearray(jpeg_bytes), dtype=torch.uint8), mode=ImageReadMode.RGB)
        return F.resize(pixels, [256, 256], antialias=True)

    @staticmethod
    def collate(samples):
        from packlab.loaders.batching import empty_batch

        out = empty_batch((len(samples), 3, 256, 256), torch.uint8)
        for i, (image, _, _) in enumerate(samples):
            out[i] = image
        return [out, torch.tensor([s[1] for s in samples]), tuple(s[2] for s in samples)]


class PillowResizeOnly(Right):
    """The old reference: draft, then Pillow's resize (several times slower than torch's on these sizes)."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        return np.asarray(decode_draft(jpeg_bytes).resize((256, 256), Image.BILINEAR))


class PrivateCollate(Right):
    """torch.stack in the worker: private memory, copied again into shared memory to cross."""

    @staticmethod
    def collate(samples):
        images, labels, *rest = zip(*samples)
        return [torch.stack(list(images)), torch.tensor(labels), *rest]


class AllocatingNormalise(Right):
    """New mean and std tensors for every batch."""

    @staticmethod
    def normalise(images, mean, std):
        x = images.float() / 255
        return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


class FloatCrossing(Right):
    """Converts in the workers: the batch crosses as float32 (normalise copes with either)."""

    @staticmethod
    def collate(samples):
        images, labels, keys = shared_collate(samples)
        return [images.float() / 255, labels, keys]

    @staticmethod
    def normalise(images, mean, std):
        if not images.is_floating_point():
            return normalise(images, mean, std)
        normalise(images[:0].to(torch.uint8), mean, std)  # makes the constants once
        mean_t, std_t = CONSTANTS[(tuple(mean), tuple(std), images.device)]
        return (images - mean_t) / std_t


class NormaliseTwice(Right):
    @staticmethod
    def normalise(images, mean, std):
        once = normalise(images, mean, std)
        mean_t, std_t = CONSTANTS[(tuple(mean), tuple(std), images.device)]
        return (once - mean_t) / std_t


class ResizeFloat(Right):
    """ToTensor first, then resize: the float image is resized, and rounded back to uint8 at the end."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        pixels = torch.from_numpy(np.array(decode_draft(jpeg_bytes))).permute(2, 0, 1).float() / 255
        resized = torch.nn.functional.interpolate(pixels[None], size=(256, 256), mode="bilinear", antialias=True,
                                                  align_corners=False)[0]
        return (resized * 255).round().clamp(0, 255).to(torch.uint8)


class FullDecode(Right):
    """No draft: every JPEG is decoded whole, however large."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        return torch_resize(Image.open(io.BytesIO(jpeg_bytes)).convert("RGB"))


class NearestResize(Right):
    """Nearest-neighbour instead of bilinear: fast, and visibly other pixels."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        return F.resize(torch.from_numpy(np.array(decode_draft(jpeg_bytes))).permute(2, 0, 1), [256, 256],
                        interpolation=F.InterpolationMode.NEAREST)


class Sleepy(Right):
    """Correct pixels, slower than the standard everywhere (a blocking call per image)."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        time.sleep(0.02)
        return Right.transform(jpeg_bytes, source)


def test_the_check_is_listed_with_its_parts():
    (info,) = [i for i in list_checks() if i.id == "fast_path"]
    assert info.notebook == "10_fast_path" and info.parts == PARTS


def test_correct_versions_pass_every_part():
    for candidate in (Right, RightTorchvision):
        result = run(candidate)
        assert result.passed, result.report()


def test_each_mistake_fails_the_part_that_names_it_and_only_what_it_deserves():
    batches = CHEAP + ("collate_uint8", "collate_shared", "audit")
    expected = {  # candidate: (parts run, parts it must fail, words in the first failed part's message)
        PillowResizeOnly: (CHEAP + ("resize_speed",), {"resize_speed"}, "torch's uint8 resize"),
        PrivateCollate: (batches, {"collate_shared"}, "private memory"),
        AllocatingNormalise: (CHEAP, {"normalise_constants"}, "made"),
        FloatCrossing: (batches, {"collate_uint8", "collate_shared", "audit"}, "float32 crossing"),
        NormaliseTwice: (CHEAP + ("audit",), {"normalise_once", "audit"}, "normalised twice"),
        ResizeFloat: (CHEAP, {"resize_uint8"}, "resized as torch.float32"),
        FullDecode: (CHEAP, {"reduced_decode"}, "its full size"),
        NearestResize: (CHEAP, {"transform_uint8"}, "PSNR"),
        Sleepy: (CHEAP + ("timing",), {"timing"}, "slower"),
    }
    for candidate, (parts, failing, words) in expected.items():
        failed = failed_parts("fast_path", candidate, parts=list(parts))
        assert set(failed) == failing, (candidate.__name__, failed)
        first = next(name for name in PARTS if name in failing)
        message = next(line for line in failed.report.splitlines() if first in line or words in line)
        assert words in failed.report, (candidate.__name__, message)

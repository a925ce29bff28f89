"""Exercise 10's check can fail: each way of getting the fast path wrong fails the part that names it.

The four mistakes the exercise warns about (a float32 crossing, normalising twice,
resizing in float, decoding at full size when a draft would do) still give plausible
batches. Each wrong version below makes one of them and must fail the part of the check
that names it, and only the parts it deserves to fail; a correct version written
differently from the solution (torch tensors and transforms.v2 instead of numpy and
Pillow's resize) passes every part. The solution scores full marks and the untouched
stub none (``tests/test_exercises.py``).
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional as F

from packlab.course.grading import check, list_checks

PARTS = ("transform_uint8", "resize_uint8", "reduced_decode", "collate_uint8", "normalise_once", "audit")


def run(candidate):
    return check("fast_path", candidate, quiet=True, record=False)


def failed_parts(result) -> set[str]:
    return {part.name for part in result.parts if not part.passed}


def decode_draft(jpeg_bytes):
    image = Image.open(io.BytesIO(jpeg_bytes))
    image.draft("RGB", (256, 256))
    return image.convert("RGB")


def stack_uint8(samples):
    images, labels, *rest = zip(*samples)
    batch = torch.stack([torch.from_numpy(np.asarray(image)).permute(2, 0, 1) for image in images])
    return [batch, torch.tensor(labels), *rest]


def normalise(images, mean, std):
    x = images.float() / 255
    return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


class Right:
    """Pillow with draft, Pillow's uint8 resize, a uint8 stack, one normalisation."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        return np.asarray(decode_draft(jpeg_bytes).resize((256, 256), Image.BILINEAR))

    collate = staticmethod(stack_uint8)
    normalise = staticmethod(normalise)


class RightWithTorch:
    """Written differently: a channels-first tensor resized by transforms.v2 in uint8, a preallocated batch."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        pixels = torch.from_numpy(np.array(decode_draft(jpeg_bytes))).permute(2, 0, 1)
        return F.resize(pixels, [256, 256], antialias=True).contiguous()

    @staticmethod
    def collate(samples):
        out = torch.empty((len(samples), 3, 256, 256), dtype=torch.uint8)
        for i, (image, _, _) in enumerate(samples):
            out[i] = image
        return [out, torch.tensor([s[1] for s in samples]), tuple(s[2] for s in samples)]

    @staticmethod
    def normalise(images, mean, std):
        out = images.to(torch.float32).div(255)
        for channel in range(3):
            out[:, channel].sub_(mean[channel]).div_(std[channel])
        return out


class FloatCrossing(Right):
    """Converts in the workers: the batch crosses as float32 (normalise copes with either)."""

    @staticmethod
    def collate(samples):
        images, labels, keys = stack_uint8(samples)
        return [images.float() / 255, labels, keys]

    @staticmethod
    def normalise(images, mean, std):
        x = images if images.is_floating_point() else images.float() / 255
        return (x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


class NormaliseTwice(Right):
    @staticmethod
    def normalise(images, mean, std):
        once = normalise(images, mean, std)
        return (once - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)


class ResizeFloat(Right):
    """ToTensor first, then resize: the float image is resized, and rounded back to uint8 at the end."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        pixels = torch.from_numpy(np.array(decode_draft(jpeg_bytes))).permute(2, 0, 1).float() / 255
        resized = torch.nn.functional.interpolate(pixels[None], size=(256, 256), mode="bilinear", antialias=True,
                                                  align_corners=False)[0]
        return (resized * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()  # HWC, as Right's


class FullDecode(Right):
    """No draft: every JPEG is decoded whole, however large."""

    @staticmethod
    def transform(jpeg_bytes, source="<bytes>"):
        image = Image.open(io.BytesIO(jpeg_bytes)).convert("RGB")
        return np.asarray(image.resize((256, 256), Image.BILINEAR))


def test_the_check_is_listed_with_its_parts():
    (info,) = [i for i in list_checks() if i.id == "fast_path"]
    assert info.notebook == "10_fast_path" and info.parts == PARTS


def test_correct_versions_pass_every_part():
    for candidate in (Right, RightWithTorch):
        result = run(candidate)
        assert result.passed, result.report()


def test_each_mistake_fails_the_part_that_names_it_and_only_what_it_deserves():
    expected = {
        FloatCrossing: ({"collate_uint8", "audit"}, "float32 crossing"),
        NormaliseTwice: ({"normalise_once", "audit"}, "normalised twice"),
        ResizeFloat: ({"resize_uint8"}, "resized as torch.float32"),
        FullDecode: ({"reduced_decode"}, "its full size"),
    }
    for candidate, (parts, words) in expected.items():
        result = run(candidate)
        assert failed_parts(result) == parts, (candidate.__name__, result.report())
        named = next(p for p in result.parts if p.name == sorted(parts - {"audit"})[0])
        assert words in named.message, (candidate.__name__, named.message)

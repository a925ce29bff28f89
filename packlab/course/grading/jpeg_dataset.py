"""Checks of exercise 1 (``01_jpeg_dataset``): a JPEG-folder dataset, and a timing harness."""

from __future__ import annotations

import random
import time

import torch

from packlab import data
from packlab.course.grading.core import Context, PartFailed, attempt, describe, register
from packlab.course.grading.fixtures import (
    audit_records,
    check_item,
    collect_epoch,
    make_loader,
    reference_pixels,
    sha256_transform,
    sha_reference,
    subset,
)


# ----------------------------------------------------------------- 1. JPEG-folder dataset


def _jpeg_fixtures() -> dict:
    # In a random order, not sorted: the dataset must keep the keys in the order given.
    samples = subset(240, seed=1)
    random.Random(1).shuffle(samples)
    return {"samples": samples, "pixels": reference_pixels([s.key for s in samples[:96]])}


def _keys_in_order(got: dict[int, str], keys: list[str]) -> None:
    """Fail unless item ``i`` holds ``keys[i]`` for each index in ``got``, saying when the keys were sorted."""
    wrong = [i for i, key in got.items() if key != keys[i]]
    if not wrong:
        return
    index = wrong[0]
    ordered = sorted(keys)
    sorted_note = " (the keys were sorted)" if all(key == ordered[i] for i, key in got.items()) else ""
    raise PartFailed(
        f"dataset[{index}] holds key {got[index]!r}, but the key given at position {index} is {keys[index]!r}{sorted_note}. "
        "Keep the keys in the order given: a caller that passes a shuffled or grouped list relies on it"
    )


def _jpeg_length(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    everything = ctx.call(transform=sha256_transform, return_key=True)
    if len(everything) != len(data.load_manifest()):
        raise PartFailed(f"with keys=None len() is {len(everything)}, expected {len(data.load_manifest())} (every key in labels.csv)")
    fifth = everything[5]
    if not (isinstance(fifth, tuple) and len(fifth) == 3 and fifth[2] == "000005"):
        raise PartFailed("with keys=None, index 5 must be key '000005' (labels.csv order)")
    chosen = ctx.call(keys=[s.key for s in samples])
    if len(chosen) != len(samples):
        raise PartFailed(f"with {len(samples)} keys given, len() is {len(chosen)}")
    return f"len() is {len(everything)} for all keys and {len(chosen)} for {len(samples)} keys"


def _jpeg_items(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    keys = [s.key for s in samples]
    ds = ctx.call(keys=keys, return_key=True)
    items = {index: attempt(ds.__getitem__, f"dataset[{index}]", index) for index in (0, 1, len(samples) - 1)}
    for item in items.values():
        check_item(item, True)
    _keys_in_order({index: item[2] for index, item in items.items()}, keys)
    plain = ctx.call(keys=[s.key for s in samples[:2]])
    check_item(attempt(plain.__getitem__, "dataset[0]", 0), False)
    return "items are (float32 3x256x256 image, int label[, key])"


def _jpeg_labels_pixels(ctx: Context) -> str:
    samples = ctx.fixtures["samples"][:96]
    ds = ctx.call(keys=[s.key for s in samples], return_key=True)
    records = collect_epoch(make_loader(ctx, ds, batch_size=24), len(samples), "pixels")
    return audit_records(records, samples, ctx.fixtures["pixels"])


def _jpeg_workers(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    ds = ctx.call(keys=[s.key for s in samples], transform=sha256_transform, return_key=True)
    loader = make_loader(ctx, ds, workers=2, method="fork", shuffle=True)
    return audit_records(collect_epoch(loader, len(samples), "sha256"), samples, sha_reference(samples), workers=2)


def _jpeg_bad_key(ctx: Context) -> str:
    try:
        ds = ctx.candidate(keys=["000001", "777777"], transform=sha256_transform)
        item = ds[1]
    except Exception as exc:
        if "777777" in str(exc):
            return f"unknown key refused: {type(exc).__name__}"
        raise PartFailed(f"the error does not name the missing key or file: {describe(exc)}") from None
    raise PartFailed(f"dataset[1] for key '777777' (no such image) returned {type(item).__name__} instead of raising")


register(
    "jpeg_dataset",
    "01_jpeg_dataset",
    "a map-style Dataset over the folder of JPEGs and labels.csv",
    "JpegFolderDataset(keys=None, transform=None, return_key=False): item i is (transform(jpeg bytes), label[, key]); "
    "transform defaults to packlab.transforms.standard_transform; keys=None means every key of labels.csv, in order",
    _jpeg_fixtures,
    [
        ("length", "len() counts the keys given; keys=None means every key, in labels.csv order",
         "keep the list of keys in __init__ (all keys of labels.csv when keys is None) and return its length", _jpeg_length),
        ("items", "item i is (float32 3x256x256 image, int label) of the i-th key given, plus the key with return_key=True",
         "keep the keys in the order given (never sort them); read the file's bytes, return (self.transform(data), label) "
         "and add the key when return_key is true", _jpeg_items),
        ("labels_pixels", "labels and pixels match the manifest (96 samples, no workers)",
         "look the label up by key in labels.csv, not by index; pass the raw file bytes to standard_transform", _jpeg_labels_pixels),
        ("workers", "2 workers, shuffled: every sample exactly once, bytes match the manifest's SHA-256",
         "apply the transform given to the constructor to the file's bytes; derive everything from the index alone", _jpeg_workers),
        ("bad_key", "a key without an image raises an error that names it",
         "let the missing file raise (or check keys against labels.csv) and name the key; never substitute another sample", _jpeg_bad_key),
    ],
)


# ----------------------------------------------------------------- 1b. a timing harness


class _FakeLoader:
    """A loader with known timings: a start-up pause, then batches of known sizes at a known pace.

    The first epoch's start-up is longer, as when worker processes start; so the epochs
    differ, and a rate taken from one epoch differs from the rate over all of them.
    """

    batch_size = 32  # tempting, but the last batch is smaller

    def __init__(self, batch_sizes=(32, 32, 32, 4), startups=(0.25, 0.05), per_batch=0.01):
        self.batch_sizes, self.startups, self.per_batch = batch_sizes, startups, per_batch
        self.passes = 0

    def __len__(self):
        return len(self.batch_sizes)

    def __iter__(self):
        self.passes += 1
        return self._epoch(self.startup(self.passes - 1))

    def _epoch(self, startup: float):
        time.sleep(startup)
        for n in self.batch_sizes:
            time.sleep(self.per_batch)
            yield torch.zeros(n, 1), torch.zeros(n, dtype=torch.long)

    def startup(self, epoch: int) -> float:
        return self.startups[min(epoch, len(self.startups) - 1)]

    def minimum_epoch_seconds(self, epoch: int) -> float:
        return self.startup(epoch) + self.per_batch * len(self.batch_sizes)


def _timing_run(ctx: Context):
    """Run the candidate once per child on a fake loader; parts share the result."""
    if "timing" not in ctx.memo:
        loader = _FakeLoader()
        start = time.perf_counter()
        result = ctx.call(loader, epochs=3)
        wall = time.perf_counter() - start
        fields = {}
        for name in ("epoch_seconds", "images_per_epoch", "images_per_s"):
            value = result.get(name) if isinstance(result, dict) else getattr(result, name, None)
            if value is None:
                raise PartFailed(f"the result has no {name!r} (return a dict with epoch_seconds, images_per_epoch, images_per_s)")
            fields[name] = value
        ctx.memo["timing"] = (loader, wall, fields)
    return ctx.memo["timing"]


def _timing_epochs(ctx: Context) -> str:
    loader, _, result = _timing_run(ctx)
    seconds = list(result["epoch_seconds"])
    if len(seconds) != 3 or not all(isinstance(s, (float, int)) and s > 0 for s in seconds):
        raise PartFailed(f"epochs=3 should give 3 positive epoch times, got {seconds!r}")
    if loader.passes != 3:
        raise PartFailed(f"the loader was iterated {loader.passes} times for 3 epochs; start a fresh pass (for batch in loader) per epoch")
    return "3 epochs, 3 passes over the loader, 3 timings"


def _timing_images(ctx: Context) -> str:
    _, _, result = _timing_run(ctx)
    if result["images_per_epoch"] != 100:
        raise PartFailed(f"an epoch of batches of 32, 32, 32 and 4 images holds 100 images; you counted {result['images_per_epoch']!r}")
    return "100 images per epoch counted from the batches"


def _timing_startup(ctx: Context) -> str:
    loader, wall, result = _timing_run(ctx)
    seconds = list(result["epoch_seconds"])
    minimum = [loader.minimum_epoch_seconds(epoch) for epoch in range(len(seconds))]
    if any(s < floor - 0.005 for s, floor in zip(seconds, minimum)):
        raise PartFailed(
            f"the epochs take at least {', '.join(f'{m:.2f}' for m in minimum)} s (of which "
            f"{', '.join(f'{loader.startup(e):.2f}' for e in range(len(seconds)))} s before the first batch); "
            f"you measured {', '.join(f'{s:.3f}' for s in seconds)} s"
        )
    if sum(seconds) > wall + 0.005:
        raise PartFailed(f"the epochs add up to {sum(seconds):.3f} s, more than the {wall:.3f} s the whole call took")
    return f"epochs of {', '.join(f'{s:.2f}' for s in seconds)} s include the wait for the first batch"


def _timing_rate(ctx: Context) -> str:
    _, _, result = _timing_run(ctx)
    seconds = list(result["epoch_seconds"])
    expected = result["images_per_epoch"] * len(seconds) / sum(seconds) if sum(seconds) > 0 else float("nan")
    rate = float(result["images_per_s"])
    if not (abs(rate - expected) <= 0.02 * expected):
        images = result["images_per_epoch"]
        guesses = {f"the rate of a single epoch, not of all {len(seconds)}": [images / s for s in seconds if s > 0],
                   "the mean of the epochs' rates": [sum(images / s for s in seconds if s > 0) / len(seconds)]}
        what = next((f" ({name})" for name, values in guesses.items() if any(abs(rate - v) <= 0.02 * v for v in values)), "")
        raise PartFailed(
            f"images_per_s is {rate:.1f}{what}, but {images} images x {len(seconds)} epochs / {sum(seconds):.3f} s "
            f"= {expected:.1f}: the epochs differ (the first waits longer for its first batch), so take all of them"
        )
    return f"{rate:.0f} images/s = images over all epochs / total time"


register(
    "jpeg_timing",
    "01_jpeg_dataset",
    "a timing harness: per-epoch wall time and images/s of any loader",
    "time_epochs(loader, epochs=2) -> dict with 'epoch_seconds' (list of float, one per epoch), "
    "'images_per_epoch' (int) and 'images_per_s' (float, over all epochs)",
    dict,
    [
        ("epochs", "one fresh pass and one timing per epoch",
         "loop `for epoch in range(epochs)`, and inside it `for batch in loader`; append one time per epoch", _timing_epochs),
        ("images", "images are counted from the batches, the last partial batch included",
         "add the length of each batch's first tensor (images.shape[0]); len(loader) * batch_size overcounts the last batch", _timing_images),
        ("startup", "the wait for the first batch (worker start-up) is inside the epoch time",
         "start the clock before the `for` loop asks for the first batch and stop it after the last one", _timing_startup),
        ("rate", "images/s = images per epoch x epochs / total seconds",
         "divide all images delivered by the sum of the epoch times", _timing_rate),
    ],
)

"""Checks of exercise 10 (``10_fast_path``): chapter 11's training crops, reproducible and cheap to decode.

The candidate is an ``IterableDataset`` class ``TrainingCrops(dataset, seed=0, size=224)``
that wraps a dataset of ``(jpeg bytes, label, key)`` samples (a ``TarShardDataset`` with
``transform=crops.encoded`` and ``return_key=True``) into one of ``(uint8 size x size x 3
crop, label, key)``, with ``set_epoch``, ``state_dict`` and ``load_state_dict`` passed on
to the wrapped dataset, and three static methods:

* ``window(key, width, height, seed, epoch)`` -> a :class:`packlab.crops.Crop`: the
  sample's ``RandomResizedCrop`` window and flip, drawn from ``(seed, epoch, key)`` alone;
* ``decode(jpeg_bytes, crop, size)`` -> the window resized to ``size`` x ``size`` (bilinear)
  and mirrored if the crop says so, as uint8 H x W x RGB, decoded at the reduced scale
  the *crop* allows (Pillow's ``draft``) or only the window (``crops.decode_window``);
* ``store(jpeg_bytes, side)`` -> JPEG bytes of the image with its longer side ``side``,
  aspect kept, never enlarged (chapter 11's "maximum side" storage).

Each part catches one mistake that still gives plausible crops: windows from a global
random generator (or from Python's ``hash()``, which changes from one interpreter to the
next), an epoch or a seed left out of the draw, a squash in place of a crop, a decode at
full size where the crop allows a reduced one, a ``draft`` sized by the image rather than
the crop, a float or channels-first result, an epoch that persistent workers never see,
crops that follow the worker (its id, or a generator advanced along its stream) and so
change with the worker count and after a resume, a wrapper that loses the reader's
position, storage squashed or enlarged. The parts compare what comes out (windows, pixels
against the standard's crop of the same window, crops of the same key read in different
ways) and watch at which size Pillow decodes; nothing is timed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import multiprocessing
import random
import warnings

import numpy as np
import torch

from packlab import data
from packlab.course.grading import fixtures
from packlab.course.grading.core import Context, PartFailed, attempt, describe, register

#: Samples the check reads (a fixed random subset), how many per shard, and how many 4x larger copies.
SAMPLES, PER_SHARD, LARGE = 48, 8, 6
#: The crop side the check asks for, and the seed it gives.
SIZE, SEED = 224, 7
#: The smallest PSNR (dB) against the standard's crop of the same window that counts as "the same crop".
MIN_PSNR = 40.0
#: RandomResizedCrop's ranges (area share, width / height), with room for the rounding to whole pixels.
SCALE, RATIO, SLACK = (0.08, 1.0), (3 / 4, 4 / 3), 0.03


def _fixtures() -> dict:
    from packlab import crops, decode

    samples = fixtures.subset(SAMPLES, seed=1010)
    shards = fixtures.fixture_shards("training-crops-48-8", samples, maxcount=PER_SHARD)
    root = fixtures.fixture_root()
    with fixtures.locked(root):
        large = decode.high_resolution_copies(samples[:LARGE], root / "fast-path-large-x4-q90")
    encoded = {s.key: data.image_path(s.key).read_bytes() for s in samples}
    return {
        "samples": samples,
        "shards": [str(p) for p in shards],
        "encoded": encoded,
        "sizes": {key: crops.jpeg_size(blob) for key, blob in encoded.items()},
        "large": [(p.stem, p.read_bytes()) for p in large],
    }


# ------------------------------------------------------------------------------ helpers


def _method(ctx: Context, name: str):
    method = getattr(ctx.candidate, name, None)
    if not callable(method):
        raise PartFailed(f"{ctx.name} has no method {name}(); write it as a @staticmethod of the class")
    return method


def _window(ctx: Context, key: str, width: int, height: int, seed: int = SEED, epoch: int = 0, window=None):
    """The candidate's window for one sample, as a :class:`packlab.crops.Crop` on an image of ``width`` x ``height``."""
    from packlab import crops

    window = window or _method(ctx, "window")
    got = attempt(window, f"{ctx.name}.window", key, width, height, seed, epoch)
    try:
        values = [int(getattr(got, name)) for name in ("top", "left", "height", "width")]
        flip = bool(got.flip)
    except (AttributeError, TypeError, ValueError):
        raise PartFailed(f"window({key!r}, {width}, {height}, ...) returned {type(got).__name__}: return a "
                         "packlab.crops.Crop(top, left, height, width, flip, (width, height))") from None
    return crops.Crop(*values, flip, (width, height))


def _hwc(image, what: str) -> np.ndarray:
    """A crop as ``SIZE`` x ``SIZE`` x 3 uint8, or a failure saying what it was instead."""
    if isinstance(image, torch.Tensor):
        image = image.numpy() if image.dtype == torch.uint8 else image
    if isinstance(image, torch.Tensor) or np.asarray(image).dtype != np.uint8:
        kind = image.dtype if isinstance(image, torch.Tensor) else np.asarray(image).dtype
        raise PartFailed(f"{what} is {kind}: return the crop as uint8 (it crosses from the workers at a quarter of "
                         "float32's bytes; the training process converts it)")
    array = np.asarray(image)
    if array.shape != (SIZE, SIZE, 3):
        hint = " (channels first: give height x width x RGB, as Pillow and libjpeg do)" if array.shape == (
            3, SIZE, SIZE) else ""
        raise PartFailed(f"{what} has shape {array.shape}; a crop must be {SIZE} x {SIZE} x 3{hint}")
    return array


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    error = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if error == 0 else 10 * math.log10(255**2 / error)


def _db(value: float) -> str:
    return "identical" if math.isinf(value) else f"{value:.1f} dB"


def _central(width: int, height: int, side: int, flip: bool):
    """A square window of ``side`` pixels in the middle of an image (the check's own, fixed windows)."""
    from packlab import crops

    side = min(side, width, height)
    return crops.Crop((height - side) // 2, (width - side) // 2, side, side, flip, (width, height))


@contextlib.contextmanager
def _watch_decodes(seen: list):
    """Record how many pixels each decode makes: Pillow's (after any ``draft``) and ``crops.decode_window``'s."""
    from PIL import ImageFile

    from packlab import crops

    load, window = ImageFile.ImageFile.load, crops.decode_window

    def watched_load(image, *args, **kwargs):
        if getattr(image, "tile", None):  # not yet decoded: this call decodes, at the size set now
            seen.append(("Pillow", image.size))
        return load(image, *args, **kwargs)

    def watched_window(data_, box, *args, **kwargs):
        seen.append(("decode_window", (box[2] - box[0], box[3] - box[1])))
        return window(data_, box, *args, **kwargs)

    ImageFile.ImageFile.load, crops.decode_window = watched_load, watched_window
    try:
        yield
    finally:
        ImageFile.ImageFile.load, crops.decode_window = load, window


def _dataset(ctx: Context, cls=None, seed: int = SEED):
    from packlab import crops
    from packlab.loaders import TarShardDataset

    inner = TarShardDataset(ctx.fixtures["shards"], transform=crops.encoded, return_key=True, shuffle_buffer=0)
    return attempt(cls or ctx.candidate, ctx.name, inner, seed=seed, size=SIZE)


def _set_epoch(dataset, epoch: int) -> None:
    try:
        dataset.set_epoch(epoch)
    except Exception as exc:
        raise PartFailed(f"set_epoch({epoch}) raised {describe(exc)}") from exc


def _loader(ctx: Context, dataset, workers: int = 0, method: str = "fork", persistent: bool = False,
            stateful: bool = False, batch_size: int = PER_SHARD):
    options = {"batch_size": batch_size}
    if workers:
        options.update(num_workers=workers, multiprocessing_context=method, persistent_workers=persistent,
                       timeout=ctx.loader_timeout + (ctx.startup_timeout if method != "fork" else 0))
    if stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
        return StatefulDataLoader(dataset, **options)
    from torch.utils.data import DataLoader

    return DataLoader(dataset, **options)


def _crops_of(ctx: Context, loader, what: str, stop_after: int | None = None) -> dict[str, np.ndarray]:
    """Each key's crop from ``loader``'s batches (up to ``stop_after`` batches); a key that comes twice fails."""
    found: dict[str, np.ndarray] = {}
    iterator = iter(loader)
    try:
        for step, batch in enumerate(iterator, start=1):
            if not (isinstance(batch, (tuple, list)) and len(batch) == 3):
                raise PartFailed(f"{what}: every sample must be (crop, label, key)")
            images, _, keys = batch
            for image, key in zip(images, keys):
                key = str(key)
                if key in found:
                    raise PartFailed(f"{what}: sample {key} came twice")
                found[key] = _hwc(image, f"{what}: the crop of {key}")
            if len(found) > 3 * SAMPLES:
                raise PartFailed(f"{what} delivered more than {3 * SAMPLES} samples and did not end")
            if step == stop_after:
                break
    except PartFailed:
        fixtures.stop_workers(iterator)
        raise
    except Exception as exc:
        fixtures.stop_workers(iterator)
        raise PartFailed(f"reading {what} raised {describe(exc)}") from exc
    return found


def _all_keys(ctx: Context, found: dict, what: str) -> None:
    missing = sorted({s.key for s in ctx.fixtures["samples"]} - set(found))
    if missing:
        raise PartFailed(f"{what}: {len(missing)} of {SAMPLES} samples never came (e.g. {missing[0]})")


# -------------------------------------------------------------------------------- parts


def _window_valid(ctx: Context) -> str:
    sizes, flips, small, seen = ctx.fixtures["sizes"], 0, 0, 0
    for key, (width, height) in sizes.items():
        for epoch in range(3):
            crop = _window(ctx, key, width, height, epoch=epoch)
            seen += 1
            inside = 0 <= crop.top and 0 <= crop.left and crop.top + crop.height <= height and \
                crop.left + crop.width <= width and crop.height > 0 and crop.width > 0
            if not inside:
                raise PartFailed(f"the window of {key} (epoch {epoch}) on its {width} x {height} image is {crop}: "
                                 "it must lie inside the image")
            share, ratio = crop.width * crop.height / (width * height), crop.width / crop.height
            if share < SCALE[0] - SLACK or not RATIO[0] - SLACK <= ratio <= RATIO[1] + SLACK:
                raise PartFailed(f"the window of {key} (epoch {epoch}) covers {share:.0%} of the image with width / "
                                 f"height {ratio:.2f}: RandomResizedCrop draws 8 to 100 % of the area and a ratio "
                                 "between 3/4 and 4/3 (use crops.random_resized_crop, torchvision's steps)")
            flips += crop.flip
            small += share < 0.9
    if small < seen // 2:
        raise PartFailed(f"only {small} of {seen} windows cover less than 90 % of their image: a random resized crop "
                         "covers about half of it on average; is the whole image (a squash) taken instead?")
    if not 0.3 * seen <= flips <= 0.7 * seen:
        raise PartFailed(f"{flips} of {seen} windows are mirrored: RandomHorizontalFlip mirrors half of them (p=0.5)")
    return f"{seen} windows inside their images, with RandomResizedCrop's ranges; {flips} mirrored"


def _windows(cls, keys_and_sizes, seed: int, epoch: int) -> list[tuple]:
    """The windows of ``cls.window`` as plain tuples (run in a fresh interpreter by the reproducible part)."""
    out = []
    for key, width, height in keys_and_sizes:
        crop = cls.window(key, width, height, seed, epoch)
        out.append((int(crop.top), int(crop.left), int(crop.height), int(crop.width), bool(crop.flip)))
    return out


def _window_reproducible(ctx: Context) -> str:
    items = [(key, *size) for key, size in list(ctx.fixtures["sizes"].items())[:24]]
    first = [dataclasses.astuple(_window(ctx, *item))[:5] for item in items]
    for shift in (1, 2):  # any other state of the global generators
        torch.manual_seed(1000 + shift)
        random.seed(1000 + shift)
        np.random.seed(1000 + shift)
        again = [dataclasses.astuple(_window(ctx, *item))[:5] for item in items]
        if again != first:
            changed = sum(a != b for a, b in zip(first, again))
            raise PartFailed(f"called again with the same (seed, epoch, key), {changed} of {len(items)} windows came "
                             "out different: they follow a global random generator (torch's, random's or numpy's), "
                             "which depends on what ran before, in which worker. Draw from a torch.Generator of "
                             "your own, seeded from (seed, epoch, key) alone")
    cls = ctx.importable()
    try:
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            fresh = pool.apply(_windows, (cls, items, SEED, 0))
    except Exception as exc:
        raise PartFailed(f"computing the windows in a fresh interpreter (a spawn worker) raised {describe(exc)}; keep "
                         "the class and its imports in one cell") from exc
    if fresh != first:
        changed = sum(a != b for a, b in zip(first, fresh))
        raise PartFailed(f"in a fresh interpreter {changed} of {len(items)} windows came out different from this "
                         "process's: the seed depends on the process. Python's hash() of a string changes with "
                         "every interpreter (PYTHONHASHSEED); make the key a number with a stable hash "
                         "(packlab.seeding.key_number, or hashlib)")
    return f"{len(items)} windows the same after the global generators were reseeded, and in a fresh interpreter"


def _window_epochs(ctx: Context) -> str:
    items = list(ctx.fixtures["sizes"].items())
    base = [dataclasses.astuple(_window(ctx, key, *size))[:5] for key, size in items]
    for what, seed, epoch, advice in (
            ("epoch 1", SEED, 1, "mix the epoch into the sample's seed: every epoch must draw new crops"),
            (f"seed {SEED + 1}", SEED + 1, 0, "mix the seed into the sample's seed: another run, other crops")):
        other = [dataclasses.astuple(_window(ctx, key, *size, seed=seed, epoch=epoch))[:5] for key, size in items]
        same = sum(a == b for a, b in zip(base, other))
        if same > len(items) // 4:
            raise PartFailed(f"{same} of {len(items)} samples got the same window in {what} as in epoch 0 with seed "
                             f"{SEED}: {advice}")
    keys = len({window for window in base})
    if keys < len(items) * 3 // 4:
        raise PartFailed(f"{len(items)} samples got only {keys} different windows: mix the key into the sample's seed")
    return f"new windows in another epoch and with another seed; {keys} different windows for {len(items)} keys"


def _crop_cases(ctx: Context) -> list[tuple[str, bytes, object]]:
    """(name, JPEG bytes, window): originals with drawn windows, and the large copies with fixed small windows."""
    from packlab import crops

    cases = []
    for sample in ctx.fixtures["samples"][:12]:
        blob = ctx.fixtures["encoded"][sample.key]
        for epoch in (0, 1):
            cases.append((f"{sample.key}.jpg (epoch {epoch})", blob,
                          crops.crop_for(sample.key, *ctx.fixtures["sizes"][sample.key], seed=SEED, epoch=epoch)))
    for i, (key, blob) in enumerate(ctx.fixtures["large"]):
        width, height = crops.jpeg_size(blob)
        # A window twice 224 a side (1/2 scale allowed) and one barely larger than 224 (no reduced scale allowed).
        cases.append((f"{key} x4, a {2 * SIZE + 20} px window", blob, _central(width, height, 2 * SIZE + 20, i % 2 == 0)))
        cases.append((f"{key} x4, a {SIZE + 40} px window", blob, _central(width, height, SIZE + 40, i % 2 == 1)))
    return cases


def _crop_pixels(ctx: Context) -> str:
    from packlab import crops

    decode = _method(ctx, "decode")
    worst, worst_case = math.inf, ""
    for name, blob, crop in _crop_cases(ctx):
        out = _hwc(attempt(decode, f"{ctx.name}.decode", blob, crop, SIZE), f"decode({name})")
        value = _psnr(out, crops.crop_reference(blob, crop))
        if value < worst:
            worst, worst_case, worst_crop = value, name, crop
    if worst < MIN_PSNR:
        raise PartFailed(
            f"the crop of {worst_case} has a PSNR of only {_db(worst)} against the standard's crop of the same window "
            f"(at least {MIN_PSNR:.0f} dB expected; window {worst_crop}). Resize exactly the window (not the whole "
            "image) to the size, bilinear, mirror it when crop.flip says so, and decode at a reduced scale only as "
            "far as the window allows: the crop, not the image, must stay at least the size a side")
    return f"{len(_crop_cases(ctx))} crops, at least {_db(worst)} against the standard's crop of the same window"


def _reduced_decode(ctx: Context) -> str:
    from packlab import crops

    decode = _method(ctx, "decode")
    checked = []
    for key, blob in ctx.fixtures["large"]:
        width, height = crops.jpeg_size(blob)
        crop = _central(width, height, int(0.6 * min(width, height)), False)  # a third of the area, 1/2 scale or more
        seen: list = []
        with _watch_decodes(seen):
            _hwc(attempt(decode, f"{ctx.name}.decode", blob, crop, SIZE), f"decode({key} x4)")
        if not seen:
            raise PartFailed("the check could not see your decoder (it watches Pillow's decode and "
                             "packlab.crops.decode_window): decode with Pillow, with image.draft(...) before the "
                             "pixels load")
        how, (w, h) = max(seen, key=lambda item: item[1][0] * item[1][1])
        if w * h > width * height / 2:
            raise PartFailed(f"a {width} x {height} JPEG was decoded at {w} x {h} ({how}) for a {crop.width} x "
                             f"{crop.height} window, which allows 1/{crops.draft_scale_for(crop.width, crop.height)} "
                             "scale: call image.draft('RGB', (width // scale, height // scale)) with the scale the "
                             "window allows, after Image.open and before anything loads the pixels")
        checked.append((width * height) / (w * h))
    return (f"{len(checked)} large JPEGs with windows of a third of their area: decoded with "
            f"{min(checked):.0f}x to {max(checked):.0f}x fewer pixels than the whole image")


def _expected_crops(ctx: Context, epoch: int) -> dict[str, np.ndarray]:
    """The standard's crop of the candidate's window for each sample in ``epoch``."""
    from packlab import crops

    return {key: crops.crop_reference(blob, _window(ctx, key, *ctx.fixtures["sizes"][key], epoch=epoch))
            for key, blob in ctx.fixtures["encoded"].items()}


def _dataset_epoch(ctx: Context) -> str:
    dataset = _dataset(ctx)
    _set_epoch(dataset, 0)
    loader = _loader(ctx, dataset, workers=1, persistent=True)
    expected = {epoch: _expected_crops(ctx, epoch) for epoch in (0, 1)}
    for epoch in (0, 1):
        _set_epoch(dataset, epoch)
        found = _crops_of(ctx, loader, f"epoch {epoch}")
        _all_keys(ctx, found, f"epoch {epoch}")
        wrong = [key for key, image in found.items() if _psnr(image, expected[epoch][key]) < MIN_PSNR]
        if wrong:
            old = sum(_psnr(found[key], expected[0][key]) >= MIN_PSNR for key in wrong) if epoch else 0
            if old == len(wrong):
                raise PartFailed("with a persistent worker, epoch 1's crops were epoch 0's: set_epoch(1) in the "
                                 "training process did not reach the worker, which keeps the copy of the dataset it "
                                 "started with. Take the epoch from the wrapped dataset (it keeps it in shared "
                                 "memory) when each pass starts")
            raise PartFailed(f"in epoch {epoch}, {len(wrong)} of {SAMPLES} crops (e.g. {wrong[0]}) are not the crop of "
                             f"window(key, width, height, seed, {epoch}) on the sample's own image: draw each "
                             "sample's window from (seed, epoch, key) and its size (crops.jpeg_size), nothing else")
    return f"a persistent worker, epochs 0 and 1: every sample once each epoch, each crop that epoch's window"


def _worker_counts(ctx: Context) -> str:
    cls = ctx.importable()
    fixtures.preflight_spawn(_dataset(ctx, cls))
    reads = {}
    for what, workers, method in (("no workers", 0, "fork"), ("3 fork workers", 3, "fork"),
                                  ("2 spawn workers", 2, "spawn")):
        dataset = _dataset(ctx, cls)
        _set_epoch(dataset, 2)
        reads[what] = _crops_of(ctx, _loader(ctx, dataset, workers=workers, method=method), f"epoch 2 with {what}")
        _all_keys(ctx, reads[what], f"epoch 2 with {what}")
    base = reads["no workers"]
    for what, found in reads.items():
        changed = [key for key in base if not np.array_equal(base[key], found[key])]
        if changed:
            raise PartFailed(f"read with {what}, {len(changed)} of {SAMPLES} samples (e.g. {changed[0]}) got other "
                             "crops than with no workers: the crop follows the worker (its id, its random "
                             "generator, or how many samples it read before). Draw each window from (seed, epoch, "
                             "key) alone, with a generator of its own")
    return f"epoch 2 read with no workers, 3 fork and 2 spawn workers: every sample's crop identical"


def _resume(ctx: Context) -> str:
    dataset = _dataset(ctx)
    _set_epoch(dataset, 1)
    whole = _crops_of(ctx, _loader(ctx, dataset, workers=2, stateful=True, batch_size=4), "an uninterrupted epoch 1")
    dataset = _dataset(ctx)
    _set_epoch(dataset, 1)
    loader = _loader(ctx, dataset, workers=2, stateful=True, batch_size=4)
    first = _crops_of(ctx, loader, "epoch 1 until the stop", stop_after=3)
    try:
        state = loader.state_dict()
    except Exception as exc:
        raise PartFailed(f"loader.state_dict(), which calls the dataset's state_dict() in each worker, raised "
                         f"{describe(exc)}") from exc
    dataset = _dataset(ctx)
    _set_epoch(dataset, 1)
    resumed = _loader(ctx, dataset, workers=2, stateful=True, batch_size=4)
    try:
        resumed.load_state_dict(state)
    except Exception as exc:
        raise PartFailed(f"loader.load_state_dict(saved) raised {describe(exc)}") from exc
    rest = _crops_of(ctx, resumed, "the resumed epoch 1")
    twice = sorted(set(first) & set(rest))
    if twice:
        raise PartFailed(f"{len(twice)} samples delivered before the stop came again after the resume (e.g. "
                         f"{twice[0]}): the wrapper lost the reader's position. Pass state_dict() and "
                         "load_state_dict() on to the wrapped dataset")
    _all_keys(ctx, {**first, **rest}, "epoch 1 stopped and resumed")
    changed = [key for key, image in rest.items() if not np.array_equal(image, whole[key])]
    if changed:
        raise PartFailed(f"after the resume {len(changed)} of {len(rest)} samples (e.g. {changed[0]}) got other "
                         "crops than in the uninterrupted epoch: the crop depends on where the reader started (a "
                         "generator advanced sample by sample). Draw each window from (seed, epoch, key) alone")
    return f"stopped after {len(first)} samples and resumed: the other {len(rest)}, each once, with the same crops"


def _store_max_side(ctx: Context) -> str:
    from PIL import Image

    from packlab import reencode

    store = _method(ctx, "store")
    cases = [(f"{s.key}.jpg", ctx.fixtures["encoded"][s.key]) for s in ctx.fixtures["samples"][:8]]
    cases += [(f"{key} x4", blob) for key, blob in ctx.fixtures["large"][:2]]
    worst = math.inf
    for side in (320, 512):
        for name, blob in cases:
            out = attempt(store, f"{ctx.name}.store", blob, side)
            if not isinstance(out, (bytes, bytearray)):
                raise PartFailed(f"store({name}, {side}) returned {type(out).__name__}: return the JPEG's bytes")
            try:
                with Image.open(io.BytesIO(out)) as image:
                    image_format, got = image.format, image.size
                    pixels = np.asarray(image.convert("RGB"))
            except Exception as exc:
                raise PartFailed(f"store({name}, {side}) returned bytes that Pillow cannot open: {describe(exc)}") from None
            if image_format != "JPEG":
                raise PartFailed(f"store({name}, {side}) returned a {image_format}: store a JPEG")
            with Image.open(io.BytesIO(blob)) as original:
                size = original.size
            expected = reencode.max_side_size(*size, side)
            if got != expected:
                what = ("enlarged: an image smaller than the side is kept at its size" if got[0] > size[0]
                        else "squashed: the aspect ratio must be kept" if got[0] == got[1] and expected[0] != expected[1]
                        else "not the longer side shrunk to the side, the aspect kept")
                raise PartFailed(f"a {size[0]} x {size[1]} image stored with side {side} came out {got[0]} x {got[1]} "
                                 f"instead of {expected[0]} x {expected[1]}: {what}")
            worst = min(worst, _psnr(pixels, reencode.stored_pixels(blob, side, fit="max side")))
    if worst < 30:
        raise PartFailed(f"a stored image has a PSNR of only {_db(worst)} against the image resized (bilinear) to its "
                         "stored size: resize the decoded image, and save at a quality of about 90")
    return (f"{2 * len(cases)} images stored with the longer side at most 320 or 512, aspect kept, never enlarged; "
            f"at least {_db(worst)} against a bilinear resize")


register(
    "fast_path",
    "10_fast_path",
    "chapter 11's training crops: windows drawn per sample from (seed, epoch, key), decoded at the scale the crop "
    "allows, the same whatever reads them, and stored at a maximum side",
    "TrainingCrops(dataset, seed=0, size=224): an IterableDataset over (jpeg bytes, label, key) samples yielding "
    "(uint8 size x size x 3 crop, label, key), with set_epoch, state_dict and load_state_dict of the wrapped "
    "dataset; static methods window(key, width, height, seed, epoch) -> crops.Crop, decode(jpeg_bytes, crop, size) "
    "-> uint8 size x size x 3, store(jpeg_bytes, side) -> JPEG bytes with the longer side at most side",
    _fixtures,
    [
        ("window_valid", "windows inside the image with RandomResizedCrop's ranges (8-100 % of the area, ratio "
         "3/4-4/3), about half of them mirrored",
         "crops.random_resized_crop(width, height, generator), then torch.rand(1, generator=generator) < 0.5 for "
         "the flip", _window_valid),
        ("window_reproducible", "the same (seed, epoch, key) gives the same window whatever the global random "
         "generators hold, and in a fresh interpreter",
         "generator = torch.Generator().manual_seed(seeding.sample_seed(seed, epoch, seeding.key_number(key)))",
         _window_reproducible),
        ("window_epochs", "another epoch, another seed or another key gives another window",
         "put seed, epoch and the key's number all three into the sample's seed", _window_epochs),
        ("crop_pixels", "decode gives the window resized to 224 x 224 (and mirrored) as uint8 H x W x 3, at least "
         "40 dB against the standard's crop of the same window",
         "scale = crops.draft_scale_for(crop.width, crop.height); image.draft('RGB', (w // scale, h // scale)); "
         "image.resize((size, size), Image.BILINEAR, box=the window in the decoded image's pixels)", _crop_pixels),
        ("reduced_decode", "a large JPEG with a window of a third of its area is decoded at a reduced scale (or only "
         "the window), not whole", "image.draft(...) after Image.open and before the pixels load, at the scale "
         "the window allows", _reduced_decode),
        ("dataset_epoch", "a persistent worker, epochs 0 and 1: every sample once, each crop the window of its "
         "(seed, epoch, key) on its own image", "read the epoch from the wrapped dataset in __iter__; "
         "crops.jpeg_size(jpeg_bytes) gives the size before decoding", _dataset_epoch),
        ("worker_counts", "the same epoch read with no workers, 3 fork and 2 spawn workers: identical crops",
         "nothing of the worker (its id, a generator it advances) may enter the window", _worker_counts),
        ("resume", "an epoch stopped after 3 batches and resumed (StatefulDataLoader, 2 workers): the rest once, "
         "with the crops of an uninterrupted epoch", "state_dict() and load_state_dict() return and take the wrapped "
         "dataset's", _resume),
        ("store_max_side", "store keeps the aspect ratio, shrinks the longer side to the side, never enlarges",
         "reencode.max_side_size(width, height, side) gives the size; resize (bilinear) only if it differs; save as "
         "JPEG quality 90", _store_max_side),
    ],
)

"""Checks of exercise 10 (``10_fast_path``): a loader's fast path past the decode ceiling.

The candidate is a class with three static methods, one per step of chapter 11's fast path:

* ``transform(jpeg_bytes, source)`` -> the 256 x 256 image as **uint8** (3 x 256 x 256
  tensor or 256 x 256 x 3 array), decoded at a reduced size where the JPEG allows it
  (Pillow's ``draft``, or any decoder that decodes at a reduced scale) and resized while
  still uint8, with a resize no slower than torch's (``transforms.v2``);
* ``collate(samples)`` -> ``[uint8 images N x 3 x 256 x 256, int64 labels(, keys)]``: the
  batch crosses the process boundary as uint8, built in shared memory inside a worker;
* ``normalise(images, mean, std)`` -> the float32 batch ``(pixel / 255 - mean) / std``,
  computed once, in the consumer, with the constants made once per device.

Each part catches one mistake that still gives plausible batches: a float32 crossing, a
batch built in private memory (copied again to cross), normalising twice, constants
built (and on a GPU copied) on every call, resizing in float or with a slower resize,
decoding at full size when a reduced decode would do, a transform no faster than the
standard. The parts watch what runs (which resizes see float tensors and how long they
take, at which size Pillow decodes, which tensors normalise creates, where the batch
lives) and what comes out, never how the code is written. The two timing parts compare
runs with :func:`packlab.bench.compare` and measure again, up to three times, before they
call a transform slow.
"""

from __future__ import annotations

import contextlib
import math
import time
import traceback

import numpy as np
import torch

from packlab import data
from packlab.course.grading import fixtures
from packlab.course.grading.core import Context, PartFailed, attempt, describe, register

#: Samples the check reads (a fixed random subset), and how many 4x larger copies of them.
SAMPLES, LARGE = 96, 6
#: How often a timing part measures before it calls a transform slow (each try: bench.ROUNDS interleaved rounds).
TRIES = 3
#: The smallest PSNR (dB) against the standard transform's pixels that counts as "the same image".
MIN_PSNR = 40.0
#: mean and std the normalise part uses (not ImageNet's, so that hard-coded values show).
MEAN, STD = (0.40, 0.50, 0.60), (0.20, 0.25, 0.30)


def _fixtures() -> dict:
    from packlab import decode
    from packlab.transforms import decode_and_resize

    samples = fixtures.subset(SAMPLES, seed=1010)
    shards = fixtures.fixture_shards("fast-path", samples, maxcount=32)
    root = fixtures.fixture_root()
    with fixtures.locked(root):
        large = decode.high_resolution_copies(samples[:LARGE], root / "fast-path-large-x4-q90")
    encoded = {s.key: data.image_path(s.key).read_bytes() for s in samples}
    return {
        "samples": samples,
        "shards": [str(p) for p in shards],
        "encoded": encoded,
        "reference": {key: decode_and_resize(blob) for key, blob in encoded.items()},
        "large": [(str(p), p.read_bytes()) for p in large],
    }


# ------------------------------------------------------------------------------ helpers


def _method(ctx: Context, name: str):
    method = getattr(ctx.candidate, name, None)
    if not callable(method):
        raise PartFailed(f"{ctx.name} has no method {name}(); write it as a @staticmethod of the class")
    return method


def _hwc(image, what: str) -> np.ndarray:
    """A transform's result as 256 x 256 x 3 uint8, or a failure saying what it was instead."""
    if isinstance(image, torch.Tensor):
        if image.dtype != torch.uint8:
            raise PartFailed(f"{what} is a {image.dtype} tensor: resize while the image is uint8 and return uint8; "
                             "the conversion to float belongs to the consumer (normalise)")
        if tuple(image.shape) != (3, 256, 256):
            raise PartFailed(f"{what} has shape {tuple(image.shape)}; a tensor must be 3 x 256 x 256 (channels first)")
        return image.permute(1, 2, 0).numpy()
    array = np.asarray(image)
    if array.dtype != np.uint8:
        raise PartFailed(f"{what} is a {array.dtype} array: resize while the image is uint8 and return uint8; "
                         "the conversion to float belongs to the consumer (normalise)")
    if array.shape != (256, 256, 3):
        raise PartFailed(f"{what} has shape {array.shape}; an array must be 256 x 256 x 3 (height, width, RGB)")
    return array


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    error = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if error == 0 else 10 * math.log10(255**2 / error)


class _Watch(torch.overrides.TorchFunctionMode):
    """Records what the code under watch resizes and decodes.

    * every ``torch.nn.functional.interpolate`` call: its input's dtype and size, and
      whether torchvision's v2 made the call (v2 converts to float itself on CPUs
      without AVX2, which is not the candidate's doing);
    * every Pillow ``Image.resize``: the image's mode and size;
    * every Pillow decode (``ImageFile.load``): the size it decodes at, after any ``draft``.
    """

    def __init__(self):
        super().__init__()
        self.resizes: list[tuple[str, tuple[int, int], bool]] = []  # (dtype or mode, (width, height), by v2)
        self.pillow_loads: list[tuple[int, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.interpolate and args and isinstance(args[0], torch.Tensor):
            by_v2 = any("transforms/v2" in frame.filename.replace("\\", "/") for frame in traceback.extract_stack())
            height, width = args[0].shape[-2:]
            self.resizes.append((str(args[0].dtype), (int(width), int(height)), by_v2))
        return func(*args, **kwargs)

    @contextlib.contextmanager
    def pillow(self):
        from PIL import Image, ImageFile

        resize, load = Image.Image.resize, ImageFile.ImageFile.load
        watch = self

        def watched_resize(image, *args, **kwargs):
            watch.resizes.append((image.mode, image.size, False))
            return resize(image, *args, **kwargs)

        def watched_load(image, *args, **kwargs):
            if getattr(image, "tile", None):  # not yet decoded: this call decodes, at the size set now
                watch.pillow_loads.append(image.size)
            return load(image, *args, **kwargs)

        Image.Image.resize, ImageFile.ImageFile.load = watched_resize, watched_load
        try:
            yield
        finally:
            Image.Image.resize, ImageFile.ImageFile.load = resize, load


def _watched(ctx: Context, blobs: list[tuple[str, bytes]]) -> tuple[_Watch, list]:
    """Run the candidate's transform on ``(source, bytes)`` pairs under a :class:`_Watch`."""
    transform = _method(ctx, "transform")
    watch = _Watch()
    outputs = []
    with watch, watch.pillow():
        for source, blob in blobs:
            outputs.append(attempt(transform, f"{ctx.name}.transform", blob, source))
    return watch, outputs


# -------------------------------------------------------------------------------- parts


def _transform_uint8(ctx: Context) -> str:
    transform = _method(ctx, "transform")
    worst = math.inf
    for sample in ctx.fixtures["samples"][:16]:
        out = attempt(transform, f"{ctx.name}.transform", ctx.fixtures["encoded"][sample.key], f"{sample.key}.jpg")
        pixels = _hwc(out, f"transform({sample.key}.jpg)")
        worst = min(worst, _psnr(pixels, ctx.fixtures["reference"][sample.key]))
    if worst < MIN_PSNR:
        raise PartFailed(f"the image of one JPEG has a PSNR of only {worst:.1f} dB against the standard transform's "
                         f"(at least {MIN_PSNR:.0f} dB expected): decode the whole JPEG where it is not twice 256 a "
                         "side, and resize with bilinear filtering to exactly 256 x 256")
    return "uint8 256 x 256 images, " + ("identical to the standard's" if math.isinf(worst)
                                        else f"a PSNR of at least {worst:.1f} dB against the standard's")


def _resize_uint8(ctx: Context) -> str:
    from packlab.decode import uint8_resize_is_native

    blobs = [(f"{s.key}.jpg", ctx.fixtures["encoded"][s.key]) for s in ctx.fixtures["samples"][:8]]
    watch, _ = _watched(ctx, blobs)
    native = uint8_resize_is_native()
    floats = [(kind, size) for kind, size, by_v2 in watch.resizes
              if (kind.startswith("torch.float") or kind in ("F", "RGBF", "I")) and (native or not by_v2)]
    if floats:
        kind, size = floats[0]
        raise PartFailed(f"an image of {size[0]} x {size[1]} was resized as {kind}: four times the bytes of uint8 and "
                         "no fast integer path. Resize the uint8 image (Pillow, or transforms.v2 on a uint8 tensor) "
                         "and convert to float only in the consumer")
    if not watch.resizes:
        raise PartFailed("the check saw no resize (Pillow's Image.resize or torch's interpolate, which "
                         "transforms.v2 uses): resize the decoded image to 256 x 256 with one of them")
    return f"{len(watch.resizes)} resizes, all on uint8 images"


def _reduced_decode(ctx: Context) -> str:
    watch, outputs = _watched(ctx, [(source, blob) for source, blob in ctx.fixtures["large"]])
    for output, (source, _) in zip(outputs, ctx.fixtures["large"]):
        _hwc(output, f"transform({source.rsplit('/', 1)[-1]})")
    from PIL import Image

    with Image.open(ctx.fixtures["large"][0][0]) as image:
        full = image.size
    seen = watch.pillow_loads + [size for _, size, _ in watch.resizes]
    if not seen:
        raise PartFailed("the check could not see your decoder (it watches Pillow's decode and the resize after "
                         "it): decode with Pillow, using Image.draft")
    largest = max(seen, key=lambda size: size[0] * size[1])
    if largest[0] > full[0] // 2 or largest[1] > full[1] // 2:
        raise PartFailed(f"a {full[0]} x {full[1]} JPEG was decoded (or resized from) {largest[0]} x {largest[1]}: "
                         "its full size, although it is more than twice 256 a side. Call image.draft('RGB', (256, 256)) "
                         "after Image.open and before the pixels are loaded, so libjpeg decodes at 1/2, 1/4 or 1/8 scale")
    return f"{full[0]} x {full[1]} sources decoded at {largest[0]} x {largest[1]} at most"


class _ResizeClock(torch.overrides.TorchFunctionMode):
    """Adds up the seconds spent inside resizes: Pillow's ``Image.resize`` and torch's ``interpolate``."""

    def __init__(self):
        super().__init__()
        self.seconds = 0.0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is not torch.nn.functional.interpolate:
            return func(*args, **(kwargs or {}))
        start = time.perf_counter()
        try:
            return func(*args, **(kwargs or {}))  # the mode is off while it handles a call: no recursion
        finally:
            self.seconds += time.perf_counter() - start

    @contextlib.contextmanager
    def pillow(self):
        from PIL import Image

        resize, clock = Image.Image.resize, self

        def timed_resize(image, *args, **kwargs):
            start = time.perf_counter()
            try:
                return resize(image, *args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - start

        Image.Image.resize = timed_resize
        try:
            yield
        finally:
            Image.Image.resize = resize


def _resize_seconds(work, blobs, passes: int = 3) -> float:
    """Seconds spent inside resizes while ``work(blob)`` runs over ``blobs``: the least of ``passes`` passes.

    The least, because what a shared machine adds (another process taking the core for a
    moment) only ever makes a pass longer.
    """
    best = math.inf
    for _ in range(passes):
        clock = _ResizeClock()
        with clock, clock.pillow():
            for blob in blobs:
                work(blob)
        best = min(best, clock.seconds)
    return best


def _v2_resize(blob):
    """The yardstick: torch's uint8 resize (transforms.v2) of the whole decoded image to 256 x 256."""
    from packlab.decode import decode_torchvision, resize_uint8

    return resize_uint8(decode_torchvision(blob))


def _resize_speed(ctx: Context) -> str:
    from packlab.bench import Spread, interleaved

    transform = _method(ctx, "transform")
    blobs = [ctx.fixtures["encoded"][s.key] for s in ctx.fixtures["samples"][:8]]
    slow = 0
    for _ in range(TRIES):
        runs = interleaved({
            "yours": lambda: _resize_seconds(lambda b: attempt(transform, f"{ctx.name}.transform", b, "<bytes>"),
                                             blobs),
            "torch": lambda: _resize_seconds(_v2_resize, blobs),
        })
        yours, torch_runs = runs["yours"], runs["torch"]
        if yours.median == 0:
            raise PartFailed("the check saw no time spent in a resize (Pillow's Image.resize or torch's interpolate, "
                             "which transforms.v2 uses): resize the decoded image with one of them")
        from packlab.bench import compare

        if compare(yours, torch_runs) <= 0:  # not clearly slower (compare on seconds: higher is slower)
            ratio = yours.median / torch_runs.median
            return (f"your resizes took {1e3 * yours.median / len(blobs):.2f} ms per image, torch's uint8 resize "
                    f"{1e3 * torch_runs.median / len(blobs):.2f} ms ({ratio:.2f}x): no slower")
        slow += 1
        if slow == 2:
            break
    ratio = yours.median / torch_runs.median
    raise PartFailed(f"your resizes took {1e3 * yours.median / len(blobs):.2f} ms per image against "
                     f"{1e3 * torch_runs.median / len(blobs):.2f} ms for torch's uint8 resize of the same images "
                     f"({ratio:.1f} times as long, clearly, twice): resize the uint8 tensor with "
                     "torchvision.transforms.v2.functional.resize(..., antialias=True) instead")


def _timing(ctx: Context) -> str:
    from packlab.bench import compare, interleaved, seconds_of
    from packlab.transforms import decode_and_resize

    transform = _method(ctx, "transform")
    small = [ctx.fixtures["encoded"][s.key] for s in ctx.fixtures["samples"][:8]]
    large = [blob for _, blob in ctx.fixtures["large"][:4]]

    def per_image_ms(work, blobs):
        # The least of three passes: a shared machine only ever makes a pass longer.
        return lambda: min(seconds_of(lambda: [work(b) for b in blobs])() for _ in range(3)) / len(blobs) * 1e3

    def yours(blob):
        return attempt(transform, f"{ctx.name}.transform", blob, "<bytes>")

    found = {}
    for size, blobs in (("ImageNet-sized", small), ("4x larger", large)):
        slower = 0
        for _ in range(TRIES):
            runs = interleaved({"yours": per_image_ms(yours, blobs), "standard": per_image_ms(decode_and_resize, blobs)})
            verdict = compare(runs["standard"], runs["yours"])  # on milliseconds: 1 means the standard is slower
            found[size] = (runs["yours"].median, runs["standard"].median, verdict)
            if verdict > 0 or (verdict == 0 and size == "ImageNet-sized"):
                break
            slower += verdict < 0
            if slower == 2:
                break
        mine, standard, verdict = found[size]
        if verdict < 0:
            raise PartFailed(f"on {size} JPEGs your transform took {mine:.2f} ms per image against the standard's "
                             f"{standard:.2f}: clearly slower, in two measurements. A fast path must not be slower "
                             "than the standard anywhere")
        if size == "4x larger" and verdict == 0:
            raise PartFailed(f"on JPEGs four times larger than needed your transform took {mine:.2f} ms per image, "
                             f"the standard {standard:.2f}: not clearly faster in {TRIES} measurements. Decode them at "
                             "a reduced size (draft) and resize with torch's uint8 resize")
    (small_mine, small_std, small_verdict), (large_mine, large_std, _) = found["ImageNet-sized"], found["4x larger"]
    return (f"ImageNet-sized: {small_mine:.2f} against {small_std:.2f} ms per image ("
            + ("clearly faster" if small_verdict > 0 else "no clear difference")
            + f"); 4x larger: {large_mine:.2f} against {large_std:.2f} ms, clearly faster")


def _first_batch(ctx: Context):
    from packlab.loaders import TarShardDataset

    dataset = TarShardDataset(ctx.fixtures["shards"], transform=_method(ctx, "transform"), return_key=True)
    loader = fixtures.make_loader(ctx, dataset, workers=2, method="fork", batch_size=16,
                                  collate_fn=_method(ctx, "collate"))
    return loader


def _check_batch(batch) -> None:
    if not (isinstance(batch, (list, tuple)) and len(batch) == 3):
        raise PartFailed(f"collate must return [images, labels, keys] for (image, label, key) samples; got a "
                         f"{type(batch).__name__}" + (f" of {len(batch)}" if isinstance(batch, (list, tuple)) else ""))
    images, labels, _ = batch
    if not isinstance(images, torch.Tensor):
        raise PartFailed(f"the images of a batch are a {type(images).__name__}: stack them into one tensor")
    if images.dtype != torch.uint8:
        raise PartFailed(f"the batch crossed from the workers as {images.dtype} ({images.element_size()} bytes a value, "
                         f"{images.numel() * images.element_size() / 1e6:.1f} MB for {len(images)} images): a float32 "
                         "crossing. Keep it uint8, N x 3 x 256 x 256, and let normalise convert it in the consumer")
    if tuple(images.shape[1:]) != (3, 256, 256):
        raise PartFailed(f"the batch has shape {tuple(images.shape)}; it must be N x 3 x 256 x 256 (channels first)")
    if not (isinstance(labels, torch.Tensor) and labels.dtype == torch.int64 and labels.dim() == 1):
        raise PartFailed(f"labels must be one int64 tensor per batch; got {type(labels).__name__} "
                         f"{getattr(labels, 'dtype', '')}")


def _collate_uint8(ctx: Context) -> str:
    loader = _first_batch(ctx)
    iterator = iter(loader)
    try:
        batch = next(iterator)
    except Exception as exc:
        fixtures.stop_workers(iterator)
        raise PartFailed(f"reading a batch raised {describe(exc)}") from exc
    fixtures.stop_workers(iterator)
    _check_batch(batch)
    return f"batches cross as uint8 {tuple(batch[0].shape)}: {batch[0].numel() / 1e6:.1f} MB, a quarter of float32"


def _collate_and_report(collate):
    """A collate for the check's workers: the candidate's batch, and whether its images were built in shared memory."""

    def wrapped(samples):
        batch = collate(samples)
        images = batch[0] if isinstance(batch, (list, tuple)) and batch else None
        shared = bool(isinstance(images, torch.Tensor) and images.is_shared())
        return batch, shared

    return wrapped


def _collate_shared(ctx: Context) -> str:
    from packlab.loaders import TarShardDataset

    dataset = TarShardDataset(ctx.fixtures["shards"], transform=_method(ctx, "transform"), return_key=True)
    loader = fixtures.make_loader(ctx, dataset, workers=2, method="fork", batch_size=16,
                                  collate_fn=_collate_and_report(_method(ctx, "collate")))
    iterator = iter(loader)
    try:
        batch, shared = next(iterator)
    except Exception as exc:
        fixtures.stop_workers(iterator)
        raise PartFailed(f"reading a batch raised {describe(exc)}") from exc
    fixtures.stop_workers(iterator)
    _check_batch(batch)
    if not shared:
        images = batch[0]
        raise PartFailed(f"inside a worker, collate built the batch ({images.numel() / 1e6:.1f} MB) in the worker's "
                         "private memory; to cross, it is then copied again into fresh shared memory (chapter 8). "
                         "Build it in shared memory from the start, as default_collate does in a worker "
                         "(default_collate on the uint8 images, then permute), or allocate it with "
                         "packlab.loaders.batching.empty_batch")
    return "inside a worker the batch is built in shared memory: it crosses without another copy"


class _Creations(torch.overrides.TorchFunctionMode):
    """Counts tensors made from Python numbers (``torch.tensor``, ``torch.as_tensor``, ``torch.Tensor``)."""

    def __init__(self):
        super().__init__()
        self.made = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.tensor, torch.as_tensor, torch.Tensor) or getattr(func, "__name__", "") in ("tensor",
                                                                                                  "as_tensor"):
            self.made += 1
        return func(*args, **(kwargs or {}))


def _normalise_constants(ctx: Context) -> str:
    normalise = _method(ctx, "normalise")
    images = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(11))
    mean, std = list(MEAN), list(STD)
    attempt(normalise, f"{ctx.name}.normalise", images, mean, std)  # the first call may make them
    counter = _Creations()
    with counter:
        for _ in range(3):
            attempt(normalise, f"{ctx.name}.normalise", images, mean, std)
    if counter.made:
        raise PartFailed(f"three more calls of normalise with the same mean and std made {counter.made} tensors from "
                         "Python numbers: a new mean and std tensor on every batch, which on a GPU is a small "
                         "synchronous copy from the host each time. Make them once per device (a dict keyed by "
                         "(tuple(mean), tuple(std), device), or functools.lru_cache) and reuse them")
    return "mean and std made once, then reused for every batch"


def _normalise_once(ctx: Context) -> str:
    normalise = _method(ctx, "normalise")
    generator = torch.Generator().manual_seed(10)
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8, generator=generator)
    images[0, :, 0, 0], images[0, :, 0, 1] = 0, 255
    given = images.clone()
    out = attempt(normalise, f"{ctx.name}.normalise", given, MEAN, STD)
    if not torch.equal(given, images):
        raise PartFailed("normalise changed the uint8 batch it was given; leave the input as it is")
    if not (isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == images.shape):
        raise PartFailed(f"normalise must return a float32 tensor of the batch's shape; got {type(out).__name__} "
                         f"{getattr(out, 'dtype', '')} {tuple(getattr(out, 'shape', ()))}")
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    scaled = images.float() / 255
    expected = (scaled - mean) / std
    if torch.allclose(out, expected, atol=1e-5):
        return "uint8 -> float32, / 255, then (x - mean) / std, once"
    wrong = {
        "normalised twice: (x - mean) / std was applied to a result that was already normalised":
            ((expected - mean) / std),
        "divided by 255 twice": ((scaled / 255 - mean) / std),
        "did not divide by 255 before normalising": ((images.float() - mean) / std),
        "divided by 255 but did not normalise with mean and std": scaled,
        "normalised with mean and std reversed": (scaled - std) / mean,
    }
    for mistake, candidate in wrong.items():
        if torch.allclose(out, candidate, atol=1e-4):
            raise PartFailed(f"normalise {mistake}. Convert once: images.float() / 255, then subtract mean and divide "
                             "by std, per channel")
    largest = (out - expected).abs().max().item()
    raise PartFailed(f"normalise's result differs from (pixel / 255 - mean) / std by up to {largest:.3g}; use the mean "
                     "and std given, one value per channel (shape 1 x 3 x 1 x 1 broadcasts over the batch)")


def _audit(ctx: Context) -> str:
    from packlab import audit

    loader = _first_batch(ctx)
    normalise = _method(ctx, "normalise")
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    records, worst, worst_key = [], math.inf, None
    iterator = iter(loader)
    try:
        for batch in iterator:
            _check_batch(batch)
            images, labels, keys = batch
            out = attempt(normalise, f"{ctx.name}.normalise", images, MEAN, STD)
            pixels = ((out * std + mean) * 255).round().clamp(0, 255).to(torch.uint8)
            for i, key in enumerate(keys):
                records.append((str(key), int(labels[i]), None))
                reference = ctx.fixtures["reference"].get(str(key))
                if reference is not None:
                    value = _psnr(pixels[i].permute(1, 2, 0).numpy(), reference)
                    if value < worst:
                        worst, worst_key = value, str(key)
            if len(records) > 3 * SAMPLES:
                raise PartFailed(f"the epoch delivered more than {3 * SAMPLES} samples ({SAMPLES} exist)")
    except PartFailed:
        fixtures.stop_workers(iterator)
        raise
    except Exception as exc:
        fixtures.stop_workers(iterator)
        raise PartFailed(f"reading an epoch raised {describe(exc)}") from exc
    report = audit.audit_epoch(records, ctx.fixtures["samples"])
    if not report.ok:
        raise PartFailed(report.summary())
    if worst < MIN_PSNR:
        raise PartFailed(f"after normalise, the pixels of {worst_key} have a PSNR of {worst:.1f} dB against the standard "
                         f"transform's (at least {MIN_PSNR:.0f} dB expected)")
    return (f"{len(records)} samples, each once with its label; after normalise the pixels are "
            + ("identical to the standard's" if math.isinf(worst)
               else f"at a PSNR of at least {worst:.1f} dB against the standard's"))


register(
    "fast_path",
    "10_fast_path",
    "past the decode ceiling: a reduced-size uint8 transform, a shared-memory uint8 collate and a consumer-side normalise",
    "FastPath with static methods transform(jpeg_bytes, source) -> uint8 256x256 image (3x256x256 tensor or "
    "256x256x3 array); collate(samples) -> [uint8 N x 3 x 256 x 256 tensor, int64 labels, keys]; "
    "normalise(images, mean, std) -> float32 (pixel / 255 - mean) / std",
    _fixtures,
    [
        ("transform_uint8", "transform returns the 256 x 256 image as uint8, with a PSNR of at least 40 dB against the standard's",
         "decode with Pillow, resize to (256, 256) with Image.BILINEAR and return np.asarray(image): uint8",
         _transform_uint8),
        ("resize_uint8", "the resize sees a uint8 image, never a float one (resizing float)",
         "resize before any conversion: Pillow's resize on the decoded image, or transforms.v2 on a uint8 tensor",
         _resize_uint8),
        ("reduced_decode", "a JPEG four times larger than needed is decoded at a reduced size (draft)",
         "image = Image.open(...); image.draft('RGB', (256, 256)); then convert, then resize",
         _reduced_decode),
        ("resize_speed", "the resize takes no longer than torch's uint8 resize (transforms.v2) of the same images",
         "pixels = torch.from_numpy(np.array(image)).permute(2, 0, 1); "
         "transforms.v2.functional.resize(pixels, [256, 256], antialias=True)",
         _resize_speed),
        ("timing", "against the standard transform: not slower on ImageNet-sized JPEGs, clearly faster on 4x larger ones",
         "draft for the large JPEGs, torch's uint8 resize for all of them",
         _timing),
        ("collate_uint8", "batches cross from two workers as uint8 N x 3 x 256 x 256 (not a float32 crossing)",
         "default_collate the H x W x C uint8 images, then .permute(0, 3, 1, 2): channels_last, no .float() here",
         _collate_uint8),
        ("collate_shared", "inside a worker, collate builds the batch in shared memory (no second copy to cross)",
         "batch = default_collate([image.permute(1, 2, 0) for image in images]) allocates it in shared memory",
         _collate_shared),
        ("normalise_once", "normalise converts once: float32(pixel) / 255, then (x - mean) / std per channel",
         "x = images.float() / 255; return (x - mean) / std with mean and std as 1 x 3 x 1 x 1 tensors",
         _normalise_once),
        ("normalise_constants", "normalise makes its mean and std tensors once per device, not on every call",
         "keep them in a dict keyed by (tuple(mean), tuple(std), images.device)",
         _normalise_constants),
        ("audit", "an epoch with two workers: every key once with its label, pixels as the standard's after normalise",
         "the three methods together: transform in the workers, collate, then normalise in the consumer",
         _audit),
    ],
)

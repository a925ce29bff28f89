"""Data echoing: when the loader cannot keep up, let the model see each fresh image more than once.

Choi et al., "Faster Neural Network Training with Data Echoing" (arXiv:1907.05550), insert
a stage that repeats what the slow part of the pipeline produced, ``e`` times (the *echo
factor*), so the training steps that would have waited for data train on repeats instead.
Where the repeats are inserted decides what they cost the model:

* **example echoing**, after the loader and before the shuffle buffer: each sample is
  repeated, and the buffer spreads its copies apart (:func:`sample_echo`);
* **batch echoing**, after batching: the same batch is used for ``e`` steps in a row
  (:func:`batch_echo`), the cheapest to build and the most correlated.

Either way a fixed number of *fresh* images (what the loader must deliver) becomes ``e``
times as many training steps. Whether that reaches a target accuracy sooner depends on how
much a repeat is worth against a fresh image, which the chapter measures, and on the two
rates: a loader delivering ``loader_rate`` fresh images per second and a model that can
train on ``model_rate`` images per second (:func:`wall_seconds`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from packlab.accuracy.training import BATCH_SIZE, DeliveredBatches, RunResult, batches_of
from packlab.loaders.tar import shuffle_buffer

#: Samples in the buffer that spreads an echoed sample's copies apart (example echoing).
ECHO_BUFFER = 1000


def sample_echo(order: Sequence[int], factor: int, seed: int, buffer: int = ECHO_BUFFER,
                batch_size: int = BATCH_SIZE) -> DeliveredBatches:
    """Each sample of ``order`` repeated ``factor`` times as it arrives, through a shuffle buffer, then batched.

    The batches come with how many fresh samples the loader had delivered by the end of
    each (:class:`~packlab.accuracy.training.DeliveredBatches`): those in the buffer count
    too, up to ``buffer / factor`` more than the distinct samples trained on so far. They
    had to be loaded, and counting only what was trained on would make echoing look cheaper
    in fresh images than it is.
    """
    read = 0  # fresh samples taken from the loader so far

    def repeated():
        nonlocal read
        for index in order:
            read += 1
            for _ in range(factor):
                yield index

    rng = random.Random(f"echo-{seed}-{factor}")
    out, delivered = [], []
    for index in shuffle_buffer(repeated(), buffer, rng):  # it takes the next sample in before it yields one
        out.append(index)
        delivered.append(read)
    batches = batches_of(out, batch_size)
    ends = [min((i + 1) * batch_size, len(out)) - 1 for i in range(len(batches))]
    return DeliveredBatches(batches, [delivered[end] for end in ends])


def batch_echo(order: Sequence[int], factor: int, batch_size: int = BATCH_SIZE) -> list[np.ndarray]:
    """The batches of ``order``, each used for ``factor`` steps in a row."""
    return [batch for batch in batches_of(order, batch_size) for _ in range(factor)]


def wall_seconds(steps: int, fresh: int, batch_size: int, loader_rate: float, model_rate: float) -> float:
    """Seconds a job needs for ``steps`` steps on ``fresh`` fresh images, whichever side is slower.

    The loader must deliver ``fresh`` images (``fresh / loader_rate`` seconds); the model must
    train ``steps × batch_size`` images (``… / model_rate``). Loading and training overlap
    (DataLoader workers, chapter 7), so the job takes the longer of the two.
    """
    return max(fresh / loader_rate, steps * batch_size / model_rate)


def reached(result: RunResult, target: float) -> tuple[int, int] | None:
    """``(steps, fresh images)`` at the first point of ``result``'s curve with accuracy ≥ ``target`` (0..1)."""
    for steps, fresh, accuracy in result.curve:
        if accuracy >= target:
            return steps, fresh
    return None


# ------------------------------------------------------------------------------ echoing on the paired instrument
#
# Chapter 14 judges echoing with chapter 13's instrument (:mod:`.instrument`): pattern images,
# seeds paired across conditions, a fixed budget of steps. A training set of N images comes in
# ``variants`` renders that differ only in their pixel noise (:func:`noise_variants`): a fresh
# draw of the noise stands in for an augmentation, drawn anew each time the loader reads an
# image. Index ``v * N + i`` is image ``i`` in variant ``v``, so a schedule of indices says which
# image the model sees and which augmentation of it.
#
# The loader's *reads* are epochs of uniform permutations, read ``r`` of image ``i`` in read
# epoch ``r``. Echoing uses each read ``factor`` times; **after** augmentation its copies are
# the same pixels (variant ``r``); **before** augmentation each copy is augmented on its own
# (variant ``r * factor + k``, for the k-th copy), as when the echo stage sits in front of the
# random transforms. With ``variants`` at least the number of times an image is used, no two
# uses of an image share a variant unless the echo put them there.

#: How an echoed copy gets its pixels: the read's own augmentation, or one of its own.
AUGMENT = ("after", "before")


def noise_variants(count: int, variants: int, seed: int = 0, side: int | None = None):
    """``variants`` renders of the same ``count`` pattern images (:mod:`.patterns`), differing only in their pixel
    noise: :class:`~packlab.accuracy.pixels.SmallImages` of ``variants * count``, index ``v * count + i``."""
    from packlab.accuracy import patterns
    from packlab.accuracy.pixels import SmallImages

    side = patterns.SIDE if side is None else side
    parameters = patterns.pattern_parameters(count, seed)
    pixels = np.concatenate([patterns.render(parameters, side, seed=seed * 1000 + v) for v in range(variants)])
    keys = [f"p{seed}-{i:06d}-v{v}" for v in range(variants) for i in range(count)]
    return SmallImages(pixels, np.tile(parameters.labels, variants), keys)


def reads(seed: int, size: int, count: int) -> np.ndarray:
    """The loader's first ``count`` reads: epochs of uniform permutations of ``size`` images, as ``r * size + i``
    (read epoch ``r``, image ``i``), the same for a seed in every condition."""
    from packlab.accuracy.training import global_order

    epochs = -(-count // size)
    return np.concatenate([r * size + global_order(seed, r, size) for r in range(epochs)])[:count]


def _copy_index(read: np.ndarray, k: int, factor: int, size: int, variants: int, augment: str) -> np.ndarray:
    """The training index of copy ``k`` of each read (see the section's comment)."""
    epoch, image = np.divmod(np.asarray(read, dtype=np.int64), size)
    variant = epoch if augment == "after" else epoch * factor + k
    return (variant % variants) * size + image


def echo_schedule(size: int, steps_images: int, factor: int, how: str = "example", augment: str = "after",
                  variants: int = 6, buffer: int = ECHO_BUFFER, batch_size: int = BATCH_SIZE):
    """``schedule(seed)`` for the paired instrument: ``steps_images / factor`` reads of ``size`` images, each used
    ``factor`` times, ``how`` = "example" (copies spread by a shuffle buffer of ``buffer``) or "batch" (each batch
    ``factor`` steps in a row), copies augmented ``augment`` the echo. ``factor=1`` is no echo. Every condition with
    the same ``steps_images`` trains the same number of steps, so the cosine decay is the same too."""
    if augment not in AUGMENT:
        raise ValueError(f"augment must be one of {AUGMENT}, got {augment!r}")
    if steps_images % factor:
        raise ValueError(f"{steps_images} training images is not a whole number of reads at echo factor {factor}")

    def schedule(seed: int) -> list[np.ndarray]:
        read = reads(seed, size, steps_images // factor)
        if factor == 1:
            return batches_of(_copy_index(read, 0, 1, size, variants, augment), batch_size)
        if how == "batch":
            return [_copy_index(batch, k, factor, size, variants, augment)
                    for batch in batches_of(read, batch_size) for k in range(factor)]
        copies = np.stack([_copy_index(read, k, factor, size, variants, augment) for k in range(factor)], axis=1)
        rng = random.Random(f"echo-{seed}-{factor}-{augment}")
        # Each read's copies enter the buffer together as they arrive; the buffer spreads them apart.
        order = list(shuffle_buffer(iter(copies.reshape(-1).tolist()), buffer, rng))
        return batches_of(order, batch_size)

    return schedule

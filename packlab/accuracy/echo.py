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

"""Stage 6 of :mod:`packlab.loaders.tar`: a bounded shuffle buffer, and a measure of how mixed its output is."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence

import numpy as np


def shuffle_buffer(items: Iterable, size: int, rng: random.Random) -> Iterator:
    """Shuffle a stream locally with a buffer of ``size`` items.

    Fill the buffer; then, for each new item, yield a randomly chosen buffered item and
    put the new one in its place; at the end, yield what is left in random order. An item
    can move *earlier* by at most ``size`` places, so a stream with long runs (a shard cut
    from a class-sorted list) keeps them unless the buffer is as large as the runs.
    ``size`` 0 or 1 passes the stream through unchanged.
    """
    if size <= 1:
        yield from items
        return
    buffer = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        i = rng.randrange(size)
        yield buffer[i]
        buffer[i] = item
    rng.shuffle(buffer)
    yield from buffer


def label_mixing(labels: Sequence[int], window: int = 100, num_classes: int = 10) -> float:
    """How far the class mix of short stretches of a stream is from the overall mix.

    The mean, over consecutive windows of ``window`` samples, of the total-variation
    distance between the window's class frequencies and the whole stream's: 0 when every
    window has the overall mix, close to 1 when every window holds one class. A perfect
    shuffle does not reach 0 (a window of 100 is a small sample); compare with
    ``label_mixing`` of a random permutation of the same labels.
    """
    labels = np.asarray(labels)
    overall = np.bincount(labels, minlength=num_classes) / len(labels)
    # Every whole window at once (the bands of packlab.class_mixing call this a thousand times):
    # one row per window, one column per class.
    classes = len(overall)
    windows = labels[: len(labels) // window * window].reshape(-1, window)
    cells = (np.arange(len(windows))[:, None] * classes + windows).ravel()  # (window, class) as one number
    counts = np.bincount(cells, minlength=len(windows) * classes).reshape(-1, classes) / window
    return float(np.mean(0.5 * np.abs(counts - overall).sum(axis=1)))

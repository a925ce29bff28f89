"""A task where the class is a spatial pattern and the colours say nothing: the accuracy instrument's data.

The course's dataset (:mod:`packlab.data`) gives each class its own palette, so a model can
tell most classes apart by their mean colour. That makes it a poor judge of loader
shortcuts: a second lossy encoding barely moves the mean colour (the task cannot feel it),
while a batch of one class shifts BatchNorm's batch statistics a lot (the task feels that
far more than a real one would). This module generates images where only the *shape* of
the pixels gives the class:

* every image is a field of stripes, with a random phase, two random colours (foreground
  and background, drawn independently of the class) and pixel noise;
* the class is the stripes' **orientation** (one of five, 36 degrees apart) and
  **frequency** (coarse or fine): ten classes;
* each image's orientation and frequency are jittered around its class's values, and
  strong pixel noise hides part of the stripes, so no model is perfect: the instrument's
  recipe (:mod:`.instrument`) ends in the low nineties on 2,000 training images, where a
  one-point effect has room in both directions.

Mean colour is then no better than chance (:func:`mean_colour_accuracy`). The parameters of
each image are drawn once per ``(seed, index)`` (:func:`pattern_parameters`), and
:func:`render` draws them at any size: :func:`pattern_images` gives the small arrays the
models train on, and the same images at a larger size (same class, colours, orientation and
phase; the pixel noise is drawn at the size rendered) for an experiment that stores them as
JPEG and random-crops them, as chapter 11's pipeline does.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from packlab.accuracy.pixels import SmallImages

#: Classes: orientations times frequencies.
ORIENTATIONS = 5
FREQUENCIES = (2.2, 3.6)  # stripe cycles across the image; the finer stays under 16 px's limit of 8 cycles
NUM_CLASSES = ORIENTATIONS * len(FREQUENCIES)
#: Each class in words: the stripes' orientation (degrees from vertical stripes) and their frequency.
CLASS_NAMES = tuple(f"{o * 180 // ORIENTATIONS}°, {'coarse' if f == 0 else 'fine'}"
                    for f in range(len(FREQUENCIES)) for o in range(ORIENTATIONS))
#: How far an image's orientation (degrees) and frequency (a factor) stray from its class's, uniformly: with the
#: classes 36 degrees apart, 15 degrees leaves a narrow gap between neighbours, which the noise then blurs.
ANGLE_JITTER = 15.0
FREQUENCY_JITTER = 0.22
#: Standard deviation of the pixel noise, in 0..255 units.
NOISE = 35.0
#: The smallest distance between the two colours of an image (0..255 per channel, Euclidean), so that every image
#: has visible stripes; both colours are otherwise uniform over the RGB cube.
MIN_CONTRAST = 120.0
#: The default side of the training images: see :mod:`packlab.accuracy.instrument` for why 16.
SIDE = 16
#: Renders at this many times the side, then averages down: antialiased stripes, as a camera would see them.
SUPERSAMPLE = 2


class PatternParameters(NamedTuple):
    """What each image shows, one entry per image: enough to draw it at any size."""

    labels: np.ndarray  # int64, N
    angles: np.ndarray  # radians, N
    frequencies: np.ndarray  # cycles per image side, N
    phases: np.ndarray  # radians, N
    colours: np.ndarray  # float, N x 2 x 3: background, foreground (0..255)


def pattern_parameters(count: int, seed: int = 0) -> PatternParameters:
    """The parameters of ``count`` images: balanced classes (in a shuffled order), jittered angle and frequency,
    random phase and colours. The same ``(count, seed)`` always gives the same images; a different seed gives
    independent ones (use one seed for training images, another for held-out images)."""
    rng = np.random.default_rng([seed, 0x9A77E2])
    labels = rng.permutation(np.arange(count) % NUM_CLASSES).astype(np.int64)
    orientation, frequency = labels % ORIENTATIONS, labels // ORIENTATIONS
    angles = np.deg2rad(orientation * 180.0 / ORIENTATIONS + rng.uniform(-ANGLE_JITTER, ANGLE_JITTER, count))
    frequencies = np.asarray(FREQUENCIES)[frequency] * rng.uniform(1 - FREQUENCY_JITTER, 1 + FREQUENCY_JITTER, count)
    phases = rng.uniform(0, 2 * np.pi, count)
    colours = rng.uniform(0, 255, (count, 2, 3))
    # Redraw the pairs too close to show stripes (about 7 % of them): rejection keeps each colour uniform and
    # independent of the class.
    while True:
        close = np.linalg.norm(colours[:, 0] - colours[:, 1], axis=1) < MIN_CONTRAST
        if not close.any():
            break
        colours[close] = rng.uniform(0, 255, (int(close.sum()), 2, 3))
    return PatternParameters(labels, angles, frequencies, phases, colours)


def render(parameters: PatternParameters, side: int, seed: int = 0) -> np.ndarray:
    """The images of ``parameters`` at ``side`` x ``side`` pixels: uint8, N x side x side x 3.

    Stripes are a smooth (sine) profile between the two colours, drawn at ``SUPERSAMPLE``
    times the side and box-averaged down; then Gaussian noise of :data:`NOISE` per pixel and
    channel, drawn from ``seed`` (so a render is reproducible, and renders at two sizes
    differ only in their noise).
    """
    count = len(parameters.labels)
    fine = side * SUPERSAMPLE
    # Pixel centres in [0, 1), the same at every size: the pattern scales with the image.
    grid = (np.arange(fine) + 0.5) / fine
    y, x = np.meshgrid(grid, grid, indexing="ij")
    noise = np.random.default_rng([seed, side, 0x2015E])
    out = np.empty((count, side, side, 3), dtype=np.uint8)
    # About 4 M fine pixels at a time: the float temporaries stay near 100 MB at any side.
    chunk = max(1, (1 << 22) // (fine * fine))
    for start in range(0, count, chunk):
        part = slice(start, min(start + chunk, count))
        angle = parameters.angles[part, None, None]
        # Position along the stripes' normal, in cycles: the stripes run at ``angle``.
        along = (x * np.cos(angle) + y * np.sin(angle)) * parameters.frequencies[part, None, None]
        level = 0.5 + 0.5 * np.sin(2 * np.pi * along + parameters.phases[part, None, None])
        level = level.reshape(-1, side, SUPERSAMPLE, side, SUPERSAMPLE).mean(axis=(2, 4))
        background, foreground = parameters.colours[part, 0], parameters.colours[part, 1]
        pixels = background[:, None, None, :] + level[..., None] * (foreground - background)[:, None, None, :]
        pixels += noise.normal(0.0, NOISE, pixels.shape)
        out[part] = np.clip(np.rint(pixels), 0, 255).astype(np.uint8)
    return out


def pattern_images(count: int, side: int = SIDE, seed: int = 0) -> SmallImages:
    """``count`` pattern images at ``side`` pixels with their labels, as :class:`SmallImages` (keys ``p<seed>-<i>``).

    Generated in memory in a fraction of a second per thousand images: nothing to decode
    and nothing to cache. A larger ``side`` (128, say) gives the same images for an
    experiment that stores them as JPEG and random-crops them: same class, colours,
    orientation, frequency and phase; only the pixel noise is drawn anew at that size.
    """
    parameters = pattern_parameters(count, seed)
    keys = [f"p{seed}-{i:06d}" for i in range(count)]
    return SmallImages(render(parameters, side, seed), parameters.labels, keys)


def mean_colour_accuracy(train: SmallImages, test: SmallImages) -> float:
    """Accuracy (0..1) on ``test`` of the nearest class centroid in mean RGB, fitted on ``train``.

    The check that colour does not give the class: on the course's dataset this classifier
    does far better than chance; on pattern images it should stay near 1 / ten classes.
    """
    def mean_rgb(images: SmallImages) -> np.ndarray:
        return images.pixels.reshape(len(images), -1, 3).mean(axis=1)

    features, labels = mean_rgb(train), np.asarray(train.labels)
    classes = np.unique(labels)
    centroids = np.stack([features[labels == c].mean(axis=0) for c in classes])
    distances = ((mean_rgb(test)[:, None, :] - centroids[None]) ** 2).sum(axis=2)
    return float((classes[distances.argmin(axis=1)] == np.asarray(test.labels)).mean())

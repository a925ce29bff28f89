"""Figures of chapters 13 and 14, in the course's figure style (:mod:`packlab.plots`): accuracy over time, mixes by stretch."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from packlab.accuracy.echo import wall_seconds
from packlab.accuracy.mixing import window_shares
from packlab.accuracy.training import BATCH_SIZE, RunResult
from packlab.plots import GREY, MARKERS, PALETTE, SMALL, _fig_ax, _finish


def plot_echo_curves(runs: Mapping[str, Sequence[RunResult]], loader_rate: float, model_rate: float, target: float,
                     ax=None, caption: str | None = None):
    """Held-out accuracy against modelled wall-clock seconds, one line per echo setting (median over the seeds)."""
    fig, ax = _fig_ax(ax, (8.0, 4.2))
    for (name, results), color, marker in zip(runs.items(), PALETTE, MARKERS):
        points = list(zip(*[r.curve for r in results]))  # per curve point: one (steps, fresh, accuracy) per seed
        seconds = [statistics.median(wall_seconds(s, f, BATCH_SIZE, loader_rate, model_rate) for s, f, _ in point)
                   for point in points]
        accuracy = [100 * statistics.median(a for _, _, a in point) for point in points]
        ax.plot(seconds, accuracy, color=color, marker=marker, label=name)
    ax.axhline(100 * target, color=GREY, linestyle="--", linewidth=1.2)
    ax.set_xlabel("modelled wall-clock time (s)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.legend(fontsize=SMALL, loc="lower right")
    ax.grid(alpha=0.3)
    return _finish(fig, caption)


def plot_window_shares(sources: Mapping[str, Sequence[int]], source: int, share: float, window: int, ax=None,
                       caption: str | None = None):
    """The share of ``source`` in each stretch of ``window`` samples, one line per mixer; a dashed line at ``share``."""
    fig, ax = _fig_ax(ax, (8.0, 3.8))
    for (name, order), color, marker in zip(sources.items(), PALETTE, MARKERS):
        shares = 100 * window_shares(order, source, window)
        ax.plot(np.arange(len(shares)) * window, shares, color=color, marker=marker, markersize=4, label=name)
    ax.axhline(100 * share, color=GREY, linestyle="--", linewidth=1.2)
    ax.set_xlabel(f"position in the epoch (samples; one point per stretch of {window})")
    ax.set_ylabel("share of the source (%)")
    low, high = ax.get_ylim()
    ax.set_ylim(low, high + 0.45 * (high - low))  # room above the lines for the legend
    ax.legend(fontsize=SMALL, loc="upper center", ncol=2)
    ax.grid(alpha=0.3)
    return _finish(fig, caption)


def plot_pattern_examples(images, per_class: int = 6, class_names: Sequence[str] | None = None,
                          caption: str | None = None):
    """The first ``per_class`` images of each class, one row per class, enlarged without smoothing."""
    import matplotlib.pyplot as plt

    labels = np.asarray(images.labels)
    classes = np.unique(labels)
    fig, axes = plt.subplots(len(classes), per_class, figsize=(0.9 * per_class + 1.6, 0.9 * len(classes)),
                             squeeze=False)
    for row, label in zip(axes, classes):
        chosen = np.flatnonzero(labels == label)[:per_class]
        for ax, i in zip(row, chosen):
            ax.imshow(images.pixels[i], interpolation="nearest")
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
        row[0].set_ylabel(class_names[label] if class_names else f"class {label}", rotation=0, ha="right",
                          va="center", fontsize=SMALL)
    return _finish(fig, caption)

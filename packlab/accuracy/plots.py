"""Figures of chapters 13 and 14, in the course's figure style (:mod:`packlab.plots`): paired differences, mixes by stretch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from packlab.accuracy.mixing import window_shares
from packlab.plots import GREY, MARKERS, PALETTE, SMALL, _fig_ax, _finish

if TYPE_CHECKING:
    from packlab.accuracy.paired import PairedDifference


def plot_paired_differences(differences: Mapping[str, "PairedDifference"], reference: str, ax=None,
                            caption: str | None = None):
    """Each condition minus ``reference`` in points, seed by seed: the estimate and its interval, one row each.

    Filled markers are clear differences (the interval leaves out 0), open ones nulls; a
    null's row also shows, as a grey bar, the smallest difference it could have detected
    in either direction (:mod:`packlab.accuracy.paired`).
    """
    fig, ax = _fig_ax(ax, (8.0, 0.55 * len(differences) + 1.6))
    names = list(differences)
    for row, (name, color, marker) in enumerate(zip(names, PALETTE, MARKERS)):
        d = differences[name]
        y = len(names) - 1 - row
        if not d.clear and np.isfinite(d.detectable):
            ax.plot([-d.detectable, d.detectable], [y, y], color=GREY, linewidth=6, alpha=0.35, solid_capstyle="butt")
        low, high = (d.low, d.high) if np.isfinite(d.low) else (d.estimate, d.estimate)
        ax.errorbar(d.estimate, y, xerr=[[d.estimate - low], [high - d.estimate]], fmt=marker, color=color,
                    markerfacecolor=color if d.clear else "white", markersize=8, capsize=4, linewidth=1.6)
    ax.axvline(0, color=GREY, linestyle="--", linewidth=1.2)
    ax.set_yticks(range(len(names)), list(reversed(names)), fontsize=SMALL)
    ax.set_xlabel(f"held-out accuracy minus {reference} (points; median of paired seeds, 98 % interval)")
    ax.grid(axis="x", alpha=0.3)
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

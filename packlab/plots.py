"""Figures the chapters show. Every function returns the matplotlib Figure it drew on.

Axes always carry a label with units; values always come from a measurement made in the
same run (the functions only draw what they are given).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from cycler import cycler

#: Okabe and Ito's palette, which readers with any common colour-vision deficiency can tell
#: apart (blue, orange, bluish green, vermillion, reddish purple, sky blue, yellow, black).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
#: One marker per palette colour, so that lines differ by more than colour.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: Smallest text in any figure, in points: readable on a projector and when the book is zoomed out.
FONT_SIZE = 11


def apply_style() -> None:
    """The course's figure style: the palette (with markers on lines) and text of at least :data:`FONT_SIZE` pt."""
    plt.rcParams.update({
        "axes.prop_cycle": cycler(color=PALETTE) + cycler(marker=MARKERS),
        "font.size": FONT_SIZE, "axes.titlesize": FONT_SIZE + 1, "axes.labelsize": FONT_SIZE,
        "xtick.labelsize": FONT_SIZE - 1, "ytick.labelsize": FONT_SIZE - 1, "legend.fontsize": FONT_SIZE - 1,
        "figure.titlesize": FONT_SIZE + 1,
    })


apply_style()


def plot_sample_grid(root: Path | None = None, per_class: int = 6, thumb: int = 96):
    """A grid of the first ``per_class`` images of each class, one row per class."""
    from PIL import Image

    from packlab import data

    manifest = data.load_manifest(root)
    names = data.CLASS_NAMES
    picks: dict[int, list[data.Sample]] = {c: [] for c in range(len(names))}
    for sample in manifest:
        if len(picks[sample.label]) < per_class:
            picks[sample.label].append(sample)
    fig, axes = plt.subplots(len(names), per_class, figsize=(per_class * 1.3, len(names) * 1.3))
    for label, row in zip(picks, axes):
        for col, ax in enumerate(row):
            sample = picks[label][col] if col < len(picks[label]) else None
            if sample is not None:
                with Image.open(data.image_path(sample.key, root)) as im:
                    ax.imshow(im.convert("RGB").resize((thumb, thumb)))
                ax.set_title(f"{sample.width}×{sample.height}", fontsize=6, pad=2)
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                ax.set_ylabel(f"{label}: {names[label]}", fontsize=8, rotation=0, ha="right", va="center")
    fig.suptitle("Generated dataset: samples per class (title: original width × height in px)", fontsize=10)
    fig.tight_layout()
    return fig


def plot_size_histograms(samples: Sequence, bins: int = 40):
    """File sizes (histogram, kB) and image dimensions (width against height, px)."""
    sizes = np.array([s.bytes for s in samples]) / 1e3
    widths = np.array([s.width for s in samples])
    heights = np.array([s.height for s in samples])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    ax1.hist(sizes, bins=bins, color="tab:blue")
    ax1.set_xlabel("JPEG file size (kB)")
    ax1.set_ylabel("number of images")
    ax2.scatter(widths, heights, s=3, alpha=0.3, color="tab:orange")
    ax2.set_xlabel("width (px)")
    ax2.set_ylabel("height (px)")
    ax2.set_aspect("equal")
    fig.tight_layout()
    return fig


def plot_throughput_vs_workers(
    series: Mapping[str, Mapping[int, float]],
    ceiling: float | None = None,
    ax=None,
    title: str | None = None,
    ceiling_label: str = "ceiling",
):
    """Images/s against ``num_workers``, one line per loader.

    ``series`` maps a loader name to ``{num_workers: images_per_s}``. ``ceiling``, if
    given, draws a horizontal reference line (e.g. decode throughput on all cores),
    labelled ``ceiling_label``.
    """
    fig, ax = _fig_ax(ax, figsize=(6.5, 4))
    for name, points in series.items():
        workers = sorted(points)
        ax.plot(workers, [points[w] for w in workers], marker="o", label=name)
    if ceiling is not None:
        ax.axhline(ceiling, color="grey", linestyle="--", label=ceiling_label)
    ax.set_xlabel("num_workers (DataLoader worker processes)")
    ax.set_ylabel("throughput (images/s)")
    ax.set_ylim(bottom=0)
    all_workers = sorted({w for points in series.values() for w in points})
    ax.set_xticks(all_workers)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_bench_bars(results: Sequence, ax=None, title: str | None = None):
    """Horizontal bars of images/s, one per :class:`packlab.bench.BenchResult`."""
    fig, ax = _fig_ax(ax, figsize=(6.5, 0.5 + 0.45 * len(results)))
    names = [r.name for r in results]
    values = [r.images_per_s for r in results]
    bars = ax.barh(names, values, color="tab:blue")
    ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("throughput (images/s)")
    ax.margins(x=0.15)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_rates_with_ranges(
    rows: Sequence[Mapping],
    lines: Mapping[str, float] | None = None,
    ax=None,
    title: str | None = None,
    xlabel: str = "throughput (images/s): median, bar from slowest to fastest run",
):
    """Median images/s as horizontal bars with the min-max range of the runs, one bar per loader.

    Each row has ``name``, ``median``, ``low`` and ``high`` (images/s) and optionally a
    ``group``, which colours its bar (e.g. "ours" against "peer"). ``lines`` draws
    labelled vertical reference lines, e.g. ``{"parallel ceiling": 720}``. For other
    quantities than images/s, say what the bars measure in ``xlabel``.
    """
    fig, ax = _fig_ax(ax, figsize=(7, 0.8 + 0.42 * len(rows)))
    groups = list(dict.fromkeys(row.get("group", "") for row in rows))
    palette = dict(zip(groups, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    medians = [row["median"] for row in rows]
    errors = [[m - row["low"] for m, row in zip(medians, rows)], [row["high"] - m for m, row in zip(medians, rows)]]
    bars = ax.barh([row["name"] for row in rows], medians, xerr=errors, capsize=3,
                   color=[palette[row.get("group", "")] for row in rows])
    digits = 0 if max(medians) >= 20 else 2
    ax.bar_label(bars, labels=[f"{m:.{digits}f}" for m in medians], padding=8, fontsize=8)
    for (label, value), style in zip((lines or {}).items(), ("--", ":", "-.")):
        ax.axvline(value, color="grey", linestyle=style, label=f"{label} ({value:.{digits}f})")
    handles = [plt.Rectangle((0, 0), 1, 1, color=palette[g]) for g in groups if g]
    legend_lines, legend_labels = ax.get_legend_handles_labels()
    ax.legend(handles + legend_lines, [g for g in groups if g] + legend_labels, fontsize=8, loc="lower right")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.margins(x=0.12)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_label_sequence(sequences: Mapping[str, Sequence[int]], num_classes: int = 10, ax=None):
    """The labels of the first samples a loader delivers, in order, one row per loader.

    A well-shuffled stream looks like noise; a stream cut from a class-sorted list shows
    long runs of one class.
    """
    fig, ax = _fig_ax(ax, figsize=(8, 0.6 + 0.5 * len(sequences)))
    names = list(sequences)
    length = max(len(s) for s in sequences.values())
    image = np.full((len(names), length), np.nan)
    for i, name in enumerate(names):
        image[i, : len(sequences[name])] = sequences[name]
    ax.imshow(image, aspect="auto", interpolation="nearest", cmap="tab10", vmin=-0.5, vmax=num_classes - 0.5)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("position in the stream (samples)")
    fig.tight_layout()
    return fig


def plot_label_counts(sequences: Mapping[str, Sequence[int]], num_classes: int = 10, ax=None):
    """How many samples of each class a stream delivered, one group of bars per stream.

    Pass the first N labels of each stream: a well-shuffled stream has every class about
    N / num_classes times, a class-sorted one a single tall bar or two.
    """
    fig, ax = _fig_ax(ax, figsize=(8, 3.2))
    names = list(sequences)
    width = 0.8 / len(names)
    classes = np.arange(num_classes)
    for i, name in enumerate(names):
        counts = np.bincount(np.asarray(sequences[name], dtype=int), minlength=num_classes)
        ax.bar(classes + (i - (len(names) - 1) / 2) * width, counts, width=width, label=f"{name} (first {len(sequences[name])})")
    ax.set_xticks(classes)
    ax.set_xlabel("class label")
    ax.set_ylabel("number of samples")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_shuffle_quality(
    series: Mapping[str, Mapping[int, float]],
    reference: float | None = None,
    ax=None,
    ylabel: str = "class imbalance per 100-sample window\n(total variation distance, 0 = perfect mix)",
):
    """A stream-mixing metric against shuffle buffer size, one line per shard set.

    ``series`` maps a name to ``{buffer size: metric}`` (lower is better mixed);
    ``reference``, if given, is the metric of a perfect random permutation.
    """
    fig, ax = _fig_ax(ax, figsize=(6.5, 4))
    for name, points in series.items():
        sizes = sorted(points)
        ax.plot(sizes, [points[s] for s in sizes], marker="o", label=name)
    if reference is not None:
        ax.axhline(reference, color="grey", linestyle="--", label="perfect shuffle")
    ax.set_xscale("log")
    ax.set_xlabel("shuffle buffer size (samples, log scale)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_stage_costs(stages: Mapping[str, float], ax=None, title: str | None = None):
    """Where the time goes: one horizontal bar per pipeline stage, in microseconds per image.

    ``stages`` maps a stage name to its measured cost in *seconds* per image, in pipeline
    order; each bar is labelled with its value and its share of the total.
    """
    fig, ax = _fig_ax(ax, figsize=(6.5, 0.6 + 0.45 * len(stages)))
    names = list(stages)
    micros = np.array([stages[n] for n in names]) * 1e6
    bars = ax.barh(names, micros, color="tab:orange")
    total = micros.sum()
    ax.bar_label(bars, labels=[f"{v:.0f} µs ({v / total:.1%})" for v in micros], padding=3, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time per image (µs)")
    ax.margins(x=0.25)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_step_timeline(timelines: Mapping[str, Sequence[tuple[float, float]]], ax=None, title: str | None = None):
    """Where a training loop's time went, batch by batch: one row per run.

    ``timelines`` maps a run's name to ``[(seconds waiting for the batch, seconds
    computing on it), ...]`` in order (see :meth:`packlab.train.TrainingConsumer.intervals`).
    Waiting is drawn in orange, computing in blue, along a common time axis: a loop that
    overlaps loading with compute is almost all blue.
    """
    fig, ax = _fig_ax(ax, figsize=(8, 0.9 + 0.55 * len(timelines)))
    names = list(timelines)
    for row, name in enumerate(names):
        t, waits, computes = 0.0, [], []
        for wait, compute in timelines[name]:
            waits.append((t, wait))
            computes.append((t + wait, compute))
            t += wait + compute
        ax.broken_barh(waits, (row - 0.35, 0.7), color="tab:orange", label="waiting for data" if row == 0 else None)
        ax.broken_barh(computes, (row - 0.35, 0.7), color="tab:blue", edgecolor="white", linewidth=0.5,
                       label="training step" if row == 0 else None)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("time since the loop started (s)")
    ax.set_xlim(left=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # outside: the bars fill the axes
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def plot_small_file_penalty(penalty: Mapping, ax=None):
    """Files read per second (log scale) by each layout: warm, cold and under the network model.

    ``penalty`` is what :func:`packlab.course.benchmark.small_file_penalty` returns; bars come from its
    measured rates, and a black tick marks the model's prediction where there is one.
    """
    fig, ax = _fig_ax(ax, figsize=(9, 3.8))
    layouts = ["folder", "zip", "tar"]
    cold = penalty.get("cold_files_per_s") or {}
    groups = {}
    if cold:
        groups["page cache warm"] = [cold.get(f"{name}_warm") for name in layouts]
        groups[f"cold ({penalty.get('cold_level') or 'data pages'} dropped)"] = [cold.get(f"{name}_cold") for name in layouts]
    groups["network model"] = [penalty["modelled_files_per_s"].get(name) for name in layouts]
    width = 0.8 / len(groups)
    x = np.arange(len(layouts))
    for i, (group, values) in enumerate(groups.items()):
        heights = [v if v is not None else 0 for v in values]
        bars = ax.bar(x + (i - (len(groups) - 1) / 2) * width, heights, width, label=group)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v else "" for v in values], fontsize=7, padding=2)
    predicted = penalty.get("predicted_files_per_s", {})
    model_x = x + (len(groups) - 1 - (len(groups) - 1) / 2) * width
    for position, name in zip(model_x, layouts):
        if name in predicted:
            ax.plot([position - width / 2, position + width / 2], [predicted[name]] * 2, color="black", linewidth=2,
                    label="model's prediction (waiting only)" if name == "folder" else None)
    ax.set_yscale("log")
    ax.set_xticks(x, ["JPEG folder\n(one file per image)", "zip\n(one archive)", "tar shards\n(sequential)"])
    ax.set_ylabel("files read per second (log scale)")
    ax.set_title(f"Reading without decoding, {penalty['workers']} workers", fontsize=10)
    ax.margins(y=0.15)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: bars fill the axes
    fig.tight_layout()
    return fig


def _fig_ax(ax, figsize):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax
    return ax.figure, ax

"""Figures the chapters show. Every function returns the matplotlib Figure it drew on.

Axes always carry a label with units; values always come from a measurement made in the
same run (the functions only draw what they are given).

Figures for a room: text of at least :data:`FONT_SIZE` pt everywhere (titles and tick
labels included), colours from :data:`PALETTE` (Okabe and Ito's, safe for colour-blind
readers), and nothing told by colour alone: lines carry :data:`MARKERS`, bars of
different groups :data:`HATCHES`, and classes are told apart by position and label.

Every function takes ``caption=``: a sentence saying what the figure shows, drawn under
it as part of the image (:func:`add_caption`), so the same caption shows in JupyterLab,
in the built book and on a projector, and is kept as the figure's label for whoever
reads the figure object. Where IPython shows the figure (JupyterLab, the book's runs), the
caption also goes into the PNG as its ``Description`` text chunk
(:mod:`packlab.captions`), and the book's build makes it the image's alt text
(:mod:`packlab.course.book`): a screen reader reads the sentence, not a file name.
"""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from cycler import cycler

from packlab.captions import DESCRIPTION_KEY, describe_figures_in_png, png_with_description  # noqa: F401 - re-exported

#: Okabe and Ito's palette, which readers with any common colour-vision deficiency can tell
#: apart (blue, orange, bluish green, vermillion, reddish purple, sky blue, yellow, black).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
#: One marker per palette colour, so that lines differ by more than colour.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
#: One hatching per palette colour, so that bars of different groups differ by more than colour.
HATCHES = ("", "//", "..", "xx", "\\\\", "--", "++", "oo")
#: Smallest text in any figure, in points: readable on a projector and when the book is zoomed out.
FONT_SIZE = 11
#: Neutral colours for reference lines and outlines (not data).
GREY = "#666666"


def apply_style() -> None:
    """The course's figure style: the palette (with markers on lines) and text of at least :data:`FONT_SIZE` pt."""
    plt.rcParams.update({
        "axes.prop_cycle": cycler(color=PALETTE) + cycler(marker=MARKERS),
        "font.size": FONT_SIZE, "axes.titlesize": FONT_SIZE + 1, "axes.labelsize": FONT_SIZE,
        "xtick.labelsize": FONT_SIZE - 1, "ytick.labelsize": FONT_SIZE - 1, "legend.fontsize": FONT_SIZE - 1,
        "figure.titlesize": FONT_SIZE + 1, "hatch.color": "#333333",
    })


apply_style()

#: Text sizes the functions use: body text, and the smallest (tick and bar labels, legends).
SMALL = FONT_SIZE - 1


def add_caption(fig, caption: str | None, width: int = 95):
    """Draw ``caption`` under the figure, wrapped, as part of the image; keep it as the figure's label.

    JupyterLab and the book both show a figure as the image its cell produced (saved with
    a tight bounding box, which takes in text below the axes), so a caption drawn here
    shows in both, and on a projector. ``fig.get_label()`` returns it afterwards. Returns
    the figure.
    """
    if not caption:
        return fig
    fig.set_label(caption)
    describe_figures_in_png()
    lines = textwrap.fill(caption, width=max(40, int(width * fig.get_figwidth() / 8)))
    fig.text(0.0, -0.02, lines, ha="left", va="top", fontsize=SMALL, style="italic", transform=fig.transFigure)
    return fig


def _finish(fig, caption: str | None):
    fig.tight_layout()
    return add_caption(fig, caption)


def plot_sample_grid(root: Path | None = None, per_class: int = 6, thumb: int = 96, caption: str | None = None):
    """A grid of the first ``per_class`` images of each class, one row per class."""
    from PIL import Image

    from packlab import data

    manifest = data.load_manifest(root)
    names = data.CLASS_NAMES
    picks: dict[int, list[data.Sample]] = {c: [] for c in range(len(names))}
    for sample in manifest:
        if len(picks[sample.label]) < per_class:
            picks[sample.label].append(sample)
    fig, axes = plt.subplots(len(names), per_class, figsize=(per_class * 1.45 + 1.6, len(names) * 1.45))
    for label, row in zip(picks, axes):
        for col, ax in enumerate(row):
            sample = picks[label][col] if col < len(picks[label]) else None
            if sample is not None:
                with Image.open(data.image_path(sample.key, root)) as im:
                    ax.imshow(im.convert("RGB").resize((thumb, thumb)))
                ax.set_title(f"{sample.width}×{sample.height}", fontsize=SMALL, pad=2)
            ax.set_xticks([])
            ax.set_yticks([])
            if col == 0:
                ax.set_ylabel(f"{label}: {names[label]}", fontsize=FONT_SIZE, rotation=0, ha="right", va="center")
    fig.suptitle("Generated dataset: samples per class (above each: width × height in px)", fontsize=FONT_SIZE + 1)
    return _finish(fig, caption)


def plot_size_histograms(samples: Sequence, bins: int = 40, caption: str | None = None):
    """File sizes (histogram, kB) and image dimensions (width against height, px)."""
    sizes = np.array([s.bytes for s in samples]) / 1e3
    widths = np.array([s.width for s in samples])
    heights = np.array([s.height for s in samples])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    ax1.hist(sizes, bins=bins, color=PALETTE[0])
    ax1.set_xlabel("JPEG file size (kB)")
    ax1.set_ylabel("number of images")
    ax2.scatter(widths, heights, s=4, alpha=0.3, color=PALETTE[1], marker=MARKERS[0])
    ax2.set_xlabel("width (px)")
    ax2.set_ylabel("height (px)")
    ax2.set_aspect("equal")
    return _finish(fig, caption)


def plot_throughput_vs_workers(
    series: Mapping[str, Mapping[int, float]],
    ceiling: float | None = None,
    ax=None,
    title: str | None = None,
    ceiling_label: str = "ceiling",
    caption: str | None = None,
):
    """Images/s against ``num_workers``, one line per loader.

    ``series`` maps a loader name to ``{num_workers: images_per_s}``. ``ceiling``, if
    given, draws a horizontal reference line (e.g. decode throughput on all cores),
    labelled ``ceiling_label``.
    """
    fig, ax = _fig_ax(ax, figsize=(6.5, 4))
    for (name, points), color, marker in zip(series.items(), _cycle(PALETTE), _cycle(MARKERS)):
        workers = sorted(points)
        ax.plot(workers, [points[w] for w in workers], color=color, marker=marker, markersize=7, label=name)
    if ceiling is not None:
        ax.axhline(ceiling, color=GREY, linestyle="--", label=ceiling_label)
    ax.set_xlabel("num_workers (DataLoader worker processes)")
    ax.set_ylabel("throughput (images/s)")
    ax.set_ylim(bottom=0)
    all_workers = sorted({w for points in series.values() for w in points})
    ax.set_xticks(all_workers)
    ax.grid(alpha=0.3)
    ax.legend()
    if title:
        ax.set_title(title)
    return _finish(fig, caption)


def plot_bench_bars(results: Sequence, ax=None, title: str | None = None, caption: str | None = None):
    """Horizontal bars of images/s, one per :class:`packlab.bench.BenchResult`."""
    fig, ax = _fig_ax(ax, figsize=(6.5, 0.5 + 0.45 * len(results)))
    names = [r.name for r in results]
    values = [r.images_per_s for r in results]
    bars = ax.barh(names, values, color=PALETTE[0])
    ax.bar_label(bars, labels=[f"{v:.0f}" for v in values], padding=3, fontsize=SMALL)
    ax.invert_yaxis()
    ax.set_xlabel("throughput (images/s)")
    ax.margins(x=0.15)
    if title:
        ax.set_title(title)
    return _finish(fig, caption)


def plot_rates_with_ranges(
    rows: Sequence[Mapping],
    lines: Mapping[str, float] | None = None,
    ax=None,
    title: str | None = None,
    xlabel: str = "throughput (images/s): median, bar from slowest to fastest run",
    caption: str | None = None,
):
    """Median images/s as horizontal bars with the min-max range of the runs, one bar per loader.

    Each row has ``name``, ``median``, ``low`` and ``high`` (images/s) and optionally a
    ``group``, which colours and hatches its bar (e.g. "ours" against "peer"). ``lines`` draws
    labelled vertical reference lines, e.g. ``{"parallel ceiling": 720}``. For other
    quantities than images/s, say what the bars measure in ``xlabel``.
    """
    fig, ax = _fig_ax(ax, figsize=(7, 0.8 + 0.42 * len(rows)))
    groups = list(dict.fromkeys(row.get("group", "") for row in rows))
    colour = dict(zip(groups, _cycle(PALETTE)))
    hatch = dict(zip(groups, _cycle(HATCHES)))
    medians = [row["median"] for row in rows]
    errors = [[m - row["low"] for m, row in zip(medians, rows)], [row["high"] - m for m, row in zip(medians, rows)]]
    bars = ax.barh([row["name"] for row in rows], medians, xerr=errors, capsize=3,
                   color=[colour[row.get("group", "")] for row in rows], edgecolor="#333333")
    for bar, row in zip(bars, rows):
        bar.set_hatch(hatch[row.get("group", "")])
    digits = 0 if max(medians) >= 20 else 2
    ax.bar_label(bars, labels=[f"{m:.{digits}f}" for m in medians], padding=8, fontsize=SMALL)
    for (label, value), style in zip((lines or {}).items(), ("--", ":", "-.")):
        ax.axvline(value, color=GREY, linestyle=style, label=f"{label} ({value:.{digits}f})")
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=colour[g], hatch=hatch[g], edgecolor="#333333") for g in groups if g]
    legend_lines, legend_labels = ax.get_legend_handles_labels()
    ax.legend(handles + legend_lines, [g for g in groups if g] + legend_labels, fontsize=SMALL, loc="lower right")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.margins(x=0.12)
    if title:
        ax.set_title(title, fontsize=FONT_SIZE + 1)
    return _finish(fig, caption)


def plot_label_sequence(sequences: Mapping[str, Sequence[int]], num_classes: int = 10, ax=None,
                        class_names: Sequence[str] | None = None, caption: str | None = None):
    """The labels of the first samples a loader delivers, in order, one panel per loader.

    Each sample is a point at the height of its class, so a class is told by position
    and by the name on the axis, not by colour. A well-shuffled stream jumps between all
    heights; a stream cut from a class-sorted list shows long flat runs of one class.
    ``ax`` (one axes, or one per stream) draws into existing axes. ``class_names``
    labels the heights (default: the class numbers).
    """
    names = list(sequences)
    if ax is None:
        fig, axes = plt.subplots(len(names), 1, figsize=(9, 0.6 + 2.1 * len(names)), sharex=True, squeeze=False)
        axes = list(axes[:, 0])
    else:
        axes = list(np.atleast_1d(ax))
        if len(axes) != len(names):
            raise ValueError(f"{len(names)} streams need {len(names)} axes, got {len(axes)}")
        fig = axes[0].figure
    ticks = range(num_classes)
    labels = [f"{c}: {class_names[c]}" if class_names else str(c) for c in ticks]
    for panel, name, color, marker in zip(axes, names, _cycle(PALETTE), _cycle(MARKERS)):
        labels_in_order = np.asarray(sequences[name])
        panel.plot(np.arange(len(labels_in_order)), labels_in_order, linestyle="none", marker=marker, markersize=3,
                   color=color)
        panel.set_yticks(list(ticks), labels, fontsize=SMALL)
        panel.set_ylim(-0.7, num_classes - 0.3)
        panel.set_ylabel("class")
        panel.set_title(name, loc="left", fontsize=FONT_SIZE)
        panel.grid(axis="y", alpha=0.3)
    axes[-1].set_xlabel("position in the stream (samples)")
    return _finish(fig, caption)


def plot_label_counts(sequences: Mapping[str, Sequence[int]], num_classes: int = 10, ax=None, caption: str | None = None):
    """How many samples of each class a stream delivered, one group of bars per stream.

    Pass the first N labels of each stream: a well-shuffled stream has every class about
    N / num_classes times, a class-sorted one a single tall bar or two.
    """
    fig, ax = _fig_ax(ax, figsize=(8, 3.2))
    names = list(sequences)
    width = 0.8 / len(names)
    classes = np.arange(num_classes)
    for i, (name, color, hatch) in enumerate(zip(names, _cycle(PALETTE), _cycle(HATCHES))):
        counts = np.bincount(np.asarray(sequences[name], dtype=int), minlength=num_classes)
        ax.bar(classes + (i - (len(names) - 1) / 2) * width, counts, width=width, color=color, hatch=hatch,
               edgecolor="#333333", label=f"{name} (first {len(sequences[name])})")
    ax.set_xticks(classes)
    ax.set_xlabel("class label")
    ax.set_ylabel("number of samples")
    ax.legend(fontsize=SMALL)
    return _finish(fig, caption)


def plot_shuffle_quality(
    series: Mapping[str, Mapping[int, float]],
    reference: float | None = None,
    ax=None,
    ylabel: str = "class imbalance per 100-sample window\n(total variation distance, 0 = perfect mix)",
    caption: str | None = None,
):
    """A stream-mixing metric against shuffle buffer size, one line per shard set.

    ``series`` maps a name to ``{buffer size: metric}`` (lower is better mixed);
    ``reference``, if given, is the metric of a perfect random permutation.
    """
    fig, ax = _fig_ax(ax, figsize=(6.5, 4))
    for (name, points), color, marker in zip(series.items(), _cycle(PALETTE), _cycle(MARKERS)):
        sizes = sorted(points)
        ax.plot(sizes, [points[s] for s in sizes], color=color, marker=marker, markersize=7, label=name)
    if reference is not None:
        ax.axhline(reference, color=GREY, linestyle="--", label="perfect shuffle")
    ax.set_xscale("log")
    ax.set_xlabel("shuffle buffer size (samples, log scale)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=SMALL)
    return _finish(fig, caption)


def plot_verdict_rates(rates: Mapping[str, Mapping[float, Mapping[str, float]]], bound: float, ax=None,
                       caption: str | None = None):
    """Grouped bars: for each order of the runs (a group of bars per penalty), how often equal contenders
    were called different; ``rates[order][penalty]["equal called different"]`` is a share; a dashed line at ``bound``."""
    fig, ax = _fig_ax(ax, (8.0, 3.8))
    orders = list(rates)
    penalties = list(next(iter(rates.values())))
    width = 0.8 / len(penalties)
    for j, penalty in enumerate(penalties):
        heights = [100 * rates[order][penalty]["equal called different"] for order in orders]
        xs = [i + (j - (len(penalties) - 1) / 2) * width for i in range(len(orders))]
        bars = ax.bar(xs, heights, width, color=PALETTE[j], hatch=HATCHES[j], edgecolor="#333333",
                      label=f"first run of a round {100 * penalty:.0f} % slower")
        ax.bar_label(bars, labels=[f"{h:.1f}" for h in heights], fontsize=SMALL, padding=2)
    ax.axhline(100 * bound, color=GREY, linestyle="--", linewidth=1.2)
    ax.set_xticks(range(len(orders)), [f"order: {order}" for order in orders])
    ax.set_ylabel("equal contenders called\nclearly different (%)")
    ax.legend(loc="upper right")
    ax.set_ylim(0, max(100 * bound * 2, ax.get_ylim()[1] * 1.15))
    return _finish(fig, caption)


def plot_stage_costs(stages: Mapping[str, float], ax=None, title: str | None = None, caption: str | None = None):
    """Where the time goes: one horizontal bar per pipeline stage, in microseconds per image.

    ``stages`` maps a stage name to its measured cost in *seconds* per image, in pipeline
    order; each bar is labelled with its value and its share of the total.
    """
    fig, ax = _fig_ax(ax, figsize=(6.5, 0.6 + 0.45 * len(stages)))
    names = list(stages)
    micros = np.array([stages[n] for n in names]) * 1e6
    bars = ax.barh(names, micros, color=PALETTE[1])
    total = micros.sum()
    ax.bar_label(bars, labels=[f"{v:.0f} µs ({v / total:.1%})" for v in micros], padding=3, fontsize=SMALL)
    ax.invert_yaxis()
    ax.set_xlabel("time per image (µs)")
    ax.margins(x=0.3)
    if title:
        ax.set_title(title)
    return _finish(fig, caption)


def plot_step_timeline(timelines: Mapping[str, Sequence[tuple[float, float]]], ax=None, title: str | None = None,
                       caption: str | None = None):
    """Where a training loop's time went, batch by batch: one row per run.

    ``timelines`` maps a run's name to ``[(seconds waiting for the batch, seconds
    computing on it), ...]`` in order (see :meth:`packlab.train.TrainingConsumer.intervals`).
    Waiting is drawn in orange and hatched, computing in plain blue, along a common time
    axis: a loop that overlaps loading with compute is almost all blue.
    """
    fig, ax = _fig_ax(ax, figsize=(8, 0.9 + 0.55 * len(timelines)))
    names = list(timelines)
    for row, name in enumerate(names):
        t, waits, computes = 0.0, [], []
        for wait, compute in timelines[name]:
            waits.append((t, wait))
            computes.append((t + wait, compute))
            t += wait + compute
        ax.broken_barh(waits, (row - 0.35, 0.7), facecolor=PALETTE[1], hatch=HATCHES[1], edgecolor="#333333",
                       linewidth=0.3, label="waiting for data" if row == 0 else None)
        ax.broken_barh(computes, (row - 0.35, 0.7), facecolor=PALETTE[0], edgecolor="white", linewidth=0.5,
                       label="training step" if row == 0 else None)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("time since the loop started (s)")
    ax.set_xlim(left=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=SMALL)  # outside: the bars fill the axes
    if title:
        ax.set_title(title)
    return _finish(fig, caption)


def plot_small_file_penalty(penalty: Mapping, ax=None, caption: str | None = None):
    """Files read per second (log scale) by each layout: warm, cold and under the network model.

    ``penalty`` is what :func:`packlab.small_files.small_file_penalty` returns; bars come from its
    measured rates, and a black tick marks the model's prediction where there is one.
    """
    from packlab.small_files import LAYOUTS

    fig, ax = _fig_ax(ax, figsize=(10, 4.2))
    layouts = [name for name in LAYOUTS if name in penalty["modelled_files_per_s"]]
    cold = penalty.get("cold_files_per_s") or {}
    groups = {}
    if cold:
        groups["page cache warm"] = [cold.get(f"{name}_warm") for name in layouts]
        groups[f"cold ({penalty.get('cold_level') or 'data pages'} dropped)"] = [cold.get(f"{name}_cold") for name in layouts]
    groups["network model"] = [penalty["modelled_files_per_s"].get(name) for name in layouts]
    width = 0.8 / len(groups)
    x = np.arange(len(layouts))
    for i, ((group, values), color, hatch) in enumerate(zip(groups.items(), _cycle(PALETTE), _cycle(HATCHES))):
        heights = [v if v is not None else 0 for v in values]
        bars = ax.bar(x + (i - (len(groups) - 1) / 2) * width, heights, width, label=group, color=color, hatch=hatch,
                      edgecolor="#333333")
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v else "" for v in values], fontsize=SMALL, padding=2, rotation=90)
    predicted = penalty.get("predicted_files_per_s", {})
    model_x = x + (len(groups) - 1 - (len(groups) - 1) / 2) * width
    for position, name in zip(model_x, layouts):
        if name in predicted:
            ax.plot([position - width / 2, position + width / 2], [predicted[name]] * 2, color="black", linewidth=2, marker="",
                    label="model's prediction (waiting only)" if name == layouts[0] else None)
    ax.set_yscale("log")
    ax.set_xticks(x, [LAYOUTS[name].replace(", ", ",\n") for name in layouts])
    ax.set_ylabel("files read per second (log scale)")
    ax.set_title(f"Reading without decoding, {penalty['workers']} workers", fontsize=FONT_SIZE + 1)
    ax.margins(y=0.3)
    ax.legend(fontsize=SMALL, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: bars fill the axes
    return _finish(fig, caption)


def plot_decomposition(
    cells: Mapping[tuple[str, str], Iterable[float]],
    ax=None,
    title: str | None = None,
    caption: str | None = None,
):
    """Chapter 2's decomposition as a bar chart: the measured time per image of each way of storing it.

    ``cells`` maps ``(storage, form)`` to the measured rates of that copy in images/s,
    e.g. ``("one zip", "raw pixels"): spread`` (a :class:`packlab.bench.Spread` iterates its
    measurements). The bars show milliseconds per image (the median run, a line from the
    fastest to the slowest run), one group per storage, one bar per form: along a group
    is the preprocessing effect, between groups the packing effect. Each form has its own
    colour and hatching, and every bar its value written beside it.
    """
    storages = list(dict.fromkeys(storage for storage, _ in cells))
    forms = list(dict.fromkeys(form for _, form in cells))
    fig, ax = _fig_ax(ax, figsize=(7.5, 1.2 + 0.55 * len(storages) * len(forms)))
    height = 0.8 / len(forms)
    y = np.arange(len(storages))
    for i, (form, color, hatch) in enumerate(zip(forms, _cycle(PALETTE), _cycle(HATCHES))):
        positions, medians, errors = [], [], [[], []]
        for row, storage in enumerate(storages):
            rates = [float(v) for v in cells.get((storage, form), ())]
            if not rates:
                continue
            ms = sorted(1e3 / rate for rate in rates)
            middle = statistics.median(ms)
            positions.append(y[row] + (i - (len(forms) - 1) / 2) * height)
            medians.append(middle)
            errors[0].append(middle - ms[0])
            errors[1].append(ms[-1] - middle)
        bars = ax.barh(positions, medians, height, xerr=errors, capsize=3, color=color, hatch=hatch,
                       edgecolor="#333333", label=form)
        ax.bar_label(bars, labels=[f"{m:.2f} ms" for m in medians], padding=6, fontsize=SMALL)
    ax.set_yticks(y, storages)
    ax.invert_yaxis()
    ax.set_xlabel("time per image (ms): median run, line from fastest to slowest")
    ax.margins(x=0.25)
    ax.legend(fontsize=SMALL, loc="lower right")
    if title:
        ax.set_title(title)
    return _finish(fig, caption)


def plot_shared_offset_race(
    steps: Sequence[tuple[str, str, int]],
    targets: Mapping[str, int] | None = None,
    title: str | None = "Two processes, one file offset",
    caption: str | None = None,
):
    """Chapter 3's race, drawn: what two processes did, step by step, to the one offset they share.

    ``steps`` are ``(process, what it did, the shared offset afterwards in bytes)`` in the
    order they happened, e.g. ``[("parent", "seek to A", a), ("child", "seek to B", b),
    ("parent", "read 'A'", b + n)]``, as chapter 3's demonstration measures them
    (``os.lseek(fd, 0, SEEK_CUR)`` after each step). ``targets`` names offsets to mark,
    e.g. ``{"member A": a, "member B": b}``. Top: one lane per process, a labelled box per
    step; bottom: the shared offset after each step, against the marked offsets.
    """
    processes = list(dict.fromkeys(process for process, _, _ in steps))
    fig, (lanes, offsets) = plt.subplots(2, 1, figsize=(8.5, 1.6 + 0.8 * len(processes) + 3.0), sharex=True,
                                         gridspec_kw={"height_ratios": [0.8 * len(processes), 3.0]})
    colour = dict(zip(processes, _cycle(PALETTE)))
    hatch = dict(zip(processes, _cycle(HATCHES)))
    for number, (process, action, _) in enumerate(steps, start=1):
        row = processes.index(process)
        lanes.add_patch(plt.Rectangle((number - 0.42, row - 0.32), 0.84, 0.64, facecolor=colour[process],
                                      hatch=hatch[process], edgecolor="#333333", alpha=0.9))
        lanes.text(number, row, f"{number}. {action}", ha="center", va="center", fontsize=SMALL,
                   bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85, "pad": 1.5})
    lanes.set_yticks(range(len(processes)), processes)
    lanes.set_ylim(len(processes) - 0.5, -0.5)
    lanes.set_ylabel("process")
    if title:
        lanes.set_title(title)
    numbers = np.arange(1, len(steps) + 1)
    values = [offset for _, _, offset in steps]
    offsets.step(numbers, values, where="post", color=PALETTE[3], linewidth=2)
    offsets.plot(numbers, values, linestyle="none", marker=MARKERS[3], markersize=8, color=PALETTE[3],
                 label="shared offset after the step")
    for (name, offset), style in zip((targets or {}).items(), ("--", ":", "-.", (0, (5, 1)))):
        offsets.axhline(offset, color=GREY, linestyle=style, linewidth=1.2)
        offsets.text(len(steps) + 0.45, offset, f" {name}", va="center", ha="left", fontsize=SMALL)
    offsets.set_xlim(0.4, len(steps) + 0.6)
    offsets.set_xticks(numbers, [f"step {n}" for n in numbers])
    offsets.set_xlabel("time, step by step")
    offsets.set_ylabel("file offset (bytes)")
    offsets.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    offsets.legend(fontsize=SMALL, loc="upper left")
    offsets.margins(y=0.2)
    return _finish(fig, caption)


def _cycle(values: Sequence):
    """``values`` repeated without end (more series than colours reuse them, with other markers)."""
    while True:
        yield from values


def plot_storage_tradeoff(rows: Sequence[Mapping], ax=None, title: str | None = None, caption: str | None = None):
    """Bytes stored per image against the time to get a 256 x 256 uint8 image back, one marker per way of storing.

    Each row has ``name``, ``kb`` (kilobytes per image), ``median``, ``low`` and ``high``
    (microseconds per image to decode, and resize where needed) and ``psnr`` (dB against
    the standard transform; ``inf`` when identical). The label beside each marker gives
    the PSNR, so the three quantities are read together.
    """
    fig, ax = _fig_ax(ax, figsize=(7.5, 4.6))
    for index, row in enumerate(rows):
        colour, marker = PALETTE[index % len(PALETTE)], MARKERS[index % len(MARKERS)]
        ax.errorbar(row["kb"], row["median"], yerr=[[row["median"] - row["low"]], [row["high"] - row["median"]]],
                    fmt=marker, color=colour, markersize=8, capsize=3,
                    label=f"{row['name']} ({'exact' if row['psnr'] == float('inf') else format(row['psnr'], '.1f') + ' dB'})")
    ax.set_xscale("log")
    ax.set_xlabel("stored bytes per image (kB, log scale)")
    ax.set_ylabel("decode (+ resize) per image (µs)")
    ax.set_ylim(bottom=0)
    ax.legend(title="stored as (PSNR against the standard)", fontsize=SMALL, title_fontsize=SMALL,
              loc="upper left", bbox_to_anchor=(1.02, 1.0))
    if title:
        ax.set_title(title)
    return _finish(fig, caption)


def _fig_ax(ax, figsize):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax
    return ax.figure, ax


def plot_worker_memory(series: Mapping[str, Sequence[Mapping]], ax=None, title: str | None = None,
                       caption: str | None = None):
    """Each worker's unique memory (USS) growth over one epoch, one line per (index storage, worker).

    ``series`` maps a label (how the index is kept) to the records of
    :func:`packlab.memory.measure_worker_memory`. Workers of one storage share a colour and
    marker; the first worker's line is solid, the others dashed.
    """
    fig, ax = _fig_ax(ax, (6.5, 3.8))
    for number, (label, records) in enumerate(series.items()):
        colour, marker = PALETTE[number % len(PALETTE)], MARKERS[number % len(MARKERS)]
        workers = sorted({r["worker"] for r in records})
        for worker in workers:
            mine = [r for r in records if r["worker"] == worker]
            ax.plot([100 * r["fraction"] for r in mine], [r["uss_growth"] / 1e6 for r in mine], color=colour,
                    marker=marker, markevery=max(1, len(mine) // 6), linestyle="-" if worker == workers[0] else "--",
                    label=f"{label}, worker {worker}")
    ax.set_xlabel("epoch done, % of samples (all workers)")
    ax.set_ylabel("unique memory gained, MB")
    ax.set_title(title or "Worker memory over one epoch (fork workers)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=SMALL, loc="center right")
    return _finish(fig, caption)


def plot_share_per_reader(shares: Mapping[str, Sequence[float]], unit: str = "GB", ax=None,
                          caption: str | None = None):
    """What each reader (a worker of a rank) reads in an epoch, readers sorted from most to least, one line a job.

    An epoch lasts as long as its busiest reader takes, the line's left end; the dashed line
    is the even share (all the data over all the readers). A job whose line lies flat on it
    keeps every reader busy to the end of the epoch.
    """
    fig, ax = _fig_ax(ax, (7.5, 3.8))
    even = None
    for (name, values), colour, marker in zip(shares.items(), _cycle(PALETTE), _cycle(MARKERS)):
        ordered = sorted(values, reverse=True)
        ax.step(range(1, len(ordered) + 1), ordered, where="mid", color=colour, marker=marker,
                markevery=max(1, len(ordered) // 8), label=f"{name}: the busiest reader reads {ordered[0]:.2f} {unit}")
        even = sum(values) / len(values)
    if even is not None:
        ax.axhline(even, color=GREY, linestyle="--", label=f"an even share: {even:.2f} {unit}")
    ax.set_xlabel("reader (rank × worker), from the busiest to the least busy")
    ax.set_ylabel(f"read in one epoch ({unit})")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=SMALL)
    return _finish(fig, caption)

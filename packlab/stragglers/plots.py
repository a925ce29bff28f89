"""The chapter's two figures, in the course's figure style (:mod:`packlab.plots`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from packlab.plots import GREY, MARKERS, PALETTE, SMALL, _fig_ax, _finish


def plot_wait_tails(waits: Mapping[str, Sequence[float]], ax=None, caption: str | None = None):
    """Per loader, the share of batches whose wait exceeded each time (seconds in, milliseconds drawn; log y).

    A survival curve shows the whole distribution at once: the median is where a line
    crosses 50 %, the p99 where it crosses 1 %, and a long tail is a line that stays up.
    """
    fig, ax = _fig_ax(ax, (8.0, 4.2))
    for (name, values), color, marker in zip(waits.items(), PALETTE, MARKERS):
        ms = np.sort(1e3 * np.asarray(values, dtype=float))
        above = 1.0 - np.arange(len(ms)) / len(ms)  # share of batches that waited at least this long
        ax.step(ms, 100 * above, where="post", color=color, label=name)
        ax.plot(ms[-1], 100 * above[-1], marker=marker, color=color, linestyle="none")
    for share in (50, 1):
        ax.axhline(share, color=GREY, linestyle="--", linewidth=1.0)
    ax.set_yscale("log")
    ax.set_xlabel("wait for the batch (ms)")
    ax.set_ylabel("batches that waited at least that long (%)")
    ax.legend(fontsize=SMALL, loc="upper right")
    ax.grid(alpha=0.3)
    return _finish(fig, caption)


def plot_waiting_share(lines: Mapping[str, Sequence[Mapping]], ax=None, caption: str | None = None):
    """The share of a synchronous step spent waiting for data against the number of ranks, one line per model.

    ``lines`` maps a label to rows with ``"ranks"`` and ``"waiting %"`` (:func:`slowest_table`,
    or one depth's rows of :func:`simulation_table`).
    """
    fig, ax = _fig_ax(ax, (8.0, 4.0))
    for (label, rows), color, marker in zip(lines.items(), PALETTE, MARKERS):
        rows = sorted(rows, key=lambda row: row["ranks"])
        ax.plot([row["ranks"] for row in rows], [row["waiting %"] for row in rows], color=color, marker=marker,
                label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks in the synchronous job")
    ax.set_ylabel("share of each step spent waiting (%)")
    ax.legend(fontsize=SMALL, loc="upper left")
    ax.grid(alpha=0.3)
    return _finish(fig, caption)

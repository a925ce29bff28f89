"""Sentences of chapter 5, "Tar shards", built from what its cells measured.

Every "clearly" and every "N times" follows :func:`packlab.bench.compare` (through
:func:`packlab.bench.ratio_words`).
"""

from __future__ import annotations

import itertools

from packlab.bench import Spread, compare, interval_note, ratio_words


def parse_verdict(tarfile_ms: Spread, ours_ms: Spread) -> str:
    """``tarfile`` against the course's header parser (ms for the same members: higher is slower)."""
    if compare(tarfile_ms, ours_ms) == 0:
        return f"by the course's rule no clear difference between the two ({interval_note(tarfile_ms, ours_ms)})"
    return f"tarfile was {ratio_words(tarfile_ms, ours_ms, higher='slower', lower='faster')}"


def _than(a: str, words: str, b: str) -> str:
    """``"a 1.5 times faster than b (1.38–1.62x)"`` from :func:`ratio_words`' ``"1.5 times faster (1.38–1.62x)"``:
    the interval after the whole comparison, not between the ratio and its "than"."""
    head, bracket, note = words.partition(" (")
    return f"{a} {head} than {b}{bracket}{note}"


def layout_verdict(layouts: dict[str, Spread]) -> str:
    """Every pair of layouts (images/s) that the course's rule tells apart, or that none is. The pairs it cannot
    tell apart are listed with their intervals (``"zip ÷ tar 1.02x, 0.95–1.10x"``): how large a difference
    could hide in their runs."""
    pairs = list(itertools.combinations(layouts, 2))
    clear = [(a, b) for a, b in pairs if compare(layouts[a], layouts[b])]
    unclear = "; ".join(f"{a} ÷ {b} {interval_note(layouts[a], layouts[b])}" for a, b in pairs if (a, b) not in clear)
    if not clear:
        return f"by the course's rule no clear difference between any two of the layouts ({unclear})"
    return ("; ".join(_than(a, ratio_words(layouts[a], layouts[b]), b) for a, b in clear)
            + (f" (the other pairs: no clear difference; {unclear})" if unclear else ""))


def versus_webdataset(ours: Spread, theirs: Spread) -> str:
    """The course's loader against webdataset's pipeline (images/s), with what a gap means.

    Completes "Our loader delivered N images/s and webdataset M; ours against webdataset: <this>"
    """
    direction = compare(ours, theirs)
    if direction == 0:
        return (f"by the course's rule no clear difference ({interval_note(ours, theirs)}). Both spend most of their "
                "time in the same JPEG decode and resize, so a difference would have to come from work one of them "
                "does and the other does not.")
    return (f"{ratio_words(ours, theirs)}. Both spend most of their time in the same JPEG decode and resize, so the "
            f"{'faster' if direction > 0 else 'slower'} one does less work per sample or per batch somewhere else. Two "
            "differences are known. `webdataset` reads each shard with `tarfile`, whose parsing this chapter measured "
            "above; and its pipeline stacks each batch in the worker with `torch.stack`, into ordinary memory, which "
            "torch copies into a new block of shared memory when the worker sends the batch "
            "(`torch/multiprocessing/reductions.py`), while the course's loader, like torch's `default_collate`, "
            "stacks straight into shared memory and sends only a handle. Chapter 8 measures that copy")

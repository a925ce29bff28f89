"""Chapter 11, "Past the decode ceiling": the sentences that follow its measurements.

Every function takes measurements (spreads of repeated runs, reports) and returns text
whose claims follow :func:`packlab.bench.compare`: "faster" only where the runs say so
clearly, "no clear difference" otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from packlab.bench import Spread, compare, markdown_table, ratio_words


def percent(share: float) -> str:
    """``0.423`` -> ``"42 %"``."""
    return f"{100 * share:.0f} %"


def db(value: float) -> str:
    """A PSNR in words: ``"38.2 dB"``, or ``"identical"`` when it is infinite."""
    return "identical" if math.isinf(value) else f"{value:.1f} dB"


def waiting_verdict(waiting_share: float, step_share: float) -> str:
    """Who set the pace of a profiled training loop, from its shares of the wall time."""
    if waiting_share > step_share:
        return ("the loop waited for data longer than it trained: the loader, not the model, sets the pace of this job")
    return ("the loop trained longer than it waited for data: here the model sets the pace, and a faster loader "
            "would change little until the model gets faster (a GPU)")


def top_functions_table(tops: Mapping[str, list[tuple[str, float]]]):
    """py-spy's innermost functions per kind of process, as a Markdown table."""
    rows = []
    for kind, functions in tops.items():
        for name, share in functions:
            rows.append({"process": kind, "innermost Python function when sampled": f"`{name}`",
                         "share of that kind's samples": percent(share)})
    return markdown_table(rows)


def spreads_table(spreads: Mapping[str, Spread], quantity: str, label: str, fmt: str = ".0f", extra=None):
    """Repeated measurements as a table: median and range per row, plus any ``extra[name]`` columns."""
    rows = []
    for name, spread in spreads.items():
        row = {label: name, f"{quantity}, median": f"{spread.median:{fmt}}",
               "min–max": f"{spread.low:{fmt}}–{spread.high:{fmt}}", "runs": len(spread)}
        row.update((extra or {}).get(name, {}))
        rows.append(row)
    return markdown_table(rows)


def cost_words(cost: Spread, reference: Spread, than: str) -> str:
    """A per-image cost against a reference cost, as a clause: ``"cost 2.8 times less than <than>"``,
    ``"cost 1.3 times more than <than>"``, or ``"cost about as much as <than> (no clear difference)"``."""
    words = ratio_words(reference, cost, higher="less", lower="more")
    if words == "no clear difference":
        return f"cost about as much as {than} (no clear difference)"
    return f"cost {words} than {than}"


def rate_words(a: Spread, b: Spread, than: str | None = None) -> str:
    """Two rates compared (higher is better): ``"1.4 times faster"``, with ``than``: ``"1.4 times faster than <than>"``,
    or ``"not clearly faster or slower than <than>"``."""
    words = ratio_words(a, b)
    if than is None:
        return words
    return f"not clearly faster or slower than {than}" if words == "no clear difference" else f"{words} than {than}"


def pays_sentence(a: Spread, b: Spread, what: str) -> str:
    """Whether a change paid, end to end: ``a`` (with it) against ``b`` (without), both images/s."""
    verdict = compare(a, b)
    if verdict > 0:
        return f"{what} paid here: {ratio_words(a, b)} end to end"
    if verdict < 0:
        return f"{what} cost here: {ratio_words(a, b)} end to end"
    return (f"{what} made no clear difference end to end here; on a CPU-only machine the conversion it moves "
            "into the training process still runs on the same cores as the workers")


def draft_sentence(scales: Mapping[int, int]) -> str:
    """What Pillow's draft would do to a set of images, from ``{scale: count}``."""
    total = sum(scales.values())
    reduced = sum(n for s, n in scales.items() if s > 1)
    if reduced == 0:
        return f"none of the {total:,} images is twice 256 pixels in both directions, so `draft` reduces none of them"
    return f"`draft` would reduce {reduced:,} of the {total:,} images"


def gpu_sentence(status: str, measured: Mapping | None) -> str:
    """What the GPU section measured, or what it skipped and why."""
    if not measured:
        return (f"This build ran without a GPU ({status}), so the cells above skipped their measurements. On a "
                "machine with one they time nvJPEG decoding a batch of the original JPEGs (decode and resize on the "
                "GPU) and the stored 256-pixel JPEGs through the prefetcher, converting and normalising on the GPU, and "
                "`make bench` records the same in `bench.json` under `gpu`")
    return (f"On {status}: nvJPEG decoded and resized the originals at {measured['nvjpeg']} images/s; the stored "
            f"256-pixel JPEGs reached the GPU, converted and normalised, at {measured['prefetched']} images/s")


def draft_rule(large_draft: Spread, large_full: Spread, small_draft: Spread, small_full: Spread) -> str:
    """The lesson of the two draft measurements (large sources, ImageNet-sized sources), as far as they support it."""
    large, small = compare(large_full, large_draft), compare(small_full, small_draft)
    if large > 0 and small == 0:
        return ("So a reduced decode pays where the source is at least twice the target in both directions, and "
                "changes nothing below that.")
    if large > 0:
        return "The reduced decode paid on the large sources; on the ImageNet-sized ones the runs say: " + (
            "it was dearer." if small < 0 else "it was cheaper, which `draft` alone cannot explain.")
    return ("On this run even the large sources did not show a clear gain from `draft`: the machine was too busy "
            "to tell, or decoding is not what limits it here.")

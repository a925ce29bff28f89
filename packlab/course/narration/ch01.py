"""Sentences of chapter 1, "One JPEG per sample", built from what its cells measured.

Each function takes the chapter's spreads (``packlab.bench.Spread``) and returns a clause
whose wording follows :func:`packlab.bench.compare`: "clearly" only where it says so.
"""

from __future__ import annotations

from packlab.bench import Spread, chance_of_split, compare, verdict


def workers_verdict(two: Spread, zero: Spread) -> str:
    """Two workers against ``num_workers=0`` (images/s), for "...: 1.45 times the median; <this>"."""
    return verdict(two, zero,
                   "by the course's rule a clear gain",
                   "by the course's rule the workers were clearly slower",
                   "by the course's rule no clear difference")


def same_loader_verdict(a: Spread, b: Spread) -> str:
    """The A/A comparison: one loader under two names; "`compare` says <this>"."""
    direction = compare(a, b)
    if direction == 0:
        return "no clear difference, as it should: both rows are one loader"
    return (f"a clear difference (A {'higher' if direction > 0 else 'lower'}), although both rows are one loader: "
            "this build hit one of the rare runs (at most 1 in 50 for equal contenders, by design) in which the "
            "noise fools the rule")


def split_chance(a: Spread, b: Spread) -> str:
    """The rank test's chance that two equal contenders split at least as unevenly as ``a`` and ``b``."""
    return f"{chance_of_split(a.values, b.values):.2f}"


def simulation_sentence(results: dict) -> str:
    """What the chapter's simulation showed: ``results`` maps the old rule, then the course's, to
    ``(share of equal pairs called different, share of 1.3-fold pairs found)``."""
    (old_false, old_found), (new_false, new_found) = results.values()
    return (f"With equal contenders the old rule called {100 * old_false:.1f} % of the pairs different and "
            f"`compare` {100 * new_false:.1f} %; a real 1.3-fold difference was found {100 * old_found:.0f} % "
            f"and {100 * new_found:.0f} % of the time")


def per_batch_sentence(b1: Spread, big: Spread, images: int, big_size: int) -> str:
    """Batches of one image against batches of ``big_size`` (images/s) over ``images`` images."""
    direction = compare(b1, big)
    if direction == -1:
        extra_batches = images - -(-images // big_size)
        per_batch_ms = (images / b1.median - images / big.median) / extra_batches * 1e3
        return (f"batches of one were clearly slower, and taken at face value the difference between the medians "
                f"comes to {per_batch_ms:.2f} ms of wall-clock time per extra batch")
    if direction == 0:
        return ("by the course's rule the two rows are not clearly different, so these runs cannot put a number "
                "on the cost per batch")
    return ("batches of one were clearly faster here, the opposite of what a fixed cost per batch predicts, so "
            "these runs cannot put a number on it")


def gap_sentence(gap_seconds: float) -> str:
    """The loader's time per image against the sum of its stages (positive: the loader took longer)."""
    if gap_seconds > 0:
        return (f"The loader took {gap_seconds * 1e3:.2f} ms more per image than its stages add up to. That gap is "
                "what the stages leave out (the loader's own work per sample and per batch, memory allocated afresh "
                "for every batch, reading the files in shuffled rather than sequential order) plus whatever else the "
                "machine was doing at either moment.")
    return ("Here the loader was no slower than the sum of its stages, so what the stages leave out (the loader's "
            "own work per sample and per batch) was lost in the variation between moments.")


def order_verdict(float_first: Spread, uint8_first: Spread) -> str:
    """Resizing float against resizing uint8 (µs per image: higher is slower)."""
    return verdict(float_first, uint8_first,
                   "by the course's rule clearly slower",
                   "the float path was clearly faster",
                   "by the course's rule no clear difference")


def pil_sentence(pil: Spread, torch_uint8: Spread, loader_ms: float) -> str:
    """The course's Pillow resize against torch's uint8 path (µs per image), and what switching would save
    of the ``loader_ms`` milliseconds per image the single-process loader took."""
    direction = compare(pil, torch_uint8)
    if direction == 1:
        saving_ms = (pil.median - torch_uint8.median) / 1e3
        return (f"clearly slower, {pil.median / torch_uint8.median:.2f} times as slow as torch's `uint8` path here. "
                "Resizing with "
                f"torch's `uint8` path instead would save about {saving_ms:.2f} ms of the {loader_ms:.2f} ms per "
                f"image that the `num_workers=0` loader took above ({100 * saving_ms / loader_ms:.0f} %)")
    if direction == 0:
        return ("by the course's rule not clearly different from torch's `uint8` path here, so switching would not "
                "save measurable time on this machine")
    return (f"clearly faster than torch's `uint8` path here ({torch_uint8.median / pil.median:.2f} times), so on "
            "this machine the course's choice costs nothing")


def threads_sentence(default_pool: Spread, one_thread: Spread) -> str:
    """``num_workers=0`` with torch's default thread pool against one thread (images/s)."""
    return verdict(
        default_pool, one_thread,
        "Here the default pool was clearly faster: the conversion and the stacking ran on every core, which nothing "
        "else in this process was using.",
        "Here the default pool was clearly slower: splitting operations this small across threads costs "
        "synchronisation, and threads that wait for each other lose more than they gain.",
        "By the course's rule that is no clear difference either way: the operations torch could split are a small "
        "part of each image's time.",
    )

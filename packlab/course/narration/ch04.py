"""Sentences of chapter 4, "Per-worker handles", built from what its cells measured.

Every "clearly" follows :func:`packlab.bench.compare`.
"""

from __future__ import annotations

from packlab.bench import Spread, compare, interval_note, verdict


def gain_verdict(more_workers: Spread, fewer_workers: Spread) -> str:
    """More workers against fewer (images/s): "a clear gain", "a clear loss" or "no clear difference"."""
    return verdict(more_workers, fewer_workers,
                   "a clear gain",
                   "a clear loss",
                   "no clear difference", interval=True)


def sweep_plan_text(most_workers: int, cores: int, images: int, batch_size: int, batches_each: int,
                    dataset_images: int, most_images: int | None = None) -> str:
    """The worker sweep's size: its largest count, the batches each of those workers makes, and why the count
    stops below two workers per core when it does (``most_images``: what the chapter's time allows; the dataset
    may hold fewer)."""
    plural = "s" * (most_workers != 1)
    text = (f"largest count: {most_workers} worker{plural}, {images // batch_size // most_workers} batches each "
            f"at least ({images} images in batches of {batch_size})")
    if most_workers >= 2 * cores:
        return text + ", two workers per core"
    if most_images is not None and most_images < dataset_images:
        limit = (f"the sweep reads at most {most_images} images, which make {most_images // batch_size} batches "
                 "(six runs of every point, taking turns, must fit the chapter's time)")
    else:
        limit = f"the dataset's {dataset_images:,} images make only {dataset_images // batch_size} batches"
    return (text + f"; it stops there rather than at two workers per core ({2 * cores}): each worker should make "
            f"{batches_each} batches of {batch_size}, and {limit}")


def beyond_cores_sentence(at_cores: Spread, beyond: Spread | None, at_count: int, beyond_count: int) -> str:
    """From one worker per core (``at_count``) to the sweep's largest count, for JPEG members read from the page
    cache; ``beyond`` is ``None`` when the sweep stopped at ``at_count``."""
    if beyond is None:
        return f"the sweep stopped at {at_count} workers, so it has no point beyond them"
    seen = {
        1: "a clear gain, so something other than the CPU held the workers back in these runs (other programs, "
           "or waits for the disk)",
        -1: "a clear loss: the extra workers only competed for the same cores",
        0: "no clear difference",
    }[compare(beyond, at_cores)]
    return (f"between {at_count} and {beyond_count} workers the zip of JPEGs showed {seen} ({beyond_count} ÷ "
            f"{at_count} workers {interval_note(beyond, at_cores)})")


def persistence_saving(fresh: Spread, kept: Spread) -> str:
    """What keeping the workers did to an epoch (seconds per epoch: fresh workers, persistent ones)."""
    difference = fresh.median - kept.median
    note = f"kept ÷ fresh {interval_note(kept, fresh)}"
    return {
        -1: f"clearly saved {difference:.2f} s per epoch ({note})",
        1: f"clearly cost {-difference:.2f} s per epoch ({note})",
        0: f"made no clear difference (medians {abs(difference):.2f} s apart; {note})",
    }[compare(kept, fresh)]


def spawn_start_sentence(spawn_seconds: float, fork_seconds: float) -> str:
    """The audit's ``spawn`` row against its ``fork`` row with as many workers (seconds, one run each):
    what starting ``spawn`` workers added, as numbers, without a verdict."""
    extra = spawn_seconds - fork_seconds
    return (f"its `spawn` row took {spawn_seconds:.1f} s and the `fork` row with as many workers "
            f"{fork_seconds:.1f} s for the same samples, {abs(extra):.1f} s {'more' if extra >= 0 else 'less'} "
            "(one run of each, too few for a verdict)")

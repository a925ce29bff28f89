"""Sentences of chapter 3, "The pitfall: BadZipFile with workers", built from what its cells measured.

Every "clearly" follows :func:`packlab.bench.compare`; rates are images/s.
"""

from __future__ import annotations

from collections import Counter

from packlab.bench import Spread, compare, interval_note, verdict, with_note
from packlab.course.narration import ch01

#: How ``ZipFile`` reports the three reads of a member that another process's seek can spoil,
#: in the order it makes them (see ``zipfile.ZipFile.open`` and ``zipfile.ZipExtFile``).
ZIP_READ_ERRORS = {
    "Bad magic number for file header": "`Bad magic number for file header`",
    "File name in directory": "a name that differs from the directory's",
    "Bad CRC-32": "`Bad CRC-32`",
}


def error_kinds(errors: list[BaseException | None]) -> str:
    """How the runs failed, counted by the read that was spoiled: "4 × `Bad CRC-32`, 2 × ...".

    Other errors (a ``zlib.error``, a truncated header at the end of the file) are counted by type.
    """
    kinds: Counter = Counter()
    for error in errors:
        if error is None:
            continue
        text = str(error)
        kind = next((label for key, label in ZIP_READ_ERRORS.items() if key in text), f"`{type(error).__name__}`")
        kinds[kind] += 1
    if not kinds:
        return "none of them failed"
    return ", ".join(f"{count} × {kind}" for kind, count in kinds.most_common())


def workers_verdict(with_workers: Spread, without: Spread) -> str:
    """Two workers with their own handles against one process (images/s), after "N times as many; ".

    The same words as chapter 1's comparison of the folder loader with and without workers.
    """
    return ch01.workers_verdict(with_workers, without)


def workers_summary(with_workers: Spread, without: Spread, images: int) -> str:
    """The same comparison for the summary's "On this machine": "two workers with their own handles were <this>"."""
    direction = compare(with_workers, without)
    note = interval_note(with_workers, without)
    if direction == 1:
        return (f"{with_workers.median / without.median:.2f} times as fast as one process over {images} images, a "
                f"clear gain ({note})")
    if direction == 0:
        return (f"not clearly faster than one process over {images} images ({note}; chapter 4 sweeps the number of "
                "workers over longer reads)")
    return (f"clearly slower than one process over {images} images ({with_workers.median:.0f} against "
            f"{without.median:.0f} images/s; {note}): too short a read to earn back starting them and opening the "
            "archive in each")


def workers_explanation(with_workers: Spread, without: Spread, images: int, open_ms: float, load_average: float,
                        cores: int) -> str:
    """Why two workers did what they did against one process, following the verdict (rates in images/s)."""
    direction = compare(with_workers, without)
    busy = (f"the load average was {load_average:.1f} on {cores} cores when the runs ended (well above the number of "
            "cores means other programs kept them busy)")
    if direction == 1:
        return ("Two workers can at best keep two cores busy, which would give at most about twice the "
                f"single-process rate; the scaling curve is in chapter 4. Other programs shrink the gap: {busy}.")
    seconds = images / without.median
    outcome = "did not clearly gain" if direction == 0 else "lost"
    return (f"The workers {outcome} here, although they had two cores to share the decoding. The read is short: one "
            f"process took {seconds:.2f} s for the {images} images. Before its first image each worker starts as a "
            f"new process and opens the archive again ({open_ms:.0f} ms, measured above, for the central directory of "
            "every member), and only the time left after that is shared; two workers also gain only when two "
            f"cores are free, and {busy}. Over a longer read the start is paid once and the decoding dominates: "
            "chapter 4 measures the start-up and sweeps the number of workers.")


def lock_sentence(locked: Spread, own: Spread, members: str) -> str:
    """The locked loader as a share of the per-worker-handles rate, with the course's verdict."""
    word = {1: "clearly faster than", -1: "clearly slower than", 0: "not clearly different from"}[compare(locked, own)]
    return (f"{locked.median / own.median:.2f} times the per-worker rate with {members} members ({word} it; "
            f"{interval_note(locked, own)})")


def lock_cache_sentence(locked: Spread, own: Spread, open_ms: str) -> str:
    """Why the locked loader did what it did from the page cache (raw members), following the verdict."""
    direction = compare(locked, own)
    if direction == 1:
        return ("Two things favour it there. Reads that take microseconds rarely make a worker wait for the lock. "
                "And the locked dataset, like the `pread` one, hands the parent's parsed central directory to its "
                "workers, while every worker of the fixed dataset opens the archive again at the start of every "
                f"epoch ({open_ms} ms each, measured above): a cost that a slice this short makes visible, and that "
                "persistent workers (chapter 4) pay only once.")
    if direction == 0:
        return ("Reads that take microseconds rarely make a worker wait for the lock, and in these runs the lock "
                "cost nothing the course's rule could tell from the noise.")
    return ("Even with reads that take microseconds, the workers waited for each other's reads often enough to "
            "show.")


def lock_model_sentence(locked: Spread, own: Spread, load_average: float, cores: int) -> str:
    """Why the locked loader did what it did through the network model, following the verdict."""
    direction = compare(locked, own)
    if direction == -1:
        return ("There a read waits for the \"server\", and while one worker waits with the lock held, the other "
                "cannot read either: the reads of all workers queue up one behind the other, as in a single process.")
    first = {
        1: "So the locked loader even came out ahead: each worker of the fixed dataset opened the archive through "
           "the model at the start of the epoch (an open, and read requests for the whole central directory), "
           "which the locked dataset did once, in the parent, before the runs.",
        0: "So in these runs the lock cost nothing measurable even there.",
    }[direction]
    return first + (
        " What the lock costs is the time a worker waits while the other holds it for a read, which shows only "
        f"when waiting for reads, not the CPU, sets the pace; the load average was {load_average:.1f} on {cores} "
        "cores at the end of these runs (well above the number of cores means other programs kept the CPU busy).")


def reopen_verdict(per_worker: Spread, reopening: Spread) -> str:
    """Per-worker handles against reopening the archive per sample (images/s)."""
    return verdict(per_worker, reopening,
                   "by the course's rule a clear difference",
                   "by the course's rule clearly the other way round",
                   "by the course's rule no clear difference", interval=True)


def than(rate_a: Spread, rate_b: Spread, what: str | None = None) -> str:
    """Two rates (images/s): "clearly faster than", "clearly slower than" or "not clearly different from".

    Given ``what`` (what ``rate_b`` is), the words name it and end with the ratio's interval,
    as :func:`packlab.course.narration.ch02.than` does."""
    words = verdict(rate_a, rate_b, "clearly faster than", "clearly slower than", "not clearly different from")
    return words if what is None else with_note(f"{words} {what}", interval_note(rate_a, rate_b))

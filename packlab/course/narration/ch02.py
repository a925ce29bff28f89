"""Sentences of chapter 2, "Pack into one ZIP", built from what its cells measured.

Times (µs or ms per item) are "higher is slower"; rates (images/s) "higher is faster".
Every "clearly" follows :func:`packlab.bench.compare`, and two medians called clearly
different are printed with enough digits to differ (:func:`packlab.course.prose.distinct`).
"""

from __future__ import annotations

from packlab.bench import Spread, compare, interval_note, ratio_interval, ratio_number, verdict, with_note
from packlab.course.prose import distinct


def than(time_a: Spread, time_b: Spread, what: str | None = None) -> str:
    """Two times per item: "clearly slower than", "clearly faster than" or "not clearly different from".

    Given ``what`` (what ``time_b`` is, "the file"), the words name it and end with the
    ratio's interval: "clearly slower than the file (1.30x, 1.21–1.40x)". Without it they are
    bare, since an interval between "than" and its object would split the phrase."""
    words = verdict(time_a, time_b, "clearly slower than", "clearly faster than", "not clearly different from")
    return words if what is None else with_note(f"{words} {what}", interval_note(time_a, time_b))


def rate_verdict(rate_a: Spread, rate_b: Spread) -> str:
    """Two rates (images/s): "clearly faster", "clearly slower" or "no clear difference"."""
    return verdict(rate_a, rate_b,
                   "clearly faster",
                   "clearly slower",
                   "no clear difference", interval=True)


def member_work_sentence(decode_ms: Spread, convert_ms: Spread) -> str:
    """A JPEG member's decode, resize and convert against a raw member's convert alone (ms per image, medians).

    Ends with the decode's time over the convert's and its interval (:func:`packlab.bench.ratio_interval`),
    the factor of CPU work per image the raw member saves when the verdict is clear; a null result shows
    how large a factor the runs could have missed.
    """
    # the decode with two decimals, as the chapter quotes it later; the convert, tens of µs, with three
    d, c = f"{decode_ms.median:.2f}", f"{convert_ms.median:.3f}"
    if decode_ms.median < 1:  # both sub-millisecond: the same decimals, as many as tell them apart
        d, c = distinct(decode_ms.median, convert_ms.median, 3, most=5)
    span = ratio_interval(decode_ms, convert_ms)
    bracket = f"decode ÷ convert, {span.range_text()}" if span else ""
    direction = compare(decode_ms, convert_ms)
    numbers = f"{d} ms against {c} ms per image (medians)"
    if direction == 1:
        factor = ratio_number(decode_ms.median / convert_ms.median)
        return with_note(f"{numbers}: the raw member clearly saves CPU work, a factor of {factor} per image.", bracket)
    if direction == 0:
        return with_note(f"{numbers}: by the course's rule no clear difference in CPU work per image between the two "
                         "members in these runs.", bracket)
    return with_note(f"{numbers}: converting the raw member was clearly the slower here, although it is only the last "
                     "step of the JPEG member's work; runs that say so caught the machine busy, and the cell is worth "
                     "running again.", bracket)


def deflate_sentence(deflated_ms: Spread, stored_ms: Spread) -> str:
    """Reading and converting a deflated raw member against a stored one (ms per image).

    Completes "The raw pixels shrink to 0.9, and reading them was <this>."
    """
    d, s = distinct(deflated_ms.median, stored_ms.median, 2)
    direction = compare(deflated_ms, stored_ms)
    note = interval_note(deflated_ms, stored_ms)
    if direction == 1:
        return (f"clearly slower ({note}): a deflated raw member took {d} ms to read and convert, a stored one {s} "
                "ms, the difference being the inflating")
    if direction == 0:
        return (f"not clearly slower by the course's rule ({note}): {d} ms for a deflated raw member, {s} ms for a "
                "stored one")
    return (f"clearly faster ({note}): {d} ms for a deflated raw member against {s} ms for a stored one, so here "
            "reading fewer bytes saved more than inflating them cost")


def raw_readers_sentence(pread_rate: Spread, zipfile_rate: Spread, zipfile_us: float, pread_us: float) -> str:
    """The pread reader against ``ZipFile`` on the raw-pixel zip (images/s), explained with the
    per-member read times measured warm (µs, both with the CRC-32 check)."""
    direction = compare(pread_rate, zipfile_rate)
    reads = (f"per member, `ZipFile.read` took {zipfile_us:.0f} µs and one `pread` {pread_us:.0f} µs in the warm "
             "table above, both computing the CRC-32 (`PreadZipDataset` checks it by default)")
    if direction == 1:
        return (f"The `pread` reader was clearly faster than `ZipFile` on the same archive "
                f"({interval_note(pread_rate, zipfile_rate)}). The CRC-32 cannot be "
                f"why, since both compute it: {reads}. What `pread` saves is the rest of `ZipFile.read`'s work per "
                "member, the new objects, seeks and reads through the shared file object.")
    if direction == 0:
        return (f"Between the two readers of the same archive there was no clear difference in these runs "
                f"({interval_note(pread_rate, zipfile_rate)}): {reads}, "
                "and that gap was lost next to the rest of each image's time (converting 197 kB to float, "
                "collating) and the variation from run to run.")
    return (f"The `pread` reader was clearly slower than `ZipFile` on the same archive in these runs "
            f"({interval_note(pread_rate, zipfile_rate)}), although "
            f"{reads}; compare the ranges in the first table.")


def crc_sentence(crc_us: float, raw_folder_rate: Spread) -> str:
    """What the CRC-32 of a raw member costs, against the raw folder's time per image."""
    per_image_us = 1e6 / raw_folder_rate.median
    return (f"Both zip readers check every member's CRC-32, which the folder reader never computes: "
            f"{crc_us:.0f} µs per 197 kB member here, {100 * crc_us / per_image_us:.0f} % of the raw folder's "
            f"{per_image_us:.0f} µs per image.")


def cold_sentence(folder: Spread, metadata: Spread, member: Spread, zip_read: Spread) -> str:
    """One cache level's reads (µs per sample): folder file, stat alone, pread member, ``ZipFile.read`` member."""
    verdict = {1: "the folder clearly slower", -1: "the folder clearly faster", 0: "no clear difference"}[
        compare(folder, member)]
    f, m = distinct(folder.median, member.median)
    return (f"a file of the folder cost {f} µs to open and read ({folder.low:.0f}–{folder.high:.0f}), a stat alone "
            f"(finding the file) {metadata.median:.0f} µs, and a zip member {m} µs with PreadZipDataset, "
            f"{zip_read.median:.0f} µs with ZipFile.read; folder against zip member: "
            f"{with_note(verdict, interval_note(folder, member))}")


def stat_sentence(warm: Spread, pages: Spread | None, everything: Spread | None) -> str:
    """What a ``stat`` cost warm, with data pages dropped, and with all caches dropped (µs)."""
    if pages is None:
        return "This platform cannot drop cached pages, so only the warm rows were measured."
    w, p = distinct(warm.median, pages.median)
    word = {1: "clearly more", -1: "clearly less", 0: "no clear difference"}[compare(pages, warm)]
    text = (f"A stat cost {w} µs warm and {p} µs with data pages dropped ({word}; {interval_note(pages, warm)}); "
            "dropping data pages leaves the "
            "dentries and inodes in memory")
    if everything is None:
        return text + "; with all caches dropped (root only, not measured here) the metadata comes from the disk too."
    p2, e = distinct(pages.median, everything.median)
    direction = compare(everything, pages)
    if direction == 1:
        return text + (f". With all caches dropped it cost {e} µs, clearly more than the {p2} µs with data pages "
                       f"dropped ({interval_note(everything, pages)}): the lookup and the inode now came from the "
                       "disk.")
    return text + (f". With all caches dropped it cost {e} µs, "
                   f"{'not clearly more' if direction == 0 else 'clearly less'} than the {p2} µs with data pages "
                   f"dropped ({interval_note(everything, pages)}): in these runs, reading the metadata from the disk "
                   "added nothing measurable.")


def cold_zip_sentence(slower_levels: list[str], notes: dict[str, str] | None = None) -> str:
    """Cold reads of a member: ``slower_levels`` are the cache levels at which ``ZipFile.read`` was
    clearly slower than one ``pread`` of the same member. ``notes`` holds each measured level's
    interval (``ZipFile.read`` ÷ ``pread``, :func:`packlab.bench.interval_note`): beside each clear
    level, and after a null result for every level, how large a difference the runs could have missed."""
    notes = {level: note for level, note in (notes or {}).items() if note}
    if not slower_levels:
        shown = "; ".join(f"{level} dropped: {note}" for level, note in notes.items())
        return with_note("Cold, `ZipFile.read` and one `pread` of the same member were not clearly different here.",
                         f"`ZipFile.read` ÷ `pread`, {shown}" if shown else "")
    where = " and ".join(with_note(f"with {level} dropped", notes.get(level, "")) for level in slower_levels)
    return (f"{where[0].upper()}{where[1:]}, `ZipFile.read` was clearly slower than one `pread` of the same member: "
            "it reads a member in pieces (one buffer-sized read that holds the local header, then the rest of the "
            "data in further reads), and each piece that the kernel's read-ahead has not fetched yet is another "
            "wait for the disk, where `pread` asks for header and data in one request.")

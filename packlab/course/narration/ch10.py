"""Chapter 10, beyond one machine: the sentences around the object-store, retry and staging measurements."""

from __future__ import annotations

from packlab.bench import Spread, compare, interval_note, ratio_words
from packlab.course.prose import provides_figures, seconds_text


@provides_figures("s3_verdict", "library_verdict", "local_rate", "s3_rate", "wds_s3_rate", "s3_mb_s")
def reading_figures(rates: dict[str, Spread], mb_per_image: float) -> dict:
    """Local files against S3, and our loader against webdataset over S3, in words from :func:`packlab.bench.compare`."""
    local, ours, theirs = rates["local files"], rates["S3, TarShardDataset"], rates["S3, webdataset"]
    store = compare(local, ours)
    s3_verdict = {
        0: "there was no clear difference between local files and the object store",
        1: f"local files were read {ratio_words(local, ours)} than the object store",
        -1: f"the object store was read {ratio_words(ours, local)} than local files",
    }[store]
    library = compare(ours, theirs)
    library_verdict = {
        0: "there was no clear difference between our loader and webdataset over S3",
        1: f"our loader was {ratio_words(ours, theirs)} than webdataset over S3",
        -1: f"webdataset was {ratio_words(theirs, ours)} than our loader over S3",
    }[library]
    return {
        "s3_verdict": s3_verdict, "library_verdict": library_verdict,
        "local_rate": f"{local.median:,.0f}", "s3_rate": f"{ours.median:,.0f}", "wds_s3_rate": f"{theirs.median:,.0f}",
        "s3_mb_s": f"{ours.median * mb_per_image:.0f}",
    }


@provides_figures("parse_ours_us", "parse_wds_us", "parse_verdict", "parse_explains")
def parsing_figures(parse_us: dict[str, Spread], rates: dict[str, Spread], samples: int, workers: int) -> dict:
    """Does the difference in parsing cost account for the difference between the two loaders over S3?

    ``parse_us``: microseconds per sample, our reader and webdataset's, from memory.
    The extra parsing is CPU time spread over ``workers`` processes, so per epoch it adds
    about ``samples * extra / workers``; the epochs' measured difference comes from the
    medians of ``rates``.
    """
    ours, theirs = parse_us["ours"], parse_us["webdataset"]
    extra_s = samples * (theirs.median - ours.median) * 1e-6 / workers
    epoch_gap_s = samples / rates["S3, webdataset"].median - samples / rates["S3, TarShardDataset"].median
    if compare(theirs, ours) <= 0:
        explains = (f"webdataset's reader was not clearly slower at parsing here ({interval_note(theirs, ours)}), so "
                    "parsing does not explain a difference between the two loaders")
    elif epoch_gap_s <= 0:
        explains = ("webdataset's reader parsed more slowly, yet its epochs over S3 were not longer here: "
                    "something else outweighed the parsing")
    else:
        share = extra_s / epoch_gap_s
        explains = (f"spread over {workers} workers that is about {seconds_text(extra_s)} more per epoch of "
                    f"{samples:,} samples, against {seconds_text(epoch_gap_s)} between the two loaders' median "
                    f"epochs: parsing accounts for {'about all' if 0.8 <= share <= 1.25 else f'{share:.0%}'} of "
                    "the gap")
    return {
        "parse_ours_us": f"{ours.median:,.0f}", "parse_wds_us": f"{theirs.median:,.0f}",
        "parse_verdict": ratio_words(theirs, ours, "slower", "faster"), "parse_explains": explains,
    }


def after_the_kill(seconds: float) -> str:
    """How long after the kill the epoch stopped, as a sentence reads it."""
    if seconds < 0.1:
        return f"at once ({seconds_text(seconds)})"
    return f"{seconds_text(seconds)}"


@provides_figures("copy_s", "predicted_copy_s", "in_place_s", "predicted_in_place_s", "local_s", "staging_verdict")
def staging_figures(copy: Spread, in_place: Spread, local_read: Spread, break_even: float, worst: float,
                    best: float, predicted_copy_s: float, predicted_in_place_s: float) -> dict:
    """The staging sentences: times, and a break-even only where reading in place was clearly slower."""
    if compare(in_place, local_read) <= 0:
        verdict = (f"reading in place was not clearly slower than reading the local copy "
                   f"({interval_note(in_place, local_read)}), so no break-even can be read from these runs")
    else:
        verdict = (f"staging paid for itself after {break_even:.1f} epochs (from the medians; {best:.1f} to "
                   f"{worst:.1f} from the extremes of the ranges; reading in place ÷ the local copy "
                   f"{interval_note(in_place, local_read)})")
    return {
        "copy_s": f"{copy.median:.1f}", "predicted_copy_s": f"{predicted_copy_s:.1f}",
        "in_place_s": f"{in_place.median:.1f}", "predicted_in_place_s": f"{predicted_in_place_s:.1f}",
        "local_s": f"{local_read.median:.2f}", "staging_verdict": verdict,
    }


@provides_figures("retries", "resume_saving")
def retry_figures(retries: int, bytes_not_reread: int) -> dict:
    """How many retries the workers made, and what resuming at sample boundaries saved, as a clause."""
    if bytes_not_reread == 0:
        saved = ("none of the failures came part-way through a shard, so every retry opened its shard from the "
                 "start, with nothing to skip")
    else:
        saved = f"resuming at sample boundaries saved reading {bytes_not_reread / 1e6:.1f} MB again"
    return {"retries": retries, "resume_saving": saved}

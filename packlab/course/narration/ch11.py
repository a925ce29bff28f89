"""Chapter 11, "Past the decode ceiling": the sentences that follow its measurements.

Every function takes measurements (spreads of repeated runs, reports) and returns text
whose claims follow :func:`packlab.bench.compare`: "faster" only where the runs say so
clearly, "no clear difference" otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from packlab.bench import Spread, compare, interval_note, markdown_table, ratio_words, with_note
from packlab.ceiling import CeilingRatio, ceiling_figure, loader_vs_ceiling
from packlab.course.prose import provides_figures


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


def worker_count(workers: int, cores: int, limit: str) -> str:
    """How many workers a loader got and, where fewer than the cores, what held them back (``limit``)."""
    if workers >= cores:
        return f"{workers} workers, one per core"
    return f"{workers} workers, not {cores} ({limit})"


def startup_limit(batches: int) -> str:
    """Why an epoch of ``batches`` gets at most a quarter as many workers: each worker's first batch is start-up."""
    return f"an epoch holds {batches} batches and each worker's first is start-up: at most a quarter go to start-up"


def pyspy_sentence(seen) -> str:
    """Which of :func:`packlab.profiling.profile_workers`' three ways answered (``seen``), and why the earlier ones did not."""
    from packlab import profiling

    how, why = seen.how, seen.why
    if how == profiling.ATTACHED:
        return f"py-spy attached to the running job: a snapshot of every process, then a recording of {seen.seconds:g} s."
    if how == profiling.STARTED_UNDER_PYSPY:
        return (f"py-spy may not attach to another process here ({why}), so it started the job as its own child and "
                "recorded it: no snapshot of one moment, so below is the stack each process was sampled in most often.")
    return (f"py-spy cannot run here ({why}), so the workers' work ran in this process, sampled by a CPU-time timer; below is "
            "the stack it was sampled in most often, and there is no separate main process.")


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


def closer_words(ours_db: float, theirs_db: float, than: str) -> str:
    """Which of two sets of crops is nearer the standard's pixels, from their PSNRs (dB; higher is nearer).

    ``"closer to the standard's than <than> (44.3 dB against 36.6 dB)"``; within 0.1 dB, "as close as".
    """
    numbers = f"({db(ours_db)} against {db(theirs_db)})"
    if math.isinf(ours_db) and math.isinf(theirs_db) or abs(ours_db - theirs_db) < 0.1:
        return f"as close to the standard's as {than} {numbers}"
    return f"{'closer to' if ours_db > theirs_db else 'further from'} the standard's than {than} {numbers}"


def _words_and_note(words: str) -> tuple[str, str]:
    """:func:`ratio_words`' text split into its words and the bracket after them (its interval), if any:
    ``"1.5 times less (1.32–1.59x)"`` -> ``("1.5 times less", "1.32–1.59x")``."""
    head, _, tail = words.partition(" (")
    return head, tail[:-1] if tail.endswith(")") else tail


def cost_words(cost: Spread, reference: Spread, than: str) -> str:
    """A per-image cost against a reference cost, as a clause: ``"cost 2.8 times less than <than>"``,
    ``"cost 1.3 times more than <than>"``, or ``"cost about as much as <than> (no clear difference)"``;
    an interval that :func:`ratio_words` gives goes into the closing bracket."""
    words, note = _words_and_note(ratio_words(reference, cost, higher="less", lower="more"))
    if compare(reference, cost) == 0:
        return f"cost about as much as {than} (no clear difference{', ' + note if note else ''})"
    return f"cost {words} than {than}" + (f" ({note})" if note else "")


def rate_words(a: Spread, b: Spread, than: str | None = None) -> str:
    """Two rates compared (higher is better): ``"1.4 times faster"``, with ``than``: ``"1.4 times faster than <than>"``,
    or ``"not clearly faster or slower than <than>"``; an interval :func:`ratio_words` gives follows in brackets."""
    words = ratio_words(a, b)
    if than is None:
        return words
    head, note = _words_and_note(words)
    bracket = f" ({note})" if note else ""
    if compare(a, b) == 0:
        return f"not clearly faster or slower than {than}{bracket}"
    return f"{head} than {than}{bracket}"


def pays_sentence(a: Spread, b: Spread, what: str, conversion_us: float | None = None, cores: int | None = None) -> str:
    """Whether a change paid, end to end: ``a`` (with it) against ``b`` (without), both images/s.

    ``conversion_us``, the measured cost per image of the conversion the change moves into
    the training process, and ``cores``, the cores the workers and that process share,
    explain a null result with numbers instead of a guess.
    """
    verdict = compare(a, b)
    if verdict > 0:
        return f"{what} paid here: {ratio_words(a, b)} end to end"
    if verdict < 0:
        return f"{what} cost here: {ratio_words(a, b)} end to end"
    note = interval_note(a, b)
    text = with_note(f"{what} made no clear difference end to end here", f"with ÷ without {note}" if note else "")
    if conversion_us is not None and cores is not None:
        text += (f"; the conversion it moves into the training process measured {conversion_us:.0f} µs per image on "
                 f"its own, and that process shares the machine's {cores} cores with the workers, so what the "
                 "workers save the training process spends")
    return text


def first_batch_columns(epochs: Mapping[str, list]) -> dict:
    """Extra table columns from :func:`packlab.steady.steady_rates`' epochs: first-batch time and start-up share."""
    out = {}
    for name, runs in epochs.items():
        if runs:
            first = sorted(e.first_batch_seconds for e in runs)[len(runs) // 2]
            share = max(e.startup_share for e in runs)
            out[name] = {"first batch, median (s)": f"{first:.2f}", "start-up share, at most": percent(share)}
    return out


def roi_sentence(crop_runs: Mapping[str, Mapping[str, Spread]], reference: str, roi: str, why_not: str | None) -> str:
    """What the crop-aware (window) decode bought on each input, or why it did not run."""
    if why_not is not None:
        return f"The crop-aware decode did not run here ({why_not})."
    small = cost_words(crop_runs["originals"][roi], crop_runs["originals"][reference], "the standard")
    large = cost_words(crop_runs["4x larger"][roi], crop_runs["4x larger"][reference], "the standard")
    return (f"Decoding only the window {small} on the originals and {large} on the large copies: it skips the "
            "inverse transform, upsampling and colour conversion outside the window and stops after its last row, "
            "but every row above the window must still be entropy-decoded, and on these sources that is much of "
            "the cost.")


def _ceiling_lesson(ours: CeilingRatio, standard: CeilingRatio) -> str:
    """What the two loaders' ratios to their own ceilings say (:func:`packlab.ceiling.loader_vs_ceiling`)."""
    if ours.mis_measured or standard.mis_measured:
        return ("A ceiling does the same work on the same images with nothing else, so no loader can pass it: a run "
                "that says otherwise caught the ceiling at a busy moment of this shared machine, and that ratio is to "
                "be measured again on a quieter one.")
    if ours.verdict < 0 and standard.verdict < 0:
        return "What is missing is what each loader itself costs: reading, batching in fresh memory, handing over."
    if ours.verdict < 0 or standard.verdict < 0:
        which = "Ours" if ours.verdict < 0 else "The standard pipeline"
        return (f"{which} stayed clearly below its ceiling, by what the loader itself costs (reading, batching in "
                "fresh memory, handing over); the other one the runs could not tell from its ceiling.")
    return ("Neither loader was clearly below its ceiling in these runs: the loader's own costs (reading, batching "
            "in fresh memory, handing over) were within the noise of this machine.")


def ceiling_sentence(ours: CeilingRatio, ours_ceiling: Spread, standard: CeilingRatio, standard_ceiling: Spread) -> str:
    """Each loader against the ceiling of its own work, in every branch :class:`CeilingRatio` has."""
    return (f"The ceiling of our work measured {ceiling_figure(ours_ceiling):.0f} images/s in its best run, the "
            f"standard pipeline's {ceiling_figure(standard_ceiling):.0f}: {ours.words('ours')}; "
            f"{standard.words('the standard pipeline')}.")


def ceiling_summary(ours: CeilingRatio) -> str:
    """Our loader against its own ceiling, as a clause of the chapter's summary."""
    if ours.mis_measured:
        return "the ceiling of our work was mis-measured in this run (ours measured above it), so it gives no ratio"
    below = "clearly below it" if ours.verdict < 0 else "not clearly below it"
    return f"ours reached {ours.result:.2f} of the ceiling of its own work, {below}"


def dali_sentence(ours: Spread, dali: Spread | None, gpu_status: str | None = None) -> str:
    """Ours against DALI's CPU pipeline, with what that pipeline is and is not (``gpu_status``: None without a GPU)."""
    if dali is None:
        return "DALI is not installed here, so its row did not run."
    purpose = ("its purpose, `device=\"mixed\"` with nvJPEG and the hardware JPEG decoder of an A100 or H100, needs "
               "an NVIDIA GPU and did not run on this machine" if gpu_status is None else
               f"its purpose, `device=\"mixed\"` with nvJPEG and the hardware JPEG decoder where the GPU has one, "
               f"runs in \"On a GPU\" below ({gpu_status})")
    return (f"DALI's CPU pipeline, on the same stored shards with the same kind of crops, delivered {dali.median:.0f} "
            f"images/s: ours was {rate_words(ours, dali, 'DALI')} (ours / DALI = {ours.median / dali.median:.2f}). "
            f"That row is DALI's CPU operators, its fallback: {purpose}. Its pipeline also writes every crop once more "
            "in `fn.crop_mirror_normalize`, which here only mirrors it and copies it out as uint8 (mean 0, scale 1: "
            "no value changes), a full copy of each image, as the course's collate copies each crop into its batch. "
            "DALI's pipeline runs ahead into its next epoch's first batches while it waits (`prefetch_queue_depth`), "
            "so its first batch is ready when asked for; the clock of every pipeline starts only after one batch per "
            "worker or thread.")


@provides_figures("ours_rate", "standard_rate", "speedup_words", "storage_ratio", "end_psnr", "ours_ceiling_rate",
                  "ceiling_sentence", "ceiling_lesson", "dali_sentence", "ours_first",
                  "standard_first", "summary_speedup", "summary_ceiling", "end_startup")
def end_to_end_figures(runs: Mapping[str, Spread], epochs: Mapping[str, list], rows: Mapping[str, str],
                       storage_ratio: float, psnr_db: float, gpu_status: str | None = None) -> dict:
    """The figures of chapter 11's "All together": the training pipeline speed-up and each ratio to a ceiling.

    Each loader's ratio to its own ceiling is :func:`packlab.ceiling.loader_vs_ceiling`'s, the
    definition ``make bench``'s ``stored_loader_vs_stored_ceiling`` uses too. ``gpu_status``
    names the GPU where there is one (None: none), for what DALI's row could not show.
    """
    standard, ours = runs[rows["standard"]], runs[rows["ours, stored"]]
    standard_ceiling = runs["ceiling: standard crops, originals"]
    ours_ceiling = runs["ceiling: our crops, stored"]
    ours_ratio, standard_ratio = loader_vs_ceiling(ours, ours_ceiling), loader_vs_ceiling(standard, standard_ceiling)
    speedup = rate_words(ours, standard, "the standard pipeline")
    first = {name: sorted(e.first_batch_seconds for e in runs_)[len(runs_) // 2] for name, runs_ in epochs.items()}
    return {
        "ours_rate": f"{ours.median:.0f}", "standard_rate": f"{standard.median:.0f}",
        "speedup_words": speedup, "storage_ratio": f"{storage_ratio:.2f}", "end_psnr": db(psnr_db),
        "ours_ceiling_rate": f"{ceiling_figure(ours_ceiling):.0f}",
        "ceiling_sentence": ceiling_sentence(ours_ratio, ours_ceiling, standard_ratio, standard_ceiling),
        "ceiling_lesson": _ceiling_lesson(ours_ratio, standard_ratio),
        "dali_sentence": dali_sentence(ours, runs.get(rows["DALI, stored"]), gpu_status),
        "ours_first": f"{first[rows['ours, stored']]:.2f}", "standard_first": f"{first[rows['standard']]:.2f}",
        "summary_speedup": (f"the training crops came {speedup}" if compare(ours, standard) != 0 else
                            f"the training crops came {ours.median / standard.median:.1f} times as fast as the standard "
                            + with_note("pipeline's by the medians, not a clear difference by the course's rule",
                                      interval_note(ours, standard, estimate=False))),
        "summary_ceiling": ceiling_summary(ours_ratio),
        "end_startup": percent(max(e.startup_share for runs_ in epochs.values() for e in runs_)),
    }


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
    """The lesson of the two draft measurements (large sources, ImageNet-sized sources), as far as they support it.

    Each verdict carries its interval (:func:`packlab.bench.interval_note`), as the full decode's time
    over ``draft``'s: above 1, ``draft`` saved time; a null result shows how large a saving the runs could
    have missed."""
    large, small = compare(large_full, large_draft), compare(small_full, small_draft)
    large_note = interval_note(large_full, large_draft)
    small_note = interval_note(small_full, small_draft)
    large_bracket = f"full decode ÷ `draft`, {large_note}" if large_note else ""
    small_bracket = f"full decode ÷ `draft`, {small_note}" if small_note else ""
    if large > 0 and small == 0:
        return (with_note("So Pillow's `draft` pays where the source is at least twice the target in both directions",
                          large_bracket)
                + with_note(", and changes nothing below that", small_bracket) + ".")
    if large > 0:
        return (with_note("The reduced decode paid on the large sources", large_bracket)
                + "; on the ImageNet-sized ones the runs say: "
                + with_note("it was dearer." if small < 0 else "it was cheaper, which `draft` alone cannot explain.",
                            small_bracket))
    return with_note("On this run even the large sources did not show a clear gain from `draft`", large_bracket) + (
        ": the machine was too busy to tell, or decoding is not what limits it here.")

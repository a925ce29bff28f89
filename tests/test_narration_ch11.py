"""Chapter 11's ceiling and DALI sentences follow the measurements: no loader above its ceiling is a result."""

from __future__ import annotations

import re

from packlab.bench import Spread
from packlab.ceiling import loader_vs_ceiling
from packlab.course.narration import ch11
from packlab.loaders.lineup import CROP_ROWS
from packlab.steady import SteadyEpoch

CEILING = Spread.of([2000, 2010, 1990, 2005, 1995, 2002])
BELOW = Spread.of([1600, 1610, 1590, 1605, 1595, 1602])  # 0.80 of the ceiling, every run below it
NOISY = Spread.of([2050, 1900, 2100, 1980, 2030, 1970])  # median above the ceiling's median, below its best run
PAST_BEST = Spread.of([2050, 1900, 2100, 2020, 2030, 1970])  # median above the ceiling's best run, runs mixed
ABOVE = Spread.of([2400, 2410, 2390, 2405, 2395, 2402])  # clearly above: a mis-measured ceiling


def _figures(ours: Spread, ours_ceiling: Spread, standard: Spread, standard_ceiling: Spread, gpu_status=None):
    runs = {CROP_ROWS["standard"]: standard, CROP_ROWS["ours, stored"]: ours,
            "ceiling: standard crops, originals": standard_ceiling, "ceiling: our crops, stored": ours_ceiling,
            CROP_ROWS["DALI, stored"]: Spread.of(0.6 * v for v in ours)}
    epoch = SteadyEpoch(1024, 0.5, 0.6, 896, 0.5, 1.1)
    epochs = {CROP_ROWS["standard"]: [epoch], CROP_ROWS["ours, stored"]: [epoch]}
    return ch11.end_to_end_figures(runs, epochs, CROP_ROWS, 0.4, 32.0, gpu_status)


def test_a_loader_clearly_above_its_ceiling_says_the_ceiling_was_mis_measured_and_gives_no_ratio():
    ratio = loader_vs_ceiling(ABOVE, CEILING)
    assert ratio.mis_measured and ratio.result is None and ratio.share > 1
    figures = _figures(ABOVE, CEILING, BELOW, CEILING)
    assert "the ceiling was mis-measured" in figures["ceiling_sentence"]
    assert "no loader can pass it" in figures["ceiling_lesson"]
    assert "mis-measured" in figures["summary_ceiling"] and "1.20" not in figures["summary_ceiling"]
    assert "within the noise" not in figures["ceiling_lesson"]


def test_a_median_above_the_ceilings_median_but_below_its_best_run_is_a_share_of_at_most_1():
    # With the median on both sides this loader would sit above its ceiling; the ceiling's figure is its best run.
    assert NOISY.median > CEILING.median
    ratio = loader_vs_ceiling(NOISY, CEILING)
    assert ratio.verdict == 0 and not ratio.mis_measured and ratio.result == ratio.share <= 1
    figures = _figures(NOISY, CEILING, BELOW, CEILING)
    assert f"ours reached {ratio.share:.2f} of its ceiling's best run" in figures["ceiling_sentence"]
    assert "not clearly below it by the course's rule" in figures["ceiling_sentence"]
    assert "2010 images/s in its best run" in figures["ceiling_sentence"]
    assert figures["summary_ceiling"].endswith("not clearly below it")
    assert "stayed clearly below" in figures["ceiling_lesson"]


def test_a_median_past_the_ceilings_best_run_is_a_mis_measured_ceiling_even_when_the_runs_are_mixed():
    ratio = loader_vs_ceiling(PAST_BEST, CEILING)
    assert ratio.verdict == 0 and ratio.mis_measured and ratio.result is None
    figures = _figures(PAST_BEST, CEILING, BELOW, CEILING)
    assert "the ceiling was mis-measured" in figures["ceiling_sentence"]
    assert "mis-measured" in figures["summary_ceiling"]


def test_loaders_below_their_ceilings_give_their_ratios():
    ratio = loader_vs_ceiling(BELOW, CEILING)
    assert ratio.verdict < 0 and ratio.result == ratio.share == BELOW.median / CEILING.high < 1
    figures = _figures(BELOW, CEILING, BELOW, CEILING)
    assert (f"ours reached {ratio.share:.2f} of its ceiling's best run (its runs against the ceiling's: "
            f"{ratio.interval.range_text()}), clearly below it" in figures["ceiling_sentence"])
    assert figures["summary_ceiling"].startswith(f"ours reached {ratio.share:.2f} of the ceiling")
    assert figures["ceiling_lesson"].startswith("What is missing is what each loader itself costs")


def test_the_dali_sentence_says_its_cpu_operators_ran_not_its_gpu_decoder():
    without = _figures(BELOW, CEILING, BELOW, CEILING)["dali_sentence"]
    assert "CPU operators, its fallback" in without and "did not run on this machine" in without
    assert "crop_mirror_normalize" in without and "a full copy of each image" in without
    with_gpu = _figures(BELOW, CEILING, BELOW, CEILING, gpu_status="NVIDIA H200")["dali_sentence"]
    assert "did not run" not in with_gpu and "NVIDIA H200" in with_gpu
    assert ch11.dali_sentence(BELOW, None) == "DALI is not installed here, so its row did not run."


def test_closer_words_follow_the_psnrs():
    assert ch11.closer_words(44.3, 36.6, "`draft`'s").startswith("closer to the standard's than `draft`'s (44.3 dB")
    assert ch11.closer_words(30.0, 36.6, "x").startswith("further from")
    assert ch11.closer_words(float("inf"), float("inf"), "x").startswith("as close to")


def test_cost_and_rate_words_follow_the_verdict_with_any_interval_note():
    cheap, dear = Spread.of([10, 11, 10, 12, 10, 11]), Spread.of([30, 31, 29, 32, 30, 31])
    assert ch11.cost_words(cheap, dear, "the standard").startswith("cost 2.9 times less than the standard")
    assert ch11.cost_words(dear, cheap, "the standard").startswith("cost 2.9 times more than the standard")
    same = ch11.cost_words(CEILING, NOISY, "the standard")
    assert same.startswith("cost about as much as the standard (no clear difference") and same.endswith(")")
    assert ch11.rate_words(CEILING, NOISY, "DALI").startswith("not clearly faster or slower than DALI")
    assert ch11.rate_words(ABOVE, CEILING, "DALI").startswith("1.2 times faster than DALI")


def test_a_null_end_to_end_result_still_shows_its_interval():
    # "No clear difference" says how large a difference the runs could have missed (issue 42).
    null = ch11.pays_sentence(NOISY, CEILING, "Handing over uint8", conversion_us=30.0, cores=2)
    assert null.startswith("Handing over uint8 made no clear difference end to end here (with ÷ without ")
    assert "\u2013" in null and "30 µs per image" in null
    assert "\u2013" in ch11.pays_sentence(ABOVE, CEILING, "Handing over uint8")  # ratio_words' interval
    summary = _figures(NOISY, CEILING, CEILING, CEILING)["summary_speedup"]
    assert "not a clear difference by the course's rule (interval " in summary and summary.endswith("x)")


def test_the_draft_rule_carries_an_interval_for_each_verdict_it_states():
    # full decode and draft in µs per image: on large sources draft is 3x cheaper, on small ones the same or not
    full, draft = Spread.of([900, 910, 905, 920, 899, 903]), Spread.of([300, 310, 305, 290, 301, 303])
    small_full = Spread.of([1000, 1010, 990, 1005, 995, 1002])
    small_same = Spread.of([1001, 1011, 989, 1004, 996, 1003])
    interval = r"[0-9.]+x, [0-9.]+\u2013[0-9.]+x"
    rule = ch11.draft_rule(draft, full, small_same, small_full)
    assert re.fullmatch(rf"So Pillow's `draft` pays where the source is at least twice the target in both directions "
                        rf"\(full decode ÷ `draft`, {interval}\), and changes nothing below that "
                        rf"\(full decode ÷ `draft`, {interval}\)\.", rule), rule
    assert "(full decode ÷ `draft`, 3.00x, " in rule
    dearer = ch11.draft_rule(draft, full, Spread.of(2 * v for v in small_full), small_full)
    assert dearer.endswith("it was dearer (full decode ÷ `draft`, 0.50x, 0.49\u20130.51x)."), dearer
    cheaper = ch11.draft_rule(draft, full, small_full, Spread.of(2 * v for v in small_full))
    assert "it was cheaper, which `draft` alone cannot explain (full decode ÷ `draft`, 2.00x, " in cheaper, cheaper
    assert cheaper.count("\u2013") == 2 and dearer.count("\u2013") == 2
    null = ch11.draft_rule(full, full, small_full, small_full)
    assert re.fullmatch(rf"On this run even the large sources did not show a clear gain from `draft` "
                        rf"\(full decode ÷ `draft`, {interval}\): the machine was too busy to tell, or decoding is "
                        rf"not what limits it here\.", null), null

"""Every sentence chapters 0–5 build reads right for every verdict, and says "clearly" only when
``bench.compare`` does.

Each helper of ``packlab.course.narration.chNN`` is called with spreads that ``compare``
calls clearly higher, clearly lower and not different, and its words are checked against
that verdict: no "clearly" (other than "not clearly") without a clear verdict, no
"no clear difference" with one, and none of the slips a template makes ("no clearly
different", doubled spaces or full stops).
"""

from __future__ import annotations

import re

import pytest

from packlab.bench import INTERVAL_NOTE, Spread, compare, without_interval_notes
from packlab.course.narration import ch00, ch01, ch02, ch03, ch04, ch05

BASE = Spread.of([100.0, 101.0, 102.0, 103.0, 104.0, 105.0])
HIGHER = Spread.of([v * 1.5 for v in BASE])
LOWER = Spread.of([v / 1.5 for v in BASE])
SAME = Spread.of([101.5, 100.5, 104.5, 102.5, 103.5, 99.5])
SLIGHTLY_HIGHER = Spread.of([v * 1.03 for v in BASE])  # every run higher, but the medians only 3 % apart

CASES = {"higher": HIGHER, "lower": LOWER, "same": SAME}


def test_the_fixtures_cover_every_verdict():
    assert compare(HIGHER, BASE) == 1 and compare(LOWER, BASE) == -1 and compare(SAME, BASE) == 0


def claims_clear(text: str) -> bool:
    """Whether the words say the difference is clear (or give a ratio, which only clear verdicts do)."""
    without_negations = re.sub(r"not clearly|no clear", "", text)
    return bool(re.search(r"\bclear(ly)?\b|\btimes (faster|slower)\b", without_negations))


def well_formed(text: str) -> None:
    assert "no clearly" not in text and "  " not in text and ".." not in text, text
    assert text == text.strip(), text


#: (name, the helper's arguments for one case's spread, helper); the helpers of EXPLANATIONS
#: explain a verdict stated in the sentence before them, so they need not repeat "clearly".
EXPLANATIONS = {"ch03.lock_cache_sentence", "ch03.lock_model_sentence", "ch03.workers_explanation"}
TWO_SPREAD_HELPERS = [
    ("ch01.workers_verdict", lambda a: (a, BASE), ch01.workers_verdict),
    ("ch01.same_loader_verdict", lambda a: (a, BASE), ch01.same_loader_verdict),
    ("ch01.per_batch_sentence", lambda a: (a, BASE, 64, 32), ch01.per_batch_sentence),
    ("ch01.order_verdict", lambda a: (a, BASE), ch01.order_verdict),
    ("ch01.pil_sentence", lambda a: (a, BASE, 3.0), ch01.pil_sentence),
    ("ch01.threads_sentence", lambda a: (a, BASE), ch01.threads_sentence),
    ("ch02.than", lambda a: (a, BASE, "the file"), ch02.than),
    ("ch02.rate_verdict", lambda a: (a, BASE), ch02.rate_verdict),
    ("ch02.member_work_sentence", lambda a: (a, BASE), ch02.member_work_sentence),
    ("ch02.deflate_sentence", lambda a: (a, BASE), ch02.deflate_sentence),
    ("ch02.raw_readers_sentence", lambda a: (a, BASE, 60.0, 40.0), ch02.raw_readers_sentence),
    ("ch02.cold_sentence", lambda a: (a, BASE, BASE, BASE), ch02.cold_sentence),
    ("ch03.workers_verdict", lambda a: (a, BASE), ch03.workers_verdict),
    ("ch03.workers_summary", lambda a: (a, BASE, 64), ch03.workers_summary),
    ("ch03.workers_explanation", lambda a: (a, BASE, 64, 30.0, 1.5, 2), ch03.workers_explanation),
    ("ch03.lock_sentence", lambda a: (a, BASE, "raw"), ch03.lock_sentence),
    ("ch03.lock_cache_sentence", lambda a: (a, BASE, "30"), ch03.lock_cache_sentence),
    ("ch03.lock_model_sentence", lambda a: (a, BASE, 1.5, 2), ch03.lock_model_sentence),
    ("ch03.reopen_verdict", lambda a: (a, BASE), ch03.reopen_verdict),
    ("ch03.than", lambda a: (a, BASE, "the handles"), ch03.than),
    ("ch04.gain_verdict", lambda a: (a, BASE), ch04.gain_verdict),
    ("ch04.beyond_cores_sentence", lambda a: (BASE, a, 2, 4), ch04.beyond_cores_sentence),
    ("ch04.persistence_saving", lambda a: (BASE, a), ch04.persistence_saving),
    ("ch05.parse_verdict", lambda a: (a, BASE), ch05.parse_verdict),
    ("ch05.versus_webdataset", lambda a: (a, BASE), ch05.versus_webdataset),
]


@pytest.mark.parametrize("name, arguments, helper", TWO_SPREAD_HELPERS, ids=[h[0] for h in TWO_SPREAD_HELPERS])
def test_a_sentence_claims_a_clear_difference_exactly_when_compare_does(name, arguments, helper):
    texts = {case: helper(*arguments(spread)) for case, spread in CASES.items()}
    for case, text in texts.items():
        well_formed(text)
        # every printed verdict has its interval (issue 42); an explanation follows a verdict that carried it
        assert name in EXPLANATIONS or INTERVAL_NOTE.search(text) or "–" in text, f"{name}, {case}: {text!r}"
        if case == "same":
            assert not claims_clear(text), f"{name} claims a clear difference where compare sees none: {text!r}"
        else:
            assert name in EXPLANATIONS or claims_clear(text), f"{name} does not say the {case} case is clear: {text!r}"
            assert "no clear difference" not in text, text
    assert len(set(texts.values())) == 3, f"{name} says the same for different verdicts: {texts}"


def test_a_difference_below_the_minimum_ratio_is_never_called_clear():
    assert compare(SLIGHTLY_HIGHER, BASE) == 0
    for name, arguments, helper in TWO_SPREAD_HELPERS:
        assert not claims_clear(helper(*arguments(SLIGHTLY_HIGHER))), name


def test_a_stat_sentence_prints_clearly_different_medians_differently():
    warm = Spread.of([3.0, 3.1, 3.05, 3.02, 3.08, 3.04])
    pages = Spread.of([3.4, 3.5, 3.45, 3.42, 3.48, 3.44])
    text = ch02.stat_sentence(warm, pages, None)
    assert "clearly more" in text and "3.0 µs warm and 3.4 µs" in text, text
    assert "no clear difference" in ch02.stat_sentence(warm, warm, warm)
    assert "clearly more than" in ch02.stat_sentence(warm, warm, Spread.of([v * 3 for v in warm]))
    assert "cannot drop" in ch02.stat_sentence(warm, None, None)


def test_the_member_work_sentence_gives_the_factor_with_its_interval():
    decode = Spread.of([3.1, 3.2, 3.0, 3.3, 3.15, 3.05])
    convert = Spread.of([0.051, 0.052, 0.05, 0.053, 0.0515, 0.0505])
    text = ch02.member_work_sentence(decode, convert)
    assert text.startswith("3.12 ms against 0.051 ms per image (medians): the raw member clearly saves CPU work, "
                           "a factor of 61.0 per image (decode ÷ convert, "), text
    assert re.search(r"\(decode ÷ convert, [0-9.]+\u2013[0-9.]+x\)\.$", text), text
    # medians that round alike get the decimals that tell them apart
    close = ch02.member_work_sentence(Spread.of([0.0512, 0.0513, 0.0511]), Spread.of([0.0514, 0.0515, 0.0516]))
    assert close.startswith("0.0512 ms against 0.0515 ms"), close
    assert "too few runs for an interval" in close and "no clear difference" in close


def test_cold_zip_sentence_names_the_levels_where_zipfile_was_slower():
    assert "not clearly different" in ch02.cold_zip_sentence([])
    text = ch02.cold_zip_sentence(["data pages", "all caches"])
    assert text.startswith("With data pages dropped and with all caches dropped, `ZipFile.read` was clearly slower")
    noted = ch02.cold_zip_sentence(["data pages"], {"data pages": "1.40x, 1.21–1.60x", "all caches": "1.02x, 0.9–1.1x"})
    assert noted.startswith("With data pages dropped (1.40x, 1.21–1.60x), `ZipFile.read` was clearly slower"), noted
    assert ch02.cold_zip_sentence([], {"data pages": "1.02x, 0.90–1.10x"}) == (
        "Cold, `ZipFile.read` and one `pread` of the same member were not clearly different here "
        "(`ZipFile.read` ÷ `pread`, data pages dropped: 1.02x, 0.90–1.10x).")


def test_layout_verdict_names_only_the_pairs_compare_tells_apart():
    interval = r"[0-9.]+x, [0-9.]+\u2013[0-9.]+x"
    assert re.fullmatch(rf"by the course's rule no clear difference between any two of the layouts "
                        rf"\(a ÷ b {interval}; a ÷ c {interval}; b ÷ c {interval}\)",
                        ch05.layout_verdict({"a": BASE, "b": SAME, "c": SAME}))
    text = ch05.layout_verdict({"folder": BASE, "zip": SAME, "tar": HIGHER})
    assert re.fullmatch(rf"folder 1.5 times slower than tar; zip 1.5 times slower than tar "
                        rf"\(the other pairs: no clear difference; folder ÷ zip {interval}\)",
                        without_interval_notes(text)), text


def test_chapter_3_explains_the_workers_result_whichever_way_it_falls():
    won = ch03.workers_explanation(HIGHER, BASE, 64, 30.0, 1.5, 2)
    assert "at most about twice" in won and "opens the archive" not in won
    for spread, outcome in ((LOWER, "The workers lost here"), (SAME, "The workers did not clearly gain here")):
        text = ch03.workers_explanation(spread, BASE, 64, 30.0, 1.5, 2)
        assert text.startswith(outcome) and "at most about twice" not in text, text
        assert "0.62 s for the 64 images" in text and "(30 ms" in text and "1.5 on 2 cores" in text, text
    assert ch03.workers_summary(LOWER, BASE, 64).startswith("clearly slower than one process over 64 images (68 against 102")
    assert ch03.workers_summary(HIGHER, BASE, 64).startswith("1.50 times as fast as one process over 64 images")


def test_error_kinds_counts_the_read_that_was_spoiled():
    errors = [ValueError("Bad CRC-32 for file '1.jpg'"), ValueError("Bad CRC-32 for file '2.jpg'"),
              ValueError("Bad magic number for file header"), None, KeyError("x")]
    assert ch03.error_kinds(errors) == "2 × `Bad CRC-32`, 1 × `Bad magic number for file header`, 1 × `KeyError`"
    assert ch03.error_kinds([None]) == "none of them failed"


def test_the_simulation_sentence_and_small_helpers():
    text = ch01.simulation_sentence({"old: 3 runs each, ranges": (0.101, 0.6), "course: 5 runs each, compare": (0.012, 0.8),
                                     "course: 6 runs each, compare": (0.014, 0.9)})
    assert "10.1 %" in text and "1.2 % and 1.4 %" in text and "80 % and 90 %" in text and "5 runs each and 6" in text
    assert ch01.split_chance(BASE, BASE) == "1.00"
    assert "ms more per image" in ch01.gap_sentence(0.001) and "no slower" in ch01.gap_sentence(-0.001)
    assert ch00.size_against_imagenet(1.0) == "about the same as ImageNet's"
    assert ch00.size_against_imagenet(0.5) == "0.50 times ImageNet's"
    assert ch02.crc_sentence(20.0, Spread.of([2000.0] * 6)).endswith("4 % of the raw folder's 500 µs per image.")


def test_what_two_workers_can_use_follows_the_cores():
    assert "both cores here busy" in ch01.two_workers_cores(2) and "cannot add much" in ch01.two_workers_cores(2)
    assert "the one core here" in ch01.two_workers_cores(1)
    sixteen = ch01.two_workers_cores(16)
    assert "at most two of the 16 cores" in sixteen and "can add speed" in sixteen and "cannot" not in sixteen


def test_a_single_run_is_reported_without_a_verdict():
    text = ch04.spawn_start_sentence(5.3, 1.1)
    assert "5.3 s" in text and "4.2 s more" in text and "one run of each" in text and not claims_clear(text)


def test_the_few_runs_sentence_counts_the_lost_pairs_exactly():
    from math import comb

    assert ch01.lost_pairs_chance(4, 0) == pytest.approx(2 / comb(8, 4))
    assert ch01.lost_pairs_chance(5, 1) == pytest.approx(4 / comb(10, 5))  # the review's 4/252: clear at 2 %
    text = ch01.few_runs_sentence()
    assert "four runs can never be called clear" in text and "2.9 %" in text
    assert "Five runs each may lose 1 of their 25 pairs (a chance of 1.6 %)" in text
    assert "six may lose 3 of their 36" in text


def test_the_position_sentences_follow_the_verdicts():
    clear = {"A": LOWER, "B": BASE}
    same = {"A": SAME, "B": BASE}
    text = ch01.position_sentence(clear, same)
    assert "called A clearly slower (A ÷ B 0.67x, 0.65–0.69x), although both are one loader" in text
    assert "saw no clear difference (A ÷ B " in text
    rates = {order: {0.0: {"equal called different": 0.015, "1.3x found": 0.9},
                     0.15: {"equal called different": false, "1.3x found": 0.7}}
             for order, false in (("fixed", 0.34), ("shuffled", 0.036), ("balanced", 0.002))}
    text = ch01.position_simulation_sentence(rates, 0.02)
    assert "fixed 34.0 % (beyond" in text and "shuffled 3.6 % (beyond" in text and "balanced 0.2 % (within" in text
    assert "at or under the bound" in text and "70 % against 90 %" in text
    rates["fixed"][0.0]["equal called different"] = 0.05
    assert "above the bound" in ch01.position_simulation_sentence(rates, 0.02)


def test_the_outlier_sentence_reports_both_round_counts_and_the_bound():
    rates = {"6 rounds": {"equal called different": 0.007, "1.3x found": 0.34, "interval held the ratio": 0.982},
             "20 rounds": {"equal called different": 0.011, "1.3x found": 0.97, "interval held the ratio": 0.978}}
    text = ch01.outlier_sentence(rates, 0.02, 2000)
    assert text.startswith("At 6 rounds a real 1.3-fold difference was found in 34 % of 2,000 comparisons, at 20 "
                           "rounds in 97 %"), text
    assert "0.7 % at 6 rounds and 1.1 % at 20 rounds: within the 2 % bound" in text and "98.2 % and 97.8 %" in text
    assert "(about ±0.6 points)" in text
    rates["6 rounds"]["equal called different"] = 0.021  # within two standard errors of 2 % over 2,000
    assert "within the 2 % bound" in ch01.outlier_sentence(rates, 0.02, 2000)
    rates["6 rounds"]["equal called different"] = 0.03
    assert "beyond the 2 % bound" in ch01.outlier_sentence(rates, 0.02, 2000)


def test_the_multiplicity_sentence_counts_the_verdicts_the_chapters_draw():
    from packlab import paths

    sites = ch01.verdict_sites(paths.repo_root())
    assert sites["01_jpeg_files.md"] >= 5 and sum(sites.values()) >= 50
    # chapter 12's test of mixing against random permutations is a verdict too (review B9)
    assert sites["12_training_grade_loading.md"] >= 1
    text = ch01.multiplicity_sentence({"a.md": 30, "b.md": 20}, 0.02)
    assert "at 50 places" in text and "about 1.0 false" in text and '"' not in text


def test_the_chapter_4_sweep_says_where_it_stops_and_why():
    full = ch04.sweep_plan_text(4, 2, 128, 8, 4, 10_000)
    assert full == "largest count: 4 workers, 4 batches each at least (128 images in batches of 8), two workers per core"
    capped = ch04.sweep_plan_text(62, 32, 1_984, 8, 4, 2_000)
    assert capped.startswith("largest count: 62 workers, 4 batches each at least (1984 images in batches of 8); ")
    assert "rather than at two workers per core (64)" in capped and "2,000 images make only 250 batches" in capped
    by_time = ch04.sweep_plan_text(16, 16, 512, 8, 4, 2_000, 512)
    assert "16 workers, 4 batches each" in by_time and "rather than at two workers per core (32)" in by_time
    assert "the sweep reads at most 512 images, which make 64 batches" in by_time
    assert ch04.sweep_plan_text(16, 8, 512, 8, 4, 10_000, 512).endswith("two workers per core")
    well_formed(full)
    well_formed(by_time)
    well_formed(capped)


def test_a_sweep_that_stopped_at_one_worker_per_core_says_it_has_no_point_beyond():
    text = ch04.beyond_cores_sentence(BASE, None, 62, 62)
    assert text == "the sweep stopped at 62 workers, so it has no point beyond them" and not claims_clear(text)

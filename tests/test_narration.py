"""The chapters' generated sentences read correctly for every verdict, and for tiny numbers.

Each helper of :mod:`packlab.course.narration` is called with made-up measurements on
both sides of each verdict: clearly higher, clearly lower, and not clearly different
(six rounds each, as :data:`packlab.bench.ROUNDS`), and with durations of a few
milliseconds where a sentence cites one.
"""

from __future__ import annotations

import pytest

from packlab.bench import Spread, without_interval_notes
from packlab.course.narration import ch06, ch07, ch08, ch10
from packlab.course.prose import seconds_text


def runs(centre: float, spread: float = 0.02) -> Spread:
    """Six runs around ``centre``, within ``spread`` of it."""
    return Spread.of(centre * (1 + spread * (i - 2.5) / 2.5) for i in range(6))


HIGH, LOW, SAME = runs(200), runs(100), runs(101)
bare = without_interval_notes  # the verdicts' words, their intervals taken out


@pytest.mark.parametrize("seconds, text", [(0.0004, "under 1 ms"), (0.04, "40 ms"), (0.35, "0.35 s"), (1.44, "1.4 s"),
                                           (12.3, "12 s"), (0.0, "under 1 ms")])
def test_durations_never_read_as_zero_seconds(seconds, text):
    assert seconds_text(seconds) == text


def test_the_shard_table_sentence_counts_ranks_with_each_share():
    figures = ch06.shard_count_figures(140, 8, ranks=16)
    assert (figures["ranks_with_more"], figures["more_shards"], figures["ranks_with_fewer"], figures["fewer_shards"]) == (
        12, 9, 4, 8)
    assert figures["equal_ranks_16"] == 144 and figures["equal_readers_16"] == 256
    assert figures["extra_batches_pct"] == "12.5"



def test_the_share_per_reader_sentence_says_how_much_longer_the_epoch_lasts():
    even = {"256 shards": [1.09] * 128}
    uneven = {"140 shards": [2.0] * 12 + [1.0] * 116, "144 shards": [1.94] * 16 + [0.97] * 112}
    sentence = ch06.reader_share_figures({**uneven, **even})["reader_share_sentence"]
    assert "1.83 times as long with 140 shards" in sentence and "1.00 times as long with 256 shards" in sentence
    assert "every reader reads the same" in sentence
    sentence = ch06.reader_share_figures(uneven)["reader_share_sentence"]
    assert "leaves some readers idle" in sentence and "every reader reads the same" not in sentence

def test_with_epoch_counts_per_worker():
    counted = {("samples", 0): (100, 100), ("samples", 2): (200, 200), ("batches", 2): (200, 3200)}
    figures = ch06.with_epoch_figures(100, 2, 16, counted)
    assert figures["wds_samples"] == "200" and figures["wds_batch_samples"] == "3,200" and figures["wds_per_worker"] == "50"


def test_the_loaders_summary_states_a_null_result_as_one():
    null = ch08.loaders_figures({"dl": SAME, "fresh": LOW.scaled(1.0), "recycled": SAME, "recycling": SAME}, 400.0, 3)
    assert null["loaders_outcome"].startswith("none of the three was clearly different from the DataLoader")
    assert null["threads_vs_dl"] == "not clearly different from the DataLoader (1.00x, 0.98–1.02x)"
    clear = ch08.loaders_figures({"dl": LOW, "fresh": LOW, "recycled": HIGH, "recycling": SAME}, 400.0, 3)
    assert clear["loaders_outcome"] == ("the thread loader with recycled buffers faster than the DataLoader "
                                        "(2.00x, 1.95–2.05x), clearly")
    assert bare(clear["threads_vs_dl"]) == "faster than the DataLoader"


@pytest.mark.parametrize("torch_gain, words", [(runs(2.0), "lost nothing"), (runs(1.2), "gained less")])
def test_the_conversion_sentence_follows_the_measurement(torch_gain, words):
    assert words in ch08.conversion_sentence(torch_gain, runs(1.9))


def test_the_copy_share_is_given_only_for_a_clear_difference():
    clear = ch08.copy_figures({"private batch": runs(40.0), "batch already in shared memory": runs(0.1)},
                              {"a": True, "b": False}, 64, 3.0)
    assert clear["pickle_verdict"] == "clearly dearer (400x, 390–410x)" and clear["copy_share"].endswith("%")
    null = ch08.copy_figures({"private batch": runs(0.1), "batch already in shared memory": runs(0.1)},
                             {"a": True}, 64, 3.0)
    assert bare(null["pickle_verdict"]) == "not clearly different" and null["copy_share"] == "no clear share"


def test_reading_sentences_cover_every_verdict():
    rates = {"local files": HIGH, "S3, TarShardDataset": LOW, "S3, webdataset": SAME}
    figures = ch10.reading_figures(rates, 0.1)
    assert figures["s3_verdict"] == "local files were read 2.0 times faster (1.95–2.05x) than the object store"
    assert bare(figures["library_verdict"]) == "there was no clear difference between our loader and webdataset over S3"
    rates = {"local files": LOW, "S3, TarShardDataset": HIGH, "S3, webdataset": LOW}
    figures = ch10.reading_figures(rates, 0.1)
    assert bare(figures["s3_verdict"]) == "the object store was read 2.0 times faster than local files"
    assert bare(figures["library_verdict"]) == "our loader was 2.0 times faster than webdataset over S3"


def test_parsing_explains_a_gap_only_where_there_is_one():
    rates = {"S3, TarShardDataset": runs(5000), "S3, webdataset": runs(4000)}
    figures = ch10.parsing_figures({"ours": runs(200), "webdataset": runs(600)}, rates, 1000, 2)
    assert "accounts for" in figures["parse_explains"] and bare(figures["parse_verdict"]) == "3.0 times slower"
    figures = ch10.parsing_figures({"ours": runs(200), "webdataset": runs(201)}, rates, 1000, 2)
    assert figures["parse_explains"].startswith("webdataset's reader was not clearly slower")


def test_a_kill_noticed_at_once_reads_as_such():
    assert ch10.after_the_kill(0.004) == "at once (4 ms)" and ch10.after_the_kill(2.5) == "2.5 s"
    assert ch10.retry_figures(2, 0)["resume_saving"].startswith("none of the failures came part-way")
    assert ch10.retry_figures(2, 3_500_000)["resume_saving"].endswith("3.5 MB again")


def test_staging_gives_a_break_even_only_where_reading_in_place_was_clearly_slower():
    clear = ch10.staging_figures(runs(1.2), runs(1.1), runs(0.2), 1.3, 1.5, 1.1, 1.1, 1.1)
    assert clear["staging_verdict"].startswith("staging paid for itself after 1.3 epochs")
    null = ch10.staging_figures(runs(1.2), runs(0.2), runs(0.2), float("inf"), 1, 1, 1.1, 1.1)
    assert null["staging_verdict"].startswith("reading in place was not clearly slower")


def test_the_sweep_sentences_follow_the_rounds():
    alone = {0: LOW, 2: HIGH}
    figures = ch07.sweep_figures(alone, runs(150), {0: runs(60), 2: runs(110)}, runs(60), runs(1.0, 0.05),
                                 250.0, 2, 1.0, 1.5)
    assert figures["bottleneck_verdict"] == ("the loader alone was slower than the model with 0 workers (0.67x, "
                                             "0.65–0.68x); faster than the model with 2 workers (1.33x, "
                                             "1.30–1.37x)")
    assert figures["serial_where"].endswith("held within 10 % in every round")
    assert figures["cores_per_a100"] == "25" and bare(figures["alone_0_to_all"]) == "2.0 times faster"
    below = ch07.sweep_figures(alone, runs(150), {0: runs(60), 2: runs(110)}, runs(60), runs(0.7, 0.05),
                               250.0, 2, 1.0, 1.5)
    assert "below the prediction in every round" in below["serial_where"]


def test_payback_is_given_only_for_a_clear_saving():
    assert "pays for itself after" in ch07.payback_text(runs(300), runs(150), runs(100), 10_000)
    assert ch07.payback_text(runs(150), runs(151), runs(100), 10_000).startswith(
        "training on raw pixels was not clearly faster")


def test_the_thread_sentence_says_what_torch_followed():
    report = {"cores it may run on (affinity)": 2, "CPU-time quota (cgroup)": None, "torch's default here": 2,
              "torch's default, allowed one core (affinity)": 1}
    sentence = ch07.thread_limit_figures(report)["threads_under_limits"]
    assert "needs root" in sentence and "no CPU-time quota" in sentence and "started 1: torch follows" in sentence
    del report["torch's default, allowed one core (affinity)"]
    report["torch's default, allowed one CPU of time (cgroup quota)"] = 2
    assert "the quota was invisible to it" in ch07.thread_limit_figures(report)["threads_under_limits"]


def test_the_penalty_sentences_compare_both_zip_readers():
    layouts = ("folder", "zip", "zip_pread", "tar")
    rates = {("network model", layout): runs(rate) for layout, rate in zip(layouts, (400, 700, 1400, 3000))}
    rates.update({("cold, all caches", layout): runs(rate) for layout, rate in zip(layouts, (3000, 2000, 3030, 8000))})
    rates.update({("warm", layout): runs(rate) for layout, rate in zip(layouts, (9000, 9000, 9000, 20000))})
    predicted = {"zip_requests_per_member": 1.97, "zip_bytes_per_member": 190_000, "mean_file_bytes": 107_000}
    figures = ch07.penalty_figures(rates, dict(zip(layouts, (500, 1400, 2800, 7000))), (7.5, 7, 8), "all caches",
                                   predicted)
    assert bare(figures["cold_ranking"]) == ("against the folder, the zip through ZipFile: 1.5 times slower; the zip with "
                                       "pread: no clear difference; tar shards: 2.7 times faster")
    assert bare(figures["zip_reader_lesson"]).startswith("PreadZipDataset against ZipDataset, the same archive: 2.0 times faster")
    assert "the folder 80%" in figures["prediction_shares"]
    cold_less = {key: value for key, value in rates.items() if key[0] == "network model"}
    figures = ch07.penalty_figures(cold_less, dict(zip(layouts, (500, 1400, 2800, 7000))), (7.5, 7, 8), None, predicted)
    assert figures["cold_ranking"].startswith("cold reads were not measured")


def _penalty(predicted: dict) -> dict:
    """A small_file_penalty result for two workers, 100 folder files and 300 of the rest, 2 shards of 150."""
    return {"workers": 2, "predicted_files_per_s": predicted,
            "prediction": {"images": 300, "folder_s_per_file": 0.0027, "zip_s_per_member": 0.0014,
                           "zip_pread_s_per_member": 0.0007, "tar_s_all_shards": 0.09, "zip_requests_per_member": 2.0,
                           "shards": 2, "tar_requests": 32},
            "files_read_modelled": {"folder": 100, "zip": 300, "zip_pread": 300, "tar": 300},
            "busiest_reader_files": {"folder": 64, "zip": 172, "zip_pread": 172, "tar": 150}}


def test_the_closest_layout_to_its_prediction_is_computed_not_assumed():
    layouts = ("folder", "zip", "zip_pread", "tar")
    predicted = dict(zip(layouts, (740, 1400, 2800, 6600)))
    # The zip comes closest (33 %), the folder (32 %) not clearly behind it: the chapter once said the folder did.
    rates = {("network model", layout): runs(rate) for layout, rate in zip(layouts, (237, 462, 784, 990))}
    closest = ch07.closest_figures(rates, predicted)
    assert closest["closest_sentence"] == ("As measured, the zip through ZipFile came closest to its prediction (33%), "
                                           "not clearly closer than the folder (32%; the ratio of the two shares "
                                           "1.03x, 1.01–1.06x, under the 5 % the rule asks); tar shards fell "
                                           "furthest short (15%).")
    assert closest["model_error"].startswith("Every layout reached between 15% and 33% of its waiting-only prediction")
    figures = ch07.model_error_figures(rates, _penalty(predicted), {0.0005: 0.0001, 0.002: 0.0001}, runs(0.25))
    # Refined: start 0.25 s + 64 files x (2.7 ms + 2 sleeps x 0.1 ms) = 0.4356 s for 100 files.
    assert "the folder 230 files/s, of which it reached 103%" in figures["refined_shares"]
    assert figures["busiest_text"].startswith("64 of 100 for the folder, 172 of 300 for the zip through ZipFile")
    assert figures["sleep_extra_text"] == "a 0.5 ms sleep took 0.60 ms, a 2 ms sleep took 2.10 ms"
    assert figures["folder_read_text"] == "0.42 s"
    clearly = {("network model", layout): runs(rate) for layout, rate in zip(layouts, (600, 462, 784, 990))}
    sentence = ch07.closest_figures(clearly, predicted)["closest_sentence"]
    assert sentence.startswith("As measured, the folder came closest to its prediction (81%), clearly closer than")


def test_the_model_error_remainder_follows_the_refined_estimate():
    layouts = ("folder", "zip", "zip_pread", "tar")
    predicted = dict(zip(layouts, (740, 1400, 2800, 6600)))
    fast_start = runs(0.01)
    slow = {("network model", layout): runs(rate) for layout, rate in zip(layouts, (100, 200, 300, 400))}
    text = ch07.model_error_figures(slow, _penalty(predicted), {0.0005: 0.0}, fast_start)["remainder_text"]
    assert "of this estimate. What keeps them short of it is what the model still leaves out" in text  # all four
    near = {("network model", layout): runs(rate) for layout, rate in zip(layouts, (230, 462, 784, 990))}
    text = ch07.model_error_figures(near, _penalty(predicted), {0.0005: 0.0001}, runs(0.25))["remainder_text"]
    # The folder, the pread zip and the tar shards reach 98-101 % of the refined estimate, the zip 81 %.
    assert text == ("The measured rates reached between 81% and 101% of this estimate. What keeps the zip through "
                    "ZipFile short of it is what the model still leaves out and this section does not measure "
                    "apart: the CPU work "
                    "of each read (opening, parsing, collating, passing batches between processes), which the warm "
                    "column shows without any waiting.")
    exact = {("network model", layout): runs(rate) for layout, rate in zip(layouts, (230, 571, 774, 1011))}
    text = ch07.model_error_figures(exact, _penalty(predicted), {0.0005: 0.0001}, runs(0.25))["remainder_text"]
    assert "These three account for nearly all of the gap" in text and "short of it" not in text
    above = {("network model", layout): runs(rate) for layout, rate in zip(layouts, (300, 571, 774, 1011))}
    text = ch07.model_error_figures(above, _penalty(predicted), {0.0005: 0.0001}, runs(0.25))["remainder_text"]
    assert "Above it (the folder), the estimate overcharged" in text


def test_chapter_12_sentences_follow_each_verdict():
    from packlab.course.narration import ch12

    verdicts = {"as written": {"mixing": 0.9, "mixes_like_a_permutation": False},
                "ours": {"mixing": 0.5, "mixes_like_a_permutation": False, "times": 4.2},
                "MDS py1e": {"mixing": 0.12, "mixes_like_a_permutation": True, "times": 1.0},
                "random permutation": {"mixing": 0.12, "band_top": 0.14, "band_level": 0.98,
                                       "mixes_like_a_permutation": True, "times": 1.0}}
    assert ch12.mixing_summary(verdicts) == ("mixed like a random permutation: MDS py1e; not mixed: ours (0.50, "
                                             "above the band's 0.14; 4.20 times a permutation's median distance)")
    assert [r["verdict"] for r in ch12.mixing_rows(verdicts)] == [
        "the class-sorted order itself", "not mixed", "mixed like a random permutation",
        "98 % of permutations at most 0.14"]
    # B9 of the 29 Nov review: an order just above the band's top must not print the top's own number
    verdicts["ours"] = {"mixing": 0.1304, "mixes_like_a_permutation": False, "times": 1.09}
    verdicts["random permutation"]["band_top"] = 0.1296
    rows = {r["order"]: r for r in ch12.mixing_rows(verdicts)}
    assert rows["ours"]["mixing distance"] == "0.1304" and rows["random permutation"]["verdict"].endswith("0.1296")
    tried = [{"label": "fits", "ok": True, "needed_mb": 60, "shm_mb": 67},
             {"label": "too big", "ok": False, "needed_mb": 250, "shm_mb": 67}]
    assert ch12.shm_verdicts(tried) == "the estimate agreed with the outcome in all 2 configurations"
    assert "disagreed" in ch12.shm_verdicts([{**tried[0], "ok": False}])
    findings = {"torch global": {"resumed": False}, "per sample": {"resumed": True}}
    assert ch12.resume_sources(findings) == "only 'per sample' kept the uninterrupted run's crops after the resume; " \
                                            "'torch global' did not"
    assert ch12.megabytes(2.5e6) == "2.5 MB" and ch12.megabytes(7.04e9) == "7.0 GB" and ch12.megabytes(110e9) == "110 GB"


def test_the_chapter_7_sweep_says_where_it_stops_and_why():
    per_core = ch07.sweep_plan_text(2, 2, 128, 16, 4, 512, 8_000)
    assert per_core == ("largest count: 2 workers, 4 batches each at least (128 images in batches of 16), "
                        "one worker per core")
    by_time = ch07.sweep_plan_text(8, 16, 512, 16, 4, 512, 1_600)
    assert "8 workers, 4 batches each" in by_time and "rather than at one worker per core (16)" in by_time
    assert "the sweep reads at most 512 images" in by_time and "which make 32 batches" in by_time
    by_data = ch07.sweep_plan_text(5, 16, 320, 16, 4, 512, 350)
    assert "the dataset holds only 350 images from the sweep's start on, which make 21 batches" in by_data


def test_chapter_8_says_why_its_loaders_get_fewer_readers_than_cores():
    assert ch08.readers_text(2, 2, 4, 4) == "2 workers, threads or processes, one per core"
    fewer = ch08.readers_text(4, 16, 4, 4)
    assert fewer.startswith("4 workers, threads or processes, not one per core (16): the images make 4 tar shards "
                            "and 4 batches of 64")
    assert "ShardSplitError" in fewer
    assert ch08.readers_text(1, 1, 4, 4) == "1 worker, thread or process, one per core"


def test_chapter_11_says_how_many_workers_and_why_fewer_than_the_cores():
    from packlab.course.narration import ch11

    assert ch11.worker_count(2, 2, "anything") == "2 workers, one per core"
    words = ch11.worker_count(4, 16, ch11.startup_limit(16))
    assert words.startswith("4 workers, not 16 (an epoch holds 16 batches") and "start-up" in words


def test_chapter_11_says_which_way_py_spy_answered():
    from packlab import profiling
    from packlab.course.narration import ch11

    def seen(how, why=""):
        return profiling.WorkerProfile(how, why, [], 1, 2.0)

    assert "attached to the running job" in ch11.pyspy_sentence(seen(profiling.ATTACHED))
    refused = ch11.pyspy_sentence(seen(profiling.STARTED_UNDER_PYSPY, "Permission Denied"))
    assert "may not attach" in refused and "(Permission Denied)" in refused and "its own child" in refused
    broken = ch11.pyspy_sentence(seen(profiling.SAMPLED_IN_PROCESS, "requires root"))
    assert "cannot run here (requires root)" in broken and "CPU-time timer" in broken

"""Chapter 14's sentences follow the course's verdicts: "clearly" only where bench.compare says so."""

from __future__ import annotations

import numpy as np

from packlab.bench import Spread
from packlab.course.narration import ch14

GLOBAL = Spread.of([97.0, 97.5, 96.8, 97.9, 96.5])
SAME = Spread.of([96.9, 97.6, 96.4, 97.8, 97.0])
WORSE = Spread.of([14.0, 20.0, 9.0, 22.0, 12.0])


def _echo_accuracy() -> dict:
    """Twelve paired seeds: waiting far below, example echo 4 like no echo, batch echo 4 clearly below it."""
    rng = np.random.default_rng(0)
    base = 92 + rng.normal(0, 1.0, 12)
    return {"no echo": base, "waiting, loader 4x too slow": base - 40 + rng.normal(0, 1, 12),
            "example echo 2": base + rng.normal(0, 0.5, 12), "example echo 4": base + rng.normal(0, 0.5, 12),
            "example echo 4, before augmentation": base + rng.normal(0, 0.5, 12),
            "batch echo 4": base - 5 + rng.normal(0, 0.5, 12)}


def test_echo_sentences_follow_the_paired_verdicts_and_print_what_a_null_could_have_seen():
    accuracy = _echo_accuracy()
    figures = ch14.echo_figures(accuracy, loader_rate=500.0, model_rate=2000.0)
    sentence = figures["echo_sentence"]
    assert "4.0 times slower" in sentence
    assert "against the run that waited for its reads: clearly better: +" in sentence
    assert "fast enough for every step: no clear difference: " in sentence and "could have seen" in sentence
    assert "against example echoing at 4: clearly worse: -" in sentence
    assert "no clear difference" in figures["echo_augment_sentence"] and "could have seen" in figures["echo_augment_sentence"]
    assert figures["key_echo"].startswith("Example echoing at 4 trained clearly better than waiting for the loader: +")
    # The key point rests on the clear comparison, never on the null against no echo.
    assert "no clear" not in figures["key_echo"]
    rows = ch14.echo_rows(accuracy, 12000, 500.0, 2000.0, {"no echo": 0.05, "waiting, loader 4x too slow": 0.2, "example echo 2": 0.1,
                                                             "example echo 4": 0.1})
    by_name = {row["setting"]: row for row in rows}
    assert by_name["no echo"]["against no echo"] == "reference"
    assert by_name["waiting, loader 4x too slow"]["images trained"] == "3,000"
    assert by_name["example echo 4"]["loader reads"] == "3,000" and by_name["example echo 4"]["images trained"] == "12,000"
    assert by_name["example echo 4"]["modelled seconds"] == "6.0"  # 3,000 reads at 500/s; 12,000 steps' images at 2,000/s
    assert by_name["no echo"]["modelled seconds"] == "24.0"
    assert by_name["batch echo 4"]["against no echo"].startswith("clearly lower")
    assert by_name["example echo 4"]["against waiting (same reads)"].startswith("clearly higher")
    assert by_name["example echo 2"]["against waiting (same reads)"] == "-"
    assert by_name["example echo 4"]["learning rate"] == "0.1" and by_name["waiting, loader 4x too slow"]["learning rate"] == "0.2"
    assert by_name["batch echo 4"]["learning rate"] == "0.1"  # its factor's tuned rate


def test_the_key_point_says_so_when_echoing_did_not_clearly_beat_waiting():
    accuracy = _echo_accuracy()
    accuracy["example echo 4"] = accuracy["waiting, loader 4x too slow"] + np.random.default_rng(1).normal(0, 0.5, 12)
    figures = ch14.echo_figures(accuracy, loader_rate=500.0, model_rate=2000.0)
    assert figures["key_echo"].startswith("Example echoing at 4 was not clearly better than waiting")


def test_storage_sentences_print_each_null_with_what_it_could_have_seen_and_key_points_rest_on_clear_results():
    rng = np.random.default_rng(2)
    base_small, base_large = 64 + rng.normal(0, 2, 12), 82 + rng.normal(0, 1, 12)
    scales = {"8–100 %": (0.08, 1.0), "50–100 %": (0.5, 1.0)}
    kb = {"originals": 19.3, "stored": 3.9}
    null = {"originals, 8–100 %": base_small, "stored, 8–100 %": base_small + rng.normal(0, 0.5, 12),
            "originals, 50–100 %": base_large, "stored, 50–100 %": base_large + rng.normal(0, 0.3, 12)}
    figures = ch14.storage_figures(null, scales, kb)
    assert "(0.20 of the originals' bytes)" in figures["storage_sentence"]
    assert figures["storage_sentence"].count("no clear difference") == 2
    assert figures["storage_sentence"].count("could have seen") == 2
    assert figures["key_storage"].startswith("No cost of the stored copy was seen at 0.20 of the bytes; these "
                                             "comparisons could have seen about")
    rows = ch14.storage_rows(null, scales, kb, {"8–100 %": 35.2, "50–100 %": 38.7})
    assert [r["crops of"] for r in rows] == ["originals", "stored"] * 2
    assert rows[1]["PSNR of the crops, dB"] == "35.2" and "could have seen" in rows[1]["stored minus originals"]
    costly = dict(null, **{"stored, 8–100 %": base_small - 2 + rng.normal(0, 0.3, 12)})
    figures = ch14.storage_figures(costly, scales, kb)
    assert figures["key_storage"].startswith("At crops of 8–100 %, the stored copy's crops trained a clearly worse model")
    assert "50–100 %" not in figures["key_storage"]  # the null at the other scale is no key point


def test_mix_sentences():
    even = [np.tile([0, 0, 1], 40)] * 3
    random = [np.array([0, 1] * 10 + [0] * 100), np.array([1] * 30 + [0] * 100)]
    mix = ch14.mix_figures({"ours": even, "random": random}, source=1, share=1 / 3, window=30)
    assert "ours 33–33 %" in mix["mix_sentence"] and "with random" in mix["mix_sentence"]
    assert mix["key_mix"].startswith("Ours kept every stretch")
    assert ch14.resume_sentence([1, 2], [3], [1, 2, 3], {"epoch": 0, "delivered": 2}).endswith("sample for sample.")


def test_the_tuning_lines_warn_where_the_best_rate_is_at_the_edge_of_the_grid():
    table = {"no echo": {0.05: 90.0, 0.1: 92.0, 0.2: 93.0}, "example echo 4": {0.05: 91.0, 0.1: 90.0, 0.2: 89.0},
             "example echo 2": {0.05: 90.0, 0.1: 92.0, 0.2: 91.0}}
    chosen = {name: max(by_rate, key=by_rate.get) for name, by_rate in table.items()}
    lines = ch14.rate_lines(table, chosen).splitlines()
    assert lines[0].endswith("chosen 0.2; the largest rate tried won, so a larger one might do better still")
    assert lines[1].endswith("chosen 0.05; the smallest rate tried won, so a smaller one might do better still")
    assert lines[2].endswith("chosen 0.1")

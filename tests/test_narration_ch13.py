"""Chapter 13's sentences follow the paired verdicts: "clearly" only where the interval leaves out 0, and every
null with the smallest difference it could have seen."""

from __future__ import annotations

import numpy as np

from packlab.accuracy.conditions import RECALIBRATED, PlantedEffect
from packlab.course.narration import ch13

RNG = np.random.default_rng(4)
BASE = 90 + RNG.normal(0, 1.0, 12)


def _near(shift: float, noise: float = 0.2) -> np.ndarray:
    return BASE + shift + np.random.default_rng(int(1000 * abs(shift)) + 1).normal(0, noise, 12)


def _planted(found: float, false_clear: float) -> PlantedEffect:
    return PlantedEffect(0.03, 12, 24, 2000, 1.04, found, false_clear, 0.7, 90.0,
                         clean=np.r_[BASE, BASE], repeat=np.r_[_near(0.0), _near(0.0)],
                         flipped=np.r_[_near(-1.0), _near(-1.0)])


def test_the_instrument_sentences_state_its_power_and_its_false_alarms():
    good = ch13.instrument_figures(_planted(0.97, 0.011))
    assert "clearly lower: -1.0 points" in good["planted_sentence"]
    assert "no clear difference" in good["planted_sentence"] and "could have seen" in good["planted_sentence"]
    assert "found that cost in 97 % of the draws (the 80 % asked of it)" in good["power_sentence"]
    assert "Judged 12 seeds at a time" in good["power_sentence"] and "of the 24 seeds" in good["power_sentence"]
    assert "different in 1.1 % (at most the 2 %" in good["power_sentence"]
    weak = ch13.instrument_figures(_planted(0.55, 0.04))
    assert "less than the 80 % asked of it" in weak["power_sentence"]
    assert "more than the 2 %" in weak["power_sentence"]


def _orders(recovered: bool) -> dict:
    sorted_shards = _near(-3.0)
    return {"global permutation": BASE, "global permutation" + RECALIBRATED: BASE + 0.1,
            "shuffled shards, no buffer": _near(0.0), "shuffled shards, no buffer" + RECALIBRATED: _near(0.1),
            "class-sorted shards": sorted_shards,
            "class-sorted shards" + RECALIBRATED: _near(0.0) if recovered else _near(-2.0)}


def test_order_sentences_say_what_cost_accuracy_and_whether_batchnorm_explains_it():
    entropy = {"global permutation": 3.1, "shuffled shards, no buffer": 3.1, "class-sorted shards": 0.4}
    recovered = ch13.order_figures(_orders(True), "global permutation", entropy)
    assert "class-sorted shards trained clearly less accurate models" in recovered["order_sentence"]
    assert "for shuffled shards, no buffer the seeds show no clear difference" in recovered["order_sentence"]
    assert "could have seen" in recovered["order_sentence"]
    assert "no longer fell clearly short" in recovered["norm_sentence"]
    assert recovered["key_order"].startswith("Here class-sorted shards clearly cost accuracy (0.40 bits")
    assert "recomputing BatchNorm's statistics recovered it" in recovered["key_order"]
    kept = ch13.order_figures(_orders(False), "global permutation", entropy)
    assert "still fell clearly short" in kept["norm_sentence"] and "recovered" not in kept["key_order"]
    rows = ch13.order_rows(_orders(True), "global permutation", {
        **{n: {"mixing": 0.1, "mixes_like_a_permutation": True} for n in entropy},
        "random permutation": {"mixing": 0.1, "band_top": 0.13, "mixes_like_a_permutation": True}}, entropy)
    assert [r["order"] for r in rows] == list(entropy)
    assert rows[0]["minus the global permutation, points"] == "reference"
    assert "could have seen" in rows[1]["minus the global permutation, points"]
    assert rows[2]["the same, BN recalibrated"].startswith("+") or rows[2]["the same, BN recalibrated"].startswith("-")
    none = ch13.order_figures({"global permutation": BASE, "shuffled": _near(0.0)}, "global permutation",
                              {"global permutation": 3.1, "shuffled": 3.1})
    assert none["key_order"].startswith("No order here clearly cost accuracy")


def test_mds_rows_say_how_much_of_the_set_the_window_covers():
    rows = ch13.mds_rows({"one node": {"num_canonical_nodes": 1, "shuffle_block_size": 4_000_000},
                          "scaled": {"num_canonical_nodes": 1, "shuffle_block_size": 409}}, 2000)
    assert rows[0]["window over this set"] == "all of it" and rows[1]["window over this set"] == "20%"

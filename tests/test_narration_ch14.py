"""Chapter 14's sentences follow the course's verdicts: "clearly" only where bench.compare says so."""

from __future__ import annotations

import numpy as np

from packlab.accuracy.training import RunResult
from packlab.bench import Spread
from packlab.course.narration import ch14

GLOBAL = Spread.of([97.0, 97.5, 96.8, 97.9, 96.5])
SAME = Spread.of([96.9, 97.6, 96.4, 97.8, 97.0])
WORSE = Spread.of([14.0, 20.0, 9.0, 22.0, 12.0])


def _run(final: float, curve: list[tuple[int, int, float]]) -> RunResult:
    return RunResult(final, curve)


def test_echo_sentences_follow_the_verdict_on_time():
    slow = [_run(0.9, [(10, 640, 0.5), (20, 1280, 0.8), (30, 1920, 0.9)]) for _ in range(5)]
    fast = [_run(0.95, [(10, 320, 0.6), (20, 640, 0.86), (30, 960, 0.95)]) for _ in range(5)]
    never = [_run(0.5, [(10, 320, 0.4), (20, 640, 0.5)]) for _ in range(5)]
    runs = {"no echo": slow, "example echo 2": fast, "batch echo 4": never}
    target = 0.85
    figures = ch14.echo_figures(runs, target, loader_rate=100.0, model_rate=2000.0)
    assert "example echo 2 reached 85 % clearly sooner" in figures["echo_sentence"]
    assert "batch echo 4 clearly later" in figures["echo_sentence"]
    assert "3.00 times fewer" in figures["echo_fresh_sentence"]
    rows = ch14.echo_rows(runs, target, 100.0, 2000.0)
    assert rows[2]["modelled seconds to it"].startswith("not reached")
    assert ch14.echo_target(slow) == 0.85


def test_storage_and_mix_sentences():
    from packlab.accuracy.pixels import SmallImages

    images = SmallImages(np.zeros((4, 8, 8, 3), np.uint8), np.zeros(4, np.int64), list("abcd"))
    noisy = SmallImages(np.full((4, 8, 8, 3), 3, np.uint8), np.zeros(4, np.int64), list("abcd"))
    stored = {"originals": (images, 100.0), "q90": (noisy, 20.0), "q10": (noisy, 5.0)}
    figures = ch14.storage_figures(stored, {"originals": GLOBAL, "q90": SAME, "q10": WORSE}, "originals")
    assert "q90 trained no clearly different model" in figures["storage_sentence"]
    assert "q10 trained a clearly worse one" in figures["storage_sentence"]
    assert figures["key_storage"] == "Q10 cost accuracy clearly."
    even = [np.tile([0, 0, 1], 40)] * 3
    random = [np.array([0, 1] * 10 + [0] * 100), np.array([1] * 30 + [0] * 100)]
    mix = ch14.mix_figures({"ours": even, "random": random}, source=1, share=1 / 3, window=30)
    assert "ours 33–33 %" in mix["mix_sentence"] and "with random" in mix["mix_sentence"]
    assert mix["key_mix"].startswith("Ours kept every stretch")
    assert ch14.resume_sentence([1, 2], [3], [1, 2, 3], {"epoch": 0, "delivered": 2}).endswith("sample for sample.")

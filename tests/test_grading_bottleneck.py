"""Exercise 6's check can fail: each way of mis-measuring a bottleneck fails the part that names it.

``find_bottleneck`` is easy to get wrong while it still prints plausible numbers. Each
wrong version below breaks one promise of the exercise's text (the start-up counted, or
the first batch's images; no warm-up, or one batch of it; threads hard-coded, taken from
the machine, not restored, or set for one measurement only; the consumer timed while
loading; "together" computed, or read without training; runs that do not take turns or
ignore ``repeats``; a verdict from medians, ranges or a ratio instead of
``packlab.bench.compare``) and must fail the part of the check that names it, while the
parts it gets right still pass. ``test_the_mistakes_are_real`` shows each mistake on a
plain fake loader, outside the grader. Correct versions written differently from the
solution must pass every part; the solution notebook's version gets full marks and the
untouched stub none (``tests/test_exercises.py``).

The fakes sleep; the wrong versions run with every sleep halved
(:data:`packlab.course.grading.bottleneck.TIME_SCALE`), which keeps each mistake as
plain to see and the suite shorter. The correct ones run at the check's own scale, and
alone (``serial``): a grader that fails a right measurement is the worse defect.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from packlab.bench import Spread, chance_of_split, compare, interleaved, torch_threads, verdict
from packlab.course.grading import bottleneck, check, list_checks

from grading_support import failed_parts as run_check

PARTS = ("consumer_alone", "together", "startup", "warm", "threads", "turns", "decides", "verdict")


def failed_parts(candidate, scale=1.0, monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.setattr(bottleneck, "TIME_SCALE", scale)
    return run_check("bottleneck", candidate)


# --------------------------------------------------------- one measurement, with switchable mistakes


def images(batch) -> int:
    return len(batch[0])


def measure(loader, consume, repeats=6, threads=1, *, startup_in_rate=(), count_first=False, warm_up="epoch",
            set_threads="both", restore="previous", consumer_while_loading=False, together="measured",
            turns=True, fixed_repeats=None, rule="compare"):
    """A find_bottleneck that makes the mistakes switched on, and no others."""

    def epoch(train):
        # The mistake startup_in_rate: the clock runs through the start-up (for the runs named).
        start = time.perf_counter() if ("together" if train else "loader") in startup_in_rate else None
        count = 0
        for batch in loader:
            if start is None:
                start = time.perf_counter()
                count += images(batch) if count_first else 0
            else:
                count += images(batch)
            if train:
                with torch_threads(threads) if set_threads == "together only" else _nothing():
                    consume(batch)
        return count / (time.perf_counter() - start)

    batches = []

    def consumer_alone():
        with torch_threads(threads) if set_threads == "alone only" else _nothing():
            if consumer_while_loading:
                start, count = time.perf_counter(), 0
                for batch in loader:
                    consume(batch)
                    count += images(batch)
                return count / (time.perf_counter() - start)
            start = time.perf_counter()
            for batch in batches:
                consume(batch)
            return sum(map(images, batches)) / (time.perf_counter() - start)

    def loader_alone():
        if warm_up == "none" and not batches:  # collects the consumer's batches while timing the (cold) first pass
            start, count = None, 0
            for batch in loader:
                batches.append(batch)
                if start is None:
                    start = time.perf_counter()
                else:
                    count += images(batch)
            return count / (time.perf_counter() - start)
        return epoch(train=False)

    if warm_up == "epoch":
        batches.extend(loader)
    elif warm_up == "one batch":
        batches.append(next(iter(loader)))  # the consumer's batches: the first one, over and over
        batches *= len(loader)
    runs = {"loader": loader_alone, "consumer": consumer_alone}
    if together == "measured":
        runs["together"] = lambda: epoch(train=True)
    elif together == "without training":
        runs["together"] = lambda: epoch(train=False)
    previous = torch.get_num_threads()
    if set_threads in ("both", "cores", "one"):
        torch.set_num_threads({"both": threads, "cores": os.cpu_count(), "one": 1}[set_threads])
    rounds = fixed_repeats or repeats
    try:
        if turns:
            # Without a warm-up the first loader run collects the consumer's batches, so it must come first.
            result = interleaved(runs, rounds, order="fixed" if warm_up == "none" else "balanced")
        else:
            result = {name: Spread(tuple(run() for _ in range(rounds))) for name, run in runs.items()}
    finally:
        torch.set_num_threads({"previous": previous, "one": 1}.get(restore, torch.get_num_threads()))
    if together == "computed":  # the two together computed from the parts instead of measured
        pairs = zip(result["loader"].values, result["consumer"].values)
        result["together"] = Spread(tuple(1 / (1 / a + 1 / b) for a, b in pairs))
    loader_rates, consumer_rates = result["loader"], result["consumer"]
    if rule == "compare":
        result["bottleneck"] = verdict(loader_rates, consumer_rates, "consumer", "loader", "unclear")
    elif rule == "swapped":
        result["bottleneck"] = verdict(loader_rates, consumer_rates, "loader", "consumer", "unclear")
    elif rule == "medians":
        result["bottleneck"] = "consumer" if loader_rates.median > consumer_rates.median else "loader"
    elif rule == "ranges":
        result["bottleneck"] = ("unclear" if loader_rates.overlaps(consumer_rates) else
                                "consumer" if loader_rates.median > consumer_rates.median else "loader")
    elif rule == "ratio":
        ratio = loader_rates.median / consumer_rates.median
        result["bottleneck"] = "consumer" if ratio >= 1.05 else "loader" if ratio <= 1 / 1.05 else "unclear"
    return result


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


def variant(name, **mistakes):
    def find_bottleneck(loader, consume, repeats=6, threads=1):
        return measure(loader, consume, repeats, threads, **mistakes)

    find_bottleneck.__name__ = name
    return find_bottleneck


WRONG = {
    # name: (mistakes, the parts that must fail: the one named first, then those that follow from it)
    "clock_started_before_the_first_batch": (dict(startup_in_rate=("loader", "together")), {"startup"}),
    "together_timed_through_the_start_up": (dict(startup_in_rate=("together",)), {"startup"}),
    "first_batch_counted": (dict(count_first=True), {"startup"}),
    "first_pass_timed_cold": (dict(warm_up="none"), {"warm"}),
    "one_batch_of_warm_up": (dict(warm_up="one batch"), {"warm"}),
    "torch_threads_left_alone": (dict(set_threads="none"), {"threads"}),
    "one_thread_whatever_asked": (dict(set_threads="one"), {"threads"}),
    "threads_from_the_cores": (dict(set_threads="cores"), {"threads"}),
    "threads_not_restored": (dict(restore="none"), {"threads"}),
    "threads_restored_to_one": (dict(restore="one"), {"threads"}),
    "threads_for_the_consumer_alone_only": (dict(set_threads="alone only"), {"threads"}),
    # A consumer timed while loading looks as slow as the loader, so the verdict goes wrong too.
    "consumer_timed_while_loading": (dict(consumer_while_loading=True), {"consumer_alone", "decides"}),
    "together_computed_not_measured": (dict(together="computed"), {"together"}),
    "together_without_training": (dict(together="without training"), {"together"}),
    "all_loader_runs_first": (dict(turns=False), {"turns"}),
    "six_runs_whatever_asked": (dict(fixed_repeats=6), {"turns"}),
    "verdict_from_medians": (dict(rule="medians"), {"verdict"}),
    "verdict_from_ranges": (dict(rule="ranges"), {"verdict"}),
    "verdict_from_the_ratio_alone": (dict(rule="ratio"), {"verdict"}),
    "verdict_the_wrong_way_round": (dict(rule="swapped"), {"decides", "verdict"}),
}


# Serial: each variant is judged on what sleeping fakes measured, and the test asks for exactly the
# named parts; on a machine crowded by parallel tests a scenario's intended gap can shrink or a
# start-up stretch, which fails a neighbouring part too.
@pytest.mark.serial
@pytest.mark.parametrize("name", WRONG)
def test_each_mistake_fails_the_part_that_names_it(name, monkeypatch):
    mistakes, parts = WRONG[name]
    # A wrong verdict rule shows only in the scenarios whose runs are close or split evenly; at half the
    # check's own sleep lengths, timer noise once split them clearly (the ratio rule passed), so these
    # run at the check's full length.
    scale = 1.0 if "rule" in mistakes else 0.5
    assert failed_parts(variant(name, **mistakes), scale=scale, monkeypatch=monkeypatch) == parts


def test_the_check_lists_its_parts():
    (info,) = [i for i in list_checks() if i.id == "bottleneck"]
    assert info.notebook == "06_bottleneck" and info.parts == PARTS


# ------------------------------------------------------- evidence outside the grader


class PlainLoader:
    """A loader outside the grader: ``startup`` s before each epoch, ``per_batch`` s per batch (x8 the first time)."""

    def __init__(self, per_batch=0.004, batches=4, startup=0.0, cold=1.0):
        self.per_batch, self.batches, self.startup, self.cold = per_batch, batches, startup, cold
        self.seen = set()

    def __len__(self):
        return self.batches

    def __iter__(self):
        time.sleep(self.startup)
        for index in range(self.batches):
            time.sleep(self.per_batch * (self.cold if index not in self.seen else 1.0))
            self.seen.add(index)
            yield torch.zeros(32, 1), torch.zeros(32)


@pytest.mark.serial  # rates of a fake that sleeps 2-4 ms per batch: a crowded machine stretches the sleeps
def test_the_mistakes_are_real():
    """What each mistake does to the numbers, on a plain loader and consumer outside the grader."""
    steady = 32 / 0.004  # the plain loader's images/s once its first batch is there
    threads_seen = []

    def consume(batch):
        threads_seen.append(torch.get_num_threads())
        time.sleep(0.002)

    def loader_rate(**mistakes):
        return measure(PlainLoader(startup=0.05), consume, 5, 3, **mistakes)["loader"].median

    assert loader_rate() <= 1.05 * steady
    assert loader_rate(startup_in_rate=("loader",)) < 0.5 * steady
    assert loader_rate(count_first=True) > 1.2 * steady  # 4 batches' images over the time of 3
    cold = PlainLoader(cold=8.0)
    # Whichever run comes first after one warm batch reads the rest cold: the loader alone (steady 8,000
    # images/s) or the two together (steady 5,333, cold about 940); both stay above 4,000 when warm.
    cold_result = measure(cold, consume, 5, 3, warm_up="one batch")
    assert min(cold_result["loader"].low, cold_result["together"].low) < 0.5 * steady
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(5)
        for mistakes, seen, after in ((dict(set_threads="one"), {1}, 5), (dict(set_threads="cores"), {os.cpu_count()}, 5),
                                      (dict(restore="none"), {3}, 3), (dict(restore="one"), {3}, 1)):
            threads_seen.clear()
            measure(PlainLoader(), consume, 5, 3, **mistakes)
            assert set(threads_seen) == seen and torch.get_num_threads() == after, mistakes
            torch.set_num_threads(5)
    finally:
        torch.set_num_threads(before)
    # Medians 3 % apart in every run: consistent, and below compare's 5 % minimum.
    a, b = Spread.of([100, 101, 100.5, 100.2, 100.8, 100.4]), Spread.of([103, 104, 103.5, 103.2, 103.8, 103.4])
    assert compare(a, b) == 0 and not a.overlaps(b) and a.median < b.median
    # Alternating runs around a steady one: medians 8 % apart, runs split evenly.
    a, b = Spread.of([100, 150] * 3), Spread.of([115.4] * 6)
    assert compare(a, b) == 0 and a.median / b.median > 1.05 and chance_of_split(a.values, b.values) == 1.0


# ------------------------------------------------------------------- correct, written differently


def find_bottleneck_by_hand(loader, consume, repeats=6, threads=1):
    """Correct: explicit loops, its own turn order (consumer, together, loader), compare() mapped by hand."""
    kept = [batch for batch in loader]  # the untimed first pass

    def steady(train):
        iterator = iter(loader)
        first = next(iterator)
        began = time.monotonic()
        if train:
            consume(first)
        count = 0
        for batch in iterator:
            count += len(batch[0])
            if train:
                consume(batch)
        return count / (time.monotonic() - began)

    def consumer_only():
        began = time.monotonic()
        for batch in kept:
            consume(batch)
        return sum(len(b[0]) for b in kept) / (time.monotonic() - began)

    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    rates = {"consumer": [], "together": [], "loader": []}
    try:
        for _ in range(repeats):
            rates["consumer"].append(consumer_only())
            rates["together"].append(steady(train=True))
            rates["loader"].append(steady(train=False))
    finally:
        torch.set_num_threads(saved)
    spreads = {name: Spread.of(values) for name, values in rates.items()}
    answer = {1: "consumer", -1: "loader", 0: "unclear"}[compare(spreads["loader"], spreads["consumer"])]
    return {**spreads, "bottleneck": answer}


def find_bottleneck_with_a_context_manager(loader, consume, repeats=6, threads=1):
    """Correct: threads set only around the training runs (packlab.bench.torch_threads), per-batch intervals summed."""
    warm = list(loader)
    samples = {"loader": [], "consumer": [], "together": []}

    def timed_epoch(train):
        seconds, seen, last = 0.0, 0, None
        for batch in loader:
            now = time.perf_counter()
            if last is not None:
                seconds += now - last
                seen += len(batch[0])
            if train:
                consume(batch)
            last = time.perf_counter() if not train else last
            if train:
                seconds += time.perf_counter() - now
                last = time.perf_counter()
        return seen / seconds

    for _ in range(repeats):
        samples["loader"].append(timed_epoch(train=False))
        with torch_threads(threads):
            start = time.perf_counter()
            for batch in warm:
                consume(batch)
            samples["consumer"].append(sum(len(b[0]) for b in warm) / (time.perf_counter() - start))
            samples["together"].append(timed_epoch(train=True))
    spreads = {name: Spread(tuple(values)) for name, values in samples.items()}
    spreads["bottleneck"] = verdict(spreads["loader"], spreads["consumer"], more="consumer", less="loader", same="unclear")
    return spreads


def find_bottleneck_with_its_own_test(loader, consume, repeats=6, threads=1):
    """Correct: compare's rule spelled out (the rank test's chance at most 2 %, medians 5 % apart), timing by time.time."""
    batches = list(loader)
    previous = torch.get_num_threads()

    def through_loader(train):
        begun, counted = None, 0
        for batch in loader:
            if begun is not None:
                counted += len(batch[0])
            else:
                begun = time.time()
            if train:
                consume(batch)
        return counted / (time.time() - begun)

    def from_memory():
        begun = time.time()
        for batch in batches:
            consume(batch)
        return len(batches) * len(batches[0][0]) / (time.time() - begun)

    try:
        torch.set_num_threads(threads)
        spreads = interleaved({"together": lambda: through_loader(True), "loader": lambda: through_loader(False),
                               "consumer": from_memory}, repeats)
    finally:
        torch.set_num_threads(previous)
    loader_rates, consumer_rates = spreads["loader"], spreads["consumer"]
    ratio = loader_rates.median / consumer_rates.median
    clear = chance_of_split(loader_rates.values, consumer_rates.values) <= 0.02 and max(ratio, 1 / ratio) >= 1.05
    spreads["bottleneck"] = "unclear" if not clear else "consumer" if ratio > 1 else "loader"
    return spreads


@pytest.mark.serial  # a right measurement must pass at the check's own pace, with nothing competing
@pytest.mark.parametrize("candidate", [find_bottleneck_by_hand, find_bottleneck_with_a_context_manager,
                                       find_bottleneck_with_its_own_test], ids=lambda f: f.__name__)
def test_correct_alternatives_pass_every_part(candidate):
    assert failed_parts(candidate) == set()


# ------------------------------------------------- noise that blurs a scenario is measured away


def first_hiccup_blurred(rule):
    """A find_bottleneck whose first run of the 'hiccup' scenario came out as a busy machine can make it:
    the consumer's slow run no longer among the loader's, so whether the ranges overlap agrees with
    compare there. Every other run is measured (at half the sleeps); in the hiccup scenario the verdict
    follows ``rule``, elsewhere compare (the close scenario can catch the ranges rule too, by chance)."""
    hiccups = []  # in the check's child process, where the parts run

    def find_bottleneck(loader, consume, repeats=6, threads=1):
        hiccup = len(loader.alone_factors) == 6  # the hiccup scenario: six loader speeds
        result = measure(loader, consume, repeats, threads, rule=rule if hiccup else "compare")
        if hiccup:
            hiccups.append(result)
            if len(hiccups) == 1:
                loader_rates = Spread.of([4796, 4634, 4071, 4187, 3998, 4688])  # measured so, under load
                consumer_rates = Spread.of([6713, 6770, 4812, 5881, 6770, 6810])
                result = {**result, "loader": loader_rates, "consumer": consumer_rates,
                          "bottleneck": verdict(loader_rates, consumer_rates, "consumer", "loader", "unclear")}
        return result

    return find_bottleneck


@pytest.mark.serial
def test_a_scenario_blurred_by_noise_is_measured_again(monkeypatch):
    """On blurred runs the ranges rule agrees with compare; the check measures the scenario again and sees it."""
    blurred_loader, blurred_consumer = Spread.of([4796, 4634, 4071, 4187, 3998, 4688]), Spread.of([6713, 6770, 4812, 5881, 6770, 6810])
    assert not blurred_loader.overlaps(blurred_consumer) and compare(blurred_loader, blurred_consumer) == -1
    assert bottleneck._rules_told_apart(blurred_loader, blurred_consumer) == set()

    monkeypatch.setattr(bottleneck, "TIME_SCALE", 0.5)
    (wrong,) = check("bottleneck", first_hiccup_blurred("ranges"), parts=["verdict"], quiet=True, record=False).parts
    # Failed on the fresh measurement (the ranges touch there: 'unclear'), not on the blurred one.
    assert not wrong.passed and "said 'unclear'" in wrong.message and "4796" not in wrong.message, wrong.message

    (right,) = check("bottleneck", first_hiccup_blurred("compare"), parts=["verdict"], quiet=True, record=False).parts
    assert right.passed and "measured again" in right.message, right.message


# ------------------------------------------- a run stalled by a busy machine is measured again


def first_cold_run_stalled(warm_up):
    """A find_bottleneck whose first run of the 'cold' scenario had one loader run stalled, as a busy machine
    can stall a run of a few dozen milliseconds (about a tenth of the warm rate, as slow as a cold read);
    every other run is measured, warmed up as ``warm_up`` says."""
    cold_runs = []

    def find_bottleneck(loader, consume, repeats=6, threads=1):
        result = measure(loader, consume, repeats, threads, warm_up=warm_up)
        if loader.cold_factor > 1:  # the cold scenario
            cold_runs.append(result)
            if len(cold_runs) == 1:
                stalled = sorted(result["loader"].values)
                stalled[0] = stalled[0] * 0.1
                result = {**result, "loader": Spread.of(stalled)}
        return result

    return find_bottleneck


@pytest.mark.serial
def test_a_run_stalled_by_a_busy_machine_is_measured_again_and_a_missing_warm_up_still_fails(monkeypatch):
    monkeypatch.setattr(bottleneck, "TIME_SCALE", 0.5)
    (right,) = check("bottleneck", first_cold_run_stalled("epoch"), parts=["warm"], quiet=True, record=False).parts
    assert right.passed and "second run" in right.message, right.message
    (wrong,) = check("bottleneck", first_cold_run_stalled("none"), parts=["warm"], quiet=True, record=False).parts
    assert not wrong.passed and "for the first time" in wrong.message, wrong.message


# ------------------------------------------------------- Part C: the answer cell


def _spread(*values):
    from packlab.bench import Spread

    return Spread.of(list(values))


def _measured():
    """Two runs as Part B records them: a slow loader with no workers, a clearly slower model with two."""
    slow_loader = {"loader": _spread(100, 101, 99, 102, 98, 100), "consumer": _spread(300, 305, 298, 301, 299, 302)}
    slow_model = {"loader": _spread(600, 610, 590, 605, 595, 600), "consumer": _spread(300, 305, 298, 301, 299, 302)}
    return {0: slow_loader, 2: slow_model}


WHY = "Without workers the loader decodes on one core; with two workers the model is the slower side."


def _answer_parts(answer) -> dict[str, bool]:
    result = check("bottleneck_answer", answer, quiet=True, record=False)
    return {part.name: part.passed for part in result.parts}


@pytest.mark.parametrize("wrong, failing", [
    (lambda m: {"measured": m, "pace": {0: "loader", 2: "loader"}, "why": WHY}, {"pace_follows_your_runs"}),
    (lambda m: {"measured": m, "pace": {0: "consumer", 2: "loader"}, "why": WHY}, {"pace_follows_your_runs"}),
    (lambda m: {"measured": m, "pace": {0: "loader"}, "why": WHY}, {"pace_answered", "pace_follows_your_runs"}),
    (lambda m: {"measured": m, "pace": {0: "the loader", 2: "GPU"}, "why": WHY}, {"pace_answered", "pace_follows_your_runs"}),
    (lambda m: {"measured": m, "pace": {0: "loader", 2: "consumer"}, "why": "loader"}, {"why"}),
    (lambda m: {"measured": m, "pace": {0: "loader", 2: "consumer"}, "why": "it was slow because it was slow there today"}, {"why"}),
])
def test_an_answer_that_does_not_follow_the_runs_fails_the_part_it_breaks(wrong, failing):
    measured = _measured()
    parts = _answer_parts(lambda: wrong(measured))
    assert {name for name, passed in parts.items() if not passed} == failing, parts


def test_the_answer_that_reads_the_runs_passes_and_the_stub_is_not_started():
    measured = _measured()
    assert all(_answer_parts(lambda: {"measured": measured, "pace": {0: "loader", 2: "consumer"}, "why": WHY}).values())

    def stub():
        raise NotImplementedError("your code here")

    result = check("bottleneck_answer", stub, quiet=True, record=False)
    assert not result.passed and all(part.not_started for part in result.parts)

"""Exercise 6's check can fail: each way of mis-measuring a bottleneck fails the part that names it.

``find_bottleneck`` is easy to get wrong while it still prints plausible numbers. Each
wrong version below makes one of the mistakes the exercise warns about, and must fail
the part of the check that names it while the parts it gets right still pass. Two
correct versions written differently from the solution must pass every part, the
solution notebook's version gets full marks and the untouched stub none.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from packlab import paths
from packlab.course import grade
from packlab.bench import Spread, interleaved, verdict
from packlab.course.grading import check, list_checks

ROOT = paths.repo_root()
PARTS = ("consumer_alone", "together", "startup", "warm", "threads", "decides", "no_clear_difference")


def run(candidate):
    return check("bottleneck", candidate, quiet=True, record=False)


def failed_parts(result) -> set[str]:
    return {part.name for part in result.parts if not part.passed}


def notebook_function(path):
    """``find_bottleneck`` as the notebook at ``path`` defines it, executed like a kernel would."""
    import linecache

    notebook = grade.read_notebook(path)
    namespace = {"__name__": "__main__"}
    for index, source in enumerate(grade.definition_cells(notebook, {"find_bottleneck"})):
        filename = f"<{path.stem} cell {index}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), namespace)
    return namespace["find_bottleneck"]


# --------------------------------------------------------- one measurement, with switchable mistakes


def images(batch) -> int:
    return len(batch[0])


def measure(loader, consume, repeats=3, threads=1, *, startup_in_rate=False, warm_up=True, set_threads=True,
            consumer_while_loading=False, measure_together=True, turns=True, overlap_rule=True):
    """A find_bottleneck that makes the mistakes switched on, and no others."""

    def epoch(train):
        start = time.perf_counter() if startup_in_rate else None  # the mistake: the clock runs through the start-up
        count = 0
        for batch in loader:
            if start is None:
                start = time.perf_counter()
            else:
                count += images(batch)
            if train:
                consume(batch)
        return count / (time.perf_counter() - start)

    batches = []

    def consumer_alone():
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
        if not warm_up and not batches:  # collects the consumer's batches while timing the (cold) first pass
            start, count = None, 0
            for batch in loader:
                batches.append(batch)
                if start is None:
                    start = time.perf_counter()
                else:
                    count += images(batch)
            return count / (time.perf_counter() - start)
        return epoch(train=False)

    if warm_up:
        batches.extend(loader)
    runs = {"loader": loader_alone, "consumer": consumer_alone}
    if measure_together:
        runs["together"] = lambda: epoch(train=True)
    previous = torch.get_num_threads()
    if set_threads:
        torch.set_num_threads(threads)
    try:
        if turns:
            result = interleaved(runs, repeats)
        else:
            result = {name: Spread(tuple(run() for _ in range(repeats))) for name, run in runs.items()}
    finally:
        torch.set_num_threads(previous)
    if not measure_together:  # the two together computed from the parts instead of measured
        pairs = zip(result["loader"].values, result["consumer"].values)
        result["together"] = Spread(tuple(1 / (1 / a + 1 / b) for a, b in pairs))
    if overlap_rule:
        result["bottleneck"] = verdict(result["loader"], result["consumer"], "consumer", "loader", "unclear")
    else:
        result["bottleneck"] = "consumer" if result["loader"].median > result["consumer"].median else "loader"
    return result


def variant(name, **mistakes):
    def find_bottleneck(loader, consume, repeats=3, threads=1):
        return measure(loader, consume, repeats, threads, **mistakes)

    find_bottleneck.__name__ = name
    return find_bottleneck


WRONG = {
    # name: (mistakes, the part that must fail, more parts it may fail as a consequence)
    "clock_started_before_the_first_batch": (dict(startup_in_rate=True), "startup", set()),
    "first_pass_timed_cold": (dict(warm_up=False), "warm", set()),
    "torch_threads_left_alone": (dict(set_threads=False), "threads", set()),
    # A consumer timed while loading looks as slow as the loader, so the verdict goes wrong too.
    "consumer_timed_while_loading": (dict(consumer_while_loading=True), "consumer_alone", {"decides"}),
    "together_computed_not_measured": (dict(measure_together=False), "together", set()),
    "all_loader_runs_first": (dict(turns=False), "no_clear_difference", set()),
    "medians_without_ranges": (dict(overlap_rule=False), "no_clear_difference", set()),
}


@pytest.mark.parametrize("name", WRONG)
def test_each_mistake_fails_the_part_that_names_it(name):
    mistakes, part, consequences = WRONG[name]
    result = run(variant(name, **mistakes))
    failed = failed_parts(result)
    assert part in failed, result.report()
    assert failed <= {part} | consequences, f"{name} should fail only {part}: {result.report()}"


def test_the_check_lists_its_parts():
    (info,) = [i for i in list_checks() if i.id == "bottleneck"]
    assert info.notebook == "06_bottleneck" and info.parts == PARTS


# ------------------------------------------------------------------- correct, written differently


def find_bottleneck_by_hand(loader, consume, repeats=3, threads=1):
    """Correct: explicit loops, its own turn order (consumer, together, loader), ranges compared by hand."""
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
    if max(rates["loader"]) < min(rates["consumer"]):
        verdict = "loader"
    elif min(rates["loader"]) > max(rates["consumer"]):
        verdict = "consumer"
    else:
        verdict = "unclear"
    return {**{name: Spread(tuple(values)) for name, values in rates.items()}, "bottleneck": verdict}


def find_bottleneck_with_statistics(loader, consume, repeats=3, threads=1):
    """Correct: threads set only around the training parts, medians from the statistics module."""
    warm = list(loader)
    samples = {"loader": [], "consumer": [], "together": []}

    def timed_epoch(train):
        clock, seen = None, 0
        for batch in loader:
            if clock is None:
                clock = time.perf_counter()
            else:
                seen += len(batch[0])
            if train:
                consume(batch)
        return seen / (time.perf_counter() - clock)

    for _ in range(repeats):
        samples["loader"].append(timed_epoch(train=False))
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            start = time.perf_counter()
            for batch in warm:
                consume(batch)
            samples["consumer"].append(sum(len(b[0]) for b in warm) / (time.perf_counter() - start))
            samples["together"].append(timed_epoch(train=True))
        finally:
            torch.set_num_threads(before)
    spreads = {name: Spread(tuple(values)) for name, values in samples.items()}
    loader, consumer = statistics.median(samples["loader"]), statistics.median(samples["consumer"])
    if spreads["loader"].overlaps(spreads["consumer"]):
        return {**spreads, "bottleneck": "unclear"}
    return {**spreads, "bottleneck": "loader" if loader < consumer else "consumer"}


@pytest.mark.parametrize("candidate", [find_bottleneck_by_hand, find_bottleneck_with_statistics], ids=lambda f: f.__name__)
def test_correct_alternatives_pass_every_part(candidate):
    result = run(candidate)
    assert result.passed, result.report()


# ------------------------------------------------------------------------- solution and stub


def test_the_solution_gets_full_marks():
    result = run(notebook_function(ROOT / "solutions" / "06_bottleneck.md"))
    assert result.passed and result.score == len(PARTS), result.report()


def test_the_untouched_exercise_gets_nothing():
    result = run(notebook_function(ROOT / "exercises" / "06_bottleneck.md"))
    assert result.score == 0, result.report()
    assert all("NotImplementedError" in part.message for part in result.parts), result.report()

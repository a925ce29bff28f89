"""The ceilings: over the loader's epoch, warmed up like a loader's workers, and one ratio for chapter 11 and make bench."""

from __future__ import annotations

import pytest

from packlab import ceiling, crops, data, pack
from packlab.bench import Spread
from packlab.course.benchmark import training


@pytest.fixture(scope="module")
def shards(small_root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ceiling-shards")
    return [str(p) for p in pack.write_tar_shards(folder, root=small_root, maxcount=16, shuffle=False, progress=False)]


def test_shard_items_is_the_loaders_epoch_unless_limited(shards, small_root):
    everything = ceiling.shard_items(shards)
    assert [key for _, key in everything] == [s.key for s in data.load_manifest(small_root)]
    assert len(ceiling.shard_items(shards, 5)) == 5


def test_each_ceiling_process_does_its_first_item_before_the_clock(monkeypatch):
    calls = []

    def work(item):
        calls.append(item)
        return None

    # One process, run in this one: the barrier and the queue are stand-ins.
    class Barrier:
        def wait(self):
            calls.append("barrier")

    class Results:
        def put(self, value):
            calls.append(value[2])

    ceiling._decode_share([1, 2, 3], Barrier(), Results(), work, None, None, None)
    assert calls == [1, "barrier", 1, 2, 3, 3]


class _WorkClock:
    """A clock that moves only by the work done: each item advances it by the item's value (in the process that
    does it: forked processes each get their own), so the rates do not depend on how busy the machine is."""

    now = 0.0

    @classmethod
    def monotonic(cls):
        return cls.now

    @classmethod
    def work(cls, item):
        cls.now += item


def test_a_parallel_ceiling_is_the_sum_of_its_processes_rates_not_charged_for_the_slowest_ones_tail(monkeypatch):
    # Process 0 takes the 20 ms items (50 a second), process 1 the 10 ms ones (100 a second): 150 a second while both
    # run. All items over the first start to the last finish would say 24 / 0.25 s = 96, and a loader that hands out
    # work as its workers free up would beat that "ceiling".
    monkeypatch.setattr(ceiling, "time", _WorkClock)
    rate = ceiling.measure_parallel_ceiling([0.02, 0.01] * 12, 2, _WorkClock.work)
    assert rate == pytest.approx(150)


def test_a_crop_ceiling_runs_over_every_item_and_gives_a_rate(shards):
    items = ceiling.shard_items(shards)
    rate = ceiling.crop_ceiling(items, 2, crops.crop_fast, channels_last=True)()
    assert rate > 0


def test_make_bench_and_chapter_11_share_one_ratio():
    loader, top = Spread.of([80, 81, 79, 82, 78, 80]), Spread.of([100, 101, 99, 102, 98, 100])
    ratio = ceiling.loader_vs_ceiling(loader, top)
    assert ratio.result == pytest.approx(80 / 102) and ratio.verdict == -1  # the median over the best run
    # make bench's training section has no ceiling code of its own any more: it uses packlab.ceiling's.
    assert not hasattr(training, "crop_ceiling") and not hasattr(training, "shard_items")
    assert training.ratio_text(None) == "no result" and training.ratio_text(0.8) == "0.80"
    above = ceiling.loader_vs_ceiling(Spread.of([120, 121, 119, 122, 118, 120]), top)
    assert above.mis_measured and above.result is None
    assert "the ceiling was mis-measured" in above.words("ours")


def test_a_goal_over_a_mis_measured_ceiling_is_neither_reached_nor_missed():
    top = Spread.of([100, 101, 99, 102, 98, 100])
    above = training.ceiling_goal_verdict(Spread.of([120, 121, 119, 122, 118, 120]), top, 0.8)
    assert above["verdict"] == 0 and not above["reached"] and above["measured"] is None
    assert "mis-measured" in above["words"]
    below = training.ceiling_goal_verdict(Spread.of([90, 91, 89, 92, 88, 90]), top, 0.8)
    assert below["reached"] and below["measured"] == pytest.approx(90 / 102)


def test_a_ratio_to_the_ceiling_prints_its_interval_and_two_measurements_agree_where_the_intervals_overlap():
    top = Spread.of([2800, 2850, 2700, 2880, 2760, 2900])
    chapter = ceiling.loader_vs_ceiling(Spread.of([2150, 2200, 1700, 2230, 2100, 2300]), top)
    bench = ceiling.loader_vs_ceiling(Spread.of([2000, 2150, 2160, 2190, 2210, 2220]), top)
    assert chapter.verdict < 0 and chapter.interval.high < 1 and chapter.share == chapter.result < 1
    assert f"(its runs against the ceiling's: {chapter.interval.range_text()})" in chapter.words("ours")
    assert chapter.agrees_with(bench) and bench.agrees_with(chapter)
    # Half the ceiling, every run: no overlap with three quarters of it, so the two would not agree.
    half = ceiling.loader_vs_ceiling(Spread.of(v / 2 for v in top), top)
    assert not half.agrees_with(chapter) and not chapter.agrees_with(half)
    # A median past the ceiling's best run (2,900) with runs the rank test cannot tell apart: still no ratio.
    noisy = ceiling.loader_vs_ceiling(Spread.of([2950, 2600, 3000, 2750, 2920, 2940]), top)
    assert noisy.verdict == 0 and noisy.result is None and "the ceiling was mis-measured" in noisy.words("ours")


def test_a_loader_doing_exactly_its_ceilings_work_passes_the_ceilings_median_half_the_time_and_its_best_run_rarely():
    from packlab import simulated_runs

    same = simulated_runs.passes_its_ceiling(share=1.0, noise=0.05, rounds=6, trials=600, outliers=1 / 6)
    assert 0.4 < same["median above median"] < 0.6
    assert same["mis-measured"] < 0.1
    lower = simulated_runs.passes_its_ceiling(share=0.9, noise=0.05, rounds=6, trials=600, outliers=1 / 6)
    assert lower["mis-measured"] < 0.01

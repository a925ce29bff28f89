"""packlab.stragglers: per-batch waits, the N-rank simulation, and a real 2-rank run on a tiny fake loader."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from packlab import stragglers as S
from packlab.stragglers import simulate as SIM
from packlab.stragglers import waits as W


def _waits(values, compute_s=0.0, workers=1):
    values = np.asarray(values, dtype=float)
    return S.BatchWaits(values, values + compute_s, np.cumsum(values), compute_s, workers, 0)


def test_percentiles_of_a_known_array():
    w = _waits(np.arange(101) / 1000)  # 0 ms ... 100 ms
    assert w.p50 == pytest.approx(0.050)
    assert w.p90 == pytest.approx(0.090)
    assert w.p99 == pytest.approx(0.099)
    assert w.max == pytest.approx(0.100)
    row = w.row("fake")
    assert row["loader"] == "fake" and row["wait p99 ms"] == 99.0 and row["wait max ms"] == 100.0


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_the_recorder_records_the_time_inside_next(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(W, "_clock", clock)
    monkeypatch.setattr(W, "_sleep", clock.sleep)
    delays = [0.5, 0.5, 0.010, 0.020, 0.030, 0.200]  # the first two are start-up (two workers)

    def loader():
        for d in delays:
            clock.now += d
            yield d

    w = S.record_waits(loader(), steps=4, compute_s=0.1, workers=2)
    assert w.waits == pytest.approx([0.010, 0.020, 0.030, 0.200])
    assert w.steps == pytest.approx([0.110, 0.120, 0.130, 0.300])
    assert w.startup_batches == 2 and len(w.arrivals) == 6
    with pytest.raises(ValueError):
        w.production_times()  # a run with a compute does not measure production


def test_production_times_are_per_worker(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(W, "_clock", clock)
    monkeypatch.setattr(W, "_sleep", clock.sleep)

    def loader():  # two workers, each 0.2 s a batch, delivering alternately every 0.1 s
        while True:
            clock.now += 0.1
            yield None

    w = S.record_waits(loader(), steps=6, compute_s=0.0, workers=2)
    assert w.production_times() == pytest.approx([0.2] * 6)


def test_the_recorder_with_real_sleeps():
    def loader():
        while True:
            time.sleep(0.01)
            yield None

    w = S.record_waits(loader(), steps=5, compute_s=0.0, workers=1)
    assert 0.009 <= w.p50 < 0.1
    assert np.all(w.production_times() >= 0.009)


def test_a_loader_that_runs_out_says_so():
    with pytest.raises(RuntimeError, match="ran out"):
        S.record_waits(iter([1, 2, 3]), steps=5)


def test_constant_production_never_waits_when_the_step_is_long_enough():
    for depth in (1, 2, 8):
        run = S.simulate_sync([0.05], ranks=64, compute_s=0.06, steps=100, depth=depth, workers=1)
        assert np.all(run.steps[:, 1:] == pytest.approx(0.06))  # after the first batch, no rank waits
        trimmed = SIM._trimmed(run, 1)
        assert trimmed.waiting_share == pytest.approx(0.0, abs=1e-9)


def test_with_exponential_times_more_ranks_wait_longer_and_a_deeper_queue_helps():
    production = np.random.default_rng(0).exponential(0.1, 2000)
    means = [S.simulate_sync(production, n, 0.105, steps=400, depth=2).mean_step for n in (1, 8, 64, 512)]
    assert means == sorted(means) and means[-1] > 1.5 * means[0]
    shallow = S.simulate_sync(production, 64, 0.105, steps=400, depth=2)
    deep = S.simulate_sync(production, 64, 0.105, steps=400, depth=8)
    assert deep.waiting_share < shallow.waiting_share - 0.1


def test_one_rank_with_a_queue_of_one_matches_the_closed_form():
    # depth 1: batch k starts when batch k-1 is taken, so each step lasts max(p, c); for p exponential
    # with mean m, E[max(p, c)] = c + m exp(-c/m).
    m, c = 0.1, 0.08
    production = np.random.default_rng(1).exponential(m, 20000)
    run = S.simulate_sync(production, 1, c, steps=2000, depth=1, replicates=10, seed=2)
    assert run.mean_step == pytest.approx(c + m * math.exp(-c / m), rel=0.02)


def test_one_rank_with_a_deep_queue_runs_at_the_slower_of_loader_and_step():
    production = np.random.default_rng(3).exponential(0.1, 20000)
    fast_loader = S.simulate_sync(production, 1, 0.15, steps=2000, depth=64, seed=4)
    slow_loader = S.simulate_sync(production, 1, 0.05, steps=2000, depth=64, seed=4)
    assert fast_loader.mean_step == pytest.approx(0.15, rel=0.02)
    assert slow_loader.mean_step == pytest.approx(0.1, rel=0.05)


def test_several_workers_share_the_production():
    run = S.simulate_sync([0.2], ranks=4, compute_s=0.01, steps=200, workers=4)
    assert run.mean_step == pytest.approx(0.05, rel=0.05)  # 4 workers x 0.2 s each: a batch every 0.05 s


def test_the_table_is_fast_at_1024_ranks():
    production = np.random.default_rng(0).exponential(0.05, 100)
    start = time.perf_counter()
    rows = S.simulation_table(production, 0.05, steps=300)
    assert time.perf_counter() - start < 2.0
    assert [r["ranks"] for r in rows] == list(S.RANKS) * 2 and {r["depth"] for r in rows} == {2, 8}


def _fake_rank_loader(rank, world_size, workers):
    def batches():
        rng = np.random.default_rng(rank)
        while True:
            time.sleep(0.004 + 0.004 * rng.random())
            yield np.zeros(4)

    return batches()


def test_two_real_ranks_on_a_fake_loader():
    start = time.perf_counter()
    runs = S.run_ranks(_fake_rank_loader, steps=12, workers=0, calibrate=6, timeout=20)
    assert time.perf_counter() - start < 30
    assert [r.rank for r in runs] == [0, 1]
    for r in runs:
        assert len(r.waits) == len(r.steps) == len(r.exchange) == 12 and len(r.production) == 6
        assert np.all(r.production > 0.003)
        assert r.compute_s == pytest.approx(runs[0].compute_s) and r.compute_s > 0.003  # agreed by all ranks
        assert np.all(r.steps >= r.compute_s)
    report = S.validate(runs, replicates=20)
    assert report["ranks"] == 2 and report["steps"] == 12 and isinstance(report["agrees"], bool)


def _failing_loader(rank, world_size, workers):
    raise ValueError(f"no data for rank {rank}")


def test_a_failing_rank_raises_instead_of_hanging():
    with pytest.raises(RuntimeError, match="no data for rank"):
        S.run_ranks(_failing_loader, steps=3, workers=0, calibrate=2, timeout=10)


def _synchronous_ranks(steps: int = 400, compute: float = 0.05, seed: int = 3):
    """Two fake ranks of a synchronous job: independent waits, each step as long as the slower one's wait."""
    rng = np.random.default_rng(seed)
    waits = rng.exponential(0.004, size=(2, steps)) + 0.002
    step = compute + 0.001 + waits.max(axis=0)
    return [S.RankRun(r, waits[r], step, step - compute - waits[r], np.full(20, 0.04), compute, 1) for r in range(2)]


def test_the_slowest_of_n_measured_waits_grows_with_n_and_is_checked_on_the_real_ranks():
    constant = S.slowest_of(np.full(50, 0.01), 64, compute_s=0.05, exchange_s=0.002, steps=100)
    assert np.allclose(constant, 0.062)  # one wait size: the largest of any number of them is that size
    rows = S.slowest_table(np.random.default_rng(0).exponential(0.01, 500), 0.05, 0.0, ranks=(1, 8, 64), steps=500)
    shares = [row["waiting %"] for row in rows]
    assert shares == sorted(shares) and shares[-1] > 2 * shares[0]
    check = S.validate_slowest(_synchronous_ranks())
    assert check["agrees"] and abs(check["mean relative error"]) < 0.02
    # Ranks that waited in lock-step (the same slow steps) are not independent: the model's max overshoots them.
    lockstep = _synchronous_ranks()
    shared = lockstep[0].waits
    step = 0.05 + 0.001 + shared
    together = [S.RankRun(r, shared, step, step - 0.05 - shared, lockstep[r].production, 0.05, 1) for r in range(2)]
    assert not S.validate_slowest(together)["agrees"]

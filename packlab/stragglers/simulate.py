"""N synchronous ranks simulated from one machine's measured batch times, and the check against real ranks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from packlab.stragglers.ranks import RankRun
from packlab.stragglers.waits import _ms

#: The rank counts of the chapter's simulation table.
RANKS = (1, 2, 8, 64, 512, 1024)
#: DataLoader's default ``prefetch_factor``: batches in flight per worker.
PREFETCH_FACTOR = 2

# ----------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class SyncRun:
    """Simulated synchronous steps: ``steps[r, k]`` is step ``k`` of replicate job ``r``; ``waits[r, k, n]`` rank n's wait."""

    ranks: int
    depth: int
    workers: int
    compute_s: float
    exchange_s: float
    steps: np.ndarray
    waits: np.ndarray = field(repr=False)

    @property
    def mean_step(self) -> float:
        return float(np.mean(self.steps))

    @property
    def p99_step(self) -> float:
        return float(np.quantile(self.steps, 0.99))

    @property
    def waiting_share(self) -> float:
        """The share of the mean step lost to waiting for data: ``1 - (compute + exchange) / mean step``."""
        return 1.0 - (self.compute_s + self.exchange_s) / self.mean_step

    def run_means(self) -> np.ndarray:
        """The mean step of each replicate job: how much one run's mean varies, for a run this long."""
        return self.steps.mean(axis=1)

    def row(self) -> dict:
        return {"ranks": self.ranks, "depth": self.depth, "mean step ms": _ms(self.mean_step),
                "p99 step ms": _ms(self.p99_step), "waiting %": round(100 * self.waiting_share, 1)}


def simulate_sync(production: Sequence[float], ranks: int, compute_s: float, steps: int = 300, workers: int = 1,
                  depth: int | None = None, exchange_s: float = 0.0, replicates: int = 1, seed: int = 0,
                  keep_waits: bool = False) -> SyncRun:
    """Simulate ``steps`` synchronous steps of ``ranks`` ranks, each fed by a loader like the measured one.

    Each rank's loader is ``workers`` producers, as a DataLoader's workers: batch ``k`` is
    made by worker ``k % workers`` and takes a production time drawn (seeded, with
    replacement) from ``production``, the measured per-worker times. A DataLoader has at
    most ``depth`` batches in flight (``workers * prefetch_factor``, the default here):
    it hands out batch ``k``'s index when batch ``k - depth`` is taken, so a worker starts
    batch ``k`` when it has finished batch ``k - workers`` *and* that index has come.
    Batches are delivered in order. So, per rank, with ``t`` the time a batch is taken::

        start[k] = max(finish[k - workers], t[k - depth]);  finish[k] = start[k] + p[k]
        ready[k] = max(finish[k], ready[k - 1]);            t[k] = max(ready[k], end[k - 1])
        end[k]   = max over ranks of t[k] + compute_s + exchange_s

    A rank takes its batch when the previous step has ended and the batch is ready; the
    step ends when the last rank's batch was taken plus the compute and the exchange (the
    ``all_reduce`` that makes every rank wait for the slowest). All queues start empty, as
    a real job's do. ``replicates`` independent jobs run side by side (their run-to-run
    spread is what a single measured run's mean can be compared with). Every operation is
    over an array of ``replicates x ranks``, so 1,024 ranks x 300 steps takes milliseconds.
    """
    production = np.asarray(production, dtype=float)
    if production.size == 0:
        raise ValueError("no production times to draw from")
    workers = max(1, workers)
    depth = workers * PREFETCH_FACTOR if depth is None else depth
    if depth < workers:
        raise ValueError(f"a depth of {depth} leaves some of the {workers} workers without a batch to make")
    rng = np.random.default_rng(seed)
    shape = (replicates, ranks)
    draws = rng.choice(production, size=(steps, *shape))
    free = np.zeros((workers, *shape))  # when each worker finished its last batch
    taken = np.zeros((depth, *shape))  # t[k - depth] at slot k % depth (0: handed out at the start)
    ready = np.zeros(shape)
    end = np.zeros((replicates, 1))
    step_times = np.empty((replicates, steps))
    waits = np.empty((replicates, steps, ranks)) if keep_waits else None
    for k in range(steps):
        finish = np.maximum(free[k % workers], taken[k % depth]) + draws[k]
        free[k % workers] = finish
        ready = np.maximum(finish, ready)
        take = np.maximum(ready, end)
        taken[k % depth] = take
        new_end = take.max(axis=1, keepdims=True) + compute_s + exchange_s
        step_times[:, k] = (new_end - end)[:, 0]
        if keep_waits:
            waits[:, k] = take - end
        end = new_end
    return SyncRun(ranks, depth, workers, compute_s, exchange_s, step_times,
                   waits if keep_waits else np.zeros((0, 0, 0)))


def simulation_table(production: Sequence[float], compute_s: float, ranks: Sequence[int] = RANKS,
                     depths: Sequence[int] | None = None, steps: int = 300, workers: int = 1,
                     exchange_s: float = 0.0, seed: int = 0) -> list[dict]:
    """Rows of :meth:`SyncRun.row` for every rank count and depth (default: DataLoader's default and 4x it).

    The first ``workers`` steps are start-up, left out as in :func:`record_waits`.
    """
    default = max(1, workers) * PREFETCH_FACTOR
    depths = (default, 4 * default) if depths is None else depths
    rows = []
    for depth in depths:
        for n in ranks:
            run = simulate_sync(production, n, compute_s, steps + workers, workers, depth, exchange_s, seed=seed)
            rows.append(_trimmed(run, max(1, workers)).row())
    return rows


def _trimmed(run: SyncRun, skip: int) -> SyncRun:
    """The run without its first ``skip`` steps (start-up)."""
    waits = run.waits[:, skip:] if run.waits.size else run.waits
    return SyncRun(run.ranks, run.depth, run.workers, run.compute_s, run.exchange_s, run.steps[:, skip:], waits)


# ----------------------------------------------------------------------------- validation


def job_steps(runs: Sequence[RankRun]) -> np.ndarray:
    """The job's step times: per step, the mean over ranks (the ranks leave each ``all_reduce`` together)."""
    return np.mean([r.steps for r in runs], axis=0)


def exchange_cost(runs: Sequence[RankRun]) -> float:
    """The ``all_reduce``'s own cost: per step, the shortest rank's exchange (the last to arrive waits for no one), median."""
    return float(np.median(np.min([r.exchange for r in runs], axis=0)))


def next_floor(runs: Sequence[RankRun], q: float = 0.1) -> float:
    """What ``next()`` costs even when the batch is ready: the ranks' mean ``q`` quantile (p10) of the wait.

    Receiving a batch from a worker is not free (unpickling, mapping its shared memory, and,
    on a busy machine, waiting to be scheduled beside the workers); the simulation's
    ``next()`` on a ready batch takes no time, so the validation adds this to the compute.
    """
    return float(np.mean([np.quantile(r.waits, q) for r in runs]))


def block_se(values: np.ndarray, blocks: int = 5) -> float:
    """Standard error of the mean of ``values`` from the spread of the means of ``blocks`` consecutive blocks.

    Consecutive steps are not independent (a full queue stays full for a while), so the
    spread of single steps would understate it; block means are nearly independent.
    """
    means = [np.mean(b) for b in np.array_split(np.asarray(values), blocks)]
    return float(np.std(means, ddof=1) / math.sqrt(blocks))


def validate(runs: Sequence[RankRun], replicates: int = 200, seed: int = 0, blocks: int = 5) -> dict:
    """Simulate the measured run of ``len(runs)`` ranks and compare its mean step and p99 step.

    The simulation draws from the production times the ranks measured themselves, in their
    calibration batches (pooled over ranks, measured while every rank's loader ran, so
    under the same sharing of the cores as the timed steps), with the same number of
    workers and depth and steps, the measured ``all_reduce`` cost (:func:`exchange_cost`)
    as the exchange, and as the compute the measured time from a batch's arrival to the
    exchange (a sleep oversleeps when the workers hold every core) plus :func:`next_floor`
    (what ``next()`` costs with the batch ready).

    **Agreement** means ``|simulated mean - measured mean| <= 2 * max(SE_blocks, SD_runs)``:
    the measured mean is *one* run's mean, as uncertain as a run's mean is. Two estimates of
    that uncertainty are at hand: the standard error from blocks of the measured steps
    (:func:`block_se`; it sees the machine's real noise) and the spread of the means of
    ``replicates`` simulated runs of the same length (it sees the queueing's own variance,
    which blocks of a short run underestimate). The larger one counts, twice (about 95 %).
    The p99 of a run of ~80 steps is nearly its largest step, so its error is reported
    but not judged.

    What differs, honestly: the real ranks share the machine's cores (their workers slow
    each other, and other programs slow them all, at the same moments: correlated), the
    simulated ranks draw independently; the real loaders start the timed steps with what
    they prefetched during the calibration's last ``all_reduce``, the simulated ones empty.
    """
    runs = list(runs)
    measured = job_steps(runs)
    first = runs[0]
    production = np.concatenate([r.production for r in runs])
    exchange, floor = exchange_cost(runs), next_floor(runs)
    compute = float(np.mean([r.steps - r.waits - r.exchange for r in runs]))  # the sleep as it really lasted
    sim = simulate_sync(production, len(runs), compute + floor, steps=len(measured), workers=first.workers,
                        exchange_s=exchange, replicates=replicates, seed=seed)
    se, sd = block_se(measured, blocks), float(np.std(sim.run_means(), ddof=1))
    mean, p99 = float(np.mean(measured)), float(np.quantile(measured, 0.99))
    tolerance = 2 * max(se, sd)
    return {
        "ranks": len(runs), "steps": len(measured), "compute ms": _ms(first.compute_s), "compute as slept ms": _ms(compute), "all_reduce ms": _ms(exchange),
        "next() floor ms": _ms(floor),
        "measured mean step ms": _ms(mean), "simulated mean step ms": _ms(sim.mean_step),
        "mean relative error": round((sim.mean_step - mean) / mean, 3),
        "measured p99 step ms": _ms(p99), "simulated p99 step ms": _ms(sim.p99_step),
        "p99 relative error": round((sim.p99_step - p99) / p99, 3),
        "measured block SE ms": _ms(se), "simulated run SD ms": _ms(sd), "tolerance ms": _ms(tolerance),
        "agrees": bool(abs(sim.mean_step - mean) <= tolerance),
    }




# ----------------------------------------------------------------------------- the slowest of N measured waits


def slowest_of(waits: Sequence[float], ranks: int, compute_s: float, exchange_s: float = 0.0, steps: int = 2000,
               replicates: int = 1, seed: int = 0) -> np.ndarray:
    """Step times (replicates x steps) of ``ranks`` ranks whose waits for a batch are drawn from the measured ones.

    The other model of the chapter, with no queue in it: each rank's wait at each step is
    drawn (seeded, with replacement) from ``waits``, the waits a real rank measured in
    ``next()`` with its own loader, prefetch and machine, and a step lasts ``compute_s +
    exchange_s`` plus the **largest** of the ranks' waits, as a synchronous job's does. It
    keeps everything the measured waits hold (handing the batch over, a busy core) and
    assumes only that ranks wait independently; it cannot say what another prefetch depth
    would do (:func:`simulate_sync` can).
    """
    rng = np.random.default_rng([seed, ranks, 0x5A0])
    pool = np.asarray(waits, dtype=float)
    largest = np.empty((replicates, steps))
    for r in range(replicates):  # one replicate at a time: ranks x steps draws, at most ~2 M at 1,024 ranks
        largest[r] = pool[rng.integers(0, len(pool), size=(steps, ranks))].max(axis=1)
    return compute_s + exchange_s + largest


def slowest_table(waits: Sequence[float], compute_s: float, exchange_s: float = 0.0, ranks: Sequence[int] = RANKS,
                  steps: int = 2000, seed: int = 0) -> list[dict]:
    """Per rank count: the mean and p99 step of :func:`slowest_of`, and the share of the step spent waiting."""
    rows = []
    for n in ranks:
        run = slowest_of(waits, n, compute_s, exchange_s, steps, seed=seed)
        mean = float(run.mean())
        rows.append({"ranks": n, "mean step ms": _ms(mean), "p99 step ms": _ms(np.quantile(run, 0.99)),
                     "waiting %": round(100 * max(0.0, 1 - (compute_s + exchange_s) / mean), 1)})
    return rows


def validate_slowest(runs: Sequence[RankRun], replicates: int = 200, seed: int = 0, blocks: int = 5) -> dict:
    """:func:`slowest_of` for the measured run's ranks, against the run: the same agreement rule as :func:`validate`.

    The waits are the real ranks' own (pooled), the compute the sleep as it really lasted,
    the exchange :func:`exchange_cost` (the ``all_reduce`` without the wait for the last
    rank, which the largest wait stands for).
    """
    runs = list(runs)
    measured = job_steps(runs)
    waits = np.concatenate([r.waits for r in runs])
    exchange = exchange_cost(runs)
    compute = float(np.mean([r.steps - r.waits - r.exchange for r in runs]))
    sim = slowest_of(waits, len(runs), compute, exchange, steps=len(measured), replicates=replicates, seed=seed)
    se, sd = block_se(measured, blocks), float(np.std(sim.mean(axis=1), ddof=1))
    mean, simulated = float(np.mean(measured)), float(np.mean(sim))
    tolerance = 2 * max(se, sd)
    return {"ranks": len(runs), "steps": len(measured), "compute as slept ms": _ms(compute),
            "all_reduce ms": _ms(exchange), "measured mean step ms": _ms(mean), "simulated mean step ms": _ms(simulated),
            "mean relative error": round((simulated - mean) / mean, 3), "tolerance ms": _ms(tolerance),
            "agrees": bool(abs(simulated - mean) <= tolerance)}

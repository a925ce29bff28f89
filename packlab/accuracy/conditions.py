"""Many conditions of one experiment, each trained for the same paired seeds, on all cores.

A chapter compares several ways of feeding the same model (orders, label noise, norms).
Each way is a :class:`Condition`: a schedule per seed (the batches, as index arrays), and
optionally labels per seed and a norm. :func:`run_conditions` trains every condition for
the same seeds (seed ``s`` starts from the same weights in all of them: see
:mod:`.instrument`), one :class:`~packlab.accuracy.instrument.SeedBank` of up to
:data:`~packlab.accuracy.instrument.SEEDS` seeds per job, the jobs spread over the cores,
and :func:`against` judges each condition against a reference, seed by seed
(:func:`~packlab.accuracy.paired.paired_difference`).

A condition can also be judged a second way from the same trained models: after
:func:`~packlab.accuracy.instrument.recalibrate` (BatchNorm's statistics recomputed on one
shuffled pass). Comparing the two judgements of one set of models tells what an order did
to BatchNorm's running statistics apart from what it did to the weights.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from packlab import bench
from packlab.accuracy import instrument
from packlab.accuracy.paired import PairedDifference, paired_difference
from packlab.accuracy.pixels import SmallImages
from packlab.accuracy.training import SHARED, forked_map

#: The suffix of a condition's second judgement, after BatchNorm's statistics were recomputed.
RECALIBRATED = " (BN recalibrated)"


@dataclass(frozen=True)
class Condition:
    """One way of feeding the model: ``schedule(seed)`` gives a seed's batches; ``labels(seed)`` (optional) its
    training labels; ``norm`` the model's norm (``"batch"`` or ``"group"``); ``recalibrated`` also judges the
    same models after BatchNorm's statistics are recomputed from a shuffled pass; ``learning_rate`` the peak
    rate (the instrument's by default; a condition tuned on its own, such as an echo factor, may set another);
    ``train`` a training set of the condition's own (indexed as its schedule expects) instead of the one
    :func:`run_conditions` is given, e.g. the same crops cut from a stored copy instead of the originals."""

    schedule: Callable[[int], Sequence[np.ndarray]]
    labels: Callable[[int], np.ndarray] | None = None
    norm: str = "batch"
    recalibrated: bool = False
    learning_rate: float = instrument.LEARNING_RATE
    train: SmallImages | None = None


def _train(job: tuple[str, tuple[int, ...]]) -> tuple[str, tuple[int, ...], dict[str, np.ndarray]]:
    name, seeds = job
    condition: Condition = SHARED["conditions"][name]
    train, holdout = SHARED["train"] if condition.train is None else condition.train, SHARED["holdout"]
    torch.set_num_threads(1)
    schedules = [condition.schedule(seed) for seed in seeds]
    labels = None if condition.labels is None else np.stack([condition.labels(seed) for seed in seeds])
    bank = instrument.train_bank(train, schedules, seeds, labels, norm=condition.norm,
                                 learning_rate=condition.learning_rate)
    judged = {name: 100 * instrument.bank_accuracy(bank, holdout)}
    if condition.recalibrated:
        judged[name + RECALIBRATED] = 100 * instrument.bank_accuracy(instrument.recalibrate(bank, train), holdout)
    return name, seeds, judged


def run_conditions(conditions: Mapping[str, Condition], train: SmallImages, holdout: SmallImages,
                   seeds: Sequence[int], processes: int = 1, together: int = instrument.SEEDS,
                   progress: bool = True) -> dict[str, np.ndarray]:
    """Held-out accuracy in %, per seed (in ``seeds``' order), of every condition and every second judgement.

    Each job trains ``together`` seeds of one condition as one bank; ``processes`` jobs run
    at once (forked). The result maps each condition's name, and ``name + RECALIBRATED``
    for those judged twice, to an array of one accuracy per seed.
    """
    from tqdm import tqdm

    seeds = list(seeds)[: bench.crash_test_count(len(seeds))]  # all of them, except in make test's many-cores passes
    groups = [tuple(seeds[i : i + together]) for i in range(0, len(seeds), together)]
    jobs = [(name, group) for name in conditions for group in groups]
    processes = max(1, min(processes, len(jobs)))
    found: dict[str, dict[int, float]] = {}
    bar = tqdm(total=len(jobs), desc="training", unit="bank", disable=not progress)
    try:
        for _, group, judged in forked_map(_train, jobs, processes, train=train, holdout=holdout,
                                           conditions=dict(conditions)):
            for key, accuracies in judged.items():
                found.setdefault(key, {}).update(zip(group, map(float, accuracies)))
            bar.update()
    finally:
        bar.close()
    return {key: np.array([by_seed[s] for s in seeds]) for key, by_seed in found.items()}


def against(accuracy: Mapping[str, np.ndarray], reference: str) -> dict[str, PairedDifference]:
    """Every condition minus ``reference``, seed by seed, in points: ``{name: PairedDifference}``."""
    return {name: paired_difference(values, accuracy[reference])
            for name, values in accuracy.items() if name != reference}


@dataclass(frozen=True)
class PlantedEffect:
    """What the instrument makes of a planted effect (see :func:`planted_effect_power`); accuracies in %.

    ``cost``: how much the flipped labels cost, in points (mean over the pool's seeds of clean
    minus flipped); ``found``: the share of ``seeds``-seed comparisons that called the cost
    clear (and in the right direction); ``false_clear``: the share of comparisons of two
    identical recipes called clear; ``detectable``: the median smallest detectable difference
    of the clean-against-flipped comparisons; ``accuracy``: the clean condition's mean.
    """

    flip_share: float
    seeds: int
    pool: int
    draws: int
    cost: float
    found: float
    false_clear: float
    detectable: float
    accuracy: float
    clean: np.ndarray = field(repr=False)
    repeat: np.ndarray = field(repr=False)
    flipped: np.ndarray = field(repr=False)


def clear_share(a: np.ndarray, b: np.ndarray, seeds: int, draws: int, seed: int = 0,
                direction: int = 0) -> tuple[float, float]:
    """``(share called clear, median detectable difference)`` over ``draws`` random ``seeds``-subsets of the pool.

    ``a[i]`` and ``b[i]`` are seed ``i`` in the two conditions; each draw picks ``seeds``
    of the pool's seeds without replacement and judges them with :func:`.paired.paired_difference`.
    ``direction=+1`` counts only "A clearly above B" (a found effect must point the right way),
    ``0`` any clear verdict.
    """
    rng = np.random.default_rng([seed, seeds, 0xD2A3])
    clear, detectable = 0, []
    for _ in range(draws):
        chosen = rng.choice(len(a), size=seeds, replace=False)
        verdict = paired_difference(a[chosen], b[chosen])
        clear += verdict.clear and (direction == 0 or np.sign(verdict.estimate) == direction)
        detectable.append(verdict.detectable)
    return float(clear / draws), float(np.median(detectable))


def planted_effect_power(train: SmallImages, holdout: SmallImages, flip_share: float, *,
                         seeds: int = instrument.SEEDS, pool: int = 48, draws: int = 2000,
                         epochs: int = instrument.EPOCHS, together: int = instrument.SEEDS, flipped_order: int = 0,
                         processes: int = 1, **options) -> PlantedEffect:
    """Can the instrument see a known cost? Plant one, and count how often ``seeds`` paired seeds find it.

    Three conditions are trained for every seed of a pool of ``pool`` seeds: *clean* (the
    true labels, shuffle draw 0), *repeat* (the same recipe with its own randomness drawn
    again: shuffle draw 1) and *flipped* (``flip_share`` of the training labels changed to
    another class). The flipped condition shuffles with draw ``flipped_order``: 0, the clean
    condition's own shuffle, makes the labels the only difference, as between two stored
    forms of the same images trained in the same order; any other draw adds a different
    order, as between two loaders' orders, and the seeds' paired differences spread wider.
    Then ``draws`` random subsets of ``seeds`` seeds are
    judged as a chapter would judge them: the share of subsets where clean beats flipped
    clearly is the power to find a cost of that size; the share where clean and repeat
    differ clearly is the false-clear rate, to hold to about
    :data:`packlab.bench.FALSE_CLEAR_RATE` (2 %).

    This is a **resampling estimate from one pool**: the subsets share seeds, so the
    shares are those of this pool, not of endless fresh seeds, and their precision is
    limited by ``pool`` more than by ``draws``. Training ``draws`` x ``seeds`` fresh runs
    per condition instead would cost hundreds of times more. ``processes`` banks train at
    once (:func:`run_conditions`); ``options`` go to :class:`Condition` (``norm``).
    """
    pool = bench.crash_test_count(pool)  # all of it, except in make test's many-cores passes (run_conditions's cap)
    seeds = min(seeds, max(2, pool // 2))
    size = len(train)
    planted = {"clean": Condition(instrument.shuffled_epochs(size, 0, epochs), **options),
               "repeat": Condition(instrument.shuffled_epochs(size, 1, epochs), **options),
               "flipped": Condition(instrument.shuffled_epochs(size, flipped_order, epochs),
                                    lambda seed: instrument.flipped_labels(train.labels, flip_share, seed), **options)}
    accuracy = run_conditions(planted, train, holdout, range(pool), processes, together, progress=False)
    clean, repeat, flipped = accuracy["clean"], accuracy["repeat"], accuracy["flipped"]
    found, detectable = clear_share(clean, flipped, seeds, draws, direction=+1)
    false_clear, _ = clear_share(clean, repeat, seeds, draws)
    return PlantedEffect(flip_share, seeds, pool, draws, float(np.mean(clean - flipped)), found, false_clear,
                         detectable, float(np.mean(clean)), clean, repeat, flipped)


#: Peak learning rates tried when a condition is tuned on its own (:func:`tuned_rates`): the instrument's, and two,
#: four and eight times it (on chapter 14's echo settings half of it was the worst of all, every time).
TUNING_RATES = tuple(instrument.LEARNING_RATE * f for f in (1, 2, 4, 8))


def tuned_rates(conditions: Mapping[str, Condition], train: SmallImages, validation: SmallImages,
                seeds: Sequence[int], rates: Sequence[float] = TUNING_RATES, processes: int = 1,
                progress: bool = False) -> tuple[dict[str, float], dict[str, dict[float, float]]]:
    """The peak learning rate that serves each condition best, and the mean validation accuracy (%) of every rate.

    Tuned on ``validation`` images and on ``seeds`` of their own, never the held-out images or
    the seeds that judge the conditions afterwards: a rate picked on the judging seeds would
    carry their luck into the verdict. Returns ``({name: best rate}, {name: {rate: accuracy}})``.
    Under make test's crash-test cap (its many-cores passes) only the first rate is tried: those
    passes check that the tuning runs with that many processes, not which rate wins.
    """
    from dataclasses import replace

    rates = tuple(rates)[: bench.crash_test_count(len(tuple(rates)), cap=1)]

    trials = {(name, rate): replace(condition, learning_rate=rate) for name, condition in conditions.items()
              for rate in rates}
    named = {f"{name} @ {rate:g}": trial for (name, rate), trial in trials.items()}
    accuracy = run_conditions(named, train, validation, seeds, processes=processes, together=len(list(seeds)),
                              progress=progress)
    table = {name: {rate: float(np.mean(accuracy[f"{name} @ {rate:g}"])) for rate in rates} for name in conditions}
    return {name: max(by_rate, key=by_rate.get) for name, by_rate in table.items()}, table

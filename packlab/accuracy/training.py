"""Train the tiny CNN on a schedule of batches, for several seeds at once, and report held-out accuracy.

A **schedule** is the list of batches a training run consumes, each an array of sample
indices into the small images (:mod:`.pixels`): the order a loader delivers, cut into
batches, or anything an experiment makes of it (a batch used twice for data echoing, say).
Everything else is fixed: the model (:class:`packlab.train.TinyCNN`), its initial weights
(from the seed), the optimiser, the learning rate and the held-out images. So when two
schedules give different accuracies, the schedule is the cause, within the variation
from seed to seed that :func:`accuracy_runs` measures by training each one several times.

The runs are independent, so :func:`accuracy_runs` spreads them over the cores, one run per
process with one torch thread each (forked: the small images are shared, not copied).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

import numpy as np
import torch
import torch.nn.functional as F

from packlab import bench, data
from packlab.accuracy.pixels import SmallImages
from packlab.bench import Spread
from packlab.train import TinyCNN

#: Images per batch, peak learning rate and momentum of every run (SGD with a cosine decay): fixed, so only the
#: schedule differs.
BATCH_SIZE = 64
LEARNING_RATE = 0.05
MOMENTUM = 0.9


def batches_of(order: Sequence[int], batch_size: int = BATCH_SIZE) -> list[np.ndarray]:
    """An order of sample indices cut into batches, as a DataLoader would (the last one may be short)."""
    order = np.asarray(order, dtype=np.int64)
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class DeliveredBatches(list):
    """Batches to train on, with how many fresh images the loader had delivered by the end of each one (``delivered``).

    For a schedule that passes the loader's output through a buffer (example echoing's
    shuffle buffer), more fresh images have been delivered than trained on: the buffer holds
    the rest. :func:`train_schedule` counts these, where a plain list of batches counts the
    distinct images trained on so far.
    """

    def __init__(self, batches, delivered):
        super().__init__(batches)
        self.delivered = np.asarray(delivered, dtype=np.int64)
        if len(self.delivered) != len(self):
            raise ValueError(f"{len(self)} batches but {len(self.delivered)} delivered counts")


def as_float(pixels: np.ndarray) -> torch.Tensor:
    """uint8 N x H x W x 3 to the model's float N x 3 x H x W in [0, 1]."""
    return torch.from_numpy(pixels).permute(0, 3, 1, 2).float().div_(255)


@dataclass
class RunResult:
    """One training run: its final held-out accuracy, and (if asked) the accuracy along the way."""

    accuracy: float
    curve: list[tuple[int, int, float]] = field(default_factory=list)  # (steps, fresh images seen, accuracy)


@torch.no_grad()
def held_out_accuracy(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, batch: int = 500) -> float:
    """Accuracy (0..1) on held-out images, in evaluation mode (batch norm's running statistics)."""
    model.eval()
    correct = sum(int((model(images[i : i + batch]).argmax(1) == labels[i : i + batch]).sum())
                  for i in range(0, len(labels), batch))
    model.train()
    return correct / len(labels)


def train_schedule(train: SmallImages, holdout: SmallImages, schedule: Sequence[np.ndarray], seed: int,
                   curve_every: int | None = None) -> RunResult:
    """Train a fresh :class:`TinyCNN` (weights drawn from ``seed``) on ``schedule``; return its held-out accuracy.

    With ``curve_every=k`` the held-out accuracy is also measured every ``k`` steps, with
    how many fresh images a loader had to deliver by then: ``schedule.delivered`` for a
    :class:`DeliveredBatches` (what sits in a buffer counts), else the distinct images the
    run had trained on.
    """
    torch.manual_seed(seed)
    model = TinyCNN(pool=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    # The learning rate falls along a half cosine to zero at the last step, as ImageNet recipes schedule it: the
    # final weights then average the last steps instead of following the last few batches.
    decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / len(schedule))))
    images, labels = as_float(train.pixels), torch.from_numpy(train.labels)
    test_images, test_labels = as_float(holdout.pixels), torch.from_numpy(holdout.labels)
    seen = np.zeros(len(labels), dtype=bool)
    delivered = getattr(schedule, "delivered", None)
    curve = []
    model.train()
    for step, batch in enumerate(schedule, start=1):
        index = torch.from_numpy(np.asarray(batch, dtype=np.int64))
        loss = F.cross_entropy(model(images[index]), labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        decay.step()
        if curve_every:
            seen[np.asarray(batch)] = True
            if step % curve_every == 0 or step == len(schedule):
                fresh = int(delivered[step - 1]) if delivered is not None else int(seen.sum())
                curve.append((step, fresh, held_out_accuracy(model, test_images, test_labels)))
    accuracy = curve[-1][2] if curve else held_out_accuracy(model, test_images, test_labels)
    return RunResult(accuracy, curve)


@dataclass(frozen=True)
class Experiment:
    """One schedule to train on: ``make(seed, **options)`` returns the batches for that seed."""

    make: Callable[..., Sequence[np.ndarray]]
    options: Mapping = field(default_factory=dict)
    curve_every: int | None = None


# The data a forked pool's processes train on: set in the parent before the pool starts.
SHARED: dict = {}


def forked_map(function: Callable, jobs: Sequence, processes: int, **shared):
    """``function(job)`` for every job, in order, in ``processes`` forked processes (or here, for one).

    ``shared`` is placed in :data:`SHARED` before the processes fork, so only the jobs (names
    and seeds) travel to them: the images, and experiments made of lambdas or notebook
    functions, reach them without being pickled. Yields the results as they come, in order.
    """
    SHARED.update(shared)
    try:
        if processes <= 1:
            yield from map(function, jobs)
        else:
            with ProcessPoolExecutor(processes, mp_context=get_context("fork")) as pool:
                yield from pool.map(function, jobs)
    finally:
        SHARED.clear()


def _run(job: tuple[str, int]) -> tuple[str, int, RunResult]:
    name, seed = job
    experiment = SHARED["experiments"][name]
    torch.set_num_threads(1)
    schedule = experiment.make(seed, **experiment.options)
    return name, seed, train_schedule(SHARED["train"], SHARED["holdout"], schedule, seed, experiment.curve_every)


def accuracy_runs(experiments: Mapping[str, Experiment], train: SmallImages, holdout: SmallImages,
                  seeds: Sequence[int] = range(5), processes: int | None = None,
                  progress: bool = True) -> dict[str, list[RunResult]]:
    """Train every experiment once per seed, on all cores; ``{name: [RunResult per seed]}``.

    The seed sets both the model's initial weights and the schedule's randomness, so the
    spread of a name's accuracies is the variation a practitioner would see between runs.
    """
    from tqdm import tqdm

    seeds = list(seeds)[: bench.crash_test_count(len(seeds), 2)]  # all of them, except in make test's many-cores passes
    # Only (name, seed) travels to the processes (forked_map): the experiments and images reach them unpickled.
    jobs = [(name, seed) for seed in seeds for name in experiments]
    processes = min(processes or data.available_cores(), len(jobs))
    results: dict[str, dict[int, RunResult]] = {name: {} for name in experiments}
    bar = tqdm(total=len(jobs), desc="training runs", unit="run", disable=not progress)
    try:
        for name, seed, result in forked_map(_run, jobs, processes, train=train, holdout=holdout,
                                             experiments=dict(experiments)):
            results[name][seed] = result
            bar.update()
    finally:
        bar.close()
    return {name: [by_seed[s] for s in seeds] for name, by_seed in results.items()}


def accuracy_spreads(results: Mapping[str, Sequence[RunResult]]) -> dict[str, Spread]:
    """``{name: Spread of held-out accuracies in %}``, for :func:`packlab.bench.compare`."""
    return {name: Spread.of(100 * r.accuracy for r in runs) for name, runs in results.items()}


def split_holdout(images: SmallImages, holdout: int, seed: int = 0) -> tuple[SmallImages, SmallImages]:
    """A fixed random split: ``holdout`` images to measure accuracy on, the rest to train on (manifest order kept)."""
    rng = np.random.default_rng(seed)
    test = np.zeros(len(images), dtype=bool)
    test[rng.choice(len(images), size=holdout, replace=False)] = True

    def take(mask: np.ndarray) -> SmallImages:
        where = np.flatnonzero(mask)
        return SmallImages(images.pixels[where], images.labels[where], [images.keys[i] for i in where])

    return take(~test), take(test)


def global_order(seed: int, epoch: int, size: int) -> np.ndarray:
    """A uniformly random permutation of ``size`` samples for ``epoch``: the global shuffle other orders are measured
    against."""
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(size)


def epochs_of(make_order: Callable[[int, int], np.ndarray], seed: int, epochs: int,
              batch_size: int = BATCH_SIZE) -> list[np.ndarray]:
    """The batches of ``epochs`` epochs, each ordered by ``make_order(seed, epoch)``."""
    schedule = []
    for epoch in range(epochs):
        schedule += batches_of(make_order(seed, epoch), batch_size)
    return schedule

"""Train many seeds of one condition at once, paired across conditions: the accuracy instrument's engine.

**Why many seeds, and why paired.** Two training runs that differ only in their seed end
a point or more apart; a loader shortcut worth knowing about costs about that much. To see
it, compare each seed with *itself*: seed ``s`` starts from the same initial weights and
draws the same per-seed randomness (its shuffle, its flipped labels ...) in every
condition, so the difference between two conditions, seed by seed, cancels part of what
the seed alone would have done: the more randomness two conditions share (the same order as
well as the same start, say), the more (see :mod:`.paired` for the statistics).

**Why one model.** On a laptop CPU a good part of a tiny model's step is Python and
dispatch, paid per layer call whatever the layer's size. :class:`SeedBank` therefore trains
``K`` seeds as ONE network whose convolutions are grouped (``groups=K``): seed ``s`` owns the
``s``-th slice of every layer's channels and never sees another seed's. Each step feeds
seed ``s`` its own batch (the ``K`` batches are stacked along the channels), the loss is
the *sum* of the seeds' own mean losses, so each seed's gradient is exactly what it would
get alone, and SGD updates every weight from its own gradient only. BatchNorm over ``K x C``
channels keeps per-channel, so per-seed, statistics. :func:`train_seeds` is therefore the
same computation as ``K`` separate runs, to float rounding (a test checks it), in one
process and one loop: the dispatch is paid once per layer instead of ``K`` times, and the
arithmetic, no longer hidden behind it, becomes the cost.

**Chosen sizes**: 16-pixel pattern images (:mod:`.patterns`), width 8 (8, 16, 32 channels
per seed over three blocks, about 6,000 weights per seed), batches of 64, 6 epochs of
2,000 images. 16 pixels show the stripes' orientation and both frequencies at a quarter of
32 pixels' arithmetic. Six epochs rather than three: the seeds then end closer together
(a less trained model's accuracy depends more on its luck), so fewer seeds see the same
difference, which more than pays for the longer runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from packlab.accuracy.pixels import SmallImages
from packlab.accuracy.training import BATCH_SIZE, as_float, epochs_of, global_order

#: Peak learning rate, momentum and weight decay of every seed (SGD, cosine decay to zero over the run).
LEARNING_RATE = 0.05
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
#: Channels of a seed's first block; each further block doubles them.
WIDTH = 8
#: Epochs of a condition, each with its own shuffle: the instrument's default recipe.
EPOCHS = 6
#: Seeds trained together in one :class:`SeedBank`, unless told otherwise.
SEEDS = 12
#: The norms a :class:`SeedBank` can use: "batch" (BatchNorm, statistics of the batch while training) or "group"
#: (GroupNorm, statistics of each image alone, so a batch of one class trains like any other).
NORMS = ("batch", "group")
#: GroupNorm's groups per seed and layer in the "group" variant (fewer where a layer has fewer channels or they do
#: not divide): with 8, each of the first layer's channels is normalised alone. Trials with 1, 2 or 4 groups per seed
#: trained worse and less evenly across seeds in 6 epochs.
GROUPS_PER_SEED = 8


class SeedBank(nn.Module):
    """``len(seeds)`` independent small CNNs in one module, one per seed, each with its own slice of channels.

    Per seed: three blocks of 3 x 3 convolution, norm and ReLU (``width``, ``2 width``,
    ``4 width`` channels; 2 x 2 max pooling after the first two convolutions), global average pooling
    and a linear head (a grouped 1 x 1 convolution). The input is ``N x 3K x H x W``: seed
    ``s`` reads channels ``3s .. 3s+2``. The output is ``N x K x classes``.

    Seed ``s``'s initial weights are drawn from ``s`` alone (a model of one seed, built
    under ``torch.manual_seed(s)``, copied into the slice), so they do not depend on which
    other seeds share the bank: that is what makes a seed the same run in every condition.
    """

    def __init__(self, seeds: Sequence[int], width: int = WIDTH, norm: str = "batch", num_classes: int = 10):
        super().__init__()
        if norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, not {norm!r}")
        self.seeds, self.width, self.norm, self.num_classes = list(seeds), width, norm, num_classes
        k = len(self.seeds)
        if k == 0:
            raise ValueError("a SeedBank needs at least one seed")
        # Building the layers draws weights from the global generator: fork it, so a bank leaves the caller's
        # random state alone, and seed it, so a bank of one seed is that seed's model.
        with torch.random.fork_rng():
            torch.manual_seed(self.seeds[0])
            self.features = nn.Sequential(*self._layers(k))
            self.head = nn.Conv2d(k * 4 * width, k * num_classes, 1, groups=k)
        if k > 1:
            self._copy_from([SeedBank([seed], width, norm, num_classes) for seed in self.seeds])

    def _layers(self, k: int) -> list[nn.Module]:
        layers: list[nn.Module] = []
        channels = [3, self.width, 2 * self.width, 4 * self.width]
        for block, (cin, cout) in enumerate(zip(channels, channels[1:])):
            layers.append(nn.Conv2d(k * cin, k * cout, 3, padding=1, bias=False, groups=k))
            # Pooling straight after the convolution (not after the ReLU) leaves the norm and the ReLU a quarter of
            # the pixels: on a CPU those element-wise layers, not the convolutions, cost the most at this size.
            if block < 2:
                layers.append(nn.MaxPool2d(2))
            # GroupNorm's groups never straddle two seeds: GROUPS_PER_SEED groups of each seed's own channels.
            groups = math.gcd(GROUPS_PER_SEED, cout)
            norm = nn.BatchNorm2d(k * cout) if self.norm == "batch" else nn.GroupNorm(groups * k, k * cout)
            layers.append(norm)
            layers.append(nn.ReLU())
        return layers + [nn.AdaptiveAvgPool2d(1)]

    @torch.no_grad()
    def _copy_from(self, singles: Sequence[SeedBank]) -> None:
        # Every parameter and buffer of a grouped layer is the seeds' own, stacked along dimension 0.
        mine = dict(self.named_parameters()) | dict(self.named_buffers())
        for name, tensor in mine.items():
            parts = [dict(one.named_parameters()) | dict(one.named_buffers()) for one in singles]
            if tensor.dim() == 0:  # BatchNorm's step counter, the same for every seed
                continue
            tensor.copy_(torch.cat([part[name] for part in parts]))

    @torch.no_grad()
    def single(self, position: int) -> SeedBank:
        """The model of the seed at ``position``, alone: a bank of one seed holding its slice of every layer."""
        one = SeedBank([self.seeds[position]], self.width, self.norm, self.num_classes)
        mine = dict(self.named_parameters()) | dict(self.named_buffers())
        for name, tensor in (dict(one.named_parameters()) | dict(one.named_buffers())).items():
            size = len(tensor) if tensor.dim() else 0
            tensor.copy_(mine[name][position * size : (position + 1) * size] if size else mine[name])
        return one

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        k = len(self.seeds)
        if images.dim() != 4 or images.shape[1] != 3 * k:
            raise ValueError(f"expected N x {3 * k} x H x W (3 channels per seed), got {tuple(images.shape)}")
        return self.head(self.features(images)).view(len(images), k, self.num_classes)


def _stack(images: torch.Tensor, indices: Sequence[np.ndarray]) -> torch.Tensor:
    """Each seed's batch, gathered from ``images`` (N x 3 x H x W), side by side along the channels."""
    return torch.cat([images[torch.from_numpy(np.asarray(i, dtype=np.int64))] for i in indices], dim=1)


@torch.no_grad()
def bank_accuracy(bank: SeedBank, holdout: SmallImages, batch: int = 128) -> np.ndarray:
    """Held-out accuracy (0..1) of every seed of ``bank``, in evaluation mode (BatchNorm's running statistics).

    ``batch`` images at a time: with 24 seeds a batch of 1,000 makes activations of tens of
    megabytes that no cache holds, and took twice as long per image as batches of 128.
    """
    was_training = bank.training
    bank.eval()
    images, labels = as_float(holdout.pixels), torch.from_numpy(np.asarray(holdout.labels))
    correct = torch.zeros(len(bank.seeds))
    k = len(bank.seeds)
    for start in range(0, len(labels), batch):
        scores = bank(images[start : start + batch].repeat(1, k, 1, 1))
        correct += (scores.argmax(2) == labels[start : start + batch, None]).sum(0)
    bank.train(was_training)
    return (correct / len(labels)).numpy()


@torch.no_grad()
def recalibrate(bank: SeedBank, train: SmallImages, seed: int = 0, batch_size: int = BATCH_SIZE) -> SeedBank:
    """Recompute every BatchNorm's running statistics from one pass over ``train`` in a uniformly shuffled order.

    The BatchNorm control for orders: a model trained on batches of one class keeps running
    statistics of such batches, and judged with them it may fail for that reason alone. After
    this pass it is judged with the statistics of ordinary mixed batches, so what remains of
    the damage is what the order did to the *weights*. (Each seed sees the same shuffled
    batches: the pass changes no weight, and its order is not what is compared.)
    """
    norms = [m for m in bank.modules() if isinstance(m, nn.BatchNorm2d)]
    if not norms:
        return bank
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a plain average over the pass's batches, not a decaying one
    was_training = bank.training
    bank.train()
    images = as_float(train.pixels)
    order = global_order(seed, 0, len(train))
    k = len(bank.seeds)
    for start in range(0, len(order), batch_size):
        bank(images[torch.from_numpy(order[start : start + batch_size])].repeat(1, k, 1, 1))
    for m, momentum in zip(norms, saved):
        m.momentum = momentum
    bank.train(was_training)
    return bank


def train_seeds(train: SmallImages, holdout: SmallImages, schedules: Sequence[Sequence[np.ndarray]],
                seeds: Sequence[int], labels: np.ndarray | None = None, *, recalibrated: bool = False,
                **options) -> np.ndarray:
    """Train one model per seed, together (:func:`train_bank`); return their held-out accuracies (0..1), one per seed.

    ``recalibrated=True`` judges each model after :func:`recalibrate` (BatchNorm's statistics from a shuffled pass).
    """
    bank = train_bank(train, schedules, seeds, labels, **options)
    return bank_accuracy(recalibrate(bank, train) if recalibrated else bank, holdout)


def train_bank(train: SmallImages, schedules: Sequence[Sequence[np.ndarray]], seeds: Sequence[int],
               labels: np.ndarray | None = None, *, width: int = WIDTH, norm: str = "batch",
               learning_rate: float = LEARNING_RATE, num_classes: int = 10, threads: int = 1) -> SeedBank:
    """Train one model per seed, together, in one :class:`SeedBank`, and return it.

    ``schedules[j]`` is seed ``seeds[j]``'s list of batches (index arrays into ``train``,
    e.g. from :func:`packlab.accuracy.training.epochs_of`): every seed must have as many
    batches, of the same sizes, as the others (they are stacked). ``labels`` overrides
    the training labels: shape ``(len(train),)`` for all seeds, or ``(len(seeds),
    len(train))`` per seed (planted label flips). ``norm="group"`` trains without batch
    statistics (the BatchNorm control). ``threads`` torch threads (one by default: on a
    shared or busy 2-core machine, a second thread spends its time waiting for the first).
    """
    k = len(seeds)
    if len(schedules) != k:
        raise ValueError(f"{k} seeds but {len(schedules)} schedules")
    steps = len(schedules[0])
    shapes = [[len(b) for b in schedule] for schedule in schedules]
    if any(shape != shapes[0] for shape in shapes):
        raise ValueError("every seed's schedule must have the same number of batches, of the same sizes")
    if labels is None:
        labels = np.asarray(train.labels)
    labels = np.array(np.broadcast_to(np.asarray(labels, dtype=np.int64), (k, len(train))))
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, min(threads, previous)))
    try:
        bank = SeedBank(seeds, width, norm, num_classes)
        optimizer = torch.optim.SGD(bank.parameters(), lr=learning_rate, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
        # Half a cosine down to zero at the last step: the final weights settle instead of following the last batches.
        decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / steps)))
        images = as_float(train.pixels)
        per_seed = torch.from_numpy(labels)
        seat = torch.arange(k)[None, :]
        bank.train()
        for step in range(steps):
            batch = [np.asarray(schedule[step], dtype=np.int64) for schedule in schedules]
            targets = per_seed[seat, torch.from_numpy(np.stack(batch, axis=1))]  # batch x K
            scores = bank(_stack(images, batch))  # batch x K x classes
            # Mean over the batch, SUM over the seeds: each seed's gradient is its own loss's, as if alone.
            loss = F.cross_entropy(scores.reshape(-1, scores.shape[2]), targets.reshape(-1), reduction="sum")
            loss = loss / len(targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            decay.step()
        return bank
    finally:
        torch.set_num_threads(previous)


def shuffled_epochs(size: int, draw: int = 0, epochs: int = EPOCHS,
                    batch_size: int = BATCH_SIZE) -> Callable[[int], list[np.ndarray]]:
    """``schedule(seed)``: ``epochs`` epochs of ``size`` samples, each epoch in a fresh uniform permutation.

    ``draw`` names the condition's own randomness: two conditions with the same recipe but
    different ``draw`` shuffle differently for the same seed (independent repetitions of
    one recipe: the null case :mod:`.paired` must not call clear).
    """
    def schedule(seed: int) -> list[np.ndarray]:
        return epochs_of(lambda s, epoch: global_order(s * 1_000_003 + draw, epoch, size), seed, epochs, batch_size)

    return schedule


def flipped_labels(labels: np.ndarray, share: float, seed: int, draw: int = 0, num_classes: int = 10) -> np.ndarray:
    """``labels`` with ``share`` of them (chosen from ``(seed, draw)``) changed to another class, uniformly: a planted
    effect of known cause. Seed ``s`` flips the same images in every condition with the same ``draw``."""
    rng = np.random.default_rng([seed, draw, 0xF11B])
    labels = np.array(labels, dtype=np.int64)
    chosen = rng.choice(len(labels), size=int(round(share * len(labels))), replace=False)
    labels[chosen] = (labels[chosen] + rng.integers(1, num_classes, len(chosen))) % num_classes
    return labels


def train_condition(train: SmallImages, holdout: SmallImages, schedule: Callable[[int], Sequence[np.ndarray]],
                    seeds: Sequence[int], labels: Callable[[int], np.ndarray] | None = None, *,
                    together: int = SEEDS, **options) -> np.ndarray:
    """Held-out accuracy in % per seed, for one condition: ``schedule(seed)`` gives each seed's batches and
    ``labels(seed)`` (optional) its training labels. Seeds train ``together`` at a time (one :class:`SeedBank`);
    ``options`` go to :func:`train_seeds` (``norm``, ``width``, ``learning_rate``, ``recalibrated``)."""
    seeds = list(seeds)
    out = []
    for start in range(0, len(seeds), together):
        group = seeds[start : start + together]
        schedules = [schedule(seed) for seed in group]
        overrides = None if labels is None else np.stack([labels(seed) for seed in group])
        out.append(train_seeds(train, holdout, schedules, group, overrides, **options))
    return 100 * np.concatenate(out)

"""The consumer of the course's loaders: a tiny CNN and a training step, on CPU.

A loader is fast enough when the training loop never waits for it. To know what "fast
enough" means we need a consumer with a measurable appetite, in images per second. This
module provides one that learns the ten classes of the generated dataset in a few
seconds on a laptop CPU:

* :class:`TinyCNN` takes the course's standard batches (float, N x 3 x 256 x 256);
* :func:`train_step` runs one optimisation step on one batch, :func:`evaluate` measures
  accuracy on held-out batches;
* :class:`TrainingConsumer` turns the training step into an ``on_batch`` callback for
  :func:`packlab.bench.time_loader`, and logs when each step started and ended, so the
  time the loop spent *waiting for data* can be told apart from the time it spent
  computing.

It is deliberately small. A real model on a GPU consumes images many times faster; the
questions this module lets us ask (does the loader outrun the model? do they fight
over the same cores? how much of the loading hides behind the compute?) are the same.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn


class TinyCNN(nn.Module):
    """A small convolutional network for 3 x 256 x 256 images and ten classes.

    The input is first averaged down by ``pool`` in each direction (4: to 64 x 64). The
    classes differ in colour and in coarse pattern, which survive that; the convolutions
    then cost 16 times less than at full resolution. Four blocks of 3 x 3 convolution,
    batch normalisation and ReLU follow, doubling the channels from ``width`` while max
    pooling halves the resolution, then global average pooling and one linear layer.
    With the defaults the model has about 16,000 parameters.
    """

    def __init__(self, num_classes: int = 10, width: int = 8, pool: int = 4):
        super().__init__()
        self.pool = pool

        def block(cin: int, cout: int, downsample: bool) -> list[nn.Module]:
            layers: list[nn.Module] = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
            return layers + [nn.MaxPool2d(2)] if downsample else layers

        self.features = nn.Sequential(
            *block(3, width, True),
            *block(width, 2 * width, True),
            *block(2 * width, 4 * width, True),
            *block(4 * width, 4 * width, False),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(4 * width, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Class scores (logits), N x num_classes, for a batch of N x 3 x H x W images."""
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"expected a batch of shape N x 3 x H x W, got {tuple(images.shape)}")
        return self.classifier(self.features(F.avg_pool2d(images, self.pool)))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor, labels) -> float:
    """One optimisation step on one batch; returns the batch's loss.

    ``labels`` may be a tensor or a list of ints (the default collate gives a tensor).
    Forward, cross-entropy loss, backward, update: everything a training loop does per
    batch, so its cost is the consumer's cost per batch.
    """
    model.train()
    labels = torch.as_tensor(labels)
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable) -> float:
    """Accuracy (0..1) of ``model`` over ``batches`` of ``(images, labels, ...)``.

    Runs in evaluation mode (batch normalisation uses its running statistics) and
    restores the mode the model was in.
    """
    was_training = model.training
    model.eval()
    correct = total = 0
    try:
        for batch in batches:
            images, labels = batch[0], torch.as_tensor(batch[1])
            correct += int((model(images).argmax(dim=1) == labels).sum())
            total += len(labels)
    finally:
        model.train(was_training)
    if total == 0:
        raise ValueError("evaluate() got no samples")
    return correct / total


class TrainingConsumer:
    """An ``on_batch`` callback that trains on every batch and logs when each step ran.

    Pass it to :func:`packlab.bench.time_loader`: the loader's throughput then includes
    the training, as in a real job. Call :meth:`start_clock` just before, so the wait for
    the very first batch is measured too. Afterwards :meth:`intervals` gives, per batch,
    how long the loop waited for the batch and how long the step took: a training loop
    that overlaps loading with compute waits little.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self.optimizer = optimizer
        self.clock_start: float | None = None
        self.steps: list[tuple[float, float, int]] = []  # (start, end, images) per batch
        self.losses: list[float] = []

    def start_clock(self) -> TrainingConsumer:
        """Forget earlier steps and start timing now (call right before the loop starts)."""
        self.steps.clear()
        self.losses.clear()
        self.clock_start = time.perf_counter()
        return self

    def __call__(self, batch: Sequence) -> None:
        start = time.perf_counter()
        self.losses.append(train_step(self.model, self.optimizer, batch[0], batch[1]))
        self.steps.append((start, time.perf_counter(), len(batch[0])))

    def intervals(self) -> list[tuple[float, float]]:
        """``(seconds waiting for the batch, seconds computing on it)`` for every batch.

        The wait for a batch is the gap between the end of the previous step (or
        :meth:`start_clock`, for the first) and the start of this one: time spent inside
        the loader's ``__next__``, and, at an epoch boundary, starting the next epoch's
        iterator (and its workers).
        """
        if self.clock_start is None:
            raise RuntimeError("call start_clock() before the loop, so the first wait can be measured")
        previous_end = self.clock_start
        out = []
        for start, end, _ in self.steps:
            out.append((start - previous_end, end - start))
            previous_end = end
        return out

    def compute_images_per_s(self) -> float:
        """Images per second the training steps alone would sustain (waits excluded)."""
        compute = sum(end - start for start, end, _ in self.steps)
        return sum(n for _, _, n in self.steps) / compute

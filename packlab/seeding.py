"""Random augmentation in DataLoader workers: different in every worker, the same run after run.

``RandomResizedCrop`` and ``RandomHorizontalFlip`` draw from torch's global generator. In
each worker, before the first sample, torch seeds three generators from one number,
``base_seed + worker_id`` (``torch/utils/data/_utils/worker.py``, ``_worker_loop``):
Python's ``random``, torch's, and numpy's *global* (legacy) generator. ``base_seed`` is drawn
in the training process when the epoch's iterator starts, from the DataLoader's
``generator`` if one is given, else from torch's global generator. So:

* workers draw different crops (their seeds differ by the worker id);
* with ``generator=torch.Generator().manual_seed(s)`` (or ``torch.manual_seed(s)`` before
  the loader starts) the same run gives the same crops, epoch for epoch;
* with another ``num_workers`` a sample lands in another worker, at another place in that
  worker's stream, and gets another crop: reproducible per worker count, not across them.

What torch does *not* reseed is any generator object the dataset carries. A
``numpy.random.Generator`` (``np.random.default_rng(seed)``) made in ``__init__`` is copied
into every worker, state and all (by ``fork``, or by pickling under ``spawn``), so every
worker draws the *same* numbers: worker 0's first crop is worker 1's first crop. The fix is
to make the generator in the worker, from the seed torch chose for it
(``get_worker_info().seed``, which equals ``torch.initial_seed()`` there), in a
``worker_init_fn`` (:func:`seed_worker_generator`) or on first use.

To be independent of the worker count as well, draw each sample's randomness from a
generator seeded by ``(seed, epoch, index)`` (:class:`AugmentationDraws` with
``source="per sample"``): then it no longer matters which worker handles a sample.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


def _torchvision_v2():
    """torchvision's ``transforms.v2``, imported on first use.

    Importing torchvision costs seconds of CPU (the whole package, models included), and a
    ``spawn`` worker pays it again. Only the ``"torch global"`` source needs it, so the
    module does not import it at the top: :class:`AugmentationDraws` imports it in the
    training process, where forked workers inherit it.
    """
    from torchvision.transforms import v2

    return v2


#: Image size the crops are drawn for (the parameters depend only on it), and torchvision's defaults.
IMAGE_SHAPE = (3, 375, 500)
SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def crop_with_torch(generator: torch.Generator | None = None) -> tuple[int, ...]:
    """``(top, left, height, width, flip)`` as ``RandomResizedCrop`` + ``RandomHorizontalFlip`` would draw them.

    Without ``generator``: from torch's global generator, exactly torchvision's
    ``RandomResizedCrop.make_params`` draws (it calls ``torch.empty(1).uniform_`` and
    ``torch.randint``), then the flip's ``torch.rand(1) < 0.5``.
    """
    if generator is None:
        crop = _torchvision_v2().RandomResizedCrop(224, scale=SCALE, ratio=RATIO)
        params = crop.make_params([torch.empty(IMAGE_SHAPE)])
        top, left, height, width = params["top"], params["left"], params["height"], params["width"]
        return int(top), int(left), int(height), int(width), int(torch.rand(1) < 0.5)
    height, width = IMAGE_SHAPE[1:]
    area = torch.empty(1).uniform_(*SCALE, generator=generator).item() * height * width
    log_ratio = torch.log(torch.tensor(RATIO))
    aspect = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=generator)).item()
    w = min(width, max(1, int(round((area * aspect) ** 0.5))))
    h = min(height, max(1, int(round((area / aspect) ** 0.5))))
    top = int(torch.randint(0, height - h + 1, (1,), generator=generator))
    left = int(torch.randint(0, width - w + 1, (1,), generator=generator))
    return top, left, h, w, int(torch.rand(1, generator=generator) < 0.5)


def crop_with_numpy(rng: np.random.Generator) -> tuple[int, ...]:
    """The same kind of draw from a numpy ``Generator`` (as albumentations-style code does)."""
    height, width = IMAGE_SHAPE[1:]
    area = rng.uniform(*SCALE) * height * width
    aspect = float(np.exp(rng.uniform(np.log(RATIO[0]), np.log(RATIO[1]))))
    w = min(width, max(1, int(round((area * aspect) ** 0.5))))
    h = min(height, max(1, int(round((area / aspect) ** 0.5))))
    return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w, int(rng.random() < 0.5)


class AugmentationDraws(Dataset):
    """``dataset[i]`` is ``(i, worker id, crop and flip drawn for sample i)``: the randomness alone, no image.

    ``source`` says where the randomness comes from:

    * ``"torch global"``: torch's global generator, seeded per worker by torch;
    * ``"numpy generator from __init__"``: ``np.random.default_rng(seed)`` made here, in
      ``__init__``, and so copied into every worker (the bug);
    * ``"numpy generator per worker"``: the same, remade in each worker by
      :func:`seed_worker_generator` (pass it as ``worker_init_fn``);
    * ``"per sample"``: a generator seeded from ``(seed, epoch, i)`` for each sample.
    """

    SOURCES = ("torch global", "numpy generator from __init__", "numpy generator per worker", "per sample")

    def __init__(self, count: int = 16, source: str = "torch global", seed: int = 0, epoch: int = 0):
        if source not in self.SOURCES:
            raise ValueError(f"source must be one of {self.SOURCES}")
        self.count, self.source, self.seed, self.epoch = count, source, seed, epoch
        self.rng = np.random.default_rng(seed)  # copied into every worker as it is here
        if source == "torch global":
            _torchvision_v2()  # here, once, not in every forked worker

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        info = get_worker_info()
        worker = -1 if info is None else info.id
        if self.source == "torch global":
            draw = crop_with_torch()
        elif self.source == "per sample":
            draw = crop_with_torch(torch.Generator().manual_seed(hash((self.seed, self.epoch, index)) & (2**63 - 1)))
        else:
            draw = crop_with_numpy(self.rng)
        return index, worker, draw


def seed_worker_generator(worker_id: int) -> None:
    """``worker_init_fn``: give this worker's dataset a numpy generator of its own, from the seed torch chose for it.

    ``get_worker_info().seed`` is ``base_seed + worker_id`` (the same as ``torch.initial_seed()``
    in the worker): different in each worker, and reproducible when the DataLoader has a seeded
    ``generator``.
    """
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


def draws(source: str, workers: int, seed: int = 0, count: int = 16, loader_seed: int | None = 0,
          method: str = "fork") -> list[tuple]:
    """One epoch of :class:`AugmentationDraws` with ``workers`` workers: ``(index, worker, draw)`` in index order.

    ``loader_seed`` seeds the DataLoader's ``generator`` (None: none, so ``base_seed``
    comes from torch's global generator, which nothing here seeds).
    """
    dataset = AugmentationDraws(count, source, seed)
    generator = None if loader_seed is None else torch.Generator().manual_seed(loader_seed)
    init = seed_worker_generator if source == "numpy generator per worker" else None
    loader = DataLoader(dataset, batch_size=None, num_workers=workers, generator=generator, worker_init_fn=init,
                        multiprocessing_context=method if workers else None)
    return sorted(((int(i), int(w), tuple(int(x) for x in d)) for i, w, d in loader), key=lambda r: r[0])


def first_draw_per_worker(records: list[tuple]) -> dict[int, tuple]:
    """Each worker's first draw (the workers take turns, so worker w handles sample w first)."""
    first: dict[int, tuple] = {}
    for _, worker, draw in records:
        first.setdefault(worker, draw)
    return first

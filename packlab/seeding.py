"""Random augmentation in DataLoader workers: different in every worker, the same run after run, and after a resume.

``RandomResizedCrop`` and ``RandomHorizontalFlip`` draw from torch's global generator. In
each worker, before the first sample, torch seeds three generators
(``torch/utils/data/_utils/worker.py``, ``_worker_loop``): Python's ``random`` and torch's
from ``seed = base_seed + worker_id``, and numpy's *global* (legacy) generator from
``_generate_state(base_seed, worker_id)``, a SeedSequence-style hash of the pair (so two
workers never get neighbouring numpy seeds). ``base_seed`` is drawn in the training
process when the epoch's iterator starts, from the DataLoader's ``generator`` if one is
given, else from torch's global generator. So:

* workers draw different crops (their seeds differ by the worker id);
* with ``generator=torch.Generator().manual_seed(s)`` (or ``torch.manual_seed(s)`` before
  the loader starts) the same run gives the same crops, epoch for epoch;
* with another ``num_workers`` a sample lands in another worker, at another place in that
  worker's stream, and gets another crop: reproducible per worker count, not across them;
* **after a resume** the crops are others than the uninterrupted run's: torchdata's
  ``StatefulDataLoader`` saves and restores ``base_seed``
  (``torchdata/stateful_dataloader/stateful_dataloader.py``, ``_base_seed``), not the state
  each worker's generators had reached, so a resumed worker is seeded again with
  ``base_seed + worker_id`` and replays the crops of the epoch's start on the samples that
  are left.

What torch does *not* reseed is any generator object the dataset carries. A
``numpy.random.Generator`` (``np.random.default_rng(seed)``) made in ``__init__`` is copied
into every worker, state and all (by ``fork``, or by pickling under ``spawn``), so every
worker draws the *same* numbers: worker 0's first crop is worker 1's first crop. The fix is
to make the generator in the worker, from the seed torch chose for it
(``get_worker_info().seed``, which equals ``torch.initial_seed()`` there), in a
``worker_init_fn`` (:func:`seed_worker_generator`) or on first use.

Two ways make the crops survive a resume too:

* **per sample** (:func:`sample_generator`): each sample's randomness comes from a
  generator seeded from ``(seed, epoch, index)`` through ``numpy.random.SeedSequence``
  (:func:`sample_seed`), which mixes the three integers into well-spread bits, the same in
  every process and Python version (unlike ``hash()`` of a tuple, which CPython defines as
  an implementation detail and randomises for strings with ``PYTHONHASHSEED``). The epoch
  is read from shared memory (:class:`packlab.loaders.tar.SharedEpoch`), so persistent
  workers see ``set_epoch`` too. Which worker handles a sample no longer matters: the
  crops survive a resume and a change of the worker count, and the state is nothing.
* **the generators' states in the checkpoint** (:class:`GeneratorStateDraws`): the
  dataset's ``state_dict()``, which ``StatefulDataLoader`` calls in every worker after
  every batch, returns the worker's torch, Python and numpy generator states, and
  ``load_state_dict`` puts them back in the resumed worker (torchdata calls it after
  seeding the worker). Exact for the same worker count only, and a few kB per worker and
  checkpoint (:func:`generator_state_bytes`).
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

from packlab import crops
from packlab.loaders.tar import SharedEpoch
# The course's one per-sample seed scheme lives in packlab.sample_seeds (packlab.crops uses it too);
# chapter 12 teaches it as this module's.
from packlab.sample_seeds import key_number, sample_generator, sample_seed  # noqa: F401


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

    Without ``generator``: from torch's global generator, by torchvision's own
    ``RandomResizedCrop.make_params`` (``torch.empty(1).uniform_`` and ``torch.randint``:
    ten tries at an area share and an aspect ratio, then the central crop), then the flip's
    ``torch.rand(1) < 0.5``. With ``generator``: the same steps drawn from it, by
    :func:`packlab.crops.random_resized_crop`, the draw chapter 11's pipeline makes; on a
    generator in the same state as torch's global one, both give the same window and flip
    (``tests/test_seeding.py``). So every source of the seeding table draws its crops from
    one distribution, torchvision's, and differs only in where the randomness comes from.
    """
    if generator is None:
        crop = _torchvision_v2().RandomResizedCrop(224, scale=SCALE, ratio=RATIO)
        params = crop.make_params([torch.empty(IMAGE_SHAPE)])
        top, left, height, width = params["top"], params["left"], params["height"], params["width"]
        return int(top), int(left), int(height), int(width), int(torch.rand(1) < 0.5)
    top, left, height, width = crops.random_resized_crop(IMAGE_SHAPE[2], IMAGE_SHAPE[1], generator, SCALE, RATIO)
    return top, left, height, width, int(torch.rand(1, generator=generator) < 0.5)


def crop_with_numpy(rng: np.random.Generator) -> tuple[int, ...]:
    """The crop and flip of one sample, with all of its randomness taken from a numpy ``Generator``.

    One 63-bit integer drawn from ``rng`` seeds the torch generator that :func:`crop_with_torch`
    draws from: ``rng`` alone decides (a copy of it in every worker draws the same crops
    everywhere, which is the bug the table shows), and the window follows torchvision's
    distribution as the other sources' windows do, without a second implementation of its
    ten tries.
    """
    return crop_with_torch(torch.Generator().manual_seed(int(rng.integers(2**63))))


class AugmentationDraws(Dataset):
    """``dataset[i]`` is ``(i, worker id, crop and flip drawn for sample i)``: the randomness alone, no image.

    ``source`` says where the randomness comes from:

    * ``"torch global"``: torch's global generator, seeded per worker by torch;
    * ``"numpy generator from __init__"``: ``np.random.default_rng(seed)`` made here, in
      ``__init__``, and so copied into every worker (the bug);
    * ``"numpy generator per worker"``: the same, remade in each worker by
      :func:`seed_worker_generator` (pass it as ``worker_init_fn``);
    * ``"per sample"``: a generator seeded from ``(seed, epoch, i)`` for each sample
      (:func:`sample_generator`), the epoch read from shared memory;
    * ``"torch global, states saved"``: torch's global generator, whose state (and
      Python's and numpy's) the dataset saves in ``state_dict()``
      (:class:`GeneratorStateDraws`). It draws from the same global generator as
      ``"torch global"``, but through :func:`crop_with_torch` with ``torch.default_generator``
      (the global generator itself): the same draws, computed without torchvision, so
      that its workers need not import torchvision (seconds each under ``spawn``).
    """

    SOURCES = ("torch global", "numpy generator from __init__", "numpy generator per worker", "per sample",
               "torch global, states saved")

    def __init__(self, count: int = 16, source: str = "torch global", seed: int = 0, epoch: int = 0):
        if source not in self.SOURCES:
            raise ValueError(f"source must be one of {self.SOURCES}")
        self.count, self.source, self.seed = count, source, seed
        self._epoch = SharedEpoch()  # in shared memory: persistent workers see set_epoch too
        self._epoch.set(epoch)
        self.rng = np.random.default_rng(seed)  # copied into every worker as it is here
        if source == "torch global":
            _torchvision_v2()  # here, once, not in every forked worker

    @property
    def epoch(self) -> int:
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """The epoch the per-sample source mixes into its seeds; reaches running (persistent) workers."""
        self._epoch.set(epoch)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int):
        info = get_worker_info()
        worker = -1 if info is None else info.id
        if self.source == "torch global":
            draw = crop_with_torch()
        elif self.source == "torch global, states saved":
            draw = crop_with_torch(torch.default_generator)  # the global generator, without importing torchvision
        elif self.source == "per sample":
            draw = crop_with_torch(sample_generator(self.seed, self.epoch, index))
        else:
            draw = crop_with_numpy(self.rng)
        return index, worker, draw


class GeneratorStateDraws(AugmentationDraws):
    """:class:`AugmentationDraws` from torch's global generator, whose state travels in the checkpoint.

    ``state_dict()`` returns the generator states of the process that reads (torch's,
    Python's ``random`` and numpy's legacy one: all three that torch seeds in a worker);
    ``load_state_dict(state)`` sets them. torchdata's ``StatefulDataLoader`` calls the first
    in each worker after each batch and keeps the answer of the last batch the training
    loop received; on resume it calls the second in the new worker after torch has seeded
    it (``torchdata/stateful_dataloader/worker.py``), so the worker draws on from where its
    predecessor stood.
    """

    def __init__(self, count: int = 16, source: str = "torch global, states saved", seed: int = 0, epoch: int = 0):
        super().__init__(count, source, seed, epoch)

    def state_dict(self) -> dict:
        return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])


def generator_state_bytes() -> int:
    """Bytes of one worker's generator states as :class:`GeneratorStateDraws` saves them (pickled)."""
    return len(pickle.dumps(GeneratorStateDraws(1).state_dict()))


def seed_worker_generator(worker_id: int) -> None:
    """``worker_init_fn``: give this worker's dataset a numpy generator of its own, from the seed torch chose for it.

    ``get_worker_info().seed`` is ``base_seed + worker_id`` (the same as ``torch.initial_seed()``
    in the worker): different in each worker, and reproducible when the DataLoader has a seeded
    ``generator``.
    """
    info = get_worker_info()
    info.dataset.rng = np.random.default_rng(info.seed)


def make_draws(source: str, count: int = 16, seed: int = 0) -> AugmentationDraws:
    """The dataset for ``source``: :class:`GeneratorStateDraws` for the one that saves states, else AugmentationDraws."""
    kind = GeneratorStateDraws if source == "torch global, states saved" else AugmentationDraws
    return kind(count, source, seed)


def _loader(dataset: Dataset, workers: int, loader_seed: int | None, method: str):
    from torchdata.stateful_dataloader import StatefulDataLoader

    generator = None if loader_seed is None else torch.Generator().manual_seed(loader_seed)
    init = seed_worker_generator if dataset.source == "numpy generator per worker" else None
    return StatefulDataLoader(dataset, batch_size=None, num_workers=workers, generator=generator, worker_init_fn=init,
                              multiprocessing_context=method if workers else None)


def _records(items) -> list[tuple]:
    return [(int(i), int(w), tuple(int(x) for x in d)) for i, w, d in items]


def draws(source: str, workers: int, seed: int = 0, count: int = 16, loader_seed: int | None = 0,
          method: str = "fork") -> list[tuple]:
    """One epoch of :func:`make_draws` with ``workers`` workers: ``(index, worker, draw)`` in index order.

    Read through torchdata's ``StatefulDataLoader`` (as :func:`resumed_draws` is), one sample
    per batch. ``loader_seed`` seeds the DataLoader's ``generator`` (None: none, so
    ``base_seed`` comes from torch's global generator, which nothing here seeds).
    """
    return sorted(_records(_loader(make_draws(source, count, seed), workers, loader_seed, method)), key=lambda r: r[0])


def resumed_draws(source: str, workers: int, stop_after: int, seed: int = 0, count: int = 16, loader_seed: int = 0,
                  method: str = "fork") -> list[tuple]:
    """:func:`draws`, but stopped after ``stop_after`` samples, saved, and resumed by a new loader in a fresh dataset.

    Compare with :func:`draws` of the same arguments: equal when the randomness survives a resume.
    """
    loader = _loader(make_draws(source, count, seed), workers, loader_seed, method)
    items = iter(loader)
    first = [next(items) for _ in range(stop_after)]
    state = loader.state_dict()
    del items, loader
    again = _loader(make_draws(source, count, seed), workers, loader_seed, method)
    again.load_state_dict(state)
    return sorted(_records(first) + _records(again), key=lambda r: r[0])


def per_sample_seconds(samples: int = 2000) -> float:
    """Seconds to make one sample's generator with :func:`sample_generator` (the per-sample source's overhead)."""
    import time

    start = time.perf_counter()
    for index in range(samples):
        sample_generator(0, 1, index)
    return (time.perf_counter() - start) / samples


def first_draw_per_worker(records: list[tuple]) -> dict[int, tuple]:
    """Each worker's first draw (the workers take turns, so worker w handles sample w first)."""
    first: dict[int, tuple] = {}
    for _, worker, draw in records:
        first.setdefault(worker, draw)
    return first

"""Map-style datasets: the position is the sampler's, which torchdata's ``StatefulDataLoader`` saves."""

from __future__ import annotations

from collections.abc import Sequence


class KeyItems:
    """A map-style dataset whose item ``i`` is ``(0, 0, keys[i])``: it names itself, so a resume can be audited.

    The batches look like the course's ``(images, labels, keys)``, which :func:`stop_and_resume` reads.
    """

    def __init__(self, keys: Sequence[str]):
        self.keys = list(keys)

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> tuple[int, int, str]:
        return 0, 0, self.keys[index]


def map_style_loader(keys: Sequence[str], batch_size: int = 64, workers: int = 2, seed: int = 0,
                     rank: int | None = None, world_size: int | None = None, epoch: int = 0, **options):
    """A ``StatefulDataLoader`` over :class:`KeyItems`, shuffled as a training loop shuffles a map-style dataset.

    Without ``rank``: ``shuffle=True`` with a seeded ``generator``, which torchdata turns into
    its own ``RandomSampler``; the loader's state holds the generator's state and how many
    indices were taken (``torchdata/stateful_dataloader/sampler.py``). With ``rank`` and
    ``world_size``: torchdata's ``StatefulDistributedSampler`` for that rank, set to ``epoch``.
    Its state is how many indices it yielded, *not* the epoch: a resumed run must call
    ``set_epoch`` with the saved epoch before loading it, or it resumes in another epoch's
    permutation.
    """
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader
    from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

    dataset = KeyItems(keys)
    workers_options = {"num_workers": workers, "multiprocessing_context": "fork"} if workers else {}
    if rank is None:
        return StatefulDataLoader(dataset, batch_size=batch_size, shuffle=True,
                                  generator=torch.Generator().manual_seed(seed), **workers_options, **options)
    sampler = StatefulDistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return StatefulDataLoader(dataset, batch_size=batch_size, sampler=sampler, **workers_options, **options)

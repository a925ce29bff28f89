"""The chapter's loaders and the whole study in one call."""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import numpy as np

from packlab.stragglers.ranks import run_ranks
from packlab.stragglers.simulate import simulation_table, validate
from packlab.stragglers.waits import LOAD, _ms, calibrated_waits

# ----------------------------------------------------------------------------- the chapter's study


def tar_rank_loader(shards: Sequence[str], batch_size: int, seed: int, timeout: float,
                    rank: int, world_size: int, workers: int):
    """A rank's DataLoader over its part of ``shards`` (:class:`~packlab.loaders.TarShardDataset`), decoded and resized."""
    from torch.utils.data import DataLoader

    from packlab.loaders import TarShardDataset, collate_uint8_images
    from packlab.transforms import decode_and_resize

    dataset = TarShardDataset(list(shards), shuffle_buffer=100, seed=seed, transform=decode_and_resize,
                              rank=rank, world_size=world_size)
    dataset.check_split(workers)
    extra = {"multiprocessing_context": "fork", "timeout": timeout} if workers else {}
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate_uint8_images, **extra)


def shard_keys(shards: Sequence[str]) -> list[str]:
    """The keys of the samples in ``shards``, from the tar headers alone (no image is read)."""
    import tarfile

    keys = []
    for shard in shards:
        with tarfile.open(shard) as archive:
            keys += [name.rsplit(".", 1)[0] for name in archive.getnames() if name.endswith(".jpg")]
    return keys


def table_loaders(shards: Sequence[str], batch_size: int, seed: int) -> dict:
    """name -> ``make(workers)``: three loaders of the same images, those in ``shards``, each decoding and resizing.

    The course's tar reader and the standard crop pipeline read the shards (built as
    :mod:`packlab.loaders.lineup` builds them); the JPEG folder reads the same samples as files
    (:func:`shard_keys`), shuffled, so the three do the same work on the same images.
    """
    import torch
    from torch.utils.data import DataLoader

    from packlab import paths
    from packlab.loaders import JpegFolderDataset, collate_uint8_images
    from packlab.loaders.lineup import CROP_ROWS, crop_factories, loader_factories
    from packlab.transforms import decode_and_resize

    shards = list(shards)
    lineup = loader_factories(paths.data_root(), shards, None, batch_size=batch_size, seed=seed)
    crops = crop_factories(shards, [], batch_size=batch_size, seed=seed, dali=False)
    keys = shard_keys(shards)

    def folder(workers: int):
        dataset = JpegFolderDataset(paths.data_root(), keys=keys, transform=decode_and_resize)
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed),
                          num_workers=workers, collate_fn=collate_uint8_images,
                          multiprocessing_context="fork" if workers else None)

    return {"tar shards, decode": lineup["tar shards (ours)"][1], "JPEG folder": folder,
            "crops, standard": crops[CROP_ROWS["standard"]][1]}


def rank_loaders(shards: Sequence[str], batch_size: int, seed: int) -> dict:
    """name -> ``make(rank, world_size, workers)`` for :func:`run_ranks`: :func:`table_loaders`, each rank reading
    its own part of ``shards``, as a job's ranks split them. The course's tar reader
    comes first; under make test's crash-test cap (its many-cores passes, which check that the ranks run with
    that many workers) it is the only one."""
    from packlab.bench import crash_test_count

    shards = list(shards)
    names = ("tar shards, decode", "JPEG folder", "crops, standard")
    names = names[: crash_test_count(len(names), cap=1)]

    def one(name: str):
        def make(rank: int, world_size: int, workers: int):
            # The shard readers find the rank in torch.distributed (up in every rank) and take their own shards;
            # the JPEG folder is map-style and is given the keys of this rank's shards.
            mine = shards[rank::world_size] if name == "JPEG folder" else shards
            return table_loaders(mine, batch_size, seed)[name](workers)
        return make

    return {name: one(name) for name in names}


def _summary(times: np.ndarray) -> dict:
    q = np.quantile(times, [0.5, 0.9, 0.99])
    return {"batches": len(times), "mean ms": _ms(np.mean(times)), "p50 ms": _ms(q[0]), "p90 ms": _ms(q[1]),
            "p99 ms": _ms(q[2]), "max ms": _ms(np.max(times))}


def straggler_study(shards: Sequence[str] | None = None, steps: int = 60, workers: int | None = None,
                    seed: int = 0, batch_size: int = 16, calibrate: int = 20, table_steps: int = 30,
                    load: float = LOAD, sim_steps: int = 300, timeout: float = 60.0) -> dict:
    """Everything the chapter shows; about 25 s on 2 cores. Returns a dict:

    * ``"loaders"``: one :meth:`BatchWaits.row` per loader of :func:`table_loaders`, each run
      at its own limit (:func:`calibrated_waits`: compute = ``load`` x its mean production
      time per batch), with all the course's cores as workers;
    * ``"ranks"``: one :meth:`RankRun.row` per rank of a real 2-rank run (:func:`run_ranks`,
      each rank a :func:`tar_rank_loader` over half the shards, ``workers`` per rank:
      default half the course's cores, at least 1), and ``"rank_runs"``, the runs;
    * ``"production"``: the ranks' measured per-worker production times (summary row), the
      distribution every simulation draws from;
    * ``"compute_s"``: the 2-rank run's compute per step, ``load`` (1.05) times the mean
      production time per batch: a step just long enough for the loader on average;
    * ``"simulation"``: :func:`simulation_table` rows, N = 1 ... 1,024 at DataLoader's default
      depth and 4x it, no exchange cost (the network is left out);
    * ``"validation"``: :func:`validate` of the 2-rank run;
    * ``"settings"`` and ``"seconds"`` (the study's wall time).

    ``batch_size`` defaults to 16, not the course's 64: a batch takes a quarter as long, so
    the same seconds measure four times as many batches, and a tail is a statement about
    many. (Smaller batches also vary more, relative to their mean, than batches of 64.)
    """
    from packlab import data, paths
    from packlab.cpus import workers_for

    begin = time.perf_counter()
    shards = sorted(str(p) for p in (paths.packed_dir() / "shards").glob("shard-*.tar")) if shards is None else list(shards)
    cores = data.available_cores()
    per_rank = max(1, min(cores // 2, len(shards) // 2)) if workers is None else workers
    table_workers = workers_for(len(shards))
    rows = []
    for name, make in table_loaders(shards, batch_size, seed).items():
        waits, _ = calibrated_waits(make(table_workers), max(table_steps, 10 * table_workers), table_workers,
                                    max(calibrate // 2, 3 * table_workers), load)
        rows.append(waits.row(name))
    maker = functools.partial(tar_rank_loader, shards, batch_size, seed, timeout)
    runs = run_ranks(maker, steps=steps, workers=per_rank, load=load, calibrate=max(calibrate, 3 * per_rank),
                     timeout=timeout)
    production = np.concatenate([r.production for r in runs])
    compute_s = runs[0].compute_s
    return {
        "loaders": rows,
        "ranks": [r.row() for r in runs],
        "rank_runs": runs,
        "production": _summary(production),
        "compute_s": compute_s,
        "simulation": simulation_table(production, compute_s, steps=sim_steps, workers=per_rank, seed=seed),
        "validation": validate(runs, seed=seed),
        "settings": {"cores": cores, "shards": len(shards), "batch size": batch_size, "ranks": 2,
                     "workers per rank": per_rank, "table workers": table_workers, "steps": steps,
                     "calibration batches": max(calibrate, 3 * per_rank), "load": load},
        "seconds": round(time.perf_counter() - begin, 1),
    }


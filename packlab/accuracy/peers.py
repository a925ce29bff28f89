"""The peers' orders and mixes, made by the peers' own readers over copies that hold only labels.

What MosaicML Streaming (MDS) and LitData deliver, and in which order, is decided by their
readers from the shard layout and a seed, never from the pixels. So the copies written here
hold two small columns per sample (its index into the training images and its label, or
its source), cut into shards of as many samples as the course's tar shards hold; their
readers then make the order exactly as they would over images, in a fraction of the time.

* :func:`mds_order`: ``streaming.StreamingDataset`` with ``shuffle_algo`` ``"py1e"`` (its
  default: each shard's samples spread over a window of ``shuffle_block_size``) or
  ``"py1br"`` (blocks of random size, shuffled within);
* :func:`litdata_order`: ``litdata.StreamingDataset(shuffle=True)``, which permutes the
  chunks and then the samples within windows of chunks;
* :func:`mds_mix`, :func:`litdata_mix` and :func:`random_mix`: two sources mixed by MDS's
  ``Stream(proportion=…)``, LitData's ``CombinedStreamingDataset(weights=…)`` and
  webdataset's ``RandomMix(probs=…)``.

Each reader runs with ``workers`` DataLoader workers and a batch size, as in training: MDS
deals whole batches to workers, and LitData splits chunks between them.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

from packlab.accuracy.training import BATCH_SIZE
from packlab.loaders.streaming_peers import _quiet_imports, registered_mds

COLUMNS = {"index": "int", "label": "int"}


def _written_once(write: Callable[[Path, Sequence[dict], int], None], folder: Path, rows: Sequence[dict],
                  per_shard: int) -> Path:
    """``write(folder, rows, per_shard)`` unless ``folder`` already holds exactly these rows, cut the same way."""
    folder = Path(folder)
    digest = hashlib.sha256(json.dumps([list(rows), per_shard], sort_keys=True).encode()).hexdigest()
    marker = folder / ".packlab-rows"
    if marker.exists() and marker.read_text() == digest:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    write(folder, rows, per_shard)
    marker.write_text(digest)
    return folder


def write_mds_rows(folder: Path, rows: Sequence[dict], per_shard: int) -> Path:
    """Rows of ints as MDS shards of ``per_shard`` rows each (``size_limit`` set from one row's size); written once."""
    return _written_once(_write_mds, folder, rows, per_shard)


def write_litdata_rows(folder: Path, rows: Sequence[dict], per_shard: int) -> Path:
    """Rows of ints as LitData chunks of ``per_shard`` items each; written once."""
    return _written_once(_write_litdata, folder, rows, per_shard)


def _write_mds(folder: Path, rows: Sequence[dict], per_shard: int) -> None:
    _quiet_imports()
    from streaming import MDSWriter

    columns = {name: "int" for name in rows[0]}
    with MDSWriter(out=str(folder), columns=columns, size_limit=1 << 20) as writer:
        # MDS cuts a shard by bytes: its header (extra_bytes_per_shard) plus, per sample, the encoded row and a
        # 4-byte offset (extra_bytes_per_sample). Rows of ints all encode to the same size, so a limit half a row
        # past per_shard rows cuts after exactly per_shard.
        row_bytes = len(writer.encode_sample(rows[0])) + writer.extra_bytes_per_sample
        writer.size_limit = writer.extra_bytes_per_shard + per_shard * row_bytes + row_bytes // 2
        for row in rows:
            writer.write(row)


def _write_litdata(folder: Path, rows: Sequence[dict], per_shard: int) -> None:
    _quiet_imports()
    from litdata.streaming.writer import BinaryWriter

    folder.mkdir(parents=True)
    writer = BinaryWriter(str(folder), chunk_size=per_shard)
    for i, row in enumerate(rows):
        writer[i] = row
    writer.done()
    writer.merge()


def mds_block_rule() -> str:
    """The lines of MDS's own code that choose ``shuffle_block_size`` when it is not given (its source, as installed)."""
    import inspect

    _quiet_imports()
    from streaming import StreamingDataset

    source = inspect.getsource(StreamingDataset._set_shuffle_block_size)
    return source.split('"""')[-1].strip("\n")


#: The MDS datasets :func:`mds_schedule` plans with, one per setting, kept for the process's life.
_MDS_PLANNERS: dict = {}


def mds_schedule(folder: Path, sample_index: np.ndarray, seed: int, epochs: int, *, nodes: int = 1,
                 workers: int = 2, batch_size: int = BATCH_SIZE, algo: str = "py1e",
                 num_canonical_nodes: int | None = None, block: int | None = None) -> tuple[list[np.ndarray], dict]:
    """The global batches of ``epochs`` epochs as MDS deals an MDS copy out to a data-parallel job, and the settings
    MDS chose: ``(batches, {"num_canonical_nodes": …, "shuffle_block_size": …})``.

    Nothing is read: the order is MDS's own plan, from its own code. A ``StreamingDataset``
    is built over ``folder`` (``None`` for ``num_canonical_nodes`` or ``block`` leaves the
    choice to MDS, which makes it, as when training starts, in ``_resume``); then, for each
    epoch, ``streaming.base.batching.generate_work`` (what the dataset calls at the start of
    an epoch) deals the shuffled sample ids to ``nodes`` nodes of one rank each, ``workers``
    DataLoader workers per rank, in per-rank batches of ``batch_size // nodes``. Step ``t``
    of the job trains on the ``t``-th batch of every rank at once (synchronous data
    parallelism: the gradients are averaged), and each rank's DataLoader takes one batch
    from each worker in turn. ``sample_index[i]`` is the training index of the ``i``-th
    sample written.
    """
    _quiet_imports()
    from streaming import StreamingDataset
    from streaming.base.batching import generate_work
    from streaming.base.world import World

    if batch_size % nodes:
        raise ValueError(f"a global batch of {batch_size} does not split evenly over {nodes} nodes")
    world = World(num_nodes=nodes, ranks_per_node=1, workers_per_rank=workers, worker=0)
    # One dataset per setting and process, its seed set before each plan (generate_work reads
    # dataset.shuffle_seed): every StreamingDataset keeps its six /dev/shm names open until the
    # process exits, and each new one opens all the others' while it looks for a free name, so
    # a dataset per seed ran a kernel out of file descriptors.
    key = (str(folder), nodes, workers, batch_size, algo, num_canonical_nodes, block)
    if key not in _MDS_PLANNERS:
        dataset = registered_mds(lambda: StreamingDataset(local=str(folder), shuffle=True, shuffle_seed=seed,
                                                          shuffle_algo=algo, batch_size=batch_size // nodes,
                                                          num_canonical_nodes=num_canonical_nodes,
                                                          shuffle_block_size=block))
        dataset._resume(world, 0)  # MDS's own defaults for num_canonical_nodes and shuffle_block_size
        _MDS_PLANNERS[key] = dataset
    dataset = _MDS_PLANNERS[key]
    dataset.shuffle_seed = seed
    batches: list[np.ndarray] = []
    for epoch in range(epochs):
        work = generate_work(dataset.batching_method, dataset, world, epoch, 0)  # nodes x ranks x workers x b x n
        per_worker = work.shape[3]
        for b in range(per_worker):
            for w in range(workers):
                ids = work[:, 0, w, b].ravel()
                ids = ids[ids >= 0]  # MDS pads the last batches with -1
                if len(ids):
                    batches.append(np.asarray(sample_index)[ids])
    return batches, {"num_canonical_nodes": int(dataset.num_canonical_nodes),
                     "shuffle_block_size": int(dataset.shuffle_block_size)}


def _read(dataset, workers: int, batch_size: int, column: str) -> np.ndarray:
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                        multiprocessing_context="fork" if workers else None, collate_fn=lambda rows: rows)
    return np.array([int(row[column]) for batch in loader for row in batch])


def mds_order(folder: Path, seed: int, algo: str = "py1e", workers: int = 2, batch_size: int = BATCH_SIZE,
              column: str = "index", epoch_size: int | None = None, streams=None, block: int | None = None) -> np.ndarray:
    """``column`` of every sample of one epoch, in the order an MDS ``StreamingDataset`` delivers them.

    Each call is a new dataset whose first epoch is read (MDS counts its epochs itself); one
    node (``num_canonical_nodes=1``); ``block`` sets ``shuffle_block_size`` (default: MDS's).
    """
    _quiet_imports()
    from streaming import StreamingDataset
    options = {"streams": streams} if streams is not None else {"local": str(folder)}
    if block is not None:
        options["shuffle_block_size"] = block
    dataset = registered_mds(lambda: StreamingDataset(**options, shuffle=True, shuffle_seed=seed, shuffle_algo=algo,
                                                      batch_size=batch_size, num_canonical_nodes=1,
                                                      epoch_size=epoch_size))
    return _read(dataset, workers, batch_size, column)


def litdata_order(folder: Path, seed: int, workers: int = 2, batch_size: int = BATCH_SIZE, column: str = "index") -> np.ndarray:
    """``column`` of every sample of one epoch, in the order ``litdata.StreamingDataset(shuffle=True)`` delivers them."""
    _quiet_imports()
    import litdata

    dataset = litdata.StreamingDataset(str(folder), shuffle=True, seed=seed)
    return _read(dataset, workers, batch_size, column)


def mds_mix(folders: Sequence[Path], proportions: Sequence[float], epoch_size: int, seed: int, workers: int = 2,
            batch_size: int = BATCH_SIZE) -> np.ndarray:
    """The source of every sample of one epoch mixed by MDS's ``Stream(proportion=…)`` (rows with a ``source`` column)."""
    _quiet_imports()
    from streaming import Stream

    streams = [Stream(local=str(f), proportion=p) for f, p in zip(folders, proportions)]
    return mds_order(Path(folders[0]), seed, workers=workers, batch_size=batch_size, column="source",
                     epoch_size=epoch_size, streams=streams)


def litdata_mix(folders: Sequence[Path], weights: Sequence[float], seed: int, workers: int = 2,
                batch_size: int = BATCH_SIZE) -> np.ndarray:
    """The source of every sample of one epoch of ``CombinedStreamingDataset(weights=…)``: it ends when one runs out."""
    _quiet_imports()
    import litdata

    datasets = [litdata.StreamingDataset(str(f), shuffle=True, seed=seed) for f in folders]
    combined = litdata.CombinedStreamingDataset(datasets, seed=seed, weights=list(weights), iterate_over_all=False)
    return _read(combined, workers, batch_size, "source")


def random_mix(sizes: Sequence[int], weights: Sequence[float], seed: int) -> np.ndarray:
    """The source of every sample webdataset's ``RandomMix(probs=weights)`` yields until the first source runs out.

    ``RandomMix`` draws with Python's global ``random`` (``random.random()`` per sample, in
    ``webdataset.mix.random_samples``): seeded here as a DataLoader worker would be.
    """
    import random

    from webdataset import RandomMix

    saved = random.getstate()
    random.seed(seed)
    try:
        sources = [[source] * size for source, size in enumerate(sizes)]
        return np.array(list(RandomMix(sources, probs=list(weights))))
    finally:
        random.setstate(saved)


def peer_order(mds_copy: Path, litdata_copy: Path, seed: int, algo: str, block: int | None = None,
               workers: int = 2, batch_size: int = BATCH_SIZE) -> np.ndarray:
    """One epoch's order of the training images from MDS (``algo`` ``"py1e"``/``"py1br"``) or LitData (``"litdata"``)."""
    if algo == "litdata":
        return litdata_order(litdata_copy, seed, workers, batch_size)
    return mds_order(mds_copy, seed, algo, workers, batch_size, block=block)

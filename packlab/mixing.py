"""Data written sorted by class, and how well each reader's shuffle mixes it back.

A dataset is often written in the order its files were listed: ImageNet's training folders
are one class after another, 1,300 images each. A streaming reader does not shuffle the
whole epoch; each mixes within some window, and a class-sorted dataset shows how far:

* **ours** (:class:`packlab.loaders.tar.TarShardDataset`): the shard order is permuted,
  then a shuffle buffer of ``shuffle_buffer`` samples mixes each worker's stream; a sample
  moves earlier by at most the buffer's length;
* **MDS** (``streaming.StreamingDataset``): ``py1e`` spreads each shard's samples over a
  window of ``shuffle_block_size`` around it, ``py1br`` shuffles blocks of about that
  many samples. The block defaults to ``max(4,000,000 // num_canonical_nodes, 262,144)``
  samples and ``num_canonical_nodes`` to the number of physical nodes for these two
  algorithms (``streaming/base/dataset.py``), so on one node the default block is larger
  than ImageNet: a whole-dataset shuffle, paid for by reading shards in any order;
* **LitData** (``litdata.StreamingDataset(shuffle=True)``): the chunk order is permuted,
  and the samples within each chunk in windows of ``item_shuffle_window`` (256 by default,
  ``litdata/streaming/shuffle.py``): a sample never leaves its chunk's stretch of the epoch.

:func:`write_class_sorted_copies` writes one set of samples, sorted by class, in each
format with shards of the same number of samples; :func:`delivered_orders` reads each
copy with each shuffle; :func:`label_mixing` (chapter 5's statistic) says how far short
windows of a delivered order are from the overall class mix, and
:func:`permutation_band` what a random permutation of the same labels gives, the level a
perfect shuffle reaches. Chapter 12 compares the orders; chapter 13 trains on them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from packlab import data, pack
from packlab.loaders.tar import label_mixing

__all__ = ["class_sorted", "write_class_sorted_copies", "delivered_orders", "label_mixing", "permutation_band",
           "mixing_verdicts"]


def class_sorted(samples: Sequence[data.Sample]) -> list[data.Sample]:
    """The samples one class after another (by label, then key), as a folder-per-class listing gives them."""
    return sorted(samples, key=lambda s: (s.label, s.key))


def _rows(samples: Sequence[data.Sample], root: Path | None):
    for sample in samples:
        yield {"key": sample.key, "cls": sample.label, "jpg": data.image_path(sample.key, root).read_bytes()}


def write_class_sorted_copies(folder: Path | str, samples: Sequence[data.Sample], shard_samples: int,
                              root: Path | None = None) -> dict[str, object]:
    """``samples`` sorted by class, written as tar shards, MDS shards and LitData chunks of ``shard_samples`` each.

    Returns ``{"tar": [shard paths], "mds": folder, "litdata": folder}``. Every format gets
    the same samples in the same order, cut at the same places (MDS cuts by bytes: its
    ``size_limit`` is set to ``shard_samples`` samples of the largest size, so its shards
    hold at least that many), so that only the readers' shuffles differ.
    """
    from litdata.streaming.writer import BinaryWriter
    from streaming import MDSWriter

    from packlab.loaders import streaming_peers

    streaming_peers._quiet_imports()
    folder = Path(folder)
    ordered = class_sorted(samples)
    tar = pack.write_tar_shards(folder / "tar", samples=ordered, root=root, shuffle=False, maxcount=shard_samples,
                                progress=False)
    largest = max(s.bytes for s in ordered) + 200  # the key, the label and MDS's per-sample offsets
    with MDSWriter(out=str(folder / "mds"), columns=streaming_peers.COLUMNS, size_limit=shard_samples * largest) as mds:
        for row in _rows(ordered, root):
            mds.write(row)
    (folder / "litdata").mkdir(parents=True, exist_ok=True)
    litdata = BinaryWriter(str(folder / "litdata"), chunk_size=shard_samples)
    for index, row in enumerate(_rows(ordered, root)):
        litdata[index] = row
    litdata.done()
    litdata.merge()
    return {"tar": [str(p) for p in tar], "mds": folder / "mds", "litdata": folder / "litdata"}


def _keys_only(image_bytes: bytes, source: str = "") -> int:
    return len(image_bytes)


def delivered_orders(copies: dict[str, object], shuffle_buffer: int, block: int, workers: int = 2,
                     batch_size: int = 32, seed: int = 0) -> dict[str, list[str]]:
    """The keys of one epoch of each reader over :func:`write_class_sorted_copies`' copies, in delivered order.

    Readers: ours with a buffer of ``shuffle_buffer``; MDS ``py1e`` and ``py1br`` with their
    default block, and ``py1e`` with a block of ``block`` samples (a window like ours); LitData
    with its default window. Images are not decoded (only keys matter); every reader uses
    ``workers`` fork workers and batches of ``batch_size``.
    """
    from torch.utils.data import DataLoader

    from packlab.loaders import streaming_peers
    from packlab.loaders.tar import TarShardDataset

    def keys(loader) -> list[str]:
        return [str(k) for batch in loader for k in batch[2]]

    ours = TarShardDataset(copies["tar"], shuffle_buffer=shuffle_buffer, seed=seed, transform=_keys_only,
                           return_key=True)
    orders = {f"ours, buffer {shuffle_buffer}": keys(DataLoader(ours, batch_size=batch_size, num_workers=workers,
                                                                 multiprocessing_context="fork"))}
    mds: dict[str, dict] = {"MDS py1e": {"shuffle_algo": "py1e"}, "MDS py1br": {"shuffle_algo": "py1br"},
                            f"MDS py1e, block {block}": {"shuffle_algo": "py1e", "shuffle_block_size": block}}
    for name, options in mds.items():
        orders[name] = keys(streaming_peers.mds_loader(copies["mds"], workers=workers, batch_size=batch_size,
                                                       seed=seed, transform=_keys_only, with_key=True, **options))
    orders["LitData"] = keys(streaming_peers.litdata_loader(copies["litdata"], workers=workers, batch_size=batch_size,
                                                            seed=seed, transform=_keys_only, with_key=True))
    return orders


def permutation_band(labels: Sequence[int], trials: int = 200, seed: int = 0, **options) -> tuple[float, float]:
    """``(median, 95th percentile)`` of :func:`label_mixing` over ``trials`` random permutations of ``labels``.

    A shuffle that mixes like a random permutation gives values in this band; one above its
    95th percentile mixes measurably worse (one epoch, one order: a test at the 5 % level).
    """
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    values = [label_mixing(rng.permutation(labels), **options) for _ in range(trials)]
    return float(np.median(values)), float(np.percentile(values, 95))


def mixing_verdicts(orders: dict[str, Sequence[str]], label_of: Callable[[str], int], trials: int = 200,
                    **options) -> dict[str, dict]:
    """For each delivered order: its ``mixing`` and whether it ``mixes_like_a_permutation`` (within the 95 % band).

    Also ``times`` the permutation's median distance, and ``sorted`` (the mixing of the
    class-sorted order itself, the worst case) under the key ``"as written"``.
    """
    any_order = next(iter(orders.values()))
    labels = [label_of(key) for key in any_order]
    median, top = permutation_band(labels, trials, **options)
    out = {"as written": {"mixing": label_mixing(sorted(labels), **options), "mixes_like_a_permutation": False}}
    for name, keys in orders.items():
        value = label_mixing([label_of(key) for key in keys], **options)
        out[name] = {"mixing": value, "mixes_like_a_permutation": value <= top, "times": value / median}
    out["random permutation"] = {"mixing": median, "band_top": top, "mixes_like_a_permutation": True, "times": 1.0}
    return out

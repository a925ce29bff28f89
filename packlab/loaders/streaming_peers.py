"""MosaicML Streaming (MDS) and LitData, the two streaming libraries many readers will use, on the course's data.

Both write a dataset once into their own shard format and read it back through an
``IterableDataset`` that decides the sample order itself, globally, from a seed; both can
stop mid-epoch and resume. What each does, read in their sources (``streaming`` 0.13.0,
``litdata`` 0.2.76):

* **MDS** (``streaming.MDSWriter``, ``streaming.StreamingDataset``): shards of about
  ``size_limit`` bytes (67 MB by default) holding rows of typed columns, and an
  ``index.json``. The epoch's order comes from the *canonical nodes* (``num_canonical_nodes``):
  the sample ids are divided between them, and ``shuffle_algo="py1e"`` (the default)
  shuffles each shard's samples over a window of ``shuffle_block_size`` around it, so a
  sample moves at most that far; the partition then deals the order out to ranks, workers
  and batches (``batch_size`` must be the DataLoader's). Resuming needs one number per
  epoch: ``dataset.state_dict(num_samples, from_beginning)`` records how many samples the
  run consumed and ``load_state_dict`` skips them in the same global order, also with
  another number of ranks or workers (as long as ``num_canonical_nodes`` stays).
* **LitData** (``litdata.streaming.writer.BinaryWriter``, ``litdata.StreamingDataset``):
  chunks of about ``chunk_bytes`` with an ``index.json``. With ``shuffle=True`` each epoch
  permutes the chunk order (per rank) and the samples within each chunk in windows of
  ``item_shuffle_window`` (256 by default): a window shuffle over chunks, not a global
  one. ``litdata.StreamingDataLoader.state_dict()`` records each worker's progress; on
  resume the workers skip what was consumed.

They are imported on first use, with LitData's check for a newer version on PyPI turned
off (``LITDATA_DISABLE_VERSION_CHECK``: a request per process to a server a cluster node
often cannot reach). ``mosaicml-streaming`` is installed without its declared
dependencies, which would pull in cloud SDKs and an older numpy than the course's; see
``pyproject.toml`` (``[tool.packlab] no-deps``) for the packages its writer and reader
really import.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from packlab import data, pack, paths
from packlab.loaders.batching import collate_uint8_images
from packlab.transforms import decode_and_resize

#: Shard sizes: MDS's default (its docs: "50-100 MB work well") and the same for LitData's chunks.
SHARD_BYTES = 67_000_000
COLUMNS = {"key": "str", "cls": "int", "jpg": "bytes"}


def _quiet_imports() -> None:
    os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")
    warnings.filterwarnings("ignore", message=".*newer version of lightning-sdk.*")
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    # LitData's writer imports tqdm.auto, which in a notebook kernel without ipywidgets warns that it
    # falls back to a text bar: nothing a reader of the chapter can act on.
    warnings.filterwarnings("ignore", message="IProgress not found")


def _rows(samples: Sequence[data.Sample], root: Path | None, seed: int):
    """The samples in the course's shuffled writing order, as ``{key, cls, jpg}`` rows."""
    for sample in pack.shuffled(samples, seed):
        yield {"key": sample.key, "cls": sample.label, "jpg": data.image_path(sample.key, root).read_bytes()}


def write_mds(out_dir: Path, samples: Sequence[data.Sample] | None = None, root: Path | None = None, seed: int = 0,
              size_limit: int = SHARD_BYTES) -> Path:
    """Write ``samples`` (default: the whole manifest) as MDS shards in ``out_dir``, in the course's shuffled order."""
    _quiet_imports()
    from streaming import MDSWriter

    samples = data.load_manifest(root) if samples is None else samples
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    with MDSWriter(out=str(out_dir), columns=COLUMNS, size_limit=size_limit) as writer:
        for row in _rows(samples, root, seed):
            writer.write(row)
    return out_dir


def write_litdata(out_dir: Path, samples: Sequence[data.Sample] | None = None, root: Path | None = None, seed: int = 0,
                  chunk_bytes: int = SHARD_BYTES) -> Path:
    """Write ``samples`` as LitData chunks in ``out_dir`` (its ``BinaryWriter``, what ``litdata.optimize`` runs per worker)."""
    _quiet_imports()
    from litdata.streaming.writer import BinaryWriter

    samples = data.load_manifest(root) if samples is None else samples
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    writer = BinaryWriter(str(out_dir), chunk_bytes=chunk_bytes)
    for index, row in enumerate(_rows(samples, root, seed)):
        writer[index] = row
    writer.done()
    writer.merge()
    return out_dir


def _ensure(kind: str, write: Callable, root: Path | None, samples, name: str) -> Path:
    """``<data root>/packed/<name>``, written by ``write`` unless a complete copy of the same samples is there."""
    samples = data.load_manifest(root) if samples is None else list(samples)
    folder = paths.packed_dir(root) / name
    marker = folder / ".packlab-complete"
    wanted = f"{kind} {len(samples)} {data.sha256_file(paths.manifest_path(root))[:12]} {samples[0].key} {samples[-1].key}"
    if marker.exists() and marker.read_text() == wanted:
        return folder
    write(folder, samples=samples, root=root)
    marker.write_text(wanted)
    return folder


def ensure_mds(root: Path | None = None, samples=None, name: str = "mds") -> Path:
    """The dataset (or ``samples``) as MDS shards in ``<data root>/packed/<name>``, written once."""
    return _ensure("mds", write_mds, root, samples, name)


def ensure_litdata(root: Path | None = None, samples=None, name: str = "litdata") -> Path:
    """The dataset (or ``samples``) as LitData chunks in ``<data root>/packed/<name>``, written once."""
    return _ensure("litdata", write_litdata, root, samples, name)


# ------------------------------------------------------------------------------ reading


def _item(row: dict, transform: Callable, with_key: bool):
    image = transform(row["jpg"], row["key"])
    return (image, int(row["cls"]), row["key"]) if with_key else (image, int(row["cls"]))


#: How many times :func:`registered_mds` builds an MDS dataset before giving up.
MDS_REGISTRATION_ATTEMPTS = 20


def registered_mds(make: Callable, attempts: int = MDS_REGISTRATION_ATTEMPTS):
    """``make()`` (which builds an MDS ``StreamingDataset``), again if another job took its shared-memory name.

    Every MDS dataset registers itself in ``/dev/shm`` under a numbered prefix
    (``000042_locals`` and five more). ``streaming/base/shared/prefix.py`` picks the number by
    walking the names that exist from 0 upwards and taking the first free one, then creates
    it: looking and creating are two steps, so two jobs that start a dataset at the same
    moment on one machine (two notebooks on a hub, two ranks of different jobs) can pick the
    same number, and the second one's ``__init__`` fails with ``FileExistsError`` before it
    has created anything. Building it again picks the next free number.
    """
    import random
    import time

    for attempt in range(attempts):
        try:
            return make()
        except FileExistsError as error:
            if attempt == attempts - 1:
                raise RuntimeError(
                    f"MDS could not register its shared memory in /dev/shm after {attempts} tries ({error}): "
                    "other jobs on this machine keep taking the same names. Start this one again when they "
                    "have started; if no MDS job is running, the names are left over from killed ones, and "
                    "removing /dev/shm/[0-9]*_* frees them.") from error
            time.sleep(random.uniform(0.01, 0.2))  # apart from the job that took the name, so the next look differs


def mds_dataset(folder: Path, batch_size: int = 64, seed: int = 0, shuffle: bool = True,
                transform: Callable = decode_and_resize, with_key: bool = False, shuffle_algo: str = "py1e",
                **options):
    """An MDS ``StreamingDataset`` over a local folder whose items are ``(image, label[, key])``.

    MDS's documented way to change what an item is: subclass and override ``get_item``
    (as its own ``streaming.vision`` datasets do). ``batch_size`` must be the DataLoader's:
    MDS deals samples out to workers in whole batches.
    """
    _quiet_imports()
    from streaming import StreamingDataset

    class Images(StreamingDataset):
        def get_item(self, index: int, retry: int = 7):
            return _item(super().get_item(index, retry), transform, with_key)

    return registered_mds(lambda: Images(local=str(folder), batch_size=batch_size, shuffle=shuffle, shuffle_seed=seed,
                                         shuffle_algo=shuffle_algo, **options))


def mds_loader(folder: Path, workers: int = 2, batch_size: int = 64, seed: int = 0,
               transform: Callable = decode_and_resize, with_key: bool = False, collate_fn: Callable | None = None,
               **options):
    """MDS's ``StreamingDataLoader`` (a DataLoader that counts samples for ``state_dict``) over :func:`mds_dataset`.

    With the default ``transform`` batches are the course's standard float batches (uint8
    pixels collated into floats once per batch, :func:`collate_uint8_images`).
    """
    from streaming import StreamingDataLoader

    dataset = mds_dataset(folder, batch_size, seed, transform=transform, with_key=with_key, **options)
    if collate_fn is None and transform is decode_and_resize and not with_key:
        collate_fn = collate_uint8_images
    return StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers,
                               multiprocessing_context="fork" if workers else None, collate_fn=collate_fn,
                               persistent_workers=False)


def litdata_dataset(folder: Path, seed: int = 0, shuffle: bool = True, transform: Callable = decode_and_resize,
                    with_key: bool = False, **options):
    """A LitData ``StreamingDataset`` over a local folder whose items are ``(image, label[, key])`` (its ``transform=``)."""
    _quiet_imports()
    import litdata

    return litdata.StreamingDataset(str(folder), shuffle=shuffle, seed=seed,
                                    transform=lambda row: _item(row, transform, with_key), **options)


def litdata_loader(folder: Path, workers: int = 2, batch_size: int = 64, seed: int = 0,
                   transform: Callable = decode_and_resize, with_key: bool = False, collate_fn: Callable | None = None,
                   **options):
    """LitData's ``StreamingDataLoader`` over :func:`litdata_dataset` (standard float batches by default)."""
    import litdata

    dataset = litdata_dataset(folder, seed, transform=transform, with_key=with_key, **options)
    if collate_fn is None and transform is decode_and_resize and not with_key:
        collate_fn = collate_uint8_images
    kwargs = {"collate_fn": collate_fn} if collate_fn is not None else {}
    return litdata.StreamingDataLoader(dataset, batch_size=batch_size, num_workers=workers, **kwargs)


def key_batches(loader) -> list[tuple]:
    """``(images, labels, keys)`` batches of a loader whose items are ``(image, label, key)``, however it collates.

    The default collate turns a list of tuples into ``[images, labels, keys]``; LitData's
    keeps lists. Either way this returns what :func:`packlab.audit.records_from_batches` reads.
    """
    out = []
    for batch in loader:
        images, labels, keys = batch
        out.append((images, labels, list(keys)))
    return out

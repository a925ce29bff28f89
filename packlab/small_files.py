"""The small-file penalty: a JPEG folder, a zip and tar shards read from slow storage.

Chapter 7 and ``make bench`` measure it with :func:`small_file_penalty`: the same samples
in three layouts, the zip through two readers (``zipfile``'s, which asks for a member's
header and then its data, and positional reads from the central directory's offsets,
one request per member), read without decoding, once cold from this machine's disk and
once through :class:`packlab.storage.NetworkFSModel`, beside what the model predicts.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import asdict

import torch

from packlab import cpus
from packlab.bench import time_loader

#: The layouts :func:`small_file_penalty` reads, as its result names them, and how a reader would.
LAYOUTS = {"folder": "JPEG folder", "zip": "zip, ZipFile", "zip_pread": "zip, pread", "tar": "tar shards"}


def small_file_penalty(
    root=None,
    model=None,
    workers: int | None = None,
    folder_files: int = 2000,
    shards: int | None = None,
    cold_level: str | None = None,
    shard_samples: int | None = None,
) -> dict:
    """Reading speed (files/s, no decode) of a JPEG folder, a zip and tar shards on slow storage.

    Two kinds of slow: *cold* (real disk reads after :func:`packlab.storage.make_cold` at
    ``cold_level``, by default the strongest level this process may use; ``"cold_level"``
    in the result says which) and *modelled* (:class:`packlab.storage.NetworkFSModel`, the
    same delays applied to every loader through its ``opener``). Decoding is left out on
    purpose (the transform only counts bytes): this measures the storage pattern, which
    decode time would otherwise hide on a machine with few cores. The folder and the zip
    are read in shuffled order, as a training epoch reads them; the shards in order. The
    folder reads only its first ``folder_files`` files under the model (it is slow there;
    the rate is what counts). ``shards`` reads only the first that many tar shards, and the
    folder and the zip only the samples those hold, so a chapter can repeat the whole
    measurement in less time; ``shard_samples`` writes (once) and reads ``shards`` shards of
    that many samples, from the start of the manifest, instead of the course's shards of
    1,000. Every layout is read by ``workers`` DataLoader workers: by default the course's
    cores, but no more than the shards read nor the folder's batches (``"workers"`` in the
    result). Returns measured rates, the model's parameters and its prediction.
    """
    from torch.utils.data import DataLoader

    from packlab import data, pack, storage
    from packlab.loaders import JpegFolderDataset, PreadZipDataset, TarShardDataset, ZipDataset
    from packlab.loaders.tar import skip_decode

    model = model or storage.NetworkFSModel()
    manifest = data.load_manifest(root)
    if shard_samples is None:
        most_readers = cpus.course_cores() if workers is None else workers
        all_shards = [str(p) for p in pack.ensure_tar_shards(maxcount=shard_size_for(len(manifest), most_readers),
                                                               root=root, progress=False)]
    else:
        all_shards = _small_shards(manifest[: (shards or 1) * shard_samples], shard_samples, root)
    zip_path = pack.ensure_zip(root=root, progress=False)
    shards = all_shards if shards is None else all_shards[:shards]
    if len(shards) < len(all_shards) or shard_samples is not None:  # every layout reads the shards' samples
        held = _keys_in_shards(shards)
        manifest = [s for s in manifest if s.key in held]
    if workers is None:
        # One worker count for every layout, sized by the smallest work: a tar shard has one reader (more readers
        # than shards is an error), and a DataLoader worker reads whole batches of the folder's files.
        workers = cpus.workers_for(len(shards), math.ceil(min(folder_files, len(manifest)) / BATCH_SIZE))

    def rate(dataset, batch_size=BATCH_SIZE) -> float:
        # Map-style datasets are read in shuffled order, as in training; tar shards in order, as designed.
        shuffle = not isinstance(dataset, torch.utils.data.IterableDataset)
        generator = torch.Generator().manual_seed(0)
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                            num_workers=workers, multiprocessing_context="fork" if workers else None)
        return time_loader(loader, epochs=1).images_per_s

    def folder(keys, opener=None):
        return JpegFolderDataset(root, keys=keys, transform=skip_decode, **({"opener": opener} if opener else {}))

    out: dict = {"workers": workers, "images": len(manifest), "model": asdict(model), "model_text": model.describe()}
    all_keys = [s.key for s in manifest]
    some_keys = all_keys[:folder_files]

    # Cold: drop the caches, read every layout once (each from its own files, so each is cold), then the
    # same reads again, warm. The two zip readers read the same file, so the second one gets a drop of its own.
    level = cold_level if cold_level is not None else (storage.cold_levels() or [None])[-1]
    out["cold_level"] = level
    if level is not None:
        images = [data.image_path(k, root) for k in all_keys]
        readers = {
            "folder": (images, lambda: folder(all_keys)),
            "zip": ([zip_path], lambda: ZipDataset(zip_path, keys=all_keys, transform=skip_decode)),
            "tar": (shards, lambda: TarShardDataset(shards, transform=skip_decode)),
            "zip_pread": ([zip_path], lambda: PreadZipDataset(zip_path, keys=all_keys, transform=skip_decode)),
        }
        cold = {}
        for group in (("folder", "zip", "tar"), ("zip_pread",)):
            storage.make_cold([f for name in group for f in readers[name][0]], level)
            for name in group:
                cold[f"{name}_cold"] = rate(readers[name][1]())
            for name in group:
                cold[f"{name}_warm"] = rate(readers[name][1]())
        out["cold_files_per_s"] = cold
    else:
        out["cold_files_per_s"] = None

    modelled = {
        "folder": rate(folder(some_keys, opener=model.open)),
        "zip": rate(ZipDataset(zip_path, keys=all_keys, transform=skip_decode, opener=model.open)),
        "zip_pread": rate(PreadZipDataset(zip_path, keys=all_keys, transform=skip_decode, opener=model.open)),
        "tar": rate(TarShardDataset(shards, transform=skip_decode, opener=model.open)),
    }
    out["modelled_files_per_s"] = modelled
    out["tar_vs_folder_modelled"] = modelled["tar"] / modelled["folder"]
    prediction = storage.predict_reading(model, [s.bytes for s in manifest], [os.path.getsize(p) for p in shards])
    out["prediction"] = prediction
    out["predicted_files_per_s"] = {
        layout: workers_or_one(workers) * rate for layout, rate in prediction["files_per_s"].items()
    }
    # What the prediction assumes away: the files each layout read under the model, and how many of them the
    # busiest reader read (batches of 64 go to the workers in turn; each worker reads its own shards).
    files_read = {"folder": len(some_keys), "zip": len(all_keys), "zip_pread": len(all_keys), "tar": len(all_keys)}
    out["files_read_modelled"] = files_read
    shard_samples_held = [len(_keys_in_shards([shard])) for shard in shards]
    out["busiest_reader_files"] = {
        **{layout: busiest_reader_files(files_read[layout], BATCH_SIZE, workers) for layout in ("folder", "zip", "zip_pread")},
        "tar": max(sum(shard_samples_held[w::workers_or_one(workers)]) for w in range(workers_or_one(workers))),
    }
    return out


#: Samples per batch of :func:`small_file_penalty`'s loaders.
BATCH_SIZE = 64


def busiest_reader_files(files: int, batch_size: int, workers: int) -> int:
    """Files the busiest reader reads when ``files`` are batched by ``batch_size`` for ``workers`` workers.

    A DataLoader hands its batches to the workers in turn, so 100 files in batches of 64
    give one worker 64 and the other 36: the epoch lasts as long as the 64 take, not the 50
    an even split would give. With no workers the main process reads them all.
    """
    readers = workers_or_one(workers)
    sizes = [min(batch_size, files - start) for start in range(0, files, batch_size)]
    return max(sum(sizes[w::readers]) for w in range(readers)) if sizes else 0


def sleep_overshoot_s(seconds: float, times: int = 50) -> float:
    """How much longer than asked ``time.sleep(seconds)`` takes here: the median of ``times`` sleeps.

    The network model waits with ``time.sleep``; the kernel wakes a sleeper a little after
    the time asked (timer slack, then a turn on a core), more so on a busy machine.
    """
    import statistics
    import time

    extra = []
    for _ in range(times):
        start = time.perf_counter()
        time.sleep(seconds)
        extra.append(time.perf_counter() - start - seconds)
    return statistics.median(extra)


def worker_start_s(workers: int) -> float:
    """Seconds from creating a DataLoader's iterator to its first batch, with nothing to read.

    What every epoch of the measurement pays before any reading: starting ``workers``
    workers (``fork``) and a first round trip through them.
    """
    import time

    from torch.utils.data import DataLoader

    loader = DataLoader(list(range(workers_or_one(workers))), batch_size=1, num_workers=workers,
                        multiprocessing_context="fork" if workers else None)
    start = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    seconds = time.perf_counter() - start
    del iterator  # the workers stop here
    return seconds


def _small_shards(samples, shard_samples: int, root) -> list[str]:
    """Shards of ``shard_samples`` holding ``samples``, written once into their own folder and then reused."""
    import shutil

    from packlab import pack, paths

    folder = paths.packed_dir(root) / f"penalty-{len(samples)}-in-shards-of-{shard_samples}"
    expected = -(-len(samples) // shard_samples)
    found = sorted(folder.glob("shard-*.tar"))
    if len(found) != expected:  # not written yet, or cut short
        shutil.rmtree(folder, ignore_errors=True)
        found = pack.write_tar_shards(folder, samples=samples, maxcount=shard_samples, root=root, progress=False)
    return [str(p) for p in found]


def _keys_in_shards(shards: Sequence[str]) -> set[str]:
    """The keys of the samples the given tar shards hold (read from their headers alone)."""
    import tarfile

    from packlab.loaders.tar import IMAGE_EXTENSION, split_key

    keys = set()
    for shard in shards:
        with tarfile.open(shard, mode="r:") as tar:
            keys.update(split_key(m.name)[0] for m in tar if m.isfile() and split_key(m.name)[1] == IMAGE_EXTENSION)
    return keys


def shard_size_for(images: int, max_workers: int) -> int:
    """The course's shard size (:func:`packlab.pack.course_shard_size`: 1,000 samples at 10,000 images), or
    fewer when a small dataset would give a worker no shard."""
    from packlab import pack  # imported where used, as in the functions above

    return max(1, min(pack.course_shard_size(images), images // (2 * max(1, max_workers))))


def workers_or_one(workers: int) -> int:
    """Readers working in parallel: the workers, or the main process when there are none."""
    return max(1, workers)

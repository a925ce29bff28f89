"""The checks are fair both ways: wrong implementations fail, correct alternatives pass.

Each wrong class or function here is a mistake people make when they write these
loaders. Every one must fail its check, on the part that names the mistake, while the
parts it gets right still pass. The correct alternatives are written differently from
the solutions (other seeding, other buffer, a dataclass, computed constants in a notebook
cell) and must pass every part. The classes live at module level so that spawn workers
can import them (this module is on ``sys.path``, which spawn workers inherit).

Wrong implementations whose mistake has nothing to do with pickling skip the slow
``spawn`` parts (``check(..., parts=[...])``); every check still runs whole at least
once here or in tests/test_exercises.py.
"""

from __future__ import annotations

import csv
import inspect
import io
import json
import linecache
import os
import random
import subprocess
import sys
import tarfile
import time
import traceback
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from packlab import data, paths
from packlab.course.grading import check, importable_copy, list_checks, PartFailed, RESULTS_ENV_VAR
from packlab.course.grading.core import describe
from packlab.loaders.tar import SharedEpoch, iter_shard_samples, open_shard
from packlab.transforms import decode_and_resize, standard_transform
from grading_support import SharedEpochReader

ALL_BUT_SPAWN = {
    "per_worker_zip": ["no_handle_in_init", "pickle_after_use", "pixels", "fork", "fork_after_parent_read", "close"],
    "tar_dataset": ["one_process", "fork_3_workers", "shuffle_epochs", "shard_order", "reproducible", "seeded",
                    "bounded_buffer", "truncated_shard", "streamed", "persistent_workers"],
}


def failed_parts(result) -> set[str]:
    return {part.name for part in result.parts if not part.passed}


def message_of(result, name: str) -> str:
    (part,) = [p for p in result.parts if p.name == name]
    return part.message


def run(check_id, candidate, **kwargs):
    return check(check_id, candidate, quiet=True, record=False, **kwargs)


def exec_as_cell(source: str, label: str) -> dict:
    """Run ``source`` as one notebook cell would run: in ``__main__``, its text in linecache."""
    filename = f"<{label}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def _labels_from_archive(archive: zipfile.ZipFile) -> dict[str, int]:
    text = archive.read("labels.csv").decode()
    return {row["key"]: int(row["label"]) for row in csv.DictReader(io.StringIO(text))}


# ------------------------------------------------------------- 1. wrong labels (JPEG folder)


class IndexLabelDataset(Dataset):
    """Wrong labels: the label is made up from the index instead of looked up by key."""

    def __init__(self, keys=None, transform=None, return_key=False):
        with open(paths.labels_path(), newline="") as f:
            self.keys = [row["key"] for row in csv.DictReader(f)] if keys is None else list(keys)
        self.transform = transform or standard_transform
        self.return_key = return_key

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, index):
        key = self.keys[index]
        image = self.transform(data.image_path(key).read_bytes())
        return (image, index % 10, key) if self.return_key else (image, index % 10)


def test_wrong_labels_fail_the_jpeg_dataset_check():
    result = run("jpeg_dataset", IndexLabelDataset)
    assert not result.passed
    assert "labels_pixels" in failed_parts(result) and "length" not in failed_parts(result)
    (part,) = [p for p in result.parts if p.name == "labels_pixels"]
    assert "with the wrong label" in part.message


def clock_after_first_batch(loader, epochs=2):
    """Wrong timing: the clock starts once the first batch is in, hiding worker start-up."""
    seconds, count = [], 0
    for _ in range(epochs):
        count, start = 0, None
        for batch in loader:
            start = start or time.perf_counter()
            count += len(batch[0])
        seconds.append(time.perf_counter() - start)
    return {"epoch_seconds": seconds, "images_per_epoch": count, "images_per_s": count * epochs / sum(seconds)}


def batches_times_size(loader, epochs=2):
    """Wrong count: number of batches times the nominal batch size overcounts the last batch."""
    start = time.perf_counter()
    seconds = []
    for _ in range(epochs):
        for _batch in loader:
            pass
        seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
    images = len(loader) * loader.batch_size
    return {"epoch_seconds": seconds, "images_per_epoch": images, "images_per_s": images * epochs / sum(seconds)}


def test_timing_mistakes_fail_the_timing_check():
    assert failed_parts(run("jpeg_timing", clock_after_first_batch)) == {"startup"}
    assert failed_parts(run("jpeg_timing", batches_times_size)) == {"images"}


class SortingKeysDataset(IndexLabelDataset):
    """Right labels, but the keys given are sorted: a shuffled or grouped key list loses its order."""

    def __init__(self, keys=None, transform=None, return_key=False):
        super().__init__(sorted(keys) if keys is not None else None, transform, return_key)
        self.labels = data.load_labels()

    def __getitem__(self, index):
        key = self.keys[index]
        image = self.transform(data.image_path(key).read_bytes())
        return (image, self.labels[key], key) if self.return_key else (image, self.labels[key])


def test_a_dataset_that_sorts_the_keys_given_fails_items():
    result = run("jpeg_dataset", SortingKeysDataset)
    assert failed_parts(result) == {"items"}
    assert "the keys were sorted" in message_of(result, "items")


def last_epoch_rate(loader, epochs=2):
    """Wrong rate: images/s of the last epoch alone (right only when every epoch takes as long)."""
    seconds, count = [], 0
    for _ in range(epochs):
        count, start = 0, time.perf_counter()
        for batch in loader:
            count += len(batch[0])
        seconds.append(time.perf_counter() - start)
    return {"epoch_seconds": seconds, "images_per_epoch": count, "images_per_s": count / seconds[-1]}


def time_epochs_differently(loader, epochs=2):
    """A correct harness written differently: time.monotonic, an explicit iterator, totals kept as it goes."""
    laps, total_images, total_seconds = [], 0, 0.0
    for _ in range(epochs):
        began = time.monotonic()
        iterator = iter(loader)
        images = sum(batch[0].shape[0] for batch in iterator)
        lap = time.monotonic() - began
        laps.append(lap)
        total_images += images
        total_seconds += lap
    return {"epoch_seconds": laps, "images_per_epoch": total_images // epochs, "images_per_s": total_images / total_seconds}


def test_a_rate_from_the_last_epoch_alone_fails_and_a_different_correct_harness_passes():
    result = run("jpeg_timing", last_epoch_rate)
    assert failed_parts(result) == {"rate"}
    assert "the rate of a single epoch, not of all 3" in message_of(result, "rate")
    assert run("jpeg_timing", time_epochs_differently).passed


# ------------------------------------------------------------------------- 2. zip packing


def pack_deflated_chw(dst, samples, members="jpeg"):
    """Two mistakes: members compressed, and raw pixels stored channels-first (3x256x256)."""
    with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("labels.csv", "key,label\n" + "".join(f"{s.key},{s.label}\n" for s in samples))
        for s in samples:
            jpeg = data.image_path(s.key).read_bytes()
            if members == "jpeg":
                archive.writestr(f"{s.key}.jpg", jpeg)
            else:
                archive.writestr(f"{s.key}.raw", decode_and_resize(jpeg).transpose(2, 0, 1).tobytes())
    return dst


def test_packing_mistakes_fail_the_zip_pack_check():
    assert failed_parts(run("zip_pack", pack_deflated_chw)) == {"raw_members", "stored"}


class LabelsFromFolderZipDataset(Dataset):
    """Reads images from the zip but labels from the data folder: the archive is not self-contained."""

    def __init__(self, zip_path, members="jpeg", keys=None, return_key=False):
        self.archive = zipfile.ZipFile(zip_path)
        self.labels = data.load_labels()
        names = [n[:-4] for n in self.archive.namelist() if n.endswith((".jpg", ".raw"))]
        self.keys = sorted(names) if keys is None else list(keys)
        self.suffix, self.return_key = (".jpg" if members == "jpeg" else ".raw"), return_key

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, index):
        from packlab.transforms import pixels_to_tensor

        key = self.keys[index]
        raw = self.archive.read(key + self.suffix)
        image = standard_transform(raw) if self.suffix == ".jpg" else pixels_to_tensor(raw)
        return (image, self.labels[key], key) if self.return_key else (image, self.labels[key])


def test_labels_from_outside_the_archive_fail_self_contained():
    assert failed_parts(run("zip_dataset", LabelsFromFolderZipDataset)) == {"self_contained"}


class RawAsJpegZipDataset(Dataset):
    """Decodes every member with the JPEG decoder, also the .raw members that hold pixels."""

    def __init__(self, zip_path, members="jpeg", keys=None, return_key=False):
        with zipfile.ZipFile(zip_path) as archive:
            self.labels = _labels_from_archive(archive)
        self.zip_path, self.keys = zip_path, list(self.labels) if keys is None else list(keys)
        self.suffix, self.return_key = (".jpg" if members == "jpeg" else ".raw"), return_key

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, index):
        key = self.keys[index]
        with zipfile.ZipFile(self.zip_path) as archive:
            image = standard_transform(archive.read(key + self.suffix), source=key + self.suffix)
        return (image, self.labels[key], key) if self.return_key else (image, self.labels[key])


def test_decoding_raw_members_as_jpeg_points_at_the_code_not_the_data():
    result = run("zip_dataset", RawAsJpegZipDataset, parts=["jpeg_epoch", "raw_epoch"])
    assert failed_parts(result) == {"raw_epoch"}
    message = message_of(result, "raw_epoch")
    assert "cannot decode image" in message and "pixels_to_tensor" in message
    assert "--verify" not in message


# --------------------------------------------------------------- 3. the zip handle pitfall


class SharedZipDataset(Dataset):
    """The pitfall: a ZipFile opened in __init__ and shared by every worker."""

    def __init__(self, zip_path, keys=None, transform=None, return_key=False):
        self.archive = zipfile.ZipFile(zip_path)
        self.labels = _labels_from_archive(self.archive)
        self.keys = list(self.labels) if keys is None else list(keys)
        self.transform = transform or standard_transform
        self.return_key = return_key

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, index):
        key = self.keys[index]
        image = self.transform(self.archive.read(f"{key}.jpg"))
        return (image, self.labels[key], key) if self.return_key else (image, self.labels[key])

    def close(self):
        self.archive.close()


def test_zipfile_opened_in_init_and_shared_fails():
    result = run("per_worker_zip", SharedZipDataset)
    assert not result.passed
    failed = failed_parts(result)
    assert {"no_handle_in_init", "pickle_after_use", "fork", "fork_after_parent_read", "spawn"} <= failed
    assert "pixels" not in failed  # without workers it reads correctly
    messages = {p.name: p.message for p in result.parts}
    assert "cannot pickle" in messages["spawn"] or "pickl" in messages["spawn"]
    assert "open handle" in messages["no_handle_in_init"]


class LazyUnkeyedZipDataset(SharedZipDataset):
    """Half a fix: opened lazily, but one handle for whichever process opened it first."""

    def __init__(self, zip_path, keys=None, transform=None, return_key=False):
        with zipfile.ZipFile(zip_path) as archive:
            self.labels = _labels_from_archive(archive)
        self.zip_path, self.archive = zip_path, None
        self.keys = list(self.labels) if keys is None else list(keys)
        self.transform = transform or standard_transform
        self.return_key = return_key

    def __getitem__(self, index):
        if self.archive is None:
            self.archive = zipfile.ZipFile(self.zip_path)
        return super().__getitem__(index)

    def close(self):
        if self.archive is not None:
            self.archive.close()
            self.archive = None


def test_lazy_handle_not_keyed_by_process_fails_once_the_parent_has_read():
    failed = failed_parts(run("per_worker_zip", LazyUnkeyedZipDataset))
    # Fine while only workers open it; the parent's handle, inherited by forked workers,
    # is caught every time (the check cuts inherited handles), not only when reads collide.
    assert "fork" not in failed and "no_handle_in_init" not in failed
    assert {"fork_after_parent_read", "pickle_after_use", "spawn"} <= failed


# ------------------------------------------------------------------------ 4. tar shards


def write_shards_unshuffled(dst_dir, samples, maxcount=1000, seed=0):
    """Shards cut in the order given: class-sorted input gives class-sorted shards."""
    from pathlib import Path

    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for index, start in enumerate(range(0, len(samples), maxcount)):
        path = dst_dir / f"shard-{index:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for s in sorted(samples[start : start + maxcount], key=lambda s: s.key):
                for name, payload in ((f"{s.key}.cls", str(s.label).encode()), (f"{s.key}.jpg", data.image_path(s.key).read_bytes())):
                    info = tarfile.TarInfo(name)
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        written.append(path)
    return written


def test_shards_written_without_shuffling_fail():
    result = run("tar_write", write_shards_unshuffled)
    assert failed_parts(result) == {"shuffled", "seeded", "sample_order"}


def _add(tar, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def write_shards_jpg_first(dst_dir, samples, maxcount=1000, seed=0):
    """A correct writer written differently: numpy's permutation, each sample's .jpg before its .cls."""
    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    order = [samples[i] for i in np.random.default_rng(seed).permutation(len(samples))]
    paths_written = []
    for number in range(-(-len(order) // maxcount)):
        path = dst_dir / f"shard-{number:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for s in order[number * maxcount : (number + 1) * maxcount]:
                _add(tar, f"{s.key}.jpg", data.image_path(s.key).read_bytes())
                _add(tar, f"{s.key}.cls", f"{s.label}\n".encode())
        paths_written.append(path)
    return paths_written


def write_shards_sorted_by_key(dst_dir, samples, maxcount=1000, seed=0):
    """Shuffled and cut right, but each shard re-sorted by key (what tar --sort=name does)."""
    order = list(samples)
    random.Random(seed).shuffle(order)
    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for number, start in enumerate(range(0, len(order), maxcount)):
        path = dst_dir / f"shard-{number:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for s in sorted(order[start : start + maxcount], key=lambda s: s.key):
                _add(tar, f"{s.key}.cls", str(s.label).encode())
                _add(tar, f"{s.key}.jpg", data.image_path(s.key).read_bytes())
        written.append(path)
    return written


def write_shards_shuffling_in_place(dst_dir, samples, maxcount=1000, seed=0):
    """Right shards, but the caller's list is shuffled in place: the next call starts from another order."""
    random.Random(seed).shuffle(samples)
    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for number, start in enumerate(range(0, len(samples), maxcount)):
        path = dst_dir / f"shard-{number:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for s in samples[start : start + maxcount]:
                _add(tar, f"{s.key}.cls", str(s.label).encode())
                _add(tar, f"{s.key}.jpg", data.image_path(s.key).read_bytes())
        written.append(path)
    return written


def test_a_writer_with_each_samples_files_adjacent_in_shuffled_order_passes():
    result = run("tar_write", write_shards_jpg_first)
    assert result.passed, result.report()


def test_a_writer_that_sorts_each_shard_by_key_fails_sample_order():
    result = run("tar_write", write_shards_sorted_by_key)
    assert failed_parts(result) == {"sample_order"}
    assert "sorted by key" in message_of(result, "sample_order")


def test_a_writer_that_shuffles_the_callers_list_in_place_is_told_so():
    result = run("tar_write", write_shards_shuffling_in_place)
    assert failed_parts(result) == {"seeded"}
    assert "reordered the list it was given" in message_of(result, "seeded")


def _tar_records(path, opener=None):
    """``(key, jpg, label)`` of a shard, through the course's reader (it notices truncated shards, never seeks)."""
    for sample in iter_shard_samples(str(path), opener or open_shard):
        yield sample.key, sample.image_bytes, sample.label


def _tar_records_silently(path, opener=None):
    """The same through tarfile's stream mode, which stops without a word where a shard is cut short."""
    with (opener or open_shard)(str(path)) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        yield from _tar_records_from(tar)


class NoSplitTarDataset(IterableDataset):
    """A tar reader without worker split: every worker reads every shard."""

    def __init__(self, shards, shuffle_buffer=0, seed=0, transform=None, return_key=False, opener=None):
        self.shards, self.shuffle_buffer, self.seed = list(shards), shuffle_buffer, seed
        self.transform, self.return_key, self.opener = transform or standard_transform, return_key, opener
        self.shared_epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch):
        self.shared_epoch[0] = epoch

    @property
    def epoch(self):
        return int(self.shared_epoch[0])

    def shard_list(self):
        shards = list(self.shards)
        if self.shuffle_buffer:
            random.Random(self.seed * 1000 + self.epoch).shuffle(shards)
        return shards

    def records(self):
        for path in self.shard_list():
            yield from _tar_records(path, self.opener)

    def __iter__(self):
        records = list(self.records())
        if self.shuffle_buffer:
            info = get_worker_info()
            random.Random(self.seed * 1000 + self.epoch + 7 * (info.id if info else 0)).shuffle(records)
        for key, jpg, label in records:
            image = self.transform(jpg)
            yield (image, label, key) if self.return_key else (image, label)


def test_tar_reader_without_worker_split_fails():
    result = run("tar_dataset", NoSplitTarDataset)
    failed = failed_parts(result)
    assert {"fork_3_workers", "spawn_2_workers"} <= failed
    assert "one_process" not in failed
    (part,) = [p for p in result.parts if p.name == "fork_3_workers"]
    assert "once per worker" in part.message


class PerWorkerSeedTarDataset(NoSplitTarDataset):
    """Splits by worker, but shuffles the shard list with a per-worker seed first: shares overlap."""

    def shard_list(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        shards = list(self.shards)
        if self.shuffle_buffer:
            random.Random(self.seed * 1000 + self.epoch + worker).shuffle(shards)
        return shards[worker::workers]


class WholeShardShuffleTarDataset(PerWorkerSeedTarDataset):
    """Splits correctly, but shuffles by loading everything: no bounded buffer."""

    def shard_list(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        shards = list(self.shards)
        if self.shuffle_buffer:
            random.Random(self.seed * 1000 + self.epoch).shuffle(shards)
        return shards[worker::workers]


def test_tar_shuffle_mistakes_fail():
    quick = dict(part_timeout=60, parts=ALL_BUT_SPAWN["tar_dataset"])
    per_worker = run("tar_dataset", PerWorkerSeedTarDataset, **quick)
    assert "shuffle_epochs" in failed_parts(per_worker)
    assert {"one_process", "fork_3_workers"}.isdisjoint(failed_parts(per_worker))
    whole = run("tar_dataset", WholeShardShuffleTarDataset, **quick)
    assert failed_parts(whole) == {"bounded_buffer"}


def pick_from_buffer(items, size, rng):
    """A shuffle buffer written differently: append, and once it holds more than ``size``, pop a random item."""
    buffer = []
    for item in items:
        buffer.append(item)
        if len(buffer) > size:
            yield buffer.pop(rng.randrange(len(buffer)))
    while buffer:
        yield buffer.pop(rng.randrange(len(buffer)))


class AlternativeTarDataset(SharedEpochReader, IterableDataset):
    """A correct reader written differently from the solution: the course's shard reader and epoch
    (``SharedEpoch``), string seeds, another buffer."""

    def __init__(self, shards, shuffle_buffer=0, seed=0, transform=None, return_key=False, opener=None):
        self.shards, self.shuffle_buffer, self.seed = [str(s) for s in shards], shuffle_buffer, seed
        self.transform, self.return_key, self.opener = transform or standard_transform, return_key, opener
        self.shared_epoch = SharedEpoch()

    def shard_order(self):
        shards = list(self.shards)
        if self.shuffle_buffer:
            random.Random(f"shards {self.seed} {self.epoch}").shuffle(shards)
        return shards

    def buffer_rng(self, worker):
        return random.Random(f"buffer {self.seed} {self.epoch} {worker}")

    def records(self, path):
        return _tar_records(path, self.opener)

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        records = (r for path in self.shard_order()[worker::workers] for r in self.records(path))
        if self.shuffle_buffer:
            records = pick_from_buffer(records, self.shuffle_buffer, self.buffer_rng(worker))
        for key, jpg, label in records:
            image = self.transform(jpg)
            yield (image, label, key) if self.return_key else (image, label)


class PidSeededBufferTarDataset(AlternativeTarDataset):
    """The buffer's generator is seeded from the process id: each run of workers shuffles differently."""

    def buffer_rng(self, worker):
        return random.Random(os.getpid())


class SeedIgnoringTarDataset(AlternativeTarDataset):
    """Shuffles by epoch, but ignores ``seed``: every seed gives the same order."""

    def shard_order(self):
        shards = list(self.shards)
        if self.shuffle_buffer:
            random.Random(f"shards {self.epoch}").shuffle(shards)
        return shards

    def buffer_rng(self, worker):
        return random.Random(f"buffer {self.epoch} {worker}")


class FixedShardOrderTarDataset(AlternativeTarDataset):
    """Shuffles through the buffer only: the shards are read in the listed order every epoch."""

    def shard_order(self):
        return list(self.shards)


class SilentTruncationTarDataset(AlternativeTarDataset):
    """Reads with tarfile's stream mode and nothing more: a truncated shard loses samples silently."""

    def records(self, path):
        return _tar_records_silently(path, self.opener)


class UnnamedTruncationTarDataset(AlternativeTarDataset):
    """Notices a short shard (the check's shards hold 30 samples), but its error does not say which shard."""

    def records(self, path):
        count = 0
        for record in _tar_records_silently(path, self.opener):
            count += 1
            yield record
        if count not in (0, 30):
            raise RuntimeError(f"only {count} samples: the archive is truncated")


class PlainAttributeEpochTarDataset(AlternativeTarDataset):
    """Correct but for ``set_epoch``: a plain attribute, which persistent workers never see change."""

    def set_epoch(self, epoch):
        self.plain_epoch = epoch

    @property
    def epoch(self):
        return getattr(self, "plain_epoch", 0)


class PassCountingTarDataset(PlainAttributeEpochTarDataset):
    """Works around the plain attribute by counting its own passes, as webdataset's detshuffle does:
    right only while every epoch is set, in order, from 0."""

    @property
    def epoch(self):
        return getattr(self, "plain_epoch", 0) + getattr(self, "passes", 0)

    def __iter__(self):
        iterator = super().__iter__()
        self.passes = getattr(self, "passes", 0) + 1
        return iterator


class SeekingEndCheckTarDataset(AlternativeTarDataset):
    """Reads with tarfile's stream mode, then seeks back to look for the end-of-archive blocks
    (exercise 4's solution until November 2026): right for files, impossible for an HTTP
    response or an S3 object's body."""

    def records(self, path):
        with (self.opener or open_shard)(str(path)) as stream:
            try:
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    yield from _tar_records_from(tar)
                    end = tar.offset
            except tarfile.TarError as exc:
                raise ValueError(f"{path}: truncated or damaged shard ({exc})") from None
            stream.seek(end)
            if stream.read(1024) != bytes(1024):
                raise ValueError(f"{path}: truncated shard, no end-of-archive marker after byte {end}")


def _tar_records_from(tar):
    """``(key, jpg, label)`` from an open stream-mode tarfile."""
    parts, key = {}, None
    for member in tar:
        stem, _, ext = member.name.partition(".")
        if key is not None and stem != key:
            yield key, parts["jpg"], int(parts["cls"])
            parts = {}
        key, parts[ext] = stem, tar.extractfile(member).read()
    if key is not None:
        yield key, parts["jpg"], int(parts["cls"])


def test_a_correct_reader_written_differently_passes_every_part():
    result = run("tar_dataset", AlternativeTarDataset)
    assert result.passed, result.report()


@pytest.mark.parametrize(
    "candidate, parts",
    [
        # A generator seeded from the process id differs between runs, fresh or persistent.
        (PidSeededBufferTarDataset, {"reproducible": "new worker processes", "persistent_workers": "another"}),
        (SeedIgnoringTarDataset, {"seeded": "the same order"}),
        (FixedShardOrderTarDataset, {"shard_order": "in the order listed in every epoch"}),
    ],
)
def test_a_seeding_or_shard_order_mistake_fails_the_part_that_names_it(candidate, parts):
    result = run("tar_dataset", candidate, parts=ALL_BUT_SPAWN["tar_dataset"])
    assert failed_parts(result) == set(parts)
    for part, words in parts.items():
        assert words in message_of(result, part)


def test_a_reader_that_loses_a_truncated_shard_silently_fails():
    silent = run("tar_dataset", SilentTruncationTarDataset, parts=ALL_BUT_SPAWN["tar_dataset"])
    # Read as a stream, the cut shards are lost just as silently: the streamed part fails too.
    assert failed_parts(silent) == {"truncated_shard", "streamed"}
    assert "lost silently" in message_of(silent, "truncated_shard")
    unnamed = run("tar_dataset", UnnamedTruncationTarDataset, parts=["truncated_shard"])
    assert "does not name the shard" in message_of(unnamed, "truncated_shard")


def test_a_set_epoch_that_stores_a_plain_attribute_fails_with_persistent_workers():
    plain = run("tar_dataset", PlainAttributeEpochTarDataset, parts=ALL_BUT_SPAWN["tar_dataset"])
    assert failed_parts(plain) == {"persistent_workers"}
    assert "changed nothing" in message_of(plain, "persistent_workers")
    counting = run("tar_dataset", PassCountingTarDataset, parts=["persistent_workers"])
    assert failed_parts(counting) == {"persistent_workers"}
    assert "in another from 2 persistent workers" in message_of(counting, "persistent_workers")


def test_a_truncation_check_that_seeks_fails_the_streamed_part_only():
    seeking = run("tar_dataset", SeekingEndCheckTarDataset, parts=ALL_BUT_SPAWN["tar_dataset"])
    assert failed_parts(seeking) == {"streamed"}
    assert "seeks the shard's stream" in message_of(seeking, "streamed")


# ------------------------------------------------------------------- 5. rank x worker split


def shards_for_dropping_remainder(shards, rank, world_size, worker_id, num_workers):
    """Equal chunks, truncated: the shards left over by the division are never read."""
    readers = world_size * num_workers
    if len(shards) < readers:
        raise ValueError(f"{len(shards)} shards for {readers} readers")
    per_reader = len(shards) // readers
    start = (rank * num_workers + worker_id) * per_reader
    return list(shards[start : start + per_reader])


class DroppingRankDataset(IterableDataset):
    """Reads its rank's and worker's shards as the dropping split assigns them."""

    def __init__(self, shards, rank, world_size, transform=None, return_key=False):
        self.shards, self.rank, self.world_size = list(shards), rank, world_size
        self.transform, self.return_key = transform or standard_transform, return_key

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for path in shards_for_dropping_remainder(self.shards, self.rank, self.world_size, worker, workers):
            for key, jpg, label in _tar_records(path):
                image = self.transform(jpg)
                yield (image, label, key) if self.return_key else (image, label)


def test_split_that_drops_the_remainder_fails():
    result = run("shard_split", shards_for_dropping_remainder)
    assert "exactly_once" in failed_parts(result)
    (part,) = [p for p in result.parts if p.name == "exactly_once"]
    assert "read by nobody" in part.message
    ranks = run("rank_dataset", DroppingRankDataset)
    assert {"two_ranks", "three_ranks"} <= failed_parts(ranks)
    assert "one_rank" not in failed_parts(ranks)


def shards_for_silently_idle(shards, rank, world_size, worker_id, num_workers):
    """Correct split, but no error when some reader gets nothing."""
    return list(shards[rank::world_size][worker_id::num_workers])


def test_split_without_error_for_too_few_shards_fails():
    assert failed_parts(run("shard_split", shards_for_silently_idle)) == {"too_few_shards"}


def shards_for(shards, rank, world_size, worker_id, num_workers):
    """The correct split: by rank first, then by worker."""
    if len(shards) < world_size * num_workers:
        raise ValueError(f"{len(shards)} shards for {world_size * num_workers} readers")
    return list(shards[rank::world_size][worker_id::num_workers])


class SwappedArgumentsRankDataset(DroppingRankDataset):
    """Calls a correct shards_for with rank/world size and worker/workers swapped: every sample once, wrong ranks."""

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for path in shards_for(self.shards, worker, workers, self.rank, self.world_size):
            for key, jpg, label in _tar_records(path):
                image = self.transform(jpg)
                yield (image, label, key) if self.return_key else (image, label)


def test_rank_dataset_with_swapped_arguments_fails_and_names_the_per_rank_shares():
    result = run("rank_dataset", SwappedArgumentsRankDataset)
    assert failed_parts(result) == {"two_ranks", "three_ranks"}
    message = message_of(result, "three_ranks")
    assert "expected [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]] (samples [80, 60, 60])" in message


# -------------------------------------------------------------- timeouts and runaway loaders


class HangingDataset(Dataset):
    """Never returns an item."""

    def __init__(self, keys=None, transform=None, return_key=False):
        self.keys = list(keys) if keys is not None else [f"{i:06d}" for i in range(10_000)]

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, index):
        time.sleep(3600)


def test_a_hanging_dataset_fails_within_the_time_limit_and_never_hangs():
    start = time.monotonic()
    result = run("jpeg_dataset", HangingDataset, part_timeout=4)
    elapsed = time.monotonic() - start
    assert result.score == 0 and elapsed < 30, elapsed
    first, *rest = result.parts
    assert "did not finish within 4 s" in first.message
    assert all("not run" in p.message for p in rest)


class EndlessRankDataset(DroppingRankDataset):
    """Repeats its shards forever: an epoch that never ends."""

    def __iter__(self):
        while True:
            yield from super().__iter__()


def test_an_endless_epoch_is_cut_short():
    result = run("rank_dataset", EndlessRankDataset, part_timeout=60)
    (part,) = [p for p in result.parts if p.name == "one_rank"]
    assert not part.passed and "did not end" in part.message


def test_a_dataloader_that_stalls_fails_by_its_timeout():
    result = run("per_worker_zip", StallingZipDataset, loader_timeout=3, part_timeout=60)
    (part,) = [p for p in result.parts if p.name == "fork"]
    assert not part.passed and "timed out" in part.message


class StallingZipDataset(SharedZipDataset):
    """Workers stall (a lock that never comes free, say); the main process is fine."""

    def __init__(self, zip_path, keys=None, transform=None, return_key=False):
        super().__init__(zip_path, keys, transform, return_key)
        self.parent = os.getpid()

    def __getitem__(self, index):
        if os.getpid() != self.parent:
            time.sleep(3600)
        return super().__getitem__(index)


class PidKeyedZipDataset(Dataset):
    """A correct per-worker zip dataset: a ZipFile per process id, none pickled."""

    def __init__(self, zip_path, keys=None, transform=None, return_key=False):
        with zipfile.ZipFile(zip_path) as archive:
            self.labels = _labels_from_archive(archive)
        self.zip_path, self.handles = str(zip_path), {}
        self.keys = list(self.labels) if keys is None else list(keys)
        self.transform, self.return_key = transform or standard_transform, return_key

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, index):
        key = self.keys[index]
        if os.getpid() not in self.handles:
            self.handles[os.getpid()] = zipfile.ZipFile(self.zip_path)
        image = self.transform(self.handles[os.getpid()].read(f"{key}.jpg"))
        return (image, self.labels[key], key) if self.return_key else (image, self.labels[key])

    def __getstate__(self):
        return {**self.__dict__, "handles": {}}

    def close(self):
        handle = self.handles.pop(os.getpid(), None)
        if handle is not None:
            handle.close()


class SlowStartingZipDataset(PidKeyedZipDataset):
    """Correct, but each copy takes seconds to unpickle: spawn workers start slowly, as on a busy machine."""

    def __setstate__(self, state):
        time.sleep(4)
        self.__dict__.update(state)


def test_the_start_up_of_spawn_workers_is_not_counted_against_the_batch_timeout():
    result = run("per_worker_zip", SlowStartingZipDataset, parts=["spawn"], loader_timeout=2)
    assert result.passed, result.report()


def test_spawn_workers_that_do_not_start_in_time_are_reported_as_such():
    result = run("per_worker_zip", SlowStartingZipDataset, parts=["spawn"], loader_timeout=2, startup_timeout=1)
    assert "spawn workers did not start within 1 s" in message_of(result, "spawn")


# ------------------------------------------------------------- notebook classes under spawn


def test_notebook_cell_is_rebuilt_as_a_module_for_spawn(tmp_path):
    cell = (
        "import os\n"
        "X = 3\n"
        "print('side effect')\n"
        "class Cell:\n"
        "    def value(self):\n"
        "        return X + len(os.sep)\n"
    )
    filename = "<notebook cell 1>"
    linecache.cache[filename] = (len(cell), None, cell.splitlines(keepends=True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(cell, filename, "exec"), namespace)
    copy = importable_copy(namespace["Cell"], tmp_path)
    assert copy is not namespace["Cell"] and copy.__module__.startswith("_packlab_candidate_")
    assert copy().value() == 4
    source = (tmp_path / f"{copy.__module__}.py").read_text()
    assert "print" not in source  # only definitions, imports and constants are kept


def test_notebook_class_using_another_cells_name_gets_advice(tmp_path):
    cell = "class Needy:\n    def go(self):\n        return helper_from_another_cell()\n"
    filename = "<notebook cell 2>"
    linecache.cache[filename] = (len(cell), None, cell.splitlines(keepends=True), filename)
    namespace = {"__name__": "__main__"}
    exec(compile(cell, filename, "exec"), namespace)
    with pytest.raises(PartFailed, match="helper_from_another_cell.*does not define or import"):
        importable_copy(namespace["Needy"], tmp_path)


def test_module_level_classes_are_used_as_they_are(tmp_path):
    assert importable_copy(SharedZipDataset, tmp_path) is SharedZipDataset


def test_a_computed_constant_the_class_reads_is_kept_and_unrelated_work_is_not(tmp_path):
    cell = (
        "_STRIDE = 2 ** 16\n"
        "_UNUSED = print('side effect')\n"
        "result = len('not read by the class')\n"
        "class Strided:\n"
        "    def step(self):\n"
        "        result = 1  # a local of the same name as a top-level assignment\n"
        "        return _STRIDE * result\n"
    )
    copy = importable_copy(exec_as_cell(cell, "computed constant")["Strided"], tmp_path)
    assert copy().step() == 65536
    source = (tmp_path / f"{copy.__module__}.py").read_text()
    assert "_STRIDE = 2 ** 16" in source and "print" not in source and "not read by the class" not in source


def test_a_dataclass_defined_in_a_cell_is_rebuilt(tmp_path):
    cell = (
        "from dataclasses import dataclass, field\n"
        "\n"
        "@dataclass\n"
        "class Reader:\n"
        "    path: str\n"
        "    handles: dict = field(default_factory=dict)\n"
        "\n"
        "    def name(self):\n"
        "        return self.path.upper()\n"
    )
    copy = importable_copy(exec_as_cell(cell, "dataclass cell")["Reader"], tmp_path)
    assert copy("a.zip").name() == "A.ZIP" and repr(copy("x")) == "Reader(path='x', handles={})"


def test_errors_in_a_rebuilt_cell_name_the_cells_own_line(tmp_path):
    cell = (
        "import os\n"
        "print('work the module must not redo')\n"
        "\n"
        "class Failing:\n"
        "    # fails on line 7 of its cell\n"
        "    def read(self):\n"
        "        raise ValueError(os.sep + ' cannot be read')\n"
    )
    copy = importable_copy(exec_as_cell(cell, "failing cell")["Failing"], tmp_path)
    with pytest.raises(ValueError) as raised:
        copy().read()
    (frame,) = [f for f in traceback.extract_tb(raised.value.__traceback__) if f.name == "read"]
    assert frame.lineno == 7 and frame.line == "raise ValueError(os.sep + ' cannot be read')"
    assert "(in read, line 7 of your code)" in describe(raised.value)


# A notebook cell as an attendee might write it: a dataclass, and a constant computed from others.
DATACLASS_CELL = """
import csv
import io
import os
import zipfile
from dataclasses import dataclass, field

from torch.utils.data import Dataset

from packlab.transforms import standard_transform

_KEY_WIDTH = len("000000")
_MEMBER = "{key:0" + str(_KEY_WIDTH) + "d}.jpg"


@dataclass
class CellZipDataset(Dataset):
    zip_path: str
    keys: list | None = None
    transform: object = None
    return_key: bool = False
    handles: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        with zipfile.ZipFile(self.zip_path) as archive:
            text = archive.read("labels.csv").decode()
        self.labels = {row["key"]: int(row["label"]) for row in csv.DictReader(io.StringIO(text))}
        self.keys = list(self.labels) if self.keys is None else list(self.keys)
        self.transform = self.transform or standard_transform

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, index):
        key = self.keys[index]
        archive = self.handles.get(os.getpid())
        if archive is None:
            archive = self.handles[os.getpid()] = zipfile.ZipFile(self.zip_path)
        image = self.transform(archive.read(_MEMBER.format(key=int(key))))
        return (image, self.labels[key], key) if self.return_key else (image, self.labels[key])

    def __getstate__(self):
        return {**self.__dict__, "handles": {}}

    def close(self):
        handle = self.handles.pop(os.getpid(), None)
        if handle is not None:
            handle.close()


result = None  # an assignment the class does not read: not rebuilt
"""


def test_a_dataclass_cell_with_computed_constants_passes_the_spawn_parts():
    candidate = exec_as_cell(DATACLASS_CELL, "dataclass zip cell")["CellZipDataset"]
    result = run("per_worker_zip", candidate)
    assert result.passed, result.report()


def unguarded_script() -> str:
    """A script that defines a correct dataset and calls check() at top level, without
    ``if __name__ == "__main__":`` (the class's source is this module's, copied)."""
    imports = "import csv\nimport io\nimport os\nimport zipfile\n\nfrom torch.utils.data import Dataset\n\n"
    imports += "from packlab.course.grading import check\nfrom packlab.transforms import standard_transform\n\n\n"
    call = 'result = check("per_worker_zip", PidKeyedZipDataset, parts=["spawn"], quiet=True, record=False)\n'
    call += 'print("SPAWN PART PASSED" if result.passed else result.report())\n'
    return imports + inspect.getsource(_labels_from_archive) + "\n\n" + inspect.getsource(PidKeyedZipDataset) + "\n\n" + call


def test_a_check_called_from_a_script_without_a_main_guard_passes_its_spawn_part(tmp_path):
    script = tmp_path / "attempt.py"
    script.write_text(unguarded_script())
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert "SPAWN PART PASSED" in done.stdout, done.stdout + done.stderr


# ------------------------------------------------------------------------- the result API


def test_result_report_and_recording(tmp_path, monkeypatch, capsys):
    results = tmp_path / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV_VAR, str(results))
    result = check("shard_split", shards_for_silently_idle)
    printed = capsys.readouterr().out
    assert (result.passed, result.score, result.max_score) == (False, 4, 5)
    assert "4/5 parts passed" in printed and "think:" in printed and "✗ too_few_shards" in printed
    assert "hint:" not in printed, "the code-level hint prints only with hints=2"
    (entry,) = [json.loads(line) for line in results.read_text().splitlines()]
    assert entry["exercise_id"] == "shard_split" and entry["score"] == 4 and entry["notebook"] == "05_shard_split"
    check("shard_split", shards_for_silently_idle, record=False, quiet=True)
    assert len(results.read_text().splitlines()) == 1


def test_unknown_check_names_the_known_ones():
    with pytest.raises(ValueError, match="jpeg_dataset"):
        check("no_such_exercise", object)


def test_list_checks_describes_every_check():
    infos = list_checks()
    ids = [i.id for i in infos]
    assert len(set(ids)) == len(ids)
    assert {"jpeg_dataset", "jpeg_timing", "zip_pack", "zip_dataset", "per_worker_zip", "tar_write", "tar_dataset",
            "shard_split", "rank_dataset"} <= set(ids)
    assert [i.notebook for i in infos] == sorted(i.notebook for i in infos)
    for info in infos:
        # A check of code has at least four behaviours to get right; an answer cell's check (exercise 6's) three.
        assert info.description and "(" in info.signature and len(info.parts) >= (3 if info.id.endswith("_answer") else 4)

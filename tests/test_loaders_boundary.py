"""The loaders of chapter 8: threads in the training process, and worker processes with recycled buffers.

* The hand-back: a buffer is written again only when the last reference to the lent
  batch's storage is gone (views, storages, numpy arrays included), never while a
  training loop keeps a batch or a piece of one; a loop that keeps every batch gets
  distinct, correct batches (the pool grows).
* Every sample exactly once, with its label and bit-exact pixels (:mod:`packlab.audit`),
  from map-style datasets of every storage format and from tar shards, for both loaders;
  under fork here (spawn and forkserver: tests/test_start_methods.py).
* Bad input: the error names the file, also from a worker; a failing sample, a dying
  worker or a stuck one never hangs the loop; no thread or process is left behind after
  an error or an early ``break``.

Everything reads the 60-image ``small_root`` fixture.
"""

from __future__ import annotations

import gc
import io
import os
import shutil
import signal
import tarfile
import threading
import time
import warnings

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from packlab import audit, data, pack
from packlab.loaders import (BatchBufferPool, JpegFolderDataset, NaiveZipDataset, RawFolderDataset, RecyclingLoader,
                             TarShardDataset, ThreadLoader, ZipDataset)
from packlab.loaders.skipping import BadSampleWarning
from packlab.loaders import tar as tarloader
from packlab.loaders.tar import ShardError
from packlab.loaders.threads import THREAD_PREFIX
from packlab.transforms import CorruptImageError, decode_and_resize, raw_to_array

TIMEOUT = 120  # seconds without a batch before a loader gives up (a busy 2-core machine included)
SHAPE = (4, 3, 256, 256)


def recycling(dataset, **options):
    options.setdefault("multiprocessing_context", "fork")
    return RecyclingLoader(dataset, workers=2, timeout=TIMEOUT, **options)


def threaded(dataset, **options):
    return ThreadLoader(dataset, threads=2, timeout=TIMEOUT, **options)


LOADERS = {"threads": threaded, "recycling": recycling}


def leftover_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


# ------------------------------------------------------------------ the pool's hand-back, in one process


def test_a_lent_buffer_comes_back_only_when_the_last_reference_to_its_storage_is_gone():
    pool = BatchBufferPool(SHAPE)
    slot = pool.acquire()
    images = pool.lend(slot, 3)
    assert images.shape == (3, 3, 256, 256) and pool.counts()["lent"] == 1
    keepers = {
        "a view of one image": lambda t: t[1],
        "a reshaped view": lambda t: t.view(-1),
        "the storage": lambda t: t.untyped_storage(),
        "a numpy array": lambda t: t.numpy(),
    }
    for what, keep in keepers.items():
        kept = keep(images)
        del images
        gc.collect()
        assert pool.counts()["lent"] == 1, f"{what} still refers to the buffer, yet it was taken back"
        assert pool.acquire() != slot, f"{what} still refers to the buffer, yet the pool handed it out again"
        del kept
        assert pool.counts()["lent"] == 0, f"the buffer did not come back after {what} was dropped"
        assert slot in (pool.acquire(), pool.acquire()), "the returned buffer was not reused"
        pool = BatchBufferPool(SHAPE)
        slot = pool.acquire()
        images = pool.lend(slot, 3)


def test_a_copy_does_not_hold_the_buffer_and_the_pool_refuses_to_double_lend():
    pool = BatchBufferPool(SHAPE)
    slot = pool.acquire()
    images = pool.lend(slot, 4)
    images.fill_(0.25)
    copy = images.clone()
    del images
    assert pool.counts() == {"size": 1, "free": 1, "lent": 0, "busy": 0}
    assert pool.acquire() == slot
    pool.buffer(slot).fill_(0.75)  # the next batch overwrites the buffer: the copy is unaffected
    assert torch.all(copy == 0.25)
    pool.lend(slot, 1)  # discarded at once: the slot comes back
    kept = pool.lend(pool.acquire(), 1)
    with pytest.raises(RuntimeError, match="lent already"):
        pool.lend(slot, 1)
    with pytest.raises(RuntimeError, match="not busy"):
        pool.release(slot)
    del kept


def test_a_shared_pool_puts_its_buffers_in_shared_memory():
    shared, private = BatchBufferPool(SHAPE, shared=True), BatchBufferPool(SHAPE)
    assert shared.buffer(shared.acquire()).is_shared()
    assert not private.buffer(private.acquire()).is_shared()


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def reference(small_root, small_manifest):
    return audit.reference_digests([s.key for s in small_manifest], small_root)


@pytest.fixture(scope="module")
def packed(small_root, tmp_path_factory):
    folder = tmp_path_factory.mktemp("boundary-packed")
    return {
        "jpeg_zip": pack.write_zip(folder / "jpeg.zip", members="jpeg", root=small_root, progress=False),
        "raw_zip": pack.write_zip(folder / "raw.zip", members="raw", root=small_root, progress=False),
        "raw_folder": pack.write_raw_folder(folder / "raw", root=small_root, progress=False),
        "shards": [str(p) for p in pack.write_tar_shards(folder / "shards", root=small_root, maxcount=10,
                                                          progress=False)],
    }


def datasets(small_root, packed):
    """Every storage format of the course, with the fast (uint8) and the standard (float) transform."""
    return {
        "JPEG folder, uint8": JpegFolderDataset(small_root, transform=decode_and_resize, return_key=True),
        "JPEG folder, float": JpegFolderDataset(small_root, return_key=True),
        "raw folder, uint8": RawFolderDataset(packed["raw_folder"], root=small_root, transform=raw_to_array,
                                              return_key=True),
        "zip of JPEGs, uint8": ZipDataset(packed["jpeg_zip"], transform=decode_and_resize, return_key=True),
        "zip of raw pixels, float": ZipDataset(packed["raw_zip"], return_key=True),
        "tar shards, uint8": TarShardDataset(packed["shards"], shuffle_buffer=16, transform=decode_and_resize,
                                             return_key=True),
    }


# ------------------------------------------------------------------ exactly once, bit-exact


@pytest.mark.parametrize("loader_name", LOADERS)
def test_every_format_delivers_every_sample_once_bit_exact(loader_name, small_root, packed, small_manifest, reference):
    failed = []
    for name, dataset in datasets(small_root, packed).items():
        shuffle = {} if isinstance(dataset, IterableDataset) else {"shuffle": True}
        loader = LOADERS[loader_name](dataset, batch_size=8, **shuffle)
        report = audit.audit_epoch(audit.records_from_batches(loader), small_manifest, reference)
        if not report.ok:
            failed.append(f"{name}: {report.summary()}")
    assert not failed, "\n".join(failed)
    assert not leftover_threads()


@pytest.mark.parametrize("loader_name", LOADERS)
def test_epochs_reshuffle_reproducibly_and_reuse_the_pool(loader_name, small_root, reference, small_manifest):
    def orders(seed):
        dataset = JpegFolderDataset(small_root, transform=decode_and_resize, return_key=True)
        loader = LOADERS[loader_name](dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(seed))
        epochs = [[key for _, _, keys in loader for key in keys] for _ in range(2)]
        return epochs, loader.pool.counts()

    (first, second), counts = orders(1)
    assert sorted(first) == sorted(second) == sorted(s.key for s in small_manifest)
    assert first != second, "the second epoch repeated the first one's order"
    assert orders(1)[0] == [first, second], "the same generator seed gave another order"
    # 8 batches an epoch; 2 workers x 2 in flight, plus the batch the loop holds: the pool stays small.
    assert counts["size"] <= 6 and counts["lent"] == 0 and counts["busy"] == 0, counts


# ------------------------------------------------------------------ the hand-back, through the loaders


@pytest.mark.parametrize("loader_name", LOADERS)
def test_a_kept_batch_or_a_kept_view_is_never_overwritten(loader_name, small_root, packed, reference):
    """Keep batch 0 and one image of batch 1 through two epochs of 15 batches each, on a pool of a few buffers."""
    for dataset in (ZipDataset(packed["jpeg_zip"], transform=decode_and_resize, return_key=True),
                    TarShardDataset(packed["shards"], transform=decode_and_resize, return_key=True)):
        loader = LOADERS[loader_name](dataset, batch_size=4, prefetch=1)
        kept_batch = kept_image = None
        for epoch in range(2):
            if hasattr(dataset, "set_epoch"):
                dataset.set_epoch(epoch)
            for number, (images, labels, keys) in enumerate(loader):
                if kept_batch is None:
                    kept_batch, kept_keys = images, keys
                elif kept_image is None:
                    kept_image, kept_image_key = images[2], keys[2]
        assert [audit.tensor_digest(image) for image in kept_batch] == [reference[k] for k in kept_keys]
        assert audit.tensor_digest(kept_image) == reference[kept_image_key]
        del images, labels, keys  # the loop's last batch
        counts = loader.pool.counts()
        assert counts["lent"] == 2, f"both kept batches must still be lent out: {counts}"
        assert counts["size"] < 15, f"the pool grew to {counts['size']} buffers for 15 batches: nothing was recycled"
        del kept_batch, kept_image
        gc.collect()
        assert loader.pool.counts()["lent"] == 0


@pytest.mark.parametrize("loader_name", LOADERS)
def test_keeping_every_batch_gives_distinct_correct_batches(loader_name, small_root, small_manifest, reference):
    dataset = JpegFolderDataset(small_root, transform=decode_and_resize, return_key=True)
    loader = LOADERS[loader_name](dataset, batch_size=8, shuffle=True)
    batches = list(loader)
    report = audit.audit_epoch(audit.records_from_batches(batches), small_manifest, reference)
    assert report.ok, report.summary()
    assert loader.pool.counts()["size"] == len(batches) == 8  # the pool grew, one buffer per kept batch
    pointers = {images.data_ptr() for images, _, _ in batches}
    assert len(pointers) == len(batches)


# ------------------------------------------------------------------ bad input: errors name the file, nothing hangs


@pytest.fixture(scope="module")
def damaged(small_root, small_manifest, tmp_path_factory):
    """A JPEG folder, a zip and tar shards, each with sample 000005 corrupt (its JPEG cut to 300 bytes)."""
    base = tmp_path_factory.mktemp("boundary-damaged")
    root = base / "root"
    shutil.copytree(small_root, root)
    bad = data.image_path("000005", root)
    cut = bad.read_bytes()[:300]
    shards = pack.write_tar_shards(base / "intact", root=root, maxcount=10, shuffle=False, progress=False)
    (base / "shards").mkdir()
    damaged_shards = [base / "shards" / s.name for s in shards]
    for intact, copy in zip(shards, damaged_shards):
        with tarfile.open(intact) as src, tarfile.open(copy, "w", format=tarfile.USTAR_FORMAT) as dst:
            for info in src.getmembers():
                payload = cut if info.name == "000005.jpg" else src.extractfile(info).read()
                info.size = len(payload)
                dst.addfile(info, io.BytesIO(payload))
    bad.write_bytes(cut)
    return {
        "root": root,
        "zip": pack.write_zip(base / "damaged.zip", root=root, samples=small_manifest, progress=False),
        "shards": [str(p) for p in damaged_shards],
    }


BAD_CASES = {
    "folder": (lambda d, **o: JpegFolderDataset(d["root"], transform=decode_and_resize, **o), "000005.jpg"),
    "zip": (lambda d, **o: ZipDataset(d["zip"], transform=decode_and_resize, **o), "damaged.zip:000005.jpg"),
    "tar": (lambda d, **o: TarShardDataset(d["shards"], transform=decode_and_resize, **o), ".tar:000005.jpg"),
}


def _stopped_everything(epoch) -> None:
    """No thread of the loader is left, and every worker process of ``epoch`` has exited."""
    assert not leftover_threads(), leftover_threads()
    for process in getattr(epoch, "processes", []):
        assert not process.is_alive(), f"worker {process.pid} is still running"


@pytest.mark.parametrize("case", BAD_CASES)
@pytest.mark.parametrize("loader_name", LOADERS)
def test_a_corrupt_sample_raises_naming_it_and_stops_every_worker(loader_name, case, damaged):
    make, fragment = BAD_CASES[case]
    epoch = iter(LOADERS[loader_name](make(damaged), batch_size=4))
    started = time.monotonic()
    with pytest.raises(CorruptImageError) as raised:
        for _ in epoch:
            pass
    assert fragment in str(raised.value) and "Check or regenerate the file" in str(raised.value)
    assert time.monotonic() - started < TIMEOUT
    _stopped_everything(epoch)
    with pytest.raises(StopIteration):
        next(epoch)  # a failed epoch stays finished


@pytest.mark.filterwarnings("ignore::packlab.loaders.skipping.BadSampleWarning")
@pytest.mark.parametrize("loader_name", LOADERS)
def test_skip_mode_leaves_out_the_bad_sample_and_counts_it(loader_name, damaged, small_manifest, reference):
    good = [s for s in small_manifest if s.key != "000005"]
    for case, (make, _) in BAD_CASES.items():
        dataset = make(damaged, return_key=True, on_bad_sample="skip")
        loader = LOADERS[loader_name](dataset, batch_size=4)
        report = audit.audit_epoch(audit.records_from_batches(loader), good, reference)
        assert report.ok, f"{case}: {report.summary()}"
        if loader_name == "recycling":  # counted in worker rows of shared memory, read here
            assert dataset.skipped == 1, case


@pytest.mark.parametrize("loader_name", LOADERS)
def test_a_batch_of_only_bad_samples_is_none(loader_name, damaged):
    dataset = JpegFolderDataset(damaged["root"], keys=["000005", "000006"], transform=decode_and_resize,
                                return_key=True, on_bad_sample="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", BadSampleWarning)
        batches = list(LOADERS[loader_name](dataset, batch_size=1))
    assert batches[0] is None and list(batches[1][2]) == ["000006"]


@pytest.mark.parametrize("loader_name", LOADERS)
def test_an_early_break_leaves_no_thread_or_process_behind(loader_name, small_root, packed):
    for dataset in (ZipDataset(packed["jpeg_zip"], transform=decode_and_resize),
                    TarShardDataset(packed["shards"], transform=decode_and_resize)):
        loader = LOADERS[loader_name](dataset, batch_size=4)
        epoch = iter(loader)
        next(epoch)
        processes = list(getattr(epoch, "processes", []))
        del epoch  # what a `break` out of a for loop does to the loop's iterator
        gc.collect()
        for process in processes:
            process.join(30)
            assert not process.is_alive()
        assert not leftover_threads()
        counts = loader.pool.counts()
        assert counts["busy"] == 0, f"batches in flight at the break were not given back: {counts}"


class DiesAtSample(Dataset):
    """A dataset whose worker process is killed (as by the out-of-memory killer) on one sample."""

    def __init__(self, root):
        self.inner = JpegFolderDataset(root, transform=decode_and_resize)

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        if index == 9:
            os.kill(os.getpid(), signal.SIGKILL)
        return self.inner[index]


def test_a_worker_that_dies_is_named_and_the_others_are_stopped(small_root):
    epoch = iter(recycling(DiesAtSample(small_root), batch_size=4))
    with pytest.raises(RuntimeError, match=r"worker \d \(pid \d+\) exited unexpectedly .*SIGKILL"):
        for _ in epoch:
            pass
    _stopped_everything(epoch)


class Sleepy(Dataset):
    """Every sample takes 1.5 s: a batch of 4 takes longer than a 2-second timeout."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        time.sleep(1.5)
        return torch.zeros(3, 256, 256), 0


@pytest.mark.parametrize("loader_name", LOADERS)
def test_a_stuck_sample_ends_in_a_timeout_error_not_a_hang(loader_name):
    loader = LOADERS[loader_name](Sleepy(), batch_size=4)
    loader.timeout = 2
    epoch = iter(loader)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="timeout"):
        next(epoch)
    assert time.monotonic() - started < 60
    _stopped_everything(epoch) if loader_name == "recycling" else None
    # A thread cannot be interrupted; it ends when its sample returns, and then gives its buffer back.
    deadline = time.monotonic() + 30
    while leftover_threads() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leftover_threads()
    assert loader.pool.counts()["busy"] == 0


def test_an_image_of_the_wrong_size_is_named(small_root):
    dataset = JpegFolderDataset(small_root, transform=decode_and_resize, return_key=True)
    with pytest.raises(ValueError, match=r"sample 000000: image of uint8 \(256, 256, 3\).*expects uint8 \(128, 128, 3\)"):
        list(threaded(dataset, batch_size=4, image_shape=(128, 128, 3)))
    with pytest.raises(ValueError, match=r"sample 000000: .*image_shape="):
        list(recycling(dataset, batch_size=4, image_shape=(128, 128, 3)))


def test_threads_refuse_an_iterable_dataset_they_cannot_split():
    class Plain(IterableDataset):
        def __iter__(self):
            yield torch.zeros(3, 256, 256), 0

    with pytest.raises(TypeError, match="iter_share"):
        ThreadLoader(Plain())
    assert len(list(recycling(Plain(), batch_size=4))) == 2  # one sample from each of the 2 workers, as a DataLoader gives


def test_a_truncated_shard_raises_naming_it_through_both_loaders(small_root, tmp_path):
    shards = pack.write_tar_shards(tmp_path / "shards", root=small_root, maxcount=30, progress=False)
    shards[0].write_bytes(shards[0].read_bytes()[: shards[0].stat().st_size // 2])
    dataset = TarShardDataset([str(s) for s in shards], transform=decode_and_resize)
    for make in LOADERS.values():
        with pytest.raises(ShardError, match=r"shard-000000\.tar is truncated"):
            list(make(dataset, batch_size=4))
    assert not leftover_threads()


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")
def test_a_dataset_spawn_cannot_pickle_fails_at_once_and_starts_nothing(packed):
    """Chapter 3's zip opened in __init__ cannot be pickled into spawn workers: the same TypeError as a DataLoader's."""
    dataset = NaiveZipDataset(packed["jpeg_zip"])
    loader = recycling(dataset, batch_size=4, multiprocessing_context="spawn")
    try:
        with pytest.raises(TypeError, match="cannot pickle"):
            iter(loader)
    finally:
        dataset.archive.close()
    assert loader.pool.counts()["busy"] == 0


def test_thread_readers_of_one_epoch_are_not_taken_for_a_repeated_epoch(packed):
    """The readers are threads of one process; each keeps its own mark of the epoch it read."""
    dataset = TarShardDataset(packed["shards"], shuffle_buffer=16, transform=decode_and_resize)
    loader = threaded(dataset, batch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tarloader.RepeatedEpochWarning)
        for epoch in range(2):
            dataset.set_epoch(epoch)
            assert sum(len(labels) for _, labels in loader) == 60
    with pytest.warns(tarloader.RepeatedEpochWarning, match="without set_epoch"):
        list(loader)  # a third pass, still epoch 1: this one does repeat

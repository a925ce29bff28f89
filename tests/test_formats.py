"""The other packed formats of chapter 9: writers, readers under every start method, the pitfall in each, bad input.

* Each writer stores every sample once with its label and its exact JPEG bytes, writes
  atomically, and ``ensure_*`` writes once.
* Each reader (map-style and stream) delivers every sample exactly once, with the
  manifest's label and bit-exact pixels (:mod:`packlab.audit`), with 2 DataLoader workers
  under fork, spawn and forkserver, and with the parent holding an open handle of its own
  when the workers start.
* The first attempt (handle opened in ``__init__``) does, on this machine, what chapter 9
  says it does: npz fails like chapter 3's zip, h5py's default driver leaves the shared
  file offset alone while its file-object driver moves it, LMDB's forked readers fill the
  parent's reader table, and none of them can be pickled for spawn.
* Bad input (missing file, missing key, truncated or damaged file, corrupt image) raises
  an error naming the file and the key, or is skipped and counted with ``on_bad_sample="skip"``.

Everything reads the 60-image ``small_root`` fixture.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import pickle
import shutil
import warnings
import zipfile
import zlib

import lmdb
import numpy as np
import pytest
import torch
from torch.utils.data import ChainDataset, ConcatDataset, DataLoader

from packlab import audit, data
from packlab.bench import run_until_error
from packlab.formats import (
    DamagedSampleError,
    Hdf5Dataset,
    LmdbDataset,
    LmdbStreamDataset,
    NaiveHdf5Dataset,
    NaiveLmdbDataset,
    NaiveNpzDataset,
    NaiveParquetDataset,
    NpzDataset,
    ParquetDataset,
    ParquetStreamDataset,
    close_environment,
    open_environment,
    write_hdf5,
    write_lmdb,
    write_npz,
    write_parquet,
)
from packlab.bench import Spread, compare, ranking, round_orders
from packlab.formats import bench as formats_bench
from packlab.loaders.skipping import BadSampleWarning, collate_skipping_bad
from packlab.loaders.tar import ShardSplitError, skip_decode
from packlab.transforms import CorruptImageError

START_METHODS = ["fork", "spawn", "forkserver"]
WORKERS = 2
TIMEOUT = 120
multiprocessing.set_forkserver_preload(["torch", "packlab.formats", "packlab.audit"])

WRITERS = {"lmdb": write_lmdb, "h5": write_hdf5, "parquet": write_parquet, "npz": write_npz}
MAP_STYLE = {"lmdb": LmdbDataset, "h5": Hdf5Dataset, "parquet": ParquetDataset, "npz": NpzDataset}


def sha256_bytes(data_: bytes, source: str = "") -> torch.Tensor:
    """A transform that returns the SHA-256 of the encoded bytes (compared with the manifest's)."""
    return torch.frombuffer(bytearray(hashlib.sha256(data_).digest()), dtype=torch.uint8)


@pytest.fixture(scope="module")
def reference(small_root, small_manifest):
    return audit.reference_digests([s.key for s in small_manifest], small_root)


@pytest.fixture(scope="module")
def written(small_root, small_manifest, tmp_path_factory):
    """Every format of all 60 samples, and stream files of two disjoint thirds with small blocks."""
    folder = tmp_path_factory.mktemp("formats")
    files = {ext: write(folder / f"all.{ext}", samples=small_manifest, root=small_root, progress_bar=False)
             for ext, write in WRITERS.items()}
    files["lmdb third"] = write_lmdb(folder / "third.lmdb", samples=small_manifest[:20], root=small_root,
                                     progress_bar=False)
    files["parquet third"] = write_parquet(folder / "third.parquet", samples=small_manifest[20:40], root=small_root,
                                           row_group_size=5, progress_bar=False)
    return files


# ------------------------------------------------------------------------ writers


@pytest.mark.parametrize("ext", list(WRITERS))
def test_writers_store_every_sample_once_with_its_label_and_exact_bytes(ext, written, small_manifest):
    dataset = MAP_STYLE[ext](written[ext], transform=sha256_bytes, return_key=True)
    records = [(key, label, bytes(digest.numpy()).hex()) for digest, label, key in dataset]
    dataset.close()
    report = audit.audit_epoch(records, small_manifest, {s.key: s.sha256 for s in small_manifest})
    assert report.ok, report.summary()
    assert dataset.keys == sorted(s.key for s in small_manifest)


@pytest.mark.parametrize("ext", list(WRITERS))
def test_writers_leave_no_partial_file_and_ensure_writes_once(ext, small_root, monkeypatch, tmp_path):
    from packlab import formats

    monkeypatch.setenv("PACKLAB_DATA", str(small_root))
    target = WRITERS[ext](tmp_path / f"x.{ext}", samples=data.load_manifest(small_root)[:5], root=small_root,
                          progress_bar=False)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    ensure = {"lmdb": formats.ensure_lmdb, "h5": formats.ensure_hdf5, "parquet": formats.ensure_parquet,
              "npz": formats.ensure_npz}[ext]
    samples = data.load_manifest(small_root)[:4]
    first = ensure(root=small_root, samples=samples, name=f"test-{ext}", progress_bar=False)
    stamp = first.stat().st_mtime_ns
    again = ensure(root=small_root, samples=samples, name=f"test-{ext}", progress_bar=False)
    assert again == first and again.stat().st_mtime_ns == stamp
    close_environment(first)
    first.unlink()


@pytest.mark.parametrize("ext", list(WRITERS))
def test_a_write_that_fails_part_way_leaves_nothing_behind(ext, small_root, small_manifest, tmp_path):
    ghost = small_manifest[3]._replace(key="999999")  # no such image
    with pytest.raises(FileNotFoundError):
        WRITERS[ext](tmp_path / f"x.{ext}", samples=[*small_manifest[:3], ghost], root=small_root, progress_bar=False)
    assert list(tmp_path.iterdir()) == []


def test_hdf5_filters_do_not_reach_variable_length_bytes(tmp_path):
    """The claim in hdf5_format's docstring: gzip on a variable-length array leaves the heap's bytes as they are."""
    import h5py

    sizes = {}
    for compression in (None, "gzip"):
        path = tmp_path / f"{compression}.h5"
        with h5py.File(path, "w") as f:
            options = {"chunks": (10,), "compression": compression} if compression else {}
            images = f.create_dataset("images", (40,), dtype=h5py.vlen_dtype(np.uint8), **options)
            for i in range(40):
                images[i] = np.zeros(20_000, dtype=np.uint8)  # as compressible as bytes get
        sizes[compression] = path.stat().st_size
    assert sizes["gzip"] > 0.95 * sizes[None]


# ------------------------------------------------- every reader under every start method


@pytest.fixture(scope="module")
def map_datasets(written):
    """Each map-style reader over all 60 samples, each having read a sample in this process already."""
    datasets = {ext: cls(written[ext], return_key=True) for ext, cls in MAP_STYLE.items()}
    for dataset in datasets.values():
        dataset[0]  # the parent's own handle is open when the workers start
    yield datasets
    for dataset in datasets.values():
        dataset.close()


@pytest.mark.parametrize("method", START_METHODS)
def test_map_style_readers_deliver_every_sample_once_bit_exact(method, map_datasets, small_manifest, reference):
    loader = DataLoader(ConcatDataset(list(map_datasets.values())), batch_size=8, num_workers=WORKERS,
                        multiprocessing_context=method, timeout=TIMEOUT)
    records = audit.records_from_batches(loader)
    n = len(small_manifest)
    assert len(records) == len(map_datasets) * n
    failed = []
    for i, name in enumerate(map_datasets):
        report = audit.audit_epoch(records[i * n : (i + 1) * n], small_manifest, reference)
        if not report.ok:
            failed.append(f"{name} under {method}: {report.summary()}")
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("method", START_METHODS)
def test_stream_readers_deliver_every_sample_once_bit_exact(method, written, small_manifest, reference):
    lmdb_part, parquet_part = small_manifest[:20], small_manifest[20:40]
    streams = [LmdbStreamDataset(written["lmdb third"], block_size=5, shuffle_buffer=8, return_key=True),
               ParquetStreamDataset(written["parquet third"], shuffle_buffer=8, return_key=True)]
    open_environment(written["lmdb third"])  # the parent's environment is open too
    loader = DataLoader(ChainDataset(streams), batch_size=8, num_workers=WORKERS, multiprocessing_context=method,
                        timeout=TIMEOUT)
    records = audit.records_from_batches(loader)
    close_environment(written["lmdb third"])
    assert len(records) == 40
    for name, part in (("LmdbStreamDataset", lmdb_part), ("ParquetStreamDataset", parquet_part)):
        keys = {s.key for s in part}
        report = audit.audit_epoch([r for r in records if r[0] in keys], part, reference)
        assert report.ok, f"{name} under {method}: {report.summary()}"


def test_streams_shuffle_per_epoch_reproducibly_and_refuse_to_starve_a_worker(written):
    def keys(dataset, epoch):
        dataset.set_epoch(epoch)
        return [key for _, _, key in dataset]

    for make in (lambda: LmdbStreamDataset(written["lmdb third"], block_size=5, shuffle_buffer=6,
                                           transform=skip_decode, return_key=True),
                 lambda: ParquetStreamDataset(written["parquet third"], shuffle_buffer=6, transform=skip_decode,
                                              return_key=True)):
        first, second = keys(make(), 0), keys(make(), 1)
        assert sorted(first) == sorted(second) and first != second
        assert keys(make(), 0) == first
    too_coarse = LmdbStreamDataset(written["lmdb third"], block_size=20, transform=skip_decode)
    loader = DataLoader(too_coarse, batch_size=4, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
    error = run_until_error(loader)[1]
    assert isinstance(error, ShardSplitError) and "smaller block_size" in str(error)


def test_an_lmdb_file_open_in_the_parent_cannot_be_opened_again_in_a_forked_child(written):
    """Why open_environment closes an inherited environment first: py-lmdb's registry of open files is inherited."""
    path = str(written["lmdb third"])
    close_environment(path)  # opened by the tests before, through packlab.formats
    parent = lmdb.open(path, subdir=False, readonly=True, lock=False)
    queue = multiprocessing.get_context("fork").SimpleQueue()

    def child(close_first):
        try:
            if close_first:
                parent.close()
            with lmdb.open(path, subdir=False, readonly=True, lock=False).begin() as txn:
                queue.put(("ok", txn.stat()["entries"]))
        except lmdb.Error as exc:
            queue.put(("error", str(exc)))

    outcomes = []
    for close_first in (False, True):
        process = multiprocessing.get_context("fork").Process(target=child, args=(close_first,))
        process.start()
        process.join(60)
        outcomes.append(queue.get())
    parent.close()
    assert outcomes[0][0] == "error" and "already open in this process" in outcomes[0][1]
    assert outcomes[1] == ("ok", 20)


# ------------------------------------------------------- the pitfall: a handle opened in __init__


def test_npz_opened_in_init_fails_under_fork_like_a_zip(written):
    dataset = NaiveNpzDataset(written["npz"], return_key=True)
    error = None
    try:
        for _ in range(3):  # a collision is a matter of timing; in practice the first epoch fails
            loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
            error = run_until_error(loader)[1]
            if error is not None:
                break
    finally:
        dataset.close()
    assert isinstance(error, (zipfile.BadZipFile, zlib.error, ValueError)), f"expected BadZipFile, got {error!r}"


def test_h5py_default_driver_leaves_the_shared_offset_alone_and_the_file_object_driver_moves_it(written):
    """sec2 reads with pread (no offset); a Python file object is read with seek + read on the inherited offset."""
    moved = {}
    for through_file_object in (False, True):
        dataset = NaiveHdf5Dataset(written["h5"], through_file_object=through_file_object)
        dataset.read_record(3)
        fd = dataset.fileobj.fileno() if through_file_object else dataset.file.id.get_vfd_handle()
        before = os.lseek(fd, 0, os.SEEK_CUR)
        child = multiprocessing.get_context("fork").Process(target=lambda: [dataset.read_record(i) for i in range(40, 50)])
        child.start()
        child.join(60)
        assert child.exitcode == 0
        moved[through_file_object] = os.lseek(fd, 0, os.SEEK_CUR) != before
        dataset.close()
    assert moved == {False: False, True: True}


@pytest.mark.parametrize("cls, options", [(NaiveHdf5Dataset, {}), (NaiveParquetDataset, {}),
                                          (NaiveLmdbDataset, {"lock": False})],
                         ids=["h5py-path", "parquet-path", "lmdb-lock-false"])
def test_these_handles_opened_in_init_read_correctly_under_fork_here(cls, options, written, small_manifest, reference):
    """What they demonstrably do on this machine: positional reads or a shared read-only map, and nothing to collide."""
    ext = {NaiveHdf5Dataset: "h5", NaiveParquetDataset: "parquet", NaiveLmdbDataset: "lmdb"}[cls]
    close_environment(written[ext])  # py-lmdb allows one environment per file and process
    dataset = cls(written[ext], return_key=True, **options)
    try:
        loader = DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
        report = audit.audit_epoch(audit.records_from_batches(loader), small_manifest, reference)
    finally:
        dataset.close()
    assert report.ok, report.summary()


def test_lmdb_opened_in_init_fills_the_parents_reader_table_from_forked_workers(written):
    """Every read transaction a forked worker begins on the inherited environment keeps its reader slot
    (py-lmdb leaves LMDB handles alone after fork), stamped with the parent's pid: after 126 the table is full,
    for the workers and for the parent."""
    close_environment(written["lmdb"])  # py-lmdb allows one environment per file and process
    dataset = NaiveLmdbDataset(written["lmdb"], lock=True)
    try:
        delivered, error = 0, None
        for _ in range(4):  # 60 transactions per epoch
            loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT,
                                collate_fn=lambda batch: len(batch))
            batches, error = run_until_error(loader)
            delivered += 4 * batches
            if error is not None:
                break
        slots = dataset.env.readers().splitlines()[1:]
        with pytest.raises(lmdb.ReadersFullError):
            dataset.env.begin()
    finally:
        dataset.close()
    assert isinstance(error, lmdb.ReadersFullError), repr(error)
    assert 120 <= delivered <= 126
    assert len(slots) == 126 and all(line.split()[0] == str(os.getpid()) for line in slots)


@pytest.mark.parametrize("cls, ext, message", [
    (NaiveLmdbDataset, "lmdb", "cannot pickle 'Environment' object"),
    (NaiveHdf5Dataset, "h5", "h5py objects cannot be pickled"),
    (NaiveParquetDataset, "parquet", "cannot pickle"),
    (NaiveNpzDataset, "npz", "cannot pickle '_io.BufferedReader' object"),
], ids=["lmdb", "h5py", "parquet", "npz"])
def test_handles_opened_in_init_cannot_be_pickled_for_spawn(cls, ext, message, written):
    close_environment(written[ext])
    dataset = cls(written[ext])
    try:
        with pytest.raises(TypeError) as raised:
            pickle.dumps(dataset)
    finally:
        dataset.close()
    assert message in str(raised.value) or (ext == "parquet" and "__reduce__" in str(raised.value))


# ------------------------------------------------------------------------ bad input


CORRUPT = "000005"  # its JPEG is truncated before writing


@pytest.fixture(scope="module")
def damaged(small_root, small_manifest, tmp_path_factory):
    """Every format written from a copy of the small dataset in which one JPEG is cut short."""
    base = tmp_path_factory.mktemp("damaged-formats")
    root = base / "root"
    shutil.copytree(small_root, root)
    path = data.image_path(CORRUPT, root)
    path.write_bytes(path.read_bytes()[:400])
    samples = data.load_manifest(root)
    files = {ext: write(base / f"damaged.{ext}", samples=samples, root=root, progress_bar=False)
             for ext, write in WRITERS.items()}
    return {**files, "root": root}


def expect_error(call, error_type, *fragments):
    with pytest.raises(error_type) as raised:
        call()
    for fragment in fragments:
        assert fragment in str(raised.value), f"{fragment!r} not in: {raised.value}"


@pytest.mark.parametrize("ext", list(WRITERS))
def test_a_missing_file_or_key_is_named(ext, written, tmp_path):
    cls = MAP_STYLE[ext]
    nowhere = tmp_path / f"nowhere.{ext}"
    expect_error(lambda: cls(nowhere), FileNotFoundError, str(nowhere), "does not exist", "packlab.formats.ensure_")
    expect_error(lambda: cls(written[ext], keys=["000001", "999999"]), data.DatasetError, "999999", str(written[ext]))


@pytest.mark.parametrize("ext, fragment", [("lmdb", "truncated"), ("h5", "truncated"), ("parquet", "not a readable"),
                                           ("npz", "not a readable")])
def test_a_truncated_file_raises_naming_it_in_both_modes(ext, fragment, written, tmp_path):
    cut = tmp_path / f"cut.{ext}"
    raw = written[ext].read_bytes()
    cut.write_bytes(raw[: len(raw) // 2])
    for mode in ("raise", "skip"):
        expect_error(lambda: MAP_STYLE[ext](cut, on_bad_sample=mode), data.DatasetError, str(cut), fragment, "rewrite")
    close_environment(cut)


@pytest.mark.parametrize("ext", list(WRITERS))
def test_a_corrupt_image_is_named_with_file_and_key_also_from_a_worker(ext, damaged):
    dataset = MAP_STYLE[ext](damaged[ext])
    index = dataset.keys.index(CORRUPT)
    expect_error(lambda: dataset[index], CorruptImageError, f"{damaged[ext]}:{CORRUPT}")
    subset = MAP_STYLE[ext](damaged[ext], keys=dataset.keys[index - 2 : index + 2])
    error = run_until_error(DataLoader(subset, batch_size=2, num_workers=2, multiprocessing_context="fork",
                                       timeout=TIMEOUT))[1]
    assert isinstance(error, CorruptImageError) and f"{damaged[ext]}:{CORRUPT}" in str(error)
    dataset.close()


@pytest.mark.parametrize("ext", list(WRITERS))
def test_skip_mode_skips_and_counts_the_corrupt_image_only(ext, damaged, small_manifest, reference):
    dataset = MAP_STYLE[ext](damaged[ext], return_key=True, on_bad_sample="skip")
    loader = DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT,
                        collate_fn=collate_skipping_bad)
    records = audit.records_from_batches(b for b in loader if b is not None)
    good = [s for s in small_manifest if s.key != CORRUPT]
    report = audit.audit_epoch(records, good, reference)
    assert report.ok, report.summary()
    assert dataset.skip_counter.by_reason() == {"corrupt image": 1}
    dataset.close()


def test_stream_skip_mode_skips_a_corrupt_image_and_a_damaged_row_group(damaged, small_manifest, tmp_path):
    keys = [k for _, _, k in LmdbStreamDataset(damaged["lmdb"], transform=skip_decode, return_key=True,
                                                 on_bad_sample="skip")]
    assert CORRUPT in keys  # skip_decode does not decode: only decoding finds a corrupt image
    with pytest.warns(BadSampleWarning, match=CORRUPT):
        keys = [k for _, _, k in LmdbStreamDataset(damaged["lmdb"], return_key=True, on_bad_sample="skip")]
    assert sorted(keys) == sorted(s.key for s in small_manifest if s.key != CORRUPT)

    path = write_parquet(tmp_path / "groups.parquet", samples=small_manifest, root=damaged["root"], row_group_size=10,
                         progress_bar=False)
    flip_inside(path, data.image_path("000025", damaged["root"]).read_bytes())  # in row group 2 (rows 20-29)
    stream = ParquetStreamDataset(path, transform=skip_decode, return_key=True, on_bad_sample="skip")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = [k for _, _, k in stream]
    assert len(keys) == 50 and not {f"{i:06d}" for i in range(20, 30)} & set(keys)
    assert stream.skip_counter.by_reason() == {"damaged shard": 1}
    assert any("row group 2" in str(w.message) for w in caught)


def flip_inside(path, needle: bytes) -> int:
    """Flip one byte in the middle of ``needle`` where the file stores it; return the offset."""
    raw = bytearray(path.read_bytes())
    offset = raw.find(needle) + len(needle) // 2
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))
    return offset


@pytest.mark.parametrize("ext, detected", [("lmdb", False), ("h5", False), ("parquet", True), ("npz", True)])
def test_which_formats_notice_a_damaged_byte_in_an_image(ext, detected, written, small_root, reference, tmp_path):
    """Parquet (page checksums) and npz (zip CRC-32) raise; LMDB and HDF5 store no checksum of the bytes."""
    copy = tmp_path / f"copy.{ext}"
    shutil.copyfile(written[ext], copy)
    key = "000017"
    flip_inside(copy, data.image_path(key, small_root).read_bytes())
    dataset = MAP_STYLE[ext](copy, keys=[key], return_key=True)
    try:
        image, _, _ = dataset[0]
        outcome = "different pixels" if audit.tensor_digest(image) != reference[key] else "same pixels"
    except (DamagedSampleError, CorruptImageError) as exc:
        outcome = "error"
        assert str(copy) in str(exc) and key in str(exc)
    finally:
        dataset.close()
    assert (outcome == "error") == detected, outcome


def test_the_formats_measurement_reports_every_layout_and_column(small_root, small_manifest, tmp_path):
    results = formats_bench.measure_formats(small_manifest[:20], root=small_root, workdir=tmp_path / "bench",
                                            runs=2, budget_s=0.2, read_samples=small_manifest[:40], random_reads=8)
    rows = formats_bench.table_rows(results)
    names = ["folder", "zip", "tar", "lmdb", "hdf5", "parquet", "npz"]
    assert [r["layout"] for r in rows] == names
    for row in rows:
        assert len(row) == 4 + 6
    lmdb_row = rows[3]
    assert lmdb_row["random, network model (samples/s)"] == "n/a" and rows[2]["random, warm (samples/s)"] == "n/a"
    assert np.isfinite(results["layouts"]["zip"]["rates"]["random"]["warm"][0])
    # The layouts take their turns in the counterbalanced order of packlab.bench.round_orders.
    assert results["orders"] == [[names[i] for i in row] for row in round_orders(len(names), 2, seed=0)]
    # The reads went to the read set, written once: 40 samples in every layout.
    assert results["read_samples"] == 40 and results["random_reads"] == 8
    assert sorted(p.name for p in (tmp_path / "bench" / "read-set").iterdir()) == sorted(names)
    if results["cold_level"] is not None:  # the eviction is checked: nothing of a layout stays cached
        for name, entry in results["layouts"].items():
            assert entry["resident"]["after dropping"] < 0.05, (name, entry["resident"])
            assert 0 < entry["cold_read_share"] <= 1, (name, entry["cold_read_share"])
        assert {row["layout"] for row in formats_bench.residency_rows(results)} == set(names)


@pytest.mark.parametrize("opened_before", [None, True])
def test_random_lmdb_reads_open_the_environment_without_readahead(written, opened_before):
    """Even when another reader in this process opened the file first, with LMDB's default readahead."""
    layout = next(layout for layout in formats_bench.LAYOUTS if layout.name == "lmdb")
    if opened_before:
        assert open_environment(written["lmdb"], readahead=True).flags()["readahead"] is True
    dataset = layout.random(written["lmdb"], None)
    try:
        dataset[0]
        assert open_environment(written["lmdb"]).flags()["readahead"] is False
        LmdbDataset(written["lmdb"])[0]  # a default reader afterwards gets readahead back
        assert open_environment(written["lmdb"]).flags()["readahead"] is True
    finally:
        dataset.close()


@pytest.mark.parametrize("count, reads", [(2000, 32), (1000, 7), (10, 32)])
def test_random_reads_are_spread_out_and_drawn_anew_with_each_seed(count, reads):
    indices = formats_bench.spread_indices(count, reads, seed=3)
    assert len(indices) == len(set(indices)) == min(count, reads)
    assert all(0 <= i < count for i in indices)
    ordered = sorted(indices)
    if reads < count:  # evenly spread: neighbours are count / reads apart (give or take rounding)
        assert min(b - a for a, b in zip(ordered, ordered[1:])) >= count // reads
        assert indices != ordered  # and read in a random order
    assert formats_bench.spread_indices(count, reads, seed=3) == indices
    assert formats_bench.spread_indices(count, reads, seed=4) != indices


class _Recording(torch.utils.data.Dataset):
    """A map-style dataset that records which indices were read."""

    def __init__(self, length: int):
        self.length, self.read = length, []

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        self.read.append(index)
        return torch.tensor(index)


def test_a_warm_read_repeats_exactly_the_samples_the_cold_read_read():
    dataset = _Recording(100)
    order = [7, 3, 50, 21, 9, 88, 60, 1]
    rate, once = formats_bench.read_rate(dataset, budget_s=10.0, indices=order)
    assert once == len(order) and dataset.read == order and rate > 0
    dataset.read.clear()
    _, again = formats_bench.read_rate(dataset, budget_s=0.05, indices=order, count=5, repeat=True)
    assert again == 5 and len(dataset.read) > 5  # repeated until the budget ran out...
    assert set(dataset.read) == set(order[:5])  # ...never reading a sample the first read had not read


def test_a_ranking_compares_neighbours_not_the_best_with_everyone():
    def runs(centre):
        return Spread.of(centre * (1 + 0.01 * (i - 2.5)) for i in range(6))

    # a, b, c 4 % apart in turn: no step between neighbours reaches the 5 % minimum, though a is clearly above c.
    chain = {"c": runs(100), "a": runs(108.16), "b": runs(104)}
    assert compare(chain["a"], chain["c"]) == 1
    assert ranking(chain) == [("a", None), ("b", False), ("c", False)]
    steps = {"slow": runs(50), "fast": runs(200), "mid": runs(100), "mid2": runs(101)}
    assert ranking(steps) == [("fast", None), ("mid2", True), ("mid", False), ("slow", True)]
    # Seconds: the lowest first, and a clear step is a clearly longer time.
    assert ranking(steps, higher=False) == [("slow", None), ("mid", True), ("mid2", False), ("fast", True)]
    assert ranking({"only": runs(1)}) == [("only", None)]


def test_format_verdicts_follow_the_course_comparison():
    assert formats_bench.compare([5, 6, 7, 8, 9, 10], [1, 2, 3, 4, 4.5, 4.8]) == "higher"
    assert formats_bench.compare([3, 4], [1, 2]) == "no clear difference"  # two runs each can never be clear
    assert formats_bench.ranked({"a": [10, 11, 12, 13, 14, 15], "b": [10.5, 11, 12.5, 13.5, 14, 15.5],
                                 "c": [1, 2, 3, 4, 5, 6]}) == [("b", None), ("a", False), ("c", True)]


def test_ranking_sentences_read_correctly_whatever_the_verdicts():
    from packlab.course.narration import ch09

    same = {name: [100 + i for i in range(6)] for name in ("lmdb", "folder", "zip")}
    sentence = ch09.ranking_sentence(same, "Random reads, warm")
    assert sentence.startswith("Random reads, warm, fastest first: ")
    assert sentence.count("no clear difference from") == 2 and sentence.endswith("No step between neighbours was clear.")
    clear = {"zip": [200 + i for i in range(6)], "tar": [100 + i for i in range(6)], "npz": [187 + i for i in range(6)]}
    sentence = ch09.ranking_sentence(clear, "Sequential reads, warm")
    # Each factor is against the neighbour above: tar against npz (1.8x), not against zip (2.0x).
    # Each step carries the interval of its own factor (issue 42).
    assert sentence == ("Sequential reads, warm, fastest first: zip 202 samples/s; npz 190, 1.07× slower than zip "
                        "(1.05–1.09x); tar 102, 1.8× slower than npz (1.80–1.90x).")
    writing = ch09.ranking_sentence({"a": [1.0] * 6, "b": [2.0 + i / 100 for i in range(6)]}, "Writing", unit="s",
                                    highest=False, digits=2)
    assert writing == "Writing, quickest first: a 1.00 s; b 2.02, 2.0× longer than a (2.00–2.05x)."
    assert ch09.standing(clear, "zip") == "the fastest of 3, clearly ahead of npz, the next (1.07×, 1.05–1.09x)"
    assert ch09.standing(clear, "tar") == "third of 3, 1.8× slower than npz, the next faster (1.80–1.90x)"
    # A step the runs cannot call clear still shows how large a difference could hide in them.
    assert ch09.standing(same, "zip") == "third of 3, no clear difference from folder, the next faster (0.97–1.03x)"
    assert ch09.standing(same, "lmdb") == "the fastest of 3, not clearly ahead of folder, the next (0.97–1.03x)"


def _results(cold: dict, warm: dict, resident: dict | None = None) -> dict:
    """Measurement results as measure_formats returns them, for the random access only."""
    layouts = {}
    for name in cold:
        layouts[name] = {"rates": {"random": {"cold": cold[name], "warm": warm[name], "network model": None},
                                   "sequential": None},
                         "resident": (resident or {}).get(name, {}), "cold_read_share": 0.02}
    return {"layouts": layouts, "readahead_kb": 8192}


def test_no_cold_verdict_where_the_cold_reads_were_not_clearly_colder():
    from packlab.course.narration import ch09

    six = lambda centre: [centre + i for i in range(6)]  # noqa: E731
    results = _results(cold={"folder": six(300), "zip": six(150), "lmdb": six(6000), "npz": [100, 900, 200, 800, 300, 700]},
                       warm={"folder": six(3000), "zip": six(3000), "lmdb": six(5000), "npz": six(600)})
    sentence = ch09.cold_sentence(results, "random")
    ranked, rest = sentence.split(". ", 1)
    assert ranked == "Random reads, cold, fastest first: folder 302 samples/s; zip 152, 2.0× slower than folder (1.95–2.02x)"
    assert "lmdb" not in ranked and "npz" not in ranked  # no verdict on a cold figure as fast as the warm one
    assert "For lmdb the cold read was not colder than the warm one here (lmdb 6,002 cold against 5,002 warm" in rest
    assert "host" in rest and "SSD" in rest
    assert "For npz the cold median was lower than the warm one" in rest and "drawn from it either." in rest
    none_colder = _results(cold={"lmdb": six(6000)}, warm={"lmdb": six(5000)})
    assert ch09.cold_sentence(none_colder, "random").startswith(
        "Random reads, cold: no layout read clearly slower cold than warm. For lmdb the cold read was not colder")


def test_the_residency_sentence_speaks_of_each_layout():
    from packlab.course.narration import ch09

    six = [1.0] * 6
    resident = {"folder": {"before": 1.0, "after dropping": 0.0, "after the cold read": 0.02},
                "tar": {"before": 0.0, "after dropping": 0.0, "after the cold read": 0.1},
                "lmdb": {"before": 0.5, "after dropping": 0.001, "after the cold read": 0.021}}
    results = _results({n: six for n in resident}, {n: six for n in resident}, resident)
    text = ch09.residency_text(results)
    assert "folder 100%, tar 0%, lmdb 50%" in text and "at least" not in text
    assert "less than 1% of any layout's, so the cold reads started from the disk" in text
    assert "folder 1.00×, tar 5.0×, lmdb 1.00×" in text and "8,192 KiB" in text
    resident["tar"]["after dropping"] = 0.3
    assert "tar still had 30% of its pages cached, so its cold figure is partly warm" in ch09.residency_text(results)



def test_the_npz_verdict_names_the_zip_and_carries_its_interval():
    from packlab.course.narration import ch09

    def results(npz: list[float]) -> dict:
        six = [100.0 + i for i in range(6)]
        layouts = {name: {"rates": {access: {"warm": npz if name == "npz" else six, "network model": six}
                                    for access in ("random", "sequential")}}
                   for name in ("npz", "zip", "parquet", "lmdb", "hdf5", "tar", "folder")}
        return {"layouts": layouts}

    same = ch09.fit_figures(results([100.5 + i for i in range(6)]))["npz_vs_zip"]
    assert same.startswith("not clearly different from chapter 2's plain zip of the same JPEGs (") and "\u2013" in same
    faster = ch09.fit_figures(results([150.0 + i for i in range(6)]))["npz_vs_zip"]
    assert faster.startswith("clearly faster than chapter 2's plain zip of the same JPEGs (1.49x, ")

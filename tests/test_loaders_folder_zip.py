"""The folder and zip datasets of chapters 1-4: exactly once, right labels, bit-exact pixels.

Every loader runs with 4 workers under each start method on a slice of the dataset
(small archives of that slice are written into a temporary folder, so the tests do not
depend on the course's cached 2 GB raw zip). The naive zip dataset must keep failing the
way chapter 3 says it does; the error tests check that bad input names the file.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import zipfile
import zlib

import pytest
import torch
from torch.utils.data import ConcatDataset, DataLoader

from packlab import audit, data, pack, paths
from packlab.bench import run_until_error
from packlab.loaders import JpegFolderDataset, NaiveZipDataset, RawFolderDataset, ZipDataset, open_archive_in_worker
from packlab.transforms import CorruptImageError

START_METHODS = ["fork", "spawn", "forkserver"]
WORKERS = 4
SLICE_STEP = 32  # every 32nd sample: 313 samples spread over the whole dataset
TIMEOUT = 120  # seconds per batch; spawn start-up on a busy 2-core machine included

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

# forkserver workers are forked from one server process; importing torch there once, not in
# every worker, keeps these tests fast (no effect if the server is already running).
multiprocessing.set_forkserver_preload(["torch", "packlab.loaders", "packlab.audit"])


@pytest.fixture(scope="module")
def manifest():
    try:
        return data.load_manifest()
    except data.DatasetError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def subset(manifest):
    return manifest[::SLICE_STEP]


@pytest.fixture(scope="module")
def reference(subset):
    return audit.reference_digests([s.key for s in subset])


@pytest.fixture(scope="module")
def small_zips(tmp_path_factory, subset):
    folder = tmp_path_factory.mktemp("zips")
    return {
        members: pack.write_zip(folder / f"slice-{members}.zip", members=members, samples=subset, progress=False)
        for members in pack.MEMBER_KINDS
    }


def audit_with_workers(dataset, subset, reference, method, **loader_args):
    loader = DataLoader(
        dataset, batch_size=16, num_workers=WORKERS, multiprocessing_context=method, timeout=TIMEOUT, **loader_args
    )
    report = audit.audit_epoch(audit.records_from_batches(loader), subset, reference)
    assert report.ok, report.summary()
    assert report.delivered == len(subset)


@pytest.mark.parametrize("method", START_METHODS)
def test_zip_and_folder_datasets_exactly_once_bit_exact(method, small_zips, subset, reference):
    """ZipDataset (JPEG and raw members) and JpegFolderDataset, 4 workers, one loader for all three.

    Starting 4 spawn workers costs seconds, so the three datasets share one loader: a
    ConcatDataset read in order (the DataLoader's default), whose epoch is cut back
    into the three parts by position and each part audited on its own.
    """
    keys = [s.key for s in subset]
    parts = {
        "ZipDataset, jpeg members": ZipDataset(small_zips["jpeg"], return_key=True),
        "ZipDataset, raw members": ZipDataset(small_zips["raw"], return_key=True),
        "JpegFolderDataset": JpegFolderDataset(keys=keys, return_key=True),
    }
    loader = DataLoader(
        ConcatDataset(list(parts.values())),
        batch_size=16,
        num_workers=WORKERS,
        multiprocessing_context=method,
        timeout=TIMEOUT,
    )
    records = audit.records_from_batches(loader)
    assert len(records) == len(parts) * len(subset)
    for i, name in enumerate(parts):
        report = audit.audit_epoch(records[i * len(subset) : (i + 1) * len(subset)], subset, reference)
        assert report.ok, f"{name} under {method}: {report.summary()}"


def test_raw_folder_dataset_exactly_once_bit_exact(tmp_path, subset, reference):
    folder = pack.write_raw_folder(tmp_path / "raw", samples=subset, progress=False)
    audit_with_workers(RawFolderDataset(folder, keys=[s.key for s in subset], return_key=True), subset, reference, "fork")


def test_keys_select_a_slice_in_the_order_given(small_zips, subset):
    keys = [subset[3].key, subset[0].key]
    for dataset in (ZipDataset(small_zips["jpeg"], keys=keys, return_key=True), JpegFolderDataset(keys=keys, return_key=True)):
        assert len(dataset) == 2 and [dataset[i][2] for i in range(2)] == keys
        assert [dataset[i][1] for i in range(2)] == [subset[3].label, subset[0].label]
    with pytest.raises(data.DatasetError, match="777777"):
        ZipDataset(small_zips["jpeg"], keys=["777777"])
    with pytest.raises(data.DatasetError, match="777777"):
        JpegFolderDataset(keys=["777777"])


def test_zip_dataset_used_before_fork_and_worker_init_fn(small_zips, subset, reference):
    """A handle the parent opened (and is still using) is never shared with forked workers."""
    dataset = ZipDataset(small_zips["jpeg"], return_key=True)
    dataset[0]
    parent_handle = dataset.open()
    audit_with_workers(dataset, subset, reference, "fork", worker_init_fn=open_archive_in_worker)
    assert dataset.open() is parent_handle and parent_handle.fp is not None
    dataset.close()
    assert parent_handle.fp is None  # closed
    assert torch.equal(dataset[1][0], JpegFolderDataset(keys=[subset[1].key])[0][0])  # reopens on demand


def test_zip_dataset_workers_close_their_handles_at_exit(small_zips, monkeypatch):
    ctx = multiprocessing.get_context("fork")
    started, closed = ctx.SimpleQueue(), ctx.SimpleQueue()
    path = str(small_zips["jpeg"])
    original_close = zipfile.ZipFile.close

    def reporting_close(archive):
        if archive.fp is not None and archive.filename == path:
            closed.put(os.getpid())
        original_close(archive)

    monkeypatch.setattr(zipfile.ZipFile, "close", reporting_close)  # inherited by the forked workers
    loader = DataLoader(
        ZipDataset(path), batch_size=16, num_workers=2, multiprocessing_context=ctx, timeout=TIMEOUT,
        worker_init_fn=lambda worker_id: started.put(os.getpid()),
    )
    for _ in loader:  # the loader joins its workers at the end of the epoch
        pass
    workers, closers = set(), set()
    while not started.empty():
        workers.add(started.get())
    while not closed.empty():
        closers.add(closed.get())
    assert len(workers) == 2 and workers <= closers, f"workers {workers}, handles closed by {closers}"


def test_zip_dataset_pickles_without_its_handle(small_zips):
    dataset = ZipDataset(small_zips["raw"])
    dataset[0]
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._archive is None
    assert torch.equal(clone[3][0], dataset[3][0])
    dataset.close()
    clone.close()


def first_loader_error(loader):
    """Iterate a whole epoch; return the exception it raised (or None), with its workers shut down."""
    return run_until_error(loader)[1]


def test_naive_zip_dataset_fails_under_fork():
    dataset = NaiveZipDataset(pack.ensure_zip("jpeg", progress=False))
    loader = DataLoader(dataset, batch_size=64, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
    error = first_loader_error(loader)
    dataset.archive.close()
    assert isinstance(error, (zipfile.BadZipFile, zlib.error)), f"expected BadZipFile or zlib.error, got {error!r}"


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_naive_zip_dataset_cannot_be_pickled(method, small_zips):
    dataset = NaiveZipDataset(small_zips["jpeg"])
    loader = DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context=method, timeout=TIMEOUT)
    with pytest.raises(TypeError, match="cannot pickle"):
        iter(loader)
    dataset.archive.close()


def test_naive_zip_dataset_is_correct_without_workers(small_zips, subset, reference):
    dataset = NaiveZipDataset(small_zips["jpeg"], return_key=True)
    report = audit.audit_epoch(audit.records_from_batches(DataLoader(dataset, batch_size=16)), subset, reference)
    dataset.archive.close()
    assert report.ok, report.summary()


# ----------------------------------------------------------------------------- errors


def test_zip_missing_archive_is_named(tmp_path):
    missing = tmp_path / "nowhere.zip"
    with pytest.raises(FileNotFoundError, match="nowhere.zip"):
        ZipDataset(missing)


def test_zip_not_a_zip_is_named(tmp_path):
    bogus = tmp_path / "bogus.zip"
    bogus.write_bytes(b"this is not a zip archive at all" * 10)
    with pytest.raises(zipfile.BadZipFile, match="bogus.zip"):
        ZipDataset(bogus)


def test_zip_without_labels_is_named(tmp_path):
    path = tmp_path / "nolabels.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("000000.jpg", b"x")
    with pytest.raises(data.DatasetError, match="nolabels.zip.*labels.csv"):
        ZipDataset(path)


def test_zip_member_without_label_is_not_dropped(tmp_path, subset):
    path = pack.write_zip(tmp_path / "extra.zip", samples=subset[:2], progress=False)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("999999.jpg", b"x")
    with pytest.raises(data.DatasetError, match="999999"):
        ZipDataset(path)


def test_zip_bad_crc_names_member_and_archive(tmp_path, subset):
    path = pack.write_zip(tmp_path / "damaged.zip", samples=subset[:3], progress=False)
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(pack.member_name(subset[1].key, "jpeg"))
    # Flip one byte in the middle of the member's data (after its 30-byte header and name).
    offset = info.header_offset + 30 + len(info.filename) + info.file_size // 2
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))
    dataset = ZipDataset(path)
    dataset[0]
    with pytest.raises(zipfile.BadZipFile, match=rf"{subset[1].key}\.jpg.*damaged\.zip"):
        dataset[1]
    dataset.close()


def test_zip_corrupt_jpeg_member_is_named(tmp_path):
    path = tmp_path / "corrupt.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(pack.ZIP_LABELS_MEMBER, "key,label\n000000,3\n")
        archive.writestr("000000.jpg", b"not a jpeg")
    with pytest.raises(CorruptImageError, match=r"corrupt\.zip:000000\.jpg"):
        ZipDataset(path)[0]


def _tiny_root(tmp_path, manifest, count=3):
    root = tmp_path / "root"
    (root / "images").mkdir(parents=True)
    for sample in manifest[:count]:
        (root / "images" / f"{sample.key}.jpg").write_bytes(data.image_path(sample.key).read_bytes())
    (root / "labels.csv").write_text("key,label\n" + "".join(f"{s.key},{s.label}\n" for s in manifest[:count]))
    return root


def test_folder_missing_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "images")):
        JpegFolderDataset(tmp_path)


def test_folder_missing_labels_is_named(tmp_path, manifest):
    root = _tiny_root(tmp_path, manifest)
    os.remove(paths.labels_path(root))
    with pytest.raises(data.DatasetError, match="labels.csv"):
        JpegFolderDataset(root)


def test_folder_missing_and_corrupt_files_are_named(tmp_path, manifest):
    root = _tiny_root(tmp_path, manifest)
    dataset = JpegFolderDataset(root, return_key=True)
    assert dataset[0][1:] == (manifest[0].label, manifest[0].key)
    data.image_path(manifest[1].key, root).write_bytes(b"\xff\xd8 truncated")
    with pytest.raises(CorruptImageError, match=f"{manifest[1].key}.jpg"):
        dataset[1]
    os.remove(data.image_path(manifest[2].key, root))
    with pytest.raises(FileNotFoundError, match=f"{manifest[2].key}.jpg.*labels.csv"):
        dataset[2]


def test_stage_cost_plot_has_units_and_every_stage():
    from packlab import plots

    fig = plots.plot_stage_costs({"open + read": 20e-6, "decode": 1e-3, "collate": 2e-4})
    ax = fig.axes[0]
    assert "µs" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["open + read", "decode", "collate"]
    assert [round(p.get_width()) for p in ax.patches] == [20, 1000, 200]

"""The folder and zip datasets of chapters 1-4: key slices, and ZipDataset's per-process handles.

ZipDataset must never read through a handle another process opened (even when the parent
used it before the workers started), must close its workers' handles when they exit, and
must pickle without its handle. The tests read a slice of the dataset, packed into small
archives in a temporary folder so they do not depend on the course's cached 2 GB raw zip.
PreadZipDataset reads with os.pread, so the descriptor it opens in ``__init__`` may be
shared with forked workers; it must deliver the same samples as ZipDataset, stored or
deflated. Exactly-once epochs under every start method are in test_start_methods.py; bad
input (corrupt, missing and damaged files) is in test_bad_input.py.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import zipfile

import pytest
import torch
from torch.utils.data import DataLoader

from packlab import audit, data, pack
from packlab.loaders import JpegFolderDataset, PreadZipDataset, ZipDataset, open_archive_in_worker

WORKERS = 4
SLICE_STEP = 32  # every 32nd sample: 313 samples spread over the whole dataset
TIMEOUT = 120  # seconds per batch

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


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


@pytest.mark.parametrize("compression", ["stored", "deflated"])
def test_pread_zip_dataset_reads_what_zip_dataset_reads(tmp_path, subset, compression):
    path = pack.write_zip(tmp_path / f"{compression}.zip", samples=subset[:12], compression=compression, progress=False)
    with ZipDataset(path, return_key=True) as reference, PreadZipDataset(path, return_key=True) as pread:
        assert pread.keys == reference.keys and pread.labels == reference.labels
        for i in range(len(reference)):
            assert torch.equal(pread[i][0], reference[i][0]) and pread[i][1:] == reference[i][1:]
            assert pread.read_member(pread.members[i]) == reference.read_member(reference.members[i])


def test_pread_zip_dataset_shares_its_descriptor_with_forked_workers(small_zips, subset, reference):
    """Opened in __init__ and used by the parent first, like NaiveZipDataset, yet correct: pread has no shared offset."""
    dataset = PreadZipDataset(small_zips["raw"], return_key=True)
    dataset[0]
    inherited = dataset.open()
    audit_with_workers(dataset, subset, reference, "fork", shuffle=True)
    assert dataset.open() is inherited  # the parent's file was never replaced
    dataset.close()
    assert inherited.closed and dataset[1][2] == subset[1].key  # reopens on demand


def test_pread_zip_dataset_pickles_without_its_file(small_zips):
    dataset = PreadZipDataset(small_zips["jpeg"])
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone._archive is None and torch.equal(clone[3][0], dataset[3][0])
    dataset.close()
    clone.close()


def test_pread_zip_dataset_finds_data_behind_a_local_extra_field_of_another_length(small_zips):
    """The central directory's extra field is only a guess at the local one: a wrong guess costs a second read."""
    dataset = PreadZipDataset(small_zips["jpeg"])
    member = dataset.members[2]
    expected = dataset.read_member(member)
    offset, name, extra, stored_size, size, crc, method = dataset.spans[member]
    for wrong in (extra + 9, 0 if extra else None):
        if wrong is not None:
            dataset.spans[member] = (offset, name, wrong, stored_size, size, crc, method)
            assert dataset.read_member(member) == expected
    dataset.close()


def test_stage_cost_plot_has_units_and_every_stage():
    from packlab import plots

    fig = plots.plot_stage_costs({"open + read": 20e-6, "decode": 1e-3, "collate": 2e-4})
    ax = fig.axes[0]
    assert "µs" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["open + read", "decode", "collate"]
    assert [round(p.get_width()) for p in ax.patches] == [20, 1000, 200]

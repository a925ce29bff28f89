"""Slow-storage tools: cold reads and the network-filesystem model change timing, never bytes."""

from __future__ import annotations

import shutil
import time
import zipfile

import pytest
import torch
from torch.utils.data import DataLoader

from packlab import audit, data, pack, storage
from packlab.loaders import JpegFolderDataset, TarShardDataset, ZipDataset

FAST_MODEL = storage.NetworkFSModel(open_s=0.001, request_s=0.0002, bandwidth=1e9)


@pytest.fixture(scope="module")
def root(small_root, tmp_path_factory):
    copy = tmp_path_factory.mktemp("storage") / "data"
    shutil.copytree(small_root, copy)
    return copy


def test_the_model_returns_the_same_bytes_and_seeks(root):
    path = data.image_path("000003", root)
    with FAST_MODEL.open(path) as f:
        assert f.read() == path.read_bytes()
        f.seek(10)
        assert f.read(5) == path.read_bytes()[10:15]


def test_the_model_charges_one_open_and_one_request_per_small_file(root, monkeypatch):
    slept = []
    monkeypatch.setattr(storage.time, "sleep", slept.append)
    model = storage.NetworkFSModel()
    path = data.image_path("000004", root)
    with model.open(path) as f:
        f.read()
    size = path.stat().st_size
    assert slept == [pytest.approx(model.open_s), pytest.approx(model.request_s + size / model.bandwidth)]
    assert sum(slept) == pytest.approx(model.predict_seconds(1, 1, size))


def test_every_loader_reads_through_the_model_and_still_delivers_every_sample_once(root):
    manifest = data.load_manifest(root)
    reference = audit.reference_digests([s.key for s in manifest], root)
    zip_path = pack.ensure_zip(root=root, progress=False)
    shards = pack.ensure_tar_shards(maxcount=20, root=root, progress=False)
    datasets = {
        "folder": JpegFolderDataset(root, return_key=True, opener=FAST_MODEL.open),
        "zip": ZipDataset(zip_path, return_key=True, opener=FAST_MODEL.open),
        "tar": TarShardDataset(shards, return_key=True, opener=FAST_MODEL.open),
    }
    for name, dataset in datasets.items():
        loader = DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context="fork", timeout=60)
        report = audit.audit_epoch(audit.records_from_batches(loader), manifest, reference)
        assert report.ok, f"{name}: {report.summary()}"


@pytest.mark.skipif(not storage.page_cache_control_available(), reason="posix_fadvise is Linux-only")
def test_dropping_pages_reports_the_bytes_and_leaves_files_intact(root):
    files = [data.image_path(s.key, root) for s in data.load_manifest(root)[:10]]
    before = [f.read_bytes() for f in files]
    assert storage.drop_from_page_cache(files) == sum(len(b) for b in before)
    assert [f.read_bytes() for f in files] == before


def test_probe_reports_per_file_latency(root):
    files = [data.image_path(s.key, root) for s in data.load_manifest(root)[:20]]
    probe = storage.probe_open_latency(files)
    assert probe["files"] == 20 and 0 < probe["median_s"] <= probe["p90_s"]
    assert probe["level"] == (storage.DATA_PAGES if storage.page_cache_control_available() else storage.WARM)
    assert storage.probe_open_latency(files, cold=False)["level"] == storage.WARM
    with pytest.raises(ValueError):
        storage.probe_open_latency([])


def test_the_prediction_counts_opens_requests_and_bytes_per_layout():
    model = storage.NetworkFSModel(open_s=0.002, request_s=0.001, bandwidth=1e6, min_request=1000, max_request=4000)
    predicted = storage.predict_reading(model, file_sizes=[500] * 10, shard_sizes=[5000, 2000])
    assert predicted["tar_requests"] == 2 + 1  # ceil(5000/4000) + ceil(2000/4000)
    assert predicted["folder_s_per_file"] == pytest.approx(0.002 + 0.001 + 500 / 1e6)
    assert predicted["zip_pread_s_per_member"] == pytest.approx(0.001 + 1000 / 1e6)  # at least one read-ahead block
    assert predicted["zip_requests_per_member"] == 1  # header and data fit the first window
    assert predicted["zip_s_per_member"] == pytest.approx(0.001 + 1000 / 1e6)
    assert predicted["tar_s_all_shards"] == pytest.approx(2 * 0.002 + 3 * 0.001 + 7000 / 1e6)
    assert predicted["files_per_s"]["tar"] == pytest.approx(10 / predicted["tar_s_all_shards"])


def test_the_zip_prediction_counts_the_requests_the_readers_really_make(root):
    """ZipFile reads a member's header, then its data: two requests for a member larger than one window;
    PreadZipDataset one. The model's arithmetic must count what the modelled files charge."""
    from packlab.loaders import PreadZipDataset, ZipDataset
    from packlab.loaders.tar import skip_decode

    model = storage.NetworkFSModel(open_s=0, request_s=0, bandwidth=1e12, min_request=16 * 1024)
    samples = data.load_manifest(root)[:30]
    archive = pack.write_zip(root / "requests.zip", samples=samples, root=root, progress=False)
    predicted = storage.predict_reading(model, [s.bytes for s in samples], [1])
    assert predicted["zip_requests_per_member"] > 1.5  # the dataset's JPEGs are larger than 16 KiB
    for reader, per_member in ((ZipDataset, predicted["zip_requests_per_member"]), (PreadZipDataset, 1)):
        files = []
        dataset = reader(archive, transform=skip_decode, opener=lambda path: files.append(model.open(path)) or files[-1])
        dataset[0]  # opens the archive and reads its directory
        before = sum(f.requests for f in files)
        for i in range(len(samples) - 1, 0, -1):  # backwards: every member is a jump
            dataset[i]
        made = (sum(f.requests for f in files) - before) / (len(samples) - 1)
        assert made == pytest.approx(per_member, abs=0.1), reader.__name__
        dataset.close()


# ------------------------------------------------------------- cold levels and positional reads


def test_cold_levels_name_what_they_drop_and_refuse_unknown_levels(root):
    assert list(storage.COLD_LEVELS) == [storage.DATA_PAGES, storage.ALL_CACHES]
    assert set(storage.cold_levels()) <= set(storage.COLD_LEVELS)
    files = [data.image_path("000001", root)]
    with pytest.raises(ValueError, match="level must be one of"):
        storage.make_cold(files, "lukewarm")
    assert storage.cold_read_seconds(lambda: files[0].read_bytes(), files, storage.WARM) >= 0


def test_dropping_all_caches_needs_root_and_says_what_to_use_instead(monkeypatch):
    monkeypatch.setattr(storage.os, "geteuid", lambda: 1000)
    assert storage.ALL_CACHES not in storage.cold_levels()
    with pytest.raises(PermissionError, match="data pages"):
        storage.drop_all_caches()


def test_dropping_all_caches_syncs_then_writes_3(monkeypatch, tmp_path):
    """As root: sync first (only clean pages can be dropped), then 3 = page cache + dentries and inodes."""
    knob = tmp_path / "drop_caches"
    knob.write_text("")
    events = []
    monkeypatch.setattr(storage, "_DROP_CACHES", knob)
    monkeypatch.setattr(storage.os, "geteuid", lambda: 0)
    monkeypatch.setattr(storage.os, "sync", lambda: events.append(("sync", knob.read_text())))
    assert storage.cold_levels()[-1] == storage.ALL_CACHES
    storage.make_cold([], storage.ALL_CACHES)
    assert events == [("sync", "")] and knob.read_text() == "3\n"


def test_read_at_leaves_the_file_offset_alone_locally_and_in_the_model(root, monkeypatch):
    path = data.image_path("000005", root)
    whole = path.read_bytes()
    with open(path, "rb") as f:
        f.seek(7)
        assert storage.read_at(f, 100, 50) == whole[100:150]
        assert f.tell() == 7 and storage.read_at(f, len(whole) - 10, 50) == whole[-10:]
    slept = []
    monkeypatch.setattr(storage.time, "sleep", slept.append)
    model = storage.NetworkFSModel(min_request=1024)
    with model.open(path) as f:
        f.seek(3)
        assert storage.read_at(f, 2000, 100) == whole[2000:2100]
        assert storage.read_at(f, 2500, 100) == whole[2500:2600]  # inside the 1 KiB just fetched: free
        assert f.tell() == 3 and f.read(4) == whole[3:7]
    requests = slept[1:]  # after the open
    assert requests[:1] == [pytest.approx(model.request_seconds(1024))] and len(requests) == 2  # then the f.read


def test_a_shared_link_serialises_the_transfers_of_every_process():
    """Two forked processes that each move 0.2 s worth of bytes at once take 0.4 s on a shared link.

    A lower bound, so it holds on a busy machine too: the bookings alone make the second
    transfer end at least 0.4 s after the first began.
    """
    import multiprocessing

    model = storage.NetworkFSModel(request_s=0.0, bandwidth=1e6, shared_link=True)
    context = multiprocessing.get_context("fork")
    start = time.monotonic()
    readers = [context.Process(target=model.wait_for_request, args=(200_000,)) for _ in range(2)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(30)
    assert [r.exitcode for r in readers] == [0, 0]
    assert time.monotonic() - start >= 0.39
    assert "shared by all readers" in model.describe() and model.shared_link is True


def test_without_a_shared_link_each_reader_has_the_bandwidth_to_itself():
    model = storage.NetworkFSModel(request_s=0.0, bandwidth=1e6)
    assert model.request_seconds(200_000) == pytest.approx(0.2) and "for each reader" in model.describe()


def test_what_the_waiting_only_prediction_leaves_out_is_measured_sensibly(tmp_path):
    from packlab import small_files
    from packlab.formats import bench as formats_bench

    # Batches go to the workers in turn: 100 files in batches of 64 leave one worker 64 of them.
    assert small_files.busiest_reader_files(100, 64, 2) == 64
    assert small_files.busiest_reader_files(300, 64, 2) == 172  # 64 + 64 + 44 against 64 + 64
    assert small_files.busiest_reader_files(300, 64, 0) == 300  # no workers: the main process reads them all
    assert small_files.busiest_reader_files(128, 64, 2) == 64
    # A sleep never takes less than asked; starting workers and a first batch takes some time.
    assert 0 <= small_files.sleep_overshoot_s(0.0005, times=5) < 0.5
    assert 0 < small_files.worker_start_s(1) < 60
    readahead = formats_bench.device_readahead_kb(tmp_path)
    assert readahead is None or readahead >= 0

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
    with pytest.raises(ValueError):
        storage.probe_open_latency([])


def test_the_prediction_counts_opens_requests_and_bytes_per_layout():
    model = storage.NetworkFSModel(open_s=0.002, request_s=0.001, bandwidth=1e6, min_request=1000, max_request=4000)
    predicted = storage.predict_reading(model, file_sizes=[500] * 10, shard_sizes=[5000, 2000])
    assert predicted["tar_requests"] == 2 + 1  # ceil(5000/4000) + ceil(2000/4000)
    assert predicted["folder_s_per_file"] == pytest.approx(0.002 + 0.001 + 500 / 1e6)
    assert predicted["zip_s_per_member"] == pytest.approx(0.001 + 1000 / 1e6)  # at least one read-ahead block
    assert predicted["tar_s_all_shards"] == pytest.approx(2 * 0.002 + 3 * 0.001 + 7000 / 1e6)
    assert predicted["files_per_s"]["tar"] == pytest.approx(10 / predicted["tar_s_all_shards"])

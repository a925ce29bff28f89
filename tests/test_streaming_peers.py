"""MosaicML Streaming (MDS) and LitData on the course's data: written, read with 2 workers, audited, stopped and resumed.

Both libraries run here with the course's numpy (mosaicml-streaming is installed without its
declared dependencies, see pyproject.toml's [tool.packlab]); these tests are what shows that
its writer and reader work with it.
"""

from __future__ import annotations

from collections import Counter

import pytest

from packlab import audit
from packlab.loaders import streaming_peers
from packlab.resume import stop_and_resume
from packlab.transforms import standard_transform

LIBRARIES = {"mds": (streaming_peers.ensure_mds, streaming_peers.mds_loader),
             "litdata": (streaming_peers.ensure_litdata, streaming_peers.litdata_loader)}


@pytest.fixture(scope="module")
def written(small_root, tmp_path_factory):
    import shutil

    root = tmp_path_factory.mktemp("peers") / "data"
    shutil.copytree(small_root, root)
    return root, {name: ensure(root) for name, (ensure, _) in LIBRARIES.items()}


@pytest.mark.parametrize("library", LIBRARIES)
def test_two_workers_deliver_every_sample_once_with_the_right_pixels(written, small_manifest, library):
    root, folders = written
    loader = LIBRARIES[library][1](folders[library], workers=2, batch_size=8, transform=standard_transform,
                                   with_key=True)
    records = audit.records_from_batches(streaming_peers.key_batches(loader))
    report = audit.audit_epoch(records, small_manifest, audit.reference_digests([s.key for s in small_manifest], root))
    assert report.ok and report.pixels_checked == len(small_manifest), report.summary()


@pytest.mark.parametrize("library", LIBRARIES)
def test_standard_batches_for_the_benchmark(written, library):
    _, folders = written
    images, labels = next(iter(LIBRARIES[library][1](folders[library], workers=2, batch_size=8)))
    assert tuple(images.shape) == (8, 3, 256, 256) and str(images.dtype) == "torch.float32" and labels.shape == (8,)


@pytest.mark.parametrize("library", LIBRARIES)
def test_stopped_and_resumed_every_sample_once(written, small_manifest, library):
    _, folders = written

    def make():
        return LIBRARIES[library][1](folders[library], workers=2, batch_size=4, transform=lambda b, s: len(b),
                                     with_key=True)

    first, rest = stop_and_resume(make, stop_after=3)
    counts = Counter(first + rest)
    assert len(first) == 12 and sorted(counts) == sorted(s.key for s in small_manifest), (len(first), len(rest))
    assert set(counts.values()) == {1}, Counter(counts.values())


def test_a_second_write_of_the_same_samples_is_skipped(written):
    root, folders = written
    stamp = (folders["mds"] / "index.json").stat().st_mtime_ns
    assert streaming_peers.ensure_mds(root) == folders["mds"]
    assert (folders["mds"] / "index.json").stat().st_mtime_ns == stamp


def test_an_mds_name_taken_by_another_job_between_looking_and_creating(written, monkeypatch):
    # What failed make test once: two notebooks started an MDS dataset at the same moment, both
    # found prefix N free, and the second one's creation of N_locals raised FileExistsError.
    from multiprocessing import shared_memory

    from streaming.base.shared import prefix

    _, folders = written
    looked = prefix._check_and_find_retrying
    taken = []

    def another_job_creates_it_first(streams_local, streams_remote, shm_name, retry):
        found = looked(streams_local, streams_remote, shm_name, retry)
        if not taken and shm_name == "locals":
            taken.append(shared_memory.SharedMemory(f"{found:06}_locals", create=True, size=64))
        return found

    monkeypatch.setattr(prefix, "_check_and_find_retrying", another_job_creates_it_first)
    try:
        dataset = streaming_peers.mds_dataset(folders["mds"], batch_size=4)
        assert taken and dataset._shm_prefix_int > int(taken[0].name.strip("/")[:6])
    finally:
        for segment in taken:
            segment.close()
            segment.unlink()


def test_an_mds_name_never_free_is_a_clear_error():
    def always_taken():
        raise FileExistsError(17, "File exists", "/000003_locals")

    with pytest.raises(RuntimeError, match=r"/dev/shm after 2 tries .*left over from killed ones"):
        streaming_peers.registered_mds(always_taken, attempts=2)

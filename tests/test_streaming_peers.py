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

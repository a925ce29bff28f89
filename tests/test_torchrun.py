"""Two ranks x two workers under torchrun: every key exactly once, for tar shards and for the zip.

Each run starts real processes (torchrun, two ranks, two DataLoader workers per rank) on
a small dataset; :func:`packlab.distributed.launch` kills the lot if it takes longer
than ``LAUNCH_TIMEOUT`` seconds, so a stuck rank fails the test instead of hanging it.
"""

from __future__ import annotations

import pytest

from packlab import data, distributed, pack

COUNT = 240
LAUNCH_TIMEOUT = 300  # seconds for a whole torchrun launch, start-up of three Python processes included
RANK_TIMEOUT = 120  # seconds for the process group and the DataLoaders inside each rank


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return data.generate(tmp_path_factory.mktemp("torchrun-data"), count=COUNT, seed=5, workers=2, progress=False)


@pytest.fixture(scope="module")
def manifest(root):
    return data.load_manifest(root)


def run(tmp_path, *args):
    out = tmp_path / "records"
    distributed.launch(
        [*args, "--out", out, "--workers", 2, "--batch-size", 16, "--timeout", RANK_TIMEOUT],
        nproc=2,
        timeout=LAUNCH_TIMEOUT,
    )
    return distributed.read_rank_records(out)


def assert_two_even_ranks(records):
    assert [r["rank"] for r in records] == [0, 1]
    assert all(r["world_size"] == 2 and r["workers"] == 2 for r in records)
    assert records[0]["batches_per_rank"] == records[1]["batches_per_rank"] == [r["batches"] for r in records]
    assert records[0]["batches"] == records[1]["batches"], "uneven ranks would stall collective training"


def test_tar_shards_two_ranks_two_workers_every_key_exactly_once(root, manifest, tmp_path):
    shards = pack.write_tar_shards(tmp_path / "shards", root=root, maxcount=30, progress=False)  # 8 shards
    records = run(tmp_path, "--loader", "tar", "--shards", pack.brace_pattern(shards), "--epoch", 3)
    assert_two_even_ranks(records)
    assert not distributed.keys_on_several_ranks(records)
    report = distributed.audit_ranks(records, manifest)
    assert report.ok, report.summary()


def test_zip_with_distributed_sampler_two_ranks_two_workers_every_key_exactly_once(root, manifest, tmp_path):
    archive = pack.write_zip(tmp_path / "images.zip", root=root, progress=False)
    records = run(tmp_path, "--loader", "zip", "--zip", archive, "--epoch", 1)
    assert_two_even_ranks(records)
    assert all(r["sampler_length"] == COUNT // 2 for r in records)
    report = distributed.audit_ranks(records, manifest)
    assert report.ok, report.summary()


def test_too_few_shards_stop_every_rank_before_the_first_batch(root, tmp_path):
    shards = pack.write_tar_shards(tmp_path / "shards", root=root, maxcount=80, progress=False)  # 3 shards
    with pytest.raises(RuntimeError) as failure:
        run(tmp_path, "--loader", "tar", "--shards", pack.brace_pattern(shards), "--no-decode")
    assert "3 shards cannot feed 2 rank(s) x 2 worker(s) = 4 readers" in str(failure.value)
    assert not (tmp_path / "records").exists()  # no rank read anything


def test_a_launch_that_outlives_its_timeout_is_killed():
    import time

    start = time.perf_counter()
    # Importing torch alone takes longer than half a second, so this launch cannot finish in time.
    with pytest.raises(TimeoutError, match="did not finish within"):
        distributed.launch(["--help"], nproc=2, timeout=0.5)
    assert time.perf_counter() - start < 30

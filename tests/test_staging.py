"""Staging shards to node-local disk: complete copies only, reuse, the node split, the break-even arithmetic."""

from __future__ import annotations

import io
import math

import pytest

from packlab import audit, pack, staging, storage
from packlab.loaders.tar import ShardError, ShardSplitError, TarShardDataset, open_shard, skip_decode

@pytest.fixture(scope="module")
def shards(small_root, tmp_path_factory):
    return pack.write_tar_shards(tmp_path_factory.mktemp("stage-src"), root=small_root, maxcount=15, progress=False)


def test_staged_shards_are_byte_identical_and_no_partial_file_is_left(shards, tmp_path):
    report = staging.stage_shards(shards, tmp_path / "local")
    assert [p.name for p in report.paths] == [s.name for s in shards]
    assert all(p.read_bytes() == s.read_bytes() for p, s in zip(report.paths, shards))
    assert sorted(p.name for p in (tmp_path / "local").iterdir()) == sorted(s.name for s in shards)  # no .partial
    assert report.bytes_copied == sum(s.stat().st_size for s in shards)
    assert "4 copied" in report.summary()


def test_a_second_staging_reuses_complete_copies_and_replaces_wrong_ones(shards, tmp_path):
    staging.stage_shards(shards, tmp_path)
    (tmp_path / shards[1].name).write_bytes(b"a shard cut short")
    again = staging.stage_shards(shards, tmp_path)
    assert [s.copied for s in again.shards] == [False, True, False, False]
    assert (tmp_path / shards[1].name).read_bytes() == shards[1].read_bytes()


def test_a_copy_already_there_is_checked_by_its_size_without_reading_the_source(shards, tmp_path):
    staging.stage_shards(shards, tmp_path)

    def no_reads(name):
        raise AssertionError(f"{name} was opened for reading although its copy is complete")

    again = staging.stage_shards(shards, tmp_path, no_reads)  # local sources: the file's size
    assert not any(s.copied for s in again.shards)

    class SizedOpener:  # as S3ShardOpener: size() is a HEAD, __call__ a GET
        def __init__(self):
            self.sized, self.opened = [], []

        def size(self, name):
            self.sized.append(name)
            return (shards[0].parent / name.rsplit("/", 1)[-1]).stat().st_size

        def __call__(self, name):
            self.opened.append(name)
            return open_shard(str(shards[0].parent / name.rsplit("/", 1)[-1]))

    opener = SizedOpener()
    urls = [f"s3://bucket/shards/{s.name}" for s in shards]
    (tmp_path / shards[2].name).write_bytes(b"cut short")
    third = staging.stage_shards(urls, tmp_path, opener)
    assert [s.copied for s in third.shards] == [False, False, True, False]
    assert opener.sized == urls and opener.opened == [urls[2]]  # only the wrong copy was read again
    assert (tmp_path / shards[2].name).read_bytes() == shards[2].read_bytes()


def test_a_copy_cut_short_raises_and_never_appears_under_the_final_name(shards, tmp_path):
    class Short(io.BytesIO):
        size = shards[0].stat().st_size  # what the server announced

    def short_opener(name):
        return Short(open_shard(name).read()[:10_000])

    with pytest.raises(ShardError, match="copied 10,000 bytes, the source has"):
        staging.stage_shard(str(shards[0]), tmp_path, short_opener)
    assert list(tmp_path.iterdir()) == []


def test_staging_reads_through_any_opener_such_as_the_network_model(shards, tmp_path):
    model = storage.NetworkFSModel(open_s=0.0, request_s=0.0, bandwidth=1e12)
    report = staging.stage_shards(shards, tmp_path, model.open)
    assert all(p.read_bytes() == s.read_bytes() for p, s in zip(report.paths, shards))


def test_each_node_stages_a_fixed_part_and_together_they_read_every_key_once(shards, small_manifest, tmp_path):
    """Two nodes x two local ranks, over two epochs: the shard order changes inside a node, the parts never do."""
    names = [str(s) for s in shards]  # 4 shards: 2 per node, 1 per local rank
    epochs: dict[int, list] = {0: [], 1: []}
    for node in range(2):
        local = staging.stage_shards(staging.node_shards(names, node, 2), tmp_path / f"node{node}").paths
        for local_rank in range(2):
            dataset = TarShardDataset(local, rank=local_rank, world_size=2, transform=skip_decode, return_key=True)
            for epoch in epochs:
                dataset.set_epoch(epoch)
                epochs[epoch] += [(key, label, None) for _, label, key in dataset]
    for epoch, records in epochs.items():
        report = audit.audit_epoch(records, small_manifest)
        assert report.ok, f"epoch {epoch}: {report.summary()}"
    with pytest.raises(ShardSplitError, match="cannot be shared equally by 3 nodes"):
        staging.node_shards(names, 0, 3)


def test_break_even_epochs():
    assert staging.break_even_epochs(copy_seconds=10, in_place_epoch_seconds=7, local_epoch_seconds=2) == 2
    assert math.isinf(staging.break_even_epochs(10, 2, 2))  # local is no faster: staging never pays


def test_the_node_local_folder_follows_the_site_s_variables():
    assert staging.node_local_dir({}) == staging.Path("/tmp")
    assert staging.node_local_dir({"TMPDIR": "/scratch/job"}) == staging.Path("/scratch/job")
    assert staging.node_local_dir({"TMPDIR": "/a", "SLURM_TMPDIR": "/b"}) == staging.Path("/b")
    assert staging.node_local_dir({"SLURM_TMPDIR": "/b", "PACKLAB_STAGE_DIR": "/c"}) == staging.Path("/c")


def test_the_command_stages_this_node_s_part(shards, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_NNODES", "2")
    pattern = str(shards[0].parent / "shard-*.tar")
    assert staging.main(["--shards", pattern, "--dest", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [shards[1].name, shards[3].name]
    assert "node 1/2" in capsys.readouterr().out

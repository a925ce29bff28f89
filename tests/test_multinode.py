"""Two torchrun agents on this machine, standing for two nodes: 2 nodes x 2 ranks x 2 workers, every key once.

The agents meet at a c10d rendezvous on 127.0.0.1, as agents on two machines would at
the first node's address. :func:`packlab.distributed.launch_nodes` kills both agents and
their ranks if the launch outlives ``LAUNCH_TIMEOUT``, so a stuck rendezvous fails the
test instead of hanging it.
"""

from __future__ import annotations

import pytest

from packlab import data, distributed, pack

COUNT = 240
MAXCOUNT = 30  # -> 8 shards: one per reader (2 nodes x 2 ranks x 2 workers)
LAUNCH_TIMEOUT = 600  # seconds: two agents, four ranks, eight workers start on a shared 2-core machine
RANK_TIMEOUT = 180  # seconds for the process group and each rank's DataLoader


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return data.generate(tmp_path_factory.mktemp("multinode-data"), count=COUNT, seed=17, workers=2, progress=False)


def test_two_agents_two_ranks_each_two_workers_each_read_every_key_exactly_once(root, tmp_path):
    shards = pack.write_tar_shards(tmp_path / "shards", root=root, maxcount=MAXCOUNT, progress=False)
    assert len(shards) == 8
    out = tmp_path / "records"
    outputs = distributed.launch_nodes(
        ["--loader", "tar", "--shards", pack.brace_pattern(shards), "--out", out, "--workers", 2,
         "--batch-size", 16, "--no-decode", "--epoch", 2, "--timeout", RANK_TIMEOUT],
        nnodes=2, nproc=2, timeout=LAUNCH_TIMEOUT,
    )  # fmt: skip
    records = distributed.read_rank_records(out)

    # Four ranks, two per node, numbered by the rendezvous.
    assert [r["rank"] for r in records] == [0, 1, 2, 3] and {r["world_size"] for r in records} == {4}
    assert sorted((r["node"], r["local_rank"]) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # torchrun says it ignores --node-rank with the c10d rendezvous (our command passes it, as job scripts do).
    assert any("node_rank is only used for static rdzv_backend" in o for o in outputs)

    # Equal epochs on every rank, no key on two ranks, and the union is the dataset, each key once.
    assert len({r["batches"] for r in records}) == 1 and records[0]["batches_per_rank"] == [r["batches"] for r in records]
    assert not distributed.keys_on_several_ranks(records)
    report = distributed.audit_ranks(records, data.load_manifest(root))
    assert report.ok, report.summary()


def test_nodes_holding_different_numbers_of_staged_shards_stop_every_rank(tmp_path, monkeypatch):
    """--split node-local: the ranks compare their nodes' shard counts before reading, and all refuse alike."""
    import torch.distributed as dist

    from packlab.loaders.tar import ShardSplitError

    for i in range(3):
        (tmp_path / f"shard-{i:06d}.tar").write_bytes(b"")
    args = distributed.parse_args(["--loader", "tar", "--split", "node-local", "--shards", str(tmp_path / "*.tar"),
                                   "--out", str(tmp_path / "out")])

    def gather_from_two_nodes(out, mine):  # what all_gather_object would collect: node 1 staged only 2 shards
        out[:] = [mine, mine, ("1", 2), ("1", 2)]

    monkeypatch.setattr(dist, "all_gather_object", gather_from_two_nodes)
    with pytest.raises(ShardSplitError, match=r"different numbers of staged shards \(\{'0': 3, '1': 2\}"):
        distributed._check_nodes_hold_equal_parts(args, world_size=4)


def test_agents_that_outlive_the_launch_timeout_are_killed():
    import time

    start = time.perf_counter()
    with pytest.raises(TimeoutError, match="did not finish within"):
        distributed.launch_nodes(["--help"], nnodes=2, nproc=1, timeout=0.5)
    assert time.perf_counter() - start < 30

"""TarShardDataset: the shard split, exactly-once epochs, shuffling, errors, and webdataset interop."""

from __future__ import annotations

import io
import random
import tarfile
import time
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader

from packlab import audit, data, pack
from packlab.bench import run_until_error
from packlab.loaders import tar as tarloader
from packlab.loaders.tar import (
    ShardError,
    ShardSplitError,
    TarShardDataset,
    check_shard_split,
    count_samples,
    epoch_shard_order,
    label_mixing,
    shard_assignment,
    shuffle_buffer,
    skip_decode,
    split_shards_by_rank,
    split_shards_by_worker,
)
from packlab.remote import serve_directory, unresponsive_server
from packlab.transforms import standard_transform

# Two tests use four workers on purpose; torch warns that this is more than two cores.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

COUNT = 300
MAXCOUNT = 25  # -> 12 shards: enough for 4 workers, and for 2 ranks x 2 workers
TIMEOUT = 120  # seconds a DataLoader waits for a worker's batch before failing the test


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A 300-image dataset, generated once for this module."""
    return data.generate(tmp_path_factory.mktemp("tar-data"), count=COUNT, seed=11, workers=2, progress=False)


@pytest.fixture(scope="module")
def manifest(root):
    return data.load_manifest(root)


@pytest.fixture(scope="module")
def reference(root, manifest):
    return audit.reference_digests([s.key for s in manifest], root)


@pytest.fixture(scope="module")
def shards(root, tmp_path_factory):
    return pack.write_tar_shards(tmp_path_factory.mktemp("shards"), root=root, maxcount=MAXCOUNT, progress=False)


def loader(dataset, num_workers, batch_size=16):
    """A DataLoader as the tests use it: explicit start method, and a timeout so nothing hangs."""
    extra = dict(multiprocessing_context="fork", timeout=TIMEOUT) if num_workers else {}
    return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, **extra)


def first_error(batches) -> Exception:
    """Iterate to the end and return the exception raised on the way (failing if none was)."""
    _, error = run_until_error(batches)
    if error is None:
        raise AssertionError("expected an error, the loader finished normally")
    return error


def keys_of(dataset, num_workers=0):
    return [k for _, _, keys in loader(dataset, num_workers) for k in keys]


# ------------------------------------------------------------ the split functions


@pytest.mark.parametrize("num_shards", [0, 1, 3, 7, 12, 13])
@pytest.mark.parametrize("parts", [1, 2, 3, 4])
def test_split_functions_are_disjoint_complete_and_drop_nothing(num_shards, parts):
    shards = [f"s{i}" for i in range(num_shards)]
    for split in (split_shards_by_rank, split_shards_by_worker):
        pieces = [split(shards, i, parts) for i in range(parts)]
        flat = [s for piece in pieces for s in piece]
        assert sorted(flat) == sorted(shards)  # complete, and (same length) disjoint
        assert len(flat) == len(set(flat))
        sizes = [len(p) for p in pieces]
        assert max(sizes) - min(sizes) <= 1  # the remainder is spread, not dropped


def test_zero_workers_count_as_one_and_bad_indices_are_rejected():
    assert split_shards_by_worker(["a", "b"], 0, 0) == ["a", "b"]
    with pytest.raises(ValueError):
        split_shards_by_rank(["a"], 2, 2)
    with pytest.raises(ValueError):
        split_shards_by_worker(["a"], 3, 2)


def test_rank_then_worker_assignment_covers_every_shard_once():
    shards = list(range(10))
    table = shard_assignment(shards, world_size=2, num_workers=2)
    assert sorted(table) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert table[(0, 0)] == [0, 4, 8] and table[(1, 1)] == [3, 7]  # rank first: 0,2,4,6,8 then every 2nd
    assert sorted(s for part in table.values() for s in part) == shards


def test_epoch_shard_order_is_a_seeded_permutation_that_changes_with_the_epoch():
    shards = [f"s{i}" for i in range(20)]
    assert epoch_shard_order(shards, 0, 3) == epoch_shard_order(shards, 0, 3)
    assert sorted(epoch_shard_order(shards, 0, 3)) == sorted(shards)
    assert epoch_shard_order(shards, 0, 3) != epoch_shard_order(shards, 0, 4)


def test_check_shard_split_names_the_problem_before_training():
    check_shard_split(8, world_size=2, num_workers=2)
    check_shard_split(3, world_size=1, num_workers=2)
    with pytest.raises(ShardSplitError, match=r"3 shards cannot feed 2 rank\(s\) x 2 worker\(s\) = 4 readers"):
        check_shard_split(3, world_size=2, num_workers=2)
    with pytest.raises(ShardSplitError, match=r"gives them \[3, 2\] shards"):
        check_shard_split(5, world_size=2, num_workers=1)


# ---------------------------------------------------------------- shuffle buffer


def test_shuffle_buffer_permutes_locally_and_sizes_0_1_pass_through():
    items = list(range(1000))
    for size in (0, 1):
        assert list(shuffle_buffer(iter(items), size, random.Random(0))) == items
    out = list(shuffle_buffer(iter(items), 50, random.Random(0)))
    assert sorted(out) == items and out != items
    # An item can come out at most `size` places earlier than it went in.
    assert min(pos - item for pos, item in enumerate(out)) >= -50


def test_label_mixing_separates_sorted_from_shuffled_streams():
    labels = sorted(i % 10 for i in range(2000))
    shuffled = random.Random(0).sample(labels, len(labels))
    assert label_mixing(labels) > 0.85
    assert label_mixing(shuffled) < 0.2


# ------------------------------------------------------------ reading an epoch


@pytest.mark.parametrize("num_workers", [2, 4])
def test_every_sample_exactly_once_with_right_labels_and_bit_exact_pixels(
    shards, manifest, reference, num_workers
):
    dataset = TarShardDataset(pack.brace_pattern(shards), shuffle_buffer=40, return_key=True)
    records = audit.records_from_batches(loader(dataset, num_workers))
    report = audit.audit_epoch(records, manifest, reference)
    assert report.ok, report.summary()


def test_count_samples_reads_the_headers(shards):
    assert [count_samples(s) for s in shards] == [MAXCOUNT] * (COUNT // MAXCOUNT)


def test_without_the_worker_split_every_sample_arrives_once_per_worker(shards, manifest):
    dataset = TarShardDataset(shards, transform=skip_decode, return_key=True, split_by_worker=False)
    records = audit.records_from_batches(loader(dataset, 2), with_pixels=False)
    report = audit.audit_epoch(records, manifest)
    assert len(records) == 2 * COUNT
    assert set(report.duplicated.values()) == {2} and len(report.duplicated) == COUNT


def test_set_epoch_reshuffles_and_the_same_epoch_repeats(shards):
    dataset = TarShardDataset(shards, shuffle_buffer=50, transform=skip_decode, return_key=True, seed=3)
    dataset.set_epoch(0)
    first = keys_of(dataset, 2)
    dataset.set_epoch(0)
    again = keys_of(dataset, 2)
    dataset.set_epoch(1)
    second = keys_of(dataset, 2)
    assert first == again
    assert first != second and sorted(first) == sorted(second)


def test_a_second_pass_without_set_epoch_repeats_the_order_and_warns(shards):
    dataset = TarShardDataset(shards, shuffle_buffer=50, transform=skip_decode, return_key=True, seed=3)
    dataset.set_epoch(4)
    first = keys_of(dataset)
    with pytest.warns(tarloader.RepeatedEpochWarning, match="without set_epoch"):
        again = keys_of(dataset)
    assert again == first


def batch_shards(loader, shards):
    """The shard each batch came from (batches of MAXCOUNT, no buffer: one batch is one whole shard)."""
    shard_of = {k: str(s) for s in shards for k in tarloader_keys(s)}
    order = []
    for _, _, keys in loader:
        assert len({shard_of[k] for k in keys}) == 1
        order.append(shard_of[keys[0]])
    return order


def tarloader_keys(shard):
    with tarfile.open(shard) as tar:
        return [n[:-4] for n in tar.getnames() if n.endswith(".jpg")]


@pytest.mark.parametrize(
    "method, call_set_epoch",
    [("fork", True), ("spawn", True), ("fork", False)],  # spawn workers take seconds to start: one case
    ids=["fork", "spawn", "fork, no set_epoch"],
)
def test_persistent_workers_see_set_epoch(shards, manifest, method, call_set_epoch):
    """Persistent workers keep the dataset copy they started with; the epoch still reaches them
    (shared memory), so 3 epochs read the shards in 3 orders, every key exactly once each time.
    Without set_epoch the order repeats, for persistent workers as for fresh ones."""
    dataset = TarShardDataset(shards, transform=skip_decode, return_key=True, seed=1)
    batches = DataLoader(dataset, batch_size=MAXCOUNT, num_workers=2, persistent_workers=True,
                         multiprocessing_context=method, timeout=TIMEOUT)
    orders = []
    for epoch in range(3):
        if call_set_epoch:
            dataset.set_epoch(epoch)
        order = batch_shards(batches, shards)
        expected = [s for pair in zip(dataset.shards_for(0, 2), dataset.shards_for(1, 2)) for s in pair]
        assert order == expected  # batches alternate between worker 0 and worker 1
        assert sorted(order) == sorted(map(str, shards))  # every shard, so every key, exactly once
        orders.append(order)
    assert len({tuple(o) for o in orders}) == (3 if call_set_epoch else 1)


@pytest.mark.parametrize("persistent", [False, True], ids=["fresh workers", "persistent workers"])
def test_webdataset_pipeline_reads_shards_in_a_new_order_every_epoch(shards, manifest, persistent):
    """webdataset's own shard shuffle (shardshuffle=n, seed=s) repeats its order every epoch, and its
    detshuffle only advances in persistent workers; our pipeline's epoch comes from set_epoch."""
    from packlab.loaders.with_webdataset import webdataset_loader

    persistence = {"persistent_workers": True} if persistent else {}
    batches = webdataset_loader(pack.brace_pattern(shards), 2, multiprocessing_context="fork", timeout=TIMEOUT,
                                transform=skip_decode, buffer=0, batch_size=MAXCOUNT, **persistence)
    orders = []
    for epoch in range(3):
        # As packlab.bench.time_loader drives every loader: set_epoch on the loader's dataset, where there is one.
        set_epoch = getattr(getattr(batches, "dataset", None), "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)
        order = batch_shards(batches, shards)
        assert sorted(order) == sorted(map(str, shards))
        orders.append(order)
    assert len({tuple(o) for o in orders}) == 3


def test_without_shuffling_shards_are_read_in_order_each_in_archive_order(shards):
    dataset = TarShardDataset(shards, shuffle_shards=False, transform=skip_decode, return_key=True)
    keys = keys_of(dataset)
    for i, shard in enumerate(shards):
        assert keys[i * MAXCOUNT : (i + 1) * MAXCOUNT] == tarloader_keys(shard)


def test_resampling_gives_every_rank_the_same_epoch_length(shards, manifest):
    known = {s.key for s in manifest}
    for rank in range(2):
        dataset = TarShardDataset(
            shards[:3], epoch_length=101, rank=rank, world_size=2, transform=skip_decode, return_key=True
        )
        dataset.check_split(num_workers=2)  # resampling never starves a reader
        keys = keys_of(dataset, 2)
        assert len(keys) == 101 and set(keys) <= known


def test_rank_comes_from_the_arguments_and_ranks_split_the_shards(shards, manifest):
    parts = [
        keys_of(TarShardDataset(shards, rank=r, world_size=2, transform=skip_decode, return_key=True), 2)
        for r in range(2)
    ]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == sorted(s.key for s in manifest)


# ------------------------------------------------------------------ clear errors


def test_too_few_shards_fail_on_the_first_batch_and_with_check_split(shards):
    dataset = TarShardDataset(shards[:3], transform=skip_decode)
    with pytest.raises(ShardSplitError, match="3 shards cannot feed"):
        dataset.check_split(num_workers=4)
    error = first_error(loader(dataset, 4))
    assert isinstance(error, ShardSplitError) and "3 shards cannot feed" in str(error)


# --------------------------------------------------------------- remote shards


def test_shards_over_http_read_exactly_once(shards, manifest):
    with serve_directory(shards[0].parent) as base_url:
        urls = [f"{base_url}/{s.name}" for s in shards]
        dataset = TarShardDataset(urls, transform=skip_decode, return_key=True, shuffle_buffer=30)
        records = audit.records_from_batches(loader(dataset, 2), with_pixels=False)
    report = audit.audit_epoch(records, manifest)
    assert report.ok, report.summary()


def test_a_client_that_hangs_up_mid_file_prints_no_traceback(tmp_path, capfd):
    """A loop that stops early closes its connection while the server sends: not an error to print."""
    import socket
    import time
    from urllib.parse import urlsplit

    (tmp_path / "big.bin").write_bytes(bytes(64 * 2**20))  # more than the sockets' buffers hold
    with serve_directory(tmp_path) as base_url:
        address = urlsplit(base_url)
        for _ in range(3):
            with socket.create_connection((address.hostname, address.port), timeout=10) as client:
                client.sendall(b"GET /big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
                client.recv(65536)
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        time.sleep(1.0)  # the server's threads meet the closed connections
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Broken pipe" not in err and "reset by peer" not in err, err


def test_a_stalled_server_raises_after_the_timeout_instead_of_hanging():
    from packlab.loaders.tar import open_shard

    with unresponsive_server() as base_url:
        start = time.perf_counter()
        dataset = TarShardDataset(
            [f"{base_url}/shard-000000.tar"], opener=lambda url: open_shard(url, timeout=1.0), transform=skip_decode
        )
        with pytest.raises(ShardError, match="shard-000000.tar"):
            list(dataset)
        assert time.perf_counter() - start < 30


# --------------------------------------------------------- interop with webdataset


def test_webdataset_reads_our_shards_every_key_once(shards, manifest, reference):
    import webdataset as wds

    pipeline = (
        wds.WebDataset(pack.brace_pattern(shards), shardshuffle=False, empty_check=True)
        .shuffle(50)
        .decode(wds.handle_extension("jpg", standard_transform))
        .to_tuple("jpg", "cls", "__key__")
        .batched(16)
    )
    batches = wds.WebLoader(pipeline, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
    records = audit.records_from_batches(batches)
    report = audit.audit_epoch(records, manifest, reference)
    assert report.ok, report.summary()


def test_our_loader_reads_shards_written_by_webdataset_every_key_once(root, manifest, reference, tmp_path):
    import webdataset as wds

    order = random.Random(5).sample(manifest, len(manifest))  # shuffle before sharding, as ours does
    with wds.ShardWriter(str(tmp_path / "wds-%06d.tar"), maxcount=40, verbose=0) as sink:
        for sample in order:
            sink.write({"__key__": sample.key, "jpg": data.image_path(sample.key, root).read_bytes(), "cls": sample.label})
    written = sorted(tmp_path.glob("wds-*.tar"))
    assert len(written) == -(-COUNT // 40)
    dataset = TarShardDataset(pack.brace_pattern(written), shuffle_buffer=20, return_key=True)
    records = audit.records_from_batches(loader(dataset, 2))
    report = audit.audit_epoch(records, manifest, reference)
    assert report.ok, report.summary()
    assert Counter(k for k, _, _ in records) == Counter(s.key for s in manifest)


def test_gzip_shards_and_file_urls_read_like_plain_paths(root, manifest, tmp_path):
    import webdataset as wds

    with wds.ShardWriter(str(tmp_path / "gz-%06d.tar.gz"), maxcount=100, verbose=0) as sink:
        for sample in manifest:
            sink.write({"__key__": sample.key, "jpg": data.image_path(sample.key, root).read_bytes(), "cls": sample.label})
    written = sorted(tmp_path.glob("gz-*.tar.gz"))
    assert written[0].read_bytes()[:2] == b"\x1f\x8b"  # really gzip-compressed
    urls = [p.as_uri() for p in written]  # file:///...
    records = audit.records_from_batches(loader(TarShardDataset(urls, transform=skip_decode, return_key=True), 2), with_pixels=False)
    report = audit.audit_epoch(records, manifest)
    assert report.ok, report.summary()


def test_rank_and_world_size_come_from_torchrun_variables(shards, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    dataset = TarShardDataset(shards)
    assert (dataset.rank, dataset.world_size) == (1, 3)
    assert dataset.shards_for(0, 1) == split_shards_by_rank(epoch_shard_order(dataset.shards, 0, 0), 1, 3)


# ------------------------------------------------------------------ the figures


def test_label_count_and_shuffle_quality_figures_label_their_axes():
    import matplotlib.pyplot as plt

    from packlab import plots

    fig = plots.plot_label_counts({"sorted": [0] * 90 + [1] * 10, "shuffled": [i % 10 for i in range(100)]})
    ax = fig.axes[0]
    assert ax.get_xlabel() == "class label" and ax.get_ylabel() == "number of samples"
    assert len(ax.patches) == 20
    plt.close(fig)
    fig = plots.plot_shuffle_quality({"a": {1: 0.9, 100: 0.5, 1000: 0.2}}, reference=0.1)
    ax = fig.axes[0]
    assert "buffer size (samples" in ax.get_xlabel() and ax.get_xscale() == "log"
    assert len(ax.lines) == 2
    plt.close(fig)


@pytest.mark.parametrize("tar_format", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_member_reader_agrees_with_tarfile_on_every_format(tmp_path, tar_format):
    """Long names (ustar prefix, GNU 'L', pax 'path'), non-ASCII names, directories and links:
    our reader yields the same regular files, with the same bytes, as the standard library."""
    path = tmp_path / "formats.tar"
    files = {
        "short.txt": b"x" * 700,
        "dir/" + "n" * 90 + "/" + "m" * 60 + ".jpg": bytes(range(256)) * 3,
        "empty.cls": b"",
        "block.bin": b"b" * 512,
    }
    if tar_format != tarfile.USTAR_FORMAT:
        files["k" * 150 + ".jpg"] = b"long name without a slash"
        files["caf\u00e9.cls"] = b"3"
    with tarfile.open(path, "w", format=tar_format) as tar:
        directory = tarfile.TarInfo("dir")
        directory.type = tarfile.DIRTYPE
        tar.addfile(directory)
        for name, payload in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        link = tarfile.TarInfo("link.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "short.txt"
        tar.addfile(link)
    with open(path, "rb") as stream:
        ours = list(tarloader.iter_tar_members(stream, str(path)))
    assert ours == list(files.items())

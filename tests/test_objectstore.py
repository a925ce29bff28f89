"""Shards in a real S3 object store (SeaweedFS on 127.0.0.1): upload, list, stream, faults and retries.

One server serves the whole module (it starts in a few seconds). The fault tests kill it
(``SIGKILL``) or freeze it (``SIGSTOP``) in the middle of an epoch and bring it back on
the same ports, so every test leaves it running for the next. The retry logic itself is
tested first without a server, with an opener that fails on purpose.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from packlab import audit, data, objectstore, pack
from packlab.bench import run_until_error
from packlab.loaders.tar import ShardError, TarShardDataset, iter_shard_samples, open_shard, skip_decode
from packlab.loaders.with_webdataset import webdataset_loader
from packlab.retry import (
    LocalRangeOpener,
    RetryingTarShardDataset,
    RetryPolicy,
    ShardReadError,
    iter_shard_samples_resuming,
    samples_with_resume_points,
)

COUNT = 240
MAXCOUNT = 60  # -> 4 shards of about 2 MB
TIMEOUT = 120  # seconds a DataLoader waits for a batch before failing the test
FAST = RetryPolicy(attempts=3, backoff_s=0.0)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return data.generate(tmp_path_factory.mktemp("s3-data"), count=COUNT, seed=13, workers=2, progress=False)


@pytest.fixture(scope="module")
def manifest(root):
    return data.load_manifest(root)


@pytest.fixture(scope="module")
def shards(root, tmp_path_factory):
    return pack.write_tar_shards(tmp_path_factory.mktemp("s3-shards"), root=root, maxcount=MAXCOUNT, progress=False)


# ------------------------------------------------------------------ retries, without a server


class FlakyOpener:
    """Opens local shards; the streams of the first ``failures`` opens break after ``cut`` bytes."""

    def __init__(self, failures: int, cut: int, error=ShardReadError):
        self.failures, self.cut, self.error = failures, cut, error
        self.opens = 0

    def __call__(self, name: str):
        self.opens += 1
        stream = open_shard(name)
        if self.opens > self.failures:
            return stream
        head = stream.read(self.cut)
        stream.close()
        error, shard = self.error, name

        class Broken(io.BytesIO):
            def read(self, size=-1):
                chunk = super().read(size)
                if not chunk and size != 0:
                    raise error(f"reading shard {shard} failed: connection reset (on purpose)")
                return chunk

        return Broken(head)


def test_a_shard_that_breaks_part_way_is_read_again_and_no_sample_is_delivered_twice(shards):
    shard = str(shards[0])
    reference = [s.key for s in iter_shard_samples(shard)]
    opener = FlakyOpener(failures=2, cut=1_000_000)  # about half the shard, twice
    retries = []
    keys = [s.key for s in iter_shard_samples_resuming(shard, opener, FAST,
                                                       on_retry=lambda *args: retries.append(args))]
    assert keys == reference  # every sample once, in order
    assert opener.opens == 3 and len(retries) == 2
    delivered_before_retry = retries[0][2]
    assert 0 < delivered_before_retry < len(reference), "the failure should come part-way through the shard"


class FlakyRangeOpener(LocalRangeOpener):
    """Opens local shards from any offset; every stream of the first ``failures`` opens breaks after ``cut`` bytes."""

    def __init__(self, failures: int, cut: int):
        self.failures, self.cut = failures, cut
        self.opens, self.bytes_read, self.offsets = 0, 0, []

    def open_from(self, name: str, offset: int, etag=None):
        self.opens += 1
        self.offsets.append(offset)
        stream = super().open_from(name, offset)
        data = stream.read() if self.opens > self.failures else stream.read(self.cut)
        stream.close()
        self.bytes_read += len(data)
        broken, shard = self.opens <= self.failures, name

        class Stream(io.BytesIO):
            def read(self, size=-1):
                chunk = super().read(size)
                if broken and not chunk and size != 0:
                    raise ShardReadError(f"reading shard {shard} failed: connection reset (on purpose)")
                return chunk

        return Stream(data)

    def __call__(self, name: str):
        return self.open_from(name, 0)


def test_every_resume_point_is_where_a_tar_stream_of_the_remaining_samples_begins(shards):
    shard = str(shards[0])
    pairs = list(samples_with_resume_points(open_shard(shard), shard))
    keys = [sample.key for sample, _ in pairs]
    assert pairs[-1][1] is None and all(point is not None for _, point in pairs[:-1])
    for i in (0, 7, len(pairs) - 2):
        stream = LocalRangeOpener().open_from(shard, pairs[i][1])
        assert [s.key for s, _ in samples_with_resume_points(stream, shard, pairs[i][1])] == keys[i + 1:]


def test_with_an_opener_that_opens_from_an_offset_a_retry_resumes_where_the_last_sample_ended(shards):
    shard = str(shards[0])
    size = shards[0].stat().st_size
    reference = [s.key for s in iter_shard_samples(shard)]
    opener = FlakyRangeOpener(failures=2, cut=700_000)  # each attempt breaks after 700 kB, twice
    retries = []
    keys = [s.key for s in iter_shard_samples_resuming(shard, opener, FAST, on_retry=lambda *a: retries.append(a))]
    assert keys == reference and opener.opens == 3
    assert opener.offsets[0] == 0 and 0 < opener.offsets[1] < opener.offsets[2] < size
    assert [r[4] for r in retries] == opener.offsets[1:]
    # Each retry read again at most the sample that was cut off, not the shard from its start.
    assert opener.bytes_read < size + 2 * 300_000, (opener.bytes_read, size)


def test_retries_give_up_after_the_policy_s_attempts_with_an_error_naming_the_shard(shards):
    shard = str(shards[0])
    opener = FlakyOpener(failures=10, cut=500_000)
    waits = []
    with pytest.raises(ShardReadError, match="Gave up after 3 attempts") as failure:
        list(iter_shard_samples_resuming(shard, opener, RetryPolicy(attempts=3, backoff_s=0.5), sleep=waits.append))
    assert shard in str(failure.value) and "samples of this shard had been delivered" in str(failure.value)
    assert waits == [0.5, 1.0] and opener.opens == 3


def test_a_damaged_shard_is_not_retried(shards, tmp_path):
    damaged = tmp_path / "damaged-000000.tar"
    raw = bytearray(shards[0].read_bytes())
    raw[1024 + 100] ^= 0xFF  # in the second member's header (1 header + 1 block of label): its checksum fails
    damaged.write_bytes(bytes(raw))
    opener = FlakyOpener(failures=0, cut=0)
    with pytest.raises(ShardError, match="checksum") as failure:
        list(iter_shard_samples_resuming(str(damaged), opener, FAST))
    assert not isinstance(failure.value, ShardReadError) and opener.opens == 1


def test_a_shard_that_changed_between_attempts_is_reported(shards):
    first, second = str(shards[0]), str(shards[1])

    class Swapping(FlakyOpener):
        def __call__(self, name):
            return super().__call__(first if self.opens == 0 else second)

    with pytest.raises(ShardError, match="changed between two attempts"):
        list(iter_shard_samples_resuming(first, Swapping(failures=1, cut=1_000_000), FAST))


def test_the_policy_s_waits_double_up_to_a_limit():
    policy = RetryPolicy(attempts=6, backoff_s=1.0, max_backoff_s=5.0)
    assert [policy.wait_before(n) for n in range(1, 6)] == [1, 2, 4, 5, 5] and policy.total_wait() == 17
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)


# ------------------------------------------------------------------ the server


@pytest.fixture(scope="module")
def server():
    with objectstore.local_s3_server() as running:
        yield running


@pytest.fixture(scope="module")
def urls(server, shards):
    return objectstore.upload_shards(server.client(), objectstore.DEFAULT_BUCKET, shards, prefix="train/")


def short_timeouts(server, read_timeout=3.0):
    return objectstore.S3Settings(server.endpoint, server.access_key, server.secret_key,
                                  connect_timeout=2.0, read_timeout=read_timeout)


def test_uploaded_shards_are_listed_with_their_sizes(server, shards, urls):
    listed = objectstore.list_objects(server.client(), objectstore.DEFAULT_BUCKET, prefix="train/")
    assert listed == [(f"train/{p.name}", p.stat().st_size) for p in shards]
    assert urls == [f"s3://shards/train/{p.name}" for p in shards]


def test_the_server_refuses_unsigned_and_wrongly_signed_requests(server, urls):
    import urllib.error
    import urllib.request

    bucket, key = objectstore.split_s3_url(urls[0])
    with pytest.raises(urllib.error.HTTPError) as anonymous:
        urllib.request.urlopen(f"{server.endpoint}/{bucket}/{key}", timeout=10)
    assert anonymous.value.code == 403
    wrong = objectstore.S3Settings(server.endpoint, server.access_key, "not-the-secret")
    with pytest.raises(ShardError, match="SignatureDoesNotMatch") as failure:
        objectstore.S3ShardOpener(wrong)(urls[0])
    assert urls[0] in str(failure.value) and not isinstance(failure.value, ShardReadError)


def test_a_missing_object_is_a_clear_error_not_a_retry(server, urls):
    missing = urls[0].replace("shard-", "no-such-shard-")
    with pytest.raises(ShardError, match="NoSuchKey") as failure:
        objectstore.S3ShardOpener(server.settings)(missing)
    assert missing in str(failure.value) and not isinstance(failure.value, ShardReadError)


def test_shards_streamed_from_s3_hold_the_original_bytes(server, urls, manifest):
    by_key = {s.key: s for s in manifest}
    samples = list(iter_shard_samples(urls[0], objectstore.S3ShardOpener(server.settings)))
    assert len(samples) == MAXCOUNT
    assert all(hashlib.sha256(s.image_bytes).hexdigest() == by_key[s.key].sha256 for s in samples)


def test_tar_shard_dataset_over_s3_with_two_workers_delivers_every_key_once(server, urls, manifest):
    dataset = TarShardDataset(urls, opener=objectstore.S3ShardOpener(server.settings), shuffle_buffer=50,
                              transform=skip_decode, return_key=True)
    loader = DataLoader(dataset, batch_size=16, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
    report = audit.audit_epoch(audit.records_from_batches(loader, with_pixels=False), manifest)
    assert report.ok, report.summary()


def test_the_opener_pickles_without_its_client_for_spawned_workers(server, urls):
    import pickle

    opener = objectstore.S3ShardOpener(server.settings)
    opener(urls[0]).close()  # builds a client, with its connection pool
    copy = pickle.loads(pickle.dumps(opener))
    assert copy._client is None and copy.settings == opener.settings
    assert len(list(iter_shard_samples(urls[0], copy))) == MAXCOUNT


def test_webdataset_reads_s3_urls_through_its_gopen_table(server, urls, manifest):
    objectstore.register_with_webdataset(server.settings)
    loader = webdataset_loader(urls, 2, multiprocessing_context="fork", timeout=TIMEOUT, transform=skip_decode,
                               batch_size=16)
    seen = Counter(key for _, _, keys in loader for key in keys)
    assert seen == Counter(s.key for s in manifest)


def _kill_after(loader, batches: int, server, then=None):
    """Iterate ``loader``; after ``batches`` batches kill the server (and run ``then``). Returns (batches, error, seconds)."""
    received, start = 0, None
    iterator = iter(loader)
    try:
        for _ in iterator:
            received += 1
            if received == batches:
                server.kill()
                start = time.monotonic()
                if then is not None:
                    then()
    except Exception as exc:  # noqa: BLE001
        import traceback

        traceback.clear_frames(exc.__traceback__)
        return received, exc, time.monotonic() - start
    finally:
        del iterator
    return received, None, None if start is None else time.monotonic() - start


def test_a_server_killed_mid_epoch_gives_a_clear_error_naming_the_shard(server, urls):
    dataset = TarShardDataset(urls, opener=objectstore.S3ShardOpener(short_timeouts(server)),
                              transform=skip_decode, return_key=True)
    loader = DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
    try:
        received, error, seconds = _kill_after(loader, 3, server)
    finally:
        server.start()
    assert isinstance(error, ShardReadError), f"expected ShardReadError, got {error!r} after {received} batches"
    assert "s3://shards/train/shard-" in str(error) and "Is the object store" in str(error)
    assert seconds < 30, f"the error took {seconds:.0f} s"


def test_a_frozen_server_gives_a_timeout_not_a_hang(server, urls):
    # Frozen before the request: the kernel still accepts the connection, and no answer ever comes.
    dataset = TarShardDataset(urls[:1], opener=objectstore.S3ShardOpener(short_timeouts(server, read_timeout=2.0)),
                              transform=skip_decode)
    server.pause()
    start = time.monotonic()
    try:
        with pytest.raises(ShardReadError, match="Read timeout") as failure:
            next(iter(dataset))
    finally:
        server.resume()
    assert urls[0] in str(failure.value) and time.monotonic() - start < 30


def test_a_server_frozen_mid_body_gives_a_read_timeout_naming_the_object(server):
    # An object larger than the socket buffers, so the body cannot have arrived before the freeze.
    client = server.client()
    client.put_object(Bucket=objectstore.DEFAULT_BUCKET, Key="big/blob-000000.tar", Body=bytes(48 * 1024 * 1024))
    stream = objectstore.S3ShardOpener(short_timeouts(server, read_timeout=2.0))("s3://shards/big/blob-000000.tar")
    stream.read(1024 * 1024)
    server.pause()
    start = time.monotonic()
    try:
        with pytest.raises(ShardReadError, match=r"sent nothing for 2 s \(read timeout\)") as failure:
            while stream.read(1024 * 1024):
                pass
    finally:
        server.resume()
        stream.close()
        client.delete_object(Bucket=objectstore.DEFAULT_BUCKET, Key="big/blob-000000.tar")
    assert "s3://shards/big/blob-000000.tar failed after" in str(failure.value)
    assert time.monotonic() - start < 30


def test_with_retries_a_server_that_comes_back_costs_no_sample_and_repeats_none(server, urls, manifest):
    dataset = RetryingTarShardDataset(urls, opener=objectstore.S3ShardOpener(short_timeouts(server)),
                                      retry=RetryPolicy(attempts=8, backoff_s=1.0, max_backoff_s=8.0),
                                      transform=skip_decode, return_key=True)
    # No shuffle buffer: when the first batch arrives each worker is still in its first shard,
    # so its second shard is opened while the server is down.
    loader = DataLoader(dataset, batch_size=8, num_workers=2, multiprocessing_context="fork", timeout=TIMEOUT)
    records = []

    def collect(loader_iter):
        for images, labels, keys in loader_iter:
            records.extend((k, int(label), None) for k, label in zip(keys, labels))
            yield

    # The server comes back 3 s after it was killed, while the workers go on reading (and failing).
    comeback = threading.Timer(3.0, server.start)
    try:
        received, error, _ = _kill_after(collect(loader), 1, server, then=comeback.start)
    finally:
        comeback.join()
    assert error is None, f"the epoch failed although the server came back: {error}"
    report = audit.audit_epoch(records, manifest)
    assert report.ok, report.summary()
    assert dataset.retries >= 1


def test_a_ranged_read_resumes_the_same_object_and_refuses_a_replaced_one(server, urls, shards):
    opener = objectstore.S3ShardOpener(server.settings)
    whole = opener(urls[0])
    etag = whole.etag
    whole.close()
    tail = opener.open_from(urls[0], 1000, etag)
    assert tail.read() == shards[0].read_bytes()[1000:] and tail.start == 1000
    tail.close()
    bucket, key = objectstore.split_s3_url(urls[0])
    client = server.client()
    client.put_object(Bucket=bucket, Key="replaced/shard.tar", Body=b"first version")
    first = opener("s3://shards/replaced/shard.tar")
    client.put_object(Bucket=bucket, Key="replaced/shard.tar", Body=b"second version, another length")
    with pytest.raises(ShardError, match="changed while it was being read") as failure:
        opener.open_from("s3://shards/replaced/shard.tar", 5, first.etag)
    first.close()
    assert not isinstance(failure.value, ShardReadError)
    client.delete_object(Bucket=bucket, Key="replaced/shard.tar")


def test_a_resumed_reader_fetches_only_the_bytes_of_the_samples_it_still_needs(server, urls, manifest):
    """A shuffle-buffer reader stopped mid-shard and resumed over S3: closed ranged GETs, counted at the opener.

    Every byte the resumed reader read belongs to a sample delivered after the resume, apart
    from the end-of-archive marker (1,024 bytes) of each shard read to its end; every byte the
    server announced it would send (``Content-Length`` of each response) too, apart from what
    follows a shard's last sample (the marker and tar's padding to a whole record).
    """
    from packlab import resume
    from packlab.loaders.tar import read_sample_spans

    class Announced(objectstore.S3ShardOpener):
        sent = 0

        def open_from(self, url, offset, etag=None, end=None):
            stream = super().open_from(url, offset, etag, end)
            Announced.sent += stream.size
            return stream

    def dataset(opener):
        return TarShardDataset(urls, opener=opener, shuffle_buffer=50, seed=3, transform=skip_decode, return_key=True)

    plain = objectstore.S3ShardOpener(server.settings)
    spans = {url: [(s.key, begin, end) for s, begin, end in read_sample_spans(url, plain)] for url in urls}
    sizes = {key: end - begin for found in spans.values() for key, begin, end in found}
    listed = dict(objectstore.list_objects(server.client(), objectstore.DEFAULT_BUCKET, prefix="train/"))
    tails = {url: listed[objectstore.split_s3_url(url)[1]] - spans[url][-1][2] for url in urls}
    stopped = dataset(plain)
    items = iter(stopped)
    first = [next(items)[2] for _ in range(130)]  # in the third shard, with 50 buffered
    state = stopped.state_dict()
    items.close()
    counting = resume.CountingOpener(Announced(server.settings))
    again = dataset(counting)
    again.load_state_dict(state)
    rest = [key for _, _, key in again]
    assert sorted(first + rest) == sorted(s.key for s in manifest)
    read_to_the_end = [piece[0] for piece in state["stream"]["pieces"][state["stream"]["next_piece"]:]]
    needed = sum(sizes[key] for key in rest)
    assert counting.bytes <= needed + 1024 * len(read_to_the_end), (counting, needed)
    assert Announced.sent <= needed + sum(tails[url] for url in read_to_the_end), (Announced.sent, needed)
    account = resume.resume_reads(state["stream"])
    assert account["from_start"] > 2 * account["by_offset"]  # what reading the shards from byte 0 would have cost


def test_staging_from_s3_copies_with_the_announced_size(server, urls, tmp_path, shards):
    from packlab.staging import stage_shards

    report = stage_shards(urls[:2], tmp_path / "local", objectstore.S3ShardOpener(server.settings))
    assert [p.read_bytes() for p in report.paths] == [p.read_bytes() for p in shards[:2]]


def test_nothing_is_left_running_or_lying_around_after_the_block(tmp_path):
    with objectstore.local_s3_server() as server:
        workdir, process, ports = server.workdir, server.process, dict(server.ports)
        assert server.running
    assert process.poll() is not None and not workdir.exists()
    assert not [p for p in Path("/tmp").glob("seaweedfs-*-grpc-*.sock")
                if any(p.name.endswith(f"-{port}.sock") for port in ports.values())]


def test_a_server_that_cannot_start_reports_its_log(tmp_path):
    class Broken(objectstore.LocalS3Server):
        def command(self):
            return [sys.executable, "-c", "import sys; print('no volume today'); sys.exit(3)"]

    with pytest.raises(objectstore.ObjectStoreError, match="exited with code 3") as failure:
        Broken(tmp_path / "broken").start()
    assert "no volume today" in str(failure.value)

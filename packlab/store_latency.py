"""What a far object store costs each reader: latency added on this machine, requests counted, and priced.

The course's S3 server (:mod:`packlab.objectstore`) answers in well under a millisecond; a
real object store takes 20-100 ms to the first byte of every request. This module puts
:class:`packlab.netdelay.DelayProxy` between the readers and the server, adds 0, 20 and
80 ms of round trip, and measures, for each reader, samples per second, the time to the
first sample, and the HTTP requests, connections and bytes the proxy saw:

* **shard streaming** (:class:`~packlab.loaders.tar.TarShardDataset` with
  :class:`~packlab.objectstore.S3ShardOpener`): one GET per shard, its body streamed. It
  waits for a first byte once per shard, so latency costs it little;
* **ranged reads of single samples**, as a resume fetches its buffered samples
  (:mod:`packlab.resume`): one GET per sample. One at a time it waits a round trip per
  sample, and at 80 ms that is almost all of its time; with ``k`` GETs in flight inside
  the same worker (threads sharing one client and its pool of kept connections) the
  waits overlap, and most of what was lost comes back (:func:`share_of_loss_recovered`);
* **s3torchconnector** (``S3IterableDataset.from_prefix``: a LIST, then each object read
  through AWS's CRT client), whose tar bytes are split into samples here;
* **MosaicML Streaming** (``streaming.StreamingDataset(remote="s3://...", local=...)``):
  the first epoch downloads each shard to a local cache, the second reads the cache and
  sends no request at all.

Requests are what an object store bills (:data:`GET_PRICE_PER_1000`) and limits
(:data:`GET_RATE_LIMIT_PER_PREFIX`): :func:`preemption_cost` prices a resume that
fetches every buffered sample, and :func:`resume_table` compares it with the two
approximate resumes (drop the buffer; re-read the shards from their start), from
:func:`packlab.resume.costs.modelled_resume_reads`. :func:`store_study` runs it all for
the chapter.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packlab import data, netdelay, objectstore, pack

#: Round trips the chapter adds, in milliseconds: this machine, a store nearby, a store far away.
RTTS_MS = (0, 20, 80)

# ------------------------------------------------------------------ published prices and limits

#: US dollars per 1,000 GET requests, Amazon S3 Standard, US East (N. Virginia).
GET_PRICE_PER_1000 = 0.0004
#: US dollars per 1,000 PUT, COPY, POST or LIST requests, the same class and region.
PUT_PRICE_PER_1000 = 0.005
PRICE_SOURCE = ("Amazon S3 pricing page (https://aws.amazon.com/s3/pricing/), S3 Standard, US East (N. Virginia), "
                "request charges as listed on that page; check the current one. Data transfer is not included.")
#: Requests per second S3 serves per partitioned prefix before it answers 503 Slow Down.
GET_RATE_LIMIT_PER_PREFIX = 5_500  # GET and HEAD
PUT_RATE_LIMIT_PER_PREFIX = 3_500  # PUT, COPY, POST and DELETE
RATE_LIMIT_SOURCE = ("AWS S3 user guide, 'Best practices design patterns: optimizing Amazon S3 performance': at least "
                     "3,500 PUT/COPY/POST/DELETE and 5,500 GET/HEAD requests per second per partitioned prefix.")


def request_cost(requests: float, price_per_1000: float = GET_PRICE_PER_1000) -> float:
    """Dollars for ``requests`` requests at ``price_per_1000`` dollars per 1,000."""
    return requests * price_per_1000 / 1000


def fetch_seconds(requests: float, rtt_ms: float, in_flight: int = 1, readers: int = 1,
                  rate_limit: float = GET_RATE_LIMIT_PER_PREFIX) -> float:
    """Seconds for ``readers`` readers to make ``requests`` GETs in all, each with ``in_flight`` at a time.

    Each reader waits a round trip per ``in_flight`` of its requests (transfer time left
    out: small objects); all of them together cannot go faster than ``rate_limit``
    requests per second on one prefix, which floors the time at ``requests / rate_limit``.
    """
    per_reader = requests / readers
    return max(per_reader * rtt_ms / 1000 / in_flight, requests / rate_limit)


def preemption_cost(workers: int = 64, buffered: int = 1000, rtt_ms: float = 80, in_flight: int = 16) -> dict:
    """A ranged resume after a preemption: ``workers`` x ``buffered`` single-sample GETs, in dollars and seconds."""
    requests = workers * buffered
    return {
        "workers": workers, "buffered": buffered, "requests": requests, "rtt_ms": rtt_ms,
        "dollars": request_cost(requests),
        "seconds_one_in_flight": fetch_seconds(requests, rtt_ms, 1, workers),
        f"seconds_{in_flight}_in_flight": fetch_seconds(requests, rtt_ms, in_flight, workers),
        "rate_limit_floor_s": requests / GET_RATE_LIMIT_PER_PREFIX,
    }


def epoch_cost(samples: int = 1_281_167, sample_bytes: float = 110_000, shard_bytes: float = 1e9) -> dict:
    """GET requests and dollars of one epoch read as shards (one GET each) and as one GET per sample."""
    shards = max(1, round(samples * sample_bytes / shard_bytes))
    return {"samples": samples, "shard_gets": shards, "shard_dollars": request_cost(shards),
            "sample_gets": samples, "sample_dollars": request_cost(samples)}


# ------------------------------------------------------------------ the data in the store


@dataclass
class StoreData:
    """Shards uploaded for the study: the tar shards' URLs, every sample's byte span, and an MDS copy."""

    settings: objectstore.S3Settings  # the server itself (no delay)
    urls: list[str]
    spans: list[tuple[str, int, int]]  # (url, begin, end): one sample's bytes in its shard
    shard_bytes: int
    mds_remote: str | None = None
    tar_prefix: str = "latency/tar/"


def prepare_store(server: objectstore.LocalS3Server, workdir: Path, shards: int = 4, per_shard: int = 64,
                  seed: int = 0, with_mds: bool = True, bucket: str = objectstore.DEFAULT_BUCKET,
                  root: Path | None = None) -> StoreData:
    """Write ``shards`` tar shards of ``per_shard`` samples (and an MDS copy), upload them, note each sample's span.

    The samples are the first of the manifest of the data in ``root`` (default: the course's).
    """
    from packlab.loaders.tar import read_sample_spans

    workdir = Path(workdir)
    samples = data.load_manifest(root)[: shards * per_shard]
    paths = pack.write_tar_shards(workdir / "tar", samples=samples, root=root, maxcount=per_shard, seed=seed,
                                  progress=False)
    client = server.client()
    with contextlib.suppress(client.exceptions.ClientError):
        client.create_bucket(Bucket=bucket)
    urls = objectstore.upload_shards(client, bucket, paths, prefix="latency/tar/")
    spans = [(url, begin, end) for url, path in zip(urls, paths)
             for _, begin, end in read_sample_spans(str(path))]
    store = StoreData(server.settings, urls, spans, sum(p.stat().st_size for p in paths))
    if with_mds:
        from packlab.loaders.streaming_peers import write_mds

        folder = write_mds(workdir / "mds", samples=samples, root=root, seed=seed, size_limit=max(store.shard_bytes // shards, 1))
        for path in sorted(folder.iterdir()):
            client.upload_file(str(path), bucket, f"latency/mds/{path.name}")
        store.mds_remote = f"s3://{bucket}/latency/mds"
    return store


def through(settings: objectstore.S3Settings, proxy: netdelay.DelayProxy) -> objectstore.S3Settings:
    """The same keys, with the endpoint of the proxy in front of the server."""
    return objectstore.S3Settings(proxy.endpoint, settings.access_key, settings.secret_key, settings.region)


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Set environment variables for the block, then put back what was there (readers that read only the env)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ------------------------------------------------------------------ measuring a reader


def measure(reader: str, items: Callable[[], Iterable], proxy: netdelay.DelayProxy, rtt_ms: float,
            in_flight: int = 1, **extra) -> dict:
    """Run ``items()`` to its end through ``proxy`` at ``rtt_ms``: one row of samples/s, first sample and counts."""
    proxy.rtt_ms = rtt_ms
    proxy.reset()
    start = time.monotonic()
    first = None
    count = 0
    for _ in items():
        if first is None:
            first = time.monotonic() - start
        count += 1
    seconds = time.monotonic() - start
    time.sleep(0.01)  # let the proxy forward the last bytes it holds before counting
    stats = proxy.stats()
    return {"reader": reader, "rtt_ms": rtt_ms, "in_flight": in_flight, "samples": count,
            "seconds": round(seconds, 3), "samples_per_s": round(count / seconds, 1) if seconds else float("inf"),
            "first_sample_s": round(first or 0.0, 3), "requests": stats["requests"],
            "connections": stats["connections"], "bytes_down": stats["bytes_down"], "bytes_up": stats["bytes_up"],
            "methods": stats["methods"], **extra}


class PooledS3Opener(objectstore.S3ShardOpener):
    """:class:`S3ShardOpener` whose client keeps up to ``pool`` connections (botocore's default is 10)."""

    def __init__(self, settings: objectstore.S3Settings, pool: int = 10):
        super().__init__(settings)
        self.pool = pool

    @property
    def client(self):
        if self._client is None or self._client_pid != os.getpid():
            import boto3
            import botocore.config

            s = self.settings
            config = botocore.config.Config(connect_timeout=s.connect_timeout, read_timeout=s.read_timeout,
                                            retries={"total_max_attempts": 1}, s3={"addressing_style": "path"},
                                            max_pool_connections=self.pool)
            self._client = boto3.client("s3", endpoint_url=s.endpoint, aws_access_key_id=s.access_key,
                                        aws_secret_access_key=s.secret_key, region_name=s.region, config=config)
            self._client_pid = os.getpid()
        return self._client


def shard_stream_items(store: StoreData, settings: objectstore.S3Settings) -> Callable[[], Iterable]:
    """The course's reader: ``TarShardDataset`` over S3, one streamed GET per shard, no decoding."""
    from packlab.loaders.tar import TarShardDataset, skip_decode

    opener = objectstore.S3ShardOpener(settings)
    opener.client  # noqa: B018 - build the client before the clock starts (no request yet)
    return lambda: TarShardDataset(store.urls, opener=opener, transform=skip_decode, shuffle_shards=False)


def ranged_spans(store: StoreData, count: int, seed: int = 0) -> list[tuple[str, int, int]]:
    """``count`` samples' spans drawn at random: what a resume with ``count`` buffered samples fetches."""
    return random.Random(seed).sample(store.spans, min(count, len(store.spans)))


def ranged_items(spans: list[tuple[str, int, int]], settings: objectstore.S3Settings,
                 in_flight: int = 1) -> Callable[[], Iterable]:
    """One closed ranged GET per sample (``Range: bytes=begin-(end-1)``), ``in_flight`` at a time, in one worker.

    With ``in_flight > 1`` a ``ThreadPoolExecutor`` of that many threads makes the GETs;
    they share one client whose pool keeps one connection per thread open, so no request
    after the first few pays for a new connection. Results come back in the spans' order.
    """
    opener = PooledS3Opener(settings, pool=max(10, in_flight))
    opener.client  # noqa: B018

    def fetch(span):
        url, begin, end = span
        with opener.open_from(url, begin, end=end) as stream:
            return stream.read()

    def items():
        if in_flight == 1:
            yield from map(fetch, spans)
        else:
            with ThreadPoolExecutor(in_flight, thread_name_prefix="ranged-get") as pool:
                yield from pool.map(fetch, spans)

    return items


def s3torchconnector_items(store: StoreData, settings: objectstore.S3Settings) -> Callable[[], Iterable]:
    """``s3torchconnector.S3IterableDataset.from_prefix`` over the tar shards, split into samples here.

    Pointed at a non-AWS endpoint with ``endpoint=`` and path-style addressing
    (``S3ClientConfig(force_path_style=True)``); its CRT client takes the keys from the
    ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` variables, set for the block.
    """
    from s3torchconnector import S3ClientConfig, S3IterableDataset

    from packlab.loaders.tar import iter_sample_spans

    bucket = objectstore.split_s3_url(store.urls[0])[0]

    def items():
        with environment(AWS_ACCESS_KEY_ID=settings.access_key, AWS_SECRET_ACCESS_KEY=settings.secret_key):
            dataset = S3IterableDataset.from_prefix(
                f"s3://{bucket}/{store.tar_prefix}", region=settings.region, endpoint=settings.endpoint,
                s3client_config=S3ClientConfig(force_path_style=True))
            for obj in dataset:
                for sample, _, _ in iter_sample_spans(obj, obj.key):
                    yield sample

    return items


def mds_epochs(remote: str, settings: objectstore.S3Settings, cache: Path, **options) -> Callable[[], Iterable]:
    """Epochs of one MosaicML Streaming ``StreamingDataset`` over ``remote``, its local cache in ``cache``.

    The dataset is made on the first call and kept, so the first epoch downloads to the
    cache and later ones read it (as far as ``options`` such as ``cache_limit`` let them).
    MDS reads the endpoint from ``S3_ENDPOINT_URL`` and the keys from the AWS variables
    when it builds its boto3 client, in the thread that downloads shards; both are set
    while an epoch runs. ``epoch.dataset()`` is the dataset (its settings, e.g. ``predownload``).
    """
    from streaming import StreamingDataset

    from packlab.loaders.streaming_peers import registered_mds

    shutil.rmtree(cache, ignore_errors=True)
    env = dict(settings.environment(), S3_ENDPOINT_URL=settings.endpoint)
    holder: dict = {}

    def epoch():
        with environment(**env):
            if "dataset" not in holder:
                holder["dataset"] = registered_mds(lambda: StreamingDataset(
                    remote=remote, local=str(cache), shuffle=False, batch_size=1, **options))
            yield from holder["dataset"]

    epoch.dataset = lambda: holder.get("dataset")
    return epoch


def mds_items(store: StoreData, settings: objectstore.S3Settings, cache: Path) -> tuple[Callable, Callable]:
    """MosaicML Streaming over the MDS copy: (first epoch, downloading to ``cache``; second epoch, from it)."""
    epoch = mds_epochs(store.mds_remote, settings, cache)
    return epoch, epoch


# ------------------------------------------------------------------ the sweep


def latency_sweep(store: StoreData, workdir: Path, rtts_ms: Iterable[float] = RTTS_MS, ranged: int = 64,
                  in_flight: int = 32, seed: int = 0,
                  readers: Iterable[str] = ("shards", "ranged", "s3torchconnector", "mds")) -> list[dict]:
    """Every reader at every round trip, through one :class:`DelayProxy` in front of the server: a list of rows."""
    readers = set(readers)
    rows = []
    spans = ranged_spans(store, ranged, seed)
    upstream = netdelay.upstream_of(store.settings.endpoint)
    with netdelay.DelayProxy(upstream) as proxy:
        settings = through(store.settings, proxy)
        for rtt in rtts_ms:
            if "shards" in readers:
                rows.append(measure("shards: TarShardDataset, 1 GET per shard", shard_stream_items(store, settings),
                                    proxy, rtt))
            if "ranged" in readers:
                rows.append(measure("ranged: 1 GET per sample", ranged_items(spans, settings), proxy, rtt))
                rows.append(measure(f"ranged: 1 GET per sample, {in_flight} in flight",
                                    ranged_items(spans, settings, in_flight), proxy, rtt, in_flight))
            if "s3torchconnector" in readers:
                rows.append(measure("s3torchconnector: S3IterableDataset", s3torchconnector_items(store, settings),
                                    proxy, rtt))
            if "mds" in readers and store.mds_remote:
                first, second = mds_items(store, settings, Path(workdir) / f"mds-cache-{rtt:g}")
                rows.append(measure("MDS: StreamingDataset, epoch 1 (downloads)", first, proxy, rtt))
                rows.append(measure("MDS: StreamingDataset, epoch 2 (local cache)", second, proxy, rtt))
    return add_losses(rows)


def add_losses(rows: list[dict]) -> list[dict]:
    """Add ``lost_ms_per_sample`` to each row: its extra seconds over the same reader at 0 ms, per sample.

    About ``rtt`` per wait, divided by the samples a wait brings (a shard's, or one) and by
    the requests in flight: the number that tells what a reader loses, at any shard size.
    """
    at_zero = {(r["reader"], r["in_flight"]): r["seconds"] for r in rows if r["rtt_ms"] == 0}
    for row in rows:
        base = at_zero.get((row["reader"], row["in_flight"]))
        if base is not None and row["samples"]:
            row["lost_ms_per_sample"] = round(max(0.0, row["seconds"] - base) / row["samples"] * 1000, 3)
    return rows


def projected_share_kept(rate_at_zero: float, rtt_ms: float, samples_per_wait: float, in_flight: int = 1) -> float:
    """The share of its 0 ms rate a reader keeps when each ``samples_per_wait`` samples cost a round trip.

    Seconds per sample become ``1 / rate_at_zero + rtt / (samples_per_wait x in_flight)``.
    With the course's small shards (64 samples) an 80 ms wait per shard is visible; with
    shards of 1 GB (about 9,000 samples of 110 kB) it is not.
    """
    per_sample = 1 / rate_at_zero + rtt_ms / 1000 / (samples_per_wait * in_flight)
    return 1 / per_sample / rate_at_zero


def _rate(rows: list[dict], reader_prefix: str, rtt_ms: float, in_flight: int = 1) -> float:
    found = [r["samples_per_s"] for r in rows
             if r["reader"].startswith(reader_prefix) and r["rtt_ms"] == rtt_ms and r["in_flight"] == in_flight]
    if not found:
        raise KeyError(f"no row for {reader_prefix!r} at {rtt_ms} ms with {in_flight} in flight")
    return found[0]


def share_of_loss_recovered(rows: list[dict], rtt_ms: float = 80, in_flight: int = 32) -> float:
    """(concurrent - sequential) / (sequential at 0 ms - sequential): how much of the ranged reads' loss comes back.

    Above 1 when the GETs in flight also overlap the server's own time per request, so that
    at ``rtt_ms`` they beat one-at-a-time at 0 ms.
    """
    at_zero = _rate(rows, "ranged", 0)
    sequential = _rate(rows, "ranged", rtt_ms)
    concurrent = _rate(rows, "ranged", rtt_ms, in_flight)
    return (concurrent - sequential) / (at_zero - sequential)


def share_kept(rows: list[dict], reader_prefix: str, rtt_ms: float = 80, in_flight: int = 1) -> float:
    """A reader's samples/s at ``rtt_ms`` as a share of its own at 0 ms."""
    return _rate(rows, reader_prefix, rtt_ms, in_flight) / _rate(rows, reader_prefix, 0, in_flight)


# ------------------------------------------------------------------ exact vs approximate resume


def resume_table(workers: int = 64, buffered: int = 1000, shard_bytes: float = 1e9, sample_bytes: float = 110_000,
                 shards: int = 4, rtts_ms: Iterable[float] = (20, 80), in_flight: int = 16,
                 mb_per_s: float = 100.0, seed: int = 0) -> list[dict]:
    """Three ways to resume ``workers`` shuffle-buffer readers after a preemption, per job (all readers).

    From :func:`packlab.resume.costs.modelled_resume_reads` (one reader of ``shards``
    shards, ``buffered`` samples in its buffer, averaged over stops), times ``workers``:

    * **exact, ranged**: one closed ranged GET per buffered sample, plus one per reader to
      continue its current shard where it stopped; reads only those bytes; nothing is
      skipped or repeated;
    * **drop the buffer**: continue each reader's current shard where it stopped (one GET
      each) and forget the buffer: its ``workers x buffered`` samples are skipped this epoch;
    * **re-read from the start**: read every shard that had buffered samples, and the
      current one, from byte 0 (one GET each, streamed at ``mb_per_s`` per reader); what
      was already delivered comes again unless the reader filters it: ``repeated``.

    Seconds are per job, readers in parallel: round trips at ``rtt`` (one in flight and
    ``in_flight``, floored by the per-prefix GET limit) plus streaming time where bytes
    are large.
    """
    from packlab.resume.costs import modelled_resume_reads

    one = modelled_resume_reads(shard_bytes, sample_bytes, buffered, shards, seed=seed)
    rows = []
    exact_requests = workers * (buffered + 1)
    reread_requests = workers * one["shards_from_start"]
    reread_bytes = workers * one["from_start"]
    cases = [
        ("exact: ranged GET per buffered sample", exact_requests, workers * one["by_offset"], 0,
         0, exact_requests),
        ("approximate: drop the buffer", workers, 0.0, workers * buffered, 0, workers),
        ("approximate: re-read shards from their start", reread_requests, reread_bytes, 0,
         round(workers * (one["from_start"] / sample_bytes - buffered)), reread_requests),
    ]
    for name, requests, read_bytes, skipped, repeated, gets in cases:
        row = {"resume": name, "requests": round(requests), "bytes": round(read_bytes),
               "dollars": request_cost(requests), "samples_skipped": skipped, "samples_repeated": repeated}
        stream_s = read_bytes / workers / (mb_per_s * 1e6)
        for rtt in rtts_ms:
            row[f"seconds_at_{rtt:g}ms"] = round(fetch_seconds(gets, rtt, 1, workers) + stream_s, 2)
            if name.startswith("exact"):
                row[f"seconds_at_{rtt:g}ms_{in_flight}_in_flight"] = round(
                    fetch_seconds(gets, rtt, in_flight, workers) + stream_s, 2)
        rows.append(row)
    return rows


# ------------------------------------------------------------------ for the chapter


def store_study(workdir: Path | str, seed: int = 0, rtts_ms: Iterable[float] = RTTS_MS, shards: int = 4,
                per_shard: int = 64, ranged: int = 64, in_flight: int = 32,
                readers: Iterable[str] = ("shards", "ranged", "s3torchconnector", "mds")) -> dict:
    """Everything the chapter's section shows, from one local S3 server and one delay proxy (about 30 s).

    Returns ``rows`` (:func:`latency_sweep`), ``recovered_at_80ms`` (:func:`share_of_loss_recovered`),
    ``kept_at_80ms`` (each reader's share of its 0 ms rate, and :func:`projected_share_kept` for
    shards of 1 GB), ``prices`` (the constants and their
    sources, :func:`preemption_cost` and :func:`epoch_cost`), ``resume`` (:func:`resume_table`),
    ``mechanism`` (:func:`packlab.netdelay.latency_mechanism`), ``netem`` (bool),
    ``data`` (shards, samples, bytes) and ``seconds`` (the study's wall time).
    """
    start = time.monotonic()
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    readers = tuple(readers)
    rtts_ms = tuple(rtts_ms)
    with objectstore.local_s3_server() as server:  # a throw-away folder: stopped in seconds, not after a flush
        store = prepare_store(server, workdir, shards, per_shard, seed, with_mds="mds" in readers)
        rows = latency_sweep(store, workdir, rtts_ms, ranged, in_flight, seed, readers)
    far = max(rtts_ms)
    kept = {}
    for prefix in ("shards", "ranged: 1 GET per sample", "s3torchconnector", "MDS: StreamingDataset, epoch 1"):
        with contextlib.suppress(KeyError, ZeroDivisionError):
            kept[prefix] = round(share_kept(rows, prefix, far), 3)
    recovered = None
    if "ranged" in readers and 0 in rtts_ms:
        recovered = round(share_of_loss_recovered(rows, far, in_flight), 3)
    with contextlib.suppress(KeyError):
        shards_at_zero = _rate(rows, "shards", 0)
        kept["shards, projected for 1 GB shards"] = round(
            projected_share_kept(shards_at_zero, far, 1e9 / (store.shard_bytes / len(store.spans))), 3)
    netem = netdelay.netem_available()
    return {
        "rows": rows,
        "recovered_at_80ms": recovered,
        "kept_at_80ms": kept,
        "prices": {"get_per_1000": GET_PRICE_PER_1000, "put_per_1000": PUT_PRICE_PER_1000, "source": PRICE_SOURCE,
                   "get_rate_limit_per_prefix": GET_RATE_LIMIT_PER_PREFIX,
                   "put_rate_limit_per_prefix": PUT_RATE_LIMIT_PER_PREFIX, "rate_limit_source": RATE_LIMIT_SOURCE,
                   "preemption": preemption_cost(in_flight=in_flight), "epoch": epoch_cost()},
        "resume": resume_table(in_flight=in_flight, seed=seed),
        "mechanism": netdelay.latency_mechanism(),
        "netem": netem,
        "data": {"shards": len(store.urls), "samples": len(store.spans), "bytes": store.shard_bytes,
                 "ranged_samples": min(ranged, len(store.spans)), "in_flight": in_flight},
        "seconds": round(time.monotonic() - start, 1),
    }


def print_rows(rows: list[dict]) -> None:
    """The sweep as a plain table."""
    print(f"{'reader':48} {'rtt':>4} {'samp/s':>8} {'first s':>8} {'req':>5} {'conn':>5} {'MB down':>8} {'lost ms/sample':>14}")
    for r in rows:
        print(f"{r['reader']:48} {r['rtt_ms']:>4g} {r['samples_per_s']:>8.1f} {r['first_sample_s']:>8.3f} "
              f"{r['requests']:>5} {r['connections']:>5} {r['bytes_down'] / 1e6:>8.2f} {r.get('lost_ms_per_sample', 0):>14.2f}")


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="packlab-store-latency-") as folder:
        study = store_study(folder)
    print_rows(study["rows"])
    print(json.dumps({k: v for k, v in study.items() if k != "rows"}, indent=1, default=str))
    sys.exit(0)

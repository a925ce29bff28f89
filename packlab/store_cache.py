"""A node-local cache in front of a far object store: what the first and the second epoch cost.

:mod:`packlab.store_latency` measures each reader once per round trip. A training job
reads its data many times, and the readers differ most in what they keep on the node's
own disk between epochs. Here the course's S3 server sits behind the same delay
(:class:`packlab.netdelay.DelayProxy`, 80 ms by default), and each way of reading runs
two epochs in a row, every request and byte counted:

* **straight from the store**: :class:`~packlab.loaders.tar.TarShardDataset` over
  ``s3://`` keeps nothing, so the second epoch pays what the first did;
* **the course's staging** (:func:`packlab.staging.stage_shards`): the job copies the
  shards to local disk before its first epoch and reads them there; the second epoch reads
  the copies and sends no request (a restarted job's staging checks each copy with one
  ``HEAD``, no body);
* **MosaicML Streaming with a cache that holds the dataset** (``StreamingDataset(remote=,
  local=)``): the first epoch downloads each shard as it reaches it, the second reads
  the cache;
* **the same with more downloads ahead** (``predownload=``, samples per worker fetched
  ahead of the one being read; its default is 8 per sample of a batch): the downloads
  overlap the reading, which is what a far store needs;
* **the same with a ``cache_limit`` of half the dataset** (``cache_fraction``): shards are evicted (least
  recently used first) to make room, so the second epoch downloads again. Streaming
  refuses a limit below four of its largest shards, so this copy is written in small
  shards (:data:`CACHE_SHARDS`).

LitData's ``StreamingDataset`` is not in the table: its version here (0.2.76) fetches
chunks through ``obstore``, whose client refuses a plain ``http://`` endpoint such as
this machine's S3 server (``reqwest`` ``BadScheme``; ``_OBSTORE_CLIENT_OPTIONS`` in
``litdata/streaming/downloader.py`` sets no ``allow_http``). Against a real store it
speaks HTTPS and the same comparison applies.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from packlab import data, netdelay, objectstore, staging, store_latency

#: The round trip of the cache table, in milliseconds: a store far away (the sweep's farthest).
CACHE_RTT_MS = 80
#: Shards of the Streaming copy in this study: enough that half of them is still four shards (Streaming's minimum).
CACHE_SHARDS = 16
#: Samples fetched ahead per worker in the ``predownload`` row: a whole epoch of this study's data.
PREDOWNLOAD_AHEAD = 256


def _disk_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` now (what a cache holds on the node's disk)."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file()) if Path(folder).exists() else 0


def _mds_copy(server: objectstore.LocalS3Server, workdir: Path, samples, seed: int,
              root: Path | None = None) -> tuple[str, int]:
    """An MDS copy of ``samples`` in :data:`CACHE_SHARDS` shards, uploaded: its ``s3://`` remote and its bytes."""
    from packlab.loaders.streaming_peers import write_mds

    sample_bytes = sum(data.image_path(s.key, root).stat().st_size for s in samples)
    folder = write_mds(workdir / "mds-small-shards", samples=samples, root=root, seed=seed,
                       size_limit=max(sample_bytes // CACHE_SHARDS, 1))
    client = server.client()
    for path in sorted(folder.iterdir()):
        client.upload_file(str(path), objectstore.DEFAULT_BUCKET, f"cache/mds/{path.name}")
    shard_bytes = sum(p.stat().st_size for p in folder.iterdir() if p.suffix == ".mds")
    return f"s3://{objectstore.DEFAULT_BUCKET}/cache/mds", shard_bytes


def _staged_epochs(urls: list[str], settings: objectstore.S3Settings, local: Path) -> Callable[[], Iterable]:
    """The course's staging as a job does it: the first epoch copies the shards to ``local`` (once, at the job's
    start) and reads the copies; every later epoch reads the copies alone."""
    from packlab.loaders.tar import TarShardDataset, skip_decode

    shutil.rmtree(local, ignore_errors=True)
    opener = objectstore.S3ShardOpener(settings)
    opener.client  # noqa: B018 - build the client before the clock starts (no request yet)
    staged: list[str] = []

    def epoch():
        if not staged:
            staged.extend(str(p) for p in staging.stage_shards(urls, local, opener).paths)
        yield from TarShardDataset(staged, transform=skip_decode, shuffle_shards=False)

    return epoch


def cache_rows(store: store_latency.StoreData, settings: objectstore.S3Settings, proxy: netdelay.DelayProxy,
               workdir: Path, mds_remote: str, mds_bytes: int, rtt_ms: float = CACHE_RTT_MS,
               cache_fraction: float = 0.5) -> list[dict]:
    """Two epochs of each way of reading, through ``proxy`` at ``rtt_ms``: rows with ``epoch`` and ``cache_bytes``.

    The last way's ``cache_limit`` is ``cache_fraction`` of the Streaming copy's bytes.
    """
    limit = int(mds_bytes * cache_fraction)
    ways = {
        "straight from the store: TarShardDataset": (store_latency.shard_stream_items(store, settings), None),
        "staged to local disk first (packlab.staging)": (_staged_epochs(store.urls, settings, workdir / "staged"),
                                                         workdir / "staged"),
        "MDS: cache holds the dataset": (store_latency.mds_epochs(mds_remote, settings, workdir / "mds-cache-all"),
                                         workdir / "mds-cache-all"),
        f"MDS: predownload={PREDOWNLOAD_AHEAD}": (
            store_latency.mds_epochs(mds_remote, settings, workdir / "mds-cache-ahead", predownload=PREDOWNLOAD_AHEAD),
            workdir / "mds-cache-ahead"),
        f"MDS: cache_limit = {cache_fraction:.0%} of the dataset": (
            store_latency.mds_epochs(mds_remote, settings, workdir / "mds-cache-limited", cache_limit=limit),
            workdir / "mds-cache-limited"),
    }
    rows = []
    for name, (epochs, cache) in ways.items():
        for epoch in (1, 2):
            row = store_latency.measure(name, epochs, proxy, rtt_ms, epoch=epoch)
            row["cache_bytes"] = _disk_bytes(cache) if cache is not None else 0
            if hasattr(epochs, "dataset"):
                row["predownload"] = epochs.dataset().predownload
            rows.append(row)
    return rows


def cache_study(workdir: Path | str, seed: int = 0, rtt_ms: float = CACHE_RTT_MS, shards: int = 4,
                per_shard: int = 64, cache_fraction: float = 0.5, root: Path | None = None) -> dict:
    """The chapter's cache table from one local S3 server and one delay proxy (about 25 s).

    Returns ``rows`` (:func:`cache_rows`), ``rtt_ms``, ``data`` (samples, tar bytes, the MDS
    copy's shards and bytes, its cache limit) and ``seconds``. Streaming refuses a
    ``cache_fraction`` below four of its :data:`CACHE_SHARDS` shards (0.25). The images are
    the first of the manifest of the data in ``root`` (default: the course's).
    """
    start = time.monotonic()
    workdir = Path(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    with objectstore.local_s3_server() as server:
        store = store_latency.prepare_store(server, workdir, shards, per_shard, seed, with_mds=False, root=root)
        samples = data.load_manifest(root)[: shards * per_shard]
        mds_remote, mds_bytes = _mds_copy(server, workdir, samples, seed, root)
        upstream = netdelay.upstream_of(store.settings.endpoint)
        with netdelay.DelayProxy(upstream) as proxy:
            rows = cache_rows(store, store_latency.through(store.settings, proxy), proxy, workdir, mds_remote,
                              mds_bytes, rtt_ms, cache_fraction)
    with contextlib.suppress(OSError):
        shutil.rmtree(workdir)
    from streaming.base.constant import (
        TICK,  # how long Streaming's threads sleep when they are far enough ahead
    )

    return {"rows": rows, "rtt_ms": rtt_ms,
            "data": {"samples": len(store.spans), "tar_bytes": store.shard_bytes, "mds_shards": CACHE_SHARDS,
                     "mds_bytes": mds_bytes, "cache_limit_bytes": int(mds_bytes * cache_fraction),
                     "cache_fraction": cache_fraction, "mds_tick_s": TICK},
            "seconds": round(time.monotonic() - start, 1)}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory(prefix="packlab-store-cache-") as folder:
        study = cache_study(Path(folder) / "cache")
    for r in study["rows"]:
        print(f"{r['reader']:48} epoch {r['epoch']} {r['samples_per_s']:>8.1f}/s {r['seconds']:>6.2f} s "
              f"{r['requests']:>4} req {r['bytes_down'] / 1e6:>7.2f} MB down, cache {r['cache_bytes'] / 1e6:>6.2f} MB")
    print(study["data"], study["seconds"], "s")

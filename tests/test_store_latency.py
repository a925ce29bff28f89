"""Readers of the local S3 server through the delay proxy: exact request counts, concurrency's gain, prices, resumes."""

from __future__ import annotations

import time

import pytest

from packlab import data, netdelay, objectstore
from packlab import store_latency as sl
from packlab.resume.costs import modelled_resume_reads

SHARDS, PER_SHARD = 2, 16


# ------------------------------------------------------------------ arithmetic, without a server


def test_prices_are_the_published_per_request_rates():
    assert sl.request_cost(64_000) == pytest.approx(0.0256)  # $0.0004 per 1,000 GETs
    assert sl.request_cost(1_000, sl.PUT_PRICE_PER_1000) == pytest.approx(0.005)
    assert "aws.amazon.com/s3/pricing" in sl.PRICE_SOURCE
    assert (sl.GET_RATE_LIMIT_PER_PREFIX, sl.PUT_RATE_LIMIT_PER_PREFIX) == (5_500, 3_500)


def test_a_preemption_s_ranged_resume_is_priced_and_timed_and_floored_by_the_prefix_limit():
    cost = sl.preemption_cost(workers=64, buffered=1000, rtt_ms=80, in_flight=16)
    assert cost["requests"] == 64_000 and cost["dollars"] == pytest.approx(0.0256)
    assert cost["seconds_one_in_flight"] == pytest.approx(80.0)  # 1,000 round trips of 80 ms per worker
    assert cost["rate_limit_floor_s"] == pytest.approx(64_000 / 5_500)
    assert cost["seconds_16_in_flight"] == pytest.approx(64_000 / 5_500)  # 5 s of round trips, but the limit
    assert sl.fetch_seconds(1000, 80, in_flight=16, readers=1) == pytest.approx(5.0)


def test_an_epoch_of_single_sample_gets_costs_thousands_of_times_more_than_shards():
    epoch = sl.epoch_cost(samples=1_000_000, sample_bytes=100_000, shard_bytes=1e9)
    assert epoch["shard_gets"] == 100 and epoch["sample_gets"] == 1_000_000
    assert epoch["sample_dollars"] == pytest.approx(0.4)


def test_the_resume_table_agrees_with_the_resume_model():
    one = modelled_resume_reads(1e9, 110_000, 1000, 4, seed=0)
    exact, drop, reread = sl.resume_table(workers=8, buffered=1000, in_flight=16)
    assert exact["bytes"] == round(8 * one["by_offset"]) and exact["requests"] == 8 * 1001
    assert exact["samples_skipped"] == exact["samples_repeated"] == 0
    assert exact["seconds_at_80ms"] > 10 * exact["seconds_at_80ms_16_in_flight"] / 2
    assert drop["samples_skipped"] == 8000 and drop["requests"] == 8 and drop["bytes"] == 0
    assert reread["bytes"] == round(8 * one["from_start"]) and reread["requests"] == round(8 * one["shards_from_start"])
    assert reread["samples_repeated"] > 0 and reread["bytes"] > 2 * exact["bytes"]


def test_share_of_loss_recovered_and_projection():
    rows = [{"reader": "ranged: 1 GET per sample", "rtt_ms": 0, "in_flight": 1, "samples_per_s": 200.0},
            {"reader": "ranged: 1 GET per sample", "rtt_ms": 80, "in_flight": 1, "samples_per_s": 10.0},
            {"reader": "ranged: 1 GET per sample, 16 in flight", "rtt_ms": 80, "in_flight": 16, "samples_per_s": 105.0}]
    assert sl.share_of_loss_recovered(rows, 80, 16) == pytest.approx(0.5)
    assert sl.projected_share_kept(1000, 80, samples_per_wait=1) == pytest.approx(1 / 81)
    assert sl.projected_share_kept(1000, 80, samples_per_wait=9000) > 0.99


# ------------------------------------------------------------------ through the proxy, against the course's S3 server


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = data.generate(tmp_path_factory.mktemp("latency-data"), count=SHARDS * PER_SHARD, seed=5, workers=2,
                         progress=False)
    with objectstore.local_s3_server() as server:
        yield sl.prepare_store(server, tmp_path_factory.mktemp("latency"), SHARDS, PER_SHARD, root=root)


@pytest.fixture()
def proxy(store):
    with netdelay.DelayProxy(netdelay.upstream_of(store.settings.endpoint)) as running:
        yield running


def test_the_shard_reader_makes_one_get_per_shard(store, proxy):
    settings = sl.through(store.settings, proxy)
    row = sl.measure("shards", sl.shard_stream_items(store, settings), proxy, rtt_ms=0)
    assert row["samples"] == SHARDS * PER_SHARD
    assert row["requests"] == SHARDS and row["methods"] == {"GET": SHARDS}
    assert store.shard_bytes - SHARDS * 10240 <= row["bytes_down"] <= store.shard_bytes + SHARDS * 2000


def test_requests_in_flight_overlap_their_round_trips(store, proxy):
    settings = sl.through(store.settings, proxy)
    spans = sl.ranged_spans(store, 8, seed=1)
    one = sl.measure("ranged", sl.ranged_items(spans, settings), proxy, rtt_ms=50)
    eight = sl.measure("ranged", sl.ranged_items(spans, settings, in_flight=8), proxy, rtt_ms=50, in_flight=8)
    assert one["requests"] == eight["requests"] == 8
    assert one["connections"] == 1 and eight["connections"] > 1  # one kept connection; one per thread
    assert one["bytes_down"] > sum(end - begin for _, begin, end in spans)
    assert one["seconds"] >= 8 * 0.050
    # One at a time, eight round trips follow each other; in flight they overlap. A loaded machine slows both runs,
    # so the check is that they overlapped at all (serial requests would take at least as long), not a speed target.
    assert eight["seconds"] < 0.6 * one["seconds"], (one, eight)


def test_a_ranged_get_fetches_exactly_one_sample(store, proxy):
    settings = sl.through(store.settings, proxy)
    url, begin, end = store.spans[3]
    (payload,) = list(sl.ranged_items([(url, begin, end)], settings)())
    assert len(payload) == end - begin and payload[257:262] == b"ustar"  # a tar header at the sample's start


def test_mds_downloads_once_then_reads_its_cache_without_a_request(store, proxy, tmp_path):
    settings = sl.through(store.settings, proxy)
    first, second = sl.mds_items(store, settings, tmp_path / "cache")
    one = sl.measure("mds 1", first, proxy, rtt_ms=0)
    two = sl.measure("mds 2", second, proxy, rtt_ms=0)
    assert one["samples"] == two["samples"] == SHARDS * PER_SHARD
    assert one["requests"] > 0 and one["methods"].get("GET", 0) >= 2  # the index and the shards
    assert two["requests"] == 0 and two["bytes_down"] == 0


def test_s3torchconnector_lists_then_gets_every_shard(store, proxy):
    pytest.importorskip("s3torchconnector")
    settings = sl.through(store.settings, proxy)
    row = sl.measure("s3tc", sl.s3torchconnector_items(store, settings), proxy, rtt_ms=0)
    assert row["samples"] == SHARDS * PER_SHARD
    assert row["methods"].get("GET", 0) >= SHARDS + 1  # a LIST (a GET on the bucket) and the objects
    assert row["bytes_down"] >= store.shard_bytes


def test_the_time_to_the_first_sample_grows_with_the_round_trip(store, proxy):
    settings = sl.through(store.settings, proxy)
    start = time.monotonic()
    row = sl.measure("shards", sl.shard_stream_items(store, settings), proxy, rtt_ms=60)
    assert time.monotonic() - start >= SHARDS * 0.060
    assert row["first_sample_s"] >= 0.060


# ------------------------------------------------------------------ a node-local cache (packlab.store_cache)


def test_two_epochs_of_each_cache_count_what_the_second_epoch_fetches_again(tmp_path):
    from packlab import store_cache

    root = data.generate(tmp_path / "data", count=SHARDS * PER_SHARD, seed=6, workers=2, progress=False)
    study = store_cache.cache_study(tmp_path / "cache", rtt_ms=0, shards=SHARDS, per_shard=PER_SHARD, root=root)
    by = {}  # reader -> epoch -> row
    for row in study["rows"]:
        by.setdefault(row["reader"], {})[row["epoch"]] = row
    assert all(row["samples"] == SHARDS * PER_SHARD for row in study["rows"])
    straight = next(v for k, v in by.items() if k.startswith("straight"))
    staged = next(v for k, v in by.items() if k.startswith("staged"))
    whole = next(v for k, v in by.items() if k.startswith("MDS: cache holds"))
    limited = next(v for k, v in by.items() if k.startswith("MDS: cache_limit"))
    # Nothing kept: the second epoch fetches every shard again.
    assert straight[1]["methods"] == straight[2]["methods"] == {"GET": SHARDS}
    # Staged once before the first epoch: the second reads the local copies and asks the store nothing.
    assert staged[1]["methods"] == {"GET": SHARDS} and staged[1]["cache_bytes"] == study["data"]["tar_bytes"]
    assert staged[2]["requests"] == 0 and staged[2]["bytes_down"] == 0
    # Streaming's cache that holds the dataset: downloaded once (a HEAD and a GET per shard), then no request.
    assert whole[1]["methods"].get("HEAD", 0) >= store_cache.CACHE_SHARDS - 1
    assert whole[2]["requests"] == 0 and whole[2]["bytes_down"] == 0
    # Half the dataset, read in the same order: every shard is evicted before its turn, so it all comes again.
    # Streaming makes room before each download (cache_usage + the shard's size <= cache_limit) but adds the shard to
    # cache_usage only when it is down (StreamingDataset.prepare_shard), so two downloads at once, its prepare thread's
    # and its ready thread's or get_item's when they find a shard evicted (seen under load), can leave the cache up to a
    # shard over the limit.
    shard_bytes = study["data"]["mds_bytes"] / study["data"]["mds_shards"]
    assert limited[1]["cache_bytes"] <= study["data"]["cache_limit_bytes"] + 1.5 * shard_bytes
    assert limited[1]["cache_bytes"] < 0.8 * study["data"]["mds_bytes"]  # it did evict: far from the whole dataset
    assert limited[2]["bytes_down"] >= 0.9 * limited[1]["bytes_down"] > 0

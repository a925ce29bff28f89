"""Chapter 15's sentences follow its measurements, in every branch: a model that misses its check says so."""

from __future__ import annotations

import pytest

from packlab.course.narration import ch15
from packlab.store_latency import epoch_cost, preemption_cost, resume_table

TAILS = [{"loader": "tar shards, decode", "wait p50 ms": 8.0, "wait p99 ms": 40.0},
         {"loader": "JPEG folder", "wait p50 ms": 5.0, "wait p99 ms": 45.0}]
SLOWEST = [{"ranks": n, "mean step ms": 60 + 10 * i, "p99 step ms": 100.0, "waiting %": w}
           for i, (n, w) in enumerate([(1, 9.0), (2, 11.0), (8, 17.0), (64, 34.0), (512, 46.0), (1024, 46.5)])]
QUEUE = [{"ranks": n, "depth": d, "mean step ms": 55.0, "p99 step ms": 60.0, "waiting %": w}
         for d, waits in ((2, (0.2, 0.3, 1.3, 2.6, 3.4, 3.3)), (8, (0.0, 0.3, 0.9, 1.9, 2.0, 2.1)))
         for n, w in zip((1, 2, 8, 64, 512, 1024), waits)]


def _check(agrees: bool, error: float = 0.001) -> dict:
    return {"simulated mean step ms": 66.3, "measured mean step ms": 66.2, "mean relative error": error,
            "tolerance ms": 2.5, "agrees": agrees}


def test_the_tail_sentence_names_the_longest_tail():
    figures = ch15.tail_figures(TAILS)
    assert "The longest tail was JPEG folder's, its p99 9.0 times its median." in figures["tail_sentence"]
    assert figures["key_tail"] == "The p99 wait for a batch was up to 9.0 times the median (JPEG folder)."


def test_the_simulation_sentences_say_when_a_model_missed_its_check():
    agreed = ch15.simulation_figures(SLOWEST, _check(True), QUEUE, _check(False, -0.068))
    assert "1,024 ranks 46.5 %" in agreed["simulation_sentence"]
    assert "within the 2.5 ms" in agreed["validation_sentence"] and "direction" not in agreed["validation_sentence"]
    assert "(-6.8 %), outside the 2.5 ms" in agreed["depth_sentence"] and "It misses them" in agreed["depth_sentence"]
    assert "3.3 % of the step waiting at the default depth of 2 batches and 2.1 % at 8" in agreed["depth_sentence"]
    assert agreed["key_ranks"].startswith("The slowest of 1,024 ranks' waits") and "missed" not in agreed["key_ranks"]
    missed = ch15.simulation_figures(SLOWEST, _check(False, 0.2), QUEUE, _check(True))
    assert "outside the 2.5 ms" in missed["validation_sentence"] and "a direction, not a forecast" in missed[
        "validation_sentence"]
    assert "It misses them" not in missed["depth_sentence"]
    assert "(a model that missed the two real ranks here)" in missed["key_ranks"]


def test_ranks_sentence_gives_every_loaders_tails_and_who_waited_in_the_exchange():
    rows = [{"loader": "tar shards, decode", "rank": 0, "wait p50 ms": 4.5, "wait p99 ms": 11.9, "wait max ms": 13.2,
             "all_reduce p50 ms": 7.7, "mean step ms": 108.3},
            {"loader": "tar shards, decode", "rank": 1, "wait p50 ms": 9.4, "wait p99 ms": 96.7, "wait max ms": 122.4,
             "all_reduce p50 ms": 1.5, "mean step ms": 108.3},
            {"loader": "JPEG folder", "rank": 0, "wait p50 ms": 4.0, "wait p99 ms": 20.0, "wait max ms": 30.0,
             "all_reduce p50 ms": 2.0, "mean step ms": 70.0},
            {"loader": "JPEG folder", "rank": 1, "wait p50 ms": 4.0, "wait p99 ms": 22.0, "wait max ms": 31.0,
             "all_reduce p50 ms": 2.0, "mean step ms": 70.0}]
    sentence = ch15.ranks_figures(rows)["ranks_sentence"]
    assert "tar shards, decode, 11.9 ms and 96.7 ms; JPEG folder, 20.0 ms and 22.0 ms" in sentence
    assert "Rank 0 spent longer in the exchange than rank 1 (7.7 against 1.5 ms, median)" in sentence
    even = [dict(rows[0], **{"all_reduce p50 ms": 1.0})] + rows[1:]
    assert "neither was the other's straggler" in ch15.ranks_figures(even)["ranks_sentence"]
    close = [dict(rows[0], **{"all_reduce p50 ms": 4.5}), dict(rows[1], **{"all_reduce p50 ms": 4.2})] + rows[2:]
    assert "spent about as long in the exchange (4.2 and 4.5 ms" in ch15.ranks_figures(close)["ranks_sentence"]


def _study(recovered: float | None) -> dict:
    rows = [{"reader": "shards: TarShardDataset, 1 GET per shard", "rtt_ms": 80, "in_flight": 1, "requests": 4,
             "lost_ms_per_sample": 2.0},
            {"reader": "ranged: 1 GET per sample", "rtt_ms": 80, "in_flight": 1, "requests": 64,
             "lost_ms_per_sample": 82.0},
            {"reader": "MDS: StreamingDataset, epoch 2 (local cache)", "rtt_ms": 80, "in_flight": 1, "requests": 0}]
    return {"rows": rows, "recovered_at_80ms": recovered, "data": {"samples": 256, "shards": 4},
            "kept_at_80ms": {"shards": 0.147, "ranged: 1 GET per sample": 0.072, "s3torchconnector": 0.215,
                             "shards, projected for 1 GB shards": 0.977}}


@pytest.mark.parametrize("recovered, words", [(1.126, "more than all of it"), (0.7, "won back 70 % of"),
                                              (0.3, "less than half")])
def test_the_store_sentences_follow_what_requests_in_flight_won_back(recovered, words):
    figures = ch15.store_figures(_study(recovered), 32)
    assert words in figures["recovered_sentence"]
    assert "the course's shard reader kept 15 %" in figures["store_sentence"]
    assert "shards of 1 GB would keep about 98 %" in figures["store_sentence"]
    assert "single-sample ranged reads, one at a time, kept 7 %" in figures["store_sentence"]
    assert "second epoch read its local cache and made 0 requests" in figures["store_sentence"]
    assert figures["key_store"].startswith("At 80 ms to first byte, ranged reads one at a time kept 7 %")
    assert ch15.store_figures(_study(None), 32)["key_store"] == ""


def test_prices_and_the_resume_table_come_from_the_cost_model():
    preemption, epoch = preemption_cost(64, 1000, rtt_ms=80, in_flight=32), epoch_cost()
    sentence = ch15.price_figures(preemption, epoch, 32, "the price page", "the user guide", 0.0004, 5500)[
        "price_sentence"]
    assert "64,000 GETs, costs $0.0256" in sentence and "80 s with one request in flight" in sentence
    assert "11.6 s with 32, already the floor" in sentence and "take at least 11.6 s" in sentence
    assert "1,281,167 GETs ($0.51)" in sentence
    slower = ch15.price_figures(preemption_cost(64, 1000, rtt_ms=80, in_flight=4), epoch, 4, "p", "u", 0.0004, 5500)
    assert "20.0 s with 4, and no number in flight gets it under the floor" in slower["price_sentence"]
    rows = resume_table(64, 1000, 1e9, in_flight=32)
    table = ch15.resume_rows(rows)
    assert set(table[0]) >= {"s at 20 ms", "s at 20 ms, 32 in flight", "s at 80 ms", "s at 80 ms, 32 in flight"}
    assert table[1]["samples skipped"] == "64,000" and table[0]["samples skipped"] == "0"
    words = ch15.resume_figures(rows)["resume_sentence"]
    assert "The exact resume costs 64,064 requests" in words and "64,000 samples go unseen" in words


def _cache_row(reader, epoch, requests, mb, rate=100.0, seconds=1.0, methods=None):
    return {"reader": reader, "epoch": epoch, "requests": requests, "bytes_down": int(mb * 1e6),
            "samples_per_s": rate, "seconds": seconds, "methods": methods or ({"GET": requests} if requests else {}),
            "cache_bytes": 0}


@pytest.mark.parametrize("again_mb, thrashed", [(27.5, True), (9.0, False)])
def test_the_cache_sentences_follow_what_the_second_epoch_fetched(again_mb, thrashed):
    study = {"rtt_ms": 80, "data": {"cache_limit_bytes": 13_800_000, "cache_fraction": 0.5, "mds_shards": 16,
                                    "mds_tick_s": 0.007},
             "rows": [_cache_row("straight from the store: TarShardDataset", 1, 4, 28.0),
                      _cache_row("straight from the store: TarShardDataset", 2, 4, 28.0),
                      _cache_row("staged to local disk first (packlab.staging)", 1, 4, 28.0, seconds=0.53),
                      _cache_row("staged to local disk first (packlab.staging)", 2, 0, 0.0, seconds=0.05),
                      _cache_row("MDS: cache holds the dataset", 1, 33, 27.6, rate=68, methods={"HEAD": 16, "GET": 17}),
                      dict(_cache_row("MDS: cache holds the dataset", 2, 0, 0.0, rate=1100), predownload=8),
                      _cache_row("MDS: predownload=256", 1, 33, 27.6, rate=80),
                      _cache_row("MDS: predownload=256", 2, 0, 0.0, rate=9900),
                      _cache_row("MDS: cache_limit = 50% of the dataset", 1, 33, 27.6),
                      _cache_row("MDS: cache_limit = 50% of the dataset", 2, 30, again_mb)]}
    words = ch15.cache_figures(study)
    assert "17 GET, 16 HEAD" in words["cache_sentence"]
    assert "the second sent 0 requests" in words["cache_sentence"]
    assert "(8 samples ahead here) its threads sleep 7 ms" in words["cache_sentence"]  # 9,900 against 1,100 a second
    assert ("kept nothing useful" in words["cache_limit_sentence"]) is thrashed
    assert ("saved part" in words["cache_limit_sentence"]) is not thrashed
    assert f"{again_mb:.1f} of the first epoch's 27.6 MB" in words["cache_limit_sentence"]
    assert ("keeps almost nothing" in words["key_cache"]) is thrashed
    assert words["key_cache"].startswith("A node-local cache or a staged copy takes the store out")


def test_no_key_point_on_caches_when_the_cached_epoch_still_asked_the_store():
    study = {"rtt_ms": 80, "data": {"cache_limit_bytes": 1, "cache_fraction": 0.5, "mds_shards": 16},
             "rows": [_cache_row("MDS: cache holds the dataset", 1, 33, 27.6),
                      _cache_row("MDS: cache holds the dataset", 2, 3, 1.0)]}
    words = ch15.cache_figures(study)
    assert words["key_cache"] == "" and "its second 3 requests" in words["cache_sentence"]

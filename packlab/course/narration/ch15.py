"""Sentences of chapter 15, "At scale: stragglers and slow stores", built from what its cells measured.

Every number comes from the chapter's own runs; where a comparison has a verdict (the
simulation against the real two ranks, concurrency against one request at a time) the
sentence follows it, including when it goes the other way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from packlab.course.prose import provides_figures

# ------------------------------------------------------------------------------ per-batch waits


@provides_figures("tail_sentence", "key_tail")
def tail_figures(rows: Sequence[Mapping]) -> dict:
    """How far each loader's p99 wait sits above its median: the tail that a job of many ranks meets every step."""
    parts, ratios = [], {}
    for row in rows:
        p50, p99 = row["wait p50 ms"], row["wait p99 ms"]
        ratios[row["loader"]] = p99 / p50 if p50 > 0 else float("inf")
        parts.append(f"{row['loader']} waited {p50:.1f} ms at the median and {p99:.1f} ms at the p99")
    worst = max(ratios, key=ratios.get)
    sentence = ("Run each just at its limit, " + "; ".join(parts) + f". The longest tail was {worst}'s, its p99 "
                f"{ratios[worst]:.1f} times its median.")
    key = f"the p99 wait for a batch was up to {ratios[worst]:.1f} times the median ({worst})."
    return {"tail_sentence": sentence, "key_tail": key[0].upper() + key[1:]}


# ------------------------------------------------------------------------------ ranks and the simulation


@provides_figures("ranks_sentence")
def ranks_figures(rank_rows: Sequence[Mapping]) -> dict:
    """What the real ranks did, loader by loader: each rank's tail, and who waited for whom in the exchange."""
    by_loader: dict[str, list[Mapping]] = {}
    for row in rank_rows:
        by_loader.setdefault(row.get("loader", "the loader"), []).append(row)
    tails = "; ".join(f"{loader}, " + " and ".join(f"{r['wait p99 ms']:.1f} ms" for r in rows)
                      for loader, rows in by_loader.items())
    first, rows = next(iter(by_loader.items()))
    slowest = max(rows, key=lambda r: r["wait p99 ms"])
    fastest = min(rows, key=lambda r: r["wait p99 ms"])
    sentence = (f"The ranks' p99 waits for a batch, rank by rank: {tails}. With {first}, a step lasted "
                f"{rows[0]['mean step ms']:.1f} ms on average. ")
    # Only a gap that is large against the exchange itself says one rank waited for the other; a few tenths of a
    # millisecond either way is the exchange's own noise, not a straggler.
    waited, own = fastest["all_reduce p50 ms"], slowest["all_reduce p50 ms"]
    if waited > 1.5 * own and waited - own > 1.0:
        sentence += (f"Rank {fastest['rank']} spent longer in the exchange than rank {slowest['rank']} "
                     f"({fastest['all_reduce p50 ms']:.1f} against {slowest['all_reduce p50 ms']:.1f} ms, median): it "
                     "had its batch sooner and waited there for the other, which is how a straggler's wait reaches "
                     "every rank.")
    else:
        sentence += (f"The two ranks spent about as long in the exchange ({own:.1f} and {waited:.1f} ms, median): neither "
                     "was the other's straggler for long in this run.")
    return {"ranks_sentence": sentence}


def _validation_clause(validation: Mapping) -> str:
    error = 100 * validation["mean relative error"]
    return (f"{validation['simulated mean step ms']:.1f} ms against the measured "
            f"{validation['measured mean step ms']:.1f} ms ({error:+.1f} %), "
            + ("within" if validation["agrees"] else "outside")
            + f" the {validation['tolerance ms']:.1f} ms the run's own noise allows")


@provides_figures("simulation_sentence", "validation_sentence", "depth_sentence", "key_ranks")
def simulation_figures(slowest: Sequence[Mapping], slowest_check: Mapping, queue: Sequence[Mapping],
                       queue_check: Mapping) -> dict:
    """The slowest of N measured waits (and its check on the two real ranks), then what the queue model says of depth."""
    by_ranks = {row["ranks"]: row for row in slowest}
    shown = [n for n in (8, 64, 1024) if n in by_ranks]
    largest = max(by_ranks)
    simulation = (
        "Drawing each rank's wait from the ones the two real ranks measured, and taking the largest at every step, "
        f"one rank spends {by_ranks[1]['waiting %']:.1f} % of its step waiting for data; "
        + ", ".join(f"{n:,} ranks {by_ranks[n]['waiting %']:.1f} %" for n in shown)
        + f" (a mean step of {by_ranks[1]['mean step ms']:.1f} ms growing to {by_ranks[largest]['mean step ms']:.1f} ms).")
    validation = ("Checked on the two real ranks, the same model gave a mean step of " + _validation_clause(slowest_check)
                  + ".")
    if not slowest_check["agrees"]:
        validation += (" On this machine the two real ranks did not wait independently (they share its cores), "
                       "which the model assumes; read its rows as a direction, not a forecast.")
    depths = sorted({row["depth"] for row in queue})
    shallow, deep = depths[0], depths[-1]
    row = {(r["ranks"], r["depth"]): r for r in queue}
    depth_sentence = (
        "What a deeper prefetch queue buys needs a model of the queue: each rank's loader as its workers, each taking "
        "a batch time drawn from the ones they measured with nothing else to do, at most "
        f"`workers × prefetch_factor` batches in flight (`stragglers.simulate_sync`). At {largest:,} ranks it gives "
        f"{row[(largest, shallow)]['waiting %']:.1f} % of the step waiting at the default depth of {shallow} batches and "
        f"{row[(largest, deep)]['waiting %']:.1f} % at {deep}. Its check on the two real ranks: "
        + _validation_clause(queue_check) + "."
        + ("" if queue_check["agrees"] else
           " It misses them: their waits hold more than the batch times (handing each batch over, the cores they "
           "share), so it says what a deeper queue does against uneven batch times, and no more."))
    key = (f"the slowest of {largest:,} ranks' waits, drawn from the ones measured here, would take "
           f"{by_ranks[largest]['waiting %']:.1f} % of every step, against {by_ranks[1]['waiting %']:.1f} % for one rank"
           + ("" if slowest_check["agrees"] else " (a model that missed the two real ranks here)") + ".")
    return {"simulation_sentence": simulation, "validation_sentence": validation, "depth_sentence": depth_sentence,
            "key_ranks": key[0].upper() + key[1:]}


# ------------------------------------------------------------------------------ a store far away

#: The readers of the latency sweep, by the start of their row names in :func:`packlab.store_latency.latency_sweep`.
SHARDS, RANGED, S3TC, MDS_FIRST = ("shards", "ranged: 1 GET per sample", "s3torchconnector",
                                   "MDS: StreamingDataset, epoch 1")


def _share(value: float) -> str:
    return f"{100 * value:.0f} %"


def store_rows(rows: Sequence[Mapping]) -> list[dict]:
    """The latency sweep as a table: per reader and round trip, rate, first sample, requests, bytes, loss per sample."""
    return [{"reader": r["reader"], "round trip, ms": f"{r['rtt_ms']:g}", "samples/s": f"{r['samples_per_s']:,.0f}",
             "first sample, s": f"{r['first_sample_s']:.3f}", "requests": r["requests"],
             "connections": r["connections"], "MB read": f"{r['bytes_down'] / 1e6:.1f}",
             "lost per sample, ms": f"{r.get('lost_ms_per_sample', 0.0):.2f}"} for r in rows]


@provides_figures("store_sentence", "recovered_sentence", "key_store")
def store_figures(study: Mapping, in_flight: int) -> dict:
    """What each reader kept of its speed at the longest round trip, and what requests in flight won back."""
    kept = study["kept_at_80ms"]
    far = max(r["rtt_ms"] for r in study["rows"])
    lost = {r["reader"].split(":")[0]: r.get("lost_ms_per_sample", 0.0) for r in study["rows"] if r["rtt_ms"] == far
            and r["in_flight"] == 1}
    cache = [r for r in study["rows"] if r["rtt_ms"] == far and "local cache" in r["reader"]]
    parts = []
    if SHARDS in kept:
        parts.append(f"the course's shard reader kept {_share(kept[SHARDS])} (one round trip per shard, "
                     f"{lost.get('shards', 0.0):.2f} ms lost per sample with these small shards of "
                     f"{study['data']['samples'] // study['data']['shards']} images"
                     + (f"; shards of 1 GB would keep about {_share(kept['shards, projected for 1 GB shards'])}"
                        if "shards, projected for 1 GB shards" in kept else "") + ")")
    if S3TC in kept:
        parts.append(f"s3torchconnector kept {_share(kept[S3TC])}")
    if MDS_FIRST in kept:
        parts.append(f"MosaicML Streaming's first epoch kept {_share(kept[MDS_FIRST])}")
    if RANGED in kept:
        parts.append(f"single-sample ranged reads, one at a time, kept {_share(kept[RANGED])}: every sample waited a "
                     "round trip")
    sentence = f"At {far:g} ms to first byte, against its own speed at 0 ms, " + "; ".join(parts) + "."
    if cache:
        sentence += (f" MosaicML Streaming's second epoch read its local cache and made {cache[0]['requests']} "
                     "requests: a node-local cache takes the store out of every epoch after the first.")
    recovered = study["recovered_at_80ms"]
    if recovered is None:
        recovered_sentence, key = "The ranged reads were not measured with requests in flight here.", ""
    else:
        enough = recovered >= 0.5
        recovered_sentence = (
            f"With {in_flight} requests in flight inside the one worker, the same ranged reads won back "
            f"{_share(recovered)} of what one at a time lost at {far:g} ms"
            + (" (more than all of it: requests in flight also overlap the server's own time)." if recovered > 1
               else "." if enough else ", less than half: on this machine the store or the proxy became the limit."))
        key = (f"at {far:g} ms to first byte, ranged reads one at a time kept {_share(kept.get(RANGED, 0.0))} of their "
               f"speed, and {in_flight} in flight won back {_share(recovered)} of the loss.")
    return {"store_sentence": sentence, "recovered_sentence": recovered_sentence,
            "key_store": key[:1].upper() + key[1:]}


@provides_figures("price_sentence")
def price_figures(preemption: Mapping, epoch: Mapping, in_flight: int, source: str, limit_source: str,
                  get_per_1000: float, get_limit: int) -> dict:
    """Requests in dollars and in the store's rate limit: one preemption's exact resume, and one epoch two ways."""
    sentence = (
        f"At ${get_per_1000:g} per 1,000 GET requests ({source}), an exact resume of {preemption['workers']} "
        f"workers with {preemption['buffered']:,} buffered samples each, {preemption['requests']:,} GETs, costs "
        f"${preemption['dollars']:.4f}: nothing. Its time is what matters: at {preemption['rtt_ms']:g} ms it takes "
        f"{preemption['seconds_one_in_flight']:.0f} s with one request in flight per worker and "
        f"{preemption[f'seconds_{in_flight}_in_flight']:.1f} s with {in_flight}"
        + (", already the floor" if preemption[f"seconds_{in_flight}_in_flight"] <= preemption["rate_limit_floor_s"]
           else ", and no number in flight gets it under the floor")
        + f": S3 serves about {get_limit:,} GETs per second per partitioned prefix ({limit_source}), so "
        f"{preemption['requests']:,} GETs under one prefix take at least {preemption['rate_limit_floor_s']:.1f} s. "
        "An epoch of "
        f"{epoch['samples']:,} samples read one GET per sample is {epoch['sample_gets']:,} GETs "
        f"(${epoch['sample_dollars']:.2f}), read as shards of 1 GB {epoch['shard_gets']:,} "
        f"(${epoch['shard_dollars']:.5f}).")
    return {"price_sentence": sentence}


def resume_rows(rows: Sequence[Mapping]) -> list[dict]:
    """The resume table for the page: requests, bytes in GB, dollars, samples skipped or repeated, seconds."""
    out = []
    for row in rows:
        line = {"resume": row["resume"], "requests": f"{row['requests']:,}", "GB read": f"{row['bytes'] / 1e9:.2f}",
                "dollars": f"{row['dollars']:.5f}", "samples skipped": f"{row['samples_skipped']:,}",
                "samples repeated": f"{row['samples_repeated']:,}"}
        for key, value in row.items():
            found = re.fullmatch(r"seconds_at_([\d.]+)ms(?:_(\d+)_in_flight)?", key)
            if found:
                rtt, in_flight = found.groups()
                line[f"s at {rtt} ms" + (f", {in_flight} in flight" if in_flight else "")] = f"{value:.2f}"
        out.append(line)
    return out


@provides_figures("resume_sentence")
def resume_figures(rows: Sequence[Mapping]) -> dict:
    """The trade in one sentence: the exact resume's requests and seconds against what the approximate ones give up."""
    exact = next(r for r in rows if r["resume"].startswith("exact"))
    drop = next(r for r in rows if "drop" in r["resume"])
    again = next(r for r in rows if "re-read" in r["resume"])
    slowest = max(v for k, v in exact.items() if k.startswith("seconds_at_") and "in_flight" not in k)
    fastest = min(v for k, v in exact.items() if k.startswith("seconds_at_"))
    sentence = (
        f"The exact resume costs {exact['requests']:,} requests and {fastest:.1f} to {slowest:.1f} s, and the model "
        f"sees every sample once. Dropping the buffer costs {drop['requests']:,} requests and no wait, and "
        f"{drop['samples_skipped']:,} samples go unseen this epoch; re-reading each shard from its start costs "
        f"{again['requests']:,} requests but {again['bytes'] / 1e9:.0f} GB, and {again['samples_repeated']:,} samples "
        "come twice unless the reader skips what it had delivered. Which one is right depends on how often the job "
        "is preempted and on whether a skipped or repeated sample matters for its recipe (chapter 13 measures what an "
        "order costs).")
    return {"resume_sentence": sentence}


# ------------------------------------------------------------------------------ a cache on the node

CACHE_STRAIGHT = "straight from the store"
CACHE_STAGED = "staged to local disk first"
CACHE_MDS_ALL = "MDS: cache holds the dataset"
CACHE_MDS_AHEAD = "MDS: predownload"
CACHE_MDS_HALF = "MDS: cache_limit"


def _methods(row: Mapping) -> str:
    """``"17 GET, 16 HEAD"``: the requests of a row by HTTP method, most first."""
    counts = sorted(row.get("methods", {}).items(), key=lambda item: -item[1])
    return ", ".join(f"{count} {method}" for method, count in counts) or "none"


def cache_table_rows(rows: Sequence[Mapping]) -> list[dict]:
    """The cache study as a table: per way of reading and epoch, rate, seconds, requests by method, bytes, disk used."""
    return [{"reader": r["reader"], "epoch": r["epoch"], "samples/s": f"{r['samples_per_s']:,.0f}",
             "seconds": f"{r['seconds']:.2f}", "requests": _methods(r), "MB read": f"{r['bytes_down'] / 1e6:.1f}",
             "MB on local disk": f"{r['cache_bytes'] / 1e6:.1f}"} for r in rows]


def _epochs(rows: Sequence[Mapping], prefix: str) -> tuple[Mapping, Mapping] | None:
    found = {r["epoch"]: r for r in rows if r["reader"].startswith(prefix)}
    return (found[1], found[2]) if 1 in found and 2 in found else None


@provides_figures("cache_sentence", "cache_limit_sentence", "key_cache")
def cache_figures(study: Mapping) -> dict:
    """What each way of reading paid in its second epoch, and what a cache too small for one pass kept."""
    rows, rtt = study["rows"], study["rtt_ms"]
    parts = []
    straight, staged = _epochs(rows, CACHE_STRAIGHT), _epochs(rows, CACHE_STAGED)
    mds, ahead, half = _epochs(rows, CACHE_MDS_ALL), _epochs(rows, CACHE_MDS_AHEAD), _epochs(rows, CACHE_MDS_HALF)
    if straight:
        parts.append(f"read straight from the store, the second epoch sent {straight[1]['requests']} requests and "
                     f"read {straight[1]['bytes_down'] / 1e6:.1f} MB again, as the first did")
    if staged:
        parts.append(f"staged, the first epoch (the copy, then the local read) took {staged[0]['seconds']:.2f} s"
                     + (f" against {straight[0]['seconds']:.2f} s straight from the store" if straight else "")
                     + f", and the second sent {staged[1]['requests']} requests and took {staged[1]['seconds']:.2f} s")
    if mds:
        parts.append(f"MosaicML Streaming's first epoch sent {_methods(mds[0])} (boto3's download_file, which it "
                     f"calls, sends a HEAD for the size before each GET) at {mds[0]['samples_per_s']:,.0f} "
                     f"samples/s, and its second {mds[1]['requests']} requests")
    sentence = f"At {rtt:g} ms to first byte: " + "; ".join(parts) + "." if parts else "The cache study did not run."
    if mds and ahead:
        faster = ahead[1]["samples_per_s"] / mds[1]["samples_per_s"] if mds[1]["samples_per_s"] else float("inf")
        sentence += (f" With predownload set to a whole epoch, its first epoch ran at "
                     f"{ahead[0]['samples_per_s']:,.0f} samples/s against {mds[0]['samples_per_s']:,.0f} (its one "
                     "download thread still fetches a shard at a time), and its second, from the same cache, at "
                     f"{ahead[1]['samples_per_s']:,.0f} against {mds[1]['samples_per_s']:,.0f}"
                     + (f" ({faster:.1f} times): with the default ({mds[1].get('predownload', '?')} samples ahead "
                        f"here) its threads sleep {study['data'].get('mds_tick_s', 0) * 1000:.0f} ms whenever they "
                        "are that far ahead, and the reading waits on them." if faster >= 2 else "."))
    thrashed = False
    if half:
        limit_mb = study["data"]["cache_limit_bytes"] / 1e6
        again, first = half[1]["bytes_down"], half[0]["bytes_down"]
        thrashed = bool(first) and again >= 0.9 * first
        share = f"{study['data']['cache_fraction']:.0%} of the dataset"
        if thrashed:
            limit_sentence = (f"A cache_limit of {limit_mb:.1f} MB, {share}, kept nothing useful: the "
                              f"second epoch downloaded {again / 1e6:.1f} of the first epoch's {first / 1e6:.1f} MB "
                              "again. Read in the same order every epoch, the least recently used shard is always "
                              "the next one needed, so a cache smaller than one pass evicts each shard before its "
                              "turn comes round.")
        else:
            limit_sentence = (f"A cache_limit of {limit_mb:.1f} MB, {share}, saved part of the second "
                              f"epoch: it downloaded {again / 1e6:.1f} of the first epoch's {first / 1e6:.1f} MB again.")
    else:
        limit_sentence = "A cache smaller than the dataset was not measured here."
    key = ""
    if mds and mds[1]["requests"] == 0:
        key = "A node-local cache or a staged copy takes the store out of every epoch after the first"
        key += ("; a cache smaller than one pass, read in the same order, keeps almost nothing." if thrashed else ".")
    return {"cache_sentence": sentence, "cache_limit_sentence": limit_sentence, "key_cache": key}

"""Checks of exercise 5 (``05_shard_split``): splitting shards by rank and worker, and a dataset per rank."""

from __future__ import annotations

import functools
from collections import Counter

from packlab.course.grading.core import Context, PartFailed, describe, register, short
from packlab.course.grading.fixtures import (
    audit_records,
    collect_epoch,
    fixture_shards,
    make_loader,
    reference_pixels,
    sha256_transform,
    sha_reference,
    shard_of_key,
    subset,
)


# ------------------------------------------------------------------ 5. rank x worker split


_SPLIT_CASES = [(8, 2, 4), (10, 2, 4), (10, 3, 2), (12, 3, 2), (7, 1, 3), (9, 3, 3), (30, 4, 4), (101, 4, 8), (6, 2, 3)]


def _split_table(ctx: Context, n: int, world: int, workers: int) -> dict[tuple[int, int], list]:
    shards = [f"shard-{i:06d}.tar" for i in range(n)]
    table = {}
    for rank in range(world):
        for worker in range(workers):
            got = ctx.call(list(shards), rank, world, worker, workers)
            table[(rank, worker)] = list(got)
    return table


def _split_exactly_once(ctx: Context) -> str:
    for n, world, workers in _SPLIT_CASES:
        table = _split_table(ctx, n, world, workers)
        counts = Counter(s for got in table.values() for s in got)
        expected = {f"shard-{i:06d}.tar" for i in range(n)}
        missing = sorted(expected - set(counts))
        twice = sorted(s for s, c in counts.items() if c > 1)
        unknown = sorted(set(counts) - expected)
        if missing or twice or unknown:
            raise PartFailed(
                f"{n} shards, {world} ranks x {workers} workers: {len(missing)} shards read by nobody "
                f"{missing[:3]}, {len(twice)} read more than once {twice[:3]}"
                + (f", unknown {unknown[:3]}" if unknown else "")
            )
    return f"every shard read exactly once in {len(_SPLIT_CASES)} layouts (including uneven ones)"


def _split_balanced(ctx: Context) -> str:
    for n, world, workers in _SPLIT_CASES:
        table = _split_table(ctx, n, world, workers)
        per_rank = [sum(len(table[(r, w)]) for w in range(workers)) for r in range(world)]
        if max(per_rank) - min(per_rank) > 1:
            raise PartFailed(f"{n} shards over {world} ranks: ranks got {per_rank} shards; they should differ by at most one")
        for rank in range(world):
            per_worker = [len(table[(rank, w)]) for w in range(workers)]
            if max(per_worker) - min(per_worker) > 1:
                raise PartFailed(f"{n} shards, {world} ranks x {workers} workers: rank {rank}'s workers got {per_worker}")
    return "ranks, and the workers of each rank, get shard counts differing by at most one"


def _split_rank_first(ctx: Context) -> str:
    n, world = 24, 3
    for rank in range(world):
        shares = []
        for workers in (1, 2, 4):
            shares.append(sorted(s for w in range(workers) for s in ctx.call([f"shard-{i:06d}.tar" for i in range(n)], rank, world, w, workers)))
        if not shares[0] == shares[1] == shares[2]:
            raise PartFailed(f"rank {rank} of {world} reads other shards with 1, 2 or 4 workers: split by rank first, then among the rank's workers")
    return "a rank's shards do not depend on how many workers it runs"


def _split_too_few(ctx: Context) -> str:
    shards = [f"shard-{i:06d}.tar" for i in range(6)]
    try:
        got = ctx.candidate(list(shards), 0, 2, 0, 4)
    except ValueError as exc:
        if not ("6" in str(exc) and "8" in str(exc)):
            raise PartFailed(f"ValueError raised, but the message should name both counts (6 shards, 2 x 4 = 8 readers): {exc}") from None
    except Exception as exc:
        raise PartFailed(f"expected a ValueError, got {describe(exc)}") from None
    else:
        raise PartFailed(f"6 shards for 2 ranks x 4 workers returned {got!r} instead of raising ValueError")
    exact = ctx.call(list(shards), 1, 2, 2, 3)
    if len(exact) != 1:
        raise PartFailed(f"6 shards for 2 ranks x 3 workers is enough (one each), but worker 2 of rank 1 got {exact!r}")
    return "too few shards raise ValueError naming the counts; exactly enough works"


def _split_pure(ctx: Context) -> str:
    shards = [f"shard-{i:06d}.tar" for i in range(10)]
    given = list(shards)
    first = ctx.call(given, 1, 2, 1, 2)
    if given != shards:
        raise PartFailed("the function changed the list it was given; build a new list instead")
    if ctx.call(given, 1, 2, 1, 2) != first:
        raise PartFailed("two calls with the same arguments gave different shards")
    if not isinstance(first, list) or not all(isinstance(s, str) for s in first):
        raise PartFailed(f"return a list of the shard names given; got {short(first)}")
    return "leaves its input alone and is deterministic"


register(
    "shard_split",
    "05_shard_split",
    "split shards by rank, then by DataLoader worker: every shard read exactly once",
    "shards_for(shards, rank, world_size, worker_id, num_workers) -> list: the shards this worker of this rank reads; "
    "raises ValueError (naming both counts) when there are fewer shards than world_size x num_workers",
    dict,
    [
        ("exactly_once", "over all ranks and workers every shard is read exactly once, remainder included",
         "slice with a step: shards[rank::world_size], then that list [worker_id::num_workers]; never divide and truncate", _split_exactly_once),
        ("balanced", "ranks (and workers within a rank) get shard counts differing by at most one",
         "strided slices are balanced by construction; contiguous chunks must spread the remainder", _split_balanced),
        ("rank_first", "a rank's shards do not depend on its number of workers",
         "split by rank first, then split the rank's shards among its workers", _split_rank_first),
        ("too_few_shards", "fewer shards than ranks x workers raise ValueError naming both counts",
         "check len(shards) < world_size * num_workers first and raise ValueError(f'... {len(shards)} ... {world_size * num_workers} ...')", _split_too_few),
        ("pure", "does not change its input; same arguments, same answer",
         "return new lists (slicing does) and use no randomness", _split_pure),
    ],
)


# ------------------------------------------------------------- 5b. reading under a world size


def _rank_fixtures() -> dict:
    samples = subset(200, seed=7)
    shards = fixture_shards("rank-200-20", samples, maxcount=20)
    return {"samples": samples, "shards": shards, "pixels": reference_pixels([s.key for s in samples])}


def _rank_epoch(ctx: Context, world: int, workers: int, digest: str = "sha256") -> tuple[list, list[int]]:
    """Read one epoch on every simulated rank; return all records and the per-rank counts."""
    samples = ctx.fixtures["samples"]
    shards = [str(p) for p in ctx.fixtures["shards"]]
    records, counts = [], []
    for rank in range(world):
        kwargs = {} if digest == "pixels" else {"transform": sha256_transform}
        dataset = ctx.call(shards, rank, world, return_key=True, **kwargs)
        got = collect_epoch(make_loader(ctx, dataset, workers=workers), len(samples), digest)
        records += got
        counts.append(len(got))
    return records, counts


def _rank_one(ctx: Context) -> str:
    records, _ = _rank_epoch(ctx, 1, 0, "pixels")
    return audit_records(records, ctx.fixtures["samples"], ctx.fixtures["pixels"])


def _rank_world(ctx: Context, world: int, workers: int) -> str:
    samples = ctx.fixtures["samples"]
    records, counts = _rank_epoch(ctx, world, workers)
    try:
        audit_records(records, samples, sha_reference(samples))
    except PartFailed as exc:
        raise PartFailed(f"{exc}\nsamples per rank: {counts}") from None
    if min(counts) == 0:
        raise PartFailed(f"a rank received no samples: {counts}")
    # Every sample once is not enough: each rank must read the shards the rank-first split gives it.
    shard_of = shard_of_key(ctx.fixtures["shards"])
    per_shard = Counter(shard_of.values())
    got, start = [], 0
    for count in counts:
        got.append(sorted({shard_of[key] for key, _, _ in records[start : start + count]}))
        start += count
    everything = list(range(len(ctx.fixtures["shards"])))
    wanted = [everything[rank::world] for rank in range(world)]
    if got != wanted:
        expected_counts = [sum(per_shard[i] for i in shards) for shards in wanted]
        raise PartFailed(
            f"every sample arrived once, but the ranks read other shards than shards_for gives them: per rank shards "
            f"{got} (samples {counts}), expected {wanted} (samples {expected_counts}). Call "
            "shards_for(shards, rank, world_size, worker_id, num_workers) with the arguments in this order: rank and "
            "world size first, then the worker's id and count"
        )
    return f"{world} ranks x {workers} workers: every sample exactly once, each rank its own shards; per rank {counts}"


def _rank_too_few(ctx: Context) -> str:
    shards = [str(p) for p in ctx.fixtures["shards"]]
    try:
        dataset = ctx.candidate(shards, 0, 4, transform=sha256_transform, return_key=True)
        got = collect_epoch(make_loader(ctx, dataset, workers=3), len(ctx.fixtures["samples"]), "sha256")
    except PartFailed as exc:
        if "ValueError" in str(exc) and "10" in str(exc) and "12" in str(exc):
            return "10 shards for 4 ranks x 3 workers fail loudly with ValueError"
        raise PartFailed(f"expected a ValueError naming both counts (10 shards, 12 readers); got: {exc}") from None
    except ValueError as exc:
        if "10" in str(exc) and "12" in str(exc):
            return "10 shards for 4 ranks x 3 workers fail loudly with ValueError"
        raise PartFailed(f"the ValueError should name both counts (10 shards, 12 readers): {exc}") from None
    except Exception as exc:
        raise PartFailed(f"expected a ValueError, got {describe(exc)}") from None
    raise PartFailed(f"10 shards for 4 ranks x 3 workers: rank 0 silently read {len(got)} samples instead of raising ValueError")


register(
    "rank_dataset",
    "05_shard_split",
    "an IterableDataset that reads its rank's and worker's shards under a simulated world size",
    "RankShardDataset(shards, rank, world_size, transform=None, return_key=False): reads the shards "
    "shards_for(shards, rank, world_size, worker_id, num_workers) gives this DataLoader worker (worker 0 of 1 "
    "without workers); yields (transform(jpg bytes), int(cls)[, key])",
    _rank_fixtures,
    [
        ("one_rank", "world size 1, no workers: every sample once, labels and pixels match",
         "with no worker info (num_workers=0) read as worker 0 of 1", _rank_one),
        ("two_ranks", "world size 2 x 2 workers (10 shards): every sample exactly once over all ranks",
         "call shards_for with this rank and the worker id from get_worker_info() inside __iter__",
         functools.partial(_rank_world, world=2, workers=2)),
        ("three_ranks", "world size 3 x 2 workers (10 shards, uneven): every sample exactly once",
         "uneven layouts lose the remainder when shards are cut into equal chunks; use strided slices",
         functools.partial(_rank_world, world=3, workers=2)),
        ("too_few_shards", "10 shards for 4 ranks x 3 workers raise ValueError instead of idling a rank",
         "let shards_for's ValueError propagate from __iter__; do not catch it", _rank_too_few),
    ],
)

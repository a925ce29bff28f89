"""Checks of exercise 4 (``04_tar_shards``): writing tar shards, and reading them with workers and shuffling."""

from __future__ import annotations

import functools
import hashlib
import tarfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from packlab.grading.core import Context, PartFailed, attempt, register, short
from packlab.grading.fixtures import (
    audit_records,
    collect_epoch,
    fixture_shards,
    make_loader,
    preflight_spawn,
    reference_pixels,
    sha256_transform,
    sha_reference,
    subset,
)


# -------------------------------------------------------------------- 4. tar shard writer


def _tar_write_fixtures() -> dict:
    samples = subset(300, seed=5)
    # Handed to the writer sorted by class, as a directory listing per class would be.
    return {"samples": sorted(samples, key=lambda s: (s.label, s.key)), "maxcount": 64}


def _shards_of(ctx: Context, seed: int = 0, tag: str = "shards") -> list[Path]:
    """Run the candidate writer once per (seed, tag) in this child and validate the returned paths."""
    memo_key = ("shards", seed, tag)
    if memo_key not in ctx.memo:
        folder = ctx.scratch(tag)
        returned = ctx.call(folder, ctx.fixtures["samples"], maxcount=ctx.fixtures["maxcount"], seed=seed)
        if not isinstance(returned, (list, tuple)) or not returned:
            raise PartFailed(f"write_shards must return the list of shard paths; it returned {short(returned)}")
        shards = [Path(p) for p in returned]
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise PartFailed(f"returned paths that do not exist: {', '.join(missing[:3])}")
        ctx.memo[memo_key] = shards
    return ctx.memo[memo_key]


def _tar_members(path: Path) -> list[tarfile.TarInfo]:
    try:
        with tarfile.open(path, "r:") as tar:
            return tar.getmembers()
    except tarfile.TarError as exc:
        raise PartFailed(f"{path.name} is not an uncompressed tar archive: {exc}") from None


def _tar_files(ctx: Context) -> str:
    shards = _shards_of(ctx)
    count = len(ctx.fixtures["samples"])
    maxcount = ctx.fixtures["maxcount"]
    expected = -(-count // maxcount)
    names = [p.name for p in shards]
    wanted = [f"shard-{i:06d}.tar" for i in range(expected)]
    if names != wanted:
        raise PartFailed(f"{count} samples at maxcount={maxcount} make {expected} shards named {wanted[0]} ... {wanted[-1]}; got {names[:3]}{' ...' if len(names) > 3 else ''}")
    if len({p.parent for p in shards}) != 1:
        raise PartFailed("all shards must be written into dst_dir")
    for path in shards:
        stems = {Path(m.name).stem for m in _tar_members(path)}
        if len(stems) > maxcount:
            raise PartFailed(f"{path.name} holds {len(stems)} samples, more than maxcount={maxcount}")
    return f"{expected} shards shard-000000.tar ... {wanted[-1]}, none above {maxcount} samples"


def _tar_samples(ctx: Context) -> str:
    samples = {s.key: s for s in ctx.fixtures["samples"]}
    seen: Counter = Counter()
    for path in _shards_of(ctx):
        with tarfile.open(path, "r:") as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                if key not in samples or ext not in ("cls", "jpg"):
                    raise PartFailed(f"{path.name} holds an unexpected member {member.name!r} (only <key>.cls and <key>.jpg)")
                payload = tar.extractfile(member).read()
                if ext == "jpg":
                    seen[key] += 1
                    if hashlib.sha256(payload).hexdigest() != samples[key].sha256:
                        raise PartFailed(f"{path.name}: {member.name} differs from the original JPEG")
                elif payload.decode(errors="replace").strip() != str(samples[key].label):
                    raise PartFailed(f"{path.name}: {member.name} holds {payload[:10]!r}, expected the label {samples[key].label} as text")
    missing = sorted(set(samples) - set(seen))
    duplicated = sorted(k for k, c in seen.items() if c > 1)
    if missing or duplicated:
        raise PartFailed(f"{len(missing)} samples missing (e.g. {missing[:3]}), {len(duplicated)} written more than once (e.g. {duplicated[:3]})")
    return f"{len(samples)} samples, each once, .jpg byte-identical and .cls = label"


def _tar_convention(ctx: Context) -> str:
    for path in _shards_of(ctx):
        names = [m.name for m in _tar_members(path)]
        if names != sorted(names):
            raise PartFailed(f"members of {path.name} are not sorted by name (first out of order: {next(b for a, b in zip(names, names[1:]) if b < a)})")
        for first, second in zip(names[::2], names[1::2]):
            if Path(first).stem != Path(second).stem or (Path(first).suffix, Path(second).suffix) != (".cls", ".jpg"):
                raise PartFailed(f"in {path.name}, {first} and {second} should be one sample's .cls and .jpg, side by side")
        if len(names) % 2:
            raise PartFailed(f"{path.name} holds an odd number of members: every sample needs both .cls and .jpg")
    return "each shard sorted by name, every sample's .cls and .jpg adjacent"


def _shard_keys(shards: Sequence[Path]) -> list[list[str]]:
    return [sorted({Path(m.name).stem for m in _tar_members(p)}) for p in shards]


def _tar_shuffled(ctx: Context) -> str:
    labels = {s.key: s.label for s in ctx.fixtures["samples"]}
    for path, keys in zip(_shards_of(ctx), _shard_keys(_shards_of(ctx))):
        classes = {labels[k] for k in keys if k in labels}
        if len(keys) >= 40 and len(classes) < 6:
            raise PartFailed(
                f"{path.name} holds only {len(classes)} of the 10 classes ({sorted(classes)}): the samples arrived sorted "
                "by class and were cut into shards without shuffling first"
            )
    return "samples given sorted by class end up mixed in every shard"


def _tar_seeded(ctx: Context) -> str:
    first = _shard_keys(_shards_of(ctx, seed=0))
    again = _shard_keys(_shards_of(ctx, seed=0, tag="again"))
    other = _shard_keys(_shards_of(ctx, seed=1, tag="other-seed"))
    if first != again:
        raise PartFailed("writing twice with seed=0 put samples into different shards: seed the shuffle (random.Random(seed))")
    if first == other:
        raise PartFailed("seed=0 and seed=1 gave the same shards: the seed must decide the shuffle")
    return "the same seed gives the same shards; another seed, other shards"


register(
    "tar_write",
    "04_tar_shards",
    "write WebDataset-style tar shards: shuffled first, at most maxcount samples each",
    "write_shards(dst_dir, samples, maxcount=1000, seed=0) -> list of paths: shuffles samples (manifest rows) with "
    "seed, cuts them into dst_dir/shard-000000.tar, ... of at most maxcount samples, each sample as <key>.cls "
    "(label as text) and <key>.jpg (original bytes), members sorted by name",
    _tar_write_fixtures,
    [
        ("shards", "shards named shard-000000.tar, ... in dst_dir, at most maxcount samples each",
         "start a new shard every maxcount samples; name it f'shard-{index:06d}.tar'", _tar_files),
        ("samples", "every sample exactly once, .jpg byte-identical to the original, .cls the label as text",
         "add two members per sample: f'{key}.cls' holding str(label).encode() and f'{key}.jpg' holding the file's bytes", _tar_samples),
        ("convention", "within a shard members are sorted by name, .cls and .jpg of a sample adjacent",
         "sort each shard's samples by key before adding them, and add .cls then .jpg", _tar_convention),
        ("shuffled", "samples given sorted by class are mixed in every shard (shuffle before cutting)",
         "shuffle a copy of the sample list with random.Random(seed).shuffle before cutting it into shards", _tar_shuffled),
        ("seeded", "the seed decides the shuffle: same seed, same shards",
         "use a private random.Random(seed) (or numpy default_rng(seed)), not the global random state", _tar_seeded),
    ],
)


# -------------------------------------------------------------------- 4b. tar shard reader


def _tar_read_fixtures() -> dict:
    samples = subset(240, seed=6)
    shards = fixture_shards("tar-240-30", samples, maxcount=30)
    return {"samples": samples, "shards": shards, "pixels": reference_pixels([s.key for s in samples])}


def _tar_dataset(ctx: Context, cls=None, shards=None, **kwargs):
    cls = cls or ctx.candidate
    shards = [str(p) for p in (shards or ctx.fixtures["shards"])]
    return attempt(cls, ctx.name, shards, return_key=True, **kwargs)


def _tar_epoch(ctx: Context, dataset, workers: int, method: str = "fork", epoch: int | None = None, digest: str = "sha256"):
    if epoch is not None:
        attempt(dataset.set_epoch, f"{ctx.name}.set_epoch", epoch)
    samples = ctx.fixtures["samples"]
    records = collect_epoch(make_loader(ctx, dataset, workers=workers, method=method), len(samples), digest)
    reference = ctx.fixtures["pixels"] if digest == "pixels" else sha_reference(samples)
    audit_records(records, samples, reference, workers=workers)
    return [key for key, _, _ in records]


def _tar_one_process(ctx: Context) -> str:
    keys = _tar_epoch(ctx, _tar_dataset(ctx), workers=0, digest="pixels")
    return f"{len(keys)} samples, each exactly once, labels and pixels match the manifest"


def _tar_workers(ctx: Context, workers: int, method: str) -> str:
    cls = ctx.importable() if method == "spawn" else ctx.candidate
    dataset = _tar_dataset(ctx, cls, transform=sha256_transform)
    if method == "spawn":
        preflight_spawn(dataset)
    keys = _tar_epoch(ctx, dataset, workers=workers, method=method)
    return f"{len(keys)} samples over {len(ctx.fixtures['shards'])} shards and {workers} workers, each exactly once"


def _tar_shuffle_epochs(ctx: Context) -> str:
    plain = _tar_epoch(ctx, _tar_dataset(ctx, transform=sha256_transform), workers=2)
    shuffled = _tar_dataset(ctx, shuffle_buffer=40, seed=0, transform=sha256_transform)
    first = _tar_epoch(ctx, shuffled, workers=2, epoch=0)
    second = _tar_epoch(ctx, shuffled, workers=2, epoch=1)
    if first == plain:
        raise PartFailed("with shuffle_buffer=40 the order is the same as without shuffling")
    if first == second:
        raise PartFailed("epochs 0 and 1 came in the same order: set_epoch(epoch) must change the shuffle (seed + epoch)")
    return "each epoch complete; the order differs from the shards' and between epochs"


def _tar_reproducible(ctx: Context) -> str:
    orders = []
    for _ in range(2):
        dataset = _tar_dataset(ctx, shuffle_buffer=40, seed=3, transform=sha256_transform)
        orders.append(_tar_epoch(ctx, dataset, workers=0, epoch=1))
    if orders[0] != orders[1]:
        raise PartFailed("two datasets with seed=3 at epoch 1 gave different orders: derive every random choice from seed and epoch")
    return "the same seed and epoch give the same order"


def _tar_bounded(ctx: Context) -> str:
    shard = ctx.fixtures["shards"][0]
    order = [Path(m.name).stem for m in _tar_members(shard) if m.name.endswith(".jpg")]
    buffer = 5
    for epoch in range(6):
        dataset = _tar_dataset(ctx, shards=[shard], shuffle_buffer=buffer, seed=epoch, transform=sha256_transform)
        attempt(dataset.set_epoch, f"{ctx.name}.set_epoch", epoch)
        first = attempt(lambda: next(iter(dataset)), "next(iter(dataset))")
        position = order.index(first[2]) if first[2] in order else None
        if position is None or position > buffer:
            raise PartFailed(
                f"with shuffle_buffer={buffer} the first sample out was sample {position} of its shard: a buffer of {buffer} "
                f"can only hold the first {buffer + 1} samples read (the whole shard was loaded?)"
            )
    return f"with shuffle_buffer={buffer} the first sample always comes from the first {buffer + 1} read"


register(
    "tar_dataset",
    "04_tar_shards",
    "an IterableDataset over tar shards: worker split, per-epoch shard shuffle, bounded shuffle buffer",
    "TarShardDataset(shards, shuffle_buffer=0, seed=0, transform=None, return_key=False) with set_epoch(epoch): "
    "worker w of W reads its share shards[w::W]; with shuffle_buffer > 0 the shard order is shuffled per epoch "
    "(the same in every worker) and samples pass through a buffer of at most shuffle_buffer; yields "
    "(transform(jpg bytes), int(cls)[, key])",
    _tar_read_fixtures,
    [
        ("one_process", "no workers: every sample once, labels and pixels match the manifest",
         "read each shard with tarfile.open(path, 'r|'), pair <key>.cls with <key>.jpg, decode with standard_transform", _tar_one_process),
        ("fork_3_workers", "3 fork workers (8 shards, uneven split): every sample exactly once",
         "in __iter__, get_worker_info() tells the worker id and count: read only shards[info.id::info.num_workers]",
         functools.partial(_tar_workers, workers=3, method="fork")),
        ("spawn_2_workers", "2 spawn workers: every sample exactly once",
         "keep no open files in the dataset object (open shards inside __iter__) and the class with its imports in one cell",
         functools.partial(_tar_workers, workers=2, method="spawn")),
        ("shuffle_epochs", "shuffle_buffer > 0: order differs from the shards' and between epochs, nothing lost",
         "seed a random.Random with (seed, epoch): shuffle the shard list the same way in every worker, then split it", _tar_shuffle_epochs),
        ("reproducible", "the same seed and epoch give the same order",
         "take every random choice from a random.Random seeded with seed and epoch (and the worker id for the buffer)", _tar_reproducible),
        ("bounded_buffer", "the shuffle buffer holds at most shuffle_buffer samples",
         "fill a list up to shuffle_buffer samples; then, per new sample, yield a random one from the list and put the new one in its place", _tar_bounded),
    ],
)

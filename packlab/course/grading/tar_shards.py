"""Checks of exercise 4 (``04_tar_shards``): writing tar shards, and reading them with workers and shuffling."""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from packlab.course.grading.core import Context, PartFailed, attempt, describe, register, short
from packlab.course.grading.fixtures import (
    audit_records,
    collect_epoch,
    fixture_shards,
    make_loader,
    preflight_spawn,
    reference_pixels,
    sha256_transform,
    sha_reference,
    shard_of_key,
    stop_workers,
    subset,
)


# -------------------------------------------------------------------- 4. tar shard writer


def _tar_write_fixtures() -> dict:
    samples = subset(300, seed=5)
    # Handed to the writer sorted by class, as a directory listing per class would be.
    return {"samples": sorted(samples, key=lambda s: (s.label, s.key)), "maxcount": 64}


def _shards_of(ctx: Context, seed: int = 0, tag: str = "shards", maxcount: int | None = None) -> list[Path]:
    """Run the candidate writer once per (seed, tag) in this child and validate the returned paths.

    Each call gets its own copy of the sample list; a writer that reorders the list it is
    given is noted in ``ctx.memo["reordered input"]`` (the ``seeded`` part reports it).
    """
    memo_key = ("shards", seed, tag)
    if memo_key not in ctx.memo:
        folder = ctx.scratch(tag)
        given = list(ctx.fixtures["samples"])
        returned = ctx.call(folder, given, maxcount=maxcount or ctx.fixtures["maxcount"], seed=seed)
        if given != ctx.fixtures["samples"]:
            ctx.memo["reordered input"] = True
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


def _sample_sequence(path: Path) -> list[str]:
    """The keys of a shard's samples in archive order; fails unless each sample's two files are adjacent."""
    names = [m.name for m in _tar_members(path)]
    if len(names) % 2:
        raise PartFailed(f"{path.name} holds an odd number of members: every sample needs both .cls and .jpg")
    keys = []
    for first, second in zip(names[::2], names[1::2]):
        if Path(first).stem != Path(second).stem or {Path(first).suffix, Path(second).suffix} != {".cls", ".jpg"}:
            raise PartFailed(
                f"in {path.name}, {first} and {second} stand side by side: each sample's .cls and .jpg must be adjacent "
                "(add both members of a sample before the next sample), or a streaming reader cannot pair them"
            )
        keys.append(Path(first).stem)
    return keys


def _tar_sample_order(ctx: Context) -> str:
    shards = _shards_of(ctx)
    per_shard = [_sample_sequence(path) for path in shards]
    for path, keys in zip(shards, per_shard):
        if len(keys) > 2 and keys == sorted(keys):
            raise PartFailed(
                f"the samples in {path.name} are sorted by key: write them in the shuffled order instead. Sorting keeps "
                "a sample's files together, but wherever keys encode the class (ImageNet's n01440764_10026) it groups "
                "the classes again, undoing the shuffle"
            )
    count = len(ctx.fixtures["samples"])
    in_one = [key for path in _shards_of(ctx, tag="one-shard", maxcount=count) for key in _sample_sequence(path)]
    in_many = [key for keys in per_shard for key in keys]
    if in_many != in_one:
        raise PartFailed(
            f"with seed=0 the samples come in one order with maxcount={count} (one shard) and in another across the "
            f"maxcount={ctx.fixtures['maxcount']} shards: shuffle once, then write the samples in that order, cut into "
            "consecutive runs of maxcount; do not reorder them within a shard"
        )
    return "each sample's .cls and .jpg adjacent; samples in the shuffled order, cut into consecutive shards"


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


def _write_seeded(ctx: Context) -> str:
    first = _shard_keys(_shards_of(ctx, seed=0))
    again = _shard_keys(_shards_of(ctx, seed=0, tag="again"))
    other = _shard_keys(_shards_of(ctx, seed=1, tag="other-seed"))
    if ctx.memo.get("reordered input"):
        raise PartFailed(
            "write_shards reordered the list it was given (the caller's list is shuffled afterwards): shuffle a copy, "
            "order = list(samples); random.Random(seed).shuffle(order), and leave the caller's list alone"
        )
    if first != again:
        raise PartFailed("writing twice with seed=0 put samples into different shards: seed the shuffle (random.Random(seed))")
    if first == other:
        raise PartFailed("seed=0 and seed=1 gave the same shards: the seed must decide the shuffle")
    return "the same seed gives the same shards, another seed other shards; the caller's list is left as it was"


register(
    "tar_write",
    "04_tar_shards",
    "write WebDataset-style tar shards: shuffled first, at most maxcount samples each",
    "write_shards(dst_dir, samples, maxcount=1000, seed=0) -> list of paths: shuffles a copy of samples (manifest rows) "
    "with seed, cuts it into dst_dir/shard-000000.tar, ... of at most maxcount samples, and writes each shard's samples "
    "in that shuffled order, each as <key>.cls (label as text) and <key>.jpg (original bytes), adjacent",
    _tar_write_fixtures,
    [
        ("shards", "shards named shard-000000.tar, ... in dst_dir, at most maxcount samples each",
         "start a new shard every maxcount samples; name it f'shard-{index:06d}.tar'", _tar_files),
        ("samples", "every sample exactly once, .jpg byte-identical to the original, .cls the label as text",
         "add two members per sample: f'{key}.cls' holding str(label).encode() and f'{key}.jpg' holding the file's bytes", _tar_samples),
        ("sample_order", "each sample's .cls and .jpg adjacent; samples in the shuffled order (never re-sorted)",
         "for each sample of the shard, in the shuffled order, add its .cls and then its .jpg; do not sort the shard", _tar_sample_order),
        ("shuffled", "samples given sorted by class are mixed in every shard (shuffle before cutting)",
         "shuffle a copy of the sample list with random.Random(seed).shuffle before cutting it into shards", _tar_shuffled),
        ("seeded", "the seed decides the shuffle (same seed, same shards) and the caller's list is left alone",
         "use a private random.Random(seed) (or numpy default_rng(seed)) on a copy: order = list(samples)", _write_seeded),
    ],
)


# -------------------------------------------------------------------- 4b. tar shard reader


def _tar_read_fixtures() -> dict:
    samples = subset(240, seed=6)
    shards = fixture_shards("tar-240-30", samples, maxcount=30)
    return {"samples": samples, "shards": shards, "pixels": reference_pixels([s.key for s in samples])}


class _ForwardOnly(io.RawIOBase):
    """A file that can only be read front to back, as an HTTP response or an S3 object's body."""

    def __init__(self, path: str):
        self._file = open(path, "rb", buffering=0)  # noqa: SIM115 - closed in close()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readinto(self, buffer) -> int:
        return self._file.readinto(buffer)

    def close(self) -> None:
        self._file.close()
        super().close()


def open_forward_only(name: str):
    """The ``opener`` the ``streamed`` part passes: a buffered stream over the shard that cannot seek.

    Like the body of an HTTP or S3 response, it gives the shard's bytes in order, once;
    ``seek`` raises :class:`io.UnsupportedOperation`.
    """
    return io.BufferedReader(_ForwardOnly(name))


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


def _shuffled_epoch(ctx: Context, seed: int, epoch: int, workers: int, shuffle_buffer: int = 40) -> list[str]:
    """The keys of one shuffled epoch read by a new dataset (and, with workers, new worker processes)."""
    dataset = _tar_dataset(ctx, shuffle_buffer=shuffle_buffer, seed=seed, transform=sha256_transform)
    return _tar_epoch(ctx, dataset, workers=workers, epoch=epoch)


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


def _tar_shard_order(ctx: Context) -> str:
    """The order in which the shards are read, per epoch, told from where the samples come from.

    With a buffer much smaller than a shard, every shard's first sample comes out while
    that shard is being read, so the order of first appearances is the reading order.
    """
    shard_of = shard_of_key(ctx.fixtures["shards"])
    orders = []
    for epoch in range(3):
        keys = _shuffled_epoch(ctx, seed=0, epoch=epoch, workers=0, shuffle_buffer=5)
        orders.append(list(dict.fromkeys(shard_of[key] for key in keys)))
    listed = list(range(len(ctx.fixtures["shards"])))
    shown = "; ".join(f"epoch {e}: {order}" for e, order in enumerate(orders))
    if all(order == listed for order in orders):
        raise PartFailed(
            f"the shards were read in the order listed in every epoch ({shown}): shuffle the list of shards with a "
            "random.Random seeded with seed and epoch before splitting it between workers; a shuffle buffer alone "
            "only mixes neighbouring samples"
        )
    if orders[0] == orders[1] == orders[2]:
        raise PartFailed(f"the shards were read in the same order in epochs 0, 1 and 2 ({orders[0]}): seed the shard shuffle with the epoch too")
    return f"the shard order changes from epoch to epoch ({shown})"


def _tar_reproducible(ctx: Context) -> str:
    orders = [_shuffled_epoch(ctx, seed=3, epoch=1, workers=2) for _ in range(2)]
    if orders[0] != orders[1]:
        raise PartFailed(
            "two datasets with seed=3 at epoch 1, each read by 2 new worker processes, gave different orders: derive "
            "every random choice from seed, epoch and worker id (not from the process id, the time or the global random state)"
        )
    return "the same seed and epoch give the same order, in new worker processes too"


def _read_seeded(ctx: Context) -> str:
    orders = {seed: _shuffled_epoch(ctx, seed=seed, epoch=0, workers=0) for seed in (3, 4)}
    if orders[3] == orders[4]:
        raise PartFailed("seed=3 and seed=4 gave the same order: the seed must decide the shuffles (shards and buffer)")
    return "another seed gives another order"


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


def _truncated_copies(ctx: Context) -> dict[str, tuple[Path, int]]:
    """Copies of the first fixture shard cut short: at a header, and inside a member's data.

    Returns ``{how: (path, whole samples before the cut)}``.
    """
    source = ctx.fixtures["shards"][0]
    members = _tar_members(source)
    data = source.read_bytes()
    at_header = members[20]  # the first file of the 11th sample: 10 whole samples before it
    inside = members[25]  # a member of the 13th sample, cut halfway through its contents
    cuts = {
        "at a member's header": (at_header.offset, 10),
        "inside a member's data": (inside.offset_data + inside.size // 2, 12),
    }
    folder = ctx.scratch("truncated")
    out = {}
    for index, (how, (size, whole)) in enumerate(cuts.items()):
        path = folder / f"cut-{index}-{source.name}"
        path.write_bytes(data[:size])
        out[how] = (path, whole)
    return out


def _tar_truncated(ctx: Context) -> str:
    for how, (path, whole) in _truncated_copies(ctx).items():
        dataset = _tar_dataset(ctx, shards=[path], transform=sha256_transform)
        delivered, error = _read_until_error(dataset)
        if error is None:
            raise PartFailed(
                f"{path.name}, cut short {how} after {whole} whole samples, gave {delivered} samples and no error: the "
                "rest of the shard was lost silently. tarfile's stream mode takes a cut-off file for the end of the "
                "archive; a whole archive ends with two blocks of 512 zero bytes after its last member: check that they "
                "are there, and raise an error naming the shard when they are not"
            )
        if path.name not in str(error):
            raise PartFailed(
                f"a shard cut short {how} raised an error that does not name the shard ({path.name}): "
                f"{describe(error)}. Catch tarfile's error and raise one that says which shard is damaged"
            )
    return "a shard cut short, at a header or inside a member, raises an error that names it"


#: The epochs the ``persistent_workers`` part sets, in this order: not 0, 1, 2, so that a
#: reader that counts its own passes instead of reading the epoch cannot pass for one that reads it.
PERSISTENT_EPOCHS = (0, 3, 1)


def _fresh_worker_orders(ctx: Context) -> dict[int, list[str]]:
    """Per epoch of :data:`PERSISTENT_EPOCHS`: the keys in the order 2 fresh fork workers deliver them."""
    if "fresh orders" not in ctx.memo:
        ctx.memo["fresh orders"] = {e: _shuffled_epoch(ctx, seed=0, epoch=e, workers=2) for e in PERSISTENT_EPOCHS}
    return ctx.memo["fresh orders"]


def _tar_persistent(ctx: Context) -> str:
    fresh = _fresh_worker_orders(ctx)
    samples = ctx.fixtures["samples"]
    dataset = _tar_dataset(ctx, shuffle_buffer=40, seed=0, transform=sha256_transform)
    loader = make_loader(ctx, dataset, workers=2, method="fork", persistent_workers=True)
    kept = {}
    try:
        for epoch in PERSISTENT_EPOCHS:
            attempt(dataset.set_epoch, f"{ctx.name}.set_epoch", epoch)
            records = collect_epoch(loader, len(samples), "sha256")
            audit_records(records, samples, sha_reference(samples), workers=2)
            kept[epoch] = [key for key, _, _ in records]
    finally:
        stop_workers(getattr(loader, "_iterator", None))
    first = PERSISTENT_EPOCHS[0]
    stuck = [e for e in PERSISTENT_EPOCHS[1:] if kept[e] == kept[first] and fresh[e] != fresh[first]]
    if stuck:
        raise PartFailed(
            f"with persistent_workers=True, set_epoch({stuck[0]}) changed nothing: epoch {stuck[0]} came in epoch "
            f"{first}'s order. Persistent workers keep the copy of the dataset they made when they started, so an "
            "attribute that set_epoch changes in the training process never reaches them (chapter 5, "
            "'set_epoch and persistent workers'). Keep the epoch in memory that every process shares: "
            "torch.zeros(1, dtype=torch.int64).share_memory_(), written by set_epoch, read in __iter__"
        )
    differ = [e for e in PERSISTENT_EPOCHS if kept[e] != fresh[e]]
    if differ:
        raise PartFailed(
            f"epoch {differ[0]} came in one order from 2 fresh workers and in another from 2 persistent workers "
            f"(epochs set in the order {list(PERSISTENT_EPOCHS)}): the order must follow from seed and epoch "
            "alone, however the workers were started and however many epochs they have already read"
        )
    return (f"2 persistent workers over epochs {', '.join(map(str, PERSISTENT_EPOCHS))}: each epoch complete, "
            "in the same order as with fresh workers")


def _seeks(exc: BaseException) -> bool:
    """Whether a failure came from seeking a stream that cannot seek."""
    while exc is not None:
        if isinstance(exc, io.UnsupportedOperation) or "seek" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


_SEEKS = (
    "your reader seeks the shard's stream ({error}). Chapters 6 and 10 read shards over HTTP and from S3, whose "
    "responses can only be read front to back, once. Check the end of the archive from the stream itself: after "
    "the last member, the next two 512-byte blocks you read must be zeros (read the headers yourself, with "
    "tarfile.TarInfo.frombuf, or count the bytes tarfile consumed)"
)


def _tar_streamed(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    dataset = _tar_dataset(ctx, transform=sha256_transform, opener=open_forward_only)
    try:
        records = collect_epoch(make_loader(ctx, dataset), len(samples), "sha256")
    except PartFailed as exc:
        if _seeks(exc):
            raise PartFailed(_SEEKS.format(error=describe(exc.__cause__ or exc))) from None
        raise
    audit_records(records, samples, sha_reference(samples))
    for how, (path, whole) in _truncated_copies(ctx).items():
        dataset = _tar_dataset(ctx, shards=[path], transform=sha256_transform, opener=open_forward_only)
        delivered, error = _read_until_error(dataset)
        if error is not None and _seeks(error):
            raise PartFailed(_SEEKS.format(error=describe(error)))
        if error is None:
            raise PartFailed(
                f"{path.name}, cut short {how} after {whole} whole samples and read through a stream that cannot "
                f"seek, gave {delivered} samples and no error: check for the two zero blocks from the stream itself"
            )
        if path.name not in str(error):
            raise PartFailed(f"a shard cut short {how}, read as a stream, raised an error that does not name it: {describe(error)}")
    return (f"{len(samples)} samples read through streams that cannot seek, each once; shards cut short raise "
            "an error naming them there too")


def _read_until_error(dataset, limit: int = 100) -> tuple[int, BaseException | None]:
    """Iterate ``dataset`` in this process: ``(samples delivered, the exception raised or None)``."""
    delivered = 0
    try:
        for _ in dataset:
            delivered += 1
            if delivered > limit:
                break
    except Exception as exc:  # noqa: BLE001 - the caller judges the error
        return delivered, exc
    return delivered, None


register(
    "tar_dataset",
    "04_tar_shards",
    "an IterableDataset over tar shards: worker split, per-epoch shard shuffle that reaches persistent workers, bounded buffer, read as a stream",
    "TarShardDataset(shards, shuffle_buffer=0, seed=0, transform=None, return_key=False, opener=None) with "
    "set_epoch(epoch): worker w of W reads its share shards[w::W]; with shuffle_buffer > 0 the shard order is "
    "shuffled per epoch (the same in every worker) and samples pass through a buffer of at most shuffle_buffer; "
    "yields (transform(jpg bytes), int(cls)[, key]); opener(name) gives each shard's stream, read front to back "
    "without seeking; a truncated shard raises an error naming it; set_epoch reaches persistent workers",
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
        ("shard_order", "shuffle_buffer > 0: the order in which shards are read changes from epoch to epoch",
         "shuffle a copy of the shard list with random.Random(seed and epoch) before the worker split", _tar_shard_order),
        ("reproducible", "the same seed and epoch give the same order, also in new worker processes",
         "take every random choice from a random.Random seeded with seed and epoch (and the worker id for the buffer)", _tar_reproducible),
        ("seeded", "another seed gives another order",
         "mix seed into every generator's seed, e.g. random.Random(seed * 100_003 + epoch)", _read_seeded),
        ("bounded_buffer", "the shuffle buffer holds at most shuffle_buffer samples",
         "fill a list up to shuffle_buffer samples; then, per new sample, yield a random one from the list and put the new one in its place", _tar_bounded),
        ("truncated_shard", "a shard cut short raises an error that names the shard, instead of losing samples silently",
         "after the members, a whole tar ends with two zero blocks of 512 bytes: check for them at tar.offset, and turn "
         "tarfile's errors into one that names the path", _tar_truncated),
        ("streamed", "shards read through a stream that cannot seek (as over HTTP or from S3): every sample once, "
         "and a shard cut short still raises an error naming it",
         "open each shard with opener(name) and never seek it: check the two zero blocks that end a whole archive "
         "as you read them", _tar_streamed),
        ("persistent_workers", "2 persistent workers: set_epoch reaches them, each epoch in the order fresh workers give",
         "persistent workers keep their first copy of the dataset: keep the epoch in shared memory "
         "(torch.zeros(1, dtype=torch.int64).share_memory_()), as chapter 5's SharedEpoch does", _tar_persistent),
    ],
)

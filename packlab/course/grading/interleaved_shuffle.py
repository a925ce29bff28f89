"""Checks of exercise 12 (``12_interleaved_shuffle``): a reader that interleaves open shards through a bounded buffer.

The candidate is an ``IterableDataset`` class ``InterleavedShardReader(shards,
open_shards=16, shuffle_buffer=64, seed=0, transform=None, return_key=False,
opener=None)`` with ``set_epoch(epoch)``. It reads the shards of
:func:`~packlab.course.grading.fixtures.class_sorted_shards`: 1,000 samples written
**sorted by class**, 25 to a shard, so that any reader that does not mix shards shows it.

Every part reads through the candidate and audits what it delivered (SHA-256 of the JPEG
bytes against the manifest). Two parts watch it through the ``opener`` the check passes:
each shard it opens is a stream that counts its bytes, so the check knows at every moment
how many shards are open and how many whole samples have been read from each; a sample
read but not yet handed over is a sample the reader holds. Two parts measure the result
of the order: how well one epoch mixes the classes against a random permutation
(:func:`packlab.loaders.tar.label_mixing`), and what a model trained in that order learns
(:mod:`packlab.accuracy`), against the same model trained in a global shuffle's order.
"""

from __future__ import annotations

import bisect
import io
import tarfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from packlab.course.grading.core import Context, PartFailed, attempt, describe, register
from packlab.course.grading.fixtures import (
    audit_records,
    class_sorted_shards,
    collect_epoch,
    make_loader,
    sha256_transform,
    sha_reference,
    stop_workers,
)

#: What the watched parts ask for: few enough that a reader that ignores the limits shows it.
WATCHED = {"open_shards": 4, "shuffle_buffer": 16}
#: The epochs the persistent part sets, in this order (not 0, 1, 2: a reader that counts its own passes fails).
PERSISTENT_EPOCHS = (0, 3, 1)
#: How far above a random permutation's the label mixing of an epoch may be (0: as mixed as a permutation).
MIXING_MARGIN = 0.20
#: How many accuracy points below the global shuffle's mean the candidate's mean may fall.
ACCURACY_MARGIN = 12.0
ACCURACY_SEEDS = (0, 1, 2)
ACCURACY_EPOCHS = 2
ACCURACY_BATCH = 32  # images per training step: 31 steps an epoch
MIXING_WINDOW = 50


def _fixtures() -> dict:
    shards, train, holdout = class_sorted_shards()
    return {"shards": [str(p) for p in shards], "samples": train, "holdout": holdout}


def _reader(ctx: Context, cls=None, **options):
    options = {"seed": 0, "transform": sha256_transform, "return_key": True, **options}
    return attempt(cls or ctx.candidate, ctx.name, ctx.fixtures["shards"], **options)


def _epoch(ctx: Context, dataset, workers: int = 0, epoch: int | None = None, loader=None) -> list[str]:
    """One audited epoch of ``dataset``: the keys in the order delivered."""
    if epoch is not None:
        attempt(dataset.set_epoch, f"{ctx.name}.set_epoch", epoch)
    samples = ctx.fixtures["samples"]
    if loader is None:
        loader = make_loader(ctx, dataset, workers=workers, method="fork", batch_size=25)
    records = collect_epoch(loader, len(samples), "sha256")
    audit_records(records, samples, sha_reference(samples), workers=workers)
    return [key for key, _, _ in records]


# ------------------------------------------------------------ watching the reader's reads


class _Watcher:
    """Counts, per shard, the streams open now and the bytes read; knows where each sample's bytes end."""

    def __init__(self, shards: list[str]):
        self.sample_ends: dict[str, list[int]] = {}
        for shard in shards:
            ends: dict[str, int] = {}
            with tarfile.open(shard) as tar:
                for member in tar.getmembers():
                    key = Path(member.name).stem
                    ends[key] = max(ends.get(key, 0), member.offset_data + member.size)
            self.sample_ends[shard] = sorted(ends.values())
        self.bytes_read: Counter = Counter()
        self.opened: Counter = Counter()
        self.open_now = 0
        self.most_open = 0
        self.unknown: list[str] = []

    def open(self, name: str):
        """The ``opener`` the check passes to the reader."""
        name = str(name)
        if name not in self.sample_ends:
            self.unknown.append(name)
        self.opened[name] += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        return _WatchedStream(self, name)

    def samples_read(self) -> int:
        """Whole samples read so far, over every shard (a sample counts once all its bytes were read)."""
        return sum(bisect.bisect_right(self.sample_ends[name], read) for name, read in self.bytes_read.items()
                   if name in self.sample_ends)


class _WatchedStream(io.RawIOBase):
    """A shard's bytes, read front to back, counted; closing it counts it as no longer open."""

    def __init__(self, watcher: _Watcher, name: str):
        self._watcher, self._name = watcher, name
        self._file = open(name, "rb", buffering=0)  # noqa: SIM115 - closed in close()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        count = self._file.readinto(buffer)
        self._watcher.bytes_read[self._name] += count or 0
        return count

    def close(self) -> None:
        if not self.closed:
            self._file.close()
            self._watcher.open_now -= 1
        super().close()


def _watched_epoch(ctx: Context, **options) -> tuple[_Watcher, int]:
    """Read one epoch in this process through a watching opener; ``(watcher, most samples held at once)``."""
    watcher = _Watcher(ctx.fixtures["shards"])
    dataset = _reader(ctx, opener=watcher.open, **options)
    delivered, held = 0, 0
    limit = 3 * len(ctx.fixtures["samples"])
    try:
        for _ in dataset:
            delivered += 1
            held = max(held, watcher.samples_read() - delivered)
            if delivered > limit:
                raise PartFailed(f"the epoch delivered more than {limit} samples and did not end")
    except PartFailed:
        raise
    except Exception as exc:
        raise PartFailed(f"reading an epoch through the check's opener raised {describe(exc)}") from exc
    if watcher.unknown:
        raise PartFailed(f"opener was called with {watcher.unknown[0]!r}, which is not one of the shards given")
    if delivered != len(ctx.fixtures["samples"]):
        raise PartFailed(f"the epoch delivered {delivered} samples; the shards hold {len(ctx.fixtures['samples'])}")
    return watcher, held


# -------------------------------------------------------------------------------- parts


def _fresh(ctx: Context, epoch: int, seed: int = 0) -> list[str]:
    """One epoch read by a new reader and 2 new fork workers (remembered: two parts compare with it)."""
    if ("fresh", seed, epoch) not in ctx.memo:
        ctx.memo[("fresh", seed, epoch)] = _epoch(ctx, _reader(ctx, seed=seed), workers=2, epoch=epoch)
    return ctx.memo[("fresh", seed, epoch)]


def _one_process(ctx: Context) -> str:
    keys = _epoch(ctx, _reader(ctx))
    return f"{len(keys)} samples, each exactly once, labels and bytes match the manifest"


def _two_workers(ctx: Context) -> str:
    keys = _epoch(ctx, _reader(ctx), workers=2)
    return f"{len(keys)} samples over {len(ctx.fixtures['shards'])} shards and 2 fork workers, each exactly once"


def _open_shards(ctx: Context) -> str:
    allowed = WATCHED["open_shards"]
    watcher, _ = _watched_epoch(ctx, **WATCHED)
    shards = ctx.fixtures["shards"]
    if not watcher.opened:
        raise PartFailed("the reader never called opener(name): open every shard with the opener it is given "
                         "(iter_shard_samples(name, self.opener))")
    never = [Path(s).name for s in shards if not watcher.opened[s]]
    again = [Path(s).name for s, n in watcher.opened.items() if n > 1]
    if never or again:
        raise PartFailed(f"in one epoch {len(never)} shards were never opened through the opener (e.g. "
                         f"{(never or ['-'])[0]}) and {len(again)} more than once (e.g. {(again or ['-'])[0]}): open "
                         "each shard of the share once, with opener(name)")
    if watcher.most_open > allowed:
        raise PartFailed(f"with open_shards={allowed}, {watcher.most_open} shards were open at once: open the next "
                         "shard only when one of the open ones has run out (and is closed)")
    if watcher.most_open < allowed:
        raise PartFailed(f"with open_shards={allowed}, at most {watcher.most_open} shard(s) were open at once: keep "
                         f"{allowed} open while the share has that many left, and draw each sample from one of them")
    if watcher.open_now:
        raise PartFailed(f"{watcher.open_now} shard(s) were still open after the epoch: close each shard when its "
                         "samples run out (iter_shard_samples closes it when it is exhausted)")
    return f"each of {len(shards)} shards opened once through the opener, never more than {allowed} open at once, all closed"


def _place_in_shard(ctx: Context) -> dict[str, tuple[str, int]]:
    """Each key's shard and its position in it: the fixture writes the sorted samples 25 to a shard, in order."""
    per_shard = len(ctx.fixtures["samples"]) // len(ctx.fixtures["shards"])
    return {s.key: (ctx.fixtures["shards"][i // per_shard], i % per_shard) for i, s in enumerate(ctx.fixtures["samples"])}


def _bounded(ctx: Context) -> str:
    buffer, opened = WATCHED["shuffle_buffer"], WATCHED["open_shards"]
    _, held = _watched_epoch(ctx, **WATCHED)
    bound = buffer + opened + 1
    if held > bound:
        raise PartFailed(f"with shuffle_buffer={buffer} and open_shards={opened} the reader held up to {held} samples "
                         f"it had read and not yet handed over; at most {bound} (the buffer, one per open shard, the "
                         "one on its way out) may be held: yield from the buffer as each new sample arrives")
    # A shard is read front to back, so without a buffer its samples come out in the order they were written.
    place = _place_in_shard(ctx)
    last: dict[str, int] = {}
    swapped = 0
    for key in _epoch(ctx, _reader(ctx), epoch=0):
        shard, position = place[key]
        swapped += position < last.get(shard, -1)
        last[shard] = max(position, last.get(shard, -1))
    if not swapped:
        raise PartFailed("with the default shuffle_buffer every shard's samples came out in the order they were "
                         "written: the interleaved samples never went through a shuffle buffer. Pass them through "
                         "shuffle_buffer(stream, self.shuffle_buffer, rng)")
    return (f"at most {held} samples held at once (the bound: {bound}); {swapped} samples overtook one written "
            "before them in their shard: the buffer shuffles")


def _epochs(ctx: Context) -> str:
    orders = [_fresh(ctx, epoch) for epoch in (0, 1)]
    again = _epoch(ctx, _reader(ctx), workers=2, epoch=1)
    other_seed = _fresh(ctx, 1, seed=5)
    if orders[0] == orders[1]:
        raise PartFailed("epochs 0 and 1 came in the same order: the shard order and every random choice must follow "
                         "from (seed, epoch), the epoch read from self._epoch in __iter__")
    if again != orders[1]:
        raise PartFailed("two readers with seed=0 at epoch 1, each read by 2 new fork workers, gave different orders: "
                         "derive every random choice from seed, epoch and worker id, not from the time or the process")
    if other_seed == orders[1]:
        raise PartFailed("seed=0 and seed=5 gave the same order at epoch 1: the seed must decide the shuffles")
    # The choices themselves, apart from which shards they fell on: each sample as (the rank of its shard in the
    # epoch's shard order, its position in the shard). Equal in two epochs: only the shard order changed.
    from packlab.loaders.tar import epoch_shard_order

    place = _place_in_shard(ctx)
    choices = []
    for epoch in (0, 1):
        rank = {shard: i for i, shard in enumerate(epoch_shard_order(ctx.fixtures["shards"], 0, epoch))}
        choices.append([(rank[place[k][0]], place[k][1]) for k in _epoch(ctx, _reader(ctx), epoch=epoch)])
    if choices[0] == choices[1]:
        raise PartFailed("epochs 0 and 1 made the same random choices (which open shard, which sample from the "
                         "buffer): only the shard order changed, so the same positions of the same shards meet in "
                         "every epoch's batches. Seed the generator from the epoch as well as the seed and worker")
    return "each epoch complete, in an order that changes with the epoch and the seed and repeats with both"


def _persistent(ctx: Context) -> str:
    fresh = {e: _fresh(ctx, e) for e in PERSISTENT_EPOCHS}
    dataset = _reader(ctx)
    loader = make_loader(ctx, dataset, workers=2, method="fork", batch_size=25, persistent_workers=True)
    kept = {}
    try:
        for epoch in PERSISTENT_EPOCHS:
            kept[epoch] = _epoch(ctx, dataset, epoch=epoch, loader=loader, workers=2)
    finally:
        stop_workers(getattr(loader, "_iterator", None))
    first = PERSISTENT_EPOCHS[0]
    stuck = [e for e in PERSISTENT_EPOCHS[1:] if kept[e] == kept[first] and fresh[e] != fresh[first]]
    if stuck:
        raise PartFailed(f"with persistent_workers=True, set_epoch({stuck[0]}) changed nothing: persistent workers keep "
                         "their first copy of the dataset, so an epoch kept in a plain attribute never reaches them. "
                         "Keep it in self._epoch (a SharedEpoch): set it in set_epoch, read it with start_pass()")
    differ = [e for e in PERSISTENT_EPOCHS if kept[e] != fresh[e]]
    if differ:
        raise PartFailed(f"epoch {differ[0]} came in one order from fresh workers and in another from persistent ones: "
                         "the order must follow from seed and epoch alone")
    return f"2 persistent workers over epochs {', '.join(map(str, PERSISTENT_EPOCHS))}: the orders fresh workers give"


def _labels_of(ctx: Context, keys: list[str]) -> np.ndarray:
    label = {s.key: s.label for s in ctx.fixtures["samples"]}
    return np.array([label[k] for k in keys])


def _mixing(ctx: Context) -> str:
    from packlab.loaders.tar import label_mixing

    labels = _labels_of(ctx, _epoch(ctx, _reader(ctx), epoch=0))
    ours = label_mixing(labels, MIXING_WINDOW)
    permuted = label_mixing(np.random.default_rng(0).permutation(labels), MIXING_WINDOW)
    if ours > permuted + MIXING_MARGIN:
        raise PartFailed(f"on shards sorted by class, one epoch's label mixing was {ours:.2f} (0: every window of "
                         f"{MIXING_WINDOW} has the epoch's class mix; a random permutation: {permuted:.2f}; allowed: up "
                         f"to {permuted + MIXING_MARGIN:.2f}). Neighbouring samples still come from the same few "
                         "shards: keep open_shards shards open and draw each sample from one chosen at random")
    return f"label mixing {ours:.2f} on class-sorted shards (a random permutation: {permuted:.2f})"


def _order_batches(seed: int, keys_by_epoch: dict, index: dict, epochs: int) -> list:
    """A training schedule from recorded epochs (``keys_by_epoch[(seed, epoch)]``), cut into batches."""
    from packlab.accuracy.training import batches_of

    return [b for e in range(epochs) for b in batches_of([index[k] for k in keys_by_epoch[(seed, e)]], ACCURACY_BATCH)]


def _global_batches(seed: int, size: int, epochs: int) -> list:
    from packlab.accuracy.training import batches_of, global_order

    return [b for e in range(epochs) for b in batches_of(global_order(seed, e, size), ACCURACY_BATCH)]


def _accuracy(ctx: Context) -> str:
    from packlab.accuracy import pixels, training

    recorded = {}  # the candidate's orders first: a reader that fails, fails before any image is decoded
    for seed in ACCURACY_SEEDS:
        dataset = _reader(ctx, seed=seed)
        for epoch in range(ACCURACY_EPOCHS):
            recorded[(seed, epoch)] = _epoch(ctx, dataset, workers=2, epoch=epoch)
    train = pixels.small_pixels(samples=ctx.fixtures["samples"], progress=False)
    holdout = pixels.small_pixels(samples=ctx.fixtures["holdout"], progress=False)
    index = {key: i for i, key in enumerate(train.keys)}
    experiments = {
        "yours": training.Experiment(_order_batches, {"keys_by_epoch": recorded, "index": index, "epochs": ACCURACY_EPOCHS}),
        "global": training.Experiment(_global_batches, {"size": len(train), "epochs": ACCURACY_EPOCHS}),
    }
    runs = training.accuracy_runs(experiments, train, holdout, seeds=ACCURACY_SEEDS, progress=False)
    spreads = training.accuracy_spreads(runs)
    ours, best = float(np.mean(spreads["yours"].values)), float(np.mean(spreads["global"].values))
    if ours < best - ACCURACY_MARGIN:
        raise PartFailed(f"a smoke test: trained for {ACCURACY_EPOCHS} epochs in your reader's order, a small model "
                         f"{ours:.0f} % on held-out images (mean of {len(ACCURACY_SEEDS)} seeds: {spreads['yours']}); "
                         f"in a global shuffle's order {best:.0f} % ({spreads['global']}); allowed: {ACCURACY_MARGIN:.0f} "
                         "points below. The model sees one class for too long: mix more shards")
    return (f"a smoke test, passed: held-out accuracy {ours:.0f} % in your order against {best:.0f} % in a global "
            f"shuffle's (means of {len(ACCURACY_SEEDS)} unpaired seeds, {ACCURACY_EPOCHS} epochs of class-sorted "
            f"shards). It sees only a gap of about {ACCURACY_MARGIN:.0f} points; chapter 13's paired instrument "
            "is what sees one point")


register(
    "interleaved_shuffle",
    "12_interleaved_shuffle",
    "a tar reader that interleaves open shards through a bounded buffer: mixes class-sorted shards, trains like a "
    "global shuffle, within its limits",
    "InterleavedShardReader(shards, open_shards=16, shuffle_buffer=64, seed=0, transform=None, return_key=False, "
    "opener=None) with set_epoch(epoch): per epoch, the shards in epoch_shard_order(shards, seed, epoch), worker w of "
    "W reading order[w::W]; at most open_shards shards open at once (each opened once with opener(name)), each next "
    "sample drawn from a random open shard, through a shuffle buffer of shuffle_buffer samples; yields "
    "(transform(jpg bytes), label[, key]); the epoch in self._epoch (a SharedEpoch)",
    _fixtures,
    [
        ("one_process", "no workers: every sample once, labels and bytes match the manifest",
         "read each shard with iter_shard_samples(name, self.opener) and apply self.transform to sample.image_bytes",
         _one_process),
        ("two_workers", "2 fork workers: every sample exactly once",
         "get_worker_info() gives the worker's id and count: read only the share order[id::count]", _two_workers),
        ("open_shards", "at most open_shards shards open at once (and that many while enough are left), each opened "
         "once through the opener and closed when it ends",
         "keep a list of open streams; open the next waiting shard only when one runs out and is dropped", _open_shards),
        ("bounded_buffer", "never more than shuffle_buffer samples held, plus one per open shard, and the samples "
         "do go through the buffer",
         "pass the interleaved stream through shuffle_buffer(stream, self.shuffle_buffer, rng): it yields as it reads",
         _bounded),
        ("epochs", "the order and every random choice change with set_epoch and with the seed, and repeat in new "
         "workers",
         "seed one random.Random from seed, epoch and worker id; take the shard order from epoch_shard_order", _epochs),
        ("persistent_workers", "2 persistent workers: set_epoch reaches them, each epoch in the order fresh workers give",
         "set_epoch writes self._epoch.set(epoch); __iter__ reads epoch, _ = self._epoch.start_pass()", _persistent),
        ("mixing", "one epoch of class-sorted shards mixes the classes nearly as well as a random permutation",
         "draw each sample from a random one of open_shards open shards, not from one shard after another", _mixing),
        ("accuracy", "a smoke test: a model trained 2 epochs in your order (3 unpaired seeds) ends within 12 points "
         "of a global shuffle's",
         "the model must not see one class for long: more shards open at once, and a buffer after them", _accuracy),
    ],
)

"""Checks of exercise 4a (``04a_tarfile_reader``): reading tar shards with the standard library's ``tarfile``.

The first half of chapter 5's exercise, on its own: a reader that opens each shard with
``tarfile.open(path, mode="r|")``, groups the members of each sample by their key, and
splits the shards between DataLoader workers. Exercise 4b (``04_tar_shards``) then
writes the shards, parses tar by hand, notices truncated shards and shuffles.

The 240 samples in 8 shards of 30 are the fixture of exercise 4b's reader (written by
:func:`packlab.pack.write_tar_shards`, cached once for both). The parts about member
order, incomplete samples and a shard's last sample read tiny shards written here, in
the part's scratch folder, with ``tarfile``.
"""

from __future__ import annotations

import functools
import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

from packlab import data
from packlab.course.grading.core import Context, PartFailed, describe, register
from packlab.course.grading.fixtures import (
    audit_records,
    collect_epoch,
    make_loader,
    open_handle_attributes,
    open_handles,
    preflight_spawn,
    sha256_transform,
    sha_reference,
)
from packlab.course.grading.tar_shards import _tar_dataset, _tar_epoch, _tar_one_process, _tar_read_fixtures, _tar_workers

#: How each sample's members are ordered in a tiny shard: ``.cls`` first (as packlab.pack
#: writes them), ``.jpg`` first, or alternating from one sample to the next.
CLS_FIRST, JPG_FIRST, MIXED = "cls-first", "jpg-first", "mixed"
#: Each tiny shard of the ``member_order`` part: its order, and what it says about it.
ORDERS = {
    CLS_FIRST: "every sample's .cls before its .jpg",
    JPG_FIRST: "every sample's .jpg before its .cls",
    MIXED: "one sample .cls first, the next .jpg first, and so on",
}
#: Samples in each tiny shard of the ``member_order`` part.
ORDER_SAMPLES = 5


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    return info


def write_tiny_shard(path: Path, members: Sequence[tuple[str, bytes]]) -> Path:
    """Write ``members`` (``(name, contents)``, in this order) as an uncompressed tar at ``path``."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, payload in members:
            tar.addfile(_tarinfo(name, len(payload)), io.BytesIO(payload))
    return path


def sample_members(sample: data.Sample, jpg_first: bool = False, drop: str | None = None) -> list[tuple[str, bytes]]:
    """One sample's members, ``<key>.cls`` then ``<key>.jpg`` (or the other way round); ``drop`` leaves one out."""
    members = [(f"{sample.key}.cls", str(sample.label).encode()),
               (f"{sample.key}.jpg", data.image_path(sample.key).read_bytes())]
    if jpg_first:
        members.reverse()
    return [(name, payload) for name, payload in members if drop is None or not name.endswith(f".{drop}")]


def _read_epoch(ctx: Context, path: Path) -> list[tuple[str, int, str]]:
    """Read one tiny shard with no workers: ``(key, label, sha256)`` records, not audited yet."""
    dataset = _tar_dataset(ctx, shards=[path], transform=sha256_transform)
    return collect_epoch(make_loader(ctx, dataset), 64, "sha256")


# ----------------------------------------------------------------------------- the parts


def _no_open_shards(ctx: Context, make_dataset):
    """Create the dataset with ``make_dataset()``; fail when that left files open on the shards.

    Pickling alone does not catch every handle opened in ``__init__``: ``tarfile``'s
    stream mode keeps a bare descriptor number, which pickles, and in a spawn worker
    means nothing (or another file), so the worker's reads fail or hang. The descriptors
    this process holds on the shards are counted before and after instead.
    """
    shards = ctx.fixtures["shards"]
    before = {path: open_handles(path) for path in shards}
    dataset = make_dataset()
    held = [path.name for path in shards if open_handles(path) > before[path]]
    try:
        attributes = open_handle_attributes(dataset)
    except TypeError:  # no __dict__ (__slots__): the descriptors still tell
        attributes = []
    if held or attributes:
        where = f" (in {', '.join(repr(a) for a in attributes)})" if attributes else ""
        raise PartFailed(
            f"once created, before anything was read, the dataset holds open files{where}"
            + (f" on {len(held)} of the {len(shards)} shards ({', '.join(held[:3])}{' ...' if len(held) > 3 else ''})" if held else "")
            + ". A spawn worker receives a pickled copy of the dataset: an open file either cannot be pickled, or, "
            "as tarfile's stream mode keeps only a descriptor number, arrives as a number that means nothing in the "
            "new process. Keep the paths only, and open each shard inside __iter__, in a with block"
        )
    return dataset


def _spawn_workers(ctx: Context) -> str:
    cls = ctx.importable()
    dataset = _no_open_shards(ctx, lambda: _tar_dataset(ctx, cls, transform=sha256_transform))
    preflight_spawn(dataset)
    keys = _tar_epoch(ctx, dataset, workers=2, method="spawn")
    return f"{len(keys)} samples over {len(ctx.fixtures['shards'])} shards and 2 workers, each exactly once"


def _member_order(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    folder = ctx.scratch("member-order")
    for index, (order, how) in enumerate(ORDERS.items()):
        chosen = samples[index * ORDER_SAMPLES : (index + 1) * ORDER_SAMPLES]
        members = [m for i, s in enumerate(chosen)
                   for m in sample_members(s, jpg_first=order == JPG_FIRST or (order == MIXED and i % 2 == 1))]
        path = write_tiny_shard(folder / f"{order}.tar", members)
        try:
            records = _read_epoch(ctx, path)
            audit_records(records, chosen, sha_reference(chosen))
        except PartFailed as exc:
            raise PartFailed(
                f"{path.name} ({how}; {len(chosen)} samples): {exc}\nThe convention keeps a sample's members "
                "adjacent, in no fixed order: collect them by key, whichever comes first"
            ) from None
    return f"{len(ORDERS)} shards, .cls before .jpg, .jpg before .cls and mixed: every sample once, each with its own label and bytes"


def _incomplete_sample(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    folder = ctx.scratch("incomplete")
    a, b, c, d, e = samples[15:20]
    cases = [
        # (shard, the incomplete sample, the member it lacks, where it stands)
        (write_tiny_shard(folder / "missing-cls.tar", sample_members(a) + sample_members(b, drop="cls") + sample_members(c)),
         b.key, "cls", "in the middle of the shard"),
        (write_tiny_shard(folder / "missing-jpg.tar", sample_members(d) + sample_members(e, drop="jpg")),
         e.key, "jpg", "at the end of the shard"),
    ]
    for path, key, lacks, where in cases:
        dataset = _tar_dataset(ctx, shards=[path], transform=sha256_transform)
        delivered: list[str] = []
        error = None
        try:
            for item in dataset:
                delivered.append(str(item[2]) if isinstance(item, (tuple, list)) and len(item) == 3 else "?")
                if len(delivered) > 20:
                    break
        except NotImplementedError:
            raise
        except Exception as exc:  # noqa: BLE001 - judged below
            error = exc
        if key in delivered:
            raise PartFailed(
                f"{path.name}: sample {key} has no .{lacks} ({where}), yet your reader delivered it: a sample is "
                "its .cls and its .jpg together; one without both must not pass for a sample"
            )
        if error is None:
            raise PartFailed(
                f"{path.name}: sample {key} has no .{lacks} ({where}); your reader delivered {len(delivered)} samples "
                "and raised no error, so the sample was lost without a word. Raise an error that names the shard and the key"
            )
        text = str(error)
        if path.name not in text:
            raise PartFailed(
                f"{path.name}: sample {key} has no .{lacks}, and your reader raised {describe(error)}, which does not "
                f"name the shard: whoever reads it must know which file to rewrite. Put the shard's path in the message"
            )
        if key not in text:
            raise PartFailed(
                f"{path.name}: sample {key} has no .{lacks}, and your reader raised {describe(error)}, which names the "
                "shard but not the sample: put the key in the message too"
            )
    return "a sample without its .cls (mid-shard) or its .jpg (at the end) raises an error naming the shard and the key"


def _last_sample(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    folder = ctx.scratch("last-sample")
    for count, name in ((1, "one-sample.tar"), (2, "two-samples.tar")):
        chosen = samples[20 : 20 + count]
        path = write_tiny_shard(folder / name, [m for s in chosen for m in sample_members(s)])
        records = _read_epoch(ctx, path)
        keys = [key for key, _, _ in records]
        last = chosen[-1].key
        if last not in keys:
            held = ", ".join(s.key for s in chosen)
            raise PartFailed(
                f"{path.name} holds {count} sample{'s' if count > 1 else ''} ({held}); your reader delivered "
                f"{len(keys)} {'sample' if len(keys) == 1 else 'samples'} and not the last one, {last}. A sample is "
                "complete when the next key arrives, or when the shard ends: no new key comes after the last sample, "
                "so hand it out after the loop over the members"
            )
        audit_records(records, chosen, sha_reference(chosen))
    return "a shard of one sample and one of two: each delivers its last sample"


register(
    "tarfile_reader",
    "04a_tarfile_reader",
    "an IterableDataset over tar shards read with the standard library's tarfile: worker split, "
    "members grouped by key in either order, incomplete samples reported",
    "TarfileShardDataset(shards, transform=None, return_key=False): worker w of W reads shards[w::W], each "
    "opened inside __iter__ with tarfile.open(path, mode='r|'); members grouped by the key before the first dot, "
    ".cls and .jpg in either order; yields (transform(jpg bytes), int(cls)[, key]); a sample missing its .jpg or "
    ".cls raises an error naming the shard and the key; the object holds no open file",
    _tar_read_fixtures,
    [
        ("one_process", "no workers: every sample once, labels and pixels match the manifest",
         "with tarfile.open(path, mode='r|') as tar: for member in tar: the key is member.name.partition('.')[0], "
         "the bytes tar.extractfile(member).read(); yield (transform(jpg), int(cls))", _tar_one_process),
        ("fork_3_workers", "3 fork workers (8 shards, uneven split): every sample exactly once",
         "in __iter__, get_worker_info() tells the worker id and count: read only shards[info.id::info.num_workers] "
         "(every shard when it is None)",
         functools.partial(_tar_workers, workers=3, method="fork")),
        ("spawn_2_workers", "2 spawn workers: every sample exactly once (a new dataset holds no open file)",
         "keep only paths and options in the object: open each shard inside __iter__, in a with block, and keep the "
         "class with its imports in one cell", _spawn_workers),
        ("member_order", "a sample's .cls before its .jpg, after it, or mixed within a shard: each sample read right",
         "collect a sample's members in a dict {extension: bytes} until the key changes, then take parts['jpg'] "
         "and parts['cls'], whichever came first", _member_order),
        ("incomplete_sample", "a sample missing its .cls or its .jpg raises an error naming the shard and the key "
         "(it is not skipped)",
         "before handing out a sample, check that its dict has both 'jpg' and 'cls'; if not, "
         "raise ValueError(f'{path}: sample {key} has {sorted(parts)}')", _incomplete_sample),
        ("last_sample", "the last sample of a shard is delivered (shards of one and of two samples)",
         "after the loop over the members, yield the sample still being collected, if any: no new key comes to "
         "complete it", _last_sample),
    ],
)

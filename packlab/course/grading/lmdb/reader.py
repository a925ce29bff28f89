"""The check ``lmdb_dataset`` of exercise 8: an LMDB Dataset with one environment per process.

How the check catches an environment opened in the parent
--------------------------------------------------------
An LMDB environment opened with ``lock=False`` and inherited through ``fork`` reads
correctly (chapter 9): nothing collides, so an epoch alone cannot tell. The ``fork`` part
therefore gives each worker a ``worker_init_fn`` that closes, first thing, every open
environment the worker inherited in the dataset (its attributes, the dicts and lists in
them, and the globals of the dataset's module). A dataset that opens its own environment
in the worker never notices; one that reads through the parent's gets LMDB's "closed
object" error on its first read. The ``fork_after_parent_read`` part runs without it, as
in real use: there the parent's open environment must be closed by the worker before it
opens its own, because py-lmdb refuses to open a file that is already open in the process
and a forked worker inherits that list (chapter 9).

Every part reads a copy of the fixture file in its own scratch folder (a lock file a
candidate creates must not land in the shared cache), and closes the datasets it made:
py-lmdb allows one environment per file and process, and the parts of a check share one
process.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import pickle
import random
import shutil
import subprocess
import sys
from pathlib import Path

from packlab.course.grading.core import Context, PartFailed, attempt, describe, register
from packlab.course.grading.fixtures import (
    audit_records,
    check_item,
    collect_epoch,
    make_loader,
    reference_pixels,
    sha256_transform,
    sha_reference,
    subset,
)
from packlab.course.grading.lmdb.files import (
    close_inherited_environments,
    close_quietly,
    environments_in,
    fixture_lmdb,
    open_read_only,
)


def _read_fixtures() -> dict:
    samples = subset(200, seed=9)
    few = samples[:40]
    return {
        "samples": samples,
        "lmdb": fixture_lmdb("lmdb-200", samples),
        "few": few,
        "lmdb few": fixture_lmdb("lmdb-40", few),
        "pixels": reference_pixels([s.key for s in few]),
    }


def _copy(ctx: Context, name: str) -> Path:
    """This child's own copy of a fixture file (``"lmdb"`` or ``"lmdb few"``), in a folder of its own."""
    key = ("copy", name)
    if key not in ctx.memo:
        target = ctx.scratch("lmdb-read") / ctx.fixtures[name].name
        shutil.copyfile(ctx.fixtures[name], target)
        ctx.memo[key] = target
    return ctx.memo[key]


def _dataset(ctx: Context, cls, *args, **kwargs):
    return attempt(cls, ctx.name, *args, **kwargs)


def _done_with(ds) -> None:
    """Close a dataset and let it go, so that its environment is gone before the next one opens the file."""
    close_quietly(ds)
    del ds
    gc.collect()


def _no_env_in_init(ctx: Context) -> str:
    path = _copy(ctx, "lmdb")
    ds = None
    try:
        ds = _dataset(ctx, ctx.candidate, path, return_key=True)
        held = environments_in(ds)
        if held:
            raise PartFailed(f"after __init__ the dataset holds {len(held)} open environment(s): forked workers would inherit them")
        open_read_only(path).close()  # fails if anything in this process still has the file open
        if len(ds) != len(ctx.fixtures["samples"]):
            raise PartFailed(f"the file holds {len(ctx.fixtures['samples'])} records; len() is {len(ds)}")
    finally:
        _done_with(ds)
    return "no environment is open after __init__, and len() is the number of records"


def _keys(ctx: Context) -> str:
    path = _copy(ctx, "lmdb")
    samples = ctx.fixtures["samples"]
    labels = {s.key: s.label for s in samples}
    chosen = [s.key for s in random.Random(9).sample(samples, 30)]  # a shuffled selection: not the stored order
    stored = sorted(labels)
    for keys, what in ((None, "keys=None"), (chosen, f"keys= a list of {len(chosen)} keys in an order of its own")):
        ds = None
        try:
            ds = _dataset(ctx, ctx.candidate, path, keys=keys, transform=sha256_transform, return_key=True)
            expected = stored if keys is None else keys
            if len(ds) != len(expected):
                raise PartFailed(f"with {what}, len() is {len(ds)}, not {len(expected)}"
                                 + (": keys selects the samples, in the order given" if keys else ""))
            got = [attempt(ds.__getitem__, f"dataset[{i}]", i)[2] for i in range(len(expected))]
        finally:
            _done_with(ds)
        if got != expected:
            wrong = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
            order = ("the keys given, in the order given: keep the list as it is"
                     if keys else "every stored key, in the stored (sorted) order")
            raise PartFailed(f"with {what}, dataset[{wrong}] is key {got[wrong]!r}, expected {expected[wrong]!r}: "
                             f"dataset[i] must be the i-th of {order}")
    return "keys=None reads every record in sorted order; a list of keys selects and orders them"


def _items(ctx: Context) -> str:
    path = _copy(ctx, "lmdb")
    by_key = {s.key: s for s in ctx.fixtures["samples"]}
    keys = sorted(by_key)[:3]  # dataset[0..2] with keys=None: the first stored keys
    cases = [({}, False, "with the defaults"), ({"return_key": True}, True, "with return_key=True")]
    for options, with_key, what in cases:
        ds = None
        try:
            ds = _dataset(ctx, ctx.candidate, path, **options)
            for i, key in enumerate(keys):
                item = attempt(ds.__getitem__, f"dataset[{i}]", i)
                try:
                    check_item(item, with_key, key)
                except PartFailed as exc:
                    raise PartFailed(f"{what}: {exc} (the default transform is packlab.transforms.standard_transform)") from None
                if int(item[1]) != by_key[key].label:
                    raise PartFailed(f"{what}: dataset[{i}] (key {key}) has label {int(item[1])}, the manifest says "
                                     f"{by_key[key].label}")
        finally:
            _done_with(ds)
    seen = []

    def recording(jpeg: bytes, source=None):
        seen.append(bytes(jpeg))
        return sha256_transform(jpeg)

    ds = None
    try:
        ds = _dataset(ctx, ctx.candidate, path, transform=recording)
        item = attempt(ds.__getitem__, "dataset[0]", 0)
    finally:
        _done_with(ds)
    if not seen:
        raise PartFailed("a transform given to the constructor was never called: apply it to the JPEG bytes "
                         "in place of the default one")
    if hashlib.sha256(seen[-1]).hexdigest() != by_key[keys[0]].sha256:
        raise PartFailed(f"the transform received {len(seen[-1])} bytes that are not the JPEG of key {keys[0]} "
                         f"({by_key[keys[0]].bytes} bytes): give it value[4:], the bytes after the label")
    if not (isinstance(item, tuple) and len(item) == 2):
        raise PartFailed("with a transform and no return_key, an item must be (transform(jpeg_bytes), label)")
    return "items are (image, label), or (image, label, key) with return_key=True; a given transform gets the JPEG bytes"


def _pixels(ctx: Context) -> str:
    samples = ctx.fixtures["few"]
    ds = None
    try:
        ds = _dataset(ctx, ctx.candidate, _copy(ctx, "lmdb few"), return_key=True)
        records = collect_epoch(make_loader(ctx, ds, batch_size=10), len(samples), "pixels")
    finally:
        _done_with(ds)
    return audit_records(records, samples, ctx.fixtures["pixels"])


def _read_only(ctx: Context) -> str:
    path = _copy(ctx, "lmdb")
    ds = None
    try:
        ds = _dataset(ctx, ctx.candidate, path, return_key=True)
        attempt(ds.__getitem__, "dataset[0]", 0)
        attempt(ds.__getitem__, "dataset[1]", 1)
        module = sys.modules.get(type(ds).__module__)
        held = environments_in(ds) + (environments_in(vars(module)) if module else [])
        flags = [env.flags() for env in held]
    finally:
        _done_with(ds)
    writable = [f for f in flags if not f["readonly"]]
    if writable:
        raise PartFailed("the environment the dataset reads through was opened for writing: open it with readonly=True "
                         "(nobody writes while training reads)")
    lock_files = sorted(p.name for p in path.parent.iterdir() if p.name.endswith("-lock"))
    if lock_files or any(f["lock"] for f in flags):
        raise PartFailed(f"reading made LMDB keep a lock file ({', '.join(lock_files) or 'lock=True'}): open with "
                         "lock=False, which needs no lock file and no write access to the folder")
    return "the file is opened read-only, without a lock file"


def _epoch(ctx: Context, method: str, touch_first: bool, close_inherited: bool) -> str:
    samples = ctx.fixtures["samples"]
    cls = ctx.importable() if method == "spawn" else ctx.candidate
    ds = None
    try:
        ds = attempt(cls, ctx.name, _copy(ctx, "lmdb"), transform=sha256_transform, return_key=True)
        if touch_first:
            attempt(ds.__getitem__, "dataset[0]", 0)
        if method == "spawn":
            try:
                copy = pickle.loads(pickle.dumps(ds))
            except Exception as exc:
                raise PartFailed(f"spawn workers receive a pickled copy of the dataset, but pickling it raised {describe(exc)}") from None
            if environments_in(copy):
                raise PartFailed("the pickled copy holds an open environment: leave it out in __getstate__")
        extra = {"worker_init_fn": close_inherited_environments} if close_inherited else {}
        loader = make_loader(ctx, ds, workers=2, method=method, shuffle=True, **extra)
        records = collect_epoch(loader, len(samples), "sha256")
    finally:
        _done_with(ds)
    return audit_records(records, samples, sha_reference(samples), workers=2)


def _fork(ctx: Context) -> str:
    """Two epochs under fork, each worker's inherited environments closed first: before the parent read, and after."""
    _epoch(ctx, method="fork", touch_first=False, close_inherited=True)
    try:
        return _epoch(ctx, method="fork", touch_first=True, close_inherited=True)
    except PartFailed as exc:
        raise PartFailed(f"after the parent read a sample: {exc}") from None


#: What the check runs in another process to change the file, as a writer updating the dataset would.
#: ``prepare`` adds and deletes spare records, so that free pages exist inside the file: an update can
#: then reuse them instead of growing the file, which a reader that mapped the file at its old size
#: could not follow (LMDB's MDB_MAP_RESIZED). ``replace KEY OTHER`` gives KEY the record of OTHER.
_WRITER = """
import os, sys
import lmdb
path, action = sys.argv[1], sys.argv[2]
env = lmdb.open(path, subdir=False, map_size=4 * os.path.getsize(path) + (64 << 20))
if action == "prepare":
    with env.begin(write=True) as txn:
        for i in range(8):
            txn.put(b"~spare%d" % i, bytes(200_000))
    with env.begin(write=True) as txn:
        for i in range(8):
            txn.delete(b"~spare%d" % i)
    for _ in range(3):  # freed pages become reusable two transactions later
        with env.begin(write=True) as txn:
            txn.put(b"~age", b"x")
        with env.begin(write=True) as txn:
            txn.delete(b"~age")
else:
    key, other = sys.argv[3].encode(), sys.argv[4].encode()
    with env.begin(write=True) as txn:
        txn.put(key, txn.get(other))
env.close()
"""


def _change_file(path: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-c", _WRITER, str(path), *args], check=True, timeout=60, capture_output=True)


def _fresh_reads(ctx: Context) -> str:
    """An item read after the file changed must show the change: no transaction kept across items, no cache."""
    path = ctx.scratch("lmdb-fresh") / "images.lmdb"
    shutil.copyfile(ctx.fixtures["lmdb"], path)
    _change_file(path, "prepare")
    samples = ctx.fixtures["samples"]
    other = next(s for s in samples[4:] if s.label != samples[3].label)  # a record with another label and image
    ds = None
    try:
        ds = _dataset(ctx, ctx.candidate, path, transform=sha256_transform, return_key=True)
        first = attempt(ds.__getitem__, "dataset[3]", 3)
        attempt(ds.__getitem__, "dataset[4]", 4)
        _change_file(path, "replace", samples[3].key, other.key)
        second = attempt(ds.__getitem__, "dataset[3]", 3)
    finally:
        _done_with(ds)
    same_image = bytes(first[0].numpy()) == bytes(second[0].numpy()) if hasattr(first[0], "numpy") else first[0] == second[0]
    if same_image and int(first[1]) == int(second[1]):
        raise PartFailed(
            "after another process rewrote the record of dataset[3] (new label, new image), dataset[3] returned the "
            "same item as before: the dataset reads the file as it was. A read transaction kept open across items "
            "does that (so does a cache of items): begin one per item"
        )
    return "each item is read in a transaction of its own, so it sees the file as it is"


def _close(ctx: Context) -> str:
    path = _copy(ctx, "lmdb")
    unused = _dataset(ctx, ctx.candidate, path, return_key=True)
    attempt(unused.close, "close() of a dataset that has read nothing")
    _done_with(unused)
    ds = _dataset(ctx, ctx.candidate, path, return_key=True)
    attempt(ds.__getitem__, "dataset[0]", 0)
    attempt(ds.close, f"{ctx.name}.close")
    if environments_in(ds):
        raise PartFailed("after close() the dataset still holds an open environment")
    open_read_only(path).close()
    return "close() closes the environment this process opened (and does nothing when none is open)"


register(
    "lmdb_dataset",
    "08_lmdb",
    "an LMDB Dataset with one environment per process: 2 workers under fork (also after the parent read) and spawn",
    "LmdbDataset(path, keys=None, transform=None, return_key=False) with close(): records as write_lmdb writes them; "
    "one read-only environment (lock=False) per process (keyed by os.getpid()), one read transaction per item",
    _read_fixtures,
    [
        ("no_env_in_init", "__init__ leaves no environment open (keys read, environment closed again)",
         "read the keys inside `with lmdb.open(...) as env:` (or close it), and open the reading environment later",
         _no_env_in_init),
        ("keys", "keys=None: every record, in sorted order; a list of keys selects and orders them",
         "self.keys = stored_keys if keys is None else list(keys); dataset[i] reads self.keys[i]", _keys),
        ("items", "items are (image, label) or (image, label, key); a given transform gets the JPEG bytes",
         "split each value: label = int.from_bytes(value[:4], 'little'), image = transform(value[4:]); "
         "transform defaults to standard_transform", _items),
        ("pixels", "labels and pixels match the manifest (40 samples, no workers)",
         "split each value: label = int.from_bytes(value[:4], 'little'), image = transform(value[4:])", _pixels),
        ("read_only", "the file is opened read-only and without a lock file",
         "lmdb.open(path, subdir=False, readonly=True, lock=False)", _read_only),
        ("fork", "2 workers under fork, before and after the parent read a sample: each reads through its own "
         "environment", "a worker must read through an environment it opened itself: look it up by os.getpid()",
         _fork),
        ("fork_after_parent_read", "2 fork workers after the parent itself read a sample",
         "py-lmdb refuses to open a file its parent had open until the inherited environment is closed: in a "
         "process that finds an environment opened by another pid, close it, then open its own",
         functools.partial(_epoch, method="fork", touch_first=True, close_inherited=False)),
        ("spawn", "2 workers under spawn (after the parent read a sample): every sample exactly once",
         "the dataset is pickled into each worker: leave the environment out in __getstate__, and keep the class "
         "and its imports in one cell", functools.partial(_epoch, method="spawn", touch_first=True, close_inherited=False)),
        ("fresh_reads", "an item read after the file changed shows the change (no transaction kept across items)",
         "begin a read transaction for each item: `with env.begin() as txn: value = txn.get(key)`", _fresh_reads),
        ("close", "close() closes the environment this process opened",
         "close this process's environment and forget it; with none open, do nothing", _close),
    ],
)

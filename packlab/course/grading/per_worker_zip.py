"""Checks of exercise 3 (``03_per_worker_zip``): a zip dataset with one handle per process."""

from __future__ import annotations

import functools
import pickle

from packlab.course.grading.core import Context, PartFailed, attempt, describe, register
from packlab.course.grading.fixtures import (
    audit_records,
    check_item,
    collect_epoch,
    cut_inherited_handles,
    fixture_zip,
    make_loader,
    open_handle_attributes,
    open_handles,
    preflight_spawn,
    reference_pixels,
    sha256_transform,
    sha_reference,
    subset,
)


# --------------------------------------------------------------- 3. per-worker zip handles


def _per_worker_fixtures() -> dict:
    samples = subset(320, seed=4)
    return {
        "samples": samples,
        "zip": fixture_zip("per-worker-jpeg-320", samples, "jpeg"),
        "pixels": reference_pixels([s.key for s in samples[:48]]),
    }


def _per_worker_no_handle(ctx: Context) -> str:
    path = ctx.fixtures["zip"]
    before = open_handles(path)
    ds = ctx.call(path, return_key=True)
    after = open_handles(path)
    if after > before:
        raise PartFailed(f"after __init__ this process holds {after - before} open handle(s) on the archive; forked workers would share it")
    attributes = open_handle_attributes(ds)
    if attributes:
        raise PartFailed(f"after __init__ the dataset holds open files in: {', '.join(attributes)}")
    if len(ds) != len(ctx.fixtures["samples"]):
        raise PartFailed(f"the archive holds {len(ctx.fixtures['samples'])} samples; len() is {len(ds)}")
    return "no handle on the archive is open after __init__"


def _per_worker_pickle(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    # The importable copy of the class, as a spawn worker would unpickle it.
    ds = attempt(ctx.importable(), ctx.name, ctx.fixtures["zip"], return_key=True)
    check_item(attempt(ds.__getitem__, "dataset[0]", 0), True, samples[0].key)
    try:
        copy = pickle.loads(pickle.dumps(ds))
    except Exception as exc:
        raise PartFailed(f"after reading a sample the dataset cannot be pickled: {describe(exc)}") from None
    check_item(attempt(copy.__getitem__, "unpickled dataset[1]", 1), True, samples[1].key)
    return "reads in this process, then pickles (as spawn needs) and the copy reads too"


def _per_worker_epoch(ctx: Context, method: str, touch_first: bool) -> str:
    samples = ctx.fixtures["samples"]
    cls = ctx.importable() if method == "spawn" else ctx.candidate
    ds = attempt(cls, ctx.name, ctx.fixtures["zip"], transform=sha256_transform, return_key=True)
    if touch_first:
        attempt(ds.__getitem__, "dataset[0]", 0)
    if method == "spawn":
        preflight_spawn(ds)
    # Four forked workers make interleaved reads through a shared handle near certain; under
    # spawn two suffice (each worker imports torch afresh, which is what costs time there).
    workers = 2 if method == "spawn" else 4
    loader = make_loader(
        ctx, ds, workers=workers, method=method, shuffle=True,
        worker_init_fn=functools.partial(cut_inherited_handles, str(ctx.fixtures["zip"])),
    )
    return audit_records(collect_epoch(loader, len(samples), "sha256"), samples, sha_reference(samples), workers=workers)


def _per_worker_pixels(ctx: Context) -> str:
    samples = ctx.fixtures["samples"][:48]
    ds = ctx.call(ctx.fixtures["zip"], keys=[s.key for s in samples], return_key=True)
    return audit_records(collect_epoch(make_loader(ctx, ds, batch_size=16), len(samples), "pixels"), samples, ctx.fixtures["pixels"])


def _per_worker_close(ctx: Context) -> str:
    path = ctx.fixtures["zip"]
    before = open_handles(path)
    ds = ctx.call(path, return_key=True)
    attempt(ds.__getitem__, "dataset[0]", 0)
    attempt(ds.close, f"{ctx.name}.close")
    after = open_handles(path)
    if after > before:
        raise PartFailed(f"after close() this process still holds {after - before} handle(s) on the archive")
    attributes = open_handle_attributes(ds)
    if attributes:
        raise PartFailed(f"after close() the dataset still holds open files in: {', '.join(attributes)}")
    return "close() releases the handle this process opened"


register(
    "per_worker_zip",
    "03_per_worker_zip",
    "a zip Dataset with one lazily opened handle per process: 4 workers under fork, 2 under spawn",
    "PerWorkerZipDataset(zip_path, keys=None, transform=None, return_key=False) with close(): reads <key>.jpg "
    "members and labels.csv; opens its ZipFile in the process that reads (keyed by os.getpid()), never pickles one",
    _per_worker_fixtures,
    [
        ("no_handle_in_init", "__init__ leaves no handle on the archive open",
         "read labels.csv inside `with zipfile.ZipFile(path) as archive:` so it is closed again; open the reading "
         "handle later, in __getitem__", _per_worker_no_handle),
        ("pickle_after_use", "after reading in this process, the dataset still pickles and the copy reads",
         "define __getstate__ to return the state without the open handles (spawn workers get a pickled copy)", _per_worker_pickle),
        ("pixels", "labels and pixels match the manifest (48 samples, no workers)",
         "archive.read(f'{key}.jpg') gives the JPEG bytes; apply the transform (standard_transform by default)", _per_worker_pixels),
        ("fork", "4 workers under fork: every sample exactly once, bytes match the manifest",
         "a worker must read through a handle it opened itself: look the handle up by os.getpid()", functools.partial(_per_worker_epoch, method="fork", touch_first=False)),
        ("fork_after_parent_read", "4 fork workers after the parent itself read a sample",
         "a handle opened by the parent is inherited by forked workers; key handles by os.getpid() so each "
         "worker opens its own", functools.partial(_per_worker_epoch, method="fork", touch_first=True)),
        ("spawn", "2 workers under spawn (after the parent read a sample): every sample exactly once",
         "the dataset is pickled into each worker: drop open handles in __getstate__ and keep the class and its "
         "imports in one cell", functools.partial(_per_worker_epoch, method="spawn", touch_first=True)),
        ("close", "close() releases the handles this process opened",
         "close every ZipFile this process opened and forget it", _per_worker_close),
    ],
)

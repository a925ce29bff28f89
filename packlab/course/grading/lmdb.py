"""Checks of exercise 8 (``08_lmdb``): an LMDB writer, and a reader with one environment per process.

The layout both checks expect is the course's (:mod:`packlab.formats.lmdb_format`): one
file (``subdir=False``), one record per sample, the key its ASCII key, the value its label
as 4 little-endian bytes followed by its JPEG bytes.

How the reader check catches an environment opened in the parent
---------------------------------------------------------------
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

Every part closes the datasets it made: py-lmdb allows one environment per file and
process, and the parts of a check share one process.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import subprocess
import sys
from pathlib import Path

import lmdb
from torch.utils.data import get_worker_info

from packlab.formats.lmdb_format import LABEL_BYTES, write_lmdb
from packlab.course.grading.core import Context, PartFailed, attempt, describe, register
from packlab.course.grading.fixtures import (
    audit_records,
    collect_epoch,
    fixture_root,
    locked,
    make_loader,
    reference_pixels,
    sha256_transform,
    sha_reference,
    subset,
)


def fixture_lmdb(name: str, samples) -> Path:
    """An LMDB file of ``samples`` written by the reference :func:`packlab.formats.write_lmdb`, cached."""
    root = fixture_root()
    target = root / f"{name}.lmdb"
    with locked(root):
        if not target.exists():
            write_lmdb(target, samples=samples, progress_bar=False)
    return target


def open_read_only(path: Path):
    """Open ``path`` as the checks read it; a failure becomes :class:`PartFailed` saying why."""
    try:
        return lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    except lmdb.Error as exc:
        if "already open in this process" in str(exc):
            raise PartFailed(
                f"{path.name} is still open in this process: an lmdb environment was opened and not closed "
                "(py-lmdb then refuses to open the file again in the same process)"
            ) from None
        raise PartFailed(f"{path.name} is not a readable LMDB file with subdir=False: {describe(exc)}") from None


def environments_in(obj, depth: int = 2) -> list:
    """The open lmdb environments reachable from ``obj``: its attributes, the dicts, lists and objects in them."""
    found, seen = [], set()

    def visit(value, level):
        if id(value) in seen or level < 0:
            return
        seen.add(id(value))
        if isinstance(value, lmdb.Environment):
            try:
                value.flags()  # raises on a closed environment
                found.append(value)
            except lmdb.Error:
                pass
            return
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, (list, tuple, set)):
            children = list(value)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            children = list(vars(value).values())
        else:
            return
        for child in children:
            visit(child, level - 1)

    visit(obj, depth)
    return found


def close_inherited_environments(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: close every open environment the worker inherited (see the module docstring).

    In a forked child, closing unmaps the child's view and closes the child's copies of the
    descriptors; the parent's environment is untouched.
    """
    dataset = get_worker_info().dataset
    module = sys.modules.get(type(dataset).__module__)
    for env in environments_in(dataset) + (environments_in(vars(module), depth=2) if module else []):
        env.close()


def close_quietly(dataset) -> None:
    """Close a candidate's dataset at the end of a part, whatever it is."""
    if dataset is not None and hasattr(dataset, "close"):
        try:
            dataset.close()
        except Exception:  # noqa: BLE001 - a part's verdict is already decided
            pass


# ------------------------------------------------------------------------------ the writer


def _write_fixtures() -> dict:
    return {"samples": subset(120, seed=8)}


def _written(ctx: Context) -> Path:
    """Write the fixture samples with the candidate once per child; parts share the file."""
    if "written" not in ctx.memo:
        dst = ctx.scratch("lmdb-write") / "images.lmdb"
        ctx.call(ctx.fixtures["samples"], dst)
        if not dst.is_file():
            raise PartFailed(f"no file at the path given ({dst.name}): write one file (subdir=False), not a folder")
        ctx.memo["written"] = dst
    return ctx.memo["written"]


def _records(ctx: Context) -> dict[bytes, bytes]:
    """Every record of the written file, read with a cursor."""
    if "records" not in ctx.memo:
        env = open_read_only(_written(ctx))
        try:
            with env.begin() as txn:
                ctx.memo["records"] = dict(txn.cursor())
        finally:
            env.close()
    return ctx.memo["records"]


def _write_file(ctx: Context) -> str:
    path = _written(ctx)
    env = open_read_only(path)
    entries = env.stat()["entries"]
    env.close()
    return f"{path.name} is one LMDB file ({path.stat().st_size / 1e6:.1f} MB, {entries} records)"


def _write_keys(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    records = _records(ctx)
    wanted = {s.key.encode("ascii") for s in samples}
    missing, extra = sorted(wanted - records.keys()), sorted(records.keys() - wanted)
    if missing or extra:
        raise PartFailed(
            f"{len(missing)} sample keys have no record (e.g. {missing[:3]}), {len(extra)} records have keys that are "
            f"not samples (e.g. {extra[:3]}): one record per sample, keyed by its key in ASCII (b'000123')"
        )
    return f"{len(samples)} records, one per sample, keyed by the sample's key"


def _write_labels(ctx: Context) -> str:
    records = _records(ctx)
    wrong = [s.key for s in ctx.fixtures["samples"]
             if int.from_bytes(records.get(s.key.encode("ascii"), b"")[:LABEL_BYTES], "little") != s.label]
    if wrong:
        raise PartFailed(f"{len(wrong)} records start with another label than the manifest's, e.g. key {wrong[0]}")
    return "every record starts with its sample's label (4 bytes, little-endian)"


def _write_bytes(ctx: Context) -> str:
    records = _records(ctx)
    wrong = [s.key for s in ctx.fixtures["samples"]
             if hashlib.sha256(records.get(s.key.encode("ascii"), b"")[LABEL_BYTES:]).hexdigest() != s.sha256]
    if wrong:
        raise PartFailed(f"{len(wrong)} records do not end with the original JPEG bytes, e.g. key {wrong[0]}")
    return "after the label, every record holds the original JPEG, byte for byte"


def _write_atomic(ctx: Context) -> str:
    _written(ctx)  # first, a complete write must work at all
    samples = list(ctx.fixtures["samples"][:5])
    ghost = samples[-1]._replace(key="999999")  # no such image: the writer must fail part-way
    dst = ctx.scratch("lmdb-atomic") / "images.lmdb"
    try:
        ctx.candidate(samples + [ghost], dst)
    except Exception:  # noqa: BLE001 - failing is what it should do here
        pass
    else:
        raise PartFailed("writing a sample whose image does not exist raised nothing: let the error propagate")
    if dst.exists():
        raise PartFailed(
            f"after a failed write, a file is left at {dst.name}: a reader would take it for a complete dataset. "
            "Write to a temporary name in the same folder and rename it when done"
        )
    return "a write that fails part-way leaves nothing under the final name"


register(
    "lmdb_write",
    "08_lmdb",
    "an LMDB writer in the course's layout, writing atomically",
    "write_lmdb(samples, path, root=None): one LMDB file at path (subdir=False); per sample, key = key in ASCII, "
    "value = label.to_bytes(4, 'little') + JPEG bytes; written to a temporary name and renamed when complete",
    _write_fixtures,
    [
        ("one_file", "path is one LMDB file that opens read-only with subdir=False",
         "lmdb.open(str(tmp), subdir=False, map_size=...) writes one file (plus a lock file); close the environment "
         "before renaming", _write_file),
        ("one_record_per_sample", "one record per sample, keyed by its key: none missing, none extra",
         "txn.put(sample.key.encode('ascii'), value) for every sample, nothing else", _write_keys),
        ("labels", "each record starts with its label, 4 bytes little-endian",
         "sample.label.to_bytes(4, 'little') + jpeg_bytes", _write_labels),
        ("jpeg_bytes", "each record ends with the original JPEG bytes",
         "read data.image_path(key, root).read_bytes() and store the bytes unchanged", _write_bytes),
        ("atomic", "a write that fails part-way leaves no file under the final name",
         "write to path.with_name(path.name + '.partial'), then os.replace() it to path", _write_atomic),
    ],
)


# ------------------------------------------------------------------------------ the reader


def _read_fixtures() -> dict:
    samples = subset(200, seed=9)
    return {
        "samples": samples,
        "lmdb": fixture_lmdb("lmdb-200", samples),
        "pixels": reference_pixels([s.key for s in samples[:40]]),
    }


def _no_env_in_init(ctx: Context) -> str:
    ds = None
    try:
        ds = ctx.call(ctx.fixtures["lmdb"], return_key=True)
        held = environments_in(ds)
        if held:
            raise PartFailed(f"after __init__ the dataset holds {len(held)} open environment(s): forked workers would inherit them")
        open_read_only(ctx.fixtures["lmdb"]).close()  # fails if anything in this process still has the file open
        if len(ds) != len(ctx.fixtures["samples"]):
            raise PartFailed(f"the file holds {len(ctx.fixtures['samples'])} records; len() is {len(ds)}")
    finally:
        close_quietly(ds)
    return "no environment is open after __init__, and len() is the number of records"


def _pixels(ctx: Context) -> str:
    samples = ctx.fixtures["samples"][:40]
    ds = None
    try:
        ds = ctx.call(ctx.fixtures["lmdb"], keys=[s.key for s in samples], return_key=True)
        records = collect_epoch(make_loader(ctx, ds, batch_size=10), len(samples), "pixels")
    finally:
        close_quietly(ds)
    return audit_records(records, samples, ctx.fixtures["pixels"])


def _epoch(ctx: Context, method: str, touch_first: bool, close_inherited: bool) -> str:
    samples = ctx.fixtures["samples"]
    cls = ctx.importable() if method == "spawn" else ctx.candidate
    ds = None
    try:
        ds = attempt(cls, ctx.name, ctx.fixtures["lmdb"], transform=sha256_transform, return_key=True)
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
        close_quietly(ds)
    return audit_records(records, samples, sha_reference(samples), workers=2)


#: What the check runs in another process to change the file, as a writer updating the dataset would.
#: ``prepare`` adds and deletes spare records, so that free pages exist inside the file: an update can
#: then reuse them instead of growing the file, which a reader that mapped the file at its old size
#: could not follow (LMDB's MDB_MAP_RESIZED). ``relabel KEY`` changes one record's label.
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
    key = sys.argv[3].encode()
    with env.begin(write=True) as txn:
        value = txn.get(key)
        label = int.from_bytes(value[:4], "little")
        txn.put(key, ((label + 1) % 10).to_bytes(4, "little") + value[4:])
env.close()
"""


def _change_file(path: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-c", _WRITER, str(path), *args], check=True, timeout=60, capture_output=True)


def _fresh_reads(ctx: Context) -> str:
    """A read transaction kept across items reads the file as it was when the transaction began."""
    path = ctx.scratch("lmdb-fresh") / "images.lmdb"
    path.write_bytes(ctx.fixtures["lmdb"].read_bytes())
    _change_file(path, "prepare")
    ds = None
    try:
        ds = ctx.call(path, transform=sha256_transform, return_key=True)
        first = attempt(ds.__getitem__, "dataset[3]", 3)
        _change_file(path, "relabel", str(first[2]))
        second = attempt(ds.__getitem__, "dataset[3]", 3)
    finally:
        close_quietly(ds)
    expected = (int(first[1]) + 1) % 10
    if int(second[1]) != expected:
        raise PartFailed(
            f"after the file changed, dataset[3] still returned label {int(second[1])} instead of {expected}: "
            "a read transaction kept open across items keeps reading the file as it was when it began"
        )
    return "each item is read in a transaction of its own, so it sees the file as it is"


def _close(ctx: Context) -> str:
    ds = ctx.call(ctx.fixtures["lmdb"], return_key=True)
    attempt(ds.__getitem__, "dataset[0]", 0)
    attempt(ds.close, f"{ctx.name}.close")
    if environments_in(ds):
        raise PartFailed("after close() the dataset still holds an open environment")
    open_read_only(ctx.fixtures["lmdb"]).close()
    return "close() closes the environment this process opened"


register(
    "lmdb_dataset",
    "08_lmdb",
    "an LMDB Dataset with one environment per process: 2 workers under fork (also after the parent read) and spawn",
    "LmdbDataset(path, keys=None, transform=None, return_key=False) with close(): records as write_lmdb writes them; "
    "one read-only environment per process (keyed by os.getpid()), one read transaction per item",
    _read_fixtures,
    [
        ("no_env_in_init", "__init__ leaves no environment open (keys read, environment closed again)",
         "read the keys inside `with lmdb.open(...) as env:` (or close it), and open the reading environment later",
         _no_env_in_init),
        ("pixels", "labels and pixels match the manifest (40 samples, no workers)",
         "split each value: label = int.from_bytes(value[:4], 'little'), image = transform(value[4:])", _pixels),
        ("fork", "2 workers under fork: every sample exactly once, bytes match the manifest",
         "a worker must read through an environment it opened itself: look it up by os.getpid()",
         functools.partial(_epoch, method="fork", touch_first=False, close_inherited=True)),
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
         "close this process's environment and forget it", _close),
    ],
)

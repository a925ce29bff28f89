"""Checks of exercise 8 (``08_lmdb``): an LMDB writer, and a reader with one environment per process.

The layout both checks expect is the course's (:mod:`packlab.formats.lmdb_format`): one
file (``subdir=False``), one record per sample, the key its ASCII key, the value its label
as 4 little-endian bytes followed by its JPEG bytes.

What one fixed input would hide, the writer's parts vary: the samples come sorted and
shuffled, from the default data folder and from another ``root`` whose images differ
from the default ones; the temporary folder of :mod:`tempfile` is moved to another
filesystem (where ``os.replace`` cannot reach the target); the target folder already
holds an older file under the final name and files under the temporary names a crashed
run would have left. How the file comes into being is watched (inotify, on Linux): the
final name must arrive complete, by a rename.

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

Every part reads a copy of the fixture file in its own scratch folder (a lock file a
candidate creates must not land in the shared cache), and closes the datasets it made:
py-lmdb allows one environment per file and process, and the parts of a check share one
process.
"""

from __future__ import annotations

import errno
import functools
import gc
import hashlib
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import lmdb
from torch.utils.data import get_worker_info

from packlab import data
from packlab.course.grading.core import Context, PartFailed, attempt, describe, register
from packlab.course.grading.fixtures import (
    FolderEvents,
    audit_records,
    check_item,
    collect_epoch,
    fixture_root,
    folder_on_another_filesystem,
    locked,
    make_loader,
    reference_pixels,
    sha256_transform,
    sha_reference,
    subset,
)
from packlab.formats.lmdb_format import LABEL_BYTES, write_lmdb


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


def read_records(path: Path) -> dict[bytes, bytes]:
    """Every record of an LMDB file, read with a cursor."""
    env = open_read_only(path)
    try:
        with env.begin() as txn:
            return dict(txn.cursor())
    finally:
        env.close()


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


def swapped_root(samples) -> tuple[Path, list[data.Sample], dict[str, str]]:
    """A data folder other than the default one, holding for each sample's key *another* sample's image.

    A writer that reads from the default folder instead of ``root`` then stores other bytes
    than the ones this folder holds. Returns the folder and the samples as its manifest
    would list them (each with the size and SHA-256 of the file it holds), and the SHA-256
    of each key's image in the default folder. Cached.
    """
    folder = fixture_root() / "swapped-root"
    images = folder / "images"
    rows = []
    with locked(fixture_root()):
        images.mkdir(parents=True, exist_ok=True)
        for sample, donor in zip(samples, samples[1:] + samples[:1]):
            target = images / f"{sample.key}.jpg"
            if not target.exists():
                partial = target.with_suffix(".partial")
                shutil.copyfile(data.image_path(donor.key), partial)
                os.replace(partial, target)
            rows.append(sample._replace(bytes=donor.bytes, sha256=donor.sha256, width=donor.width, height=donor.height))
    return folder, rows, {s.key: s.sha256 for s in samples}


def _write_fixtures() -> dict:
    small = subset(20, seed=80)
    return {
        "samples": subset(120, seed=8),
        "shuffled": random.Random(8).sample(small, len(small)),
        "small": small,
        "root": swapped_root(subset(8, seed=81)),
    }


def _advice(text: str) -> str:
    """What a writer's error usually means, in words."""
    if "MapFullError" in text or "MDB_MAP_FULL" in text:
        return (" The map is full: map_size must hold every record, pages and tree included: twice the sum of "
                "the JPEG sizes (sample.bytes) plus some room is plenty (lmdb's default is only 10 MiB)")
    if "MDB_KEYEXIST" in text or "KeyExistsError" in text:
        return (" put(..., append=True) needs the keys in sorted order, and the samples may come in any order: "
                "sort them first, or leave append out")
    if f"Errno {errno.EXDEV}" in text or "cross-device" in text:
        return (" os.replace can only rename within one filesystem: make the temporary file in the folder of "
                "path (tempfile's own folder may be elsewhere)")
    return ""


def _call_writer(ctx: Context, samples, dst: Path, **options) -> Path:
    """Call the candidate; an exception fails the part with what it raised and what that usually means."""
    try:
        ctx.candidate(samples, dst, **options)
    except Exception as exc:
        text = describe(exc)
        shown = ", ".join([f"{len(samples)} samples", dst.name] + [f"{k}={v}" for k, v in options.items()])
        raise PartFailed(f"{ctx.name}({shown}) raised {text}.{_advice(text)}") from exc
    if dst.is_dir():
        raise PartFailed(f"{dst.name} is a folder: write one file (lmdb.open(..., subdir=False)), not a folder")
    if not dst.is_file():
        raise PartFailed(f"no file at the path given ({dst.name}) after the call returned")
    return dst


def _written(ctx: Context) -> Path:
    """The 120 fixture samples (sorted by key, default root) written by the candidate; parts share the file."""
    if "written" not in ctx.memo:
        dst = ctx.scratch("lmdb-write") / "images.lmdb"
        ctx.memo["written"] = _call_writer(ctx, ctx.fixtures["samples"], dst)
    return ctx.memo["written"]


def _records(ctx: Context) -> dict[bytes, bytes]:
    if "records" not in ctx.memo:
        ctx.memo["records"] = read_records(_written(ctx))
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
    samples = ctx.fixtures["samples"]
    values = [records.get(s.key.encode("ascii"), b"") for s in samples]
    wrong = [s for s, v in zip(samples, values) if int.from_bytes(v[:LABEL_BYTES], "little") != s.label]
    if wrong:
        how = ""
        if all(int.from_bytes(v[:LABEL_BYTES], "big") == s.label for s, v in zip(samples, values)):
            how = ": they are big-endian; the layout stores label.to_bytes(4, 'little')"
        elif all(v.startswith(f"{s.label}".encode()) for s, v in zip(samples, values)):
            how = ": the label is written as text; the layout stores label.to_bytes(4, 'little')"
        raise PartFailed(f"{len(wrong)} records start with another label than the manifest's, e.g. key {wrong[0].key} "
                         f"(label {wrong[0].label}){how}")
    return "every record starts with its sample's label (4 bytes, little-endian)"


def _write_bytes(ctx: Context) -> str:
    records = _records(ctx)
    samples = ctx.fixtures["samples"]
    values = [records.get(s.key.encode("ascii"), b"") for s in samples]
    wrong = [s for s, v in zip(samples, values) if hashlib.sha256(v[LABEL_BYTES:]).hexdigest() != s.sha256]
    if wrong:
        how = ""
        for width in (1, 2, 8):
            if all(hashlib.sha256(v[width:]).hexdigest() == s.sha256 for s, v in zip(samples, values)):
                how = f": the JPEG starts after {width} bytes; the label takes exactly 4 (label.to_bytes(4, 'little'))"
        raise PartFailed(f"{len(wrong)} records do not end with the original JPEG bytes, e.g. key {wrong[0].key}{how}")
    return "after the label, every record holds the original JPEG, byte for byte"


def _write_root(ctx: Context) -> str:
    root, samples, defaults = ctx.fixtures["root"]
    dst = _call_writer(ctx, samples, ctx.scratch("lmdb-root") / "images.lmdb", root=root)
    records = read_records(dst)
    stored = {s.key: hashlib.sha256(records.get(s.key.encode("ascii"), b"")[LABEL_BYTES:]).hexdigest() for s in samples}
    from_default = [s.key for s in samples if stored[s.key] == defaults[s.key]]
    if from_default:
        raise PartFailed(
            f"with root={root}, {len(from_default)} of {len(samples)} records hold the image of the default data "
            f"folder (e.g. key {from_default[0]}), not the one in root: read each image from "
            "data.image_path(sample.key, root), the folder given"
        )
    return f"the images are read from the root given ({len(samples)} samples from another folder)"


def _write_any_order(ctx: Context) -> str:
    samples = ctx.fixtures["shuffled"]
    dst = _call_writer(ctx, samples, ctx.scratch("lmdb-shuffled") / "images.lmdb")
    missing = [s.key for s in samples if s.key.encode("ascii") not in read_records(dst)]
    if missing:
        raise PartFailed(f"of {len(samples)} samples given in shuffled order, {len(missing)} have no record "
                         f"(e.g. {missing[0]}). put(..., append=True) does not add a key that comes out of order (it "
                         "returns False): sort the samples by key first, or leave append out")
    return f"{len(samples)} samples given in shuffled order: every record there"


def _write_one_transaction(ctx: Context) -> str:
    env = open_read_only(_written(ctx))
    try:
        transactions = env.info()["last_txnid"]
    finally:
        env.close()
    if transactions != 1:
        raise PartFailed(
            f"the file records {transactions} committed write transactions: write every sample in one "
            "(`with env.begin(write=True) as txn:` around the loop), which commits once, when all are in"
        )
    return "all records written in one write transaction"


def _failed_write(ctx: Context) -> tuple[Path, bool]:
    """The candidate writing five samples and then one whose image does not exist: (target, whether it raised)."""
    if "failed write" not in ctx.memo:
        samples = list(ctx.fixtures["samples"][:5])
        ghost = samples[-1]._replace(key="999999")  # no such image: the writer must fail part-way
        dst = ctx.scratch("lmdb-failing") / "images.lmdb"
        try:
            ctx.candidate(samples + [ghost], dst)
            raised = False
        except Exception:  # noqa: BLE001 - failing is what it should do here
            raised = True
        ctx.memo["failed write"] = (dst, raised)
    return ctx.memo["failed write"]


def _write_atomic(ctx: Context) -> str:
    dst, raised = _failed_write(ctx)
    if not raised:
        raise PartFailed("writing a sample whose image does not exist raised nothing: let the error propagate")
    if dst.exists():
        raise PartFailed(
            f"after a failed write, a file is left at {dst.name}: a reader would take it for a complete dataset. "
            "Write to a temporary name in the same folder and rename it when done"
        )
    folder = ctx.scratch("lmdb-watched")
    elsewhere = folder_on_another_filesystem(folder)
    before = tempfile.tempdir
    tempfile.tempdir = str(elsewhere) if elsewhere else before  # where a temporary file made by tempfile would go
    try:
        with FolderEvents(folder) as events:
            _call_writer(ctx, ctx.fixtures["small"], folder / "images.lmdb")
    finally:
        tempfile.tempdir = before
        if elsewhere is not None:
            shutil.rmtree(elsewhere, ignore_errors=True)
    if events.available and "images.lmdb" in events.names_written():
        raise PartFailed(
            "images.lmdb was created or written under its final name, so a reader could open it half-written "
            "(also the case for shutil.copy or shutil.move from another folder): write a temporary file in the same "
            "folder and os.replace() it to the final name when it is complete"
        )
    where = " (with tempfile's folder on another filesystem)" if elsewhere else ""
    return f"a failed write leaves nothing under the final name; a good one appears there complete, by a rename{where}"


def _write_tidy(ctx: Context) -> str:
    written = _written(ctx)
    left = sorted(p.name for p in written.parent.iterdir() if p != written)
    if left:
        raise PartFailed(
            f"after a successful write the folder also holds {left}: remove what the write made besides the file "
            "(LMDB's <temporary name>-lock file, unless lock=False)"
        )
    dst, raised = _failed_write(ctx)
    left = sorted(p.name for p in dst.parent.iterdir() if p != dst) if dst.parent.exists() else []
    if left:
        raise PartFailed(f"after a failed write the folder still holds {left}: remove the temporary file (and its "
                         "lock file) when the write fails, then let the error propagate")
    return "nothing left beside the file after a write, and nothing at all after a failed one"


#: The key of the one record in the files a check leaves where a crashed run would have left its own.
_STALE_KEY = b"stale-record"


def _stale_names(name: str) -> list[str]:
    """Names under which a crashed writer of ``name`` might have left its temporary file."""
    stem = name.rsplit(".", 1)[0]
    suffixes = (".tmp", ".partial", ".part", ".temp", ".new", ".writing", ".incomplete", "~", ".tmp.lmdb")
    return sorted({f"{name}{s}" for s in suffixes} | {f".{name}{s}" for s in suffixes[:3]}
                  | {f"{stem}{s}" for s in suffixes[:4]} | {f"tmp-{name}", f"{stem}-tmp.lmdb", f"{stem}.tmp.lmdb"})


def _write_replaces(ctx: Context) -> str:
    folder = ctx.scratch("lmdb-leftovers")
    dst = folder / "images.lmdb"
    stale = ctx.scratch("lmdb-stale") / "stale.lmdb"
    env = lmdb.open(str(stale), subdir=False, map_size=1 << 20, lock=False)
    with env.begin(write=True) as txn:
        txn.put(_STALE_KEY, (7).to_bytes(LABEL_BYTES, "little") + b"left by an earlier run")
    env.close()
    for name in ["images.lmdb", *_stale_names("images.lmdb")]:
        shutil.copyfile(stale, folder / name)
    _call_writer(ctx, ctx.fixtures["small"], dst)
    if _STALE_KEY in read_records(dst):
        raise PartFailed(
            f"written into a folder that held an older images.lmdb and the temporary files a crashed run leaves, the "
            f"new file holds the old record {_STALE_KEY!r}: the write added to a file that was there. Start the "
            "temporary file empty (remove what is there first, or pick a new name) and replace the old file"
        )
    return "an older file under the final name is replaced, and stale temporary files do not leak into the new one"


register(
    "lmdb_write",
    "08_lmdb",
    "an LMDB writer in the course's layout, writing atomically",
    "write_lmdb(samples, path, root=None): one LMDB file at path (subdir=False); per sample, key = key in ASCII, "
    "value = label.to_bytes(4, 'little') + JPEG bytes read from data.image_path(key, root); samples in any order; "
    "one write transaction, in a fresh temporary file in path's folder, renamed to path when complete",
    _write_fixtures,
    [
        ("one_file", "path is one LMDB file that opens read-only with subdir=False",
         "lmdb.open(str(tmp), subdir=False, map_size=...) writes one file; close the environment before renaming",
         _write_file),
        ("one_record_per_sample", "one record per sample, keyed by its key: none missing, none extra",
         "txn.put(sample.key.encode('ascii'), value) for every sample, nothing else", _write_keys),
        ("labels", "each record starts with its label, 4 bytes little-endian",
         "sample.label.to_bytes(4, 'little') + jpeg_bytes", _write_labels),
        ("jpeg_bytes", "each record ends with the original JPEG bytes",
         "read data.image_path(key, root).read_bytes() and store the bytes unchanged", _write_bytes),
        ("root", "with root=..., the images are read from that data folder",
         "pass root on: data.image_path(sample.key, root)", _write_root),
        ("any_order", "samples given in any order (shuffled) are all written",
         "LMDB sorts the keys itself; put(..., append=True) only works for keys that come sorted", _write_any_order),
        ("one_transaction", "every record is written in one write transaction",
         "open one `with env.begin(write=True) as txn:` around the whole loop", _write_one_transaction),
        ("atomic", "a write that fails part-way leaves no file under the final name; a complete one arrives by a rename",
         "write to a temporary name in path's folder (path.with_name(path.name + '.partial')), then os.replace() it "
         "to path", _write_atomic),
        ("tidy", "nothing is left beside the file: no temporary or lock file, also after a failed write",
         "remove f'{tmp}-lock' after closing the environment; on an error, remove the temporary file before "
         "re-raising", _write_tidy),
        ("replaces", "an older file at path is replaced, and stale temporary files do not end up in the new one",
         "remove a leftover temporary file before opening it (tmp.unlink(missing_ok=True)); os.replace overwrites "
         "the old file", _write_replaces),
    ],
)


# ------------------------------------------------------------------------------ the reader


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
    keys = [s.key for s in ctx.fixtures["samples"][5:8]]
    cases = [({}, False, "with the defaults"), ({"return_key": True}, True, "with return_key=True")]
    for options, with_key, what in cases:
        ds = None
        try:
            ds = _dataset(ctx, ctx.candidate, path, keys=keys, **options)
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
        ds = _dataset(ctx, ctx.candidate, path, keys=keys, transform=recording)
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
    ds = _dataset(ctx, ctx.candidate, path, return_key=True)
    attempt(ds.close, "close() before any read")
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
         "close this process's environment and forget it; with none open, do nothing", _close),
    ],
)

"""The check ``lmdb_write`` of exercise 8: an LMDB writer in the course's layout, writing atomically.

What one fixed input would hide, the parts vary: the samples come sorted and shuffled,
from the default data folder and from another ``root`` whose images differ from the
default ones; the temporary folder of :mod:`tempfile` is moved to another filesystem
(where ``os.replace`` cannot reach the target); the target folder already holds an older
file under the final name and files under the temporary names a crashed run would have
left. How the file comes into being is watched (inotify, on Linux): the final name must
arrive complete, by a rename.
"""

from __future__ import annotations

import errno
import hashlib
import os
import random
import shutil
import tempfile
from pathlib import Path

import lmdb

from packlab import data
from packlab.course.grading.core import Context, PartFailed, describe, register
from packlab.course.grading.fixtures import FolderEvents, fixture_root, folder_on_another_filesystem, locked, subset
from packlab.course.grading.lmdb.files import open_read_only, read_records
from packlab.formats.lmdb_format import LABEL_BYTES


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
        found = [f"{len(missing)} sample keys have no record (e.g. {missing[:3]})" if missing else "",
                 f"{len(extra)} records have keys that are not samples (e.g. {extra[:3]})" if extra else ""]
        raise PartFailed(f"{', '.join(f for f in found if f)}: one record per sample, keyed by its key in ASCII "
                         "(b'000123')")
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
                         f"(e.g. {missing[0]}). If you use put(..., append=True): it does not add a key that comes out "
                         "of order (it returns False); sort the samples by key first, or leave append out")
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

"""Checks of exercise 2 (``02_zip_packing``): packing samples into a zip, and reading them back."""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import os
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np

from packlab import data, pack, paths
from packlab.course.grading.core import Context, PartFailed, attempt, register
from packlab.course.grading.fixtures import (
    audit_records,
    check_item,
    collect_epoch,
    fixture_zip,
    make_loader,
    reference_pixels,
    subset,
)
from packlab.transforms import RAW_SHAPE, decode_and_resize


# ------------------------------------------------------------------------- 2. zip packing


def _zip_pack_fixtures() -> dict:
    samples = subset(150, seed=2)
    return {"samples": samples, "raw_samples": samples[:60]}


def _packed(ctx: Context, members: str) -> Path:
    """Pack the fixture samples with the candidate once per child; parts share the archive."""
    if members not in ctx.memo:
        samples = ctx.fixtures["samples"] if members == "jpeg" else ctx.fixtures["raw_samples"]
        dst = ctx.scratch(f"pack-{members}") / f"images-{members}.zip"
        ctx.call(dst, samples, members=members)
        if not dst.is_file():
            raise PartFailed(f"no file was written at the dst path given ({dst.name})")
        if not zipfile.is_zipfile(dst):
            raise PartFailed(f"{dst.name} is not a zip file")
        ctx.memo[members] = dst
    return ctx.memo[members]


def _names_once(archive: zipfile.ZipFile) -> list[str]:
    names = archive.namelist()
    twice = [n for n, c in Counter(names).items() if c > 1]
    if twice:
        raise PartFailed(f"members stored more than once: {', '.join(sorted(twice)[:5])}")
    return names


def _zip_valid(ctx: Context) -> str:
    dst = _packed(ctx, "jpeg")
    with zipfile.ZipFile(dst) as archive:
        bad = archive.testzip()
    if bad is not None:
        raise PartFailed(f"member {bad} fails its CRC check")
    return f"{dst.name} is a valid zip ({dst.stat().st_size / 1e6:.1f} MB)"


def _zip_jpeg_members(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    with zipfile.ZipFile(_packed(ctx, "jpeg")) as archive:
        names = set(_names_once(archive))
        wanted = {pack.member_name(s.key, "jpeg") for s in samples}
        if wanted - names:
            raise PartFailed(f"{len(wanted - names)} members missing, e.g. {sorted(wanted - names)[0]} (name them <key>.jpg)")
        extra = names - wanted - {pack.ZIP_LABELS_MEMBER}
        if extra:
            raise PartFailed(f"unexpected members: {', '.join(sorted(extra)[:5])}")
        wrong = [s.key for s in samples if hashlib.sha256(archive.read(f"{s.key}.jpg")).hexdigest() != s.sha256]
    if wrong:
        raise PartFailed(f"{len(wrong)} members differ from the original files, e.g. {wrong[0]}.jpg")
    return f"{len(samples)} members <key>.jpg, byte-identical to the originals"


def _zip_raw_members(ctx: Context) -> str:
    samples = ctx.fixtures["raw_samples"]
    size = int(np.prod(RAW_SHAPE))
    with zipfile.ZipFile(_packed(ctx, "raw")) as archive:
        names = set(_names_once(archive))
        wanted = {pack.member_name(s.key, "raw") for s in samples}
        if wanted - names:
            raise PartFailed(f"{len(wanted - names)} members missing, e.g. {sorted(wanted - names)[0]} (name them <key>.raw)")
        extra = names - wanted - {pack.ZIP_LABELS_MEMBER}
        if extra:
            raise PartFailed(f"unexpected members: {', '.join(sorted(extra)[:5])}")
        for s in samples:
            raw = archive.read(f"{s.key}.raw")
            if len(raw) != size:
                raise PartFailed(f"{s.key}.raw has {len(raw)} bytes; 256x256x3 uint8 pixels are {size} bytes")
            expected = decode_and_resize(data.image_path(s.key).read_bytes()).tobytes()
            if raw != expected:
                raise PartFailed(f"{s.key}.raw holds other pixels than decode_and_resize of the original")
    return f"{len(samples)} members <key>.raw, each the 256x256x3 uint8 pixels of decode_and_resize"


def _zip_labels(ctx: Context) -> str:
    for members in ("jpeg", "raw"):
        samples = ctx.fixtures["samples"] if members == "jpeg" else ctx.fixtures["raw_samples"]
        with zipfile.ZipFile(_packed(ctx, members)) as archive:
            if pack.ZIP_LABELS_MEMBER not in archive.namelist():
                raise PartFailed(f"the {members} zip has no {pack.ZIP_LABELS_MEMBER} member")
            text = archive.read(pack.ZIP_LABELS_MEMBER).decode()
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames != ["key", "label"]:
            raise PartFailed(f"{pack.ZIP_LABELS_MEMBER} must start with the header 'key,label'; found {reader.fieldnames}")
        labels = {row["key"]: row["label"] for row in reader}
        expected = {s.key: str(s.label) for s in samples}
        if labels != expected:
            wrong = sorted(k for k in expected.keys() | labels.keys() if labels.get(k) != expected.get(k))
            raise PartFailed(f"{pack.ZIP_LABELS_MEMBER} in the {members} zip disagrees with the manifest for {len(wrong)} keys, e.g. {wrong[0]}")
    return "labels.csv in both archives lists every key with its label"


def _zip_stored(ctx: Context) -> str:
    for members in ("jpeg", "raw"):
        with zipfile.ZipFile(_packed(ctx, members)) as archive:
            compressed = [i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
        if compressed:
            raise PartFailed(f"{len(compressed)} members of the {members} zip are compressed, e.g. {compressed[0]}")
    return "every member is stored uncompressed"


register(
    "zip_pack",
    "02_zip_packing",
    "pack samples into one uncompressed zip, as encoded JPEG or as raw resized pixels",
    "pack_zip(dst, samples, members='jpeg') -> path: samples are manifest rows (packlab.data.Sample); writes "
    "<key>.jpg (original bytes) or, with members='raw', <key>.raw (decode_and_resize(...).tobytes()), plus labels.csv",
    _zip_pack_fixtures,
    [
        ("valid_zip", "writes a valid zip at dst",
         "open zipfile.ZipFile(dst, 'w') in a with block so the central directory is written when it closes", _zip_valid),
        ("jpeg_members", "members='jpeg': one <key>.jpg per sample, byte-identical to the original",
         "archive.writestr(f'{key}.jpg', original bytes) for each sample; read the file in binary mode", _zip_jpeg_members),
        ("raw_members", "members='raw': one <key>.raw per sample, the 256x256x3 uint8 pixels",
         "store decode_and_resize(jpeg_bytes).tobytes() under f'{key}.raw'", _zip_raw_members),
        ("labels", "a labels.csv member ('key,label' rows) makes each archive self-contained",
         "write 'key,label' and one line per sample into a member called labels.csv", _zip_labels),
        ("stored", "members are stored uncompressed (one seek and one read per sample)",
         "use compression=zipfile.ZIP_STORED (the default) for the archive and for every writestr", _zip_stored),
    ],
)


# ---------------------------------------------------------------------- 2b. reading a zip


def _zip_read_fixtures() -> dict:
    samples = subset(160, seed=3)
    raw_samples = samples[:64]
    return {
        "samples": samples,
        "raw_samples": raw_samples,
        "jpeg_zip": fixture_zip("read-jpeg-160", samples, "jpeg"),
        "raw_zip": fixture_zip("read-raw-64", raw_samples, "raw"),
        "pixels": reference_pixels([s.key for s in samples]),
    }


def _zip_read_items(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    ds = ctx.call(ctx.fixtures["jpeg_zip"], members="jpeg", return_key=True)
    if len(ds) != len(samples):
        raise PartFailed(f"the archive holds {len(samples)} samples; len() is {len(ds)}")
    for index in (0, len(samples) - 1):
        check_item(attempt(ds.__getitem__, f"dataset[{index}]", index), True, samples[index].key)
    picked = [samples[3].key, samples[1].key]
    few = ctx.call(ctx.fixtures["jpeg_zip"], members="jpeg", keys=picked, return_key=True)
    if len(few) != 2 or few[0][2] != picked[0]:
        raise PartFailed(f"with keys={picked!r} the dataset must hold those 2 keys in that order")
    return f"len() is {len(ds)}; items are (image, label, key); keys= selects and orders"


def _zip_read_epoch(ctx: Context, members: str) -> str:
    samples = ctx.fixtures["samples" if members == "jpeg" else "raw_samples"]
    ds = ctx.call(ctx.fixtures[f"{members}_zip"], members=members, return_key=True)
    records = collect_epoch(make_loader(ctx, ds, batch_size=32), len(samples), "pixels")
    return audit_records(records, samples, ctx.fixtures["pixels"])


def _zip_self_contained(ctx: Context) -> str:
    samples = ctx.fixtures["samples"][:24]
    empty = ctx.scratch("no-data")
    previous = os.environ.get(paths.DATA_ENV_VAR)
    os.environ[paths.DATA_ENV_VAR] = str(empty)
    try:
        ds = ctx.call(ctx.fixtures["jpeg_zip"], members="jpeg", keys=[s.key for s in samples], return_key=True)
        records = collect_epoch(make_loader(ctx, ds, batch_size=8), len(samples), "pixels")
    finally:
        if previous is None:
            del os.environ[paths.DATA_ENV_VAR]
        else:
            os.environ[paths.DATA_ENV_VAR] = previous
    audit_records(records, samples, ctx.fixtures["pixels"])
    return "reads labels and images from the archive alone"


register(
    "zip_dataset",
    "02_zip_packing",
    "a map-style Dataset reading images and labels back from a zip (one process)",
    "ZipImageDataset(zip_path, members='jpeg', keys=None, return_key=False): item i is (image, label[, key]); "
    "<key>.jpg members through standard_transform, <key>.raw members through pixels_to_tensor; labels from the "
    "archive's labels.csv; keys=None means every key of labels.csv, in order",
    _zip_read_fixtures,
    [
        ("items", "len() and items (image, label, key); keys= selects and orders",
         "read labels.csv from the archive in __init__ and keep its keys (or the keys given) in a list", _zip_read_items),
        ("jpeg_epoch", "<key>.jpg members: labels and pixels match the manifest",
         "archive.read(f'{key}.jpg') gives the JPEG bytes; pass them to standard_transform",
         functools.partial(_zip_read_epoch, members="jpeg")),
        ("raw_epoch", "<key>.raw members: pixels bit-identical to the standard transform of the JPEG",
         "pixels_to_tensor(raw bytes) reshapes to 256x256x3 uint8 (height, width, channels) and converts",
         functools.partial(_zip_read_epoch, members="raw")),
        ("self_contained", "works without the image folder: labels come from the archive",
         "take labels from the archive's labels.csv, not from packlab.data or the data folder", _zip_self_contained),
    ],
)

"""Pack the JPEG folder into archives: ZIP files, raw-pixel folders and tar shards.

Three kinds of member, and why they matter for timing:

* ``members="jpeg"`` stores the original encoded bytes (``<key>.jpg``). Reading one back
  still needs a JPEG decode and a resize. Comparing it with the folder isolates the
  effect of *packing* (one open file instead of thousands).
* ``members="raw"`` stores pixels already decoded and resized to 256x256 (``<key>.raw``,
  uint8, height x width x RGB, see :data:`packlab.transforms.RAW_SHAPE`). Reading one back
  skips decode and resize: that is the effect of *preprocessing once, offline*, and it
  costs several times the disk space.
* Tar shards follow the WebDataset convention: the files of one sample share a key and
  differ by extension (``000123.jpg``, ``000123.cls``) and sit next to each other, which is
  all a streaming reader needs. Samples are shuffled *before* they are cut into shards and
  written in that shuffled order, because a shuffle buffer at read time cannot repair
  shards whose samples arrive grouped by class. (Sorting a shard by name would keep each
  sample's files together too, but wherever keys encode the class, as ImageNet's
  ``n01440764_10026`` do, it would group the classes again.)

Every writer writes to a temporary name and renames when done, so an interrupted run
never leaves a half-written archive under the final name.
"""

from __future__ import annotations

import contextlib
import io
import math
import multiprocessing
import os
import re
import tarfile
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from packlab import cpus, data, paths
from packlab.transforms import decode_and_resize

MEMBER_KINDS = ("jpeg", "raw")
#: Images a decoding process takes at a time when raw members are made (``Pool.imap``'s chunks).
RAW_CHUNK = 16
COMPRESSIONS = {"stored": zipfile.ZIP_STORED, "deflated": zipfile.ZIP_DEFLATED}
#: The name inside every zip that holds its labels (``key,label``), so an archive is self-contained.
ZIP_LABELS_MEMBER = "labels.csv"


def member_name(key: str, members: str) -> str:
    """Archive member name for a sample: ``000123.jpg`` or ``000123.raw``."""
    if members not in MEMBER_KINDS:
        raise ValueError(f"members must be one of {MEMBER_KINDS}, got {members!r}")
    return f"{key}.jpg" if members == "jpeg" else f"{key}.raw"


def _select(samples: Sequence[data.Sample] | None, root: Path | None) -> list[data.Sample]:
    return list(samples) if samples is not None else data.load_manifest(root)


def _raw_pixels(job: tuple[str, str]) -> bytes:
    path, key = job
    with open(path, "rb") as f:
        return decode_and_resize(f.read(), source=path).tobytes()


def iter_member_bytes(
    samples: Sequence[data.Sample],
    members: str,
    root: Path | None = None,
    workers: int | None = None,
) -> Iterator[bytes]:
    """Yield each sample's member bytes, in order.

    ``jpeg`` members are the files as they are; ``raw`` members are decoded and resized in
    a pool of ``workers`` processes (default: the cores, but no more than the chunks of
    ``RAW_CHUNK`` images), since that is the slow part.
    """
    member_name("x", members)  # validates
    jobs = [(str(data.image_path(s.key, root)), s.key) for s in samples]
    if members == "jpeg":
        for path, _ in jobs:
            with open(path, "rb") as f:
                yield f.read()
        return
    workers = workers or cpus.workers_for(math.ceil(len(jobs) / RAW_CHUNK))  # a process takes whole chunks
    if workers == 1:
        yield from map(_raw_pixels, jobs)
        return
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    with multiprocessing.get_context(method).Pool(workers) as pool:
        yield from pool.imap(_raw_pixels, jobs, chunksize=RAW_CHUNK)


def _progress(iterable: Iterable, total: int, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit="img", disable=not enabled)


def write_zip(
    dst: Path | str,
    *,
    members: str = "jpeg",
    compression: str = "stored",
    samples: Sequence[data.Sample] | None = None,
    root: Path | None = None,
    progress: bool = True,
) -> Path:
    """Pack samples (default: the whole manifest) into one zip file at ``dst``.

    ``compression`` is ``"stored"`` (no compression: members can be read with one seek and
    one read) or ``"deflated"`` (zlib; JPEG bytes barely shrink, raw pixels do). The archive
    also holds ``labels.csv`` so it can be read without the original folder.
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {sorted(COMPRESSIONS)}, got {compression!r}")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    samples = _select(samples, root)
    tmp = dst.with_name(f"{dst.name}.partial-{os.getpid()}")
    def fixed_time(name: str) -> zipfile.ZipInfo:
        # A fixed timestamp on every member, labels.csv included, makes archives byte-identical from run to run
        # (writestr with a bare name stamps the current time, which differs when a second boundary falls between).
        info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
        info.compress_type = COMPRESSIONS[compression]
        return info

    with zipfile.ZipFile(tmp, "w", compression=COMPRESSIONS[compression]) as archive:
        labels = fixed_time(ZIP_LABELS_MEMBER)
        labels.external_attr = 0o600 << 16  # what writestr gives a bare name: a plain file, rw for its owner
        archive.writestr(labels, "key,label\n" + "".join(f"{s.key},{s.label}\n" for s in samples))
        payloads = iter_member_bytes(samples, members, root)
        for sample, payload in _progress(zip(samples, payloads), len(samples), f"zip ({members}, {compression})", progress):
            archive.writestr(fixed_time(member_name(sample.key, members)), payload)
    os.replace(tmp, dst)
    return dst


def write_raw_folder(
    dst: Path | str,
    *,
    samples: Sequence[data.Sample] | None = None,
    root: Path | None = None,
    progress: bool = True,
    from_zip: Path | str | None = None,
) -> Path:
    """Write one ``<key>.raw`` file of resized pixels per sample into folder ``dst``.

    This is preprocessing without packing: as many files as the JPEG folder, but no
    decode or resize left to do when reading. With ``from_zip``, a zip of ``raw`` members
    (:func:`write_zip`), the pixels are copied out of it instead of decoded again: the
    same bytes, without the decode that is the slow part.
    """
    dst = Path(dst)
    samples = _select(samples, root)
    tmp = dst.with_name(f"{dst.name}.partial-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        if from_zip is None:
            payloads = iter_member_bytes(samples, "raw", root)
        else:
            archive = stack.enter_context(zipfile.ZipFile(from_zip))
            payloads = (archive.read(member_name(s.key, "raw")) for s in samples)
        for sample, payload in _progress(zip(samples, payloads), len(samples), "raw folder", progress):
            (tmp / member_name(sample.key, "raw")).write_bytes(payload)
    if dst.exists():
        import shutil

        shutil.rmtree(dst)
    os.replace(tmp, dst)
    return dst


# ------------------------------------------------------------------------ tar shards

_TAR_BLOCK = 512
_TAR_RECORD = tarfile.RECORDSIZE  # archives are padded to whole records of 20 blocks


def tar_member_size(nbytes: int) -> int:
    """Bytes a member of ``nbytes`` takes in a ustar archive: one header block plus padded data."""
    return _TAR_BLOCK + -(-nbytes // _TAR_BLOCK) * _TAR_BLOCK


def tar_archive_size(member_bytes: int) -> int:
    """Size on disk of an archive whose members take ``member_bytes`` (see :func:`tar_member_size`).

    Two zero blocks mark the end, and the whole is padded to a multiple of the record size.
    """
    return -(-(member_bytes + 2 * _TAR_BLOCK) // _TAR_RECORD) * _TAR_RECORD


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    # Fixed owner, mode and time: the same samples always give byte-identical shards.
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    info.mtime = 0
    info.uname = info.gname = ""
    return info


def shuffled(samples: Sequence[data.Sample], seed: int) -> list[data.Sample]:
    """The samples in the order :func:`write_tar_shards` writes them with ``shuffle=True``."""
    order = np.random.default_rng(seed).permutation(len(samples))
    return [samples[i] for i in order]


def tar_member_names(sample: data.Sample) -> list[str]:
    """A sample's members in a shard, in the order they are written: ``<key>.cls``, ``<key>.jpg``."""
    return [f"{sample.key}.cls", f"{sample.key}.jpg"]


def write_tar_shards(
    dst_dir: Path | str,
    *,
    samples: Sequence[data.Sample] | None = None,
    root: Path | None = None,
    shuffle: bool = True,
    seed: int = 0,
    maxcount: int = 1000,
    maxsize: int | None = None,
    prefix: str = "shard",
    progress: bool = True,
) -> list[Path]:
    """Write samples as WebDataset-style tar shards ``<prefix>-000000.tar, ...`` in ``dst_dir``.

    Each sample becomes ``<key>.cls`` (the label as decimal text) followed by ``<key>.jpg``
    (the original JPEG bytes), adjacent. With ``shuffle`` (the default) the sample order is
    permuted with ``seed`` first; either way the samples are written in that order, never
    re-sorted, so a shard holds them in the shuffled order (or, with ``shuffle=False``, in
    the order of ``samples``). A new shard starts
    when the current one holds ``maxcount`` samples or another sample would push it past
    ``maxsize`` bytes. Old shards with the same prefix in ``dst_dir`` are removed first.
    Returns the shard paths; :func:`brace_pattern` turns them into ``shard-{000000..000009}.tar``.
    """
    if maxcount < 1:
        raise ValueError("maxcount must be at least 1")
    dst_dir = Path(dst_dir)
    dst_dir.mkdir(parents=True, exist_ok=True)
    samples = _select(samples, root)
    if shuffle:
        samples = shuffled(samples, seed)

    groups: list[list[data.Sample]] = [[]]
    size = 0  # member bytes in the current shard
    for sample in samples:
        need = tar_member_size(len(str(sample.label))) + tar_member_size(sample.bytes)
        if maxsize is not None and tar_archive_size(need) > maxsize:
            raise ValueError(
                f"sample {sample.key} alone makes a {tar_archive_size(need)}-byte shard, more than maxsize={maxsize}"
            )
        current = groups[-1]
        if current and (len(current) >= maxcount or (maxsize is not None and tar_archive_size(size + need) > maxsize)):
            groups.append([])
            size = 0
        groups[-1].append(sample)
        size += need
    if not groups[-1]:
        groups.pop()

    for old in dst_dir.glob(f"{prefix}-*.tar"):
        old.unlink()
    written = []
    bar = _progress(None, len(samples), "tar shards", progress)
    for index, group in enumerate(groups):
        path = dst_dir / f"{prefix}-{index:06d}.tar"
        tmp = path.with_name(f"{path.name}.partial-{os.getpid()}")
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
            for sample in group:  # in the order given: re-sorting by key could regroup classes
                label = str(sample.label).encode()
                cls_name, jpg_name = tar_member_names(sample)
                tar.addfile(_tarinfo(cls_name, len(label)), io.BytesIO(label))
                with open(data.image_path(sample.key, root), "rb") as f:
                    tar.addfile(_tarinfo(jpg_name, sample.bytes), f)
                bar.update()
        os.replace(tmp, path)
        written.append(path)
    bar.close()
    return written


def brace_pattern(shard_paths: Sequence[Path | str]) -> str:
    """Compress consecutive shard names into one brace pattern.

    ``[.../shard-000000.tar, ..., .../shard-000009.tar]`` becomes
    ``.../shard-{000000..000009}.tar``, the form ``webdataset`` and the ``braceexpand``
    package expand back into the list.
    """
    if not shard_paths:
        raise ValueError("no shards given")
    names = [str(p) for p in shard_paths]
    match = [re.fullmatch(r"(.*-)(\d+)(\.tar)", n) for n in names]
    if not all(match):
        raise ValueError("shard names must look like <prefix>-<digits>.tar")
    head, first, tail = match[0].groups()
    width = len(first)
    numbers = [int(m.group(2)) for m in match]
    consecutive = numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    if not consecutive or any(m.group(1) != head or len(m.group(2)) != width for m in match):
        raise ValueError("shards must be consecutively numbered with one prefix")
    if len(names) == 1:
        return names[0]
    return f"{head}{{{numbers[0]:0{width}d}..{numbers[-1]:0{width}d}}}{tail}"


def expand_pattern(pattern: str) -> list[str]:
    """Expand a brace pattern such as ``shard-{000000..000009}.tar`` into shard names."""
    import braceexpand

    return list(braceexpand.braceexpand(pattern))


# ------------------------------------------------------------ cached course artefacts


def _fresh(target: Path, root: Path | None) -> bool:
    """True when ``target`` exists and was written after the dataset's manifest."""
    manifest = paths.manifest_path(root)
    return target.exists() and manifest.exists() and target.stat().st_mtime >= manifest.stat().st_mtime


def ensure_zip(
    members: str = "jpeg", compression: str = "stored", root: Path | None = None, progress: bool = True
) -> Path:
    """The course's zip of the whole dataset with these settings, written once and then reused.

    Lives at ``<data root>/packed/images-<members>-<compression>.zip``; rewritten when the
    dataset was regenerated after it. Chapters call this so each can run on its own.
    """
    target = paths.packed_dir(root) / f"images-{members}-{compression}.zip"
    if not _fresh(target, root):
        write_zip(target, members=members, compression=compression, root=root, progress=progress)
    return target


def ensure_raw_folder(root: Path | None = None, progress: bool = True) -> Path:
    """The course's folder of pre-resized raw pixels (one file per sample), written once and reused.

    Copied out of the course's raw-pixel zip when that one is up to date (chapter 2 writes
    it first), so that the images are decoded once for both copies.
    """
    target = paths.packed_dir(root) / "raw-folder"
    if not _fresh(target, root):
        raw_zip = paths.packed_dir(root) / "images-raw-stored.zip"
        write_raw_folder(target, root=root, progress=progress, from_zip=raw_zip if _fresh(raw_zip, root) else None)
    return target


#: How many tar shards the course cuts its dataset into, whatever its size: enough for the
#: chapters' readers (two ranks of two workers, chapter 6) at 10,000 images and in the
#: small-data mode alike.
COURSE_SHARDS = 10


def course_shard_size(count: int, shards: int = COURSE_SHARDS) -> int:
    """Samples per shard that cut ``count`` samples into ``shards`` shards (the last one may be shorter).

    1,000 for the full 10,000 images, 200 for the small-data mode's 2,000: a fixed
    ``maxcount`` would give the small dataset two shards, fewer than chapter 6's four readers.
    """
    return max(1, -(-count // shards))


def ensure_tar_shards(
    name: str = "shards", maxcount: int | None = None, seed: int = 0, root: Path | None = None, progress: bool = True
) -> list[Path]:
    """The course's shuffled tar shards of the whole dataset in ``<data root>/packed/<name>/``, written once.

    ``maxcount`` defaults to :func:`course_shard_size` of the dataset: :data:`COURSE_SHARDS`
    shards whatever its size. Rewritten when the dataset is newer, the shard count no longer
    matches ``maxcount``, or the first shard does not hold what :func:`write_tar_shards`
    writes today (shards written by an older version of the course, say).
    """
    folder = paths.packed_dir(root) / name
    manifest = data.load_manifest(root)
    maxcount = maxcount or course_shard_size(len(manifest))
    expected = -(-len(manifest) // maxcount)
    existing = sorted(folder.glob("shard-*.tar"))
    if (
        len(existing) != expected
        or not all(_fresh(p, root) for p in existing)
        or _member_names(existing[0]) != [n for s in shuffled(manifest, seed)[:maxcount] for n in tar_member_names(s)]
    ):
        existing = write_tar_shards(folder, root=root, maxcount=maxcount, seed=seed, progress=progress)
    return existing


def _member_names(shard: Path) -> list[str]:
    """Member names of a shard, in archive order, from its headers (tarfile seeks past the data)."""
    try:
        with tarfile.open(shard, mode="r:") as tar:
            return tar.getnames()
    except (tarfile.TarError, OSError):
        return []

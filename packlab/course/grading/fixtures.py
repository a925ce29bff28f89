"""What several checks share: cached fixture archives, reference digests, DataLoaders with
time limits, collecting and auditing an epoch, and looking for open handles.

Fixture archives are written by the reference writers of :mod:`packlab.pack` (never the
candidate's) and cached under ``<data root>/packed/grading/<manifest digest>/``, so a
check pays for them once per dataset.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import hashlib
import io
import json
import os
import pickle
import struct
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from packlab import audit, data, pack, paths
from packlab.course.grading.core import Context, PartFailed, describe
from packlab.transforms import RAW_SHAPE


# ----------------------------------------------------------------- fixtures and references


#: Raised whenever the reference writers change what they write (2: tar shards keep the
#: shuffled order instead of sorting by key), so archives cached by an older course are
#: not read as if the current writers had made them.
FIXTURE_LAYOUT = 2


def fixture_root() -> Path:
    """Where checks cache the archives they read: one folder per dataset version and fixture layout."""
    return paths.packed_dir() / "grading" / f"{data.sha256_file(paths.manifest_path())[:12]}-v{FIXTURE_LAYOUT}"


@contextlib.contextmanager
def locked(folder: Path):
    """Hold an exclusive lock on ``folder`` so concurrent checks do not write one fixture twice.

    A folder on a read-only file system (the gradebook's sandbox, where the grader wrote
    the fixtures beforehand) needs no lock: nobody can write there.
    """
    folder.mkdir(parents=True, exist_ok=True)
    try:
        handle = open(folder / ".lock", "w")
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES):
            raise
        yield
        return
    with handle:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except ImportError:  # Windows: no locking, fixtures are still written atomically
            pass
        yield


def subset(count: int, seed: int) -> list[data.Sample]:
    """A fixed random subset of the manifest (sorted by key): the samples a check reads."""
    manifest = data.load_manifest()
    chosen = np.random.default_rng(seed).choice(len(manifest), size=count, replace=False)
    return [manifest[i] for i in sorted(chosen)]


def fixture_zip(name: str, samples: Sequence[data.Sample], members: str) -> Path:
    """A zip of ``samples`` written by the reference :func:`packlab.pack.write_zip`, cached."""
    root = fixture_root()
    target = root / f"{name}.zip"
    with locked(root):
        if not target.exists():
            pack.write_zip(target, members=members, samples=samples, progress=False)
    return target


def fixture_shards(name: str, samples: Sequence[data.Sample], maxcount: int) -> list[Path]:
    """Tar shards of ``samples`` written by the reference :func:`packlab.pack.write_tar_shards`, cached."""
    root = fixture_root()
    folder = root / name
    done = folder / ".complete"
    with locked(root):
        if not done.exists():
            pack.write_tar_shards(folder, samples=samples, maxcount=maxcount, seed=0, progress=False)
            done.touch()
    return sorted(folder.glob("shard-*.tar"))


#: The class-sorted fixture of exercise 12: training samples, held-out samples, samples per shard.
CLASS_SORTED = {"train": 1000, "holdout": 500, "maxcount": 25, "seed": 12}


def class_sorted_shards() -> tuple[list[Path], list[data.Sample], list[data.Sample]]:
    """Tar shards of 1,000 samples written sorted by class (25 per shard), cached; with those samples (in class
    order) and 500 others held out to measure a model's accuracy on."""
    chosen = subset(CLASS_SORTED["train"] + CLASS_SORTED["holdout"], seed=CLASS_SORTED["seed"])
    train = sorted(chosen[::3] + chosen[1::3], key=lambda s: (s.label, s.key))[: CLASS_SORTED["train"]]
    kept = {s.key for s in train}
    holdout = [s for s in chosen if s.key not in kept]
    root = fixture_root()
    folder = root / "class-sorted-1000-25"
    done = folder / ".complete"
    with locked(root):
        if not done.exists():
            pack.write_tar_shards(folder, samples=train, maxcount=CLASS_SORTED["maxcount"], shuffle=False, progress=False)
            done.touch()
    return sorted(folder.glob("shard-*.tar")), train, holdout


def shard_of_key(shards: Sequence[Path]) -> dict[str, int]:
    """Which shard (by its position in ``shards``) holds each sample key."""
    out = {}
    for index, path in enumerate(shards):
        with tarfile.open(path) as tar:
            out.update({Path(name).stem: index for name in tar.getnames()})
    return out


def reference_pixels(keys: Sequence[str]) -> dict[str, str]:
    """Pixel digests of the standard transform of each key's original (see :mod:`packlab.audit`), cached."""
    root = fixture_root()
    cache = root / "reference-digests.json"
    with locked(root):
        known = json.loads(cache.read_text()) if cache.exists() else {}
        missing = [k for k in keys if k not in known]
        if missing:
            known.update(audit.reference_digests(missing))
            partial = cache.with_suffix(".partial")
            partial.write_text(json.dumps(known, sort_keys=True))
            os.replace(partial, cache)
    return {k: known[k] for k in keys}


def sha256_transform(data: bytes, source: str | None = None) -> torch.Tensor:
    """A transform the checks pass instead of the standard one: the SHA-256 of the bytes, as 32 uint8.

    The manifest holds each JPEG's SHA-256, so this verifies every byte of every sample
    without the cost of decoding it.
    """
    return torch.frombuffer(bytearray(hashlib.sha256(data).digest()), dtype=torch.uint8)


def _candidate_descriptors() -> list[int]:
    """The descriptors this process may have open: listed by the kernel where it can, else every number up to the limit.

    Linux lists them in ``/proc/self/fd``, macOS (and the BSDs) in ``/dev/fd``; elsewhere
    every number below the soft limit on open files (at most 4,096) is a candidate, and
    :func:`descriptors_on` asks each one.
    """
    for listing in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return sorted(int(entry) for entry in os.listdir(listing) if entry.isdigit())
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):
        limit = 256
    return list(range(min(limit if limit > 0 else 4096, 4096)))


def descriptors_on(path, candidates: list[int] | None = None) -> list[int]:
    """The descriptors of this process open on the file at ``path``: same device and inode, whatever the path.

    ``os.fstat`` works on every platform, so this answers the same on Linux and on macOS
    (where there is no ``/proc``), for a file opened under any name (a relative path, a
    symbolic link). ``candidates`` defaults to :func:`_candidate_descriptors`.
    """
    try:
        wanted = os.stat(path)
    except OSError:
        return []
    found = []
    for fd in _candidate_descriptors() if candidates is None else candidates:
        try:
            info = os.fstat(fd)
        except OSError:
            continue
        if (info.st_dev, info.st_ino) == (wanted.st_dev, wanted.st_ino):
            found.append(fd)
    return found


def cut_inherited_handles(path: str, worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: point every descriptor inherited on ``path`` at /dev/null.

    Runs first thing in each worker. A dataset that opens its own handle in the worker is
    unaffected; one that reads through a handle opened in the parent now fails on its first
    read instead of only when two workers' reads happen to collide. The descriptors are
    found by what they point at (:func:`descriptors_on`), on Linux, macOS and elsewhere.
    """
    inherited = descriptors_on(path)
    if not inherited:
        return
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        for fd in inherited:
            if fd != null:
                os.dup2(null, fd)
    finally:
        os.close(null)


def open_handles(path: Path) -> int:
    """How many descriptors this process holds on the file at ``path`` (see :func:`descriptors_on`)."""
    return len(descriptors_on(path))


def open_handle_attributes(obj) -> list[str]:
    """Attributes of ``obj`` (or values inside its dicts and lists) that are open files or ZipFiles."""

    def is_open(value) -> bool:
        if isinstance(value, zipfile.ZipFile):
            return value.fp is not None
        if isinstance(value, tarfile.TarFile):
            return not value.closed
        return isinstance(value, io.IOBase) and not value.closed

    found = []
    for name, value in vars(obj).items():
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        if any(is_open(v) for v in values):
            found.append(name)
    return found


# ------------------------------------------------------------------- epochs and audits


@dataclass(frozen=True)
class WorkerStartup:
    """Where spawn workers announce that they are up, how many, and how long they may take."""

    folder: Path
    workers: int
    limit: float


def make_loader(ctx: Context, dataset, workers: int = 0, method: str | None = None, **kwargs) -> DataLoader:
    """A DataLoader as the checks use it: explicit start method and a timeout whenever workers run.

    The DataLoader's ``timeout`` limits the wait for each batch, the first one included. A
    ``spawn`` (or ``forkserver``) worker must first start a Python interpreter, import
    torch and unpickle the dataset, which on a busy machine can take longer than any
    sensible limit for a batch. So such workers announce when they are up (see
    :func:`collect_epoch`), and their start-up is limited separately by
    ``ctx.startup_timeout``.
    """
    kwargs.setdefault("batch_size", 16)
    if not workers:
        return DataLoader(dataset, **kwargs)
    method = method or "fork"
    kwargs.update(num_workers=workers, multiprocessing_context=method, timeout=ctx.loader_timeout)
    if method == "fork":
        return DataLoader(dataset, **kwargs)
    ready = ctx.scratch("workers-up")
    kwargs["worker_init_fn"] = functools.partial(announce_ready, str(ready), kwargs.get("worker_init_fn"))
    loader = DataLoader(dataset, **kwargs)
    loader.packlab_startup = WorkerStartup(ready, workers, ctx.startup_timeout)
    return loader


def announce_ready(folder: str, init, worker_id: int) -> None:
    """``worker_init_fn`` of spawn workers: run the check's own ``init``, then say this worker is up."""
    if init is not None:
        init(worker_id)
    Path(folder, f"worker-{worker_id}").touch()


def wait_for_workers(loader, iterator) -> None:
    """Wait until the spawn workers of ``iterator`` are up (see :func:`make_loader`).

    Returns at once for other loaders, and when a worker has died: asking the iterator
    for a batch then reports the worker's error.
    """
    startup = getattr(loader, "packlab_startup", None)
    if startup is None:
        return
    start = time.monotonic()
    while sum(1 for _ in startup.folder.iterdir()) < startup.workers:
        if any(not worker.is_alive() for worker in getattr(iterator, "_workers", [])):
            return
        if time.monotonic() - start > startup.limit:
            raise PartFailed(
                f"the {startup.workers} spawn workers did not start within {startup.limit:.0f} s. Each is a new Python "
                "process that imports torch and the module of your class: a few seconds on an idle machine, minutes on "
                "a very busy one. Run the check again when the machine is quieter, or allow more time with "
                "check(..., startup_timeout=300)."
            )
        time.sleep(0.05)


def collect_epoch(loader, expected: int, digest: str) -> list[tuple[str, int, str]]:
    """One epoch as ``(key, label, digest)`` records; ``digest`` is ``"pixels"`` or ``"sha256"``.

    Stops with a failure when the loader delivers more than three times the samples that
    exist, so an endless iterable cannot run forever.
    """
    records = []
    limit = 3 * expected + 64
    iterator = None
    try:
        iterator = iter(loader)
        wait_for_workers(loader, iterator)
        for batch in iterator:
            if not (isinstance(batch, (tuple, list)) and len(batch) == 3):
                raise PartFailed(
                    "with return_key=True every sample must be (image, label, key), so batches are "
                    f"(images, labels, keys); a batch was a {type(batch).__name__}"
                    + (f" of {len(batch)} items" if isinstance(batch, (tuple, list)) else "")
                )
            images, labels, keys = batch
            if not (isinstance(labels, torch.Tensor) and not labels.is_floating_point() and labels.dim() == 1):
                raise PartFailed(
                    f"labels were collated into {type(labels).__name__}"
                    + (f" of {type(labels[0]).__name__}" if isinstance(labels, (list, tuple)) and labels else "")
                    + "; return each label as an int so the DataLoader makes a tensor of them"
                )
            for i, key in enumerate(keys):
                records.append((str(key), int(labels[i]), image_digest(images[i], digest)))
            if len(records) > limit:
                raise PartFailed(f"the epoch delivered more than {limit} samples ({expected} exist) and did not end")
    except PartFailed:
        stop_workers(iterator)
        raise
    except Exception as exc:
        stop_workers(iterator)
        raise PartFailed(f"reading an epoch raised {describe(exc)}") from exc
    return records


def stop_workers(iterator) -> None:
    """Stop the workers of an epoch that failed, at once.

    Left to itself, a DataLoader iterator whose workers raised waits up to five seconds
    per worker when it is cleaned up, and the clean-up may even run later in another
    process (a worker forked afterwards inherits the failed iterator), which then
    complains. Killing the workers and shutting the iterator down here avoids both.
    """
    workers = getattr(iterator, "_workers", None)
    if not workers:
        return
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.kill()
    with contextlib.suppress(Exception):
        iterator._shutdown_workers()


def image_digest(image, kind: str) -> str:
    if kind == "pixels":
        if not isinstance(image, torch.Tensor) or tuple(image.shape) != (3, RAW_SHAPE[0], RAW_SHAPE[1]):
            raise PartFailed(
                f"images must be 3x{RAW_SHAPE[0]}x{RAW_SHAPE[1]} tensors (the standard transform), got "
                f"{type(image).__name__} {tuple(getattr(image, 'shape', ()))}"
            )
        return audit.tensor_digest(image)
    if not (isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and tuple(image.shape) == (32,)):
        raise PartFailed(
            f"the check passed transform={sha256_transform.__name__} and got back "
            f"{type(image).__name__} {tuple(getattr(image, 'shape', ()))} instead of its 32-byte digest: "
            "apply the transform given to the constructor to the encoded bytes, in place of the default"
        )
    return bytes(image.numpy()).hex()


def audit_records(records, expected: Sequence[data.Sample], reference: dict[str, str], workers: int = 0) -> str:
    """Audit one epoch; return a success message or raise :class:`PartFailed` with the report."""
    report = audit.audit_epoch(records, expected, reference)
    if report.ok:
        return f"{len(records)} samples, each exactly once, labels and contents match the manifest"
    message = report.summary()
    counts = set(report.duplicated.values())
    if workers > 1 and counts == {workers} and not report.missing:
        message += f"\n(every sample arrived {workers} times, once per worker: the workers do not split the work)"
    raise PartFailed(message)


def preflight_spawn(dataset) -> None:
    """Do here, at once, what each spawn worker will do: unpickle a copy, then read one sample.

    Starting spawn workers takes seconds (each imports torch); a dataset that cannot be
    pickled, or cannot read at all, is reported without that wait and with a clearer message.
    """
    try:
        copy = pickle.loads(pickle.dumps(dataset))
    except Exception as exc:
        raise PartFailed(f"spawn workers receive a pickled copy of the dataset, but pickling it raised {describe(exc)}") from None
    try:
        if isinstance(copy, torch.utils.data.IterableDataset):
            samples = iter(copy)
            next(samples)
            if hasattr(samples, "close"):
                samples.close()
        else:
            copy[0]
    except Exception as exc:
        raise PartFailed(f"a pickled copy of the dataset could not read its first sample: {describe(exc)}") from None


def sha_reference(samples: Sequence[data.Sample]) -> dict[str, str]:
    return {s.key: s.sha256 for s in samples}


def check_item(item, with_key: bool, key: str | None = None) -> None:
    """One dataset item: (image, label) or (image, label, key), image a standard 3x256x256 float tensor."""
    size = 3 if with_key else 2
    if not (isinstance(item, tuple) and len(item) == size):
        kind = f"{type(item).__name__} of {len(item)}" if isinstance(item, (tuple, list)) else type(item).__name__
        raise PartFailed(f"an item must be a tuple (image, label{', key' if with_key else ''}); got a {kind}")
    image, label = item[0], item[1]
    if not (isinstance(image, torch.Tensor) and image.dtype == torch.float32 and tuple(image.shape) == (3, 256, 256)):
        raise PartFailed(
            f"the image must be a float32 tensor of shape (3, 256, 256); got {type(image).__name__} "
            f"{getattr(image, 'dtype', '')} {tuple(getattr(image, 'shape', ()))}"
        )
    is_int = isinstance(label, (int, np.integer)) and not isinstance(label, bool)
    is_int = is_int or (isinstance(label, torch.Tensor) and label.dim() == 0 and not label.is_floating_point())
    if not is_int:
        raise PartFailed(f"the label must be an int; got {type(label).__name__} {label!r}")
    if with_key and key is not None and item[2] != key:
        raise PartFailed(f"expected key {key!r} for this index, got {item[2]!r}")



# ------------------------------------------------------------- watching a writer at work


#: inotify event bits (linux/inotify.h) the writer checks listen for.
IN_MODIFY, IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE = 0x2, 0x40, 0x80, 0x100
IN_Q_OVERFLOW = 0x4000


class FolderEvents:
    """What happened to the names in one folder while a writer ran, as Linux reported it (inotify).

    Used as a context manager around the writer's call; afterwards :meth:`names_written`
    says which names were created or written in place, and :meth:`names_renamed_in` which
    arrived by a rename. A file that appears by ``os.replace`` of a finished temporary
    file is only ever *renamed in*: a reader never sees it half-written. One created or
    written in place (by the writer, by ``shutil.copy``, by ``shutil.move`` from another
    filesystem) was visible while incomplete. ``available`` is False where inotify does
    not exist (not Linux), and when the kernel's queue overflowed: then nothing is known.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.events: list[tuple[int, str]] = []
        self.available = False
        self._fd = -1

    def __enter__(self) -> FolderEvents:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return self
            mask = IN_MODIFY | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
            if libc.inotify_add_watch(fd, os.fsencode(self.folder), mask) < 0:
                os.close(fd)
                return self
        except (OSError, AttributeError, TypeError):  # no inotify here (not Linux)
            return self
        self._fd, self.available = fd, True
        return self

    def __exit__(self, *exc_info) -> None:
        if self._fd < 0:
            return
        try:
            while True:
                try:
                    chunk = os.read(self._fd, 1 << 16)
                except BlockingIOError:
                    break
                self._parse(chunk)
        finally:
            os.close(self._fd)
            self._fd = -1

    def _parse(self, chunk: bytes) -> None:
        offset = 0
        while offset + 16 <= len(chunk):
            _, mask, _, length = struct.unpack_from("iIII", chunk, offset)
            name = chunk[offset + 16 : offset + 16 + length].split(b"\0", 1)[0].decode(errors="replace")
            offset += 16 + length
            if mask & IN_Q_OVERFLOW:
                self.available = False
            self.events.append((mask, name))

    def names_written(self) -> set[str]:
        """Names created, or written to, in the folder (a file merely opened for writing and closed is not counted)."""
        return {name for mask, name in self.events if mask & (IN_CREATE | IN_MODIFY)}

    def names_renamed_in(self) -> set[str]:
        return {name for mask, name in self.events if mask & IN_MOVED_TO}


def folder_on_another_filesystem(than: Path) -> Path | None:
    """A new empty folder on a filesystem other than ``than``'s (``/dev/shm``, the data folder, ...), or None."""
    device = os.stat(than).st_dev
    for candidate in (Path("/dev/shm"), paths.packed_dir(), Path.home(), Path("/var/tmp"), Path.cwd()):
        try:
            if candidate.is_dir() and os.stat(candidate).st_dev != device and os.access(candidate, os.W_OK):
                return Path(tempfile.mkdtemp(prefix="packlab-check-", dir=candidate))
        except OSError:
            continue
    return None

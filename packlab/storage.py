"""Make slow storage visible on a laptop: cold reads, and a network-filesystem latency model.

On a local SSD with the files in the page cache (the usual state on a workstation after
the first epoch), one open and one read per image cost microseconds, and packing many
small files into a few big ones seems to make no difference. Training data rarely lives
there. Two tools to see what changes when storage is slow:

**Cold reads.** :func:`make_cold` makes the next read of some files come from the disk,
at one of two levels (:data:`COLD_LEVELS`), and :func:`cold_levels` says which this
process can use:

* ``"data pages"``: the files' cached bytes are dropped
  (``posix_fadvise(POSIX_FADV_DONTNEED)``; Linux, no root needed for files you can open).
  The kernel's caches of directory entries (dentries) and inodes are left as they were,
  so ``open`` and ``stat`` still answer from memory: only the *reads* are cold. Pages
  that another process keeps mapped, or that are dirty, stay cached.
* ``"all caches"``: ``sync``, then ``3`` written to ``/proc/sys/vm/drop_caches``, which
  frees the whole machine's clean page cache and its reclaimable dentries and inodes
  (the kernel's ``Documentation/admin-guide/sysctl/vm.rst``). Now a path lookup reads
  directory blocks and an ``open`` reads the inode from the disk too. Root only, and it
  slows down everything else on the machine for a while: use it on a machine of your own
  (CI runs as root).

What a cold read costs depends entirely on the disk: an NVMe SSD serves small random
reads fast, a spinning disk or a cloud volume does not. Read in the order training reads
(shuffled, for a map-style dataset): reading files or members in order lets the
kernel's read-ahead fetch the next ones early, which a shuffled epoch does not allow.
:func:`cold_read_seconds` times one read function from a cold start.

**A latency model of a shared network filesystem.** :class:`NetworkFSModel` wraps every
file a loader opens so that, in this process, each ``open`` and each read *request*
waits as it would over a network (``time.sleep``, so no CPU is used and several
DataLoader workers wait in parallel, as real clients do). It is a model, not a
measurement; its parameters are stated, and you can set your own (see
:func:`probe_open_latency` to measure a real filesystem):

* ``open_s`` (default 2 ms) per ``open()``: looking up a path and opening the file takes
  round trips to the metadata server (NFS LOOKUP/OPEN/GETATTR, a Lustre or GPFS metadata
  request). A round trip in a data centre is a fraction of a millisecond; a metadata
  server shared by a cluster's jobs queues requests, and milliseconds per open are common.
* ``request_s`` (default 0.5 ms) per read request: one round trip to a data server.
* ``bandwidth`` (default 500 MB/s) for the bytes of each request: a share of a
  10 Gbit/s link.
* requests of at least ``min_request`` (64 KiB) and at most ``max_request`` (1 MiB): a
  client reads ahead, so many small reads of a file become one request; the read-ahead
  window doubles while reading is sequential and starts small again after a jump.

The model treats every loader the same way, because every loader reads through the
``opener`` it is given; only the pattern differs. A folder of JPEGs costs one open and
one request per image; a tar shard one open per shard and one request per MiB; a zip
member read through ``zipfile`` two requests (header, then data) and one read with
``pread`` from the central directory's offsets one (:func:`predict_reading`).

**Positional reads.** :func:`read_at` reads a byte range at an offset without using or
moving the file's offset (``os.pread``; a modelled file charges its delays for it), for
readers that must not share an offset with other processes.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

def open_local(path: str | Path) -> BinaryIO:
    """The loaders' default ``opener``: the file itself, from the local filesystem, for reading."""
    return open(path, "rb")


# ----------------------------------------------------------------- cold reads

WARM = "warm"  # nothing dropped: whatever the caches hold from earlier reads
DATA_PAGES = "data pages"
ALL_CACHES = "all caches"
#: What each level of :func:`make_cold` drops, weakest first.
COLD_LEVELS = {
    DATA_PAGES: "the files' cached pages dropped (posix_fadvise); dentries and inodes still cached",
    ALL_CACHES: "page cache, dentries and inodes dropped (sync; echo 3 > /proc/sys/vm/drop_caches)",
}
_DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def page_cache_control_available() -> bool:
    """Whether this OS lets :func:`drop_from_page_cache` work (``posix_fadvise``: Linux and some BSDs)."""
    return hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_DONTNEED")


def all_caches_control_available() -> bool:
    """Whether this process may drop every cache of the machine (root on Linux): :func:`drop_all_caches`."""
    return hasattr(os, "geteuid") and os.geteuid() == 0 and _DROP_CACHES.exists() and os.access(_DROP_CACHES, os.W_OK)


def cold_levels() -> list[str]:
    """The levels of :data:`COLD_LEVELS` that :func:`make_cold` can use in this process, weakest first."""
    available = {DATA_PAGES: page_cache_control_available(), ALL_CACHES: all_caches_control_available()}
    return [level for level in COLD_LEVELS if available[level]]


def drop_from_page_cache(files: Iterable[Path | str]) -> int:
    """Ask the kernel to drop the cached pages of ``files``; return their total size in bytes.

    Only the files' data: the dentries and inodes that let ``open`` find them stay cached.
    Raises :class:`OSError` naming the platform when it has no ``posix_fadvise``.
    """
    if not page_cache_control_available():
        raise OSError(
            "posix_fadvise is not available on this platform, so cached file pages cannot be dropped "
            "without root; cold-read measurements need Linux (or a reboot between runs)."
        )
    total = 0
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def drop_all_caches() -> None:
    """Write dirty pages out (``sync``), then drop the machine's page cache, dentries and inodes.

    Root only (Linux). Every process on the machine reads from the disk again afterwards.
    """
    if not all_caches_control_available():
        raise PermissionError(
            f"dropping every cache needs root on Linux (writing 3 to {_DROP_CACHES}); "
            f"use make_cold(files, {DATA_PAGES!r}) to drop just the files' pages instead."
        )
    os.sync()  # drop_caches only frees clean pages
    _DROP_CACHES.write_text("3\n")


def make_cold(files: Iterable[Path | str], level: str = DATA_PAGES) -> None:
    """Make the next read of ``files`` come from the disk, at ``level`` (see :data:`COLD_LEVELS`).

    ``"data pages"`` drops the files' cached bytes; ``"all caches"`` drops everything the
    kernel caches for every file of the machine (``files`` is then not needed), so
    opening a file reads its directory entry and inode from the disk too.
    """
    if level == DATA_PAGES:
        drop_from_page_cache(files)
    elif level == ALL_CACHES:
        drop_all_caches()
    else:
        raise ValueError(f"level must be one of {list(COLD_LEVELS)}, got {level!r}")


def resident_fraction(files: Iterable[Path | str]) -> float:
    """The share of ``files``' pages that are in the page cache now (0 to 1), as ``fincore`` reports it.

    Asks the kernel with ``mincore`` on a read-only mapping of each file: mapping a file
    reads nothing, and ``mincore`` only reports, so looking does not warm anything.
    Shows whether :func:`make_cold` worked: a file that another process keeps mapped (an
    open LMDB environment, say) keeps its pages whatever is dropped. Linux only.
    """
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    page = mmap.PAGESIZE
    resident = pages = 0
    for path in files:
        size = os.path.getsize(path)
        if size == 0:
            continue
        count = -(-size // page)
        fd = os.open(path, os.O_RDONLY)
        try:
            address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if address in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), f"cannot map {path} to ask which of its pages are cached")
            try:
                vector = (ctypes.c_ubyte * count)()
                if libc.mincore(address, size, vector) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore failed on {path}")
                resident += sum(v & 1 for v in vector)
                pages += count
            finally:
                libc.munmap(address, size)
        finally:
            os.close(fd)
    return resident / pages if pages else 0.0


def cold_read_seconds(read: Callable[[], object], files: Sequence[Path | str], level: str = DATA_PAGES) -> float:
    """Seconds one call of ``read()`` takes right after :func:`make_cold` (``files``, ``level``).

    Open what must be open *before* (an archive's central directory, say), inside ``read``
    what an epoch pays for each time. With ``level="warm"`` (:data:`WARM`) nothing is dropped.
    """
    if level != WARM:
        make_cold(files, level)
    start = time.perf_counter()
    read()
    return time.perf_counter() - start


# ----------------------------------------------------------- network filesystem model


class SharedLink:
    """One network link whose bandwidth every reader shares, in this process and in its DataLoader workers.

    Each transfer books the link for ``nbytes / bandwidth`` seconds after whatever is
    already booked, and waits until its booking ends: two readers that transfer at once
    each get half the bandwidth, as clients behind one node's link do. The booking lives
    in shared memory (a one-number tensor, inherited by ``fork`` workers and sent as a
    handle to ``spawn`` ones) and is changed under a lock on a small file, so every
    process sees the same link.
    """

    def __init__(self):
        import tempfile
        import weakref

        import torch

        self._booked_until = torch.zeros(1, dtype=torch.float64).share_memory_()  # time.monotonic() seconds
        handle, self._lock_path = tempfile.mkstemp(prefix="packlab-link-", suffix=".lock")
        os.close(handle)
        weakref.finalize(self, _remove_if_mine, self._lock_path, os.getpid())

    def transfer(self, seconds: float) -> None:
        """Wait for ``seconds`` of this link's time, after the transfers booked before it."""
        import fcntl

        with open(self._lock_path, "rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            now = time.monotonic()  # one clock for every process of the machine
            end = max(now, float(self._booked_until[0])) + seconds
            self._booked_until[0] = end
        time.sleep(max(0.0, end - now))


def _remove_if_mine(path: str, pid: int) -> None:
    if os.getpid() == pid:
        Path(path).unlink(missing_ok=True)


@dataclass(frozen=True)
class NetworkFSModel:
    """Per-open and per-request delays of a shared network filesystem (see the module docstring).

    ``model.open(path)`` is an ``opener``: it returns a readable, seekable binary file
    whose ``open`` and read requests wait as the model says. Pass it to a loader's
    ``opener=`` argument.

    By default ``bandwidth`` is every reader's own: two DataLoader workers each transfer
    at the full rate at once, as if each had a link of its own. ``shared_link=True`` gives
    all readers of the model one :class:`SharedLink` instead, as a node's clients share
    the node's link or their share of a busy filesystem: then two workers reading at once
    each get half.
    """

    open_s: float = 0.002
    request_s: float = 0.0005
    bandwidth: float = 500e6  # bytes per second
    min_request: int = 64 * 1024
    max_request: int = 1024 * 1024
    shared_link: bool = False

    def __post_init__(self):
        if self.shared_link:  # not a field: asdict() and comparisons leave it out
            object.__setattr__(self, "_link", SharedLink())

    def request_seconds(self, nbytes: int) -> float:
        """Modelled wait for reading ``nbytes`` in one call: round trips plus transfer time (link to itself)."""
        requests = max(1, -(-nbytes // self.max_request))
        return requests * self.request_s + nbytes / self.bandwidth

    def wait_for_request(self, nbytes: int) -> None:
        """Wait as one request of ``nbytes`` would: its round trips, then its transfer (on the shared link if any)."""
        if not self.shared_link:
            time.sleep(self.request_seconds(nbytes))
            return
        time.sleep(max(1, -(-nbytes // self.max_request)) * self.request_s)
        self._link.transfer(nbytes / self.bandwidth)

    def open(self, path: str | Path) -> BinaryIO:
        """Open ``path`` for reading, paying the modelled open latency now and the request latency per read."""
        time.sleep(self.open_s)
        return _DelayedFile(open(path, "rb", buffering=0), self)

    __call__ = open

    def describe(self) -> str:
        link = "shared by all readers" if self.shared_link else "for each reader"
        return (
            f"{self.open_s * 1e3:g} ms per open, {self.request_s * 1e3:g} ms per read request "
            f"({self.min_request // 1024}-{self.max_request // 1024} KiB), {self.bandwidth / 1e6:g} MB/s {link}"
        )

    def predict_seconds(self, files: int, requests: int, nbytes: int) -> float:
        """Modelled I/O wait for ``files`` opens, ``requests`` read requests and ``nbytes`` bytes (one reader)."""
        return files * self.open_s + requests * self.request_s + nbytes / self.bandwidth


def zip_member_fetches(model: NetworkFSModel, member_bytes: float, header_bytes: int = 30 + 30) -> list[int]:
    """Bytes of each request the model's read-ahead makes for one member read through ``zipfile.ZipFile``.

    ``ZipFile.open`` seeks to the member's local header and reads it (30 bytes, then the
    name): a jump, so a fresh request of ``min_request`` bytes. ``read()`` then asks for the
    whole member; whatever the first window did not hold comes in a second, sequential
    request, which the read-ahead makes at least twice the first (``2 * min_request``). So a
    member larger than one window costs two requests and more bytes than it holds.
    ``header_bytes`` is the header and a short name.
    """
    first = model.min_request
    rest = header_bytes + member_bytes - first
    return [first] if rest <= 0 else [first, max(min(2 * first, model.max_request), int(rest))]


def predict_reading(model: NetworkFSModel, file_sizes: Sequence[int], shard_sizes: Sequence[int]) -> dict:
    """The model's arithmetic for *one* reader, counting only the waiting (the CPU's share comes on top).

    ``file_sizes`` are the bytes of each sample file, ``shard_sizes`` those of each tar shard
    holding the same samples. Per layout and reader, in shuffled order where a layout has
    random access:

    * a folder pays one open and one request per file;
    * a zip read through ``zipfile.ZipFile`` (:class:`~packlab.loaders.ZipDataset`) no open,
      but for every member the requests of :func:`zip_member_fetches`: the header and the
      start of the data in one, the rest in a second, larger one;
    * a zip read with positional reads from its central directory's offsets
      (:class:`~packlab.loaders.PreadZipDataset`) one request per member, for exactly the
      member's bytes (at least ``min_request``);
    * tar shards one open per shard and one request per ``max_request`` bytes.
    """
    images = len(file_sizes)
    mean_bytes = sum(file_sizes) / images
    tar_requests = sum(-(-size // model.max_request) for size in shard_sizes)
    tar_bytes = sum(shard_sizes)
    per_file_s = sum(model.predict_seconds(1, 1, size) for size in file_sizes) / images
    zipfile_fetches = [zip_member_fetches(model, size) for size in file_sizes]
    per_zipfile_member_s = sum(model.predict_seconds(0, len(f), sum(f)) for f in zipfile_fetches) / images
    per_pread_member_s = sum(model.predict_seconds(0, 1, max(model.min_request, size)) for size in file_sizes) / images
    all_shards_s = model.predict_seconds(len(shard_sizes), tar_requests, tar_bytes)
    return {
        "images": images,
        "mean_file_bytes": mean_bytes,
        "shards": len(shard_sizes),
        "tar_requests": tar_requests,
        "tar_bytes": tar_bytes,
        "folder_s_per_file": per_file_s,
        "zip_requests_per_member": sum(len(f) for f in zipfile_fetches) / images,
        "zip_bytes_per_member": sum(sum(f) for f in zipfile_fetches) / images,
        "zip_s_per_member": per_zipfile_member_s,
        "zip_pread_s_per_member": per_pread_member_s,
        "tar_s_all_shards": all_shards_s,
        "files_per_s": {"folder": 1 / per_file_s, "zip": 1 / per_zipfile_member_s,
                        "zip_pread": 1 / per_pread_member_s, "tar": images / all_shards_s},
    }


def read_at(file: BinaryIO, offset: int, size: int) -> bytes:
    """``size`` bytes of ``file`` from ``offset`` (fewer at the end of the file); the file's offset is not used.

    A local file is read with ``os.pread`` on its descriptor: one system call that names
    its own offset, so processes sharing the descriptor (after ``fork``) cannot disturb
    each other. A file opened by :meth:`NetworkFSModel.open` is read with its ``pread``,
    which charges the model's delays the same way.
    """
    pread = getattr(file, "pread", None)
    if pread is not None:
        return pread(size, offset)
    return _pread_fully(file.fileno(), offset, size)


def _pread_fully(fd: int, offset: int, size: int) -> bytes:
    """``os.pread`` until ``size`` bytes or the end of the file (a single call may return fewer)."""
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


class _DelayedFile(io.RawIOBase):
    """A read-only file whose reads from "the server" sleep as :class:`NetworkFSModel` says.

    It models a client's read-ahead: a read outside the bytes fetched last triggers a
    request for at least ``min_request`` bytes; while reading continues sequentially the
    request size doubles, up to ``max_request`` (Linux grows its read-ahead window the
    same way). Reads inside the fetched window, seeks and tells are free.
    """

    def __init__(self, raw: io.FileIO, model: NetworkFSModel):
        super().__init__()
        self._raw = raw
        self._model = model
        self.name = raw.name
        self._window = b""
        self._window_start = 0
        self._position = 0
        self._request = model.min_request
        self.requests = 0  # requests made to "the server" so far, and their bytes: what the model charged for
        self.bytes_fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def _request_size(self, offset: int) -> int:
        """The next request's size: doubled while reading continues where the window ends, else the minimum."""
        sequential = offset == self._window_start + len(self._window)
        self._request = min(2 * self._request, self._model.max_request) if sequential else self._model.min_request
        return self._request

    def _fetch(self, wanted: int) -> bool:
        """One request at the current position; False at the end of the file."""
        size = max(self._request_size(self._position), wanted)
        self._raw.seek(self._position)  # the shared file offset, as a real file's seek + read use it
        data = self._raw.read(size)
        if not data:
            return False
        self._charge(len(data))
        self._window, self._window_start = data, self._position
        return True

    def _charge(self, nbytes: int) -> None:
        """Wait as the model says for one request of ``nbytes``, and count it."""
        self.requests += 1
        self.bytes_fetched += nbytes
        self._model.wait_for_request(nbytes)

    def pread(self, size: int, offset: int) -> bytes:
        """``size`` bytes from ``offset`` with ``os.pread``: neither this file's position nor the shared offset moves.

        Bytes inside the last fetched window are free; anything else costs one request
        (read-ahead as for :meth:`read`), fetched from ``offset`` in one ``pread``.
        """
        start = offset - self._window_start
        if 0 <= start and start + size <= len(self._window):
            return self._window[start : start + size]
        data = _pread_fully(self._raw.fileno(), offset, max(self._request_size(offset), size))
        if data:
            self._charge(len(data))
            self._window, self._window_start = data, offset
        return data[:size]

    def readinto(self, buffer) -> int:
        wanted, got = len(buffer), 0
        while got < wanted:
            offset = self._position - self._window_start
            if 0 <= offset < len(self._window):
                chunk = self._window[offset : offset + wanted - got]
                buffer[got : got + len(chunk)] = chunk
                got += len(chunk)
                self._position += len(chunk)
            elif not self._fetch(wanted - got):
                break
        return got

    def readall(self) -> bytes:
        # The rest of the file in one go (split into max_request requests by request_seconds).
        rest = os.fstat(self._raw.fileno()).st_size - self._position
        return self.read(max(rest, 0))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            self._position = offset
        elif whence == io.SEEK_CUR:
            self._position += offset
        else:
            self._position = os.fstat(self._raw.fileno()).st_size + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        self._raw.close()
        super().close()


def probe_open_latency(files: Iterable[Path | str], cold: bool | str = True) -> dict:
    """Measure what one open + read + close of each of ``files`` costs on *your* storage.

    Run it on a folder on the filesystem you train from (cluster scratch, a network
    home) to choose :class:`NetworkFSModel` parameters. ``cold=True`` (Linux) drops the
    files' data pages first, so the reads are cold but ``open`` still finds each file in
    the kernel's caches; ``cold="all caches"`` (root) drops those too, so the open is
    cold as well; ``cold=False`` measures warm. Returns median and 90th-percentile
    seconds per file, the mean file size, and the level actually used (``"level"``).
    """
    files = [Path(f) for f in files]
    if not files:
        raise ValueError("no files to probe")
    level = WARM if not cold else DATA_PAGES if cold is True else cold
    if level == DATA_PAGES and not page_cache_control_available():
        level = WARM  # nothing to drop with on this platform: say so in the result
    if level != WARM:
        make_cold(files, level)
    seconds, sizes = [], []
    for path in files:
        start = time.perf_counter()
        with open(path, "rb") as f:
            sizes.append(len(f.read()))
        seconds.append(time.perf_counter() - start)
    return {
        "files": len(files),
        "level": level,
        "median_s": float(np.median(seconds)),
        "p90_s": float(np.percentile(seconds, 90)),
        "mean_bytes": float(np.mean(sizes)),
    }

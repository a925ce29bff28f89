"""How much memory each DataLoader worker really costs, and why Python lists of keys make it grow.

A forked worker starts with the training process's memory *shared*: the kernel copies a
page only when one of the two processes writes to it (copy-on-write). Reading a Python
object writes to it, because every access changes the object's reference count, which
lives in the object itself. So a worker that reads ``self.keys[i]`` for every ``i`` of an
epoch ends up with its own copy of every page holding one of those strings: the memory a
dataset's index takes is paid again in each worker, and the total grows with the number of
workers. PyTorch's issue #13246 is the long thread on it; torchdata's documentation calls it
"Python copy-on-read". Python's garbage collector adds to it: it writes to the header of
every container object (lists, tuples, dicts) it walks.

Two figures tell what a worker costs, both from ``/proc/<pid>/smaps_rollup``
(:func:`process_memory`):

* **unique** memory (USS): ``Private_Clean + Private_Dirty``, the pages only this process
  holds, what killing it would free;
* **proportional** memory (PSS): each page divided by the number of processes sharing it;
  the PSS of all processes adds up to what they use together. RSS counts shared pages
  in full in every process and so overstates the total.

The cure is to keep the index in a few large objects that reading does not write to: one
``bytes`` blob with an array of offsets for the keys (:class:`StringColumn`), an
:class:`array.array` (or numpy array) for labels and offsets. Reading an element then
creates a new small object in the worker instead of touching a shared one.
:func:`measure_worker_memory` shows the difference (chapter 12).
"""

from __future__ import annotations

import array
import bisect
import gc
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info


# ------------------------------------------------------------------------- measuring


class ProcessMemory(NamedTuple):
    """One process's memory in bytes, from ``/proc/<pid>/smaps_rollup``."""

    rss: int  # resident: shared pages counted in full
    pss: int  # proportional: shared pages divided among their sharers
    uss: int  # unique: Private_Clean + Private_Dirty


def process_memory(pid: int | str = "self") -> ProcessMemory:
    """RSS, PSS and unique memory of a process (Linux: ``/proc/<pid>/smaps_rollup``, values in kB there)."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                fields[name] = int(parts[0]) * 1024
    return ProcessMemory(fields["Rss"], fields["Pss"], fields["Private_Clean"] + fields["Private_Dirty"])


# ------------------------------------------------------------- an index without objects


class StringColumn(Sequence):
    """Many strings stored as one UTF-8 ``bytes`` blob plus an array of offsets.

    ``column[i]`` decodes string ``i`` anew (a fresh object, private to the reading
    process); nothing shared is written, so forked workers keep sharing the blob's pages.
    Two objects in all, whatever the number of strings: for 1.28 M ImageNet file names
    about 30 MB instead of about 100 MB of ``str`` objects plus a list of pointers.
    Compares equal to a list of the same strings; slicing returns a list.
    """

    def __init__(self, strings: Iterable[str] = ()):
        encoded = [s.encode("utf-8") for s in strings]
        offsets = array.array("q", [0])
        total = 0
        for item in encoded:
            total += len(item)
            offsets.append(total)
        self._blob = b"".join(encoded)
        self._offsets = offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} strings")
        return self._blob[self._offsets[index] : self._offsets[index + 1]].decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other) -> bool:
        if isinstance(other, StringColumn):
            return self._blob == other._blob and self._offsets == other._offsets
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # mutable-looking sequence: like a list, not hashable

    def nbytes(self) -> int:
        """Bytes held: the blob and the offsets."""
        return len(self._blob) + self._offsets.itemsize * len(self._offsets)

    def __repr__(self) -> str:
        shown = ", ".join(repr(s) for s in self[:3])
        return f"StringColumn([{shown}{', ...' if len(self) > 3 else ''}], {len(self)} strings, {self.nbytes():,} bytes)"


def int_column(values: Iterable[int]) -> array.array:
    """Integers as one ``array.array('q')``: 8 bytes each, no object per value, ``==`` compares them all."""
    return array.array("q", values)


class SortedLookup:
    """Position of a string in a :class:`StringColumn` without a dict: binary search over a sorted order.

    A dict from 1.28 M names to positions is 1.28 M string keys and int values, every one
    of them written by every lookup in every worker; this is one array of positions.
    """

    def __init__(self, column: StringColumn):
        self.column = column
        self.order = array.array("q", sorted(range(len(column)), key=column.__getitem__))

    def index(self, value: str) -> int:
        at = bisect.bisect_left(self.order, value, key=self.column.__getitem__)
        if at == len(self.order) or self.column[self.order[at]] != value:
            raise KeyError(value)
        return self.order[at]


# ------------------------------------------------------------------ the experiment


class IndexOnly(Dataset):
    """A dataset that only reads its index: ``dataset[i]`` looks up key and label ``i``, no file is read.

    ``storage`` says how the index is kept: ``"lists"`` (a list of ``str`` and a list of
    ``int``, as the course's datasets kept them), ``"dict of tuples"`` (a dict from member
    name to a tuple of numbers, as ``PreadZipDataset`` kept its spans), or ``"columns"``
    (:class:`StringColumn` and :func:`int_column`).
    """

    STORAGES = ("lists", "dict of tuples", "columns")

    def __init__(self, count: int, storage: str):
        if storage not in self.STORAGES:
            raise ValueError(f"storage must be one of {self.STORAGES}, got {storage!r}")
        self.storage = storage
        names = (f"n{i % 1000:08d}_{i}.JPEG" for i in range(count))  # ImageNet-like names
        if storage == "columns":
            self.keys = StringColumn(names)
            self.labels = int_column(i % 1000 for i in range(count))
        else:
            self.keys = list(names)
            self.labels = [i % 1000 for i in range(count)]
        if storage == "dict of tuples":
            # name -> (offset, name length, extra, stored size, size, crc, method): one tuple of ints per member
            self.spans = {k: (i * 110_000, len(k), 0, 110_000 + i % 7, 110_000 + i % 7, 2**31 + i, 0)
                          for i, k in enumerate(self.keys)}

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> int:
        key, label = self.keys[index], self.labels[index]
        if self.storage == "dict of tuples":
            return self.spans[key][3] + label
        return len(key) + label


def collate_with_memory(batch: list) -> dict:
    """A ``collate_fn`` that reports, with each batch, which worker made it and that worker's memory now."""
    info = get_worker_info()
    memory = process_memory()
    return {"worker": -1 if info is None else info.id, "items": len(batch), "uss": memory.uss, "pss": memory.pss}


class _StartingMemory:
    """A ``worker_init_fn`` that writes each worker's unique memory at start into shared memory."""

    def __init__(self, workers: int):
        self.uss = torch.zeros(workers, dtype=torch.int64).share_memory_()

    def __call__(self, worker_id: int) -> None:
        self.uss[worker_id] = process_memory().uss


def measure_worker_memory(dataset: Dataset, workers: int = 2, batch_size: int = 2000, seed: int = 0,
                          freeze_gc: bool = False) -> list[dict]:
    """One shuffled epoch over ``dataset`` with ``workers`` fork workers; each worker's memory after every batch.

    Returns one record per batch: ``worker``, ``samples`` (this worker's samples so far),
    ``fraction`` (of the epoch, all workers together), ``uss`` and ``pss`` in bytes, and
    ``uss_growth`` (USS minus this worker's USS when it started). ``freeze_gc=True``
    calls :func:`gc.freeze` before the workers fork, so the collector leaves the objects
    already there alone (it stops the garbage collector's writes, not the reference counts').
    """
    if freeze_gc:
        gc.freeze()
    try:
        starting = _StartingMemory(workers)
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                            generator=torch.Generator().manual_seed(seed), collate_fn=collate_with_memory,
                            multiprocessing_context="fork", prefetch_factor=1, worker_init_fn=starting)
        records, done = [], {}
        total = len(dataset)
        seen = 0
        for batch in loader:
            worker = batch["worker"]
            seen += batch["items"]
            done[worker] = done.get(worker, 0) + batch["items"]
            records.append({"worker": worker, "samples": done[worker], "fraction": seen / total, "uss": batch["uss"],
                            "pss": batch["pss"], "uss_growth": batch["uss"] - int(starting.uss[worker])})
        return records
    finally:
        if freeze_gc:
            gc.unfreeze()


def per_key_growth(records: list[dict], keys: int) -> float:
    """Bytes of unique memory each worker gained per key of the index over the epoch (mean over workers)."""
    last: dict[int, dict] = {}
    for record in records:
        last[record["worker"]] = record
    return sum(r["uss_growth"] for r in last.values()) / len(last) / keys


def object_bytes(values: Sequence) -> int:
    """Approximate bytes of a list of Python objects: the list's pointers plus each object (not deduplicated)."""
    import sys

    return sys.getsizeof(values) + sum(sys.getsizeof(v) for v in values)


def worker_pids(iterator) -> list[int]:
    """The process ids of a DataLoader iterator's workers (for :func:`process_memory` from outside)."""
    return [w.pid for w in getattr(iterator, "_workers", [])]


def free_shm_bytes(path: str = "/dev/shm") -> int:
    """Bytes free on the shared-memory filesystem that DataLoader batches cross the process boundary in."""
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize

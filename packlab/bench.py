"""Time data loaders honestly.

:func:`time_loader` iterates a DataLoader (or any iterable of batches) for a few epochs
and records, per epoch, the wall time, and for the first epoch the time to the first
batch (worker start-up, opening files, filling the prefetch queue). Throughput is
reported as an average over *all* epochs, start-up included, because that is what a
training job pays; the per-epoch times show how much of it is start-up.

Results print as a small table; several results side by side make a
:class:`BenchTable`::

    >>> result = time_loader(loader, epochs=2, name="folder, 2 workers")
    >>> print(result)               # doctest: +SKIP
    >>> BenchTable([r0, r1, r2])    # renders as a table in a notebook
"""

from __future__ import annotations

import os
import statistics
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import torch


def batch_size_of(batch) -> int:
    """Number of samples in a batch: the length of its first tensor (or of the batch itself)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    if isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (int, float, str, bytes)):
        batch = batch[0]
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    return len(batch)


@dataclass
class BenchResult:
    """What :func:`time_loader` measured for one loader configuration."""

    name: str
    epoch_seconds: list[float]
    images_per_epoch: int
    first_batch_seconds: float
    bytes_per_epoch: int | None = None
    extra: dict = field(default_factory=dict)

    @property
    def total_seconds(self) -> float:
        return sum(self.epoch_seconds)

    @property
    def images_per_s(self) -> float:
        """Images per second over all epochs, start-up included."""
        return self.images_per_epoch * len(self.epoch_seconds) / self.total_seconds

    @property
    def mb_per_s(self) -> float | None:
        """Megabytes (10^6 bytes) read from storage per second, when ``bytes_per_epoch`` is known."""
        if self.bytes_per_epoch is None:
            return None
        return self.bytes_per_epoch * len(self.epoch_seconds) / self.total_seconds / 1e6

    def row(self) -> dict:
        """The result as one table row (rounded for display)."""
        row = {
            "loader": self.name,
            "epochs": len(self.epoch_seconds),
            "s/epoch": " / ".join(f"{s:.2f}" for s in self.epoch_seconds),
            "images/s": round(self.images_per_s),
            "MB/s": None if self.mb_per_s is None else round(self.mb_per_s, 1),
            "first batch (s)": round(self.first_batch_seconds, 2),
        }
        row.update(self.extra)
        return row

    def to_dict(self) -> dict:
        """Raw numbers, for JSON."""
        out = asdict(self)
        out.update(images_per_s=self.images_per_s, mb_per_s=self.mb_per_s)
        return out

    def __str__(self) -> str:
        return str(BenchTable([self]))

    def _repr_html_(self) -> str:
        return BenchTable([self])._repr_html_()


class BenchTable:
    """Several :class:`BenchResult` rows, printable as text and rendered as HTML in notebooks."""

    def __init__(self, results: Sequence[BenchResult]):
        self.results = list(results)

    def rows(self) -> list[dict]:
        return [r.row() for r in self.results]

    def _columns(self) -> list[str]:
        columns: list[str] = []
        for row in self.rows():
            columns += [c for c in row if c not in columns]
        return columns

    def __str__(self) -> str:
        columns = self._columns()
        cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in self.rows()]
        widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
        lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        columns = self._columns()
        head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape('' if r.get(c) is None else str(r.get(c)))}</td>" for c in columns) + "</tr>"
            for r in self.rows()
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def markdown_table(rows: Sequence[dict]):
    """Rows of dicts (same keys) as a Markdown table, displayed as a table in a notebook."""
    from IPython.display import Markdown

    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join("" if row.get(c) is None else str(row.get(c)) for c in columns) + " |" for row in rows]
    return Markdown("\n".join(lines))


def time_loader(
    loader: Iterable,
    epochs: int = 2,
    name: str | None = None,
    bytes_per_epoch: int | None = None,
    on_batch: Callable | None = None,
) -> BenchResult:
    """Iterate ``loader`` for ``epochs`` full passes and time each one.

    ``on_batch(batch)``, if given, is called on every batch inside the timed region
    (use it to model a consumer, or to touch the data so nothing is lazily skipped).
    ``bytes_per_epoch`` (e.g. the archive's size on disk) turns the timing into MB/s.
    """
    if epochs < 1:
        raise ValueError("epochs must be at least 1")
    epoch_seconds: list[float] = []
    first_batch = float("nan")
    counts = []
    for epoch in range(epochs):
        if hasattr(getattr(loader, "dataset", None), "set_epoch"):
            loader.dataset.set_epoch(epoch)
        count = 0
        start = time.perf_counter()
        for batch in loader:
            if count == 0 and epoch == 0:
                first_batch = time.perf_counter() - start
            count += batch_size_of(batch)
            if on_batch is not None:
                on_batch(batch)
        epoch_seconds.append(time.perf_counter() - start)
        counts.append(count)
    if len(set(counts)) != 1:
        raise RuntimeError(f"epochs delivered different numbers of samples: {counts}")
    if counts[0] == 0:
        raise RuntimeError("the loader delivered no samples")
    return BenchResult(
        name=name or type(loader).__name__,
        epoch_seconds=epoch_seconds,
        images_per_epoch=counts[0],
        first_batch_seconds=first_batch,
        bytes_per_epoch=bytes_per_epoch,
    )


def run_until_error(loader: Iterable) -> tuple[int, BaseException | None]:
    """Iterate one epoch; return ``(complete batches received, the exception raised or None)``.

    For showing a loader fail without ending the notebook or test. The exception comes
    back with its traceback's frames cleared: those frames reference the DataLoader
    iterator, and while it lives its worker processes live too. Clearing them lets the
    iterator go now, so the workers shut down at once rather than at some later garbage
    collection (which can stall for seconds per worker).
    """
    iterator = iter(loader)
    batches = 0
    try:
        for _ in iterator:
            batches += 1
    except Exception as exc:  # noqa: BLE001 - the caller decides which errors it expected
        traceback.clear_frames(exc.__traceback__)
        return batches, exc
    finally:
        del iterator
    return batches, None


def time_per_item(fn: Callable, items: Sequence, repeat: int = 1) -> float:
    """Mean seconds per call of ``fn(item)`` over ``items`` (best of ``repeat`` passes).

    For timing one stage of a pipeline on its own, e.g. decode on bytes already in memory.
    """
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for item in items:
            fn(item)
        best = min(best, time.perf_counter() - start)
    return best / len(items)


# ------------------------------------------------ repeated, interleaved measurements
#
# On a shared machine one run of a measurement says little: the load changes from one
# second to the next. A comparison the prose draws a conclusion from is therefore the
# median of at least three runs, interleaved (A, B, A, B, A, B rather than A, A, A, B, B,
# B) so that a busy minute hits every contender alike, with the range shown; when the
# ranges overlap there is no clear difference.


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one quantity: the median a sentence follows, and the range it shows.

    Iterating a spread gives its measurements, so ``Spread.of(1e3 * v for v in spread)``
    converts units; ``f"{spread}"`` and ``spread.format(".1f")`` give ``"452 (409–470)"``.
    """

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        values = tuple(float(v) for v in values)
        if not values:
            raise ValueError("a spread needs at least one measurement")
        return cls(values)

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def __iter__(self):
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def overlaps(self, other: Spread) -> bool:
        """Whether the two ranges (min to max) share any value: then neither is clearly higher."""
        return self.low <= other.high and other.low <= self.high

    def scaled(self, factor: float) -> Spread:
        """The same measurements in other units (``factor=1e3``: seconds to milliseconds)."""
        return Spread(tuple(v * factor for v in self.values))

    def format(self, spec: str = ".0f") -> str:
        """``"452 (409–470)"``: the median, then the range, each formatted with ``spec``."""
        return f"{self.median:{spec}} ({self.low:{spec}}\u2013{self.high:{spec}})"

    text = format

    def __format__(self, spec: str) -> str:
        return self.format(spec or ".0f")

    __str__ = format


def interleaved(runs: dict[str, Callable[[], float]], rounds: int = 3) -> dict[str, Spread]:
    """Call every function of ``runs`` once per round, in turn, for ``rounds`` rounds: ``{name: Spread}``.

    Each function returns one number (images/s, seconds, ...), e.g.
    ``lambda: time_loader(make_loader(), epochs=1).images_per_s``.
    """
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    values: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            values[name].append(float(run()))
    return {name: Spread(tuple(v)) for name, v in values.items()}


def repeat(measure: Callable[[], float], rounds: int = 5) -> Spread:
    """``rounds`` calls of one measure, e.g. the seconds one ``zipfile.ZipFile(path).close()`` takes."""
    return interleaved({"": measure}, rounds)[""]


def seconds_of(fn: Callable[[], object]) -> Callable[[], float]:
    """A measure for :func:`interleaved`: the wall-clock seconds one call of ``fn()`` takes."""

    def measure() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    return measure


def compare(a: Spread, b: Spread) -> int:
    """1 if ``a`` is clearly higher than ``b``, -1 if clearly lower, 0 if their ranges overlap."""
    if a.overlaps(b):
        return 0
    return 1 if a.median > b.median else -1


def verdict(a: Spread, b: Spread, more: str = "more", less: str = "less", same: str = "no clear difference") -> str:
    """How ``a`` compares with ``b``, in the caller's words: ``same`` when the ranges overlap (see :func:`compare`)."""
    return {1: more, -1: less, 0: same}[compare(a, b)]


def ratio_words(a: Spread, b: Spread, higher: str = "faster", lower: str = "slower") -> str:
    """``a`` against ``b`` in words, from the medians: ``"1.4 times faster"``, ``"1.2 times slower"``,
    or ``"no clear difference"`` when the ranges overlap (see :func:`compare`)."""
    direction = compare(a, b)
    if direction == 0:
        return "no clear difference"
    ratio = a.median / b.median if direction > 0 else b.median / a.median
    return f"{ratio:.1f} times {higher if direction > 0 else lower}"


def spread_table(spreads: dict[str, Spread], quantity: str = "images/s", fmt: str = ".0f", label: str = "loader"):
    """``{name: Spread}`` as a Markdown table: median, min–max and number of runs per row."""
    return markdown_table([
        {label: name, f"{quantity}, median": f"{s.median:{fmt}}", "min–max": f"{s.low:{fmt}}–{s.high:{fmt}}",
         "runs": len(s)}
        for name, s in spreads.items()
    ])


# ---------------------------------------------------------- the benchmark suite (make bench)
#
# `python -m packlab.bench` (what `make bench` runs) measures, in one process tree and one
# run: the decode ceiling of one core and of all cores at once; every loader of the course
# and its modern peers (webdataset, torchdata.nodes, SPDL) on the same shards with the same
# transform and batch size, three epochs each, interleaved; the worker-count sweep of the
# course's loaders; the small-file penalty; and any extra section registered in SECTIONS.
# It prints a table and writes _build/bench/bench.json and _build/bench/bench.png.
# `--quick` runs the same on a few hundred images, to check that everything runs.

@contextmanager
def torch_threads(count: int):
    """Run a block with torch's intra-op thread pool set to ``count`` threads, then restore it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def measure_ceiling(encoded: Sequence[bytes], transform: Callable | None = None) -> float:
    """Images/s of decode + the standard transform on JPEG bytes already in memory.

    One process, one torch thread: what one core can do when nothing else (files,
    workers, batching) costs anything. A loader with ``n`` workers on ``n`` free cores
    can at best approach ``n`` times this.
    """
    from packlab.transforms import standard_transform

    transform = transform or standard_transform
    with torch_threads(1):
        start = time.perf_counter()
        for blob in encoded:
            transform(blob)
        return len(encoded) / (time.perf_counter() - start)


def _decode_share(share: Sequence[bytes], barrier, results) -> None:
    """One process of :func:`measure_parallel_ceiling`: wait for the others, then decode its share."""
    from packlab.transforms import standard_transform

    torch.set_num_threads(1)
    barrier.wait()
    start = time.monotonic()  # the same clock in every process (CLOCK_MONOTONIC)
    for blob in share:
        standard_transform(blob)
    results.put((start, time.monotonic(), len(share)))


def measure_parallel_ceiling(encoded: Sequence[bytes], processes: int) -> float:
    """Images/s of ``processes`` processes decoding (+ standard transform) at the same time.

    Each process takes every ``processes``-th image, all start together (a barrier), and
    the rate is all images over the time from the first start to the last finish. This is
    what the cores deliver together when nothing crosses a process boundary: an upper
    bound for any loader with that many workers, usually a little below ``processes``
    times :func:`measure_ceiling` (shared caches, memory bandwidth, clock boost).
    """
    import multiprocessing

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    barrier, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_decode_share, args=(encoded[i::processes], barrier, results), daemon=True)
               for i in range(processes)]
    for worker in workers:
        worker.start()
    spans = [results.get(timeout=3600) for _ in workers]
    for worker in workers:
        worker.join()
    return sum(n for _, _, n in spans) / (max(end for _, end, _ in spans) - min(start for start, _, _ in spans))


def batch_memory_seconds(batch_size: int = 64, repeats: int = 5) -> dict:
    """Seconds per image to fill a batch in fresh shared, fresh private and reused memory.

    A DataLoader worker builds every batch in a new shared-memory block; the kernel must
    supply (and zero) its pages, one page fault per 4 kB, before the worker can write
    them, and unmap them when the batch is freed. This measures that, per image of the
    standard 3x256x256 float batch, next to writing into memory that is already mapped,
    private (a thread loader's recycled buffer) or shared (a recycling process loader's).
    The kinds are interleaved ``repeats`` times; ``<kind>_s_per_image`` is the median,
    ``ranges`` the min and max.
    """
    from packlab.loaders.recycling import shared_float_tensor
    from packlab.transforms import IMAGE_SIZE

    shape = (batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)
    reused_private = torch.zeros(shape)
    reused_shared = shared_float_tensor(shape).zero_()
    kinds = {"fresh_shared": lambda: shared_float_tensor(shape), "fresh_private": lambda: torch.empty(shape),
             "reused": lambda: reused_private, "reused_shared": lambda: reused_shared}
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    with torch_threads(1):
        for _ in range(repeats):
            for kind, make in kinds.items():
                start = time.perf_counter()
                make().fill_(0.5)  # a fresh batch is also freed (unmapped) inside the timed region
                times[kind].append((time.perf_counter() - start) / batch_size)
    out: dict = {f"{kind}_s_per_image": statistics.median(t) for kind, t in times.items()}
    out["ranges"] = {kind: [min(t), max(t)] for kind, t in times.items()}
    return out


# -------------------------------------------------------------- where the CPU time goes


def busy_core_seconds() -> float | None:
    """CPU seconds spent so far by everything on this machine (Linux ``/proc/stat``), or None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed_epoch(loader: Iterable, name: str) -> dict:
    """One epoch through :func:`time_loader`, with the CPU time this process and the machine spent on it."""
    own, busy = time.process_time(), busy_core_seconds()
    result = time_loader(loader, epochs=1, name=name)
    busy_after = busy_core_seconds()
    return {
        "images": result.images_per_epoch,
        "seconds": result.epoch_seconds[0],
        "images_per_s": result.images_per_s,
        "first_batch_seconds": result.first_batch_seconds,
        "main_cpu_s": time.process_time() - own,  # this process, all its threads
        "busy_core_s": None if busy is None else busy_after - busy,  # every process on the machine
    }


def where_the_time_goes(epoch: dict, parallel_ceiling: float, cores: int) -> dict:
    """Core-milliseconds per image of one epoch: decoding, other work, and idle cores.

    At ``rate`` images/s, ``cores`` cores offer ``cores / rate`` core-seconds per image.
    The parallel ceiling needs ``cores / parallel_ceiling`` of them to decode; whatever
    else was busy (reading, batching, handing batches over, the main process) is extra
    work, and the rest is cores standing idle (start-up, waiting for a batch, threads
    waiting for the GIL). ``limited_by`` names the larger of the two losses. Busy time is
    the machine's: other programs running at the same time count as extra work.
    """
    per_image = 1e3 / epoch["images"]
    budget = cores * 1e3 / epoch["images_per_s"]
    decode = cores * 1e3 / parallel_ceiling
    out = {
        "core_ms_per_image": budget,
        "decode_core_ms_per_image": decode,
        "main_process_cpu_ms_per_image": epoch["main_cpu_s"] * per_image,
        "busy_core_ms_per_image": None,
        "extra_work_core_ms_per_image": None,
        "idle_core_ms_per_image": None,
    }
    if epoch["busy_core_s"] is None:
        out["limited_by"] = "unknown: machine-wide CPU time is read from /proc/stat, which this system lacks"
        return out
    busy = epoch["busy_core_s"] * per_image
    extra, idle = busy - decode, budget - busy
    out.update(busy_core_ms_per_image=busy, extra_work_core_ms_per_image=extra, idle_core_ms_per_image=idle)
    if idle >= extra:
        out["limited_by"] = (f"idle cores: {idle:.2f} core-ms per image unused (start-up, waiting for batches, "
                             f"threads waiting for the GIL), against {extra:.2f} of work beyond decoding")
    else:
        out["limited_by"] = (f"work beyond decoding: {extra:.2f} core-ms per image on top of the ceiling's "
                             f"{decode:.2f} (reading, batching, the hand-over; the main process used "
                             f"{out['main_process_cpu_ms_per_image']:.2f}), against {idle:.2f} idle")
    return out


# -------------------------------------------------------------- the loaders and their peers


#: Which loaders are the course's own and which are peers; "variant" rows explain a ratio.
OURS, PEER, VARIANT = "ours", "peer", "variant"
#: The course's original loaders, also swept over worker counts.
SWEPT = ("JPEG folder", "zip, per-worker handle", "tar shards (ours)", "webdataset")


def loader_factories(root, shards: list[str], zip_path, batch_size: int = 64, seed: int = 0) -> dict:
    """name -> ``(group, make(workers))``: every loader of the benchmark, all giving standard float batches.

    All use the same transform: decode and resize to uint8 with Pillow, then one float
    conversion per batch (:func:`packlab.loaders.batching.collate_uint8_images`, or the
    same arithmetic straight into a batch buffer). Map-style loaders read in shuffled
    order, shard readers shuffle in a buffer of 1,000 samples. ``tar, per-sample float``
    converts per sample and stacks with the default collate, to show what batching buys.
    """
    from torch.utils.data import DataLoader

    from packlab.loaders import JpegFolderDataset, RecyclingLoader, TarShardDataset, ThreadLoader, ZipDataset
    from packlab.loaders.batching import collate_uint8_images
    from packlab.loaders.peers import SpdlPipelineLoader, TorchdataNodesLoader
    from packlab.loaders.with_webdataset import webdataset_loader
    from packlab.transforms import decode_and_resize

    def context(workers):
        return "fork" if workers else None

    def order():
        return torch.Generator().manual_seed(seed)

    def shuffled(dataset, workers):
        return DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=order(), num_workers=workers,
                          collate_fn=collate_uint8_images, multiprocessing_context=context(workers))

    def tar_dataset(fast=True):
        return TarShardDataset(shards, shuffle_buffer=1000, seed=seed,
                               **({"transform": decode_and_resize} if fast else {}))

    def tar(workers, fast=True):
        return DataLoader(tar_dataset(fast), batch_size=batch_size, num_workers=workers,
                          multiprocessing_context=context(workers),
                          **({"collate_fn": collate_uint8_images} if fast else {}))

    def zip_dataset():
        return ZipDataset(zip_path, transform=decode_and_resize)

    return {
        "JPEG folder": (OURS, lambda w: shuffled(JpegFolderDataset(root, transform=decode_and_resize), w)),
        "zip, per-worker handle": (OURS, lambda w: shuffled(zip_dataset(), w)),
        "tar shards (ours)": (OURS, tar),
        "threads, zip": (OURS, lambda w: ThreadLoader(zip_dataset(), batch_size=batch_size, threads=max(1, w),
                                                      shuffle=True, generator=order())),
        "threads, tar shards": (OURS, lambda w: ThreadLoader(tar_dataset(), batch_size=batch_size, threads=max(1, w))),
        "recycling, zip": (OURS, lambda w: RecyclingLoader(zip_dataset(), batch_size=batch_size, workers=max(1, w),
                                                           shuffle=True, generator=order(),
                                                           multiprocessing_context="fork")),
        "recycling, tar shards": (OURS, lambda w: RecyclingLoader(tar_dataset(), batch_size=batch_size,
                                                                  workers=max(1, w), multiprocessing_context="fork")),
        "webdataset": (PEER, lambda w: webdataset_loader(
            shards, w, multiprocessing_context=context(w), batch_size=batch_size, with_keys=False,
            transform=decode_and_resize, collation_fn=collate_uint8_images)),
        "torchdata.nodes, threads": (PEER, lambda w: TorchdataNodesLoader(shards, w, "thread", batch_size, seed)),
        "torchdata.nodes, processes": (PEER, lambda w: TorchdataNodesLoader(shards, w, "process", batch_size, seed,
                                                                                     multiprocessing_context="fork")),
        "SPDL, threads": (PEER, lambda w: SpdlPipelineLoader(shards, w, batch_size, seed)),
        "tar, per-sample float": (VARIANT, lambda w: tar(w, fast=False)),
    }


def small_file_penalty(
    root=None,
    model=None,
    workers: int | None = None,
    folder_files: int = 2000,
    shards: int | None = None,
    cold_level: str | None = None,
) -> dict:
    """Reading speed (files/s, no decode) of a JPEG folder, a zip and tar shards on slow storage.

    Two kinds of slow: *cold* (real disk reads after :func:`packlab.storage.make_cold` at
    ``cold_level``, by default the strongest level this process may use; ``"cold_level"``
    in the result says which) and *modelled* (:class:`packlab.storage.NetworkFSModel`, the
    same delays applied to every loader through its ``opener``). Decoding is left out on
    purpose (the transform only counts bytes): this measures the storage pattern, which
    decode time would otherwise hide on a machine with few cores. The folder and the zip
    are read in shuffled order, as a training epoch reads them; the shards in order. The
    folder reads only its first ``folder_files`` files under the model (it is slow there;
    the rate is what counts). ``shards`` reads only the first that many tar shards, and the
    folder and the zip only the samples those hold, so a chapter can repeat the whole
    measurement in less time. Returns measured rates, the model's parameters and its prediction.
    """
    from torch.utils.data import DataLoader

    from packlab import data, pack, storage
    from packlab.loaders import JpegFolderDataset, TarShardDataset, ZipDataset
    from packlab.loaders.tar import skip_decode

    workers = data.available_cores() if workers is None else workers
    model = model or storage.NetworkFSModel()
    manifest = data.load_manifest(root)
    all_shards = [str(p) for p in pack.ensure_tar_shards(maxcount=_shard_size(len(manifest), workers),
                                                           root=root, progress=False)]
    zip_path = pack.ensure_zip(root=root, progress=False)
    shards = all_shards if shards is None else all_shards[:shards]
    if len(shards) < len(all_shards):  # the same samples in every layout: those of the shards read
        held = _keys_in_shards(shards)
        manifest = [s for s in manifest if s.key in held]

    def rate(dataset, batch_size=64) -> float:
        # Map-style datasets are read in shuffled order, as in training; tar shards in order, as designed.
        shuffle = not isinstance(dataset, torch.utils.data.IterableDataset)
        generator = torch.Generator().manual_seed(0)
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                            num_workers=workers, multiprocessing_context="fork" if workers else None)
        return time_loader(loader, epochs=1).images_per_s

    def folder(keys, opener=None):
        return JpegFolderDataset(root, keys=keys, transform=skip_decode, **({"opener": opener} if opener else {}))

    out: dict = {"workers": workers, "images": len(manifest), "model": asdict(model), "model_text": model.describe()}
    all_keys = [s.key for s in manifest]
    some_keys = all_keys[:folder_files]

    # Cold: make the files cold, read once (every file), and compare with the same read warm.
    level = cold_level if cold_level is not None else (storage.cold_levels() or [None])[-1]
    out["cold_level"] = level
    if level is not None:
        images = [data.image_path(k, root) for k in all_keys]
        cold = {}
        storage.make_cold(images, level)
        cold["folder_cold"] = rate(folder(all_keys))
        cold["folder_warm"] = rate(folder(all_keys))
        storage.make_cold([zip_path], level)
        cold["zip_cold"] = rate(ZipDataset(zip_path, keys=all_keys, transform=skip_decode))
        cold["zip_warm"] = rate(ZipDataset(zip_path, keys=all_keys, transform=skip_decode))
        storage.make_cold(shards, level)
        cold["tar_cold"] = rate(TarShardDataset(shards, transform=skip_decode))
        cold["tar_warm"] = rate(TarShardDataset(shards, transform=skip_decode))
        out["cold_files_per_s"] = cold
    else:
        out["cold_files_per_s"] = None

    modelled = {
        "folder": rate(folder(some_keys, opener=model.open)),
        "zip": rate(ZipDataset(zip_path, keys=all_keys, transform=skip_decode, opener=model.open)),
        "tar": rate(TarShardDataset(shards, transform=skip_decode, opener=model.open)),
    }
    out["modelled_files_per_s"] = modelled
    out["tar_vs_folder_modelled"] = modelled["tar"] / modelled["folder"]
    prediction = storage.predict_reading(model, [s.bytes for s in manifest], [os.path.getsize(p) for p in shards])
    out["predicted_files_per_s"] = {
        layout: workers_or_one(workers) * rate for layout, rate in prediction["files_per_s"].items()
    }
    return out


def _keys_in_shards(shards: Sequence[str]) -> set[str]:
    """The keys of the samples the given tar shards hold (read from their headers alone)."""
    import tarfile

    from packlab.loaders.tar import IMAGE_EXTENSION, split_key

    keys = set()
    for shard in shards:
        with tarfile.open(shard, mode="r:") as tar:
            keys.update(split_key(m.name)[0] for m in tar if m.isfile() and split_key(m.name)[1] == IMAGE_EXTENSION)
    return keys


def _shard_size(images: int, max_workers: int) -> int:
    """The course's 1,000 samples a shard, or fewer when a small dataset would give a worker no shard."""
    return max(1, min(1000, images // (2 * max(1, max_workers))))


def workers_or_one(workers: int) -> int:
    """Readers working in parallel: the workers, or the main process when there are none."""
    return max(1, workers)


# -------------------------------------------------------------- the run


#: What the benchmark aims for; where a goal is missed, bench.json records what limits it.
GOALS = {"best_vs_ceiling": 0.90, "ours_vs_best_peer": 1.15}


def _small_files_section(root=None, quick: bool = False, log: Callable[[str], None] = print) -> dict:
    log("small-file penalty: reading without decoding, cold and under the network-filesystem model")
    out = small_file_penalty(root, folder_files=200 if quick else 2000)
    out["summary"] = (f"files/s under the model: " + ", ".join(f"{k} {v:.0f}" for k, v in out["modelled_files_per_s"].items())
                      + f"; tar/folder {out['tar_vs_folder_modelled']:.1f}x")
    return out


#: Sections run after the loaders: name -> ``section(root=..., quick=..., log=...)`` returning a
#: JSON-able dict, stored in bench.json under its name (a ``summary`` string, if any, is printed).
#: A module adds its own with ``SECTIONS["name"] = function``; ``--skip name`` leaves one out.
SECTIONS: dict[str, Callable[..., dict]] = {"small_files": _small_files_section}


def _formats_section(root=None, quick: bool = False, log: Callable[[str], None] = print) -> dict:
    """Chapter 9: every packed format side by side (:mod:`packlab.formats.bench`)."""
    from packlab.formats.bench import format_formats, measure_formats

    log("other formats: size, write time and read rates of every layout, 3 rounds")
    out = measure_formats(root=root, log=lambda message: log(f"  {message}"))
    out["summary"] = format_formats(out)
    return out


SECTIONS["formats"] = _formats_section


def _summarise(name: str, group: str, workers: int, epochs: list[dict], parallel_ceiling: float, cores: int) -> dict:
    """One loader's epochs: median, range, and where the time went in its median epoch."""
    rates = [e["images_per_s"] for e in epochs]
    median_epoch = sorted(epochs, key=lambda e: e["images_per_s"])[(len(epochs) - 1) // 2]
    median = statistics.median(rates)
    return {
        "loader": name, "group": group, "workers": workers,
        "median_images_per_s": median, "min_images_per_s": min(rates), "max_images_per_s": max(rates),
        "vs_parallel_ceiling": median / parallel_ceiling,
        "epochs": epochs,
        "where_the_time_goes": where_the_time_goes(median_epoch, parallel_ceiling, cores),
    }


def quick_root(images: int = 600, out_dir=None, source=None):
    """A data root holding the first ``images`` samples of the dataset at ``source`` (for ``--quick``).

    Files are hard-linked where the filesystem allows (copied otherwise); the zip and
    shards the benchmark needs are written into it on first use, as for the full dataset.
    """
    import shutil
    from pathlib import Path

    from packlab import data, paths

    folder = Path(out_dir if out_dir is not None else paths.build_dir() / "bench") / f"quick-data-{images}"
    samples = data.load_manifest(source)[:images]
    if paths.manifest_path(folder).exists() and data.load_manifest(folder) == samples:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    paths.images_dir(folder).mkdir(parents=True)
    for sample in samples:
        original, copy = data.image_path(sample.key, source), data.image_path(sample.key, folder)
        try:
            os.link(original, copy)
        except OSError:
            shutil.copyfile(original, copy)
    data._write_csv(paths.labels_path(folder), ("key", "label"), [(s.key, s.label) for s in samples])
    data._write_csv(paths.manifest_path(folder), data.MANIFEST_FIELDS, samples)  # last: marks the root complete
    return folder


def run_benchmark(
    root=None,
    worker_counts: Sequence[int] | None = None,
    out_dir=None,
    log: Callable[[str], None] = print,
    epochs: int = 3,
    quick: bool = False,
    ceiling_images: int = 2000,
    loaders: Sequence[str] | None = None,
    sections: Sequence[str] | None = None,
) -> dict:
    """Run the benchmark; write ``bench.json`` and ``bench.png`` to ``out_dir``; return the results.

    Every loader (``loaders``: a subset of names, default all) reads the whole dataset at
    ``workers = cores`` for ``epochs`` epochs, interleaved: one epoch of each loader in
    turn, the two decode ceilings before each turn, the starting loader rotating. Each
    reports its median and range. Then the course's original loaders (:data:`SWEPT`) run
    one epoch at each other count in ``worker_counts`` (default ``{0, 1, 2 x cores}``;
    none with ``quick``), then every section of :data:`SECTIONS` (``sections``: a
    subset). Keys of ``bench.json``:

    * ``ceiling_images_per_s_per_core``: decode + standard transform in memory, one process;
      ``parallel_ceiling``: ``cores`` processes doing that at once (:func:`measure_parallel_ceiling`);
    * ``loaders``: per loader the epochs, median, min and max images/s, and
      :func:`where_the_time_goes` in its median epoch;
    * ``best_vs_ceiling``: our best loader's median / the parallel ceiling;
      ``ours_vs_best_peer``: our best / the best peer's (webdataset, torchdata.nodes, SPDL);
    * ``goals``: each ratio against :data:`GOALS`; a goal not reached carries ``limit``,
      the time accounting that says what held the loader back;
    * ``batch_memory``: filling a batch in fresh against reused memory (per image);
    * ``ratios``: between loaders (ours against webdataset, what batching, threads and recycling buy).
    """
    import json
    import platform
    from pathlib import Path

    from packlab import data, pack, paths

    cores = data.available_cores()
    out_dir = Path(out_dir) if out_dir is not None else paths.build_dir() / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = data.load_manifest(root)
    sweep_counts = sorted(set(worker_counts if worker_counts is not None else ([] if quick else [0, 1, 2 * cores]))
                          - {cores})
    started = time.perf_counter()
    results: dict = {
        "machine": {"cores": cores, "python": platform.python_version(), "torch": torch.__version__,
                    "load_average_before": _load_average()},
        "images": len(manifest),
        "settings": {"epochs": epochs, "workers": cores, "batch_size": 64, "quick": quick,
                     "ceiling_images": min(ceiling_images, len(manifest))},
        "goals_set": GOALS,
    }

    encoded = [data.image_path(s.key, root).read_bytes() for s in manifest[:ceiling_images]]
    shards = [str(p) for p in pack.ensure_tar_shards(maxcount=_shard_size(len(manifest), max([cores, *sweep_counts])),
                                                       root=root, progress=False)]
    zip_path = pack.ensure_zip(root=root, progress=False)
    factories = loader_factories(root, shards, zip_path)
    if loaders is not None:
        unknown = set(loaders) - set(factories)
        if unknown:
            raise ValueError(f"unknown loaders {sorted(unknown)}; known: {list(factories)}")
        factories = {name: factories[name] for name in loaders}
    log(f"{len(manifest):,} images, {len(shards)} shards, {cores} cores; {len(factories)} loaders x {epochs} epochs, "
        "interleaved, each turn after the two decode ceilings")

    # 2 x cores workers is one of the measured settings; torch's warning about it says nothing new here.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    single, parallel = [], []
    epochs_of: dict[str, list[dict]] = {name: [] for name in factories}
    with torch_threads(1):  # the main process collects batches (or runs the threads): no intra-op threads
        made = {name: make(cores) for name, (_, make) in factories.items()}
        names = list(made)
        for turn in range(epochs):
            single.append(measure_ceiling(encoded))
            parallel.append(measure_parallel_ceiling(encoded, cores))
            log(f"turn {turn + 1}/{epochs}: decode ceiling {single[-1]:.0f} images/s on one core, "
                f"{parallel[-1]:.0f} on {cores} at once")
            for name in names[turn % len(names):] + names[: turn % len(names)]:
                epoch = timed_epoch(made[name], name)
                epochs_of[name].append(epoch)
                log(f"  {name:28s} {epoch['images_per_s']:7.0f} images/s")
        del made
        ceiling, parallel_ceiling = statistics.median(single), statistics.median(parallel)
        results.update(ceiling_images_per_s_per_core=ceiling, ceiling_runs=single,
                       parallel_ceiling=parallel_ceiling, parallel_ceiling_runs=parallel,
                       ceiling_scaling=parallel_ceiling / (ceiling * cores))
        rows = [_summarise(name, factories[name][0], cores, runs, parallel_ceiling, cores)
                for name, runs in epochs_of.items()]
        results["loaders"] = rows
        sweep = []
        for name in (n for n in SWEPT if n in factories):
            for workers in sweep_counts:
                epoch = timed_epoch(factories[name][1](workers), name)
                sweep.append({"loader": name, "workers": workers, **epoch})
                log(f"  sweep {name:22s} workers={workers}: {epoch['images_per_s']:7.0f} images/s")
        results["sweep"] = sweep
    results["batch_memory"] = batch_memory_seconds()
    results.update(_goals(rows, parallel_ceiling))
    results["ratios"] = _ratios(rows)

    for name, section in SECTIONS.items():
        if sections is None or name in sections:
            results[name] = section(root=root, quick=quick, log=log)
    results["machine"]["load_average_after"] = _load_average()
    results["wall_seconds"] = time.perf_counter() - started

    (out_dir / "bench.json").write_text(json.dumps(results, indent=2, default=str))
    _plot_benchmark(results).savefig(out_dir / "bench.png", dpi=120)
    log("")
    log(format_benchmark(results))
    log(f"\nwrote {out_dir / 'bench.json'} and {out_dir / 'bench.png'} ({results['wall_seconds']:.0f} s)")
    return results


def _goals(rows: list[dict], parallel_ceiling: float) -> dict:
    """``best_vs_ceiling``, ``ours_vs_best_peer`` and ``goals`` (each with its limit when missed)."""

    def best(group):
        members = [r for r in rows if r["group"] == group]
        return max(members, key=lambda r: r["median_images_per_s"]) if members else None

    ours, peer = best(OURS), best(PEER)
    out: dict = {"best_vs_ceiling": None, "ours_vs_best_peer": None, "goals": {}}
    if ours is None:
        return out
    out["best_vs_ceiling"] = ours["median_images_per_s"] / parallel_ceiling
    reached = out["best_vs_ceiling"] >= GOALS["best_vs_ceiling"]
    out["goals"]["best_vs_ceiling"] = {
        "goal": GOALS["best_vs_ceiling"], "measured": out["best_vs_ceiling"], "reached": reached,
        "ours": ours["loader"], "limit": None if reached else ours["where_the_time_goes"],
    }
    if peer is not None:
        out["ours_vs_best_peer"] = ours["median_images_per_s"] / peer["median_images_per_s"]
        reached = out["ours_vs_best_peer"] >= GOALS["ours_vs_best_peer"]
        out["goals"]["ours_vs_best_peer"] = {
            "goal": GOALS["ours_vs_best_peer"], "measured": out["ours_vs_best_peer"], "reached": reached,
            "ours": ours["loader"], "peer": peer["loader"],
            # Overlapping ranges: the runs do not separate the two clearly.
            "ranges_overlap": ours["min_images_per_s"] <= peer["max_images_per_s"],
            "limit": None if reached else {"ours": ours["where_the_time_goes"], "peer": peer["where_the_time_goes"]},
        }
    return out


def _ratios(rows: list[dict]) -> dict:
    """Ratios between loaders that each answer a question (each loader's ratio to the ceiling is in its row)."""
    median = {r["loader"]: r["median_images_per_s"] for r in rows}
    out = {}
    for ratio, (a, b) in {"tar_vs_webdataset": ("tar shards (ours)", "webdataset"),
                          "batching_gain": ("tar shards (ours)", "tar, per-sample float"),
                          "recycling_vs_dataloader_tar": ("recycling, tar shards", "tar shards (ours)"),
                          "threads_vs_dataloader_tar": ("threads, tar shards", "tar shards (ours)")}.items():
        if a in median and b in median:
            out[ratio] = median[a] / median[b]
    return out


def _plot_benchmark(results: dict):
    import matplotlib.pyplot as plt

    from packlab import plots

    cores, rows = results["machine"]["cores"], results["loaders"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 0.9 + 0.45 * max(8, len(rows))),
                                      gridspec_kw={"width_ratios": [3, 2]})
    ordered = sorted(rows, key=lambda r: -r["median_images_per_s"])
    plots.plot_rates_with_ranges(
        [{"name": r["loader"], "median": r["median_images_per_s"], "low": r["min_images_per_s"],
          "high": r["max_images_per_s"], "group": r["group"]} for r in ordered],
        lines={f"{cores} processes decoding at once": results["parallel_ceiling"],
               f"one core's decode x {cores}": results["ceiling_images_per_s_per_core"] * cores},
        ax=left, title=f"{results['images']:,} images, {cores} workers, median of {results['settings']['epochs']} epochs",
    )
    series: dict[str, dict[int, float]] = {}
    for row in results["sweep"]:
        series.setdefault(row["loader"], {})[row["workers"]] = row["images_per_s"]
    for row in rows:
        if row["loader"] in SWEPT:
            series.setdefault(row["loader"], {})[cores] = row["median_images_per_s"]
    plots.plot_throughput_vs_workers(series, ceiling=results["parallel_ceiling"], ax=right,
                                     title="The course's loaders against workers",
                                     ceiling_label=f"{cores} processes decoding at once")
    fig.tight_layout()
    return fig


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def format_benchmark(results: dict) -> str:
    """The benchmark's results as plain text: the loaders' table, the ceilings, the goals and what limits them."""
    cores = results["machine"]["cores"]
    rows = sorted(results["loaders"], key=lambda r: -r["median_images_per_s"])
    width = max(len(r["loader"]) for r in rows)
    lines = [f"images/s, full epochs of {results['images']:,} images at {cores} workers "
             f"(median of {results['settings']['epochs']}, start-up included)",
             f"{'loader'.ljust(width)}  {'group':8} {'median':>7} {'min-max':>11} {'/ceiling':>8}"]
    for r in rows:
        lines.append(f"{r['loader'].ljust(width)}  {r['group']:8} {r['median_images_per_s']:7.0f} "
                     f"{r['min_images_per_s']:5.0f}-{r['max_images_per_s']:<5.0f} {r['vs_parallel_ceiling']:8.2f}")
    if results["sweep"]:
        lines.append("sweep: " + ", ".join(f"{r['loader']} {r['workers']}w {r['images_per_s']:.0f}" for r in results["sweep"]))
    lines.append(f"decode ceiling: {results['ceiling_images_per_s_per_core']:.0f} images/s on one core; "
                 f"{results['parallel_ceiling']:.0f} with {cores} processes at once "
                 f"({results['ceiling_scaling']:.2f} of {cores} x one core)")
    memory = results["batch_memory"]
    lines.append("filling a batch, ms per image: fresh shared memory {:.2f}, fresh private {:.2f}, "
                 "reused private {:.2f}, reused shared {:.2f}".format(
                     *(memory[f"{k}_s_per_image"] * 1e3 for k in ("fresh_shared", "fresh_private", "reused",
                                                                  "reused_shared"))))
    for name, goal in results["goals"].items():
        who = goal["ours"] + (f" / {goal['peer']}" if "peer" in goal else "")
        lines.append(f"{name} = {goal['measured']:.2f} ({who}); goal {goal['goal']:.2f}: "
                     + ("reached" if goal["reached"] else "not reached"))
        if goal.get("ranges_overlap"):
            lines.append("  the two loaders' ranges overlap: no clear difference between them in this run")
        limit = goal["limit"]
        if limit:
            for who, part in ({"ours": limit} if "limited_by" in limit else limit).items():
                lines.append(f"  limit ({who}): {part['limited_by']}")
    lines.append("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in results["ratios"].items()))
    small = results.get("small_files")
    if small:
        lines.append(f"small files ({small['workers']} workers, no decode), files/s under the model "
                     f"[{small['model_text']}]: " + ", ".join(f"{k} {v:.0f}" for k, v in small["modelled_files_per_s"].items())
                     + f"; tar/folder {small['tar_vs_folder_modelled']:.1f}x")
        if small["cold_files_per_s"]:
            lines.append(f"  cold ({small.get('cold_level')}) vs warm, files/s: " + ", ".join(
                f"{k} {v:.0f}" for k, v in small["cold_files_per_s"].items()))
    if results.get("formats"):
        from packlab.formats.bench import format_formats

        lines.append(format_formats(results["formats"]))
    for name in SECTIONS:
        if name in ("small_files", "formats"):
            continue  # printed above
        if isinstance(results.get(name), dict):
            lines.append(f"{name}: {results[name].get('summary', '(see bench.json)')}")
    load = results["machine"]
    lines.append(f"load average before {load['load_average_before']}, after {load['load_average_after']} "
                 f"on {cores} cores: well above {cores} means other programs competed and every figure is low")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m packlab.bench", description=run_benchmark.__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="the whole benchmark on the first --images images: checks that it runs, in minutes")
    parser.add_argument("--images", type=int, default=600, help="images for --quick (default 600)")
    parser.add_argument("--epochs", type=int, default=3, help="interleaved epochs per loader (default 3)")
    parser.add_argument("--workers", type=int, nargs="*", help="worker counts of the sweep (default: 0 1 2xcores)")
    parser.add_argument("--loaders", nargs="*", help="only these loaders (names as in the table)")
    parser.add_argument("--skip", nargs="*", default=[], choices=list(SECTIONS), help="sections to leave out")
    parser.add_argument("--out", help="output folder (default: _build/bench)")
    args = parser.parse_args(argv)
    root = quick_root(args.images, args.out) if args.quick else None
    run_benchmark(root=root, worker_counts=args.workers, out_dir=args.out, epochs=args.epochs, quick=args.quick,
                  loaders=args.loaders, sections=[name for name in SECTIONS if name not in args.skip])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

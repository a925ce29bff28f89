"""What a loader can reach at best on this machine, and where an epoch's CPU time went.

The **decode ceiling** is a loader worker's per-image work on JPEG bytes already in
memory: decode, resize (or crop), and the conversion into the image's place in a batch
buffer that is already mapped; no files, no hand-over, no fresh memory.
:func:`measure_ceiling` measures it for one core, :func:`measure_parallel_ceiling` for
several processes at once. Each input and transform has its own ceiling: the standard
one (:func:`standard_work`) by default, or the ``transform`` and ``write`` a loader's
workers use. No loader doing the same work can beat the parallel ceiling with the same
number of workers, so a loader's rate divided by *its own* ceiling says how much the
loader itself costs.

:func:`batch_memory_seconds` measures one of those costs, filling a batch in fresh
shared memory; :func:`timed_epoch` and :func:`where_the_time_goes` split one epoch's
core-seconds into decoding, other work and idle cores.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from packlab.bench import RatioInterval, Spread, compare, ratio_interval, time_loader, torch_threads


def standard_work() -> tuple[Callable, Callable, tuple, torch.dtype]:
    """The per-image work of the standard loaders' workers: ``(transform, write, batch shape, dtype)``.

    Decode and resize to uint8 with Pillow (:func:`packlab.transforms.decode_and_resize`),
    then convert into the image's slot of a float32 batch (:func:`packlab.transforms.to_tensor`
    with ``out=``), as ``collate_uint8_images`` and the recycling loader do.
    """
    from packlab.transforms import IMAGE_SIZE, decode_and_resize, to_tensor

    def write(pixels, out):
        to_tensor(pixels, out=out)

    return decode_and_resize, write, (64, 3, IMAGE_SIZE, IMAGE_SIZE), torch.float32


def _work_loop(items: Sequence, transform: Callable | None, write: Callable | None, shape, dtype) -> int:
    """Do the per-image work on every item, writing into one batch buffer allocated (and touched) before."""
    if transform is None:
        transform, write, shape, dtype = standard_work()
    buffer = torch.zeros(shape, dtype=dtype) if write is not None else None
    for i, item in enumerate(items):
        pixels = transform(item)
        if write is not None:
            write(pixels, buffer[i % shape[0]])
    return len(items)


def measure_ceiling(items: Sequence, transform: Callable | None = None, write: Callable | None = None,
                    batch_shape: Sequence[int] | None = None, dtype: torch.dtype = torch.uint8) -> float:
    """Images/s of one process doing a loader worker's per-image work on inputs already in memory.

    By default the standard work (:func:`standard_work`) on JPEG bytes. Otherwise
    ``transform(item)`` (decode, crop or resize) and ``write(pixels, slot)`` (the
    conversion into the image's slot of a ``batch_shape`` buffer of ``dtype``, allocated
    once, as a recycled batch is). One process, one torch thread: what one core can do
    when nothing else (files, workers, batching) costs anything. A loader with ``n``
    workers on ``n`` free cores can at best approach ``n`` times this.
    """
    shape = tuple(batch_shape) if batch_shape is not None else None
    with torch_threads(1):
        start = time.perf_counter()
        count = _work_loop(items, transform, write, shape, dtype)
        return count / (time.perf_counter() - start)


def _decode_share(share: Sequence, barrier, results, transform, write, shape, dtype) -> None:
    """One process of :func:`measure_parallel_ceiling`: warm up, wait for the others, then do its share."""
    torch.set_num_threads(1)
    if transform is None:
        transform, write, shape, dtype = standard_work()
    buffer_ready = torch.zeros(shape, dtype=dtype) if write is not None else None  # mapped before the clock
    # A loader's workers are timed from steady state, after their first batch: whatever a process pays on its first
    # image (a decoder made on first use, lazy imports, first allocations) is outside their clock, so it stays outside
    # this one too. The first item is done once more inside the clock, so every item counts exactly once.
    if share:
        pixels = transform(share[0])
        if write is not None:
            write(pixels, buffer_ready[0])
    barrier.wait()
    start = time.monotonic()  # the same clock in every process (CLOCK_MONOTONIC)
    for i, item in enumerate(share):
        pixels = transform(item)
        if write is not None:
            write(pixels, buffer_ready[i % shape[0]])
    results.put((start, time.monotonic(), len(share)))


def measure_parallel_ceiling(items: Sequence, processes: int, transform: Callable | None = None,
                             write: Callable | None = None, batch_shape: Sequence[int] | None = None,
                             dtype: torch.dtype = torch.uint8) -> float:
    """Images/s of ``processes`` processes doing a loader worker's per-image work at the same time.

    The work is :func:`measure_ceiling`'s (the standard one by default, or ``transform``
    and ``write``): exactly what the loader's workers do per image, from bytes already in
    memory into memory already mapped, and nothing else. Each process takes every
    ``processes``-th item, does its first item once untimed (a loader's workers are timed
    after their first batch, :mod:`packlab.steady`), then all start together (a barrier).
    The rate is the sum of the processes' own rates (each one's items over its own time),
    not all items over the time from the first start to the last finish: the second would
    charge the ceiling for the slowest process's tail, an imbalance that a loader handing
    out work as its workers free up does not pay, and a loader could then beat its ceiling
    by a few per cent. Nothing crosses a process boundary and nothing is read from a file,
    so no loader doing the same work with that many workers can beat it: a loader's rate
    divided by it is what the loader itself costs. Give it at least the loader's epoch of
    items (:func:`shard_items`): a short run is the noisiest row of a comparison, and a
    ceiling measured low by chance puts a loader above it (:func:`loader_vs_ceiling`).
    """
    import multiprocessing

    shape = tuple(batch_shape) if batch_shape is not None else None
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    barrier, results = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_decode_share, daemon=True,
                               args=(items[i::processes], barrier, results, transform, write, shape, dtype))
               for i in range(processes)]
    for worker in workers:
        worker.start()
    spans = [results.get(timeout=3600) for _ in workers]
    for worker in workers:
        worker.join()
    return sum(n / (end - start) for start, end, n in spans if n)


def shard_items(shards: Sequence[str], limit: int | None = None) -> list[tuple[bytes, str]]:
    """The samples of some shards as ``(jpeg bytes, key)``, at most ``limit``: a crop ceiling's input, in memory.

    Called with the shards a loader reads in an epoch and no ``limit``, it is that loader's
    epoch of images, the least a ceiling of that loader should run over.
    """
    from packlab.preprocess import iter_samples

    items = []
    for shard in shards:
        for key, files in iter_samples(shard):
            if limit is not None and len(items) >= limit:
                return items
            items.append((files["jpg"], key))
    return items


def crop_ceiling(items: Sequence, processes: int, decode: Callable, channels_last: bool) -> Callable[[], float]:
    """A measure (images/s) of the parallel ceiling of a crop pipeline's per-image work on ``items``.

    The work of :class:`packlab.crops.RandomCrops` per sample (the crop of the key, then
    ``decode``) and the collate's per-image copy into a batch buffer mapped once: N x H x W x C
    (:func:`~packlab.loaders.batching.write_uint8_hwc`) for ``channels_last``, else N x C x H x W
    (:func:`~packlab.loaders.batching.write_uint8_chw`). Chapter 11 and ``make bench`` both
    measure their crop ceilings with it.
    """
    from packlab.crops import TRAIN_SIZE, CropWork
    from packlab.loaders.batching import write_uint8_chw, write_uint8_hwc

    shape = (64, TRAIN_SIZE, TRAIN_SIZE, 3) if channels_last else (64, 3, TRAIN_SIZE, TRAIN_SIZE)
    write = write_uint8_hwc if channels_last else write_uint8_chw
    return lambda: measure_parallel_ceiling(items, processes, CropWork(decode), write, shape, torch.uint8)


def ceiling_figure(runs: Spread) -> float:
    """The figure a ceiling's runs give: the best of them (images/s).

    A ceiling is a bound: the cores doing a loader's work and nothing else. A run of it can
    be slowed (another program, the host of a virtual machine, a lower clock), never sped
    past what the cores can do, so the fastest run is the closest to the bound, and the
    others only say how much this machine disturbed it. That is why ``timeit`` reports the
    best of its repeats (``timeit.Timer.repeat``'s docstring: the lowest time is the one
    that says how fast the machine can run the code). A loader's figure stays its median,
    what it typically delivers. With the median on both sides, a loader doing exactly its
    ceiling's work (``make bench``'s recycling tar loader, say) lands above the ceiling in
    about every second run, by noise alone; against the best run, about one run in twenty
    with six rounds each (:func:`packlab.simulated_runs.passes_its_ceiling`).
    """
    return runs.high


@dataclass(frozen=True)
class CeilingRatio:
    """A loader's steady rates against the ceiling of its own work, measured in the same rounds.

    ``share`` is the loader's median over the ceiling's best run (:func:`ceiling_figure`):
    the share of what the cores can do that the loader typically delivers, the ratio the
    course presents. ``verdict`` is :func:`packlab.bench.compare`'s on the runs themselves
    (-1: the loader's runs clearly below the ceiling's; 0: the runs cannot tell; 1: clearly
    above), and ``interval`` is :func:`packlab.bench.ratio_interval`'s range for the ratio
    of a typical loader run to a typical ceiling run (the range that leaves out 1 exactly
    when the verdict is clear), or None. ``mis_measured`` is True where the loader's median
    passed every run of its ceiling, or its runs are clearly above the ceiling's: no loader
    doing the same work can be, so the ceiling was disturbed in every one of its runs, and
    ``result`` is then None. Otherwise ``result`` is ``share``, at most 1.
    """

    share: float
    verdict: int
    interval: RatioInterval | None = None

    @property
    def mis_measured(self) -> bool:
        return self.share > 1 or self.verdict > 0

    @property
    def result(self) -> float | None:
        return None if self.mis_measured else self.share

    def interval_text(self) -> str:
        """``" (its runs against the ceiling's: 0.70–0.83x)"``, or ``""`` without an interval."""
        if self.interval is None or not self.interval.bounded:
            return ""
        return f" (its runs against the ceiling's: {self.interval.range_text()})"

    def agrees_with(self, other: CeilingRatio) -> bool:
        """Whether two measurements of the same ratio (e.g. chapter 11's and ``make bench``'s) agree within
        their noise: their intervals overlap. Without an interval on either side nothing tells them apart."""
        if self.interval is None or other.interval is None:
            return True
        return self.interval.low <= other.interval.high and other.interval.low <= self.interval.high

    def words(self, loader: str = "the loader") -> str:
        """The ratio in words, every branch: clearly below, not clearly below, mis-measured."""
        if self.mis_measured:
            return (f"{loader} measured above its ceiling (its median passed the ceiling's best run, or its runs were "
                    "clearly above the ceiling's), which no loader doing the same work can be: the ceiling was "
                    "mis-measured, and this run gives no ratio")
        below = "clearly below it" if self.verdict < 0 else "not clearly below it by the course's rule"
        return f"{loader} reached {self.share:.2f} of its ceiling's best run{self.interval_text()}, {below}"


def loader_vs_ceiling(loader: Spread, ceiling: Spread) -> CeilingRatio:
    """A loader's steady rates against its own ceiling's, taken in the same interleaved rounds.

    The one definition of "a loader over its own ceiling" in the course: chapter 11's
    "All together" and ``make bench``'s ``stored_loader_vs_stored_ceiling`` (and every
    ``<loader> vs own ceiling``) both come from here, with their ceilings from
    :func:`crop_ceiling` over the loader's epoch of images (:func:`shard_items`). The share
    is the loader's median over the ceiling's best run (:func:`ceiling_figure`); the verdict
    and its interval compare the runs. The two instruments measure different epochs on
    different runs; they agree where their intervals overlap (:meth:`CeilingRatio.agrees_with`).
    """
    return CeilingRatio(loader.median / ceiling_figure(ceiling), compare(loader, ceiling),
                        ratio_interval(loader, ceiling))


def batch_memory_seconds(batch_size: int = 64, repeats: int = 5) -> dict:
    """Seconds per image to fill a batch in fresh shared, fresh private and reused memory.

    A DataLoader worker builds every batch in a new shared-memory block; the kernel must
    supply (and zero) its pages, one page fault per 4 kB, before the worker can write
    them, and unmap them when the batch is freed. This measures that, per image of the
    standard 3x256x256 float batch, next to writing into memory that is already mapped,
    private (a thread loader's recycled buffer) or shared (a recycling process loader's).
    The kinds are interleaved ``repeats`` times; ``<kind>_s_per_image`` is the median,
    ``ranges`` the min and max, ``runs`` every run (for :func:`packlab.bench.compare`).
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
    out["runs"] = times
    return out


def busy_core_seconds() -> float | None:
    """CPU seconds spent so far by everything on this machine (Linux ``/proc/stat``), or None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed_epoch(loader: Iterable, name: str, on_batch: Callable | None = None) -> dict:
    """One epoch through :func:`time_loader`, with the CPU time this process and the machine spent on it.

    ``on_batch(batch)`` runs on every batch inside the timed region (e.g. recording keys for an audit).
    """
    own, busy = time.process_time(), busy_core_seconds()
    result = time_loader(loader, epochs=1, name=name, on_batch=on_batch)
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

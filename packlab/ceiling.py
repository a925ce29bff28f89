"""What a loader can reach at best on this machine, and where an epoch's CPU time went.

The **decode ceiling** is decode + the standard transform on JPEG bytes already in
memory: no files, no workers, no batches. :func:`measure_ceiling` measures it for one
core, :func:`measure_parallel_ceiling` for several processes at once. No loader that
decodes the same way can beat the parallel ceiling with the same number of workers, so
a loader's rate divided by it says how much the loader itself costs.

:func:`batch_memory_seconds` measures one of those costs, filling a batch in fresh
shared memory; :func:`timed_epoch` and :func:`where_the_time_goes` split one epoch's
core-seconds into decoding, other work and idle cores.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence

import torch

from packlab.bench import time_loader, torch_threads


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

"""A loader whose workers are threads of the training process.

Python runs one thread's bytecode at a time (the GIL), which is why the ``DataLoader``
uses processes. But most of a sample's cost here is not bytecode: Pillow releases the
GIL while it decodes and resizes, and torch releases it inside its operations, such as
the conversion to float. Threads can run those parts at the same time on different
cores. What they cannot run at the same time is the Python around them: parsing a tar
header, grouping members, building a sample tuple. Chapter 8 measures both.

What threads save is the process boundary itself: a batch built by a thread is already
in the training process, so nothing is pickled, sent or mapped. :class:`ThreadLoader`
also reuses its batch buffers (:class:`~packlab.loaders.recycling.BatchBufferPool`,
with the same hand-back as the process loader: a buffer is written again only when no
tensor refers to it any more), so no batch needs fresh pages either.

Map-style datasets are read batch by batch: the main thread hands batch ``k`` to a pool
of ``threads`` threads, keeps ``threads x prefetch`` batches in flight and yields them
in order. Iterable datasets cannot be split by :func:`torch.utils.data.get_worker_info`
between threads, because its answer is one per process; they are read by ``threads``
reader threads instead, each taking its share through ``dataset.iter_share(reader,
readers)`` (as :class:`~packlab.loaders.TarShardDataset` offers), and batches are taken
from the readers in turn, as a ``DataLoader`` takes them from its workers.

An error in a thread (a corrupt image, a truncated shard) is raised in the training loop
as the same exception, after the loader has stopped its threads. A loop that breaks
early stops them too, when the epoch's iterator is dropped or closed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import queue
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from packlab.loaders.recycling import (POLL_SECONDS, STOP_SECONDS, BatchBufferPool, batch_shape, fill_batch,
                                      index_batches, make_batch)
from packlab.transforms import RAW_SHAPE

#: Threads of the loader are named with this prefix (tests look for leftovers by it).
THREAD_PREFIX = "packlab-thread-loader"


def _note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):  # Python 3.11+
        exc.add_note(text)


class ThreadLoader:
    """Batches loaded by ``threads`` threads of this process, in reused buffers.

    ``dataset`` is map-style, or iterable with an ``iter_share(reader, readers)``
    method; samples are ``(image, label)`` or ``(image, label, key)`` with a uint8
    height x width x channels image or a float channels x height x width tensor (see
    :mod:`packlab.loaders.recycling`). ``batch_size``, ``shuffle``, ``sampler``,
    ``drop_last``, ``generator`` and ``timeout`` mean what they mean for a
    ``DataLoader``; ``prefetch`` is batches in flight per thread. ``recycle=False``
    builds every batch in new memory instead, to measure what recycling saves.
    """

    def __init__(
        self,
        dataset,
        *,
        batch_size: int = 64,
        threads: int = 2,
        shuffle: bool = False,
        sampler: Iterable | None = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        prefetch: int = 2,
        image_shape: Sequence[int] = RAW_SHAPE,
        recycle: bool = True,
        timeout: float = 0,
    ):
        if threads < 1 or prefetch < 1:
            raise ValueError(f"ThreadLoader needs threads >= 1 and prefetch >= 1, got {threads} and {prefetch}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.threads = threads
        self.prefetch = prefetch
        self.timeout = timeout
        self.batch_sampler = index_batches(dataset, batch_size, shuffle, sampler, drop_last, generator)
        self.iterable = self.batch_sampler is None
        if self.iterable and not callable(getattr(dataset, "iter_share", None)):
            raise TypeError(
                f"{type(dataset).__name__} is iterable but has no iter_share(reader, readers) method. Threads "
                "cannot split it through get_worker_info(), which answers once per process: give it that "
                "method (TarShardDataset has one), or use packlab.loaders.RecyclingLoader, whose workers are processes."
            )
        self.shape = batch_shape(batch_size, image_shape)
        self.pool = BatchBufferPool(self.shape) if recycle else None

    def __len__(self) -> int:
        if self.iterable:
            raise TypeError("an iterable dataset has no length known in advance")
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator:
        return _ReaderThreadsEpoch(self) if self.iterable else _ThreadPoolEpoch(self)


class _Buffers:
    """Where a batch is written: a recycled buffer from the pool, or new memory every time."""

    def __init__(self, pool: BatchBufferPool | None, shape: tuple):
        self.pool, self.shape = pool, shape

    def take(self) -> tuple[int | None, torch.Tensor]:
        if self.pool is None:
            return None, torch.empty(self.shape, dtype=torch.float32)
        slot = self.pool.acquire()
        return slot, self.pool.buffer(slot)

    def hand_out(self, slot, out: torch.Tensor, count: int) -> torch.Tensor | None:
        if count == 0:
            self.give_back(slot)
            return None
        return out[:count] if self.pool is None else self.pool.lend(slot, count)

    def give_back(self, slot) -> None:
        if self.pool is not None and slot is not None:
            self.pool.release(slot)


def _load_batch(dataset, indices, out):
    """Runs in a pool thread: read samples ``indices`` into ``out``; ``(count, labels, keys)``."""
    return fill_batch((dataset[i] for i in indices), out)


class _ThreadPoolEpoch:
    """One epoch over a map-style dataset: batch ``k`` goes to a pool thread, batches come back in order."""

    def __init__(self, loader: ThreadLoader):
        self.loader = loader
        self.buffers = _Buffers(loader.pool, loader.shape)
        self.batches = iter(loader.batch_sampler)
        self.pending: collections.deque = collections.deque()  # (batch number, slot, buffer, future), in order
        self.sent = 0
        self.executor = ThreadPoolExecutor(loader.threads, thread_name_prefix=THREAD_PREFIX)
        self._finalizer = weakref.finalize(self, _end_pool_epoch, self.executor, self.pending, self.buffers)
        self._top_up()

    def _top_up(self) -> None:
        for indices in itertools.islice(self.batches, self.loader.threads * self.loader.prefetch - len(self.pending)):
            slot, out = self.buffers.take()
            future = self.executor.submit(_load_batch, self.loader.dataset, indices, out)
            self.pending.append((self.sent, slot, out, future))
            self.sent += 1

    def __iter__(self):
        return self

    def __next__(self):
        if not self.pending:
            self.close()
            raise StopIteration
        number, slot, out, future = self.pending[0]
        try:
            count, labels, keys = future.result(timeout=self.loader.timeout or None)
        except Exception as exc:
            if isinstance(exc, concurrent.futures.TimeoutError) and not future.done():
                # A thread cannot be interrupted: stop the others, and let this one give its buffer back when done.
                self._finalizer.detach()
                _end_pool_epoch(self.executor, self.pending, self.buffers, wait=False)
                raise TimeoutError(f"ThreadLoader: batch {number} not ready after {self.loader.timeout:g} s "
                                   "(timeout); is a thread stuck on slow storage?") from None
            self.close()
            _note(exc, f"(raised in a ThreadLoader thread while loading batch {number})")
            raise
        self.pending.popleft()
        batch = make_batch(self.buffers.hand_out(slot, out, count), labels, keys)
        self._top_up()
        return batch

    def close(self) -> None:
        """Stop the threads (each finishes the batch it is on) and give back the buffers of unclaimed batches."""
        self._finalizer()


def _end_pool_epoch(executor: ThreadPoolExecutor, pending: collections.deque, buffers: _Buffers,
                    wait: bool = True) -> None:
    """Cancel the batches not started, wait for the running ones (``wait``), give back every unclaimed buffer.

    A buffer is given back only once no thread can write it: at once for a finished or
    cancelled batch, otherwise when its thread finishes (``wait=False``, after a timeout).
    """
    executor.shutdown(wait=wait, cancel_futures=True)
    while pending:
        _, slot, _, future = pending.popleft()
        if future.done():
            buffers.give_back(slot)
        else:
            future.add_done_callback(lambda _, slot=slot: buffers.give_back(slot))


def _read_share(dataset, reader: int, readers: int, batch_size: int, buffers: _Buffers,
                out: queue.Queue, stop: threading.Event) -> None:
    """Runs in reader thread ``reader``: batches of its share of an iterable dataset, into ``out``."""

    def put(message) -> bool:
        while not stop.is_set():
            try:
                out.put(message, timeout=POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

    slot = None
    try:
        samples = iter(dataset.iter_share(reader, readers))
        while not stop.is_set():
            slot, memory = buffers.take()
            chunk = list(itertools.islice(samples, batch_size))
            count, labels, keys = fill_batch(chunk, memory)
            if chunk:
                if not put(("batch", slot, memory, count, labels, keys)):
                    break
            else:
                buffers.give_back(slot)
            slot = None
            if len(chunk) < batch_size:
                put(("done",))
                return
    except Exception as exc:  # noqa: BLE001 - raised in the training loop
        _note(exc, f"(raised in ThreadLoader reader thread {reader} of {readers})")
        put(("error", exc))
    finally:
        buffers.give_back(slot)  # a batch that was being filled when it failed or was stopped


class _ReaderThreadsEpoch:
    """One epoch over an iterable dataset: reader threads fill batches from their shares, taken in turn."""

    def __init__(self, loader: ThreadLoader):
        self.loader = loader
        self.buffers = _Buffers(loader.pool, loader.shape)
        self.stop = threading.Event()
        readers = loader.threads
        self.queues = [queue.Queue(maxsize=loader.prefetch) for _ in range(readers)]
        self.threads = [
            threading.Thread(target=_read_share, name=f"{THREAD_PREFIX}-reader-{r}", daemon=True,
                             args=(loader.dataset, r, readers, loader.batch_size, self.buffers, self.queues[r],
                                   self.stop))
            for r in range(readers)
        ]
        self.active = list(range(readers))
        self.turn = 0
        self._finalizer = weakref.finalize(self, _end_reader_epoch, self.stop, self.threads, self.queues,
                                           self.buffers)
        for thread in self.threads:
            thread.start()

    def _receive(self, reader: int) -> tuple:
        waited = 0.0
        while True:
            try:
                return self.queues[reader].get(timeout=POLL_SECONDS)
            except queue.Empty:
                waited += POLL_SECONDS
            if not self.threads[reader].is_alive() and self.queues[reader].empty():
                self.close()
                raise RuntimeError(f"ThreadLoader reader thread {reader} ended without finishing its share")
            if self.loader.timeout and waited >= self.loader.timeout:
                self.close()
                raise TimeoutError(f"ThreadLoader: reader {reader} delivered no batch for {self.loader.timeout:g} s "
                                   "(timeout); is it stuck on slow storage?")

    def __iter__(self):
        return self

    def __next__(self):
        while self.active and self._finalizer.alive:  # a closed (finished, failed) epoch stays finished
            reader = self.active[self.turn % len(self.active)]
            message = self._receive(reader)
            if message[0] == "done":
                self.active.remove(reader)
                continue
            if message[0] == "error":
                self.close()
                raise message[1]
            self.turn += 1
            _, slot, memory, count, labels, keys = message
            return make_batch(self.buffers.hand_out(slot, memory, count), labels, keys)
        self.close()
        raise StopIteration

    def close(self) -> None:
        """Stop the reader threads and give back the buffers of batches nobody took."""
        self._finalizer()


def _end_reader_epoch(stop: threading.Event, threads, queues, buffers: _Buffers) -> None:
    stop.set()
    deadline = time.monotonic() + STOP_SECONDS
    for thread, box in zip(threads, queues):
        while thread.is_alive() and time.monotonic() < deadline:
            thread.join(POLL_SECONDS)
            _drain(box, buffers)  # a reader blocked on a full queue sees the stop once there is room
        _drain(box, buffers)
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:  # a thread cannot be killed; it is a daemon thread, so it will not keep Python from exiting
        warnings.warn(f"ThreadLoader: {', '.join(stuck)} still inside the dataset {STOP_SECONDS:g} s after "
                      "being asked to stop (a read that never returns?)", RuntimeWarning, stacklevel=2)


def _drain(box: queue.Queue, buffers: _Buffers) -> None:
    while True:
        try:
            message = box.get_nowait()
        except queue.Empty:
            return
        if message[0] == "batch":
            buffers.give_back(message[1])

"""A process loader that recycles its batch buffers instead of allocating one per batch.

A ``DataLoader`` worker builds every batch in a *new* block of shared memory and sends
the main process a handle to it (a file descriptor and a size, a few hundred bytes
pickled). The block is used once: the batch reaches the training loop, the loop drops
it, the block is freed. So for every batch the kernel has to find, zero and map fresh
pages, one page fault per 4 kB, before the worker can write a single pixel; chapter 8
measures what that costs per image next to writing into memory that is already mapped.

:class:`RecyclingLoader` keeps a pool of batch buffers in shared memory instead, each
mapped once in the main process and in every worker, and hands each one back to the
workers when the training loop is done with it. What travels per batch is a slot
number, the labels and the keys.

When is a batch "done with"?
----------------------------
The loader cannot know when the training loop stops using a batch, and it must never
overwrite one that is still in use: a loop may keep a batch (to log it, to compare with
the next one), or a view of a single image of it. So a buffer goes back to the pool only
when **the last reference to the lent tensor's storage is gone**, which is exactly when
nothing can read those pixels any more. :class:`BatchBufferPool` makes that observable:
for every loan it wraps the buffer in a fresh numpy array, builds the lent tensor on it
with :func:`torch.from_numpy` (its storage then holds the only reference to that array)
and attaches a :func:`weakref.finalize` to the array. Views, slices, ``.numpy()`` and
``untyped_storage()`` of the batch all share that storage, so the array, and the
buffer, stay taken until every one of them is gone; then the finalizer puts the slot
number on a queue of returned slots. The loader takes returned slots from there before
it hands out work, and only then can a worker write into the buffer again.

A training loop that keeps every batch (``batches = list(loader)``) gets correct,
distinct batches all the same: when no buffer is free the pool grows by one. It then
recycles nothing, and behaves like the ``DataLoader``.

Which datasets
--------------
Any map-style dataset (``dataset[i]``) or iterable dataset whose samples are
``(image, label)`` or ``(image, label, key)``, with ``image`` a uint8 height x width x
channels array (the fast path: ``transform=packlab.transforms.decode_and_resize`` or
``raw_to_array``) or an already converted float channels x height x width tensor (the
standard transform). Batches are what ``collate_uint8_images`` and the default collate
give: ``[images, labels]`` or ``[images, labels, keys]``, images float32 N x C x H x W.
Iterable datasets split their work with :func:`torch.utils.data.get_worker_info`, as in
a ``DataLoader``: the workers set it, so :class:`~packlab.loaders.TarShardDataset`
(and ``webdataset``) split shards between them unchanged. In skip mode
(``on_bad_sample="skip"``) skipped samples are left out of their batch, and a batch of
nothing but bad samples is ``None``, as with ``collate_skipping_bad``.

Errors and shutdown
-------------------
An error in a worker (a corrupt image, a truncated shard) reaches the training loop as
the same exception type with the worker's message, which names the file, followed by the
worker's traceback. Before it is raised the workers are stopped: nothing hangs and no
process is left behind, also when the loop breaks early or a worker dies (killed, out of
memory): the main process checks that its workers are alive while it waits.
"""

from __future__ import annotations

import collections
import itertools
import math
import multiprocessing
import os
import pickle
import queue
import random
import threading
import time
import traceback
import weakref
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler, SequentialSampler

from packlab.limits import shm_full_error
from packlab.loaders.skipping import SkippedSample
from packlab.transforms import RAW_SHAPE, to_tensor

#: Seconds the main process waits for a message before it checks that its workers are alive.
POLL_SECONDS = 0.5
#: Seconds a worker gets to finish its batch and exit when asked to stop, before it is terminated.
STOP_SECONDS = 10.0


# ------------------------------------------------------------------ the pool and its hand-back


def shared_float_tensor(shape: Sequence[int]) -> torch.Tensor:
    """An uninitialised float32 tensor allocated directly in shared memory.

    This is how a ``DataLoader`` worker allocates each batch (torch's default collate
    does the same); ``torch.empty(shape).share_memory_()`` would allocate private memory
    first and then copy it over.
    """
    storage = torch.empty(0, dtype=torch.float32)._typed_storage()._new_shared(math.prod(shape), device="cpu")
    return torch.empty(0, dtype=torch.float32).new(storage).view(tuple(shape))


class BatchBufferPool:
    """Batch buffers, lent out as tensors and taken back once nothing refers to them.

    Every buffer is a float32 tensor of ``shape`` (``batch_size`` x C x H x W) with a slot
    number; ``shared=True`` puts them in shared memory, so worker processes can write
    them. The loader :meth:`acquire` s a free slot (a new one is made when none is free),
    a writer fills :meth:`buffer`, and the loader :meth:`lend` s the first ``count``
    images to the training loop. The slot is free again when the last reference to the
    lent tensor's storage is gone (see the module docstring), or when the loader
    :meth:`release` s a slot it never lent. Thread-safe; the finalizers that return lent
    slots only append to a deque, so they may run in any thread at any time.
    """

    def __init__(self, shape: Sequence[int], shared: bool = False):
        self.shape = tuple(shape)
        self.shared = shared
        self._buffers: list[torch.Tensor] = []
        self._free: list[int] = []
        self._lent: set[int] = set()
        self._returned: collections.deque[int] = collections.deque()  # appended to by finalizers
        self._lock = threading.Lock()
        #: Loans made so far (each one a batch that did not need fresh memory, unless it grew the pool).
        self.loans = 0

    def _collect_returned(self) -> None:
        while self._returned:
            slot = self._returned.popleft()
            self._lent.discard(slot)
            self._free.append(slot)

    def acquire(self) -> int:
        """A free slot (made now if none is free). It stays busy until lent and returned, or released."""
        with self._lock:
            self._collect_returned()
            if self._free:
                return self._free.pop()
            try:
                buffer = shared_float_tensor(self.shape) if self.shared else torch.empty(self.shape, dtype=torch.float32)
            except RuntimeError as exc:  # /dev/shm full: say so, with the numbers and the fixes
                explained = shm_full_error(exc, 4 * math.prod(self.shape)) if self.shared else None
                if explained is None:
                    raise
                raise explained from exc
            self._buffers.append(buffer)
            return len(self._buffers) - 1

    def buffer(self, slot: int) -> torch.Tensor:
        """The whole buffer of ``slot``, for whoever fills it (never give it to the training loop)."""
        return self._buffers[slot]

    def buffers(self) -> dict[int, torch.Tensor]:
        """Every buffer by slot, for workers that start now (they map each one once)."""
        return dict(enumerate(self._buffers))

    def lend(self, slot: int, count: int) -> torch.Tensor:
        """The first ``count`` images of ``slot`` as a tensor the pool does not write until it is gone."""
        with self._lock:
            if slot in self._lent:
                raise RuntimeError(f"slot {slot} is lent already: the loader would overwrite a batch in use")
            self._lent.add(slot)
            self.loans += 1
        # A new array object for every loan: its life is the life of the lent tensor's storage.
        array = self._buffers[slot].numpy()
        weakref.finalize(array, self._returned.append, slot)
        return torch.from_numpy(array)[:count]

    def release(self, slot: int) -> None:
        """Put back a slot that was acquired but not lent (an empty or failed batch, a stopped epoch)."""
        with self._lock:
            if slot in self._lent or slot in self._free:
                raise RuntimeError(f"slot {slot} is not busy: it cannot be released")
            self._free.append(slot)

    def counts(self) -> dict[str, int]:
        """``size`` (buffers made), ``free``, ``lent`` (to the training loop) and ``busy`` (with the loader)."""
        with self._lock:
            self._collect_returned()
            size, free, lent = len(self._buffers), len(self._free), len(self._lent)
        return {"size": size, "free": free, "lent": lent, "busy": size - free - lent}

    def __repr__(self) -> str:
        counts = ", ".join(f"{k} {v}" for k, v in self.counts().items())
        return f"BatchBufferPool({'shared' if self.shared else 'private'} {self.shape}: {counts})"


# ------------------------------------------------------------------ filling one batch


def write_image(out: torch.Tensor, image, where: str) -> None:
    """Write one sample's image into its place ``out`` (C x H x W float32) in a batch buffer.

    A uint8 H x W x C array is converted as :func:`packlab.transforms.to_tensor` does (the
    same arithmetic, so the pixels are bit-identical); a float C x H x W tensor is copied.
    ``where`` names the sample in the error for an image of another shape.
    """
    if isinstance(image, torch.Tensor):
        if tuple(image.shape) != tuple(out.shape):
            raise ValueError(f"{where}: image tensor of shape {tuple(image.shape)}, the loader's batches hold "
                             f"{tuple(out.shape)}. Pass image_shape= to the loader for other sizes.")
        out.copy_(image)
        return
    pixels = np.asarray(image)
    channels, height, width = out.shape
    if pixels.dtype != np.uint8 or pixels.shape != (height, width, channels):
        raise ValueError(f"{where}: image of {pixels.dtype} {pixels.shape}, the loader expects uint8 "
                         f"{(height, width, channels)} (height x width x channels) or a float tensor "
                         f"{tuple(out.shape)}. Pass image_shape= to the loader for other sizes.")
    to_tensor(pixels, out=out)


def fill_batch(samples: Iterable, out: torch.Tensor) -> tuple[int, list[int], list | None]:
    """Write ``samples`` into the batch buffer ``out``; return ``(count, labels, keys or None)``.

    Skipped samples (:class:`~packlab.loaders.skipping.SkippedSample`) are left out, so
    ``count`` can be smaller than the number of samples.
    """
    count, labels, keys = 0, [], []
    for sample in samples:
        if isinstance(sample, SkippedSample):
            continue
        image, label, *rest = sample
        where = f"sample {rest[0]}" if rest else f"sample {count} of the batch"
        write_image(out[count], image, where)
        labels.append(int(label))
        if rest:
            keys.append(rest[0])
        count += 1
    return count, labels, (keys if keys else None)


def make_batch(images: torch.Tensor | None, labels: list[int], keys: list | None) -> list | None:
    """``[images, labels]`` or ``[images, labels, keys]``, as the default collate gives; None for no samples."""
    if images is None:
        return None
    batch = [images, torch.tensor(labels, dtype=torch.int64)]
    if keys is not None:
        batch.append(tuple(keys))
    return batch


def batch_shape(batch_size: int, image_shape: Sequence[int]) -> tuple[int, int, int, int]:
    """The float batch shape N x C x H x W for uint8 images of ``image_shape`` (H x W x C)."""
    height, width, channels = image_shape
    return (batch_size, channels, height, width)


def index_batches(dataset, batch_size: int, shuffle: bool, sampler, drop_last: bool, generator) -> BatchSampler | None:
    """The batches of indices a ``DataLoader`` would read from a map-style dataset; None for an iterable one.

    ``sampler`` (e.g. a ``DistributedSampler``) replaces the default: random order with
    ``shuffle`` (drawn from ``generator``), else in order. An iterable dataset orders its
    own samples, so it takes neither.
    """
    if isinstance(dataset, IterableDataset):
        if shuffle or sampler is not None:
            raise ValueError("an iterable dataset orders its own samples: shuffle and sampler are for map-style ones")
        return None
    if sampler is None:
        sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
    return BatchSampler(sampler, batch_size, drop_last)


# ------------------------------------------------------------------ errors across the boundary


def describe_error(exc: BaseException) -> tuple:
    """An exception as ``(class or None, message, traceback text)``: always picklable."""
    kind = type(exc)
    try:
        pickle.loads(pickle.dumps(kind))
    except Exception:  # noqa: BLE001 - a class defined where the main process cannot import it
        kind = None
    return kind, f"{type(exc).__name__}: {exc}" if kind is None else str(exc), traceback.format_exc()


def rebuild_error(described: tuple, where: str) -> BaseException:
    """The exception to raise in the main process: same type, the worker's message first, then its traceback."""
    kind, message, trace = described
    text = f"{message}\n\n{where}; its traceback:\n{trace}"
    if kind is not None:
        try:
            return kind(text)
        except Exception:  # noqa: BLE001 - a constructor that wants other arguments
            pass
    return RuntimeError(text)


# ------------------------------------------------------------------ the worker process


def _set_worker_info(worker_id: int, num_workers: int, seed: int, dataset) -> None:
    """Answer :func:`torch.utils.data.get_worker_info` in this process as a DataLoader worker does.

    Datasets (and the skip counter) ask it which share of the work and which counter row
    is theirs. torch keeps the answer in a module variable that its own worker loop sets;
    there is no public setter, so we set the same variable.
    """
    from torch.utils.data._utils import worker as torch_worker

    torch_worker._worker_info = torch_worker.WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                                        dataset=dataset)


def _next_message(inbox, parent: int):
    """The next message from the main process; None (stop) if this worker's parent has died.

    The parent is the main process under fork and spawn, the fork server under forkserver
    (which exits with the main process); either way it changes when orphaned.
    """
    while True:
        try:
            return inbox.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _worker_loop(dataset, worker_id, num_workers, seed, iterable, batch_size, buffers, inbox, outbox):
    """One worker: fill the batch buffers it is given, report each batch by slot number.

    Map-style: each message is ``(batch number, indices, slot, buffer or None)``.
    Iterable: each message grants a slot ``(slot, buffer or None)`` for its next batch.
    ``None`` means stop. A buffer travels only the first time this worker gets its slot.
    """
    parent = os.getppid()
    torch.set_num_threads(1)  # one process per core: no intra-op threads competing for it
    random.seed(seed)
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    _set_worker_info(worker_id, num_workers, seed, dataset)
    buffers = dict(buffers)
    try:
        if not iterable:
            while (message := _next_message(inbox, parent)) is not None:
                number, indices, slot, buffer = message
                if buffer is not None:
                    buffers[slot] = buffer
                try:
                    count, labels, keys = fill_batch((dataset[i] for i in indices), buffers[slot])
                except Exception as exc:  # noqa: BLE001 - reported to the main process, which raises it
                    outbox.put(("error", worker_id, number, slot, describe_error(exc)))
                    continue
                outbox.put(("batch", worker_id, number, slot, count, labels, keys))
            return
        samples = iter(dataset)
        for number in itertools.count():
            message = _next_message(inbox, parent)
            if message is None:
                return
            slot, buffer = message
            if buffer is not None:
                buffers[slot] = buffer
            try:
                chunk = list(itertools.islice(samples, batch_size))
                count, labels, keys = fill_batch(chunk, buffers[slot])
            except Exception as exc:  # noqa: BLE001 - an iterator that raised is finished
                outbox.put(("error", worker_id, number, slot, describe_error(exc)))
                return
            if chunk:
                outbox.put(("batch", worker_id, number, slot, count, labels, keys))
            if len(chunk) < batch_size:  # the share is finished; slots still granted stay unused
                outbox.put(("done", worker_id, number, None))
                return
    except KeyboardInterrupt:
        pass


# ------------------------------------------------------------------ the loader


class RecyclingLoader:
    """Batches from ``workers`` processes, written into recycled shared-memory buffers.

    ``dataset`` is map-style or iterable (see the module docstring for what its samples
    must be). ``batch_size``, ``shuffle``, ``sampler``, ``drop_last``, ``generator`` and
    ``timeout`` mean what they mean for a ``DataLoader``; ``prefetch`` is its
    ``prefetch_factor`` (batches in flight per worker) and ``multiprocessing_context``
    its start method (``"fork"``, ``"spawn"``, ``"forkserver"``; default: the
    platform's). Workers start with each epoch, as with ``persistent_workers=False``; the
    pool of buffers lives as long as the loader, so later epochs reuse it.

    ``image_shape`` (height, width, channels) sizes the buffers: every image of a
    batch must have it. ``loader.pool`` shows how many buffers exist and where they are.
    """

    def __init__(
        self,
        dataset,
        *,
        batch_size: int = 64,
        workers: int = 2,
        shuffle: bool = False,
        sampler: Iterable | None = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        prefetch: int = 2,
        multiprocessing_context: str | None = None,
        image_shape: Sequence[int] = RAW_SHAPE,
        timeout: float = 0,
    ):
        if workers < 1 or prefetch < 1:
            raise ValueError(f"RecyclingLoader needs workers >= 1 and prefetch >= 1, got {workers} and {prefetch}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.workers = workers
        self.prefetch = prefetch
        self.timeout = timeout
        self.batch_sampler = index_batches(dataset, batch_size, shuffle, sampler, drop_last, generator)
        self.iterable = self.batch_sampler is None
        self.generator = generator
        self.context = multiprocessing.get_context(multiprocessing_context)
        self.pool = BatchBufferPool(batch_shape(batch_size, image_shape), shared=True)

    def __len__(self) -> int:
        if self.iterable:
            raise TypeError("an iterable dataset has no length known in advance")
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator:
        return _RecyclingEpoch(self)


class _RecyclingEpoch:
    """One epoch of a :class:`RecyclingLoader`: its worker processes and the bookkeeping of its slots."""

    def __init__(self, loader: RecyclingLoader):
        self.loader = loader
        self.pool = loader.pool
        self.busy: set[int] = set()  # slots handed to workers and not yet lent or released
        self.known: list[set[int]] = []  # slots each worker has mapped
        self.yielded = 0
        context = loader.context
        base_seed = int(torch.empty((), dtype=torch.int64).random_(generator=loader.generator).item())
        self.outbox = context.Queue()
        self.inboxes, self.processes = [], []
        buffers = self.pool.buffers()
        for worker_id in range(loader.workers):
            inbox = context.Queue()
            process = context.Process(
                target=_worker_loop, daemon=True, name=f"packlab-recycling-{worker_id}",
                args=(loader.dataset, worker_id, loader.workers, base_seed + worker_id, loader.iterable,
                      loader.batch_size, buffers, inbox, self.outbox),
            )
            self.inboxes.append(inbox)
            self.processes.append(process)
            self.known.append(set(buffers))
        # Also runs if the epoch is dropped half-way (a `break`); it holds no reference to self.
        self._finalizer = weakref.finalize(self, _end_epoch, self.processes, self.inboxes, self.outbox,
                                           self.pool, self.busy)
        try:
            for process in self.processes:
                process.start()  # under spawn/forkserver this pickles the dataset, which may fail
        except BaseException:
            self._finalizer()  # stop the workers that did start
            raise
        if loader.iterable:
            self.active = list(range(loader.workers))  # workers whose share is not finished, in turn
            self.turn = 0
            self.granted: list[set[int]] = [set() for _ in range(loader.workers)]  # batch not yet yielded
            self.held: list[collections.deque] = [collections.deque() for _ in range(loader.workers)]
        else:
            self.batches = iter(loader.batch_sampler)
            self.total = len(loader.batch_sampler)
            self.sent = 0
            self.ready: dict[int, tuple] = {}  # batch number -> message, arrived ahead of its turn
        self._top_up()

    # -- handing out work --------------------------------------------------------

    def _slot_for(self, worker_id: int) -> tuple[int, torch.Tensor | None]:
        """A free slot for a worker, with its buffer if that worker has not mapped it yet."""
        slot = self.pool.acquire()
        self.busy.add(slot)
        if slot in self.known[worker_id]:
            return slot, None
        self.known[worker_id].add(slot)
        return slot, self.pool.buffer(slot)

    def _top_up(self) -> None:
        """Keep ``prefetch`` batches in flight per worker, counting batches not yet handed to the loop."""
        loader = self.loader
        if loader.iterable:
            for worker_id in self.active:
                while len(self.granted[worker_id]) < loader.prefetch:
                    slot, buffer = self._slot_for(worker_id)
                    self.granted[worker_id].add(slot)
                    self.inboxes[worker_id].put((slot, buffer))
            return
        while self.sent < self.total and self.sent - self.yielded < loader.prefetch * loader.workers:
            indices = next(self.batches)
            worker_id = self.sent % loader.workers
            self.inboxes[worker_id].put((self.sent, indices) + self._slot_for(worker_id))
            self.sent += 1

    # -- receiving ---------------------------------------------------------------

    def _receive(self) -> tuple:
        """The next message from any worker; raises if a worker died or the timeout passed."""
        waited = 0.0
        while True:
            try:
                return self.outbox.get(timeout=POLL_SECONDS)
            except queue.Empty:
                waited += POLL_SECONDS
            for worker_id, process in enumerate(self.processes):
                # Only an iterable worker ends on its own, with exit code 0, after its last message.
                if process.exitcode is not None and (process.exitcode != 0 or not self.loader.iterable):
                    self._fail(RuntimeError(_death_message(worker_id, process)))
            if self.loader.timeout and waited >= self.loader.timeout:
                self._fail(TimeoutError(f"RecyclingLoader: no batch for {self.loader.timeout:g} s "
                                        f"(timeout={self.loader.timeout:g}); are the workers stuck on slow storage?"))

    def _fail(self, error: BaseException):
        """Stop every worker, give back their slots, then raise ``error``."""
        self.close()
        raise error

    def _hand_out(self, message: tuple):
        """Lend a batch message's slot to the training loop, or raise the error it reports."""
        kind, worker_id, number, slot = message[:4]
        if kind == "error":
            self.busy.discard(slot)
            self.pool.release(slot)
            where = f"raised in RecyclingLoader worker {worker_id} (pid {self.processes[worker_id].pid})"
            self._fail(rebuild_error(message[4], where))
        count, labels, keys = message[4:]
        self.busy.discard(slot)
        self.yielded += 1
        if count == 0:
            self.pool.release(slot)
            return None
        return make_batch(self.pool.lend(slot, count), labels, keys)

    def __iter__(self):
        return self

    def __next__(self):
        if self._finalizer.alive is False:
            raise StopIteration
        return self._next_iterable() if self.loader.iterable else self._next_map_style()

    def _next_map_style(self):
        if self.yielded == self.total:
            self.close()
            raise StopIteration
        while self.yielded not in self.ready:
            message = self._receive()
            self.ready[message[2]] = message
        message = self.ready.pop(self.yielded)
        batch = self._hand_out(message)
        self._top_up()
        return batch

    def _next_iterable(self):
        while self.active:
            worker_id = self.active[self.turn % len(self.active)]
            while not self.held[worker_id]:
                message = self._receive()
                self.held[message[1]].append(message)
            message = self.held[worker_id].popleft()
            if message[0] == "done":
                # Its batches have all been handed out; the slots still granted to it were never written.
                self.active.remove(worker_id)
                for slot in self.granted[worker_id]:
                    self.busy.discard(slot)
                    self.pool.release(slot)
                self.granted[worker_id].clear()
                continue
            self.turn += 1
            self.granted[worker_id].discard(message[3])
            batch = self._hand_out(message)
            self._top_up()
            return batch
        self.close()
        raise StopIteration

    # -- shutdown ----------------------------------------------------------------

    def close(self) -> None:
        """Stop the workers (finishing or terminating them) and give every slot they held back to the pool."""
        self._finalizer()  # stops and joins every worker, then releases their slots (once)


def _death_message(worker_id: int, process) -> str:
    code = process.exitcode
    text = f"RecyclingLoader worker {worker_id} (pid {process.pid}) exited unexpectedly with exit code {code}"
    if code is not None and code < 0:
        import signal

        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        text += f" (killed by {name})"
        if name == "SIGBUS":
            text += "; SIGBUS in a loader worker usually means the shared memory (/dev/shm) is full"
        if name == "SIGKILL":
            text += "; SIGKILL often comes from the kernel's out-of-memory killer (see dmesg)"
    return text + ". The epoch cannot continue; its other workers have been stopped."


def _end_epoch(processes, inboxes, outbox, pool: BatchBufferPool, busy: set[int]) -> None:
    """Stop the workers, then give the slots they held back to the pool (no process can write them now)."""
    _stop_workers(processes, inboxes, outbox)
    for slot in busy:
        pool.release(slot)
    busy.clear()


def _stop_workers(processes, inboxes, outbox) -> None:
    """Ask every worker to stop, give it ``STOP_SECONDS`` to finish its batch, terminate what is left."""
    for process, inbox in zip(processes, inboxes):
        if process.is_alive():
            try:
                inbox.put(None)
            except (OSError, ValueError):
                pass
    deadline = time.monotonic() + STOP_SECONDS
    for process in processes:
        if process.pid is not None:
            process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.terminate()
            process.join()
    for inbox in inboxes:
        inbox.cancel_join_thread()  # what is still queued for dead workers is not worth waiting for
        inbox.close()
    outbox.cancel_join_thread()
    outbox.close()

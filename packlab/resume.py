"""Stop in the middle of an epoch and carry on later, with every sample exactly once over the two runs.

A job on a cluster is stopped by its time limit, by preemption or by a crash, usually in the
middle of an epoch. Restarting the epoch from its beginning repeats samples the model has
already seen; skipping to the next epoch loses the rest of this one. What a restart needs
is the *position* of the data pipeline, saved with the model, at **sample granularity**.

For a map-style dataset the position is the sampler's: torchdata's ``StatefulDataLoader``
saves the shuffled index order and how many indices it has handed out. For a stream of
tar shards, every reader (each DataLoader worker, or the main process) has its own
position, and it has three parts:

1. **which shards**, in which order: this reader's share of the epoch's shard order;
2. **how far**: the shard being read and how many of its samples were taken from it;
3. **the shuffle buffer**: samples already read from the shards but not yet delivered.
   Saving their bytes would cost about 110 kB each (a 1,000-sample buffer is 110 MB per
   worker), so the state keeps where each one came from, ``(shard, position)``, and on
   resume the buffer is **re-filled** by reading those samples again (the re-fill rule;
   the buffer holds samples of the last few shards only). The random generator's state
   is saved too, so the resumed run draws what the uninterrupted one would have drawn.

:class:`ShardStream` is one reader's share, read through a shuffle buffer, as a state
machine whose :meth:`~ShardStream.state` can be taken between any two samples.
:class:`packlab.loaders.tar.TarShardDataset` reads through it and offers
``state_dict()`` / ``load_state_dict()``, the protocol torchdata's ``StatefulDataLoader``
calls **inside each worker** (``torchdata/stateful_dataloader/worker.py``) and ships back
with every batch, so that ``loader.state_dict()`` in the training process describes the
batches delivered so far, not the ones still waiting in the prefetch queues.

When the worker count or the number of ranks changes
----------------------------------------------------
``StatefulDataLoader.load_state_dict`` refuses another worker count
(``assert self._num_workers == state_dict["_num_workers"]``). The states of the old readers
still say exactly what is left: each reader's buffer, the rest of its current shard, and
its shards not yet opened (:func:`pieces_left`). :func:`epoch_state` gathers them from one
or more saved loaders (several ranks); a dataset given that state re-splits the pieces
between its new readers. Every sample then still arrives exactly once, but in another order
than an uninterrupted run, and the readers' shares are less even (a piece may be a single
buffered sample or a whole shard).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

#: Raised when the layout of a saved state changes; a state of another version is refused.
STATE_VERSION = 1


class ResumeError(RuntimeError):
    """A saved position cannot be used: other shards, another epoch, or a shard that changed."""


class Piece(NamedTuple):
    """A part of one shard that a reader still has to deliver.

    ``positions`` None: every sample of ``shard`` from position ``start`` on. Otherwise
    only the samples at these positions (samples that sat in a shuffle buffer).
    """

    shard: str
    start: int = 0
    positions: tuple[int, ...] | None = None

    def to_list(self) -> list:
        return [self.shard, self.start, None if self.positions is None else list(self.positions)]

    @classmethod
    def from_list(cls, item: Sequence) -> Piece:
        shard, start, positions = item
        return cls(str(shard), int(start), None if positions is None else tuple(int(p) for p in positions))


def read_piece(piece: Piece, read_shard: Callable[[str], Iterable], start: int = 0) -> Iterator[tuple[int, Any]]:
    """``(position in the shard, sample)`` for the samples of ``piece`` at or after ``start``.

    The shard is read from its beginning (a tar stream cannot seek), the samples before
    the piece are passed over undecoded, and reading stops after a position piece's last
    sample. Raises :class:`ResumeError` when the shard holds fewer samples than the piece names.
    """
    first = max(start, piece.start)
    wanted = None if piece.positions is None else sorted(p for p in piece.positions if p >= first)
    if wanted == []:
        return
    samples = iter(read_shard(piece.shard))
    try:
        position = -1
        for position, sample in enumerate(samples):
            if position < first:
                continue
            if wanted is None or position in wanted:
                yield position, sample
            if wanted is not None and position >= wanted[-1]:
                return
        if wanted is not None or position + 1 < first:
            raise ResumeError(
                f"shard {piece.shard} holds {position + 1} samples, but the saved position needs sample "
                f"{wanted[-1] if wanted else first}: the shard changed since the state was saved. Resume only "
                "with the shards the state was saved with."
            )
    finally:
        close = getattr(samples, "close", None)
        if close is not None:
            close()  # the shard's file or connection, now rather than when the generator is collected


class ShardStream:
    """One reader's pieces of an epoch, read in order through a shuffle buffer, with a saveable position.

    It delivers exactly what :func:`packlab.loaders.tar.shuffle_buffer` delivers for the same
    samples and generator (fill the buffer; then for each new sample yield a random buffered
    one and put the new one in its place; at the end shuffle what is left and yield it in
    order), but one sample per ``next()``, so that between two samples its whole state is in
    a few attributes:

    * ``pieces`` (what to read), ``next_piece`` and ``next_position`` (how far);
    * ``buffer``: ``(piece index, position, key)`` of each buffered sample, in buffer order;
    * ``draining``: the pieces are exhausted and the buffer is being emptied in order;
    * the generator's state, and ``delivered``, the samples handed out so far.

    ``read_shard(shard)`` yields the shard's samples (anything with a ``.key``), the same
    ones in the same order every time it is called.
    """

    def __init__(self, pieces: Sequence[Piece], read_shard: Callable[[str], Iterable], buffer_size: int,
                 rng: random.Random):
        self.pieces = list(pieces)
        self.read_shard = read_shard
        self.buffer_size = buffer_size
        self.rng = rng
        self.next_piece = 0
        self.next_position = pieces[0].start if pieces else 0
        self.buffer: list[tuple[int, int, Any]] = []  # (piece index, position, sample)
        self.draining = False
        self.delivered = 0
        self._reading: Iterator | None = None  # the open piece

    def __iter__(self) -> ShardStream:
        return self

    def _read_one(self) -> tuple[int, int, Any] | None:
        """The next sample of the pieces as ``(piece index, position, sample)``, or None after the last."""
        while self.next_piece < len(self.pieces):
            if self._reading is None:
                self._reading = read_piece(self.pieces[self.next_piece], self.read_shard, self.next_position)
            found = next(self._reading, None)
            if found is None:
                self._reading = None
                self.next_piece += 1
                self.next_position = self.pieces[self.next_piece].start if self.next_piece < len(self.pieces) else 0
                continue
            position, sample = found
            self.next_position = position + 1
            return self.next_piece, position, sample
        return None

    def __next__(self):
        if self.buffer_size <= 1 and not self.buffer:  # no shuffling: pass the samples through
            item = self._read_one()
            if item is None:
                raise StopIteration
            self.delivered += 1
            return item[2]
        while not self.draining:
            item = self._read_one()
            if item is None:
                self.draining = True
                self.rng.shuffle(self.buffer)
                break
            if len(self.buffer) < self.buffer_size:
                self.buffer.append(item)
                continue
            i = self.rng.randrange(self.buffer_size)
            out, self.buffer[i] = self.buffer[i], item
            self.delivered += 1
            return out[2]
        if not self.buffer:
            raise StopIteration
        self.delivered += 1
        return self.buffer.pop(0)[2]

    def close(self) -> None:
        """Close the shard being read (its file or connection)."""
        if self._reading is not None:
            self._reading.close()
            self._reading = None

    # ------------------------------------------------------------------ saving and restoring

    def state(self) -> dict:
        """Where this stream stands, as plain lists and numbers (for ``torch.save`` or JSON)."""
        version, internal, gauss = self.rng.getstate()
        return {
            "pieces": [p.to_list() for p in self.pieces],
            "next_piece": self.next_piece,
            "next_position": self.next_position,
            "buffer": [[index, position, sample.key] for index, position, sample in self.buffer],
            "draining": self.draining,
            "rng": [version, list(internal), gauss],
            "delivered": self.delivered,
            "buffer_size": self.buffer_size,
        }

    @classmethod
    def restore(cls, state: dict, read_shard: Callable[[str], Iterable]) -> ShardStream:
        """A stream that goes on where ``state`` was taken, re-filling its buffer from the shards.

        The buffer's samples are read again from their shards (each such shard from its start
        up to the last buffered position) and checked against the saved keys.
        """
        pieces = [Piece.from_list(p) for p in state["pieces"]]
        stream = cls(pieces, read_shard, int(state["buffer_size"]), random.Random())
        version, internal, gauss = state["rng"]
        stream.rng.setstate((version, tuple(internal), gauss))
        stream.next_piece, stream.next_position = int(state["next_piece"]), int(state["next_position"])
        stream.draining, stream.delivered = bool(state["draining"]), int(state["delivered"])
        wanted: dict[int, dict[int, str]] = {}
        for index, position, key in state["buffer"]:
            wanted.setdefault(int(index), {})[int(position)] = key
        found: dict[tuple[int, int], Any] = {}
        for index, positions in sorted(wanted.items()):
            piece = Piece(pieces[index].shard, 0, tuple(positions))
            for position, sample in read_piece(piece, read_shard):
                if sample.key != positions[position]:
                    raise ResumeError(
                        f"sample {position} of shard {piece.shard} is {sample.key}, the saved state says "
                        f"{positions[position]}: the shard changed since the state was saved"
                    )
                found[index, position] = sample
        stream.buffer = [(int(i), int(p), found[int(i), int(p)]) for i, p, _ in state["buffer"]]
        return stream


def pieces_left(state: dict) -> list[Piece]:
    """What one reader still had to deliver when ``state`` was taken: its buffer, its current piece, the rest.

    Buffered samples come first, one piece per shard, then the rest of the piece being read,
    then the pieces not yet opened.
    """
    pieces = [Piece.from_list(p) for p in state["pieces"]]
    by_shard: dict[int, list[int]] = {}
    for index, position, _ in state["buffer"]:
        by_shard.setdefault(int(index), []).append(int(position))
    left = [Piece(pieces[i].shard, 0, tuple(sorted(ps))) for i, ps in sorted(by_shard.items())]
    if state["draining"]:
        return left
    current = int(state["next_piece"])
    if current < len(pieces):
        piece = pieces[current]
        start = int(state["next_position"])
        positions = None if piece.positions is None else tuple(p for p in piece.positions if p >= start)
        if positions is None or positions:
            left.append(Piece(piece.shard, max(start, piece.start), positions))
        left += pieces[current + 1:]
    return left


# ------------------------------------------------------------ the states of several readers


def reader_states(loader_state: dict) -> list[dict]:
    """The dataset states of every worker in a ``StatefulDataLoader.state_dict()``, in worker order.

    torchdata 0.11 keeps them under ``_snapshot / _worker_snapshots / worker_<i> /
    dataset_state``; with ``num_workers=0`` the dataset's state is ``dataset_state``
    itself. (The dict's layout is torchdata's own; this is the one place that reads it.)
    """
    if "_snapshot" in loader_state:
        workers = loader_state["_snapshot"]["_worker_snapshots"]
        return [workers[f"worker_{i}"]["dataset_state"] for i in range(len(workers))]
    return [loader_state["dataset_state"]]


def epoch_state(*states: dict) -> dict:
    """One state for a whole epoch, from the saved loaders of every rank (or from reader states).

    Give each rank's ``StatefulDataLoader.state_dict()`` (or a dataset's reader states). A
    dataset that loads the result splits what is left between *its* readers, whatever
    their number (see the module's docstring).
    """
    readers: list[dict] = []
    for state in states:
        if state.get("kind") == "reader":
            readers.append(state)
        elif state.get("kind") == "epoch":
            readers += state["readers"]
        else:
            readers += reader_states(state)
    started = [r for r in readers if r.get("stream") is not None]
    epochs = {r["epoch"] for r in readers}
    if len(epochs) != 1:
        raise ResumeError(f"the states come from different epochs {sorted(epochs)}: save every rank at the same step")
    layouts = {(r["world_size"], r["num_workers"]) for r in readers}
    expected = sum(1 for _ in readers)
    world_size, num_workers = next(iter(layouts)) if len(layouts) == 1 else (None, None)
    if world_size is not None and expected != world_size * num_workers:
        raise ResumeError(
            f"{expected} reader states for {world_size} rank(s) x {num_workers} worker(s): pass the saved state of "
            "every rank, or the pieces of the missing ones would be lost"
        )
    return {"version": STATE_VERSION, "kind": "epoch", "epoch": readers[0]["epoch"], "readers": readers,
            "started": len(started)}


def epoch_pieces_left(state: dict) -> list[Piece]:
    """Every piece left in an epoch state, reader after reader."""
    left: list[Piece] = []
    for reader in state["readers"]:
        if reader.get("stream") is None:  # this reader had not started: all of its share is left
            left += [Piece(s) for s in reader["share"]]
        else:
            left += pieces_left(reader["stream"])
    return left


# ------------------------------------------------------------- any loader that saves its state


def stop_and_resume(make_loader: Callable[[], Any], stop_after: int) -> tuple[list[str], list[str]]:
    """Read ``stop_after`` batches, save the loader's state, and read the rest with a new loader that loaded it.

    ``make_loader()`` builds a loader with ``state_dict()``/``load_state_dict()`` (torchdata's
    ``StatefulDataLoader``, MosaicML Streaming's or LitData's ``StreamingDataLoader``) whose
    batches are ``(images, labels, keys)``. Returns the keys before and after the stop. The
    first loader is dropped before the second is made (MDS refuses two live datasets on one
    folder).
    """
    import gc

    loader = make_loader()
    first: list[str] = []
    iterator = iter(loader)
    for _ in range(stop_after):
        first += [str(k) for k in next(iterator)[2]]
    state = loader.state_dict()
    del iterator, loader
    gc.collect()
    again = make_loader()
    again.load_state_dict(state)
    rest = [str(k) for batch in again for k in batch[2]]
    del again
    gc.collect()
    return first, rest

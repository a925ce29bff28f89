"""One reader's position in an epoch of tar shards: pieces, the shuffle-buffer stream, the states of several readers.

See :mod:`packlab.resume` for what a position holds and why.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

#: Raised when the layout of a saved state changes; a state of another version is refused.
#: Version 2: byte offsets of the buffered samples and of the position in the current shard.
STATE_VERSION = 2


class ResumeError(RuntimeError):
    """A saved position cannot be used: other shards, another epoch, or a shard that changed."""


class Piece(NamedTuple):
    """A part of one shard that a reader still has to deliver.

    ``positions`` None: every sample of ``shard`` from position ``start`` on, whose headers
    begin at byte ``start_byte`` (None: not known, read the shard from byte 0). Otherwise
    only the samples at these positions (samples that sat in a shuffle buffer), which
    occupy the bytes ``spans`` (``(begin, end)`` each; None: not known).
    """

    shard: str
    start: int = 0
    positions: tuple[int, ...] | None = None
    start_byte: int | None = 0
    spans: tuple[tuple[int, int], ...] | None = None

    def to_list(self) -> list:
        return [self.shard, self.start, None if self.positions is None else list(self.positions), self.start_byte,
                None if self.spans is None else [list(span) for span in self.spans]]

    @classmethod
    def from_list(cls, item: Sequence) -> Piece:
        shard, start, positions, start_byte, spans = item
        return cls(str(shard), int(start), None if positions is None else tuple(int(p) for p in positions),
                   None if start_byte is None else int(start_byte),
                   None if spans is None else tuple((int(b), int(e)) for b, e in spans))


#: ``read_spans(shard, begin=0, end=None)``: ``(sample, begin, end)`` for the samples of ``shard``
#: between those bytes, each with the bytes it occupies (None, None when the reader cannot tell);
#: :func:`packlab.loaders.tar.read_sample_spans` for tar shards.
SpanReader = Callable[..., Iterable]


def adjacent_runs(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """Sorted spans merged where one ends where the next begins: ``(begin, end, how many spans)`` per run.

    One ranged request per run reads exactly the spans' bytes; among the samples a shuffle
    buffer holds from the shard being read, runs of neighbours are common.
    """
    runs: list[list[int]] = []
    for begin, end in sorted(spans):
        if runs and runs[-1][1] == begin:
            runs[-1][1] = end
            runs[-1][2] += 1
        else:
            runs.append([begin, end, 1])
    return [tuple(run) for run in runs]


def _changed(shard: str, what: str) -> ResumeError:
    return ResumeError(f"shard {shard}: {what}: the shard changed since the state was saved. Resume only with the "
                       "shards the state was saved with.")


def read_piece(piece: Piece, read_spans: SpanReader, start: int = 0, start_byte: int | None = None,
               ) -> Iterator[tuple[int, Any, int | None, int | None]]:
    """``(position in the shard, sample, begin, end)`` for the samples of ``piece`` at or after position ``start``.

    ``start_byte``: where the sample at ``start`` begins, when known (else the piece's own
    ``start_byte`` for its ``start``). With byte offsets the shard is opened there (a rest
    of a shard) or read span by span (buffered samples); without, it is read from its
    beginning and the samples before the piece are passed over undecoded. Raises
    :class:`ResumeError` when the shard no longer matches the piece.
    """
    first = max(start, piece.start)
    if start_byte is None and first == piece.start:
        start_byte = piece.start_byte
    if piece.positions is None:
        yield from _read_rest(piece, read_spans, first, start_byte if first > 0 else 0)
        return
    wanted = sorted((p, s) for p, s in zip(piece.positions, piece.spans or [None] * len(piece.positions)) if p >= first)
    if not wanted:
        return
    if piece.spans is None:
        yield from _replay(piece.shard, read_spans, [p for p, _ in wanted])
    else:
        yield from _read_spans(piece.shard, read_spans, wanted)


def _read_rest(piece: Piece, read_spans: SpanReader, first: int, start_byte: int | None):
    """The samples of a whole-shard piece from position ``first`` on: from ``start_byte`` if known, else from byte 0."""
    position = first if start_byte is not None else 0
    samples = iter(read_spans(piece.shard, start_byte or 0))
    try:
        for sample, begin, end in samples:
            if position >= first:
                yield position, sample, begin, end
            position += 1
    finally:
        _close(samples)
    if position < first:
        raise _changed(piece.shard, f"it holds {position} samples, but the saved position needs sample {first}")


def _replay(shard: str, read_spans: SpanReader, positions: list[int]):
    """The samples at ``positions`` (sorted), reading the shard from byte 0 up to the last of them."""
    samples = iter(read_spans(shard))
    wanted = set(positions)
    try:
        for position, (sample, begin, end) in enumerate(samples):
            if position in wanted:
                yield position, sample, begin, end
            if position >= positions[-1]:
                return
    finally:
        _close(samples)
    raise _changed(shard, f"it ends before sample {positions[-1]}, which the saved state needs")


def _read_spans(shard: str, read_spans: SpanReader, wanted: list[tuple[int, tuple[int, int]]]):
    """The samples at the given ``(position, (begin, end))``, one ranged read per run of adjacent spans."""
    by_begin = {span[0]: position for position, span in wanted}
    for begin, end, count in adjacent_runs([span for _, span in wanted]):
        found = 0
        samples = iter(read_spans(shard, begin, end))
        try:
            for sample, sample_begin, sample_end in samples:
                if sample_begin not in by_begin:
                    raise _changed(shard, f"a sample begins at byte {sample_begin:,}, where none was saved")
                found += 1
                yield by_begin[sample_begin], sample, sample_begin, sample_end
        finally:
            _close(samples)
        if found != count:
            raise _changed(shard, f"bytes {begin:,}-{end:,} hold {found} samples, the saved state {count}")


def _close(iterator) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        close()  # the shard's file or connection, now rather than when the generator is collected


class ShardStream:
    """One reader's pieces of an epoch, read in order through a shuffle buffer, with a saveable position.

    It delivers exactly what :func:`packlab.loaders.tar.shuffle_buffer` delivers for the same
    samples and generator (fill the buffer; then for each new sample yield a random buffered
    one and put the new one in its place; at the end shuffle what is left and yield it in
    order), but one sample per ``next()``, so that between two samples its whole state is in
    a few attributes:

    * ``pieces`` (what to read), ``next_piece``, ``next_position`` and ``next_byte`` (how
      far: the byte where the next sample's headers begin, None when unknown);
    * ``buffer``: ``(piece index, position, sample, begin, end)`` of each buffered sample, in
      buffer order, with the bytes it occupies in its shard;
    * ``draining``: the pieces are exhausted and the buffer is being emptied in order;
    * the generator's state, and ``delivered``, the samples handed out so far.

    ``read_spans(shard, begin=0, end=None)`` yields ``(sample, begin, end)`` for the
    shard's samples (anything with a ``.key``) between those bytes, the same ones in the
    same order every time it is called (:func:`packlab.loaders.tar.read_sample_spans`).
    """

    def __init__(self, pieces: Sequence[Piece], read_spans: SpanReader, buffer_size: int, rng: random.Random):
        self.pieces = list(pieces)
        self.read_spans = read_spans
        self.buffer_size = buffer_size
        self.rng = rng
        self.next_piece = 0
        self.next_position = pieces[0].start if pieces else 0
        self.next_byte = pieces[0].start_byte if pieces else 0
        self.buffer: list[tuple[int, int, Any, int | None, int | None]] = []
        self.draining = False
        self.delivered = 0
        self._reading: Iterator | None = None  # the open piece

    def __iter__(self) -> ShardStream:
        return self

    def _read_one(self) -> tuple[int, int, Any, int | None, int | None] | None:
        """The next sample of the pieces as ``(piece index, position, sample, begin, end)``, or None after the last."""
        while self.next_piece < len(self.pieces):
            if self._reading is None:
                self._reading = read_piece(self.pieces[self.next_piece], self.read_spans, self.next_position,
                                           self.next_byte)
            found = next(self._reading, None)
            if found is None:
                self._reading = None
                self.next_piece += 1
                following = self.pieces[self.next_piece] if self.next_piece < len(self.pieces) else Piece("")
                self.next_position, self.next_byte = following.start, following.start_byte
                continue
            position, sample, begin, end = found
            self.next_position = position + 1
            # Within a whole-shard piece the next sample begins where this one ends; in a piece of
            # scattered positions the next one is found by its own span.
            self.next_byte = end if self.pieces[self.next_piece].positions is None else None
            return self.next_piece, position, sample, begin, end
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
            "next_byte": self.next_byte,
            "buffer": [[index, position, sample.key, begin, end] for index, position, sample, begin, end in self.buffer],
            "draining": self.draining,
            "rng": [version, list(internal), gauss],
            "delivered": self.delivered,
            "buffer_size": self.buffer_size,
        }

    @classmethod
    def restore(cls, state: dict, read_spans: SpanReader) -> ShardStream:
        """A stream that goes on where ``state`` was taken, re-filling its buffer from the shards.

        The buffer's samples are read again, checked against the saved keys: by their byte
        spans, one ranged read per run of neighbours, where the state has them; else each
        such shard from its start up to the last buffered position.
        """
        pieces = [Piece.from_list(p) for p in state["pieces"]]
        stream = cls(pieces, read_spans, int(state["buffer_size"]), random.Random())
        version, internal, gauss = state["rng"]
        stream.rng.setstate((version, tuple(internal), gauss))
        stream.next_piece, stream.next_position = int(state["next_piece"]), int(state["next_position"])
        stream.next_byte = None if state["next_byte"] is None else int(state["next_byte"])
        stream.draining, stream.delivered = bool(state["draining"]), int(state["delivered"])
        found: dict[tuple[int, int], tuple] = {}
        for index, piece in buffered_pieces(pieces, state["buffer"]):
            keys = dict(zip(piece.positions, (key for _, _, key, _, _ in _entries(state["buffer"], index))))
            for position, sample, begin, end in read_piece(piece, read_spans):
                if sample.key != keys[position]:
                    raise _changed(piece.shard, f"sample {position} is {sample.key}, the saved state says {keys[position]}")
                found[index, position] = (sample, begin, end)
        stream.buffer = [(int(i), int(p), *found[int(i), int(p)]) for i, p, *_ in state["buffer"]]
        return stream


def _entries(buffer: list, index: int) -> list:
    """The saved buffer entries ``[piece index, position, key, begin, end]`` of one piece, by position."""
    return sorted((e for e in buffer if int(e[0]) == index), key=lambda e: int(e[1]))


def buffered_pieces(pieces: Sequence[Piece], buffer: list) -> list[tuple[int, Piece]]:
    """``(piece index, Piece of the buffered positions of that piece's shard)``, one per piece with buffered samples."""
    out = []
    for index in sorted({int(e[0]) for e in buffer}):
        entries = _entries(buffer, index)
        spans = tuple((int(b), int(e)) for *_, b, e in entries) if all(e[3] is not None for e in entries) else None
        out.append((index, Piece(pieces[index].shard, 0, tuple(int(e[1]) for e in entries), None, spans)))
    return out


def without_byte_offsets(pieces: Sequence[Piece]) -> list[Piece]:
    """The same pieces with their byte offsets forgotten, for a reader that cannot read ranges: it reads from byte 0."""
    return [Piece(p.shard, p.start, p.positions, 0 if p.start == 0 else None, None) for p in pieces]


def stream_state_without_byte_offsets(state: dict) -> dict:
    """A stream state whose byte offsets are forgotten (see :func:`without_byte_offsets`)."""
    pieces = without_byte_offsets([Piece.from_list(p) for p in state["pieces"]])
    return {**state, "pieces": [p.to_list() for p in pieces], "next_byte": None if state["next_position"] else 0,
            "buffer": [[i, p, key, None, None] for i, p, key, *_ in state["buffer"]]}


def pieces_left(state: dict) -> list[Piece]:
    """What one reader still had to deliver when ``state`` was taken: its buffer, its current piece, the rest.

    Buffered samples come first, one piece per shard (with their byte spans), then the rest
    of the piece being read (from the byte where it stopped), then the pieces not yet opened.
    """
    pieces = [Piece.from_list(p) for p in state["pieces"]]
    left = [piece for _, piece in buffered_pieces(pieces, state["buffer"])]
    if state["draining"]:
        return left
    current = int(state["next_piece"])
    if current < len(pieces):
        piece = pieces[current]
        start = int(state["next_position"])
        if piece.positions is None:
            left.append(Piece(piece.shard, max(start, piece.start), None,
                              state["next_byte"] if start > piece.start else piece.start_byte))
        else:
            kept = [(p, s) for p, s in zip(piece.positions, piece.spans or [None] * len(piece.positions)) if p >= start]
            if kept:
                left.append(Piece(piece.shard, 0, tuple(p for p, _ in kept), None,
                                  None if piece.spans is None else tuple(s for _, s in kept)))
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

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
   resume the buffer is **re-filled** by reading those samples again (the re-fill rule).
   The random generator's state is saved too, so the resumed run draws what the
   uninterrupted one would have drawn.

**By byte offset.** A tar stream can start again at any member's header. So the state
also keeps, for each buffered sample, the bytes ``[begin, end)`` it occupies in its shard,
and for the current shard the byte where the next sample begins. A resumed reader then
opens each shard *at* those offsets with a ranged opener (``open_from``: a ``seek`` for
a local file, an HTTP ``Range`` request for S3 or a web server, as in chapter 10), one
request per run of adjacent buffered samples, and reads the bytes of the samples it still
has to deliver and nothing else. Without offsets (an opener without ``open_from``, a
compressed shard, a dataset that reads its shards its own way) it reads each shard from
byte 0 and passes over the samples before the ones it needs: a buffer's samples come from
the last few shards, so each resume then reads up to a few shards again, per worker
(:func:`resume_reads` counts both ways for a saved state; :func:`modelled_resume_reads`
models 1 GB shards).

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

from packlab.resume.costs import CountingOpener, modelled_resume_reads, resume_reads
from packlab.resume.map_style import KeyItems, map_style_loader
from packlab.resume.stream import (
    Piece,
    ResumeError,
    STATE_VERSION,
    ShardStream,
    SpanReader,
    adjacent_runs,
    epoch_pieces_left,
    epoch_state,
    pieces_left,
    read_piece,
    reader_states,
    stop_and_resume,
    stream_state_without_byte_offsets,
    without_byte_offsets,
)

__all__ = [
    "CountingOpener",
    "KeyItems",
    "Piece",
    "ResumeError",
    "STATE_VERSION",
    "ShardStream",
    "SpanReader",
    "adjacent_runs",
    "epoch_pieces_left",
    "epoch_state",
    "map_style_loader",
    "modelled_resume_reads",
    "pieces_left",
    "read_piece",
    "reader_states",
    "resume_reads",
    "stop_and_resume",
    "stream_state_without_byte_offsets",
    "without_byte_offsets",
]

"""The dataset itself: :class:`TarShardDataset` puts the stages of :mod:`packlab.loaders.tar` together.

It also keeps its place in the epoch for checkpoint and resume (:mod:`packlab.resume`),
and decides what a bad sample does (raise, or skip and count).
"""

from __future__ import annotations

import itertools
import os
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch.utils.data import IterableDataset, get_worker_info

from packlab.loaders.skipping import BadSampleHandling
from packlab.loaders.tar.reading import (
    RawSample,
    ShardError,
    ShardOpener,
    group_samples,
    iter_shard_samples,
    iter_tar_members,
    read_sample_spans,
    split_key,
)
from packlab.loaders.tar.shuffling import shuffle_buffer
from packlab.loaders.tar.splitting import (
    RepeatedEpochWarning,
    SharedEpoch,
    check_shard_split,
    distributed_rank_and_world_size,
    epoch_shard_order,
    split_shards_by_rank,
    split_shards_by_worker,
)
from packlab.pack import expand_pattern
from packlab.resume import (
    STATE_VERSION,
    Piece,
    ResumeError,
    ShardStream,
    epoch_pieces_left,
    stream_state_without_byte_offsets,
    without_byte_offsets,
)
from packlab.transforms import CorruptImageError, standard_transform


def skip_decode(image_bytes: bytes, source: str = "<bytes>") -> torch.Tensor:
    """A transform that does not decode: the encoded size in bytes, as a 0-d tensor.

    For passes that only look at keys and labels (shuffle statistics, split checks),
    where decoding would cost most of the time and tell us nothing.
    """
    return torch.tensor(len(image_bytes))


class RawSampleDecoding(BadSampleHandling):
    """Turns a :class:`RawSample` into a dataset item, for streaming datasets (tar shards,
    and the LMDB and Parquet streams of :mod:`packlab.formats`): ``self.transform`` decodes,
    ``self.return_key`` adds the key, and a corrupt image raises or is skipped."""

    def _decoded(self, sample: RawSample):
        """The item for one sample, or None when it was skipped."""
        try:
            image = self.transform(sample.image_bytes, sample.source)
        except CorruptImageError as exc:
            if not self.skipping:
                raise
            self._skip(sample.source, "corrupt image", exc)
            return None
        return (image, sample.label, sample.key) if self.return_key else (image, sample.label)


class TarShardDataset(IterableDataset, RawSampleDecoding):
    """Samples from WebDataset-style tar shards, split between ranks and workers.

    ``shards`` is a list of paths/URLs or a brace pattern. Each epoch the shard order is
    permuted from ``(seed, epoch)`` (call :meth:`set_epoch` before each epoch), split by
    rank and then by DataLoader worker, read sequentially, shuffled in a buffer of
    ``shuffle_buffer`` samples per worker (0 or 1: no shuffle) and decoded with the
    standard transform, or ``transform(jpeg_bytes, source)`` if given (``source`` names
    the shard and member, for error messages). Yields ``(image, label)``,
    or ``(image, label, key)`` with ``return_key=True``.

    ``rank``/``world_size`` default to this process's place in ``torch.distributed``
    (or torchrun's environment variables), read when the dataset is created.

    ``opener(name)`` opens a shard for reading (default :class:`ShardOpener`: local paths,
    ``file://`` and ``http(s)://`` URLs; :class:`packlab.objectstore.S3ShardOpener` for
    ``s3://``). With an ``open_from`` method, as both have, a resumed reader reads only the
    bytes of the samples it still owes (:mod:`packlab.resume`); without, it reads the
    shards it needs from byte 0.

    Every epoch checks that each reader gets at least one shard and that ranks get equal
    shares (:func:`check_shard_split`); call :meth:`check_split` yourself to fail even
    earlier. ``epoch_length=N`` switches to resampling: each rank draws shards at random,
    with replacement, and yields exactly ``N`` samples per epoch, whatever the shard count.
    Epochs are then equally long on every rank, but samples are no longer seen exactly once.

    ``split_by_worker=False`` exists to show what goes wrong without the worker split.

    The epoch lives in shared memory (:class:`SharedEpoch`), so :meth:`set_epoch` reaches
    DataLoader workers whether they are fresh every epoch or persistent
    (``persistent_workers=True``, where a plain attribute would stay at the value the
    workers started with), under ``fork``, ``spawn`` and ``forkserver`` alike. Without
    ``set_epoch`` every epoch repeats the previous one's order (still every sample once),
    and a :class:`RepeatedEpochWarning` says so.

    A damaged shard, a sample with a bad label or a missing file, or an image that does
    not decode raises (:class:`ShardError`, :class:`~packlab.transforms.CorruptImageError`)
    naming the shard and member. With ``on_bad_sample="skip"`` the bad sample is left out
    instead, with a :class:`~packlab.loaders.skipping.BadSampleWarning`, and counted in
    ``skipped`` (summed over DataLoader workers). A truncated or corrupt shard delivers
    the samples before the damage and counts once, as a damaged shard: how many samples
    were lost after the damage cannot be known. A shard that cannot be opened raises in
    either mode. With ``epoch_length``, a skipped image is replaced by another draw, so
    epochs keep their length.
    """

    def __init__(
        self,
        shards: str | Path | Sequence[str | Path],
        *,
        shuffle_buffer: int = 0,
        shuffle_shards: bool = True,
        seed: int = 0,
        transform: Callable[[bytes, str], Any] = standard_transform,
        return_key: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        split_by_worker: bool = True,
        epoch_length: int | None = None,
        opener: Callable[[str], BinaryIO] | None = None,
        on_bad_sample: str = "raise",
    ):
        super().__init__()
        self._set_bad_sample_mode(on_bad_sample)
        if isinstance(shards, (str, Path)):
            self.shards = expand_pattern(str(shards))
        else:
            self.shards = [str(s) for s in shards]
        if not self.shards:
            raise ValueError("no shards given")
        if rank is None or world_size is None:
            rank, world_size = distributed_rank_and_world_size()
        if not 0 <= rank < world_size:
            raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if epoch_length is not None and epoch_length < 1:
            raise ValueError("epoch_length must be a positive number of samples per rank")
        self.rank, self.world_size = rank, world_size
        self.shuffle_buffer = shuffle_buffer
        self.shuffle_shards = shuffle_shards
        self.seed = seed
        self.transform = transform
        self.return_key = return_key
        self.split_by_worker = split_by_worker
        self.epoch_length = epoch_length
        self.opener = ShardOpener() if opener is None else opener
        self._epoch = SharedEpoch()

    @property
    def epoch(self) -> int:
        """The epoch last passed to :meth:`set_epoch` (0 before any)."""
        return self._epoch.value

    def set_epoch(self, epoch: int) -> None:
        """Use this epoch's shard order and shuffle; call before iterating each epoch.

        The value is written to shared memory, so DataLoader workers see it even when they
        are persistent.
        """
        self._epoch.set(epoch)

    def check_split(self, num_workers: int) -> None:
        """Raise :class:`ShardSplitError` now if ``num_workers`` workers per rank would starve."""
        if self.epoch_length is None:
            check_shard_split(len(self.shards), self.world_size, num_workers if self.split_by_worker else 0)

    def shards_for(self, worker_id: int, num_workers: int, epoch: int | None = None) -> list[str]:
        """The shards worker ``worker_id`` of this rank reads in ``epoch`` (default: the current one).

        Not used in resampling mode (``epoch_length``).
        """
        epoch = self.epoch if epoch is None else epoch
        order = epoch_shard_order(self.shards, self.seed, epoch) if self.shuffle_shards else list(self.shards)
        mine = split_shards_by_rank(order, self.rank, self.world_size)
        if self.split_by_worker:
            mine = split_shards_by_worker(mine, worker_id, num_workers)
        return mine

    def _shard_samples(self, shard: str) -> Iterator[RawSample]:
        """One shard's samples; in skip mode without the bad ones."""
        if not self.skipping:
            return iter_shard_samples(shard, self.opener)
        return self._good_samples(shard)

    def _shard_spans(self, shard: str, begin: int = 0, end: int | None = None,
                     ) -> Iterator[tuple[RawSample, int | None, int | None]]:
        """``(sample, begin, end)`` for the samples of one shard between those bytes (the reader of a ShardStream).

        Byte spans are known where the shard can be read from an offset (an opener with
        ``open_from``, an uncompressed shard, the raising mode, and ``_shard_samples`` not
        overridden by a subclass that reads shards its own way); elsewhere ``begin`` and
        ``end`` are None and a resume reads such shards from byte 0.
        """
        if not self._ranged(shard):
            if begin or end is not None:
                raise ResumeError(f"shard {shard} cannot be read from byte {begin:,} with {self.opener!r}")
            yield from ((sample, None, None) for sample in self._shard_samples(shard))
            return
        try:
            yield from read_sample_spans(shard, self.opener, begin, end)
        except ShardError as exc:
            if begin == 0 and end is None:
                raise
            raise ResumeError(f"shard {shard}, from byte {begin:,}: {exc} The shard changed since the state was "
                              "saved: resume only with the shards the state was saved with.") from None

    def _can_range(self) -> bool:
        """Whether this dataset can read a part of a shard: an opener with ``open_from``, and shards read as here."""
        return (hasattr(self.opener, "open_from") and not self.skipping
                and type(self)._shard_samples is TarShardDataset._shard_samples)

    def _ranged(self, shard: str) -> bool:
        return self._can_range() and not shard.endswith((".gz", ".tgz"))

    def _good_samples(self, shard: str) -> Iterator[RawSample]:
        """Skip mode: one shard's samples, leaving out bad ones instead of raising.

        The members are grouped by key and each group becomes a sample on its own, so a
        sample with a bad label or a missing file is skipped alone. Damage to the shard
        itself ends it: the samples before the damage have been delivered.
        """
        stream = self.opener(shard)  # a shard that cannot be opened raises, even in skip mode
        try:
            found = False
            members = iter_tar_members(stream, shard)
            for key, files in itertools.groupby(members, key=lambda member: split_key(member[0])[0]):
                files = list(files)  # a damaged shard raises here, outside the sample's try
                found = True
                try:
                    yield from group_samples(files, shard)
                except ShardError as exc:
                    self._skip(f"{shard}:{key}", "invalid sample", exc)
            if not found:
                raise ShardError(f"shard {shard} holds no samples")
        except ShardError as exc:
            self._skip(shard, "damaged shard", exc)
        finally:
            stream.close()

    def _resampled(self, rng: random.Random) -> Iterator[RawSample]:
        """Samples of shards drawn with replacement, without end (``epoch_length`` mode)."""
        empty: set[str] = set()
        while len(empty) < len(set(self.shards)):
            shard = rng.choice(self.shards)
            found = False
            for sample in self._shard_samples(shard):
                found = True
                yield sample
            if not found:  # only in skip mode; without this check, all-bad shards would loop forever
                empty.add(shard)
        raise ShardError(f"none of the {len(empty)} shards holds a readable sample: check or rewrite them")

    def _raw_samples(
        self, worker_id: int, num_workers: int, epoch: int
    ) -> tuple[Iterator[RawSample], Iterator | None]:
        """This worker's undecoded samples for the epoch, and (resampling only) the endless stream they come from."""
        if self.epoch_length is None:
            shards = self.shards_for(worker_id, num_workers, epoch)
            return (sample for shard in shards for sample in self._shard_samples(shard)), None
        # Resampling: draw shards with replacement until this worker's share is delivered.
        share = self.epoch_length // num_workers + (worker_id < self.epoch_length % num_workers)
        rng = random.Random(f"shards-{self.seed}-{epoch}-{self.rank}-{worker_id}")
        endless = self._resampled(rng)
        return itertools.islice(endless, share), endless

    def __iter__(self):
        info = get_worker_info()
        worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
        return self.iter_share(worker_id, num_workers)

    def iter_share(self, worker_id: int, num_workers: int):
        """This epoch's samples for reader ``worker_id`` of ``num_workers``, whoever the reader is.

        ``__iter__`` asks :func:`torch.utils.data.get_worker_info` which share is this
        process's. That answer is per *process*; threads in one process (see
        :class:`packlab.loaders.threads.ThreadLoader`) call this directly with their own id.
        """
        self.check_split(num_workers)
        # From shared memory: persistent workers see set_epoch too. Several readers of one process (threads) each
        # keep their own mark.
        epoch, repeated = self._epoch.start_pass(worker_id if num_workers > 1 else None)
        resumed = self._take_saved_state(epoch, worker_id, num_workers)
        if repeated and resumed is None and self._order_depends_on_epoch():
            warnings.warn(RepeatedEpochWarning(
                f"{self!r} starts another pass over epoch {epoch} without set_epoch() since the last one, so it "
                "repeats that pass's shard order and shuffle. Call dataset.set_epoch(epoch) before each epoch."
            ), stacklevel=2)
        if self.epoch_length is not None:
            rng = random.Random(f"buffer-{self.seed}-{epoch}-{self.rank}-{worker_id}")
            raw, spare = self._raw_samples(worker_id, num_workers, epoch)
            samples = shuffle_buffer(raw, self.shuffle_buffer, rng)
        else:
            spare = None
            samples = self._stream = self._open_stream(epoch, worker_id, num_workers, resumed)
        try:
            for sample in samples:
                item = self._decoded(sample)
                while item is None and spare is not None:  # resampling: draw a replacement, keep the length
                    item = self._decoded(next(spare))
                if item is not None:
                    yield item
        finally:
            if spare is None:
                samples.close()

    # ------------------------------------------------------------ checkpoint and resume

    def _open_stream(self, epoch: int, worker_id: int, num_workers: int, resumed: dict | None) -> ShardStream:
        """This reader's :class:`~packlab.resume.ShardStream`: fresh, or where a saved state left off."""
        self._reader_pid = os.getpid()  # a forked worker inherits these attributes: they are not its own
        self._reader, stream = self._reader_start(epoch, worker_id, num_workers, resumed)
        return stream

    def _reader_start(self, epoch: int, worker_id: int, num_workers: int,
                      resumed: dict | None) -> tuple[dict, ShardStream]:
        """Who this reader is (a dict for its state) and the stream it starts from; changes nothing."""
        reader = {"epoch": epoch, "seed": self.seed, "rank": self.rank, "world_size": self.world_size,
                  "worker_id": worker_id, "num_workers": num_workers}
        if resumed is not None and resumed.get("kind") == "reader":
            reader["share"] = resumed["share"]
            if resumed["stream"] is not None:
                saved = resumed["stream"] if self._can_range() else stream_state_without_byte_offsets(resumed["stream"])
                return reader, ShardStream.restore(saved, self._shard_spans)
            pieces = [Piece(s) for s in resumed["share"]]
        elif resumed is not None:  # an epoch state from another layout: split what is left between our readers
            index = self.rank * num_workers + worker_id
            pieces = epoch_pieces_left(resumed)[index :: self.world_size * num_workers]
            pieces = pieces if self._can_range() else without_byte_offsets(pieces)
            reader["share"] = sorted({p.shard for p in pieces})
            rng = random.Random(f"resumed-{self.seed}-{epoch}-{self.rank}-{worker_id}")
            return reader, ShardStream(pieces, self._shard_spans, self.shuffle_buffer, rng)
        else:
            reader["share"] = self.shards_for(worker_id, num_workers, epoch)
            pieces = [Piece(s) for s in reader["share"]]
        rng = random.Random(f"buffer-{self.seed}-{epoch}-{self.rank}-{worker_id}")
        return reader, ShardStream(pieces, self._shard_spans, self.shuffle_buffer, rng)

    def state_dict(self) -> dict:
        """Where this process's reader stands in the epoch, at sample granularity (plain lists and numbers).

        Called *in a DataLoader worker* (torchdata's ``StatefulDataLoader`` does, after every
        batch) it describes that worker's share; in the main process, the main process's own
        reading (``num_workers=0``). In the main process of a loader with workers it knows
        nothing of what the workers read: save ``loader.state_dict()`` instead. See
        :mod:`packlab.resume` for what the state holds and why.
        """
        if self.epoch_length is not None:
            raise ValueError("a resampling TarShardDataset (epoch_length=...) cannot save its position")
        mine = getattr(self, "_reader_pid", None) == os.getpid()
        stream = getattr(self, "_stream", None) if mine else None
        reader = getattr(self, "_reader", None) if mine else None
        if reader is None:  # nothing read yet in this process: it stands where its next pass will start
            info = get_worker_info()
            worker_id, num_workers = (0, 1) if info is None else (info.id, info.num_workers)
            # A loaded state not yet read from is where this reader stands: torchdata asks a resumed worker for
            # its state before its first sample and keeps the answer until the worker sends a batch. (Answering
            # "the epoch's start" made a worker that sent nothing before the next checkpoint read its share
            # again.) Another reader's state is returned as it is; reading refuses it, with the reason.
            resumed = self._saved_state_for(self.epoch, worker_id, num_workers, check=False)
            if resumed is not None and resumed["kind"] == "reader":
                return dict(resumed)
            reader, stream = self._reader_start(self.epoch, worker_id, num_workers, resumed)
            if resumed is None:
                stream = None  # a fresh start: no stream to describe
        return {"version": STATE_VERSION, "kind": "reader", **reader,
                "stream": None if stream is None else stream.state()}

    def load_state_dict(self, state: dict) -> None:
        """Make the next pass over the state's epoch go on where ``state`` was taken.

        ``state`` is a reader's :meth:`state_dict` (what ``StatefulDataLoader`` hands each
        worker when it resumes with the same worker count), or a whole epoch's state from
        :func:`packlab.resume.epoch_state`, which works with any number of workers and ranks.
        In the main process this also sets the epoch to the state's.
        """
        if state.get("kind") not in ("reader", "epoch"):
            raise ResumeError(f"not a TarShardDataset state (keys {sorted(state)[:6]}): pass what state_dict() or "
                              "packlab.resume.epoch_state returned")
        if state.get("version") != STATE_VERSION:
            raise ResumeError(f"this state has layout version {state.get('version')}, this packlab reads version "
                              f"{STATE_VERSION} (byte offsets were added in version 2): resume with the packlab that "
                              "saved it, or start the epoch again")
        if state["kind"] == "reader" and state["seed"] != self.seed:
            raise ResumeError(f"the state was saved with seed={state['seed']}, this dataset has seed={self.seed}")
        self._saved_state = state
        if get_worker_info() is None and state["epoch"] != self.epoch:
            self.set_epoch(state["epoch"])

    def _take_saved_state(self, epoch: int, worker_id: int, num_workers: int) -> dict | None:
        """The state this pass resumes from (None: start the epoch afresh); a reader state is used once."""
        state = self._saved_state_for(epoch, worker_id, num_workers)
        if state is not None and state["kind"] == "reader":
            self._saved_state = None  # used once: the next pass of this process starts its epoch afresh
        return state

    def _saved_state_for(self, epoch: int, worker_id: int, num_workers: int, check: bool = True) -> dict | None:
        """The loaded state reader ``worker_id`` of ``num_workers`` would resume from now; changes nothing.

        A reader's own state, or a whole epoch's state when the layout differs from the one it
        was saved with (the reader then takes its part of what is left); None: the epoch afresh.
        A reader state of another reader raises :class:`ResumeError`, unless ``check`` is False.
        """
        state = getattr(self, "_saved_state", None)
        if state is None or state["epoch"] != epoch:
            return None
        if state["kind"] == "epoch":
            readers = state["readers"]
            same_layout = all(r["num_workers"] == num_workers and r["world_size"] == self.world_size for r in readers)
            if not same_layout:
                return state
            state = next(r for r in readers if r["rank"] == self.rank and r["worker_id"] == worker_id)
        elif check and (state["worker_id"], state["num_workers"], state["rank"], state["world_size"]) != (
                worker_id, num_workers, self.rank, self.world_size):
            raise ResumeError(
                f"this state belongs to worker {state['worker_id']} of {state['num_workers']} on rank "
                f"{state['rank']} of {state['world_size']}, not to worker {worker_id} of {num_workers} on rank "
                f"{self.rank} of {self.world_size}: to resume with another layout, load "
                "packlab.resume.epoch_state(saved loader states) into the dataset"
            )
        return state

    def __getstate__(self) -> dict:
        """Pickled for spawn workers without this process's open stream (a generator holds open shards)."""
        state = self.__dict__.copy()
        state.pop("_stream", None)
        state.pop("_reader", None)
        return state

    def _order_depends_on_epoch(self) -> bool:
        return self.shuffle_shards or self.shuffle_buffer > 1 or self.epoch_length is not None

    def __repr__(self) -> str:
        return (
            f"TarShardDataset({len(self.shards)} shards, rank {self.rank}/{self.world_size}, "
            f"shuffle_buffer={self.shuffle_buffer}, epoch={self.epoch})"
        )

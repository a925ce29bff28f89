"""Skip bad samples instead of ending the epoch, and count every one that was skipped.

By default a reference dataset stops at the first sample it cannot read or decode, with an
error that names the file and says what to do. That is right while you prepare data.
During a long training run on data someone else copied, you may prefer to lose one
corrupt image rather than the night. Every reference dataset therefore takes
``on_bad_sample``:

* ``"raise"`` (the default): the error ends the epoch, as before;
* ``"skip"``: the sample is left out, a :class:`BadSampleWarning` names its file and the
  reason, and it is counted: ``dataset.skipped`` is the number of samples skipped so
  far, added up over the main process and every DataLoader worker, and
  ``dataset.skip_counter.by_reason()`` breaks it down.

Skipping is never silent, but it only covers damage to *single samples* (a corrupt
image, an unreadable zip member, a file listed but missing, a tar sample with a bad
label, a shard cut off part-way). Problems that skipping cannot fix (a missing labels
file or archive, a data root that does not exist) raise in both modes.

Why the count needs shared memory
---------------------------------
A DataLoader worker is another process holding its own copy of the dataset: a counter it
increments in its own memory is lost when the epoch ends. :class:`SkipCounter` keeps its
counts in a tensor in shared memory instead. ``fork`` workers inherit the mapping; under
``spawn`` and ``forkserver`` the dataset is pickled into the worker, and torch pickles a
shared-memory tensor as a handle on the same memory, not as a copy. Each process writes
only its own row (row 0: the main process, row ``1 + i``: worker ``i``), so no two
processes ever update the same number and no lock is needed. (A copy made with plain
:func:`pickle.dumps` or :func:`copy.deepcopy` gets its own counts.)

What a map-style dataset returns for a skipped sample
-----------------------------------------------------
``dataset[i]`` has to return something. In skip mode it returns a :class:`SkippedSample`
marker, and the DataLoader needs ``collate_fn=collate_skipping_bad``, which drops the
markers and collates the rest; a batch that had only bad samples becomes ``None``. A
marker that reaches the default collate (or is unpacked as ``image, label = ...``)
raises a ``TypeError`` that says to pass that ``collate_fn``. Iterable datasets (tar
shards) just do not yield the bad sample and need nothing special.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map

#: What ``on_bad_sample`` accepts.
MODES = ("raise", "skip")

#: Why a sample was skipped; the columns of :class:`SkipCounter`.
REASONS = (
    "missing file",  # listed in the labels file, not on disk
    "unreadable member",  # a zip member with a bad CRC, a damaged header or bad compressed data
    "corrupt image",  # read, but the bytes do not decode to an image of the expected size
    "invalid sample",  # a tar sample with a label that is not an integer, or a file missing
    "damaged shard",  # a tar shard truncated or corrupt part-way: the rest of it is lost
)

#: How many DataLoader workers a counter has rows for.
MAX_WORKERS = 64


class BadSampleWarning(UserWarning):
    """A sample was skipped (``on_bad_sample="skip"``). The message names the file and the reason."""


class SkipCounter:
    """Skipped samples per reason, added up over the main process and every DataLoader worker.

    The counts live in an int64 tensor in shared memory, one row per process that can
    read samples (row 0 the main process, row ``1 + i`` DataLoader worker ``i``) and one
    column per reason in :data:`REASONS`. A process writes only its own row, so writes
    never race. Two DataLoaders iterating the *same* dataset object at the same time would
    share rows: give each its own dataset.
    """

    def __init__(self, max_workers: int = MAX_WORKERS):
        self._counts = torch.zeros((max_workers + 1, len(REASONS)), dtype=torch.int64).share_memory_()

    def add(self, reason: str) -> None:
        """Count one skipped sample, in the row of the process calling this."""
        info = get_worker_info()
        row = 0 if info is None else info.id + 1
        if row >= self._counts.shape[0]:
            raise RuntimeError(
                f"this counter has rows for {self._counts.shape[0] - 1} DataLoader workers, and worker {info.id} "
                "skipped a sample: use fewer workers."
            )
        self._counts[row, REASONS.index(reason)] += 1

    @property
    def total(self) -> int:
        """Samples skipped so far, by every process."""
        return int(self._counts.sum())

    def by_reason(self) -> dict[str, int]:
        """``{reason: count}`` for every reason that occurred."""
        per_reason = self._counts.sum(dim=0).tolist()
        return {reason: n for reason, n in zip(REASONS, per_reason) if n}

    def reset(self) -> None:
        """Start counting from zero again (e.g. before each epoch). Call it between epochs, not during one."""
        self._counts.zero_()

    def __repr__(self) -> str:
        parts = ", ".join(f"{n} {reason}" for reason, n in self.by_reason().items())
        return f"SkipCounter({self.total} skipped{': ' + parts if parts else ''})"


class SkippedSample:
    """What a map-style dataset in skip mode returns instead of a sample it could not read.

    :func:`collate_skipping_bad` drops it. Anything else that tries to use it as a sample
    (the default collate, unpacking ``image, label = dataset[i]``) gets a ``TypeError``
    saying so, instead of a confusing error deeper down.
    """

    def __init__(self, source: str, reason: str):
        self.source = source
        self.reason = reason

    def __repr__(self) -> str:
        return f"SkippedSample({self.source!r}, {self.reason!r})"

    def __bool__(self) -> bool:
        return True  # without this, truth tests would call __len__ below

    def _not_a_sample(self, *args):
        raise TypeError(_forgot_collate_message(self))

    # The default collate takes len() of each sample and unpacking iterates it: both say what to do.
    __len__ = __iter__ = __getitem__ = _not_a_sample


def _forgot_collate_message(marker: SkippedSample) -> str:
    return (
        f"a bad sample was skipped ({marker.source}: {marker.reason}) and its placeholder reached code that "
        "expected a sample. With on_bad_sample='skip', give the DataLoader "
        "collate_fn=packlab.loaders.skipping.collate_skipping_bad, which drops skipped samples."
    )


def _refuse_to_collate(batch, *, collate_fn_map=None):
    raise TypeError(_forgot_collate_message(batch[0]))


# The default collate looks up how to collate a batch by the type of its first sample;
# registering the marker there turns "found <class SkippedSample>" into advice.
default_collate_fn_map[SkippedSample] = _refuse_to_collate


def collate_skipping_bad(batch: Sequence, collate_fn: Callable = default_collate):
    """A DataLoader ``collate_fn`` for datasets with ``on_bad_sample="skip"``.

    Drops the :class:`SkippedSample` markers from ``batch`` and collates the remaining
    samples with ``collate_fn`` (default: torch's default collate; for another one use
    ``functools.partial(collate_skipping_bad, collate_fn=...)``). A batch can therefore
    be smaller than ``batch_size``. A batch of bad samples only gives ``None``: skip it
    in the training loop (``if batch is None: continue``).
    """
    good = [sample for sample in batch if not isinstance(sample, SkippedSample)]
    return collate_fn(good) if good else None


class BadSampleHandling:
    """What a dataset does with a bad sample: raise (default) or skip, warn and count.

    Datasets inherit this, call :meth:`_set_bad_sample_mode` in ``__init__`` and, in the
    ``except`` clause around reading and decoding one sample::

        except CorruptImageError as exc:
            if not self.skipping:
                raise
            return self._skip(source, "corrupt image", exc)
    """

    on_bad_sample: str = "raise"
    skip_counter: SkipCounter | None = None

    def _set_bad_sample_mode(self, on_bad_sample: str) -> None:
        if on_bad_sample not in MODES:
            raise ValueError(f"on_bad_sample must be one of {MODES}, got {on_bad_sample!r}")
        self.on_bad_sample = on_bad_sample
        # Only skip mode needs the counter (and its shared memory).
        self.skip_counter = SkipCounter() if on_bad_sample == "skip" else None

    @property
    def skipping(self) -> bool:
        """True with ``on_bad_sample="skip"``."""
        return self.on_bad_sample == "skip"

    @property
    def skipped(self) -> int:
        """Samples skipped so far, in the main process and every DataLoader worker (0 in raise mode)."""
        return 0 if self.skip_counter is None else self.skip_counter.total

    def _skip(self, source: str, reason: str, error: BaseException) -> SkippedSample:
        """Warn about and count one skipped sample; return its marker."""
        # Each message names its file, so the default warning filter shows every skipped sample once.
        warnings.warn(BadSampleWarning(f"skipped {source} ({reason}): {error}"), stacklevel=2)
        self.skip_counter.add(reason)
        return SkippedSample(source, reason)

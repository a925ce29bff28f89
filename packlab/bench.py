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

import time
import traceback
from collections.abc import Callable, Iterable, Sequence
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

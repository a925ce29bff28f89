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

import math
import os
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
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


def markdown_table(rows: Sequence[dict]):
    """Rows of dicts (same keys) as a Markdown table, displayed as a table in a notebook."""
    from IPython.display import Markdown

    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join("" if row.get(c) is None else str(row.get(c)) for c in columns) + " |" for row in rows]
    return Markdown("\n".join(lines))


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


# ------------------------------------------------ repeated, interleaved measurements
#
# On a shared machine one run of a measurement says little: the load changes from one
# second to the next. A comparison the prose draws a conclusion from is therefore the
# median of several runs, interleaved so that a busy minute hits every contender alike,
# with the range shown; when the ranges overlap there is no clear difference.


@dataclass(frozen=True)
class Spread:
    """Repeated measurements of one quantity: their median and their range (min to max)."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        values = tuple(float(v) for v in values)
        if not values:
            raise ValueError("a spread needs at least one measurement")
        return cls(values)

    @property
    def median(self) -> float:
        ordered = sorted(self.values)
        middle = len(ordered) // 2
        return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def overlaps(self, other: Spread) -> bool:
        """Whether the two ranges share any value (then neither is clearly higher)."""
        return self.low <= other.high and other.low <= self.high

    def format(self, spec: str = ".0f") -> str:
        """``"452 (430-470)"``: the median, then the range, each formatted with ``spec``."""
        return f"{self.median:{spec}} ({self.low:{spec}}\u2013{self.high:{spec}})"

    __str__ = format


def compare(a: Spread, b: Spread) -> int:
    """1 if ``a`` is clearly higher than ``b``, -1 if clearly lower, 0 if their ranges overlap."""
    if a.overlaps(b):
        return 0
    return 1 if a.median > b.median else -1


def ratio_words(a: Spread, b: Spread, higher: str = "faster", lower: str = "slower") -> str:
    """``a`` against ``b`` in words, from the medians: ``"1.4 times faster"``, ``"1.2 times slower"``,
    or ``"no clear difference"`` when the ranges overlap (see :func:`compare`)."""
    verdict = compare(a, b)
    if verdict == 0:
        return "no clear difference"
    ratio = a.median / b.median if verdict > 0 else b.median / a.median
    return f"{ratio:.1f} times {higher if verdict > 0 else lower}"


def interleaved(runs: dict[str, Callable[[], object]], repeats: int = 3) -> dict[str, list]:
    """Call every function of ``runs`` once per round, for ``repeats`` rounds; results by name.

    The order is A, B, C, A, B, C, ... rather than A, A, A, B, B, B, so that a change in the
    machine's load during the measurement reaches every contender, not only the last one.
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    results: dict[str, list] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            results[name].append(run())
    return results


# ---------------------------------------------------------- the benchmark suite (make bench)
#
# `python -m packlab.bench` (what `make bench` runs) measures, in one process tree and one
# run: the decode ceiling, then every loader of the course at several worker counts on
# the full dataset, then the small-file penalty on cold and on modelled network storage.
# It prints a table and writes _build/bench/bench.json and _build/bench/bench.png.


@contextmanager
def torch_threads(count: int):
    """Run a block with torch's intra-op thread pool set to ``count`` threads, then restore it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


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


def batch_memory_seconds(batch_size: int = 64, repeats: int = 5) -> dict[str, float]:
    """Seconds per image to fill a batch in fresh shared memory, in fresh private memory, and in reused memory.

    A DataLoader worker hands every batch to the main process in a new shared-memory
    block; the kernel must supply (and zero) its pages before the worker can write them.
    This measures that cost per image of the standard 3x256x256 float batch, next to
    writing the same batch into memory that is already mapped. The decode ceiling does
    not pay it; a loader with workers does, for every batch.
    """
    from packlab.transforms import IMAGE_SIZE

    shape = (batch_size, 3, IMAGE_SIZE, IMAGE_SIZE)
    numel = math.prod(shape)

    def fresh_shared():
        storage = torch.empty(0)._typed_storage()._new_shared(numel, device="cpu")
        return torch.empty(0).new(storage).view(shape)

    reused = torch.empty(shape)
    reused.fill_(0.0)
    kinds = {"fresh_shared": fresh_shared, "fresh_private": lambda: torch.empty(shape), "reused": lambda: reused}
    out = {}
    with torch_threads(1):
        for kind, make in kinds.items():
            best = float("inf")
            for _ in range(repeats):
                start = time.perf_counter()
                make().fill_(0.5)
                best = min(best, time.perf_counter() - start)
            out[f"{kind}_s_per_image"] = best / batch_size
    return out


def _suite_loaders(root, shards: list[str], zip_path, seed: int = 0) -> dict[str, Callable[[int], Iterable]]:
    """name -> ``make(workers)``: every loader of the benchmark, all producing the standard float batches.

    Ours use the fast path of :mod:`packlab.loaders.batching` (uint8 pixels, converted to
    float a batch at a time); webdataset runs the course's pipeline as chapter 5 writes it,
    with the standard transform per sample. ``tar, per-sample float`` is our tar loader
    with the standard transform and the default collate, to show what the batching buys.
    """
    from torch.utils.data import DataLoader

    from packlab.loaders import JpegFolderDataset, TarShardDataset, ZipDataset
    from packlab.loaders.batching import collate_uint8_images
    from packlab.loaders.with_webdataset import webdataset_loader
    from packlab.transforms import decode_and_resize

    batch = 64

    def context(workers: int):
        return "fork" if workers else None

    def shuffled(dataset, workers):
        generator = torch.Generator().manual_seed(seed)
        return DataLoader(dataset, batch_size=batch, shuffle=True, generator=generator, num_workers=workers,
                          collate_fn=collate_uint8_images, multiprocessing_context=context(workers))

    def tar(workers, fast=True):
        dataset = TarShardDataset(shards, shuffle_buffer=1000, seed=seed,
                                  **({"transform": decode_and_resize} if fast else {}))
        return DataLoader(dataset, batch_size=batch, num_workers=workers, multiprocessing_context=context(workers),
                          **({"collate_fn": collate_uint8_images} if fast else {}))

    return {
        "JPEG folder": lambda w: shuffled(JpegFolderDataset(root, transform=decode_and_resize), w),
        "zip, per-worker handle": lambda w: shuffled(ZipDataset(zip_path, transform=decode_and_resize), w),
        "tar shards (ours)": lambda w: tar(w),
        "webdataset": lambda w: webdataset_loader(shards, w, multiprocessing_context=context(w), batch_size=batch,
                                                  with_keys=False),
        "tar, per-sample float": lambda w: tar(w, fast=False),
    }


def small_file_penalty(
    root=None,
    model=None,
    workers: int | None = None,
    folder_files: int = 2000,
) -> dict:
    """Reading speed (files/s, no decode) of a JPEG folder, a zip and tar shards on slow storage.

    Two kinds of slow: *cold* (the files' pages dropped from the page cache first: real
    disk reads, Linux only) and *modelled* (:class:`packlab.storage.NetworkFSModel`, the
    same delays applied to every loader through its ``opener``). Decoding is left out on
    purpose (the transform only counts bytes): this measures the storage pattern, which
    decode time would otherwise hide on a machine with few cores. The folder and the zip
    are read in shuffled order, as a training epoch reads them; the shards in order. The
    folder reads only its first ``folder_files`` files under the model (it is slow there;
    the rate is what counts). Returns measured rates, the model's parameters and its prediction.
    """
    from torch.utils.data import DataLoader

    from packlab import data, pack, storage
    from packlab.loaders import JpegFolderDataset, TarShardDataset, ZipDataset
    from packlab.loaders.tar import skip_decode

    workers = data.available_cores() if workers is None else workers
    model = model or storage.NetworkFSModel()
    manifest = data.load_manifest(root)
    shards = [str(p) for p in pack.ensure_tar_shards(maxcount=_shard_size(len(manifest), workers),
                                                       root=root, progress=False)]
    zip_path = pack.ensure_zip(root=root, progress=False)

    def rate(dataset, batch_size=64) -> float:
        # Map-style datasets are read in shuffled order, as in training; tar shards in order, as designed.
        shuffle = not isinstance(dataset, torch.utils.data.IterableDataset)
        generator = torch.Generator().manual_seed(0)
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator,
                            num_workers=workers, multiprocessing_context="fork" if workers else None)
        return time_loader(loader, epochs=1).images_per_s

    def folder(keys, opener=None):
        return JpegFolderDataset(root, keys=keys, transform=skip_decode, **({"opener": opener} if opener else {}))

    out: dict = {"workers": workers, "model": asdict(model), "model_text": model.describe()}
    all_keys = [s.key for s in manifest]
    some_keys = all_keys[:folder_files]

    # Cold: drop the pages, read once (every file), and compare with the same read warm.
    if storage.page_cache_control_available():
        images = [data.image_path(k, root) for k in all_keys]
        cold = {}
        storage.drop_from_page_cache(images)
        cold["folder_cold"] = rate(folder(all_keys))
        cold["folder_warm"] = rate(folder(all_keys))
        storage.drop_from_page_cache([zip_path])
        cold["zip_cold"] = rate(ZipDataset(zip_path, transform=skip_decode))
        cold["zip_warm"] = rate(ZipDataset(zip_path, transform=skip_decode))
        storage.drop_from_page_cache(shards)
        cold["tar_cold"] = rate(TarShardDataset(shards, transform=skip_decode))
        cold["tar_warm"] = rate(TarShardDataset(shards, transform=skip_decode))
        out["cold_files_per_s"] = cold
    else:
        out["cold_files_per_s"] = None

    modelled = {
        "folder": rate(folder(some_keys, opener=model.open)),
        "zip": rate(ZipDataset(zip_path, transform=skip_decode, opener=model.open)),
        "tar": rate(TarShardDataset(shards, transform=skip_decode, opener=model.open)),
    }
    out["modelled_files_per_s"] = modelled
    out["tar_vs_folder_modelled"] = modelled["tar"] / modelled["folder"]
    prediction = storage.predict_reading(model, [s.bytes for s in manifest], [os.path.getsize(p) for p in shards])
    out["predicted_files_per_s"] = {
        layout: workers_or_one(workers) * rate for layout, rate in prediction["files_per_s"].items()
    }
    return out


def _shard_size(images: int, max_workers: int) -> int:
    """The course's 1,000 samples a shard, or fewer when a small dataset would give a worker no shard."""
    return max(1, min(1000, images // (2 * max(1, max_workers))))


def workers_or_one(workers: int) -> int:
    """Readers working in parallel: the workers, or the main process when there are none."""
    return max(1, workers)


def run_benchmark(
    root=None,
    worker_counts: Sequence[int] | None = None,
    out_dir=None,
    log: Callable[[str], None] = print,
    with_small_files: bool = True,
    with_formats: bool = True,
) -> dict:
    """Run the whole benchmark; write ``bench.json`` and ``bench.png`` to ``out_dir``; return the results.

    ``worker_counts`` defaults to ``{0, 1, cores, 2 x cores}``. Every loader reads the full
    dataset once per run; at ``workers = cores`` each runs two epochs and the faster one
    counts (``best``), the other worker counts one epoch. Ratios in ``bench.json``:

    * ``zip_vs_ceiling``, ``tar_vs_ceiling``: best images/s at ``workers = cores`` divided
      by ``ceiling x cores``;
    * ``tar_vs_webdataset``: ours / webdataset, same shards, buffer, transform, batch and
      ``workers = cores``.
    """
    import json
    import platform
    from pathlib import Path

    from packlab import data, pack, paths, plots

    cores = data.available_cores()
    worker_counts = sorted(set(worker_counts or [0, 1, cores, 2 * cores]))
    out_dir = Path(out_dir) if out_dir is not None else paths.build_dir() / "bench"
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = data.load_manifest(root)
    started = time.perf_counter()
    results: dict = {
        "machine": {"cores": cores, "python": platform.python_version(), "torch": torch.__version__,
                    "load_average_before": _load_average()},
        "images": len(manifest),
    }

    log(f"decode ceiling: decode + standard transform of {len(manifest)} JPEGs in memory, 1 process, 1 torch thread")
    encoded = [data.image_path(s.key, root).read_bytes() for s in manifest]
    ceiling = measure_ceiling(encoded)
    del encoded
    results["ceiling_images_per_s_per_core"] = ceiling
    log(f"  {ceiling:.0f} images/s per core")
    results["batch_memory"] = batch_memory_seconds()

    shards = [str(p) for p in pack.ensure_tar_shards(maxcount=_shard_size(len(manifest), max(worker_counts)),
                                                       root=root, progress=False)]
    zip_path = pack.ensure_zip(root=root, progress=False)
    loaders = _suite_loaders(root, shards, zip_path)
    rows = []
    # 2 x cores workers is one of the measured settings; torch's warning about it says nothing new here.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    with torch_threads(1):  # the main process only collects batches; keep its thread pool out of the way
        for name, make in loaders.items():
            counts = [cores] if name == "tar, per-sample float" else worker_counts
            for workers in counts:
                epochs = 2 if workers == cores else 1
                result = time_loader(make(workers), epochs=epochs, name=f"{name}, {workers} workers")
                best = result.images_per_epoch / min(result.epoch_seconds)
                rows.append({"loader": name, "workers": workers, "epochs": epochs,
                             "images_per_s": result.images_per_s, "best_epoch_images_per_s": best,
                             "epoch_seconds": result.epoch_seconds,
                             "first_batch_seconds": result.first_batch_seconds})
                log(f"  {name:24s} workers={workers}: {result.images_per_s:7.0f} images/s (best epoch {best:.0f})")
    results["runs"] = rows

    def best(name: str, workers: int = cores) -> float:
        return next(r["best_epoch_images_per_s"] for r in rows if r["loader"] == name and r["workers"] == workers)

    results["ratios"] = {
        "zip_vs_ceiling": best("zip, per-worker handle") / (ceiling * cores),
        "tar_vs_ceiling": best("tar shards (ours)") / (ceiling * cores),
        "folder_vs_ceiling": best("JPEG folder") / (ceiling * cores),
        "webdataset_vs_ceiling": best("webdataset") / (ceiling * cores),
        "tar_vs_webdataset": best("tar shards (ours)") / best("webdataset"),
        "batching_gain": best("tar shards (ours)") / best("tar, per-sample float"),
    }
    if with_small_files:
        log("small-file penalty: reading without decoding, cold and under the network-filesystem model")
        results["small_files"] = small_file_penalty(root)
        log(f"  {results['small_files']['modelled_files_per_s']}")
    if with_formats:  # chapter 9: every packed format side by side (packlab.formats.bench)
        from packlab.formats.bench import measure_formats

        log("other formats: size, write time and read rates of every layout, 3 rounds")
        results["formats"] = measure_formats(root=root, log=lambda message: log(f"  {message}"))
    results["machine"]["load_average_after"] = _load_average()
    results["wall_seconds"] = time.perf_counter() - started

    (out_dir / "bench.json").write_text(json.dumps(results, indent=2))
    series: dict[str, dict[int, float]] = {}
    for row in rows:
        if row["loader"] != "tar, per-sample float":
            series.setdefault(row["loader"], {})[row["workers"]] = row["images_per_s"]
    figure = plots.plot_throughput_vs_workers(
        series, ceiling=ceiling * cores, title=f"Full epoch of {len(manifest):,} images, {cores} cores",
        ceiling_label=f"decode ceiling x {cores} cores",
    )
    figure.savefig(out_dir / "bench.png", dpi=120)
    log("")
    log(format_benchmark(results))
    log(f"\nwrote {out_dir / 'bench.json'} and {out_dir / 'bench.png'} ({results['wall_seconds']:.0f} s)")
    return results


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def format_benchmark(results: dict) -> str:
    """The benchmark's results as a plain-text table and the ratios."""
    cores = results["machine"]["cores"]
    ceiling = results["ceiling_images_per_s_per_core"]
    rows = results["runs"]
    names = list(dict.fromkeys(r["loader"] for r in rows))
    counts = sorted({r["workers"] for r in rows})
    table = {(r["loader"], r["workers"]): r["images_per_s"] for r in rows}
    width = max(len(n) for n in names)
    lines = [f"images/s, full epoch of {results['images']:,} images (start-up included)",
             "loader".ljust(width) + "".join(f"{f'{w} workers':>12}" for w in counts)]
    for name in names:
        cells = "".join(f"{table[(name, w)]:12.0f}" if (name, w) in table else " " * 12 for w in counts)
        lines.append(name.ljust(width) + cells)
    lines.append(f"decode ceiling: {ceiling:.0f} images/s per core; x {cores} cores = {ceiling * cores:.0f}")
    memory = results["batch_memory"]
    lines.append(
        "filling a batch, ms per image: fresh shared memory {:.2f}, fresh private {:.2f}, reused {:.2f}".format(
            *(memory[k] * 1e3 for k in ("fresh_shared_s_per_image", "fresh_private_s_per_image", "reused_s_per_image"))
        )
    )
    lines.append("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in results["ratios"].items()))
    small = results.get("small_files")
    if small:
        lines.append(f"small files ({small['workers']} workers, no decode), files/s under the model "
                     f"[{small['model_text']}]: " + ", ".join(f"{k} {v:.0f}" for k, v in small["modelled_files_per_s"].items())
                     + f"; tar/folder {small['tar_vs_folder_modelled']:.1f}x")
        if small["cold_files_per_s"]:
            lines.append("  cold vs warm page cache, files/s: " + ", ".join(
                f"{k} {v:.0f}" for k, v in small["cold_files_per_s"].items()))
    if results.get("formats"):
        from packlab.formats.bench import format_formats

        lines.append(format_formats(results["formats"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m packlab.bench", description=run_benchmark.__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="*", help="worker counts (default: 0 1 cores 2xcores)")
    parser.add_argument("--out", help="output folder (default: _build/bench)")
    parser.add_argument("--no-small-files", action="store_true", help="skip the cold-read and latency-model part")
    parser.add_argument("--no-formats", action="store_true", help="skip the other formats (chapter 9)")
    args = parser.parse_args(argv)
    run_benchmark(worker_counts=args.workers, out_dir=args.out, with_small_files=not args.no_small_files,
                  with_formats=not args.no_formats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


# ------------------------------------------------------------ repeated, interleaved runs


@dataclass(frozen=True)
class Spread:
    """Several measurements of one quantity: the median, and the range they spanned."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        import statistics

        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    def overlaps(self, other: Spread) -> bool:
        """True when the two ranges overlap: then the runs do not tell the two apart."""
        return self.low <= other.high and other.low <= self.high

    def format(self, spec: str = ".0f") -> str:
        """``median (low–high)``, each formatted with ``spec``."""
        return f"{self.median:{spec}} ({self.low:{spec}}–{self.high:{spec}})"


def interleaved(runs: dict[str, Callable[[], float]], rounds: int = 3) -> dict[str, Spread]:
    """Call every run once per round, in turn, for ``rounds`` rounds; return each one's :class:`Spread`.

    Interleaving (A, B, C, A, B, C, ...) rather than repeating each run in a block means
    that load which comes and goes on a shared machine falls on all runs alike.
    """
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    values: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            values[name].append(float(run()))
    return {name: Spread(tuple(v)) for name, v in values.items()}

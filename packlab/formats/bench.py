"""Every packed format on the same samples, in the same run: bytes on disk, write time, read rates.

:func:`measure_formats` writes the same samples as a folder of JPEGs (a copy), a zip, tar
shards, LMDB, HDF5, Parquet and ``.npz``, then reads each back, and repeats the whole
round ``runs`` times. The layouts take turns in a counterbalanced order
(:func:`packlab.bench.round_orders`, the design :func:`packlab.bench.interleaved` uses), so
that neither a change in the machine's load nor a place in the round (first after the
caches were dropped, say) falls on one layout more than on the others. Every figure it
reports is the median of the rounds with the lowest and highest value beside it.

What a read measures: **one reader process, no DataLoader workers, no decoding**. The
transform only counts the bytes (:func:`packlab.loaders.tar.skip_decode`), so what is
timed is the format's way of finding and reading a sample, which decode time would
otherwise hide (every format delivers the same JPEG bytes, and decoding them costs the
same whichever format they came from). A loader with ``W`` workers can read up to ``W``
times as fast, if the cores and the storage allow.

* **random**: a map-style dataset read in a random order, as a training epoch reads it:
  ``random_reads`` samples spread over the whole read set (one drawn from each of as many
  equal stretches of it, then shuffled; :func:`spread_indices`), a new draw each round.
  Spreading them keeps any two reads apart by more than the kernel's readahead fetches
  around one read, so no read finds its bytes already fetched by another: each random
  read costs what it would in a data set far larger than the page cache. Tar shards have
  no random access. LMDB is opened with ``readahead=False`` for these reads (see
  :data:`LAYOUTS`).
* **sequential**: in stored order: map-style datasets unshuffled, and the stream datasets
  (tar shards, :class:`~packlab.formats.LmdbStreamDataset`,
  :class:`~packlab.formats.ParquetStreamDataset`) block by block;

each read **cold**, **warm** and through the **network model**
(:class:`packlab.storage.NetworkFSModel` as the ``opener``). Cold means what it means in
chapters 2 and 7: :func:`packlab.storage.make_cold` at the strongest level this process
may use (``cold_level``; as root, every cache of the machine dropped), once per round and
access for all layouts together. The datasets are created *before* the drop, so the index
each reads when it is created (LMDB's keys, a zip's central directory) is not counted in
the cold read: it is read once per job, not per sample, and an LMDB key scan with the
kernel's read-around would otherwise fetch most of a small file before the first timed
read. :func:`packlab.storage.resident_fraction` records how much of each layout's files
was in the page cache before the drop, after it and after the cold read, beside the share
the samples read make up, so a result says whether the eviction worked (a file that stays
mapped keeps its pages) and how much the reads fetched besides their samples. Warm is the
same read again at once, the same samples in the same order, repeated until ``budget_s``
has passed: from the page cache. LMDB reads through a memory map, not through file reads,
so no opener can delay them: it has no network-model figure.

A read of a file set that readahead sweeps in a few requests is not cold for long: so the
reads can go to a larger *read set* (``read_samples``), written once before the rounds,
while every round still writes ``samples`` for the write times and sizes.

A read stops at the first batch after ``budget_s`` seconds and reports the rate of what it
read: the slow combinations (shuffled Parquet over the network model reads a whole row
group per sample) would otherwise take minutes, and the rate is what counts.
"""

from __future__ import annotations

import itertools
import os
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from packlab import data, pack, storage
from packlab.bench import ROUNDS, Spread, batch_size_of, ranking, round_orders
from packlab.bench import compare as bench_compare
from packlab.formats.hdf5_format import Hdf5Dataset, write_hdf5
from packlab.formats.lmdb_format import LmdbDataset, LmdbStreamDataset, close_environment, write_lmdb
from packlab.formats.npz_format import NpzDataset, write_npz
from packlab.formats.parquet_format import ParquetDataset, ParquetStreamDataset, write_parquet
from packlab.loaders import JpegFolderDataset, TarShardDataset, ZipDataset
from packlab.loaders.tar import skip_decode

ACCESSES = ("random", "sequential")
CONDITIONS = ("warm", "cold", "network model")
#: Samples per batch of every read: small, so that a read stops soon after its time budget.
BATCH = 16
#: Random reads per layout, round and condition unless told otherwise (spread over the read set).
RANDOM_READS = 32


# ------------------------------------------------------------------- the layouts


def write_folder(dst: Path, samples: Sequence[data.Sample], root: Path | None) -> Path:
    """A copy of the samples as a dataset folder (``images/<key>.jpg`` + ``labels.csv``): one file per sample."""
    tmp = dst.with_name(f"{dst.name}.partial-{os.getpid()}")
    (tmp / "images").mkdir(parents=True)
    for sample in samples:
        shutil.copyfile(data.image_path(sample.key, root), tmp / "images" / f"{sample.key}.jpg")
    (tmp / "labels.csv").write_text("key,label\n" + "".join(f"{s.key},{s.label}\n" for s in samples))
    os.replace(tmp, dst)
    return dst


@dataclass(frozen=True)
class Layout:
    """How to write one layout and how to read it back (``None``: that access does not exist)."""

    name: str
    write: Callable[[Path, Sequence[data.Sample], Path | None], object]
    random: Callable | None  # (where, opener) -> map-style dataset
    sequential: Callable  # (where, opener) -> dataset, read unshuffled
    opener: bool = True  # whether the library reads through a file object we can give it


def _opt(opener) -> dict:
    return {} if opener is None else {"opener": opener}


def _tar_shards(where: Path) -> list[str]:
    return [str(p) for p in sorted(where.glob("shard-*.tar"))]


LAYOUTS = (
    Layout("folder", write_folder,
           lambda where, opener: JpegFolderDataset(where, transform=skip_decode, **_opt(opener)),
           lambda where, opener: JpegFolderDataset(where, transform=skip_decode, **_opt(opener))),
    Layout("zip", lambda dst, samples, root: pack.write_zip(dst, samples=samples, root=root, progress=False),
           lambda where, opener: ZipDataset(where, transform=skip_decode, **_opt(opener)),
           lambda where, opener: ZipDataset(where, transform=skip_decode, **_opt(opener))),
    Layout("tar", lambda dst, samples, root: pack.write_tar_shards(dst, samples=samples, root=root, progress=False),
           None,
           lambda where, opener: TarShardDataset(_tar_shards(where), transform=skip_decode, **_opt(opener))),
    # Random reads open LMDB with readahead=False: py-lmdb then passes MDB_NORDAHEAD, and LMDB
    # advises the kernel that its memory map is read at random (madvise MADV_RANDOM), so a page
    # fault reads that page alone instead of the kernel's read-around (up to the disk's
    # read_ahead_kb around it), which for scattered reads fetches mostly bytes nobody asked for.
    Layout("lmdb", lambda dst, samples, root: write_lmdb(dst, samples=samples, root=root, progress_bar=False),
           lambda where, opener: LmdbDataset(where, transform=skip_decode, readahead=False),
           lambda where, opener: LmdbStreamDataset(where, transform=skip_decode),
           opener=False),
    Layout("hdf5", lambda dst, samples, root: write_hdf5(dst, samples=samples, root=root, progress_bar=False),
           lambda where, opener: Hdf5Dataset(where, transform=skip_decode, opener=opener),
           lambda where, opener: Hdf5Dataset(where, transform=skip_decode, opener=opener)),
    Layout("parquet", lambda dst, samples, root: write_parquet(dst, samples=samples, root=root, progress_bar=False),
           lambda where, opener: ParquetDataset(where, transform=skip_decode, opener=opener),
           lambda where, opener: ParquetStreamDataset(where, transform=skip_decode, opener=opener)),
    Layout("npz", lambda dst, samples, root: write_npz(dst, samples=samples, root=root, progress_bar=False),
           lambda where, opener: NpzDataset(where, transform=skip_decode, opener=opener),
           lambda where, opener: NpzDataset(where, transform=skip_decode, opener=opener)),
)


def files_of(where: Path) -> list[Path]:
    """Every file a layout wrote: the path itself, or the files under it."""
    return [where] if where.is_file() else sorted(p for p in where.rglob("*") if p.is_file())


def disk_usage(files: Sequence[Path]) -> tuple[int, int]:
    """``(bytes, bytes allocated on disk)`` of ``files``: their sizes, and the blocks the filesystem gave them."""
    stats = [f.stat() for f in files]
    return sum(s.st_size for s in stats), sum(s.st_blocks * 512 for s in stats)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _sync(files: Sequence[Path]) -> None:
    """Write the files' pages to disk, so that dropping them from the page cache is possible (dirty pages stay)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --------------------------------------------------------------------- reading


def spread_indices(count: int, reads: int, seed: int = 0) -> list[int]:
    """``reads`` indices of ``range(count)`` for a random read: evenly spread, in random order.

    The indices are ``count / reads`` samples apart, starting at a random offset, and then
    shuffled (seeded by ``seed``): each is as likely as any other, the order is as random
    as an epoch's, and no two of them are neighbours in the file, whose readahead could
    fetch one together with the other. With ``reads >= count``: every index, shuffled.
    """
    import random

    rng = random.Random(seed)
    if reads >= count:
        return rng.sample(range(count), count)
    step = count / reads
    start = rng.random() * step
    indices = [int(start + i * step) for i in range(reads)]
    rng.shuffle(indices)
    return indices


class _FirstSamples(torch.utils.data.IterableDataset):
    """The first ``count`` samples a stream dataset yields (all of them when ``count`` is None)."""

    def __init__(self, dataset, count: int | None):
        super().__init__()
        self.dataset, self.count = dataset, count

    def __iter__(self):
        return itertools.islice(iter(self.dataset), self.count)


def read_rate(dataset, budget_s: float, indices: Sequence[int] | None = None, count: int | None = None,
              repeat: bool = False) -> tuple[float, int]:
    """``(samples/s, samples in one pass)``: ``dataset`` read in one process, no workers, batches of :data:`BATCH`.

    A map-style dataset is read in the order of ``indices`` (default: stored order), a
    stream dataset in the order it yields (its epoch set to 0 before every pass, so every
    pass is the same). A pass ends after the first ``count`` samples (default: all of
    them), or at the first batch boundary after ``budget_s`` seconds. ``repeat=True``
    starts the same pass again until ``budget_s`` has passed: a warm read of exactly the
    samples a cold read just read (pass it that read's count).
    """
    if isinstance(dataset, torch.utils.data.IterableDataset):
        loader = DataLoader(_FirstSamples(dataset, count), batch_size=BATCH)
    else:
        order = list(range(len(dataset)) if indices is None else indices)[:count]
        loader = DataLoader(dataset, batch_size=BATCH, sampler=order)
    read = one_pass = 0
    start = time.perf_counter()
    while True:
        if hasattr(dataset, "set_epoch"):
            dataset.set_epoch(0)  # the same order again, on purpose (tar shards warn about a repeated epoch)
        for batch in loader:
            read += batch_size_of(batch)
            if time.perf_counter() - start > budget_s:
                break
        one_pass = one_pass or read
        if not repeat or read == 0 or time.perf_counter() - start > budget_s:
            break
    seconds = time.perf_counter() - start
    if read == 0:
        raise RuntimeError(f"{dataset!r} delivered no samples")
    return read / seconds, one_pass


def _release(dataset, where: Path) -> None:
    """Close what reading opened in this process (LMDB keeps one environment per file and process)."""
    if hasattr(dataset, "close"):
        dataset.close()
    if where.is_file():
        close_environment(where)


def device_readahead_kb(path: Path) -> int | None:
    """How far ahead (KiB) the kernel may read for the device holding ``path``, or None where it cannot be read.

    The device's ``read_ahead_kb`` (Linux sysfs): the largest window the kernel reads
    around a page fault in a memory map, and the most it reads ahead of sequential
    ``read`` calls. The larger it is, the more of a small file a few reads bring into the
    page cache.
    """
    device = os.stat(path).st_dev
    number = f"{os.major(device)}:{os.minor(device)}"
    for candidate in (Path("/sys/class/bdi") / number / "read_ahead_kb",
                      Path("/sys/dev/block") / number / "queue" / "read_ahead_kb",
                      Path("/sys/dev/block") / number / ".." / "queue" / "read_ahead_kb"):
        try:
            return int(candidate.read_text())
        except (OSError, ValueError):
            continue
    return None


# ------------------------------------------------------------------- the measurement


def _write(layout: Layout, where: Path, samples: Sequence[data.Sample], root: Path | None) -> tuple[float, list[Path]]:
    """Write one layout; return the seconds it took and its files, written out to the disk."""
    start = time.perf_counter()
    layout.write(where, samples, root)
    seconds = time.perf_counter() - start
    files = files_of(where)
    _sync(files)
    return seconds, files


def measure_formats(
    samples: Sequence[data.Sample] | None = None,
    *,
    root: Path | None = None,
    workdir: Path | None = None,
    runs: int = ROUNDS,
    budget_s: float = 2.0,
    model: storage.NetworkFSModel | None = None,
    layouts: Sequence[str] | None = None,
    cold_level: str | None = None,
    read_samples: Sequence[data.Sample] | None = None,
    random_reads: int = RANDOM_READS,
    seed: int = 0,
    log: Callable[[str], None] | None = None,
) -> dict:
    """Write and read every layout ``runs`` times (rounds interleaved); return raw figures as plain data.

    ``samples`` default to the whole manifest; ``workdir`` to ``<data root>/packed/formats-bench``
    (emptied first, each round's files replaced by the next's; remove it when done).
    ``layouts`` picks some of :data:`LAYOUTS` by name. ``runs`` defaults to
    :data:`packlab.bench.ROUNDS`, the rounds :func:`packlab.bench.compare` needs before it
    can call a difference clear. ``cold_level`` defaults to the strongest level of
    :func:`packlab.storage.cold_levels`. ``read_samples``: the reads go to a copy of these,
    written once before the rounds (default: to each round's copy of ``samples``).
    ``random_reads``: samples per random read (:func:`spread_indices`). ``seed`` draws the
    order of the layouts in each round and the samples of the random reads.
    See the module docstring for what each figure means.

    Each round writes every layout, then, per access (random, sequential): creates each
    layout's dataset, drops the caches once for all layouts, reads each cold, then each
    warm; then reads each through the network model. The layouts take their turns in the
    round's order (:func:`packlab.bench.round_orders`).
    """
    from packlab import paths

    samples = list(samples if samples is not None else data.load_manifest(root))
    model = model or storage.NetworkFSModel()
    chosen = [layout for layout in LAYOUTS if layouts is None or layout.name in layouts]
    workdir = Path(workdir) if workdir is not None else paths.packed_dir(root) / "formats-bench"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    level = cold_level if cold_level is not None else (storage.cold_levels() or [None])[-1]
    say = log or (lambda message: None)
    read_set = list(read_samples) if read_samples is not None else None
    read_list = read_set if read_set is not None else samples  # the samples the reads go to
    read_count, read_bytes = len(read_list), sum(s.bytes for s in read_list)
    results: dict = {
        "samples": len(samples),
        "jpeg_bytes": sum(s.bytes for s in samples),
        "read_samples": read_count,
        "read_jpeg_bytes": read_bytes,
        "read_set_written_once": read_set is not None,
        "random_reads": min(random_reads, read_count),
        "runs": runs,
        "budget_s": budget_s,
        "model": asdict(model),
        "model_text": model.describe(),
        "cold_level": level,
        "cold": f"{level}: {storage.COLD_LEVELS[level]}" if level else None,
        "readahead_kb": device_readahead_kb(workdir),
        "reader": f"one process, no workers, batches of {BATCH}, bytes counted, not decoded",
        "orders": [],
        "workdir": str(workdir),
        "load_average": [os.getloadavg()[0]],
        "layouts": {
            layout.name: {
                "write_s": [], "bytes": None, "allocated": None, "opener": layout.opener,
                # Where the read set of this layout is, and its size on disk, when it was written once.
                "read_set": None, "read_set_bytes": None,
                # Share of the layout's pages in the page cache around its first cold read, and the share
                # of its bytes the samples of that read make up.
                "resident": {}, "cold_read_share": None,
                # None where a figure cannot exist: tar shards have no random access, and no opener
                # can delay LMDB's memory-mapped reads.
                "rates": {access: None if getattr(layout, access) is None else
                          {condition: None if condition == "network model" and not layout.opener else []
                           for condition in CONDITIONS}
                          for access in ACCESSES},
            }
            for layout in chosen
        },
    }

    read_where: dict[str, Path] = {}
    read_files: dict[str, list[Path]] = {}
    if read_set is not None:
        for layout in chosen:
            read_where[layout.name] = workdir / "read-set" / layout.name
            read_where[layout.name].parent.mkdir(exist_ok=True)
            _, read_files[layout.name] = _write(layout, read_where[layout.name], read_set, root)
            results["layouts"][layout.name]["read_set_bytes"] = disk_usage(read_files[layout.name])[1]
            results["layouts"][layout.name]["read_set"] = str(read_where[layout.name])
        say(f"read set: {read_count:,} samples written once in every layout")

    def read_access(run: int, order: list[Layout], access: str) -> None:
        readable = [layout for layout in order if getattr(layout, access) is not None]
        indices = spread_indices(read_count, random_reads, seed=seed * 1_000_003 + run) if access == "random" else None
        datasets = {layout.name: getattr(layout, access)(read_where[layout.name], None) for layout in readable}
        counts: dict[str, int | None] = {layout.name: None for layout in readable}
        if level is not None:
            # In the first round each layout's first cold read (random; sequential for tar) is watched.
            watched = [layout for layout in readable if run == 0 and not results["layouts"][layout.name]["resident"]]
            for layout in watched:
                results["layouts"][layout.name]["resident"]["before"] = storage.resident_fraction(read_files[layout.name])
            storage.make_cold([f for layout in readable for f in read_files[layout.name]], level)
            for layout in readable:
                entry = results["layouts"][layout.name]
                if layout in watched:
                    entry["resident"]["after dropping"] = storage.resident_fraction(read_files[layout.name])
                rate, counts[layout.name] = read_rate(datasets[layout.name], budget_s, indices)
                entry["rates"][access]["cold"].append(rate)
                if layout in watched:
                    entry["resident"]["after the cold read"] = storage.resident_fraction(read_files[layout.name])
                    read = counts[layout.name]  # random: exactly these samples; in stored order: as many, on average
                    sample_bytes = (sum(read_list[i].bytes for i in indices[:read]) if indices is not None
                                    else read * read_bytes / read_count)
                    entry["cold_read_share"] = sample_bytes / disk_usage(read_files[layout.name])[0]
        for layout in readable:
            rate, _ = read_rate(datasets[layout.name], budget_s, indices, counts[layout.name], repeat=True)
            results["layouts"][layout.name]["rates"][access]["warm"].append(rate)
        for layout in readable:
            _release(datasets[layout.name], read_where[layout.name])
            if layout.opener:
                dataset = getattr(layout, access)(read_where[layout.name], model.open)
                rate, _ = read_rate(dataset, budget_s, indices, counts[layout.name], repeat=True)
                _release(dataset, read_where[layout.name])
                results["layouts"][layout.name]["rates"][access]["network model"].append(rate)

    for run, turn in enumerate(round_orders(len(chosen), runs, seed=seed)):
        order = [chosen[i] for i in turn]
        results["orders"].append([layout.name for layout in order])
        where = {layout.name: workdir / f"{layout.name}-{run}" for layout in order}
        for layout in order:
            entry = results["layouts"][layout.name]
            seconds, files = _write(layout, where[layout.name], samples, root)
            entry["write_s"].append(seconds)
            entry["bytes"], entry["allocated"] = disk_usage(files)
            if read_set is None:
                read_where[layout.name], read_files[layout.name] = where[layout.name], files
        for access in ACCESSES:
            read_access(run, order, access)
        for layout in order:
            entry = results["layouts"][layout.name]
            say(f"round {run + 1}/{runs} {layout.name}: written in {entry['write_s'][-1]:.2f} s, "
                f"{entry['allocated'] / 1e6:.0f} MB; warm "
                + ", ".join(f"{a} {r['warm'][-1]:.0f}/s" for a, r in entry["rates"].items() if r))
            if run > 0:
                _remove(workdir / f"{layout.name}-{run - 1}")  # keep one round's files on disk, not all of them
    results["load_average"].append(os.getloadavg()[0])
    return results


# ------------------------------------------------------------- summaries and verdicts


def spread(values: Sequence[float] | None) -> tuple[float, float, float] | None:
    """``(median, lowest, highest)`` of the rounds, or None when nothing was measured."""
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def show(values: Sequence[float] | None, digits: int = 0) -> str:
    """``"median (lowest–highest)"``, or ``"n/a"`` where nothing was (or could be) measured."""
    figure = spread(values)
    if figure is None:
        return "n/a"
    median, low, high = figure
    return f"{median:,.{digits}f} ({low:,.{digits}f}–{high:,.{digits}f})"


def rates(results: dict, access: str, condition: str) -> dict[str, list[float]]:
    """``{layout: rates of the rounds}`` for one access and condition, for the layouts that have them."""
    out = {}
    for name, entry in results["layouts"].items():
        values = (entry["rates"].get(access) or {}).get(condition)
        if values:
            out[name] = values
    return out


def size_rows(results: dict) -> list[dict]:
    """One row per layout: bytes on disk and write time."""
    jpeg = results["jpeg_bytes"]
    return [{"layout": name, "MB on disk": f"{entry['allocated'] / 1e6:,.1f}",
             "× the JPEG bytes": f"{entry['allocated'] / jpeg:.2f}", "write (s)": show(entry["write_s"], 2)}
            for name, entry in results["layouts"].items()]


def read_rows(results: dict) -> list[dict]:
    """One row per layout and access: samples/s warm, cold and through the network model."""
    rows = []
    for access in ACCESSES:
        for name, entry in results["layouts"].items():
            if not entry["rates"].get(access):
                continue
            row = {"layout": name, "access": access}
            for condition in CONDITIONS:
                row[f"{condition} (samples/s)"] = show(entry["rates"][access][condition])
            rows.append(row)
    return rows


def table_rows(results: dict) -> list[dict]:
    """One row per layout: size, write time and every read rate, as ``median (lowest–highest)`` text."""
    rows = []
    for row in size_rows(results):
        entry = results["layouts"][row["layout"]]
        for access in ACCESSES:
            for condition in CONDITIONS:
                row[f"{access}, {condition} (samples/s)"] = show((entry["rates"].get(access) or {}).get(condition))
        rows.append(row)
    return rows


def compare(a: Sequence[float], b: Sequence[float]) -> str:
    """``"higher"``, ``"lower"`` or ``"no clear difference"``: ``a`` against ``b`` by :func:`packlab.bench.compare`."""
    return {1: "higher", -1: "lower", 0: "no clear difference"}[bench_compare(Spread.of(a), Spread.of(b))]


def ranked(values: dict[str, Sequence[float]], highest: bool = True) -> list[tuple[str, bool | None]]:
    """The layouts best first, each with whether it is clearly behind its neighbour above (:func:`packlab.bench.ranking`)."""
    return ranking({name: Spread.of(v) for name, v in values.items()}, higher=highest)


def cold_differs(results: dict, access: str) -> dict[str, bool]:
    """``{layout: whether its cold reads were clearly slower than its warm ones}`` for one access.

    Where they were not, the cold figure says nothing about the disk: the pages came back
    about as fast as from the page cache (a virtual machine's disk cached by its host, a
    fast SSD, or a file the readahead had swept), and no cold verdict should rest on it.
    """
    out = {}
    for name, cold in rates(results, access, "cold").items():
        warm = results["layouts"][name]["rates"][access]["warm"]
        out[name] = bench_compare(Spread.of(cold), Spread.of(warm)) == -1
    return out


def residency_rows(results: dict) -> list[dict]:
    """One row per watched layout: the share of its pages cached before the drop, after it and after the cold read,
    and the share of its bytes the samples of that cold read make up."""
    rows = []
    for name, entry in results["layouts"].items():
        if not entry["resident"]:
            continue
        row = {"layout": name}
        row.update({f"cached, {moment}": f"{share:.1%}" for moment, share in entry["resident"].items()})
        if entry["cold_read_share"] is not None:
            row["the samples read"] = f"{entry['cold_read_share']:.1%}"
        rows.append(row)
    return rows


def format_formats(results: dict) -> str:
    """The measurement as plain text (what ``make bench`` prints)."""
    rows = table_rows(results)
    columns = list(rows[0])
    widths = [max(len(c), *(len(r[c]) for r in rows)) for c in columns]
    lines = [f"formats: {results['samples']:,} samples, {results['runs']} rounds, {results['reader']}; "
             f"median (lowest-highest) of the rounds; network model: {results['model_text']}"]
    lines.append("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    lines += ["  ".join(r[c].ljust(w) for c, w in zip(columns, widths)) for r in rows]
    return "\n".join(lines)


def plot_formats(results: dict, conditions: Sequence[str] = CONDITIONS, caption: str | None = None):
    """Read rates of every layout, random and sequential, one panel per condition: median bars, whiskers lowest to highest.

    ``caption`` is drawn under the figure (:func:`packlab.plots.add_caption`)."""
    import matplotlib.pyplot as plt

    from packlab.plots import PALETTE
    import numpy as np

    names = list(results["layouts"])
    fig, axes = plt.subplots(len(conditions), 1, figsize=(9, 2.6 * len(conditions)), sharex=True, squeeze=False)
    width = 0.38
    for ax, condition in zip(axes[:, 0], conditions):
        for i, access in enumerate(ACCESSES):
            values = rates(results, access, condition)
            shown = [n for n in names if n in values]
            med = np.array([statistics.median(values[n]) for n in shown])
            low = med - np.array([min(values[n]) for n in shown])
            high = np.array([max(values[n]) for n in shown]) - med
            xs = [names.index(n) + (i - 0.5) * width for n in shown]
            ax.bar(xs, med, width, yerr=np.array([low, high]), capsize=3, label=access, color=PALETTE[i],
                   hatch="//" if i else "", edgecolor="white")
            for n in names:  # no bar: tar has no random access, LMDB no opener for the network model
                if n not in values:
                    ax.text(names.index(n) + (i - 0.5) * width, 0.04, "n/a", ha="center", va="bottom", fontsize=10,
                            color=PALETTE[i], transform=ax.get_xaxis_transform())
        ax.set_yscale("log")
        ax.set_ylabel("samples/s (log)")
        ax.set_title(f"{condition}", fontsize=11)
    axes[0, 0].legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    axes[-1, 0].set_xticks(range(len(names)), names)
    axes[-1, 0].set_xlabel("layout")
    fig.suptitle(f"Reading {results['samples']:,} samples, one process, no decode: median of {results['runs']} "
                 "rounds, whiskers lowest to highest", fontsize=10)
    fig.tight_layout()
    if caption:
        from packlab.plots import add_caption

        add_caption(fig, caption)
    return fig

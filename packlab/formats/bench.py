"""Every packed format on the same samples, in the same run: bytes on disk, write time, read rates.

:func:`measure_formats` writes the same samples as a folder of JPEGs (a copy), a zip, tar
shards, LMDB, HDF5, Parquet and ``.npz``, then reads each back, and repeats the whole
round ``runs`` times, each round visiting the layouts in a rotated order, so that a
change in the machine's load hits every layout alike. Every figure it reports is the
median of the rounds with the lowest and highest value beside it.

What a read measures: **one reader process, no DataLoader workers, no decoding**. The
transform only counts the bytes (:func:`packlab.loaders.tar.skip_decode`), so what is
timed is the format's way of finding and reading a sample, which decode time would
otherwise hide (every format delivers the same JPEG bytes, and decoding them costs the
same whichever format they came from). A loader with ``W`` workers can read up to ``W``
times as fast, if the cores and the storage allow.

* **random**: a map-style dataset in shuffled order, as a training epoch reads it (tar
  shards have no random access);
* **sequential**: in stored order: map-style datasets unshuffled, and the stream datasets
  (tar shards, :class:`~packlab.formats.LmdbStreamDataset`,
  :class:`~packlab.formats.ParquetStreamDataset`) block by block;

each read **cold**, **warm** and through the **network model**
(:class:`packlab.storage.NetworkFSModel` as the ``opener``). Cold means what it means in
chapters 2 and 7: :func:`packlab.storage.make_cold` at the strongest level this process
may use (``cold_level``; as root, every cache of the machine dropped), once per round and
access for all layouts together, and :func:`packlab.storage.resident_fraction` records
how much of each layout's files was in the page cache just before and just after, so a
result says whether the eviction worked (a file that stays mapped keeps its pages).
Warm is the same read again at once, in the same order: from the page cache. LMDB reads
through a memory map, not through file reads, so no opener can delay them: it has no
network-model figure.

A read stops after ``budget_s`` seconds and reports the rate of what it read: the slow
combinations (shuffled Parquet over the network model reads a whole row group per sample)
would otherwise take minutes, and the rate is what counts.
"""

from __future__ import annotations

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
from packlab.bench import ROUNDS, Spread, batch_size_of
from packlab.bench import compare as bench_compare
from packlab.formats.hdf5_format import Hdf5Dataset, write_hdf5
from packlab.formats.lmdb_format import LmdbDataset, LmdbStreamDataset, close_environment, write_lmdb
from packlab.formats.npz_format import NpzDataset, write_npz
from packlab.formats.parquet_format import ParquetDataset, ParquetStreamDataset, write_parquet
from packlab.loaders import JpegFolderDataset, TarShardDataset, ZipDataset
from packlab.loaders.tar import skip_decode

ACCESSES = ("random", "sequential")
CONDITIONS = ("warm", "cold", "network model")
BATCH = 64


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
    Layout("lmdb", lambda dst, samples, root: write_lmdb(dst, samples=samples, root=root, progress_bar=False),
           lambda where, opener: LmdbDataset(where, transform=skip_decode),
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


def read_rate(dataset, shuffle: bool, budget_s: float, seed: int = 0) -> float:
    """Samples/s reading ``dataset`` in one process until it ends or ``budget_s`` has passed."""
    generator = torch.Generator().manual_seed(seed)
    map_style = not isinstance(dataset, torch.utils.data.IterableDataset)
    loader = DataLoader(dataset, batch_size=BATCH, shuffle=shuffle and map_style,
                        generator=generator if map_style else None)
    count = 0
    start = time.perf_counter()
    for batch in loader:
        count += batch_size_of(batch)
        if time.perf_counter() - start > budget_s:
            break
    seconds = time.perf_counter() - start
    if count == 0:
        raise RuntimeError(f"{dataset!r} delivered no samples")
    return count / seconds


def _release(dataset, where: Path) -> None:
    """Close what reading opened in this process (LMDB keeps one environment per file and process)."""
    if hasattr(dataset, "close"):
        dataset.close()
    if where.is_file():
        close_environment(where)


# ------------------------------------------------------------------- the measurement


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
    log: Callable[[str], None] | None = None,
) -> dict:
    """Write and read every layout ``runs`` times (rounds interleaved); return raw figures as plain data.

    ``samples`` default to the whole manifest; ``workdir`` to ``<data root>/packed/formats-bench``
    (emptied first, each round's files replaced by the next's). ``layouts`` picks some of
    :data:`LAYOUTS` by name. ``runs`` defaults to :data:`packlab.bench.ROUNDS`, the rounds
    :func:`packlab.bench.compare` needs before it can call a difference clear.
    ``cold_level`` defaults to the strongest level of :func:`packlab.storage.cold_levels`.
    See the module docstring for what each figure means.

    Each round writes every layout, then, per access (random, sequential): drops the
    caches once for all layouts, reads each cold, then each warm; then reads each through
    the network model. The layouts take turns in an order rotated from round to round.
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
    results: dict = {
        "samples": len(samples),
        "jpeg_bytes": sum(s.bytes for s in samples),
        "runs": runs,
        "budget_s": budget_s,
        "model": asdict(model),
        "model_text": model.describe(),
        "cold_level": level,
        "cold": f"{level}: {storage.COLD_LEVELS[level]}" if level else None,
        "reader": "one process, no workers, batches of 64, bytes counted, not decoded",
        "load_average": [os.getloadavg()[0]],
        "layouts": {
            layout.name: {
                "write_s": [], "bytes": None, "allocated": None, "opener": layout.opener,
                # Share of the layout's pages in the page cache around its first cold read.
                "resident": {},
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

    def read(layout: Layout, where: Path, access: str, condition: str, seed: int) -> None:
        opener = model.open if condition == "network model" else None
        dataset = getattr(layout, access)(where, opener)
        rate = read_rate(dataset, access == "random", budget_s, seed=seed)
        _release(dataset, where)
        results["layouts"][layout.name]["rates"][access][condition].append(rate)

    for run in range(runs):
        order = chosen[run % len(chosen):] + chosen[: run % len(chosen)]  # each round starts elsewhere
        where = {layout.name: workdir / f"{layout.name}-{run}" for layout in order}
        files = {}
        for layout in order:
            entry = results["layouts"][layout.name]
            start = time.perf_counter()
            layout.write(where[layout.name], samples, root)
            entry["write_s"].append(time.perf_counter() - start)
            files[layout.name] = files_of(where[layout.name])
            entry["bytes"], entry["allocated"] = disk_usage(files[layout.name])
            _sync(files[layout.name])
        for access in ACCESSES:
            readable = [layout for layout in order if getattr(layout, access) is not None]
            if level is not None:
                # In the first round, each layout's first cold read (random, or sequential for tar) is watched.
                watched = [layout for layout in readable
                           if run == 0 and not results["layouts"][layout.name]["resident"]]
                for layout in watched:
                    results["layouts"][layout.name]["resident"]["before"] = storage.resident_fraction(files[layout.name])
                storage.make_cold([f for layout in readable for f in files[layout.name]], level)
                for layout in readable:
                    resident = results["layouts"][layout.name]["resident"]
                    if layout in watched:
                        resident["after dropping"] = storage.resident_fraction(files[layout.name])
                    read(layout, where[layout.name], access, "cold", run)
                    if layout in watched:
                        resident["after the cold read"] = storage.resident_fraction(files[layout.name])
            for layout in readable:
                read(layout, where[layout.name], access, "warm", run)
            for layout in readable:
                if layout.opener:
                    read(layout, where[layout.name], access, "network model", run)
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


def leaders(values: dict[str, Sequence[float]], highest: bool = True) -> tuple[list[str], list[str]]:
    """The layouts tied for best (not clearly different from the best median's) and the rest, best first."""
    key = (lambda name: -statistics.median(values[name])) if highest else (lambda name: statistics.median(values[name]))
    ranked = sorted(values, key=key)
    best = values[ranked[0]]
    tied = [name for name in ranked if compare(values[name], best) == "no clear difference"]
    return tied, [name for name in ranked if name not in tied]


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

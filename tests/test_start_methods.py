"""Every dataset of the course under every start method: fork, spawn and forkserver.

Workshop machines differ: Linux forks DataLoader workers, macOS and Windows spawn them,
and Python 3.14 on Linux uses forkserver. Every ``packlab.loaders`` class and every
dataset class of the solution notebooks must deliver, with 2 workers under each method,
every sample exactly once with its label and bit-exact pixels (:mod:`packlab.audit`).

The datasets that open their zip archive in ``__init__`` (chapter 3's NaiveZipDataset and
the solutions' ZipImageDataset and OpenInInitZipDataset, which exercises 2 and 3 write
for one process on purpose) must instead fail the way chapter 3 says: BadZipFile under
fork, a pickling TypeError under spawn and forkserver; without workers they are correct.

The loaders of chapter 8 take the same datasets in place of the ``DataLoader``: the
RecyclingLoader (worker processes) under each start method, the ThreadLoader (threads,
no start method) once.

Starting spawn workers costs seconds (each imports torch), so all map-style datasets share
one DataLoader per start method (a ConcatDataset, cut back into its parts by position)
and all iterable ones another (a ChainDataset over disjoint parts of the samples).
Everything reads the 60-image ``small_root`` fixture.
"""

from __future__ import annotations

import ast
import importlib
import multiprocessing
import sys
import zipfile
import zlib

import pytest
from torch.utils.data import ChainDataset, ConcatDataset, DataLoader

from packlab import audit, formats, pack, paths
from packlab.course import exercises, grade, grading
from packlab.bench import run_until_error
from packlab.loaders import (
    JpegFolderDataset,
    NaiveZipDataset,
    PreadZipDataset,
    RawFolderDataset,
    RecyclingLoader,
    TarShardDataset,
    ThreadLoader,
    ZipDataset,
)

START_METHODS = ["fork", "spawn", "forkserver"]
WORKERS = 2
TIMEOUT = 120  # seconds per batch; spawn start-up on a busy 2-core machine included

# forkserver workers are forked from one server process; importing torch there once, not in
# every worker, makes them cheap to start (no effect if the server is already running).
multiprocessing.set_forkserver_preload(["torch", "packlab.loaders", "packlab.audit"])

#: The dataset classes of the solution notebooks: the names each defines, and which of them
#: are correct with workers ("workers") or one-process designs that must fail with them ("open in init").
#: A helper a class needs from another cell of its notebook is listed too (shards_for).
SOLUTION_CLASSES = {
    "01_jpeg_dataset": {"JpegFolderDataset": "workers"},
    "02_zip_packing": {"ZipImageDataset": "open in init"},
    "03_per_worker_zip": {"OpenInInitZipDataset": "open in init", "PerWorkerZipDataset": "workers"},
    "04a_tarfile_reader": {"TarfileShardDataset": "workers"},
    "04_tar_shards": {"TarShardDataset": "workers"},
    "05_shard_split": {"RankShardDataset": "workers", "shards_for": "helper"},
    "08_lmdb": {"LmdbDataset": "workers"},
    "11_resumable_reader": {"ResumableShardReader": "workers"},
    "12_interleaved_shuffle": {"InterleavedShardReader": "workers"},
    # Wraps another dataset and yields crops, not the stored bytes: its own check's worker_counts part
    # runs it with no workers, 3 fork and 2 spawn workers and compares the crops (grading/fast_path.py).
    "10_fast_path": {"TrainingCrops": "its own check"},
}


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def reference(small_root, small_manifest):
    return audit.reference_digests([s.key for s in small_manifest], small_root)


@pytest.fixture(scope="module")
def packed(small_root, small_manifest, tmp_path_factory):
    """The small dataset as two zips, a raw-pixel folder, and tar shards in six disjoint parts of 10."""
    folder = tmp_path_factory.mktemp("packed")
    quarters = [small_manifest[i : i + 10] for i in range(0, 60, 10)]
    return {
        "jpeg_zip": pack.write_zip(folder / "jpeg.zip", members="jpeg", root=small_root, progress=False),
        "raw_zip": pack.write_zip(folder / "raw.zip", members="raw", root=small_root, progress=False),
        "raw_folder": pack.write_raw_folder(folder / "raw", root=small_root, progress=False),
        "lmdb": formats.write_lmdb(folder / "images.lmdb", root=small_root, progress_bar=False),
        "quarters": quarters,
        # 3 shards (4, 4 and 2 samples) per part: the 2 workers read 2 and 1 shards of every dataset (an uneven split).
        "shards": [
            [str(p) for p in pack.write_tar_shards(folder / f"quarter-{i}", samples=part, root=small_root, maxcount=4,
                                                   progress=False)]
            for i, part in enumerate(quarters)
        ],
    }


def solution_module(path, names, folder):
    """The code cells of a solution notebook that define ``names``, as an importable module.

    Spawn and forkserver workers import a dataset's class by module and name, and a class
    defined in a notebook lives in ``__main__``, which they cannot import. As
    :func:`packlab.course.grading.importable_copy` does for one class, this keeps the imports,
    definitions and literal constants of the defining cells, here of several cells at once
    (RankShardDataset calls shards_for, defined in another cell), and writes them to a
    module in ``folder``, which is on ``sys.path`` (workers receive the parent's).
    """
    notebook = grade.read_notebook(path)
    source = "\n\n".join(grade.definition_cells(notebook, names))
    module_name = f"_solution_{path.stem}"
    (folder / f"{module_name}.py").write_text(grading._definitions_only(source, str(path)))
    return module_name


@pytest.fixture(scope="module")
def solutions(tmp_path_factory):
    """``{class name: class}`` for every class in SOLUTION_CLASSES, imported from generated modules."""
    folder = tmp_path_factory.mktemp("solution-modules")
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    classes, modules = {}, []
    for path in exercises.solution_notebooks():
        names = {n: role for n, role in SOLUTION_CLASSES.get(path.stem, {}).items() if role != "its own check"}
        if not names:  # a solution that defines no dataset (test_every_dataset_class... checks that it does not)
            continue
        module = importlib.import_module(solution_module(path, names, folder))
        modules.append(module.__name__)
        classes.update({f"{path.stem} {name}": getattr(module, name) for name in names})
    yield classes
    sys.path.remove(str(folder))
    for name in modules:
        sys.modules.pop(name, None)


def test_every_dataset_class_of_the_solutions_is_covered():
    """A new dataset class in a solution notebook must be added to SOLUTION_CLASSES (and so be tested)."""
    found = {}
    for path in exercises.solution_notebooks():
        notebook = grade.read_notebook(path)
        for cell in notebook.cells:
            if cell.cell_type != "code":
                continue
            for node in ast.parse(cell.source).body:
                bases = {getattr(b, "id", getattr(b, "attr", None)) for b in getattr(node, "bases", [])}
                if isinstance(node, ast.ClassDef) and bases & {"Dataset", "IterableDataset"}:
                    found.setdefault(path.stem, set()).add(node.name)
    listed = {stem: {n for n, role in names.items() if role != "helper"} for stem, names in SOLUTION_CLASSES.items()}
    assert found == {stem: names for stem, names in listed.items() if names}


# ------------------------------------------------------- correct datasets: exactly once, bit-exact


@pytest.fixture(scope="module")
def map_style(small_root, packed, solutions):
    """``{name: dataset}``: every map-style dataset that must work with workers, over all 60 samples."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(paths.DATA_ENV_VAR, str(small_root))  # the solution of exercise 1 reads the default root
        solution_jpeg = solutions["01_jpeg_dataset JpegFolderDataset"](return_key=True)
    return {
        "JpegFolderDataset": JpegFolderDataset(small_root, return_key=True),
        "RawFolderDataset": RawFolderDataset(packed["raw_folder"], root=small_root, return_key=True),
        "ZipDataset, jpeg members": ZipDataset(packed["jpeg_zip"], return_key=True),
        "ZipDataset, raw members": ZipDataset(packed["raw_zip"], return_key=True),
        "PreadZipDataset, jpeg members": PreadZipDataset(packed["jpeg_zip"], return_key=True),
        "solution 01 JpegFolderDataset": solution_jpeg,
        "solution 03 PerWorkerZipDataset": solutions["03_per_worker_zip PerWorkerZipDataset"](
            packed["jpeg_zip"], return_key=True),
        "solution 08 LmdbDataset": solutions["08_lmdb LmdbDataset"](packed["lmdb"], return_key=True),
    }


@pytest.fixture(scope="module")
def iterable(packed, solutions):
    """``{name: (dataset, the samples it must deliver)}``: each iterable dataset reads its own quarter."""
    first, second, third, fourth, fifth, sixth = packed["shards"]
    return {
        "TarShardDataset": (TarShardDataset(first, return_key=True), packed["quarters"][0]),
        "solution 04 TarShardDataset": (
            solutions["04_tar_shards TarShardDataset"](second, return_key=True), packed["quarters"][1]),
        "solution 05 RankShardDataset": (
            solutions["05_shard_split RankShardDataset"](third, 0, 1, return_key=True), packed["quarters"][2]),
        "solution 11 ResumableShardReader": (
            solutions["11_resumable_reader ResumableShardReader"](fourth, return_key=True), packed["quarters"][3]),
        "solution 12 InterleavedShardReader": (
            solutions["12_interleaved_shuffle InterleavedShardReader"](fifth, open_shards=2, return_key=True),
            packed["quarters"][4]),
        "solution 04a TarfileShardDataset": (
            solutions["04a_tarfile_reader TarfileShardDataset"](sixth, return_key=True), packed["quarters"][5]),
    }


def epoch(dataset, method):
    loader = DataLoader(dataset, batch_size=8, num_workers=WORKERS, multiprocessing_context=method, timeout=TIMEOUT)
    return audit.records_from_batches(loader)


@pytest.mark.parametrize("method", START_METHODS)
def test_map_style_datasets_deliver_every_sample_once_bit_exact(method, map_style, small_manifest, reference):
    records = epoch(ConcatDataset(list(map_style.values())), method)
    n = len(small_manifest)
    assert len(records) == len(map_style) * n, f"{len(records)} samples for {len(map_style)} datasets of {n}"
    failed = []
    for i, name in enumerate(map_style):  # the ConcatDataset is read in order: part i is records[i*n:(i+1)*n]
        report = audit.audit_epoch(records[i * n : (i + 1) * n], small_manifest, reference)
        if not report.ok:
            failed.append(f"{name} under {method}: {report.summary()}")
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("method", START_METHODS)
def test_iterable_datasets_deliver_every_sample_once_bit_exact(method, iterable, small_manifest, reference):
    records = epoch(ChainDataset([dataset for dataset, _ in iterable.values()]), method)
    assert len(records) == len(small_manifest), f"{len(records)} samples, {len(small_manifest)} expected"
    failed = []
    for name, (_, samples) in iterable.items():  # the quarters are disjoint: sort the records by key
        keys = {s.key for s in samples}
        report = audit.audit_epoch([r for r in records if r[0] in keys], samples, reference)
        if not report.ok:
            failed.append(f"{name} under {method}: {report.summary()}")
    assert not failed, "\n".join(failed)


def check_parts(records, map_style, iterable, small_manifest, reference, how: str) -> list[str]:
    """Audit records of the map-style ConcatDataset followed by the iterable ChainDataset; the failures."""
    n = len(small_manifest)
    failed = []
    for i, name in enumerate(map_style):
        report = audit.audit_epoch(records[i * n : (i + 1) * n], small_manifest, reference)
        if not report.ok:
            failed.append(f"{name} {how}: {report.summary()}")
    for name, (_, samples) in iterable.items():
        keys = {s.key for s in samples}
        report = audit.audit_epoch([r for r in records[len(map_style) * n :] if r[0] in keys], samples, reference)
        if not report.ok:
            failed.append(f"{name} {how}: {report.summary()}")
    return failed


@pytest.mark.parametrize("method", START_METHODS)
def test_the_recycling_loader_delivers_every_sample_once_bit_exact(method, map_style, iterable, small_manifest,
                                                                    reference):
    """RecyclingLoader's workers are processes: the datasets are pickled into them (spawn, forkserver), and the
    iterable ones split their shards through the worker info those workers set, as under a DataLoader."""
    records = []
    for dataset in (ConcatDataset(list(map_style.values())), ChainDataset([d for d, _ in iterable.values()])):
        loader = RecyclingLoader(dataset, batch_size=8, workers=WORKERS, multiprocessing_context=method,
                                 timeout=TIMEOUT)
        records += audit.records_from_batches(loader)
    assert len(records) == (len(map_style) + 1) * len(small_manifest)
    failed = check_parts(records, map_style, iterable, small_manifest, reference, f"through RecyclingLoader, {method}")
    assert not failed, "\n".join(failed)


def test_the_thread_loader_delivers_every_sample_once_bit_exact(map_style, iterable, small_manifest, reference):
    """Threads share one process: no start method, no pickling. Iterable datasets are read through their
    iter_share method (a ChainDataset has none), so each tar dataset gets a loader of its own."""
    records = audit.records_from_batches(ThreadLoader(ConcatDataset(list(map_style.values())), batch_size=8,
                                                      threads=WORKERS, timeout=TIMEOUT))
    for dataset, _ in iterable.values():
        if hasattr(dataset, "iter_share"):
            records += audit.records_from_batches(ThreadLoader(dataset, batch_size=8, threads=WORKERS, timeout=TIMEOUT))
    with_share = {name: part for name, part in iterable.items() if hasattr(part[0], "iter_share")}
    assert with_share, "no iterable dataset with iter_share: TarShardDataset should have one"
    failed = check_parts(records, map_style, with_share, small_manifest, reference, "through ThreadLoader")
    assert not failed, "\n".join(failed)


# ------------------------------------------------ the anti-pattern: a zip opened in __init__


@pytest.fixture(scope="module")
def open_in_init(packed, solutions):
    """``{name: factory}`` for the datasets that open their archive in ``__init__``, and how to close each."""
    path = packed["jpeg_zip"]
    return {
        "NaiveZipDataset": lambda: NaiveZipDataset(path, return_key=True),
        "solution 02 ZipImageDataset": lambda: solutions["02_zip_packing ZipImageDataset"](path, return_key=True),
        "solution 03 OpenInInitZipDataset": lambda: solutions["03_per_worker_zip OpenInInitZipDataset"](
            path, return_key=True),
    }


OPEN_IN_INIT = ["NaiveZipDataset", "solution 02 ZipImageDataset", "solution 03 OpenInInitZipDataset"]


def close_archive(dataset) -> None:
    dataset.archive.close()


@pytest.mark.parametrize("name", OPEN_IN_INIT)
def test_open_in_init_is_correct_without_workers(name, open_in_init, small_manifest, reference):
    dataset = open_in_init[name]()
    try:
        records = audit.records_from_batches(DataLoader(dataset, batch_size=16))
    finally:
        close_archive(dataset)
    report = audit.audit_epoch(records, small_manifest, reference)
    assert report.ok, report.summary()


@pytest.mark.parametrize("name", OPEN_IN_INIT)
def test_open_in_init_fails_under_fork_with_bad_zip_file(name, open_in_init):
    """Forked workers share the parent's file offset; their reads interleave and fail.

    Whether two reads collide is a matter of timing, so this allows three epochs. In
    practice the first batch fails: each worker's buffered reader also trusts a file
    position that the other worker has since moved.
    """
    dataset = open_in_init[name]()
    error = None
    try:
        for _ in range(3):
            loader = DataLoader(dataset, batch_size=4, num_workers=WORKERS, multiprocessing_context="fork",
                                timeout=TIMEOUT)
            error = run_until_error(loader)[1]
            if error is not None:
                break
    finally:
        close_archive(dataset)
    assert isinstance(error, (zipfile.BadZipFile, zlib.error)), f"expected BadZipFile or zlib.error, got {error!r}"


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
@pytest.mark.parametrize("name", OPEN_IN_INIT)
def test_open_in_init_cannot_be_pickled_for_spawn_or_forkserver(name, method, open_in_init):
    dataset = open_in_init[name]()
    loader = DataLoader(dataset, batch_size=16, num_workers=WORKERS, multiprocessing_context=method, timeout=TIMEOUT)
    try:
        with pytest.raises(TypeError, match="cannot pickle"):
            iter(loader)
    finally:
        close_archive(dataset)


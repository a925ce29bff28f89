"""``make bench``: every loader of the course and its peers, the ceilings, and the extra sections.

`python -m packlab.course.benchmark` (what `make bench` runs) measures, in one process
tree and one run: the decode ceiling of one core and of all cores at once; every loader
of the course and its modern peers (webdataset, torchdata.nodes, SPDL, MosaicML Streaming, LitData) on the same
shards with the same transform and batch size, three epochs each, interleaved, every
epoch audited (every key exactly once, with its label); the worker-count sweep of the
course's loaders; the head-to-head comparisons behind its headline ratios, each in
counterbalanced rounds from steady state with :func:`packlab.bench.compare`'s verdict
(:mod:`packlab.course.benchmark.training`: the training transform, the stored copies, each
loader against its own ceiling, DALI); the small-file penalty; and any extra section
registered in :data:`SECTIONS`. It prints a table and writes ``_build/bench/bench.json``
and ``_build/bench/bench.png``. ``--quick`` runs the same on a few hundred images, to
check that everything runs.
"""

from __future__ import annotations

import errno
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence

import torch

from packlab.bench import Spread, torch_threads
from packlab.ceiling import (
    batch_memory_seconds,
    ceiling_figure,
    loader_vs_ceiling,
    measure_ceiling,
    measure_parallel_ceiling,
    timed_epoch,
    where_the_time_goes,
)
from packlab.course.benchmark.training import (
    GOALS_OF_THE_SAME_WORK,
    MAX_SIDES,
    ROUNDS,
    TRAINING_FORM_ARGS,
    KeyRecorder,
    ceiling_goal_verdict,
    crops_section,
    goal_verdict,
    head_to_head,
    ratio_text,
    storage_rows,
    verdict_words,
)
from packlab.loaders.lineup import OURS, PEER, STORED_LOADERS, STORED_OURS, STORED_PEER, SWEPT, loader_factories
from packlab.small_files import shard_size_for, small_file_penalty


#: What the benchmark aims for; where a goal is missed, bench.json records what limits it. A goal counts as
#: reached only where the head-to-head runs clear it (training.goal_verdict), not on a median alone.
GOALS = {"best_vs_ceiling": 0.90, "ours_vs_best_peer": 1.15, **GOALS_OF_THE_SAME_WORK}


def _small_files_section(root=None, quick: bool = False, log: Callable[[str], None] = print) -> dict:
    log("small-file penalty: reading without decoding, cold and under the network-filesystem model")
    out = small_file_penalty(root, folder_files=200 if quick else 2000)
    out["summary"] = ("files/s under the model: " + ", ".join(f"{k} {v:.0f}" for k, v in out["modelled_files_per_s"].items())
                      + f"; tar/folder {out['tar_vs_folder_modelled']:.1f}x")
    return out


#: Sections run after the loaders: name -> ``section(root=..., quick=..., log=...)`` returning a
#: JSON-able dict, stored in bench.json under its name (a ``summary`` string, if any, is printed).
#: A module adds its own with ``SECTIONS["name"] = function``; ``--skip name`` leaves one out.
SECTIONS: dict[str, Callable[..., dict]] = {"small_files": _small_files_section}


def _formats_section(root=None, quick: bool = False, log: Callable[[str], None] = print) -> dict:
    """Chapter 9: every packed format side by side (:mod:`packlab.formats.bench`)."""
    from packlab.formats.bench import format_formats, measure_formats

    log("other formats: size, write time and read rates of every layout, 3 rounds")
    # Three rounds on all 10,000 samples: the table's medians and ranges, no verdicts (chapter 9 draws those, on a slice).
    out = measure_formats(root=root, runs=3, log=lambda message: log(f"  {message}"))
    out["summary"] = format_formats(out)
    return out


SECTIONS["formats"] = _formats_section


def _gpu_section(root=None, quick: bool = False, log: Callable[[str], None] = print) -> dict:
    """Chapter 11 on a GPU: nvJPEG decode and the CUDA prefetcher (:mod:`packlab.gpu`); skipped, saying why, without one."""
    from packlab import data, gpu, pack, paths
    from packlab.decode import stored_decode
    from packlab.loaders import TarShardDataset
    from packlab.loaders.batching import collate_uint8_batch
    from torch.utils.data import DataLoader

    status = gpu.cuda_status()
    if not torch.cuda.is_available():
        log(f"gpu: skipped ({status})")
        return {"cuda": False, "status": status, "summary": f"skipped: {status}"}
    log(f"gpu: {status}")
    manifest = data.load_manifest(root)[: 512 if quick else 2000]
    encoded = [data.image_path(s.key, root).read_bytes() for s in manifest]
    out: dict = {"cuda": True, "status": status, "images": len(encoded)}
    out["nvjpeg_originals_images_per_s"] = gpu.gpu_decode_rate(encoded)
    # The shards the loaders read (whatever their size); written only if the loaders did not run.
    shards = sorted((paths.packed_dir(root) / "shards").glob("shard-*.tar")) or pack.ensure_tar_shards(root=root,
                                                                                                      progress=False)
    stored = _stored_shards(root, shards)
    loader = DataLoader(TarShardDataset([str(p) for p in stored], transform=stored_decode), batch_size=64,
                        num_workers=data.available_cores(), pin_memory=True, collate_fn=collate_uint8_batch,
                        multiprocessing_context="fork")
    from packlab.loaders.batching import IMAGENET_MEAN, IMAGENET_STD

    out["prefetched_stored_images_per_s"] = [gpu.prefetched_rate(loader, mean=IMAGENET_MEAN, std=IMAGENET_STD)
                                             for _ in range(3)]
    out["summary"] = (f"{status}; nvJPEG decode + resize of the originals "
                      f"{statistics.median(out['nvjpeg_originals_images_per_s']):.0f} images/s; stored 256 px JPEGs "
                      f"through the CUDA prefetcher {statistics.median(out['prefetched_stored_images_per_s']):.0f} images/s")
    return out


SECTIONS["gpu"] = _gpu_section

#: How the fastest pipeline stores the dataset (chapter 11): 256 x 256, JPEG quality 90, 4:2:0.
STORED_FORM_ARGS = {"size": 256, "quality": 90, "subsampling": "4:2:0"}


def _stored_shards(root, shards, form_args: dict | None = None) -> list:
    """The benchmark's shards re-encoded (:mod:`packlab.reencode`; default :data:`STORED_FORM_ARGS`), written once."""
    from packlab import paths, reencode

    form = reencode.StoredFormat(**(form_args or STORED_FORM_ARGS))
    folder = reencode.stored_folder(shards, form, paths.packed_dir(root) / "stored")
    stored, _ = reencode.write_stored_shards(shards, folder, form)
    return stored


def _stored_facts(root, shards, stored, manifest, form_args: dict, images: int = 500) -> dict:
    """Bytes of a stored copy against the originals', and its pixel error against the standard transform (squash)."""
    from packlab import data, reencode
    from packlab.decode import stored_decode
    from packlab.transforms import decode_and_resize

    original_bytes = sum(s.bytes for s in manifest)
    stored_bytes = reencode.total_bytes(stored)
    out = {"format": reencode.StoredFormat(**form_args).name, "original_jpeg_bytes": original_bytes,
           "stored_bytes": stored_bytes, "storage_ratio": stored_bytes / original_bytes,
           "tar_shard_bytes": reencode.total_bytes(shards)}
    if form_args.get("fit", "square") == "square":
        reference = {s.key: decode_and_resize(data.image_path(s.key, root).read_bytes()) for s in manifest[:images]}
        out["pixel_error"] = reencode.stored_pixel_error(stored, reference, stored_decode)
    return out


def _verdict_headline(factories: dict, ours: str, peer: str | None, ceiling_name: str, ceiling, manifest,
                      cores: int, log) -> dict:
    """Head to head, from steady state, ``ROUNDS`` counterbalanced rounds: ``ours``, ``peer`` and a ceiling, audited."""
    loaders = {ours: factories[ours][1](cores)}
    if peer is not None:
        loaders[peer] = factories[peer][1](cores)
    measured = head_to_head(loaders, {ceiling_name: ceiling}, cores, manifest, rounds=ROUNDS, log=log)
    spreads = measured["spreads"]
    own = loader_vs_ceiling(spreads[ours], spreads[ceiling_name])
    out = {"rows": measured["rows"], "rounds": ROUNDS, "ours": ours, "peer": peer, "ceiling": ceiling_name,
           "ours_vs_own_ceiling": own.result, "ours_vs_own_ceiling_verdict": own.words(ours)}
    if peer is not None:
        out["ours_vs_peer"] = spreads[ours].median / spreads[peer].median
        out["ours_vs_peer_verdict"] = verdict_words(spreads[ours], spreads[peer], ours, peer)
    out["spreads"] = spreads
    return out


def _streaming_audit_section(root=None, quick: bool = False, log: Callable[[str], None] = print) -> dict:
    """Chapter 12: MosaicML Streaming (MDS) and LitData write the whole dataset; an epoch of each, audited.

    Every key exactly once, with its label, and the pixels of every sample against the
    standard transform of its original JPEG (:mod:`packlab.audit`), read with ``cores`` workers.
    """
    from packlab import audit, data
    from packlab.loaders import streaming_peers
    from packlab.transforms import standard_transform

    cores = data.available_cores()
    manifest = data.load_manifest(root)
    log(f"streaming libraries: MDS and LitData copies of {len(manifest):,} images, one audited epoch each")
    reference = audit.reference_digests([s.key for s in manifest], root)
    out: dict = {"images": len(manifest), "workers": cores}
    for name, ensure, reader in (("MosaicML Streaming (MDS)", streaming_peers.ensure_mds, streaming_peers.mds_loader),
                                 ("LitData", streaming_peers.ensure_litdata, streaming_peers.litdata_loader)):
        start = time.perf_counter()
        folder = ensure(root)
        written = time.perf_counter() - start
        loader = reader(folder, workers=cores, batch_size=64, transform=standard_transform, with_key=True)
        records = audit.records_from_batches(streaming_peers.key_batches(loader))
        report = audit.audit_epoch(records, manifest, reference)
        size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
        out[name] = {"ok": report.ok, "summary": report.summary(), "pixels_checked": report.pixels_checked,
                     "bytes": size, "write_or_check_seconds": written}
        log(f"  {name}: {report.summary()} ({size / 1e9:.2f} GB)")
    out["summary"] = "; ".join(f"{n}: {'audit OK' if out[n]['ok'] else 'AUDIT FAILED'}"
                               for n in ("MosaicML Streaming (MDS)", "LitData"))
    return out


SECTIONS["streaming_audit"] = _streaming_audit_section


def _summarise(name: str, group: str, workers: int, epochs: list[dict], parallel_ceiling: float, cores: int) -> dict:
    """One loader's epochs: median, range, the audit of each epoch, and where the time went in its median epoch."""
    rates = [e["images_per_s"] for e in epochs]
    failures = [e["audit"] for e in epochs if e["audit"] != "ok"]
    median_epoch = sorted(epochs, key=lambda e: e["images_per_s"])[(len(epochs) - 1) // 2]
    median = statistics.median(rates)
    return {
        "loader": name, "group": group, "workers": workers,
        "median_images_per_s": median, "min_images_per_s": min(rates), "max_images_per_s": max(rates),
        # A ratio compares the same work: the stored rows decode 256 px copies, not the originals the
        # decode ceiling decodes, so theirs is measured against their own ceiling in the stored head to head.
        "vs_parallel_ceiling": None if group.startswith("stored") else median / parallel_ceiling,
        "audit": (f"ok: every key exactly once with its label, in each of {len(epochs)} epochs" if not failures
                  else "FAILED: " + failures[0]),
        "epochs": epochs,
        "where_the_time_goes": where_the_time_goes(median_epoch, parallel_ceiling, cores),
    }


def results_dir(out_dir=None):
    """Where the benchmark writes ``bench.json``, ``bench.png`` and the ``--quick`` data: ``out_dir``, else ``_build/bench``."""
    from pathlib import Path

    from packlab import paths

    return Path(out_dir) if out_dir is not None else paths.build_dir() / "bench"


def quick_root(images: int = 600, out_dir=None, source=None):
    """A data root holding the first ``images`` samples of the dataset at ``source`` (for ``--quick``).

    Files are hard-linked where the filesystem allows (copied otherwise); the zip and
    shards the benchmark needs are written into it on first use, as for the full dataset.
    """
    import shutil

    from packlab import data, paths

    folder = results_dir(out_dir) / f"quick-data-{images}"
    samples = data.load_manifest(source)[:images]
    if paths.manifest_path(folder).exists() and data.load_manifest(folder) == samples:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    paths.images_dir(folder).mkdir(parents=True)
    for sample in samples:
        original, copy = data.image_path(sample.key, source), data.image_path(sample.key, folder)
        try:
            os.link(original, copy)
        except OSError:
            shutil.copyfile(original, copy)
    data._write_csv(paths.labels_path(folder), ("key", "label"), [(s.key, s.label) for s in samples])
    data._write_csv(paths.manifest_path(folder), data.MANIFEST_FIELDS, samples)  # last: marks the root complete
    return folder


def run_benchmark(
    root=None,
    worker_counts: Sequence[int] | None = None,
    out_dir=None,
    log: Callable[[str], None] = print,
    epochs: int = 3,
    quick: bool = False,
    ceiling_images: int | None = None,
    loaders: Sequence[str] | None = None,
    sections: Sequence[str] | None = None,
) -> dict:
    """Run the benchmark; write ``bench.json`` and ``bench.png`` to ``out_dir``; return the results.

    Every loader (``loaders``: a subset of names, default all) reads the whole dataset at
    ``workers = cores`` for ``epochs`` epochs, interleaved: one epoch of each loader in
    turn, the two decode ceilings before each turn, the starting loader rotating. Each
    reports its median and range. Then the course's original loaders (:data:`SWEPT`) run
    one epoch at each other count in ``worker_counts`` (default ``{0, 1, 2 x cores}``;
    none with ``quick``), then every section of :data:`SECTIONS` (``sections``: a
    subset). Keys of ``bench.json``:

    * ``ceiling_images_per_s_per_core``: the standard loaders' per-image work (decode, resize,
      conversion into a batch buffer already mapped) in memory, one process (median); ``parallel_ceiling``:
      ``cores`` processes doing that at once (:func:`measure_parallel_ceiling`), its best run
      (:func:`packlab.ceiling.ceiling_figure`), against which every row's ``vs_parallel_ceiling`` is taken;
      ``ceiling_scaling``: the two ceilings' medians, the parallel over ``cores`` times one core's;
    * ``loaders``: per loader the epochs, median, min and max images/s, its audit (every epoch:
      every key exactly once, with its label) and :func:`where_the_time_goes` in its median epoch;
    * ``headlines``: the head-to-head runs behind the headline ratios, ``ROUNDS`` counterbalanced
      rounds each from steady state, every epoch audited: our best loader, the best peer and the
      standard ceiling (``peers``); the best stored-JPEG loader of ours, the best stored peer and
      their own ceiling (``stored``);
    * ``training_crops``: the training transform (:mod:`packlab.course.benchmark.training`):
      the standard pipeline, ours, DALI's CPU pipeline, and each one's own ceiling;
    * ``storage``: bytes, decode cost and pixel error (the same crops) of each stored form;
    * ``best_vs_ceiling``, ``ours_vs_best_peer`` and ``goals``: each goal of :data:`GOALS` with the
      verdict of its head-to-head runs (:func:`goal_verdict`: reached only where the runs clear
      it); a goal not reached carries ``limit``, what held the loader back;
    * ``batch_memory``: filling a batch in fresh against reused memory (per image);
    * ``ratios``: ratios of the same work, each with its verdict in ``ratio_verdicts``:
      ``training_pipeline_speedup``, ``stored_loader_vs_stored_ceiling`` and every loader against
      its own ceiling, ``ours_vs_dali_cpu``, the decode-cost ratio of each stored form, and the
      older ratios between loaders of the full table (medians of three epochs, no verdict);
    * ``gpu``: nvJPEG and the CUDA prefetcher when there is a GPU (otherwise why not).
    """
    import json
    import platform

    from packlab import audit, data, pack

    cores = data.available_cores()
    out_dir = results_dir(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = data.load_manifest(root)
    sweep_counts = sorted(set(worker_counts if worker_counts is not None else ([] if quick else [0, 1, 2 * cores]))
                          - {cores})
    started = time.perf_counter()
    results: dict = {
        "machine": {"cores": cores, "python": platform.python_version(), "torch": torch.__version__,
                    "load_average_before": _load_average()},
        "images": len(manifest),
        # --quick reads a few hundred images: batches of 16 keep several batches per worker in an epoch.
        "settings": {"epochs": epochs, "workers": cores, "batch_size": 16 if quick else 64, "quick": quick,
                     "ceiling_images": len(manifest[:ceiling_images])},
        "goals_set": GOALS,
    }

    # The ceilings decode the loaders' whole epoch (ceiling_images=None): a shorter run is noisier than the loaders'
    # epochs, and a ceiling measured low by chance is one a loader passes.
    encoded = [data.image_path(s.key, root).read_bytes() for s in manifest[:ceiling_images]]
    shards = [str(p) for p in pack.ensure_tar_shards(maxcount=shard_size_for(len(manifest), max([cores, *sweep_counts])),
                                                       root=root, progress=False)]
    zip_path = pack.ensure_zip(root=root, progress=False)
    stored = None
    if loaders is None or set(loaders) & set(STORED_LOADERS) or training_rows_wanted(loaders):
        log("re-encoding the shards at 256 x 256 for the stored-JPEG loaders (once; reused afterwards)")
        stored = [str(p) for p in _stored_shards(root, shards)]
    batch_size = results["settings"]["batch_size"]
    factories = loader_factories(root, shards, zip_path, batch_size=batch_size, stored_shards=stored, with_keys=True)
    if loaders is not None:
        wanted = [name for name in loaders if not name.startswith("crops")]  # "crops": the training-crop section
        unknown = set(wanted) - set(factories)
        if unknown:
            raise ValueError(f"unknown loaders {sorted(unknown)}; known: {list(factories)} and 'crops'")
        factories = {name: factories[name] for name in wanted}
    log(f"{len(manifest):,} images, {len(shards)} shards, {cores} cores; {len(factories)} loaders x {epochs} epochs, "
        "interleaved, each turn after the two decode ceilings; every epoch audited")

    # 2 x cores workers is one of the measured settings; torch's warning about it says nothing new here.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    single, parallel = [], []
    epochs_of: dict[str, list[dict]] = {name: [] for name in factories}
    with torch_threads(1):  # the main process collects batches (or runs the threads): no intra-op threads
        made = {name: make(cores) for name, (_, make) in factories.items()}
        names = list(made)
        for turn in range(epochs):
            single.append(measure_ceiling(encoded))
            parallel.append(measure_parallel_ceiling(encoded, cores))
            log(f"turn {turn + 1}/{epochs}: decode ceiling {single[-1]:.0f} images/s on one core, "
                f"{parallel[-1]:.0f} on {cores} at once")
            start = turn % len(names) if names else 0
            for name in names[start:] + names[:start]:
                recorder = KeyRecorder()
                epoch = timed_epoch(made[name], name, on_batch=recorder)
                report = audit.audit_epoch(recorder.records, manifest)
                epoch["audit"] = "ok" if report.ok else report.summary()
                epochs_of[name].append(epoch)
                log(f"  {name:28s} {epoch['images_per_s']:7.0f} images/s" + ("" if report.ok else "  AUDIT FAILED"))
        del made
        # A ceiling's figure is its best run (ceiling_figure); the scaling compares the two ceilings' medians.
        ceiling, parallel_ceiling = statistics.median(single), ceiling_figure(Spread.of(parallel))
        results.update(ceiling_images_per_s_per_core=ceiling, ceiling_runs=single,
                       parallel_ceiling=parallel_ceiling, parallel_ceiling_runs=parallel,
                       ceiling_scaling=statistics.median(parallel) / (ceiling * cores))
        rows = [_summarise(name, factories[name][0], cores, runs, parallel_ceiling, cores)
                for name, runs in epochs_of.items()]
        results["loaders"] = rows
        sweep = []
        for name in (n for n in SWEPT if n in factories):
            for workers in sweep_counts:
                epoch = timed_epoch(factories[name][1](workers), name)
                sweep.append({"loader": name, "workers": workers, **epoch})
                log(f"  sweep {name:22s} workers={workers}: {epoch['images_per_s']:7.0f} images/s")
        results["sweep"] = sweep
        results["headlines"] = _headlines(rows, factories, encoded, stored, manifest, cores, log)
        if stored is not None and (loaders is None or training_rows_wanted(loaders)):
            log("re-encoding the shards at a maximum side of 320 px, aspect kept, for the training crops (once)")
            train_stored = [str(p) for p in _stored_shards(root, shards, TRAINING_FORM_ARGS)]
            results["training_crops"] = crops_section(root, shards, train_stored, manifest, cores,
                                                      share=1.0 if quick else 0.5, batch_size=batch_size, log=log)
            results["training_crops"]["stored"] = _stored_facts(root, shards, train_stored, manifest,
                                                                TRAINING_FORM_ARGS)
            log("stored forms: bytes, decode cost of a 224 crop on one core, pixel error of the same crops")
            from packlab.reencode import StoredFormat

            forms = [StoredFormat(**STORED_FORM_ARGS)] + [StoredFormat(side, 90, "4:2:0", "max side")
                                                         for side in MAX_SIDES]
            results["storage"] = storage_rows(root, shards, forms, manifest[: min(len(manifest), 2000)][::30])
    results["batch_memory"] = batch_memory_seconds()
    results.update(_goals(results, parallel_ceiling))
    results["ratios"], results["ratio_verdicts"] = _ratios(rows, results)
    if stored is not None:
        results["stored_squash"] = _stored_facts(root, shards, stored, manifest, STORED_FORM_ARGS)

    for name, section in SECTIONS.items():
        if sections is None or name in sections:
            results[name] = section(root=root, quick=quick, log=log)
    results["machine"]["load_average_after"] = _load_average()
    results["wall_seconds"] = time.perf_counter() - started
    for head in results.get("headlines", {}).values():
        head.pop("spreads", None)  # Spread objects: their runs are in the rows already

    (out_dir / "bench.json").write_text(json.dumps(results, indent=2, default=str))
    _plot_benchmark(results).savefig(out_dir / "bench.png", dpi=120)
    log("")
    log(format_benchmark(results))
    log(f"\nwrote {out_dir / 'bench.json'} and {out_dir / 'bench.png'} ({results['wall_seconds']:.0f} s)")
    return results


def training_rows_wanted(loaders: Sequence[str]) -> bool:
    """Whether a ``--loaders`` selection asks for the training-crop section (any name starting ``crops``)."""
    return any(name.startswith("crops") for name in loaders)


def _headlines(rows: list[dict], factories: dict, encoded, stored, manifest, cores: int, log) -> dict:
    """The head-to-head runs behind ``ours_vs_best_peer``, ``best_vs_ceiling`` and the stored loaders' ratios."""
    from packlab.ceiling import standard_work

    def best(group):
        members = [r for r in rows if r["group"] == group]
        return max(members, key=lambda r: r["median_images_per_s"])["loader"] if members else None

    out: dict = {}
    ours, peer = best(OURS), best(PEER)
    if ours is not None:
        log(f"head to head, {ROUNDS} counterbalanced rounds from steady state: {ours}, {peer}, the standard ceiling")
        transform, write, shape, dtype = standard_work()
        ceiling = lambda: measure_parallel_ceiling(encoded, cores, transform, write, shape, dtype)  # noqa: E731
        out["peers"] = _verdict_headline(factories, ours, peer, "ceiling: standard work", ceiling, manifest, cores, log)
    stored_ours, stored_peer = best(STORED_OURS), best(STORED_PEER)
    if stored is not None and stored_ours is not None:
        from packlab.ceiling import shard_items
        from packlab.decode import stored_decode_hwc
        from packlab.transforms import IMAGE_SIZE, to_tensor

        items = [blob for blob, _ in shard_items(stored, len(encoded))]
        log(f"head to head: {stored_ours}, {stored_peer}, the ceiling of their own work (stored 256 px JPEGs)")

        def write(pixels, out):
            to_tensor(pixels, out=out)

        ceiling = lambda: measure_parallel_ceiling(items, cores, stored_decode_hwc, write,  # noqa: E731
                                                   (64, 3, IMAGE_SIZE, IMAGE_SIZE), torch.float32)
        out["stored"] = _verdict_headline(factories, stored_ours, stored_peer, "ceiling: stored 256 px JPEG work",
                                          ceiling, manifest, cores, log)
    return out


def _goals(results: dict, parallel_ceiling: float) -> dict:
    """``best_vs_ceiling``, ``ours_vs_best_peer`` and ``goals``: each with its head-to-head verdict, and its limit when missed."""
    rows = {r["loader"]: r for r in results["loaders"]}
    out: dict = {"best_vs_ceiling": None, "ours_vs_best_peer": None, "goals": {}}
    peers = results.get("headlines", {}).get("peers")
    if peers is not None:
        spreads, ours, peer = peers["spreads"], peers["ours"], peers["peer"]
        goal = ceiling_goal_verdict(spreads[ours], spreads[peers["ceiling"]], GOALS["best_vs_ceiling"])
        out["best_vs_ceiling"] = goal["measured"]
        out["goals"]["best_vs_ceiling"] = {**goal, "ours": ours, "rounds": ROUNDS,
                                           "limit": None if goal["reached"] else rows[ours]["where_the_time_goes"]}
        if peer is not None:
            goal = goal_verdict(spreads[ours], spreads[peer], GOALS["ours_vs_best_peer"])
            out["ours_vs_best_peer"] = goal["measured"]
            out["goals"]["ours_vs_best_peer"] = {
                **goal, "ours": ours, "peer": peer, "rounds": ROUNDS,
                "limit": None if goal["reached"] else {"ours": rows[ours]["where_the_time_goes"],
                                                       "peer": rows[peer]["where_the_time_goes"]}}
    crops = results.get("training_crops")
    if crops is not None:
        for name in GOALS_OF_THE_SAME_WORK:
            goal = crops[f"goal_{name}"]
            out["goals"][name] = {**goal, "rounds": crops["rounds"], "limit": None}
    for goal in out["goals"].values():
        goal.pop("spreads", None)
    return out


def _ratios(rows: list[dict], results: dict) -> tuple[dict, dict]:
    """The ratios of the same work, with their verdicts, and the full table's ratios between loaders (no verdict)."""
    ratios, verdicts = {}, {}
    crops = results.get("training_crops")
    if crops is not None:
        for key, value in crops["ratios"].items():
            ratios[key] = value
            verdicts[key] = crops["verdicts"].get(key, "")
    for which in ("peers", "stored"):
        head = results.get("headlines", {}).get(which)
        if head is None:
            continue
        key = f"{head['ours']} vs own ceiling"
        ratios[key], verdicts[key] = head["ours_vs_own_ceiling"], head["ours_vs_own_ceiling_verdict"]
        if head.get("peer") is not None:
            key = "ours_vs_best_peer" if which == "peers" else "stored_ours_vs_best_stored_peer"
            ratios[key], verdicts[key] = head["ours_vs_peer"], head["ours_vs_peer_verdict"]
    storage = results.get("storage")
    if storage is not None:
        for name, row in storage["rows"].items():
            if not name.startswith("originals"):
                key = f"decode_cost_ratio: {name}"
                ratios[key] = row["decode_cost_ratio"]
                verdicts[key] = {1: "clearly cheaper than the originals' standard crop", -1: "clearly dearer",
                                 0: "no clear difference"}[row["compare_vs_standard"]]
    median = {r["loader"]: r["median_images_per_s"] for r in rows}
    for ratio, (a, b) in {"tar_vs_webdataset": ("tar shards (ours)", "webdataset"),
                          "batching_gain": ("tar shards (ours)", "tar, per-sample float"),
                          "recycling_vs_dataloader_tar": ("recycling, tar shards", "tar shards (ours)"),
                          "threads_vs_dataloader_tar": ("threads, tar shards", "tar shards (ours)"),
                          "uint8_crossing_vs_float_tar": ("tar shards, uint8 to the consumer", "tar shards (ours)")}.items():
        if a in median and b in median:
            ratios[ratio] = median[a] / median[b]
            verdicts[ratio] = "medians of the full table's three epochs: no verdict"
    return ratios, verdicts


def _plot_benchmark(results: dict):
    import matplotlib.pyplot as plt

    from packlab import plots

    cores, rows = results["machine"]["cores"], results["loaders"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 0.9 + 0.45 * max(8, len(rows))),
                                      gridspec_kw={"width_ratios": [3, 2]})
    if not rows:  # a run of the training-crop section alone (--loaders crops)
        fig.tight_layout()
        return fig
    ordered = sorted(rows, key=lambda r: -r["median_images_per_s"])
    plots.plot_rates_with_ranges(
        [{"name": r["loader"], "median": r["median_images_per_s"], "low": r["min_images_per_s"],
          "high": r["max_images_per_s"], "group": r["group"]} for r in ordered],
        lines={f"{cores} processes decoding at once (best run)": results["parallel_ceiling"],
               f"one core's decode x {cores}": results["ceiling_images_per_s_per_core"] * cores},
        ax=left, title=f"{results['images']:,} images, {cores} workers, median of {results['settings']['epochs']} epochs",
    )
    series: dict[str, dict[int, float]] = {}
    for row in results["sweep"]:
        series.setdefault(row["loader"], {})[row["workers"]] = row["images_per_s"]
    for row in rows:
        if row["loader"] in SWEPT:
            series.setdefault(row["loader"], {})[cores] = row["median_images_per_s"]
    plots.plot_throughput_vs_workers(series, ceiling=results["parallel_ceiling"], ax=right,
                                     title="The course's loaders against workers",
                                     ceiling_label=f"{cores} processes decoding at once")
    fig.tight_layout()
    return fig


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def format_benchmark(results: dict) -> str:
    """The benchmark's results as plain text: the loaders' table, the ceilings, the goals and what limits them."""
    cores = results["machine"]["cores"]
    rows = sorted(results["loaders"], key=lambda r: -r["median_images_per_s"])
    width = max([len("loader")] + [len(r["loader"]) for r in rows])
    lines = [f"images/s, full epochs of {results['images']:,} images at {cores} workers "
             f"(median of {results['settings']['epochs']}, start-up included)",
             f"{'loader'.ljust(width)}  {'group':8} {'median':>7} {'min-max':>11} {'/ceiling':>8}"]
    for r in rows:
        lines.append(f"{r['loader'].ljust(width)}  {r['group']:8} {r['median_images_per_s']:7.0f} "
                     f"{r['min_images_per_s']:5.0f}-{r['max_images_per_s']:<5.0f} "
                     + ("       -" if r["vs_parallel_ceiling"] is None else f"{r['vs_parallel_ceiling']:8.2f}"))
    if any(r["vs_parallel_ceiling"] is None for r in rows):
        lines.append("/ceiling: against the decode ceiling of the originals; the stored rows decode other work (256 px "
                     "copies), so their ratio is against their own ceiling, in the stored head to head below")
    if results["sweep"]:
        lines.append("sweep: " + ", ".join(f"{r['loader']} {r['workers']}w {r['images_per_s']:.0f}" for r in results["sweep"]))
    lines.append(f"decode ceiling: {results['ceiling_images_per_s_per_core']:.0f} images/s on one core; "
                 f"{results['parallel_ceiling']:.0f} with {cores} processes at once in the best run "
                 f"(medians: {results['ceiling_scaling']:.2f} of {cores} x one core)")
    memory = results["batch_memory"]
    lines.append("filling a batch, ms per image: fresh shared memory {:.2f}, fresh private {:.2f}, "
                 "reused private {:.2f}, reused shared {:.2f}".format(
                     *(memory[f"{k}_s_per_image"] * 1e3 for k in ("fresh_shared", "fresh_private", "reused",
                                                                  "reused_shared"))))
    lines.append("audits: " + ("every row's every epoch OK (every key exactly once, with its label)"
                                if all(r["audit"].startswith("ok") for r in rows)
                                else "FAILED: " + ", ".join(r["loader"] for r in rows if not r["audit"].startswith("ok"))))
    for which, head in results.get("headlines", {}).items():
        lines.append(f"head to head ({which}), steady state, {head['rounds']} counterbalanced rounds, every epoch audited:")
        for name, row in head["rows"].items():
            first = f", first batch {row['first_batch_seconds']:.2f} s" if "first_batch_seconds" in row else ""
            lines.append(f"  {name:40s} {row['median_images_per_s']:7.0f} ({row['min_images_per_s']:.0f}-"
                         f"{row['max_images_per_s']:.0f}){first}" + (f"; audit {row['audit']}" if "audit" in row else ""))
        lines.append(f"  {head['ours']} vs its own ceiling = {ratio_text(head['ours_vs_own_ceiling'])}: "
                     f"{head['ours_vs_own_ceiling_verdict']}")
        if head.get("peer") is not None:
            lines.append(f"  ours vs peer = {head['ours_vs_peer']:.2f}: {head['ours_vs_peer_verdict']}")
    if results.get("training_crops"):
        from packlab.course.benchmark.training import format_crops

        lines += format_crops(results["training_crops"])
        stored = results["training_crops"]["stored"]
        lines.append(f"  stored as {stored['format']}: {stored['storage_ratio']:.2f} x the original JPEG bytes")
    storage = results.get("storage")
    if storage:
        lines.append(f"stored forms, a 224 crop per image on one core ({storage['images']} images, "
                     f"{ROUNDS} interleaved rounds; PSNR of the same crops against the standard crop of the original):")
        for name, row in storage["rows"].items():
            psnr = "identical" if row["psnr_db"] == float("inf") else f"{row['psnr_db']:.1f} dB"
            lines.append(f"  {name:42s} {row['median_us']:6.0f} µs, {row['kb_per_image']:6.1f} kB "
                         f"({row['bytes_vs_original']:.2f} x), decode-cost ratio {row['decode_cost_ratio']:.2f}, {psnr}")
    for name, goal in results["goals"].items():
        lines.append(f"{name} = {ratio_text(goal['measured'])}; goal {goal['goal']:.2f}: {goal['words']} "
                     f"({goal['rounds']} counterbalanced rounds each, bench.compare)")
        limit = goal.get("limit")
        if limit:
            for who, part in ({"ours": limit} if "limited_by" in limit else limit).items():
                lines.append(f"  limit ({who}): {part['limited_by']}")
    lines.append("ratios (verdict):")
    for key, value in results["ratios"].items():
        lines.append(f"  {key} = {ratio_text(value)} ({results['ratio_verdicts'].get(key, '')})")
    squash = results.get("stored_squash")
    if squash and "pixel_error" in squash:
        lines.append(f"stored as {squash['format']}: {squash['storage_ratio']:.2f} x the original JPEG bytes; PSNR "
                     f"{squash['pixel_error']['psnr_db']:.1f} dB against the standard transform "
                     f"({squash['pixel_error']['images']} images)")
    small = results.get("small_files")
    if small:
        lines.append(f"small files ({small['workers']} workers, no decode), files/s under the model "
                     f"[{small['model_text']}]: " + ", ".join(f"{k} {v:.0f}" for k, v in small["modelled_files_per_s"].items())
                     + f"; tar/folder {small['tar_vs_folder_modelled']:.1f}x")
        if small["cold_files_per_s"]:
            lines.append(f"  cold ({small.get('cold_level')}) vs warm, files/s: " + ", ".join(
                f"{k} {v:.0f}" for k, v in small["cold_files_per_s"].items()))
    if results.get("formats"):
        from packlab.formats.bench import format_formats

        lines.append(format_formats(results["formats"]))
    for name in SECTIONS:
        if name in ("small_files", "formats"):
            continue  # printed above
        if isinstance(results.get(name), dict):
            lines.append(f"{name}: {results[name].get('summary', '(see bench.json)')}")
    load = results["machine"]
    lines.append(f"load average before {load['load_average_before']}, after {load['load_average_after']} "
                 f"on {cores} cores: well above {cores} means other programs competed and every figure is low")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m packlab.course.benchmark", description=run_benchmark.__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="the whole benchmark on the first --images images: checks that it runs, in minutes")
    parser.add_argument("--images", type=int, default=600, help="images for --quick (default 600)")
    parser.add_argument("--epochs", type=int, default=3, help="interleaved epochs per loader (default 3)")
    parser.add_argument("--workers", type=int, nargs="*", help="worker counts of the sweep (default: 0 1 2xcores)")
    parser.add_argument("--loaders", nargs="*", help="only these loaders (names as in the table)")
    parser.add_argument("--skip", nargs="*", default=[], choices=list(SECTIONS), help="sections to leave out")
    parser.add_argument("--out", help="output folder (default: _build/bench)")
    args = parser.parse_args(argv)
    root = quick_root(args.images, args.out) if args.quick else None
    try:
        run_benchmark(root=root, worker_counts=args.workers, out_dir=args.out, epochs=args.epochs, quick=args.quick,
                      loaders=args.loaders, sections=[name for name in SECTIONS if name not in args.skip])
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(disk_full_message(exc, root, args.out), file=sys.stderr)
        return 1
    return 0


def disk_full_message(exc: OSError, root=None, out_dir=None) -> str:
    """What to do when the disk (or a quota) fills up while the benchmark writes its copies."""
    from packlab import paths

    return (f"make bench: no space left writing {exc.filename or 'a file'} ({exc.strerror}). The benchmark writes "
            f"several gigabytes of packed copies under {paths.packed_dir(root)} and its results under {results_dir(out_dir)}. Free "
            "space there (`make clean-packed` removes every packed copy; the chapters write theirs again), or "
            "put the data folder on a larger disk (`make configure PACKLAB_DATA=/path/with/space`, then "
            "`make data`), and run `make bench` again.")


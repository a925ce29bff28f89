"""``make bench``'s ratios of the same work: the training transform, the stored copies, each loader against its own ceiling.

Every ratio here divides two measurements of the same work, or its name says what
differs:

* ``training_pipeline_speedup``: the course's fastest pipeline producing 224 x 224 random
  crops (from the dataset stored at a maximum side) over the standard DataLoader pipeline
  producing the same crops from the original JPEGs (Pillow decode, torchvision's
  ``RandomResizedCrop`` and flip); both hand uint8 batches to the training process. The
  storage ratio and the pixel error (the same crops on original and stored) stand beside it;
* ``<loader> vs own ceiling``: a loader over the parallel ceiling of *its own* input and
  per-image work (:func:`packlab.ceiling.crop_ceiling`) over the loader's epoch of images,
  so no loader can beat it; the ratio and its words come from
  :func:`packlab.ceiling.loader_vs_ceiling`, as chapter 11's do: the loader's median over the
  ceiling's best run. A loader above that, or clearly above the ceiling's runs, is reported as
  a mis-measured ceiling, and its ratio is stored as None;
* ``ours_vs_dali_cpu``: ours over DALI's CPU pipeline on the same shards, same crops,
  same output;
* ``decode_cost_ratio``: per image on one core, the originals' crop against each stored form's.

Rates come from steady state (:mod:`packlab.steady`: persistent workers, the clock from
each worker's first batch on, the first-batch time apart), in counterbalanced rounds
(:func:`packlab.bench.interleaved`), and every ratio carries :func:`packlab.bench.compare`'s
verdict; a goal counts as reached only where the verdict clears it (:func:`goal_verdict`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch

from packlab.bench import Spread, compare

#: How the training pipeline's copy of the dataset is stored: the longer side 320 px, aspect kept, JPEG q90, 4:2:0.
TRAINING_FORM_ARGS = {"size": 320, "quality": 90, "subsampling": "4:2:0", "fit": "max side"}
#: The maximum sides whose bytes, decode cost and pixel error the benchmark compares.
MAX_SIDES = (256, 320, 384)
#: Rounds of each head-to-head comparison: enough for compare() to call a real 1.3x difference clear.
ROUNDS = 6


def goal_verdict(a: Spread, b: Spread, goal: float) -> dict:
    """Whether ``a / b`` reaches ``goal``, as far as the runs can tell.

    ``b``'s runs are scaled by ``goal`` and compared with ``a``'s (:func:`compare`): clearly
    higher means the goal is reached, clearly lower that it is missed, and anything else
    that these runs cannot tell the ratio from the goal. Only the first counts as reached.
    """
    scaled = Spread.of(goal * v for v in b)
    verdict = compare(a, scaled)
    ratio = a.median / b.median
    words = {1: "reached", -1: "not reached", 0: "not shown (the runs cannot tell the ratio from the goal)"}[verdict]
    return {"goal": goal, "measured": ratio, "verdict": verdict, "reached": verdict > 0, "words": words,
            "compare": compare(a, b)}


def ceiling_goal_verdict(loader: Spread, ceiling: Spread, goal: float) -> dict:
    """:func:`goal_verdict` for a loader over its own ceiling, where a loader above it shows nothing.

    A loader cannot pass the ceiling of its own work, so a run that puts it above
    (:func:`packlab.ceiling.loader_vs_ceiling`) measured the ceiling wrong: the goal is then
    neither reached nor missed (verdict 0), and ``measured`` is None, as no ratio above 1 is a result.
    """
    from packlab.ceiling import loader_vs_ceiling

    out = goal_verdict(loader, ceiling, goal)
    ratio = loader_vs_ceiling(loader, ceiling)
    if ratio.mis_measured:
        out.update(measured=None, verdict=0, reached=False,
                   words="not shown (the ceiling was mis-measured: the loader measured above it)")
    else:
        out["measured"] = ratio.result
    return out


def verdict_words(a: Spread, b: Spread, a_name: str, b_name: str) -> str:
    """``a`` against ``b`` in the course's words: clearly faster, clearly slower, or no clear difference."""
    direction = compare(a, b)
    if direction == 0:
        return f"no clear difference between {a_name} and {b_name} by the course's rule ({len(a)} and {len(b)} runs)"
    ratio = a.median / b.median if direction > 0 else b.median / a.median
    return f"{a_name} clearly {'faster' if direction > 0 else 'slower'} than {b_name} ({ratio:.2f}x, {len(a)} runs each)"


class KeyRecorder:
    """An ``on_batch`` that keeps each batch's ``(key, label)``, for auditing the epoch afterwards."""

    def __init__(self):
        self.records: list[tuple[str, int, None]] = []

    def __call__(self, batch) -> None:
        _, labels, keys = batch[:3]
        labels = labels.tolist() if isinstance(labels, torch.Tensor) else list(labels)
        self.records.extend((str(k), int(v), None) for k, v in zip(keys, labels))


def audited_steady(loader, workers: int, epoch: int, expected: Sequence) -> tuple:
    """One steady epoch (:func:`packlab.steady.steady_epoch`) of a loader that yields keys, and its audit.

    ``expected`` are the samples the loader's shards hold. Returns ``(SteadyEpoch, AuditReport)``.
    """
    from packlab import audit
    from packlab.steady import steady_epoch

    recorder = KeyRecorder()
    result = steady_epoch(loader, workers, epoch=epoch, on_batch=recorder)
    return result, audit.audit_epoch(recorder.records, expected)


def head_to_head(loaders: dict, ceilings: dict, workers: int, expected: Sequence, rounds: int = ROUNDS,
                 log: Callable[[str], None] = print) -> dict:
    """Steady rates of ``loaders`` (built once, reused) and ``ceilings`` (measures), interleaved in balanced order.

    Every loader first runs one untimed, audited epoch (its workers start, its files enter
    the page cache), then ``rounds`` timed epochs, each audited: every key of ``expected``
    exactly once, with its label. Returns ``{"spreads": {name: Spread}, "rows": {name: details}}``.
    """
    from packlab.bench import interleaved

    epochs = {name: 0 for name in loaders}
    details: dict[str, dict] = {name: {"epochs": [], "audits": []} for name in loaders}
    for name in ceilings:
        details[name] = {"epochs": [], "audits": []}

    def run(name):
        result, report = audited_steady(loaders[name], workers, epochs[name], expected)
        epochs[name] += 1
        details[name]["epochs"].append(result.as_dict())
        details[name]["audits"].append(report.ok)
        if not report.ok:
            details[name].setdefault("audit_failures", []).append(report.summary())
        log(f"    {name:42s} {result.images_per_s:7.0f} images/s (first batch {result.first_batch_seconds:.2f} s)"
            + ("" if report.ok else "  AUDIT FAILED"))
        return result.images_per_s

    for name in loaders:
        _, report = audited_steady(loaders[name], workers, epochs[name], expected)
        epochs[name] += 1
        details[name]["warm_up_audit"] = report.ok
        if not report.ok:
            details[name].setdefault("audit_failures", []).append(report.summary())
    measures = {name: (lambda name=name: run(name)) for name in loaders}
    measures.update(ceilings)
    spreads = interleaved(measures, rounds=rounds)
    for name, spread in spreads.items():
        row = details[name]
        row.update(images_per_s=list(spread), median_images_per_s=spread.median, min_images_per_s=spread.low,
                   max_images_per_s=spread.high)
        if row["epochs"]:
            row["first_batch_seconds"] = median(e["first_batch_seconds"] for e in row["epochs"])
            row["startup_share"] = median(e["startup_share"] for e in row["epochs"])
            row["images_per_epoch"] = row["epochs"][0]["images"]
            row["audit"] = ("ok: every key exactly once with its label, in each of "
                            f"{len(row['audits']) + 1} epochs" if all(row["audits"]) and row["warm_up_audit"]
                            else "FAILED")
    return {"spreads": spreads, "rows": details}


def storage_rows(root, originals: Sequence[str], forms: Sequence, samples: Sequence, sample_limit: int = 64,
                 rounds: int = ROUNDS) -> dict:
    """Bytes, decode cost (one core, crops of 224) and pixel error of each stored form, against the originals.

    The pixel error is measured crop for crop: each sample's crop is drawn on the original
    (:func:`packlab.crops.crop_for`), the reference is the standard transform's crop of the
    original (:func:`packlab.crops.crop_reference`), and the stored copy gets the same
    window, scaled (:meth:`packlab.crops.Crop.box`), through the course's decoder.
    """
    from packlab import crops, data, decode
    from packlab.bench import interleaved, seconds_of
    from packlab.reencode import encode_pixels, stored_pixels

    chosen = list(samples)[:sample_limit]
    blobs = [data.image_path(s.key, root).read_bytes() for s in chosen]
    drawn = [crops.crop_for(s.key, s.width, s.height) for s in chosen]
    reference = [crops.crop_reference(b, c) for b, c in zip(blobs, drawn)]
    copies = {form.name: [encode_pixels(stored_pixels(b, form.size, fit=form.fit), form.quality, form.subsampling)
                          for b in blobs] for form in forms}
    original_kb = sum(len(b) for b in blobs) / len(blobs) / 1e3

    def per_image_us(decoder, items):
        return lambda: seconds_of(lambda: [decoder(b, c) for b, c in zip(items, drawn)])() / len(items) * 1e6

    runs = interleaved({"originals, standard crop (Pillow)": per_image_us(crops.crop_reference, blobs),
                        "originals, our crop decoder": per_image_us(crops.crop_fast, blobs),
                        **{name: per_image_us(crops.crop_fast, items) for name, items in copies.items()}},
                       rounds=rounds)
    out = {"images": len(chosen), "original_kb": original_kb, "rows": {}}
    standard = runs["originals, standard crop (Pillow)"]
    for name, spread in runs.items():
        items = copies.get(name, blobs)
        delivered = [crops.crop_fast(b, c) if name != "originals, standard crop (Pillow)" else r
                     for b, c, r in zip(items, drawn, reference)]
        out["rows"][name] = {
            "us_per_image": list(spread), "median_us": spread.median,
            "kb_per_image": sum(len(b) for b in items) / len(items) / 1e3,
            "bytes_vs_original": sum(len(b) for b in items) / sum(len(b) for b in blobs),
            "psnr_db": decode.psnr_over(delivered, reference),
            "decode_cost_ratio": standard.median / spread.median, "compare_vs_standard": compare(standard, spread),
        }
    return out


def median(values) -> float:
    return statistics.median(values)


def crops_section(root, shards: Sequence[str], train_shards: Sequence[str], manifest: Sequence, cores: int,
                  share: float = 0.5, rounds: int = ROUNDS, batch_size: int = 64,
                  log: Callable[[str], None] = print) -> dict:
    """The training transform end to end: the standard pipeline, ours, DALI, and each one's own ceiling.

    Reads the first ``share`` of the shards (and of their stored copies, the same samples),
    ``rounds`` interleaved steady epochs per loader, each audited; each ceiling runs over the
    loaders' whole epoch, the same samples in memory (:func:`packlab.ceiling.shard_items`).
    Returns the rows, the ratios of the same work with their verdicts, and what each loader
    spent on start-up.
    """
    from packlab.ceiling import crop_ceiling, loader_vs_ceiling, shard_items
    from packlab.crops import crop_fast, crop_reference
    from packlab.loaders.lineup import CROP_ROWS, crop_factories
    from packlab.preprocess import iter_samples

    # A whole number of shards per worker: with 5 shards and 2 workers one worker reads 3 and the
    # last fifth of every epoch runs on one worker alone (measured: 0.69 of the ceiling, not 0.8x).
    count = max(cores, round(len(shards) * share) // cores * cores)
    originals, stored = list(shards[:count]), list(train_shards[:count])
    by_key = {s.key: s for s in manifest}
    expected = [by_key[key] for shard in originals for key, _ in iter_samples(shard)]
    factories = crop_factories(originals, stored, batch_size=batch_size, with_keys=True)
    loaders = {name: make(cores) for name, (_, make) in factories.items()}
    original_items, stored_items = shard_items(originals), shard_items(stored)  # the loaders' epoch, every image
    ceilings = {
        "ceiling: standard crops (originals)": crop_ceiling(original_items, cores, crop_reference, channels_last=False),
        "ceiling: our crops (originals)": crop_ceiling(original_items, cores, crop_fast, channels_last=True),
        "ceiling: our crops (stored, max side)": crop_ceiling(stored_items, cores, crop_fast, channels_last=True),
    }
    log(f"training crops: {len(expected):,} images from {count} shards and their stored copies, {len(loaders)} "
        f"pipelines and {len(ceilings)} ceilings over the same {len(expected):,} images, {rounds} interleaved rounds, "
        "each epoch audited")
    measured = head_to_head(loaders, ceilings, cores, expected, rounds=rounds, log=log)
    del loaders
    spreads, rows = measured["spreads"], measured["rows"]
    for name, row in rows.items():
        row["group"] = factories[name][0] if name in factories else "ceiling"
    standard, ours = spreads[CROP_ROWS["standard"]], spreads[CROP_ROWS["ours, stored"]]
    own_ceiling = {CROP_ROWS["standard"]: "ceiling: standard crops (originals)",
                   CROP_ROWS["ours, originals"]: "ceiling: our crops (originals)",
                   CROP_ROWS["ours, stored"]: "ceiling: our crops (stored, max side)"}
    out = {"images": len(expected), "ceiling_images": len(stored_items), "shards": count, "rounds": rounds,
           "workers": cores, "rows": rows, "ratios": {}, "verdicts": {}, "ratio_intervals": {},
           "mis_measured_ceilings": []}
    out["ratios"]["training_pipeline_speedup"] = ours.median / standard.median
    out["verdicts"]["training_pipeline_speedup"] = verdict_words(ours, standard, "ours (stored)", "the standard")
    out["goal_training_pipeline_speedup"] = goal_verdict(ours, standard, GOALS_OF_THE_SAME_WORK["training_pipeline_speedup"])
    for loader, ceiling in own_ceiling.items():
        key = f"{loader} vs own ceiling"
        ratio = loader_vs_ceiling(spreads[loader], spreads[ceiling])
        out["ratios"][key], out["verdicts"][key] = ratio.result, ratio.words(loader)
        if ratio.interval is not None and ratio.interval.bounded:  # to set beside chapter 11's (CeilingRatio.agrees_with)
            out["ratio_intervals"][key] = [ratio.interval.low, ratio.interval.high]
        if ratio.mis_measured:
            out["mis_measured_ceilings"].append(ceiling)
    out["ratios"]["stored_loader_vs_stored_ceiling"] = out["ratios"][f"{CROP_ROWS['ours, stored']} vs own ceiling"]
    if f"{CROP_ROWS['ours, stored']} vs own ceiling" in out["ratio_intervals"]:
        out["ratio_intervals"]["stored_loader_vs_stored_ceiling"] = out["ratio_intervals"][
            f"{CROP_ROWS['ours, stored']} vs own ceiling"]
    out["verdicts"]["stored_loader_vs_stored_ceiling"] = out["verdicts"][f"{CROP_ROWS['ours, stored']} vs own ceiling"]
    out["goal_stored_loader_vs_stored_ceiling"] = ceiling_goal_verdict(
        ours, spreads[own_ceiling[CROP_ROWS["ours, stored"]]], GOALS_OF_THE_SAME_WORK["stored_loader_vs_stored_ceiling"])
    for ours_name, dali_name, key in ((CROP_ROWS["ours, stored"], CROP_ROWS["DALI, stored"], "ours_vs_dali_cpu"),
                                      (CROP_ROWS["ours, originals"], CROP_ROWS["DALI, originals"],
                                       "ours_vs_dali_cpu_originals")):
        if dali_name in spreads:
            out["ratios"][key] = spreads[ours_name].median / spreads[dali_name].median
            out["verdicts"][key] = verdict_words(spreads[ours_name], spreads[dali_name], ours_name, dali_name)
    if CROP_ROWS["DALI, stored"] not in spreads:
        from packlab.loaders.dali_pipeline import dali_status

        out["dali"] = dali_status() or "not run"
    return out


#: The goals of the ratios of the same work (``make bench``): each counts as reached only where the runs clear it.
GOALS_OF_THE_SAME_WORK = {"training_pipeline_speedup": 2.0, "stored_loader_vs_stored_ceiling": 0.80}


def ratio_text(value: float | None) -> str:
    """A stored ratio as text: two decimals, or why there is none (a loader-to-ceiling ratio above 1 is no result)."""
    return "no result" if value is None else f"{value:.2f}"


def format_crops(section: dict) -> list[str]:
    """The training-crops section as lines of text: the table, then each ratio with its verdict."""
    rows = section["rows"]
    width = max(len(name) for name in rows)
    lines = [f"training crops (224 x 224 random resized crop + flip, uint8 to the training process): "
             f"{section['images']:,} images per epoch, {section['workers']} workers or threads, steady state, "
             f"median of {section['rounds']} interleaved rounds",
             f"{'pipeline'.ljust(width)}  {'median':>7} {'min-max':>11} {'first batch':>11} {'start-up':>8}  audit"]
    for name, row in sorted(rows.items(), key=lambda item: -item[1]["median_images_per_s"]):
        first = f"{row['first_batch_seconds']:.2f} s" if "first_batch_seconds" in row else "-"
        share = f"{100 * row['startup_share']:.1f} %" if "startup_share" in row else "-"
        lines.append(f"{name.ljust(width)}  {row['median_images_per_s']:7.0f} {row['min_images_per_s']:5.0f}-"
                     f"{row['max_images_per_s']:<5.0f} {first:>11} {share:>8}  {row.get('audit', 'in memory, no loader')}")
    for key, value in section["ratios"].items():
        verdict = section["verdicts"].get(key, "")
        lines.append(f"{key} = {ratio_text(value)}" + (f": {verdict}" if verdict else ""))
    for key in ("goal_training_pipeline_speedup", "goal_stored_loader_vs_stored_ceiling"):
        goal = section[key]
        lines.append(f"{key[5:]}: goal {goal['goal']:.2f}, measured {ratio_text(goal['measured'])}: {goal['words']}")
    if "dali" in section:
        lines.append(f"DALI rows not run: {section['dali']}")
    return lines

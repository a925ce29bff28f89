"""Chapter 7, how fast is fast enough: the sentences around the sweep, the threads, preprocessing and slow storage.

Every "faster", "slower" and "clear" comes from :func:`packlab.bench.compare` (through
``verdict`` and ``ratio_words``); NVIDIA's GPU figures are the published ones the
chapter cites with their source.
"""

from __future__ import annotations

import statistics

from packlab.bench import Spread, compare, interval_note, ranking, ratio_words, verdict
from packlab.course.prose import names_text, provides_figures

#: NVIDIA's published ResNet-50 v1.5 training throughput with mixed precision, images/s
#: (NVIDIA/DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md,
#: "Training performance").
RESNET50_AMP_IMAGES_PER_S = {"1x V100": 1_200, "1x A100": 2_470, "8x A100": 16_621}

_LAYOUT_NAMES = {"folder": "the folder", "zip": "the zip through ZipFile", "zip_pread": "the zip with pread",
                 "tar": "tar shards"}


def sweep_plan_text(workers: int, cores: int, images: int, batch_size: int, batches_each: int, most_images: int,
                    images_left: int) -> str:
    """The worker sweep's size: its largest count, the batches each of those workers makes, and why the count
    stops below one per core when it does (``most_images``: what the chapter's time allows; ``images_left``: the
    dataset's images from the sweep's start on)."""
    plural = "s" * (workers != 1)
    text = (f"largest count: {workers} worker{plural}, {images // batch_size // workers} batches each at least "
            f"({images} images in batches of {batch_size})")
    if workers >= cores:
        return text + ", one worker per core"
    if most_images <= images_left:
        limit = (f"the sweep reads at most {most_images} images (the model trains on every image of every run, in "
                 "one process, and the chapter's time allows no more)")
    else:
        limit = f"the dataset holds only {images_left} images from the sweep's start on"
    batches = min(most_images, images_left) // batch_size
    return (text + f"; it stops there rather than at one worker per core ({cores}): each worker should make "
            f"{batches_each} batches of {batch_size}, and {limit}, which make {batches} batches")


def _which_side(alone: dict[int, Spread], appetite: Spread) -> str:
    """Which side sets the pace, worker count by worker count."""
    relation = {w: verdict(s, appetite, "faster than", "slower than", "not clearly different from", interval=False)
                for w, s in alone.items()}
    groups = {word: [w for w in alone if relation[w] == word]
              for word in ("slower than", "faster than", "not clearly different from")}
    # each worker count's verdict carries its own ratio to the model and that ratio's interval
    notes = {w: f"{w} workers ({interval_note(s, appetite)})" for w, s in alone.items()}
    for word, every in (("slower than", "the loader is the bottleneck"), ("faster than", "the model sets the pace")):
        if len(groups[word]) == len(alone):
            return (f"the loader alone was {word} the model at every worker count ({'; '.join(notes.values())}): "
                    f"here {every}")
    return "the loader alone was " + "; ".join(
        f"{word} the model with {' and '.join(notes[w] for w in ws)}" for word, ws in groups.items() if ws)


@provides_figures("bottleneck_verdict", "loader_0_text", "appetite_text", "serial_pred", "together_0_text",
                  "serial_where", "together_best_text", "best_workers_text", "cpu_bound_text", "alone_0_to_all",
                  "load_before_text", "load_after_text", "per_core_rate", "cores_per_a100", "cores_per_8_a100")
def sweep_figures(alone: dict[int, Spread], appetite: Spread, together: dict[int, Spread], serial: Spread,
                  measured_over_predicted: Spread, cpu_bound: float, best_workers: int, load_before: float,
                  load_after: float) -> dict:
    """The sweep's sentences: which side sets the pace, the prediction round by round, the GPU arithmetic."""
    ratio = measured_over_predicted
    if 0.9 <= ratio.low and ratio.high <= 1.1:
        where = (f"measured over predicted was {ratio.format('.2f')} round by round, so the prediction held within "
                 "10 % in every round")
    elif ratio.high < 1:
        where = (f"measured over predicted was {ratio.format('.2f')} round by round: below the prediction in every "
                 "round, so loading and training in one process cost more than the two apart (they share the "
                 "core's caches and memory bandwidth)")
    elif ratio.low > 1:
        where = (f"measured over predicted was {ratio.format('.2f')} round by round: above the prediction in every "
                 "round (the model alone and the loader alone each paid a start-up the loop paid once)")
    else:
        where = (f"measured over predicted was {ratio.format('.2f')} round by round: on both sides of the "
                 "prediction, which is as close as these runs can tell")
    per_core = alone[0].median
    workers = max(alone)
    return {
        "bottleneck_verdict": _which_side(alone, appetite),
        "loader_0_text": f"{alone[0]}", "appetite_text": f"{appetite}", "serial_pred": f"{serial.median:.0f}",
        "together_0_text": f"{together[0]}", "serial_where": where,
        "together_best_text": f"{together[best_workers]}",
        "best_workers_text": f"{best_workers} worker{'s' * (best_workers > 1)}", "cpu_bound_text": f"{cpu_bound:.0f}",
        "alone_0_to_all": ratio_words(alone[workers], alone[0]),
        "load_before_text": f"{load_before:.1f}", "load_after_text": f"{load_after:.1f}",
        "per_core_rate": f"{per_core:.0f}",
        "cores_per_a100": f"{RESNET50_AMP_IMAGES_PER_S['1x A100'] / per_core:.0f}",
        "cores_per_8_a100": f"{RESNET50_AMP_IMAGES_PER_S['8x A100'] / per_core:,.0f}",
    }


@provides_figures("threads_under_limits")
def thread_limit_figures(report: dict) -> dict:
    """What torch's default thread count followed, from :func:`packlab.cpus.cpu_report` plus the children's answers."""
    affinity = report["cores it may run on (affinity)"]
    here = report["torch's default here"]
    sentence = (f"torch's default here was {here} threads, as many as the cores this "
                f"process may run on ({affinity}).")
    quota_key = "torch's default, allowed one CPU of time (cgroup quota)"
    if quota_key in report:
        threads = report[quota_key]
        sentence += (f" A fresh Python allowed one CPU's worth of time by a cgroup quota still started {threads}: "
                     + ("the quota was invisible to it." if threads >= affinity else
                        "here the quota did change the count."))
    else:
        one_core = report["torch's default, allowed one core (affinity)"]
        sentence += (f" A fresh Python allowed one core started {one_core}: torch follows the affinity. (Putting a "
                     "process under a CPU-time quota needs root, so that case is not shown here; torch does not "
                     "read the quota.)")
    quota = report["CPU-time quota (cgroup)"]
    sentence += (" This process has no CPU-time quota." if quota is None else
                 f" This process's quota is {quota:g} CPUs' worth of time.")
    return {"threads_under_limits": sentence}


def payback_text(raw_fed: Spread, jpeg_fed: Spread, offline_all: Spread, images: int) -> str:
    """When preprocessing once pays for itself, or why this run shows no saving to pay it back."""
    saving = 1 / jpeg_fed.median - 1 / raw_fed.median  # seconds per image and epoch
    if compare(raw_fed, jpeg_fed) != 1:
        return ("training on raw pixels was not clearly faster than on JPEGs here, so on this machine, with this "
                "model, preprocessing has no clear saving to pay it back")
    cost = 1 / offline_all.median
    low = (1 / offline_all.high) / (1 / jpeg_fed.low - 1 / raw_fed.high)
    high = (1 / offline_all.low) / max(1 / jpeg_fed.high - 1 / raw_fed.low, 1e-12)
    return (f"an epoch of training on raw pixels instead of JPEGs saves about {images * saving:.1f} s, so "
            f"preprocessing pays for itself after {cost / saving:.1f} epochs (between {low:.1f} and "
            f"{'many' if high > 1e3 else f'{high:.1f}'}, from the ranges)")


@provides_figures("penalty_folder", "penalty_tar", "penalty_ratio", "penalty_ratio_range", "prediction_shares",
                  "zip_requests", "zip_kib", "member_kib", "pread_vs_zip_model", "cold_ranking", "warm_verdict",
                  "zip_reader_lesson", "closest_sentence", "model_error")
def penalty_figures(rates: dict, predicted_rates: dict, model_ratio: tuple, cold_level: str | None,
                    predicted: dict) -> dict:
    """The small-file penalty's sentences, from ``rates[(column, layout)]`` (Spreads over the rounds)."""
    model = {layout: rates["network model", layout] for layout in _LAYOUT_NAMES}
    shares = ", ".join(f"{_LAYOUT_NAMES[layout]} {model[layout].median / predicted_rates[layout]:.0%}"
                       for layout in _LAYOUT_NAMES)
    cold_column = f"cold, {cold_level}"
    if cold_level is not None and (cold_column, "folder") in rates:
        cold = {layout: rates[cold_column, layout] for layout in _LAYOUT_NAMES}
        cold_ranking = "against the folder, " + "; ".join(
            f"{_LAYOUT_NAMES[layout]}: {ratio_words(cold[layout], cold['folder'])}" for layout in ("zip", "zip_pread", "tar"))
        pread_cold = ratio_words(cold["zip_pread"], cold["zip"])
        warm_verdict = ratio_words(rates["warm", "tar"], rates["warm", "folder"])
    else:
        cold_ranking = "cold reads were not measured (this system cannot drop cached pages)"
        pread_cold = "not measured cold"
        warm_verdict = "not measured"
    pread_model = ratio_words(model["zip_pread"], model["zip"])
    return {
        "penalty_folder": f"{model['folder']:,.0f}", "penalty_tar": f"{model['tar']:,.0f}",
        "penalty_ratio": f"{model_ratio[0]:.0f}", "penalty_ratio_range": f"{model_ratio[1]:.0f}\u2013{model_ratio[2]:.0f}",
        "prediction_shares": shares,
        "zip_requests": f"{predicted['zip_requests_per_member']:.1f}",
        "zip_kib": f"{predicted['zip_bytes_per_member'] / 1024:.0f}",
        "member_kib": f"{predicted['mean_file_bytes'] / 1024:.0f}",
        "pread_vs_zip_model": f"under the model the pread reader was {pread_model}",
        "cold_ranking": cold_ranking, "warm_verdict": warm_verdict,
        "zip_reader_lesson": (f"PreadZipDataset against ZipDataset, the same archive: {pread_model} under the "
                              f"model, and {pread_cold} cold"),
        **closest_figures(rates, predicted_rates),
    }


def _share_text(share: Spread) -> str:
    return f"{share.median:.0%}"


def closest_figures(rates: dict, predicted_rates: dict) -> dict:
    """Which layout came closest to its waiting-only prediction under the model, as measured (share = rate / prediction)."""
    shares = {layout: Spread.of(v / predicted_rates[layout] for v in rates["network model", layout])
              for layout in _LAYOUT_NAMES}
    steps = ranking(shares)
    (first, _), (second, clear) = steps[0], steps[1]
    last = steps[-1][0]
    closest = (f"As measured, {_LAYOUT_NAMES[first]} came closest to its prediction ({_share_text(shares[first])}), "
               + (f"clearly closer than {_LAYOUT_NAMES[second]}" if clear else f"not clearly closer than {_LAYOUT_NAMES[second]}")
               + f" ({_share_text(shares[second])}; the ratio of the two shares "
               f"{interval_note(shares[first], shares[second])}); {_LAYOUT_NAMES[last]} fell furthest short "
               f"({_share_text(shares[last])}).")
    low, high = min(v.median for v in shares.values()), max(v.median for v in shares.values())
    return {"closest_sentence": closest,
            "model_error": (f"Every layout reached between {low:.0%} and {high:.0%} of its waiting-only prediction: "
                            "the prediction is a ceiling on the rate, not a forecast of it.")}


@provides_figures("sleep_extra_text", "start_text", "folder_read_text", "busiest_text", "refined_shares",
                  "remainder_text")
def model_error_figures(rates: dict, penalty: dict, sleep_extra: dict[float, float], start_s: Spread) -> dict:
    """What the waiting-only prediction leaves out, measured, and the estimate with it put back.

    ``rates[("network model", layout)]``: the measured rounds (files/s); ``penalty``: one result
    of :func:`packlab.small_files.small_file_penalty` (its prediction, the files each layout read
    and the busiest reader's share); ``sleep_extra``: ``{seconds asked: median extra seconds}``
    of ``time.sleep`` here; ``start_s``: the seconds from a DataLoader's iterator to its first,
    empty batch. The refined estimate puts back what was measured: each epoch's start, the
    busiest reader's share, and the extra time of every sleep; not the CPU work of reading.
    """
    prediction = penalty["prediction"]
    images = prediction["images"]
    # Sleeps per file and the modelled wait per file, layout by layout (the model waits once per open and per request).
    per_file = {"folder": prediction["folder_s_per_file"], "zip": prediction["zip_s_per_member"],
                "zip_pread": prediction["zip_pread_s_per_member"], "tar": prediction["tar_s_all_shards"] / images}
    sleeps = {"folder": 2.0, "zip": prediction["zip_requests_per_member"], "zip_pread": 1.0,
              "tar": (prediction["shards"] + prediction["tar_requests"]) / images}
    extra = statistics.median(sleep_extra.values())
    files, busiest = penalty["files_read_modelled"], penalty["busiest_reader_files"]
    refined = {layout: files[layout] / (start_s.median + busiest[layout] * (per_file[layout] + sleeps[layout] * extra))
               for layout in _LAYOUT_NAMES}
    reached = {layout: rates["network model", layout].median / refined[layout] for layout in _LAYOUT_NAMES}
    low, high = min(reached.values()), max(reached.values())
    span = f"between {low:.0%} and {high:.0%}" if high - low >= 0.005 else f"{low:.0%}"
    cpu = ("the CPU work of each read (opening, parsing, collating, passing batches between processes), which the "
           "warm column shows without any waiting")
    below = [_LAYOUT_NAMES[layout] for layout in _LAYOUT_NAMES if reached[layout] < 0.9]
    above = [_LAYOUT_NAMES[layout] for layout in _LAYOUT_NAMES if reached[layout] > 1.1]
    remainder = f"The measured rates reached {span} of this estimate."
    if not below and not above:
        remainder += f" These three account for nearly all of the gap; what is left is no more than {cpu} adds."
    if below:
        who = "them" if len(below) == len(_LAYOUT_NAMES) else names_text(below)
        remainder += (f" What keeps {who} short of it is what the model still leaves out and this section does "
                      f"not measure apart: {cpu}.")
    if above:
        remainder += (f" Above it ({names_text(above)}), the estimate overcharged, most likely in the start, which "
                      "varies from run to run (see its range).")
    workers = penalty["workers"]
    return {
        "sleep_extra_text": ", ".join(f"a {asked * 1e3:g} ms sleep took {(asked + more) * 1e3:.2f} ms"
                                      for asked, more in sorted(sleep_extra.items())),
        "start_text": (f"{start_s.median:.2f} s (median of {len(start_s)}; range {start_s.low:.2f}–{start_s.high:.2f})"
                       f" to start {workers} worker{'s' * (workers != 1)} and get a first, empty batch back"),
        "folder_read_text": f"{files['folder'] / rates['network model', 'folder'].median:.2f} s",
        "busiest_text": ", ".join(f"{busiest[layout]} of {files[layout]} for {_LAYOUT_NAMES[layout]}"
                                  for layout in _LAYOUT_NAMES),
        "refined_shares": "; ".join(f"{_LAYOUT_NAMES[layout]} {refined[layout]:,.0f} files/s, of which it reached "
                                    f"{reached[layout]:.0%}" for layout in _LAYOUT_NAMES),
        "remainder_text": remainder,
    }

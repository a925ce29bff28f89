"""Sentences of chapter 14, "What storing, echoing and mixing cost", built from what its cells measured.

Accuracies come as ``packlab.bench.Spread`` of per-seed held-out accuracies in %, and every
word that compares two of them follows :func:`packlab.bench.compare`: "clearly" only where
it says so, and a null result stated as one, with the interval of the difference.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from packlab.accuracy.echo import reached, wall_seconds
from packlab.accuracy.mixing import window_shares
from packlab.accuracy.training import BATCH_SIZE, RunResult
from packlab.bench import Spread, compare, difference_interval, interval_note, with_note
from packlab.course.prose import names_text, provides_figures


def against(accuracy: Spread, reference: Spread) -> str:
    """One accuracy spread against the reference's, in words: the difference of the medians in points, and the
    interval of the difference (:func:`packlab.bench.difference_interval`, the same pairs the verdict counts).

    Beside "no clear difference" the interval says how large a difference these seeds could
    have missed."""
    direction = compare(accuracy, reference)
    points = accuracy.median - reference.median
    _, low, high = difference_interval(accuracy, reference)
    span = (f"interval {low:+.1f} to {high:+.1f}" if abs(low) < float("inf") and abs(high) < float("inf")
            else "too few runs for an interval")
    if direction == 0:
        return f"no clear difference ({points:+.1f} points, {span})"
    return f"clearly {'better' if direction > 0 else 'worse'} ({points:+.1f} points, {span})"


# ------------------------------------------------------------------------------ storage


def storage_rows(stored: Mapping[str, tuple], accuracy: Mapping[str, Spread], reference: str) -> list[dict]:
    """Per way of storing: kB per image, PSNR of what the model sees against the originals', accuracy, verdict."""
    from packlab.accuracy.pixels import psnr

    base_images, base_kb = stored[reference]
    rows = []
    for name, (images, kb) in stored.items():
        quality = psnr(images.pixels, base_images.pixels)
        rows.append({"stored as": name, "kB per image": f"{kb:.1f}", "bytes against the originals": f"{kb / base_kb:.2f}",
                     "PSNR at 64 px, dB": "identical" if quality == float("inf") else f"{quality:.1f}",
                     "held-out accuracy, %": f"{accuracy[name]:.1f}",
                     f"against the {reference}": "reference" if name == reference
                     else against(accuracy[name], accuracy[reference])})
    return rows


@provides_figures("storage_sentence", "key_storage")
def storage_figures(stored: Mapping[str, tuple], accuracy: Mapping[str, Spread], reference: str) -> dict:
    """Which stored copies trained a clearly different model, and at what share of the bytes."""
    base_kb = stored[reference][1]
    others = [n for n in stored if n != reference]
    worse = [n for n in others if compare(accuracy[n], accuracy[reference]) < 0]
    better = [n for n in others if compare(accuracy[n], accuracy[reference]) > 0]
    same = [n for n in others if n not in worse and n not in better]
    parts = []
    if same:
        parts.append(f"{names_text(same)} trained no clearly different model from the {reference} "
                     f"({', '.join(f'{accuracy[n].median:.1f} %' for n in same)} against {accuracy[reference].median:.1f} %)"
                     f" at {', '.join(f'{stored[n][1] / base_kb:.2f}' for n in same)} of their bytes")
    if worse:
        parts.append(f"{names_text(worse)} trained a clearly worse one "
                     f"({', '.join(f'{accuracy[n].median:.1f} %' for n in worse)})")
    if better:
        parts.append(f"{names_text(better)} trained a clearly better one "
                     f"({', '.join(f'{accuracy[n].median:.1f} %' for n in better)})")
    sentence = "Trained on its stored copies and tested on originals, " + "; ".join(parts) + "."
    key = (f"no stored copy cost accuracy clearly, down to {min(stored[n][1] for n in others) / base_kb:.2f} of the "
           "bytes." if not worse else f"{names_text(worse)} cost accuracy clearly.")
    return {"storage_sentence": sentence, "key_storage": key[0].upper() + key[1:]}


# ------------------------------------------------------------------------------ echoing


def echo_target(no_echo: Sequence[RunResult], below: float = 0.05) -> float:
    """The target accuracy: ``below`` under the no-echo runs' median final accuracy, down to a whole per cent."""
    final = statistics.median(r.accuracy for r in no_echo)
    return int(100 * (final - below)) / 100


def _times(results: Sequence[RunResult], target: float, loader_rate: float, model_rate: float) -> list[float]:
    """Per seed: modelled seconds until the target was first reached (inf where it never was)."""
    out = []
    for result in results:
        hit = reached(result, target)
        out.append(float("inf") if hit is None else wall_seconds(hit[0], hit[1], BATCH_SIZE, loader_rate, model_rate))
    return out


def _fresh(results: Sequence[RunResult], target: float) -> list[float]:
    return [float("inf") if (hit := reached(r, target)) is None else float(hit[1]) for r in results]


def _median_text(values: Sequence[float], fmt: str) -> str:
    finite = [v for v in values if np.isfinite(v)]
    if len(finite) <= len(values) // 2:
        return f"not reached ({len(values) - len(finite)} of {len(values)} runs)"
    text = f"{statistics.median(values):{fmt}}"
    return text + (f" ({len(values) - len(finite)} runs never)" if len(finite) < len(values) else "")


def echo_rows(runs: Mapping[str, Sequence[RunResult]], target: float, loader_rate: float,
              model_rate: float) -> list[dict]:
    """Per echo setting: final accuracy, fresh images and modelled seconds to the target, and the verdict on time."""
    base = Spread.of(_times(runs["no echo"], target, loader_rate, model_rate))
    rows = []
    for name, results in runs.items():
        times = Spread.of(_times(results, target, loader_rate, model_rate))
        verdict = with_note({1: "clearly slower", -1: "clearly faster", 0: "no clear difference"}[compare(times, base)],
                            interval_note(times, base))
        rows.append({"echo": name, "final accuracy, %": f"{Spread.of(100 * r.accuracy for r in results):.1f}",
                     f"fresh images to {100 * target:.0f} %": _median_text(_fresh(results, target), ",.0f"),
                     "modelled seconds to it": _median_text(list(times), ".1f"),
                     "against no echo": "reference" if name == "no echo" else verdict})
    return rows


@provides_figures("echo_sentence", "echo_fresh_sentence", "key_echo")
def echo_figures(runs: Mapping[str, Sequence[RunResult]], target: float, loader_rate: float, model_rate: float) -> dict:
    """Which echo setting reached the target soonest, and what it saved of the loader's work."""
    times = {name: Spread.of(_times(results, target, loader_rate, model_rate)) for name, results in runs.items()}
    base = times["no echo"]
    faster = [n for n, t in times.items() if n != "no echo" and compare(t, base) < 0]
    slower = [n for n, t in times.items() if n != "no echo" and compare(t, base) > 0]
    if faster:
        best = min(faster, key=lambda n: times[n].median)
        echo_sentence = (f"With the loader {model_rate / loader_rate:.1f} times slower than the model, "
                         f"{names_text(faster)} reached {100 * target:.0f} % clearly sooner than no echo "
                         f"({best}: {times[best].median:.1f} s against {base.median:.1f} s, median; "
                         f"{interval_note(times[best], base)})")
    else:
        echo_sentence = (f"With the loader {model_rate / loader_rate:.1f} times slower than the model, no echo setting "
                         f"reached {100 * target:.0f} % clearly sooner than no echo ({base.median:.1f} s, median)")
    echo_sentence += f"; {names_text(slower)} clearly later." if slower else "."
    fresh = {name: statistics.median(_fresh(results, target)) for name, results in runs.items()}
    reached_by = {n: f for n, f in fresh.items() if np.isfinite(f)}
    if reached_by:
        fewest = min(reached_by, key=reached_by.get)
        echo_fresh_sentence = ("Fresh images needed to get there (median): "
                               + ", ".join(f"{n} {f:,.0f}" for n, f in reached_by.items()) + ".")
        if "no echo" in reached_by and fewest != "no echo":
            echo_fresh_sentence += (f" {fewest} needed {reached_by['no echo'] / reached_by[fewest]:.2f} times fewer "
                                    "than no echo: its repeats did part of the work of fresh images.")
    else:
        echo_fresh_sentence = "No setting reached the target within its budget of fresh images."
    key_echo = (f"{names_text(faster)} reached the target clearly sooner than no echo." if faster
                else "no echo setting reached the target clearly sooner than no echo.")
    return {"echo_sentence": echo_sentence, "echo_fresh_sentence": echo_fresh_sentence,
            "key_echo": key_echo[0].upper() + key_echo[1:]}


# ------------------------------------------------------------------------------ mixing


def _mix_stats(orders: Sequence[Sequence[int]], source: int, window: int) -> dict:
    lengths = [len(o) for o in orders]
    shares = [float(np.mean(np.asarray(o) == source)) for o in orders]
    windows = np.concatenate([window_shares(o, source, window) for o in orders])
    return {"lengths": lengths, "shares": shares, "low": float(windows.min()), "high": float(windows.max())}


def mix_rows(mixed: Mapping[str, Sequence[Sequence[int]]], source: int, share: float, window: int) -> list[dict]:
    """Per mixer, over the seeds: epoch length, the source's share of the epoch and of each stretch of ``window``."""
    rows = []
    for name, orders in mixed.items():
        stats = _mix_stats(orders, source, window)
        rows.append({"mixer": name, "samples per epoch": f"{min(stats['lengths']):,}–{max(stats['lengths']):,}",
                     f"share of the {100 * share:.0f} % source, epoch": f"{100 * min(stats['shares']):.1f}–"
                                                                          f"{100 * max(stats['shares']):.1f} %",
                     f"in a stretch of {window}": f"{100 * stats['low']:.0f}–{100 * stats['high']:.0f} %"})
    return rows


@provides_figures("mix_sentence", "key_mix")
def mix_figures(mixed: Mapping[str, Sequence[Sequence[int]]], source: int, share: float, window: int) -> dict:
    """How close each mixer came to the asked share, per stretch and per epoch."""
    stats = {name: _mix_stats(orders, source, window) for name, orders in mixed.items()}
    exact = [n for n, s in stats.items() if abs(s["low"] - share) < 1.5 / window and abs(s["high"] - share) < 1.5 / window]
    parts = [f"{name} {100 * s['low']:.0f}–{100 * s['high']:.0f} %" for name, s in stats.items()]
    varying = [n for n, s in stats.items() if len(set(s["lengths"])) > 1 or max(s["shares"]) - min(s["shares"]) > 0.5 / len(mixed[n][0])]
    mix_sentence = (f"Asked for {100 * share:.0f} %, the source's share of a stretch of {window} ranged: "
                    + "; ".join(parts) + ".")
    mix_sentence += (f" Epoch length or the source's count changed from seed to seed with {names_text(varying)}."
                     if varying else " Every mixer gave the same counts in every epoch.")
    key = (f"{names_text(exact)} kept every stretch of {window} within a sample of the share" if exact
           else f"no mixer kept every stretch of {window} at the share")
    key += f"; {names_text(varying)} changed the epoch's counts with the seed." if varying else "."
    return {"mix_sentence": mix_sentence, "key_mix": key[0].upper() + key[1:]}


def resume_sentence(first: Sequence, rest: Sequence, whole: Sequence, state: dict) -> str:
    """The mix stopped, saved and resumed, against the uninterrupted epoch."""
    if list(first) + list(rest) == list(whole):
        return (f"Its state at the stop was {state}, and the {len(first):,} samples before the stop followed by the "
                f"{len(rest):,} after it were the uninterrupted epoch, sample for sample.")
    return (f"Its state at the stop was {state}, but the stopped and resumed epoch differed from the uninterrupted "
            f"one: {len(first) + len(rest):,} samples against {len(whole):,}.")

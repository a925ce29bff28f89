"""Sentences of chapter 14, "What storing, echoing and mixing cost", built from what its cells measured.

Accuracies come as ``packlab.bench.Spread`` of per-seed held-out accuracies in %, and every
word that compares two of them follows :func:`packlab.bench.compare`: "clearly" only where
it says so, and a null result stated as one, with the interval of the difference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from packlab.accuracy.echo import wall_seconds
from packlab.accuracy.mixing import window_shares
from packlab.accuracy.training import BATCH_SIZE
from packlab.course.prose import names_text, provides_figures


# ------------------------------------------------------------------------------ storage


def storage_rows(accuracy: Mapping[str, np.ndarray], scales: Mapping[str, tuple], kb: Mapping[str, float],
                 psnr_db: Mapping[str, float]) -> list[dict]:
    """Per crop scale and stored form: bytes, PSNR of the crops, accuracy, and the paired verdict stored - originals.

    ``accuracy`` maps ``"<form>, <scale>"`` (form "originals" or "stored") to per-seed accuracy;
    ``scales`` the scale names to their ``(low, high)`` area shares; ``kb`` each form's kB per image;
    ``psnr_db`` each scale's stored crops against the original crops.
    """
    from packlab.accuracy.paired import paired_difference

    from .ch13 import spread_text, verdict_text

    rows = []
    for scale in scales:
        for form in ("originals", "stored"):
            name = f"{form}, {scale}"
            rows.append({"crops of": form, "crop area": scale, "kB per image": f"{kb[form]:.1f}",
                         "PSNR of the crops, dB": "reference" if form == "originals" else f"{psnr_db[scale]:.1f}",
                         "held-out accuracy, % (seeds' range)": spread_text(accuracy[name]),
                         "stored minus originals": "" if form == "originals" else verdict_text(
                             paired_difference(accuracy[name], accuracy[f"originals, {scale}"]))})
    return rows


def storage_differences(accuracy: Mapping[str, np.ndarray], scales: Mapping[str, tuple]) -> dict:
    """Stored minus originals at each crop scale, seed by seed."""
    from packlab.accuracy.paired import paired_difference

    return {f"stored, {scale}": paired_difference(accuracy[f"stored, {scale}"], accuracy[f"originals, {scale}"])
            for scale in scales}


@provides_figures("storage_sentence", "key_storage")
def storage_figures(accuracy: Mapping[str, np.ndarray], scales: Mapping[str, tuple], kb: Mapping[str, float]) -> dict:
    """What training on the stored copy's crops did at each scale, with each null's reach; a key point only where clear."""
    differences = storage_differences(accuracy, scales)
    parts = []
    for scale in scales:
        d = differences[f"stored, {scale}"]
        mean = float(np.mean(accuracy[f"originals, {scale}"]))
        parts.append(f"with crops of {scale} of the area (the originals' crops reached {mean:.1f} %), "
                     + _clause(d, "higher", "lower"))
    share = kb["stored"] / kb["originals"]
    sentence = (f"Trained on crops of the stored copy ({share:.2f} of the originals' bytes) instead of the same crops "
                "of the originals, and tested on originals: " + "; ".join(parts) + ".")
    clear = [scale for scale in scales if differences[f"stored, {scale}"].clear]
    if clear:
        key = "; ".join(f"at crops of {scale}, the stored copy's crops trained a clearly "
                        f"{'better' if differences[f'stored, {scale}'].estimate > 0 else 'worse'} model "
                        f"({differences[f'stored, {scale}'].text()})" for scale in clear) + "."
    else:
        reach = max(differences[f"stored, {scale}"].detectable for scale in scales)
        key = (f"no cost of the stored copy was seen at {share:.2f} of the bytes; these comparisons could have seen "
               f"about {reach:.1f} points, not less.")
    return {"storage_sentence": sentence, "key_storage": key[0].upper() + key[1:]}


# ------------------------------------------------------------------------------ echoing


#: The echo settings of the chapter, in its table's order: (echo factor, how, augmented before or after the echo).
#: ``how`` None is no echo; "no echo" trains every step on a fresh read (a loader fast enough), "waiting" trains
#: only the steps its reads allow (a loader ``factor`` times too slow, nothing done about it).
ECHO_SETTINGS = {
    "no echo": (1, None, "after"),
    "waiting, loader 4x too slow": (4, None, "after"),
    "example echo 2": (2, "example", "after"),
    "example echo 4": (4, "example", "after"),
    "example echo 4, before augmentation": (4, "example", "before"),
    "batch echo 4": (4, "batch", "after"),
}
REFERENCE, WAITING = "no echo", "waiting, loader 4x too slow"


#: The settings whose learning rate is tuned, one per echo factor and the run that waits (it trains a quarter of the
#: steps, which may want another rate); every other setting takes the rate of its factor's.
TUNED = ("no echo", "waiting, loader 4x too slow", "example echo 2", "example echo 4")


def tuned_for(name: str) -> str:
    """The tuned setting whose learning rate ``name`` uses: itself, or the example echo of its factor."""
    if name in TUNED:
        return name
    return f"example echo {ECHO_SETTINGS[name][0]}"


def rate_lines(table: Mapping[str, Mapping[float, float]], chosen: Mapping[str, float]) -> str:
    """The tuning's results, one line per tuned setting, and a warning where the best rate is at the grid's edge."""
    lines = []
    for name, by_rate in table.items():
        tried = ", ".join(f"{rate:g} → {accuracy:.1f} %" for rate, accuracy in by_rate.items())
        edge = ("; the largest rate tried won, so a larger one might do better still" if chosen[name] == max(by_rate)
                else "; the smallest rate tried won, so a smaller one might do better still"
                if chosen[name] == min(by_rate) else "")
        lines.append(f"{name}: {tried} (validation accuracy); chosen {chosen[name]:g}{edge}")
    return "\n".join(lines)


def echo_rows(accuracy: Mapping[str, np.ndarray], images: int, loader_rate: float, model_rate: float,
              rates: Mapping[str, float]) -> list[dict]:
    """Per echo setting: the loader's reads and the steps, modelled wall time, the tuned rate, accuracy, verdicts."""
    from packlab.accuracy.paired import paired_difference

    from .ch13 import spread_text, verdict_text

    rows = []
    for name, (factor, how, _) in ECHO_SETTINGS.items():
        reads = images // factor
        trained = reads if how is None else images
        seconds = wall_seconds(-(-trained // BATCH_SIZE), reads, BATCH_SIZE, loader_rate, model_rate)
        rows.append({"setting": name, "loader reads": f"{reads:,}", "images trained": f"{trained:,}",
                     "modelled seconds": f"{seconds:.1f}", "learning rate": f"{rates[tuned_for(name)]:g}",
                     "held-out accuracy, % (seeds' range)": spread_text(accuracy[name]),
                     "against no echo": "reference" if name == REFERENCE
                     else verdict_text(paired_difference(accuracy[name], accuracy[REFERENCE])),
                     "against waiting (same reads)": "-" if factor != 4 or name == WAITING
                     else verdict_text(paired_difference(accuracy[name], accuracy[WAITING]))})
    return rows


def echo_differences(accuracy: Mapping[str, np.ndarray]) -> dict:
    """Every setting minus no echo, seed by seed (:class:`~packlab.accuracy.paired.PairedDifference`)."""
    from packlab.accuracy.paired import paired_difference

    return {name: paired_difference(values, accuracy[REFERENCE]) for name, values in accuracy.items()
            if name != REFERENCE}


def _clause(difference, more: str, less: str) -> str:
    """"clearly <more>" / "clearly <less>" / "no clear difference", each with its interval (and a null's reach)."""
    if difference.clear:
        return f"clearly {more if difference.estimate > 0 else less}: {difference.text()}"
    return f"no clear difference: {difference.text()}"


@provides_figures("echo_sentence", "echo_augment_sentence", "key_echo")
def echo_figures(accuracy: Mapping[str, np.ndarray], loader_rate: float, model_rate: float) -> dict:
    """What echoing bought against waiting, what it cost against a fast enough loader, and where the copies differ."""
    from packlab.accuracy.paired import paired_difference

    def diff(a, b):
        return paired_difference(accuracy[a], accuracy[b])

    gained = diff("example echo 4", WAITING)
    cost = diff("example echo 4", REFERENCE)
    batch = diff("batch echo 4", "example echo 4")
    echo_sentence = (
        f"This machine's loader is {model_rate / loader_rate:.1f} times slower than the model. Example echoing at "
        f"4, the same reads each used four times, against the run that waited for its reads: "
        f"{_clause(gained, 'better', 'worse')}; against a loader fast enough for every step: "
        f"{_clause(cost, 'better', 'worse')}. Batch echoing at 4, each batch four steps in a row, against example "
        f"echoing at 4: {_clause(batch, 'better', 'worse')}.")
    before = diff("example echo 4, before augmentation", "example echo 4")
    echo_augment_sentence = (
        "Echoing before the augmentation, so that each copy gets its own noise, against after it (identical "
        f"copies): {_clause(before, 'better', 'worse')}.")
    if gained.clear and gained.estimate > 0:
        key_echo = f"example echoing at 4 trained clearly better than waiting for the loader: {gained.text()}."
    else:
        key_echo = f"example echoing at 4 was not clearly better than waiting for the loader: {gained.text()}."
    return {"echo_sentence": echo_sentence, "echo_augment_sentence": echo_augment_sentence,
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

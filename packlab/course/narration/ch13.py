"""Sentences of chapter 13, "What the order costs the model", built from what its cells measured.

Accuracies come as arrays of per-seed held-out accuracies in %, seed ``i`` the same run in
every condition, and every word that compares two conditions follows
:func:`packlab.accuracy.paired.paired_difference`: "clearly" only where its interval leaves
out 0, and beside every null the smallest difference that comparison could have seen.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from packlab.accuracy.conditions import RECALIBRATED, PlantedEffect
from packlab.accuracy.paired import PairedDifference, paired_difference
from packlab.bench import FALSE_CLEAR_RATE
from packlab.class_mixing import band_decimals
from packlab.course.prose import names_text, provides_figures

#: The power the chapter asks of its instrument: a planted one-point cost found this often.
WANTED_POWER = 0.8


def spread_text(values: Sequence[float]) -> str:
    """``"91.4 % (89.9 to 92.6)"``: the median of the seeds' accuracies and their range."""
    values = np.asarray(values, dtype=float)
    return f"{np.median(values):.1f} % ({values.min():.1f} to {values.max():.1f})"


def mixing_text(mixing: Mapping[str, Mapping], name: str) -> str:
    """``"0.134, not mixed"``: an order's label mixing and chapter 12's verdict on it.

    ``mixing`` is :func:`packlab.class_mixing.mixing_verdicts` of the orders: the same band of
    random permutations (a 2 % test) that chapter 12 judges mixing by, one standard for both
    chapters. The value prints with the decimals that keep it on its own side of the band's
    printed top (:func:`packlab.class_mixing.band_decimals`)."""
    top = mixing["random permutation"]["band_top"]
    decimals = band_decimals([v["mixing"] for n, v in mixing.items() if n != "random permutation"], top)
    value = mixing[name]
    verdict = ("mixed like a random permutation" if value["mixes_like_a_permutation"]
               else f"not mixed: above the permutations' {top:.{decimals}f}")
    return f"{value['mixing']:.{decimals}f}, {verdict}"


def verdict_text(difference: PairedDifference) -> str:
    """``"clearly lower: -3.1 points (-4.0 to -2.2)"`` or ``"no clear difference: +0.2 points (-0.4 to +0.9),
    could have seen 0.9"``: the paired verdict, its interval, and for a null the smallest detectable difference."""
    if difference.clear:
        return f"clearly {'higher' if difference.estimate > 0 else 'lower'}: {difference.text()}"
    return f"no clear difference: {difference.text()}"


@provides_figures("seed_spread", "planted_sentence", "power_sentence", "key_instrument")
def instrument_figures(planted: PlantedEffect) -> dict:
    """What the planted effect showed: the seeds' spread, one verdict on its first ``planted.seeds`` seeds (the
    number every comparison of the chapter uses), and the power over the pool."""
    seeds = planted.seeds
    clean, flipped, repeat = planted.clean[:seeds], planted.flipped[:seeds], planted.repeat[:seeds]
    cost = paired_difference(flipped, clean)
    same = paired_difference(repeat, clean)
    share = f"{100 * planted.flip_share:g} %"
    planted_sentence = (
        f"With {share} of the training labels flipped, the same {seeds} seeds reached "
        f"{spread_text(flipped)}; flipped minus clean, seed by seed: {verdict_text(cost)}. The same recipe run "
        f"again with other shuffles, minus the first run: {verdict_text(same)}.")
    found_enough = planted.found >= WANTED_POWER
    false_ok = planted.false_clear <= FALSE_CLEAR_RATE
    power_sentence = (
        f"Over all {planted.pool} seeds the flipped labels cost {planted.cost:.2f} points on average. Judged "
        f"{seeds} seeds at a time, as every comparison below is ({planted.draws:,} draws of {seeds} of the "
        f"{planted.pool} seeds), the instrument found that cost in {100 * planted.found:.0f} % of the draws "
        + ("(the 80 % asked of it)" if found_enough else "(less than the 80 % asked of it: a cost this size can be "
                                                         "missed here, so a null below is weak evidence)")
        + f", and called the two runs of one recipe different in {100 * planted.false_clear:.1f} % "
        + ("(at most the 2 % every verdict in the book allows)." if false_ok
           else f"(more than the {100 * FALSE_CLEAR_RATE:.0f} % every verdict in the book allows).")
        + f" The smallest difference these comparisons could see, at 80 % power, was about "
          f"{planted.detectable:.1f} points. The draws share seeds, so these shares describe this pool of "
          f"{planted.pool}, not every seed there is.")
    key_instrument = (f"{seeds} paired seeds found a planted cost of {planted.cost:.1f} points in "
                      f"{100 * planted.found:.0f} % of draws, and called identical recipes different in "
                      f"{100 * planted.false_clear:.1f} %.")
    return {"seed_spread": spread_text(clean), "planted_sentence": planted_sentence,
            "power_sentence": power_sentence, "key_instrument": key_instrument}


def order_rows(accuracy: Mapping[str, np.ndarray], reference: str, mixing: Mapping[str, Mapping],
               entropy: Mapping[str, float]) -> list[dict]:
    """The table of an order experiment: how mixed each order is (label mixing with chapter 12's verdict, class
    entropy per batch), its accuracy, and its paired difference from ``reference``, as trained and after BatchNorm's
    statistics were recomputed (where the experiment did)."""
    rows = []
    for name, values in accuracy.items():
        if name.endswith(RECALIBRATED):
            continue
        row = {"order": name, "label mixing (epoch 1)": mixing_text(mixing, name),
               "classes per batch (entropy, bits)": f"{entropy[name]:.2f}",
               "accuracy, % (range)": spread_text(values),
               f"minus the {reference}, points": ("reference" if name == reference
                                                  else paired_difference(values, accuracy[reference]).text())}
        if name + RECALIBRATED in accuracy and reference + RECALIBRATED in accuracy:
            row["the same, BN recalibrated"] = (
                "reference" if name == reference
                else paired_difference(accuracy[name + RECALIBRATED], accuracy[reference + RECALIBRATED]).text())
        rows.append(row)
    return rows


def _differences(accuracy: Mapping[str, np.ndarray], reference: str, recalibrated: bool = False) -> dict:
    suffix = RECALIBRATED if recalibrated else ""
    return {name: paired_difference(accuracy[name + suffix], accuracy[reference + suffix])
            for name in accuracy if not name.endswith(RECALIBRATED) and name != reference
            and name + suffix in accuracy and reference + suffix in accuracy}


@provides_figures("order_sentence", "norm_sentence", "key_order")
def order_figures(accuracy: Mapping[str, np.ndarray], reference: str, entropy: Mapping[str, float]) -> dict:
    """Which orders cost accuracy (paired verdicts against ``reference``), and how much of it BatchNorm's statistics
    explain: the same models judged again after recalibration."""
    plain = _differences(accuracy, reference)
    lower = [n for n, d in plain.items() if d.clear and d.estimate < 0]
    higher = [n for n, d in plain.items() if d.clear and d.estimate > 0]
    null = [n for n, d in plain.items() if not d.clear]
    parts = []
    if lower:
        parts.append(f"{names_text(lower)} trained clearly less accurate models ("
                     + "; ".join(f"{n}: {plain[n].text()}" for n in lower) + ")")
    if higher:
        parts.append(f"{names_text(higher)} clearly more accurate ones ("
                     + "; ".join(f"{n}: {plain[n].text()}" for n in higher) + ")")
    if null:
        parts.append(f"for {names_text(null)} the seeds show no clear difference ("
                     + "; ".join(f"{n}: {plain[n].text()}" for n in null) + ")")
    order_sentence = f"Against the {reference}, " + "; ".join(parts) + "."

    recal = _differences(accuracy, reference, recalibrated=True)
    if not lower or not recal:
        norm_sentence = ("No order clearly cost accuracy, so there is no cost for BatchNorm's statistics to "
                         "explain." if not lower else "")
        explained = []
    else:
        explained = [n for n in lower if n in recal and not (recal[n].clear and recal[n].estimate < 0)]
        remained = [n for n in lower if n in recal and n not in explained]
        sentences = []
        if explained:
            sentences.append(
                f"Judged again after one shuffled pass recomputed BatchNorm's statistics (no weight changed), "
                f"{names_text(explained)} no longer fell clearly short ("
                + "; ".join(f"{n}: {recal[n].text()}" for n in explained)
                + "): what those orders cost was in the statistics BatchNorm kept of one-class batches, not in "
                  "the weights.")
        if remained:
            sentences.append(
                ("But" if explained else "Judged again after one shuffled pass recomputed BatchNorm's statistics "
                                         "(no weight changed),")
                + f" {names_text(remained)} still fell clearly short ("
                + "; ".join(f"{n}: {recal[n].text()}" for n in remained)
                + "): the order cost the weights themselves, not only BatchNorm's statistics.")
        norm_sentence = " ".join(sentences)
    if lower:
        key_order = (f"here {names_text(lower)} clearly cost accuracy ("
                     + ", ".join(f"{entropy[n]:.2f}" for n in lower)
                     + f" bits of class entropy per batch, against {entropy[reference]:.2f} for the {reference})"
                     + (f"; for {names_text(explained)} recomputing BatchNorm's statistics recovered it" if explained
                        else "") + ".")
    else:
        key_order = "no order here clearly cost accuracy, each null with the smallest difference it could see."
    return {"order_sentence": order_sentence, "norm_sentence": norm_sentence,
            "key_order": key_order[0].upper() + key_order[1:]}


def mds_rows(settings: Mapping[str, Mapping], dataset_size: int) -> list[dict]:
    """What MDS chose for each run (``num_canonical_nodes``, ``shuffle_block_size``) and the share of this set its
    shuffle window covers."""
    return [{"run": name, "num_canonical_nodes": f"{s['num_canonical_nodes']:,}",
             "shuffle_block_size": f"{s['shuffle_block_size']:,}",
             "window over this set": ("all of it" if s["shuffle_block_size"] >= dataset_size
                                      else f"{s['shuffle_block_size'] / dataset_size:.0%}")}
            for name, s in settings.items()]

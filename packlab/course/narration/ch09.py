"""Chapter 9, other packed formats: the sentences that rank the layouts measured side by side.

Every ranking walks down the layouts by median and states each step between neighbours
as :func:`packlab.bench.ranking` judges it: "N× slower than" the layout just above where
:func:`packlab.bench.compare` calls the step clear, "no clear difference from" it where
not. No layout is compared with the best alone, and a run of unclear steps is never
called a tie. A cold figure gets a verdict only where the cold reads were clearly slower
than the warm ones (:func:`packlab.formats.bench.cold_differs`); elsewhere the sentence
says that the cold read was not colder than warm here.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from packlab.bench import Spread, interval_note, ratio_interval, with_note
from packlab.course.prose import names_text, provides_figures
from packlab.formats import bench as formats_bench

ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")


def _factor(factor: float) -> str:
    """``1.07``, ``1.5``, ``12``: two decimals where one would print a clear difference as "1.0" or "1.1"."""
    return f"{factor:.2f}" if factor < 1.1 else f"{factor:.1f}" if factor < 10 else f"{factor:,.0f}"


def _step_note(values: dict[str, Sequence[float]], above: str, name: str, highest: bool = True) -> str:
    """The interval of one step of a ranking, the way its factor reads (``above`` over ``name`` for rates, ``name``
    over ``above`` for times): ``"1.05–1.09x"``, or ``""`` where runs that are not positive give no ratio."""
    better, worse = Spread.of(values[above]), Spread.of(values[name])
    interval = ratio_interval(better, worse) if highest else ratio_interval(worse, better)
    return interval.range_text() if interval is not None else ""


def ranking_sentence(values: dict[str, Sequence[float]], what: str, unit: str = "samples/s", highest: bool = True,
                     digits: int = 0) -> str:
    """One sentence that ranks the layouts for ``what``, best first, each step judged against the neighbour above."""
    median = {name: statistics.median(values[name]) for name in values}
    steps = formats_bench.ranked(values, highest)
    first = steps[0][0]
    head = f"{what}, {'fastest' if highest else 'quickest'} first: {first} {median[first]:,.{digits}f} {unit}"
    if len(steps) == 1:
        return f"{what}: {first} {median[first]:,.{digits}f} {unit}, the only layout measured."
    worse = "slower" if highest else "longer"
    parts = [head]
    for (above, _), (name, clear) in zip(steps, steps[1:]):
        figure = f"{name} {median[name]:,.{digits}f}"
        note = _step_note(values, above, name, highest)
        if clear:
            factor = median[above] / median[name] if highest else median[name] / median[above]
            parts.append(with_note(f"{figure}, {_factor(factor)}× {worse} than {above}", note))
        else:
            parts.append(with_note(f"{figure}, no clear difference from {above}", note))
    sentence = "; ".join(parts) + "."
    if not any(clear for _, clear in steps[1:]):
        sentence += " No step between neighbours was clear."
    return sentence


def standing(values: dict[str, Sequence[float]], name: str) -> str:
    """Where ``name`` stands among ``values`` (higher is better): its rank, and the step from its neighbour above."""
    steps = formats_bench.ranked(values)
    names = [n for n, _ in steps]
    rank = names.index(name)
    median = {n: statistics.median(values[n]) for n in values}
    place = f"{ORDINALS[rank] if rank < len(ORDINALS) else f'number {rank + 1}'} of {len(names)}"

    if rank == 0:
        if len(names) == 1:
            return "the only layout measured"
        below, clear = steps[1]
        note = _step_note(values, name, below)
        if clear:
            ahead = f"clearly ahead of {below}, the next ({_factor(median[name] / median[below])}×" + (
                f", {note})" if note else ")")
        else:
            ahead = with_note(f"not clearly ahead of {below}, the next", note)
        return f"the fastest of {len(names)}, {ahead}"
    above = names[rank - 1]
    note = _step_note(values, above, name)
    if steps[rank][1]:
        factor = _factor(median[above] / median[name])
        return with_note(f"{place}, {factor}× slower than {above}, the next faster", note)
    return with_note(f"{place}, no clear difference from {above}, the next faster", note)


def cold_sentence(results: dict, access: str) -> str:
    """The cold ranking of one access, over the layouts whose cold reads were clearly slower than their warm ones.

    The others are named apart, with no cold verdict: where the cold median was not even
    lower than the warm one, the cold read was not colder than warm here (and the sentence
    says what can cause that); where it was lower but the rounds overlap too much for
    :func:`packlab.bench.compare`, the difference was not clear.
    """
    what = f"{access.capitalize()} reads, cold"
    values = formats_bench.rates(results, access, "cold")
    if not values:
        return f"{what}: not measured on this system."
    colder = formats_bench.cold_differs(results, access)
    cold = {name: statistics.median(values[name]) for name in values}
    warm = {name: statistics.median(results["layouts"][name]["rates"][access]["warm"]) for name in values}
    ranked = {name: values[name] for name in values if colder[name]}
    not_colder = [name for name in values if not colder[name] and cold[name] >= warm[name]]
    unclear = [name for name in values if not colder[name] and cold[name] < warm[name]]

    def pairs(names: list[str]) -> str:
        return ", ".join(f"{name} {cold[name]:,.0f} cold against {warm[name]:,.0f} warm" for name in names)

    parts = [ranking_sentence(ranked, what)] if ranked else [f"{what}: no layout read clearly slower cold than warm."]
    if not_colder:
        them = "them" if len(not_colder) > 1 else "it"
        parts.append(
            f"For {names_text(not_colder)} the cold read was not colder than the warm one here ({pairs(not_colder)} "
            f"samples/s), so no cold verdict is drawn from {them}: a virtual machine's disk cached by its host, or an "
            "SSD that serves small reads quickly, can return pages about as fast as the page cache.")
    if unclear:
        them = "them" if len(unclear) > 1 else "it"
        parts.append(
            f"For {names_text(unclear)} the cold median was lower than the warm one ({pairs(unclear)} samples/s), "
            f"but the rounds overlap too much for a clear difference, so no cold verdict is drawn from {them}"
            + (" either." if not_colder else "."))
    return " ".join(parts)


def residency_text(results: dict) -> str:
    """Whether the cold reads started from the disk, layout by layout, and what they fetched besides their samples."""
    resident = {name: entry["resident"] for name, entry in results["layouts"].items() if entry["resident"]}
    if not resident:
        return "this system cannot drop cached pages, so no read here was cold"
    before = ", ".join(f"{name} {r['before']:.0%}" for name, r in resident.items())
    left = {name: r["after dropping"] for name, r in resident.items()}
    worst = max(left, key=left.get)
    if left[worst] < 0.01:
        text = (f"before the drop, this share of each layout's pages was in the page cache: {before}; after it, "
                "less than 1% of any layout's, so the cold reads started from the disk")
    else:
        text = (f"before the drop, this share of each layout's pages was in the page cache: {before}; after it, "
                f"{worst} still had {left[worst]:.0%} of its pages cached, so its cold figure is partly warm")
    fetched = {name: (r["after the cold read"] - r["after dropping"]) / results["layouts"][name]["cold_read_share"]
               for name, r in resident.items()
               if "after the cold read" in r and results["layouts"][name]["cold_read_share"]}
    if fetched:
        readahead = results.get("readahead_kb")
        limit = f" (up to {readahead:,} KiB at a time on this disk)" if readahead else ""
        text += (". Each first cold read brought into the page cache this multiple of the bytes of the samples "
                 f"it read: {', '.join(f'{name} {_factor(ratio)}×' for name, ratio in fetched.items())}; 1× is the "
                 f"samples alone, the rest is what the reader and the kernel's readahead{limit} fetched around them")
    return text


@provides_figures("random_warm", "random_cold", "random_network_model", "sequential_warm", "sequential_cold",
                  "sequential_network_model", "writing", "size_low", "size_high", "load_before", "load_after", "mean_kb",
                  "measured_samples", "measured_rounds", "cold_level_text", "residency")
def measured_figures(results: dict) -> dict:
    """Every sentence and figure of "Measured side by side", from :func:`packlab.formats.bench.measure_formats`."""
    figures = {}
    for access in formats_bench.ACCESSES:
        for condition in formats_bench.CONDITIONS:
            values = formats_bench.rates(results, access, condition)
            what = f"{access.capitalize()} reads, {condition}"
            name = f"{access}_{condition.replace(' ', '_')}"
            if condition == "cold":
                figures[name] = cold_sentence(results, access)
            else:
                figures[name] = ranking_sentence(values, what) if values else f"{what}: not measured on this system."
    write_times = {name: entry["write_s"] for name, entry in results["layouts"].items()}
    figures["writing"] = ranking_sentence(write_times, "Writing", unit="s", highest=False, digits=2)
    ratios = [entry["allocated"] / results["jpeg_bytes"] for entry in results["layouts"].values()]
    figures.update(
        size_low=f"{min(ratios):.2f}", size_high=f"{max(ratios):.2f}",
        load_before=f"{results['load_average'][0]:.1f}", load_after=f"{results['load_average'][1]:.1f}",
        mean_kb=f"{results['jpeg_bytes'] / results['samples'] / 1e3:.0f}",
        measured_samples=f"{results['samples']:,}", measured_rounds=results["runs"],
        cold_level_text=results["cold"] or "not available on this system",
        residency=residency_text(results),
    )
    return figures


@provides_figures("slice_samples", "read_samples", "read_mb", "random_reads", "read_spacing", "readahead_text")
def plan_figures(write_slice: Sequence, read_set: Sequence, random_reads: int, readahead_kb: int | None) -> dict:
    """What the measurement will write and read, for the prose before it runs."""
    reads = min(random_reads, len(read_set))
    return {
        "slice_samples": f"{len(write_slice):,}",
        "read_samples": f"{len(read_set):,}",
        "read_mb": f"{sum(s.bytes for s in read_set) / 1e6:,.0f}",
        "random_reads": f"{reads:,}",
        "read_spacing": f"{len(read_set) / reads:,.0f}",
        "readahead_text": (f"on this disk {readahead_kb:,} KiB" if readahead_kb
                           else "this system does not say how much"),
    }


def _amount(nbytes: float) -> str:
    """``"8.4 MB"`` or ``"115 kB"``."""
    return f"{nbytes / 1e6:,.1f} MB" if nbytes >= 1e6 else f"{nbytes / 1e3:,.0f} kB"


@provides_figures("record_kb", "fetched_on", "fetched_off", "lmdb_cold_cost")
def readahead_figures(fetched: dict[bool, float], record_bytes: int, results: dict) -> dict:
    """One LMDB record read cold with and without readahead (``fetched``: bytes newly cached, by the
    ``readahead`` setting), and how LMDB's cold random reads compared with the folder's."""
    cold = formats_bench.rates(results, "random", "cold")
    if "lmdb" not in cold or "folder" not in cold:
        cost = "This system measured no cold random reads to compare."
    else:
        lmdb, folder = statistics.median(cold["lmdb"]), statistics.median(cold["folder"])
        note = interval_note(Spread.of(cold["lmdb"]), Spread.of(cold["folder"]))
        pair = f"lmdb {lmdb:,.0f}, folder {folder:,.0f} samples/s" + (f"; lmdb ÷ folder {note}" if note else "")
        valid = formats_bench.cold_differs(results, "random")
        verdict = formats_bench.compare(cold["lmdb"], cold["folder"])
        if not (valid["lmdb"] and valid["folder"]):
            cost = (f"How that compares with the folder, which reads each image with one read call, cold: no verdict "
                    f"here, since the cold reads of one of them were not clearly colder than its warm ones ({pair}).")
        elif verdict == "lower":
            cost = (f"The cold random reads show the price: the folder, which reads each image with one read call, "
                    f"was clearly faster cold than LMDB ({pair}).")
        elif verdict == "higher":
            cost = (f"Even so, LMDB's cold random reads were clearly faster than the folder's, which reads each image "
                    f"with one read call ({pair}).")
        else:
            cost = (f"Cold, LMDB's random reads were not clearly different from the folder's, which reads each image "
                    f"with one read call ({pair}).")
    return {
        "record_kb": f"{record_bytes / 1e3:,.0f}",
        "fetched_on": _amount(fetched[True]),
        "fetched_off": _amount(fetched[False]),
        "lmdb_cold_cost": cost,
    }


@provides_figures("parquet_random", "parquet_sequential", "parquet_gap", "lmdb_random", "lmdb_sequential", "hdf5_random", "npz_vs_zip", "tar_network", "folder_network")
def fit_figures(results: dict) -> dict:
    """The figures of "When each format fits": each format's standing, warm unless said otherwise."""
    random_warm = formats_bench.rates(results, "random", "warm")
    sequential_warm = formats_bench.rates(results, "sequential", "warm")
    parquet_gap = formats_bench.compare(sequential_warm["parquet"], random_warm["parquet"])
    npz_vs_zip = formats_bench.compare(random_warm["npz"], random_warm["zip"])
    parquet_note = interval_note(Spread.of(sequential_warm["parquet"]), Spread.of(random_warm["parquet"]))
    return {
        "parquet_random": f"{statistics.median(random_warm['parquet']):,.0f}",
        "parquet_sequential": f"{statistics.median(sequential_warm['parquet']):,.0f}",
        "parquet_gap": with_note({"higher": "clearly faster in stored order", "lower": "clearly slower in stored order",
                                  "no clear difference": "no clear difference"}[parquet_gap],
                                 f"stored ÷ random order {parquet_note}" if parquet_note else ""),
        "lmdb_random": standing(random_warm, "lmdb"),
        "lmdb_sequential": standing(sequential_warm, "lmdb"),
        "hdf5_random": standing(random_warm, "hdf5"),
        "npz_vs_zip": with_note({"higher": "clearly faster than", "lower": "clearly slower than"}.get(
            npz_vs_zip, "not clearly different from") + " chapter 2's plain zip of the same JPEGs",
            interval_note(Spread.of(random_warm["npz"]), Spread.of(random_warm["zip"]))),
        "tar_network": standing(formats_bench.rates(results, "sequential", "network model"), "tar"),
        "folder_network": standing(formats_bench.rates(results, "random", "network model"), "folder"),
    }

"""Chapter 9, other packed formats: the sentences that rank the layouts measured side by side.

Every verdict comes from :func:`packlab.formats.bench.leaders`, which groups the layouts
that :func:`packlab.bench.compare` cannot tell from the best; a sentence names a group
as one ("no clear difference between them") and gives the others as a factor of the
best median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from packlab.course.prose import names_text, provides_figures
from packlab.formats import bench as formats_bench


def _factor(factor: float) -> str:
    """``1.07``, ``1.5``, ``12``: two decimals where one would print a clear difference as "1.0" or "1.1"."""
    return f"{factor:.2f}" if factor < 1.1 else f"{factor:.1f}" if factor < 10 else f"{factor:,.0f}"


def ranking_sentence(values: dict[str, Sequence[float]], what: str, unit: str = "samples/s", highest: bool = True,
                     digits: int = 0) -> str:
    """One sentence that names the best layout(s) for ``what`` and how far behind the others were."""
    tied, rest = formats_bench.leaders(values, highest)
    median = {name: statistics.median(values[name]) for name in values}

    def figure(name: str) -> str:
        return f"{name} {median[name]:,.{digits}f} {unit}"

    best_word, worse_word = ("fastest", "slower") if highest else ("quickest", "longer")
    if not rest and len(tied) > 1:
        low, high = min(median.values()), max(median.values())
        return (f"{what}: no clear difference between any of the {len(tied)} layouts "
                f"(medians from {low:,.{digits}f} to {high:,.{digits}f} {unit}).")
    if len(tied) == 1:
        head = f"{what}, {tied[0]} was {best_word} ({figure(tied[0])})"
    else:
        head = (f"{what}, {names_text(tied)} were {best_word}, with no clear difference between them "
                f"({', '.join(figure(n) for n in tied)})")
    best = median[tied[0]]
    factors = [(name, best / median[name] if highest else median[name] / best) for name in rest]
    return head + "; " + ", ".join(f"{name} {_factor(f)}× {worse_word}" for name, f in factors) + "."


def standing(values: dict[str, Sequence[float]], name: str) -> str:
    """Where ``name`` stands among ``values`` (higher is better): with the fastest, or how many times slower."""
    tied, _ = formats_bench.leaders(values)
    if name in tied:
        others = [n for n in tied if n != name]
        return "among the fastest" + (f" (no clear difference from {names_text(others)})" if others else "")
    best = tied[0]
    return f"{_factor(statistics.median(values[best]) / statistics.median(values[name]))}× slower than {best}"


def residency_text(results: dict) -> str:
    """Whether the cold reads started from disk: the layouts' page-cache residency before and after dropping."""
    resident = {name: entry["resident"] for name, entry in results["layouts"].items() if entry["resident"]}
    if not resident:
        return "this system cannot drop cached pages, so no read here was cold"
    left = {name: r["after dropping"] for name, r in resident.items()}
    worst = max(left, key=left.get)
    before = min(r["before"] for r in resident.values())
    if left[worst] < 0.01:
        return (f"every layout's files were at least {before:.0%} in the page cache before and less than 1 % after "
                "the caches were dropped: the cold reads started from the disk")
    return (f"after the caches were dropped, {worst} still had {left[worst]:.0%} of its pages cached, so its cold "
            "figure is partly warm")


@provides_figures("random_warm", "random_cold", "random_network_model", "sequential_warm", "sequential_cold", "sequential_network_model", "writing", "size_low", "size_high", "load_before", "load_after", "mean_kb", "measured_samples", "measured_rounds", "cold_level_text", "residency")
def measured_figures(results: dict) -> dict:
    """Every sentence and figure of "Measured side by side", from :func:`packlab.formats.bench.measure_formats`."""
    figures = {}
    for access in formats_bench.ACCESSES:
        for condition in formats_bench.CONDITIONS:
            values = formats_bench.rates(results, access, condition)
            what = f"{access.capitalize()} reads, {condition}"
            figures[f"{access}_{condition.replace(' ', '_')}"] = (
                ranking_sentence(values, what) if values else f"{what}: not measured on this system.")
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


@provides_figures("parquet_random", "parquet_sequential", "parquet_gap", "lmdb_random", "lmdb_sequential", "hdf5_random", "npz_vs_zip", "tar_network", "folder_network")
def fit_figures(results: dict) -> dict:
    """The figures of "When each format fits": each format's standing, warm unless said otherwise."""
    random_warm = formats_bench.rates(results, "random", "warm")
    sequential_warm = formats_bench.rates(results, "sequential", "warm")
    parquet_gap = formats_bench.compare(sequential_warm["parquet"], random_warm["parquet"])
    npz_vs_zip = formats_bench.compare(random_warm["npz"], random_warm["zip"])
    return {
        "parquet_random": f"{statistics.median(random_warm['parquet']):,.0f}",
        "parquet_sequential": f"{statistics.median(sequential_warm['parquet']):,.0f}",
        "parquet_gap": {"higher": "clearly faster in stored order", "lower": "clearly slower in stored order",
                        "no clear difference": "no clear difference"}[parquet_gap],
        "lmdb_random": standing(random_warm, "lmdb"),
        "lmdb_sequential": standing(sequential_warm, "lmdb"),
        "hdf5_random": standing(random_warm, "hdf5"),
        "npz_vs_zip": {"higher": "faster than", "lower": "slower than"}.get(npz_vs_zip, "not clearly different from"),
        "tar_network": standing(formats_bench.rates(results, "sequential", "network model"), "tar"),
        "folder_network": standing(formats_bench.rates(results, "random", "network model"), "folder"),
    }

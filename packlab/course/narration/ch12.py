"""Chapter 12 (training-grade loading): the words that follow its measurements."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from packlab.class_mixing import band_decimals


def exactly_once(first: Sequence[str], rest: Sequence[str], expected: int) -> str:
    """'every one of the N samples exactly once' or what went wrong, for two parts of an epoch."""
    counts = Counter(list(first) + list(rest))
    twice = sum(1 for n in counts.values() if n > 1)
    missing = expected - len(counts)
    if not twice and not missing:
        return f"every one of the {expected:,} samples exactly once"
    return f"{twice} samples twice and {missing} missing: the resume is wrong"


def same_order(resumed: Sequence[str], uninterrupted: Sequence[str]) -> str:
    """Whether a resumed epoch came in the uninterrupted order, and if not from where it differs."""
    if list(resumed) == list(uninterrupted):
        return "in exactly the order of the uninterrupted epoch"
    first = next((i for i, (a, b) in enumerate(zip(resumed, uninterrupted)) if a != b), min(len(resumed), len(uninterrupted)))
    return f"in another order than the uninterrupted epoch (from sample {first:,} on)"


def per_key_table(costs: Mapping[str, float], keys: int, workers: Sequence[int]) -> list[dict]:
    """Rows: storage, measured bytes per key and worker, and what that is for ``keys`` keys and each worker count."""
    rows = []
    for storage, cost in costs.items():
        row = {"index kept as": storage, "bytes per key and worker": f"{cost:.0f}"}
        for count in workers:
            row[f"{keys / 1e6:.2f} M keys, {count} workers"] = f"{cost * keys * count / 1e9:.2f} GB"
        rows.append(row)
    return rows


def limit_rows(results: Sequence[Mapping]) -> list[dict]:
    """One row per tried configuration: what was changed, what it needs, what happened and how long it took."""
    import re

    rows = []
    for r in results:
        # torch names its temporary file (</torch_1234_5678_0>): the name says nothing, the reason does
        outcome = "worked" if r["ok"] else re.sub(r"</?torch_[^>]*>", "<file>", r["error"].split(": ", 1)[-1])[:110]
        row = {"configuration": r["label"], "/dev/shm": f"{r.get('shm_mb', 0):.0f} MB",
               "estimate (bound)": f"{r.get('needed_mb', 0):.0f} ({r.get('bound_mb', 0):.0f}) MB", "outcome": outcome,
               "seconds": "" if r.get("seconds") is None else f"{r['seconds']:.2f}"}
        if "bound_mb" not in r:  # the open-files rows: /dev/shm is not what they try
            row.pop("estimate (bound)")
        rows.append(row)
    return rows


def shm_verdicts(results: Sequence[Mapping]) -> str:
    """Whether the estimate agreed with each outcome: fits where it worked, too small where it failed."""
    agree = [r["label"] for r in results if r["ok"] == (r["needed_mb"] <= r["shm_mb"])]
    disagree = [r["label"] for r in results if r["ok"] != (r["needed_mb"] <= r["shm_mb"])]
    if not disagree:
        return f"the estimate agreed with the outcome in all {len(agree)} configurations"
    return f"the estimate disagreed with the outcome for {', '.join(disagree)}"


def guarantee_rows(findings: Mapping[str, Mapping[str, bool]]) -> list[dict]:
    """One row per randomness source: which of the four guarantees held (yes / no)."""
    def yes(value: bool) -> str:
        return "yes" if value else "no"

    return [{"randomness from": source, "workers draw differently": yes(f["differ"]),
             "same run, same crops": yes(f["repeat"]), "same crops with 3 workers as with 2": yes(f["workers"]),
             "resumed mid-epoch: same crops": yes(f["resumed"])}
            for source, f in findings.items()]


def resume_sources(findings: Mapping[str, Mapping[str, bool]]) -> str:
    """The randomness sources whose crops survived a resume, as a clause."""
    kept = [source for source, f in findings.items() if f["resumed"]]
    lost = [source for source, f in findings.items() if not f["resumed"]]
    if not kept:
        return "no source kept its crops across the resume"
    return (f"only {' and '.join(repr(k) for k in kept)} kept the uninterrupted run's crops after the resume"
            + (f"; {', '.join(repr(k) for k in lost)} did not" if lost else ""))


def megabytes(value: float) -> str:
    """Bytes as MB (or GB from 10 GB on), for the prose."""
    return f"{value / 1e9:.0f} GB" if value >= 10e9 else f"{value / 1e9:.1f} GB" if value >= 1e9 else f"{value / 1e6:.1f} MB"


def reread_rows(measured: Mapping[str, Mapping[str, float]]) -> list[dict]:
    """One row per way of resuming: bytes read before the first new sample, requests, shards opened."""
    return [{"resume": name, "bytes read": megabytes(m["bytes"]), "requests": f"{m['requests']:.0f}",
             "of which the buffered samples' own": megabytes(m["needed"])} for name, m in measured.items()]


def mixing_decimals(verdicts: Mapping[str, Mapping]) -> int:
    """The decimals that print every distance on the same side of the printed band top as its verdict."""
    top = verdicts["random permutation"]["band_top"]
    return band_decimals([v["mixing"] for n, v in verdicts.items() if n != "random permutation"], top)


def mixing_rows(verdicts: Mapping[str, Mapping]) -> list[dict]:
    """One row per order: its mixing distance, how many times a random permutation's, and the verdict.

    The distances and the band's top share :func:`mixing_decimals`, so a "not mixed" row
    never prints the same number as the top it exceeds."""
    decimals = mixing_decimals(verdicts)
    rows = []
    for name, v in verdicts.items():
        if name == "random permutation":
            verdict = f"{100 * v['band_level']:.0f} % of permutations at most {v['band_top']:.{decimals}f}"
        elif name == "as written":
            verdict = "the class-sorted order itself"
        else:
            verdict = "mixed like a random permutation" if v["mixes_like_a_permutation"] else "not mixed"
        rows.append({"order": name, "mixing distance": f"{v['mixing']:.{decimals}f}",
                     "x a random permutation": "" if "times" not in v else f"{v['times']:.2f}", "verdict": verdict})
    return rows


def mixing_summary(verdicts: Mapping[str, Mapping]) -> str:
    """Which readers mixed the class-sorted data like a random permutation, and which did not, as one clause."""
    readers = {n: v for n, v in verdicts.items() if n not in ("random permutation", "as written")}
    good = [n for n, v in readers.items() if v["mixes_like_a_permutation"]]
    decimals, top = mixing_decimals(verdicts), verdicts["random permutation"]["band_top"]
    bad = [f"{n} ({v['mixing']:.{decimals}f}, above the band's {top:.{decimals}f}; {v['times']:.2f} times a "
           "permutation's median distance)" for n, v in readers.items() if not v["mixes_like_a_permutation"]]
    parts = []
    if good:
        parts.append(f"mixed like a random permutation: {', '.join(good)}")
    if bad:
        parts.append(f"not mixed: {', '.join(bad)}")
    return "; ".join(parts)

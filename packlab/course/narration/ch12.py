"""Chapter 12 (training-grade loading): the words that follow its measurements."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence


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
        rows.append({"configuration": r["label"], "/dev/shm": f"{r.get('shm_mb', 0):.0f} MB",
                     "needed (estimate)": f"{r.get('needed_mb', 0):.0f} MB", "outcome": outcome,
                     "seconds": "" if r.get("seconds") is None else f"{r['seconds']:.2f}"})
    return rows


def guarantee_rows(findings: Mapping[str, Mapping[str, bool]]) -> list[dict]:
    """One row per randomness source: which of the three guarantees held (yes / no)."""
    def yes(value: bool) -> str:
        return "yes" if value else "no"

    return [{"randomness from": source, "workers draw differently": yes(f["differ"]),
             "same run, same crops": yes(f["repeat"]), "same crops with 3 workers as with 2": yes(f["workers"])}
            for source, f in findings.items()]


def mixing_words(ours: float, peers: Mapping[str, float], perfect: float) -> str:
    """Label mixing of each reader against a perfect shuffle (lower is better mixed), as one clause."""
    parts = [f"{name} {value:.2f}" for name, value in {"ours": ours, **peers}.items()]
    return ", ".join(parts) + f" (a random permutation: {perfect:.2f})"

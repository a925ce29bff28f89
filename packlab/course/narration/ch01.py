"""Sentences of chapter 1, "One JPEG per sample", built from what its cells measured.

Each function takes the chapter's spreads (``packlab.bench.Spread``) and returns a clause
whose wording follows :func:`packlab.bench.compare`: "clearly" only where it says so.
"""

from __future__ import annotations

from packlab.bench import Spread, chance_of_split, compare, interval_note, verdict, with_note
from packlab.course.prose import names_text


def workers_verdict(two: Spread, zero: Spread) -> str:
    """Two workers against ``num_workers=0`` (images/s), for "...: 1.45 times the median; <this>"."""
    return verdict(two, zero,
                   "by the course's rule a clear gain",
                   "by the course's rule the workers were clearly slower",
                   "by the course's rule no clear difference", interval=True)


def two_workers_cores(cores: int) -> str:
    """What two workers can use of this machine's ``cores``, and whether more workers could add speed."""
    if cores <= 2:
        here = "the one core here" if cores == 1 else "both cores here"
        return (f"Two workers can at best keep {here} busy, and the work is CPU-bound, as a later section shows, so "
                "more workers than cores cannot add much.")
    return (f"Two workers keep at most two of the {cores} cores here busy; the work is CPU-bound, as a later "
            "section shows, so more workers can add speed up to about one per core.")


def same_loader_verdict(a: Spread, b: Spread) -> str:
    """The A/A comparison: one loader under two names; "`compare` says <this>"."""
    direction = compare(a, b)
    note = interval_note(a, b)
    if direction == 0:
        return with_note("no clear difference", note) + ", as it should: both rows are one loader"
    return (f"a clear difference (A {'higher' if direction > 0 else 'lower'}; {note}), although both rows are one "
            "loader: "
            "this build hit one of the rare runs (at most 1 in 50 for equal contenders, by design) in which the "
            "noise fools the rule")


def split_chance(a: Spread, b: Spread) -> str:
    """The rank test's chance that two equal contenders split at least as unevenly as ``a`` and ``b``."""
    return f"{chance_of_split(a.values, b.values):.2f}"


def simulation_sentence(results: dict) -> str:
    """What the chapter's simulation showed: ``results`` maps each rule's name (the old rule first) to
    ``(share of equal pairs called different, share of 1.3-fold pairs found)``."""
    (old_name, (old_false, old_found)), *course = results.items()
    course_false = " and ".join(f"{100 * false:.1f} %" for _, (false, _) in course)
    course_found = " and ".join(f"{100 * found:.0f} %" for _, (_, found) in course)
    counts = " and ".join(name.split(":")[1].split(",")[0].strip() for name, _ in course)
    return (f"With equal contenders the old rule called {100 * old_false:.1f} % of the pairs different, and `compare` "
            f"with {counts} {course_false}; the old rule found a real 1.3-fold difference {100 * old_found:.0f} % of "
            f"the time, `compare` {course_found}")


def lost_pairs_chance(runs: int, lost: int) -> float:
    """The rank test's chance for ``runs`` runs each, when the faster contender lost ``lost`` of the pairs."""
    faster = [runs + i for i in range(runs)]
    faster[0] = runs - 1 - lost + 0.5  # its slowest run now loses to exactly ``lost`` of the other's runs
    return chance_of_split(faster, list(range(runs)))


def few_runs_sentence(bound: float = 0.02) -> str:
    """Why four runs each can never be called clear, and how many lost pairs five and six runs may afford."""
    sweep4 = lost_pairs_chance(4, 0)

    def affordable(runs: int) -> int:
        lost = 0
        while lost_pairs_chance(runs, lost + 1) <= bound:
            lost += 1
        return lost

    five, six = affordable(5), affordable(6)
    return (f"With four runs each, even a clean sweep (A winning all 16 pairs) happens to equal contenders "
            f"{100 * sweep4:.1f} % of the time, above the {100 * bound:.0f} % bound, so four runs can never be called "
            f"clear. Five runs each may lose {five} of their 25 pairs (a chance of "
            f"{100 * lost_pairs_chance(5, five):.1f} %), six may lose {six} of their 36 "
            f"({100 * lost_pairs_chance(6, six):.1f} %).")


def position_sentence(fixed: dict[str, Spread], balanced: dict[str, Spread]) -> str:
    """The same loader as A and B, with A always first (``fixed``) and counterbalanced (``balanced``)."""

    def said(pair: dict[str, Spread]) -> str:
        direction = compare(pair["A"], pair["B"])
        ratio = pair["A"].median / pair["B"].median
        note = interval_note(pair["A"], pair["B"])
        if direction == 0:
            return f"A's median was {ratio:.3f} times B's and `compare` saw no clear difference (A ÷ B {note})"
        return (f"A's median was {ratio:.3f} times B's and `compare` called A clearly "
                f"{'faster' if direction > 0 else 'slower'} (A ÷ B {note}), although both are one loader")

    return (f"With A always first, {said(fixed)}; taking the first place in turn, {said(balanced)}. With A always "
            "first, A ÷ B is what the first place of a round cost or gained on this machine, plus noise.")


def position_simulation_sentence(rates: dict, bound: float, trials: int = 2000) -> str:
    """The position simulation: ``rates[order][penalty]`` holds ``verdict_rates``' shares over ``trials`` each."""
    largest = max(next(iter(rates.values())))
    parts = []
    for order, by_penalty in rates.items():
        false = by_penalty[largest]["equal called different"]
        found = by_penalty[largest]["1.3x found"]
        keeps = "within" if false <= bound else "beyond"
        parts.append(f"{order} {100 * false:.1f} % ({keeps} the {100 * bound:.0f} % bound; a real 1.3-fold "
                     f"difference found {100 * found:.0f} %)")
    base = ""
    if all(0.0 in by_penalty for by_penalty in rates.values()):
        none = [by_penalty[0.0]["equal called different"] for by_penalty in rates.values()]
        margin = 2 * (bound * (1 - bound) / trials) ** 0.5  # two standard errors of a share near the bound
        where = ("at or under the bound, give or take the simulation's own chance variation"
                 if max(none) <= bound + margin else "above the bound by more than the simulation's chance variation")
        base = (f" Without a penalty the orders gave {names_text(f'{100 * v:.1f} %' for v in none)}: {where} "
                f"(about ±{100 * margin:.1f} points over {trials:,} comparisons).")
    balanced = rates.get("balanced")
    if balanced and 0.0 in balanced and balanced[largest]["1.3x found"] < balanced[0.0]["1.3x found"]:
        base += (" Balancing cannot take the penalty away: it hands it to every contender alike, which widens each "
                 f"one's range, so a real difference was found less often ({100 * balanced[largest]['1.3x found']:.0f} "
                 f"% against {100 * balanced[0.0]['1.3x found']:.0f} % without a penalty).")
    return (f"With the first run of each round {100 * largest:.0f} % slower, equal contenders were called different: "
            + "; ".join(parts) + "." + base)


#: The course's tests: a call to any of them draws a verdict that can come out "clear" (or "not mixed") by
#: chance. Besides the rank test's functions, chapter 12's and 13's test of mixing against random permutations.
VERDICT_FUNCTIONS = ("compare", "verdict", "ratio_words", "ranking", "leaders", "mixing_verdicts",
                     "permutation_band")


def _called_names(node) -> set[str]:
    import ast

    return {getattr(call.func, "attr", getattr(call.func, "id", None)) for call in ast.walk(node)
            if isinstance(call, ast.Call)}


def verdict_sites(root) -> dict[str, int]:
    """``{chapter: calls}``: the places in each chapter's code cells that draw a verdict.

    A call draws a verdict when it calls one of :data:`VERDICT_FUNCTIONS`, or a function of
    the narration modules or of ``packlab`` that calls one, directly or through others. A
    static count: a call inside a loop counts once, though it runs once per pass, and a
    helper that compares several pairs counts once.
    """
    import ast
    import re
    from pathlib import Path

    root = Path(root)
    definitions: dict[str, set[str]] = {}
    for module in [*(root / "packlab" / "course" / "narration").glob("ch*.py"), *(root / "packlab").rglob("*.py")]:
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.FunctionDef):
                definitions.setdefault(node.name, set()).update(_called_names(node))
    verdicts = set(VERDICT_FUNCTIONS)
    while True:  # every function that reaches a verdict function
        more = {name for name, calls in definitions.items() if calls & verdicts} - verdicts
        if not more:
            break
        verdicts |= more
    counts = {}
    for chapter in sorted((root / "chapters").glob("[0-9]*.md")):
        cells = re.findall(r"```\{code-cell\}[^\n]*\n(.*?)```", chapter.read_text(), flags=re.S)
        count = 0
        for cell in cells:
            code = re.sub(r"^---\n.*?\n---\n", "", cell, flags=re.S)
            try:
                tree = ast.parse(code)
            except SyntaxError:  # IPython magics: such a cell draws no verdict in this course
                continue
            count += sum(1 for call in ast.walk(tree) if isinstance(call, ast.Call)
                         and getattr(call.func, "attr", getattr(call.func, "id", None)) in verdicts)
        counts[chapter.name] = count
    return counts


def outlier_sentence(rates: dict[str, dict], bound: float, trials: int) -> str:
    """The outlier simulation: ``rates[label]`` is ``verdict_rates``' result for the rounds ``label`` names
    (``"6 rounds"``, ...), with one run in six slow; the first label is the default, the last the cheap rounds."""
    (few, few_rates), *_, (many, many_rates) = rates.items()
    found_few, found_many = few_rates["1.3x found"], many_rates["1.3x found"]
    false = names_text(f"{100 * r['equal called different']:.1f} % at {label}" for label, r in rates.items())
    margin = 2 * (bound * (1 - bound) / trials) ** 0.5  # two standard errors of a share near the bound
    keeps = all(r["equal called different"] <= bound + margin for r in rates.values())
    held = names_text(f"{100 * r['interval held the ratio']:.1f} %" for r in rates.values())
    return (f"At {few} a real 1.3-fold difference was found in {100 * found_few:.0f} % of {trials:,} comparisons, "
            f"at {many} in {100 * found_many:.0f} %. Equal contenders were called different {false}: "
            + ("within" if keeps else "beyond")
            + f" the {100 * bound:.0f} % bound, give or take the simulation's own chance variation (about "
            f"±{100 * margin:.1f} points). The interval beside each verdict held the true ratio of 1.3 in "
            f"{held} of the comparisons")


def multiplicity_sentence(sites: dict[str, int], bound: float) -> str:
    """How many verdicts the book draws, and how many false "clear" calls to expect among them."""
    total = sum(sites.values())
    return (f"The chapters' code draws a verdict at {total} places, directly or through the functions that write "
            f"their sentences, several of them in loops or in helpers that compare more than one pair, so one build "
            f"of the book makes more than {total} verdicts. Where the compared contenders do not really differ, each verdict may come "
            f"out “clear” (or, for an order that mixes like a random permutation, “not mixed”) with a chance of up to "
            f"{100 * bound:.0f} %: if none of the differences compared at those "
            f"{total} places were real, about {total * bound:.1f} false “clear” calls would still be expected, and "
            f"more over the verdicts the loops add.")


def per_batch_sentence(b1: Spread, big: Spread, images: int, big_size: int) -> str:
    """Batches of one image against batches of ``big_size`` (images/s) over ``images`` images."""
    direction = compare(b1, big)
    if direction == -1:
        extra_batches = images - -(-images // big_size)
        per_batch_ms = (images / b1.median - images / big.median) / extra_batches * 1e3
        return (f"batches of one were clearly slower ({interval_note(b1, big)}), and taken at face value the "
                f"difference between the medians "
                f"comes to {per_batch_ms:.2f} ms of wall-clock time per extra batch")
    if direction == 0:
        return (f"by the course's rule the two rows are not clearly different ({interval_note(b1, big)}), so these "
                "runs cannot put a number on the cost per batch")
    return (f"batches of one were clearly faster here ({interval_note(b1, big)}), the opposite of what a fixed cost "
            "per batch predicts, so these runs cannot put a number on it")


def gap_sentence(gap_seconds: float) -> str:
    """The loader's time per image against the sum of its stages (positive: the loader took longer)."""
    if gap_seconds > 0:
        return (f"The loader took {gap_seconds * 1e3:.2f} ms more per image than its stages add up to. That gap is "
                "what the stages leave out (the loader's own work per sample and per batch, memory allocated afresh "
                "for every batch, reading the files in shuffled rather than sequential order) plus whatever else the "
                "machine was doing at either moment.")
    return ("Here the loader was no slower than the sum of its stages, so what the stages leave out (the loader's "
            "own work per sample and per batch) was lost in the variation between moments.")


def order_verdict(float_first: Spread, uint8_first: Spread) -> str:
    """Resizing float against resizing uint8 (µs per image: higher is slower)."""
    return verdict(float_first, uint8_first,
                   "by the course's rule clearly slower",
                   "the float path was clearly faster",
                   "by the course's rule no clear difference", interval=True)


def pil_sentence(pil: Spread, torch_uint8: Spread, loader_ms: float) -> str:
    """The course's Pillow resize against torch's uint8 path (µs per image), and what switching would save
    of the ``loader_ms`` milliseconds per image the single-process loader took."""
    direction = compare(pil, torch_uint8)
    if direction == 1:
        saving_ms = (pil.median - torch_uint8.median) / 1e3
        return (f"clearly slower, {pil.median / torch_uint8.median:.2f} times as slow as torch's `uint8` path here "
                f"({interval_note(pil, torch_uint8, estimate=False)}). "
                "Resizing with "
                f"torch's `uint8` path instead would save about {saving_ms:.2f} ms of the {loader_ms:.2f} ms per "
                f"image that the `num_workers=0` loader took above ({100 * saving_ms / loader_ms:.0f} %)")
    if direction == 0:
        return (f"by the course's rule not clearly different from torch's `uint8` path here "
                f"({interval_note(pil, torch_uint8)}), so switching would not save measurable time on this machine")
    return (f"clearly faster than torch's `uint8` path here ({torch_uint8.median / pil.median:.2f} times; Pillow ÷ "
            f"torch {interval_note(pil, torch_uint8)}), so on this machine the course's choice costs nothing")


def threads_sentence(default_pool: Spread, one_thread: Spread) -> str:
    """``num_workers=0`` with torch's default thread pool against one thread (images/s)."""
    return verdict(
        default_pool, one_thread,
        "Here the default pool was clearly faster: the conversion and the stacking ran on every core, which nothing "
        "else in this process was using.",
        "Here the default pool was clearly slower: splitting operations this small across threads costs "
        "synchronisation, and threads that wait for each other lose more than they gain.",
        "By the course's rule that is no clear difference either way: the operations torch could split are a small "
        "part of each image's time.", interval=True)

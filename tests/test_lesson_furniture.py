"""Lesson furniture: what every chapter opens and ends with, and figures a room can read.

* **Chapters** (counted in the MyST sources): an ``{admonition} Objectives``, an
  ``{admonition} Key points`` and at least two ``{admonition} Predict`` prompts each, in
  the forms the project's conventions give (they render in the book and in
  jupyterlab-myst), and a ``caption=`` on every figure a chapter draws with
  :mod:`packlab.plots`.
* **Figures** (every ``plot_*`` function of :mod:`packlab.plots`, drawn with made-up
  values): no text smaller than 10 pt (titles, tick labels, bar labels, legends and
  captions included), every colour from the palette or a neutral grey, lines with
  markers, bars of different groups with different hatching, and a caption that shows.
"""

from __future__ import annotations

import inspect
import re

import matplotlib.pyplot as plt
import pytest
from matplotlib.collections import Collection
from matplotlib.colors import to_hex, to_rgba
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.text import Text

from packlab import paths, plots
from packlab.bench import BenchResult, Spread

ROOT = paths.repo_root()
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9]*.md"))
MIN_PT = 10


# ------------------------------------------------------------------------------ chapters


def admonitions(text: str, title: str) -> int:
    """How many ``{admonition} <title>`` directives the MyST text holds (fences of 3 or more backticks or colons)."""
    return len(re.findall(rf"(?m)^(?:`{{3,}}|:{{3,}})\{{admonition\}} {re.escape(title)}\s*$", text))


def test_admonitions_are_counted_as_the_conventions_write_them():
    text = "```{admonition} Objectives\n:class: tip\n- a\n```\n\n````{admonition} Predict\nx\n````\n" \
           "```{admonition} Predicting\n```\n:::{admonition} Predict\n:::\n"
    assert (admonitions(text, "Objectives"), admonitions(text, "Predict"), admonitions(text, "Key points")) == (1, 2, 0)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_chapter_has_objectives_key_points_predictions_and_captions(chapter):
    text = chapter.read_text()
    counts = {title: admonitions(text, title) for title in ("Objectives", "Key points", "Predict")}
    assert counts["Objectives"] == 1 and counts["Key points"] == 1 and counts["Predict"] >= 2, counts
    uncaptioned = [m.group(0) for m in re.finditer(r"plots\.plot_\w+\((?:[^()]|\([^()]*\))*\)", text, re.S)
                   if "caption=" not in m.group(0)]
    assert not uncaptioned, f"figures without a caption: {[u[:60] for u in uncaptioned]}"


def checkpoint_names(text: str) -> list[str]:
    """The names a chapter passes to ``checkpoint(...)``, in order."""
    return re.findall(r'^checkpoint\("([^"]+)"\)', text, re.M)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_chapter_tells_the_class_board_when_an_attendee_reaches_its_end(chapter):
    """The board's checkpoint columns: one per chapter, named after it, in its last cell (hidden in the book)."""
    text = chapter.read_text()
    names = checkpoint_names(text)
    assert f"ch{chapter.name[:2]}-end" in names, names
    assert len(names) == len(set(names)), names
    last_cell = text.rsplit("```{code-cell}", 1)[-1]
    assert f'checkpoint("ch{chapter.name[:2]}-end")' in last_cell and "remove-input" in last_cell


def test_the_checkpoint_rule_can_fail():
    assert checkpoint_names('x\ncheckpoint("ch07-end")\n  checkpoint("no")\n') == ["ch07-end"]
    assert checkpoint_names("no checkpoint here") == []


def try_its(text: str) -> list[str]:
    """The bodies of a chapter's ``{admonition} Try it`` directives."""
    return re.findall(r"(?ms)^```\{admonition\} Try it\s*\n(.*?)^```", text)


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_every_try_it_is_done_in_the_chapters_console_never_in_its_cells(chapter):
    """An edit to a chapter, even a new cell, is saved into the tracked .md file, and the next update meets it.

    So a "Try it" that sends the reader to a cell says to copy it into the chapter's
    console (*New Console for Notebook*: the same kernel, nothing saved into the chapter),
    never into a new cell, and never "change ... in the cell above and run it again".
    """
    for body in try_its(chapter.read_text()):
        flat = " ".join(body.split())
        rerun = re.search(r"\bagain\b", flat) and "this chapter again" not in flat  # not: the whole chapter elsewhere
        if re.search(r"\bcells?\b", flat) or rerun:
            assert "console" in flat, f"this Try it changes the chapter itself instead of its console: {flat[:160]}"
        assert not re.search(r"new cells?|cells? below", flat, re.I), f"this Try it adds cells to the chapter: {flat[:160]}"
        for in_place in (r"in the cell above and run it again", r"run (?:that|the) cell again", r"rerun the"):
            assert not re.search(in_place, flat), f"this Try it edits the chapter in place: {flat[:160]}"


def test_the_try_it_rule_can_fail():
    edited = "```{admonition} Try it\n:class: seealso\nSet `x=2` in the cell above and run it again.\n```\n"
    (body,) = try_its(edited)
    assert "cell" in body and "console" not in body
    (added,) = try_its("```{admonition} Try it\nCopy the cell above into a new cell below and run it.\n```\n")
    assert re.search(r"new cells?|cells? below", added)


# ------------------------------------------------------------------------------- figures


@pytest.fixture(scope="module")
def figures(tmp_path_factory):
    """Every plot_* function of packlab.plots, drawn with made-up values and a caption."""
    from packlab import data

    root = tmp_path_factory.mktemp("furniture-data")
    data.generate(root, count=40, seed=3, workers=1, progress=False)
    manifest = data.load_manifest(root)
    sorted_labels = [i // 30 for i in range(300)]
    shuffled = [(i * 7) % 10 for i in range(300)]
    arguments = {
        "plot_sample_grid": dict(root=root, per_class=2),
        "plot_size_histograms": dict(samples=manifest),
        "plot_throughput_vs_workers": dict(series={"folder": {0: 100, 1: 180, 2: 300}, "zip": {0: 110, 2: 320}},
                                           ceiling=400, title="a title"),
        "plot_bench_bars": dict(results=[BenchResult("a", [1.0], 100, 0.1), BenchResult("b", [2.0], 100, 0.1)],
                                title="a title"),
        "plot_rates_with_ranges": dict(rows=[{"name": "ours", "median": 500, "low": 480, "high": 530, "group": "ours"},
                                             {"name": "peer", "median": 400, "low": 390, "high": 420, "group": "peer"}],
                                       lines={"parallel ceiling": 700}, title="a title"),
        "plot_label_sequence": dict(sequences={"class-sorted shards": sorted_labels, "shuffled first": shuffled}),
        "plot_label_counts": dict(sequences={"class-sorted shards": sorted_labels, "shuffled first": shuffled}),
        "plot_shuffle_quality": dict(series={"sorted": {1: 0.9, 10: 0.8, 100: 0.5}, "shuffled": {1: 0.2, 10: 0.2, 100: 0.2}},
                                     reference=0.19),
        "plot_stage_costs": dict(stages={"open": 20e-6, "read": 30e-6, "decode": 2e-3, "resize": 5e-4}, title="a title"),
        "plot_step_timeline": dict(timelines={"no workers": [(0.02, 0.01)] * 5, "2 workers": [(0.001, 0.01)] * 5},
                                   title="a title"),
        "plot_small_file_penalty": dict(penalty={"workers": 2, "cold_level": "data pages",
                                                 "cold_files_per_s": {f"{n}_{s}": v for n in ("folder", "zip", "tar")
                                                                      for s, v in (("warm", 9000), ("cold", 3000))},
                                                 "modelled_files_per_s": {"folder": 400, "zip": 8000, "tar": 9000},
                                                 "predicted_files_per_s": {"folder": 450}}),
        "plot_decomposition": dict(cells={("one file per image", "JPEG: decode + resize"): Spread.of([300, 310, 290]),
                                          ("one file per image", "raw pixels: no decode"): Spread.of([1500, 1400, 1550]),
                                          ("one zip", "JPEG: decode + resize"): Spread.of([305, 300, 315]),
                                          ("one zip", "raw pixels: no decode"): Spread.of([1300, 1250, 1350])},
                                   title="a title"),
        "plot_storage_tradeoff": dict(rows=[{"name": "JPEG, ImageNet size", "kb": 110, "median": 2500, "low": 2400,
                                              "high": 2600, "psnr": float("inf")},
                                             {"name": "JPEG at 256 px", "kb": 25, "median": 600, "low": 580, "high": 650,
                                              "psnr": 42.0}], title="a title"),
        "plot_worker_memory": dict(series={
            "a list of keys": [{"worker": w, "fraction": f, "uss_growth": 1e6 * (w + 1) * f} for w in (0, 1) for f in (0.1, 0.5, 1.0)],
            "a numpy array": [{"worker": w, "fraction": f, "uss_growth": 1e5 * f} for w in (0, 1) for f in (0.1, 0.5, 1.0)],
        }),
        "plot_verdict_rates": dict(rates={"fixed": {0.06: {"equal called different": 0.12},
                                                      0.15: {"equal called different": 0.34}},
                                            "balanced": {0.06: {"equal called different": 0.004},
                                                         0.15: {"equal called different": 0.0}}}, bound=0.02),
        "plot_share_per_reader": dict(shares={"140 shards": [2.0] * 12 + [1.0] * 116, "256 shards": [1.09] * 128}),
        "plot_shared_offset_race": dict(steps=[("parent", "seek to A", 1_000_000), ("child", "seek to B", 6_000_000),
                                               ("parent", "read 'A': gets B", 6_110_000)],
                                        targets={"member A": 1_000_000, "member B": 6_000_000}),
    }
    functions = {name: f for name, f in inspect.getmembers(plots, inspect.isfunction)
                 if name.startswith("plot_") and f.__module__ == plots.__name__}
    missing = sorted(set(functions) - set(arguments))
    assert not missing, f"add made-up arguments for {missing}, so their figures are tested too"
    drawn = {}
    for name, function in functions.items():
        fig = function(**arguments[name], caption=f"What {name} shows, in one sentence a reader can follow.")
        fig.canvas.draw()
        drawn[name] = fig
    yield drawn
    for fig in drawn.values():
        plt.close(fig)


def _texts(fig):
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def test_no_text_smaller_than_10_pt(figures):
    small = {name: sorted({f"{t.get_text()[:25]!r} {t.get_fontsize():.0f} pt" for t in _texts(fig) if t.get_fontsize() < MIN_PT})
             for name, fig in figures.items()}
    small = {name: found for name, found in small.items() if found}
    assert not small, f"text under {MIN_PT} pt: {small}"


def test_titles_and_tick_labels_are_counted(figures):
    """The size test sees tick labels and titles, not only what was set explicitly."""
    fig = figures["plot_throughput_vs_workers"]
    ax = fig.axes[0]
    assert any(t in _texts(fig) for t in ax.get_xticklabels()) and ax.title in _texts(fig)


ALLOWED = {to_hex(c) for c in plots.PALETTE} | {"#ffffff", "#000000"}


def _neutral(hex_colour: str) -> bool:
    return hex_colour in ALLOWED or hex_colour[1:3] == hex_colour[3:5] == hex_colour[5:7]  # greys


def _data_colours(fig) -> set[str]:
    colours = set()
    for ax in fig.axes:
        for artist in ax.get_children():
            if isinstance(artist, AxesImage) or not artist.get_visible():
                continue
            found = []
            if isinstance(artist, Line2D):
                found = [artist.get_color(), artist.get_markerfacecolor()]
            elif isinstance(artist, Patch) and artist is not ax.patch:
                found = [artist.get_facecolor()]
            elif isinstance(artist, Collection):
                found = list(artist.get_facecolors()) + list(artist.get_edgecolors())
            for colour in found:
                rgba = to_rgba(colour)
                if rgba[3] > 0:
                    colours.add(to_hex(rgba[:3]))
    return colours


def test_every_colour_comes_from_the_palette_or_is_a_grey(figures):
    foreign = {name: sorted(c for c in _data_colours(fig) if not _neutral(c)) for name, fig in figures.items()}
    foreign = {name: found for name, found in foreign.items() if found}
    assert not foreign, f"colours outside packlab.plots.PALETTE (tab10?): {foreign}"


def test_the_checker_would_catch_tab10():
    fig, ax = plt.subplots()
    ax.bar([0, 1], [1, 2], color="tab:blue")
    fig.canvas.draw()
    assert "#1f77b4" in {c for c in _data_colours(fig) if not _neutral(c)}
    plt.close(fig)


def test_lines_carry_markers_and_groups_carry_hatching(figures):
    for name in ("plot_throughput_vs_workers", "plot_shuffle_quality"):
        lines = [line for line in figures[name].axes[0].get_lines() if line.get_label() and not line.get_label().startswith("_")]
        data_lines = [line for line in lines if line.get_linestyle() != "--"]
        markers = {line.get_marker() for line in data_lines}
        assert len(markers) == len(data_lines) and "None" not in markers, f"{name}: lines told apart by colour alone"
    for name in ("plot_rates_with_ranges", "plot_label_counts", "plot_small_file_penalty", "plot_decomposition"):
        bars = [p for p in figures[name].axes[0].patches if p.get_width() > 0 and p.get_height() > 0]
        assert len({p.get_hatch() for p in bars}) >= 2, f"{name}: bar groups told apart by colour alone"


def test_class_identity_is_told_by_position_and_name_not_colour(figures):
    fig = figures["plot_label_sequence"]
    assert len(fig.axes) == 2 and not any(ax.images for ax in fig.axes), "no colour-coded image strip"
    for ax in fig.axes:
        assert [t.get_text() for t in ax.get_yticklabels()] == [str(c) for c in range(10)]
        assert ax.get_ylabel() == "class"
    first = fig.axes[0].get_lines()[0]
    assert list(first.get_ydata()[:31]) == [0] * 30 + [1], "each sample sits at the height of its class"


def test_every_figure_has_a_caption_that_shows(figures):
    for name, fig in figures.items():
        caption = f"What {name} shows, in one sentence a reader can follow."
        assert fig.get_label() == caption
        shown = " ".join(t.get_text().replace("\n", " ") for t in fig.texts)
        assert caption in shown, f"{name}: the caption is not drawn"


def test_a_figure_without_a_caption_stays_as_it_was():
    fig = plots.plot_bench_bars([BenchResult("a", [1.0], 100, 0.1)])
    assert fig.get_label() == "" and not fig.texts
    plt.close(fig)


def test_the_two_drawings_show_what_they_were_given(figures):
    race = figures["plot_shared_offset_race"]
    lanes, offsets = race.axes
    assert [t.get_text() for t in lanes.get_yticklabels()] == ["parent", "child"]
    assert any("2. seek to B" == t.get_text() for t in lanes.texts)
    assert "offset" in offsets.get_ylabel() and "bytes" in offsets.get_ylabel()
    assert list(offsets.get_lines()[1].get_ydata()) == [1_000_000, 6_000_000, 6_110_000]
    decomposition = figures["plot_decomposition"].axes[0]
    assert "ms" in decomposition.get_xlabel()
    widths = sorted(round(p.get_width(), 3) for p in decomposition.patches if p.get_width() > 0)
    assert widths == sorted(round(1e3 / m, 3) for m in (300, 1500, 305, 1300))

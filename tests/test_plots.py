"""Figures draw, and every axis says what it measures."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from packlab import plots
from packlab.bench import BenchResult


def test_sample_grid_shows_every_class(small_root):
    fig = plots.plot_sample_grid(small_root, per_class=3)
    assert len(fig.axes) == 30
    assert "0: stripes" in fig.axes[0].get_ylabel()
    plt.close(fig)


def test_size_histograms(small_manifest):
    fig = plots.plot_size_histograms(small_manifest)
    assert [ax.get_xlabel() for ax in fig.axes] == ["JPEG file size (kB)", "width (px)"]
    plt.close(fig)


def test_throughput_vs_workers_has_units_and_a_ceiling():
    fig = plots.plot_throughput_vs_workers({"folder": {0: 100, 1: 180, 2: 300}, "zip": {0: 110, 2: 320}}, ceiling=400)
    ax = fig.axes[0]
    assert "images/s" in ax.get_ylabel() and "num_workers" in ax.get_xlabel()
    assert len(ax.lines) == 3
    assert np.allclose(ax.lines[0].get_ydata(), [100, 180, 300])
    plt.close(fig)


def test_bench_bars_and_label_sequence():
    results = [BenchResult("a", [1.0], 100, 0.1), BenchResult("b", [2.0], 100, 0.1)]
    fig = plots.plot_bench_bars(results)
    assert "images/s" in fig.axes[0].get_xlabel()
    plt.close(fig)
    fig = plots.plot_label_sequence({"sorted": [0] * 50 + [1] * 50, "shuffled": list(np.arange(100) % 10)})
    assert "samples" in fig.axes[-1].get_xlabel()
    plt.close(fig)


def test_rates_with_ranges_show_median_range_groups_and_reference_lines():
    rows = [{"name": "ours", "median": 500, "low": 480, "high": 530, "group": "ours"},
            {"name": "peer", "median": 400, "low": 390, "high": 420, "group": "peer"}]
    fig = plots.plot_rates_with_ranges(rows, lines={"parallel ceiling": 700})
    ax = fig.axes[0]
    assert "images/s" in ax.get_xlabel() and "median" in ax.get_xlabel()
    assert [bar.get_width() for bar in ax.patches[:2]] == [500, 400]
    assert ax.patches[0].get_facecolor() != ax.patches[1].get_facecolor()
    assert any("parallel ceiling (700)" == text.get_text() for text in ax.get_legend().get_texts())
    plt.close(fig)


def test_a_captioned_figure_carries_its_caption_into_the_png_and_the_book_makes_it_alt_text(tmp_path):
    import base64

    from docutils import nodes

    from packlab.course import book

    caption = "Images per second against workers, 0 to 16; the ceiling is the dashed line (×, ° kept)."
    fig, ax = plt.subplots()
    ax.plot([1, 2])
    plots.add_caption(fig, caption)
    (tmp_path / "figure.png").write_bytes(base64.b64decode(plots.png_with_description(fig)))
    plt.close(fig)
    assert book.png_description(tmp_path / "figure.png") == caption

    class Env:
        docname = "chapters/01_jpeg_files"

        def relfn2path(self, uri, docname):  # as Sphinx reads it: "/..." from the source folder, else the document's
            return uri, str(tmp_path / uri[1:] if uri.startswith("/") else tmp_path / "chapters" / uri)

    class App:
        env = Env()
        srcdir = str(tmp_path)

    # As myst-nb writes it, and as Sphinx's image collector rewrites it (relative to the source folder).
    page = nodes.section()
    page += [nodes.image(uri="/figure.png"), nodes.image(uri="/figure.png", alt="its own words"),
             nodes.image(uri="figure.png", candidates={"*": "figure.png"})]
    book.describe_images(App(), page)
    assert [image["alt"] for image in page.findall(nodes.image)] == [caption, "its own words", caption]

"""Every number the prose cites is a name a cell bound with ``figures(...)`` before it.

The chapters' sentences cite measurements with ``{eval}`name``` (see :mod:`packlab.course.prose`):
JupyterLab evaluates the name in the kernel, the book finds it among the glued values.
These tests read the MyST sources and fail when a sentence cites a name that no earlier
cell passed to ``figures``, when a role the book alone understands (``{glue:...}``)
comes back, or when a cited name is not a plain identifier (the book cannot show it).
"""

from __future__ import annotations

import ast
import re

import pytest

from packlab import paths
from packlab.course import prose

ROOT = paths.repo_root()
NOTEBOOKS = sorted(
    p for folder in ("chapters", "exercises", "solutions") for p in (ROOT / folder).glob("[0-9]*.md")
)
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```", re.S | re.M)
EVAL = re.compile(r"\{eval\}`([^`]*)`")


def _segments(text: str):
    """The notebook as ("code", source) and ("markdown", text) pieces, in order."""
    position = 0
    for match in CELL.finditer(text):
        yield "markdown", text[position : match.start()]
        body = match.group(1)
        # MyST cell options come first, as ":tags: [...]" lines or as a YAML block between
        # "---" lines (the form that also hides a cell's input in JupyterLab); they are not Python.
        if body.startswith("---\n") and "\n---\n" in body:
            body = body.split("\n---\n", 1)[1]
        body = "\n".join(line for line in body.splitlines() if not line.startswith(":"))
        yield "code", body
        position = match.end()
    yield "markdown", text[position:]


def _figure_names(source: str) -> set[str]:
    """Names passed as keywords to ``figures(...)`` in one code cell."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "figures":
            names.update(k.arg for k in node.keywords if k.arg)
    return names


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_cited_name_is_bound_before_it_is_cited(notebook):
    bound: set[str] = set()
    problems = []
    for kind, piece in _segments(notebook.read_text()):
        if kind == "code":
            bound |= _figure_names(piece)
            continue
        for name in EVAL.findall(piece):
            if not re.fullmatch(prose.NAME_PATTERN, name):
                problems.append(f"{{eval}}`{name}` is not a plain name: format it in a cell and pass it to figures()")
            elif name not in bound:
                problems.append(f"{{eval}}`{name}` is cited before any cell passes {name}= to figures()")
    assert not problems, f"{notebook.relative_to(ROOT)}: " + "; ".join(problems)


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_cited_name_is_bound_once(notebook):
    """JupyterLab evaluates a sentence's names after the cells queued before it have run.

    On "Run All" that is after *every* code cell, so a name bound twice would show its
    last value in both sentences. Each cited name is therefore bound by one call only.
    """
    cited = set(EVAL.findall(notebook.read_text()))
    bound_at: dict[str, list[tuple[int, int]]] = {}  # name -> (cell, line) of each figures() keyword
    stores: list[tuple[str, int, int]] = []  # (name, cell, line) of each plain assignment
    cells = [piece for kind, piece in _segments(notebook.read_text()) if kind == "code"]
    for cell, piece in enumerate(cells):
        for node in ast.walk(ast.parse(piece)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "figures":
                for keyword in node.keywords:
                    bound_at.setdefault(keyword.arg, []).append((cell, node.lineno))
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                stores.append((node.id, cell, node.lineno))
    twice = sorted(name for name, places in bound_at.items() if len(places) > 1 and name in cited)
    assert not twice, f"{notebook.relative_to(ROOT)}: cited names bound by more than one figures() call: {twice}"
    # Code that assigns a cited name after figures() bound it would show the code's value instead.
    rebound = sorted({name for name, cell, line in stores
                      if name in cited and name in bound_at and (cell, line) > bound_at[name][0]})
    assert not rebound, f"{notebook.relative_to(ROOT)}: cited names assigned again after figures() (rename the figure): {rebound}"


def test_no_book_only_roles_in_notebooks():
    """``{glue:...}`` shows as raw text in JupyterLab: the prose uses ``{eval}`` instead."""
    pages = NOTEBOOKS + [ROOT / "intro.md", ROOT / "instructor.md", ROOT / "exercises" / "index.md"]
    offenders = [str(p.relative_to(ROOT)) for p in pages if "{glue" in p.read_text()]
    assert not offenders, f"these pages use {{glue}} roles, which JupyterLab shows raw: {offenders}"


def test_chapters_cite_measured_numbers():
    """A chapter that measures something says so in its sentences (guards against a rewrite dropping them)."""
    chapters = sorted((ROOT / "chapters").glob("[0-9]*.md"))
    without = [p.name for p in chapters[1:] if not EVAL.search(p.read_text())]
    assert not without, f"these chapters cite no measured number in their prose: {without}"


def test_figures_binds_names_where_the_caller_reads_them(monkeypatch):
    glued = {}
    monkeypatch.setattr(prose, "glue", lambda name, value: glued.update({name: value}))
    prose.figures(cited_rate="452", cited_count=3)
    assert (cited_rate, cited_count) == ("452", 3)  # noqa: F821 - bound by figures() in this module's globals
    assert glued == {"cited_rate": "452", "cited_count": 3}


@pytest.mark.parametrize("value", ["452 (409–470)", 3, 0.25, "a 'quoted' <b>value</b>"])
def test_the_course_glues_values_exactly_as_myst_nb_does(monkeypatch, value):
    """The book reads glued values the way myst-nb writes them; prose.glue must write the same output."""
    import IPython.display
    from myst_nb import glue as myst_glue

    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda *args, **kwargs: shown.append((args, kwargs)))
    monkeypatch.setattr("myst_nb.ext.glue.ipy_display", lambda *args, **kwargs: shown.append((args, kwargs)))
    prose.glue("name", value)
    myst_glue("name", value, display=False)
    assert len(shown) == 2 and shown[0] == shown[1], shown


def test_listing_shows_dedented_sources_of_what_it_is_given():
    from packlab.loaders import ZipDataset

    shown = prose.listing(ZipDataset.close, ZipDataset.__getstate__).data
    assert shown.startswith("```python\ndef close(self)") and shown.endswith("```")
    assert "\ndef __getstate__(self)" in shown

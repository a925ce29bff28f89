"""Every number the prose cites is a name a cell bound with ``figures(...)`` before it.

The chapters' sentences cite measurements with ``{eval}`name``` (see :mod:`packlab.course.prose`):
JupyterLab evaluates the name in the kernel, the book finds it among the glued values.
These tests read the MyST sources and fail when a sentence cites a name that no earlier
cell passed to ``figures``, when a role the book alone understands (``{glue:...}``)
comes back, or when a cited name is not a plain identifier (the book cannot show it).
"""

from __future__ import annotations

import ast
import importlib
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
        # MyST cell options come first, as ":tags: [...]" lines or as a YAML block between "---" lines
        # (how a cell's metadata, such as a hidden input, is written); they are not Python.
        body = re.sub(r"\A---\n.*?^---\n", "", body, flags=re.S | re.M)
        body = "\n".join(line for line in body.splitlines() if not line.startswith(":"))
        yield "code", body
        position = match.end()
    yield "markdown", text[position:]


def _keyword_names(keyword: ast.keyword) -> set[str]:
    """The names one keyword of a ``figures(...)`` call binds: ``name=...``, or ``**chNN.helper(...)``, whose
    names the helper declares (:func:`packlab.course.prose.provides_figures`)."""
    if keyword.arg:
        return {keyword.arg}
    call = keyword.value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
        module = importlib.import_module(f"packlab.course.narration.{call.func.value.id}")
        names = getattr(getattr(module, call.func.attr), "figure_names", None)
        assert names is not None, f"{call.func.value.id}.{call.func.attr} does not declare its names (@provides_figures)"
        return set(names)
    raise AssertionError(f"figures(**{ast.unparse(call)}): only **chNN.helper(...) calls can be checked")


def _figure_calls(source: str):
    """``(call, names it binds)`` for each ``figures(...)`` call in one code cell."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "figures":
            yield node, set().union(*(_keyword_names(k) for k in node.keywords))


def _figure_names(source: str) -> set[str]:
    """Names passed to ``figures(...)`` in one code cell."""
    return set().union(set(), *(names for _, names in _figure_calls(source)))


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
        for node, names in _figure_calls(piece):
            for name in names:
                bound_at.setdefault(name, []).append((cell, node.lineno))
        for node in ast.walk(ast.parse(piece)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
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


def test_every_eval_role_is_parsed_as_a_role():
    """An ``{eval}`` role inside backticks is a code span: the page shows "{eval}" and the bare name."""
    from markdown_it import MarkdownIt
    from mdit_py_plugins.myst_role import myst_role_plugin

    parser = MarkdownIt("commonmark").use(myst_role_plugin)
    swallowed = []
    for page in NOTEBOOKS:
        for token in parser.parse(CELL.sub("", page.read_text())):
            swallowed += [f"{page.relative_to(ROOT)}: {(token.content.splitlines() or [''])[0][:80]}"
                          for child in token.children or [] if "{eval}" in child.content and child.type != "myst_role"]
    assert not swallowed, "these {eval} roles are not parsed as roles (inside a code span?):\n" + "\n".join(swallowed)


def test_chapters_cite_measured_numbers():
    """A chapter that measures something says so in its sentences (guards against a rewrite dropping them)."""
    chapters = sorted((ROOT / "chapters").glob("[0-9]*.md"))
    without = [p.name for p in chapters[1:] if not EVAL.search(p.read_text())]
    assert not without, f"these chapters cite no measured number in their prose: {without}"


@pytest.fixture
def outside_ipython(monkeypatch):
    """No IPython shell, even when another test in this process started one: names go to the caller's globals."""
    monkeypatch.setattr("IPython.get_ipython", lambda: None)


def test_figures_binds_names_where_the_caller_reads_them(monkeypatch, outside_ipython):
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


def test_figures_binds_names_without_the_book_tools(monkeypatch, outside_ipython):
    """An attendee's environment (make lab, no dev extra) has no myst-nb: the names are still bound."""
    import sys

    monkeypatch.setitem(sys.modules, "myst_nb", None)  # import myst_nb now raises ImportError
    prose.figures(cited_without_book="17")
    assert cited_without_book == "17"  # noqa: F821 - bound by figures() in this module's globals


def test_a_sentence_helper_returns_exactly_the_names_it_declares():
    @prose.provides_figures("a", "b")
    def helper(extra=False):
        return {"a": 1, "b": 2, **({"c": 3} if extra else {})}

    assert helper() == {"a": 1, "b": 2} and helper.figure_names == {"a", "b"}
    with pytest.raises(AssertionError, match="@provides_figures"):
        helper(extra=True)


def test_hidden_cells_keep_their_input_hidden_in_the_book_and_in_jupyterlab():
    """A cell that hides its input does so in both places: ``remove-input`` for the book, ``source_hidden`` for JupyterLab."""
    problems = []
    for notebook in NOTEBOOKS:
        for match in CELL.finditer(notebook.read_text()):
            header = re.match(r"\A---\n(.*?)^---\n", match.group(1), re.S | re.M)
            if header and "remove-input" in header.group(1) and "source_hidden: true" not in header.group(1):
                problems.append(f"{notebook.relative_to(ROOT)}: a remove-input cell without jupyter: source_hidden")
    assert not problems, problems


def test_listing_shows_dedented_sources_of_what_it_is_given():
    from packlab.loaders import ZipDataset

    shown = prose.listing(ZipDataset.close, ZipDataset.__getstate__).data
    assert shown.startswith("```python\ndef close(self)") and shown.endswith("```")
    assert "\ndef __getstate__(self)" in shown

"""A pytest plugin: every notebook that passes nbval goes into the book's execution cache.

``make test`` executes every chapter under nbval, and its browser test then needs the
built book, whose build would execute every chapter a second time. Both executions run
the same code cells in a fresh kernel, so the second one only costs time: this plugin
hands the first one's outputs to the book.

How: when the last cell of a notebook has run, and every cell passed, the plugin reads
the notebook's MyST source (``chapters/NN_x.md`` for ``_build/nbtest/chapters/NN_x.ipynb``)
the way the book build reads it, fills in the outputs nbval collected, and stores the
result in Jupyter Book's cache (``_build/.jupyter_cache``). The cache is keyed by a hash
of the code cells, so the book build then finds it exactly as if it had executed the
notebook itself, and re-executes anything whose code differs. A notebook with a failed
or skipped cell is never stored.

The plugin also runs tests marked ``needs_book`` last, after the notebooks.
Enabled by ``make test`` with ``-p packlab.course.pytest_book_cache``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from packlab import paths

#: Where ``make test`` puts the notebooks converted for nbval, relative to the repository.
NBTEST_DIR = Path("_build") / "nbtest"
#: Jupyter Book 1.x's execution cache, relative to the repository.
BOOK_CACHE_DIR = Path("_build") / ".jupyter_cache"


class _NotebookRun:
    """What nbval did with the cells of one notebook."""

    def __init__(self, path: Path, cell_count: int):
        self.path = path
        self.cell_count = cell_count
        self.outputs: dict[int, list] = {}
        self.sources: dict[int, str] = {}
        self.seconds = 0.0
        self.clean = True


def _is_nbval_cell(item) -> bool:
    return hasattr(item, "cell") and hasattr(item, "test_outputs") and hasattr(item, "cell_num")


def source_of(notebook: Path, root: Path) -> Path | None:
    """The MyST source ``<root>/<folder>/<name>.md`` of a converted ``_build/nbtest/<folder>/<name>.ipynb``."""
    try:
        relative = notebook.resolve().relative_to((root / NBTEST_DIR).resolve())
    except ValueError:
        return None
    source = root / relative.with_suffix(".md")
    return source if source.exists() else None


def book_notebook(source: Path):
    """The notebook the book build makes of a MyST source (same reader, so the same hash)."""
    from myst_nb.core.read import read_myst_markdown_notebook
    from myst_parser.config.main import MdParserConfig

    return read_myst_markdown_notebook(source.read_text(encoding="utf-8"), MdParserConfig(), add_source_map=True)


def store(run: _NotebookRun, root: Path) -> str:
    """Put one passed notebook's outputs into the book cache; return what happened, for the log."""
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    source = source_of(run.path, root)
    if source is None:
        return f"{run.path.name}: no MyST source next to it, not cached"
    notebook = book_notebook(source)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    if len(code_cells) != run.cell_count:
        return f"{source.name}: {len(code_cells)} code cells in the book, {run.cell_count} under nbval; not cached"
    for number, cell in enumerate(code_cells):
        if cell.source.strip() != run.sources[number].strip():
            return f"{source.name}: code cell {number} differs from the notebook nbval ran; not cached"
        cell.outputs = run.outputs[number]
        cell.execution_count = number + 1
    cache = get_cache(str(root / BOOK_CACHE_DIR))
    cache.cache_notebook_bundle(
        CacheBundleIn(notebook, str(source), data={"execution_seconds": run.seconds}),
        check_validity=False,
        overwrite=True,
    )
    return f"{source.relative_to(root)}: executed in {run.seconds:.0f} s under nbval, stored for the book"


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_book: runs after the notebooks (it builds or reads the book)")
    config._book_cache_runs = {}
    config._book_cache_log = []


def pytest_collection_modifyitems(session, config, items):
    # Tests that need the book go last, so the notebooks have filled its cache by then.
    items.sort(key=lambda item: item.get_closest_marker("needs_book") is not None)  # stable sort
    runs = config._book_cache_runs
    for item in items:
        if _is_nbval_cell(item):
            path = Path(str(item.parent.path))
            if path not in runs:
                runs[path] = _NotebookRun(path, 0)
            runs[path].cell_count += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if not _is_nbval_cell(item):
        return
    report = outcome.get_result()
    run = item.config._book_cache_runs.get(Path(str(item.parent.path)))
    if run is None:
        return
    if report.failed or report.skipped:
        run.clean = False
    if report.when != "call":
        return
    run.seconds += report.duration
    run.outputs[item.cell_num] = list(item.test_outputs or [])  # nbval numbers code cells from 0
    run.sources[item.cell_num] = item.cell.source
    if len(run.outputs) == run.cell_count and run.clean:
        try:
            message = store(run, paths.repo_root())
        except Exception as exc:  # noqa: BLE001 - a cache problem must not fail the tests; the book re-executes
            message = f"{run.path.name}: not cached ({type(exc).__name__}: {exc})"
        item.config._book_cache_log.append(message)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    log = getattr(config, "_book_cache_log", [])
    if log:
        terminalreporter.write_sep("-", "notebooks stored in the book's execution cache")
        for line in log:
            terminalreporter.write_line(line)

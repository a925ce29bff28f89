"""Notebooks nbval ran are stored where the book build looks for them, and only when they passed."""

from __future__ import annotations

import nbformat

from packlab.course import pytest_book_cache as plugin

SOURCE = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# A page

```{code-cell} ipython3
x = 6 * 7
```

Some prose.

```{code-cell} ipython3
print(x)
```
"""


def _run(root, outputs):
    notebook = root / plugin.NBTEST_DIR / "chapters" / "99_page.ipynb"
    notebook.parent.mkdir(parents=True)
    notebook.write_text("{}")
    run = plugin._NotebookRun(notebook, cell_count=2)
    run.sources = {0: "x = 6 * 7", 1: "print(x)"}
    run.outputs = outputs
    run.seconds = 1.5
    return run


def test_a_passed_notebook_is_found_by_the_book_cache_with_its_outputs(tmp_path):
    from jupyter_cache import get_cache

    (tmp_path / "chapters").mkdir()
    source = tmp_path / "chapters" / "99_page.md"
    source.write_text(SOURCE)
    stream = nbformat.v4.new_output("stream", name="stdout", text="42\n")
    message = plugin.store(_run(tmp_path, {0: [], 1: [stream]}), tmp_path)
    assert "stored for the book" in message

    cache = get_cache(str(tmp_path / plugin.BOOK_CACHE_DIR))
    record = cache.match_cache_notebook(plugin.book_notebook(source))  # KeyError if the hash differs
    assert record.data == {"execution_seconds": 1.5}
    _, merged = cache.merge_match_into_notebook(plugin.book_notebook(source))
    code = [cell for cell in merged.cells if cell.cell_type == "code"]
    assert code[1].outputs[0]["text"] == "42\n"


def test_a_notebook_whose_code_differs_is_not_stored(tmp_path):
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "99_page.md").write_text(SOURCE.replace("print(x)", "print(x + 1)"))
    message = plugin.store(_run(tmp_path, {0: [], 1: []}), tmp_path)
    assert "differs" in message and not (tmp_path / plugin.BOOK_CACHE_DIR).exists()

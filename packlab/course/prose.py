"""Measured numbers in the chapters' prose, readable in JupyterLab and in the built book.

A chapter's sentences cite numbers its cells have just measured: "two workers delivered
{eval}`ips_fixed` images/s". MyST's ``{eval}`` role names a variable of the notebook, and
two programs render it:

* **JupyterLab** (with ``jupyterlab-myst``) asks the running kernel for the variable's
  value when the markdown cell is run, and shows it in place of the role;
* **the book** is built from the notebooks' *cached* outputs (``execute_notebooks:
  cache``, shared with ``make test``), where no kernel is left to ask. There the course's
  Sphinx extension, :mod:`packlab.course.book`, looks the name up among the values the notebook
  *glued* (myst-nb's record of a value in a cell's output).

:func:`figures` serves both: for each ``name=value`` it binds ``name`` in the notebook's
namespace and glues the value under the same name. Format numbers before passing them,
so both places show the same text::

    figures(ips_fixed=f"{fixed.images_per_s:.0f}", runs_failed=failed)

and in the markdown that follows: ``{eval}`ips_fixed` images/s``. Strings show without
quotes in both places. Only plain names work in the book (``{eval}`ips_fixed```, not
``{eval}`round(x)```): every cited number is computed, formatted and named in a cell.
"""

from __future__ import annotations

import sys
from typing import Any

#: A name that prose may cite with ``{eval}``: a plain Python identifier.
NAME_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"


def _notebook_namespace(depth: int = 2) -> dict:
    """The namespace the prose's ``{eval}`` roles are evaluated in.

    In a notebook that is IPython's user namespace; anywhere else (a script, a test) the
    globals of the code that called :func:`figures`.
    """
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None:
        return shell.user_ns
    return sys._getframe(depth).f_globals


def figures(**values: Any) -> None:
    """Make each value citable in the prose as ``{eval}`name```, in JupyterLab and in the book.

    Binds every name in the notebook's namespace (what JupyterLab's ``{eval}`` reads) and
    glues its value under the same name (what the book's ``{eval}`` reads; the glue output
    is invisible in both). Returns nothing, so a cell that ends with it shows nothing.

    Gluing needs myst-nb, which comes with the book tools (``pip install -e '.[dev]'``);
    an attendee's environment without them (``make lab``) only binds the names, which is
    all JupyterLab reads.
    """
    try:
        from myst_nb import glue
    except ImportError:  # no book tools here: JupyterLab needs only the names
        glue = None

    namespace = _notebook_namespace()
    for name, value in values.items():
        namespace[name] = value
        if glue is not None:
            glue(name, value, display=False)


def listing(*objects: Any):
    """The source of some functions, methods or classes, shown as one Python listing.

    For the lines a section teaches, e.g. ``listing(ZipDataset.open, ZipDataset.__getstate__)``
    rather than a whole class. Methods are dedented so the listing reads as plain code.
    """
    import inspect
    import textwrap

    from IPython.display import Markdown

    sources = [textwrap.dedent(inspect.getsource(obj)).rstrip() + "\n" for obj in objects]
    return Markdown("```python\n" + "\n\n".join(sources) + "```")


def seconds_text(seconds: float) -> str:
    """A duration as a sentence should read it: ``"12 s"``, ``"1.4 s"``, ``"0.35 s"``, ``"40 ms"``, ``"under 1 ms"``.

    Never ``"0 s"`` for something that took a moment: two significant digits below 10 s,
    milliseconds below a tenth of a second.
    """
    if seconds >= 10:
        return f"{seconds:,.0f} s"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    if seconds >= 0.1:
        return f"{seconds:.2f} s"
    if seconds >= 0.001:
        return f"{seconds * 1e3:.0f} ms"
    return "under 1 ms"


def names_text(names) -> str:
    """``["a"]`` -> ``"a"``, ``["a", "b"]`` -> ``"a and b"``, ``["a", "b", "c"]`` -> ``"a, b and c"``."""
    names = list(names)
    if not names:
        raise ValueError("no names to list")
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def provides_figures(*names: str):
    """Declare the names a sentence helper returns, for ``figures(**helper(...))``.

    A chapter's prose cites ``{eval}`name``` only after a cell bound ``name``;
    ``tests/test_prose.py`` checks that by reading the cells, and a name hidden in
    ``**helper(...)`` is found through this declaration. The helper must return exactly
    these names (checked on every call), so the declaration cannot drift from the code.
    """
    import functools

    declared = frozenset(names)

    def mark(helper):
        @functools.wraps(helper)
        def checked(*args, **kwargs):
            values = helper(*args, **kwargs)
            if set(values) != declared:
                raise AssertionError(
                    f"{helper.__qualname__} returned {sorted(set(values) ^ declared)} differently from what "
                    "it declares with @provides_figures; update the declaration"
                )
            return values

        checked.figure_names = declared
        return checked

    return mark

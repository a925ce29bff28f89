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


#: The prefix of the MIME types under which a glued value is stored in a cell's output
#: (myst-nb reads glued values back from outputs of this form).
GLUE_MIME_PREFIX = "application/papermill.record/"


def glue(name: str, value: Any) -> None:
    """Record ``value`` under ``name`` in the current cell's output, invisibly, as myst-nb's
    ``glue(name, value, display=False)`` does.

    The output is the value's display data (what the notebook would show for it: text,
    HTML, ...) with every MIME type prefixed by :data:`GLUE_MIME_PREFIX`, which no
    front end renders, and the name in the output's ``scrapbook`` metadata. Written here
    rather than imported because importing ``myst_nb.glue`` imports ``nbformat`` and with it
    ``jsonschema``, about two seconds at the first ``figures()`` of every notebook.
    ``tests/test_prose.py`` checks that the output is the same as myst-nb's.
    """
    from IPython.core.formatters import format_display_data
    from IPython.display import display

    data, metadata = format_display_data(value)
    metadata["scrapbook"] = {"name": name, "mime_prefix": GLUE_MIME_PREFIX}
    display({GLUE_MIME_PREFIX + mime: shown for mime, shown in data.items()}, raw=True, metadata=metadata)


def figures(**values: Any) -> None:
    """Make each value citable in the prose as ``{eval}`name```, in JupyterLab and in the book.

    Binds every name in the notebook's namespace (what JupyterLab's ``{eval}`` reads) and
    glues its value under the same name (what the book's ``{eval}`` reads; the glue output
    is invisible in both). Returns nothing, so a cell that ends with it shows nothing.

    Gluing uses :func:`glue` above, not myst-nb, so it works the same in an attendee's
    environment without the book tools (``make lab``).
    """
    namespace = _notebook_namespace()
    for name, value in values.items():
        namespace[name] = value
        glue(name, value)


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

def distinct(a: float, b: float, decimals: int = 0, most: int = 3) -> tuple[str, str]:
    """``a`` and ``b`` as text, with the fewest decimals (at least ``decimals``, at most ``most``)
    that print them differently.

    For a sentence that calls two medians clearly different: "3 µs ... 3 µs (clearly less)"
    reads as a contradiction, "3.4 µs ... 3.1 µs (clearly less)" does not. Equal numbers
    stay at ``decimals``.
    """
    digits = decimals
    while digits < most and a != b and f"{a:.{digits}f}" == f"{b:.{digits}f}":
        digits += 1
    return f"{a:.{digits}f}", f"{b:.{digits}f}"


def source_lines(source: Any, *needles: str, before: int = 0, after: int = 0):
    """The lines of a function's, class's or file's source that contain any of ``needles``,
    with their line numbers and the file they are in, as a listing.

    ``source`` is an object :mod:`inspect` can find the source of (``zipfile.ZipFile.open``),
    or a ``(package, path inside it)`` pair (``("torchvision",
    "transforms/_functional_tensor.py")``), read from the installed package without
    importing it. ``before``/``after`` lines of context are added around each hit; a gap
    between hits shows as ``...``. For showing, in a chapter, what a library's source does.
    """
    import importlib.util
    import inspect
    from pathlib import Path

    from IPython.display import Markdown

    if isinstance(source, tuple):
        package, relative = source
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"package {package!r} is not installed")
        path = Path(list(spec.submodule_search_locations)[0]) / relative
        lines, first = path.read_text().splitlines(), 1
        shown_path = f"{package}/{relative}"
    else:
        block, first = inspect.getsourcelines(source)
        lines = [line.rstrip("\n") for line in block]
        path = Path(inspect.getsourcefile(source))
        module = inspect.getmodule(source)
        top = (module.__name__.split(".")[0] if module else "")
        parts = path.parts
        shown_path = "/".join(parts[parts.index(top):]) if top in parts else path.name
    hits = [i for i, line in enumerate(lines) if any(n in line for n in needles)]
    if not hits:
        raise ValueError(f"none of {needles} occurs in {shown_path}")
    keep = sorted({j for i in hits for j in range(max(0, i - before), min(len(lines), i + after + 1))})
    out, previous = [], None
    for j in keep:
        if previous is not None and j != previous + 1:
            out.append("     ...")
        out.append(f"{first + j:5d}  {lines[j]}")
        previous = j
    return Markdown(f"`{shown_path}`:\n\n```python\n" + "\n".join(out) + "\n```")

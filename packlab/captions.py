"""A figure's caption as the alt text of its image: through the PNG that IPython shows.

:func:`packlab.plots.add_caption` keeps a figure's caption as its label. Where IPython
shows the figure (JupyterLab, the runs the book is built from), :func:`describe_figures_in_png`
has its PNG formatter write that label into the PNG's ``Description`` text chunk, PNG's
keyword for a description of the image. The notebook's output then carries the sentence
inside the image itself, and the book's build (:mod:`packlab.course.book`) gives it to the
HTML ``<img>`` as its alt text, where a screen reader reads it instead of a file name.
"""

from __future__ import annotations

from functools import partial

#: The PNG text chunk that carries a figure's caption (PNG's keyword for "a description of the image").
DESCRIPTION_KEY = "Description"


def png_with_description(fig, base=None, **kwargs):
    """The figure as IPython shows it (``base``: the PNG formatter's own function), its caption in the PNG's text."""
    if base is None:
        from IPython.core.pylabtools import print_figure

        base = partial(print_figure, fmt="png", base64=True)
    caption = fig.get_label()
    if caption:
        kwargs["metadata"] = {DESCRIPTION_KEY: caption}
    return base(fig, **kwargs)


def describe_figures_in_png() -> None:
    """Make IPython's PNG formatter for figures write each figure's caption into the PNG (see the module docstring).

    Called whenever a figure gets its caption, not once at import: the inline backend sets
    its formatters when the first figure is made, and would replace one set before.
    """
    try:
        from IPython import get_ipython
    except ImportError:  # no IPython: nothing shows the figure but savefig
        return
    shell = get_ipython()
    if shell is None:
        return
    from matplotlib.figure import Figure

    formatter = shell.display_formatter.formatters["image/png"]
    base = formatter.type_printers.get(Figure)
    if base is None or getattr(base, "func", None) is png_with_description:
        return
    formatter.for_type(Figure, partial(png_with_description, base=base))

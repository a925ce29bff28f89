"""A small Sphinx extension for the course's book build (enabled in ``_config.yml``).

Two things:

* **``{eval}`` from cached notebooks.** The chapters cite measured numbers with MyST's
  ``{eval}`name``` role (see :mod:`packlab.course.prose`). myst-nb evaluates that role by asking
  a live kernel, which exists only when the book executes notebooks inline; the book is
  built from the execution cache instead (``make test`` fills it, so every notebook runs
  once). This extension's ``eval`` role first looks the name up among the values the
  notebook glued (:func:`packlab.course.prose.figures` glues every name it binds), and only
  then asks a kernel, if there is one. A name found in neither is a warning, which fails
  the build (``-W``): a sentence never silently loses its number.
* **Alt text for figures.** myst-nb writes a cell's PNG output as an image with no alt
  text, so the HTML falls back to the file's name. The course's figures carry their
  caption in the PNG's ``Description`` text chunk (:mod:`packlab.captions`);
  :func:`describe_images` makes it the image's alt text.
* **Timetables computed, never pasted.** ``{course-schedule} summary``, ``table`` or
  ``track NAME`` writes what :mod:`packlab.course.schedule.pages` computes from the
  chapters as they are and the running times of this build's execution cache (filled
  as the chapters execute, before the pages that hold the directive are read). Those
  pages are read again on every build, so their numbers follow the chapters.
* **Duplicate scripts.** Jupyter Book 1.0.4 with sphinx-thebe 0.3.1 registers
  sphinx-thebe's inline configuration script twice, so every page declares ``const
  THEBE_JS_URL`` twice and the browser reports "Identifier 'THEBE_JS_URL' has already
  been declared". Exact duplicates are removed from each page's script list.
"""

from __future__ import annotations

import re

from sphinx.util.docutils import SphinxDirective

from myst_nb.core.variables import RetrievalError, render_variable_outputs
from myst_nb.ext.eval import EvalRoleAny, eval_warning
from myst_nb.ext.glue.utils import retrieve_glue_data

from packlab.course.prose import NAME_PATTERN


class EvalFromGlueOrKernel(EvalRoleAny):
    """``{eval}`name```: the value glued under ``name`` in this notebook, else the live kernel's."""

    def run(self):
        name = self.text.strip()
        if not re.fullmatch(NAME_PATTERN, name):
            return [], [eval_warning(
                f"{{eval}}`{name}`: the book can only show plain names; compute and format the value in a cell "
                "and pass it to packlab.course.prose.figures(name=...)", self.document, self.line)]
        try:
            output = retrieve_glue_data(self.document, name)
        except RetrievalError:
            return super().run()  # inline execution: a live kernel answers; otherwise a warning naming it
        output.metadata["strip_text_quotes"] = True  # a string shows as its text, as JupyterLab shows it
        return render_variable_outputs([output], self.document, self.line, self.source, inline=True), []


def _script_identity(script) -> tuple:
    # An inline script is registered once with filename None and, after the environment is
    # reloaded, once more with filename "": treat the two as the same.
    filename = getattr(script, "filename", script) or ""
    attributes = tuple(sorted(getattr(script, "attributes", {}).items()))
    return (filename, attributes)


def drop_duplicate_scripts(app, pagename, templatename, context, doctree) -> None:
    """Keep the first of each identical script entry (same file or inline body, same attributes)."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen = set()
    unique = []
    for script in scripts:
        identity = _script_identity(script)
        if identity in seen:
            continue
        seen.add(identity)
        unique.append(script)
    context["script_files"] = unique


def png_description(path) -> str | None:
    """The ``Description`` text of the PNG at ``path`` (a figure's caption), or None."""
    from PIL import Image

    from packlab.captions import DESCRIPTION_KEY

    try:
        with Image.open(path) as image:
            return (getattr(image, "text", None) or {}).get(DESCRIPTION_KEY) or None
    except (OSError, ValueError):
        return None


def describe_images(app, doctree) -> None:
    """Give every image without alt text its PNG's description (see the module docstring)."""
    from docutils import nodes

    from pathlib import Path

    env = app.env
    for image in doctree.findall(nodes.image):
        uri = image.get("uri", "")
        if image.get("alt") or not uri.lower().endswith(".png") or "://" in uri:
            continue
        # Sphinx's image collector, also on doctree-read, may already have rewritten the uri relative to the
        # source folder (myst-nb writes "/_build/jupyter_execute/<hash>.png"): try that reading and the document's.
        candidates = [Path(app.srcdir) / image.get("candidates", {}).get("*", uri.lstrip("/")),
                      Path(env.relfn2path(uri, env.docname)[1])]
        description = next((d for d in map(png_description, candidates) if d), None)
        if description:
            image["alt"] = description


class CourseScheduleDirective(SphinxDirective):
    """``{course-schedule} summary | table | track NAME``: the schedule as this build computes it."""

    required_arguments = 1
    optional_arguments = 1
    has_content = False

    def run(self):
        from pathlib import Path

        from docutils import nodes
        from docutils.statemachine import StringList

        from packlab.course.schedule import pages

        request = " ".join(self.arguments)
        root = Path(self.env.srcdir)
        cache = Path(self.env.mystnb_config.execution_cache_path or Path(self.env.app.outdir).parent / ".jupyter_cache")
        try:
            lines = pages.render(pages.load(root, cache), request)
        except ValueError as error:
            raise self.error(str(error)) from error
        container = nodes.container(classes=["course-schedule"])
        self.state.nested_parse(StringList(lines, source=self.env.docname), self.content_offset, container)
        return [container]


def reread_schedule_pages(app, env, added, changed, removed) -> list[str]:
    """The pages that hold ``{course-schedule}``: always read again (their numbers come from other pages)."""
    from pathlib import Path

    out = []
    for docname in env.found_docs:
        path = Path(env.doc2path(docname))
        if path.suffix == ".md" and "{course-schedule}" in path.read_text(encoding="utf-8"):
            out.append(docname)
    return out


def setup(app):
    # Loaded after myst_nb (an extra extension), so this replaces its kernel-only role.
    app.add_role("eval", EvalFromGlueOrKernel(), override=True)
    app.connect("html-page-context", drop_duplicate_scripts)
    app.connect("doctree-read", describe_images)
    app.add_directive("course-schedule", CourseScheduleDirective)
    app.connect("env-get-outdated", reread_schedule_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

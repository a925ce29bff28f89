"""A small Sphinx extension for the course's book build (enabled in ``_config.yml``).

Jupyter Book 1.0.4 with sphinx-thebe 0.3.1 registers sphinx-thebe's inline configuration
script twice, so every page declares ``const THEBE_JS_URL`` twice and the browser reports
"Identifier 'THEBE_JS_URL' has already been declared". This extension removes exact
duplicates from each page's script list; it changes nothing else.
"""

from __future__ import annotations


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


def setup(app):
    app.connect("html-page-context", drop_duplicate_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

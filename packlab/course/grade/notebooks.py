"""Reading an exercise notebook the way the grader does: its graded check calls and its definitions.

The grader never trusts what a notebook says about itself. It reads the code cells for
the graded ``check("<id>", Name)`` calls (:func:`check_calls`), and it runs the checks
itself on the notebook's *definitions* (:func:`own_run`): every code cell reduced to its
imports, function and class definitions and the constants those read
(:func:`packlab.course.grading.core.definitions_only`, the same reduction the spawn
workers import), cell after cell in a fresh namespace, each graded check run where its
cell stands. No other statement of the notebook runs there: not its ``check()`` calls,
not a call that writes a result, not a loop.
"""

from __future__ import annotations

import ast
import builtins
import json
import linecache
import sys
from pathlib import Path

from packlab.course import grading
from packlab.course.grading import core

#: What the grader's own run prints before its JSON result (the last line that starts so counts).
OWN_RUN_MARKER = "PACKLAB-GRADER-RUN "


def read_notebook(path: Path):
    """Read a notebook as an ``nbformat`` node: ``.md`` (MyST) through jupytext, ``.ipynb`` directly."""
    import jupytext
    import nbformat

    if path.suffix == ".ipynb":
        return nbformat.read(path, as_version=4)
    return jupytext.read(path)


def _graded_call(node: ast.AST) -> tuple[str, str | None] | None:
    """``(id, candidate name)`` when ``node`` is a graded ``check("<id>", ...)`` call, else None.

    Not graded: ``record=False`` (a demonstration) and ``parts=...`` (one stage or some
    parts), which :func:`packlab.course.grading.check` does not record either.
    """
    if not isinstance(node, ast.Call):
        return None
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
    if name != "check" or not node.args or not isinstance(node.args[0], ast.Constant):
        return None
    if not isinstance(node.args[0].value, str):
        return None
    for keyword in node.keywords:
        if keyword.arg == "record" and isinstance(keyword.value, ast.Constant) and keyword.value.value is False:
            return None
        if keyword.arg == "parts":
            return None
    candidate = node.args[1].id if len(node.args) > 1 and isinstance(node.args[1], ast.Name) else None
    return node.args[0].value, candidate


def check_calls(source: str) -> list[tuple[str, str | None]]:
    """The graded ``check("<id>", candidate)`` calls in one cell's code, as ``(id, candidate name)``.

    Calls with ``record=False`` are demonstrations and calls with ``parts=`` run a stage:
    neither is graded. Cells that are not valid Python (an attendee's half-typed code) are
    searched line by line.
    """
    try:
        trees = [ast.parse(source)]
    except SyntaxError:
        trees = []
        for line in source.splitlines():
            try:
                trees.append(ast.parse(line.strip()))
            except SyntaxError:
                continue
    return [call for tree in trees for node in ast.walk(tree) if (call := _graded_call(node)) is not None]


def expected_checks(notebook) -> list[str]:
    """The check ids a notebook's code cells call, in order, each once."""
    ids: list[str] = []
    for cell in notebook.cells:
        if cell.cell_type == "code":
            ids += [i for i, _ in check_calls(cell.source) if i not in ids]
    return ids


def definition_cells(notebook, names) -> list[str]:
    """The sources of the code cells that define any of ``names`` at top level (classes, functions)."""
    wanted = set(names)
    out = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
        if defined & wanted:
            out.append(cell.source)
    return out


def _register(source: str, filename: str) -> None:
    """Keep a cell's source where IPython keeps it, so that spawn parts can rebuild its classes."""
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)


def run_cells_as_main(sources: list[str], label: str) -> dict:
    """Run cell sources in one fresh ``__main__`` namespace, the way a kernel runs them.

    Each cell's source is registered in :mod:`linecache` under its own name, as IPython
    does, so :func:`packlab.course.grading.importable_copy` finds the cell that defines a class.
    Returns the namespace.
    """
    namespace = {"__name__": "__main__"}
    for index, source in enumerate(sources):
        filename = f"<{label} cell {index}>"
        _register(source, filename)
        exec(compile(source, filename, "exec"), namespace)
    return namespace


def notebook_candidates(path: Path) -> list[tuple[str, object]]:
    """``(check id, candidate)`` for every graded check call of a notebook, its defining cells run.

    Only the cells that define the candidates run (see :func:`definition_cells`), in this
    process, as ``__main__``: a quick way to check a notebook's classes without a kernel.
    """
    notebook = read_notebook(Path(path))
    calls = [call for cell in notebook.cells if cell.cell_type == "code" for call in check_calls(cell.source)]
    namespace = run_cells_as_main(definition_cells(notebook, {name for _, name in calls}), Path(path).stem)
    return [(check_id, namespace[name]) for check_id, name in calls if name in namespace]


# ----------------------------------------------------------------- the grader's own run


def own_run(path: Path) -> dict:
    """Run the graded checks of a notebook on its definitions, in this process; return the results.

    Cell by cell, in order: the cell's definitions (:func:`core.definitions_only`) run in a
    fresh ``__main__``-like namespace, then each graded check call of that cell runs on the
    name it passes, quietly and unrecorded. A check called twice counts as its last call,
    as in the notebook. Returns ``{"results": {check id: CheckResult dict or {"error": why}},
    "definition_errors": [{"cell", "error"}]}``.
    """
    path = Path(path)
    notebook = read_notebook(path)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    results: dict[str, dict] = {}
    errors: list[dict] = []
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    for index, cell in enumerate(code):
        filename = f"<{path.stem} cell {index}>"
        try:
            source = core.definitions_only(cell.source, filename)
        except SyntaxError as exc:
            errors.append({"cell": index, "error": f"SyntaxError: {exc.msg} (line {exc.lineno})"})
            source = ""
        if source.strip():
            _register(source, filename)
            try:
                exec(compile(source, filename, "exec"), namespace)
            except BaseException as exc:  # noqa: BLE001 - an attendee's cell may raise anything, SystemExit too
                errors.append({"cell": index, "error": core.describe(exc)})
        for check_id, name in check_calls(cell.source):
            candidate = namespace.get(name) if name else None
            if candidate is None:
                why = (f"{name} is not defined where its check cell stands (cell {index})" if name
                       else "the check is not given a name the notebook defines")
                results[check_id] = {"error": why}
                continue
            try:
                results[check_id] = grading.check(check_id, candidate, quiet=True, record=False).to_dict()
            except Exception as exc:  # noqa: BLE001 - e.g. an instance where the class was wanted
                results[check_id] = {"error": core.describe(exc)}
    return {"results": results, "definition_errors": errors}


def read_own_run(stdout: str) -> dict | None:
    """The result :func:`main` printed (its last marked line), or None when there is none."""
    found = None
    for line in stdout.splitlines():
        if line.startswith(OWN_RUN_MARKER):
            found = line[len(OWN_RUN_MARKER):]
    if found is None:
        return None
    try:
        return json.loads(found)
    except ValueError:
        return None


def main(argv: list[str] | None = None) -> int:
    """``python -m packlab.course.grade.notebooks NOTEBOOK``: the grader's own run, as one marked JSON line."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m packlab.course.grade.notebooks NOTEBOOK", file=sys.stderr)
        return 2
    outcome = own_run(Path(args[0]))
    sys.stdout.flush()
    print(OWN_RUN_MARKER + json.dumps(outcome), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

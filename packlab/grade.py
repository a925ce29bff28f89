"""Grade exercise notebooks from the command line.

::

    python -m packlab.grade exercises/01_jpeg_dataset.md [more notebooks ...]
    make grade NB=exercises/01_jpeg_dataset.md
    python -m packlab.grade --repeat 20 --check per_worker_zip   # the solution's, 20 times

Each notebook (MyST ``.md`` through jupytext, or ``.ipynb``) runs top to bottom in a
fresh kernel, with its own folder as working directory, the way a grader would run it.
A cell that raises does not stop the run: later cells, and their checks, still run.
Every :func:`packlab.grading.check` in the notebook records its result in a file the
grader names in the kernel's environment (:data:`packlab.grading.RESULTS_ENV_VAR`).

The grader knows which checks a notebook is meant to run by reading its code cells
(every ``check("<id>", ...)`` call not marked ``record=False``). A check that never
ran — its cell was not reached, or raised before the check — scores 0 of its parts, and
the report says which cell raised what. The score table goes to the terminal and the
full report, every part of every check, to a JSON file (``--report``).

``--repeat N --check ID [NOTEBOOK]`` runs one check of one notebook (by default the
solution notebook) N times in a row in this process (its defining cells run here, not
in a kernel) and prints the minimum, median and maximum wall time: a way to look for a
failure that shows only now and then.
"""

from __future__ import annotations

import argparse
import ast
import json
import linecache
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packlab import grading, paths

#: Seconds one cell may run before the grader interrupts it.
CELL_TIMEOUT = 600


def read_notebook(path: Path):
    """Read a notebook as an ``nbformat`` node: ``.md`` (MyST) through jupytext, ``.ipynb`` directly."""
    import jupytext
    import nbformat

    if path.suffix == ".ipynb":
        return nbformat.read(path, as_version=4)
    return jupytext.read(path)


def check_calls(source: str) -> list[tuple[str, str | None]]:
    """The graded ``check("<id>", candidate)`` calls in one cell's code, as ``(id, candidate name)``.

    Calls with ``record=False`` are demonstrations, not graded. Cells that are not valid
    Python (an attendee's half-typed code) are searched line by line.
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
    calls = []
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name != "check" or not node.args or not isinstance(node.args[0], ast.Constant):
                continue
            if not isinstance(node.args[0].value, str):
                continue
            if any(k.arg == "record" and isinstance(k.value, ast.Constant) and k.value.value is False for k in node.keywords):
                continue
            candidate = node.args[1].id if len(node.args) > 1 and isinstance(node.args[1], ast.Name) else None
            calls.append((node.args[0].value, candidate))
    return calls


def expected_checks(notebook) -> list[str]:
    """The check ids a notebook's code cells call, in order, each once."""
    ids: list[str] = []
    for cell in notebook.cells:
        if cell.cell_type == "code":
            ids += [i for i, _ in check_calls(cell.source) if i not in ids]
    return ids


def run_cells_as_main(sources: list[str], label: str) -> dict:
    """Run cell sources in one fresh ``__main__`` namespace, the way a kernel runs them.

    Each cell's source is registered in :mod:`linecache` under its own name, as IPython
    does, so :func:`packlab.grading.importable_copy` finds the cell that defines a class.
    Returns the namespace.
    """
    namespace = {"__name__": "__main__"}
    for index, source in enumerate(sources):
        filename = f"<{label} cell {index}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
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


def repeat_check(path: Path, check_id: str, times: int) -> list[float]:
    """Run one check of a notebook ``times`` times in this process; print each run and min/median/max seconds.

    This is how an intermittent failure (a stall that shows once in several checks) is
    looked for: ``python -m packlab.grade --repeat 20 --check per_worker_zip
    solutions/03_per_worker_zip.md``. Returns the wall times.
    """
    candidates = dict(notebook_candidates(path))
    if check_id not in candidates:
        raise SystemExit(f"error: {path} has no graded check({check_id!r}, ...) call")
    seconds, failures = [], 0
    for run in range(1, times + 1):
        start = time.perf_counter()
        result = grading.check(check_id, candidates[check_id], quiet=True, record=False)
        seconds.append(time.perf_counter() - start)
        failed = [f"{p.name}: {p.message.splitlines()[0][:120]}" for p in result.parts if not p.passed]
        failures += bool(failed)
        print(f"run {run:2d}/{times}: {seconds[-1]:6.1f} s  {result.score}/{result.max_score}  {'; '.join(failed)}", flush=True)
    print(
        f"{check_id} x {times}: min {min(seconds):.1f} s, median {statistics.median(seconds):.1f} s, "
        f"max {max(seconds):.1f} s; {failures} run(s) with a failed part"
    )
    return seconds


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


@dataclass
class NotebookGrade:
    """One notebook's grade: its checks (as recorded, or zero when not run) and its cell errors."""

    path: str
    seconds: float
    checks: list[dict] = field(default_factory=list)
    cell_errors: list[dict] = field(default_factory=list)
    execution_error: str | None = None

    @property
    def score(self) -> int:
        return sum(c["score"] for c in self.checks)

    @property
    def max_score(self) -> int:
        return sum(c["max_score"] for c in self.checks)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(score=self.score, max_score=self.max_score)
        return out


def _cell_errors(notebook) -> list[dict]:
    errors = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error":
                errors.append({"cell": index, "ename": output.get("ename"), "evalue": str(output.get("evalue"))[:300]})
    return errors


def _not_run(check_id: str, notebook, errors: list[dict], execution_error: str | None) -> dict:
    """A zero-score entry for a check that recorded no result, saying why as well as can be told."""
    info = {c.id: c for c in grading.list_checks()}.get(check_id)
    parts = list(info.parts) if info else []
    reason = "the check did not run"
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code" and check_id in [i for i, _ in check_calls(cell.source)]:
            raised = [e for e in errors if e["cell"] == index]
            if raised:
                reason = f"its cell raised {raised[0]['ename']}: {raised[0]['evalue']}"
            elif execution_error:
                reason = f"execution stopped before its cell: {execution_error}"
            break
    return {
        "exercise_id": check_id,
        "candidate": None,
        "score": 0,
        "max_score": len(parts),
        "passed": False,
        "parts": [{"name": p, "passed": False, "message": reason} for p in parts],
        "not_run": reason,
    }


def grade_notebook(path: Path, cell_timeout: float = CELL_TIMEOUT) -> NotebookGrade:
    """Execute one notebook in a fresh kernel and collect its checks (see the module docstring)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    path = Path(path)
    notebook = read_notebook(path)
    kernel = notebook.metadata.get("kernelspec", {}).get("name", "python3")
    handle, results_file = tempfile.mkstemp(prefix="packlab-grade-", suffix=".jsonl")
    os.close(handle)
    previous = os.environ.get(grading.RESULTS_ENV_VAR)
    os.environ[grading.RESULTS_ENV_VAR] = results_file  # the kernel inherits this environment
    execution_error = None
    start = time.perf_counter()
    try:
        client = NotebookClient(
            notebook,
            timeout=cell_timeout,
            kernel_name=kernel,
            allow_errors=True,
            interrupt_on_timeout=True,
            resources={"metadata": {"path": str(path.resolve().parent)}},
        )
        try:
            client.execute()
        except DeadKernelError as exc:
            execution_error = f"the kernel died ({exc})"
        except Exception as exc:  # noqa: BLE001 - any failure to execute is reported, not raised
            execution_error = f"{type(exc).__name__}: {exc}"
        recorded = {}
        with open(results_file) as f:
            for line in f:
                if line.strip():
                    entry = json.loads(line)
                    recorded[entry["exercise_id"]] = entry  # a check run twice counts once: the last run
    finally:
        seconds = time.perf_counter() - start
        if previous is None:
            os.environ.pop(grading.RESULTS_ENV_VAR, None)
        else:
            os.environ[grading.RESULTS_ENV_VAR] = previous
        os.unlink(results_file)

    errors = _cell_errors(notebook)
    grade = NotebookGrade(str(path), seconds, cell_errors=errors, execution_error=execution_error)
    expected = expected_checks(notebook)
    for check_id in expected + [i for i in recorded if i not in expected]:
        grade.checks.append(recorded.get(check_id) or _not_run(check_id, notebook, errors, execution_error))
    return grade


def score_table(grades: list[NotebookGrade]) -> str:
    """The terminal summary: one row per check, a total per notebook and overall."""
    rows = [("notebook", "check", "score", "")]
    for grade in grades:
        for entry in grade.checks:
            failed = [p["name"] for p in entry["parts"] if not p["passed"]]
            note = entry.get("not_run") or (f"failed: {', '.join(failed)}" if failed else "")
            rows.append((grade.path, entry["exercise_id"], f"{entry['score']}/{entry['max_score']}", note[:70]))
        if not grade.checks:
            rows.append((grade.path, "(no checks found)", "0/0", ""))
        rows.append((grade.path, "total", f"{grade.score}/{grade.max_score}", f"{grade.seconds:.1f} s" + (f"; {grade.execution_error}" if grade.execution_error else "")))
    if len(grades) > 1:
        rows.append(("all notebooks", "total", f"{sum(g.score for g in grades)}/{sum(g.max_score for g in grades)}", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + ("  " + row[3] if row[3] else ""))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, metavar="PATH", help="exercise notebooks (.md or .ipynb)")
    parser.add_argument("--report", type=Path, default=None, help="JSON report file (default: _build/grade-report.json)")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT, help=f"seconds per cell (default {CELL_TIMEOUT})")
    parser.add_argument("--repeat", type=int, metavar="N", help="instead of grading: run --check N times in this process and time it")
    parser.add_argument("--check", metavar="ID", help="the check to repeat (with --repeat)")
    args = parser.parse_args(argv)
    missing = [p for p in args.notebooks if not p.is_file()]
    if missing:
        print(f"error: no such notebook: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    if args.repeat:
        notebooks = {c.id: c.notebook for c in grading.list_checks()}
        if args.check not in notebooks or len(args.notebooks) > 1:
            parser.error(f"--repeat N needs --check ID (one of {', '.join(notebooks)}) and at most one notebook")
        path = args.notebooks[0] if args.notebooks else paths.repo_root() / "solutions" / f"{notebooks[args.check]}.md"
        repeat_check(path, args.check, args.repeat)
        return 0
    if not args.notebooks:
        parser.error("name the notebooks to grade")
    grades = []
    for path in args.notebooks:
        print(f"grading {path} ...", flush=True)
        grades.append(grade_notebook(path, args.cell_timeout))
    print()
    print(score_table(grades))
    report_path = args.report or paths.build_dir() / "grade-report.json"
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "score": sum(g.score for g in grades),
        "max_score": sum(g.max_score for g in grades),
        "notebooks": [g.to_dict() for g in grades],
    }
    report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nreport written to {report_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Grade exercise notebooks from the command line: one notebook, or a whole class.

::

    python -m packlab.course.grade exercises/01_jpeg_dataset.md [more notebooks ...]
    make grade NB=exercises/01_jpeg_dataset.md
    python -m packlab.course.grade --class DIR          # DIR/<attendee>/exercises/*.md|ipynb -> DIR/gradebook.csv
    make gradebook CLASS=DIR
    python -m packlab.course.grade --repeat 20 --check per_worker_zip   # the solution's, 20 times

Each notebook (MyST ``.md`` through jupytext, or ``.ipynb``) runs top to bottom in a
fresh kernel, with its own folder as working directory, the way a grader would run it.
A cell that raises does not stop the run: later cells, and their checks, still run. A
cell that runs longer than ``--cell-timeout``, a notebook that runs longer than
``--notebook-timeout``, or a kernel that dies stops that notebook: its kernel is shut
down, and the checks it did not reach score 0. Every :func:`packlab.course.grading.check` in
the notebook records its result in a file the grader names in the kernel's environment
(:data:`packlab.course.grading.RESULTS_ENV_VAR`).

The grader knows which checks a notebook is meant to run by reading its code cells
(every ``check("<id>", ...)`` call not marked ``record=False``) and, for an exercise
notebook, from the checks registered for it. A check that never ran — its cell was not
reached, raised before the check, or is gone — scores 0 of its parts, and the report
says why. The score table goes to the terminal and the full report, every part of
every check, to a JSON file (``--report``).

``--class DIR`` grades a workshop: every attendee's exercise notebooks, found as
``DIR/<attendee>/exercises/NN_topic.md`` (or ``.ipynb``), one after the other, each in a
fresh kernel. The ``<attendee>.zip`` files ``make submit`` writes can simply be put into
``DIR``: each is unpacked into that layout first (:func:`packlab.course.release.unpack_submissions`). It writes one CSV (``--csv``, default ``DIR/gradebook.csv``) with a row per
attendee, exercise, check and part (``passed`` 0 or 1) and total rows, and prints a
table with one line per attendee. A notebook that hangs or crashes is named in its
total row's note and never stops the run.

``--repeat N --check ID [NOTEBOOK]`` runs one check of one notebook (by default the
solution notebook) N times in a row in this process (its defining cells run here, not
in a kernel) and prints the minimum, median and maximum wall time: a way to look for a
failure that shows only now and then.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import linecache
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packlab import paths
from packlab.course import grading

#: Seconds one cell may run; a cell that takes longer stops its notebook (its kernel is shut down).
CELL_TIMEOUT = 600
#: Seconds a whole notebook may run.
NOTEBOOK_TIMEOUT = 1800


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
    does, so :func:`packlab.course.grading.importable_copy` finds the cell that defines a class.
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
    looked for: ``python -m packlab.course.grade --repeat 20 --check per_worker_zip
    solutions/03_per_worker_zip.md``. The CPU time (this process and the processes the
    check started) tells what a run would take on an idle machine, where two cores run
    it about twice as fast as one. Returns the wall times.
    """
    candidates = dict(notebook_candidates(path))
    if check_id not in candidates:
        raise SystemExit(f"error: {path} has no graded check({check_id!r}, ...) call")
    seconds, cpu, failures = [], [], 0
    for run in range(1, times + 1):
        start, cpu_start = time.perf_counter(), _cpu_seconds()
        result = grading.check(check_id, candidates[check_id], quiet=True, record=False)
        seconds.append(time.perf_counter() - start)
        cpu.append(_cpu_seconds() - cpu_start)
        failed = [f"{p.name}: {p.message.splitlines()[0][:120]}" for p in result.parts if not p.passed]
        failures += bool(failed)
        print(
            f"run {run:2d}/{times}: {seconds[-1]:6.1f} s wall, {cpu[-1]:5.1f} s CPU  "
            f"{result.score}/{result.max_score}  {'; '.join(failed)}",
            flush=True,
        )
    print(
        f"{check_id} x {times}: wall min {min(seconds):.1f} s, median {statistics.median(seconds):.1f} s, "
        f"max {max(seconds):.1f} s; CPU median {statistics.median(cpu):.1f} s; {failures} run(s) with a failed part"
    )
    return seconds


def _cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (check children, workers), user and system."""
    try:
        import resource
    except ImportError:  # Windows: this process only
        return time.process_time()
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


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
    reason = "the check did not run" if not execution_error else f"the check did not run: {execution_error}"
    if not any(check_id in [i for i, _ in check_calls(c.source)] for c in notebook.cells if c.cell_type == "code"):
        reason = f"the notebook has no check({check_id!r}, ...) cell"
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


class _NotebookOutOfTime(Exception):
    """Raised (through nbclient) when a notebook has used up its time limit."""


def grade_notebook(path: Path, cell_timeout: float = CELL_TIMEOUT, notebook_timeout: float = NOTEBOOK_TIMEOUT) -> NotebookGrade:
    """Execute one notebook in a fresh kernel and collect its checks (see the module docstring).

    A cell may run ``cell_timeout`` seconds and the whole notebook ``notebook_timeout``.
    A cell that runs longer, or a kernel that dies, stops the notebook there: its kernel
    is shut down (killed if need be), the checks recorded so far count, and the others
    score 0 with the reason. Grading never hangs on an attendee's notebook.
    """
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    path = Path(path)
    notebook = read_notebook(path)
    kernel = notebook.metadata.get("kernelspec", {}).get("name", "python3")
    handle, results_file = tempfile.mkstemp(prefix="packlab-grade-", suffix=".jsonl")
    os.close(handle)
    previous = os.environ.get(grading.RESULTS_ENV_VAR)
    os.environ[grading.RESULTS_ENV_VAR] = results_file  # the kernel inherits this environment
    execution_error = None
    start = time.perf_counter()
    deadline = time.monotonic() + notebook_timeout
    running = {"cell": None, "limit": cell_timeout}

    def on_cell_start(cell, cell_index):
        running["cell"] = cell_index

    def cell_limit(cell) -> float:
        left = deadline - time.monotonic()
        if left <= 1:
            raise _NotebookOutOfTime(f"the notebook's time limit of {notebook_timeout:.0f} s was used up before cell {running['cell']}")
        running["limit"] = min(cell_timeout, left)
        return running["limit"]

    try:
        client = NotebookClient(
            notebook,
            timeout_func=cell_limit,
            kernel_name=kernel,
            allow_errors=True,
            interrupt_on_timeout=False,
            shutdown_kernel="immediate",  # the checks have written their results; a stuck kernel is killed
            extra_arguments=["--IPKernelApp.log_level=ERROR"],  # not a warning per kernel about its local TCP ports
            on_cell_start=on_cell_start,
            resources={"metadata": {"path": str(path.resolve().parent)}},
        )
        try:
            client.execute()
        except CellTimeoutError:
            execution_error = f"cell {running['cell']} did not finish within {running['limit']:.0f} s: the notebook was stopped there"
        except DeadKernelError:
            execution_error = f"the kernel died in cell {running['cell']}: the notebook was stopped there"
        except _NotebookOutOfTime as exc:
            execution_error = str(exc)
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
    # An exercise notebook is graded on all of its exercise's checks, also those whose cells are gone.
    expected += [c.id for c in grading.list_checks() if c.notebook == path.stem and c.id not in expected]
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


# ----------------------------------------------------------------------- a whole class


#: The columns of the gradebook CSV. A part's row has passed 0 or 1 and max 1; a row with
#: part TOTAL sums an exercise (check ALL) or all of an attendee's exercises (exercise ALL).
GRADEBOOK_FIELDS = ("attendee", "exercise", "check", "part", "passed", "max", "note")


@dataclass(frozen=True)
class GradebookRow:
    """One line of the gradebook: a part of a check of an attendee's exercise, or a total."""

    attendee: str
    exercise: str
    check: str
    part: str
    passed: int
    max: int
    note: str = ""


def class_notebooks(folder: Path) -> dict[str, dict[str, Path]]:
    """``{attendee: {exercise: notebook}}`` for the notebooks ``folder/<attendee>/exercises/NN_*.md|ipynb``.

    When an exercise is there both as ``.md`` and as ``.ipynb`` (jupytext pairs them),
    the one saved last is graded. Folders whose names start with a dot are skipped.
    """
    out = {}
    for attendee in sorted(p for p in Path(folder).iterdir() if p.is_dir() and not p.name.startswith(".")):
        found: dict[str, Path] = {}
        for path in sorted((attendee / "exercises").glob("[0-9]*")):
            if path.suffix in (".md", ".ipynb") and (path.stem not in found or path.stat().st_mtime > found[path.stem].stat().st_mtime):
                found[path.stem] = path
        out[attendee.name] = found
    return out


def _first_line(text: str, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _exercise_rows(attendee: str, exercise: str, grade: NotebookGrade | None, problem: str = "") -> list[GradebookRow]:
    """The rows of one attendee's exercise: a row per part of every check, then the exercise's total.

    Without a grade (no notebook, or one that could not be read) every part of the
    exercise's checks scores 0, with ``problem`` as the note.
    """
    if grade is None:
        checks = [
            {"exercise_id": c.id, "parts": [{"name": p, "passed": False, "message": problem} for p in c.parts]}
            for c in grading.list_checks() if c.notebook == exercise
        ]
    else:
        checks = grade.checks
    rows = []
    for entry in checks:
        for part in entry["parts"]:
            note = "" if part["passed"] else _first_line(entry.get("not_run") or part.get("message", ""))
            rows.append(GradebookRow(attendee, exercise, entry["exercise_id"], part["name"], int(part["passed"]), 1, note))
    note = problem if grade is None else (grade.execution_error or "")
    rows.append(GradebookRow(attendee, exercise, "ALL", "TOTAL", sum(r.passed for r in rows), len(rows), note))
    return rows


def grade_class(
    folder: Path,
    cell_timeout: float = CELL_TIMEOUT,
    notebook_timeout: float = NOTEBOOK_TIMEOUT,
    exercises: list[str] | None = None,
    log=print,
) -> list[GradebookRow]:
    """Grade every attendee's exercise notebooks under ``folder`` (see :func:`class_notebooks`).

    Each notebook runs in a fresh kernel within the time limits of :func:`grade_notebook`.
    ``exercises`` (notebook stems) defaults to every exercise any attendee has; an
    attendee without one of them scores 0 on it. Nothing an attendee's notebook does
    stops the run: a notebook that hangs, crashes its kernel or cannot be read scores 0
    on the parts it did not reach, and its row says why.
    """
    notebooks = class_notebooks(folder)
    stems = exercises or sorted({stem for found in notebooks.values() for stem in found})
    rows: list[GradebookRow] = []
    for attendee, found in notebooks.items():
        mine: list[GradebookRow] = []
        for stem in stems:
            path = found.get(stem)
            if path is None:
                mine += _exercise_rows(attendee, stem, None, f"no notebook exercises/{stem}.md or .ipynb")
                continue
            log(f"grading {attendee}/{path.relative_to(Path(folder) / attendee)} ...")
            try:
                grade = grade_notebook(path, cell_timeout, notebook_timeout)
            except Exception as exc:  # noqa: BLE001 - one attendee's broken file must not stop the class
                mine += _exercise_rows(attendee, stem, None, f"could not be graded: {type(exc).__name__}: {_first_line(str(exc))}")
                continue
            mine += _exercise_rows(attendee, stem, grade)
        totals = [r for r in mine if r.part == "TOTAL"]
        mine.append(GradebookRow(attendee, "ALL", "ALL", "TOTAL", sum(r.passed for r in totals), sum(r.max for r in totals)))
        rows += mine
    return rows


def write_gradebook(rows: list[GradebookRow], path: Path) -> Path:
    """Write the gradebook CSV (columns :data:`GRADEBOOK_FIELDS`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(GRADEBOOK_FIELDS)
        writer.writerows([getattr(row, name) for name in GRADEBOOK_FIELDS] for row in rows)
    return path


def gradebook_table(rows: list[GradebookRow]) -> str:
    """One line per attendee: the score of each exercise, the total, and why a notebook stopped."""
    exercises = list(dict.fromkeys(r.exercise for r in rows if r.part == "TOTAL" and r.exercise != "ALL"))
    table = [["attendee", *exercises, "total", "notes"]]
    for attendee in dict.fromkeys(r.attendee for r in rows):
        totals = {r.exercise: r for r in rows if r.attendee == attendee and r.part == "TOTAL"}
        notes = "; ".join(f"{e}: {totals[e].note}" for e in exercises if e in totals and totals[e].note)
        table.append([attendee, *(f"{totals[e].passed}/{totals[e].max}" for e in exercises), f"{totals['ALL'].passed}/{totals['ALL'].max}", notes])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + ("  " + row[-1] if row[-1] else "") for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  -----")
    return "\n".join(line.rstrip() for line in lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, metavar="PATH", help="exercise notebooks (.md or .ipynb)")
    parser.add_argument("--report", type=Path, default=None, help="JSON report file (default: _build/grade-report.json)")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT, help=f"seconds per cell (default {CELL_TIMEOUT})")
    parser.add_argument("--repeat", type=int, metavar="N", help="instead of grading: run --check N times in this process and time it")
    parser.add_argument("--check", metavar="ID", help="the check to repeat (with --repeat)")
    parser.add_argument("--class", dest="class_dir", type=Path, metavar="DIR",
                        help="grade every DIR/<attendee>/exercises/NN_*.md|ipynb into a gradebook")
    parser.add_argument("--csv", type=Path, default=None, help="the gradebook CSV (default: DIR/gradebook.csv)")
    parser.add_argument("--exercises", default=None, metavar="STEMS",
                        help="comma-separated exercises to grade, e.g. 01_jpeg_dataset,05_shard_split (default: all found)")
    parser.add_argument("--notebook-timeout", type=float, default=NOTEBOOK_TIMEOUT,
                        help=f"seconds per notebook (default {NOTEBOOK_TIMEOUT})")
    args = parser.parse_args(argv)
    if args.class_dir is not None:
        if not args.class_dir.is_dir():
            print(f"error: no such folder: {args.class_dir}", file=sys.stderr)
            return 2
        exercises = [s.strip() for s in args.exercises.split(",") if s.strip()] if args.exercises else None
        from packlab.course import release

        try:
            unpacked = release.unpack_submissions(args.class_dir)
        except release.ReleaseError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if unpacked:
            print(f"unpacked {len(unpacked)} submission(s) of make submit: {', '.join(unpacked)}")
        rows = grade_class(args.class_dir, args.cell_timeout, args.notebook_timeout, exercises)
        csv_path = write_gradebook(rows, args.csv or args.class_dir / "gradebook.csv")
        print()
        print(gradebook_table(rows))
        print(f"\ngradebook written to {csv_path}")
        return 0
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
        grades.append(grade_notebook(path, args.cell_timeout, args.notebook_timeout))
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

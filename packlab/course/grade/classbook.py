"""Grading a class: every attendee's notebooks into one CSV, a summary per part, a feedback file each.

``python -m packlab.course.grade --class DIR`` (``make gradebook CLASS=DIR``) finds the
notebooks as ``DIR/<attendee>/exercises/NN_topic.md`` (or ``.ipynb``; the ``<attendee>.zip``
files of ``make submit`` are unpacked into that layout first) and grades each one with
:func:`packlab.course.grade.grader.grade_notebook`, ``--jobs N`` at a time. Three outputs:

* **the gradebook** (``--csv``, default ``DIR/gradebook.csv``): a row per attendee,
  exercise, check and part (``passed`` 0 or 1, ``status`` passed, failed or not started),
  and total rows; a table with one line per attendee goes to the terminal;
* **the summary** (``--summary``): per part of every check, how many attendees passed,
  failed or did not start it: where the room stands, and what to go over again;
* **feedback** (``--feedback FOLDER``): ``FOLDER/<attendee>.md``, one Markdown file per
  attendee with their parts, the message of each failed one and its nudge (the level-1
  hint of :mod:`packlab.course.grading.teaching`), and what stopped a notebook.

A notebook that hangs, crashes or misbehaves is named in its rows and never stops the run.
The class folder itself is hidden from every sandbox: no notebook sees another's.
"""

from __future__ import annotations

import csv
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packlab.course import grading
from packlab.course.grade.execute import CELL_TIMEOUT, NOTEBOOK_TIMEOUT
from packlab.course.grade.grader import NotebookGrade, SandboxMissing, grade_notebook
from packlab.course.grading import teaching

#: The columns of the gradebook CSV. A part's row has passed 0 or 1, max 1 and its status
#: (passed, failed, not started); a row with part TOTAL sums an exercise (check ALL) or all
#: of an attendee's exercises (exercise ALL).
GRADEBOOK_FIELDS = ("attendee", "exercise", "check", "part", "passed", "max", "note", "status")


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
    status: str = ""


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


def _cell_error(error: dict) -> str:
    return f"{error['cell']} ({error['ename']}: {_first_line(error['evalue'], 80)})"


def _status(part: dict) -> str:
    return "passed" if part["passed"] else "not started" if part.get("not_started") else "failed"


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
            status = "not run" if entry.get("not_run") else _status(part)
            rows.append(GradebookRow(attendee, exercise, entry["exercise_id"], part["name"], int(part["passed"]), 1, note,
                                     status))
    note = problem if grade is None else "; ".join(
        ([grade.execution_error] if grade.execution_error else [])
        + ([f"cells that raised: {', '.join(_cell_error(e) for e in grade.cell_errors)}"] if grade.cell_errors else [])
        + grade.notes)
    rows.append(GradebookRow(attendee, exercise, "ALL", "TOTAL", sum(r.passed for r in rows), len(rows), note))
    return rows


def grade_class(
    folder: Path,
    cell_timeout: float = CELL_TIMEOUT,
    notebook_timeout: float = NOTEBOOK_TIMEOUT,
    exercises: list[str] | None = None,
    log=print,
    jobs: int = 1,
    sandboxed: bool = True,
    grades: dict | None = None,
) -> list[GradebookRow]:
    """Grade every attendee's exercise notebooks under ``folder`` (see :func:`class_notebooks`).

    ``jobs`` notebooks are graded at a time (each in sandboxes of its own). ``exercises``
    (notebook stems) defaults to every exercise any attendee has; an attendee without one
    of them scores 0 on it. Nothing an attendee's notebook does stops the run: a notebook
    that hangs, crashes its kernel or cannot be read scores 0 on the parts it did not
    reach, and its row says why. ``grades``, when given, receives ``{(attendee, stem):
    NotebookGrade}`` (for the feedback files).
    """
    folder = Path(folder)
    notebooks = class_notebooks(folder)
    stems = exercises or sorted({stem for found in notebooks.values() for stem in found})
    tasks = [(attendee, stem, found[stem]) for attendee, found in notebooks.items() for stem in stems if stem in found]

    def one(task):
        attendee, stem, path = task
        log(f"grading {attendee}/{path.relative_to(folder / attendee)} ...")
        try:
            return grade_notebook(path, cell_timeout, notebook_timeout, sandboxed=sandboxed, hidden=[folder]), None
        except SandboxMissing:
            raise
        except Exception as exc:  # noqa: BLE001 - one attendee's broken file must not stop the class
            return None, f"could not be graded: {type(exc).__name__}: {_first_line(str(exc))}"

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        outcomes = dict(zip([(a, s) for a, s, _ in tasks], pool.map(one, tasks)))
    rows: list[GradebookRow] = []
    for attendee, found in notebooks.items():
        mine: list[GradebookRow] = []
        for stem in stems:
            if stem not in found:
                mine += _exercise_rows(attendee, stem, None, f"no notebook exercises/{stem}.md or .ipynb")
                continue
            grade, problem = outcomes[(attendee, stem)]
            if grades is not None and grade is not None:
                grades[(attendee, stem)] = grade
            mine += _exercise_rows(attendee, stem, grade, problem or "")
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


def summary_table(rows: list[GradebookRow]) -> str:
    """Per part of every check: how many attendees passed, failed, did not start it (or did not reach it)."""
    parts = [r for r in rows if r.part != "TOTAL"]
    keys = list(dict.fromkeys((r.exercise, r.check, r.part) for r in parts))
    table = [["exercise", "check", "part", "passed", "failed", "not started", "not run"]]
    for key in keys:
        mine = [r for r in parts if (r.exercise, r.check, r.part) == key]
        count = {s: sum(r.status == s for r in mine) for s in ("passed", "failed", "not started", "not run")}
        table.append([*key, f"{count['passed']}/{len(mine)} ({100 * count['passed'] / len(mine):.0f} %)",
                      str(count["failed"]), str(count["not started"]), str(count["not run"])])
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def feedback_text(attendee: str, rows: list[GradebookRow], grades: dict) -> str:
    """One attendee's feedback in Markdown: per exercise its score, each part, and what to look at for the others."""
    mine = [r for r in rows if r.attendee == attendee]
    total = next(r for r in mine if r.exercise == "ALL")
    out = [f"# Feedback for {attendee}", "", f"{total.passed} of {total.max} parts passed.", ""]
    for exercise in dict.fromkeys(r.exercise for r in mine if r.exercise != "ALL"):
        rows_here = [r for r in mine if r.exercise == exercise]
        exercise_total = next(r for r in rows_here if r.part == "TOTAL")
        out += [f"## {exercise}: {exercise_total.passed}/{exercise_total.max}", ""]
        grade = grades.get((attendee, exercise))
        messages = {(c["exercise_id"], p["name"]): p.get("message", "") for c in (grade.checks if grade else []) for p in c["parts"]}
        descriptions = {(c.id, name): c.description for c in grading.list_checks() for name in c.parts}
        for row in rows_here:
            if row.part == "TOTAL":
                continue
            mark = {"passed": "✓", "not started": "·"}.get(row.status, "✗")
            out.append(f"- {mark} `{row.check}` / `{row.part}`" + ("" if row.passed else f" ({row.status})"))
            if not row.passed and row.status in ("failed", "not run"):
                message = messages.get((row.check, row.part)) or row.note
                out += [f"  - what happened: {line}" for line in message.strip().splitlines()[:4] if line.strip()]
                if row.status == "failed":
                    out.append(f"  - think: {teaching.nudge(row.check, row.part, descriptions.get((row.check, row.part), ''))}")
        if exercise_total.note:
            out += ["", f"Note: {exercise_total.note}"]
        if grade is not None and grade.cell_errors:
            out += ["", "Cells that raised when your notebook ran:"]
            out += [f"- cell {e['cell']}: {e['ename']}: {_first_line(e['evalue'])}" for e in grade.cell_errors]
        out.append("")
    out += ["Run `check(...)` in your notebook for the full messages; `hints=2` adds a hint at the code."]
    return "\n".join(out) + "\n"


def write_feedback(rows: list[GradebookRow], grades: dict, folder: Path) -> list[Path]:
    """``folder/<attendee>.md`` for every attendee in ``rows``; returns the files written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for attendee in dict.fromkeys(r.attendee for r in rows):
        target = folder / f"{attendee}.md"
        target.write_text(feedback_text(attendee, rows, grades), encoding="utf-8")
        written.append(target)
    return written

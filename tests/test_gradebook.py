"""The gradebook: a class of three attendees graded into one CSV, a hanging notebook included.

``python -m packlab.course.grade --class DIR`` runs every attendee's exercise notebooks, each in
a fresh kernel in a sandbox, runs their checks itself, and writes one row per attendee,
exercise, check and part. Here alice hands in the solutions, bob the untouched
exercises, and carol a solution whose second notebook hangs in a cell between its two
checks. The CSV must say exactly that: alice passes every part, bob none (every part
"not started"), carol all but the check after the hang, and her hanging notebook is named
without stopping the run. Two notebooks are graded at a time (``--jobs 2``); the summary
counts each part's passes, and every attendee gets a feedback file.

To keep this quick the notebooks hold only the cells grading needs (the imports, the
definitions and the check cells of two exercises, not the demonstrations), and the cell
time limit is short.
"""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import nbformat

from packlab import paths
from packlab.course import grade, grading

ROOT = paths.repo_root()
EXERCISES = ["01_jpeg_dataset", "05_shard_split"]
# Each kept check takes a few seconds (up to about ten on a loaded machine); carol's hang costs this long.
CELL_TIMEOUT = 20
HANG = "import time\ntime.sleep(3600)  # carol's cell that never finishes"


def graded_cells_only(source: Path, hang_before_check: str | None = None):
    """The notebook at ``source`` without its demonstrations: the first cell (it imports check),
    the cells that define what is checked, and the check cells; optionally a hanging cell
    just before the cell that runs ``hang_before_check``."""
    notebook = grade.read_notebook(source)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    calls = [call for cell in code for call in grade.check_calls(cell.source)]
    definitions = set(grade.definition_cells(notebook, {name for _, name in calls}))
    kept = []
    for index, cell in enumerate(code):
        checks = [check_id for check_id, _ in grade.check_calls(cell.source)]
        if hang_before_check in checks:
            kept.append(nbformat.v4.new_code_cell(HANG))
        if index == 0 or checks or cell.source in definitions:
            kept.append(nbformat.v4.new_code_cell(cell.source))
    trimmed = nbformat.v4.new_notebook(cells=kept, metadata=notebook.metadata)
    return jupytext.writes(trimmed, fmt="md:myst")


def make_class(folder: Path) -> None:
    handed_in = {
        "alice": {stem: graded_cells_only(ROOT / "solutions" / f"{stem}.md") for stem in EXERCISES},
        "bob": {stem: graded_cells_only(ROOT / "exercises" / f"{stem}.md") for stem in EXERCISES},
        "carol": {
            "01_jpeg_dataset": graded_cells_only(ROOT / "solutions" / "01_jpeg_dataset.md"),
            "05_shard_split": graded_cells_only(ROOT / "solutions" / "05_shard_split.md", hang_before_check="rank_dataset"),
        },
    }
    for attendee, notebooks in handed_in.items():
        (folder / attendee / "exercises").mkdir(parents=True)
        for stem, text in notebooks.items():
            (folder / attendee / "exercises" / f"{stem}.md").write_text(text)


def expected_rows() -> list[tuple[str, ...]]:
    """The gradebook without its notes, from the checks' registered parts."""
    checks = [c for c in grading.list_checks() if c.notebook in EXERCISES]
    rows = []
    for attendee in ("alice", "bob", "carol"):
        total = 0
        for stem in EXERCISES:
            parts = [(c.id, part) for c in checks if c.notebook == stem for part in c.parts]
            for check_id, part in parts:
                passed = attendee == "alice" or (attendee == "carol" and check_id != "rank_dataset")
                rows.append((attendee, stem, check_id, part, str(int(passed)), "1"))
            score = sum(int(r[4]) for r in rows[-len(parts):])
            rows.append((attendee, stem, "ALL", "TOTAL", str(score), str(len(parts))))
            total += score
        maximum = sum(len(c.parts) for c in checks)
        rows.append((attendee, "ALL", "ALL", "TOTAL", str(total), str(maximum)))
    return rows


def test_a_class_is_graded_into_one_csv_and_a_hanging_notebook_is_named(tmp_path):
    make_class(tmp_path / "class")
    gradebook = tmp_path / "gradebook.csv"
    start = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "packlab.course.grade", "--class", str(tmp_path / "class"), "--csv", str(gradebook),
         "--cell-timeout", str(CELL_TIMEOUT), "--notebook-timeout", "600", "--jobs", "2", "--summary",
         "--feedback", str(tmp_path / "feedback")],
        capture_output=True, text=True, timeout=1800,
    )
    seconds = time.monotonic() - start
    assert run.returncode == 0, run.stderr
    with open(gradebook, newline="") as f:
        table = list(csv.reader(f))
    assert tuple(table[0]) == grade.GRADEBOOK_FIELDS
    assert [tuple(row[:6]) for row in table[1:]] == expected_rows(), run.stdout
    notes = {(row[0], row[1], row[2], row[3]): row[6] for row in table[1:]}
    hang = f"did not finish within {CELL_TIMEOUT} s"
    assert hang in notes[("carol", "05_shard_split", "ALL", "TOTAL")]
    assert hang in notes[("carol", "05_shard_split", "rank_dataset", "one_rank")]
    assert notes[("carol", "05_shard_split", "shard_split", "exactly_once")] == ""
    assert "NotImplementedError" in notes[("bob", "01_jpeg_dataset", "jpeg_dataset", "length")]
    # The printed table: one line per attendee, carol's stopped notebook named.
    lines = {line.split()[0]: line for line in run.stdout.splitlines() if line.split() and line.split()[0] in ("alice", "bob", "carol")}
    assert set(lines) == {"alice", "bob", "carol"} and hang in lines["carol"]
    statuses = {(row[0], row[3]): row[7] for row in table[1:] if row[2] == "shard_split"}
    assert statuses[("alice", "exactly_once")] == "passed" and statuses[("bob", "exactly_once")] == "not started"
    # The summary: per part, passed out of the class, failed, not started, not reached.
    summary = next(line for line in run.stdout.splitlines() if line.startswith("05_shard_split") and " one_rank " in line)
    assert summary.split()[3:8] == ["1/3", "(33", "%)", "0", "1"], summary
    feedback = {path.stem: path.read_text() for path in (tmp_path / "feedback").glob("*.md")}
    assert set(feedback) == {"alice", "bob", "carol"}
    assert "18 of 18 parts passed" in feedback["alice"] and "(not started)" in feedback["bob"]
    assert hang in feedback["carol"] and "think:" not in feedback["bob"], "a part not started gets no nudge"
    print(f"graded 3 attendees x {len(EXERCISES)} exercises in {seconds:.0f} s")

"""Exercise 4 in stages: an attendee who wrote only the core parts gets a notebook that ends without an error.

The instructor guide tells a room that is behind to do exercise 4's core parts only:
the writer, and a reader that splits shards between workers. Such an attendee's
notebook is built here from the solution: every solution block kept except those of
the stretch parts (``set_epoch`` and the shuffle buffer), which stay the exercise's
stubs. Run top to bottom in a fresh kernel (the check cells left out: their parts are
tested elsewhere), it must end without an error: its last cell reads the shards in
order, once, and says that the shuffling is still to come. The same cell with the
stretch parts written (the solution notebook, under nbval) compares two shuffled epochs.
"""

from __future__ import annotations

import re

from packlab import paths
from packlab.course import exercises
from packlab.course.grade import execute
from packlab.course.grading import teaching

SOLUTION = paths.repo_root() / "solutions" / "04_tar_shards.md"
STRETCH_METHODS = set(teaching.STRETCH_CODE["04_tar_shards"])
CHECK_CELL = re.compile(r"^```\{code-cell\}[^\n]*\nresult = check\(.*?^```\n", re.S | re.M)


def core_only(solution: str) -> str:
    """The solution with the stretch methods' blocks stubbed, its hidden asserts and its check cells removed."""
    out, method, skipping, hidden = [], None, False, False
    for line in solution.splitlines(keepends=True):
        stripped = line.strip()
        found = re.match(r"\s*def (\w+)\(", line)
        if found:
            method = found.group(1)
        if stripped == exercises.BEGIN_HIDDEN:
            hidden = True
            continue
        if stripped == exercises.END_HIDDEN:
            hidden = False
            continue
        if hidden:
            continue
        if stripped == exercises.BEGIN_SOLUTION and method in STRETCH_METHODS:
            out.append(line.replace(exercises.BEGIN_SOLUTION, exercises.STUB))
            skipping = True
            continue
        if skipping:
            skipping = stripped != exercises.END_SOLUTION
            continue
        if stripped not in (exercises.BEGIN_SOLUTION, exercises.END_SOLUTION):
            out.append(line)
    return CHECK_CELL.sub("", "".join(out))


def test_a_core_only_notebook_of_exercise_4_ends_without_an_error(tmp_path):
    text = core_only(SOLUTION.read_text())
    assert text.count(exercises.STUB) == 2 and "self._epoch[0] = epoch" not in text and "check(" not in text.split("\n## ")[-1]
    notebook_path = tmp_path / "04_tar_shards.md"
    notebook_path.write_text(text)
    notebook, error = execute.execute(notebook_path, cell_timeout=300, notebook_timeout=900)
    assert error is None, error
    errors = [f"{o.get('ename')}: {o.get('evalue')}" for cell in notebook.cells for o in cell.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    last = "".join(o.get("text", "") for o in notebook.cells[-2].get("outputs", []) if o.get("output_type") == "stream")
    assert "epoch 0: " in last and "epoch 1" not in last and "not written yet" in last, last

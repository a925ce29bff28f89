"""Grade exercise notebooks from the command line: one notebook, or a whole class, in a sandbox.

::

    python -m packlab.course.grade exercises/01_jpeg_dataset.md [more notebooks ...]
    make grade NB=exercises/01_jpeg_dataset.md
    python -m packlab.course.grade --class DIR --jobs 2 --summary --feedback DIR/feedback
    make gradebook CLASS=DIR                            # DIR/<attendee>/exercises/*.md|ipynb -> DIR/gradebook.csv
    python -m packlab.course.grade --repeat 20 --check per_worker_zip   # the solution's, 20 times

Each notebook (MyST ``.md`` through jupytext, or ``.ipynb``) is graded by
:func:`~packlab.course.grade.grader.grade_notebook`: it runs top to bottom in a fresh
kernel inside a sandbox (no network, its own folder the only one it can write, the
course read-only, a memory and a time limit: :mod:`packlab.course.sandbox`), and the
grader then runs the notebook's checks itself, on the notebook's definitions, in a
second sandbox. Only that second run scores: a notebook cannot write its own grade. A
check whose cell raised, or which the notebook never reached (a cell that hung past
``--cell-timeout``, a notebook past ``--notebook-timeout``, a kernel that died), scores 0
of its parts, and the report says why. The score table goes to the terminal and the full
report, every part of every check, to a JSON file (``--report``).

The grader knows which checks a notebook is meant to run by reading its code cells
(every ``check("<id>", ...)`` call not marked ``record=False`` and without ``parts=``)
and, for an exercise notebook, from the checks registered for it.

``--class DIR`` grades a workshop (:mod:`packlab.course.grade.classbook`): the gradebook
CSV, ``--summary`` (pass rates per part), ``--feedback FOLDER`` (one Markdown file per
attendee), ``--jobs N`` notebooks at a time. ``--no-sandbox`` grades without bubblewrap
(only for notebooks you trust: your own). ``--repeat N --check ID`` times one check
(:mod:`packlab.course.grade.repeat`).

The modules: :mod:`~packlab.course.grade.notebooks` (reading a notebook; the grader's own
run), :mod:`~packlab.course.grade.execute` (the kernel run), :mod:`~packlab.course.grade.grader`
(one notebook), :mod:`~packlab.course.grade.classbook` (a class), :mod:`~packlab.course.grade.cli`.
"""

from __future__ import annotations

from packlab.course.grade.classbook import (
    GRADEBOOK_FIELDS,
    GradebookRow,
    class_notebooks,
    feedback_text,
    grade_class,
    gradebook_table,
    summary_table,
    write_feedback,
    write_gradebook,
)
from packlab.course.grade.execute import CELL_TIMEOUT, NOTEBOOK_TIMEOUT
from packlab.course.grade.grader import NotebookGrade, SandboxMissing, grade_notebook, score_table
from packlab.course.grade.notebooks import (
    check_calls,
    definition_cells,
    expected_checks,
    notebook_candidates,
    own_run,
    read_notebook,
    run_cells_as_main,
)
from packlab.course.grade.repeat import repeat_check

__all__ = [
    "CELL_TIMEOUT",
    "GRADEBOOK_FIELDS",
    "NOTEBOOK_TIMEOUT",
    "GradebookRow",
    "NotebookGrade",
    "SandboxMissing",
    "check_calls",
    "class_notebooks",
    "definition_cells",
    "expected_checks",
    "feedback_text",
    "grade_class",
    "grade_notebook",
    "gradebook_table",
    "notebook_candidates",
    "own_run",
    "read_notebook",
    "repeat_check",
    "run_cells_as_main",
    "score_table",
    "summary_table",
    "write_feedback",
    "write_gradebook",
]

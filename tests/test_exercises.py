"""The exercise notebooks: generated from the solutions, solved by them, and not solved by the stubs.

* ``exercises/`` must be exactly what ``make exercises`` writes from ``solutions/``;
* the generator's rules (stubs, kept hints, removed hidden blocks and notes, errors);
* every check a solution notebook calls passes on that notebook's code, and scores 0 on
  every part on the untouched exercise's stubs;
* the command-line grader executes a notebook and scores its checks.

The notebooks' code cells are executed here the way a kernel executes them: as
``__main__``, with each cell's source registered in :mod:`linecache` under its own file
name (:func:`packlab.course.grade.run_cells_as_main`), so the checks rebuild classes for spawn
workers from their cell, as in Jupyter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from grading_support import NOTEBOOK_HEADER, SOLVED_SHARD_SPLIT

from packlab import paths
from packlab.course import exercises, grade, grading

ROOT = paths.repo_root()
SOLUTIONS = exercises.solution_notebooks()


notebook_candidates = grade.notebook_candidates


def all_calls() -> list[tuple[str, str]]:
    """``(notebook stem, check id)`` for every graded check call in the solution notebooks."""
    out = []
    for path in SOLUTIONS:
        notebook = grade.read_notebook(path)
        out += [(path.stem, check_id) for check_id in grade.expected_checks(notebook)]
    return out


# ---------------------------------------------------------------------------- generation


def test_exercises_are_generated_from_solutions():
    assert SOLUTIONS, "no solution notebooks found"
    problems = exercises.drift()
    assert not problems, "\n".join(problems) + "\nrun `make exercises`"


def test_generator_stubs_solutions_keeps_hints_and_drops_hidden_blocks_and_notes():
    solution = textwrap.dedent(
        '''\
        ---
        kernelspec:
          name: python3
        ---

        # Title

        <!-- BEGIN SOLUTION -->
        Only instructors read this.
        <!-- END SOLUTION -->

        Prose stays.

        ```{code-cell} ipython3
        def f(x):
            """Given."""
            # BEGIN SOLUTION
            # Hint: double it.
            y = 2 * x
            return y
            # END SOLUTION
        ```

        ```{code-cell} ipython3
        result = check("x", f)
        # BEGIN HIDDEN
        assert result.passed
        # END HIDDEN
        ```
        '''
    )
    text = exercises.exercise_text(solution, "solutions/99_x.md")
    assert "Only instructors" not in text and "BEGIN" not in text and "END" not in text
    assert "y = 2 * x" not in text and "assert result.passed" not in text
    assert '    """Given."""\n    # Hint: double it.\n    raise NotImplementedError("your code here")\n' in text
    assert 'result = check("x", f)\n```' in text
    assert "Prose stays." in text and "\n\n\n" not in text
    assert "% This file is written by `make exercises` from solutions/99_x.md" in text


def test_make_exercises_writes_changed_notebooks_and_removes_orphans(tmp_path):
    solutions, written = tmp_path / "solutions", tmp_path / "exercises"
    solutions.mkdir()
    written.mkdir()
    (solutions / "01_a.md").write_text("# A\n\n```{code-cell} ipython3\n# BEGIN SOLUTION\nx = 1\n# END SOLUTION\n```\n")
    (written / "07_orphan.md").write_text("left over")
    (written / "index.md").write_text("hand-written, kept")
    changed = exercises.write_exercises(solutions, written)
    assert sorted(p.name for p in changed) == ["01_a.md", "07_orphan.md"]
    assert sorted(p.name for p in written.iterdir()) == ["01_a.md", "index.md"]
    assert exercises.drift(solutions, written) == [] and exercises.write_exercises(solutions, written) == []
    (written / "01_a.md").write_text("edited by hand")
    assert exercises.drift(solutions, written) == [f"differs from its solution notebook: {written / '01_a.md'}"]


@pytest.mark.parametrize(
    "cell, problem",
    [
        ("# BEGIN SOLUTION\nx = 1\n", "is not closed"),
        ("x = 1\n# END SOLUTION\n", "without a matching BEGIN"),
        ("# BEGIN SOLUTION\n# BEGIN HIDDEN\n# END HIDDEN\n# END SOLUTION\n", "inside another marked block"),
        ("if True:\n# BEGIN SOLUTION\n    x = 1\n# END SOLUTION\n", "not valid Python once stubbed"),
    ],
)
def test_generator_rejects_malformed_markers_naming_the_line(cell, problem):
    solution = "# T\n\n```{code-cell} ipython3\n" + cell + "```\n"
    with pytest.raises(exercises.ExerciseSourceError, match=problem) as raised:
        exercises.exercise_text(solution, "solutions/99_bad.md")
    assert "solutions/99_bad.md" in str(raised.value)


def test_instructor_toc_adds_the_solutions_after_the_exercises():
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    instructor = yaml.safe_load(exercises.instructor_toc((ROOT / "_toc.yml").read_text()))
    files = lambda part: [c["file"] for c in part["chapters"]]  # noqa: E731
    captions = [p["caption"] for p in instructor["parts"]]
    exercises_at = next(i for i, p in enumerate(instructor["parts"]) if "exercises/index" in files(p))
    assert captions[exercises_at + 1] == "Solutions"
    # The solutions follow the exercises' order in _toc.yml (4a, the file 04a_..., before 4b, the file 04_...).
    in_toc = [f.split("/", 1)[1] for f in files(toc["parts"][exercises_at]) if f != "exercises/index"]
    assert files(instructor["parts"][exercises_at + 1]) == [f"solutions/{stem}" for stem in in_toc
                                                           if stem in {p.stem for p in SOLUTIONS}]
    assert sorted(files(instructor["parts"][exercises_at + 1])) == [f"solutions/{p.stem}" for p in SOLUTIONS]
    assert [p for i, p in enumerate(instructor["parts"]) if i != exercises_at + 1] == toc["parts"]
    for path in SOLUTIONS:
        assert f"exercises/{path.stem}" in files(toc["parts"][exercises_at]), f"{path.stem} is missing from _toc.yml"


def test_the_instructors_book_shares_the_attendees_execution_cache(tmp_path):
    """`make book-instructor` after `make test` must find every notebook nbval ran, not execute it again."""
    import yaml

    from packlab.course import pytest_book_cache

    assert exercises.main(["--instructor", str(tmp_path)]) == 0
    written = yaml.safe_load((tmp_path / "_config.yml").read_text())
    book = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert written["execute"].pop("cache") == str((ROOT / pytest_book_cache.BOOK_CACHE_DIR).resolve())
    assert written == book, "apart from the cache, the instructors' book is configured as the attendees' book"
    assert (tmp_path / "_toc.yml").exists()


def test_every_check_is_listed_and_used():
    listed = {info.id: info for info in grading.list_checks()}
    used = all_calls()
    assert {check_id for _, check_id in used} == set(listed), "a check is listed but no solution calls it, or the reverse"
    for stem, check_id in used:
        info = listed[check_id]
        assert info.notebook == stem, f"{check_id} is called in {stem} but listed for {info.notebook}"
        assert info.description and info.signature and info.parts


# ----------------------------------------------------------------- solutions and stubs


def test_every_check_cell_of_a_solution_asserts_that_it_passed():
    """The solution notebooks run under nbval in `make test`: a check that fails there must fail the run."""
    missing = []
    for path in SOLUTIONS:
        for cell in grade.read_notebook(path).cells:
            if cell.cell_type != "code" or not grade.check_calls(cell.source):
                continue
            for check_id, _ in grade.check_calls(cell.source):
                if "assert result.passed" not in cell.source:
                    missing.append(f"{path.name}: the cell that checks {check_id!r}")
    assert not missing, "check cells without `assert result.passed, result.report()`:\n" + "\n".join(missing)


# That every solution passes its checks is tested where it runs anyway: `make test` executes every
# solution notebook under nbval, and each check cell there asserts `result.passed`
# (test_every_check_cell_of_a_solution_asserts_that_it_passed keeps it so).


def test_the_spawn_part_of_the_solution_passes_every_time_in_one_process(capfd):
    """The spawn stall seen once in about seven checks must not come back unseen.

    A spawn worker is a new interpreter that imports torch before it reads anything; on a
    busy machine that took longer than the DataLoader's timeout for one batch, which is
    how the stall showed. The start-up now has a limit of its own. Three spawn parts in a
    row in one process must pass, and leave no complaint of the resource tracker
    (``make grade-repeat`` runs the whole check 20 times, for a quiet machine).
    """
    candidates = dict(notebook_candidates(ROOT / "solutions" / "03_per_worker_zip.md"))
    for _ in range(3):
        result = grading.check("per_worker_zip", candidates["per_worker_zip"], parts=["spawn"], quiet=True, record=False)
        assert result.passed, result.report()
    assert "resource_tracker" not in capfd.readouterr().err


@pytest.mark.parametrize("stem, check_id", all_calls())
def test_untouched_exercise_scores_zero_on_every_part(stem, check_id):
    candidates = dict(notebook_candidates(ROOT / "exercises" / f"{stem}.md"))
    result = grading.check(check_id, candidates[check_id], quiet=True, record=False)
    passed = [part.name for part in result.parts if part.passed]
    assert result.score == 0 and not passed, f"stub passes {passed}"
    assert all("NotImplementedError" in part.message for part in result.parts), result.report()
    # The first check of an untouched stub says "not started" and prints no hint of either level.
    assert all(part.not_started for part in result.parts), result.report()
    printed = result.report()
    assert "Not started yet" in printed and "hint:" not in printed and "think:" not in printed
    assert not any(part.hint in printed for part in result.parts)


# ------------------------------------------------------------------------------ grader

SPLIT_NOTEBOOK = NOTEBOOK_HEADER + SOLVED_SHARD_SPLIT + '''
```{code-cell} ipython3
raise RuntimeError("an unrelated cell fails; grading goes on")
```

```{code-cell} ipython3
result = check("shard_split", shards_for)
```

```{code-cell} ipython3
result = check("rank_dataset", NotDefinedAnywhere)
```
'''


def test_grade_command_scores_a_notebook_and_writes_a_report(tmp_path):
    notebook = tmp_path / "attempt.md"
    notebook.write_text(SPLIT_NOTEBOOK)
    report_path = tmp_path / "report.json"
    run = subprocess.run(
        [sys.executable, "-m", "packlab.course.grade", str(notebook), "--report", str(report_path), "--cell-timeout", "300"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(report_path.read_text())
    (graded,) = report["notebooks"]
    checks = {c["exercise_id"]: c for c in graded["checks"]}
    assert checks["shard_split"]["score"] == checks["shard_split"]["max_score"] == 5
    assert checks["rank_dataset"]["score"] == 0 and checks["rank_dataset"]["max_score"] == 4
    assert "NameError" in checks["rank_dataset"]["not_run"]
    assert {e["ename"] for e in graded["cell_errors"]} == {"RuntimeError", "NameError"}
    assert (report["score"], report["max_score"]) == (5, 9)
    assert "shard_split" in run.stdout and "5/5" in run.stdout and "5/9" in run.stdout


def test_check_calls_finds_graded_calls_only():
    source = 'a = check("tar_write", write_shards)\nb = grading.check("tar_dataset", T, record=False)\ncheck(x)'
    assert grade.check_calls(source) == [("tar_write", "write_shards")]
    assert grade.check_calls('check("shard_split", f)\nthis is not python(') == [("shard_split", "f")]

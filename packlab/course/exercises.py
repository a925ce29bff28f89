"""Write the attendees' exercise notebooks from the instructors' solution notebooks.

One master copy per exercise: ``solutions/NN_topic.md`` (a MyST notebook) holds the task,
the solution and the checks. ``make exercises`` (``python -m packlab.course.exercises``) derives
``exercises/NN_topic.md`` from it mechanically, in the style of nbgrader:

* inside code cells, the lines between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` are
  replaced by a stub, ``raise NotImplementedError(...)``, at the indentation of the
  ``BEGIN`` marker. Comment lines in the block that start with ``# Hint`` are kept, above
  the stub, so the attendee sees them;
* inside code cells, the lines between ``# BEGIN HIDDEN`` and ``# END HIDDEN`` are removed
  (the assertions that make a solution notebook fail its test when a check fails);
* in markdown, everything between ``<!-- BEGIN SOLUTION -->`` and ``<!-- END SOLUTION -->``
  is removed (notes for instructors);
* a MyST comment after the front matter says which file the exercise is written from.

Each stubbed cell must still be valid Python, and markers must pair up; otherwise the
generator stops with an error naming the file and line. ``--check`` compares instead of
writing and fails when ``exercises/`` differs from what would be written (the test suite
runs the same comparison), so nobody edits an exercise by hand and loses it.

``--instructor DIR`` writes the instructors' book's table of contents and configuration
into DIR (see :func:`instructor_toc` and :func:`instructor_config`): the book's
``_toc.yml`` with a "Solutions" part, the solution notebooks, after the exercises.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from packlab import paths

BEGIN_SOLUTION = "# BEGIN SOLUTION"
END_SOLUTION = "# END SOLUTION"
BEGIN_HIDDEN = "# BEGIN HIDDEN"
END_HIDDEN = "# END HIDDEN"
BEGIN_NOTE = "<!-- BEGIN SOLUTION -->"
END_NOTE = "<!-- END SOLUTION -->"
#: What a solution block becomes.
STUB = 'raise NotImplementedError("your code here")'
#: Solution notebooks are the MyST files in solutions/ whose names start with a digit.
NOTEBOOK_GLOB = "[0-9]*.md"


class ExerciseSourceError(ValueError):
    """A solution notebook's markers are malformed; the message names the file and line."""


def _is_hint(line: str) -> bool:
    return line.strip().lower().startswith("# hint")


def exercise_text(solution: str, source_name: str) -> str:
    """The exercise notebook for one solution notebook's text (see the module docstring)."""
    out: list[str] = []
    in_code = False
    block: str | None = None  # "solution", "hidden" or "note" while inside a marked block
    block_start = 0
    indent = ""
    hints: list[str] = []
    cell_start = 0
    skip_blank = False  # after a removed note, so it leaves no double blank line behind
    lines = solution.splitlines(keepends=True)

    def fail(number: int, problem: str):
        raise ExerciseSourceError(f"{source_name}, line {number}: {problem}")

    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if skip_blank:
            skip_blank = False
            if not stripped:
                continue
        if not in_code and stripped.startswith("```{code-cell}"):
            in_code, cell_start = True, len(out) + 1
            out.append(line)
            continue
        if in_code and stripped == "```" and block is None:
            in_code = False
            _validate_cell(out[cell_start:], source_name, number)
            out.append(line)
            continue
        if in_code and stripped == "```":
            fail(block_start, f"'{BEGIN_SOLUTION if block == 'solution' else BEGIN_HIDDEN}' is not closed in its cell")
        marker = stripped if in_code else stripped if stripped in (BEGIN_NOTE, END_NOTE) else None
        if marker in (BEGIN_SOLUTION, BEGIN_HIDDEN, BEGIN_NOTE):
            if block is not None:
                fail(number, f"{marker!r} inside another marked block (opened on line {block_start})")
            block = {BEGIN_SOLUTION: "solution", BEGIN_HIDDEN: "hidden", BEGIN_NOTE: "note"}[marker]
            block_start, indent, hints = number, line[: len(line) - len(line.lstrip())], []
            continue
        if marker in (END_SOLUTION, END_HIDDEN, END_NOTE):
            expected = {"solution": END_SOLUTION, "hidden": END_HIDDEN, "note": END_NOTE}.get(block)
            if marker != expected:
                fail(number, f"{marker!r} without a matching BEGIN")
            if block == "solution":
                out += [f"{indent}{hint.strip()}\n" for hint in hints]
                out.append(f"{indent}{STUB}\n")
            skip_blank = block == "note" and bool(out) and not out[-1].strip()
            block = None
            continue
        if block == "solution":
            if _is_hint(line):
                hints.append(line)
            continue
        if block in ("hidden", "note"):
            continue
        out.append(line)
    if block is not None:
        fail(block_start, "marked block is never closed")

    return _add_origin_comment("".join(out), source_name)


def _validate_cell(cell_lines: list[str], source_name: str, line_number: int) -> None:
    """A stubbed cell must still parse; IPython magics (lines starting with % or !) are skipped."""
    code = "".join(line for line in cell_lines if not line.lstrip().startswith((":", "%", "!")))
    try:
        ast.parse(code)
    except SyntaxError as exc:
        raise ExerciseSourceError(
            f"{source_name}: the code cell ending on line {line_number} is not valid Python once stubbed "
            f"({exc.msg}); put the markers around whole statements"
        ) from None


def _add_origin_comment(text: str, source_name: str) -> str:
    """Insert a MyST comment (not rendered) after the YAML front matter."""
    comment = f"% This file is written by `make exercises` from {source_name}: edit that file, not this one.\n"
    if text.startswith("---\n"):
        end = text.index("\n---\n", 4) + len("\n---\n")
        return text[:end] + "\n" + comment + text[end:]
    return comment + "\n" + text


def solution_notebooks(solutions_dir: Path | None = None) -> list[Path]:
    """The solution notebooks, sorted by name."""
    folder = solutions_dir or paths.repo_root() / "solutions"
    return sorted(folder.glob(NOTEBOOK_GLOB))


def expected_exercises(solutions_dir: Path | None = None, exercises_dir: Path | None = None) -> dict[Path, str]:
    """What ``make exercises`` writes: ``{exercise path: text}``."""
    root = paths.repo_root()
    exercises_dir = exercises_dir or root / "exercises"
    out = {}
    for source in solution_notebooks(solutions_dir):
        try:
            name = source.relative_to(root).as_posix()
        except ValueError:
            name = source.name
        out[exercises_dir / source.name] = exercise_text(source.read_text(), name)
    return out


def write_exercises(solutions_dir: Path | None = None, exercises_dir: Path | None = None) -> list[Path]:
    """Write every exercise notebook that changed; remove generated notebooks whose solution is gone.

    Returns the paths written or removed.
    """
    expected = expected_exercises(solutions_dir, exercises_dir)
    if not expected:
        raise ExerciseSourceError(
            f"no solution notebooks in {solutions_dir or paths.repo_root() / 'solutions'}: an attendees' copy "
            "(make release) has none, and its exercises/ stay as released; nothing was written or removed"
        )
    exercises_dir = exercises_dir or paths.repo_root() / "exercises"
    exercises_dir.mkdir(parents=True, exist_ok=True)
    changed = sorted(set(exercises_dir.glob(NOTEBOOK_GLOB)) - set(expected))
    for stale in changed:
        stale.unlink()
    for path, text in expected.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed


def drift(solutions_dir: Path | None = None, exercises_dir: Path | None = None) -> list[str]:
    """How ``exercises/`` differs from what ``make exercises`` would write (empty when in sync)."""
    expected = expected_exercises(solutions_dir, exercises_dir)
    exercises_dir = exercises_dir or paths.repo_root() / "exercises"
    problems = []
    for path, text in expected.items():
        if not path.exists():
            problems.append(f"missing: {path}")
        elif path.read_text() != text:
            problems.append(f"differs from its solution notebook: {path}")
    for extra in sorted(set(exercises_dir.glob(NOTEBOOK_GLOB)) - set(expected)):
        problems.append(f"has no solution notebook: {extra}")
    return problems


def instructor_toc(toc_text: str, solutions_dir: Path | None = None) -> str:
    """The book's table of contents plus a "Solutions" part, right after the part listing the exercises.

    The exercises stay as attendees see them (so links between pages keep working) and
    each solution notebook, executed, follows in its own part.
    """
    import yaml

    toc = yaml.safe_load(toc_text)
    stems = [source.stem for source in solution_notebooks(solutions_dir)]
    parts = toc.get("parts", [])
    # In the exercises' order (4a before 4b, whose file is 04_tar_shards), not the files' names.
    listed = [c["file"].split("/", 1)[1] for part in parts for c in part.get("chapters", [])
              if c.get("file", "").startswith("exercises/")]
    stems.sort(key=lambda stem: (listed.index(stem) if stem in listed else len(listed), stem))
    holding = [i for i, part in enumerate(parts) if any(c.get("file", "").startswith("exercises/") for c in part.get("chapters", []))]
    solutions_part = {"caption": "Solutions", "chapters": [{"file": f"solutions/{stem}"} for stem in stems]}
    parts.insert(holding[-1] + 1 if holding else len(parts), solutions_part)
    toc["parts"] = parts
    header = "# The instructors' table of contents: _toc.yml plus the solutions (python -m packlab.course.exercises --instructor)\n"
    return header + yaml.safe_dump(toc, sort_keys=False)


def instructor_config(config_text: str, cache: Path) -> str:
    """The book's ``_config.yml`` with its execution cache set to ``cache``.

    The instructors' book is built with ``--path-output _build/instructor``, and Jupyter
    Book puts its execution cache under the output path unless the configuration names
    one. Naming the attendees' book's cache (``_build/.jupyter_cache``, which ``make test``
    fills with every chapter and solution nbval ran) lets the instructors' book reuse
    those runs: each notebook is executed once, whichever book is built first.
    """
    import yaml

    config = yaml.safe_load(config_text)
    config.setdefault("execute", {})["cache"] = str(cache)
    header = "# The instructors' book configuration: _config.yml with the shared execution cache (python -m packlab.course.exercises --instructor)\n"
    return header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.exercises", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="write nothing; exit 1 if exercises/ is out of date")
    action.add_argument("--instructor", type=Path, metavar="DIR",
                        help="write the instructors' book's _toc.yml and _config.yml into DIR")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = drift()
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                print("run `make exercises` to rewrite exercises/ from solutions/", file=sys.stderr)
                return 1
            print("exercises/ is up to date with solutions/")
            return 0
        if args.instructor:
            root = paths.repo_root()
            args.instructor.mkdir(parents=True, exist_ok=True)
            (args.instructor / "_toc.yml").write_text(instructor_toc((root / "_toc.yml").read_text()))
            cache = (root / "_build" / ".jupyter_cache").resolve()
            (args.instructor / "_config.yml").write_text(instructor_config((root / "_config.yml").read_text(), cache))
            print(f"wrote {args.instructor / '_toc.yml'} and {args.instructor / '_config.yml'}")
            return 0
        changed = write_exercises()
        for path in changed:
            print(f"{'wrote' if path.exists() else 'removed'} {path.relative_to(paths.repo_root())}")
        if not changed:
            print("exercises/ is up to date with solutions/")
        return 0
    except ExerciseSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

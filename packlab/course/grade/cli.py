"""The command line of ``python -m packlab.course.grade`` (``make grade``, ``make gradebook``, ``make grade-repeat``)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from packlab import paths
from packlab.course import grading
from packlab.course.grade import classbook, grader, handback
from packlab.course.grade.execute import CELL_TIMEOUT, NOTEBOOK_TIMEOUT
from packlab.course.grade.repeat import repeat_check


def _parser() -> argparse.ArgumentParser:
    from packlab.course import grade

    parser = argparse.ArgumentParser(prog="python -m packlab.course.grade", description=grade.__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, metavar="PATH", help="exercise notebooks (.md or .ipynb)")
    parser.add_argument("--report", type=Path, default=None, help="JSON report file (default: _build/grade-report.json)")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT, help=f"seconds per cell (default {CELL_TIMEOUT})")
    parser.add_argument("--notebook-timeout", type=float, default=NOTEBOOK_TIMEOUT,
                        help=f"seconds per notebook (default {NOTEBOOK_TIMEOUT})")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="grade without bubblewrap's sandbox: only for notebooks you trust (your own)")
    parser.add_argument("--repeat", type=int, metavar="N", help="instead of grading: run --check N times in this process and time it")
    parser.add_argument("--check", metavar="ID", help="the check to repeat (with --repeat)")
    parser.add_argument("--class", dest="class_dir", type=Path, metavar="DIR",
                        help="grade every DIR/<attendee>/exercises/NN_*.md|ipynb into a gradebook")
    parser.add_argument("--csv", type=Path, default=None, help="the gradebook CSV (default: DIR/gradebook.csv)")
    parser.add_argument("--exercises", default=None, metavar="STEMS",
                        help="comma-separated exercises to grade, e.g. 01_jpeg_dataset,05_shard_split (default: all found)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="notebooks graded at a time (default 1)")
    parser.add_argument("--summary", action="store_true", help="also print how many passed, failed, did not start each part")
    parser.add_argument("--feedback", type=Path, default=None, metavar="FOLDER",
                        help="write FOLDER/<attendee>.md, each attendee's parts with what to look at")
    return parser


def _grade_class(args) -> int:
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
    grades: dict = {}
    start = time.perf_counter()
    rows = classbook.grade_class(args.class_dir, args.cell_timeout, args.notebook_timeout, exercises,
                                 jobs=args.jobs, sandboxed=not args.no_sandbox, grades=grades,
                                 log=lambda line: print(line, flush=True))
    seconds = time.perf_counter() - start
    csv_path = classbook.write_gradebook(rows, args.csv or args.class_dir / "gradebook.csv")
    print()
    print(classbook.gradebook_table(rows))
    if args.summary:
        print("\nPer part, over the class:")
        print(classbook.summary_table(rows))
    if args.feedback is not None:
        written = classbook.write_feedback(rows, grades, args.feedback)
        print(f"\nfeedback for {len(written)} attendee(s) written to {args.feedback}/")
        hub = handback.hub_of(args.class_dir)
        if hub is not None:  # the class hub's drop folder: each file also goes to the attendee's own mywork/feedback/
            delivered, missing = handback.deliver_to_hub(written, hub)
            print(f"and into {len(delivered)} attendee(s)' {handback.FEEDBACK_FOLDER}/ on the hub"
                  + (f"; no course copy on the hub for {', '.join(missing)}" if missing else ""))
    print(f"\ngradebook written to {csv_path} ({len(grades)} notebook(s) in {seconds:.0f} s, "
          f"{args.jobs} at a time{', without a sandbox' if args.no_sandbox else ', each in a sandbox'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        if args.class_dir is not None:
            return _grade_class(args)
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
            grades.append(grader.grade_notebook(path, args.cell_timeout, args.notebook_timeout, sandboxed=not args.no_sandbox))
    except grader.SandboxMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print()
    print(grader.score_table(grades))
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

"""One check of one notebook, many times in a row, timed: looking for a failure that shows only now and then.

``python -m packlab.course.grade --repeat 20 --check per_worker_zip [NOTEBOOK]`` runs the check
of a notebook (by default the solution notebook) N times in this process: its defining
cells run here, not in a kernel and not in a sandbox, so use it on the course's own
notebooks only. It prints every run and the minimum, median and maximum wall time.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from packlab.course import grading
from packlab.course.grade.notebooks import notebook_candidates


def repeat_check(path: Path, check_id: str, times: int) -> list[float]:
    """Run one check of a notebook ``times`` times in this process; print each run and min/median/max seconds.

    The CPU time (this process and the processes the check started) tells what a run
    would take on an idle machine, where two cores run it about twice as fast as one.
    Returns the wall times.
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

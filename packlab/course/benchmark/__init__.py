"""The ``make bench`` suite (see :mod:`packlab.course.benchmark.suite`).

What it measures is the chapters' own code: the timing helpers of :mod:`packlab.bench`,
the ceilings of :mod:`packlab.ceiling`, the line-up of :mod:`packlab.loaders.lineup` and
:mod:`packlab.small_files`; this package only runs them in one go and reports.
"""

from packlab.course.benchmark.suite import GOALS, SECTIONS, format_benchmark, main, quick_root, run_benchmark

__all__ = ["GOALS", "SECTIONS", "format_benchmark", "main", "quick_root", "run_benchmark"]

"""The course's own machinery: what builds, runs and grades the course, not what it teaches.

``packlab``'s other modules are the library the chapters teach (datasets, packers,
timing helpers); this subpackage holds everything around them:

- :mod:`~packlab.course.grading` and :mod:`~packlab.course.grade`: the exercises'
  ``check()`` and the grader that runs a notebook, or a whole class, in fresh kernels
  inside :mod:`~packlab.course.sandbox`, and runs their checks itself;
- :mod:`~packlab.course.exercises`: writes ``exercises/`` from ``solutions/``;
- :mod:`~packlab.course.prose`: binds measured numbers to the names the chapters' prose
  cites (``{eval}`` roles);
- :mod:`~packlab.course.book`, :mod:`~packlab.course.lab` and
  :mod:`~packlab.course.pytest_book_cache`: the book build, the attendee's JupyterLab,
  and the hand-over of nbval's runs to the book;
- :mod:`~packlab.course.schedule`: the workshop timetable and its named tracks;
- :mod:`~packlab.course.hub`, :mod:`~packlab.course.room`, :mod:`~packlab.course.release`
  and :mod:`~packlab.course.update`: a JupyterHub for the class with its live board, the
  helpers' brief, the attendees' copy and their ``make update``;
- :mod:`~packlab.course.benchmark`: the ``make bench`` suite.

An exercise notebook needs only::

    from packlab.course import check, list_checks

and a chapter marks a stage of the room for the class board with
``from packlab.course import checkpoint; checkpoint("ch07-sweep")``.
"""

from __future__ import annotations

__all__ = ["check", "checkpoint", "list_checks"]


def __getattr__(name: str):
    # Lazy, so that importing packlab.course.prose (every chapter does) does not import the
    # grader and everything it imports.
    if name == "checkpoint":
        from packlab.course.grading import records

        return records.checkpoint
    if name in __all__:
        from packlab.course import grading

        return getattr(grading, name)
    raise AttributeError(f"module 'packlab.course' has no attribute {name!r}")

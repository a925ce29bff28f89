"""Checks of exercise 8 (``08_lmdb``): an LMDB writer, and a reader with one environment per process.

The layout both checks expect is the course's (:mod:`packlab.formats.lmdb_format`): one
file (``subdir=False``), one record per sample, the key its ASCII key, the value its label
as 4 little-endian bytes followed by its JPEG bytes.

* :mod:`~packlab.course.grading.lmdb.files` — what both checks share: fixture files,
  opening and reading a file, finding the environments a dataset holds;
* :mod:`~packlab.course.grading.lmdb.writer` — the check ``lmdb_write``;
* :mod:`~packlab.course.grading.lmdb.reader` — the check ``lmdb_dataset``.
"""

# Importing them registers the checks, the writer's first (as the notebook calls them).
from packlab.course.grading.lmdb import writer  # noqa: I001
from packlab.course.grading.lmdb import reader

__all__ = ["writer", "reader"]

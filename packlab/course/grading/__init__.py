"""Graded checks for the exercise notebooks: behavioural tests with instant feedback.

An exercise asks you to write one piece of a data pipeline (a dataset class, a packing
function, a shard splitter). ``check(exercise_id, candidate)`` then runs your code
against the generated dataset and prints which parts work and, for each part that does
not, what went wrong and a hint::

    >>> from packlab.course.grading import check, list_checks
    >>> result = check("jpeg_dataset", JpegFolderDataset)     # doctest: +SKIP
    >>> result.passed, result.score, result.max_score          # doctest: +SKIP
    (True, 5, 5)

The checks are behavioural: they never look at how your code is written, only at what
it delivers. What they verify, depending on the exercise:

* every sample arrives exactly once per epoch (no loss, no duplicates), across
  DataLoader workers and simulated ranks;
* each sample's label, and its pixels (or its JPEG bytes), match the dataset's manifest;
* the code works with several workers under both the ``fork`` and the ``spawn`` start
  method, and no archive handle opened in the parent is then used by the workers;
* shuffling really changes the order between epochs, reproducibly, within a bounded
  buffer; written archives follow the conventions of the chapters.

Each check reads a few hundred samples, so it takes seconds. The archives it reads are
written once by :mod:`packlab.pack` (the reference writers, not yours) and cached under
``<data root>/packed/grading/``.

How a check protects your kernel
--------------------------------
A dataset that hangs must not hang the notebook. Every check therefore runs its parts
in a child process (forked from the kernel, in a process group of its own) and waits for
each part with a deadline. A part that overruns it is reported as failed, the child and
every process it started (DataLoader workers included) are killed, and the remaining
parts run in a fresh child; if the kernel itself is killed, the child goes too. On top
of that every DataLoader a check creates has a ``timeout`` for each batch, and an epoch
that delivers far more samples than exist is cut short. ``spawn`` workers get a limit of
their own for starting up: each is a new Python process that imports torch before it
reads anything, which takes seconds on an idle machine and can take minutes on a busy
one, so their start-up is not counted against the wait for a batch. The limits are the
``timeout`` (whole check), ``part_timeout``, ``startup_timeout`` and ``loader_timeout``
keyword arguments of :func:`check`; ``parts=[...]`` runs only the parts named, and
``parts="core"`` one stage of a long exercise.

Hints that teach
----------------
A failed part prints a *nudge* by default (level 1: the idea to look at), and the
code-level hint only when asked (``check(..., hints=2)``); a part that fails on the
exercise's untouched stub is "not started" and prints no hint. The nudges and the stages
of long exercises live in :mod:`packlab.course.grading.teaching`.

How a class defined in a notebook is tested under ``spawn``
-----------------------------------------------------------
With ``spawn`` (and ``forkserver``) a DataLoader pickles the dataset and each worker, a
fresh Python process, imports the class by module and name. A class defined in a
notebook lives in the kernel's ``__main__``, which a worker cannot import, so it would
fail for a reason that has nothing to do with the attendee's code. The check solves this
the way one would in a project: it puts the class into a module. IPython keeps the
source of every executed cell (in :mod:`linecache`, under the file name recorded in the
code objects of the class's methods, generated ones such as a dataclass's ``__init__``
aside); the check takes the cell that defined the class, keeps its imports, function and
class definitions, literal constants and the assignments those definitions read
(``_STRIDE = 2 ** 16``), writes them to a temporary module on ``sys.path`` (which spawn
workers inherit) and imports the class from there. The kept lines stay on their line
numbers, so an error in a worker names the line of the cell. Everything else (a
``check(...)`` call, a loop) is left out: a worker must not redo the cell's work. The
workers then run exactly the code the attendee wrote: a handle that cannot be pickled
still fails to pickle, and a handle that is not reopened in the worker is still missing.
This is why an exercise class must sit in **one cell together with the imports it
needs**; when it uses a name defined in another cell, the spawn part says so. Classes
defined in a real module (tests, your own package) are used as they are, and a class
defined in a script is rebuilt from the script's source like a cell. (Spawn workers
would also run a script that calls :func:`check` again, to rebuild its ``__main__``; the
check's child forgets ``__main__``'s file, so no ``if __name__ == "__main__":`` guard is
needed.)

How sharing a parent's handle is caught every time
--------------------------------------------------
Under ``fork``, workers inherit the parent's open files. Two workers reading through one
inherited ``ZipFile`` share one file offset, and whether their seek+read pairs collide is
a matter of timing. To make the failure certain rather than likely, the fork parts give
each worker a ``worker_init_fn`` that points every descriptor the worker inherited on the
archive at ``/dev/null``. A dataset that opens its own handle in the worker never notices;
one that reads through the parent's handle fails on its first read. The descriptors are
found by what they point at (the file's device and inode, from ``os.fstat``), so this
works the same on Linux and on macOS, which has no ``/proc``.

Grading a whole notebook
------------------------
When the environment variable named by :data:`RESULTS_ENV_VAR` is set (``python -m
packlab.course.grade`` sets it for the kernel it starts), every :func:`check` appends its result
as one JSON line to that file.

The package
-----------
* :mod:`packlab.course.grading.core` — the machinery: results (:class:`CheckResult`), the
  :class:`Context` a part receives, making notebook classes importable for spawn
  workers, the watchdog that runs parts in killable children, the registry,
  :func:`check` and :func:`list_checks`;
* :mod:`packlab.course.grading.teaching` — every part's nudge (level-1 hint) and the
  stages (``"core"``, ``"stretch"``) of long exercises;
* :mod:`packlab.course.grading.fixtures` — what several exercises share: cached fixture
  archives, the SHA-256 transform, DataLoaders with time limits, epoch collection and
  audits, handle inspection;
* one module per exercise notebook, named after it (``solutions/04_tar_shards.md`` →
  :mod:`packlab.course.grading.tar_shards`), holding that notebook's checks: their fixtures,
  their parts, and a :func:`~packlab.course.grading.core.register` call for each. Every module
  of the package other than ``core`` and ``fixtures`` (and names starting with ``_``) is
  such a module and is imported when :mod:`packlab.course.grading` is: there is no list to keep.

How to add an exercise
----------------------
1. Write the solution notebook ``solutions/NN_topic.md`` (copy the shape of an existing
   one): the task in prose, the code between ``# BEGIN SOLUTION`` / ``# END SOLUTION``
   markers (``# Hint`` comments inside stay visible), and after it a cell
   ``result = check("<check id>", YourClass)`` with an ``assert result.passed`` between
   ``# BEGIN HIDDEN`` / ``# END HIDDEN``.
2. Add ``packlab/course/grading/topic.py``. For each check: a fixtures function (small: a few
   hundred samples from :func:`fixtures.subset`, archives through the cached
   ``fixture_*`` helpers), parts (functions ``part(ctx: Context) -> str`` that return a
   short success message or raise :class:`PartFailed` saying what is wrong), and
   ``register(id, "NN_topic", description, signature, fixtures, [(name, description,
   hint, part), ...])``, where ``hint`` is the code-level hint; add each part's nudge (what
   to think about, not what to type) to :data:`~packlab.course.grading.teaching.NUDGES`.
   Keep a check within about 20 s on two cores: use at most two ``spawn`` workers and
   few samples.
3. ``make exercises`` writes ``exercises/NN_topic.md`` (stubs in place of the solutions);
   ``tests/test_exercises.py`` then checks that the solution passes every part and the
   untouched stubs fail every part.
4. Add ``tests/test_grading_topic.py`` with wrong implementations (each fails the part
   that names its mistake, and only the parts it deserves to fail) and correct
   alternatives written differently from the solution (each passes every part).
"""

from __future__ import annotations

import importlib
import pkgutil

from packlab.course.grading.core import (
    CHECK_TIMEOUT,
    LOADER_TIMEOUT,
    PART_TIMEOUT,
    RESULTS_ENV_VAR,
    CheckInfo,
    CheckResult,
    Context,
    PartFailed,
    PartResult,
    check,
    definitions_only,
    importable_copy,
    list_checks,
)
from packlab.course.grading.fixtures import sha256_transform

#: Modules of this package that are not exercise modules.
MACHINERY = frozenset({"core", "fixtures", "teaching", "live", "records"})

# Older name, still used by tests/test_start_methods.py.
_definitions_only = definitions_only


def _import_exercise_modules() -> None:
    """Import every exercise module of the package; each registers its checks."""
    for module in pkgutil.iter_modules(__path__):
        if module.name not in MACHINERY and not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


_import_exercise_modules()

__all__ = [
    "CHECK_TIMEOUT",
    "LOADER_TIMEOUT",
    "PART_TIMEOUT",
    "RESULTS_ENV_VAR",
    "CheckInfo",
    "CheckResult",
    "Context",
    "PartFailed",
    "PartResult",
    "check",
    "importable_copy",
    "list_checks",
    "sha256_transform",
]

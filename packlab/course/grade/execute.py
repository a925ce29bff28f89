"""Executing an attendee's notebook top to bottom in a fresh kernel, the way a grader runs it.

Runs inside the gradebook's sandbox (:mod:`packlab.course.grade.sandboxed`) as
``python -m packlab.course.grade.execute NOTEBOOK OUT.ipynb``: it writes the executed
notebook to ``OUT.ipynb`` and what stopped it, if anything, to ``OUT.ipynb.json``. The
kernel inherits the environment the gradebook gave the sandbox: its ``check()`` calls
record into a file of the sandbox's folder (``PACKLAB_GRADE_RESULTS``), which the
gradebook reads only to compare with its own run of the checks.

A cell that raises does not stop the run: later cells still run. A cell that runs longer
than ``--cell-timeout``, a notebook that runs longer than ``--notebook-timeout``, or a
kernel that dies stops the notebook there; its kernel is shut down.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from packlab.course.grade.notebooks import read_notebook

#: Seconds one cell may run; a cell that takes longer stops its notebook (its kernel is shut down).
CELL_TIMEOUT = 600
#: Seconds a whole notebook may run.
NOTEBOOK_TIMEOUT = 1800


class _NotebookOutOfTime(Exception):
    """Raised (through nbclient) when a notebook has used up its time limit."""


def execute(path: Path, cell_timeout: float = CELL_TIMEOUT, notebook_timeout: float = NOTEBOOK_TIMEOUT):
    """Run the notebook at ``path`` in a fresh kernel, in its own folder; return ``(executed notebook, error or None)``."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    path = Path(path)
    notebook = read_notebook(path)
    kernel = notebook.metadata.get("kernelspec", {}).get("name", "python3")
    deadline = time.monotonic() + notebook_timeout
    running = {"cell": None, "limit": cell_timeout}

    def on_cell_start(cell, cell_index):
        running["cell"] = cell_index

    def cell_limit(cell) -> float:
        left = deadline - time.monotonic()
        if left <= 1:
            raise _NotebookOutOfTime(f"the notebook's time limit of {notebook_timeout:.0f} s was used up before cell {running['cell']}")
        running["limit"] = min(cell_timeout, left)
        return running["limit"]

    error = None
    client = NotebookClient(
        notebook,
        timeout_func=cell_limit,
        kernel_name=kernel,
        allow_errors=True,
        interrupt_on_timeout=False,
        shutdown_kernel="immediate",  # a stuck kernel is killed
        extra_arguments=["--IPKernelApp.log_level=ERROR"],  # not a warning per kernel about its local TCP ports
        on_cell_start=on_cell_start,
        resources={"metadata": {"path": str(path.resolve().parent)}},
    )
    try:
        client.execute()
    except CellTimeoutError:
        error = f"cell {running['cell']} did not finish within {running['limit']:.0f} s: the notebook was stopped there"
    except DeadKernelError:
        error = f"the kernel died in cell {running['cell']}: the notebook was stopped there"
    except _NotebookOutOfTime as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure to execute is reported, not raised
        error = f"{type(exc).__name__}: {exc}"
    return notebook, error


def main(argv: list[str] | None = None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(prog="python -m packlab.course.grade.execute", description=__doc__.split("\n\n")[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("out", type=Path, help="where the executed notebook goes (.ipynb); OUT.json says what stopped it")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT)
    parser.add_argument("--notebook-timeout", type=float, default=NOTEBOOK_TIMEOUT)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    notebook, error = execute(args.notebook, args.cell_timeout, args.notebook_timeout)
    nbformat.write(notebook, args.out)
    Path(f"{args.out}.json").write_text(json.dumps({"execution_error": error, "seconds": time.perf_counter() - start}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

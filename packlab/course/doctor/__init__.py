"""Is this machine ready for the course? A go/no-go check, one line per need (``make doctor``).

::

    make doctor                         # sets up, generates the data, then checks; or, without make:
    python -m packlab.course.doctor     # from the repository root, in the course's environment
    python3 -m packlab.course.doctor    # also works with a bare python3, before make setup
    python -m packlab.course.doctor --sizes   # what each part of the environment takes on disk
    python -m packlab.course.doctor --only Python   # one line (the Makefile's check of PYTHON prints it)

Each line is ✓ (fine) or ✗ (the course will fail or mislead here), and a ✗ says what to
do. The exit status is 0 when nothing is ✗, and the report then ends ``READY``. What is
checked, and why:

* **Python** 3.10 or newer (``pyproject.toml`` requires it; macOS's own ``python3`` is 3.9);
* **uv** at least :data:`~.checks.MIN_UV`: an older one ignores ``TORCH_BACKEND`` without a word;
* **settings**: the course's settings (count, data folder, environment folder, torch
  backend) and where each came from: ``settings.mk``, the environment, or the default
  (:mod:`packlab.settings`);
* **the environment**: the pinned torch and torchvision import, from this repository's
  environment; a CUDA build of torch on a machine without an NVIDIA GPU is a ✗ unless it
  was chosen (``TORCH_BACKEND=pypi``) or PyTorch's CPU index was unreachable when it was
  installed (``make setup`` records that); and the kernel JupyterLab starts for the
  notebooks runs that same Python (a ``python3`` kernel in the home folder can point elsewhere);
* **cores**: at least :data:`~.checks.MIN_CORES` this process may use (CPU affinity and
  container limits count): with one core, "two workers" measure nothing;
* **memory**: at least :data:`~.checks.MIN_MEMORY_GIB` GiB, the smaller of the machine's and
  a container's limit (a JupyterHub pod's);
* **free disk** at the data root, against what the course will still write there
  (:func:`packlab.course.footprint.disk_needed`);
* **/dev/shm**: DataLoader workers hand batches over through it; Docker and Kubernetes
  give 64 MB unless told otherwise;
* **start methods**: chapters 3 to 10 ask for ``fork``; Windows has none;
* **DataLoader workers**: 64 images through ``DataLoader(num_workers=2)`` under ``fork``
  and under ``spawn``, each with a time limit (:mod:`packlab.course.doctor.workers`):
  what actually fails on the day;
* **location**: under WSL, a clone or data folder on a Windows drive (``/mnt/c``);
* **JupyterLab** with jupytext (a ``.md`` chapter opens as a notebook) and
  jupyterlab-myst (the ``{eval}`` numbers in the prose render);
* **the data**: generated, every file matching its manifest, at the size the course is set to.

Every check is a function of a :class:`Facts` record (:mod:`.checks`), so the tests fake
any machine; :func:`gather` (:mod:`.machine`) collects the facts of this one.
"""

from __future__ import annotations

import argparse
import json
import sys

from packlab.course.doctor.checks import (
    CHECKS, FAIL, LAB_EXTENSIONS, LAB_PACKAGES, MIN_CORES, MIN_MEMORY_GIB, MIN_PYTHON, MIN_SHM_MIB, MIN_UV, OK,
    Facts, Result, SettingLine, WorkerTrial, report, run_checks,
)
from packlab.course.doctor.machine import gather

__all__ = ["CHECKS", "FAIL", "LAB_EXTENSIONS", "LAB_PACKAGES", "MIN_CORES", "MIN_MEMORY_GIB", "MIN_PYTHON",
           "MIN_SHM_MIB", "MIN_UV", "OK", "Facts", "Result", "SettingLine", "WorkerTrial", "gather", "main", "report",
           "run_checks"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", action="store_true", help="instead: what each part of the environment takes on disk")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--only", metavar="CHECK", help="one check by its name (Python, uv, settings, ...)")
    args = parser.parse_args(argv)
    if args.sizes:
        from packlab.course import footprint

        print(footprint.sizes_report(footprint.environment_costs()))
        return 0
    if args.only:
        wanted = [check for check in CHECKS if check.__name__ == "check_" + args.only.lower().replace(" ", "_")
                  or args.only.lower() in check.__name__]
        if not wanted:
            parser.error(f"no check named {args.only!r}")
        results = [check(gather(try_workers=False)) for check in wanted[:1]]
        print("\n".join(line for r in results for line in r.lines()))
        return 0 if all(r.ok for r in results) else 1
    results = run_checks(gather())
    if args.json:
        print(json.dumps([{**r.__dict__} for r in results], indent=2))
    else:
        print(report(results))
    return 0 if all(r.ok for r in results) else 1

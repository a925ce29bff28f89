"""Which notebooks read the course's core count: a pytest plugin for ``make test``'s many-cores phases.

A notebook that never asks :func:`packlab.cpus.course_cores` how many cores it has runs the
same code whatever that count is, so one run at 16 emulated cores shows it passing at 8 as
well. ``make test`` therefore runs every notebook at 16 cores, and at 8 cores only those
that read the count (and those the normal account must run). This plugin keeps that list
honest: before nbval starts a notebook's kernel it names the notebook in
``$PACKLAB_NOTEBOOK``, which the kernel and its DataLoader workers inherit, and
:func:`packlab.cpus.visible_cores` appends that name to ``$PACKLAB_CORE_READS_LOG`` the
first time a process reads an emulated count. :func:`notebooks_that_read` reads the log
back.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: Set by this plugin for each notebook's kernel: the notebook's path.
NOTEBOOK_VAR = "PACKLAB_NOTEBOOK"
#: Where :func:`packlab.cpus.visible_cores` appends the notebooks that read an emulated core count.
LOG_VAR = "PACKLAB_CORE_READS_LOG"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before the default setup runs the notebook's own setup, which starts its kernel with this environment.
    os.environ[NOTEBOOK_VAR] = f"{Path(item.path).parent.name}/{Path(item.path).stem}"


def notebooks_that_read(log: Path) -> set[str]:
    """The notebooks (``chapters/01_jpeg_files``) named in a core-reads log; none if there is no log."""
    try:
        return {line.strip() for line in log.read_text().splitlines() if line.strip()}
    except FileNotFoundError:
        return set()

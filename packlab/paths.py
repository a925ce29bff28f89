"""Where things live on disk.

Every notebook, test and script asks this module for paths instead of building them
from the current directory, so the course behaves the same whether it is run from the
repository root, from ``chapters/``, from a test build folder or from a cluster job.

The data root is ``PACKLAB_DATA`` when that is set (point it at a scratch or node-local
filesystem on a cluster): in the environment, or in the checkout's settings file that
``make configure PACKLAB_DATA=...`` writes (:mod:`packlab.settings`, read again on every
call, so a new terminal or a notebook's kernel finds it without an ``export``); and
``<repository>/data`` otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

from packlab import settings

#: Name of the environment variable that moves the data root elsewhere.
DATA_ENV_VAR = "PACKLAB_DATA"


def repo_root() -> Path:
    """The repository checkout that holds this package (``packlab/..``)."""
    return Path(__file__).resolve().parent.parent


def data_root() -> Path:
    """The folder that holds the generated dataset and everything packed from it.

    ``$PACKLAB_DATA``, else the settings file's ``PACKLAB_DATA`` (relative to the
    repository), else ``<repository>/data``.
    """
    configured = os.environ.get(DATA_ENV_VAR)
    if configured:
        return Path(configured).expanduser().resolve()
    in_file = settings.read_file().get(DATA_ENV_VAR)
    if in_file:
        return (repo_root() / Path(in_file).expanduser()).resolve()
    return repo_root() / "data"


def images_dir(root: Path | None = None) -> Path:
    """The folder of JPEGs, one file per sample: ``<root>/images/<key>.jpg``."""
    return (root or data_root()) / "images"


def labels_path(root: Path | None = None) -> Path:
    """The labels file: CSV with a header ``key,label``."""
    return (root or data_root()) / "labels.csv"


def manifest_path(root: Path | None = None) -> Path:
    """The manifest: CSV ``key,label,bytes,sha256,width,height``, one row per JPEG."""
    return (root or data_root()) / "manifest.csv"


def packed_dir(root: Path | None = None) -> Path:
    """Where chapters and benchmarks write zips, tar shards and other packed copies."""
    return (root or data_root()) / "packed"


def build_dir() -> Path:
    """The repository's build folder (book HTML, test notebooks, benchmark output)."""
    return repo_root() / "_build"

"""Shared fixtures: a small generated dataset, so unit tests never depend on the full 10k."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # tests draw figures without a display

import pytest

from packlab import data

SMALL_COUNT = 60


@pytest.fixture(scope="session")
def small_root(tmp_path_factory):
    """A 60-image dataset generated once per test session (read-only: copy it before altering)."""
    root = tmp_path_factory.mktemp("small-data")
    data.generate(root, count=SMALL_COUNT, seed=7, workers=2, progress=False)
    return root


@pytest.fixture(scope="session")
def small_manifest(small_root):
    return data.load_manifest(small_root)

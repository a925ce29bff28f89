"""How the fork parts find a handle inherited from the parent: by the file it points at, on any platform.

Exercise 3's fork parts point every descriptor a worker inherited on the archive at
/dev/null, so a dataset reading through the parent's handle fails at once. The
descriptors are found with ``os.fstat`` (device and inode), through whichever listing the
platform has: ``/proc/self/fd`` (Linux), ``/dev/fd`` (macOS), or every number up to the
open-file limit. Each way is tried here, with the file opened under two names.
"""

from __future__ import annotations

import os

import pytest

from packlab.course.grading import fixtures


@pytest.fixture
def archive(tmp_path):
    path = tmp_path / "archive.zip"
    path.write_bytes(b"PK" + bytes(1000))
    alias = tmp_path / "alias.zip"
    alias.symlink_to(path)
    return path, alias


def _listing_missing(missing):
    real = os.listdir

    def listdir(path="."):
        if str(path) in missing:
            raise FileNotFoundError(path)
        return real(path)

    return listdir


@pytest.mark.parametrize("missing", [(), ("/proc/self/fd",), ("/proc/self/fd", "/dev/fd")],
                         ids=["linux /proc", "macos /dev/fd", "no listing: every number"])
def test_descriptors_on_a_file_are_found_under_any_name(archive, monkeypatch, missing):
    path, alias = archive
    monkeypatch.setattr(os, "listdir", _listing_missing(missing))
    other = open(__file__, "rb")  # noqa: SIM115 - a descriptor on another file, not to be found
    first, second = open(path, "rb"), open(alias, "rb")  # noqa: SIM115
    try:
        assert fixtures.descriptors_on(path) == sorted([first.fileno(), second.fileno()])
        assert fixtures.open_handles(alias) == 2
        fixtures.cut_inherited_handles(str(path), worker_id=0)
        assert first.read(2) == b"" and second.read(2) == b"", "the handles now read /dev/null"
        assert other.read(3) == b'"""', "a handle on another file is untouched"
        assert fixtures.descriptors_on(path) == []
    finally:
        for handle in (other, first, second):
            handle.close()


def test_a_missing_file_has_no_descriptors(tmp_path):
    assert fixtures.descriptors_on(tmp_path / "gone.zip") == []

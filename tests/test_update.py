"""``make update``: an attendee's clone takes the instructor's next release, whatever they changed.

A release repository and an attendee's clone of it, in temporary folders:

* with no changes, the release fast-forwards in;
* an edit to a chapter the release does not touch is put aside, the release comes in, and
  the edit is back; ``mywork/`` (git-ignored) is never touched;
* an edit to the lines the release changes: the release's version is in place, the edit is
  kept in git's stash, and the message says so plainly and how to look at it;
* a clone without a release to pull from gets a plain message, not git's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from packlab import paths
from packlab.course import update

ID = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *ID, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture
def repos(tmp_path):
    upstream = tmp_path / "release"
    upstream.mkdir()
    (upstream / "chapters").mkdir()
    (upstream / "chapters" / "01.md").write_text("one\ntwo\nthree\n")
    (upstream / "intro.md").write_text("intro\n")
    (upstream / ".gitignore").write_text("mywork/\n")
    git(upstream, "init", "-q", "-b", "main")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-qm", "release 1")
    clone = tmp_path / "attendee"
    subprocess.run(["git", "clone", "-q", str(upstream), str(clone)], check=True)
    (clone / "mywork").mkdir()
    (clone / "mywork" / "01.md").write_text("my solution\n")
    return upstream, clone


def release(upstream: Path, name: str, text: str) -> None:
    (upstream / name).write_text(text)
    git(upstream, "commit", "-qam", f"release: {name}")


def run(clone: Path) -> tuple[int, str]:
    said = []
    status = update.update(cwd=clone, say=said.append)
    return status, "\n".join(said)


def test_a_release_comes_in_and_an_unrelated_edit_stays(repos):
    upstream, clone = repos
    release(upstream, "intro.md", "intro, fixed\n")
    (clone / "chapters" / "01.md").write_text("one\ntwo, tried\nthree\n")
    status, said = run(clone)
    assert status == 0, said
    assert (clone / "intro.md").read_text() == "intro, fixed\n"
    assert (clone / "chapters" / "01.md").read_text() == "one\ntwo, tried\nthree\n"
    assert "put your changes back" in said and "Fast-forward" in said
    assert (clone / "mywork" / "01.md").read_text() == "my solution\n"
    assert git(clone, "stash", "list") == ""


def test_an_edit_the_release_overlaps_is_kept_aside_with_a_plain_message(repos):
    upstream, clone = repos
    release(upstream, "chapters/01.md", "one\ntwo, fixed by the instructor\nthree\n")
    (clone / "chapters" / "01.md").write_text("one\ntwo, tried by the attendee\nthree\n")
    status, said = run(clone)
    assert status == 0, said
    assert (clone / "chapters" / "01.md").read_text() == "one\ntwo, fixed by the instructor\nthree\n"
    assert "chapters/01.md" in said and "git stash show -p" in said and "<<<<<<<" not in said
    assert "tried by the attendee" in git(clone, "stash", "show", "-p")
    assert git(clone, "status", "--porcelain") == "", "no conflict left in the working tree"
    assert (clone / "mywork" / "01.md").read_text() == "my solution\n"


def test_nothing_changed_and_nothing_to_pull(repos):
    _, clone = repos
    status, said = run(clone)
    assert status == 0 and "Already up to date" in said


def test_a_folder_without_a_release_gets_a_plain_message(tmp_path):
    git(tmp_path, "init", "-q", "-b", "main")
    status, said = run(tmp_path)
    assert status == 2 and "no release to pull from" in said


def test_make_update_runs_it(repos):
    upstream, clone = repos
    release(upstream, "intro.md", "intro, fixed\n")
    done = subprocess.run(["make", "-s", "-f", str(paths.repo_root() / "Makefile"), "update", f"BOOTSTRAP_PYTHON={sys.executable}"],
                          cwd=clone, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(paths.repo_root())})
    assert done.returncode == 0, done.stderr
    assert (clone / "intro.md").read_text() == "intro, fixed\n"


def test_the_chapters_the_release_changed_are_named_with_what_to_do_if_one_is_open(repos):
    upstream, clone = repos
    (upstream / "exercises").mkdir()
    (upstream / "exercises" / "01_x.md").write_text("exercise\n")
    git(upstream, "add", "-A")
    git(upstream, "commit", "-qm", "release: an exercise")
    release(upstream, "chapters/01.md", "one\ntwo, fixed\nthree\n")
    release(upstream, "intro.md", "intro, fixed\n")
    status, said = run(clone)
    assert status == 0, said
    assert "The release changed: chapters/01.md, exercises/01_x.md." in said, said
    assert "intro.md" not in said.split("The release changed:")[1], "only notebooks an attendee may have open"
    assert "Reload Notebook from Disk" in said
    release(upstream, "intro.md", "intro, fixed again\n")
    status, said = run(clone)
    assert status == 0 and "The release changed no chapter, exercise or solution." in said

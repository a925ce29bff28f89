"""Release and collect: the attendees' copy has no solutions and still grades; submissions round-trip.

* ``make release`` writes a git repository without ``solutions/`` (nor the tests), with
  no solution block anywhere, and a second release is a commit a clone can pull;
* the grader's checks work in that copy, which has no ``solutions/`` (its own
  ``packlab``, put first on ``PYTHONPATH``, grades a notebook there);
* ``make lab``'s copies of the exercises (``mywork/``) are made once and never overwritten;
* ``make submit`` packs an attendee's notebooks as ``make gradebook`` reads them, and the
  two ``make`` targets run one after the other grade that attendee;
* the notebooks' headers are as jupytext saves them, so saving leaves a notebook unchanged.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from test_gradebook import graded_cells_only
from test_lab import _save_as_jupyterlab_does

from packlab import paths
from packlab.course import grading, release

ROOT = paths.repo_root()
GIT_ID = ["-c", "user.name=test", "-c", "user.email=test@example.invalid"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *GIT_ID, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A snapshot of this checkout's tracked files as a git repository (edits made meanwhile do not leak in)."""
    snapshot = tmp_path_factory.mktemp("source") / "course"
    for name in release.tracked_files(ROOT):
        target = snapshot / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((ROOT / name).read_bytes())
    git(snapshot, "init", "-q", "-b", "main")
    git(snapshot, "add", "-A")
    git(snapshot, "commit", "-qm", "snapshot")
    return snapshot


@pytest.fixture(scope="module")
def released(source, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("release") / "course"
    assert release.release(dest, root=source) is not None
    return dest


def test_the_release_leaves_out_the_solutions_and_the_tests(released):
    files = git(released, "ls-files").split()
    assert files and not [f for f in files if f.split("/")[0] in ("solutions", "tests", ".ci")]
    assert not (released / "solutions").exists()
    for wanted in ("Makefile", "pyproject.toml", "chapters/00_setup.md", "exercises/01_jpeg_dataset.md",
                   "packlab/course/grading/core.py", ".gitignore"):
        assert wanted in files, f"{wanted} is missing from the release"
    for name in files:
        text = (released / name).read_text(errors="replace")
        assert not any(line.strip() in release.SOLUTION_MARKERS for line in text.splitlines()), name
    assert len(git(released, "log", "--oneline").splitlines()) == 1


def test_the_release_is_written_for_attendees(released):
    """Its README advertises no `make test` and no solutions/; its book has no instructor guide, nor a link to it."""
    readme = (released / "README.md").read_text()
    assert "attendees' copy" in readme and "make update" in readme
    assert "make test" not in readme and "solutions/" not in readme and "tests/" not in readme
    toc = (released / "_toc.yml").read_text()
    assert "instructor" not in toc and "chapters/05_tar_shards" in toc
    assert not (released / "instructor.md").exists()
    for page in [*released.glob("*.md"), *released.glob("chapters/*.md"), *released.glob("exercises/*.md")]:
        assert "<instructor>`" not in page.read_text(), f"{page.name} links to the instructor guide, which is not there"
    assert "instructor guide <instructor>" in (ROOT / "intro.md").read_text(), "the checkout's own pages keep the link"


def test_solutions_handed_out_on_purpose_stay_in_later_releases(source, tmp_path):
    dest = tmp_path / "release"
    release.release(dest, root=source, solutions=["01_jpeg_dataset"])
    assert (dest / "solutions" / "01_jpeg_dataset.md").is_file()
    assert "with the solutions 01_jpeg_dataset" in git(dest, "log", "-1", "--format=%s")
    release.release(dest, root=source, solutions=["03"])  # the next day: exercise 3's too, by its number
    assert sorted(p.name for p in (dest / "solutions").glob("*.md")) == ["01_jpeg_dataset.md", "03_per_worker_zip.md"]
    with pytest.raises(release.ReleaseError, match="not one solution notebook"):
        release.release(dest, root=source, solutions=["99_nothing"])


def test_a_hubs_drop_folder_takes_the_folder_alone(tmp_path, monkeypatch):
    mine = tmp_path / "mywork"
    mine.mkdir()
    (mine / "01_jpeg_dataset.md").write_text("my notebook")
    handed = release.submit("ana", mine, tmp_path / "dropbox", archive=False)
    assert handed == tmp_path / "dropbox" / "ana" / "exercises"
    assert (handed / "01_jpeg_dataset.md").read_text() == "my notebook"
    assert not list((tmp_path / "dropbox").glob("*.zip"))


def test_the_released_notebooks_save_unchanged(released):
    drift = release.header_drift(released, [released / "chapters" / "03_zip_pitfall.md",
                                            released / "exercises" / "01_jpeg_dataset.md"])
    assert drift == []


def test_a_second_release_is_a_commit_an_attendee_pulls(source, released, tmp_path):
    clone = tmp_path / "attendee"
    subprocess.run(["git", "clone", "-q", str(released), str(clone)], check=True)
    assert release.release(released, root=source) is None, "nothing changed: no new commit"
    (source / "intro.md").write_text((source / "intro.md").read_text() + "\nA fix on day 2.\n")
    git(source, "commit", "-qam", "a fix on day 2")
    assert release.release(released, root=source) is not None
    assert "from " in git(released, "log", "-1", "--format=%s")
    git(clone, "pull", "-q", "--ff-only")
    assert (clone / "intro.md").read_text().endswith("A fix on day 2.\n")


def test_a_release_never_overwrites_a_folder_that_is_not_a_release(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(release.ReleaseError, match="not a git repository"):
        release.release(tmp_path)
    with pytest.raises(release.ReleaseError, match="outside the repository"):
        release.release(ROOT / "chapters")


def test_a_solution_block_stops_the_release(tmp_path):
    (tmp_path / "leak.md").write_text("text\n```{code-cell} ipython3\n# BEGIN SOLUTION\nx = 1\n```\n")
    (tmp_path / "fine.md").write_text("The markers are `# BEGIN SOLUTION` and `# END SOLUTION`.\n")
    with pytest.raises(release.ReleaseError, match="leak.md"):
        release._check_no_solutions(tmp_path, ["leak.md", "fine.md"])
    release._check_no_solutions(tmp_path, ["fine.md"])


def test_the_grader_works_in_the_release_without_solutions(released, tmp_path):
    """The release's own packlab grades a notebook; `make exercises` there refuses to wipe exercises/."""
    notebook = tmp_path / "05_shard_split.md"
    notebook.write_text(graded_cells_only(ROOT / "solutions" / "05_shard_split.md"))
    env = {**os.environ, "PYTHONPATH": str(released), paths.DATA_ENV_VAR: str(paths.data_root())}
    report = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "packlab.course.grade", str(notebook), "--report", str(report),
                          "--cell-timeout", "300"], cwd=released, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    assert "9/9" in run.stdout, run.stdout
    assert f"{released}/packlab" in subprocess.run(
        [sys.executable, "-c", "import packlab.course.grade as g; print(g.__file__)"], cwd=released, env=env,
        capture_output=True, text=True).stdout, "the test must grade with the release's own packlab"
    regenerate = subprocess.run([sys.executable, "-m", "packlab.course.exercises"], cwd=released, env=env,
                                capture_output=True, text=True, timeout=120)
    assert regenerate.returncode == 2 and "no solution notebooks" in regenerate.stderr
    assert len(list((released / "exercises").glob("[0-9]*.md"))) == len(list((ROOT / "exercises").glob("[0-9]*.md")))


def test_make_lab_copies_the_exercises_once_and_never_overwrites_them(tmp_path):
    (tmp_path / "exercises").mkdir()
    for name in ("01_a.md", "02_b.md", "index.md"):
        (tmp_path / "exercises" / name).write_text(f"original {name}")
    made = release.copy_exercises(tmp_path)
    assert [p.name for p in made] == ["01_a.md", "02_b.md"]
    mine = tmp_path / "mywork" / "exercises" / "01_a.md"
    mine.write_text("my work")
    (tmp_path / "exercises" / "03_c.md").write_text("new exercise")
    assert [p.name for p in release.copy_exercises(tmp_path)] == ["03_c.md"]
    assert mine.read_text() == "my work"


def test_mywork_and_submissions_are_ignored_by_git():
    for name in ("mywork/exercises/01_jpeg_dataset.md", "submissions/alice.zip"):
        done = subprocess.run(["git", "check-ignore", "-q", name], cwd=ROOT)
        assert done.returncode == 0, f"{name} is not git-ignored"


def test_submit_packs_the_layout_the_gradebook_reads(tmp_path):
    mine = tmp_path / "mywork"
    mine.mkdir()
    (mine / "01_jpeg_dataset.md").write_text("md")
    (mine / "01_jpeg_dataset.ipynb").write_text("{}")
    (mine / "notes.txt").write_text("not an exercise")
    archive = release.submit("alice", mine, tmp_path / "out")
    assert archive == tmp_path / "out" / "alice.zip"
    with zipfile.ZipFile(archive) as packed:
        assert sorted(packed.namelist()) == ["alice/exercises/01_jpeg_dataset.ipynb", "alice/exercises/01_jpeg_dataset.md"]
    assert sorted(p.name for p in (tmp_path / "out" / "alice" / "exercises").iterdir()) == [
        "01_jpeg_dataset.ipynb", "01_jpeg_dataset.md"]
    for bad in ("", "../x", "a b", "-x"):
        with pytest.raises(release.ReleaseError, match="NAME"):
            release.submit(bad, mine, tmp_path / "out")
    with pytest.raises(release.ReleaseError, match="no exercise notebooks"):
        release.submit("bob", tmp_path / "out" / "nothing", tmp_path / "out")


def test_a_zip_with_paths_outside_its_folder_is_refused(tmp_path):
    with zipfile.ZipFile(tmp_path / "mallory.zip", "w") as packed:
        packed.writestr("mallory/exercises/../../../etc/evil.md", "x")
    with pytest.raises(release.ReleaseError, match="mallory.zip"):
        release.unpack_submissions(tmp_path)
    assert not (tmp_path / "mallory").exists()


def test_make_submit_then_make_gradebook_grades_the_attendee(tmp_path):
    """The round trip through both make targets: alice's work in mywork/, her zip in the class folder."""
    mine = tmp_path / "mywork" / "exercises"
    mine.mkdir(parents=True)
    (mine / "05_shard_split.md").write_text(graded_cells_only(ROOT / "solutions" / "05_shard_split.md"))
    out = tmp_path / "submissions"
    skip_setup = ["-o", ".venv/.installed", "-o", "data"]  # the environment and the data are there already
    submit = subprocess.run(["make", "-s", *skip_setup, "submit", "NAME=alice", f"SUBMIT_FROM={mine}", f"SUBMIT_TO={out}"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert submit.returncode == 0, submit.stdout + submit.stderr
    class_dir = tmp_path / "class"
    class_dir.mkdir()
    (out / "alice.zip").rename(class_dir / "alice.zip")
    graded = subprocess.run(["make", "-s", *skip_setup, "gradebook", f"CLASS={class_dir}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert "unpacked 1 submission(s) of make submit: alice" in graded.stdout
    with open(class_dir / "gradebook.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    parts = sum(len(c.parts) for c in grading.list_checks() if c.notebook == "05_shard_split")
    (total,) = [r for r in rows if r["attendee"] == "alice" and r["exercise"] == "ALL"]
    assert (int(total["passed"]), int(total["max"])) == (parts, parts), graded.stdout


# ---------------------------------------------------------------------------- headers


@pytest.mark.parametrize("name", ["solutions/05_shard_split.md", "exercises/01_jpeg_dataset.md", "chapters/00_setup.md"])
def test_saved_text_is_what_jupyterlab_writes_on_saving(tmp_path, name):
    (tmp_path / name).parent.mkdir(parents=True)
    (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / "jupytext.toml").write_text((ROOT / "jupytext.toml").read_text())
    expected = release.saved_text(tmp_path / name, tmp_path)
    _save_as_jupyterlab_does(tmp_path, name, lambda notebook: None)
    assert (tmp_path / name).read_text() == expected


def test_plain_pages_are_left_as_they_are():
    for page in ("README.md", "intro.md", "exercises/index.md"):
        assert release.saved_text(ROOT / page) == (ROOT / page).read_text()


def test_the_solutions_and_exercises_are_committed_as_jupytext_saves_them():
    files = sorted(ROOT.glob("solutions/[0-9]*.md")) + sorted(ROOT.glob("exercises/[0-9]*.md"))
    assert release.header_drift(ROOT, files) == [], "run `make headers`"


def test_the_chapters_are_committed_as_jupytext_saves_them():
    assert release.header_drift(ROOT, sorted(ROOT.glob("chapters/[0-9]*.md"))) == [], "run `make headers`"


def test_write_headers_changes_only_the_header(tmp_path):
    (tmp_path / "jupytext.toml").write_text((ROOT / "jupytext.toml").read_text())
    chapter = tmp_path / "chapters" / "03_zip_pitfall.md"
    chapter.parent.mkdir()
    text = (ROOT / "chapters" / "03_zip_pitfall.md").read_text()
    stale = "\n".join(line for line in text.splitlines() if "jupytext_version" not in line) + "\n"
    chapter.write_text(stale)
    assert release.write_headers(tmp_path, [chapter]) == [chapter]
    assert chapter.read_text() == release.saved_text(chapter, tmp_path)
    assert chapter.read_text().split("\n---\n", 1)[1] == stale.split("\n---\n", 1)[1]
    assert release.write_headers(tmp_path, [chapter]) == []

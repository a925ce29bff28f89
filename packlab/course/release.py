"""Release and collect: the attendees' copy of the course, their work handed in, notebooks that stay clean.

Three jobs around a workshop, each a ``make`` target:

* ``make release DEST=...`` (:func:`release`) writes the attendees' copy of the course into
  the git repository ``DEST`` as one commit: every file git tracks here, except the
  solutions and what only needs them (:data:`LEFT_OUT`: ``solutions/``, ``tests/``,
  ``.ci/``, the developers' conda environment) and the instructor guide, with the notebooks' headers as the pinned jupytext
  saves them, a README for attendees (``attendee_readme.md``) and a table of contents
  without the guide. Releasing again into the same repository adds a commit, which
  attendees ``git pull`` (``make update``: a fix on day 2). The release is checked before
  it is committed: no ``solutions/`` and no solution block (``# BEGIN SOLUTION``)
  anywhere, but for the solutions handed out on purpose: ``make release
  SOLUTIONS=01_jpeg_dataset,04`` adds those solution notebooks (at the end of the day
  they were taught), and they stay in every later release. The grader's checks live in
  :mod:`packlab.course.grading`, not in ``solutions/``, so ``make grade`` and ``make
  gradebook`` work in the release.
* ``make submit NAME=...`` (:func:`submit`) packs an attendee's exercise notebooks (their
  copies in ``mywork/exercises/``, which ``make lab`` makes) in the layout ``make
  gradebook`` reads: ``submissions/NAME/exercises/NN_*.md`` and ``submissions/NAME.zip``
  holding ``NAME/exercises/...``. The instructor puts the zips into one folder; ``make
  gradebook CLASS=folder`` unpacks them (:func:`unpack_submissions`) and grades them.
* ``make headers`` (:func:`write_headers`) rewrites each notebook's YAML header as the
  pinned jupytext writes it when JupyterLab saves the notebook (it adds
  ``jupytext_version``). With the headers as jupytext writes them, saving an unchanged
  chapter leaves it byte-identical, and ``git pull`` is never blocked by a chapter the
  attendee only ran.

Why attendees' work never blocks ``git pull``: their exercises are copies in ``mywork/``
(git-ignored), and a chapter they only ran and saved is unchanged. A chapter they edited
is theirs to keep (``git stash``) or to drop (``git checkout -- chapters/``); the setup
page says so.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import zipfile
from datetime import datetime, timezone
from pathlib import Path

from packlab import paths

#: Top-level paths of the repository that the attendees' copy leaves out: the solutions,
#: the tests and CI, which need them, and the instructor guide.
LEFT_OUT = ("solutions", "tests", ".ci", "instructor.md", "environment-dev.yml")
#: The release's README: written for attendees (the checkout's README is the course's own).
ATTENDEE_README = Path(__file__).with_name("attendee_readme.md")
#: A link to the instructor guide in a released page becomes its text: ``{doc}`the guide <instructor>```.
_GUIDE_LINK = re.compile(r"\{doc\}`([^`<]*?)\s*<instructor>`")
#: Lines that must not appear in any file of a release (the solution markers of solutions/).
SOLUTION_MARKERS = ("# BEGIN SOLUTION", "<!-- BEGIN SOLUTION -->")
#: Where ``make lab`` keeps an attendee's copies of the exercises, and ``make submit`` writes.
MYWORK = "mywork"
SUBMISSIONS = "submissions"
#: The notebooks whose headers ``make headers`` keeps as jupytext saves them.
NOTEBOOK_GLOBS = ("chapters/[0-9]*.md", "solutions/[0-9]*.md", "exercises/[0-9]*.md")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class ReleaseError(RuntimeError):
    """A release, submission or header rewrite that cannot be done; the message says why and what to do."""


# --------------------------------------------------------------------------- headers


def _jupytext_config(root: Path):
    from jupytext.config import load_jupytext_config

    return load_jupytext_config(str(root))


def has_jupytext_header(text: str) -> bool:
    """Does this MyST file carry a jupytext header (``---`` ... ``jupytext:`` ... ``---``)?"""
    if not text.startswith("---\n"):
        return False
    end = text.find("\n---\n", 4)
    return end > 0 and "\njupytext:" in "\n" + text[4:end]


def saved_text(path: Path, root: Path | None = None) -> str:
    """What jupytext writes into ``path`` when JupyterLab saves the notebook unchanged.

    Read and written with the repository's ``jupytext.toml``, as JupyterLab's jupytext
    contents manager does. A page without a jupytext header (README, intro) is returned
    as it is: JupyterLab saves it without one.
    """
    import jupytext

    text = Path(path).read_text(encoding="utf-8")
    if not has_jupytext_header(text):
        return text
    config = _jupytext_config(root or paths.repo_root())
    notebook = jupytext.reads(text, fmt="md:myst", config=config)
    return jupytext.writes(notebook, fmt="md:myst", config=config)


def _split_header(text: str) -> tuple[str, str]:
    end = text.index("\n---\n", 4) + len("\n---\n")
    return text[:end], text[end:]


def notebooks(root: Path) -> list[Path]:
    """The course's notebooks under ``root`` (:data:`NOTEBOOK_GLOBS`), sorted."""
    return sorted(p for pattern in NOTEBOOK_GLOBS for p in root.glob(pattern))


def header_drift(root: Path | None = None, files: list[Path] | None = None) -> list[Path]:
    """The notebooks whose text differs from what saving them in JupyterLab would write."""
    root = root or paths.repo_root()
    return [path for path in (files if files is not None else notebooks(root))
            if saved_text(path, root) != path.read_text(encoding="utf-8")]


def write_headers(root: Path | None = None, files: list[Path] | None = None) -> list[Path]:
    """Rewrite each notebook's header as jupytext saves it; return the files changed.

    Only the header is taken from jupytext's output; should jupytext also change the body
    of a notebook on saving, that is reported (:class:`ReleaseError`) instead of written,
    since it would change what the notebook says.
    """
    root = root or paths.repo_root()
    changed, body_changes = [], []
    for path in files if files is not None else notebooks(root):
        text = path.read_text(encoding="utf-8")
        saved = saved_text(path, root)
        if saved == text:
            continue
        new_header, new_body = _split_header(saved)
        old_header, old_body = _split_header(text)
        if new_body != old_body:
            body_changes.append(path)
            continue
        path.write_text(new_header + old_body, encoding="utf-8")
        changed.append(path)
    if body_changes:
        raise ReleaseError(
            "saving these notebooks in JupyterLab would change more than their header, so they were left as they are: "
            + ", ".join(str(p) for p in body_changes) + ". Open one in JupyterLab, save it, and commit what jupytext wrote."
        )
    return changed


# --------------------------------------------------------------------------- release


def _git(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=check)


def tracked_files(root: Path) -> list[str]:
    """The files git tracks in ``root`` (paths relative to it, as they are in the working tree)."""
    done = _git(["ls-files", "-z"], root, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"{root} is not a git checkout ({done.stderr.strip()}): a release is made from one")
    return [name for name in done.stdout.split("\0") if name and (root / name).is_file()]


def release_files(root: Path) -> list[str]:
    """What goes into the attendees' copy: every tracked file outside :data:`LEFT_OUT`."""
    return [name for name in tracked_files(root) if name.split("/", 1)[0] not in LEFT_OUT]


def _check_no_solutions(folder: Path, files: list[str]) -> None:
    problems = [name for name in files if name.split("/", 1)[0] == "solutions"]
    for name in files:
        try:
            text = (folder / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if any(line.strip() in SOLUTION_MARKERS for line in text.splitlines()):
            problems.append(name)
    if problems:
        raise ReleaseError(f"the release would give away solutions in: {', '.join(problems)}")


def _identity() -> list[str]:
    """Commit with the user's git identity, or the course's where none is configured."""
    name = os.environ.get("GIT_AUTHOR_NAME") or _git(["config", "user.name"], Path.cwd(), check=False).stdout.strip()
    email = os.environ.get("GIT_AUTHOR_EMAIL") or _git(["config", "user.email"], Path.cwd(), check=False).stdout.strip()
    return ["-c", f"user.name={name or 'packlab release'}", "-c", f"user.email={email or 'release@packlab.invalid'}"]


def _for_attendees(dest: Path, files: list[str]) -> list[str]:
    """The attendees' README, a table of contents without the instructor guide, and no links to it."""
    (dest / "README.md").write_text(ATTENDEE_README.read_text(encoding="utf-8"), encoding="utf-8")
    toc = dest / "_toc.yml"
    if toc.is_file():
        import yaml

        contents = yaml.safe_load(toc.read_text(encoding="utf-8"))
        for part in contents.get("parts", []):
            part["chapters"] = [c for c in part.get("chapters", []) if c.get("file") != "instructor"]
        contents["parts"] = [part for part in contents.get("parts", []) if part["chapters"]]
        toc.write_text(yaml.safe_dump(contents, sort_keys=False), encoding="utf-8")
    for name in files:
        if name.endswith(".md"):
            text = (dest / name).read_text(encoding="utf-8")
            if "<instructor>`" in text:
                (dest / name).write_text(_GUIDE_LINK.sub(lambda m: m.group(1).strip(), text), encoding="utf-8")
    return files + (["README.md"] if "README.md" not in files else [])


def solution_files(root: Path, names: list[str]) -> list[str]:
    """The solution notebooks ``solutions/NAME.md`` for ``names`` (``01_jpeg_dataset`` or ``01``), checked."""
    found = []
    available = sorted(p.stem for p in (root / "solutions").glob("[0-9]*.md"))
    for name in names:
        matches = [stem for stem in available if stem == name or stem.split("_", 1)[0] == name]
        if len(matches) != 1:
            raise ReleaseError(f"SOLUTIONS names {name!r}, which is not one solution notebook of solutions/ "
                               f"(there are: {', '.join(available)})")
        found.append(f"solutions/{matches[0]}.md")
    return found


def release(dest: Path, root: Path | None = None, message: str | None = None, solutions: list[str] | None = None) -> str | None:
    """Write the attendees' copy of ``root`` into the git repository ``dest`` as one commit.

    ``dest`` is created (``git init``) when it does not exist or is empty; an existing
    release repository gets its tracked files replaced and a new commit. ``solutions``
    names solution notebooks to hand out in this release (``["01_jpeg_dataset"]``: at the
    end of the day it was taught), as ``solutions/NAME.md``; the solution markers may
    appear in those files only. Returns the new commit's id, or None when nothing
    changed since the last release.
    """
    root = (root or paths.repo_root()).resolve()
    dest = Path(dest).resolve()
    if dest == root or (root in dest.parents and not (root / "_build") in (dest, *dest.parents)):
        raise ReleaseError(f"release into a folder outside the repository (or under its _build/), not {dest}")
    handed_out = solution_files(root, solutions or [])
    files = release_files(root)
    if dest.exists() and any(dest.iterdir()) and not (dest / ".git").exists():
        raise ReleaseError(f"{dest} exists and is not a git repository: give an empty folder, or an earlier release")
    dest.mkdir(parents=True, exist_ok=True)
    if not (dest / ".git").exists():
        _git(["init", "-q", "-b", "main"], dest)
    released_before = _git(["ls-files", "-z", "solutions"], dest).stdout.split("\0")
    # A solution handed out once stays handed out (the next day's release need not name it again).
    handed_out = sorted(set(handed_out) | {n for n in released_before if n and (root / n).is_file()})
    for old in _git(["ls-files", "-z"], dest).stdout.split("\0"):
        if old:
            (dest / old).unlink(missing_ok=True)
    for name in files + handed_out:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)
    files = _for_attendees(dest, files)
    _check_no_solutions(dest, files)
    write_headers(dest, [dest / name for name in files if any(Path(name).match(g) for g in NOTEBOOK_GLOBS)])
    _prune_empty_folders(dest)
    _git(["add", "-A"], dest)
    if _git(["diff", "--cached", "--quiet"], dest, check=False).returncode == 0:
        return None
    source = _git(["rev-parse", "--short", "HEAD"], root, check=False).stdout.strip() or "unknown"
    dirty = _git(["status", "--porcelain", "--untracked-files=no"], root, check=False).stdout.strip()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    given = f", with the solutions {', '.join(Path(n).stem for n in handed_out)}" if handed_out else ""
    text = message or f"Course release from {source}{' (with uncommitted changes)' if dirty else ''}{given}, {stamp}"
    _git([*_identity(), "commit", "-q", "-m", text], dest)
    return _git(["rev-parse", "HEAD"], dest).stdout.strip()


def _prune_empty_folders(folder: Path) -> None:
    for base, dirs, files in os.walk(folder, topdown=False):
        here = Path(base)
        if here != folder and ".git" not in here.parts and not any(here.iterdir()):
            here.rmdir()


# ------------------------------------------------------------------------ attendees' work


def attendee_copies(root: Path | None = None) -> Path:
    """The folder of an attendee's exercise copies: ``mywork/exercises/``."""
    return (root or paths.repo_root()) / MYWORK / "exercises"


def copy_exercises(root: Path | None = None) -> list[Path]:
    """Copy each exercise notebook into ``mywork/exercises/`` unless a copy is there already.

    An attendee's copy is never overwritten: when an exercise is fixed upstream, the new
    one comes in only after the attendee renames (or deletes) theirs. Returns the copies
    made now.
    """
    root = root or paths.repo_root()
    target = attendee_copies(root)
    made = []
    for source in sorted((root / "exercises").glob("[0-9]*.md")):
        copy = target / source.name
        if not copy.exists():
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy)
            made.append(copy)
    return made


def submit(name: str, source: Path | None = None, out: Path | None = None, archive: bool = True) -> Path:
    """Pack an attendee's exercise notebooks for ``make gradebook``; return the zip written (or the folder).

    ``source`` holds the notebooks (default ``mywork/exercises/``, else ``exercises/``);
    each ``NN_*.md`` and its paired ``NN_*.ipynb`` go to ``out/<name>/exercises/`` and,
    with ``archive``, into ``out/<name>.zip`` as ``<name>/exercises/...``. A hub's drop
    folder takes the folder alone (an attendee may write only into ``out/<name>/``).
    """
    if not _NAME.match(name or ""):
        raise ReleaseError(f"NAME={name!r}: use letters, digits, '.', '_' or '-' (it names your folder in the class)")
    root = paths.repo_root()
    if source is None:
        source = attendee_copies(root)
        if not source.is_dir():
            source = root / "exercises"
    source = Path(source)
    found = sorted(p for p in source.glob("[0-9]*") if p.suffix in (".md", ".ipynb"))
    if not found:
        raise ReleaseError(f"no exercise notebooks (NN_*.md or .ipynb) in {source}")
    out = Path(out) if out is not None else root / SUBMISSIONS
    folder = out / name / "exercises"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for path in found:
        shutil.copy2(path, folder / path.name)  # keeps the time saved: the grader takes the newer of .md and .ipynb
    if not archive:
        return folder
    zipped = out / f"{name}.zip"
    partial = zipped.with_suffix(".zip.partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as packed:
        for path in found:
            packed.write(path, f"{name}/exercises/{path.name}")
    os.replace(partial, zipped)
    return zipped


def unpack_submissions(class_dir: Path) -> list[str]:
    """Unpack every ``<name>.zip`` of :func:`submit` in ``class_dir`` into ``class_dir/<name>/exercises/``.

    A zip replaces that attendee's folder only when the zip is newer. Members outside
    ``<name>/exercises/`` (or with ``..`` in their path) are refused with an error naming
    the zip. Returns the names unpacked.
    """
    class_dir = Path(class_dir)
    unpacked = []
    for archive in sorted(class_dir.glob("*.zip")):
        name = archive.stem
        with zipfile.ZipFile(archive) as packed:
            members = [m for m in packed.infolist() if not m.is_dir()]
            bad = [m.filename for m in members if not _member_ok(m.filename, name)]
            if bad:
                raise ReleaseError(f"{archive}: holds {bad[0]!r}, outside {name}/exercises/; make it again with `make submit`")
            folder = class_dir / name / "exercises"
            if folder.is_dir() and folder.stat().st_mtime >= archive.stat().st_mtime:
                continue
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            for member in members:
                target = folder / Path(member.filename).name
                target.write_bytes(packed.read(member))
                stamp = datetime(*member.date_time).timestamp()
                os.utime(target, (stamp, stamp))
        unpacked.append(name)
    return unpacked


def _member_ok(filename: str, name: str) -> bool:
    parts = filename.split("/")
    return len(parts) == 3 and parts[0] == name and parts[1] == "exercises" and parts[2] not in ("", ".", "..")


# ------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.release", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("release", help="write the attendees' copy into a git repository, as a new commit")
    made.add_argument("dest", type=Path)
    made.add_argument("--message", default=None, help="the commit message (default: the source commit and the date)")
    made.add_argument("--solutions", default="", help="solution notebooks to hand out, comma-separated (01_jpeg_dataset,03)")
    handed = commands.add_parser("submit", help="pack your exercises for make gradebook")
    handed.add_argument("--name", required=True, help="your name in the class (letters, digits, . _ -)")
    handed.add_argument("--from", dest="source", type=Path, default=None, help="the notebooks (default mywork/exercises/)")
    handed.add_argument("--out", type=Path, default=None, help="where to write (default submissions/)")
    handed.add_argument("--folder-only", action="store_true", help="no zip: only OUT/NAME/exercises/ (a hub's drop folder)")
    headers = commands.add_parser("headers", help="rewrite the notebooks' headers as jupytext saves them")
    headers.add_argument("--check", action="store_true", help="write nothing; exit 1 if a header differs")
    args = parser.parse_args(argv)
    try:
        if args.command == "release":
            handed_out = [n.strip() for n in args.solutions.split(",") if n.strip()]
            commit = release(args.dest, message=args.message, solutions=handed_out)
            print(f"released into {args.dest}: " + (f"commit {commit[:12]}" if commit else "nothing changed since the last release"))
            print(f"left out: {', '.join(LEFT_OUT)}" + (f" (but for the solutions {', '.join(handed_out)})" if handed_out else "")
                  + f"; attendees clone {args.dest} (or where you push it) and `make update`")
        elif args.command == "submit":
            packed = submit(args.name, args.source, args.out, archive=not args.folder_only)
            if args.folder_only:
                print(f"handed in: {packed}")
            else:
                print(f"packed {packed.parent / args.name / 'exercises'} and {packed}: hand in {packed.name}")
        elif args.command == "headers":
            if args.check:
                drift = header_drift()
                for path in drift:
                    print(f"differs from what jupytext saves: {path}", file=sys.stderr)
                if drift:
                    print("run `make headers`", file=sys.stderr)
                return 1 if drift else 0
            changed = write_headers()
            for path in changed:
                print(f"rewrote the header of {path.relative_to(paths.repo_root())}")
            if not changed:
                print("every notebook's header is as jupytext saves it")
        return 0
    except ReleaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Feedback back to the attendees: into each hub attendee's ``mywork/feedback/``, or a zip each in a laptop room.

``make gradebook`` writes one Markdown file per attendee (``CLASS/feedback/NAME.md``). Where it
goes next depends on the room:

* **on the class hub** (``make gradebook CLASS=hub/dropbox``) every attendee has a copy of the
  course on the same machine (``hub/users/NAME/course``), so the gradebook copies each file
  straight into that copy's ``mywork/feedback/``: it shows in JupyterLab's file browser at the
  next refresh (:func:`deliver_to_hub`);
* **in a laptop room** the instructor has the zips of ``make submit`` and nothing else of the
  attendees'. ``make handback CLASS=class`` packs, per attendee, ``class/handback/NAME.zip``
  with their feedback and the notebooks that were graded, all under ``mywork/feedback/``
  (:func:`handback_zips`). Hand each file back (a USB stick, the chat, the learning platform);
  the attendee runs ``make feedback ZIP=NAME.zip`` in their checkout (:func:`take_feedback`),
  which unpacks it into ``mywork/feedback/`` and nowhere else: their own exercise copies in
  ``mywork/exercises/`` are never overwritten by what they handed in earlier.

``mywork/`` is git-ignored, so neither route touches what ``make update`` pulls.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import zipfile
from pathlib import Path, PurePosixPath

#: Where feedback lands in an attendee's checkout.
FEEDBACK_FOLDER = PurePosixPath("mywork") / "feedback"
#: Inside it, the notebooks as they were handed in and graded.
HANDED_IN = "handed-in"


class HandbackError(RuntimeError):
    """A handback that cannot be done as asked; the message says what to do."""


def hub_of(class_dir: Path) -> Path | None:
    """The hub's folder when ``class_dir`` is a class hub's drop folder (``HUB/dropbox`` beside ``HUB/users``)."""
    class_dir = Path(class_dir).resolve()
    if class_dir.name == "dropbox" and (class_dir.parent / "users").is_dir():
        return class_dir.parent
    return None


def _copy(source: Path, target: Path) -> None:
    """Copy through a temporary name, so an attendee's JupyterLab never opens half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(source, partial)
    os.replace(partial, target)


def deliver_to_hub(feedback_files: list[Path], hub: Path) -> tuple[list[Path], list[str]]:
    """Copy each ``NAME.md`` into ``hub/users/NAME/course/mywork/feedback/``; return (files written, names with no copy).

    A name with no course copy on the hub (an attendee who handed in from elsewhere) is
    returned, not an error: their feedback is still in the class's feedback folder.
    """
    written, missing = [], []
    for feedback in feedback_files:
        course = Path(hub) / "users" / feedback.stem / "course"
        if not course.is_dir():
            missing.append(feedback.stem)
            continue
        target = course / FEEDBACK_FOLDER / feedback.name
        _copy(feedback, target)
        written.append(target)
    return written, missing


def handback_zips(class_dir: Path, feedback_dir: Path | None = None, out_dir: Path | None = None) -> list[Path]:
    """``out_dir/NAME.zip`` for every attendee with a feedback file: the feedback and the graded notebooks.

    Everything in the zip is under ``mywork/feedback/`` (:data:`FEEDBACK_FOLDER`): the
    feedback as ``NAME.md`` and the notebooks as handed in under ``handed-in/``. Raises
    :class:`HandbackError` when there is no feedback yet (run ``make gradebook`` first).
    """
    class_dir = Path(class_dir)
    feedback_dir = Path(feedback_dir) if feedback_dir else class_dir / "feedback"
    out_dir = Path(out_dir) if out_dir else class_dir / "handback"
    files = sorted(feedback_dir.glob("*.md")) if feedback_dir.is_dir() else []
    if not files:
        raise HandbackError(f"no feedback in {feedback_dir}/: run `make gradebook CLASS={class_dir}` first, "
                            "which writes one file per attendee there")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for feedback in files:
        name = feedback.stem
        archive = out_dir / f"{name}.zip"
        partial = archive.with_name(f".{archive.name}.partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as packed:
            packed.write(feedback, str(FEEDBACK_FOLDER / feedback.name))
            for notebook in sorted((class_dir / name / "exercises").glob("*")):
                if notebook.is_file() and notebook.suffix in (".md", ".ipynb"):
                    packed.write(notebook, str(FEEDBACK_FOLDER / HANDED_IN / notebook.name))
        os.replace(partial, archive)
        written.append(archive)
    return written


def _member_target(root: Path, filename: str) -> Path | None:
    """Where a zip member goes under ``root``, or None when it is not inside ``mywork/feedback/``."""
    path = PurePosixPath(filename)
    if path.is_absolute() or ".." in path.parts or "\\" in filename:
        return None
    if path.parts[:2] != FEEDBACK_FOLDER.parts or len(path.parts) < 3:
        return None
    return Path(root, *path.parts)


def take_feedback(archive: Path, root: Path) -> list[Path]:
    """Unpack a handback zip into ``root/mywork/feedback/``; return the files written.

    Every member must lie inside ``mywork/feedback/``; a zip with anything else (another
    folder, an absolute path, ``..``) is refused whole, naming the first such member,
    before anything is written.
    """
    archive, root = Path(archive), Path(root)
    if not archive.is_file():
        raise HandbackError(f"no such file: {archive}; the instructor hands each attendee NAME.zip from `make handback`")
    try:
        packed = zipfile.ZipFile(archive)
    except zipfile.BadZipFile as exc:
        raise HandbackError(f"{archive} is not a zip file ({exc}); ask for it again: it may have been cut short") from exc
    with packed:
        members = [m for m in packed.infolist() if not m.is_dir()]
        for member in members:
            if _member_target(root, member.filename) is None:
                raise HandbackError(f"{archive}: holds {member.filename!r}, outside {FEEDBACK_FOLDER}/; "
                                    "nothing was unpacked. Only a zip made by `make handback` is taken")
        written = []
        for member in members:
            target = _member_target(root, member.filename)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(packed.read(member))
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.grade.handback", description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--class", dest="class_dir", type=Path, metavar="DIR",
                      help="instructor: pack DIR/handback/NAME.zip for every DIR/feedback/NAME.md")
    what.add_argument("--take", type=Path, metavar="ZIP", help="attendee: unpack a handback zip into mywork/feedback/")
    parser.add_argument("--root", type=Path, default=None, help="the attendee's checkout (default: this one)")
    args = parser.parse_args(argv)
    try:
        if args.class_dir is not None:
            written = handback_zips(args.class_dir)
            print(f"{len(written)} handback zip(s) in {args.class_dir / 'handback'}/: give each attendee their NAME.zip; "
                  "they run `make feedback ZIP=NAME.zip` in their course folder")
        else:
            from packlab import paths

            root = args.root or paths.repo_root()
            written = take_feedback(args.take, root)
            print(f"{len(written)} file(s) unpacked into {root / FEEDBACK_FOLDER}/")
    except HandbackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``make update``: bring in the instructor's latest release, keeping what the attendee changed.

An attendee's own work lives in ``mywork/`` (git ignores it) and is never touched. But a
chapter edited in place (a "Try it" done in the chapter's own cell) would make ``git
pull`` refuse, in front of the room. So this does what a helper would type, in order:

1. ``git stash``: the attendee's changes to tracked files are put aside (nothing
   untracked, nothing ignored: ``mywork/`` stays where it is);
2. ``git pull --ff-only``: the release comes in (the release is the instructor's
   history: a merge is never wanted);
3. ``git stash pop``: the changes are put back.

Afterwards it names the chapters, exercises and solutions the release changed: a chapter
left open in JupyterLab across an update still holds the old text in the browser, and
saving it would write that old text back over the release's. Hence the one instruction
the course gives everywhere: *close your chapters, then* ``make update``; and for a
chapter that was open after all, *File → Reload Notebook from Disk* before anything else.

When step 3 cannot join the two (the attendee changed lines the release changed too),
the release's version is left in place, the attendee's changes stay in git's stash, and
a plain message says which files, and how to look at or drop the changes. When step 2
fails, the changes are put back first, and git's own message is shown. Only the Python
standard library and git are used: it runs before ``make setup``, and with any Python 3.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime


def git(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def update(cwd=None, say=print) -> int:
    """Stash, pull, pop (see the module docstring); the exit status ``make update`` returns."""
    if git("rev-parse", "--is-inside-work-tree", cwd=cwd).returncode != 0:
        say("make update: this folder is not a git clone of the course; clone the release your instructor sent")
        return 2
    upstream = git("rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{u}", cwd=cwd)
    if upstream.returncode != 0:
        say("make update: this copy has no release to pull from (no upstream branch); "
            "clone the release your instructor sent, or ask them")
        return 2
    changed = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no", cwd=cwd).stdout.splitlines()]
    stashed = False
    if changed:
        label = f"make update {datetime.now():%Y-%m-%d %H:%M}: your changes to {', '.join(changed[:3])}"
        stash = git("stash", "push", "-m", label, cwd=cwd)
        if stash.returncode != 0:
            say(f"make update: could not put your changes aside (git stash):\n{stash.stderr.strip()}")
            return 1
        stashed = True
        say(f"put aside your changes to {len(changed)} file(s): {', '.join(changed)}")
    before = git("rev-parse", "HEAD", cwd=cwd).stdout.strip()
    pulled = git("pull", "--ff-only", cwd=cwd)
    if pulled.returncode != 0:
        if stashed:
            git("stash", "pop", cwd=cwd)
        say("make update: git pull failed, nothing was changed; git said:\n" + (pulled.stderr or pulled.stdout).strip())
        return 1
    say(f"git pull from {upstream.stdout.strip()}:\n" + (pulled.stdout.strip() or "Already up to date."))
    say_release_changes(before, cwd, say)
    if not stashed:
        return 0
    popped = git("stash", "pop", cwd=cwd)
    if popped.returncode == 0:
        say("put your changes back: they are in your files as before")
        return 0
    clashing = git("diff", "--name-only", "--diff-filter=U", cwd=cwd).stdout.split()
    git("reset", "-q", "--hard", "HEAD", cwd=cwd)  # the release's version; the changes are all still in the stash
    say(
        "The release is in, but your changes to " + (", ".join(clashing) or "some files") + " overlap with the release's, "
        "so those files now hold the release's version.\n"
        "Your changes are kept aside in git's stash (the newest entry of `git stash list`):\n"
        "  git stash show -p     shows them\n"
        "  git stash drop        forgets them, when you no longer need them\n"
        "Your work in mywork/ was not touched."
    )
    return 0


#: The folders whose notebooks an attendee may have open in JupyterLab.
NOTEBOOK_FOLDERS = ("chapters", "exercises", "solutions")


def changed_notebooks(before: str, cwd=None) -> list[str]:
    """The notebooks (``.md`` under :data:`NOTEBOOK_FOLDERS`) that differ between ``before`` and ``HEAD``."""
    if not before:
        return []
    diff = git("diff", "--name-only", before, "HEAD", "--", *NOTEBOOK_FOLDERS, cwd=cwd)
    return sorted(name for name in diff.stdout.split() if name.endswith(".md"))


def say_release_changes(before: str, cwd, say) -> None:
    """Name what the release changed, and what to do about a chapter still open in the browser."""
    changed = changed_notebooks(before, cwd)
    if not changed:
        say("The release changed no chapter, exercise or solution.")
        return
    say("The release changed: " + ", ".join(changed) + ".\n"
        "If one of them is open in JupyterLab, do not save it: File → Reload Notebook from Disk first "
        "(saving the open copy would write the old text back). A changed exercise arrives in exercises/; "
        "your copy in mywork/exercises/ is not touched.")


def main() -> int:
    return update()


if __name__ == "__main__":
    sys.exit(main())

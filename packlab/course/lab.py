"""Start JupyterLab on the course, the way attendees work through it (``make lab``).

Attendees open the chapters and exercises, which are MyST markdown files, as notebooks.
Three things make that work, and this module is the one place that sets them up, for
``make lab`` and for the test that drives JupyterLab in a browser
(``tests/test_lab_browser.py``):

* **Settings shipped with the course.** ``jupyterlab-settings/overrides.json5`` makes a
  double-click on a ``.md`` file open it with jupytext's notebook viewer. It is installed
  into the environment's JupyterLab settings (``overrides.d/``), which JupyterLab reads as
  its defaults; nothing is written to the home folder.
* **State of its own.** JupyterLab remembers open tabs *with the viewer each was opened
  in* (its workspace) and restores them before the settings above apply, so a ``.md``
  once opened as text would reopen as text. The course's JupyterLab keeps its workspaces
  and user settings in ``_build/lab/`` instead of the home folder.
* **The command line.** The server listens on 127.0.0.1 only, serves the repository,
  and adds ``--allow-root`` when run as root (JupyterLab refuses root otherwise). On a
  remote machine (a cluster node, a server) start it with ``--no-browser`` and reach it
  through an ssh tunnel (see the book's setup page).
* **The attendee's own copies.** The first start copies every exercise into
  ``mywork/exercises/`` (git-ignored, :func:`packlab.course.release.copy_exercises`);
  attendees work there, so their code never stands in the way of a ``git pull``, and
  ``make submit`` packs that folder for the grader.

Saving a notebook writes the ``.md`` file back through jupytext, filtered by
``jupytext.toml`` (see the comments there). The chapters' headers are committed as
jupytext writes them (``make headers``), so saving a chapter that was only run leaves it
byte-identical.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from packlab import paths

#: The JupyterLab settings the course ships (JSON5: JSON with comments).
SETTINGS_SOURCE = paths.repo_root() / "jupyterlab-settings" / "overrides.json5"
#: Its name among the environment's settings overrides.
SETTINGS_NAME = "packlab.json5"
#: Where ``make lab`` keeps JupyterLab's workspaces and user settings.
STATE_DIR = paths.build_dir() / "lab"
#: JupyterLab's usual port; if it is taken, JupyterLab tries the next ones.
DEFAULT_PORT = 8888


def settings_target() -> Path:
    """Where JupyterLab of this environment reads defaults from: ``<app dir>/settings/overrides.d/``."""
    from jupyterlab.commands import get_app_dir

    return Path(get_app_dir()) / "settings" / "overrides.d" / SETTINGS_NAME


def install_settings() -> Path:
    """Copy the course's JupyterLab settings into the environment (if they differ); return the copy."""
    target = settings_target()
    if not target.exists() or target.read_bytes() != SETTINGS_SOURCE.read_bytes():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SETTINGS_SOURCE, target)
    return target


def command(
    port: int = DEFAULT_PORT,
    state_dir: Path = STATE_DIR,
    token: str | None = None,
    open_browser: bool = True,
    port_retries: int | None = None,
    root: Path | None = None,
) -> list[str]:
    """The command line that starts the course's JupyterLab on the repository.

    ``state_dir`` holds the workspaces and user settings (a fresh folder gives a
    JupyterLab that remembers nothing). ``token=None`` lets Jupyter make up a token and
    print the URL with it; ``port_retries=0`` fails instead of moving to another port.
    ``root`` is the folder it serves (default: this repository; a test serves a clone).
    """
    state_dir = Path(state_dir).resolve()
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        f"--ServerApp.root_dir={Path(root or paths.repo_root()).resolve()}",
        f"--LabApp.workspaces_dir={state_dir / 'workspaces'}",
        f"--LabApp.user_settings_dir={state_dir / 'user-settings'}",
        f"--ServerApp.open_browser={open_browser}",
    ]
    if port_retries is not None:
        cmd.append(f"--ServerApp.port_retries={port_retries}")
    if token is not None:
        cmd.append(f"--IdentityProvider.token={token}")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    return cmd


def prepare(state_dir: Path = STATE_DIR, root: Path | None = None) -> list[Path]:
    """Everything before the command runs: the settings, the state folders, the attendee's copies.

    Returns the exercise copies made now in ``mywork/exercises/`` (none after the first start).
    """
    from packlab.course import release

    install_settings()
    for folder in ("workspaces", "user-settings"):
        (Path(state_dir) / folder).mkdir(parents=True, exist_ok=True)
    return release.copy_exercises(root)


BANNER = """\
Starting JupyterLab on the course (stop it with Ctrl+C, twice).
  Open the http://127.0.0.1:... URL it prints below, with its ?token=... part.
  On a remote machine: ssh -L 8888:127.0.0.1:<port> you@machine, then open that URL here.
  Double-click a chapter (chapters/) or your copy of an exercise (mywork/exercises/) to
  open it as a notebook. Should a .md file open as text: right-click it -> Open With ->
  Jupytext Notebook. When you leave a chapter: File -> Shut Down Kernel (memory).
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.lab", description="Start JupyterLab on the course.")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default %(default)s)")
    parser.add_argument("--no-browser", action="store_true",
                        help="do not open a web browser (a remote machine: reach it through an ssh tunnel)")
    parser.add_argument("--setup-only", action="store_true",
                        help="install the settings and copy the exercises into mywork/, then stop (for a JupyterLab "
                             "started otherwise: Open OnDemand, a hub)")
    args = parser.parse_args(argv)
    made = prepare()
    if args.setup_only:
        print(f"JupyterLab settings installed into this environment; {len(made)} exercises copied into mywork/exercises/")
        return
    cmd = command(port=args.port, open_browser=not args.no_browser)
    print(BANNER, flush=True)
    if made:
        print(f"  Copied {len(made)} exercises into mywork/exercises/: work there (git-ignored, yours).\n", flush=True)
    os.chdir(paths.repo_root())
    os.execv(cmd[0], cmd)  # JupyterLab takes over this process: Ctrl+C reaches it directly


if __name__ == "__main__":
    main()

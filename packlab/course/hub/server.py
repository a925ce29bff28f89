"""The hub's login and each attendee's server: imported by JupyterHub, in the hub's process only.

:class:`ClassListAuthenticator` logs in the people of the class list with their own
passwords (:mod:`packlab.course.hub.accounts`); instructors are the hub's admins.

:class:`CourseSpawner` starts an attendee's JupyterLab the way the course expects it:

* **their own copy of the course**: ``users/<name>/course``, a ``git clone`` of the
  release repository (``make release``), made at their first start; ``git pull`` there
  brings the instructor's next release;
* **``mywork/`` made**, with a copy of every exercise (:func:`packlab.course.release.copy_exercises`),
  which is where they work, so a pull never meets their code; JupyterLab opens on it;
* **the data in place, shared read-only**: the hub's dataset (small-data mode,
  ``PACKLAB_COUNT``) is bound into the copy's ``data/`` read-only; the packed copies the
  chapters write go to the attendee's own ``data/packed/``;
* **a share of the cores**: ``PACKLAB_CORES`` caps the workers each server's chapters and
  checks start (``--cores``; by default the machine's cores shared out among the attendees);
* **the course's JupyterLab settings** (installed into the shared environment by ``make hub``);
* **every check recorded** for the board into ``records/<name>/`` (``PACKLAB_CLASS_RECORDS``);
* **submissions** into the drop folder ``dropbox/<name>/exercises/`` (``make submit``);
* **in a sandbox** (:mod:`packlab.course.sandbox`): the server and everything it starts
  see the system, the shared environment, the release and the dataset read-only, and can
  write only to their own home, their records folder and their drop folder. They keep
  the machine's network (the hub's proxy reaches them over it). Without bubblewrap the
  hub does not start unless told ``--no-sandbox``; then the attendees' servers run as
  the instructor's user, with no wall between them.

Everything is read from the hub folder's ``hub.json``, which ``python -m packlab.course.hub``
writes (:mod:`packlab.course.hub.config`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from jupyterhub.auth import Authenticator
from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Bool, Unicode, default

from packlab import cpus
from packlab.course import release, sandbox
from packlab.course.grading.records import CLASS_RECORDS_ENV_VAR
from packlab.course.hub import accounts

#: The dataset's files a copy of the course gets, read-only, from the hub's data folder.
SHARED_DATA = ("images", "manifest.csv", "labels.csv", "dataset.json")


class ClassListAuthenticator(Authenticator):
    """Logs in the people of the class list with their own passwords (``accounts.json``)."""

    accounts_file = Unicode(config=True, help="accounts.json written by packlab.course.hub.accounts.ensure_accounts")

    def _accounts(self) -> dict:
        with open(self.accounts_file) as f:
            return json.load(f)

    async def authenticate(self, handler, data):
        name = self.normalize_username(data.get("username", ""))
        known = self._accounts()
        if not accounts.verify(known, name, data.get("password", "")):
            self.log.warning("failed login for %r", name)
            return None
        return {"name": name, "admin": bool(known[name]["instructor"])}


class CourseSpawner(SimpleLocalProcessSpawner):
    """An attendee's JupyterLab in their own copy of the release, in a sandbox (see the module docstring)."""

    hub_folder = Unicode(config=True, help="the hub's folder (users/, records/, dropbox/, data/)")
    release_repository = Unicode(config=True, help="the git repository attendees clone and pull from")
    environment_prefix = Unicode(sys.prefix, config=True, help="the Python environment every server runs in")
    small_count = Unicode("", config=True, help="PACKLAB_COUNT for every attendee (the hub's dataset's size)")
    cores = Unicode("", config=True, help="PACKLAB_CORES for every attendee: the most cores one server's workers use")
    sandboxed = Bool(True, config=True, help="run each server in bubblewrap's sandbox")

    @property
    def folder(self) -> Path:
        return Path(self.hub_folder)

    @property
    def course(self) -> Path:
        return Path(self.home_dir) / "course"

    @default("home_dir")
    def _default_home_dir(self):
        return str(Path(self.hub_folder) / "users" / self.user.name)

    def prepare(self) -> None:
        """The attendee's copy of the release, ``mywork/``, the data's mount points, their records and drop folders."""
        if not (self.course / ".git").is_dir():
            self.course.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "clone", "-q", self.release_repository, str(self.course)], check=True, timeout=300,
                           capture_output=True)
        release.copy_exercises(self.course)
        for folder in (self.records_folder, self.drop_folder, self.course / "data" / "packed"):
            folder.mkdir(parents=True, exist_ok=True)

    @property
    def records_folder(self) -> Path:
        return self.folder / "records" / self.user.name

    @property
    def drop_folder(self) -> Path:
        return self.folder / "dropbox" / self.user.name

    def user_env(self, env):
        env = super().user_env(env)
        prefix = Path(self.environment_prefix)
        env.update({
            "PATH": f"{prefix / 'bin'}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(self.course),  # the copy's own packlab: its paths point into the copy
            CLASS_RECORDS_ENV_VAR: str(self.records_folder),
            # make submit / make update in a terminal: the hub's environment, the drop folder, the attendee's name
            "PACKLAB_HUB": "1",
            "VENV": str(prefix),
            "NAME": self.user.name,
            "SUBMIT_TO": str(self.folder / "dropbox"),
        })
        if self.small_count:
            env["PACKLAB_COUNT"] = self.small_count
        if self.cores:
            # Every server sees all the machine's cores; without a cap each attendee's chapters would start a
            # worker per core (as far as the work allows), and the class would share them many times over.
            env[cpus.CORES_SETTING] = self.cores
        return env

    def box(self) -> sandbox.Sandbox:
        """The sandbox of this attendee's server."""
        data = self.folder / "data"
        mounts = [(data / name, self.course / "data" / name) for name in SHARED_DATA if (data / name).exists()]
        return sandbox.Sandbox(
            readable=[Path(self.release_repository), data, Path(self.environment_prefix)],
            writable=[Path(self.home_dir), self.records_folder, self.drop_folder],
            mounts=mounts, network=True, cwd=self.course, share_course=False,
        )

    async def start(self):
        self.prepare()
        self.notebook_dir = str(self.course)
        server = [str(Path(self.environment_prefix) / "bin" / "jupyterhub-singleuser")]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            server.append("--ServerApp.allow_root=True")  # root inside a namespace of its own: no power outside
        self.cmd = sandbox.command(self.box(), server) if self.sandboxed else server
        return await super().start()

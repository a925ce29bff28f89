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
* **a slice of the cores of its own**: the server and everything it starts run on
  ``cores_per_attendee`` cores (default 2) by CPU affinity (``taskset -c``), handed out
  round-robin from the hub's cores when the server starts and taken back when it stops
  (:mod:`packlab.course.hub.slices`), and ``PACKLAB_CORES`` says how many, so its chapters
  start as many workers as the slice has cores. When every slice is taken the next server
  does not start, and the attendee's spawn page says why, unless the hub was told
  ``--oversubscribe`` (then slices are shared);
* **memory and processes**: each process in the sandbox has an address-space cap
  (``prlimit --as``, :data:`packlab.course.sandbox.DEFAULT_MEMORY_BYTES`), which stops a
  runaway allocation but not the sum of one attendee's processes. With ``memory_limit``
  and/or ``pids_limit`` set, the server also runs in cgroups of its own
  (:class:`packlab.course.hub.slices.ServerCgroups`, cgroup v1, as root): a memory limit
  for the server and everything it starts together, and a limit on their processes and
  threads, so a fork bomb or a memory hog stays in its attendee's server; stopping the
  server kills whatever it left in them. At the memory limit the OOM killer ends a kernel
  before JupyterLab (an IPython startup file in the attendee's home raises each kernel's
  ``oom_score_adj``, :data:`packlab.course.hub.slices.KERNEL_OOM_SCORE_ADJ`). Where the hub
  machine runs systemd (cgroup v2), ``jupyterhub-systemdspawner`` (what The Littlest
  JupyterHub uses) puts each server in a unit of its own with ``MemoryMax`` and
  ``TasksMax``; this project does not use it;
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
import shutil
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

from jupyterhub.auth import Authenticator
from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Bool, Integer, Unicode, default

from packlab import cpus
from packlab.course import release, sandbox
from packlab.course.grading.records import CLASS_RECORDS_ENV_VAR
from packlab.course.hub import accounts, slices

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
    cores_per_attendee = Integer(slices.DEFAULT_CORES_PER_ATTENDEE, config=True,
                                 help="the cores of each server's slice (its CPU affinity and PACKLAB_CORES)")
    oversubscribe = Bool(False, config=True, help="share slices when every one is taken, instead of refusing to start")
    sandboxed = Bool(True, config=True, help="run each server in bubblewrap's sandbox")
    memory_limit = Unicode("", config=True, help="each server's memory, all its processes together (a cgroup), "
                           "e.g. 6G; empty: no limit but the sandbox's address-space cap per process")
    pids_limit = Integer(0, config=True, help="the most processes and threads a server may have at once (a cgroup's "
                         "pids.max); 0: no limit")

    #: One allocator per hub (folder, slice size, oversubscription): every attendee's spawner shares it.
    _allocators: ClassVar[dict[tuple, slices.SliceAllocator]] = {}
    core_slice: slices.Slice | None = None  # the cores of the running server, None when stopped
    cgroups: slices.ServerCgroups | None = None  # its memory and pids cgroups, None without limits or when stopped

    @property
    def allocator(self) -> slices.SliceAllocator:
        key = (self.hub_folder, self.cores_per_attendee, self.oversubscribe)
        if key not in self._allocators:
            record = Path(self.hub_folder) / slices.SLICES_FILE if self.hub_folder else None
            self._allocators[key] = slices.SliceAllocator(slices.hub_cores(), self.cores_per_attendee,
                                                          self.oversubscribe, record)
        return self._allocators[key]

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
        if self.cgroups is not None and "memory" in self.cgroups.folders:
            # Without it, a hog killed at the limit and started again at once met the limit before the dead one's
            # memory was given back, and the OOM killer's next choice was JupyterLab (the load test's memory hog).
            startup = Path(self.home_dir) / ".ipython" / "profile_default" / "startup" / "00-packlab-oom.py"
            startup.parent.mkdir(parents=True, exist_ok=True)
            startup.write_text(slices.KERNEL_OOM_STARTUP)

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
        if self.core_slice is not None:
            # The affinity alone would do for torch and os.sched_getaffinity; the setting makes the count explicit
            # for the course's own sizing and for `make doctor` in the attendee's terminal.
            env[cpus.CORES_SETTING] = str(len(self.core_slice.cores))
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

    def server_command(self) -> list[str]:
        """JupyterLab in the attendee's sandbox (or bare without one): what runs inside the slice or the Slurm job."""
        server = [str(Path(self.environment_prefix) / "bin" / "jupyterhub-singleuser")]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            server.append("--ServerApp.allow_root=True")  # root inside a namespace of its own: no power outside
        return sandbox.command(self.box(), server) if self.sandboxed else server

    def command(self) -> list[str]:
        """The server's command line: ``taskset -c SLICE`` around :meth:`server_command`, entering its cgroups first."""
        # The affinity is set before prlimit and bwrap start, and every process they start inherits it.
        command = [shutil.which("taskset") or "taskset", "-c", self.core_slice.cpu_list(), *self.server_command()]
        return self.cgroups.enter_command(command) if self.cgroups is not None else command

    def limit(self) -> None:
        """This server's cgroups, when the hub sets a memory or process limit (:class:`slices.CgroupUnavailable` if it cannot)."""
        if self.memory_limit or self.pids_limit:
            memory = slices.parse_size(self.memory_limit) if self.memory_limit else None
            self.cgroups = slices.ServerCgroups.create(self.user.name, memory, self.pids_limit or None)

    async def start(self):
        # First the slice: a full hub refuses before cloning anything. NoSliceFree's message is what the
        # attendee's spawn page shows ("Spawn failed: The hub is full ...").
        self.core_slice = self.allocator.assign(self.user.name)
        if self.core_slice.shared:
            self.log.warning("%s shares cores %s with another server (--oversubscribe)", self.user.name,
                             self.core_slice.cpu_list())
        try:
            self.limit()
            self.prepare()
            self.notebook_dir = str(self.course)
            self.cmd = self.command()
            return await super().start()
        except BaseException:
            self._release()
            raise

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            self._release()

    def _release(self) -> None:
        if self.core_slice is not None:
            self.allocator.release(self.user.name)
            self.core_slice = None
        if self.cgroups is not None:
            self.cgroups.remove()
            self.cgroups = None

    def get_state(self):
        state = super().get_state()
        if self.core_slice is not None:
            state["slice"] = list(self.core_slice.cores)
        if self.cgroups is not None:
            state["cgroups"] = {controller: str(folder) for controller, folder in self.cgroups.folders.items()}
        return state

    def load_state(self, state):
        """A server still running when the hub restarted keeps its slice."""
        super().load_state(state)
        if state.get("slice") and self.pid:
            self.core_slice = self.allocator.claim(self.user.name, tuple(state["slice"]))
        if state.get("cgroups") and self.pid:
            self.cgroups = slices.ServerCgroups({c: Path(folder) for c, folder in state["cgroups"].items()})

    def clear_state(self):
        """Called when the server has stopped or died, and before each start: its slice is free again."""
        super().clear_state()
        self._release()

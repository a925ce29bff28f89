"""The hub's JupyterHub configuration, from the settings ``python -m packlab.course.hub`` writes.

``<hub folder>/hub.json`` holds what changes from one class to the next (the address, the
release, the dataset's size, the idle time); ``<hub folder>/jupyterhub_config.py`` calls
:func:`stop_children_at_interrupt` and :func:`configure` with that folder. Everything else is
decided here:

* the login: :class:`~packlab.course.hub.server.ClassListAuthenticator`, the people of the
  class list only, instructors as admins;
* each attendee's server: :class:`~packlab.course.hub.server.CourseSpawner`, opening on
  ``mywork/exercises``, with time to start on a busy machine;
* each server's slice of the cores (``cores_per_attendee``, ``oversubscribe``:
  :mod:`packlab.course.hub.slices`); or, with ``"spawner": "slurm"``, each server a Slurm
  job of ``cores_per_attendee`` CPUs and ``slurm.memory`` (:mod:`packlab.course.hub.slurm`),
  with the hub's API on every address and ``slurm.hub_address`` the one the nodes are told;
* the proxy: configurable-http-proxy from npm, installed by ``make hub`` into
  ``.tools/chp/`` (:data:`PROXY`), on internal ports of its own; HTTPS when ``hub.json``
  names a certificate and key (``ssl_cert``, ``ssl_key``);
* two services the hub starts and stops with itself: the idle culler
  (``jupyterhub-idle-culler``: a server nobody used for ``idle_timeout`` seconds is
  stopped; its files stay), and the progress board at ``/services/board/``
  (:mod:`packlab.course.hub.board`), which only instructors may open.
"""

from __future__ import annotations

import json
import signal
import socket
import sys
from pathlib import Path

from packlab import paths
from packlab.course.hub import slices

SETTINGS = "hub.json"
CONFIG = "jupyterhub_config.py"
#: configurable-http-proxy as ``make hub`` installs it (npm, into the checkout's tools folder).
PROXY = paths.repo_root() / ".tools" / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
#: The culler's scopes, as jupyterhub-idle-culler's README lists them (no user is deleted).
CULLER_SCOPES = ["list:users", "read:users:activity", "read:servers", "delete:servers"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def write(folder: Path, settings: dict) -> Path:
    """Write ``hub.json`` and the ``jupyterhub_config.py`` that reads it into ``folder``; return the config file."""
    folder = Path(folder).resolve()
    (folder / SETTINGS).write_text(json.dumps(settings, indent=1) + "\n")
    config = folder / CONFIG
    config.write_text(
        "# Written by python -m packlab.course.hub; the settings are in hub.json beside it.\n"
        "from packlab.course.hub.config import configure, stop_children_at_interrupt\n\n"
        "stop_children_at_interrupt()\n"
        f"configure(get_config(), {str(folder)!r})  # noqa: F821 - get_config is JupyterHub's\n"
    )
    return config


def _ignore_interrupt(signum, frame) -> None:
    """What the hub does with a Ctrl+C that arrives before JupyterHub installs its own handler: nothing."""


def stop_children_at_interrupt() -> None:
    """Let the processes the hub starts stop at its first signal, even where the hub ignores Ctrl+C (SIGINT).

    JupyterHub stops each service (the board, the idle culler) with SIGINT and sends SIGTERM
    only after ``interrupt_timeout``, 30 s, per service and one service after the other. A hub
    started from a process that ignores SIGINT (a command put in the background by a shell
    script, a pytest-xdist worker) passes the ignoring on to everything it starts, since an
    ignored signal stays ignored across ``exec``; Python then installs no KeyboardInterrupt
    handler, and each service waits out the 30 s. The hub took about 60 s to stop in such a
    test, so a caller that waits a minute before SIGKILL left the board running: it sits in a
    session of its own (JupyterHub starts services with ``start_new_session``), out of reach
    of a signal to the hub's process group.

    A handler that does nothing keeps the hub ignoring SIGINT until JupyterHub installs its
    own (which then shuts the hub down cleanly), but a handler, unlike "ignore", is reset to
    the default across ``exec``: the services and the attendees' servers get SIGINT back.
    Called from the ``jupyterhub_config.py`` that :func:`write` writes, in the hub's process.
    """
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, _ignore_interrupt)


def configure(c, folder: str | Path) -> None:
    """Fill JupyterHub's config object ``c`` for the hub in ``folder`` (see the module docstring)."""
    folder = Path(folder)
    s = json.loads((folder / SETTINGS).read_text())
    people = s["people"]
    instructors = {name for name, role in people.items() if role == "instructor"}

    url = s["url"]
    if s.get("ssl_cert"):
        # JupyterHub's proxy then serves HTTPS itself: the passwords never cross the room in plain text.
        c.JupyterHub.ssl_cert = s["ssl_cert"]
        c.JupyterHub.ssl_key = s["ssl_key"]
        url = "https://" + url.partition("://")[2]
    c.JupyterHub.bind_url = url
    c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{s['hub_port']}"
    c.JupyterHub.db_url = f"sqlite:///{folder / 'jupyterhub.sqlite'}"
    c.JupyterHub.cookie_secret_file = str(folder / "jupyterhub_cookie_secret")
    c.JupyterHub.pid_file = str(folder / "jupyterhub.pid")
    c.ConfigurableHTTPProxy.command = [s["proxy"]]
    c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{s['proxy_api_port']}"
    c.ConfigurableHTTPProxy.pid_file = str(folder / "proxy.pid")

    c.JupyterHub.authenticator_class = "packlab.course.hub.server.ClassListAuthenticator"
    c.ClassListAuthenticator.accounts_file = str(folder / "accounts.json")
    c.Authenticator.allowed_users = set(people)
    c.Authenticator.admin_users = instructors

    c.JupyterHub.spawner_class = "packlab.course.hub.server.CourseSpawner"
    c.CourseSpawner.hub_folder = str(folder)
    c.CourseSpawner.release_repository = s["release"]
    c.CourseSpawner.environment_prefix = s["environment"]
    c.CourseSpawner.small_count = str(s.get("count") or "")
    c.CourseSpawner.cores_per_attendee = int(s.get("cores_per_attendee") or slices.DEFAULT_CORES_PER_ATTENDEE)
    c.CourseSpawner.oversubscribe = bool(s.get("oversubscribe", False))
    c.CourseSpawner.sandboxed = bool(s["sandboxed"])
    # Limits on each server's processes together (cgroups: packlab.course.hub.slices.ServerCgroups); none when unset.
    c.CourseSpawner.memory_limit = str(s.get("memory_per_attendee") or "")
    c.CourseSpawner.pids_limit = int(s.get("pids_per_attendee") or 0)
    if s.get("spawner") == "slurm":
        # Each server a Slurm job on a compute node (packlab.course.hub.slurm); it must reach the hub's API, so that
        # listens on every address, and the servers are told the one the nodes reach (hub_address).
        slurm = s["slurm"]
        c.JupyterHub.spawner_class = "packlab.course.hub.slurm.SlurmCourseSpawner"
        c.JupyterHub.hub_bind_url = f"http://0.0.0.0:{s['hub_port']}"
        c.JupyterHub.hub_connect_url = f"http://{slurm['hub_address']}:{s['hub_port']}"
        c.SlurmCourseSpawner.partition = slurm.get("partition") or ""
        c.SlurmCourseSpawner.memory = slurm.get("memory") or ""
        c.SlurmCourseSpawner.time_limit = slurm.get("time") or ""
    c.Spawner.default_url = "/lab/tree/mywork/exercises"
    c.Spawner.start_timeout = 300  # the first start clones the release; a busy machine starts JupyterLab slowly
    c.Spawner.http_timeout = 180

    python = s.get("python", sys.executable)
    c.JupyterHub.services = [
        {
            "name": "idle-culler",
            "command": [python, "-m", "jupyterhub_idle_culler", f"--timeout={int(s['idle_timeout'])}"],
        },
        {
            "name": "board",
            "url": f"http://127.0.0.1:{s['board_port']}",
            "command": [python, "-m", "packlab.course.hub.board", "--hub", "--records", str(folder / "records"),
                        "--roster", str(folder / "class.txt"), "--port", str(s["board_port"])],
            "oauth_no_confirm": True,
            "display": True,
        },
    ]
    c.JupyterHub.load_roles = [{"name": "idle-culler", "scopes": CULLER_SCOPES, "services": ["idle-culler"]}]

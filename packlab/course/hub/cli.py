"""``python -m packlab.course.hub`` (``make hub``): prepare the hub's folder, then run JupyterHub in it.

::

    python -m packlab.course.hub --class-list class.txt [--dir hub] [--url http://127.0.0.1:8000]
                                 [--release REPO] [--count 2000] [--cores N] [--idle-timeout 3600] [--no-sandbox]

Preparation, each step skipped when it is done already: the accounts (passwords for new
names), the release repository (``make release`` into ``<dir>/release`` when ``--release``
names none), the dataset in ``<dir>/data`` at ``--count`` images, the course's JupyterLab
settings in the environment, the records and drop folders, the configuration. Then
JupyterHub takes over this process (``--prepare-only`` stops before).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from packlab import cpus, paths
from packlab.course import lab, release, sandbox
from packlab.course.hub import accounts, config

DEFAULT_URL = "http://127.0.0.1:8000"
#: The hub's dataset size: the small-data mode, what a hub of many users and a small disk runs.
DEFAULT_COUNT = 2000
IDLE_TIMEOUT = 3600


def attendee_cores(people: int) -> int:
    """An even share of this machine's cores for each of ``people`` servers, at least one."""
    return max(1, cpus.affinity_cores() // max(1, people))


def prepare(class_list: Path, folder: Path, url: str = DEFAULT_URL, release_repo: Path | None = None,
            count: int | None = DEFAULT_COUNT, idle_timeout: int = IDLE_TIMEOUT, sandboxed: bool = True,
            proxy: Path = config.PROXY, log=print, cores: int | None = None) -> Path:
    """Everything the hub needs in ``folder`` (see the module docstring); returns the JupyterHub config file."""
    folder = Path(folder).resolve()
    people = accounts.read_people(class_list)
    if not Path(proxy).exists():
        raise SystemExit(f"error: no configurable-http-proxy at {proxy}: `make hub` installs it from npm into .tools/chp/")
    if sandboxed and (why := sandbox.why_unavailable()):
        raise SystemExit(f"error: {why}. Without a sandbox every attendee's code runs as you, with your files: "
                         "if that is what you want, pass --no-sandbox (HUB_ARGS=--no-sandbox)")
    folder.mkdir(parents=True, exist_ok=True)
    if Path(class_list).resolve() != (folder / "class.txt"):
        shutil.copyfile(class_list, folder / "class.txt")
    plain, _ = accounts.ensure_accounts(people, folder)
    cores = cores or attendee_cores(len(people))
    log(f"each server's workers use at most {cores} of this machine's {cpus.affinity_cores()} cores (PACKLAB_CORES)")
    log(f"accounts for {len(people)} people; their passwords: {plain}")
    if release_repo is None:
        release_repo = folder / "release"
        if not (release_repo / ".git").is_dir():
            commit = release.release(release_repo)
            log(f"release repository made at {release_repo} (commit {commit[:12] if commit else '-'})")
    data_dir = folder / "data"
    env = {**os.environ, paths.DATA_ENV_VAR: str(data_dir)}
    if count:
        env["PACKLAB_COUNT"] = str(count)
    log(f"dataset at {data_dir} ({count or 'the default number of'} images) ...")
    subprocess.run([sys.executable, "-m", "packlab.data", "-q"], env=env, check=True, timeout=3600)
    lab.install_settings()
    for name in ("records", "dropbox", "users"):
        (folder / name).mkdir(exist_ok=True)
    settings = {
        "url": url,
        "people": {p.name: "instructor" if p.instructor else "attendee" for p in people},
        "release": str(Path(release_repo).resolve()),
        "environment": sys.prefix,
        "python": sys.executable,
        "count": count,
        "cores": cores,
        "idle_timeout": idle_timeout,
        "sandboxed": sandboxed,
        "proxy": str(Path(proxy).resolve()),
        "hub_port": config.free_port(),
        "proxy_api_port": config.free_port(),
        "board_port": config.free_port(),
    }
    return config.write(folder, settings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.hub", description=__doc__.split("\n\n")[0])
    parser.add_argument("--class-list", type=Path, required=True, help="one name a line; 'NAME instructor' for instructors")
    parser.add_argument("--dir", type=Path, default=paths.repo_root() / "hub", help="the hub's folder (default hub/)")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"where the hub listens (default {DEFAULT_URL}; "
                        "http://0.0.0.0:8000 for a room, behind TLS)")
    parser.add_argument("--release", type=Path, default=None, help="the release repository attendees clone (default: made in DIR/release)")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT, help=f"the dataset's size (default {DEFAULT_COUNT}; 0: the full 10,000)")
    parser.add_argument("--cores", type=int, default=None, help="the most cores one attendee's workers use "
                        "(PACKLAB_CORES; default: this machine's cores shared out evenly among the class list)")
    parser.add_argument("--idle-timeout", type=int, default=IDLE_TIMEOUT, help="seconds before an unused server is stopped")
    parser.add_argument("--no-sandbox", action="store_true", help="run the attendees' servers without bubblewrap (no wall between them)")
    parser.add_argument("--prepare-only", action="store_true", help="prepare the folder and stop")
    args = parser.parse_args(argv)
    try:
        config_file = prepare(args.class_list, args.dir, args.url, args.release, args.count or None, args.idle_timeout,
                              not args.no_sandbox, cores=args.cores)
    except accounts.ClassListError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"hub prepared in {config_file.parent}; the board for instructors: {args.url}/services/board/", flush=True)
    if args.prepare_only:
        return 0
    os.chdir(config_file.parent)
    command = [sys.executable, "-m", "jupyterhub", "-f", str(config_file)]
    os.execv(command[0], command)  # JupyterHub takes over: Ctrl+C stops it, and the attendees' servers with it
    return 0

"""``python -m packlab.course.hub`` (``make hub``): prepare the hub's folder, then run JupyterHub in it.

::

    python -m packlab.course.hub --class-list class.txt [--dir hub] [--url http://127.0.0.1:8000]
                                 [--release REPO] [--count 2000] [--cores-per-attendee 2] [--oversubscribe]
                                 [--ssl-cert FILE --ssl-key FILE] [--idle-timeout 9000] [--no-sandbox]
                                 [--spawner slurm --slurm-partition P --mem-per-attendee 4G
                                  --slurm-time 8:00:00 --hub-address HOST]

Preparation, each step skipped when it is done already: the accounts (passwords for new
names), the release repository (``make release`` into ``<dir>/release`` when ``--release``
names none), the dataset in ``<dir>/data`` at ``--count`` images, the course's JupyterLab
settings in the environment, the records and drop folders, the configuration, and a
systemd unit, ``<dir>/packed-data-hub.service``, that runs the same hub as a service
(restarted if it fails; how to install it, or to run the hub under tmux, is printed).
Then JupyterHub takes over this process (``--prepare-only`` stops before).

On a cluster, ``--spawner slurm`` makes each attendee's server a Slurm job of
``--cores-per-attendee`` CPUs and ``--mem-per-attendee`` memory in ``--slurm-partition``
(:mod:`packlab.course.hub.slurm`): run the hub on a machine that can ``sbatch``, with its
folder and the environment on a file system the compute nodes share, and ``--hub-address``
the name or address of this machine that the compute nodes reach (default: its host name).

Root is not needed to run the hub: the accounts are the hub's own (``accounts.json``, no
system users), and the sandbox is bubblewrap in unprivileged user namespaces. Root is
needed once to install bubblewrap (``make system-deps HUB=1``), where the system forbids
unprivileged user namespaces (Ubuntu 23.10 and later, through AppArmor) to allow them, to
install the systemd unit, and to listen on a port below 1024; :func:`prepare` stops at
once, naming which, when one of these stands in a normal account's way.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from packlab import paths
from packlab.course import lab, release, sandbox
from packlab.course.hub import accounts, config, slices

DEFAULT_URL = "http://127.0.0.1:8000"
#: The hub's dataset size: the small-data mode, what a hub of many users and a small disk runs.
DEFAULT_COUNT = 2000
#: Seconds without use before a server is stopped: 2.5 hours, so that a lunch break (an hour or more) stops nobody's.
IDLE_TIMEOUT = 9000
#: sbatch --mem per server: chapter 9's kernel and workers peaked at 4.1 GB (setup.md), plus JupyterLab beside them.
DEFAULT_MEMORY_PER_ATTENDEE = "6G"
#: Processes and threads per server (a cgroup's pids.max): 64 DataLoader workers fit, a fork bomb stops.
DEFAULT_PIDS_PER_ATTENDEE = 2048
#: What the hub runs to start, follow and stop the servers' jobs (``--spawner slurm``).
SLURM_TOOLS = ("sbatch", "squeue", "scancel")
#: The systemd unit ``make hub`` writes into the hub folder.
SERVICE = "packed-data-hub.service"


def is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def listens_beyond_loopback(url: str) -> bool:
    """Whether the hub at ``url`` can be reached from other machines (anything but 127.x, ::1, localhost)."""
    host = urlsplit(url).hostname or ""
    return not (host == "localhost" or host.startswith("127.") or host == "::1")


def needs_root(url: str, sandboxed: bool) -> str | None:
    """What, of this hub, a normal account cannot do here (the message to stop with), or None when nothing."""
    if is_root():
        return None
    port = urlsplit(url).port
    if port is not None and port < 1024:
        return (f"{url} listens on port {port}, and ports below 1024 need root: use a port of 1024 or more "
                "(the default is 8000), or put a TLS proxy on 443 in front of it")
    if sandboxed and (why := sandbox.why_unavailable()):
        return (f"{why}. A normal account needs root once for this: to install bubblewrap (`sudo make system-deps "
                "HUB=1`), or, where the system restricts user namespaces (Ubuntu 23.10 and later: "
                "`sudo sysctl kernel.apparmor_restrict_unprivileged_userns=0`, or an AppArmor profile for bwrap), "
                "to allow them. Nothing else of the hub needs root")
    return None


def unit_file(folder: Path, command: list[str], node: str | None) -> str:
    """The systemd unit that runs ``command`` (JupyterHub on the hub's configuration) in ``folder`` as a service."""
    user = "" if is_root() else f"User={pwd.getpwuid(os.geteuid()).pw_name}\n"
    # systemd's PATH has neither the environment nor a node installed outside /usr: the proxy needs node.
    search = [str(Path(sys.executable).parent)]
    if node:
        search.append(str(Path(node).parent))
    search += ["/usr/local/bin", "/usr/bin", "/bin"]
    path = ":".join(dict.fromkeys(search))
    return (
        "# Written by `make hub` (python -m packlab.course.hub); written again at each `make hub`.\n"
        "[Unit]\n"
        "Description=The class hub of Packed Data Formats for Deep Learning (JupyterHub)\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n\n"
        "[Service]\n"
        f"{user}"
        f"WorkingDirectory={folder}\n"
        f"Environment=PATH={path}\n"
        f"ExecStart={shlex.join(command)}\n"
        "Restart=on-failure\n"
        "RestartSec=5\n\n"
        "[Install]\n"
        "WantedBy=multi-user.target\n"
    )


def how_to_run(folder: Path, command: list[str]) -> str:
    """What ``make hub`` prints about running the hub for a whole day."""
    unit = folder / SERVICE
    return (
        f"To keep the hub running when this terminal closes, as a service (it restarts if it fails):\n"
        f"  sudo systemctl link {unit} && sudo systemctl enable --now {SERVICE.removesuffix('.service')}\n"
        f"  (its log: journalctl -u {SERVICE.removesuffix('.service')}; after changing the class list, run "
        "`make hub ... HUB_ARGS=--prepare-only`, then `sudo systemctl restart "
        f"{SERVICE.removesuffix('.service')}`)\n"
        f"Without systemd, in tmux (detach with Ctrl+B D, come back with `tmux attach -t hub`):\n"
        f"  tmux new -s hub -c {shlex.quote(str(folder))} {shlex.quote(shlex.join(command))}\n"
        "A restart of the hub stops every attendee's server (their files stay; they start it again)."
    )


def prepare(class_list: Path, folder: Path, url: str = DEFAULT_URL, release_repo: Path | None = None,
            count: int | None = DEFAULT_COUNT, idle_timeout: int = IDLE_TIMEOUT, sandboxed: bool = True,
            proxy: Path = config.PROXY, log=print, cores_per_attendee: int = slices.DEFAULT_CORES_PER_ATTENDEE,
            oversubscribe: bool = False, ssl_cert: Path | None = None, ssl_key: Path | None = None,
            slurm: dict | None = None, memory: str | None = None, pids: int | None = None) -> Path:
    """Everything the hub needs in ``folder`` (see the module docstring); returns the JupyterHub config file.

    ``slurm``: the servers as Slurm jobs, ``{"partition", "memory", "time", "hub_address"}``
    (:mod:`packlab.course.hub.slurm`); None: on this machine, in slices of its cores, and
    (where the hub may make cgroups) within ``memory`` (``"6G"``) and ``pids`` processes each.
    """
    folder = Path(folder).resolve()
    if slurm is not None and (missing := [tool for tool in SLURM_TOOLS if shutil.which(tool) is None]):
        raise SystemExit(f"error: {', '.join(missing)} not found: --spawner slurm runs the hub where jobs are "
                         "submitted (a login node with Slurm's commands)")
    people = accounts.read_people(class_list)
    if not Path(proxy).exists():
        raise SystemExit(f"error: no configurable-http-proxy at {proxy}: `make hub` installs it from npm into .tools/chp/")
    if (ssl_cert is None) != (ssl_key is None):
        raise SystemExit("error: HTTPS needs both --ssl-cert and --ssl-key (the certificate and its private key)")
    for tls_file in (ssl_cert, ssl_key):
        if tls_file is not None and not Path(tls_file).is_file():
            raise SystemExit(f"error: no file at {tls_file} (--ssl-cert/--ssl-key)")
    if why := needs_root(url, sandboxed):
        raise SystemExit(f"error: {why}")
    if sandboxed and (why := sandbox.why_unavailable()):
        raise SystemExit(f"error: {why}. Without a sandbox every attendee's code runs as you, with your files: "
                         "if that is what you want, pass --no-sandbox (HUB_ARGS=--no-sandbox)")
    folder.mkdir(parents=True, exist_ok=True)
    if Path(class_list).resolve() != (folder / "class.txt"):
        shutil.copyfile(class_list, folder / "class.txt")
    plain, _ = accounts.ensure_accounts(people, folder)
    if slurm is not None:
        log(f"each server is a Slurm job: --cpus-per-task={cores_per_attendee} (PACKLAB_CORES), "
            f"--mem={slurm['memory'] or '(the partition default)'}, partition {slurm['partition'] or '(the default)'}; "
            "Slurm decides where and how many run at once, and holds a job to its cores and memory only where "
            "its configuration confines jobs (task/cgroup); the servers reach the hub's API at "
            f"{slurm['hub_address']}")
    else:
        cores = slices.hub_cores()
        at_once = slices.capacity(len(cores), cores_per_attendee)
        log(f"each server runs on {min(cores_per_attendee, len(cores))} cores of its own (CPU affinity and "
            f"PACKLAB_CORES): room for {at_once} servers at once on this hub's {len(cores)} cores, for {len(people)} "
            "people on the list")
        if oversubscribe:
            log("--oversubscribe: past that, servers share the slices round-robin, and their timings measure each other")
        elif len(people) > at_once:
            log(f"warning: past {at_once} servers the hub refuses to start more (the attendee's page says so); "
                "--oversubscribe (HUB_ARGS) shares the slices instead, or --cores-per-attendee 1 halves them")
        try:
            if not (memory or pids):
                raise slices.CgroupUnavailable("none asked for")
            slices.own_cgroup("memory"), slices.own_cgroup("pids")
        except slices.CgroupUnavailable as exc:
            memory = pids = None
            log(f"memory: no limit per attendee ({exc}); each process has the sandbox's address-space cap of "
                f"{sandbox.DEFAULT_MEMORY_BYTES / 1024**3:.0f} GiB (prlimit --as)")
        else:
            log(f"memory: {memory} per attendee, all of a server's processes together, and at most {pids} processes "
                "and threads (cgroups of their own; past the memory limit the kernel's OOM killer ends a notebook "
                "kernel before JupyterLab)")
    if listens_beyond_loopback(url) and ssl_cert is None:
        log(f"warning: {url} is reachable from other machines over plain HTTP, passwords included: put the hub "
            "behind a TLS proxy (nginx, Caddy, the centre's), or give it --ssl-cert and --ssl-key")
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
        "cores_per_attendee": cores_per_attendee,
        "oversubscribe": oversubscribe,
        "memory_per_attendee": memory if slurm is None else None,
        "pids_per_attendee": pids if slurm is None else None,
        "ssl_cert": str(Path(ssl_cert).resolve()) if ssl_cert else None,
        "ssl_key": str(Path(ssl_key).resolve()) if ssl_key else None,
        "idle_timeout": idle_timeout,
        "sandboxed": sandboxed,
        "proxy": str(Path(proxy).resolve()),
        "hub_port": config.free_port(),
        "proxy_api_port": config.free_port(),
        "board_port": config.free_port(),
    }
    if slurm is not None:
        settings.update(spawner="slurm", slurm=slurm)
    config_file = config.write(folder, settings)
    (folder / SERVICE).write_text(unit_file(folder, hub_command(config_file), shutil.which("node")))
    return config_file


def hub_command(config_file: Path) -> list[str]:
    """JupyterHub on the hub's configuration: what ``make hub`` runs in the foreground, and the service runs."""
    return [sys.executable, "-m", "jupyterhub", "-f", str(config_file)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.hub", description=__doc__.split("\n\n")[0])
    parser.add_argument("--class-list", type=Path, required=True, help="one name a line; 'NAME instructor' for instructors")
    parser.add_argument("--dir", type=Path, default=paths.repo_root() / "hub", help="the hub's folder (default hub/)")
    parser.add_argument("--url", default=DEFAULT_URL, help=f"where the hub listens (default {DEFAULT_URL}; "
                        "http://0.0.0.0:8000 for a room, behind TLS)")
    parser.add_argument("--release", type=Path, default=None, help="the release repository attendees clone (default: made in DIR/release)")
    parser.add_argument("--count", type=int, default=DEFAULT_COUNT, help=f"the dataset's size (default {DEFAULT_COUNT}; 0: the full 10,000)")
    parser.add_argument("--cores-per-attendee", type=int, default=slices.DEFAULT_CORES_PER_ATTENDEE,
                        help="the cores of each attendee's server, its own by CPU affinity (default "
                        f"{slices.DEFAULT_CORES_PER_ATTENDEE}); the hub runs at most cores // this many servers at once")
    parser.add_argument("--oversubscribe", action="store_true", help="start more servers than the slices, sharing them "
                        "(their timings then measure each other)")
    parser.add_argument("--ssl-cert", type=Path, default=None, help="HTTPS: the certificate (with --ssl-key)")
    parser.add_argument("--ssl-key", type=Path, default=None, help="HTTPS: the certificate's private key")
    parser.add_argument("--idle-timeout", type=int, default=IDLE_TIMEOUT,
                        help=f"seconds before an unused server is stopped (default {IDLE_TIMEOUT}: 2.5 hours)")
    parser.add_argument("--no-sandbox", action="store_true", help="run the attendees' servers without bubblewrap (no wall between them)")
    parser.add_argument("--prepare-only", action="store_true", help="prepare the folder and stop")
    cluster = parser.add_argument_group("on a cluster (--spawner slurm)")
    cluster.add_argument("--spawner", choices=("local", "slurm"), default="local",
                         help="local: the servers run on this machine, in slices of its cores (default); slurm: each "
                         "server is a Slurm job with --cpus-per-task=CORES_PER_ATTENDEE and --mem=MEM_PER_ATTENDEE")
    cluster.add_argument("--slurm-partition", default="", help="the partition of the servers' jobs (default: the "
                         "cluster's default partition)")
    parser.add_argument("--mem-per-attendee", default=DEFAULT_MEMORY_PER_ATTENDEE, help="each attendee's server "
                        "with everything it starts: a cgroup of its own on this machine (where the hub may make one), "
                        f"sbatch --mem on a cluster (default {DEFAULT_MEMORY_PER_ATTENDEE}: a chapter's kernel with its "
                        "workers peaked at up to 4.1 GB in chapter 9, setup.md, and JupyterLab runs beside it)")
    parser.add_argument("--pids-per-attendee", type=int, default=DEFAULT_PIDS_PER_ATTENDEE, help="the most processes "
                        f"and threads of one server at once, on this machine (default {DEFAULT_PIDS_PER_ATTENDEE}: "
                        "a DataLoader of 64 workers fits, a fork bomb does not)")
    cluster.add_argument("--slurm-time", default="", help="sbatch --time of each server's job, e.g. 8:00:00 (default: "
                         "the partition's limit); a job past it is ended, files kept")
    cluster.add_argument("--hub-address", default=None, help="the name or address of this machine that the compute "
                         "nodes reach, for the servers to call the hub's API (default: its host name)")
    args = parser.parse_args(argv)
    slurm = None
    if args.spawner == "slurm":
        slurm = {"partition": args.slurm_partition, "memory": args.mem_per_attendee, "time": args.slurm_time,
                 "hub_address": args.hub_address or socket.gethostname()}
        if not listens_beyond_loopback(args.url):
            print(f"warning: {args.url} listens on this machine only; the attendees' browsers reach the hub (and, "
                  "through its proxy, their servers on the compute nodes) only at an address such as "
                  "http://0.0.0.0:8000", file=sys.stderr)
    try:
        config_file = prepare(args.class_list, args.dir, args.url, args.release, args.count or None, args.idle_timeout,
                              not args.no_sandbox, cores_per_attendee=args.cores_per_attendee,
                              oversubscribe=args.oversubscribe, ssl_cert=args.ssl_cert, ssl_key=args.ssl_key,
                              slurm=slurm, memory=args.mem_per_attendee, pids=args.pids_per_attendee)
    except accounts.ClassListError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    base = ("https://" + args.url.partition("://")[2]) if args.ssl_cert else args.url
    print(f"hub prepared in {config_file.parent}; the board for instructors: {base}/services/board/", flush=True)
    command = hub_command(config_file)
    print(how_to_run(config_file.parent, command), flush=True)
    if args.prepare_only:
        return 0
    os.chdir(config_file.parent)
    os.execv(command[0], command)  # JupyterHub takes over: Ctrl+C stops it, and the attendees' servers with it
    return 0

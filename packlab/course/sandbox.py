"""A sandbox for code the course did not write: attendees' notebooks, their JupyterLab on a hub.

The gradebook runs every attendee's notebook, and a hub runs every attendee's JupyterLab,
on the instructor's machine and as the instructor's user. Without a wall, a notebook
could read the instructor's files, overwrite the course or another attendee's work, or
reach the network while it is graded. The wall is bubblewrap (``bwrap``, Debian's
``bubblewrap``, installed by ``make system-deps``): an unprivileged tool that starts a
command in new Linux namespaces, with a file system assembled from bind mounts.

What a process in :func:`command`'s sandbox sees:

* **A file system of a few folders.** The operating system's programs and libraries
  (``/usr`` and its ``/bin``, ``/lib`` links), a short list of ``/etc`` files
  (:data:`ETC_FILES`: no ``shadow``, no keys), the Python that runs the course and its
  packages, and the folders the caller names: read-only ones (the course, the dataset)
  and writable ones (the notebook's own folder). Nothing else exists in there: not the
  home folder, not the other attendees' work, not the instructor's files. A folder can
  also be hidden under an empty one (a class folder inside the course).
* **Read-only means read-only.** The binds are made in a user namespace of the
  sandbox's own, so the process cannot remount them writable, whatever its user id.
* **No network** (``network=False``): a network namespace of its own with only a
  loopback interface, so a kernel and its client still talk, and nothing leaves the
  machine. A hub's JupyterLab keeps the machine's network (``network=True``): the hub
  reaches it through its proxy.
* **Its own processes**: a PID namespace; when the sandbox's first process ends, or its
  parent dies (``--die-with-parent``), every process in it is killed, DataLoader workers
  included. Its own ``/tmp`` (empty, in memory) and a new session (no terminal to type into).
* **A memory limit**: the address space of each of its processes
  (``prlimit --as``, :data:`DEFAULT_MEMORY_BYTES`). The time limit is the caller's: it
  kills the sandbox (:func:`run`).

bwrap works only on Linux; :func:`why_unavailable` says why it cannot run here, and the
callers refuse to run untrusted code without it unless told to (``--no-sandbox``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packlab import paths

#: The address space one process in the sandbox may use. A process that imports torch
#: and runs a DataLoader with workers peaks near 3.5 GB of address space (most of it
#: reserved, not used); this leaves room for that and stops a runaway allocation.
DEFAULT_MEMORY_BYTES = 8 * 1024**3
#: Files and folders of /etc the sandbox gets: what Python, git and a shell read; no secrets.
ETC_FILES = (
    "passwd", "group", "nsswitch.conf", "hosts", "host.conf", "hostname", "localtime", "timezone",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl", "ca-certificates", "mime.types",
    "os-release", "debian_version", "gitconfig", "bash.bashrc", "profile", "inputrc", "fonts", "magic",
)
#: Top-level links or folders of a Debian system (links to usr/ on a merged-/usr system).
SYSTEM_ROOTS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass
class Sandbox:
    """What one sandbox holds: folders to read, folders to write, folders to hide, its network.

    ``readable`` and ``writable`` are bound at their own paths; ``mounts`` binds
    ``(source, target)`` pairs read-only at another path (applied after the others, so a
    target may lie inside a writable folder); ``hidden`` folders are covered by empty ones.
    ``cwd`` is where the command starts; ``env`` is added to the environment.
    """

    readable: list[Path] = field(default_factory=list)
    writable: list[Path] = field(default_factory=list)
    mounts: list[tuple[Path, Path]] = field(default_factory=list)
    hidden: list[Path] = field(default_factory=list)
    network: bool = False
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    memory_bytes: int | None = DEFAULT_MEMORY_BYTES
    #: Whether the course this code runs from is readable (the gradebook's sandbox needs it;
    #: a hub attendee's has a copy of their own, and must not see the instructor's checkout).
    share_course: bool = True


def bwrap() -> str | None:
    """The bwrap executable, or None."""
    return shutil.which("bwrap")


def why_unavailable() -> str | None:
    """Why no sandbox can be made here (no bwrap, not Linux, namespaces refused), or None when one can."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (bubblewrap); this is {sys.platform}"
    found = bwrap()
    if found is None:
        return "bubblewrap (bwrap) is not installed: `make system-deps` installs it (Debian's bubblewrap)"
    probe = subprocess.run([found, "--unshare-all", "--ro-bind", "/", "/", "true"], capture_output=True, text=True,
                           timeout=30)
    if probe.returncode != 0:
        return f"bwrap cannot create namespaces here ({probe.stderr.strip()[:200]}): user namespaces may be switched off"
    return None


def python_paths(share_course: bool = True) -> list[Path]:
    """What the course's Python needs to run: its installation, its environment, every folder on sys.path.

    Without ``share_course``, the checkout this code runs from (and whatever lies in it,
    but the environment) is left out.
    """
    environment = [Path(sys.prefix), Path(sys.base_prefix), Path(os.path.realpath(sys.executable)).parent.parent]
    # `python -m` puts the working directory first on sys.path: for the class hub that is the hub's own
    # folder (its passwords, every attendee's home), which no sandbox may see. Code is never imported from it.
    here = os.path.realpath(os.getcwd())
    found = [Path(p) for p in sys.path if p and Path(p).is_dir() and os.path.realpath(p) != here]
    if share_course:
        return _outermost([*environment, paths.repo_root(), *found])
    course = Path(os.path.realpath(paths.repo_root()))
    found = [p for p in found if not (Path(os.path.realpath(p)) == course or course in Path(os.path.realpath(p)).parents)]
    return _outermost([*environment, *found])


def _outermost(folders: list[Path]) -> list[Path]:
    """The folders without those inside another one of them (one bind covers both)."""
    resolved = sorted({Path(os.path.realpath(f)) for f in folders if Path(f).exists()}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for folder in resolved:
        if not any(folder == k or k in folder.parents for k in kept):
            kept.append(folder)
    return kept


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_ROOTS:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for name in ETC_FILES:
        path = Path("/etc") / name
        if path.exists():
            args += ["--ro-bind", str(path), str(path)]
    return args


def command(box: Sandbox, argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` in ``box`` (``prlimit`` for the memory, then ``bwrap``)."""
    found = bwrap()
    if found is None:
        raise RuntimeError(why_unavailable() or "no bwrap")
    args = [found, "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    if not box.network:
        args.append("--unshare-net")
    args += _system_args()
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm"]
    writable = _outermost(box.writable)
    for folder in _outermost([*python_paths(box.share_course), *box.readable]):
        args += ["--ro-bind", str(folder), str(folder)]
    for folder in writable:
        args += ["--bind", str(folder), str(folder)]
    for source, target in box.mounts:
        args += ["--ro-bind", str(os.path.realpath(source)), str(target)]
    for folder in box.hidden:
        args += ["--tmpfs", str(os.path.realpath(folder))]
    for name, value in box.env.items():
        args += ["--setenv", name, value]
    if box.cwd is not None:
        args += ["--chdir", str(box.cwd)]
    limit = []
    if box.memory_bytes and shutil.which("prlimit"):
        limit = [shutil.which("prlimit"), f"--as={int(box.memory_bytes)}", "--"]
    return [*limit, *args, "--", *argv]


def run(box: Sandbox, argv: list[str], timeout: float, **popen) -> subprocess.CompletedProcess:
    """Run ``argv`` in ``box``; past ``timeout`` seconds the sandbox and all in it are killed.

    Returns the completed process with ``returncode`` -9 (SIGKILL) after a timeout;
    ``popen`` goes to :class:`subprocess.Popen` (``stdout=``, ``stderr=``, ``text=``).
    """
    cmd = command(box, argv)
    process = subprocess.Popen(cmd, start_new_session=True, **popen)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with_group_killed(process)
        out, err = process.communicate()
    return subprocess.CompletedProcess(cmd, process.returncode, out, err)


def with_group_killed(process: subprocess.Popen) -> None:
    """Kill a sandbox started in a session of its own: bwrap, and with it every process inside."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()

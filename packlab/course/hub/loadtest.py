"""The class hub under load: simulated attendees log in, start their servers and run the course's cells.

::

    python -m packlab.course.hub.loadtest --attendees N [--cores-per-attendee C] [--oversubscribe]
                                          [--noisy] [--mem-per-attendee 4G] [--pids-per-attendee 1024]
                                          --out DIR

A real hub is prepared and started the way ``make hub`` does it (:mod:`packlab.course.hub.cli`),
in a temporary folder, on a release of this working tree and a small dataset (2,000 images).
Then, with nothing but HTTP (JupyterHub's REST API and each Jupyter server's kernel API and
websocket; no browser, no nbval), each simulated attendee, in a thread of their own and all
at once:

* logs in with their password through the hub's login form, asks for a token of their own and
  starts their server (the time from the request to a ready server is their *start time*);
* starts a kernel and runs, cell by cell, a probe of what the server sees (its CPU affinity,
  ``PACKLAB_CORES``, its cgroups), chapter 1's cells from the first up to its first comparison
  and the verdict that follows it (:func:`chapter1_cells`), then exercise 3's solved class and
  its ``check()`` (:func:`exercise3_cells`), the way an attendee's notebook runs them.

Recorded per attendee: start time, each cell's wall time and status, the verdict sentences
chapter 1 printed and exercise 3's check's summary, the peak memory of the server's processes
(sampled RSS of its process tree, and the cgroup's own peak where the server has one), the
server's CPU affinity (``Cpus_allowed_list`` of its process), and every error or timeout by
name. Then every attendee's check record is looked for on the board (its ``data.json``, read
as the instructor through the hub). ``report.json`` and ``report.md`` go into ``--out``.

``--noisy`` (needs 2 slices: ``--cores-per-attendee 1`` on a 2-core machine) is the noisy
neighbour run: one quiet attendee gets a slice of their own and three noisy attendees share
the other (placed by the order of starts, with two placeholder servers that are stopped
again, since the allocator shares the slice with the fewest servers). The quiet attendee
runs the cells four times (:data:`PASSES`), in a fresh kernel each time: with the noisy
attendees' servers and kernels idle, and while one runs a fork bomb, one a memory hog and
one a DataLoader with 64 workers (:data:`NOISE`, each bounded in count and time). The
report gives the quiet attendee's cell times with the noise over those without, and whether
every server lived.

Everything waits with a timeout, and the hub and every server it started are stopped at
the end whatever happened.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packlab import paths
from packlab.course import release, sandbox
from packlab.course.hub import cli, config, slices

COUNT = 2000  # images in the hub's dataset: the small-data mode a hub runs
HUB_TIMEOUT = 120  # seconds for JupyterHub to answer after it was started
SERVER_TIMEOUT = 420  # seconds from asking for a server to its being ready (many start at once on few cores)
CELL_TIMEOUT = 900  # seconds for one cell; oversubscribed, chapter 1's comparison shares a core with others
BOARD_WITHIN = 60  # seconds from the last check to every record on the board
SAMPLE_EVERY = 1.0  # seconds between two samples of the servers' memory
STOP_TIMEOUT = 60  # seconds for the hub to stop its servers and itself after SIGTERM
DEFAULT_MEMORY = "4G"  # each server's memory limit in these runs: a chapter 1 kernel with 2 workers stays well under
DEFAULT_PIDS = 1024  # each server's processes and threads: room for 64 DataLoader workers, not for a fork bomb
NOISE_SECONDS_MAX = 900  # the longest a noisy cell may run, whatever the quiet pass takes
IDLE_RECONNECT = 20  # seconds a kernel's websocket may sit unread before the next cell opens a new one
NOISE_HEAD_START = 10  # seconds the noise runs before the quiet attendee's cells start
#: The quiet attendee's passes over the cells, without and with the noise, in a balanced order (A B B A), so that a
#: drift in the machine's load (other work on it) weighs on both kinds alike.
PASSES = ("quiet-1", "noisy-1", "noisy-2", "quiet-2")
#: The last cell of chapter 1 that runs: the one that turns its first comparison into a verdict.
CHAPTER1_LAST = "workers_verdict=ch01.workers_verdict"
#: Printed after chapter 1's cells: the figures the prose cites for the first measurement and its verdict.
CHAPTER1_REPORT = ('print(f"VERDICT epoch of 1,000 images with 2 workers: {epoch_2w} s, {ips_2w} images/s")\n'
                   'print(f"VERDICT num_workers=0 {ips_0w} images/s, num_workers=2 {ips_2w_slice}: "\n'
                   '      f"{speedup_2w} times; {workers_verdict}. {two_workers_cores}")\n'
                   'print(f"VERDICT load average {load_1min} on {cores} cores")')
PROBE = ('import os\n'
         'cgroups = [line for line in open("/proc/self/cgroup").read().splitlines() if ":memory:" in line or ":pids:" in line]\n'
         'print("PROBE", sorted(os.sched_getaffinity(0)), os.environ.get("PACKLAB_CORES"), cgroups)')


# ------------------------------------------------------------------ the cells


def _code_cells(path: Path) -> list[str]:
    import jupytext

    return [cell.source for cell in jupytext.read(path).cells if cell.cell_type == "code"]


def chapter1_cells(course: Path | None = None) -> list[str]:
    """Chapter 1's code cells from its first to the one that says its first comparison's verdict, then their figures.

    ``course``: the attendees' release (what their notebooks hold); default this checkout.
    """
    sources = _code_cells((course or paths.repo_root()) / "chapters" / "01_jpeg_files.md")
    last = next(i for i, source in enumerate(sources) if CHAPTER1_LAST in source)
    return [*sources[:last + 1], CHAPTER1_REPORT]


def execute_request(code: str, username: str, session: str) -> tuple[str, str]:
    """``(msg_id, message)``: the Jupyter messaging protocol's ``execute_request`` for ``code``, as a kernel's
    websocket takes it (the replies that answer it carry ``msg_id`` as their parent's)."""
    msg_id = uuid.uuid4().hex
    return msg_id, json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": username, "session": session,
                   "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True},
    })


def take_reply(message: dict, msg_id: str, printed: list[str]) -> tuple[str | None, bool]:
    """One message from a kernel's websocket, for the execution ``msg_id``: what it printed goes onto ``printed``;
    returns the ``execute_reply``'s status (None for other messages) and whether the kernel went idle after it.
    Messages of other executions change nothing."""
    if message.get("parent_header", {}).get("msg_id") != msg_id:
        return None, False
    kind, content = message.get("msg_type"), message.get("content", {})
    if kind == "stream":
        printed.append(content["text"])
    elif kind in ("execute_result", "display_data"):
        printed.append(content["data"].get("text/plain", "") + "\n")
    elif kind == "error":
        printed.append("\n".join(content["traceback"]) + "\n")
    elif kind == "execute_reply":
        return content["status"], False
    return None, kind == "status" and content.get("execution_state") == "idle"


def exercise3_cells(root: Path | None = None) -> list[str]:
    """Exercise 3's cells an attendee runs for the check: the imports of ``check``, the solved class, the check."""
    sources = _code_cells((root or paths.repo_root()) / "solutions" / "03_per_worker_zip.md")
    return [next(s for s in sources if "from packlab.course import check" in s),
            next(s for s in sources if "class PerWorkerZipDataset" in s),
            next(s for s in sources if 'check("per_worker_zip", PerWorkerZipDataset)' in s)]


def _bounded(seconds: float, body: str) -> str:
    """A noisy cell: ``body`` repeated until ``seconds`` pass or the kernel is interrupted, then a NOISE summary."""
    return (f"import os, signal, subprocess, sys, time\nDEADLINE = time.monotonic() + {seconds:.0f}\nsummary = {{}}\n"
            f"try:\n{body}\nexcept KeyboardInterrupt:\n    summary['interrupted'] = True\n"
            "finally:\n    print('NOISE', summary, flush=True)\n")


def fork_bomb(seconds: float, children: int = 2048) -> str:
    """Forked processes that sleep until the deadline (at most a minute), at most ``children`` alive at once.

    They pile up until the server's pids limit refuses the next fork (``refused`` counts the
    refusals); without a limit, the cap of ``children`` ends it.
    """
    return _bounded(seconds, f"""\
    live, forks, refused, most = set(), 0, 0, 0
    summary.update(forks=0, refused=0, most_alive=0)
    try:
        while time.monotonic() < DEADLINE:
            for pid in list(live):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    live.discard(pid)
            if len(live) >= {children}:
                time.sleep(0.05)
                continue
            try:
                pid = os.fork()
            except OSError:  # EAGAIN: the pids limit (or the system's) said no
                refused += 1
                time.sleep(0.01)
                continue
            if pid == 0:  # the child: never runs the parent's code, whatever signal comes
                try:
                    signal.signal(signal.SIGINT, signal.SIG_IGN)
                    time.sleep(min(60.0, max(0.5, DEADLINE - time.monotonic())))
                finally:
                    os._exit(0)
            live.add(pid)
            forks += 1
            most = max(most, len(live))
            summary.update(forks=forks, refused=refused, most_alive=most)
    finally:
        for pid in live:  # at the deadline, or interrupted: the sleeping children go too, before the next pass
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass""")


def memory_hog(seconds: float, target_bytes: int) -> str:
    """Processes that each touch up to ``target_bytes`` in 256 MB steps, one after another until the deadline."""
    hog = ("import time\nblocks = []\n"
           f"while len(blocks) * 256 * 2**20 < {target_bytes}:\n"
           "    blocks.append(bytearray(256 * 2**20))  # zero-filled: every page touched\n"
           "time.sleep(1)\n")
    return _bounded(seconds, f"""\
    summary.update(runs=0, killed=0, memory_error=0, finished=0)
    while time.monotonic() < DEADLINE:
        left = max(1.0, DEADLINE - time.monotonic())
        try:
            done = subprocess.run([sys.executable, "-c", {hog!r}], capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            break
        summary['runs'] += 1
        if done.returncode == -signal.SIGKILL:
            summary['killed'] += 1  # the OOM killer of the server's memory cgroup
        elif 'MemoryError' in done.stderr:
            summary['memory_error'] += 1  # the sandbox's address-space cap
        else:
            summary['finished'] += 1""")


def busy_loader(seconds: float, workers: int = 64) -> str:
    """A DataLoader with ``workers`` workers over CPU-bound samples, epoch after epoch until the deadline."""
    return _bounded(seconds, f"""\
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Busy(Dataset):
        def __len__(self):
            return 4096

        def __getitem__(self, index):
            return sum(i * i for i in range(20000)) % 7 + index

    summary.update(epochs=0, samples=0, errors=[])
    while time.monotonic() < DEADLINE:
        try:
            for batch in DataLoader(Busy(), batch_size=16, num_workers={workers}, timeout=300):
                summary['samples'] += len(batch)
                if time.monotonic() > DEADLINE:
                    break
            summary['epochs'] += 1
        except RuntimeError as exc:
            summary['errors'].append(str(exc)[:200])""")


#: The noisy neighbours of ``--noisy``: name -> the cell they run, given its length in seconds and the memory limit.
NOISE = {
    "bomb": lambda seconds, memory: fork_bomb(seconds),
    "hog": lambda seconds, memory: memory_hog(seconds, 2 * memory),
    "loader": lambda seconds, memory: busy_loader(seconds),
}


# ------------------------------------------------------------------ records


@dataclass
class Cell:
    name: str
    seconds: float
    status: str  # ok, error, timeout, dead (the kernel died)
    tail: str = ""


@dataclass
class Attendee:
    name: str
    role: str = "attendee"  # attendee, quiet, bomb, hog, loader, placeholder
    start_seconds: float | None = None
    pid: int | None = None
    cores: list[int] | None = None
    affinity: str | None = None  # Cpus_allowed_list of the server's process
    shared_slice: bool | None = None
    cgroups: dict = field(default_factory=dict)  # the spawner's record: controller -> folder
    host_cgroups: list = field(default_factory=list)  # the server process's memory and pids lines of /proc/PID/cgroup
    cells: dict = field(default_factory=dict)  # pass name -> [Cell]
    verdicts: dict = field(default_factory=dict)  # pass name -> [sentences]
    usage: dict = field(default_factory=dict)  # pass name -> the kernel's CPU seconds and run-queue wait (kernel_usage)
    probe: str = ""
    noise: str = ""
    peak_pss_bytes: int = 0  # sampled: shared pages (forked workers, libraries) split between their processes
    peak_cgroup_bytes: int | None = None
    on_board: bool | None = None
    board_status: dict = field(default_factory=dict)
    alive_at_end: bool | None = None
    errors: list = field(default_factory=list)


class Failure(RuntimeError):
    """A named failure of one step; recorded in the attendee's errors, never raised past the run."""


# ------------------------------------------------------------------ the hub


def _wait(condition, timeout: float, what: str, poll: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise Failure(f"timeout: {what} not within {timeout:.0f} s")
        time.sleep(poll)


class Hub:
    """A hub prepared as ``make hub`` prepares it, in ``folder``; started by :meth:`start`, stopped by :meth:`stop`."""

    def __init__(self, folder: Path, names: list[str], cores_per_attendee: int, oversubscribe: bool,
                 memory: str | None, pids: int | None, committed: bool = False, log=print):
        self.folder, self.log = folder, log
        self.source = paths.repo_root()
        if committed:
            # The last commit, not the working tree: a clone reads the repository and changes nothing in it.
            self.source = folder / "committed"
            subprocess.run(["git", "clone", "-q", str(paths.repo_root()), str(self.source)], check=True, timeout=300)
        upstream = self.release = folder / "release"
        if release.release(upstream, root=self.source) is None:
            raise Failure("make release made no release of this working tree")
        class_list = folder / "class-list.txt"
        class_list.write_text("".join(f"{name}\n" for name in names) + "teacher instructor\n")
        port = config.free_port()
        self.sandboxed = sandbox.why_unavailable() is None
        self.config_file = cli.prepare(class_list, folder / "hub", url=f"http://127.0.0.1:{port}", release_repo=upstream,
                                       count=COUNT, log=lambda line: None, cores_per_attendee=cores_per_attendee,
                                       oversubscribe=oversubscribe, sandboxed=self.sandboxed)
        settings_file = self.config_file.parent / config.SETTINGS
        settings = json.loads(settings_file.read_text())
        settings.update(memory_per_attendee=memory or "", pids_per_attendee=pids or 0)
        settings_file.write_text(json.dumps(settings, indent=1) + "\n")
        self.hub_folder = self.config_file.parent
        self.passwords = dict(line.split()[:2] for line in (self.hub_folder / "passwords.txt").read_text().splitlines()
                              if not line.startswith("#"))
        self.base = f"http://127.0.0.1:{port}"
        self.log_path = self.hub_folder / "jupyterhub.log"
        self.process: subprocess.Popen | None = None
        self.server_pids: set[int] = set()

    def start(self) -> None:
        import requests

        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(cli.hub_command(self.config_file), cwd=self.hub_folder, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

        def answers() -> bool:
            if self.process.poll() is not None:
                raise Failure(f"JupyterHub exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(requests.RequestException):
                return requests.get(f"{self.base}/hub/api/", timeout=5).status_code == 200
            return False

        _wait(answers, HUB_TIMEOUT, "JupyterHub answering")
        self.admin = self.log_in("teacher")
        self.admin_token = self.token(self.admin, "teacher")

    def log_tail(self, characters: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-characters:]
        return ""

    def log_in(self, name: str):
        """A requests session logged in through the login form, as a browser does (its _xsrf cookie and field)."""
        import requests

        session = requests.Session()
        session.get(f"{self.base}/hub/login", timeout=60).raise_for_status()
        reply = session.post(f"{self.base}/hub/login", allow_redirects=False, timeout=120,
                             data={"username": name, "password": self.passwords[name],
                                   "_xsrf": session.cookies.get("_xsrf")})
        if reply.status_code != 302:
            raise Failure(f"login refused for {name}: HTTP {reply.status_code}")
        return session

    def token(self, session, name: str) -> str:
        reply = session.post(f"{self.base}/hub/api/users/{name}/tokens", json={"note": "load test"}, timeout=60,
                             headers={"X-XSRFToken": session.cookies.get("_xsrf")})
        if reply.status_code not in (200, 201):
            raise Failure(f"no token for {name}: HTTP {reply.status_code} {reply.text[:200]}")
        return reply.json()["token"]

    def api(self, method: str, path: str, token: str | None = None, **kwargs):
        import requests

        kwargs.setdefault("timeout", 60)
        return requests.request(method, f"{self.base}/hub/api{path}", **kwargs,
                                headers={"Authorization": f"token {token or self.admin_token}"})

    def server(self, name: str) -> dict:
        """The user's default server as the admin sees it (with the spawner's state: pid, slice, cgroups)."""
        return self.api("GET", f"/users/{name}").json().get("servers", {}).get("", {})

    def stop_server(self, name: str) -> None:
        with contextlib.suppress(Exception):
            self.api("DELETE", f"/users/{name}/server", timeout=120)
            _wait(lambda: not self.server(name), STOP_TIMEOUT, f"{name}'s server stopping")

    def stop(self) -> list[str]:
        """Stop the hub (it stops its servers), then anything of the servers still alive; what was left, named."""
        left = []
        if self.process is not None and self.process.poll() is None:
            for sig, wait in ((signal.SIGTERM, STOP_TIMEOUT), (signal.SIGKILL, 20)):
                if self.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.process.pid, sig)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.process.wait(timeout=wait)
        for pid in sorted(self.server_pids):
            if _is_server(pid):
                left.append(f"server process {pid} outlived the hub: killed")
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # each server was started in a session (and group) of its own
        return left


def _is_server(pid: int) -> bool:
    """Whether ``pid`` is still one of the servers this run started (not a new process that took the number)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"jupyterhub-singleuser" in command


def _affinity(pid: int) -> str | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    return None


# ------------------------------------------------------------------ one attendee


class Kernel:
    """A kernel of an attendee's server, driven over its websocket (the kernel API, as JupyterLab does)."""

    def __init__(self, hub: Hub, name: str, token: str):
        import requests

        self.hub, self.name, self.token = hub, name, token
        self.url = f"{hub.base}/user/{name}/api/kernels"
        reply = requests.post(self.url, json={"name": "python3"}, timeout=300, headers={"Authorization": f"token {token}"})
        if reply.status_code != 201:
            raise Failure(f"no kernel for {name}: HTTP {reply.status_code} {reply.text[:200]}")
        self.id = reply.json()["id"]
        self.session = uuid.uuid4().hex
        self.ws = None
        self.connect()

    def connect(self) -> None:
        """A new websocket to the kernel (its messages waited in the server's buffer meanwhile)."""
        import websocket

        with contextlib.suppress(Exception):
            if self.ws is not None:
                self.ws.close()
        self.ws = websocket.create_connection(
            f"ws://{self.hub.base.partition('://')[2]}/user/{self.name}/api/kernels/{self.id}/channels?session_id={self.session}",
            header=[f"Authorization: token {self.token}"], timeout=300)
        self.used = time.monotonic()

    def execute(self, code: str, timeout: float) -> tuple[str, str]:
        """Run ``code``; ``(status, what it printed)``: status ok, error, timeout, or dead when the kernel died."""
        if time.monotonic() - self.used > IDLE_RECONNECT:
            # websocket-client answers the server's pings only inside recv(): a socket left idle for longer than the
            # server's ping timeout was dropped by the server, while the proxy kept this end open (seen: a noisy
            # pass's cell sent into it and never answered). JupyterLab reconnects the same way.
            self.connect()
        msg_id, request = execute_request(code, self.name, self.session)
        self.ws.send(request)
        printed, status, idle = [], None, False
        deadline = time.monotonic() + timeout
        while status is None or not idle:
            left = deadline - time.monotonic()
            self.used = time.monotonic()
            if left <= 0:
                return "timeout", "".join(printed)
            self.ws.settimeout(min(left, 30))
            try:
                message = json.loads(self.ws.recv())
            except Exception as exc:  # websocket's timeout, or the connection closed under a dying kernel
                if type(exc).__name__ in ("WebSocketTimeoutException", "TimeoutError"):
                    continue
                return "dead", "".join(printed) + f"\n[websocket: {type(exc).__name__}: {exc}]"
            kind, content = message.get("msg_type"), message.get("content", {})
            if kind == "status" and content.get("execution_state") in ("restarting", "dead"):
                return "dead", "".join(printed) + f"\n[kernel {content['execution_state']}]"
            replied, done = take_reply(message, msg_id, printed)
            status, idle = replied or status, idle or done
        return status, "".join(printed)

    def interrupt(self) -> None:
        import requests

        with contextlib.suppress(Exception):
            requests.post(f"{self.url}/{self.id}/interrupt", timeout=30, headers={"Authorization": f"token {self.token}"})

    def close(self) -> None:
        import requests

        with contextlib.suppress(Exception):
            self.ws.close()
        with contextlib.suppress(Exception):
            requests.delete(f"{self.url}/{self.id}", timeout=60, headers={"Authorization": f"token {self.token}"})


def start_server(hub: Hub, person: Attendee) -> str:
    """Log ``person`` in, get their token, start their server and wait for it; returns the token."""
    started = time.monotonic()
    session = hub.log_in(person.name)
    token = hub.token(session, person.name)
    reply = hub.api("POST", f"/users/{person.name}/server", token=token, timeout=300)
    if reply.status_code not in (201, 202):
        raise Failure(f"server refused: HTTP {reply.status_code} {reply.text[:300]}")

    def ready() -> bool:
        user = hub.api("GET", f"/users/{person.name}", token=token).json()
        server = user.get("servers", {}).get("", {})
        if not (user.get("pending") or server):
            raise Failure(f"server stopped before it was ready; the hub's log:\n{hub.log_tail(1500)}")
        return bool(server.get("ready"))

    _wait(ready, SERVER_TIMEOUT, f"{person.name}'s server ready")
    person.start_seconds = round(time.monotonic() - started, 2)
    state = hub.server(person.name).get("state") or {}
    person.pid = state.get("pid")
    person.cores = state.get("slice")
    person.cgroups = state.get("cgroups") or {}
    if person.pid:
        hub.server_pids.add(person.pid)
        person.affinity = _affinity(person.pid)
        with contextlib.suppress(OSError):
            person.host_cgroups = [line for line in Path(f"/proc/{person.pid}/cgroup").read_text().splitlines()
                                   if ":memory:" in line or ":pids:" in line]
    return token


def kernel_usage(server_pid: int | None, kernel_id: str) -> dict:
    """What the kernel with ``kernel_id`` cost so far: CPU seconds and seconds spent waiting for a core.

    ``cpu_seconds``: user and system time of the kernel and of its children it has reaped
    (DataLoader workers, the check's ``spawn`` interpreters). ``runqueue_wait_seconds``: how long
    the kernel's own threads were ready to run but waited for a core (``/proc/PID/task/*/schedstat``);
    the workers' waits are not in it. More wall time with the same CPU seconds and a longer
    wait means the core was busy with other work; more CPU seconds means the same work cost
    more (caches, memory bandwidth, page reclaim shared with the neighbours).
    """
    import psutil

    with contextlib.suppress(psutil.Error, OSError, TypeError):
        for process in psutil.Process(server_pid).children(recursive=True):
            if any(f"kernel-{kernel_id}" in part for part in process.cmdline()):
                times = process.cpu_times()
                waited = sum(int(task.read_text().split()[1]) for task in Path(f"/proc/{process.pid}/task").glob("*/schedstat"))
                return {"cpu_seconds": round(times.user + times.system + times.children_user + times.children_system, 2),
                        "runqueue_wait_seconds": round(waited / 1e9, 2)}
    return {}


def run_cells(kernel: Kernel, person: Attendee, label: str) -> None:
    """The probe, chapter 1's cells and exercise 3's check, each timed; stops at the first cell that fails."""
    cells = person.cells.setdefault(label, [])
    verdicts = person.verdicts.setdefault(label, [])
    plan = [("probe", PROBE)]
    plan += [(f"ch01 cell {i + 1}", source) for i, source in enumerate(chapter1_cells(kernel.hub.release))]
    plan += [(f"ex03 cell {i + 1}", source) for i, source in enumerate(exercise3_cells(kernel.hub.source))]
    for name, source in plan:
        began = time.monotonic()
        status, printed = kernel.execute(source, CELL_TIMEOUT)
        cells.append(Cell(name, round(time.monotonic() - began, 2), status, printed[-600:] if status != "ok" else ""))
        if name == "probe":
            person.probe = printed.strip()
        verdicts += [line.removeprefix("VERDICT ") for line in printed.splitlines() if line.startswith("VERDICT ")]
        if name.startswith("ex03") and "per_worker_zip" in printed and status == "ok":
            verdicts += [line.strip() for line in printed.splitlines() if line.strip()][-6:]
        if status != "ok":
            person.errors.append(f"{label}: {name} {status}: {printed.strip().splitlines()[-1:] or ''}")
            break
    person.usage[label] = kernel_usage(person.pid, kernel.id)


def attend(hub: Hub, person: Attendee, label: str = "run") -> None:
    """One attendee of a plain run: start, then the cells; every failure recorded by name."""
    try:
        token = start_server(hub, person)
        kernel = Kernel(hub, person.name, token)
        try:
            run_cells(kernel, person, label)
        finally:
            kernel.close()
    except Exception as exc:
        person.errors.append(f"{type(exc).__name__}: {exc}")


# ------------------------------------------------------------------ memory, board, report


class MemorySampler(threading.Thread):
    """Samples each server's process tree every :data:`SAMPLE_EVERY` seconds; keeps the peak of its summed PSS.

    PSS, not RSS: a DataLoader's forked workers share most of their pages with the kernel,
    and RSS would count those once per worker.
    """

    def __init__(self, people: list[Attendee]):
        super().__init__(daemon=True)
        self.people, self.done = people, threading.Event()

    def run(self) -> None:
        import psutil

        while not self.done.wait(SAMPLE_EVERY):
            for person in self.people:
                if not person.pid:
                    continue
                with contextlib.suppress(psutil.Error):
                    root = psutil.Process(person.pid)
                    total = 0
                    for process in [root, *root.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            total += process.memory_full_info().pss
                    person.peak_pss_bytes = max(person.peak_pss_bytes, total)


def cgroup_peaks(people: list[Attendee]) -> None:
    for person in people:
        folder = person.cgroups.get("memory")
        with contextlib.suppress(OSError, TypeError):
            person.peak_cgroup_bytes = int((Path(folder) / "memory.max_usage_in_bytes").read_text())


def check_board(hub: Hub, people: list[Attendee]) -> None:
    """Each attendee's exercise 3 record on the board (``data.json``, read as the instructor through the hub)."""
    expected = {p.name for p in people if any(c.name.startswith("ex03") for cells in p.cells.values() for c in cells)}

    def seen() -> dict | None:
        reply = hub.admin.get(f"{hub.base}/services/board/data.json", timeout=60)
        if reply.status_code != 200 or not reply.headers.get("content-type", "").startswith("application/json"):
            return None
        rows = [row for row in reply.json()["parts"] if row["check"] == "per_worker_zip"]
        found = {}
        for row in rows:
            for status in ("passed", "failed"):
                for name in row[status]:
                    found.setdefault(name, {})[row["part"]] = status
        return found if rows and expected <= set(found) else None

    try:
        found = _wait(seen, BOARD_WITHIN, "every check record on the board", poll=2)
    except Failure:
        found = seen() or {}
    for person in people:
        if person.name in expected:
            person.board_status = found.get(person.name, {})
            person.on_board = bool(person.board_status)
            if not person.on_board:
                person.errors.append("the check's record did not reach the board")


def _percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile (p95 of 6 values is the largest)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(-(-share * len(ordered) // 1)) - 1))]


def disjoint(people: list[Attendee]) -> bool:
    cores = [set(p.cores or []) for p in people if p.cores]
    return all(not (a & b) for i, a in enumerate(cores) for b in cores[i + 1:])


def summary(people: list[Attendee], label: str) -> dict:
    starts = [p.start_seconds for p in people if p.start_seconds is not None]
    totals = {p.name: round(sum(c.seconds for c in p.cells.get(label, [])), 2) for p in people}
    return {"p95_start_seconds": _percentile(starts, 0.95), "median_start_seconds": statistics.median(starts) if starts else None,
            "cells_total_seconds": totals, "errors": sum(len(p.errors) for p in people),
            "every_record_on_board": all(p.on_board for p in people if p.on_board is not None),
            "affinities_disjoint": disjoint(people),
            "kernel_usage": {p.name: p.usage.get(label) for p in people},
            # chapter 1's first comparison (2 workers against 0) as each attendee's notebook said it
            "chapter1_verdicts": {p.name: next((v for v in p.verdicts.get(label, []) if " times; " in v), None)
                                  for p in people}}


# ------------------------------------------------------------------ the runs


def plain_run(hub: Hub, people: list[Attendee]) -> dict:
    """Every attendee at once: start, cells, check; then the board."""
    threads = [threading.Thread(target=attend, args=(hub, person), daemon=True) for person in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(SERVER_TIMEOUT + 40 * CELL_TIMEOUT)
    check_board(hub, people)
    return summary(people, "run")


def noisy_run(hub: Hub, quiet: Attendee, noisy: list[Attendee], placeholders: list[Attendee], memory_bytes: int,
              log=print) -> dict:
    """Quiet alone on one slice, the noisy three on the other; the quiet cells without and with the noise (:data:`PASSES`)."""
    # The allocator gives the slice with the fewest servers; a placeholder on the quiet slice before each noisy
    # attendee keeps the counts even, so each noisy one lands on the other slice; the placeholders leave at the end.
    order = [quiet]
    for loud, placeholder in zip(noisy, [*placeholders, None]):
        order += [loud] + ([placeholder] if placeholder else [])
    tokens = {}
    for person in order:
        log(f"starting {person.name} ({person.role})")
        tokens[person.name] = start_server(hub, person)
    for placeholder in placeholders:
        hub.stop_server(placeholder.name)
    placement = json.loads((hub.hub_folder / slices.SLICES_FILE).read_text())["servers"]
    quiet_cores = set(placement[quiet.name]["cores"])
    if any(set(placement[p.name]["cores"]) & quiet_cores for p in noisy):
        raise Failure(f"placement failed: the quiet attendee shares cores with a noisy one: {placement}")

    kernels = {p.name: Kernel(hub, p.name, tokens[p.name]) for p in [quiet, *noisy]}
    noise_seconds = NOISE_SECONDS_MAX
    try:
        for label in PASSES:
            # A fresh kernel for every pass: chapter 1's imports and the page cache's state start alike in each.
            kernels[quiet.name].close()
            kernels[quiet.name] = Kernel(hub, quiet.name, tokens[quiet.name])
            if label.startswith("quiet"):
                log(f"pass {label}: the noisy attendees idle")
                began = time.monotonic()
                run_cells(kernels[quiet.name], quiet, label)
                # The noise outlasts a noisy pass twice as long as this quiet one; it is interrupted when the pass ends.
                noise_seconds = min(NOISE_SECONDS_MAX, 2 * (time.monotonic() - began) + 60)
                continue
            log(f"pass {label}: the noisy attendees at work")
            threads = [threading.Thread(target=make_noise, args=(kernels[p.name], p, label, noise_seconds, memory_bytes),
                                        daemon=True) for p in noisy]
            for thread in threads:
                thread.start()
            time.sleep(NOISE_HEAD_START)
            run_cells(kernels[quiet.name], quiet, label)
            for person in noisy:
                kernels[person.name].interrupt()
            for thread in threads:
                thread.join(noise_seconds + 180)
    finally:
        for kernel in kernels.values():
            kernel.close()
    for person in [quiet, *noisy]:
        server = hub.server(person.name)
        person.alive_at_end = bool(server.get("ready")) and _is_server(person.pid or -1)
        if not person.alive_at_end:
            person.errors.append("the server did not survive the noisy passes")
    check_board(hub, [quiet])
    times = {label: {c.name: c.seconds for c in quiet.cells.get(label, [])} for label in PASSES}
    quiet_cells = {name: sum(times[l].get(name, 0) for l in PASSES if l.startswith("quiet")) for name in times[PASSES[0]]}
    noisy_cells = {name: sum(times[l].get(name, 0) for l in PASSES if l.startswith("noisy")) for name in times[PASSES[0]]}
    complete = all(len(times[label]) == len(times[PASSES[0]]) for label in PASSES)
    ratios = {name: round(noisy_cells[name] / quiet_cells[name], 2)
              for name in quiet_cells if quiet_cells[name] >= 2.0 and noisy_cells.get(name)}
    total_quiet, total_noisy = sum(quiet_cells.values()), sum(noisy_cells.values())
    return {"placement": placement, "passes": list(PASSES), "every_pass_complete": complete,
            "noise_seconds_at_most": round(noise_seconds),
            "ratios_noisy_to_quiet_of_cells_of_1s_or_more": ratios,
            "total_ratio": round(total_noisy / total_quiet, 2) if total_quiet and complete else None,
            "within_1_25": bool(complete and total_quiet and total_noisy / total_quiet <= 1.25),
            "quiet_total_seconds": round(total_quiet, 1), "noisy_total_seconds": round(total_noisy, 1),
            "pass_totals_seconds": {label: round(sum(t.values()), 1) for label, t in times.items()},
            "quiet_kernel_usage": {label: quiet.usage.get(label) for label in PASSES},
            "every_server_alive": all(p.alive_at_end for p in [quiet, *noisy]),
            "errors": sum(len(p.errors) for p in [quiet, *noisy])}


def make_noise(kernel: Kernel, person: Attendee, label: str, seconds: float, memory_bytes: int) -> None:
    """One noisy attendee's cell for one pass; what it printed (its NOISE summary) goes into their record."""
    status, printed = kernel.execute(NOISE[person.role](seconds, memory_bytes), seconds + 120)
    said = " ".join(line for line in printed.splitlines() if line.startswith("NOISE"))
    person.noise += f"{label}: {status} {said}" + ("" if status == "ok" else f" {printed.strip()[-300:]}") + "; "


def run(attendees: int, out: Path, cores_per_attendee: int = slices.DEFAULT_CORES_PER_ATTENDEE,
        oversubscribe: bool = False, noisy: bool = False, memory: str | None = DEFAULT_MEMORY,
        pids: int | None = DEFAULT_PIDS, keep: Path | None = None, committed: bool = False, log=print) -> dict:
    """One load test; writes ``report.json`` and ``report.md`` into ``out`` and returns the report."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if noisy:
        people = [Attendee("quiet1", "quiet")] + [Attendee(f"noisy-{role}", role) for role in NOISE]
        placeholders = [Attendee(f"placeholder{i}", "placeholder") for i in (1, 2)]
        oversubscribe = True  # five servers at most at once on two slices
    else:
        people = [Attendee(f"attendee{i:02d}") for i in range(1, attendees + 1)]
        placeholders = []
    memory_bytes = slices.parse_size(memory) if memory else 0
    report = {"command": sys.argv, "attendees": len(people), "cores_per_attendee": cores_per_attendee,
              "oversubscribe": oversubscribe, "noisy": noisy, "memory_per_attendee": memory, "pids_per_attendee": pids,
              "machine_cores": len(slices.hub_cores()), "load_average_before": os.getloadavg(), "count": COUNT,
              "released": "the last commit" if committed else "the working tree"}
    temporary = tempfile.mkdtemp(prefix="packlab-loadtest-", dir=keep)
    hub = None
    began = time.monotonic()
    sampler = MemorySampler(people)
    try:
        hub = Hub(Path(temporary), [p.name for p in people + placeholders], cores_per_attendee, oversubscribe,
                  memory, pids, committed=committed, log=log)
        report["sandboxed"] = hub.sandboxed
        log(f"hub prepared in {hub.hub_folder}; starting it")
        hub.start()
        sampler.start()
        if noisy:
            report["noisy_run"] = noisy_run(hub, people[0], people[1:], placeholders, memory_bytes, log=log)
        else:
            report["run"] = plain_run(hub, people)
    except (Exception, KeyboardInterrupt) as exc:  # interrupted too: the hub is stopped and the report written
        report["failure"] = f"{type(exc).__name__}: {exc}"
        report["failure_traceback"] = traceback.format_exc()[-3000:]
    finally:
        sampler.done.set()
        cgroup_peaks(people)
        if hub is not None:
            report["left_running"] = hub.stop()
            report["hub_log_tail"] = hub.log_tail(3000)
        if keep is None:
            subprocess.run(["rm", "-rf", temporary], check=False, timeout=300)
    report["load_average_after"] = os.getloadavg()
    report["wall_seconds"] = round(time.monotonic() - began, 1)
    report["people"] = [asdict(p) for p in people]
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "report.md").write_text(markdown(report))
    return report


def _mb(value) -> str:
    return f"{value / 1e6:.0f}" if value else "-"


def markdown(report: dict) -> str:
    """The report as a page: what ran, then per attendee, then what it came to."""
    people = report["people"]
    lines = [f"# Hub load test: {report['attendees']} attendees, {report['cores_per_attendee']} core(s) each"
             f"{', oversubscribed' if report['oversubscribe'] else ''}{', noisy neighbours' if report['noisy'] else ''}",
             "",
             f"Command: `{' '.join(report['command'])}`. Machine: {report['machine_cores']} cores; load average "
             f"{report['load_average_before'][0]:.1f} before, {report['load_average_after'][0]:.1f} after (others' work "
             f"included). Dataset: {report['count']} images. Limits per server: memory {report['memory_per_attendee'] or 'none'}, "
             f"processes and threads {report['pids_per_attendee'] or 'none'}; sandboxed: {report.get('sandboxed')}. "
             f"Wall time {report['wall_seconds']} s.", ""]
    if report.get("failure"):
        lines += [f"**The run failed**: {report['failure']}", ""]
    for key in ("run", "noisy_run"):
        if key in report:
            lines += ["```json", json.dumps(report[key], indent=1), "```", ""]
    lines += ["| attendee | role | start s | slice (affinity) | cells s (pass: total) | peak PSS MB | cgroup peak MB | "
              "on board | errors |", "|---|---|---|---|---|---|---|---|---|"]
    # The cgroup counts the page cache the server's reads filled too (the dataset's JPEGs), which PSS does not.
    for p in people:
        totals = "; ".join(f"{label}: {sum(c['seconds'] for c in cells):.1f}" for label, cells in p["cells"].items())
        lines.append(f"| {p['name']} | {p['role']} | {p['start_seconds']} | {p['cores']} ({p['affinity']}) | {totals} | "
                     f"{_mb(p['peak_pss_bytes'])} | {_mb(p['peak_cgroup_bytes'])} | {p['on_board']} | "
                     f"{'; '.join(p['errors']) or 0} |")
    lines += ["", "## Cells and verdicts", ""]
    for p in people:
        for label, cells in p["cells"].items():
            lines.append(f"- **{p['name']}**, {label}: " + ", ".join(f"{c['name']} {c['seconds']} s"
                                                                       + ("" if c["status"] == "ok" else f" ({c['status']})")
                                                                       for c in cells))
            for verdict in p["verdicts"].get(label, []):
                lines.append(f"  - {verdict}")
        if p["probe"]:
            lines.append(f"  - probe in the kernel (affinity, PACKLAB_CORES, cgroups as its namespace shows them): "
                         f"`{p['probe']}`; the server's process seen from the host: `{p['host_cgroups']}`")
        if p["noise"]:
            lines.append(f"  - noise: `{p['noise']}`")
    if report.get("left_running"):
        lines += ["", "Left running after the hub stopped: " + "; ".join(report["left_running"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.course.hub.loadtest", description=__doc__.split("\n\n")[0])
    parser.add_argument("--attendees", type=int, default=2, help="simulated attendees (ignored with --noisy: 1 quiet + 3)")
    parser.add_argument("--cores-per-attendee", type=int, default=slices.DEFAULT_CORES_PER_ATTENDEE)
    parser.add_argument("--oversubscribe", action="store_true", help="more servers than slices, sharing them")
    parser.add_argument("--noisy", action="store_true", help="the noisy-neighbour run (use --cores-per-attendee 1 on 2 cores)")
    parser.add_argument("--mem-per-attendee", default=DEFAULT_MEMORY, help="each server's memory limit (a cgroup; "
                        f"'' for none; default {DEFAULT_MEMORY})")
    parser.add_argument("--pids-per-attendee", type=int, default=DEFAULT_PIDS, help="each server's processes and threads "
                        f"(a cgroup's pids.max; 0 for none; default {DEFAULT_PIDS})")
    parser.add_argument("--out", type=Path, required=True, help="where report.json and report.md go")
    parser.add_argument("--keep", type=Path, default=None, help="make the hub's folder under this one and keep it")
    parser.add_argument("--committed", action="store_true", help="release the last commit, not the working tree "
                        "(while uncommitted work leaves the tree half-changed)")
    args = parser.parse_args(argv)
    report = run(args.attendees, args.out, args.cores_per_attendee, args.oversubscribe, args.noisy,
                 args.mem_per_attendee or None, args.pids_per_attendee or None, keep=args.keep, committed=args.committed,
                 log=lambda line: print(line, flush=True))
    print((args.out / "report.md").read_text())
    failed = report.get("failure") or any(p["errors"] for p in report["people"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

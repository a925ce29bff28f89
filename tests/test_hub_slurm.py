"""The class hub on a cluster: an attendee's JupyterLab as a Slurm job runs exercise 3's check onto the board.

On the one-host Slurm cluster of ``tests/slurm_support.py`` (its ``cluster`` fixture:
munged, slurmctld and slurmd on 127.0.0.1), a real JupyterHub is prepared the way ``make hub``
does it with ``--spawner slurm`` (:mod:`packlab.course.hub.slurm`) and started. Then,
through JupyterHub's REST API only (no browser):

* ana logs in with her password (the login form) and starts her server;
* it runs as a Slurm job, which ``squeue`` lists with the CPUs asked for
  (``--cpus-per-task``), and the job's environment sets ``PACKLAB_CORES`` to match;
* through her Jupyter server's kernel API (``POST /api/kernels`` and the kernel's
  websocket), exercise 3's solution and its ``check("per_worker_zip", ...)`` run: fork
  and spawn workers, inside the job, in the sandbox where bubblewrap exists;
* the check's record reaches ``records/ana/`` and the board's data, which the instructor
  reads through the hub;
* stopping the server through the API cancels the job: ``squeue`` no longer lists it;
* stopping the hub stops its board service too, although the hub was started ignoring Ctrl+C
  (SIGINT), as a shell script's background job or a pytest-xdist worker starts it
  (:func:`packlab.course.hub.config.stop_children_at_interrupt`).

Like the other Slurm tests it needs root and Debian's slurm-wlm and munge (``make
system-deps``): skipped without them, failed under ``CI=true``. The unit tests at the top
need none of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from slurm_support import _in_ci, cluster  # noqa: F401 - the one-host cluster, a module fixture (one per module)

from packlab.course import release, sandbox
from packlab.course.hub import cli, config, loadtest
from packlab.course.hub.slurm import job_script, job_state, parse_address

COUNT = 500  # images in the hub's dataset: the check's fixtures take 320 of them
HUB_TIMEOUT = 120  # seconds for JupyterHub to answer
SERVER_TIMEOUT = 240  # seconds for the job to start and JupyterLab to answer (the first start clones the release)
CELL_TIMEOUT = 300  # seconds for one cell; the check starts fork and spawn DataLoader workers on a busy machine
BOARD_WITHIN = 30  # seconds from the check's end to its record on the board (it reads the records folder)
STOP_TIMEOUT = 90  # seconds for the job to leave squeue after the server is stopped (Slurm's KillWait is 15 s here)
HUB_STOP_TIMEOUT = 60  # seconds for the hub to stop its services, servers and proxy after SIGTERM


# ------------------------------------------------------------------ the parts that need no cluster


def test_the_job_script_asks_for_the_slice_and_hands_back_its_own_port(tmp_path):
    script = job_script(name="ana", env={"JUPYTERHUB_API_TOKEN": "secret token", "PACKLAB_CORES": "2"},
                        command=["bwrap", "--", "jupyterhub-singleuser"], workdir=tmp_path / "course",
                        address=tmp_path / "address", log=tmp_path / "job-%j.log", python="/env/bin/python",
                        cpus_per_task=2, memory="6G", partition="teach", time_limit="8:00:00")
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    for option in ("--cpus-per-task=2", "--mem=6G", "--partition=teach", "--time=8:00:00", "--ntasks=1"):
        assert f"#SBATCH {option}" in lines, option
    # Values are quoted for the shell; the server binds every address on the port the job picked.
    assert "export JUPYTERHUB_API_TOKEN='secret token'" in lines
    assert 'export JUPYTERHUB_SERVICE_URL="http://0.0.0.0:${port}${JUPYTERHUB_SERVICE_PREFIX}"' in lines
    # The address is written before the server starts, whole (renamed into place), and the server replaces the shell.
    written = next(i for i, line in enumerate(lines) if line.startswith(f"mv {tmp_path / 'address'}.partial"))
    assert lines[written + 1:] == ["exec bwrap -- jupyterhub-singleuser"] and script.endswith("\n")
    bare = job_script(name="ana", env={}, command=["x"], workdir=tmp_path, address=tmp_path / "a", log=tmp_path / "l",
                      python="python", cpus_per_task=1, memory="")
    assert "--mem" not in bare and "--partition" not in bare and "--time" not in bare


def test_only_this_jobs_address_line_is_taken():
    assert parse_address("812 node07 43121\n", "812") == ("node07", 43121)
    assert parse_address("811 node07 43121\n", "812") is None, "a line left by an earlier job must be ignored"
    assert parse_address("812 node07", "812") is None and parse_address("", "812") is None


def test_squeue_output_gives_the_state_or_none_once_the_job_is_gone():
    assert job_state("RUNNING\n") == "RUNNING"
    assert job_state("") is None and job_state("\n") is None


def test_a_hub_started_ignoring_ctrl_c_starts_its_services_with_ctrl_c_back():
    # The hub's process, started with SIGINT ignored, keeps ignoring it until JupyterHub handles it; the processes
    # it starts (the board, the culler, attendees' servers) get Python's KeyboardInterrupt, so JupyterHub's first
    # signal stops them. Without the call they inherit the ignoring (the control line).
    probe = ("import signal, subprocess, sys\n"
             "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
             "from packlab.course.hub.config import stop_children_at_interrupt\n"
             "if sys.argv[1] == 'fixed':\n"
             "    stop_children_at_interrupt()\n"
             "signal.raise_signal(signal.SIGINT)  # the hub itself does not stop at it\n"
             "child = subprocess.run([sys.executable, '-c', 'import signal; '\n"
             "                        'print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)'],\n"
             "                       capture_output=True, text=True, check=True)\n"
             "print('alive', child.stdout.strip())\n")
    seen = {case: subprocess.run([sys.executable, "-c", probe, case], capture_output=True, text=True, timeout=60)
            for case in ("fixed", "control")}
    assert seen["fixed"].returncode == 0 and seen["fixed"].stdout.split() == ["alive", "True"], seen["fixed"]
    assert seen["control"].stdout.split() == ["alive", "False"], seen["control"]


def _board_processes(folder: Path) -> list[int]:
    """The board services of the hub in ``folder`` still running: their command line names its records folder."""
    records, found = str(folder / "records"), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # a process that ended while we looked
            args = [arg.decode(errors="replace") for arg in (entry / "cmdline").read_bytes().split(b"\0")]
            if "packlab.course.hub.board" in args and records in args:
                found.append(int(entry.name))
    return found


def _ignores_sigint(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT (its ``SigIgn`` mask in /proc, bit 1 for signal 2)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGINT - 1) & 1)
    raise AssertionError(f"no SigIgn line for process {pid}")


def test_the_slurm_hub_configures_the_spawner_and_an_api_the_nodes_reach(tmp_path):
    from traitlets.config import Config

    settings = {
        "url": "http://0.0.0.0:8000", "people": {"ana": "attendee", "lee": "instructor"}, "release": "/r",
        "environment": sys.prefix, "python": sys.executable, "count": 500, "cores_per_attendee": 2,
        "oversubscribe": False, "idle_timeout": 9000, "sandboxed": True, "proxy": "/chp", "hub_port": 8081,
        "proxy_api_port": 8082, "board_port": 8083, "spawner": "slurm",
        "slurm": {"partition": "teach", "memory": "6G", "time": "", "hub_address": "login1"},
    }
    (tmp_path / config.SETTINGS).write_text(json.dumps(settings))
    c = Config()
    config.configure(c, tmp_path)
    assert c.JupyterHub.spawner_class == "packlab.course.hub.slurm.SlurmCourseSpawner"
    assert c.JupyterHub.hub_bind_url == "http://0.0.0.0:8081" and c.JupyterHub.hub_connect_url == "http://login1:8081"
    assert c.SlurmCourseSpawner.partition == "teach" and c.SlurmCourseSpawner.memory == "6G"
    assert c.CourseSpawner.cores_per_attendee == 2


# ------------------------------------------------------------------ the hub on the cluster


def _solution_cells() -> list[str]:
    """Exercise 3's cells an attendee runs for the check (the load test's choice of them)."""
    wanted = loadtest.exercise3_cells()
    # The check cell's hidden assertion (`assert result.passed, result.report()`) fails the cell on a failed part.
    assert "assert result.passed" in wanted[2], wanted[2]
    return wanted


def _squeue(env: dict, *args: str) -> str:
    return subprocess.run(["squeue", "-h", *args], env=env, capture_output=True, text=True, timeout=30).stdout


def _wait(condition, timeout: float, what: str, log: Path):
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:.0f} s. The hub's log:\n{log.read_text()[-5000:]}")
        time.sleep(1)


@pytest.fixture(scope="module")
def slurm_hub(cluster, tmp_path_factory):  # noqa: F811 - cluster is the imported fixture
    """The hub with ``--spawner slurm`` on the test cluster: yields its URL, folder, passwords, the cluster's env, ..."""
    why_not = None if config.PROXY.exists() else f"configurable-http-proxy is not installed at {config.PROXY}"
    if why_not:
        if _in_ci():
            pytest.fail(f"{why_not} (under CI=true the Slurm hub test must run)")
        pytest.skip(why_not)
    folder = tmp_path_factory.mktemp("slurm-hub") / "hub"
    upstream = tmp_path_factory.mktemp("release") / "course"
    assert release.release(upstream) is not None
    class_list = folder.parent / "class.txt"
    class_list.write_text("ana\nlee instructor\n")
    port = config.free_port()
    cores = min(2, os.cpu_count() or 1)  # the test node has the machine's cores: ask for what it can give
    # --mem is checked against the node's RealMemory, not enforced, on the test cluster (slurm_support's docstring).
    settings = {"partition": "debug", "memory": "2G", "time": "00:30:00", "hub_address": "127.0.0.1"}
    sandboxed = sandbox.why_unavailable() is None
    config_file = cli.prepare(class_list, folder, url=f"http://127.0.0.1:{port}", release_repo=upstream, count=COUNT,
                              log=lambda line: None, cores_per_attendee=cores, sandboxed=sandboxed, slurm=settings)
    passwords = dict(line.split()[:2] for line in (folder / "passwords.txt").read_text().splitlines()
                     if not line.startswith("#"))
    log_path = folder / "jupyterhub.log"
    env = cluster["env"]  # SLURM_CONF: the hub's sbatch, squeue and scancel reach the test's cluster
    with open(log_path, "wb") as log:
        # As make hub runs it, in its folder; ignoring SIGINT, as a script's background job (or an xdist worker)
        # starts it: JupyterHub stops its services with SIGINT first, and the teardown checks that they stop.
        hub = subprocess.Popen(cli.hub_command(config_file), cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    base = f"http://127.0.0.1:{port}"
    try:
        import requests

        def answers() -> bool:
            assert hub.poll() is None, f"JupyterHub exited:\n{log_path.read_text()[-5000:]}"
            with contextlib.suppress(requests.RequestException):
                return requests.get(f"{base}/hub/api/", timeout=5).status_code == 200
            return False

        _wait(answers, HUB_TIMEOUT, "JupyterHub answering", log_path)
        yield {"base": base, "folder": folder, "passwords": passwords, "env": env, "log": log_path, "cores": cores,
               "sandboxed": sandboxed}
    finally:
        stopping = time.monotonic()
        for sig, wait in ((signal.SIGTERM, HUB_STOP_TIMEOUT), (signal.SIGKILL, 20)):
            if hub.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(hub.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    hub.wait(timeout=wait)
        print(f"the hub stopped {time.monotonic() - stopping:.1f} s after SIGTERM (status {hub.returncode})")
        # JupyterHub starts its services in sessions of their own: a signal to the hub's group never reaches them,
        # only the hub's own cleanup does. One left running is killed here, and the teardown fails.
        left = _board_processes(folder)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not left, (f"the board service (pids {left}) outlived the hub, which ended with status "
                          f"{hub.returncode}. The hub's log:\n{log_path.read_text()[-3000:]}")


def _log_in(base: str, name: str, password: str):
    """A requests session logged in through the hub's login form (its _xsrf cookie and field, as a browser sends)."""
    import requests

    session = requests.Session()
    session.get(f"{base}/hub/login", timeout=30).raise_for_status()
    xsrf = session.cookies.get("_xsrf")
    reply = session.post(f"{base}/hub/login", data={"username": name, "password": password, "_xsrf": xsrf},
                         allow_redirects=False, timeout=60)
    assert reply.status_code == 302, f"the login of {name} was refused ({reply.status_code})"
    return session


def _api_token(session, base: str, name: str) -> str:
    """A token of ``name``'s own, asked for with their login cookie."""
    reply = session.post(f"{base}/hub/api/users/{name}/tokens", json={"note": "test_hub_slurm"},
                         headers={"X-XSRFToken": session.cookies.get("_xsrf")}, timeout=30)
    assert reply.status_code in (200, 201), reply.text
    return reply.json()["token"]


def _execute(ws, code: str, timeout: float) -> tuple[str, str]:
    """Run ``code`` in the kernel behind websocket ``ws``; ``(the reply's status, the text it printed)``."""
    msg_id, request = loadtest.execute_request(code, "ana", uuid.uuid4().hex)
    ws.send(request)
    printed, status, idle = [], None, False
    deadline = time.monotonic() + timeout
    while status is None or not idle:
        left = deadline - time.monotonic()
        assert left > 0, f"the cell did not finish within {timeout} s; so far:\n{''.join(printed)[-4000:]}"
        ws.settimeout(left)
        replied, done = loadtest.take_reply(json.loads(ws.recv()), msg_id, printed)
        status, idle = replied or status, idle or done
    return status, "".join(printed)


def test_an_attendees_server_is_a_slurm_job_that_runs_exercise_3s_check_onto_the_board(slurm_hub):
    import requests
    import websocket

    base, folder, env, log = slurm_hub["base"], slurm_hub["folder"], slurm_hub["env"], slurm_hub["log"]
    started = time.monotonic()
    ana = _log_in(base, "ana", slurm_hub["passwords"]["ana"])
    token = _api_token(ana, base, "ana")
    api = requests.Session()
    api.headers["Authorization"] = f"token {token}"
    reply = api.post(f"{base}/hub/api/users/ana/server", timeout=60)
    assert reply.status_code in (201, 202), reply.text

    def server_ready() -> bool:
        user = api.get(f"{base}/hub/api/users/ana", timeout=30).json()
        server = user.get("servers", {}).get("", {})
        assert user.get("pending") or server, f"ana's server stopped before it was ready: {user}"
        return bool(server.get("ready"))

    _wait(server_ready, SERVER_TIMEOUT, "ana's server becoming ready", log)
    ready_after = time.monotonic() - started
    jobs = _squeue(env, "-o", "%i %j %T %C %m").split("\n")
    ana_jobs = [line.split() for line in jobs if " packlab-ana " in f" {line} "]
    assert len(ana_jobs) == 1, f"squeue should list ana's one server job: {jobs}"
    job_id, _, state, cpus, memory = ana_jobs[0]
    assert state == "RUNNING" and int(cpus) == slurm_hub["cores"] and memory == "2G", ana_jobs[0]
    assert (folder / "users" / "ana" / "course" / "mywork" / "exercises" / "03_per_worker_zip.md").is_file()

    user_url = f"{base}/user/ana"
    kernel = api.post(f"{user_url}/api/kernels", json={"name": "python3"}, timeout=120)
    assert kernel.status_code == 201, kernel.text
    kernel_id = kernel.json()["id"]
    ws = websocket.create_connection(f"ws://{base.partition('://')[2]}/user/ana/api/kernels/{kernel_id}/channels",
                                     header=[f"Authorization: token {token}"], timeout=120)
    try:
        # In the job, with its cores; in the sandbox (where there is one): the hub's files and the dataset read-only.
        status, printed = _execute(ws, (
            "import os\n"
            "print(os.environ['PACKLAB_CORES'], os.environ['SLURM_JOB_ID'],\n"
            f"      os.path.exists({str(folder / 'passwords.txt')!r}), os.access('data/images', os.W_OK))"
        ), CELL_TIMEOUT)
        assert status == "ok" and printed.split()[:2] == [str(slurm_hub["cores"]), job_id], printed
        if slurm_hub["sandboxed"]:
            assert printed.split()[2:] == ["False", "False"], f"the hub's passwords visible or the data writable: {printed}"
        outputs = []
        for cell in _solution_cells():
            status, printed = _execute(ws, cell, CELL_TIMEOUT)
            outputs.append(printed)
            assert status == "ok", f"a cell of exercise 3 failed in the Slurm job:\n{printed[-6000:]}"
        checked = time.monotonic()
    finally:
        ws.close()
    print(f"exercise 3's check in Slurm job {job_id}:\n{outputs[-1][-1500:]}")

    # The record: in ana's records folder, and on the board the instructor reads through the hub.
    parts = {entry["part"]: entry["status"]
             for path in (folder / "records" / "ana").glob("*.jsonl")
             for entry in map(json.loads, path.read_text().splitlines())
             if entry.get("check") == "per_worker_zip"}
    assert parts and set(parts.values()) == {"passed"}, parts
    lee = _log_in(base, "lee", slurm_hub["passwords"]["lee"])

    def on_board():
        reply = lee.get(f"{base}/services/board/data.json", timeout=30)
        if reply.status_code != 200 or not reply.headers.get("content-type", "").startswith("application/json"):
            return None
        rows = [row for row in reply.json()["parts"] if row["check"] == "per_worker_zip"]
        return rows if rows and all(row["passed"] == ["ana"] for row in rows) else None

    rows = _wait(on_board, BOARD_WITHIN, "ana's check on the board", log)
    boards = _board_processes(folder)
    assert boards, "the board answered, so the teardown's search for it must find it"
    # The hub was started ignoring SIGINT; JupyterHub stops the board with SIGINT first and waits 30 s before SIGTERM.
    assert not any(_ignores_sigint(pid) for pid in boards), "the board inherited the hub's ignoring of SIGINT"
    assert {row["part"] for row in rows} == set(parts), (rows, parts)
    shown_after = time.monotonic() - checked

    stop = api.delete(f"{base}/hub/api/users/ana/server", timeout=120)
    assert stop.status_code in (202, 204), stop.text
    _wait(lambda: job_id not in _squeue(env, "-o", "%i").split(), STOP_TIMEOUT, f"job {job_id} leaving squeue", log)
    assert not (folder / "slurm" / "ana" / "server.sbatch").exists(), "the job script (with its token) must not stay"
    print(f"ana's server ready {ready_after:.0f} s after the start was asked; the board showed the check's "
          f"{len(rows)} parts {shown_after:.1f} s after it ended; {time.monotonic() - started:.0f} s in all")

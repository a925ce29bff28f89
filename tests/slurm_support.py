"""A one-host Slurm cluster for the tests that submit jobs (``test_slurm.py``, ``test_hub_slurm.py``).

The ``cluster`` module fixture builds it on 127.0.0.1 from Debian's ``slurm-wlm`` and
``munge`` (which ``make system-deps`` installs before the tests run) and stops every
daemon it started at the end. It needs root (to run munged as the munge user and slurmd
as root) and those packages: without them the test is skipped, except under ``CI=true``,
where it must run.

Everything the cluster writes lives in the test's temporary folder (configuration, state,
spool, logs), except munge's key, socket, pid and log files, which munged insists on
keeping in a folder owned by the munge user: ``/run/munge``, where the fixture names them
after its own process and removes them at the end. The fixture's munged listens on that
private socket, so a munged the machine may already run is left alone.

The node offers the machine's cores and nine tenths of its memory (``RealMemory``), so
that a job may ask for ``--mem``. Memory is not a consumable resource here
(``SelectTypeParameters=CR_CPU``) and nothing confines a job (no cgroups in a container):
``--mem`` is checked against the node, not enforced.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from packlab.course import system_deps

PACKAGES = ("slurm-wlm", "munge")
DAEMON_TIMEOUT = 90  # seconds for munged, slurmctld and slurmd to come up
MUNGE_DIR = Path("/run/munge")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _require_root() -> None:
    if os.geteuid() == 0:
        return
    message = "the Slurm test needs root: it runs munged as the munge user and slurmd as root"
    if _in_ci():
        pytest.fail(f"{message}, and under CI=true it must run")
    pytest.skip(message)


def _install_packages() -> None:
    """Skip (or fail under CI=true) unless ``make system-deps`` installed slurm-wlm and munge."""
    for package in PACKAGES:
        system_deps.require(package, skip=pytest.skip, fail=pytest.fail)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(process: subprocess.Popen | None, grace: float = 15.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def _wait_for(condition, timeout: float, what: str, logs: list[Path], processes: list[subprocess.Popen]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in processes:
            if p.poll() is not None:
                break
        else:
            if condition():
                return
            time.sleep(0.5)
            continue
        break
    tails = "\n".join(f"--- {log}:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
                      for log in logs if log.exists())
    raise AssertionError(f"{what} did not happen within {timeout:.0f} s (or a daemon exited).\n{tails}")


def node_memory_mb() -> int:
    """The node's ``RealMemory``: nine tenths of the machine's, so that slurmd never finds less than it was told."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(total * 0.9) // 2**20


SLURM_CONF = """\
# A one-host cluster for the Slurm tests (tests/slurm_support.py): everything on 127.0.0.1, everything in {tmp}.
ClusterName=packlab
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={tmp}/state
SlurmdSpoolDir={tmp}/spool
SlurmctldPidFile={tmp}/slurmctld.pid
SlurmdPidFile={tmp}/slurmd.pid
SlurmctldLogFile={tmp}/slurmctld.log
SlurmdLogFile={tmp}/slurmd.log
# No cgroups in a container: track job processes by their parent ids, do not bind tasks to cores.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=600
KillWait=15
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """munged, slurmctld and slurmd for one host; yields the environment that reaches them."""
    _require_root()
    _install_packages()
    tmp = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (tmp / sub).mkdir()
    MUNGE_DIR.mkdir(parents=True, exist_ok=True)
    shutil.chown(MUNGE_DIR, "munge", "munge")
    MUNGE_DIR.chmod(0o755)
    tag = f"packlab-test-{os.getpid()}"
    munge_files = {kind: MUNGE_DIR / f"{tag}.{kind}" for kind in ("key", "socket", "pid", "log", "seed")}
    host = socket.gethostname().split(".")[0]
    conf = tmp / "slurm.conf"
    conf.write_text(SLURM_CONF.format(tmp=tmp, host=host, ctld_port=_free_port(), slurmd_port=_free_port(),
                                      munge_socket=munge_files["socket"], cpus=os.cpu_count() or 1,
                                      memory_mb=node_memory_mb()))
    env = dict(os.environ, SLURM_CONF=str(conf))
    processes: list[subprocess.Popen] = []
    logs = [munge_files["log"], tmp / "slurmctld.log", tmp / "slurmd.log"]
    try:
        # munge: a key of our own, and munged on a private socket, running as the munge user.
        subprocess.run(["mungekey", "--create", f"--keyfile={munge_files['key']}"], user="munge", group="munge",
                       check=True, capture_output=True, timeout=60)
        processes.append(subprocess.Popen(
            ["munged", "--foreground", f"--key-file={munge_files['key']}", f"--socket={munge_files['socket']}",
             f"--pid-file={munge_files['pid']}", f"--log-file={munge_files['log']}", f"--seed-file={munge_files['seed']}"],
            user="munge", group="munge", stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        ))  # fmt: skip
        _wait_for(lambda: munge_files["socket"].exists(), DAEMON_TIMEOUT, "munged creating its socket", logs, processes)
        daemon_out = open(tmp / "daemons.out", "ab")
        processes.append(subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(conf)], env=env, stdout=daemon_out,
                                          stderr=subprocess.STDOUT))
        processes.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf), "-N", host], env=env, stdout=daemon_out,
                                          stderr=subprocess.STDOUT))

        def node_idle() -> bool:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=30)
            return state.stdout.strip() == "idle"

        _wait_for(node_idle, DAEMON_TIMEOUT, "the node becoming idle", logs + [tmp / "daemons.out"], processes)
        yield {"env": env, "tmp": tmp, "logs": logs}
    finally:
        subprocess.run(["scancel", "--full", "--user=root"], env=env, capture_output=True, timeout=30)
        for process in reversed(processes):  # slurmd, slurmctld, then munged
            _stop(process)
        for path in munge_files.values():
            path.unlink(missing_ok=True)
        Path(f"{munge_files['socket']}.lock").unlink(missing_ok=True)

"""The Slurm job script runs as an HPC user would submit it: sbatch, staging, srun torchrun, audit.

The test builds a one-host Slurm cluster on 127.0.0.1 from Debian's ``slurm-wlm`` and
``munge`` (which ``make system-deps`` installs before the tests run), submits
``scripts/slurm/exactly_once.sbatch`` with ``sbatch`` on a small generated dataset, waits
for the job (bounded), reads its output, and stops every daemon it started. It needs root
(to run munged as the munge user and slurmd as root) and those packages: without them it
is skipped, except under ``CI=true``, where it must run.

Everything the cluster writes lives in the test's temporary folder (configuration, state,
spool, logs), except munge's key, socket, pid and log files, which munged insists on
keeping in a folder owned by the munge user: ``/run/munge``, where the test names them
after its own process and removes them at the end. The test's munged listens on that
private socket, so a munged the machine may already run is left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packlab import data, pack, paths
from packlab.course import system_deps

SCRIPT = paths.repo_root() / "scripts" / "slurm" / "exactly_once.sbatch"
PACKAGES = ("slurm-wlm", "munge")
COUNT = 160
MAXCOUNT = 20  # -> 8 shards: 1 node x 2 ranks x 2 workers = 4 readers, 4 shards per rank
DAEMON_TIMEOUT = 90  # seconds for munged, slurmctld and slurmd to come up
JOB_TIMEOUT = 900  # seconds for the whole job, start-up of torchrun and its ranks on a busy machine included
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


SLURM_CONF = """\
# A one-host cluster for tests/test_slurm.py: everything on 127.0.0.1, everything in {tmp}.
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
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
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
                                      munge_socket=munge_files["socket"], cpus=os.cpu_count() or 1))
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


def _job_state(job_id: str, env: dict) -> dict[str, str]:
    shown = subprocess.run(["scontrol", "show", "job", "-o", job_id], env=env, capture_output=True, text=True, timeout=30)
    return dict(re.findall(r"(\w+)=(\S*)", shown.stdout))


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def _confirmed_end(job_id: str, env: dict) -> dict[str, str] | None:
    """The state of a job that requeues itself 10 s after an end state was seen, or None if it left it.

    A run that calls ``scontrol requeue`` on its own job is ended by Slurm before the job is
    queued again, so an end state seen at that moment may belong to the run, not the job.
    """
    for _ in range(5):
        time.sleep(2)
        state = _job_state(job_id, env)
        if state.get("JobState") not in ENDED:
            return None
    return state


def _run_job(command: list[str], env: dict, output: Path, timeout: float,
             release_requeued: bool = False) -> tuple[str, dict[str, str], str, float]:
    """Submit with ``sbatch``, wait (bounded) for the job to end; ``(job id, final state, output, seconds)``.

    Asserts that the job COMPLETED with exit code 0, showing the end of its output otherwise.
    ``release_requeued``: Slurm makes a requeued job eligible again only about two minutes
    after the requeue (measured here: ``EligibleTime`` 121 s after it, ``Reason=BeginTime``
    meanwhile); the test then moves its start time to now, as an administrator can, once the
    job has been held ``REQUEUE_SETTLE`` s, so that each requeue costs seconds rather than
    minutes. What is tested (the signal, the checkpoint, the requeue, the resumed run) is unchanged.
    """
    start = time.monotonic()
    submitted = subprocess.run(["sbatch", "--parsable", f"--output={output}", *command], env=env,
                               cwd=paths.repo_root(), capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    state: dict[str, str] = {}
    held_since = None
    while time.monotonic() - start < timeout:
        state = _job_state(job_id, env)
        if state.get("JobState") in ENDED:
            if not release_requeued:
                break
            confirmed = _confirmed_end(job_id, env)
            if confirmed is not None:
                state = confirmed
                break
        held = release_requeued and state.get("JobState") == "PENDING" and state.get("Reason") == "BeginTime"
        held_since = (held_since or time.monotonic()) if held else None
        # Released at once, the job was allocated 0.1 s after its requeue and killed: the node still held
        # the revoked credential of the run that had just ended ("Job credential revoked", exit 1).
        if held and time.monotonic() - held_since >= REQUEUE_SETTLE:
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env,
                           capture_output=True, timeout=30)
        time.sleep(2)
    else:
        subprocess.run(["scancel", job_id], env=env, capture_output=True, timeout=30)
    seconds = time.monotonic() - start
    text = output.read_text(errors="replace") if output.exists() else "(no job output)"
    assert state.get("JobState") == "COMPLETED" and state.get("ExitCode") == "0:0", (
        f"job {job_id} ended {state.get('JobState')} (exit {state.get('ExitCode')}) after {seconds:.0f} s:\n{text[-6000:]}"
    )
    return job_id, state, text, seconds


def test_sbatch_script_stages_launches_srun_torchrun_and_audits_exactly_once(cluster, tmp_path):
    root = data.generate(tmp_path / "data", count=COUNT, seed=21, workers=2, progress=False)
    shards = pack.write_tar_shards(root / "packed" / "shards", root=root, maxcount=MAXCOUNT, progress=False)
    assert len(shards) == 8
    stage = tmp_path / "node-local"
    env = dict(cluster["env"], PACKLAB_DATA=str(root), PACKLAB_SHARDS=str(root / "packed" / "shards" / "shard-*.tar"),
               PACKLAB_PYTHON=sys.executable, PACKLAB_STAGE_DIR=str(stage))
    job_id, _, text, seconds = _run_job([str(SCRIPT)], env, tmp_path / "job.out", JOB_TIMEOUT)
    print(f"Slurm job {job_id}: {seconds:.0f} s from sbatch to COMPLETED")
    # Staging: the node copied all eight shards (one node holds every part), then the copies were removed.
    assert re.search(r"node 0/1 .*: 8 shards in .*: 8 copied", text), text
    assert not any(stage.glob("packlab-stage-*/*.tar")), "the staged shards were not removed at the end of the job"
    # torchrun: two ranks on the one node, each reading its node's staged shards.
    assert "rank 0/2 (node 0, local rank 0)" in text and "rank 1/2 (node 0, local rank 1)" in text, text
    # The audit: every key exactly once.
    assert f"OK: {COUNT} samples, each expected key exactly once" in text, text


RESUMABLE = paths.repo_root() / "scripts" / "slurm" / "resumable.sbatch"
REQUEUE_TIMEOUT = 900  # seconds for the whole requeued job: several runs, each starting torch and its workers
REQUEUE_SETTLE = 10  # seconds a requeued job stays held before the test releases it (see _run_job)


def test_a_job_checkpoints_on_its_warning_signal_requeues_itself_and_finishes_the_epoch(cluster, tmp_path):
    """A one-minute time limit, SIGUSR1 50 s before it, an epoch of about 45 s of steps after start-up.

    Slurm checks time limits periodically, so the warning comes 10 to 40 s into each run;
    each run checkpoints, requeues the job, and the next run resumes. The checkpoints'
    record must hold the 240 samples exactly once, after at least one requeue.
    """
    import torch
    from collections import Counter

    root = data.generate(tmp_path / "data", count=240, seed=22, workers=2, progress=False)
    shards = pack.write_tar_shards(root / "packed" / "shards", root=root, maxcount=30, progress=False)
    checkpoint = tmp_path / "checkpoint.pt"
    env = dict(cluster["env"], PACKLAB_DATA=str(root), PACKLAB_SHARDS=pack.brace_pattern(shards),
               PACKLAB_PYTHON=sys.executable, PACKLAB_CHECKPOINT=str(checkpoint), STEP_SECONDS="1.5")
    job_id, state, text, seconds = _run_job(["--time=00:01:00", "--signal=B:USR1@50", str(RESUMABLE)], env,
                                            tmp_path / "job.out", REQUEUE_TIMEOUT, release_requeued=True)
    runs = int(state.get("Restarts", "0")) + 1
    print(f"Slurm job {job_id}: {runs} runs, {seconds:.0f} s from sbatch to COMPLETED")
    assert runs >= 2 and "SIGUSR1 from Slurm" in text and "requeueing job" in text, text
    assert f"over {runs} run(s)" in text, text
    saved = torch.load(checkpoint, weights_only=True)
    counts = Counter(saved["keys"])
    assert saved["done"] and len(counts) == 240 and set(counts.values()) == {1}, Counter(counts.values())

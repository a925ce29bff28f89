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
KillWait=15
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


#: Seconds an end state must last before a job that requeues itself is taken to have ended: a run that
#: calls ``scontrol requeue`` on its own job is ended by Slurm before the job is queued again.
END_CONFIRMED_AFTER = 10


class _FollowedJob:
    """A job submitted with ``sbatch`` and followed one poll at a time, so that a test can follow several at once.

    ``release_requeued``: Slurm makes a requeued job eligible again only about two minutes
    after the requeue (measured here: ``EligibleTime`` 121 s after it, ``Reason=BeginTime``
    meanwhile); the test then moves its start time to now, as an administrator can, once the
    job has been held ``REQUEUE_SETTLE`` s, so that each requeue costs seconds rather than
    minutes. What is tested (the signal, the checkpoint, the requeue, the resumed run) is unchanged.
    """

    def __init__(self, command: list[str], env: dict, output: Path, release_requeued: bool = False):
        self.env, self.output, self.release_requeued = env, output, release_requeued
        self.start = time.monotonic()
        submitted = subprocess.run(["sbatch", "--parsable", f"--output={output}", *command], env=env,
                                   cwd=paths.repo_root(), capture_output=True, text=True, timeout=60)
        assert submitted.returncode == 0, submitted.stderr
        self.job_id = submitted.stdout.strip().split(";")[0]
        self.state: dict[str, str] = {}
        self.held_since = self.end_seen = None
        self.done = False
        self.seconds = 0.0

    def text(self) -> str:
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def poll(self) -> None:
        """Look at the job once: note its end, release it from a requeue's hold."""
        now = time.monotonic()
        self.state = _job_state(self.job_id, self.env)
        if self.state.get("JobState") in ENDED:
            self.end_seen = self.end_seen or now
            if not self.release_requeued or now - self.end_seen >= END_CONFIRMED_AFTER:
                self.done, self.seconds = True, now - self.start
            return
        self.end_seen = None
        held = self.release_requeued and self.state.get("JobState") == "PENDING" and self.state.get("Reason") == "BeginTime"
        self.held_since = (self.held_since or now) if held else None
        # Released at once, the job was allocated 0.1 s after its requeue and killed: the node still held
        # the revoked credential of the run that had just ended ("Job credential revoked", exit 1).
        if held and now - self.held_since >= REQUEUE_SETTLE:
            subprocess.run(["scontrol", "update", f"JobId={self.job_id}", "StartTime=now"], env=self.env,
                           capture_output=True, timeout=30)

    def check_completed(self) -> None:
        """Assert that the job COMPLETED with exit code 0, showing the end of its output otherwise."""
        assert self.state.get("JobState") == "COMPLETED" and self.state.get("ExitCode") == "0:0", (
            f"job {self.job_id} ended {self.state.get('JobState')} (exit {self.state.get('ExitCode')}) after "
            f"{self.seconds:.0f} s:\n{self.text()[-6000:]}"
        )


def _follow(jobs: list[_FollowedJob], timeout: float, act=None) -> None:
    """Poll every job every 2 s until all have ended (bounded by ``timeout``); ``act(job)`` after each poll."""
    deadline = time.monotonic() + timeout
    while not all(job.done for job in jobs) and time.monotonic() < deadline:
        for job in jobs:
            if not job.done:
                job.poll()
                if act is not None and not job.done:
                    act(job)
        time.sleep(2)
    for job in jobs:
        if not job.done:
            subprocess.run(["scancel", job.job_id], env=job.env, capture_output=True, timeout=30)
            job.seconds = time.monotonic() - job.start
        job.check_completed()


def _run_job(command: list[str], env: dict, output: Path, timeout: float,
             release_requeued: bool = False) -> tuple[str, dict[str, str], str, float]:
    """Submit with ``sbatch``, wait (bounded) for the job to COMPLETE with exit code 0; ``(job id, state, output, seconds)``."""
    job = _FollowedJob(command, env, output, release_requeued)
    _follow([job], timeout)
    return job.job_id, job.state, job.text(), job.seconds


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


def _epoch_job(cluster, tmp_path, name: str, seed: int, step_seconds: float, options: list[str]):
    """A resumable.sbatch job over 240 samples in shards of 30, one CPU; ``(job, checkpoint path)``."""
    root = data.generate(tmp_path / f"data-{name}", count=240, seed=seed, workers=2, progress=False)
    shards = pack.write_tar_shards(root / "packed" / "shards", root=root, maxcount=30, progress=False)
    checkpoint = tmp_path / f"checkpoint-{name}.pt"
    env = dict(cluster["env"], PACKLAB_DATA=str(root), PACKLAB_SHARDS=pack.brace_pattern(shards),
               PACKLAB_PYTHON=sys.executable, PACKLAB_CHECKPOINT=str(checkpoint), STEP_SECONDS=str(step_seconds))
    job = _FollowedJob(["--cpus-per-task=1", *options, str(RESUMABLE)], env, tmp_path / f"{name}.out",
                       release_requeued=True)
    return job, checkpoint


def _epoch_done_once(job: _FollowedJob, checkpoint: Path) -> int:
    """Assert that the checkpoints' record holds the 240 samples exactly once, over at least two runs; the runs."""
    import torch
    from collections import Counter

    text = job.text()
    runs = int(job.state.get("Restarts", "0")) + 1
    assert runs >= 2 and "requeueing job" in text and f"over {runs} run(s)" in text, text
    assert "killed by signal" not in text and "Traceback" not in text, text
    saved = torch.load(checkpoint, weights_only=True)
    counts = Counter(saved["keys"])
    assert saved["done"] and len(counts) == 240 and set(counts.values()) == {1}, Counter(counts.values())
    return runs


def _saved_step(checkpoint: Path) -> int | None:
    import torch

    try:
        return int(torch.load(checkpoint, weights_only=True)["step"])
    except (FileNotFoundError, RuntimeError, EOFError):
        return None


def test_jobs_signalled_as_slurm_signals_checkpoint_requeue_themselves_and_finish_the_epoch(cluster, tmp_path):
    """Two jobs at once, signalled the three ways Slurm signals a running job; each must requeue and finish.

    * ``signalled`` (a ten-minute limit, so the script's own warning never comes): in its
      first run, once it has checkpointed, the test sends ``scancel --full --signal=TERM``:
      SIGTERM to every process of the job, the batch shell, the training loop and its
      DataLoader workers, as a preemption does. In its second run, after a checkpoint, it
      sends ``scancel --batch --signal=USR1``: the batch shell alone, which is what
      ``--signal=B:USR1@120`` makes Slurm do before the time limit (scancel(1), sbatch(1)),
      at a moment the test chooses rather than at Slurm's next periodic check of the limits
      (every 30 s here, which put the warning 10 s into every run, before the first step).
    * ``timed_out``: a one-minute limit and no warning (the script's own ``--signal`` is
      replaced by SIGURG, which the shell ignores), and an epoch of about 90 s of steps: its
      first run reaches the time limit, where Slurm sends SIGTERM to every process of the
      job and SIGKILL ``KillWait`` (here 15 s) later.

    Every signalled run must checkpoint (status 3, no worker killed) and requeue the job;
    the checkpoints' record must end with the 240 samples exactly once.
    """
    signalled, signalled_checkpoint = _epoch_job(cluster, tmp_path, "signalled", 22, 0.5, ["--time=00:10:00"])
    timed_out, timed_checkpoint = _epoch_job(cluster, tmp_path, "timed-out", 23, 3.0,
                                             ["--time=00:01:00", "--signal=B:URG@50"])
    sent: list[tuple[str, int]] = []  # (how, the checkpoint's step then)

    def signal_the_job(job: _FollowedJob) -> None:
        step = _saved_step(signalled_checkpoint) if job is signalled else None
        if step is None or job.state.get("JobState") != "RUNNING":
            return
        if not sent:
            how = ["--full", "--signal=TERM"]
        elif len(sent) == 1 and step > sent[0][1] and job.state.get("Restarts") == "1":
            how = ["--batch", "--signal=USR1"]
        else:
            return
        done = subprocess.run(["scancel", *how, job.job_id], env=job.env, capture_output=True, timeout=30)
        if done.returncode == 0:  # else the run was just ending: try again at the next poll
            sent.append((" ".join(how), step))

    _follow([signalled, timed_out], REQUEUE_TIMEOUT, act=signal_the_job)
    runs = {name: _epoch_done_once(job, checkpoint)
            for name, job, checkpoint in [("signalled", signalled, signalled_checkpoint),
                                          ("timed_out", timed_out, timed_checkpoint)]}
    print(f"Slurm jobs: {runs} runs, {signalled.seconds:.0f} and {timed_out.seconds:.0f} s from sbatch to COMPLETED; "
          f"sent {sent}")
    runs_text = signalled.text().split(" run 2 ")
    assert len(sent) == 2 and len(runs_text) == 2, (sent, signalled.text())
    assert "SIGTERM: the training loop checkpoints" in runs_text[0] and "signal 15 at step" in runs_text[0], runs_text[0]
    assert "SIGUSR1 from Slurm" in runs_text[1] and "signal 10 at step" in runs_text[1], runs_text[1]
    first_run = timed_out.text().split(" run 2 ")[0]
    assert "DUE TO TIME LIMIT" in first_run and "signal 15 at step" in first_run, timed_out.text()

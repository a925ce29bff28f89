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

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_support import cluster  # noqa: F401 - the one-host cluster, a module fixture

from packlab import data, pack, paths

SCRIPT = paths.repo_root() / "scripts" / "slurm" / "exactly_once.sbatch"
COUNT = 160
MAXCOUNT = 20  # -> 8 shards: 1 node x 2 ranks x 2 workers = 4 readers, 4 shards per rank
JOB_TIMEOUT = 900  # seconds for the whole job, start-up of torchrun and its ranks on a busy machine included


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


#: Seconds from the stop to the job's "requeueing" line: a loop that ends its workers takes a few; one that
#: waits on a worker blocked in a read never gets there (at a time limit or a preemption, Slurm's SIGKILL
#: KillWait later, 15 s here, would end it killed and not requeued).
BLOCKED_STOP_GUARD = 45


def test_a_job_stopped_while_a_worker_is_blocked_in_a_read_exits_3_requeues_and_resumes(cluster, tmp_path):
    """resumable.sbatch, SIGTERM to every process of the job while worker 0 of its first run is stuck in a read.

    The job's python is a wrapper that gives the first run (``SLURM_RESTART_COUNT`` unset or
    0) two test options of ``packlab.preemption``: worker 0 blocks in a read after its first
    two batches (``--hang-worker-after 16``, batches of 8, as a hung file system would block
    it), and the loop waits for the stop after step 1 (``--pause-after 1``). Once the job's
    output shows both, the test sends ``scancel --full --signal=TERM``, as a preemption does.
    The run must end with the loop's status 3 (the script prints "requeueing" for that status
    alone) within ``BLOCKED_STOP_GUARD`` s, the job must be requeued, and its second run,
    without the options, must resume from step 1 and finish the epoch with every sample once.
    """
    import torch
    from collections import Counter

    from packlab import preemption

    count = 64
    root = data.generate(tmp_path / "data", count=count, seed=24, workers=2, progress=False)
    shards = pack.write_tar_shards(root / "packed" / "shards", root=root, maxcount=16, progress=False)
    wrapper = tmp_path / "python-first-run-hangs"
    wrapper.write_text(f"""#!/bin/bash
# The first run of the job (SLURM_RESTART_COUNT unset or 0): worker 0 blocks in a read, the loop waits for the stop.
if [ "${{SLURM_RESTART_COUNT:-0}}" -eq 0 ] && [ "$1 $2" = "-m packlab.preemption" ]; then
  exec "{sys.executable}" "$@" --hang-worker-after 16 --pause-after 1
fi
exec "{sys.executable}" "$@"
""")
    wrapper.chmod(0o755)
    checkpoint = tmp_path / "checkpoint.pt"
    env = dict(cluster["env"], PACKLAB_DATA=str(root), PACKLAB_SHARDS=pack.brace_pattern(shards),
               PACKLAB_PYTHON=str(wrapper), PACKLAB_CHECKPOINT=str(checkpoint), STEP_SECONDS="0", WORKERS="2")
    job = _FollowedJob(["--cpus-per-task=1", "--time=00:10:00", str(RESUMABLE)], env, tmp_path / "blocked.out",
                       release_requeued=True)

    def ready() -> bool:
        job.poll()
        assert not job.done, f"the job ended before the stop:\n{job.text()[-4000:]}"
        text = job.text()
        return "paused after step 1" in text and preemption.BLOCKED_MESSAGE in text

    deadline = time.monotonic() + REQUEUE_TIMEOUT
    while not ready():
        assert time.monotonic() < deadline, f"the first run did not reach the stop:\n{job.text()[-4000:]}"
        time.sleep(0.5)
    stop = subprocess.run(["scancel", "--full", "--signal=TERM", job.job_id], env=env, capture_output=True, text=True,
                          timeout=30)
    assert stop.returncode == 0, stop.stderr
    sent = time.monotonic()
    while "requeueing job" not in job.text() and "the training loop ended with status" not in job.text():
        if time.monotonic() - sent > BLOCKED_STOP_GUARD:
            subprocess.run(["scancel", job.job_id], env=env, capture_output=True, timeout=30)
            pytest.fail(f"the run was still going {BLOCKED_STOP_GUARD} s after SIGTERM (a worker blocked in a read "
                        f"kept the training process alive):\n{job.text()[-4000:]}")
        time.sleep(0.2)
    stopped_after = time.monotonic() - sent
    _follow([job], REQUEUE_TIMEOUT)
    text = job.text()
    print(f"Slurm job {job.job_id}: the first run reported status 3 {stopped_after:.1f} s after SIGTERM; "
          f"{job.seconds:.0f} s from sbatch to COMPLETED over {int(job.state.get('Restarts', '0')) + 1} runs")
    first, _, second = text.partition(" run 2 ")
    assert second, f"the job did not run a second time:\n{text}"
    assert "signal 15 at step 1: checkpoint written" in first and f"requeueing job {job.job_id}" in first, first
    assert "resuming from step 1, 8 samples done (the same workers go on)" in second, second
    assert preemption.BLOCKED_MESSAGE not in second and "killed by signal" not in text and "Traceback" not in text, text
    assert job.state.get("Restarts") == "1", job.state
    saved = torch.load(checkpoint, weights_only=True)
    counts = Counter(saved["keys"])
    assert saved["done"] and saved["runs"] == 2 and len(counts) == count and set(counts.values()) == {1}, saved["runs"]

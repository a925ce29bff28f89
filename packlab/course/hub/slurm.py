"""Attendees' servers as Slurm jobs: the class hub on a cluster (``--spawner slurm``).

On a cluster the hub runs on a login or service node and each attendee's JupyterLab is a
batch job on a compute node, with ``--cpus-per-task`` (the hub's ``--cores-per-attendee``)
and ``--mem`` (``--mem-per-attendee``) of its own, in the partition the hub names. Slurm,
not the hub, then decides which cores the server gets and how many servers run at once:
an attendee whose job waits in the queue sees the spawn page wait.

:class:`SlurmCourseSpawner` is :class:`~packlab.course.hub.server.CourseSpawner` (the copy
of the release, ``mywork/``, the dataset read-only, the records and drop folders, the
sandbox) with only the starting, polling and stopping replaced, the way batchspawner's
``SlurmSpawner`` does them (``sbatch --parsable``; ``squeue -h -j ID -o %T``, where
PENDING and CONFIGURING are waiting, RUNNING and COMPLETING are up; ``scancel``). The
course does not use batchspawner itself: it is not installed here, and this is the part
of it the course needs. What differs:

* **the job script** (:func:`job_script`) sets the server's whole environment itself,
  the API token included, so it is written with mode 600, handed to ``sbatch`` (which
  keeps its own copy in Slurm's state folder) and deleted at once; ``sbatch`` gets only
  the hub's ``PATH``, ``HOME``, ``USER``, locale and ``SLURM_*`` settings
  (:data:`SBATCH_ENV_KEEP`), never the hub's own secrets;
* **the port is chosen in the job**: a free port on the compute node; the job writes
  ``JOBID HOST PORT`` into ``<hub>/slurm/<name>/address`` before it starts the server, and
  the spawner waits for that line (of this job, not a stale one) while the job runs.
  batchspawner reports the port with a call to the hub's API instead; a file needs the
  hub folder on a file system the compute nodes share, which the course needs anyway (the
  release, the dataset, the environment and the attendees' copies live there). The folder
  is the hub's, outside the attendee's sandbox: their code can neither read the script
  nor rewrite the address;
* **the server listens on all the node's addresses** (``0.0.0.0``): the hub's proxy
  reaches it from another machine. The job also needs the hub's API at an address the
  node reaches (:func:`packlab.course.hub.config.configure` binds it on ``0.0.0.0`` and
  tells the servers ``hub_connect_ip``);
* ``PACKLAB_CORES`` is the job's ``--cpus-per-task``; there is no ``taskset``: whether a
  job is held to its cores and its memory is the cluster's Slurm configuration
  (``TaskPlugin=task/affinity,task/cgroup`` with ``ConstrainCores`` and ``ConstrainRAMSpace``).
  The sandbox's address-space cap per process applies as on one machine.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import socket
from pathlib import Path

from traitlets import Float, Unicode

from packlab import cpus
from packlab.course.hub.server import CourseSpawner

#: squeue's long states (squeue(1), JOB STATE CODES) in which the job still holds or waits for its node.
WAITING = ("PENDING", "CONFIGURING", "REQUEUED", "RESIZING", "SUSPENDED")
UP = ("RUNNING", "COMPLETING")
#: Seconds one sbatch, squeue or scancel may take before the spawner treats Slurm as unreachable.
COMMAND_TIMEOUT = 60
#: Seconds ``stop`` waits for a cancelled job to leave the node (Slurm's KillWait is 30 s by default).
STOP_WAIT = 60
#: Of the hub's environment, what ``sbatch`` may see besides the ``SLURM_*`` settings (where Slurm is).
SBATCH_ENV_KEEP = ("PATH", "HOME", "USER", "LANG", "LC_ALL")

#: Picks the port on the compute node: a port the kernel says is free now (the server binds it a moment later).
PICK_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def job_script(*, name: str, env: dict[str, str], command: list[str], workdir: Path, address: Path, log: Path,
               python: str, cpus_per_task: int, memory: str, partition: str = "", time_limit: str = "") -> str:
    """The batch script of one attendee's server: the request, the environment, the port hand-back, the server."""
    request = [f"--job-name=packlab-{name}", f"--cpus-per-task={cpus_per_task}", "--ntasks=1", "--nodes=1",
               f"--output={log}", f"--chdir={workdir}"]
    if memory:
        request.append(f"--mem={memory}")
    if partition:
        request.append(f"--partition={partition}")
    if time_limit:
        request.append(f"--time={time_limit}")
    lines = ["#!/bin/bash", *(f"#SBATCH {option}" for option in request),
             f"# The class hub's JupyterLab for {name} (packlab.course.hub.slurm). It holds the server's API token:",
             "# the hub writes it with mode 600 and deletes it once sbatch has read it.",
             "set -euo pipefail",
             *(f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())),
             f"port=$({shlex.quote(python)} -c {shlex.quote(PICK_PORT)})",
             # JupyterHub's singleuser server binds where JUPYTERHUB_SERVICE_URL says: every address, this port.
             'export JUPYTERHUB_SERVICE_URL="http://0.0.0.0:${port}${JUPYTERHUB_SERVICE_PREFIX}"',
             # Written whole, then renamed: the hub never reads half a line.
             f'echo "$SLURM_JOB_ID $(hostname) $port" > {shlex.quote(str(address))}.partial',
             f"mv {shlex.quote(str(address))}.partial {shlex.quote(str(address))}",
             f"exec {shlex.join(command)}", ""]
    return "\n".join(lines)


def parse_address(text: str, job_id: str) -> tuple[str, int] | None:
    """``(host, port)`` from the address file's ``JOBID HOST PORT`` line when it is ``job_id``'s, else None."""
    match = re.fullmatch(r"(\d+) (\S+) (\d+)\s*", text)
    if match is None or match.group(1) != job_id:
        return None
    return match.group(2), int(match.group(3))


def job_state(squeue_output: str) -> str | None:
    """The job's state from ``squeue -h -j ID -o %T``; None when the job is no longer listed."""
    words = squeue_output.split()
    return words[0] if words else None


class SlurmCourseSpawner(CourseSpawner):
    """An attendee's JupyterLab as a Slurm job (see the module docstring)."""

    partition = Unicode("", config=True, help="the Slurm partition of the servers' jobs (empty: the cluster's default)")
    memory = Unicode("", config=True, help="sbatch --mem for each server's job (empty: the partition's default)")
    time_limit = Unicode("", config=True, help="sbatch --time for each server's job (empty: the partition's limit)")
    poll_every = Float(2.0, config=True, help="seconds between two squeue calls while a server starts or stops")
    job_id = Unicode("")

    @property
    def jobs_folder(self) -> Path:
        """The hub's folder for this attendee's jobs: the script while sbatch reads it, the address, the logs."""
        return self.folder / "slurm" / self.user.name

    @property
    def address_file(self) -> Path:
        return self.jobs_folder / "address"

    def user_env(self, env):
        env = super().user_env(env)
        env[cpus.CORES_SETTING] = str(self.cores_per_attendee)
        return env

    async def _slurm(self, *argv: str) -> tuple[int, str, str]:
        """Run a Slurm command with the hub's Slurm settings; ``(status, stdout, stderr)``."""
        keep = {key: value for key, value in os.environ.items() if key in SBATCH_ENV_KEEP or key.startswith("SLURM")}
        process = await asyncio.create_subprocess_exec(*argv, env=keep, stdout=asyncio.subprocess.PIPE,
                                                       stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            return -1, "", f"{argv[0]} did not answer within {COMMAND_TIMEOUT} s"
        return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    async def query(self) -> str | None:
        """The job's state; None when Slurm no longer lists it; ``"UNKNOWN"`` when Slurm did not answer."""
        status, out, err = await self._slurm("squeue", "-h", "-j", self.job_id, "-o", "%T")
        if status != 0:
            # squeue says "Invalid job id specified" for a job it has forgotten; anything else is Slurm unreachable.
            return None if "Invalid job id" in err else "UNKNOWN"
        return job_state(out)

    def _log_tail(self) -> str:
        log = self.jobs_folder / f"job-{self.job_id}.log"
        return log.read_text(errors="replace")[-3000:] if log.exists() else f"(no log at {log})"

    async def start(self):
        self.prepare()
        self.notebook_dir = str(self.course)
        self.jobs_folder.mkdir(parents=True, exist_ok=True)
        self.jobs_folder.chmod(0o700)
        self.address_file.unlink(missing_ok=True)
        script = self.jobs_folder / "server.sbatch"
        text = job_script(name=self.user.name, env=self.get_env(), command=self.server_command(), workdir=self.course,
                          address=self.address_file, log=self.jobs_folder / "job-%j.log",
                          python=str(Path(self.environment_prefix) / "bin" / "python"),
                          cpus_per_task=self.cores_per_attendee, memory=self.memory, partition=self.partition,
                          time_limit=self.time_limit)
        script.unlink(missing_ok=True)
        with os.fdopen(os.open(script, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(text)
        try:
            status, out, err = await self._slurm("sbatch", "--parsable", str(script))
        finally:
            script.unlink(missing_ok=True)
        if status != 0:
            raise RuntimeError(f"sbatch refused {self.user.name}'s server: {err.strip() or out.strip()}")
        self.job_id = out.strip().splitlines()[-1].split(";")[0]
        self.log.info("%s's server is Slurm job %s (%d CPUs, --mem=%s)", self.user.name, self.job_id,
                      self.cores_per_attendee, self.memory or "-")
        # JupyterHub bounds this loop by Spawner.start_timeout, then calls stop(), which cancels the job.
        while True:
            state = await self.query()
            if state is None or not (state in WAITING or state in UP or state == "UNKNOWN"):
                raise RuntimeError(f"{self.user.name}'s server job {self.job_id} ended ({state or 'gone'}) before "
                                   f"its server started:\n{self._log_tail()}")
            if state == "RUNNING" and self.address_file.exists():
                found = parse_address(self.address_file.read_text(), self.job_id)
                if found is not None:
                    host, port = found
                    return socket.gethostbyname(host), port
            await asyncio.sleep(self.poll_every)

    async def poll(self):
        """None while the job waits or runs (or Slurm does not answer); 1 once it has ended."""
        if not self.job_id:
            return 0
        state = await self.query()
        if state in WAITING or state in UP or state == "UNKNOWN":
            return None
        self.clear_state()
        return 1

    async def stop(self, now=False):
        if not self.job_id:
            return
        self.log.info("cancelling %s's server job %s", self.user.name, self.job_id)
        await self._slurm("scancel", self.job_id)
        if not now:
            # Until the job has left the node: a new start must not meet the old server still on its port.
            deadline = asyncio.get_running_loop().time() + STOP_WAIT
            while await self.query() in (*UP, "UNKNOWN") and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(self.poll_every)
        self.address_file.unlink(missing_ok=True)

    def get_state(self):
        state = super().get_state()
        if self.job_id:
            state["job_id"] = self.job_id
        return state

    def load_state(self, state):
        """A job still running when the hub restarted is followed again."""
        super().load_state(state)
        self.job_id = state.get("job_id", "")

    def clear_state(self):
        super().clear_state()
        self.job_id = ""


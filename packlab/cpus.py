"""How much CPU a process may use, and how many threads torch starts anyway.

A process can be limited in two ways, and torch's default thread count sees only one:

* **which cores** it may run on: its *affinity* (``taskset``, ``docker --cpuset-cpus``,
  Slurm's task affinity and ``ConstrainCores`` cgroups). ``os.sched_getaffinity(0)``
  lists them, and torch's default intra-op thread count follows them (with the OpenMP
  backend of the pip wheels, ``omp_get_max_threads()`` counts the cores of the affinity);
* **how much CPU time** it may use: a cgroup *quota* (``docker --cpus``, Kubernetes CPU
  limits; cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``). Every
  core stays visible and usable, only the time is capped, so torch still starts one
  thread per core: 64 threads sharing 2 CPUs' worth of time on a 64-core node, each
  waiting for the others at every parallel operation.

A batch scheduler's allocation is a third number: Slurm sets ``SLURM_CPUS_PER_TASK``
when a job asks for ``--cpus-per-task``. Where the site does not confine jobs to their
cores, a job sees the whole node and torch uses all of it.

:func:`cpu_report` gathers the numbers for this process; :func:`torch_default_threads`
starts a fresh Python that imports torch under a given affinity or quota and reports
its default, which is how chapter 7 shows the difference.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_ASK_TORCH = "import torch; print(torch.get_num_threads())"


def _cgroup_dirs(pid: str = "self") -> list[tuple[str, Path, Path]]:
    """``(version, mount, path inside it)`` of each CPU cgroup hierarchy this process is in."""
    found = []
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2: one unified hierarchy
            mounts = [m for m in (CGROUP_ROOT, CGROUP_ROOT / "unified") if (m / "cgroup.controllers").exists()]
            found += [("v2", mounts[0], Path(path.lstrip("/")))] if mounts else []
        elif "cpu" in controllers.split(","):
            mounts = [m for m in (CGROUP_ROOT / controllers, CGROUP_ROOT / "cpu") if (m / "cpu.cfs_quota_us").exists()]
            found += [("v1", mounts[0], Path(path.lstrip("/")))] if mounts else []
    return found


def _quota_of(directory: Path, version: str) -> float | None:
    """The CPUs' worth of time one cgroup directory allows (``None``: no limit set there)."""
    try:
        if version == "v2":
            quota, period = (directory / "cpu.max").read_text().split()
            return None if quota == "max" else int(quota) / int(period)
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return None if quota < 0 else quota / period
    except (OSError, ValueError):
        return None


def cpu_quota(pid: str = "self") -> float | None:
    """CPUs' worth of time this process's cgroups allow (e.g. ``1.5``), or ``None`` when no quota is set.

    A quota set on any ancestor cgroup applies too, so the smallest along the path counts.
    """
    limits = []
    for version, mount, path in _cgroup_dirs(pid):
        for inside in (path, *path.parents):
            limit = _quota_of(mount / inside, version)
            if limit is not None:
                limits.append(limit)
    return min(limits) if limits else None


def cpu_report() -> dict:
    """What this process may use: visible cores, cores of its affinity, cgroup quota, Slurm's allocation."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        affinity = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    return {
        "visible cores (os.cpu_count)": os.cpu_count(),
        "cores it may run on (affinity)": affinity,
        "CPU-time quota (cgroup)": cpu_quota(),
        "Slurm's allocation (SLURM_CPUS_PER_TASK)": int(slurm) if slurm else None,
    }


def quota_cgroups_available() -> bool:
    """Whether :func:`torch_default_threads` can put a child under a CPU quota: root, and a writable cpu cgroup."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    return any(os.access(d, os.W_OK) and (d / name).exists()
               for d, name in ((CGROUP_ROOT, "cpu.max"), (CGROUP_ROOT / "unified", "cgroup.controllers"),
                               (CGROUP_ROOT / "cpu", "cpu.cfs_quota_us")))


def _make_quota_cgroup(cpus: float) -> tuple[Path, Path]:
    """A new cgroup limited to ``cpus`` CPUs' worth of time: (its directory, the file a pid is written to)."""
    name = f"packlab-quota-{uuid.uuid4().hex[:8]}"
    period = 100_000
    v1 = CGROUP_ROOT / "cpu"
    if (v1 / "cpu.cfs_quota_us").exists():
        group = v1 / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(int(cpus * period)))
        return group, group / "cgroup.procs"
    for mount in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
        if (mount / "cgroup.controllers").exists() and "cpu" in (mount / "cgroup.controllers").read_text().split():
            group = mount / name
            group.mkdir()
            if not (group / "cpu.max").exists():  # the cpu controller is not enabled for children here
                group.rmdir()
                break
            (group / "cpu.max").write_text(f"{int(cpus * period)} {period}")
            return group, group / "cgroup.procs"
    raise OSError("no cgroup with a CPU-time quota can be made on this machine")


def torch_default_threads(cores: set[int] | None = None, cpus: float | None = None, timeout: float = 120) -> int:
    """The intra-op thread count torch picks in a fresh Python, allowed only ``cores`` and/or ``cpus`` CPUs of time.

    ``cores`` sets the child's affinity before it starts; ``cpus`` puts it in a new cgroup
    with that quota (root only, see :func:`quota_cgroups_available`), removed afterwards.
    """
    group = None
    procs = None
    if cpus is not None:
        group, procs = _make_quota_cgroup(cpus)

    def confine():  # runs in the child, before Python and torch start
        if cores is not None:
            os.sched_setaffinity(0, cores)
        if procs is not None:
            procs.write_text("0")  # "0": the writing process itself

    try:
        done = subprocess.run([sys.executable, "-c", _ASK_TORCH], preexec_fn=confine, capture_output=True,
                              text=True, timeout=timeout, check=True)
        return int(done.stdout.split()[-1])
    finally:
        if group is not None:
            group.rmdir()

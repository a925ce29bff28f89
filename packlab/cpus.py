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

The course itself uses :func:`course_cores`: the cores of the affinity, capped by the
``PACKLAB_CORES`` setting (``make configure PACKLAB_CORES=2``; the class hub and the cluster
recipes set it to an attendee's share). Every worker count in the chapters is that number
or less: :func:`workers_for` takes the smaller of it and the work there is to share out
(shards, batches), because a reader with nothing to read either fails (a tar shard split
over more readers than shards) or measures nothing.

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

from packlab import settings

CGROUP_ROOT = Path("/sys/fs/cgroup")
_ASK_TORCH = "import torch; print(torch.get_num_threads())"


#: The setting that caps the cores the course uses (settings.mk or the environment).
CORES_SETTING = "PACKLAB_CORES"
#: For the tests only: how many cores the course believes this process may run on, in place of
#: its affinity, so that a 2-core machine runs the chapters as a 16-core laptop would (the
#: workers really start; they share the real cores). ``make doctor`` says when it is set.
EMULATED_CORES_VAR = "PACKLAB_VISIBLE_CORES"


def affinity_cores() -> int:
    """Cores this process may run on: its CPU affinity (containers, ``taskset``, batch jobs); all cores on macOS."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _whole_number(name: str, value: str, source: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise settings.SettingsError(
            f"{name}={value!r} ({source}) is not a whole number of cores (1 or more): "
            f"`make configure {name}=2` sets it, `make configure {name}=` removes it")
    return number


def visible_cores() -> int:
    """Cores the course sees: :func:`affinity_cores`, or ``$PACKLAB_VISIBLE_CORES`` where a test emulates a bigger machine."""
    emulated = os.environ.get(EMULATED_CORES_VAR, "").strip()
    if emulated:
        _note_emulated_read()
        return _whole_number(EMULATED_CORES_VAR, emulated, "the environment, emulating a machine")
    return affinity_cores()


_noted_reads: set[str] = set()


def _note_emulated_read() -> None:
    """Name the running notebook in make test's core-reads log, once per process (:mod:`packlab.course.pytest_core_reads`)."""
    log, notebook = os.environ.get("PACKLAB_CORE_READS_LOG"), os.environ.get("PACKLAB_NOTEBOOK")
    if not log or not notebook or notebook in _noted_reads:
        return
    _noted_reads.add(notebook)
    with open(log, "a") as out:  # one short line per write: appends from several processes do not interleave
        out.write(notebook + "\n")


def cores_cap() -> settings.Setting:
    """The ``PACKLAB_CORES`` setting and where it came from (its value is ``None`` when nothing caps the cores)."""
    return settings.lookup(CORES_SETTING)


def course_cores() -> int:
    """Cores the course uses: :func:`visible_cores`, capped by ``PACKLAB_CORES`` when it is set.

    A cap above the visible count changes nothing: the course never starts more workers
    than it has cores because a setting says so.
    """
    cap = cores_cap()
    visible = visible_cores()
    if cap.value is None:
        return visible
    return min(visible, _whole_number(CORES_SETTING, cap.value, cap.origin()))


def workers_for(*work: int) -> int:
    """How many workers (or reader processes) to start for this work: ``min(course_cores(), *work)``, at least 1.

    Pass what the work can be shared out in: the shards (a tar shard is read by one
    reader), the batches (a DataLoader worker makes whole batches), the files. On a
    16-core laptop, 4 shards get 4 readers, not 16.
    """
    return max(1, min(course_cores(), *work))


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
    affinity = affinity_cores()
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

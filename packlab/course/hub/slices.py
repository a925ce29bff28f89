"""Each attendee's slice of the hub machine's cores: handed out when a server starts, taken back when it stops.

The chapters measure: thirty attendees whose servers all run on all the cores measure each
other, and each one's chapters start a worker per core. So every server runs on a slice
of its own, ``per_attendee`` cores (``--cores-per-attendee``, default
:data:`DEFAULT_CORES_PER_ATTENDEE`), by CPU affinity (``taskset -c``, kept by everything the
server starts, DataLoader workers included), and its ``PACKLAB_CORES`` says how many.

The slices are cut from the hub process's own affinity (``os.sched_getaffinity``) in
order: cores 0-1, 2-3, ... A remainder smaller than a slice is left to the hub, its proxy
and the board. :meth:`SliceAllocator.assign` hands out the next free slice after the
last one it gave (round-robin, so that the cores a stopped server used get a rest before
they are given again); when every slice is taken it refuses with :class:`NoSliceFree`,
whose message JupyterHub shows on the attendee's spawn page, unless the hub was started
with ``--oversubscribe``: then the slice with the fewest servers on it is shared, and the
allocator says so (:attr:`Slice.shared`).

The allocator lives in the hub's process; it writes ``slices.json`` into the hub folder
(who has which cores, and whether they share them) for the board and the instructor.

Cores are not the only thing attendees share: one kernel's runaway allocation or a fork
bomb would take the machine from everyone. Where the hub may write cgroup v1 hierarchies
(as root, on a machine without systemd's unified hierarchy, like the course's test
machine), :class:`ServerCgroups` gives each server a memory limit (``memory_per_attendee``)
and a limit on its processes and threads (``pids_per_attendee``) that hold for everything
it starts together.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import time
from dataclasses import dataclass
from pathlib import Path

#: Cores per attendee: the chapters compare 0, 1 and 2 DataLoader workers (setup.md: "cores: 2 or more").
DEFAULT_CORES_PER_ATTENDEE = 2
#: The record of who has which slice, in the hub folder.
SLICES_FILE = "slices.json"


class NoSliceFree(RuntimeError):
    """Every slice is taken and the hub may not share them; the message is for the attendee's spawn page.

    ``jupyterhub_message`` is the attribute JupyterHub's error page shows in place of its own.
    """

    def __init__(self, message: str):
        super().__init__(message)
        self.jupyterhub_message = message


@dataclass(frozen=True)
class Slice:
    """The cores one server runs on; ``shared`` when other servers run on the same cores (oversubscribed)."""

    index: int
    cores: tuple[int, ...]
    shared: bool = False

    def cpu_list(self) -> str:
        """The cores as taskset's ``-c`` takes them: ``"2,3"``."""
        return ",".join(str(core) for core in self.cores)


def hub_cores() -> list[int]:
    """The cores the hub process may run on (its affinity), in order; on a system without affinity, all of them."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS: no affinity; the hub's sandbox needs Linux anyway
        return list(range(os.cpu_count() or 1))


def capacity(cores: int, per_attendee: int) -> int:
    """How many servers the hub runs at once without sharing cores: ``cores // per_attendee``, at least 1."""
    return max(1, cores // max(1, per_attendee))


class SliceAllocator:
    """Hands out :class:`Slice` s of ``cores`` to owners (attendees' names); see the module docstring."""

    def __init__(self, cores: list[int], per_attendee: int = DEFAULT_CORES_PER_ATTENDEE, oversubscribe: bool = False,
                 record: Path | None = None):
        if per_attendee < 1:
            raise ValueError(f"cores per attendee must be 1 or more, not {per_attendee}")
        if not cores:
            raise ValueError("no cores to share out")
        cores = sorted(cores)
        # A machine with fewer cores than one slice gives its one server all of them.
        size = min(per_attendee, len(cores))
        self.per_attendee = size
        self.slices = [tuple(cores[i * size:(i + 1) * size]) for i in range(capacity(len(cores), size))]
        self.oversubscribe = oversubscribe
        self.record = Path(record) if record else None
        self._holders: dict[int, list[str]] = {i: [] for i in range(len(self.slices))}
        self._next = 0  # where the round-robin looks first

    @property
    def capacity(self) -> int:
        return len(self.slices)

    def holder_of(self, owner: str) -> Slice | None:
        for index, holders in self._holders.items():
            if owner in holders:
                return Slice(index, self.slices[index], shared=len(holders) > 1)
        return None

    def assign(self, owner: str) -> Slice:
        """``owner``'s slice: the one they hold already, else the next free one, else (oversubscribed) a shared one.

        Raises :class:`NoSliceFree` when every slice is taken and the hub may not share them.
        """
        held = self.holder_of(owner)
        if held is not None:
            return held
        order = [(self._next + step) % self.capacity for step in range(self.capacity)]
        free = [index for index in order if not self._holders[index]]
        if free:
            index = free[0]
        elif self.oversubscribe:
            index = min(order, key=lambda i: len(self._holders[i]))  # fewest servers; ties in round-robin order
        else:
            raise NoSliceFree(
                f"The hub is full: all {self.capacity} slices of {self.per_attendee} cores are in use "
                f"({self.capacity} servers at once on this machine). Ask your instructor, or try again when "
                "someone stops their server (File > Hub Control Panel > Stop My Server).")
        self._holders[index].append(owner)
        self._next = (index + 1) % self.capacity
        self._write()
        return self.holder_of(owner)

    def claim(self, owner: str, cores: tuple[int, ...]) -> Slice | None:
        """Give ``owner`` back the slice of ``cores`` (a server still running when the hub restarted); None if no such slice."""
        cores = tuple(cores)
        if cores not in self.slices:
            return None
        self.release(owner)
        index = self.slices.index(cores)
        self._holders[index].append(owner)
        self._write()
        return self.holder_of(owner)

    def release(self, owner: str) -> None:
        """Take ``owner``'s slice back (nothing when they hold none)."""
        for holders in self._holders.values():
            if owner in holders:
                holders.remove(owner)
                self._write()

    def in_use(self) -> dict[str, Slice]:
        return {owner: self.holder_of(owner) for holders in self._holders.values() for owner in holders}

    def _write(self) -> None:
        if self.record is None:
            return
        record = {
            "cores_per_attendee": self.per_attendee,
            "capacity": self.capacity,
            "oversubscribe": self.oversubscribe,
            "servers": {owner: {"cores": list(s.cores), "shared": s.shared} for owner, s in sorted(self.in_use().items())},
        }
        partial = self.record.with_suffix(".partial")
        partial.write_text(json.dumps(record, indent=1) + "\n")
        os.replace(partial, self.record)


# ------------------------------------------------------------------ memory and process limits (cgroup v1)

#: Where the cgroup v1 hierarchies are mounted (one folder per controller).
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: The controllers a server's limits use: memory (``memory.limit_in_bytes``) and process count (``pids.max``).
LIMIT_CONTROLLERS = ("memory", "pids")
#: Seconds :meth:`ServerCgroups.remove` waits for the killed processes to leave before giving up on a folder.
REMOVE_WAIT = 10.0
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
#: Each kernel's ``oom_score_adj``: when a server reaches its memory limit, the OOM killer counts a kernel (and
#: everything it starts: DataLoader workers, subprocesses) as this many thousandths of the limit larger, so it
#: ends a kernel before JupyterLab. Raising one's own score needs no privilege (lowering JupyterLab's would).
KERNEL_OOM_SCORE_ADJ = 500
#: The IPython startup file that raises it, written by the spawner into the attendee's home.
KERNEL_OOM_STARTUP = (
    "# Written by the class hub: when this server reaches its memory limit, the OOM killer ends this kernel\n"
    "# (or what it started) before JupyterLab, which keeps the attendee's session.\n"
    "try:\n"
    "    with open('/proc/self/oom_score_adj', 'w') as _f:\n"
    f"        _f.write('{KERNEL_OOM_SCORE_ADJ}')\n"
    "except OSError:\n"
    "    pass\n"
)


class CgroupUnavailable(RuntimeError):
    """The machine gives this hub no cgroup it may write (no v1 hierarchy, or not root); the message says which."""


def parse_size(text: str) -> int:
    """Bytes of a size written as sbatch's ``--mem`` takes it: ``6G``, ``512M``, ``1.5G`` or plain bytes."""
    text = str(text).strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (text[:-1], text[-1]) if text[-1:] in _SIZE_UNITS else (text, "")
    try:
        return int(float(number) * _SIZE_UNITS[unit])
    except ValueError:
        raise ValueError(f"not a size: {text!r} (write e.g. 6G, 512M)") from None


def own_cgroup(controller: str, root: Path = CGROUP_ROOT, proc_cgroup: Path = Path("/proc/self/cgroup")) -> Path:
    """The folder of this process's cgroup v1 for ``controller``; :class:`CgroupUnavailable` when there is none.

    The servers' cgroups are made inside the hub's own, so that whatever already limits the
    hub (a service manager, a container) also limits the sum of its servers.
    """
    for line in proc_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            folder = root / controller / path.lstrip("/")
            if not (folder / "cgroup.procs").exists():
                break
            if not os.access(folder, os.W_OK):
                raise CgroupUnavailable(f"{folder} is not writable by this account (cgroup limits need root or a "
                                        "delegated cgroup)")
            return folder
    raise CgroupUnavailable(f"no cgroup v1 hierarchy of the {controller!r} controller under {root} "
                            "(cgroup v2 machines: jupyterhub-systemdspawner's MemoryMax and TasksMax)")


@dataclass(frozen=True)
class ServerCgroups:
    """One server's cgroups: a folder per controller, ``<hub's cgroup>/packlab-hub-<hub pid>/<owner>``.

    A process entering them (:meth:`enter_command`) and everything it starts afterwards
    count against the server's limits together: a runaway allocation in one kernel, or
    sixty-four DataLoader workers, meet the memory limit of the whole server, and a fork
    bomb meets ``pids.max`` (which counts threads too). When the memory limit is reached the
    kernel's OOM killer ends a process inside, by size and score: the notebook kernels (and
    what they start) score higher than JupyterLab (:data:`KERNEL_OOM_SCORE_ADJ`).
    """

    folders: dict

    @classmethod
    def create(cls, owner: str, memory_bytes: int | None, pids: int | None, hub: str | None = None) -> "ServerCgroups":
        hub = hub or f"packlab-hub-{os.getpid()}"
        folders = {}
        wanted = {"memory": memory_bytes, "pids": pids}
        for controller in LIMIT_CONTROLLERS:
            if not wanted[controller]:
                continue
            folder = own_cgroup(controller) / hub / owner
            folder.mkdir(parents=True, exist_ok=True)
            folders[controller] = folder
        if "memory" in folders:
            (folders["memory"] / "memory.limit_in_bytes").write_text(str(int(memory_bytes)))
            swap = folders["memory"] / "memory.memsw.limit_in_bytes"
            if swap.exists():  # memory + swap: the limit cannot be passed by swapping out
                swap.write_text(str(int(memory_bytes)))
        if "pids" in folders:
            (folders["pids"] / "pids.max").write_text(str(int(pids)))
        return cls(folders)

    def enter_command(self, argv: list[str]) -> list[str]:
        """``argv`` run by a shell that first moves itself into the cgroups, so no process starts outside them."""
        moves = "".join(f"echo $$ > {shlex.quote(str(folder / 'cgroup.procs'))} && " for folder in self.folders.values())
        return ["/bin/sh", "-c", moves + 'exec "$@"', "enter-cgroups", *argv]

    def peak_memory(self) -> int | None:
        """The most memory the server and its processes held at once (bytes), or None without a memory cgroup."""
        folder = self.folders.get("memory")
        try:
            return int((folder / "memory.max_usage_in_bytes").read_text()) if folder else None
        except OSError:
            return None

    def processes(self) -> list[int]:
        pids = set()
        for folder in self.folders.values():
            with contextlib.suppress(OSError):
                pids.update(int(line) for line in (folder / "cgroup.procs").read_text().split())
        return sorted(pids)

    def remove(self) -> None:
        """Kill what is left inside (a stopped server's orphans: kernels, workers) and remove the folders."""
        deadline = time.monotonic() + REMOVE_WAIT
        while True:
            left = self.processes()
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for folder in self.folders.values():
                with contextlib.suppress(FileNotFoundError, OSError):
                    folder.rmdir()
            if not any(folder.exists() for folder in self.folders.values()) or time.monotonic() > deadline:
                for folder in self.folders.values():  # the hub's folder, once its last server is gone
                    with contextlib.suppress(OSError):
                        folder.parent.rmdir()
                return
            time.sleep(0.2)

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
"""

from __future__ import annotations

import json
import os
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

"""What the tests of the exercise checks share: running a check quietly, and the parts a candidate failed."""

from __future__ import annotations

from packlab.course.grading import check
from packlab.loaders.tar import SharedEpoch


class Failed(set):
    """The names of the parts a candidate failed; its repr adds the whole report, so a failed assert shows it."""

    def __init__(self, result):
        super().__init__(part.name for part in result.parts if not part.passed)
        self.parts = tuple(part.name for part in result.parts)
        self.report = result.report()

    def __repr__(self) -> str:
        return f"{set(self)}\n{self.report}"


def failed_parts(check_id: str, candidate, **options) -> Failed:
    """Run check ``check_id`` on ``candidate`` (quietly, unrecorded) and return the parts it failed."""
    return Failed(check(check_id, candidate, quiet=True, record=False, **options))


def failed_parts_sparing_spawn(check_id: str, candidate, expected: set[str], **options) -> Failed:
    """Like :func:`failed_parts`, without the parts that start spawn workers unless ``expected`` names one.

    A spawn part costs a fresh interpreter per worker, each importing torch (about 4 s of
    CPU on two cores); a wrong implementation whose mistake is elsewhere learns nothing
    from it, and the correct alternatives and the solution still run every part.
    """
    from packlab.course.grading import core

    names = [part.name for part in core._EXERCISES[check_id].parts]
    spawn = {name for name in names if "spawn" in name}
    kept = [name for name in names if name not in spawn or name in expected]
    return failed_parts(check_id, candidate, parts=kept, **options)


#: The front matter of a MyST notebook the grader executes (its kernel).
NOTEBOOK_HEADER = """\
---
kernelspec:
  display_name: Python 3 (ipykernel)
  language: python
  name: python3
---
"""
#: Two code cells that solve exercise 5's shard_split check: the import, and a correct shards_for.
SOLVED_SHARD_SPLIT = '''
```{code-cell} ipython3
from packlab.course.grading import check
```

```{code-cell} ipython3
def shards_for(shards, rank, world_size, worker_id, num_workers):
    if len(shards) < world_size * num_workers:
        raise ValueError(f"{len(shards)} shards, {world_size * num_workers} readers")
    return list(shards[rank::world_size][worker_id::num_workers])
```
'''


class SharedEpochReader:
    """The epoch as the solutions keep it, for the test readers that are right about it.

    ``set_epoch`` writes to shared memory (``SharedEpoch``), so a persistent worker sees
    each new epoch; a mixin, because the readers differ in everything else.
    """

    shared_epoch: SharedEpoch

    def set_epoch(self, epoch):
        self.shared_epoch.set(epoch)

    @property
    def epoch(self):
        return self.shared_epoch.value

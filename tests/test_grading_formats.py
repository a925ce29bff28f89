"""The checks of exercise 8 (LMDB) can fail: wrong writers and readers, and correct ones written differently.

Each wrong implementation is a mistake people make with LMDB; each must fail the part
that names it while the parts it gets right still pass. (Lost keys and wrong labels are
tried on the writer, where they arise; the reader's check audits every epoch the same way.) Each correct alternative must
pass every part. The classes live at module level so that spawn workers can import them.
(The solution notebook passing every part, and its untouched stubs scoring 0, is checked
for all exercises by ``tests/test_exercises.py``.)
"""

from __future__ import annotations

import os
from pathlib import Path

import lmdb
import pytest
from torch.utils.data import Dataset

from packlab import data, formats
from packlab.course.grading import check
from packlab.transforms import standard_transform

WRITE_PARTS = {"one_file", "one_record_per_sample", "labels", "jpeg_bytes", "atomic"}
READ_PARTS = {"no_env_in_init", "pixels", "fork", "fork_after_parent_read", "spawn", "fresh_reads", "close"}


def failed_parts(result) -> set[str]:
    return {part.name for part in result.parts if not part.passed}


def run(check_id, candidate):
    # Spawn workers import torch and this module; on a loaded machine that can take longer than the default.
    return check(check_id, candidate, quiet=True, record=False, loader_timeout=180, part_timeout=300)


# ------------------------------------------------------------------------------ writers


def _dump(samples, path, value, keys=None, atomic=True, root=None):
    """Write records ``key -> value(sample, jpeg)``, atomically or straight into ``path``."""
    path = Path(path)
    target = path.with_name(path.name + ".tmp") if atomic else path
    env = lmdb.open(str(target), subdir=False, map_size=2 * sum(s.bytes for s in samples) + (64 << 20), lock=False)
    try:
        with env.begin(write=True) as txn:
            for sample in samples if keys is None else keys(samples):
                txn.put(sample.key.encode("ascii"), value(sample, data.image_path(sample.key, root).read_bytes()))
    finally:
        env.close()
    if atomic:
        os.replace(target, path)


def label_as_text_writer(samples, path, root=None):
    """Wrong layout: the label as decimal text and a newline instead of 4 little-endian bytes."""
    _dump(samples, path, lambda s, jpeg: f"{s.label}\n".encode() + jpeg, root=root)


def index_label_writer(samples, path, root=None):
    """Wrong labels: the position in the list instead of the sample's label."""
    position = {s.key: i for i, s in enumerate(samples)}
    _dump(samples, path, lambda s, jpeg: (position[s.key] % 10).to_bytes(4, "little") + jpeg, root=root)


def one_per_label_writer(samples, path, root=None):
    """Keys lost: samples collected in a dict keyed by label, so one sample per class survives."""
    _dump(samples, path, lambda s, jpeg: s.label.to_bytes(4, "little") + jpeg,
          keys=lambda samples: list({s.label: s for s in samples}.values()), root=root)


def extra_keys_writer(samples, path, root=None):
    """Records that are not samples: every sample stored twice, also under '<key>.jpg'."""
    _dump(samples, path, lambda s, jpeg: s.label.to_bytes(4, "little") + jpeg, root=root)
    env = lmdb.open(str(path), subdir=False, lock=False, map_size=4 * Path(path).stat().st_size)
    with env.begin(write=True) as txn:
        for s in samples:
            txn.put(f"{s.key}.jpg".encode(), s.label.to_bytes(4, "little") + data.image_path(s.key, root).read_bytes())
    env.close()


def straight_to_path_writer(samples, path, root=None):
    """Not atomic: writes into the final name, so a failure part-way leaves a half-written file there."""
    env = lmdb.open(str(path), subdir=False, map_size=2 * sum(s.bytes for s in samples) + (64 << 20), lock=False)
    try:
        for sample in samples:  # one transaction per sample: each is committed as soon as it is written
            with env.begin(write=True) as txn:
                txn.put(sample.key.encode("ascii"),
                        sample.label.to_bytes(4, "little") + data.image_path(sample.key, root).read_bytes())
    finally:
        env.close()


def course_writer(samples, path, root=None):
    """A correct alternative: the course's own writer."""
    formats.write_lmdb(path, samples=samples, root=root, progress_bar=False)


@pytest.mark.parametrize("writer, should_fail", [
    (label_as_text_writer, {"labels", "jpeg_bytes"}),
    (index_label_writer, {"labels"}),
    (one_per_label_writer, {"one_record_per_sample", "labels", "jpeg_bytes"}),
    (extra_keys_writer, {"one_record_per_sample"}),
    (straight_to_path_writer, {"atomic"}),
], ids=lambda value: getattr(value, "__name__", "") if callable(value) else "")
def test_wrong_writers_fail_the_part_that_names_their_mistake(writer, should_fail):
    failed = failed_parts(run("lmdb_write", writer))
    assert failed == should_fail


def test_a_correct_alternative_writer_passes():
    assert failed_parts(run("lmdb_write", course_writer)) == set()


# ------------------------------------------------------------------------------ readers


class _Reader(Dataset):
    """What the readers below share: keys from a closed environment, items from ``self.value(key)``."""

    def __init__(self, path, keys=None, transform=None, return_key=False):
        self.path = str(path)
        with lmdb.open(self.path, subdir=False, readonly=True, lock=False) as env, env.begin() as txn:
            stored = [key.decode() for key in txn.cursor().iternext(keys=True, values=False)]
        self.keys = stored if keys is None else list(keys)
        self.transform = transform or standard_transform
        self.return_key = return_key

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, index):
        key = self.keys[index]
        value = self.value(key)
        label = int.from_bytes(value[:4], "little")
        return (self.transform(value[4:]), label, key) if self.return_key else (self.transform(value[4:]), label)

    def close(self):
        pass


class EnvInInitDataset(_Reader):
    """The pitfall: the environment opened in __init__, kept, and used by every process that gets a copy."""

    def __init__(self, path, **options):
        super().__init__(path, **options)
        self.env = lmdb.open(self.path, subdir=False, readonly=True, lock=False)

    def value(self, key):
        with self.env.begin() as txn:
            return txn.get(key.encode())

    def close(self):
        self.env.close()


class PerPidWithoutClosingDataset(_Reader):
    """Half a fix: one environment per pid, but an inherited one is left open, so py-lmdb refuses to reopen."""

    _env = _pid = None

    def value(self, key):
        if self._env is None or self._pid != os.getpid():
            self._env, self._pid = lmdb.open(self.path, subdir=False, readonly=True, lock=False), os.getpid()
        with self._env.begin() as txn:
            return txn.get(key.encode())

    def __getstate__(self):
        return {**self.__dict__, "_env": None, "_pid": None}

    def close(self):
        if self._env is not None and self._pid == os.getpid():
            self._env.close()
        self._env = self._pid = None


class KeptTransactionDataset(PerPidWithoutClosingDataset):
    """One read transaction per process, kept open across items (and the inherited environment closed)."""

    _txn = None

    def value(self, key):
        if self._env is None or self._pid != os.getpid():
            if self._env is not None:
                self._env.close()
            self._env, self._pid = lmdb.open(self.path, subdir=False, readonly=True, lock=False), os.getpid()
            self._txn = self._env.begin()
        return self._txn.get(key.encode())

    def __getstate__(self):
        return {**super().__getstate__(), "_txn": None}


class NoGetstateDataset(KeptTransactionDataset):
    """Correct in every process, but the open environment goes into the pickle sent to spawn workers."""

    def value(self, key):
        if self._env is None or self._pid != os.getpid():
            if self._env is not None:
                self._env.close()
            self._env, self._pid = lmdb.open(self.path, subdir=False, readonly=True, lock=False), os.getpid()
        with self._env.begin() as txn:
            return txn.get(key.encode())

    __getstate__ = object.__getstate__


class IndexLabelLmdbDataset(NoGetstateDataset):
    """Wrong labels: the label made up from the position instead of read from the record."""

    def __getitem__(self, index):
        item = super().__getitem__(index)
        return (item[0], index % 10, *item[2:])

    def __getstate__(self):
        return {**self.__dict__, "_env": None, "_pid": None}


class OpenPerItemDataset(_Reader):
    """A correct alternative: open and close the environment around every read. Nothing is kept, so nothing is shared."""

    def value(self, key):
        with lmdb.open(self.path, subdir=False, readonly=True, lock=False) as env, env.begin() as txn:
            return txn.get(key.encode())


class CourseReaderDataset(formats.LmdbDataset):
    """A correct alternative: the course's reader (one environment per file and process, in a module registry)."""

    def __init__(self, path, keys=None, transform=None, return_key=False):
        super().__init__(path, keys=keys, transform=transform, return_key=return_key)


@pytest.mark.parametrize("cls, should_fail, may_fail", [
    (EnvInInitDataset, {"no_env_in_init", "fork", "spawn"}, set()),
    (PerPidWithoutClosingDataset, {"fork_after_parent_read"}, set()),
    (KeptTransactionDataset, {"fresh_reads"}, set()),
    (NoGetstateDataset, {"spawn"}, set()),
    (IndexLabelLmdbDataset, {"pixels", "fork", "fork_after_parent_read", "spawn", "fresh_reads"}, set()),
], ids=lambda value: value.__name__ if isinstance(value, type) else "")
def test_wrong_readers_fail_the_part_that_names_their_mistake(cls, should_fail, may_fail):
    failed = failed_parts(run("lmdb_dataset", cls))
    assert should_fail <= failed, f"{cls.__name__} should fail {should_fail - failed}"
    assert failed <= should_fail | may_fail, f"{cls.__name__} should pass {failed - should_fail - may_fail}"


@pytest.mark.parametrize("cls", [OpenPerItemDataset, CourseReaderDataset], ids=lambda c: c.__name__)
def test_correct_alternative_readers_pass(cls):
    result = run("lmdb_dataset", cls)
    assert failed_parts(result) == set(), result.report()

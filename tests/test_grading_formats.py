"""The checks of exercise 8 (LMDB) can fail: wrong writers and readers, and correct ones written differently.

Each wrong implementation breaks one promise of the exercise's text, the way people do:
labels in the wrong byte order, width or form; keys lost or added; the images read from
the default folder whatever ``root`` says; ``append=True`` on samples that are not
sorted; a transaction per sample; writing in place, through a temporary file in
:mod:`tempfile`'s folder, or by copying; a lock file or a half-written temporary file
left behind; a stale temporary file written into. Readers: an environment opened in
``__init__``, inherited ones neither closed nor replaced, a transaction or a cache kept
across items, no ``__getstate__``, keys ignored or sorted, the transform or
``return_key`` ignored, a lock file or a writable environment, a ``close()`` that does
nothing or fails. Each must fail the part that names its mistake (and only the parts
that follow from it); ``test_*_mistakes_are_real`` shows each one outside the grader.
Each correct alternative must pass every part. The classes live at module level so that
spawn workers can import them. (The solution notebook passing every part, and its
untouched stubs scoring 0, is checked for all exercises by ``tests/test_exercises.py``.)
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import lmdb
import pytest
from PIL import Image
from torch.utils.data import Dataset

from packlab import data, formats
from packlab.transforms import standard_transform

from grading_support import failed_parts as run_check
from grading_support import failed_parts_sparing_spawn

WRITE_PARTS = {"one_file", "one_record_per_sample", "labels", "jpeg_bytes", "root", "any_order", "one_transaction",
               "atomic", "tidy", "replaces"}
READ_PARTS = {"no_env_in_init", "keys", "items", "pixels", "read_only", "fork", "fork_after_parent_read", "spawn",
              "fresh_reads", "close"}


def failed_parts(check_id, candidate):
    # Spawn workers import torch and this module; on a loaded machine that can take longer than the default.
    return run_check(check_id, candidate, loader_timeout=180, part_timeout=300)


# ------------------------------------------------------------------------------ writers


def _map_size(samples):
    return 2 * sum(s.bytes for s in samples) + (64 << 20)


def _value(sample, root):
    return sample.label.to_bytes(4, "little") + data.image_path(sample.key, root).read_bytes()


def _dump(samples, path, root=None, *, value=_value, keys=lambda samples: samples, lock=False, map_size=_map_size,
          append=False, per_sample=False, temporary=None, move=os.replace, clean_up=True, subdir=False):
    """The right writer with its pieces replaceable: value, keys, lock, map size, transactions, temporary file, move."""
    path = Path(path)
    tmp = Path(temporary(path)) if temporary else path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
    options = {} if map_size is None else {"map_size": map_size(samples)}
    env = lmdb.open(str(tmp), subdir=subdir, lock=lock, **options)
    try:
        if per_sample:
            for sample in keys(samples):
                with env.begin(write=True) as txn:
                    txn.put(sample.key.encode("ascii"), value(sample, root), append=append)
        else:
            with env.begin(write=True) as txn:
                for sample in keys(samples):
                    txn.put(sample.key.encode("ascii"), value(sample, root), append=append)
    except BaseException:
        env.close()
        if clean_up:
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
            Path(f"{tmp}-lock").unlink(missing_ok=True)
        raise
    env.close()
    if clean_up:
        Path(f"{tmp}-lock").unlink(missing_ok=True)
    if tmp != path:
        move(str(tmp), str(path))


def label_big_endian_writer(samples, path, root=None):
    """Labels as 4 big-endian bytes."""
    _dump(samples, path, root, value=lambda s, r: s.label.to_bytes(4, "big") + data.image_path(s.key, r).read_bytes())


def label_as_text_writer(samples, path, root=None):
    """The label as decimal text and a newline instead of 4 little-endian bytes."""
    _dump(samples, path, root, value=lambda s, r: f"{s.label}\n".encode() + data.image_path(s.key, r).read_bytes())


def eight_byte_label_writer(samples, path, root=None):
    """Labels as 8 bytes (an int64), so the JPEG starts 4 bytes late."""
    _dump(samples, path, root, value=lambda s, r: s.label.to_bytes(8, "little") + data.image_path(s.key, r).read_bytes())


def index_label_writer(samples, path, root=None):
    """The position in the list instead of the sample's label."""
    position = {s.key: i for i, s in enumerate(samples)}
    _dump(samples, path, root,
          value=lambda s, r: (position[s.key] % 10).to_bytes(4, "little") + data.image_path(s.key, r).read_bytes())


def one_per_label_writer(samples, path, root=None):
    """Samples collected in a dict keyed by label, so one sample per class survives."""
    _dump(samples, path, root, keys=lambda samples: list({s.label: s for s in samples}.values()))


def reencoding_writer(samples, path, root=None):
    """Decodes each JPEG with Pillow and saves it again: the pixels look alike, the bytes are not the originals."""

    def reencoded(sample, root):
        out = io.BytesIO()
        Image.open(data.image_path(sample.key, root)).convert("RGB").save(out, format="JPEG", quality=95)
        return sample.label.to_bytes(4, "little") + out.getvalue()

    _dump(samples, path, root, value=reencoded)


def default_folder_writer(samples, path, root=None):
    """Reads every image from the default data folder, whatever `root` says."""
    _dump(samples, path, None)


def append_writer(samples, path, root=None):
    """put(..., append=True), fast for sorted keys, an error for any other order."""
    _dump(samples, path, root, append=True)


def transaction_per_sample_writer(samples, path, root=None):
    """Commits after every sample: the file is right, written slowly, and half a dataset is a valid state."""
    _dump(samples, path, root, per_sample=True)


def default_map_size_writer(samples, path, root=None):
    """Leaves map_size at lmdb's default of 10 MiB, enough for the samples it was tried on."""
    _dump(samples, path, root, map_size=None)


def folder_writer(samples, path, root=None):
    """lmdb.open's default subdir=True: a folder holding data.mdb and lock.mdb, not one file."""
    _dump(samples, path, root, subdir=True)


def straight_to_path_writer(samples, path, root=None):
    """Writes into the final name: a failure part-way (or a reader early) sees a half-written file there."""
    _dump(samples, path, root, temporary=lambda path: path, clean_up=False)


def tempfile_folder_writer(samples, path, root=None):
    """Writes the temporary file with tempfile.mkstemp(): in tempfile's folder, maybe on another filesystem."""
    handle, name = tempfile.mkstemp(suffix=".lmdb")
    os.close(handle)
    _dump(samples, path, root, temporary=lambda path: name)


def tempfile_and_move_writer(samples, path, root=None):
    """tempfile's folder and shutil.move: across filesystems that is a copy into the final name, not a rename."""
    handle, name = tempfile.mkstemp(suffix=".lmdb")
    os.close(handle)
    _dump(samples, path, root, temporary=lambda path: name, move=shutil.move)


def copy_into_place_writer(samples, path, root=None):
    """A temporary file in the right folder, then shutil.copy to the final name (and the temporary removed)."""

    def copy_and_remove(tmp, path):
        shutil.copy(tmp, path)
        os.remove(tmp)

    _dump(samples, path, root, move=copy_and_remove)


def lock_file_left_writer(samples, path, root=None):
    """lmdb.open's default lock=True, and the lock file left next to the final file."""
    tmp = Path(path).with_name(f"{Path(path).name}.{os.getpid()}.writing")
    _dump(samples, path, root, lock=True, temporary=lambda path: tmp, clean_up=False)


def no_clean_up_writer(samples, path, root=None):
    """Atomic, but a write that fails leaves its temporary file in the folder."""
    _dump(samples, path, root, clean_up=False)


def stale_temporary_writer(samples, path, root=None):
    """A fixed temporary name, opened as it is: what a crashed run left there ends up in the new file."""
    _dump(samples, path, root, temporary=lambda path: path.with_name(path.name + ".tmp"))


ALL_WRITE = set(WRITE_PARTS)
MAIN_WRITE = {"one_file", "one_record_per_sample", "labels", "jpeg_bytes", "one_transaction", "tidy"}
WRONG_WRITERS = {
    label_big_endian_writer: {"labels"},
    label_as_text_writer: {"labels", "jpeg_bytes"},
    eight_byte_label_writer: {"jpeg_bytes"},
    index_label_writer: {"labels"},
    one_per_label_writer: {"one_record_per_sample", "labels", "jpeg_bytes", "any_order"},
    reencoding_writer: {"jpeg_bytes"},
    default_folder_writer: {"root"},
    append_writer: {"any_order"},
    transaction_per_sample_writer: {"one_transaction"},
    default_map_size_writer: MAIN_WRITE,  # 120 samples do not fit in 10 MiB; the smaller writes do
    folder_writer: ALL_WRITE,
    straight_to_path_writer: {"atomic", "replaces"},  # in place, it adds to the older file too
    tempfile_folder_writer: {"atomic"},
    tempfile_and_move_writer: {"atomic"},
    copy_into_place_writer: {"atomic"},
    lock_file_left_writer: {"tidy"},
    no_clean_up_writer: {"tidy"},
    stale_temporary_writer: {"replaces"},
}


@pytest.mark.parametrize("writer", WRONG_WRITERS, ids=lambda w: w.__name__)
def test_wrong_writers_fail_the_part_that_names_their_mistake(writer):
    assert failed_parts("lmdb_write", writer) == WRONG_WRITERS[writer]


def course_writer(samples, path, root=None):
    """A correct alternative: the course's own writer (sorted keys, append=True, a per-process temporary name)."""
    formats.write_lmdb(path, samples=samples, root=root, progress_bar=False)


def putmulti_writer(samples, path, root=None):
    """Correct: reads every image first, writes them with one putmulti in one transaction, through a
    NamedTemporaryFile in the target's folder, with lock=True and the lock file removed."""
    path = Path(path)
    records = [(s.key.encode("ascii"), s.label.to_bytes(4, "little") + data.image_path(s.key, root).read_bytes())
               for s in samples]
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
        tmp = Path(handle.name)
    try:
        env = lmdb.open(str(tmp), subdir=False, map_size=4 * sum(len(v) for _, v in records) + (1 << 24))
        try:
            with env.begin(write=True) as txn:
                txn.cursor().putmulti(records)
        finally:
            env.close()
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        Path(f"{tmp}-lock").unlink(missing_ok=True)
    os.replace(tmp, path)


def sorted_append_writer(samples, path, root=None):
    """Correct: sorts the samples, appends, removes a stale temporary file first, renames with os.rename."""
    path = Path(path)
    tmp = path.parent / (path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    env = lmdb.open(str(tmp), subdir=False, lock=False, map_size=1 << 34)  # 16 GiB: the file grows as written
    try:
        with env.begin(write=True) as txn:
            for sample in sorted(samples, key=lambda s: s.key):
                jpeg = data.image_path(sample.key, root).read_bytes()
                txn.put(sample.key.encode(), sample.label.to_bytes(4, "little") + jpeg, append=True)
    except Exception:
        env.close()
        tmp.unlink()
        raise
    env.close()
    os.rename(tmp, path)


@pytest.mark.parametrize("writer", [course_writer, putmulti_writer, sorted_append_writer], ids=lambda w: w.__name__)
def test_correct_alternative_writers_pass(writer):
    assert failed_parts("lmdb_write", writer) == set()


def test_the_writers_mistakes_are_real(tmp_path):
    """Each wrong writer's file, read by the course's own reader or looked at directly, outside the grader."""
    samples = data.load_manifest()[:12]
    shuffled = samples[::-1]

    def written(writer, name, these=samples, **options):
        target = tmp_path / name / "images.lmdb"
        target.parent.mkdir()
        writer(these, target, **options)
        return target

    def labels(path):
        dataset = formats.LmdbDataset(path, transform=lambda jpeg, source=None: jpeg, return_key=True)
        try:
            return {key: label for _, label, key in (dataset[i] for i in range(len(dataset)))}
        finally:
            dataset.close()

    truth = {s.key: s.label for s in samples}
    assert labels(written(course_writer, "right")) == truth
    for writer in (label_big_endian_writer, index_label_writer):
        assert labels(written(writer, writer.__name__)) != truth, writer.__name__
    with pytest.raises(Exception):  # noqa: B017 - the course's reader refuses the text label's bytes as a JPEG
        formats.LmdbDataset(written(label_as_text_writer, "text"))[0]
    assert len(labels(written(one_per_label_writer, "per-label"))) < len(samples)
    for writer in (eight_byte_label_writer, reencoding_writer):
        path = written(writer, writer.__name__)
        env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            assert txn.get(samples[0].key.encode())[4:] != data.image_path(samples[0].key).read_bytes(), writer.__name__
        env.close()
    env = lmdb.open(str(written(append_writer, "append", these=shuffled)), subdir=False, readonly=True, lock=False)
    assert env.stat()["entries"] < len(samples)  # put(append=True) returned False for each key out of order
    env.close()
    env = lmdb.open(str(written(transaction_per_sample_writer, "per-sample")), subdir=False, readonly=True, lock=False)
    assert env.info()["last_txnid"] == len(samples)
    env.close()
    many = data.load_manifest()[:150]
    with pytest.raises(lmdb.MapFullError):
        written(default_map_size_writer, "map", these=many)
    assert written(folder_writer, "folder").is_dir()
    ghost = [*samples[:3], samples[3]._replace(key="999999")]
    for writer, left in ((straight_to_path_writer, {"images.lmdb"}), (no_clean_up_writer, None)):
        folder = tmp_path / f"fails-{writer.__name__}"
        folder.mkdir()
        with pytest.raises(FileNotFoundError):
            writer(ghost, folder / "images.lmdb")
        names = {p.name for p in folder.iterdir()}
        assert names and (left is None or names == left), writer.__name__
    assert {p.name for p in written(lock_file_left_writer, "lock").parent.iterdir()} == {"images.lmdb", f"images.lmdb.{os.getpid()}.writing-lock"}
    stale = tmp_path / "stale" / "images.lmdb.tmp"
    stale.parent.mkdir()
    env = lmdb.open(str(stale), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"zz-old", b"\0\0\0\0old")
    env.close()
    stale_temporary_writer(samples, stale.parent / "images.lmdb")
    assert b"zz-old" in dict(lmdb.open(str(stale.parent / "images.lmdb"), subdir=False, readonly=True, lock=False).begin().cursor())
    other_root = tmp_path / "other-root"
    (other_root / "images").mkdir(parents=True)
    for s, donor in zip(samples, samples[1:] + samples[:1]):
        shutil.copyfile(data.image_path(donor.key), other_root / "images" / f"{s.key}.jpg")
    path = written(default_folder_writer, "root", root=other_root)
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        assert txn.get(samples[0].key.encode())[4:] != (other_root / "images" / f"{samples[0].key}.jpg").read_bytes()
    env.close()


def test_writing_in_place_or_across_filesystems_is_not_atomic(tmp_path):
    """A reader that opens the final name while a copy is under way sees a file smaller than the finished one;
    and os.replace from another filesystem fails outright."""
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on a filesystem of its own")
    samples = data.load_manifest()[:12]
    seen = []

    def watching_copy(source, target):
        with open(source, "rb") as src, open(target, "wb") as dst:
            dst.write(src.read(4096))
            seen.append(os.path.getsize(target))  # what a reader opening the final name now would find
            shutil.copyfileobj(src, dst)

    target = tmp_path / "images.lmdb"
    _dump(samples, target, move=watching_copy)
    assert seen[0] < target.stat().st_size
    before = tempfile.tempdir
    tempfile.tempdir = tempfile.mkdtemp(dir="/dev/shm")
    try:
        with pytest.raises(OSError, match="cross-device"):
            tempfile_folder_writer(samples, tmp_path / "other.lmdb")
    finally:
        shutil.rmtree(tempfile.tempdir, ignore_errors=True)
        tempfile.tempdir = before


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

    def label(self, value):
        return int.from_bytes(value[:4], "little")

    def __getitem__(self, index):
        key = self.keys[index]
        value = self.value(key)
        image = self.transform(value[4:])
        return (image, self.label(value), key) if self.return_key else (image, self.label(value))

    def close(self):
        pass


class PerProcessDataset(_Reader):
    """The right reader's environment handling: one per pid, an inherited one closed first, none pickled."""

    _env = _pid = None
    open_options = dict(subdir=False, readonly=True, lock=False)

    def environment(self):
        if self._env is None or self._pid != os.getpid():
            if self._env is not None:
                self._env.close()
            self._env, self._pid = lmdb.open(self.path, **self.open_options), os.getpid()
        return self._env

    def value(self, key):
        with self.environment().begin() as txn:
            return txn.get(key.encode())

    def __getstate__(self):
        return {**self.__dict__, "_env": None, "_pid": None}

    def close(self):
        if self._env is not None and self._pid == os.getpid():
            self._env.close()
        self._env = self._pid = None


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


class PerPidWithoutClosingDataset(PerProcessDataset):
    """Half a fix: one environment per pid, but an inherited one is left open, so py-lmdb refuses to reopen."""

    def environment(self):
        if self._env is None or self._pid != os.getpid():
            self._env, self._pid = lmdb.open(self.path, **self.open_options), os.getpid()
        return self._env


class KeptTransactionDataset(PerProcessDataset):
    """One read transaction per process, kept open across items (and the inherited environment closed)."""

    _txn = _txn_pid = None

    def value(self, key):
        if self._txn is None or self._txn_pid != os.getpid():
            self._txn, self._txn_pid = self.environment().begin(), os.getpid()
        return self._txn.get(key.encode())

    def __getstate__(self):
        return {**super().__getstate__(), "_txn": None, "_txn_pid": None}


class CachedItemsDataset(PerProcessDataset):
    """Remembers every item it read (a dict by index): the second epoch is free, and never sees a change."""

    def __init__(self, path, **options):
        super().__init__(path, **options)
        self.cache = {}

    def __getitem__(self, index):
        if index not in self.cache:
            self.cache[index] = super().__getitem__(index)
        return self.cache[index]


class NoGetstateDataset(PerProcessDataset):
    """Correct in every process, but the open environment goes into the pickle sent to spawn workers."""

    __getstate__ = object.__getstate__


class LabelBigEndianDataset(PerProcessDataset):
    """Reads the label as big-endian bytes."""

    def label(self, value):
        return int.from_bytes(value[:4], "big")


class IgnoresKeysDataset(PerProcessDataset):
    """Always every stored key, whatever `keys` says."""

    def __init__(self, path, keys=None, **options):
        super().__init__(path, **options)


class SortsKeysDataset(PerProcessDataset):
    """Sorts the keys it is given (and drops repeats): the selection is right, the order is not."""

    def __init__(self, path, keys=None, **options):
        super().__init__(path, keys=None if keys is None else sorted(set(keys)), **options)


class IgnoresTransformDataset(PerProcessDataset):
    """Always the standard transform, whatever `transform` says."""

    def __init__(self, path, keys=None, transform=None, return_key=False):
        super().__init__(path, keys=keys, return_key=return_key)


class AlwaysReturnsKeyDataset(PerProcessDataset):
    """Returns (image, label, key) also when return_key is False."""

    def __getitem__(self, index):
        image, label, *_ = super().__getitem__(index)
        return image, label, self.keys[index]


class LockingReaderDataset(PerProcessDataset):
    """Opens read-only but with lmdb's default lock=True: a lock file appears next to the data."""

    open_options = dict(subdir=False, readonly=True)


class WritableReaderDataset(PerProcessDataset):
    """Opens without readonly=True: an environment that could write, on a file nobody should change while reading."""

    open_options = dict(subdir=False, lock=False)


class CloseDoesNothingDataset(PerProcessDataset):
    """close() that leaves the environment open."""

    def close(self):
        pass


class CloseFailsWhenNothingIsOpenDataset(PerProcessDataset):
    """close() that assumes an environment is open, and raises when none is."""

    def close(self):
        self._env.close()
        self._env = self._pid = None


_SHARED_ENVIRONMENTS = {}


class SharedWithoutPidDataset(_Reader):
    """A module-level environment per file, without the process id: every forked worker reads through the parent's."""

    def value(self, key):
        if self.path not in _SHARED_ENVIRONMENTS:
            _SHARED_ENVIRONMENTS[self.path] = lmdb.open(self.path, subdir=False, readonly=True, lock=False)
        with _SHARED_ENVIRONMENTS[self.path].begin() as txn:
            return txn.get(key.encode())

    def close(self):
        env = _SHARED_ENVIRONMENTS.pop(self.path, None)
        if env is not None:
            env.close()


WRONG_READERS = {
    EnvInInitDataset: {"no_env_in_init", "fork", "spawn"},
    PerPidWithoutClosingDataset: {"fork_after_parent_read"},
    KeptTransactionDataset: {"fresh_reads"},
    CachedItemsDataset: {"fresh_reads"},
    NoGetstateDataset: {"spawn"},
    LabelBigEndianDataset: {"items", "pixels", "fork", "fork_after_parent_read", "spawn"},
    IgnoresKeysDataset: {"keys"},
    SortsKeysDataset: {"keys"},
    IgnoresTransformDataset: {"items", "fork", "fork_after_parent_read", "spawn"},
    AlwaysReturnsKeyDataset: {"items"},
    LockingReaderDataset: {"read_only"},
    WritableReaderDataset: {"read_only"},
    CloseDoesNothingDataset: {"close"},
    CloseFailsWhenNothingIsOpenDataset: {"close"},
    SharedWithoutPidDataset: {"fork"},
}


@pytest.mark.parametrize("cls", WRONG_READERS, ids=lambda c: c.__name__)
def test_wrong_readers_fail_the_part_that_names_their_mistake(cls):
    expected = WRONG_READERS[cls]
    assert failed_parts_sparing_spawn("lmdb_dataset", cls, expected, loader_timeout=180, part_timeout=300) == expected


class OpenPerItemDataset(_Reader):
    """A correct alternative: open and close the environment around every read. Nothing is kept, so nothing is shared."""

    def value(self, key):
        with lmdb.open(self.path, subdir=False, readonly=True, lock=False) as env, env.begin() as txn:
            return txn.get(key.encode())


class CourseReaderDataset(formats.LmdbDataset):
    """A correct alternative: the course's reader (one environment per file and process, in a module registry)."""

    def __init__(self, path, keys=None, transform=None, return_key=False):
        super().__init__(path, keys=keys, transform=transform, return_key=return_key)


class PidTableDataset(Dataset):
    """A correct alternative: a table {pid: environment} that a process cleans of its parent's entries."""

    def __init__(self, path, keys=None, transform=None, return_key=False):
        self.path, self.transform, self.return_key = os.fspath(path), transform, return_key
        env = lmdb.open(self.path, subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            self.keys = list(keys) if keys is not None else [k.decode() for k, _ in txn.cursor()]
        env.close()
        self.envs = {}

    def _env(self):
        me = os.getpid()
        for pid in [pid for pid in self.envs if pid != me]:
            self.envs.pop(pid).close()
        if me not in self.envs:
            self.envs[me] = lmdb.open(self.path, subdir=False, readonly=True, lock=False)
        return self.envs[me]

    def __len__(self):
        return len(self.keys)

    def __getitem__(self, index):
        with self._env().begin(buffers=False) as txn:
            record = txn.get(self.keys[index].encode("ascii"))
        transform = self.transform if self.transform is not None else standard_transform
        out = (transform(record[4:]), int.from_bytes(record[:4], byteorder="little"))
        return (*out, self.keys[index]) if self.return_key else out

    def __getstate__(self):
        return dict(self.__dict__, envs={})

    def close(self):
        env = self.envs.pop(os.getpid(), None)
        if env is not None:
            env.close()


@pytest.mark.parametrize("cls", [OpenPerItemDataset, CourseReaderDataset, PidTableDataset], ids=lambda c: c.__name__)
def test_correct_alternative_readers_pass(cls):
    assert failed_parts("lmdb_dataset", cls) == set()


def _in_a_forked_child(function) -> str:
    """Run ``function()`` in a forked child (as a DataLoader worker runs); return "ok" or the error it raised."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def child():
        try:
            function()
            sender.send("ok")
        except Exception as exc:  # noqa: BLE001
            sender.send(f"{type(exc).__name__}: {exc}")

    process = context.Process(target=child)
    process.start()
    outcome = receiver.recv() if receiver.poll(60) else "no answer"
    process.join(10)
    return outcome


def test_the_readers_mistakes_are_real(tmp_path):
    """Each wrong reader against the course's file, outside the grader."""
    import pickle

    samples = data.load_manifest()[:6]
    path = tmp_path / "images.lmdb"
    formats.write_lmdb(path, samples=samples, progress_bar=False)
    raw = lambda jpeg, source=None: jpeg  # noqa: E731 - the JPEG bytes themselves
    labelled = next(i for i, s in enumerate(samples) if s.label)

    def item(cls, index=0, **options):
        dataset = cls(path, **options)
        try:
            return dataset[index]
        finally:
            dataset.close()

    assert item(LabelBigEndianDataset, labelled, transform=raw)[1] == samples[labelled].label << 24
    keys = [samples[3].key, samples[1].key]
    assert len(IgnoresKeysDataset(path, keys=keys)) == len(samples)
    assert SortsKeysDataset(path, keys=keys).keys == sorted(keys)
    assert item(IgnoresTransformDataset, transform=raw)[0].shape == (3, 256, 256)  # not the bytes asked for
    assert len(item(AlwaysReturnsKeyDataset, transform=raw)) == 3
    for cls in (LockingReaderDataset, WritableReaderDataset):
        dataset = cls(path, transform=raw)
        dataset[0]
        flags = dataset.environment().flags()
        dataset.close()
        assert flags["lock"] or not flags["readonly"], cls.__name__
    assert (tmp_path / "images.lmdb-lock").exists()  # LockingReaderDataset made it
    dataset = CloseDoesNothingDataset(path, transform=raw)
    dataset[0]
    dataset.close()
    with pytest.raises(lmdb.Error, match="already open"):
        lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    del dataset
    with pytest.raises(AttributeError):
        CloseFailsWhenNothingIsOpenDataset(path).close()
    for cls in (KeptTransactionDataset, CachedItemsDataset):
        dataset = cls(path, transform=raw)
        before = dataset[0]
        _rewrite_in_another_process(path, samples[0].key, (9).to_bytes(4, "little") + b"changed")
        assert dataset[0] == before, cls.__name__  # still the old record
        dataset.close()
        fresh = PerProcessDataset(path, transform=raw)
        assert fresh[0] == (b"changed", 9)  # what a reader that looks now sees
        fresh.close()
        formats.write_lmdb(path, samples=samples, progress_bar=False)
    dataset = NoGetstateDataset(path)
    dataset[0]
    with pytest.raises(TypeError, match="Environment"):
        pickle.dumps(dataset)  # what spawn does to send the dataset to a worker
    dataset.close()
    # Forked workers: the parent has read a sample, as everybody does before starting a DataLoader.
    dataset = PerPidWithoutClosingDataset(path, transform=raw)
    dataset[0]
    assert "already open" in _in_a_forked_child(lambda: dataset[1])
    dataset.close()
    for cls in (EnvInInitDataset, SharedWithoutPidDataset):
        dataset = cls(path, transform=raw)
        dataset[0]
        inherited = environments_in_module_or(dataset)
        # The child reads through the parent's environment: close it there (as a worker that opened its own
        # would never notice) and the read fails.
        outcome = _in_a_forked_child(lambda: (inherited.close(), dataset[1]))
        assert outcome != "ok", cls.__name__
        dataset.close()
    right = PerProcessDataset(path, transform=raw)
    right[0]
    assert _in_a_forked_child(lambda: right[1]) == "ok"
    right.close()


def _rewrite_in_another_process(path, key, value):
    """Give ``key`` the record ``value``, from another process (this one has the file open)."""
    import subprocess
    import sys

    code = ("import lmdb, sys; env = lmdb.open(sys.argv[1], subdir=False, map_size=1 << 30, lock=False)\n"
            "with env.begin(write=True) as txn: txn.put(sys.argv[2].encode(), bytes.fromhex(sys.argv[3]))\n"
            "env.close()")
    subprocess.run([sys.executable, "-c", code, str(path), key, value.hex()], check=True, timeout=60)


def environments_in_module_or(dataset):
    """The environment a dataset reads through: its own attribute, or this module's shared table."""
    return getattr(dataset, "env", None) or _SHARED_ENVIRONMENTS[dataset.path]

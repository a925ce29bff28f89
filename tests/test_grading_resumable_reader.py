"""Exercise 11's check can fail: wrong resumable readers fail the part that names their mistake, and only that one.

Each wrong reader makes one mistake people make when they add a position to a shard
reader: it counts its position in chunks (a batch of its own) rather than sample by sample;
it saves how far it read the shards but forgets the samples in its shuffle buffer; it
saves enough for exactly once but not the buffer generator's state, so the resumed order
is another; it keeps one count for the whole loader (a counter in shared memory, the way
the course shares the epoch), not one per worker; before it has read anything it says
"nothing delivered" although it was loaded with a state; it keeps no epoch in its state,
so a state of epoch 0 is applied to epoch 1; it keeps the epoch as a plain attribute,
which persistent workers never see change; it applies a loaded state on every pass, not
once; it lets SIGTERM kill its DataLoader workers; it ignores SIGTERM only from ``__iter__``
on, or from its ``worker_init_fn`` on without starting the workers with the signals blocked,
so that a signal while a ``spawn`` worker starts kills it. A correct reader written differently
from the solution (it saves where each buffered sample came from and the generator's
state, instead of replaying) passes every part. The solution and the untouched stub are
checked by tests/test_exercises.py (full marks, and zero).
"""

from __future__ import annotations

import random
import signal

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

from packlab import preemption
from packlab.course.grading import check
from packlab.loaders.tar import SharedEpoch, iter_shard_samples
from packlab.transforms import standard_transform
from grading_support import SharedEpochReader

PARTS = {"sample_granularity", "buffer", "same_order", "one_batch_per_run", "killed_fork", "killed_spawn",
         "two_epochs", "other_epoch", "sigterm_group", "sigterm_startup"}


def failed_parts(candidate, parts: set[str] = PARTS) -> set[str]:
    result = check("resumable_reader", candidate, parts=sorted(parts), quiet=True, record=False)
    assert {part.name for part in result.parts} == parts
    return {part.name for part in result.parts if not part.passed}


class _Base(SharedEpochReader, IterableDataset):
    """What the wrong readers share: the arguments, the epoch, the worker's place, the stream of samples."""

    def __init__(self, shards, shuffle_buffer=0, seed=0, transform=None, return_key=False):
        self.shards = [str(s) for s in shards]
        self.shuffle_buffer, self.seed = shuffle_buffer, seed
        self.transform = transform or standard_transform
        self.return_key = return_key
        self.position, self.saved = None, None
        self.shared_epoch = SharedEpoch()

    worker_init_fn = staticmethod(preemption.ignore_stop_signals)

    @staticmethod
    def start(loader):
        with preemption.stop_signals_held():
            return iter(loader)

    @staticmethod
    def place():
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def item(self, sample):
        image = self.transform(sample.image_bytes)
        return (image, sample.label, sample.key) if self.return_key else (image, sample.label)

    def mine(self, worker, workers, epoch):
        order = random.Random(f"{self.seed}-{epoch}").sample(self.shards, len(self.shards))
        return order[worker::workers]

    def stream(self, worker, workers, epoch, rng=None):
        samples = (s for shard in self.mine(worker, workers, epoch) for s in iter_shard_samples(shard))
        if self.shuffle_buffer <= 1:
            yield from samples
            return
        rng, buffer = rng or random.Random(f"{self.seed}-{epoch}-{worker}"), []
        for sample in samples:
            if len(buffer) < self.shuffle_buffer:
                buffer.append(sample)
                continue
            index = rng.randrange(len(buffer))
            yield buffer[index]
            buffer[index] = sample
        rng.shuffle(buffer)
        yield from buffer

    def state_dict(self):
        if self.position:
            return dict(self.position)
        return dict(self.saved) if self.saved else {"epoch": self.epoch, "delivered": 0}

    def load_state_dict(self, state):
        self.saved = dict(state)

    def take_saved(self, epoch):
        """The loaded state for this pass (used once), refused when it is of another epoch."""
        saved, self.saved = self.saved, None
        if saved is not None and saved.get("epoch", epoch) != epoch:
            raise ValueError(f"a state of epoch {saved['epoch']} given to epoch {epoch}")
        return saved


class ChunkCountingReader(_Base):
    """Reads 8 samples at a time and counts them all at once: the position is right only between chunks."""

    def __iter__(self):
        worker, workers = self.place()
        epoch = self.epoch
        skip = (self.take_saved(epoch) or {}).get("delivered", 0)
        self.position = {"epoch": epoch, "delivered": skip}
        samples = self.stream(worker, workers, epoch)
        for _ in range(skip):
            next(samples)
        while True:
            chunk = [s for _, s in zip(range(8), samples)]
            if not chunk:
                return
            self.position["delivered"] += len(chunk)
            for sample in chunk:
                yield self.item(sample)


class BufferLosingReader(_Base):
    """Saves how many samples it read from the shards, and where the buffer's generator stood, but not the buffer."""

    def __iter__(self):
        worker, workers = self.place()
        epoch = self.epoch
        saved = self.take_saved(epoch)
        rng = random.Random(f"{self.seed}-{epoch}-{worker}")
        read = 0
        if saved and "rng" in saved:
            rng.setstate((saved["rng"][0], tuple(saved["rng"][1]), saved["rng"][2]))
            read = saved["read"]
        samples = (s for shard in self.mine(worker, workers, epoch) for s in iter_shard_samples(shard))
        for _ in range(read):
            next(samples)
        buffer = []

        def save():
            version, internal, gauss = rng.getstate()
            self.position = {"epoch": epoch, "read": read, "rng": [version, list(internal), gauss]}

        save()
        for sample in samples:
            read += 1
            if len(buffer) < max(1, self.shuffle_buffer):
                buffer.append(sample)
                if self.shuffle_buffer > 1:
                    continue
            index = rng.randrange(len(buffer))
            out = buffer[index]
            buffer[index] = sample
            if self.shuffle_buffer <= 1:
                buffer.clear()
            save()
            yield self.item(out)
        rng.shuffle(buffer)
        for sample in buffer:
            save()
            yield self.item(sample)


class _Referencing(_Base):
    """Readers that keep where each sample came from: (shard number in this reader's share, position) -> sample."""

    def numbered(self, worker, workers, epoch):
        return [((i, p), s) for i, shard in enumerate(self.mine(worker, workers, epoch))
                for p, s in enumerate(iter_shard_samples(shard))]


class ReseededReader(_Referencing):
    """Saves the buffer (where each sample came from) and the read position, but draws with a fresh generator after a resume."""

    def __iter__(self):
        worker, workers = self.place()
        epoch = self.epoch
        saved = self.take_saved(epoch)
        read, refs = (saved["read"], [tuple(r) for r in saved["buffer"]]) if saved and "read" in saved else (0, [])
        everything = self.numbered(worker, workers, epoch)
        lookup = dict(everything)
        buffer = [(ref, lookup[ref]) for ref in refs]
        rng = random.Random(f"{self.seed}-{epoch}-{worker}-{read}")  # another generator after every resume

        def save():
            self.position = {"epoch": epoch, "read": read, "buffer": [list(ref) for ref, _ in buffer]}

        save()
        size = max(1, self.shuffle_buffer)
        for ref, sample in everything[read:]:
            read += 1
            if self.shuffle_buffer <= 1:
                save()
                yield self.item(sample)
                continue
            if len(buffer) < size:
                buffer.append((ref, sample))
                save()
                continue
            index = rng.randrange(len(buffer))
            out = buffer[index]
            buffer[index] = (ref, sample)
            save()
            yield self.item(out[1])
        rng.shuffle(buffer)
        while buffer:
            out = buffer.pop(0)
            save()
            yield self.item(out[1])


class _Replaying(_Base):
    """Correct replay (the solution's design); subclasses change one thing."""

    def resume_point(self, worker, workers, epoch):
        return (self.take_saved(epoch) or {}).get("delivered", 0)

    def __iter__(self):
        worker, workers = self.place()
        epoch = self.epoch
        skip = self.resume_point(worker, workers, epoch)
        self.position = {"epoch": epoch, "worker": worker, "workers": workers, "delivered": skip}
        for count, sample in enumerate(self.stream(worker, workers, epoch), start=1):
            if count <= skip:
                continue
            self.position["delivered"] = count
            yield self.item(sample)


class SharedCountReader(_Base):
    """One count for the whole loader, in shared memory (as the course shares the epoch): not per worker."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.delivered = torch.zeros(1, dtype=torch.int64).share_memory_()

    def state_dict(self):
        return {"epoch": self.epoch, "delivered": int(self.delivered[0])}

    def __iter__(self):
        worker, workers = self.place()
        epoch = self.epoch
        skip = (self.take_saved(epoch) or {}).get("delivered", 0)
        self.delivered[0] = skip
        for count, sample in enumerate(self.stream(worker, workers, epoch), start=1):
            if count <= skip:
                continue
            self.delivered[0] += 1
            yield self.item(sample)


class LoadedStateForgettingReader(_Replaying):
    """Correct while it reads; but before it has read, it says 'nothing delivered' even when it was loaded with a state."""

    def state_dict(self):
        return dict(self.position) if self.position else {"epoch": self.epoch, "delivered": 0}


class EpochlessStateReader(_Replaying):
    """Reads each epoch in its own order, but its state holds no epoch: a state of epoch 0 is applied to epoch 1."""

    def state_dict(self):
        return {k: v for k, v in super().state_dict().items() if k != "epoch"}

    def resume_point(self, worker, workers, epoch):
        saved, self.saved = self.saved, None
        return (saved or {}).get("delivered", 0)


class PlainEpochReader(_Replaying):
    """Keeps the epoch as a plain attribute: a persistent worker keeps the value it started with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plain_epoch = 0

    def set_epoch(self, epoch):
        self.plain_epoch = epoch

    @property
    def epoch(self):
        return self.plain_epoch


class EveryPassResumingReader(_Replaying):
    """Keeps a loaded state and applies it to every later pass, not to the one it resumes."""

    def resume_point(self, worker, workers, epoch):
        if self.saved is not None and self.saved.get("epoch", epoch) != epoch:
            raise ValueError(f"a state of epoch {self.saved['epoch']} given to epoch {epoch}")
        return (self.saved or {}).get("delivered", 0)


class SigtermDyingReader(_Replaying):
    """Correct in every other way, but its DataLoader workers keep torch's SIGTERM handler: a signal to the group kills them."""

    @staticmethod
    def worker_init_fn(worker_id):
        pass

    @staticmethod
    def start(loader):
        return iter(loader)


class IgnoringInIterReader(SigtermDyingReader):
    """Ignores SIGTERM from its first __iter__ on (exercise 11's earlier solution): exposed while a worker starts."""

    @staticmethod
    def place():
        info = get_worker_info()
        if info is not None:
            for number in (signal.SIGTERM, signal.SIGUSR1):
                signal.signal(number, signal.SIG_IGN)
        return (info.id, info.num_workers) if info is not None else (0, 1)


class UnblockedStartReader(SigtermDyingReader):
    """Ignores SIGTERM from its worker_init_fn on, but starts the workers with the signals deliverable."""

    worker_init_fn = staticmethod(preemption.ignore_stop_signals)


WRONG = {
    "counts in chunks of 8": (ChunkCountingReader, {"sample_granularity"}),
    "loses the buffer": (BufferLosingReader, {"buffer", "same_order", "sigterm_group"}),  # which resumes a buffer
    "reseeds on resume": (ReseededReader, {"same_order"}),
    "one count for all workers": (SharedCountReader, {"one_batch_per_run", "killed_fork", "sigterm_group"}),
    "forgets a loaded state until it reads": (LoadedStateForgettingReader, {"one_batch_per_run"}),
    "no epoch in the state": (EpochlessStateReader, {"other_epoch"}),
    "a plain-attribute epoch": (PlainEpochReader, {"two_epochs"}),
    "a loaded state for every pass": (EveryPassResumingReader, {"two_epochs"}),
    "SIGTERM kills the workers": (SigtermDyingReader, {"sigterm_group", "sigterm_startup"}),
    "ignores SIGTERM only in __iter__": (IgnoringInIterReader, {"sigterm_startup"}),
    "no block while the workers start": (UnblockedStartReader, {"sigterm_startup"}),
}


# A count shared by the workers goes wrong by how the two workers' reads interleave; on a machine
# crowded by parallel tests one worker can start so late that the saved counts come out right by
# chance, so that case runs with the serial tests.
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.serial) if name == "one count for all workers"
                                  else name for name in WRONG])
def test_each_wrong_reader_fails_the_part_that_names_its_mistake(name):
    """Every part but the spawn one: a new interpreter per worker, the check's slowest part by far, and the
    only one no wrong reader here fails alone (the shared count fails it too, when its workers' reads
    interleave, as they do under fork); the spawn start-up part only where the mistake is about it.
    The correct reader below runs every part."""
    candidate, mistakes = WRONG[name]
    skipped = {"killed_spawn"} | ({"sigterm_startup"} - mistakes)
    assert failed_parts(candidate, PARTS - skipped) == mistakes


class RefillingReader(_Referencing):
    """Correct, without replay: saves the read position, where each buffered sample came from, and the generator."""

    def __iter__(self):
        worker, workers = self.place()
        epoch = self.epoch
        saved = self.take_saved(epoch)
        rng = random.Random(f"{self.seed}-{epoch}-{worker}")
        read, refs, draining = 0, [], False
        if saved and "read" in saved:
            read, refs, draining = saved["read"], [tuple(r) for r in saved["buffer"]], saved["draining"]
            rng.setstate((saved["rng"][0], tuple(saved["rng"][1]), saved["rng"][2]))
        numbered = self.numbered(worker, workers, epoch)
        lookup = dict(numbered)
        buffer = [(ref, lookup[ref]) for ref in refs]

        def save():
            version, internal, gauss = rng.getstate()
            self.position = {"epoch": epoch, "read": read, "buffer": [list(r) for r, _ in buffer],
                             "draining": draining, "rng": [version, list(internal), gauss]}

        save()
        if not draining:
            for ref, sample in numbered[read:]:
                read += 1
                if self.shuffle_buffer <= 1:
                    save()
                    yield self.item(sample)
                    continue
                if len(buffer) < self.shuffle_buffer:
                    buffer.append((ref, sample))
                    save()
                    continue
                index = rng.randrange(len(buffer))
                out, buffer[index] = buffer[index], (ref, sample)
                save()
                yield self.item(out[1])
            draining = True
            rng.shuffle(buffer)
            save()
        while buffer:
            _, sample = buffer.pop(0)
            save()
            yield self.item(sample)


def test_a_correct_reader_written_differently_passes_every_part():
    assert failed_parts(RefillingReader) == set()


def test_a_childs_failure_file_is_never_read_half_written(tmp_path, monkeypatch):
    """The grader polls for the child's failure file and reads it at once: it must never find it empty.

    An untouched stub's workers raise NotImplementedError; CI's run of 30 Nov read the
    file between its creation and its write and graded the stub with an IndexError instead.
    """
    from packlab.course.grading import resumable_reader

    failure = tmp_path / "failure.txt"
    failure.touch()  # what a plain write_text leaves for a moment
    assert resumable_reader._last_line(str(failure), "exit code 0") == "exit code 0"
    assert resumable_reader._last_line(str(tmp_path / "absent.txt"), "exit code 1") == "exit code 1"

    seen_before_the_rename = []
    real_replace = resumable_reader.os.replace

    def replace(source, target):
        seen_before_the_rename.append(failure.exists())
        real_replace(source, target)

    failure.unlink()
    monkeypatch.setattr(resumable_reader.os, "replace", replace)
    resumable_reader._write_failure(str(failure), "Traceback ...\nNotImplementedError: __iter__\n")
    assert seen_before_the_rename == [False]
    assert resumable_reader._last_line(str(failure), "exit code 0") == "NotImplementedError: __iter__"

"""Exercise 12's check can fail: each wrong reader fails the part that names its mistake.

Each wrong reader makes one mistake people make when they add "several shards at once" to
a shard reader: it reads one shard at a time after all, opens every shard at once, reads
the whole share into its buffer, forgets the epoch (or keeps it in a plain attribute that
persistent workers never see), splits nothing between workers, drops the buffer's last
samples, opens shards itself instead of through the opener, seeds from the clock, or
leaves shards open. Each is checked on the part it breaks (and one it does not, where
that is cheap), so the test stays short; correct readers written differently from the
solution (round robin over the open shards, a draw weighted by what is left) pass the
parts that judge the order. The solution and the untouched stub are checked by
tests/test_exercises.py (full marks, and zero).
"""

from __future__ import annotations

import random
import tarfile

import pytest
from torch.utils.data import IterableDataset, get_worker_info

from packlab.course.grading import check
from packlab.loaders.tar import (
    RawSample,
    SharedEpoch,
    count_samples,
    epoch_shard_order,
    iter_shard_samples,
    open_shard,
    shuffle_buffer,
)
from packlab.transforms import standard_transform


class Reader(IterableDataset):
    """The solution's reader, written so that each wrong reader below overrides one piece."""

    def __init__(self, shards, open_shards=16, shuffle_buffer=64, seed=0, transform=None, return_key=False,
                 opener=None):
        self.shards = [str(s) for s in shards]
        self.open_shards, self.shuffle_buffer, self.seed = open_shards, shuffle_buffer, seed
        self.transform = transform or standard_transform
        self.return_key = return_key
        self.opener = opener or open_shard
        self._epoch = SharedEpoch()

    def set_epoch(self, epoch):
        self._epoch.set(epoch)

    def epoch_now(self):
        return self._epoch.start_pass()[0]

    def place(self):
        info = get_worker_info()
        return (info.id, info.num_workers) if info is not None else (0, 1)

    def share(self, epoch, worker, workers):
        return epoch_shard_order(self.shards, self.seed, epoch)[worker::workers]

    def generator(self, epoch, worker):
        return random.Random(f"{self.seed}-{epoch}-{worker}")

    def stream(self, name):
        return iter_shard_samples(name, self.opener)

    def pick(self, streams, rng):
        return rng.randrange(len(streams))

    def interleave(self, share, rng):
        waiting, streams = list(share), []
        while waiting or streams:
            while waiting and len(streams) < self.open_shards:
                streams.append(self.stream(waiting.pop(0)))
            index = self.pick(streams, rng)
            sample = next(streams[index], None)
            if sample is None:
                streams.pop(index)
            else:
                yield sample

    def buffered(self, samples, rng):
        return shuffle_buffer(samples, self.shuffle_buffer, rng)

    def __iter__(self):
        worker, workers = self.place()
        epoch = self.epoch_now()
        rng = self.generator(epoch, worker)
        for sample in self.buffered(self.interleave(self.share(epoch, worker, workers), rng), rng):
            image = self.transform(sample.image_bytes)
            yield (image, sample.label, sample.key) if self.return_key else (image, sample.label)


class OneShardAtATime(Reader):
    """Reads its shards one after another, whatever open_shards says: the buffer mixes one class."""

    def interleave(self, share, rng):
        for name in share:
            yield from self.stream(name)


class EveryShardOpen(Reader):
    """Opens every shard of its share at the start."""

    def interleave(self, share, rng):
        streams = [self.stream(name) for name in share]
        heads = [next(stream, None) for stream in streams]  # starting a stream opens its shard: all at once
        while streams:
            index = rng.randrange(len(streams))
            if heads[index] is None:
                streams.pop(index)
                heads.pop(index)
                continue
            yield heads[index]
            heads[index] = next(streams[index], None)


class WholeShareBuffer(Reader):
    """Reads its whole share into memory and shuffles it there: the buffer grows to the share."""

    def buffered(self, samples, rng):
        everything = list(samples)
        rng.shuffle(everything)
        return iter(everything)


class NoEpoch(Reader):
    """Never reads the epoch: every epoch is epoch 0."""

    def epoch_now(self):
        return 0


class PlainAttributeEpoch(Reader):
    """Keeps the epoch in a plain attribute, which persistent workers never see change."""

    def set_epoch(self, epoch):
        self.epoch = epoch

    def epoch_now(self):
        return getattr(self, "epoch", 0)


class NoWorkerSplit(Reader):
    """Every worker reads every shard."""

    def share(self, epoch, worker, workers):
        return epoch_shard_order(self.shards, self.seed, epoch)


class DropsTheLastSamples(Reader):
    """A buffer that stops when the stream does, leaving its last samples behind."""

    def buffered(self, samples, rng):
        buffer = []
        for sample in samples:
            if len(buffer) < self.shuffle_buffer:
                buffer.append(sample)
                continue
            index = rng.randrange(len(buffer))
            yield buffer[index]
            buffer[index] = sample


class IgnoresTheOpener(Reader):
    """Opens the shards itself."""

    def stream(self, name):
        return iter_shard_samples(name)


class SeededFromTheClock(Reader):
    """A fresh generator with no seed: another order in every process."""

    def generator(self, epoch, worker):
        return random.Random()


class RepeatsItsChoicesEveryEpoch(Reader):
    """Seeds its generator from the seed and the worker only: a new shard order each epoch, the same draws."""

    def generator(self, epoch, worker):
        return random.Random(f"{self.seed}-{worker}")


class NoBuffer(Reader):
    """Interleaves its open shards and yields each sample as drawn: no shuffle buffer."""

    def buffered(self, samples, rng):
        return samples


class LeavesShardsOpen(Reader):
    """Reads each shard with tarfile over the opened stream, and keeps every stream it opened, never closed."""

    def stream(self, name):
        handle = self.opener(name)
        self.__dict__.setdefault("handles", []).append(handle)
        with tarfile.open(fileobj=handle, mode="r|") as tar:  # a TarFile leaves a file object it was given open
            files = {}
            for member in tar:
                key, _, ext = member.name.partition(".")
                files[ext] = tar.extractfile(member).read()
                if len(files) == 2:
                    yield RawSample(key, int(files["cls"]), files["jpg"], f"{name}:{key}")
                    files = {}


class RoundRobin(Reader):
    """Correct, differently: takes the open shards in turn instead of at random."""

    def interleave(self, share, rng):
        waiting, streams, turn = list(share), [], 0
        while waiting or streams:
            while waiting and len(streams) < self.open_shards:
                streams.append(self.stream(waiting.pop(0)))
            turn %= len(streams)
            sample = next(streams[turn], None)
            if sample is None:
                streams.pop(turn)
            else:
                yield sample
                turn += 1


class WeightedByWhatIsLeft(Reader):
    """Correct, differently: draws a shard with a chance proportional to the samples it has left."""

    def interleave(self, share, rng):
        waiting, streams, left = list(share), [], []
        while waiting or streams:
            while waiting and len(streams) < self.open_shards:
                name = waiting.pop(0)
                streams.append(self.stream(name))
                left.append(count_samples(name))
            index = rng.choices(range(len(streams)), weights=[max(n, 1) for n in left])[0]
            sample = next(streams[index], None)
            if sample is None:
                streams.pop(index)
                left.pop(index)
            else:
                left[index] -= 1
                yield sample


def outcome(candidate, parts: list[str]) -> dict[str, bool]:
    result = check("interleaved_shuffle", candidate, quiet=True, record=False, parts=parts)
    return {part.name: part.passed for part in result.parts}


@pytest.mark.parametrize("candidate, broken, intact", [
    (OneShardAtATime, ["open_shards", "mixing"], ["one_process"]),
    (EveryShardOpen, ["open_shards"], ["one_process"]),
    (WholeShareBuffer, ["bounded_buffer"], ["open_shards"]),
    (NoEpoch, ["epochs"], ["one_process"]),
    (PlainAttributeEpoch, ["persistent_workers"], ["epochs"]),
    (NoWorkerSplit, ["two_workers"], ["one_process"]),
    (DropsTheLastSamples, ["one_process"], []),
    (IgnoresTheOpener, ["open_shards"], ["one_process"]),
    (SeededFromTheClock, ["epochs"], ["one_process"]),
    (LeavesShardsOpen, ["open_shards"], ["one_process"]),
    (RepeatsItsChoicesEveryEpoch, ["epochs"], ["one_process", "two_workers"]),
    (NoBuffer, ["bounded_buffer"], ["one_process", "open_shards"]),
], ids=lambda value: getattr(value, "__name__", None))
def test_a_wrong_reader_fails_the_part_it_breaks(candidate, broken, intact):
    passed = outcome(candidate, broken + intact)
    assert not any(passed[name] for name in broken), passed
    assert all(passed[name] for name in intact), passed


@pytest.mark.parametrize("candidate", [RoundRobin, WeightedByWhatIsLeft], ids=lambda c: c.__name__)
def test_a_correct_reader_written_differently_passes(candidate):
    passed = outcome(candidate, ["open_shards", "bounded_buffer", "mixing"])
    assert all(passed.values()), passed


def test_one_shard_at_a_time_trains_a_worse_model():
    """The accuracy part is the expensive one: run once, on the mistake it exists for."""
    assert outcome(OneShardAtATime, ["accuracy"]) == {"accuracy": False}

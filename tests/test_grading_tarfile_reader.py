"""Exercise 4a's check is fair both ways: the mistakes people make with ``tarfile`` fail, right readers pass.

Each wrong reader here makes one mistake and must fail the part that names it; the
parts it gets right still pass where that can be told apart. The solution notebook's
class (rebuilt from its cell, as in Jupyter) and a correct reader written differently
(``itertools.groupby`` over the members) pass every part. The readers live at module
level so that spawn workers can import them (this folder is on ``sys.path``, which
spawn workers inherit). Readers whose mistake has nothing to do with pickling skip the
spawn part (:func:`grading_support.failed_parts_sparing_spawn`).
"""

from __future__ import annotations

import itertools
import tarfile

from grading_support import failed_parts, failed_parts_sparing_spawn
from torch.utils.data import IterableDataset, get_worker_info

from packlab import paths
from packlab.course import grade
from packlab.course.grading import core, teaching
from packlab.transforms import standard_transform

CHECK = "tarfile_reader"
ROOT = paths.repo_root()


class GroupbyTarReader(IterableDataset):
    """Correct, and written otherwise than the solution: members grouped with itertools.groupby."""

    def __init__(self, shards, transform=None, return_key=False):
        self.shards = [str(s) for s in shards]
        self.transform = transform or standard_transform
        self.return_key = return_key

    def my_shards(self):
        info = get_worker_info()
        return self.shards if info is None else self.shards[info.id :: info.num_workers]

    def members(self, path):
        with tarfile.open(path, mode="r|") as tar:
            for member in tar:
                if member.isfile():
                    yield member.name, tar.extractfile(member).read()

    def samples(self, path):
        for key, group in itertools.groupby(self.members(path), key=lambda member: member[0].partition(".")[0]):
            yield self.sample(path, key, {name.partition(".")[2]: payload for name, payload in group})

    def sample(self, path, key, parts):
        missing = {"cls", "jpg"} - set(parts)
        if missing:
            raise ValueError(f"{path}: sample {key} lacks {', '.join(sorted(missing))}")
        return key, parts["jpg"], self.label(parts["cls"])

    def label(self, text: bytes):
        return int(text)

    def __iter__(self):
        for path in self.my_shards():
            for key, jpg, label in self.samples(path):
                image = self.transform(jpg)
                yield (image, label, key) if self.return_key else (image, label)


class NoSplitTarReader(GroupbyTarReader):
    """Every worker reads every shard."""

    def my_shards(self):
        return self.shards


class ContiguousChunksTarReader(GroupbyTarReader):
    """Worker w reads a contiguous chunk of len(shards) // W shards: the remainder is nobody's."""

    def my_shards(self):
        info = get_worker_info()
        if info is None:
            return self.shards
        size = len(self.shards) // info.num_workers
        return self.shards[info.id * size : (info.id + 1) * size]


class OpenInInitTarReader(GroupbyTarReader):
    """Opens every shard in __init__ and keeps the TarFiles: right in one process and under fork, unpicklable."""

    def __init__(self, shards, transform=None, return_key=False):
        super().__init__(shards, transform, return_key)
        self.tars = {path: tarfile.open(path, mode="r|") for path in self.shards}  # noqa: SIM115 - the mistake

    def members(self, path):
        tar = self.tars[path]
        for member in tar:
            if member.isfile():
                yield member.name, tar.extractfile(member).read()


class TextLabelTarReader(GroupbyTarReader):
    """Hands out the .cls member's text as the label, not the number it holds."""

    def label(self, text: bytes):
        return text.decode()


class DropsLastSampleTarReader(GroupbyTarReader):
    """Yields a sample only when the next key arrives: the last sample of every shard is forgotten."""

    def samples(self, path):
        key, parts = None, {}
        for name, payload in self.members(path):
            stem, _, extension = name.partition(".")
            if key is not None and stem != key:
                yield self.sample(path, key, parts)
                parts = {}
            key = stem
            parts[extension] = payload


class ClsFirstTarReader(GroupbyTarReader):
    """Assumes each sample's .cls comes before its .jpg, as packlab.pack writes them; careful about the rest."""

    def samples(self, path):
        pending = None  # (key, label) of the .cls read last, waiting for its .jpg
        for name, payload in self.members(path):
            key, _, extension = name.partition(".")
            if extension == "cls":
                if pending is not None:
                    raise ValueError(f"{path}: sample {pending[0]} has no .jpg")
                pending = (key, self.label(payload))
            elif extension == "jpg":
                if pending is None or pending[0] != key:
                    raise ValueError(f"{path}: sample {key} has no .cls before its .jpg")
                yield key, payload, pending[1]
                pending = None
        if pending is not None:
            raise ValueError(f"{path}: sample {pending[0]} has no .jpg")


class JpgFirstTarReader(GroupbyTarReader):
    """Assumes each sample's .jpg comes before its .cls: pairs a .cls with the .jpg read just before it."""

    def samples(self, path):
        jpg = None
        for name, payload in self.members(path):
            key, _, extension = name.partition(".")
            if extension == "jpg":
                jpg = payload
            elif extension == "cls":
                if jpg is None:
                    raise ValueError(f"{path}: sample {key} has no .jpg before its .cls")
                yield key, jpg, self.label(payload)
                jpg = None


class SkipsIncompleteTarReader(GroupbyTarReader):
    """Leaves out a sample that lacks a member, without a word."""

    def samples(self, path):
        for key, group in itertools.groupby(self.members(path), key=lambda member: member[0].partition(".")[0]):
            parts = {name.partition(".")[2]: payload for name, payload in group}
            if "cls" in parts and "jpg" in parts:
                yield key, parts["jpg"], self.label(parts["cls"])


class UnnamedShardTarReader(GroupbyTarReader):
    """Raises for an incomplete sample, but the error does not say in which shard."""

    def sample(self, path, key, parts):
        if {"cls", "jpg"} - set(parts):
            raise ValueError(f"sample {key} is incomplete")
        return key, parts["jpg"], self.label(parts["cls"])


PARTS = ["one_process", "fork_3_workers", "spawn_2_workers", "member_order", "incomplete_sample", "last_sample"]


def test_the_check_has_the_parts_of_the_exercise_each_with_a_nudge():
    assert [part.name for part in core._EXERCISES[CHECK].parts] == PARTS
    assert core._EXERCISES[CHECK].notebook == "04a_tarfile_reader"
    assert set(teaching.NUDGES[CHECK]) == set(PARTS)


def test_the_solution_notebooks_reader_passes_every_part():
    candidate = dict(grade.notebook_candidates(ROOT / "solutions" / "04a_tarfile_reader.md"))[CHECK]
    failed = failed_parts(CHECK, candidate)
    assert not failed, failed


def test_a_correct_reader_written_differently_passes_every_part():
    failed = failed_parts(CHECK, GroupbyTarReader)
    assert not failed, failed


def test_a_reader_without_worker_split_fails_the_workers_parts_only():
    failed = failed_parts_sparing_spawn(CHECK, NoSplitTarReader, expected=set())
    assert failed == {"fork_3_workers"}, failed
    assert "every sample arrived 3 times, once per worker" in failed.report


def test_a_split_into_contiguous_chunks_that_drops_the_remainder_fails_with_3_workers():
    failed = failed_parts_sparing_spawn(CHECK, ContiguousChunksTarReader, expected=set())
    assert failed == {"fork_3_workers"}, failed
    assert "missing" in failed.report


def test_tarfiles_opened_in_init_and_kept_fail_the_spawn_part_only():
    failed = failed_parts(CHECK, OpenInInitTarReader)
    assert failed == {"spawn_2_workers"}, failed
    assert "holds open files" in failed.report and "tars" in failed.report


def test_a_label_left_as_text_fails_and_says_to_return_an_int():
    failed = failed_parts_sparing_spawn(CHECK, TextLabelTarReader, expected=set())
    assert "one_process" in failed and "incomplete_sample" not in failed, failed
    assert "return each label as an int" in failed.report


def test_a_reader_that_forgets_the_last_sample_of_each_shard_fails_last_sample_and_says_so():
    failed = failed_parts_sparing_spawn(CHECK, DropsLastSampleTarReader, expected=set())
    assert {"one_process", "last_sample"} <= failed, failed
    assert "one-sample.tar holds 1 sample" in failed.report and "not the last one" in failed.report


def test_a_reader_that_assumes_cls_before_jpg_fails_member_order_only():
    failed = failed_parts_sparing_spawn(CHECK, ClsFirstTarReader, expected=set())
    assert failed == {"member_order"}, failed
    assert "jpg-first.tar" in failed.report


def test_a_reader_that_assumes_jpg_before_cls_fails_member_order():
    failed = failed_parts_sparing_spawn(CHECK, JpgFirstTarReader, expected=set())
    assert {"one_process", "member_order"} <= failed, failed
    assert "cls-first.tar" in failed.report


def test_a_reader_that_skips_an_incomplete_sample_fails_incomplete_sample_only():
    failed = failed_parts_sparing_spawn(CHECK, SkipsIncompleteTarReader, expected=set())
    assert failed == {"incomplete_sample"}, failed
    assert "raised no error" in failed.report


def test_an_error_that_does_not_name_the_shard_fails_incomplete_sample_only():
    failed = failed_parts_sparing_spawn(CHECK, UnnamedShardTarReader, expected=set())
    assert failed == {"incomplete_sample"}, failed
    assert "does not name the shard" in failed.report

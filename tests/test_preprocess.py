"""map_shards: every sample preprocessed exactly once, atomically, resumably and reproducibly.

* the output of a parallel run, audited against the manifest: every key exactly once,
  its label, and pixels bit-identical to the standard transform of the original;
* a run killed with SIGKILL midway (a real process group, as a scheduler kills a job) and
  then resumed writes the same bytes as an uninterrupted run, and skips the shards that
  were done;
* a damaged input shard, or a per-sample function that fails, stops with an error that
  names the shard (and the sample), and leaves no half-written output behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from packlab import audit, pack, paths
from packlab.loaders import TarShardDataset
from packlab.preprocess import PreprocessError, iter_samples, map_shards, to_raw_pixels, to_resized_jpeg
from packlab.transforms import pixels_to_tensor


@pytest.fixture(scope="module")
def input_shards(small_root, tmp_path_factory):
    """The 60-sample test dataset as 6 tar shards of 10."""
    folder = tmp_path_factory.mktemp("input-shards")
    return pack.write_tar_shards(folder, root=small_root, maxcount=10, progress=False)


def _running_in_group(group: int) -> list[int]:
    """Processes of process group ``group`` that still run (zombies, killed and only waiting to be reaped, do not)."""
    running = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):  # fields: state, ppid, pgrp, ...
            running.append(int(stat.parent.name))
    return running


def _no_partials(folder: Path) -> bool:
    return not list(folder.glob(".*.partial-*"))


def _fails_on_sample(sample):
    if sample.key.endswith("7"):
        raise ValueError("cannot handle this one")
    return to_raw_pixels(sample)


def _returns_text(sample):
    return "not a dict of bytes"


def test_output_holds_every_sample_once_with_its_label_and_pixels(input_shards, small_root, small_manifest, tmp_path):
    report = map_shards(to_raw_pixels, input_shards, tmp_path, processes=2, progress=False)
    assert report.images == len(small_manifest) and report.skipped == 0
    assert sorted(os.listdir(tmp_path)) == [p.name for p in input_shards]
    assert set(report.images_per_s_by_process()) <= {r.process for r in report.shards}
    records = []
    for shard in sorted(tmp_path.glob("*.tar")):
        for key, files in iter_samples(shard):
            assert sorted(files) == ["cls", "raw"]
            records.append((key, int(files["cls"]), audit.tensor_digest(pixels_to_tensor(files["raw"]))))
    reference = audit.reference_digests([s.key for s in small_manifest], small_root)
    result = audit.audit_epoch(records, small_manifest, reference)
    assert result.ok and result.pixels_checked == len(small_manifest), result.summary()
    assert _no_partials(tmp_path)


def test_a_second_run_skips_every_finished_shard(input_shards, tmp_path):
    map_shards(to_raw_pixels, input_shards[:2], tmp_path, processes=1, progress=False)
    before = {p.name: p.read_bytes() for p in tmp_path.glob("*.tar")}
    report = map_shards(to_raw_pixels, input_shards, tmp_path, processes=2, progress=False)
    assert report.skipped == 2 and report.images == 40
    assert all((tmp_path / name).read_bytes() == data for name, data in before.items())


KILLABLE_RUN = textwrap.dedent(
    """
    import sys
    import time

    from packlab.preprocess import map_shards, to_raw_pixels


    def slow_raw_pixels(sample):
        time.sleep(0.1)  # slow enough that the test can kill the run in the middle of a shard
        return to_raw_pixels(sample)


    if __name__ == "__main__":
        map_shards(slow_raw_pixels, sys.argv[2:], sys.argv[1], processes=2, progress=False)
    """
)


def test_a_run_killed_midway_and_resumed_writes_the_same_bytes(input_shards, tmp_path):
    uninterrupted = tmp_path / "uninterrupted"
    map_shards(to_raw_pixels, input_shards, uninterrupted, processes=1, progress=False)

    killed = tmp_path / "killed"
    script = tmp_path / "killable_run.py"
    script.write_text(KILLABLE_RUN)
    run = subprocess.Popen(
        [sys.executable, str(script), str(killed), *map(str, input_shards)],
        cwd=paths.repo_root(), start_new_session=True,  # its own process group, pool workers included
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and run.poll() is None:
            done = list(killed.glob("*.tar")) if killed.is_dir() else []
            if done and not _no_partials(killed):
                break  # at least one shard finished and another is half-written
            time.sleep(0.05)
        else:
            pytest.fail(f"the run {'ended' if run.poll() is not None else 'did not get far enough'} before it could be killed midway")
        os.killpg(run.pid, signal.SIGKILL)  # the whole job at once, as a scheduler's time limit does
    finally:
        run.wait(30)
    # The pool's workers die with the group, but on a busy machine one may still be on its way out
    # when the parent has been reaped: wait until no process of the group is left, so that nothing
    # of the killed run writes after the resumed run has started.
    deadline = time.monotonic() + 30
    while _running_in_group(run.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    finished_before_kill = {p.name for p in killed.glob("*.tar")}
    assert 0 < len(finished_before_kill) < len(input_shards)
    assert not _no_partials(killed), "expected the kill to leave a half-written shard under its temporary name"

    report = map_shards(to_raw_pixels, input_shards, killed, processes=2, progress=False)
    assert report.skipped == len(finished_before_kill)
    assert report.removed_partials, "the resumed run should remove what the killed one left behind"
    assert _no_partials(killed)
    for shard in input_shards:
        assert (killed / shard.name).read_bytes() == (uninterrupted / shard.name).read_bytes(), shard.name


@pytest.mark.parametrize("processes", [1, 2])
def test_a_truncated_input_shard_is_named_and_nothing_half_written_remains(input_shards, tmp_path, processes):
    bad = tmp_path / "in" / "shard-000099.tar"
    bad.parent.mkdir()
    bad.write_bytes(input_shards[0].read_bytes()[:5000])
    out = tmp_path / "out"
    with pytest.raises(PreprocessError, match=str(bad)) as caught:
        map_shards(to_raw_pixels, [input_shards[1], bad], out, processes=processes, progress=False)
    assert "truncated" in str(caught.value)
    assert not (out / bad.name).exists()
    assert _no_partials(out)
    if processes == 1:  # in order: the good shard before the bad one is finished and kept
        assert (out / input_shards[1].name).exists()


def test_a_failing_per_sample_function_names_the_sample(input_shards, tmp_path):
    with pytest.raises(PreprocessError, match=r"shard-0000\d\d\.tar:\d+7\.jpg.*ValueError: cannot handle this one"):
        map_shards(_fails_on_sample, input_shards, tmp_path, processes=1, progress=False)
    assert _no_partials(tmp_path)
    with pytest.raises(PreprocessError, match="dict of extension -> bytes"):
        map_shards(_returns_text, input_shards[:1], tmp_path / "text", processes=1, progress=False)


def test_bad_arguments_are_refused_before_any_work(input_shards, tmp_path):
    with pytest.raises(PreprocessError, match="nowhere.tar"):
        map_shards(to_raw_pixels, [tmp_path / "nowhere.tar"], tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match="one output per input"):
        map_shards(to_raw_pixels, input_shards[:2], [tmp_path / "a.tar"], progress=False)
    with pytest.raises(ValueError, match="overwrite its input"):
        map_shards(to_raw_pixels, input_shards[:1], input_shards[0].parent, progress=False)


def test_resized_jpeg_shards_are_read_by_the_tar_loader(input_shards, small_manifest, tmp_path):
    map_shards(to_resized_jpeg, input_shards, tmp_path, processes=2, progress=False)
    dataset = TarShardDataset(sorted(str(p) for p in tmp_path.glob("*.tar")), return_key=True)
    batches = list(DataLoader(dataset, batch_size=16))
    assert audit.audit_epoch(audit.records_from_batches(batches, with_pixels=False), small_manifest).ok
    assert tuple(batches[0][0].shape[1:]) == (3, 256, 256)
    resized = sum(p.stat().st_size for p in tmp_path.glob("*.tar"))
    assert resized < sum(p.stat().st_size for p in input_shards)

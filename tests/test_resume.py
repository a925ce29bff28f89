"""Checkpoint and resume mid-epoch: every sample exactly once over the runs, killed or stopped anywhere.

* :class:`packlab.resume.ShardStream` delivers what ``shuffle_buffer`` delivers, and a
  state taken between any two samples goes on with exactly the rest;
* ``TarShardDataset`` through torchdata's ``StatefulDataLoader``: a loop killed with
  SIGKILL at three points, under ``fork`` and ``spawn``, and one stopped with SIGTERM
  (checkpoint on the way out), each resumed in a new process: the keys the checkpoints
  record are the uninterrupted run's, in its order;
* another worker count or another number of ranks after the stop: ``StatefulDataLoader``
  refuses the state, the epoch state re-split over the new readers keeps exactly once.
"""

from __future__ import annotations

import random
import signal
from collections import Counter

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from packlab import pack, preemption, resume
from packlab.loaders.tar import (
    ShardOpener,
    TarShardDataset,
    iter_shard_samples,
    read_sample_spans,
    shuffle_buffer,
    skip_decode,
)

BATCH = 4


@pytest.fixture(scope="module")
def shards(small_manifest, small_root, tmp_path_factory):
    """The 60 samples in 6 shards of 10 (2 or 3 ranks, up to 3 workers each, all get shards)."""
    folder = tmp_path_factory.mktemp("resume-shards")
    return [str(p) for p in pack.write_tar_shards(folder, root=small_root, maxcount=10, progress=False)]


def _dataset(shards, **options):
    options = {"shuffle_buffer": 10, "seed": 5, "transform": skip_decode, "return_key": True, **options}
    return TarShardDataset(shards, **options)


def _keys(loader, stop_after=None):
    keys = []
    for step, (_, _, batch) in enumerate(loader, start=1):
        keys += list(batch)
        if step == stop_after:
            break
    return keys


def _ranged(shard, begin=0, end=None):
    """The span reader TarShardDataset uses with its default opener: byte offsets known, ranged reads."""
    return read_sample_spans(shard, ShardOpener(), begin, end)


def _from_start(shard, begin=0, end=None):
    """A span reader that knows no byte offsets (an opener without open_from): resumes read from byte 0."""
    assert begin == 0 and end is None
    return ((sample, None, None) for sample in iter_shard_samples(shard))


def test_the_stream_delivers_what_the_shuffle_buffer_delivers(shards):
    samples = lambda: (s for shard in shards for s in iter_shard_samples(shard))  # noqa: E731
    expected = [s.key for s in shuffle_buffer(samples(), 10, random.Random("x"))]
    stream = resume.ShardStream([resume.Piece(s) for s in shards], _ranged, 10, random.Random("x"))
    assert [s.key for s in stream] == expected


@pytest.mark.parametrize("reader", [_ranged, _from_start], ids=["by-offset", "from-byte-0"])
@pytest.mark.parametrize("buffer", [0, 10, 100])
def test_a_state_taken_between_any_two_samples_goes_on_with_exactly_the_rest(shards, buffer, reader):
    pieces = [resume.Piece(s) for s in shards]
    whole = [s.key for s in resume.ShardStream(pieces, reader, buffer, random.Random(1))]
    for stop in range(0, len(whole) + 1, 3):
        stream = resume.ShardStream(pieces, reader, buffer, random.Random(1))
        first = [next(stream).key for _ in range(stop)]
        state = stream.state()
        stream.close()
        rest = [s.key for s in resume.ShardStream.restore(state, reader)]
        assert first + rest == whole, f"stopped after {stop}"
        left = resume.pieces_left(state)
        again = [s.key for p in left for _, s, _, _ in resume.read_piece(p, reader)]
        assert sorted(again) == sorted(rest)


@pytest.mark.parametrize("reader", [_ranged, _from_start], ids=["by-offset", "from-byte-0"])
def test_a_shard_that_changed_since_the_state_is_reported(shards, reader):
    stream = resume.ShardStream([resume.Piece(s) for s in shards], reader, 10, random.Random(0))
    for _ in range(12):
        next(stream)
    state = stream.state()
    stream.close()
    state["buffer"][0][2] = "not-the-key"
    with pytest.raises(resume.ResumeError, match="changed since the state was saved"):
        resume.ShardStream.restore(state, reader)


#: Bytes a reader reads at a shard's end besides its samples: tar's end-of-archive marker, two blocks of zeros.
END_MARKER = 1024


def _stopped_state(shards, stop: int, **options) -> tuple[list[str], dict]:
    """A reader in this process stopped after ``stop`` samples: the keys it delivered, and its state."""
    dataset = _dataset(shards, **options)
    items = iter(dataset)
    first = [next(items)[2] for _ in range(stop)]
    state = dataset.state_dict()
    items.close()
    return first, state


@pytest.mark.parametrize("stop", [7, 26, 43])
def test_a_resume_reads_the_bytes_of_the_samples_it_still_needs_and_no_more(shards, stop):
    """Counted at the opener: after the resume, every byte read belongs to a sample delivered after it.

    The allowance beyond the samples' own bytes (their tar headers included) is the end-of-archive
    marker of each shard read to its end. The same state resumed with an opener that cannot read
    ranges reads its shards from byte 0, and reads more.
    """
    sizes = {sample.key: end - begin for shard in shards for sample, begin, end in read_sample_spans(shard)}
    whole = [key for _, _, key in _dataset(shards)]
    first, state = _stopped_state(shards, stop)
    counting = resume.CountingOpener(ShardOpener())
    again = _dataset(shards, opener=counting)
    again.load_state_dict(state)
    rest = [key for _, _, key in again]
    assert first + rest == whole
    ends_read = len(state["stream"]["pieces"]) - state["stream"]["next_piece"]  # shards read to their end
    allowed = sum(sizes[key] for key in rest) + END_MARKER * ends_read
    assert counting.bytes <= allowed, f"{counting}: {counting.bytes - allowed:,} bytes more than the samples still needed"
    account = resume.resume_reads(state["stream"])
    assert account["needed"] == sum(sizes[key] for _, _, key, _, _ in state["stream"]["buffer"])
    plain = resume.CountingOpener(lambda name: open(name, "rb"))  # no open_from: a resume from byte 0
    from_start = _dataset(shards, opener=plain)
    from_start.load_state_dict(state)
    assert [key for _, _, key in from_start] == rest
    # What the state's account says the resume from byte 0 reads again, it did (and a little more: to know
    # that a sample is complete, a tar reader reads the next member's header, or the end-of-archive marker).
    again_read = plain.bytes - counting.bytes
    assert account["from_start"] - account["by_offset"] <= again_read <= (
        account["from_start"] - account["by_offset"] + account["shards_from_start"] * max(sizes.values()))


class _RangeHandler:
    """A handler for http.server that serves files with or without ``Range: bytes=a-b`` (``ranges`` on the server)."""

    @staticmethod
    def make(directory: str, ranges: bool):
        import http.server
        import re

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=directory, **kwargs)

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
                if not (ranges and wanted):
                    return super().do_GET()
                data = open(self.translate_path(self.path), "rb").read()
                begin, end = int(wanted[1]), int(wanted[2]) + 1 if wanted[2] else len(data)
                self.send_response(206)
                self.send_header("Content-Length", str(end - begin))
                self.send_header("Content-Range", f"bytes {begin}-{end - 1}/{len(data)}")
                self.end_headers()
                self.wfile.write(data[begin:end])

        return Handler


@pytest.fixture(params=[True, False], ids=["ranges", "no-ranges"])
def web_shards(shards, request):
    """The shards as http:// URLs, from a server that does (or does not) answer range requests."""
    import http.server
    import threading
    from pathlib import Path

    folder = str(Path(shards[0]).parent)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler.make(folder, request.param))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield [f"http://127.0.0.1:{server.server_port}/{Path(s).name}" for s in shards], request.param
    finally:
        server.shutdown()
        thread.join(10)


def test_over_http_a_resume_uses_range_requests_and_a_server_without_them_is_named(web_shards):
    urls, ranges = web_shards
    whole = [key for _, _, key in _dataset(urls)]
    first, state = _stopped_state(urls, 26)
    counting = resume.CountingOpener(ShardOpener())
    again = _dataset(urls, opener=counting)
    again.load_state_dict(state)
    if not ranges:
        with pytest.raises(Exception, match="ignored the range request"):
            list(again)
        return
    rest = [key for _, _, key in again]
    assert first + rest == whole
    sizes = {sample.key: end - begin for url in urls for sample, begin, end in read_sample_spans(url, ShardOpener())}
    read_to_the_end = len(state["stream"]["pieces"]) - state["stream"]["next_piece"]
    assert counting.bytes <= sum(sizes[key] for key in rest) + END_MARKER * read_to_the_end, counting


def test_a_ranged_resume_refuses_a_shard_rewritten_since_the_state(shards, tmp_path):
    copies = [tmp_path / f"{i}.tar" for i in range(len(shards))]
    for source, copy in zip(shards, copies):
        copy.write_bytes(open(source, "rb").read())
    _, state = _stopped_state([str(c) for c in copies], 26)
    buffered_shard = state["stream"]["pieces"][state["stream"]["buffer"][0][0]][0]
    data = bytearray(open(buffered_shard, "rb").read())
    data[:512] = bytes(512)  # another first member: every offset after it is off
    open(buffered_shard, "wb").write(bytes(data[512:]))
    again = _dataset([str(c) for c in copies])
    again.load_state_dict(state)
    with pytest.raises(resume.ResumeError, match="changed since the state was saved"):
        list(again)


@pytest.mark.parametrize("workers, method", [(0, None), (2, "fork")])
def test_stateful_dataloader_resumes_in_the_uninterrupted_order(shards, workers, method):
    options = dict(batch_size=BATCH, num_workers=workers, multiprocessing_context=method)
    whole = _keys(StatefulDataLoader(_dataset(shards), **options))
    assert sorted(whole) == sorted(s for shard in shards for s in (x.key for x in iter_shard_samples(shard)))
    loader = StatefulDataLoader(_dataset(shards), **options)
    first = _keys(loader, stop_after=5)
    state = loader.state_dict()
    del loader
    again = StatefulDataLoader(_dataset(shards), **options)
    again.load_state_dict(state)
    assert first + _keys(again) == whole


@pytest.mark.parametrize("worker_counts", [(2,), (2, 3, 1)], ids=["same-workers", "workers-change"])
def test_runs_stopped_after_one_batch_each_still_go_through_the_epoch_once(shards, worker_counts):
    """Every run delivers one batch, then is checkpointed and resumed by a new loader.

    torchdata asks a resumed worker for its state before its first sample and keeps that
    answer until the worker delivers a batch; the worker that delivered nothing in a run must
    be saved where it was loaded, not at the epoch's start. (A Slurm job whose warning
    signal came during start-up, run after run, trained 72 samples twice and 24 three times.)
    """
    options = dict(batch_size=BATCH, multiprocessing_context="fork")
    whole = _keys(StatefulDataLoader(_dataset(shards), num_workers=2, **options))
    keys, state, saved_workers = [], None, None
    for run in range(2 * len(whole) // BATCH):  # one batch per run: 15 runs; twice that means no progress
        workers = worker_counts[run % len(worker_counts)]
        dataset = _dataset(shards)
        loader = StatefulDataLoader(dataset, num_workers=workers, **options)
        if state is not None and workers == saved_workers:
            loader.load_state_dict(state)
        elif state is not None:
            dataset.load_state_dict(resume.epoch_state(state))
        got = _keys(loader, stop_after=1)
        if not got:
            break
        keys += got
        state, saved_workers = loader.state_dict(), workers
        del loader
    counts = Counter(keys)
    assert len(counts) == len(whole) and set(counts.values()) == {1}, f"{run + 1} runs: {Counter(counts.values())}"
    if worker_counts == (2,):
        assert keys == whole  # and in the uninterrupted order


def test_the_main_process_dataset_knows_nothing_of_what_workers_read(shards):
    dataset = _dataset(shards)
    loader = StatefulDataLoader(dataset, batch_size=BATCH, num_workers=2, multiprocessing_context="fork")
    _keys(loader, stop_after=5)
    assert dataset.state_dict()["stream"] is None  # the workers' positions are in loader.state_dict() only
    workers = resume.reader_states(loader.state_dict())
    assert [w["worker_id"] for w in workers] == [0, 1] and all(w["stream"]["delivered"] > 0 for w in workers)


@pytest.mark.parametrize("after", [1, 3])
def test_another_worker_count_is_refused_by_stateful_dataloader_and_works_through_the_epoch_state(shards, after):
    options = dict(batch_size=BATCH, multiprocessing_context="fork")
    loader = StatefulDataLoader(_dataset(shards), num_workers=2, **options)
    first = _keys(loader, stop_after=5)
    state = loader.state_dict()
    del loader
    refusing = StatefulDataLoader(_dataset(shards), num_workers=after, **options)
    refusing.load_state_dict(state)
    with pytest.raises(AssertionError):
        next(iter(refusing))
    dataset = _dataset(shards)
    dataset.load_state_dict(resume.epoch_state(state))
    rest = _keys(StatefulDataLoader(dataset, num_workers=after, **options))
    counts = Counter(first + rest)
    assert len(counts) == 60 and set(counts.values()) == {1}


def test_another_number_of_ranks_keeps_exactly_once(shards):
    """Two ranks stop after 3 steps each; one rank (then three) read what is left."""
    def rank_loader(rank, world_size, dataset=None):
        dataset = dataset or _dataset(shards, rank=rank, world_size=world_size)
        return StatefulDataLoader(dataset, batch_size=BATCH, num_workers=1, multiprocessing_context="fork")

    loaders = [rank_loader(r, 2) for r in range(2)]
    first = [k for loader in loaders for k in _keys(loader, stop_after=3)]
    saved = resume.epoch_state(*(loader.state_dict() for loader in loaders))
    for world_size in (1, 3):
        rest = []
        for rank in range(world_size):
            dataset = _dataset(shards, rank=rank, world_size=world_size)
            dataset.load_state_dict(saved)
            rest += _keys(rank_loader(rank, world_size, dataset))
        counts = Counter(first + rest)
        assert len(counts) == 60 and set(counts.values()) == {1}, f"2 ranks -> {world_size}"


def test_an_epoch_state_missing_a_rank_is_refused(shards):
    loaders = [StatefulDataLoader(_dataset(shards, rank=r, world_size=2), batch_size=BATCH) for r in range(2)]
    for loader in loaders:
        _keys(loader, stop_after=2)
    with pytest.raises(resume.ResumeError, match="every rank"):
        resume.epoch_state(loaders[0].state_dict())


# ------------------------------------------------------------- killed in another process


def _uninterrupted(shards, batch_size=8):
    return _keys(StatefulDataLoader(_dataset(shards, shuffle_buffer=50, seed=0), batch_size=batch_size, num_workers=2,
                                    multiprocessing_context="fork"))


def _record_the_mask(worker_id):
    """worker_init_fn: write this worker's blocked signals to a file named in the environment, then ignore them."""
    import os

    blocked = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    with open(f"{os.environ['PACKLAB_TEST_MASKS']}-{worker_id}", "w") as f:
        f.write(" ".join(map(str, blocked)))
    preemption.ignore_stop_signals(worker_id)


def test_spawn_workers_start_with_the_stop_signals_blocked(tmp_path, monkeypatch):
    """Until its worker_init_fn runs, a signal to the group must not kill a spawn worker (a new interpreter for seconds).

    multiprocessing's resource tracker unblocks SIGTERM in the process that starts it: started
    inside the block, by the first spawn worker, it would let every worker start unprotected.
    """
    from torch.utils.data import DataLoader

    monkeypatch.setenv("PACKLAB_TEST_MASKS", str(tmp_path / "mask"))
    with preemption.stop_signals_held():
        batches = iter(DataLoader(list(range(8)), batch_size=2, num_workers=2, multiprocessing_context="spawn",
                                  worker_init_fn=_record_the_mask, timeout=300))
    assert len(list(batches)) == 4
    wanted = {int(signal.SIGTERM), int(signal.SIGUSR1)}
    for worker in range(2):
        blocked = {int(n) for n in (tmp_path / f"mask-{worker}").read_text().split()}
        assert wanted <= blocked, f"worker {worker} started with {sorted(blocked)} blocked"
    assert not wanted & set(signal.pthread_sigmask(signal.SIG_BLOCK, [])), "the block outlived the start-up"


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_loop_signalled_at_random_moments_checkpoints_and_resumes_with_every_sample_once(shards, tmp_path, method):
    """A chain of runs of ``python -m packlab.preemption``, each stopped at a random moment, none paused.

    SIGTERM to the whole process group (the loop and its DataLoader workers, as a scheduler that
    signals the whole job sends it) once while the loop is still starting, once mid-epoch; SIGKILL
    to the group; SIGTERM to the loop alone; then a run to the end. Every SIGTERM must end its run
    with status 3 and a checkpoint of the step it stopped at (no worker killed, no error); the
    final record must be the uninterrupted epoch, sample for sample and in its order.
    """
    rng = random.Random()
    checkpoint = tmp_path / "checkpoint.pt"
    arguments = ["--shards", pack.brace_pattern(shards), "--checkpoint", checkpoint, "--workers", 2,
                 "--start-method", method, "--batch-size", 4, "--every", 2, "--step-seconds", 0.2]
    stops = [("SIGTERM to the group while starting", signal.SIGTERM, True, 0, rng.uniform(0, 3)),
             ("SIGTERM to the group mid-epoch", signal.SIGTERM, True, 1, rng.uniform(0, 0.4)),
             ("SIGKILL to the group", signal.SIGKILL, True, 1, rng.uniform(0, 0.4)),
             ("SIGTERM to the loop alone", signal.SIGTERM, False, 1, rng.uniform(0, 0.4))]
    log = []
    for run, (what, number, group, after_step, delay) in enumerate(stops, start=1):
        status, output, step = preemption.run_and_interrupt(arguments, delay, number, group, after_step)
        log.append(f"run {run}: {what} {delay:.2f} s after step {after_step}: status {status}")
        where = "\n".join(log) + "\n" + output[-3000:]
        assert "killed by signal" not in output and "Traceback" not in output, where
        if status == 0:  # the epoch ended before the moment came
            break
        saved = torch.load(checkpoint, weights_only=True)
        if number == signal.SIGKILL:
            assert status == -signal.SIGKILL, where
            continue
        assert status == preemption.STOPPED_EXIT_CODE, where
        stopped_at = int(output.split("signal 15 at step ")[1].split(":")[0])
        assert saved["step"] == stopped_at and not saved["done"], where  # written on the way out
    status, output = preemption.run_to_end(arguments)
    assert status == 0, output
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["done"], output
    assert saved["keys"] == _uninterrupted(shards, batch_size=4), "\n".join(log)


def test_a_loop_resumed_with_another_worker_count_keeps_exactly_once(shards, tmp_path):
    checkpoint = tmp_path / "checkpoint.pt"
    arguments = ["--shards", pack.brace_pattern(shards), "--checkpoint", checkpoint, "--batch-size", 8]
    status, output = preemption.run_and_stop([*arguments, "--workers", 2], 3, signal.SIGTERM)
    assert status == preemption.STOPPED_EXIT_CODE, output
    status, output = preemption.run_to_end([*arguments, "--workers", 3])
    assert status == 0 and "2 -> 3 workers" in output, output
    counts = Counter(torch.load(checkpoint, weights_only=True)["keys"])
    assert len(counts) == 60 and set(counts.values()) == {1}


# ------------------------------------------------------------------ map-style datasets


def test_a_map_style_loader_resumes_its_sampler_exactly_once_and_in_order():
    keys = [f"k{i:03d}" for i in range(100)]
    whole = _keys(resume.map_style_loader(keys, batch_size=BATCH, workers=2))
    before, after = resume.stop_and_resume(lambda: resume.map_style_loader(keys, batch_size=BATCH, workers=2), 7)
    assert before + after == whole and sorted(whole) == keys


@pytest.mark.parametrize("resumed_epoch, once", [(1, True), (0, False)])
def test_the_distributed_sampler_resumes_only_in_the_epoch_it_was_saved_in(resumed_epoch, once):
    """StatefulDistributedSampler's state is how many indices it yielded: the epoch must be set again first."""
    keys = [f"k{i:03d}" for i in range(100)]
    seen = []
    for rank in range(2):
        stopped = resume.map_style_loader(keys, batch_size=BATCH, workers=0, rank=rank, world_size=2, epoch=1)
        seen += _keys(stopped, stop_after=3)
        again = resume.map_style_loader(keys, batch_size=BATCH, workers=0, rank=rank, world_size=2, epoch=resumed_epoch)
        again.load_state_dict(stopped.state_dict())
        seen += _keys(again)
    counts = Counter(seen)
    assert (len(counts) == 100 and set(counts.values()) == {1}) == once


def test_a_state_of_an_older_layout_is_refused_with_the_versions(shards):
    _, state = _stopped_state(shards, 5)
    dataset = _dataset(shards)
    with pytest.raises(resume.ResumeError, match="layout version 1, this packlab reads version 2"):
        dataset.load_state_dict({**state, "version": 1})
    with pytest.raises(resume.ResumeError, match="not a TarShardDataset state"):
        dataset.load_state_dict({"something": "else"})

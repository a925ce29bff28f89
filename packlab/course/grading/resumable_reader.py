"""Checks of exercise 11 (``11_resumable_reader``): a shard reader whose position survives a kill.

The candidate is an ``IterableDataset`` class ``ResumableShardReader(shards,
shuffle_buffer=0, seed=0, transform=None, return_key=False)`` with ``state_dict()`` and
``load_state_dict(state)``. Every part reads through torchdata's ``StatefulDataLoader``,
which calls ``state_dict()`` in whichever process reads (the main process, or each
worker) after every batch and hands each reader its own state back on resume. A part
stops an epoch after some batches, takes ``loader.state_dict()``, and reads the rest with
a new dataset and a new loader that loaded it; the two parts of the epoch together must
hold every sample exactly once (SHA-256 of the JPEG bytes against the manifest), and in
the order of an uninterrupted epoch. One part chains runs of one batch each with two
workers, so that in every run one worker delivers nothing and is saved with the answer its
``state_dict()`` gave right after ``load_state_dict()``. The last two parts cross a real kill: the
epoch runs in a child process (and its DataLoader workers, ``fork`` or ``spawn``), which
saves ``loader.state_dict()`` with ``torch.save`` after every batch and is killed with
SIGKILL, process group and all; the rest is read from the saved file.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch

from packlab.course.grading.core import Context, PartFailed, attempt, describe, register
from packlab.course.grading.fixtures import (
    fixture_shards,
    image_digest,
    preflight_spawn,
    sha256_transform,
    sha_reference,
    subset,
)

BATCH = 8


def _fixtures() -> dict:
    samples = subset(96, seed=11)
    shards = fixture_shards("resumable-96-12", samples, maxcount=12)
    return {"samples": samples, "shards": [str(p) for p in shards], "sha": sha_reference(samples)}


def _dataset(ctx: Context, cls=None, **options):
    cls = cls or ctx.candidate
    options = {"shuffle_buffer": 0, "seed": 0, "transform": sha256_transform, "return_key": True, **options}
    return attempt(cls, ctx.name, ctx.fixtures["shards"], **options)


def _loader(ctx: Context, dataset, workers: int = 0, method: str | None = None, batch_size: int = BATCH):
    from torchdata.stateful_dataloader import StatefulDataLoader

    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    options = {"batch_size": batch_size}
    if workers:
        options.update(num_workers=workers, multiprocessing_context=method,
                       timeout=ctx.loader_timeout + (ctx.startup_timeout if method != "fork" else 0))
    return StatefulDataLoader(dataset, **options)


def _read(ctx: Context, loader, stop_after: int | None = None, what: str = "the epoch") -> list[str]:
    """The keys of ``loader``'s batches (up to ``stop_after`` batches), each digest checked against the manifest."""
    keys: list[str] = []
    limit = 3 * len(ctx.fixtures["samples"]) + 64
    try:
        for step, batch in enumerate(loader, start=1):
            if not (isinstance(batch, (tuple, list)) and len(batch) == 3):
                raise PartFailed("with return_key=True every sample must be (image, label, key)")
            images, _, batch_keys = batch
            for image, key in zip(images, batch_keys):
                if image_digest(image, "sha256") != ctx.fixtures["sha"].get(str(key)):
                    raise PartFailed(f"{what}: sample {key} does not hold its JPEG's bytes (or is not in the shards)")
                keys.append(str(key))
            if len(keys) > limit:
                raise PartFailed(f"{what} delivered more than {limit} samples and did not end")
            if step == stop_after:
                break
    except PartFailed:
        raise
    except Exception as exc:
        raise PartFailed(f"reading {what} raised {describe(exc)}") from exc
    return keys


def _state(ctx: Context, loader) -> dict:
    try:
        return loader.state_dict()
    except Exception as exc:
        raise PartFailed(f"loader.state_dict(), which calls your state_dict() in every reader, raised {describe(exc)}") from exc


def _resumed(ctx: Context, state: dict, workers: int = 0, method: str | None = None, cls=None, **options):
    loader = _loader(ctx, _dataset(ctx, cls, **options), workers, method)
    try:
        loader.load_state_dict(state)
    except Exception as exc:
        raise PartFailed(f"loader.load_state_dict(saved) raised {describe(exc)}") from exc
    return _read(ctx, loader, what="the resumed epoch")


def _exactly_once(ctx: Context, first: list[str], rest: list[str], where: str) -> None:
    expected = {s.key for s in ctx.fixtures["samples"]}
    counts = Counter(first + rest)
    twice = sorted(k for k, n in counts.items() if n > 1)
    missing = sorted(expected - set(counts))
    if twice or missing:
        problems = []
        if twice:
            again = sum(1 for k in twice if k in set(first))
            problems.append(f"{len(twice)} samples came twice (e.g. {twice[0]}; {again} of them before the stop and again "
                            "after it): the saved position is behind what was delivered")
        if missing:
            problems.append(f"{len(missing)} samples never came (e.g. {missing[0]})")
        raise PartFailed(f"{where}: {len(first)} samples before the stop, {len(rest)} after; " + "; ".join(problems))


def _sample_granularity(ctx: Context) -> str:
    loader = _loader(ctx, _dataset(ctx), batch_size=5)
    first = _read(ctx, loader, stop_after=3)
    rest = _resumed(ctx, _state(ctx, loader))
    _exactly_once(ctx, first, rest, "no workers, no shuffle, stopped after 3 batches of 5")
    whole = _read(ctx, _loader(ctx, _dataset(ctx)))
    if first + rest != whole:
        raise PartFailed("every sample came once, but not in the shards' order: resume where the stream stopped")
    return f"stopped after {len(first)} samples (not a multiple of 8), resumed: the other {len(rest)}, each once, in order"


def _buffer(ctx: Context) -> str:
    loader = _loader(ctx, _dataset(ctx, shuffle_buffer=20))
    first = _read(ctx, loader, stop_after=3)
    rest = _resumed(ctx, _state(ctx, loader), shuffle_buffer=20)
    try:
        _exactly_once(ctx, first, rest, "shuffle_buffer=20, stopped after 3 batches")
    except PartFailed as exc:
        raise PartFailed(f"{exc}. The samples sitting in the shuffle buffer at the stop were read from the shards but "
                         "not delivered: the state must bring them back (save where they came from, or replay)") from None
    return f"shuffle_buffer=20: {len(first)} + {len(rest)} samples, each once, buffer included"


def _same_order(ctx: Context) -> str:
    whole = _read(ctx, _loader(ctx, _dataset(ctx, shuffle_buffer=20)))
    loader = _loader(ctx, _dataset(ctx, shuffle_buffer=20))
    first = _read(ctx, loader, stop_after=3)
    rest = _resumed(ctx, _state(ctx, loader), shuffle_buffer=20)
    if first + rest != whole:
        same = next((i for i, (a, b) in enumerate(zip(first + rest, whole)) if a != b), len(whole))
        raise PartFailed(
            f"the stopped and resumed epoch differs from an uninterrupted one from sample {same} on "
            f"({len(first)} came before the stop): the order after a resume must follow from the state (the buffer's "
            "random generator included), or a restarted run is not the run it replaces"
        )
    again = _read(ctx, _loader(ctx, _dataset(ctx, shuffle_buffer=20)))
    if again != whole:
        raise PartFailed("two uninterrupted epochs with the same seed came in different orders: seed every random choice")
    return "stopped and resumed, the epoch comes in the uninterrupted order"


def _one_batch_per_run(ctx: Context) -> str:
    """Runs of one batch each with 2 fork workers: each loads the last run's state, reads a batch and saves."""
    batches = -(-len(ctx.fixtures["samples"]) // BATCH)
    keys: list[str] = []
    state = None
    for run in range(1, 2 * batches + 1):
        loader = _loader(ctx, _dataset(ctx), workers=2, method="fork")
        if state is not None:
            try:
                loader.load_state_dict(state)
            except Exception as exc:
                raise PartFailed(f"run {run}: loader.load_state_dict(saved) raised {describe(exc)}") from exc
        batch = _read(ctx, loader, stop_after=1, what=f"run {run}")
        if not batch:
            break
        state = _state(ctx, loader)
        del loader
        again = sorted(set(keys) & set(batch))
        if again:
            raise PartFailed(
                f"run {run} delivered {len(again)} samples an earlier run had (e.g. {again[0]}). In each run one "
                "worker delivers a batch and the other nothing; torchdata asked that other worker for its "
                "state_dict() right after load_state_dict(), before it read, and saved the answer: before reading, "
                "return the state you were loaded with, not 'nothing delivered'")
        keys += batch
    else:
        raise PartFailed(f"{2 * batches} runs of one batch each did not reach the end of the epoch")
    _exactly_once(ctx, keys, [], f"{run - 1} runs of one batch each")
    return f"{run - 1} runs of one batch each, 2 fork workers: {len(keys)} samples, each once"


# ------------------------------------------------------------------------ killed for real


def _run_until_killed(cls, shards: list[str], checkpoint: str, failure: str, workers: int, method: str,
                      stop_after: int, timeout: float) -> None:
    """Body of the child that is killed: read batches, save ``loader.state_dict()`` after each, then wait."""
    os.setpgid(0, 0)  # its own group: the kill takes the DataLoader workers too
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader

        warnings.filterwarnings("ignore")
        dataset = cls(shards, shuffle_buffer=0, seed=0, transform=sha256_transform, return_key=True)
        loader = StatefulDataLoader(dataset, batch_size=BATCH, num_workers=workers, multiprocessing_context=method,
                                    timeout=timeout)
        keys: list[str] = []
        for step, (_, _, batch) in enumerate(loader, start=1):
            keys += [str(k) for k in batch]
            partial = checkpoint + ".partial"
            torch.save({"keys": keys, "state": loader.state_dict()}, partial)
            os.replace(partial, checkpoint)
            if step == stop_after:
                Path(checkpoint + ".stopped").touch()
                while True:
                    time.sleep(1)
    except BaseException:  # noqa: BLE001 - reported to the part, which fails with it
        Path(failure).write_text(traceback.format_exc())
    os._exit(0)


def _killed(ctx: Context, method: str) -> str:
    cls = ctx.importable() if method == "spawn" else ctx.candidate
    if method == "spawn":
        preflight_spawn(_dataset(ctx, cls))
    folder = ctx.scratch(f"killed-{method}")
    checkpoint, failure = str(folder / "checkpoint.pt"), str(folder / "failure.txt")
    timeout = ctx.loader_timeout + ctx.startup_timeout
    child = multiprocessing.get_context("fork").Process(
        target=_run_until_killed, args=(cls, ctx.fixtures["shards"], checkpoint, failure, 2, method, 3, timeout))
    child.start()
    deadline = time.monotonic() + timeout
    try:
        while not Path(checkpoint + ".stopped").exists():
            if Path(failure).exists() or not child.is_alive():
                text = Path(failure).read_text() if Path(failure).exists() else f"exit code {child.exitcode}"
                last = [line for line in text.strip().splitlines() if line.strip()][-1]
                raise PartFailed(f"reading and saving loader.state_dict() with torch.save after each batch failed: {last}")
            if time.monotonic() > deadline:
                raise PartFailed(f"the first 3 batches with 2 {method} workers did not arrive within {timeout:.0f} s")
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.join(30)
    saved = torch.load(checkpoint, weights_only=False)
    rest = _resumed(ctx, saved["state"], workers=2, method=method, cls=cls)
    where = f"2 {method} workers, killed after 3 batches, resumed with 2 {method} workers"
    try:
        _exactly_once(ctx, saved["keys"], rest, where)
    except PartFailed as exc:
        raise PartFailed(f"{exc}. Each worker reads its own share and must save its own position: state_dict() runs "
                         "in the worker, on that worker's copy of the dataset; one count for the whole loader (in "
                         "the main process, or shared between workers) cannot say where each worker stopped") from None
    whole = _read(ctx, _loader(ctx, _dataset(ctx), workers=2, method="fork"))
    if saved["keys"] + rest != whole:
        raise PartFailed(f"{where}: every sample once, but not in the order of an uninterrupted epoch")
    return f"killed (SIGKILL) after {len(saved['keys'])} samples; the saved state gave the other {len(rest)}, each once"


register(
    "resumable_reader",
    "11_resumable_reader",
    "a tar shard reader whose state_dict() says where each reader stands, sample by sample, and survives a kill",
    "ResumableShardReader(shards, shuffle_buffer=0, seed=0, transform=None, return_key=False) with state_dict() "
    "and load_state_dict(state): an IterableDataset (worker w of W reads shards[w::W], through a shuffle buffer of "
    "shuffle_buffer) that, loaded with a state saved mid-epoch, delivers exactly the samples not yet delivered, in "
    "the uninterrupted order; read through torchdata's StatefulDataLoader",
    _fixtures,
    [
        ("sample_granularity", "stopped after 15 samples (3 batches of 5), no workers: the rest, each once, in order",
         "count delivered samples one by one, as each is yielded, not in batches or chunks of your own",
         _sample_granularity),
        ("buffer", "shuffle_buffer=20, stopped after 3 batches: the samples in the buffer are not lost",
         "the buffer's samples were read but not delivered: replay the stream and skip what was delivered, or save "
         "where each buffered sample came from", _buffer),
        ("same_order", "shuffle_buffer=20, stopped and resumed: the order of an uninterrupted epoch",
         "seed the buffer's generator from seed and worker id and replay it, or save its state (rng.getstate())",
         _same_order),
        ("one_batch_per_run", "2 fork workers, every run stopped after one batch and resumed from its state: "
         "the worker that delivered nothing keeps its loaded position", "before a resumed reader has read "
         "anything, state_dict() returns the state load_state_dict() gave it", _one_batch_per_run),
        ("killed_fork", "2 fork workers, SIGKILL after 3 batches, resumed from the saved file: each worker's own "
         "position, every sample once", "state_dict() runs in each worker: keep the position on the dataset object "
         "the worker iterates (self), per worker, not in a counter shared by all", functools.partial(_killed, method="fork")),
        ("killed_spawn", "2 spawn workers, SIGKILL after 3 batches, resumed: every sample once",
         "the state must be plain data (ints, strings, lists, dicts) that torch.save can write; keep the class and "
         "its imports in one cell", functools.partial(_killed, method="spawn")),
    ],
)

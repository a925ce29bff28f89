"""Checks of exercise 11 (``11_resumable_reader``): a shard reader whose position survives a kill.

The candidate is an ``IterableDataset`` class ``ResumableShardReader(shards,
shuffle_buffer=0, seed=0, transform=None, return_key=False)`` with ``set_epoch(epoch)``,
``state_dict()`` and ``load_state_dict(state)``. Every part reads through torchdata's ``StatefulDataLoader``,
which calls ``state_dict()`` in whichever process reads (the main process, or each
worker) after every batch and hands each reader its own state back on resume. A part
stops an epoch after some batches, takes ``loader.state_dict()``, and reads the rest with
a new dataset and a new loader that loaded it; the two parts of the epoch together must
hold every sample exactly once (SHA-256 of the JPEG bytes against the manifest), and in
the order of an uninterrupted epoch. One part chains runs of one batch each with two
workers, so that in every run one worker delivers nothing and is saved with the answer its
``state_dict()`` gave right after ``load_state_dict()``. Two parts cross a real kill: the
epoch runs in a child process (and its DataLoader workers, ``fork`` or ``spawn``), which
saves ``loader.state_dict()`` with ``torch.save`` after every batch and is killed with
SIGKILL, process group and all; the rest is read from the saved file. The epoch parts
resume a state taken at the end of epoch 0 with persistent workers and go on into epoch 1
(which must come whole, in epoch 1's own order), and give a state of epoch 0 to epoch 1
(which must be refused). The last part sends SIGTERM to the whole process group of a
training loop that checkpoints on SIGTERM, at a random moment of its third step (a long
one, while both workers, mid-share, prefetch): the workers must survive it (the loop, not
they, decides), and the checkpoint written on the way out must resume to the rest of the
epoch, every sample once (the order is the same_order part's business). The training loops
of these two parts start their workers through the candidate's ``start(loader)`` with its
``worker_init_fn``. The start-up part does the same with ``spawn`` workers, and the first
worker sends SIGTERM to the group itself while it unpickles the dataset, before torch's
worker loop and the ``worker_init_fn`` run: a point in every run, not a moment a loaded
machine could miss. A worker is protected there only if it was started with the signals
blocked.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import random
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


def _loader(ctx: Context, dataset, workers: int = 0, method: str | None = None, batch_size: int = BATCH,
            persistent: bool = False):
    from torchdata.stateful_dataloader import StatefulDataLoader

    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    options = {"batch_size": batch_size}
    if workers:
        options.update(num_workers=workers, multiprocessing_context=method, persistent_workers=persistent,
                       timeout=ctx.loader_timeout + (ctx.startup_timeout if method != "fork" else 0))
    return StatefulDataLoader(dataset, **options)


def _set_epoch(dataset, epoch: int) -> None:
    try:
        dataset.set_epoch(epoch)
    except Exception as exc:
        raise PartFailed(f"dataset.set_epoch({epoch}) raised {describe(exc)}") from exc


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
        raise PartFailed("every sample came once, but not in the stream's order: resume where the stream stopped")
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
        _write_failure(failure, traceback.format_exc())
    os._exit(0)


def _write_failure(path: str, text: str) -> None:
    """Write a child's failure whole or not at all: the grader polls for the file and reads it at once.

    A plain ``write_text`` creates the file before it writes, so a grader that looks in
    between reads nothing (CI's run of 30 Nov graded an untouched stub's
    NotImplementedError as an IndexError this way); a rename is atomic.
    """
    partial = path + ".partial"
    Path(partial).write_text(text)
    os.replace(partial, path)


def _last_line(path: str, otherwise: str) -> str:
    """The last non-blank line of a child's failure file (its exception), or ``otherwise`` without one."""
    text = Path(path).read_text() if Path(path).exists() else ""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else otherwise


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
                last = _last_line(failure, f"exit code {child.exitcode}")
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


# ------------------------------------------------------------------------------ epochs


def _epoch_order(ctx: Context, epoch: int) -> list[str]:
    """Epoch ``epoch`` read whole by a new loader (2 fork workers, a buffer of 20)."""
    dataset = _dataset(ctx, shuffle_buffer=20)
    _set_epoch(dataset, epoch)
    return _read(ctx, _loader(ctx, dataset, workers=2, method="fork"), what=f"epoch {epoch}")


def _two_epochs(ctx: Context) -> str:
    """A run stopped after the last batch of epoch 0, resumed with persistent workers, then epoch 1."""
    expected = {epoch: _epoch_order(ctx, epoch) for epoch in (0, 1)}
    if expected[0] == expected[1]:
        raise PartFailed("epochs 0 and 1 came in the same order: the stream must be drawn from the epoch "
                         "(stream(worker, workers, epoch) with the epoch set_epoch gave)")
    batches = -(-len(ctx.fixtures["samples"]) // BATCH) // 2 * 2  # every batch of the epoch, both workers'
    dataset = _dataset(ctx, shuffle_buffer=20)
    _set_epoch(dataset, 0)
    loader = _loader(ctx, dataset, workers=2, method="fork", persistent=True)
    first = _read(ctx, loader, stop_after=batches, what="epoch 0")
    state = _state(ctx, loader)
    del loader
    dataset = _dataset(ctx, shuffle_buffer=20)
    _set_epoch(dataset, 0)
    resumed = _loader(ctx, dataset, workers=2, method="fork", persistent=True)
    try:
        resumed.load_state_dict(state)
    except Exception as exc:
        raise PartFailed(f"loader.load_state_dict(saved) raised {describe(exc)}") from exc
    rest = _read(ctx, resumed, what="the rest of epoch 0 after the resume")
    _exactly_once(ctx, first, rest, "epoch 0, stopped after its last batch and resumed")
    _set_epoch(dataset, 1)
    try:
        second = _read(ctx, resumed, what="epoch 1 after the resume (the same persistent workers)")
    except PartFailed as exc:
        raise PartFailed(f"{exc}. A loaded state belongs to the pass it resumes: use it once") from None
    if second == expected[0][:len(second)] or second[:BATCH] == expected[0][:BATCH]:
        raise PartFailed("with persistent workers, epoch 1 came in epoch 0's order: set_epoch(1) in the training "
                         "process did not reach the workers, which keep the copy of the dataset they started with")
    _exactly_once(ctx, second, [], "epoch 1 after the resume, with persistent workers")
    if second != expected[1]:
        raise PartFailed("epoch 1 after the resume came in another order than a new loader's epoch 1: the resumed "
                         "state of epoch 0 must not change epoch 1")
    return (f"stopped after epoch 0's last batch ({len(first)} samples), resumed: {len(rest)} left, then epoch 1 "
            "whole, in its own order, with persistent workers")


def _other_epoch(ctx: Context) -> str:
    """A state saved in epoch 0 after 3 batches, given to a reader in epoch 1: it must be refused."""
    dataset = _dataset(ctx, shuffle_buffer=20)
    _set_epoch(dataset, 0)
    loader = _loader(ctx, dataset, batch_size=5)
    _read(ctx, loader, stop_after=3, what="epoch 0")
    state = _state(ctx, loader)
    later = _dataset(ctx, shuffle_buffer=20)
    _set_epoch(later, 1)
    resumed = _loader(ctx, later)
    try:
        resumed.load_state_dict(state)
        keys = [str(k) for batch in resumed for k in batch[2]]
    except Exception as exc:  # refused: what we want, with a message that says why
        if "epoch" not in str(exc).lower():
            raise PartFailed(f"a state of epoch 0 given to epoch 1 raised {describe(exc)}, which does not say that "
                             "the epochs differ: name both") from exc
        return f"a state of epoch 0 given to epoch 1 was refused: {str(exc)[:120]}"
    raise PartFailed(f"a state saved in epoch 0 (after 15 samples) was applied to epoch 1, which then delivered "
                     f"{len(keys)} of its {len(ctx.fixtures['samples'])} samples: the others were skipped although "
                     "nobody saw them. Keep the epoch in the state and refuse a state of another epoch")


# -------------------------------------------------------------- SIGTERM to the process group


STOPPED = 3  # the training loop's exit status after a checkpoint written on SIGTERM


class _SignalAtStart:
    """A transform that, unpickled in a spawn worker of ``loop``, sends SIGTERM to the worker's process group.

    Unpickling the dataset is part of a spawn worker's start: it comes after the new
    interpreter has imported what the dataset needs and before torch's worker loop, its
    signal handlers and the ``worker_init_fn``. Sent from there, the signal lands in that
    window in every run, however loaded the machine: no timing decides what is graded. Only
    the first worker to unpickle sends (``once`` is created exclusively), and only in a child
    of ``loop`` (the check's own copies of the dataset stay quiet).
    """

    def __init__(self, transform, once: str, loop: int):
        self.transform, self.once, self.loop = transform, once, loop

    def __call__(self, data: bytes, source=None):
        return self.transform(data, source)

    def __getstate__(self):
        return dict(vars(self))

    def __setstate__(self, state):
        vars(self).update(state)
        if os.getppid() != self.loop:
            return
        try:
            os.close(os.open(self.once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return
        os.killpg(os.getpgid(0), signal.SIGTERM)


def _train_until_signalled(cls, shards: list[str], checkpoint: str, failure: str, progress: str,
                           timeout: float, method: str = "fork", at_start: str | None = None) -> None:
    """Body of a training loop in a child process: 2 workers, a buffer of 20; SIGTERM -> checkpoint, exit 3.

    The workers start through the candidate's ``start(loader)`` with its ``worker_init_fn``.
    ``at_start``: a file name; the first spawn worker then signals the group while it starts
    (:class:`_SignalAtStart`), else the grader signals during the third step.
    """
    os.setpgid(0, 0)  # its own group: a signal to the group reaches the workers too
    stop = []
    signal.signal(signal.SIGTERM, lambda number, frame: stop.append(number))
    try:
        from multiprocessing import resource_tracker

        from torchdata.stateful_dataloader import StatefulDataLoader

        warnings.filterwarnings("ignore")
        # Started here, so that the grade does not depend on which process started it first (see
        # packlab.preemption.stop_signals_held: starting it unblocks SIGTERM in its starter).
        resource_tracker.ensure_running()
        transform = sha256_transform if at_start is None else _SignalAtStart(sha256_transform, at_start, os.getpid())
        dataset = cls(shards, shuffle_buffer=20, seed=0, transform=transform, return_key=True)
        loader = StatefulDataLoader(dataset, batch_size=BATCH, num_workers=2, multiprocessing_context=method,
                                    timeout=timeout, worker_init_fn=cls.worker_init_fn)
        keys: list[str] = []
        batches = cls.start(loader)
        for step, (_, _, batch) in enumerate(batches, start=1):
            keys += [str(k) for k in batch]
            Path(progress).write_text(str(step))
            # A long step (the model's compute) after the second: the workers, mid-share, keep prefetching
            # meanwhile, and the signal comes during it, however late a busy machine lets the grader send it.
            # Signalled at the workers' start, the loop checkpoints after its first step.
            until = time.monotonic() + (timeout if step == 2 and at_start is None else 0.05)
            while not stop and time.monotonic() < until:
                time.sleep(0.01)
            if stop:
                torch.save({"keys": keys, "state": loader.state_dict()}, checkpoint)
                _fail_if_a_worker_was_killed(batches)
                os._exit(STOPPED)
        _write_failure(failure, "the epoch ended before the signal came")
    except BaseException:  # noqa: BLE001 - reported to the part, which fails with it
        _write_failure(failure, traceback.format_exc())
    os._exit(1)


def _fail_if_a_worker_was_killed(batches, wait: float = 0.5) -> None:
    """Raise if a DataLoader worker of ``batches`` died of a signal (after ``wait`` s for a late death to show).

    A worker killed by the signal makes torch's SIGCHLD handler raise in the training loop,
    but only when the kernel has delivered SIGCHLD: a loop that writes its checkpoint and
    exits within milliseconds can be gone first. ``waitid`` with ``WNOWAIT`` looks without
    reaping, so torch's own check still sees the death.
    """
    time.sleep(wait)
    for worker in getattr(batches, "_workers", []):
        found = os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if found is not None and found.si_code == os.CLD_KILLED:
            raise RuntimeError(f"DataLoader worker (pid {worker.pid}) is killed by signal: "
                               f"{signal.Signals(found.si_status).name}")


def _stopped_and_resumed(ctx: Context, child, checkpoint: str, failure: str, what: str, killed: str):
    """Judge a signalled loop: it ended with status 3 after its checkpoint, and a resume reads the rest exactly once.

    ``killed`` is the message (with ``{last}``, the loop's last error line) for a loop that
    failed because the signal killed one of its workers. Returns (the checkpoint, the rest).
    """
    if Path(failure).exists():
        last = _last_line(failure, f"exit code {child.exitcode}")
        if "killed by signal" in last or "exited unexpectedly" in last:
            raise PartFailed(killed.format(last=last))
        raise PartFailed(f"the training loop failed: {last}")
    if child.exitcode != STOPPED:
        raise PartFailed(f"the training loop ended with status {child.exitcode}, not {STOPPED} after its checkpoint")
    saved = torch.load(checkpoint, weights_only=False)
    rest = _resumed(ctx, saved["state"], workers=2, method="fork", shuffle_buffer=20)
    _exactly_once(ctx, saved["keys"], rest, what)
    return saved, rest


def _sigterm_group(ctx: Context) -> str:
    folder = ctx.scratch("sigterm")
    checkpoint, failure, progress = (str(folder / name) for name in ("checkpoint.pt", "failure.txt", "progress"))
    timeout = ctx.loader_timeout
    child = multiprocessing.get_context("fork").Process(
        target=_train_until_signalled, args=(ctx.candidate, ctx.fixtures["shards"], checkpoint, failure, progress,
                                             timeout))
    child.start()
    deadline = time.monotonic() + timeout
    delay = random.uniform(0.0, 0.3)
    try:
        # Both workers have run their __iter__ once each has delivered a batch: the second step is the long one.
        while not (Path(progress).exists() and Path(progress).read_text() not in ("", "1")):
            if Path(failure).exists() or not child.is_alive():
                break
            if time.monotonic() > deadline:
                raise PartFailed(f"the first 2 batches with 2 fork workers did not arrive within {timeout:.0f} s")
            time.sleep(0.01)
        else:
            time.sleep(delay)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)
        # Not child.join(): its DataLoader workers hold the child's sentinel pipe open until they notice
        # that it is gone (every 5 s); the exit status is there as soon as the child itself has ended.
        while child.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.join(30)
    saved, rest = _stopped_and_resumed(
        ctx, child, checkpoint, failure, "SIGTERM to the process group, resumed with 2 fork workers",
        killed="SIGTERM to the training loop's process group killed a DataLoader worker, and the loop failed instead "
               "of writing its checkpoint: {last}")
    return (f"SIGTERM to the process group {delay:.2f} s into the third step: checkpoint after "
            f"{len(saved['keys'])} samples, the other {len(rest)} after the resume, each once")


def _sigterm_startup(ctx: Context) -> str:
    """SIGTERM to the group while the first spawn worker starts: it must survive, and the loop checkpoints."""
    cls = ctx.importable()
    preflight_spawn(_dataset(ctx, cls, shuffle_buffer=20))
    folder = ctx.scratch("sigterm-startup")
    checkpoint, failure, progress, once = (str(folder / name) for name in ("checkpoint.pt", "failure.txt",
                                                                         "progress", "signalled"))
    timeout = ctx.loader_timeout + ctx.startup_timeout
    child = multiprocessing.get_context("fork").Process(
        target=_train_until_signalled, args=(cls, ctx.fixtures["shards"], checkpoint, failure, progress, timeout,
                                             "spawn", once))
    child.start()
    deadline = time.monotonic() + 2 * timeout
    try:
        while child.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
        child.join(30)
    if not Path(once).exists():
        raise PartFailed("no spawn worker started within the time allowed, so no signal was sent")
    saved, rest = _stopped_and_resumed(
        ctx, child, checkpoint, failure, "SIGTERM while the spawn workers started, resumed with 2 fork workers",
        killed="SIGTERM to the process group while the spawn workers were starting killed one, and the loop failed "
               "instead of writing its checkpoint: {last}. Until your worker_init_fn runs, nothing of yours protects "
               "a worker: start the workers with the stop signals blocked (a worker inherits the block), and let "
               "worker_init_fn ignore them")
    return (f"SIGTERM to the process group while a spawn worker was starting: the workers lived, checkpoint after "
            f"{len(saved['keys'])} samples, the other {len(rest)} after the resume, each once")


register(
    "resumable_reader",
    "11_resumable_reader",
    "a tar shard reader whose state_dict() says where each reader stands, sample by sample and epoch by epoch, and "
    "survives a kill and a scheduler's SIGTERM",
    "ResumableShardReader(shards, shuffle_buffer=0, seed=0, transform=None, return_key=False) with set_epoch(epoch), "
    "state_dict() and load_state_dict(state): an IterableDataset (in epoch e, worker w of W reads its shards of "
    "e's order through a shuffle buffer of shuffle_buffer) that, loaded with a state saved mid-epoch, delivers "
    "exactly the samples not yet delivered, in the uninterrupted order; refuses a state of another epoch; with "
    "static methods worker_init_fn(worker_id) (the worker ignores SIGTERM and SIGUSR1) and start(loader) (iter(loader) "
    "with the workers started while the stop signals are blocked); read through torchdata's StatefulDataLoader",
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
        ("two_epochs", "stopped after epoch 0's last batch, resumed with persistent workers, then epoch 1: whole, "
         "in its own order", "keep the epoch in a SharedEpoch (set in set_epoch, read in __iter__), and use a loaded "
         "state for one pass only", _two_epochs),
        ("other_epoch", "a state saved in epoch 0, given to a reader in epoch 1: refused with an error naming the "
         "epochs", "save the epoch in state_dict() and compare it in __iter__ with the epoch being read",
         _other_epoch),
        ("sigterm_group", "SIGTERM to a training loop's whole process group at a random moment of a step (buffer of "
         "20, 2 fork workers): the loop checkpoints, the rest resumes, every sample once",
         "worker_init_fn: signal.signal(signal.SIGTERM, signal.SIG_IGN), the same for SIGUSR1 (or "
         "packlab.preemption.ignore_stop_signals)", _sigterm_group),
        ("sigterm_startup", "SIGTERM to the process group while a spawn worker starts, before any code of yours "
         "runs in it: the workers live, the loop checkpoints, the rest resumes",
         "start: with packlab.preemption.stop_signals_held(): return iter(loader); worker_init_fn then ignores "
         "the signals and unblocks them", _sigterm_startup),
    ],
)

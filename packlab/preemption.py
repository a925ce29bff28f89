"""A training loop that can be stopped at any moment and goes on where it stopped.

Run it as ``python -m packlab.preemption --shards PATTERN --checkpoint FILE``. It reads one
epoch of tar shards with torchdata's ``StatefulDataLoader`` and "trains" on each batch (it
records the batch's keys, and can sleep to stand for the compute). Four rules make a stop
harmless:

1. **Checkpoint the loader with the model.** Every ``--every`` steps the loader's state
   (``loader.state_dict()``: every worker's position, see :mod:`packlab.resume`) and the
   training state (here, the keys trained on so far) are written to one file, atomically: a
   temporary file renamed over the old one, so a kill during the write leaves the previous
   checkpoint whole.
2. **On a signal, checkpoint on the way out.** ``SIGTERM`` (what ``scancel``, a time limit
   and a preempting scheduler send first) and ``SIGUSR1`` (what ``sbatch --signal=USR1@90``
   sends before the time limit) only set a flag; the loop finishes its step, writes the
   checkpoint and exits with :data:`STOPPED_EXIT_CODE`, so a job script can requeue itself.
3. **Only the training process decides.** A scheduler often signals *every* process of the
   job (Slurm at a time limit, on preemption, ``scancel`` without ``--batch``; a container
   runtime signals the whole process group), DataLoader workers included. A worker's own
   SIGTERM handler, which torch installs at the start of ``_worker_loop``
   (``torch/utils/data/_utils/signal_handling.py``, "Signal handling in multiprocessing data
   loading"), lets the signal kill it, and the training process's SIGCHLD handler then raises
   "DataLoader worker (pid ...) is killed by signal: Terminated" wherever it is, in the
   middle of the checkpoint on the way out too. So the workers ignore both signals
   (:func:`ignore_stop_signals`, the ``worker_init_fn``, which torch and torchdata call after
   installing their handlers), and the signals are *blocked* while the workers start
   (:func:`stop_signals_held`): a worker inherits the block, through ``fork`` and through
   the ``exec`` of ``spawn``, so a signal that lands before its ``worker_init_fn`` waits and is
   then discarded, while the training process takes its own copy as soon as the workers are up.
   The training process still ends its workers itself: once the final checkpoint is written
   it sends ``SIGKILL`` to every worker still alive (:func:`end_workers`). A worker that
   ignores SIGTERM is out of reach of the two fallbacks that would otherwise end it, the
   DataLoader's ``terminate()`` of a worker that did not stop within 5 s and Python's exit,
   which sends ``terminate()`` to its daemon children and then joins them *without* a
   timeout (``multiprocessing.util._exit_function``): a worker blocked in a read (a hung
   NFS mount, a stalled object-store request) would keep the job alive until the
   scheduler's ``SIGKILL``, and the job would end killed, not with
   :data:`STOPPED_EXIT_CODE`, and not be requeued.
4. **After SIGKILL, lose only what came after the last checkpoint.** ``SIGKILL`` cannot be
   caught. The steps after the last checkpoint are lost, model updates and data position
   alike, and are done again after the restart: the union of what the checkpoints record
   holds every sample exactly once.

With a checkpoint present the loop resumes from it. With another ``--workers`` than the
checkpoint was written with, ``StatefulDataLoader`` would refuse the state, so the loop
gives the dataset the whole epoch's state instead (:func:`packlab.resume.epoch_state`) and
the new workers split what is left.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

#: Exit status after a checkpoint written on a signal: "stopped, resume me".
STOPPED_EXIT_CODE = 3
#: The signals that ask the loop to checkpoint and stop.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def ignore_stop_signals(worker_id: int | None = None) -> None:
    """A ``worker_init_fn``: this DataLoader worker ignores SIGTERM and SIGUSR1; the training process decides.

    torch's worker loop installs a SIGTERM handler that lets the signal kill the worker
    (it exits quietly only when the signal comes from its parent, which is how the
    DataLoader ends it), then seeds, then calls ``worker_init_fn``; torchdata's
    ``StatefulDataLoader`` does the same (``torchdata/stateful_dataloader/worker.py``). Set
    here, the disposition holds for the rest of the worker's life. Then the signals are
    unblocked (see :func:`stop_signals_held`): one that arrived while they were blocked is
    discarded, because the disposition is now "ignore".

    A worker that ignores SIGTERM still ends when it should: the DataLoader ends its
    workers with a message on their queues (``None``) and a shared event, not with a
    signal, and a worker whose training process died notices through its watchdog. Both
    need the worker to get back to its loop; one blocked in a read does not, which is why
    the training loop ends its workers itself after its last checkpoint (:func:`end_workers`).
    """
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def stop_signals_held():
    """Block SIGTERM and SIGUSR1 in this thread while the block runs (start DataLoader workers in it).

    A process inherits its creator's signal mask, through ``fork`` and through ``exec``. A
    ``fork`` or ``spawn`` worker that starts with the stop signals blocked keeps a signal
    sent to the whole process group pending until :func:`ignore_stop_signals` makes it
    ignore them, so that none can kill it in the moments before its ``worker_init_fn`` runs
    (under ``spawn`` that is the whole start of a Python interpreter, seconds). The training
    process's own copy of the signal is delivered, to its handler, when the block ends.

    Two details of the standard library. multiprocessing's resource tracker, which the
    first ``spawn`` or ``forkserver`` process starts, *unblocks* SIGINT and SIGTERM in the
    process that starts it (``multiprocessing/resource_tracker.py``, ``ensure_running``:
    ``pthread_sigmask(SIG_UNBLOCK, ...)``), so it is started here first, before the block.
    And a ``forkserver`` worker is forked from the server process, with the server's mask:
    there only the ``worker_init_fn`` protects it, from the moment it runs.
    """
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def end_workers(batches) -> None:
    """``SIGKILL`` every worker of the DataLoader iterator ``batches`` still alive, and reap it.

    The parent may stop its workers; nobody else may (:func:`ignore_stop_signals`). Called
    once the work is saved: the workers hold nothing but prefetched batches, which the
    checkpoint's loader state does not count as delivered. First the workers' pids are
    taken off torch's watch list (what ``_shutdown_workers`` does at its end), so that the
    training process's SIGCHLD handler does not report "DataLoader worker (pid ...) is
    killed by signal" for a death this process chose. ``SIGKILL``, not ``SIGTERM``, because
    the workers ignore SIGTERM, and because a process in an uninterruptible read is ended
    by nothing else.
    """
    workers = [w for w in getattr(batches, "_workers", ()) if w.is_alive()]
    if not workers:
        return
    if getattr(batches, "_worker_pids_set", False):
        from torch.utils.data._utils import signal_handling

        signal_handling._remove_worker_pids(id(batches))
        batches._worker_pids_set = False
    for worker in workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)
    for worker in workers:
        worker.join(timeout=10)


#: What :class:`HangingRead` prints as its worker blocks.
BLOCKED_MESSAGE = "blocking in a read that never returns"


class HangingRead:
    """A transform for tests: worker 0 decodes ``after`` samples, then blocks in a read that never returns.

    It stands for a worker stuck on a hung file system or a stalled network read when the
    loop is stopped: it waits in ``os.read`` on a pipe whose other end nobody writes, a
    system call that SIGTERM's "ignore" leaves waiting. It says so on stderr first, so that
    a test can stop the loop once the worker is stuck rather than after a guessed delay.
    """

    def __init__(self, transform, after: int):
        self.transform, self.after, self.done = transform, after, 0

    def __call__(self, image_bytes: bytes, source: str = "<bytes>"):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None and info.id == 0:
            self.done += 1
            if self.done > self.after:
                never, _writer = os.pipe()
                print(f"{BLOCKED_MESSAGE} (worker 0, pid {os.getpid()}, after {self.after} samples)", file=sys.stderr,
                      flush=True)
                os.read(never, 1)
        return self.transform(image_bytes, source)


def save_checkpoint(path: Path, checkpoint: dict) -> None:
    """Write ``checkpoint`` with ``torch.save`` to a temporary file, then rename it over ``path``.

    The rename is atomic on one filesystem: a reader sees the old file or the new one,
    never half of one.
    """
    import torch

    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint at ``path``, or None when there is none yet."""
    import torch

    if not path.exists():
        return None
    return torch.load(path, weights_only=True)


class StopRequest:
    """Turns SIGTERM and SIGUSR1 into a flag the training loop reads between steps."""

    def __init__(self, signals=STOP_SIGNALS):
        self.received: int | None = None
        for number in signals:
            signal.signal(number, self._handler)

    def _handler(self, number, frame) -> None:
        self.received = number

    def __bool__(self) -> bool:
        return self.received is not None


def run(args: argparse.Namespace) -> int:
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    from packlab import resume
    from packlab.loaders.tar import TarShardDataset, skip_decode

    stop = args.stop_request or StopRequest()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata 0.11 on torch 2.13
    checkpoint_path = Path(args.checkpoint)
    progress = Path(args.progress) if args.progress else None
    transform = skip_decode if args.hang_worker_after is None else HangingRead(skip_decode, args.hang_worker_after)
    dataset = TarShardDataset(args.shards, shuffle_buffer=args.shuffle_buffer, seed=args.seed,
                              transform=transform, return_key=True)
    loader_options = dict(batch_size=args.batch_size, num_workers=args.workers, timeout=args.timeout if args.workers else 0,
                          multiprocessing_context=args.start_method if args.workers else None,
                          worker_init_fn=ignore_stop_signals if args.workers else None)
    saved = load_checkpoint(checkpoint_path)
    keys: list[str] = []
    step, runs = 0, 1
    if saved is not None and saved.get("done"):
        print(f"{checkpoint_path}: the epoch is complete already ({len(saved['keys'])} samples)")
        return 0
    dataset.set_epoch(args.epoch)
    loader = StatefulDataLoader(dataset, **loader_options)
    if saved is not None:
        keys, step, runs = list(saved["keys"]), int(saved["step"]), int(saved["runs"]) + 1
        if saved["workers"] == args.workers:
            loader.load_state_dict(saved["loader"])
            how = "the same workers go on"
        else:
            dataset.load_state_dict(resume.epoch_state(saved["loader"]))
            how = f"{saved['workers']} -> {args.workers} workers: the pieces left are split again"
        print(f"resuming from step {step}, {len(keys)} samples done ({how})", flush=True)

    def checkpoint(done: bool = False) -> None:
        save_checkpoint(checkpoint_path, {"loader": loader.state_dict(), "keys": keys, "step": step, "runs": runs,
                                          "workers": args.workers, "epoch": args.epoch, "done": done})

    with stop_signals_held():  # the workers start here, and inherit the block
        batches = iter(loader)
    try:
        for _, _, batch_keys in batches:
            keys += list(batch_keys)
            step += 1
            if args.step_seconds:
                time.sleep(args.step_seconds)  # the model's forward and backward pass
            if step % args.every == 0:
                checkpoint()
            _write_progress(progress, step, len(keys))
            if args.pause_after is not None and step == args.pause_after:
                print(f"paused after step {step}: waiting to be stopped", flush=True)
                while not stop:
                    time.sleep(0.02)
            if stop:
                checkpoint()
                print(f"signal {stop.received} at step {step}: checkpoint written, {len(keys)} samples done",
                      flush=True)
                return STOPPED_EXIT_CODE
        checkpoint(done=True)
        print(f"epoch complete: {len(keys)} samples in {step} steps over {runs} run(s)", flush=True)
        return 0
    finally:
        end_workers(batches)  # after the last checkpoint, and after an error too: nothing else can end them


def _write_progress(progress: Path | None, step: int, samples: int) -> None:
    """Rewrite the progress file (atomically): the step just done and the samples trained on so far."""
    if progress is None:
        return
    partial = progress.with_name(progress.name + ".partial")
    partial.write_text(json.dumps({"step": step, "samples": samples}))
    os.replace(partial, progress)


@contextlib.contextmanager
def _loop_process(arguments: list, *extra: str):
    """``python -m packlab.preemption`` in a new session (its own process group): yields ``(process, progress file)``.

    Whatever happens in the block, the loop and its workers are gone after it (SIGKILL to
    the group if the loop still runs), and so is the progress file's folder.
    """
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="packlab-preemption-") as folder:
        progress = Path(folder) / "progress.json"
        command = [sys.executable, "-m", "packlab.preemption", *map(str, arguments), *extra, "--progress", str(progress)]
        process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        try:
            yield process, progress
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)


def _progress_step(progress: Path) -> int | None:
    """The step the progress file names: None before the loop wrote it, 0 once its signal handlers are in place."""
    try:
        return int(json.loads(progress.read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return None


def _send(process, signal_number: int, group: bool) -> None:
    """``signal_number`` to the loop's pid alone, or to its whole process group (the loop and its workers)."""
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(process.pid, signal_number)
        else:
            os.kill(process.pid, signal_number)


def _wait_for(process, progress: Path, reached, what: str, deadline: float) -> bool:
    """Poll until ``reached(step)``; False if the loop ended first. Raises after ``deadline``."""
    while process.poll() is None:
        step = _progress_step(progress)
        if step is not None and reached(step):
            return True
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the loop did not reach {what} in time: {process.communicate(timeout=30)[0][-2000:]}")
        time.sleep(0.02)
    return False


def run_and_stop(arguments: list, stop_after: int, signal_number: int = signal.SIGKILL, timeout: float = 300.0,
                 group: bool | None = None) -> tuple[int, str]:
    """Run the loop in a new process, stop it with ``signal_number`` after step ``stop_after``; return (status, output).

    The loop pauses after that step (``--pause-after``) so the stop lands at a known point
    while its DataLoader workers keep prefetching, as they would during a long step.
    ``group`` (default: True for SIGKILL, else False) sends the signal to the whole process
    group, the loop and its workers, as a node failure or a scheduler's signal to the whole
    job does; False sends it to the loop's pid alone, as ``sbatch --signal=B:...`` forwarded
    by the job script does. :func:`run_and_interrupt` stops the loop at a moment instead.
    """
    group = signal_number == signal.SIGKILL if group is None else group
    with _loop_process(arguments, "--pause-after", str(stop_after)) as (process, progress):
        if not _wait_for(process, progress, lambda step: step >= stop_after, f"step {stop_after}",
                         time.monotonic() + timeout):
            raise RuntimeError(f"the loop ended before step {stop_after}: {process.communicate(timeout=30)[0][-2000:]}")
        _send(process, signal_number, group)
        output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def run_and_interrupt(arguments: list, after_seconds: float, signal_number: int = signal.SIGTERM, group: bool = True,
                      after_step: int = 0, timeout: float = 300.0) -> tuple[int, str, int | None]:
    """Run the loop; send ``signal_number`` ``after_seconds`` after it reached ``after_step``: (status, output, step).

    ``after_step`` 0 counts from the moment the loop's signal handlers are in place (it is
    still importing torch), 1 from its first step (its DataLoader workers are up). Nothing
    pauses the loop: the signal lands wherever the loop and its workers are at that moment
    (starting workers, loading the checkpoint, in a step, writing a checkpoint). ``group``:
    to the whole process group, as a scheduler that signals the whole job does, else to the
    loop's pid alone. ``step`` is the last step the progress file showed when the signal was
    sent (None: the loop had ended before). A loop that finished its epoch before the
    moment returns 0.
    """
    step = None
    with _loop_process(arguments) as (process, progress):
        if _wait_for(process, progress, lambda done: done >= after_step, f"step {after_step}", time.monotonic() + timeout):
            moment = time.monotonic() + after_seconds
            while process.poll() is None and time.monotonic() < moment:
                time.sleep(min(0.01, max(0.0, moment - time.monotonic())))
            if process.poll() is None:
                step = _progress_step(progress)
                _send(process, signal_number, group)
        output, _ = process.communicate(timeout=timeout)
    return process.returncode, output, step


def run_to_end(arguments: list, timeout: float = 300.0) -> tuple[int, str]:
    """Run the loop in a new process until the epoch ends; return (status, output)."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "packlab.preemption", *map(str, arguments)], capture_output=True,
                          text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.preemption", description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", required=True, help="shard paths as a brace pattern")
    parser.add_argument("--checkpoint", required=True, help="the checkpoint file (resumed from when it exists)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--start-method", default="fork", choices=["fork", "spawn", "forkserver"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--shuffle-buffer", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch", type=int, default=0)
    parser.add_argument("--every", type=int, default=4, help="checkpoint every N steps (default 4)")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step, standing for the compute")
    parser.add_argument("--pause-after", type=int, help="after this step, wait for a signal (for tests that kill)")
    parser.add_argument("--progress", help="a file rewritten after every step with the step and sample count "
                        "(step 0: the signal handlers are in place)")
    parser.add_argument("--timeout", type=float, default=300.0, help="DataLoader timeout per batch, seconds")
    parser.add_argument("--hang-worker-after", type=int, help="for tests: worker 0 blocks in a read after this many "
                        "samples, as on a hung file system")
    stop = StopRequest()  # first: a signal that arrives while torch is being imported still writes a checkpoint
    args = parser.parse_args(argv)
    args.stop_request = stop
    _write_progress(Path(args.progress) if args.progress else None, 0, 0)
    print(f"training loop {os.getpid()}: SIGTERM or SIGUSR1 checkpoints and stops it", flush=True)
    status = run(args)
    # The work is saved: a late signal changes nothing now. Ignored rather than handled, because Python
    # puts the default action (death) back for signals with Python handlers as the interpreter shuts down.
    for number in STOP_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    return status


if __name__ == "__main__":
    sys.exit(main())

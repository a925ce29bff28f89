"""A training loop that can be stopped at any moment and goes on where it stopped.

Run it as ``python -m packlab.preemption --shards PATTERN --checkpoint FILE``. It reads one
epoch of tar shards with torchdata's ``StatefulDataLoader`` and "trains" on each batch (it
records the batch's keys, and can sleep to stand for the compute). Three rules make a stop
harmless:

1. **Checkpoint the loader with the model.** Every ``--every`` steps the loader's state
   (``loader.state_dict()``: every worker's position, see :mod:`packlab.resume`) and the
   training state (here, the keys trained on so far) are written to one file, atomically: a
   temporary file renamed over the old one, so a kill during the write leaves the previous
   checkpoint whole.
2. **On a signal, checkpoint on the way out.** ``SIGTERM`` (what ``scancel`` and a
   preempting scheduler send first) and ``SIGUSR1`` (what ``sbatch --signal=USR1@90``
   sends before the time limit) only set a flag; the loop finishes its step, writes the
   checkpoint and exits with :data:`STOPPED_EXIT_CODE`, so a job script can requeue itself.
3. **After SIGKILL, lose only what came after the last checkpoint.** ``SIGKILL`` cannot be
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
import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

#: Exit status after a checkpoint written on a signal: "stopped, resume me".
STOPPED_EXIT_CODE = 3


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

    def __init__(self, signals=(signal.SIGTERM, signal.SIGUSR1)):
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
    dataset = TarShardDataset(args.shards, shuffle_buffer=args.shuffle_buffer, seed=args.seed,
                              transform=skip_decode, return_key=True)
    loader_options = dict(batch_size=args.batch_size, num_workers=args.workers, timeout=args.timeout if args.workers else 0,
                          multiprocessing_context=args.start_method if args.workers else None)
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

    for _, _, batch_keys in loader:
        keys += list(batch_keys)
        step += 1
        if args.step_seconds:
            time.sleep(args.step_seconds)  # the model's forward and backward pass
        if step % args.every == 0:
            checkpoint()
        if progress is not None:
            partial = progress.with_name(progress.name + ".partial")
            partial.write_text(json.dumps({"step": step, "samples": len(keys)}))
            os.replace(partial, progress)
        if args.pause_after is not None and step == args.pause_after:
            print(f"paused after step {step}: waiting to be stopped", flush=True)
            while not stop:
                time.sleep(0.02)
        if stop:
            checkpoint()
            print(f"signal {stop.received} at step {step}: checkpoint written, {len(keys)} samples done", flush=True)
            return STOPPED_EXIT_CODE
    checkpoint(done=True)
    print(f"epoch complete: {len(keys)} samples in {step} steps over {runs} run(s)", flush=True)
    return 0


def run_and_stop(arguments: list, stop_after: int, signal_number: int = signal.SIGKILL, timeout: float = 300.0,
                 ) -> tuple[int, str]:
    """Run the loop in a new process, stop it with ``signal_number`` after step ``stop_after``; return (status, output).

    The loop pauses after that step (``--pause-after``) so the stop lands at a known point
    while its DataLoader workers keep prefetching, as they would during a long step. SIGKILL
    goes to the whole process group (the loop and its workers die at once, as when a node
    fails); SIGTERM and SIGUSR1 go to the loop only, as a scheduler's warning would.
    """
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="packlab-preemption-") as folder:
        progress = Path(folder) / "progress.json"
        command = [sys.executable, "-m", "packlab.preemption", *map(str, arguments), "--pause-after", str(stop_after),
                   "--progress", str(progress)]
        process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline and process.poll() is None:
                if progress.exists() and json.loads(progress.read_text())["step"] >= stop_after:
                    break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"the loop did not reach step {stop_after} within {timeout:.0f} s: "
                                   f"{process.communicate(timeout=30)[0][-2000:]}")
            if signal_number == signal.SIGKILL:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                os.kill(process.pid, signal_number)
            output, _ = process.communicate(timeout=timeout)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
    return process.returncode, output


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
    parser.add_argument("--progress", help="a file rewritten after every step with the step and sample count")
    parser.add_argument("--timeout", type=float, default=300.0, help="DataLoader timeout per batch, seconds")
    stop = StopRequest()  # first: a signal that arrives while torch is being imported still writes a checkpoint
    args = parser.parse_args(argv)
    args.stop_request = stop
    status = run(args)
    # The work is saved: a late signal changes nothing now. Ignored rather than handled, because Python
    # puts the default action (death) back for signals with Python handlers as the interpreter shuts down.
    for number in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(number, signal.SIG_IGN)
    return status


if __name__ == "__main__":
    sys.exit(main())

"""Find out where a training job's time goes, the way one would on a real job.

Two tools, two questions:

* **Is the training loop waiting for data?** ``torch.profiler`` records how long each
  call took inside the training process. The DataLoader's iterator wraps every
  ``__next__`` in a ``record_function`` named
  ``enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__`` (with workers;
  ``_SingleProcessDataLoaderIter`` without), so the time the loop spent waiting for
  batches appears next to the time of its own steps (:func:`profile_training`).
* **What are the workers doing?** The workers are other processes; the profiler in the
  training process does not see inside them. ``py-spy`` does: it reads a running
  Python process's stack from outside, many times a second, without changing or
  restarting it. ``py-spy dump --pid PID --subprocesses`` prints every process's stack
  once; ``py-spy record --pid PID --subprocesses`` samples for a while and writes the
  stacks it saw (:func:`pyspy_record`, :func:`top_functions`).

py-spy reads another process's memory with ``ptrace``/``process_vm_readv``. The kernel
allows that to root, or to a user with the ``CAP_SYS_PTRACE`` capability (a container
needs ``--cap-add SYS_PTRACE``); where the Yama security module is loaded,
``/proc/sys/kernel/yama/ptrace_scope`` must also be 0 for a user to attach to a
process that is not its own child (1 allows children only, 2 admins only, 3 nobody).
:func:`ptrace_permission` says which applies here.

Where attaching is refused, py-spy can still start the job itself, as its own child
(``py-spy record --subprocesses -- python -m packlab.profiling ...``): every ptrace rule
lets a process trace its own descendants, Yama's scope 1 included. That gives the
recording but no snapshot of a running job (``dump`` only attaches). Where py-spy cannot
run at all (macOS without ``sudo``, Yama's scope 2 or 3, a container without the
capability), :func:`sample_in_process` samples the same work run in this process with a
CPU-time timer. :func:`profile_workers` tries the three in that order and says which one answered.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

#: The name the DataLoader's iterators give each ``__next__`` in the profiler (``torch/utils/data/dataloader.py``).
DATALOADER_NEXT = "enumerate(DataLoader)#"
#: The name :func:`profile_training` gives each training step.
TRAINING_STEP = "training step"


@dataclass
class TrainingProfile:
    """What :func:`profile_training` found over its profiled (steady) steps, and the start-up apart."""

    wall_seconds: float  # the profiled steps, from the first to the last
    waiting_seconds: float  # inside the DataLoader's __next__, in those steps
    step_seconds: float  # inside the training steps, in those steps
    batches: int  # steps profiled
    table: str
    first_batch_seconds: float  # iter() to the first batch: worker start-up, not part of the profile
    skipped_steps: int  # steps run before the profile (schedule's wait + warmup, after the first batch)

    @property
    def waiting_share(self) -> float:
        """Share of the profiled steps' wall time the loop spent inside the DataLoader's ``__next__``."""
        return self.waiting_seconds / self.wall_seconds

    @property
    def step_share(self) -> float:
        """Share of the profiled steps' wall time spent in the training steps."""
        return self.step_seconds / self.wall_seconds


def _quiet_kineto() -> None:
    """Keep Kineto (the profiler's tracing library) from printing to stderr.

    Kineto logs through its own logger, not Python's: ``profiler_start``/``profiler_stop``
    lines at its ``USDT`` level (5) and, on a machine without a GPU, an error that it found
    no GPU (``gpuGetDeviceCount failed``), which is expected and harmless here. Its level
    comes from the ``KINETO_LOG_LEVEL`` environment variable, read when a profile starts;
    6 is above every level it has. A value the user set is kept.
    """
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


def profile_training(loader: Iterable, step: Callable, wait: int = 2, warmup: int = 2, active: int = 20,
                     max_epochs: int = 20) -> TrainingProfile:
    """Profile a training loop (``step(batch)`` per batch) from steady state, with ``torch.profiler.schedule``.

    The first batch (workers starting, every worker's first batch) is timed on its own and
    left out; then the profiler skips ``wait`` steps, records but discards ``warmup`` more,
    and keeps ``active`` steps, once (``schedule(wait, warmup, active, repeat=1)``). The
    loader is iterated for as many epochs as that takes (use ``persistent_workers=True``, as
    a training job does, or every epoch starts its workers again). Each step is wrapped in
    ``record_function("training step")``; the DataLoader marks its own ``__next__``. CPU
    only; on a GPU job add ``ProfilerActivity.CUDA`` to see the kernels too.
    """
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile, schedule

    _quiet_kineto()
    needed = wait + warmup + active
    batches = 0
    start = time.perf_counter()
    first_batch = float("nan")
    active_start = active_end = None
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1)) as profiler:
        for _ in range(max_epochs):
            iterator = iter(loader)
            while batches <= needed:
                if batches == 1 + wait + warmup:
                    active_start = time.perf_counter()
                try:
                    batch = next(iterator)
                except StopIteration:
                    break
                if batches == 0:
                    first_batch = time.perf_counter() - start
                    batches += 1
                    continue  # the start-up batch: not a step of the profile
                with record_function(TRAINING_STEP):
                    step(batch)
                profiler.step()
                batches += 1
                if batches == 1 + needed:
                    active_end = time.perf_counter()
            if batches > needed:
                break
        else:
            raise RuntimeError(f"{max_epochs} epochs gave fewer than the {needed} steps to profile")
    events = profiler.key_averages()
    waiting = sum(e.cpu_time_total for e in events if e.key.startswith(DATALOADER_NEXT)) / 1e6
    stepping = sum(e.cpu_time_total for e in events if e.key == TRAINING_STEP) / 1e6
    table = events.table(sort_by="cpu_time_total", row_limit=8, max_name_column_width=60)
    return TrainingProfile(active_end - active_start, waiting, stepping, active, table, first_batch, wait + warmup)


def crossing_seconds(batch) -> float:
    """Seconds for a worker's side of handing ``batch`` over: a fresh shared-memory block, filled, and its handle pickled.

    What a DataLoader worker does with every batch it sends (chapter 8): the batch is
    written into new shared memory (a page fault per 4 kB) and pickled as a file
    descriptor and a shape. The training process's side (mapping and later unmapping the
    block) costs about as much again and is not in this number.
    """
    from multiprocessing import resource_sharer
    from multiprocessing.reduction import ForkingPickler

    import torch

    start = time.perf_counter()
    storage = torch.empty(0, dtype=batch.dtype)._typed_storage()._new_shared(batch.numel(), device="cpu")
    shared = torch.empty(0, dtype=batch.dtype).new(storage).view(batch.shape)
    shared.copy_(batch)
    ForkingPickler.dumps(shared)
    del shared, storage
    seconds = time.perf_counter() - start
    resource_sharer.stop()  # pickling lent the block's descriptor to a helper thread; nobody will ask for it
    return seconds


# ------------------------------------------------------------------------------- py-spy


#: A py-spy program to use instead of the installed one. The tests point it at stand-ins that
#: refuse to attach, or fail outright, to run chapter 11 as it runs where ptrace is not allowed.
PYSPY_VAR = "PACKLAB_PYSPY"


class PyspyError(RuntimeError):
    """py-spy could not do what it was asked: attach refused, or not runnable here. The message says which."""


def pyspy_executable() -> str:
    """The ``py-spy`` program: ``$PACKLAB_PYSPY`` if set, else the one installed with the course (next to this Python), or on PATH."""
    chosen = os.environ.get(PYSPY_VAR, "").strip()
    if chosen:
        if not Path(chosen).is_file():
            raise FileNotFoundError(f"{PYSPY_VAR}={chosen} is not a file")
        return chosen
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if not found:
        raise FileNotFoundError("py-spy is not installed: `make setup` installs it (pip install py-spy)")
    return found


def ptrace_permission() -> str:
    """Whether this process may attach py-spy to others, and why, in one sentence."""
    reasons = []
    if os.geteuid() == 0:
        reasons.append("running as root")
    try:
        status = Path("/proc/self/status").read_text()
        effective = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff")), 16)
        if effective & (1 << 19):  # CAP_SYS_PTRACE is capability 19
            reasons.append("CAP_SYS_PTRACE is in the effective capabilities")
    except (OSError, StopIteration, ValueError):
        pass
    yama = Path("/proc/sys/kernel/yama/ptrace_scope")
    scope = yama.read_text().strip() if yama.exists() else None
    scope_text = ("the Yama module is not loaded (no ptrace_scope), so only the usual ownership and capability rules apply"
                  if scope is None else f"kernel.yama.ptrace_scope is {scope}")
    if reasons:
        return f"allowed: {' and '.join(reasons)}; {scope_text}"
    return (f"probably not allowed: not root and no CAP_SYS_PTRACE; {scope_text}. Run py-spy with sudo, or give "
            "the container --cap-add SYS_PTRACE")


def _job_command(seconds: float, keys: int, workers: int) -> list[str]:
    """The command line of :func:`main`, the training job py-spy looks at."""
    return [sys.executable, "-m", "packlab.profiling", "--seconds", str(seconds), "--keys", str(keys),
            "--workers", str(workers)]


def start_training_job(seconds: float, keys: int = 512, workers: int = 2) -> subprocess.Popen:
    """Start :func:`main` as a separate process (a stand-in for someone's training script); return it once it trains.

    Waits until the job prints ``training`` (its first batch has arrived), so a profiler
    attached afterwards sees the steady state, not the imports.
    """
    job = subprocess.Popen(_job_command(seconds, keys, workers), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    line = job.stdout.readline()
    if "training" not in line:
        job.kill()
        _, error = job.communicate(timeout=60)
        raise RuntimeError(f"the training job did not start: {line.strip()} {error.strip()[-2000:]}")
    return job


def attach_trial(timeout: float = 5.0) -> tuple[bool, str]:
    """Whether py-spy can attach to another process here: ``(True, "")``, or ``(False, what py-spy said)``.

    Starts a sleeping Python as a sibling of py-spy (not its child, as a training job
    started from a notebook is) and asks for one ``py-spy dump`` of it, again until
    ``timeout`` seconds if py-spy finds no interpreter yet (the sleeper still starting).
    """
    try:
        executable = pyspy_executable()
    except FileNotFoundError as missing:
        return False, str(missing)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    deadline = time.monotonic() + timeout
    said = "no answer"
    try:
        while time.monotonic() < deadline:
            try:
                run = subprocess.run([executable, "dump", "--pid", str(sleeper.pid)], capture_output=True, text=True,
                                     timeout=max(0.5, deadline - time.monotonic()), env=_uncoloured_environment())
            except subprocess.TimeoutExpired:
                return False, f"py-spy dump gave no answer within {timeout:g} s"
            if run.returncode == 0:
                return True, ""
            said = _last_words(run)
            if "Permission" in said or "root" in said:  # refused: trying again will not help
                break
            time.sleep(0.2)
        return False, said
    finally:
        sleeper.kill()
        sleeper.wait()


#: A terminal colour or cursor sequence (``ESC [ ... letter``).
_ANSI_SEQUENCE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _uncoloured_environment() -> dict[str, str]:
    """This process's environment with terminal colours switched off.

    py-spy colours its output when ``CLICOLOR_FORCE`` is set, even into a pipe; some
    CI services set it. Escape codes in a notebook's output make the book's ANSI
    highlighter fail where a slice cuts one in half.
    """
    environment = {name: value for name, value in os.environ.items() if name not in ("CLICOLOR_FORCE", "FORCE_COLOR")}
    environment["CLICOLOR"] = "0"
    environment["NO_COLOR"] = "1"
    return environment


def plain_text(text: str) -> str:
    """``text`` without terminal colour sequences, and without a lone escape character left over."""
    return _ANSI_SEQUENCE.sub("", text).replace("\x1b", "")


def pyspy_dump(pid: int) -> str:
    """``py-spy dump --pid PID --subprocesses``: every thread's Python stack in the process tree, once, as plain text."""
    run = subprocess.run([pyspy_executable(), "dump", "--pid", str(pid), "--subprocesses"],
                         capture_output=True, text=True, timeout=120, env=_uncoloured_environment())
    if run.returncode:
        raise PyspyError(f"py-spy dump failed ({ptrace_permission()}): {_last_words(run)}")
    return plain_text(run.stdout)


def pyspy_record(pid: int, seconds: float = 3.0, rate: int = 100) -> list[tuple[list[str], int]]:
    """``py-spy record --subprocesses --format raw`` for ``seconds``: ``(stack, samples)`` pairs, outermost frame first.

    Each stack starts with the process it was sampled in (``process 1234:"python -m ..."``),
    after its parent's when it is a child (a DataLoader worker); idle threads (waiting on a lock, a queue or a socket) are not sampled, so what is
    recorded is where the processes were *working*.
    """
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "stacks.txt"
        run = subprocess.run(
            [pyspy_executable(), "record", "--pid", str(pid), "--subprocesses", "--duration", str(int(seconds)),
             "--rate", str(rate), "--format", "raw", "--output", str(target), "--nonblocking"],
            capture_output=True, text=True, timeout=seconds + 120, env=_uncoloured_environment(),
        )
        if run.returncode or not target.exists():
            raise PyspyError(f"py-spy record failed ({ptrace_permission()}): {_last_words(run)}")
        return read_raw_stacks(target)


def read_raw_stacks(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's ``--format raw`` file: one ``frame;frame;... count`` line per distinct stack."""
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            stacks.append((stack.split(";"), int(count)))
    return stacks


def _last_words(run: subprocess.CompletedProcess) -> str:
    """What a failed py-spy said: its last non-empty line of stderr (or stdout), without colours."""
    lines = [line.strip() for line in plain_text(run.stderr or run.stdout or "").splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {run.returncode}, no message"


def pyspy_record_job(seconds: float, keys: int = 512, workers: int = 2, rate: int = 100) -> list[tuple[list[str], int]]:
    """Start the training job as py-spy's own child and record it: ``py-spy record --subprocesses -- python -m packlab.profiling``.

    For where py-spy may not attach to a running process: a process may always trace its
    own descendants. The job trains for ``seconds`` after its imports; py-spy samples it
    from its first instruction to its exit, imports included (:func:`without_imports`
    drops those samples). Returns the stacks as :func:`pyspy_record` does.
    """
    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "stacks.txt"
        run = subprocess.run(
            [pyspy_executable(), "record", "--subprocesses", "--rate", str(rate), "--format", "raw", "--output",
             str(target), "--nonblocking", "--", *_job_command(seconds, keys, workers)],
            capture_output=True, text=True, timeout=seconds + 180, env=_uncoloured_environment(),
        )
        if run.returncode or not target.exists():
            raise PyspyError(f"py-spy could not start the job either: {_last_words(run)}")
        return read_raw_stacks(target)


#: A frame of Python's import machinery: a sample taken while a module was being imported.
_IMPORTING = "<frozen importlib._bootstrap"


def without_imports(stacks: list[tuple[list[str], int]]) -> list[tuple[list[str], int]]:
    """The stacks without those sampled inside an import, or with no Python frame at all (the interpreter
    starting or exiting): start-up and shutdown, not the job's work."""
    return [(stack, n) for stack, n in stacks
            if not any(_IMPORTING in frame for frame in stack) and not stack[-1].startswith("process ")]


def job_pid_of(stacks: list[tuple[list[str], int]]) -> int:
    """The pid of the process every stack starts in (``process PID:"..."``): the job, the root of the tree py-spy saw."""
    roots = collections.Counter(stack[0] for stack, _ in stacks if stack and stack[0].startswith("process "))
    if not roots:
        raise PyspyError("py-spy recorded no samples of the job")
    return int(roots.most_common(1)[0][0].split()[1].split(":")[0])


def _short_path(filename: str) -> str:
    """A source file as py-spy names it: its path inside the sys.path entry that holds it (``PIL/Image.py``)."""
    best = ""
    for entry in sys.path:
        entry = os.path.abspath(entry or ".")
        if filename.startswith(entry + os.sep) and len(entry) > len(best):
            best = entry
    return filename[len(best) + 1:] if best else filename


def sample_in_process(work: Callable[[], object], rate: int = 100) -> list[tuple[list[str], int]]:
    """Run ``work()`` in this (main) thread and sample its Python stack ``rate`` times a CPU-second; counts are CPU ms.

    The stand-in for py-spy where it cannot run: the same kind of stacks (outermost frame
    first, ``function (file:line)``, under a ``process PID:"..."`` frame), so
    :func:`top_functions` reads them alike. A CPU-time timer (``SIGPROF``) interrupts the
    work; Python runs the handler at the next bytecode, so a long C call (Pillow's decode)
    is seen in the Python function that made it, as py-spy sees it. Each sample weighs
    the CPU milliseconds since the previous one, so a C call that swallowed several timer
    ticks counts them all. Unix only (``signal.setitimer``).
    """
    import signal

    process = f'process {os.getpid()}:"the worker\'s work, sampled in this process"'
    tally: collections.Counter = collections.Counter()
    last = [time.process_time()]

    def sample(signum, frame):
        now = time.process_time()
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append(f"{getattr(code, 'co_qualname', code.co_name)} ({_short_path(code.co_filename)}:{frame.f_lineno})")
            frame = frame.f_back
        tally[(process, *reversed(stack))] += round((now - last[0]) * 1000)
        last[0] = now

    previous = signal.signal(signal.SIGPROF, sample)
    signal.setitimer(signal.ITIMER_PROF, 1 / rate, 1 / rate)
    try:
        work()
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, previous)
    return [(list(stack), n) for stack, n in tally.items() if n]


def _worker_work(seconds: float, keys: int) -> Callable[[], None]:
    """What a worker of :func:`main`'s DataLoader does, for ``seconds``: batches of 64 read, transformed and collated."""

    def work():
        import torch
        from torch.utils.data import default_collate

        from packlab import data
        from packlab.loaders import JpegFolderDataset

        dataset = JpegFolderDataset(keys=[s.key for s in data.load_manifest()[:keys]])
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as in a DataLoader worker; the timer counts every thread's CPU time
        try:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for start in range(0, len(dataset), 64):
                    default_collate([dataset[i] for i in range(start, min(start + 64, len(dataset)))])
                    if time.monotonic() >= end:
                        return
        finally:
            torch.set_num_threads(threads)

    return work


#: How :func:`profile_workers` got its stacks.
ATTACHED, STARTED_UNDER_PYSPY, SAMPLED_IN_PROCESS = "attached", "started under py-spy", "sampled in this process"


@dataclass
class WorkerProfile:
    """What :func:`profile_workers` saw: the stacks, how it got them, and a dump where py-spy could attach."""

    how: str  # ATTACHED, STARTED_UNDER_PYSPY or SAMPLED_IN_PROCESS
    why: str  # what was refused, and why: empty where py-spy attached
    stacks: list[tuple[list[str], int]]
    job_pid: int  # the training job's process; -1 where no job ran (every sample is the workers' work)
    seconds: float  # how long the stacks were sampled, after the job's first batch
    snapshot: str | None = None  # ``py-spy dump`` of the running job, where it could attach

    def busiest_stacks(self) -> str:
        """The stack sampled most often in each process, one frame a line, innermost last."""
        best: dict[str, tuple[int, list[str]]] = {}
        for stack, n in self.stacks:
            process = [frame for frame in stack if frame.startswith("process ")][-1]
            if n > best.get(process, (0, []))[0]:
                best[process] = (n, stack)
        total = {p: sum(n for s, n in self.stacks if [f for f in s if f.startswith("process ")][-1] == p) for p in best}
        lines = []
        for process, (n, stack) in best.items():
            unit = "CPU ms" if self.how == SAMPLED_IN_PROCESS else "samples"
            lines.append(f"{process}: {n} of its {total[process]} {unit}")
            lines += [f"    {frame}" for frame in stack if not frame.startswith("process ")]
        return "\n".join(lines)


def profile_workers(seconds: float = 2.0, keys: int = 512, workers: int = 2) -> WorkerProfile:
    """What the training job's processes do, sampled for ``seconds``, by the first of three ways that works here.

    1. Start :func:`main` in its own process, attach py-spy to it: a ``dump`` (one moment)
       and a ``record`` of ``seconds`` (:data:`ATTACHED`).
    2. Where attaching is refused: start the job as py-spy's child and record it
       (:func:`pyspy_record_job`, :data:`STARTED_UNDER_PYSPY`); no dump.
    3. Where py-spy cannot run at all: the workers' work in this process, sampled by a
       CPU-time timer (:func:`sample_in_process`, :data:`SAMPLED_IN_PROCESS`); no job, no main process.

    Samples inside an import are left out (:func:`without_imports`): they are the job
    starting, which only the second way sees.
    """
    attached, refused = attach_trial()  # a sleeper costs a tenth of a second, the job several seconds
    if attached:
        job = start_training_job(seconds=seconds + 3, keys=keys, workers=workers)
        try:
            snapshot = pyspy_dump(job.pid)
            stacks = pyspy_record(job.pid, seconds=seconds)
            return WorkerProfile(ATTACHED, "", without_imports(stacks), job.pid, seconds, snapshot)
        except PyspyError as error:
            refused = str(error)
        finally:
            job.kill()
            job.communicate()
    try:
        stacks = without_imports(pyspy_record_job(seconds, keys=keys, workers=workers))
        return WorkerProfile(STARTED_UNDER_PYSPY, refused, stacks, job_pid_of(stacks), seconds)
    except (PyspyError, FileNotFoundError) as error:
        if str(error) != refused:  # a missing py-spy says the same twice
            refused = f"{refused}; {error}"
    stacks = sample_in_process(_worker_work(seconds, keys))
    return WorkerProfile(SAMPLED_IN_PROCESS, refused, without_imports(stacks), -1, seconds)


def _function(frame: str) -> str:
    """``"resize (PIL/Image.py:2345)"`` -> ``"resize (PIL/Image.py)"``: a frame without its line number."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def top_functions(stacks: list[tuple[list[str], int]], job_pid: int, count: int = 6) -> dict[str, list[tuple[str, float]]]:
    """The innermost Python function of every sample, per kind of process: ``{"main": [...], "workers": [...]}``.

    Each list holds ``(function, share of that kind's samples)``, largest first. The
    innermost frame is where the process was when sampled; for a decode that is the
    Python function that called into Pillow's C code.
    """
    tally: dict[str, collections.Counter] = {"main process": collections.Counter(), "workers": collections.Counter()}
    for stack, samples in stacks:
        process = [frame for frame in stack if frame.startswith("process ")][-1]  # a child's follows its parent's
        kind = "main process" if process.startswith(f"process {job_pid}:") else "workers"
        tally[kind][_function(stack[-1])] += samples
    out = {}
    for kind, counter in tally.items():
        total = sum(counter.values())
        out[kind] = [(name, n / total) for name, n in counter.most_common(count)] if total else []
    return out


# ------------------------------------------------------------------------ the training job


def main(argv: list[str] | None = None) -> int:
    """A small training job to profile: a DataLoader over the JPEG folder feeding the TinyCNN, for some seconds."""
    import argparse

    import torch
    from torch.utils.data import DataLoader

    from packlab import data, train
    from packlab.loaders import JpegFolderDataset

    parser = argparse.ArgumentParser(prog="python -m packlab.profiling", description=main.__doc__)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to train after the first batch")
    parser.add_argument("--keys", type=int, default=512, help="images from the start of the dataset")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dataset = JpegFolderDataset(keys=[s.key for s in data.load_manifest()[: args.keys]])
    model = train.TinyCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0, timeout=300 if args.workers else 0)
    end = None  # --seconds count from the first batch: however long the workers take to start, the job then trains
    while end is None or time.monotonic() < end:
        for images, labels in loader:
            if end is None:
                print("training", flush=True)
                end = time.monotonic() + args.seconds
            train.train_step(model, optimizer, images, labels)
            if time.monotonic() >= end:
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

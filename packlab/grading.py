"""Graded checks for the exercise notebooks: behavioural tests with instant feedback.

An exercise asks you to write one piece of a data pipeline (a dataset class, a packing
function, a shard splitter). ``check(exercise_id, candidate)`` then runs your code
against the generated dataset and prints which parts work and, for each part that does
not, what went wrong and a hint::

    >>> from packlab.grading import check, list_checks
    >>> result = check("jpeg_dataset", JpegFolderDataset)     # doctest: +SKIP
    >>> result.passed, result.score, result.max_score          # doctest: +SKIP
    (True, 5, 5)

The checks are behavioural: they never look at how your code is written, only at what
it delivers. What they verify, depending on the exercise:

* every sample arrives exactly once per epoch (no loss, no duplicates), across
  DataLoader workers and simulated ranks;
* each sample's label, and its pixels (or its JPEG bytes), match the dataset's manifest;
* the code works with several workers under both the ``fork`` and the ``spawn`` start
  method, and no archive handle opened in the parent is then used by the workers;
* shuffling really changes the order between epochs, reproducibly, within a bounded
  buffer; written archives follow the conventions of the chapters.

Each check reads a few hundred samples, so it takes seconds. The archives it reads are
written once by :mod:`packlab.pack` (the reference writers, not yours) and cached under
``<data root>/packed/grading/``.

How a check protects your kernel
--------------------------------
A dataset that hangs must not hang the notebook. Every check therefore runs its parts
in a child process (forked from the kernel, in a process group of its own) and waits for
each part with a deadline. A part that overruns it is reported as failed, the child and
every process it started (DataLoader workers included) are killed, and the remaining
parts run in a fresh child. On top of that every DataLoader a check creates has a
``timeout``, and an epoch that delivers far more samples than exist is cut short. The
limits are the ``timeout`` (whole check), ``part_timeout`` and ``loader_timeout`` keyword
arguments of :func:`check`.

How a class defined in a notebook is tested under ``spawn``
-----------------------------------------------------------
With ``spawn`` (and ``forkserver``) a DataLoader pickles the dataset and each worker, a
fresh Python process, imports the class by module and name. A class defined in a
notebook lives in the kernel's ``__main__``, which a worker cannot import, so it would
fail for a reason that has nothing to do with the attendee's code. The check solves this
the way one would in a project: it puts the class into a module. IPython keeps the
source of every executed cell (in :mod:`linecache`, under the file name recorded in the
code objects of the class's methods); the check takes the cell that defined the class,
keeps its imports, function and class definitions and literal constants, writes them to
a temporary module on ``sys.path`` (which spawn workers inherit) and imports the class
from there. The workers then run exactly the code the attendee wrote: a handle that
cannot be pickled still fails to pickle, and a handle that is not reopened in the worker
is still missing. This is why an exercise class must sit in **one cell together with the
imports it needs**; when it uses a name defined in another cell, the spawn part says so.
Classes defined in a real module (tests, your own package) are used as they are.

How sharing a parent's handle is caught every time
--------------------------------------------------
Under ``fork``, workers inherit the parent's open files. Two workers reading through one
inherited ``ZipFile`` share one file offset, and whether their seek+read pairs collide is
a matter of timing. To make the failure certain rather than likely, the fork parts give
each worker a ``worker_init_fn`` that points every descriptor the worker inherited on the
archive at ``/dev/null``. A dataset that opens its own handle in the worker never notices;
one that reads through the parent's handle fails on its first read.

Grading a whole notebook
------------------------
When the environment variable named by :data:`RESULTS_ENV_VAR` is set (``python -m
packlab.grade`` sets it for the kernel it starts), every :func:`check` appends its result
as one JSON line to that file.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import csv
import dis
import functools
import hashlib
import importlib
import io
import json
import linecache
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import sys
import tarfile
import tempfile
import time
import traceback
import types
import warnings
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader

from packlab import audit, data, pack, paths
from packlab.transforms import RAW_SHAPE, decode_and_resize

#: Environment variable naming a JSON-lines file that every check appends its result to.
RESULTS_ENV_VAR = "PACKLAB_GRADE_RESULTS"
#: Default time limits in seconds: the whole check, one part, one DataLoader batch.
#: Generous, because four spawn workers each import torch: on a busy two-core machine the
#: first batch can take tens of seconds. A hanging part is reported after PART_TIMEOUT.
CHECK_TIMEOUT = 600.0
PART_TIMEOUT = 120.0
LOADER_TIMEOUT = 60.0


class PartFailed(Exception):
    """Raised by a part of a check with a message saying what the candidate did wrong."""


# ------------------------------------------------------------------------------ results


@dataclass
class PartResult:
    """The outcome of one graded part of a check."""

    name: str
    description: str
    passed: bool
    message: str
    hint: str
    seconds: float = 0.0


@dataclass
class CheckResult:
    """The outcome of :func:`check`: one :class:`PartResult` per graded part, one point each."""

    exercise_id: str
    candidate: str
    parts: list[PartResult]
    seconds: float

    @property
    def score(self) -> int:
        return sum(p.passed for p in self.parts)

    @property
    def max_score(self) -> int:
        return len(self.parts)

    @property
    def passed(self) -> bool:
        return self.score == self.max_score

    def report(self) -> str:
        """The friendly report :func:`check` prints: one line per part, details and a hint per failure."""
        width = max(len(p.name) for p in self.parts)
        lines = [f"check {self.exercise_id!r} on {self.candidate}: {self.score}/{self.max_score} parts passed"]
        for part in self.parts:
            mark = "✓" if part.passed else "✗"
            lines.append(f"  {mark} {part.name.ljust(width)}  {part.description}")
            if not part.passed:
                lines += [f"      {line}" for line in part.message.splitlines()]
                lines.append(f"      hint: {part.hint}")
        if self.passed:
            lines.append(f"All parts passed ({self.seconds:.1f} s). Well done!")
        else:
            lines.append(f"Fix the parts marked ✗ and run the check again ({self.seconds:.1f} s).")
        return "\n".join(lines)

    __str__ = report

    def __repr__(self) -> str:
        return f"<CheckResult {self.exercise_id}: {self.score}/{self.max_score}>"

    def to_dict(self) -> dict:
        """Plain data for JSON reports."""
        out = asdict(self)
        out.update(score=self.score, max_score=self.max_score, passed=self.passed)
        return out


class CheckInfo(NamedTuple):
    """What :func:`list_checks` tells about one exercise check."""

    id: str
    notebook: str
    description: str
    signature: str
    parts: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.id} ({self.notebook}): {self.description}\n    {self.signature}\n    parts: {', '.join(self.parts)}"


# ----------------------------------------------------------------- describing failures


def _describe(exc: BaseException) -> str:
    """A short account of an exception: type, message, and where in the candidate's code it arose.

    Exceptions re-raised from DataLoader workers carry the worker's traceback in their
    message; the original exception (its last line) is what the attendee needs to see.
    """
    text = str(exc)
    if "Original Traceback" in text:
        lines = [line for line in text.splitlines() if line.strip()]
        where = _candidate_frame(text)
        return f"in a DataLoader worker: {lines[-1].strip()}{where}"
    formatted = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if len(message) > 400:
        message = message[:400] + " ..."
    return message + _candidate_frame(formatted)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _candidate_frame(formatted_traceback: str) -> str:
    """' (in NAME, line N of your code)' for the innermost frame outside libraries and packlab."""
    library_markers = ("site-packages", f"{os.sep}packlab{os.sep}", f"{os.sep}lib{os.sep}python", "<frozen")
    found = [m for m in _FRAME.finditer(formatted_traceback) if not any(s in m.group(1) for s in library_markers)]
    if not found:
        return ""
    match = found[-1]
    return f" (in {match.group(3)}, line {match.group(2)} of your code)"


def _short(value: Any) -> str:
    """A compact repr for a call's arguments in messages."""
    if isinstance(value, Path):
        return repr(f".../{value.name}")
    if isinstance(value, (list, tuple)) and len(value) > 3:
        return f"<{len(value)} items>"
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ------------------------------------------------------------------------ check context


@dataclass
class Context:
    """What a part of a check gets: the candidate, the fixtures, the limits, a scratch folder."""

    candidate: Any
    fixtures: dict
    loader_timeout: float
    workdir: Path
    memo: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return getattr(self.candidate, "__name__", type(self.candidate).__name__)

    def call(self, *args, **kwargs):
        """Call the candidate; an exception becomes a :class:`PartFailed` naming the call."""
        return _call(self.candidate, self.name, *args, **kwargs)

    def scratch(self, name: str) -> Path:
        """A fresh empty folder for this part (removed when the check ends)."""
        folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir))
        return folder

    def importable(self):
        """The candidate as an importable class, for spawn workers (see the module docstring)."""
        if "importable" not in self.memo:
            self.memo["importable"] = importable_copy(self.candidate, self.workdir / "modules")
        return self.memo["importable"]


def _call(fn, name: str, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        shown = ", ".join([_short(a) for a in args] + [f"{k}={_short(v)}" for k, v in kwargs.items()])
        call = name if name.endswith((")", "]")) else f"{name}({shown})"
        raise PartFailed(f"{call} raised {_describe(exc)}") from exc


# ------------------------------------------------------- making notebook classes importable


def _code_objects(obj) -> list[types.CodeType]:
    """The code objects of a function, or of every method of a class (properties included)."""
    if isinstance(obj, type):
        codes = []
        for value in vars(obj).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                codes += [f.__code__ for f in (value.fget, value.fset, value.fdel) if f is not None]
            elif isinstance(value, types.FunctionType):
                codes.append(value.__code__)
        return codes
    code = getattr(obj, "__code__", None)
    return [code] if code is not None else []


def _nested(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested(const)


def _definitions_only(source: str, filename: str) -> str:
    """Keep a cell's imports, function and class definitions and literal constants.

    Everything else (calls, loops, a ``check(...)``) is dropped, because a spawn worker
    imports this module and must not rerun the cell's work.
    """
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        from IPython.core.inputtransformer2 import TransformerManager  # cells may hold %magics

        tree = ast.parse(TransformerManager().transform_cell(source), filename)
    kept = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            kept.append(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            try:
                ast.literal_eval(node.value)
            except ValueError:
                continue
            kept.append(node)
    return ast.unparse(ast.Module(body=kept, type_ignores=[])) + "\n"


def _unresolved_globals(obj, module: types.ModuleType) -> list[str]:
    """Global names the code of ``obj`` reads that ``module`` neither defines nor imports."""
    loaded, stored = set(), set()
    for code in _code_objects(obj):
        for inner in _nested(code):
            for instruction in dis.get_instructions(inner):
                if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                    loaded.add(instruction.argval)
                elif instruction.opname == "STORE_GLOBAL":
                    stored.add(instruction.argval)
    known = set(vars(module)) | set(dir(builtins)) | stored
    return sorted(loaded - known)


def importable_copy(candidate, folder: Path):
    """Return ``candidate`` (a class or function) in a form spawn workers can import.

    Objects defined in an importable module are returned unchanged. Objects defined in a
    notebook (or any ``__main__``) are rebuilt from the source of their defining cell in
    a module written to ``folder``, which is put on ``sys.path``; see the module docstring.
    Raises :class:`PartFailed` with advice when that is not possible.
    """
    name = getattr(candidate, "__name__", None)
    module_name = getattr(candidate, "__module__", None)
    qualname = getattr(candidate, "__qualname__", "")
    if module_name and module_name != "__main__" and "<locals>" not in qualname:
        with contextlib.suppress(Exception):
            found = importlib.import_module(module_name)
            for attribute in qualname.split("."):
                found = getattr(found, attribute)
            if found is candidate:
                return candidate
    codes = _code_objects(candidate)
    files = {code.co_filename for code in codes}
    lines = linecache.getlines(next(iter(files))) if len(files) == 1 else []
    if not lines:
        raise PartFailed(
            f"cannot find the source of {name}, so spawn workers cannot import it. "
            "Define it in one notebook cell (not with exec), or in a .py module."
        )
    source = _definitions_only("".join(lines), next(iter(files)))
    module_name = "_packlab_candidate_" + hashlib.sha1(source.encode()).hexdigest()[:12]
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{module_name}.py"
    if not target.exists():
        partial = target.with_suffix(".partial")
        partial.write_text(source)
        os.replace(partial, target)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))  # spawn workers receive the parent's sys.path
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except NameError as exc:
        raise PartFailed(
            f"the cell that defines {name} uses a name it does not define ({exc}). Spawn workers "
            "import only that cell: move the definition or import into the same cell."
        ) from None
    copy = getattr(module, name, None)
    if copy is None:
        raise PartFailed(f"{name} is not defined at the top level of its cell; spawn workers cannot import it.")
    missing = _unresolved_globals(copy, module)
    if missing:
        raise PartFailed(
            f"{name} uses {', '.join(missing)}, which its cell does not define or import. Spawn workers "
            "import only the cell that defines the class: put those imports and definitions in that cell."
        )
    return copy


# ----------------------------------------------------------------- fixtures and references


def _fixture_root() -> Path:
    """Where checks cache the archives they read, one folder per dataset version."""
    return paths.packed_dir() / "grading" / data.sha256_file(paths.manifest_path())[:12]


@contextlib.contextmanager
def _locked(folder: Path):
    """Hold an exclusive lock on ``folder`` so concurrent checks do not write one fixture twice."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except ImportError:  # Windows: no locking, fixtures are still written atomically
            pass
        yield


def subset(count: int, seed: int) -> list[data.Sample]:
    """A fixed random subset of the manifest (sorted by key): the samples a check reads."""
    manifest = data.load_manifest()
    chosen = np.random.default_rng(seed).choice(len(manifest), size=count, replace=False)
    return [manifest[i] for i in sorted(chosen)]


def fixture_zip(name: str, samples: Sequence[data.Sample], members: str) -> Path:
    """A zip of ``samples`` written by the reference :func:`packlab.pack.write_zip`, cached."""
    root = _fixture_root()
    target = root / f"{name}.zip"
    with _locked(root):
        if not target.exists():
            pack.write_zip(target, members=members, samples=samples, progress=False)
    return target


def fixture_shards(name: str, samples: Sequence[data.Sample], maxcount: int) -> list[Path]:
    """Tar shards of ``samples`` written by the reference :func:`packlab.pack.write_tar_shards`, cached."""
    root = _fixture_root()
    folder = root / name
    done = folder / ".complete"
    with _locked(root):
        if not done.exists():
            pack.write_tar_shards(folder, samples=samples, maxcount=maxcount, seed=0, progress=False)
            done.touch()
    return sorted(folder.glob("shard-*.tar"))


def reference_pixels(keys: Sequence[str]) -> dict[str, str]:
    """Pixel digests of the standard transform of each key's original (see :mod:`packlab.audit`), cached."""
    root = _fixture_root()
    cache = root / "reference-digests.json"
    with _locked(root):
        known = json.loads(cache.read_text()) if cache.exists() else {}
        missing = [k for k in keys if k not in known]
        if missing:
            known.update(audit.reference_digests(missing))
            partial = cache.with_suffix(".partial")
            partial.write_text(json.dumps(known, sort_keys=True))
            os.replace(partial, cache)
    return {k: known[k] for k in keys}


def sha256_transform(data: bytes, source: str | None = None) -> torch.Tensor:
    """A transform the checks pass instead of the standard one: the SHA-256 of the bytes, as 32 uint8.

    The manifest holds each JPEG's SHA-256, so this verifies every byte of every sample
    without the cost of decoding it.
    """
    return torch.frombuffer(bytearray(hashlib.sha256(data).digest()), dtype=torch.uint8)


def _cut_inherited_handles(path: str, worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: point every descriptor inherited on ``path`` at /dev/null.

    Runs first thing in each worker. A dataset that opens its own handle in the worker is
    unaffected; one that reads through a handle opened in the parent now fails on its first
    read instead of only when two workers' reads happen to collide. Linux only (it reads
    ``/proc/self/fd``); elsewhere it does nothing.
    """
    fd_dir = "/proc/self/fd"
    if not os.path.isdir(fd_dir):
        return
    target = os.path.realpath(path)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        for entry in os.listdir(fd_dir):
            fd = int(entry)
            if fd == null:
                continue
            try:
                link = os.readlink(f"{fd_dir}/{entry}")
            except OSError:
                continue
            if link == target:
                os.dup2(null, fd)
    finally:
        os.close(null)


def _open_handles(path: Path) -> int | None:
    """How many descriptors this process holds on ``path`` (None where /proc is unavailable)."""
    fd_dir = "/proc/self/fd"
    if not os.path.isdir(fd_dir):
        return None
    target = os.path.realpath(path)
    count = 0
    for entry in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            count += os.readlink(f"{fd_dir}/{entry}") == target
    return count


def _open_handle_attributes(obj) -> list[str]:
    """Attributes of ``obj`` (or values inside its dicts and lists) that are open files or ZipFiles."""

    def is_open(value) -> bool:
        if isinstance(value, zipfile.ZipFile):
            return value.fp is not None
        if isinstance(value, tarfile.TarFile):
            return not value.closed
        return isinstance(value, io.IOBase) and not value.closed

    found = []
    for name, value in vars(obj).items():
        values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
        if any(is_open(v) for v in values):
            found.append(name)
    return found


# ------------------------------------------------------------------- epochs and audits


def _loader(ctx: Context, dataset, workers: int = 0, method: str | None = None, **kwargs) -> DataLoader:
    """A DataLoader as the checks use it: explicit start method and a timeout whenever workers run."""
    kwargs.setdefault("batch_size", 16)
    if workers:
        kwargs.update(num_workers=workers, multiprocessing_context=method or "fork", timeout=ctx.loader_timeout)
    return DataLoader(dataset, **kwargs)


def _collect(loader, expected: int, digest: str) -> list[tuple[str, int, str]]:
    """One epoch as ``(key, label, digest)`` records; ``digest`` is ``"pixels"`` or ``"sha256"``.

    Stops with a failure when the loader delivers more than three times the samples that
    exist, so an endless iterable cannot run forever.
    """
    records = []
    limit = 3 * expected + 64
    iterator = None
    try:
        iterator = iter(loader)
        for batch in iterator:
            if not (isinstance(batch, (tuple, list)) and len(batch) == 3):
                raise PartFailed(
                    "with return_key=True every sample must be (image, label, key), so batches are "
                    f"(images, labels, keys); a batch was a {type(batch).__name__}"
                    + (f" of {len(batch)} items" if isinstance(batch, (tuple, list)) else "")
                )
            images, labels, keys = batch
            if not (isinstance(labels, torch.Tensor) and not labels.is_floating_point() and labels.dim() == 1):
                raise PartFailed(
                    f"labels were collated into {type(labels).__name__}"
                    + (f" of {type(labels[0]).__name__}" if isinstance(labels, (list, tuple)) and labels else "")
                    + "; return each label as an int so the DataLoader makes a tensor of them"
                )
            for i, key in enumerate(keys):
                records.append((str(key), int(labels[i]), _digest(images[i], digest)))
            if len(records) > limit:
                raise PartFailed(f"the epoch delivered more than {limit} samples ({expected} exist) and did not end")
    except PartFailed:
        _stop_workers(iterator)
        raise
    except Exception as exc:
        _stop_workers(iterator)
        raise PartFailed(f"reading an epoch raised {_describe(exc)}") from exc
    return records


def _stop_workers(iterator) -> None:
    """Stop the workers of an epoch that failed, at once.

    Left to itself, a DataLoader iterator whose workers raised waits up to five seconds
    per worker when it is cleaned up, and the clean-up may even run later in another
    process (a worker forked afterwards inherits the failed iterator), which then
    complains. Killing the workers and shutting the iterator down here avoids both.
    """
    workers = getattr(iterator, "_workers", None)
    if not workers:
        return
    for worker in workers:
        with contextlib.suppress(Exception):
            worker.kill()
    with contextlib.suppress(Exception):
        iterator._shutdown_workers()


def _digest(image, kind: str) -> str:
    if kind == "pixels":
        if not isinstance(image, torch.Tensor) or tuple(image.shape) != (3, RAW_SHAPE[0], RAW_SHAPE[1]):
            raise PartFailed(
                f"images must be 3x{RAW_SHAPE[0]}x{RAW_SHAPE[1]} tensors (the standard transform), got "
                f"{type(image).__name__} {tuple(getattr(image, 'shape', ()))}"
            )
        return audit.tensor_digest(image)
    if not (isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and tuple(image.shape) == (32,)):
        raise PartFailed(
            f"the check passed transform={sha256_transform.__name__} and got back "
            f"{type(image).__name__} {tuple(getattr(image, 'shape', ()))} instead of its 32-byte digest: "
            "apply the transform given to the constructor to the encoded bytes, in place of the default"
        )
    return bytes(image.numpy()).hex()


def _audit(records, expected: Sequence[data.Sample], reference: dict[str, str], workers: int = 0) -> str:
    """Audit one epoch; return a success message or raise :class:`PartFailed` with the report."""
    report = audit.audit_epoch(records, expected, reference)
    if report.ok:
        return f"{len(records)} samples, each exactly once, labels and contents match the manifest"
    message = report.summary()
    counts = set(report.duplicated.values())
    if workers > 1 and counts == {workers} and not report.missing:
        message += f"\n(every sample arrived {workers} times, once per worker: the workers do not split the work)"
    raise PartFailed(message)


def _preflight_spawn(dataset) -> None:
    """Do here, at once, what each spawn worker will do: unpickle a copy, then read one sample.

    Starting spawn workers takes seconds (each imports torch); a dataset that cannot be
    pickled, or cannot read at all, is reported without that wait and with a clearer message.
    """
    try:
        copy = pickle.loads(pickle.dumps(dataset))
    except Exception as exc:
        raise PartFailed(f"spawn workers receive a pickled copy of the dataset, but pickling it raised {_describe(exc)}") from None
    try:
        if isinstance(copy, torch.utils.data.IterableDataset):
            samples = iter(copy)
            next(samples)
            if hasattr(samples, "close"):
                samples.close()
        else:
            copy[0]
    except Exception as exc:
        raise PartFailed(f"a pickled copy of the dataset could not read its first sample: {_describe(exc)}") from None


def _sha_reference(samples: Sequence[data.Sample]) -> dict[str, str]:
    return {s.key: s.sha256 for s in samples}


def _epoch_keys(loader, expected: int) -> list[str]:
    return [key for key, _, _ in _collect(loader, expected, "sha256")]


# ============================================================================ exercises
#
# Each exercise: fixtures (prepared in the kernel, cached on disk) and a list of parts.
# A part is a function of the Context that returns a short success message or raises
# PartFailed; any other exception fails the part with its description.


@dataclass(frozen=True)
class Part:
    name: str
    description: str
    hint: str
    run: Callable[[Context], str]


@dataclass(frozen=True)
class Exercise:
    id: str
    notebook: str
    description: str
    signature: str
    fixtures: Callable[[], dict]
    parts: tuple[Part, ...]


_EXERCISES: dict[str, Exercise] = {}


def _exercise(id, notebook, description, signature, fixtures, parts) -> None:
    _EXERCISES[id] = Exercise(id, notebook, description, signature, fixtures, tuple(Part(*p) for p in parts))


def _check_item(item, with_key: bool, key: str | None = None) -> None:
    """One dataset item: (image, label) or (image, label, key), image a standard 3x256x256 float tensor."""
    size = 3 if with_key else 2
    if not (isinstance(item, tuple) and len(item) == size):
        kind = f"{type(item).__name__} of {len(item)}" if isinstance(item, (tuple, list)) else type(item).__name__
        raise PartFailed(f"an item must be a tuple (image, label{', key' if with_key else ''}); got a {kind}")
    image, label = item[0], item[1]
    if not (isinstance(image, torch.Tensor) and image.dtype == torch.float32 and tuple(image.shape) == (3, 256, 256)):
        raise PartFailed(
            f"the image must be a float32 tensor of shape (3, 256, 256); got {type(image).__name__} "
            f"{getattr(image, 'dtype', '')} {tuple(getattr(image, 'shape', ()))}"
        )
    is_int = isinstance(label, (int, np.integer)) and not isinstance(label, bool)
    is_int = is_int or (isinstance(label, torch.Tensor) and label.dim() == 0 and not label.is_floating_point())
    if not is_int:
        raise PartFailed(f"the label must be an int; got {type(label).__name__} {label!r}")
    if with_key and item[2] != key:
        raise PartFailed(f"expected key {key!r} for this index, got {item[2]!r}")


# ----------------------------------------------------------------- 1. JPEG-folder dataset


def _jpeg_fixtures() -> dict:
    samples = subset(240, seed=1)
    return {"samples": samples, "pixels": reference_pixels([s.key for s in samples[:96]])}


def _jpeg_length(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    everything = ctx.call(transform=sha256_transform, return_key=True)
    if len(everything) != len(data.load_manifest()):
        raise PartFailed(f"with keys=None len() is {len(everything)}, expected {len(data.load_manifest())} (every key in labels.csv)")
    fifth = everything[5]
    if not (isinstance(fifth, tuple) and len(fifth) == 3 and fifth[2] == "000005"):
        raise PartFailed("with keys=None, index 5 must be key '000005' (labels.csv order)")
    chosen = ctx.call(keys=[s.key for s in samples])
    if len(chosen) != len(samples):
        raise PartFailed(f"with {len(samples)} keys given, len() is {len(chosen)}")
    return f"len() is {len(everything)} for all keys and {len(chosen)} for {len(samples)} keys"


def _jpeg_items(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    ds = ctx.call(keys=[s.key for s in samples], return_key=True)
    for index in (0, 1, len(samples) - 1):
        _check_item(_call(ds.__getitem__, f"dataset[{index}]", index), True, samples[index].key)
    plain = ctx.call(keys=[s.key for s in samples[:2]])
    _check_item(_call(plain.__getitem__, "dataset[0]", 0), False)
    return "items are (float32 3x256x256 image, int label[, key])"


def _jpeg_labels_pixels(ctx: Context) -> str:
    samples = ctx.fixtures["samples"][:96]
    ds = ctx.call(keys=[s.key for s in samples], return_key=True)
    records = _collect(_loader(ctx, ds, batch_size=24), len(samples), "pixels")
    return _audit(records, samples, ctx.fixtures["pixels"])


def _jpeg_workers(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    ds = ctx.call(keys=[s.key for s in samples], transform=sha256_transform, return_key=True)
    loader = _loader(ctx, ds, workers=2, method="fork", shuffle=True)
    return _audit(_collect(loader, len(samples), "sha256"), samples, _sha_reference(samples), workers=2)


def _jpeg_bad_key(ctx: Context) -> str:
    try:
        ds = ctx.candidate(keys=["000001", "777777"], transform=sha256_transform)
        item = ds[1]
    except Exception as exc:
        if "777777" in str(exc):
            return f"unknown key refused: {type(exc).__name__}"
        raise PartFailed(f"the error does not name the missing key or file: {_describe(exc)}") from None
    raise PartFailed(f"dataset[1] for key '777777' (no such image) returned {type(item).__name__} instead of raising")


_exercise(
    "jpeg_dataset",
    "01_jpeg_dataset",
    "a map-style Dataset over the folder of JPEGs and labels.csv",
    "JpegFolderDataset(keys=None, transform=None, return_key=False): item i is (transform(jpeg bytes), label[, key]); "
    "transform defaults to packlab.transforms.standard_transform; keys=None means every key of labels.csv, in order",
    _jpeg_fixtures,
    [
        ("length", "len() counts the keys given; keys=None means every key, in labels.csv order",
         "keep the list of keys in __init__ (all keys of labels.csv when keys is None) and return its length", _jpeg_length),
        ("items", "an item is (float32 3x256x256 image, int label), plus the key with return_key=True",
         "read the file's bytes, return (self.transform(data), label) and add the key when return_key is true", _jpeg_items),
        ("labels_pixels", "labels and pixels match the manifest (96 samples, no workers)",
         "look the label up by key in labels.csv, not by index; pass the raw file bytes to standard_transform", _jpeg_labels_pixels),
        ("workers", "2 workers, shuffled: every sample exactly once, bytes match the manifest's SHA-256",
         "apply the transform given to the constructor to the file's bytes; derive everything from the index alone", _jpeg_workers),
        ("bad_key", "a key without an image raises an error that names it",
         "let the missing file raise (or check keys against labels.csv) and name the key; never substitute another sample", _jpeg_bad_key),
    ],
)


# ----------------------------------------------------------------- 1b. a timing harness


class _FakeLoader:
    """A loader with known timings: a start-up pause, then batches of known sizes at a known pace."""

    batch_size = 32  # tempting, but the last batch is smaller

    def __init__(self, batch_sizes=(32, 32, 32, 4), startup=0.15, per_batch=0.01):
        self.batch_sizes, self.startup, self.per_batch = batch_sizes, startup, per_batch
        self.passes = 0

    def __len__(self):
        return len(self.batch_sizes)

    def __iter__(self):
        self.passes += 1
        return self._epoch()

    def _epoch(self):
        time.sleep(self.startup)
        for n in self.batch_sizes:
            time.sleep(self.per_batch)
            yield torch.zeros(n, 1), torch.zeros(n, dtype=torch.long)

    @property
    def minimum_epoch_seconds(self) -> float:
        return self.startup + self.per_batch * len(self.batch_sizes)


def _timing_run(ctx: Context):
    """Run the candidate once per child on a fake loader; parts share the result."""
    if "timing" not in ctx.memo:
        loader = _FakeLoader()
        start = time.perf_counter()
        result = ctx.call(loader, epochs=3)
        wall = time.perf_counter() - start
        fields = {}
        for name in ("epoch_seconds", "images_per_epoch", "images_per_s"):
            value = result.get(name) if isinstance(result, dict) else getattr(result, name, None)
            if value is None:
                raise PartFailed(f"the result has no {name!r} (return a dict with epoch_seconds, images_per_epoch, images_per_s)")
            fields[name] = value
        ctx.memo["timing"] = (loader, wall, fields)
    return ctx.memo["timing"]


def _timing_epochs(ctx: Context) -> str:
    loader, _, result = _timing_run(ctx)
    seconds = list(result["epoch_seconds"])
    if len(seconds) != 3 or not all(isinstance(s, (float, int)) and s > 0 for s in seconds):
        raise PartFailed(f"epochs=3 should give 3 positive epoch times, got {seconds!r}")
    if loader.passes != 3:
        raise PartFailed(f"the loader was iterated {loader.passes} times for 3 epochs; start a fresh pass (for batch in loader) per epoch")
    return "3 epochs, 3 passes over the loader, 3 timings"


def _timing_images(ctx: Context) -> str:
    _, _, result = _timing_run(ctx)
    if result["images_per_epoch"] != 100:
        raise PartFailed(f"an epoch of batches of 32, 32, 32 and 4 images holds 100 images; you counted {result['images_per_epoch']!r}")
    return "100 images per epoch counted from the batches"


def _timing_startup(ctx: Context) -> str:
    loader, wall, result = _timing_run(ctx)
    seconds = list(result["epoch_seconds"])
    floor = loader.minimum_epoch_seconds - 0.005
    short = [s for s in seconds if s < floor]
    if short:
        raise PartFailed(
            f"each epoch takes at least {loader.minimum_epoch_seconds:.2f} s ({loader.startup:.2f} s before the first batch), "
            f"you measured {', '.join(f'{s:.3f}' for s in seconds)} s"
        )
    if sum(seconds) > wall + 0.005:
        raise PartFailed(f"the epochs add up to {sum(seconds):.3f} s, more than the {wall:.3f} s the whole call took")
    return f"epochs of {', '.join(f'{s:.2f}' for s in seconds)} s include the wait for the first batch"


def _timing_rate(ctx: Context) -> str:
    _, _, result = _timing_run(ctx)
    seconds = list(result["epoch_seconds"])
    expected = result["images_per_epoch"] * len(seconds) / sum(seconds) if sum(seconds) > 0 else float("nan")
    rate = float(result["images_per_s"])
    if not (abs(rate - expected) <= 0.02 * expected):
        raise PartFailed(f"images_per_s is {rate:.1f}, but {result['images_per_epoch']} images x {len(seconds)} epochs / {sum(seconds):.3f} s = {expected:.1f}")
    return f"{rate:.0f} images/s = images over all epochs / total time"


_exercise(
    "jpeg_timing",
    "01_jpeg_dataset",
    "a timing harness: per-epoch wall time and images/s of any loader",
    "time_epochs(loader, epochs=2) -> dict with 'epoch_seconds' (list of float, one per epoch), "
    "'images_per_epoch' (int) and 'images_per_s' (float, over all epochs)",
    dict,
    [
        ("epochs", "one fresh pass and one timing per epoch",
         "loop `for epoch in range(epochs)`, and inside it `for batch in loader`; append one time per epoch", _timing_epochs),
        ("images", "images are counted from the batches, the last partial batch included",
         "add the length of each batch's first tensor (images.shape[0]); len(loader) * batch_size overcounts the last batch", _timing_images),
        ("startup", "the wait for the first batch (worker start-up) is inside the epoch time",
         "start the clock before the `for` loop asks for the first batch and stop it after the last one", _timing_startup),
        ("rate", "images/s = images per epoch x epochs / total seconds",
         "divide all images delivered by the sum of the epoch times", _timing_rate),
    ],
)


# ------------------------------------------------------------------------- 2. zip packing


def _zip_pack_fixtures() -> dict:
    samples = subset(150, seed=2)
    return {"samples": samples, "raw_samples": samples[:60]}


def _packed(ctx: Context, members: str) -> Path:
    """Pack the fixture samples with the candidate once per child; parts share the archive."""
    if members not in ctx.memo:
        samples = ctx.fixtures["samples"] if members == "jpeg" else ctx.fixtures["raw_samples"]
        dst = ctx.scratch(f"pack-{members}") / f"images-{members}.zip"
        ctx.call(dst, samples, members=members)
        if not dst.is_file():
            raise PartFailed(f"no file was written at the dst path given ({dst.name})")
        if not zipfile.is_zipfile(dst):
            raise PartFailed(f"{dst.name} is not a zip file")
        ctx.memo[members] = dst
    return ctx.memo[members]


def _names_once(archive: zipfile.ZipFile) -> list[str]:
    names = archive.namelist()
    twice = [n for n, c in Counter(names).items() if c > 1]
    if twice:
        raise PartFailed(f"members stored more than once: {', '.join(sorted(twice)[:5])}")
    return names


def _zip_valid(ctx: Context) -> str:
    dst = _packed(ctx, "jpeg")
    with zipfile.ZipFile(dst) as archive:
        bad = archive.testzip()
    if bad is not None:
        raise PartFailed(f"member {bad} fails its CRC check")
    return f"{dst.name} is a valid zip ({dst.stat().st_size / 1e6:.1f} MB)"


def _zip_jpeg_members(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    with zipfile.ZipFile(_packed(ctx, "jpeg")) as archive:
        names = set(_names_once(archive))
        wanted = {pack.member_name(s.key, "jpeg") for s in samples}
        if wanted - names:
            raise PartFailed(f"{len(wanted - names)} members missing, e.g. {sorted(wanted - names)[0]} (name them <key>.jpg)")
        extra = names - wanted - {pack.ZIP_LABELS_MEMBER}
        if extra:
            raise PartFailed(f"unexpected members: {', '.join(sorted(extra)[:5])}")
        wrong = [s.key for s in samples if hashlib.sha256(archive.read(f"{s.key}.jpg")).hexdigest() != s.sha256]
    if wrong:
        raise PartFailed(f"{len(wrong)} members differ from the original files, e.g. {wrong[0]}.jpg")
    return f"{len(samples)} members <key>.jpg, byte-identical to the originals"


def _zip_raw_members(ctx: Context) -> str:
    samples = ctx.fixtures["raw_samples"]
    size = int(np.prod(RAW_SHAPE))
    with zipfile.ZipFile(_packed(ctx, "raw")) as archive:
        names = set(_names_once(archive))
        wanted = {pack.member_name(s.key, "raw") for s in samples}
        if wanted - names:
            raise PartFailed(f"{len(wanted - names)} members missing, e.g. {sorted(wanted - names)[0]} (name them <key>.raw)")
        extra = names - wanted - {pack.ZIP_LABELS_MEMBER}
        if extra:
            raise PartFailed(f"unexpected members: {', '.join(sorted(extra)[:5])}")
        for s in samples:
            raw = archive.read(f"{s.key}.raw")
            if len(raw) != size:
                raise PartFailed(f"{s.key}.raw has {len(raw)} bytes; 256x256x3 uint8 pixels are {size} bytes")
            expected = decode_and_resize(data.image_path(s.key).read_bytes()).tobytes()
            if raw != expected:
                raise PartFailed(f"{s.key}.raw holds other pixels than decode_and_resize of the original")
    return f"{len(samples)} members <key>.raw, each the 256x256x3 uint8 pixels of decode_and_resize"


def _zip_labels(ctx: Context) -> str:
    for members in ("jpeg", "raw"):
        samples = ctx.fixtures["samples"] if members == "jpeg" else ctx.fixtures["raw_samples"]
        with zipfile.ZipFile(_packed(ctx, members)) as archive:
            if pack.ZIP_LABELS_MEMBER not in archive.namelist():
                raise PartFailed(f"the {members} zip has no {pack.ZIP_LABELS_MEMBER} member")
            text = archive.read(pack.ZIP_LABELS_MEMBER).decode()
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames != ["key", "label"]:
            raise PartFailed(f"{pack.ZIP_LABELS_MEMBER} must start with the header 'key,label'; found {reader.fieldnames}")
        labels = {row["key"]: row["label"] for row in reader}
        expected = {s.key: str(s.label) for s in samples}
        if labels != expected:
            wrong = sorted(k for k in expected.keys() | labels.keys() if labels.get(k) != expected.get(k))
            raise PartFailed(f"{pack.ZIP_LABELS_MEMBER} in the {members} zip disagrees with the manifest for {len(wrong)} keys, e.g. {wrong[0]}")
    return "labels.csv in both archives lists every key with its label"


def _zip_stored(ctx: Context) -> str:
    for members in ("jpeg", "raw"):
        with zipfile.ZipFile(_packed(ctx, members)) as archive:
            compressed = [i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
        if compressed:
            raise PartFailed(f"{len(compressed)} members of the {members} zip are compressed, e.g. {compressed[0]}")
    return "every member is stored uncompressed"


_exercise(
    "zip_pack",
    "02_zip_packing",
    "pack samples into one uncompressed zip, as encoded JPEG or as raw resized pixels",
    "pack_zip(dst, samples, members='jpeg') -> path: samples are manifest rows (packlab.data.Sample); writes "
    "<key>.jpg (original bytes) or, with members='raw', <key>.raw (decode_and_resize(...).tobytes()), plus labels.csv",
    _zip_pack_fixtures,
    [
        ("valid_zip", "writes a valid zip at dst",
         "open zipfile.ZipFile(dst, 'w') in a with block so the central directory is written when it closes", _zip_valid),
        ("jpeg_members", "members='jpeg': one <key>.jpg per sample, byte-identical to the original",
         "archive.writestr(f'{key}.jpg', original bytes) for each sample; read the file in binary mode", _zip_jpeg_members),
        ("raw_members", "members='raw': one <key>.raw per sample, the 256x256x3 uint8 pixels",
         "store decode_and_resize(jpeg_bytes).tobytes() under f'{key}.raw'", _zip_raw_members),
        ("labels", "a labels.csv member ('key,label' rows) makes each archive self-contained",
         "write 'key,label' and one line per sample into a member called labels.csv", _zip_labels),
        ("stored", "members are stored uncompressed (one seek and one read per sample)",
         "use compression=zipfile.ZIP_STORED (the default) for the archive and for every writestr", _zip_stored),
    ],
)


# ---------------------------------------------------------------------- 2b. reading a zip


def _zip_read_fixtures() -> dict:
    samples = subset(160, seed=3)
    raw_samples = samples[:64]
    return {
        "samples": samples,
        "raw_samples": raw_samples,
        "jpeg_zip": fixture_zip("read-jpeg-160", samples, "jpeg"),
        "raw_zip": fixture_zip("read-raw-64", raw_samples, "raw"),
        "pixels": reference_pixels([s.key for s in samples]),
    }


def _zip_read_items(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    ds = ctx.call(ctx.fixtures["jpeg_zip"], members="jpeg", return_key=True)
    if len(ds) != len(samples):
        raise PartFailed(f"the archive holds {len(samples)} samples; len() is {len(ds)}")
    for index in (0, len(samples) - 1):
        _check_item(_call(ds.__getitem__, f"dataset[{index}]", index), True, samples[index].key)
    picked = [samples[3].key, samples[1].key]
    few = ctx.call(ctx.fixtures["jpeg_zip"], members="jpeg", keys=picked, return_key=True)
    if len(few) != 2 or few[0][2] != picked[0]:
        raise PartFailed(f"with keys={picked!r} the dataset must hold those 2 keys in that order")
    return f"len() is {len(ds)}; items are (image, label, key); keys= selects and orders"


def _zip_read_epoch(ctx: Context, members: str) -> str:
    samples = ctx.fixtures["samples" if members == "jpeg" else "raw_samples"]
    ds = ctx.call(ctx.fixtures[f"{members}_zip"], members=members, return_key=True)
    records = _collect(_loader(ctx, ds, batch_size=32), len(samples), "pixels")
    return _audit(records, samples, ctx.fixtures["pixels"])


def _zip_self_contained(ctx: Context) -> str:
    samples = ctx.fixtures["samples"][:24]
    empty = ctx.scratch("no-data")
    previous = os.environ.get(paths.DATA_ENV_VAR)
    os.environ[paths.DATA_ENV_VAR] = str(empty)
    try:
        ds = ctx.call(ctx.fixtures["jpeg_zip"], members="jpeg", keys=[s.key for s in samples], return_key=True)
        records = _collect(_loader(ctx, ds, batch_size=8), len(samples), "pixels")
    finally:
        if previous is None:
            del os.environ[paths.DATA_ENV_VAR]
        else:
            os.environ[paths.DATA_ENV_VAR] = previous
    _audit(records, samples, ctx.fixtures["pixels"])
    return "reads labels and images from the archive alone"


_exercise(
    "zip_dataset",
    "02_zip_packing",
    "a map-style Dataset reading images and labels back from a zip (one process)",
    "ZipImageDataset(zip_path, members='jpeg', keys=None, return_key=False): item i is (image, label[, key]); "
    "<key>.jpg members through standard_transform, <key>.raw members through pixels_to_tensor; labels from the "
    "archive's labels.csv; keys=None means every key of labels.csv, in order",
    _zip_read_fixtures,
    [
        ("items", "len() and items (image, label, key); keys= selects and orders",
         "read labels.csv from the archive in __init__ and keep its keys (or the keys given) in a list", _zip_read_items),
        ("jpeg_epoch", "<key>.jpg members: labels and pixels match the manifest",
         "archive.read(f'{key}.jpg') gives the JPEG bytes; pass them to standard_transform",
         functools.partial(_zip_read_epoch, members="jpeg")),
        ("raw_epoch", "<key>.raw members: pixels bit-identical to the standard transform of the JPEG",
         "pixels_to_tensor(raw bytes) reshapes to 256x256x3 uint8 (height, width, channels) and converts",
         functools.partial(_zip_read_epoch, members="raw")),
        ("self_contained", "works without the image folder: labels come from the archive",
         "take labels from the archive's labels.csv, not from packlab.data or the data folder", _zip_self_contained),
    ],
)


# --------------------------------------------------------------- 3. per-worker zip handles


def _per_worker_fixtures() -> dict:
    samples = subset(320, seed=4)
    return {
        "samples": samples,
        "zip": fixture_zip("per-worker-jpeg-320", samples, "jpeg"),
        "pixels": reference_pixels([s.key for s in samples[:48]]),
    }


def _per_worker_no_handle(ctx: Context) -> str:
    path = ctx.fixtures["zip"]
    before = _open_handles(path)
    ds = ctx.call(path, return_key=True)
    after = _open_handles(path)
    if before is not None and after > before:
        raise PartFailed(f"after __init__ this process holds {after - before} open handle(s) on the archive; forked workers would share it")
    attributes = _open_handle_attributes(ds)
    if attributes:
        raise PartFailed(f"after __init__ the dataset holds open files in: {', '.join(attributes)}")
    if len(ds) != len(ctx.fixtures["samples"]):
        raise PartFailed(f"the archive holds {len(ctx.fixtures['samples'])} samples; len() is {len(ds)}")
    return "no handle on the archive is open after __init__"


def _per_worker_pickle(ctx: Context) -> str:
    samples = ctx.fixtures["samples"]
    # The importable copy of the class, as a spawn worker would unpickle it.
    ds = _call(ctx.importable(), ctx.name, ctx.fixtures["zip"], return_key=True)
    _check_item(_call(ds.__getitem__, "dataset[0]", 0), True, samples[0].key)
    try:
        copy = pickle.loads(pickle.dumps(ds))
    except Exception as exc:
        raise PartFailed(f"after reading a sample the dataset cannot be pickled: {_describe(exc)}") from None
    _check_item(_call(copy.__getitem__, "unpickled dataset[1]", 1), True, samples[1].key)
    return "reads in this process, then pickles (as spawn needs) and the copy reads too"


def _per_worker_epoch(ctx: Context, method: str, touch_first: bool) -> str:
    samples = ctx.fixtures["samples"]
    cls = ctx.importable() if method == "spawn" else ctx.candidate
    ds = _call(cls, ctx.name, ctx.fixtures["zip"], transform=sha256_transform, return_key=True)
    if touch_first:
        _call(ds.__getitem__, "dataset[0]", 0)
    if method == "spawn":
        _preflight_spawn(ds)
    # Four forked workers make interleaved reads through a shared handle near certain; under
    # spawn two suffice (each worker imports torch afresh, which is what costs time there).
    workers = 2 if method == "spawn" else 4
    loader = _loader(
        ctx, ds, workers=workers, method=method, shuffle=True,
        worker_init_fn=functools.partial(_cut_inherited_handles, str(ctx.fixtures["zip"])),
    )
    return _audit(_collect(loader, len(samples), "sha256"), samples, _sha_reference(samples), workers=workers)


def _per_worker_pixels(ctx: Context) -> str:
    samples = ctx.fixtures["samples"][:48]
    ds = ctx.call(ctx.fixtures["zip"], keys=[s.key for s in samples], return_key=True)
    return _audit(_collect(_loader(ctx, ds, batch_size=16), len(samples), "pixels"), samples, ctx.fixtures["pixels"])


def _per_worker_close(ctx: Context) -> str:
    path = ctx.fixtures["zip"]
    before = _open_handles(path)
    ds = ctx.call(path, return_key=True)
    _call(ds.__getitem__, "dataset[0]", 0)
    _call(ds.close, f"{ctx.name}.close")
    after = _open_handles(path)
    if before is not None and after > before:
        raise PartFailed(f"after close() this process still holds {after - before} handle(s) on the archive")
    attributes = _open_handle_attributes(ds)
    if attributes:
        raise PartFailed(f"after close() the dataset still holds open files in: {', '.join(attributes)}")
    return "close() releases the handle this process opened"


_exercise(
    "per_worker_zip",
    "03_per_worker_zip",
    "a zip Dataset with one lazily opened handle per process: 4 workers under fork and spawn",
    "PerWorkerZipDataset(zip_path, keys=None, transform=None, return_key=False) with close(): reads <key>.jpg "
    "members and labels.csv; opens its ZipFile in the process that reads (keyed by os.getpid()), never pickles one",
    _per_worker_fixtures,
    [
        ("no_handle_in_init", "__init__ leaves no handle on the archive open",
         "read labels.csv inside `with zipfile.ZipFile(path) as archive:` so it is closed again; open the reading "
         "handle later, in __getitem__", _per_worker_no_handle),
        ("pickle_after_use", "after reading in this process, the dataset still pickles and the copy reads",
         "define __getstate__ to return the state without the open handles (spawn workers get a pickled copy)", _per_worker_pickle),
        ("pixels", "labels and pixels match the manifest (48 samples, no workers)",
         "archive.read(f'{key}.jpg') gives the JPEG bytes; apply the transform (standard_transform by default)", _per_worker_pixels),
        ("fork", "4 workers under fork: every sample exactly once, bytes match the manifest",
         "a worker must read through a handle it opened itself: look the handle up by os.getpid()", functools.partial(_per_worker_epoch, method="fork", touch_first=False)),
        ("fork_after_parent_read", "4 fork workers after the parent itself read a sample",
         "a handle opened by the parent is inherited by forked workers; key handles by os.getpid() so each "
         "worker opens its own", functools.partial(_per_worker_epoch, method="fork", touch_first=True)),
        ("spawn", "4 workers under spawn (after the parent read a sample): every sample exactly once",
         "the dataset is pickled into each worker: drop open handles in __getstate__ and keep the class and its "
         "imports in one cell", functools.partial(_per_worker_epoch, method="spawn", touch_first=True)),
        ("close", "close() releases the handles this process opened",
         "close every ZipFile this process opened and forget it", _per_worker_close),
    ],
)


# -------------------------------------------------------------------- 4. tar shard writer


def _tar_write_fixtures() -> dict:
    samples = subset(300, seed=5)
    # Handed to the writer sorted by class, as a directory listing per class would be.
    return {"samples": sorted(samples, key=lambda s: (s.label, s.key)), "maxcount": 64}


def _shards_of(ctx: Context, seed: int = 0, tag: str = "shards") -> list[Path]:
    """Run the candidate writer once per (seed, tag) in this child and validate the returned paths."""
    memo_key = ("shards", seed, tag)
    if memo_key not in ctx.memo:
        folder = ctx.scratch(tag)
        returned = ctx.call(folder, ctx.fixtures["samples"], maxcount=ctx.fixtures["maxcount"], seed=seed)
        if not isinstance(returned, (list, tuple)) or not returned:
            raise PartFailed(f"write_shards must return the list of shard paths; it returned {_short(returned)}")
        shards = [Path(p) for p in returned]
        missing = [p.name for p in shards if not p.is_file()]
        if missing:
            raise PartFailed(f"returned paths that do not exist: {', '.join(missing[:3])}")
        ctx.memo[memo_key] = shards
    return ctx.memo[memo_key]


def _tar_members(path: Path) -> list[tarfile.TarInfo]:
    try:
        with tarfile.open(path, "r:") as tar:
            return tar.getmembers()
    except tarfile.TarError as exc:
        raise PartFailed(f"{path.name} is not an uncompressed tar archive: {exc}") from None


def _tar_files(ctx: Context) -> str:
    shards = _shards_of(ctx)
    count = len(ctx.fixtures["samples"])
    maxcount = ctx.fixtures["maxcount"]
    expected = -(-count // maxcount)
    names = [p.name for p in shards]
    wanted = [f"shard-{i:06d}.tar" for i in range(expected)]
    if names != wanted:
        raise PartFailed(f"{count} samples at maxcount={maxcount} make {expected} shards named {wanted[0]} ... {wanted[-1]}; got {names[:3]}{' ...' if len(names) > 3 else ''}")
    if len({p.parent for p in shards}) != 1:
        raise PartFailed("all shards must be written into dst_dir")
    for path in shards:
        stems = {Path(m.name).stem for m in _tar_members(path)}
        if len(stems) > maxcount:
            raise PartFailed(f"{path.name} holds {len(stems)} samples, more than maxcount={maxcount}")
    return f"{expected} shards shard-000000.tar ... {wanted[-1]}, none above {maxcount} samples"


def _tar_samples(ctx: Context) -> str:
    samples = {s.key: s for s in ctx.fixtures["samples"]}
    seen: Counter = Counter()
    for path in _shards_of(ctx):
        with tarfile.open(path, "r:") as tar:
            for member in tar.getmembers():
                key, _, ext = member.name.partition(".")
                if key not in samples or ext not in ("cls", "jpg"):
                    raise PartFailed(f"{path.name} holds an unexpected member {member.name!r} (only <key>.cls and <key>.jpg)")
                payload = tar.extractfile(member).read()
                if ext == "jpg":
                    seen[key] += 1
                    if hashlib.sha256(payload).hexdigest() != samples[key].sha256:
                        raise PartFailed(f"{path.name}: {member.name} differs from the original JPEG")
                elif payload.decode(errors="replace").strip() != str(samples[key].label):
                    raise PartFailed(f"{path.name}: {member.name} holds {payload[:10]!r}, expected the label {samples[key].label} as text")
    missing = sorted(set(samples) - set(seen))
    duplicated = sorted(k for k, c in seen.items() if c > 1)
    if missing or duplicated:
        raise PartFailed(f"{len(missing)} samples missing (e.g. {missing[:3]}), {len(duplicated)} written more than once (e.g. {duplicated[:3]})")
    return f"{len(samples)} samples, each once, .jpg byte-identical and .cls = label"


def _tar_convention(ctx: Context) -> str:
    for path in _shards_of(ctx):
        names = [m.name for m in _tar_members(path)]
        if names != sorted(names):
            raise PartFailed(f"members of {path.name} are not sorted by name (first out of order: {next(b for a, b in zip(names, names[1:]) if b < a)})")
        for first, second in zip(names[::2], names[1::2]):
            if Path(first).stem != Path(second).stem or (Path(first).suffix, Path(second).suffix) != (".cls", ".jpg"):
                raise PartFailed(f"in {path.name}, {first} and {second} should be one sample's .cls and .jpg, side by side")
        if len(names) % 2:
            raise PartFailed(f"{path.name} holds an odd number of members: every sample needs both .cls and .jpg")
    return "each shard sorted by name, every sample's .cls and .jpg adjacent"


def _shard_keys(shards: Sequence[Path]) -> list[list[str]]:
    return [sorted({Path(m.name).stem for m in _tar_members(p)}) for p in shards]


def _tar_shuffled(ctx: Context) -> str:
    labels = {s.key: s.label for s in ctx.fixtures["samples"]}
    for path, keys in zip(_shards_of(ctx), _shard_keys(_shards_of(ctx))):
        classes = {labels[k] for k in keys if k in labels}
        if len(keys) >= 40 and len(classes) < 6:
            raise PartFailed(
                f"{path.name} holds only {len(classes)} of the 10 classes ({sorted(classes)}): the samples arrived sorted "
                "by class and were cut into shards without shuffling first"
            )
    return "samples given sorted by class end up mixed in every shard"


def _tar_seeded(ctx: Context) -> str:
    first = _shard_keys(_shards_of(ctx, seed=0))
    again = _shard_keys(_shards_of(ctx, seed=0, tag="again"))
    other = _shard_keys(_shards_of(ctx, seed=1, tag="other-seed"))
    if first != again:
        raise PartFailed("writing twice with seed=0 put samples into different shards: seed the shuffle (random.Random(seed))")
    if first == other:
        raise PartFailed("seed=0 and seed=1 gave the same shards: the seed must decide the shuffle")
    return "the same seed gives the same shards; another seed, other shards"


_exercise(
    "tar_write",
    "04_tar_shards",
    "write WebDataset-style tar shards: shuffled first, at most maxcount samples each",
    "write_shards(dst_dir, samples, maxcount=1000, seed=0) -> list of paths: shuffles samples (manifest rows) with "
    "seed, cuts them into dst_dir/shard-000000.tar, ... of at most maxcount samples, each sample as <key>.cls "
    "(label as text) and <key>.jpg (original bytes), members sorted by name",
    _tar_write_fixtures,
    [
        ("shards", "shards named shard-000000.tar, ... in dst_dir, at most maxcount samples each",
         "start a new shard every maxcount samples; name it f'shard-{index:06d}.tar'", _tar_files),
        ("samples", "every sample exactly once, .jpg byte-identical to the original, .cls the label as text",
         "add two members per sample: f'{key}.cls' holding str(label).encode() and f'{key}.jpg' holding the file's bytes", _tar_samples),
        ("convention", "within a shard members are sorted by name, .cls and .jpg of a sample adjacent",
         "sort each shard's samples by key before adding them, and add .cls then .jpg", _tar_convention),
        ("shuffled", "samples given sorted by class are mixed in every shard (shuffle before cutting)",
         "shuffle a copy of the sample list with random.Random(seed).shuffle before cutting it into shards", _tar_shuffled),
        ("seeded", "the seed decides the shuffle: same seed, same shards",
         "use a private random.Random(seed) (or numpy default_rng(seed)), not the global random state", _tar_seeded),
    ],
)


# -------------------------------------------------------------------- 4b. tar shard reader


def _tar_read_fixtures() -> dict:
    samples = subset(240, seed=6)
    shards = fixture_shards("tar-240-30", samples, maxcount=30)
    return {"samples": samples, "shards": shards, "pixels": reference_pixels([s.key for s in samples])}


def _tar_dataset(ctx: Context, cls=None, shards=None, **kwargs):
    cls = cls or ctx.candidate
    shards = [str(p) for p in (shards or ctx.fixtures["shards"])]
    return _call(cls, ctx.name, shards, return_key=True, **kwargs)


def _tar_epoch(ctx: Context, dataset, workers: int, method: str = "fork", epoch: int | None = None, digest: str = "sha256"):
    if epoch is not None:
        _call(dataset.set_epoch, f"{ctx.name}.set_epoch", epoch)
    samples = ctx.fixtures["samples"]
    records = _collect(_loader(ctx, dataset, workers=workers, method=method), len(samples), digest)
    reference = ctx.fixtures["pixels"] if digest == "pixels" else _sha_reference(samples)
    _audit(records, samples, reference, workers=workers)
    return [key for key, _, _ in records]


def _tar_one_process(ctx: Context) -> str:
    keys = _tar_epoch(ctx, _tar_dataset(ctx), workers=0, digest="pixels")
    return f"{len(keys)} samples, each exactly once, labels and pixels match the manifest"


def _tar_workers(ctx: Context, workers: int, method: str) -> str:
    cls = ctx.importable() if method == "spawn" else ctx.candidate
    dataset = _tar_dataset(ctx, cls, transform=sha256_transform)
    if method == "spawn":
        _preflight_spawn(dataset)
    keys = _tar_epoch(ctx, dataset, workers=workers, method=method)
    return f"{len(keys)} samples over {len(ctx.fixtures['shards'])} shards and {workers} workers, each exactly once"


def _tar_shuffle_epochs(ctx: Context) -> str:
    plain = _tar_epoch(ctx, _tar_dataset(ctx, transform=sha256_transform), workers=2)
    shuffled = _tar_dataset(ctx, shuffle_buffer=40, seed=0, transform=sha256_transform)
    first = _tar_epoch(ctx, shuffled, workers=2, epoch=0)
    second = _tar_epoch(ctx, shuffled, workers=2, epoch=1)
    if first == plain:
        raise PartFailed("with shuffle_buffer=40 the order is the same as without shuffling")
    if first == second:
        raise PartFailed("epochs 0 and 1 came in the same order: set_epoch(epoch) must change the shuffle (seed + epoch)")
    return "each epoch complete; the order differs from the shards' and between epochs"


def _tar_reproducible(ctx: Context) -> str:
    orders = []
    for _ in range(2):
        dataset = _tar_dataset(ctx, shuffle_buffer=40, seed=3, transform=sha256_transform)
        orders.append(_tar_epoch(ctx, dataset, workers=0, epoch=1))
    if orders[0] != orders[1]:
        raise PartFailed("two datasets with seed=3 at epoch 1 gave different orders: derive every random choice from seed and epoch")
    return "the same seed and epoch give the same order"


def _tar_bounded(ctx: Context) -> str:
    shard = ctx.fixtures["shards"][0]
    order = [Path(m.name).stem for m in _tar_members(shard) if m.name.endswith(".jpg")]
    buffer = 5
    for epoch in range(6):
        dataset = _tar_dataset(ctx, shards=[shard], shuffle_buffer=buffer, seed=epoch, transform=sha256_transform)
        _call(dataset.set_epoch, f"{ctx.name}.set_epoch", epoch)
        first = _call(lambda: next(iter(dataset)), "next(iter(dataset))")
        position = order.index(first[2]) if first[2] in order else None
        if position is None or position > buffer:
            raise PartFailed(
                f"with shuffle_buffer={buffer} the first sample out was sample {position} of its shard: a buffer of {buffer} "
                f"can only hold the first {buffer + 1} samples read (the whole shard was loaded?)"
            )
    return f"with shuffle_buffer={buffer} the first sample always comes from the first {buffer + 1} read"


_exercise(
    "tar_dataset",
    "04_tar_shards",
    "an IterableDataset over tar shards: worker split, per-epoch shard shuffle, bounded shuffle buffer",
    "TarShardDataset(shards, shuffle_buffer=0, seed=0, transform=None, return_key=False) with set_epoch(epoch): "
    "worker w of W reads its share shards[w::W]; with shuffle_buffer > 0 the shard order is shuffled per epoch "
    "(the same in every worker) and samples pass through a buffer of at most shuffle_buffer; yields "
    "(transform(jpg bytes), int(cls)[, key])",
    _tar_read_fixtures,
    [
        ("one_process", "no workers: every sample once, labels and pixels match the manifest",
         "read each shard with tarfile.open(path, 'r|'), pair <key>.cls with <key>.jpg, decode with standard_transform", _tar_one_process),
        ("fork_3_workers", "3 fork workers (8 shards, uneven split): every sample exactly once",
         "in __iter__, get_worker_info() tells the worker id and count: read only shards[info.id::info.num_workers]",
         functools.partial(_tar_workers, workers=3, method="fork")),
        ("spawn_2_workers", "2 spawn workers: every sample exactly once",
         "keep no open files in the dataset object (open shards inside __iter__) and the class with its imports in one cell",
         functools.partial(_tar_workers, workers=2, method="spawn")),
        ("shuffle_epochs", "shuffle_buffer > 0: order differs from the shards' and between epochs, nothing lost",
         "seed a random.Random with (seed, epoch): shuffle the shard list the same way in every worker, then split it", _tar_shuffle_epochs),
        ("reproducible", "the same seed and epoch give the same order",
         "take every random choice from a random.Random seeded with seed and epoch (and the worker id for the buffer)", _tar_reproducible),
        ("bounded_buffer", "the shuffle buffer holds at most shuffle_buffer samples",
         "fill a list up to shuffle_buffer samples; then, per new sample, yield a random one from the list and put the new one in its place", _tar_bounded),
    ],
)


# ------------------------------------------------------------------ 5. rank x worker split


_SPLIT_CASES = [(8, 2, 4), (10, 2, 4), (10, 3, 2), (12, 3, 2), (7, 1, 3), (9, 3, 3), (30, 4, 4), (101, 4, 8), (6, 2, 3)]


def _split_table(ctx: Context, n: int, world: int, workers: int) -> dict[tuple[int, int], list]:
    shards = [f"shard-{i:06d}.tar" for i in range(n)]
    table = {}
    for rank in range(world):
        for worker in range(workers):
            got = ctx.call(list(shards), rank, world, worker, workers)
            table[(rank, worker)] = list(got)
    return table


def _split_exactly_once(ctx: Context) -> str:
    for n, world, workers in _SPLIT_CASES:
        table = _split_table(ctx, n, world, workers)
        counts = Counter(s for got in table.values() for s in got)
        expected = {f"shard-{i:06d}.tar" for i in range(n)}
        missing = sorted(expected - set(counts))
        twice = sorted(s for s, c in counts.items() if c > 1)
        unknown = sorted(set(counts) - expected)
        if missing or twice or unknown:
            raise PartFailed(
                f"{n} shards, {world} ranks x {workers} workers: {len(missing)} shards read by nobody "
                f"{missing[:3]}, {len(twice)} read more than once {twice[:3]}"
                + (f", unknown {unknown[:3]}" if unknown else "")
            )
    return f"every shard read exactly once in {len(_SPLIT_CASES)} layouts (including uneven ones)"


def _split_balanced(ctx: Context) -> str:
    for n, world, workers in _SPLIT_CASES:
        table = _split_table(ctx, n, world, workers)
        per_rank = [sum(len(table[(r, w)]) for w in range(workers)) for r in range(world)]
        if max(per_rank) - min(per_rank) > 1:
            raise PartFailed(f"{n} shards over {world} ranks: ranks got {per_rank} shards; they should differ by at most one")
        for rank in range(world):
            per_worker = [len(table[(rank, w)]) for w in range(workers)]
            if max(per_worker) - min(per_worker) > 1:
                raise PartFailed(f"{n} shards, {world} ranks x {workers} workers: rank {rank}'s workers got {per_worker}")
    return "ranks, and the workers of each rank, get shard counts differing by at most one"


def _split_rank_first(ctx: Context) -> str:
    n, world = 24, 3
    for rank in range(world):
        shares = []
        for workers in (1, 2, 4):
            shares.append(sorted(s for w in range(workers) for s in ctx.call([f"shard-{i:06d}.tar" for i in range(n)], rank, world, w, workers)))
        if not shares[0] == shares[1] == shares[2]:
            raise PartFailed(f"rank {rank} of {world} reads other shards with 1, 2 or 4 workers: split by rank first, then among the rank's workers")
    return "a rank's shards do not depend on how many workers it runs"


def _split_too_few(ctx: Context) -> str:
    shards = [f"shard-{i:06d}.tar" for i in range(6)]
    try:
        got = ctx.candidate(list(shards), 0, 2, 0, 4)
    except ValueError as exc:
        if not ("6" in str(exc) and "8" in str(exc)):
            raise PartFailed(f"ValueError raised, but the message should name both counts (6 shards, 2 x 4 = 8 readers): {exc}") from None
    except Exception as exc:
        raise PartFailed(f"expected a ValueError, got {_describe(exc)}") from None
    else:
        raise PartFailed(f"6 shards for 2 ranks x 4 workers returned {got!r} instead of raising ValueError")
    exact = ctx.call(list(shards), 1, 2, 2, 3)
    if len(exact) != 1:
        raise PartFailed(f"6 shards for 2 ranks x 3 workers is enough (one each), but worker 2 of rank 1 got {exact!r}")
    return "too few shards raise ValueError naming the counts; exactly enough works"


def _split_pure(ctx: Context) -> str:
    shards = [f"shard-{i:06d}.tar" for i in range(10)]
    given = list(shards)
    first = ctx.call(given, 1, 2, 1, 2)
    if given != shards:
        raise PartFailed("the function changed the list it was given; build a new list instead")
    if ctx.call(given, 1, 2, 1, 2) != first:
        raise PartFailed("two calls with the same arguments gave different shards")
    if not isinstance(first, list) or not all(isinstance(s, str) for s in first):
        raise PartFailed(f"return a list of the shard names given; got {_short(first)}")
    return "leaves its input alone and is deterministic"


_exercise(
    "shard_split",
    "05_shard_split",
    "split shards by rank, then by DataLoader worker: every shard read exactly once",
    "shards_for(shards, rank, world_size, worker_id, num_workers) -> list: the shards this worker of this rank reads; "
    "raises ValueError (naming both counts) when there are fewer shards than world_size x num_workers",
    dict,
    [
        ("exactly_once", "over all ranks and workers every shard is read exactly once, remainder included",
         "slice with a step: shards[rank::world_size], then that list [worker_id::num_workers]; never divide and truncate", _split_exactly_once),
        ("balanced", "ranks (and workers within a rank) get shard counts differing by at most one",
         "strided slices are balanced by construction; contiguous chunks must spread the remainder", _split_balanced),
        ("rank_first", "a rank's shards do not depend on its number of workers",
         "split by rank first, then split the rank's shards among its workers", _split_rank_first),
        ("too_few_shards", "fewer shards than ranks x workers raise ValueError naming both counts",
         "check len(shards) < world_size * num_workers first and raise ValueError(f'... {len(shards)} ... {world_size * num_workers} ...')", _split_too_few),
        ("pure", "does not change its input; same arguments, same answer",
         "return new lists (slicing does) and use no randomness", _split_pure),
    ],
)


# ------------------------------------------------------------- 5b. reading under a world size


def _rank_fixtures() -> dict:
    samples = subset(200, seed=7)
    shards = fixture_shards("rank-200-20", samples, maxcount=20)
    return {"samples": samples, "shards": shards, "pixels": reference_pixels([s.key for s in samples])}


def _rank_epoch(ctx: Context, world: int, workers: int, digest: str = "sha256") -> tuple[list, list[int]]:
    """Read one epoch on every simulated rank; return all records and the per-rank counts."""
    samples = ctx.fixtures["samples"]
    shards = [str(p) for p in ctx.fixtures["shards"]]
    records, counts = [], []
    for rank in range(world):
        kwargs = {} if digest == "pixels" else {"transform": sha256_transform}
        dataset = ctx.call(shards, rank, world, return_key=True, **kwargs)
        got = _collect(_loader(ctx, dataset, workers=workers), len(samples), digest)
        records += got
        counts.append(len(got))
    return records, counts


def _rank_one(ctx: Context) -> str:
    records, _ = _rank_epoch(ctx, 1, 0, "pixels")
    return _audit(records, ctx.fixtures["samples"], ctx.fixtures["pixels"])


def _rank_world(ctx: Context, world: int, workers: int) -> str:
    samples = ctx.fixtures["samples"]
    records, counts = _rank_epoch(ctx, world, workers)
    try:
        _audit(records, samples, _sha_reference(samples))
    except PartFailed as exc:
        raise PartFailed(f"{exc}\nsamples per rank: {counts}") from None
    if min(counts) == 0:
        raise PartFailed(f"a rank received no samples: {counts}")
    return f"{world} ranks x {workers} workers: every sample exactly once; per rank {counts}"


def _rank_too_few(ctx: Context) -> str:
    shards = [str(p) for p in ctx.fixtures["shards"]]
    try:
        dataset = ctx.candidate(shards, 0, 4, transform=sha256_transform, return_key=True)
        got = _collect(_loader(ctx, dataset, workers=3), len(ctx.fixtures["samples"]), "sha256")
    except PartFailed as exc:
        if "ValueError" in str(exc) and "10" in str(exc) and "12" in str(exc):
            return "10 shards for 4 ranks x 3 workers fail loudly with ValueError"
        raise PartFailed(f"expected a ValueError naming both counts (10 shards, 12 readers); got: {exc}") from None
    except ValueError as exc:
        if "10" in str(exc) and "12" in str(exc):
            return "10 shards for 4 ranks x 3 workers fail loudly with ValueError"
        raise PartFailed(f"the ValueError should name both counts (10 shards, 12 readers): {exc}") from None
    except Exception as exc:
        raise PartFailed(f"expected a ValueError, got {_describe(exc)}") from None
    raise PartFailed(f"10 shards for 4 ranks x 3 workers: rank 0 silently read {len(got)} samples instead of raising ValueError")


_exercise(
    "rank_dataset",
    "05_shard_split",
    "an IterableDataset that reads its rank's and worker's shards under a simulated world size",
    "RankShardDataset(shards, rank, world_size, transform=None, return_key=False): reads the shards "
    "shards_for(shards, rank, world_size, worker_id, num_workers) gives this DataLoader worker (worker 0 of 1 "
    "without workers); yields (transform(jpg bytes), int(cls)[, key])",
    _rank_fixtures,
    [
        ("one_rank", "world size 1, no workers: every sample once, labels and pixels match",
         "with no worker info (num_workers=0) read as worker 0 of 1", _rank_one),
        ("two_ranks", "world size 2 x 2 workers (10 shards): every sample exactly once over all ranks",
         "call shards_for with this rank and the worker id from get_worker_info() inside __iter__",
         functools.partial(_rank_world, world=2, workers=2)),
        ("three_ranks", "world size 3 x 2 workers (10 shards, uneven): every sample exactly once",
         "uneven layouts lose the remainder when shards are cut into equal chunks; use strided slices",
         functools.partial(_rank_world, world=3, workers=2)),
        ("too_few_shards", "10 shards for 4 ranks x 3 workers raise ValueError instead of idling a rank",
         "let shards_for's ValueError propagate from __iter__; do not catch it", _rank_too_few),
    ],
)


# ==================================================================== running a check


def list_checks() -> list[CheckInfo]:
    """Every exercise check: id, notebook, one-line description, the candidate's signature, part names."""
    return [CheckInfo(e.id, e.notebook, e.description, e.signature, tuple(p.name for p in e.parts)) for e in _EXERCISES.values()]


def _child_main(conn, exercise_id: str, candidate, fixtures: dict, limits: dict, first: int, workdir: str) -> None:
    """Body of the watchdog child: run parts ``first``, ``first + 1``, ... and report each one."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # own process group, so the parent can kill us and our DataLoader workers at once
    # One intra-op thread, as in DataLoader workers: on busy cores a thread pool costs more than it gives.
    torch.set_num_threads(1)
    # The checks start 4 workers on purpose, also on machines with fewer cores.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    exercise = _EXERCISES[exercise_id]
    ctx = Context(candidate, fixtures, limits["loader_timeout"], Path(workdir))
    for index in range(first, len(exercise.parts)):
        part = exercise.parts[index]
        conn.send(("start", index))
        start = time.perf_counter()
        try:
            message, passed = part.run(ctx), True
        except PartFailed as exc:
            message, passed = str(exc), False
        except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything, even SystemExit
            message, passed = _describe(exc), False
        conn.send(("done", index, passed, str(message), time.perf_counter() - start))
    conn.send(("end",))
    conn.close()


def _kill_group(proc) -> None:
    """Kill the watchdog child and everything it started, then reap it."""
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            kill()
            break
        except (ProcessLookupError, PermissionError, OSError):
            continue
    proc.join(10)


def _run_isolated(exercise: Exercise, candidate, fixtures: dict, limits: dict) -> list[PartResult]:
    """Run every part in forked children with deadlines (see the module docstring)."""
    parts = exercise.parts
    outcome: dict[int, tuple[bool, str, float]] = {}
    fork = multiprocessing.get_context("fork")
    deadline = time.monotonic() + limits["timeout"]
    workdir = tempfile.mkdtemp(prefix="packlab-check-")
    next_part = 0
    try:
        while next_part < len(parts):
            if time.monotonic() >= deadline:
                for index in range(next_part, len(parts)):
                    outcome[index] = (False, f"not run: the check's time limit of {limits['timeout']:.0f} s was used up", 0.0)
                break
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            receiver, sender = fork.Pipe(duplex=False)
            proc = fork.Process(
                target=_child_main,
                args=(sender, exercise.id, candidate, fixtures, limits, next_part, workdir),
                daemon=False,
            )
            proc.start()
            sender.close()
            with contextlib.suppress(OSError):
                os.setpgid(proc.pid, proc.pid)  # also from this side, so no kill can race the child's own call
            current, started = next_part, time.monotonic()
            try:
                while True:
                    wait = min(limits["part_timeout"] - (time.monotonic() - started), deadline - time.monotonic())
                    if wait <= 0 or not receiver.poll(wait):
                        limit = min(limits["part_timeout"], limits["timeout"])
                        outcome[current] = (False, f"did not finish within {limit:.0f} s: stopped (is something waiting forever?)", time.monotonic() - started)
                        # Code that hangs once will hang again: report now rather than wait out every part.
                        for index in range(current + 1, len(parts)):
                            outcome[index] = (False, f"not run: part {parts[current].name!r} hung; fix that first", 0.0)
                        next_part = len(parts)
                        break
                    try:
                        message = receiver.recv()
                    except EOFError:
                        proc.join(5)
                        outcome[current] = (False, f"the process running this part died (exit code {proc.exitcode})", time.monotonic() - started)
                        next_part = current + 1
                        break
                    if message[0] == "start":
                        current, started = message[1], time.monotonic()
                    elif message[0] == "done":
                        _, index, passed, text, seconds = message
                        outcome[index] = (passed, text, seconds)
                        next_part = index + 1
                    else:
                        next_part = len(parts)
                        break
            finally:
                receiver.close()
                _kill_group(proc)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return [PartResult(p.name, p.description, *outcome[i][:2], p.hint, outcome[i][2]) for i, p in enumerate(parts)]


def _run_in_process(exercise: Exercise, candidate, fixtures: dict, limits: dict) -> list[PartResult]:
    """Fallback where fork does not exist (Windows): run the parts here, DataLoader timeouts only."""
    results = []
    with tempfile.TemporaryDirectory(prefix="packlab-check-") as workdir:
        ctx = Context(candidate, fixtures, limits["loader_timeout"], Path(workdir))
        for part in exercise.parts:
            start = time.perf_counter()
            try:
                message, passed = part.run(ctx), True
            except PartFailed as exc:
                message, passed = str(exc), False
            except Exception as exc:  # noqa: BLE001
                message, passed = _describe(exc), False
            results.append(PartResult(part.name, part.description, passed, str(message), part.hint, time.perf_counter() - start))
    return results


def _record(result: CheckResult, notebook: str) -> None:
    """Append the result to the grader's results file, when a grader asked for one."""
    target = os.environ.get(RESULTS_ENV_VAR)
    if not target:
        return
    entry = result.to_dict()
    entry["notebook"] = notebook
    with open(target, "a") as f:
        f.write(json.dumps(entry) + "\n")


def check(exercise_id: str, candidate, **kwargs) -> CheckResult:
    """Run the behavioural checks of one exercise on ``candidate`` and print a short report.

    ``candidate`` is what the exercise asks for (a class or a function; see
    :func:`list_checks` for each signature). Keyword arguments:

    * ``timeout`` — seconds for the whole check (default :data:`CHECK_TIMEOUT`);
    * ``part_timeout`` — seconds for one part (default :data:`PART_TIMEOUT`);
    * ``loader_timeout`` — the ``timeout`` of every DataLoader the check creates (default :data:`LOADER_TIMEOUT`);
    * ``quiet=True`` — do not print the report;
    * ``record=False`` — do not record the result for the notebook grader (for demonstrations).

    Returns a :class:`CheckResult` (``.passed``, ``.score``, ``.max_score``, ``.parts``).
    A hanging candidate fails the part it hangs in; it never hangs the caller.
    """
    if exercise_id not in _EXERCISES:
        raise ValueError(f"no check called {exercise_id!r}; the checks are: {', '.join(_EXERCISES)}")
    unknown = set(kwargs) - {"timeout", "part_timeout", "loader_timeout", "quiet", "record"}
    if unknown:
        raise TypeError(f"check() got unexpected keyword arguments {sorted(unknown)}")
    exercise = _EXERCISES[exercise_id]
    if not callable(candidate):
        raise TypeError(
            f"check({exercise_id!r}, ...) needs the class or function itself, not an instance of {type(candidate).__name__}; "
            f"the check calls it as {exercise.signature[: exercise.signature.index(')') + 1]}"
        )
    limits = {
        "timeout": float(kwargs.get("timeout", CHECK_TIMEOUT)),
        "part_timeout": float(kwargs.get("part_timeout", PART_TIMEOUT)),
        "loader_timeout": float(kwargs.get("loader_timeout", LOADER_TIMEOUT)),
    }
    start = time.perf_counter()
    for stream in (sys.stdout, sys.stderr):  # processes forked from here must not inherit unwritten output
        with contextlib.suppress(Exception):
            stream.flush()
    fixtures = exercise.fixtures()
    if "fork" in multiprocessing.get_all_start_methods():
        parts = _run_isolated(exercise, candidate, fixtures, limits)
    else:
        parts = _run_in_process(exercise, candidate, fixtures, limits)
    name = getattr(candidate, "__name__", type(candidate).__name__)
    result = CheckResult(exercise_id, name, parts, time.perf_counter() - start)
    if kwargs.get("record", True):
        _record(result, exercise.notebook)
    if not kwargs.get("quiet", False):
        print(result.report())
    return result

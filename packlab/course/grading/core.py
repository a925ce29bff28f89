"""The grading machinery: results, the part context, importable notebook classes, the watchdog, the registry.

An exercise module (see the package docstring) registers its checks with :func:`register`;
:func:`check` runs one of them on a candidate, each part in a forked child with a
deadline, and :func:`list_checks` describes them all. Nothing here knows about any
particular exercise.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import dis
import hashlib
import importlib
import json
import linecache
import multiprocessing
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import traceback
import types
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch

RESULTS_ENV_VAR = "PACKLAB_GRADE_RESULTS"
#: Default time limits in seconds: the whole check; one part; the start-up of spawn
#: workers (each is a fresh Python that imports torch, which on a busy two-core machine
#: can take a minute); and one DataLoader batch once the workers are up. A hanging part
#: is reported after PART_TIMEOUT, which leaves room for a slow start-up and the reading.
CHECK_TIMEOUT = 600.0
PART_TIMEOUT = 180.0
STARTUP_TIMEOUT = 120.0
LOADER_TIMEOUT = 60.0


#: What the exercises' stubs raise (``raise NotImplementedError("your code here")``, written
#: by :mod:`packlab.course.exercises`): a part that fails with it is "not started", not wrong.
STUB_MESSAGE = "your code here"
#: Hint levels of :func:`check`: 0 none, 1 the nudge (default), 2 the nudge and the code-level hint.
HINT_LEVELS = (0, 1, 2)


class PartFailed(Exception):
    """Raised by a part of a check with a message saying what the candidate did wrong."""


# ------------------------------------------------------------------------------ results


@dataclass
class PartResult:
    """The outcome of one graded part of a check.

    ``nudge`` is the level-1 hint (the idea), ``hint`` the level-2, code-level one (see
    :mod:`packlab.course.grading.teaching`). ``not_started`` is true when the part failed
    only on the exercise's stub (``NotImplementedError("your code here")``).
    """

    name: str
    description: str
    passed: bool
    message: str
    hint: str
    seconds: float = 0.0
    nudge: str = ""
    not_started: bool = False

    @property
    def status(self) -> str:
        """``"passed"``, ``"failed"`` or ``"not started"``."""
        return "passed" if self.passed else "not started" if self.not_started else "failed"


def is_stub_failure(message: str) -> bool:
    """Did a part fail only because it reached an exercise stub that was not filled in yet?"""
    return "NotImplementedError" in message and STUB_MESSAGE in message


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

    def report(self, hints: int = 1) -> str:
        """The friendly report :func:`check` prints: one line per part, what went wrong under each ✗.

        ``hints`` is how much help a failed part gets: 0 none, 1 its nudge (the idea to
        look at), 2 the nudge and the code-level hint. A part that is not started yet
        (it reached the exercise's stub) is marked ``·`` and gets no hint at all.
        """
        if hints not in HINT_LEVELS:
            raise ValueError(f"hints must be one of {HINT_LEVELS}, not {hints!r}")
        width = max(len(p.name) for p in self.parts)
        lines = [f"check {self.exercise_id!r} on {self.candidate}: {self.score}/{self.max_score} parts passed"]
        for part in self.parts:
            mark = "✓" if part.passed else "·" if part.not_started else "✗"
            lines.append(f"  {mark} {part.name.ljust(width)}  {part.description}" + ("  (not started)" if part.not_started else ""))
            if part.passed or part.not_started:
                continue
            lines += [f"      {line}" for line in part.message.splitlines()]
            if hints >= 1 and part.nudge:
                lines.append(f"      think: {part.nudge}")
            if hints >= 2:
                lines.append(f"      hint: {part.hint}")
        failed = [p for p in self.parts if p.status == "failed"]
        waiting = [p for p in self.parts if p.not_started]
        if self.passed:
            lines.append(f"All parts passed ({self.seconds:.1f} s). Well done!")
        elif waiting and not failed:
            lines.append(f'Not started yet: fill in the code that raises NotImplementedError("{STUB_MESSAGE}"), '
                         f"run its cell, then run this check again ({self.seconds:.1f} s).")
        else:
            lines.append(f"Fix the parts marked ✗ and run the check again ({self.seconds:.1f} s)."
                         + (" Parts marked · are not started yet." if waiting else ""))
            if hints < 2:
                lines.append("Stuck on one? Run the check with hints=2 for a hint at the code, e.g. "
                             f"check({self.exercise_id!r}, {self.candidate}, hints=2).")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()

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


def describe(exc: BaseException) -> str:
    """A short account of an exception: type, message, and where in the candidate's code it arose.

    Exceptions re-raised from DataLoader workers carry the worker's traceback in their
    message; the original exception (its last line) is what the attendee needs to see.
    """
    text = str(exc)
    if "Original Traceback" in text:
        lines = [line for line in text.splitlines() if line.strip()]
        where = _candidate_frame(text)
        return f"in a DataLoader worker: {_about_decoding(lines[-1].strip())}{where}"
    formatted = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    message = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if len(message) > 400:
        message = message[:400] + " ..."
    return _about_decoding(message) + _candidate_frame(formatted)


#: What packlab.transforms says about a file that does not decode: advice for damaged data.
_DAMAGED_DATA_ADVICE = re.compile(r"\s*Check or regenerate the file.*$", re.S)


def _about_decoding(message: str) -> str:
    """Point a decoding error at the candidate's code, not at the data.

    :mod:`packlab.transforms` suggests verifying the dataset when bytes do not decode. The
    checks read only verified originals and archives written by :mod:`packlab.pack`, so
    here the bytes that failed came from the candidate's code: another member, a cut-off
    read, raw pixels given to the JPEG decoder.
    """
    if "cannot decode image" not in message:
        return message
    return _DAMAGED_DATA_ADVICE.sub("", message) + (
        " The check's files are intact, so your code gave the decoder bytes that are not a JPEG: "
        "is it the right member (.raw members hold pixels: pixels_to_tensor, not standard_transform), read in full?"
    )


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _candidate_frame(formatted_traceback: str) -> str:
    """' (in NAME, line N of your code)' for the innermost frame outside libraries and packlab."""
    library_markers = ("site-packages", f"{os.sep}packlab{os.sep}", f"{os.sep}lib{os.sep}python", "<frozen")
    found = [m for m in _FRAME.finditer(formatted_traceback) if not any(s in m.group(1) for s in library_markers)]
    if not found:
        return ""
    match = found[-1]
    return f" (in {match.group(3)}, line {match.group(2)} of your code)"


def short(value: Any) -> str:
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
    startup_timeout: float = STARTUP_TIMEOUT
    memo: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return getattr(self.candidate, "__name__", type(self.candidate).__name__)

    def call(self, *args, **kwargs):
        """Call the candidate; an exception becomes a :class:`PartFailed` naming the call."""
        return attempt(self.candidate, self.name, *args, **kwargs)

    def scratch(self, name: str) -> Path:
        """A fresh empty folder for this part (removed when the check ends)."""
        folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir))
        return folder

    def importable(self):
        """The candidate as an importable class, for spawn workers (see the docstring of :mod:`packlab.course.grading`)."""
        if "importable" not in self.memo:
            self.memo["importable"] = importable_copy(self.candidate, self.workdir / "modules")
        return self.memo["importable"]


def attempt(fn, name: str, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        shown = ", ".join([short(a) for a in args] + [f"{k}={short(v)}" for k, v in kwargs.items()])
        call = name if name.endswith((")", "]")) else f"{name}({shown})"
        raise PartFailed(f"{call} raised {describe(exc)}") from exc


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


def _ast_parse(source: str, filename: str) -> ast.Module:
    """``ast.parse``, tried again when CPython 3.11 reports a spurious recursion-depth mismatch.

    CPython 3.11's AST constructor keeps its recursion depth in state shared by the threads
    of a process, and now and then, with other threads running, raises ``SystemError: AST
    constructor recursion depth mismatch`` on valid source (python/cpython#106905). The
    same parse a moment later succeeds; a real error is raised again by the last attempt.
    """
    for _ in range(2):
        try:
            return ast.parse(source, filename)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return ast.parse(source, filename)


def _parse_cell(source: str, filename: str) -> tuple[ast.Module, list[str]]:
    """A cell's syntax tree and the lines it was parsed from (IPython's %magics made into Python)."""
    try:
        return _ast_parse(source, filename), source.splitlines()
    except SyntaxError:
        from IPython.core.inputtransformer2 import TransformerManager

        python = TransformerManager().transform_cell(source)
        return _ast_parse(python, filename), python.splitlines()


def _defines(source: str, name: str) -> bool:
    """Whether a cell defines ``name`` at its top level (class or function)."""
    try:
        tree, _ = _parse_cell(source, "<cell>")
    except SyntaxError:
        return False
    return any(isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name for n in tree.body)


def _defining_cell(candidate) -> str | None:
    """The name under which :mod:`linecache` holds the source of the cell that defines ``candidate``.

    The code objects of its methods say where they were compiled. Methods that a decorator
    generates (a dataclass's ``__init__`` and ``__repr__``) say ``<string>`` and have no
    source: they are ignored. A class whose methods are all generated or inherited is
    looked up among the cells IPython registered, the most recent first.
    """
    name = candidate.__name__
    files = [f for f in dict.fromkeys(code.co_filename for code in _code_objects(candidate)) if linecache.getlines(f)]
    defining = [f for f in files if _defines("".join(linecache.getlines(f)), name)]
    if defining:
        return defining[-1]
    if files:
        return files[0]
    for filename, entry in reversed(list(linecache.cache.items())):
        if len(entry) == 4 and entry[1] is None and _defines("".join(entry[2]), name):
            return filename
    return None


def _global_reads(node: ast.AST, filename: str) -> set[str]:
    """Names that a top-level statement reads from the module's namespace when it runs or is called.

    Read from the compiled code, so a function's local variables (``LOAD_FAST``) are not
    counted; names a class body both assigns and reads are its own.
    """
    code = compile(ast.Module(body=[node], type_ignores=[]), filename, "exec")
    names: set[str] = set()
    for inner in _nested(code):
        loads, stores = set(), set()
        for instruction in dis.get_instructions(inner):
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                loads.add(instruction.argval)
            elif instruction.opname == "STORE_NAME" and inner is not code:
                stores.add(instruction.argval)
        names |= loads - stores
    return names


def _targets(node: ast.AST) -> set[str]:
    """The names a top-level assignment binds."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}


def _is_literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
    except ValueError:
        return False
    return True


def definitions_only(source: str, filename: str) -> str:
    """A cell reduced to what a module defining its classes and functions needs.

    Kept: imports, function and class definitions, literal constants, and the
    assignments whose names those definitions read (``_STRIDE = 2 ** 16``), with the
    assignments those read in turn. Everything else (calls, loops, a ``check(...)``) is
    dropped, because a spawn worker imports this module and must not rerun the cell's
    work. Kept lines stay on their line numbers and dropped ones become blank, so a
    traceback from a worker points at the line of the cell the attendee wrote.
    """
    tree, lines = _parse_cell(source, filename)
    definitions = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    assignments = [n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
    kept = [n for n in tree.body if isinstance(n, definitions) or (n in assignments and _is_literal(n.value))]
    needed = set().union(*(_global_reads(n, filename) for n in kept))
    grew = True
    while grew:
        grew = False
        for node in assignments:
            if node not in kept and _targets(node) & needed:
                kept.append(node)
                needed |= _global_reads(node, filename)
                grew = True
    out = [""] * len(lines)
    used: dict[int, ast.AST] = {}  # line number -> a dropped statement on it
    for node in tree.body:
        if node not in kept:
            for number in range(node.lineno, node.end_lineno + 1):
                used[number] = node
    for node in kept:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        span = range(first, node.end_lineno + 1)
        if any(number in used for number in span):  # shares a line with a dropped statement (a; b)
            out[first - 1] = ast.unparse(node).replace("\n", "; ") if first == node.end_lineno else ast.unparse(node)
            continue
        for number in span:
            out[number - 1] = lines[number - 1]
    return "\n".join(out) + "\n"


def _unresolved_globals(obj, module: types.ModuleType) -> list[str]:
    """Global names the code of ``obj`` (from ``module``'s file) reads that ``module`` does not define."""
    loaded, stored = set(), set()
    for code in _code_objects(obj):
        if code.co_filename != module.__file__:
            continue  # generated by a decorator (a dataclass's __init__): not the attendee's code
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
    a module written to ``folder``, which is put on ``sys.path``; see the docstring of
    :mod:`packlab.course.grading`. Raises :class:`PartFailed` with advice when that is not possible.
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
    cell = _defining_cell(candidate)
    if cell is None:
        raise PartFailed(
            f"cannot find the source of {name}, so spawn workers cannot import it. "
            "Define it in one notebook cell (not with exec), or in a .py module."
        )
    source = definitions_only("".join(linecache.getlines(cell)), cell)
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


# ------------------------------------------------------------------------- the registry
#
# Each exercise: fixtures (prepared in the kernel, cached on disk) and a list of parts.
# A part is a function of the Context that returns a short success message or raises
# PartFailed; any other exception fails the part with its description.


@dataclass(frozen=True)
class Part:
    """One graded part: a name, what it verifies, a hint shown when it fails, and the function that runs it."""

    name: str
    description: str
    hint: str
    run: Callable[[Context], str]


@dataclass(frozen=True)
class Exercise:
    """One check: its id, the notebook that calls it, what it asks for, its fixtures and parts."""

    id: str
    notebook: str
    description: str
    signature: str
    fixtures: Callable[[], dict]
    parts: tuple[Part, ...]


_EXERCISES: dict[str, Exercise] = {}


def register(id, notebook, description, signature, fixtures, parts) -> None:
    """Add a check to the registry (exercise modules call this at import).

    ``notebook`` is the stem of the notebook that calls the check (``"04_tar_shards"``);
    ``signature`` tells the attendee how the candidate is called; ``fixtures`` is a
    function returning the dict the parts read (``ctx.fixtures``), called once per check
    in the calling process; ``parts`` is a list of ``(name, description, hint, run)``.
    """
    if id in _EXERCISES and _EXERCISES[id].notebook != notebook:
        raise ValueError(f"a check called {id!r} is already registered for {_EXERCISES[id].notebook}")
    _EXERCISES[id] = Exercise(id, notebook, description, signature, fixtures, tuple(Part(*p) for p in parts))


def _exercises() -> list[Exercise]:
    """The registered checks, ordered by notebook (and, within one, as registered)."""
    return sorted(_EXERCISES.values(), key=lambda e: e.notebook)


# ==================================================================== running a check


def registered(check_id: str) -> Exercise:
    """The registered check ``check_id``: its parts (with their descriptions and hints) and its fixtures function."""
    if check_id not in _EXERCISES:
        raise ValueError(f"no check called {check_id!r}; the checks are: {', '.join(e.id for e in _exercises())}")
    return _EXERCISES[check_id]


def list_checks() -> list[CheckInfo]:
    """Every exercise check: id, notebook, one-line description, the candidate's signature, part names."""
    return [CheckInfo(e.id, e.notebook, e.description, e.signature, tuple(p.name for p in e.parts)) for e in _exercises()]


def _die_with_parent(parent: int) -> None:
    """Stop this child, and every process in its group, when ``parent`` (the caller of check) is gone.

    The watchdog child sits in a process group of its own, so a notebook grader that
    kills a stuck kernel with the kernel's group would otherwise leave the child and the
    part it was running (DataLoader workers included) behind. Linux only: the kernel
    sends SIGTERM when the parent dies (``prctl(PR_SET_PDEATHSIG)``), and the handler
    kills the group. Processes forked later (DataLoader workers) inherit the handler; in
    them it does what SIGTERM does by default.
    """
    me = os.getpid()

    def on_term(signum, frame):
        if os.getpid() == me:
            os.killpg(0, signal.SIGKILL)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    with contextlib.suppress(Exception):
        import ctypes

        signal.signal(signal.SIGTERM, on_term)
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the request took effect
        os.killpg(0, signal.SIGKILL)


def _child_main(conn, exercise: Exercise, candidate, fixtures: dict, limits: dict, first: int, workdir: str, parent: int) -> None:
    """Body of the watchdog child: run parts ``first``, ``first + 1``, ... and report each one."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # own process group, so the parent can kill us and our DataLoader workers at once
    if sys.platform == "linux":
        _die_with_parent(parent)
    # A spawn worker runs the caller's script again to rebuild __main__ (multiprocessing does
    # that when __main__ has a file): a check called from a script without an
    # `if __name__ == "__main__":` guard would then start over in every worker, and every
    # spawn part time out. The checks need nothing from __main__ (notebook classes are
    # rebuilt in a module of their own), so this child forgets where __main__ came from.
    vars(sys.modules["__main__"]).pop("__file__", None)
    # One intra-op thread, as in DataLoader workers: on busy cores a thread pool costs more than it gives.
    torch.set_num_threads(1)
    # The checks start 4 workers on purpose, also on machines with fewer cores.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    ctx = Context(candidate, fixtures, limits["loader_timeout"], Path(workdir), limits["startup_timeout"])
    for index in range(first, len(exercise.parts)):
        part = exercise.parts[index]
        conn.send(("start", index))
        start = time.perf_counter()
        try:
            message, passed = part.run(ctx), True
        except PartFailed as exc:
            message, passed = str(exc), False
        except BaseException as exc:  # noqa: BLE001 - candidate code may raise anything, even SystemExit
            message, passed = describe(exc), False
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


def _run_isolated(exercise: Exercise, candidate, fixtures: dict, limits: dict, progress=None) -> list[PartResult]:
    """Run every part in forked children with deadlines (see the docstring of :mod:`packlab.course.grading`).

    ``progress`` (:class:`~packlab.course.grading.live.Progress`) is told when each part
    starts and ends, and every :data:`~packlab.course.grading.live.TICK_SECONDS` while one runs.
    """
    from packlab.course.grading import live

    progress = progress or live.Silent()
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
                args=(sender, exercise, candidate, fixtures, limits, next_part, workdir, os.getpid()),
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
                    if wait > 0 and not receiver.poll(min(wait, live.TICK_SECONDS)):
                        progress.tick()  # still running: its line shows for how long, against its limit
                        continue
                    if wait <= 0:
                        limit = min(limits["part_timeout"], limits["timeout"])
                        outcome[current] = (False, f"did not finish within {limit:.0f} s: stopped (is something waiting forever?)", time.monotonic() - started)
                        progress.finished(current, "failed", outcome[current][2])
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
                        progress.finished(current, "failed", outcome[current][2])
                        next_part = current + 1
                        break
                    if message[0] == "start":
                        current, started = message[1], time.monotonic()
                        progress.started(current)
                    elif message[0] == "done":
                        _, index, passed, text, seconds = message
                        outcome[index] = (passed, text, seconds)
                        status = "passed" if passed else "not started" if is_stub_failure(text) else "failed"
                        progress.finished(index, status, seconds)
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


def _run_in_process(exercise: Exercise, candidate, fixtures: dict, limits: dict, progress=None) -> list[PartResult]:
    """Fallback where fork does not exist (Windows): run the parts here, DataLoader timeouts only."""
    from packlab.course.grading import live

    progress = progress or live.Silent()
    results = []
    with tempfile.TemporaryDirectory(prefix="packlab-check-") as workdir:
        ctx = Context(candidate, fixtures, limits["loader_timeout"], Path(workdir), limits["startup_timeout"])
        for index, part in enumerate(exercise.parts):
            progress.started(index)
            start = time.perf_counter()
            try:
                message, passed = part.run(ctx), True
            except PartFailed as exc:
                message, passed = str(exc), False
            except Exception as exc:  # noqa: BLE001
                message, passed = describe(exc), False
            results.append(PartResult(part.name, part.description, passed, str(message), part.hint, time.perf_counter() - start))
            status = "passed" if passed else "not started" if is_stub_failure(str(message)) else "failed"
            progress.finished(index, status, results[-1].seconds)
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
    * ``startup_timeout`` — seconds for spawn workers to start (default :data:`STARTUP_TIMEOUT`);
    * ``loader_timeout`` — the ``timeout`` of every DataLoader the check creates (default :data:`LOADER_TIMEOUT`);
    * ``parts=["name", ...]`` — run only these parts (to work on one at a time), or
      ``parts="core"``: a stage of a long exercise (:data:`~packlab.course.grading.teaching.STAGES`;
      exercise 4 has ``"core"`` and ``"stretch"``); such a partial check is not recorded for
      the notebook grader;
    * ``hints=1`` — how much help a failed part prints: 0 none, 1 a nudge towards the idea
      (the default), 2 also the code-level hint. A part not started yet (it reached the
      exercise's ``NotImplementedError`` stub) prints none;
    * ``quiet=True`` — show nothing: neither the parts as they run nor the report;
    * ``record=False`` — do not record the result for the notebook grader or the class
      board (for demonstrations).

    While the parts run, each one's line shows as it starts, with its limit, and is
    updated with its result (:mod:`packlab.course.grading.live`). Where the instructor set
    a class folder (``PACKLAB_CLASS_RECORDS``), every part's result is appended there for
    the live board (:mod:`packlab.course.grading.records`), partial checks included.

    Returns a :class:`CheckResult` (``.passed``, ``.score``, ``.max_score``, ``.parts``).
    A hanging candidate fails the part it hangs in; it never hangs the caller.

    make test's crash-test cap on measurement rounds (:func:`packlab.bench.crash_test_rounds`)
    is lifted while a check runs: a check asks for its own rounds (exercise 6 counts them),
    and what it grades must behave as on an attendee's machine.
    """
    from packlab import bench

    capped = os.environ.pop(bench.CRASH_TEST_ROUNDS_VAR, None)
    try:
        return _check(exercise_id, candidate, **kwargs)
    finally:
        if capped is not None:
            os.environ[bench.CRASH_TEST_ROUNDS_VAR] = capped


def _check(exercise_id: str, candidate, **kwargs) -> CheckResult:
    """The body of :func:`check`, with its keyword arguments checked here."""
    if exercise_id not in _EXERCISES:
        raise ValueError(f"no check called {exercise_id!r}; the checks are: {', '.join(e.id for e in _exercises())}")
    unknown = set(kwargs) - {"timeout", "part_timeout", "startup_timeout", "loader_timeout", "parts", "quiet", "record", "hints"}
    if unknown:
        raise TypeError(f"check() got unexpected keyword arguments {sorted(unknown)}")
    hints = kwargs.get("hints", 1)
    if hints not in HINT_LEVELS:
        raise ValueError(f"check(..., hints={hints!r}): hints is 0 (none), 1 (a nudge, the default) or 2 (also a hint at the code)")
    exercise = _EXERCISES[exercise_id]
    if not callable(candidate):
        raise TypeError(
            f"check({exercise_id!r}, ...) needs the class or function itself, not an instance of {type(candidate).__name__}; "
            f"the check calls it as {exercise.signature[: exercise.signature.index(')') + 1]}"
        )
    selected = kwargs.get("parts")
    if isinstance(selected, str):
        from packlab.course.grading import teaching

        stage = teaching.stage_parts(exercise_id, selected)
        if stage is None and selected in [part.name for part in exercise.parts]:
            stage = (selected,)  # one part's name, without the brackets
        if stage is None:
            stages = ", ".join(repr(name) for name in teaching.STAGES.get(exercise_id, {})) or "none"
            raise ValueError(f"check {exercise_id!r} has no stage {selected!r} (its stages: {stages}); "
                             "parts= also takes a list of part names")
        selected = list(stage)
    if selected is not None:
        names = [part.name for part in exercise.parts]
        wrong = [name for name in selected if name not in names]
        if wrong:
            raise ValueError(f"check {exercise_id!r} has no part {', '.join(map(repr, wrong))}; its parts are: {', '.join(names)}")
        exercise = replace(exercise, parts=tuple(part for part in exercise.parts if part.name in selected))
    limits = {
        "timeout": float(kwargs.get("timeout", CHECK_TIMEOUT)),
        "part_timeout": float(kwargs.get("part_timeout", PART_TIMEOUT)),
        "startup_timeout": float(kwargs.get("startup_timeout", STARTUP_TIMEOUT)),
        "loader_timeout": float(kwargs.get("loader_timeout", LOADER_TIMEOUT)),
    }
    name = getattr(candidate, "__name__", type(candidate).__name__)
    quiet = kwargs.get("quiet", False)
    graded = kwargs.get("record", True) and selected is None
    start = time.perf_counter()
    for stream in (sys.stdout, sys.stderr):  # processes forked from here must not inherit unwritten output
        with contextlib.suppress(Exception):
            stream.flush()
    fixtures = exercise.fixtures()
    from packlab.course.grading import live, records, teaching

    progress = live.Silent() if quiet else live.Progress(
        f"check {exercise_id!r} on {name}: {len(exercise.parts)} parts", [p.name for p in exercise.parts],
        min(limits["part_timeout"], limits["timeout"]))
    try:
        if "fork" in multiprocessing.get_all_start_methods():
            parts = _run_isolated(exercise, candidate, fixtures, limits, progress)
        else:
            parts = _run_in_process(exercise, candidate, fixtures, limits, progress)
    finally:
        progress.close()
    parts = [replace(part, nudge=teaching.nudge(exercise_id, part.name, part.description),
                     not_started=not part.passed and is_stub_failure(part.message)) for part in parts]
    result = CheckResult(exercise_id, name, parts, time.perf_counter() - start)
    if graded:
        _record(result, exercise.notebook)
    if kwargs.get("record", True):
        records.record_run(result, exercise.notebook)  # the class board, when the instructor set a folder
    if not quiet:
        print(result.report(hints=hints))
    return result

"""Grading one notebook: run it in a sandbox, run its checks in another, and trust only the second.

:func:`grade_notebook` does three things, each in a process of its own:

1. **The notebook runs**, top to bottom in a fresh kernel (:mod:`packlab.course.grade.execute`),
   inside a sandbox (:mod:`packlab.course.sandbox`): no network, a copy of the notebook in a
   scratch folder that is the only place it can write, the course and the dataset
   read-only, the other attendees and the instructor's files out of sight, a memory limit
   per process and a time limit for the whole. Its checks run there as they ran for the
   attendee, and what they record is kept, but not believed. This run tells which cells
   raised and whether the notebook reached each check cell.
2. **The grader runs the checks itself** (:func:`packlab.course.grade.notebooks.own_run`), in a
   second, fresh sandbox: only the notebook's definitions run there (imports, functions,
   classes, the constants they read), and each graded check is called on the name its
   cell passes. Its result comes back on the sandbox's output.
3. **The grade** is the grader's run, for every check whose cell the notebook reached
   without an error; a check whose cell raised, or which the notebook never reached,
   scores 0 of its parts with the reason.

So a notebook cannot write its own grade: whatever it records (it may call the recording
function itself, or write the results file) is read only to say, in the gradebook, that it
claimed more than the grader found. What remains possible is code *inside the checked
class or function* that tampers with its own check while that check runs it: the
sandbox contains the harm such code can do, not the score it reports. The notebooks stay
with the gradebook for the instructor to read.

Without bubblewrap (``make system-deps``) nothing untrusted runs unless the caller says
``sandboxed=False`` (``--no-sandbox``): the same two runs then happen as plain processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packlab import paths
from packlab.course import grading, sandbox
from packlab.course.grade import notebooks
from packlab.course.grade.execute import CELL_TIMEOUT, NOTEBOOK_TIMEOUT
from packlab.course.grading import core

#: Seconds the grader's own run may take beyond the checks' own limits, for starting up.
START_SECONDS = 120
#: Environment variables of the instructor's session that a sandbox does not get.
DROPPED_ENV = (grading.RESULTS_ENV_VAR, "PACKLAB_CLASS_RECORDS", "JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN")
#: Entries of the data's packed/ folder that exercise notebooks write to themselves (by the
#: course's convention, ``exercise-NN...``): a sandbox gets a writable folder of its own there.
OWN_PACKED_PREFIX = "exercise-"


class SandboxMissing(RuntimeError):
    """No sandbox can be made here; the message says why and what to do."""


@dataclass
class NotebookGrade:
    """One notebook's grade: its checks (the grader's run, or zero with a reason), its cell errors, notes."""

    path: str
    seconds: float
    checks: list[dict] = field(default_factory=list)
    cell_errors: list[dict] = field(default_factory=list)
    execution_error: str | None = None
    notes: list[str] = field(default_factory=list)
    sandboxed: bool = True

    @property
    def score(self) -> int:
        return sum(c["score"] for c in self.checks)

    @property
    def max_score(self) -> int:
        return sum(c["max_score"] for c in self.checks)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(score=self.score, max_score=self.max_score)
        return out


# ------------------------------------------------------------------------- the two runs


def all_check_ids(notebook) -> list[str]:
    """Every check a notebook may run: its graded calls and its demonstrations (``record=False``)."""
    known = [c.id for c in grading.list_checks()]
    ids = []
    for cell in notebook.cells:
        if cell.cell_type == "code":
            ids += [c for c in known if f'check("{c}"' in cell.source or f"check('{c}'" in cell.source]
    return list(dict.fromkeys(ids))


def prepare_fixtures(check_ids) -> None:
    """Write the fixture archives of these checks now, in the grader's process, so the sandbox only reads them."""
    for check_id in dict.fromkeys(check_ids):
        core.registered(check_id).fixtures()


def _environment(scratch: Path, data_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    home = scratch / "home"
    for folder in (home, scratch / "tmp"):
        folder.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), TMPDIR=str(scratch / "tmp"), IPYTHONDIR=str(home / ".ipython"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"), MPLCONFIGDIR=str(home / "matplotlib"),
               XDG_CACHE_HOME=str(home / ".cache"), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    env[paths.DATA_ENV_VAR] = str(data_dir)
    env.update(extra)
    return env


def _data_mounts(data_dir: Path) -> list[tuple[Path, Path]]:
    """The dataset, read-only, as a data folder of the sandbox's own: its packed copies shared, its exercise folders not."""
    real = paths.data_root()
    mounts = []
    for entry in sorted(real.iterdir()) if real.is_dir() else []:
        if entry.name != "packed":
            mounts.append((entry, data_dir / entry.name))
    packed = real / "packed"
    for entry in sorted(packed.iterdir()) if packed.is_dir() else []:
        if not entry.name.startswith(OWN_PACKED_PREFIX):
            mounts.append((entry, data_dir / "packed" / entry.name))
    return mounts


def _run(argv: list[str], scratch: Path, env_extra: dict[str, str], timeout: float, sandboxed: bool,
         hidden: list[Path], memory_bytes: int | None) -> subprocess.CompletedProcess:
    """Run ``argv`` with ``scratch`` as its only writable folder (in a sandbox unless told otherwise)."""
    work = scratch / "work"
    if sandboxed:
        data_dir = scratch / "data"
        (data_dir / "packed").mkdir(parents=True, exist_ok=True)
        env = _environment(scratch, data_dir, env_extra)
        box = sandbox.Sandbox(readable=[paths.data_root()], writable=[scratch], mounts=_data_mounts(data_dir),
                              hidden=hidden, network=False, cwd=work, memory_bytes=memory_bytes)
        return sandbox.run(box, argv, timeout, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    env = _environment(scratch, paths.data_root(), env_extra)
    process = subprocess.Popen(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        sandbox.with_group_killed(process)
        out, err = process.communicate()
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def _scratch(path: Path, parent: Path | None) -> tuple[Path, Path]:
    """A fresh scratch folder holding a copy of the notebook in ``work/``; returns (scratch, the copy)."""
    scratch = Path(tempfile.mkdtemp(prefix="packlab-grade-", dir=parent))
    (scratch / "work").mkdir()
    copy = scratch / "work" / path.name
    shutil.copyfile(path, copy)
    return scratch, copy


def _tail(text: str | None, limit: int = 300) -> str:
    text = (text or "").strip()
    return text if len(text) <= limit else "..." + text[-limit:]


# ------------------------------------------------------------------------------ grading


def _cell_errors(notebook) -> list[dict]:
    errors = []
    for index, cell in enumerate(notebook.cells):
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error":
                errors.append({"cell": index, "ename": output.get("ename"), "evalue": str(output.get("evalue"))[:300]})
    return errors


def _zero(check_id: str, reason: str) -> dict:
    """A zero-score entry for a check, every registered part failed with ``reason``."""
    info = {c.id: c for c in grading.list_checks()}.get(check_id)
    parts = list(info.parts) if info else []
    return {
        "exercise_id": check_id,
        "candidate": None,
        "score": 0,
        "max_score": len(parts),
        "passed": False,
        "parts": [{"name": p, "passed": False, "message": reason, "not_started": False} for p in parts],
        "not_run": reason,
    }


def _reached(check_id: str, executed, errors: list[dict], execution_error: str | None) -> str | None:
    """None when the notebook's run reached the (last) cell of this check without an error, else why not."""
    cells = [i for i, cell in enumerate(executed.cells)
             if cell.cell_type == "code" and check_id in [c for c, _ in notebooks.check_calls(cell.source)]]
    if not cells:
        return f"the notebook has no check({check_id!r}, ...) cell"
    index = cells[-1]
    raised = [e for e in errors if e["cell"] == index]
    if raised:
        return f"its cell raised {raised[0]['ename']}: {raised[0]['evalue']}"
    if executed.cells[index].get("execution_count") is None:
        return f"execution stopped before its cell: {execution_error}" if execution_error else "its cell did not run"
    return None


def _claims(path: Path) -> dict[str, dict]:
    """What was recorded while the notebook ran: per check, the entry that claims the most passed parts.

    A genuine run of a check records once per call; anything the notebook wrote itself
    is there too, whatever came after it. Unreadable lines are skipped.
    """
    claimed: dict[str, dict] = {}
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
                check_id = str(entry["exercise_id"])
            except (ValueError, KeyError, TypeError):
                continue
            if check_id not in claimed or _claimed_passes(entry) > _claimed_passes(claimed[check_id]):
                claimed[check_id] = entry
    return claimed


def _claimed_passes(entry: dict) -> int:
    try:
        return sum(bool(p.get("passed")) for p in entry.get("parts", []))
    except (AttributeError, TypeError):
        return 0


def grade_notebook(path: Path, cell_timeout: float = CELL_TIMEOUT, notebook_timeout: float = NOTEBOOK_TIMEOUT,
                   sandboxed: bool = True, hidden: list[Path] | None = None,
                   memory_bytes: int | None = sandbox.DEFAULT_MEMORY_BYTES) -> NotebookGrade:
    """Grade one notebook (see the module docstring); never raises for what the notebook does.

    ``hidden`` folders are out of the sandbox's sight (the class folder). Raises
    :class:`SandboxMissing` when ``sandboxed`` and no sandbox can be made.
    """
    if sandboxed:
        why = sandbox.why_unavailable()
        if why:
            raise SandboxMissing(f"{why}; to grade without a sandbox anyway (your own notebooks only), pass --no-sandbox")
    import nbformat

    path = Path(path)
    start = time.perf_counter()
    notebook = notebooks.read_notebook(path)
    prepare_fixtures(all_check_ids(notebook) + [c.id for c in grading.list_checks() if c.notebook == path.stem])
    hidden = list(hidden or [])
    python = [sys.executable, "-m"]
    scratch_parent = Path(tempfile.gettempdir())

    scratch, copy = _scratch(path, scratch_parent)
    try:
        executed_path = scratch / "work" / f"{path.stem}.executed.ipynb"
        claimed_path = scratch / "claimed.jsonl"
        ran = _run([*python, "packlab.course.grade.execute", str(copy), str(executed_path),
                    "--cell-timeout", str(cell_timeout), "--notebook-timeout", str(notebook_timeout)],
                   scratch, {grading.RESULTS_ENV_VAR: str(claimed_path)},
                   notebook_timeout + START_SECONDS, sandboxed, hidden, memory_bytes)
        execution_error = None
        try:
            executed = nbformat.read(executed_path, as_version=4)
            execution_error = json.loads(Path(f"{executed_path}.json").read_text()).get("execution_error")
        except (OSError, ValueError, nbformat.reader.NotJSONError) as exc:
            executed = notebook
            for cell in executed.cells:
                cell["execution_count"] = None
            execution_error = (f"the notebook's run ended without a result (exit status {ran.returncode}"
                               + (", stopped at the time limit" if ran.returncode == -9 else "") + f"): {_tail(ran.stderr) or exc}")
        claimed = _claims(claimed_path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    errors = _cell_errors(executed)
    expected = notebooks.expected_checks(notebook)
    expected += [c.id for c in grading.list_checks() if c.notebook == path.stem and c.id not in expected]
    reached = {check_id: _reached(check_id, executed, errors, execution_error) for check_id in expected}

    own: dict = {}
    own_error = None
    if any(why is None for why in reached.values()):
        scratch, copy = _scratch(path, scratch_parent)
        try:
            limit = core.CHECK_TIMEOUT * max(1, sum(why is None for why in reached.values())) + START_SECONDS
            ran = _run([*python, "packlab.course.grade.notebooks", str(copy)], scratch, {}, limit, sandboxed, hidden,
                       memory_bytes)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        outcome = notebooks.read_own_run(ran.stdout)
        if outcome is None:
            own_error = (f"the grader's own run of the checks ended without a result (exit status {ran.returncode}"
                         + (", stopped at the time limit" if ran.returncode == -9 else "") + f"): {_tail(ran.stderr)}")
        else:
            own = outcome.get("results", {})

    grade = NotebookGrade(str(path), 0.0, cell_errors=errors, execution_error=execution_error, sandboxed=sandboxed)
    for check_id in expected:
        why = reached[check_id]
        if why is None:
            why = own_error or (own.get(check_id, {}).get("error") if check_id in own else "the grader's own run did not reach it")
            entry = own.get(check_id) if check_id in own and "error" not in own[check_id] else None
        else:
            entry = None
        grade.checks.append(entry if entry is not None else _zero(check_id, why))
        found = grade.checks[-1]
        if check_id in claimed and _claimed_passes(claimed[check_id]) > found["score"]:
            grade.notes.append(
                f"{check_id}: while the notebook ran, {_claimed_passes(claimed[check_id])} passed parts were recorded for it; "
                f"the grader's own run of the check found {found['score']}: only the grader's run counts")
    for check_id in claimed:
        if check_id not in expected:
            grade.notes.append(f"{check_id}: the notebook recorded a result for a check it does not call: ignored")
    grade.seconds = time.perf_counter() - start
    return grade


def score_table(grades: list[NotebookGrade]) -> str:
    """The terminal summary: one row per check, a total per notebook and overall."""
    rows = [("notebook", "check", "score", "")]
    for grade in grades:
        for entry in grade.checks:
            failed = [p["name"] for p in entry["parts"] if not p["passed"]]
            note = entry.get("not_run") or (f"failed: {', '.join(failed)}" if failed else "")
            rows.append((grade.path, entry["exercise_id"], f"{entry['score']}/{entry['max_score']}", note[:70]))
        if not grade.checks:
            rows.append((grade.path, "(no checks found)", "0/0", ""))
        notes = "; ".join(([grade.execution_error] if grade.execution_error else []) + grade.notes)
        rows.append((grade.path, "total", f"{grade.score}/{grade.max_score}", f"{grade.seconds:.1f} s" + (f"; {notes}" if notes else "")))
    if len(grades) > 1:
        rows.append(("all notebooks", "total", f"{sum(g.score for g in grades)}/{sum(g.max_score for g in grades)}", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + ("  " + row[3] if row[3] else ""))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)

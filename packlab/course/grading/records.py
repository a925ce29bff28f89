"""Every check run in the room, recorded for the instructor's live board.

The instructor names a class folder in the environment of every attendee's kernel
(:data:`CLASS_RECORDS_ENV_VAR`; ``make hub`` sets it for each attendee's server), and each
:func:`~packlab.course.grading.check` that runs there appends one line per part to
``<folder>/<user>.jsonl``::

    {"user": "ana", "notebook": "05_shard_split", "check": "shard_split", "part": "balanced",
     "status": "failed", "seconds": 0.4, "time": "2026-11-28T10:31:02+00:00", "run": "ana-1764325862-3fa94c"}

``status`` is ``passed``, ``failed`` or ``not started`` (the part reached the exercise's
untouched stub); a partial check (``parts="core"``) records the parts it ran. A
demonstration (``record=False``) records nothing. The user is ``PACKLAB_USER``, else
``JUPYTERHUB_USER`` (the hub sets it), else the login name.

The board (:mod:`packlab.course.hub.board`) reads these files; nothing here is used for
grades. An attendee can write to their own file, so the board is a view of the room, not
a mark: the gradebook runs the checks itself (:mod:`packlab.course.grade`). A folder that
cannot be written to costs a warning, never the check.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import secrets
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

#: The environment variable naming the class folder (unset: nothing is recorded).
CLASS_RECORDS_ENV_VAR = "PACKLAB_CLASS_RECORDS"
USER_ENV_VARS = ("PACKLAB_USER", "JUPYTERHUB_USER")
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def user_name() -> str:
    """Who runs this check: ``PACKLAB_USER``, else ``JUPYTERHUB_USER``, else the login name."""
    for name in USER_ENV_VARS:
        if os.environ.get(name):
            return os.environ[name]
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (a container without one): still record
        return "unknown"


def records_file(folder: Path, user: str) -> Path:
    """``<folder>/<user>.jsonl``, the user's name made safe for a file name."""
    return Path(folder) / f"{_SAFE.sub('_', user) or 'unknown'}.jsonl"


def record_run(result, notebook: str, folder: str | os.PathLike | None = None) -> Path | None:
    """Append one line per part of ``result`` (a CheckResult) to the class folder; return the file.

    ``folder`` defaults to ``$PACKLAB_CLASS_RECORDS``; without one nothing is recorded.
    The lines go out in one write to a file opened for appending, so two kernels of one
    attendee never interleave within a run.
    """
    folder = folder or os.environ.get(CLASS_RECORDS_ENV_VAR)
    if not folder:
        return None
    user = user_name()
    now = time.time()
    stamp = datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds")
    run = f"{user}-{now:.0f}-{secrets.token_hex(3)}"  # one id per check() call, however close two calls come
    lines = [
        json.dumps({"user": user, "notebook": notebook, "check": result.exercise_id, "part": part.name,
                    "status": part.status, "seconds": round(part.seconds, 2), "time": stamp, "run": run})
        for part in result.parts
    ]
    target = records_file(Path(folder), user)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    except OSError as exc:
        warnings.warn(f"could not record this check for the class board in {target}: {exc}", stacklevel=3)
        return None
    return target


def read_records(folder: str | os.PathLike) -> list[dict]:
    """Every record under ``folder`` (``*.jsonl``, in subfolders too), oldest first; bad lines skipped.

    Each record gets ``when`` (a datetime) from its ``time``.
    """
    out = []
    for path in sorted(Path(folder).rglob("*.jsonl")):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        for line in text.splitlines():
            try:
                entry = json.loads(line)
                entry["when"] = datetime.fromisoformat(entry["time"])
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a full disk, or not ours
            if all(isinstance(entry.get(k), str) for k in ("user", "notebook", "check", "part", "status")):
                out.append(entry)
    out.sort(key=lambda e: e["when"])
    return out

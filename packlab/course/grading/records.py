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

A chapter marks a stage of the room with :func:`checkpoint` (``checkpoint("ch07-sweep")``),
which records one line of its own::

    {"user": "ana", "kind": "checkpoint", "checkpoint": "ch07-sweep", "time": "...", "run": "ana-1764325990-9b1c02"}

In a laptop room there is no shared folder: each attendee's checkout names the
instructor's board in its settings (``make configure PACKLAB_CLASS_URL=http://host:8765
PACKLAB_CLASS_TOKEN=...``), and every record also goes there over HTTP
(:mod:`packlab.course.hub.post`: a one-second limit, queued when the board cannot be
reached). Both ways may be set at once.

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
#: The statuses a part's record may have.
STATUSES = ("passed", "failed", "not started")
#: The ``kind`` of a checkpoint's record (a check's records have no ``kind``: the hub's older files stay readable).
CHECKPOINT = "checkpoint"
#: A user name, or a checkpoint name, that is a safe file name: what the board accepts over the network.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
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


def safe_user(user: str) -> str:
    """The user's name as a file name: characters other than letters, digits, ``.``, ``_``, ``-`` become ``_``."""
    return _SAFE.sub("_", user).lstrip("._-")[:64] or "unknown"


def _stamp(user: str) -> tuple[str, str]:
    """The time of a record and a run id: one id per call, however close two calls come."""
    now = time.time()
    return (datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
            f"{safe_user(user)}-{now:.0f}-{secrets.token_hex(3)}")


def run_records(result, notebook: str) -> list[dict]:
    """One record per part of ``result`` (a CheckResult), all with the same time and run id."""
    user = user_name()
    stamp, run = _stamp(user)
    return [{"user": user, "notebook": notebook, "check": result.exercise_id, "part": part.name,
             "status": part.status, "seconds": round(part.seconds, 2), "time": stamp, "run": run}
            for part in result.parts]


def record_run(result, notebook: str, folder: str | os.PathLike | None = None) -> Path | None:
    """Record one line per part of ``result`` (a CheckResult); return the class folder's file, if one was written.

    The lines go to ``folder`` (default ``$PACKLAB_CLASS_RECORDS``) and to the board that the
    ``PACKLAB_CLASS_URL`` setting names; with neither, nothing is recorded.
    """
    return _record(run_records(result, notebook), folder)


def checkpoint(name: str, folder: str | os.PathLike | None = None) -> Path | None:
    """Record that this attendee reached the checkpoint ``name`` (``"ch07-sweep"``); the board lists it.

    Recorded where a check's runs are (the class folder, the class board's address); with
    neither set it does nothing. It never raises for a board that cannot be reached or a
    folder that cannot be written; a ``name`` that is not a safe file name (letters,
    digits, ``.``, ``_``, ``-``) is the chapter's mistake, and raises ValueError.
    """
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        raise ValueError(f"checkpoint name {name!r}: use letters, digits, '.', '_' and '-' (up to 64), like 'ch07-sweep'")
    user = user_name()
    stamp, run = _stamp(user)
    return _record([{"user": user, "kind": CHECKPOINT, "checkpoint": name, "time": stamp, "run": run}], folder)


def _record(entries: list[dict], folder: str | os.PathLike | None) -> Path | None:
    from packlab.course.hub import post

    if not entries:  # a check that ran no part
        return None

    # The board takes only names that are safe file names, made as the class folder's file names are.
    # send() never raises, never waits more than post.TIMEOUT, and does nothing without the setting.
    post.send([{**e, "user": safe_user(e["user"])} for e in entries])
    folder = folder or os.environ.get(CLASS_RECORDS_ENV_VAR)
    if not folder:
        return None
    target = records_file(Path(folder), entries[0]["user"])
    # One write to a file opened for appending: two kernels of one attendee never interleave within a run.
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(e) + "\n" for e in entries))
    except OSError as exc:
        warnings.warn(f"could not record this for the class board in {target}: {exc}", stacklevel=4)
        return None
    return target


def read_records(folder: str | os.PathLike) -> list[dict]:
    """Every record under ``folder`` (``*.jsonl``, in subfolders too), oldest first; bad lines skipped.

    Each record gets ``when`` (a datetime) from its ``time``. A checkpoint's record has
    ``kind == CHECKPOINT``; a check's has no ``kind``.
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
            if not isinstance(entry, dict) or not isinstance(entry.get("user"), str):
                continue
            if entry.get("kind") == CHECKPOINT:
                if isinstance(entry.get("checkpoint"), str):
                    out.append(entry)
            elif all(isinstance(entry.get(k), str) for k in ("notebook", "check", "part", "status")):
                out.append(entry)
    out.sort(key=lambda e: e["when"])
    return out

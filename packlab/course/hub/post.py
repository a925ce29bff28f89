"""A check's records sent to the instructor's board over the network: the laptop room.

In a room of laptops there is no folder that every attendee and the instructor share, so
the board (:mod:`packlab.course.hub.board`, ``make board BOARD_HOST=0.0.0.0``) takes the
records by HTTP instead. Each attendee's checkout names it once::

    make configure PACKLAB_CLASS_URL=http://192.168.1.20:8765 PACKLAB_CLASS_TOKEN=<the class token>

and from then on every ``check()`` and ``checkpoint()`` (:mod:`packlab.course.grading.records`)
also posts its records there: ``POST <url>/records`` with ``Authorization: Bearer <token>``
and a JSON list of records as the class folder's files hold them.

A room's network is not to be trusted with an attendee's time, so a post

* waits at most :data:`TIMEOUT` seconds, whatever the board does (down, unreachable, or
  accepting the connection and never answering): the exchange runs in a thread of its
  own, and the check goes on when the time is up;
* never raises and prints nothing: the check's verdict is what the attendee is there for;
* keeps what it could not deliver in :func:`queue_file` and sends it, oldest first, with
  the next post that gets through. The board drops a record it already has, so a record
  that arrives late after all, and is sent again from the queue, counts once.

The queue lives in the checkout's ``mywork/`` (git-ignored; ``make submit`` takes only the
exercise notebooks from it): it belongs to one attendee and one checkout, as the records
do. The data folder is the wrong place: on the class hub it is read-only, and on a
cluster one data folder may serve several checkouts.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import urllib.error
import urllib.request
from pathlib import Path

#: Seconds a post may take, connection and answer together, before the check goes on without it.
TIMEOUT = 1.0
#: The queue file's name in the checkout's ``mywork/``.
QUEUE_NAME = "class-board-queue.jsonl"
#: Records sent in one post, at most (the board's size limit holds this many with room to spare).
MAX_BATCH = 500
#: Records the queue keeps, the newest ones: an attendee who never reaches the board fills no disk.
MAX_QUEUED = 5000
#: Answers after which the same records are not sent again: the board read them and said no.
REFUSED = (400, 413)

URL_SETTING = "PACKLAB_CLASS_URL"
TOKEN_SETTING = "PACKLAB_CLASS_TOKEN"


def queue_file() -> Path:
    """``mywork/class-board-queue.jsonl`` in this checkout: the records not delivered yet."""
    from packlab import paths
    from packlab.course.release import MYWORK

    return paths.repo_root() / MYWORK / QUEUE_NAME


def board_address() -> tuple[str, str] | None:
    """``(url, token)`` from the settings (the environment wins over ``settings.mk``), or None without a URL."""
    from packlab import settings

    url = settings.lookup(URL_SETTING).value
    if not url:
        return None
    return url, settings.lookup(TOKEN_SETTING).value or ""


def send(entries: list[dict], queue: Path | None = None, timeout: float = TIMEOUT) -> bool:
    """Post ``entries``, and what the queue holds, to the configured board; True when the board took them.

    ``entries`` are records as the class folder holds them, their user names made safe file
    names (:func:`packlab.course.grading.records.safe_user`: the board takes no other).

    Without ``PACKLAB_CLASS_URL`` it does nothing (False). Never raises; returns within
    about ``timeout`` seconds.
    """
    try:
        address = board_address()
        if address is None:
            return False
        return _send(list(entries), *address, queue or queue_file(), timeout)
    except Exception:  # noqa: BLE001 - a broken settings file or a full disk must not cost the check
        return False


def _send(entries: list[dict], url: str, token: str, queue: Path, timeout: float) -> bool:
    waiting = _take(queue) + entries
    batch, rest = waiting[:MAX_BATCH], waiting[MAX_BATCH:]
    status = post(url, token, batch, timeout)
    if status == 200:
        _enqueue(queue, rest)
        return True
    # Refused as malformed: sending the same records again gets the same answer, so only the rest waits.
    _enqueue(queue, rest if status in REFUSED else waiting)
    return False


def post(url: str, token: str, batch: list[dict], timeout: float = TIMEOUT) -> int | None:
    """POST ``batch`` to ``<url>/records``: the HTTP status, or None when no answer came within ``timeout``."""
    body = json.dumps(batch).encode()
    request = urllib.request.Request(url.rstrip("/") + "/records", data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    # No proxy: the board is in the room; an http_proxy variable meant for the internet must not carry the post.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    answer: dict = {}
    done = threading.Event()

    def exchange():
        try:
            with opener.open(request, timeout=timeout) as response:
                answer["status"] = response.status
        except urllib.error.HTTPError as exc:
            answer["status"] = exc.code
        except Exception:  # noqa: BLE001 - refused, unreachable, reset: no answer
            pass
        finally:
            done.set()

    # The socket's timeout bounds each step, not their sum, and not the name lookup; the
    # thread's wait bounds the whole. A thread left behind ends at its socket's timeout.
    threading.Thread(target=exchange, name="packlab-class-board-post", daemon=True).start()
    done.wait(timeout)
    return answer.get("status")


def _take(queue: Path) -> list[dict]:
    """The queued records, the queue emptied: renamed first, so that another kernel's post takes each record once."""
    taken = queue.with_name(f"{queue.name}.{os.getpid()}-{secrets.token_hex(3)}")
    try:
        os.replace(queue, taken)
    except OSError:
        return []  # no queue (the usual case), or none we may move
    try:
        lines = taken.read_text(encoding="utf-8").splitlines()
    finally:
        taken.unlink(missing_ok=True)
    out = []
    for line in lines[-MAX_QUEUED:]:
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line cut short by a full disk
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _enqueue(queue: Path, entries: list[dict]) -> None:
    if not entries:
        return
    try:
        queue.parent.mkdir(parents=True, exist_ok=True)
        with open(queue, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(e) + "\n" for e in entries[-MAX_QUEUED:]))
    except OSError:
        pass  # silent, as the post is: the class folder (when set) still has them
